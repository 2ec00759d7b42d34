"""Tests for nodeagent.jobhelper and nodeagent.convention (in-process, torch on CPU)."""

from __future__ import annotations

import io
import os
import pickle
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from nodeagent.auth import SharedKeyAuthenticator
from nodeagent.convention import CommentError, job_key_for, parse_comment
from nodeagent.jobhelper import (
    EXIT_PREEMPTED,
    JobSession,
    comm_fraction_from_events,
    resolve_agent_address,
)
from nodeagent.server import JobTracker, NodeAgentServer
from nodeagent.store import LocalFSStore, StoreUnavailable

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
    before = signal.getsignal(signal.SIGUSR2)
    with _session(tmp_path):
        assert signal.getsignal(signal.SIGUSR2) != before
    assert signal.getsignal(signal.SIGUSR2) == before


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
    with NodeAgentServer("n1", "127.0.0.1:0", SharedKeyAuthenticator(key), store, JobTracker()) as srv:
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
