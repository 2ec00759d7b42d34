"""Summary metrics of one simulation, and per-job records as Arrow / Parquet.

Everything here is a pure function of a :class:`trainer.simulator.SimResult`.

Units: times in **seconds** (keys end in ``_s``), utilisation as a
**fraction** of all GPUs in ``[0, 1]``, contention sensitivity (CS) as a
ratio ``isolated / achieved throughput >= 1``.

Definitions (the keys of :func:`summarize`):

* ``jct`` = finish - submit, so it includes queueing (and restart overheads);
  ``avg/median/p90/p99_jct_s`` over finished jobs. Percentiles use linear
  interpolation between order statistics (``numpy.percentile`` default):
  for sorted values ``x_0..x_{n-1}`` the q-th percentile is read at rank
  ``q/100 * (n-1)``.
* ``avg_queueing_s``: mean of ``jct - run_time`` (time not holding GPUs).
* ``makespan_s``: last finish time (the trace starts at 0).
* ``avg_util``: time-weighted mean of the allocated-GPU step function
  ``util_t / util_used`` over ``[0, makespan]`` divided by the cluster's GPUs.
* ``util_samples``: that step function read at ``0, step, 2*step, ... <
  makespan`` (``step`` = the scheduling round), the input of the seed's
  Fig. 7 KDE. At most :data:`MAX_UTIL_GRID_POINTS` samples: a longer
  makespan widens ``step`` to the smallest whole multiple of the round that
  fits (``util_grid_step_s`` holds the step used), so a far-off finish time
  cannot make the grid take gigabytes.
* ``avg_cs``: mean over jobs of each job's run-time-weighted average CS
  (``JobRecord.avg_cs``); ``cs_buckets``: share of jobs per CS bucket
  (:data:`CS_BUCKET_EDGES`, the seed's Fig. 6).
* ``mean_frag``: mean of the simulator's fragmentation samples (SCED2's
  per-node metric averaged over nodes, sampled at rounds).
* Only for a run in a compat mode (``result.meta["compat"]``, :mod:`policies.compat`): ``compat``
  (the mode's name), ``avg_run_jct_s`` (mean run time: JCT without queueing, the seed's metric) and
  ``avg_run_jct_rounds_s`` (the same with each job's run time rounded up to whole rounds, as
  DeepShare's code counts it: ``300 s x`` the rounds the job ran in).
"""

from __future__ import annotations

import math
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from trainer.simulator import JobRecord, SimResult

__all__ = [
    "CS_BUCKET_EDGES",
    "cs_bucket_labels",
    "cs_buckets",
    "percentile",
    "time_weighted_utilisation",
    "utilisation_on_grid",
    "util_grid_step",
    "MAX_UTIL_GRID_POINTS",
    "summarize",
    "SCALAR_KEYS",
    "jobs_table",
    "write_jobs_parquet",
]

#: Upper edges of the CS buckets (a job with avg CS ``c`` goes to the first
#: bucket with ``c <= edge``); the first bucket is "no contention" (CS = 1,
#: within 1e-9), the last is open-ended.
CS_BUCKET_EDGES: tuple[float, ...] = (1.0, 1.1, 1.25, 1.5, 2.0, math.inf)

#: Scalar keys of :func:`summarize`, in table order.
SCALAR_KEYS: tuple[str, ...] = (
    "jobs",
    "finished",
    "avg_jct_s",
    "median_jct_s",
    "p90_jct_s",
    "p99_jct_s",
    "max_jct_s",
    "avg_queueing_s",
    "makespan_s",
    "avg_util",
    "avg_cs",
    "max_cs",
    "mean_frag",
    "avg_slowdown",
    "preemptions",
    "rounds",
    "decisions",
    "wall_time_s",
)

_CS_TOL = 1e-9

#: Most points of the utilisation grid (:func:`utilisation_on_grid`, ``util_samples``): 100,000 rounds of
#: 300 s cover 347 days of makespan; beyond that the step widens. 0.8 MB as float64, ~2 MB in summary.json.
MAX_UTIL_GRID_POINTS = 100_000


def cs_bucket_labels(edges: Sequence[float] = CS_BUCKET_EDGES) -> list[str]:
    """Human labels of the CS buckets, e.g. ``["1.00", "(1.00, 1.10]", ..., "> 2.00"]``."""
    labels = [f"{edges[0]:.2f}"]
    for lo, hi in zip(edges[:-1], edges[1:]):
        labels.append(f"> {lo:.2f}" if math.isinf(hi) else f"({lo:.2f}, {hi:.2f}]")
    return labels


