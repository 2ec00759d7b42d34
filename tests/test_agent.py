"""Node agent over real gRPC on 127.0.0.1, with real training subprocesses (torch, CPU).

Covers: health, authentication (missing / bad / unprivileged credentials),
malformed requests and unknown jobs (clear status codes, server stays up),
JobTracker throughput + contention-sensitivity bookkeeping, and the full
preemption round trip: start the example MLP job -> Preempt -> durable,
verified checkpoint + process exits 75 -> restart -> resumes -> finishes
with exactly --total-steps steps and the same parameters as an
uninterrupted run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import grpc
import pytest
from agent_helpers import NODE, ClientFor, UidAuth, fake_agent, serve_agent, signed_by, uid_agent

from nodeagent.auth import AUTH_HEADER, REPLY_AUTH_HEADER, AuthError, SharedKeyAuthenticator
from nodeagent.client import SERVICE, UNAUTHENTICATED_REPLY, AgentClient, AgentError
from nodeagent.jobhelper import EXIT_PREEMPTED
from nodeagent.server import JobTracker, NodeAgentServer, proc_start_time
from nodeagent.slurmjob import SlurmJobInfo, SlurmJobs, SlurmUnavailable
from nodeagent.store import LocalFSStore
from proto import rlsched_agent_pb2 as pb
from proto import rlsched_agent_pb2_grpc as pbg

REPO = Path(__file__).resolve().parents[1]
MLP = REPO / "scripts" / "examples" / "train_mlp.py"
LM = REPO / "scripts" / "examples" / "train_tiny_lm.py"


@pytest.fixture
def key(tmp_path: Path) -> Path:
    return SharedKeyAuthenticator.generate(tmp_path / "agent.key")


@pytest.fixture
def agent(tmp_path: Path, key: Path) -> Iterator[NodeAgentServer]:
    """An agent whose callers hold the root key (privileged); Slurm says every job id is this user's,
    so the pids the tests register must be this user's processes of that job (SLURM_JOB_ID set)."""
    tracker = JobTracker(profile_steps=10, profile_skip_steps=10)
    slurm = SlurmJobs(FakeSlurm(default_uid=os.geteuid()), require_cgroup=False)
    with serve_agent(tmp_path, SharedKeyAuthenticator(key), tracker, reap_interval_s=0.2, slurm=slurm) as srv:
        yield srv


@pytest.fixture
def client(agent: NodeAgentServer, key: Path) -> Iterator[AgentClient]:
    with AgentClient(agent.address, SharedKeyAuthenticator(key), timeout=10) as c:
        yield c


class FakeSlurm:
    """Stands in for slurmctld (a SlurmJobs lookup): job id -> owner uid or (uid, state); counts calls.
    ``default_uid``: the owner of every other numeric job id (None: Slurm knows no other job)."""

    def __init__(self, jobs: dict[str, object] | None = None, default_uid: int | None = None) -> None:
        self.jobs = dict(jobs or {})
        self.default_uid = default_uid
        self.calls: list[str] = []
        self.down = False

    def __call__(self, sid: str) -> SlurmJobInfo | None:
        self.calls.append(sid)
        if self.down:
            raise SlurmUnavailable("slurm_load_jobs error: Unable to contact slurm controller (connect failure)")
        j = self.jobs.get(sid, self.default_uid if sid.replace("_", "").isdigit() else None)
        if j is None:
            return None
        uid, state = j if isinstance(j, tuple) else (j, "RUNNING")
        return SlurmJobInfo(job_id=sid.split("_")[0], uid=int(uid), state=str(state))


def _report(**kw: object) -> pb.ProgressReport:
    base = dict(job_key="job-1", slurm_job_id="101", step=10, total_steps=100, samples=320, elapsed_s=1.0,
                model="MLP", checkpoint_step=-1, comm_fraction=-1.0, world_size=1)
    base.update(kw)
    return pb.ProgressReport(**base)  # type: ignore[arg-type]


# -------------------------------------------------------------------- basics


def test_health(client: AgentClient, agent: NodeAgentServer) -> None:
    h = client.health()
    assert h["node"] == "node-a" and h["num_jobs"] == 0
    assert h["store_url"] == agent.servicer.store.url and h["auth_scheme"] == "hmac-sha256"


def test_unauthenticated_and_bad_credentials_refused(agent: NodeAgentServer, client: AgentClient,
                                                     tmp_path: Path) -> None:
    client.report_progress(_report(pid=0))
    stub = pbg.NodeAgentStub(grpc.insecure_channel(agent.address))
    req = pb.PreemptRequest(job_key="job-1", slurm_job_id="101", timeout_s=1)
    with pytest.raises(grpc.RpcError) as e:
        stub.Preempt(req, timeout=5)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as e:
        stub.Preempt(req, timeout=5, metadata=((AUTH_HEADER, "hmac-sha256 Zm9v.deadbeef"),))
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    # a valid token for another request body is refused too
    good = SharedKeyAuthenticator(tmp_path / "agent.key").sign(
        "/rlsched.agent.v1.NodeAgent/Preempt", pb.PreemptRequest(job_key="other").SerializeToString())
    with pytest.raises(grpc.RpcError) as e:
        stub.Preempt(req, timeout=5, metadata=((AUTH_HEADER, good),))
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    # a different key entirely
    other = SharedKeyAuthenticator(SharedKeyAuthenticator.generate(tmp_path / "wrong.key"))
    with AgentClient(agent.address, other) as c, pytest.raises(AgentError) as ae:
        c.preempt("job-1", "101", timeout_s=1)
    assert ae.value.code == "UNAUTHENTICATED"
    assert client.job_stats()[0]["state"] == "running", "refused preempt must not touch the job"


# ------------------------------------------------------------ reply authentication


def _raw_call(stub: pbg.NodeAgentStub, auth: SharedKeyAuthenticator, name: str, req: object,
              node: str = NODE) -> tuple[str, object, list[str]]:
    """One call with a proper request credential: (its header, the response, the reply tokens in the trailer)."""
    body = req.SerializeToString(deterministic=True)  # type: ignore[attr-defined]
    header = auth.sign(SERVICE + name, body, node=node)
    resp, call = getattr(stub, name).with_call(req, timeout=5, metadata=((AUTH_HEADER, header),))
    return header, resp, [v for k, v in call.trailing_metadata() if k == REPLY_AUTH_HEADER]


def test_replies_are_signed_for_this_request_response_and_node(agent: NodeAgentServer, key: Path) -> None:
    """Every successful reply carries one credential in its trailing metadata: root's (the key's owner), for
    that method's reply, that response, node-a and that very request; it is never a request credential."""
    auth = SharedKeyAuthenticator(key)
    with grpc.insecure_channel(agent.address) as ch:
        stub = pbg.NodeAgentStub(ch)
        for name, req in [("Health", pb.HealthRequest()), ("ReportProgress", _report(pid=0)),
                          ("JobStats", pb.JobStatsRequest())]:
            header, resp, (tok,) = _raw_call(stub, auth, name, req)
            body = resp.SerializeToString(deterministic=True)
            with pytest.raises(AuthError, match="another request"):
                auth.verify_reply(SERVICE + name, header + "x", body, tok, node=NODE)
            with pytest.raises(AuthError, match="issued for node 'node-a', not 'node-b'"):
                auth.verify_reply(SERVICE + name, header, body, tok, node="node-b")
            with pytest.raises(AuthError, match="response body"):
                auth.verify_reply(SERVICE + name, header, body + b"\x08\x01", tok, node=NODE)
            with pytest.raises(AuthError, match="issued for"):  # a reply token is no request credential
                auth.verify(SERVICE + name, body, tok, node=NODE)
            ident = auth.verify_reply(SERVICE + name, header, body, tok, node=NODE)
            assert ident.uid == key.stat().st_uid and auth.is_agent_identity(ident) == (ident.uid == 0)
            with pytest.raises(AuthError, match="replayed"):
                auth.verify_reply(SERVICE + name, header, body, tok, node=NODE)
        assert _raw_call(stub, auth, "JobStats", pb.JobStatsRequest())[1].jobs[0].job_key == "job-1"
        # refusals are not signed: an agent signs nothing for a caller it could not authenticate
        with pytest.raises(grpc.RpcError) as e:
            stub.JobStats.with_call(pb.JobStatsRequest(), timeout=5, metadata=((AUTH_HEADER, "hmac-sha256 Zm9v.00"),))
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert not [v for k, v in e.value.trailing_metadata() or () if k == REPLY_AUTH_HEADER]


def _other_key(tmp_path: Path) -> SharedKeyAuthenticator:
    return SharedKeyAuthenticator(SharedKeyAuthenticator.generate(tmp_path / "other.key"))


@pytest.mark.parametrize("how", ["no trailer", "garbage", "other key", "uid 1001", "request echoed",
                                 "other node", "two trailers"])
