"""Tests for trainer.simulator: golden traces and property-based invariants.

Jobs are written with a duration: ``total_samples = duration x best isolated
throughput`` on the test cluster, so on a single node (no contention) a job
that runs alone takes exactly ``duration`` seconds and JCTs can be computed
by hand.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.base import Policy
from policies.cluster import ClusterSpec, NodeSpec, Placement
from policies.heuristics import make_heuristic
from policies.job import JobSpec
from policies.perf import ContentionModel
from policies.state import ClusterState, Decision
from policies.workloads import MODELS
from trainer.simulator import MAX_ISOLATED_RUN_S, SimConfig, SimResult, SimulationError, Simulator

#: Every heuristic, with each placement rule.
HEURISTICS = (
    "fifo", "sjf", "srtf", "las", "greedy",
    "fifo:spread", "sjf:spread", "srtf:spread", "las:spread", "greedy:spread",
    "srtf:greedy", "las-np", "srtf-np:pack",
)

_PERF_CACHE: dict[str, ContentionModel] = {}


def perf_for(cluster: ClusterSpec) -> ContentionModel:
    key = repr(cluster)
    if key not in _PERF_CACHE:
        _PERF_CACHE[key] = ContentionModel(cluster)
    return _PERF_CACHE[key]


def job(perf: ContentionModel, jid: str, submit: float, gpus: int, duration: float, model: str = "MoE") -> JobSpec:
    return JobSpec(jid, submit, model, gpus, duration * perf.best_isolated_throughput(model, gpus))


def simulate(cluster: ClusterSpec, jobs: list[JobSpec], policy: str, **cfg) -> SimResult:
    perf = perf_for(cluster)
    cfg.setdefault("check_invariants", True)
    return Simulator(cluster, jobs, make_heuristic(policy, perf), perf, SimConfig(**cfg)).run()


def jcts(res: SimResult) -> dict[str, float]:
    return {r.job_id: r.jct for r in res.jobs}


# ---------------------------------------------------------------------- golden traces
ONE_BY_FOUR = ClusterSpec.parse("1x4")


def three_jobs() -> list[JobSpec]:
    p = perf_for(ONE_BY_FOUR)
    return [
        job(p, "a", 0.0, 2, 100.0, "DLRM"),
        job(p, "b", 10.0, 4, 50.0, "FSDP"),
        job(p, "c", 20.0, 1, 30.0, "GraphSage"),
    ]


def test_golden_fifo_head_of_line_blocking() -> None:
    # a runs 0-100. b (4 GPUs) waits for a. c would fit beside a at t=20 but
    # strict FIFO keeps it behind b: b runs 100-150, c 150-180.
    res = simulate(ONE_BY_FOUR, three_jobs(), "fifo")
    got = jcts(res)
    assert got == pytest.approx({"a": 100.0, "b": 140.0, "c": 160.0}, rel=1e-9)
    rec = {r.job_id: r for r in res.jobs}
    assert rec["c"].first_start == pytest.approx(150.0)
    assert rec["c"].queueing == pytest.approx(130.0)
    assert rec["c"].run_time == pytest.approx(30.0)
    assert res.makespan == pytest.approx(180.0)
    assert res.preemptions == 0


def test_golden_sjf_backfills() -> None:
    # SJF is not strict: c (30 s, 1 GPU) backfills beside a at t=20.
    res = simulate(ONE_BY_FOUR, three_jobs(), "sjf")
    assert jcts(res) == pytest.approx({"a": 100.0, "b": 140.0, "c": 30.0}, rel=1e-9)
    assert res.makespan == pytest.approx(150.0)


def test_golden_utilisation_step_function() -> None:
    res = simulate(ONE_BY_FOUR, three_jobs(), "fifo")
    # 2 GPUs 0-100, 4 GPUs 100-150, 1 GPU 150-180, none after.
    assert res.util_t.tolist() == pytest.approx([0.0, 100.0, 150.0, 180.0])
    assert res.util_used.tolist() == [2, 4, 1, 0]


def test_golden_srtf_order_all_at_zero() -> None:
    p = perf_for(ONE_BY_FOUR)
    jobs = [job(p, "long", 0, 4, 300.0), job(p, "short", 0, 4, 100.0), job(p, "mid", 0, 4, 200.0)]
    assert jcts(simulate(ONE_BY_FOUR, jobs, "srtf")) == pytest.approx({"short": 100, "mid": 300, "long": 600})
    assert jcts(simulate(ONE_BY_FOUR, jobs, "sjf")) == pytest.approx({"short": 100, "mid": 300, "long": 600})
    # FIFO with equal submit times: job id order.
    assert jcts(simulate(ONE_BY_FOUR, jobs, "fifo")) == pytest.approx({"long": 300, "mid": 500, "short": 600})


def test_golden_srtf_preempts_long_job_and_keeps_progress() -> None:
    p = perf_for(ONE_BY_FOUR)
    jobs = [job(p, "long", 0, 4, 1000.0), job(p, "short", 400, 4, 100.0)]
    res = simulate(ONE_BY_FOUR, jobs, "srtf")
    # At 400 long has 600 s left > 2 x 100: preempted. short runs 400-500.
    # long restarts at 500, pays 30 s restart overhead, then its remaining
    # 600 s of work (progress kept): done at 1130.
    assert jcts(res) == pytest.approx({"long": 1130.0, "short": 100.0}, rel=1e-9)
    rec = {r.job_id: r for r in res.jobs}
    assert rec["long"].preemptions == 1 and res.preemptions == 1
    assert rec["long"].run_time == pytest.approx(400.0 + 630.0)
    assert rec["long"].queueing == pytest.approx(100.0)
    # SJF never preempts: short waits until 1000.
    assert jcts(simulate(ONE_BY_FOUR, jobs, "sjf")) == pytest.approx({"long": 1000.0, "short": 700.0})


def test_golden_srtf_no_preemption_for_near_tie() -> None:
    p = perf_for(ONE_BY_FOUR)
    jobs = [job(p, "long", 0, 4, 1000.0), job(p, "next", 400, 4, 500.0)]
    # 600 s left is not > 2 x 500 s: no preemption, plain SRTF order after.
    res = simulate(ONE_BY_FOUR, jobs, "srtf")
    assert res.preemptions == 0
    assert jcts(res) == pytest.approx({"long": 1000.0, "next": 1100.0})


def test_golden_srtf_respects_min_run() -> None:
    p = perf_for(ONE_BY_FOUR)
    # At t=100 the long job has run less than min_run (300 s): the short one
    # waits for the round at 300, then preempts.
    jobs = [job(p, "long", 0, 4, 1000.0), job(p, "short", 100, 4, 10.0)]
    res = simulate(ONE_BY_FOUR, jobs, "srtf")
    assert jcts(res) == pytest.approx({"short": 210.0, "long": 1000.0 + 10.0 + 30.0})


def test_golden_las_preempts_across_queues_only() -> None:
    p = perf_for(ONE_BY_FOUR)
    # long has 4 GPUs x 1000 s = 4000 GPU-s > 3600 (queue 1) when new arrives
    # (queue 0): LAS preempts it although new is not shorter than its rest.
    jobs = [job(p, "long", 0, 4, 2000.0), job(p, "new", 1000, 4, 1500.0)]
    res = simulate(ONE_BY_FOUR, jobs, "las")
    assert jcts(res) == pytest.approx({"new": 1500.0, "long": 2500.0 + 1000.0 + 30.0})
    assert res.preemptions == 1
    # Arriving at 500 (2000 GPU-s attained: same queue 0) it waits, FIFO inside
    # a queue, until the round at 900 where long reaches 3600 GPU-s (queue 1)
    # and is preempted: new runs 900-910, long resumes at 910 (+30 s) with
    # 1100 s of work left.
    jobs = [job(p, "long", 0, 4, 2000.0), job(p, "new", 500, 4, 10.0)]
    res = simulate(ONE_BY_FOUR, jobs, "las")
    assert res.preemptions == 1
    assert jcts(res) == pytest.approx({"new": 410.0, "long": 910.0 + 30.0 + 1100.0})
    # Without preemption (las-np) new waits for the end of long.
    res = simulate(ONE_BY_FOUR, jobs, "las-np")
    assert res.preemptions == 0
    assert jcts(res) == pytest.approx({"long": 2000.0, "new": 1510.0})


def test_golden_las_favours_least_attained_service() -> None:
    # Two jobs in the lower queue compete with one that has used more service.
    p = perf_for(ONE_BY_FOUR)
    jobs = [
        job(p, "hog", 0, 4, 5000.0),  # reaches queue 1 (3600 GPU-s) at t = 900
        job(p, "x", 1000, 2, 100.0),
        job(p, "y", 1000, 2, 100.0),
    ]
    res = simulate(ONE_BY_FOUR, jobs, "las")
    got = jcts(res)
    assert got["x"] == pytest.approx(100.0) and got["y"] == pytest.approx(100.0)
    assert got["hog"] == pytest.approx(5000.0 + 100.0 + 30.0)


def test_contention_slows_co_located_multi_node_jobs() -> None:
    cluster = ClusterSpec.parse("2x8")
    perf = perf_for(cluster)
    # Two 8-GPU MoE jobs spread on both nodes share both links.
    jobs = [JobSpec("a", 0, "MoE", 8, 1e4), JobSpec("b", 0, "MoE", 8, 1e4)]
    res = simulate(cluster, jobs, "fifo:spread")
    iso = perf.isolated_throughput("MoE", 8, 2)
    cs = perf.pair_cs(("MoE", 8, 2), ("MoE", 8, 2))
    assert cs > 1.0
    for r in res.jobs:
        assert r.avg_cs == pytest.approx(cs)
        assert r.jct == pytest.approx(1e4 / (iso / cs))
    # Packed, each job gets its own node: no contention at all.
    res = simulate(cluster, jobs, "fifo")
    assert all(r.avg_cs == 1.0 and r.num_nodes == 1 for r in res.jobs)


def test_contention_ends_when_neighbour_finishes() -> None:
    cluster = ClusterSpec.parse("2x8")
    perf = perf_for(cluster)
    k = ("MoE", 8, 2)
    iso, cs = perf.isolated_throughput(*k), perf.pair_cs(k, k)
    jobs = [JobSpec("short", 0, "MoE", 8, 100 * iso / cs), JobSpec("long", 0, "MoE", 8, 1000 * iso / cs)]
    res = simulate(cluster, jobs, "fifo:spread")
    # Both share until 100; long then runs alone at full speed.
    got = jcts(res)
    assert got["short"] == pytest.approx(100.0)
    assert got["long"] == pytest.approx(100.0 + 900.0 / cs)


@pytest.mark.parametrize("rule", ["sum", "ds-min", "link"])
def test_three_jobs_on_a_link_by_rule(rule: str) -> None:
    """Three 8-GPU MoE jobs spread over the same two nodes: each has two identical neighbours on both links;
    its CS is, by hand, ``1 + 2 (p - 1)`` (sum), ``min(p, 1 / 0.35)`` (ds-min) or
    ``1 + chi (min(d, C) / share - 1)`` with the max-min share of C among three demands ``d`` (link)."""
    from policies.ledger import DS_CS_CAP, fair_share

    cluster = ClusterSpec.parse("2x12")
    perf = ContentionModel(cluster, contention=rule)
    k = ("MoE", 8, 2)
    p = perf.pair_cs(k, k)
    if rule == "sum":
        want = 1 + 2 * (p - 1)
    elif rule == "ds-min":
        want = min(p, DS_CS_CAP)
    else:
        d, chi = perf.link_terms(k)
        c = perf.link_capacity_mbps
        want = 1 + chi * (min(d, c) / fair_share(c, d, [d, d]) - 1)
    iso = perf.isolated_throughput(*k)
    jobs = [JobSpec(f"j{i}", 0, "MoE", 8, 1e4) for i in range(3)]
    res = Simulator(cluster, jobs, make_heuristic("fifo:spread", perf), perf, SimConfig(check_invariants=True)).run()
    assert want > 1.0
    for r in res.jobs:
        assert r.num_nodes == 2
        assert r.avg_cs == pytest.approx(want, rel=1e-12)
        assert r.jct == pytest.approx(1e4 / (iso / want), rel=1e-9)


# ---------------------------------------------------------------------- property tests
@st.composite
def clusters(draw) -> ClusterSpec:
    n = draw(st.integers(1, 4))
    if draw(st.booleans()):
        return ClusterSpec.homogeneous(n, draw(st.sampled_from([1, 2, 4, 8])))
    return ClusterSpec(tuple(NodeSpec(f"n{i}", draw(st.sampled_from([1, 2, 4, 8]))) for i in range(n)))


@st.composite
def scenarios(draw) -> tuple[ClusterSpec, list[JobSpec]]:
    cluster = draw(clusters())
    perf = perf_for(cluster)
    n = draw(st.integers(1, 10))
    jobs = []
    for i in range(n):
        gpus = draw(st.integers(1, cluster.total_gpus))
        model = draw(st.sampled_from(MODELS))
        submit = float(draw(st.integers(0, 3000)))
        duration = float(draw(st.integers(10, 4000)))
        jobs.append(job(perf, f"j{i}", submit, gpus, duration, model))
    return cluster, jobs


@pytest.mark.parametrize("rule", ["ds-min", "link"])
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sc=scenarios())
def test_invariants_under_other_contention_rules(rule: str, sc) -> None:
    """The simulator's incremental CS equals a recomputation after every event under every rule."""
    cluster, jobs = sc
    perf = ContentionModel(cluster, contention=rule)
    res = Simulator(cluster, jobs, make_heuristic("las:spread", perf), perf, SimConfig(check_invariants=True)).run()
    _check_result(res, jobs, cluster)


