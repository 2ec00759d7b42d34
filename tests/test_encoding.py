"""Observation encoder / action decoder (policies.encoding)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from random_states import random_state

from policies.cluster import ClusterSpec, Placement
from policies.encoding import Encoder, EncodingError, NodeIndex, ObsSpec, apply_placement
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


def test_spec_shapes():
    spec = ObsSpec.for_cluster(C48)
    assert spec.k == 6 and spec.levels == 3 and spec.options == 4 and spec.n_actions == 25
    assert spec.shape == (6 * 4 + 6 * 5, 4, 16)
    big = ObsSpec.for_cluster(ClusterSpec.parse("128x8"))
    assert big.levels == 4 and big.shape[1:] == (128, 16)
    assert ObsSpec.from_dict(spec.to_dict()) == spec


def test_spec_mismatch_is_clear():
    spec = ObsSpec.for_cluster(C48)
    with pytest.raises(EncodingError, match="4x8"):
        Encoder(ClusterSpec.parse("8x8"), PERF, spec)


def test_left_half_and_candidates():
    run = _job("r1", "MoE", 8, placement=Placement.of({0: 4, 1: 4}))
    pend = [
        _job("a", "GraphSage", 4, 2.0),
        _job("b", "DLRM", 4, 1.0),
        _job("c", "FSDP", 1, 1.0),
        _job("d", "MoE", 32, 1.0),
    ]
    enc = Encoder(C48, PERF).encode(_state([run], pend))
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
    enc = Encoder(C48, PERF).encode(_state([], [_job("a", "MoE", 8)]))
    assert not enc.mask[enc.spec.noop] and enc.any_placement
    with pytest.raises(ValueError):
        enc.decode(enc.spec.noop)


def test_decode_gives_fitting_placement_with_speed_channel():
    run = _job("r1", "FSDP", 8, placement=Placement.of({0: 4, 1: 4}))
    st_ = _state([run], [_job("a", "MoE", 8)])
    enc = Encoder(C48, PERF).encode(st_)
    S = enc.spec.options
    for s in range(S):
        if enc.mask[s]:
            jid, p = enc.decode(s)
            assert jid == "a" and p.total_gpus == 8 and p.fits(st_.free_gpus)
            G = enc.spec.gpus_per_node
            ch = enc.obs[s, :, G:]
            assert (ch > 0).sum() == 8  # the 8 slots it would take
            assert ch.max() <= 1.0


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
    """Property: applying any sequence of valid actions never over-allocates a node."""
    rng = np.random.default_rng(seed)
    pend = [_job(f"j{i}", m, g, r) for i, (m, g, r) in enumerate(jobs)]
    state = _state([], pend)
    enc_ = Encoder(C48, PERF)
    for _ in range(20):
        enc = enc_.encode(state)
        valid = np.flatnonzero(enc.mask)
        assert valid.size >= 1
        a = int(rng.choice(valid))
        d = enc.decode(a)
        if d is None:
            break
        jid, p = d
        assert p.fits(state.free_gpus)
        state = apply_placement(state, jid, p, PERF)
        assert (state.free_gpus >= 0).all()
        assert int(state.free_gpus.sum()) + sum(j.gpu_demand for j in state.running) == C48.total_gpus


def test_apply_placement_updates_neighbour_contention():
    run = _job("r1", "MoE", 8, placement=Placement.of({0: 4, 1: 4}))
    state = _state([run], [_job("a", "FSDP", 8)])
    after = apply_placement(state, "a", Placement.of({0: 4, 1: 4}), PERF)
    r1 = next(j for j in after.running if j.job_id == "r1")
    assert r1.cs > 1.0
    assert [j.job_id for j in state.running] == ["r1"] and state.running[0].cs == 1.0  # input untouched
    with pytest.raises(ValueError):
        apply_placement(after, "a", Placement.of({2: 8}), PERF)


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
    """Two :class:`Encoded` are identical: bit-equal observations, equal masks, candidates and options."""
    assert a.obs.dtype == b.obs.dtype and a.obs.shape == b.obs.shape
    assert a.obs.tobytes() == b.obs.tobytes()
    assert np.array_equal(a.mask, b.mask)
    assert [j.job_id for j in a.candidates] == [j.job_id for j in b.candidates]
    assert a.options == b.options


def _het() -> ClusterSpec:
    from policies.cluster import NodeSpec

    return ClusterSpec((NodeSpec("a", 8), NodeSpec("b", 4), NodeSpec("c", 2), NodeSpec("d", 8)))


_CLUSTERS = {"4x8": C48, "16x4": ClusterSpec.parse("16x4"), "het": _het()}
_PERFS = {k: (PERF if c is C48 else ContentionModel(c)) for k, c in _CLUSTERS.items()}


@settings(max_examples=80, deadline=None)
@given(
    st.sampled_from(sorted(_CLUSTERS)),
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
def test_fast_encode_bit_identical_to_reference(cname, running, pending, now, seed):
    """Property: Encoder.encode (batched writes, feature cache) == encode_reference, bit for bit.

    Random clusters (homogeneous, many small nodes, heterogeneous), random
    running jobs on random (also uneven multi-node) placements so contention
    varies, random queues and clock; then a sequence of random valid actions
    with the cache a scheduling round keeps, as in :meth:`RLPolicy.schedule`.
    """
    cluster, perf = _CLUSTERS[cname], _PERFS[cname]
    enc_ = Encoder(cluster, perf)
    rng = np.random.default_rng(seed)
    state = random_state(cluster, perf, running, pending, now, rng, id_width=2)

    _same(enc_.encode(state), enc_.encode_reference(state))
    cache: dict = {}
    cur = state
    for _ in range(8):
        fast = enc_.encode(cur, cache=cache)
        ref = enc_.encode_reference(cur)
        _same(fast, ref)
        cands = enc_.candidates(cur.pending)
        _same(
            enc_.encode(cur, candidates=cands, queue_len=len(cur.pending) + 3, cache=cache),
            enc_.encode_reference(cur, candidates=cands, queue_len=len(cur.pending) + 3),
        )
        valid = np.flatnonzero(fast.mask[:-1])
        if valid.size == 0:
            break
        jid, p = fast.decode(int(rng.choice(valid)))
        cur = apply_placement(cur, jid, p, perf)


def test_unusable_nodes_get_no_option_and_keep_apply_placement_consistent():
    """A node marked unusable (ClusterState.usable) with GPUs reported free: no option of any candidate uses
    it, encode / encode_reference / the RoundEncoder agree, and apply_placement keeps the mask."""
    from policies.encoding import RoundEncoder
    from policies.rl import zero_net

    rng = np.random.default_rng(3)
    state = random_state(C48, PERF, [("MoE", 4, 2.0), ("FSDP", 8, 1.0)],
                         [(m, g, 1.0) for m in ("MoE", "DLRM") for g in (1, 2, 4, 8, 12)], 3600.0, rng)
    usable = np.array([True, False, True, False])
    st_ = dataclasses.replace(state, usable=usable)
    assert st_.free_gpus[~usable].sum() == 0 and st_.free_gpus[usable].tolist() == state.free_gpus[usable].tolist()
    enc_ = Encoder(C48, PERF)
    got = enc_.encode(st_)
    _same(got, enc_.encode_reference(st_))
    opts = [p for o in got.options for p in o if p is not None]
    assert opts and all(usable[v] for p in opts for v in p.nodes)
    jid, p = got.decode(int(np.flatnonzero(got.mask[:-1])[0]))
    nxt = apply_placement(st_, jid, p, PERF)
    assert nxt.usable is usable or np.array_equal(nxt.usable, usable)
    rnd = RoundEncoder(enc_, st_, zero_net(enc_.spec).sparse_plan(enc_.spec, enc_._exists))
    assert np.array_equal(rnd.state().usable, usable)
    sparse = rnd.encode(got.candidates, len(st_.pending))
    assert np.array_equal(sparse.mask, got.mask)


def test_candidate_order_ages_waiting_jobs():
    """A large job that has waited long enough overtakes a newly arrived small one."""
    from policies.encoding import AGING_S

    small = _job("small", "FSDP", 1, 1.0)
    big = _job("big", "MoE", 16, 1.0)
    enc_ = Encoder(C48, PERF)
    # Arrived together: plain remaining GPU-time order (1 GPU-h before 16 GPU-h).
    assert [c.job_id for c in enc_.candidates([big, small], now=0.0)] == ["small", "big"]
    # The big job waited 2 h, the small one just arrived: 16 * exp(-4) < 1.
    small.submit_time = 2 * 3600.0
    now = 2 * 3600.0
    assert 16 * np.exp(-now / AGING_S) < 1.0
    assert [c.job_id for c in enc_.candidates([big, small], now=now)] == ["big", "small"]
    # encode() ages by the state's clock.
    state = ClusterState(now, C48, np.array(C48.gpus_per_node), [], [small, big])
    assert [c.job_id for c in enc_.encode(state).candidates] == ["big", "small"]


def test_candidate_aging_is_the_specs():
    """The aging constant comes from the spec (a checkpoint's), not from a module global: the same
    two jobs are ordered differently under 300 s and 1800 s, and jobs that waited equally never are."""
    from policies.encoding import LEGACY_AGING_S
    from policies.state import time_key

    small = _job("small", "FSDP", 1, 1.0)
    big = _job("big", "MoE", 16, 1.0)
    small.submit_time = 3600.0  # big waited 1 h longer: 16 * exp(-3600 / 300) < 1 < 16 * exp(-3600 / 1800)
    order = {}
    for a in (300.0, LEGACY_AGING_S):
        enc_ = Encoder(C48, PERF, ObsSpec.for_cluster(C48, aging_s=a))
        order[a] = [c.job_id for c in enc_.candidates([big, small], now=3600.0)]
        assert enc_.rank_key(big, 3600.0)[0] == pytest.approx(16 * np.exp(-3600.0 / a) * time_key(big.remaining_time))
        # submitted together: the plain GPU-time order whatever the aging
        together = [dataclasses.replace(big, submit_time=3600.0), small]
        assert [c.job_id for c in enc_.candidates(together, now=7200.0)] == ["small", "big"]
    assert order == {300.0: ["big", "small"], LEGACY_AGING_S: ["small", "big"]}


_ENC_BY_N: dict[int, Encoder] = {}


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 8), st.integers(0, 3)), min_size=1, max_size=40),
    st.lists(st.tuples(st.integers(0, 39), st.integers(0, 8), st.integers(0, 2)), max_size=12),
    st.sampled_from([1, 2, 3, 4, 5, 7, 8, 12, 16, 24, 32, 64]),
)
def test_node_index_matches_scans(nodes, updates, g):
    """NodeIndex gives the same balanced options and packing as the numpy scans, also after updates."""
    free = np.array([f for f, _m in nodes], dtype=np.int64)
    mload = np.array([m for _f, m in nodes], dtype=np.int64)
    N = len(nodes)
    if N not in _ENC_BY_N:
        cluster = ClusterSpec.parse(f"{N}x8")
        _ENC_BY_N[N] = Encoder(cluster, ContentionModel(cluster))
    enc_ = _ENC_BY_N[N]
    nix = NodeIndex(free.tolist(), mload.tolist())
    job = JobInfo("j", MODELS[0], g, 0.0, 1.0)
    for step in range(len(updates) + 1):
        order = np.lexsort((np.arange(N), free, mload))
        want = enc_._options(job, free, order)
        assert list(enc_._options_indexed(g, nix)) == want
        assert nix.pack(g) == pack(job, free)
        for g2 in (1, 3, 8, 2 * g):  # answers kept across updates (NodeIndex._forget) stay right
            job2 = JobInfo("j2", MODELS[0], g2, 0.0, 1.0)
            assert list(enc_._options_indexed(g2, nix)) == enc_._options(job2, free, order)
            assert nix.pack(g2) == pack(job2, free)
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
def test_srtf_heaps_pop_in_srtf_order(rows):
    """Encoder.srtf_heaps: popping each demand group gives its jobs sorted by Encoder.srtf_key (ties included)."""
    import heapq

    jobs = [
        JobInfo(f"j{i:03d}", MODELS[0], g, sub, tot, done_samples=min(done, tot * 2), best_thp=thp)
        for i, (g, sub, tot, done, thp) in enumerate(rows)
    ]
    heaps = Encoder.srtf_heaps(jobs)
    assert sorted(heaps) == sorted({j.gpu_demand for j in jobs})
    for g, h in heaps.items():
        got = [heapq.heappop(h)[-1] for _ in range(len(h))]
        assert got == sorted((j for j in jobs if j.gpu_demand == g), key=Encoder.srtf_key)
    dup = jobs + [jobs[0]] if jobs else []  # a duplicated id never compares two JobInfos
    for h in Encoder.srtf_heaps(dup).values():
        assert len([heapq.heappop(h) for _ in range(len(h))]) >= 1


def _fill_enc() -> Encoder:
    from policies.encoding import ObsSpec

    return Encoder(C48, PERF, ObsSpec.for_cluster(C48, order="fill"))


def test_fill_order_is_area_order_while_small_jobs_wait():
    """"fill" equals "area" while a job of at most FILL_SMALL x C GPUs waits, or no job of C/2 < demand < C does."""
    from policies.encoding import FILL_SMALL

    area, fill = Encoder(C48, PERF), _fill_enc()
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
    fill = _fill_enc()
    C = C48.total_gpus
    assert C == 32
    jobs = [_job(f"j{g}", "FSDP", g, 1.0) for g in (6, 9, 12, 15, 16, 17, 20, 30, 32)]
    # idle cluster: the 17-GPU job, then every job of <= 16 GPUs, largest first (K = 6)
    assert [j.gpu_demand for j in fill.candidates(jobs, 0.0, free=C)] == [17, 16, 15, 12, 9, 6]
    # 15 GPUs free (the 17-GPU job runs): the 17-GPU head does not fit, the fitting fillers follow it
    assert [j.gpu_demand for j in fill.candidates(jobs[:5] + jobs[6:], 0.0, free=15)] == [20, 15, 12, 9, 6, 16]
    # encode() passes the state's free GPUs
    state = ClusterState(0.0, C48, np.array([8, 7, 0, 0]), [], jobs)  # 15 free
    assert [j.gpu_demand for j in fill.encode(state).candidates] == [17, 15, 12, 9, 6, 16]
    with pytest.raises(ValueError, match="free GPU"):
        fill.candidates(jobs, 0.0)


def test_queue_order_covers_the_whole_queue():
    """Encoder.queue_order (rl-hybrid's safety rule): every pending job, not only the best of each
    demand or the first K, in area order, or in fill order once no small job waits."""
    area, fill = Encoder(C48, PERF), _fill_enc()
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


def _plan_enc() -> Encoder:
    from policies.encoding import ObsSpec

    return Encoder(C48, PERF, ObsSpec.for_cluster(C48, order="plan"))


def _uniform_queue(reps: int = 8, rem_h: float = 1.0) -> list[JobInfo]:
    """``reps`` jobs of every demand 1..32 (528 x reps GPUs: a long queue of equal-length jobs)."""
    return [_job(f"j{g}-{r}", "FSDP", g, rem_h) for g in range(1, 33) for r in range(reps)]


def test_plan_order_candidates_follow_the_waves():
    """A long queue of equal-length jobs: the candidates are the demand heads in the order their
    demands first appear in policies.waves.plan_order (the first wave: complements node by node)."""
    from collections import Counter

    from policies.waves import plan_order

    enc = _plan_enc()
    jobs = _uniform_queue()
    order = plan_order(Counter(j.gpu_demand for j in jobs), 4, 8)
    firsts = list(dict.fromkeys(order))[:6]
    got = enc.candidates(jobs, 0.0, free=32)
    assert [j.gpu_demand for j in got] == firsts
    assert all(j.job_id.endswith("-0") for j in got)  # each demand's SRTF head (ties: id)
    # the whole queue in plan order, each demand's jobs in SRTF order
    q = enc.queue_order(jobs, 0.0, free=32)
    assert [j.gpu_demand for j in q] == order and sorted(j.job_id for j in q) == sorted(j.job_id for j in jobs)
    with pytest.raises(ValueError, match="free GPU"):
        enc.candidates(jobs, 0.0)


def test_plan_is_kept_within_a_round_and_remade_at_the_next():
    """Inside a round (Encoder.begin_round) placing jobs off the plan keeps the other waves (each job
    taken from the first wave holding its demand); a later time, a demand with more jobs than planned,
    a new round or no round at all replans."""
    from collections import Counter

    from policies.waves import plan_order

    enc = _plan_enc()
    jobs = _uniform_queue()
    counts = Counter(j.gpu_demand for j in jobs)
    enc.begin_round()
    plan = enc.plan_remaining(dict(counts), 0.0, jobs)
    first = plan[0]
    counts[first] -= 1
    rest = plan[1:]
    assert rest != plan_order(counts, 4, 8)  # (so that the checks below tell kept from replanned)
    assert enc.plan_remaining(dict(counts), 0.0, jobs) == rest
    enc.end_round()
    assert enc.plan_remaining(dict(counts), 0.0, jobs) == plan_order(counts, 4, 8)  # no round: planned afresh
    enc.begin_round()
    assert enc.plan_remaining(dict(Counter(j.gpu_demand for j in jobs)), 0.0, jobs) == plan
    enc.begin_round()  # the next round at the same time, one job started: replanned from its queue
    assert enc.plan_remaining(dict(counts), 0.0, jobs) == plan_order(counts, 4, 8)
    assert enc.plan_remaining(dict(counts), 60.0, jobs) == plan_order(counts, 4, 8)  # a later time: replanned
    counts[first] += 2  # an arrival at the same time: more jobs than planned
    assert enc.plan_remaining(dict(counts), 60.0, jobs) == plan_order(counts, 4, 8)


def test_encoder_is_pure_outside_a_round_and_across_rounds():
    """The plan memo never leaks from one queue to another at the same time (after encoding a long uniform
    batch, a shorter queue whose remaining times differ too much for waves must not get the batch's plan):
    candidates and observations equal a fresh encoder's, outside a round and in a new round;
    RLPolicy.reset forgets any plan."""
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
    fresh = Encoder(C48, perf, spec)
    want = [j.job_id for j in fresh.candidates(sb.pending, now, sb.total_free)]
    want_enc = Encoder(C48, perf, spec).encode(sb)
    for in_round in (False, True):
        warm = Encoder(C48, perf, spec)
        if in_round:
            warm.begin_round()
        warm.candidates(sa.pending, now, sa.total_free)
        if in_round:
            warm.begin_round()  # the next round: another queue at the same time
        assert [j.job_id for j in warm.candidates(sb.pending, now, sb.total_free)] == want
        got = warm.encode(sb)
        assert np.array_equal(got.obs, want_enc.obs) and np.array_equal(got.mask, want_enc.mask)
    # a policy's rounds: B after A decides as B alone
    pol = RLPolicy(zero_net(spec), Encoder(C48, perf, spec), prior=AdmissionPrior(), name="prior")
    alone = copy.deepcopy(pol).schedule(sb)
    pol.schedule(sa)
    assert pol.encoder._plan is None  # the round's plan is gone with the round
    assert pol.schedule(sb) == alone
    pol.encoder.begin_round()
    pol.encoder.candidates(sa.pending, now, sa.total_free)
    pol.reset()
    assert pol.encoder._plan is None and pol.schedule(sb) == alone


@settings(max_examples=40, deadline=None)
@given(starts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=60))
def test_plan_rest_within_a_round_equals_removing_each_start_from_the_plan(starts):
    """Any sequence of starts within a round: the rest of the plan is the plan with each started job's
    demand removed at its first occurrence, one start at a time, and the candidates are the demand
    heads in the order their demands first appear in that rest (cut to K)."""
    from collections import Counter

    enc = _plan_enc()
    jobs = _uniform_queue(reps=2)
    counts = Counter(j.gpu_demand for j in jobs)
    enc.begin_round()
    rest = enc.plan_remaining(dict(counts), 0.0, jobs)
    heads = {}
    groups: dict[int, list] = {}  # the waiting jobs per demand; its first is the group's head
    for j in jobs:
        heads.setdefault(j.gpu_demand, j)
        groups.setdefault(j.gpu_demand, []).append(j)
    # the round's cursor (what RLPolicy.schedule uses) must give the same candidates as plan_heads
    cursor = enc.plan_cursor([g[0] for _d, g in sorted(groups.items())], dict(counts), 0.0, jobs)
    assert cursor is not None
    for x in starts:
        left = [d for d, c in counts.items() if c]
        if not left:
            break
        d = left[x % len(left)]  # any demand still waiting, not only the plan's next
        counts[d] -= 1
        rest.remove(d)
        g = groups[d]
        cursor.started(g.pop(0), g[0] if g else None)
        assert cursor.counts == dict(counts)
        assert cursor.n_single == sum(1 for e, c in counts.items() if c and e <= 8)
        assert enc.plan_remaining(dict(counts), 0.0, jobs) == rest
        got = enc.plan_heads([heads[d] for d in sorted(heads)], dict(counts), 0.0, 32, jobs)
        if any(c and d <= 8 for d, c in counts.items()):
            assert [j.gpu_demand for j in got] == list(dict.fromkeys(rest))[: enc.spec.k]
            assert [j.gpu_demand for j in cursor.heads()] == [j.gpu_demand for j in got]


def test_plan_order_falls_back_to_fill():
    """Fill order where waves do not model the queue: a short queue, remaining times that differ
    by more than PLAN_SPREAD, submit times further apart than PLAN_WAIT while most of the demand
    fills nodes exactly (less than PLAN_ODD in odd demands), or no single-node job left (the fill
    order's tail rule then). Under arrivals, a queue of mostly odd demands keeps the plan."""
    from policies.encoding import PLAN_BACKLOG, PLAN_ODD, PLAN_SPREAD, PLAN_WAIT

    fill = _fill_enc()

    def same(jobs, free=32):  # a fresh encoder: its plan is kept for later calls at the same time
        a = [j.job_id for j in _plan_enc().candidates(jobs, 0.0, free=free)]
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
    from policies.encoding import EncodingError, ObsSpec

    spec = ObsSpec.for_cluster(C48, order="fill")
    assert ObsSpec.from_dict(spec.to_dict()) == spec
    old = spec.to_dict()
    del old["order"]  # checkpoints written before the field existed
    assert ObsSpec.from_dict(old).order == "area"
    assert ObsSpec.from_dict(ObsSpec.for_cluster(C48, order="plan").to_dict()).order == "plan"
    with pytest.raises(EncodingError, match="candidate order 'best'"):
        ObsSpec.from_dict({**spec.to_dict(), "order": "best"})


def test_obs_spec_aging_round_trips_and_defaults_to_legacy():
    from policies.encoding import AGING_S, LEGACY_AGING_S

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
    """Nonsense specs are refused; k = 0 would leave only "nothing" to choose (simulate would idle for
    10,000 rounds)."""
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
    from policies.encoding import describe_layout

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
