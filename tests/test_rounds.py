"""policies.rounds (the one round loop) over a fake backend, and the simulator's backend."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from policies.backend import ApplyReport, Backend
from policies.base import Policy
from policies.cluster import ClusterSpec, Placement
from policies.heuristics import make_heuristic
from policies.job import JobSpec
from policies.perf import ContentionModel
from policies.rounds import RoundLoop, RoundOutcome, run_round
from policies.state import ClusterState, Decision, JobInfo
from policies.validate import check_decision
from trainer.sim_backend import SimBackend
from trainer.simulator import SimConfig, SimulationError, Simulator
from trainer.traces import load_trace

REPO = Path(__file__).resolve().parents[1]
P = Placement.of


# ---------------------------------------------------------------------- a fake backend
class FakeBackend:
    """Two nodes of 4 GPUs; ``pending`` job ids of 1 GPU each; ``rounds`` rounds, then finished. Records calls."""

    def __init__(self, log: list, pending=("a", "b", "c"), rounds: int = 3) -> None:
        self.log = log
        self.left = rounds
        self.cluster = ClusterSpec.parse("2x4")
        self.pending = list(pending)
        self.applied: list[tuple[Decision, list]] = []
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def snapshot(self) -> ClusterState:
        self.log.append("snapshot")
        jobs = [JobInfo(j, "MoE", 1, 0.0, 100.0) for j in self.pending]
        return ClusterState(self.t, self.cluster, np.array([4, 4]), [], jobs)

    def apply(self, decision, problems=None) -> ApplyReport:
        self.log.append("apply")
        self.applied.append((decision, list(problems or [])))
        return ApplyReport(placed=[j for j, _ in decision.place])

    def next_round(self) -> bool:
        self.log.append("next_round")
        self.t += 60.0
        self.left -= 1
        return self.left >= 0


class Recorder(Policy):
    """Places every pending job on node 0 (or returns ``fixed``); records when it is asked."""

    name = "recorder"

    def __init__(self, log: list, fixed: Decision | None = None) -> None:
        self.log = log
        self.fixed = fixed
        self.seen_limits: list = []

    def schedule(self, state: ClusterState) -> Decision:
        self.log.append("schedule")
        self.seen_limits.append(self.place_limit)
        if self.fixed is not None:
            return self.fixed
        return Decision([(j.job_id, P({0: 1})) for j in state.pending])


def test_backends_implement_the_protocol(tmp_path) -> None:
    from controller.backend import SlurmBackend

    assert isinstance(FakeBackend([]), Backend)
    c = ClusterSpec.parse("1x4")
    assert isinstance(SimBackend(Simulator(c, [], None, ContentionModel(c))), Backend)
    assert isinstance(SlurmBackend(ctl=None), Backend)  # type: ignore[arg-type]


def test_round_order_snapshot_schedule_validate_apply() -> None:
    log: list = []
    b = FakeBackend(log)
    bad = Decision([("a", P({0: 1})), ("zz", P({0: 1}))])
    out = run_round(b, Recorder(log, bad))
    assert log == ["snapshot", "schedule", "apply"]
    assert isinstance(out, RoundOutcome) and out.asked and out.decision is bad and out.decision_s >= 0
    # apply got the validator's problems for the snapshot the policy saw
    ((_dec, problems),) = b.applied
    assert [(p.action, p.index, p.job_id) for p in problems] == [("place", 1, "zz")]
    assert out.problems == problems == check_decision(out.state, bad)
    assert out.report.placed == ["a", "zz"]  # the fake backend applies whatever it is given
    assert out.state.time == b.now()


def test_place_limit_cuts_placements_and_is_told_to_the_policy() -> None:
    log: list = []
    b = FakeBackend(log)
    pol = Recorder(log)
    out = run_round(b, pol, place_limit=2)
    assert pol.seen_limits == [2] and [j for j, _ in out.decision.place] == ["a", "b"]
    assert [j for j, _ in b.applied[-1][0].place] == ["a", "b"]
    # 0: the policy is not asked; apply still runs (with nothing)
    log.clear()
    out = run_round(b, pol, place_limit=0)
    assert log == ["snapshot", "apply"] and not out.asked and not out.decision and b.applied[-1][0].place == []
    # None: the policy's own limit is left alone, nothing is cut
    pol.place_limit = 1
    out = run_round(b, pol)
    assert pol.seen_limits[-1] == 1 and len(out.decision.place) == 3


def test_no_pending_job_asks_no_policy() -> None:
    log: list = []
    b = FakeBackend(log, pending=())
    out = run_round(b, Recorder(log))
    assert log == ["snapshot", "apply"] and not out.asked and out.problems == [] and not b.applied[0][0]


def test_loop_runs_while_next_round_and_stops() -> None:
    log: list = []
    b = FakeBackend(log, rounds=2)
    seen: list[RoundOutcome] = []
    loop = RoundLoop(b, Recorder(log), place_limit=1)
    assert loop.run(on_round=seen.append) == 2
    assert log == ["next_round", "snapshot", "schedule", "apply"] * 2 + ["next_round"]
    assert [o.state.time for o in seen] == [60.0, 120.0] and all(len(o.decision.place) == 1 for o in seen)
    assert loop.rounds == 2


def test_loop_max_rounds_does_not_advance_past_the_limit() -> None:
    log: list = []
    b = FakeBackend(log, rounds=10)
    loop = RoundLoop(b, Recorder(log))
    assert loop.run(max_rounds=2) == 2
    assert log.count("next_round") == 2 and b.t == 120.0
    assert loop.run(max_rounds=0) == 0 and b.t == 120.0
    assert loop.run() == 8 and loop.rounds == 10


# ---------------------------------------------------------------------- the simulator's backend
def _old_loop(sim: Simulator):
    """Oracle: the round timing of the module docstring of trainer.sim_backend written as one plain loop
    over the simulator's mechanics, a schedule_round() per round (every round counted, the policy asked
    when jobs wait)."""
    sim.reset_state()
    rl = sim.cfg.round_len
    invariant = getattr(sim.policy, "time_invariant", False)
    idle = [0]

    def schedule_round():
        sim.rounds += 1
        dec = sim.policy.schedule(sim.state()) if sim.pending else Decision()
        started = sim.apply(dec) if dec else 0
        sim.dirty = False
        sim._sample_metrics()
        if not sim.running and sim.pending and started == 0 and sim.next_arrival >= len(sim.jobs):
            idle[0] += 1
            if idle[0] >= sim.cfg.max_idle_rounds:
                raise SimulationError("idle")
        else:
            idle[0] = 0

    next_round = 0.0
    while not sim.done:
        if not sim.running and not sim.pending:
            sim.advance_to_next_event()
            if not sim.cfg.event_triggered:
                next_round = math.ceil(sim.time / rl - 1e-12) * rl
                sim.advance_to_round(next_round)
            schedule_round()
            next_round = (math.floor(sim.time / rl + 1e-12) + 1) * rl
            continue
        if sim.advance_to_next_event(until=next_round):
            if sim.cfg.event_triggered:
                schedule_round()
        elif sim.dirty or not invariant:
            schedule_round()
            next_round += rl
        else:
            t_arr = sim.jobs[sim.next_arrival].spec.submit_time if sim.next_arrival < len(sim.jobs) else math.inf
            t_next = min(sim._next_completion(), t_arr)
            next_round = max(next_round + rl, math.ceil(t_next / rl - 1e-12) * rl)
    return sim.result()


def _same(a, b) -> None:
    assert [vars(r) for r in a.jobs] == [vars(r) for r in b.jobs]
    assert (a.rounds, a.decisions, a.preemptions, a.makespan) == (b.rounds, b.decisions, b.preemptions, b.makespan)
    for f in ("util_t", "util_used", "samples_t", "samples_frag", "samples_cs"):
        assert np.array_equal(getattr(a, f), getattr(b, f)), f


@pytest.mark.parametrize("policy", ["fifo", "srtf", "las", "greedy-np"])
@pytest.mark.parametrize("cfg", [{}, {"event_triggered": False}, {"round_len": 120.0, "noise_cv": 0.3, "seed": 2}],
                         ids=["events", "boundaries", "short-noisy"])
def test_simulator_backend_gives_the_results_of_one_plain_loop(policy, cfg) -> None:
    cluster = ClusterSpec.parse("4x8")
    perf = ContentionModel(cluster)
    jobs = load_trace(REPO / "tests/golden/heavy-4x8.csv", cluster=cluster)[:80]

    def sim():
        return Simulator(cluster, jobs, make_heuristic(policy, perf), perf, SimConfig(**cfg))

    _same(sim().run(), _old_loop(sim()))


def test_progress_is_reported_as_jobs_finish() -> None:
    cluster = ClusterSpec.parse("1x4")
    perf = ContentionModel(cluster)
    jobs = [JobSpec(f"j{i}", 10.0 * i, "MoE", 2, 1e4) for i in range(5)]
    seen: list[tuple[int, int]] = []
    Simulator(cluster, jobs, make_heuristic("fifo", perf), perf).run(progress=lambda d, n: seen.append((d, n)))
    assert seen[-1] == (5, 5) and [d for d, _ in seen] == sorted({d for d, _ in seen})


def test_run_needs_a_policy() -> None:
    c = ClusterSpec.parse("1x4")
    with pytest.raises(ValueError, match="needs a policy"):
        Simulator(c, [], None, ContentionModel(c)).run()


class AtDemand(Policy):
    """Places pending jobs in order on node 0 while they fit (one-node clusters)."""

    name = "at-demand"

    def schedule(self, state: ClusterState) -> Decision:
        free = int(state.free_gpus[0])
        dec = Decision()
        for j in state.pending:
            if j.gpu_demand <= free:
                dec.place.append((j.job_id, P({0: j.gpu_demand})))
                free -= j.gpu_demand
        return dec


def test_next_round_skips_rounds_with_nothing_pending_but_counts_them() -> None:
    """A round due while no job waits is counted and closed by the backend; the loop only sees rounds with a
    decision to make."""
    cluster = ClusterSpec.parse("1x8")
    perf = ContentionModel(cluster)
    thp = perf.best_isolated_throughput("MoE", 2)
    jobs = [JobSpec("a", 0.0, "MoE", 2, 3000.0 * thp), JobSpec("b", 5000.0, "MoE", 2, 1000.0 * thp)]
    pol = AtDemand()  # not time-invariant: every boundary while jobs run is a round
    sim = Simulator(cluster, jobs, pol, perf, SimConfig(event_triggered=False, round_len=300.0))
    sim.reset_state()
    seen: list[float] = []
    RoundLoop(SimBackend(sim), pol).run(on_round=lambda o: seen.append(o.state.time))
    assert seen == [0.0, 5100.0]  # b arrives at 5000 and waits for the boundary at 5100
    # 0; boundaries 300..2700 while a runs (it ends at 3000, with the cluster then idle); 5100; boundaries
    # 5400..6000 while b runs (it ends at 6100)
    assert sim.rounds == 1 + 9 + 1 + 3 and sim.done



@pytest.mark.parametrize("every_round,keep,want", [
    (None, None, [0.0, 5100.0]),
    (True, None, [0.0, 5100.0]),
    (None, True, [0.0, 5100.0]),  # kept rounds with nothing pending are counted, not opened
    (True, True, [0.0, 300.0, 600.0, 900.0, 5100.0]),
])
def test_a_driver_that_is_not_a_policy_takes_the_backends_rounds(every_round, keep, want) -> None:
    """``while backend.next_round(): ...`` with the driver acting on the simulator itself (the twin's loop):
    ``every_round`` opens the rounds due while no job waits as well, so the driver sees every counted round;
    ``keep_rounds`` holds boundaries a time-invariant policy would skip while nothing changes."""
    cluster = ClusterSpec.parse("1x8")
    perf = ContentionModel(cluster)
    thp = perf.best_isolated_throughput("MoE", 2)
    jobs = [JobSpec("a", 0.0, "MoE", 2, 3000.0 * thp), JobSpec("b", 5000.0, "MoE", 2, 1000.0 * thp)]
    fifo = make_heuristic("fifo", perf)
    assert fifo.time_invariant
    sim = Simulator(cluster, jobs, fifo, perf, SimConfig(event_triggered=False, round_len=300.0))
    backend = SimBackend(sim, every_round=every_round,
                         keep_rounds=(lambda: sim.time < 1000.0) if keep else None)
    seen: list[float] = []
    while backend.next_round():
        seen.append(sim.time)
        for j in sim.state().pending:
            sim.start(j.job_id, P({0: j.gpu_demand}))
    assert seen == want and sim.done
    # a runs 0..3000, b 5100..6100; held boundaries 300, 600, 900 (keep_rounds); the rest skipped
    assert sim.rounds == (5 if keep else 2)
    res = sim.result().jobs
    assert [t for r in res for t in (r.first_start, r.finish_time)] == pytest.approx([0.0, 3000.0, 5100.0, 6100.0])


# ---------------------------------------------------------------------- resize in the simulator
def _elastic_sim(**cfg) -> tuple[Simulator, ContentionModel]:
    cluster = ClusterSpec.parse("1x8")
    perf = ContentionModel(cluster)
    thp2 = perf.best_isolated_throughput("MoE", 2)
    sim = Simulator(cluster, [JobSpec("e", 0.0, "MoE", 2, 1000.0 * thp2)], None, perf,
                    SimConfig(check_invariants=True, **cfg))
    info = sim.by_id["e"].info
    info.min_gpus, info.max_gpus = 1, 8
    sim.reset_state()
    sim.advance_to_next_event()
    return sim, perf


@pytest.mark.parametrize("overhead", [None, 0.0, 45.0])
def test_resize_keeps_progress_and_pays_its_overhead(overhead) -> None:
    sim, perf = _elastic_sim(resize_overhead=overhead, restart_overhead=30.0)
    total = sim.by_id["e"].spec.total_samples
    sim.apply(Decision([("e", P({0: 2}))]))
    sim.advance_to_round(400.0)  # 40 % done
    assert sim.apply(Decision(resize=[("e", P({0: 4}))])) == 0
    assert sim.decisions == 2 and sim.preemptions == 0
    j = sim.by_id["e"]
    assert j.info.gpu_demand == 4 and j.info.placement == P({0: 4}) and sim.free.tolist() == [4]
    assert j.done == pytest.approx(0.4 * total) and j.info.preemptions == 0
    while not sim.done:
        sim.advance_to_next_event()
    ov = 30.0 if overhead is None else overhead
    thp4 = perf.isolated_throughput("MoE", 4, 1)
    rec = sim.result().jobs[0]
    assert rec.finish_time == pytest.approx(400.0 + ov + 0.6 * total / thp4)
    assert rec.done_samples == total and rec.first_start == 0.0
    assert j.att_base == pytest.approx(2 * 400.0 + 4 * (rec.finish_time - 400.0))


def test_resize_is_checked() -> None:
    sim, _ = _elastic_sim()
    with pytest.raises(SimulationError, match="which is not running"):
        sim.apply(Decision(resize=[("e", P({0: 4}))]))
    sim.apply(Decision([("e", P({0: 2}))]))
    with pytest.raises(SimulationError, match=r"outside its range \[1, 8\]"):
        sim.apply(Decision(resize=[("e", Placement(((0, 9),)))]))
    sim.by_id["e"].info.min_gpus = sim.by_id["e"].info.max_gpus = None
    with pytest.raises(SimulationError, match="not elastic"):
        sim.apply(Decision(resize=[("e", P({0: 4}))]))
    with pytest.raises(SimulationError, match="cannot resize"):
        sim.resize("e", P({0: 4}))
    assert sim.by_id["e"].info.placement == P({0: 2}) and sim.decisions == 1


class GrowElastic(Policy):
    """FIFO at demand; every round, grows a running elastic job to its maximum when the GPUs are free."""

    name = "grow"
    resizes = True

    def schedule(self, state: ClusterState) -> Decision:
        free = int(state.free_gpus[0])
        dec = Decision()
        for j in state.running:
            if j.elastic and j.gpu_demand < j.max_gpus and free >= j.max_gpus - j.gpu_demand:
                dec.resize.append((j.job_id, P({0: j.max_gpus})))
                free -= j.max_gpus - j.gpu_demand
        for j in state.pending:
            if j.gpu_demand <= free:
                dec.place.append((j.job_id, P({0: j.gpu_demand})))
                free -= j.gpu_demand
        return dec


def test_a_policy_resizes_through_the_round_loop() -> None:
    cluster = ClusterSpec.parse("1x8")
    perf = ContentionModel(cluster)
    thp = perf.best_isolated_throughput("MoE", 4)
    jobs = [JobSpec("big", 0.0, "MoE", 4, 100.0 * thp), JobSpec("e", 0.0, "MoE", 2, 10000.0 * thp)]
    plain = Simulator(cluster, jobs, GrowElastic(), perf, SimConfig(check_invariants=True)).run()
    sim = Simulator(cluster, jobs, GrowElastic(), perf, SimConfig(check_invariants=True))
    info = sim.by_id["e"].info
    info.min_gpus, info.max_gpus = 2, 8
    res = sim.run()
    e0, e1 = (next(r for r in x.jobs if r.job_id == "e") for x in (plain, res))
    assert e1.done_samples == e1.total_samples and e1.finish_time < e0.finish_time
    assert res.decisions == plain.decisions + 1  # one resize, once big has finished
    assert info.gpu_demand == 8
    # the next run starts from the trace again
    assert sim.run().jobs == res.jobs


@pytest.mark.parametrize("event_triggered", [True, False])
def test_on_advance_integrates_the_state_exactly(event_triggered) -> None:
    """The integral over time of the jobs in the system, summed piece by piece between on_advance calls,
    is the sum of the jobs' JCTs (what the environment's "jct" reward needs)."""
    cluster = ClusterSpec.parse("4x8")
    perf = ContentionModel(cluster)
    jobs = load_trace(REPO / "tests/golden/heavy-4x8.csv", cluster=cluster)[:40]
    sim = Simulator(cluster, jobs, make_heuristic("las", perf), perf, SimConfig(event_triggered=event_triggered))
    sim.reset_state()
    acc = {"t": 0.0, "n": 0, "area": 0.0, "calls": 0}

    def on_advance(t: float) -> None:
        acc["area"] += acc["n"] * (t - acc["t"])
        acc["t"], acc["n"] = t, len(sim.pending) + len(sim.running)
        acc["calls"] += 1

    RoundLoop(SimBackend(sim, on_advance=on_advance), sim.policy).run()
    on_advance(sim.time)
    res = sim.result()
    assert acc["area"] == pytest.approx(sum(r.jct for r in res.jobs), rel=1e-9)
    again = Simulator(cluster, jobs, make_heuristic("las", perf), perf, SimConfig(event_triggered=event_triggered))
    _same(res, again.run())
