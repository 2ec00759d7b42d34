"""SCED2's observation / action codec (seed 003, Luan et al., "SCED2: Scheduling Deep Learning
Training via Deep Reinforcement Learning"), codec name ``sced2-v1``.

The agent picks *which* waiting job starts next; where it runs is SCED2's packing
(:func:`policies.placement.pack`). Time is frozen while the agent picks jobs one after another,
each pick changing the round's state, until it picks "none".

Observation (float32, every value in ``[0, 1]``; ``squash(t) = t / (t + tau)``, ``tau`` =
:attr:`Sced2Spec.tau_s` seconds), flat, in three blocks:

* **GPU state** ``[N * M]`` (seed Table I): for each of the ``N`` servers (``M`` GPUs each), the
  remaining time of the job on each of its GPUs, ``squash(remaining)``, 0 for a free GPU. The
  snapshot says how many GPUs of a node a job holds, not which ones, so a server's row lists its
  GPUs by remaining time, longest first (free GPUs last). A running job's remaining time is its
  remaining samples at its current speed (``achieved_thp``; its isolated speed on its placement
  before it has one); a job placed in this round gets its isolated run time on the packing
  placement.
* **job state** ``[J * F]``: the first ``J`` waiting jobs by arrival (submit time, then job id),
  ``F = k + 3`` features each (an empty slot is all 0):

  - ``0 .. k-1``: the job's *profile*, its run time alone under ``k`` placements from concentrated
    to scattered (``n_i`` nodes, ``n_0 = ceil(g / M)`` up to ``n_{k-1} = g``, evenly spaced and
    rounded), ``squash(remaining samples / isolated_throughput(model, g, n_i))``: the
    performance model here, what SCED2's profiling tool measures in a few mini-batches;
  - ``k``: GPU demand ``g / (g + M)``;
  - ``k + 1``: waiting time ``squash(now - submit)``;
  - ``k + 2``: the job's speed on the placement packing gives it *now*, relative to its best
    (``0`` if it does not fit). Not in the seed's Table I: it is a function of the GPU state and
    the profile, added so that a small network need not learn packing (docs/SCED2.md).
* **statistics** ``[4]`` of the waiting jobs after the first ``J`` (seed: "remaining job num,
  avg. resource amount, avg. execution time, avg. waiting time"): ``n / (n + J)``,
  ``mean g / (mean g + M)``, ``squash(mean ideal run time)``, ``squash(mean wait)``; all 0 when
  there are none.

Actions (``J + 1``): ``i < J`` starts waiting job ``i`` on its packing placement; ``J`` is "none"
(schedule nothing more until the next event). Masks: a job slot is valid when a job is there and
its demand is at most the free GPUs; "none" is valid unless nothing runs, nothing was started in
this round and some job fits (an idle cluster with jobs waiting would otherwise stay idle: at the
next event nothing would have changed).

The spec fixes ``M``, ``J``, ``k`` and ``tau``; the server count ``N`` only sizes the GPU block, and
a spec made for ``N`` servers is re-sized to any other :meth:`Sced2Spec.for_nodes` by the codec, so
a network whose weights are shared over servers (:mod:`policies.sced2`) runs on any number of
servers of ``M`` GPUs. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np

from policies.cluster import ClusterSpec, Placement
from policies.codecs.base import CodecError
from policies.codecs.pick import (PickCodec, PickEncoding, as_started, check_spec_ints, check_tau, hold_mask,
                                  running_speed, spec_from_fields, take_waiting)
from policies.perf import ContentionModel
from policies.placement import pack
from policies.state import ClusterState, JobInfo

__all__ = ["Sced2Codec", "Sced2Encoding", "Sced2Round", "Sced2Spec", "N_STATS", "profile_nodes"]

#: Statistics of the rest of the queue (seed Table I).
N_STATS = 4
#: Extra per-job features after the ``k`` profile values: demand, wait, speed of the packing placement now.
_JOB_EXTRA = 3
#: Version of the observation layout (stored in the spec: a checkpoint of another layout is refused).
LAYOUT_VERSION = 1


def profile_nodes(gpus: int, per_node: int, k: int) -> tuple[int, ...]:
    """Node counts of the ``k`` profiled placements of a ``gpus``-GPU job on ``per_node``-GPU servers,
    from concentrated (``ceil(gpus / per_node)``) to scattered (``gpus``, one GPU per server), evenly
    spaced and rounded (repeats where the range is shorter than ``k``)."""
    lo = -(-gpus // per_node)
    hi = gpus
    if k == 1:
        return (lo,)
    return tuple(int(round(lo + (hi - lo) * i / (k - 1))) for i in range(k))


@dataclass(frozen=True)
class Sced2Spec:
    """Static shape of SCED2's observation for servers of ``gpus_per_node`` GPUs.

    :param nodes: servers ``N`` the dense shape is for (the codec re-sizes it to its cluster).
    :param gpus_per_node: GPUs per server ``M`` (the cluster must be homogeneous in it).
    :param jobs: waiting jobs shown ``J`` (seed: 10).
    :param k: profiled placements per job (seed: 4).
    :param tau_s: time scale of ``squash(t) = t / (t + tau)`` (s).
    :param version: observation layout version (:data:`LAYOUT_VERSION`).
    """

    nodes: int
    gpus_per_node: int
    jobs: int = 10
    k: int = 4
    tau_s: float = 3600.0
    version: int = LAYOUT_VERSION

    def __post_init__(self) -> None:
        check_spec_ints("sced2", self, ("nodes", "gpus_per_node", "jobs", "k", "version"))
        if self.version != LAYOUT_VERSION:
            raise CodecError(f"sced2 spec: layout version {self.version} is not {LAYOUT_VERSION}")
        if self.gpus_per_node > 255 or self.jobs > 1024 or self.k > 64:
            raise CodecError(
                f"sced2 spec: gpus_per_node <= 255, jobs <= 1024, k <= 64 expected, got "
                f"{self.gpus_per_node}, {self.jobs}, {self.k}"
            )
        check_tau("sced2", self.tau_s)

    @classmethod
    def for_cluster(cls, cluster: ClusterSpec, jobs: int = 10, k: int = 4, tau_s: float = 3600.0) -> "Sced2Spec":
        """The spec of a homogeneous ``cluster``."""
        if not cluster.is_homogeneous:
            raise CodecError(f"sced2 needs servers with equal GPU counts, got {cluster.describe_gpus()}")
        return cls(cluster.num_nodes, cluster.gpus_per_node[0], jobs, k, float(tau_s))

    def for_nodes(self, nodes: int) -> "Sced2Spec":
        """The same spec for ``nodes`` servers."""
        return self if nodes == self.nodes else replace(self, nodes=nodes)

    @property
    def job_features(self) -> int:
        """Features per waiting job ``F = k + 3``."""
        return self.k + _JOB_EXTRA

    @property
    def gpu_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def size(self) -> int:
        """Length of the flat observation: ``N * M + J * F + 4``."""
        return self.gpu_size + self.jobs * self.job_features + N_STATS

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.size,)

    @property
    def n_actions(self) -> int:
        return self.jobs + 1

    @property
    def noop(self) -> int:
        """The "none" action."""
        return self.jobs

    def to_dict(self) -> dict[str, Any]:
        return {"nodes": self.nodes, "gpus_per_node": self.gpus_per_node, "jobs": self.jobs, "k": self.k,
                "tau_s": self.tau_s, "version": self.version, "shape": list(self.shape)}

    @classmethod
    def from_dict(cls, d: Any) -> "Sced2Spec":
        return spec_from_fields("sced2", d, lambda d: cls(d["nodes"], d["gpus_per_node"], d["jobs"], d["k"], d["tau_s"],
                                                          d.get("version", LAYOUT_VERSION)))

    def check_cluster(self, cluster: ClusterSpec, layout: Sequence[int] | None = None) -> None:
        """Any number of servers, each with ``gpus_per_node`` GPUs (``layout`` is not needed: size-free)."""
        per = set(cluster.gpus_per_node)
        if per != {self.gpus_per_node}:
            raise CodecError(
                f"sced2 spec is for servers of {self.gpus_per_node} GPUs, the cluster has {cluster.describe_gpus()}"
            )


class Sced2Encoding(PickEncoding):
    """One encoded state of a :class:`Sced2Round`.

    :ivar mask: bool ``[J + 1]``.
    :ivar jobs: the waiting jobs of the ``J`` slots (fewer when fewer wait).
    :ivar placements: each slot's packing placement now (``None``: does not fit).
    """

    __slots__ = ("mask", "jobs", "placements", "_obs", "spec")
    label = "sced2"

    def __init__(self, spec: Sced2Spec, obs: np.ndarray | None, mask: np.ndarray, jobs: list[JobInfo],
                 placements: list[Placement | None]) -> None:
        self.spec, self._obs, self.mask, self.jobs, self.placements = spec, obs, mask, jobs, placements

    @property
    def obs(self) -> np.ndarray | None:
        return self._obs

    def _entry(self, a: int) -> tuple[str, Placement]:
        p = self.placements[a]
        assert p is not None
        return self.jobs[a].job_id, p


class Sced2Round:
    """One scheduling round of :class:`Sced2Codec`: the state, the starts taken from it and their encodings."""

    def __init__(self, codec: "Sced2Codec", state: ClusterState) -> None:
        self.codec = codec
        self._state = state
        spec = codec.spec
        self.now = float(state.time)
        self.free = np.asarray(state.free_gpus, dtype=np.int64).copy()
        self.waiting: list[JobInfo] = sorted(state.pending, key=lambda j: (j.submit_time, j.job_id))
        self.started: list[tuple[JobInfo, Placement]] = []
        self.idle = not state.running
        # per node: [(remaining s, GPUs)] of the jobs running there
        rows: list[list[tuple[float, int]]] = [[] for _ in range(len(self.free))]
        for r in state.running:
            if r.placement is None:
                continue
            rem = r.remaining_samples / running_speed(r)
            for n, c in r.placement.alloc:
                rows[n].append((rem, c))
        self._rows = rows
        self._gpu: np.ndarray | None = None
        self._tau = spec.tau_s

    # ------------------------------------------------------------------ protocol
    def state(self) -> ClusterState:
        """The round's input state with this round's starts applied (running, free GPUs, pending)."""
        st = self._state
        if not self.started:
            return st
        perf = self.codec.perf
        add = []
        for j, p in self.started:
            add.append(as_started(j, p, self.now, perf.throughput_for(j.model, p)))
        taken = {j.job_id for j, _p in self.started}
        return ClusterState(st.time, st.cluster, self.free.copy(), [*st.running, *add],
                            [j for j in st.pending if j.job_id not in taken], st.usable)

    def queue_order(self) -> list[JobInfo]:
        return list(self.waiting)

    def place(self, job_id: str, placement: Placement) -> None:
        j = take_waiting("sced2", self.waiting, self.free, job_id, placement)
        rem = self.codec.run_time(j, placement)
        for n, c in placement.alloc:
            self._rows[n].append((rem, c))
        self._gpu = None
        self.started.append((j, placement))

    def encode(self, dense: bool = True) -> Sced2Encoding:
        spec = self.codec.spec
        J = spec.jobs
        jobs = self.waiting[:J]
        total = int(self.free.sum())
        placements: list[Placement | None] = []
        mask = np.zeros(J + 1, dtype=bool)
        for i, j in enumerate(jobs):
            p = pack(j, self.free) if j.gpu_demand <= total else None
            placements.append(p)
            mask[i] = p is not None
        hold_mask(mask, self.idle, bool(self.started))
        obs = self._dense(jobs, placements) if dense else None
        return Sced2Encoding(spec, obs, mask, jobs, placements)

    # ------------------------------------------------------------------ dense observation
    def _squash(self, t: np.ndarray | float) -> np.ndarray | float:
        return t / (t + self._tau)

    def gpu_block(self) -> np.ndarray:
        """float32 ``[N, M]``: per server, its GPUs' squashed remaining times, longest first, free GPUs 0."""
        if self._gpu is None:
            M = self.codec.spec.gpus_per_node
            g = np.zeros((len(self._rows), M), dtype=np.float64)
            for n, row in enumerate(self._rows):
                if row:
                    vals = [rem for rem, c in row for _ in range(c)]
                    vals.sort(reverse=True)
                    g[n, : len(vals)] = vals[:M]
            g = np.maximum(g, 0.0)
            self._gpu = (g / (g + self._tau)).astype(np.float32)
        return self._gpu

    def _dense(self, jobs: list[JobInfo], placements: list[Placement | None]) -> np.ndarray:
        spec = self.codec.spec
        J, F, k, M = spec.jobs, spec.job_features, spec.k, spec.gpus_per_node
        out = np.zeros(spec.size, dtype=np.float32)
        out[: spec.gpu_size] = self.gpu_block().reshape(-1)
        jb = np.zeros((J, F), dtype=np.float64)
        codec = self.codec
        for i, j in enumerate(jobs):
            jb[i, :k] = codec.profile_times(j)
            jb[i, k] = j.gpu_demand / (j.gpu_demand + M)
            jb[i, k + 1] = max(self.now - j.submit_time, 0.0)
            p = placements[i]
            jb[i, k + 2] = codec.relative_speed(j, p) if p is not None else 0.0
        if jobs:
            jb[: len(jobs), :k] = self._squash(jb[: len(jobs), :k])
            jb[: len(jobs), k + 1] = self._squash(jb[: len(jobs), k + 1])
        o = spec.gpu_size
        out[o: o + J * F] = jb.reshape(-1)
        rest = self.waiting[J:]
        if rest:
            n = len(rest)
            g = sum(j.gpu_demand for j in rest) / n
            t = sum(j.total_time for j in rest) / n
            w = sum(max(self.now - j.submit_time, 0.0) for j in rest) / n
            out[o + J * F:] = (n / (n + J), g / (g + M), self._squash(t), self._squash(w))
        return out


