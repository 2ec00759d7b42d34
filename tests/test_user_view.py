"""What users and admins see of the controller, without Slurm daemons: held jobs' reasons in their
AdminComment (batched, only when changed), the capacity file job_submit.lua reads, and the rotating
controller log. The same against real slurmctld: tests/test_slurm_integration.py."""

from __future__ import annotations

import json
import logging
import threading

import pytest

from controller.metrics import setup_logging
from controller.slurm import SlurmError, queue_position, with_reason
from tests.test_controller import FakeSlurm, _ctl


class ReasonSlurm(FakeSlurm):
    """FakeSlurm that also takes AdminComment updates (``SlurmCLI.set_admin_comment``)."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.comment_calls: list[tuple[list[int], str]] = []
        self.fail_comments = False

    def set_admin_comment(self, job_ids, text):
        if self.fail_comments:
            raise SlurmError(["scontrol", "update"], "exit status 1: Unable to contact slurm controller")
        self.comment_calls.append((list(job_ids), text))
        for j in job_ids:
            self.job_list[j].admin_comment = text


def test_queue_position_is_exact_up_to_ten_then_banded():
    assert queue_position(3, 7) == "position 3 of 7"
    assert queue_position(10, 10) == "position 10 of 10"
    assert queue_position(11, 12) == "position 11-20 of more than 10"
    assert queue_position(34, 34) == "position 21-50 of more than 20"
    assert queue_position(51, 1000) == "position 51-100 of more than 500"
    assert queue_position(1001, 1500) == "position 1001-2000 of more than 1000"
    with pytest.raises(ValueError):
        queue_position(8, 7)
    assert with_reason("rlsched:managed gpus=4 | rlsched: old", "rlsched: new") == "rlsched:managed gpus=4 | rlsched: new"
    assert with_reason("rlsched:managed gpus=4 | rlsched: old", "") == "rlsched:managed gpus=4"


def test_held_jobs_get_their_position_then_placed_and_only_changes_are_written(tmp_path):
    s = ReasonSlurm(nodes=1, gpus=8)
    big = s.submit(8, "rlsched:model=MoE")
    small = [s.submit(8, "rlsched:model=GNN") for _ in range(2)]
    never = s.submit(64, "rlsched:model=LM")
    ctl = _ctl(tmp_path, s)
    rep = ctl.round()
    assert rep.ok, rep.error
    assert [j for j, _ in rep.placed] == [big]
    comments = {j: s.job_list[j].admin_comment for j in s.job_list}
    assert comments[big] == "rlsched:managed gpus=8 | rlsched: placed"
    assert comments[small[0]] == "rlsched:managed gpus=8 | rlsched: waiting for placement, position 1 of 2"
    assert comments[small[1]] == "rlsched:managed gpus=8 | rlsched: waiting for placement, position 2 of 2"
    assert comments[never] == "rlsched:managed gpus=64 | rlsched: can never start: asks for 64 GPUs, the partition has 8"
    assert rep.reasons == 4 and len(s.comment_calls) == 4
    # nothing changed: nothing written
    s.comment_calls.clear()
    rep = ctl.round()
    assert rep.ok and rep.reasons == 0 and s.comment_calls == []
    # the first one starts and ends; the queue moves up by one: only the two held jobs are rewritten
    s.schedule()
    s.finish(big)
    rep = ctl.round()
    assert [j for j, _ in rep.placed] == [small[0]]
    assert s.job_list[small[1]].admin_comment.endswith("position 1 of 1")
    assert s.job_list[small[0]].admin_comment.endswith("rlsched: placed")
    assert sorted(j for ids, _ in s.comment_calls for j in ids) == sorted(small)


def test_same_texts_share_one_call_and_calls_per_round_are_capped(tmp_path):
    s = ReasonSlurm(nodes=1, gpus=8)
    s.submit(8)  # placed at once
    held = [s.submit(8) for _ in range(30)]  # positions 1..30 of 30
    ctl = _ctl(tmp_path, s, reason_updates_per_round=12)
    rep = ctl.round()
    assert rep.ok, rep.error
    # 10 exact head positions, then the running job, then one call for positions 11-20 (same text)
    assert len(s.comment_calls) == 12
    assert [len(ids) for ids, _ in s.comment_calls] == [1] * 11 + [10]
    assert s.comment_calls[11][0] == held[10:20]
    assert s.comment_calls[11][1].endswith("position 11-20 of more than 20")
    # the rest (21-50) follows in the next round
    s.comment_calls.clear()
    ctl.round()
    assert [ids for ids, _ in s.comment_calls] == [held[20:]]


def test_failed_reason_write_keeps_the_round_ok_and_dry_run_writes_none(tmp_path):
    s = ReasonSlurm(nodes=1, gpus=8)
    s.submit(16)
    s.submit(16)
    s.fail_comments = True
    ctl = _ctl(tmp_path, s)
    rep = ctl.round()
    assert rep.ok and rep.reasons == 0
    assert ctl.metrics.value("rlsched_slurm_errors_total") == 1  # one failed call ends the round's updates
    s.fail_comments = False
    off = _ctl(tmp_path / "b", s, reason_updates_per_round=0)
    assert off.round().ok and s.comment_calls == []
    dry = _ctl(tmp_path / "c", s, dry_run=True)
    assert dry.round().ok and s.comment_calls == []


class SideBySideSlurm(ReasonSlurm):
    """ReasonSlurm with ``set_admin_comments`` (as SlurmCLI has): the controller writes reasons behind the round.
    Each call waits for ``gate`` and records the thread it ran in."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.gate = threading.Event()
        self.threads: set[str] = set()

    def set_admin_comments(self, groups, workers=8):
        self.gate.wait(10)
        self.threads.add(threading.current_thread().name)
        out = []
        for text, ids in groups:
            try:
                self.set_admin_comment(ids, text)
                out.append(None)
            except SlurmError as exc:
                out.append(exc)
        return out