def _check_result(res: SimResult, jobs: list[JobSpec], cluster: ClusterSpec) -> None:
    by_id = {j.job_id: j for j in jobs}
    assert len(res.jobs) == len(jobs)
    gpu_seconds = 0.0
    for r in res.jobs:
        spec = by_id[r.job_id]
        # All jobs finish and did exactly their work.
        assert math.isfinite(r.finish_time)
        assert r.done_samples == spec.total_samples
        # JCT = queueing + running >= ideal.
        assert r.jct == pytest.approx(r.finish_time - spec.submit_time)
        assert r.jct == pytest.approx(r.queueing + r.run_time)
        assert r.first_start >= spec.submit_time - 1e-9
        assert r.queueing >= r.first_start - spec.submit_time - 1e-6
        assert r.run_time >= r.ideal_time * (1 - 1e-9)
        assert r.jct >= r.ideal_time * (1 - 1e-9)
        assert r.avg_cs >= 1.0
        assert 1 <= r.num_nodes <= min(cluster.num_nodes, spec.gpu_demand)
        gpu_seconds += spec.gpu_demand * r.run_time
    # No GPU ever over-allocated; the utilisation curve accounts for every
    # GPU-second the jobs ran.
    used = res.util_used
    assert (used >= 0).all() and (used <= cluster.total_gpus).all()
    assert used[-1] == 0
    integral = float(np.sum(used[:-1] * np.diff(res.util_t)))
    assert integral == pytest.approx(gpu_seconds, rel=1e-6)
    assert res.makespan == pytest.approx(max(r.finish_time for r in res.jobs))


