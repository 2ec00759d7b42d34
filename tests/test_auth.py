"""Tests for nodeagent.auth: shared-key HMAC and real MUNGE credentials.

The MUNGE tests start their own munged (temp key, temp socket) and so need root
and the munge binaries; they are skipped with the reason otherwise.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

import grpc
import pytest

from nodeagent.auth import (
    AUTH_HEADER,
    REPLY_SUFFIX,
    AuthError,
    Identity,
    MungeAuthenticator,
    SharedKeyAuthenticator,
    make_authenticator,
    request_digest,
)
from nodeagent.client import UNAUTHENTICATED_REPLY, AgentClient, AgentError
from nodeagent.server import NodeAgentServer
from nodeagent.slurmjob import SlurmJobInfo, SlurmJobs
from nodeagent.store import LocalFSStore

M = "/rlsched.agent.v1.NodeAgent/Preempt"


@pytest.fixture
def key(tmp_path: Path) -> Path:
    return SharedKeyAuthenticator.generate(tmp_path / "agent.key")


# --------------------------------------------------------------- shared key


def test_sharedkey_roundtrip_identity_is_key_owner(key: Path) -> None:
    a = SharedKeyAuthenticator(key)
    ident = a.verify(M, b"body", a.sign(M, b"body"))
    st = key.stat()
    assert ident == Identity(uid=st.st_uid, gid=st.st_gid, scheme="hmac-sha256")
    assert stat.S_IMODE(st.st_mode) == 0o600


def test_sharedkey_rejects_tampering_and_replay(key: Path, tmp_path: Path) -> None:
    a = SharedKeyAuthenticator(key)
    h = a.sign(M, b"body")
    with pytest.raises(AuthError, match="request body"):
        a.verify(M, b"other body", h)
    with pytest.raises(AuthError, match="issued for"):
        a.verify("/rlsched.agent.v1.NodeAgent/Health", b"body", h)
    a.verify(M, b"body", h)
    with pytest.raises(AuthError, match="replayed"):
        a.verify(M, b"body", h)
    other = SharedKeyAuthenticator(SharedKeyAuthenticator.generate(tmp_path / "other.key"))
    with pytest.raises(AuthError, match="bad hmac"):
        a.verify(M, b"body", other.sign(M, b"body"))
    scheme, token = h.split(" ", 1)
    with pytest.raises(AuthError):
        a.verify(M, b"body", f"{scheme} {token[:-2]}00")
    for bad in (None, "", "hmac-sha256", "munge MUNGE:xyz", "hmac-sha256 !!!.zz"):
        with pytest.raises(AuthError):
            a.verify(M, b"body", bad)


def test_token_is_bound_to_the_target_node(key: Path) -> None:
    """A credential names the node whose agent it is for; another node's agent refuses it (replay)."""
    a = SharedKeyAuthenticator(key)
    h = a.sign(M, b"body", node="node1")
    with pytest.raises(AuthError, match="issued for node 'node1', not 'node2'"):
        a.verify(M, b"body", h, node="node2")
    assert a.verify(M, b"body", h, node="node1").uid == key.stat().st_uid
    # bound to no node: only where the verifier allows it (Health)
    with pytest.raises(AuthError, match="not bound to a node"):
        a.verify(M, b"body", a.sign(M, b"body"), node="node1")
    assert a.verify(M, b"body", a.sign(M, b"body"), node="node1", unbound_ok=True)
    with pytest.raises(AuthError, match="issued for node"):  # unbound_ok does not accept another node's
        a.verify(M, b"body", a.sign(M, b"body", node="node2"), node="node1", unbound_ok=True)
    # a token from a client older than node binding (no "a" in the payload)
    import json

    old = json.dumps({"m": M, "h": request_digest(b"body"), "t": time.time(), "n": "abc"}).encode()
    with pytest.raises(AuthError, match="not bound to a node"):
        a.verify(M, b"body", f"{a.scheme} {a._make_token(old)}", node="node1")
    nan = json.dumps({"m": M, "h": request_digest(b"body"), "t": float("nan"), "n": "x", "a": "node1"}).encode()
    with pytest.raises(AuthError, match="not finite"):  # NaN would never be "too far off"
        a.verify(M, b"body", f"{a.scheme} {a._make_token(nan)}", node="node1")


