"""Tests for policies.placement: pack (SCED2), spread, contention-aware greedy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.cluster import ClusterSpec, NodeSpec, Placement
from policies.perf import ContentionModel
from policies.placement import (
    PLACEMENT_RULES,
    ContentionAwarePlacement,
    FloorPacking,
    balanced_by_load,
    balanced_candidates,
    pack,
    quiet_counts,
    spread,
)
from policies.state import ClusterState, JobInfo

C48 = ClusterSpec.parse("4x8")


@pytest.fixture(scope="module")
def perf() -> ContentionModel:
    return ContentionModel(C48)


def info(jid: str, gpus: int, model: str = "MoE", placement: Placement | None = None, perf: ContentionModel | None = None) -> JobInfo:
    best = perf.best_isolated_throughput(model, gpus) if perf else 1.0
    return JobInfo(jid, model, gpus, 0.0, 1e6, placement=placement, best_thp=best, start_time=0.0 if placement else None)


def free_after(running: list[JobInfo], cluster: ClusterSpec = C48) -> np.ndarray:
    free = np.array(cluster.gpus_per_node, dtype=np.int64)
    for j in running:
        for n, c in j.placement.alloc:  # type: ignore[union-attr]
            free[n] -= c
    assert (free >= 0).all()
    return free


def beside_fsdp(shape: str, demand: int, perf: ContentionModel):
    """An FSDP job on 4 + 4 GPUs of nodes 0 and 1 of a ``shape`` cluster and a waiting
    ``demand``-GPU MoE job: ``(cluster, its perf model, free GPUs, state, the waiting job)``."""
    running = [info("fsdp", 8, "FSDP", Placement.of({0: 4, 1: 4}), perf)]
    cluster = ClusterSpec.parse(shape)
    cperf = ContentionModel(cluster)
    free = free_after(running, cluster)
    new = info("new", demand, "MoE", perf=cperf)
    return cluster, cperf, free, ClusterState(0.0, cluster, free, running, [new]), new


# ---------------------------------------------------------------------- pack
def test_pack_best_fit_single_node() -> None:
    # Nodes with >= 4 free: 0 (8), 2 (4), 3 (6): the fullest that fits is 2.
    assert pack(info("j", 4), np.array([8, 3, 4, 6])) == Placement.of({2: 4})
    # Ties go to the lowest index.
    assert pack(info("j", 2), np.array([8, 5, 5, 1])) == Placement.of({1: 2})


def test_pack_sced2_multi_node() -> None:
    # 12 GPUs, no node has 12: take the node with most free (0: 8), then the
    # best fit for the remaining 4 (node 2 with exactly 4).
    assert pack(info("j", 12), np.array([8, 5, 4, 6])) == Placement.of({0: 8, 2: 4})
    # 20 GPUs over [8, 5, 4, 6]: 8 (node 0), then 6 (node 3), then 6 left:
    # no node has 6, take node 1 (5), then best fit for 1: node 2.
    assert pack(info("j", 20), np.array([8, 5, 4, 6])) == Placement.of({0: 8, 3: 6, 1: 5, 2: 1})


def test_pack_does_not_fit() -> None:
    assert pack(info("j", 9), np.array([4, 4])) is None
    assert pack(info("j", 1), np.array([0, 0])) is None


def test_pack_does_not_mutate_free() -> None:
    free = np.array([8, 5, 4, 6])
    pack(info("j", 12), free)
    spread(info("j", 12), free)
    assert free.tolist() == [8, 5, 4, 6]


# ---------------------------------------------------------------------- spread
def test_spread_uses_most_nodes_on_empty_cluster() -> None:
    free = np.array([8, 8, 8, 8])
    assert spread(info("j", 4), free) == Placement.of({0: 1, 1: 1, 2: 1, 3: 1})
    assert spread(info("j", 8), free) == Placement.of({0: 2, 1: 2, 2: 2, 3: 2})
    assert spread(info("j", 2), free).num_nodes == 2
    assert pack(info("j", 8), free).num_nodes == 1


def test_spread_water_fills() -> None:
    # One GPU at a time to the node with most free (lowest index on ties).
    assert spread(info("j", 4), np.array([8, 5, 4, 6])) == Placement.of({0: 3, 3: 1})


@st.composite
def free_and_demand(draw):
    free = np.array(draw(st.lists(st.integers(0, 8), min_size=1, max_size=8)), dtype=np.int64)
    demand = draw(st.integers(1, max(1, int(free.sum()) + 2)))
    return free, demand


@settings(max_examples=200, deadline=None)
@given(fd=free_and_demand())
def test_pack_and_spread_properties(fd) -> None:
    free, demand = fd
    j = info("j", demand)
    p, s = pack(j, free), spread(j, free)
    if demand > free.sum():
        assert p is None and s is None
        return
    for pl in (p, s):
        assert pl is not None and pl.total_gpus == demand and pl.fits(free)
    # Pack uses the fewest nodes possible: k = smallest count of the largest nodes covering the demand.
    caps = np.sort(free)[::-1]
    k = int(np.searchsorted(np.cumsum(caps), demand) + 1)
    assert p.num_nodes == k
    # Spread never uses fewer nodes than pack, and uses min(demand, nodes with free GPUs) when all are equal.
    assert s.num_nodes >= p.num_nodes
    if k == 1:
        # Best fit: no node that fits has fewer free GPUs than the chosen one.
        (node,) = p.nodes
        assert free[node] == min(f for f in free if f >= demand)


def test_balanced_candidates() -> None:
    free = np.array([8, 8, 8, 8])
    cands = balanced_candidates(8, free, np.arange(4))
    shapes = [c.shape for c in cands]
    # 8 GPUs: 1 x 8, 2 x 4, 3 x (3, 3, 2), 4 x 2; 5+ nodes would leave one empty / exceed the cluster.
    assert shapes == [(8, 1), (8, 2), (8, 3), (8, 4)]
    assert cands[2] == Placement.of({0: 3, 1: 3, 2: 2})
    # Nodes follow the preference order.
    assert balanced_candidates(4, free, np.array([3, 2, 1, 0]))[1] == Placement.of({3: 2, 2: 2})


# ---------------------------------------------------------------------- greedy
def test_greedy_prefers_single_node(perf: ContentionModel) -> None:
    rule = ContentionAwarePlacement(perf)
    state = ClusterState(0.0, C48, np.array([8, 8, 8, 8]), [], [])
    p = rule(info("new", 8, "MoE", perf=perf), state.free_gpus, state)
    assert p is not None and p.num_nodes == 1


def test_greedy_avoids_co_locating_heavy_multi_node_jobs(perf: ContentionModel) -> None:
    # A heavy FSDP job spans nodes 0 and 1; single-node jobs fill half of
    # nodes 2 and 3. A new 8-GPU MoE job must span two nodes: pack puts it
    # on nodes 0 + 1 (beside the FSDP job), greedy on 2 + 3 (no contention).
    running = [
        info("fsdp", 8, "FSDP", Placement.of({0: 4, 1: 4}), perf),
        info("g1", 4, "GraphSage", Placement.of({2: 4}), perf),
        info("g2", 4, "GraphSage", Placement.of({3: 4}), perf),
    ]
    free = free_after(running)
    assert free.tolist() == [4, 4, 4, 4]
    new = info("new", 8, "MoE", perf=perf)
    state = ClusterState(0.0, C48, free, running, [new])
    packed = pack(new, free)
    assert packed == Placement.of({0: 4, 1: 4})
    greedy = ContentionAwarePlacement(perf)(new, free, state)
    assert greedy is not None and greedy.num_nodes == 2
    assert set(greedy.nodes) == {2, 3}
    # The score says why: packing next to FSDP costs both jobs speed.
    rule = ContentionAwarePlacement(perf)
    assert rule.score(new, greedy, state) > rule.score(new, packed, state)


def test_greedy_accepts_contention_when_no_alternative(perf: ContentionModel) -> None:
    running = [info("fsdp", 8, "FSDP", Placement.of({0: 4, 1: 4}), perf)]
    cluster = ClusterSpec.parse("2x8")
    free = free_after(running, cluster)
    new = info("new", 8, "MoE", perf=perf)
    state = ClusterState(0.0, cluster, free, running, [new])
    p = ContentionAwarePlacement(ContentionModel(cluster))(new, free, state)
    assert p == Placement.of({0: 4, 1: 4})


def test_greedy_returns_none_when_full(perf: ContentionModel) -> None:
    state = ClusterState(0.0, C48, np.array([1, 1, 1, 0]), [], [])
    assert ContentionAwarePlacement(perf)(info("x", 4), state.free_gpus, state) is None


def test_greedy_efficiency_floor(perf: ContentionModel) -> None:
    """With a floor, the rule refuses a placement whose net effective GPUs per GPU is below it."""
    cluster, cperf, free, state, new = beside_fsdp("2x8", 8, perf)
    p = ContentionAwarePlacement(cperf)(new, free, state)
    assert p is not None
    eff = ContentionAwarePlacement(cperf).score(new, p, state) / new.gpu_demand
    assert 0.0 < eff < 1.0  # split next to FSDP: slower than alone on one node
    assert ContentionAwarePlacement(cperf, min_efficiency=eff - 1e-3)(new, free, state) == p
    assert ContentionAwarePlacement(cperf, min_efficiency=min(1.0, eff + 1e-3))(new, free, state) is None
    # a single-node placement on an empty node is always admitted (efficiency 1)
    empty = ClusterState(0.0, cluster, np.array([8, 8]), [], [new])
    assert ContentionAwarePlacement(cperf, min_efficiency=1.0)(new, empty.free_gpus, empty) is not None
    with pytest.raises(ValueError, match="min_efficiency"):
        ContentionAwarePlacement(cperf, min_efficiency=1.5)


# ---------------------------------------------------------------------- floor packing (rl-hybrid's rule)
def test_floor_packing_keeps_single_node_jobs_whole(perf: ContentionModel) -> None:
    """A job of at most one node's GPUs goes whole to the best-fitting node, or waits; pack would split it."""
    state = ClusterState(0.0, C48, np.array([3, 3, 2, 0]), [], [])
    job = info("x", 4)
    assert pack(job, state.free_gpus) is not None and pack(job, state.free_gpus).num_nodes == 2
    assert FloorPacking(perf)(job, state.free_gpus, state) is None
    state = ClusterState(0.0, C48, np.array([5, 8, 4, 6]), [], [])
    assert FloorPacking(perf)(job, state.free_gpus, state) == Placement.of({2: 4})  # best fit
    # larger jobs: exactly pack's placement
    big = info("big", 20)
    assert FloorPacking(perf)(big, state.free_gpus, state) == pack(big, state.free_gpus)
    assert FloorPacking(perf)(info("huge", 24), state.free_gpus, state) is None  # 23 free
    assert state.free_gpus.tolist() == [5, 8, 4, 6]  # never mutated


