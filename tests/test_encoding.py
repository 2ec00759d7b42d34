"""The deepshare-v1 codec (policies.codecs.deepshare) and its candidate orders (policies.orders).

The codec's rounds are compared with the straightforward reference encoder and state transition of
``tests/oracles/deepshare_reference.py`` on random states.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oracles.deepshare_reference import apply_placement, encode_reference
from random_states import random_state

from policies.cluster import ClusterSpec, Placement
from policies.codecs.deepshare import DeepShareCodec, EncodingError, NodeIndex, ObsSpec, describe_layout
from policies.orders import AGING_S, LEGACY_AGING_S, CandidateOrder, srtf_groups, srtf_key
from policies.perf import ContentionModel
from policies.placement import pack
from policies.state import ClusterState, JobInfo, time_key
from policies.workloads import MODELS

C48 = ClusterSpec.parse("4x8")
PERF = ContentionModel(C48)


def _job(jid: str, model: str, g: int, rem_h: float = 1.0, placement: Placement | None = None) -> JobInfo:
    best = PERF.best_isolated_throughput(model, g)
    j = JobInfo(jid, model, g, 0.0, total_samples=rem_h * 3600 * best, best_thp=best, placement=placement)
    if placement is not None:
        j.isolated_thp = j.achieved_thp = PERF.isolated_throughput(model, placement.total_gpus, placement.num_nodes)
    return j


def _state(running: list[JobInfo], pending: list[JobInfo]) -> ClusterState:
    free = np.array(C48.gpus_per_node)
    for j in running:
        for n, c in j.placement.alloc:
            free[n] -= c
    return ClusterState(0.0, C48, free, running, pending)


def _encode(codec: DeepShareCodec, state: ClusterState):
    """The first encoding of a round on ``state``."""
    return codec.begin(state).encode()


def test_spec_shapes():
    spec = ObsSpec.for_cluster(C48)
    assert spec.k == 6 and spec.levels == 3 and spec.options == 4 and spec.n_actions == 25
    assert spec.shape == (6 * 4 + 6 * 5, 4, 16)
    big = ObsSpec.for_cluster(ClusterSpec.parse("128x8"))
    assert big.levels == 4 and big.shape[1:] == (128, 16)
    assert ObsSpec.from_dict(spec.to_dict()) == spec
    codec = DeepShareCodec(C48, PERF, spec)
    assert codec.observation_space.shape == spec.shape and codec.observation_space.dtype == np.float32
    assert (codec.observation_space.low, codec.observation_space.high) == (0.0, 1.0)
    assert codec.action_space.n == spec.n_actions


def test_spec_mismatch_is_clear():
    spec = ObsSpec.for_cluster(C48)
    with pytest.raises(EncodingError, match="4x8"):
        DeepShareCodec(ClusterSpec.parse("8x8"), PERF, spec)


def test_left_half_and_candidates():
    run = _job("r1", "MoE", 8, placement=Placement.of({0: 4, 1: 4}))
    pend = [
        _job("a", "GraphSage", 4, 2.0),
        _job("b", "DLRM", 4, 1.0),
        _job("c", "FSDP", 1, 1.0),
        _job("d", "MoE", 32, 1.0),
    ]
    enc = _encode(DeepShareCodec(C48, PERF), _state([run], pend))
    obs = enc.obs
    assert obs.dtype == np.float32 and obs.shape == enc.spec.shape
    assert obs.min() >= 0.0 and obs.max() <= 1.0
    # r1 occupies slots 0..3 of nodes 0 and 1, multi-node flag set.
    assert obs[1, 0, :4].sum() == 4 and obs[1, 0, 4:8].sum() == 0 and obs[1, 2].sum() == 0
    assert (obs[6, 0, :4] == 1).all()
    # One candidate per demand, the shortest of each; ordered by remaining GPU-time.
    ids = [c.job_id for c in enc.candidates]
    assert ids == ["c", "b", "d"]
    # 32 GPUs do not fit while r1 runs: no option for d; noop allowed as a job runs.
    S = enc.spec.options
    assert not enc.mask[2 * S : 3 * S].any()
    assert enc.mask[enc.spec.noop]


def test_noop_masked_when_idle_and_fits():
    enc = _encode(DeepShareCodec(C48, PERF), _state([], [_job("a", "MoE", 8)]))
    assert not enc.mask[enc.spec.noop] and enc.any_placement
    with pytest.raises(ValueError):
        enc.decode(enc.spec.noop)


def test_decode_gives_fitting_placement_with_speed_channel():
    run = _job("r1", "FSDP", 8, placement=Placement.of({0: 4, 1: 4}))
    st_ = _state([run], [_job("a", "MoE", 8)])
    enc = _encode(DeepShareCodec(C48, PERF), st_)
    S = enc.spec.options
    for s in range(S):
        if enc.mask[s]:
            jid, p = enc.decode(s)
            assert jid == "a" and p.total_gpus == 8 and p.fits(st_.free_gpus)
            G = enc.spec.gpus_per_node
            ch = enc.obs[s, :, G:]
            assert (ch > 0).sum() == 8  # the 8 slots it would take
            assert ch.max() <= 1.0
            assert enc.action_speeds()[s] == ch.max()


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(MODELS), st.sampled_from([1, 2, 4, 8, 16, 32]), st.floats(0.1, 10)),
        min_size=1,
        max_size=12,
    ),
    st.integers(0, 2**31 - 1),
)
def test_every_valid_action_fits(jobs, seed):
    """Property: applying any sequence of valid actions in a round never over-allocates a node."""
    rng = np.random.default_rng(seed)
    pend = [_job(f"j{i}", m, g, r) for i, (m, g, r) in enumerate(jobs)]
    state = _state([], pend)
    rnd = DeepShareCodec(C48, PERF).begin(state)
    for _ in range(20):
        enc = rnd.encode()
        valid = np.flatnonzero(enc.mask)
        assert valid.size >= 1
        a = int(rng.choice(valid))
        d = enc.decode(a)
        if d is None:
            break
        jid, p = d
        before = rnd.state()
        assert p.fits(before.free_gpus)
        rnd.place(jid, p)
        after = rnd.state()
        assert (after.free_gpus >= 0).all() and jid not in {j.job_id for j in after.pending}
        assert int(after.free_gpus.sum()) + sum(j.gpu_demand for j in after.running) == C48.total_gpus
    assert state.running == [] and len(state.pending) == len(pend)  # the round's input is untouched


def test_place_updates_neighbour_contention_and_refuses_bad_starts():
    run = _job("r1", "MoE", 8, placement=Placement.of({0: 4, 1: 4}))
    state = _state([run], [_job("a", "FSDP", 8), _job("b", "FSDP", 8)])
    rnd = DeepShareCodec(C48, PERF).begin(state)
    rnd.place("a", Placement.of({0: 4, 1: 4}))
    after = rnd.state()
    r1 = next(j for j in after.running if j.job_id == "r1")
    assert r1.cs > 1.0
    want = apply_placement(state, "a", Placement.of({0: 4, 1: 4}), PERF)
    assert after.running == want.running and after.pending == want.pending
    assert np.array_equal(after.free_gpus, want.free_gpus)
    assert [j.job_id for j in state.running] == ["r1"] and state.running[0].cs == 1.0  # input untouched
    with pytest.raises(ValueError, match="not waiting"):
        rnd.place("a", Placement.of({2: 8}))  # started already
    with pytest.raises(ValueError, match="does not fit"):
        rnd.place("b", Placement.of({0: 8}))
    with pytest.raises(ValueError, match="not waiting"):
        rnd.place("nosuch", Placement.of({2: 8}))
    rnd.place("b", Placement.of({2: 8}))  # a refused start changed nothing
    assert [j.job_id for j in rnd.state().running] == ["r1", "a", "b"] and rnd.state().pending == []


def test_heterogeneous_cluster_episode():
    """Nodes of different sizes: slots beyond a node's GPUs never exist nor get used."""
    from policies.cluster import NodeSpec
    from trainer.env import PlacementEnv
    from trainer.generate import GeneratorConfig, generate_jobs

    het = ClusterSpec((NodeSpec("a", 8), NodeSpec("b", 4), NodeSpec("c", 2)))
    perf = ContentionModel(het)
    jobs = generate_jobs(het, GeneratorConfig(num_jobs=20, seed=4, max_gpus=8, duration_s=900.0), perf)
    env = PlacementEnv([jobs], het, perf=perf)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (env.spec_obs.channels, 3, 16)
    rng = np.random.default_rng(0)
    while True:
        exists = obs[0, :, :8]
        assert exists.sum() == 14 and (obs[:, 1, 4:8] == 0).all() and (obs[:, 2, 2:8] == 0).all()
        obs, _, term, trunc, _ = env.step(int(rng.choice(np.flatnonzero(env.action_masks()))))
        env.sim.check_invariants()
        if term or trunc:
            break
    assert env.sim.done


