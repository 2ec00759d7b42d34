"""A job as submitted: what it trains, how many GPUs, how much work."""

from __future__ import annotations

from dataclasses import dataclass, field

from policies.resources import ResourceDemand, ResourceError

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
    :param demand: the full resource demand (GPU type, CPUs and memory per GPU, parameter servers,
        elastic range), or None for a plain demand of ``gpu_demand`` GPUs of any type. When given,
        ``demand.gpus`` must equal ``gpu_demand`` (:class:`~policies.resources.ResourceError`).
    """

    job_id: str
    submit_time: float
    model: str
    gpu_demand: int
    total_samples: float
    extra: dict = field(default_factory=dict, compare=False, hash=False)
    demand: ResourceDemand | None = None

    def __post_init__(self) -> None:
        d = self.demand
        if d is not None:
            if not isinstance(d, ResourceDemand):
                raise ResourceError(f"job {self.job_id!r}: demand must be a ResourceDemand, got {d!r}")
            if d.gpus != self.gpu_demand:
                raise ResourceError(
                    f"job {self.job_id!r}: demand.gpus ({d.gpus}) differs from gpu_demand ({self.gpu_demand!r})"
                )

    @property
    def resources(self) -> ResourceDemand:
        """:attr:`demand`, or the plain demand ``ResourceDemand(gpus=gpu_demand)``."""
        return self.demand if self.demand is not None else ResourceDemand(self.gpu_demand)
