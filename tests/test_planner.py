"""The lookahead planner (policies/planner.py) and its simulator model (trainer/rollout.py,
Simulator.from_state)."""

from __future__ import annotations

import math

import pytest

from policies.base import PolicyError
from policies.cluster import ClusterSpec
from policies.job import JobSpec
from policies.perf import ContentionModel
from policies.planner import PlannerPolicy, default_budget, make_planner
from policies.registry import make_policy, policy_names
from policies.state import ClusterState, Decision
from trainer.rollout import SimRollout
from trainer.sim_backend import SimBackend
from trainer.simulator import SimConfig, Simulator

CL = ClusterSpec.parse("2x8")
PERF = ContentionModel(CL)


def _job(jid: str, t: float, gpus: int, hours: float, model: str = "MoE") -> JobSpec:
    return JobSpec(jid, t, model, gpus, hours * 3600.0 * PERF.best_isolated_throughput(model, gpus))


def blocking_trace() -> list[JobSpec]:
    """R (4 GPUs, 10 min), B (16 GPUs: the whole cluster, 1 h), S (4 GPUs, 1.8 h), all at t = 0.

    Every heuristic starts R and backfills S beside it (S is shorter than B in no order, but B does not
    fit while R runs); B then waits 1.8 h for S (S's 1.63 h left at R's end is under SRTF's 2x
    preemption margin over B's 1 h). Holding S for the 10 min until R ends lets B run first:
    average JCT of B and S 2.07 h instead of 2.3 h."""
    return [_job("R", 0.0, 4, 1 / 6), _job("B", 0.0, 16, 1.0), _job("S", 0.0, 4, 1.8)]


def first_round(jobs: list[JobSpec], pol) -> ClusterState:
    """The snapshot of the simulator's first round (the jobs submitted at t = 0 waiting)."""
    backend = SimBackend(Simulator(CL, jobs, pol, PERF))
    assert backend.next_round()
    return backend.snapshot()


def _avg_jct(res) -> float:
    return sum(r.jct for r in res.jobs) / len(res.jobs)


def test_planner_holds_a_backfill_that_blocks_the_wide_job():
    jobs = blocking_trace()
    heur = {h: _avg_jct(Simulator(CL, jobs, make_policy(h, CL, PERF), PERF, SimConfig()).run())
            for h in ("srtf", "srtf:nosplit", "lgtf", "lgtf:nosplit", "greedy")}
    res = Simulator(CL, jobs, make_policy("planner", CL, PERF, budget_s=30.0), PERF, SimConfig()).run()
    best = min(heur.values())
    got = _avg_jct(res)
    fin = {r.job_id: r.finish_time for r in res.jobs}
    assert fin["B"] < fin["S"]  # the wide job ran before the long backfill
    assert got < 0.95 * best, (got, heur)


def test_planner_is_deterministic_and_registered():
    assert "planner" in policy_names()
    jobs = blocking_trace() + [_job(f"x{i}", 600.0 * i, 1 + i % 8, 0.3 + 0.1 * i) for i in range(6)]
    runs = []
    for _ in range(2):
        pol = make_policy("planner", CL, PERF, budget_s=30.0)
        assert isinstance(pol, PlannerPolicy)
        runs.append([(r.job_id, r.first_start, r.finish_time) for r in Simulator(CL, jobs, pol, PERF).run().jobs])
    assert runs[0] == runs[1]


