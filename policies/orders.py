"""Candidate orders of the learned policies: which waiting jobs a codec shows, and in which order.

A codec (:mod:`policies.codecs`) shows the network ``K`` *candidates*, one waiting job per
GPU demand (the demand group's *head*: its job with the shortest estimated remaining time,
:func:`srtf_key`), in one of three orders (:data:`CANDIDATE_ORDERS`):

``"area"``
    heads by *aged* remaining GPU-time, ``remaining time x demand x exp(-wait / aging_s)``
    (:meth:`CandidateOrder.rank_key`; ``wait`` = time since submission). Candidate 0 is what
    a "shortest remaining GPU-area first, with aging" rule would run, and every SRTF head of a
    demand class is visible. Without aging a large job could be overtaken by later small ones
    indefinitely under continuous arrivals. Jobs that arrive together (equal waits) keep the
    plain GPU-time order.
``"fill"``
    the area order plus a tail rule (:meth:`CandidateOrder.fill_order`): once no small job
    waits, a job of more than half the cluster is put first, followed by the jobs that fit
    beside it and end no later, largest first. Smallest-area-first alone leaves such jobs for
    the end, where each runs beside an idle gap.
``"plan"``
    the single-node jobs of a long queue of equal-length jobs (a batch, or under arrivals
    mostly demands that fill no node exactly) in the waves of :mod:`policies.waves`
    (node-sized exact complements, most jobs first); the fill order otherwise
    (:meth:`CandidateOrder.plan`). The shipped networks use it.

A scheduling round (one state and the placements taken from it) keeps its candidates up to
date by placement with a :class:`RoundQueue`: the demand groups are heaps, the heads a sorted
list, and the ``"plan"`` order's plan is made once, at the round's start, and kept for the
round (a placement only takes a job off it). :meth:`CandidateOrder.candidates` and
:meth:`CandidateOrder.queue_order` are the same orders as pure functions of one queue.

Pure: no I/O; every function is deterministic in its arguments.
"""

from __future__ import annotations

import bisect
import heapq
import math
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from policies.state import TIME_KEY_SCALE, JobInfo, time_key
from policies.waves import plan_order

__all__ = [
    "AGING_S",
    "CANDIDATE_ORDERS",
    "FILL_SMALL",
    "LEGACY_AGING_S",
    "PLAN_BACKLOG",
    "PLAN_ODD",
    "PLAN_SPREAD",
    "PLAN_WAIT",
    "CandidateOrder",
    "Plan",
    "PlanCursor",
    "RoundQueue",
    "srtf_groups",
    "srtf_key",
]

#: Default aging time constant of the candidate order (s; :attr:`CandidateOrder.aging_s`): a job's
#: remaining GPU-time key is multiplied by ``exp(-wait / aging_s)``. Chosen on Poisson traces
#: disjoint from training and evaluation (docs/RL.md, "The aging constant, 300 s").
AGING_S = 300.0
#: The aging of a checkpoint whose observation spec has no ``aging_s`` field (the aging it was trained with).
LEGACY_AGING_S = 1800.0
#: Candidate orders a :class:`CandidateOrder` may be.
CANDIDATE_ORDERS = ("area", "fill", "plan")
#: ``"fill"`` order: the tail rule starts once no pending job needs at most this fraction of the cluster's GPUs.
FILL_SMALL = 0.15
#: ``"plan"`` order: waves are planned only while the waiting jobs need at least this many times the cluster's GPUs ...
PLAN_BACKLOG = 8.0
#: ... and their estimated remaining times agree within this ratio (longest / shortest) ...
PLAN_SPREAD = 1.25
#: ... and they were all submitted within this many seconds (a batch: waves have no ageing), ...
PLAN_WAIT = 1800.0
#: ... or at least this share of the waiting GPU demand is in *odd* demands: demands that neither
#: divide nor are multiples of a node's GPUs. Those fill no node exactly in any order, so only
#: there is the packing gain of waves worth running them under arrivals, without ageing.
PLAN_ODD = 0.5

_floor = math.floor
_exp = math.exp
_SRTF_FIELDS = operator.attrgetter("total_samples", "done_samples", "best_thp", "submit_time", "job_id", "gpu_demand")


