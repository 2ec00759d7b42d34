"""Elastic jobs with parameter servers: their placements, their CPU / memory use per node, and the
baselines that decide how many workers and PSs each job gets (DRF, Tetris, Optimus).

**Placements.** An :class:`ElasticPlacement` is a :class:`~policies.cluster.Placement` (node -> GPUs,
one data-parallel worker per GPU) that also says how many parameter servers the job runs (``ps``).
A policy puts one in ``Decision.place`` or ``Decision.resize``; the GPU rules of
:func:`policies.validate.check_decision` apply to it unchanged, and a resize to the same GPUs with
another ``ps`` changes the PS count only. A plain ``Placement`` of a PS job runs its demand's
``ps`` (``JobSpec.demand.ps``).

**Where PSs run** (:func:`ps_layout`, :meth:`policies.resources.Allocation.from_placement`): on a
cluster whose ``ps_placement`` is ``"workers"`` (the default) PS ``i`` runs on the ``i % k``-th of the
placement's ``k`` nodes (ascending); on a ``"spread"`` cluster :func:`materialize` puts each PS on the
node with the most free CPUs (then memory, then the job's own nodes, then the lowest index) and names
the nodes in the placement's ``ps_nodes``. A job's CPU / memory use on a node is
its workers' there (``cpus_per_gpu`` / ``mem_gb_per_gpu`` each) plus its PSs' (``ps_cpus`` /
``ps_mem_gb`` each) (:func:`node_usage`). Jobs carry their :class:`~policies.resources.ResourceDemand`
in ``JobInfo.demand`` (the simulator sets it from the trace's ``JobSpec.demand``); a job without one uses no CPU or memory.

**Baselines** (each a named policy, :func:`make_elastic_policy`): every ``interval`` seconds (600,
Optimus' interval that Chic compares with) they re-plan the worker / PS counts of every job in the
system, running or waiting, on the cluster's aggregate GPUs, CPUs and memory, then lay the plan onto
nodes (:meth:`ElasticBaseline.schedule`): shrinking jobs first, then growing ones, then new ones,
each against the per-node free GPUs / CPUs / memory its predecessors left, cutting a job's counts
where a node-level fit fails. Between re-plans they change nothing.

* ``drf``: Dominant Resource Fairness (Ghodsi et al., NSDI 2011) as DL2 runs it: the job with the
  smallest dominant share gets one more worker (and one more PS for a PS job) until one does not fit.
* ``tetris``: Tetris (Grandl et al., SIGCOMM 2014) as DL2 describes it: the job with the highest
  score (alignment of its task's demand with the free resources plus a weight times the inverse of
  its remaining time) gets tasks until its threshold (its ``max_gpus``) or the cluster is full, then
  the next job.
* ``optimus``: Optimus (Peng et al., EuroSys 2018): one worker (and one PS) to each job in arrival
  order, then repeatedly the single worker or PS with the largest marginal gain, the reduction of the
  job's remaining time (remaining work over the speed model's speed) per unit of the task's dominant
  share, while one fits and a gain is positive.

Tetris and Optimus estimate speeds with Optimus' fitted form
(:meth:`policies.psmodel.PSPerformanceModel.fitted`), while the simulator runs PS jobs at the
measured speeds: the gap between the two is the model error DL2 says costs Optimus.

Pure: no I/O.
"""

from __future__ import annotations

from abc import abstractmethod

import heapq
import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from policies.base import Policy, PolicyError
from policies.cluster import ClusterSpec, Placement
from policies.psmodel import PSPerformanceModel
from policies.resources import ResourceDemand, ps_layout
from policies.state import ClusterState, Decision, JobInfo
from policies.validate import ps_problem

__all__ = [
    "ElasticPlacement",
    "ELASTIC_POLICIES",
    "DEFAULT_INTERVAL_S",
    "job_demand",
    "job_ps",
    "ps_layout",
    "node_usage",
    "free_resources",
    "resource_problem",
    "PlanJob",
    "plan_jobs",
    "plan_capacity",
    "fits_capacity",
    "add_use",
    "dominant_share",
    "materialize",
    "ElasticBaseline",
    "DRFPolicy",
    "TetrisPolicy",
    "OptimusPolicy",
    "make_elastic_policy",
]

#: Seconds between the baselines' re-plans (Optimus' interval, the one Chic compares with).
DEFAULT_INTERVAL_S = 600.0
_EPS = 1e-9