@pytest.mark.parametrize("policy", HEURISTICS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sc=scenarios(), round_len=st.sampled_from([60.0, 300.0]), event=st.booleans(), noise=st.sampled_from([0.0, 0.3]))
def test_invariants(policy: str, sc, round_len: float, event: bool, noise: float) -> None:
    cluster, jobs = sc
    res = simulate(cluster, jobs, policy, round_len=round_len, event_triggered=event, noise_cv=noise, seed=7)
    _check_result(res, jobs, cluster)
    # Determinism: same seed, same everything.
    again = simulate(cluster, jobs, policy, round_len=round_len, event_triggered=event, noise_cv=noise, seed=7)
    assert again.jobs == res.jobs
    assert again.util_t.tolist() == res.util_t.tolist() and again.util_used.tolist() == res.util_used.tolist()


@pytest.mark.parametrize("policy", ["srtf", "las", "greedy", "las:spread"])
@settings(max_examples=30, deadline=None)
@given(
    gpus=st.sampled_from([1, 2, 4, 8]),
    specs=st.lists(st.tuples(st.integers(0, 3000), st.integers(10, 4000), st.sampled_from(MODELS)), min_size=1, max_size=8),
    overhead=st.sampled_from([0.0, 30.0, 120.0]),
)
def test_preemption_keeps_progress(policy: str, gpus: int, specs, overhead: float) -> None:
    """On one node (no contention, every placement is the best shape) a job's
    run time is its ideal time plus one restart overhead per preemption:
    no work is lost or repeated when a job is preempted."""
    cluster = ClusterSpec.homogeneous(1, gpus)
    perf = perf_for(cluster)
    jobs = [job(perf, f"j{i}", float(t), 1 + i % gpus, float(d), m) for i, (t, d, m) in enumerate(specs)]
    res = simulate(cluster, jobs, policy, restart_overhead=overhead, round_len=60.0)
    _check_result(res, jobs, cluster)
    for r in res.jobs:
        assert r.run_time == pytest.approx(r.ideal_time + overhead * r.preemptions, rel=1e-9, abs=1e-6)


@settings(max_examples=15, deadline=None)
@given(sc=scenarios())
def test_input_order_does_not_matter(sc) -> None:
    cluster, jobs = sc
    a = simulate(cluster, jobs, "srtf")
    b = simulate(cluster, list(reversed(jobs)), "srtf")
    key = {r.job_id: r.jct for r in a.jobs}
    assert {r.job_id: r.jct for r in b.jobs} == pytest.approx(key)


def test_noise_changes_speed_and_is_seeded() -> None:
    cluster = ClusterSpec.parse("2x8")
    perf = perf_for(cluster)
    jobs = [job(perf, f"j{i}", 50.0 * i, 4, 500.0) for i in range(6)]
    base = simulate(cluster, jobs, "fifo")
    n1 = simulate(cluster, jobs, "fifo", noise_cv=0.3, seed=1)
    n1b = simulate(cluster, jobs, "fifo", noise_cv=0.3, seed=1)
    n2 = simulate(cluster, jobs, "fifo", noise_cv=0.3, seed=2)
    assert n1.jobs == n1b.jobs
    assert [r.jct for r in n1.jobs] != [r.jct for r in n2.jobs]
    assert [r.jct for r in n1.jobs] != [r.jct for r in base.jobs]
    # Jobs run alone on one node: run time = ideal time (noise included).
    for r in n1.jobs:
        assert r.run_time == pytest.approx(r.ideal_time)


def test_restart_overhead_config() -> None:
    p = perf_for(ONE_BY_FOUR)
    jobs = [job(p, "long", 0, 4, 1000.0), job(p, "short", 400, 4, 100.0)]
    res = simulate(ONE_BY_FOUR, jobs, "srtf", restart_overhead=0.0)
    assert jcts(res) == pytest.approx({"long": 1100.0, "short": 100.0})


