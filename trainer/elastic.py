"""Elastic job traces: the schema, a reader, and a generator for the settings of DL2 and Chic.

**Schema** (a JSON document; ``docs/ELASTIC.md`` has an example)::

    {"format": "rlsched-elastic-trace", "version": 1, "setting": "<free text>",
     "jobs": [{"job_id": "c0", "submit_time": 0.0, "model": "ResNet-50",
               "epochs": 150,                     # or "total_samples": <work> (exactly one of the two)
               "workers": 1,                      # workers it asks for at submission (>= 1)
               "min_workers": 1, "max_workers": 16,   # optional, both or neither: its elastic range
               "worker": {"gpus": 1, "cpus": 2, "mem_gb": 8},
               "ps": {"count": 1, "cpus": 3, "mem_gb": 9}}]}   # optional: parameter servers

* ``model``: a parameter-server model (:data:`policies.psmodel.PS_MODELS`, priced by the PS speed
  model, needs ``ps`` with ``count >= 1``) or one of the all-reduce models
  (:mod:`policies.workloads`, no ``ps``).
* ``epochs`` (PS models only): work = ``epochs * EPOCH_SIZE[model]`` units of speed x seconds;
  ``total_samples``: the work in the model's throughput unit times seconds.
* ``worker.gpus`` must be 1 (one data-parallel worker per GPU); ``cpus`` integers >= 0, ``mem_gb``
  finite >= 0; ``submit_time`` finite, >= 0, seconds.

Each job becomes a :class:`~policies.job.JobSpec` whose ``demand``
(:class:`~policies.resources.ResourceDemand`) carries the per-worker and per-PS resources and the
range. Bad input raises :class:`ElasticTraceError` with one line naming the file, the job and the field.

**Generator** (:func:`generate`; ``rlsched trace gen-elastic``; :func:`gen_elastic_dir` and ``gen-elastic
--seeds N --out DIR``: a directory of N sequences, a trace group for ``rlsched evaluate``):

* ``chic`` (Chic, seed 001 section 6): Poisson arrivals at ``rate`` jobs/h (0.9-2.7 in the seed;
  default 1.8), models drawn uniformly from ResNet-50, VGG-16, ResNeXt-110 with the seed's per-worker
  and per-PS GPUs / CPUs / memory, each trained for U{100..200} iterations, read here as epochs of
  DL2's downscaled datasets (the seed does not say how long an iteration takes), 30 jobs per sequence
  (the seed's W = 30), 1 worker and 1 PS at submission, elastic in 1..16 workers (DL2's
  ``MAX_NUM_WORKERS``).
* ``dl2`` (DL2, seed 000 section 6): 200 jobs arriving per 20-minute slot as the per-slot counts of
  DL2's large-scale simulation (the authors' ``trace.py``, ``arrv_pattern_10``: the pattern of its
  Fig. 8(a) with at most 10 arrivals a slot), at a uniformly random start offset of 0-4 slots as there;
  models drawn uniformly from DL2's Table 1; workers of 1 GPU and 1-4 CPUs, PSs of 1-4 CPUs (the seed),
  10 GB each (its Fig. 1 setup); durations drawn log-normally with mean 147 minutes (Fig. 8(b)) at
  1 worker and 1 PS (measured speed) and turned into epochs.

Cluster files of the two settings: ``data/clusters/chic.yaml`` (5 nodes x 2 GPUs, 24 CPUs, 120 GB:
the seed's 10 GPUs, 120 cores, 600 GB) and ``data/clusters/dl2.yaml`` (500 nodes x 2 GTX 1080Ti,
8 cores, 48 GB: DL2's simulated 500 servers shaped like its testbed's).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from policies.job import JobSpec
from policies.psmodel import EPOCH_SIZE, PS_MODELS, PSPerformanceModel, canonical_ps_model, fit_ps_models
from policies.resources import ResourceDemand, ResourceError
from trainer.outputs import nearest_existing
from trainer.traces import TraceError

__all__ = [
    "FORMAT",
    "VERSION",
    "MAX_TRACE_BYTES",
    "SETTINGS",
    "ElasticTraceError",
    "is_elastic_trace",
    "read_elastic_trace",
    "elastic_perf",
    "load_jobs",
    "check_elastic_policy",
    "parse_elastic_trace",
    "generate",
    "write_trace",
    "gen_elastic_dir",
    "register_gen_elastic",
]

FORMAT = "rlsched-elastic-trace"
VERSION = 1
#: Largest elastic trace file read (bytes).
MAX_TRACE_BYTES = 64 * 2**20
SETTINGS = ("chic", "dl2")

#: Chic's per-worker and per-PS resources (seed 001, section 6.1): (worker CPUs, worker GB, PS CPUs, PS GB).
CHIC_RESOURCES = {
    "ResNet-50": (2, 8.0, 3, 9.0),
    "VGG-16": (2, 10.0, 4, 10.0),
    "ResNeXt-110": (2, 10.0, 3, 10.0),
}
#: Jobs arriving in each 20-minute slot in DL2's large-scale simulation (the authors' ``trace.py``,
#: ``arrv_pattern_10``, at most 10 a slot: the weekly pattern of DL2's Fig. 8(a), scaled down).
DL2_ARRIVALS = (
    6, 134, 8, 7, 8, 10, 9, 7, 6, 5, 6, 5, 7, 8, 9, 6, 8, 8, 8, 8, 7, 5, 5, 7, 9, 7, 5, 5, 5,
    3, 5, 6, 4, 6, 6, 6, 7, 7, 4, 5, 5, 3, 5, 5, 4, 6, 5, 6, 5, 3, 4, 4, 6, 7, 7, 7, 7, 7, 6,
    6, 6, 6, 7, 6, 4, 6, 4, 5, 4, 6, 5, 6, 5, 7, 6,
)
DL2_MAX_PER_SLOT = 10
DL2_SLOT_S = 1200.0
DL2_MEAN_DURATION_S = 147 * 60.0
MAX_WORKERS = 16


class ElasticTraceError(TraceError):
    """A malformed elastic trace (one line naming the file, the job and the field); a
    :class:`~trainer.traces.TraceError`, so the ``rlsched`` commands report it and exit 2."""

    def __init__(self, message: str) -> None:
        ValueError.__init__(self, message)
        self.path, self.row, self.column = "", None, None


# ---------------------------------------------------------------------- reading
def is_elastic_trace(path: str | Path) -> bool:
    """Whether ``path`` is a JSON file whose top level says ``"format": "rlsched-elastic-trace"``
    (read only up to its first 4 KiB)."""
    p = Path(path)
    if p.suffix.lower() != ".json" or not p.is_file():
        return False
    try:
        with p.open("rb") as f:
            head = f.read(4096).decode("utf-8", "replace")
    except OSError:
        return False
    return f'"{FORMAT}"' in head


def read_elastic_trace(path: str | Path) -> list[JobSpec]:
    """The jobs of the elastic trace file ``path`` (:class:`ElasticTraceError` on bad input)."""
    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError as exc:
        raise ElasticTraceError(f"{p}: cannot read: {exc.strerror or exc}") from None
    if size > MAX_TRACE_BYTES:
        raise ElasticTraceError(f"{p}: {size} bytes, larger than the {MAX_TRACE_BYTES // 2**20} MiB an elastic trace may have")
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ElasticTraceError(f"{p}: cannot read: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ElasticTraceError(f"{p}: not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    return parse_elastic_trace(doc, str(p))


def elastic_perf(perf: Any) -> PSPerformanceModel:
    """The performance model an elastic trace runs under: :class:`~policies.psmodel.PSPerformanceModel`
    over ``perf`` (the all-reduce :class:`~policies.perf.ContentionModel` that prices jobs without PSs);
    ``perf`` itself when it is one already."""
    return perf if isinstance(perf, PSPerformanceModel) else PSPerformanceModel(perf)


def load_jobs(path: str | Path, cluster: Any, perf: Any) -> tuple[list[JobSpec], bool]:
    """The jobs of the trace file ``path`` of either kind and whether it is elastic: an elastic trace
    (:func:`is_elastic_trace`) by :func:`read_elastic_trace`, any other by :func:`trainer.traces.load_trace`
    for ``cluster`` and ``perf``. What ``rlsched simulate`` and ``rlsched evaluate`` read a trace with; an
    elastic trace's jobs run under :func:`elastic_perf` of ``perf``.

    :raises TraceError: (:class:`ElasticTraceError` for an elastic trace) naming the file and the field.
    """
    from trainer.traces import load_trace

    if is_elastic_trace(path):
        return read_elastic_trace(path), True
    return load_trace(path, cluster, perf), False


def check_elastic_policy(name: str, policy: Any, where: str, shown: str | None = None) -> None:
    """Refuse a policy that cannot run elastic jobs with parameter servers by one line naming it and
    ``where`` (the trace or group): a learned fixed-size policy (``rl-*``, ``sced2``, ``rl-sf``), whose
    codec knows only the all-reduce models. The elastic policies (those that resize: ``drf``, ``tetris``,
    ``optimus``, ``chic``, ``chic-pair``, ``dl2``) and the heuristics pass.

    :param name: the policy name it was built from (:func:`policies.registry.make_policy`).
    :param shown: the name the user sees (an ``ALIAS=NAME`` alias); default ``name``.
    :raises policies.base.PolicyError: for such a policy.
    """
    from policies.base import PolicyError
    from policies.registry import is_learned

    if getattr(policy, "resizes", False) or not is_learned(name):
        return
    raise PolicyError(
        f"policy {shown or name!r} does not run on elastic traces ({where}): a learned fixed-size policy knows only "
        "the all-reduce models; use drf, tetris, optimus, chic, chic-pair, dl2 or a heuristic (fifo, srtf, ...)"
    )


def _num(where: str, key: str, v: Any, *, integer: bool = False, lo: float = 0.0, positive: bool = False) -> Any:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and not isinstance(v, int)):
        raise ElasticTraceError(f"{where}: {key} must be {'an integer' if integer else 'a number'}, got {v!r}")
    if not math.isfinite(v) or v < lo or (positive and v <= 0):
        raise ElasticTraceError(f"{where}: {key} must be {'> 0' if positive else f'>= {lo:g}'} and finite, got {v!r}")
    return v


def _obj(where: str, key: str, v: Any, keys: tuple[str, ...]) -> dict:
    if not isinstance(v, dict):
        raise ElasticTraceError(f"{where}: {key} must be an object, got {v!r}")
    extra = sorted(set(v) - set(keys))
    if extra:
        raise ElasticTraceError(f"{where}: {key} has unknown key {extra[0]!r} (known: {', '.join(keys)})")
    return v


_JOB_KEYS = ("job_id", "submit_time", "model", "epochs", "total_samples", "workers", "min_workers", "max_workers",
             "worker", "ps")


def parse_elastic_trace(doc: Any, name: str = "<trace>") -> list[JobSpec]:
    """The jobs of an elastic trace document (module docstring)."""
    from policies.workloads import UnknownModelError, canonical_model

    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ElasticTraceError(f"{name}: not an elastic trace (a JSON object with \"format\": \"{FORMAT}\")")
    if doc.get("version") != VERSION:
        raise ElasticTraceError(f"{name}: version {doc.get('version')!r} is not supported (expected {VERSION})")
    extra = sorted(set(doc) - {"format", "version", "setting", "jobs", "meta"})
    if extra:
        raise ElasticTraceError(f"{name}: unknown top-level key {extra[0]!r}")
    jobs = doc.get("jobs")
    if not isinstance(jobs, list) or not jobs:
        raise ElasticTraceError(f"{name}: jobs must be a non-empty list")
    out: list[JobSpec] = []
    seen: set[str] = set()
    for i, rec in enumerate(jobs):
        where = f"{name}: job {i}"
        if not isinstance(rec, dict):
            raise ElasticTraceError(f"{where}: must be an object, got {rec!r}")
        jid = rec.get("job_id")
        if not isinstance(jid, str) or not jid.strip() or len(jid) > 200:
            raise ElasticTraceError(f"{where}: job_id must be a non-empty string of at most 200 characters, got {jid!r}")
        where = f"{name}: job {i} ({jid!r})"
        if jid in seen:
            raise ElasticTraceError(f"{where}: duplicate job_id")
        seen.add(jid)
        bad = sorted(set(rec) - set(_JOB_KEYS))
        if bad:
            raise ElasticTraceError(f"{where}: unknown key {bad[0]!r} (known: {', '.join(_JOB_KEYS)})")
        for k in ("submit_time", "model", "workers", "worker"):
            if k not in rec:
                raise ElasticTraceError(f"{where}: missing {k}")
        submit = float(_num(where, "submit_time", rec["submit_time"]))
        raw_model = rec["model"]
        model = canonical_ps_model(raw_model) if isinstance(raw_model, str) else None
        is_ps = model is not None
        if model is None:
            try:
                model = canonical_model(raw_model)
            except (UnknownModelError, TypeError, AttributeError):
                raise ElasticTraceError(
                    f"{where}: model {raw_model!r} is unknown (PS models: {', '.join(PS_MODELS)}; "
                    "all-reduce models: see policies/workloads.py)"
                ) from None
        has_e, has_s = "epochs" in rec, "total_samples" in rec
        if has_e == has_s:
            raise ElasticTraceError(f"{where}: give exactly one of epochs and total_samples")
        if has_e:
            if not is_ps:
                raise ElasticTraceError(f"{where}: epochs applies to parameter-server models; give total_samples")
            work = float(_num(where, "epochs", rec["epochs"], positive=True)) * EPOCH_SIZE[model]
        else:
            work = float(_num(where, "total_samples", rec["total_samples"], positive=True))
        workers = _num(where, "workers", rec["workers"], integer=True, lo=1)
        lo, hi = rec.get("min_workers"), rec.get("max_workers")
        if (lo is None) != (hi is None):
            raise ElasticTraceError(f"{where}: give both min_workers and max_workers, or neither")
        if lo is not None:
            _num(where, "min_workers", lo, integer=True, lo=1)
            _num(where, "max_workers", hi, integer=True, lo=1)
            if not lo <= workers <= hi:
                raise ElasticTraceError(f"{where}: needs min_workers <= workers <= max_workers, got {lo}, {workers}, {hi}")
        w = _obj(where, "worker", rec["worker"], ("gpus", "cpus", "mem_gb"))
        if w.get("gpus", 1) != 1 or isinstance(w.get("gpus", 1), bool):
            raise ElasticTraceError(f"{where}: worker.gpus must be 1 (one data-parallel worker per GPU), got {w.get('gpus')!r}")
        wc = _num(where, "worker.cpus", w.get("cpus", 0), integer=True)
        wm = float(_num(where, "worker.mem_gb", w.get("mem_gb", 0.0)))
        ps_count, pc, pm = 0, 0, 0.0
        if "ps" in rec:
            if not is_ps:
                raise ElasticTraceError(f"{where}: model {model} is an all-reduce model; it takes no ps")
            ps = _obj(where, "ps", rec["ps"], ("count", "cpus", "mem_gb"))
            ps_count = _num(where, "ps.count", ps.get("count", 1), integer=True, lo=1)
            pc = _num(where, "ps.cpus", ps.get("cpus", 0), integer=True)
            pm = float(_num(where, "ps.mem_gb", ps.get("mem_gb", 0.0)))
        elif is_ps:
            raise ElasticTraceError(f"{where}: model {model} is a parameter-server model; give ps (count, cpus, mem_gb)")
        try:
            demand = ResourceDemand(gpus=workers, cpus_per_gpu=wc, mem_gb_per_gpu=wm, ps=ps_count, ps_cpus=pc,
                                    ps_mem_gb=pm, min_gpus=lo, max_gpus=hi)
        except ResourceError as exc:
            raise ElasticTraceError(f"{where}: {exc}") from None
        out.append(JobSpec(jid, submit, model, int(workers), work, {}, demand))
    return out


# ---------------------------------------------------------------------- generating
def _job(jid: str, t: float, model: str, epochs: float, wc: int, wm: float, pc: int, pm: float) -> dict:
    return {
        "job_id": jid, "submit_time": round(float(t), 3), "model": model, "epochs": round(float(epochs), 3),
        "workers": 1, "min_workers": 1, "max_workers": MAX_WORKERS,
        "worker": {"gpus": 1, "cpus": int(wc), "mem_gb": float(wm)},
        "ps": {"count": 1, "cpus": int(pc), "mem_gb": float(pm)},
    }


def generate(setting: str, seed: int = 0, jobs: int | None = None, rate: float | None = None) -> dict:
    """An elastic trace document for ``setting`` (``chic`` or ``dl2``, module docstring).

    :param jobs: number of jobs (default 30 for chic, 200 for dl2).
    :param rate: chic only: Poisson arrivals per hour (default 1.8).
    """
    if setting not in SETTINGS:
        raise ElasticTraceError(f"setting {setting!r}: expected one of {', '.join(SETTINGS)}")
    rng = np.random.default_rng(seed)
    out: list[dict] = []
    if setting == "chic":
        n = 30 if jobs is None else jobs
        r = 1.8 if rate is None else rate
        if not (isinstance(r, (int, float)) and math.isfinite(r) and r > 0):
            raise ElasticTraceError(f"rate must be a finite number of jobs per hour > 0, got {r!r}")
        t = 0.0
        models = list(CHIC_RESOURCES)
        for k in range(n):
            if k:
                t += rng.exponential(3600.0 / r)
            m = models[int(rng.integers(len(models)))]
            wc, wm, pc, pm = CHIC_RESOURCES[m]
            out.append(_job(f"c{k}", t, m, int(rng.integers(100, 201)), wc, wm, pc, pm))
        meta = {"rate_per_h": r}
    else:
        if rate is not None:
            raise ElasticTraceError("rate applies to the chic setting; dl2 arrivals follow DL2's per-slot pattern")
        n = 200 if jobs is None else jobs
        speed = fit_ps_models()
        offset = int(rng.integers(5))
        s2 = 1.0  # log-normal with sigma 1: over half of the jobs run more than an hour at mean 147 min
        slot, k = 0, 0
        while k < n:
            count = min(DL2_MAX_PER_SLOT, DL2_ARRIVALS[(slot + offset) % len(DL2_ARRIVALS)])
            for _ in range(count):
                if k == n:
                    break
                t = slot * DL2_SLOT_S + float(rng.uniform(0, DL2_SLOT_S))
                m = PS_MODELS[int(rng.integers(len(PS_MODELS)))]
                dur = float(rng.lognormal(math.log(DL2_MEAN_DURATION_S) - s2 / 2, math.sqrt(s2)))
                epochs = max(dur * speed[m].measured_speed(1, 1) / EPOCH_SIZE[m], 1.0)
                wc, pc = int(rng.integers(1, 5)), int(rng.integers(1, 5))
                out.append(_job(f"d{k}", t, m, epochs, wc, 10.0, pc, 10.0))
                k += 1
            slot += 1
        meta = {"slot_s": DL2_SLOT_S, "offset_slots": offset}
    out.sort(key=lambda j: (j["submit_time"], j["job_id"]))
    return {"format": FORMAT, "version": VERSION, "setting": setting, "meta": {"seed": seed, **meta}, "jobs": out}


def write_trace(doc: dict, path: str | Path) -> None:
    """Write an elastic trace document as JSON (after checking it parses)."""
    parse_elastic_trace(doc, str(path))
    Path(path).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


# ---------------------------------------------------------------------- CLI
def register_gen_elastic(tsub: argparse._SubParsersAction) -> None:
    """Add ``rlsched trace gen-elastic``."""
    g = tsub.add_parser(
        "gen-elastic",
        help="elastic job sequences (workers and parameter servers) for the settings of DL2 and Chic",
        description="Write an elastic trace (schema in docs/ELASTIC.md) for the setting of Chic (Poisson "
        "arrivals, ResNet-50 / VGG-16 / ResNeXt-110) or DL2 (200 jobs, DL2's per-slot arrival pattern); with "
        "--seeds N, N of them (seeds SEED..SEED+N-1) into the directory --out, a trace group for rlsched evaluate.",
    )
    g.add_argument("--setting", required=True, choices=SETTINGS, help="chic or dl2")
    g.add_argument("--jobs", type=int, default=None, help="jobs (default 30 for chic, 200 for dl2)")
    g.add_argument("--rate", type=float, default=None, help="chic: arrivals per hour, > 0 (default 1.8)")
    g.add_argument("--seed", type=int, default=0, help="random seed, >= 0 (default 0; with --seeds the first)")
    g.add_argument("--seeds", type=int, default=None,
                   help="write N traces, seeds SEED..SEED+N-1, as OUT/SETTING-SEED.json (OUT a directory, made "
                   "with its parents if missing)")
    g.add_argument("--out", required=True, help="output .json file (with --seeds: a directory)")
    g.add_argument("--overwrite", action="store_true", help="replace existing outputs")
    g.set_defaults(func=_cmd_gen_elastic)


#: most traces ``gen-elastic --seeds`` writes at once
MAX_SEEDS = 10_000


def gen_elastic_dir(out: str | Path, setting: str, seeds: int, seed: int = 0, jobs: int | None = None,
                    rate: float | None = None, overwrite: bool = False) -> list[Path]:
    """Write the ``seeds`` traces of ``setting`` for seeds ``seed .. seed + seeds - 1`` (:func:`generate`) as
    ``out/SETTING-SEED.json`` (``out`` and its parents made if missing); returns their paths. Checks
    everything before writing anything: :class:`ElasticTraceError` when ``out`` or a parent is not a
    directory, a file exists (without ``overwrite``) or an option is out of range."""
    d = Path(out)
    if not 1 <= seeds <= MAX_SEEDS:
        raise ElasticTraceError(f"--seeds must be in 1..{MAX_SEEDS}, got {seeds}")
    if d.suffix.lower() == ".json" or (d.exists() and not d.is_dir()):
        raise ElasticTraceError(f"--out {d}: with --seeds, --out is a directory")
    if not nearest_existing(d).is_dir():
        raise ElasticTraceError(f"--out {d}: {nearest_existing(d)} is not a directory")
    paths = [d / f"{setting}-{s}.json" for s in range(seed, seed + seeds)]
    there = [p for p in paths if p.exists()]
    if there and not overwrite:
        raise ElasticTraceError(f"--out {d}: {there[0].name} exists ({len(there)} of the {seeds} files; use "
                                "--overwrite to replace them)")
    docs = [generate(setting, s, jobs, rate) for s in range(seed, seed + seeds)]
    d.mkdir(parents=True, exist_ok=True)
    for doc, p in zip(docs, paths, strict=True):
        write_trace(doc, p)
    return paths


def _cmd_gen_elastic(args: argparse.Namespace) -> int:
    try:
        if args.jobs is not None and not 1 <= args.jobs <= 100_000:
            raise ElasticTraceError(f"--jobs must be in 1..100000, got {args.jobs}")
        if args.seed < 0:
            raise ElasticTraceError(f"--seed must be >= 0, got {args.seed}")
        out = Path(args.out)
        if args.seeds is not None:
            paths = gen_elastic_dir(out, args.setting, args.seeds, args.seed, args.jobs, args.rate, args.overwrite)
            print(f"wrote {len(paths)} traces ({args.setting}, seeds {args.seed}..{args.seed + args.seeds - 1}) "
                  f"to {out}/")
            return 0
        if out.suffix.lower() != ".json":
            raise ElasticTraceError(f"--out {out}: an elastic trace is a .json file")
        if out.exists() and not args.overwrite:
            raise ElasticTraceError(f"--out {out} exists (use --overwrite to replace it)")
        if not out.parent.is_dir():
            raise ElasticTraceError(f"--out {out}: directory {out.parent} does not exist")
        doc = generate(args.setting, args.seed, args.jobs, args.rate)
        write_trace(doc, out)
    except ElasticTraceError as exc:
        print(f"rlsched trace gen-elastic: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {len(doc['jobs'])} jobs ({args.setting}) to {out}")
    return 0