def cs_buckets(avg_cs: Sequence[float] | np.ndarray, edges: Sequence[float] = CS_BUCKET_EDGES) -> list[float]:
    """Fraction of jobs whose average CS falls in each bucket (sums to 1; all 0 if no jobs).

    :param avg_cs: per-job average CS, shape ``[jobs]``.
    """
    x = np.asarray(avg_cs, dtype=float)
    if x.size == 0:
        return [0.0] * len(edges)
    counts = np.zeros(len(edges))
    for c in x:
        for k, e in enumerate(edges):
            if c <= e + _CS_TOL:
                counts[k] += 1
                break
    return (counts / x.size).tolist()


def percentile(values: Sequence[float] | np.ndarray, q: float) -> float:
    """q-th percentile (0..100) with linear interpolation; NaN for no values."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return math.nan
    return float(np.percentile(x, q))


def _check_step(util_t: np.ndarray, util_used: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    t = np.asarray(util_t, dtype=float)
    u = np.asarray(util_used, dtype=float)
    if t.shape != u.shape or t.ndim != 1:
        raise ValueError(f"util_t and util_used must be 1-D of equal length, got {t.shape} and {u.shape}")
    if t.size and np.any(np.diff(t) < 0):
        raise ValueError("util_t must be non-decreasing")
    return t, u


def time_weighted_utilisation(util_t: np.ndarray, util_used: np.ndarray, total_gpus: int, end: float) -> float:
    """Mean allocated fraction of ``total_gpus`` over ``[0, end]``.

    :param util_t: times (s) where the allocation changes, shape ``[k]``,
        non-decreasing; the value before ``util_t[0]`` is 0.
    :param util_used: GPUs allocated from ``util_t[i]`` until ``util_t[i+1]``
        (the last value holds until ``end``), shape ``[k]``.
    :returns: a fraction in ``[0, 1]``; NaN when ``end <= 0``.
    """
    t, u = _check_step(util_t, util_used)
    if end <= 0 or total_gpus <= 0:
        return math.nan
    if t.size == 0:
        return 0.0
    start = np.clip(t, 0.0, end)
    stop = np.clip(np.append(t[1:], end), 0.0, end)
    area = float(np.sum(u * np.maximum(stop - start, 0.0)))
    return area / (total_gpus * end)


def util_grid_step(step: float, end: float, max_points: int = MAX_UTIL_GRID_POINTS) -> float:
    """The step (s) :func:`utilisation_on_grid` uses over ``[0, end)``: ``step`` itself, or the smallest
    whole multiple of it that keeps the grid to at most ``max_points`` points.

    :param step: the requested step (s, > 0), e.g. the scheduling round.
    :param end: the end of the grid (s), e.g. the makespan.
    """
    if not step > 0:
        raise ValueError(f"step must be positive, got {step!r}")
    if not end > 0 or not math.isfinite(end) or end <= step * max_points:
        return float(step)
    return float(step) * math.ceil(end / (step * max_points))


def utilisation_on_grid(
    util_t: np.ndarray, util_used: np.ndarray, total_gpus: int, step: float, end: float
) -> np.ndarray:
    """The allocated fraction read at ``0, s, 2*s, ...`` strictly before ``end`` (``s`` in seconds).

    ``s`` is ``step``, widened by :func:`util_grid_step` when the grid would hold more than
    :data:`MAX_UTIL_GRID_POINTS` points. A change at exactly a grid time counts (the step
    function is right-continuous). Returns shape ``[ceil(end / s)]`` (empty if ``end <= 0``).
    """
    if step <= 0:
        raise ValueError("step must be positive")
    t, u = _check_step(util_t, util_used)
    if end <= 0 or total_gpus <= 0:
        return np.zeros(0)
    grid = np.arange(0.0, end, util_grid_step(step, end))[:MAX_UTIL_GRID_POINTS]
    if t.size == 0:
        return np.zeros(grid.size)
    idx = np.searchsorted(t, grid, side="right") - 1
    vals = np.where(idx >= 0, u[np.clip(idx, 0, None)], 0.0)
    return vals / total_gpus


def _finite(xs: list[float]) -> np.ndarray:
    a = np.asarray(xs, dtype=float)
    return a[np.isfinite(a)]


def _mean(a: np.ndarray) -> float:
    return float(a.mean()) if a.size else math.nan


def summarize(result: SimResult, grid_step: float = 300.0) -> dict[str, Any]:
    """Summary metrics of one run (see the module docstring for definitions).

    :param result: a finished (or partial) simulation; unfinished jobs
        (NaN finish time) are counted in ``jobs`` but not in JCT statistics.
    :param grid_step: seconds between utilisation samples (use the round length); widened to a
        multiple of it when the makespan would need more than :data:`MAX_UTIL_GRID_POINTS` samples.
    :returns: a JSON-friendly dict: the :data:`SCALAR_KEYS` plus ``policy``,
        ``total_gpus``, ``util_grid_step_s`` (the step used), ``util_samples`` (list of
        fractions), ``cs_bucket_labels`` and ``cs_buckets`` (fractions of jobs).
    """
    recs = result.jobs
    done = [r for r in recs if math.isfinite(r.finish_time)]
    jct = _finite([r.jct for r in done])
    queue = _finite([r.queueing for r in done])
    slow = _finite([r.jct / r.ideal_time for r in done if r.ideal_time > 0])
    cs = _finite([r.avg_cs for r in done])
    total = result.cluster.total_gpus
    makespan = float(result.makespan)
    frag = np.asarray(result.samples_frag, dtype=float)
    out: dict[str, Any] = {
        "policy": result.policy,
        "jobs": len(recs),
        "finished": len(done),
        "avg_jct_s": _mean(jct),
        "median_jct_s": percentile(jct, 50),
        "p90_jct_s": percentile(jct, 90),
        "p99_jct_s": percentile(jct, 99),
        "max_jct_s": float(jct.max()) if jct.size else math.nan,
        "avg_queueing_s": _mean(queue),
        "makespan_s": makespan,
        "avg_util": time_weighted_utilisation(result.util_t, result.util_used, total, makespan),
        "avg_cs": _mean(cs),
        "max_cs": float(cs.max()) if cs.size else math.nan,
        "mean_frag": _mean(frag[np.isfinite(frag)]),
        "avg_slowdown": _mean(slow),
        "preemptions": int(result.preemptions),
        "rounds": int(result.rounds),
        "decisions": int(result.decisions),
        "wall_time_s": float(result.wall_time),
        "total_gpus": total,
        "util_grid_step_s": util_grid_step(grid_step, makespan),
        "util_samples": utilisation_on_grid(result.util_t, result.util_used, total, grid_step, makespan).tolist(),
        "cs_bucket_labels": cs_bucket_labels(),
        "cs_buckets": cs_buckets(cs),
    }
    compat = result.meta.get("compat") if result.meta else None
    if compat:
        # the peer's metric beside ours: JCT without queueing, exact and billed in whole rounds
        rl = float(result.meta.get("round_len", 300.0))
        run = _finite([r.run_time for r in done])
        out["compat"] = compat
        out["avg_run_jct_s"] = _mean(run)
        out["avg_run_jct_rounds_s"] = _mean(np.ceil(run / rl - 1e-9) * rl) if run.size else math.nan
    return out


# ---------------------------------------------------------------------- per-job records
_JOB_FIELDS = [f.name for f in fields(JobRecord)]


def jobs_table(result: SimResult) -> "pyarrow.Table":  # noqa: F821 - lazy import
    """Per-job records as a pyarrow Table: one row per job, the :class:`JobRecord`
    fields (times in seconds) plus ``policy`` and ``slowdown`` (= jct / ideal_time).
    """
    import pyarrow as pa

    cols: dict[str, list] = {name: [] for name in _JOB_FIELDS}
    for r in result.jobs:
        for k, v in asdict(r).items():
            cols[k].append(v)
    types = {
        "job_id": pa.string(),
        "model": pa.string(),
        "gpu_demand": pa.int64(),
        "preemptions": pa.int64(),
        "num_nodes": pa.int64(),
    }
    arrays = {k: pa.array(v, type=types.get(k, pa.float64())) for k, v in cols.items()}
    jct = np.asarray(cols["jct"], dtype=float)
    ideal = np.asarray(cols["ideal_time"], dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        slowdown = np.where(ideal > 0, jct / ideal, np.nan)
    arrays["slowdown"] = pa.array(slowdown, type=pa.float64())
    arrays = {"policy": pa.array([result.policy] * len(result.jobs), type=pa.string()), **arrays}
    return pa.table(arrays)


def write_jobs_parquet(result: SimResult, path: str | Path) -> Path:
    """Write :func:`jobs_table` to ``path`` (Parquet) and return the path."""
    import pyarrow.parquet as pq

    path = Path(path)
    pq.write_table(jobs_table(result), path)
    return path
