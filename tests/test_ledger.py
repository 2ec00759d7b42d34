"""Tests for policies.ledger: the contention rule, the incremental ledger and its oracle."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.cluster import Placement
from policies.ledger import (
    CONTENTION_RULES,
    CS_CAP,
    DS_CS_CAP,
    DS_MIN_RATIO,
    MIN_RATIO,
    ContentionLedger,
    LinkLoad,
    StaleLedgerError,
    cap_cs,
    check_contention,
    fair_share,
    job_cs,
    job_key,
    node_cs,
)
from policies.perf import ContentionModel
from policies.workloads import get_workload


class TablePerf:
    """pair_cs from a per-model excess table: CS(a | b) = 1 + X[a][b] when both span several nodes.
    Counts its calls (to check that the ledger stays local)."""

    X = {
        "MoE": {"MoE": 0.5, "FSDP": 0.75, "DLRM": 0.125},
        "FSDP": {"MoE": 0.25, "FSDP": 0.5, "DLRM": 0.0625},
        "DLRM": {"MoE": 0.0625, "FSDP": 0.03125, "DLRM": 0.015625},
    }

    def __init__(self) -> None:
        self.calls = 0

    def pair_cs(self, a, b) -> float:
        self.calls += 1
        if a[2] <= 1 or b[2] <= 1:
            return 1.0
        return 1.0 + self.X[a[0]][b[0]]


def P(*alloc: tuple[int, int]) -> Placement:
    return Placement.of(dict(alloc))


# ---------------------------------------------------------------------- the rule
@pytest.mark.parametrize(
    "me,per_node,want",
    [
        (("MoE", 8, 1), [[("MoE", 8, 2)]], 1.0),  # a single-node job never slows
        (("MoE", 8, 2), [], 1.0),  # no neighbours
        (("MoE", 8, 2), [[], []], 1.0),
        (("MoE", 8, 2), [[("MoE", 8, 2)], []], 1.5),
        (("MoE", 8, 2), [[("MoE", 8, 2), ("FSDP", 8, 2)], [("DLRM", 4, 2)]], 1 + 0.5 + 0.75),  # sum on a node
        (("MoE", 8, 2), [[("DLRM", 4, 2)], [("FSDP", 8, 2)]], 1.75),  # worst node
        (("MoE", 8, 2), [[("FSDP", 8, 1), ("DLRM", 4, 1)]], 1.0),  # single-node neighbours add nothing
        (("MoE", 16, 2), [[("MoE", 8, 2)] * 40], CS_CAP),  # capped
    ],
)
def test_job_cs_rule(me, per_node, want) -> None:
    assert job_cs(TablePerf(), me, per_node) == want


def test_node_cs_is_uncapped_and_cap_cs_caps() -> None:
    perf = TablePerf()
    assert node_cs(perf, ("MoE", 8, 2), [("MoE", 8, 2)] * 40) == 1 + 40 * 0.5
    assert cap_cs(21.0) == CS_CAP == 1.0 / MIN_RATIO
    assert cap_cs(1.25) == 1.25


class DsTablePerf(TablePerf):
    """:class:`TablePerf` under the ``ds-min`` rule."""

    contention = "ds-min"


@pytest.mark.parametrize(
    "me,per_node,want",
    [
        (("MoE", 8, 1), [[("MoE", 8, 2)]], 1.0),
        (("MoE", 8, 2), [[("MoE", 8, 2), ("FSDP", 8, 2)], [("DLRM", 4, 2)]], 1.75),  # worst pair, not the sum
        (("MoE", 8, 2), [[("DLRM", 4, 2)], [("MoE", 8, 2)]], 1.5),  # worst node
        (("MoE", 8, 2), [[("FSDP", 8, 1), ("DLRM", 4, 1)]], 1.0),
        (("MoE", 16, 2), [[("MoE", 8, 2)] * 40], 1.5),  # many neighbours: still the worst pair
    ],
)
def test_ds_min_rule(me, per_node, want) -> None:
    assert job_cs(DsTablePerf(), me, per_node) == want


def _deepshare_ratio(ratio: dict, me, per_node) -> float:
    """DeepShare's simulator (``update_shared_thp`` of its ``scheduler/cluster_env.py``), restated: per
    node, start at 1 and for every multi-node neighbour take ``max(min(current, ratio), 0.35)``; the
    job's ratio is the smallest over its nodes."""
    if me[2] <= 1:
        return 1.0
    job = 1.0
    for others in per_node:
        st_ = 1.0
        for o in others:
            if o[2] > 1:
                st_ = max(min(st_, ratio[(me, o)]), DS_MIN_RATIO)
        job = min(job, st_)
    return job


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_ds_min_is_deepshares_simulator_rule(data) -> None:
    model = _DS
    keys = sorted({a for a, _ in model.data.ratio})
    me = data.draw(st.sampled_from(keys))
    neighbour = st.sampled_from(keys + [("MoE", 4, 1)])
    per_node = data.draw(st.lists(st.lists(neighbour, max_size=5), min_size=1, max_size=4))
    want = 1.0 / _deepshare_ratio(model.data.ratio, me, per_node)
    assert job_cs(model, me, per_node) == pytest.approx(want, rel=1e-12)
    assert 1.0 <= job_cs(model, me, per_node) <= DS_CS_CAP


