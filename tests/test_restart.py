"""Restarts after preemption: a preempted job restarts through the placement rule of any new job
and no running job keeps a shape worse than the rule gives it (``OrderedPolicy.consolidate``).

The pathology (issue 34, item 3): LAS preempts an 8-GPU job so that a 4-GPU job of a lower queue
can run on half of its node; the victim then restarts on the 4 GPUs left there plus 4 on another
node and, without consolidation, keeps that two-node shape to the end (MoE on two nodes trains
at 1/1.57 of its one-node speed).
"""

from __future__ import annotations

import numpy as np
import pytest

from policies.cluster import ClusterSpec, Placement
from policies.heuristics import make_heuristic
from policies.job import JobSpec
from policies.perf import ContentionModel
from policies.state import ClusterState, JobInfo
from trainer.simulator import SimConfig, Simulator

C28 = ClusterSpec.parse("2x8")


@pytest.fixture(scope="module")
def perf() -> ContentionModel:
    return ContentionModel(C28)


def _job(perf: ContentionModel, jid: str, model: str, gpus: int, submit: float, seconds: float) -> JobSpec:
    """A job that takes ``seconds`` alone on its best shape."""
    return JobSpec(jid, float(submit), model, gpus, float(seconds * perf.best_isolated_throughput(model, gpus)))


def _trace(perf: ContentionModel) -> list[JobSpec]:
    # A (8 GPUs, long) fills node 0 and reaches LAS queue 1 (8000 GPU-s > 3600) by t = 1000; C1, C2
    # fill node 1; D (4 GPUs, queue 0) arrives at t = 1000, fits nowhere and preempts A, taking half
    # of node 0; A waits until C1 ends (t = 1500) and restarts on 4 + 4 GPUs of nodes 0 and 1. D
    # ends at t = 2000: node 0's other half is free again, no job waits.
    return [
        _job(perf, "A", "MoE", 8, 0, 20000),
        _job(perf, "C1", "DLRM", 4, 500, 1000),
        _job(perf, "C2", "DLRM", 4, 500, 3000),
        _job(perf, "D", "DLRM", 4, 1000, 1000),
    ]


def _run(perf: ContentionModel, consolidate: bool, name: str = "las"):
    pol = make_heuristic(name, perf)
    pol.consolidate = consolidate
    res = Simulator(C28, _trace(perf), pol, perf, SimConfig(check_invariants=True)).run()
    return res, {r.job_id: r for r in res.jobs}


def test_victim_keeps_a_split_shape_without_consolidation(perf) -> None:
    res, jobs = _run(perf, consolidate=False)
    a = jobs["A"]
    assert a.preemptions == 1 and a.num_nodes == 2
    # about 18,500 s of its 20,000 s of work run on two nodes at 1/1.57 of the one-node speed
    assert a.run_time / a.ideal_time > 1.5


def test_victim_moves_back_to_one_node(perf) -> None:
    res, jobs = _run(perf, consolidate=True)
    old, old_jobs = _run(perf, consolidate=False)
    a = jobs["A"]
    assert a.num_nodes == 1
    assert a.preemptions == 2  # the LAS preemption, then the move (a restart)
    # the move comes in the round of D's completion (no job waits then: a policy that moves
    # jobs is asked every round), after 500 s on two nodes; two restarts of 30 s each
    assert a.run_time / a.ideal_time < 1.05
    assert res.makespan < 0.7 * old.makespan
    for jid in ("C1", "C2", "D"):  # the others are untouched
        assert jobs[jid].finish_time == pytest.approx(old_jobs[jid].finish_time)


def test_moves_come_from_the_placement_rule_with_own_gpus(perf) -> None:
    # A on 4 + 4 GPUs of nodes 0 and 1, 4 GPUs free on node 1: the rule (pack) on free + own GPUs
    # gives node 1 whole, so A is preempted and placed there in the same decision.
    a = JobInfo("A", "MoE", 8, 0.0, 1e6, best_thp=1.0, placement=Placement(((0, 4), (1, 4))), start_time=0.0)
    b = JobInfo("B", "DLRM", 4, 0.0, 1e6, best_thp=1.0, placement=Placement(((0, 4),)), start_time=0.0)
    waiting = JobInfo("W", "DLRM", 16, 10.0, 1e7, best_thp=1.0)  # fits nowhere, too long to preempt
    st = ClusterState(1000.0, C28, np.array([0, 4]), [a, b], [waiting])
    pol = make_heuristic("srtf", perf)
    dec = pol.schedule(st)
    assert dec.preempt == ["A"] and dec.place == [("A", Placement(((1, 8),)))]
    # not before min_run since its last start, not with too little work left, not without preemption
    assert not make_heuristic("srtf", perf).schedule(
        ClusterState(200.0, C28, np.array([0, 4]), [a, b], [waiting])).place
    short = JobInfo("A", "MoE", 8, 0.0, 100.0, best_thp=1.0, placement=a.placement, start_time=0.0)
    assert not pol.schedule(ClusterState(1000.0, C28, np.array([0, 4]), [short, b], [waiting])).place
    assert not make_heuristic("srtf-np", perf).schedule(st).place
    off = make_heuristic("srtf", perf)
    off.consolidate = False
    assert not off.schedule(st).place
    # a placement limit of 0 moves nothing
    lim = make_heuristic("srtf", perf)
    lim.place_limit = 0
    assert not lim.schedule(st).place