def _same(a, b) -> None:
    """An encoding equals the reference: bit-equal observations, equal masks, candidates and options."""
    assert a.obs.dtype == b.obs.dtype and a.obs.shape == b.obs.shape
    assert a.obs.tobytes() == b.obs.tobytes()
    assert np.array_equal(a.mask, b.mask)
    assert [j.job_id for j in a.candidates] == [j.job_id for j in b.candidates]
    assert [list(o) for o in a.options] == [list(o) for o in b.options]
    assert a.action_speeds().tobytes() == b.action_speeds().tobytes()
    assert a.any_placement == b.any_placement


def _het() -> ClusterSpec:
    from policies.cluster import NodeSpec

    return ClusterSpec((NodeSpec("a", 8), NodeSpec("b", 4), NodeSpec("c", 2), NodeSpec("d", 8)))


_CLUSTERS = {"4x8": C48, "16x4": ClusterSpec.parse("16x4"), "het": _het(), "4x8 link": C48, "4x8 ds-min": C48}
_RULES = {"4x8 link": "link", "4x8 ds-min": "ds-min"}  # the other contention rules (default: sum)
_PERFS = {k: (ContentionModel(c, contention=_RULES[k]) if k in _RULES else PERF if c is C48 else ContentionModel(c))
          for k, c in _CLUSTERS.items()}
_CODECS = {(k, o): DeepShareCodec(c, _PERFS[k], ObsSpec.for_cluster(c, order=o)) for k, c in _CLUSTERS.items()
           for o in ("area", "fill")}


