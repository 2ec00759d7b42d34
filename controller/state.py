"""Build the policy's :class:`~policies.state.ClusterState` from what Slurm reports.

The simulator and the controller hand policies the same state: nodes by
index with free GPUs, running jobs with placements and throughputs, pending
jobs in arrival order. Here it comes from ``sinfo``/``squeue`` (plus, when
node agents answer, measured progress and contention sensitivity).

Times are epoch seconds, work is in samples, throughput in samples/s.

Workload declaration (the job's ``--comment``)::

    rlsched:model=MoE,samples=200000[,min_gpus=1,max_gpus=4][,key=value...]

``min_gpus`` / ``max_gpus`` (both or neither) make the job elastic: a policy may resize it within that
range (:func:`elastic_range`; live, a resize is checkpoint -> requeue -> restart at the new size,
:mod:`controller.backend`).

No model: the configured default profile. No ``samples``: the work is
estimated as (time limit, else ``default_runtime_s``) x the model's best
isolated throughput, so SJF/SRTF order by requested time.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass, field
from typing import Collection, Mapping, MutableMapping, Sequence

import numpy as np

from controller.slurm import MANAGED_MARK, SlurmJob, SlurmNode, dependency_met
from policies.cluster import GPU_TYPE_RE, ClusterSpec, NodeSpec, Placement
from policies.gputypes import REFERENCE_TYPE, is_known_gpu_type, normalize_gpu_type
from policies.ledger import ContentionLedger
from policies.perf import ContentionModel
from policies.resources import ResourceDemand, ResourceError
from policies.state import ClusterState, JobInfo, MeasuredSpeeds
from policies.workloads import UnknownModelError, canonical_model

__all__ = ["JobRequest", "parse_comment", "natural_key", "build_cluster", "SlurmView", "build_state", "partition_warning",
           "job_demand", "elastic_range", "PROFILED_ALONE", "record_speed"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobRequest:
    """What a job's comment declares. ``model`` is canonical or ``None`` (use the default)."""

    model: str | None = None
    samples: float | None = None
    options: tuple[tuple[str, str], ...] = ()
    problem: str | None = None  # why the comment was (partly) ignored


def parse_comment(comment: str | None) -> JobRequest:
    """Parse ``rlsched:model=MoE,samples=1e5`` anywhere in a job comment.

    Bad values do not fail the job: they are reported in ``problem`` and the
    defaults apply.
    """
    # items are comma-separated; a space after a comma is allowed ("model=MoE, key=run-7")
    m = re.search(r"rlsched:(\S+(?:,\s+[^\s,]+)*)", comment or "")
    if not m:
        return JobRequest()
    model: str | None = None
    samples: float | None = None
    opts: list[tuple[str, str]] = []
    problems: list[str] = []
    for item in m.group(1).split(","):
        item = item.strip()
        if not item:
            continue
        k, sep, v = item.partition("=")
        k = k.strip().lower()
        if not sep:
            problems.append(f"{item!r} is not key=value")
            continue
        if k == "model":
            try:
                model = canonical_model(v)
            except UnknownModelError as exc:
                problems.append(str(exc))
        elif k == "samples":
            try:
                samples = float(v)
                if not (samples > 0 and math.isfinite(samples)):
                    raise ValueError
            except ValueError:
                problems.append(f"samples={v!r} is not a positive number")
                samples = None
        else:
            opts.append((k, v))
    return JobRequest(model, samples, tuple(opts), "; ".join(problems) or None)


def elastic_range(options: Sequence[tuple[str, str]], gpus: int, total_gpus: int
                  ) -> tuple[int | None, int | None, str | None]:
    """``(min_gpus, max_gpus, problem)`` from a comment's ``min_gpus`` / ``max_gpus`` options: both
    integers with ``1 <= min_gpus <= gpus <= max_gpus`` (``gpus``: the job's GPUs now); ``max_gpus``
    beyond the partition's ``total_gpus`` is cut to it. ``(None, None, None)`` without them;
    ``(None, None, why)`` when they are malformed (the job is then not elastic)."""
    opts = dict(options)
    lo_s, hi_s = opts.get("min_gpus"), opts.get("max_gpus")
    if lo_s is None and hi_s is None:
        return None, None, None
    if lo_s is None or hi_s is None:
        return None, None, "min_gpus and max_gpus go together"
    try:
        lo, hi = int(lo_s), int(hi_s)
    except ValueError:
        return None, None, f"min_gpus={lo_s!r}, max_gpus={hi_s!r} are not integers"
    hi = min(hi, total_gpus)
    if not 1 <= lo <= gpus <= hi:
        return None, None, f"elastic range needs 1 <= min_gpus <= GPUs ({gpus}) <= max_gpus, got {lo}..{hi}"
    return lo, hi, None