def _neg_demand(j: JobInfo) -> int:
    return -j.gpu_demand


def srtf_key(j: JobInfo) -> tuple:
    """Order inside a demand group: estimated remaining time (a :func:`~policies.state.time_key`),
    submit time, id.

    ``JobInfo.remaining_time`` written out (the same arithmetic, so the same floats): this key
    sorts every pending job once per round."""
    t = max(j.total_samples - j.done_samples, 0.0) / j.best_thp
    return (_floor(t * TIME_KEY_SCALE + 0.5) / TIME_KEY_SCALE, j.submit_time, j.job_id)


def srtf_groups(pending: Sequence[JobInfo]) -> dict[int, list[tuple]]:
    """Pending jobs by demand, each group a list of entries ``(*srtf_key(j), position, j)``.

    ``heapq.heapify`` makes a group a heap that pops its jobs in :func:`srtf_key` order (ties, which
    only duplicate ids could make, in queue order, as a stable sort); ``min`` of a group is its SRTF
    head. Positions are unique, so two entries never compare their jobs.
    """
    groups: dict[int, list[tuple]] = {}
    get = groups.get
    for n, ((t, d, b, s, i, g), j) in enumerate(zip(map(_SRTF_FIELDS, pending), pending)):
        # srtf_key's arithmetic (t - d > 0 iff t > d), time_key inlined
        k = (_floor((t - d if t > d else 0.0) / b * TIME_KEY_SCALE + 0.5) / TIME_KEY_SCALE, s, i, n, j)
        h = get(g)
        if h is None:
            groups[g] = [k]
        else:
            h.append(k)
    return groups


@dataclass(frozen=True)
class Plan:
    """The ``"plan"`` order's plan of one queue at one time (:meth:`CandidateOrder.plan`).

    :param now: the time it was made for (s).
    :param order: the demands to start, one per waiting job, in plan order (:func:`policies.waves.plan_order`),
        or ``None`` where waves do not model the queue (the ``"fill"`` order is used instead).
    :param planned: waiting jobs per demand when it was made.
    :param pos: per demand, its positions in ``order`` (ascending).
    """

    now: float
    order: list[int] | None
    planned: dict[int, int]
    pos: dict[int, list[int]]

    def remaining(self, counts: Mapping[int, int]) -> list[int]:
        """The demands still to start when ``counts`` jobs per demand wait (no demand more than planned):
        the jobs started since the plan was made are the first ``planned[d] - counts[d]`` occurrences of
        each demand ``d``."""
        if self.order is None:
            raise ValueError("no waves planned for this queue (the fill order applies)")
        skip = {d: self.planned[d] - counts.get(d, 0) for d in self.planned}
        rest = []
        for d in self.order:
            if skip[d]:
                skip[d] -= 1
            else:
                rest.append(d)
        return rest

    def cursor(self, heads: Sequence[JobInfo], counts: Mapping[int, int], G: int, k: int) -> PlanCursor:
        """A :class:`PlanCursor` over the demand-group ``heads`` with ``counts`` jobs per demand waiting."""
        if self.order is None:
            raise ValueError("no waves planned for this queue (the fill order applies)")
        return PlanCursor(self.planned, self.pos, heads, counts, G, k)