def test_floor_packing_floor(perf: ContentionModel) -> None:
    """With a floor it refuses the packing placement whose net effective GPUs per GPU is below it."""
    _cluster, cperf, free, state, new = beside_fsdp("3x8", 12, perf)
    p = FloorPacking(cperf)(new, free, state)
    assert p == Placement.of({2: 8, 0: 4})  # the free node, then beside FSDP
    eff = FloorPacking(cperf).score(new, p, state) / new.gpu_demand
    assert eff == ContentionAwarePlacement(cperf).score(new, p, state) / new.gpu_demand
    assert 0.0 < eff < 1.0
    assert FloorPacking(cperf, min_efficiency=eff - 1e-3)(new, free, state) == p
    assert FloorPacking(cperf, min_efficiency=min(1.0, eff + 1e-3))(new, free, state) is None
    with pytest.raises(ValueError, match="min_efficiency"):
        FloorPacking(cperf, min_efficiency=-0.1)


# ---------------------------------------------------------------------- nosplit (worked out by hand)
#: (free GPUs per node of a 4x8 cluster, demand, the nosplit placement or None)
NOSPLIT_CASES = [
    ([8, 8, 8, 8], 3, {0: 3}),  # every node fits: the lowest index
    ([5, 8, 4, 6], 4, {2: 4}),  # best fit: the node with the fewest free GPUs that holds it
    ([3, 3, 2, 0], 4, None),  # 8 free but no node holds 4: it waits (pack would take 3 + 1)
    ([7, 7, 7, 7], 8, None),  # a whole-node job never spans two nodes
    ([8, 2, 8, 8], 10, {0: 8, 1: 2}),  # 2 nodes: the fullest node whole, then the best fit for the rest
    ([6, 6, 6, 6], 12, {0: 6, 1: 6}),  # 2 nodes is the fewest
    ([8, 6, 4, 3], 16, {0: 8, 1: 6, 3: 2}),  # 8 + 6 < 16: 3 nodes, the rest on the best fit
    ([4, 4, 4, 4], 16, {0: 4, 1: 4, 2: 4, 3: 4}),
    ([4, 4, 4, 3], 16, None),  # 15 free
]