def test_unknown_contention_rule_is_one_line() -> None:
    assert CONTENTION_RULES == ("sum", "link", "ds-min")
    assert check_contention("link") == "link"
    with pytest.raises(ValueError, match=r"^unknown contention rule 'min': choose one of sum, link, ds-min$"):
        ContentionModel(contention="min")

    class Odd(TablePerf):
        contention = "min"

    with pytest.raises(ValueError, match="unknown contention rule 'min'"):
        job_cs(Odd(), ("MoE", 8, 2), [[("MoE", 8, 2)]])


def test_cap_cs_by_rule() -> None:
    assert cap_cs(21.0, DsTablePerf()) == DS_CS_CAP
    assert cap_cs(0.5, DsTablePerf()) == 1.0
    assert cap_cs(21.0, TablePerf()) == CS_CAP


def test_job_key_is_model_gpus_nodes() -> None:
    assert job_key("MoE", P((0, 8), (3, 4))) == ("MoE", 12, 2)


def test_perf_job_cs_is_the_ledger_rule() -> None:
    model = ContentionModel()
    me, b, c = ("MoE", 8, 2), ("FSDP", 8, 2), ("Transformer-XL", 4, 2)
    assert model.job_cs(me, [0, 1], {0: [b, c], 1: [c]}) == job_cs(model, me, [[b, c], [c]])
    assert model.node_cs(me, [b, c]) == node_cs(model, me, [b, c])


# ---------------------------------------------------------------------- the ledger, by hand
def test_add_remove_by_hand() -> None:
    perf = TablePerf()
    led = ContentionLedger(perf)
    assert led.add("a", "MoE", P((0, 4), (1, 4))) == set()
    assert led.cs("a") == 1.0
    assert led.add("single", "MoE", P((0, 2))) == set()  # single-node: on no link
    assert led.neighbours(0) == ("a",) and led.cs("single") == 1.0
    assert led.add("b", "FSDP", P((1, 2), (2, 2))) == {"a"}
    assert led.cs("a") == 1.75 and led.cs("b") == 1.25
    # b: node 1 (MoE: +0.25) is still worse than node 2 (DLRM: +0.0625), so its CS does not change
    assert led.add("c", "DLRM", P((2, 1), (3, 1))) == set()
    assert led.cs("b") == 1.25
    assert led.cs("c") == 1.03125
    assert led.neighbours(2) == ("b", "c") and led.load(2) == 2 and led.load(5) == 0
    assert led.loads() == {0: 1, 1: 2, 2: 2, 3: 1}
    assert led.remove("a") == {"b"}
    assert led.cs("b") == 1.0625
    assert led.remove("c") == {"b"}
    assert led.cs("b") == 1.0
    assert list(led) == ["single", "b"] and len(led) == 2 and "a" not in led
    led.check()


def test_unknown_and_duplicate_ids() -> None:
    led = ContentionLedger(TablePerf())
    led.add("a", "MoE", P((0, 8)))
    with pytest.raises(ValueError, match="already"):
        led.add("a", "MoE", P((1, 8)))
    with pytest.raises(KeyError, match="'b'"):
        led.remove("b")
    with pytest.raises(KeyError, match="'b'"):
        led.cs("b")