class CandidateOrder:
    """One candidate order (see the module docstring) for a cluster of the given node layout.

    :param name: ``"area"``, ``"fill"`` or ``"plan"``.
    :param k: candidates per decision (``K``).
    :param aging_s: aging time constant of :meth:`rank_key` (s, > 0).
    :param layout: GPUs of each node, in node order (the ``"plan"`` order packs nodes of these sizes).
    """

    def __init__(self, name: str, k: int, aging_s: float, layout: Sequence[int]) -> None:
        if name not in CANDIDATE_ORDERS:
            raise ValueError(f"unknown candidate order {name!r}; expected one of {', '.join(CANDIDATE_ORDERS)}")
        self.name, self.k, self.aging_s = name, int(k), float(aging_s)
        self.layout = tuple(int(g) for g in layout)
        self.num_nodes = len(self.layout)
        self.gpus_per_node = max(self.layout)
        self.total_gpus = sum(self.layout)

    # ------------------------------------------------------------------ keys
    def rank_key(self, j: JobInfo, now: float) -> tuple:
        """Candidate order key at time ``now`` (s): remaining GPU-time aged by :attr:`aging_s`,
        demand, submit time, id (unique per job)."""
        age = _exp(-max(now - j.submit_time, 0.0) / self.aging_s)
        return (time_key(j.remaining_time) * j.gpu_demand * age, j.gpu_demand, j.submit_time, j.job_id)

    # ------------------------------------------------------------------ pure orders of one queue
    def candidates(
        self, pending: Sequence[JobInfo], now: float = 0.0, free: int | None = None, plan: Plan | None = None
    ) -> list[JobInfo]:
        """The ``<= K`` candidate jobs of ``pending`` at time ``now`` (s): one head per demand, in this order.

        :param free: free GPUs of the cluster; needed by the ``"fill"`` and ``"plan"`` orders.
        :param plan: ``"plan"`` order: the round's plan (:meth:`plan` of the round's first queue; the jobs
            started since are off it); ``None``: planned from ``pending``.
        """
        best: dict[int, JobInfo] = {}
        best_key: dict[int, tuple] = {}
        for j in pending:
            k = srtf_key(j)
            cur = best_key.get(j.gpu_demand)
            if cur is None or k < cur:
                best[j.gpu_demand], best_key[j.gpu_demand] = j, k
        heads = sorted(best.values(), key=lambda j: self.rank_key(j, now))
        if self.name == "area":
            return heads[: self.k]
        if free is None:
            raise ValueError(f"the {self.name!r} candidate order needs the cluster's free GPU count")
        if self.name == "plan":
            counts: dict[int, int] = {}
            for j in pending:
                counts[j.gpu_demand] = counts.get(j.gpu_demand, 0) + 1
            return self.plan_heads(heads, counts, now, free, pending, plan)
        return self.fill_order(heads, free)

    def queue_order(self, pending: Sequence[JobInfo], now: float, free: int, plan: Plan | None = None) -> list[JobInfo]:
        """Every pending job in candidate order at time ``now`` (s) with ``free`` free GPUs.

        Not only the head of each demand (:meth:`candidates`) and not cut to ``K``: jobs by
        :meth:`rank_key`, in the ``"fill"`` order's tail (no job of at most ``FILL_SMALL x C``
        GPUs waits) rearranged by :meth:`fill_order`, and in the ``"plan"`` order the rest of the
        plan while a single-node job waits. rl-hybrid's safety rule walks this list.

        :param plan: ``"plan"`` order: the round's plan (:meth:`plan` of the round's first queue; the
            jobs started since are off it); ``None``: planned from ``pending``.
        """
        if self.name == "plan":
            by_d: dict[int, list[JobInfo]] = {}
            for j in sorted(pending, key=srtf_key, reverse=True):
                by_d.setdefault(j.gpu_demand, []).append(j)
            counts = {d: len(js) for d, js in by_d.items()}
            if plan is None:
                plan = self.plan(counts, now, pending)
            if plan.order is not None and any(d <= self.gpus_per_node for d in counts):
                return [by_d[d].pop() for d in plan.remaining(counts)]
        ranked = sorted(pending, key=lambda j: self.rank_key(j, now))
        if self.name != "area" and not any(j.gpu_demand <= FILL_SMALL * self.total_gpus for j in ranked):
            return self.fill_order(ranked, free, k=len(ranked))
        return ranked

    def plan(self, counts: Mapping[int, int], now: float, pending: Sequence[JobInfo]) -> Plan:
        """The ``"plan"`` order's plan for ``counts`` waiting jobs per demand at time ``now`` (s); its
        ``order`` is ``None`` where the order falls back to ``"fill"``.

        Waves are planned only where they model the queue: the waiting jobs (``pending``) need at least
        :data:`PLAN_BACKLOG` times the cluster's GPUs, their estimated remaining times agree within
        :data:`PLAN_SPREAD` (longest / shortest), and either they were submitted within
        :data:`PLAN_WAIT` of each other or at least :data:`PLAN_ODD` of their GPU demand is in demands
        that neither divide nor are multiples of a node's GPUs (waves ignore waiting time, so under
        arrivals they could starve a job: they are used there only where the packing gain is large).
        Jobs larger than the cluster can never start: they come last.
        """
        order = None
        G = self.gpus_per_node
        total = sum(d * c for d, c in counts.items())
        if pending and total >= PLAN_BACKLOG * self.total_gpus:
            # srtf_key's remaining time and the submit times, read in one pass (same arithmetic and floats)
            fields = list(map(_SRTF_FIELDS, pending))
            rem = [(t - d if t > d else 0.0) / b for t, d, b, _s, _i, _g in fields]
            lo = min(rem, default=0.0)
            sub = [f[3] for f in fields]
            batch = max(sub) - min(sub) <= PLAN_WAIT
            odd = sum(d * c for d, c in counts.items() if d % G and G % d) >= PLAN_ODD * total
            if lo > 0.0 and max(rem) <= PLAN_SPREAD * lo and (batch or odd):
                C = self.total_gpus
                fit = {d: c for d, c in counts.items() if 0 < d <= C}  # larger jobs can never start: last
                order = plan_order(fit, self.num_nodes, G, self.layout)
                order += [d for d in sorted(counts) if not 0 < d <= C for _ in range(counts[d])]
        pos: dict[int, list[int]] = {}
        for n, d in enumerate(order or ()):
            q = pos.get(d)
            if q is None:
                pos[d] = [n]
            else:
                q.append(n)
        return Plan(now, order, dict(counts), pos)

    def plan_heads(
        self, heads: Sequence[JobInfo], counts: Mapping[int, int], now: float, free: int,
        pending: Sequence[JobInfo], plan: Plan | None = None,
    ) -> list[JobInfo]:
        """The ``"plan"`` order's ``<= K`` candidates.

        While a single-node job (at most ``G`` GPUs) waits and the plan has waves: the demand-group
        heads ``heads`` in the order their demands first appear in the plan. Otherwise the ``"fill"``
        order (:meth:`fill_order`) of ``heads``, which must then be in ``"area"`` order.

        :param heads: one waiting job per demand (its SRTF head).
        :param counts: waiting jobs per demand; ``free``: free GPUs of the cluster;
            ``pending``: the waiting jobs; ``plan``: the round's plan (``None``: :meth:`plan` of them).
        """
        if plan is None:
            plan = self.plan(counts, now, pending)
        if plan.order is None:
            return self.fill_order(heads, free)
        cursor = plan.cursor(heads, counts, self.gpus_per_node, self.k)
        if not cursor.n_single:
            return self.fill_order(heads, free)
        return cursor.heads()

    def fill_order(self, ranked: Sequence[JobInfo], free: int, k: int | None = None) -> list[JobInfo]:
        """The ``"fill"`` candidate order: ``<= K`` (or ``<= k``) of ``ranked`` (jobs in ``"area"`` order;
        the candidates use the demand-group heads).

        Smallest-GPU-area-first is the right order while small jobs wait, but on a
        cluster of ``C`` GPUs it leaves the jobs of more than ``C / 2`` GPUs for the
        end, where no two of them fit together and each runs beside an idle gap.
        Once no pending job needs at most ``FILL_SMALL x C`` GPUs, this order puts
        the first such large job (``C / 2 < demand < C``) ahead, followed by the
        jobs of at most ``C / 2`` GPUs that fit in the ``free`` GPUs and whose
        estimated remaining time is at most the large job's, largest first (a
        best-fit filling of the large job's gap that ends with it), then the rest
        in ``"area"`` order.
        Jobs of exactly ``C`` GPUs leave no gap and keep their place. While any small
        job waits, or no large job does, the order is ``"area"``.
        """
        K = self.k if k is None else k
        C = self.total_gpus
        half = C / 2
        big = None
        for j in ranked:
            d = j.gpu_demand
            if d <= FILL_SMALL * C:
                return list(ranked[:K])
            if big is None and half < d < C:
                big = j
        if big is None:
            return list(ranked[:K])
        tb = time_key(big.remaining_time)
        fit = sorted(
            (j for j in ranked if j.gpu_demand <= half and j.gpu_demand <= free and time_key(j.remaining_time) <= tb),
            key=_neg_demand,
        )
        head = [big, *fit]
        if len(head) < K:
            taken = {id(j) for j in head}
            head.extend(j for j in ranked if id(j) not in taken)
        return head[:K]

    # ------------------------------------------------------------------ rounds
    def round(self, pending: Sequence[JobInfo], now: float) -> RoundQueue:
        """A :class:`RoundQueue` over ``pending`` at time ``now`` (s): this order's candidates, kept up to
        date as the round starts jobs."""
        return RoundQueue(self, pending, now)