def test_round_driven_scheduling() -> None:
    # Without event triggering, jobs start only at round boundaries.
    p = perf_for(ONE_BY_FOUR)
    jobs = [job(p, "a", 10.0, 4, 100.0), job(p, "b", 20.0, 4, 100.0)]
    res = simulate(ONE_BY_FOUR, jobs, "fifo", round_len=60.0, event_triggered=False)
    rec = {r.job_id: r for r in res.jobs}
    assert rec["a"].first_start == pytest.approx(60.0)
    assert rec["b"].first_start == pytest.approx(180.0)  # a ends at 160; next round 180


# ---------------------------------------------------------------------- stepping API
def test_stepping_api() -> None:
    cluster = ClusterSpec.parse("1x4")
    perf = perf_for(cluster)
    jobs = [job(perf, "a", 0.0, 2, 100.0), job(perf, "b", 50.0, 2, 100.0)]
    sim = Simulator(cluster, jobs, None, perf, SimConfig(check_invariants=True))
    sim.reset_state()
    assert sim.advance_to_next_event()
    st_ = sim.state()
    assert st_.time == 0.0 and [j.job_id for j in st_.pending] == ["a"] and st_.free_gpus.tolist() == [4]
    sim.start("a", Placement.of({0: 2}))
    with pytest.raises(SimulationError, match="already running"):
        sim.start("a", Placement.of({0: 2}))
    sim.advance_to_round(50.0)
    st_ = sim.state()
    (run,) = st_.running
    assert run.done_samples == pytest.approx(jobs[0].total_samples / 2)
    assert run.attained_service == pytest.approx(100.0)
    with pytest.raises(SimulationError, match="has 3 GPUs, demand is 2"):
        sim.start("b", Placement.of({0: 3}))
    with pytest.raises(SimulationError, match="does not fit"):
        sim.start("b", Placement.of({1: 2}))  # no node 1
    with pytest.raises(SimulationError, match="repeats a node"):  # not via Placement.of: 1 + 1 on node 0
        sim.start("b", Placement(((0, 1), (0, 1))))
    assert sim.state().free_gpus.tolist() == [2]  # nothing was taken
    sim.preempt("a")
    assert sim.state().free_gpus.tolist() == [4]
    sim.apply(Decision(place=[("a", Placement.of({0: 2})), ("b", Placement.of({0: 2}))]))
    while not sim.done:
        sim.advance_to_next_event()
    res = sim.result()
    got = {r.job_id: r for r in res.jobs}
    assert got["a"].finish_time == pytest.approx(50.0 + 30.0 + 50.0)
    assert got["b"].finish_time == pytest.approx(150.0)


def test_bad_traces() -> None:
    cluster = ClusterSpec.parse("1x4")
    perf = perf_for(cluster)
    with pytest.raises(SimulationError, match="duplicate job id"):
        Simulator(cluster, [job(perf, "a", 0, 1, 1), job(perf, "a", 0, 1, 1)], None, perf)
    with pytest.raises(SimulationError, match="exceeds the cluster's 4 GPUs"):
        Simulator(cluster, [JobSpec("big", 0, "MoE", 8, 10.0)], None, perf)
    with pytest.raises(SimulationError, match=r"job 'neg': total_samples must be > 0, got -1.0"):
        Simulator(cluster, [JobSpec("neg", 0, "MoE", 1, -1.0)], None, perf)
    with pytest.raises(ValueError, match="round_len"):
        Simulator(cluster, [], None, perf, SimConfig(round_len=0))


nan, inf = float("nan"), float("inf")


@pytest.mark.parametrize(
    "submit, demand, samples, model, msg",
    [
        (nan, 4, 1000.0, "MoE", r"job 'a': submit_time must be a finite number, got nan"),  # ran forever
        (inf, 4, 1000.0, "MoE", r"job 'a': submit_time must be a finite number, got inf"),  # IndexError
        (-1.0, 4, 1000.0, "MoE", r"job 'a': submit_time must be >= 0, got -1.0"),
        (0.0, 4, nan, "MoE", r"job 'a': total_samples must be a finite number, got nan"),  # ValueError
        (0.0, 4, inf, "MoE", r"job 'a': total_samples must be a finite number, got inf"),  # OverflowError
        (0.0, 4, 0.0, "MoE", r"job 'a': total_samples must be > 0, got 0.0"),
        (0.0, 4, "1000", "MoE", r"job 'a': total_samples must be a finite number, got '1000'"),
        (0.0, 2.5, 1000.0, "MoE", r"job 'a': gpu_demand must be an integer, got 2.5"),  # TypeError
        (0.0, 4.0, 1000.0, "MoE", r"job 'a': gpu_demand must be an integer, got 4.0"),
        (0.0, True, 1000.0, "MoE", r"job 'a': gpu_demand must be an integer, got True"),
        (0.0, 0, 1000.0, "MoE", r"job 'a': gpu_demand must be >= 1, got 0"),
        (0.0, 4, 1000.0, "Foo", r"job 'a': unknown model 'Foo'"),
    ],
)
def test_bad_job_fields_are_rejected_naming_job_and_field(submit, demand, samples, model, msg) -> None:
    """Non-finite or non-integer job fields are rejected up front with the job and the field named,
    for every policy, instead of looping forever or failing deep inside the model."""
    cluster = ClusterSpec.parse("4x8")
    perf = perf_for(cluster)
    jobs = [JobSpec("a", submit, model, demand, samples), JobSpec("b", 0.0, "MoE", 4, 1000.0)]
    with pytest.raises(SimulationError, match=msg):
        Simulator(cluster, jobs, make_heuristic("fifo", perf), perf, SimConfig(check_invariants=True)).run()


def test_numpy_job_fields_are_accepted() -> None:
    cluster = ClusterSpec.parse("1x4")
    perf = perf_for(cluster)
    jobs = [JobSpec("a", np.float64(0.0), "MoE", np.int64(2), np.float32(1000.0))]
    res = Simulator(cluster, jobs, make_heuristic("fifo", perf), perf).run()
    assert res.jobs[0].done_samples == pytest.approx(1000.0)


