"""Tests for policies.heuristics: each order does what its name says.

Policies are called directly on hand-made cluster states; end-to-end golden
traces through the simulator are in tests/test_simulator.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.base import PolicyError
from policies.cluster import ClusterSpec, Placement
from policies.heuristics import (
    LAS2D_PROMOTE_KNOB,
    LAS2D_THRESHOLDS,
    LAS_THRESHOLDS,
    ORDERS,
    OrderedPolicy,
    make_heuristic,
)
from policies.job import JobSpec
from policies.perf import ContentionModel
from policies.placement import ContentionAwarePlacement, FloorPacking, pack, spread
from policies.state import ClusterState, Decision, JobInfo
from trainer.simulator import SimConfig, Simulator

C18 = ClusterSpec.parse("1x8")
C28 = ClusterSpec.parse("2x8")


@pytest.fixture(scope="module")
def perf() -> ContentionModel:
    return ContentionModel(ClusterSpec.parse("4x8"))


def job(jid: str, gpus: int, submit: float = 0.0, total: float = 1000.0, done: float = 0.0, *,
        placement: Placement | None = None, start: float | None = None, attained: float = 0.0,
        model: str = "MoE") -> JobInfo:
    # best_thp = 1 sample/s: remaining_time = remaining samples.
    return JobInfo(jid, model, gpus, submit, total, done_samples=done, attained_service=attained,
                   placement=placement, best_thp=1.0, start_time=start)


def state(cluster: ClusterSpec, running: list[JobInfo], pending: list[JobInfo], t: float = 1000.0) -> ClusterState:
    free = np.array(cluster.gpus_per_node, dtype=np.int64)
    for j in running:
        for n, c in j.placement.alloc:  # type: ignore[union-attr]
            free[n] -= c
    assert (free >= 0).all()
    return ClusterState(t, cluster, free, running, pending)


def placed(dec: Decision) -> list[str]:
    return [jid for jid, _ in dec.place]


# ---------------------------------------------------------------------- names
@pytest.mark.parametrize(
    "name, order, placement, preemptive, strict",
    [
        ("fifo", "fifo", pack, False, True),
        ("sjf", "sjf", pack, False, False),
        ("srtf", "srtf", pack, True, False),
        ("las", "las", pack, True, False),
        ("las-np", "las", pack, False, False),
        ("srtf:spread", "srtf", spread, True, False),
        ("FIFO:Spread", "fifo", spread, False, True),
        ("sif", "sif", pack, False, False),
        ("lrf", "lrf", pack, False, False),
        ("lgtf", "lgtf", pack, True, False),
        ("lgtf-np", "lgtf", pack, False, False),
        ("las2d", "las2d", pack, True, False),
    ],
)
def test_make_heuristic(perf, name, order, placement, preemptive, strict) -> None:
    pol = make_heuristic(name, perf)
    assert isinstance(pol, OrderedPolicy)
    assert pol.order is ORDERS[order]
    assert pol.placement is placement
    assert pol.preemptive is preemptive and pol.strict is strict
    assert pol.time_invariant is (not preemptive)
    assert pol.name == name.lower()


@pytest.mark.parametrize("name", ["srtf:nosplit", "fifo:nosplit", "lgtf:nosplit", "las2d-np:nosplit", "lrf:nosplit"])
def test_any_order_composes_with_nosplit(perf, name) -> None:
    pol = make_heuristic(name, perf)
    assert isinstance(pol.placement, FloorPacking) and pol.placement.min_efficiency == 0.0


def test_make_greedy(perf) -> None:
    pol = make_heuristic("greedy", perf)
    assert pol.order is ORDERS["srtf"] and isinstance(pol.placement, ContentionAwarePlacement)
    assert pol.placement.nosplit and pol.preemptive
    assert make_heuristic("greedy:spread", perf).placement is spread


@pytest.mark.parametrize("bad, match", [("foo", "unknown policy 'foo'"), ("srtf:bar", "unknown placement 'bar'"), ("", "unknown policy")])
def test_make_heuristic_errors(perf, bad, match) -> None:
    with pytest.raises(PolicyError, match=match):
        make_heuristic(bad, perf)


# ---------------------------------------------------------------------- FIFO / SJF
def test_fifo_blocks_head_of_line(perf) -> None:
    run = [job("r", 4, placement=Placement.of({0: 4}), start=0.0)]
    pend = [job("big", 8, submit=10.0), job("small", 1, submit=20.0, total=5.0)]
    st_ = state(C18, run, pend)
    assert make_heuristic("fifo", perf).schedule(st_) == Decision()
    # SJF: the small job goes first (shortest) and fits: backfill.
    assert placed(make_heuristic("sjf", perf).schedule(st_)) == ["small"]
    # Not strict FIFO order with backfilling would place it too: order matters, not only strictness.
    assert placed(make_heuristic("las-np", perf).schedule(st_)) == ["small"]


def test_fifo_order_is_submit_time(perf) -> None:
    pend = [job("late", 4, submit=5.0, total=1.0), job("early", 4, submit=1.0, total=9e9)]
    dec = make_heuristic("fifo", perf).schedule(state(C18, [], pend))
    assert placed(dec) == ["early", "late"]


def test_sjf_orders_by_total_work_not_remaining(perf) -> None:
    pend = [job("a", 8, total=1000.0, done=900.0), job("b", 8, total=500.0)]
    assert placed(make_heuristic("sjf", perf).schedule(state(C18, [], pend))) == ["b"]
    # SRTF looks at what is left: a has 100 left.
    assert placed(make_heuristic("srtf", perf).schedule(state(C18, [], pend))) == ["a"]


# ---------------------------------------------------------------------- SRTF
def test_srtf_preempts_long_for_much_shorter(perf) -> None:
    run = [job("long", 8, total=1e5, done=1e3, placement=Placement.of({0: 8}), start=0.0)]
    pend = [job("short", 8, submit=900.0, total=100.0)]
    dec = make_heuristic("srtf", perf).schedule(state(C18, run, pend))
    assert dec.preempt == ["long"] and placed(dec) == ["short"]
    assert dec.place[0][1] == Placement.of({0: 8})
    # Non-preemptive variant: nothing to do.
    assert make_heuristic("srtf-np", perf).schedule(state(C18, run, pend)) == Decision()


def test_srtf_no_preemption_within_margin_or_min_run(perf) -> None:
    run = [job("long", 8, total=1000.0, done=850.0, placement=Placement.of({0: 8}), start=0.0)]
    # 150 left vs 100: not more than 2x.
    assert make_heuristic("srtf", perf).schedule(state(C18, run, [job("s", 8, total=100.0)])) == Decision()
    # Clearly shorter but the running job started 100 s ago (< min_run 300 s).
    run = [job("long", 8, total=1e5, placement=Placement.of({0: 8}), start=900.0)]
    assert make_heuristic("srtf", perf).schedule(state(C18, run, [job("s", 8, total=1.0)])) == Decision()


def test_srtf_preempts_worst_victim_and_only_what_it_needs(perf) -> None:
    run = [
        job("longest", 8, total=1e6, placement=Placement.of({0: 8}), start=0.0),
        job("long", 8, total=1e5, placement=Placement.of({1: 8}), start=0.0),
    ]
    dec = make_heuristic("srtf", perf).schedule(state(C28, run, [job("s", 4, total=10.0)]))
    assert dec.preempt == ["longest"]
    assert dec.place == [("s", Placement.of({0: 4}))]


def test_preemption_only_covers_each_nodes_deficit(perf) -> None:
    """J (10 GPUs) needs 2 GPUs on node 0, which has 3 free, and 8 on node 1, which has none. Only V2
    (node 1) goes; V1 (lowest priority, node 0) stays."""
    v1 = job("V1", 1, total=1e6, placement=Placement.of({0: 1}), start=0.0)  # lowest priority
    v2 = job("V2", 8, total=5e5, placement=Placement.of({1: 8}), start=0.0)
    x = job("X", 4, total=1e2, placement=Placement.of({0: 4}), start=0.0)  # short: never a victim
    st_ = ClusterState(1000.0, C28, np.array([3, 0]), [v1, v2, x], [job("J", 10, total=3600.0)])
    for name in ("srtf", "greedy"):
        dec = make_heuristic(name, perf).schedule(st_)
        assert dec.preempt == ["V2"], name
        assert dec.place == [("J", Placement.of({0: 2, 1: 8}))], name


def test_preemption_takes_lowest_priority_first_up_to_the_deficit(perf) -> None:
    """Several victims on the short node: the lowest-priority ones until the deficit is covered, not more."""
    run = [
        job("a", 2, total=1e6, placement=Placement.of({0: 2}), start=0.0),  # lowest priority
        job("b", 2, total=9e5, placement=Placement.of({0: 2}), start=0.0),
        job("c", 4, total=8e5, placement=Placement.of({0: 4}), start=0.0),
    ]
    dec = make_heuristic("srtf", perf).schedule(state(C18, run, [job("s", 4, total=10.0)]))
    assert dec.preempt == ["a", "b"] and dec.place == [("s", Placement.of({0: 4}))]


@pytest.mark.parametrize("name", ["srtf", "las", "greedy", "srtf:spread"])
def test_preemption_never_uses_unusable_nodes(perf, name) -> None:
    """A draining node (usable False, free GPUs 0) still runs a long job: preempting it frees nothing
    a placement may use, so the short job preempts the job on the usable node, or waits."""
    drained = job("on-drained", 8, total=1e7, placement=Placement.of({0: 8}), start=0.0, attained=1e6)
    other = job("other", 8, total=1e6, placement=Placement.of({1: 8}), start=0.0, attained=1e5)
    short = job("short", 8, submit=900.0, total=10.0)
    usable = np.array([False, True])
    dec = make_heuristic(name, perf).schedule(ClusterState(1000.0, C28, np.array([0, 0]), [drained, other], [short], usable))
    assert dec.preempt == ["other"] and dec.place == [("short", Placement.of({1: 8}))]
    # nothing preemptible on the usable node: nothing happens (no placement on the drained node)
    other = job("other", 8, total=5.0, placement=Placement.of({1: 8}), start=950.0)
    dec = make_heuristic(name, perf).schedule(ClusterState(1000.0, C28, np.array([0, 0]), [drained, other], [short], usable))
    assert dec == Decision()
    # free GPUs reported on an unusable node are not used either
    dec = make_heuristic(name, perf).schedule(ClusterState(1000.0, C28, np.array([8, 0]), [other], [short], usable))
    assert dec == Decision()


def test_victim_on_usable_and_unusable_nodes_frees_only_its_usable_gpus(perf) -> None:
    """A 16-GPU victim over a drained node and a usable one frees 8 usable GPUs: enough for an 8-GPU job,
    not for a 12-GPU one."""
    usable = np.array([False, True])
    wide = job("wide", 16, total=1e7, placement=Placement.of({0: 8, 1: 8}), start=0.0)
    for gpus, fits in ((8, True), (12, False)):
        st_ = ClusterState(1000.0, C28, np.array([0, 0]), [wide], [job("s", gpus, total=10.0)], usable)
        dec = make_heuristic("srtf", perf).schedule(st_)
        assert dec == (Decision([("s", Placement.of({1: 8}))], ["wide"]) if fits else Decision())


def test_place_limit_drops_the_preemptions_of_later_placements(perf) -> None:
    """With place_limit = 1 the round is the unlimited round's first placement and only the
    preemptions it needs: the second job's victim keeps running."""
    run = [job("long", 8, total=1e6, placement=Placement.of({1: 8}), start=0.0)]
    pend = [job("a", 8, total=10.0), job("b", 8, total=20.0)]
    pol = make_heuristic("srtf", perf)
    full = pol.schedule(state(C28, run, pend))
    assert full == Decision([("a", Placement.of({0: 8})), ("b", Placement.of({1: 8}))], ["long"])
    pol.place_limit = 1
    assert pol.schedule(state(C28, run, pend)) == Decision([("a", Placement.of({0: 8}))], [])
    pol.place_limit = 0
    assert pol.schedule(state(C28, run, pend)) == Decision()
    pol.place_limit = 2
    assert pol.schedule(state(C28, run, pend)) == full


