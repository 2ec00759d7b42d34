"""Hand-made policies: a scheduling order plus a placement rule.

Orders (lower key runs first; ties broken by submit time, then job id; estimated times
are compared as :func:`~policies.state.time_key`, i.e. to the millisecond, so that float
rounding does not break ties). "Isolated" times are the job's samples over
:attr:`~policies.state.JobInfo.best_thp`: its run time alone on its best placement.

=========  ===========  ==================================================================
order      preemptive   key
=========  ===========  ==================================================================
``fifo``   no           submit time. Strict: the head of the queue blocks those behind.
``sjf``    no           estimated total isolated run time.
``sif``    no           SCED2's *shortest ideal time first* (seed 003, Sec. V): the job's
                        total isolated run time; the same key as ``sjf``, under SCED2's name.
``lrf``    no           SCED2's *least resource first*: fewest GPUs (``gpu_demand``).
``srtf``   yes          estimated remaining isolated run time.
``lgtf``   yes          least remaining GPU-time first: remaining isolated time x GPUs
                        (Tiresias' 2D-SRSF, Gu et al., NSDI 2019).
``las``    yes          attained service in GPU-seconds, discretised into the queues of
                        :data:`LAS_THRESHOLDS` (preemptive across queues, FIFO inside one).
``las2d``  yes          Tiresias' discretised 2D-LAS (:func:`las2d_order`): attained
                        GPU-seconds in two queues split at :data:`LAS2D_THRESHOLDS`, FIFO
                        inside a queue, and a waiting job promoted to the first queue once it
                        has waited :data:`LAS2D_PROMOTE_KNOB` times as long as it has run.
=========  ===========  ==================================================================

Placements (:data:`policies.placement.PLACEMENT_RULES`): ``pack`` (SCED2 packing, the default),
``nosplit`` (a job that fits on one node is never split; larger jobs on as few nodes as
possible: :class:`policies.placement.FloorPacking`), ``spread``, ``greedy`` (contention-aware
among the ``nosplit`` placements, see :class:`policies.placement.ContentionAwarePlacement`).
A job whose demand declares CPUs or memory (elastic traces: workers and parameter servers,
``docs/ELASTIC.md``) is offered only the GPUs whose share of its CPUs and memory each node's free
CPUs and memory hold (:func:`cpu_mem_room`, counting what the round's earlier placements take and
its preemptions release), and waits if the rule's placement still does not fit them; its decisions
pass the validator's CPU / memory rule (:mod:`policies.validate`).
New and restarted jobs go through the same rule; a preemptive heuristic also moves a running
job whenever the rule, given the free GPUs plus the job's own, puts it on fewer nodes (:attr:`OrderedPolicy.consolidate`; ``docs/PERFORMANCE_MODEL.md``, section 9).

Names on the command line: an order (``srtf``) or ``greedy`` (= SRTF order with the
``greedy`` placement), each optionally followed by ``-np`` to turn preemption off
(``las-np``) and by ``:PLACEMENT`` (``srtf:nosplit``, ``lgtf-np:spread``).
"""

from __future__ import annotations

import bisect
import copy
import math
import operator
from dataclasses import dataclass
from collections.abc import Sequence
from typing import Callable

import numpy as np

from policies.base import Policy, PolicyError
from policies.cluster import Placement
from policies.perf import ContentionModel
from policies.placement import PLACEMENT_RULES, PlacementRule
from policies.resources import ResourceDemand, nodes_of_type
from policies.state import TIME_KEY_SCALE, ClusterState, Decision, JobInfo, time_key
from policies.validate import CpuMemTaken

__all__ = [
    "OrderedPolicy",
    "ORDERS",
    "TIMED_ORDERS",
    "LAS_THRESHOLDS",
    "LAS2D_THRESHOLDS",
    "LAS2D_PROMOTE_KNOB",
    "las2d_order",
    "make_heuristic",
    "HEURISTIC_NAMES",
    "PLACEMENT_NAMES",
]