def test_empty_trace_and_advance_past_the_last_event() -> None:
    """No event left (an empty trace, or every job done): advance_to_next_event says so, not IndexError."""
    cluster = ClusterSpec.parse("1x4")
    perf = perf_for(cluster)
    sim = Simulator(cluster, [], None, perf)
    assert sim.advance_to_next_event() is False and sim.time == 0.0
    assert sim.advance_to_next_event(until=600.0) is False and sim.time == 600.0
    assert Simulator(cluster, [], make_heuristic("fifo", perf), perf).run().jobs == []
    sim = Simulator(cluster, [job(perf, "a", 0, 1, 1)], make_heuristic("fifo", perf), perf)
    sim.run()
    t = sim.time
    assert sim.advance_to_next_event() is False and sim.time == t


class _Lazy(Policy):
    name = "lazy"

    def schedule(self, state: ClusterState) -> Decision:
        return Decision()


def test_stuck_policy_raises() -> None:
    cluster = ClusterSpec.parse("1x4")
    perf = perf_for(cluster)
    sim = Simulator(cluster, [job(perf, "a", 0, 1, 10)], _Lazy(), perf, SimConfig(max_idle_rounds=5))
    with pytest.raises(SimulationError, match="placed nothing for 5 rounds"):
        sim.run()


def _snapshot(sim: Simulator) -> tuple:
    return (sim.free.tolist(), sorted(sim.running), [j.spec.job_id for j in sim.pending], sim.preemptions, sim.decisions)


@pytest.mark.parametrize(
    "dec, msg",
    [
        # the second placement does not fit: neither the first nor the preemption is applied
        (Decision([("b", Placement.of({0: 4})), ("c", Placement.of({0: 8}))], ["a"]), r"job c: placement .* does not fit"),
        (Decision([("b", Placement.of({1: 4}))], []), r"job b: placement .* does not fit"),  # no node 1
        (Decision([("b", Placement.of({0: 2}))], ["a"]), r"job b: placement .* has 2 GPUs, demand is 4"),
        (Decision([("b", Placement.of({0: 4})), ("b", Placement.of({0: 4}))], ["a"]), r"places job 'b' twice"),
        (Decision([("zz", Placement.of({0: 4}))], ["a"]), r"places job 'zz', which is neither pending nor running"),
        (Decision([("b", Placement.of({0: 4}))], ["a", "a"]), r"preempts job 'a' twice"),
        (Decision([("b", Placement.of({0: 4}))], ["b"]), r"preempts job 'b', which is not running"),
        (Decision([("a", Placement.of({0: 4}))], []), r"job a: already running"),
        (Decision([("late", Placement.of({0: 4}))], ["a"]), r"job late: not pending"),
        (Decision([("b", Placement(((0, 4), (0, 0))))], ["a"]), r"repeats a node or has an empty one"),
    ],
)
def test_apply_is_all_or_nothing(dec, msg) -> None:
    """An invalid entry anywhere in a decision raises before any of it is applied (Decision's contract)."""
    cluster = ClusterSpec.parse("1x8")
    perf = perf_for(cluster)
    jobs = [job(perf, "a", 0, 8, 100.0), job(perf, "b", 0, 4, 100.0), job(perf, "c", 0, 8, 100.0),
            job(perf, "late", 50, 4, 100.0)]
    sim = Simulator(cluster, jobs, None, perf, SimConfig(check_invariants=True))
    sim.reset_state()
    sim.advance_to_next_event()
    sim.apply(Decision([("a", Placement.of({0: 8}))]))
    before = _snapshot(sim)
    with pytest.raises(SimulationError, match=msg):
        sim.apply(dec)
    assert _snapshot(sim) == before
    sim.check_invariants()
    # a valid decision (preempt, then place into the freed GPUs) still applies
    assert sim.apply(Decision([("b", Placement.of({0: 4}))], ["a"])) == 1
    assert sim.free.tolist() == [4] and sorted(j.spec.job_id for j in sim.running.values()) == ["b"]


def test_preempt_and_restart_in_one_decision() -> None:
    """Preempting a job and placing it again in the same decision (a migration) is valid."""
    cluster = ClusterSpec.parse("2x4")
    perf = perf_for(cluster)
    sim = Simulator(cluster, [job(perf, "a", 0, 4, 100.0)], None, perf, SimConfig(check_invariants=True))
    sim.reset_state()
    sim.advance_to_next_event()
    sim.apply(Decision([("a", Placement.of({0: 4}))]))
    assert sim.apply(Decision([("a", Placement.of({1: 4}))], ["a"])) == 1
    assert sim.by_id["a"].info.placement == Placement.of({1: 4}) and sim.preemptions == 1


def test_short_job_is_not_completed_early_by_a_nearby_event() -> None:
    """A job of a few ms whose end falls 30 us after an arrival at t = 50000 s: with a completion window
    of 1e-9 * t = 50 us alone it would complete at the arrival, 0.7 % of its work short (an invariant
    failure on a legal trace). The window is relative to the job's own duration too."""
    cluster = ClusterSpec.parse("4x8")
    perf = perf_for(cluster)
    r = perf.isolated_throughput("GraphSage", 1, 1)
    t_fin = 50000.0 + 1000.0 / r
    jobs = [JobSpec("B", 50000.0, "GraphSage", 1, 1000.0), JobSpec("C", t_fin - 3e-5, "MoE", 1, 1000.0)]
    res = Simulator(cluster, jobs, make_heuristic("fifo", perf), perf, SimConfig(check_invariants=True)).run()
    b = next(x for x in res.jobs if x.job_id == "B")
    assert b.done_samples == 1000.0 and b.finish_time == pytest.approx(t_fin, abs=1e-9)
    assert b.jct == pytest.approx(1000.0 / r, rel=1e-6)


def test_invariant_checker_catches_over_allocation() -> None:
    cluster = ClusterSpec.parse("1x4")
    perf = perf_for(cluster)
    sim = Simulator(cluster, [job(perf, "a", 0, 1, 10)], None, perf)
    sim.free[0] = -1
    with pytest.raises(AssertionError, match="over-allocation"):
        sim.check_invariants()


def test_fragmentation_metric() -> None:
    cluster = ClusterSpec.parse("1x4")
    perf = perf_for(cluster)
    jobs = [job(perf, "a", 0, 2, 100.0), job(perf, "b", 0, 2, 300.0)]
    sim = Simulator(cluster, jobs, None, perf)
    sim.reset_state()
    sim.advance_to_next_event()
    assert sim.fragmentation() == 0.0  # idle node counts 0
    sim.start("a", Placement.of({0: 2}))
    sim.start("b", Placement.of({0: 2}))
    # x = [100, 100, 300, 300]: 1 - 800^2 / (4 * 200000) = 0.2
    assert sim.fragmentation() == pytest.approx(0.2)


