"""benchmarks/bench_scale.py: a tiny run of the scale benchmark reports what it claims (no timing asserted)."""

from __future__ import annotations

import json

import pytest

from tests.bench_loader import load_benchmark

bench = load_benchmark("bench_scale")


@pytest.mark.parametrize("policy", ["fifo", "greedy"])
def test_tiny_run_finishes_every_job_with_the_invariants_checked(tmp_path, policy, capsys):
    out = tmp_path / "scale.json"
    rc = bench.main(["--jobs", "200", "--cluster", "16x8", "--policy", policy, "--check-invariants",
                     "--no-pin", "--json", str(out), "--check"])
    assert rc == 0
    doc = json.loads(out.read_text())
    (row,) = doc["rows"]
    assert row["policy"] == policy and row["jobs"] == 200 and row["cluster"] == "16x8"
    assert row["rounds"] > 0 and row["mean_jct_h"] >= 1.0 - 1e-9  # each job runs one hour alone at best
    assert row["jobs_per_s"] == pytest.approx(200 / row["run_cpu_s"])
    assert row["total_cpu_s"] == pytest.approx(row["build_cpu_s"] + row["run_cpu_s"])
    assert row["peak_rss_mib"] > 0 and row["target_s"] is None and row["ok"] is None  # targets apply at 1M on 8192x8
    assert doc["machine"]["cpus"] >= 1
    assert policy in capsys.readouterr().out


def _row(build_cpu_s: float, run_cpu_s: float) -> "bench.Row":
    return bench.Row(policy="fifo", jobs=bench.TARGET_JOBS, cluster=bench.TARGET_CLUSTER, load=0.85, generate_s=1.0,
                     build_s=10.0, build_cpu_s=build_cpu_s, run_s=90.0, run_cpu_s=run_cpu_s, jobs_per_s=1.0,
                     peak_rss_mib=1.0, rounds=1, preemptions=0, mean_jct_h=1.0, makespan_h=1.0,
                     target_s=bench.TARGETS_S["fifo"])


def test_targets_apply_at_the_issue_scale_to_cpu_seconds():
    # judged on build + run CPU seconds of the pinned process; wall time (100 s here) is the machine's load
    assert _row(5.0, 54.0).total_s == 100.0 and _row(5.0, 54.0).ok is True
    assert _row(7.0, 54.0).total_cpu_s == 61.0 and _row(7.0, 54.0).ok is False


def test_bad_arguments_name_the_option(capsys):
    with pytest.raises(SystemExit) as ei:
        bench.main(["--jobs", "0"])
    assert ei.value.code == 2 and "--jobs must be >= 1" in capsys.readouterr().err
