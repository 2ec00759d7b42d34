"""policies.validate: the one set of decision rules, and its two uses (all or nothing, drop bad entries)."""

from __future__ import annotations

import numpy as np
import pytest

from policies.cluster import ClusterSpec, Placement
from policies.job import JobSpec
from policies.perf import ContentionModel
from policies.state import ClusterState, Decision, JobInfo
from policies.validate import Problem, check_decision, placement_problem, without
from trainer.simulator import SimConfig, SimulationError, Simulator

P = Placement.of
CLUSTER = ClusterSpec.parse("3x4")


def _info(jid: str, gpus: int, placement: dict | None = None, **kw) -> JobInfo:
    return JobInfo(jid, "MoE", gpus, 0.0, 1000.0, placement=P(placement) if placement else None, **kw)


def _state(usable=None) -> ClusterState:
    """3 nodes x 4 GPUs. Running: r1 (4 on node 0), r2 (2 on node 1), e (elastic 1..4, 2 on node 1).
    Pending: p4, p2, p1 (4, 2, 1 GPUs). Free: [0, 0, 4]."""
    running = [_info("r1", 4, {0: 4}), _info("r2", 2, {1: 2}), _info("e", 2, {1: 2}, min_gpus=1, max_gpus=4)]
    pending = [_info("p4", 4), _info("p2", 2), _info("p1", 1)]
    u = None if usable is None else np.array(usable, dtype=bool)
    return ClusterState(0.0, CLUSTER, np.array([0, 0, 4]), running, pending, usable=u)


#: (id, usable, decision, expected problems as (action, index, job id, words in the message))
CASES = [
    ("empty", None, Decision(), []),
    ("place fits", None, Decision([("p4", P({2: 4}))]), []),
    ("preempt not running", None, Decision(preempt=["p4"]), [("preempt", 0, "p4", "which is not running")]),
    ("preempt unknown", None, Decision(preempt=["zz"]), [("preempt", 0, "zz", "which is not running")]),
    ("preempt twice", None, Decision(preempt=["r1", "r1"]), [("preempt", 1, "r1", "preempts job 'r1' twice")]),
    ("place unknown", None, Decision([("zz", P({2: 1}))]), [("place", 0, "zz", "neither pending nor running")]),
    ("place running", None, Decision([("r1", P({2: 4}))]), [("place", 0, "r1", "job r1: already running")]),
    ("migration", None, Decision([("r1", P({2: 4}))], ["r1"]), []),
    ("place twice", None, Decision([("p1", P({2: 1})), ("p1", P({2: 1}))]),
     [("place", 1, "p1", "places job 'p1' twice")]),
    ("wrong count", None, Decision([("p2", P({2: 3}))]), [("place", 0, "p2", "has 3 GPUs, demand is 2")]),
    ("unknown node", None, Decision([("p1", P({7: 1}))]), [("place", 0, "p1", "node 7 is not a node of the cluster")]),
    ("negative node", None, Decision([("p1", Placement(((-1, 1),)))]), [("place", 0, "p1", "node -1 is not a node")]),
    ("unusable node", [True, True, False], Decision([("p1", P({2: 1}))]), [("place", 0, "p1", "node 2 is not usable")]),
    ("repeated node", None, Decision([("p2", Placement(((2, 1), (2, 1))))]), [("place", 0, "p2", "repeats a node")]),
    ("empty node", None, Decision([("p2", Placement(((1, 0), (2, 2))))]), [("place", 0, "p2", "has an empty one")]),
    ("does not fit", None, Decision([("p4", P({0: 4}))]), [("place", 0, "p4", "node 0 has 0 free GPUs, it needs 4")]),
    ("fits after preemption", None, Decision([("p4", P({0: 4}))], ["r1"]), []),
    ("not after earlier placements", None, Decision([("p4", P({2: 4})), ("p2", P({2: 2}))]),
     [("place", 1, "p2", "does not fit: node 2 has 0 free GPUs")]),
    ("a bad placement takes nothing", None, Decision([("p2", P({2: 3})), ("p4", P({2: 4}))]),
     [("place", 0, "p2", "demand is 2")]),
    ("a bad preemption frees nothing", None, Decision([("p4", P({0: 4}))], ["p1"]),
     [("preempt", 0, "p1", "not running"), ("place", 0, "p4", "node 0 has 0 free")]),
    ("freed on an unusable node", [False, True, True], Decision([("p4", P({0: 4}))], ["r1"]),
     [("place", 0, "p4", "node 0 is not usable")]),
    # resize
    ("resize grows", None, Decision(resize=[("e", P({1: 2, 2: 2}))]), []),
    ("resize shrinks, frees", None, Decision([("p1", P({1: 1}))], resize=[("e", P({1: 1}))]), []),
    ("resize not running", None, Decision(resize=[("p2", P({2: 2}))]), [("resize", 0, "p2", "which is not running")]),
    ("resize not elastic", None, Decision(resize=[("r2", P({2: 2}))]), [("resize", 0, "r2", "not elastic")]),
    ("resize out of range", None, Decision(resize=[("e", P({1: 1, 2: 4}))]),
     [("resize", 0, "e", "resize to 5 GPUs is outside its range [1, 4]")]),
    ("resize does not fit", None, Decision(resize=[("e", P({1: 4}))]), [("resize", 0, "e", "node 1 has 2 free GPUs")]),
    ("resize after preemption", None, Decision(preempt=["r2"], resize=[("e", P({1: 4}))]), []),
    ("resize twice", None, Decision(resize=[("e", P({1: 1})), ("e", P({1: 2}))]), [("resize", 1, "e", "twice")]),
    ("resize preempted", None, Decision(preempt=["e"], resize=[("e", P({1: 1}))]),
     [("resize", 0, "e", "also preempts")]),
    ("resize unusable", [True, True, False], Decision(resize=[("e", P({1: 2, 2: 1}))]),
     [("resize", 0, "e", "node 2 is not usable")]),
    ("resize before placements", None, Decision([("p4", P({2: 4}))], resize=[("e", P({1: 2, 2: 2}))]),
     [("place", 0, "p4", "node 2 has 2 free GPUs")]),
    ("resize repeated node", None, Decision(resize=[("e", Placement(((1, 1), (1, 1))))]),
     [("resize", 0, "e", "repeats")]),
]