class _SimClock:
    """A simulated clock (s): it moves only when a rollout advances it."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class _SlowModel:
    """A rollout model whose every rollout takes ``step`` s on ``clock``; scores rise with each call
    (so the base decision stays best), and a rollout that ends past the deadline returns nothing."""

    def __init__(self, clock: _SimClock, step: float) -> None:
        self.clock, self.step, self.calls = clock, step, 0

    def rollout(self, state, first, policy, *, completions=0, until=math.inf, deadline=math.inf):
        self.calls += 1
        self.clock.t += self.step
        return (float(self.calls), 1.0) if self.clock() <= deadline else None


@pytest.mark.parametrize("budget, rollouts, scored", [(0.12, 3, 2), (0.05, 1, 1), (0.01, 1, 0)])
def test_budget_stops_the_search(budget, rollouts, scored):
    """On a simulated clock where each rollout takes 0.05 s, the planner starts rollouts while the budget
    lasts and no more: the one that ends past the deadline is dropped, and the round stops there."""
    clock = _SimClock()
    model = _SlowModel(clock, 0.05)
    pol = make_planner("planner", CL, PERF, model=model, budget_s=budget, holds=3, clock=clock)
    st = first_round(blocking_trace(), pol)
    n_cands = len(pol.candidates(st))
    assert n_cands > rollouts
    dec = pol.schedule(st)
    stats = pol.last_round
    assert (stats.rollouts, stats.scored, stats.cut) == (rollouts, scored, True)
    assert model.calls == rollouts and stats.candidates == n_cands
    assert clock() == pytest.approx(0.05 * rollouts) and clock() <= budget + 0.05 + 1e-12  # budget + one rollout
    assert dec == pol.candidates(st)[0][0]  # the base decision: it scored best, or nothing was scored


def test_budget_large_enough_scores_every_candidate():
    clock = _SimClock()
    model = _SlowModel(clock, 0.05)
    pol = make_planner("planner", CL, PERF, model=model, budget_s=100.0, holds=3, clock=clock)
    st = first_round(blocking_trace(), pol)
    pol.schedule(st)
    n = pol.last_round.candidates
    assert (pol.last_round.rollouts, pol.last_round.scored, pol.last_round.cut) == (n, n, False)


def test_sim_rollout_reads_the_planners_clock():
    """make_planner hands its clock to the simulator model: a clock already past every deadline
    stops the base rollout (run to the last of 43 jobs, so past the model's first look at the clock), and
    the planner takes the base decision unscored."""
    t = [0.0]

    def clock() -> float:
        t[0] += 1.0  # every look moves the clock by 1 s: past a 0.5 s budget at once
        return t[0]

    pol = make_planner("planner", CL, PERF, budget_s=0.5, horizon=0, clock=clock)
    assert pol.model.clock is clock
    jobs = blocking_trace() + [_job(f"x{i}", 0.0, 1 + i % 4, 2.0 + i) for i in range(40)]
    st = first_round(jobs, pol)
    dec = pol.schedule(st)
    assert pol.last_round.scored == 0 and pol.last_round.cut
    assert dec == pol.candidates(st)[0][0]


def test_budget_default_scales_with_nodes():
    assert default_budget(ClusterSpec.parse("4x8")) == pytest.approx(1.0)
    assert default_budget(ClusterSpec.parse("128x8")) == pytest.approx(10.0)
    assert 1.0 < default_budget(ClusterSpec.parse("16x8")) < 10.0
    pol = make_policy("planner:budget_s=2.5/horizon=0/base=lgtf/alternatives=srtf:nosplit+greedy", CL, PERF,
                      min_run_s=60)
    assert (pol.budget_s, pol.horizon, pol.base.name, [h.name for h in pol.alternatives]) == (
        2.5, 0, "lgtf", ["srtf:nosplit", "greedy"])
    assert all(h.min_run == 60.0 for h in (pol.base, *pol.alternatives))  # the controller's min_run_s


@pytest.mark.parametrize("name, opts, text", [
    ("planner:budget_s=-1", {}, "budget_s must be > 0"),
    ("planner:budget_s=abc", {}, "budget_s must be a number"),
    ("planner:foo=1", {}, "unknown planner option 'foo'"),
    ("planner:horizon", {}, "KEY=VALUE"),
    ("planner:base=nope", {}, "unknown policy 'nope'"),
    ("planner", {"horizon": 1.5}, "horizon must be an integer"),
    ("planner", {"seed": 1}, "does not apply to the planner"),
    ("srtf", {"budget_s": 1.0}, "applies to the planner only"),
])
def test_bad_options_one_line(name, opts, text):
    with pytest.raises(PolicyError) as exc:
        make_policy(name, CL, PERF, **opts)
    msg = str(exc.value)
    assert text in msg and "\n" not in msg


def test_from_state_continues_the_run_exactly():
    """A simulator rebuilt from a mid-run snapshot and run on with the same heuristic gives the
    original run's completion times (zero arrivals: the snapshot knows every job)."""
    jobs = [_job(f"j{i}", 0.0, g, h) for i, (g, h) in enumerate([(4, 0.5), (8, 1.0), (12, 0.7), (2, 2.0),
                                                                  (6, 0.4), (16, 0.9), (1, 1.2), (3, 0.8)])]
    ref = Simulator(CL, jobs, make_policy("lgtf", CL, PERF), PERF).run()
    fin_ref = {r.job_id: r.finish_time for r in ref.jobs}
    from policies.rounds import run_round
    from trainer.sim_backend import SimBackend

    sim = Simulator(CL, jobs, make_policy("lgtf", CL, PERF), PERF)
    be = SimBackend(sim)
    for _ in range(3):
        assert be.next_round()
        run_round(be, sim.policy)
    state = sim.state()
    assert state.running and state.pending
    score, t_stop = SimRollout(PERF).rollout(state, Decision(), make_policy("lgtf", CL, PERF))
    cont = Simulator.from_state(state, make_policy("lgtf", CL, PERF), PERF)
    be2 = SimBackend(cont)
    while be2.next_round():
        run_round(be2, cont.policy)
    for j in cont.jobs:
        assert j.finish == pytest.approx(fin_ref[j.spec.job_id], rel=1e-9)
    # the rollout's score is the sum of those completion times minus the snapshot's time
    assert score == pytest.approx(sum(fin_ref[j.spec.job_id] - state.time for j in cont.jobs), rel=1e-9)
    assert t_stop >= max(fin_ref[j.spec.job_id] for j in cont.jobs) - 1e-6


def test_bench_planner_table_on_tiny_sets(capsys):
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "bench_planner", Path(__file__).resolve().parents[1] / "benchmarks" / "bench_planner.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--sets", "2", "--jobs", "6", "--groups", "248-zero"]) == 0
    out = capsys.readouterr().out
    row = next(ln for ln in out.splitlines() if ln.startswith("| 248-zero | ") and "/ 2 |" in ln)
    cells = [c.strip() for c in row.split("|")]
    assert cells[2] in bench.HEURISTICS and float(cells[5].split()[0]) > 0
    with pytest.raises(SystemExit) as e:
        bench.main(["--groups", "nosuch"])
    assert e.value.code == 2 and "unknown 4x8 group" in capsys.readouterr().err


