"""The contention ledger: which multi-node jobs share each node's network link, and how much each slows.

Only jobs spanning several nodes use a node's network link, so only they slow each other (the
seed's rule; :mod:`policies.perf` prices a pair and a job's link demand). A job ``A`` on nodes
``V`` with multi-node neighbours ``B`` on node ``v`` has the contention sensitivity (CS, isolated /
achieved throughput, >= 1) given by one of three **contention rules** (:data:`CONTENTION_RULES`;
a performance model's ``contention`` attribute picks one, ``"sum"`` when it has none)::

    sum     CS_v(A) = 1 + sum_B on v, B != A (pair_cs(A, B) - 1)
            CS(A)   = min(max_v in V CS_v(A), CS_CAP)                 CS_CAP = 1 / MIN_RATIO = 10
    ds-min  CS_v(A) = min(max(1, max_B on v pair_cs(A, B)), DS_CS_CAP) DS_CS_CAP = 1 / DS_MIN_RATIO
            CS(A)   = max_v in V CS_v(A)                              (DeepShare's simulator)
    link    x_v(A)  = A's max-min fair share of node v's link capacity C among the demands d_B of
                      every multi-node job B on v (A included)
            CS_v(A) = 1 + chi_A (min(d_A, C) / x_v(A) - 1)              (only communication stretches)
            CS(A)   = max_v in V CS_v(A)                              (no cap)

and ``CS(A) = 1`` if ``A`` runs on one node, under every rule. ``pair_cs`` is the measured (or
fitted) one-neighbour CS; ``d_B`` (MB/s) and ``chi_A`` (communication share of A's step) come
from :meth:`LinkContention.link_terms`, ``C`` from :attr:`LinkContention.link_capacity_mbps`
(equations, calibration and fit errors in ``docs/PERFORMANCE_MODEL.md``, section 2).
:func:`node_cs`, :func:`cap_cs` and :func:`job_cs` are these rules and the only place they are
written; :class:`ContentionLedger` keeps them up to date job by job.

The ledger is what the simulator, the placement rules, the Slurm controller and the observation
codecs read contention from. It is pure (no I/O) and keyed by job id (any hashable); a job's
performance-model key ``(model, total GPUs, nodes)`` is built by :func:`job_key` and nowhere else.

Costs: :meth:`ContentionLedger.add` and :meth:`~ContentionLedger.remove` touch only the
multi-node jobs on the job's nodes (every rule is local to a node: a job's CS depends only on
the jobs sharing its nodes; their CS is recomputed from the rule, so the result does not depend
on the order of earlier adds and removes beyond the order of jobs on a node, and for ``ds-min``
and ``link`` not even on that);
:meth:`~ContentionLedger.what_if` prices a placement without changing anything (:meth:`~ContentionLedger.price`:
the newcomer alone, its neighbours taken in add order or in job-id order);
:meth:`~ContentionLedger.fork` is O(1) and gives a writable overlay for trying changes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Hashable, Iterable, Iterator, NamedTuple, Protocol

from policies.workloads import get_workload

if TYPE_CHECKING:
    from policies.cluster import Placement

__all__ = [
    "MIN_RATIO",
    "CS_CAP",
    "DS_MIN_RATIO",
    "DS_CS_CAP",
    "CONTENTION_RULES",
    "check_contention",
    "contention_of",
    "LinkContention",
    "fair_share",
    "JobKey",
    "PairContention",
    "LinkLoad",
    "ContentionLedger",
    "StaleLedgerError",
    "job_key",
    "node_cs",
    "job_cs",
    "cap_cs",
]

#: Lower bound on achieved / isolated throughput of a job however many neighbours it has (the seed
#: uses 0.35 as a floor on one neighbour; this one bounds the sum over neighbours).
MIN_RATIO = 0.1
#: Largest contention sensitivity of a job: ``1 / MIN_RATIO``.
CS_CAP = 1.0 / MIN_RATIO

#: DeepShare's floor on a job's achieved / isolated throughput on a node (``safety_min`` of its
#: simulator, ``scheduler/cluster_env.py``): the ``ds-min`` rule's bound.
DS_MIN_RATIO = 0.35
#: Largest CS under the ``ds-min`` rule: ``1 / DS_MIN_RATIO``.
DS_CS_CAP = 1.0 / DS_MIN_RATIO

#: The contention rules (module docstring): ``sum`` (the default), ``link``, ``ds-min``.
CONTENTION_RULES = ("sum", "link", "ds-min")


def check_contention(rule: str) -> str:
    """``rule`` if it is one of :data:`CONTENTION_RULES`; otherwise :class:`ValueError` in one line."""
    if rule not in CONTENTION_RULES:
        raise ValueError(f"unknown contention rule {rule!r}: choose one of {', '.join(CONTENTION_RULES)}")
    return rule


def contention_of(perf: object) -> str:
    """The contention rule a performance model asks for: its ``contention`` attribute, ``"sum"`` if none."""
    return getattr(perf, "contention", "sum")


#: ``(model, total GPUs, number of nodes)``: what a job's throughput depends on.
JobKey = tuple[str, int, int]


class PairContention(Protocol):
    """The part of a performance model (:class:`policies.perf.PerformanceModel`) the ledger needs."""

    def pair_cs(self, a: JobKey, b: JobKey) -> float:
        """CS (>= 1) that job ``a`` suffers from sharing a node's link with job ``b``
        (1 unless both span several nodes)."""


class LinkContention(PairContention, Protocol):
    """What the ``link`` rule needs besides :meth:`pair_cs` (:class:`policies.perf.ContentionModel`)."""

    #: Capacity ``C`` of one node's network link (MB/s).
    link_capacity_mbps: float

    def link_terms(self, key: JobKey) -> tuple[float, float]:
        """``(d, chi)`` of a job: its bandwidth demand on each of its nodes' links (MB/s, >= 0) and
        the share of its step spent communicating (in [0, 1]); ``(0, 0)`` for a single-node job."""


def fair_share(capacity: float, mine: float, others: Iterable[float]) -> float:
    """Max-min fair (water-filling) share of ``capacity`` of a flow demanding ``mine`` among flows
    demanding ``others`` (same unit): ``min(mine, level)``, where ``level`` is the water level at
    which the demands below it plus ``level`` for every other flow fill the capacity (``mine``
    itself when all demands fit). Independent of the order of ``others``."""
    ds = sorted(others)
    total = mine + sum(ds)
    if total <= capacity:
        return mine
    ds.append(mine)
    ds.sort()
    left = capacity
    k = len(ds)
    for i, d in enumerate(ds):
        level = left / (k - i)
        if d > level:
            return mine if mine < level else level
        left -= d
    return mine  # not reached: the demands exceed the capacity


def job_key(model: str, placement: "Placement") -> JobKey:
    """The performance-model key of ``model`` running on ``placement``:
    ``(model, placement.total_gpus, placement.num_nodes)``."""
    return (model, placement.total_gpus, placement.num_nodes)


def node_cs(perf: PairContention, me: JobKey, others: Iterable[JobKey]) -> float:
    """CS of multi-node job ``me`` on one node shared with jobs ``others`` (single-node jobs among
    them count for nothing), by ``perf``'s rule (:func:`contention_of`, module docstring):

    * ``sum``: ``1 + sum(pair_cs - 1)`` summed in the order of ``others``, uncapped
      (:func:`cap_cs` caps the job);
    * ``ds-min``: the largest ``pair_cs``, at least 1 and at most :data:`DS_CS_CAP`;
    * ``link``: ``1 + chi (min(d, C) / x - 1)`` with ``x`` ``me``'s :func:`fair_share` of the link.
    """
    return _node_rule(perf)(perf, me, others)


def _sum_node_cs(perf: PairContention, me: JobKey, others: Iterable[JobKey]) -> float:
    """The ``sum`` rule on one node (:func:`node_cs`)."""
    extra = 0.0
    pair = perf.pair_cs
    for other in others:
        extra += pair(me, other) - 1.0
    return 1.0 + extra


def _ds_min_node_cs(perf: PairContention, me: JobKey, others: Iterable[JobKey]) -> float:
    """The ``ds-min`` rule on one node (:func:`node_cs`)."""
    worst = 1.0
    pair = perf.pair_cs
    for other in others:
        c = pair(me, other)
        if c > worst:
            worst = c
    return worst if worst < DS_CS_CAP else DS_CS_CAP


def _link_node_cs(perf: LinkContention, me: JobKey, others: Iterable[JobKey]) -> float:
    """The ``link`` rule on one node (:func:`node_cs`)."""
    d, chi = perf.link_terms(me)
    if d <= 0.0 or chi <= 0.0:
        return 1.0
    terms = perf.link_terms
    demands = [terms(o)[0] for o in others if o[2] > 1]
    cap = perf.link_capacity_mbps
    x = fair_share(cap, d, demands)
    alone = d if d < cap else cap  # the rate it has alone, already part of its isolated throughput
    if x >= alone:
        return 1.0
    return 1.0 + chi * (alone / x - 1.0)


_NODE_RULES: dict[str, Callable[[Any, JobKey, Iterable[JobKey]], float]] = {
    "sum": _sum_node_cs,
    "ds-min": _ds_min_node_cs,
    "link": _link_node_cs,
}


def _node_rule(perf: object) -> Callable[[Any, JobKey, Iterable[JobKey]], float]:
    """:func:`node_cs` of ``perf``'s rule."""
    rule = getattr(perf, "contention", "sum")
    f = _NODE_RULES.get(rule)
    if f is None:
        raise ValueError(f"unknown contention rule {rule!r}: choose one of {', '.join(CONTENTION_RULES)}")
    return f