def test_captured_credential_cannot_be_replayed_to_another_node(key: Path, tmp_path: Path) -> None:
    """Two agents trusting the same key (as all nodes trust the MUNGE key): a Preempt credential on its
    way to node-a is refused by node-b; clients bind to the node they are given or learn it from Health."""
    from proto import rlsched_agent_pb2 as pb
    from proto import rlsched_agent_pb2_grpc as pbg

    with NodeAgentServer("node-a", "127.0.0.1:0", SharedKeyAuthenticator(key), LocalFSStore(tmp_path / "s")) as na, \
            NodeAgentServer("node-b", "127.0.0.1:0", SharedKeyAuthenticator(key), LocalFSStore(tmp_path / "s")) as nb:
        req = pb.PreemptRequest(job_key="job-x", slurm_job_id="7", timeout_s=1)
        header = SharedKeyAuthenticator(key).sign(M, req.SerializeToString(deterministic=True), node="node-a")

        def call(srv: NodeAgentServer) -> grpc.StatusCode:
            with grpc.insecure_channel(srv.address) as ch:
                try:
                    pbg.NodeAgentStub(ch).Preempt(req, timeout=5, metadata=((AUTH_HEADER, header),))
                except grpc.RpcError as e:
                    return e.code()
            return grpc.StatusCode.OK

        assert call(nb) == grpc.StatusCode.UNAUTHENTICATED, "replayed to another node"
        assert call(na) == grpc.StatusCode.NOT_FOUND, "authenticated where it was meant for (no such job)"
        assert call(na) == grpc.StatusCode.UNAUTHENTICATED, "and only once"
        with AgentClient(nb.address, SharedKeyAuthenticator(key), timeout=5) as c:
            assert c.job_stats() == [] and c.node == "node-b"  # learnt from Health
        with AgentClient(nb.address, SharedKeyAuthenticator(key), timeout=5, node="node-a") as c:
            with pytest.raises(AgentError) as e:
                c.job_stats()  # wrong address for node-a: refused, not served by node-b
            assert e.value.code == "UNAUTHENTICATED" and "node 'node-a', not 'node-b'" in e.value.details
            with pytest.raises(AgentError) as e:
                c.health()  # bound to node-a as well
            assert e.value.code == "UNAUTHENTICATED"


def test_sharedkey_rejects_stale_timestamp(key: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a = SharedKeyAuthenticator(key, max_skew_s=30)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() - 300)
    h = a.sign(M, b"b")
    monkeypatch.setattr(time, "time", real)
    with pytest.raises(AuthError, match="timestamp"):
        a.verify(M, b"b", h)


def test_sharedkey_file_requirements(tmp_path: Path) -> None:
    loose = tmp_path / "loose.key"
    loose.write_text("x" * 64)
    loose.chmod(0o644)
    with pytest.raises(AuthError, match="chmod 600"):
        SharedKeyAuthenticator(loose)
    short = tmp_path / "short.key"
    short.write_text("abc")
    short.chmod(0o600)
    with pytest.raises(AuthError, match="too short"):
        SharedKeyAuthenticator(short)
    with pytest.raises(AuthError, match="does not exist"):
        SharedKeyAuthenticator(tmp_path / "missing.key")
    with pytest.raises(FileExistsError):
        SharedKeyAuthenticator.generate(short)


def test_make_authenticator_specs(key: Path) -> None:
    assert isinstance(make_authenticator(f"sharedkey:{key}"), SharedKeyAuthenticator)
    assert isinstance(make_authenticator("munge"), MungeAuthenticator)
    m = make_authenticator("munge:/run/x.sock")
    assert isinstance(m, MungeAuthenticator) and m.socket == "/run/x.sock"
    with pytest.raises(ValueError, match="unknown auth spec"):
        make_authenticator("kerberos")