def test_srtf_least_remaining_first(perf) -> None:
    pend = [job("c", 8, total=300.0), job("a", 8, total=100.0), job("b", 8, total=200.0)]
    pol = make_heuristic("srtf", perf)
    assert [j.job_id for j in sorted(pend, key=pol.order)] == ["a", "b", "c"]
    assert placed(pol.schedule(state(C18, [], pend))) == ["a"]


def test_equal_times_tie_by_submit_time_not_float_rounding(perf) -> None:
    """Two 1-hour jobs whose estimates differ only by float rounding (3600.0 vs 3599.9999999999995,
    as total_samples / best_thp gives for different models and demands): the earlier one first,
    as documented, for SRTF and SJF alike."""
    early, late = job("early", 8, submit=10.0, total=3600.0), job("late", 8, submit=20.0, total=3599.9999999999995)
    for name in ("srtf", "sjf", "greedy"):
        pol = make_heuristic(name, perf)
        assert [j.job_id for j in sorted([late, early], key=pol.order)] == ["early", "late"], name
        assert placed(pol.schedule(state(C18, [], [late, early]))) == ["early"], name


def test_greedy_sees_the_jobs_it_placed_earlier_in_the_round() -> None:
    """Both jobs start in one round on an idle 4x8 cluster: the 12-GPU MoE job must not be put beside the
    12-GPU FSDP job placed a moment before (the rule sees the round's own starts, not only the jobs running
    before the round). FSDP (placed first: submitted first, equal times) gets 8 + 4 on nodes 0 and 1;
    ``srtf:nosplit`` then packs MoE on node 2 and node 1's last 4 GPUs, greedy on nodes 2 and 3."""
    c48 = ClusterSpec.parse("4x8")
    perf48 = ContentionModel(c48)

    def one_hour(jid, model, gpus, submit):
        best = perf48.best_isolated_throughput(model, gpus)
        return JobInfo(jid, model, gpus, submit, 3600.0 * best, best_thp=best)

    pend = [one_hour("a", "FSDP", 12, 0.0), one_hour("b", "MoE", 12, 1.0)]
    st0 = ClusterState(0.0, c48, np.full(4, 8), [], pend)
    packed = dict(make_heuristic("srtf:nosplit", perf48).schedule(st0).place)
    assert packed == {"a": Placement.of({0: 8, 1: 4}), "b": Placement.of({1: 4, 2: 8})}
    dec = dict(make_heuristic("greedy", perf48).schedule(st0).place)
    assert dec == {"a": Placement.of({0: 8, 1: 4}), "b": Placement.of({2: 8, 3: 4})}


