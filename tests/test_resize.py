"""Live resize without Slurm daemons: the Slurm backend's resize path over the in-memory FakeSlurm,
the elastic range read from a job's comment, the pin's task count, and the job helper's data-parallel
plan, launcher and checkpoint record. The same path against real slurmctld / slurmd and a real
PyTorch job: tests/test_resize_slurm.py."""

from __future__ import annotations

import logging

import pytest

from controller.backend import _with_gpus
from controller.slurm import SlurmCLI, managed_gpus
from controller.state import elastic_range
from nodeagent.jobhelper import (ELASTIC_KEY, DataParallelPlan, JobSession, allocation_world_size, srun_command,
                                 tasks_per_node)
from nodeagent.store import LocalFSStore
from policies.base import Policy
from policies.cluster import Placement
from policies.elastic import ElasticPlacement
from policies.state import ClusterState, Decision
from tests.test_controller import FakeAgents, FakeSlurm, _ctl


class ResizingSlurm(FakeSlurm):
    """FakeSlurm whose pins take a new GPU total and task count (what a resize writes)."""

    def __init__(self) -> None:
        super().__init__()
        self.tasks: dict[int, int | None] = {}

    def place(self, job_id, nodes, gpus=None, per_node=None, tres_style="gres:gpu", delay_s=0, tasks=None):
        self._call("place", job_id, list(nodes))
        j = self.job_list[job_id]
        assert gpus == managed_gpus(j.admin_comment), "the AdminComment mark is written before the pin"
        j.gpus = gpus
        j.required_nodes, j.num_nodes, self.per_node[job_id] = list(nodes), len(nodes), per_node
        self.tasks[job_id] = tasks

    def set_admin_comment(self, job_ids, text):
        self._call("set_admin_comment", list(job_ids), text)
        for j in job_ids:
            self.job_list[j].admin_comment = text
            self.job_list[j].gpus = managed_gpus(text) or self.job_list[j].gpus


class Resize(Policy):
    """Resizes every running elastic job to ``alloc``; places nothing."""

    name = "resize-to"
    resizes = True

    def __init__(self, alloc) -> None:
        self.alloc = alloc

    def schedule(self, state: ClusterState) -> Decision:
        return Decision(resize=[(j.job_id, self.alloc) for j in state.running if j.elastic
                                and j.placement is not None and j.placement.total_gpus != self.alloc.total_gpus])


def _running(s: FakeSlurm, gpus: int, comment: str) -> int:
    jid = s.submit(gpus, comment)
    j = s.job_list[jid]
    j.required_nodes, j.priority = ["node1"], 1
    s.schedule()
    assert j.state == "RUNNING"
    return jid


def _controller(tmp_path, s, policy):
    ctl = _ctl(tmp_path, s, FakeAgents())
    assert ctl.round().ok
    ctl.policy = policy
    return ctl


def test_a_resize_is_checkpoint_requeue_and_a_pin_at_the_new_size(tmp_path):
    s = ResizingSlurm()
    jid = _running(s, 2, "rlsched:model=MoE,min_gpus=1,max_gpus=8")
    ctl = _controller(tmp_path, s, Resize(Placement.of({0: 2, 1: 2})))
    k = len(s.calls)
    rep = ctl.round()
    assert rep.ok and rep.preempted == [jid], rep
    assert dict(rep.placed) == {jid: {"node1": 2, "node2": 2}}
    names = [c[0] for c in s.calls[k:]]
    # checkpoint + requeue held, then the new GPU count, then the pin, then the release
    order = [names.index(n) for n in ("requeue_hold", "set_admin_comment", "place", "release")]
    assert order == sorted(order), names
    j = s.job_list[jid]
    assert j.admin_comment.startswith("rlsched:managed gpus=4") and j.gpus == 4
    assert s.tasks[jid] == 4 and s.per_node[jid] == 2 and s.delays[jid] > 0  # requeue_settle_s
    assert ctl.metrics.value("rlsched_decisions_total", action="resize") == 1
    s.schedule()
    assert j.state == "RUNNING" and j.gpus_per_node == {"node1": 2, "node2": 2}
    # the next rounds read it at its new size and leave it there
    assert ctl.round().ok and ctl.round().ok
    assert s.job_list[jid].gpus == 4 and s.job_list[jid].restarts == 1


def test_resizes_that_cannot_be_made_are_rejected_and_the_job_keeps_running(tmp_path, caplog):
    s = ResizingSlurm()
    plain = _running(s, 2, "rlsched:model=MoE")  # not elastic
    ctl = _controller(tmp_path, s, Resize(Placement.of({0: 4})))
    ctl.policy = type("Always", (Policy,), {"name": "always", "resizes": True, "schedule": lambda self, st: Decision(
        resize=[(str(plain), Placement.of({0: 4}))])})()
    with caplog.at_level(logging.WARNING, logger="controller.daemon"):
        assert ctl.round().ok
    assert "not elastic" in caplog.text and s.job_list[plain].state == "RUNNING"
    s.finish(plain)
    # a resize with parameter servers: PS jobs are simulation-only live
    e = _running(s, 2, "rlsched:model=MoE,min_gpus=1,max_gpus=8")
    ctl.policy = Resize(ElasticPlacement.make({0: 4}, 1))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="controller.daemon"):
        assert ctl.round().ok
    assert "rejected resize" in caplog.text and s.job_list[e].state == "RUNNING"
    # a resize to where it runs would only restart it
    ctl.policy = type("Same", (Policy,), {"name": "same", "resizes": True, "schedule": lambda self, st: Decision(
        resize=[(str(e), Placement.of({0: 2}))])})()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="controller.daemon"):
        assert ctl.round().ok
    assert "already runs on that placement" in caplog.text and s.job_list[e].restarts == 0
    # an adapter that cannot rewrite the GPU count (the twin's) cannot resize
    plain_slurm = FakeSlurm()
    e2 = _running(plain_slurm, 2, "rlsched:model=MoE,min_gpus=1,max_gpus=8")
    ctl2 = _controller(tmp_path / "b", plain_slurm, Resize(Placement.of({0: 4})))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="controller.daemon"):
        assert ctl2.round().ok
    assert "cannot resize" in caplog.text and plain_slurm.job_list[e2].state == "RUNNING"
    assert not any(c[0] == "requeue_hold" for c in plain_slurm.calls)