@pytest.mark.parametrize("name, usable, decision, want", CASES, ids=[c[0] for c in CASES])
def test_rules(name, usable, decision, want) -> None:
    state = _state(usable)
    got = check_decision(state, decision)
    assert [(p.action, p.index, p.job_id) for p in got] == [w[:3] for w in want]
    for p, w in zip(got, want):
        assert w[3] in p.message and str(p) == p.message
        assert p.job_id in p.message  # each message names its job
    # the entries left when the bad ones are dropped are valid together (the controller's use)
    rest = without(decision, got)
    assert check_decision(state, rest) == []
    kept = len(rest.place) + len(rest.preempt) + len(rest.resize)
    assert kept == len(decision.place) + len(decision.preempt) + len(decision.resize) - len(got)
    # a backend's O(1) lookup gives the same answer as the snapshot's own index
    index = {j.job_id: j for j in [*state.running, *state.pending]}
    looked = ClusterState(state.time, CLUSTER, state.free_gpus, state.running, state.pending, state.usable,
                          lookup=index.get)
    assert check_decision(looked, decision) == got


def test_check_decision_is_pure() -> None:
    state = _state()
    free = state.free_gpus.copy()
    placements = [j.placement for j in state.running]
    check_decision(state, Decision([("p4", P({0: 4}))], ["r1"], [("e", P({1: 1}))]))
    assert state.free_gpus.tolist() == free.tolist() and [j.placement for j in state.running] == placements


def test_without_keeps_order_and_returns_the_decision_when_clean() -> None:
    d = Decision([("a", P({0: 1})), ("b", P({0: 1})), ("c", P({0: 1}))], ["x", "y"])
    assert without(d, []) is d
    rest = without(d, [Problem("place", 1, "b", "b is bad"), Problem("preempt", 0, "x", "x is bad")])
    assert [j for j, _ in rest.place] == ["a", "c"] and rest.preempt == ["y"] and rest.resize == []


def test_placement_problem_alone() -> None:
    free = np.array([2, 4])
    assert placement_problem("j", 2, P({0: 2}), free) is None
    why = placement_problem("j", 3, P({0: 3}), free, context=" (ctx)")
    assert "does not fit: node 0 has 2 free GPUs, it needs 3 (ctx)" in why
    assert "not usable" in placement_problem("j", 1, P({1: 1}), free, usable=[True, False])