def test_link_load_sums_table_i_bandwidth() -> None:
    led = ContentionLedger(ContentionModel())
    led.add(1, "MoE", P((0, 4), (1, 4)))
    led.add(2, "FSDP", P((0, 2), (2, 2)))
    led.add(3, "DLRM", P((0, 8)))  # single-node: not on the link
    got = led.link_load(0)
    assert got == LinkLoad((1, 2), get_workload("MoE").bandwidth_mbps + get_workload("FSDP").bandwidth_mbps)
    assert got.bandwidth_mbps == pytest.approx(929.48 + 2672.40)
    assert led.link_load(5) == LinkLoad((), 0.0)


def test_real_model_cs_matches_measured_ratios() -> None:
    model = ContentionModel()
    r = model.data.ratio
    led = ContentionLedger(model)
    led.add("x", "MoE", P((0, 4), (1, 4)))
    led.add("y", "FSDP", P((1, 4), (2, 4)))
    assert led.cs("x") == pytest.approx(1 / r[(("MoE", 8, 2), ("FSDP", 8, 2))], rel=1e-12)
    assert led.cs("y") == pytest.approx(1 / r[(("FSDP", 8, 2), ("MoE", 8, 2))], rel=1e-12)


def test_what_if_prices_without_changing() -> None:
    perf = TablePerf()
    led = ContentionLedger(perf)
    led.add("a", "MoE", P((0, 4), (1, 4)))
    led.add("b", "FSDP", P((1, 4), (2, 4)))
    before = {k: led.cs(k) for k in led}
    cs_new, neigh = led.what_if("DLRM", P((1, 2), (2, 2)))
    assert {k: led.cs(k) for k in led} == before and len(led) == 2
    assert list(neigh) == ["a", "b"]  # node order, then add order on a node
    f = led.fork()
    assert f.add("new", "DLRM", P((1, 2), (2, 2))) == {"a", "b"}
    assert cs_new == f.cs("new") and neigh == {"a": f.cs("a"), "b": f.cs("b")}
    # single-node: CS 1, slows nobody
    assert led.what_if("MoE", P((1, 4))) == (1.0, {})
    # exclude leaves a job out (e.g. the job itself)
    cs_x, neigh_x = led.what_if("MoE", P((0, 4), (1, 4)), exclude="a")
    assert list(neigh_x) == ["b"] and cs_x == 1.75


# ---------------------------------------------------------------------- forks and copies
def test_fork_overlays_and_goes_stale() -> None:
    led = ContentionLedger(TablePerf())
    led.add("a", "MoE", P((0, 4), (1, 4)))
    led.add("b", "FSDP", P((1, 4), (2, 4)))
    f = led.fork()
    f.remove("a")
    f.add("c", "FSDP", P((2, 4), (3, 4)))
    assert list(f) == ["b", "c"] and len(f) == 2 and "a" not in f
    assert list(led) == ["a", "b"] and led.cs("b") == 1.25  # the origin is untouched
    assert f.cs("b") == 1.5
    f.check()
    g = f.fork()  # a fork of a fork: a snapshot of f
    g.remove("b")
    assert list(f) == ["b", "c"] and list(g) == ["c"]
    g.check()
    ro = led.fork(read_only=True)
    with pytest.raises(RuntimeError, match="read-only"):
        ro.add("z", "MoE", P((5, 8)))
    assert ro.fork().add("z", "MoE", P((5, 8))) == set()
    led.remove("b")
    assert not f.valid and not ro.valid and led.valid
    with pytest.raises(StaleLedgerError):
        f.cs("c")


def test_copy_is_independent() -> None:
    led = ContentionLedger(TablePerf())
    led.add("a", "MoE", P((0, 4), (1, 4)))
    c = led.copy()
    c.add("b", "MoE", P((1, 4), (2, 4)))
    assert led.cs("a") == 1.0 and c.cs("a") == 1.5
    led.remove("a")
    assert c.cs("a") == 1.5 and c.valid
    c.check()
    fc = c.fork()
    fc.remove("b")
    cc = fc.copy()
    assert list(cc) == ["a"] and cc.cs("a") == 1.0
    cc.check()