@dataclass(frozen=True)
class ElasticPlacement(Placement):
    """A placement of workers (GPUs per node) plus the job's parameter-server count ``ps`` (>= 0) and,
    optionally, the nodes its PSs run on (``ps_nodes``: ``(node, PSs)`` pairs, ascending nodes, summing
    to ``ps``; empty: on the worker nodes, split evenly, :func:`ps_layout`).

    Build one with :meth:`make`. Equal to another only with the same GPUs, ``ps`` and ``ps_nodes``."""

    ps: int = 0
    ps_nodes: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.ps, bool) or not isinstance(self.ps, int) or self.ps < 0:
            raise ValueError(f"ElasticPlacement: ps must be an integer >= 0, got {self.ps!r}")
        if self.ps_nodes:
            nodes = [n for n, _ in self.ps_nodes]
            if (nodes != sorted(set(nodes)) or any(isinstance(c, bool) or not isinstance(c, int) or c < 1
                                                   for _, c in self.ps_nodes)
                    or sum(c for _, c in self.ps_nodes) != self.ps or nodes[0] < 0):
                raise ValueError(f"ElasticPlacement: ps_nodes must be (node, count >= 1) pairs on distinct ascending "
                                 f"nodes summing to ps = {self.ps}, got {self.ps_nodes!r}")

    @classmethod
    def make(cls, mapping: Mapping[int, int] | Iterable[tuple[int, int]], ps: int,
             ps_nodes: Mapping[int, int] | None = None) -> "ElasticPlacement":
        """The placement of ``mapping`` (node -> GPUs, as :meth:`Placement.of`) with ``ps`` PSs, on the
        nodes ``ps_nodes`` (node -> PSs; None: on the worker nodes, split evenly)."""
        base = Placement.of(mapping)
        lay = tuple(sorted((n, c) for n, c in ps_nodes.items() if c)) if ps_nodes else ()
        return cls(base.alloc, ps, lay)

    def __str__(self) -> str:
        if self.ps_nodes:
            return super().__str__() + f"+{self.ps}ps" + "{" + ",".join(f"{n}:{c}" for n, c in self.ps_nodes) + "}"
        return super().__str__() + f"+{self.ps}ps"


def job_demand(job: JobInfo) -> ResourceDemand | None:
    """The job's resource demand (:attr:`JobInfo.demand <policies.state.JobInfo.demand>`), or None."""
    d = job.demand
    return d if isinstance(d, ResourceDemand) else None


def job_ps(job: JobInfo, placement: Placement | None = None) -> int:
    """PSs the job runs with on ``placement`` (default: its current one): the placement's ``ps`` when
    it is an :class:`ElasticPlacement`, else its demand's ``ps`` (0 without a demand)."""
    p = job.placement if placement is None else placement
    if isinstance(p, ElasticPlacement):
        return p.ps
    d = job_demand(job)
    return d.ps if d is not None else 0


def node_usage(placement: Placement, demand: ResourceDemand | None, ps: int) -> dict[int, tuple[int, float]]:
    """``{node: (cpus, mem_gb)}`` the job uses with its workers on ``placement`` and ``ps`` PSs placed as
    :meth:`policies.resources.Allocation.from_placement` places them (module docstring). Empty
    without a demand."""
    if demand is None:
        return {}
    out: dict[int, tuple[int, float]] = {}
    cw, mw = demand.cpus_per_gpu, demand.mem_gb_per_gpu
    for n, c in placement.alloc:
        out[n] = (c * cw, c * mw)
    for n, cnt in ps_layout(placement, ps):
        c0, m0 = out.get(n, (0, 0.0))
        out[n] = (c0 + cnt * demand.ps_cpus, m0 + cnt * demand.ps_mem_gb)
    return out


def free_resources(state: ClusterState) -> tuple[list[float], list[float]]:
    """Free CPUs and memory (GB) per node: each node's declared amount (``inf`` when it declares
    none) less the use of the running jobs (:func:`node_usage`)."""
    cl = state.cluster
    cpus = [math.inf if c is None else float(c) for c in cl.cpus_per_node]
    mem = [math.inf if m is None else float(m) for m in cl.mem_gb_per_node]
    for j in state.running:
        d = job_demand(j)
        if d is None or j.placement is None:
            continue
        for n, (c, m) in node_usage(j.placement, d, job_ps(j)).items():
            cpus[n] -= c
            mem[n] -= m
    return cpus, mem