def natural_key(name: str) -> tuple:
    """``node2`` < ``node10``."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))


def build_cluster(nodes: Sequence[SlurmNode], partition: str | None, intra_bw_gbps: float, inter_bw_gbps: float) -> ClusterSpec:
    """The managed nodes (in ``partition``, with GPUs) in natural name order, with their GRES GPU type,
    CPUs and memory as sinfo reports them.

    A GRES type the speed table of :mod:`policies.gputypes` does not know (``a100``) is kept as the
    node's type with ``gpu_speed = 1.0`` (the reference speed), so the performance model can price
    it; a type that is not a valid :data:`policies.cluster.GPU_TYPE_RE` name is left out.

    Down/drained nodes stay in the spec (so indices and RL input shapes are
    stable); they simply get 0 free GPUs.
    """
    mine = [n for n in nodes if n.gpus > 0 and (partition is None or partition in n.partitions)]
    if not mine:
        raise ValueError(f"no nodes with GPUs in partition {partition or '(any)'}")
    mine.sort(key=lambda n: natural_key(n.name))
    specs = []
    for n in mine:
        t = n.gpu_type if n.gpu_type and GPU_TYPE_RE.fullmatch(n.gpu_type) else None
        speed = 1.0 if t is not None and not is_known_gpu_type(t) else None
        specs.append(NodeSpec(n.name, n.gpus, t, cpus=n.cpus, mem_gb=n.mem_gb, gpu_speed=speed))
    return ClusterSpec(tuple(specs), intra_bw_gbps=intra_bw_gbps, inter_bw_gbps=inter_bw_gbps)


@dataclass
class SlurmView:
    """One round's snapshot: the policy state plus the Slurm facts behind it.

    :param state: what the policy sees.
    :param jobs: policy job id -> Slurm job, for every job in ``state``.
    :param in_flight: released managed jobs that have not started yet
        (their GPUs are reserved in ``state.free_gpus``).
    :param warnings: per-job notes (bad comments, unplaceable demands, :func:`partition_warning`).
    :param waiting: held managed jobs left out of ``state`` this round -> why.
    """

    state: ClusterState
    jobs: dict[str, SlurmJob]
    in_flight: list[SlurmJob] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    waiting: dict[str, str] = field(default_factory=dict)


def _reserve(free: np.ndarray, idx: Sequence[int], gpus: int, planned: Mapping[int, int] | None) -> None:
    """Take a released-but-not-started job's GPUs out of ``free`` (planned split if known)."""
    if planned:
        for n, c in planned.items():
            free[n] -= min(c, max(free[n], 0))
        return
    need = gpus
    for n in idx:
        take = min(need, max(int(free[n]), 0))
        free[n] -= take
        need -= take


def partition_warning(j: SlurmJob, partition: str | None) -> str | None:
    """Why a pending job the controller leaves alone for its partition or its missing mark needs an
    operator (None: nothing to say): a job job_submit.lua marked and held in another partition than the
    controller's stays held for ever; an unmarked job asking for GPUs in the controller's partition is
    scheduled by Slurm itself beside the controller's placements (job_submit.lua not in use?)."""
    if not j.pending:
        return None
    if j.managed and j.held and not j.in_partition(partition):
        return (f"job {j.job_id}: marked by job_submit.lua but held in partition {j.partition}, not the controller's "
                f"[slurm] partition {partition}: it stays held. Make MANAGED_PARTITION in job_submit.lua and "
                f"[slurm] partition in the controller's config name the same partition (a job already held "
                f"elsewhere: scontrol update JobId={j.job_id} Partition={partition}, or cancel it)")
    if not j.managed and j.gpus > 0 and j.in_partition(partition):
        return (f"job {j.job_id}: asks for {j.gpus} GPU(s) in partition {j.partition} but is not marked by "
                f"job_submit.lua (no '{MANAGED_MARK}' in its admin comment): Slurm schedules it itself, on GPUs "
                f"the controller places jobs on. Is job_submit.lua next to slurm.conf, with JobSubmitPlugins=lua "
                f"and MANAGED_PARTITION naming this partition? (jobs submitted before it was in use are not marked)")
    return None


