"""controller.{config,state,daemon,preemption,metrics,cli} without Slurm daemons.

Slurm is replaced here by :class:`FakeSlurm`, an in-memory stand-in with the
adapter's interface, so the daemon's decision logic (placement, crash
recovery, preemption bookkeeping, error handling) is tested fast and
deterministically. The same behaviours against real slurmctld/slurmd are in
tests/test_slurm_integration.py.
"""

from __future__ import annotations

import json
import logging
import socket
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from controller.config import ConfigError, load_config, parse_config
from controller.daemon import Controller, Journal, make_policy
from controller.metrics import JsonFormatter
from controller.preemption import AgentPreempter, NoAgents, PreemptOutcome
from controller.slurm import SlurmError, SlurmJob, SlurmNode
from controller.state import build_cluster, build_state, parse_comment
from policies.base import PolicyError
from policies.cluster import ClusterSpec, Placement
from policies.resources import ResourceDemand
from policies.state import Decision
from policies.validate import check_decision
from policies.perf import ContentionModel

REPO = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- fakes
class FakeSlurm:
    """In-memory Slurm with the SlurmCLI interface (see module docstring)."""

    def __init__(self, nodes: int = 4, gpus: int = 8) -> None:
        self.node_list = [SlurmNode(f"node{i + 1}", gpus, 0, "idle", (), ("gpu",)) for i in range(nodes)]
        self.job_list: dict[int, SlurmJob] = {}
        self.calls: list[tuple] = []
        self.fail: str | None = None  # method name that raises SlurmError
        self.next_id = 1
        self.delays: dict[int, int] = {}  # job id -> delay_s of its last release
        self.per_node: dict[int, int | None] = {}  # job id -> TresPerNode of its last placement

    # -- user side
    def submit(self, gpus: int, comment: str = "", t: float = 1000.0, managed: bool = True, time_limit_s=None) -> int:
        jid = self.next_id
        self.next_id += 1
        self.job_list[jid] = SlurmJob(
            job_id=jid, name=f"j{jid}", user="alice", user_id=1001, state="PENDING",
            reason="JobHeldUser" if managed else "None", priority=0 if managed else 1, partition="gpu",
            gpus=gpus, comment=comment, admin_comment=f"rlsched:managed gpus={gpus}" if managed else "",
            submit_time=t + jid, time_limit_s=time_limit_s,
        )
        return jid

    def schedule(self, now: float = 2000.0) -> None:
        """What slurmctld does with released jobs: start them if their pinned nodes have room (fill in order)."""
        for j in self.job_list.values():
            if j.state != "PENDING" or j.priority == 0 or not j.required_nodes:
                continue
            free = {n.name: n.gpus - n.gpus_used for n in self.node_list}
            need, split = j.gpus, {}
            k = self.per_node.get(j.job_id)
            if k:  # TresPerNode: exactly k on each pinned node
                if any(free[name] < k for name in j.required_nodes):
                    continue
                split = {name: k for name in j.required_nodes}
                need = 0
            for name in (j.required_nodes if not k else []):
                take = min(need, free[name])
                if take <= 0:
                    break
                split[name] = take
                need -= take
            if need or len(split) != len(j.required_nodes):
                continue
            for n in self.node_list:
                n.gpus_used += split.get(n.name, 0)
            j.state, j.nodes, j.gpus_per_node, j.start_time = "RUNNING", list(split), split, now

    def finish(self, jid: int, state: str = "COMPLETED") -> None:
        j = self.job_list[jid]
        for n in self.node_list:
            n.gpus_used -= j.gpus_per_node.get(n.name, 0)
        j.state, j.nodes, j.gpus_per_node = state, [], {}

    # -- adapter interface
    def _call(self, name: str, *args) -> None:
        self.calls.append((name, *args))
        if self.fail == name:
            raise SlurmError([name], "exit status 1: slurm_load_jobs error: Unable to contact slurm controller")

    def nodes(self):
        self._call("nodes")
        return [SlurmNode(n.name, n.gpus, n.gpus_used, n.state, n.flags, n.partitions) for n in self.node_list]

    def jobs(self):
        self._call("jobs")
        return [SlurmJob(**{**vars(j), "nodes": list(j.nodes), "gpus_per_node": dict(j.gpus_per_node),
                            "required_nodes": list(j.required_nodes)}) for j in self.job_list.values()]

    def job(self, job_id):
        self._call("job", job_id)
        return self.job_list.get(job_id)

    def place(self, job_id, nodes, gpus=None, per_node=None, tres_style="gres:gpu"):
        self._call("place", job_id, list(nodes))
        j = self.job_list[job_id]
        assert gpus is None or gpus == j.gpus
        j.required_nodes, j.num_nodes, self.per_node[job_id] = list(nodes), len(nodes), per_node

    def release(self, job_id, delay_s=0):
        self._call("release", job_id)
        self.delays[job_id] = delay_s
        j = self.job_list[job_id]
        assert j.priority == 0, "released twice"
        j.priority, j.reason = 1000, "None"

    def hold(self, job_id):
        self._call("hold", job_id)
        j = self.job_list[job_id]
        if j.state != "PENDING":
            raise SlurmError(["scontrol", "uhold"], "Job is no longer pending execution")
        j.priority, j.reason = 0, "JobHeldUser"

    def unplace(self, job_id):
        self._call("unplace", job_id)
        self.job_list[job_id].required_nodes = []

    def requeue_hold(self, job_id):
        self._call("requeue_hold", job_id)
        j = self.job_list[job_id]
        if j.state == "RUNNING":
            self.finish(job_id)
        j.state, j.priority, j.restarts = "PENDING", 0, j.restarts + 1


class FakeAgents:
    """Preempter stand-in: records calls; ``reachable=False`` mimics dead agents."""

    def __init__(self, reachable: bool = True, step: int = 40, total: int = 100, preempted: int | None = None) -> None:
        self.reachable, self.step, self.total = reachable, step, total
        self.preempted = preempted  # what preempted_step answers (the agents saw the job stop there)
        self.asked: list[int] = []
        self.looked_up: list[tuple[str, list[str]]] = []

    def stats(self, job_nodes=None):
        # every running job reports (it runs the checkpoint helper), but for the ids in ``plain``
        return {sid: {"slurm_job_id": sid, "state": "running"} for sid in (job_nodes or {}) if sid not in self.plain}

    plain: set[str] = set()

    def checkpoint(self, job, timeout_s):
        self.asked.append(job.job_id)
        if not self.reachable:
            return PreemptOutcome(False, False, message="node1: UNAVAILABLE")
        return PreemptOutcome(True, True, self.step, f"file:///ckpt/slurm-{job.job_id}/{self.step}", "ok")

    def preempted_step(self, slurm_job_id, nodes):
        self.looked_up.append((slurm_job_id, list(nodes)))
        return self.preempted


def _cfg(tmp_path: Path, **controller):
    doc = {"slurm": {"partition": "gpu"}, "controller": {"state_dir": str(tmp_path / "state"), "policy": "fifo",
                                                         "min_run_s": 0.0, **controller},
           "agents": {"enabled": False}}
    return parse_config(doc)


def _ctl(tmp_path, slurm, agents=None, now=2000.0, **controller) -> Controller:
    return Controller(_cfg(tmp_path, **controller), slurm=slurm, preempter=agents or NoAgents(), clock=lambda: now)


# --------------------------------------------------------------------------- comments / state
def test_parse_comment():
    r = parse_comment("rlsched:model=moe,samples=2e5,key=abc")
    assert r.model == "MoE" and r.samples == 200000 and ("key", "abc") in r.options and r.problem is None
    assert parse_comment("") .model is None
    bad = parse_comment("rlsched:model=Nope,samples=-3")
    assert bad.model is None and bad.samples is None and "unknown model" in bad.problem and "samples" in bad.problem


def test_build_state_from_slurm_view():
    s = FakeSlurm()
    a = s.submit(12, "rlsched:model=MoE,samples=1000")
    b = s.submit(4, "rlsched:model=GNN", time_limit_s=600)
    c = s.submit(2, "")  # default profile and runtime
    d = s.submit(64, "rlsched:model=LM")  # never fits a 32-GPU partition
    e = s.submit(2, "rlsched:model=GNN")
    s.job_list[e].partition = "debug,gpu"  # pending in several partitions: still ours
    f = s.submit(2, "rlsched:model=GNN")
    s.job_list[f].partition = "debug"  # another partition: not ours
    s.submit(1, managed=False)  # not ours
    s.place(a, ["node1", "node2"])
    s.job_list[a].priority = 5
    s.schedule(now=1900.0)
    nodes, jobs = s.nodes(), s.jobs()
    cluster = build_cluster(nodes, "gpu", 16.0, 5.0)
    perf = ContentionModel(cluster)
    v = build_state(2000.0, cluster, nodes, jobs, perf, partition="gpu", default_model="Transformer-XL",
                    default_runtime_s=3600.0)
    st = v.state
    assert [n.name for n in cluster.nodes] == ["node1", "node2", "node3", "node4"]
    np.testing.assert_array_equal(st.free_gpus, [0, 4, 8, 8])
    (run,) = st.running
    assert run.job_id == str(a) and run.placement.as_dict() == {0: 8, 1: 4} and run.model == "MoE"
    assert run.attained_service == pytest.approx(12 * 100.0)
    assert run.isolated_thp == pytest.approx(perf.isolated_throughput("MoE", 12, 2))
    assert 0 < run.done_samples <= 1000
    assert [p.job_id for p in st.pending] == [str(b), str(c), str(e)]
    pb, pc, _ = st.pending
    assert pb.model == "GraphSage" and pb.total_samples == pytest.approx(600 * perf.best_isolated_throughput("GraphSage", 4))
    assert pc.model == "Transformer-XL" and pc.total_samples == pytest.approx(3600 * pc.best_thp)
    assert any(f"job {d}" in w and "64 GPUs" in w for w in v.warnings)


def test_in_flight_jobs_reserve_their_gpus():
    s = FakeSlurm()
    a = s.submit(8)
    s.place(a, ["node3"])
    s.release(a)  # released, not started yet
    nodes, jobs = s.nodes(), s.jobs()
    cluster = build_cluster(nodes, "gpu", 16.0, 5.0)
    v = build_state(0.0, cluster, nodes, jobs, ContentionModel(cluster), partition="gpu",
                    default_model="MoE", default_runtime_s=60.0)
    assert [j.job_id for j in v.in_flight] == [a] and not v.state.pending
    np.testing.assert_array_equal(v.state.free_gpus, [8, 8, 0, 8])


def test_build_cluster_passes_gpu_type_cpus_and_memory():
    """sinfo's GRES type, CPUs and memory reach the NodeSpecs; a type the speed table lacks keeps its name
    with gpu_speed 1.0 (the reference speed), so the performance model can price it."""
    nodes = [
        SlurmNode("gpu2", 8, 0, "idle", partitions=("gpu",), gpu_type="k80", cpus=32, mem_gb=256.0),
        SlurmNode("gpu1", 8, 0, "idle", partitions=("gpu",), gpu_type="v100", cpus=64, mem_gb=512.0),
        SlurmNode("gpu3", 4, 0, "idle", partitions=("gpu",), gpu_type="a100"),
        SlurmNode("gpu4", 4, 0, "idle", partitions=("gpu",)),
    ]
    cl = build_cluster(nodes, "gpu", 16.0, 5.0)
    assert [n.name for n in cl.nodes] == ["gpu1", "gpu2", "gpu3", "gpu4"]
    assert cl.gpu_types == ("v100", "k80", "a100", None)
    assert cl.cpus_per_node == (64, 32, None, None) and cl.mem_gb_per_node == (512.0, 256.0, None, None)
    assert [n.gpu_speed for n in cl.nodes] == [None, None, 1.0, None]
    perf = ContentionModel(cl)
    # the fastest placement of 8 GPUs is the V100 node
    assert perf.best_isolated_throughput("MoE", 8) > perf.isolated_throughput("MoE", 8, 1)
    plain = build_cluster([SlurmNode("n1", 8, 0, "idle", partitions=("gpu",))], "gpu", 16.0, 5.0)
    assert plain.describe() == "1x8" and not plain.has_attributes  # no GRES type, CPUs or memory reported


def _typed_nodes() -> list[SlurmNode]:
    """Two V100 nodes (16 CPUs, 64 GB) and one K80 node (8 CPUs, 32 GB), 4 GPUs each."""
    return [SlurmNode("node1", 4, 0, "idle", partitions=("gpu",), gpu_type="v100", cpus=16, mem_gb=64.0),
            SlurmNode("node2", 4, 0, "idle", partitions=("gpu",), gpu_type="v100", cpus=16, mem_gb=64.0),
            SlurmNode("node3", 4, 0, "idle", partitions=("gpu",), gpu_type="k80", cpus=8, mem_gb=32.0)]


def _asking(jid: int, gpus: int, state: str = "PENDING", **ask) -> SlurmJob:
    return SlurmJob(job_id=jid, name=f"j{jid}", user="alice", user_id=1001, state=state,
                    reason="JobHeldUser" if state == "PENDING" else "None", priority=0 if state == "PENDING" else 1,
                    partition="gpu", gpus=gpus, admin_comment=f"rlsched:managed gpus={gpus}",
                    comment="rlsched:model=GNN", submit_time=1000.0 + jid, **ask)


def test_build_state_passes_each_jobs_requested_type_cpus_and_memory_to_policies():
    """A job's --gpus=TYPE:N, --cpus-per-gpu and --mem-per-gpu become JobInfo.demand; a job that asks for none
    of them has no demand. A type no node of the partition has, or more GPUs of a type than the partition's
    nodes of it have, leaves the job held with a warning. A running job's CPUs and memory are taken from its
    nodes' free CPUs / memory."""
    nodes = _typed_nodes()
    cluster = build_cluster(nodes, "gpu", 16.0, 5.0)
    jobs = [
        _asking(1, 2),  # asks for nothing beyond GPUs
        _asking(2, 4, gpu_type="v100", cpus_per_gpu=3, mem_gb_per_gpu=2.0),
        _asking(3, 2, cpus_per_gpu=4),  # CPUs only, any type
        _asking(4, 2, gpu_type="a100"),  # no a100 node
        _asking(5, 12, gpu_type="v100"),  # 8 V100s in the partition
        _asking(6, 1, gpu_type="Tesla_K80", mem_gb_per_gpu=1.5),  # matched as the validator does: k80
        _asking(7, 2, "RUNNING", mem_gb_per_gpu=10.0, cpus_per_gpu=2, nodes=["node3"], gpus_per_node={"node3": 2}),
    ]
    nodes[2].gpus_used = 2
    v = build_state(2000.0, cluster, nodes, jobs, ContentionModel(cluster), partition="gpu", default_model="MoE",
                    default_runtime_s=600.0)
    demand = {j.job_id: j.demand for j in (*v.state.pending, *v.state.running)}
    assert set(demand) == {"1", "2", "3", "6", "7"}
    assert demand["1"] is None
    assert demand["2"] == ResourceDemand(4, gpu_type="v100", cpus_per_gpu=3, mem_gb_per_gpu=2.0)
    assert demand["3"] == ResourceDemand(2, cpus_per_gpu=4)
    assert demand["6"] == ResourceDemand(1, gpu_type="Tesla_K80", mem_gb_per_gpu=1.5)
    assert demand["7"] == ResourceDemand(2, cpus_per_gpu=2, mem_gb_per_gpu=10.0)
    (w4,) = [w for w in v.warnings if w.startswith("job 4:")]
    assert "GPU type a100" in w4 and "no node of partition gpu" in w4 and "k80, v100" in w4 and "left held" in w4
    (w5,) = [w for w in v.warnings if w.startswith("job 5:")]
    assert "12 v100 GPUs" in w5 and "has 8" in w5
    assert v.state.free_cpu_mem() == ([16, 16, 4], [64.0, 64.0, 12.0])