def test_a_failed_checkpoint_rejects_the_resize(tmp_path, caplog):
    s = ResizingSlurm()
    jid = _running(s, 2, "rlsched:model=MoE,min_gpus=1,max_gpus=8")
    ctl = _ctl(tmp_path, s, FakeAgents(reachable=False))
    assert ctl.round().ok
    ctl.policy = Resize(Placement.of({0: 4}))
    with caplog.at_level(logging.WARNING, logger="controller.daemon"):
        rep = ctl.round()
    assert rep.ok and rep.preempted == [] and rep.placed == []
    assert "keeps running at its size" in caplog.text
    j = s.job_list[jid]
    assert j.state == "RUNNING" and j.gpus == 2 and managed_gpus(j.admin_comment) == 2


def test_elastic_range_from_the_comment():
    assert elastic_range((("min_gpus", "1"), ("max_gpus", "4")), 2, 32) == (1, 4, None)
    assert elastic_range((("min_gpus", "1"), ("max_gpus", "64")), 2, 32) == (1, 32, None)  # cut to the partition
    assert elastic_range((), 2, 32) == (None, None, None)
    for opts, why in (((("min_gpus", "1"),), "go together"), ((("min_gpus", "a"), ("max_gpus", "4")), "integers"),
                      ((("min_gpus", "3"), ("max_gpus", "4")), "1 <= min_gpus <= GPUs (2)")):
        lo, hi, problem = elastic_range(opts, 2, 32)
        assert (lo, hi) == (None, None) and why in problem


def test_pin_sets_tasks_and_cpus_only_for_a_resize():
    base = SlurmCLI.pin_args(7, ["node3"], 1)
    assert not any(a.startswith(("NumTasks=", "NumCPUs=")) for a in base)
    args = SlurmCLI.pin_args(7, ["node1", "node2"], 4, per_node=2, tasks=4)
    assert "NumTasks=4" in args and "NumCPUs=4" in args and "NumNodes=2" in args and "TresPerNode=gres:gpu:2" in args
    assert _with_gpus("rlsched:managed gpus=2 | rlsched: placed", 4) == "rlsched:managed gpus=4 | rlsched: placed"


# --------------------------------------------------------------------------- job helper
def test_data_parallel_plan_keeps_the_global_batch():
    seen = []
    for w in (2, 4, 1):
        plans = [DataParallelPlan(24, w, r) for r in range(w)]
        assert {p.per_worker for p in plans} == {24 // w}
        # the ranks of one step cover the step's samples exactly once, in order
        seen.append([i for p in plans for i in p.samples(5)])
    assert seen[0] == seen[1] == seen[2] == list(range(5 * 24, 6 * 24))
    assert DataParallelPlan(24, 4, 0).position(10) == 240
    with pytest.raises(ValueError, match="not a multiple of the world size 5"):
        DataParallelPlan(24, 5, 0)
    with pytest.raises(ValueError, match="outside world size"):
        DataParallelPlan(24, 2, 2)


def test_launcher_counts_the_current_allocation_not_the_submission():
    assert tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    with pytest.raises(ValueError, match="SLURM_TASKS_PER_NODE"):
        tasks_per_node("2(y3)")
    # submitted with 2 tasks and 2 GPUs, requeued at 4: sbatch's stored environment still says 2
    env = {"SLURM_NTASKS": "2", "SLURM_NPROCS": "2", "SLURM_GPUS": "2", "SLURM_TASKS_PER_NODE": "3,1"}
    assert allocation_world_size(env) == 4
    cmd, run_env = srun_command(["python", "job.py"], env)
    assert cmd[:2] == ["srun", "--ntasks=4"] and cmd[-2:] == ["python", "job.py"]
    assert run_env["SLURM_NTASKS"] == run_env["SLURM_NPROCS"] == "4" and "SLURM_GPUS" not in run_env
    assert allocation_world_size({"SLURM_NTASKS": "3"}) == 3


def test_checkpoint_records_the_global_batch_and_a_resumed_run_checks_it(tmp_path):
    torch = pytest.importorskip("torch")
    store = LocalFSStore(str(tmp_path / "store"))
    kw = dict(store=store, agent_address=None, total_steps=6, profile_steps=0, install_signal=False)
    with JobSession("e1", "1", global_batch=24, **kw) as s:
        assert list(s.steps(0, state_fn=lambda: {"w": torch.zeros(2)})) == list(range(6))
        assert s._samples == 6 * 24
    with JobSession("e1", "1", global_batch=24, **{**kw, "total_steps": 8}) as s2:
        step, state = s2.resume()
        assert step == 6 and ELASTIC_KEY not in state and set(state) == {"w"}
        assert s2.resumed_world_size == 1 and s2.plan.position(step) == 144
    with JobSession("e1", "1", global_batch=32, **kw) as s3:
        with pytest.raises(ValueError, match="global batch 24, this run asks for 32"):
            s3.resume()