@pytest.mark.parametrize("free, gpus, want", NOSPLIT_CASES)
def test_nosplit_table(perf: ContentionModel, free, gpus, want) -> None:
    rule = PLACEMENT_RULES["nosplit"](perf)
    assert isinstance(rule, FloorPacking) and not rule.uses_running
    f = np.array(free, dtype=np.int64)
    state = ClusterState(0.0, C48, f.copy(), [], [])
    got = rule(info("j", gpus), f, state)
    assert got == (None if want is None else Placement.of(want))
    assert f.tolist() == free


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 8), min_size=4, max_size=4), st.integers(9, 32))
def test_nosplit_uses_the_fewest_nodes(free, gpus) -> None:
    """A job larger than a node takes the fewest nodes the free GPUs allow (the fullest nodes first)."""
    f = np.array(free, dtype=np.int64)
    state = ClusterState(0.0, C48, f.copy(), [], [])
    p = FloorPacking(ContentionModel(C48))(info("j", gpus), f, state)
    if sum(free) < gpus:
        assert p is None
        return
    fewest = int(np.searchsorted(np.cumsum(sorted(free, reverse=True)), gpus)) + 1
    assert p is not None and p.total_gpus == gpus and p.num_nodes == fewest


def test_greedy_is_nosplit_with_contention_aware_multi_node_choice(perf: ContentionModel) -> None:
    """``greedy``'s placement: single-node jobs exactly as ``nosplit``; a multi-node job on the fewest nodes,
    away from the running multi-node jobs when such a placement exists."""
    rule = PLACEMENT_RULES["greedy"](perf)
    assert isinstance(rule, ContentionAwarePlacement) and rule.nosplit
    for free, gpus, want in NOSPLIT_CASES:
        f = np.array(free, dtype=np.int64)
        state = ClusterState(0.0, C48, f.copy(), [], [])
        # no job runs: nothing to avoid, so the nosplit placement
        assert rule(info("j", gpus, perf=perf), f, state) == (None if want is None else Placement.of(want)), (free, gpus)
    # An FSDP job on 8 + 4 GPUs of nodes 0 and 1; a 12-GPU MoE job: pack takes node 2 whole and the 4 free GPUs
    # of node 1 (beside FSDP); greedy takes 8 + 4 on nodes 2 and 3, also 2 nodes, without contention.
    running = [info("fsdp", 12, "FSDP", Placement.of({0: 8, 1: 4}), perf)]
    free = free_after(running)
    new = info("new", 12, "MoE", perf=perf)
    state = ClusterState(0.0, C48, free, running, [new])
    assert pack(new, free) == Placement.of({1: 4, 2: 8})
    assert FloorPacking(perf)(new, free, state) == Placement.of({1: 4, 2: 8})
    assert rule(new, free, state) == Placement.of({2: 8, 3: 4})
    # the bar: another placement must beat pack's by more than switch_gain effective GPUs per GPU
    gain = (rule.score(new, Placement.of({2: 8, 3: 4}), state) - rule.score(new, Placement.of({1: 4, 2: 8}), state)) / 12
    assert gain > rule.switch_gain
    high = ContentionAwarePlacement(perf, nosplit=True, switch_gain=gain + 1e-3)
    assert high(new, free, state) == Placement.of({1: 4, 2: 8})
    assert ContentionAwarePlacement(perf, nosplit=True, switch_gain=gain - 1e-3)(new, free, state) == Placement.of({2: 8, 3: 4})
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="switch_gain"):
            ContentionAwarePlacement(perf, nosplit=True, switch_gain=bad)
    # a 4-GPU job fits node 1 beside FSDP: single-node jobs do not contend, so best fit as nosplit
    small = info("small", 4, perf=perf)
    assert rule(small, free, state) == FloorPacking(perf)(small, free, state) == Placement.of({1: 4})
    # 20 GPUs need 3 nodes whatever greedy prefers: it never takes more nodes than nosplit
    big = info("big", 20, perf=perf)
    assert rule(big, free, state).num_nodes == FloorPacking(perf)(big, free, state).num_nodes == 3