class Sced2Codec(PickCodec):
    """SCED2's codec for one cluster of ``M``-GPU servers (module docstring).

    :param cluster: the cluster (homogeneous).
    :param perf: performance model (the job profiles and run times).
    :param spec: the spec (``None``: :meth:`Sced2Spec.for_cluster`); re-sized to the cluster's servers.
    """

    name: ClassVar[str] = "sced2-v1"
    spec_class = Sced2Spec
    round_class = Sced2Round

    def __init__(self, cluster: ClusterSpec, perf: ContentionModel, spec: Sced2Spec | None = None) -> None:
        if spec is None:
            spec = Sced2Spec.for_cluster(cluster)
        self._init_spec(cluster, perf, spec, "sced2")
        self.spec = spec.for_nodes(cluster.num_nodes)
        self._profiles: dict[tuple[str, int], tuple[float, ...]] = {}  # (model, g) -> k throughputs

    # ------------------------------------------------------------------ performance model
    def _profile_thp(self, model: str, g: int) -> tuple[float, ...]:
        key = (model, g)
        v = self._profiles.get(key)
        if v is None:
            v = self._profiles[key] = tuple(
                self.perf.isolated_throughput(model, g, n) for n in profile_nodes(g, self.spec.gpus_per_node, self.spec.k)
            )
        return v

    def profile_times(self, job: JobInfo) -> np.ndarray:
        """float64 ``[k]``: ``job``'s remaining run time (s) alone under the ``k`` profiled placements."""
        thp = self._profile_thp(job.model, job.gpu_demand)
        return job.remaining_samples / np.asarray(thp, dtype=np.float64)

    def relative_speed(self, job: JobInfo, placement: Placement) -> float:
        """``job``'s isolated speed on ``placement`` over its best (in ``(0, 1]``)."""
        return min(self.perf.throughput_for(job.model, placement) / self.best_thp(job), 1.0)

    def run_time(self, job: JobInfo, placement: Placement) -> float:
        """Seconds ``job`` runs alone on ``placement`` (its remaining samples at the isolated speed)."""
        return job.remaining_samples / self.perf.throughput_for(job.model, placement)

    def ideal_time(self, job: JobInfo) -> float:
        """Seconds ``job`` runs alone on its best placement (seed: ``T_ideal``)."""
        return job.total_samples / self.best_thp(job)

    def effectiveness(self, job: JobInfo, placement: Placement, now: float) -> float:
        """Seed eq. 2 at the start of ``job`` on ``placement`` at ``now``: ``T_ideal / (T_wait + T_actual)``,
        ``T_actual`` its isolated run time on ``placement`` (what SCED2's GPU state calls its remaining time)."""
        t_wait = max(now - job.submit_time, 0.0)
        return self.ideal_time(job) / (t_wait + job.total_samples / self.perf.throughput_for(job.model, placement))
