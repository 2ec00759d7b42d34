"""What the `uniform` gap to SRTF is made of: packing against network contention.

Run: ``python scripts/studies/uniform_gap.py --traces /tmp/rl/traces/eval/uniform
[--policies rl-base,srtf,plan-greedy] [--sets 10] [--json FILE]``.

Each policy runs every job set four times. The policies always decide with the
real performance model; only the *simulator's* model changes between the runs:

* ``real``: the project's model (:class:`policies.perf.ContentionModel`);
* ``no-contention``: a job sharing a node with other multi-node jobs is not slowed
  (``pair_cs`` = 1), locality loss kept;
* ``no-locality-loss``: a job split over more nodes than its best shape runs at its
  best shape's speed, contention kept;
* ``neutral``: neither; every job of the `uniform` sets then runs exactly 1 h.

``plan-greedy`` (:class:`PlanGreedy`, defined here) is the ``"plan"`` candidate order
without a network and without holding: each round it walks the whole queue in plan
order (:meth:`policies.orders.CandidateOrder.queue_order`) and starts every job that fits,
single-node jobs on the best-fitting node, multi-node jobs by
:func:`policies.placement.pack`. It is the packing that the idealised model of
``scripts/studies/uniform_bound.py`` assumes, run in the simulator.

Comparing the columns separates what a schedule loses to packing (idle GPUs) from
what it loses to contention. Prints mean avg / p90 JCT (h), utilisation and average
CS per policy and model. An explanation, not a timed benchmark.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from policies.base import Policy
from policies.cluster import ClusterSpec
from policies.orders import AGING_S, CandidateOrder
from policies.perf import ContentionModel, JobKey, feasible_node_counts
from policies.placement import FloorPacking
from policies.state import ClusterState, Decision
from trainer.env import load_trace_dir
from trainer.evaluate import make_policy
from trainer.metrics import summarize
from trainer.simulator import SimConfig, Simulator
from trainer.traces import TraceError

MODELS = ("real", "no-contention", "no-locality-loss", "neutral")


class _NoContention(ContentionModel):
    """The project's model without contention: co-located jobs never slow each other."""

    def pair_cs(self, a: JobKey, b: JobKey) -> float:
        return 1.0


class _NoLocalityLoss(ContentionModel):
    """The project's model where every shape of a job runs at its best shape's speed."""

    def isolated_throughput(self, model: str, gpus: int, nodes: int) -> float:
        return max(super(_NoLocalityLoss, self).isolated_throughput(model, gpus, n) for n in feasible_node_counts(self.cluster, gpus))


class _Neutral(_NoLocalityLoss):
    """Neither contention nor locality loss."""

    def pair_cs(self, a: JobKey, b: JobKey) -> float:
        return 1.0


def sim_model(kind: str, cluster: ClusterSpec) -> ContentionModel:
    """The simulator's performance model ``kind`` (one of :data:`MODELS`)."""
    cls = {"real": ContentionModel, "no-contention": _NoContention, "no-locality-loss": _NoLocalityLoss, "neutral": _Neutral}
    if kind not in cls:
        raise ValueError(f"unknown model {kind!r} (expected one of {', '.join(MODELS)})")
    return cls[kind](cluster)


class PlanGreedy(Policy):
    """The ``"plan"`` order without a network: start every job that fits, in plan order.

    A job of at most one node's GPUs goes to the node with the fewest free GPUs that
    holds it (lowest index on ties) and waits if no node does; a larger job is placed
    by :func:`policies.placement.pack` (:class:`policies.placement.FloorPacking`
    without a floor, rl-hybrid's safety-rule placement). Never holds a job that fits.
    """

    name = "plan-greedy"
    time_invariant = False

    def __init__(self, cluster: ClusterSpec, perf: ContentionModel, aging_s: float = AGING_S) -> None:
        self.order = CandidateOrder("plan", 6, aging_s, cluster.gpus_per_node)
        self.rule = FloorPacking(perf)  # rl-hybrid's safety-rule placement, without a floor

    def schedule(self, state: ClusterState) -> Decision:
        free = state.free_gpus.astype(np.int64).copy()
        dec = Decision()
        for job in self.order.queue_order(state.pending, state.time, int(free.sum())):
            p = self.rule(job, free, state)  # a single-node job whole on the best-fitting node, else pack
            if p is None:
                continue
            for v, c in p.alloc:
                free[v] -= c
            dec.place.append((job.job_id, p))
        return dec


def run(policy: Policy, traces: list, cluster: ClusterSpec, model: ContentionModel) -> dict[str, float]:
    """Means over ``traces`` of avg / p90 JCT (h), utilisation (%) and average CS."""
    rows = []
    for jobs in traces:
        policy.reset()
        s = summarize(Simulator(cluster, jobs, policy, model, SimConfig()).run())
        rows.append((s["avg_jct_s"] / 3600, s["p90_jct_s"] / 3600, 100 * s["avg_util"], s["avg_cs"]))
    a = np.mean(rows, axis=0)
    return {"avg_jct_h": float(a[0]), "p90_jct_h": float(a[1]), "util_pct": float(a[2]), "avg_cs": float(a[3])}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--traces", required=True, help="a job set, or a directory of them (searched recursively)")
    ap.add_argument("--policies", default="rl-base,srtf,plan-greedy", help="comma-separated policy names")
    ap.add_argument("--models", default=",".join(MODELS), help=f"simulator models, from {', '.join(MODELS)}")
    ap.add_argument("--sets", type=int, default=None, help="only the first N job sets")
    ap.add_argument("--cluster", default="4x8")
    ap.add_argument("--json", default=None, help="write the means here")
    args = ap.parse_args(argv)
    cluster = ClusterSpec.parse(args.cluster)
    perf = ContentionModel(cluster)
    try:
        models = {k: sim_model(k, cluster) for k in (m.strip() for m in args.models.split(",")) if k}
    except ValueError as e:
        print(f"error: --models: {e}", file=sys.stderr)
        return 2
    try:
        traces = load_trace_dir(args.traces, cluster)[: args.sets]
    except TraceError as e:
        print(f"error: --traces: {e}", file=sys.stderr)
        return 2
    out: dict[str, dict[str, dict[str, float]]] = {}
    for name in [p.strip() for p in args.policies.split(",") if p.strip()]:
        for kind, model in models.items():
            pol = PlanGreedy(cluster, perf) if name == "plan-greedy" else make_policy(name, cluster, perf)
            out.setdefault(name, {})[kind] = run(pol, traces, cluster, model)
    table = Table(title=f"Policies decide with the real model; the simulator runs each model ({len(traces)} sets, {args.traces})")
    for col in ("policy", "simulator model", "avg JCT h", "p90 JCT h", "util %", "avg CS"):
        table.add_column(col, justify="left" if col in ("policy", "simulator model") else "right")
    for name, by in out.items():
        for kind, m in by.items():
            table.add_row(name, kind, f"{m['avg_jct_h']:.2f}", f"{m['p90_jct_h']:.2f}", f"{m['util_pct']:.1f}", f"{m['avg_cs']:.3f}")
    Console(width=160).print(table)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