@settings(max_examples=80, deadline=None)
@given(
    st.sampled_from(sorted(_CLUSTERS)),
    st.sampled_from(["area", "fill"]),
    st.lists(
        st.tuples(st.sampled_from(MODELS), st.sampled_from([1, 2, 3, 4, 6, 8, 16]), st.floats(0.01, 50)),
        min_size=0,
        max_size=10,
    ),
    st.lists(
        st.tuples(st.sampled_from(MODELS), st.sampled_from([1, 2, 3, 4, 5, 8, 12, 16, 32]), st.floats(0.01, 50)),
        min_size=0,
        max_size=14,
    ),
    st.floats(0, 48 * 3600.0),
    st.integers(0, 2**31 - 1),
)
def test_round_bit_identical_to_reference(cname, order, running, pending, now, seed):
    """Property: every encoding of a codec round == the reference encoder on the state after the round's
    placements so far, bit for bit, and the round's state == the reference transition's.

    Random clusters (homogeneous, many small nodes, heterogeneous), random running jobs on random (also
    uneven multi-node) placements so contention varies, random queues and clock; then a sequence of
    random valid actions. The candidates are the order's over the whole remaining queue (the area and
    fill orders keep no state within a round).
    """
    cluster, perf = _CLUSTERS[cname], _PERFS[cname]
    codec = _CODECS[(cname, order)]
    rng = np.random.default_rng(seed)
    state = random_state(cluster, perf, running, pending, now, rng, id_width=2)
    rnd = codec.begin(state)
    cur = state
    for _ in range(8):
        got = rnd.encode()
        _same(got, encode_reference(codec, cur))
        sparse = rnd.encode(dense=False)
        assert sparse.obs is None and np.array_equal(sparse.mask, got.mask) and sparse.candidates == got.candidates
        valid = np.flatnonzero(got.mask[:-1])
        if valid.size == 0:
            break
        jid, p = got.decode(int(rng.choice(valid)))
        rnd.place(jid, p)
        cur = apply_placement(cur, jid, p, perf)
        now_ = rnd.state()
        assert np.array_equal(now_.free_gpus, cur.free_gpus) and now_.running == cur.running
        assert [j.job_id for j in now_.pending] == [j.job_id for j in cur.pending]


def test_unusable_nodes_get_no_option_and_keep_the_round_state_consistent():
    """A node marked unusable (ClusterState.usable) with GPUs reported free: no option of any candidate uses
    it, the round agrees with the reference encoder, and the round's states keep the mask."""
    rng = np.random.default_rng(3)
    state = random_state(C48, PERF, [("MoE", 4, 2.0), ("FSDP", 8, 1.0)],
                         [(m, g, 1.0) for m in ("MoE", "DLRM") for g in (1, 2, 4, 8, 12)], 3600.0, rng)
    usable = np.array([True, False, True, False])
    st_ = dataclasses.replace(state, usable=usable)
    assert st_.free_gpus[~usable].sum() == 0 and st_.free_gpus[usable].tolist() == state.free_gpus[usable].tolist()
    codec = DeepShareCodec(C48, PERF)
    rnd = codec.begin(st_)
    got = rnd.encode()
    _same(got, encode_reference(codec, st_))
    opts = [p for o in got.options for p in o if p is not None]
    assert opts and all(usable[v] for p in opts for v in p.nodes)
    assert np.array_equal(rnd.state().usable, usable)
    jid, p = got.decode(int(np.flatnonzero(got.mask[:-1])[0]))
    rnd.place(jid, p)
    assert np.array_equal(rnd.state().usable, usable)
    assert all(usable[v] for o in rnd.encode().options for q in o if q is not None for v in q.nodes)


def test_candidate_order_ages_waiting_jobs():
    """A large job that has waited long enough overtakes a newly arrived small one."""
    small = _job("small", "FSDP", 1, 1.0)
    big = _job("big", "MoE", 16, 1.0)
    codec = DeepShareCodec(C48, PERF)
    # Arrived together: plain remaining GPU-time order (1 GPU-h before 16 GPU-h).
    assert [c.job_id for c in codec.order.candidates([big, small], now=0.0)] == ["small", "big"]
    # The big job waited 2 h, the small one just arrived: 16 * exp(-4) < 1.
    small.submit_time = 2 * 3600.0
    now = 2 * 3600.0
    assert 16 * np.exp(-now / AGING_S) < 1.0
    assert [c.job_id for c in codec.order.candidates([big, small], now=now)] == ["big", "small"]
    # a round ages by the state's clock.
    state = ClusterState(now, C48, np.array(C48.gpus_per_node), [], [small, big])
    assert [c.job_id for c in _encode(codec, state).candidates] == ["big", "small"]


