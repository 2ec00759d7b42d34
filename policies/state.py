"""The cluster state a policy sees, and the decision it returns.

Both backends build the same :class:`ClusterState`: the simulator
(:mod:`trainer.simulator`) from its event loop, the controller
(:mod:`controller`) from Slurm. Policies are pure functions of it.

Units: times in seconds, work in samples, service in GPU-seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from policies.cluster import ClusterSpec, Placement

__all__ = ["JobInfo", "ClusterState", "Decision", "time_key", "TIME_KEY_DECIMALS", "TIME_KEY_SCALE"]

#: Decimals (of a second) that time-based ordering keys are rounded to, see :func:`time_key`.
TIME_KEY_DECIMALS = 3
#: ``10 ** TIME_KEY_DECIMALS``: ``floor(t * TIME_KEY_SCALE + 0.5) / TIME_KEY_SCALE`` is :func:`time_key`
#: written out (hot loops inline it; 3x cheaper than ``round(t, 3)``)
TIME_KEY_SCALE = 10.0**TIME_KEY_DECIMALS


def time_key(seconds: float) -> float:
    """An estimated time (s) as an ordering key: rounded to :data:`TIME_KEY_DECIMALS` decimals.

    Jobs of equal length get estimates that differ only by float rounding
    (``total_samples / best_thp`` is 3600.0 for one model and demand, 3599.9999999999995 for
    another), and unrounded that noise, not the tie-break that follows (submit time, then
    job id), would decide their order."""
    return math.floor(seconds * TIME_KEY_SCALE + 0.5) / TIME_KEY_SCALE


@dataclass
class JobInfo:
    """A job as policies see it, pending or running.

    :param job_id: stable identity (survives preemption / requeue).
    :param model: canonical model name (see :mod:`policies.workloads`).
    :param gpu_demand: total GPUs the job asks for.
    :param submit_time: when it entered the system (s).
    :param total_samples: work to do (samples).
    :param done_samples: work done so far (samples).
    :param attained_service: GPU-seconds received so far (LAS key).
    :param placement: where it runs now; ``None`` while pending.
    :param isolated_thp: samples/s it would get alone on ``placement``.
    :param achieved_thp: samples/s it gets now (``<= isolated_thp``).
    :param best_thp: samples/s alone on its best feasible shape; used to
        estimate remaining time for SJF/SRTF.
    :param start_time: when it last started; ``None`` while pending.
    :param preemptions: times it has been preempted.
    :param extra: backend-specific fields (Slurm job id, user, ...). Elastic
        and multi-resource demands will live here first.
    """

    job_id: str
    model: str
    gpu_demand: int
    submit_time: float
    total_samples: float
    done_samples: float = 0.0
    attained_service: float = 0.0
    placement: Placement | None = None
    isolated_thp: float = 0.0
    achieved_thp: float = 0.0
    best_thp: float = 1.0
    start_time: float | None = None
    preemptions: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def remaining_samples(self) -> float:
        return max(self.total_samples - self.done_samples, 0.0)

    @property
    def remaining_time(self) -> float:
        """Estimated seconds left when running alone on its best shape."""
        return self.remaining_samples / self.best_thp

    @property
    def total_time(self) -> float:
        """Estimated isolated run time of the whole job (SJF key)."""
        return self.total_samples / self.best_thp

    @property
    def cs(self) -> float:
        """Current contention sensitivity (isolated / achieved, >= 1)."""
        if self.placement is None or self.achieved_thp <= 0:
            return 1.0
        return self.isolated_thp / self.achieved_thp

    @property
    def is_running(self) -> bool:
        return self.placement is not None


@dataclass
class ClusterState:
    """Snapshot handed to a policy each scheduling round.

    :param time: current time (s).
    :param cluster: static cluster shape.
    :param free_gpus: int array ``[num_nodes]``, free GPUs per node.
    :param running: running jobs (with placements).
    :param pending: waiting jobs in arrival order.
    """

    time: float
    cluster: ClusterSpec
    free_gpus: np.ndarray
    running: Sequence[JobInfo]
    pending: Sequence[JobInfo]

    @property
    def total_free(self) -> int:
        return int(self.free_gpus.sum())

    @property
    def utilisation(self) -> float:
        return 1.0 - self.total_free / self.cluster.total_gpus

    def jobs_on_node(self) -> list[list[JobInfo]]:
        """Running jobs per node index."""
        per: list[list[JobInfo]] = [[] for _ in range(self.cluster.num_nodes)]
        for j in self.running:
            assert j.placement is not None
            for n in j.placement.nodes:
                per[n].append(j)
        return per


@dataclass
class Decision:
    """What a policy wants done this round.

    ``preempt`` is applied first (those jobs return to the queue with their
    progress checkpointed), then ``place`` in order. Each placement must fit
    the free GPUs left after the earlier entries; backends reject (and log)
    any that do not.
    """

    place: list[tuple[str, Placement]] = field(default_factory=list)
    preempt: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.place or self.preempt)
