"""Python client for the node agent (used by the controller and by job helpers).

Stable API (the controller depends on it)::

    c = AgentClient("127.0.0.1:50051", make_authenticator("munge"), timeout=10.0, node="node1")
    c.health()      -> {"node", "version", "uptime_s", "num_jobs", "store_url", "auth_scheme"}
    c.job_stats()   -> [{"job_key", "slurm_job_id", "model", "step", "total_steps",
                         "samples_per_s", "isolated_samples_per_s" (None if unknown),
                         "isolated_source", "cs" (None if unknown),
                         "last_checkpoint_step" (None if none), "comm_fraction" (None if not profiled),
                         "pids", "state", "last_report_age_s", "world_size"}, ...]
    c.preempt(job_key, slurm_job_id, timeout_s=60)
                    -> {"ok", "checkpoint_step" (None if none), "checkpoint_uri", "message",
                        "process_exited", "wait_s", "operation_id", "done", "joined"}
    c.preempt_start(job_key, slurm_job_id, timeout_s=60)   -> the same dict, at once (done False)
    c.preempt_status(operation_id)                          -> the same dict, at once

Preempt is asynchronous on the agent (protocol version 4): ``preempt_start``
starts (or joins: one operation per job) a preemption that the agent runs in its
own thread and answers at once; ``preempt_status`` reads it; ``preempt`` does
both, polling every ``poll_s`` until it is done or ``timeout_s`` plus the client
timeout have passed. No call holds an agent worker while a job checkpoints.

``node`` is the Slurm node name the agent serves (its ``--node``): every
credential names it, and an agent refuses credentials made for another node
(so a captured one cannot be replayed to another node's agent). Without
``node`` the client asks the agent's Health (the one RPC that accepts a
credential bound to no node) once and uses the name it answers: fine for a job
talking to its own node's agent; callers that know the node (the controller)
should pass it, so that a wrong address cannot redirect their credentials.

Every reply is authenticated (``nodeagent.auth``): the agent signs it in the
trailing metadata, bound to the method, the response, its node name and this
call's own request credential; the client accepts it only if that verifies for
``node`` and the signer is an agent (root or the SlurmUser: ``is_agent_identity``).
Otherwise the call raises :class:`AgentError` with code
:data:`UNAUTHENTICATED_REPLY`: whatever answered on the agent's port (the agent
being down) is not that node's agent, or the agent is older than this client.

Units: throughput in samples/s, times in seconds. Every call raises
:class:`AgentError` (with ``.code``, the gRPC status name such as
``"NOT_FOUND"``, ``"UNAUTHENTICATED"``, ``"PERMISSION_DENIED"``,
``"INVALID_ARGUMENT"``, ``"UNAVAILABLE"``, ``"DEADLINE_EXCEEDED"``,
``"RESOURCE_EXHAUSTED"`` (over the caller's rate or its number of running
preemptions) or ``"UNAUTHENTICATED_REPLY"``) when the RPC fails. ``preempt``
returns ``ok=False`` (no exception) when the agent ran the protocol but no
durable checkpoint appeared in time, and when it accepted the preemption but its
outcome could not be read before the deadline (``done`` False: the agent
stopped answering, or lost the operation in a restart).
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import grpc

from nodeagent.auth import AUTH_HEADER, REPLY_AUTH_HEADER, Authenticator, AuthError
from proto import rlsched_agent_pb2 as pb
from proto import rlsched_agent_pb2_grpc as pb_grpc

SERVICE = "/rlsched.agent.v1.NodeAgent/"
#: :attr:`AgentError.code` of a reply that is missing its credential or whose credential does not verify.
UNAUTHENTICATED_REPLY = "UNAUTHENTICATED_REPLY"
#: Codes of a PreemptStatus poll that is tried again (until the deadline) rather than raised.
_RETRY_POLL = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED"})


class AgentError(RuntimeError):
    """An agent RPC failed. ``code`` is the gRPC status name, ``details`` the server's message."""

    def __init__(self, method: str, code: str, details: str) -> None:
        super().__init__(f"{method}: {code}: {details}")
        self.method = method
        self.code = code
        self.details = details


def _opt(value: float, unknown: float) -> float | None:
    return None if value == unknown else value