def test_running_view_is_lazy_and_fresh() -> None:
    from trainer.simulator import RunningView

    cluster = ClusterSpec.parse("1x4")
    perf = perf_for(cluster)
    jobs = [job(perf, "a", 0.0, 2, 100.0), job(perf, "b", 0.0, 2, 400.0)]
    sim = Simulator(cluster, jobs, None, perf)
    sim.reset_state()
    sim.advance_to_next_event()
    sim.start("a", Placement.of({0: 2}))
    sim.start("b", Placement.of({0: 2}))
    sim.advance_to_round(50.0)
    view = sim.state().running
    assert isinstance(view, RunningView)
    assert len(view) == 2 and bool(view)
    # Nothing refreshed yet: the infos still hold their start values.
    assert sim.by_id["a"].info.done_samples == 0.0
    a, b = view[0], view[1]  # first access refreshes all, at the state's time
    assert a.done_samples == pytest.approx(jobs[0].total_samples / 2)
    assert b.done_samples == pytest.approx(jobs[1].total_samples / 8)
    assert a.attained_service == pytest.approx(100.0)
    assert a.achieved_thp == pytest.approx(a.isolated_thp) and a.cs == pytest.approx(1.0)
    assert [j.job_id for j in view] == ["a", "b"] and list(view) == [a, b] and view == [a, b]
    assert [j.job_id for j in sorted(view, key=lambda j: -j.remaining_time)] == ["b", "a"]
    assert view[-1] is b and view[:1] == [a]
    # An empty view is falsy.
    sim2 = Simulator(cluster, jobs, None, perf)
    sim2.reset_state()
    assert not sim2.state().running


# ---------------------------------------------------------------------- bounds on simulated time
def test_isolated_run_time_is_bounded() -> None:
    """1e10 samples of MoE on 2 GPUs (4.8e8 s alone) simulated for minutes; 1e300 for ten."""
    cluster = ClusterSpec.parse("4x8")
    perf = perf_for(cluster)
    best = perf.best_isolated_throughput("MoE", 2)
    ok = JobSpec("ok", 0.0, "MoE", 2, MAX_ISOLATED_RUN_S * best)
    Simulator(cluster, [ok], make_heuristic("fifo", perf), perf)  # exactly at the bound: accepted
    for samples in (1e10, 1e300):
        with pytest.raises(SimulationError) as ei:
            Simulator(cluster, [ok, JobSpec("a", 0.0, "MoE", 2, samples)], make_heuristic("fifo", perf), perf)
        msg = str(ei.value)
        assert msg.startswith(f"job 'a': total_samples {samples:g} take {samples / best:.4g} s alone on the best ")
        assert msg.endswith("more than the longest isolated run the simulator accepts, 1e+08 s (about 3.2 years)")


def test_submit_time_is_bounded_in_the_simulator_too() -> None:
    """JobSpecs need not come from a trace file (the generator, the RL environment)."""
    cluster = ClusterSpec.parse("1x4")
    perf = perf_for(cluster)
    words = r"^job 'late': submit_time 1000000000000\.0 is beyond the largest submit time 1e\+09 s \(about 31\.7 years\)$"
    with pytest.raises(SimulationError, match=words):
        Simulator(cluster, [job(perf, "late", 1e12, 1, 10)], make_heuristic("fifo", perf), perf)


def test_shipped_traces_fit_the_simulator_bounds() -> None:
    """The bounds leave the repository's traces (DeepShare sets, the whole Philly file) alone."""
    from pathlib import Path

    from trainer.traces import load_trace

    cluster = ClusterSpec.parse("4x8")
    perf = perf_for(cluster)
    data = Path(__file__).resolve().parents[1] / "data"
    for f in [*sorted((data / "traces").rglob("*.json")), data / "philly" / "philly.csv"]:
        Simulator(cluster, load_trace(f, cluster, perf), make_heuristic("fifo", perf), perf)


def _cli_refuses(tmp_path, capsys, trace_text: str, needle: str, *extra: str) -> None:
    import time

    from rlsched.cli import main

    trace = tmp_path / "t.csv"
    trace.write_text(trace_text)
    out = tmp_path / "o"
    t0 = time.perf_counter()
    assert main(["simulate", "--trace", str(trace), "--out", str(out), "--quiet", *extra]) == 2
    assert time.perf_counter() - t0 < 30  # refused up front, not after simulating
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]


@pytest.mark.parametrize("submit", ["1e12", "1e300", "1e10"])
def test_cli_far_submit_time_is_one_line(tmp_path, capsys, submit: str) -> None:
    """1e12 was a 24.8 GiB _ArrayMemoryError traceback in metrics.utilisation_on_grid; 1e300 a ValueError."""
    _cli_refuses(
        tmp_path, capsys, f"job_id,submit_time,model,gpu_demand,total_samples\na,{submit},MoE,2,10\n",
        f"row 2, field 'submit_time': '{submit}' is beyond the largest submit time 1e+09 s",
    )


@pytest.mark.parametrize("samples", ["1e10", "1e300"])
def test_cli_long_isolated_run_is_one_line(tmp_path, capsys, samples: str) -> None:
    """`timeout 60` could not finish 1e10 samples (4.8e8 s of MoE)."""
    _cli_refuses(
        tmp_path, capsys, f"job_id,submit_time,model,gpu_demand,total_samples\na,0,MoE,2,{samples}\n",
        f"rlsched simulate: error: job 'a': total_samples {float(samples):g} take",
        "--policy", "fifo",
    )


# ---------------------------------------------------------------------- the utilisation grid (trainer/metrics.py)
def test_utilisation_grid_is_bounded() -> None:
    """The grid of util_samples is bounded: makespan / round points would be 3.3e9 (24.8 GiB) for a 1e12 s
    makespan."""
    from trainer.metrics import MAX_UTIL_GRID_POINTS, util_grid_step, utilisation_on_grid

    t, u = np.array([0.0, 100.0]), np.array([8, 4])
    assert MAX_UTIL_GRID_POINTS == 100_000
    assert util_grid_step(300.0, 3e7) == 300.0  # 100,000 rounds: unchanged
    assert util_grid_step(300.0, 3e7 + 1) == 600.0  # the smallest whole multiple of the round that fits
    for end in (3e7 + 1, 1e9, 1e12, 1e300):
        step = util_grid_step(300.0, end)
        grid = utilisation_on_grid(t, u, 8, 300.0, end)
        assert grid.size <= MAX_UTIL_GRID_POINTS and grid.size == math.ceil(end / step)
        assert (step / 300.0).is_integer()
        assert grid[0] == 1.0 and grid[-1] == 0.5
    assert utilisation_on_grid(t, u, 8, 50.0, 200.0).tolist() == [1.0, 1.0, 0.5, 0.5]  # small runs: the round itself