def test_candidate_aging_is_the_specs():
    """The aging constant comes from the spec (a checkpoint's), not from a module global: the same
    two jobs are ordered differently under 300 s and 1800 s, and jobs that waited equally never are."""
    small = _job("small", "FSDP", 1, 1.0)
    big = _job("big", "MoE", 16, 1.0)
    small.submit_time = 3600.0  # big waited 1 h longer: 16 * exp(-3600 / 300) < 1 < 16 * exp(-3600 / 1800)
    order = {}
    for a in (300.0, LEGACY_AGING_S):
        codec = DeepShareCodec(C48, PERF, ObsSpec.for_cluster(C48, aging_s=a))
        assert codec.order.aging_s == a
        order[a] = [c.job_id for c in codec.order.candidates([big, small], now=3600.0)]
        assert codec.order.rank_key(big, 3600.0)[0] == pytest.approx(16 * np.exp(-3600.0 / a) * time_key(big.remaining_time))
        # submitted together: the plain GPU-time order whatever the aging
        together = [dataclasses.replace(big, submit_time=3600.0), small]
        assert [c.job_id for c in codec.order.candidates(together, now=7200.0)] == ["small", "big"]
    assert order == {300.0: ["big", "small"], LEGACY_AGING_S: ["small", "big"]}


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 8), st.integers(0, 3)), min_size=1, max_size=40),
    st.lists(st.tuples(st.integers(0, 39), st.integers(0, 8), st.integers(0, 2)), max_size=12),
    st.sampled_from([1, 2, 3, 4, 5, 7, 8, 12, 16, 24, 32, 64]),
)
def test_node_index_matches_scans(nodes, updates, g):
    """NodeIndex gives the same first nodes (least multi-node load, best fit, index) and packing as
    numpy scans, also after updates."""
    free = np.array([f for f, _m in nodes], dtype=np.int64)
    mload = np.array([m for _f, m in nodes], dtype=np.int64)
    N = len(nodes)
    nix = NodeIndex(free.tolist(), mload.tolist())
    for step in range(len(updates) + 1):
        order = np.lexsort((np.arange(N), free, mload))
        for g2 in (1, 3, 8, g, 2 * g):
            job = JobInfo("j", MODELS[0], g2, 0.0, 1.0)
            assert nix.pack(g2) == pack(job, free)
            for n in (1, 2, 4, 8):
                per = -(-g2 // n)
                want = [int(v) for v in order if free[v] >= per][:n]
                assert nix.first_nodes(n, per) == (want if len(want) == n else None)
        assert nix.total == int(free.sum())
        if step < len(updates):
            v, take, extra = updates[step]
            v %= N
            new_free = max(int(free[v]) - take, 0)
            free[v], mload[v] = new_free, mload[v] + extra
            nix.update(v, new_free, int(mload[v]))
    with pytest.raises(ValueError, match="only shrink"):
        nix.update(0, int(free[0]) + 1, int(mload[0]))


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([1, 2, 4, 8]),
            st.sampled_from([0.0, 10.0, 100.0]),
            st.floats(1.0, 1e4),
            st.sampled_from([0.0, 5.0, 1e4, 2e4]),
            st.sampled_from([1.0, 3.0, 7.5]),
        ),
        max_size=40,
    )
)
def test_srtf_groups_pop_in_srtf_order(rows):
    """srtf_groups: each demand group, heapified, pops its jobs sorted by srtf_key (ties included); its
    minimum is the group's SRTF head."""
    import heapq

    jobs = [
        JobInfo(f"j{i:03d}", MODELS[0], g, sub, tot, done_samples=min(done, tot * 2), best_thp=thp)
        for i, (g, sub, tot, done, thp) in enumerate(rows)
    ]
    groups = srtf_groups(jobs)
    assert sorted(groups) == sorted({j.gpu_demand for j in jobs})
    for g, h in groups.items():
        want = sorted((j for j in jobs if j.gpu_demand == g), key=srtf_key)
        assert min(h)[-1] is want[0]
        heapq.heapify(h)
        assert [heapq.heappop(h)[-1] for _ in range(len(h))] == want
    dup = jobs + [jobs[0]] if jobs else []  # a duplicated id never compares two JobInfos
    for h in srtf_groups(dup).values():
        heapq.heapify(h)
        assert len([heapq.heappop(h) for _ in range(len(h))]) >= 1


def _order(name: str) -> CandidateOrder:
    return DeepShareCodec(C48, PERF, ObsSpec.for_cluster(C48, order=name)).order


def test_fill_order_is_area_order_while_small_jobs_wait():
    """"fill" equals "area" while a job of at most FILL_SMALL x C GPUs waits, or no job of C/2 < demand < C does."""
    from policies.orders import FILL_SMALL

    area, fill = _order("area"), _order("fill")
    C = C48.total_gpus
    small = max(1, int(FILL_SMALL * C))
    jobs = [_job(f"j{g}", "FSDP", g, 1.0) for g in (small, 12, 17, 20, 24)]
    assert [j.job_id for j in fill.candidates(jobs, 0.0, free=C)] == [j.job_id for j in area.candidates(jobs, 0.0)]
    only_whole = [_job(f"j{g}", "FSDP", g, 1.0) for g in (small + 1, 8, 16, C)]  # no C/2 < demand < C
    assert [j.job_id for j in fill.candidates(only_whole, 0.0, free=C)] == [
        j.job_id for j in area.candidates(only_whole, 0.0)
    ]


