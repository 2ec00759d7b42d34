"""Summary statistics of a trace on a target cluster.

:func:`trace_stats` returns a JSON-ready dict; :func:`render_stats` prints it
as rich tables. Durations are *isolated* run times: ``total_samples`` over the
job's best isolated throughput on the target cluster (no queueing, no
contention), so they are a lower bound on what the simulator will report.

Offered load is the GPU-time submitted per unit time over the cluster's GPUs.
With ``n`` arrivals spread over a span ``T`` the arrival rate is estimated as
``(n - 1) / T`` (``n - 1`` gaps), hence::

    offered_load = (n - 1) / n * sum_j(G_j * D_j) / (T * C)

It is ``None`` when all jobs arrive at the same time (a batch, as DeepShare's
job sets); then ``makespan_lower_bound_h = sum_j(G_j * D_j) / C`` is the
useful number.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from policies.cluster import ClusterSpec
from policies.job import JobSpec
from policies.perf import ContentionModel
from policies.workloads import MODELS, canonical_model

__all__ = ["isolated_durations", "render_stats", "trace_stats"]


def isolated_durations(jobs: Sequence[JobSpec], perf: ContentionModel) -> np.ndarray:
    """Seconds each job runs alone on its best placement; shape ``(len(jobs),)``."""
    cache: dict[tuple[str, int], float] = {}
    out = np.empty(len(jobs))
    for i, j in enumerate(jobs):
        key = (j.model, j.gpu_demand)
        thp = cache.get(key)
        if thp is None:
            thp = cache[key] = perf.best_isolated_throughput(j.model, j.gpu_demand)
        out[i] = j.total_samples / thp
    return out


def trace_stats(jobs: Sequence[JobSpec], cluster: ClusterSpec, perf: ContentionModel | None = None) -> dict[str, Any]:
    """Summary of ``jobs`` on ``cluster``.

    Keys: ``jobs``, ``cluster``, ``cluster_gpus``, ``first_submit_s``,
    ``last_submit_s``, ``time_span_s``, ``arrival_rate_per_h`` (None for a
    batch), ``model_mix`` ({model: count}, every known model of the trace),
    ``model_share`` ({model: fraction}), ``demand_histogram`` ({gpus: count},
    ascending), ``mean_gpu_demand``, ``isolated_duration_s`` (min, median,
    mean, max), ``gpu_hours_isolated`` (sum of G * D / 3600),
    ``offered_load`` (None for a batch), ``makespan_lower_bound_h``
    (GPU-hours / cluster GPUs).
    """
    if not jobs:
        raise ValueError("trace_stats: no jobs")
    perf = perf or ContentionModel(cluster)
    n = len(jobs)
    submit = np.array([j.submit_time for j in jobs], dtype=float)
    gpus = np.array([j.gpu_demand for j in jobs], dtype=float)
    dur = isolated_durations(jobs, perf)
    span = float(submit.max() - submit.min())
    gpu_s = float((gpus * dur).sum())
    models = Counter(canonical_model(j.model) for j in jobs)
    order = [m for m in MODELS if m in models] + sorted(m for m in models if m not in MODELS)
    mix = {m: int(models[m]) for m in order}
    for m in MODELS:
        mix.setdefault(m, 0)
    demand = Counter(j.gpu_demand for j in jobs)
    load = (n - 1) / n * gpu_s / (span * cluster.total_gpus) if span > 0 and n > 1 else None
    return {
        "jobs": n,
        "cluster": cluster.describe(),
        "cluster_gpus": cluster.total_gpus,
        "first_submit_s": float(submit.min()),
        "last_submit_s": float(submit.max()),
        "time_span_s": span,
        "arrival_rate_per_h": (n - 1) / span * 3600.0 if span > 0 and n > 1 else None,
        "model_mix": mix,
        "model_share": {m: c / n for m, c in mix.items()},
        "demand_histogram": {int(g): int(c) for g, c in sorted(demand.items())},
        "mean_gpu_demand": float(gpus.mean()),
        "isolated_duration_s": {
            "min": float(dur.min()),
            "median": float(np.median(dur)),
            "mean": float(dur.mean()),
            "max": float(dur.max()),
        },
        "gpu_hours_isolated": gpu_s / 3600.0,
        "offered_load": load,
        "makespan_lower_bound_h": gpu_s / 3600.0 / cluster.total_gpus,
    }


def _fmt_s(x: float) -> str:
    x = round(x, 3)
    if x >= 86400:
        return f"{x / 86400:.2f} d"
    if x >= 3600:
        return f"{x / 3600:.2f} h"
    if x >= 60:
        return f"{x / 60:.1f} min"
    return f"{x:.1f} s"


def render_stats(stats: dict[str, Any], title: str = "trace", console: Any = None) -> None:
    """Print :func:`trace_stats` output as three rich tables (summary, models, demands)."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    t = Table(title=f"{title} on {stats['cluster']} ({stats['cluster_gpus']} GPUs)", show_header=False)
    t.add_column("what")
    t.add_column("value", justify="right")
    iso = stats["isolated_duration_s"]
    rows = [
        ("jobs", f"{stats['jobs']:,}"),
        ("submit span", _fmt_s(stats["time_span_s"])),
        (
            "arrival rate",
            "batch (all at once)" if stats["arrival_rate_per_h"] is None else f"{stats['arrival_rate_per_h']:.2f} / h",
        ),
        ("mean GPU demand", f"{stats['mean_gpu_demand']:.2f}"),
        (
            "isolated duration min / median / max",
            f"{_fmt_s(iso['min'])} / {_fmt_s(iso['median'])} / {_fmt_s(iso['max'])}",
        ),
        ("GPU-hours (isolated)", f"{stats['gpu_hours_isolated']:,.1f}"),
        ("offered load", "n/a (batch)" if stats["offered_load"] is None else f"{stats['offered_load']:.3f}"),
        ("makespan lower bound", _fmt_s(stats["makespan_lower_bound_h"] * 3600)),
    ]
    for k, v in rows:
        t.add_row(k, v)
    console.print(t)
    mt = Table(title="model mix")
    mt.add_column("model")
    mt.add_column("jobs", justify="right")
    mt.add_column("share", justify="right")
    for m, c in stats["model_mix"].items():
        mt.add_row(m, f"{c:,}", f"{stats['model_share'][m]:.1%}")
    console.print(mt)
    dt = Table(title="GPU demand")
    dt.add_column("GPUs", justify="right")
    dt.add_column("jobs", justify="right")
    dt.add_column("share", justify="right")
    for g, c in stats["demand_histogram"].items():
        dt.add_row(str(g), f"{c:,}", f"{c / stats['jobs']:.1%}")
    console.print(dt)