def test_summary_reports_the_grid_step_it_used() -> None:
    from trainer.metrics import summarize

    cluster = ClusterSpec.parse("1x4")
    perf = perf_for(cluster)
    res = Simulator(cluster, [job(perf, "a", 0, 4, 3e7)], make_heuristic("fifo", perf), perf).run()
    s = summarize(res, grid_step=100.0)
    assert s["util_grid_step_s"] == 300.0 and len(s["util_samples"]) == 100_000
    assert summarize(res, grid_step=1000.0)["util_grid_step_s"] == 1000.0


# ---------------------------------------------------------------------- sampled metrics == their definitions
def _fragmentation_by_definition(sim: Simulator) -> float:
    """SCED2's fragmentation written out: per node, the running jobs' GPU remaining times, in start order."""
    n = sim.cluster.num_nodes
    s1, s2 = [0.0] * n, [0.0] * n
    for j in sim.running.values():
        total = j.spec.total_samples
        rem = (total - min(j.done + j.rate * max(0.0, sim.time - j.t_ref), total)) / j.rate
        for v, c in j.info.placement.alloc:
            x = c * rem
            s1[v] += x
            s2[v] += x * rem
    a1, a2 = np.array(s1), np.array(s2)
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.where(a2 > 0, 1.0 - a1 * a1 / (sim.capacity * a2), 0.0).mean())


@pytest.mark.parametrize("policy,vector_min_nodes", [("fifo", 1), ("las", 1), ("las", 65)])
def test_sampled_metrics_equal_their_definitions(monkeypatch, policy, vector_min_nodes) -> None:
    """Fragmentation (vectorised over the per-run lists, or the loop for few jobs) and mean CS equal
    the plain loops bit for bit, through preemptions and compactions of the lists (checked with the
    invariants after every event)."""
    from trainer.generate import GeneratorConfig, generate_jobs

    monkeypatch.setattr(Simulator, "COMPACT_AFTER", 8)
    monkeypatch.setattr(Simulator, "VECTOR_MIN_NODES", vector_min_nodes)
    cluster = ClusterSpec.parse("6x8")
    perf = perf_for(cluster)
    jobs = generate_jobs(cluster, GeneratorConfig(num_jobs=120, arrival="poisson", load=1.2, jitter=0.5, seed=3), perf)
    sim = Simulator(cluster, jobs, make_heuristic(policy, perf), perf, SimConfig(check_invariants=True, metrics_interval=0.0))
    seen = {"rounds": 0, "compactions": 0, "entries": 0}
    sample = sim._sample_metrics

    def checked() -> None:
        sample()
        seen["rounds"] += 1
        seen["compactions"] += len(sim._sl_job) < seen["entries"]  # the lists only shrink when compacted
        seen["entries"] = len(sim._sl_job)
        assert sim.samples_frag[-1] == _fragmentation_by_definition(sim)
        want_cs = float(np.mean([j.cs for j in sim.running.values()])) if sim.running else 1.0
        assert sim.samples_cs[-1] == want_cs

    monkeypatch.setattr(sim, "_sample_metrics", checked)
    res = sim.run()
    assert seen["rounds"] == res.rounds > 100 and len(res.samples_frag) == res.rounds
    assert seen["compactions"] > 0 or vector_min_nodes > cluster.num_nodes
    assert res.preemptions > 0 or policy == "fifo"


def test_running_view_keeps_its_jobs_when_the_simulator_moves_on() -> None:
    """A view read after the simulator started and stopped jobs lists the jobs that ran when it was
    built, in start order (the simulator tells unread views of stops); a read view is fixed."""
    cluster = ClusterSpec.parse("2x8")
    perf = perf_for(cluster)
    jobs = [job(perf, n, 0.0, 2, 1000.0) for n in "abcd"]
    sim = Simulator(cluster, jobs, None, perf)
    sim.reset_state()
    sim.advance_to_next_event()
    for n, v in (("a", 0), ("b", 0), ("c", 1)):
        sim.start(n, Placement.of({v: 2}))
    early = sim.state().running  # unread
    read = sim.state().running
    assert [j.job_id for j in read] == ["a", "b", "c"]
    sim.preempt("b")
    sim.start("d", Placement.of({1: 2}))
    sim.start("b", Placement.of({0: 2}))  # restarted: a new start, after the view was built
    assert len(early) == 3 and [j.job_id for j in early] == ["a", "b", "c"]
    assert [j.job_id for j in read] == ["a", "b", "c"]
    assert [j.job_id for j in sim.state().running] == ["a", "c", "d", "b"]
    assert not [ref for ref in sim._views if ref() is not None]  # read views are no longer told of stops


def test_state_free_gpus_is_a_snapshot_without_a_copy_per_round() -> None:
    """The state's free GPUs are a read-only view of the simulator's; the simulator copies its own
    array before changing it only while such a state is still held."""
    cluster = ClusterSpec.parse("2x8")
    perf = perf_for(cluster)
    sim = Simulator(cluster, [job(perf, n, 0.0, 2, 1000.0) for n in "ab"], None, perf)
    sim.reset_state()
    sim.advance_to_next_event()
    held = sim.state()
    with pytest.raises(ValueError):
        held.free_gpus[0] = 0  # read-only
    sim.start("a", Placement.of({0: 2}))
    assert held.free_gpus.tolist() == [8, 8] and sim.free.tolist() == [6, 8]  # copied: `held` still lives
    assert held.total_free == 16 and held.free_bytes()[0] == bytes([8, 8])
    before = sim.free
    sim.state()  # dropped at once
    sim.start("b", Placement.of({1: 2}))
    assert sim.free is before and sim.free.tolist() == [6, 6]  # changed in place: no state holds it
    st_ = sim.state()
    assert st_.total_free == 12 == int(st_.free_gpus.sum()) and st_.free_bytes()[0] == bytes([6, 6])