# ---------------------------------------------------------------------- LAS
def test_las_favours_least_attained_service(perf) -> None:
    pol = make_heuristic("las", perf)
    low, high = LAS_THRESHOLDS[0] / 2, LAS_THRESHOLDS[0] * 2
    pend = [
        job("old-heavy", 8, submit=0.0, attained=high, done=1.0),
        job("new-light", 8, submit=50.0, attained=low),
    ]
    assert placed(pol.schedule(state(C18, [], pend))) == ["new-light"]
    # Inside one queue: FIFO, not least-attained first.
    pend = [job("first", 8, submit=0.0, attained=low), job("second", 8, submit=1.0, attained=0.0)]
    assert placed(pol.schedule(state(C18, [], pend))) == ["first"]


def test_las_preempts_across_queues_only(perf) -> None:
    pol = make_heuristic("las", perf)
    run = [job("hog", 8, placement=Placement.of({0: 8}), start=0.0, attained=LAS_THRESHOLDS[0] + 1)]
    dec = pol.schedule(state(C18, run, [job("new", 8, submit=900.0, total=9e9)]))
    assert dec.preempt == ["hog"] and placed(dec) == ["new"]
    run = [job("same-queue", 8, placement=Placement.of({0: 8}), start=0.0, attained=LAS_THRESHOLDS[0] - 1)]
    assert pol.schedule(state(C18, run, [job("new", 8, submit=900.0, total=1.0)])) == Decision()


