"""Placement rules: given a job and free GPUs per node, choose a placement.

Every rule is a callable ``rule(job, free, state) -> Placement | None`` that
never mutates ``free`` (an int array ``[num_nodes]``). ``state`` is the
:class:`~policies.state.ClusterState` for rules that look at co-located jobs.
"""

from __future__ import annotations

import math
from typing import Callable, Protocol

import numpy as np

from policies.cluster import Placement
from policies.perf import ContentionModel, JobKey
from policies.state import ClusterState, JobInfo

__all__ = [
    "PlacementRule",
    "pack",
    "spread",
    "ContentionAwarePlacement",
    "FloorPacking",
    "balanced_candidates",
    "PLACEMENT_RULES",
]


class PlacementRule(Protocol):
    def __call__(self, job: JobInfo, free: np.ndarray, state: ClusterState) -> Placement | None: ...


def pack(job: JobInfo, free: np.ndarray, state: ClusterState | None = None) -> Placement | None:
    """Packing placement (seed 003, SCED2): as few nodes, as few free GPUs as possible.

    Repeatedly take the node with the fewest free GPUs that covers the rest of
    the demand; if none can, take the node with the most free GPUs and loop.
    """
    need = job.gpu_demand
    if need > int(free.sum()):
        return None
    avail = free.astype(np.int64).copy()
    alloc: dict[int, int] = {}
    while need > 0:
        ok = np.flatnonzero(avail >= need)
        if ok.size:
            n = int(ok[np.argmin(avail[ok])])  # best fit; argmin takes the lowest index on ties
            take = need
        else:
            n = int(np.argmax(avail))
            take = int(avail[n])
            if take <= 0:
                return None
        alloc[n] = alloc.get(n, 0) + take
        avail[n] -= take
        need -= take
    return Placement.of(alloc)


def spread(job: JobInfo, free: np.ndarray, state: ClusterState | None = None) -> Placement | None:
    """Spread placement: one GPU at a time to the node with the most free GPUs.

    Uses as many nodes as possible; the locality-agnostic extreme that the
    seed's LAS / SRTF baselines approximate (they never use one node).
    """
    need = job.gpu_demand
    if need > int(free.sum()):
        return None
    avail = free.astype(np.int64).copy()
    alloc: dict[int, int] = {}
    for _ in range(need):
        n = int(np.argmax(avail))
        alloc[n] = alloc.get(n, 0) + 1
        avail[n] -= 1
    return Placement.of(alloc)


def balanced_candidates(gpus: int, free: np.ndarray, order: np.ndarray) -> list[Placement]:
    """Balanced placements of ``gpus`` GPUs for every feasible node count.

    For ``n`` nodes each node gets ``ceil(gpus / n)`` (the last fewer); nodes
    are taken in ``order`` (an index array of preference) among those with
    enough free GPUs.
    """
    out: list[Placement] = []
    num_nodes = len(free)
    for n in range(1, min(gpus, num_nodes) + 1):
        per = math.ceil(gpus / n)
        if (n - 1) * per >= gpus:  # would leave a node empty
            continue
        chosen = [int(i) for i in order if free[i] >= per][:n]
        if len(chosen) < n:
            continue
        alloc = {}
        left = gpus
        for i in chosen:
            take = min(per, left)
            alloc[i] = take
            left -= take
        out.append(Placement.of(alloc))
    return out