def test_client_refuses_replies_not_from_the_nodes_agent(key: Path, tmp_path: Path, how: str) -> None:
    """A plain gRPC server on the agent's port (the agent down) answers everything -- a bogus job key and
    progress, Preempt ok=True with a checkpoint that does not exist -- but cannot sign as node-a's agent:
    every call is refused with UNAUTHENTICATED_REPLY, whether its reply carries no credential, garbage, one
    made with another key, one signed properly by uid 1001 (a user the client even lets call Preempt, i.e.
    an --allow-uid caller: still not an agent), the request's own credential sent back, one made for
    another node, or two credentials."""
    trailer = {
        "no trailer": None,
        "garbage": lambda m, h, r: "hmac-sha256 Zm9v.deadbeef",
        "other key": signed_by(_other_key(tmp_path)),
        "uid 1001": signed_by(UidAuth(key, 1001)),
        "request echoed": lambda m, h, r: h,
        "other node": signed_by(UidAuth(key, 0), node="node-b"),
        # a genuine credential and another one: which is the agent's? refused, not "the first one wins"
        "two trailers": lambda m, h, r: (signed_by(UidAuth(key, 0))(m, h, r), "hmac-sha256 Zm9v.deadbeef"),
    }[how]
    auth = UidAuth(key, 0)
    auth.allowed_uids.add(1001)
    with fake_agent(trailer) as (addr, fake), AgentClient(addr, auth, timeout=5, node=NODE) as c:
        for call in (c.health, c.job_stats, lambda: c.preempt("bogus-key", "7", timeout_s=5),
                     lambda: c.report_progress(_report(pid=0))):
            with pytest.raises(AgentError) as e:
                call()
            assert e.value.code == UNAUTHENTICATED_REPLY
            assert f"reply from {addr} is not from the agent of node node-a" in e.value.details
        assert fake.calls == ["Health", "JobStats", "Preempt", "ReportProgress"], "it did answer"
    if how == "uid 1001":
        assert "signed by uid 1001, which is neither root nor the SlurmUser" in e.value.details
    # the same fake signing as root (what only the real agent can) is taken: the refusals above are the check's
    with fake_agent(signed_by(UidAuth(key, 0))) as (addr, fake), AgentClient(addr, auth, timeout=5, node=NODE) as c:
        assert c.job_stats()[0]["job_key"] == "bogus-key" and c.preempt("bogus-key", "7", timeout_s=5)["ok"]


def test_client_learning_the_node_refuses_a_health_reply_signed_for_another(key: Path) -> None:
    """Without ``node``, the client takes the node name from Health, whose reply must be signed for it."""
    with fake_agent(signed_by(UidAuth(key, 0), node="node-b")) as (addr, _), \
            AgentClient(addr, UidAuth(key, 0), timeout=5) as c:
        with pytest.raises(AgentError) as e:
            c.job_stats()
        assert e.value.code == UNAUTHENTICATED_REPLY and "node 'node-b', not 'node-a'" in e.value.details
        assert c.node is None


def test_captured_reply_cannot_answer_another_request(agent: NodeAgentServer, key: Path) -> None:
    """A genuine reply of node-a's agent (credential and response, captured off the wire), replayed by whatever
    answers the next call on that port, is refused: it was signed for another request."""
    with grpc.insecure_channel(agent.address) as ch:
        _, resp, (tok,) = _raw_call(pbg.NodeAgentStub(ch), SharedKeyAuthenticator(key), "JobStats",
                                    pb.JobStatsRequest())
    with fake_agent(lambda m, h, r: tok, replies={"JobStats": resp}) as (addr, fake), \
            AgentClient(addr, SharedKeyAuthenticator(key), timeout=5, node=NODE) as c:
        with pytest.raises(AgentError) as e:
            c.job_stats()
        assert e.value.code == UNAUTHENTICATED_REPLY and "issued for another request" in e.value.details
        assert fake.calls == ["JobStats"]


def test_unprivileged_key_owner_cannot_preempt(agent: NodeAgentServer, client: AgentClient, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to chown the key to nobody")
    client.report_progress(_report(job_key="roots-job", pid=0))  # owned by uid 0
    k = SharedKeyAuthenticator.generate(tmp_path / "user.key")
    os.chown(k, 65534, 65534)
    agent.servicer.auth = SharedKeyAuthenticator(k)  # now every verified caller is uid 65534
    agent.servicer.slurm = SlurmJobs(FakeSlurm({"101": 65534}), require_cgroup=False)  # Slurm job 101 is nobody's
    # the agent now signs its replies as uid 65534 too: this client takes that uid's replies as the agent's
    with AgentClient(agent.address, SharedKeyAuthenticator(k, agent_uids={65534})) as c:
        c.report_progress(_report(pid=0))  # reporting on its own job is allowed
        with pytest.raises(AgentError) as e:
            c.report_progress(_report(job_key="roots-job", pid=0))
        assert e.value.code == "PERMISSION_DENIED" and "belongs to uid 0" in e.value.details
        with pytest.raises(AgentError) as e:
            c.preempt("job-1", "101", timeout_s=1)
        assert e.value.code == "PERMISSION_DENIED"


def test_malformed_and_unknown_requests(agent: NodeAgentServer, client: AgentClient) -> None:
    for bad, match in [
        (dict(job_key="../etc"), "invalid job key"),
        (dict(job_key=""), "invalid job key"),
        (dict(slurm_job_id=""), "slurm_job_id"),
        (dict(slurm_job_id="1; rm -rf"), "slurm_job_id"),
        (dict(step=-1), "step"),
        (dict(step=200), "exceeds total_steps"),
        (dict(elapsed_s=float("nan")), "elapsed_s"),
        (dict(comm_fraction=1.5), "comm_fraction"),
        (dict(rank=3, world_size=2), "rank"),
        (dict(state="exploded"), "state"),
        (dict(pid=2**31 - 1), "not a running process"),
    ]:
        with pytest.raises(AgentError) as e:
            client.report_progress(_report(**bad))
        assert e.value.code == "INVALID_ARGUMENT", bad
        assert match in e.value.details, (bad, e.value.details)
    with pytest.raises(AgentError) as e:
        client.preempt("no-such-job", "5", timeout_s=1)
    assert e.value.code == "NOT_FOUND" and "no-such-job" in e.value.details
    with pytest.raises(AgentError) as e:
        client.preempt("bad key!", "5", timeout_s=1)
    assert e.value.code == "INVALID_ARGUMENT"
    with pytest.raises(AgentError) as e:
        client.preempt("job-x", "5", timeout_s=1e9)
    assert e.value.code == "INVALID_ARGUMENT"
    with pytest.raises(AgentError) as e:
        client.job_stats("no-such-job")
    assert e.value.code == "NOT_FOUND"
    client.report_progress(_report(pid=0))
    with pytest.raises(AgentError) as e:
        client.preempt("job-1", "999", timeout_s=1)
    assert e.value.code == "NOT_FOUND" and "slurm job 101" in e.value.details
    # undecodable bytes on the wire
    ch = grpc.insecure_channel(agent.address)
    raw = ch.unary_unary("/rlsched.agent.v1.NodeAgent/ReportProgress")
    with pytest.raises(grpc.RpcError) as r:
        raw(b"\xff\xff\xff\xff garbage", timeout=5)
    assert r.value.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNKNOWN)
    with pytest.raises(grpc.RpcError) as r:
        ch.unary_unary("/rlsched.agent.v1.NodeAgent/NoSuchMethod")(b"", timeout=5)
    assert r.value.code() == grpc.StatusCode.UNIMPLEMENTED
    ch.close()
    assert client.health()["node"] == "node-a", "server must survive malformed input"


def test_pid_of_another_slurm_job_cannot_be_registered(client: AgentClient) -> None:
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                         env={**os.environ, "SLURM_JOB_ID": "555"})
    try:
        with pytest.raises(AgentError) as e:
            client.report_progress(_report(pid=p.pid, slurm_job_id="101"))
        assert e.value.code == "PERMISSION_DENIED" and "slurm job 555" in e.value.details
        client.report_progress(_report(pid=p.pid, slurm_job_id="555"))
    finally:
        p.kill()
        p.wait()


# ------------------------------------------------------------ JobTracker / CS


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _feed(tr: JobTracker, clock: _Clock, key: str, steps: range, per_step_s: float, bs: int, pid: int,
          t_offset: float = 0.0, **kw: object) -> None:
    for s in steps:
        clock.t = 1000.0 + t_offset + s * per_step_s
        tr.report(_report(job_key=key, step=s, total_steps=1000, samples=s * bs, elapsed_s=s * per_step_s + 0.5,
                          pid=pid, **kw))


def test_cs_from_profiled_alone_window() -> None:
    clock = _Clock()
    tr = JobTracker(window_s=5.0, profile_steps=20, profile_skip_steps=5, clock=clock)
    # alone: 100 samples/s (bs 10, 0.1 s/step) during the profiling window
    _feed(tr, clock, "a", range(0, 40, 5), 0.1, 10, pid=0)
    rec = tr.jobs["a"]
    assert tr.isolated(rec) == (pytest.approx(100.0), "profiled-alone")
    # then contention halves its throughput (0.2 s/step), measured over the 5 s window
    for s in range(40, 200, 5):
        clock.t = 1000.0 + 4.0 + (s - 40) * 0.2
        tr.report(_report(job_key="a", step=s, total_steps=1000, samples=s * 10,
                          elapsed_s=4.5 + (s - 40) * 0.2, pid=0))
    st = tr.stat(rec)
    assert st.samples_per_s == pytest.approx(50.0)
    assert st.cs == pytest.approx(2.0)
    assert st.isolated_source == "profiled-alone"