def cap_cs(worst: float, perf: PairContention | None = None) -> float:
    """A job's CS from the largest :func:`node_cs` over its nodes, by ``perf``'s rule: at least 1;
    at most :data:`CS_CAP` under ``sum`` (also when ``perf`` is None), at most :data:`DS_CS_CAP`
    under ``ds-min``, unbounded under ``link``."""
    if worst < 1.0:
        return 1.0
    rule = "sum" if perf is None else getattr(perf, "contention", "sum")
    if rule == "sum":
        return worst if worst < CS_CAP else CS_CAP
    if rule == "ds-min":
        return worst if worst < DS_CS_CAP else DS_CS_CAP
    return worst


def job_cs(perf: PairContention, me: JobKey, per_node: Iterable[Iterable[JobKey]]) -> float:
    """CS of job ``me`` given, for each of its nodes, the other jobs there (>= 1), by ``perf``'s rule.

    1 for a single-node job (``me[2] <= 1``); otherwise :func:`cap_cs` of the largest :func:`node_cs`.
    """
    if me[2] <= 1:
        return 1.0
    rule = _node_rule(perf)
    worst = 1.0
    for others in per_node:
        c = rule(perf, me, others)
        if c > worst:
            worst = c
    return cap_cs(worst, perf)


class LinkLoad(NamedTuple):
    """The load on one node's network link.

    :param jobs: ids of the multi-node jobs on the node, in the order they were added.
    :param bandwidth_mbps: their summed average bandwidth demand (MB/s; seed 002, Table I, per job
        of each model: :attr:`policies.workloads.WorkloadProfile.bandwidth_mbps`).
    """

    jobs: tuple[Hashable, ...]
    bandwidth_mbps: float