@pytest.mark.parametrize("kw, words", [
    ({"min_gpus": 1}, "must both be set"),
    ({"max_gpus": 4}, "must both be set"),
    ({"min_gpus": 3, "max_gpus": 4}, "1 <= min_gpus <= gpu_demand <= max_gpus"),  # demand 2 below the range
    ({"min_gpus": 1, "max_gpus": 1}, "1 <= min_gpus <= gpu_demand <= max_gpus"),
    ({"min_gpus": 0, "max_gpus": 4}, "1 <= min_gpus"),
    ({"min_gpus": 1.0, "max_gpus": 4}, "min_gpus must be an integer"),
    ({"min_gpus": 1, "max_gpus": True}, "max_gpus must be an integer"),
])
def test_jobinfo_elastic_range_is_checked(kw, words) -> None:
    with pytest.raises(ValueError, match=words):
        _info("j", 2, **kw)


def test_jobinfo_elastic() -> None:
    assert _info("j", 2, min_gpus=1, max_gpus=8).elastic and not _info("j", 2).elastic
    assert _info("j", 2, min_gpus=np.int64(2), max_gpus=np.int64(2)).elastic


# ---------------------------------------------------------------------- all or nothing: the simulator
def _sim(jobs: list[JobSpec], cluster: str = "1x8") -> Simulator:
    c = ClusterSpec.parse(cluster)
    sim = Simulator(c, jobs, None, ContentionModel(c), SimConfig(check_invariants=True))
    sim.reset_state()
    sim.advance_to_next_event()
    return sim


def test_simulator_applies_all_or_nothing_with_the_first_problem() -> None:
    sim = _sim([JobSpec("a", 0, "MoE", 4, 1e5), JobSpec("b", 0, "MoE", 4, 1e5), JobSpec("c", 0, "MoE", 2, 1e5)])
    sim.apply(Decision([("a", P({0: 4}))]))
    dec = Decision([("b", P({0: 4})), ("c", P({0: 3})), ("c", P({0: 2}))], ["zz"])
    problems = check_decision(sim.state(), dec)  # zz not running; c: 3 GPUs, then no room left after b
    assert [(p.action, p.index) for p in problems] == [("preempt", 0), ("place", 1), ("place", 2)]
    with pytest.raises(SimulationError) as ei:
        sim.apply(dec)
    assert str(ei.value) == problems[0].message  # the first problem, in the order of application
    assert sim.free.tolist() == [4]
    assert [sim.by_id[j].info.placement is not None for j in "abc"] == [True, False, False]
    assert sim.decisions == 1
    # the same decision without its bad entries applies
    assert sim.apply(without(dec, problems)) == 1 and sim.free.tolist() == [0] and sim.decisions == 2


# ---------------------------------------------------------------------- drop bad entries: the controller
def test_controller_drops_bad_entries_and_applies_the_rest(tmp_path, caplog, monkeypatch) -> None:
    import logging

    from test_controller import FakeAgents, FakeSlurm, _ctl, _running

    monkeypatch.setattr(logging.getLogger("controller"), "propagate", True)  # the CLI's logging setup turns it off

    s = FakeSlurm()
    r = _running(s, 8, "node1")
    ctl = _ctl(tmp_path, s, FakeAgents())
    ctl.round()  # builds the policy
    a, b = s.submit(8), s.submit(4)
    sa, sb, sr = str(a), str(b), str(r)
    decision = Decision(
        place=[(sa, P({0: 8})),  # node1 is taken by r: does not fit
               ("999", P({1: 8})),  # no such job
               (sb, P({1: 3})),  # b asks for 4
               (sb, P({1: 4})),  # valid
               (sa, P({2: 8}))],  # valid
        preempt=[sb],  # b is not running
        resize=[(sr, P({0: 4}))],  # r is not elastic
    )
    ctl.policy.schedule = lambda state: decision
    with caplog.at_level("WARNING", logger="controller.daemon"):
        rep = ctl.round()
    assert rep.ok, rep.error
    assert sorted(rep.placed) == sorted([(b, {"node2": 4}), (a, {"node3": 8})])
    assert rep.preempted == [] and s.job_list[r].running
    assert ctl.metrics.value("rlsched_decisions_total", action="rejected") == 5
    assert ctl.metrics.value("rlsched_decisions_total", action="place") == 2
    text = caplog.text
    for words in (f"preempts job '{sb}', which is not running", "job 999: not pending", "has 3 GPUs, demand is 4",
                  "node 0 has 0 free GPUs", f"job {sr}: not elastic"):
        assert words in text, words