def test_profiling_window_contaminated_by_other_job_falls_back_to_reference() -> None:
    clock = _Clock()
    tr = JobTracker(window_s=5.0, profile_steps=20, profile_skip_steps=0, stale_s=60, clock=clock)
    _feed(tr, clock, "other", range(0, 10, 5), 0.1, 10, pid=0)  # another job is active on the node
    _feed(tr, clock, "b", range(0, 60, 5), 0.1, 10, pid=0, reference_samples_per_s=150.0)
    st = tr.stat(tr.jobs["b"])
    assert st.isolated_source == "reference" and st.isolated_samples_per_s == 150.0
    assert st.cs == pytest.approx(1.5)
    # without reference and without an alone window CS is unknown (0 on the wire, None in the client)
    _feed(tr, clock, "c", range(0, 60, 5), 0.1, 10, pid=0)
    assert tr.stat(tr.jobs["c"]).cs == 0.0


def test_jobtracker_reaps_dead_processes() -> None:
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    clock = _Clock()
    tr = JobTracker(keep_ended_s=10, clock=clock)
    tr.report(_report(job_key="d", pid=p.pid))
    tr.reap()
    assert tr.jobs["d"].state == "running" and tr.running_count() == 1
    p.kill()
    p.wait()
    clock.t += 5
    tr.reap()
    assert tr.jobs["d"].state == "exited" and tr.running_count() == 0
    clock.t += 60
    tr.reap()
    assert "d" not in tr.jobs


# ----------------------------------------------------------- preemption flows


def test_preempt_times_out_when_job_ignores_signal(client: AgentClient) -> None:
    p = _ignoring_sigusr2()
    try:
        client.report_progress(_report(job_key="stubborn", pid=p.pid))
        r = client.preempt("stubborn", "101", timeout_s=1.0)
        assert r["ok"] is False and "timed out" in r["message"] and r["checkpoint_step"] is None
        assert p.poll() is None
    finally:
        p.kill()
        p.wait()


