"""Golden values of trainer.metrics on hand-made results and tiny traces."""

from __future__ import annotations

import math

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.cluster import ClusterSpec
from policies.heuristics import make_heuristic
from policies.job import JobSpec
from policies.perf import ContentionModel
from trainer import metrics
from trainer.simulator import JobRecord, SimConfig, SimResult, Simulator
from trainer.traces import load_trace, write_trace


def _rec(job_id, submit, start, finish, run, ideal, cs, preempt=0) -> JobRecord:
    return JobRecord(
        job_id=job_id, model="MoE", gpu_demand=2, submit_time=submit, first_start=start, finish_time=finish,
        jct=finish - submit, queueing=finish - submit - run, run_time=run, ideal_time=ideal, avg_cs=cs,
        preemptions=preempt, num_nodes=1, total_samples=100.0, done_samples=100.0 if math.isfinite(finish) else 10.0,
    )


def _hand_result(extra_jobs=()) -> SimResult:
    jobs = [
        _rec("a", 0, 0, 100, 100, 100, 1.0),
        _rec("b", 0, 0, 300, 300, 150, 1.5),
        _rec("c", 50, 100, 400, 300, 300, 1.2),
        _rec("d", 100, 300, 500, 200, 200, 2.5, preempt=2),
        *extra_jobs,
    ]
    return SimResult(
        policy="hand",
        cluster=ClusterSpec.homogeneous(1, 4),
        jobs=jobs,
        makespan=500.0,
        util_t=np.array([0.0, 100.0, 300.0, 400.0, 500.0]),
        util_used=np.array([3, 4, 2, 1, 0]),
        samples_t=np.array([0.0, 100.0, 200.0]),
        samples_frag=np.array([0.1, 0.3, 0.2]),
        samples_cs=np.array([1.0, 1.2, 1.1]),
        rounds=7,
        decisions=5,
        preemptions=2,
        wall_time=0.25,
    )


def test_summary_golden_hand_made():
    s = metrics.summarize(_hand_result(), grid_step=100.0)
    # JCTs 100, 300, 350, 400.
    assert s["jobs"] == 4 and s["finished"] == 4
    assert s["avg_jct_s"] == pytest.approx(287.5)
    assert s["median_jct_s"] == pytest.approx(325.0)
    assert s["p90_jct_s"] == pytest.approx(385.0)  # rank 0.9*3 = 2.7: 350 + 0.7*50
    assert s["p99_jct_s"] == pytest.approx(398.5)  # rank 2.97: 350 + 0.97*50
    assert s["max_jct_s"] == pytest.approx(400.0)
    assert s["avg_queueing_s"] == pytest.approx((0 + 0 + 50 + 200) / 4)
    assert s["makespan_s"] == 500.0
    # GPU-seconds 3*100 + 4*200 + 2*100 + 1*100 = 1400 over 4 GPUs * 500 s.
    assert s["avg_util"] == pytest.approx(0.7)
    assert s["util_samples"] == pytest.approx([0.75, 1.0, 1.0, 0.5, 0.25])
    assert s["avg_cs"] == pytest.approx((1.0 + 1.5 + 1.2 + 2.5) / 4)
    assert s["max_cs"] == pytest.approx(2.5)
    assert s["cs_buckets"] == pytest.approx([0.25, 0.0, 0.25, 0.25, 0.0, 0.25])
    assert len(s["cs_bucket_labels"]) == len(s["cs_buckets"])
    assert s["mean_frag"] == pytest.approx(0.2)
    assert s["avg_slowdown"] == pytest.approx((1 + 2 + 350 / 300 + 2) / 4)
    assert (s["preemptions"], s["rounds"], s["decisions"]) == (2, 7, 5)
    assert s["wall_time_s"] == 0.25
    assert s["total_gpus"] == 4
    assert set(metrics.SCALAR_KEYS) <= set(s)


def test_unfinished_jobs_are_counted_but_not_in_jct():
    r = _hand_result([_rec("e", 0, 10, math.nan, 50, 100, 3.0)])
    s = metrics.summarize(r, grid_step=100.0)
    assert s["jobs"] == 5 and s["finished"] == 4
    assert s["avg_jct_s"] == pytest.approx(287.5)
    assert s["avg_cs"] == pytest.approx(1.55)


