"""Wave planning: the ``"plan"`` candidate order's packing of waiting jobs into waves.

When many jobs of similar length wait, the average JCT is decided by how
densely they are packed and which go first. On the `uniform` job sets
(1-hour jobs of 1-32 GPUs on 4 x 8 GPUs) the exact optimum of an idealised
model (``scripts/studies/uniform_bound.py``) runs the single-node jobs first,
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
   ``N`` consecutive bins form one wave (one node each; on a heterogeneous
   cluster bins have their node's size and a wave takes as many bins of a
   size as there are nodes of it);
2. *multi-node jobs* (demand above ``G``) are packed first fit decreasing
   into cluster-sized waves, a job joining the wave it leaves with the
   fewest free GPUs where :func:`fits` finds node room for it;
3. all waves are sorted by job count, most first (Smith's rule for waves of
   equal length), then by GPUs, fewest first.

In the idealised model with nodes (``scripts/studies/uniform_bound.py``'s
model where single-node jobs must fit in one node) this order comes within
about 2 % of the optimum on the 10 evaluation sets, against 13 % for the
``"fill"`` order (docs/RL.md, "The plan order").

Pure functions of integers; no I/O.
"""

from __future__ import annotations

import bisect
import functools
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
        most = max(f)
        if most >= need:
            x = min(x for x in f if x >= need)
            f[f.index(x)] -= need  # index(): the lowest index holding x
            return f
        if most <= 0:  # pragma: no cover - excluded by the sum check
            return None
        need -= most
        f[f.index(most)] = 0
    return f


@functools.lru_cache(maxsize=1 << 13)
def _fits_t(free: tuple[int, ...], demand: int) -> tuple[int, ...] | None:
    """:func:`fits` on a tuple, memoised: :func:`plan_waves` asks the same few questions (a wave's
    free GPUs per node, a demand) in every replan. Bounded at 8,192 entries: about 18 MB at most
    on 128 nodes, where a key and its answer are two 128-tuples."""
    f = fits(free, demand)
    return None if f is None else tuple(f)