def test_state_free_gpus_stay_frozen_while_the_simulator_alternates_buffers() -> None:
    """A start or stop while a state holds the free GPUs swaps in the simulator's spare buffer (brought up
    to date from the placements changed since) or, while a state holds that one too, a copy: every state
    keeps the free GPUs of its time."""
    cluster = ClusterSpec.parse("4x8")
    perf = perf_for(cluster)
    sim = Simulator(cluster, [job(perf, n, 0.0, 2, 1000.0) for n in "abcde"], None, perf)
    sim.reset_state()
    sim.advance_to_next_event()
    first = sim.free
    held = sim.state()
    sim.start("a", Placement.of({0: 2}))
    assert held.free_gpus.tolist() == [8, 8, 8, 8] and sim.free.tolist() == [6, 8, 8, 8]
    del held
    held2 = sim.state()
    sim.start("b", Placement.of({1: 2}))  # the first buffer is free again: brought up to date, then changed
    assert sim.free is first and sim.free.tolist() == [6, 6, 8, 8] and held2.free_gpus.tolist() == [6, 8, 8, 8]
    held3 = sim.state()
    sim.start("c", Placement.of({2: 2}))  # both buffers are held: a copy
    sim.preempt("a")
    assert sim.free is not first and sim.free.tolist() == [8, 6, 6, 8]
    assert held2.free_gpus.tolist() == [6, 8, 8, 8] and held3.free_gpus.tolist() == [6, 6, 8, 8]
    del held2, held3
    held4 = sim.state()
    sim.start("d", Placement.of({3: 2}))
    sim.start("e", Placement.of({0: 2}))
    assert sim.free.tolist() == [6, 6, 6, 6] and held4.free_gpus.tolist() == [8, 6, 6, 8]
    sim.check_invariants()


def test_every_reset_resets_the_policy_even_before_any_job_started():
    """A policy object reused for another simulation forgets the last one: the simulator resets it when it
    is built and when it runs, whether or not any job of this simulator has started yet."""
    from policies.cluster import ClusterSpec
    from policies.heuristics import make_heuristic
    from policies.job import JobSpec
    from policies.perf import ContentionModel
    from trainer.simulator import Simulator

    cluster = ClusterSpec.parse("2x8")
    perf = ContentionModel(cluster)
    pol = make_heuristic("fifo", perf)
    calls = []
    pol.reset = lambda: calls.append(1)  # type: ignore[method-assign]
    jobs = [JobSpec("a", 0.0, "MoE", 4, 1000.0)]
    sim = Simulator(cluster, jobs, pol, perf)
    assert len(calls) == 1
    sim.run()
    assert len(calls) == 2
    Simulator(cluster, jobs, pol, perf)
    assert len(calls) == 3


def test_reset_in_the_middle_of_a_run_starts_clean(monkeypatch) -> None:
    """A reset while jobs run (the RL environment's episodes) leaves no stale per-run entries."""
    monkeypatch.setattr(Simulator, "VECTOR_MIN_NODES", 1)
    cluster = ClusterSpec.parse("2x8")
    perf = perf_for(cluster)
    sim = Simulator(cluster, [job(perf, n, 0.0, 8, 1000.0) for n in "ab"], None, perf, SimConfig(check_invariants=True))
    sim.reset_state()
    sim.advance_to_next_event()
    sim.start("a", Placement.of({0: 4, 1: 4}))
    sim.start("b", Placement.of({0: 4, 1: 4}))
    sim.reset_state()
    sim.advance_to_next_event()
    sim.start("b", Placement.of({0: 8}))
    sim.check_invariants()
    sim.preempt("b")
    sim.check_invariants()
    assert sim.fragmentation() == 0.0 and sim.mean_cs() == 1.0


def test_a_large_trace_runs_with_the_existing_objects_frozen_and_unfreezes_them(monkeypatch) -> None:
    """Traces of GC_FREEZE_MIN_JOBS jobs or more run with the objects that existed before the run out of
    the cyclic collector's passes; afterwards nothing stays frozen, and results are the same."""
    import gc

    import trainer.simulator as simulator

    cluster = ClusterSpec.parse("2x8")
    perf = perf_for(cluster)
    jobs = [job(perf, f"j{i}", float(i), 4, 1000.0) for i in range(6)]
    seen = []

    class Spy(Policy):
        name = "spy"

        def schedule(self, state):
            seen.append(gc.get_freeze_count())
            from policies.heuristics import make_heuristic

            return make_heuristic("fifo", perf).schedule(state)

    plain = Simulator(cluster, jobs, Spy(), perf).run()
    assert max(seen) == gc.get_freeze_count() == 0
    seen.clear()
    monkeypatch.setattr(simulator, "GC_FREEZE_MIN_JOBS", 5)
    frozen = Simulator(cluster, jobs, Spy(), perf).run()
    assert min(seen) > 0 and gc.get_freeze_count() == 0
    assert [(r.first_start, r.finish_time) for r in frozen.jobs] == [(r.first_start, r.finish_time) for r in plain.jobs]


def test_elastic_demand_is_shown_and_resizes_pause():
    """A job with a ResourceDemand shows it (JobInfo.demand) and its range; a resize pays
    resize_overhead, a hot one (HOT_RESIZE_OVERHEAD_S) a few hundredths of a second."""
    from policies.resources import ResourceDemand
    from trainer.sim_backend import SimBackend
    from trainer.simulator import HOT_RESIZE_OVERHEAD_S

    cl = ClusterSpec.homogeneous(2, 8)
    d = ResourceDemand(gpus=2, min_gpus=1, max_gpus=8)
    job = JobSpec("e", 0.0, "MoE", 2, 1e6, {}, d)
    for pause in (45.0, HOT_RESIZE_OVERHEAD_S):
        sim = Simulator(cl, [job], None, ContentionModel(cl), SimConfig(resize_overhead=pause))
        sim.advance_to_next_event()
        info = sim.by_id["e"].info
        assert info.demand is d and (info.min_gpus, info.max_gpus) == (1, 8)
        be = SimBackend(sim)
        be.apply(Decision([("e", Placement.of({0: 2}))]))
        sim.advance_to_round(100.0)
        be.apply(Decision(resize=[("e", Placement.of({0: 4}))]))
        assert sim.by_id["e"].t_ref == pytest.approx(100.0 + pause) and info.gpu_demand == 4