def test_empty_result_gives_nan_not_errors():
    r = SimResult("none", ClusterSpec.homogeneous(1, 4), [], 0.0, np.array([0.0]), np.array([0]),
                  np.zeros(0), np.zeros(0), np.zeros(0), 0, 0, 0)
    s = metrics.summarize(r)
    assert s["jobs"] == 0
    assert math.isnan(s["avg_jct_s"]) and math.isnan(s["avg_util"]) and math.isnan(s["mean_frag"])
    assert s["util_samples"] == [] and s["cs_buckets"] == [0.0] * len(metrics.CS_BUCKET_EDGES)


def test_utilisation_helpers_edges():
    t, u = np.array([0.0, 100.0]), np.array([4, 2])
    # The last value holds until `end`; changes after `end` are ignored.
    assert metrics.time_weighted_utilisation(t, u, 4, 200.0) == pytest.approx(0.75)
    assert metrics.time_weighted_utilisation(np.array([0.0, 300.0]), u, 4, 200.0) == pytest.approx(1.0)
    assert math.isnan(metrics.time_weighted_utilisation(t, u, 4, 0.0))
    # Grid points at exactly a change read the new value; grid excludes `end`.
    assert metrics.utilisation_on_grid(t, u, 4, 50.0, 200.0).tolist() == [1.0, 1.0, 0.5, 0.5]
    # Before the first change the cluster is empty.
    assert metrics.utilisation_on_grid(np.array([60.0]), np.array([4]), 4, 50.0, 120.0).tolist() == [0.0, 0.0, 1.0]
    with pytest.raises(ValueError):
        metrics.utilisation_on_grid(t, u, 4, 0.0, 200.0)
    with pytest.raises(ValueError):
        metrics.time_weighted_utilisation(np.array([100.0, 0.0]), u, 4, 200.0)


def test_cs_buckets_edges():
    # 1.0 (and float noise above it) is "no contention"; edges are inclusive above.
    got = metrics.cs_buckets([1.0, 1.0 + 1e-12, 1.1, 1.2500001, 2.0, 7.0])
    assert got == pytest.approx([2 / 6, 1 / 6, 0.0, 1 / 6, 1 / 6, 1 / 6])
    assert metrics.cs_bucket_labels()[0] == "1.00" and metrics.cs_bucket_labels()[-1] == "> 2.00"


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 8), min_size=1, max_size=20),
    st.integers(1, 5),
)
def test_grid_mean_equals_time_weighted_on_aligned_steps(used, k):
    """When every change falls on the grid, the grid mean is the time-weighted mean."""
    step = 300.0
    t = np.arange(len(used)) * step * k
    end = len(used) * step * k
    grid = metrics.utilisation_on_grid(t, np.array(used), 8, step, end)
    tw = metrics.time_weighted_utilisation(t, np.array(used), 8, end)
    assert grid.size == len(used) * k
    assert 0.0 <= tw <= 1.0
    assert grid.mean() == pytest.approx(tw)


# ---------------------------------------------------------------------- tiny traces
def test_golden_fifo_single_node_trace(tmp_path):
    """1x4 cluster, FIFO (strict), no contention (single node):

    a: 2 GPUs, 1 h of work, t=0   -> runs [0, 1h)
    b: 2 GPUs, 2 h of work, t=0   -> runs [0, 2h)
    c: 4 GPUs, 1 h of work, t=600 -> waits for a and b, runs [2h, 3h)
    """
    cluster = ClusterSpec.homogeneous(1, 4)
    perf = ContentionModel(cluster)
    H = 3600.0
    jobs = [
        JobSpec("a", 0.0, "Transformer-XL", 2, perf.isolated_throughput("Transformer-XL", 2, 1) * H),
        JobSpec("b", 0.0, "FSDP", 2, perf.isolated_throughput("FSDP", 2, 1) * 2 * H),
        JobSpec("c", 600.0, "MoE", 4, perf.isolated_throughput("MoE", 4, 1) * H),
    ]
    path = tmp_path / "tiny.csv"
    write_trace(path, jobs)
    loaded = load_trace(path, cluster)
    res = Simulator(cluster, loaded, make_heuristic("fifo", perf), perf, SimConfig(round_len=300)).run()
    s = metrics.summarize(res, grid_step=300.0)
    jct = {r.job_id: r.jct for r in res.jobs}
    assert jct == pytest.approx({"a": H, "b": 2 * H, "c": 3 * H - 600})
    assert s["avg_jct_s"] == pytest.approx((H + 2 * H + 3 * H - 600) / 3)
    assert s["median_jct_s"] == pytest.approx(2 * H)
    assert s["p90_jct_s"] == pytest.approx(2 * H + 0.8 * (H - 600))
    assert s["p99_jct_s"] == pytest.approx(2 * H + 0.98 * (H - 600))
    assert s["avg_queueing_s"] == pytest.approx((2 * H - 600) / 3)
    assert s["makespan_s"] == pytest.approx(3 * H)
    assert s["avg_util"] == pytest.approx((4 + 2 + 4) / 12)
    assert s["util_samples"] == pytest.approx([1.0] * 12 + [0.5] * 12 + [1.0] * 12)
    assert s["avg_cs"] == pytest.approx(1.0) and s["cs_buckets"][0] == pytest.approx(1.0)
    assert s["preemptions"] == 0
    assert s["avg_slowdown"] == pytest.approx((1 + 1 + (3 * H - 600) / H) / 3)


