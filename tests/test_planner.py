"""The lookahead planner (policies/planner.py) and its simulator model (trainer/rollout.py,
Simulator.from_state)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from policies.base import PolicyError
from policies.cluster import ClusterSpec
from policies.job import JobSpec
from policies.perf import ContentionModel
from policies.planner import PlannerPolicy, Rollout, default_budget, make_planner
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
        return Rollout(float(self.calls), 1.0, 1) if self.clock() <= deadline else None


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


def _mid_run(jobs: list[JobSpec], policy: str, rounds: int = 3):
    """``(finish time by job id of the whole run, the snapshot after ``rounds`` rounds of the same run)``."""
    from policies.rounds import run_round

    ref = Simulator(CL, jobs, make_policy(policy, CL, PERF), PERF).run()
    sim = Simulator(CL, jobs, make_policy(policy, CL, PERF), PERF)
    be = SimBackend(sim)
    for _ in range(rounds):
        assert be.next_round()
        run_round(be, sim.policy)
    return {r.job_id: r.finish_time for r in ref.jobs}, sim.state()


def test_from_state_continues_the_run_exactly():
    """A simulator rebuilt from a mid-run snapshot and run on with the same heuristic gives the
    original run's completion times (zero arrivals: the snapshot knows every job)."""
    from policies.rounds import run_round

    jobs = [_job(f"j{i}", 0.0, g, h) for i, (g, h) in enumerate([(4, 0.5), (8, 1.0), (12, 0.7), (2, 2.0),
                                                                  (6, 0.4), (16, 0.9), (1, 1.2), (3, 0.8)])]
    fin_ref, state = _mid_run(jobs, "lgtf")
    assert state.running and state.pending
    score, t_stop, _rounds = SimRollout(PERF).rollout(state, Decision(), make_policy("lgtf", CL, PERF))
    cont = Simulator.from_state(state, make_policy("lgtf", CL, PERF), PERF)
    be2 = SimBackend(cont)
    while be2.next_round():
        run_round(be2, cont.policy)
    for j in cont.jobs:
        assert j.finish == pytest.approx(fin_ref[j.spec.job_id], rel=1e-9)
    # the rollout's score is the sum of those completion times minus the snapshot's time
    assert score == pytest.approx(sum(fin_ref[j.spec.job_id] - state.time for j in cont.jobs), rel=1e-9)
    assert t_stop >= max(fin_ref[j.spec.job_id] for j in cont.jobs) - 1e-6