def test_requested_type_cpus_and_memory_are_checked_by_the_decision_validator():
    """check_decision on the controller's snapshot refuses a placement of a live job on GPUs of another type
    or on a node without the CPUs / memory it asked for, and accepts one that fits; a job without a demand
    is checked on GPU counts only."""
    nodes = _typed_nodes()
    cluster = build_cluster(nodes, "gpu", 16.0, 5.0)
    jobs = [_asking(1, 4, gpu_type="v100"), _asking(2, 4, cpus_per_gpu=4), _asking(3, 2, mem_gb_per_gpu=20.0),
            _asking(4, 4)]
    st = build_state(2000.0, cluster, nodes, jobs, ContentionModel(cluster), partition="gpu", default_model="MoE",
                     default_runtime_s=600.0).state

    def why(*place):
        return [p.message for p in check_decision(st, Decision(list(place)))]

    assert "type k80" in why(("1", Placement.of({2: 4})))[0]
    assert "CPU" in why(("2", Placement.of({2: 4})))[0]  # 16 CPUs asked, node3 has 8
    assert "mem" in why(("3", Placement.of({2: 2})))[0]  # 40 GB asked, node3 has 32
    assert why(("1", Placement.of({0: 4})), ("2", Placement.of({1: 2, 2: 2})), ("3", Placement.of({1: 2}))) == []
    assert why(("4", Placement.of({2: 4}))) == []


def test_round_places_a_typed_job_on_its_type_and_pins_keep_the_type(tmp_path, caplog, monkeypatch):
    """fifo places a --gpus=k80:2 job on the K80 node, not on the first (V100) node its packing would
    take (a heuristic gives a typed job only the free GPUs of its type), pinned with ``gres:gpu:k80``
    (a requeued job still asks for K80s). A job asking for a type the partition lacks stays held, with
    the warning logged; an untyped job's pin keeps the plain ``gres:gpu``."""

    class TypedSlurm(FakeSlurm):
        def __init__(self) -> None:
            super().__init__()
            self.node_list = _typed_nodes()
            self.tres: dict[int, str] = {}

        def nodes(self):
            self._call("nodes")
            return [SlurmNode(**vars(n)) for n in self.node_list]

        def place(self, job_id, nodes, gpus=None, per_node=None, tres_style="gres:gpu"):
            self.tres[job_id] = tres_style
            super().place(job_id, nodes, gpus, per_node, tres_style)

    s = TypedSlurm()
    k80, a100 = s.submit(2, "rlsched:model=GNN"), s.submit(2, "rlsched:model=GNN")
    s.job_list[k80].gpu_type, s.job_list[k80].cpus_per_gpu = "k80", 4
    s.job_list[a100].gpu_type = "a100"
    ctl = _ctl(tmp_path, s)
    monkeypatch.setattr(logging.getLogger("controller"), "propagate", True)  # see the malformed-journal test
    with caplog.at_level(logging.WARNING, logger="controller"):
        rep = ctl.round()
    assert rep.ok and dict(rep.placed) == {k80: {"node3": 2}}, rep
    assert s.tres == {k80: "gres:gpu:k80"}
    assert f"job {a100}: asks for GPU type a100, which no node of partition gpu has" in caplog.text
    assert "does not fit" not in caplog.text
    plain = s.submit(2, "rlsched:model=GNN")
    rep = ctl.round()
    assert rep.ok, rep.error
    assert dict(rep.placed) == {plain: {"node3": 2}}  # packing: the node whose 2 free GPUs fit it exactly
    assert s.tres == {k80: "gres:gpu:k80", plain: "gres:gpu"} and s.job_list[a100].held


# --------------------------------------------------------------------------- rounds
def test_round_places_held_jobs_and_slurm_runs_them(tmp_path):
    s = FakeSlurm()
    ids = [s.submit(g, "rlsched:model=MoE") for g in (8, 4, 12, 16)]
    ctl = _ctl(tmp_path, s)
    rep = ctl.round()
    assert rep.ok and rep.error is None
    placed = dict(rep.placed)
    # FIFO + packing on 4 x 8: 8 -> one node, 4 -> one node, 12 -> 8+4, the 16-GPU job does not fit
    assert set(placed) == set(ids[:3])
    assert sum(placed[ids[2]].values()) == 12 and len(placed[ids[2]]) == 2
    calls = [c for c in s.calls if c[0] in ("place", "release")]
    for jid in ids[:3]:  # pinned before released, each exactly once
        assert calls.index(("place", jid, list(placed[jid]))) < calls.index(("release", jid))
        assert calls.count(("release", jid)) == 1
    s.schedule()
    assert all(s.job_list[j].state == "RUNNING" for j in ids[:3]) and s.job_list[ids[3]].held
    assert all(set(s.job_list[j].nodes) == set(placed[j]) for j in ids[:3])
    rep2 = ctl.round()  # nothing fits, nothing changes
    assert rep2.ok and rep2.placed == [] and rep2.queue == 1 and rep2.running == 3
    assert ctl.metrics.value("rlsched_decisions_total", action="place") == 3
    assert ctl.metrics.value("rlsched_queue_length") == 1
    status = json.loads((tmp_path / "state" / "status.json").read_text())
    assert status["policy"] == "fifo" and status["last_round"]["queue"] == 1


def test_rl_policy_stops_at_the_rounds_placement_cap(tmp_path):
    """The controller applies at most max_placements_per_round placements per round and tells the policy,
    so rl-base computes only those (its network placed 2 jobs, not 6), and the next round goes on."""
    s = FakeSlurm()
    ids = [s.submit(1, "rlsched:model=MoE") for _ in range(6)]
    ctl = _ctl(tmp_path, s, policy="rl-base", max_placements_per_round=2)
    rep = ctl.round()
    assert rep.ok and len(rep.placed) == 2
    assert ctl.policy.place_limit == 2 and ctl.policy.stats["placements"] == 2
    s.schedule()
    rep2 = ctl.round()
    assert rep2.ok and len(rep2.placed) == 2 and not set(dict(rep.placed)) & set(dict(rep2.placed))
    assert set(dict(rep.placed)) | set(dict(rep2.placed)) <= set(ids)


def test_restarted_controller_never_releases_twice(tmp_path):
    s = FakeSlurm()
    a, b = s.submit(8), s.submit(8)
    _ctl(tmp_path, s).round()  # released both; Slurm has not started them yet
    # "crash": a new controller with an empty state dir (journal lost)
    rep = _ctl(tmp_path / "fresh", s).round()
    assert rep.ok and rep.placed == []
    assert [c for c in s.calls if c[0] == "release"] == [("release", a), ("release", b)]
    s.schedule()
    assert s.job_list[a].running and s.job_list[b].running


def test_released_job_that_never_starts_is_held_again(tmp_path):
    s = FakeSlurm()
    a = s.submit(8)
    _ctl(tmp_path, s, now=1000.0, start_grace_s=30.0).round()
    s.node_list[0].state = "down"  # its node died before Slurm started it
    s.node_list[0].gpus_used = 0
    rep = _ctl(tmp_path, s, now=1040.0, start_grace_s=30.0).round()
    # held back, then (same round, from a fresh read of the queue) placed again on a live node
    assert rep.held_back == [a]
    (jid, plan), = rep.placed
    assert jid == a and "node1" not in plan
    assert ("hold", a) in s.calls and [c for c in s.calls if c[0] == "release"] == [("release", a)] * 2


def test_a_job_slurm_keeps_refusing_is_placed_again_less_and_less_often(tmp_path):
    """Held back once: placed again at once. Held back again and again (Slurm will not start it on
    any nodes, e.g. a CPU or memory request they cannot meet): waits grace x 2^(n-1), at most an
    hour, instead of blocking GPUs by a place / hold-back loop; the wait is in the journal."""

    class Refusing(FakeSlurm):
        refuse = True

        def schedule(self, now=2000.0):
            if not self.refuse:
                super().schedule(now)

    s = Refusing()
    a = s.submit(8)
    t, grace = 1000.0, 30.0
    releases, holds = [], 0
    for _ in range(40):  # 40 rounds, 10 s apart
        rep = _ctl(tmp_path, s, now=t, start_grace_s=grace).round()
        assert rep.ok, rep.error
        s.schedule()
        holds += len(rep.held_back)
        if rep.placed:
            releases.append(t)
        t += 10.0
    # the first hold-back after 40 s (> grace), placed again at once; then waits of 2 x 30 s and 4 x 30 s
    assert np.diff(releases).tolist()[:3] == [40.0, 40.0 + 60.0, 40.0 + 120.0], releases
    journal = tmp_path / "state" / "journal.json"
    b = json.loads(journal.read_text())["backoff"][str(a)]
    assert b["n"] == holds >= 3 and b["until"] - t <= 3600.0
    # once it runs, the back-off is forgotten
    s.refuse = False
    while not s.job_list[a].running:
        _ctl(tmp_path, s, now=t, start_grace_s=grace).round()
        s.schedule()
        t += 600.0
    assert _ctl(tmp_path, s, now=t, start_grace_s=grace).round().ok
    assert json.loads(journal.read_text())["backoff"] == {}


def test_dependencies_and_begin_times_keep_jobs_out_of_the_queue(tmp_path):
    s = FakeSlurm()
    first = s.submit(4)
    ok_after = s.submit(4)
    s.job_list[ok_after].dependency = f"afterok:{first}(unfulfilled)"
    any_after = s.submit(4)
    s.job_list[any_after].dependency = f"afterany:{first}(unfulfilled)?afterok:999(unfulfilled)"
    failed = s.submit(4)
    s.job_list[failed].dependency = f"afterok:{first}(failed)"
    later = s.submit(4)
    s.job_list[later].eligible_time = 5000.0  # --begin in the future
    requeued = s.submit(4)
    s.job_list[requeued].eligible_time, s.job_list[requeued].restarts = 5000.0, 1  # Slurm's requeue delay
    ctl = _ctl(tmp_path, s)
    rep = ctl.round()
    # first runs; any_after's "?" list is met through job 999, long purged; requeued's begin time is Slurm's
    assert sorted(j for j, _ in rep.placed) == sorted([first, any_after, requeued])
    s.schedule()
    s.finish(first)
    rep = ctl.round()
    assert [j for j, _ in rep.placed] == [ok_after]  # failed never; later not before 5000 s
    assert not s.job_list[failed].required_nodes and not s.job_list[later].required_nodes
    s.schedule()
    assert [j for j, _ in _ctl(tmp_path, s, now=6000.0).round().placed] == [later]


@pytest.mark.parametrize("dep, states, met", [
    ("", {}, True),
    ("afterok:1(unfulfilled)", {1: "RUNNING"}, False),
    ("afterok:1(unfulfilled)", {1: "COMPLETED"}, True),
    ("afterok:1(unfulfilled)", {1: "FAILED"}, False),
    ("afterok:1(unfulfilled)", {}, True),  # purged: long gone
    ("afternotok:1(unfulfilled)", {1: "FAILED"}, True),
    ("afternotok:1(unfulfilled)", {1: "COMPLETED"}, False),
    ("afterany:1(unfulfilled),afterany:2(unfulfilled)", {1: "COMPLETED", 2: "RUNNING"}, False),
    ("afterany:1(unfulfilled)?afterany:2(unfulfilled)", {1: "COMPLETED", 2: "RUNNING"}, True),
    ("afterany:1:2(unfulfilled)", {1: "CANCELLED", 2: "TIMEOUT"}, True),
    ("after:1(unfulfilled)", {1: "PENDING"}, False),
    ("after:1(unfulfilled)", {1: "RUNNING"}, True),
    ("after:1+5(unfulfilled)", {1: "RUNNING"}, None),  # Slurm keeps that clock
    ("afterok:1_3(unfulfilled)", {}, None),  # array element: left to Slurm
    ("aftercorr:1(unfulfilled)", {}, None),
    ("afterok:1(failed)", {1: "FAILED"}, False),
    ("singleton(unfulfilled)", {1: "RUNNING"}, False),
    ("singleton(unfulfilled)", {1: "COMPLETED"}, True),
])
def test_dependency_met(dep, states, met):
    from controller.slurm import dependency_met

    def job(jid, state, dependency=""):
        return SlurmJob(job_id=jid, name="train", user="alice", user_id=1001, state=state, reason="",
                        priority=1, partition="gpu", gpus=1, nodes=["node1"] if state == "RUNNING" else [],
                        dependency=dependency)

    me = job(10, "PENDING", dep)
    by_id = {jid: job(jid, st) for jid, st in states.items()} | {10: me}
    assert dependency_met(me, by_id) is met


def test_dry_run_changes_nothing(tmp_path):
    """dry_run: decisions are logged; no placement, preemption, hold-back or requeue reaches Slurm."""
    s = FakeSlurm()
    long = s.submit(8, "rlsched:model=MoE,samples=1e12")
    _ctl(tmp_path, s, policy="srtf").round()
    s.schedule(now=1000.0)
    s.submit(8, "rlsched:model=MoE,samples=10")  # short: SRTF would preempt the long one
    s.job_list[long].restarts = 0
    pending_release = s.submit(8)
    s.place(pending_release, ["node2"])
    s.release(pending_release)  # released, never started: would be held back
    agents = FakeAgents()
    before = len(s.calls)
    ctl = _ctl(tmp_path, s, agents=agents, now=9000.0, policy="srtf", dry_run=True, start_grace_s=10.0)
    for _ in range(3):
        rep = ctl.round()
        assert rep.ok and rep.placed == [] and rep.preempted == [] and rep.held_back == []
    acting = {"place", "release", "hold", "unplace", "requeue_hold"}
    assert [c for c in s.calls[before:] if c[0] in acting] == [] and agents.asked == []
    assert s.job_list[long].state == "RUNNING"


def test_in_flight_plans_follow_node_names_when_the_node_set_changes(tmp_path):
    """A released job's planned GPUs are reserved on the nodes named in the journal, even after the
    partition's node set changed (node indices shift): never on the wrong node, never an IndexError."""
    s = FakeSlurm()
    a = s.submit(8)
    rep = _ctl(tmp_path, s).round()
    ((jid, plan),) = rep.placed
    assert jid == a and plan == {"node1": 8}
    # before Slurm starts it, a node0 joins the partition: node1 is now index 1
    s.node_list.insert(0, SlurmNode("node0", 8, 0, "idle", (), ("gpu",)))
    b = s.submit(8)
    rep = _ctl(tmp_path, s).round()
    assert rep.ok, rep.error
    ((jid, plan),) = rep.placed
    assert jid == b and "node1" not in plan
    # and node1 leaving the partition does not break the round
    s.node_list = [n for n in s.node_list if n.name != "node1"]
    assert _ctl(tmp_path, s).round().ok


def test_round_reads_the_queue_before_the_nodes(tmp_path):
    s = FakeSlurm()
    s.submit(4)
    _ctl(tmp_path, s).round()
    reads = [c[0] for c in s.calls if c[0] in ("jobs", "nodes")]
    assert reads[:2] == ["jobs", "nodes"]


def test_slurm_failure_is_reported_and_next_round_recovers(tmp_path):
    s = FakeSlurm()
    s.submit(4)
    ctl = _ctl(tmp_path, s)
    s.fail = "jobs"
    rep = ctl.round()
    assert not rep.ok and "Unable to contact slurm controller" in rep.error
    assert ctl.metrics.value("rlsched_slurm_errors_total") == 1
    assert ctl.metrics.value("rlsched_rounds_total", outcome="error") == 1
    s.fail = None
    rep = ctl.round()
    assert rep.ok and len(rep.placed) == 1


def test_failed_release_is_retried_next_round(tmp_path):
    s = FakeSlurm()
    a = s.submit(4)
    ctl = _ctl(tmp_path, s)
    s.fail = "release"
    rep = ctl.round()
    assert rep.ok and rep.placed == [] and s.job_list[a].held
    s.fail = None
    assert [j for j, _ in ctl.round().placed] == [a]


class _SlowRelease(FakeSlurm):
    """``scontrol release`` times out; ``acted``: slurmctld released the job all the same."""

    def __init__(self, acted: bool, **kw) -> None:
        super().__init__(**kw)
        self.acted = acted
        self.slow = True

    def release(self, job_id, delay_s=0):
        if not self.slow:
            return super().release(job_id, delay_s)
        if self.acted:
            super().release(job_id, delay_s)
        else:
            self._call("release", job_id)
        raise SlurmError(["scontrol", "release", str(job_id)], "timed out after 20 s", timed_out=True)


