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
import signal
import threading
import time
from collections import deque
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any, Callable

import grpc

from nodeagent.auth import AUTH_HEADER, Authenticator, AuthError, Identity
from nodeagent.store import CheckpointInfo, CheckpointStore, StoreError, validate_job_key
from proto import rlsched_agent_pb2 as pb
from proto import rlsched_agent_pb2_grpc as pb_grpc

log = logging.getLogger("nodeagent")

SERVICE = "/rlsched.agent.v1.NodeAgent/"
VERSION = "1"
_STATES = ("running", "preempted", "finished")


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
    final_pids: set[int] = field(default_factory=set)  # pids that sent their final report
    reporter_pid: int = 0  # the pid whose samples feed the throughput window
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
    owner_uid: int = -1  # uid of the first (authenticated) reporter; -1: unknown
    last_report: float = 0.0
    ended_at: float = 0.0

    def active(self) -> bool:
        return self.state in ("running", "preempting")


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
    ) -> None:
        self.window_s = window_s
        self.profile_steps = profile_steps
        self.profile_skip_steps = profile_skip_steps
        self.stale_s = stale_s
        self.keep_ended_s = keep_ended_s
        self.clock = clock
        self.jobs: dict[str, JobRecord] = {}
        self.lock = threading.RLock()

    # ------------------------------------------------------------- reports
    def owner_of(self, job_key: str) -> int | None:
        """UID that owns an active record for ``job_key`` (None if none / unknown)."""
        with self.lock:
            rec = self.jobs.get(job_key)
            return rec.owner_uid if rec is not None and rec.active() and rec.owner_uid >= 0 else None

    def report(self, r: pb.ProgressReport, uid: int = -1) -> JobRecord:
        """Apply one (validated, authorised) report from ``uid``; returns the updated record."""
        now = self.clock()
        with self.lock:
            rec = self.jobs.get(r.job_key)
            if rec is None or (rec.slurm_job_id != r.slurm_job_id and not rec.active()):
                rec = JobRecord(job_key=r.job_key, slurm_job_id=r.slurm_job_id, first_seen=now, owner_uid=uid)
                self.jobs[r.job_key] = rec
            if rec.owner_uid < 0:
                rec.owner_uid = uid
            if r.pid > 0 and r.pid in rec.final_pids:
                return rec  # a stale report that overtook this process's final one
            if r.pid > 0 and r.final:
                rec.final_pids.add(r.pid)
            rec.slurm_job_id = r.slurm_job_id or rec.slurm_job_id
            rec.model = r.model or rec.model
            rec.total_steps = r.total_steps or rec.total_steps
            rec.world_size = max(1, r.world_size)
            rec.last_checkpoint_step = max(rec.last_checkpoint_step, r.checkpoint_step)
            if r.reference_samples_per_s > 0:
                rec.reference = r.reference_samples_per_s
            if r.comm_fraction >= 0:
                rec.comm_fraction = r.comm_fraction
            rec.last_report = now
            if r.pid > 0 and not r.final:
                rec.pids[r.pid] = r.rank
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
                rec.step = max(rec.step, r.step) if rec.state != "finished" else r.step
                self._profile(rec, s)
            if r.state == "finished" or (r.final and r.state != "preempted"):
                rec.state, rec.ended_at = "finished", now
            elif r.state == "preempted":
                rec.state, rec.ended_at = "preempted", now
            elif rec.state in ("exited", "finished", "preempted"):
                rec.state = "running"  # resumed under the same key
            return rec

    def _new_run(self, rec: JobRecord) -> None:
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
                for pid in [p for p in rec.pids if not pid_alive(p)]:
                    del rec.pids[pid]
                rec.final_pids = {p for p in rec.final_pids if pid_alive(p)}  # pids may be reused later
                if rec.active() and rec.state != "preempting" and not rec.pids and now - rec.last_report > 2.0:
                    rec.state, rec.ended_at = "exited", now
                    emit("job_exited", job_key=key, step=rec.step)
                if not rec.active() and rec.ended_at and now - rec.ended_at > self.keep_ended_s:
                    del self.jobs[key]

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
    ) -> None:
        self.node = node
        self.auth = auth
        self.store = store
        self.tracker = tracker or JobTracker()
        self.poll_s = poll_s
        self.max_preempt_timeout_s = max_preempt_timeout_s
        self.started = time.monotonic()

    # ------------------------------------------------------------ plumbing
    def _authorize(self, name: str, request: Any, context: grpc.ServicerContext, privileged: bool) -> Identity:
        header = dict(context.invocation_metadata() or ()).get(AUTH_HEADER)
        try:
            ident = self.auth.verify(SERVICE + name, request.SerializeToString(deterministic=True), header)
        except AuthError as exc:
            emit("auth_refused", logging.WARNING, method=name, peer=context.peer(), reason=str(exc))
            raise _RpcAbort(grpc.StatusCode.UNAUTHENTICATED, f"authentication failed: {exc}") from None
        if privileged and not self.auth.is_privileged(ident):
            emit("auth_refused", logging.WARNING, method=name, peer=context.peer(), uid=ident.uid,
                 reason="not privileged")
            raise _RpcAbort(grpc.StatusCode.PERMISSION_DENIED, f"uid {ident.uid} may not call {name}")
        return ident

    def _run(self, name: str, request: Any, context: grpc.ServicerContext, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
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
            owner = self.tracker.owner_of(request.job_key)
            if owner is not None and owner != ident.uid and not self.auth.is_privileged(ident):
                raise _RpcAbort(grpc.StatusCode.PERMISSION_DENIED,
                                f"job {request.job_key!r} belongs to uid {owner}, not {ident.uid}")
            if request.pid > 0:
                self._check_pid(request, ident)
            rec = self.tracker.report(request, ident.uid)
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
        if not r.slurm_job_id or len(r.slurm_job_id) > 64 or not r.slurm_job_id.replace("_", "").isalnum():
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

    def _check_pid(self, r: pb.ProgressReport, ident: Identity) -> None:
        """Only let a caller register a pid it owns that belongs to the reported Slurm job."""
        if not pid_alive(r.pid):
            raise ValueError(f"pid {r.pid} is not a running process on node {self.node}")
        owner = _proc_uid(r.pid)
        if not self.auth.is_privileged(ident) and owner != ident.uid:
            raise _RpcAbort(grpc.StatusCode.PERMISSION_DENIED,
                            f"uid {ident.uid} may not register pid {r.pid} (owned by uid {owner})")
        env_job = _proc_env(r.pid, "SLURM_JOB_ID")
        if isinstance(env_job, str) and env_job != r.slurm_job_id:
            raise _RpcAbort(grpc.StatusCode.PERMISSION_DENIED,
                            f"pid {r.pid} belongs to slurm job {env_job}, not {r.slurm_job_id}")
        if env_job is None and not self.auth.is_privileged(ident):
            raise _RpcAbort(grpc.StatusCode.PERMISSION_DENIED, f"pid {r.pid} is not part of a Slurm job")

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
            pids = [p for p in rec.pids if pid_alive(p)]
            step_at_signal = rec.step
            prev_state = rec.state
            if pids:
                rec.state = "preempting"
        prev = self._latest(request.job_key, verify=False)
        emit("preempt_start", job_key=request.job_key, slurm_job_id=rec.slurm_job_id, pids=pids,
             step=step_at_signal, prev_checkpoint=prev.step if prev else None)
        if not pids:
            good = self._latest(request.job_key, verify=True)
            ok = good is not None and good.step >= step_at_signal
            return self._reply(rec, ok, good, t0, True,
                               f"job {request.job_key} has no live process on node {self.node} (state {prev_state}); "
                               + ("latest checkpoint covers its progress" if ok
                                  else "no checkpoint covers its progress"))
        for pid in pids:
            try:
                os.kill(pid, signal.SIGUSR2)
            except ProcessLookupError:
                pass
            except PermissionError as exc:
                with self.tracker.lock:
                    rec.state = prev_state
                raise _RpcAbort(grpc.StatusCode.FAILED_PRECONDITION, f"cannot signal pid {pid}: {exc}") from None
        deadline = t0 + timeout
        done: CheckpointInfo | None = None
        exited = False
        while time.monotonic() < deadline and context.is_active():
            exited = not any(pid_alive(p) for p in pids)
            cand = self._latest(request.job_key, verify=False)
            if (cand is not None and cand.step >= step_at_signal
                    and (prev is None or (cand.step, cand.created) != (prev.step, prev.created))):
                if self._verify(request.job_key, cand):
                    done = cand
                    break
            if exited:
                # one more look: the checkpoint may have landed just before exit
                # (an older checkpoint is fine if the job had made no progress past it, e.g. it was
                # preempted right after resuming)
                cand = self._latest(request.job_key, verify=True)
                if cand is not None and cand.step >= step_at_signal:
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
                rec.state = "exited" if exited else prev_state
        why = ("process exited without writing a new checkpoint" if exited
               else f"timed out after {timeout:.1f}s waiting for a checkpoint at step >= {step_at_signal}")
        good = self._latest(request.job_key, verify=True)
        return self._reply(rec, False, good, t0, exited, why)

    def _verify(self, job_key: str, info: CheckpointInfo) -> bool:
        """:meth:`CheckpointStore.verify`; a store out of reach counts as "not yet" (logged), not an RPC failure."""
        try:
            return self.store.verify(info)
        except StoreError as exc:
            emit("store_error", logging.WARNING, job_key=job_key, error=str(exc))
            return False

    def _latest(self, job_key: str, verify: bool) -> CheckpointInfo | None:
        try:
            return self.store.latest(job_key, verify=verify)
        except StoreError as exc:
            emit("store_error", logging.WARNING, job_key=job_key, error=str(exc))
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
    ) -> None:
        self.servicer = NodeAgentServicer(node, auth, store, tracker)
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
