"""Shared set-up for tests that run a real node agent over gRPC on 127.0.0.1 (used by test_agent*.py).

``serve_agent``: a real :class:`NodeAgentServer` named ``node-a`` on a free port, its store under
``tmp_path/store``, stopped on exit. ``uid_agent``: the same with :class:`UidAuth` (callers of any uid)
and a ``client(uid)`` factory whose clients are all closed before the server stops.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from nodeagent.auth import Authenticator, Identity, SharedKeyAuthenticator
from nodeagent.client import AgentClient
from nodeagent.server import JobTracker, NodeAgentServer
from nodeagent.slurmjob import SlurmJobs
from nodeagent.store import LocalFSStore

NODE = "node-a"
ClientFor = Callable[[int], AgentClient]


class UidAuth(SharedKeyAuthenticator):
    """Test double for MUNGE: the credential names the caller's uid (tests of the agent's authorisation)."""

    def __init__(self, key: Path, uid: int = 0) -> None:
        super().__init__(key)
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
