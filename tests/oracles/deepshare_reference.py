"""The ``deepshare-v1`` codec written out straightforwardly: the specification its rounds must match.

:func:`encode_reference` encodes a whole :class:`~policies.state.ClusterState` from scratch with
plain numpy writes, node scans and the performance model's ``job_cs``; :func:`apply_placement`
is the state transition of a start, rebuilding every touched :class:`~policies.state.JobInfo`.
:class:`policies.codecs.deepshare.DeepShareRound` (incremental, memoised, with its node index and
linear-plan sums) must give bit-identical observations, the same masks, candidates and options,
and the same states (``tests/test_encoding.py``, ``tests/test_rl_fast.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from policies.cluster import Placement
from policies.codecs.deepshare import CAND_FEATURES, DeepShareCodec, ObsSpec
from policies.orders import Plan
from policies.perf import ContentionModel, JobKey
from policies.placement import pack
from policies.state import ClusterState, JobInfo
from policies.workloads import get_workload

_HOUR = 3600.0
_REM_NORM = math.log1p(64.0)
_QUEUE_NORM = math.log1p(256.0)


@dataclass
class ReferenceEncoding:
    """What :func:`encode_reference` returns (the fields of ``Encoded`` a test compares)."""

    obs: np.ndarray
    mask: np.ndarray
    candidates: list[JobInfo]
    options: list[list[Placement | None]]
    spec: ObsSpec

    @property
    def any_placement(self) -> bool:
        return bool(self.mask[:-1].any())

    def action_speeds(self) -> np.ndarray:
        """float32 ``[K * S]``: the maximum of each option channel over the right half."""
        ks = self.spec.k * self.spec.options
        return self.obs[:ks, :, self.spec.gpus_per_node :].reshape(ks, -1).max(axis=1)

    def decode(self, action: int) -> tuple[str, Placement] | None:
        a = int(action)
        if not 0 <= a < len(self.mask) or not self.mask[a]:
            raise ValueError(f"action {a} is not valid in this state")
        if a == len(self.mask) - 1:
            return None
        k, s = divmod(a, self.spec.options)
        return self.candidates[k].job_id, self.options[k][s]


def options_reference(spec: ObsSpec, job: JobInfo, free: np.ndarray, order: np.ndarray) -> list[Placement | None]:
    """The ``S`` options of ``job``: balanced over ``1, 2, 4, ...`` nodes taken in ``order`` among those with
    room, then :func:`~policies.placement.pack`."""
    out: list[Placement | None] = []
    g = job.gpu_demand
    for lvl in range(spec.levels):
        n = 1 << lvl
        per = math.ceil(g / n)
        if n > g or (n - 1) * per >= g:
            out.append(None)
            continue
        chosen = [int(i) for i in order if free[i] >= per][:n]
        if len(chosen) < n:
            out.append(None)
            continue
        alloc: dict[int, int] = {}
        left = g
        for i in chosen:
            take = min(per, left)
            alloc[i] = take
            left -= take
        out.append(Placement.of(alloc))
    out.append(pack(job, free) if g <= int(free.sum()) else None)
    return out


def predicted_speed_reference(perf: ContentionModel, job: JobInfo, p: Placement, multi_keys: list[list[JobKey]]) -> float:
    """``isolated(shape) / CS / best_isolated`` of ``job`` on ``p`` given multi-node neighbours per node."""
    iso = perf.isolated_throughput(job.model, p.total_gpus, p.num_nodes)
    if p.num_nodes > 1:
        cs = perf.job_cs((job.model, p.total_gpus, p.num_nodes), p.nodes, {v: multi_keys[v] for v in p.nodes})
    else:
        cs = 1.0
    best = perf.best_isolated_throughput(job.model, job.gpu_demand)
    return float(min(iso / cs / max(best, 1e-12), 1.0))


def candidates_reference(codec: DeepShareCodec, state: ClusterState, plan: Plan | None = None) -> list[JobInfo]:
    """The candidates of ``state`` (the codec's order over its whole queue; ``plan``: the round's plan)."""
    return codec.order.candidates(state.pending, state.time, state.total_free, plan)


def encode_reference(
    codec: DeepShareCodec,
    state: ClusterState,
    candidates: Sequence[JobInfo] | None = None,
    queue_len: int | None = None,
) -> ReferenceEncoding:
    """Encode ``state`` from scratch (see :mod:`policies.codecs.deepshare` for the layout).

    :param candidates: the candidate jobs (default :func:`candidates_reference`).
    :param queue_len: number of waiting jobs (default ``len(state.pending)``).
    """
    spec, perf, cluster = codec.spec, codec.perf, codec.cluster
    N, G = spec.num_nodes, spec.gpus_per_node
    link = cluster.inter_bw_gbps * 1000.0
    logtot = math.log2(1 + cluster.total_gpus)
    caps = np.array(cluster.gpus_per_node, dtype=np.int64)
    exists = (np.arange(G)[None, :] < caps[:, None]).astype(np.float32)

    def bw(model: str) -> float:
        return min(get_workload(model).bandwidth_mbps / link, 1.0)

    def cc(model: str) -> float:
        r = get_workload(model).comm_comp
        return r / (1.0 + r)

    def rem(j: JobInfo) -> float:
        return min(math.log1p(max(j.remaining_time, 0.0) / _HOUR) / _REM_NORM, 1.0)

    obs = np.zeros(spec.shape, dtype=np.float32)
    free = np.asarray(state.free_gpus, dtype=np.int64)
    used = np.zeros(N, dtype=np.int64)
    multi_load = np.zeros(N, dtype=np.int64)
    multi_keys: list[list[JobKey]] = [[] for _ in range(N)]
    left = obs[:, :, :G]
    left[0] = exists
    for j in sorted(state.running, key=lambda x: x.job_id):
        p = j.placement
        if p is None:
            continue
        multi = p.num_nodes > 1
        feats = (
            1.0,
            bw(j.model),
            cc(j.model),
            rem(j),
            min(max(j.cs - 1.0, 0.0), 1.0),
            1.0 if multi else 0.0,
            math.log2(1 + j.gpu_demand) / logtot,
        )
        for v, c in p.alloc:
            a, b = int(used[v]), min(int(used[v]) + c, G)
            if b > a:
                left[1:8, v, a:b] = np.asarray(feats, dtype=np.float32)[:, None]
            used[v] += c
            if multi:
                multi_load[v] += 1
                multi_keys[v].append((j.model, p.total_gpus, p.num_nodes))
    n_pending = len(state.pending) if queue_len is None else int(queue_len)
    q = min(math.log1p(n_pending) / _QUEUE_NORM, 1.0)
    left[8] = exists * q

    cands = list(candidates_reference(codec, state) if candidates is None else candidates)[: spec.k]
    order = np.lexsort((np.arange(N), free, multi_load))  # least loaded, best fit, index
    S = spec.options
    mask = np.zeros(spec.n_actions, dtype=bool)
    options: list[list[Placement | None]] = []
    right = obs[:, :, G:]
    base = spec.k * S
    for k, job in enumerate(cands):
        opts = options_reference(spec, job, free, order)
        options.append(opts)
        for s, p in enumerate(opts):
            if p is None:
                continue
            mask[k * S + s] = True
            speed = predicted_speed_reference(perf, job, p, multi_keys)
            ch = right[k * S + s]
            for v, c in p.alloc:
                a, b = int(used[v]), min(int(used[v]) + c, G)
                ch[v, a:b] = speed
        wait = min(math.log1p(max(state.time - job.submit_time, 0.0) / _HOUR) / _REM_NORM, 1.0)
        cf = (bw(job.model), cc(job.model), rem(job), math.log2(1 + job.gpu_demand) / logtot, wait)
        for i, val in enumerate(cf):
            right[base + CAND_FEATURES * k + i] = exists * val
    mask[spec.noop] = bool(state.running) or not mask[:-1].any()
    return ReferenceEncoding(obs, mask, cands, options, spec)


def apply_placement(
    state: ClusterState,
    job_id: str,
    p: Placement,
    perf: ContentionModel,
    job: JobInfo | None = None,
) -> ClusterState:
    """The state after starting pending job ``job_id`` on ``p`` (a new object; ``state`` is untouched).

    Updates free GPUs, moves the job to running with its isolated / achieved throughput, and
    recomputes the achieved throughput of the multi-node neighbours whose contention changes.

    :param job: the pending job, if the caller has it (saves a search).
    """
    free = np.asarray(state.free_gpus, dtype=np.int64).copy()
    if not p.fits(free):
        raise ValueError(f"placement {p} of job {job_id} does not fit free GPUs {free.tolist()}")
    if job is None or job.job_id != job_id:
        job = next((j for j in state.pending if j.job_id == job_id), None)
    if job is None:
        raise ValueError(f"job {job_id} is not pending")
    for v, c in p.alloc:
        free[v] -= c
    iso = perf.isolated_throughput(job.model, p.total_gpus, p.num_nodes)
    new = JobInfo(**{**job.__dict__, "placement": p, "isolated_thp": iso, "achieved_thp": iso, "start_time": state.time})
    running = list(state.running) + [new]
    if p.num_nodes > 1:
        by_node: dict[int, list[JobInfo]] = {}
        for j in running:
            if j.placement is not None and j.placement.num_nodes > 1:
                for v in j.placement.nodes:
                    by_node.setdefault(v, []).append(j)
        touched = {j.job_id for v in p.nodes for j in by_node.get(v, [])}
        out = []
        for j in running:
            if j.job_id in touched:
                key = (j.model, j.placement.total_gpus, j.placement.num_nodes)
                neigh = {
                    v: [(o.model, o.placement.total_gpus, o.placement.num_nodes) for o in by_node.get(v, []) if o.job_id != j.job_id]
                    for v in j.placement.nodes
                }
                cs = perf.job_cs(key, j.placement.nodes, neigh)
                iso_j = j.isolated_thp or perf.isolated_throughput(j.model, j.placement.total_gpus, j.placement.num_nodes)
                j = JobInfo(**{**j.__dict__, "isolated_thp": iso_j, "achieved_thp": iso_j / cs})
            out.append(j)
        running = out
    pending = [j for j in state.pending if j.job_id != job_id]
    return ClusterState(state.time, state.cluster, free, running, pending, state.usable)
