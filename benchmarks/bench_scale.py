#!/usr/bin/env python
"""Simulator scale benchmark: a generated trace of up to 1,000,000 jobs on a large cluster.

The trace is drawn in memory by :func:`trainer.generate.generate_jobs` (the project's
generator; nothing is written): Poisson arrivals at ``--load`` of the cluster's GPUs, the
default model mix and GPU demands (powers of two up to 32), one hour alone each. Each policy
runs in its own process, pinned to one CPU core with single-threaded BLAS, so that its peak
resident memory is its own.

For each policy it prints: the simulator build time (checking the trace, one record per job)
and the run time (``Simulator.run``: the event loop and the results), each as wall-clock and as
CPU time of the process (the process is pinned to one core, so CPU time is its time on that core,
and it is much less sensitive to other load on the machine than wall time), jobs per CPU second of
run time, the peak resident set size of its process (MiB), rounds, preemptions and the mean JCT.
Targets (issue 29, at the default 1,000,000 jobs on 8192x8, on one core): FIFO in under 60 s and
the contention-aware heuristic (``greedy``) in under 5 minutes, build plus run, judged on CPU time.

Usage::

    python benchmarks/bench_scale.py                                  # 1M jobs, 8192x8, fifo and greedy
    python benchmarks/bench_scale.py --jobs 20000 --policy greedy     # a smaller run
    python benchmarks/bench_scale.py --jobs 300 --cluster 16x8 --check-invariants   # a smoke run
    python benchmarks/bench_scale.py --json out.json --check          # exit 1 if a target is missed

``--code DIR`` times the simulator of another checkout (e.g. a ``git worktree`` of an older commit)
with the same trace and clock. ``--profile FILE`` writes a cProfile of the run (one policy only). ``Simulator.run`` itself keeps
the objects that exist when it starts (the trace, the per-job records) out of Python's cyclic
garbage collector for traces of ``trainer.simulator.GC_FREEZE_MIN_JOBS`` jobs or more; ``--gc-freeze``
also calls ``gc.freeze()`` right after building the simulator (what ``rlsched simulate`` does not do),
which changes only the collector's passes between the build and the run.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import simbench  # noqa: E402  (single-threaded BLAS before numpy)

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from typing import NamedTuple  # noqa: E402

import numpy as np  # noqa: E402

#: Targets in seconds (build + run) at the issue's scale, by policy.
TARGETS_S = {"fifo": 60.0, "greedy": 300.0}
TARGET_JOBS = 1_000_000
TARGET_CLUSTER = "8192x8"


class Row(NamedTuple):
    """One policy's run (times in s)."""

    policy: str
    jobs: int
    cluster: str
    load: float
    generate_s: float
    build_s: float
    build_cpu_s: float
    run_s: float
    run_cpu_s: float
    jobs_per_s: float
    peak_rss_mib: float
    rounds: int
    preemptions: int
    mean_jct_h: float
    makespan_h: float
    target_s: float | None

    @property
    def total_s(self) -> float:
        return self.build_s + self.run_s

    @property
    def total_cpu_s(self) -> float:
        return self.build_cpu_s + self.run_cpu_s

    @property
    def ok(self) -> bool | None:
        return None if self.target_s is None else self.total_cpu_s < self.target_s


def _peak_rss_mib() -> float:
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return kib / 1024.0 if sys.platform != "darwin" else kib / 2**20


def run_one(args: argparse.Namespace, policy: str) -> Row:
    """Generate the trace and run ``policy`` over it in this process."""
    from policies.cluster import ClusterSpec
    from policies.heuristics import make_heuristic
    from policies.perf import ContentionModel
    from trainer.generate import GeneratorConfig, generate_jobs
    from trainer.simulator import SimConfig, Simulator

    cluster = ClusterSpec.parse(args.cluster)
    perf = ContentionModel(cluster)
    cfg = GeneratorConfig(num_jobs=args.jobs, arrival="poisson", load=args.load, seed=args.seed, mix=args.mix)
    t0 = time.perf_counter()
    jobs = generate_jobs(cluster, cfg, perf)
    gen = time.perf_counter() - t0
    policy_obj = make_heuristic(policy, perf)
    sim, build, build_cpu = simbench.timed(
        lambda: Simulator(cluster, jobs, policy_obj, perf, SimConfig(check_invariants=args.check_invariants)))
    del jobs
    if args.gc_freeze:
        gc.freeze()  # the trace and the simulator's per-job records: never scanned by the cyclic collector
    prof = None
    if args.profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    res, run, run_cpu = simbench.timed(sim.run)
    if prof is not None:
        prof.disable()
        prof.dump_stats(args.profile)
    jct = np.fromiter((r.jct for r in res.jobs), float, len(res.jobs))
    if not np.isfinite(jct).all():
        raise SystemExit(f"{policy}: some jobs did not finish")
    at_scale = args.jobs == TARGET_JOBS and cluster.describe() == TARGET_CLUSTER
    return Row(
        policy=policy,
        jobs=args.jobs,
        cluster=cluster.describe(),
        load=args.load,
        generate_s=gen,
        build_s=build,
        build_cpu_s=build_cpu,
        run_s=run,
        run_cpu_s=run_cpu,
        jobs_per_s=args.jobs / run_cpu,
        peak_rss_mib=_peak_rss_mib(),
        rounds=res.rounds,
        preemptions=res.preemptions,
        mean_jct_h=float(jct.mean()) / 3600.0,
        makespan_h=res.makespan / 3600.0,
        target_s=TARGETS_S.get(policy) if at_scale else None,
    )


