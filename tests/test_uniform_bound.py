"""scripts/studies/uniform_bound.py: the abstract bin model and its MILP bound on hand-checkable job sets."""

from __future__ import annotations

import itertools

import pytest
from bench_loader import load_study

ub = load_study("uniform_bound")


def test_bins_first_fit_in_rule_order():
    # first fit per hour in the given order: 20 + 12 fill 32 GPUs twice
    assert ub.bins([20, 20, 12, 12], ub.fifo, 32) == [1, 1, 2, 2]
    assert ub.bins([20, 20, 13, 13], ub.fifo, 32) == [1, 2, 3, 3]  # 13 + 20 > 32: the 13s wait
    with pytest.raises(ValueError, match="1..32"):
        ub.bins([33], ub.fifo, 32)


def test_fill_rule_pairs_a_large_job_with_its_gap():
    # no job of at most 0.15 x 32 = 4.8 GPUs waits: the first large job goes first, then its best fillers
    assert ub.fill_rule(32)([10, 17, 15, 20]) == [17, 15, 10, 20]
    # a small job waits: smallest first
    assert ub.fill_rule(32)([10, 17, 3]) == [3, 10, 17]


def _brute_force(demands, gpus):
    """Exact minimum of the average completion hour by trying every assignment of jobs to hours."""
    n = len(demands)
    best = None
    for hours in itertools.product(range(1, n + 1), repeat=n):
        load = {}
        for d, h in zip(demands, hours):
            load[h] = load.get(h, 0) + d
        if max(load.values()) <= gpus:
            avg = sum(hours) / n
            best = avg if best is None else min(best, avg)
    return best


@pytest.mark.parametrize("demands", [[20, 20, 12, 12], [5, 30, 3, 17, 16], [8, 8, 8, 8, 9, 24]])
def test_optimum_matches_brute_force_and_bounds_the_rules(demands):
    got = ub.optimum(demands, 32, time_limit=30)
    exact = _brute_force(demands, 32)
    assert got["proven_optimal"]
    assert got["best_h"] == pytest.approx(exact)
    assert got["bound_h"] <= got["best_h"] + 1e-9
    for rule in (ub.fifo, ub.fill_rule(32)):
        hours = ub.bins(demands, rule, 32)
        assert sum(hours) / len(hours) >= got["bound_h"] - 1e-9


def test_rejects_sets_with_arrivals(tmp_path, capsys):
    d = tmp_path / "sets"
    d.mkdir()
    (d / "set0.csv").write_text("job_id,submit_time,model,gpu_demand,duration\n0,0,FSDP,4,3600\n1,60,FSDP,8,3600\n")
    assert ub.main(["--traces", str(d), "--time-limit", "1"]) == 2
    assert "arrive at 0" in capsys.readouterr().err