def test_fill_order_pairs_a_large_job_with_jobs_filling_its_gap():
    """Without small jobs: the first large job, then the fitting jobs of <= C/2 GPUs largest first, then the rest."""
    fill = _order("fill")
    C = C48.total_gpus
    assert C == 32
    jobs = [_job(f"j{g}", "FSDP", g, 1.0) for g in (6, 9, 12, 15, 16, 17, 20, 30, 32)]
    # idle cluster: the 17-GPU job, then every job of <= 16 GPUs, largest first (K = 6)
    assert [j.gpu_demand for j in fill.candidates(jobs, 0.0, free=C)] == [17, 16, 15, 12, 9, 6]
    # 15 GPUs free (the 17-GPU job runs): the 17-GPU head does not fit, the fitting fillers follow it
    assert [j.gpu_demand for j in fill.candidates(jobs[:5] + jobs[6:], 0.0, free=15)] == [20, 15, 12, 9, 6, 16]
    # a round passes the state's free GPUs
    state = ClusterState(0.0, C48, np.array([8, 7, 0, 0]), [], jobs)  # 15 free
    codec = DeepShareCodec(C48, PERF, ObsSpec.for_cluster(C48, order="fill"))
    assert [j.gpu_demand for j in _encode(codec, state).candidates] == [17, 15, 12, 9, 6, 16]
    with pytest.raises(ValueError, match="free GPU"):
        fill.candidates(jobs, 0.0)


def test_queue_order_covers_the_whole_queue():
    """CandidateOrder.queue_order (rl-hybrid's safety rule): every pending job, not only the best of each
    demand or the first K, in area order, or in fill order once no small job waits."""
    area, fill = _order("area"), _order("fill")
    C = C48.total_gpus
    # two jobs of each demand (the second 2x longer), 9 demands: 18 jobs > K
    jobs = [_job(f"j{g}-{h}", "FSDP", g, h) for g in (6, 9, 12, 15, 16, 17, 20, 30, 32) for h in (1.0, 2.0)]
    got = area.queue_order(jobs, 0.0, free=C)
    assert sorted(j.job_id for j in got) == sorted(j.job_id for j in jobs)
    area_key = [time_key(j.remaining_time) * j.gpu_demand for j in got]  # no ageing at t = 0
    assert area_key == sorted(area_key)
    # fill order: the first large job (17 GPUs, 1 h), then the jobs of <= 16 GPUs that end with it
    # (1 h), largest first, then the rest in area order
    got = [j.job_id for j in fill.queue_order(jobs, 0.0, free=C)]
    assert got[:6] == ["j17-1.0", "j16-1.0", "j15-1.0", "j12-1.0", "j9-1.0", "j6-1.0"]
    assert got[6:] == [j.job_id for j in area.queue_order(jobs, 0.0, free=C) if j.job_id not in got[:6]]
    # a small job waits: fill order is area order
    small = [*jobs, _job("s", "FSDP", 2, 1.0)]
    assert [j.job_id for j in fill.queue_order(small, 0.0, free=C)] == [j.job_id for j in area.queue_order(small, 0.0, free=C)]
    # a round walks the jobs still waiting in the same order
    state = ClusterState(0.0, C48, np.array(C48.gpus_per_node), [], jobs)
    codec = DeepShareCodec(C48, PERF, ObsSpec.for_cluster(C48, order="fill"))
    assert [j.job_id for j in codec.begin(state).queue_order()] == got


def _uniform_queue(reps: int = 8, rem_h: float = 1.0) -> list[JobInfo]:
    """``reps`` jobs of every demand 1..32 (528 x reps GPUs: a long queue of equal-length jobs)."""
    return [_job(f"j{g}-{r}", "FSDP", g, rem_h) for g in range(1, 33) for r in range(reps)]


def test_plan_order_candidates_follow_the_waves():
    """A long queue of equal-length jobs: the candidates are the demand heads in the order their
    demands first appear in policies.waves.plan_order (the first wave: complements node by node)."""
    from collections import Counter

    from policies.waves import plan_order

    order = _order("plan")
    jobs = _uniform_queue()
    waves = plan_order(Counter(j.gpu_demand for j in jobs), 4, 8)
    firsts = list(dict.fromkeys(waves))[:6]
    got = order.candidates(jobs, 0.0, free=32)
    assert [j.gpu_demand for j in got] == firsts
    assert all(j.job_id.endswith("-0") for j in got)  # each demand's SRTF head (ties: id)
    # the whole queue in plan order, each demand's jobs in SRTF order
    q = order.queue_order(jobs, 0.0, free=32)
    assert [j.gpu_demand for j in q] == waves and sorted(j.job_id for j in q) == sorted(j.job_id for j in jobs)
    with pytest.raises(ValueError, match="free GPU"):
        order.candidates(jobs, 0.0)


def test_plan_is_kept_within_a_round_and_remade_at_the_next():
    """Inside a round (CandidateOrder.round) starting jobs off the plan keeps the other waves (each job
    taken from the first wave holding its demand); the next round (another queue, or a later time)
    plans afresh from its own queue."""
    from collections import Counter

    from policies.waves import plan_order

    order = _order("plan")
    jobs = _uniform_queue()
    counts = Counter(j.gpu_demand for j in jobs)
    q = order.round(jobs, 0.0)
    plan = q.plan_remaining()
    assert plan == plan_order(counts, 4, 8) == order.plan(dict(counts), 0.0, jobs).order
    head = q.candidates(32)[0]
    assert head.gpu_demand == plan[0]
    q.started(head)
    counts[head.gpu_demand] -= 1
    rest = plan[1:]
    assert rest != plan_order(counts, 4, 8)  # (so that the checks below tell kept from replanned)
    assert q.plan_remaining() == rest
    left = [j for j in jobs if j is not head]
    assert order.round(left, 0.0).plan_remaining() == plan_order(counts, 4, 8)  # the next round: replanned
    assert order.round(left, 60.0).plan_remaining() == plan_order(counts, 4, 8)  # a later time: replanned
    assert order.plan(dict(counts), 0.0, left).remaining(counts) == plan_order(counts, 4, 8)


