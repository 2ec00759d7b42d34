"""Reader for the Microsoft Philly trace (``data/philly/philly.csv``).

The file (as derived by petuum/adaptdl, see ``data/NOTICE.md``) has one row
per job with columns ``timestamp, duration, num_gpus, gpu_time, cluster``:
submit time (``YYYY-MM-DD HH:MM:SS``), run time (s), GPUs, GPU-seconds and
the virtual cluster id. It has no model names and comes from a much larger
cluster, so turning a row into a :class:`~policies.job.JobSpec` for a target
cluster needs a rule. Ours (also in ``docs/TRACES.md``):

1. **job id** -- the row's 0-based index among the data rows of the file
   (``"0"`` is the first job after the header), so ids are stable under
   filtering and across seeds.
2. **submit time** -- seconds since the earliest ``timestamp`` of the jobs
   kept (after the ``virtual_clusters`` / ``window`` / ``sample`` / ``limit``
   filters), times ``time_scale``; at most
   :data:`trainer.traces.MAX_SUBMIT_TIME_S` (1e9 s, about 31.7 years).
3. **model** -- drawn per row from ``numpy.random.default_rng(seed)`` with
   the probabilities of ``mix`` (default ``normal`` = 1:1:1:1:1:1 over
   GNN:IMG:DLRM:LM:FSDP:MoE). One draw is made for *every* data row of the
   file in file order, so a job's model depends only on the seed, the mix and
   its row, never on the filters.
4. **GPU demand** -- ``max(1, round(num_gpus * gpu_scale))``; a demand above
   the cap (``max_gpus`` if given, never more than the cluster's GPUs) is
   clipped to the cap (``oversize="clip"``, default), the job is dropped
   (``"drop"``) or the read fails (``"error"``).
5. **work** -- we assume the trace's ``duration`` is the time the job would
   take *alone on its best placement on the target cluster* at its (scaled)
   demand, i.e. we ignore the original cluster's hardware, placement and
   interference, which the trace does not record. Hence
   ``total_samples = duration * time_scale * best_isolated_throughput(model, demand)``.

Jobs are returned sorted by submit time (ties in row order). Each keeps
``extra = {"vc": cluster id, "philly_gpus": original num_gpus, "duration":
isolated seconds}``.

Bounds: the file is at most :data:`trainer.traces.MAX_TRACE_BYTES` (32 MiB, checked before reading)
and :data:`trainer.traces.MAX_TRACE_JOBS` rows. The whole 82,247-job file reads in about 0.5 s of CPU: parsing is ``csv``
plus vectorised numpy; per-row Python only builds the jobs and locates a bad
value.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from policies.cluster import ClusterSpec
from policies.job import JobSpec
from policies.perf import ContentionModel
from policies.workloads import MODELS
from trainer.generate import GeneratorError, parse_mix
from trainer.traces import (
    MAX_SUBMIT_TIME_S,
    MAX_SUBMIT_TIME_TEXT,
    MAX_TRACE_JOBS,
    TraceError,
    check_trace_size,
    open_csv,
    plain_number,
)

__all__ = ["PHILLY_COLUMNS", "read_philly", "draw_models", "isolated_samples"]

#: Columns the reader needs (``gpu_time`` and ``cluster`` are optional).
PHILLY_COLUMNS = ("timestamp", "duration", "num_gpus")

#: A character no plain decimal literal holds (``nan`` / ``inf`` do, and are checked one by one).
_NOT_PLAIN_CHAR = re.compile(r"[^0-9.eE+\-\s]")


def draw_models(n: int, seed: int, probs: np.ndarray) -> np.ndarray:
    """Rule 3 (module docstring): the model of each of ``n`` rows, as indices into
    :data:`policies.workloads.MODELS`, shape ``(n,)``: one draw per row, in row order, from
    ``numpy.random.default_rng(seed)`` with the mix probabilities ``probs`` (shape ``(len(MODELS),)``,
    as :func:`trainer.generate.parse_mix` returns them). Row ``i``'s model depends only on ``seed``,
    ``probs`` and ``i``."""
    return np.random.default_rng(seed).choice(len(MODELS), size=n, p=probs)


def isolated_samples(
    perf: ContentionModel, models: Sequence[str], demands: Sequence[int], seconds: np.ndarray
) -> np.ndarray:
    """Rule 5 (module docstring): the work (samples) that takes job ``i`` ``seconds[i]`` s alone on its best
    placement at ``demands[i]`` GPUs: ``seconds[i] * perf.best_isolated_throughput(models[i], demands[i])``,
    shape ``(n,)``, float64. Each distinct (model, demand) pair is priced once. A product beyond the float
    range is ``inf`` (the caller reports it)."""
    pairs = list(zip(models, (int(g) for g in demands)))
    thp = {pair: perf.best_isolated_throughput(*pair) for pair in set(pairs)}
    rate = np.fromiter((thp[pair] for pair in pairs), dtype=np.float64, count=len(pairs))
    with np.errstate(over="ignore"):
        return np.asarray(seconds, dtype=np.float64) * rate


def _locate_float(path: Path, lines: np.ndarray, values: Sequence[str], col: str) -> None:
    """Raise a TraceError for the first entry of ``values`` that is not a number."""
    for i, v in enumerate(values):
        try:
            float(v)
        except ValueError:
            raise TraceError(path, f"expected a number, got {v!r}", int(lines[i]), col) from None


def _floats(path: Path, lines: np.ndarray, values: list[str], col: str) -> np.ndarray:
    """``values`` as finite floats, shape ``(n,)``: plain decimal literals only, as in a canonical CSV
    (numpy, like ``float``, also takes ``1_000`` and non-ASCII digits)."""
    try:
        arr = np.array(values, dtype=np.float64)
    except ValueError:
        _locate_float(path, lines, values, col)
        raise  # unreachable: numpy and float() disagree
    # Fast path: numbers numpy parsed that use only these characters are plain literals; else look closer.
    if _NOT_PLAIN_CHAR.search("\n".join(values)):
        for i, v in enumerate(values):
            if not plain_number(v):
                raise TraceError(path, f"expected a number, got {v!r}", int(lines[i]), col)
    bad = np.flatnonzero(~np.isfinite(arr))
    if bad.size:
        i = int(bad[0])
        raise TraceError(path, f"expected a finite number, got {values[i]!r}", int(lines[i]), col)
    return arr


def _times(path: Path, lines: np.ndarray, values: list[str]) -> np.ndarray:
    """Timestamps as int64 seconds since the epoch, shape ``(n,)``."""
    try:
        arr = np.array(values, dtype="datetime64[s]")
    except ValueError:
        arr = None
    if arr is None or np.isnat(arr).any():
        for i, v in enumerate(values):
            try:
                t = np.datetime64(v.strip(), "s") if v.strip() else np.datetime64("NaT")
            except ValueError:
                t = np.datetime64("NaT")
            if np.isnat(t):
                raise TraceError(
                    path, f"expected a date-time like 2017-10-09 07:01:55, got {v!r}", int(lines[i]), "timestamp"
                )
        raise TraceError(path, "unparsable timestamps")  # pragma: no cover - numpy and scalar parse disagree
    return arr.astype(np.int64)


def read_philly(
    path: str | Path,
    cluster: ClusterSpec | None,
    seed: int = 0,
    *,
    mix: str | Sequence[float] | Mapping[str, float] = "normal",
    perf: ContentionModel | None = None,
    gpu_scale: float = 1.0,
    max_gpus: int | None = None,
    oversize: str = "clip",
    time_scale: float = 1.0,
    virtual_clusters: Sequence[str] | None = None,
    window: tuple[float, float] | None = None,
    sample: float = 1.0,
    limit: int | None = None,
) -> list[JobSpec]:
    """Read the Philly CSV as jobs for ``cluster`` (rule in the module docstring).

    :param path: the CSV file.
    :param cluster: the target cluster (required: it prices the work).
    :param seed: seed of the per-row model draw.
    :param mix: model mix (anything :func:`trainer.generate.parse_mix` accepts).
    :param perf: performance model; defaults to ``ContentionModel(cluster)``.
    :param gpu_scale: factor on ``num_gpus`` before rounding (> 0).
    :param max_gpus: demand cap (default: the cluster's GPUs).
    :param oversize: ``clip`` | ``drop`` | ``error`` for demands above the cap.
    :param time_scale: factor on submit times and durations (> 0), e.g. 0.1 to
        compress the trace tenfold at the same offered load.
    :param virtual_clusters: keep only rows whose ``cluster`` column is listed.
    :param window: keep rows submitted in ``[t0, t1)`` seconds after the
        file's earliest timestamp (before ``time_scale``).
    :param sample: keep each row with this probability (0 < sample <= 1),
        drawn from ``default_rng([seed, 1])`` independently of the models; the
        offered load scales by about ``sample`` (time_scale does not change it).
    :param limit: keep at most this many jobs (the earliest submitted).
    :raises TraceError: naming file, row (line number, header = 1) and field.
    """
    path = Path(path)
    if cluster is None:
        raise TraceError(
            path, "a Philly trace needs the target cluster (e.g. --cluster 4x8) to size and price its jobs"
        )
    if oversize not in ("clip", "drop", "error"):
        raise ValueError(f"oversize must be clip, drop or error, got {oversize!r}")
    for name, scale in (("gpu_scale", gpu_scale), ("time_scale", time_scale)):
        if not (math.isfinite(scale) and scale > 0):  # NaN fails both; inf would give inf times or demands
            raise ValueError(f"{name} must be a finite number > 0, got {scale!r}")
    if not 0 < sample <= 1:
        raise ValueError(f"sample must be in (0, 1], got {sample}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    try:
        probs = parse_mix(mix)
    except GeneratorError as exc:
        raise TraceError(path, str(exc)) from None
    cap = cluster.total_gpus if max_gpus is None else min(int(max_gpus), cluster.total_gpus)
    if cap < 1:
        raise ValueError(f"max_gpus must be >= 1, got {max_gpus}")

    check_trace_size(path, what="Philly trace")  # bounds memory: the rows are held as text until vectorised
    with open_csv(path) as reader:
        try:
            header = next(reader)
        except StopIteration:
            raise TraceError(path, "empty file: no header and no jobs") from None
        header = [h.strip() for h in header]
        for c in PHILLY_COLUMNS:
            if c not in header:
                raise TraceError(path, f"missing column (header has: {', '.join(header)})", 1, c)
        rows = []
        for r in reader:
            rows.append(r)
            if len(rows) > MAX_TRACE_JOBS:
                raise TraceError(
                    path, f"more than {MAX_TRACE_JOBS:,} rows, the limit for one trace; split it by submit time",
                    reader.line_num,
                )
    width = len(header)
    # Line numbers as a person counts them (header = line 1); blank lines skipped.
    keep = [(i + 2, r) for i, r in enumerate(rows) if r]
    for line, r in keep:
        if len(r) != width:
            raise TraceError(path, f"expected {width} fields, got {len(r)}", line)
    if not keep:
        raise TraceError(path, "the trace has no jobs")
    lines = np.fromiter((ln for ln, _ in keep), dtype=np.int64, count=len(keep))
    cols = list(zip(*(r for _, r in keep)))
    i_ts, i_dur, i_gpu = (header.index(c) for c in PHILLY_COLUMNS)
    i_vc = header.index("cluster") if "cluster" in header else None

    n_all = len(keep)
    ts = _times(path, lines, list(cols[i_ts]))
    dur_raw = list(cols[i_dur])
    dur = _floats(path, lines, dur_raw, "duration")
    bad = np.flatnonzero(dur <= 0)
    if bad.size:
        i = int(bad[0])
        raise TraceError(path, f"must be positive, got {dur_raw[i]!r}", int(lines[i]), "duration")
    gpu_raw = list(cols[i_gpu])
    gpus = _floats(path, lines, gpu_raw, "num_gpus")
    bad = np.flatnonzero((gpus < 1) | (gpus != np.round(gpus)))
    if bad.size:
        i = int(bad[0])
        raise TraceError(path, f"expected a positive integer, got {gpu_raw[i]!r}", int(lines[i]), "num_gpus")
    vc = np.array(cols[i_vc], dtype=object) if i_vc is not None else np.full(n_all, "", dtype=object)

    # Rule 3: one model draw per data row, in file order, before any filter.
    model_idx = draw_models(n_all, seed, probs)

    sel = np.ones(n_all, dtype=bool)
    if virtual_clusters is not None:
        sel &= np.isin(vc.astype(str), np.asarray(list(virtual_clusters), dtype=str))
    if window is not None:
        rel = ts - ts.min()
        sel &= (rel >= window[0]) & (rel < window[1])
    if sample < 1:
        sel &= np.random.default_rng([seed, 1]).random(n_all) < sample

    # Bounded before the integer cast so absurd values cannot wrap around.
    gpus = np.minimum(gpus, 2.0**40)
    demand = np.clip(np.round(gpus * gpu_scale), 1, 2.0**40).astype(np.int64)
    over = sel & (demand > cap)
    if over.any():
        if oversize == "error":
            i = int(np.flatnonzero(over)[0])
            raise TraceError(
                path,
                f"gpu demand {demand[i]} is larger than the cap ({cap} GPUs on cluster {cluster.describe()})",
                int(lines[i]),
                "num_gpus",
            )
        if oversize == "drop":
            sel &= ~over
        else:
            demand = np.minimum(demand, cap)

    idx = np.flatnonzero(sel)
    idx = idx[np.argsort(ts[idx], kind="stable")]
    if limit is not None:
        idx = idx[: max(int(limit), 0)]
    if idx.size == 0:
        raise TraceError(path, "no jobs left after filtering")

    perf = perf or ContentionModel(cluster)
    with np.errstate(over="ignore"):  # overflow -> inf, reported just below
        d_iso = dur[idx] * time_scale
    samples = isolated_samples(perf, [MODELS[m] for m in model_idx[idx].tolist()], demand[idx].tolist(), d_iso)
    bad = np.flatnonzero(~np.isfinite(samples))
    if bad.size:
        i = int(idx[bad[0]])
        scaled = f" with time_scale {time_scale:g}" if time_scale != 1 else ""
        raise TraceError(path, f"too large to price as samples{scaled}: {dur_raw[i]!r}", int(lines[i]), "duration")
    with np.errstate(over="ignore"):
        submit = (ts[idx] - ts[idx].min()).astype(np.float64) * time_scale
    bad = np.flatnonzero(~np.isfinite(submit))
    if bad.size:
        i = int(idx[bad[0]])
        raise TraceError(
            path, f"submit time overflows the float range with time_scale {time_scale:g}", int(lines[i]), "timestamp"
        )
    bad = np.flatnonzero(submit > MAX_SUBMIT_TIME_S)
    if bad.size:  # e.g. a year-1 and a year-9999 timestamp, or a large time_scale
        i = int(idx[bad[0]])
        first = int(idx[int(np.argmin(ts[idx]))])
        scaled = f" (times time_scale {time_scale:g})" if time_scale != 1 else ""
        raise TraceError(
            path,
            f"{cols[i_ts][i]!r} is {submit[bad[0]]:.4g} s{scaled} after the earliest kept job's "
            f"{cols[i_ts][first]!r} (row {int(lines[first])}), beyond the largest submit time {MAX_SUBMIT_TIME_TEXT}",
            int(lines[i]),
            "timestamp",
        )

    orig = gpus[idx].astype(np.int64).tolist()
    return [
        JobSpec(str(j), s, MODELS[m], g, w, {"vc": v, "philly_gpus": o, "duration": d})
        for j, s, m, g, w, v, o, d in zip(
            idx.tolist(),
            submit.tolist(),
            model_idx[idx].tolist(),
            demand[idx].tolist(),
            samples.tolist(),
            vc[idx].tolist(),
            orig,
            d_iso.tolist(),
        )
    ]