def test_bench_planner_tables_on_tiny_sets(capsys, tmp_path):
    """The benchmark's three tables on 2 sets of 6 jobs, the planner against the best heuristic and rl-base
    against the planner; a second run with the same --cache reads every result back (no run is repeated)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "bench_planner", Path(__file__).resolve().parents[1] / "benchmarks" / "bench_planner.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    argv = ["--sets", "2", "--jobs", "6", "--groups", "248-poisson-90", "--planner", "planner:arrivals=2/work=2000",
            "--cache", str(tmp_path)]
    assert bench.main(argv) == 0
    cap = capsys.readouterr()
    rows = [[c.strip() for c in ln.split("|")] for ln in cap.out.splitlines() if ln.startswith("| 248-poisson-90 | ")]
    main_rows = [r for r in rows if r[2] == "4x8"]
    assert [r[5] for r in main_rows] == ["planner:arrivals=2/work=2000", "rl-base"]
    assert all(r[3] in bench.HEURISTICS and float(r[7].split()[0]) > 0 and r[9].endswith("/ 2") for r in main_rows)
    vs = [r for r in rows if r[2] == "rl-base"]
    assert len(vs) == 1 and vs[0][6] in ("yes", "no") and float(vs[0][3].split()[0]) > 0
    lat = [r for r in rows if r[2] == "planner:arrivals=2/work=2000"]
    assert len(lat) == 1 and int(lat[0][3]) > 0 and float(lat[0][8]) <= 2000
    assert len(list(tmp_path.glob("*.json"))) == 2 * (len(bench.HEURISTICS) + 2) and "set 1" in cap.err
    assert bench.main(argv) == 0
    again = capsys.readouterr()
    assert again.out == cap.out and "set " not in again.err
    # a learned policy's cached result is keyed by its checkpoint too: another checkpoint is run anew
    from policies.sizefree import shipped_sizefree

    g = next(x for x in bench.groups(6, 950) if x.name == "248-poisson-90")
    other = tmp_path / "other.json"
    other.write_text(shipped_sizefree().read_text())
    before = bench._cache_file(tmp_path, g, 0, f"rl-sf:{other}")
    assert bench._cache_file(tmp_path, g, 0, f"rl-sf:{other}") == before
    other.write_text(shipped_sizefree().read_text().replace('"policy": "rl-sf"', '"policy": "rl-sf" '))
    assert bench._cache_file(tmp_path, g, 0, f"rl-sf:{other}") != before
    with pytest.raises(SystemExit) as e:
        bench.main(["--groups", "nosuch"])
    assert e.value.code == 2 and "unknown group" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        bench.main(["--planner", "greedy"])
    assert e.value.code == 2 and "must be a planner" in capsys.readouterr().err


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


# ---------------------------------------------------------------- sampled arrivals and the work budget

def _info(jid: str, t: float, gpus: int, hours: float, model: str = "MoE"):
    from policies.state import JobInfo

    best = PERF.best_isolated_throughput(model, gpus)
    return JobInfo(jid, model, gpus, t, hours * 3600.0 * best, best_thp=best)


def _state(now: float, pending, running=()) -> ClusterState:
    import numpy as np

    free = np.array(CL.gpus_per_node, dtype=np.int64)
    return ClusterState(now, CL, free, list(running), list(pending))


def test_arrival_model_from_the_snapshot():
    """Rate: the jobs after the window's oldest distinct submit time over the span to the newest; shapes:
    those jobs'. Every job submitted at one time (zero arrivals): rate 0, no arrival paths."""
    from policies.planner import ArrivalModel

    pend = [_info("old", 0.0, 16, 1.0)] + [_info(f"n{i}", 1000.0 + 600.0 * i, 2, 0.5) for i in range(4)]
    m = ArrivalModel.estimate(_state(4000.0, pend))
    assert m.rate == pytest.approx(4 / 2800.0)  # n0..n3 after t = 0, newest at 2800 s
    assert {s[1] for s in m.shapes} == {2} and len(m.shapes) == 4
    m2 = ArrivalModel.estimate(_state(4000.0, pend), window=2)  # the 3 newest distinct times: 1600..2800
    assert m2.rate == pytest.approx(2 / 1200.0) and len(m2.shapes) == 2
    zero = _state(5000.0, [_info(f"z{i}", 0.0, 1 + i, 1.0) for i in range(5)])
    assert ArrivalModel.estimate(zero).rate == 0.0
    pol = make_planner("planner:arrivals=4", CL, PERF)
    assert pol.arrival_paths(zero) == [()]
    paths = pol.arrival_paths(_state(4000.0, pend))
    assert len(paths) == 4 and all(len(p) == 2 * pol.horizon for p in paths)
    assert all(j.submit_time > 4000.0 and j.gpu_demand == 2 and j.job_id.startswith("~arrival:") for p in paths
               for j in p)
    assert len({tuple(j.submit_time for j in p) for p in paths}) == 4  # four different paths


def test_arrival_paths_are_seeded_by_the_snapshot():
    """The same jobs give the same paths at any clock origin (epoch seconds) and any round time;
    other jobs give other paths."""
    from policies.planner import snapshot_seed

    pend = [_info(f"n{i}", 1000.0 + 600.0 * i, 1 + i, 0.5) for i in range(5)]
    pol = make_planner("planner:arrivals=2", CL, PERF)
    a = pol.arrival_paths(_state(4000.0, pend))
    E = 1_704_067_200.0
    moved = [dataclasses.replace(j, submit_time=j.submit_time + E) for j in pend]
    b = pol.arrival_paths(_state(4000.0 + E, moved))
    assert [[(j.model, j.gpu_demand, j.total_samples) for j in p] for p in a] == \
        [[(j.model, j.gpu_demand, j.total_samples) for j in p] for p in b]
    for pa, pb in zip(a, b):
        assert [j.submit_time - 4000.0 for j in pa] == pytest.approx([j.submit_time - 4000.0 - E for j in pb],
                                                                      abs=1e-5)
    assert snapshot_seed(_state(9000.0, pend)) == snapshot_seed(_state(4000.0, pend))
    assert snapshot_seed(_state(4000.0, pend[:-1])) != snapshot_seed(_state(4000.0, pend))


def test_from_state_with_arrivals_continues_the_run_exactly():
    """A simulator rebuilt from a mid-run snapshot of a trace with later arrivals, handed those arrivals,
    gives the original run's completion times; an arrival not after the snapshot is refused."""
    from policies.rounds import run_round

    jobs = [_job(f"j{i}", 900.0 * i, g, h) for i, (g, h) in enumerate(
        [(4, 0.5), (8, 1.0), (12, 0.7), (2, 2.0), (6, 0.4), (16, 0.9), (1, 1.2), (3, 0.8), (5, 0.3)])]
    fin_ref, state = _mid_run(jobs, "srtf")
    seen = {j.job_id for j in (*state.running, *state.pending)}
    later = [j for j in jobs if j.submit_time > state.time]
    assert later and seen.isdisjoint(j.job_id for j in later)
    cont = Simulator.from_state(state, make_policy("srtf", CL, PERF), PERF, arrivals=later)
    be2 = SimBackend(cont)
    while be2.next_round():
        run_round(be2, cont.policy)
    assert cont.done
    for j in cont.jobs:
        assert j.finish == pytest.approx(fin_ref[j.spec.job_id], rel=1e-9)
    with pytest.raises(ValueError, match="not after the snapshot"):
        Simulator.from_state(state, None, PERF, arrivals=[dataclasses.replace(later[0], submit_time=state.time)])


