"""The node agent gRPC server: job tracking, contention sensitivity, preemption.

One :class:`NodeAgentServer` per Slurm node. Job helpers report progress
(:class:`JobTracker` keeps per-job throughput windows); the controller reads
:meth:`JobStats` and calls :meth:`Preempt`, which starts an operation (one per
job: a second Preempt joins it) in its own thread and answers at once; the
operation signals the job's registered processes with SIGUSR2 and waits until
the checkpoint store holds a *new* checkpoint at or beyond the step the job had
reached, whose checksum verifies; :meth:`PreemptStatus` reads its outcome. No
RPC holds a gRPC worker while a job checkpoints, so Health is always served.

A report may register a process (the one Preempt signals) only if the agent
itself finds it is a process of the report's Slurm job owned by that job's
owner (:meth:`NodeAgentServicer.pid_problem`: the process's uid, its job
cgroup, else its ``SLURM_JOB_ID``), in every auth mode; each pid is checked
again before it is signalled.

Contention sensitivity (paper eq. 1): ``CS = isolated / achieved`` throughput
(samples/s). *Achieved* is measured over the last ``window_s`` seconds of
reports. *Isolated* comes from

(a) ``profiled-alone``: the throughput over the job's profiling window
    (``profile_steps`` steps, starting at the first report at least
    ``profile_skip_steps`` steps into a run, to skip start-up and warm-up) if
    no other job reported progress on this node during that window; or
(b) ``reference``: a number the job passes (``reference_samples_per_s``).

(a) is preferred once measured. Each agent judges "alone" for its own node;
a controller combining agents treats a multi-node job as alone if every
node's agent says so.

Logs are JSON lines (``{"event": ..., ...}``) on the ``nodeagent`` logger.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import secrets
import signal
import threading
import time
from collections import deque
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any, Callable

import grpc

from nodeagent.auth import AUTH_HEADER, REPLY_AUTH_HEADER, Authenticator, AuthError, Identity, RateLimited
from nodeagent.slurmjob import LookupLimited, SlurmJobInfo, SlurmJobs, SlurmUnavailable
from nodeagent.store import CheckpointInfo, CheckpointStore, validate_job_key
from proto import rlsched_agent_pb2 as pb
from proto import rlsched_agent_pb2_grpc as pb_grpc

log = logging.getLogger("nodeagent")

SERVICE = "/rlsched.agent.v1.NodeAgent/"
#: 2: credentials are bound to the agent's node name; 3: replies are signed (nodeagent.auth);
#: 4: Preempt answers at once with an operation polled with PreemptStatus; per-job keys; per-caller rates
VERSION = "4"
_STATES = ("running", "preempted", "finished")
_SLURM_ID_RE = re.compile(r"[A-Za-z0-9_]{1,64}")
_DEFAULT_KEY_RE = re.compile(r"slurm-([0-9]+(?:_[0-9]+)?)")  # job_key_for's default: slurm-<SLURM_JOB_ID>


def emit(event: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log one structured event as a JSON line."""
    log.log(level, "%s", json.dumps({"event": event, **fields}, default=str, sort_keys=True))


def pid_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            st = f.read()
        return st.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def proc_start_time(pid: int) -> int | None:
    """Start time of ``pid`` (clock ticks after boot, /proc/<pid>/stat field 22); None if gone or a zombie.

    (pid, start time) names one process: a pid reused by a later process has another start time.
    """
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return None if fields[0] == "Z" else int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def same_process(pid: int, start: int | None) -> bool:
    """True if ``pid`` is alive and (when ``start`` is known) still the process that had that start time."""
    now = proc_start_time(pid)
    return now is not None and (start is None or now == start)