def test_rounds_are_pure_functions_of_their_state():
    """No plan leaks from one round to another at the same time (after a long uniform batch, a shorter
    queue whose remaining times differ too much for waves): candidates and observations equal a fresh
    codec's, and a policy's round on B after one on A decides as B alone."""
    import copy

    from policies.prior import AdmissionPrior
    from policies.rl import RLPolicy, zero_net

    perf = ContentionModel(C48)

    def mk(jid, d, hours):
        b = perf.best_isolated_throughput("MoE", d)
        return JobInfo(jid, "MoE", d, 0.0, hours * 3600 * b, best_thp=b)

    a = [mk(f"a{d}_{i}", d, 1.0) for d in (1, 3, 5, 7) for i in range(40)]  # waves apply
    b = [mk(f"b{d}_{i}", d, 1.0 + 9.0 * i / 9) for d in (1, 3, 5, 7) for i in range(10)]  # waves must not
    now = 600.0
    sa = ClusterState(now, C48, np.array(C48.gpus_per_node), [], a)
    sb = ClusterState(now, C48, np.array(C48.gpus_per_node), [], b)
    spec = ObsSpec.for_cluster(C48, order="plan")
    want = _encode(DeepShareCodec(C48, perf, spec), sb)
    warm = DeepShareCodec(C48, perf, spec)
    _encode(warm, sa)
    got = _encode(warm, sb)
    assert [j.job_id for j in got.candidates] == [j.job_id for j in want.candidates]
    assert np.array_equal(got.obs, want.obs) and np.array_equal(got.mask, want.mask)
    pol = RLPolicy(zero_net(spec), DeepShareCodec(C48, perf, spec), prior=AdmissionPrior(), name="prior")
    alone = copy.deepcopy(pol).schedule(sb)
    pol.schedule(sa)
    assert pol.schedule(sb) == alone


@settings(max_examples=40, deadline=None)
@given(starts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=60))
def test_plan_rest_within_a_round_equals_removing_each_start_from_the_plan(starts):
    """Any sequence of starts within a round: the rest of the plan is the plan with each started job's
    demand removed at its first occurrence, one start at a time, and the candidates are the demand
    heads in the order their demands first appear in that rest (cut to K)."""
    from collections import Counter

    order = _order("plan")
    jobs = _uniform_queue(reps=2)
    counts = Counter(j.gpu_demand for j in jobs)
    q = order.round(jobs, 0.0)
    rest = q.plan_remaining()
    groups: dict[int, list] = {}  # the waiting jobs per demand in SRTF order; its first is the group's head
    for j in sorted(jobs, key=srtf_key):
        groups.setdefault(j.gpu_demand, []).append(j)
    for x in starts:
        left = [d for d, c in counts.items() if c]
        if not left:
            break
        d = left[x % len(left)]  # any demand still waiting, not only the plan's next
        counts[d] -= 1
        rest.remove(d)
        q.started(groups[d].pop(0))
        assert q.left == sum(counts.values())
        assert q.plan_remaining() == rest
        got = q.candidates(32)
        if any(c and d <= 8 for d, c in counts.items()):
            assert [j.gpu_demand for j in got] == list(dict.fromkeys(rest))[: order.k]
            assert all(j is groups[j.gpu_demand][0] for j in got)


def test_plan_order_falls_back_to_fill():
    """Fill order where waves do not model the queue: a short queue, remaining times that differ
    by more than PLAN_SPREAD, submit times further apart than PLAN_WAIT while most of the demand
    fills nodes exactly (less than PLAN_ODD in odd demands), or no single-node job left (the fill
    order's tail rule then). Under arrivals, a queue of mostly odd demands keeps the plan."""
    from policies.orders import PLAN_BACKLOG, PLAN_ODD, PLAN_SPREAD, PLAN_WAIT

    plan, fill = _order("plan"), _order("fill")

    def same(jobs, free=32):
        a = [j.job_id for j in plan.candidates(jobs, 0.0, free=free)]
        b = [j.job_id for j in fill.candidates(jobs, 0.0, free=free)]
        return a == b

    long_q = _uniform_queue()
    assert not same(long_q)  # the plan is on
    short = [j for j in long_q if j.job_id.endswith("-0") and j.gpu_demand <= 15]  # 120 GPUs
    assert sum(j.gpu_demand for j in short) < PLAN_BACKLOG * 32 and same(short)
    mixed = [*long_q, _job("long", "FSDP", 3, 1.0 * PLAN_SPREAD * 1.01)]
    assert same(mixed)
    late = [*long_q, dataclasses.replace(long_q[0], job_id="late", submit_time=-PLAN_WAIT - 1.0)]  # arrivals
    odd = sum(j.gpu_demand for j in late if j.gpu_demand % 8 and 8 % j.gpu_demand)
    assert odd >= PLAN_ODD * sum(j.gpu_demand for j in late) and not same(late)  # 1..32 GPUs: mostly odd
    aligned = [j for j in late if j.gpu_demand in (1, 2, 4, 8, 16, 24, 32)]  # each fills nodes exactly
    assert sum(j.gpu_demand for j in aligned) >= PLAN_BACKLOG * 32 and same(aligned)
    assert not same([j for j in aligned if j.job_id != "late"])  # the same queue as a batch: waves
    # exactly PLAN_ODD (one half) of the GPUs in odd demands (3 and 5 GPUs) keeps the plan under
    # arrivals; one more aligned job (4 GPUs) tips it to the fill order
    assert PLAN_ODD == 0.5
    half = [_job(f"h{g}-{r}", "FSDP", g, 1.0) for g, n in ((3, 18), (5, 18), (4, 36)) for r in range(n)]
    half[-1] = dataclasses.replace(half[-1], submit_time=-PLAN_WAIT - 1.0)
    assert not same(half)
    assert same([*half, _job("h4-more", "FSDP", 4, 1.0)])
    no_small = [j for j in long_q if j.gpu_demand > 8]
    assert sum(j.gpu_demand for j in no_small) >= PLAN_BACKLOG * 32 and same(no_small)