def preempt_to_dict(r: pb.PreemptResponse) -> dict[str, Any]:
    """Convert a PreemptResponse to the documented plain dict (no checkpoint -> None)."""
    return {
        "ok": r.ok,
        "checkpoint_step": None if r.checkpoint_step < 0 else r.checkpoint_step,
        "checkpoint_uri": r.checkpoint_uri,
        "message": r.message,
        "process_exited": r.process_exited,
        "wait_s": r.wait_s,
        "operation_id": r.operation_id,
        "done": r.done,
        "joined": r.joined,
    }


def jobstat_to_dict(s: pb.JobStat) -> dict[str, Any]:
    """Convert a JobStat message to the documented plain dict (unknown -> None)."""
    return {
        "job_key": s.job_key,
        "slurm_job_id": s.slurm_job_id,
        "model": s.model,
        "step": s.step,
        "total_steps": s.total_steps,
        "samples_per_s": s.samples_per_s,
        "isolated_samples_per_s": _opt(s.isolated_samples_per_s, 0.0),
        "isolated_source": s.isolated_source,
        "cs": _opt(s.cs, 0.0),
        "last_checkpoint_step": None if s.last_checkpoint_step < 0 else s.last_checkpoint_step,
        "comm_fraction": None if s.comm_fraction < 0 else s.comm_fraction,
        "pids": list(s.pids),
        "state": s.state,
        "last_report_age_s": s.last_report_age_s,
        "world_size": s.world_size,
    }


