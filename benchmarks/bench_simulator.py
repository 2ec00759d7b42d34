#!/usr/bin/env python
"""Simulator benchmark (a script, not a test).

(a) 256-job sets on a 4x8 cluster with every heuristic: DeepShare's
    ``data/traces/deepshare/simulate/trace0.json`` and a 256-job set drawn by
    :func:`trainer.generate.generate_jobs` (demands 1..32, powers of two, all
    submitted at t=0 as in DeepShare). Target: < 1 s per run.
(b) The whole Philly trace (82,247 jobs, ``data/philly/philly.csv`` read by
    :func:`trainer.philly.read_philly`) through FIFO on a 1,000-GPU cluster
    (125x8) on one core. Target: < 60 s.

Times are wall-clock seconds of ``Simulator.run()`` (reset + event loop +
result), best and median of ``--repeat`` runs; building the simulator and
loading the trace are timed separately. The process pins itself to one CPU
core and single-threaded BLAS before importing numpy.

Usage::

    python benchmarks/bench_simulator.py                 # everything, 3 repeats
    python benchmarks/bench_simulator.py --skip-philly   # only (a)
    python benchmarks/bench_simulator.py --json out.json --check
    python benchmarks/bench_simulator.py --contention link   # another contention rule

``--check`` exits 1 when a target is missed.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np
from rich.console import Console
from rich.table import Table

from policies.cluster import ClusterSpec
from policies.heuristics import make_heuristic
from policies.job import JobSpec
from policies.perf import ContentionModel
from trainer.simulator import SimConfig, SimResult, Simulator

HEURISTICS = (
    "fifo", "sjf", "srtf", "las", "greedy",
    "fifo:spread", "sjf:spread", "srtf:spread", "las:spread", "greedy:spread",
)
JOBSET_TARGET_S = 1.0
PHILLY_TARGET_S = 60.0


@dataclass
class Row:
    """One benchmark line."""

    jobset: str
    cluster: str
    policy: str
    jobs: int
    build_s: float
    best_s: float
    median_s: float
    rounds: int
    preemptions: int
    mean_jct_h: float
    makespan_h: float
    target_s: float

    @property
    def ok(self) -> bool:
        return self.best_s < self.target_s


def _pin_one_core() -> str:
    """Pin this process to one CPU (Linux); returns a description."""
    try:
        cpu = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpu})
        return f"pinned to CPU {cpu}"
    except (AttributeError, OSError):
        return "not pinned (no sched_setaffinity)"


def bench(
    jobset: str,
    cluster: ClusterSpec,
    jobs: Sequence[JobSpec],
    policy: str,
    perf: ContentionModel,
    repeat: int,
    target: float,
    config: SimConfig | None = None,
) -> Row:
    t0 = time.perf_counter()
    sim = Simulator(cluster, jobs, make_heuristic(policy, perf), perf, config)
    build = time.perf_counter() - t0
    walls: list[float] = []
    res: SimResult | None = None
    first_jcts: list[float] | None = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        res = sim.run()
        walls.append(time.perf_counter() - t0)
        jcts = [r.jct for r in res.jobs]
        if first_jcts is None:
            first_jcts = jcts
        elif jcts != first_jcts:  # run() resets: repeats must replay exactly
            raise SystemExit(f"{jobset}/{policy}: repeated run differs (non-deterministic simulator)")
    assert res is not None
    jct = np.array([r.jct for r in res.jobs])
    if not np.isfinite(jct).all():
        raise SystemExit(f"{jobset}/{policy}: some jobs did not finish")
    return Row(
        jobset=jobset,
        cluster=cluster.describe(),
        policy=policy,
        jobs=len(jobs),
        build_s=build,
        best_s=min(walls),
        median_s=statistics.median(walls),
        rounds=res.rounds,
        preemptions=res.preemptions,
        mean_jct_h=float(jct.mean()) / 3600.0,
        makespan_h=res.makespan / 3600.0,
        target_s=target,
    )


def _timed(label: str, fn: Callable[[], list[JobSpec]], console: Console) -> tuple[list[JobSpec], float]:
    t0 = time.perf_counter()
    jobs = fn()
    dt = time.perf_counter() - t0
    console.print(f"loaded {label}: {len(jobs)} jobs in {dt:.2f} s")
    return jobs, dt


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3, help="runs per case (best and median reported)")
    ap.add_argument("--philly-repeat", type=int, default=1, help="runs of the Philly case")
    ap.add_argument("--skip-philly", action="store_true", help="only the 256-job sets")
    ap.add_argument("--skip-jobsets", action="store_true", help="only Philly")
    ap.add_argument("--deepshare", type=Path, default=ROOT / "data/traces/deepshare/simulate/trace0.json")
    ap.add_argument("--philly", type=Path, default=ROOT / "data/philly/philly.csv")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON here")
    ap.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    ap.add_argument("--contention", choices=("sum", "link", "ds-min"), default="sum",
                    help="the performance model's contention rule (default: %(default)s)")
    args = ap.parse_args(argv)
    if args.repeat < 1 or args.philly_repeat < 1:
        ap.error("--repeat and --philly-repeat must be >= 1")

    console = Console(width=max(Console().width, 150))
    pin = _pin_one_core()
    console.print(
        f"[bold]rlsched simulator benchmark[/] - {platform.processor() or platform.machine()}, "
        f"Python {platform.python_version()}, numpy {np.__version__}, {pin}"
    )
    rows: list[Row] = []
    loads: dict[str, float] = {}

    if not args.skip_jobsets:
        from trainer.traces import load_trace

        c48 = ClusterSpec.parse("4x8")
        perf = ContentionModel(c48, contention=args.contention)
        sets: list[tuple[str, list[JobSpec]]] = []
        jobs, loads["deepshare"] = _timed(args.deepshare.name, lambda: load_trace(args.deepshare, c48), console)
        sets.append(("deepshare trace0", jobs))
        try:
            from trainer.generate import GeneratorConfig, generate_jobs
        except ImportError:  # trainer/generate.py is written by another engineer
            console.print("[yellow]trainer.generate not available: skipping the generated job set[/]")
        else:
            cfg = GeneratorConfig(num_jobs=256, max_gpus=32, seed=0)
            jobs, loads["generated"] = _timed("generated 256 (<= 32 GPUs)", lambda: generate_jobs(c48, cfg, perf), console)
            sets.append(("generated 256, <=32 GPUs", jobs))
        for name, jobs in sets:
            for pol in HEURISTICS:
                row = bench(name, c48, jobs, pol, perf, args.repeat, JOBSET_TARGET_S)
                rows.append(row)
                console.print(f"  {name:26s} {pol:14s} {row.best_s:7.3f} s")

    if not args.skip_philly:
        c1000 = ClusterSpec.parse("125x8")
        perf = ContentionModel(c1000, contention=args.contention)
        try:
            from trainer.philly import read_philly
        except ImportError:  # written by another engineer; fall back to a minimal reader
            read_philly = None
        if read_philly is not None:
            jobs, loads["philly"] = _timed("philly.csv", lambda: read_philly(args.philly, c1000, seed=0, perf=perf), console)
        else:
            jobs, loads["philly"] = _timed("philly.csv (minimal reader)", lambda: _minimal_philly(args.philly, perf), console)
        row = bench("philly (all)", c1000, jobs, "fifo", perf, args.philly_repeat, PHILLY_TARGET_S)
        rows.append(row)
        console.print(f"  philly fifo {row.best_s:7.2f} s")

    table = Table(title="Simulator wall time (Simulator.run, one core)")
    for col, just in (
        ("job set", "left"), ("cluster", "left"), ("policy", "left"), ("jobs", "right"), ("build s", "right"),
        ("best s", "right"), ("median s", "right"), ("target", "right"), ("rounds", "right"),
        ("preempt", "right"), ("mean JCT h", "right"), ("makespan h", "right"),
    ):
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    for r in rows:
        mark = "[green]ok[/]" if r.ok else "[red]MISSED[/]"
        table.add_row(
            r.jobset, r.cluster, r.policy, str(r.jobs), f"{r.build_s:.3f}", f"{r.best_s:.3f}", f"{r.median_s:.3f}",
            f"< {r.target_s:g} s {mark}", str(r.rounds), str(r.preemptions), f"{r.mean_jct_h:.2f}", f"{r.makespan_h:.1f}",
        )
    console.print(table)
    if loads:
        console.print("trace load / generation: " + ", ".join(f"{k} {v:.2f} s" for k, v in loads.items()))
    if args.json:
        doc = {
            "machine": {"cpu": platform.processor() or platform.machine(), "python": platform.python_version(),
                        "numpy": np.__version__, "pinning": pin},
            "loads_s": loads,
            "rows": [asdict(r) | {"ok": r.ok} for r in rows],
        }
        args.json.write_text(json.dumps(doc, indent=2))
    missed = [r for r in rows if not r.ok]
    if missed:
        console.print(f"[red]{len(missed)} case(s) missed the target[/]")
    return 1 if (args.check and missed) else 0


def _minimal_philly(path: Path, perf: ContentionModel) -> list[JobSpec]:
    """Fallback reader: models round-robin over the six, work = duration x best throughput."""
    import csv
    from datetime import datetime

    from policies.workloads import MODELS

    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    ts = [datetime.fromisoformat(r["timestamp"]).timestamp() for r in rows]
    t0 = min(ts)
    cap = perf.cluster.total_gpus
    jobs = []
    for i, (r, t) in enumerate(zip(rows, ts)):
        m, g = MODELS[i % len(MODELS)], min(int(r["num_gpus"]), cap)
        jobs.append(JobSpec(str(i), t - t0, m, g, float(r["duration"]) * perf.best_isolated_throughput(m, g)))
    jobs.sort(key=lambda j: j.submit_time)
    return jobs


if __name__ == "__main__":
    raise SystemExit(main())
