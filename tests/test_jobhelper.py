"""Tests for nodeagent.jobhelper and nodeagent.convention (in-process, torch on CPU)."""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from nodeagent.auth import SharedKeyAuthenticator
from nodeagent.convention import CommentError, job_key_for, parse_comment
from nodeagent.jobhelper import (
    EXIT_PREEMPTED,
    JobSession,
    _comment_from_slurm,
    comm_fraction_from_events,
    resolve_agent_address,
    scontrol_field,
)
from nodeagent.server import JobTracker, NodeAgentServer
from nodeagent.slurmjob import SlurmJobInfo, SlurmJobs
from nodeagent.store import LocalFSStore, StoreUnavailable


@pytest.fixture(autouse=True)
def _keep_sigusr2() -> object:
    """Sessions leave SIGUSR2 ignored after them; ignored signals are inherited by child processes,
    so restore this process's disposition for the tests that follow (some expect SIGUSR2 to kill)."""
    before = signal.getsignal(signal.SIGUSR2)
    yield
    signal.signal(signal.SIGUSR2, before)

# ---------------------------------------------------------------- convention


def test_parse_comment() -> None:
    assert parse_comment("rlsched:model=MoE") == {"model": "MoE"}
    assert parse_comment(" rlsched:model=LM, samples=5000 ,key=my-job.1") == {
        "model": "LM", "samples": "5000", "key": "my-job.1"}
    for not_ours in (None, "", "(null)", "just a note", "model=MoE"):
        assert parse_comment(not_ours) is None
    for bad in ("rlsched:model", "rlsched:model=", "rlsched:model=a,model=b", "rlsched:samples=-3",
                "rlsched:samples=lots", "rlsched:key=../x"):
        with pytest.raises(CommentError):
            parse_comment(bad)


def test_job_key_for() -> None:
    assert job_key_for(123) == "slurm-123"
    assert job_key_for("77_3", "rlsched:model=MoE") == "slurm-77_3"
    assert job_key_for(123, "rlsched:model=MoE,key=exp-42") == "exp-42"


def test_resolve_agent_address() -> None:
    assert resolve_agent_address(None, None) == "127.0.0.1:50051"
    assert resolve_agent_address("10.0.0.1:7000", "n1") == "10.0.0.1:7000"
    assert resolve_agent_address("none", "n1") is None and resolve_agent_address("", "n1") is None
    table = "n1=127.0.0.1:7001,n2=127.0.0.1:7002"
    assert resolve_agent_address(table, "n2") == "127.0.0.1:7002"
    assert resolve_agent_address(table + ",*=127.0.0.1:7000", "n9") == "127.0.0.1:7000"
    with pytest.raises(ValueError, match="no entry for node 'n9'"):
        resolve_agent_address(table, "n9")
    # spaces after the commas / around '=' (as people write lists) are not part of names or addresses
    spaced = "n1=127.0.0.1:7001, n2 = 127.0.0.1:7002 , * =127.0.0.1:7000"
    assert resolve_agent_address(spaced, "n2") == "127.0.0.1:7002"
    assert resolve_agent_address(spaced, "n9") == "127.0.0.1:7000"
    with pytest.raises(ValueError, match="empty address"):
        resolve_agent_address("n1=", "n1")


def test_bad_agent_table_disables_reporting_instead_of_killing_the_job(tmp_path: Path) -> None:
    env = {"SLURM_JOB_ID": "1", "RLSCHED_JOB_KEY": "k", "SLURMD_NODENAME": "node2", "RLSCHED_STORE": str(tmp_path),
           "RLSCHED_AGENT": "node1=10.0.0.1:50051, node2=10.0.0.2:50051"}
    assert JobSession.from_env(env, total_steps=1).agent_address == "10.0.0.2:50051"
    env["RLSCHED_AGENT"] = "node1=10.0.0.1:50051"  # no entry for node2: warn, train without reporting
    s = JobSession.from_env(env, total_steps=1)
    assert s.agent_address is None and s.job_key == "k"