def test_controller_rejects_resize_of_an_elastic_job(tmp_path) -> None:
    """Slurm cannot resize a running job: a valid resize is rejected by the Slurm backend, not applied."""
    from test_controller import FakeAgents, FakeSlurm, _ctl, _running

    from controller.daemon import RoundReport

    s = FakeSlurm()
    r = _running(s, 8, "node1")
    ctl = _ctl(tmp_path, s, FakeAgents())
    ctl.round()  # builds the cluster and the policy
    b = ctl.backend
    b.prepare(2000.0, ctl.cluster, s.nodes(), s.jobs(), {}, RoundReport(2000.0, True), True)
    st = b.snapshot()
    info = st.job(str(r))
    info.min_gpus, info.max_gpus = 1, 8  # as if the job were elastic
    dec = Decision(resize=[(str(r), P({0: 4}))])
    assert check_decision(st, dec) == []
    report = b.apply(dec, [])
    assert [p.action for p in report.rejected] == ["resize"] and "cannot resize" in report.rejected[0].message
    assert report.resized == [] and s.job_list[r].running


# ---------------------------------------------------------------------- resource fit: GPU type, CPUs, memory
def _typed_cluster() -> ClusterSpec:
    """node 0: 4 V100, 16 CPUs, 64 GB; node 1: 4 K80, 8 CPUs, 32 GB; node 2: 4 GPUs, nothing declared."""
    from policies.cluster import NodeSpec

    return ClusterSpec((NodeSpec("a", 4, "v100", cpus=16, mem_gb=64.0), NodeSpec("b", 4, "k80", cpus=8, mem_gb=32.0),
                        NodeSpec("c", 4)))


def _res_state() -> ClusterState:
    """Running: h (2 GPUs on node 0, 6 CPUs and 24 GB per GPU), plain (1 GPU on node 1, no demand).
    Pending: v (2 V100), cpu (2 GPUs, 4 CPUs each), mem (1 GPU, 20 GB), any (2 GPUs, no demand).
    Free CPUs [4, 8, None], memory [16, 32, None]."""
    from policies.resources import ResourceDemand as RD

    cluster = _typed_cluster()
    running = [_info("h", 2, {0: 2}, demand=RD(2, cpus_per_gpu=6, mem_gb_per_gpu=24.0)), _info("plain", 1, {1: 1})]
    pending = [_info("v", 2, demand=RD(2, gpu_type="V100")), _info("cpu", 2, demand=RD(2, cpus_per_gpu=4)),
               _info("mem", 1, demand=RD(1, mem_gb_per_gpu=20.0)), _info("any", 2)]
    return ClusterState(0.0, cluster, np.array([2, 3, 4]), running, pending)


RES_CASES = [
    ("type fits", Decision([("v", P({0: 2}))]), []),
    ("type misfit", Decision([("v", P({1: 2}))]), [("place", 0, "v", "node 1 (b) has GPUs of type k80, the job asks for V100")]),
    ("type misfit on an untyped node", Decision([("v", P({0: 1, 2: 1}))]), [("place", 0, "v", "node 2 (c) has GPUs of type titanxp")]),
    ("cpus fit", Decision([("cpu", P({1: 2}))]), []),
    ("cpus misfit", Decision([("cpu", P({0: 2}))]), [("place", 0, "cpu", "node 0 (a): 8 CPUs needed, 4 free")]),
    ("cpus fit after preemption", Decision([("cpu", P({0: 2}))], ["h"]), []),
    ("cpus where none are declared", Decision([("cpu", P({2: 2}))]), []),
    ("memory misfit", Decision([("mem", P({0: 1}))]), [("place", 0, "mem", "20 GB of memory needed, 16 GB free")]),
    ("memory and cpus of two jobs on one node", Decision([("mem", P({1: 1})), ("cpu", P({1: 2}))]), []),
    ("no demand fits anywhere", Decision([("any", P({0: 2}))]), []),
    ("migration frees its own CPUs", Decision([("h", P({0: 2}))], ["h"]), []),
    ("migration to a node without its CPUs", Decision([("h", P({1: 2}))], ["h"]),
     [("place", 0, "h", "node 1 (b): 12 CPUs needed, 8 free")]),
]


@pytest.mark.parametrize("name, decision, want", RES_CASES, ids=[c[0] for c in RES_CASES])
def test_resource_fit_rules(name, decision, want) -> None:
    state = _res_state()
    got = check_decision(state, decision)
    assert [(p.action, p.index, p.job_id) for p in got] == [w[:3] for w in want]
    for p, w in zip(got, want):
        assert w[3] in p.message and p.job_id in p.message
    assert check_decision(state, without(decision, got)) == []