def test_golden_contention_two_multi_node_jobs():
    """2x4 cluster, FIFO with spread placement: MoE and FSDP, 4 GPUs each, both
    placed 2+2 over the two nodes, so they share both network links.

    Each has 1 h of isolated work on its (4 GPUs, 2 nodes) shape. While both
    run, job j's speed is isolated / CS_j with CS_j = pair_cs(j, other). The
    less sensitive one (CS lo) ends at 3600*lo; the other has then done lo/hi
    of its work and finishes the rest alone (CS 1) in 3600*(1 - lo/hi).
    """
    cluster = ClusterSpec.homogeneous(2, 4)
    perf = ContentionModel(cluster)
    H = 3600.0
    ka, kb = ("MoE", 4, 2), ("FSDP", 4, 2)
    jobs = [
        JobSpec("moe", 0.0, "MoE", 4, perf.isolated_throughput(*ka) * H),
        JobSpec("fsdp", 0.0, "FSDP", 4, perf.isolated_throughput(*kb) * H),
    ]
    cs = {"moe": perf.pair_cs(ka, kb), "fsdp": perf.pair_cs(kb, ka)}
    assert min(cs.values()) > 1.0  # measured contention, so the test is not trivial
    lo_id, hi_id = sorted(cs, key=cs.get)
    lo, hi = cs[lo_id], cs[hi_id]
    t1 = H * lo
    rest = H * (1 - lo / hi)
    res = Simulator(cluster, jobs, make_heuristic("fifo:spread", perf), perf, SimConfig()).run()
    recs = {r.job_id: r for r in res.jobs}
    assert recs[lo_id].num_nodes == 2 and recs[hi_id].num_nodes == 2
    assert recs[lo_id].jct == pytest.approx(t1)
    assert recs[hi_id].jct == pytest.approx(t1 + rest)
    s = metrics.summarize(res)
    hi_avg = (t1 * hi + rest * 1.0) / (t1 + rest)
    assert s["avg_cs"] == pytest.approx((lo + hi_avg) / 2)
    assert s["max_cs"] == pytest.approx(max(lo, hi_avg))
    assert s["makespan_s"] == pytest.approx(t1 + rest)
    assert s["avg_util"] == pytest.approx((8 * t1 + 4 * rest) / (8 * (t1 + rest)))
    assert s["avg_jct_s"] == pytest.approx((2 * t1 + rest) / 2)


def test_jobs_table_and_parquet_roundtrip(tmp_path):
    r = _hand_result([_rec("e", 0, 10, math.nan, 50, 100, 3.0)])
    table = metrics.jobs_table(r)
    assert table.num_rows == 5
    assert table.column_names[0] == "policy"
    for col in ("job_id", "model", "gpu_demand", "submit_time", "first_start", "finish_time", "jct",
                "queueing", "run_time", "ideal_time", "avg_cs", "preemptions", "num_nodes", "slowdown"):
        assert col in table.column_names
    path = metrics.write_jobs_parquet(r, tmp_path / "jobs.parquet")
    back = pq.read_table(path).to_pydict()
    assert back["job_id"] == ["a", "b", "c", "d", "e"]
    assert back["jct"][:4] == [100.0, 300.0, 350.0, 400.0]
    assert math.isnan(back["jct"][4])
    assert back["slowdown"][1] == pytest.approx(2.0)
    assert back["preemptions"] == [0, 0, 0, 2, 0]
    assert set(back["policy"]) == {"hand"}