def _proc_uid(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def _proc_env(pid: int, name: str) -> str | None | bool:
    """Value of env var ``name`` of ``pid``; None if absent; False if unreadable."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return False
    prefix = name.encode() + b"="
    for item in raw.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix):].decode(errors="replace")
    return None


@dataclass
class _Sample:
    t: float  # agent clock, s
    step: int
    samples: int  # cumulative in this run
    elapsed: float  # job's clock, s since run start


@dataclass
class JobRecord:
    """Everything the agent knows about one job on this node."""

    job_key: str
    slurm_job_id: str
    model: str = ""
    step: int = 0
    total_steps: int = 0
    world_size: int = 1
    last_checkpoint_step: int = -1
    pids: dict[int, int] = field(default_factory=dict)  # pid -> rank
    pid_start: dict[int, int | None] = field(default_factory=dict)  # pid -> its start time (pid reuse)
    final_pids: dict[int, int | None] = field(default_factory=dict)  # pids (-> start) that sent their final report
    reporter_pid: int = 0  # the pid whose samples feed the throughput window
    run_new: bool = True  # the next reporter sample starts a run: it sets `step` (max() only within a run)
    window: deque = field(default_factory=lambda: deque(maxlen=4096))
    run_first: _Sample | None = None
    run_start_step: int | None = None
    profile_done: bool = False
    profile_contaminated: bool = False
    isolated: float = 0.0
    isolated_source: str = ""
    reference: float = 0.0
    comm_fraction: float = -1.0
    state: str = "running"
    first_seen: float = 0.0
    owner_uid: int = -1  # uid owning the key: the Slurm job's owner (verified), or a privileged reporter's; -1: unknown
    slurm_numeric_id: str = ""  # numeric Slurm job id (what job cgroups are named after), "" if unknown
    #: uid owning the Slurm job, as verified when a pid was registered (the uid every registered pid has); -1: none
    job_uid: int = -1
    last_report: float = 0.0
    ended_at: float = 0.0
    #: step of the latest final "preempted" report (the job helper sends it only once its preemption
    #: checkpoint at that step is durable on every rank); -1: none since the last Preempt signalled the job
    preempted_step: int = -1

    def active(self) -> bool:
        return self.state in ("running", "preempting")


@dataclass
class KeyOwner:
    """Who a job key belongs to after its record was forgotten: kept until its Slurm job is gone."""

    slurm_job_id: str
    owner_uid: int
    slurm_numeric_id: str = ""
    next_check: float = 0.0


@dataclass(frozen=True)
class KeyClaim:
    """Snapshot of who holds a job key: from a record (``active`` or not) or a :class:`KeyOwner`."""

    slurm_job_id: str
    owner_uid: int
    active: bool
    slurm_numeric_id: str


class KeyInUse(Exception):
    """A report for a job key that an active record of another Slurm job holds."""


class NotKeyOwner(Exception):
    """A report for a job key whose record belongs to another uid."""


class TooManyKeys(Exception):
    """A report that would give an unprivileged uid more than ``max_keys_per_uid`` job keys on the node."""


class JobTracker:
    """Thread-safe registry of jobs on this node, fed by progress reports."""

    def __init__(
        self,
        window_s: float = 30.0,
        profile_steps: int = 20,
        profile_skip_steps: int = 10,
        stale_s: float = 60.0,
        keep_ended_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
        max_key_owners: int = 10_000,
        max_keys_per_uid: int = 256,
    ) -> None:
        self.window_s = window_s
        self.profile_steps = profile_steps
        self.profile_skip_steps = profile_skip_steps
        self.stale_s = stale_s
        self.keep_ended_s = keep_ended_s
        self.clock = clock
        self.jobs: dict[str, JobRecord] = {}
        #: owners of job keys whose records were forgotten (see :class:`KeyOwner`)
        self.key_owners: dict[str, KeyOwner] = {}
        self.max_key_owners = max_key_owners
        #: records (job keys) one unprivileged uid may hold on this node: a job uses one key for all its
        #: ranks, so this only stops a user from flooding the agent (JobStats size, the reaper's time)
        self.max_keys_per_uid = max_keys_per_uid
        self.lock = threading.RLock()

    # ------------------------------------------------------------- reports
    def claim(self, job_key: str) -> KeyClaim | None:
        """Who holds ``job_key`` now (None: nobody)."""
        with self.lock:
            rec = self.jobs.get(job_key)
            if rec is not None:
                return KeyClaim(rec.slurm_job_id, rec.owner_uid, rec.active(), rec.slurm_numeric_id)
            o = self.key_owners.get(job_key)
            return KeyClaim(o.slurm_job_id, o.owner_uid, False, o.slurm_numeric_id) if o is not None else None

    def report(self, r: pb.ProgressReport, uid: int = -1, *, pid_start: int | None = None,
               slurm_numeric_id: str = "", enforce_owner: bool = False, job_uid: int = -1) -> JobRecord:
        """Apply one (validated, authorised) report from ``uid``; returns the updated record.

        Raises :class:`KeyInUse` if an active record of another Slurm job holds the key, and (with
        ``enforce_owner``) :class:`NotKeyOwner` if the key's record of this Slurm job belongs to another
        uid. ``pid_start``: the reporting pid's start time as checked by the caller; ``job_uid``: the
        Slurm job's owner that the pid was checked against (:attr:`JobRecord.job_uid`).
        """
        now = self.clock()
        with self.lock:
            rec = self.jobs.get(r.job_key)
            if rec is not None and rec.slurm_job_id != r.slurm_job_id:
                if rec.active():
                    raise KeyInUse(f"job key {r.job_key!r} is in use by slurm job {rec.slurm_job_id}; "
                                   f"slurm job {r.slurm_job_id} must use another job key")
                rec = None  # the key's previous Slurm job ended: a new job takes it over
            if rec is not None and enforce_owner and rec.owner_uid >= 0 and rec.owner_uid != uid:
                raise NotKeyOwner(f"job {r.job_key!r} belongs to uid {rec.owner_uid}, not {uid}")
            if rec is None:
                if enforce_owner and sum(1 for o in self.jobs.values() if o.owner_uid == uid) >= self.max_keys_per_uid:
                    raise TooManyKeys(f"uid {uid} already holds {self.max_keys_per_uid} job keys on this node; "
                                      f"job key {r.job_key!r} refused (a job needs one key for all its ranks)")
                rec = JobRecord(job_key=r.job_key, slurm_job_id=r.slurm_job_id, first_seen=now, owner_uid=uid,
                                slurm_numeric_id=slurm_numeric_id)
                self.jobs[r.job_key] = rec
                self.key_owners.pop(r.job_key, None)
            if rec.owner_uid < 0:
                rec.owner_uid = uid
            if slurm_numeric_id and not rec.slurm_numeric_id:
                rec.slurm_numeric_id = slurm_numeric_id
            if r.pid > 0 and job_uid >= 0:
                rec.job_uid = job_uid
            start = pid_start if pid_start is not None or r.pid <= 0 else proc_start_time(r.pid)
            if r.pid > 0 and r.pid in rec.final_pids and rec.final_pids[r.pid] == start:
                return rec  # a stale report that overtook this process's final one
            # a pid registered before this report: a rank of the run we already know (not a new run)
            known = r.pid > 0 and r.pid in rec.pids and rec.pid_start.get(r.pid) == start
            if r.pid > 0 and r.final:
                rec.final_pids[r.pid] = start
            rec.model = r.model or rec.model
            rec.total_steps = r.total_steps or rec.total_steps
            rec.world_size = max(1, r.world_size)
            rec.last_checkpoint_step = max(rec.last_checkpoint_step, r.checkpoint_step)
            if r.reference_samples_per_s > 0:
                rec.reference = r.reference_samples_per_s
            rec.last_report = now
            if r.pid > 0 and not r.final:
                rec.pids[r.pid] = r.rank
                rec.pid_start[r.pid] = start
            # The throughput window follows one process (lowest rank reporting on this node).
            if r.pid > 0 and (rec.reporter_pid == 0 or not pid_alive(rec.reporter_pid)
                              or r.rank < rec.pids.get(rec.reporter_pid, 1 << 30)):
                if rec.reporter_pid != r.pid:
                    rec.reporter_pid = r.pid
                    self._new_run(rec)
            if r.pid == rec.reporter_pid or r.pid <= 0:
                s = _Sample(t=now, step=r.step, samples=r.samples, elapsed=r.elapsed_s)
                if rec.window and (s.samples < rec.window[-1].samples or s.elapsed < rec.window[-1].elapsed):
                    self._new_run(rec)  # the process restarted
                rec.window.append(s)
                # a new run (restart, requeue) may resume from an older checkpoint: its step is the
                # job's step, not the highest step an earlier run reached
                rec.step = r.step if rec.run_new else max(rec.step, r.step)
                rec.run_new = False
                self._profile(rec, s)
                # only the reporter's (lowest local rank's) measurement: ranks measure different fractions,
                # and taking whichever rank reported last made the value flip between them
                if r.comm_fraction >= 0:
                    rec.comm_fraction = r.comm_fraction
            if r.state == "finished" or (r.final and r.state != "preempted"):
                rec.state, rec.ended_at = "finished", now
            elif r.state == "preempted":
                rec.state, rec.ended_at = "preempted", now
                if r.final:
                    rec.preempted_step = max(rec.preempted_step, r.step)
            elif rec.state in ("exited", "finished", "preempted") and not known:
                rec.state = "running"  # resumed under the same key (a late report of a known rank is not)
            return rec

    def _new_run(self, rec: JobRecord) -> None:
        rec.run_new = True
        rec.window.clear()
        rec.run_first = None
        rec.run_start_step = None
        if rec.isolated_source != "profiled-alone":
            rec.profile_done = False
        rec.profile_contaminated = False

    def _others_active(self, rec: JobRecord, now: float) -> bool:
        return any(
            o is not rec and o.active() and now - o.last_report <= self.stale_s for o in self.jobs.values()
        )

    def _profile(self, rec: JobRecord, s: _Sample) -> None:
        if rec.profile_done:
            return
        if rec.run_first is None:
            if rec.run_start_step is None:
                rec.run_start_step = s.step
            # skip start-up: the registration report, warm-up and the helper's torch.profiler steps
            if s.samples <= 0 or s.step - rec.run_start_step < self.profile_skip_steps:
                return
            rec.run_first = s
            rec.profile_contaminated = self._others_active(rec, s.t)
            return
        if self._others_active(rec, s.t):
            rec.profile_contaminated = True
        if s.step - rec.run_first.step >= self.profile_steps:
            rec.profile_done = True
            dt = s.elapsed - rec.run_first.elapsed
            if not rec.profile_contaminated and dt > 0:
                rec.isolated = (s.samples - rec.run_first.samples) / dt
                rec.isolated_source = "profiled-alone"
                emit("profiled_alone", job_key=rec.job_key, isolated_samples_per_s=round(rec.isolated, 3),
                     steps=s.step - rec.run_first.step, seconds=round(dt, 3))

    # --------------------------------------------------------------- stats
    def achieved(self, rec: JobRecord) -> float:
        """Samples/s over the last ``window_s`` seconds of the reporter's reports (0 if unknown)."""
        w = list(rec.window)
        if not w:
            return 0.0
        last = w[-1]
        first = next((x for x in w if last.elapsed - x.elapsed <= self.window_s), w[0])
        if first is last:
            return last.samples / last.elapsed if last.elapsed > 0 else 0.0
        dt = last.elapsed - first.elapsed
        return (last.samples - first.samples) / dt if dt > 0 else 0.0

    def isolated(self, rec: JobRecord) -> tuple[float, str]:
        if rec.isolated_source == "profiled-alone":
            return rec.isolated, rec.isolated_source
        if rec.reference > 0:
            return rec.reference, "reference"
        return 0.0, ""

    def stat(self, rec: JobRecord) -> pb.JobStat:
        now = self.clock()
        ach = self.achieved(rec)
        iso, src = self.isolated(rec)
        return pb.JobStat(
            job_key=rec.job_key,
            slurm_job_id=rec.slurm_job_id,
            model=rec.model,
            step=rec.step,
            total_steps=rec.total_steps,
            samples_per_s=ach,
            isolated_samples_per_s=iso,
            isolated_source=src,
            cs=iso / ach if iso > 0 and ach > 0 else 0.0,
            last_checkpoint_step=rec.last_checkpoint_step,
            comm_fraction=rec.comm_fraction,
            pids=sorted(rec.pids),
            state=rec.state,
            last_report_age_s=now - rec.last_report if rec.last_report else 0.0,
            world_size=rec.world_size,
        )

    def reap(self) -> None:
        """Mark jobs whose processes are all gone as exited; forget long-ended jobs."""
        now = self.clock()
        with self.lock:
            for key, rec in list(self.jobs.items()):
                for pid in [p for p in rec.pids if not same_process(p, rec.pid_start.get(p))]:
                    del rec.pids[pid]
                    rec.pid_start.pop(pid, None)
                # pids may be reused later
                rec.final_pids = {p: t for p, t in rec.final_pids.items() if same_process(p, t)}
                if rec.active() and rec.state != "preempting" and not rec.pids and now - rec.last_report > 2.0:
                    rec.state, rec.ended_at = "exited", now
                    emit("job_exited", job_key=key, step=rec.step)
                if not rec.active() and rec.ended_at and now - rec.ended_at > self.keep_ended_s:
                    del self.jobs[key]
                    if rec.owner_uid >= 0:  # the key stays its owner's until its Slurm job is gone
                        self.key_owners[key] = KeyOwner(rec.slurm_job_id, rec.owner_uid, rec.slurm_numeric_id,
                                                        next_check=0.0)
            while len(self.key_owners) > self.max_key_owners:
                self.key_owners.pop(next(iter(self.key_owners)))

    def running_count(self) -> int:
        with self.lock:
            return sum(1 for r in self.jobs.values() if r.active())


class _RpcAbort(Exception):
    def __init__(self, code: grpc.StatusCode, msg: str) -> None:
        super().__init__(msg)
        self.code = code
        self.msg = msg


def _finite(x: float) -> bool:
    return math.isfinite(x)


@dataclass
class PreemptOp:
    """One preemption the agent runs for a job (``Preempt`` starts it, ``PreemptStatus`` reads it).

    ``caller``: :attr:`Identity.caller` of whoever started it (the per-caller bound counts it there);
    ``t0``/``deadline``: monotonic seconds (a Preempt that joins it may push the deadline later);
    ``response``: the outcome once ``done``.
    """

    id: str
    job_key: str
    slurm_job_id: str
    caller: str
    t0: float
    deadline: float
    rec: JobRecord
    done: bool = False
    ended_at: float = 0.0
    response: pb.PreemptResponse | None = None
    joins: int = 0


class NodeAgentServicer(pb_grpc.NodeAgentServicer):
    """RPC handlers. Every handler authenticates, validates, and never lets an exception escape."""

    def __init__(
        self,
        node: str,
        auth: Authenticator,
        store: CheckpointStore,
        tracker: JobTracker | None = None,
        poll_s: float = 0.2,
        max_preempt_timeout_s: float = 3600.0,
        slurm: SlurmJobs | None = None,
        key_owner_recheck_s: float = 600.0,
        max_preempts_per_caller: int = 16,
        max_preempts: int = 64,
        keep_preempts_s: float = 600.0,
        max_kept_preempts: int = 1024,
    ) -> None:
        if max_preempts_per_caller < 1 or max_preempts < 1:
            raise ValueError(f"preemption limits must be >= 1, got {max_preempts_per_caller} per caller, "
                             f"{max_preempts} in all")
        self.node = node
        self.auth = auth
        self.store = store
        self.tracker = tracker or JobTracker()
        self.poll_s = poll_s
        self.max_preempt_timeout_s = max_preempt_timeout_s
        #: what Slurm / the kernel say about jobs and processes (tests pass a fake lookup)
        self.slurm = slurm or SlurmJobs()
        self.key_owner_recheck_s = key_owner_recheck_s
        self.started = time.monotonic()
        #: running preemptions one caller may have (joining a running one does not count), and all callers
        self.max_preempts_per_caller = max_preempts_per_caller
        self.max_preempts = max_preempts
        #: ended preemptions are answered to PreemptStatus this long (s), at most this many
        self.keep_preempts_s = keep_preempts_s
        self.max_kept_preempts = max_kept_preempts
        self._ops: dict[str, PreemptOp] = {}  # operation id -> operation (insertion order: oldest first)
        self._running: dict[str, PreemptOp] = {}  # job key -> its running operation
        self._ops_lock = threading.Lock()
        self.stopping = threading.Event()  # set when the server stops: running operations end at once

    # ------------------------------------------------------------ plumbing
    def _authorize(self, name: str, request: Any, context: grpc.ServicerContext, privileged: bool) -> Identity:
        header = dict(context.invocation_metadata() or ()).get(AUTH_HEADER)
        try:
            # bound to this node: a credential captured on its way to another node's agent is refused here;
            # Health alone also takes unbound ones (it changes nothing; clients learn the node name from it)
            ident = self.auth.verify(SERVICE + name, request.SerializeToString(deterministic=True), header,
                                     node=self.node, unbound_ok=name == "Health")
        except RateLimited as exc:
            emit("auth_rate_limited", logging.WARNING, method=name, peer=context.peer(), reason=str(exc))
            raise _RpcAbort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{exc} (node {self.node})") from None
        except AuthError as exc:
            emit("auth_refused", logging.WARNING, method=name, peer=context.peer(), reason=str(exc))
            raise _RpcAbort(grpc.StatusCode.UNAUTHENTICATED, f"authentication failed: {exc}") from None
        if privileged and not self.auth.is_privileged(ident):
            emit("auth_refused", logging.WARNING, method=name, peer=context.peer(), uid=ident.uid,
                 reason="not privileged")
            raise _RpcAbort(grpc.StatusCode.PERMISSION_DENIED, f"uid {ident.uid} may not call {name}")
        return ident

    def _sign_reply(self, name: str, response: Any, context: grpc.ServicerContext) -> None:
        """Put the reply's credential in the trailing metadata (:data:`REPLY_AUTH_HEADER`): bound to the
        method, the response, this node and the request's own credential (nodeagent.auth). Only replies
        to authenticated requests get here (every handler authorises first)."""
        header = dict(context.invocation_metadata() or ()).get(AUTH_HEADER) or ""
        try:
            token = self.auth.sign_reply(SERVICE + name, header, response.SerializeToString(deterministic=True),
                                         node=self.node)
        except AuthError as exc:  # e.g. munged unreachable: an unsigned reply would be refused anyway
            emit("reply_sign_failed", logging.ERROR, method=name, reason=str(exc))
            raise _RpcAbort(grpc.StatusCode.UNAVAILABLE,
                            f"agent of node {self.node} cannot sign its reply: {exc}") from None
        context.set_trailing_metadata(((REPLY_AUTH_HEADER, token),))

    def _run(self, name: str, request: Any, context: grpc.ServicerContext, fn: Callable[[], Any]) -> Any:
        try:
            response = fn()
            self._sign_reply(name, response, context)
            return response
        except _RpcAbort as exc:
            context.abort(exc.code, exc.msg)
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except Exception as exc:  # never take the server down
            if isinstance(exc, grpc.RpcError) or type(exc).__name__ == "_AbortError":
                raise
            log.exception("internal error in %s", name)
            context.abort(grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")

    # ---------------------------------------------------------------- RPCs
    def Health(self, request: pb.HealthRequest, context: grpc.ServicerContext) -> pb.HealthResponse:
        def go() -> pb.HealthResponse:
            self._authorize("Health", request, context, privileged=False)
            return pb.HealthResponse(
                node=self.node,
                version=VERSION,
                uptime_s=time.monotonic() - self.started,
                num_jobs=self.tracker.running_count(),
                store_url=self.store.url,
                auth_scheme=self.auth.scheme,
            )

        return self._run("Health", request, context, go)

    def ReportProgress(self, request: pb.ProgressReport, context: grpc.ServicerContext) -> pb.ProgressAck:
        def go() -> pb.ProgressAck:
            ident = self._authorize("ReportProgress", request, context, privileged=False)
            self._validate_report(request)
            privileged = self.auth.is_privileged(ident)
            numeric_id = self._check_key(request, ident, privileged)
            start, job_uid = None, -1
            if request.pid != 0:
                job_uid, numeric_id = self._job_owner(request, ident, privileged, numeric_id)
                start = self._check_pid(request, numeric_id, job_uid)
            try:
                rec = self.tracker.report(request, ident.uid, pid_start=start, slurm_numeric_id=numeric_id,
                                          enforce_owner=not privileged, job_uid=job_uid)
            except KeyInUse as exc:
                raise _RpcAbort(grpc.StatusCode.FAILED_PRECONDITION, f"{exc} (node {self.node})") from None
            except NotKeyOwner as exc:
                raise _RpcAbort(grpc.StatusCode.PERMISSION_DENIED, str(exc)) from None
            except TooManyKeys as exc:
                raise _RpcAbort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{exc} (node {self.node})") from None
            if request.final or request.state in ("preempted", "finished"):
                emit("job_" + (request.state or "final"), job_key=rec.job_key, slurm_job_id=rec.slurm_job_id,
                     step=request.step, checkpoint_step=request.checkpoint_step)
            return pb.ProgressAck(accepted=True, store_url=self.store.url)

        return self._run("ReportProgress", request, context, go)

    def JobStats(self, request: pb.JobStatsRequest, context: grpc.ServicerContext) -> pb.JobStatsResponse:
        def go() -> pb.JobStatsResponse:
            self._authorize("JobStats", request, context, privileged=False)
            with self.tracker.lock:
                if request.job_key:
                    validate_job_key(request.job_key)
                    rec = self.tracker.jobs.get(request.job_key)
                    if rec is None:
                        raise _RpcAbort(grpc.StatusCode.NOT_FOUND, f"no job {request.job_key!r} on node {self.node}")
                    recs = [rec]
                else:
                    recs = list(self.tracker.jobs.values())
                stats = [self.tracker.stat(r) for r in recs if request.include_finished or r.active()]
            return pb.JobStatsResponse(node=self.node, jobs=stats)

        return self._run("JobStats", request, context, go)

    def Preempt(self, request: pb.PreemptRequest, context: grpc.ServicerContext) -> pb.PreemptResponse:
        return self._run("Preempt", request, context, lambda: self._preempt_start(request, context))

    def PreemptStatus(self, request: pb.PreemptStatusRequest, context: grpc.ServicerContext) -> pb.PreemptResponse:
        def go() -> pb.PreemptResponse:
            self._authorize("PreemptStatus", request, context, privileged=True)
            with self._ops_lock:
                op = self._ops.get(request.operation_id)
                if op is None:
                    raise _RpcAbort(grpc.StatusCode.NOT_FOUND,
                                    f"no preemption operation {request.operation_id!r} on node {self.node} (the agent "
                                    f"restarted, or forgot it {self.keep_preempts_s:.0f}s after it ended)")
                return self._op_reply(op)

        return self._run("PreemptStatus", request, context, go)

    # ------------------------------------------------------------- helpers
    @staticmethod
    def _validate_report(r: pb.ProgressReport) -> None:
        validate_job_key(r.job_key)
        if not _SLURM_ID_RE.fullmatch(r.slurm_job_id):
            raise ValueError(f"invalid slurm_job_id {r.slurm_job_id!r}")
        for name in ("step", "total_steps", "samples"):
            if getattr(r, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(r, name)}")
        if r.total_steps and r.step > r.total_steps:
            raise ValueError(f"step {r.step} exceeds total_steps {r.total_steps}")
        if not _finite(r.elapsed_s) or r.elapsed_s < 0:
            raise ValueError(f"elapsed_s must be finite and >= 0, got {r.elapsed_s}")
        if not _finite(r.reference_samples_per_s) or r.reference_samples_per_s < 0:
            raise ValueError(f"reference_samples_per_s must be finite and >= 0, got {r.reference_samples_per_s}")
        if not _finite(r.comm_fraction) or r.comm_fraction > 1.0:
            raise ValueError(f"comm_fraction must be in [0, 1] (or -1), got {r.comm_fraction}")
        if r.checkpoint_step < -1:
            raise ValueError(f"checkpoint_step must be >= -1, got {r.checkpoint_step}")
        if r.rank < 0 or r.world_size < 0 or (r.world_size and r.rank >= r.world_size):
            raise ValueError(f"bad rank/world_size {r.rank}/{r.world_size}")
        if r.state and r.state not in _STATES:
            raise ValueError(f"state must be one of {_STATES}, got {r.state!r}")
        if len(r.model) > 128:
            raise ValueError("model name too long")

    def _slurm_job(self, slurm_job_id: str, uid: int, fresh: bool = False) -> SlurmJobInfo | None:
        """Ask Slurm (or its cache) about a job for unprivileged caller ``uid``, whose limits it counts against.

        RESOURCE_EXHAUSTED at once if ``uid`` is over its limits (:class:`LookupLimited`), UNAVAILABLE if
        Slurm cannot be asked.
        """
        try:
            return self.slurm.job(slurm_job_id, fresh=fresh, uid=uid)
        except LookupLimited as exc:
            # one user naming many jobs must not keep the agent's worker threads busy in squeue
            emit("slurm_lookup_limited", logging.WARNING, uid=exc.uid, slurm_job_id=slurm_job_id, reason=str(exc))
            raise _RpcAbort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                            f"cannot verify slurm job {slurm_job_id} now: {exc}; report refused, retry later "
                            f"(node {self.node})") from None
        except SlurmUnavailable as exc:
            # fail closed: a report we cannot verify could give a job's key (and its SIGUSR2) to another user
            raise _RpcAbort(grpc.StatusCode.UNAVAILABLE,
                            f"cannot verify slurm job {slurm_job_id} with Slurm on node {self.node} ({exc}); "
                            "report refused, retry later") from None

    def _check_key(self, r: pb.ProgressReport, ident: Identity, privileged: bool) -> str:
        """May ``ident`` report on job key ``r.job_key`` for Slurm job ``r.slurm_job_id``?

        Raises _RpcAbort if not; returns the Slurm job's numeric id ("" if unknown). Nothing the
        caller controls is trusted for an unprivileged caller: the Slurm job must be the caller's
        according to slurmctld, and a key stays with its owner while the owner's Slurm job exists.
        """
        key, sid = r.job_key, r.slurm_job_id
        if ident.job and sid != ident.job:  # a per-job key speaks for its own job only
            raise _RpcAbort(grpc.StatusCode.PERMISSION_DENIED,
                            f"this credential is the key of slurm job {ident.job}: it cannot report on slurm job {sid}")
        held = self.tracker.claim(key)
        if held is not None and held.active and held.slurm_job_id != sid:
            raise _RpcAbort(grpc.StatusCode.FAILED_PRECONDITION,
                            f"job key {key!r} is in use by slurm job {held.slurm_job_id} on node {self.node}; "
                            f"slurm job {sid} must use another job key (comment key=... or RLSCHED_JOB_KEY)")
        if held is not None and held.slurm_job_id == sid and held.owner_uid >= 0:
            if held.owner_uid != ident.uid and not privileged:
                raise _RpcAbort(grpc.StatusCode.PERMISSION_DENIED,
                                f"job {key!r} belongs to uid {held.owner_uid}, not {ident.uid}")
            if held.owner_uid == ident.uid and (held.slurm_numeric_id or privileged):
                return held.slurm_numeric_id  # verified when the record was made
        if privileged:  # root, SlurmUser, --allow-uid: trusted, Slurm is not asked
            return sid if sid.isdigit() else ""
        if held is not None and held.slurm_job_id != sid and held.owner_uid not in (-1, ident.uid):
            old = self._slurm_job(held.slurm_job_id, ident.uid, fresh=True)
            if old is not None and not old.gone:
                raise _RpcAbort(grpc.StatusCode.PERMISSION_DENIED,
                                f"job key {key!r} belongs to slurm job {held.slurm_job_id} of uid {held.owner_uid} "
                                f"({old.state}), not to uid {ident.uid}")
        m = _DEFAULT_KEY_RE.fullmatch(key)
        other_unknown = False
        if m and m.group(1) != sid:  # another job's default key: only while that job is gone or also yours
            other = self._slurm_job(m.group(1), ident.uid)
            if other is not None and not other.gone and other.uid != ident.uid:
                raise _RpcAbort(grpc.StatusCode.PERMISSION_DENIED,
                                f"job key {key!r} is the default key of slurm job {m.group(1)} of uid {other.uid}")
            other_unknown = other is None
        # a per-job key proves its job and owner (the prolog wrote it for them from Slurm's own data)
        info = SlurmJobInfo(ident.job, ident.uid, "RUNNING") if ident.job else self._slurm_job(sid, ident.uid)
        if info is None:
            raise _RpcAbort(grpc.StatusCode.PERMISSION_DENIED, f"slurm job {sid} does not exist (Slurm does not know it)")
        if info.uid != ident.uid:
            raise _RpcAbort(grpc.StatusCode.PERMISSION_DENIED,
                            f"slurm job {sid} belongs to uid {info.uid}, not {ident.uid}")
        if other_unknown and m and info.job_id.isdigit() and int(m.group(1).split("_")[0]) > int(info.job_id):
            # Slurm numbers jobs in submission order: a job it does not know with a larger id than the
            # caller's own (existing) job has not been submitted yet; taking its key now would keep the
            # key (and its checkpoints) from that job when it starts
            raise _RpcAbort(grpc.StatusCode.PERMISSION_DENIED,
                            f"job key {key!r} is the default key of slurm job {m.group(1)}, which has not been "
                            f"submitted yet (your job is {info.job_id})")
        return info.job_id

    def _job_owner(self, r: pb.ProgressReport, ident: Identity, privileged: bool, numeric_id: str) -> tuple[int, str]:
        """(uid owning Slurm job ``r.slurm_job_id``, its numeric id) for checking the pid a report registers.

        From the credential where it proves them (a per-job key names its job and user; an unprivileged
        caller's job was checked to be its own by :meth:`_check_key`), else from Slurm: a privileged
        caller (root, the SlurmUser, the root key) is trusted with any job, but the pid it names must
        still be a process of that job's owner. UNAVAILABLE if Slurm cannot be asked, PERMISSION_DENIED
        if it does not know the job.
        """
        if ident.job:
            return ident.uid, ident.job
        if not privileged:
            return ident.uid, numeric_id
        try:
            info = self.slurm.job(r.slurm_job_id)
        except SlurmUnavailable as exc:
            raise _RpcAbort(grpc.StatusCode.UNAVAILABLE,
                            f"cannot check that pid {r.pid} belongs to slurm job {r.slurm_job_id}: Slurm cannot be "
                            f"asked on node {self.node} ({exc}); report refused, retry later") from None
        if info is None:
            raise _RpcAbort(grpc.StatusCode.PERMISSION_DENIED,
                            f"pid {r.pid} cannot be registered for slurm job {r.slurm_job_id}: Slurm does not know "
                            "that job (only a process inside its own Slurm job can be registered)")
        return info.uid, info.job_id

    def _check_pid(self, r: pb.ProgressReport, numeric_id: str, job_uid: int) -> int:
        """The start time of ``r.pid`` once the agent has checked it is a process of Slurm job
        ``r.slurm_job_id`` (numeric id ``numeric_id``) owned by ``job_uid`` (:meth:`pid_problem`), in
        every auth mode; PERMISSION_DENIED naming the reason otherwise."""
        if r.pid < 0:
            raise ValueError(f"pid must be >= 0 (0: none), got {r.pid}")
        if r.pid == 1:
            raise _RpcAbort(grpc.StatusCode.PERMISSION_DENIED,
                            f"pid 1 is init on node {self.node}, not a process of slurm job {r.slurm_job_id}: refused")
        start = proc_start_time(r.pid)
        if start is None:
            why = "has exited (zombie)" if os.path.exists(f"/proc/{r.pid}") else "does not exist"
            raise ValueError(f"pid {r.pid} is not a running process on node {self.node}: it {why}")
        why = self.pid_problem(r.pid, r.slurm_job_id, numeric_id, job_uid)
        if why is not None:
            raise _RpcAbort(grpc.StatusCode.PERMISSION_DENIED, f"{why}: refused")
        if proc_start_time(r.pid) != start:
            raise ValueError(f"pid {r.pid} exited while it was being checked")
        return start

    def pid_problem(self, pid: int, slurm_job_id: str, numeric_id: str, job_uid: int) -> str | None:
        """Why ``pid`` is not a process of Slurm job ``slurm_job_id`` (numeric id ``numeric_id``, "" if
        unknown) owned by uid ``job_uid`` on this node; None if it is. What the agent reads itself:

        * the process's owner (``/proc/PID``) must be ``job_uid``;
        * if its cgroup names a Slurm job (``job_<id>``), that must be this job; where Slurm uses job
          cgroups on this node (``--job-cgroups``), it must be in one;
        * otherwise its environment's ``SLURM_JOB_ID`` must name this job: only the job's owner can set
          it on a process of the job's owner, so it cannot point at anyone else's process.

        An environment naming another job is refused even inside the right cgroup (inconsistent).
        """
        if pid <= 1:
            return f"pid {pid} is not a process of slurm job {slurm_job_id}"
        uid = _proc_uid(pid)
        if uid is None:
            return f"pid {pid} is not a running process on node {self.node}"
        if job_uid < 0:
            return f"the owner of slurm job {slurm_job_id} is not known, so pid {pid} cannot be checked"
        if uid != job_uid:
            return (f"pid {pid} is owned by uid {uid}, not by uid {job_uid}, the owner of slurm job "
                    f"{slurm_job_id}")
        ids = {slurm_job_id, numeric_id} - {""}
        jobs = self.slurm.pid_job_ids(pid)
        if jobs is None:
            return f"pid {pid} is not a running process on node {self.node}: its cgroup file is unreadable"
        if jobs and not jobs & ids:
            return f"pid {pid} is in the cgroup of slurm job {','.join(sorted(jobs))}, not {slurm_job_id}"
        if not jobs and self.slurm.require_cgroup():
            return f"pid {pid} is in no Slurm job cgroup on node {self.node} (slurm job {slurm_job_id})"
        env_job = _proc_env(pid, "SLURM_JOB_ID")
        if env_job is False:
            return f"the environment of pid {pid} cannot be read, so it cannot be checked"
        if env_job is None:
            if not jobs:
                return (f"pid {pid} is not part of a Slurm job: it is in no job cgroup and has no SLURM_JOB_ID in "
                        f"its environment (slurm job {slurm_job_id})")
        elif env_job not in ids:
            return f"pid {pid} belongs to slurm job {env_job}, not {slurm_job_id}"
        return None

    def _signal_targets(self, rec: JobRecord) -> tuple[list[int], list[int]]:
        """(live registered pids, those that may be signalled). Call with the tracker lock held.

        A pid may be signalled only if it is still the process that registered (start time: no
        reused pid), still passes :meth:`pid_problem` for the record's Slurm job and owner, and the
        job is running/preempting (a finished job may still be running its own post-processing).
        """
        live = [p for p in rec.pids if same_process(p, rec.pid_start.get(p))]
        if not rec.active():
            return live, []
        ok = []
        for p in live:
            why = self.pid_problem(p, rec.slurm_job_id, rec.slurm_numeric_id, rec.job_uid)
            if why is not None:
                emit("pid_not_signalled", logging.WARNING, job_key=rec.job_key, pid=p, reason=why)
                continue
            ok.append(p)
        return live, ok

    def expire_key_owners(self, max_checks: int = 4) -> None:
        """Forget remembered key owners whose Slurm job is gone (a few per call; the reaper calls this)."""
        now = time.monotonic()
        with self.tracker.lock:
            due = [(k, o) for k, o in self.tracker.key_owners.items() if o.next_check <= now][:max_checks]
        for key, o in due:
            try:
                info = self.slurm.job(o.slurm_job_id, fresh=True)
                gone = info is None or info.gone
            except SlurmUnavailable:
                gone = False
            with self.tracker.lock:
                if self.tracker.key_owners.get(key) is o:
                    if gone:
                        del self.tracker.key_owners[key]
                    else:
                        o.next_check = now + self.key_owner_recheck_s

    def _preempt_start(self, request: pb.PreemptRequest, context: grpc.ServicerContext) -> pb.PreemptResponse:
        """Preempt: check the request, then start an operation (or join the job's running one) and answer
        at once; the operation runs in its own thread (:meth:`_preempt_op`), never in a gRPC worker."""
        ident = self._authorize("Preempt", request, context, privileged=True)
        validate_job_key(request.job_key)
        timeout = request.timeout_s if request.timeout_s > 0 else 60.0
        if not _finite(timeout) or timeout > self.max_preempt_timeout_s:
            raise ValueError(f"timeout_s must be in (0, {self.max_preempt_timeout_s}], got {request.timeout_s}")
        with self.tracker.lock:
            rec = self.tracker.jobs.get(request.job_key)
            if rec is None:
                raise _RpcAbort(grpc.StatusCode.NOT_FOUND, f"no job {request.job_key!r} on node {self.node}")
            if request.slurm_job_id and request.slurm_job_id != rec.slurm_job_id:
                raise _RpcAbort(
                    grpc.StatusCode.NOT_FOUND,
                    f"job {request.job_key!r} on node {self.node} is slurm job {rec.slurm_job_id}, "
                    f"not {request.slurm_job_id}",
                )
        now = time.monotonic()
        with self._ops_lock:
            self._forget_ops(now)
            op = self._running.get(request.job_key)
            if op is not None and op.rec is rec:  # merged: one operation per job, whoever asks
                op.deadline = max(op.deadline, now + timeout)
                op.joins += 1
                emit("preempt_joined", job_key=request.job_key, operation=op.id, caller=ident.caller)
                return self._op_reply(op, joined=True)
            mine = sum(1 for o in self._running.values() if o.caller == ident.caller)
            if mine >= self.max_preempts_per_caller:
                raise _RpcAbort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"{ident.caller} already has {mine} preemptions running on node {self.node} (limit "
                                f"{self.max_preempts_per_caller} per caller); job {request.job_key!r} not signalled, "
                                "retry once one ends")
            if len(self._running) >= self.max_preempts:
                raise _RpcAbort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"{len(self._running)} preemptions are running on node {self.node} (limit "
                                f"{self.max_preempts}); job {request.job_key!r} not signalled, retry once one ends")
            op = PreemptOp(id=secrets.token_hex(12), job_key=request.job_key, slurm_job_id=rec.slurm_job_id,
                           caller=ident.caller, t0=now, deadline=now + timeout, rec=rec)
            self._ops[op.id] = op
            self._running[op.job_key] = op
            try:
                threading.Thread(target=self._preempt_op, args=(op,), daemon=True,
                                 name=f"preempt-{op.job_key}"[:60]).start()
            except RuntimeError as exc:  # no thread to run it: nothing was signalled
                del self._ops[op.id]
                del self._running[op.job_key]
                raise _RpcAbort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"cannot start the preemption: {exc}") from None
            return self._op_reply(op)

    def _op_reply(self, op: PreemptOp, joined: bool = False) -> pb.PreemptResponse:
        """What Preempt / PreemptStatus answer about ``op``. Call with the operations lock held."""
        if op.done and op.response is not None:
            out = pb.PreemptResponse()
            out.CopyFrom(op.response)
        else:
            wait = time.monotonic() - op.t0
            out = pb.PreemptResponse(
                ok=False, checkpoint_step=-1, wait_s=wait,
                message=(f"preemption of job {op.job_key} on node {self.node} is running ({wait:.1f}s, up to "
                         f"{max(0.0, op.deadline - op.t0):.1f}s); poll PreemptStatus for the outcome"))
        out.operation_id, out.done, out.joined = op.id, op.done, joined
        return out

    def _forget_ops(self, now: float) -> None:
        """Drop ended operations older than ``keep_preempts_s`` or beyond ``max_kept_preempts``. Lock held."""
        ended = [o for o in self._ops.values() if o.done]
        excess = len(ended) - self.max_kept_preempts
        for o in ended:
            if excess > 0 or now - o.ended_at > self.keep_preempts_s:
                del self._ops[o.id]
                excess -= 1

    def _preempt_op(self, op: PreemptOp) -> None:
        """Run one preemption operation to its outcome (the operation's thread); never raises."""
        try:
            resp = self._preempt(op)
        except _RpcAbort as exc:
            resp = self._reply(op.rec, False, None, op.t0, False, exc.msg)
        except Exception as exc:  # noqa: BLE001 -- the outcome says what failed; the agent goes on
            log.exception("preemption of %s failed", op.job_key)
            resp = self._reply(op.rec, False, None, op.t0, False,
                               f"the agent failed while preempting: {type(exc).__name__}: {exc}")
        with self._ops_lock:
            op.response, op.done, op.ended_at = resp, True, time.monotonic()
            if self._running.get(op.job_key) is op:
                del self._running[op.job_key]

    def running_preempts(self) -> int:
        """Preemption operations running now."""
        with self._ops_lock:
            return len(self._running)

    def _preempt(self, op: PreemptOp) -> pb.PreemptResponse:
        rec = op.rec
        with self.tracker.lock:
            live, pids = self._signal_targets(rec)
            step_at_signal = rec.step
            prev_state = rec.state
            if pids:
                rec.state = "preempting"
                rec.preempted_step = -1  # only a "preempted" report answering this signal counts
        # what the record goes back to if no checkpoint comes
        restore = prev_state if prev_state != "preempting" else "running"
        try:
            return self._preempt_run(op, rec, live, pids, step_at_signal, prev_state, restore)
        finally:  # whatever failed (the store, a signal), the record never stays "preempting"
            with self.tracker.lock:
                if rec.state == "preempting" and pids:
                    rec.state = restore

    def _preempt_run(self, op: PreemptOp, rec: JobRecord, live: list[int], pids: list[int], step_at_signal: int,
                     prev_state: str, restore: str) -> pb.PreemptResponse:
        t0 = op.t0
        prev = self._latest(rec, verify=False)
        emit("preempt_start", job_key=rec.job_key, slurm_job_id=rec.slurm_job_id, pids=pids,
             step=step_at_signal, prev_checkpoint=prev.step if prev else None, state=prev_state)
        if not pids:
            good = self._latest(rec, verify=True)
            covered = good is not None and good.step >= step_at_signal
            if prev_state == "finished" and live:
                # done training, but its processes still run (evaluation, export): not ours to stop
                return self._reply(rec, False, good, t0, False,
                                   f"job {rec.job_key} on node {self.node} has finished training and its "
                                   "processes are still running: not signalled, not preemptible")
            if not rec.active() and not live:
                # the record is of a run that ended; a requeued / restarted run registers its pids only
                # with its first report, so until then the record cannot tell "ended" from "restarting"
                unsure = self._restarting(rec)
                if unsure:
                    return self._reply(rec, False, good, t0, False,
                                       f"job {rec.job_key} on node {self.node} has not registered with the "
                                       f"agent yet (restarting?): its last run is {prev_state} but {unsure}; "
                                       "not signalled, retry once it reports")
            if not rec.active():
                why = f"job {rec.job_key} on node {self.node} is {prev_state}: not signalled"
            elif live:
                why = (f"job {rec.job_key}'s live processes on node {self.node} no longer pass the agent's check "
                       f"that they are processes of slurm job {rec.slurm_job_id} (see the pid_not_signalled event): "
                       "not signalled")
            else:
                why = f"job {rec.job_key} has no live process on node {self.node} (state {prev_state})"
            return self._reply(rec, covered, good, t0, not live,
                               why + "; " + ("latest checkpoint covers its progress" if covered
                                             else "no checkpoint covers its progress"))
        for pid in pids:
            try:
                os.kill(pid, signal.SIGUSR2)
            except ProcessLookupError:
                pass
            except PermissionError as exc:
                raise _RpcAbort(grpc.StatusCode.FAILED_PRECONDITION, f"cannot signal pid {pid}: {exc}") from None
        done: CheckpointInfo | None = None
        exited = False
        # A checkpoint counts only once the job says it was preempted at it: a final "preempted" report
        # (the job helper sends it after its preemption checkpoint is durable on every rank, then exits
        # with EXIT_PREEMPTED). Any checkpoint alone could be an older periodic one: the last reported
        # step lags the real one, so "a checkpoint at >= the reported step" does not prove the
        # preemption save worked (it may have failed, e.g. ENOSPC, and the processes crashed).
        while time.monotonic() < op.deadline and not self.stopping.is_set():
            exited = not any(pid_alive(p) for p in pids)
            with self.tracker.lock:
                at = rec.preempted_step
            if at >= 0:
                cand = self._latest(rec, verify=False)
                if cand is not None and cand.step >= max(at, step_at_signal) and self._verify(rec, cand):
                    done = cand
                    break
            if exited:
                # one more look: the report and the checkpoint may have landed just before exit (an older
                # checkpoint is fine if the job reports it made no progress past it, e.g. it was
                # preempted right after resuming)
                with self.tracker.lock:
                    at = rec.preempted_step
                cand = self._latest(rec, verify=True) if at >= 0 else None
                if cand is not None and cand.step >= max(at, step_at_signal):
                    done = cand
                break
            time.sleep(self.poll_s)
        if done is not None:
            ckpt_s = time.monotonic() - t0
            # give the process a moment to exit after its checkpoint (requeue-friendly exit code)
            exit_by = min(op.deadline, time.monotonic() + 10.0)
            while not exited and time.monotonic() < exit_by and not self.stopping.is_set():
                time.sleep(self.poll_s)
                exited = not any(pid_alive(p) for p in pids)
            with self.tracker.lock:
                rec.state = "preempted"
                rec.ended_at = self.tracker.clock()
                rec.last_checkpoint_step = max(rec.last_checkpoint_step, done.step)
            return self._reply(rec, True, done, t0, exited,
                               f"checkpoint at step {done.step} is durable and verified after {ckpt_s:.2f}s; "
                               + (f"process exited after {time.monotonic() - t0:.2f}s" if exited
                                  else "process still running"))
        with self.tracker.lock:
            if rec.state == "preempting":
                rec.state = "exited" if exited else restore
                if exited:
                    rec.ended_at = self.tracker.clock()
            at, last_step = rec.preempted_step, rec.step
        good = self._latest(rec, verify=True)
        cur = self._latest(rec, verify=False)
        new_ckpt = cur is not None and (prev is None or (cur.step, cur.created) != (prev.step, prev.created))
        facts = (f"latest verified checkpoint: {'step ' + str(good.step) if good else 'none'}; "
                 f"last reported step: {last_step}; step when signalled: {step_at_signal}")
        if exited and at < 0:
            why = ("process exited without writing a new checkpoint" if not new_ckpt
                   else "process exited without reporting that it was preempted at a durable checkpoint")
            why += (" (no final 'preempted' report, so not the job helper's preemption exit "
                    "(status 75): it crashed or was killed; its exit status is not visible to the agent); "
                    + facts)
        elif exited:
            why = (f"process reported preemption at step {at} and exited, but no verified checkpoint at step "
                   f">= {max(at, step_at_signal)} is in the store; " + facts)
        elif self.stopping.is_set():  # the agent is shutting down
            why = (f"the agent of node {self.node} stopped after {time.monotonic() - t0:.1f}s, before a checkpoint "
                   f"at step >= {step_at_signal} was confirmed (the job was signalled and may still checkpoint); "
                   + facts)
        else:
            why = (f"timed out after {op.deadline - t0:.1f}s waiting for a checkpoint at step >= {step_at_signal} "
                   "confirmed by a final 'preempted' report; " + facts)
        return self._reply(rec, False, good, t0, exited, why)

    def _restarting(self, rec: JobRecord) -> str:
        """Why ``rec``'s Slurm job may have a new run on this node that has not reported yet ("" if it
        cannot: Slurm says the job ended, is not running, or does not know it)."""
        if not rec.slurm_job_id.replace("_", "").isdigit():
            return ""  # not a Slurm job ("local"): nothing to ask
        try:
            info = self.slurm.job(rec.slurm_job_id, fresh=True)
        except SlurmUnavailable as exc:
            return f"Slurm cannot say whether slurm job {rec.slurm_job_id} runs again ({exc})"
        if info is None or info.gone:
            return ""
        state = info.state.split()[0].upper() if info.state else ""
        if state in ("RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "STOPPED", "RESIZING", "SIGNALING",
                     "STAGE_OUT", ""):
            return f"slurm job {rec.slurm_job_id} is {info.state or 'in an unknown state'}"
        return ""  # PENDING, REQUEUED, ...: no run on this node now; the checkpoint is what it resumes from

    def _job_store(self, rec: JobRecord) -> CheckpointStore:
        """The store as ``rec``'s job may use it: only its owner's directory and files count (a directory
        another user created under the job's key holds no checkpoint of this job)."""
        return self.store.for_owner(rec.owner_uid if rec.owner_uid >= 0 else None)

    def _verify(self, rec: JobRecord, info: CheckpointInfo) -> bool:
        """:meth:`CheckpointStore.verify`; a store out of reach (or holding something that is not a
        checkpoint of the job's owner) counts as "not yet" (logged), not an RPC failure."""
        try:
            return self._job_store(rec).verify(info)
        except Exception as exc:  # StoreError, or whatever a job-controlled store directory provokes
            emit("store_error", logging.WARNING, job_key=rec.job_key, error=f"{type(exc).__name__}: {exc}")
            return False

    def _latest(self, rec: JobRecord, verify: bool) -> CheckpointInfo | None:
        try:
            return self._job_store(rec).latest(rec.job_key, verify=verify)
        except Exception as exc:  # StoreError, or whatever a job-controlled store directory provokes
            emit("store_error", logging.WARNING, job_key=rec.job_key, error=f"{type(exc).__name__}: {exc}")
            return None

    def _reply(self, rec: JobRecord, ok: bool, info: CheckpointInfo | None, t0: float, exited: bool,
               msg: str) -> pb.PreemptResponse:
        wait = time.monotonic() - t0
        emit("preempt_done", logging.INFO if ok else logging.WARNING, job_key=rec.job_key, ok=ok,
             checkpoint_step=info.step if info else None, process_exited=exited, wait_s=round(wait, 3), message=msg)
        return pb.PreemptResponse(
            ok=ok,
            checkpoint_step=info.step if info else -1,
            checkpoint_uri=info.uri if info else "",
            message=msg,
            process_exited=exited,
            wait_s=wait,
        )


