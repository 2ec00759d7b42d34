"""Evaluation over trace groups (trainer.evaluate)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from policies.cluster import ClusterSpec
from trainer.evaluate import BEGIN, END, mean_ci, run_evaluation
from trainer.generate import GeneratorConfig, generate_jobs
from trainer.traces import write_trace

C = ClusterSpec.parse("2x4")


def test_mean_ci():
    m, h = mean_ci([1.0, 2.0, 3.0])
    assert m == 2.0 and h == pytest.approx(4.302653 * 1.0 / np.sqrt(3), rel=1e-5)
    assert mean_ci([5.0]) == (5.0, 0.0)


def test_run_evaluation_writes_tables_and_figures(tmp_path):
    for g in ("normal", "heavy"):
        d = tmp_path / "traces" / g
        d.mkdir(parents=True)
        for k in range(2):
            jobs = generate_jobs(C, GeneratorConfig(num_jobs=10, mix=g, seed=k, max_gpus=8, duration_s=900.0))
            write_trace(d / f"set{k}.csv", jobs)
    md = tmp_path / "RESULTS.md"
    md.write_text(f"# Results\n\nhand-written intro\n\n{BEGIN}\nold\n{END}\n\nhand-written outro\n")
    ticks: list[tuple[int, int]] = []
    res = run_evaluation(
        ["srtf", "las", "rl-prior", "p0=rl-prior"], tmp_path / "traces", C, out=tmp_path / "out", results_md=md,
        progress=lambda done, total: ticks.append((done, total)),
    )
    assert list(res) == ["normal", "heavy"]
    assert ticks == [(k, 16) for k in range(1, 17)]  # 4 policies x 2 groups x 2 sets, one tick per run
    doc = json.loads((tmp_path / "out" / "rl_results.json").read_text())
    s = doc["results"]["normal"]["srtf"]["summary"]["avg_jct_s"]
    sets = [r["avg_jct_s"] for r in doc["results"]["normal"]["srtf"]["sets"]]
    assert s["mean"] == pytest.approx(np.mean(sets)) and len(sets) == 2
    text = md.read_text()
    assert "hand-written intro" in text and "hand-written outro" in text and "old" not in text
    assert "| rl-prior |" in text and "| p0 |" in text and "### heavy" in text
    assert res["normal"]["p0"]["summary"] == res["normal"]["rl-prior"]["summary"]
    figs = {p.name for p in (tmp_path / "out" / "figures").iterdir()}
    assert {"rl_jct_cdf_normal.png", "rl_cs_distribution_normal.png", "rl_util_kde_normal.png"} <= figs


def test_missing_traces(tmp_path):
    with pytest.raises(FileNotFoundError):
        run_evaluation(["srtf"], tmp_path / "nope", C, out=tmp_path / "out")