def resource_problem(job: JobInfo, placement: Placement, cpus: list[float], mem: list[float],
                     release: Placement | None = None) -> str | None:
    """Why ``job`` cannot take ``placement`` for CPUs, memory or its PS count (one line), or None;
    on success ``cpus`` / ``mem`` are updated (the job's old ``release`` given back, the new use
    taken). A PS job (demand ``ps >= 1``) needs ``ps >= 1``; a job without PSs takes none."""
    d = job_demand(job)
    if isinstance(placement, ElasticPlacement):
        why = ps_problem(job, placement)
        if why is not None:
            return why
    if d is None:
        return None
    old = node_usage(release, d, job_ps(job, release)) if release is not None else {}
    new = node_usage(placement, d, job_ps(job, placement))
    for n, (c, m) in new.items():
        if n >= len(cpus):
            return None  # the GPU rules report a node outside the cluster
        c0, m0 = old.get(n, (0, 0.0))
        if c - c0 > cpus[n] + _EPS:
            return f"job {job.job_id}: placement {placement} does not fit: node {n} has {cpus[n] + c0:g} free CPUs, it needs {c}"
        if m - m0 > mem[n] + 1e-6:
            return (f"job {job.job_id}: placement {placement} does not fit: node {n} has {mem[n] + m0:g} GB of free "
                    f"memory, it needs {m:g}")
    for n, (c0, m0) in old.items():
        cpus[n] += c0
        mem[n] += m0
    for n, (c, m) in new.items():
        cpus[n] -= c
        mem[n] -= m
    return None


# ---------------------------------------------------------------------- planning
# The planning API the elastic policies share (the baselines here, Chic, DL2 and DL2's trainer): a plan
# sets the worker / PS counts ``w`` / ``p`` of every PlanJob within the aggregate capacity; amounts are
# ``(GPUs, CPUs, GB)`` triples throughout.
@dataclass
class PlanJob:
    """A job as the planners see it: its snapshot entry ``info``, its resource ``demand``, whether it runs
    parameter servers (``ps_job``), its worker range ``lo`` .. ``hi``, one worker's and one PS's
    ``(GPUs, CPUs, GB)`` (``wv``, ``pv``), the planned counts ``w`` / ``p``, its current counts
    ``cur_w`` / ``cur_p`` (0 / 0 while it waits) and its rank ``order`` (submit time, then id)."""

    info: JobInfo
    demand: ResourceDemand
    ps_job: bool
    lo: int  # fewest workers it runs on
    hi: int  # most workers it can use
    wv: tuple[float, float, float]  # one worker's (GPUs, CPUs, GB)
    pv: tuple[float, float, float]  # one PS's (GPUs, CPUs, GB)
    w: int = 0
    p: int = 0
    cur_w: int = 0
    cur_p: int = 0
    order: int = 0

    def use(self, w: int, p: int) -> tuple[float, float, float]:
        """``(GPUs, CPUs, GB)`` of ``w`` workers and ``p`` PSs of this job."""
        return tuple(w * a + p * b for a, b in zip(self.wv, self.pv))  # type: ignore[return-value]


def plan_jobs(state: ClusterState) -> list[PlanJob]:
    """Every job of ``state``, running or waiting, as a :class:`PlanJob` (planned counts 0), sorted by
    submit time then id. A waiting job's ``lo`` is at least its ``gpu_demand`` (it starts on exactly that)."""
    jobs = []
    for k, info in enumerate(list(state.running) + list(state.pending)):
        d = job_demand(info) or ResourceDemand(info.gpu_demand)
        lo = info.min_gpus if info.min_gpus is not None else info.gpu_demand
        hi = info.max_gpus if info.max_gpus is not None else info.gpu_demand
        if info.placement is None:  # a waiting job starts on exactly its gpu_demand workers
            lo = max(lo, info.gpu_demand)
        ps_job = d.ps > 0
        j = PlanJob(info, d, ps_job, lo, hi, (1.0, float(d.cpus_per_gpu), float(d.mem_gb_per_gpu)),
                 (0.0, float(d.ps_cpus), float(d.ps_mem_gb)), order=k)
        if info.placement is not None:
            j.cur_w = info.placement.total_gpus
            j.cur_p = job_ps(info)
        jobs.append(j)
    jobs.sort(key=lambda j: (j.info.submit_time, j.info.job_id))
    for k, j in enumerate(jobs):
        j.order = k
    return jobs


