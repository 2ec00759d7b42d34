"""The node agent gRPC server: job tracking, contention sensitivity, preemption.

One :class:`NodeAgentServer` per Slurm node. Job helpers report progress
(:class:`JobTracker` keeps per-job throughput windows); the controller reads
:meth:`JobStats` and calls :meth:`Preempt`, which signals the job's registered
processes with SIGUSR2 and waits until the checkpoint store holds a *new*
checkpoint at or beyond the step the job had reached, whose checksum verifies.

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
import signal
import threading
import time
from collections import deque
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any, Callable

import grpc

from nodeagent.auth import AUTH_HEADER, REPLY_AUTH_HEADER, Authenticator, AuthError, Identity
from nodeagent.slurmjob import LookupLimited, SlurmJobInfo, SlurmJobs, SlurmUnavailable
from nodeagent.store import CheckpointInfo, CheckpointStore, validate_job_key
from proto import rlsched_agent_pb2 as pb
from proto import rlsched_agent_pb2_grpc as pb_grpc

log = logging.getLogger("nodeagent")

SERVICE = "/rlsched.agent.v1.NodeAgent/"
VERSION = "3"  # 2: credentials are bound to the agent's node name; 3: replies are signed (nodeagent.auth)
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
               slurm_numeric_id: str = "", enforce_owner: bool = False) -> JobRecord:
        """Apply one (validated, authorised) report from ``uid``; returns the updated record.

        Raises :class:`KeyInUse` if an active record of another Slurm job holds the key, and (with
        ``enforce_owner``) :class:`NotKeyOwner` if the key's record of this Slurm job belongs to another
        uid. ``pid_start``: the reporting pid's start time as checked by the caller.
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
    ) -> None:
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

    # ------------------------------------------------------------ plumbing
    def _authorize(self, name: str, request: Any, context: grpc.ServicerContext, privileged: bool) -> Identity:
        header = dict(context.invocation_metadata() or ()).get(AUTH_HEADER)
        try:
            # bound to this node: a credential captured on its way to another node's agent is refused here;
            # Health alone also takes unbound ones (it changes nothing; clients learn the node name from it)
            ident = self.auth.verify(SERVICE + name, request.SerializeToString(deterministic=True), header,
                                     node=self.node, unbound_ok=name == "Health")
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
            start = self._check_pid(request, ident, privileged, numeric_id) if request.pid > 0 else None
            try:
                rec = self.tracker.report(request, ident.uid, pid_start=start, slurm_numeric_id=numeric_id,
                                          enforce_owner=not privileged)
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
        return self._run("Preempt", request, context, lambda: self._preempt(request, context))

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
        info = self._slurm_job(sid, ident.uid)
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

    def _check_pid(self, r: pb.ProgressReport, ident: Identity, privileged: bool, numeric_id: str) -> int:
        """Only let a caller register a pid it owns that belongs to the reported Slurm job; returns its start time."""
        start = proc_start_time(r.pid)
        if start is None:
            why = "has exited (zombie)" if os.path.exists(f"/proc/{r.pid}") else "does not exist"
            raise ValueError(f"pid {r.pid} is not a running process on node {self.node}: it {why}")
        owner = _proc_uid(r.pid)
        if not privileged and owner != ident.uid:
            raise _RpcAbort(grpc.StatusCode.PERMISSION_DENIED,
                            f"uid {ident.uid} may not register pid {r.pid} (owned by uid {owner})")
        jobs = self.slurm.pid_job_ids(r.pid)
        if jobs is None:
            raise ValueError(f"pid {r.pid} is not a running process on node {self.node}: its cgroup file is unreadable")
        if jobs and numeric_id and numeric_id not in jobs:
            raise _RpcAbort(grpc.StatusCode.PERMISSION_DENIED,
                            f"pid {r.pid} is in the cgroup of slurm job {','.join(sorted(jobs))}, not {r.slurm_job_id}")
        if not jobs and not privileged and self.slurm.require_cgroup():
            raise _RpcAbort(grpc.StatusCode.PERMISSION_DENIED,
                            f"pid {r.pid} is in no Slurm job cgroup on node {self.node}")
        # the environment is the caller's to set: a consistency check only, never the proof
        env_job = _proc_env(r.pid, "SLURM_JOB_ID")
        if isinstance(env_job, str) and env_job != r.slurm_job_id:
            raise _RpcAbort(grpc.StatusCode.PERMISSION_DENIED,
                            f"pid {r.pid} belongs to slurm job {env_job}, not {r.slurm_job_id}")
        if env_job is None and not privileged:
            raise _RpcAbort(grpc.StatusCode.PERMISSION_DENIED, f"pid {r.pid} is not part of a Slurm job")
        if proc_start_time(r.pid) != start:
            raise ValueError(f"pid {r.pid} exited while it was being checked")
        return start

    def _signal_targets(self, rec: JobRecord) -> tuple[list[int], list[int]]:
        """(live registered pids, those that may be signalled). Call with the tracker lock held.

        A pid may be signalled only if it is still the process that registered (start time: no
        reused pid), is in this job's cgroup where it is in one, and the job is running/preempting
        (a finished job may still be running its own post-processing).
        """
        live = [p for p in rec.pids if same_process(p, rec.pid_start.get(p))]
        if not rec.active():
            return live, []
        ok = []
        for p in live:
            jobs = self.slurm.pid_job_ids(p) if rec.slurm_numeric_id else None
            if jobs and rec.slurm_numeric_id not in jobs:
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

    def _preempt(self, request: pb.PreemptRequest, context: grpc.ServicerContext) -> pb.PreemptResponse:
        self._authorize("Preempt", request, context, privileged=True)
        validate_job_key(request.job_key)
        timeout = request.timeout_s if request.timeout_s > 0 else 60.0
        if not _finite(timeout) or timeout > self.max_preempt_timeout_s:
            raise ValueError(f"timeout_s must be in (0, {self.max_preempt_timeout_s}], got {request.timeout_s}")
        t0 = time.monotonic()
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
            live, pids = self._signal_targets(rec)
            step_at_signal = rec.step
            prev_state = rec.state
            if pids:
                rec.state = "preempting"
                rec.preempted_step = -1  # only a "preempted" report answering this signal counts
        # what the record goes back to if no checkpoint comes (a concurrent Preempt's state is not a state to keep)
        restore = prev_state if prev_state != "preempting" else "running"
        try:
            return self._preempt_run(request, context, rec, live, pids, step_at_signal, prev_state, restore,
                                     timeout, t0)
        finally:  # whatever failed (the store, a signal), the record never stays "preempting"
            with self.tracker.lock:
                if rec.state == "preempting" and pids:
                    rec.state = restore

    def _preempt_run(self, request: pb.PreemptRequest, context: grpc.ServicerContext, rec: JobRecord,
                     live: list[int], pids: list[int], step_at_signal: int, prev_state: str, restore: str,
                     timeout: float, t0: float) -> pb.PreemptResponse:
        prev = self._latest(rec, verify=False)
        emit("preempt_start", job_key=request.job_key, slurm_job_id=rec.slurm_job_id, pids=pids,
             step=step_at_signal, prev_checkpoint=prev.step if prev else None, state=prev_state)
        if not pids:
            good = self._latest(rec, verify=True)
            covered = good is not None and good.step >= step_at_signal
            if prev_state == "finished" and live:
                # done training, but its processes still run (evaluation, export): not ours to stop
                return self._reply(rec, False, good, t0, False,
                                   f"job {request.job_key} on node {self.node} has finished training and its "
                                   "processes are still running: not signalled, not preemptible")
            if not rec.active() and not live:
                # the record is of a run that ended; a requeued / restarted run registers its pids only
                # with its first report, so until then the record cannot tell "ended" from "restarting"
                unsure = self._restarting(rec)
                if unsure:
                    return self._reply(rec, False, good, t0, False,
                                       f"job {request.job_key} on node {self.node} has not registered with the "
                                       f"agent yet (restarting?): its last run is {prev_state} but {unsure}; "
                                       "not signalled, retry once it reports")
            if not rec.active():
                why = f"job {request.job_key} on node {self.node} is {prev_state}: not signalled"
            elif live:
                why = (f"job {request.job_key}'s live processes on node {self.node} are outside slurm job "
                       f"{rec.slurm_job_id}'s cgroup: not signalled")
            else:
                why = f"job {request.job_key} has no live process on node {self.node} (state {prev_state})"
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
        deadline = t0 + timeout
        done: CheckpointInfo | None = None
        exited = False
        # A checkpoint counts only once the job says it was preempted at it: a final "preempted" report
        # (the job helper sends it after its preemption checkpoint is durable on every rank, then exits
        # with EXIT_PREEMPTED). Any checkpoint alone could be an older periodic one: the last reported
        # step lags the real one, so "a checkpoint at >= the reported step" does not prove the
        # preemption save worked (it may have failed, e.g. ENOSPC, and the processes crashed).
        while time.monotonic() < deadline and context.is_active():
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
            exit_by = min(deadline, time.monotonic() + 10.0)
            while not exited and time.monotonic() < exit_by and context.is_active():
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
        elif not context.is_active():  # the caller went away (its deadline, a killed controller)
            why = (f"the caller disconnected after {time.monotonic() - t0:.1f}s, before a checkpoint at step >= "
                   f"{step_at_signal} was confirmed (the job was signalled and may still checkpoint); " + facts)
        else:
            why = (f"timed out after {timeout:.1f}s waiting for a checkpoint at step >= {step_at_signal} "
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

    ``listen`` is "host:port" (port 0 picks a free port; see :attr:`port`).
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
    ) -> None:
        self.servicer = NodeAgentServicer(node, auth, store, tracker, slurm=slurm)
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
        self._server.stop(grace).wait()
        emit("agent_stopped", node=self.node)

    def wait(self) -> None:
        self._server.wait_for_termination()

    def __enter__(self) -> "NodeAgentServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