def test_from_jobs_takes_known_cs_without_computing() -> None:
    jobs = [("a", "MoE", P((0, 4), (1, 4)), 1.5), ("b", "MoE", P((1, 4), (2, 4)), 1.5), ("s", "FSDP", P((3, 2)), 9.0)]
    full = ContentionLedger.from_jobs(TablePerf(), jobs)
    perf = TablePerf()
    led = ContentionLedger.from_jobs(perf, jobs, known_cs=lambda info: info)
    assert perf.calls == 0  # the CS were taken, not computed
    assert [led.cs(k) for k in "abs"] == [full.cs(k) for k in "abs"] == [1.5, 1.5, 1.0]  # single-node: 1
    led.check(0.0)
    # a later add recomputes the jobs it touches by the rule
    assert led.add("c", "FSDP", P((2, 2), (3, 2))) == full.add("c", "FSDP", P((2, 2), (3, 2))) == {"b"}
    assert [led.cs(k) for k in "abc"] == [full.cs(k) for k in "abc"]
    led.check(0.0)


def test_check_finds_a_stale_cs() -> None:
    led = ContentionLedger(TablePerf())
    led.add("a", "MoE", P((0, 4), (1, 4)))
    led.add("b", "MoE", P((1, 4), (2, 4)))
    e = led._jobs["a"]
    led._set_cs("a", e, 1.0)  # corrupt it
    with pytest.raises(AssertionError, match="job 'a': CS 1.0, recomputed 1.5"):
        led.check()


def test_load_bytes_follow_forks_and_copies() -> None:
    led = ContentionLedger(TablePerf(), num_nodes=4)
    led.add("a", "MoE", P((0, 4), (1, 4)))
    led.add("s", "MoE", P((3, 8)))  # single-node: no link load
    assert led.load_bytes() == bytes([1, 1, 0, 0])
    f = led.fork()
    f.add("b", "FSDP", P((1, 2), (2, 2)))
    g = f.fork()
    f.remove("a")
    assert f.load_bytes() == bytes([0, 1, 1, 0]) and g.load_bytes() == bytes([1, 2, 1, 0])
    assert led.load_bytes() == bytes([1, 1, 0, 0]) and led.copy().load_bytes() == bytes([1, 1, 0, 0])
    with pytest.raises(ValueError, match="beyond the ledger's 4"):
        led.add("far", "MoE", P((3, 4), (4, 4)))


def test_spans_count_multi_node_jobs_through_forks_and_copies() -> None:
    led = ContentionLedger(TablePerf(), num_nodes=4)
    led.add("a", "MoE", P((0, 4), (1, 4)))
    led.add("b", "FSDP", P((1, 2), (2, 2)))
    led.add("s", "MoE", P((3, 8)))  # single-node: no shape
    assert led.spans() == {(8, 2): 1, (4, 2): 1}
    f = led.fork()
    f.remove("a")
    g = f.fork()
    f.add("c", "DLRM", P((0, 1), (2, 1), (3, 1)))
    assert f.spans() == {(4, 2): 1, (3, 3): 1} and g.spans() == {(4, 2): 1}
    assert led.spans() == {(8, 2): 1, (4, 2): 1} and led.copy().spans() == led.spans()
    f.check()
    led.remove("b")
    assert led.spans() == {(8, 2): 1}
    led.check()


def test_add_and_remove_stay_local() -> None:
    """A change prices only the jobs on the changed job's nodes, however many run elsewhere."""
    perf = TablePerf()
    led = ContentionLedger(perf)
    for i in range(2000):  # 2000 pairs of multi-node jobs, each pair on its own two nodes
        led.add(("x", i), "MoE", P((2 * i, 4), (2 * i + 1, 4)))
        led.add(("y", i), "FSDP", P((2 * i, 4), (2 * i + 1, 4)))
    perf.calls = 0
    assert led.add("new", "DLRM", P((10, 2), (11, 2))) == {("x", 5), ("y", 5)}
    assert led.remove(("x", 7)) == {("y", 7)}
    assert perf.calls <= 20


# ---------------------------------------------------------------------- property: incremental == recomputed
MODELS3 = ("MoE", "FSDP", "DLRM")
NODES = 6

op = st.one_of(
    st.tuples(
        st.just("add"),
        st.sampled_from(MODELS3),
        st.dictionaries(st.integers(0, NODES - 1), st.integers(1, 8), min_size=1, max_size=4),
    ),
    st.tuples(st.just("remove"), st.integers(0, 1000)),
    st.tuples(st.just("fork"), st.booleans()),
)