CL4 = ClusterSpec.parse("4x8")
PERF4 = ContentionModel(CL4)


def _job4(jid: str, t: float, gpus: int, hours: float) -> JobSpec:
    return JobSpec(jid, t, "MoE", gpus, hours * 3600.0 * PERF4.best_isolated_throughput("MoE", gpus))


def arrivals_snapshot() -> ClusterState:
    """4x8 at t = 1 h: R (8 GPUs, 10 min left) on node 0, X1..X8 (1 GPU, 1.5 h each, submitted every
    7.5 min over the last hour) on node 1; waiting since t = 0: B (24 GPUs, 1 h) and S (8 GPUs, 1.8 h).
    B fits once R ends if S does not run: holding S (the base decision minus S) lets B start in 10 min,
    best for the jobs present. But 1-GPU jobs have been arriving at 8 per hour; those arriving in the
    10 min take GPUs B needs, so B does not start anyway and the hold only delays S."""
    from policies.rounds import run_round

    jobs = ([_job4("R", 0.0, 8, 70 / 60)] + [_job4(f"X{i}", 450.0 * i, 1, 1.5) for i in range(1, 9)]
            + [_job4("B", 3601.0, 24, 1.0), _job4("S", 3601.0, 8, 1.8)])
    sim = Simulator(CL4, jobs, make_policy("greedy", CL4, PERF4), PERF4)
    be = SimBackend(sim)
    while be.next_round() and sim.time < 3601.0:
        run_round(be, sim.policy)
    st = sim.state()
    waited = [dataclasses.replace(j, submit_time=0.0) for j in st.pending]
    return ClusterState(st.time, st.cluster, st.free_gpus, list(st.running), waited)


def test_sampled_arrivals_change_the_decision_the_right_way():
    """Without arrivals the planner holds S for B; with sampled arrivals (rate 8 / h and 1-GPU 1.5 h
    shapes, from the X jobs) it starts S now. Scored on 12 arrival paths of the true process (1-GPU
    1.5 h jobs, exponential gaps of 7.5 min, drawn independently of the planner's), starting S is better
    on every path."""
    import numpy as np

    from policies.planner import ArrivalModel

    st = arrivals_snapshot()
    assert {j.job_id for j in st.pending} == {"B", "S"} and len(st.running) == 9
    am = ArrivalModel.estimate(st)
    assert am.rate * 3600 == pytest.approx(8.0) and {(s[1], s[0]) for s in am.shapes} == {(1, "MoE")}
    blind = make_planner("planner:budget_s=1000", CL4, PERF4)
    assert not blind.schedule(st).place  # the hold
    seeing = make_planner("planner:budget_s=1000/arrivals=4", CL4, PERF4)
    dec = seeing.schedule(st)
    assert [j for j, _p in dec.place] == ["S"] and seeing.last_round.paths == 4
    cands = blind.candidates(st)
    start = next(c for c in cands if [j for j, _p in c[0].place] == ["S"])
    hold = next(c for c in cands if not c[0].place)
    model = SimRollout(PERF4)
    for s in range(12):
        rng = np.random.default_rng(500 + s)
        times = st.time + np.cumsum(rng.exponential(450.0, size=40))
        arr = [_job4(f"a{k}", float(t), 1, 1.5) for k, t in enumerate(times)]
        until = st.time + 6 * 3600.0
        a = model.rollout(st, start[0], start[1], until=until, arrivals=arr)
        b = model.rollout(st, hold[0], hold[1], until=until, arrivals=arr)
        assert a.score < b.score, s