# ---------------------------------------------------------------------- new orders, one round
#: (policy, pending jobs as (id, GPUs, total samples, done samples, attained GPU-s), the job placed first).
#: A 1x8 cluster with every job asking for 8 GPUs: exactly one starts, the order's first.
#: best_thp = 1 sample/s, so times are samples: x has 100 s left of 1000 s, y 300 s of 300 s.
ORDER_CASES = [
    # lgtf: remaining time x GPUs: x 100 x 8 = 800 < y 300 x 8 = 2400 (same GPUs: as srtf)
    ("lgtf", [("x", 8, 1000.0, 900.0, 0.0), ("y", 8, 300.0, 0.0, 0.0)], "x"),
    # sif: the total ideal time, not what is left: y 300 < x 1000
    ("sif", [("x", 8, 1000.0, 900.0, 0.0), ("y", 8, 300.0, 0.0, 0.0)], "y"),
    ("srtf", [("x", 8, 1000.0, 900.0, 0.0), ("y", 8, 300.0, 0.0, 0.0)], "x"),
    # las2d: both below 3600 GPU-s are one queue: FIFO (x submitted first)
    ("las2d", [("x", 8, 1000.0, 900.0, 3000.0), ("y", 8, 300.0, 0.0, 0.0)], "x"),
    # las2d: x's 4000 GPU-s put it in the second queue (waited 1000 - 500 = 500 s <= 8 x 500 s run)
    ("las2d", [("x", 8, 1000.0, 900.0, 4000.0), ("y", 8, 300.0, 0.0, 0.0)], "y"),
]


@pytest.mark.parametrize("name, jobs, first", ORDER_CASES)
def test_order_table(perf, name, jobs, first) -> None:
    pend = [job(jid, g, submit=float(i), total=tot, done=done, attained=att)
            for i, (jid, g, tot, done, att) in enumerate(jobs)]
    assert placed(make_heuristic(name, perf).schedule(state(C18, [], pend))) == [first]


