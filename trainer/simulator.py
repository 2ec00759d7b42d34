"""Event-driven simulator of a GPU cluster running a job trace.

Events are job arrivals, job completions and scheduling-round boundaries
(every ``round_len`` seconds, default 300). The policy is asked for a decision
at every round boundary and, with ``event_triggered`` (default), right after
any arrival or completion. Between events every running job progresses at
its achieved throughput (:mod:`policies.perf`), so time advances straight to
the next event; nothing is stepped per second.

Progress is tracked lazily: a job stores the samples done at its last rate
change and the rate since then, so an event touches only the jobs whose
contention changed (the multi-node jobs on the nodes of a job that started
or stopped, which the contention ledger, :class:`policies.ledger.ContentionLedger`,
reports). A start or stop costs O(jobs on its nodes), never O(running jobs);
building the policy's view (:meth:`Simulator.state`) is O(1) until the policy
reads the running jobs.

Invariants (checked when ``check_invariants`` is on, and by the tests): no
node ever has more GPUs allocated than it owns; every finished job did
exactly ``total_samples``; JCT = queueing + running >= ideal isolated time.

A preempted job keeps its progress (checkpointed) and pays
``restart_overhead`` seconds without progress, GPUs held, each time it
starts again. A resized elastic job keeps its progress and pays
``resize_overhead`` seconds without progress on its new placement.

A job with a :class:`~policies.resources.ResourceDemand` (``JobSpec.demand``) shows it to policies as
``JobInfo.demand`` and its elastic range as ``min_gpus`` / ``max_gpus``. A placement that is
a :class:`policies.elastic.ElasticPlacement` also sets the job's parameter-server count, which the
performance model (:class:`policies.psmodel.PSPerformanceModel`) prices; a resize to the same GPUs
with another count changes the PSs only (same pause). CPUs, memory and parameter-server counts are checked by
the decision rules (:func:`policies.validate.check_decision`), not here.

When rounds happen, and how decisions are validated and applied, is the round loop's
(:mod:`policies.rounds`) over this simulator's backend (:mod:`trainer.sim_backend`);
:meth:`Simulator.run` runs that loop. This module holds the mechanics.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import heapq
import itertools
import math
import operator
import weakref
from array import array
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np

from policies.base import Policy
from policies.cluster import ClusterSpec, Placement
from policies.compat import CompatError, CompatMode
from policies.job import JobSpec
from policies.ledger import ContentionLedger
from policies.perf import ContentionModel
from policies.state import ClusterState, Decision, JobInfo
from policies.validate import placement_problem
from trainer.traces import MAX_SUBMIT_TIME_S, MAX_SUBMIT_TIME_TEXT

__all__ = [
    "SimConfig",
    "Simulator",
    "SimResult",
    "SimulationError",
    "JobRecord",
    "RunningView",
    "MAX_ISOLATED_RUN_S",
    "HOT_RESIZE_OVERHEAD_S",
]

_EPS = 1e-9

#: Fields per slot of the simulator's per-run progress array (total_samples, done, rate, t_ref, cs) and
#: per row of its allocation array (node, GPUs, slot); a stopped job's slot holds _SL_DEAD.
_SL = 5
_RW = 3
_SL_DEAD = array("d", (0.0, 0.0, 1.0, 0.0, math.nan))

#: Longest isolated run time (s) of one job the simulator accepts: ``total_samples`` over the job's best
#: isolated throughput on the cluster (noise left out). 1e8 s is about 3.2 years; Philly's longest job ran 54
#: days. A time-variant policy is asked every round while jobs run, so one job of 1e8 s already costs
#: 333,334 rounds (about 6 s per policy); 1e10 samples of MoE (4.8e8 s) ran for minutes.
MAX_ISOLATED_RUN_S = 1e8


#: Pause (s) of a "hot" resize: DL2 adds a parameter server without a checkpoint in tens of
#: milliseconds (DL2, Fig. 11); checkpoint-restart takes tens of seconds.
HOT_RESIZE_OVERHEAD_S = 0.05


class SimulationError(RuntimeError):
    """The simulation cannot go on (bad trace for this cluster, stuck policy)."""


@dataclass
class SimConfig:
    """Simulator knobs.

    :param round_len: seconds between scheduling rounds.
    :param event_triggered: also schedule right after arrivals / completions.
    :param restart_overhead: seconds without progress after each (re)start
        of a preempted job (checkpoint restore, warm-up).
    :param resize_overhead: seconds without progress after an elastic job is
        resized (:attr:`~policies.state.Decision.resize`); ``None``: ``restart_overhead``
        (checkpoint-restart, tens of seconds in DL2's Fig. 11). DL2's "hot" scaling pauses
        tens of milliseconds (:data:`HOT_RESIZE_OVERHEAD_S`).
    :param noise_cv: coefficient of variation of a per-job speed factor
        (log-normal, mean 1); 0 disables it. DL2 reports 0.273.
    :param seed: seeds the speed noise.
    :param max_idle_rounds: give up when the cluster is idle, jobs wait and the
        policy has placed nothing for this many rounds in a row.
    :param metrics_interval: minimum seconds between fragmentation / CS samples.
    :param check_invariants: assert the invariants after every event (slow).
    :param compat: a peer simulator's rules (:class:`policies.compat.CompatMode`, ``--compat``) or ``None``.
        When set, the simulator takes ``round_len``, ``restart_overhead`` and no event-triggered
        rounds from it (overriding the fields above), submits every job at t = 0, refuses a cluster,
        job or placement the mode does not allow (:class:`SimulationError`), and its results carry
        ``meta["compat"]`` (the mode's name) and ``meta["round_len"]``.
    """

    round_len: float = 300.0
    event_triggered: bool = True
    restart_overhead: float = 30.0
    resize_overhead: float | None = None
    noise_cv: float = 0.0
    seed: int = 0
    max_idle_rounds: int = 10_000
    metrics_interval: float = 300.0
    check_invariants: bool = False
    compat: "CompatMode | None" = None

    def effective(self) -> "SimConfig":
        """This config with the compat mode's rules applied (itself when there is no mode)."""
        m = self.compat
        if m is None:
            return self
        return dataclasses.replace(self, round_len=float(m.round_len), event_triggered=False,
                                   restart_overhead=float(m.restart_overhead))


@dataclass
class JobRecord:
    """Outcome of one job (one row of the per-job Parquet file). :meth:`Simulator.result` passes the
    fields positionally, in this order."""

    job_id: str
    model: str
    gpu_demand: int
    submit_time: float
    first_start: float
    finish_time: float
    jct: float
    queueing: float
    run_time: float
    ideal_time: float
    avg_cs: float
    preemptions: int
    num_nodes: int
    total_samples: float
    done_samples: float


@dataclass
class SimResult:
    """Everything a simulation produced.

    ``util_t`` / ``util_used`` is the step function of allocated GPUs (value
    holds from each time to the next). ``samples_*`` are taken at scheduling
    rounds, at most every ``metrics_interval`` seconds.
    """

    policy: str
    cluster: ClusterSpec
    jobs: list[JobRecord]
    makespan: float
    util_t: np.ndarray
    util_used: np.ndarray
    samples_t: np.ndarray
    samples_frag: np.ndarray
    samples_cs: np.ndarray
    rounds: int
    decisions: int
    preemptions: int
    wall_time: float = 0.0
    meta: dict = field(default_factory=dict)


class _Job:
    """Simulator-private state of one job."""

    __slots__ = (
        "spec", "info", "idx", "noise", "key", "iso", "rate", "cs", "done", "t_ref",
        "version", "first_start", "finish", "run_time", "cs_time", "cs_weighted",
        "seg_start", "ideal", "att_base", "run_seq", "slot", "row0",
    )

    def __init__(self, spec: JobSpec, idx: int, noise: float, best_thp: float) -> None:
        self.spec = spec
        self.idx = idx
        self.noise = noise
        d = spec.demand
        if d is None and _JOBINFO_FIELDS_PLAIN and 0.0 < best_thp < math.inf:
            # JobInfo(job_id=..., model=..., gpu_demand=..., submit_time=..., total_samples=..., best_thp=...), its
            # fields set directly in field order: the simulator checked the spec (_check_spec) and best_thp is
            # finite and > 0, which is all that JobInfo.__post_init__ checks of a job without a demand
            info = self.info = _new(JobInfo)
            info.job_id = spec.job_id
            info.model = spec.model
            info.gpu_demand = spec.gpu_demand
            info.submit_time = spec.submit_time
            info.total_samples = spec.total_samples
            info.done_samples = 0.0
            info.attained_service = 0.0
            info.placement = None
            info.isolated_thp = 0.0
            info.achieved_thp = 0.0
            info.best_thp = best_thp
            info.start_time = None
            info.preemptions = 0
            info.extra = {}
            info.preemptible = True
            info.min_gpus = None
            info.max_gpus = None
            info.demand = None
            info.measured_speeds = None
        else:
            self.info = JobInfo(
                job_id=spec.job_id,
                model=spec.model,
                gpu_demand=spec.gpu_demand,
                submit_time=spec.submit_time,
                total_samples=spec.total_samples,
                best_thp=best_thp,
                demand=d,
            )
            if d is not None and d.min_gpus is not None:  # elastic range
                self.info.min_gpus, self.info.max_gpus = d.min_gpus, d.max_gpus
        self.key: tuple | None = None
        self.iso = 0.0  # isolated samples/s on the current placement (noise included)
        self.rate = 0.0  # achieved samples/s
        self.cs = 1.0
        self.done = 0.0  # samples done at t_ref
        self.t_ref = 0.0  # progress accrues from here at `rate` (after restart overhead)
        self.version = 0
        self.first_start = math.nan
        self.finish = math.nan
        self.run_time = 0.0
        self.cs_time = 0.0  # seconds of progress-making run time
        self.cs_weighted = 0.0  # integral of cs over those seconds
        self.seg_start = 0.0
        self.att_base = 0.0  # GPU-seconds attained before the current run
        self.run_seq = 0  # order of the current start among all starts (RunningView snapshots)
        self.slot = -1  # its entry in the simulator's per-run lists (fragmentation), while running
        self.row0 = -1  # its first allocation row there
        self.ideal = spec.total_samples / (best_thp * noise)

    def progress(self, t: float) -> float:
        return min(self.done + self.rate * max(0.0, t - self.t_ref), self.spec.total_samples)


class RunningView(Sequence[JobInfo]):
    """The running jobs of a :class:`ClusterState` built by the simulator.

    A read-only sequence of :class:`JobInfo`, in start order: the jobs that ran when the
    state was built. Building it is O(1): the list is taken from the simulator the first
    time the view is read (iterated, indexed or compared), and the progress fields
    (``done_samples``, ``attained_service``, ``achieved_thp``, ``isolated_thp``) are computed
    then for time ``t``. A job the simulator stops before that first read is kept (the
    simulator tells every open view), one it starts is left out; so a policy that never
    looks at running jobs (FIFO) pays nothing for them. ``len`` and ``bool`` need no read.
    """

    __slots__ = ("_sim", "_t", "_n", "_seq", "_gone", "_jobs", "_infos", "__weakref__")

    def __init__(self, sim: "Simulator", t: float) -> None:
        self._sim = sim
        self._t = t
        self._n = len(sim.running)
        self._seq = sim._run_seq  # jobs started later are not in this view
        self._gone: list[tuple[int, _Job]] = []  # (run_seq, job) of its jobs stopped since
        self._jobs: list[_Job] | None = None
        self._infos: list[JobInfo] | None = None

    def _stopped(self, j: _Job) -> None:
        """The simulator is stopping ``j`` (called while the view is unread)."""
        if j.run_seq <= self._seq:
            self._gone.append((j.run_seq, j))

    def _take(self) -> list[_Job]:
        """Fix the job list (the simulator stops reporting to this view)."""
        jobs = self._jobs
        if jobs is None:
            sim = self._sim
            sim._views = [r for r in sim._views if r() is not self and r() is not None]
            if not self._gone and sim._run_seq == self._seq:
                jobs = list(sim.running.values())
            else:
                hi = self._seq
                seq_jobs = [(j.run_seq, j) for j in sim.running.values() if j.run_seq <= hi] + self._gone
                seq_jobs.sort(key=_first)
                jobs = [j for _s, j in seq_jobs]
            self._jobs = jobs
            self._gone = []
        return jobs

    def _refresh(self) -> list[JobInfo]:
        infos = self._infos
        if infos is None:
            t = self._t
            infos = []
            for j in self._take():
                info = j.info
                info.done_samples = j.progress(t)
                info.attained_service = j.att_base + info.gpu_demand * (t - j.seg_start)
                info.achieved_thp = j.rate
                info.isolated_thp = j.iso
                infos.append(info)
            self._infos = infos
        return infos

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):  # type: ignore[override]
        return self._refresh()[i]

    def __iter__(self):
        return iter(self._refresh())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (RunningView, list, tuple)):
            return list(self) == list(other)
        return NotImplemented

    def __repr__(self) -> str:
        return f"RunningView({self._refresh()!r})"