class NodeAgentServer:
    """Owns the grpc.Server, the servicer and the reaper thread.

    ``listen`` is "host:port" (port 0 picks a free port; see :attr:`port`). ``servicer_kw`` go to
    :class:`NodeAgentServicer` (e.g. ``max_preempts_per_caller``, ``max_preempt_timeout_s``). No RPC
    holds a gRPC worker longer than its own checks take (Preempt answers at once and runs in its own
    thread), so ``max_workers`` threads keep serving Health, JobStats and PreemptStatus however many
    preemptions are waiting for their jobs.
    """

    def __init__(
        self,
        node: str,
        listen: str,
        auth: Authenticator,
        store: CheckpointStore,
        tracker: JobTracker | None = None,
        max_workers: int = 16,
        reap_interval_s: float = 1.0,
        slurm: SlurmJobs | None = None,
        **servicer_kw: Any,
    ) -> None:
        self.servicer = NodeAgentServicer(node, auth, store, tracker, slurm=slurm, **servicer_kw)
        self.tracker = self.servicer.tracker
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="agent-rpc"),
            options=[("grpc.max_receive_message_length", 1 << 20)],
        )
        pb_grpc.add_NodeAgentServicer_to_server(self.servicer, self._server)
        self.port = self._server.add_insecure_port(listen)
        if self.port == 0:
            raise OSError(f"cannot listen on {listen}")
        host = listen.rsplit(":", 1)[0]
        self.address = f"{host}:{self.port}"
        self.node = node
        self._stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap_loop, args=(reap_interval_s,), daemon=True,
                                        name="agent-reaper")

    def _reap_loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.tracker.reap()
                self.servicer.expire_key_owners()
            except Exception:
                log.exception("reaper failed")

    def start(self) -> "NodeAgentServer":
        self._server.start()
        self._reaper.start()
        emit("agent_started", node=self.node, address=self.address, store=self.servicer.store.url,
             auth=self.servicer.auth.describe())
        return self

    def stop(self, grace: float | None = 1.0) -> None:
        self._stop.set()
        self.servicer.stopping.set()
        self._server.stop(grace).wait()
        emit("agent_stopped", node=self.node)

    def wait(self) -> None:
        self._server.wait_for_termination()

    def __enter__(self) -> "NodeAgentServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