MIXED = ClusterSpec((NodeSpec("a", 8), NodeSpec("b", 4), NodeSpec("c", 4), NodeSpec("d", 6)))


@settings(max_examples=300, deadline=None)
@given(st.data(), st.sampled_from([C48, MIXED]), st.sampled_from([np.int64, np.int32, np.int16]))
def test_floor_packing_properties(data, cluster, dtype) -> None:
    """Valid whenever it places: the demand exactly, within the free GPUs, one node for a job of
    at most the largest node's GPUs (homogeneous and mixed clusters, any integer dtype)."""
    cap = cluster.gpus_per_node
    free = [data.draw(st.integers(0, c)) for c in cap]
    gpus = data.draw(st.integers(1, cluster.total_gpus))
    perf = ContentionModel(cluster)
    f = np.array(free, dtype=dtype)
    state = ClusterState(0.0, cluster, f.copy(), [], [])
    p = FloorPacking(perf)(info("j", gpus), f, state)
    assert f.tolist() == free  # never mutated
    single = gpus <= cluster.max_gpus_per_node
    if p is None:
        assert gpus > sum(free) or (single and max(free) < gpus)
        return
    assert p.total_gpus == gpus
    assert all(c <= free[n] for n, c in p.alloc)
    if single:
        assert p.num_nodes == 1 and free[p.nodes[0]] == min(x for x in free if x >= gpus)  # best fit