def _first(pair: tuple):
    return pair[0]


#: A job's :class:`JobInfo` (an attrgetter: ``list(map(_info_of, jobs))`` calls no Python function).
_info_of: Callable[[_Job], JobInfo] = operator.attrgetter("info")
#: A record's finish time (an attrgetter).
_finish_time_of: Callable[["JobRecord"], float] = operator.attrgetter("finish_time")


_new = object.__new__
_heappush, _heappop = heapq.heappush, heapq.heappop
#: ClusterState has exactly these dataclass fields (and no __post_init__ work without ``usable``):
#: Simulator.state sets them directly
_STATE_FIELDS_PLAIN = tuple(f.name for f in dataclasses.fields(ClusterState)) == (
    "time", "cluster", "free_gpus", "running", "pending", "usable", "lookup")
#: JobInfo has exactly these dataclass fields, with these defaults after ``best_thp`` (``extra``: an empty dict):
#: _Job sets them directly for a job without a demand
_JOBINFO_FIELDS_PLAIN = [(f.name, f.default) for f in dataclasses.fields(JobInfo)] == [
    ("job_id", dataclasses.MISSING), ("model", dataclasses.MISSING), ("gpu_demand", dataclasses.MISSING),
    ("submit_time", dataclasses.MISSING), ("total_samples", dataclasses.MISSING), ("done_samples", 0.0),
    ("attained_service", 0.0), ("placement", None), ("isolated_thp", 0.0), ("achieved_thp", 0.0), ("best_thp", 1.0),
    ("start_time", None), ("preemptions", 0), ("extra", dataclasses.MISSING), ("preemptible", True),
    ("min_gpus", None), ("max_gpus", None), ("demand", None), ("measured_speeds", None)]