def test_planner_with_arrivals_is_deterministic_and_blind_without_a_rate():
    """Two runs of a Poisson-like trace with sampled arrivals give identical schedules; on a trace with
    every job at t = 0 (no arrival rate) ``arrivals=4`` gives exactly the schedule of ``arrivals=0``."""
    poisson = [_job(f"p{i}", 700.0 * i + 37.0 * (i % 3), 1 + (5 * i) % 12, 0.3 + 0.17 * (i % 5)) for i in range(14)]
    runs = []
    for _ in range(2):
        pol = make_policy("planner:arrivals=2/horizon=6/work=1000", CL, PERF)
        runs.append([(r.job_id, r.first_start, r.finish_time) for r in Simulator(CL, poisson, pol, PERF).run().jobs])
    assert runs[0] == runs[1]
    zero = blocking_trace() + [_job(f"z{i}", 0.0, 1 + i % 8, 0.3 + 0.1 * i) for i in range(5)]
    res = {k: [(r.job_id, r.first_start, r.finish_time) for r in
               Simulator(CL, zero, make_policy(f"planner:arrivals={k}", CL, PERF, budget_s=30.0), PERF).run().jobs]
           for k in (0, 4)}
    assert res[0] == res[4]


class _CountingModel:
    """A rollout model whose every rollout takes ``rounds`` simulated rounds (and gives up with no score
    when ``max_rounds`` is less); scores rise with each call, so the base decision stays best."""

    def __init__(self, rounds: int) -> None:
        self.rounds, self.calls, self.kw = rounds, 0, []

    def rollout(self, state, first, policy, *, completions=0, until=math.inf, deadline=math.inf, max_rounds=0):
        self.calls += 1
        self.kw.append(max_rounds)
        if max_rounds and max_rounds < self.rounds:
            return Rollout(None, 1.0, max_rounds)
        return Rollout(float(self.calls), 1.0, self.rounds)


@pytest.mark.parametrize("work, rollouts, scored, used", [(25, 3, 2, 25), (20, 2, 2, 20), (9, 1, 0, 9),
                                                           (1000, 6, 6, 60)])
def test_work_budget_stops_the_search(work, rollouts, scored, used):
    """With ``work`` simulated rounds per planner round (10 per rollout here) the planner hands each rollout
    what is left, drops the one that runs out and stops there; no wall budget applies."""
    model = _CountingModel(10)
    pol = make_planner(f"planner:work={work}/holds=3", CL, PERF, model=model)
    assert pol.budget_s == math.inf and pol.work == work
    st = first_round(blocking_trace(), pol)
    n = len(pol.candidates(st))
    assert n == 6
    dec = pol.schedule(st)
    stats = pol.last_round
    assert (stats.rollouts, stats.scored, stats.work, stats.cut) == (rollouts, scored, used, rollouts < n or
                                                                       scored < n)
    assert model.kw[0] == work and dec == pol.candidates(st)[0][0]


def test_planner_options_match_the_registry():
    from policies import registry
    from policies.planner import PLANNER_OPTIONS

    assert set(registry._PLANNER_OPTIONS) == set(PLANNER_OPTIONS)
    pol = make_policy("planner", CL, PERF, arrivals=3, work=500, budget_s=2.0)
    assert (pol.arrivals, pol.work, pol.budget_s) == (3, 500, 2.0)
    with pytest.raises(PolicyError, match="arrivals must be >= 0"):
        make_policy("planner:arrivals=-1", CL, PERF)
    with pytest.raises(PolicyError, match="work must be an integer"):
        make_policy("planner:work=1.5", CL, PERF)
    with pytest.raises(PolicyError, match="follow must be own or base"):
        make_policy("planner:follow=other", CL, PERF)


def test_follow_base_rolls_every_candidate_out_with_the_base():
    """With follow=base every heuristic's candidate is rolled out with the base heuristic, so a candidate
    whose first decision equals the base's is dropped; with follow=own it stays (its rollout differs)."""
    st = first_round(blocking_trace(), None)
    own = make_planner("planner:holds=0/alternatives=srtf+lgtf", CL, PERF)
    base = make_planner("planner:holds=0/alternatives=srtf+lgtf/follow=base", CL, PERF)
    c_own, c_base = own.candidates(st), base.candidates(st)
    assert all(h is base.base for _d, h in c_base)
    assert [h.name for _d, h in c_own] == ["greedy", "srtf", "lgtf"]
    firsts = [d for d, _h in c_own]
    assert [d for d, _h in c_base] == [d for i, d in enumerate(firsts) if d not in firsts[:i]]


def test_every_candidate_is_scored_over_the_base_window_with_arrivals():
    """A candidate equal to the base (a second ``greedy``) scores exactly as the base on every arrival
    path, also when the snapshot holds fewer jobs than the horizon, so the base keeps the tie."""
    st = arrivals_snapshot()
    assert len(st.running) + len(st.pending) < 16
    pol = make_planner("planner:alternatives=greedy/holds=0/arrivals=3/budget_s=1000", CL4, PERF4)
    pol.schedule(st)
    assert (pol.last_round.candidates, pol.last_round.scored, pol.last_round.chosen, pol.last_round.paths) == (2, 2, 0, 3)