# ---------------------------------------------------------------------- fast searches == the plain definitions
def _pack_by_definition(need: int, free: np.ndarray) -> Placement | None:
    """SCED2 packing written with numpy over the whole array (the definition ``pack`` must equal)."""
    if need > int(free.sum()):
        return None
    avail = free.astype(np.int64).copy()
    alloc: dict[int, int] = {}
    while need > 0:
        ok = np.flatnonzero(avail >= need)
        if ok.size:
            n, take = int(ok[np.argmin(avail[ok])]), need
        else:
            n = int(np.argmax(avail))
            take = int(avail[n])
        alloc[n] = alloc.get(n, 0) + take
        avail[n] -= take
        need -= take
    return Placement.of(alloc)


free_arrays = (st.lists(st.integers(0, 8), min_size=1, max_size=40) | st.lists(st.integers(0, 300), min_size=1, max_size=12)
               | st.lists(st.integers(0, 8), min_size=65, max_size=90))  # beyond 64 nodes pack searches bytes


@settings(max_examples=200, deadline=None)
@given(free_arrays, st.integers(1, 64), st.sampled_from([np.int64, np.int32, np.int16]))
def test_pack_equals_its_definition(free, need, dtype) -> None:
    f = np.array(free, dtype=dtype)
    assert pack(info("j", need), f) == _pack_by_definition(need, f)
    assert f.tolist() == free


