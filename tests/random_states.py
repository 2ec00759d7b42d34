"""Random cluster states for the encoder and round property tests (a helper module, not a test)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from policies.cluster import ClusterSpec, Placement
from oracles.deepshare_reference import apply_placement
from policies.perf import ContentionModel
from policies.state import ClusterState, JobInfo


def random_state(
    cluster: ClusterSpec,
    perf: ContentionModel,
    running: Sequence[tuple[str, int, float]],
    pending: Sequence[tuple[str, int, float]],
    now: float,
    seed: int | np.random.Generator,
    id_width: int = 3,
) -> ClusterState:
    """Random running jobs on random (also uneven, multi-node) placements plus a random queue.

    :param running: ``(model, GPUs, remaining hours)`` per running job; one that no longer fits is skipped.
    :param pending: the same per waiting job; demands above the cluster's GPUs are dropped.
    :param now: the clock (s); submit times are drawn from ``[0, now)``.
    :param seed: a seed, or a generator to draw from (the caller can go on drawing from it).
    :param id_width: digits of the job ids (``r007`` / ``p012``).
    """
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)

    def mk(jid: str, m: str, g: int, r: float) -> JobInfo:
        best = perf.best_isolated_throughput(m, g)
        tot = r * 3600 * best
        return JobInfo(
            jid, m, g, float(rng.uniform(0, now)), tot, done_samples=float(rng.uniform(0, tot)), best_thp=best
        )

    state = ClusterState(now, cluster, np.array(cluster.gpus_per_node), [], [])
    # running jobs: random placements over random nodes, started through apply_placement (sets CS)
    for i, (m, g, r) in enumerate(running):
        free = np.asarray(state.free_gpus)
        if g > int(free.sum()):
            continue
        alloc: dict[int, int] = {}
        need = g
        for v in rng.permutation(len(free)):
            take = min(int(free[v]), need, int(rng.integers(1, need + 1)))
            if take > 0:
                alloc[int(v)] = take
                need -= take
            if need == 0:
                break
        if need:
            continue
        job = mk(f"r{i:0{id_width}d}", m, g, r)
        state = ClusterState(state.time, cluster, state.free_gpus, state.running, [job])
        state = apply_placement(state, job.job_id, Placement.of(alloc), perf)
    pend = [mk(f"p{i:0{id_width}d}", m, g, r) for i, (m, g, r) in enumerate(pending) if g <= cluster.total_gpus]
    return ClusterState(now, cluster, state.free_gpus, state.running, pend)