def _type_key(gpu_type: str | None) -> str:
    """A GPU type as the decision validator matches it: normalized, an untyped node the reference type."""
    return REFERENCE_TYPE if gpu_type is None else normalize_gpu_type(gpu_type)


def job_demand(j: SlurmJob, cluster: ClusterSpec, partition: str | None) -> tuple[ResourceDemand | None, str | None]:
    """The resource demand of ``j`` for :attr:`~policies.state.JobInfo.demand`, or why it is left held.

    A job that asks for a GPU type (``--gpus=v100:4``), CPUs per GPU (``--cpus-per-gpu``) or memory per
    GPU (``--mem-per-gpu``) gets ``ResourceDemand(j.gpus, gpu_type, cpus_per_gpu, mem_gb_per_gpu)``; one
    that asks for none of them ``(None, None)`` (checked on GPU counts only). Left held (``(None, why)``):
    a type that is not a valid type name, a type no node of the partition has, and more GPUs of the type
    than the partition's nodes of that type have together."""
    if j.gpu_type is None and not j.cpus_per_gpu and not j.mem_gb_per_gpu:
        return None, None
    try:
        d = ResourceDemand(j.gpus, gpu_type=j.gpu_type, cpus_per_gpu=j.cpus_per_gpu, mem_gb_per_gpu=j.mem_gb_per_gpu)
    except ResourceError as exc:
        return None, f"job {j.job_id}: its request cannot be checked ({exc}); left held"
    if d.gpu_type is not None:
        want = _type_key(d.gpu_type)
        have = sum(n.gpus for n in cluster.nodes if _type_key(n.gpu_type) == want)
        where = f"partition {partition}" if partition else "the managed nodes"
        if have == 0:
            types = sorted({n.gpu_type or "untyped" for n in cluster.nodes})
            return None, (f"job {j.job_id}: asks for GPU type {d.gpu_type}, which no node of {where} has "
                          f"(types there: {', '.join(types)}); left held")
        if j.gpus > have:
            return None, f"job {j.job_id}: asks for {j.gpus} {d.gpu_type} GPUs, {where} has {have}; left held"
    return d, None


#: The agents' ``isolated_source`` of a throughput measured while the job ran alone on its nodes
#: (:mod:`nodeagent.server`); only such a figure goes into :attr:`~policies.state.JobInfo.measured_speeds`.
PROFILED_ALONE = "profiled-alone"


def record_speed(book: MutableMapping[str, MeasuredSpeeds], sid: str, gpus: int, servers: int,
                 stats: Mapping | None) -> None:
    """Add a running job's measured isolated throughput to ``book`` (Slurm job id -> speeds): its agents'
    ``isolated_samples_per_s`` when ``isolated_source`` is :data:`PROFILED_ALONE` and the figure is a finite
    number > 0, under the shape ``(gpus, servers)`` it runs on. Anything else (no stats, a job-supplied
    ``reference`` figure, the twin's ``simulator`` figure) records nothing."""
    if not stats or stats.get("isolated_source") != PROFILED_ALONE:
        return
    try:
        v = float(stats.get("isolated_samples_per_s") or 0.0)
    except (TypeError, ValueError):
        return
    if not (v > 0 and math.isfinite(v)) or not 1 <= servers <= gpus:
        return
    old = book.get(sid)
    if old is None or old.at(gpus, servers) != v:
        book[sid] = (old or MeasuredSpeeds()).with_speed(gpus, servers, v)


def _submitted(j: SlurmJob, now: float) -> float:
    """``j``'s submit time (epoch s), or ``now`` when Slurm gives none (``None``; a time of 0 is a time)."""
    return now if j.submit_time is None else j.submit_time


