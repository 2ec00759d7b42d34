"""The node agent's security properties (issue 33, item 1), over real gRPC and real processes.

* **Replay cache**: a nonce is kept until its token expires (skew window), however many calls come in;
  what bounds the cache is a rate per caller (RESOURCE_EXHAUSTED), never the eviction of a live nonce.
* **PID registration**: a report may register only a process of its own Slurm job and of that job's owner,
  checked by the agent in every auth mode (root key included): pid 1, a process of another uid, a process
  of no Slurm job are refused, and Preempt signals only verified processes.
* **Preempt is asynchronous**: answered at once, polled for the outcome, merged per job, bounded per caller;
  Health is served while preemptions of jobs that ignore SIGUSR2 are pending.
* **Per-job keys** (no MUNGE): a job's key authenticates that job of that user only; the root key stays
  with the controller and the agents.

"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator

import grpc
import pytest
from agent_helpers import NODE, UidAuth, serve_agent

from nodeagent.auth import AUTH_HEADER, AuthError, SharedKeyAuthenticator, request_digest
from nodeagent.client import SERVICE, AgentClient, AgentError
from nodeagent.server import NodeAgentServer
from nodeagent.slurmjob import SlurmJobInfo, SlurmJobs
from proto import rlsched_agent_pb2 as pb
from proto import rlsched_agent_pb2_grpc as pbg

REPO = Path(__file__).resolve().parents[1]
HEALTH = SERVICE + "Health"
JOBSTATS = SERVICE + "JobStats"
ME = os.geteuid()
NOBODY = 65534
needs_root = pytest.mark.skipif(ME != 0, reason="needs root to run a process as another uid (nobody)")


@pytest.fixture
def key(tmp_path: Path) -> Path:
    return SharedKeyAuthenticator.generate(tmp_path / "agent.key")


def _slurm(jobs: dict[str, int]) -> SlurmJobs:
    """A fake slurmctld: job id -> owner uid (RUNNING); no job cgroups on this host."""
    return SlurmJobs(lambda sid: SlurmJobInfo(sid, jobs[sid], "RUNNING") if sid in jobs else None,
                     require_cgroup=False, failure_ttl_s=0.0)


def _report(key: str = "job-1", sid: str = "101", pid: int = 0, **kw: object) -> pb.ProgressReport:
    base = dict(job_key=key, slurm_job_id=sid, step=10, total_steps=100, samples=320, elapsed_s=1.0, model="MLP",
                checkpoint_step=-1, comm_fraction=-1.0, world_size=1, pid=pid)
    base.update(kw)
    return pb.ProgressReport(**base)  # type: ignore[arg-type]


def _proc(slurm_job_id: str | None = "101", uid: int | None = None, ignore_usr2: bool = False) -> subprocess.Popen:
    """A sleeping process, of ``uid`` (default: this one's), with ``SLURM_JOB_ID`` in its environment (None:
    without); it dies of SIGUSR2 unless ``ignore_usr2``. user= is applied by the C fork helper: no Python
    code runs in a child forked beside the in-process gRPC server's threads."""
    env = {"PATH": "/usr/bin:/bin", **({"SLURM_JOB_ID": slurm_job_id} if slurm_job_id else {})}
    sig = "--ignore-signal=USR2" if ignore_usr2 else "--default-signal=USR2"
    kw = {} if uid is None else {"user": uid, "group": uid, "extra_groups": []}
    return subprocess.Popen(["env", sig, "sleep", "300"], env=env, **kw)  # type: ignore[arg-type]


