"""The FIFO path's fast paths give what the general paths give: the round loop without outcomes
(its snapshot let go before the backend applies), the one-placement check of ``check_decision``,
and ``pack`` on a state's handed-in free bytes."""

from __future__ import annotations

import numpy as np
import pytest

from policies.cluster import ClusterSpec, Placement
from policies.heuristics import make_heuristic
from policies.perf import ContentionModel
from policies.placement import pack
from policies.rounds import RoundLoop
from policies.state import ClusterState, Decision, JobInfo
from policies.validate import AFTER_EARLIER, check_decision, placement_problem
from trainer.generate import GeneratorConfig, generate_jobs
from trainer.sim_backend import SimBackend
from trainer.simulator import SimConfig, Simulator

P = Placement.of


def _trace(cluster: ClusterSpec, perf: ContentionModel, n: int = 400, load: float = 0.95):
    return generate_jobs(cluster, GeneratorConfig(num_jobs=n, arrival="poisson", load=load, seed=3), perf)


def _rows(res) -> list[tuple]:
    return [(r.job_id, r.first_start, r.finish_time, r.avg_cs, r.num_nodes, r.preemptions) for r in res.jobs]


def _loop(sim: Simulator, on_round=None):
    """``sim`` reset and run by a RoundLoop (with ``on_round``: the loop that builds every outcome)."""
    sim.reset_state()
    RoundLoop(SimBackend(sim), sim.policy).run(on_round=on_round)
    return sim.result()


@pytest.mark.parametrize("policy", ["fifo", "greedy", "srtf"])
def test_round_loop_without_outcomes_equals_the_loop_with_them(policy) -> None:
    cluster = ClusterSpec.parse("96x8")  # >= VECTOR_MIN_NODES: the byte mirror and per-run arrays
    perf = ContentionModel(cluster)
    sim = Simulator(cluster, _trace(cluster, perf), make_heuristic(policy, perf), perf)
    outcomes = []
    with_outcomes = _loop(sim, lambda out: outcomes.append(out.asked))
    quiet = _loop(sim)
    assert outcomes and _rows(quiet) == _rows(with_outcomes)
    assert quiet.rounds == with_outcomes.rounds and quiet.util_used.tolist() == with_outcomes.util_used.tolist()
    assert quiet.samples_frag.tolist() == with_outcomes.samples_frag.tolist()
    assert _rows(sim.run()) == _rows(quiet)


class _Keeper:
    """FIFO that keeps every snapshot it is asked with, and a copy of its free GPUs then."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.kept: list[tuple[ClusterState, list[int], int]] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def schedule(self, state: ClusterState) -> Decision:
        self.kept.append((state, state.free_gpus.tolist(), state.total_free))
        return self.inner.schedule(state)


def test_a_snapshot_a_policy_keeps_stays_as_it_was() -> None:
    """The quiet loop lets its snapshot go before applying; one the policy still holds keeps its free GPUs."""
    cluster = ClusterSpec.parse("80x8")
    perf = ContentionModel(cluster)
    keeper = _Keeper(make_heuristic("fifo", perf))
    sim = Simulator(cluster, _trace(cluster, perf, 300), keeper, perf)  # type: ignore[arg-type]
    kept_run = sim.run()
    assert len(keeper.kept) > 300
    for state, free, total in keeper.kept:
        assert state.free_gpus.tolist() == free and state.total_free == total == sum(free)
        assert not state.free_gpus.flags.writeable
    plain = Simulator(cluster, _trace(cluster, perf, 300), make_heuristic("fifo", perf), perf).run()
    assert _rows(kept_run) == _rows(plain)


def test_one_placement_check_equals_placement_problem() -> None:
    """check_decision's inline check of one placement (one or more nodes) agrees with placement_problem."""
    cluster = ClusterSpec.parse("4x8")
    free = np.array([8, 3, 8, 0])
    job = JobInfo("j", "MoE", 16, 0.0, 100.0)
    state = ClusterState(0.0, cluster, free, [], [job])
    cases = [
        P({0: 8, 2: 8}),  # fits
        Placement(((2, 8), (0, 8))),  # nodes not ascending: still fits
        P({0: 8, 1: 8}),  # node 1 has 3
        P({0: 8, 1: 3, 3: 5}),  # node 3 has none
        P({0: 8, 2: 7}),  # 15 GPUs
        Placement(((0, 8), (0, 8))),  # repeats a node
        Placement(((0, 8), (4, 8))),  # no node 4
        Placement(((-1, 8), (0, 8))),  # no node -1
        Placement(((0, 16), (2, 0))),  # an empty node, 16 on one node
    ]
    for usable in (None, np.array([True, True, False, True])):
        st = state if usable is None else ClusterState(0.0, cluster, free, [], [job], usable=usable)
        for p in cases:
            why = placement_problem("j", 16, p, free, usable, AFTER_EARLIER)
            got = check_decision(st, Decision(place=[("j", p)]))
            assert [x.message for x in got] == ([] if why is None else [why]), p


def test_pack_on_handed_bytes_equals_pack_on_an_array() -> None:
    """pack on a state's handed-in free bytes and total (the simulator's) equals pack on a plain array."""
    cluster = ClusterSpec.parse("120x8")
    rng = np.random.default_rng(5)
    for _ in range(200):
        free = rng.integers(0, 9, size=120)
        free[rng.random(120) < 0.6] = 0
        state = ClusterState(0.0, cluster, free, [], [])
        state.use_free_bytes(bytes(free.astype(np.uint8)), int(free.max()), int(free.sum()))
        for g in (1, 2, 3, 4, 8, 12, 16, 24, 32, 64):
            job = JobInfo("j", "MoE", g, 0.0, 100.0)
            want = pack(job, free.copy(), None)
            got = pack(job, state.free_gpus, state)
            assert got == want, (g, free.tolist())
