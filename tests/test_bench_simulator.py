"""benchmarks/bench_simulator.py: a small run reports what it claims (no timing asserted)."""

from __future__ import annotations

import json

import pytest

from tests.bench_loader import REPO, load_benchmark

bench = load_benchmark("bench_simulator")


def test_small_run_writes_cpu_times_and_results(tmp_path, capsys):
    out = tmp_path / "sim.json"
    assert bench.main(["--policy", "fifo,srtf", "--skip-philly", "--repeat", "2", "--json", str(out), "--check"]) == 0
    doc = json.loads(out.read_text())
    rows = {(r["jobset"], r["policy"]): r for r in doc["rows"]}
    assert set(rows) == {(s, p) for s in ("deepshare trace0", "generated 256, <=32 GPUs") for p in ("fifo", "srtf")}
    for r in rows.values():
        assert len(r["cpu_s"]) == len(r["wall_s"]) == 2 and r["cpu"]["min"] <= r["cpu"]["median"] <= r["cpu"]["max"]
        assert r["jobs"] == 256 and r["rounds"] > 0 and r["ok"] and "jcts" not in r
    # every job of DeepShare's set arrives at t = 0: shortest first waits less on average than arrival order
    assert rows[("deepshare trace0", "srtf")]["mean_jct_h"] < rows[("deepshare trace0", "fifo")]["mean_jct_h"]
    assert doc["machine"]["cpus"] >= 1 and "fifo" in capsys.readouterr().out


@pytest.mark.slow
def test_baseline_comparison_of_a_checkout_with_itself(tmp_path):
    out = tmp_path / "cmp.json"
    assert bench.main(["--baseline", str(REPO), "--rounds", "1", "--policy", "fifo", "--skip-philly", "--repeat", "1",
                       "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [c["policy"] for c in doc["cases"]] == ["fifo", "fifo"]
    assert all(c["jct_rel_diff"] == 0.0 and c["ratio"] > 0 for c in doc["cases"])


def test_bad_arguments_name_the_option(tmp_path, capsys):
    with pytest.raises(SystemExit) as ei:
        bench.main(["--repeat", "0"])
    assert ei.value.code == 2 and "--repeat, --philly-repeat and --rounds must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="not an rlsched checkout"):
        bench.main(["--code", str(tmp_path), "--skip-philly"])


def test_jobset_picks_the_sets(tmp_path, capsys):
    out = tmp_path / "sim.json"
    assert bench.main(["--policy", "greedy", "--jobset", "generated", "--skip-philly", "--repeat", "1",
                       "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["jobset"], r["policy"]) for r in rows] == [("generated 256, <=32 GPUs", "greedy")]
    with pytest.raises(SystemExit) as ei:
        bench.main(["--jobset", "generated,philly", "--skip-philly"])
    assert ei.value.code == 2 and "--jobset 'generated,philly': choose from deepshare, generated" in capsys.readouterr().err