def plan_capacity(state: ClusterState) -> tuple[float, float, float]:
    """The aggregate ``(GPUs, CPUs, GB)`` of the usable nodes (``inf`` CPUs / GB where a node declares none)."""
    cl = state.cluster
    usable = state.usable
    g = c = m = 0.0
    for i, n in enumerate(cl.nodes):
        if usable is not None and not usable[i]:
            continue
        g += n.gpus
        c += math.inf if n.cpus is None else n.cpus
        m += math.inf if n.mem_gb is None else n.mem_gb
    return g, c, m


def fits_capacity(used: Sequence[float], add: Sequence[float], cap: Sequence[float]) -> bool:
    """Whether ``used + add`` stays within ``cap`` in every resource (to 1e-9)."""
    return all(u + a <= c + _EPS for u, a, c in zip(used, add, cap))


def add_use(used: list[float], add: Sequence[float]) -> None:
    """Add the amounts ``add`` to ``used`` (modified)."""
    for i, a in enumerate(add):
        used[i] += a


def dominant_share(v: Sequence[float], cap: Sequence[float]) -> float:
    """Dominant share of the amounts ``v`` of a cluster of capacity ``cap``."""
    return max((a / c for a, c in zip(v, cap) if c > 0 and c != math.inf), default=0.0)


class ElasticBaseline(Policy):
    """Re-plan every job's worker / PS counts every ``interval`` s (:meth:`plan`), then lay the plan
    onto nodes (module docstring). Subclasses write :meth:`plan`.

    :param perf: the performance model (a :class:`policies.psmodel.PSPerformanceModel` for PS jobs);
        the baselines that estimate remaining time use its ``throughput``.
    :param interval: seconds between re-plans (>= 0; 0: every round).
    """

    resizes = True
    time_invariant = False

    def __init__(self, perf=None, interval: float = DEFAULT_INTERVAL_S) -> None:
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not math.isfinite(interval) \
                or interval < 0:
            raise PolicyError(f"policy {self.name}: interval must be a finite number of seconds >= 0, got {interval!r}")
        self.perf = perf
        # what the baselines estimate speeds with: Optimus' fitted form for PS jobs (a white-box model,
        # as Optimus fits online), not the measurements the simulator runs jobs at
        self.estimator = perf.fitted() if isinstance(perf, PSPerformanceModel) else perf
        self.interval = float(interval)
        self._next = 0.0
        self._speeds: dict[tuple[str, int, int], float] = {}

    def reset(self) -> None:
        self._next = 0.0

    # -------------------------------------------------------------- each baseline's own
    @abstractmethod
    def plan(self, jobs: list[PlanJob], cap: tuple[float, float, float], state: ClusterState) -> None:
        """Set ``w`` / ``p`` of every job (0 / 0: it does not run) within the aggregate ``cap``."""

    # -------------------------------------------------------------- helpers
    def speed(self, j: PlanJob, w: int, p: int) -> float:
        """Estimated samples/s of job ``j`` with ``w`` workers (on one node) and ``p`` PSs
        (``estimator.throughput``: the fitted PS form, or ``perf`` itself for other models)."""
        if w < 1 or (j.ps_job and p < 1):
            return 0.0
        if self.perf is None:
            return j.info.best_thp * w / max(j.info.gpu_demand, 1)
        key = (j.info.model, w, p if j.ps_job else 0)
        got = self._speeds.get(key)
        if got is None:  # the performance model is a pure function of the key
            got = self._speeds[key] = float(self.estimator.throughput(j.info.model, ElasticPlacement(((0, w),), key[2])))
        return got

    def remaining_time(self, j: PlanJob, w: int, p: int) -> float:
        s = self.speed(j, w, p)
        return math.inf if s <= 0 else j.info.remaining_samples / s

    # -------------------------------------------------------------- the round
    def schedule(self, state: ClusterState) -> Decision:
        if state.time + _EPS < self._next:
            return Decision()
        self._next = state.time + self.interval
        jobs = plan_jobs(state)
        if not jobs:
            return Decision()
        cap = plan_capacity(state)
        self.plan(jobs, cap, state)
        for j in jobs:  # a plan below a job's minimum, or a PS job without a PS, does not run it
            if j.w < j.lo or (j.ps_job and j.p < 1):
                j.w = j.p = 0
            if not j.ps_job:
                j.p = 0
        dec = materialize(state, jobs)
        planned = {j.info.job_id: j.w for j in jobs}
        if any(planned[jid] > p.total_gpus for jid, p in dec.place):
            self._next = state.time  # a job placed below its plan (it starts at its gpu_demand) grows next round
        return dec