def _stop(*procs: subprocess.Popen) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def _until(pred: object, limit_s: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + limit_s
    while not pred():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


# ----------------------------------------------------------------------------------------- replay cache


def _flood(key: Path, n: int, node: str = NODE) -> Iterator[str]:
    """``n`` valid Health credentials, made with the key as any of its holders can (no agent involved)."""
    secret = key.read_bytes().strip()
    h, t = request_digest(b""), round(time.time(), 3)
    for i in range(n):
        payload = f'{{"a":"{node}","h":"{h}","m":"{HEALTH}","n":"flood{i:08d}","t":{t}}}'.encode()
        mac = hmac.new(secret, payload, hashlib.sha256).hexdigest()
        yield f"hmac-sha256 {base64.urlsafe_b64encode(payload).decode()}.{mac}"


def test_used_token_stays_refused_after_the_issues_flood_of_100050_calls(key: Path) -> None:
    """The attack of issue 33 with its numbers: after 100,050 signed Health calls an already-used JobStats
    credential was accepted again (the cache held 100,000 nonces and dropped the oldest, younger than the
    120 s skew window). With the agent's default limits the flood is refused past the caller's rate and the
    used credential stays a replay."""
    agent = SharedKeyAuthenticator(key)  # the agent's authenticator, default limits
    body = pb.JobStatsRequest().SerializeToString(deterministic=True)
    used = SharedKeyAuthenticator(key).sign(JOBSTATS, body, node=NODE)
    agent.verify(JOBSTATS, body, used, node=NODE)
    refused: Counter = Counter()
    t0 = time.monotonic()
    for token in _flood(key, 100_050):
        try:
            agent.verify(HEALTH, b"", token, node=NODE, unbound_ok=True)
        except AuthError as exc:
            refused[type(exc).__name__] += 1
    with pytest.raises(AuthError, match="replayed token"):
        agent.verify(JOBSTATS, body, used, node=NODE)
    admitted = 500 + 100 * (time.monotonic() - t0)  # the default burst, then 100/s while the loop ran
    assert refused["RateLimited"] >= 100_050 - admitted - 1, refused


def test_nonces_are_kept_until_their_token_expires_however_many(key: Path) -> None:
    """With no rate limit at all (and a clock the test moves): 3,000 nonces are all kept while their tokens
    could still pass the skew check, and all dropped once they cannot."""
    now = [1_700_000_000.0]
    agent = SharedKeyAuthenticator(key, clock=lambda: now[0], caller_rate_per_s=math.inf)
    signer = SharedKeyAuthenticator(key, clock=lambda: now[0])
    tokens = [signer.sign(HEALTH, b"", node=NODE) for _ in range(3000)]
    for t in tokens:
        agent.verify(HEALTH, b"", t, node=NODE)
    assert agent.live_nonces() == 3000
    now[0] += agent.max_skew_s - 1  # the oldest token is still valid: every nonce is still known
    for t in tokens[::97]:
        with pytest.raises(AuthError, match="replayed token"):
            agent.verify(HEALTH, b"", t, node=NODE)
    agent.verify(HEALTH, b"", signer.sign(HEALTH, b"", node=NODE), node=NODE)
    assert agent.live_nonces() == 3001, "nothing younger than the skew window was dropped"
    now[0] += 30  # now every one of the 3,000 is expired: refused for its time, and forgotten
    with pytest.raises(AuthError, match="timestamp"):
        agent.verify(HEALTH, b"", tokens[-1], node=NODE)
    agent.verify(HEALTH, b"", signer.sign(HEALTH, b"", node=NODE), node=NODE)
    assert agent.live_nonces() == 2


def test_a_caller_over_its_rate_is_refused_and_others_are_not(key: Path) -> None:
    from nodeagent.auth import RateLimited

    now = [1_700_000_000.0]
    agent = UidAuth(key, clock=lambda: now[0], caller_burst=3, caller_rate_per_s=1.0)

    def call(uid: int) -> None:
        agent.verify(HEALTH, b"", UidAuth(key, uid, clock=lambda: now[0]).sign(HEALTH, b"", node=NODE), node=NODE)

    for _ in range(3):
        call(1000)
    with pytest.raises(RateLimited, match=r"caller uid 1000 is over its rate .*3 at once, then 1 per second"):
        call(1000)
    assert agent.live_nonces() == 3, "a refused token's nonce is not kept"
    call(2000)  # another caller is not affected
    call(0)  # nor the controller
    now[0] += 1.0
    call(1000)  # one more token a second later
    with pytest.raises(RateLimited):
        call(1000)


def test_flood_over_grpc_is_refused_and_a_replayed_credential_too(tmp_path: Path, key: Path) -> None:
    """The issue's attack over the wire, scaled down through the agent's limits (same code path): a user
    floods Health, gets RESOURCE_EXHAUSTED past its rate; the controller's captured JobStats credential
    replayed afterwards is refused; the controller is still served."""
    with serve_agent(tmp_path, UidAuth(key, caller_burst=40, caller_rate_per_s=1.0)) as srv, \
            grpc.insecure_channel(srv.address) as ch:
        stub = pbg.NodeAgentStub(ch)
        req = pb.JobStatsRequest()
        captured = UidAuth(key, 0).sign(JOBSTATS, req.SerializeToString(deterministic=True), node=NODE)
        stub.JobStats(req, timeout=5, metadata=((AUTH_HEADER, captured),))
        user = UidAuth(key, 1000)
        codes: Counter = Counter()
        for _ in range(80):
            try:
                stub.Health(pb.HealthRequest(), timeout=5,
                            metadata=((AUTH_HEADER, user.sign(HEALTH, b"", node=NODE)),))
                codes["OK"] += 1
            except grpc.RpcError as exc:
                codes[exc.code().name] += 1
                if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    assert "caller uid 1000 is over its rate" in exc.details()
        assert codes["OK"] >= 40 and codes["RESOURCE_EXHAUSTED"] >= 20 and sum(codes.values()) == 80, codes
        with pytest.raises(grpc.RpcError) as e:
            stub.JobStats(req, timeout=5, metadata=((AUTH_HEADER, captured),))
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED and "replayed token" in e.value.details()
        with AgentClient(srv.address, UidAuth(key, 0), timeout=5, node=NODE) as c:
            assert c.health()["node"] == NODE


# ------------------------------------------------------------------------------------ PID registration


@pytest.fixture
def root_key_agent(tmp_path: Path, key: Path) -> Iterator[tuple[NodeAgentServer, AgentClient]]:
    """Shared-key agent; the caller holds the root key (privileged, as every job did with one shared key).
    Slurm knows job 101 (this user's) and 202 (nobody's)."""
    with serve_agent(tmp_path, SharedKeyAuthenticator(key), slurm=_slurm({"101": ME, "202": NOBODY}),
                     reap_interval_s=0.2) as srv, \
            AgentClient(srv.address, SharedKeyAuthenticator(key), timeout=10, node=NODE) as c:
        yield srv, c


def test_root_key_report_cannot_register_pid_1(root_key_agent: tuple) -> None:
    _, c = root_key_agent
    with pytest.raises(AgentError) as e:
        c.report_progress(_report(pid=1))
    assert e.value.code == "PERMISSION_DENIED" and "pid 1 is init" in e.value.details
    assert c.job_stats() == [], "a refused report registers nothing"


def test_root_key_report_cannot_register_a_process_of_no_slurm_job(root_key_agent: tuple) -> None:
    """A process of the job's owner but with no SLURM_JOB_ID (and in no job cgroup) is not the job's."""
    _, c = root_key_agent
    outsider = _proc(slurm_job_id=None)
    try:
        with pytest.raises(AgentError) as e:
            c.report_progress(_report(pid=outsider.pid))
        assert e.value.code == "PERMISSION_DENIED"
        assert f"pid {outsider.pid} is not part of a Slurm job" in e.value.details
        with pytest.raises(AgentError) as e:  # a job Slurm does not know: no process can be its
            c.report_progress(_report(sid="999", pid=outsider.pid))
        assert e.value.code == "PERMISSION_DENIED" and "Slurm does not know that job" in e.value.details
    finally:
        _stop(outsider)


@needs_root
def test_root_key_report_of_another_uids_process_is_refused_and_preempt_never_signals_it(
        root_key_agent: tuple) -> None:
    """The issue's attack: a root-key report naming a process of uid 65534 that belongs to no Slurm job was
    accepted, and Preempt then sent it SIGUSR2. Now it is refused (with or without a SLURM_JOB_ID claiming
    job 101, which is this user's), and Preempt signals the job's own verified process only."""
    _, c = root_key_agent
    victim_plain, victim_claiming = _proc(None, uid=NOBODY), _proc("101", uid=NOBODY)
    own = _proc("101")
    try:
        for victim in (victim_plain, victim_claiming):
            with pytest.raises(AgentError) as e:
                c.report_progress(_report(key="k", pid=victim.pid))
            assert e.value.code == "PERMISSION_DENIED", e.value
            assert f"pid {victim.pid} is owned by uid {NOBODY}, not by uid {ME}, the owner of slurm job 101" \
                in e.value.details
        c.report_progress(_report(key="k", pid=own.pid))
        (st,) = c.job_stats()
        assert st["pids"] == [own.pid]
        r = c.preempt("k", "101", timeout_s=5)
        assert r["ok"] is False and r["process_exited"], r
        assert own.wait(timeout=10) == -signal.SIGUSR2
        assert victim_plain.poll() is None and victim_claiming.poll() is None, "no other process was signalled"
    finally:
        _stop(victim_plain, victim_claiming, own)


@needs_root
def test_process_of_another_users_job_cannot_be_registered_for_it(root_key_agent: tuple) -> None:
    """Job 202 is nobody's: a process of this user claiming job 202 is not that job's."""
    _, c = root_key_agent
    mine = _proc("202")
    try:
        with pytest.raises(AgentError) as e:
            c.report_progress(_report(key="k2", sid="202", pid=mine.pid))
        assert e.value.code == "PERMISSION_DENIED" and f"not by uid {NOBODY}" in e.value.details
    finally:
        _stop(mine)


def test_a_registered_process_that_leaves_its_job_is_not_signalled(root_key_agent: tuple, tmp_path: Path) -> None:
    """Preempt checks each pid again before signalling it: a process that no longer passes (here: its
    cgroup now names another job) is skipped."""
    srv, c = root_key_agent
    p = _proc("101")
    proc = tmp_path / "proc"

    def cgroup(path: str) -> None:
        (proc / str(p.pid)).mkdir(parents=True, exist_ok=True)
        (proc / str(p.pid) / "cgroup").write_text(f"0::{path}\n")

    try:
        srv.servicer.slurm.proc = str(proc)
        cgroup("/system.slice/slurmstepd.scope/job_101/step_0/user/task_0")
        c.report_progress(_report(key="moved", pid=p.pid))
        cgroup("/system.slice/slurmstepd.scope/job_555/step_0/user/task_0")
        r = c.preempt("moved", "101", timeout_s=2)
        assert r["ok"] is False and "not signalled" in r["message"] and p.poll() is None, r
    finally:
        _stop(p)


# ------------------------------------------------------------------------------------------ per-job keys


def test_per_job_keys_are_derived_per_job_and_user(key: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nodeagent.auth import (
        JOB_SCHEME,
        JobKeyAuthenticator,
        derive_job_key,
        make_authenticator,
        remove_job_key,
        write_job_key,
    )

    root = SharedKeyAuthenticator(key)
    k = root.job_key("101", 1000)
    assert k == derive_job_key(key.read_bytes().strip(), "101", 1000)
    assert len({k, root.job_key("102", 1000), root.job_key("101", 1001)}) == 3
    d = tmp_path / "jobkeys"
    path = write_job_key(key, d, "101", ME)
    st = path.stat()
    assert path == d / "101.key" and stat.S_IMODE(st.st_mode) == 0o400 and st.st_uid == ME
    monkeypatch.setenv("SLURM_JOB_ID", "101")
    job = make_authenticator(f"jobkey:{d}")
    assert isinstance(job, JobKeyAuthenticator) and (job.job_id, job.uid) == ("101", ME)
    ident = root.verify(HEALTH, b"", job.sign(HEALTH, b"", node=NODE), node=NODE)
    assert (ident.uid, ident.job, ident.scheme) == (ME, "101", JOB_SCHEME)
    assert not root.is_privileged(ident) and not root.is_agent_identity(ident), "root's job key is still a job's"
    # a token claiming another job (or uid) does not verify with this job's key
    claims = json.loads(base64.urlsafe_b64decode(job.sign(HEALTH, b"", node=NODE).split()[1].split(".")[0]))
    forged = json.dumps({**claims, "j": "102"}).encode()
    mac = hmac.new(job._key, forged, hashlib.sha256).hexdigest()
    with pytest.raises(AuthError, match="bad hmac"):
        root.verify(HEALTH, b"", f"{JOB_SCHEME} {base64.urlsafe_b64encode(forged).decode()}.{mac}", node=NODE)
    assert remove_job_key(d, "101") and not path.exists() and not remove_job_key(d, "101")
    d.chmod(0o777)
    with pytest.raises(AuthError, match="not be writable by group/others"):
        write_job_key(key, d, "101", ME)
    if ME == 0:
        d.chmod(0o755)
        st = write_job_key(key, d, "202", NOBODY, NOBODY).stat()
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (NOBODY, NOBODY, 0o400)


def test_a_job_key_reports_only_its_own_job_and_processes(tmp_path: Path, key: Path) -> None:
    """A job holding its per-job key (not the root key) can report on its own job with its own process; it
    cannot report another job, register another job's process, or preempt; Slurm is never asked."""
    from nodeagent.auth import JobKeyAuthenticator, write_job_key

    lookups: list[str] = []

    def lookup(sid: str) -> SlurmJobInfo | None:
        lookups.append(sid)
        return None

    job = JobKeyAuthenticator(write_job_key(key, tmp_path / "jobkeys", "101", ME))
    own, other = _proc("101"), _proc("202")
    with serve_agent(tmp_path, SharedKeyAuthenticator(key), slurm=SlurmJobs(lookup, require_cgroup=False)) as srv, \
            AgentClient(srv.address, job, timeout=10) as c:  # learns the node, verifies replies with its key
        try:
            assert c.report_progress(_report(key="slurm-101", pid=own.pid))["accepted"]
            with pytest.raises(AgentError) as e:
                c.report_progress(_report(key="slurm-202", sid="202", pid=other.pid))
            assert e.value.code == "PERMISSION_DENIED" and "key of slurm job 101" in e.value.details
            with pytest.raises(AgentError) as e:
                c.report_progress(_report(key="slurm-101", pid=other.pid))
            assert e.value.code == "PERMISSION_DENIED" and "belongs to slurm job 202, not 101" in e.value.details
            for call in (lambda: c.preempt("slurm-101", "101", timeout_s=1),
                         lambda: c.preempt_status("0" * 24)):
                with pytest.raises(AgentError) as e:
                    call()
                assert e.value.code == "PERMISSION_DENIED"
            (st,) = c.job_stats()
            assert st["pids"] == [own.pid] and lookups == []
            # the controller (root key) preempts it; only the job's own process gets the signal
            with AgentClient(srv.address, SharedKeyAuthenticator(key), timeout=10, node=NODE) as ctl:
                r = ctl.preempt("slurm-101", "101", timeout_s=5)
            assert r["process_exited"] and own.wait(timeout=10) == -signal.SIGUSR2 and other.poll() is None
        finally:
            _stop(own, other)


@needs_root
def test_agent_jobkey_cli_writes_a_key_only_the_jobs_user_reads(tmp_path: Path, key: Path) -> None:
    d = tmp_path / "jobkeys"
    env = {**os.environ, "PYTHONPATH": str(REPO), "SLURM_JOB_ID": "4242", "SLURM_JOB_UID": str(NOBODY),
           "SLURM_JOB_GID": str(NOBODY)}
    cli = [sys.executable, "-m", "rlsched.cli", "agent-jobkey"]
    r = subprocess.run([*cli, "write", "--key", str(key), "--dir", str(d)], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == str(d / "4242.key"), r.stderr
    st = (d / "4242.key").stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (NOBODY, NOBODY, 0o400)
    r = subprocess.run([*cli, "write", "--dir", str(d)], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.strip() == "rlsched agent-jobkey: error: write needs --key, the root key file"
    r = subprocess.run([*cli, "remove", "--dir", str(d)], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and not (d / "4242.key").exists(), r.stderr


# ------------------------------------------------------------------------------- asynchronous Preempt


def test_health_is_served_while_preemptions_of_stubborn_jobs_are_pending(tmp_path: Path, key: Path) -> None:
    """The issue's hole: with --max-workers 4, four concurrent Preempts of jobs that ignore SIGUSR2 held
    every worker (each up to its timeout_s) and Health timed out. Now Health, JobStats and the polls are
    served throughout."""
    procs = [_proc("101", ignore_usr2=True) for _ in range(5)]
    results: dict[int, object] = {}
    with serve_agent(tmp_path, SharedKeyAuthenticator(key), slurm=_slurm({"101": ME}), max_workers=4) as srv, \
            AgentClient(srv.address, SharedKeyAuthenticator(key), timeout=10, node=NODE) as ctl, \
            AgentClient(srv.address, SharedKeyAuthenticator(key), timeout=1.5, node=NODE) as quick:
        try:
            for i, p in enumerate(procs):
                ctl.report_progress(_report(key=f"stubborn-{i}", pid=p.pid))

            def preempt(i: int) -> None:
                try:
                    results[i] = ctl.preempt(f"stubborn-{i}", "101", timeout_s=3)
                except AgentError as exc:
                    results[i] = exc

            threads = [threading.Thread(target=preempt, args=(i,)) for i in range(len(procs))]
            for t in threads:
                t.start()
            time.sleep(1.0)  # every Preempt was sent; their jobs ignore the signal
            for _ in range(3):
                t0 = time.monotonic()
                assert quick.health()["node"] == NODE and time.monotonic() - t0 < 1.0
                assert {s["state"] for s in quick.job_stats()} == {"preempting"}
            for t in threads:
                t.join(15)
        finally:
            _stop(*procs)
    for i in range(len(procs)):
        r = results[i]
        assert isinstance(r, dict) and r["done"] and r["ok"] is False, r
        assert r["message"].startswith("timed out after 3.0s"), r


def test_concurrent_preempts_of_one_job_are_one_operation(tmp_path: Path, key: Path) -> None:
    p = _proc("101", ignore_usr2=True)
    with serve_agent(tmp_path, SharedKeyAuthenticator(key), slurm=_slurm({"101": ME})) as srv, \
            AgentClient(srv.address, SharedKeyAuthenticator(key), timeout=10, node=NODE) as c:
        try:
            c.report_progress(_report(key="one", pid=p.pid))
            t0 = time.monotonic()
            a = c.preempt_start("one", "101", timeout_s=1.0)
            b = c.preempt_start("one", "101", timeout_s=1.5)  # pushes the deadline to 1.5 s from now
            assert time.monotonic() - t0 < 1.0, "Preempt answers at once"
            assert not a["done"] and not a["joined"] and b["joined"] and a["operation_id"] == b["operation_id"]
            assert srv.servicer.running_preempts() == 1
            _until(lambda: c.preempt_status(a["operation_id"])["done"], 10, "the operation to end")
            end = c.preempt_status(a["operation_id"])
            assert end["ok"] is False and end["message"].startswith("timed out after 1.5"), end
            assert 1.4 < end["wait_s"] < 5, end
            again = c.preempt_start("one", "101", timeout_s=1.0)  # the last one ended: a new operation
            assert again["operation_id"] != a["operation_id"] and not again["joined"]
            with pytest.raises(AgentError) as e:
                c.preempt_status("no-such-operation")
            assert e.value.code == "NOT_FOUND" and "no preemption operation" in e.value.details
        finally:
            _stop(p)


def test_running_preempts_are_bounded_per_caller(tmp_path: Path, key: Path) -> None:
    procs = [_proc("101", ignore_usr2=True) for _ in range(3)]
    with serve_agent(tmp_path, UidAuth(key, allowed_uids={500}), slurm=_slurm({"101": ME}),
                     max_preempts_per_caller=2) as srv, \
            AgentClient(srv.address, UidAuth(key, 0), timeout=10, node=NODE) as root, \
            AgentClient(srv.address, UidAuth(key, 500), timeout=10, node=NODE) as other:
        try:
            for i, p in enumerate(procs):
                root.report_progress(_report(key=f"b{i}", pid=p.pid))
            root.preempt_start("b0", "101", timeout_s=1.0)
            root.preempt_start("b1", "101", timeout_s=1.0)
            assert root.preempt_start("b0", "101", timeout_s=1.0)["joined"], "joining does not count"
            with pytest.raises(AgentError) as e:
                root.preempt_start("b2", "101", timeout_s=1.0)
            assert e.value.code == "RESOURCE_EXHAUSTED"
            assert "uid 0 already has 2 preemptions running" in e.value.details
            assert "limit 2 per caller" in e.value.details
            assert not other.preempt_start("b2", "101", timeout_s=1.0)["joined"], "another caller has its own bound"
            _until(lambda: srv.servicer.running_preempts() == 0, 10, "the operations to end")
            assert not root.preempt_start("b0", "101", timeout_s=1.0)["done"], "ended ones free the bound"
        finally:
            _stop(*procs)


def test_controller_preempter_waits_for_the_asynchronous_outcome(tmp_path: Path, key: Path) -> None:
    """AgentPreempter.checkpoint over a real agent: one blocking call bounded by ``timeout_s``; the outcome of
    a job that ignores the signal is a timeout after ``timeout_s``, an agent that lost the operation is no
    checkpoint (the agent answered, so it is not "no agent")."""
    from controller.preemption import AgentPreempter

    p = _proc("101", ignore_usr2=True)
    job = SimpleNamespace(job_id=101, comment="", nodes=[NODE], batch_host=NODE)
    with serve_agent(tmp_path, SharedKeyAuthenticator(key), slurm=_slurm({"101": ME})) as srv:
        pre = AgentPreempter({NODE: srv.address},
                             lambda a, n: AgentClient(a, SharedKeyAuthenticator(key), timeout=5, node=n))
        try:
            with AgentClient(srv.address, SharedKeyAuthenticator(key), timeout=5, node=NODE) as c:
                c.report_progress(_report(key="slurm-101", pid=p.pid))
            t0 = time.monotonic()
            out = pre.checkpoint(job, 1.0)  # type: ignore[arg-type]
            assert 1.0 <= time.monotonic() - t0 < 6.0
            assert not out.ok and out.reached_agent and out.message.startswith("timed out after 1.0s"), out
            orig = srv.servicer._preempt_op  # as if the agent restarted: it forgets every ended operation

            def forget(op: object) -> None:
                orig(op)
                with srv.servicer._ops_lock:
                    srv.servicer._ops.clear()

            srv.servicer._preempt_op = forget  # type: ignore[method-assign]
            out = pre.checkpoint(job, 0.5)  # type: ignore[arg-type]
            assert not out.ok and out.reached_agent and "no longer knows it" in out.message, out
        finally:
            pre.close()
            _stop(p)