class PlanCursor:
    """The ``"plan"`` order's candidates during one round (:meth:`Plan.cursor`).

    Within a round the time is fixed and the waiting counts only decrease, so the plan made at the
    round's start stays valid for the whole round; the cursor keeps the demand-group heads sorted by
    plan position and updates them by bisection after each start, instead of re-validating the plan
    and re-sorting every head per decision.

    :param planned: waiting jobs per demand when the plan was made.
    :param pos: per demand, its positions in the plan (ascending).
    :param heads: one waiting job per demand (its SRTF head); ``counts``: waiting jobs per demand.
    :param G: GPUs per node; ``k``: candidates per decision.
    """

    __slots__ = ("_G", "_jobs", "_k", "_keys", "_planned", "_pos", "counts", "n_single")

    def __init__(
        self,
        planned: Mapping[int, int],
        pos: Mapping[int, list[int]],
        heads: Sequence[JobInfo],
        counts: Mapping[int, int],
        G: int,
        k: int,
    ) -> None:
        self._planned, self._pos, self._G, self._k = planned, pos, G, k
        self.counts = dict(counts)
        # a demand's first remaining occurrence in the plan: the one after the planned[d] - counts[d] started
        first = sorted((pos[d][planned[d] - self.counts[d]], j) for j in heads if self.counts.get(d := j.gpu_demand))
        self._keys = [n for n, _j in first]
        self._jobs = [j for _n, j in first]
        #: demands of at most G GPUs with jobs waiting (the plan's heads are the candidates while > 0)
        self.n_single = sum(1 for d, c in self.counts.items() if c and d <= G)

    def heads(self) -> list[JobInfo]:
        """The ``<= K`` candidates in plan order (valid while :attr:`n_single` > 0)."""
        return self._jobs[: self._k]

    def started(self, job: JobInfo, nxt: JobInfo | None) -> None:
        """``job`` (a head) was started; ``nxt`` is its demand group's new head (``None``: none left)."""
        d = job.gpu_demand
        c = self.counts[d]
        key = self._pos[d][self._planned[d] - c]
        i = bisect.bisect_left(self._keys, key)
        if i >= len(self._jobs) or self._jobs[i] is not job:
            raise RuntimeError(f"plan cursor lost job {job.job_id}")
        del self._keys[i], self._jobs[i]
        c -= 1
        self.counts[d] = c
        if c:
            if nxt is not None:
                key = self._pos[d][self._planned[d] - c]
                i = bisect.bisect_left(self._keys, key)
                self._keys.insert(i, key)
                self._jobs.insert(i, nxt)
        elif d <= self._G:
            self.n_single -= 1