class AgentClient:
    """Authenticated, synchronous client for one node agent at ``address`` ("host:port").

    ``timeout`` is the default per-RPC deadline in seconds (:meth:`preempt` waits for the outcome up to
    ``timeout_s + timeout`` in all). ``node``: the agent's node name, which every
    credential is bound to (None: learnt from the agent's Health on the first
    call that needs it). Thread-safe; close() or use as a context manager.
    """

    def __init__(self, address: str, auth: Authenticator, timeout: float = 10.0, node: str | None = None) -> None:
        self.address = address
        self.auth = auth
        self.timeout = timeout
        self.node = node
        self._node_lock = threading.Lock()
        self._channel = grpc.insecure_channel(address)
        self._stub = pb_grpc.NodeAgentStub(self._channel)

    # ---------------------------------------------------------------- plumbing
    def _target_node(self) -> str:
        """The node name to bind credentials to (asks Health once if it was not given)."""
        if self.node is None:
            with self._node_lock:
                if self.node is None:
                    node = self._call("Health", pb.HealthRequest()).node
                    if not node:
                        raise AgentError("Health", "UNKNOWN", f"agent at {self.address} did not name its node")
                    self.node = node
        return self.node

    def _call(self, name: str, request: Any, timeout: float | None = None) -> Any:
        method = SERVICE + name
        node = (self.node or "") if name == "Health" else self._target_node()
        header = self.auth.sign(method, request.SerializeToString(deterministic=True), node=node)
        try:
            response, call = getattr(self._stub, name).with_call(
                request, timeout=self.timeout if timeout is None else timeout, metadata=((AUTH_HEADER, header),)
            )
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            details = exc.details() if hasattr(exc, "details") else str(exc)
            raise AgentError(name, code.name if code else "UNKNOWN", details or "") from None
        # Health without a known node: the reply must be signed for the node it names (it is bound to it)
        self._check_reply(name, method, header, response, call, node or getattr(response, "node", ""))
        return response

    def _check_reply(self, name: str, method: str, header: str, response: Any, call: Any, node: str) -> None:
        """Raise AgentError(UNAUTHENTICATED_REPLY) unless the reply is signed by ``node``'s agent for this call."""
        tokens = [v for k, v in call.trailing_metadata() or () if k == REPLY_AUTH_HEADER]
        token = tokens[0] if len(tokens) == 1 and isinstance(tokens[0], str) else None  # exactly one, or none
        try:
            ident = self.auth.verify_reply(method, header, response.SerializeToString(deterministic=True), token,
                                           node=node)
        except AuthError as exc:
            why = str(exc)
        else:
            if self.auth.is_agent_identity(ident):
                return
            why = f"signed by uid {ident.uid}, which is neither root nor the SlurmUser"
        raise AgentError(name, UNAUTHENTICATED_REPLY,
                         f"the reply from {self.address} is not from the agent of node {node or '?'} (or that agent "
                         f"is older than this client and does not sign its replies): {why}")

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "AgentClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ API
    def health(self) -> dict[str, Any]:
        r = self._call("Health", pb.HealthRequest())
        return {
            "node": r.node,
            "version": r.version,
            "uptime_s": r.uptime_s,
            "num_jobs": r.num_jobs,
            "store_url": r.store_url,
            "auth_scheme": r.auth_scheme,
        }

    def job_stats(self, job_key: str = "", include_finished: bool = False) -> list[dict[str, Any]]:
        r = self._call("JobStats", pb.JobStatsRequest(job_key=job_key, include_finished=include_finished))
        return [jobstat_to_dict(s) for s in r.jobs]

    def preempt_start(self, job_key: str, slurm_job_id: str, timeout_s: float = 60) -> dict[str, Any]:
        """Start checkpoint-and-stop of ``job_key`` on this agent (or join its running preemption); the agent
        waits up to ``timeout_s`` (s, finite and > 0; the agent caps it) for the checkpoint. Answers at once:
        ``operation_id`` for :meth:`preempt_status`, ``done`` False while it runs."""
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s < math.inf:
            raise ValueError(f"preempt timeout_s must be a finite number of seconds > 0, got {timeout_s!r}")
        req = pb.PreemptRequest(job_key=job_key, slurm_job_id=str(slurm_job_id), timeout_s=float(timeout_s))
        return preempt_to_dict(self._call("Preempt", req))

    def preempt_status(self, operation_id: str) -> dict[str, Any]:
        """The state of a preemption started by :meth:`preempt_start` (AgentError NOT_FOUND: the agent does
        not know it, e.g. it restarted)."""
        return preempt_to_dict(self._call("PreemptStatus", pb.PreemptStatusRequest(operation_id=operation_id)))

    def preempt(self, job_key: str, slurm_job_id: str, timeout_s: float = 60, poll_s: float = 0.25) -> dict[str, Any]:
        """Ask the agent to checkpoint and stop ``job_key``, waiting up to ``timeout_s`` (s, finite and > 0;
        the agent caps it) for the checkpoint: :meth:`preempt_start`, then :meth:`preempt_status` every
        ``poll_s`` seconds until the outcome is known or ``timeout_s`` plus the client timeout have passed.

        Errors of the start raise :class:`AgentError`. Once started, a poll that fails with UNAVAILABLE,
        DEADLINE_EXCEEDED or RESOURCE_EXHAUSTED is tried again until the deadline; an unknown operation
        (the agent restarted) ends the wait; both give ``ok=False``, ``done=False`` and say why. A reply
        not from the agent (UNAUTHENTICATED_REPLY) always raises.
        """
        first = self.preempt_start(job_key, slurm_job_id, timeout_s)
        op = first["operation_id"]
        deadline = time.monotonic() + float(timeout_s) + self.timeout
        last = first
        why = ""
        while not last["done"]:
            left = deadline - time.monotonic()
            if left <= 0:
                why = (f"no outcome from the agent of node {self.node or self.address} within {timeout_s}s + "
                       f"{self.timeout}s (operation {op}): {why or last['message']}")
                break
            time.sleep(min(poll_s, left))
            try:
                last = self.preempt_status(op)
            except AgentError as exc:
                if exc.code in _RETRY_POLL:
                    why = f"last poll failed: {exc}"
                    continue
                if exc.code == "NOT_FOUND":
                    why = (f"the agent of node {self.node or self.address} accepted the preemption (operation {op}) "
                           f"but no longer knows it (restarted?): {exc.details}; the job may have been signalled")
                    break
                raise
        if last["done"]:
            return {**last, "joined": first["joined"]}
        return {**last, "ok": False, "done": False, "operation_id": op, "joined": first["joined"], "message": why}

    def report_progress(self, report: pb.ProgressReport, timeout: float | None = None) -> dict[str, Any]:
        """Send one ProgressReport (used by the job helper)."""
        r = self._call("ReportProgress", report, timeout=timeout)
        return {"accepted": r.accepted, "store_url": r.store_url}