def test_reasons_are_written_behind_the_round_and_waited_for_before_the_next(tmp_path):
    s = SideBySideSlurm(nodes=1, gpus=8)
    big = s.submit(8, "rlsched:model=MoE")
    small = [s.submit(8, "rlsched:model=GNN") for _ in range(2)]
    ctl = _ctl(tmp_path, s)
    rep = ctl.round()  # returns with its placements applied, its reason writes still held at the gate
    assert rep.ok and [j for j, _ in rep.placed] == [big]
    assert s.comment_calls == [] and rep.reasons == 0
    # the next round waits for them before anything else
    threading.Timer(0.2, s.gate.set).start()
    rep2 = ctl.round()
    assert rep2.ok and rep.reasons == 3 and threading.current_thread().name not in s.threads
    assert s.job_list[small[1]].admin_comment.endswith("position 2 of 2")
    # a failed write is logged and counted, and its jobs keep their text
    s.schedule()
    s.finish(big)
    s.fail_comments = True
    rep3 = ctl.round()
    assert [j for j, _ in rep3.placed] == [small[0]]
    ctl.wait_reasons()
    assert rep3.ok and rep3.reasons == 0 and ctl.metrics.value("rlsched_slurm_errors_total") == 2
    assert s.job_list[small[1]].admin_comment.endswith("position 2 of 2")


def test_capacity_file_for_job_submit_lua_is_written_when_it_changes(tmp_path):
    s = ReasonSlurm(nodes=4, gpus=8)
    ctl = _ctl(tmp_path, s)
    assert ctl.round().ok
    f = tmp_path / "state" / "capacity"
    lines = dict(line.split("=", 1) for line in f.read_text().splitlines() if not line.startswith("#"))
    assert lines == {"partition": "gpu", "gpus": "32", "nodes": "4", "max_node_gpus": "8"}
    assert f.stat().st_mode & 0o777 == 0o644
    mtime = f.stat().st_mtime_ns
    assert ctl.round().ok and f.stat().st_mtime_ns == mtime  # unchanged: not rewritten
    own = tmp_path / "cap"
    ctl2 = _ctl(tmp_path / "b", s, capacity_file=str(own))
    assert ctl2.round().ok and "gpus=32" in own.read_text()


def test_controller_log_rotates_at_the_configured_size(tmp_path):
    log_file = tmp_path / "controller.log"
    root = logging.getLogger("controller")
    saved = list(root.handlers), root.propagate, root.level
    try:
        setup_logging(str(log_file), max_bytes=2000, backups=2)
        for h in root.handlers:  # keep stderr quiet: only the file handler writes
            if not hasattr(h, "baseFilename"):
                h.setLevel(logging.CRITICAL)
        lg = logging.getLogger("controller.test")
        for i in range(100):
            lg.info("line %d %s", i, "x" * 50, extra={"event": "test"})
        files = sorted(p.name for p in tmp_path.iterdir())
        assert files == ["controller.log", "controller.log.1", "controller.log.2"]
        for p in tmp_path.iterdir():
            assert p.stat().st_size <= 2000
            for line in p.read_text().splitlines():
                assert json.loads(line)["event"] == "test"
        assert "line 99 " in log_file.read_text()
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
            h.close()
        for h in saved[0]:
            root.addHandler(h)
        root.propagate, root.level = saved[1], saved[2]


def test_log_rotation_settings_are_checked(tmp_path):
    from controller.config import ConfigError, parse_config

    doc = {"controller": {"state_dir": str(tmp_path), "log_max_bytes": -1}}
    with pytest.raises(ConfigError, match="log_max_bytes: must be >= 0"):
        parse_config(doc)
    cfg = parse_config({"controller": {"state_dir": str(tmp_path), "log_max_bytes": 4096, "log_backups": 3}})
    assert (cfg.controller.log_max_bytes, cfg.controller.log_backups) == (4096, 3)