@pytest.mark.parametrize("acted", [True, False])
def test_release_that_times_out_keeps_its_gpus_this_round(tmp_path, acted):
    """A timed-out release may have happened: its GPUs are not given to another job in the same
    round (that would be a double booking if Slurm had acted), and the next round goes on from what
    Slurm shows: the job started, or it is still held and placed again."""
    s = _SlowRelease(acted, nodes=1, gpus=8)
    a, b = s.submit(8), s.submit(8)
    ctl = _ctl(tmp_path, s)
    rep = ctl.round()
    assert rep.ok and rep.placed == [] and [c for c in s.calls if c[0] == "place"] == [("place", a, ["node1"])]
    assert str(a) in ctl.journal["released"]
    s.slow = False
    s.schedule()
    rep = ctl.round()
    if acted:
        assert s.job_list[a].state == "RUNNING" and rep.placed == [] and s.job_list[b].held
    else:
        assert [j for j, _ in rep.placed] == [a] and s.job_list[b].held
    assert ctl.metrics.value("rlsched_slurm_errors_total") == 1


def test_job_held_by_an_operator_is_left_alone(tmp_path, caplog, monkeypatch):
    """``scontrol hold`` by an operator (JobHeldAdmin) means "leave it": rlsched places it only
    after ``scontrol uhold`` gives it back; its own holds are user holds."""
    s = FakeSlurm()
    a = s.submit(4)
    s.job_list[a].reason = "JobHeldAdmin"
    ctl = _ctl(tmp_path, s)
    monkeypatch.setattr(logging.getLogger("controller"), "propagate", True)  # see the malformed-journal test
    with caplog.at_level(logging.INFO, logger="controller"):
        rep = ctl.round()
    assert rep.ok and rep.placed == [] and not [c for c in s.calls if c[0] == "place"]
    assert f"scontrol uhold {a}" in caplog.text
    s.job_list[a].reason = "JobHeldUser"
    assert [j for j, _ in ctl.round().placed] == [a]


# --------------------------------------------------------------------------- preemption
def _running(s: FakeSlurm, gpus: int, node: str) -> int:
    jid = s.submit(gpus, "rlsched:model=MoE")
    s.place(jid, [node])
    s.release(jid)
    s.schedule(now=1000.0)
    return jid


def _held_info(ctl: Controller, s: FakeSlurm, jid: int):
    """The JobInfo the controller would hand its policy for held job ``jid``."""
    nodes, jobs = s.nodes(), s.jobs()
    cluster = build_cluster(nodes, "gpu", 16.0, 5.0)
    progress = {k: dict(v) for k, v in ctl.journal["progress"].items()}
    v = build_state(ctl.clock(), cluster, nodes, jobs, ContentionModel(cluster), partition="gpu",
                    default_model="MoE", default_runtime_s=60.0, progress=progress)
    return next(j for j in v.state.pending if j.job_id == str(jid))


def _request_preempt(tmp_path: Path, jid: int) -> None:
    d = tmp_path / "state" / "requests"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"preempt-{jid}").write_text("")


def test_preemption_checkpoints_then_requeues_held(tmp_path):
    s = FakeSlurm()
    jid = _running(s, 8, "node2")
    class Agents(FakeAgents):
        def stats(self, job_nodes=None):
            return {str(jid): {"step": 40, "total_steps": 100, "samples_per_s": 50.0}}

    agents = Agents(step=40)
    ctl = _ctl(tmp_path, s, agents)
    _request_preempt(tmp_path, jid)
    rep = ctl.round()
    assert rep.preempted == [jid] and agents.asked == [jid]
    names = [c[0] for c in s.calls]
    assert names.index("requeue_hold") > 0 and s.job_list[jid].held and s.job_list[jid].restarts == 1
    j = ctl.journal
    assert j["preempting"] == {} and j["progress"][str(jid)]["step"] == 40
    assert j["progress"][str(jid)]["total_steps"] == 100
    assert ctl.metrics.value("rlsched_preemptions_total", outcome="ok") == 1
    # while it waits, the policy sees 40 % of its work done and the GPU-seconds it had
    agents.stats = lambda job_nodes=None: {}
    view_job = _held_info(ctl, s, jid)
    assert view_job.done_samples == pytest.approx(0.4 * view_job.total_samples)
    assert view_job.attained_service == pytest.approx(8 * 1000.0)
    # next round it is placed again like any held job, starting after the settle time
    assert [x for x, _ in ctl.round().placed] == [jid]
    assert s.delays[jid] == 5


def test_no_requeue_jobs_and_unusable_nodes_are_left_alone(tmp_path):
    """A job submitted with --no-requeue is never preempted (requeuehold would fail after its
    checkpoint and the job would just end); nodes in maintenance or awaiting a reboot get nothing."""
    s = FakeSlurm()
    jid = _running(s, 8, "node2")
    s.job_list[jid].requeue = False
    agents = FakeAgents()
    ctl = _ctl(tmp_path, s, agents)
    _request_preempt(tmp_path, jid)
    rep = ctl.round()
    assert rep.ok and rep.preempted == [] and agents.asked == [] and s.job_list[jid].running
    s.node_list[0].flags = ("MAINT",)
    s.node_list[2].state = "reboot_requested"
    a, b = s.submit(8), s.submit(8)  # node2 runs the job: only node4 is usable and free
    rep = ctl.round()
    assert rep.placed == [(a, {"node4": 8})] and s.job_list[b].held


def test_operator_request_survives_a_round_that_fails(tmp_path):
    """`controller preempt N` is consumed only by a round that acted on it."""
    s = FakeSlurm()
    jid = _running(s, 8, "node2")
    agents = FakeAgents()
    ctl = _ctl(tmp_path, s, agents)
    ctl.round()
    s.submit(4)  # something for the policy to decide on
    _request_preempt(tmp_path, jid)

    def broken(state):
        raise PolicyError("policy broke")

    real, ctl.policy.schedule = ctl.policy.schedule, broken
    assert not ctl.round().ok and agents.asked == []
    assert (tmp_path / "state" / "requests" / f"preempt-{jid}").exists()
    ctl.policy.schedule = real
    assert ctl.round().preempted == [jid] and agents.asked == [jid]
    assert not (tmp_path / "state" / "requests" / f"preempt-{jid}").exists()


def test_unreachable_agent_never_loses_the_job(tmp_path):
    s = FakeSlurm()
    jid = _running(s, 8, "node1")
    ctl = _ctl(tmp_path, s, FakeAgents(reachable=False))
    _request_preempt(tmp_path, jid)
    rep = ctl.round()
    assert rep.ok and rep.preempted == []
    assert s.job_list[jid].state == "RUNNING" and "requeue_hold" not in [c[0] for c in s.calls]
    assert ctl.metrics.value("rlsched_preemptions_total", outcome="failed") == 1
    assert ctl.journal["preempting"] == {}


def test_crash_between_checkpoint_and_requeue_is_finished_on_restart(tmp_path):
    s = FakeSlurm()
    jid = _running(s, 8, "node1")
    ctl = _ctl(tmp_path, s, FakeAgents())
    ctl.journal["preempting"][str(jid)] = {"t": 1.0, "stage": "checkpointed", "step": 10}
    ctl.journal.save()
    s.finish(jid, "FAILED")  # the job exited 75 after its checkpoint, then the controller died
    ctl2 = _ctl(tmp_path, s, FakeAgents())
    rep = ctl2.round()
    assert rep.ok
    assert ("requeue_hold", jid) in s.calls and ctl2.journal["preempting"] == {}
    assert [x for x, _ in rep.placed] == [jid]  # and it is placed again in the same round


@pytest.mark.parametrize("end", ["COMPLETED", "FAILED", "TIMEOUT"])
def test_crash_while_asking_the_agent_never_reruns_a_job_that_ended_on_its_own(tmp_path, end):
    """Stage "asked": the controller died during the agent call, and the job then ended by itself (no checkpoint
    was confirmed; a checkpointed job exits 75 and RequeueExitHold requeues it). A restart must not requeue
    a COMPLETED (or failed) job: Slurm would run it again."""
    s = FakeSlurm()
    jid = _running(s, 8, "node1")
    ctl = _ctl(tmp_path, s, FakeAgents())
    ctl.journal["preempting"][str(jid)] = {"t": 1.0, "stage": "asked"}
    ctl.journal.save()
    s.finish(jid, end)
    ctl2 = _ctl(tmp_path, s, FakeAgents())
    rep = ctl2.round()
    assert rep.ok and rep.placed == []
    assert ("requeue_hold", jid) not in s.calls and s.job_list[jid].state == end
    assert ctl2.journal["preempting"] == {}


class _StatsAgents(FakeAgents):
    """Agents whose stats say the running job ``jid`` is at step 30 of 100."""

    jid = 0

    def stats(self, job_nodes=None):
        return {str(self.jid): {"slurm_job_id": str(self.jid), "step": 30, "total_steps": 100, "state": "running"}}


def _crash_while_asking(tmp_path, s: FakeSlurm, jid: int) -> dict:
    """Round 1 asks the agent to preempt ``jid`` and the controller dies during the call (the journal says
    stage "asked"); the job checkpoints, exits 75 and Slurm requeues it held (RequeueExitHold)."""
    class Dies(_StatsAgents):
        def checkpoint(self, job, timeout_s):
            raise KeyboardInterrupt  # stands for the controller being killed mid-call

    Dies.jid = jid
    ctl = _ctl(tmp_path, s, Dies(), now=1600.0)
    _request_preempt(tmp_path, jid)
    with pytest.raises(KeyboardInterrupt):
        ctl.round()
    entry = json.loads((tmp_path / "state" / "journal.json").read_text())["preempting"][str(jid)]
    s.requeue_hold(jid)
    return entry


@pytest.mark.parametrize("agent_step, expect_step", [(55, 55), (None, 30)])
def test_crash_while_asking_then_requeued_keeps_the_jobs_progress(tmp_path, agent_step, expect_step):
    """Stage "asked" and the job was requeued since (the agent did checkpoint it, its answer was lost): the
    restart records the job's attained service and the step it resumes from, as a completed preemption
    would, taking the step from the agents of the job's nodes (else the last step its stats showed)."""
    s = FakeSlurm(nodes=1, gpus=8)
    jid = _running(s, 8, "node1")  # started at t=1000 on node1
    entry = _crash_while_asking(tmp_path, s, jid)
    _running(s, 8, "node1")  # another job takes node1: the requeued one stays held, as the policy sees it
    assert entry == {"t": 1600.0, "stage": "asked", "start": 1000.0, "gpus": 8, "restarts": 0, "nodes": ["node1"],
                     "seen_step": 30, "total_steps": 100}
    agents = FakeAgents(preempted=agent_step)
    ctl2 = _ctl(tmp_path, s, agents, now=1700.0)
    rep = ctl2.round()
    assert rep.ok and ctl2.journal["preempting"] == {}
    assert agents.looked_up == [(str(jid), ["node1"])]
    assert ctl2.journal["progress"][str(jid)] == {"attained_service": 8 * 600.0, "step": expect_step,
                                                  "total_steps": 100}
    # and the policy sees it: done work from the step, LAS service from the run before the preemption
    info = _held_info(ctl2, s, jid)
    assert info.attained_service == 8 * 600.0
    assert info.done_samples == pytest.approx(info.total_samples * expect_step / 100)


def test_asked_entry_without_a_requeue_records_nothing(tmp_path):
    """Stage "asked", the job pending but not requeued since the ask (same restart count), or an entry from an
    older journal without the facts: nothing is invented, the entry is dropped."""
    for case, entry in [("same", {"t": 1.0, "stage": "asked", "start": 0.0, "gpus": 8, "restarts": 1, "nodes": ["node1"]}),
                        ("old", {"t": 1.0, "stage": "asked"})]:
        s = FakeSlurm()
        jid = s.submit(8, "rlsched:model=MoE")
        s.job_list[jid].restarts = 1
        ctl = _ctl(tmp_path / case, s, FakeAgents(preempted=12))
        ctl.journal["preempting"][str(jid)] = entry
        ctl.journal.save()
        rep = _ctl(tmp_path / case, s, FakeAgents(preempted=12)).round()
        assert rep.ok
        doc = json.loads((tmp_path / case / "state" / "journal.json").read_text())
        assert doc["preempting"] == {} and doc["progress"] == {}, case


def test_journal_drops_asked_entries_with_bad_facts(tmp_path):
    path = tmp_path / "journal.json"
    path.write_text(json.dumps({"preempting": {
        "1": {"t": 1.0, "stage": "asked", "nodes": "node1"},
        "2": {"t": 1.0, "stage": "asked", "gpus": "8"},
        "3": {"t": 1.0, "stage": "asked", "start": 0.0, "gpus": 8, "restarts": 0, "nodes": ["node1"], "seen_step": 3},
    }}))
    assert list(Journal(path)["preempting"]) == ["3"]


def test_agent_preempter_preempted_step():
    """The step comes only from "preempted" records of that job on the nodes asked; a failing agent is skipped."""
    class Client:
        def __init__(self, addr, node):
            self.node = node

        def job_stats(self, include_finished=False):
            assert include_finished
            if self.node == "node3":
                raise ConnectionError("down")
            return {"node1": [{"slurm_job_id": "7", "state": "preempted", "last_checkpoint_step": 20},
                              {"slurm_job_id": "8", "state": "preempted", "last_checkpoint_step": 90}],
                    "node2": [{"slurm_job_id": "7", "state": "preempted", "last_checkpoint_step": 25},
                              {"slurm_job_id": "9", "state": "exited", "last_checkpoint_step": 5}]}[self.node]

    p = AgentPreempter({n: f"h:{i}" for i, n in enumerate(("node1", "node2", "node3"))}, Client)
    assert p.preempted_step("7", ["node3", "node1", "node2", "node9"]) == 25
    assert p.preempted_step("7", ["node1"]) == 20
    assert p.preempted_step("9", ["node2"]) is None  # exited without a preemption report: no checkpoint known
    assert p.preempted_step("8", ["node2"]) is None  # node1 has it, but node1 was not the job's node
    assert "node3" in p.unreachable
    assert NoAgents().preempted_step("7", ["node1"]) is None


def test_policy_preemption_respects_free_gpus_of_failed_victims(tmp_path):
    """A placement that needs a victim's GPUs is dropped when the victim could not be preempted."""
    s = FakeSlurm(nodes=1, gpus=8)
    jid = _running(s, 8, "node1")
    s.job_list[jid].comment = "rlsched:model=MoE,samples=1e12"  # very long: SRTF wants to preempt it
    short = s.submit(8, "rlsched:model=MoE,samples=10")
    ctl = _ctl(tmp_path, s, FakeAgents(reachable=False), policy="srtf")
    rep = ctl.round()
    assert rep.preempted == [] and rep.placed == []
    assert s.job_list[jid].state == "RUNNING" and s.job_list[short].held


# --------------------------------------------------------------------------- policies / reload
def test_make_policy_names():
    cluster = ClusterSpec.homogeneous(2, 8)
    perf = ContentionModel(cluster)
    assert make_policy("las", cluster, perf).name == "las"
    with pytest.raises(PolicyError, match="unknown policy"):
        make_policy("nope", cluster, perf)


def test_sighup_reload_switches_policy_and_survives_bad_config(tmp_path):
    cfgfile = tmp_path / "c.toml"
    state = tmp_path / "state"
    cfgfile.write_text(f'[controller]\npolicy = "fifo"\nstate_dir = "{state}"\n[agents]\nenabled = false\n')
    s = FakeSlurm()
    s.submit(4)
    ctl = Controller(load_config(cfgfile), slurm=s, preempter=NoAgents())
    ctl.round()
    assert ctl.policy.name == "fifo"
    cfgfile.write_text(f'[controller]\npolicy = "las"\nstate_dir = "{state}"\n[agents]\nenabled = false\n')
    ctl.request_reload()
    ctl.round()
    assert ctl.policy.name == "las" and ctl.metrics.value("rlsched_policy_info", policy="las") == 1
    cfgfile.write_text(f'[controller]\npolicy = "bogus"\nstate_dir = "{state}"\n')
    ctl.request_reload()
    assert ctl.round().ok and ctl.policy.name == "las"
    # a file that is not UTF-8 is a failed reload too, not a crash of the loop
    cfgfile.write_bytes(b'[controller]\npolicy = "fifo\xff"\n')
    ctl.request_reload()
    assert ctl.round().ok and ctl.policy.name == "las"