@contextlib.contextmanager
def _gc_paused(promote: bool = False):
    """Pause the cyclic garbage collector while building one object per job (none of them garbage;
    on a million jobs the collector's passes over the growing heap cost more than the building).

    With ``promote`` (and nothing frozen by anyone), the objects built go to the collector's oldest
    generation at the end (:func:`gc.freeze` then :func:`gc.unfreeze`, two list splices) instead of
    staying young: the first young collection after the pause would otherwise scan every one of
    them (about 0.5 us of CPU per object on a million jobs), and the one after it again."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if promote and gc.get_freeze_count() == 0:
            gc.freeze()
            gc.unfreeze()
        if was:
            gc.enable()


#: Traces of at least this many jobs run with the objects that exist when the run starts (the trace, the
#: per-job records) frozen out of the cyclic collector's passes (:func:`_gc_frozen`).
GC_FREEZE_MIN_JOBS = 50_000


@contextlib.contextmanager
def _gc_frozen(freeze: bool):
    """With ``freeze``, move every object that exists now into the collector's permanent generation
    (:func:`gc.freeze`) for the duration, and back afterwards (:func:`gc.unfreeze`). The run then
    creates and frees only small, short-lived objects, and the collector's full passes no longer scan
    the million per-job records over and over (measured: 1,000,000 jobs through FIFO on 8192x8,
    67.4 -> 55.4 s of CPU, docs/BENCHMARKS.md). Objects of the frozen set that become cyclic garbage
    during the run are collected after it."""
    if not freeze:
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _check_spec(j: JobSpec, total_gpus: int) -> None:
    """Raise :class:`SimulationError` naming the job and field unless ``j`` can be simulated:
    ``gpu_demand`` an integer (not a bool, not ``2.5``) in ``[1, total_gpus]``, ``total_samples``
    a finite number > 0, ``submit_time`` a finite number in ``[0, MAX_SUBMIT_TIME_S]``. (A NaN submit time made
    the event loop spin forever, an infinite one crash it; a NaN or infinite amount of work failed deep
    inside the performance model.)"""
    g, ts, work = j.gpu_demand, j.submit_time, j.total_samples
    if (g.__class__ is int and 1 <= g <= total_gpus and ts.__class__ is float and work.__class__ is float
            and 0.0 <= ts <= MAX_SUBMIT_TIME_S and 0.0 < work < math.inf):
        return  # the common case in one expression: a plain int demand, finite float time and work in range
    if isinstance(g, bool) or not isinstance(g, (int, np.integer)):
        raise SimulationError(f"job {j.job_id!r}: gpu_demand must be an integer, got {g!r}")
    if g < 1:
        raise SimulationError(f"job {j.job_id!r}: gpu_demand must be >= 1, got {g!r}")
    if g > total_gpus:
        raise SimulationError(f"job {j.job_id!r}: gpu_demand {g} exceeds the cluster's {total_gpus} GPUs")
    for name, v, positive in (("total_samples", j.total_samples, True), ("submit_time", j.submit_time, False)):
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not math.isfinite(v):
            raise SimulationError(f"job {j.job_id!r}: {name} must be a finite number, got {v!r}")
        if (v <= 0) if positive else (v < 0):
            raise SimulationError(f"job {j.job_id!r}: {name} must be {'> 0' if positive else '>= 0'}, got {v!r}")
    if j.submit_time > MAX_SUBMIT_TIME_S:
        raise SimulationError(
            f"job {j.job_id!r}: submit_time {j.submit_time!r} is beyond the largest submit time {MAX_SUBMIT_TIME_TEXT}"
        )


def _int_buffer(values: np.ndarray) -> tuple[np.ndarray, memoryview, np.ndarray]:
    """A copy of ``values`` as an int64 array over a buffer of its own, a memoryview of that buffer (single
    items set through it cost far less than through the array) and a read-only view of the array (a view of
    it is read-only too: what :meth:`Simulator.state` hands out, without setting a flag per state)."""
    buf = bytearray(np.ascontiguousarray(values, dtype=np.int64).tobytes())
    arr = np.frombuffer(buf, dtype=np.int64)
    ro = arr.view()
    ro.flags.writeable = False
    return arr, memoryview(buf).cast("q"), ro


def _check_placement(job_id: str, demand: int, p: Placement, free: np.ndarray, context: str = "") -> None:
    """Raise :class:`SimulationError` unless ``p`` gives job ``job_id`` exactly ``demand`` GPUs on distinct
    nodes of the cluster, each within its ``free`` GPUs (:func:`policies.validate.placement_problem`;
    ``context`` is appended to the "does not fit" text)."""
    prev, size = -1, len(free)
    for n, c in p.alloc:  # the common case in one pass: ascending nodes, each in range and within its free GPUs
        if n <= prev or c <= 0 or n >= size or c > free[n]:
            break
        prev = n
    else:
        if p.total_gpus == demand:
            return
    why = placement_problem(job_id, demand, p, free, None, context)
    if why is not None:
        raise SimulationError(why)


class Simulator:
    """Run one policy over one trace on one cluster.

    :param cluster: the cluster.
    :param jobs: the trace (any order; sorted by submit time here).
    :param policy: the policy to ask each round.
    :param perf: the performance model; defaults to :class:`ContentionModel`.
    :param config: knobs, see :class:`SimConfig`.

    Every job of the trace is checked first (:class:`SimulationError` naming the job and the
    field): unique ids, an integer demand within the cluster, finite positive work that takes at most
    :data:`MAX_ISOLATED_RUN_S` seconds alone on its best placement, a finite submit time in
    ``[0, MAX_SUBMIT_TIME_S]`` and a known model.
    """

    #: The per-run lists are compacted once more than this many (and more than half) of their entries
    #: belong to stopped jobs.
    COMPACT_AFTER = 1024
    #: On clusters of at least this many nodes the simulator keeps the running jobs' progress as flat
    #: arrays (fragmentation and CS samples in one vectorised pass) and a byte copy of the free GPUs
    #: (for the placement rules); on smaller ones a loop over the running jobs is cheaper.
    VECTOR_MIN_NODES = 65

    def __init__(
        self,
        cluster: ClusterSpec,
        jobs: Sequence[JobSpec],
        policy: Policy | None,
        perf: ContentionModel | None = None,
        config: SimConfig | None = None,
    ) -> None:
        self.cluster = cluster
        self.perf = perf or ContentionModel(cluster)
        self.policy = policy
        self.cfg = (config or SimConfig()).effective()
        if self.cfg.round_len <= 0:
            raise ValueError("round_len must be positive")
        self.compat = self.cfg.compat
        if self.compat is not None:
            jobs = self._compat_jobs(cluster, jobs)
        with _gc_paused(promote=len(jobs) >= GC_FREEZE_MIN_JOBS):
            self._build_jobs(jobs)
        self._touched = False  # no job has started since its fields were set
        self.reset_state()

    def _compat_jobs(self, cluster: ClusterSpec, jobs: Sequence[JobSpec]) -> list[JobSpec]:
        """The trace under the compat mode: cluster and demands checked, every job submitted at t = 0."""
        mode = self.compat
        assert mode is not None
        rule = getattr(self.perf, "contention", "sum")
        if rule != mode.contention:
            raise SimulationError(
                f"--compat {mode.name} needs the contention rule {mode.contention!r} "
                f"(ContentionModel(cluster, contention={mode.contention!r})); the performance model has {rule!r}"
            )
        try:
            mode.check_cluster(cluster)
            for j in jobs:
                mode.check_job(j.job_id, j.gpu_demand)
        except CompatError as exc:
            raise SimulationError(str(exc)) from None
        if not mode.submit_at_zero:
            return list(jobs)
        return [j if j.submit_time == 0.0 else dataclasses.replace(j, submit_time=0.0) for j in jobs]

    def _build_jobs(self, jobs: Sequence[JobSpec]) -> None:
        """Check every job of the trace and build the simulator's record of each, in arrival order."""
        cluster = self.cluster
        total_gpus = cluster.total_gpus  # a property summing over nodes: once, not per job
        n_jobs = len(jobs)
        # The common case in two passes: distinct ids, and every job's fields in range (_check_spec's first
        # test); otherwise the loop below names the first problem in trace order.
        ok = len({j.job_id for j in jobs}) == n_jobs
        if ok:
            for j in jobs:
                g, ts, work = j.gpu_demand, j.submit_time, j.total_samples
                if not (g.__class__ is int and 1 <= g <= total_gpus and ts.__class__ is float
                        and work.__class__ is float and 0.0 <= ts <= MAX_SUBMIT_TIME_S and 0.0 < work < math.inf):
                    ok = False
                    break
        if not ok:
            ids = set()
            for j in jobs:
                if j.job_id in ids:
                    raise SimulationError(f"duplicate job id {j.job_id!r} in trace")
                ids.add(j.job_id)
                _check_spec(j, total_gpus)
        submit = [j.submit_time for j in jobs]
        if all(map(operator.le, submit, itertools.islice(submit, 1, None))):
            order: Iterable[int] = range(n_jobs)  # already in arrival order
        else:
            order = sorted(range(n_jobs), key=submit.__getitem__)  # stable: ties keep trace order
        rng = np.random.default_rng(self.cfg.seed)
        if self.cfg.noise_cv > 0:
            s2 = math.log1p(self.cfg.noise_cv**2)
            noise = rng.lognormal(-s2 / 2, math.sqrt(s2), size=n_jobs).tolist()
        else:
            noise = [1.0] * n_jobs
        self.jobs: list[_Job] = []
        append = self.jobs.append
        best_of: dict[tuple[str, int], float] = {}  # perf.best_isolated_throughput by (model, GPUs)
        for rank, i in enumerate(order):
            spec = jobs[i]
            shape = (spec.model, spec.gpu_demand)
            best = best_of.get(shape)
            if best is None:
                try:
                    best = best_of[shape] = self.perf.best_isolated_throughput(*shape)
                except KeyError as exc:  # an unknown model (UnknownModelError): name the job
                    raise SimulationError(f"job {spec.job_id!r}: {exc}") from exc
            if spec.total_samples > MAX_ISOLATED_RUN_S * best:
                raise SimulationError(
                    f"job {spec.job_id!r}: total_samples {spec.total_samples:g} take {spec.total_samples / best:.4g} s "
                    f"alone on the best placement of {spec.gpu_demand} GPUs ({spec.model}, {best:.4g} samples/s), "
                    f"more than the longest isolated run the simulator accepts, {MAX_ISOLATED_RUN_S:g} s "
                    f"(about {MAX_ISOLATED_RUN_S / (365.25 * 86400):.1f} years)"
                )
            append(_Job(spec, rank, noise[i], best))
        self.by_id = {j.spec.job_id: j for j in self.jobs}
        self._submit = [j.spec.submit_time for j in self.jobs]  # arrival order

    # ------------------------------------------------------------------ state
    def reset_state(self) -> None:
        self.capacity = np.array(self.cluster.gpus_per_node, dtype=np.int64)
        self.free, self._free_mv, self._free_ro = _int_buffer(self.capacity)
        self._free_lent: weakref.ref | None = None  # the read-only view of `free` the last state holds
        # A second buffer of free GPUs per node (`_own_free` swaps it in when a state holds `free`):
        # `_spare` plus the placements in `_free_log` (each with +1: GPUs freed, -1: taken) is `free`.
        self._spare: np.ndarray | None = None
        self._spare_mv: memoryview | None = None
        self._spare_ro: np.ndarray | None = None
        self._spare_lent: weakref.ref | None = None  # the read-only view of `_spare` a state may hold
        self._free_log: list[tuple[Placement, int]] = []
        self._total_gpus = int(self.capacity.sum())
        self._vec = self.cluster.num_nodes >= self.VECTOR_MIN_NODES
        # a byte mirror of `free` that states hand to placement rules
        self._free_bytes = bytearray(self.capacity.tolist()) if self._vec and int(self.capacity.max()) <= 255 else None
        self._free_bound = int(self.capacity.max())
        self._log_max = max(16, self.cluster.num_nodes // 8)
        self._check_inv = self.cfg.check_invariants
        # (job key, isolated throughput) by job key, for a plain ContentionModel on a cluster without GPU types
        # (its throughput depends on the shape alone there)
        self._iso_memo: dict | None = (
            {} if type(self.perf).throughput is ContentionModel.throughput and not self.cluster.is_typed else None)
        self._used = 0  # allocated GPUs (sum of capacity - free)
        self.ledger = ContentionLedger(self.perf, self.cluster.num_nodes)  # running jobs by id, each one's CS
        for ref in list(getattr(self, "_views", ())):
            v = ref()
            if v is not None:
                v._take()  # views of the previous run keep its jobs
        # unread views (told of stops); a dropped one's reference stays until the next state() or stop
        self._views: list[weakref.ref[RunningView]] = []
        # Running jobs' progress and allocations as flat arrays in start order (what fragmentation() and
        # the CS samples read in one vectorised pass, through numpy views without copying). A stopped
        # job's entry stays, neutral (no work, no GPUs), until the arrays are compacted.
        self._sl_job: list[_Job | None] = []
        self._sl = array("d")  # per slot, _SL fields: total_samples, done, rate, t_ref, cs
        self._rw = array("q")  # allocation rows, _RW fields each: node, GPUs (0 once stopped), slot
        self._sl_dead = 0
        self._run_seq = 0
        self._epoch = 0  # starts and stops so far (a snapshot's placements were checked against this count)
        self.time = 0.0
        self.next_arrival = 0
        self.pending: list[_Job] = []
        self.running: dict[int, _Job] = {}
        self.finished = 0
        self.heap: list[tuple[float, int, int, int]] = []
        self._seq = 0
        self.util_t: list[float] = [0.0]
        self.util_used: list[int] = [0]
        self.samples_t: list[float] = []
        self.samples_frag: list[float] = []
        self.samples_cs: list[float] = []
        self._last_sample = -math.inf
        self.rounds = 0
        self.decisions = 0
        self.preemptions = 0
        self.dirty = True
        if self._touched:  # a job has started since the jobs' fields were set: reset them
            self._touched = False
            for j in self.jobs:
                j.done, j.t_ref, j.rate, j.cs, j.key, j.iso = 0.0, 0.0, 0.0, 1.0, None, 0.0
                j.version, j.run_time, j.cs_time, j.cs_weighted, j.att_base = 0, 0.0, 0.0, 0.0, 0.0
                j.slot = j.row0 = -1
                j.first_start = j.finish = math.nan
                j.info.gpu_demand = j.spec.gpu_demand  # a resize changes an elastic job's size
                j.info.done_samples = 0.0
                j.info.attained_service = 0.0
                j.info.placement = None
                j.info.start_time = None
                j.info.preemptions = 0
        if self.policy is not None:
            self.policy.reset()

    @classmethod
    def from_state(
        cls,
        state: ClusterState,
        policy: Policy | None,
        perf: ContentionModel | None = None,
        config: SimConfig | None = None,
        arrivals: Sequence[JobSpec] = (),
    ) -> "Simulator":
        """A simulator that continues from the snapshot ``state`` (a lookahead policy's model,
        :mod:`trainer.rollout`): its clock is ``state.time``, its jobs are the snapshot's running
        jobs (on their placements, with their progress, attained service, preemption count and
        start time) and pending jobs (queued), and later the jobs of ``arrivals`` (each submitted
        after ``state.time``, on the snapshot's clock; :class:`ValueError` otherwise) arrive. A running job's speed
        factor is its ``isolated_thp`` over the performance model's throughput on its placement
        (1 when that is unknown), so a noisy run's speeds carry over. A job restarted less than
        ``restart_overhead`` seconds ago makes no progress for the rest of it. Nodes marked
        unusable (``state.usable``) keep no free GPUs at the start. Nothing of ``state`` is changed.

        Times are shifted by ``time_shift`` (set on the result): a whole number of ``round_len`` at or
        below the earliest submit time, so that epoch-based snapshots (the controller's) fit the
        simulator's submit-time range and round boundaries fall where the snapshot's would. The
        simulator's time ``t`` is the snapshot's ``t - time_shift``.
        """
        running, pending = list(state.running), list(state.pending)
        rl = (config or SimConfig()).round_len
        first = min((min(i.submit_time, state.time) for i in (*running, *pending)), default=state.time)
        shift = math.floor(first / rl) * rl if first > 0 and rl > 0 else 0.0
        specs = []
        for info in (*running, *pending):
            d = info.demand
            specs.append(JobSpec(job_id=info.job_id, submit_time=min(info.submit_time, state.time) - shift,
                                 model=info.model,
                                 gpu_demand=info.gpu_demand, total_samples=info.total_samples,
                                 demand=d if d is not None and d.gpus == info.gpu_demand else None))
        known = len(specs)
        for a in arrivals:
            if not a.submit_time > state.time:
                raise ValueError(f"arrival {a.job_id!r}: submit_time {a.submit_time!r} is not after the snapshot's "
                                 f"time {state.time!r}")
            specs.append(dataclasses.replace(a, submit_time=a.submit_time - shift))
        sim = cls(state.cluster, specs, policy, perf, config)
        sim.time_shift = shift
        sim.time = float(state.time) - shift
        sim.next_arrival = known  # the snapshot's jobs sort first (submitted at or before its time)
        sim.pending = sim.jobs[:known]  # arrival order: submit time, then trace order
        sim.dirty = True
        ro = sim.cfg.restart_overhead
        for info in running:
            j = sim.by_id[info.job_id]
            p = info.placement
            j.done = j.info.done_samples = min(info.done_samples, info.total_samples)
            j.att_base = j.info.attained_service = info.attained_service
            j.info.preemptions = info.preemptions
            iso = sim.perf.throughput(j.spec, p, sim.cluster)
            if info.isolated_thp > 0 and iso > 0:
                j.noise = info.isolated_thp / iso
            st = info.start_time if info.start_time is not None else state.time
            left = st + ro - state.time if info.preemptions > 0 else 0.0
            sim.start(info.job_id, p, overhead=max(left, 0.0))
            j.info.start_time = st - shift
        if state.usable is not None:
            free = sim._own_free()
            free[~np.asarray(state.usable)] = 0
            sim._free_rewritten()
            if sim._free_bytes is not None:
                for n in np.flatnonzero(~np.asarray(state.usable)).tolist():
                    sim._free_bytes[n] = 0
        sim.util_t, sim.util_used = [sim.time], [sim._used]
        return sim

    @property
    def done(self) -> bool:
        return self.finished == len(self.jobs)

    # ------------------------------------------------------------------ views
    def state(self, lookup: Callable[[str], JobInfo | None] | None = None) -> ClusterState:
        """Build the policy's view at the current time (``lookup``: its :attr:`ClusterState.lookup`).

        ``running`` is a :class:`RunningView`: the running jobs' progress
        fields (``done_samples``, ``attained_service``, ``achieved_thp``,
        ``isolated_thp``) are brought up to this time on first access, so a
        policy that never looks at running jobs (FIFO) pays nothing for them.
        """
        t = self.time
        view = _new(RunningView)  # RunningView(self, t), its slots set directly
        view._sim, view._t, view._n, view._seq = self, t, len(self.running), self._run_seq
        view._gone, view._jobs, view._infos = [], None, None
        views = self._views
        if views:  # drop the references to views gone (most rounds: the one of the last round)
            if len(views) == 1:
                if views[0]() is None:
                    views.clear()
            else:
                views = self._views = [r for r in views if r() is not None]
        views.append(weakref.ref(view))
        # read-only (a view of the read-only view); `free` is swapped for the spare buffer (_own_free) before it
        # changes while this lives
        free = self._free_ro.view()
        self._free_lent = weakref.ref(free)
        pending = list(map(_info_of, self.pending))
        # with what ClusterState.use_contention and use_free_bytes record, written directly (a new state): the
        # ledger of exactly these running jobs (while it is unchanged), the free GPUs as bytes and their sum
        ledger = self.ledger
        fb = self._free_bytes
        if _STATE_FIELDS_PLAIN:  # ClusterState(...) with usable None and `lookup`, its fields set directly
            st = _new(ClusterState)
            if fb is not None:
                st.__dict__.update(time=t, cluster=self.cluster, free_gpus=free, running=view, pending=pending,
                                   usable=None, lookup=lookup, _handed=(ledger, ledger._version),
                                   _free_bytes=(free, (bytes(fb), self._free_bound)),
                                   _free_total=(free, self._total_gpus - self._used))
                return st
            st.__dict__.update(time=t, cluster=self.cluster, free_gpus=free, running=view, pending=pending,
                               usable=None, lookup=lookup)
        else:
            st = ClusterState(t, self.cluster, free, view, pending, lookup=lookup)
        d = st.__dict__
        d["_handed"] = (ledger, ledger._version)
        if fb is not None:
            d["_free_bytes"] = (free, (bytes(fb), self._free_bound))
            d["_free_total"] = (free, self._total_gpus - self._used)
        return st

    # ------------------------------------------------------------------ mechanics
    def _own_free(self) -> np.ndarray:
        """``free``, to change: if a state built earlier still holds a view of it, the spare buffer
        (brought up to date by the placements changed since it was ``free``: O(their nodes)) or,
        while a state holds that one too, a copy takes its place. Every change the caller makes is
        logged in ``_free_log`` (``(placement, sign)``; past ``_log_max`` entries the spare is dropped and the next swap copies)."""
        lent = self._free_lent
        if lent is not None:
            if lent() is not None:
                spare, sl = self._spare, self._spare_lent
                if spare is not None and (sl is None or sl() is None):
                    mv, ro = self._spare_mv, self._spare_ro
                    for p, sign in self._free_log:
                        for n, c in p.alloc:
                            mv[n] += sign * c
                else:
                    spare, mv, ro = _int_buffer(self.free)
                self._spare, self._spare_mv, self._spare_ro = self.free, self._free_mv, self._free_ro
                self.free, self._free_mv, self._free_ro = spare, mv, ro
                self._spare_lent = lent
                self._free_log.clear()
            self._free_lent = None
        return self.free

    def _free_rewritten(self) -> None:
        """``free`` was changed in bulk (not logged in ``_free_log``): the spare buffer is stale."""
        self._spare = self._spare_mv = self._spare_ro = self._spare_lent = None
        self._free_log.clear()

    def _push_completion(self, j: _Job) -> None:
        j.version += 1
        if j.rate <= 0:
            return
        remaining = j.spec.total_samples - j.done
        t_ref, now = j.t_ref, self.time
        t_fin = (t_ref if t_ref > now else now) + (remaining if remaining > 0.0 else 0.0) / j.rate
        self._seq += 1
        _heappush(self.heap, (t_fin, self._seq, j.idx, j.version))

    def _settle(self, j: _Job) -> None:
        """Fold progress up to now into ``done`` before a rate change."""
        t = self.time
        if t > j.t_ref:
            j.cs_time += t - j.t_ref
            j.cs_weighted += (t - j.t_ref) * j.cs
            j.done = j.progress(t)
            j.t_ref = t

    def _update_rates(self, ids: Iterable[str]) -> None:
        """Give each running job of ``ids`` its ledger CS: fold its progress so far and push its new
        completion time if the CS changed (or it has no rate yet)."""
        ledger, by_id = self.ledger, self.by_id
        for jid in ids:
            j = by_id[jid]
            cs = ledger.cs(jid)
            if abs(cs - j.cs) > 1e-12 or j.rate == 0.0:
                self._settle(j)
                j.cs = cs
                j.rate = j.iso / cs
                s = j.slot
                if s >= 0:
                    s *= _SL
                    self._sl[s + 1:s + 5] = array("d", (j.done, j.rate, j.t_ref, cs))
                self._push_completion(j)

    def _slot_compact(self) -> None:
        """Drop the stopped jobs' entries from the per-run lists (order kept)."""
        sl = np.frombuffer(self._sl).reshape(-1, _SL)
        keep = ~np.isnan(sl[:, 4])  # a live slot's CS is a number, a stopped job's NaN (_SL_DEAD)
        new_slot = np.cumsum(keep) - 1  # old slot -> new slot (for kept ones)
        self._sl = array("d", sl[keep].tobytes())
        rw = np.frombuffer(self._rw, dtype=np.int64).reshape(-1, _RW)
        rows = keep[rw[:, 2]]
        kept = rw[rows]
        kept_slots = kept[:, 2].copy()
        kept[:, 2] = new_slot[kept_slots]
        self._rw = array("q", kept.astype(np.int64).tobytes())
        first_row = np.flatnonzero(np.r_[True, kept_slots[1:] != kept_slots[:-1]]) if kept_slots.size else kept_slots
        self._sl_job = list(filter(None, self._sl_job))  # the running jobs' (a _Job is true)
        for k, (x, r) in enumerate(zip(self._sl_job, first_row.tolist())):
            x.slot, x.row0 = k, r
        self._sl_dead = 0

    def _in_order(self, ids: set[str]) -> list[str]:
        """``ids`` in trace order (so that runs replay exactly whatever the set's order)."""
        if len(ids) == 1:
            return list(ids)
        by_id = self.by_id
        return sorted(ids, key=lambda jid: by_id[jid].idx)

    def start(self, job_id: str, p: Placement, overhead: float | None = None) -> None:
        """Start a pending job on ``p`` (raises if it does not fit). It makes no progress for ``overhead``
        seconds (GPUs held); ``None``: ``restart_overhead`` if it was preempted before, else 0."""
        j = self.by_id[job_id]
        if j.info.placement is not None:
            raise SimulationError(f"job {job_id} is already running")
        _check_placement(job_id, j.info.gpu_demand, p, self.free)
        self._start(j, p, overhead)

    def _start(self, j: _Job, p: Placement, overhead: float | None = None) -> None:
        """:meth:`start` of pending job ``j`` on ``p``, which fits (checked by the caller)."""
        alloc = p.alloc
        self._epoch += 1  # _change_free(p, -1), inline
        lent = self._free_lent
        if lent is not None:
            if lent() is None:  # _own_free() when no state holds `free` any more
                self._free_lent = None
            else:
                self._own_free()
        free, fb = self._free_mv, self._free_bytes
        for n, c in alloc:
            free[n] -= c
        if fb is not None:
            for n, c in alloc:
                fb[n] -= c
        if self._spare is not None:  # log the change for the spare buffer (see _own_free)
            log = self._free_log
            log.append((p, -1))
            if len(log) > self._log_max:
                self._spare = self._spare_mv = self._spare_ro = self._spare_lent = None
                log.clear()
        gpus = p.total_gpus
        self._used += gpus
        self.pending.remove(j)
        t = self.time
        info = j.info
        info.placement = p
        info.start_time = t
        if j.first_start != j.first_start:  # NaN: never started before
            j.first_start = t
        spec = j.spec
        model = spec.model
        key = (model, gpus, len(alloc))  # policies.ledger.job_key(model, p)
        memo = self._iso_memo
        if memo is None:
            iso = self.perf.throughput(spec, p, self.cluster)  # at the pace of its slowest GPU type
        else:
            got = memo.get(key)
            if got is None:
                got = memo[key] = (key, self.perf.throughput(spec, p, self.cluster))
            key, iso = got  # the memo's key: jobs of one shape share one tuple (no tracked object per job)
        j.key = key
        iso = j.iso = iso * j.noise
        if overhead is None:
            overhead = self.cfg.restart_overhead if info.preemptions > 0 else 0.0
        t_ref = j.t_ref = t + overhead if overhead else t
        j.seg_start = t
        self._run_seq += 1
        j.run_seq = self._run_seq
        self._touched = True
        self.running[j.idx] = j
        ledger = self.ledger
        job_id = spec.job_id
        changed = ledger.add(job_id, model, p, info, key)
        cs = j.cs = ledger._jobs[job_id].cs if key[2] > 1 else 1.0  # ledger.cs(job_id) (its own ledger: no fork)
        rate = j.rate = iso / cs
        if self._vec:  # its record and allocation rows in the per-run arrays
            sl_job = self._sl_job
            s = j.slot = len(sl_job)
            rw = self._rw
            j.row0 = len(rw) // _RW
            sl_job.append(j)
            self._sl.extend((spec.total_samples, j.done, rate, t_ref, cs))
            for n, c in alloc:
                rw.extend((n, c, s))
        # _push_completion(j)
        j.version += 1
        if rate > 0:
            remaining = spec.total_samples - j.done
            self._seq += 1
            _heappush(self.heap, ((t_ref if t_ref > t else t) + (remaining if remaining > 0.0 else 0.0) / rate,
                                       self._seq, j.idx, j.version))
        if changed:
            self._update_rates(self._in_order(changed))
        # the utilisation step
        if self.util_t[-1] == t:
            self.util_used[-1] = self._used
        else:
            self.util_t.append(t)
            self.util_used.append(self._used)
        self.dirty = True

    def _stop(self, j: _Job) -> Placement:
        t = self.time
        t_ref = j.t_ref
        if t > t_ref:  # _settle(j)
            dt = t - t_ref
            j.cs_time += dt
            j.cs_weighted += dt * j.cs
            done = j.done + j.rate * dt  # j.progress(t)
            total = j.spec.total_samples
            j.done = total if total < done else done  # min(done, total)
            j.t_ref = t
        info = j.info
        p = info.placement
        assert p is not None
        gpus = p.total_gpus
        j.run_time += t - j.seg_start
        j.att_base += gpus * (t - j.seg_start)
        info.attained_service = j.att_base
        self._epoch += 1  # _change_free(p, 1), inline
        if self._free_lent is not None:  # (a start, in the round after a state, clears the mark first)
            self._own_free()
        free, fb = self._free_mv, self._free_bytes
        alloc = p.alloc
        for n, c in alloc:
            free[n] += c
        if fb is not None:
            for n, c in alloc:
                fb[n] += c
        if self._spare is not None:  # log the change for the spare buffer (see _own_free)
            log = self._free_log
            log.append((p, 1))
            if len(log) > self._log_max:
                self._spare = self._spare_mv = self._spare_ro = self._spare_lent = None
                log.clear()
        self._used -= gpus
        if self._views:
            live = False
            for ref in self._views:
                v = ref()
                if v is not None:
                    v._stopped(j)
                    live = True
            if not live:
                self._views = []
        del self.running[j.idx]
        s = j.slot
        if s >= 0:  # its entries in the per-run lists made neutral (no work left, no GPUs)
            self._sl_job[s] = None
            self._sl[s * _SL:(s + 1) * _SL] = _SL_DEAD
            rw = self._rw
            r = j.row0 * _RW + 1
            if len(alloc) == 1:
                rw[r] = 0
            else:
                for r in range(r, (j.row0 + len(alloc)) * _RW, _RW):
                    rw[r] = 0
            j.slot = j.row0 = -1
            self._sl_dead += 1
            if self._sl_dead > self.COMPACT_AFTER and 2 * self._sl_dead > len(self._sl_job):
                self._slot_compact()
        info.placement = None
        info.start_time = None
        j.rate = 0.0
        j.version += 1
        changed = self.ledger.remove(j.spec.job_id)
        if changed:
            self._update_rates(self._in_order(changed))
        if self.util_t[-1] == t:  # the utilisation step
            self.util_used[-1] = self._used
        else:
            self.util_t.append(t)
            self.util_used.append(self._used)
        self.dirty = True
        return p

    def preempt(self, job_id: str) -> None:
        """Stop a running job; it keeps its progress and waits again."""
        j = self.by_id[job_id]
        if j.info.placement is None:
            raise SimulationError(f"job {job_id} is not running")
        self._stop(j)
        j.info.done_samples = j.done
        j.info.preemptions += 1
        self.preemptions += 1
        self.pending.append(j)

    def _check_completion(self, j: _Job) -> None:
        """Raise :class:`AssertionError` unless ``j``'s uncapped progress now is its total work (catches
        completions that come late as well as early; ``check_invariants`` on)."""
        got = j.done + j.rate * max(0.0, self.time - j.t_ref)
        total = j.spec.total_samples
        if abs(got - total) > 1e-6 * total:
            raise AssertionError(f"job {j.spec.job_id} completes at t={self.time} with {got} of {total} samples")

    def resize(self, job_id: str, p: Placement) -> None:
        """Move a running elastic job to placement ``p`` (any GPU total in its ``[min_gpus, max_gpus]``):
        it stops and starts again on ``p`` at once, keeping its progress, and makes none for
        ``resize_overhead`` seconds (GPUs held). Its ``gpu_demand`` becomes ``p``'s total.
        :class:`SimulationError` unless it runs, is elastic and ``p`` fits the free GPUs plus its own."""
        j = self.by_id[job_id]
        info = j.info
        old = info.placement
        if old is None:
            raise SimulationError(f"job {job_id} is not running")
        if not info.elastic or not info.min_gpus <= p.total_gpus <= info.max_gpus:  # type: ignore[operator]
            raise SimulationError(f"job {job_id}: cannot resize to {p.total_gpus} GPUs (elastic range "
                                  f"{[info.min_gpus, info.max_gpus] if info.elastic else 'none'})")
        free = self.free.copy()
        for n, c in old.alloc:
            free[n] += c
        _check_placement(job_id, p.total_gpus, p, free, " (with its own GPUs)")
        self._stop(j)
        info.gpu_demand = p.total_gpus
        self.pending.append(j)  # start() takes it from the queue
        ov = self.cfg.resize_overhead
        self.start(job_id, p, overhead=self.cfg.restart_overhead if ov is None else ov)

    def check_decision(self, dec: Decision) -> None:
        """Raise :class:`SimulationError` with the first problem :func:`policies.validate.check_decision`
        finds in ``dec`` now, changing nothing."""
        from trainer.sim_backend import SimBackend

        problems = SimBackend(self).check(dec)
        if problems:
            raise SimulationError(problems[0].message)

    def apply(self, dec: Decision) -> int:
        """Apply a decision (preemptions, resizes, then placements in order); returns the number of
        jobs started. All or nothing: an invalid entry raises :class:`SimulationError` before any of it
        is applied (:meth:`trainer.sim_backend.SimBackend.apply`)."""
        from trainer.sim_backend import SimBackend

        return len(SimBackend(self).apply(dec).placed)

    # ------------------------------------------------------------------ loop
    def _next_completion(self) -> float:
        h = self.heap
        while h:
            t, _, idx, ver = h[0]
            j = self.jobs[idx]
            if ver != j.version or j.info.placement is None:
                heapq.heappop(h)
                continue
            return t
        return math.inf

    def advance_to_next_event(self, until: float = math.inf) -> bool:
        """Process the next arrival / completion batch at or before ``until``.

        Returns ``True`` if an event was processed, ``False`` if none happens
        before ``until`` (time is then moved to ``until``).
        """
        submit, jobs = self._submit, self.jobs
        n_jobs = len(jobs)
        na = self.next_arrival
        t_arr = submit[na] if na < n_jobs else math.inf
        heap = self.heap
        t_cmp = math.inf
        while heap:  # _next_completion()
            top = heap[0]
            j = jobs[top[2]]
            if top[3] != j.version or j.info.placement is None:
                _heappop(heap)
                continue
            t_cmp = top[0]
            break
        t = t_arr if t_arr < t_cmp else t_cmp
        if t > until or t == math.inf:  # nothing before `until` (or nothing at all: no job left)
            if until < math.inf:
                self.time = max(self.time, until)
            return False
        now = self.time
        if t > now:
            self.time = now = t
        # Completions at t, within rounding: a job completes now if its completion time is within
        # _EPS of now relative to both the clock and the job's own duration at its rate
        # (total_samples / rate), so it is never cut short by more than _EPS of its work; a bound
        # on the clock alone (1e-9 * t) could end a job of a few ms a sizeable part of its work early.
        # When the first completion (heap[0], found above) is later than now by more than _EPS * max(1, now),
        # at least _EPS times that scale, none completes now (an arrival alone): no loop.
        if t_cmp - now <= _EPS * (now if now > 1.0 else 1.0):
            while heap:
                tc, _seq, idx, ver = heap[0]
                j = jobs[idx]
                if ver != j.version or j.info.placement is None:  # stale: the job's rate changed or it stopped
                    _heappop(heap)
                    continue
                scale = now if now > 1.0 else 1.0  # min(max(1, now), the job's duration at its rate)
                dur = j.spec.total_samples / j.rate
                if dur < scale:
                    scale = dur
                if tc - now > _EPS * scale:
                    break
                _heappop(heap)
                if self._check_inv:
                    self._check_completion(j)
                self._stop(j)  # the job completes
                j.done = done = j.spec.total_samples
                j.info.done_samples = done
                j.finish = now
                self.finished += 1
        na = self.next_arrival
        if na < n_jobs and submit[na] <= now:
            pending = self.pending
            while na < n_jobs and submit[na] <= now:
                pending.append(jobs[na])
                na += 1
            self.next_arrival = na
            self.dirty = True
        if self._check_inv:
            self.check_invariants()
        return True

    def run(self, progress: Callable[[int, int], None] | None = None) -> SimResult:
        """Reset, then run the policy until every job has finished: the round loop
        (:class:`policies.rounds.RoundLoop`) over this simulator's backend
        (:class:`trainer.sim_backend.SimBackend`, which says when rounds happen).

        :param progress: optional ``(finished jobs, all jobs) -> None`` called as jobs finish.
        """
        import time as _time

        from policies.rounds import RoundLoop
        from trainer.sim_backend import SimBackend

        if self.policy is None:
            raise ValueError("Simulator.run needs a policy")
        t0 = _time.perf_counter()
        self.reset_state()
        freeze = len(self.jobs) >= GC_FREEZE_MIN_JOBS
        with _gc_frozen(freeze):
            RoundLoop(SimBackend(self, progress), self.policy).run()
            wall = _time.perf_counter() - t0
            with _gc_paused():
                res = self._result(wall)
                if freeze:  # the records join the frozen objects, unfrozen with them: no young collection scans them
                    gc.freeze()
        return res

    def advance_to_round(self, t_round: float) -> None:
        """Process every event up to ``t_round`` and move time there."""
        while self.advance_to_next_event(until=t_round):
            pass

    # ------------------------------------------------------------------ metrics
    def _sample_metrics(self) -> None:
        if self.time - self._last_sample < self.cfg.metrics_interval - _EPS:
            return
        self._last_sample = self.time
        self.samples_t.append(self.time)
        self.samples_frag.append(self.fragmentation())
        self.samples_cs.append(self.mean_cs())

    def fragmentation(self) -> float:
        """Mean over nodes of SCED2's fragmentation (seed 003, eq. 1).

        For node ``i`` with GPU remaining times ``x`` (0 when free):
        ``1 - (sum x)^2 / (n * sum x^2)``; a node with all ``x = 0`` counts 0.
        Each node's sums are added in start order: by a loop over the running jobs
        when there are few, else in one vectorised pass over their allocations
        (the same additions in the same order, so the same floats).
        """
        if not self.running:
            return 0.0
        t = self.time
        if not self._vec:
            n_nodes = self.cluster.num_nodes
            s1 = [0.0] * n_nodes
            s2 = [0.0] * n_nodes
            for j in self.running.values():
                total = j.spec.total_samples
                rem = (total - min(j.done + j.rate * max(0.0, t - j.t_ref), total)) / j.rate
                for n, c in j.info.placement.alloc:  # type: ignore[union-attr]
                    x = c * rem
                    s1[n] += x
                    s2[n] += x * rem
            a1, a2 = np.array(s1), np.array(s2)
            with np.errstate(divide="ignore", invalid="ignore"):
                return float(np.where(a2 > 0, 1.0 - a1 * a1 / (self.capacity * a2), 0.0).mean())
        sl = np.frombuffer(self._sl).reshape(-1, _SL)
        total, done, rate, t_ref = sl[:, 0], sl[:, 1], sl[:, 2], sl[:, 3]
        rem = (total - np.minimum(done + rate * np.maximum(0.0, t - t_ref), total)) / rate
        rw = np.frombuffer(self._rw, dtype=np.int64).reshape(-1, _RW)
        r = rem[rw[:, 2]]
        x = rw[:, 1] * r
        node = rw[:, 0]
        n_nodes = self.cluster.num_nodes
        a1 = np.bincount(node, weights=x, minlength=n_nodes)
        a2 = np.bincount(node, weights=x * r, minlength=n_nodes)
        with np.errstate(divide="ignore", invalid="ignore"):
            frag = np.where(a2 > 0, 1.0 - a1 * a1 / (self.capacity * a2), 0.0)
        return float(frag.mean())

    def mean_cs(self) -> float:
        """Mean contention sensitivity of the running jobs (1 when none run)."""
        if not self.running:
            return 1.0
        if not self._vec:
            return float(np.mean([j.cs for j in self.running.values()]))
        cs = np.frombuffer(self._sl)[4::_SL]
        return float(np.mean(cs[~np.isnan(cs)]))

    def check_invariants(self) -> None:
        """Raise :class:`AssertionError` unless GPU accounting adds up and the incremental contention
        ledger equals one recomputed from the running jobs' placements (and every running job's rate
        is its isolated throughput over its ledger CS)."""
        if (self.free < 0).any() or (self.free > self.capacity).any():
            raise AssertionError(f"GPU over-allocation: free={self.free.tolist()}")
        used = np.zeros_like(self.capacity)
        for j in self.running.values():
            for n, c in j.info.placement.alloc:  # type: ignore[union-attr]
                used[n] += c
        if not np.array_equal(used + self.free, self.capacity) or int(used.sum()) != self._used:
            raise AssertionError("GPU accounting mismatch")
        if self._free_bytes is not None and list(self._free_bytes) != self.free.tolist():
            raise AssertionError("the byte mirror of free GPUs is stale")
        live = [j for j in self._sl_job if j is not None]
        if live != (list(self.running.values()) if self._vec else []):
            raise AssertionError("per-run lists: their jobs are not the running jobs in start order")
        for j in live:
            s, r = j.slot, j.row0
            p = j.info.placement
            assert p is not None
            rows = [tuple(self._rw[k * _RW:(k + 1) * _RW]) for k in range(r, r + p.num_nodes)]
            fields = tuple(self._sl[s * _SL:(s + 1) * _SL])
            if fields != (j.spec.total_samples, j.done, j.rate, j.t_ref, j.cs) or rows != [
                    (n, c, s) for n, c in p.alloc]:
                raise AssertionError(f"job {j.spec.job_id}: per-run lists are stale")
        led = self.ledger
        led.check()
        if list(led) != [j.spec.job_id for j in self.running.values()]:
            raise AssertionError("contention ledger: its jobs are not the running jobs")
        for j in self.running.values():
            jid = j.spec.job_id
            if led.placement(jid) != j.info.placement or led.key(jid) != j.key:
                raise AssertionError(f"job {jid}: ledger placement {led.placement(jid)} != {j.info.placement}")
            cs = led.cs(jid)
            if abs(cs - j.cs) > 1e-9 * cs or abs(j.rate * j.cs - j.iso) > 1e-9 * j.iso:
                raise AssertionError(f"job {jid}: stale rate (cs {j.cs} vs {cs}, rate {j.rate}, iso {j.iso})")

    def result(self, wall: float = 0.0) -> SimResult:
        with _gc_paused():
            return self._result(wall)

    def _result(self, wall: float) -> SimResult:
        recs = []
        append = recs.append
        rec = JobRecord  # positional arguments in field order (cheaper than keywords on a million jobs)
        for j in self.jobs:
            spec = j.spec
            jct = j.finish - spec.submit_time
            run_time = j.run_time
            cs_time = j.cs_time
            append(rec(spec.job_id, spec.model, spec.gpu_demand, spec.submit_time, j.first_start, j.finish, jct,
                       jct - run_time, run_time, j.ideal, j.cs_weighted / cs_time if cs_time > 0 else 1.0,
                       j.info.preemptions, j.key[2] if j.key else 0, spec.total_samples, j.done))
        makespan = max(map(_finish_time_of, recs), default=0.0)
        return SimResult(
            policy=getattr(self.policy, "name", "none"),
            cluster=self.cluster,
            jobs=recs,
            makespan=makespan,
            util_t=np.array(self.util_t),
            util_used=np.array(self.util_used),
            samples_t=np.array(self.samples_t),
            samples_frag=np.array(self.samples_frag),
            samples_cs=np.array(self.samples_cs),
            rounds=self.rounds,
            decisions=self.decisions,
            preemptions=self.preemptions,
            wall_time=wall,
            meta={} if self.compat is None else {"compat": self.compat.name, "round_len": self.cfg.round_len},
        )
