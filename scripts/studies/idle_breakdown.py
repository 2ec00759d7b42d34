"""Where a policy's idle GPU-time goes: held back, fragmented or drained.

Run: ``python scripts/studies/idle_breakdown.py --traces /tmp/rl/traces/eval/uniform
[--policies srtf,rl-base,rl-hybrid] [--sets 10] [--cluster 4x8] [--json FILE]``.

Each job set runs through the simulator. After every scheduling round, the
free GPUs left by the round's decision stay idle until the next round. That
idle time (GPUs x hours) is put in one of these classes:

* **held**: a waiting job would fit the free GPUs (:func:`policies.waves.fits`:
  best fit by node, a job of at most one node's GPUs on one node), but the
  policy started nothing more. Only a policy that holds jobs has this.
* **fragmented**: jobs wait, but none fits the free GPUs as they lie across
  the nodes.
* **drained**: no job waits (arrivals have not come yet, or the tail of a set).

Held and fragmented time is further split by the queue's shape:
``single-node`` while a job of at most one node's GPUs waits, ``multi-node``
once every waiting job needs more than one node.

It prints the mean per job set (GPU-h), the mean makespan (h) and average
JCT (h) per policy. An explanation, not a timed benchmark.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from policies.base import Policy
from policies.cluster import ClusterSpec
from policies.perf import ContentionModel
from policies.state import ClusterState, Decision
from policies.waves import fits
from trainer.env import load_trace_dir
from trainer.evaluate import make_policy
from trainer.simulator import SimConfig, Simulator
from trainer.traces import TraceError

CLASSES = ("held, single-node", "held, multi-node", "fragmented, single-node", "fragmented, multi-node", "drained")


class _Observer(Policy):
    """Wraps a policy; after each round records (time, free GPUs per node, waiting demands)."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.name = inner.name
        self.time_invariant = getattr(inner, "time_invariant", False)
        self.log: list[tuple[float, list[int], list[int]]] = []

    def reset(self) -> None:
        self.inner.reset()
        self.log = []

    def schedule(self, state: ClusterState) -> Decision:
        dec = self.inner.schedule(state)
        free = [int(x) for x in state.free_gpus]
        gone = {j for j, _p in dec.place}
        for j in state.running:
            if j.job_id in dec.preempt and j.placement is not None:
                for v, c in j.placement.alloc:
                    free[v] += c
        for _j, p in dec.place:
            for v, c in p.alloc:
                free[v] -= c
        waiting = [j.gpu_demand for j in state.pending if j.job_id not in gone]
        waiting += [j.gpu_demand for j in state.running if j.job_id in dec.preempt]
        self.log.append((state.time, free, waiting))
        return dec


def classify(free: list[int], waiting: list[int], gpus_per_node: int) -> str:
    """The idle class of ``free`` GPUs per node while jobs of ``waiting`` demands wait."""
    if not waiting:
        return "drained"
    shape = "single-node" if min(waiting) <= gpus_per_node else "multi-node"
    most = max(free, default=0)
    for d in set(waiting):
        if (d <= gpus_per_node and most >= d) or (d > gpus_per_node and fits(free, d) is not None):
            return f"held, {shape}"
    return f"fragmented, {shape}"


def breakdown(policy: Policy, jobs, cluster: ClusterSpec, perf: ContentionModel) -> dict[str, float]:
    """Idle GPU-h by class, plus ``makespan_h`` and ``avg_jct_h``, for one job set."""
    obs = _Observer(policy)
    res = Simulator(cluster, jobs, obs, perf, SimConfig()).run()
    end = res.makespan
    G = max(cluster.gpus_per_node)
    C = cluster.total_gpus
    # idle GPU-s between consecutive change points of the allocation (exact), each piece in the class of
    # the last round before it (rounds skipped by the simulator have no waiting job: "drained")
    ut = np.append(res.util_t, end)
    out: dict[str, float] = defaultdict(float)
    cls = "drained"
    k = 0
    log = obs.log
    for a, b, used in zip(ut[:-1], ut[1:], res.util_used):
        while k < len(log) and log[k][0] <= a:
            cls = classify(log[k][1], log[k][2], G)
            k += 1
        if b > a:
            out[cls] += (C - used) * (b - a) / 3600.0
    out["makespan_h"] = end / 3600.0
    out["avg_jct_h"] = float(np.mean([r.jct for r in res.jobs])) / 3600.0
    return dict(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--traces", required=True, help="a job set, or a directory of them (searched recursively)")
    ap.add_argument("--policies", default="srtf,rl-base,rl-hybrid", help="comma-separated policy names")
    ap.add_argument("--sets", type=int, default=None, help="only the first N job sets")
    ap.add_argument("--cluster", default="4x8")
    ap.add_argument("--json", default=None, help="write the per-policy means here")
    args = ap.parse_args(argv)
    cluster = ClusterSpec.parse(args.cluster)
    perf = ContentionModel(cluster)
    try:
        traces = load_trace_dir(args.traces, cluster)[: args.sets]
    except TraceError as e:
        print(f"error: --traces: {e}", file=sys.stderr)
        return 2
    means: dict[str, dict[str, float]] = {}
    for name in [p.strip() for p in args.policies.split(",") if p.strip()]:
        rows = [breakdown(make_policy(name, cluster, perf), jobs, cluster, perf) for jobs in traces]
        keys = {k for r in rows for k in r}
        means[name] = {k: float(np.mean([r.get(k, 0.0) for r in rows])) for k in sorted(keys)}
    table = Table(title=f"Idle GPU-h per job set ({len(traces)} sets, {args.traces}, {cluster.describe()})")
    for col in ("policy", "avg JCT h", "makespan h", *CLASSES, "idle total"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for name, m in means.items():
        idle = sum(m.get(c, 0.0) for c in CLASSES)
        table.add_row(
            name,
            f"{m['avg_jct_h']:.2f}",
            f"{m['makespan_h']:.1f}",
            *(f"{m.get(c, 0.0):.1f}" for c in CLASSES),
            f"{idle:.1f}",
        )
    Console(width=200).print(table)
    if args.json:
        Path(args.json).write_text(json.dumps(means, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