@settings(max_examples=200, deadline=None)
@given(free_arrays, st.integers(1, 48), st.data())
def test_balanced_by_load_equals_the_sorted_order(free, gpus, data) -> None:
    """Candidates over nodes in (multi-node load, free, index) order, found without sorting,
    equal balanced_candidates over np.lexsort((free, load))."""
    f = np.array(free, dtype=np.int64)
    loads = data.draw(st.dictionaries(st.integers(0, len(free) - 1), st.integers(1, 3)))
    load_arr = np.zeros(len(free))
    for v, c in loads.items():
        load_arr[v] = c
    want = balanced_candidates(gpus, f, np.lexsort((f, load_arr)))
    got = balanced_by_load(gpus, f, lambda v: loads.get(v, 0), lambda: loads)
    assert got == want
    lb = bytes(loads.get(v, 0) for v in range(len(free)))
    assert balanced_by_load(gpus, f, lambda v: loads.get(v, 0), lambda: loads, lb) == want


def _greedy_by_definition(perf: ContentionModel, job: JobInfo, free: np.ndarray, state: ClusterState, floor: float = 0.0):
    """ContentionAwarePlacement written out plainly: every candidate (balanced over the sorted nodes,
    then pack), each scored from the running jobs per node with the contention rule."""
    from policies.ledger import job_cs, job_key

    if job.gpu_demand > int(free.sum()):
        return None
    per_node = state.jobs_on_node()
    load = np.array([sum(1 for j in js if j.placement.num_nodes > 1) for js in per_node], float)
    cands = balanced_candidates(job.gpu_demand, free, np.lexsort((free, load)))
    p = _pack_by_definition(job.gpu_demand, free)
    if p is not None and p not in cands:
        cands.append(p)

    def neigh(v, exclude):
        return [job_key(o.model, o.placement) for o in per_node[v] if o.job_id != exclude]

    def score(c):
        me = job_key(job.model, c)
        gain = job.gpu_demand * perf.isolated_throughput(*me) / job_cs(perf, me, [neigh(v, job.job_id) for v in c.nodes])
        gain /= max(job.best_thp, 1e-12)
        if c.num_nodes <= 1:
            return gain
        seen, loss = set(), 0.0
        for v in c.nodes:
            for o in per_node[v]:
                if o.job_id in seen or o.placement.num_nodes <= 1:
                    continue
                seen.add(o.job_id)
                ok = job_key(o.model, o.placement)
                before = [neigh(u, o.job_id) for u in o.placement.nodes]
                after = [b + ([me] if u in c.nodes else []) for u, b in zip(o.placement.nodes, before)]
                cs_b, cs_a = job_cs(perf, ok, before), job_cs(perf, ok, after)
                loss += o.gpu_demand * perf.isolated_throughput(*ok) * (1 / cs_b - 1 / cs_a) / max(o.best_thp, 1e-12)
        return gain - loss

    best, best_score = None, -np.inf
    for c in cands:
        s = score(c)
        if s > best_score + 1e-9 or (abs(s - best_score) <= 1e-9 and best is not None and c.num_nodes < best.num_nodes):
            best, best_score = c, s
    if best is not None and floor > 0 and best_score < floor * job.gpu_demand - 1e-9:
        return None
    return best, best_score


C88 = ClusterSpec.parse("8x8")
PERF88 = ContentionModel(C88)