def test_privilege_set(key: Path) -> None:
    a = SharedKeyAuthenticator(key, allowed_uids={1234})
    assert a.is_privileged(Identity(0, 0, "x")) and a.is_privileged(Identity(1234, 0, "x"))
    assert not a.is_privileged(Identity(1000, 1000, "x"))
    # an extra Preempt caller is not an agent: only root (and the SlurmUser, munge) sign agents' replies
    assert a.is_agent_identity(Identity(0, 0, "x")) and not a.is_agent_identity(Identity(1234, 0, "x"))
    assert SharedKeyAuthenticator(key, agent_uids={1234}).is_agent_identity(Identity(1234, 0, "x"))


def test_reply_tokens_bind_method_response_node_and_request(key: Path) -> None:
    a = SharedKeyAuthenticator(key)
    req = a.sign(M, b"req", node="node1")
    rep = a.sign_reply(M, req, b"resp", node="node1")
    for method, request, body, node, why in [
        ("/rlsched.agent.v1.NodeAgent/Health", req, b"resp", "node1", "issued for"),
        (M, a.sign(M, b"req", node="node1"), b"resp", "node1", "another request"),  # same call, signed again
        (M, req, b"resp2", "node1", "response body"),
        (M, req, b"resp", "node2", "issued for node 'node1', not 'node2'"),
        (M, req, b"resp", "", "without the node name"),
    ]:
        with pytest.raises(AuthError, match=why):
            a.verify_reply(method, request, body, rep, node=node)
    with pytest.raises(AuthError, match="missing x-rlsched-reply-auth"):
        a.verify_reply(M, req, b"resp", None, node="node1")
    # request and reply tokens never stand in for each other, even with matching bodies
    with pytest.raises(AuthError, match="issued for"):
        a.verify(M, b"resp", rep, node="node1")
    with pytest.raises(AuthError, match="issued for"):
        a.verify_reply(M, req, b"req", req, node="node1")
    forged_method = a.sign(M + REPLY_SUFFIX, b"resp", node="node1")  # a request token under the reply label
    with pytest.raises(AuthError, match="names no request"):
        a.verify_reply(M, req, b"resp", forged_method, node="node1")
    with pytest.raises(AuthError, match="not a request credential"):
        a.verify(M + REPLY_SUFFIX, b"resp", a.sign_reply(M, req, b"resp", node="node1"), node="node1")
    with pytest.raises(AuthError, match="bound to the agent's node"):
        a.sign_reply(M, req, b"resp", node="")
    assert a.verify_reply(M, req, b"resp", rep, node="node1").uid == key.stat().st_uid
    with pytest.raises(AuthError, match="replayed"):
        a.verify_reply(M, req, b"resp", rep, node="node1")


# -------------------------------------------------------------------- munge


def _munge_usable() -> str | None:
    if os.geteuid() != 0:
        return "needs root to start a private munged"
    for b in ("munge", "unmunge", "munged", "runuser"):
        if shutil.which(b) is None:
            return f"{b} not installed"
    if shutil.which("mungekey") is None and shutil.which("create-munge-key") is None:
        return "neither mungekey nor create-munge-key installed"
    return None


