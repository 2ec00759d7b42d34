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
import time
from pathlib import Path
from typing import Iterator

import grpc
import pytest

from nodeagent.auth import AUTH_HEADER, SharedKeyAuthenticator
from nodeagent.client import AgentClient, AgentError
from nodeagent.jobhelper import EXIT_PREEMPTED
from nodeagent.server import JobTracker, NodeAgentServer
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
    tracker = JobTracker(profile_steps=10, profile_skip_steps=10)
    with NodeAgentServer("node-a", "127.0.0.1:0", SharedKeyAuthenticator(key), LocalFSStore(tmp_path / "store"),
                         tracker, reap_interval_s=0.2) as srv:
        yield srv


@pytest.fixture
def client(agent: NodeAgentServer, key: Path) -> Iterator[AgentClient]:
    with AgentClient(agent.address, SharedKeyAuthenticator(key), timeout=10) as c:
        yield c


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


def test_unprivileged_key_owner_cannot_preempt(agent: NodeAgentServer, client: AgentClient, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to chown the key to nobody")
    client.report_progress(_report(job_key="roots-job", pid=0))  # owned by uid 0
    k = SharedKeyAuthenticator.generate(tmp_path / "user.key")
    os.chown(k, 65534, 65534)
    agent.servicer.auth = SharedKeyAuthenticator(k)  # now every verified caller is uid 65534
    with AgentClient(agent.address, SharedKeyAuthenticator(k)) as c:
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
    p = subprocess.Popen([sys.executable, "-c",
                          "import signal, time; signal.signal(signal.SIGUSR2, signal.SIG_IGN); "
                          "print('ready', flush=True); time.sleep(60)"], stdout=subprocess.PIPE)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == b"ready"
        client.report_progress(_report(job_key="stubborn", pid=p.pid))
        r = client.preempt("stubborn", "101", timeout_s=1.0)
        assert r["ok"] is False and "timed out" in r["message"] and r["checkpoint_step"] is None
        assert p.poll() is None
    finally:
        p.kill()
        p.wait()


def test_preempt_reports_exit_without_checkpoint(client: AgentClient) -> None:
    p = subprocess.Popen([sys.executable, "-c", "print('ready', flush=True); import time; time.sleep(60)"],
                         stdout=subprocess.PIPE)  # default SIGUSR2 action: terminate
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
