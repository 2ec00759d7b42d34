"""A job as submitted: what it trains, how many GPUs, how much work."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["JobSpec"]


@dataclass(frozen=True)
class JobSpec:
    """One job of a trace or one Slurm submission.

    :param job_id: stable identity, unique within a trace.
    :param submit_time: arrival time (s, from the trace start).
    :param model: canonical model name (:func:`policies.workloads.canonical_model`).
    :param gpu_demand: total GPUs (>= 1); the scheduler picks the shape.
    :param total_samples: work to do (samples).
    :param extra: other trace columns (user, vc, ...) kept as they were.

    Elastic jobs (worker / parameter-server counts that change while running)
    and multi-resource demands (CPU, memory per worker) are future fields; they
    will be optional here so existing traces stay valid.
    """

    job_id: str
    submit_time: float
    model: str
    gpu_demand: int
    total_samples: float
    extra: dict = field(default_factory=dict, compare=False, hash=False)
