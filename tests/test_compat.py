"""``--compat deepshare`` (policies/compat.py): the seed's simulator rules, ds-las / ds-srtf, its metric."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from policies.base import PolicyError
from policies.cluster import ClusterSpec, Placement
from policies.compat import (
    DEEPSHARE_NODE_SETS,
    CompatError,
    DSOrderPolicy,
    adapt_policy,
    compat_mode,
    ds_placement,
)
from policies.job import JobSpec
from policies.perf import ContentionModel
from policies.registry import make_policy, policy_names
from policies.state import ClusterState, JobInfo
from trainer.metrics import summarize
from trainer.simulator import SimConfig, SimulationError, Simulator
from trainer.traces import load_trace

C48 = ClusterSpec.parse("4x8")
MODE = compat_mode("deepshare")
REPO = Path(__file__).resolve().parents[1]
TRACE0 = REPO / "data" / "traces" / "deepshare" / "simulate" / "trace0.json"


@pytest.fixture(scope="module")
def perf() -> ContentionModel:
    return ContentionModel(C48, contention="ds-min")


def job(jid: str, gpus: int, *, total: float = 1000.0, done: float = 0.0, ran_s: float = 0.0,
        placement: Placement | None = None) -> JobInfo:
    return JobInfo(jid, "MoE", gpus, 0.0, total, done_samples=done, attained_service=ran_s * gpus,
                   placement=placement, start_time=0.0 if placement else None)


def state(running: list[JobInfo], pending: list[JobInfo]) -> ClusterState:
    free = np.array(C48.gpus_per_node, dtype=np.int64)
    for j in running:
        for n, c in j.placement.alloc:  # type: ignore[union-attr]
            free[n] -= c
    return ClusterState(600.0, C48, free, running, pending)


def spec(jid: str, gpus: int, samples: float, model: str = "MoE", t: float = 0.0) -> JobSpec:
    return JobSpec(jid, t, model, gpus, samples)


def run(perf, jobs, name: str, check: bool = True):
    pol = adapt_policy(make_policy(name, C48, perf), MODE)
    return Simulator(C48, jobs, pol, perf, SimConfig(compat=MODE, check_invariants=check)).run()


# ---------------------------------------------------------------------- the mode's rules
def test_node_sets_are_the_six_pairs_and_all_four():
    assert len(DEEPSHARE_NODE_SETS) == 7
    assert sorted(s for s in DEEPSHARE_NODE_SETS if len(s) == 2) == [(a, b) for a in range(4) for b in range(a + 1, 4)]
    assert (0, 1, 2, 3) in DEEPSHARE_NODE_SETS


@pytest.mark.parametrize("gpus, free, want", [
    (2, [8, 8, 8, 8], ((0, 1), (1, 1))),  # 2 GPUs: only 2 nodes x 1
    (4, [8, 8, 8, 8], ((0, 1), (1, 1), (2, 1), (3, 1))),  # widest shape first: 4 nodes x 1
    (4, [8, 0, 8, 8], ((0, 2), (2, 2))),  # one node full: 2 nodes x 2, the lowest-index nodes with room
    (8, [8, 8, 8, 1], ((0, 4), (1, 4))),  # 4 x 2 does not fit: 2 x 4
    (8, [3, 3, 3, 3], ((0, 2), (1, 2), (2, 2), (3, 2))),
])
def test_ds_placement_widest_shape_first_on_lowest_nodes(gpus, free, want):
    p = ds_placement(job("a", gpus), np.array(free))
    assert p == Placement(want)


@pytest.mark.parametrize("gpus, free", [(2, [8, 0, 0, 0]), (4, [8, 1, 1, 0]), (8, [8, 3, 0, 0])])
def test_ds_placement_never_uses_one_node(gpus, free):
    # room for the job on node 0 alone, never enough on two or four nodes: no placement
    assert ds_placement(job("a", gpus), np.array(free)) is None


def test_mode_refuses_single_node_uneven_and_three_node_placements():
    assert MODE.allows(4, Placement(((0, 2), (3, 2))))
    for p in (Placement(((0, 4),)), Placement(((0, 3), (1, 1))), Placement(((0, 2), (1, 1), (2, 1)))):
        assert not MODE.allows(4, p)
    assert "1 node(s)" in MODE.placement_problem("j", 4, Placement(((0, 4),)))


# ---------------------------------------------------------------------- ds-las / ds-srtf orders
def test_ds_las_runs_longest_run_first_and_stops_at_the_head():
    # running jobs (start order r1, r2) and waiting jobs (queue order w1, w2, w3)
    r1 = job("r1", 8, ran_s=600, placement=Placement(((0, 2), (1, 2), (2, 2), (3, 2))))
    r2 = job("r2", 8, ran_s=1200, placement=Placement(((0, 4), (1, 4))))
    w1, w2, w3 = job("w1", 8), job("w2", 2), job("w3", 8, ran_s=600)
    dec = DSOrderPolicy("ds-las").schedule(state([r1, r2], [w1, w2, w3]))
    assert dec.preempt == ["r1", "r2"]  # every running job, every round
    # seconds run descending, ties in queue order (waiting jobs first, then running in start order):
    # r2 (1200), w3 (600), r1 (600), w1 (0), w2 (0); 32 GPUs fit r2, w3, r1, w1 exactly, w2 finds no room
    assert [j for j, _ in dec.place] == ["r2", "w3", "r1", "w1"]
    assert all(MODE.allows(8, p) for _, p in dec.place)


def test_ds_las_does_not_backfill_behind_a_blocked_head():
    r = job("r", 8, ran_s=900, placement=Placement(((0, 2), (1, 2), (2, 2), (3, 2))))
    big = [job(f"b{i}", 8, ran_s=300) for i in range(3)]
    small = job("s", 2)
    dec = DSOrderPolicy("ds-las").schedule(state([r], [*big, small]))
    # r + 3 x 8 GPUs fill the cluster; the 2-GPU job behind them waits although the round began with room
    assert [j for j, _ in dec.place] == ["r", "b0", "b1", "b2"]
    dec = DSOrderPolicy("ds-las").schedule(state([], [job("x", 8), job("y", 8), job("z", 8), job("w", 8),
                                                       job("v", 8), small]))
    assert [j for j, _ in dec.place] == ["x", "y", "z", "w"]  # v blocks s


def test_ds_srtf_runs_least_progress_first():
    a = job("a", 2, total=100.0, done=50.0)  # 0.5 done
    b = job("b", 2, total=1000.0, done=100.0)  # 0.1 done
    c = job("c", 2, total=10.0, done=9.0)  # 0.9 done
    d = job("d", 2, total=1000.0, done=100.0)  # 0.1 done, after b in the queue
    dec = DSOrderPolicy("ds-srtf").schedule(state([], [a, b, c, d]))
    assert [j for j, _ in dec.place] == ["b", "d", "a", "c"]


def test_ds_policy_names_and_options():
    assert {"ds-las", "ds-srtf"} <= set(policy_names())
    assert make_policy(" DS-LAS ", C48).name == "ds-las"
    for bad, kw in (("ds-las:spread", {}), ("ds-srtf", {"min_run_s": 10})):
        with pytest.raises(PolicyError, match="takes no variant and no option"):
            make_policy(bad, C48, **kw)


# ---------------------------------------------------------------------- the simulator under the mode
def test_preempted_every_round_at_no_cost(perf):
    # one job alone: re-placed on the same nodes every 300 s, never slowed by a restart
    res = run(perf, [spec("a", 8, 2_000_000.0)], "ds-las")
    r = res.jobs[0]
    iso = perf.isolated_throughput("MoE", 8, 4)
    assert r.run_time == pytest.approx(2_000_000.0 / iso, rel=1e-9)
    assert r.preemptions == math.ceil(r.run_time / 300.0) - 1
    assert r.num_nodes == 4


def test_rounds_every_300_s_and_nothing_in_between(perf):
    # the short job ends mid-round; its GPUs stay free until the next boundary
    jobs = [spec(f"l{i}", 8, 1e7) for i in range(4)] + [spec("s", 8, 2000.0), spec("w", 2, 1000.0)]
    res = run(perf, jobs, "srtf:ds")
    by = {r.job_id: r for r in res.jobs}
    for r in res.jobs:
        assert r.first_start % 300.0 == 0.0
    assert by["s"].finish_time % 300.0 != 0.0


def test_all_jobs_submitted_at_zero(perf):
    jobs = [spec("a", 2, 1000.0, t=5000.0), spec("b", 4, 1000.0, t=100.0)]
    res = run(perf, jobs, "fifo:ds")
    assert [r.submit_time for r in res.jobs] == [0.0, 0.0]
    assert all(r.first_start == 0.0 for r in res.jobs)


def test_single_node_placement_is_refused(perf):
    with pytest.raises(SimulationError, match="--compat deepshare places 2 GPUs only as 2 nodes x 1"):
        run(perf, [spec("a", 2, 1000.0)], "fifo")  # fifo packs onto one node


def test_run_only_metric_beside_ours(perf):
    jobs = [spec(f"j{i}", g, 3e5) for i, g in enumerate((8, 8, 8, 4, 4, 2, 2, 8, 8))]
    res = run(perf, jobs, "ds-srtf")
    s = summarize(res)
    run_s = np.array([r.run_time for r in res.jobs])
    assert s["compat"] == "deepshare"
    assert s["avg_run_jct_s"] == pytest.approx(run_s.mean())
    assert s["avg_run_jct_rounds_s"] == pytest.approx((np.ceil(run_s / 300 - 1e-9) * 300).mean())
    assert s["avg_jct_s"] > s["avg_run_jct_s"]  # 44 GPUs of work on 32: some wait
    plain = summarize(Simulator(C48, jobs, make_policy("fifo", C48), ContentionModel(C48), SimConfig()).run())
    assert "avg_run_jct_s" not in plain and "compat" not in plain


def test_learned_policies_place_only_as_the_mode_allows(perf):
    jobs = load_trace(TRACE0, C48, perf)[:40]
    for name in ("rl-base", "rl-hybrid"):
        res = run(perf, jobs, name)  # the backend refuses any placement the mode forbids
        assert all(r.num_nodes >= 2 for r in res.jobs)


@pytest.mark.slow
def test_trace0_reproduces_deepshares_own_figures(perf):
    # DeepShare's own simulator on this set: LAS 6,082 s, SRTF 5,975 s run-only JCT (whole rounds)
    jobs = load_trace(TRACE0, C48, perf)
    for name, ref in (("ds-las", 6082.0), ("ds-srtf", 5975.0)):
        s = summarize(run(perf, jobs, name, check=False))
        assert abs(s["avg_run_jct_rounds_s"] - ref) / ref < 0.01, (name, s["avg_run_jct_rounds_s"])


# ---------------------------------------------------------------------- bad input
def test_unknown_mode():
    with pytest.raises(CompatError, match="unknown compat mode 'nope'; modes: deepshare"):
        compat_mode("nope")


@pytest.mark.parametrize("cluster", ["8x8", "4x4"])
def test_other_cluster_is_refused(cluster):
    cl = ClusterSpec.parse(cluster)
    with pytest.raises(SimulationError, match=r"needs the seed's cluster, 4 nodes of 8 GPUs"):
        Simulator(cl, [spec("a", 2, 1.0)], make_policy("ds-las", cl), ContentionModel(cl, contention="ds-min"),
                  SimConfig(compat=MODE))


@pytest.mark.parametrize("gpus", [1, 3, 16])
def test_demand_the_seed_cannot_place_is_refused(perf, gpus):
    with pytest.raises(SimulationError, match=f"job 'odd': gpu_demand {gpus} is not one the deepshare mode places"):
        Simulator(C48, [spec("ok", 2, 1.0), spec("odd", gpus, 1.0)], make_policy("ds-las", C48), perf,
                  SimConfig(compat=MODE))


def test_other_contention_rule_is_refused():
    with pytest.raises(SimulationError, match="needs the contention rule 'ds-min'"):
        Simulator(C48, [spec("a", 2, 1.0)], make_policy("ds-las", C48), ContentionModel(C48), SimConfig(compat=MODE))


def test_config_under_the_mode():
    cfg = SimConfig(round_len=60.0, restart_overhead=30.0, event_triggered=True, compat=MODE).effective()
    assert (cfg.round_len, cfg.restart_overhead, cfg.event_triggered) == (300.0, 0.0, False)
    plain = SimConfig()
    assert plain.effective() is plain


@pytest.mark.slow  # writes evaluate's figures
def test_evaluate_under_the_mode(tmp_path):
    from trainer.evaluate import run_evaluation

    sets = tmp_path / "sets" / "normal"
    sets.mkdir(parents=True)
    for k in range(2):
        rows = [f"j{i},0,MoE,{g},{150000 + 1000 * k}" for i, g in enumerate((8, 8, 4, 4, 2, 8, 8, 2))]
        (sets / f"s{k}.csv").write_text("job_id,submit_time,model,gpu_demand,total_samples\n" + "\n".join(rows) + "\n")
    res = run_evaluation(["ds-las", "srtf:ds"], tmp_path / "sets", out=tmp_path / "out", compat="deepshare")
    for pol in ("ds-las", "srtf:ds"):
        for row in res["normal"][pol]["sets"]:
            assert row["finished"] == 8
            assert 0 < row["avg_run_jct_s"] <= row["avg_run_jct_rounds_s"] <= row["avg_jct_s"]
    with pytest.raises(CompatError, match="needs the seed's cluster"):
        run_evaluation(["ds-las"], tmp_path / "sets", cluster="2x8", out=tmp_path / "o2", compat="deepshare")
