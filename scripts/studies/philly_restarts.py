"""Restarts after preemption on the whole Philly trace: preemptive heuristics with and without moves.

Run: ``nice -n 10 python scripts/studies/philly_restarts.py [--limit N] [--policies fifo,las,...]
[--json FILE]`` (the whole trace, 82,247 jobs on 125x8: about 10 min of CPU for the default
policies).

A policy name ending in ``/stay`` runs the heuristic with ``consolidate=False``: a job keeps the
placement it started on until it ends or is preempted (``las/stay``). Every run reads the trace
with :func:`trainer.philly.read_philly` (seed 0, models drawn 1:1:1:1:1:1) and simulates it with the
default :class:`~trainer.simulator.SimConfig` (rounds of 300 s, 30 s restart overhead).

Per policy it prints: makespan and mean JCT (h); the jobs whose last placement spans more nodes
than their demand needs (``ceil(G / 8)``), and how many of those need no more than one node
(``G <= 8``); preemptions (moves included) and moves; the largest and mean run-time slowdown (run
time over the isolated time on the best shape); the mean CS over the jobs. The moves are counted
by watching the policy's decisions (a placement of a job that was running when the round began).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from policies.cluster import ClusterSpec  # noqa: E402
from policies.heuristics import make_heuristic  # noqa: E402
from policies.perf import ContentionModel  # noqa: E402
from trainer.philly import read_philly  # noqa: E402
from trainer.simulator import Simulator  # noqa: E402

POLICIES = ["fifo", "las", "las/stay", "srtf", "srtf/stay"]


class _Counting:
    """Wraps a heuristic: counts its moves (placements of jobs running when the round began)."""

    def __init__(self, pol) -> None:
        self.pol, self.n_moves = pol, 0

    def __getattr__(self, name):
        return getattr(self.pol, name)

    def schedule(self, state):
        dec = self.pol.schedule(state)
        if dec.preempt and dec.place:
            gone = set(dec.preempt)
            self.n_moves += sum(1 for jid, _p in dec.place if jid in gone)
        return dec


def run(cluster: ClusterSpec, perf: ContentionModel, jobs, name: str) -> dict:
    base, _, mode = name.partition("/")
    pol = make_heuristic(base, perf)
    if mode == "stay":
        pol.consolidate = False
    elif mode:
        raise SystemExit(f"policy {name!r}: only the suffix /stay is known")
    counting = _Counting(pol)
    t0 = time.process_time()
    res = Simulator(cluster, jobs, counting, perf).run()  # type: ignore[arg-type]
    cpu = time.process_time() - t0
    per_node = max(cluster.gpus_per_node)
    spread = [r for r in res.jobs if r.num_nodes > -(-r.gpu_demand // per_node)]
    slow = np.array([r.run_time / r.ideal_time for r in res.jobs])
    return {
        "makespan_h": res.makespan / 3600.0,
        "mean_jct_h": float(np.mean([r.jct for r in res.jobs])) / 3600.0,
        "spread_jobs": len(spread),
        "spread_jobs_fit_one_node": sum(1 for r in spread if r.gpu_demand <= per_node),
        "multi_node_jobs": sum(1 for r in res.jobs if r.num_nodes > 1),
        "preemptions": res.preemptions,
        "moves": counting.n_moves,
        "max_run_slowdown": float(slow.max()),
        "mean_run_slowdown": float(slow.mean()),
        "mean_cs": float(np.mean([r.avg_cs for r in res.jobs])),
        "cpu_s": cpu,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=None, help="only the first N jobs (default: all)")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    cluster = ClusterSpec.parse("125x8")
    perf = ContentionModel(cluster)
    jobs = read_philly(REPO / "data" / "philly" / "philly.csv", cluster, seed=0, perf=perf, limit=args.limit)
    out = {}
    print(f"Philly, {len(jobs)} jobs on 125x8")
    print("| policy | makespan (h) | mean JCT (h) | jobs spread | of them G <= 8 | multi-node jobs | "
          "preemptions (moves) | run slowdown max / mean | mean CS |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in [p.strip() for p in args.policies.split(",") if p.strip()]:
        r = out[name] = run(cluster, perf, jobs, name)
        print(f"| {name} | {r['makespan_h']:.1f} | {r['mean_jct_h']:.2f} | {r['spread_jobs']:,} | "
              f"{r['spread_jobs_fit_one_node']:,} | {r['multi_node_jobs']:,} | {r['preemptions']:,} ({r['moves']:,}) | "
              f"{r['max_run_slowdown']:.2f} / {r['mean_run_slowdown']:.3f} | {r['mean_cs']:.3f} |", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"jobs": len(jobs), "results": out}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