def test_lgtf_weighs_gpus_and_lrf_counts_them(perf) -> None:
    """2x8 with node 0 held by a running job (8 free GPUs, on node 1): a 1-GPU job of 1000 s (1000 GPU-s)
    and an 8-GPU job of 200 s (1600 GPU-s). lgtf starts the 1-GPU job (less GPU-time, though longer) and
    the 8-GPU job no longer fits beside it; srtf starts the 8-GPU job; lrf the 1-GPU job."""
    run = [job("r", 8, total=1e9, placement=Placement.of({0: 8}), start=1000.0)]
    pend = [job("long1", 1, total=1000.0), job("short8", 8, submit=1.0, total=200.0)]
    assert placed(make_heuristic("lgtf", perf).schedule(state(C28, run, pend))) == ["long1"]
    assert placed(make_heuristic("srtf", perf).schedule(state(C28, run, pend))) == ["short8"]
    assert placed(make_heuristic("lrf", perf).schedule(state(C28, run, pend))) == ["long1"]
    # lrf ignores time: fewer GPUs first even when much longer
    pend = [job("long1", 1, total=1e6, submit=5.0), job("short8", 8, total=1.0)]
    assert placed(make_heuristic("lrf", perf).schedule(state(C28, run, pend))) == ["long1"]


def test_las2d_promotes_a_starving_job_and_it_preempts(perf) -> None:
    """Tiresias' starvation rule: a job in the second queue that has waited more than PROMOTEKNOB times its
    run time goes back to the first queue, ahead of a later first-queue job, and may preempt a second-queue job."""
    g = 8
    ran = (LAS2D_THRESHOLDS[0] + 800.0) / g  # 550 s run: second queue
    # submitted at 0, ran 550 s; at t the wait is t - 550 s
    t_not = ran + LAS2D_PROMOTE_KNOB * ran  # waited exactly the limit: not yet
    old = job("old", g, submit=0.0, attained=ran * g, done=10.0, total=1e6)
    new = job("new", g, submit=100.0, total=1e6)
    assert placed(make_heuristic("las2d", perf).schedule(state(C18, [], [old, new], t=t_not))) == ["new"]
    assert placed(make_heuristic("las2d", perf).schedule(state(C18, [], [old, new], t=t_not + 1.0))) == ["old"]
    # the plain las order has no such rule
    assert placed(make_heuristic("las", perf).schedule(state(C18, [], [old, new], t=t_not + 1.0))) == ["new"]
    # promoted, it preempts a running job of the second queue (run >= min_run)
    hog = job("hog", g, placement=Placement.of({0: g}), start=0.0, attained=LAS2D_THRESHOLDS[0] + 1.0, total=1e9)
    dec = make_heuristic("las2d", perf).schedule(state(C18, [hog], [old], t=t_not + 1.0))
    assert dec.preempt == ["hog"] and placed(dec) == ["old"]
    # a running job is never promoted: its key is its queue
    dec = make_heuristic("las2d", perf).schedule(state(C18, [hog], [old], t=t_not))
    assert dec == Decision()


# ---------------------------------------------------------------------- whole traces, schedules by hand
def _hour_jobs(perf: ContentionModel, spec: list[tuple[str, int, float]]) -> list[JobSpec]:
    """MoE jobs submitted at t = 0 that run ``hours`` alone on their best placement."""
    return [JobSpec(jid, 0.0, "MoE", g, h * 3600.0 * perf.best_isolated_throughput("MoE", g)) for jid, g, h in spec]


#: 1x8 cluster, every job at t = 0, no two fit together (5 + 6 > 8): the order alone sets the sequence.
#: a 5 GPUs 1.2 h (6 GPU-h), b 6 GPUs 0.5 h (3), c 8 GPUs 1 h (8), d 8 GPUs 0.25 h (2).
TRACE_1X8 = [("a", 5, 1.2), ("b", 6, 0.5), ("c", 8, 1.0), ("d", 8, 0.25)]
#: policy -> {job: (start h, finish h)} worked out by hand (each job starts when the previous one ends)
TRACE_1X8_SCHEDULES = {
    # shortest ideal time: d .25, b .5, c 1, a 1.2
    "sif": {"d": (0.0, 0.25), "b": (0.25, 0.75), "c": (0.75, 1.75), "a": (1.75, 2.95)},
    "srtf": {"d": (0.0, 0.25), "b": (0.25, 0.75), "c": (0.75, 1.75), "a": (1.75, 2.95)},
    # least GPU-time: d 2, b 3, a 6, c 8
    "lgtf": {"d": (0.0, 0.25), "b": (0.25, 0.75), "a": (0.75, 1.95), "c": (1.95, 2.95)},
    # fewest GPUs: a 5, b 6, then c and d (8 each) in submit order (ties: job id)
    "lrf": {"a": (0.0, 1.2), "b": (1.2, 1.7), "c": (1.7, 2.7), "d": (2.7, 2.95)},
    "fifo": {"a": (0.0, 1.2), "b": (1.2, 1.7), "c": (1.7, 2.7), "d": (2.7, 2.95)},
}