def test_resource_fit_counts_earlier_entries() -> None:
    from policies.resources import ResourceDemand as RD

    state = _res_state()
    # two jobs of 4 CPUs per GPU on node 1 (8 CPUs): the second finds them taken; with memory likewise
    pending = [*state.pending, _info("cpu2", 1, demand=RD(1, cpus_per_gpu=4)), _info("mem2", 1, demand=RD(1, mem_gb_per_gpu=20.0))]
    st = ClusterState(0.0, state.cluster, state.free_gpus, state.running, pending)
    got = check_decision(st, Decision([("cpu", P({1: 2})), ("cpu2", P({1: 1}))]))
    assert [(p.index, p.job_id) for p in got] == [(1, "cpu2")]
    assert "4 CPUs needed, 0 free" in got[0].message and "after the decision's" in got[0].message
    got = check_decision(st, Decision([("mem", P({1: 1})), ("mem2", P({1: 1}))]))
    assert [(p.index, p.job_id) for p in got] == [(1, "mem2")]
    assert "20 GB of memory needed, 12 GB free" in got[0].message


def test_snapshot_free_cpus_and_memory() -> None:
    state = _res_state()
    assert state.free_cpu_mem() == ([4, 8, None], [16.0, 32.0, None])
    plain = ClusterState(0.0, CLUSTER, np.array([4, 4, 4]), [_info("r", 2, {0: 2})], [])
    assert plain.free_cpu_mem() == ([None] * 3, [None] * 3)


def test_jobinfo_demand_is_checked_and_resized() -> None:
    from policies.resources import ResourceDemand as RD

    with pytest.raises(ValueError, match="demand must be a ResourceDemand"):
        _info("x", 2, demand={"gpus": 2})
    j = _info("x", 2, demand=RD(2, cpus_per_gpu=3))
    assert j.demand_on(4) == RD(4, cpus_per_gpu=3)
    assert _info("y", 2, demand=RD(2)).demand_on(2) is None  # declares nothing beyond GPUs


def test_simulator_refuses_a_misfit_and_runs_policies_that_ignore_resources() -> None:
    from policies.resources import ResourceDemand as RD

    cluster = _typed_cluster()
    jobs = [JobSpec("t", 0, "MoE", 2, 1e5, demand=RD(2, gpu_type="k80")), JobSpec("n", 0, "MoE", 4, 1e5)]
    sim = Simulator(cluster, jobs, None, ContentionModel(cluster), SimConfig(check_invariants=True))
    sim.reset_state()
    sim.advance_to_next_event()
    with pytest.raises(SimulationError, match="node 0 \\(a\\) has GPUs of type v100, the job asks for k80"):
        sim.apply(Decision([("t", P({0: 2}))]))
    assert sim.apply(Decision([("t", P({1: 2})), ("n", P({0: 4}))])) == 2
    # a trace without demands on a cluster that declares types, CPUs and memory: FIFO runs as on a plain one
    from policies.registry import make_policy

    plain = [JobSpec(f"j{i}", 10.0 * i, "MoE", 1 + i % 4, 1e5) for i in range(8)]
    perf = ContentionModel(cluster)
    res = Simulator(cluster, plain, make_policy("fifo", cluster, perf), perf, SimConfig()).run()
    assert len(res.jobs) == 8 and all(r.finish_time > 0 for r in res.jobs)


def test_resize_counts_its_own_cpus_and_the_new_ones() -> None:
    from policies.resources import ResourceDemand as RD

    cluster = _typed_cluster()
    # e: elastic 1..4, 2 GPUs on node 1 with 3 CPUs each (6 of node 1's 8 CPUs)
    e = _info("e", 2, {1: 2}, min_gpus=1, max_gpus=4, demand=RD(2, cpus_per_gpu=3, min_gpus=1, max_gpus=4))
    st = ClusterState(0.0, cluster, np.array([4, 2, 4]), [e], [_info("c", 1, demand=RD(1, cpus_per_gpu=4))])
    assert st.free_cpu_mem()[0] == [16, 2, None]
    assert check_decision(st, Decision(resize=[("e", P({1: 2}))])) == []  # its own CPUs count as free
    got = check_decision(st, Decision(resize=[("e", P({1: 3}))]))  # 9 CPUs on an 8-CPU node
    assert [(p.action, p.job_id) for p in got] == [("resize", "e")] and "9 CPUs needed, 8 free" in got[0].message
    # shrinking frees CPUs for a later placement; a refused resize frees nothing
    assert check_decision(st, Decision([("c", P({1: 1}))], resize=[("e", P({1: 1}))])) == []
    got = check_decision(st, Decision([("c", P({1: 1}))], resize=[("e", P({1: 1, 0: 9}))]))
    assert [(p.action, p.job_id) for p in got] == [("resize", "e"), ("place", "c")]