def test_rollout_of_an_epoch_based_snapshot():
    """The controller's snapshots carry epoch seconds (beyond the simulator's submit-time range): the
    rollout shifts them and scores as on the same snapshot from time 0."""
    import dataclasses

    from policies.state import ClusterState

    jobs = blocking_trace() + [_job("y", 0.0, 2, 0.5)]
    sim = Simulator(CL, jobs, make_policy("greedy", CL, PERF), PERF)
    from policies.rounds import run_round
    from trainer.sim_backend import SimBackend

    be = SimBackend(sim)
    assert be.next_round()
    run_round(be, sim.policy)
    assert be.next_round()
    st = sim.state()
    E = 1_704_067_200.0

    def moved(j):
        return dataclasses.replace(j, submit_time=j.submit_time + E,
                                   start_time=None if j.start_time is None else j.start_time + E)

    st_e = ClusterState(st.time + E, st.cluster, st.free_gpus, [moved(j) for j in st.running],
                        [moved(j) for j in st.pending])
    base = make_policy("greedy", CL, PERF)
    got = SimRollout(PERF).rollout(st, Decision(), base)
    got_e = SimRollout(PERF).rollout(st_e, Decision(), base)
    assert got is not None and got_e is not None
    assert got_e[0] == pytest.approx(got[0], rel=1e-9) and got_e[1] == pytest.approx(got[1] + E, rel=1e-12)