def _brute_cs(perf, jobs: dict, jid) -> float:
    """CS of one job from the jobs' placements alone, by the rule in the docs."""
    model, p = jobs[jid]
    me = job_key(model, p)
    if me[2] <= 1:
        return 1.0
    order = list(jobs)
    per_node = []
    for v in p.nodes:
        per_node.append([job_key(m, q) for o, (m, q) in ((o, jobs[o]) for o in order)
                         if o != jid and q.num_nodes > 1 and v in q.nodes])
    return job_cs(perf, me, per_node)


@settings(max_examples=150, deadline=None)
@given(st.lists(op, max_size=40), st.sampled_from(["table", "ds-table", "real", "ds-min", "link"]),
       st.sampled_from([None, NODES]))
def test_incremental_equals_recompute(ops, which, num_nodes) -> None:
    perf = {"table": TablePerf(), "ds-table": DsTablePerf(), "real": _REAL, "ds-min": _DS, "link": _LINK}[which]
    led = ContentionLedger(perf, num_nodes)
    jobs: dict = {}  # the model: id -> (model, placement), in add order
    nxt = 0
    for o in ops:
        if o[0] == "add":
            p = Placement.of(o[2])
            before = {k: led.cs(k) for k in jobs}
            changed = led.add(nxt, o[1], p)
            jobs[nxt] = (o[1], p)
            nxt += 1
        elif o[0] == "remove":
            if not jobs:
                continue
            k = list(jobs)[o[1] % len(jobs)]
            before = {j: led.cs(j) for j in jobs if j != k}
            changed = led.remove(k)
            del jobs[k]
        else:  # continue on a fork (sometimes of a fork) of the ledger so far
            led = led.fork() if o[1] else led.copy()
            continue
        assert changed == {k for k in before if k in jobs and led.cs(k) != before[k]}
        assert list(led) == list(jobs) and len(led) == len(jobs)
        for k in jobs:
            assert math.isclose(led.cs(k), _brute_cs(perf, jobs, k), rel_tol=1e-12)
        for v in range(NODES):
            assert led.neighbours(v) == tuple(k for k, (m, q) in jobs.items() if q.num_nodes > 1 and v in q.nodes)
        if num_nodes is None:
            assert led.load_bytes() is None
        else:
            assert list(led.load_bytes()) == [led.load(v) for v in range(NODES)]
        led.check()


_REAL = ContentionModel()
_DS = ContentionModel(contention="ds-min")
_LINK = ContentionModel(contention="link")
_RULES = {"sum": _REAL, "ds-min": _DS, "link": _LINK}


def _progressive_filling(capacity: float, demands: list[float]) -> list[float]:
    """Max-min fair shares by progressive filling, written independently of :func:`fair_share`: raise
    every unsatisfied flow's rate together until the capacity is used or each flow has its demand."""
    rate = [0.0] * len(demands)
    active = [i for i, d in enumerate(demands) if d > 0]
    left = capacity
    while active and left > 1e-12 * capacity:
        inc = min(left / len(active), min(demands[i] - rate[i] for i in active))
        for i in active:
            rate[i] += inc
        left -= inc * len(active)
        active = [i for i in active if demands[i] - rate[i] > 1e-12 * demands[i]]
    return rate


@settings(max_examples=300, deadline=None)
@given(st.floats(1.0, 1e4), st.lists(st.floats(0.0, 2e4), min_size=1, max_size=8))
def test_fair_share_is_max_min_fair(capacity, demands) -> None:
    shares = [fair_share(capacity, d, demands[:i] + demands[i + 1:]) for i, d in enumerate(demands)]
    want = _progressive_filling(capacity, demands)
    for got, w, d in zip(shares, want, demands):
        assert got == pytest.approx(w, rel=1e-9, abs=1e-9 * capacity)
        assert got <= d
    assert sum(shares) <= capacity * (1 + 1e-12) or sum(shares) == pytest.approx(sum(demands))
    # the order of the others does not matter
    assert fair_share(capacity, demands[0], demands[1:]) == fair_share(capacity, demands[0], demands[:0:-1])