def plan_waves(
    counts: Mapping[int, int], num_nodes: int, gpus_per_node: int, node_gpus: Sequence[int] | None = None
) -> list[list[int]]:
    """Waves of GPU demands (each a list, largest first) in the order they should run.

    :param counts: waiting jobs per GPU demand (``{demand: count}``); demands above the
        cluster's GPUs are not allowed.
    :param num_nodes: ``N``; ``gpus_per_node``: ``G``, the largest node's GPUs.
    :param node_gpus: GPUs of each node, ``[N]`` (a heterogeneous cluster); default ``G`` each.
        Single-node bins then have their node's size: a new bin gets the node size (at least its
        first job's demand) that then needs the fewest waves (its bins / its nodes, rounded up;
        the smallest size on ties), and each wave takes at most as many bins of a size as the
        cluster has nodes of that size.
    :returns: lists of demands whose multiset union is ``counts``; each wave fits the idle
        cluster, single-node jobs one node each.
    :raises ValueError: a demand outside ``1 .. total GPUs``, a negative count, or ``node_gpus``
        that does not have ``N`` entries in ``1 .. G`` with ``G`` among them.
    """
    N, G = num_nodes, gpus_per_node
    caps = tuple(node_gpus) if node_gpus is not None else (G,) * N
    if len(caps) != N or not caps or max(caps) != G or min(caps) < 1:
        raise ValueError(f"cannot plan on nodes of {list(caps)} GPUs: expected {N} nodes of 1 .. {G} GPUs, the largest {G}")
    C = sum(caps)
    nodes_of: dict[int, int] = {}  # node size -> nodes of that size
    for c in caps:
        nodes_of[c] = nodes_of.get(c, 0) + 1
    sizes = sorted(nodes_of)
    small: list[int] = []
    big: list[int] = []
    for d, c in counts.items():
        if not 1 <= d <= C or c < 0:
            raise ValueError(f"cannot plan {c} job(s) of {d} GPUs on {_describe(caps)}")
        (small if d <= G else big).extend([d] * c)
    # 1. single-node jobs into node bins, first fit decreasing: each job into the fullest bin it
    #    fits (least room left; lowest index on ties); bins bucketed by room left, so a job costs
    #    O(G), not O(bins)
    bins: list[list[int]] = []
    used: list[int] = []
    size: list[int] = []  # each bin's node size
    opened = dict.fromkeys(sizes, 0)  # bins per node size
    by_room: list[list[int]] = [[] for _ in range(G + 1)]  # bin indices, ascending
    for d in sorted(small, reverse=True):
        for r in range(d, G):
            if by_room[r]:
                i = by_room[r].pop(0)
                bins[i].append(d)
                used[i] += d
                bisect.insort(by_room[r - d], i)
                break
        else:
            # a new bin: the smallest node size that holds d and needs no more waves than a larger one
            fit = [c for c in sizes if c >= d]
            c = min(fit, key=lambda c: (-(-(opened[c] + 1) // nodes_of[c]), c))
            opened[c] += 1
            if c > d:
                by_room[c - d].append(len(bins))  # the largest index so far: stays sorted
            bins.append([d])
            used.append(d)
            size.append(c)
    order = sorted(range(len(bins)), key=lambda i: (-len(bins[i]), used[i], i))
    by_size: dict[int, list[int]] = {c: [] for c in sizes}
    for i in order:
        by_size[size[i]].append(i)
    waves: list[list[int]] = []
    for s in range(max((-(-len(b) // nodes_of[c]) for c, b in by_size.items()), default=0)):
        chunk = [i for c in sizes for i in by_size[c][s * nodes_of[c] : (s + 1) * nodes_of[c]]]
        waves.append(sorted((d for i in chunk for d in bins[i]), reverse=True))
    # 2. multi-node jobs into cluster waves, first fit decreasing with node room: the wave left with
    #    the fewest free GPUs (lowest index on ties); waves bucketed by free GPUs
    bw: list[list[int]] = []
    bfree: list[tuple[int, ...]] = []
    by_free: dict[int, list[int]] = {}  # free GPUs -> wave indices, ascending
    levels: list[int] = []  # the keys of by_free, ascending

    def _add(t: int, i: int) -> None:
        b = by_free.get(t)
        if b is None:
            by_free[t] = [i]
            bisect.insort(levels, t)
        else:
            bisect.insort(b, i)

    for d in sorted(big, reverse=True):
        placed = False
        for t in levels[bisect.bisect_left(levels, d) :]:
            for i in by_free[t]:
                f = _fits_t(bfree[i], d)
                if f is not None:
                    b = by_free[t]
                    b.remove(i)
                    if not b:
                        del by_free[t]
                        levels.remove(t)
                    _add(t - d, i)
                    bw[i].append(d)
                    bfree[i] = f
                    placed = True
                    break
            if placed:
                break
        if not placed:
            _add(C - d, len(bw))
            bw.append([d])
            bfree.append(_fits_t(caps, d))  # type: ignore[arg-type]
    waves.extend(bw)
    # 3. Smith's rule for equal-length waves: most jobs first, then fewest GPUs (stable)
    waves.sort(key=lambda w: (-len(w), sum(w)))
    return waves


def _describe(caps: Sequence[int]) -> str:
    """``"4 x 8 GPUs"`` for a homogeneous cluster, ``"nodes of [8, 8, 4] GPUs"`` otherwise."""
    if len(set(caps)) == 1:
        return f"{len(caps)} x {caps[0]} GPUs"
    return f"nodes of {list(caps)} GPUs"


def plan_order(
    counts: Mapping[int, int], num_nodes: int, gpus_per_node: int, node_gpus: Sequence[int] | None = None
) -> list[int]:
    """:func:`plan_waves` flattened: one demand per waiting job, in the order to start them."""
    return [d for w in plan_waves(counts, num_nodes, gpus_per_node, node_gpus) for d in w]