def _child(args: argparse.Namespace, policy: str) -> Row:
    """Run one policy in a fresh process (its own peak RSS)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "row.json"
        cmd = [sys.executable, __file__, "--jobs", str(args.jobs), "--cluster", args.cluster, "--load", str(args.load),
               "--seed", str(args.seed), "--mix", args.mix, "--policy", policy, "--row-json", str(out), "--quiet"]
        if args.check_invariants:
            cmd.append("--check-invariants")
        if args.gc_freeze:
            cmd.append("--gc-freeze")
        if args.code is not None:
            cmd += ["--code", str(args.code)]
        subprocess.run(cmd, check=True)
        d = json.loads(out.read_text())
    d.pop("ok", None)
    d.pop("total_s", None)
    d.pop("total_cpu_s", None)
    return Row(**d)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=TARGET_JOBS, help="jobs in the generated trace (default 1,000,000)")
    ap.add_argument("--cluster", default=TARGET_CLUSTER, help="NODESxGPUS or a cluster file (default 8192x8)")
    ap.add_argument("--policy", default="fifo,greedy", help="comma-separated heuristics (default fifo,greedy)")
    ap.add_argument("--load", type=float, default=0.85, help="offered load of the Poisson arrivals (default 0.85)")
    ap.add_argument("--mix", default="normal", help="model mix (default normal)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check-invariants", action="store_true", help="check the simulator's invariants after every event (slow)")
    ap.add_argument("--gc-freeze", action="store_true",
                    help="gc.freeze() after building the simulator (the cyclic collector then skips the per-job records)")
    ap.add_argument("--profile", type=Path, help="write a cProfile of the run here (one policy)")
    ap.add_argument("--json", type=Path, help="also write the rows and the machine as JSON here")
    ap.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    ap.add_argument("--no-pin", action="store_true", help="do not pin to one CPU core")
    ap.add_argument("--code", type=Path, help="time the simulator of this checkout instead of this repository's")
    ap.add_argument("--row-json", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--quiet", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    if args.jobs < 1:
        ap.error(f"--jobs must be >= 1, got {args.jobs}")
    if not policies:
        ap.error("--policy names no policy")
    if args.profile and len(policies) > 1:
        ap.error("--profile takes one policy")
    if args.code is not None:
        simbench.use_code(args.code)
    pin = "not pinned" if args.no_pin else simbench.pin_one_core()

    if len(policies) == 1:
        rows = [run_one(args, policies[0])]
    else:
        rows = [_child(args, p) for p in policies]
    if args.row_json:
        args.row_json.write_text(json.dumps(rows[0]._asdict()))
    if args.quiet:
        return 0

    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(Console().width, 140))
    m = simbench.machine(pin)
    console.print(simbench.machine_line("rlsched simulator scale benchmark", m))
    table = Table(title=f"{rows[0].jobs:,} jobs on {rows[0].cluster}, Poisson arrivals at load {rows[0].load:g}"
                  + (", gc.freeze() after the build" if args.gc_freeze else ""))
    for col in ("policy", "generate s", "build s", "build CPU s", "run s", "run CPU s", "total CPU s", "jobs/s",
                "peak RSS MiB", "rounds", "preempt",
                "mean JCT h", "makespan h", "target"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for r in rows:
        mark = "" if r.ok is None else ("[green]ok[/]" if r.ok else "[red]MISSED[/]")
        table.add_row(
            r.policy, f"{r.generate_s:.1f}", f"{r.build_s:.1f}", f"{r.build_cpu_s:.1f}", f"{r.run_s:.1f}",
            f"{r.run_cpu_s:.1f}", f"{r.total_cpu_s:.1f}", f"{r.jobs_per_s:,.0f}",
            f"{r.peak_rss_mib:,.0f}", f"{r.rounds:,}", f"{r.preemptions:,}", f"{r.mean_jct_h:.3f}", f"{r.makespan_h:.1f}",
            "-" if r.target_s is None else f"< {r.target_s:g} s {mark}",
        )
    console.print(table)
    if args.json:
        doc = {
            "machine": m,
            "code": str(args.code) if args.code is not None else None,
            "gc_freeze": args.gc_freeze,
            "rows": [r._asdict() | {"total_s": r.total_s, "total_cpu_s": r.total_cpu_s, "ok": r.ok} for r in rows],
        }
        args.json.write_text(json.dumps(doc, indent=2))
    missed = [r for r in rows if r.ok is False]
    if missed:
        console.print(f"[red]{len(missed)} target(s) missed[/]")
    return 1 if (args.check and missed) else 0


if __name__ == "__main__":
    raise SystemExit(main())