class StaleLedgerError(RuntimeError):
    """A fork is read or written after the ledger it was forked from changed."""


class _Entry:
    """One job of the ledger (never mutated: a change replaces the entry)."""

    __slots__ = ("key", "placement", "cs", "info", "seq")

    def __init__(self, key: JobKey, placement: "Placement", cs: float, info: Any, seq: int) -> None:
        self.key = key
        self.placement = placement
        self.cs = cs
        self.info = info
        self.seq = seq  # add order (a re-added job gets a new one)


_MISSING = object()
_new = object.__new__
_EMPTY: dict = {}


class ContentionLedger:
    """Running jobs' placements and each one's contention sensitivity, kept up to date incrementally.

    :param perf: prices a pair of jobs (:meth:`PairContention.pair_cs`); any
        :class:`~policies.perf.PerformanceModel`.

    Every job (single- or multi-node) is added with :meth:`add` under a unique id; only multi-node
    jobs enter the per-node link index and have a CS above 1. On one node, jobs are kept in the
    order they were added, and the sums of :func:`node_cs` follow that order (:meth:`price` and
    :meth:`node_keys` can use increasing job id instead, an order that does not depend on the adds).

    A ledger built by :meth:`fork` is an overlay on its origin: O(1) to make, it reads through
    to the origin and keeps its own changes. It is valid while the origin is unchanged; any use
    after the origin changed raises :class:`StaleLedgerError` (:attr:`valid` says which).
    ``fork(read_only=True)`` gives a view that refuses :meth:`add` and :meth:`remove`.

    It also counts the multi-node jobs by shape, ``(total GPUs, nodes)`` (:meth:`spans`), so that a
    policy asks whether any job spans more nodes than it needs without a pass over the jobs.

    :param num_nodes: the cluster's node count, if known: the ledger then also keeps every node's
        number of multi-node jobs as one byte per node (:meth:`load_bytes`), for searches over the
        whole cluster in C.
    """

    __slots__ = ("perf", "_jobs", "_nodes", "_base", "_base_version", "_version", "_read_only", "_seq",
                 "_lb", "_lb_own", "_lb_bytes", "_sum", "_pairs", "_shapes", "_shapes_own")

    def __init__(self, perf: PairContention, num_nodes: int | None = None) -> None:
        self.perf = perf
        self._sum = contention_of(perf) == "sum"  # the rule is read from `perf` once, here
        self._pairs: dict[JobKey, dict[JobKey, float]] = {}  # perf.pair_cs memo, [a][b] (shared by forks and copies)
        self._lb: bytearray | None = None if num_nodes is None else bytearray(num_nodes)
        self._lb_own = True  # whether _lb is this ledger's own (a fork shares its origin's until it writes)
        self._lb_bytes: bytes | None = None
        # multi-node jobs by (total GPUs, nodes): {shape: count}, every count > 0 (a fork shares its
        # origin's until it writes)
        self._shapes: dict[tuple[int, int], int] = {}
        self._shapes_own = True
        self._jobs: dict[Hashable, _Entry | None] = {}  # None: removed (in a fork)
        self._nodes: dict[int, dict[Hashable, JobKey]] = {}  # multi-node jobs per node (a fork: every node it touched)
        self._base: ContentionLedger | None = None
        self._base_version = 0
        self._version = 0
        self._read_only = False
        self._seq = 0

    @classmethod
    def from_jobs(cls, perf: PairContention, jobs: Iterable[tuple[Hashable, str, "Placement", Any]],
                  num_nodes: int | None = None, known_cs: Callable[[Any], float] | None = None) -> "ContentionLedger":
        """A ledger of ``(job id, model, placement, info)`` tuples added in that order.

        :param known_cs: ``info -> CS`` of a job, when the caller already has every job's CS by this
            rule and order (e.g. read from its :class:`~policies.state.JobInfo`): the ledger takes those
            instead of computing each one (O(jobs) rather than O(jobs x nodes x neighbours)). Jobs
            whose CS a later :meth:`add` or :meth:`remove` changes are recomputed by the rule as usual;
            :meth:`check` compares against a recomputation.
        """
        led = cls(perf, num_nodes)
        have = led._jobs
        insert = led._insert
        for job_id, model, placement, info in jobs:
            if job_id in have:
                raise ValueError(f"job {job_id!r} is already in the contention ledger")
            key = (model, placement.total_gpus, placement.num_nodes)  # job_key(model, placement)
            insert(job_id, key, placement, info, float(known_cs(info)) if known_cs is not None and key[2] > 1 else 1.0)
        if known_cs is None:
            led._refresh_all()
        return led

    # ------------------------------------------------------------------ reading
    @property
    def version(self) -> int:
        """Number of changes (:meth:`add`, :meth:`remove`) made to this ledger so far."""
        return self._version

    @property
    def valid(self) -> bool:
        """False for a fork whose origin changed since it was made."""
        b = self._base
        return b is None or b._version == self._base_version

    def _check(self) -> None:
        b = self._base
        if b is not None and b._version != self._base_version:
            raise StaleLedgerError("this contention ledger was forked from one that has changed since")

    def _get(self, job_id: Hashable) -> _Entry | None:
        e = self._jobs.get(job_id, _MISSING)
        if e is _MISSING:
            b = self._base
            return None if b is None else b._jobs.get(job_id)  # type: ignore[return-value]
        return e  # type: ignore[return-value]

    def _node(self, v: int) -> dict[Hashable, JobKey]:
        d = self._nodes.get(v)
        if d is None:
            b = self._base
            if b is not None:
                d = b._nodes.get(v)
        return _EMPTY if d is None else d

    def _entry(self, job_id: Hashable) -> _Entry:
        self._check()
        e = self._get(job_id)
        if e is None:
            raise KeyError(f"job {job_id!r} is not in the contention ledger")
        return e

    def __contains__(self, job_id: object) -> bool:
        self._check()
        return self._get(job_id) is not None  # type: ignore[arg-type]

    def _entries(self) -> list[tuple[Hashable, _Entry]]:
        """(id, entry) of every job, in add order."""
        b = self._base
        if b is None:
            return [(k, e) for k, e in self._jobs.items() if e is not None]
        out = [(k, e) for k, e in b._jobs.items() if k not in self._jobs]
        out += [(k, e) for k, e in self._jobs.items() if e is not None]
        out.sort(key=lambda ke: ke[1].seq)  # type: ignore[union-attr]
        return out  # type: ignore[return-value]

    def __iter__(self) -> Iterator[Hashable]:
        """Job ids in the order they were added."""
        self._check()
        return iter([k for k, _e in self._entries()])

    def __len__(self) -> int:
        self._check()
        b = self._base
        if b is None:
            return len(self._jobs)
        n = len(b._jobs)
        for k, e in self._jobs.items():
            n += (e is not None) - (k in b._jobs)
        return n

    def cs(self, job_id: Hashable) -> float:
        """Contention sensitivity of a job in the ledger (isolated / achieved throughput, >= 1)."""
        e = self._jobs.get(job_id)
        if e is None or self._base is not None:
            e = self._entry(job_id)
        return e.cs

    def key(self, job_id: Hashable) -> JobKey:
        """``(model, total GPUs, nodes)`` of a job in the ledger (:func:`job_key`)."""
        return self._entry(job_id).key

    def placement(self, job_id: Hashable) -> "Placement":
        """Where a job of the ledger runs."""
        return self._entry(job_id).placement

    def info(self, job_id: Hashable) -> Any:
        """What was passed as ``info`` when the job was added (e.g. its :class:`~policies.state.JobInfo`)."""
        return self._entry(job_id).info

    def neighbours(self, node: int) -> tuple[Hashable, ...]:
        """Ids of the multi-node jobs on ``node``, in the order they were added."""
        self._check()
        return tuple(self._node(node))

    def load_bytes(self) -> bytes | None:
        """Every node's number of multi-node jobs (at most 255), one byte per node, or ``None`` if
        the ledger was made without ``num_nodes``."""
        self._check()
        lb = self._lb
        if lb is None:
            return None
        if self._lb_bytes is None:
            self._lb_bytes = bytes(lb)
        return self._lb_bytes

    def spans(self) -> dict[tuple[int, int], int]:
        """``{(total GPUs, nodes): number of jobs}`` of the multi-node jobs (a copy; O(shapes), not
        O(jobs): kept up to date by :meth:`add` and :meth:`remove`)."""
        self._check()
        return dict(self._shapes)

    def load(self, node: int) -> int:
        """Number of multi-node jobs on ``node``."""
        d = self._nodes.get(node)
        b = self._base
        if b is not None:
            if b._version != self._base_version:
                self._check()
            if d is None:
                d = b._nodes.get(node)
        return 0 if d is None else len(d)

    def loads(self) -> dict[int, int]:
        """``{node: number of multi-node jobs}`` for every node that has at least one."""
        self._check()
        b = self._base
        out = {} if b is None else {v: len(d) for v, d in b._nodes.items() if d}
        for v, d in self._nodes.items():
            if d:
                out[v] = len(d)
            else:
                out.pop(v, None)
        return out

    def link_load(self, node: int) -> LinkLoad:
        """The multi-node jobs on ``node`` and their summed bandwidth demand (MB/s, Table I)."""
        self._check()
        d = self._node(node)
        bw = 0.0
        for key in d.values():
            bw += get_workload(key[0]).bandwidth_mbps
        return LinkLoad(tuple(d), bw)

    # ------------------------------------------------------------------ the rule, on ledger data
    def _cs_on(self, job_id: Hashable, key: JobKey, nodes: Iterable[int], extra: dict[int, JobKey] | None = None,
               exclude: Hashable = _MISSING, by_id: bool = False) -> float:
        """CS of ``key`` on ``nodes`` against the multi-node jobs there other than ``job_id`` and
        ``exclude``, plus ``extra[v]`` (a job placed last on node ``v``); summed on each node in add
        order, or in increasing job id when ``by_id``."""
        if key[2] <= 1:
            return 1.0
        if self._sum and extra is None and exclude is _MISSING and not by_id:
            return self._sum_cs(job_id, key, nodes)
        perf = self.perf
        rule = _node_rule(perf)
        worst = 1.0
        skip = [x for x in (job_id, exclude) if x is not _MISSING]  # ids to leave out (compared by value)
        for v in nodes:
            d = self._node(v)
            if by_id:
                others = [d[o] for o in sorted(d) if o not in skip]
            elif not skip:
                others = list(d.values())
            elif len(skip) == 1:
                s0 = skip[0]
                others = [k for o, k in d.items() if o != s0]
            else:
                others = [k for o, k in d.items() if o not in skip]
            if extra is not None and v in extra:
                others.append(extra[v])
            c = rule(perf, key, others)
            if c > worst:
                worst = c
        return cap_cs(worst, perf)

    def _sum_cs(self, job_id: Hashable, key: JobKey, nodes: Iterable[int]) -> float:
        """:meth:`_cs_on` under the ``sum`` rule without ``extra``, ``exclude`` or ``by_id``: the same
        additions in the same order as :func:`node_cs` (so the same float), with ``pair_cs`` read
        through this ledger's memo."""
        row = self._pairs.get(key)
        if row is None:
            row = self._pairs[key] = {}
        pair = self.perf.pair_cs
        own = self._nodes
        b = self._base
        base = None if b is None else b._nodes
        worst = 1.0
        for v in nodes:
            d = own.get(v)
            if d is None and base is not None:
                d = base.get(v)
            if not d:
                continue  # no neighbour: CS 1 on this node
            extra = 0.0
            for o, k in d.items():
                if o != job_id:
                    c = row.get(k)
                    if c is None:
                        c = row[k] = pair(key, k)
                    extra += c - 1.0
            c = 1.0 + extra
            if c > worst:
                worst = c
        return worst if worst < CS_CAP else CS_CAP

    def node_keys(self, node: int, by_id: bool = False) -> tuple[JobKey, ...]:
        """Keys (:func:`job_key`) of the multi-node jobs on ``node``: in the order they were added, or
        in increasing job id when ``by_id`` (the ids must then be comparable, e.g. all ``str``)."""
        self._check()
        d = self._node(node)
        if by_id:
            return tuple(d[o] for o in sorted(d))
        return tuple(d.values())

    def price(self, model: str, placement: "Placement", exclude: Hashable = None, by_id: bool = False) -> float:
        """The CS a new job ``model`` would have on ``placement`` (:meth:`what_if`'s first value),
        without pricing its neighbours and without changing anything.

        :param exclude: a job id to leave out (e.g. the job itself, if the ledger holds it); ``None``: none.
        :param by_id: sum each node's neighbours in increasing job id (a canonical order, whatever
            order the jobs were added in) rather than in add order.
        """
        self._check()
        return self._cs_on(_MISSING, job_key(model, placement), placement.nodes,
                           exclude=_MISSING if exclude is None else exclude, by_id=by_id)

    def what_if(self, model: str, placement: "Placement", exclude: Hashable = None) -> tuple[float, dict[Hashable, float]]:
        """Price a new job without adding it.

        :param exclude: a job id to leave out (e.g. the job itself, if the ledger holds it); ``None``:
            none.
        :returns: the newcomer's CS on ``placement`` (:meth:`price`), and ``{id: CS it would have}``
            for every multi-node job on the placement's nodes (first seen over the nodes in placement
            order, then in add order on a node) when the newcomer spans several nodes; ``{}``
            otherwise (a single-node job slows nobody).
        """
        self._check()
        ex = _MISSING if exclude is None else exclude
        key = job_key(model, placement)
        nodes = placement.nodes
        cs_me = self._cs_on(_MISSING, key, nodes, exclude=ex)
        out: dict[Hashable, float] = {}
        if key[2] <= 1:
            return cs_me, out
        extra = {v: key for v in nodes}
        for v in nodes:
            for o in self._node(v):
                if o == ex or o in out:
                    continue
                e = self._get(o)
                assert e is not None
                out[o] = self._cs_on(o, e.key, e.placement.nodes, extra, exclude=ex)
        return cs_me, out

    # ------------------------------------------------------------------ changes
    def _writable(self) -> None:
        if self._read_only:
            raise RuntimeError("this contention ledger is read-only: fork() it to make changes")
        self._check()

    def freeze(self) -> "ContentionLedger":
        """Make this ledger read-only (:meth:`add` and :meth:`remove` raise from now on); returns it."""
        self._read_only = True
        return self

    def _node_w(self, v: int) -> dict[Hashable, JobKey]:
        d = self._nodes.get(v)
        if d is None:
            b = self._base
            src = None if b is None else b._nodes.get(v)
            d = {} if not src else dict(src)
            self._nodes[v] = d
        return d

    def _lb_w(self) -> bytearray | None:
        """This ledger's own per-node load bytes, to change (copied from the origin on first write)."""
        self._lb_bytes = None
        if not self._lb_own and self._lb is not None:
            self._lb = bytearray(self._lb)
            self._lb_own = True
        return self._lb

    def _shapes_w(self) -> dict[tuple[int, int], int]:
        """This ledger's own :meth:`spans` counts, to change (copied from the origin on first write)."""
        if not self._shapes_own:
            self._shapes = dict(self._shapes)
            self._shapes_own = True
        return self._shapes

    def _shape_gone(self, key: JobKey) -> None:
        """One multi-node job of ``key``'s shape less in the :meth:`spans` counts."""
        shapes = self._shapes if self._shapes_own else self._shapes_w()
        shape = (key[1], key[2])
        left = shapes[shape] - 1
        if left:
            shapes[shape] = left
        else:
            del shapes[shape]

    def _insert(self, job_id: Hashable, key: JobKey, placement: "Placement", info: Any, cs: float = 1.0) -> None:
        if key[2] > 1 and self._lb is not None and max(placement.nodes) >= len(self._lb):
            raise ValueError(f"job {job_id!r}: placement {placement} uses a node beyond the ledger's {len(self._lb)}")
        self._seq += 1
        self._jobs[job_id] = _Entry(key, placement, cs, info, self._seq)
        if key[2] > 1:
            shapes = self._shapes_w()
            shape = (key[1], key[2])
            shapes[shape] = shapes.get(shape, 0) + 1
            lb = self._lb_w()
            for v in placement.nodes:
                d = self._node_w(v)
                d[job_id] = key
                if lb is not None:
                    lb[v] = min(len(d), 255)

    def _set_cs(self, job_id: Hashable, e: _Entry, cs: float) -> None:
        self._jobs[job_id] = _Entry(e.key, e.placement, cs, e.info, e.seq)

    def _refresh(self, ids: Iterable[Hashable]) -> set[Hashable]:
        """Recompute the CS of ``ids``; returns those whose CS changed."""
        changed: set[Hashable] = set()
        for o in ids:
            e = self._get(o)
            assert e is not None
            cs = self._cs_on(o, e.key, e.placement.nodes)
            if cs != e.cs:
                self._set_cs(o, e, cs)
                changed.add(o)
        return changed

    def _refresh_all(self) -> None:
        for o, e in self._entries():
            if e.key[2] > 1:
                cs = self._cs_on(o, e.key, e.placement.nodes)
                if cs != e.cs:
                    self._set_cs(o, e, cs)

    def _on_nodes(self, placement: "Placement", skip: Hashable) -> dict[Hashable, None]:
        """Multi-node jobs on ``placement``'s nodes other than ``skip``, first seen first."""
        out: dict[Hashable, None] = {}
        for v in placement.nodes:
            for o in self._node(v):
                if o != skip:
                    out[o] = None
        return out

    def add(self, job_id: Hashable, model: str, placement: "Placement", info: Any = None,
            key: JobKey | None = None) -> set[Hashable]:
        """Add a running job; returns the ids of the *other* jobs whose CS changed.

        Costs O(multi-node jobs on ``placement``'s nodes, times their nodes).

        :param info: anything to keep with the job (:meth:`info`), e.g. its
            :class:`~policies.state.JobInfo`.
        :param key: ``job_key(model, placement)`` where the caller has it (kept as the job's :meth:`key`).
        :raises ValueError: the id is already in the ledger.
        """
        if key is None:
            key = job_key(model, placement)
        if placement.num_nodes == 1 and self._base is None and not self._read_only:  # on no link: O(1)
            if job_id in self._jobs:
                raise ValueError(f"job {job_id!r} is already in the contention ledger")
            self._seq += 1
            e = self._jobs[job_id] = _new(_Entry)  # _Entry(key, placement, 1.0, info, seq), its slots set directly
            e.key, e.placement, e.cs, e.info, e.seq = key, placement, 1.0, info, self._seq
            self._version += 1
            return set()
        if self._sum and self._base is None and not self._read_only:
            own, lb = self._nodes, self._lb
            nodes = placement.nodes
            for v in nodes:
                if own.get(v):
                    break
            else:  # no multi-node job on any of its nodes: its CS is 1 and nobody's changes (O(its nodes))
                if job_id in self._jobs:
                    raise ValueError(f"job {job_id!r} is already in the contention ledger")
                if lb is not None and max(nodes) >= len(lb):
                    raise ValueError(f"job {job_id!r}: placement {placement} uses a node beyond the ledger's {len(lb)}")
                self._seq += 1
                e = self._jobs[job_id] = _new(_Entry)  # _Entry(key, placement, 1.0, info, seq), set directly
                e.key, e.placement, e.cs, e.info, e.seq = key, placement, 1.0, info, self._seq
                shapes = self._shapes if self._shapes_own else self._shapes_w()
                shape = (key[1], key[2])
                shapes[shape] = shapes.get(shape, 0) + 1
                self._lb_bytes = None  # self._lb_w(), of the origin (its own bytes)
                if lb is None:
                    for v in nodes:
                        own[v] = {job_id: key}
                else:
                    for v in nodes:
                        own[v] = {job_id: key}
                        lb[v] = 1
                self._version += 1
                return set()
        self._writable()
        if self._get(job_id) is not None:
            raise ValueError(f"job {job_id!r} is already in the contention ledger")
        self._insert(job_id, key, placement, info)
        self._version += 1
        if key[2] <= 1:
            return set()
        e = self._jobs[job_id]
        assert e is not None
        cs = self._cs_on(job_id, key, placement.nodes)
        if cs != 1.0:
            self._set_cs(job_id, e, cs)
        return self._refresh(self._on_nodes(placement, job_id))

    def remove(self, job_id: Hashable) -> set[Hashable]:
        """Remove a job; returns the ids of the remaining jobs whose CS changed.

        Costs O(multi-node jobs on its nodes, times their nodes).

        :raises KeyError: the id is not in the ledger.
        """
        if self._base is None and not self._read_only:
            e = self._jobs.get(job_id)
            if e is not None and e.key[2] <= 1:  # on no link: O(1)
                del self._jobs[job_id]
                self._version += 1
                return set()
            if e is not None:
                own = self._nodes
                nodes = e.placement.nodes
                for v in nodes:
                    if len(own[v]) != 1:
                        break
                else:  # alone on each of its nodes: nobody's CS changes (O(its nodes))
                    del self._jobs[job_id]
                    self._version += 1
                    self._shape_gone(e.key)
                    self._lb_bytes = None  # self._lb_w(), of the origin (its own bytes)
                    lb = self._lb
                    if lb is None:
                        for v in nodes:
                            del own[v]
                    else:
                        for v in nodes:
                            del own[v]
                            lb[v] = 0
                    return set()
        self._writable()
        e = self._get(job_id)
        if e is None:
            raise KeyError(f"job {job_id!r} is not in the contention ledger")
        self._version += 1
        b = self._base
        if b is not None and job_id in b._jobs:
            self._jobs[job_id] = None  # hides the origin's entry
        else:
            del self._jobs[job_id]
        if e.key[2] <= 1:
            return set()
        self._shape_gone(e.key)
        fork = self._base is not None
        lb = self._lb_w()
        for v in e.placement.nodes:
            d = self._node_w(v)
            del d[job_id]
            if lb is not None:
                lb[v] = min(len(d), 255)
            if not d and not fork:
                del self._nodes[v]
        return self._refresh(self._on_nodes(e.placement, job_id))

    # ------------------------------------------------------------------ copies and the oracle
    def fork(self, read_only: bool = False) -> "ContentionLedger":
        """An overlay on this ledger: O(1) to make (O(changes) for a fork of a fork), reads through,
        keeps its own changes; valid while this ledger is unchanged (then :class:`StaleLedgerError`)."""
        self._check()
        f = ContentionLedger.__new__(ContentionLedger)
        f.perf = self.perf
        f._sum, f._pairs = self._sum, self._pairs
        f._read_only = read_only
        f._seq = self._seq
        f._version = 0
        f._lb_bytes = self._lb_bytes
        if self._base is None or not self._shapes_own:  # share the origin's until one writes (_shapes_w)
            f._shapes, f._shapes_own = self._shapes, False
        else:  # this fork's own counts, which it may change: the new fork takes a copy
            f._shapes, f._shapes_own = dict(self._shapes), True
        if self._base is None or not self._lb_own:  # share until one writes
            f._lb, f._lb_own = self._lb, self._lb is None
        else:  # this fork has its own, which it may change: the new fork takes a copy
            f._lb, f._lb_own = bytearray(self._lb) if self._lb is not None else None, True
        if self._base is None:
            f._base, f._base_version = self, self._version
            f._jobs, f._nodes = {}, {}
        else:  # flatten: overlay the same origin, with a copy of this fork's changes
            f._base, f._base_version = self._base, self._base_version
            f._jobs = dict(self._jobs)
            f._nodes = {v: dict(d) for v, d in self._nodes.items()}
        return f

    def copy(self) -> "ContentionLedger":
        """An independent, writable ledger with the same jobs, CS and per-node order.
        O(jobs + loaded nodes)."""
        self._check()
        c = ContentionLedger(self.perf)
        c._pairs = self._pairs
        c._lb = None if self._lb is None else bytearray(self._lb)
        c._shapes = dict(self._shapes)
        b = self._base
        if b is not None and not self._jobs and not self._nodes:  # a fork without changes: its origin's
            c._jobs = dict(b._jobs)
            c._nodes = {v: dict(d) for v, d in b._nodes.items() if d}
        elif b is None:
            c._jobs = dict(self._jobs)
            c._nodes = {v: dict(d) for v, d in self._nodes.items()}
        else:
            c._jobs = dict(self._entries())
            c._nodes = {v: dict(d) for v, d in self._node_items()}
        c._seq = self._seq
        return c

    def _node_items(self) -> list[tuple[int, dict[Hashable, JobKey]]]:
        """``(node, {id: key})`` of every node with multi-node jobs (dicts not to be changed), in node order."""
        b = self._base
        nodes = dict(b._nodes) if b is not None else {}
        nodes.update(self._nodes)
        return [(v, d) for v, d in sorted(nodes.items()) if d]

    def recompute(self) -> "ContentionLedger":
        """A new ledger of the same jobs (same placements, same add order) built from scratch:
        the oracle the incremental one must equal (:meth:`check`)."""
        self._check()
        return ContentionLedger.from_jobs(
            self.perf, ((k, e.key[0], e.placement, e.info) for k, e in self._entries()),
            None if self._lb is None else len(self._lb)
        )

    def check(self, rel_tol: float = 1e-12) -> None:
        """Raise :class:`AssertionError` naming the first difference between this ledger and
        :meth:`recompute` (the jobs, the multi-node jobs per node and their order, each job's key
        and CS within ``rel_tol``)."""
        ref = self.recompute()
        mine = self._entries()
        theirs = ref._entries()
        if [k for k, _ in mine] != [k for k, _ in theirs]:
            raise AssertionError("contention ledger: job set or order differs from a recomputation")
        for (k, e), (_, r) in zip(mine, theirs):
            if e.key != r.key or e.placement != r.placement:
                raise AssertionError(f"contention ledger: job {k!r}: key {e.key} / {e.placement} != {r.key} / {r.placement}")
            if abs(e.cs - r.cs) > rel_tol * r.cs:
                raise AssertionError(f"contention ledger: job {k!r}: CS {e.cs!r}, recomputed {r.cs!r}")
        a = [(v, list(d.items())) for v, d in self._node_items()]
        b = [(v, list(d.items())) for v, d in ref._node_items()]
        if a != b:
            for (va, da), (vb, db) in zip(a, b):
                if (va, da) != (vb, db):
                    raise AssertionError(f"contention ledger: node {min(va, vb)}: multi-node jobs {da} != recomputed {db}")
            raise AssertionError(f"contention ledger: {len(a)} loaded nodes, recomputed {len(b)}")
        if self._lb != ref._lb:
            raise AssertionError("contention ledger: per-node load bytes differ from a recomputation")
        if self._shapes != ref._shapes:
            raise AssertionError(f"contention ledger: multi-node jobs by shape {self._shapes} != recomputed {ref._shapes}")

    def __repr__(self) -> str:
        return f"ContentionLedger({len(self)} jobs, {len(self.loads())} loaded nodes)"
