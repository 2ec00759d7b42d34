"""Trace summary (trainer/trace_stats.py): numbers checked by hand on a small trace."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from policies.cluster import ClusterSpec
from policies.job import JobSpec
from policies.perf import ContentionModel
from trainer.trace_stats import isolated_durations, render_stats, trace_stats

CLUSTER = ClusterSpec.homogeneous(2, 4)


@pytest.fixture(scope="module")
def perf() -> ContentionModel:
    return ContentionModel(CLUSTER)


def _job(perf, jid, t, model, g, seconds):
    return JobSpec(jid, t, model, g, seconds * perf.best_isolated_throughput(model, g))


def test_numbers(perf: ContentionModel) -> None:
    jobs = [
        _job(perf, "a", 0.0, "MoE", 4, 3600),
        _job(perf, "b", 1800.0, "GNN", 1, 1800),
        _job(perf, "c", 3600.0, "MoE", 8, 7200),
    ]
    s = trace_stats(jobs, CLUSTER, perf)
    assert s["jobs"] == 3 and s["cluster"] == "2x4" and s["cluster_gpus"] == 8
    assert s["time_span_s"] == 3600.0
    assert s["arrival_rate_per_h"] == pytest.approx(2.0)  # 2 gaps in 1 h
    assert s["model_mix"] == {"GraphSage": 1, "MobileNetV3": 0, "DLRM": 0, "Transformer-XL": 0, "FSDP": 0, "MoE": 2}
    assert s["model_share"]["MoE"] == pytest.approx(2 / 3)
    assert s["demand_histogram"] == {1: 1, 4: 1, 8: 1}
    assert s["mean_gpu_demand"] == pytest.approx(13 / 3)
    gpu_h = (4 * 3600 + 1 * 1800 + 8 * 7200) / 3600
    assert s["gpu_hours_isolated"] == pytest.approx(gpu_h)
    assert s["isolated_duration_s"] == pytest.approx({"min": 1800, "median": 3600, "mean": 4200, "max": 7200})
    # load = (n-1)/n * GPU-s / (span * C)
    assert s["offered_load"] == pytest.approx(2 / 3 * gpu_h * 3600 / (3600 * 8))
    assert s["makespan_lower_bound_h"] == pytest.approx(gpu_h / 8)
    json.dumps(s)  # JSON-ready


def test_batch_and_render(perf: ContentionModel) -> None:
    jobs = [_job(perf, str(i), 0.0, "DLRM", 2, 3600) for i in range(4)]
    s = trace_stats(jobs, CLUSTER, perf)
    assert s["offered_load"] is None and s["arrival_rate_per_h"] is None
    assert isolated_durations(jobs, perf) == pytest.approx([3600.0] * 4)
    buf = io.StringIO()
    render_stats(s, title="t", console=Console(file=buf, width=120))
    out = buf.getvalue()
    assert "batch" in out and "DLRM" in out and "1.00 h" in out and "100.0%" in out


def test_empty() -> None:
    with pytest.raises(ValueError):
        trace_stats([], CLUSTER)