def test_no_move_to_an_equal_shape(perf) -> None:
    # A on 4 + 4 GPUs, 2 GPUs free on each node: free + own give 6 + 6, still two nodes
    a = JobInfo("A", "MoE", 8, 0.0, 1e6, best_thp=1.0, placement=Placement(((0, 4), (1, 4))), start_time=0.0)
    b = JobInfo("B", "DLRM", 2, 0.0, 1e6, best_thp=1.0, placement=Placement(((0, 2),)), start_time=0.0)
    c = JobInfo("C", "DLRM", 2, 0.0, 1e6, best_thp=1.0, placement=Placement(((1, 2),)), start_time=0.0)
    waiting = JobInfo("W", "DLRM", 16, 10.0, 1e7, best_thp=1.0)
    st = ClusterState(1000.0, C28, np.array([2, 2]), [a, b, c], [waiting])
    assert not make_heuristic("las", perf).schedule(st).place


def test_greedy_moves_several_jobs_in_one_round() -> None:
    # Two split jobs, two free halves: both move, each to a node of its own; the contention-aware
    # rule sees the first move when it places the second.
    c48 = ClusterSpec.parse("4x8")
    perf4 = ContentionModel(c48)
    a = JobInfo("A", "MoE", 8, 0.0, 1e6, best_thp=1.0, placement=Placement(((0, 4), (1, 4))), start_time=0.0)
    b = JobInfo("B", "FSDP", 8, 1.0, 1e6, best_thp=1.0, placement=Placement(((2, 4), (3, 4))), start_time=0.0)
    waiting = JobInfo("W", "DLRM", 32, 10.0, 1e7, best_thp=1.0)
    st = ClusterState(1000.0, c48, np.array([4, 4, 4, 4]), [a, b], [waiting])
    dec = make_heuristic("greedy", perf4).schedule(st)
    assert sorted(dec.preempt) == ["A", "B"]
    moved = dict(dec.place)
    assert moved["A"].num_nodes == 1 and moved["B"].num_nodes == 1
    assert not set(moved["A"].nodes) & set(moved["B"].nodes)
    # the decision is valid as a whole
    from policies.validate import check_decision

    assert check_decision(st, dec) == []


@pytest.mark.parametrize("name", ["srtf", "las", "greedy", "las:spread"])
def test_preemptive_policies_run_with_invariants(perf, name) -> None:
    res, jobs = _run(perf, consolidate=True, name=name)
    assert all(r.done_samples == r.total_samples for r in res.jobs)


def test_moving_policies_are_asked_with_an_empty_queue(perf) -> None:
    assert make_heuristic("las", perf).moves and make_heuristic("greedy", perf).moves
    assert not make_heuristic("fifo", perf).moves and not make_heuristic("las-np", perf).moves
    off = make_heuristic("srtf", perf)
    off.consolidate = False
    assert not off.moves

    from policies.rounds import run_round

    class _Backend:
        def __init__(self, st: ClusterState) -> None:
            self.st, self.applied = st, None

        def snapshot(self) -> ClusterState:
            return self.st

        def apply(self, decision, problems):
            self.applied = decision
            return None

    a = JobInfo("A", "MoE", 8, 0.0, 1e6, best_thp=1.0, placement=Placement(((0, 4), (1, 4))), start_time=0.0)
    b = JobInfo("B", "DLRM", 4, 0.0, 1e6, best_thp=1.0, placement=Placement(((0, 4),)), start_time=0.0)
    be = _Backend(ClusterState(1000.0, C28, np.array([0, 4]), [a, b], []))
    out = run_round(be, make_heuristic("las", perf))
    assert out.asked and be.applied.place == [("A", Placement(((1, 8),)))]
    assert not run_round(_Backend(be.st), off).asked


def test_twin_moves_like_the_simulator(perf, tmp_path) -> None:
    """The controller places a moved job in the round that requeues it, as the simulator does."""
    from trainer.twin import Twin

    sim, jobs = _run(perf, consolidate=True)
    twin = Twin(C28, _trace(perf), "las", tmp_path / "ctl", SimConfig(), log_file=tmp_path / "ctl.log").run()
    got = {r.job_id: r for r in twin.jobs}
    for jid, s in jobs.items():
        t = got[jid]
        assert t.finish_time == pytest.approx(s.finish_time, rel=1e-6), jid
        assert (t.num_nodes, t.preemptions) == (s.num_nodes, s.preemptions), jid
    ctl = twin.meta["controller"]
    assert ctl["preemptions"] == sim.preemptions == 2 and ctl["rejected_placements"] == 0
