"""Shared set-up for tests that run a real node agent over gRPC on 127.0.0.1 (used by test_agent*.py).

``serve_agent``: a real :class:`NodeAgentServer` named ``node-a`` on a free port, its store under
``tmp_path/store``, stopped on exit. ``uid_agent``: the same with :class:`UidAuth` (callers of any uid)
and a ``client(uid)`` factory whose clients are all closed before the server stops. ``fake_agent``: a
plain gRPC server implementing the agent's service (proto/) that is *not* the agent (what any local user
could bind on a free agent port): it answers what it likes (a Preempt "done" and "ok" at once), with the reply
credential its ``trailer`` makes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc

from nodeagent.auth import AUTH_HEADER, REPLY_AUTH_HEADER, Authenticator, Identity, SharedKeyAuthenticator
from nodeagent.client import SERVICE, AgentClient
from nodeagent.server import JobTracker, NodeAgentServer
from nodeagent.slurmjob import SlurmJobs
from nodeagent.store import LocalFSStore
from proto import rlsched_agent_pb2 as pb
from proto import rlsched_agent_pb2_grpc as pb_grpc

NODE = "node-a"
ClientFor = Callable[[int], AgentClient]
#: (full method name, the request's auth header value, response) -> reply credential to send (None: none;
#: a tuple: several)
Trailer = Callable[[str, str, Any], "str | tuple[str, ...] | None"]


class UidAuth(SharedKeyAuthenticator):
    """Test double for MUNGE: the credential names the caller's uid (tests of the agent's authorisation)."""

    def __init__(self, key: Path, uid: int = 0, **kw: Any) -> None:
        super().__init__(key, **kw)
        self.uid = uid

    def _make_token(self, payload: bytes) -> str:
        return f"{self.uid}~" + super()._make_token(payload)

    def _open_token(self, token: str) -> tuple[bytes, Identity]:
        uid, _, rest = token.partition("~")
        payload, _ = super()._open_token(rest)
        return payload, Identity(int(uid), int(uid), self.scheme)


@contextmanager
def serve_agent(tmp_path: Path, auth: Authenticator, tracker: JobTracker | None = None,
                **server_kw: Any) -> Iterator[NodeAgentServer]:
    """Run a real agent ``node-a`` on 127.0.0.1:0 with a LocalFSStore in ``tmp_path/store`` (a fresh
    JobTracker unless ``tracker``); ``server_kw`` go to NodeAgentServer. Stopped when the block ends."""
    with NodeAgentServer(NODE, "127.0.0.1:0", auth, LocalFSStore(tmp_path / "store"),
                         tracker if tracker is not None else JobTracker(), **server_kw) as srv:
        yield srv


@contextmanager
def uid_agent(tmp_path: Path, key: Path, slurm: SlurmJobs, client_timeout: float = 10.0,
              client_node: str | None = None, **server_kw: Any) -> Iterator[tuple[NodeAgentServer, ClientFor]]:
    """``serve_agent`` with ``UidAuth(key)`` and ``slurm``; yields (server, client(uid)), where client(uid)
    opens an AgentClient authenticated as ``uid``. Every client opened is closed before the server stops."""
    clients: list[AgentClient] = []
    with serve_agent(tmp_path, UidAuth(key), slurm=slurm, **server_kw) as srv:
        def client(uid: int) -> AgentClient:
            c = AgentClient(srv.address, UidAuth(key, uid), timeout=client_timeout, node=client_node)
            clients.append(c)
            return c

        try:
            yield srv, client
        finally:
            for c in clients:
                c.close()


def signed_by(auth: Authenticator, node: str = NODE) -> Trailer:
    """A trailer that signs each reply properly with ``auth`` for ``node`` (as a real agent would)."""
    return lambda method, header, resp: auth.sign_reply(method, header, resp.SerializeToString(deterministic=True),
                                                        node=node)


class FakeAgent(pb_grpc.NodeAgentServicer):
    """Not an agent: claims to be ``node``'s, reports a job under a bogus key with false progress, and answers
    every Preempt ``ok`` with a checkpoint that does not exist (``replies``: RPC name -> response to send
    instead). Records the RPCs it answered in ``calls``."""

    def __init__(self, node: str = NODE, trailer: Trailer | None = None, replies: dict[str, Any] | None = None) -> None:
        self.node = node
        self.trailer = trailer
        self.replies = dict(replies or {})
        self.calls: list[str] = []

    def _answer(self, name: str, resp: Any, context: grpc.ServicerContext) -> Any:
        resp = self.replies.get(name, resp)
        header = dict(context.invocation_metadata() or ()).get(AUTH_HEADER, "")
        token = self.trailer(SERVICE + name, header, resp) if self.trailer is not None else None
        if token is not None:  # a tuple: that many entries under the key
            tokens = token if isinstance(token, tuple) else (token,)
            context.set_trailing_metadata(tuple((REPLY_AUTH_HEADER, t) for t in tokens))
        self.calls.append(name)
        return resp

    def Health(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._answer("Health", pb.HealthResponse(node=self.node, version="3", auth_scheme="hmac-sha256"),
                            context)

    def JobStats(self, request: Any, context: grpc.ServicerContext) -> Any:
        job = pb.JobStat(job_key="bogus-key", slurm_job_id="7", model="MLP", step=990, total_steps=1000,
                         samples_per_s=1e6, last_checkpoint_step=-1, comm_fraction=-1, state="running")
        return self._answer("JobStats", pb.JobStatsResponse(node=self.node, jobs=[job]), context)

    def Preempt(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._answer("Preempt", self._preempted(), context)

    def PreemptStatus(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._answer("PreemptStatus", self._preempted(), context)

    @staticmethod
    def _preempted() -> Any:
        return pb.PreemptResponse(
            ok=True, checkpoint_step=990, checkpoint_uri="file:///nonexistent/ckpt/990", process_exited=True,
            message="checkpoint at step 990 is durable and verified", wait_s=0.1, operation_id="op-1", done=True)

    def ReportProgress(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._answer("ReportProgress", pb.ProgressAck(accepted=True, store_url="file:///tmp/elsewhere"),
                            context)


@contextmanager
def fake_agent(trailer: Trailer | None = None, node: str = NODE,
               replies: dict[str, Any] | None = None) -> Iterator[tuple[str, FakeAgent]]:
    """Serve a :class:`FakeAgent` on 127.0.0.1:0; yields (address, servicer). Stopped when the block ends."""
    servicer = FakeAgent(node, trailer, replies)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_NodeAgentServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        server.stop(0).wait()