def build_state(
    now: float,
    cluster: ClusterSpec,
    nodes: Sequence[SlurmNode],
    jobs: Sequence[SlurmJob],
    perf: ContentionModel,
    *,
    partition: str | None,
    default_model: str,
    default_runtime_s: float,
    progress: Mapping[str, Mapping] | None = None,
    planned: Mapping[str, Mapping[str, int]] | None = None,
    skip: Mapping[str, str] | None = None,
    no_preempt: Collection[str] = (),
    speeds: MutableMapping[str, MeasuredSpeeds] | None = None,
) -> SlurmView:
    """Assemble the ClusterState for one round.

    :param progress: Slurm job id -> agent stats (``step``, ``total_steps``,
        ``samples_per_s``, ``isolated_samples_per_s``, ``cs``), or stored
        progress of a preempted job (``step``/``total_steps``).
    :param planned: Slurm job id -> node name -> GPUs the controller asked
        for when it released the job (to reserve GPUs of in-flight jobs; by
        name, so a change of the node set cannot shift it onto other nodes).
    :param skip: Slurm job id -> why: held jobs kept out of the policy's queue
        this round (the daemon's back-off for jobs Slurm did not start).
    :param no_preempt: Slurm job ids of running jobs the policy must not choose as victims
        this round (the daemon's back-off for jobs whose preemption failed). Jobs submitted
        with ``--no-requeue`` are never victims either: both get
        :attr:`~policies.state.JobInfo.preemptible` ``False``.
    :param speeds: Slurm job id -> isolated throughputs measured so far, kept by the caller from round
        to round and updated here: each running job's agent-measured isolated throughput on its
        placement's shape is added (:func:`record_speed`), entries of jobs no longer in ``jobs`` are
        dropped, and every job of the state gets its entry as
        :attr:`~policies.state.JobInfo.measured_speeds` (so a requeued job waits with the speeds it
        was measured at). ``None``: no job gets measured speeds.

    Held jobs that Slurm would not start yet are kept out of the queue too (listed in
    ``SlurmView.waiting``): an unmet ``--dependency`` (:func:`~controller.slurm.dependency_met`;
    Slurm does not re-evaluate it while the job is held) and a ``--begin`` time still in the
    future (a job that never ran: after a requeue the begin time is Slurm's own delay, which
    the controller overrides on release). So is a job an operator held with ``scontrol hold``
    (:attr:`~controller.slurm.SlurmJob.admin_held`).

    Each job's :attr:`~policies.state.JobInfo.demand` is :func:`job_demand` (its GPU type, CPUs and
    memory per GPU where it asked for any). A held job whose request no node set of the partition can
    meet (more GPUs than it has, a GPU type it lacks) stays held, with a warning, out of ``state``; a
    running job is kept where Slurm runs it (with no demand where its type check fails).
    """
    progress = progress or {}
    planned = planned or {}
    skip = skip or {}
    all_by_id = {j.job_id: j for j in jobs}
    comments: dict[str | None, JobRequest] = {}  # each distinct comment parsed once in this call
    index = {n.name: i for i, n in enumerate(cluster.nodes)}
    by_name = {n.name: n for n in nodes}
    free = np.zeros(cluster.num_nodes, dtype=np.int64)
    usable = np.zeros(cluster.num_nodes, dtype=bool)  # drained/down/missing: policies place nothing there
    for i, spec in enumerate(cluster.nodes):
        n = by_name.get(spec.name)
        if n is not None and n.usable:
            usable[i] = True
            free[i] = max(spec.gpus - n.gpus_used, 0)

    view = SlurmView(state=None, jobs={})  # type: ignore[arg-type]
    running: list[JobInfo] = []
    pending: list[JobInfo] = []
    ledger = ContentionLedger(perf, cluster.num_nodes)  # the running jobs' contention, by job id

    # Jobs in arrival order: submit time (a job without one counts as submitted now), then Slurm job id
    # (Slurm numbers jobs in submission order, and its submit times have 1 s resolution). Submit times are
    # passed on as Slurm gives them; policies break ties between equal submit times by job id as text, which
    # is submission order among ids of one width.
    for j in sorted(jobs, key=lambda x: (_submitted(x, now), x.job_id)):
        if not j.managed or not j.in_partition(partition):
            w = partition_warning(j, partition)
            if w is not None:
                view.warnings.append(w)
            continue
        if j.pending and not j.held:
            view.in_flight.append(j)
            idx = [index[n] for n in j.required_nodes if n in index]
            plan = {index[n]: int(c) for n, c in (planned.get(str(j.job_id)) or {}).items() if n in index}
            _reserve(free, idx, j.gpus, plan)
            continue
        if not (j.pending or j.state == "RUNNING"):
            continue
        if j.pending:
            why = skip.get(str(j.job_id))
            if j.admin_held:
                why = (f"held by an administrator (scontrol hold); 'scontrol uhold {j.job_id}' "
                       "hands it back to rlsched")
            if why is None and dependency_met(j, all_by_id) is False:
                why = f"dependency {j.dependency} not met"
            if why is None and j.restarts == 0 and j.eligible_time is not None and j.eligible_time > now:
                why = f"begin time {j.eligible_time:.0f} not reached"
            if why is not None:
                view.waiting[str(j.job_id)] = why
                continue
        req = comments.get(j.comment)
        if req is None:
            req = comments[j.comment] = parse_comment(j.comment)
        if req.problem:
            view.warnings.append(f"job {j.job_id}: comment {j.comment!r}: {req.problem}; using defaults")
        model = req.model or default_model
        if j.gpus < 1:
            continue
        if j.gpus > cluster.total_gpus:
            view.warnings.append(f"job {j.job_id}: asks for {j.gpus} GPUs, the partition has {cluster.total_gpus}; left held")
            continue
        demand, why = job_demand(j, cluster, partition)
        if why is not None and j.pending:
            view.warnings.append(why)
            continue
        lo, hi, bad_range = elastic_range(req.options, j.gpus, cluster.total_gpus)
        if bad_range:
            view.warnings.append(f"job {j.job_id}: comment {j.comment!r}: {bad_range}; not elastic")
        best = perf.best_isolated_throughput(model, j.gpus)
        if req.samples is not None:
            total = req.samples
        else:
            total = (j.time_limit_s or default_runtime_s) * best
        prog = progress.get(str(j.job_id), {})
        done = 0.0
        if prog.get("total_steps"):
            done = min(total, total * float(prog.get("step") or 0) / float(prog["total_steps"]))
        info = JobInfo(
            job_id=str(j.job_id),
            model=model,
            gpu_demand=j.gpus,
            submit_time=_submitted(j, now),
            total_samples=total,
            done_samples=done,
            best_thp=best,
            preemptions=j.restarts,
            demand=demand,
            min_gpus=lo,
            max_gpus=hi,
            extra={"slurm_job_id": j.job_id, "user": j.user, "name": j.name, "nodes": list(j.nodes)},
        )
        view.jobs[info.job_id] = j
        if j.pending:
            info.attained_service = float(prog.get("attained_service", 0.0))
            pending.append(info)
            continue
        alloc = {index[n]: c for n, c in j.gpus_per_node.items() if n in index and c > 0}
        if not alloc:  # no per-node detail: spread the total over its nodes in order
            idx = [index[n] for n in j.nodes if n in index]
            if not idx:
                continue
            base, rem = divmod(j.gpus, len(idx))
            alloc = {n: base + (1 if k < rem else 0) for k, n in enumerate(idx)}
        p = Placement.of(alloc)
        info.placement = p
        # requeuehold would fail after the checkpoint (the job would just end), or preempting it just failed
        info.preemptible = j.requeue and str(j.job_id) not in no_preempt
        info.start_time = j.start_time or now
        ran = max(now - info.start_time, 0.0)
        info.attained_service = float(prog.get("attained_service", 0.0)) + j.gpus * ran
        info.isolated_thp = float(prog.get("isolated_samples_per_s") or 0.0) or perf.throughput_for(model, p)
        if speeds is not None:
            record_speed(speeds, info.job_id, j.gpus, len(alloc), prog)
        if not prog.get("total_steps"):
            # no agent: assume progress at the isolated rate since the last start
            info.done_samples = min(total, done + info.isolated_thp * ran)
        ledger.add(info.job_id, model, p, info)
        running.append(info)

    if speeds is not None:
        present = {str(j.job_id) for j in jobs}
        for sid in [k for k in speeds if k not in present]:
            del speeds[sid]
        for info in (*running, *pending):
            info.measured_speeds = speeds.get(info.job_id)

    # achieved throughput: measured by the agent, else predicted from co-located jobs
    for info in running:
        prog = progress.get(info.job_id, {})
        measured = float(prog.get("samples_per_s") or 0.0)
        if measured > 0:
            info.achieved_thp = measured
        else:
            info.achieved_thp = info.isolated_thp / ledger.cs(info.job_id)
    view.state = ClusterState(time=now, cluster=cluster, free_gpus=np.maximum(free, 0), running=running, pending=pending,
                              usable=usable)
    view.state.use_contention(ledger)  # what placement rules priced by `perf` read
    return view