def test_preempt_reports_exit_without_checkpoint(client: AgentClient) -> None:
    p = subprocess.Popen([sys.executable, "-c", "print('ready', flush=True); import time; time.sleep(60)"],
                         stdout=subprocess.PIPE, env={**os.environ, "SLURM_JOB_ID": "101"})  # SIGUSR2 terminates
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == b"ready"
        client.report_progress(_report(job_key="crashy", pid=p.pid))
        r = client.preempt("crashy", "101", timeout_s=10.0)
        assert r["ok"] is False and r["process_exited"] and "without writing" in r["message"]
        assert p.wait(timeout=10) == -signal.SIGUSR2
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def _job_env(agent: NodeAgentServer, key: Path, store: Path, job_key: str, slurm_id: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RLSCHED_"))}
    env.update(RLSCHED_AGENT=agent.address, RLSCHED_AUTH=f"sharedkey:{key}", RLSCHED_STORE=str(store),
               RLSCHED_JOB_KEY=job_key, SLURM_JOB_ID=slurm_id, PYTHONPATH=str(REPO))
    return env


def _last_json(out: str, event: str) -> dict:
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return [x for x in lines if x.get("event") == event][-1]


def _wait_step(client: AgentClient, job_key: str, min_step: int, proc: subprocess.Popen, limit_s: float = 90) -> dict:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, "training job exited before it could be preempted"
        try:
            (st,) = client.job_stats(job_key)
            if st["step"] >= min_step:
                return st
        except AgentError as exc:
            assert exc.code == "NOT_FOUND"
        time.sleep(0.1)
    raise AssertionError(f"job {job_key} never reached step {min_step}")


@pytest.mark.parametrize("script,total,extra,model", [
    (MLP, 300, ["--hidden", "64"], "MLP"),
    pytest.param(LM, 120, ["--model-name", "MoE"], "MoE", marks=pytest.mark.slow),
], ids=["mlp", "tiny-lm"])
def test_preempt_round_trip_resumes_and_finishes_exact_steps(
    agent: NodeAgentServer, client: AgentClient, key: Path, tmp_path: Path, script: Path, total: int,
    extra: list[str], model: str,
) -> None:
    store = tmp_path / "store"
    args = [sys.executable, str(script), "--total-steps", str(total), "--report-every", "5", *extra]
    env = _job_env(agent, key, store, "mlp-rt", "4242")

    # reference: the same job, uninterrupted, under another key
    ref = subprocess.run(args, env=_job_env(agent, key, store, "mlp-ref", "4243"), capture_output=True,
                         text=True, timeout=180)
    assert ref.returncode == 0, ref.stderr[-2000:]
    ref_done = _last_json(ref.stdout, "done")
    assert ref_done["final_step"] == total and ref_done["steps_this_run"] == total

    p1 = subprocess.Popen(args + ["--step-sleep", "0.02"], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    try:
        st = _wait_step(client, "mlp-rt", 40, p1)
        assert st["slurm_job_id"] == "4242" and st["model"] == model and st["pids"] == [p1.pid]
        assert st["samples_per_s"] > 0
        r = client.preempt("mlp-rt", "4242", timeout_s=60)
        out1, err1 = p1.communicate(timeout=60)
    finally:
        if p1.poll() is None:
            p1.kill()
            p1.wait()
    assert r["ok"], r
    assert p1.returncode == EXIT_PREEMPTED, err1[-2000:]
    assert r["process_exited"] is True
    ck = r["checkpoint_step"]
    assert st["step"] <= ck < total
    assert r["checkpoint_uri"].endswith(f"ckpt-{ck:012d}.bin")
    s = LocalFSStore(store)
    latest = s.latest("mlp-rt")
    assert latest is not None and latest.step == ck and s.verify(latest)
    (after,) = client.job_stats("mlp-rt", include_finished=True)
    assert after["state"] == "preempted" and after["last_checkpoint_step"] == ck
    assert "done" not in out1

    p2 = subprocess.run(args, env=env, capture_output=True, text=True, timeout=180)
    assert p2.returncode == 0, p2.stderr[-2000:]
    start = _last_json(p2.stdout, "start")
    done = _last_json(p2.stdout, "done")
    assert start["start_step"] == ck
    assert done["final_step"] == total
    assert ck + done["steps_this_run"] == total, "preempted + resumed runs must add up to exactly total steps"
    assert done["params_sha256"] == ref_done["params_sha256"], "resume must reproduce the uninterrupted run"
    assert s.latest("mlp-rt").step == total  # type: ignore[union-attr]
    (fin,) = client.job_stats("mlp-rt", include_finished=True)
    assert fin["state"] == "finished" and fin["step"] == total
    assert client.health()["node"] == "node-a"


@pytest.mark.slow
def test_preempt_distributed_two_ranks(agent: NodeAgentServer, client: AgentClient, key: Path,
                                       tmp_path: Path) -> None:
    """Two gloo ranks (srun-style env): signalling both stops them at the same step; rank 0 saves once."""
    total = 400
    store = tmp_path / "store"
    procs = []
    import socket

    with socket.socket() as sk:  # a free port for the gloo rendezvous
        sk.bind(("127.0.0.1", 0))
        port = str(sk.getsockname()[1])
    for rank in range(2):
        env = _job_env(agent, key, store, "ddp-rt", "5151")
        env.update(SLURM_NTASKS="2", SLURM_PROCID=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        procs.append(subprocess.Popen(
            [sys.executable, str(MLP), "--total-steps", str(total), "--hidden", "64", "--step-sleep", "0.02"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        deadline = time.monotonic() + 120
        while True:
            stats = client.job_stats("ddp-rt") if any(j["job_key"] == "ddp-rt" for j in client.job_stats()) else []
            if stats and len(stats[0]["pids"]) == 2 and stats[0]["step"] >= 40:
                break
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "ranks did not start"
            time.sleep(0.1)
        assert stats[0]["world_size"] == 2
        assert stats[0]["comm_fraction"] is not None and stats[0]["comm_fraction"] > 0, stats
        r = client.preempt("ddp-rt", "5151", timeout_s=60)
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert r["ok"], r
    assert [p.returncode for p in procs] == [EXIT_PREEMPTED, EXIT_PREEMPTED], [o[1][-1500:] for o in outs]
    assert [i.step for i in LocalFSStore(store).list("ddp-rt")] == [r["checkpoint_step"]]


def test_agent_cli_serves_and_stops_on_sigterm(tmp_path: Path, key: Path) -> None:
    """`rlsched agent` as a real process: JSON logs, Health over gRPC, clean exit on SIGTERM."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.Popen([sys.executable, "-m", "rlsched.cli", "agent", "--node", "cli-node",
                          "--listen", f"127.0.0.1:{port}", "--store", str(tmp_path / "st"),
                          "--auth", f"sharedkey:{key}"],
                         stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        with AgentClient(f"127.0.0.1:{port}", SharedKeyAuthenticator(key), timeout=2) as c:
            deadline = time.monotonic() + 60
            while True:
                try:
                    assert c.health()["node"] == "cli-node"
                    break
                except AgentError:
                    assert p.poll() is None and time.monotonic() < deadline, "agent did not come up"
                    time.sleep(0.2)
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=30)
        assert p.returncode == 0, err
        events = [json.loads(line)["msg"]["event"] for line in err.splitlines() if line.startswith('{"ts"')]
        assert events[0] == "agent_started" and events[-1] == "agent_stopped"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_agent_cli_bad_key_is_one_line_error(tmp_path: Path) -> None:
    loose = tmp_path / "k"
    loose.write_text("x" * 40)
    loose.chmod(0o644)
    r = subprocess.run([sys.executable, "-m", "rlsched.cli", "agent", "--node", "n", "--store", str(tmp_path),
                        "--auth", f"sharedkey:{loose}"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].startswith("rlsched agent: error: cannot start agent:")
    assert "chmod 600" in r.stderr


@pytest.mark.parametrize("extra,needle", [
    (["--auth", "bogus"], "rlsched agent: error: cannot start agent: unknown auth spec 'bogus'"),
    (["--max-workers", "0"], "--max-workers: must be an integer >= 1, got '0'"),
    (["--window-s", "nan"], "--window-s: must be a positive number, got 'nan'"),
    (["--profile-steps", "-5"], "--profile-steps: must be an integer >= 1, got '-5'"),
    (["--profile-skip-steps", "x"], "--profile-skip-steps: expected an integer, got 'x'"),
])
def test_agent_cli_bad_options_are_one_line_errors(tmp_path: Path, extra: list[str], needle: str) -> None:
    r = subprocess.run([sys.executable, "-m", "rlsched.cli", "agent", "--node", "n", "--store", str(tmp_path),
                        *extra], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert needle in r.stderr.strip().splitlines()[-1], r.stderr


def test_preempt_right_after_resume_accepts_existing_checkpoint(
    agent: NodeAgentServer, client: AgentClient, key: Path, tmp_path: Path
) -> None:
    """A job resumed at its checkpoint and preempted before its next step writes nothing new: still ok."""
    store = LocalFSStore(tmp_path / "store")
    import io

    import torch

    buf = io.BytesIO()
    torch.save({"w": torch.zeros(2)}, buf)
    store.save("resumed", 50, buf.getvalue())
    script = (
        "import os, sys, time\n"
        "from nodeagent.jobhelper import JobSession\n"
        "with JobSession.from_env(total_steps=100) as s:\n"
        "    start, state = s.resume()\n"
        "    s.report(start, 0)\n"
        "    print('ready', start, flush=True)\n"
        "    while not s.should_stop():\n"
        "        time.sleep(0.01)\n"
        "    for _ in s.steps(start, state_fn=lambda: state, samples_per_step=1):\n"
        "        raise AssertionError('no step may run after the stop request')\n"
    )
    p = subprocess.Popen([sys.executable, "-c", script], env=_job_env(agent, key, tmp_path / "store", "resumed", "77"),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().split() == ["ready", "50"]
        deadline = time.monotonic() + 30
        while not any(j["job_key"] == "resumed" and j["pids"] for j in client.job_stats()):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        r = client.preempt("resumed", "77", timeout_s=30)
        _, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == EXIT_PREEMPTED, err[-1500:]
    assert r["ok"] and r["checkpoint_step"] == 50 and r["process_exited"], r


# ----------------------------------------------------------- runs, restarts and late reports


def _sleeper(**env: str) -> subprocess.Popen:
    """A process that dies of SIGUSR2 (default action), so a test can tell whether it was signalled; part of
    Slurm job 101 by its environment unless ``env`` says otherwise."""
    # env resets SIGUSR2 and execs sleep (same pid). No preexec_fn: Python code in a child forked
    # while the in-process gRPC server's threads run can crash it before exec (seen under load:
    # the "sleeper" was a zombie by the time the test registered it)
    return subprocess.Popen(["env", "--default-signal=USR2", "sleep", "300"],
                            env={"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "101", **env})


def _stop(*procs: subprocess.Popen) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def test_new_run_resets_step_to_the_resumed_step() -> None:
    """Within a run the step only grows; a new run (restart/requeue from an older checkpoint) sets it."""
    clock = _Clock()
    tr = JobTracker(clock=clock)
    a, b = _sleeper(), _sleeper()
    try:
        tr.report(_report(job_key="r", step=250, total_steps=1000, samples=2000, elapsed_s=5.0, pid=a.pid))
        tr.report(_report(job_key="r", step=240, total_steps=1000, samples=2000, elapsed_s=5.0, pid=a.pid))
        assert tr.jobs["r"].step == 250, "an overtaken report of the same run does not lower the step"
        _stop(a)
        clock.t += 5
        tr.reap()
        assert tr.jobs["r"].state == "exited"
        tr.report(_report(job_key="r", step=200, total_steps=1000, samples=0, elapsed_s=0.1, pid=b.pid))
        assert (tr.jobs["r"].step, tr.jobs["r"].state) == (200, "running")
        tr.report(_report(job_key="r", step=210, total_steps=1000, samples=80, elapsed_s=0.5, pid=b.pid))
        assert tr.jobs["r"].step == 210
    finally:
        _stop(a, b)
    # reports without a pid: the job's clock going backwards is a new run
    tr.report(_report(job_key="np", step=300, samples=900, elapsed_s=9.0, pid=0, total_steps=1000))
    tr.report(_report(job_key="np", step=120, samples=10, elapsed_s=0.2, pid=0, total_steps=1000))
    assert tr.jobs["np"].step == 120


def test_late_report_of_a_known_rank_does_not_revive_an_ended_job() -> None:
    tr = JobTracker()
    r0, r1, r2 = _sleeper(), _sleeper(), _sleeper()
    try:
        for pid, rank in ((r0.pid, 0), (r1.pid, 1)):
            tr.report(_report(job_key="l", step=10, pid=pid, rank=rank, world_size=2))
        tr.report(_report(job_key="l", step=12, pid=r0.pid, rank=0, world_size=2, state="preempted", final=True))
        assert tr.jobs["l"].state == "preempted"
        tr.report(_report(job_key="l", step=12, pid=r1.pid, rank=1, world_size=2))  # queued before its final one
        assert tr.jobs["l"].state == "preempted", "a late report of a rank of the ended run"
        tr.report(_report(job_key="l", step=12, pid=r1.pid, rank=1, world_size=2, state="preempted", final=True))
        tr.report(_report(job_key="l", step=12, pid=r2.pid, rank=0, world_size=2))  # a new process: resumed
        assert tr.jobs["l"].state == "running"
        tr.report(_report(job_key="l", step=20, pid=r2.pid, rank=0, world_size=2, state="finished", final=True))
        tr.report(_report(job_key="l", step=20, pid=r1.pid, rank=1, world_size=2))  # r1 already sent its final
        assert tr.jobs["l"].state == "finished"
    finally:
        _stop(r0, r1, r2)


_JOB = """
import sys, time
import torch
from nodeagent.jobhelper import JobSession
total, sleep, every, post = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
with JobSession.from_env(model="MLP", total_steps=total, report_every=1, min_report_interval_s=0.0,
                         ckpt_every=every, profile_steps=0) as s:
    start, state = s.resume()
    print("start", start, flush=True)
    w = state["w"] if state else torch.zeros(1)
    for step in s.steps(start, state_fn=lambda: {"w": w.clone()}, samples_per_step=8):
        w += 1
        time.sleep(sleep)
print("trained", flush=True)
time.sleep(post)  # post-processing (evaluation, export)
print("post done", flush=True)
"""


def _job(env: dict[str, str], total: int, sleep: float, every: int, post: float = 0.0) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _JOB, str(total), str(sleep), str(every), str(post)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _until(pred: object, limit_s: float = 60.0, what: str = "condition") -> object:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        v = pred()  # type: ignore[operator]
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_preempt_after_restart_from_an_older_checkpoint(agent: NodeAgentServer, client: AgentClient, key: Path,
                                                       tmp_path: Path) -> None:
    """Run 1 checkpoints every 50 steps and dies at ~step 120; run 2 resumes at 100. Preempting run 2 must
    wait for a checkpoint at run 2's step, not at the step run 1 had reached."""
    env = _job_env(agent, key, tmp_path / "store", "rs", "606")
    p1 = _job(env, 1000, 0.005, 50)
    p2 = None
    try:
        _until(lambda: [s for s in client.job_stats() if s["step"] >= 120], what="run 1 at step 120")
        p1.kill()
        p1.wait()
        store = LocalFSStore(tmp_path / "store")
        assert store.latest("rs").step < 120  # type: ignore[union-attr]
        p2 = _job(env, 1000, 0.05, 0)
        _until(lambda: [s for s in client.job_stats() if s["pids"] == [p2.pid]], what="run 2 to register")
        (st,) = client.job_stats("rs")
        resumed = int(p2.stdout.readline().split()[1])  # type: ignore[union-attr]
        assert resumed == store.latest("rs").step and st["step"] < 120, st  # type: ignore[union-attr]
        r = client.preempt("rs", "606", timeout_s=30)
        out, err = p2.communicate(timeout=30)
    finally:
        _stop(p1, *([p2] if p2 else []))
    assert r["ok"] and r["process_exited"], r
    assert p2.returncode == EXIT_PREEMPTED, err[-1500:]
    assert resumed <= r["checkpoint_step"] < 120


def test_finished_job_doing_post_processing_is_not_signalled(agent: NodeAgentServer, client: AgentClient, key: Path,
                                                             tmp_path: Path) -> None:
    p = _job(_job_env(agent, key, tmp_path / "store", "post", "301"), 30, 0.005, 0, post=3.0)
    try:
        _until(lambda: [s for s in client.job_stats(include_finished=True) if s["state"] == "finished"],
               what="the job to finish training")
        r = client.preempt("post", "301", timeout_s=10)
        out, err = p.communicate(timeout=30)
    finally:
        _stop(p)
    assert r["ok"] is False and r["process_exited"] is False and "finished training" in r["message"], r
    assert r["checkpoint_step"] == 30
    assert p.returncode == 0 and "post done" in out, (out, err[-1500:])
    assert client.job_stats("post", include_finished=True)[0]["state"] == "finished"


# -------------------------------------------------- who may report on a job key (Slurm is asked)


@pytest.fixture
def users(tmp_path: Path, key: Path) -> Iterator[tuple[NodeAgentServer, FakeSlurm, ClientFor]]:
    """An agent whose callers can be any uid, with a fake slurmctld; yields (server, slurm, client(uid))."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run processes as other users")
    slurm = FakeSlurm()
    with uid_agent(tmp_path, key, SlurmJobs(slurm, require_cgroup=False, failure_ttl_s=0.0),
                   reap_interval_s=0.2) as (srv, client):
        yield srv, slurm, client


def _user_proc(uid: int, sid: str) -> subprocess.Popen:
    """A process of ``uid`` whose environment says it is part of Slurm job ``sid`` (anyone can say so)."""
    # user/group/extra_groups are applied by the C fork helper: no Python code runs in the child
    return subprocess.Popen(["env", "--default-signal=USR2", "sleep", "300"], env={"SLURM_JOB_ID": sid, "PATH": "/usr/bin:/bin"},
                            user=uid, group=uid, extra_groups=[])


def test_job_key_squatting_is_refused(users: tuple) -> None:
    srv, slurm, client = users
    slurm.jobs.update({"101": 33, "303": 65534})
    victim, squat, squat303 = _user_proc(33, "101"), _user_proc(65534, "101"), _user_proc(65534, "303")
    try:
        # nobody sets SLURM_JOB_ID=101 itself and reports first: Slurm says job 101 is uid 33's
        with pytest.raises(AgentError) as e:
            client(65534).report_progress(_report(job_key="slurm-101", slurm_job_id="101", pid=squat.pid))
        assert e.value.code == "PERMISSION_DENIED" and "slurm job 101 belongs to uid 33, not 65534" in e.value.details
        # nobody's own job 303 claims job 101's default key
        with pytest.raises(AgentError) as e:
            client(65534).report_progress(_report(job_key="slurm-101", slurm_job_id="303", pid=squat303.pid))
        assert e.value.code == "PERMISSION_DENIED" and "default key of slurm job 101" in e.value.details
        assert srv.tracker.jobs == {}
        # the real job registers; nobody can neither report on it nor register a process into it
        client(33).report_progress(_report(job_key="slurm-101", slurm_job_id="101", pid=victim.pid))
        with pytest.raises(AgentError) as e:
            client(65534).report_progress(_report(job_key="slurm-101", slurm_job_id="101", pid=0))
        assert e.value.code == "PERMISSION_DENIED" and "belongs to uid 33" in e.value.details
        with pytest.raises(AgentError) as e:  # uid 33 registering nobody's process
            client(33).report_progress(_report(job_key="slurm-101", slurm_job_id="101", pid=squat.pid))
        assert e.value.code == "PERMISSION_DENIED" and "owned by uid 65534" in e.value.details
        (st,) = client(0).job_stats()
        assert st["pids"] == [victim.pid] and st["slurm_job_id"] == "101"
        r = client(0).preempt("slurm-101", "101", timeout_s=5)
        assert r["process_exited"] and victim.wait(timeout=10) == -signal.SIGUSR2
        assert squat.poll() is None and squat303.poll() is None, "only the real job's process is signalled"
    finally:
        _stop(victim, squat, squat303)


def test_default_key_of_a_job_not_yet_submitted_is_refused(users: tuple) -> None:
    """Job ids are sequential: a user cannot take ``slurm-N`` of a job N that has yet to be submitted (it would
    keep the key, its profile and its checkpoints from job N's owner); a purged earlier job's key stays usable."""
    srv, slurm, client = users
    slurm.jobs.update({"600": 65534})
    squat = _user_proc(65534, "600")
    victim = None
    try:
        for n in (601, 605, 10_000):
            with pytest.raises(AgentError) as e:
                client(65534).report_progress(_report(job_key=f"slurm-{n}", slurm_job_id="600", pid=squat.pid))
            assert e.value.code == "PERMISSION_DENIED" and f"slurm job {n}, which has not been submitted yet" \
                in e.value.details, e.value.details
        with pytest.raises(AgentError) as e:  # an array task's key: its array's id counts
            client(65534).report_progress(_report(job_key="slurm-700_3", slurm_job_id="600", pid=squat.pid))
        assert e.value.code == "PERMISSION_DENIED" and "not been submitted yet" in e.value.details
        assert srv.tracker.jobs == {}
        # job 601 (another user's) starts and registers its default key
        slurm.jobs["601"] = 33
        victim = _user_proc(33, "601")
        client(33).report_progress(_report(job_key="slurm-601", slurm_job_id="601", pid=victim.pid))
        assert srv.tracker.jobs["slurm-601"].owner_uid == 33
        # the key of an earlier job Slurm has forgotten (a chain of jobs resuming one checkpoint) still works
        client(65534).report_progress(_report(job_key="slurm-42", slurm_job_id="600", pid=squat.pid))
        assert srv.tracker.jobs["slurm-42"].owner_uid == 65534
    finally:
        _stop(squat, *(p for p in (victim,) if p is not None))


def test_preempt_ignores_checkpoints_another_user_planted_under_the_jobs_key(users: tuple) -> None:
    """In a shared store anyone may create the job's directory first: its files are not the job's checkpoint."""
    srv, slurm, client = users
    slurm.jobs.update({"101": 33})
    store_root = Path(srv.servicer.store.url)
    LocalFSStore(store_root, owner_uid=None).save("slurm-101", 999_999, b"planted")
    for p in (store_root / "slurm-101", *(store_root / "slurm-101").iterdir()):
        os.chown(p, 65534, 65534)
    victim = _user_proc(33, "101")
    try:
        client(33).report_progress(_report(job_key="slurm-101", slurm_job_id="101", pid=victim.pid))
        r = client(0).preempt("slurm-101", "101", timeout_s=5)
        assert victim.wait(timeout=10) == -signal.SIGUSR2  # it exits without writing a checkpoint
        assert r["ok"] is False and r["checkpoint_step"] is None and r["checkpoint_uri"] == "", r
        assert r["message"].startswith("process exited without writing a new checkpoint"), r
    finally:
        _stop(victim)


def test_ended_jobs_key_stays_its_owners_until_slurm_forgets_the_job(users: tuple) -> None:
    srv, slurm, client = users
    slurm.jobs.update({"101": 33, "303": 65534, "404": 33})
    victim, squat = _user_proc(33, "101"), _user_proc(65534, "303")
    try:
        client(33).report_progress(_report(job_key="moe-7", slurm_job_id="101", pid=victim.pid))
        client(33).report_progress(_report(job_key="moe-7", slurm_job_id="101", pid=victim.pid, state="preempted",
                                           final=True))
        slurm.jobs["101"] = (33, "SPECIAL_EXIT")  # requeued held (exit 75): it runs again later

        def squat_report() -> AgentError:
            with pytest.raises(AgentError) as e:
                client(65534).report_progress(_report(job_key="moe-7", slurm_job_id="303", pid=squat.pid))
            return e.value

        err = squat_report()
        assert err.code == "PERMISSION_DENIED" and "belongs to slurm job 101 of uid 33" in err.details
        srv.tracker.keep_ended_s = 0.0  # the record is forgotten; its key's owner is not
        _until(lambda: "moe-7" not in srv.tracker.jobs, 10, "the record to be forgotten")
        assert srv.tracker.key_owners["moe-7"].owner_uid == 33
        assert squat_report().code == "PERMISSION_DENIED"
        slurm.down = True  # cannot tell whether job 101 is gone: refuse
        err = squat_report()
        assert err.code == "UNAVAILABLE" and "cannot verify slurm job 101" in err.details
        slurm.down = False
        slurm.jobs["101"] = (33, "COMPLETED")
        client(65534).report_progress(_report(job_key="moe-7", slurm_job_id="303", pid=squat.pid))
        (st,) = client(0).job_stats("moe-7")
        assert st["slurm_job_id"] == "303" and st["pids"] == [squat.pid]
        assert srv.tracker.jobs["moe-7"].owner_uid == 65534 and "moe-7" not in srv.tracker.key_owners
    finally:
        _stop(victim, squat)


def test_unreachable_slurm_refuses_unverifiable_reports(users: tuple) -> None:
    """Fail closed: a report that cannot be verified is refused; a job verified earlier keeps reporting."""
    srv, slurm, client = users
    slurm.jobs.update({"101": 33, "202": 33})
    a, b = _user_proc(33, "101"), _user_proc(33, "202")
    try:
        client(33).report_progress(_report(job_key="ok-job", slurm_job_id="101", pid=a.pid))
        slurm.down = True
        asked = len(slurm.calls)
        client(33).report_progress(_report(job_key="ok-job", slurm_job_id="101", pid=a.pid, step=20))
        assert len(slurm.calls) == asked and srv.tracker.jobs["ok-job"].step == 20, "no need to ask again"
        with pytest.raises(AgentError) as e:
            client(33).report_progress(_report(job_key="new-job", slurm_job_id="202", pid=b.pid))
        assert e.value.code == "UNAVAILABLE" and "Unable to contact slurm controller" in e.value.details
        assert "new-job" not in srv.tracker.jobs
        slurm.down = False
        client(33).report_progress(_report(job_key="new-job", slurm_job_id="202", pid=b.pid))
        with pytest.raises(AgentError) as e:
            client(33).report_progress(_report(job_key="gone-job", slurm_job_id="999", pid=0))
        assert e.value.code == "PERMISSION_DENIED" and "slurm job 999 does not exist" in e.value.details
    finally:
        _stop(a, b)


def test_process_must_be_in_the_jobs_cgroup(users: tuple, tmp_path: Path) -> None:
    srv, slurm, client = users
    slurm.jobs.update({"101": 33})
    proc = tmp_path / "proc"
    srv.servicer.slurm = SlurmJobs(slurm, require_cgroup=True, proc=str(proc), failure_ttl_s=0.0)
    a, b = _user_proc(33, "101"), _user_proc(33, "101")

    def cgroup(pid: int, path: str) -> None:
        (proc / str(pid)).mkdir(parents=True, exist_ok=True)
        (proc / str(pid) / "cgroup").write_text(f"0::{path}\n")

    try:
        cgroup(a.pid, "/system.slice/slurmstepd.scope/job_999/step_0/user/task_0")
        with pytest.raises(AgentError) as e:
            client(33).report_progress(_report(job_key="cg", slurm_job_id="101", pid=a.pid))
        assert e.value.code == "PERMISSION_DENIED" and "cgroup of slurm job 999, not 101" in e.value.details
        cgroup(a.pid, "/system.slice/slurmstepd.scope/job_101/step_0/user/task_0")
        cgroup(b.pid, "/user.slice/user-33.slice/session-4.scope")
        assert b.poll() is None, f"the test's process ended (status {b.returncode}) before the check"
        with pytest.raises(AgentError) as e:
            client(33).report_progress(_report(job_key="cg", slurm_job_id="101", pid=b.pid))
        assert e.value.code == "PERMISSION_DENIED" and "in no Slurm job cgroup" in e.value.details
        client(33).report_progress(_report(job_key="cg", slurm_job_id="101", pid=a.pid))
        # the registered pid left the job (or the pid now names another job's process): not signalled
        cgroup(a.pid, "/system.slice/slurmstepd.scope/job_555/step_0/user/task_0")
        r = client(0).preempt("cg", "101", timeout_s=2)
        assert r["ok"] is False and "not signalled" in r["message"] and a.poll() is None
    finally:
        _stop(a, b)


def test_two_slurm_jobs_cannot_share_a_job_key(agent: NodeAgentServer, client: AgentClient) -> None:
    a, b = _sleeper(SLURM_JOB_ID="101"), _sleeper(SLURM_JOB_ID="202")
    try:
        client.report_progress(_report(job_key="shared", slurm_job_id="101", pid=a.pid))
        with pytest.raises(AgentError) as e:
            client.report_progress(_report(job_key="shared", slurm_job_id="202", pid=b.pid))
        assert e.value.code == "FAILED_PRECONDITION"
        assert "in use by slurm job 101" in e.value.details and "another job key" in e.value.details
        (st,) = client.job_stats()
        assert st["slurm_job_id"] == "101" and st["pids"] == [a.pid]
        with pytest.raises(AgentError) as e2:
            client.preempt("shared", "202", timeout_s=2)
        assert e2.value.code == "NOT_FOUND"
        r = client.preempt("shared", "101", timeout_s=5)
        assert r["process_exited"] and a.wait(timeout=10) == -signal.SIGUSR2
        assert b.poll() is None, "the other Slurm job was not signalled"
        # job 101 has ended: the key is free for job 202 (same owner)
        _until(lambda: client.job_stats("shared", include_finished=True)[0]["state"] != "running", 10, "101 ended")
        client.report_progress(_report(job_key="shared", slurm_job_id="202", pid=b.pid))
        assert client.job_stats("shared")[0]["slurm_job_id"] == "202"
    finally:
        _stop(a, b)


def test_reused_pid_is_not_signalled(agent: NodeAgentServer, client: AgentClient) -> None:
    p = _sleeper()
    try:
        client.report_progress(_report(job_key="reuse", pid=p.pid))
        rec = agent.tracker.jobs["reuse"]
        assert rec.pid_start[p.pid] == proc_start_time(p.pid)
        with agent.tracker.lock:
            rec.pid_start[p.pid] = (proc_start_time(p.pid) or 0) - 1  # as if the registered process had exited
        r = client.preempt("reuse", "101", timeout_s=2)
        assert r["ok"] is False and p.poll() is None, "a process that never registered got SIGUSR2"
        _until(lambda: not agent.tracker.jobs["reuse"].pids, 5, "the reaper to drop the stale pid")
    finally:
        _stop(p)


# ----------------------------------------------- a job-controlled store cannot block or wedge the agent


def _forge_ckpt(store: Path, key: str, step: int, size: object = 1) -> Path:
    d = store / key
    d.mkdir(parents=True, exist_ok=True)
    (d / f"ckpt-{step:012d}.json").write_text(json.dumps(
        {"job_key": key, "step": step, "sha256": "0" * 64, "size": size, "created": 1.0}).replace("Infinity", "1e999"))
    return d / f"ckpt-{step:012d}.bin"


def _ignoring_sigusr2(slurm_job_id: str = "101") -> subprocess.Popen:
    """A process of Slurm job ``slurm_job_id`` (by its environment) that ignores the agent's SIGUSR2."""
    p = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGUSR2, signal.SIG_IGN); "
                          "print('ready', flush=True); time.sleep(60)"], stdout=subprocess.PIPE,
                         env={**os.environ, "SLURM_JOB_ID": slurm_job_id})
    assert p.stdout is not None and p.stdout.readline().strip() == b"ready"
    return p


def test_fifo_in_the_store_does_not_block_preempt(agent: NodeAgentServer, client: AgentClient,
                                                  tmp_path: Path) -> None:
    p = _ignoring_sigusr2()
    try:
        client.report_progress(_report(job_key="evil", pid=p.pid))
        os.mkfifo(_forge_ckpt(tmp_path / "store", "evil", 999))
        (tmp_path / "store" / "evil" / "ckpt-000000000998.bin").unlink(missing_ok=True)
        _forge_ckpt(tmp_path / "store", "evil", 998).symlink_to("/dev/zero")
        t0 = time.monotonic()
        r = client.preempt("evil", "101", timeout_s=2)
        assert time.monotonic() - t0 < 8, "Preempt must honour its timeout"
        assert r["ok"] is False and "timed out" in r["message"]
        assert client.job_stats("evil")[0]["state"] == "running"
    finally:
        _stop(p)


def test_preempt_never_leaves_a_job_preempting(agent: NodeAgentServer, client: AgentClient, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    p = _ignoring_sigusr2()
    try:
        client.report_progress(_report(job_key="j", pid=p.pid))
        _forge_ckpt(tmp_path / "store", "j", 1, size=float("inf")).write_bytes(b"x")  # "size": 1e999
        r = client.preempt("j", "101", timeout_s=1)
        assert r["ok"] is False and client.job_stats("j")[0]["state"] == "running"
        # a store failing in a way nobody foresaw: logged, the wait goes on, the state is restored
        monkeypatch.setattr(agent.servicer.store, "latest", lambda *a, **k: 1 / 0)
        r = client.preempt("j", "101", timeout_s=1)
        assert r["ok"] is False and client.job_stats("j")[0]["state"] == "running"
        monkeypatch.undo()

        def refuse(pid: int, sig: int) -> None:
            raise PermissionError(1, "Operation not permitted")

        monkeypatch.setattr(os, "kill", refuse)
        r = client.preempt("j", "101", timeout_s=1)
        assert r["ok"] is False and r["done"] and f"cannot signal pid {p.pid}" in r["message"], r
        assert client.job_stats("j")[0]["state"] == "running"
    finally:
        monkeypatch.undo()
        _stop(p)


def test_preempt_crash_after_an_older_checkpoint_is_not_success(agent: NodeAgentServer, client: AgentClient,
                                                                 tmp_path: Path) -> None:
    """The reported step lags the real one, so the store may hold a (periodic) checkpoint at or past it
    while the preemption save fails (ENOSPC) and the processes crash: without the job's final
    "preempted" report no checkpoint counts as the preemption's."""
    LocalFSStore(tmp_path / "store").save("lag", 200, b"periodic checkpoint")
    p = subprocess.Popen([sys.executable, "-c",
                          "import os, signal, time; signal.signal(signal.SIGUSR2, lambda *a: os._exit(1)); "
                          "print('ready', flush=True); time.sleep(60)"], stdout=subprocess.PIPE,
                         env={**os.environ, "SLURM_JOB_ID": "101"})
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == b"ready"
        client.report_progress(_report(job_key="lag", step=150, total_steps=1000, pid=p.pid, checkpoint_step=200))
        r = client.preempt("lag", "101", timeout_s=10)
        assert p.wait(timeout=10) == 1
    finally:
        _stop(p)
    assert r["ok"] is False and r["process_exited"], r
    assert "without writing a new checkpoint" in r["message"] and "no final 'preempted' report" in r["message"], r
    assert "checkpoint: step 200" in r["message"] and "last reported step: 150" in r["message"], r
    assert client.job_stats("lag", include_finished=True)[0]["state"] == "exited"


def test_preempt_accepts_a_checkpoint_only_with_the_jobs_preempted_report(agent: NodeAgentServer,
                                                                          client: AgentClient, tmp_path: Path) -> None:
    """A new checkpoint alone (written after the signal) is not enough either; with the job's final
    "preempted" report at that step it is."""
    store = LocalFSStore(tmp_path / "store")
    store.save("conf", 100, b"old")
    p = _ignoring_sigusr2()
    try:
        client.report_progress(_report(job_key="conf", step=150, total_steps=1000, pid=p.pid))
        store.save("conf", 200, b"periodic, after the signal")  # but no "preempted" report: times out
        r = client.preempt("conf", "101", timeout_s=1)
        assert r["ok"] is False and "timed out" in r["message"] and "last reported step: 150" in r["message"], r
        assert client.job_stats("conf")[0]["state"] == "running"

        def confirm() -> None:
            time.sleep(0.5)
            store.save("conf", 230, b"preemption checkpoint")
            client.report_progress(_report(job_key="conf", step=230, total_steps=1000, pid=p.pid,
                                           checkpoint_step=230, state="preempted", final=True))
            p.kill()

        t = threading.Thread(target=confirm)
        t.start()
        r = client.preempt("conf", "101", timeout_s=10)
        t.join()
    finally:
        _stop(p)
    assert r["ok"] and r["checkpoint_step"] == 230 and r["process_exited"], r


def test_preempt_of_a_restarted_job_before_it_registers_is_not_success(tmp_path: Path, key: Path) -> None:
    """The record still holds the previous run (preempted, its pids dead) while the requeued run starts:
    while Slurm says the job runs, Preempt must not claim the job is preempted and gone."""
    slurm = FakeSlurm({"101": (0, "RUNNING")})
    with serve_agent(tmp_path, SharedKeyAuthenticator(key), JobTracker(),
                     slurm=SlurmJobs(slurm, require_cgroup=False, failure_ttl_s=0.0), reap_interval_s=0.2) as srv, \
            AgentClient(srv.address, SharedKeyAuthenticator(key), timeout=10) as client:
        LocalFSStore(tmp_path / "store").save("rq", 10, b"ckpt")
        old, new = _sleeper(), _sleeper()
        try:
            client.report_progress(_report(job_key="rq", step=10, pid=old.pid))
            client.report_progress(_report(job_key="rq", step=10, pid=old.pid, checkpoint_step=10,
                                           state="preempted", final=True))
            _stop(old)
            _until(lambda: not client.job_stats("rq", include_finished=True)[0]["pids"], what="the old pid reaped")
            r = client.preempt("rq", "101", timeout_s=5)  # the new run (`new`) has not reported yet
            assert r["ok"] is False and r["process_exited"] is False, r
            assert "has not registered with the agent yet (restarting?)" in r["message"], r
            slurm.down = True  # cannot tell: not success either
            r = client.preempt("rq", "101", timeout_s=5)
            assert r["ok"] is False and r["process_exited"] is False and "Slurm cannot say" in r["message"], r
            slurm.down = False
            slurm.jobs["101"] = (0, "PENDING")  # requeued, not started: the checkpoint covers it
            r = client.preempt("rq", "101", timeout_s=5)
            assert r["ok"] and r["process_exited"] and r["checkpoint_step"] == 10, r
            assert "is preempted: not signalled" in r["message"], r
            assert new.poll() is None
        finally:
            _stop(old, new)


def test_controller_reads_the_preempted_step_from_a_real_agent(tmp_path: Path, key: Path) -> None:
    """After a restart the controller asks the agents of a requeued job's nodes at which step it stopped
    for a preemption (AgentPreempter.preempted_step over real gRPC): only a final "preempted" report counts."""
    from controller.preemption import AgentPreempter

    slurm = FakeSlurm({"101": (0, "RUNNING"), "102": (0, "RUNNING")})
    with serve_agent(tmp_path, SharedKeyAuthenticator(key), JobTracker(),
                     slurm=SlurmJobs(slurm, require_cgroup=False, failure_ttl_s=0.0)) as srv, \
            AgentClient(srv.address, SharedKeyAuthenticator(key), timeout=10) as client:
        LocalFSStore(tmp_path / "store").save("pre", 40, b"ckpt")
        p1, p2 = _sleeper(), _sleeper(SLURM_JOB_ID="102")
        try:
            client.report_progress(_report(job_key="pre", slurm_job_id="101", step=42, pid=p1.pid))
            client.report_progress(_report(job_key="pre", slurm_job_id="101", step=42, pid=p1.pid,
                                           checkpoint_step=40, state="preempted", final=True))
            client.report_progress(_report(job_key="run", slurm_job_id="102", step=7, pid=p2.pid, checkpoint_step=5))
            p = AgentPreempter({NODE: srv.address},
                               lambda a, n: AgentClient(a, SharedKeyAuthenticator(key), timeout=10, node=n))
            try:
                assert p.preempted_step("101", [NODE]) == 40
                assert p.preempted_step("102", [NODE]) is None  # still running: no preemption checkpoint
                assert p.preempted_step("103", [NODE]) is None
            finally:
                p.close()
        finally:
            _stop(p1, p2)


def test_comm_fraction_comes_from_the_reporter_rank_only() -> None:
    """Ranks measure different communication fractions: the job's is the reporter's (lowest local rank),
    the rank whose samples feed the throughput window, not whichever rank reported last."""
    tr = JobTracker()
    r0, r1 = _sleeper(), _sleeper()
    try:
        tr.report(_report(job_key="cf", pid=r0.pid, rank=0, world_size=2, comm_fraction=0.25))
        tr.report(_report(job_key="cf", pid=r1.pid, rank=1, world_size=2, comm_fraction=0.6))
        assert tr.stat(tr.jobs["cf"]).comm_fraction == 0.25
        tr.report(_report(job_key="cf", pid=r0.pid, rank=0, world_size=2, step=11))  # not profiled again: -1
        tr.report(_report(job_key="cf", pid=r1.pid, rank=1, world_size=2, step=11, comm_fraction=0.7))
        assert tr.stat(tr.jobs["cf"]).comm_fraction == 0.25
        tr.report(_report(job_key="cf", pid=r0.pid, rank=0, world_size=2, step=12, comm_fraction=0.3))
        assert tr.stat(tr.jobs["cf"]).comm_fraction == 0.3
    finally:
        _stop(r0, r1)


# ------------------------------------------------------------------- the real Slurm lookup


def test_squeue_lookup_parses_and_fails_closed(tmp_path: Path) -> None:
    from nodeagent.slurmjob import squeue_lookup

    fake = tmp_path / "squeue"
    seen = tmp_path / "argv"
    fake.write_text(f"""#!/bin/sh
echo "$SLURM_CONF $*" >> {seen}
case "$*" in
  *--jobs=101\\ *) echo "101|33|RUNNING" ;;
  *--jobs=77_3\\ *) echo "80|33|PENDING" ;;
  *--jobs=102\\ *) echo "102|33|COMPLETED" ;;
  *--jobs=404\\ *) echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1 ;;
  *--jobs=405\\ *) ;;
  *--jobs=500\\ *) echo "slurm_load_jobs error: Unable to contact slurm controller (connect failure)" >&2; exit 1 ;;
  *--jobs=501\\ *) echo "garbage" ;;
  *--jobs=600\\ *) sleep 10 ;;
esac
""")
    fake.chmod(0o755)
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\n")

    def look(sid: str, **kw: object) -> object:
        return squeue_lookup(sid, squeue=str(fake), slurm_conf=str(conf), **kw)  # type: ignore[arg-type]

    assert look("101") == SlurmJobInfo("101", 33, "RUNNING")
    assert f"{conf} --noheader --jobs=101 --states=all --format=%A|%U|%T" in seen.read_text()
    assert look("77_3") == SlurmJobInfo("80", 33, "PENDING")  # an array task: its own numeric id
    assert look("102").gone and not SlurmJobInfo("1", 1, "SPECIAL_EXIT").gone  # type: ignore[union-attr]
    assert look("404") is None and look("405") is None  # Slurm does not know the job (any more)
    n = len(seen.read_text().splitlines())
    assert look("local") is None and len(seen.read_text().splitlines()) == n, "not a job id: Slurm is not asked"
    with pytest.raises(SlurmUnavailable, match="Unable to contact slurm controller"):
        look("500")
    with pytest.raises(SlurmUnavailable, match="unexpected"):
        look("501")
    with pytest.raises(SlurmUnavailable, match="cannot run"):
        look("600", timeout_s=0.5)
    with pytest.raises(SlurmUnavailable, match="cannot run"):
        squeue_lookup("101", squeue=str(tmp_path / "missing"))


def test_slurm_lookups_are_cached() -> None:
    slurm = FakeSlurm({"101": 33, "102": (33, "COMPLETED")})
    clock = _Clock()
    jobs = SlurmJobs(slurm, cache_ttl_s=300, failure_ttl_s=2, clock=clock)
    assert jobs.job("101") == jobs.job("101") == SlurmJobInfo("101", 33, "RUNNING")
    assert slurm.calls == ["101"]
    jobs.job("101", fresh=True)
    jobs.job("102")
    jobs.job("102")  # an ended job is asked again (it may be requeued, or purged)
    assert slurm.calls == ["101", "101", "102", "102"]
    slurm.down = True
    for _ in range(3):  # a burst of reports while slurmctld is down starts one squeue, not three
        with pytest.raises(SlurmUnavailable):
            jobs.job("303")
    assert slurm.calls.count("303") == 1
    slurm.down = False
    clock.t += 3
    assert jobs.job("303") is None and slurm.calls.count("303") == 2


def test_job_cgroups_from_proc_and_cgroupfs(tmp_path: Path) -> None:
    from nodeagent.slurmjob import proc_job_ids, slurm_cgroups_in_use

    proc = tmp_path / "proc"
    (proc / "7").mkdir(parents=True)
    (proc / "7" / "cgroup").write_text("0::/system.slice/slurmstepd.scope/job_101/step_batch/user/task_0\n")
    (proc / "8").mkdir()
    (proc / "8" / "cgroup").write_text("4:memory:/slurm/uid_1000/job_77/step_0/task_0\n3:cpuset:/\n0::/\n")
    (proc / "9").mkdir()
    (proc / "9" / "cgroup").write_text("0::/user.slice/user-1000.slice/job_like_name\n")
    assert proc_job_ids(7, str(proc)) == {"101"} and proc_job_ids(8, str(proc)) == {"77"}
    assert proc_job_ids(9, str(proc)) == set() and proc_job_ids(10, str(proc)) is None
    cg = tmp_path / "cg"
    (cg / "system.slice" / "slurmstepd.scope").mkdir(parents=True)
    assert not slurm_cgroups_in_use(str(cg)), "slurmd's scope alone: no job is in a cgroup yet"
    jobs = SlurmJobs(FakeSlurm(), cgroup_fs=str(cg))
    assert not jobs.require_cgroup()
    (cg / "system.slice" / "slurmstepd.scope" / "job_5").mkdir()
    assert slurm_cgroups_in_use(str(cg)) and jobs.require_cgroup()
    v1 = tmp_path / "v1"
    (v1 / "freezer" / "slurm" / "uid_0" / "job_3").mkdir(parents=True)
    assert slurm_cgroups_in_use(str(v1))


def test_remembered_key_owners_expire_when_slurm_forgets_the_job(tmp_path: Path, key: Path) -> None:
    from nodeagent.server import KeyOwner, NodeAgentServicer

    slurm = FakeSlurm({"101": (33, "SPECIAL_EXIT"), "102": (34, "COMPLETED")})
    sv = NodeAgentServicer("n", SharedKeyAuthenticator(key), LocalFSStore(tmp_path / "s"),
                           slurm=SlurmJobs(slurm, failure_ttl_s=0.0))
    sv.tracker.key_owners.update({"held": KeyOwner("101", 33), "done": KeyOwner("102", 34),
                                  "purged": KeyOwner("103", 35), "unknown": KeyOwner("104", 36)})
    slurm.down = False
    sv.expire_key_owners(max_checks=3)  # held, done, purged
    assert set(sv.tracker.key_owners) == {"held", "unknown"}
    assert sv.tracker.key_owners["held"].next_check > time.monotonic(), "rechecked later, not every second"
    slurm.down = True  # Slurm cannot tell: the owner is kept
    sv.expire_key_owners()
    assert set(sv.tracker.key_owners) == {"held", "unknown"}
    slurm.down = False
    sv.tracker.key_owners["unknown"].next_check = 0.0
    sv.expire_key_owners()
    assert set(sv.tracker.key_owners) == {"held"}


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), True, "5"])
def test_client_refuses_a_preempt_timeout_the_agent_would_read_differently(client: AgentClient, bad: object) -> None:
    """The agent reads timeout_s <= 0 as its 60 s default while the client's deadline would be timeout_s + its
    timeout: the caller would see DEADLINE_EXCEEDED while the job checkpoints. Refused before anything is sent."""
    with pytest.raises(ValueError, match="preempt timeout_s must be a finite number of seconds > 0"):
        client.preempt("job-1", "101", timeout_s=bad)  # type: ignore[arg-type]


def test_one_user_cannot_flood_the_agent_with_job_keys(users: tuple) -> None:
    """Keys per unprivileged uid are capped (RESOURCE_EXHAUSTED): otherwise one process could register under
    tens of thousands of keys, making JobStats replies exceed gRPC's 4 MB and the reaper hold the lock."""
    srv, slurm, client = users
    slurm.jobs.update({"101": 33, "202": 65534})
    srv.tracker.max_keys_per_uid = 5
    p33, p65534 = _user_proc(33, "101"), _user_proc(65534, "202")
    try:
        for i in range(5):
            client(33).report_progress(_report(job_key=f"k{i}", slurm_job_id="101", pid=p33.pid))
        with pytest.raises(AgentError) as e:
            client(33).report_progress(_report(job_key="k5", slurm_job_id="101", pid=p33.pid))
        assert e.value.code == "RESOURCE_EXHAUSTED" and "uid 33 already holds 5 job keys" in e.value.details
        client(33).report_progress(_report(job_key="k4", slurm_job_id="101", pid=p33.pid, step=20))  # its own: fine
        client(65534).report_progress(_report(job_key="n0", slurm_job_id="202", pid=p65534.pid))  # others: fine
        client(0).report_progress(_report(job_key="root-k", slurm_job_id="101", pid=0))  # privileged: no cap
        assert len(srv.tracker.jobs) == 7
    finally:
        _stop(p33, p65534)


def test_preempt_answers_at_once_and_runs_without_its_caller(agent: NodeAgentServer, key: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Preempt answers at once (an operation, not done); the operation runs in the agent whether or not its
    caller stays, and PreemptStatus reads its outcome (here: timed out after the full timeout_s)."""
    import nodeagent.server as srv_mod

    events: list[dict] = []
    monkeypatch.setattr(srv_mod, "emit", lambda event, level=0, **f: events.append({"event": event, **f}))
    job = _ignoring_sigusr2()
    auth = SharedKeyAuthenticator(key)
    try:
        with AgentClient(agent.address, auth, timeout=5, node=NODE) as c:
            c.report_progress(_report(pid=job.pid))
        req = pb.PreemptRequest(job_key="job-1", slurm_job_id="101", timeout_s=1.0)
        with grpc.insecure_channel(agent.address) as ch:
            t0 = time.monotonic()
            _, resp, _ = _raw_call(pbg.NodeAgentStub(ch), auth, "Preempt", req)  # the caller leaves after this
            assert time.monotonic() - t0 < 1.0 and not resp.done and not resp.ok and resp.operation_id, resp
        _until(lambda: any(x["event"] == "preempt_done" for x in events), 10, "the operation to end")
        done = [x for x in events if x["event"] == "preempt_done"]
        assert not done[0]["ok"] and done[0]["message"].startswith("timed out after 1.0s"), done
        with AgentClient(agent.address, auth, timeout=5, node=NODE) as c:
            st = c.preempt_status(resp.operation_id)
        assert st["done"] and not st["ok"] and st["message"] == done[0]["message"] and st["wait_s"] < 5, st
        assert job.poll() is None
    finally:
        _stop(job)