#: Tiresias-style LAS queue boundaries in GPU-seconds (1, 4 and 16 GPU-hours).
LAS_THRESHOLDS: tuple[float, ...] = (3600.0, 4 * 3600.0, 16 * 3600.0)
#: ``las2d``'s queue boundaries in GPU-seconds: two queues split at 3600 GPU-s, the setting of
#: the Tiresias simulator's example (SymbioticLab/Tiresias, simulator/README.md, ``queue_limit``).
LAS2D_THRESHOLDS: tuple[float, ...] = (3600.0,)
#: ``las2d``'s starvation rule: a waiting job whose waiting time exceeds this many times its executed
#: time is put in the first queue (Tiresias' STARVELIMIT = PROMOTEKNOB x the job's execution time,
#: PROMOTEKNOB = 8 as listed among "settings described in the original Tiresias paper" by the
#: documentation of github.com/heyfey/vodascheduler, package algorithm, TiresiasPromoteKnob).
LAS2D_PROMOTE_KNOB = 8.0


#: FIFO's key of a job: ``(submit_time, job_id)`` (an attrgetter: the key is built in C).
_fifo: Callable[[JobInfo], tuple] = operator.attrgetter("submit_time", "job_id")


# _sjf and _srtf compute time_key(j.total_time) and time_key(j.remaining_time) written out (the same
# operations in the same order, so the same floats): a preemptive policy computes the key of every
# pending job in every round.
_floor = math.floor
_SCALE = TIME_KEY_SCALE


def _sjf(j: JobInfo) -> tuple:
    return (_floor(j.total_samples / j.best_thp * _SCALE + 0.5) / _SCALE, j.submit_time, j.job_id)


def _srtf(j: JobInfo) -> tuple:
    left = j.total_samples - j.done_samples  # JobInfo.remaining_samples: max(left, 0.0)
    if 0.0 > left:
        left = 0.0
    return (_floor(left / j.best_thp * _SCALE + 0.5) / _SCALE, j.submit_time, j.job_id)


def _las(j: JobInfo) -> tuple:
    return (bisect.bisect_right(LAS_THRESHOLDS, j.attained_service), j.submit_time, j.job_id)


def _lgtf(j: JobInfo) -> tuple:
    return (time_key(j.remaining_time * j.gpu_demand), j.submit_time, j.job_id)


def _lrf(j: JobInfo) -> tuple:
    return (j.gpu_demand, j.submit_time, j.job_id)


def _las2d_queue(j: JobInfo) -> tuple:
    """``las2d``'s key without the starvation rule (a running job's key)."""
    return (bisect.bisect_right(LAS2D_THRESHOLDS, j.attained_service), j.submit_time, j.job_id)


def las2d_order(now: float) -> Callable[[JobInfo], tuple]:
    """``las2d``'s order at time ``now`` (s): Tiresias' discretised 2D-LAS (Gu et al., "Tiresias: A GPU
    Cluster Manager for Distributed Deep Learning", NSDI 2019, Sec. 4 and Algorithm 1).

    Key ``(queue, submit time, job id)``: ``queue`` is the number of :data:`LAS2D_THRESHOLDS` that the
    job's attained service (GPU-seconds: GPUs x seconds run) has reached, FIFO inside a queue. A
    *waiting* job is promoted to queue 0 when its waiting time exceeds :data:`LAS2D_PROMOTE_KNOB` times
    its executed time (Tiresias' STARVELIMIT). The snapshot carries totals, not the last run and
    the last wait, so both are totals: executed time = attained service / GPUs, waiting time =
    ``now`` - submit time - executed time. A job that never ran is in queue 0 anyway.
    """
    knob = LAS2D_PROMOTE_KNOB
    thresholds = LAS2D_THRESHOLDS

    def key(j: JobInfo) -> tuple:
        q = bisect.bisect_right(thresholds, j.attained_service)
        if q and j.placement is None:
            ran = j.attained_service / j.gpu_demand
            if now - j.submit_time - ran > knob * ran:
                q = 0
        return (q, j.submit_time, j.job_id)

    return key