def _draw_running(data, free: np.ndarray, most: int, perf: ContentionModel) -> list[JobInfo]:
    """Up to ``most`` running jobs of random models on up to 4 random nodes each, drawn from the free
    GPUs ``free`` (taken off it, in place)."""
    from policies.workloads import MODELS

    running = []
    for k in range(data.draw(st.integers(0, most))):
        nodes = data.draw(st.lists(st.integers(0, len(free) - 1), min_size=1, max_size=4, unique=True))
        alloc = {v: data.draw(st.integers(0, int(free[v]))) for v in nodes}
        alloc = {v: c for v, c in alloc.items() if c > 0}
        if not alloc:
            continue
        for v, c in alloc.items():
            free[v] -= c
        p = Placement.of(alloc)
        running.append(info(f"r{k}", p.total_gpus, data.draw(st.sampled_from(MODELS)), p, perf))
    return running


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_greedy_equals_its_definition(data) -> None:
    """Random running jobs (multi-node ones sharing nodes) and a waiting job: the rule (ledger,
    candidates found without sorting, pruned by isolated gain) picks what the plain definition picks."""
    from policies.workloads import MODELS

    free = np.array(C88.gpus_per_node, dtype=np.int64)
    running = _draw_running(data, free, 10, PERF88)
    if int(free.sum()) == 0:
        return
    new = info("new", data.draw(st.integers(1, int(free.sum()))), data.draw(st.sampled_from(MODELS)), perf=PERF88)
    state = ClusterState(0.0, C88, free, running, [new])
    floor = data.draw(st.sampled_from([0.0, 0.5, 0.9]))
    want = _greedy_by_definition(PERF88, new, free, state, floor)
    got = ContentionAwarePlacement(PERF88, min_efficiency=floor)(new, free, state)
    assert got == (None if want is None else want[0])
    if want is not None:
        assert ContentionAwarePlacement(PERF88).score(new, want[0], state) == pytest.approx(want[1], rel=1e-12, abs=1e-12)


def test_state_free_bytes() -> None:
    """The state's free GPUs as bytes (what the rules search): built once, or handed in by a backend."""
    free = np.array([3, 0, 8, 5], dtype=np.int64)
    state = ClusterState(0.0, C48, free, [], [])
    fb, bound = state.free_bytes()
    assert fb == bytes([3, 0, 8, 5]) and bound >= 8 and state.free_bytes()[0] is fb
    assert ClusterState(0.0, C48, np.array([3, -1, 8, 5]), [], []).free_bytes() is None
    assert ClusterState(0.0, ClusterSpec.parse("4x64"), np.array([3, 300, 8, 5]), [], []).free_bytes() is None
    state.use_free_bytes(bytes([3, 0, 8, 5]), 64)
    assert state.free_bytes() == (bytes([3, 0, 8, 5]), 64)
    with pytest.raises(ValueError, match="3 bytes, bound 64, for 4 nodes"):
        state.use_free_bytes(bytes(3), 64)
    job = info("j", 4)
    assert pack(job, state.free_gpus, state) == pack(job, free.copy()) == Placement.of({3: 4})


def _nosplit_greedy_by_definition(perf: ContentionModel, job: JobInfo, free: np.ndarray, state: ClusterState):
    """``ContentionAwarePlacement(perf, nosplit=True)`` written out from its docstring, on plain arrays."""
    from policies.placement import SWITCH_GAIN

    gpus = job.gpu_demand
    if int(free.max()) >= gpus:
        return _pack_by_definition(gpus, free)
    if gpus <= state.cluster.max_gpus_per_node:
        return None
    p = _pack_by_definition(gpus, free)
    if p is None:
        return None
    load = np.zeros(len(free))
    for j in state.running:
        if j.placement.num_nodes > 1:
            load[list(j.placement.nodes)] += 1
    if not load.any():
        return p
    k = p.num_nodes
    quiet = np.where(load > 0, 0, free)
    cands = []
    q = _pack_by_definition(gpus, quiet)
    if q is not None and q.num_nodes == k and q != p:
        cands.append(q)
    bal = [c for c in balanced_candidates(gpus, free, np.lexsort((free, load))) if c.num_nodes == k]
    cands += [c for c in bal if c != p and c not in cands]
    rule = ContentionAwarePlacement(perf, nosplit=True)
    best, best_score = p, rule.score(job, p, state)
    bar = best_score + SWITCH_GAIN * gpus
    for c in cands:
        s = rule.score(job, c, state)
        if s > bar + 1e-9 and s > best_score + 1e-9:
            best, best_score = c, s
    return best