def test_reload_keeps_command_line_overrides(tmp_path):
    """`controller run --policy greedy --interval 1`: a SIGHUP re-reads the file but keeps both."""
    import argparse

    from controller.cli import _load

    cfgfile = tmp_path / "c.toml"
    cfgfile.write_text(f'[controller]\npolicy = "fifo"\ninterval_s = 5\nstate_dir = "{tmp_path / "st"}"\n'
                       '[agents]\nenabled = false\n')
    args = argparse.Namespace(config=str(cfgfile), policy="greedy", interval=1.0, state_dir=None, metrics_port=None)
    ctl = Controller(_load(args), slurm=FakeSlurm(), preempter=NoAgents())
    ctl.round()
    assert (ctl.policy.name, ctl.cfg.controller.interval_s) == ("greedy", 1.0)
    cfgfile.write_text(cfgfile.read_text().replace("interval_s = 5", "interval_s = 7\nmin_run_s = 9"))
    ctl.request_reload()
    assert ctl.round().ok
    c = ctl.cfg.controller
    assert (ctl.policy.name, c.interval_s, c.min_run_s) == ("greedy", 1.0, 9.0)  # the file's other values apply


# --------------------------------------------------------------------------- config
def test_example_config_is_valid():
    cfg = load_config(REPO / "slurm_conf" / "controller.toml.example")
    assert cfg.controller.policy and cfg.controller.interval_s > 0


@pytest.mark.parametrize(
    "text,needle",
    [
        ("[controller]\ninterval_s = -1\n", "controller.interval_s: must be > 0"),
        ("[controller]\ninterval_s = 1e300\n", "controller.interval_s: must be at most 86400 s"),
        ("[controller]\ninterval_s = 'fast'\n", "controller.interval_s: expected a number"),
        ("[controller]\npolcy = 'fifo'\n", "controller.polcy: unknown key"),
        ("[slurmm]\n", "[slurmm]: unknown section"),
        ("[metrics]\nport = 70000\n", "metrics.port: must be 0..65535"),
        ("[agents]\naddresses = { node1 = 'nohost' }\n", "agents.addresses.node1: expected HOST:PORT"),
        ("[controller]\ndefault_model = 'Llama'\n", "controller.default_model: unknown model"),
        ("[controller]\ncs_preempt_threshold = 0.5\n", "controller.cs_preempt_threshold"),
        ("[controller]\npreempt_timeout_s = nan\n", "controller.preempt_timeout_s: expected a finite number"),
        ("[controller]\nmin_run_s = nan\n", "controller.min_run_s: expected a finite number"),
        ("[controller]\ninterval_s = inf\n", "controller.interval_s: expected a finite number"),
        ("[agents]\ntimeout_s = -inf\n", "agents.timeout_s: expected a finite number"),
        ("[controller]\nmin_run_s = " + "9" * 400 + "\n", "controller.min_run_s: expected a finite number"),
        ("[controller\n", "not valid TOML"),
    ],
)
def test_config_errors_name_file_and_key(tmp_path, text, needle):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(ConfigError) as ei:
        load_config(f)
    assert needle in str(ei.value) and str(f) in str(ei.value)


def test_cli_bad_config_exits_2_with_message(tmp_path, capsys):
    from rlsched.cli import main

    f = tmp_path / "bad.toml"
    f.write_text("[controller]\ninterval_s = 0\n")
    assert main(["controller", "run", "--config", str(f), "--once"]) == 2
    err = capsys.readouterr().err
    assert "controller.interval_s: must be > 0" in err and err.count("\n") == 1
    ok = tmp_path / "ok.toml"
    ok.write_text("")
    for option, bad, expected in [
        ("--interval", "nan", "must be a number in (0, 86400]"),
        ("--interval", "inf", "must be a number in (0, 86400]"),
        ("--interval", "-1", "must be a number in (0, 86400]"),
        ("--interval", "0", "must be a number in (0, 86400]"),
        ("--interval", "1e300", "must be a number in (0, 86400]"),  # was an OverflowError in Event.wait
        ("--interval", "x", "expected a number"),
        ("--metrics-port", "-1", "must be a port in [1, 65535] or 0 (off)"),  # not silently "off"
        ("--metrics-port", "65536", "must be a port in [1, 65535] or 0 (off)"),
        ("--metrics-port", "9810.5", "expected a port number"),
    ]:
        with pytest.raises(SystemExit) as ei:
            main(["controller", "run", "--config", str(ok), "--once", option, bad])
        assert ei.value.code == 2
        err = capsys.readouterr().err
        assert err == (f"rlsched controller run: error: argument {option}: {expected}, got {bad!r}"
                       " (see 'rlsched controller run --help')\n")
        assert "invalid" not in err and "Traceback" not in err
    example = tmp_path / "example.toml"  # with a state dir this user can make (not root's /var/lib), a slurm.conf,
    # agent hosts and a metrics port that this host has (check-config checks them: start_problems)
    (tmp_path / "slurm.conf").write_text("ClusterName=test\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    example.write_text((REPO / "slurm_conf" / "controller.toml.example").read_text()
                       .replace('state_dir = "/var/lib/rlsched"', f"state_dir = {str(tmp_path / 'state')!r}", 1)
                       .replace('conf = "/etc/slurm/slurm.conf"', f"conf = {str(tmp_path / 'slurm.conf')!r}", 1)
                       .replace("port = 9810", f"port = {free}", 1)
                       .replace('address = "0.0.0.0"', 'address = "127.0.0.1"', 1)
                       .replace('"gpu0', '"localhost:5005').replace(':50051"', '"'))
    assert main(["controller", "check-config", str(example)]) == 0, capsys.readouterr().err
    assert main(["controller", "run", "--config", str(tmp_path / "missing.toml")]) == 2
    assert "config file not found" in capsys.readouterr().err


def test_cli_run_once_against_dead_slurm_fails_cleanly(tmp_path, capsys):
    """`run --once` with Slurm unreachable: one JSON error line, exit 1, no traceback."""
    from rlsched.cli import main

    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in ("sinfo", "squeue", "scontrol"):
        p = bindir / name
        p.write_text("#!/bin/sh\necho 'slurm_load_partitions: Unable to contact slurm controller' >&2\nexit 1\n")
        p.chmod(0o755)
    f = tmp_path / "c.toml"
    f.write_text(f'[slurm]\nbin_dir = "{bindir}"\n[controller]\nstate_dir = "{tmp_path / "st"}"\n[agents]\nenabled = false\n')
    assert main(["controller", "run", "--config", str(f), "--once"]) == 1
    err = capsys.readouterr().err
    lines = [json.loads(x) for x in err.splitlines() if x.startswith("{")]
    assert any(x.get("event") == "slurm_error" and "Unable to contact" in x["msg"] for x in lines)
    assert "Traceback" not in err


# --------------------------------------------------------------------------- agents / metrics / logs
def test_agent_preempter_with_unreachable_and_not_found_agents():
    class Client:
        def __init__(self, addr, node):
            assert {"h:1": "node1", "h:2": "node2"}[addr] == node  # credentials are bound to the agent's node
            self.addr = addr

        def job_stats(self):
            if self.addr.endswith(":1"):
                raise ConnectionError("UNAVAILABLE")
            return [{"slurm_job_id": "7", "job_key": "k7", "step": 5, "total_steps": 10, "state": "running"}]

        def preempt(self, key, sid, timeout_s):
            if self.addr.endswith(":1"):
                err = RuntimeError("NOT_FOUND")
                err.code = "NOT_FOUND"
                raise err
            return {"ok": True, "checkpoint_step": 5, "checkpoint_uri": "file:///c", "message": "ok"}

    p = AgentPreempter({"node1": "h:1", "node2": "h:2"}, Client)
    stats = p.stats()
    assert stats["7"]["step"] == 5 and p.unreachable == {"node1"}
    job = SlurmJob(7, "j", "u", 0, "RUNNING", "", 1, "gpu", 4, nodes=["node1", "node2"])
    out = p.checkpoint(job, 5.0)
    assert out.ok and out.checkpoint_step == 5
    alone = AgentPreempter({"node1": "h:1"}, Client).checkpoint(job, 5.0)
    assert not alone.ok and alone.reached_agent and alone.unknown_job  # the only agent does not know the job
    assert not out.unknown_job
    # the batch host (rank 0) is asked first, whatever the node order
    asked = []

    class Recording(Client):
        def preempt(self, key, sid, timeout_s):
            asked.append(self.addr)
            return super().preempt(key, sid, timeout_s)

    job.batch_host = "node2"
    assert AgentPreempter({"node1": "h:1", "node2": "h:2"}, Recording).checkpoint(job, 5.0).ok
    assert asked == ["h:2"]


def test_agent_preempter_takes_nothing_from_a_fake_agent(tmp_path, controller_logs):
    """The agent of node-a is down and a plain gRPC server sits on its port: it reports job 7 under a bogus key
    with false progress and answers Preempt ok=True with a checkpoint that does not exist. Its replies carry no
    credential, or one signed by a non-agent uid: the real AgentClient refuses them, so the preempter learns
    no stats or key, and the preemption is not ok, reached no agent, and is flagged (no requeue either way)."""
    from agent_helpers import UidAuth, fake_agent, signed_by

    from nodeagent.auth import SharedKeyAuthenticator
    from nodeagent.client import AgentClient

    key = SharedKeyAuthenticator.generate(tmp_path / "agent.key")
    job = SlurmJob(7, "j", "u", 0, "RUNNING", "", 1, "gpu", 4, nodes=["node-a"])
    for trailer in (None, signed_by(UidAuth(key, 1001))):
        controller_logs.clear()
        with fake_agent(trailer) as (addr, fake):
            p = AgentPreempter({"node-a": addr}, lambda a, n: AgentClient(a, UidAuth(key, 0), timeout=5, node=n))
            assert p.stats({"7": ["node-a"]}) == {} and p.unverified == {"node-a"} and p._keys == {}
            out = p.checkpoint(job, 5.0)
            p.close()
        assert fake.calls == ["JobStats", "Preempt"]
        assert not out.ok and not out.reached_agent and out.unverified_reply and out.checkpoint_step is None
        assert "node-a: Preempt: UNAUTHENTICATED_REPLY" in out.message
        assert "not from the agent of node node-a" in out.message
        unverified = [r for r in controller_logs.records if getattr(r, "event", None) == "agent_reply_unverified"]
        assert [(r.levelname, r.rpc) for r in unverified] == [("ERROR", "JobStats"), ("ERROR", "Preempt")]
    # control: the same fake signing as root (which only the agent can) would have been believed
    with fake_agent(signed_by(UidAuth(key, 0))) as (addr, _):
        p = AgentPreempter({"node-a": addr}, lambda a, n: AgentClient(a, UidAuth(key, 0), timeout=5, node=n))
        assert p.checkpoint(job, 5.0).ok
        p.close()


def test_unverified_agent_reply_never_requeues_the_job(tmp_path):
    """preempt_without_agent requeues a job whose agent is unreachable; not one where something answered in the
    agent's name with a reply that is not the agent's (it must not get jobs requeued without a checkpoint)."""
    class Impostor(FakeAgents):
        def checkpoint(self, job, timeout_s):
            self.asked.append(job.job_id)
            return PreemptOutcome(False, False, message="node1: Preempt: UNAUTHENTICATED_REPLY: ...",
                                  unverified_reply=True)

    for agents, requeued in [(FakeAgents(reachable=False), True), (Impostor(), False)]:
        s = FakeSlurm()
        jid = _running(s, 8, "node1")
        ctl = _ctl(tmp_path / type(agents).__name__, s, agents, preempt_without_agent=True)
        _request_preempt(tmp_path / type(agents).__name__, jid)
        rep = ctl.round()
        assert agents.asked == [jid] and rep.ok
        assert ("requeue_hold" in [c[0] for c in s.calls]) == requeued, type(agents).__name__
        if not requeued:
            assert rep.preempted == [] and s.job_list[jid].state == "RUNNING"
            assert ctl.metrics.value("rlsched_preemptions_total", outcome="failed") == 1


def test_agent_stats_are_taken_only_from_the_jobs_nodes(monkeypatch):
    """A report of job 7 from the agent of a node Slurm does not run it on (a stale report, or a process
    posing as that node's agent) is ignored, and its job key is not the one preemption uses."""
    class Client:
        def __init__(self, addr, node):
            self.node = node

        def job_stats(self):
            if self.node == "node2":  # claims job 7, which runs on node1 only, under its own key
                return [{"slurm_job_id": "7", "job_key": "forged", "step": 99, "state": "running"}]
            return [{"slurm_job_id": "7", "job_key": "k7", "step": 5, "state": "running"}]

        def preempt(self, key, sid, timeout_s):
            return {"ok": key == "k7", "checkpoint_step": 5, "checkpoint_uri": "file:///c", "message": key}

    p = AgentPreempter({"node1": "h:1", "node2": "h:2"}, Client)
    import controller.preemption as cp

    warned = []
    monkeypatch.setattr(cp.log, "warning", lambda msg, *a, **kw: warned.append(msg % a))
    stats = p.stats(job_nodes={"7": ["node1"]})
    assert stats["7"]["step"] == 5 and stats["7"]["job_key"] == "k7"
    assert warned == ["agent of node2 reports job 7, which Slurm does not run there: ignored"]
    p.stats(job_nodes={"7": ["node1"]})
    assert len(warned) == 1  # once per node and job
    job = SlurmJob(7, "j", "u", 0, "RUNNING", "", 1, "gpu", 4, nodes=["node1"])
    assert p.checkpoint(job, 5.0).message == "k7"
    # without Slurm's view (job_nodes=None) every agent's report counts, the most advanced wins
    assert AgentPreempter({"node1": "h:1", "node2": "h:2"}, Client).stats()["7"]["step"] == 99


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_metrics_endpoint_and_json_logs(tmp_path):
    s = FakeSlurm()
    s.submit(4)
    ctl = _ctl(tmp_path, s)
    port = _free_port()
    ctl.metrics.serve(port, "127.0.0.1")
    ctl.round()
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    for name in ("rlsched_rounds_total", "rlsched_decision_latency_seconds_bucket", "rlsched_queue_length",
                 "rlsched_preemptions_total", 'rlsched_decisions_total{action="place"} 1.0'):
        assert name in body
    rec = logging.LogRecord("controller.daemon", logging.INFO, __file__, 1, "placed job %s", ("7",), None)
    rec.event, rec.job = "placed", 7
    doc = json.loads(JsonFormatter().format(rec))
    assert doc["msg"] == "placed job 7" and doc["event"] == "placed" and doc["job"] == 7 and doc["level"] == "info"


def test_cs_threshold_preempts_measured_slow_jobs(tmp_path):
    s = FakeSlurm()
    slow, fine = _running(s, 8, "node1"), _running(s, 8, "node2")

    class Agents(FakeAgents):
        def stats(self, job_nodes=None):
            return {str(slow): {"cs": 1.8, "step": 10, "total_steps": 100}, str(fine): {"cs": 1.05}}

    agents = Agents()
    ctl = _ctl(tmp_path, s, agents, cs_preempt_threshold=1.5, min_run_s=60.0, now=1030.0)
    assert ctl.round().preempted == []  # younger than min_run_s
    ctl.clock = lambda: 1100.0
    rep = ctl.round()
    assert rep.preempted == [slow] and agents.asked == [slow] and s.job_list[fine].running


def test_rl_policy_through_the_controller(tmp_path):
    pytest.importorskip("policies.rl")
    s = FakeSlurm()
    ids = [s.submit(g, "rlsched:model=MoE") for g in (8, 4, 2)]
    rep = _ctl(tmp_path, s, policy="rl-prior").round()
    assert rep.ok, rep.error
    assert sorted(j for j, _ in rep.placed) == sorted(ids)
    for jid, plan in rep.placed:
        assert sum(plan.values()) == s.job_list[jid].gpus