@pytest.mark.parametrize("name", sorted(TRACE_1X8_SCHEDULES))
def test_orders_on_a_hand_made_trace(name) -> None:
    c18 = ClusterSpec.parse("1x8")
    perf18 = ContentionModel(c18)
    jobs = _hour_jobs(perf18, TRACE_1X8)
    res = Simulator(c18, jobs, make_heuristic(name, perf18), perf18, SimConfig()).run()
    got = {r.job_id: (r.first_start / 3600.0, r.finish_time / 3600.0) for r in res.jobs}
    want = TRACE_1X8_SCHEDULES[name]
    assert got == {k: pytest.approx(v, abs=1e-6) for k, v in want.items()}
    assert all(r.preemptions == 0 for r in res.jobs)


def test_nosplit_on_a_hand_made_trace() -> None:
    """2x8, at t = 0: z 4 GPUs 0.5 h, x and y 6 GPUs 1 h. SRTF places z (shortest) on node 0 and x on node 1;
    y (6) then has 4 + 2 free: pack splits it over both nodes at t = 0, nosplit waits for z to end and runs
    y on node 0 from 0.5 h to 1.5 h. SRTF with pack moves y onto one node once z ends (a preemptive heuristic
    consolidates), so y ends on one node after one preemption; with moves off it stays split."""
    c28 = ClusterSpec.parse("2x8")
    perf28 = ContentionModel(c28)
    jobs = _hour_jobs(perf28, [("x", 6, 1.0), ("y", 6, 1.0), ("z", 4, 0.5)])
    res = Simulator(c28, jobs, make_heuristic("srtf:nosplit", perf28), perf28, SimConfig()).run()
    got = {r.job_id: (r.first_start / 3600.0, r.finish_time / 3600.0, r.num_nodes) for r in res.jobs}
    assert got == {"z": (0.0, pytest.approx(0.5), 1), "x": (0.0, pytest.approx(1.0), 1),
                   "y": (pytest.approx(0.5), pytest.approx(1.5), 1)}
    res = Simulator(c28, jobs, make_heuristic("srtf", perf28), perf28, SimConfig()).run()
    y = next(r for r in res.jobs if r.job_id == "y")
    assert (y.first_start, y.num_nodes, y.preemptions) == (0.0, 1, 1)
    still = make_heuristic("srtf", perf28)
    still.consolidate = False
    res = Simulator(c28, jobs, still, perf28, SimConfig()).run()
    y = next(r for r in res.jobs if r.job_id == "y")
    assert (y.first_start, y.num_nodes, y.preemptions) == (0.0, 2, 0)
    # greedy keeps single-node jobs whole as nosplit does: the same schedule
    res = Simulator(c28, jobs, make_heuristic("greedy", perf28), perf28, SimConfig()).run()
    assert {r.job_id: (r.first_start, r.num_nodes) for r in res.jobs}["y"] == (pytest.approx(1800.0), 1)


# ---------------------------------------------------------------------- equivalence with a reference
def reference_schedule(pol: OrderedPolicy, st_: ClusterState) -> Decision:
    """The straightforward algorithm (no shortcuts): the optimised
    OrderedPolicy.schedule must return exactly this. A job that does not fit frees the
    lowest-priority victims one by one until it does, then preempts only those the placement
    needs: lowest priority first, a victim on a node that still lacks GPUs. GPUs on unusable
    nodes count for nothing; the round stops after place_limit placements."""
    dec = Decision()
    n_nodes = st_.cluster.num_nodes
    usable = np.ones(n_nodes, dtype=bool) if st_.usable is None else st_.usable
    free = np.where(usable, st_.free_gpus, 0).astype(np.int64)
    order = pol.order if pol.timed_order is None else pol.timed_order(st_.time)  # the round's key
    pending = sorted(st_.pending, key=order)
    running = list(st_.running)  # with this round's starts and preemptions (what greedy looks at)

    def now() -> ClusterState:
        return ClusterState(st_.time, st_.cluster, st_.free_gpus, running, st_.pending, st_.usable)

    def gain(v: JobInfo, arr: np.ndarray) -> None:
        for n, c in v.placement.alloc:
            if usable[n]:
                arr[n] += c

    victims = []
    if pol.preemptive:
        victims = sorted((j for j in st_.running if (j.start_time is None or st_.time - j.start_time >= pol.min_run)
                          and any(usable[n] for n in j.placement.nodes)),
                         key=order, reverse=True)
    for jb in pending:
        if pol.place_limit is not None and len(dec.place) >= pol.place_limit:
            break
        p = pol.placement(jb, free, now())
        if p is None and pol.preemptive and victims:
            key = order(jb)
            trial, chosen = free.copy(), []
            for v in victims:
                if not pol._lower(order(v)[0], key[0]):
                    break
                gain(v, trial)
                chosen.append(v)
                p = pol.placement(jb, trial, now())
                if p is not None:
                    have, kept = free.copy(), []
                    for x in chosen:
                        short = {n for n, c in p.alloc if have[n] < c}
                        if short & set(x.placement.nodes):
                            kept.append(x)
                            gain(x, have)
                    for x in kept:
                        dec.preempt.append(x.job_id)
                        victims.remove(x)
                        running.remove(x)
                        gain(x, free)
                    break
        if p is None:
            if pol.strict:
                break
            continue
        assert all(usable[n] for n in p.nodes)
        for n, c in p.alloc:
            free[n] -= c
        dec.place.append((jb.job_id, p))
        running.append(JobInfo(**{**jb.__dict__, "placement": p}))
    return dec