@pytest.fixture(scope="module")
def munge_socket() -> Iterator[str]:
    why = _munge_usable()
    if why:
        pytest.skip(f"MUNGE tests skipped: {why}")
    d = Path(tempfile.mkdtemp(prefix="rlsched-munge-"))
    d.chmod(0o755)  # the unprivileged test client must reach the socket
    keyf = d / "munge.key"
    if shutil.which("mungekey"):
        subprocess.run(["mungekey", "-c", "-k", str(keyf), "-b", "1024"], check=True, capture_output=True)
    else:
        subprocess.run(["create-munge-key", "-f", "-k", str(keyf)], check=True, capture_output=True)
    sock = str(d / "munge.socket")
    proc = subprocess.Popen(
        ["munged", "-F", "-f", f"--socket={sock}", f"--key-file={keyf}", f"--log-file={d / 'munged.log'}",
         f"--pid-file={d / 'munged.pid'}", f"--seed-file={d / 'munged.seed'}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 15
        while not os.path.exists(sock):
            if proc.poll() is not None:
                pytest.skip(f"munged failed to start: {proc.stderr.read().decode()[-300:]}")  # type: ignore[union-attr]
            if time.monotonic() > deadline:
                pytest.skip("munged did not create its socket within 15 s")
            time.sleep(0.05)
        yield sock
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(d, ignore_errors=True)


def _nobody_munge(tmp_path: Path) -> str:
    """A `munge` wrapper that encodes as user nobody (an unprivileged caller)."""
    w = tmp_path / "munge-as-nobody"
    w.write_text('#!/bin/sh\nexec runuser -u nobody -- munge "$@"\n')
    w.chmod(0o755)
    return str(w)


def test_munge_roundtrip_root(munge_socket: str) -> None:
    a = MungeAuthenticator(socket=munge_socket, slurm_conf="/nonexistent")
    ident = a.verify(M, b"req", a.sign(M, b"req"))
    assert ident == Identity(uid=0, gid=0, scheme="munge")
    assert a.is_privileged(ident)


def test_munge_rejects_tamper_replay_garbage(munge_socket: str) -> None:
    a = MungeAuthenticator(socket=munge_socket, slurm_conf="/nonexistent")
    h = a.sign(M, b"req")
    with pytest.raises(AuthError, match="request body"):
        a.verify(M, b"req2", h)
    # munged itself refuses to decode the same credential twice
    with pytest.raises(AuthError, match="replayed"):
        a.verify(M, b"req", h)
    with pytest.raises(AuthError, match="malformed"):
        a.verify(M, b"req", "munge not-a-credential")
    body = h.split(" ", 1)[1]
    with pytest.raises(AuthError, match="rejected"):
        a.verify(M, b"req", "munge " + body[:20] + ("A" if body[20] != "A" else "B") + body[21:])


def test_munge_unprivileged_uid(munge_socket: str, tmp_path: Path) -> None:
    nobody = MungeAuthenticator(socket=munge_socket, munge_bin=_nobody_munge(tmp_path), slurm_conf="/nonexistent")
    verifier = MungeAuthenticator(socket=munge_socket, slurm_conf="/nonexistent")
    ident = verifier.verify(M, b"x", nobody.sign(M, b"x"))
    assert ident.uid == 65534 and not verifier.is_privileged(ident)
    verifier.allowed_uids.add(65534)
    assert verifier.is_privileged(verifier.verify(M, b"y", nobody.sign(M, b"y")))


def test_munge_unreachable_daemon_is_clear_error(tmp_path: Path) -> None:
    if shutil.which("munge") is None:
        pytest.skip("munge not installed")
    a = MungeAuthenticator(socket=str(tmp_path / "no.sock"))
    with pytest.raises(AuthError, match="munge failed"):
        a.sign(M, b"x")


def test_munge_end_to_end_grpc(munge_socket: str, tmp_path: Path) -> None:
    """Agent with MUNGE auth: root may preempt (NOT_FOUND: no such job), nobody is refused."""
    srv_auth = MungeAuthenticator(socket=munge_socket, slurm_conf="/nonexistent")
    slurm = SlurmJobs(lambda sid: SlurmJobInfo(sid, 65534, "RUNNING"), require_cgroup=False)  # every job is nobody's
    with NodeAgentServer("n1", "127.0.0.1:0", srv_auth, LocalFSStore(tmp_path / "s"), slurm=slurm) as srv:
        root = AgentClient(srv.address, MungeAuthenticator(socket=munge_socket), timeout=10)
        assert root.health()["auth_scheme"] == "munge"
        with pytest.raises(AgentError) as e:
            root.preempt("no-such-job", "1", timeout_s=1)
        assert e.value.code == "NOT_FOUND"
        nobody = AgentClient(srv.address, MungeAuthenticator(socket=munge_socket,
                                                             munge_bin=_nobody_munge(tmp_path)), timeout=10)
        assert nobody.health()["node"] == "n1"  # any authenticated user may read
        with pytest.raises(AgentError) as e:
            nobody.preempt("no-such-job", "1", timeout_s=1)
        assert e.value.code == "PERMISSION_DENIED"
        # nobody may not register a root-owned process (it would get SIGUSR2 on preemption)
        from proto import rlsched_agent_pb2 as pb0

        with pytest.raises(AgentError) as e:
            nobody.report_progress(pb0.ProgressReport(job_key="nb", slurm_job_id="1", step=1, total_steps=2,
                                                      pid=os.getpid(), checkpoint_step=-1, comm_fraction=-1))
        assert e.value.code == "PERMISSION_DENIED" and "owned by uid 0" in e.value.details
        # a raw call with no credential at all
        ch = grpc.insecure_channel(srv.address)
        from proto import rlsched_agent_pb2 as pb
        from proto import rlsched_agent_pb2_grpc as pbg

        with pytest.raises(grpc.RpcError) as r:
            pbg.NodeAgentStub(ch).Preempt(pb.PreemptRequest(job_key="x"), timeout=5,
                                          metadata=((AUTH_HEADER, "munge MUNGE:forged:"),))
        assert r.value.code() == grpc.StatusCode.UNAUTHENTICATED
        ch.close()
        root.close()
        nobody.close()


def test_munge_replies_end_to_end(munge_socket: str, tmp_path: Path) -> None:
    """MUNGE agent: its replies (signed by root, its uid) verify for every RPC; an agent -- or whatever listens
    on its port -- signing as nobody is refused, even by a client that lets nobody call Preempt, unless nobody
    is the SlurmUser (read from slurm.conf)."""
    from proto import rlsched_agent_pb2 as pb

    slurm = SlurmJobs(lambda sid: SlurmJobInfo(sid, 0, "RUNNING"), require_cgroup=False)
    with NodeAgentServer("n1", "127.0.0.1:0", MungeAuthenticator(socket=munge_socket, slurm_conf="/nonexistent"),
                         LocalFSStore(tmp_path / "s"), slurm=slurm) as srv, \
            AgentClient(srv.address, MungeAuthenticator(socket=munge_socket, slurm_conf="/nonexistent"),
                        timeout=10) as c:
        assert c.health()["node"] == "n1" and c.node is None
        c.report_progress(pb.ProgressReport(job_key="j", slurm_job_id="1", step=1, total_steps=2,
                                            checkpoint_step=-1, comm_fraction=-1))
        assert c.node == "n1" and [s["job_key"] for s in c.job_stats()] == ["j"]
        with pytest.raises(AgentError) as e:
            c.preempt("no-such-job", "1", timeout_s=1)
        assert e.value.code == "NOT_FOUND"
    conf = tmp_path / "slurm.conf"
    conf.write_text("SlurmUser=nobody\n")
    nobody_agent = MungeAuthenticator(socket=munge_socket, munge_bin=_nobody_munge(tmp_path), slurm_conf="/nonexistent")
    with NodeAgentServer("n1", "127.0.0.1:0", nobody_agent, LocalFSStore(tmp_path / "s2")) as srv:
        for slurm_conf, allowed, ok in [("/nonexistent", {65534}, False), (str(conf), set(), True)]:
            auth = MungeAuthenticator(socket=munge_socket, slurm_conf=slurm_conf, allowed_uids=allowed)
            with AgentClient(srv.address, auth, timeout=10, node="n1") as c:
                if ok:
                    assert c.health()["node"] == "n1"
                    continue
                with pytest.raises(AgentError) as e:
                    c.health()
                assert e.value.code == UNAUTHENTICATED_REPLY
                assert "signed by uid 65534, which is neither root nor the SlurmUser" in e.value.details


def test_munge_token_bound_to_node(munge_socket: str) -> None:
    a = MungeAuthenticator(socket=munge_socket, slurm_conf="/nonexistent")
    with pytest.raises(AuthError, match="issued for node 'node1', not 'node2'"):
        a.verify(M, b"req", a.sign(M, b"req", node="node1"), node="node2")
    assert a.verify(M, b"req", a.sign(M, b"req", node="node2"), node="node2").uid == 0


def _as_user(user: str, sid: str) -> subprocess.Popen:
    """A process of ``user`` that claims, in its environment, to be part of Slurm job ``sid``."""
    import pwd

    pw = pwd.getpwnam(user)

    # applied by the C fork helper (no Python code in a child forked beside gRPC threads)
    return subprocess.Popen(["sleep", "300"], env={"SLURM_JOB_ID": sid, "PATH": "/usr/bin:/bin"},
                            user=pw.pw_uid, group=pw.pw_gid, extra_groups=[])


def _user_munge(tmp_path: Path, user: str) -> str:
    w = tmp_path / f"munge-as-{user}"
    w.write_text(f'#!/bin/sh\nexec runuser -u {user} -- munge "$@"\n')
    w.chmod(0o755)
    return str(w)


def test_munge_job_key_cannot_be_squatted_by_another_user(munge_socket: str, tmp_path: Path) -> None:
    """nobody sets SLURM_JOB_ID=101 in its own process and reports job 101's key first: Slurm says job 101 is
    www-data's, so nobody is refused, the real job registers, and Preempt signals only the real job."""
    from nodeagent.client import AgentClient
    from proto import rlsched_agent_pb2 as pb

    try:
        import pwd

        www = pwd.getpwnam("www-data").pw_uid
    except KeyError:
        pytest.skip("no www-data user")
    slurm = SlurmJobs(lambda sid: SlurmJobInfo(sid, www, "RUNNING") if sid == "101" else None, require_cgroup=False)
    srv_auth = MungeAuthenticator(socket=munge_socket, slurm_conf="/nonexistent")
    victim, squat = _as_user("www-data", "101"), _as_user("nobody", "101")

    def rep(pid: int) -> pb.ProgressReport:
        return pb.ProgressReport(job_key="slurm-101", slurm_job_id="101", step=10, total_steps=100, samples=80,
                                 elapsed_s=1.0, checkpoint_step=-1, comm_fraction=-1, world_size=1, pid=pid)

    try:
        with NodeAgentServer("n1", "127.0.0.1:0", srv_auth, LocalFSStore(tmp_path / "s"), slurm=slurm) as srv:
            def client(user: str | None) -> AgentClient:
                bin_ = _user_munge(tmp_path, user) if user else "munge"
                return AgentClient(srv.address, MungeAuthenticator(socket=munge_socket, munge_bin=bin_), timeout=10)

            with client("nobody") as c, pytest.raises(AgentError) as e:
                c.report_progress(rep(squat.pid))
            assert e.value.code == "PERMISSION_DENIED" and f"slurm job 101 belongs to uid {www}" in e.value.details
            with client("www-data") as c:
                assert c.report_progress(rep(victim.pid))["accepted"]
            with client(None) as root:
                (st,) = root.job_stats()
                assert st["pids"] == [victim.pid]
                r = root.preempt("slurm-101", "101", timeout_s=5)
            assert r["ok"] is False and r["process_exited"]  # sleep dies of SIGUSR2 without a checkpoint
            assert victim.wait(timeout=10) == -signal.SIGUSR2
            assert squat.poll() is None, "the squatter's process was never signalled"
    finally:
        for p in (victim, squat):
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.mark.parametrize("payload,needle", [
    (b'{"m": "M", "h": "x", "t": 1' + b"0" * 400 + b', "n": "a"}', "OverflowError"),
    (b"[" * 100_000 + b"]" * 100_000, "RecursionError"),
])
def test_authenticated_but_malformed_payload_is_refused_not_an_internal_error(key: Path, payload: bytes,
                                                                              needle: str) -> None:
    """A caller holding a valid credential (with munge: any user) may sign any payload: a timestamp beyond
    float range or deeply nested JSON is an AuthError (UNAUTHENTICATED), not an uncaught exception."""
    a = SharedKeyAuthenticator(key)
    header = f"{a.scheme} {a._make_token(payload)}"
    with pytest.raises(AuthError, match=f"malformed auth payload: {needle}"):
        a.verify(M, b"body", header)
