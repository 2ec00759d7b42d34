"""benchmarks/bench_rl.py: the latency benchmark runs and reports what it claims (no timing asserted)."""

from __future__ import annotations

import json

from tests.bench_loader import load_benchmark

bench = load_benchmark("bench_rl")


def test_machine_reference_reports_both_parts():
    ref = bench.machine_reference(repeats=1)
    assert ref["python_ms"] > 0 and ref["numpy_ms"] > 0
    assert abs(ref["total_ms"] - ref["python_ms"] - ref["numpy_ms"]) < 1e-9
    assert ref["python"].startswith(("CPython", "PyPy")) and ref["numpy"]


def test_bench_cluster_small_cluster_all_paths():
    r = bench.bench_cluster("2x4", 24, repeats=6, shipped=False)
    assert r["cluster"] == "2x4" and r["states"] > 0
    for path in bench.PATHS:
        res = r[path]
        for key in ("decision", "round_rl_base", "round_rl_hybrid"):
            x = res[key]
            assert x["n"] == r["states"]
            assert 0 < x["p50_ms"] <= x["p99_ms"] <= x["max_ms"]
        assert res["placements_per_round_max"] >= res["placements_per_round_mean"] >= 0
    # only the default path measures the controller's capped rounds
    assert "round_rl_base_capped" in r["fast"] and "round_rl_base_capped" not in r["dense"]


def test_main_writes_json_with_machine_reference(tmp_path, monkeypatch, capsys):
    out = tmp_path / "b.json"
    monkeypatch.setattr(
        bench, "bench_episode", lambda: {"episode_jobs": 256, "wall_s": [0.1], "steps": [256], "max_wall_s": 0.1}
    )
    monkeypatch.setattr("sys.argv", ["bench_rl.py", "--only", "episode", "--json", str(out)])
    bench.main()
    data = json.loads(out.read_text())
    assert set(data) == {"machine_reference", "clock", "episode"} and data["clock"] == "wall"
    assert "machine reference:" in capsys.readouterr().out


def test_clock_cpu_reads_process_time(tmp_path, monkeypatch, capsys):
    """--clock cpu: every figure comes from time.process_time (recorded in the JSON and printed)."""
    import time

    seen = []
    monkeypatch.setattr(bench, "bench_episode", lambda: seen.append(bench._now) or
                        {"episode_jobs": 256, "wall_s": [0.1], "steps": [256], "max_wall_s": 0.1})
    out = tmp_path / "c.json"
    monkeypatch.setattr("sys.argv", ["bench_rl.py", "--only", "episode", "--clock", "cpu", "--json", str(out)])
    monkeypatch.setattr(bench, "_now", bench._now)  # main() sets the module's clock; put it back after the test
    bench.main()
    assert seen == [time.process_time]
    assert json.loads(out.read_text())["clock"] == "cpu" and "clock: cpu" in capsys.readouterr().out
