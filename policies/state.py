"""The cluster state a policy sees, and the decision it returns.

Both backends build the same :class:`ClusterState`: the simulator
(:mod:`trainer.simulator`) from its event loop, the controller
(:mod:`controller`) from Slurm. Policies are pure functions of it.

Units: times in seconds, work in samples, service in GPU-seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import numpy as np

from policies.cluster import ClusterSpec, Placement
from policies.ledger import ContentionLedger, PairContention
from policies.resources import Allocation, ResourceDemand, free_cpu_mem

__all__ = ["JobInfo", "MeasuredSpeeds", "ClusterState", "Decision", "time_key", "TIME_KEY_DECIMALS", "TIME_KEY_SCALE"]

_isfinite = math.isfinite

#: Decimals (of a second) that time-based ordering keys are rounded to, see :func:`time_key`.
TIME_KEY_DECIMALS = 3
#: ``10 ** TIME_KEY_DECIMALS``: ``floor(t * TIME_KEY_SCALE + 0.5) / TIME_KEY_SCALE`` is :func:`time_key`
#: written out (hot loops inline it; 3x cheaper than ``round(t, 3)``)
TIME_KEY_SCALE = 10.0**TIME_KEY_DECIMALS


def time_key(seconds: float) -> float:
    """An estimated time (s) as an ordering key: rounded to :data:`TIME_KEY_DECIMALS` decimals.

    Jobs of equal length get estimates that differ only by float rounding
    (``total_samples / best_thp`` is 3600.0 for one model and demand, 3599.9999999999995 for
    another), and unrounded that noise, not the tie-break that follows (submit time, then
    job id), would decide their order."""
    return math.floor(seconds * TIME_KEY_SCALE + 0.5) / TIME_KEY_SCALE


@dataclass(frozen=True)
class MeasuredSpeeds:
    """A job's isolated throughput measured live, by placement shape.

    :param by_shape: ``((gpus, servers, samples_per_s), ...)``: the job ran alone at ``samples_per_s``
        (samples/s) on a placement of ``gpus`` GPUs over ``servers`` servers, as its node agents
        measured it (their ``profiled-alone`` measurement). Sorted by ``(gpus, servers)``, one entry
        per shape; ``1 <= servers <= gpus``, speeds finite and > 0 (:class:`ValueError` otherwise).

    The controller fills :attr:`JobInfo.measured_speeds` from agent reports
    (:func:`controller.state.build_state`); the simulator never does (its performance model is the
    truth there). Shapes not measured are for the reader to model (:mod:`policies.codecs.sced2`
    scales the performance model by the nearest measured shape).
    """

    by_shape: tuple[tuple[int, int, float], ...] = ()

    def __post_init__(self) -> None:
        last: tuple[int, int] | None = None
        for e in self.by_shape:
            if not (isinstance(e, tuple) and len(e) == 3):
                raise ValueError(f"measured speeds: entry {e!r} is not (gpus, servers, samples_per_s)")
            g, n, v = e
            if any(isinstance(x, bool) or not isinstance(x, (int, np.integer)) for x in (g, n)) or not 1 <= n <= g:
                raise ValueError(f"measured speeds: entry {e!r} needs integers 1 <= servers <= gpus")
            if not _is_number(v) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"measured speeds: entry {e!r} needs a finite samples_per_s > 0")
            if last is not None and (g, n) <= last:
                raise ValueError(f"measured speeds: shapes must be sorted and distinct, got {(g, n)} after {last}")
            last = (g, n)

    def at(self, gpus: int, servers: int) -> float | None:
        """Samples/s measured on ``gpus`` GPUs over ``servers`` servers, or ``None``."""
        for g, n, v in self.by_shape:
            if g == gpus and n == servers:
                return v
        return None

    def nearest(self, gpus: int, servers: int) -> tuple[int, float] | None:
        """``(servers', samples_per_s)`` of the measured ``gpus``-GPU shape whose server count is closest
        to ``servers`` (the fewer servers on a tie), or ``None`` when none of ``gpus`` GPUs was measured."""
        best: tuple[int, float] | None = None
        for g, n, v in self.by_shape:
            if g == gpus and (best is None or abs(n - servers) < abs(best[0] - servers)):
                best = (n, v)
        return best

    def with_speed(self, gpus: int, servers: int, samples_per_s: float) -> "MeasuredSpeeds":
        """These speeds with ``(gpus, servers)`` set to ``samples_per_s`` (added or replaced)."""
        rest = [e for e in self.by_shape if (e[0], e[1]) != (gpus, servers)]
        return MeasuredSpeeds(tuple(sorted([*rest, (int(gpus), int(servers), float(samples_per_s))])))


@dataclass
class JobInfo:
    """A job as policies see it, pending or running.

    :param job_id: stable identity (survives preemption / requeue).
    :param model: canonical model name (see :mod:`policies.workloads`).
    :param gpu_demand: total GPUs the job asks for: every placement of it has exactly this many.
        For an elastic job it is its current size (a :attr:`Decision.resize` of the running job
        changes it), always within ``[min_gpus, max_gpus]``.
    :param submit_time: when it entered the system (s).
    :param total_samples: work to do (samples).
    :param done_samples: work done so far (samples).
    :param attained_service: GPU-seconds received so far (LAS key).
    :param placement: where it runs now; ``None`` while pending.
    :param isolated_thp: samples/s it would get alone on ``placement``.
    :param achieved_thp: samples/s it gets now (``<= isolated_thp``).
    :param best_thp: samples/s alone on its best feasible shape; used to
        estimate remaining time for SJF/SRTF.
    :param start_time: when it last started; ``None`` while pending.
    :param preemptions: times it has been preempted.
    :param extra: backend-specific fields (Slurm job id, user, ...). Elastic
        and multi-resource demands will live here first.
    :param preemptible: ``False``: preemptive policies must not choose this running job as
        a victim (the Slurm controller sets it for ``--no-requeue`` jobs and for jobs whose
        preemption just failed, e.g. their node agent is down; the simulator never does).
    :param min_gpus: fewest GPUs an elastic job can run on; ``None`` (with ``max_gpus``): not elastic.
    :param max_gpus: most GPUs an elastic job can use; ``None`` (with ``min_gpus``): not elastic.
        A running elastic job may be resized (:attr:`Decision.resize`) to any total in
        ``[min_gpus, max_gpus]``; a job that is not elastic keeps ``gpu_demand`` GPUs.
    :param demand: the job's full resource demand (:class:`~policies.resources.ResourceDemand`: GPU
        type, CPUs and memory per GPU, parameter servers), or ``None``: GPUs of any type and nothing
        else, which fits wherever the GPUs do. Its per-GPU amounts apply to whatever GPU total the
        job is placed on; :func:`policies.validate.check_decision` refuses a placement where the GPU
        type, CPUs or memory do not fit (:func:`policies.resources.placement_misfit`).
    :param measured_speeds: isolated throughputs the node agents measured for this job, by placement
        shape (:class:`MeasuredSpeeds`), or ``None``: nothing measured (the performance model alone).

    Construction checks the fields policies compute with (:class:`ValueError` naming the job
    and the field): ``gpu_demand`` an integer >= 1 (not a bool, not ``2.5``); ``submit_time``,
    ``total_samples``, ``done_samples``, ``attained_service``, ``isolated_thp``,
    ``achieved_thp`` and ``start_time`` (when set) finite numbers; ``best_thp`` finite and
    > 0; ``min_gpus`` and ``max_gpus`` both ``None`` or both integers with
    ``1 <= min_gpus <= gpu_demand <= max_gpus``. A NaN or infinite value would otherwise surface
    later as an opaque error (or a silently wrong order) inside a policy. Fields assigned after construction are not
    re-checked.
    """

    job_id: str
    model: str
    gpu_demand: int
    submit_time: float
    total_samples: float
    done_samples: float = 0.0
    attained_service: float = 0.0
    placement: Placement | None = None
    isolated_thp: float = 0.0
    achieved_thp: float = 0.0
    best_thp: float = 1.0
    start_time: float | None = None
    preemptions: int = 0
    extra: dict = field(default_factory=dict)
    preemptible: bool = True
    min_gpus: int | None = None
    max_gpus: int | None = None
    demand: ResourceDemand | None = None
    measured_speeds: MeasuredSpeeds | None = None

    def __post_init__(self) -> None:
        # one expression on the common path (every value finite, demand a plain int);
        # the details only when it fails
        st = self.start_time
        try:
            ok = (
                self.gpu_demand.__class__ is int
                and self.gpu_demand >= 1
                and _isfinite(self.submit_time)
                and _isfinite(self.total_samples)
                and _isfinite(self.done_samples)
                and _isfinite(self.attained_service)
                and _isfinite(self.isolated_thp)
                and _isfinite(self.achieved_thp)
                and _isfinite(self.best_thp)
                and self.best_thp > 0
                and (st is None or _isfinite(st))
                and self.min_gpus is None
                and self.max_gpus is None
                and self.demand is None
                and self.measured_speeds is None
            )
        except TypeError:  # a non-number
            ok = False
        if not ok:
            _check_job_fields(self)

    def demand_on(self, gpus: int) -> ResourceDemand | None:
        """:attr:`demand` at a GPU total of ``gpus`` (same type and per-GPU / parameter-server amounts),
        or ``None`` when the job declares nothing beyond GPUs (no type, CPUs or memory)."""
        d = self.demand
        if d is None or (d.gpu_type is None and not d.declares_cpu_mem):
            return None
        if d.gpus == gpus and d.min_gpus is None:
            return d
        return replace(d, gpus=gpus, min_gpus=None, max_gpus=None)

    def demand_for(self, p: Placement) -> ResourceDemand | None:
        """:meth:`demand_on` for ``p``'s GPU total, with ``p``'s parameter-server count where it names one
        (an elastic placement, :class:`policies.elastic.ElasticPlacement`, has ``ps``): what the job holds
        on ``p`` beyond GPUs, or ``None``."""
        d = self.demand_on(p.total_gpus)
        ps = getattr(p, "ps", None)
        if d is not None and isinstance(ps, int) and ps != d.ps:
            d = replace(d, ps=ps, ps_cpus=d.ps_cpus if ps else 0, ps_mem_gb=d.ps_mem_gb if ps else 0.0)
        return d

    @property
    def elastic(self) -> bool:
        """Whether the job can be resized (it has a ``[min_gpus, max_gpus]`` range)."""
        return self.min_gpus is not None

    @property
    def remaining_samples(self) -> float:
        return max(self.total_samples - self.done_samples, 0.0)

    @property
    def remaining_time(self) -> float:
        """Estimated seconds left when running alone on its best shape."""
        return self.remaining_samples / self.best_thp

    @property
    def total_time(self) -> float:
        """Estimated isolated run time of the whole job (SJF key)."""
        return self.total_samples / self.best_thp

    @property
    def cs(self) -> float:
        """Current contention sensitivity (isolated / achieved, >= 1)."""
        if self.placement is None or self.achieved_thp <= 0:
            return 1.0
        return self.isolated_thp / self.achieved_thp


_FINITE_FIELDS = (
    "submit_time", "total_samples", "done_samples", "attained_service", "isolated_thp", "achieved_thp", "best_thp",
)


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating))


def _check_job_fields(j: JobInfo) -> None:
    """Raise :class:`ValueError` naming ``j`` and its first bad field (see :class:`JobInfo`)."""
    g = j.gpu_demand
    if isinstance(g, bool) or not isinstance(g, (int, np.integer)):
        raise ValueError(f"job {j.job_id!r}: gpu_demand must be an integer, got {g!r}")
    if g < 1:
        raise ValueError(f"job {j.job_id!r}: gpu_demand must be >= 1, got {g!r}")
    for name in _FINITE_FIELDS:
        v = getattr(j, name)
        if not _is_number(v) or not math.isfinite(v):
            raise ValueError(f"job {j.job_id!r}: {name} must be a finite number, got {v!r}")
    if not j.best_thp > 0:
        raise ValueError(f"job {j.job_id!r}: best_thp must be > 0, got {j.best_thp!r}")
    st = j.start_time
    if st is not None and (not _is_number(st) or not math.isfinite(st)):
        raise ValueError(f"job {j.job_id!r}: start_time must be a finite number or None, got {st!r}")
    d = j.demand
    if d is not None and not isinstance(d, ResourceDemand):
        raise ValueError(f"job {j.job_id!r}: demand must be a ResourceDemand or None, got {d!r}")
    ms = j.measured_speeds
    if ms is not None and not isinstance(ms, MeasuredSpeeds):
        raise ValueError(f"job {j.job_id!r}: measured_speeds must be MeasuredSpeeds or None, got {ms!r}")
    lo, hi = j.min_gpus, j.max_gpus
    if lo is None and hi is None:
        return
    if lo is None or hi is None:
        raise ValueError(f"job {j.job_id!r}: min_gpus and max_gpus must both be set (elastic) or both None, "
                         f"got min_gpus={lo!r}, max_gpus={hi!r}")
    for name, v in (("min_gpus", lo), ("max_gpus", hi)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise ValueError(f"job {j.job_id!r}: {name} must be an integer, got {v!r}")
    if not 1 <= lo <= g <= hi:
        raise ValueError(f"job {j.job_id!r}: elastic range needs 1 <= min_gpus <= gpu_demand <= max_gpus, "
                         f"got min_gpus={lo}, gpu_demand={g}, max_gpus={hi}")


@dataclass
class ClusterState:
    """Snapshot handed to a policy each scheduling round.

    :param time: current time (s).
    :param cluster: static cluster shape.
    :param free_gpus: int array ``[num_nodes]``, free GPUs per node.
    :param running: running jobs (with placements).
    :param pending: waiting jobs in arrival order.
    :param usable: optional bool array ``[num_nodes]``: ``usable[i]`` is ``False`` for a node
        policies must not place on (drained, draining, down, ...). ``None`` (the default)
        means every node is usable; the simulator never sets it. On an unusable node
        ``free_gpus`` is 0 (construction zeroes it if the backend did not, on a copy), so
        no policy places a job there, and preemptive policies do not count the GPUs a
        victim would free there: preempting a job on a draining node frees nothing
        (jobs still running there stay in ``running``).
    :param lookup: optional ``job_id -> JobInfo | None`` over this snapshot's jobs: the
        :class:`JobInfo` of a job in ``running`` or ``pending``, ``None`` for any other id. A
        backend with its own index supplies it (the simulator does) so that :meth:`job` costs
        O(1) without a pass over both lists; it must agree with ``running`` and ``pending``
        until the backend changes (it is read before the decision is applied). Without it
        :meth:`job` builds a dict once.
    """

    time: float
    cluster: ClusterSpec
    free_gpus: np.ndarray
    running: Sequence[JobInfo]
    pending: Sequence[JobInfo]
    usable: np.ndarray | None = None
    lookup: Callable[[str], JobInfo | None] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.usable is not None:
            self._normalise_usable()

    def _normalise_usable(self) -> None:
        u = np.asarray(self.usable)
        if u.dtype != np.bool_ or u.shape != (len(self.free_gpus),):
            raise ValueError(
                f"ClusterState.usable must be a bool array of shape ({len(self.free_gpus)},) (one per node), "
                f"got {u.dtype} {u.shape}"
            )
        self.usable = u
        free = np.asarray(self.free_gpus)
        if (free[~u] != 0).any():
            self.free_gpus = np.where(u, free, 0).astype(free.dtype, copy=False)

    def job(self, job_id: str) -> JobInfo | None:
        """The running or pending job ``job_id`` (running iff its ``placement`` is set), or ``None``."""
        if self.lookup is not None:
            return self.lookup(job_id)
        index = self.__dict__.get("_index")
        if index is None:
            index = {j.job_id: j for j in self.pending}
            index.update((j.job_id, j) for j in self.running)
            self.__dict__["_index"] = index
        return index.get(job_id)

    @property
    def total_free(self) -> int:
        """Free GPUs in all (the sum of ``free_gpus``; a backend may hand it in, :meth:`use_free_bytes`)."""
        got = self.__dict__.get("_free_total")
        if got is not None and got[0] is self.free_gpus:
            return got[1]
        return int(self.free_gpus.sum())

    @property
    def utilisation(self) -> float:
        return 1.0 - self.total_free / self.cluster.total_gpus

    def jobs_on_node(self) -> list[list[JobInfo]]:
        """Running jobs per node index."""
        per: list[list[JobInfo]] = [[] for _ in range(self.cluster.num_nodes)]
        for j in self.running:
            assert j.placement is not None
            for n in j.placement.nodes:
                per[n].append(j)
        return per

    def free_bytes(self) -> tuple[bytes, int] | None:
        """``free_gpus`` as one byte per node and a bound on the counts (at least the largest), or
        ``None`` if a count is outside ``[0, 255]``: what placement rules search in C. Built on first
        use (three passes over the nodes) and kept, unless a backend handed it in (:meth:`use_free_bytes`)."""
        got = self.__dict__.get("_free_bytes")
        if got is None or got[0] is not self.free_gpus:
            free = np.asarray(self.free_gpus)
            fb = None
            if free.size and free.dtype.kind in "iu":
                bound = int(np.bitwise_or.reduce(free))  # >= max, and negative if a count is
                if 0 <= bound <= 255:
                    fb = (free.astype(np.uint8).tobytes(), bound)
            got = self.__dict__["_free_bytes"] = (self.free_gpus, fb)
        return got[1]

    def use_free_bytes(self, data: bytes, bound: int, total: int | None = None) -> None:
        """Hand in :meth:`free_bytes` (``free_gpus`` as bytes, a bound on the counts) and, optionally,
        :attr:`total_free`, kept by a backend."""
        if len(data) != len(self.free_gpus) or not 0 <= bound <= 255:
            raise ValueError(f"free bytes: {len(data)} bytes, bound {bound}, for {len(self.free_gpus)} nodes")
        self.__dict__["_free_bytes"] = (self.free_gpus, (data, bound))
        if total is not None:
            self.__dict__["_free_total"] = (self.free_gpus, int(total))

    def free_cpu_mem(self) -> tuple[list[int | None], list[float | None]]:
        """Free CPU cores and memory (GB) per node: each node's declared CPUs / memory
        (:attr:`~policies.cluster.NodeSpec.cpus`, ``mem_gb``) less what the running jobs' demands
        (:meth:`JobInfo.demand_for` their placements, placed as :meth:`~policies.resources.Allocation.from_placement` does) hold
        there; ``None`` for a node that declares none (no limit). Computed on first use
        (:func:`policies.resources.free_cpu_mem`) and kept with this state; O(1) after the first pass when
        no node declares CPUs or memory."""
        got = self.__dict__.get("_free_cpu_mem")
        if got is None:
            cluster = self.cluster
            cpus, mem = cluster.cpus_per_node, cluster.mem_gb_per_node
            if all(c is None for c in cpus) and all(m is None for m in mem):
                got = (list(cpus), list(mem))
            else:
                allocs = []
                for j in self.running:
                    p = j.placement
                    d = None if p is None else j.demand_for(p)
                    if d is not None and d.declares_cpu_mem:
                        allocs.append(Allocation.from_placement(p, d, cluster))  # type: ignore[arg-type]
                got = free_cpu_mem(cluster, allocs)
            self.__dict__["_free_cpu_mem"] = got
        return got

    def contention(self, perf: PairContention) -> ContentionLedger:
        """The contention ledger (:class:`~policies.ledger.ContentionLedger`) of ``running`` priced by
        ``perf``, keyed by job id, each job's :class:`JobInfo` as its ``info``; read-only
        (:meth:`~policies.ledger.ContentionLedger.fork` it to try changes).

        Built from ``running`` on first use (one pass) and kept with this state for that ``perf``,
        unless a backend handed in the one it keeps (:meth:`use_contention`)."""
        cache = self._ledgers()
        for led in cache:
            if led.perf is perf:
                if led.valid:
                    return led
                cache.remove(led)  # the backend's ledger moved on: build this state's own
                break
        led = ContentionLedger.from_jobs(perf, ((j.job_id, j.model, j.placement, j) for j in self.running),
                                         self.cluster.num_nodes)
        cache.append(led.freeze())
        return led

    def spans(self) -> dict[tuple[int, int], int]:
        """``{(total GPUs, nodes): number of jobs}`` of the running jobs that span several nodes.

        Read from a contention ledger kept with this state (:meth:`contention`, :meth:`use_contention`;
        any performance model: the shapes do not depend on it) in O(shapes), else counted in one pass
        over ``running``."""
        handed = self.__dict__.get("_handed")
        if handed is not None and handed[0].version == handed[1]:  # the backend's, unchanged: no fork needed
            return handed[0].spans()
        for led in self._ledgers():
            if led.valid:
                return led.spans()
        out: dict[tuple[int, int], int] = {}
        for j in self.running:
            p = j.placement
            if p is not None and p.num_nodes > 1:
                shape = (p.total_gpus, p.num_nodes)
                out[shape] = out.get(shape, 0) + 1
        return out

    def _ledgers(self) -> list[ContentionLedger]:
        """The contention ledgers kept with this state (the one a backend handed in, forked now)."""
        cache: list[ContentionLedger] = self.__dict__.setdefault("_contention", [])
        handed = self.__dict__.pop("_handed", None)
        if handed is not None and handed[0].version == handed[1]:  # O(1); valid while the backend's is unchanged
            cache.append(handed[0].fork(read_only=True))
        return cache

    def use_contention(self, ledger: ContentionLedger) -> None:
        """Hand in the contention ledger of ``running`` for ``ledger.perf`` (a backend that keeps one
        incrementally); :meth:`contention` returns it (read-only) while it stays valid."""
        cache: list[ContentionLedger] | None = self.__dict__.get("_contention")
        if cache:
            cache[:] = [led for led in cache if led.perf is not ledger.perf]
        self.__dict__["_handed"] = (ledger, ledger.version)  # forked when first asked for

    def with_running(self, add: Sequence[JobInfo] = (), remove: Sequence[JobInfo] = ()) -> "ClusterState":
        """This state with the running jobs ``remove`` (by job id) taken out and ``add`` (each with its
        placement) appended; ``free_gpus`` and the rest unchanged. ``running`` of the result is built on
        first read; every contention ledger kept with this state is carried over by forking it and
        applying the change (O(jobs on the changed nodes), not O(running))."""
        gone = {j.job_id for j in remove}
        base = self.running
        if isinstance(base, _RunningChange):
            gone |= base.gone
            kept = tuple(j for j in base.added if j.job_id not in gone)
            base = base.base
        else:
            kept = ()
        out = ClusterState(self.time, self.cluster, self.free_gpus, _RunningChange(base, frozenset(gone), kept + tuple(add)),
                           self.pending, self.usable)
        cache = self._ledgers()
        if cache:
            carried = []
            for led in cache:
                if not led.valid:
                    continue
                f = led.fork()
                for j in remove:
                    f.remove(j.job_id)
                for j in add:
                    assert j.placement is not None, f"job {j.job_id} added to running without a placement"
                    f.add(j.job_id, j.model, j.placement, j)
                carried.append(f.freeze())
            out.__dict__["_contention"] = carried
        return out


class _RunningChange(Sequence[JobInfo]):
    """``base`` without the jobs whose id is in ``gone``, then ``added``; built on first read."""

    __slots__ = ("base", "gone", "added", "_list")

    def __init__(self, base: Sequence[JobInfo], gone: frozenset[str], added: tuple[JobInfo, ...]) -> None:
        self.base, self.gone, self.added = base, gone, added
        self._list: list[JobInfo] | None = None

    def _items(self) -> list[JobInfo]:
        if self._list is None:
            gone = self.gone
            self._list = [j for j in self.base if j.job_id not in gone] if gone else list(self.base)
            self._list.extend(self.added)
        return self._list

    def __len__(self) -> int:
        return len(self._items())

    def __getitem__(self, i):  # type: ignore[override]
        return self._items()[i]

    def __iter__(self):
        return iter(self._items())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence):
            return self._items() == list(other)
        return NotImplemented

    def __repr__(self) -> str:
        return repr(self._items())


@dataclass
class Decision:
    """What a policy wants done this round.

    Order of application (each entry sees the cluster the earlier ones left):

    1. ``preempt``: job ids of running jobs; each returns to the queue with its progress
       checkpointed and its GPUs become free.
    2. ``resize``: ``(job_id, placement)`` of running elastic jobs (:attr:`JobInfo.elastic`):
       each moves from its current allocation to ``placement`` (any GPU total in
       ``[min_gpus, max_gpus]``), keeping its progress; the new placement must fit the free
       GPUs plus the job's own current ones.
    3. ``place``: ``(job_id, placement)`` of pending jobs (or of jobs this decision preempts:
       a migration), in order; each placement has exactly the job's ``gpu_demand`` GPUs.

    GPUs freed on an unusable node (:attr:`ClusterState.usable`) do not count. The rules are
    written once, in :func:`policies.validate.check_decision`. The simulator applies a
    decision all or nothing (an invalid entry raises
    :class:`~trainer.simulator.SimulationError` before any of it is applied); the Slurm
    controller drops (logs and counts) each invalid entry and applies the rest.
    """

    place: list[tuple[str, Placement]] = field(default_factory=list)
    preempt: list[str] = field(default_factory=list)
    resize: list[tuple[str, Placement]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.place or self.preempt or self.resize)