_SCONTROL_LINE = ("JobId=123 JobName=my job UserId=alice(1000) GroupId=alice(1000) Priority=1 "
                  "Comment=rlsched:model=MoE, key=moe-run-7 StdErr=/x/err StdOut=/x/out CPUs/Task=1")


def test_scontrol_comment_with_spaces() -> None:
    assert scontrol_field(_SCONTROL_LINE, "Comment") == "rlsched:model=MoE, key=moe-run-7"
    assert scontrol_field(_SCONTROL_LINE, "JobName") == "my job"
    assert scontrol_field(_SCONTROL_LINE, "StdOut") == "/x/out" and scontrol_field(_SCONTROL_LINE, "CPUs/Task") == "1"
    assert scontrol_field("JobId=5 Comment=(null) StdErr=/e", "Comment") == "(null)"
    assert scontrol_field("JobId=5 StdErr=/e", "Comment") is None
    # the multi-line form (no -o): fields on indented lines
    multi = "JobId=123 JobName=j\n   UserId=a(1) GroupId=a(1)\n   Comment=rlsched:model=LM,  samples=10\n   StdErr=/e\n"
    assert scontrol_field(multi, "Comment") == "rlsched:model=LM,  samples=10"


def test_comment_from_scontrol_keeps_key_after_a_space(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "scontrol"
    fake.write_text(f"#!/bin/sh\necho '{_SCONTROL_LINE}'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    assert _comment_from_slurm("123") == "rlsched:model=MoE, key=moe-run-7"
    s = JobSession.from_env({"SLURM_JOB_ID": "123", "RLSCHED_AGENT": "none", "RLSCHED_STORE": str(tmp_path)},
                            total_steps=1)
    assert (s.job_key, s.model) == ("moe-run-7", "MoE")
    fake.write_text("#!/bin/sh\necho 'slurm_load_jobs error: Invalid job id specified' >&2\nexit 1\n")
    assert _comment_from_slurm("123") is None


def test_from_env(tmp_path: Path) -> None:
    env = {"SLURM_JOB_ID": "88", "RLSCHED_COMMENT": "rlsched:model=GNN,key=k-88", "RLSCHED_AGENT": "none",
           "RLSCHED_STORE": str(tmp_path)}
    s = JobSession.from_env(env, total_steps=10)
    assert (s.job_key, s.slurm_job_id, s.model, s.agent_address) == ("k-88", "88", "GNN", None)
    env["RLSCHED_JOB_KEY"] = "explicit"
    assert JobSession.from_env(env).job_key == "explicit"
    env.pop("RLSCHED_JOB_KEY")
    env["RLSCHED_COMMENT"] = "rlsched:model=MoE"
    s = JobSession.from_env(env, model="override")
    assert s.job_key == "slurm-88" and s.model == "override"
    env["RLSCHED_COMMENT"] = "rlsched:model"  # malformed: warn, fall back to defaults, keep training
    s = JobSession.from_env(env)
    assert s.job_key == "slurm-88" and s.model == ""


# ------------------------------------------------------------ comm fraction


def _ev(name: str, start: float, end: float) -> SimpleNamespace:
    return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start, end=end))


def test_comm_fraction_union_of_intervals() -> None:
    events = [
        _ev("aten::addmm", 0, 100),
        _ev("gloo:all_reduce", 10, 30),
        _ev("c10d::allreduce_", 20, 40),  # overlaps -> union [10, 40]
        _ev("nccl:all_gather", 60, 70),
        _ev("aten::broadcast_tensors", 0, 100),  # not communication
        _ev("rlsched::stop_check", 80, 95),
        _ev("gloo:all_reduce", 82, 90),  # our own stop-flag all-reduce: excluded
    ]
    assert comm_fraction_from_events(events, 100.0) == pytest.approx(0.4)
    assert comm_fraction_from_events([], 100.0) == 0.0
    assert comm_fraction_from_events(events, 0.0) == 0.0