class ContentionAwarePlacement:
    """Greedy: the placement the performance model predicts hurts least.

    Candidates are the packing placement plus one balanced placement per
    feasible node count (nodes ordered by network load, then best fit). Each
    is scored by the change in *effective GPUs* of all jobs involved::

        sum_j  G_j * achieved_j / best_j

    i.e. the new job's normalised speed times its size, minus what its new
    neighbours lose. The highest score wins; ties go to fewer nodes.

    :param min_efficiency: admission floor in ``[0, 1]``: the best placement is
        returned only if its score per GPU (net effective GPUs gained per GPU
        allocated) is at least this; otherwise ``None`` (the job waits).
        ``0`` (default) admits every placement that fits. ``rl-hybrid``'s
        safety rule uses a floor so that filling idle GPUs never buys
        utilisation with heavy contention.
    """

    #: it reads the running jobs of the state it is given (a policy placing several jobs in one
    #: round must hand it the state with the round's earlier starts)
    uses_running = True

    def __init__(self, perf: ContentionModel, min_efficiency: float = 0.0) -> None:
        if not 0.0 <= min_efficiency <= 1.0:
            raise ValueError(f"min_efficiency must be in [0, 1], got {min_efficiency}")
        self.perf = perf
        self.min_efficiency = float(min_efficiency)

    def __call__(self, job: JobInfo, free: np.ndarray, state: ClusterState) -> Placement | None:
        if job.gpu_demand > int(free.sum()):
            return None
        per_node = state.jobs_on_node()
        load = np.array([sum(1 for j in js if j.placement and j.placement.num_nodes > 1) for js in per_node], float)
        order = np.lexsort((free, load))  # least loaded first, then fewest free (best fit)
        cands = balanced_candidates(job.gpu_demand, free, order)
        p = pack(job, free)
        if p is not None and p not in cands:
            cands.append(p)
        if not cands:
            return None
        best, best_score = None, -math.inf
        for c in cands:
            s = self.score(job, c, per_node)
            if s > best_score + 1e-9 or (abs(s - best_score) <= 1e-9 and best is not None and c.num_nodes < best.num_nodes):
                best, best_score = c, s
        if self.min_efficiency > 0.0 and best_score < self.min_efficiency * job.gpu_demand - 1e-9:
            return None
        return best

    def _key(self, j: JobInfo, p: Placement) -> JobKey:
        return (j.model, p.total_gpus, p.num_nodes)

    def _neigh(self, per_node: list[list[JobInfo]], node: int, exclude: str) -> list[JobKey]:
        return [self._key(o, o.placement) for o in per_node[node] if o.job_id != exclude and o.placement is not None]

    def score(self, job: JobInfo, cand: Placement, per_node: list[list[JobInfo]]) -> float:
        perf = self.perf
        me = self._key(job, cand)
        neigh = {n: self._neigh(per_node, n, job.job_id) for n in cand.nodes}
        cs_me = perf.job_cs(me, cand.nodes, neigh)
        iso = perf.isolated_throughput(job.model, cand.total_gpus, cand.num_nodes)
        gain = job.gpu_demand * iso / cs_me / max(job.best_thp, 1e-12)
        if me[2] <= 1:
            return gain
        # What the neighbours lose.
        seen: set[str] = set()
        loss = 0.0
        for n in cand.nodes:
            for o in per_node[n]:
                if o.job_id in seen or o.placement is None or o.placement.num_nodes <= 1:
                    continue
                seen.add(o.job_id)
                ok = self._key(o, o.placement)
                before = {v: self._neigh(per_node, v, o.job_id) for v in o.placement.nodes}
                after = {v: list(before[v]) + ([me] if v in neigh else []) for v in o.placement.nodes}
                cs_b = perf.job_cs(ok, o.placement.nodes, before)
                cs_a = perf.job_cs(ok, o.placement.nodes, after)
                iso_o = perf.isolated_throughput(o.model, o.placement.total_gpus, o.placement.num_nodes)
                loss += o.gpu_demand * iso_o * (1.0 / cs_b - 1.0 / cs_a) / max(o.best_thp, 1e-12)
        return gain - loss


class FloorPacking:
    """Packing placement (:func:`pack`) that keeps single-node jobs whole, with an optional floor.

    A job of at most the largest node's GPUs (``state.cluster.max_gpus_per_node``;
    on a homogeneous cluster: one node's) goes to the node with the fewest free
    GPUs that holds it (lowest index on ties) and waits (``None``) if no node
    does; a larger job is placed by :func:`pack`. It is ``rl-hybrid``'s safety-rule
    placement, and ``plan-greedy``'s (``scripts/studies/uniform_gap.py``: the ``"plan"``
    candidate order without a network).

    :param perf: performance model, for the floor's score.
    :param min_efficiency: admission floor in ``[0, 1]``: the packing placement
        is returned only if it yields at least this many effective GPUs per GPU
        allocated (:meth:`ContentionAwarePlacement.score`: the job's normalised
        speed times its size minus what its new neighbours lose). ``0``
        (default): every placement that fits.
    """

    uses_running = True  # the floor reads the running jobs (see ContentionAwarePlacement)

    def __init__(self, perf: ContentionModel, min_efficiency: float = 0.0) -> None:
        self._scorer = ContentionAwarePlacement(perf, min_efficiency)
        self.perf = perf
        self.min_efficiency = self._scorer.min_efficiency

    def __call__(self, job: JobInfo, free: np.ndarray, state: ClusterState) -> Placement | None:
        if job.gpu_demand <= state.cluster.max_gpus_per_node and int(free.max(initial=0)) < job.gpu_demand:
            return None  # a single-node job is never split
        p = pack(job, free)
        if p is None or self.min_efficiency <= 0.0:
            return p
        if self.score(job, p, state.jobs_on_node()) < self.min_efficiency * job.gpu_demand - 1e-9:
            return None
        return p

    def score(self, job: JobInfo, cand: Placement, per_node: list[list[JobInfo]]) -> float:
        """Net effective GPUs that ``cand`` adds (:meth:`ContentionAwarePlacement.score`)."""
        return self._scorer.score(job, cand, per_node)


PLACEMENT_RULES: dict[str, Callable[..., PlacementRule]] = {
    "pack": lambda perf: pack,
    "spread": lambda perf: spread,
    "greedy": lambda perf: ContentionAwarePlacement(perf),
}