@st.composite
def random_states(draw) -> ClusterState:
    cluster = ClusterSpec.homogeneous(draw(st.integers(1, 4)), 8)
    free = np.array(cluster.gpus_per_node, dtype=np.int64)
    running = []
    for i in range(draw(st.integers(0, 6))):
        gpus = draw(st.sampled_from([1, 2, 4, 8, 16]))
        p = pack(job("x", gpus), free)
        if p is None:
            continue
        for n, c in p.alloc:
            free[n] -= c
        total = float(draw(st.integers(10, 10**5)))
        running.append(job(f"r{i}", gpus, submit=float(draw(st.integers(0, 500))), total=total,
                           done=total * draw(st.floats(0, 0.99)), placement=p,
                           start=float(draw(st.integers(0, 1000))),
                           attained=float(draw(st.sampled_from([0, 1000, 5000, 20000, 80000]))),
                           model=draw(st.sampled_from(["MoE", "FSDP", "GraphSage"]))))
    pending = [
        job(f"p{i}", draw(st.sampled_from([1, 2, 4, 8, 12, 16, 32])), submit=float(draw(st.integers(0, 1000))),
            total=float(draw(st.integers(10, 10**5))),
            attained=float(draw(st.sampled_from([0, 1000, 5000, 20000]))),
            model=draw(st.sampled_from(["MoE", "DLRM", "Transformer-XL"])))
        for i in range(draw(st.integers(0, 10)))
    ]
    pending = [j for j in pending if j.gpu_demand <= cluster.total_gpus]
    usable = None
    if draw(st.booleans()):  # some nodes drained or down (their free GPUs zeroed by ClusterState)
        usable = np.array([draw(st.booleans()) for _ in range(cluster.num_nodes)], dtype=bool)
    return ClusterState(1000.0, cluster, free, running, pending, usable)


@pytest.mark.parametrize("name", ["fifo", "sjf", "srtf", "las", "greedy", "srtf:spread", "las:spread", "las-np", "sjf:greedy",
                                  "lgtf", "las2d", "srtf:nosplit", "lrf:greedy", "las2d-np:nosplit"])
@settings(max_examples=60, deadline=None)
@given(st_=random_states())
def test_schedule_matches_reference(perf, name, st_) -> None:
    pol = make_heuristic(name, perf)
    assert pol.schedule(st_) == reference_schedule(pol, st_)
    for limit in (0, 1, 2):
        pol.place_limit = limit
        assert pol.schedule(st_) == reference_schedule(pol, st_)


@settings(max_examples=60, deadline=None)
@given(st_=random_states())
def test_decisions_are_applicable(perf, st_) -> None:
    """Preempt first, then place in order: every placement fits what is free then."""
    usable = np.ones(st_.cluster.num_nodes, dtype=bool) if st_.usable is None else st_.usable
    for name in ("srtf", "las", "greedy", "fifo:spread"):
        dec = make_heuristic(name, perf).schedule(st_)
        free = np.where(usable, st_.free_gpus, 0)  # an unusable node's GPUs never count
        by_id = {j.job_id: j for j in list(st_.running) + list(st_.pending)}
        for jid in dec.preempt:
            for n, c in by_id[jid].placement.alloc:
                free[n] += c if usable[n] else 0
        for jid, p in dec.place:
            assert p.total_gpus == by_id[jid].gpu_demand and p.fits(free)
            for n, c in p.alloc:
                free[n] -= c
        assert len(set(placed(dec))) == len(dec.place)