def test_unbuildable_policy_fails_the_start(tmp_path, capsys):
    pytest.importorskip("policies.rl")
    from rlsched.cli import main

    bindir = tmp_path / "bin"
    bindir.mkdir()
    sinfo = json.dumps({"nodes": [{"name": "node1", "gres": "gpu:8", "gres_used": "gpu:0", "state": "idle",
                                   "partitions": ["gpu"]}], "errors": []})
    (bindir / "sinfo").write_text(f"#!/bin/sh\necho '{sinfo}'\n")
    # an empty queue, as squeue gives it: JSON for --json, no rows for the controller's -h -O text read
    (bindir / "squeue").write_text('#!/bin/sh\ncase " $* " in *" --json "*) echo \'{"jobs": [], "errors": []}\' ;; esac\n')
    for f in bindir.iterdir():
        f.chmod(0o755)
    f = tmp_path / "c.toml"
    f.write_text(f'[slurm]\nbin_dir = "{bindir}"\n[controller]\npolicy = "rl-base:{tmp_path}/none.safetensors"\n'
                 f'state_dir = "{tmp_path / "st"}"\n[agents]\nenabled = false\n')
    assert main(["controller", "run", "--config", str(f)]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith("rlsched controller: error:") and "none." in err.splitlines()[-1]
    # Slurm unreachable at the first rounds (boot order): the start still fails once Slurm answers
    (bindir / "sinfo").rename(bindir / "sinfo.ok")
    (bindir / "sinfo").write_text(f"#!/bin/sh\nif [ -e {tmp_path}/up ]; then exec {bindir}/sinfo.ok; fi\n"
                                  f"touch {tmp_path}/up; echo 'Unable to contact slurm controller' >&2; exit 1\n")
    (bindir / "sinfo").chmod(0o755)
    f.write_text(f.read_text().replace("[controller]", "[controller]\ninterval_s = 0.05"))
    assert main(["controller", "run", "--config", str(f)]) == 2
    err = capsys.readouterr().err
    assert "Unable to contact" in err and err.splitlines()[-1].startswith("rlsched controller: error:")


def test_status_and_preempt_commands(tmp_path, capsys):
    from rlsched.cli import main

    s = FakeSlurm()
    s.submit(4)
    _ctl(tmp_path, s).round()
    state = str(tmp_path / "state")
    assert main(["controller", "status", "--state-dir", state, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["history"][0]["action"] == "place" and doc["last_round"]["ok"]
    assert main(["controller", "status", "--state-dir", state]) == 0
    assert "recent actions" in capsys.readouterr().out
    assert main(["controller", "preempt", "--state-dir", state, "17"]) == 0
    assert (tmp_path / "state" / "requests" / "preempt-17").exists()
    assert main(["controller", "preempt", "--state-dir", state, "x1"]) == 2
    assert main(["controller", "status", "--state-dir", str(tmp_path / "nowhere")]) == 2


def test_full_gc_runs_between_rounds_only(tmp_path, monkeypatch):
    """run() turns automatic generation-2 collections off inside rounds, collects in idle time once
    the interpreter's own count is reached, and restores the thresholds when it stops."""
    import gc
    import logging

    from controller import daemon

    # an earlier CLI test may have left a handler on a closed stream
    monkeypatch.setattr(logging.getLogger("controller"), "handlers", [])
    s = FakeSlurm()
    ctl = _ctl(tmp_path, s, interval_s=0.001)
    before = gc.get_threshold()
    seen = []
    real_round = ctl.round

    def spy_round():
        seen.append(gc.get_threshold()[2])
        # enough surviving container objects for more young collections than gen 2's count
        keep = [[] for _ in range(2 * before[0] * before[1] * max(before[2], 1))]
        del keep
        return real_round()

    ran = []
    real_idle = daemon.idle_gc
    monkeypatch.setattr(daemon, "idle_gc", lambda every: ran.append(real_idle(every)) or ran[-1])
    monkeypatch.setattr(ctl, "round", spy_round)
    ctl.run(max_rounds=4)
    assert seen and all(t == daemon._NO_AUTO_FULL_GC for t in seen)
    assert gc.get_threshold() == before
    assert ran and any(ran)  # a full collection happened, between rounds
    assert daemon.idle_gc(10**9) is False


# --------------------------------------------------------------------------- check-config builds the policy
def _check_config(tmp_path, capsys, controller_toml: str, *extra: str) -> tuple[int, str, str]:
    from rlsched.cli import main

    f = tmp_path / "check.toml"
    f.write_text(f"[controller]\nstate_dir = {str(tmp_path / 'state')!r}\n" + controller_toml)
    rc = main(["controller", "check-config", *extra, str(f)])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


@pytest.mark.parametrize(
    "toml,needle",
    [
        ('policy = "rl-hybird"\n', "controller.policy: unknown RL policy 'rl-hybird'"),
        ('policy = "gredy"\n', "controller.policy: unknown policy 'gredy'"),
        ('policy = "rl-hybrid"\npolicy_checkpoint = "{tmp}/missing.safetensors"\n',
         "controller.policy_checkpoint: {tmp}/missing.json: checkpoint metadata not found"),
        ('policy = "rl-base:{tmp}/none.json"\n', "controller.policy: {tmp}/none.json: checkpoint metadata not found"),
    ],
)
def test_check_config_fails_on_a_policy_the_daemon_could_not_build(tmp_path, capsys, toml, needle):
    """`check-config` builds the policy as `run` does: a bad name or checkpoint is exit 2 and one line
    naming the file and key, not an error at the daemon's first round."""
    pytest.importorskip("policies.rl")
    rc, out, err = _check_config(tmp_path, capsys, toml.format(tmp=tmp_path))
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("rlsched controller: error: ") and str(tmp_path / "check.toml") in err
    assert needle.format(tmp=tmp_path) in err


def test_check_config_builds_rl_policies_for_the_checkpoint_or_the_given_shape(tmp_path, capsys):
    pytest.importorskip("policies.rl")
    shipped = REPO / "policies" / "checkpoints" / "rl-base-4x8.json"
    rc, out, err = _check_config(tmp_path, capsys, 'policy = "rl-hybrid"\n')
    assert (rc, err) == (0, "") and "OK (policy rl-hybrid" in out and "size-free: runs on any cluster shape" in out
    rc, out, err = _check_config(tmp_path, capsys, 'policy = "rl-hybrid-4x8"\n')
    assert (rc, err) == (0, "") and "OK (policy rl-hybrid-4x8" in out and "shipped 4x8" in out
    rc, out, err = _check_config(tmp_path, capsys, f'policy = "rl-base"\npolicy_checkpoint = "{shipped}"\n')
    assert (rc, err) == (0, "") and "trained on 4x8" in out
    rc, out, err = _check_config(tmp_path, capsys, f'policy = "rl-hybrid:{shipped}"\n')
    assert (rc, err) == (0, "") and "trained on 4x8" in out
    rc, out, err = _check_config(tmp_path, capsys, 'policy = "rl-prior"\n', "--cluster", "2x8")
    assert (rc, err) == (0, "") and "built for 2x8" in out
    # --cluster: the live partition's shape; the size-free rl-hybrid runs there, the 4x8 checkpoint does not
    rc, out, err = _check_config(tmp_path, capsys, 'policy = "rl-hybrid"\n', "--cluster", "2x8")
    assert (rc, err) == (0, "") and "built for 2x8" in out
    rc, out, err = _check_config(tmp_path, capsys, 'policy = "rl-hybrid-4x8"\n', "--cluster", "2x8")
    assert rc == 2 and "runs on a 4x8 cluster only, not 2x8" in err and err.count("\n") == 1
    rc, out, err = _check_config(tmp_path, capsys, 'policy = "greedy:spread"\n', "--cluster", "2x8")
    assert (rc, err) == (0, "")
    rc, out, err = _check_config(tmp_path, capsys, 'policy = "greedy"\n', "--cluster", "4y8")
    assert rc == 2 and "bad cluster spec '4y8'" in err


@pytest.mark.parametrize("text", ["[]", '"x"', "{", '{"released": {"5": {"plan_by_name": {"node1": 8}}}}',
                                  '{"released": {"5": {"t": "soon"}}, "backoff": {"5": {"until": NaN}}}',
                                  '{"released": {"5": [1]}, "preempting": {"x": {"stage": "asked"}}}',
                                  '{"released": {"5": {"t": 1.0, "plan_by_name": {"node1": "8"}}}}'])
def test_a_malformed_journal_never_stops_the_controller(tmp_path, text, caplog, monkeypatch):
    """The journal is rebuilt from Slurm when it cannot be used: a damaged or hand-edited file (wrong shape,
    entries without their time, non-numbers) is dropped entry by entry, with a warning, not a crash."""
    # another test may have run `rlsched controller run` in-process, which stops "controller" logs propagating
    monkeypatch.setattr(logging.getLogger("controller"), "propagate", True)
    s = FakeSlurm()
    jid = s.submit(8)
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "journal.json").write_text(text)
    ctl = _ctl(tmp_path, s)
    for _ in range(2):
        rep = ctl.round()
        assert rep.ok, rep.error
    assert [x for x, _ in rep.placed] == [] and s.job_list[jid].required_nodes  # placed in round 1
    assert "journal" in caplog.text


def test_journal_keeps_well_formed_entries(tmp_path):
    path = tmp_path / "journal.json"
    path.write_text(json.dumps({"released": {"5": {"t": 1.0, "plan_by_name": {"node1": 8}}, "6": {"t": "x"}},
                                "backoff": {"7": {"n": 2, "until": 5.0}}}))
    j = Journal(path)
    assert j["released"] == {"5": {"t": 1.0, "plan_by_name": {"node1": 8}}}
    assert j["backoff"] == {"7": {"n": 2, "until": 5.0}} and j["preempting"] == {} and j["progress"] == {}


@pytest.fixture
def controller_logging():
    """`rlsched controller run` in-process points the "controller" logger at the (captured) stderr: restore it."""
    lg = logging.getLogger("controller")
    saved = (list(lg.handlers), lg.propagate, lg.level)
    yield
    for h in list(lg.handlers):
        if h not in saved[0]:
            lg.removeHandler(h)
            h.close()
    lg.handlers[:] = saved[0]
    lg.propagate, lg.level = saved[1], saved[2]


def test_two_controllers_cannot_share_a_state_dir(tmp_path, capsys, controller_logging):
    """A manual `controller run --once` beside the running service would place and release the same held jobs:
    the state dir is locked while a controller runs (flock: released when its process dies, crash included)."""
    import os

    from rlsched.cli import main

    cfg = tmp_path / "c.toml"
    cfg.write_text(f"[controller]\nstate_dir = {str(tmp_path / 'state')!r}\npolicy = 'greedy'\n[metrics]\nport = 0\n")
    first = Controller(load_config(cfg), slurm=FakeSlurm())
    first.lock_state_dir()
    assert main(["controller", "run", "--config", str(cfg), "--once"]) == 2
    err = capsys.readouterr().err
    assert f"controller.state_dir {tmp_path / 'state'}: in use by another running controller (pid {os.getpid()})" in err
    assert err.count("\n") == 1
    first.unlock_state_dir()  # the first one exits: the state dir is free again
    second = Controller(load_config(cfg), slurm=FakeSlurm())
    second.lock_state_dir()
    assert (tmp_path / "state" / "controller.lock").read_text() == f"{os.getpid()}\n"
    second.unlock_state_dir()


def test_start_up_errors_name_the_setting(tmp_path, capsys, controller_logging):
    import socket

    from rlsched.cli import main

    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    try:
        for extra, needle in ((f"[metrics]\nport = {port}\naddress = '127.0.0.1'\n", f"metrics.port {port}"),
                              ("[metrics]\nport = 9\naddress = 'no-such-host.invalid'\n", "metrics.address 'no-such-host.invalid'"),
                              (f"[controller]\nlog_file = {str(tmp_path / 'missing' / 'x.log')!r}\n", "controller.log_file")):
            cfg = tmp_path / "c.toml"
            body = f"[controller]\nstate_dir = {str(tmp_path / 'st')!r}\npolicy = 'greedy'\n"
            cfg.write_text(body.replace("[controller]\n", extra + "[controller]\n", 1) if extra.startswith("[metrics]")
                           else extra.rstrip("\n") + f"\nstate_dir = {str(tmp_path / 'st')!r}\npolicy = 'greedy'\n")
            assert main(["controller", "run", "--config", str(cfg), "--once"]) == 2, extra
            err = capsys.readouterr().err
            assert needle in err and "Traceback" not in err and err.count("\n") == 1, err
    finally:
        busy.close()


# --------------------------------------------------------------------------- operator mistakes said once, never a failed round
@pytest.fixture
def controller_logs(monkeypatch, caplog):
    """The "controller" loggers' records (an in-process `controller run` may have stopped them propagating,
    and left a handler on a stream pytest has closed since)."""
    monkeypatch.setattr(logging.getLogger("controller"), "propagate", True)
    monkeypatch.setattr(logging.getLogger("controller"), "handlers", [])
    with caplog.at_level(logging.INFO, logger="controller"):
        yield caplog


def _nobody() -> tuple[int, int]:
    import os
    import pwd

    if os.geteuid() != 0:
        pytest.skip("needs root (to act as another user)")
    try:
        pw = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user 'nobody'")
    return pw.pw_uid, pw.pw_gid


def test_controller_makes_its_requests_folder(tmp_path):
    """The controller makes `requests/` itself, so `controller preempt` run as root does not make it root's."""
    _ctl(tmp_path, FakeSlurm())
    assert (tmp_path / "state" / "requests").is_dir()


def test_a_request_the_controller_cannot_remove_is_skipped_not_a_failed_round():
    """The controller runs as `slurm`; a request root left in a root-owned `requests/` cannot be deleted:
    logged once, naming the file, and skipped (acted on, it would preempt its job at every start), and
    the rounds go on. Reproduced for real: a forked child runs the rounds as `nobody`."""
    import os
    import shutil
    import tempfile

    uid, gid = _nobody()
    base = Path(tempfile.mkdtemp(prefix="rlsched-req-"))
    try:
        os.chmod(base, 0o755)
        state = base / "state"
        state.mkdir()
        os.chown(state, uid, gid)  # the controller's state dir (systemd's StateDirectory)
        (state / "requests").mkdir(mode=0o755)  # made by `controller preempt` as root: root's
        s = FakeSlurm()
        jid = _running(s, 8, "node2")
        (state / "requests" / f"preempt-{jid}").write_text("")
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: the controller, as nobody
            code = 1
            try:
                os.close(r)
                os.setgroups([])
                os.setgid(gid)
                os.setuid(uid)
                msgs: list[str] = []
                h = logging.Handler(logging.WARNING)
                h.emit = lambda rec: msgs.append(rec.getMessage())  # type: ignore[method-assign]
                logging.getLogger("controller").addHandler(h)
                cfg = parse_config({"slurm": {"partition": "gpu"}, "agents": {"enabled": False},
                                    "controller": {"state_dir": str(state), "policy": "fifo", "min_run_s": 0.0}})
                agents = FakeAgents()
                ctl = Controller(cfg, slurm=s, preempter=agents, clock=lambda: 2000.0)
                reps = [ctl.round() for _ in range(3)]
                out = {"ok": [x.ok for x in reps], "errors": [x.error for x in reps], "asked": agents.asked,
                       "msgs": msgs}
                os.write(w, json.dumps(out).encode())
                code = 0
            finally:
                os._exit(code)
        os.close(w)
        with os.fdopen(r) as f:
            doc = json.loads(f.read() or "{}")
        assert os.waitpid(pid, 0)[1] == 0 and doc
        assert doc["ok"] == [True, True, True], doc["errors"]
        assert doc["asked"] == []  # skipped: not preempted
        stuck = [m for m in doc["msgs"] if f"preempt-{jid}" in m]
        assert len(stuck) == 1, doc["msgs"]
        assert "owned by root" in stuck[0] and "runuser -u nobody -- rlsched controller preempt" in stuck[0]
        assert (state / "requests" / f"preempt-{jid}").exists()
    finally:
        shutil.rmtree(base)


def test_a_request_whose_removal_fails_is_acted_on_once(tmp_path, monkeypatch, controller_logs):
    """Removal failing only after the preemption (a read-only file system, a race): the round still
    succeeds, and the leftover file does not preempt the job again when it runs again."""
    s = FakeSlurm()
    jid = _running(s, 8, "node2")
    agents = FakeAgents()
    ctl = _ctl(tmp_path, s, agents)
    _request_preempt(tmp_path, jid)
    real = Path.unlink

    def unlink(self, missing_ok=False):
        if self.name.startswith("preempt-"):
            raise PermissionError(13, "Permission denied")
        return real(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", unlink)
    rep = ctl.round()
    assert rep.ok and rep.preempted == [jid] and agents.asked == [jid]
    for _ in range(3):  # placed again, runs again: the stale request is not acted on again
        assert ctl.round().ok
        s.schedule()
    assert s.job_list[jid].running and agents.asked == [jid]
    stuck = [r for r in controller_logs.records if getattr(r, "event", "") == "preempt_request_stuck"]
    assert len(stuck) == 1 and "Permission denied" in stuck[0].getMessage()


def test_preempt_checks_every_id_before_writing_anything(tmp_path, capsys, controller_logs):
    from rlsched.cli import main

    _ctl(tmp_path, FakeSlurm()).round()
    state = str(tmp_path / "state")
    assert main(["controller", "preempt", "--state-dir", state, "12", "abc", "13"]) == 2
    err = capsys.readouterr().err
    assert "'abc'" in err and err.count("\n") == 1
    assert list((tmp_path / "state" / "requests").iterdir()) == []
    assert main(["controller", "preempt", "--state-dir", str(tmp_path / "nowhere"), "12"]) == 2
    assert "no such state dir" in capsys.readouterr().err and not (tmp_path / "nowhere").exists()


def _dead_pid() -> int:
    import subprocess

    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_preempt_warns_when_no_controller_runs(tmp_path, capsys, controller_logs):
    """The request then waits for a controller: said on stderr, still exit 0."""
    import os

    from rlsched.cli import main

    _ctl(tmp_path, FakeSlurm()).round()  # status.json with this (live) pid
    state = tmp_path / "state"
    assert main(["controller", "preempt", "--state-dir", str(state), "12"]) == 0
    assert capsys.readouterr().err == ""
    doc = json.loads((state / "status.json").read_text())
    doc["pid"] = _dead_pid()
    (state / "status.json").write_text(json.dumps(doc))
    assert main(["controller", "preempt", "--state-dir", str(state), "13"]) == 0
    cap = capsys.readouterr()
    assert "preemption of job 13 requested" in cap.out
    assert "warning: no controller seems to be running" in cap.err and cap.err.count("\n") == 1
    (state / "controller.lock").write_text(f"{os.getpid()}\n")  # a live controller holds the lock
    assert main(["controller", "preempt", "--state-dir", str(state), "14"]) == 0
    assert capsys.readouterr().err == ""


def test_preempt_refuses_a_caller_who_does_not_own_the_state_dir(tmp_path, capsys, controller_logs):
    """Root's request files in the `slurm` user's state dir could not be removed by the controller."""
    import os

    from rlsched.cli import main

    uid, gid = _nobody()
    _ctl(tmp_path, FakeSlurm()).round()
    state = tmp_path / "state"
    os.chown(state, uid, gid)
    assert main(["controller", "preempt", "--state-dir", str(state), "12"]) == 2
    err = capsys.readouterr().err
    assert "belongs to nobody" in err and "runuser -u nobody -- rlsched controller preempt" in err
    assert err.count("\n") == 1 and list((state / "requests").iterdir()) == []


def test_status_says_when_the_controller_is_not_running(tmp_path, capsys, controller_logs):
    from rlsched.cli import main

    _ctl(tmp_path, FakeSlurm()).round()
    state = tmp_path / "state"
    assert main(["controller", "status", "--state-dir", str(state)]) == 0
    out = capsys.readouterr().out
    assert "not running" not in out
    doc = json.loads((state / "status.json").read_text())
    dead = doc["pid"] = _dead_pid()
    (state / "status.json").write_text(json.dumps(doc))
    assert main(["controller", "status", "--state-dir", str(state)]) == 0
    assert f"(pid {dead}, not running)" in capsys.readouterr().out


def test_jobs_left_alone_for_their_partition_or_missing_mark_are_warned_about_once(tmp_path, controller_logs):
    """A marked job held in another partition stays held for ever; an unmarked GPU job in the partition means
    job_submit.lua is not in use: both are said once per job, naming what to change."""
    s = FakeSlurm()
    other = s.submit(4)
    s.job_list[other].partition = "debug"
    unmarked = s.submit(2, managed=False)
    cpu = s.submit(0, managed=False)  # a CPU job: nothing to say
    released = s.submit(2)
    s.job_list[released].partition, s.job_list[released].priority = "debug", 1  # not held: Slurm's business
    ctl = _ctl(tmp_path, s)
    for _ in range(2):
        assert ctl.round().ok
    msgs = [r.getMessage() for r in controller_logs.records if getattr(r, "event", "") == "job_warning"]
    mine = [m for m in msgs if m.startswith(f"job {other}:")]
    assert len(mine) == 1 and "partition debug" in mine[0] and "[slurm] partition gpu" in mine[0]
    assert "MANAGED_PARTITION" in mine[0]
    mine = [m for m in msgs if m.startswith(f"job {unmarked}:")]
    assert len(mine) == 1 and "not marked by job_submit.lua" in mine[0] and "JobSubmitPlugins=lua" in mine[0]
    assert not [m for m in msgs if m.startswith((f"job {cpu}:", f"job {released}:"))]
    assert s.job_list[other].held  # still left alone


@pytest.mark.parametrize("auth,needle", [("bogus", "agents.auth: unknown auth spec 'bogus'"),
                                         ("sharedkey:/nonexistent/key", "agents.auth: shared key file /nonexistent/key does not exist")])
def test_check_config_builds_the_agent_auth(tmp_path, capsys, auth, needle):
    """The daemon would log one error and run without agents: check-config fails instead."""
    from rlsched.cli import main

    f = tmp_path / "c.toml"
    state = f"[controller]\nstate_dir = {str(tmp_path / 'state')!r}\n"  # one this user can make
    f.write_text(f"{state}[agents]\nauth = {auth!r}\n")
    assert main(["controller", "check-config", str(f)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(f) in err and needle in err
    f.write_text(f"{state}[agents]\nenabled = false\nauth = {auth!r}\n")  # not used
    assert main(["controller", "check-config", str(f)]) == 0
    key = tmp_path / "agent.key"
    key.write_text("k" * 32)
    key.chmod(0o644)
    f.write_text(f"{state}[agents]\nauth = 'sharedkey:{key}'\n")
    assert main(["controller", "check-config", str(f)]) == 2
    assert "chmod 600" in capsys.readouterr().err
    key.chmod(0o600)
    assert main(["controller", "check-config", str(f)]) == 0


def test_agent_addresses_that_match_no_node_are_warned_about_once(tmp_path, controller_logs):
    cfg = parse_config({"slurm": {"partition": "gpu"},
                        "controller": {"state_dir": str(tmp_path / "state"), "policy": "fifo"},
                        "agents": {"addresses": {"gpu09": "h:1", "node1": "h:2", "node2": "h:3"}}})
    ctl = Controller(cfg, slurm=FakeSlurm(), preempter=NoAgents(), clock=lambda: 2000.0)
    for _ in range(2):
        assert ctl.round().ok
    recs = [r.getMessage() for r in controller_logs.records if getattr(r, "event", "").startswith("agent_address")]
    assert len(recs) == 2, recs
    assert "gpu09 not a Slurm node of partition gpu" in recs[0] and "node1, node2, node3, node4" in recs[0]
    assert "no agent address for node(s) node3, node4" in recs[1]


def test_permission_denied_gets_a_hint_once(tmp_path, controller_logs):
    """A controller that is no Slurm operator fails every placement: the error each time, the fix once."""
    s = FakeSlurm()
    jid = s.submit(4)

    def place(job_id, nodes, gpus=None, per_node=None, tres_style="gres:gpu"):
        raise SlurmError(["scontrol", "update", f"JobId={job_id}"], f"exit status 1: Access/permission denied for job {job_id}")

    s.place = place  # type: ignore[method-assign]
    ctl = _ctl(tmp_path, s)
    for _ in range(3):
        assert ctl.round().placed == []
    failed = [r for r in controller_logs.records if getattr(r, "event", "") == "place_failed"]
    hints = [r.getMessage() for r in controller_logs.records if getattr(r, "event", "") == "slurm_permission"]
    assert len(failed) == 3 and f"placing job {jid} failed" in failed[0].getMessage()
    assert len(hints) == 1 and "adminlevel=Operator" in hints[0] and "SlurmUser" in hints[0]


def test_drained_node_is_never_a_target_not_even_after_a_preemption():
    """A drained node's GPUs count as free for nothing: build_state marks it unusable, so a preemptive
    heuristic preempts the job on the usable node rather than the one on the draining node (whose GPUs
    Slurm would not give to the new job), and the new job is planned on the usable node."""
    from controller.slurm import MANAGED_MARK
    from policies.heuristics import make_heuristic

    nodes = [SlurmNode("node1", 8, 8, "mixed", flags=("DRAIN",), partitions=("gpu",)),
             SlurmNode("node2", 8, 8, "allocated", partitions=("gpu",))]
    cl = build_cluster(nodes, "gpu", 16.0, 5.0)
    perf = ContentionModel(cl)

    def job(i, state, nodes_, samples, submit):
        return SlurmJob(job_id=i, name=f"j{i}", user="u", user_id=1, state=state, reason="",
                        priority=0 if state == "PENDING" else 1, partition="gpu", gpus=8, nodes=nodes_,
                        gpus_per_node={n: 8 for n in nodes_}, comment=f"rlsched:model=MoE,samples={samples}",
                        admin_comment=MANAGED_MARK, submit_time=submit, start_time=1000.0 if nodes_ else None)

    jobs = [job(1, "RUNNING", ["node1"], "1e10", 0.0), job(2, "RUNNING", ["node2"], "1e9", 0.0),
            job(3, "PENDING", [], "1e3", 50000.0)]
    view = build_state(100000.0, cl, nodes, jobs, perf, partition="gpu", default_model="MoE", default_runtime_s=3600)
    assert view.state.usable.tolist() == [False, True]
    dec = make_heuristic("srtf", perf).schedule(view.state)
    assert dec.preempt == ["2"]
    assert [(jid, [cl.nodes[n].name for n in p.nodes]) for jid, p in dec.place] == [("3", ["node2"])]


def test_managed_job_pending_without_a_hold_it_did_not_release_is_held_again(tmp_path):
    """A managed job pending without a hold that the journal never released (its owner requeued it, or
    Slurm did after a node failure) is held again in the same round and then placed by the policy;
    a job the controller released itself keeps its start grace."""
    s = FakeSlurm()
    a = s.submit(8)
    ctl = _ctl(tmp_path, s, now=1000.0)
    rep = ctl.round()  # the journal is new: nothing to adopt, a placed
    assert [jid for jid, _ in rep.placed] == [a]
    s.schedule()
    assert s.job_list[a].running
    _ctl(tmp_path, s, now=1005.0).round()  # sees it running: its release is done
    # the owner requeues it (`scontrol requeue` keeps its priority: pending, no hold)
    s.finish(a, "PENDING")
    s.job_list[a].reason = "BeginTime"
    assert s.job_list[a].pending and not s.job_list[a].held
    ctl = _ctl(tmp_path, s, now=1010.0)
    rep = ctl.round()
    assert rep.held_back == [a] and ("hold", a) in s.calls
    assert ctl.metrics.value("rlsched_decisions_total", action="rehold") == 1
    assert [c for c in s.calls if c[0] == "release"] == [("release", a)] * 2  # placed again by rlsched
    # released by rlsched and not started yet: not held again before its grace ends
    rep = _ctl(tmp_path, s, now=1011.0).round()
    assert rep.held_back == [] and [c for c in s.calls if c[0] == "hold"] == [("hold", a)]


def test_damaged_journal_adopts_unheld_jobs_once(tmp_path):
    """A journal with a damaged `released` entry may have lost a release: the first round adopts a
    pending job without a hold (start grace), as with a missing journal; later rounds do not."""
    s = FakeSlurm()
    a = s.submit(8)
    _ctl(tmp_path, s).round()  # released, not started
    jf = tmp_path / "state" / "journal.json"
    raw = json.loads(jf.read_text())
    raw["released"]["999"] = {"t": "yesterday"}  # damaged entry: dropped, so the journal is not intact
    raw["released"].pop(str(a))
    jf.write_text(json.dumps(raw))
    ctl = _ctl(tmp_path, s)
    assert not ctl.journal.intact
    rep = ctl.round()
    assert rep.held_back == [] and str(a) in ctl.journal["released"]
    assert [c for c in s.calls if c[0] == "release"] == [("release", a)]


# --------------------------------------------------------------------------- failures seen on real clusters
class PartlyDeadAgents(FakeAgents):
    """Agents that cannot checkpoint the jobs in ``dead`` (their node's agent is down)."""

    def __init__(self, dead=(), **kw) -> None:
        super().__init__(**kw)
        self.dead = set(dead)

    def checkpoint(self, job, timeout_s):
        if job.job_id in self.dead:
            self.asked.append(job.job_id)
            return PreemptOutcome(False, False, message="node1: Preempt: UNAVAILABLE")
        return super().checkpoint(job, timeout_s)


def _blocked_victim_cluster(why: str):
    """node1: a very long job V (SRTF's victim for a short 16-GPU job J); node2, node3: jobs nearly done
    (no victims); node4 idle; held: J (16 GPUs, short) and K (8 GPUs, longer than J)."""
    s = FakeSlurm()
    v = _running(s, 8, "node1")
    s.job_list[v].comment = "rlsched:model=MoE,samples=1e12"
    for node in ("node2", "node3"):
        s.job_list[_running(s, 8, node)].comment = "rlsched:model=MoE,samples=10"
    j = s.submit(16, "rlsched:model=MoE,samples=1e5")
    k = s.submit(8, "rlsched:model=MoE,samples=1e6")
    if why == "no_requeue":
        s.job_list[v].requeue = False
    return s, v, j, k


@pytest.mark.parametrize("why", ["agent_down", "no_requeue"])
def test_a_victim_that_cannot_be_preempted_does_not_block_free_gpus(tmp_path, why):
    """SRTF chooses V (agent dead) as the victim for J and counts V's GPUs as freed; the preemption fails and
    J's placement is rejected. The failed victim is then no victim for the policy for 30 s (doubling, at most
    10 min), the round decides again at once without it, and K gets the idle node4 in the same round (the
    same decision does not come back every round). A --no-requeue job is never offered to the policy as a
    victim at all."""
    s, v, j, k = _blocked_victim_cluster(why)
    agents = PartlyDeadAgents(dead=[v])
    t = [2000.0]
    ctl = _ctl(tmp_path, s, agents, policy="srtf")
    ctl.clock = lambda: t[0]
    rep = ctl.round()
    assert rep.ok, rep.error
    assert rep.preempted == [] and rep.placed == [(k, {"node4": 8})]
    assert s.job_list[v].running and s.job_list[j].held
    assert agents.asked == ([v] if why == "agent_down" else [])
    s.schedule()
    for _ in range(5):  # within the back-off: V is not chosen again, nothing is rejected
        t[0] += 5.0
        rep = ctl.round()
        assert rep.ok and rep.preempted == [] and rep.placed == []
    assert agents.asked == ([v] if why == "agent_down" else [])
    assert ctl.metrics.value("rlsched_decisions_total", action="rejected") == 0  # its decision was dropped
    if why == "no_requeue":
        return
    t[0] = 2031.0  # 30 s after the failure: tried once more, then left alone for 60 s
    ctl.round()
    assert agents.asked == [v, v]
    t[0] = 2031.0 + 59.0
    ctl.round()
    assert agents.asked == [v, v]
    t[0] = 2031.0 + 61.0
    ctl.round()
    assert agents.asked == [v, v, v]
    assert ctl.metrics.value("rlsched_preemptions_total", outcome="failed") == 3


def test_build_state_marks_no_requeue_and_failed_victims_not_preemptible():
    s = FakeSlurm()
    a, b, c = _running(s, 8, "node1"), _running(s, 8, "node2"), _running(s, 8, "node3")
    s.job_list[a].requeue = False
    nodes, jobs = s.nodes(), s.jobs()
    cluster = build_cluster(nodes, "gpu", 16.0, 5.0)
    v = build_state(2000.0, cluster, nodes, jobs, ContentionModel(cluster), partition="gpu", default_model="MoE",
                    default_runtime_s=60.0, no_preempt={str(b)})
    assert {r.job_id: r.preemptible for r in v.state.running} == {str(a): False, str(b): False, str(c): True}


def test_agent_preempter_fails_fast_for_unreachable_or_stuck_agents():
    """A stopped (SIGSTOP) agent must not hold the round for preempt_timeout_s + agents.timeout_s per victim:
    an agent in the stats back-off is not asked at all, and every Preempt is preceded by a quick health probe
    (short deadline); a failed probe puts the agent in the back-off."""
    calls: list[tuple[str, str]] = []

    class Client:
        def __init__(self, addr, node):
            self.node = node

        def job_stats(self):
            calls.append(("stats", self.node))
            if self.node == "node1":
                raise ConnectionError("UNAVAILABLE")
            return []

        def preempt(self, key, sid, timeout_s):
            calls.append(("preempt", self.node))
            return {"ok": True, "checkpoint_step": 5, "checkpoint_uri": "file:///c", "message": "ok"}

    class Probe:
        def __init__(self, addr, node):
            self.node = node

        def health(self):
            calls.append(("health", self.node))
            if self.node == "node2":  # stopped: the probe's short deadline passes
                raise TimeoutError("Health: DEADLINE_EXCEEDED")
            return {"node": self.node}

    p = AgentPreempter({n: f"h:{i}" for i, n in enumerate(("node1", "node2", "node3"))}, Client, probe_factory=Probe)
    p.stats()
    assert p.unreachable == {"node1"}

    def job(i, node):
        return SlurmJob(i, "j", "u", 0, "RUNNING", "", 1, "gpu", 4, nodes=[node], batch_host=node)

    calls.clear()
    out = p.checkpoint(job(1, "node1"), 60.0)  # in the back-off: not even probed
    assert not out.ok and not out.reached_agent and "unreachable" in out.message and calls == []
    out = p.checkpoint(job(2, "node2"), 60.0)  # probe fails: no Preempt, and the agent is now in the back-off
    assert not out.ok and not out.reached_agent and "DEADLINE_EXCEEDED" in out.message
    assert calls == [("health", "node2")] and "node2" in p.unreachable
    calls.clear()
    assert not p.checkpoint(job(3, "node2"), 60.0).ok and calls == []  # fails fast now
    assert p.checkpoint(job(4, "node3"), 60.0).ok and calls == [("health", "node3"), ("preempt", "node3")]


def test_make_preempter_probes_with_a_short_deadline(monkeypatch):
    import controller.preemption as cp
    nodeagent_client = pytest.importorskip("nodeagent.client")

    made: list[tuple[str, float]] = []

    class Client:
        def __init__(self, addr, auth, timeout, node):
            made.append((node, timeout))

    monkeypatch.setattr(nodeagent_client, "AgentClient", Client)
    monkeypatch.setattr(cp, "make_auth", lambda *spec: object())
    for timeout_s, probe_s in ((10.0, cp.PROBE_TIMEOUT_S), (1.5, 1.5)):
        made.clear()
        p = cp.make_preempter({"node1": "h:1"}, "munge", timeout_s)
        p._client("node1")
        p._not_ready("node1")
        assert made == [("node1", timeout_s), ("node1", probe_s)]


def test_a_rounds_preemptions_stop_after_one_preemptions_worth_of_time(tmp_path):
    """One round starts no other preemption once it has spent preempt_timeout_s + agents.timeout_s on them
    (here 60 + 10 s; each checkpoint takes 40 s): the third victim is deferred, not failed, its operator
    request is kept, and the next round preempts it."""
    s = FakeSlurm()
    ids = [_running(s, 8, f"node{i}") for i in (1, 2, 3)]
    t = [2000.0]

    class Slow(FakeAgents):
        def checkpoint(self, job, timeout_s):
            t[0] += 40.0
            return super().checkpoint(job, timeout_s)

    agents = Slow()
    ctl = _ctl(tmp_path, s, agents, preempt_timeout_s=60.0)
    ctl.clock = lambda: t[0]
    for jid in ids:
        _request_preempt(tmp_path, jid)
    rep = ctl.round()
    assert rep.ok and rep.preempted == ids[:2] and agents.asked == ids[:2] and s.job_list[ids[2]].running
    assert ctl.metrics.value("rlsched_preemptions_total", outcome="failed") == 0
    assert (tmp_path / "state" / "requests" / f"preempt-{ids[2]}").exists()
    rep = ctl.round()
    assert rep.preempted == [ids[2]]
    assert not (tmp_path / "state" / "requests" / f"preempt-{ids[2]}").exists()


def test_release_time_is_when_the_release_happened(tmp_path):
    """A release made after a slow preemption in the same round is recorded when it happens, not at the
    round's start (which would hold the job back almost at once: "released 26 s ago but not started");
    checkpoint times likewise."""
    s = FakeSlurm(nodes=1)
    v = _running(s, 8, "node1")
    s.job_list[v].comment = "rlsched:model=MoE,samples=1e12"
    k = s.submit(8, "rlsched:model=MoE,samples=1e3")
    t = [2000.0]

    class Slow(FakeAgents):
        def checkpoint(self, job, timeout_s):
            t[0] += 26.0
            return super().checkpoint(job, timeout_s)

    ctl = _ctl(tmp_path, s, Slow(), policy="srtf", start_grace_s=20.0)
    ctl.clock = lambda: t[0]
    rep = ctl.round()
    assert rep.preempted == [v] and [x for x, _ in rep.placed] == [k]
    assert ctl.journal["released"][str(k)]["t"] == 2026.0
    # GPU-seconds until the checkpoint, not until the round started
    assert ctl.journal["progress"][str(v)]["attained_service"] == 8 * (2026.0 - 1000.0)
    t[0] = 2030.0  # 4 s after its release: not held back
    assert ctl.round().held_back == []
    t[0] = 2047.0  # 21 s after it
    assert ctl.round().held_back == [k]


def test_start_grace_restarts_after_slurm_was_unreachable(tmp_path):
    """Chaos finding: after a 60 s slurmctld outage the first good round held back jobs released just
    before it ("released 57 s ago but not started"): Slurm could not have started them. After failed
    rounds, released jobs get their full grace again from the first round that reads the queue."""
    s = FakeSlurm()
    a = s.submit(8)
    t = [1000.0]
    ctl = _ctl(tmp_path, s, start_grace_s=30.0)
    ctl.clock = lambda: t[0]
    assert [x for x, _ in ctl.round().placed] == [a]
    s.fail = "jobs"  # slurmctld down
    for t[0] in (1010.0, 1020.0, 1030.0, 1040.0, 1050.0):
        assert ctl.round().error_kind == "slurm"
    s.fail = None
    t[0] = 1057.0
    rep = ctl.round()
    assert rep.ok and rep.held_back == [] and ctl.journal["released"][str(a)]["t"] == 1057.0
    t[0] = 1080.0  # 23 s later, Slurm up all along: still within its grace
    assert ctl.round().held_back == []
    t[0] = 1088.0  # 31 s after the first good round: held back
    assert ctl.round().held_back == [a]


def _tmp_files(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.startswith((".journal.", ".status.")))


def test_journal_write_errors_name_the_file_and_leave_no_temp_files(tmp_path, monkeypatch):
    import errno

    from controller.daemon import StateDirError

    d = tmp_path / "state"
    (d / "journal.json").mkdir(parents=True)  # a folder in its place
    j = Journal(d / "journal.json")
    with pytest.raises(StateDirError, match=f"cannot write {d / 'journal.json'}: Is a directory"):
        j.save()
    assert _tmp_files(d) == []
    (d / "journal.json").rmdir()

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("controller.daemon.os.fsync", full)
    with pytest.raises(StateDirError, match="No space left on device") as exc:
        j.save()
    assert exc.value.errno == errno.ENOSPC and str(d / "journal.json") in str(exc.value)
    assert _tmp_files(d) == [] and not (d / "journal.json").exists()


def test_an_unwritable_state_dir_releases_nothing_but_the_round_goes_on(tmp_path, monkeypatch, controller_logs):
    """A full state dir: nothing is released or preempted while the journal cannot record it (intent before
    release), the rest of the round goes on (a job that never started is held back), the error names the
    file, is logged once as state_dir_unwritable, counted, shown in status.json, and no temp file stays (no
    traceback per round, no stale status.json)."""
    import errno

    s = FakeSlurm()
    x = s.submit(8)
    t = [1000.0]
    ctl = _ctl(tmp_path, s, start_grace_s=30.0)
    ctl.clock = lambda: t[0]
    assert [j for j, _ in ctl.round().placed] == [x]  # released; Slurm never starts it
    b = s.submit(8)
    real_fsync = __import__("os").fsync

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("controller.daemon.os.fsync", full)  # the journal's writes fail; status.json's do not
    journal = tmp_path / "state" / "journal.json"
    for t[0] in (1040.0, 1043.0):
        rep = ctl.round()
        assert not rep.ok and rep.error_kind == "state_dir" and rep.placed == []
        assert str(journal) in rep.error and "No space left on device" in rep.error
        status = json.loads((tmp_path / "state" / "status.json").read_text())
        assert status["last_round"]["error"] == rep.error and status["last_round"]["error_kind"] == "state_dir"
    assert ("hold", x) in s.calls  # held back although the journal could not record it
    assert [c for c in s.calls if c[0] == "release"] == [("release", x)]  # nothing released since
    assert s.job_list[b].held and s.job_list[x].held
    assert _tmp_files(tmp_path / "state") == []
    assert ctl.metrics.value("rlsched_state_dir_errors_total") >= 2
    events = [r for r in controller_logs.records if getattr(r, "event", "") == "state_dir_unwritable"]
    assert len(events) == 1 and str(journal) in events[0].getMessage()
    assert not [r for r in controller_logs.records if getattr(r, "event", "") == "round_error"]
    monkeypatch.setattr("controller.daemon.os.fsync", real_fsync)  # space again
    t[0] = 1046.0
    rep = ctl.round()
    assert rep.ok and {j for j, _ in rep.placed} == {x, b}
    assert json.loads(journal.read_text())["released"].keys() == {str(x), str(b)}
    assert [r for r in controller_logs.records if getattr(r, "event", "") == "state_dir_writable"]


def test_status_write_errors_leave_no_temp_files(tmp_path, controller_logs):
    s = FakeSlurm()
    s.submit(4)
    ctl = _ctl(tmp_path, s)
    (tmp_path / "state" / "status.json").mkdir()
    assert ctl.round().ok and ctl.round().ok  # the round itself is fine
    assert _tmp_files(tmp_path / "state") == []
    assert ctl.metrics.value("rlsched_state_dir_errors_total") == 2
    events = [r.getMessage() for r in controller_logs.records if getattr(r, "event", "") == "state_dir_unwritable"]
    assert len(events) == 1 and str(tmp_path / "state" / "status.json") in events[0]


def test_a_lock_file_that_is_a_folder_is_named(tmp_path, capsys, controller_logging):
    """A controller.lock that is a folder is named in one line, not a bare "[Errno 21] Is a directory"."""
    from rlsched.cli import main

    cfg = tmp_path / "c.toml"
    cfg.write_text(f"[controller]\nstate_dir = {str(tmp_path / 'state')!r}\npolicy = 'greedy'\n[metrics]\nport = 0\n")
    lock = tmp_path / "state" / "controller.lock"
    lock.mkdir(parents=True)
    assert main(["controller", "run", "--config", str(cfg), "--once"]) == 2
    err = capsys.readouterr().err
    assert f"cannot open its lock file {lock}: Is a directory" in err and err.count("\n") == 1


def test_a_lock_file_that_cannot_name_the_pid_still_locks(tmp_path, monkeypatch, controller_logs):
    """Chaos finding: starting on a full disk exited with a bare "[Errno 28] No space left on device" (writing
    the pid into controller.lock). The lock is what matters and it is held: the controller starts and says
    which file it could not write."""
    import errno

    ctl = _ctl(tmp_path, FakeSlurm())
    lock = tmp_path / "state" / "controller.lock"

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("controller.daemon.os.write", full)
    ctl.lock_state_dir()
    try:
        events = [r.getMessage() for r in controller_logs.records if getattr(r, "event", "") == "state_dir_unwritable"]
        assert len(events) == 1 and f"cannot write {lock}: No space left on device" in events[0]
        assert ctl.metrics.value("rlsched_state_dir_errors_total") == 1
    finally:
        ctl.unlock_state_dir()


@pytest.mark.parametrize("min_run_s, preempted", [(0.0, True), (200.0, False)])
def test_min_run_s_reaches_the_heuristics(tmp_path, min_run_s, preempted):
    """controller.min_run_s reaches the heuristics (OrderedPolicy.min_run): with min_run_s = 0 SRTF preempts
    a job that has run less than the 300 s default."""
    s = FakeSlurm(nodes=1)
    v = _running(s, 8, "node1")  # started at 1000
    s.job_list[v].comment = "rlsched:model=MoE,samples=1e12"
    s.submit(8, "rlsched:model=MoE,samples=1e3")
    ctl = _ctl(tmp_path, s, FakeAgents(), now=1100.0, policy="srtf", min_run_s=min_run_s)
    rep = ctl.round()
    assert ctl.policy.min_run == min_run_s
    assert rep.preempted == ([v] if preempted else [])


def test_reload_applies_min_run_s_to_the_policy(tmp_path):
    cfgfile = tmp_path / "c.toml"
    cfgfile.write_text(f"[controller]\nstate_dir = {str(tmp_path / 'state')!r}\npolicy = 'srtf'\nmin_run_s = 5\n")
    s = FakeSlurm()
    s.submit(4)
    ctl = Controller(load_config(cfgfile), slurm=s, preempter=NoAgents())
    ctl.round()
    assert ctl.policy.min_run == 5.0
    cfgfile.write_text(cfgfile.read_text().replace("min_run_s = 5", "min_run_s = 42"))
    ctl.request_reload()
    ctl.round()
    assert ctl.policy.min_run == 42.0


def test_probe_never_turns_an_unauthenticated_reply_into_no_agent():
    """Merged with agent protocol 3: an agent port whose Health reply is not authenticated as the agent's is
    still asked to Preempt, so the outcome is unverified_reply (no requeue without a checkpoint, even with
    preempt_without_agent), not "no agent reached"; the same after its stats put it in the back-off."""
    from controller.preemption import UNAUTHENTICATED_REPLY

    class Forged(Exception):
        code = UNAUTHENTICATED_REPLY

    class Client:
        def __init__(self, addr, node):
            pass

        def job_stats(self):
            raise Forged("JobStats: reply not signed by node1's agent")

        def preempt(self, key, sid, timeout_s):
            raise Forged("Preempt: reply not signed by node1's agent")

    class Probe(Client):
        def health(self):
            raise Forged("Health: reply not signed by node1's agent")

    job = SlurmJob(1, "j", "u", 0, "RUNNING", "", 1, "gpu", 4, nodes=["node1"], batch_host="node1")
    p = AgentPreempter({"node1": "h:1"}, Client, probe_factory=Probe)
    out = p.checkpoint(job, 60.0)
    assert not out.ok and out.unverified_reply and not out.reached_agent
    p.stats()  # puts node1 in the back-off as unverified
    out = p.checkpoint(job, 60.0)
    assert not out.ok and out.unverified_reply


# --------------------------------------------------------------------------- controller CLI: status, check-config, help
def _status_doc(**changes) -> dict:
    doc = {"time": 1000.0, "pid": 1, "policy": "greedy", "rounds": 3, "interval_s": 5.0,
           "last_round": {"ok": True, "error": None, "queue": 2, "running": 1},
           "history": [{"t": 990.0, "action": "place", "job": 7, "detail": {"node1": 4}}]}
    doc.update(changes)
    return {k: v for k, v in doc.items() if v is not _DROP}


_DROP = object()


_BAD_STATUS = [
    ("{bad", "not JSON: Expecting property name"),
    ("", "empty"),
    ("\n", "empty"),
    ("[]", "a JSON array, not an object"),
    ('"x"', "a JSON string, not an object"),
    ("{}", "no 'time'"),
    (json.dumps(_status_doc(time=_DROP)), "no 'time'"),
    (json.dumps(_status_doc(policy=_DROP)), "no 'policy'"),
    (json.dumps(_status_doc(time="soon")), "'time' must be a number, got 'soon'"),
    ('{"time": NaN}', "'time' must be a number"),
    (json.dumps(_status_doc(time=1e300)), "timestamp out of range"),
    (json.dumps(_status_doc(pid=True)), "'pid' must be an integer"),
    (json.dumps(_status_doc(last_round=[])), "'last_round' must be an object"),
    (json.dumps(_status_doc(history={})), "'history' must be an array"),
    (json.dumps(_status_doc(history=[{"t": 1.0, "action": "place"}])), "history[0] is not an action"),
    (json.dumps(_status_doc(history=[{"t": 1e300, "action": "place", "job": 7}])), "out of range"),
]


@pytest.mark.parametrize("text,why", _BAD_STATUS, ids=[why for _, why in _BAD_STATUS])
def test_status_refuses_a_status_file_that_is_not_the_controllers(tmp_path, capsys, text, why):
    """A damaged status.json is one line and exit 2 (not a JSONDecodeError or AttributeError traceback), and
    `{}` is refused (not printed as "policy None, None rounds, last 1795322673 s ago")."""
    from rlsched.cli import main

    (tmp_path / "status.json").write_text(text)
    for json_flag in ([], ["--json"]):
        assert main(["controller", "status", "--state-dir", str(tmp_path), *json_flag]) == 2
        cap = capsys.readouterr()
        assert cap.out == "" and cap.err.count("\n") == 1, cap.err
        assert cap.err.startswith(f"rlsched controller: error: {tmp_path / 'status.json'}: not a valid status file (")
        assert why in cap.err


def test_status_names_a_state_dir_that_is_not_a_directory(tmp_path, capsys):
    """A file as the state dir, and a status.json that is a folder, are named in one line (not a raw
    "[Errno 20] Not a directory: ..." or "[Errno 21]")."""
    from rlsched.cli import main

    afile = tmp_path / "afile"
    afile.write_text("")
    (tmp_path / "st" / "status.json").mkdir(parents=True)
    for state, msg in ((afile, f"{afile}: not a directory (a state dir is a folder)"),
                       (afile / "x" / "y", f"{afile / 'x' / 'y'}: no such state dir: {afile} is not a directory"),
                       (tmp_path / "st", f"{tmp_path / 'st' / 'status.json'}: not a valid status file (a directory)"),
                       (tmp_path / "none", f"{tmp_path / 'none' / 'status.json'}: no status yet")):
        assert main(["controller", "status", "--state-dir", str(state)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"rlsched controller: error: {msg}") and err.count("\n") == 1, err
        assert "Errno" not in err


def test_status_prints_any_text_of_the_file_as_text(tmp_path, capsys):
    """Names and errors in status.json are printed as they are: rich markup in them ("[/]") was a MarkupError
    traceback, and a pid beyond pid_t an OverflowError (status, and preempt's check for a live controller)."""
    from rlsched.cli import main

    doc = _status_doc(policy="rl-base:/ck[/]pt", pid=2**80, last_round={"error": "squeue: [/b] failed", "queue": 0},
                      history=[{"t": 990.0, "action": "place", "job": 7, "detail": {"n[/]1": 4}}])
    (tmp_path / "status.json").write_text(json.dumps(doc))
    assert main(["controller", "status", "--state-dir", str(tmp_path)]) == 0
    out = " ".join(capsys.readouterr().out.split())  # rich wraps at the terminal's width
    assert "rl-base:/ck[/]pt" in out and "squeue: [/b] failed" in out and "n[/]1:4" in out and "not running" in out
    assert "running ?" in out  # a field the round did not report
    assert main(["controller", "status", "--state-dir", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == doc


def test_check_config_checks_the_state_dir_without_making_it(tmp_path, capsys, monkeypatch):
    """check-config refuses a state_dir under a regular file, where `run` would fail."""
    from rlsched.cli import main

    afile = tmp_path / "afile"
    afile.write_text("")
    cfg = tmp_path / "c.toml"

    def check(controller: str) -> tuple[int, str]:
        cfg.write_text(f"[agents]\nenabled = false\n[controller]\n{controller}\n")
        rc = main(["controller", "check-config", str(cfg)])
        cap = capsys.readouterr()
        assert rc == 0 or (cap.out == "" and cap.err.count("\n") == 1), cap
        return rc, cap.err

    for state, msg in ((afile / "x", f"controller.state_dir {afile / 'x'}: cannot be made: {afile} is not a directory"),
                       (afile, f"controller.state_dir {afile}: not a directory")):
        assert check(f"state_dir = {str(state)!r}") == (2, f"rlsched controller: error: {cfg}: {msg}\n")
    new = tmp_path / "new" / "state"
    assert check(f"state_dir = {str(new)!r}") == (0, "")
    assert not (tmp_path / "new").exists()  # nothing made
    for log_file, msg in ((afile / "x.log", f"cannot be made: {afile} is not a directory"),
                          (tmp_path, "a directory, not a file")):
        rc, err = check(f"state_dir = {str(new)!r}\nlog_file = {str(log_file)!r}")
        assert rc == 2 and f"{cfg}: controller.log_file {log_file}: {msg}" in err
    # a log folder systemd makes at the start (LogsDirectory) need not exist yet
    assert check(f"state_dir = {str(new)!r}\nlog_file = {str(tmp_path / 'logs' / 'c.log')!r}")[0] == 0

    import os

    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if str(p) == str(tmp_path) else real_access(p, mode, **kw))
    rc, err = check(f"state_dir = {str(new)!r}")
    assert rc == 2 and f"controller.state_dir {new}: cannot be made: {tmp_path} is not writable by " in err
    rc, err = check(f"state_dir = {str(tmp_path)!r}")
    assert rc == 2 and f"controller.state_dir {tmp_path}: {tmp_path} is not writable by " in err
    # checked by another user than root (an admin, before starting the service as its own user): a warning
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    rc, err = check(f"state_dir = {str(new)!r}")
    assert rc == 0 and err.startswith("warning: ") and "is not writable by" in err and "another user" in err
    rc, err = check(f"state_dir = {str(afile / 'x')!r}")  # not a permission matter: an error for anyone
    assert rc == 2 and "is not a directory" in err


def test_check_config_takes_the_file_as_path_or_config(tmp_path, capsys, monkeypatch):
    """`check-config` takes the file as an argument or as --config, like run, status and preempt."""
    from controller import cli as controller_cli
    from rlsched.cli import main

    good = tmp_path / "good.toml"
    good.write_text(f"[agents]\nenabled = false\n[controller]\nstate_dir = {str(tmp_path / 'st')!r}\n")
    bad = tmp_path / "bad.toml"
    bad.write_text("[controller]\ninterval_s = 0\n")
    monkeypatch.delenv("RLSCHED_CONTROLLER_CONFIG", raising=False)
    monkeypatch.setattr(controller_cli, "DEFAULT_CONFIG", str(tmp_path / "absent.toml"))
    for argv in ([str(good)], ["--config", str(good)], [str(good), "--config", str(good)]):
        assert main(["controller", "check-config", *argv]) == 0
        assert capsys.readouterr().out == f"{good}: OK (policy greedy, interval 5 s)\n"
    assert main(["controller", "check-config", "--config", str(bad)]) == 2
    assert "controller.interval_s: must be > 0" in capsys.readouterr().err
    assert main(["controller", "check-config", str(good), "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"two config files given ({good} and --config {bad})" in err
    assert main(["controller", "check-config"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no config file to check: give PATH or --config" in err
    monkeypatch.setenv("RLSCHED_CONTROLLER_CONFIG", str(good))  # as for run
    assert main(["controller", "check-config"]) == 0
    assert capsys.readouterr().out.startswith(f"{good}: OK")


def test_every_controller_option_has_help():
    """Every option of the controller subcommands (--config, --state-dir, --json, ...) has help text."""
    import argparse

    from rlsched.cli import build_parser

    top = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    ctl = next(a for a in top.choices["controller"]._actions if isinstance(a, argparse._SubParsersAction))
    assert set(ctl.choices) == {"run", "status", "preempt", "check-config"}
    for name, parser in ctl.choices.items():
        for action in parser._actions:
            assert action.help, f"controller {name} {action.option_strings or action.metavar}: no help"


def test_an_unknown_option_of_a_controller_subcommand_points_to_its_help(capsys):
    """The subcommand's own parser reports it, not the top-level one ("(see 'rlsched --help')")."""
    from rlsched.cli import main

    with pytest.raises(SystemExit) as ei:
        main(["controller", "status", "--bogus"])
    assert ei.value.code == 2
    assert capsys.readouterr().err == ("rlsched controller status: error: unrecognized arguments: --bogus "
                                       "(see 'rlsched controller status --help')\n")


def test_run_names_why_its_state_dir_cannot_be_made(tmp_path, capsys, controller_logging):
    """`run` said "[Errno 20] Not a directory: '...'" for a state_dir under a regular file."""
    from rlsched.cli import main

    afile = tmp_path / "afile"
    afile.write_text("")
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"[agents]\nenabled = false\n[controller]\nstate_dir = {str(afile / 'st')!r}\n")
    assert main(["controller", "run", "--config", str(cfg), "--once"]) == 2
    assert capsys.readouterr().err == (f"rlsched controller: error: controller.state_dir {afile / 'st'}: "
                                       f"cannot be made: {afile} is not a directory\n")


class PlainJobAgents(FakeAgents):
    """Agents that know no job: every job is a plain one (no checkpoint helper); Preempt answers NOT_FOUND."""

    def stats(self, job_nodes=None):
        return {}

    def checkpoint(self, job, timeout_s):
        self.asked.append(job.job_id)
        return PreemptOutcome(False, True, message=f"node1: Preempt: NOT_FOUND: no job 'slurm-{job.job_id}'",
                              unknown_job=True)


@pytest.mark.parametrize("without_agent", [False, True])
def test_a_job_without_the_checkpoint_helper_is_no_victim(tmp_path, without_agent):
    """Plain jobs (no checkpoint helper: they never report to an agent) would fail every preemption
    (NOT_FOUND), so only jobs the agents report are offered as victims, unless preempt_without_agent allows
    a requeue without a checkpoint, which then also covers an agent that does not know the job."""
    s, v, j, k = _blocked_victim_cluster("agent_down")
    agents = PlainJobAgents()
    ctl = _ctl(tmp_path, s, agents, policy="srtf", preempt_without_agent=without_agent)
    rep = ctl.round()
    assert rep.ok, rep.error
    if without_agent:
        assert agents.asked == [v] and rep.preempted == [v] and ("requeue_hold", v) in s.calls
    else:
        assert agents.asked == [] and rep.preempted == [] and s.job_list[v].running
        assert rep.placed == [(k, {"node4": 8})] and s.job_list[j].held


def test_operator_preempt_of_a_plain_job_fails_visibly(tmp_path, controller_logs):
    """An operator's preemption of a job the agents do not know fails (no checkpoint possible): the log says
    why, and `controller status` shows it (it showed nothing)."""
    s = FakeSlurm()
    jid = _running(s, 8, "node1")
    ctl = _ctl(tmp_path, s, PlainJobAgents())
    _request_preempt(tmp_path, jid)
    rep = ctl.round()
    assert rep.ok and rep.preempted == [] and s.job_list[jid].running
    assert any("does not run the checkpoint helper" in r.getMessage() for r in controller_logs.records)
    doc = json.loads((tmp_path / "state" / "status.json").read_text())
    failed = [h for h in doc["history"] if h["action"] == "preempt_failed"]
    assert len(failed) == 1 and failed[0]["job"] == jid and failed[0]["detail"] == {"why": "no checkpoint helper"}


def test_status_shows_waiting_jobs_and_agents_that_do_not_answer(tmp_path, capsys):
    """A job held for its --begin time counts as waiting (it is not in the queue), and status.json,
    `controller status` and the metrics show whether the node agents answered."""
    from rlsched.cli import main

    class Client:
        def __init__(self, addr, node):
            self.node = node

        def job_stats(self):
            if self.node == "node2":
                raise ConnectionError("UNAVAILABLE")
            return []

    s = FakeSlurm()
    later = s.submit(8, "rlsched:model=MoE")
    s.job_list[later].eligible_time = 5000.0  # --begin in the future
    ctl = _ctl(tmp_path, s)
    assert ctl.round().ok  # the cluster is known: the agents set below stay (a new cluster rebuilds them)
    ctl._preempter = AgentPreempter({"node1": "h:1", "node2": "h:2"}, Client)
    assert ctl.round().ok
    doc = json.loads((tmp_path / "state" / "status.json").read_text())
    assert doc["last_round"]["waiting"] == 1 and doc["last_round"]["queue"] == 0
    assert doc["agents"] == {"configured": 2, "unreachable": ["node2"]}
    assert ctl.metrics.value("rlsched_waiting_jobs") == 1
    assert ctl.metrics.value("rlsched_agents") == 2 and ctl.metrics.value("rlsched_agents_unreachable") == 1
    assert main(["controller", "status", "--state-dir", str(tmp_path / "state")]) == 0
    out = capsys.readouterr().out
    assert "waiting 1 (dependency or begin time)" in out and "agents: 2 configured, not answering: node2" in out


def test_build_state_keeps_slurm_submit_times_and_orders_ties_by_job_id():
    """Submit times reach the policy as Slurm gives them (no offset per position); jobs submitted in the same
    second are in job id order; a submit time of 0 is a time, a missing one counts as now."""
    from controller.slurm import MANAGED_MARK

    nodes = [SlurmNode("node1", 8, 0, "idle", partitions=("gpu",))]
    cl = build_cluster(nodes, "gpu", 16.0, 5.0)
    perf = ContentionModel(cl)

    def job(i, submit):
        return SlurmJob(job_id=i, name=f"j{i}", user="u", user_id=1, state="PENDING", reason="", priority=0,
                        partition="gpu", gpus=1, nodes=[], comment="rlsched:model=MoE,samples=1e3",
                        admin_comment=MANAGED_MARK, submit_time=submit)

    jobs = [job(12, 500.0), job(11, 500.0), job(10, None), job(9, 0.0), job(13, 500.0)]
    view = build_state(1000.0, cl, nodes, jobs, perf, partition="gpu", default_model="MoE", default_runtime_s=3600)
    got = [(j.job_id, j.submit_time) for j in view.state.pending]
    assert got == [("9", 0.0), ("11", 500.0), ("12", 500.0), ("13", 500.0), ("10", 1000.0)]
    # the same jobs in another input order give the same state (ties broken by job id, not by input position)
    again = build_state(1000.0, cl, nodes, jobs[::-1], perf, partition="gpu", default_model="MoE", default_runtime_s=3600)
    assert [(j.job_id, j.submit_time) for j in again.state.pending] == got
    # FIFO starts the job submitted at time 0 first, then the same-second jobs in id order
    from policies.heuristics import make_heuristic

    dec = make_heuristic("fifo", perf).schedule(view.state)
    assert [jid for jid, _ in dec.place] == ["9", "11", "12", "13", "10"]


@pytest.mark.parametrize("reports, job_nodes, alone", [
    # (node -> isolated_source its agent reports for job 7), Slurm's node list, measured alone?
    ({"node1": "profiled-alone", "node2": "profiled-alone"}, ["node1", "node2"], True),
    ({"node1": "profiled-alone", "node2": "reference"}, ["node1", "node2"], False),
    ({"node1": "profiled-alone"}, ["node1", "node2"], False),  # node2's agent did not report the job
    ({"node1": "profiled-alone"}, ["node1"], True),
    ({"node1": "profiled-alone", "node2": ""}, None, False),  # without Slurm's view: every reporting node
])
def test_stats_alone_only_when_every_node_says_so(reports, job_nodes, alone):
    """A multi-node job's throughput counts as measured alone (what SCED2's live job state records) only
    when the agents of all its nodes measured it alone; the merged stats keep the most advanced report."""
    from controller.preemption import NOT_ALONE_EVERYWHERE
    from controller.state import PROFILED_ALONE

    class Client:
        def __init__(self, addr, node):
            self.node = node

        def job_stats(self):
            if self.node not in reports:
                return []
            step = 10 if self.node == "node1" else 3
            return [{"slurm_job_id": "7", "job_key": "k7", "step": step, "state": "running",
                     "isolated_source": reports[self.node], "isolated_samples_per_s": 100.0}]

    p = AgentPreempter({"node1": "h:1", "node2": "h:2"}, Client)
    s = p.stats(job_nodes={"7": job_nodes} if job_nodes is not None else None)["7"]
    assert s["step"] == 10
    assert s["isolated_source"] == (PROFILED_ALONE if alone else NOT_ALONE_EVERYWHERE)
