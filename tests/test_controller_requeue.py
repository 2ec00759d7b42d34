"""The controller's requeue -> pin -> release sequence against a Slurm that finishes a requeue late.

slurmctld 22.05 requeues a running job in two steps (``_job_requeue_op``, ``batch_requeue_fini``): at once
it is held (priority 0) but still ``COMPLETING`` (squeue prints that flag before the base state
``PENDING``) until every node reported the run's end; only then is it ``PENDING``, and its begin time, if
past, becomes now + the credential lifetime. On a loaded host that takes seconds. :class:`LateRequeueSlurm`
is the in-memory fake of tests/test_controller.py with that step: a requeued job stays ``COMPLETING``
for ``completing_reads`` queue reads. A resize or a move released in that window was seen as an ended job
by the next round (its journal entry dropped), then as a job pending without a hold that rlsched never
released, held again and placed elsewhere (tests/test_resize_slurm.py, under load). The same sequence
against real daemons: tests/test_resize_slurm.py.
"""

from __future__ import annotations

import logging

import pytest

import controller.daemon as daemon
from controller.slurm import SlurmError, managed_gpus
from policies.base import Policy
from policies.cluster import Placement
from policies.state import ClusterState, Decision
from tests.test_controller import FakeAgents, _ctl
from tests.test_resize import Resize, ResizingSlurm, _running


class LateRequeueSlurm(ResizingSlurm):
    """A requeued job shows ``COMPLETING`` (held, its GPUs still taken) for ``completing_reads`` reads of the
    queue, then ``PENDING``; a release made before that loses the job's start time (Slurm resets a past
    begin time at the end of the run), so it does not start. ``exits_first``: the job has already exited
    75 when the controller asks (``RequeueExitHold`` requeued it held): ``requeuehold`` is refused."""

    def __init__(self, completing_reads: int = 2, exits_first: bool = False) -> None:
        super().__init__()
        self.completing_reads = completing_reads
        self.exits_first = exits_first
        self.left: dict[int, int] = {}  # job id -> reads it still shows COMPLETING
        self.released_completing: set[int] = set()
        self.states_at_release: list[str] = []

    def _tick(self) -> None:
        for jid, n in list(self.left.items()):
            if n > 0:
                self.left[jid] = n - 1
                continue
            del self.left[jid]
            j = self.job_list[jid]
            self.finish(jid, "PENDING")  # the run is over: GPUs free, nodes cleared
            j.state = "PENDING"

    def jobs(self):
        self._tick()
        return super().jobs()

    def job(self, job_id):
        self._tick()
        return super().job(job_id)

    def requeue(self, jid: int) -> None:
        """What slurmctld does at once on a requeue (the job's own exit 75, or ``requeuehold``)."""
        j = self.job_list[jid]
        j.state, j.priority, j.reason, j.restarts = "COMPLETING", 0, "JobHeldUser", j.restarts + 1
        self.left[jid] = self.completing_reads

    def requeue_hold(self, job_id):
        self._call("requeue_hold", job_id)
        j = self.job_list[job_id]
        if self.exits_first and j.state == "RUNNING":
            self.requeue(job_id)  # exit 75 after the checkpoint, before the controller's request
        if j.state != "RUNNING":
            raise SlurmError(["scontrol", "requeuehold"], "exit status 1: Job is pending execution")
        self.requeue(job_id)

    def release(self, job_id, delay_s=0):
        self.states_at_release.append(self.job_list[job_id].state)
        if self.job_list[job_id].state == "COMPLETING":
            self.released_completing.add(job_id)
        super().release(job_id, delay_s)

    def schedule(self, now: float = 2000.0) -> None:
        """As the fake's, but a job released while COMPLETING waits (its start time was reset)."""
        waiting = {jid: self.job_list.pop(jid) for jid in self.released_completing}
        try:
            super().schedule(now)
        finally:
            self.job_list.update(waiting)


@pytest.fixture(autouse=True)
def _fast_polls(monkeypatch):
    monkeypatch.setattr(daemon, "_REQUEUE_POLL_S", 0.0)


@pytest.mark.parametrize("exits_first", [False, True], ids=["requeuehold", "exit75-first"])
def test_a_resize_waits_for_slurm_to_finish_the_requeue_then_pins_and_releases(tmp_path, exits_first):
    s = LateRequeueSlurm(completing_reads=3, exits_first=exits_first)
    jid = _running(s, 2, "rlsched:model=MoE,min_gpus=1,max_gpus=8")
    ctl = _ctl(tmp_path, s, FakeAgents())
    assert ctl.round().ok
    ctl.policy = Resize(Placement.of({0: 2, 1: 2}))
    rep = ctl.round()
    assert rep.ok and rep.preempted == [jid] and dict(rep.placed) == {jid: {"node1": 2, "node2": 2}}, rep
    # released only once Slurm showed it pending and held (never while it was COMPLETING)
    assert s.states_at_release == ["PENDING"] and not s.released_completing
    names = [c[0] for c in s.calls]
    assert names.count("job") >= 4 and names.index("place") > names.index("requeue_hold")
    j = s.job_list[jid]
    assert managed_gpus(j.admin_comment) == 4 and j.restarts == 1
    assert ctl.journal["preempting"] == {} and str(jid) in ctl.journal["released"]
    s.schedule()
    assert j.state == "RUNNING" and j.gpus_per_node == {"node1": 2, "node2": 2}
    for _ in range(3):
        assert ctl.round().ok
    assert ctl.metrics.value("rlsched_decisions_total", action="rehold") == 0
    assert ctl.metrics.value("rlsched_decisions_total", action="hold_back") == 0
    assert "hold" not in [c[0] for c in s.calls]
    assert j.state == "RUNNING" and j.gpus_per_node == {"node1": 2, "node2": 2} and j.restarts == 1