@pytest.mark.parametrize("rule", CONTENTION_RULES)
def test_what_if_and_fork_for_every_rule(rule) -> None:
    """``what_if`` prices exactly what adding on a fork gives, and a fork leaves its origin alone, under every rule."""
    perf = _RULES[rule]
    led = ContentionLedger(perf, 8)
    led.add("a", "MoE", P((0, 4), (1, 4)))
    led.add("b", "FSDP", P((1, 2), (2, 2)))
    led.add("c", "Transformer-XL", P((0, 2), (2, 2), (3, 2)))
    before = {k: led.cs(k) for k in led}
    cs_new, others = led.what_if("DLRM", P((0, 2), (1, 2)))
    f = led.fork()
    f.add("new", "DLRM", P((0, 2), (1, 2)))
    assert f.cs("new") == cs_new
    assert others == {k: f.cs(k) for k in ("a", "b", "c") if k in others} and set(others) == {"a", "b", "c"}
    assert {k: led.cs(k) for k in led} == before
    f.check()
    f.remove("a")
    f.check()
    assert led.what_if("DLRM", P((0, 2), (1, 2)), exclude="a")[0] == f.cs("new")


# ---------------------------------------------------------------------- the ledger a state carries
def _running(perf) -> list:
    from policies.state import JobInfo

    def j(jid, model, alloc):
        p = Placement.of(alloc)
        return JobInfo(jid, model, p.total_gpus, 0.0, 1e6, placement=p, best_thp=perf.best_isolated_throughput(model, p.total_gpus))

    return [j("a", "MoE", {0: 4, 1: 4}), j("b", "FSDP", {1: 4, 2: 4}), j("c", "DLRM", {3: 8}), j("d", "MoE", {2: 4, 3: 4})]


def test_state_contention_is_built_once_and_read_only() -> None:
    import numpy as np

    from policies.cluster import ClusterSpec
    from policies.state import ClusterState

    perf = ContentionModel()
    running = _running(perf)
    st_ = ClusterState(0.0, ClusterSpec.parse("4x8"), np.zeros(4, dtype=np.int64), running, [])
    led = st_.contention(perf)
    assert led is st_.contention(perf) and list(led) == ["a", "b", "c", "d"]
    assert led.info("b") is running[1]
    ref = ContentionLedger(perf)
    for r in running:
        ref.add(r.job_id, r.model, r.placement)
    assert all(led.cs(k) == ref.cs(k) for k in ref)
    with pytest.raises(RuntimeError, match="read-only"):
        led.remove("a")
    assert st_.contention(ContentionModel()) is not led  # another model: its own ledger


def test_with_running_carries_the_ledger_incrementally() -> None:
    import numpy as np

    from policies.cluster import ClusterSpec
    from policies.state import ClusterState, JobInfo

    perf = ContentionModel()
    running = _running(perf)
    st_ = ClusterState(0.0, ClusterSpec.parse("4x8"), np.zeros(4, dtype=np.int64), running, [])
    before = st_.contention(perf)
    new = JobInfo("n", "FSDP", 8, 0.0, 1e6, placement=Placement.of({0: 4, 3: 4}), best_thp=1.0)
    nxt = st_.with_running(add=[new]).with_running(remove=[running[0]])
    assert [j.job_id for j in nxt.running] == ["b", "c", "d", "n"] and len(nxt.running) == 4
    assert [j.job_id for j in st_.running] == ["a", "b", "c", "d"]  # the original is unchanged
    got = nxt.contention(perf)
    fresh = ClusterState(0.0, st_.cluster, st_.free_gpus, list(nxt.running), []).contention(perf)
    assert list(got) == list(fresh) and all(got.cs(k) == fresh.cs(k) for k in fresh)
    assert before.valid and list(before) == ["a", "b", "c", "d"]
    got.check()
    # the shapes of the multi-node jobs: from the ledger kept with a state, or counted from `running`
    plain = ClusterState(0.0, st_.cluster, st_.free_gpus, list(nxt.running), [])
    assert nxt.spans() == plain.spans() == got.spans()


