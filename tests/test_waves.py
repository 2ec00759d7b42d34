"""Tests of policies.waves (the "plan" candidate order's wave planner)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.waves import fits, plan_order, plan_waves


def test_fits_best_fit_then_most_free_nodes():
    assert fits([8, 3, 5, 8], 3) == [8, 0, 5, 8]  # fewest free GPUs that hold the job
    assert fits([8, 3, 5, 8], 6) == [2, 3, 5, 8]  # lowest index on ties
    assert fits([8, 3, 5, 8], 12) == [0, 3, 1, 8]  # a whole node (most free, lowest index), then best fit
    assert fits([8, 3, 5, 8], 25) is None
    assert fits([8, 8], 16) == [0, 0]
    # the planner's memoised form answers the same on tuples, also when asked again
    from policies.waves import _fits_t

    for _ in range(2):
        assert _fits_t((8, 3, 5, 8), 12) == (0, 3, 1, 8)
        assert _fits_t((8, 3, 5, 8), 25) is None


def test_single_node_jobs_pack_into_exact_complements_most_jobs_first():
    """7+1, 6+2, 5+3, 4+4 fill four nodes exactly: one wave; the three 8s form the next."""
    counts = Counter([7, 1, 6, 2, 5, 3, 4, 4, 8, 8, 8])
    waves = plan_waves(counts, 4, 8)
    assert waves == [[7, 6, 5, 4, 4, 3, 2, 1], [8, 8, 8]]
    assert plan_order(counts, 4, 8) == [7, 6, 5, 4, 4, 3, 2, 1, 8, 8, 8]


def test_multi_node_jobs_pair_with_their_complements_and_large_ones_run_last():
    counts = Counter([10, 22, 16, 16, 25, 30, 2, 2, 2, 2])
    waves = plan_waves(counts, 4, 8)
    # small jobs first (4 jobs in one wave), then the complementary pairs, then the large jobs alone
    assert waves[0] == [2, 2, 2, 2]
    assert sorted(map(sorted, waves[1:3])) == [[10, 22], [16, 16]]
    assert waves[3:] == [[25], [30]]


@pytest.mark.parametrize("bad", [{0: 1}, {33: 1}, {4: -1}])
def test_bad_demands_are_named(bad):
    with pytest.raises(ValueError, match="cannot plan"):
        plan_waves(bad, 4, 8)


def _placeable(wave: list[int], nodes: int, gpus: int) -> bool:
    """The wave, largest first, fits an idle cluster: single-node jobs on one node each."""
    free = [gpus] * nodes
    for d in wave:
        if d <= gpus:
            cand = [v for v in range(nodes) if free[v] >= d]
            if not cand:
                return False
            v = min(cand, key=lambda v: (free[v], v))
            free[v] -= d
        else:
            f = fits(free, d)
            if f is None:
                return False
            free = f
    return True


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 6), st.sampled_from([2, 4, 8]), st.data())
def test_plan_is_a_partition_into_placeable_waves_in_smiths_order(nodes, gpus, data):
    """Property: the waves hold exactly the waiting jobs, each fits the idle cluster with the
    jobs of at most one node's GPUs each on one node, and waves come most jobs first."""
    demands = data.draw(st.lists(st.integers(1, nodes * gpus), max_size=60))
    counts = Counter(demands)
    waves = plan_waves(counts, nodes, gpus)
    assert Counter(d for w in waves for d in w) == counts
    assert all(w and w == sorted(w, reverse=True) for w in waves)
    assert all(_placeable(w, nodes, gpus) for w in waves)
    keys = [(-len(w), sum(w)) for w in waves]
    assert keys == sorted(keys)
    assert plan_order(counts, nodes, gpus) == [d for w in waves for d in w]


def _placeable_on(wave: list[int], caps: list[int]) -> bool:
    """The wave fits idle nodes of ``caps`` GPUs: single-node jobs (at most the largest node) on
    one node each, found by exhaustive search; multi-node jobs after them by :func:`fits`."""
    G = max(caps)
    single = sorted((d for d in wave if d <= G), reverse=True)
    multi = [d for d in wave if d > G]

    def place(k: int, free: list[int]) -> bool:
        if k == len(single):
            for d in multi:
                f = fits(free, d)
                if f is None:
                    return False
                free = f
            return True
        tried = set()
        for v, x in enumerate(free):
            if x >= single[k] and x not in tried:
                tried.add(x)
                free[v] -= single[k]
                ok = place(k + 1, free)
                free[v] += single[k]
                if ok:
                    return True
        return False

    return place(0, list(caps))


def test_heterogeneous_waves_use_each_nodes_size():
    """2 x 8 + 2 x 4 GPUs: 4-GPU jobs go to the 4-GPU nodes' bins, and a wave never plans more
    than the cluster holds (a 4 x 8 plan would put 40 GPUs of jobs in its first wave)."""
    caps = [8, 8, 4, 4]
    waves = plan_waves({8: 4, 4: 2}, 4, 8, caps)
    assert waves == [[8, 8, 4, 4], [8, 8]]
    assert plan_waves({8: 4, 4: 2}, 4, 8) == [[8, 8, 8, 4, 4], [8]]  # as if all nodes had 8: 40 GPUs


@pytest.mark.parametrize("caps", [[8, 8, 4], [4, 4], [8, 9], [0, 8]])
def test_node_sizes_must_match_the_cluster(caps):
    with pytest.raises(ValueError, match="cannot plan on nodes of"):
        plan_waves({1: 1}, 2, 8, caps)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from([1, 2, 3, 4, 6, 8]), min_size=1, max_size=5), st.data())
def test_heterogeneous_plan_is_a_partition_into_placeable_waves(caps, data):
    """Property: on any node sizes the waves hold exactly the waiting jobs, each fits the idle
    cluster (single-node jobs on one node each) and waves come most jobs first; a homogeneous
    ``node_gpus`` plans as the default."""
    N, G, C = len(caps), max(caps), sum(caps)
    demands = data.draw(st.lists(st.integers(1, C), max_size=40))
    counts = Counter(demands)
    waves = plan_waves(counts, N, G, caps)
    assert Counter(d for w in waves for d in w) == counts
    assert all(w and w == sorted(w, reverse=True) for w in waves)
    assert all(_placeable_on(w, caps) for w in waves)
    keys = [(-len(w), sum(w)) for w in waves]
    assert keys == sorted(keys)
    assert plan_order(counts, N, G, caps) == [d for w in waves for d in w]
    assert plan_waves(counts, N, G, [G] * N) == plan_waves(counts, N, G)