class RoundQueue:
    """The waiting jobs of one scheduling round and their candidates, updated as the round starts jobs.

    The waiting jobs are grouped by demand (:func:`srtf_groups`) in one pass and each group's SRTF head
    found; the heads are kept sorted by :meth:`CandidateOrder.rank_key` (unique keys, fixed within the
    round). At the round's first start the groups become heaps; after a start only the started job's
    group changes, so its head is replaced by bisection. The ``"plan"`` order's plan is made at the
    round's start and kept (:class:`PlanCursor`). So a round that starts nothing costs one pass over the
    queue, and a round of ``m`` starts ``O(n)`` plus ``O(m log n)``, not ``m`` passes; the candidates
    equal :meth:`CandidateOrder.candidates` of the jobs still waiting (tested).

    :param order: the candidate order.
    :param pending: the round's waiting jobs (not modified).
    :param now: the round's time (s).
    """

    def __init__(self, order: CandidateOrder, pending: Sequence[JobInfo], now: float) -> None:
        self.order, self.now = order, now
        self._fill = order.name == "fill"
        self._planned = order.name == "plan"
        self._small = FILL_SMALL * order.total_gpus
        self._plan: Plan | None = None
        self._init(pending)

    def _init(self, pending: Sequence[JobInfo]) -> None:
        """(Re)build the groups, heads and plan cursor from ``pending`` (the round's plan, once made, is kept)."""
        order, now = self.order, self.now
        groups = self._groups = srtf_groups(pending)  # heapified at the round's first start
        best = map(min, groups.values())  # each group's SRTF head
        self._heaped = False
        #: jobs still waiting
        self.left = len(pending)
        rank_key = order.rank_key
        ranked = sorted((rank_key(e[-1], now), e[-1]) for e in best)
        self._rkeys = [k for k, _j in ranked]
        self._rjobs = [j for _k, j in ranked]
        lim = self._small
        self._n_small = sum(1 for d in groups if d <= lim) if self._fill else 0
        self._cursor: PlanCursor | None = None
        if self._planned and self.left > 0:
            counts = {d: len(g) for d, g in groups.items()}
            if self._plan is None:
                self._plan = order.plan(counts, now, pending)
            if self._plan.order is not None:
                self._cursor = self._plan.cursor(self._rjobs, counts, order.gpus_per_node, order.k)

    def _heaps(self) -> dict[int, list[tuple]]:
        """The demand groups as heaps (popping one gives its jobs in :func:`srtf_key` order)."""
        if not self._heaped:
            for h in self._groups.values():
                heapq.heapify(h)
            self._heaped = True
        return self._groups

    def candidates(self, free: int) -> list[JobInfo]:
        """The ``<= K`` candidates now, with ``free`` free GPUs in the cluster."""
        cursor = self._cursor
        if cursor is not None and cursor.n_single:
            return cursor.heads()
        if self._planned or (self._fill and not self._n_small):
            return self.order.fill_order(self._rjobs, free)
        return self._rjobs[: self.order.k]

    def started(self, job: JobInfo) -> None:
        """``job`` (a waiting job of this round, the very object) was started.

        A demand group's head (a candidate) is taken off incrementally; any other job rebuilds the
        heads from the jobs left (rl-hybrid's safety rule starts such jobs at the end of a round).

        :raises ValueError: ``job`` is not waiting in this round.
        """
        groups = self._heaps()
        grp = groups.get(job.gpu_demand)
        if not grp:
            raise ValueError(f"job {job.job_id} is not waiting in this round")
        if grp[0][-1] is not job:
            rest = [e[-1] for g in groups.values() for e in g if e[-1] is not job]
            if len(rest) == self.left:
                raise ValueError(f"job {job.job_id} is not waiting in this round")
            self._init(rest)
            return
        key = self.order.rank_key(job, self.now)
        rkeys, rjobs = self._rkeys, self._rjobs
        i = bisect.bisect_left(rkeys, key)
        if i >= len(rjobs) or rjobs[i] is not job:
            raise RuntimeError(f"candidate ranking lost job {job.job_id}")
        heapq.heappop(grp)
        del rkeys[i], rjobs[i]
        d = job.gpu_demand
        if self._fill and not grp and d <= self._small:
            self._n_small -= 1
        nxt = grp[0][-1] if grp else None
        if nxt is not None:
            k = self.order.rank_key(nxt, self.now)
            i = bisect.bisect_left(rkeys, k)
            rkeys.insert(i, k)
            rjobs.insert(i, nxt)
        else:
            del groups[d]
        if self._cursor is not None:
            self._cursor.started(job, nxt)
        self.left -= 1

    def waiting(self) -> list[JobInfo]:
        """The jobs still waiting (in no particular order)."""
        return [e[-1] for g in self._groups.values() for e in g]

    def queue_order(self, free: int) -> list[JobInfo]:
        """Every job still waiting in candidate order (:meth:`CandidateOrder.queue_order` with the round's
        plan), with ``free`` free GPUs in the cluster."""
        return self.order.queue_order(self.waiting(), self.now, free, self._plan)

    def plan_remaining(self) -> list[int] | None:
        """``"plan"`` order: the demands still to start in the round's plan (one per waiting job), or
        ``None`` where the round uses the fill order."""
        if self._plan is None or self._plan.order is None:
            return None
        return self._plan.remaining({d: len(g) for d, g in self._groups.items()})