def test_simulator_hands_its_ledger_and_an_old_state_rebuilds_its_own() -> None:
    from policies.cluster import ClusterSpec
    from policies.job import JobSpec
    from trainer.simulator import Simulator

    cluster = ClusterSpec.parse("4x8")
    perf = ContentionModel(cluster)
    jobs = [JobSpec(n, 0.0, m, 8, 1e6) for n, m in (("a", "MoE"), ("b", "FSDP"), ("c", "MoE"))]
    sim = Simulator(cluster, jobs, None, perf)
    sim.reset_state()
    sim.advance_to_next_event()
    sim.start("a", Placement.of({0: 4, 1: 4}))
    sim.start("b", Placement.of({1: 4, 2: 4}))
    st_ = sim.state()
    led = st_.contention(perf)
    assert list(led) == ["a", "b"] and led.cs("a") == sim.ledger.cs("a") > 1.0
    st2 = sim.state()
    sim.start("c", Placement.of({2: 4, 3: 4}))  # the simulator's ledger moves on
    assert not led.valid
    own = st2.contention(perf)  # built from st2's running jobs (a, b), not the simulator's (a, b, c)
    assert list(own) == ["a", "b"] and own.cs("b") == pytest.approx(perf.pair_cs(("FSDP", 8, 2), ("MoE", 8, 2)))


class OrderPerf:
    """pair_cs whose excesses (by the other job's model) sum to different floats in different orders."""

    X = {"MoE": 1.62, "FSDP": 2.82, "DLRM": 1.14}

    def pair_cs(self, a, b) -> float:
        if a[2] <= 1 or b[2] <= 1:
            return 1.0
        return 1.0 + self.X[b[0]]


def test_price_sums_in_add_order_or_by_job_id() -> None:
    perf = OrderPerf()
    led = ContentionLedger(perf, 4)
    # added in the order c, b, a; by id the order is a (MoE), b (FSDP), c (DLRM)
    led.add("c", "DLRM", P((0, 2), (1, 2)))
    led.add("b", "FSDP", P((0, 2), (1, 2)))
    led.add("a", "MoE", P((0, 2), (1, 2)))
    led.add("single", "DLRM", P((0, 1)))  # on no link: not a neighbour
    assert led.node_keys(0) == (("DLRM", 4, 2), ("FSDP", 4, 2), ("MoE", 4, 2))
    assert led.node_keys(0, by_id=True) == (("MoE", 4, 2), ("FSDP", 4, 2), ("DLRM", 4, 2))
    assert led.node_keys(2) == ()
    p = P((0, 1), (1, 1))
    me = ("MoE", 2, 2)
    added = node_cs(perf, me, led.node_keys(0))
    by_id = node_cs(perf, me, led.node_keys(0, by_id=True))
    assert added == 1.0 + ((1.14 + 2.82) + 1.62) and by_id == 1.0 + ((1.62 + 2.82) + 1.14)
    assert added != by_id  # the two orders round differently: the test tells them apart
    assert led.price("MoE", p) == added == led.what_if("MoE", p)[0]
    assert led.price("MoE", p, by_id=True) == by_id
    # leaving a job out
    assert led.price("MoE", p, exclude="b", by_id=True) == led.what_if("MoE", p, exclude="b")[0] == 1.0 + (1.62 + 1.14)
    # a single-node newcomer is never slowed; pricing changes nothing
    assert led.price("MoE", P((3, 4)), by_id=True) == 1.0
    led.check()
    # a fork prices what it holds, in job-id order whatever the adds
    f = led.fork()
    f.remove("c")
    f.add("c", "DLRM", P((0, 2), (1, 2)))
    assert f.node_keys(0, by_id=True) == led.node_keys(0, by_id=True)
    assert f.price("MoE", p, by_id=True) == by_id


def test_copy_of_an_unchanged_fork_is_its_origin_and_independent() -> None:
    led = ContentionLedger(TablePerf(), 4)
    led.add("x", "MoE", P((0, 2), (1, 2)))
    led.add("y", "FSDP", P((1, 2), (2, 2)))
    led.add("s", "DLRM", P((3, 1)))
    f = led.fork(read_only=True)
    c = f.copy()
    assert list(c) == list(led) and c.loads() == led.loads() and c.load_bytes() == led.load_bytes()
    assert [c.cs(j) for j in c] == [led.cs(j) for j in led]
    c.check()
    c.add("z", "MoE", P((0, 1), (1, 1)))  # the copy changes; the origin and its fork do not
    assert "z" not in led and f.valid and led.load(1) == 2 and c.load(1) == 3
