"""Wave planning: the ``"plan"`` candidate order's packing of waiting jobs into waves.

When many jobs of similar length wait, the average JCT is decided by how
densely they are packed and which go first. On the `uniform` job sets
(1-hour jobs of 1-32 GPUs on 4 x 8 GPUs) the exact optimum of an idealised
model (``benchmarks/uniform_bound.py``) runs the single-node jobs first,
packed node by node into exact complements (5 + 3, 6 + 2, 7 + 1, 4 + 4),
then the multi-node jobs in complementary pairs (10 + 22, 16 + 16), then the
largest jobs alone. Smallest-first orders (``"area"``, ``"fill"``) instead
use up the 1-3-GPU jobs at the start, after which jobs of 5-7 GPUs cannot
share a node and the cluster runs partly idle.

:func:`plan_waves` builds that shape with two bin-packing passes and
Smith's rule, from the waiting jobs' GPU demands alone:

1. *single-node jobs* (demand at most ``G``, the GPUs of a node) are packed
   into node-sized bins first fit decreasing (each job into the fullest bin
   it fits), bins sorted by job count (most first) then GPUs, and every
   ``N`` consecutive bins form one wave (one node each);
2. *multi-node jobs* (demand above ``G``) are packed first fit decreasing
   into cluster-sized waves, a job joining the wave it leaves with the
   fewest free GPUs where :func:`fits` finds node room for it;
3. all waves are sorted by job count, most first (Smith's rule for waves of
   equal length), then by GPUs, fewest first.

In the idealised model with nodes (``benchmarks/uniform_bound.py``'s
model where single-node jobs must fit in one node) this order comes within
about 2 % of the optimum on the 10 evaluation sets, against 13 % for the
``"fill"`` order (docs/RESULTS.md).

Pure functions of integers; no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["fits", "plan_order", "plan_waves"]


def fits(free: Sequence[int], demand: int) -> list[int] | None:
    """Free GPUs per node after placing a ``demand``-GPU job, or ``None`` if it does not fit.

    The placement is :func:`policies.placement.pack`'s rule on node counts: the node with
    the fewest free GPUs that still holds the rest of the job (lowest index on ties); if
    none does, the node with the most free GPUs is taken whole, and so on.

    :param free: free GPUs per node, ``[N]``.
    """
    f = list(free)
    need = demand
    if need > sum(f):
        return None
    while need > 0:
        best = -1
        for v, x in enumerate(f):
            if x >= need and (best < 0 or x < f[best]):
                best = v
        if best >= 0:
            f[best] -= need
            return f
        most = max(range(len(f)), key=lambda v: (f[v], -v))
        if f[most] <= 0:  # pragma: no cover - excluded by the sum check
            return None
        need -= f[most]
        f[most] = 0
    return f


def plan_waves(counts: Mapping[int, int], num_nodes: int, gpus_per_node: int) -> list[list[int]]:
    """Waves of GPU demands (each a list, largest first) in the order they should run.

    :param counts: waiting jobs per GPU demand (``{demand: count}``); demands above
        ``num_nodes * gpus_per_node`` are not allowed.
    :returns: lists of demands whose multiset union is ``counts``.
    :raises ValueError: a demand outside ``1 .. num_nodes * gpus_per_node`` or a negative count.
    """
    N, G = num_nodes, gpus_per_node
    C = N * G
    small: list[int] = []
    big: list[int] = []
    for d, c in counts.items():
        if not 1 <= d <= C or c < 0:
            raise ValueError(f"cannot plan {c} job(s) of {d} GPUs on {N} x {G} GPUs")
        (small if d <= G else big).extend([d] * c)
    # 1. single-node jobs into node bins, first fit decreasing (fullest bin that fits)
    bins: list[list[int]] = []
    used: list[int] = []
    for d in sorted(small, reverse=True):
        best = -1
        for i, u in enumerate(used):
            if u + d <= G and (best < 0 or u > used[best]):
                best = i
        if best < 0:
            bins.append([d])
            used.append(d)
        else:
            bins[best].append(d)
            used[best] += d
    order = sorted(range(len(bins)), key=lambda i: (-len(bins[i]), used[i], i))
    waves: list[list[int]] = []
    for s in range(0, len(order), N):
        waves.append(sorted((d for i in order[s : s + N] for d in bins[i]), reverse=True))
    # 2. multi-node jobs into cluster waves, first fit decreasing with node room
    bw: list[list[int]] = []
    bfree: list[list[int]] = []
    for d in sorted(big, reverse=True):
        best, best_f = -1, None
        for i, fr in enumerate(bfree):
            f = fits(fr, d)
            if f is not None and (best_f is None or sum(f) < sum(best_f)):
                best, best_f = i, f
        if best < 0:
            bw.append([d])
            bfree.append(fits([G] * N, d))  # type: ignore[arg-type]
        else:
            bw[best].append(d)
            bfree[best] = best_f  # type: ignore[assignment]
    waves.extend(bw)
    # 3. Smith's rule for equal-length waves: most jobs first, then fewest GPUs (stable)
    waves.sort(key=lambda w: (-len(w), sum(w)))
    return waves


def plan_order(counts: Mapping[int, int], num_nodes: int, gpus_per_node: int) -> list[int]:
    """:func:`plan_waves` flattened: one demand per waiting job, in the order to start them."""
    return [d for w in plan_waves(counts, num_nodes, gpus_per_node) for d in w]