def test_a_requeue_slurm_has_not_finished_in_time_is_placed_by_a_later_round(tmp_path, monkeypatch, caplog):
    s = LateRequeueSlurm(completing_reads=4)
    jid = _running(s, 2, "rlsched:model=MoE,min_gpus=1,max_gpus=8")
    t = [2000.0]

    class SlowAgents(FakeAgents):
        def checkpoint(self, job, timeout_s):  # the checkpoint takes the round's preemption time
            t[0] += 1000.0
            return super().checkpoint(job, timeout_s)

    ctl = _ctl(tmp_path, s, SlowAgents())
    ctl.clock = lambda: t[0]
    assert ctl.round().ok
    monkeypatch.setattr(daemon, "_REQUEUE_WAIT_MIN_S", 0.0)
    ctl.policy = Resize(Placement.of({0: 2, 1: 2}))
    with caplog.at_level(logging.WARNING, logger="controller.daemon"):
        rep = ctl.round()
    assert rep.ok and rep.preempted == [jid] and rep.placed == [], rep
    assert "still finishes its last run" in caplog.text
    j = s.job_list[jid]
    # held at its new size, not released; no journal entry that would make it a released job
    assert j.priority == 0 and managed_gpus(j.admin_comment) == 4 and "release" not in [c[0] for c in s.calls]
    assert str(jid) not in ctl.journal["released"]
    for _ in range(6):  # Slurm finishes the requeue; the policy sees a held 4-GPU job (Resize places none)
        assert ctl.round().ok
    assert j.state == "PENDING" and j.held and ctl.metrics.value("rlsched_decisions_total", action="rehold") == 0


def test_a_job_released_while_completing_keeps_its_release(tmp_path):
    """A release Slurm took while the job's last run was completing (made by hand, or by an older controller):
    the rounds that see it COMPLETING keep its journal entry and restart its start grace, so once pending it
    is a released job waiting to start, not one to hold again."""
    s = LateRequeueSlurm(completing_reads=2)
    jid = _running(s, 2, "rlsched:model=MoE")
    t = [2000.0]
    ctl = _ctl(tmp_path, s, FakeAgents(), start_grace_s=30.0)
    ctl.clock = lambda: t[0]
    assert ctl.round().ok
    s.requeue(jid)
    s.place(jid, ["node2"], 2)
    ctl.journal["released"][str(jid)] = {"t": t[0], "plan_by_name": {"node2": 2}}
    s.release(jid)
    t[0] += 25.0
    assert ctl.round().ok and s.job_list[jid].state == "COMPLETING"
    assert ctl.journal["released"][str(jid)]["t"] == t[0]  # its grace restarted
    t[0] += 25.0
    for _ in range(3):
        assert ctl.round().ok
    j = s.job_list[jid]
    assert j.state == "PENDING" and not j.held and str(jid) in ctl.journal["released"]
    assert "hold" not in [c[0] for c in s.calls]
    assert ctl.metrics.value("rlsched_decisions_total", action="rehold") == 0


class MoveOnce(Policy):
    """Moves the running job off node1 to ``alloc`` (preempt and place in one decision)."""

    name = "move-once"
    moves = True

    def __init__(self, alloc) -> None:
        self.alloc = alloc

    def schedule(self, state: ClusterState) -> Decision:
        on1 = [j.job_id for j in state.running if j.placement is not None and 0 in dict(j.placement.alloc)]
        return Decision(preempt=on1, place=[(jid, self.alloc) for jid in on1])


def test_a_move_is_released_only_once_slurm_has_finished_the_requeue(tmp_path):
    s = LateRequeueSlurm(completing_reads=2)
    jid = _running(s, 2, "rlsched:model=MoE")
    ctl = _ctl(tmp_path, s, FakeAgents())
    assert ctl.round().ok
    ctl.policy = MoveOnce(Placement.of({2: 2}))
    rep = ctl.round()
    assert rep.ok and rep.preempted == [jid] and dict(rep.placed) == {jid: {"node3": 2}}, rep
    assert s.states_at_release == ["PENDING"]
    s.schedule()
    for _ in range(3):
        assert ctl.round().ok
    j = s.job_list[jid]
    assert j.state == "RUNNING" and j.gpus_per_node == {"node3": 2} and j.restarts == 1
    assert ctl.metrics.value("rlsched_decisions_total", action="rehold") == 0