def materialize(state: ClusterState, jobs: list[PlanJob]) -> Decision:
    """The decision that brings the jobs to their planned counts, node by node (module docstring)."""
    cl = state.cluster
    usable = state.usable
    free = [int(x) for x in state.free_gpus]
    cpus, mem = free_resources(state)
    dec = Decision()
    # 1. preempt running jobs planned out; nothing else of theirs remains
    for j in jobs:
        if j.cur_w and j.w == 0:
            dec.preempt.append(j.info.job_id)
            p = j.info.placement
            assert p is not None
            for n, c in p.alloc:
                if usable is None or usable[n]:
                    free[n] += c
            for n, (c, m) in node_usage(p, job_demand(j.info), j.cur_p).items():
                cpus[n] += c
                mem[n] += m

    def room(n: int, j: PlanJob) -> bool:
        return (usable is None or usable[n]) and free[n] > 0 and cpus[n] + _EPS >= j.wv[1] \
            and mem[n] + 1e-6 >= j.wv[2]

    spread = cl.ps_placement == "spread"

    def spread_ps(j: PlanJob, counts: dict[int, int], p: int, old: Placement | None) -> dict[int, int]:
        """Up to ``p`` PSs of ``j`` laid out one by one on the usable node with the most free CPUs (then
        memory, then one of its worker nodes, then the lowest index) that holds one, after its workers on
        ``counts`` (its ``old`` use given back): node -> PSs, fewer than ``p`` where the cluster is full."""
        c2, m2 = list(cpus), list(mem)
        if old is not None:
            for n, (c, m) in node_usage(old, j.demand, job_ps(j.info, old)).items():
                c2[n] += c
                m2[n] += m
        for n, k in counts.items():
            c2[n] -= k * j.wv[1]
            m2[n] -= k * j.wv[2]
        pc, pm = j.pv[1], j.pv[2]
        heap = [(-c2[n], -m2[n], n not in counts, n) for n in range(cl.num_nodes)
                if (usable is None or usable[n]) and c2[n] + _EPS >= pc and m2[n] + 1e-6 >= pm]
        heapq.heapify(heap)
        lay: dict[int, int] = {}
        while heap and p > 0:
            _c, _m, _not_own, n = heapq.heappop(heap)
            lay[n] = lay.get(n, 0) + 1
            p -= 1
            c2[n] -= pc
            m2[n] -= pm
            if c2[n] + _EPS >= pc and m2[n] + 1e-6 >= pm:
                heapq.heappush(heap, (-c2[n], -m2[n], n not in counts, n))
        return lay

    def ps_tries(j: PlanJob) -> Sequence[int]:
        """The PS counts to try for ``j``, most first: on a ``spread`` cluster one try (``try_take`` lays
        out as many of ``j.p`` as fit), else every count down to 1."""
        if not j.ps_job:
            return [0]
        return [j.p] if spread else range(j.p, 0, -1)

    def try_take(j: PlanJob, counts: dict[int, int], p: int, old: Placement | None) -> ElasticPlacement | None:
        lay = None
        if spread and p > 0:
            lay = spread_ps(j, counts, p, old)
            p = sum(lay.values())
            if p == 0 or (old is not None and p == j.cur_p and counts == old.as_dict()):
                return None  # no PS fits, or nothing would change
        pl = ElasticPlacement.make(counts, p, lay)
        for n, c in pl.alloc:
            own = dict(old.alloc).get(n, 0) if old is not None else 0
            if c > free[n] + own:
                return None
        c2, m2 = list(cpus), list(mem)
        if resource_problem(j.info, pl, c2, m2, old) is not None:
            return None
        for n, c in pl.alloc:
            free[n] -= c
        if old is not None:
            for n, c in old.alloc:
                free[n] += c
        cpus[:], mem[:] = c2, m2
        return pl

    def grow_options(j: PlanJob, counts: dict[int, int], add: int) -> list[dict[int, int]]:
        """Ways to add ``add`` GPUs to ``counts``: packed (:func:`grow`), then at most ``c`` new workers a
        node for ``c`` = the largest node's GPUs - 1 .. 1 (room left for the job's PSs on its nodes)."""
        out: list[dict[int, int]] = []
        for c in [None, *range(cl.max_gpus_per_node - 1, 0, -1)]:
            g = grow(j, counts, add, c)
            if g is not None and g not in out:
                out.append(g)
        return out

    def grow(j: PlanJob, counts: dict[int, int], add: int, per_node: int | None = None) -> dict[int, int] | None:
        """``counts`` plus ``add`` GPUs (at most ``per_node`` on a node): on the job's nodes first, then
        the nodes with most free GPUs."""
        out = dict(counts)
        spare = {n: free[n] for n in range(cl.num_nodes)}
        order = sorted(range(cl.num_nodes), key=lambda n: (n not in counts, -spare[n], n))
        for n in order:
            if add == 0:
                break
            if not room(n, j):
                continue
            k = min(add, spare[n]) if per_node is None else min(add, spare[n], per_node)
            if j.wv[1] > 0 and cpus[n] != math.inf:
                k = min(k, int((cpus[n] + _EPS) // j.wv[1]))
            if j.wv[2] > 0 and mem[n] != math.inf:
                k = min(k, int((mem[n] + 1e-6) // j.wv[2]))
            if k > 0:
                out[n] = out.get(n, 0) + k
                add -= k
        return out if add == 0 else None

    def shrink(counts: dict[int, int], drop: int) -> dict[int, int]:
        out = dict(counts)
        for n in sorted(out, key=lambda n: (out[n], -n)):  # empty the nodes with fewest of its GPUs first
            if drop == 0:
                break
            k = min(drop, out[n])
            out[n] -= k
            drop -= k
            if out[n] == 0:
                del out[n]
        return out

    running = [j for j in jobs if j.cur_w and j.w]
    changed = [j for j in running if (j.w, j.p) != (j.cur_w, j.cur_p)]
    # 2. resizes: shrinking ones (fewer workers) first, then growing ones, each in plan order
    changed.sort(key=lambda j: (j.w > j.cur_w, j.order))
    for j in changed:
        old = j.info.placement
        assert old is not None
        counts = old.as_dict()
        ws = [j.w] if j.w <= j.cur_w else list(range(j.w, j.cur_w - 1, -1))  # a grow that fails tries fewer
        done = None
        for w in ws:
            cands = [shrink(counts, j.cur_w - w)] if w <= j.cur_w else grow_options(j, counts, w - j.cur_w)
            for cand in cands:
                for p in ps_tries(j):
                    if cand == counts and p == j.cur_p:
                        break  # no change left to make
                    done = try_take(j, cand, p, old)
                    if done is not None:
                        break
                if done is not None:
                    break
            if done is not None:
                break
        if done is not None:
            dec.resize.append((j.info.job_id, done))
    # 3. new jobs, in plan order; a pending job runs on exactly its gpu_demand GPUs (or, elastic, first
    #    resized when running), so it is placed at min(planned, demand) workers when the plan can
    for j in jobs:
        if j.cur_w or j.w == 0:
            continue
        w = j.info.gpu_demand  # a placement must have exactly gpu_demand GPUs
        if j.w < w:
            continue
        placed = None
        for cand in grow_options(j, {}, w):
            for p in ps_tries(j):
                placed = try_take(j, cand, p, None)
                if placed is not None:
                    break
            if placed is not None:
                dec.place.append((j.info.job_id, placed))
                break
    return dec


class DRFPolicy(ElasticBaseline):
    """Dominant Resource Fairness (module docstring)."""

    name = "drf"

    def plan(self, jobs, cap, state) -> None:
        used = [0.0, 0.0, 0.0]
        heap = [(0.0, j.order, j) for j in jobs]
        heapq.heapify(heap)
        while heap:
            _s, _o, j = heapq.heappop(heap)
            add = j.use(1, 1 if j.ps_job else 0)
            if j.w + 1 > j.hi or not fits_capacity(used, add, cap):
                if j.w + 1 > j.hi:
                    continue
                break  # DL2's DRF stops at the first task that does not fit
            j.w += 1
            j.p += 1 if j.ps_job else 0
            add_use(used, add)
            heapq.heappush(heap, (dominant_share(j.use(j.w, j.p), cap), j.order, j))


class TetrisPolicy(ElasticBaseline):
    """Tetris (module docstring): score = alignment + weight * (1 / remaining time), both normalised
    by their means over the candidates (so the two terms weigh alike)."""

    name = "tetris"

    def plan(self, jobs, cap, state) -> None:
        used = [0.0, 0.0, 0.0]
        cand = list(jobs)
        while cand:
            free = [c - u for c, u in zip(cap, used)]
            norm = [c if 0 < c < math.inf else 1.0 for c in cap]
            align, short = {}, {}
            for j in cand:
                v = j.use(1, 1 if j.ps_job else 0)
                align[j.order] = sum((a / n) * (f / n if f != math.inf else 1.0) for a, f, n in zip(v, free, norm))
                rt = self.remaining_time(j, max(j.lo, 1), 1)
                short[j.order] = 0.0 if rt == math.inf else 1.0 / max(rt, 1.0)
            ma = sum(align.values()) / len(cand) or 1.0
            ms = sum(short.values()) / len(cand) or 1.0
            best = max(cand, key=lambda j: (align[j.order] / ma + short[j.order] / ms, -j.order))
            cand.remove(best)
            add = best.use(1, 1 if best.ps_job else 0)
            while best.w < best.hi and fits_capacity(used, add, cap):
                best.w += 1
                best.p += 1 if best.ps_job else 0
                add_use(used, add)


class OptimusPolicy(ElasticBaseline):
    """Optimus (module docstring): marginal gain = (remaining time now - with one more task) / the
    task's dominant share."""

    name = "optimus"

    def _gain(self, j: PlanJob, cap) -> tuple[float, str]:
        now = self.remaining_time(j, j.w, j.p)
        best, role = -math.inf, ""
        if j.w < j.hi:
            t = self.remaining_time(j, j.w + 1, j.p)
            g = (now - t) / max(dominant_share(j.wv, cap), 1e-12) if now != math.inf else math.inf
            best, role = g, "worker"
        if j.ps_job and j.p < j.hi:
            t = self.remaining_time(j, j.w, j.p + 1)
            g = (now - t) / max(dominant_share(j.pv, cap), 1e-12) if now != math.inf else math.inf
            if g > best:
                best, role = g, "ps"
        return best, role

    def plan(self, jobs, cap, state, steps: list | None = None) -> None:
        """Optimus' plan of ``jobs`` within ``cap``; ``steps`` (if given) receives each increment in the
        order taken, as ``(job, workers added, PSs added)``."""
        used = [0.0, 0.0, 0.0]
        for j in jobs:  # at least one worker (its minimum) and one PS each, in arrival order
            w0 = max(j.lo, 1)
            add = j.use(w0, 1 if j.ps_job else 0)
            if fits_capacity(used, add, cap):
                j.w, j.p = w0, (1 if j.ps_job else 0)
                add_use(used, add)
                if steps is not None:
                    steps.append((j, w0, j.p))
        heap = []
        for j in jobs:
            if j.w:
                g, role = self._gain(j, cap)
                if role and g > 0:
                    heap.append((-g, j.order, role, j))
        heapq.heapify(heap)
        while heap:
            ng, _o, role, j = heapq.heappop(heap)
            add = j.wv if role == "worker" else j.pv
            if not fits_capacity(used, add, cap):
                continue  # this task does not fit; others (smaller) may
            if role == "worker":
                j.w += 1
            else:
                j.p += 1
            add_use(used, add)
            if steps is not None:
                steps.append((j, int(role == "worker"), int(role == "ps")))
            g, role = self._gain(j, cap)
            if role and g > 0:
                heapq.heappush(heap, (-g, j.order, role, j))


#: The elastic baselines by name.
ELASTIC_POLICIES = {"drf": DRFPolicy, "tetris": TetrisPolicy, "optimus": OptimusPolicy}


def make_elastic_policy(name: str, perf=None, interval: float = DEFAULT_INTERVAL_S) -> ElasticBaseline:
    """The elastic baseline ``name`` (``drf``, ``tetris``, ``optimus``) pricing jobs with ``perf``."""
    cls = ELASTIC_POLICIES.get(name.strip().lower())
    if cls is None:
        raise PolicyError(f"unknown elastic policy {name!r}; elastic policies: {', '.join(ELASTIC_POLICIES)}")
    return cls(perf, interval)