C80 = ClusterSpec.parse("80x8")
PERF80 = ContentionModel(C80)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_nosplit_greedy_on_a_large_cluster_equals_its_definition(data) -> None:
    """Beyond 64 nodes the ``greedy`` placement searches the state's free bytes and the ledger's load
    bytes; it picks what its definition picks (the state's own free GPUs and a copy of them alike)."""
    from policies.workloads import MODELS

    free = np.array(C80.gpus_per_node, dtype=np.int64)
    full = data.draw(st.lists(st.integers(0, 79), max_size=70, unique=True))
    free[full] = data.draw(st.integers(0, 3))  # a crowded cluster: multi-node jobs must span nodes
    running = _draw_running(data, free, 12, PERF80)
    new = info("new", data.draw(st.sampled_from([1, 2, 4, 8, 12, 16, 24, 32])), data.draw(st.sampled_from(MODELS)),
               perf=PERF80)
    state = ClusterState(0.0, C80, free, running, [new])
    want = _nosplit_greedy_by_definition(PERF80, new, free, state)
    rule = ContentionAwarePlacement(PERF80, nosplit=True)
    assert rule(new, state.free_gpus, state) == want
    assert rule(new, free.copy(), state) == want


def _spanning_case(data, cluster: ClusterSpec):
    """A crowded ``cluster`` (8x8 or 80x8) with random running jobs and a waiting job larger than a node:
    ``(perf, free, running, job, state)``."""
    from policies.workloads import MODELS

    perf = PERF88 if cluster is C88 else PERF80
    free = np.array(cluster.gpus_per_node, dtype=np.int64)
    full = data.draw(st.lists(st.integers(0, len(free) - 1), max_size=len(free) - 2, unique=True))
    free[full] = data.draw(st.integers(0, 3))
    running = _draw_running(data, free, 12, perf)
    new = info("new", data.draw(st.sampled_from([9, 12, 16, 24, 32])), data.draw(st.sampled_from(MODELS)), perf=perf)
    return perf, free, running, new, ClusterState(0.0, cluster, free, running, [new])


@settings(max_examples=60, deadline=None)
@given(st.data(), st.sampled_from([C88, C80]))
def test_spanning_search_is_the_rule_and_its_packings(data, cluster) -> None:
    """For a job larger than a node, :meth:`ContentionAwarePlacement.spanning_search` returns the
    ``nosplit=True`` rule's choice, :func:`pack` of the job on the free GPUs and (when it says it
    searched them) :func:`pack` on :func:`quiet_counts` of them; a job that fits on one node is refused."""
    perf, free, running, new, state = _spanning_case(data, cluster)
    rule = ContentionAwarePlacement(perf, nosplit=True)
    got = rule.spanning_search(new, state.free_gpus, state)
    assert got.choice == rule(new, free.copy(), state)
    assert got.packed == pack(new, free.copy())
    quiet = quiet_counts(free, state.contention(perf))
    if got.packed is not None:
        assert got.quiet_known
    if got.quiet_known:
        assert got.quiet == (None if quiet is None else pack(new, quiet))
    if quiet is not None:
        loaded = {v for r in running if r.placement.num_nodes > 1 for v in r.placement.nodes}
        assert all(quiet[v] == (0 if v in loaded else free[v]) for v in range(len(free)))
    with pytest.raises(ValueError, match="fits on one node"):
        rule.spanning_search(info("small", 8, "MoE", perf=perf), free, state)


@settings(max_examples=80, deadline=None)
@given(st.data(), st.sampled_from([C88, C80]))
def test_spanning_search_kept_after_a_single_node_start(data, cluster) -> None:
    """When :meth:`SpanningSearch.kept_after` says a search survives a start on one node (that node's
    free GPUs drop, the multi-node jobs stay), searching again gives the same placements."""
    perf, free, running, new, state = _spanning_case(data, cluster)
    rule = ContentionAwarePlacement(perf, nosplit=True)
    before = rule.spanning_search(new, free, state)
    nd = data.draw(st.integers(0, len(free) - 1))
    if free[nd] == 0:
        return
    g = data.draw(st.integers(1, int(free[nd])))
    after_free = free.copy()
    after_free[nd] -= g
    small = info("small", g, "MoE", Placement.of({nd: g}), perf)
    after = ClusterState(0.0, cluster, after_free, [*running, small], [new])
    loaded = state.contention(perf).load(nd) > 0
    if before.kept_after(nd, int(after_free[nd]), loaded):
        assert rule.spanning_search(new, after_free, after) == before