# ---------------------------------------------------------------- sessions


def _session(tmp_path: Path, **kw: object) -> JobSession:
    kw.setdefault("total_steps", 20)
    return JobSession("job-h", "9", LocalFSStore(tmp_path / "store"), None, None, **kw)  # type: ignore[arg-type]


def _state(step: int) -> dict:
    return {"w": torch.full((3,), float(step)), "meta": {"step": step, "lr": 0.1, "hist": [1, 2]}}


def test_fresh_run_to_completion_saves_final(tmp_path: Path) -> None:
    with _session(tmp_path) as s:
        assert s.resume() == (0, None)
        seen = list(s.steps(0, state_fn=lambda: _state(s.step), samples_per_step=4))
    assert seen == list(range(20))
    info, blob = LocalFSStore(tmp_path / "store").load("job-h")
    assert info.step == 20
    assert torch.load(io.BytesIO(blob), weights_only=True)["w"].tolist() == [20.0] * 3


@pytest.mark.parametrize("end", ["error", "break", "preempted"])
def test_profiler_is_stopped_when_the_loop_ends_inside_the_profiled_steps(tmp_path: Path, end: str) -> None:
    """An error, a break or a preemption during the profiled steps must not leave torch's profiler
    recording every later op of the process (evaluation, export, the next session)."""
    from torch.autograd import _profiler_enabled

    with pytest.raises((RuntimeError, SystemExit)) if end != "break" else contextlib.nullcontext(), \
            _session(tmp_path, profile_warmup=1, profile_steps=10, install_signal=False) as s:
        for step in s.steps(0, state_fn=lambda: _state(s.step), samples_per_step=1):
            if step == 3:
                assert _profiler_enabled(), "profiling runs at step 3 (steps 1-10)"
                if end == "error":
                    raise RuntimeError("a training step failed")
                if end == "break":
                    break
                s.request_stop()
    assert not _profiler_enabled()
    with _session(tmp_path, total_steps=8, profile_warmup=1, profile_steps=3) as s2:  # the next session profiles
        list(s2.steps(0, state_fn=lambda: _state(s2.step), samples_per_step=1))
    assert 0.0 <= s2.comm_fraction <= 1.0 and not _profiler_enabled()


def test_stop_request_checkpoints_and_exits_75_then_resumes(tmp_path: Path) -> None:
    seen: list[int] = []
    with pytest.raises(SystemExit) as e, _session(tmp_path, ckpt_every=2) as s:
        for step in s.steps(0, state_fn=lambda: _state(s.step), samples_per_step=1):
            seen.append(step)
            if step == 7:
                os.kill(os.getpid(), signal.SIGUSR2)  # the real signal, handled by the session
    assert e.value.code == EXIT_PREEMPTED
    assert seen == list(range(8)), "the current step finishes, no further step starts"
    st = LocalFSStore(tmp_path / "store")
    assert [i.step for i in st.list("job-h")] == [6, 8], "periodic + preemption checkpoints, pruned to 2"
    with _session(tmp_path) as s2:
        start, state = s2.resume()
        assert start == 8 and state is not None
        assert state["w"].tolist() == [8.0] * 3 and state["meta"] == {"step": 8, "lr": 0.1, "hist": [1, 2]}
        rest = list(s2.steps(start, state_fn=lambda: _state(s2.step), samples_per_step=1))
    assert len(seen) + len(rest) == 20 and rest[0] == 8 and rest[-1] == 19


def test_signal_handler_restored(tmp_path: Path) -> None:
    def mine(signum: int, frame: object) -> None:
        """The job script's own SIGUSR2 handler (never called here)."""

    signal.signal(signal.SIGUSR2, mine)
    with _session(tmp_path):
        assert signal.getsignal(signal.SIGUSR2) not in (mine, signal.SIG_DFL, signal.SIG_IGN)
    assert signal.getsignal(signal.SIGUSR2) is mine, "the script's own handler comes back"
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    with _session(tmp_path):
        assert signal.getsignal(signal.SIGUSR2) not in (signal.SIG_DFL, signal.SIG_IGN)  # the session's handler
    assert signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN


def test_sigusr2_after_the_session_does_not_kill_the_process(tmp_path: Path) -> None:
    """A Preempt racing with the end of training must not kill the post-training work (Slurm: FAILED)."""
    signal.signal(signal.SIGUSR2, signal.SIG_DFL)
    with _session(tmp_path, total_steps=3) as s:
        list(s.steps(0, state_fn=lambda: _state(s.step), samples_per_step=1))
    assert signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN
    os.kill(os.getpid(), signal.SIGUSR2)  # with SIG_DFL this would end the test run
    script = ("import os, signal, sys\n"
              "from nodeagent.jobhelper import JobSession\n"
              f"with JobSession('job-p', '9', {str(tmp_path / 'store2')!r}, None, None, total_steps=2) as s:\n"
              "    list(s.steps(0, state_fn=lambda: {}, samples_per_step=1))\n"
              "os.kill(os.getpid(), signal.SIGUSR2)\n"
              "print('post-processing done', flush=True)\n")
    import subprocess
    import sys

    r = subprocess.run(["env", "--default-signal=USR2", sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "post-processing done" in r.stdout, r.stderr[-1500:]


def test_preempt_at_a_periodic_checkpoint_step_is_decided_alike_on_every_rank(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """state_fn may be collective: a rank other than 0 must skip it exactly when rank 0 does.

    Here: rank 1 of 2 (srun env), periodic checkpoint at step 5, stop requested during step 4. Rank 0 has
    just saved at 5 and does not call state_fn again; rank 1 must not either (it would wait forever in a
    collective rank 0 never joins)."""
    monkeypatch.setenv("SLURM_PROCID", "1")
    monkeypatch.setenv("SLURM_NTASKS", "2")
    calls: list[int] = []

    def state_fn() -> dict:
        calls.append(s.step)
        return _state(s.step)

    with pytest.raises(SystemExit) as e, _session(tmp_path, ckpt_every=5, install_signal=False) as s:
        for step in s.steps(0, state_fn=state_fn, samples_per_step=1):
            if step == 4:
                s.request_stop()
    assert e.value.code == EXIT_PREEMPTED
    assert calls == [5], "state_fn once, for the periodic checkpoint; not again at the preemption"
    assert s.checkpoint_step == 5
    assert LocalFSStore(tmp_path / "store").list("job-h") == [], "only rank 0 writes"


_COLLECTIVE_RANK = """
import datetime, os, sys
import torch, torch.distributed as dist
from nodeagent.jobhelper import JobSession
rank = int(sys.argv[1])
# file rendezvous: no port to pick in advance (a free port found by the test could be taken before rank 0 binds it)
dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=60))
w = torch.zeros(4)
def state_fn():  # like FSDP's full state dict: gathering it is a collective on all ranks
    t = w.clone(); dist.all_reduce(t); return {"w": t}
s = JobSession("coll-job", "local", sys.argv[3], None, None, total_steps=20, ckpt_every=5, profile_steps=0,
               install_signal=False)
with s:
    start, _ = s.resume()
    try:
        for step in s.steps(start, state_fn, samples_per_step=2):
            w += 1
            if step == 4 and rank == 1:
                s.request_stop()  # SIGUSR2 reaches rank 1 just before the periodic checkpoint at step 5
    except SystemExit as e:
        print(f"exit {e.code} checkpoint_step={s.checkpoint_step}", flush=True)
        raise
"""


@pytest.mark.slow
def test_collective_state_fn_two_gloo_ranks_preempted_at_a_checkpoint_step(tmp_path: Path) -> None:
    import subprocess
    import sys

    rdv = str(tmp_path / "rendezvous")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RLSCHED_", "RANK", "WORLD_SIZE", "MASTER_"))}
    procs = [subprocess.Popen([sys.executable, "-c", _COLLECTIVE_RANK, str(r), rdv, str(tmp_path / "store")],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=150)[0])
        except subprocess.TimeoutExpired:
            p.kill()
            outs.append(p.communicate()[0] + "\n<<hung>>")
    assert [p.returncode for p in procs] == [EXIT_PREEMPTED, EXIT_PREEMPTED], [o[-1500:] for o in outs]
    assert all("exit 75 checkpoint_step=5" in o for o in outs), outs
    assert [i.step for i in LocalFSStore(tmp_path / "store").list("coll-job")] == [5]


def test_rank_and_world_size_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(var, raising=False)
    s = _session(tmp_path)
    assert (s.rank, s.world_size) == (0, 1)
    monkeypatch.setenv("SLURM_PROCID", "1")
    monkeypatch.setenv("SLURM_NTASKS", "2")
    assert (s.rank, s.world_size) == (1, 2)
    monkeypatch.setenv("RANK", "3")  # torchrun inside one srun task: its own pair wins
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert (s.rank, s.world_size) == (3, 4)
    monkeypatch.delenv("WORLD_SIZE")
    assert (s.rank, s.world_size) == (3, 4), "never rank >= world size"
    m = s._report_msg(0, 0)
    assert (m.rank, m.world_size) == (3, 4)


def _in_job(tmp_path: Path, slurm_job_id: str) -> SlurmJobs:
    """The agent's view of Slurm and the kernel for a session run in this test process: Slurm job
    ``slurm_job_id`` is this user's, and this process is in its job cgroup (a fake /proc/PID/cgroup: the
    agent registers only processes inside the reported job, and pytest was not started by Slurm)."""
    cg = tmp_path / "proc" / str(os.getpid())
    cg.mkdir(parents=True)
    (cg / "cgroup").write_text(f"0::/system.slice/slurmstepd.scope/job_{slurm_job_id}/step_0/user/task_0\n")
    return SlurmJobs(lambda sid: SlurmJobInfo(sid, os.geteuid(), "RUNNING"), require_cgroup=False,
                     proc=str(tmp_path / "proc"))


def test_second_task_reports_are_accepted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Task 1 of an srun -n 2 job without torch.distributed: its reports must validate."""
    for var in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SLURM_PROCID", "1")
    monkeypatch.setenv("SLURM_NTASKS", "2")
    monkeypatch.setenv("SLURM_JOB_ID", "77")  # the agent reads it from this process's environment
    key = SharedKeyAuthenticator.generate(tmp_path / "k")
    with NodeAgentServer("n1", "127.0.0.1:0", SharedKeyAuthenticator(key), LocalFSStore(tmp_path / "st"),
                         JobTracker(), slurm=_in_job(tmp_path, "77")) as srv:
        s = JobSession("k9", "77", str(tmp_path / "st"), srv.address, SharedKeyAuthenticator(key), total_steps=10)
        with s:
            assert s._reporter is not None and s._reporter.send_now(s._report_msg(0, 0))
        rec = srv.tracker.jobs["k9"]
        assert rec.world_size == 2 and rec.pids == {os.getpid(): 1}


def test_resume_refuses_pickled_objects(tmp_path: Path) -> None:
    """A checkpoint carrying arbitrary pickled objects must not be unpickled (weights_only=True)."""
    buf = io.BytesIO()
    torch.save({"evil": SimpleNamespace(x=1)}, buf)
    LocalFSStore(tmp_path / "store").save("job-h", 3, buf.getvalue())
    with _session(tmp_path) as s, pytest.raises(pickle.UnpicklingError):
        s.resume()


def test_unreachable_agent_does_not_break_training(tmp_path: Path) -> None:
    key = SharedKeyAuthenticator.generate(tmp_path / "k")
    s = JobSession("job-u", "9", LocalFSStore(tmp_path / "store"), "127.0.0.1:1", SharedKeyAuthenticator(key),
                   total_steps=12, report_every=2)
    with s:
        steps = list(s.steps(0, state_fn=lambda: _state(s.step), samples_per_step=1))
    assert steps == list(range(12))
    assert s._reporter is not None and s._reporter.failed >= 1 and s._reporter.sent == 0


def test_reports_reach_agent_and_store_comes_from_agent(tmp_path: Path) -> None:
    key = SharedKeyAuthenticator.generate(tmp_path / "k")
    store = LocalFSStore(tmp_path / "agent-store")
    with NodeAgentServer("n1", "127.0.0.1:0", SharedKeyAuthenticator(key), store, JobTracker(),
                         slurm=_in_job(tmp_path, "31")) as srv:
        s = JobSession("job-r", "31", None, srv.address, SharedKeyAuthenticator(key), model="DLRM",
                       total_steps=10, report_every=1, profile_steps=0)
        with s:
            assert s.store.url == store.url  # no RLSCHED_STORE: asks the agent
            list(s.steps(0, state_fn=lambda: _state(s.step), samples_per_step=8))
        rec = srv.tracker.jobs["job-r"]
        assert (rec.state, rec.step, rec.model, rec.slurm_job_id, rec.last_checkpoint_step) == (
            "finished", 10, "DLRM", "31", 10)
        assert store.latest("job-r").step == 10  # type: ignore[union-attr]


def test_resume_fails_loudly_when_the_store_cannot_be_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store out of reach must not look empty: resuming from step 0 would throw the job's progress away."""
    LocalFSStore(tmp_path / "store").save("job-h", 5, b"not read")

    def eio(*_a: object) -> None:
        raise OSError(5, "Input/output error")

    with _session(tmp_path) as s:
        monkeypatch.setattr(os, "listdir", eio)
        with pytest.raises(StoreUnavailable, match="cannot list"):
            s.resume()
        assert s.step == 0


def test_save_then_resume_roundtrip(tmp_path: Path) -> None:
    with _session(tmp_path) as s:
        s.save(1, {"w": torch.ones(2)})
        step, state = s.resume()
    assert step == 1 and torch.equal(state["w"], torch.ones(2))  # type: ignore[index]


def test_sbatch_example_follows_the_contract() -> None:
    import re
    import subprocess

    f = Path(__file__).resolve().parents[1] / "scripts" / "examples" / "moe_job.sbatch"
    assert subprocess.run(["bash", "-n", str(f)], capture_output=True).returncode == 0
    text = f.read_text()
    directives = dict(re.findall(r"^#SBATCH --([\w-]+)(?:=(\S+))?", text, re.M))
    assert directives["gpus"] == "2"
    assert parse_comment(directives["comment"]) == {"model": "MoE", "samples": "64000"}
    assert "requeue" in directives


def test_resume_removes_what_saves_killed_an_hour_ago_left(tmp_path: Path) -> None:
    """A writer killed mid-save leaves a checkpoint-sized temp file; the next run's resume() removes those
    older than an hour (no writer of this key can still be at work) and nothing else."""
    st = LocalFSStore(tmp_path / "store")
    buf = io.BytesIO()
    torch.save(_state(4), buf)
    st.save("job-h", 4, buf.getvalue())
    d = tmp_path / "store" / "job-h"
    old, fresh = d / f".ckpt-000000000006.bin.tmp-{'a' * 32}", d / f".ckpt-000000000006.json.tmp-{'b' * 32}"
    other = d / ".ckpt-notours.tmp-x"
    for p in (old, fresh, other):
        p.write_bytes(b"partial")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    os.utime(other, (time.time() - 7200, time.time() - 7200))
    with _session(tmp_path) as s:
        start, state = s.resume()
        assert start == 4 and state["w"].tolist() == [4.0] * 3
    assert not old.exists() and fresh.exists() and other.exists()
    assert [i.step for i in st.list("job-h")] == [4]


_ATEXIT_RANK = r"""
import atexit, datetime, sys
import torch, torch.distributed as dist
# registered before the session's hook, so it runs after it (atexit is last in, first out)
atexit.register(lambda: print(f"group alive at exit: {dist.is_initialized()}", flush=True))
from nodeagent.jobhelper import JobSession
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1,
                        timeout=datetime.timedelta(seconds=60))
s = JobSession("exit-job", "local", sys.argv[2], None, None, total_steps=20, ckpt_every=0, profile_steps=0,
               install_signal=False)
with s:
    for step in s.steps(0, lambda: {"w": torch.zeros(2)}, samples_per_step=1):
        if step == 3:
            s.request_stop()
"""


@pytest.mark.slow
def test_preempted_distributed_job_destroys_its_process_group_before_exiting(tmp_path: Path) -> None:
    """A process that exits with its gloo group alive can abort in interpreter teardown (exit -6, not 75,
    so Slurm would not requeue it held); the helper destroys the group in an atexit hook."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RLSCHED_", "RANK", "WORLD_SIZE", "MASTER_"))}
    p = subprocess.run([sys.executable, "-c", _ATEXIT_RANK, str(tmp_path / "rdv"), str(tmp_path / "store")],
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == EXIT_PREEMPTED, p.stdout + p.stderr
    assert "group alive at exit: False" in p.stdout, p.stdout + p.stderr


_SIDE_GROUP_RANK = """
import datetime, sys
import torch, torch.distributed as dist
from nodeagent.jobhelper import JobSession
rank, backend, rdv, store = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4 + int(sys.argv[1])]
dist.init_process_group(backend, init_method="file://" + rdv, rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=60))
s = JobSession("side-job", "local", store, None, None, total_steps=10, profile_steps=0, install_signal=False)
with s:
    try:
        start, _ = s.resume()
    except Exception as e:
        print(f"resume failed: {e}", flush=True)
        # tear the group down before exiting: left to interpreter shutdown, gloo's destructor can abort
        # (SIGABRT) once the peer has gone (pytorch#190489; the job helper's own exit 75 does the same)
        dist.destroy_process_group()
        raise SystemExit(3)
    print(f"start={start} side_group={s._ctl_group is not None}", flush=True)
    try:
        for step in s.steps(start, lambda: {"w": torch.zeros(1)}, samples_per_step=2):
            if step == start + 2 and rank == 1:
                s.request_stop()
    except SystemExit as e:
        print(f"exit {e.code} checkpoint_step={s.checkpoint_step}", flush=True)
        raise
"""


def _two_ranks(tmp_path: Path, backend: str, store0: Path, store1: Path, timeout: float = 60) -> list[tuple[int, str]]:
    import subprocess
    import sys

    rdv = str(tmp_path / f"rdv-{time.monotonic_ns()}")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RLSCHED_", "RANK", "WORLD_SIZE", "MASTER_"))}
    procs = [subprocess.Popen([sys.executable, "-c", _SIDE_GROUP_RANK, str(r), backend, rdv, str(store0), str(store1)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
    res = []
    for p in procs:
        try:
            res.append((p.wait(timeout=timeout), p.communicate()[0]))
        except subprocess.TimeoutExpired:
            p.kill()
            res.append((-9, p.communicate()[0] + "\n<<hung>>"))
    return res


@pytest.mark.slow
def test_stop_vote_runs_on_a_gloo_side_group_when_the_default_group_has_no_cpu_backend(tmp_path: Path) -> None:
    """``nccl`` registers a backend for cuda tensors only; the stop flag is a CPU tensor. "cuda:gloo" is the
    CPU-only stand-in for it: without the side group, the vote raised "No backend type associated with
    device type cpu" at step 0."""
    store = tmp_path / "store"
    res = _two_ranks(tmp_path, "cuda:gloo", store, store)
    assert [rc for rc, _ in res] == [EXIT_PREEMPTED] * 2, [o[-1500:] for _, o in res]
    assert all("start=0 side_group=True" in o and "exit 75 checkpoint_step=3" in o for _, o in res), res
    res = _two_ranks(tmp_path, "gloo", store, store)  # resumes at 3; gloo handles CPU: no side group
    assert [rc for rc, _ in res] == [EXIT_PREEMPTED] * 2, [o[-1500:] for _, o in res]
    assert all("start=3 side_group=False" in o and "exit 75 checkpoint_step=6" in o for _, o in res), res


@pytest.mark.slow
def test_ranks_resume_the_step_rank_0_chose_or_all_fail_fast(tmp_path: Path) -> None:
    """Rank 1's store view lacks the checkpoint rank 0 resumes from (node-local store, stale NFS cache):
    resuming at different steps would hang the job; instead both ranks fail, naming step and store."""
    a, b = tmp_path / "a", tmp_path / "b"
    LocalFSStore(a).save("side-job", 7, _ckpt_bytes({"w": torch.zeros(1)}))
    LocalFSStore(b).save("side-job", 3, _ckpt_bytes({"w": torch.zeros(1)}))  # older: must not be picked either
    t = time.monotonic()
    res = _two_ranks(tmp_path, "gloo", a, b, timeout=90)
    assert time.monotonic() - t < 60, "no hang"
    assert [rc for rc, _ in res] == [3, 3], [o[-1500:] for _, o in res]
    assert "another rank could not load checkpoint step 7" in res[0][1], res[0][1][-1500:]
    assert "rank 1 cannot load checkpoint step 7" in res[1][1] and str(b) in res[1][1], res[1][1][-1500:]
    LocalFSStore(b).save("side-job", 7, _ckpt_bytes({"w": torch.zeros(1)}))  # same bytes: same sha256
    res = _two_ranks(tmp_path, "gloo", a, b)
    assert all("start=7 " in o for _, o in res), [o[-1500:] for _, o in res]


def _ckpt_bytes(state: dict) -> bytes:
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chown)")
def test_root_job_does_not_resume_a_checkpoint_another_user_planted(tmp_path: Path) -> None:
    """In a shared (1777) store another user can create ``slurm-4242/`` before root's job 4242 runs: the
    helper must not load it (it would be torch.load-ed into root's job), but say whose it is."""
    from nodeagent.store import StoreNotOwner

    root = tmp_path / "store"
    LocalFSStore(root, owner_uid=None).save("slurm-4242", 999, _ckpt_bytes({"w": torch.ones(1)}))
    root.chmod(0o1777)
    for dirpath, _dirs, files in os.walk(root / "slurm-4242"):
        for name in [dirpath, *(os.path.join(dirpath, f) for f in files)]:
            os.chown(name, 54321, 54321)
    s = JobSession.from_env({"SLURM_JOB_ID": "4242", "RLSCHED_STORE": str(root), "RLSCHED_AGENT": "none",
                             "RLSCHED_COMMENT": ""}, total_steps=5, install_signal=False)
    with s, pytest.raises(StoreNotOwner, match="belongs to uid 54321, not to uid 0"):
        s.resume()
    assert s.checkpoint_step == -1


def test_the_preemption_save_leaves_pruning_to_the_resumed_run(tmp_path: Path) -> None:
    """Pruning reads back the checkpoints it keeps: the preemption save skips it (the job exits sooner),
    so three checkpoints stay until the resumed run's first save prunes to two again."""
    with pytest.raises(SystemExit), _session(tmp_path, ckpt_every=3) as s:
        for step in s.steps(0, state_fn=lambda: _state(s.step), samples_per_step=1):
            if step == 7:
                s.request_stop()
    st = LocalFSStore(tmp_path / "store")
    assert [i.step for i in st.list("job-h")] == [3, 6, 8]
    with _session(tmp_path, ckpt_every=3, total_steps=10) as s2:
        start, _ = s2.resume()
        list(s2.steps(start, state_fn=lambda: _state(s2.step), samples_per_step=1))
    assert [i.step for i in st.list("job-h")][-2:] == [9, 10] and len(st.list("job-h")) == 2