def test_obs_spec_order_round_trips_and_defaults_to_area():
    spec = ObsSpec.for_cluster(C48, order="fill")
    assert ObsSpec.from_dict(spec.to_dict()) == spec
    old = spec.to_dict()
    del old["order"]  # a stored spec without the field
    assert ObsSpec.from_dict(old).order == "area"
    assert ObsSpec.from_dict(ObsSpec.for_cluster(C48, order="plan").to_dict()).order == "plan"
    with pytest.raises(EncodingError, match="candidate order 'best'"):
        ObsSpec.from_dict({**spec.to_dict(), "order": "best"})


def test_obs_spec_aging_round_trips_and_defaults_to_legacy():
    spec = ObsSpec.for_cluster(C48, order="plan", aging_s=600)
    assert spec.aging_s == 600.0 and type(spec.aging_s) is float
    assert ObsSpec.from_dict(spec.to_dict()) == spec
    assert ObsSpec.from_dict(ObsSpec.for_cluster(C48).to_dict()).aging_s == AGING_S
    old = spec.to_dict()
    del old["aging_s"]  # a spec without the field: LEGACY_AGING_S, the aging such checkpoints were trained with
    assert ObsSpec.from_dict(old).aging_s == LEGACY_AGING_S == 1800.0
    assert spec != ObsSpec.for_cluster(C48, order="plan", aging_s=1800)


@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"k": 0}, r"'k' must be >= 1, got 0"),
        ({"k": -1}, r"'k' must be >= 1"),
        ({"levels": 0}, r"'levels' must be in \[1, 4\], got 0"),
        ({"levels": 5}, r"'levels' must be in \[1, 4\], got 5"),
        ({"num_nodes": 0}, r"'num_nodes' must be >= 1"),
        ({"gpus_per_node": 0}, r"'gpus_per_node' must be >= 1"),
        ({"version": 0}, r"'version' must be >= 1"),
        ({"k": True}, r"'k' must be an integer, got True"),
        ({"gpus_per_node": 8.9}, r"'gpus_per_node' must be an integer, got 8\.9"),
        ({"num_nodes": 4.0}, r"'num_nodes' must be an integer, got 4\.0"),
        ({"levels": "3"}, r"'levels' must be an integer"),
        ({"total_gpus": 33}, r"total_gpus 33 is impossible for 4 nodes of at most 8 GPUs \(expected 11\.\.32\)"),
        ({"total_gpus": 10}, r"total_gpus 10 is impossible"),
        ({"order": None}, r"unknown candidate order None|'order' must be a string, got None"),
        ({"aging_s": 0}, r"aging_s must be a finite number of seconds > 0, got 0"),
        ({"aging_s": -300.0}, r"aging_s must be a finite number of seconds > 0, got -300\.0"),
        ({"aging_s": float("nan")}, r"aging_s must be a finite number of seconds > 0, got nan"),
        ({"aging_s": float("inf")}, r"aging_s must be a finite number of seconds > 0, got inf"),
        ({"aging_s": "300"}, r"aging_s must be a finite number of seconds > 0, got '300'"),
        ({"aging_s": True}, r"aging_s must be a finite number of seconds > 0, got True"),
        ({"aging_s": None}, r"aging_s must be a finite number of seconds > 0, got None"),
        ({"aging_s": 10**400}, r"aging_s must be a finite number of seconds > 0, got 1000000"),  # no OverflowError
    ],
)
def test_obs_spec_rejects_nonsense(kw, msg):
    """Every field is checked (k = 0 would leave only "nothing" to choose: a policy that never starts a job)."""
    with pytest.raises(EncodingError, match=msg):
        ObsSpec(**{"num_nodes": 4, "gpus_per_node": 8, "total_gpus": 32, **kw})
    d = {**ObsSpec.for_cluster(C48).to_dict(), **kw}
    del d["shape"], d["n_actions"]
    with pytest.raises(EncodingError, match=msg):
        ObsSpec.from_dict(d)