# ---------------------------------------------------------------------- bad job fields, usable mask
@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"done_samples": float("nan")}, r"job 'x': done_samples must be a finite number, got nan"),
        ({"total_samples": float("inf")}, r"job 'x': total_samples must be a finite number, got inf"),
        ({"submit_time": float("nan")}, r"job 'x': submit_time must be a finite number, got nan"),
        ({"attained_service": float("nan")}, r"job 'x': attained_service must be a finite number"),
        ({"best_thp": 0.0}, r"job 'x': best_thp must be > 0, got 0.0"),
        ({"best_thp": float("nan")}, r"job 'x': best_thp must be a finite number"),
        ({"gpu_demand": 2.5}, r"job 'x': gpu_demand must be an integer, got 2.5"),
        ({"gpu_demand": True}, r"job 'x': gpu_demand must be an integer, got True"),
        ({"gpu_demand": 0}, r"job 'x': gpu_demand must be >= 1, got 0"),
        ({"start_time": float("nan")}, r"job 'x': start_time must be a finite number or None, got nan"),
        ({"done_samples": "5"}, r"job 'x': done_samples must be a finite number, got '5'"),
    ],
)
def test_job_info_rejects_bad_fields(kw, msg) -> None:
    """A NaN done_samples (and the like) is refused where the job is built, naming the job and field, not
    later in SRTF or the encoder as an opaque 'cannot convert float NaN to integer'."""
    base = {"job_id": "x", "model": "MoE", "gpu_demand": 4, "submit_time": 0.0, "total_samples": 100.0}
    with pytest.raises(ValueError, match=msg):
        JobInfo(**{**base, **kw})


def test_job_info_accepts_numpy_numbers() -> None:
    j = JobInfo("x", "MoE", np.int64(4), np.float64(1.0), np.float32(100.0), done_samples=np.float64(1.0))
    assert j.remaining_samples == pytest.approx(99.0)


def test_cluster_state_usable_mask() -> None:
    """usable: None means every node; a mask zeroes the free GPUs of unusable nodes (on a copy) and must
    be one bool per node."""
    free = np.array([8, 8])
    st_ = ClusterState(0.0, C28, free, [], [])
    assert st_.usable is None and st_.total_free == 16
    st_ = ClusterState(0.0, C28, free, [], [], np.array([False, True]))
    assert st_.free_gpus.tolist() == [0, 8] and st_.total_free == 8 and free.tolist() == [8, 8]
    for bad in (np.array([True]), np.array([1, 0]), [True, False, True]):
        with pytest.raises(ValueError, match=r"usable must be a bool array of shape \(2,\)"):
            ClusterState(0.0, C28, free, [], [], bad)
    assert ClusterState(0.0, C28, free, [], [], [True, False]).free_gpus.tolist() == [8, 0]


@pytest.mark.parametrize("name", ["fifo", "srtf", "las", "greedy", "fifo:spread"])
def test_a_typed_job_is_placed_only_on_nodes_of_its_type(name: str) -> None:
    """On 2 K80 nodes then 2 V100 nodes, a job asking for V100s lands on V100 nodes only (where the
    type-blind rule would take node 0), and one asking for more V100s than are free waits although
    the cluster has that many GPUs free; an untyped job may go anywhere."""
    from dataclasses import replace

    from policies.resources import ResourceDemand

    cluster = ClusterSpec.parse("2x4:k80+2x4:v100")
    v2 = replace(job("v2", 2, submit=0.0), demand=ResourceDemand(2, gpu_type="v100"))
    plain = job("plain", 2, submit=1.0)
    v7 = replace(job("v7", 7, submit=2.0), demand=ResourceDemand(7, gpu_type="V100"))
    dec = make_heuristic(name, ContentionModel(cluster)).schedule(state(cluster, [], [v2, plain, v7]))
    where = dict(dec.place)
    assert set(where) == {"v2", "plain"}, dec
    assert set(where["v2"].nodes) <= {2, 3} and where["v2"].total_gpus == 2


_finite = st.floats(min_value=0.0, max_value=1e12, allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(total=_finite, done=_finite, best=st.floats(min_value=1e-9, max_value=1e9), submit=_finite)
def test_time_keys_are_time_key_of_the_estimates(total, done, best, submit) -> None:
    """``sjf`` and ``srtf`` keys (written out for speed) are time_key of JobInfo.total_time /
    remaining_time, float for float."""
    from policies.heuristics import ORDERS
    from policies.state import time_key

    j = JobInfo("j", "MoE", 1, submit, total, done_samples=done, best_thp=best)
    assert ORDERS["sjf"](j) == (time_key(j.total_time), submit, "j")
    assert ORDERS["srtf"](j) == (time_key(j.remaining_time), submit, "j")
