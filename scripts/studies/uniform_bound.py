"""How far can any non-preemptive schedule go on zero-arrival job sets of 1-hour jobs?

Run: ``python scripts/studies/uniform_bound.py --traces /tmp/rl/traces/eval/uniform [--time-limit 90]
[--cluster 4x8] [--json OUT]``. Every file in ``--traces`` is one job set (the trace formats of
``rlsched trace``); every job must run for the same isolated time (the seed's setting, 1 h).

The abstract model: the cluster is one pool of its ``C`` GPUs (no node granularity, no
contention, no restart cost), and a job needs its demand for exactly one time unit. Any
non-preemptive schedule of the simulator maps onto it with completion times no later (round
every start down to a whole hour: the jobs that started within one hour all run together just
before its end, so they fit together), so the model's optimum is a **lower bound on the average
JCT of every non-preemptive policy** on the simulated cluster, RL included.

For each set it prints, in hours:

* ``fifo``: first fit in trace order, one 1-hour bin after the other;
* ``fill``: the ``"fill"`` candidate order's rule (:meth:`policies.orders.CandidateOrder.fill_order`)
  in the same bins: smallest first while a job of at most ``FILL_SMALL x C`` GPUs waits, then the
  first job of more than ``C / 2`` GPUs followed by the largest jobs that fill its gap;
* ``best`` and ``bound``: the best schedule HiGHS finds (``scipy.optimize.milp``) for
  ``min sum(completion)`` with integer counts ``x[d, t]`` of demand-``d`` jobs in hour ``t``
  (``sum_d d x[d, t] <= C``; every job placed), and its proven lower bound (the dual bound at the
  time limit).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import lil_matrix

from policies.cluster import ClusterSpec
from policies.orders import FILL_SMALL

#: an order rule: waiting demands in -> the order in which to try them for the next hour
Rule = Callable[[list[int]], list[int]]


def bins(demands: Sequence[int], rule: Rule, gpus: int) -> list[int]:
    """Completion hours (1, 2, ...) of ``demands`` when each hour is filled first-fit in ``rule``'s order."""
    if any(d > gpus or d < 1 for d in demands):
        raise ValueError(f"demands must be in 1..{gpus}")
    left, done, t = list(demands), [], 0
    while left:
        t += 1
        free, keep = gpus, []
        for d in rule(left):
            if d <= free:
                free -= d
                done.append(t)
            else:
                keep.append(d)
        left = keep
    return sorted(done)


def fifo(left: list[int]) -> list[int]:
    return list(left)


def fill_rule(gpus: int) -> Rule:
    """The ``"fill"`` order's tail rule in the abstract model (durations all equal)."""

    def rule(left: list[int]) -> list[int]:
        r = sorted(left)
        if any(d <= FILL_SMALL * gpus for d in r):
            return r
        big = next((d for d in r if gpus / 2 < d < gpus), None)
        if big is None:
            return r
        rest = list(r)
        rest.remove(big)
        fillers = sorted((d for d in rest if d <= gpus / 2), reverse=True)
        others = [d for d in rest if d > gpus / 2]
        return [big, *fillers, *others]

    return rule


def optimum(demands: Sequence[int], gpus: int, time_limit: float) -> dict:
    """HiGHS on the aggregated model; average completion (h) of the best schedule and the proven bound."""
    cnt = Counter(demands)
    sizes = sorted(cnt)
    # an optimal schedule leaves no hour before its last one empty, so it ends by hour len(demands)
    horizon = len(demands)
    n = len(sizes) * horizon
    cost = np.tile(np.arange(1, horizon + 1, dtype=float), len(sizes))
    a = lil_matrix((horizon + len(sizes), n))
    for i, d in enumerate(sizes):
        for t in range(horizon):
            a[t, i * horizon + t] = d
            a[horizon + i, i * horizon + t] = 1
    lo = [0] * horizon + [cnt[d] for d in sizes]
    hi = [gpus] * horizon + [cnt[d] for d in sizes]
    res = milp(
        cost,
        constraints=LinearConstraint(a.tocsr(), lo, hi),
        integrality=np.ones(n),
        bounds=Bounds(0, np.inf),
        options={"time_limit": time_limit, "mip_rel_gap": 1e-4},
    )
    if res.x is None:
        raise RuntimeError(f"HiGHS found no schedule within {time_limit} s: {res.message}")
    return {
        "best_h": float(res.fun) / len(demands),
        "bound_h": float(res.mip_dual_bound) / len(demands),
        "proven_optimal": res.status == 0,
    }


def _load(path: Path, cluster: ClusterSpec) -> list[int]:
    """GPU demands of a job set whose jobs all arrive at 0 with one ``duration`` (``ValueError`` otherwise)."""
    from trainer.traces import load_trace

    jobs = load_trace(path, cluster)
    durations = {j.extra.get("duration") for j in jobs}
    if len(durations) != 1 or None in durations or any(j.submit_time for j in jobs):
        raise ValueError(f"{path}: the bound needs every job to arrive at 0 with the same 'duration' column value")
    return [j.gpu_demand for j in jobs]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--traces", required=True, help="directory of job sets (one file per set)")
    ap.add_argument("--cluster", default="4x8", help="cluster: NODESxGPUS (default 4x8); only its GPU count matters")
    ap.add_argument("--time-limit", type=float, default=90.0, help="HiGHS time limit per set, s (default 90)")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    cluster = ClusterSpec.parse(args.cluster)
    gpus = cluster.total_gpus
    files = sorted(p for p in Path(args.traces).iterdir() if p.is_file())
    if not files:
        print(f"error: no job sets in {args.traces}", file=sys.stderr)
        return 2
    sets = []
    for f in files:
        try:
            sets.append((f, _load(f, cluster)))
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    rows = []
    print(f"{'set':12s} {'fifo':>7s} {'fill':>7s} {'best':>7s} {'bound':>7s}   (average completion, h)")
    for f, demands in sets:
        t0 = time.perf_counter()
        row = {
            "set": f.name,
            "jobs": len(demands),
            "fifo_h": float(np.mean(bins(demands, fifo, gpus))),
            "fill_h": float(np.mean(bins(demands, fill_rule(gpus), gpus))),
            **optimum(demands, gpus, args.time_limit),
        }
        row["seconds"] = time.perf_counter() - t0
        rows.append(row)
        print(
            f"{f.name:12s} {row['fifo_h']:7.2f} {row['fill_h']:7.2f} {row['best_h']:7.2f} {row['bound_h']:7.2f}",
            flush=True,
        )
    mean = {k: float(np.mean([r[k] for r in rows])) for k in ("fifo_h", "fill_h", "best_h", "bound_h")}
    print(f"{'mean':12s} {mean['fifo_h']:7.2f} {mean['fill_h']:7.2f} {mean['best_h']:7.2f} {mean['bound_h']:7.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"sets": rows, "mean": mean}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
