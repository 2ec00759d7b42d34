"""DeepShare-style synthetic job sets.

Seed 002 (Sec. V) evaluates on four traces of different communication
intensity, each "ten job sets each with 256 randomly shuffled jobs. Each job is
randomly assigned a GPU demand of up to 32, and given a total number of samples
to train, which is configured to set its expected training time in an isolated
cluster as one hour." The model mixes over GNN:IMG:DLRM:LM:FSDP:MoE (the order
of :data:`policies.workloads.MODELS`) are:

=========  =============
normal     1:1:1:1:1:1
heavy      1:1:1:1:4:4
medium     1:1:4:4:1:1
low        4:4:1:1:1:1
=========  =============

:func:`generate_jobs` draws one such set; every random choice comes from one
``numpy.random.Generator`` seeded by ``seed``, so the same configuration and
seed give the same jobs on any machine. The rules (all in
:class:`GeneratorConfig`):

* **model** -- drawn independently per job with probabilities proportional to
  the mix weights (as DeepShare's own job sets, whose per-set counts vary), or
  with ``exact_mix`` apportioned exactly (largest remainder) then shuffled.
* **GPU demand** -- ``pow2`` (default): uniform over the powers of two in
  ``[min_gpus, max_gpus]`` (1, 2, 4, 8, 16, 32 for the defaults), the shapes
  data-parallel jobs use in practice and the ones DeepShare measured;
  ``uniform``: uniform integers in ``[min_gpus, max_gpus]``; ``deepshare``:
  uniform over {2, 4, 8} (what DeepShare's published job sets actually contain).
  ``max_gpus`` may not exceed the cluster's GPUs.
* **work** -- ``total_samples = D * best_isolated_throughput(model, demand)``
  on the target cluster, so a job runs ``D`` seconds alone on its best
  placement; ``D = duration_s`` (3600 s) times a factor uniform in
  ``[1 - jitter, 1 + jitter]`` (``jitter = 0`` by default).
* **arrivals** -- ``zero``: every job at t = 0 (DeepShare); ``poisson``: a
  Poisson process whose rate gives the requested offered **load**, the
  expected GPU-seconds submitted per second over the cluster's GPUs::

      load = lambda * E[G] * E[D] / C   =>   lambda = load * C / (E[G] * E[D])

  with ``E[G]`` the mean of the demand distribution, ``E[D] = duration_s`` and
  ``C`` the cluster's GPUs. The first job arrives at t = 0, the others after
  i.i.d. exponential gaps of mean ``1 / lambda``.

Sets ``k = 0..N-1`` of :func:`generate_sets` use the seed sequence
``(seed, k)``, so set 3 is the same whether 4 or 10 sets are written.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from policies.cluster import ClusterSpec
from policies.job import JobSpec
from policies.perf import ContentionModel
from policies.workloads import MODELS, UnknownModelError, canonical_model
from trainer.outputs import unwritable
from trainer.traces import MAX_SUBMIT_TIME_S, MAX_SUBMIT_TIME_TEXT

__all__ = [
    "DEMAND_DISTRIBUTIONS",
    "MAX_JOBS",
    "MIXES",
    "GeneratorConfig",
    "GeneratorError",
    "arrival_rate",
    "check_sets_directory",
    "demand_values",
    "generate_jobs",
    "generate_sets",
    "parse_mix",
    "write_sets",
]

#: The seed's four model mixes, weights in :data:`MODELS` order (GNN:IMG:DLRM:LM:FSDP:MoE).
MIXES: dict[str, tuple[float, ...]] = {
    "normal": (1, 1, 1, 1, 1, 1),
    "heavy": (1, 1, 1, 1, 4, 4),
    "medium": (1, 1, 4, 4, 1, 1),
    "low": (4, 4, 1, 1, 1, 1),
}

DEMAND_DISTRIBUTIONS = ("pow2", "uniform", "deepshare")

#: Most jobs one call draws: ``num_jobs``, and ``num_jobs * num_sets`` for :func:`generate_sets` (all sets are
#: held in memory before they are written). 1,000,000 jobs (12 times Philly) take about 9 s and 0.9 GB;
#: ``--jobs 1000000000`` would need a 24 GB allocation.
MAX_JOBS = 1_000_000


class GeneratorError(ValueError):
    """A generator configuration that cannot produce jobs."""


def parse_mix(mix: str | Sequence[float] | Mapping[str, float]) -> np.ndarray:
    """Model mix as probabilities over :data:`MODELS`, shape ``(6,)``, summing to 1.

    Accepts a name in :data:`MIXES`, a ``"1:1:1:1:4:4"`` string, six weights in
    :data:`MODELS` order, or a mapping ``{model or alias: weight}`` (models not
    named get weight 0).
    """
    if isinstance(mix, str):
        key = mix.strip().lower()
        if key in MIXES:
            weights = list(MIXES[key])
        else:
            parts = key.replace(",", ":").split(":")
            if len(parts) != len(MODELS):
                raise GeneratorError(
                    f"bad mix {mix!r}: expected one of {', '.join(MIXES)} or {len(MODELS)} weights "
                    f"like 1:1:1:1:4:4 (order {':'.join(MODELS)})"
                )
            try:
                weights = [float(p) for p in parts]
            except ValueError:
                raise GeneratorError(f"bad mix {mix!r}: weights must be numbers") from None
    elif isinstance(mix, Mapping):
        weights = [0.0] * len(MODELS)
        for name, w in mix.items():
            try:
                m = canonical_model(name)
            except UnknownModelError:
                m = None
            if m not in MODELS:
                raise GeneratorError(f"mix: {name!r} is not one of the measured models {', '.join(MODELS)}")
            weights[MODELS.index(m)] += _weight(mix, w)
    else:
        weights = [_weight(mix, w) for w in mix]
        if len(weights) != len(MODELS):
            raise GeneratorError(f"mix needs {len(MODELS)} weights ({':'.join(MODELS)}), got {len(weights)}")
    w = np.asarray(weights, dtype=float)
    with np.errstate(over="ignore"):
        total = float(w.sum())
    # The sum must be finite too: 1e308:1e308:1e308:1:1:1 would turn every probability into 0.
    if not np.all(np.isfinite(w)) or np.any(w < 0) or not (0 < total < math.inf):
        raise GeneratorError(f"bad mix {mix!r}: weights must be finite, >= 0, not all 0, with a finite sum")
    return w / total


def _weight(mix: object, w: object) -> float:
    if isinstance(w, bool):
        raise GeneratorError(f"bad mix {mix!r}: weights must be numbers")
    try:
        return float(w)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise GeneratorError(f"bad mix {mix!r}: weights must be numbers") from None
    except OverflowError:
        raise GeneratorError("bad mix: weights must be finite, >= 0, not all 0, with a finite sum") from None


@dataclass(frozen=True)
class GeneratorConfig:
    """How to draw a job set (see the module docstring for the rules).

    :param num_jobs: jobs per set, at most :data:`MAX_JOBS`.
    :param mix: model mix (anything :func:`parse_mix` accepts).
    :param max_gpus: largest GPU demand; ``None`` = min(32, cluster GPUs).
    :param min_gpus: smallest GPU demand.
    :param demand: ``pow2`` | ``uniform`` | ``deepshare``.
    :param duration_s: isolated run time of a job on its best placement (s).
    :param jitter: relative half-width of the uniform factor on ``duration_s``.
    :param arrival: ``zero`` | ``poisson``.
    :param load: target offered load for ``poisson`` (> 0).
    :param exact_mix: apportion models exactly instead of drawing them i.i.d.
    :param seed: seed of the random generator.
    """

    num_jobs: int = 256
    mix: str | tuple[float, ...] = "normal"
    max_gpus: int | None = None
    min_gpus: int = 1
    demand: str = "pow2"
    duration_s: float = 3600.0
    jitter: float = 0.0
    arrival: str = "zero"
    load: float = 0.9
    exact_mix: bool = False
    seed: int = 0

    def resolved(self, cluster: ClusterSpec) -> GeneratorConfig:
        """Check the configuration against ``cluster``; fill in ``max_gpus``."""
        cap = min(32, cluster.total_gpus) if self.max_gpus is None else int(self.max_gpus)
        if self.num_jobs < 1:
            raise GeneratorError(f"num_jobs must be >= 1, got {self.num_jobs}")
        if self.num_jobs > MAX_JOBS:
            raise GeneratorError(f"num_jobs {self.num_jobs} is more than the generator's limit of {MAX_JOBS:,} jobs")
        if self.seed < 0:
            raise GeneratorError(f"seed must be >= 0, got {self.seed}")
        if self.min_gpus < 1 or cap < self.min_gpus:
            raise GeneratorError(f"need 1 <= min_gpus <= max_gpus, got {self.min_gpus} and {cap}")
        if cap > cluster.total_gpus:
            raise GeneratorError(
                f"max_gpus {cap} is larger than cluster {cluster.describe()} ({cluster.total_gpus} GPUs)"
            )
        if self.demand not in DEMAND_DISTRIBUTIONS:
            raise GeneratorError(
                f"demand distribution {self.demand!r}: expected one of {', '.join(DEMAND_DISTRIBUTIONS)}"
            )
        if not (self.duration_s > 0 and math.isfinite(self.duration_s)):
            raise GeneratorError(f"duration_s must be positive, got {self.duration_s}")
        if not 0 <= self.jitter < 1:
            raise GeneratorError(f"jitter must be in [0, 1), got {self.jitter}")
        if self.arrival not in ("zero", "poisson"):
            raise GeneratorError(f"arrival {self.arrival!r}: expected zero or poisson")
        if self.arrival == "poisson" and not (self.load > 0 and math.isfinite(self.load)):
            raise GeneratorError(f"load must be positive, got {self.load}")
        parse_mix(self.mix)
        out = replace(self, max_gpus=cap)
        demand_values(out)  # raises if the range holds no value
        if out.arrival == "poisson":
            rate = _arrival_rate(out, cluster)
            if not (rate > 0 and math.isfinite(1.0 / rate)):
                raise GeneratorError(
                    f"load {self.load:g} with duration_s {self.duration_s:g} puts the mean gap between arrivals "
                    "beyond the float range; raise load or lower duration_s"
                )
        return out


def demand_values(cfg: GeneratorConfig) -> np.ndarray:
    """The GPU demands the configured distribution draws from, uniformly; shape ``(k,)``."""
    lo, hi = cfg.min_gpus, int(cfg.max_gpus or 32)
    if cfg.demand == "pow2":
        vals = [2**i for i in range(31) if lo <= 2**i <= hi]
    elif cfg.demand == "uniform":
        vals = list(range(lo, hi + 1))
    else:
        vals = [g for g in (2, 4, 8) if lo <= g <= hi]
    if not vals:
        raise GeneratorError(f"demand distribution {cfg.demand!r} has no value in [{lo}, {hi}]")
    return np.asarray(vals, dtype=np.int64)


def arrival_rate(cfg: GeneratorConfig, cluster: ClusterSpec) -> float:
    """Poisson arrival rate (jobs / s) giving offered load ``cfg.load`` on ``cluster``."""
    return _arrival_rate(cfg.resolved(cluster), cluster)


def _arrival_rate(cfg: GeneratorConfig, cluster: ClusterSpec) -> float:
    """:func:`arrival_rate` of an already resolved ``cfg``."""
    mean_gpus = float(demand_values(cfg).mean())
    return cfg.load * cluster.total_gpus / (mean_gpus * cfg.duration_s)


def _check_finite(name: str, values: np.ndarray, hint: str) -> None:
    """Raise :class:`GeneratorError` if one of the drawn ``values`` overflowed: no trace reader accepts ``inf``."""
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        i = int(bad[0])
        raise GeneratorError(f"job {i}: {name} overflows the float range ({values[i]}); {hint}")


def _models(rng: np.random.Generator, probs: np.ndarray, n: int, exact: bool) -> np.ndarray:
    if not exact:
        return rng.choice(len(probs), size=n, p=probs)
    quota = probs * n
    counts = np.floor(quota).astype(np.int64)
    left = n - int(counts.sum())
    if left:
        # Largest remainders first; ties broken by the generator.
        order = np.lexsort((rng.random(len(probs)), -(quota - counts)))
        counts[order[:left]] += 1
    idx = np.repeat(np.arange(len(probs)), counts)
    rng.shuffle(idx)
    return idx


def generate_jobs(
    cluster: ClusterSpec,
    cfg: GeneratorConfig = GeneratorConfig(),
    perf: ContentionModel | None = None,
    id_prefix: str = "",
) -> list[JobSpec]:
    """Draw one job set for ``cluster`` (see module docstring).

    Job ids are ``f"{id_prefix}{i}"`` for ``i = 0..num_jobs-1`` in arrival order.
    ``extra`` holds ``duration`` (isolated seconds on the best placement).
    """
    cfg = cfg.resolved(cluster)
    perf = perf or ContentionModel(cluster)
    rng = np.random.default_rng(cfg.seed)
    n = cfg.num_jobs
    model_idx = _models(rng, parse_mix(cfg.mix), n, cfg.exact_mix)
    demands = rng.choice(demand_values(cfg), size=n)
    factors = rng.uniform(1 - cfg.jitter, 1 + cfg.jitter, size=n) if cfg.jitter > 0 else np.ones(n)
    models = [MODELS[int(m)] for m in model_idx]
    gpus = [int(g) for g in demands]
    thp: dict[tuple[str, int], float] = {}
    for key in zip(models, gpus):
        if key not in thp:
            thp[key] = perf.best_isolated_throughput(*key)
    with np.errstate(over="ignore"):  # an overflow to inf is reported just below
        durations = cfg.duration_s * factors
        samples = durations * np.array([thp[key] for key in zip(models, gpus)])
        if cfg.arrival == "poisson":
            gaps = rng.exponential(1.0 / _arrival_rate(cfg, cluster), size=n - 1)
            submit = np.concatenate([[0.0], np.cumsum(gaps)])
        else:
            submit = np.zeros(n)
    _check_finite("duration", durations, f"lower duration_s ({cfg.duration_s:g})")
    _check_finite("total_samples", samples, f"lower duration_s ({cfg.duration_s:g})")
    _check_finite("submit_time", submit, f"raise load ({cfg.load:g}) or lower duration_s ({cfg.duration_s:g})")
    late = np.flatnonzero(submit > MAX_SUBMIT_TIME_S)
    if late.size:  # no trace reader accepts it (nor the simulator)
        i = int(late[0])
        raise GeneratorError(
            f"job {i}: submit_time {submit[i]:.4g} s is beyond the largest submit time {MAX_SUBMIT_TIME_TEXT}; "
            f"raise load ({cfg.load:g}), lower duration_s ({cfg.duration_s:g}) or draw fewer jobs"
        )
    return [
        JobSpec(f"{id_prefix}{i}", t, m, g, w, {"duration": d})
        for i, (t, m, g, w, d) in enumerate(zip(submit.tolist(), models, gpus, samples.tolist(), durations.tolist()))
    ]


def generate_sets(
    cluster: ClusterSpec,
    cfg: GeneratorConfig = GeneratorConfig(),
    num_sets: int = 10,
    perf: ContentionModel | None = None,
) -> list[list[JobSpec]]:
    """``num_sets`` independent job sets; set ``k`` is drawn with seed sequence ``(cfg.seed, k)``."""
    if num_sets < 1:
        raise GeneratorError(f"num_sets must be >= 1, got {num_sets}")
    if num_sets * cfg.num_jobs > MAX_JOBS:
        raise GeneratorError(
            f"{num_sets} sets of {cfg.num_jobs} jobs are {num_sets * cfg.num_jobs:,} jobs, more than the "
            f"generator's limit of {MAX_JOBS:,} jobs in one call (they are held in memory until written)"
        )
    perf = perf or ContentionModel(cluster)
    out = []
    for k in range(num_sets):
        seed = int(np.random.SeedSequence([cfg.seed, k]).generate_state(1, dtype=np.uint64)[0] >> 1)
        out.append(generate_jobs(cluster, replace(cfg, seed=seed), perf))
    return out


#: the files :func:`write_sets` writes (a directory of only these may be replaced with ``force``)
_SET_NAME = re.compile(r"set\d+\.(?:csv|json|parquet)")


def check_sets_directory(directory: str | Path, force: bool = False) -> Path:
    """Raise :class:`GeneratorError` if :func:`write_sets` may not write ``directory``; return its absolute path.

    Refused: a file, a non-empty directory without ``force`` (with it, one holding anything but
    ``set<N>.<csv|json|parquet>`` files), and the
    file-system root, the current directory or one of its ancestors (``.``,
    ``..``), which replacing would pull away from under the caller.
    """
    given = Path(directory)
    # The absolute path: "." and ".." have no name to build the temporary siblings from.
    absolute = Path(os.path.abspath(given))
    if absolute.parent == absolute:
        raise GeneratorError(f"{given}: cannot write job sets to the file-system root; name a new directory")
    cwd = Path.cwd().resolve()
    real = absolute.resolve()
    if real == cwd or real in cwd.parents:
        raise GeneratorError(
            f"{given}: is the current directory or contains it; name a new directory, e.g. {given / 'sets'}"
        )
    if absolute.exists() and not absolute.is_dir():
        raise GeneratorError(f"{given}: exists and is not a directory")
    if absolute.is_dir() and any(absolute.iterdir()):
        if not force:
            raise GeneratorError(f"{given}: directory is not empty (use --overwrite to replace it)")
        # replaced as a whole: only a directory of earlier job sets, never one holding anything else
        stray = next((e.name for e in sorted(absolute.iterdir())
                      if not (_SET_NAME.fullmatch(e.name) and e.is_file() and not e.is_symlink())), None)
        if stray is not None:
            raise GeneratorError(
                f"{given}: holds {stray!r}, which is not a job set (set<N>.csv|json|parquet); --overwrite replaces "
                "only a directory of earlier job sets (choose another --out, or empty it)"
            )
    why = unwritable(absolute.parent)  # the sets are written beside it, then renamed into place
    if why is not None:
        raise GeneratorError(f"{given}: {why}")
    return absolute


def write_sets(
    directory: str | Path, sets: Sequence[Sequence[JobSpec]], fmt: str = "csv", force: bool = False
) -> list[Path]:
    """Write ``set0.<fmt> .. set{N-1}.<fmt>`` into ``directory`` atomically.

    Everything is written into a temporary sibling directory that is renamed
    into place at the end, so an error leaves no partial directory. An existing
    non-empty ``directory`` is an error unless ``force`` (then it is replaced);
    see :func:`check_sets_directory` for the other refusals. Returns the
    written paths, absolute.
    """
    from trainer.traces import current_umask, write_trace

    if fmt not in ("csv", "parquet", "json"):
        raise GeneratorError(f"format {fmt!r}: expected csv, parquet or json")
    directory = check_sets_directory(directory, force)
    parent = directory.resolve().parent
    if not parent.is_dir():
        raise GeneratorError(f"{parent}: no such directory")
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", suffix=".tmp", dir=parent))
    old: Path | None = None
    try:
        names = []
        for k, jobs in enumerate(sets):
            name = f"set{k}.{fmt}"
            write_trace(tmp / name, jobs)
            names.append(name)
        os.chmod(tmp, 0o755 & ~current_umask())
        if directory.exists():
            old = directory.with_name(f".{directory.name}.old-{os.getpid()}")
            directory.rename(old)
        tmp.rename(directory)
    except BaseException:
        if old is not None and old.exists() and not directory.exists():
            old.rename(directory)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return [directory / n for n in names]