# ---------------------------------------------------------------------- CPUs, memory, parameter servers
def _cpu_state() -> ClusterState:
    """2 nodes x 4 GPUs, 10 CPUs, 40 GB each. Running: r (PS job, 2 workers on node 0 with 2 PSs: 2 x 2
    + 2 x 3 = 10 CPUs, 2 x 8 + 2 x 9 = 34 GB). Pending: q (PS job, 1 worker), a (all-reduce, 1 GPU)."""
    from policies.cluster import NodeSpec
    from policies.elastic import ElasticPlacement
    from policies.resources import ResourceDemand

    cl = ClusterSpec(tuple(NodeSpec(f"n{i}", 4, cpus=10, mem_gb=40.0) for i in range(2)))
    d = ResourceDemand(gpus=2, cpus_per_gpu=2, mem_gb_per_gpu=8, ps=2, ps_cpus=3, ps_mem_gb=9, min_gpus=1, max_gpus=4)
    r = JobInfo("r", "ResNet-50", 2, 0.0, 1e4, placement=ElasticPlacement.make({0: 2}, 2), min_gpus=1, max_gpus=4,
                demand=d)
    q = JobInfo("q", "ResNet-50", 1, 0.0, 1e4, min_gpus=1, max_gpus=4, demand=d.resized(1))
    a = JobInfo("a", "MoE", 1, 0.0, 1e4)
    return ClusterState(0.0, cl, np.array([2, 4]), [r], [q, a])


def test_resource_rules_cpus_memory_and_ps():
    from policies.elastic import ElasticPlacement

    E = ElasticPlacement.make
    st = _cpu_state()
    assert check_decision(st, Decision([("a", P({0: 1}))])) == []  # no demand: no CPUs
    (pr,) = check_decision(st, Decision([("q", E({0: 1}, 1))]))  # node 0's CPUs are all r's
    assert (pr.action, pr.job_id) == ("place", "q") and "node 0 (n0): 5 CPUs needed, 0 free" in pr.message
    assert check_decision(st, Decision([("q", E({0: 1}, 1))], ["r"])) == []  # r's CPUs freed
    assert check_decision(st, Decision([("q", E({1: 1}, 1))])) == []
    # r resized: its own use is freed first; 1 worker + 2 PSs = 8 CPUs fits, 3 workers + 2 PSs on node 0 do not
    assert check_decision(st, Decision(resize=[("r", E({0: 1}, 2))])) == []
    (pr,) = check_decision(st, Decision(resize=[("r", E({0: 3}, 2))]))
    assert pr.action == "resize" and "node 0 (n0): 12 CPUs needed, 10 free" in pr.message
    # 1 worker + 3 PSs of q on node 1: 11 CPUs of 10 (memory 35 GB of 40 would fit)
    (pr,) = check_decision(st, Decision([("q", E({1: 1}, 3))]))
    assert "node 1 (n1): 11 CPUs needed, 10 free" in pr.message
    # PS counts: a PS job gets >= 1 PS, a job without PSs none
    (pr,) = check_decision(st, Decision([("q", E({1: 1}, 0))]))
    assert "no PS" in pr.message
    (pr,) = check_decision(st, Decision([("a", E({1: 1}, 2))]))
    assert "to a job without PSs" in pr.message
    # a later entry sees what the earlier ones took: q's 8 CPUs on node 1 leave 2, r's move there needs 10
    (pr,) = check_decision(st, Decision([("q", E({1: 1}, 2))], resize=[("r", E({1: 2}, 2))]))
    assert (pr.action, pr.job_id) == ("place", "q") and "node 1 (n1): 8 CPUs needed, 0 free" in pr.message


def test_resource_rules_memory():
    from policies.resources import ResourceDemand

    st = _cpu_state()
    z = JobInfo("z", "MoE", 1, 0.0, 1e4, demand=ResourceDemand(1, cpus_per_gpu=1, mem_gb_per_gpu=41.0))
    st = ClusterState(0.0, st.cluster, st.free_gpus, st.running, [*st.pending, z])
    (pr,) = check_decision(st, Decision([("z", P({1: 1}))]))
    assert "node 1 (n1): 41 GB of memory needed, 40 GB free" in pr.message