def test_obs_spec_from_dict_checks_its_redundant_fields():
    d = ObsSpec.for_cluster(C48).to_dict()
    assert ObsSpec.from_dict(d) == ObsSpec.for_cluster(C48)
    assert type(ObsSpec(np.int64(4), 8, 32).num_nodes) is int  # numpy integers are integers, stored as int
    with pytest.raises(EncodingError, match="n_actions 24 disagrees"):
        ObsSpec.from_dict({**d, "n_actions": 24})
    with pytest.raises(EncodingError, match="shape"):
        ObsSpec.from_dict({**d, "shape": [54, 4, 17]})
    with pytest.raises(EncodingError, match="missing k"):
        ObsSpec.from_dict({x: v for x, v in d.items() if x != "k"})
    with pytest.raises(EncodingError, match="JSON object"):
        ObsSpec.from_dict([1, 2])


def test_heterogeneous_layout_is_checked_and_described():
    from policies.cluster import NodeSpec

    def het(*gpus):
        return ClusterSpec(tuple(NodeSpec(f"n{i}", g) for i, g in enumerate(gpus)))

    assert describe_layout([8, 8, 8, 8]) == "4x8" == C48.describe()
    assert describe_layout([8, 4, 4]) == "1x8+2x4" and describe_layout([4, 8, 4]) == "1x4+1x8+1x4"
    spec = ObsSpec.for_cluster(het(8, 4, 4))
    spec.check_cluster(het(8, 6, 2))  # the spec alone cannot tell (same N, G, total, levels) ...
    with pytest.raises(EncodingError, match=r"trained for a 1x8\+2x4 cluster \(3 nodes, 16 GPUs\) but the cluster is a 1x8\+1x6\+1x2"):
        spec.check_cluster(het(8, 6, 2), layout=(8, 4, 4))  # ... the training layout can
    spec.check_cluster(het(8, 4, 4), layout=(8, 4, 4))
    # without a layout, a heterogeneous spec is not called "3x8"
    with pytest.raises(EncodingError, match=r"trained for a heterogeneous cluster of 3 nodes, at most 8 GPUs each \(16 GPUs\) but the cluster is a 4x8"):
        spec.check_cluster(C48)
    with pytest.raises(EncodingError, match=r"trained for a 4x8 cluster \(4 nodes, 32 GPUs\) but the cluster is an 8x8 cluster"):
        ObsSpec.for_cluster(C48).check_cluster(ClusterSpec.parse("8x8"))


class _OrderPerf(ContentionModel):
    """The shipped model with pair slowdowns whose excesses (by the other job's model) sum to different
    floats in different orders on one node."""

    X = {"MoE": 1.62, "FSDP": 2.82, "DLRM": 1.14}

    def pair_cs(self, a, b) -> float:
        if a[2] <= 1 or b[2] <= 1:
            return 1.0
        return 1.0 + self.X.get(b[0], 0.5)


def test_option_speeds_sum_neighbours_in_job_id_order_from_the_ledger():
    """Option speeds come from the round's contention ledger, each node's neighbours summed in job-id
    order (the oracle's), not in running order; starts update the ledger in running order."""
    cluster = ClusterSpec.parse("2x8")
    perf = _OrderPerf(cluster)
    codec = DeepShareCodec(cluster, perf)

    def run(jid, model):
        p = Placement.of({0: 2, 1: 2})
        iso = perf.isolated_throughput(model, 4, 2)
        return JobInfo(jid, model, 4, 0.0, 3600.0 * iso, placement=p, isolated_thp=iso, achieved_thp=iso,
                       best_thp=perf.best_isolated_throughput(model, 4))

    running = [run("c", "DLRM"), run("b", "FSDP"), run("a", "MoE")]  # running order != id order
    best = perf.best_isolated_throughput("MoE", 4)
    pending = [JobInfo("d", "MoE", 4, 0.0, 3600.0 * best, best_thp=best)]
    state = ClusterState(0.0, cluster, np.array([2, 2]), running, pending)
    rnd = codec.begin(state)
    enc = rnd.encode()
    ref = encode_reference(codec, state)
    _same(enc, ref)
    me = ("MoE", 4, 2)
    by_id = perf.node_cs(me, [("MoE", 4, 2), ("FSDP", 4, 2), ("DLRM", 4, 2)])
    by_running = perf.node_cs(me, [("DLRM", 4, 2), ("FSDP", 4, 2), ("MoE", 4, 2)])
    assert by_id != by_running  # the two orders round differently: the test tells them apart
    two = Placement.of({0: 2, 1: 2})
    s = next(s for s, p in enumerate(enc.options[0]) if p == two)
    iso = perf.isolated_throughput("MoE", 4, 2)
    assert enc.sparse.speeds[s] == min(iso / by_id / best, 1.0)
    # the start goes through the same ledger: every neighbour's CS is the ledger's, which equals a recomputation
    rnd.place("d", two)
    led = rnd._cont.ledger
    led.check()
    assert list(led) == ["c", "b", "a", "d"]
    after = rnd.state()
    assert [j.job_id for j in after.running] == ["c", "b", "a", "d"]
    assert [j.cs for j in after.running] == pytest.approx([led.cs(j) for j in "cbad"], rel=1e-12)
    cur = apply_placement(state, "d", two, perf)
    assert after.running == cur.running
