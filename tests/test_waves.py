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