#: Orders whose key does not depend on the time (name -> key of a job).
ORDERS: dict[str, Callable[[JobInfo], tuple]] = {
    "fifo": _fifo, "sjf": _sjf, "sif": _sjf, "lrf": _lrf, "srtf": _srtf, "lgtf": _lgtf, "las": _las,
    "las2d": _las2d_queue,
}
#: Orders whose key depends on the snapshot's time: name -> (time -> key of a job). A policy with one
#: of these builds the round's key from it; ``ORDERS`` holds the same order without its time rule.
TIMED_ORDERS: dict[str, Callable[[float], Callable[[JobInfo], tuple]]] = {"las2d": las2d_order}
_DEFAULT_PREEMPTIVE = {
    "fifo": False, "sjf": False, "sif": False, "lrf": False, "srtf": True, "lgtf": True, "las": True, "las2d": True,
}
#: Every heuristic name without variants (``-np``, ``:PLACEMENT``).
HEURISTIC_NAMES = ("fifo", "sjf", "sif", "lrf", "srtf", "lgtf", "las", "las2d", "greedy")
#: The placements a heuristic name may end with (``:PLACEMENT``).
PLACEMENT_NAMES = tuple(PLACEMENT_RULES)


@dataclass(kw_only=True)
class OrderedPolicy(Policy):
    """Schedule pending jobs in ``order``; place each with ``placement``. A job that asks for a GPU
    type (``JobInfo.demand.gpu_type``, e.g. ``--gpus=v100:2`` on Slurm) is placed only on nodes of
    that type (:meth:`_place`).

    :param strict: stop at the first pending job that does not fit (FIFO
        semantics). Otherwise later jobs may backfill around it.
    :param preemptive: a pending job that does not fit may preempt running
        jobs of strictly lower priority (worst first) if that makes it fit;
        only as many as the placement needs, node by node (see
        :meth:`_with_preemption`). GPUs a victim holds on an unusable node
        (:attr:`~policies.state.ClusterState.usable`) are not counted as freed.
    :param min_run: a running job is not preempted before it has run this
        many seconds since its last start (avoids thrashing). Jobs marked
        :attr:`~policies.state.JobInfo.preemptible` ``False`` are never victims.
    :param preempt_margin: for numeric keys (SRTF), a victim's key must exceed
        the waiting job's by this factor; preempting for a near tie only buys
        a worse placement and a restart.
    :param timed_order: for orders that depend on the time (:data:`TIMED_ORDERS`): ``now -> key``;
        each round ranks pending jobs and victims with ``timed_order(state.time)`` instead of ``order``.
    :param consolidate: with ``preemptive``, after placing the pending jobs the round moves
        running jobs to better shapes (:meth:`_consolidate`): a job whose placement spans
        more nodes than the placement rule gives it now, asked exactly as for a pending job
        with the job's own GPUs counted free, is preempted and placed there in the same
        decision (it pays the backend's restart overhead). So no job keeps a shape worse
        than the rule could give it, whether it started new or restarted after a
        preemption. Only jobs that may be victims (preemptible, run ``min_run`` since their
        last start) and whose estimated remaining time is at least ``min_run`` are moved.
    """

    name: str
    order: Callable[[JobInfo], tuple]
    placement: PlacementRule
    strict: bool = False
    preemptive: bool = False
    min_run: float = 300.0
    preempt_margin: float = 2.0
    timed_order: Callable[[float], Callable[[JobInfo], tuple]] | None = None
    consolidate: bool = True

    @property
    def moves(self) -> bool:  # type: ignore[override]
        """A preemptive policy that consolidates moves running jobs: it is asked every round."""
        return self.preemptive and self.consolidate

    @property
    def time_invariant(self) -> bool:
        """Non-preemptive orders decide the same while nothing arrives or ends."""
        return not self.preemptive

    def schedule(self, state: ClusterState) -> Decision:
        """One round: pending jobs in ``order``, each placed (after preempting, if allowed) or skipped.

        With :attr:`~policies.base.Policy.place_limit` set the round stops after that many
        placements: the first ones of the unlimited round, with only the preemptions they need.
        """
        dec = Decision()
        # free_gpus is 0 on unusable nodes (ClusterState), so no rule places there
        # The round's free GPUs per node: the state's array until a placement or preemption changes
        # them (then the round's own copy); a placement is taken off when the next job is looked at.
        free = state.free_gpus
        limit = self.place_limit
        pending = state.pending
        if len(pending) == 1 and not self.preemptive and (limit is None or limit > 0):
            # one waiting job and nothing to preempt (most rounds of a simulation): what the loop below
            # does for it, without its bookkeeping (and _place's type filter for a job that names no type)
            job = pending[0]
            got = state.__dict__.get("_free_total")  # state.total_free where a backend handed it in
            if job.gpu_demand <= (got[1] if got is not None and got[0] is free else state.total_free):
                # (no rule can place more GPUs than are free)
                d = job.demand
                p = (self.placement(job, free, state)
                     if d is None or (d.gpu_type is None and not d.declares_cpu_mem)
                     else self._place(job, free, state))
                if p is not None:
                    dec.place.append((job.job_id, p))
            return dec
        own_free = False
        taken: Placement | None = None
        free_total = state.total_free
        usable = state.usable  # None: every node
        order = self.order if self.timed_order is None else self.timed_order(state.time)
        if limit is not None and limit <= 0:
            return dec
        # The pending jobs sorted by ``order`` (a stable sort that computes each key once, in C);
        # only preemption reads a job's key again, for the jobs it looks at.
        if len(pending) > 1:
            pending = sorted(pending, key=order)
        # Victims (running jobs, lowest priority first) are ranked the first time a job does not
        # fit: a round in which every job fits never reads the running jobs.
        victims: list[tuple[tuple, JobInfo]] | None = None if self.preemptive else []
        can_preempt = self.preemptive  # until the victims are known: whether there are any
        # A rule that weighs co-located jobs (greedy) must see this round's starts and preemptions
        # too: `cur` is the state with them (ClusterState.with_running: only running jobs'
        # placements matter to it, and its contention ledger follows incrementally).
        aware = getattr(self.placement, "uses_running", False)
        cur = state
        # CPUs and memory this round's decision takes and releases, for jobs that declare them (a job
        # placed by GPUs alone may not fit a node's CPUs or memory: _place caps the free GPUs for it)
        room = CpuMemTaken(state)
        started: list[tuple[JobInfo, Placement]] = []  # this round's starts and preemptions not yet in `cur`
        stopped: list[JobInfo] = []
        for job in pending:
            if taken is not None:
                if not own_free:
                    free, own_free = free.astype(np.int64), True
                for n, c in taken.alloc:
                    free[n] -= c
                taken = None
            if free_total <= 0 and victims is None:
                victims = self._victims(state, order)
                can_preempt = bool(victims)
            if free_total <= 0 and not can_preempt:
                break  # nothing fits and nothing can be freed: the rest would be skipped
            if started or stopped:  # bring `cur` up to date only when a rule is asked again
                cur = cur.with_running(add=[_placed(j, q) for j, q in started], remove=stopped)
                started, stopped = [], []
            # No rule can place more GPUs than are free: skip the call.
            p = self._place(job, free, cur, room) if job.gpu_demand <= free_total else None
            if p is None and victims is None:
                victims = self._victims(state, order)
                can_preempt = bool(victims)
            if p is None and can_preempt:
                assert victims is not None
                key = order(job)
                if victims and self._lower(victims[0][0][0], key[0]):
                    p, chosen = self._with_preemption(job, key, free, cur, victims, room)
                    if p is not None:
                        if not own_free:
                            free, own_free = free.astype(np.int64), True
                        for v in chosen:
                            if _declares(v):
                                room.take(v, v.placement, +1)  # type: ignore[arg-type]
                            dec.preempt.append(v.job_id)
                            victims[:] = [kv for kv in victims if kv[1] is not v]
                            for n, c in v.placement.alloc:  # type: ignore[union-attr]
                                if usable is None or usable[n]:
                                    free[n] += c
                                    free_total += c
                        if aware:
                            stopped.extend(chosen)
                else:
                    # Pending keys only grow from here and the lowest-priority
                    # victim is not clearly lower than this job: no later job
                    # can preempt either.
                    can_preempt = False
            if p is None:
                if self.strict:
                    break
                continue
            taken = p
            free_total -= job.gpu_demand
            if _declares(job):
                room.take(job, p, -1)
            dec.place.append((job.job_id, p))
            if limit is not None and len(dec.place) >= limit:
                break  # the backend applies no more: later placements (and their preemptions) are dropped
            if aware:
                started.append((job, p))
        if (self.preemptive and self.consolidate and (limit is None or len(dec.place) < limit)
                and free_total > 0 and state.running and _spread_out(state)):
            if taken is not None:
                if not own_free:
                    free, own_free = free.astype(np.int64), True
                for n, c in taken.alloc:
                    free[n] -= c
            if started or stopped:
                cur = cur.with_running(add=[_placed(j, q) for j, q in started], remove=stopped)
            self._consolidate(state, cur, free if own_free else free.astype(np.int64), dec, limit, order, room)
        return dec

    def _consolidate(self, state: ClusterState, cur: ClusterState, free: np.ndarray, dec: Decision,
                     limit: int | None, order: Callable[[JobInfo], tuple] | None = None,
                     room: CpuMemTaken | None = None) -> None:
        """Move running jobs to better shapes (see ``consolidate``), highest priority first.

        For each running job ``j`` on ``n > 1`` nodes, more than its demand needs on the cluster's
        largest nodes, that is not preempted this round, may be a
        victim (:meth:`_victims`' rules) and has at least ``min_run`` seconds of estimated
        remaining time: ``q = placement(j, free + j's own GPUs, cur)``; if ``q`` spans fewer
        nodes than ``j``'s placement, ``j`` is preempted and placed on ``q`` (both appended to
        ``dec``) and ``free`` (the round's free GPUs after its placements, changed in place)
        follows. Nothing happens when no GPU is free: ``j``'s own GPUs alone give the rule the
        same nodes back. ``room``: the CPUs and memory the round's decision holds so far (changed in
        place when a job that declares them moves).
        """
        usable = state.usable
        if int(free.sum()) <= 0:
            return
        gone = set(dec.preempt)
        aware = getattr(self.placement, "uses_running", False)
        per_node = state.cluster.max_gpus_per_node  # no placement of G GPUs spans fewer than ceil(G / per_node) nodes
        cands = [
            ((order or self.order)(j), j)
            for j in state.running
            if j.placement is not None
            and j.placement.num_nodes > 1
            and j.placement.num_nodes > -(-j.gpu_demand // per_node)
            and j.job_id not in gone
            and j.preemptible
            and (j.start_time is None or state.time - j.start_time >= self.min_run)
            and j.remaining_time >= self.min_run
        ]
        if not cands:
            return
        cands.sort(key=_first)
        base = cur
        moved: list[tuple[JobInfo, Placement]] = []
        for _key, j in cands:
            if limit is not None and len(dec.place) >= limit:
                return
            if int(free.sum()) <= 0:
                return
            own = j.placement
            assert own is not None
            trial = free.copy()
            for n, c in own.alloc:
                if usable is None or usable[n]:
                    trial[n] += c
            trial_room = None
            if room is not None and _declares(j):
                trial_room = room.copy()
                trial_room.take(j, own, +1)
            q = self._place(j, trial, cur, trial_room)
            if q is None or q.num_nodes >= own.num_nodes:
                continue
            if trial_room is not None:
                trial_room.take(j, q, -1)
                room.cpus, room.mem = trial_room.cpus, trial_room.mem  # type: ignore[union-attr]
            dec.preempt.append(j.job_id)
            dec.place.append((j.job_id, q))
            free[:] = trial
            for n, c in q.alloc:
                free[n] -= c
            if aware:  # one change from `base` (a chain would drop a job it removes and adds back)
                moved.append((j, q))
                cur = base.with_running(add=[_placed(x, y) for x, y in moved], remove=[x for x, _ in moved])

    def _place(self, job: JobInfo, free: np.ndarray, state: ClusterState,
               room: CpuMemTaken | None = None) -> Placement | None:
        """The placement rule for ``job`` on ``free``; a job that asks for a GPU type
        (``job.demand.gpu_type``) sees only the free GPUs of the nodes of that type, and a job that
        declares CPUs or memory only the GPUs whose share of its demand fits each node's free CPUs
        and memory (:func:`cpu_mem_room`; ``room``: what the round's decision holds so far, none:
        the snapshot's). A placement that still does not fit them (parameter servers laid out
        round-robin over the workers' nodes can crowd one) is not made: the job waits."""
        d = job.demand
        if d is None:
            return self.placement(job, free, state)
        if d.gpu_type is not None:
            ok = nodes_of_type(state.cluster, d.gpu_type)
            if not all(ok):
                free = np.where(ok, free, 0)
                if job.gpu_demand > int(free.sum()):
                    return None
        if not d.declares_cpu_mem:
            return self.placement(job, free, state)
        if room is None:
            room = CpuMemTaken(state)
        cpus, mem = room.free()
        free = cpu_mem_room(d, free, cpus, mem)
        if job.gpu_demand > int(free.sum()):
            return None
        p = self.placement(job, free, state)
        if p is not None and room.misfit(job, p) is not None:
            return None
        return p

    def _victims(self, state: ClusterState, order: Callable[[JobInfo], tuple]) -> list[tuple[tuple, JobInfo]]:
        """``(order key, job)`` of the running jobs this policy may preempt, lowest priority first:
        preemptible, run at least ``min_run`` since their last start, on at least one usable node.
        ``order``: the round's key."""
        usable = state.usable
        return sorted(
            (
                (order(j), j)
                for j in state.running
                if j.preemptible
                and (j.start_time is None or state.time - j.start_time >= self.min_run)
                # a job only on unusable nodes frees nothing a placement may use
                and (usable is None or any(usable[n] for n in j.placement.nodes))  # type: ignore[union-attr]
            ),
            key=_first,
            reverse=True,
        )

    def _lower(self, victim_key: float, job_key: float) -> bool:
        """Whether a victim's primary key is clearly lower priority than the job's.

        Monotone in ``job_key``: if it is false for one job, it is false for
        every job with a larger key (``schedule`` relies on this).
        """
        if isinstance(victim_key, int):  # queue levels (LAS)
            return victim_key > job_key
        return victim_key > job_key * self.preempt_margin

    def _with_preemption(
        self,
        job: JobInfo,
        key: tuple,
        free: np.ndarray,
        state: ClusterState,
        victims: list[tuple[tuple, JobInfo]],
        room: CpuMemTaken | None = None,
    ) -> tuple[Placement | None, list[JobInfo]]:
        """Free the lowest-priority victims one by one until ``job`` fits.

        Once the placement rule finds a placement ``p`` in the GPUs freed so far, only the
        victims ``p`` needs are kept: going through the freed victims lowest priority first,
        a victim is kept if it holds GPUs on a node of ``p`` that still lacks some (``p``'s
        GPUs there minus those free before and those freed by the victims kept so far). A
        node that already had enough free GPUs, or that the victims kept before cover, costs
        no preemption. GPUs on unusable nodes (:attr:`ClusterState.usable`) are never counted.

        :param key: the round's order key of ``job``.
        :param victims: ``(key, job)`` pairs, lowest priority first.
        :param room: the CPUs and memory the round's decision holds so far (not changed); the victims'
            are released in a copy when ``job`` declares CPUs or memory.
        :returns: the placement and the victims it needs, or ``(None, [])``.
        """
        usable = state.usable
        trial = free.copy()
        trial_room = None if room is None or not _declares(job) else room.copy()
        chosen: list[JobInfo] = []
        for vkey, v in victims:
            if not self._lower(vkey[0], key[0]):  # only clearly lower priority
                break
            for n, c in v.placement.alloc:  # type: ignore[union-attr]
                if usable is None or usable[n]:
                    trial[n] += c
            if trial_room is not None and _declares(v):
                trial_room.take(v, v.placement, +1)  # type: ignore[arg-type]
            chosen.append(v)
            p = self._place(job, trial, state, trial_room)
            if p is not None:
                needed = _needed_victims(p, free, chosen)
                if trial_room is not None and len(needed) < len(chosen):
                    # the victims kept free the GPUs; keep them all unless those free the CPUs and memory too
                    check = room.copy()  # type: ignore[union-attr]
                    for x in needed:
                        if _declares(x):
                            check.take(x, x.placement, +1)  # type: ignore[arg-type]
                    if check.misfit(job, p) is not None:
                        needed = chosen
                return p, needed
        return None, []


def _declares(job: JobInfo) -> bool:
    """Whether ``job``'s demand asks for CPUs or memory (the only jobs whose placements change a round's
    :class:`~policies.validate.CpuMemTaken`)."""
    d = job.demand
    return d is not None and d.declares_cpu_mem


def cpu_mem_room(d: ResourceDemand, free: np.ndarray, cpus: Sequence[int | None],
                 mem: Sequence[float | None]) -> np.ndarray:
    """``free`` (GPUs per node, ``[num_nodes]``) capped at the GPUs each node's free CPU cores ``cpus``
    and memory ``mem`` (GB; ``None``: no limit) can hold for demand ``d``: a GPU counts its worker's
    CPUs and memory plus its share of the parameter servers' (``ps x ps_cpus / gpus``), as
    :meth:`~policies.resources.Allocation.from_placement` spreads the PSs over the workers' nodes.
    Returns a new int64 array."""
    g = max(d.gpus, 1)
    per_cpu = d.cpus_per_gpu + d.ps * d.ps_cpus / g
    per_mem = d.mem_gb_per_gpu + d.ps * d.ps_mem_gb / g
    out = np.asarray(free, dtype=np.int64).copy()
    for n in np.flatnonzero(out):
        cap = int(out[n])
        c = cpus[n]
        if c is not None and per_cpu > 0:
            cap = min(cap, int(max(c, 0) // per_cpu))
        m = mem[n]
        if m is not None and per_mem > 0:
            cap = min(cap, int(max(m, 0.0) // per_mem))
        out[n] = cap
    return out


def _spread_out(state: ClusterState) -> bool:
    """Whether a running job of ``state`` spans more nodes than its GPUs need on the cluster's largest
    nodes (``OrderedPolicy._consolidate`` looks only at those): read from the jobs' shapes
    (:meth:`~policies.state.ClusterState.spans`, O(shapes) where the state keeps a contention ledger),
    so a round without such a job never reads the running jobs."""
    per_node = state.cluster.max_gpus_per_node
    return any(n > -(-g // per_node) for g, n in state.spans())


#: The first item of a ``(key, job)`` pair (an itemgetter: sorting by it calls no Python function).
_first: Callable[[tuple], tuple] = operator.itemgetter(0)


def _placed(job: JobInfo, p: Placement) -> JobInfo:
    """``job`` running on ``p``: a shallow copy (its fields were checked when it was made)."""
    out = copy.copy(job)
    out.placement = p
    return out


def _needed_victims(p: Placement, free: np.ndarray, chosen: list[JobInfo]) -> list[JobInfo]:
    """The victims of ``chosen`` (lowest priority first) that ``p`` needs: each one, in that order,
    that holds GPUs on a node where ``p`` still lacks some after ``free`` and the victims kept
    before it. ``p`` fits ``free`` plus the GPUs of all of ``chosen``, so it fits ``free`` plus
    those of the kept ones (a node still short at the end would have kept every victim on it).
    ``p`` never uses an unusable node (``free`` and the freed GPUs are 0 there), so GPUs a victim
    holds on one never count."""
    short = {n: c - int(free[n]) for n, c in p.alloc if c > free[n]}  # GPUs still missing per node
    needed: list[JobInfo] = []
    for v in chosen:
        if not short:
            break
        hit = False
        for n, c in v.placement.alloc:  # type: ignore[union-attr]
            s = short.get(n)
            if s is not None:
                hit = True
                if s > c:
                    short[n] = s - c
                else:
                    del short[n]
        if hit:
            needed.append(v)
    return needed


def make_heuristic(name: str, perf: ContentionModel) -> OrderedPolicy:
    """Build a heuristic from its command-line name (see module docstring)."""
    raw = name.strip().lower()
    base, _, place = raw.partition(":")
    preemptive = None
    if base.endswith("-np"):
        base, preemptive = base[:-3], False
    if base in ("greedy", "contention-greedy"):
        order_name, default_place = "srtf", "greedy"
    else:
        order_name, default_place = base, "pack"
    if order_name not in ORDERS:
        raise PolicyError(
            f"unknown policy {name!r}; heuristics: {', '.join(HEURISTIC_NAMES)} "
            f"(optionally -np and :{'|:'.join(PLACEMENT_NAMES)})"
        )
    place = place or default_place
    if place not in PLACEMENT_RULES:
        raise PolicyError(f"unknown placement {place!r} in policy {name!r}; choose from {', '.join(PLACEMENT_NAMES)}")
    if preemptive is None:
        preemptive = _DEFAULT_PREEMPTIVE[order_name]
    return OrderedPolicy(
        name=raw,
        order=ORDERS[order_name],
        placement=PLACEMENT_RULES[place](perf),
        strict=order_name == "fifo",
        preemptive=preemptive,
        timed_order=TIMED_ORDERS.get(order_name),
    )
