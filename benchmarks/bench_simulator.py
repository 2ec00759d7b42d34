#!/usr/bin/env python
"""Simulator benchmark (a script, not a test): CPU time of whole simulations.

(a) 256-job sets on a 4x8 cluster with every heuristic: DeepShare's
    ``data/traces/deepshare/simulate/trace0.json`` and a 256-job set drawn by
    :func:`trainer.generate.generate_jobs` (demands 1..32, powers of two, all
    submitted at t=0 as in DeepShare). Target: < 1 s per run.
(b) The whole Philly trace (82,247 jobs, ``data/philly/philly.csv`` read by
    :func:`trainer.philly.read_philly`) through FIFO on a 1,000-GPU cluster
    (125x8) on one core. Target: < 60 s.

Each case is timed as the CPU time of this process over ``Simulator.run()`` (reset, event loop with
the policy, result records), ``--repeat`` times: median, minimum and maximum are reported (and
the median wall time). CPU time is less sensitive than wall time to other work on the machine.
Building the simulator and loading the trace are timed separately. The process pins itself to one
CPU core and single-threaded BLAS before importing numpy. Each repeat must replay exactly (the
script stops if the JCTs differ).

``--baseline DIR`` compares with the simulator of another checkout (e.g. ``git worktree add
/tmp/base 30061f1``): ``--rounds`` times, one child process times DIR's code (``--code DIR``) and one
this checkout's, in alternating order, with the same cases; the table gives each side's median and
range over all its runs, the ratio of the medians, and the largest relative difference between the
two sides' per-job JCTs.

Usage::

    python benchmarks/bench_simulator.py                         # everything, 5 repeats
    python benchmarks/bench_simulator.py --skip-philly           # only (a)
    python benchmarks/bench_simulator.py --policy fifo:spread --skip-philly --repeat 20
    python benchmarks/bench_simulator.py --policy greedy --jobset generated --skip-philly   # one case
    python benchmarks/bench_simulator.py --baseline /tmp/base --rounds 5 --repeat 3 --json cmp.json
    python benchmarks/bench_simulator.py --json out.json --check  # exit 1 if a target is missed
    python benchmarks/bench_simulator.py --contention link        # another contention rule
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import simbench  # noqa: E402  (single-threaded BLAS before numpy)

import argparse  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from typing import NamedTuple  # noqa: E402

HEURISTICS = (
    "fifo", "sjf", "srtf", "las", "greedy",
    "fifo:spread", "sjf:spread", "srtf:spread", "las:spread", "greedy:spread",
)
#: The 256-job sets by ``--jobset`` name.
JOBSETS = ("deepshare", "generated")
JOBSET_TARGET_S = 1.0
PHILLY_TARGET_S = 60.0


class Row(NamedTuple):
    """One case: per-run CPU and wall seconds of ``Simulator.run`` and what the run gave."""

    jobset: str
    cluster: str
    policy: str
    jobs: int
    build_s: float
    cpu_s: list[float]
    wall_s: list[float]
    rounds: int
    preemptions: int
    mean_jct_h: float
    makespan_h: float
    target_s: float
    jcts: list[float]  # per job, in arrival order (s)

    @property
    def key(self) -> tuple[str, str]:
        return (self.jobset, self.policy)

    @property
    def cpu(self) -> dict[str, float]:
        return simbench.spread(self.cpu_s)

    @property
    def ok(self) -> bool:
        return self.cpu["median"] < self.target_s


def bench(jobset: str, cluster, jobs, policy: str, perf, repeat: int, target: float) -> Row:
    """Time ``policy`` over ``jobs`` ``repeat`` times (see the module docstring)."""
    import numpy as np

    from policies.heuristics import make_heuristic
    from trainer.simulator import Simulator

    sim, build, _ = simbench.timed(lambda: Simulator(cluster, jobs, make_heuristic(policy, perf), perf))
    cpus: list[float] = []
    walls: list[float] = []
    res = None
    first: bytes | None = None
    for _ in range(repeat):
        res, wall, cpu = simbench.timed(sim.run)
        walls.append(wall)
        cpus.append(cpu)
        jct = np.array([r.jct for r in res.jobs], dtype=np.float64)
        if first is None:
            first = jct.tobytes()
        elif jct.tobytes() != first:  # run() resets: repeats must replay exactly
            raise SystemExit(f"{jobset}/{policy}: repeated run differs (non-deterministic simulator)")
    assert res is not None and first is not None
    if not np.isfinite(jct).all():
        raise SystemExit(f"{jobset}/{policy}: some jobs did not finish")
    return Row(jobset=jobset, cluster=cluster.describe(), policy=policy, jobs=len(jobs), build_s=build,
               cpu_s=cpus, wall_s=walls, rounds=res.rounds, preemptions=res.preemptions,
               mean_jct_h=float(jct.mean()) / 3600.0, makespan_h=res.makespan / 3600.0,
               target_s=target, jcts=jct.tolist())


def _perf(cluster, contention: str):
    from policies.perf import ContentionModel

    # a checkout from before the contention rules takes no contention argument (its rule is "sum")
    return ContentionModel(cluster) if contention == "sum" else ContentionModel(cluster, contention=contention)


def run_cases(args: argparse.Namespace, say) -> tuple[list[Row], dict[str, float]]:
    """Every case of ``args`` in this process; ``say`` prints progress."""
    from policies.cluster import ClusterSpec

    rows: list[Row] = []
    loads: dict[str, float] = {}
    if not args.skip_jobsets:
        from trainer.generate import GeneratorConfig, generate_jobs
        from trainer.traces import load_trace

        c48 = ClusterSpec.parse("4x8")
        perf = _perf(c48, args.contention)
        sets = []
        if "deepshare" in args.jobsets:
            jobs, loads["deepshare"], _ = simbench.timed(lambda: load_trace(args.deepshare, c48))
            sets.append(("deepshare trace0", jobs))
        if "generated" in args.jobsets:
            cfg = GeneratorConfig(num_jobs=256, max_gpus=32, seed=0)
            jobs, loads["generated"], _ = simbench.timed(lambda: generate_jobs(c48, cfg, perf))
            sets.append(("generated 256, <=32 GPUs", jobs))
        for name, jobs in sets:
            for pol in args.policies:
                row = bench(name, c48, jobs, pol, perf, args.repeat, JOBSET_TARGET_S)
                rows.append(row)
                say(f"  {name:26s} {pol:14s} CPU median {row.cpu['median']:7.4f} s")
    if not args.skip_philly:
        from trainer.philly import read_philly

        c1000 = ClusterSpec.parse("125x8")
        perf = _perf(c1000, args.contention)
        jobs, loads["philly"], _ = simbench.timed(lambda: read_philly(args.philly, c1000, seed=0, perf=perf))
        row = bench("philly (all)", c1000, jobs, "fifo", perf, args.philly_repeat, PHILLY_TARGET_S)
        rows.append(row)
        say(f"  philly fifo CPU median {row.cpu['median']:7.2f} s")
    return rows, loads


def _child(args: argparse.Namespace, code: Path | None) -> list[Row]:
    """Run the cases in a fresh process (``code``: another checkout's simulator)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.json"
        cmd = [sys.executable, __file__, "--repeat", str(args.repeat), "--philly-repeat", str(args.philly_repeat),
               "--policy", ",".join(args.policies), "--jobset", ",".join(args.jobsets), "--contention", args.contention,
               "--deepshare", str(args.deepshare),
               "--philly", str(args.philly), "--row-json", str(out), "--quiet"]
        cmd += ["--skip-philly"] if args.skip_philly else []
        cmd += ["--skip-jobsets"] if args.skip_jobsets else []
        cmd += ["--code", str(code)] if code is not None else []
        subprocess.run(cmd, check=True)
        return [Row(**d) for d in json.loads(out.read_text())]


def _compare(args: argparse.Namespace, console, pin: str) -> int:
    import numpy as np
    from rich.table import Table

    base_dir = Path(args.baseline).resolve()
    pooled: dict[str, dict[tuple[str, str], list[Row]]] = {"baseline": {}, "this": {}}
    for r in range(args.rounds):
        order = [("baseline", base_dir), ("this", None)]
        if r % 2:
            order.reverse()
        for side, code in order:
            console.print(f"round {r + 1}/{args.rounds}: {side}")
            for row in _child(args, code):
                pooled[side].setdefault(row.key, []).append(row)
    table = Table(title=f"CPU s of Simulator.run: {base_dir} (baseline) vs this checkout, {args.rounds} alternating "
                        f"rounds x {args.repeat} runs (philly: x {args.philly_repeat})")
    for col in ("job set", "policy", "baseline median", "baseline min-max", "this median", "this min-max", "ratio",
                "JCT rel. diff"):
        table.add_column(col, justify="left" if col in ("job set", "policy") else "right")
    out = []
    for key, brows in pooled["baseline"].items():
        trows = pooled["this"][key]
        b = simbench.spread([x for r in brows for x in r.cpu_s])
        t = simbench.spread([x for r in trows for x in r.cpu_s])
        ja, jb = np.array(brows[0].jcts), np.array(trows[0].jcts)
        diff = float(np.max(np.abs(ja - jb) / ja)) if ja.shape == jb.shape else float("inf")
        ratio = t["median"] / b["median"]
        out.append({"jobset": key[0], "policy": key[1], "baseline": b, "this": t, "ratio": ratio, "jct_rel_diff": diff})
        table.add_row(key[0], key[1], f"{b['median']:.4f}", f"{b['min']:.4f}-{b['max']:.4f}", f"{t['median']:.4f}",
                      f"{t['min']:.4f}-{t['max']:.4f}", f"{ratio:.2f}", f"{diff:.1g}" if diff <= 1e-9 else f"[red]{diff:.1g}[/]")
    console.print(table)
    if args.json:
        args.json.write_text(json.dumps({"machine": simbench.machine(pin), "baseline": str(base_dir), "rounds": args.rounds,
                                         "repeat": args.repeat, "philly_repeat": args.philly_repeat, "cases": out}, indent=2))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    root = simbench.ROOT
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5, help="runs per case (default %(default)s)")
    ap.add_argument("--philly-repeat", type=int, default=1, help="runs of the Philly case (default %(default)s)")
    ap.add_argument("--skip-philly", action="store_true", help="only the 256-job sets")
    ap.add_argument("--skip-jobsets", action="store_true", help="only Philly")
    ap.add_argument("--policy", default=",".join(HEURISTICS), help="comma-separated heuristics of the 256-job sets (default: all ten)")
    ap.add_argument("--jobset", default=",".join(JOBSETS),
                    help="comma-separated 256-job sets: deepshare, generated (default: both)")
    ap.add_argument("--deepshare", type=Path, default=root / "data/traces/deepshare/simulate/trace0.json")
    ap.add_argument("--philly", type=Path, default=root / "data/philly/philly.csv")
    ap.add_argument("--json", type=Path, help="also write the rows (or the comparison) as JSON here")
    ap.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    ap.add_argument("--contention", choices=("sum", "link", "ds-min"), default="sum",
                    help="the performance model's contention rule (default: %(default)s)")
    ap.add_argument("--code", type=Path, help="time the simulator of this checkout instead of this repository's")
    ap.add_argument("--baseline", type=Path, help="compare with the simulator of this checkout (see above)")
    ap.add_argument("--rounds", type=int, default=5, help="with --baseline: alternating rounds (default %(default)s)")
    ap.add_argument("--row-json", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--quiet", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.repeat < 1 or args.philly_repeat < 1 or args.rounds < 1:
        ap.error("--repeat, --philly-repeat and --rounds must be >= 1")
    args.policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    args.jobsets = [s.strip() for s in args.jobset.split(",") if s.strip()]
    bad = [s for s in args.jobsets if s not in JOBSETS]
    if bad or not args.jobsets:
        ap.error(f"--jobset {args.jobset!r}: choose from {', '.join(JOBSETS)}")
    if not args.policies and not args.skip_jobsets:
        ap.error("--policy names no policy")
    if args.code is not None and args.baseline is not None:
        ap.error("--code and --baseline exclude each other")
    if args.code is not None:
        simbench.use_code(args.code)

    from rich.console import Console

    console = Console(width=max(Console().width, 150), quiet=args.quiet)
    pin = simbench.pin_one_core()
    m = simbench.machine(pin)
    console.print(simbench.machine_line("rlsched simulator benchmark", m))
    if args.baseline is not None:
        return _compare(args, console, pin)
    rows, loads = run_cases(args, console.print)
    if args.row_json:
        args.row_json.write_text(json.dumps([r._asdict() for r in rows]))
    if args.quiet:
        return 0
    from rich.table import Table

    table = Table(title="Simulator.run, CPU seconds on one core (median and range of the repeats)")
    for col in ("job set", "cluster", "policy", "jobs", "build s", "CPU median s", "CPU min-max s", "wall median s",
                "target", "rounds", "preempt", "mean JCT h", "makespan h"):
        table.add_column(col, justify="left" if col in ("job set", "cluster", "policy") else "right")
    for r in rows:
        c = r.cpu
        mark = "[green]ok[/]" if r.ok else "[red]MISSED[/]"
        table.add_row(r.jobset, r.cluster, r.policy, str(r.jobs), f"{r.build_s:.3f}", f"{c['median']:.4f}",
                      f"{c['min']:.4f}-{c['max']:.4f}", f"{simbench.spread(r.wall_s)['median']:.4f}",
                      f"< {r.target_s:g} s {mark}", str(r.rounds), str(r.preemptions), f"{r.mean_jct_h:.2f}", f"{r.makespan_h:.1f}")
    console.print(table)
    console.print("trace load / generation: " + ", ".join(f"{k} {v:.2f} s" for k, v in loads.items()))
    if args.json:
        doc = [{k: v for k, v in r._asdict().items() if k != "jcts"} | {"cpu": r.cpu, "ok": r.ok} for r in rows]
        args.json.write_text(json.dumps({"machine": m, "loads_s": loads, "rows": doc}, indent=2))
    missed = [r for r in rows if not r.ok]
    if missed:
        console.print(f"[red]{len(missed)} case(s) missed the target[/]")
    return 1 if (args.check and missed) else 0


if __name__ == "__main__":
    raise SystemExit(main())
