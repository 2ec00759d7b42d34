"""Fast (structured-observation) RL inference path: same observations, logits and decisions as the dense path.

Covers :class:`policies.encoding.SparseObs` (``Encoder.encode(..., dense=False)``),
:meth:`policies.checkpoint.MLPNet.logits_sparse` and ``RLPolicy(fast=True)``
(the default, whose rounds use the incremental :class:`policies.encoding.RoundEncoder`)
against the dense path ``RLPolicy(fast=False)``. Networks have
random weights of the shipped architecture (obs -> 64 -> 64 -> actions, tanh);
the output bias is optionally tilted towards low action indices so that the
policies place many jobs per round (as trained ones do) rather than holding.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from random_states import random_state

from policies.checkpoint import CheckpointError, MLPNet
from policies.cluster import ClusterSpec, NodeSpec
from policies.encoding import Encoder, ObsSpec, RoundEncoder, apply_placement
from policies.perf import ContentionModel
from policies.rl import RLPolicy, make_rl_policy, prior_net, zero_net
from policies.state import ClusterState
from policies.workloads import MODELS

_CLUSTERS = {
    "4x8": ClusterSpec.parse("4x8"),
    "16x4": ClusterSpec.parse("16x4"),
    "het": ClusterSpec((NodeSpec("a", 8), NodeSpec("b", 4), NodeSpec("c", 2), NodeSpec("d", 8))),
    "128x8": ClusterSpec.parse("128x8"),
}
_PERFS = {k: ContentionModel(c) for k, c in _CLUSTERS.items()}
_ENCS = {k: Encoder(c, _PERFS[k]) for k, c in _CLUSTERS.items()}


def random_net(spec: ObsSpec, seed: int = 0, tilt: float = 0.0, arch=(64, 64), activation: str = "tanh") -> MLPNet:
    """Random MLP of the shipped architecture; ``tilt`` > 0 adds ``-tilt * index`` to the output bias."""
    rng = np.random.default_rng(seed)
    sizes = [int(np.prod(spec.shape)), *arch, spec.n_actions]
    layers = []
    for a, b in itertools.pairwise(sizes):
        W = rng.normal(0, 1 / np.sqrt(a), size=(b, a)).astype(np.float32)
        layers.append((W, rng.normal(0, 0.1, size=b).astype(np.float32)))
    layers[-1] = (layers[-1][0], (layers[-1][1] - tilt * np.arange(sizes[-1])).astype(np.float32))
    return MLPNet(layers, activation)


_NETS: dict[tuple, MLPNet] = {}


def _net(cname: str, seed: int, tilt: float, activation: str = "tanh") -> MLPNet:
    key = (cname, seed, tilt, activation)
    if key not in _NETS:
        _NETS[key] = random_net(_ENCS[cname].spec, seed, tilt, activation=activation)
    return _NETS[key]


def _random_state(cname: str, running, pending, now: float, seed: int) -> ClusterState:
    """Random running jobs on random (also uneven, multi-node) placements plus a random queue."""
    return random_state(_CLUSTERS[cname], _PERFS[cname], running, pending, now, seed)


def _queue(demands):
    """1-30 pending jobs ``(model, demand, remaining hours)`` with demands drawn from ``demands``."""
    return st.lists(st.tuples(st.sampled_from(MODELS), demands, st.floats(0.01, 50)), min_size=1, max_size=30)


def _check_same_encoding(enc_: Encoder, dense, sparse) -> None:
    assert sparse.obs is None and sparse.sparse is not None
    obs = sparse.sparse.dense(enc_.spec, enc_._exists)
    assert obs.dtype == dense.obs.dtype and obs.shape == dense.obs.shape
    assert obs.tobytes() == dense.obs.tobytes()
    assert np.array_equal(dense.mask, sparse.mask)
    assert [j.job_id for j in dense.candidates] == [j.job_id for j in sparse.candidates]
    assert dense.options == sparse.options
    np.testing.assert_array_equal(dense.action_speeds(), sparse.action_speeds())


def _check_logits(net: MLPNet, enc_: Encoder, dense, sparse) -> None:
    ref = net.logits(dense.obs)
    got = net.logits_sparse(sparse.sparse, net.sparse_plan(enc_.spec, enc_._exists))
    assert got.dtype == np.float32 and got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(ref).max())))


_RUN = st.lists(
    st.tuples(st.sampled_from(MODELS), st.sampled_from([1, 2, 3, 4, 6, 8, 16]), st.floats(0.01, 50)), max_size=12
)
_PEND = st.lists(
    st.tuples(st.sampled_from(MODELS), st.sampled_from([1, 2, 3, 4, 5, 8, 12, 16, 32]), st.floats(0.01, 50)),
    max_size=14,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(["4x8", "16x4", "het"]),
    _RUN,
    _PEND,
    st.floats(0, 48 * 3600.0),
    st.integers(0, 2**31 - 1),
    st.sampled_from(["tanh", "relu"]),
)
def test_sparse_obs_and_logits_match_dense(cname, running, pending, now, seed, activation):
    """Property: densified SparseObs == Encoder.encode bit for bit; sparse logits == dense logits (1e-4).

    Also along a sequence of random valid placements with the round's cache,
    as :meth:`RLPolicy.schedule` encodes.
    """
    enc_ = _ENCS[cname]
    net = _net(cname, seed % 3, 0.0, activation)
    state = _random_state(cname, running, pending, now, seed)
    rng = np.random.default_rng(seed)
    cache_d: dict = {}
    cache_s: dict = {}
    cur = state
    for step in range(6):
        q = len(cur.pending) + (3 if step % 2 else 0)
        d = enc_.encode(cur, queue_len=q, cache=cache_d)
        s = enc_.encode(cur, queue_len=q, cache=cache_s, dense=False)
        _check_same_encoding(enc_, d, s)
        _check_logits(net, enc_, d, s)
        valid = np.flatnonzero(d.mask[:-1])
        if valid.size == 0:
            break
        jid, p = d.decode(int(rng.choice(valid)))
        cur = apply_placement(cur, jid, p, enc_.perf)


def _check_round_encoder(net: MLPNet, enc_: Encoder, state: ClusterState, steps: int, rng) -> int:
    """Walk ``steps`` random valid placements with RoundEncoder and with full re-encoding; compare every step.

    Returns the number of placements made.
    """
    plan = net.sparse_plan(enc_.spec, enc_._exists)
    inc = RoundEncoder(enc_, state, plan)
    cur = state
    for step in range(steps):
        q = len(cur.pending) + (2 if step % 2 else 0)
        cands = enc_.candidates(cur.pending, cur.time)
        ref = enc_.encode(cur, candidates=cands, queue_len=q, dense=False)
        got = inc.encode(cands, q)
        assert np.array_equal(ref.mask, got.mask)
        assert [list(o) for o in ref.options] == [list(o) for o in got.options] and ref.candidates == got.candidates
        assert got.valid == np.flatnonzero(ref.mask[:-1]).tolist()
        r, g = ref.sparse, got.sparse
        G = enc_.spec.gpus_per_node
        cells = ([], [], [], [])  # RoundEncoder's column spans expanded to encode()'s cells
        assert (g.opt_c, g.opt_v, g.opt_g) == ([], [], [])
        for c, v, a, b, x in g.spans(enc_.spec):
            assert 0 <= a < b <= G
            for col in range(a, b):
                for lst, val in zip(cells, (c, v, G + col, x), strict=True):
                    lst.append(val)
        assert (r.queue, r.opt_c, r.opt_v, r.opt_g, r.opt_x, r.cand) == (g.queue, *cells, g.cand)
        assert inc.jobs() == r.jobs
        want = np.add.reduce([plan.job(f, sp) for f, sp in r.jobs]) if r.jobs else np.zeros_like(plan.const)
        np.testing.assert_allclose(g.left, want, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(net.logits_sparse(g, plan), net.logits_sparse(r, plan), rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(got.action_speeds(), ref.action_speeds())
        # the round state equals apply_placement's: same free GPUs, same JobInfo values in the same order
        now = inc.state()
        assert np.array_equal(now.free_gpus, cur.free_gpus) and now.running == cur.running
        valid = np.flatnonzero(ref.mask[:-1])
        if valid.size == 0:
            return step
        a = int(rng.choice(valid))
        jid, p = ref.decode(a)
        job = ref.candidates[a // enc_.spec.options]
        inc.place(job, p, enc_.perf)
        cur = apply_placement(cur, jid, p, enc_.perf, job=job)
    return steps


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["4x8", "16x4", "het"]), _RUN, _PEND, st.floats(0, 48 * 3600.0), st.integers(0, 2**31 - 1))
def test_round_encoder_matches_reencoding(cname, running, pending, now, seed):
    """Property: RoundEncoder (incremental) == Encoder.encode of the state after each placement.

    Same mask, candidates, options, right-half cells, running jobs' features and
    spans, summed left contribution (1e-9), logits, option speeds, and the same
    free GPUs and running JobInfos as :func:`apply_placement`.
    """
    enc_ = _ENCS[cname]
    state = _random_state(cname, running, pending, now, seed)
    _check_round_encoder(_net(cname, seed % 3, 0.0), enc_, state, 8, np.random.default_rng(seed))


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.sampled_from(MODELS), st.sampled_from([1, 2, 4, 8, 16, 32]), st.floats(0.01, 50)),
        min_size=40,
        max_size=100,
    ),
    st.lists(
        st.tuples(st.sampled_from(MODELS), st.sampled_from([1, 2, 4, 8, 16, 32]), st.floats(0.01, 50)),
        min_size=10,
        max_size=40,
    ),
    st.integers(0, 2**31 - 1),
)
def test_round_encoder_matches_reencoding_128x8(running, pending, seed):
    """The same on 128x8 states with many (multi-node) running jobs, 12 placements each."""
    state = _random_state("128x8", running, pending, 3600.0, seed)
    _check_round_encoder(_net("128x8", 0, 0.0), _ENCS["128x8"], state, 12, np.random.default_rng(seed))


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.sampled_from(MODELS), st.sampled_from([1, 2, 4, 8, 16]), st.floats(0.01, 50)),
        min_size=20,
        max_size=100,
    ),
    st.lists(
        st.tuples(st.sampled_from(MODELS), st.sampled_from([1, 2, 4, 8, 16, 32]), st.floats(0.01, 50)),
        min_size=20,
        max_size=80,
    ),
    st.integers(0, 2**31 - 1),
    st.booleans(),
    st.booleans(),
)
def test_schedule_identical_to_dense_128x8(running, pending, seed, hybrid, with_prior):
    """Whole rounds on 128x8 (incremental fast path vs dense, with or without the admission prior)."""
    from policies.prior import AdmissionPrior

    enc_ = _ENCS["128x8"]
    net = _net("128x8", seed % 2, 0.5)
    state = _random_state("128x8", running, pending, 7200.0, seed)
    prior = AdmissionPrior() if with_prior else None
    fast = RLPolicy(net, enc_, hybrid=hybrid, fast=True, prior=prior)
    dense = RLPolicy(net, enc_, hybrid=hybrid, fast=False, prior=prior)
    assert fast.schedule(state).place == dense.schedule(state).place
    assert fast.stats == dense.stats


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.sampled_from(MODELS), st.sampled_from([1, 2, 4, 8, 16, 32, 64]), st.floats(0.01, 50)),
        min_size=20,
        max_size=120,
    ),
    _PEND,
    st.integers(0, 2**31 - 1),
)
def test_sparse_logits_match_dense_128x8(running, pending, seed):
    """The same on a 128x8 cluster (a small sample: each dense encoding is 122,880 floats)."""
    enc_ = _ENCS["128x8"]
    net = _net("128x8", 0, 0.0)
    state = _random_state("128x8", running, pending, 3600.0, seed)
    d, s = enc_.encode(state), enc_.encode(state, dense=False)
    _check_same_encoding(enc_, d, s)
    _check_logits(net, enc_, d, s)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(["4x8", "16x4", "het"]),
    _RUN,
    _queue(st.sampled_from([1, 2, 4, 8, 16])),
    st.floats(0, 48 * 3600.0),
    st.integers(0, 2**31 - 1),
    st.sampled_from([0.0, 0.5, 3.0]),
    st.booleans(),
    st.booleans(),
)
def test_schedule_decisions_identical_to_dense(cname, running, pending, now, seed, tilt, hybrid, with_prior):
    """Property: a whole round of rl-base / rl-hybrid (with or without the admission prior) decides as the dense path."""
    from policies.prior import AdmissionPrior

    enc_ = _ENCS[cname]
    net = _net(cname, seed % 3, tilt)
    state = _random_state(cname, running, pending, now, seed)
    prior = AdmissionPrior() if with_prior else None
    fast = RLPolicy(net, enc_, hybrid=hybrid, fast=True, prior=prior)
    dense = RLPolicy(net, enc_, hybrid=hybrid, fast=False, prior=prior)
    a, b = fast.schedule(state), dense.schedule(state)
    assert a.place == b.place and a.preempt == b.preempt
    assert fast.stats == dense.stats
    reenc = RLPolicy(net, enc_, hybrid=hybrid, fast=True, prior=prior)
    reenc.incremental = False  # structured observation re-encoded per placement
    assert reenc.schedule(state).place == a.place
    assert fast.decide(state) == dense.decide(state)


def test_schedule_identical_128x8_and_prior():
    """A long all-pending round on 128x8 (hundreds of placements) and the rl-prior network."""
    enc_ = _ENCS["128x8"]
    rng = np.random.default_rng(5)
    pend = [
        (str(rng.choice(MODELS)), int(rng.choice([1, 2, 4, 8, 16, 32])), float(rng.uniform(0.1, 20))) for _ in range(150)
    ]
    run = [(str(rng.choice(MODELS)), int(rng.choice([1, 2, 4, 8, 16])), float(rng.uniform(0.1, 20))) for _ in range(60)]
    state = _random_state("128x8", run, pend, 7200.0, 11)
    for net in (_net("128x8", 1, 0.5), prior_net(enc_.spec)):
        for hybrid in (False, True):
            a = RLPolicy(net, enc_, hybrid=hybrid, fast=True).schedule(state)
            b = RLPolicy(net, enc_, hybrid=hybrid, fast=False).schedule(state)
            assert a.place == b.place
    assert len(a.place) > 20  # the prior places many jobs: the test exercises long rounds


def _sim_records(policy, cluster, jobs, perf):
    from trainer.simulator import Simulator

    res = Simulator(cluster, jobs, policy, perf).run()
    return [tuple(sorted(vars(r).items())) for r in res.jobs]


@pytest.mark.slow
@pytest.mark.parametrize("hybrid", [False, True])
def test_simulation_identical_fast_vs_dense(hybrid):
    """A 256-job 4x8 trace simulated with fast vs dense rl-base / rl-hybrid (random weights): identical records."""
    from trainer.generate import GeneratorConfig, generate_jobs

    cname = "4x8"
    cluster, perf, enc_ = _CLUSTERS[cname], _PERFS[cname], _ENCS[cname]
    jobs = generate_jobs(cluster, GeneratorConfig(num_jobs=256, seed=3), perf)
    net = _net(cname, 2, 0.3)
    a = _sim_records(RLPolicy(net, enc_, hybrid=hybrid, fast=True), cluster, jobs, perf)
    b = _sim_records(RLPolicy(net, enc_, hybrid=hybrid, fast=False), cluster, jobs, perf)
    assert len(a) == 256 and a == b


@pytest.mark.slow
def test_simulation_identical_shipped_checkpoint():
    """The shipped rl-base 4x8 checkpoint, fast vs dense, on one 256-job trace: identical job records."""
    from trainer.generate import GeneratorConfig, generate_jobs

    cluster = _CLUSTERS["4x8"]
    perf = _PERFS["4x8"]
    try:
        fast = make_rl_policy("rl-base", cluster, perf)
        dense = make_rl_policy("rl-base", cluster, perf)
    except CheckpointError as exc:  # the shipped checkpoint is being retrained for a new encoding version
        pytest.skip(f"shipped checkpoint unavailable: {exc}")
    dense.fast = False
    jobs = generate_jobs(cluster, GeneratorConfig(num_jobs=256, seed=4), perf)
    assert _sim_records(fast, cluster, jobs, perf) == _sim_records(dense, cluster, jobs, perf)


_FILL_ENCS = {k: Encoder(c, _PERFS[k], ObsSpec.for_cluster(c, order="fill")) for k, c in _CLUSTERS.items() if k != "128x8"}
#: a round's inputs for the order properties: cluster, running jobs, queue, time, seed, output tilt
#: (tilt < 0 favours the last action, "nothing": the safety rule acts), then two flags (fast path, ...)
_ROUND = (
    st.sampled_from(["4x8", "16x4", "het"]),
    _RUN,
    _queue(st.integers(1, 32)),
    st.floats(0, 48 * 3600.0),
    st.integers(0, 2**31 - 1),
    st.sampled_from([0.0, 0.5, 3.0, -3.0]),
    st.booleans(),
    st.booleans(),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    *_ROUND,
    st.booleans(),
)
def test_fill_order_schedule_matches_step_by_step(cname, running, pending, now, seed, tilt, fast, tail, hybrid):
    """Property ("fill" order): a round decides as encoding the whole state before every decision.

    ``schedule`` keeps the ranked groups incrementally and re-applies :meth:`Encoder.fill_order`
    with its running free-GPU count; the reference calls :meth:`RLPolicy.decide` (fresh
    ``Encoder.candidates`` from the state) and applies each placement. With ``hybrid``, once the
    network chooses "nothing" the reference runs the safety rule as spelled out in
    ``test_rl._safety_rule_reference``.
    """
    from policies.encoding import FILL_SMALL
    from policies.prior import AdmissionPrior

    enc_ = _FILL_ENCS[cname]
    if tail:  # no small job waits: the tail rule is on from the first decision
        lo = int(FILL_SMALL * enc_.spec.total_gpus) + 1
        pending = [(m, max(g, lo), r) for m, g, r in pending]
    net = random_net(enc_.spec, seed % 3, tilt)
    state = _random_state(cname, running, pending, now, seed)
    pol = RLPolicy(net, enc_, fast=fast, prior=AdmissionPrior(), hybrid=hybrid)
    got = pol.schedule(state).place
    want = _step_by_step(enc_, net, state, hybrid)
    assert got == want
    if hybrid:
        assert pol.stats["fallback_placements"] == len(want) - pol.stats["placements"]


_PLAN_ENCS = {k: Encoder(c, _PERFS[k], ObsSpec.for_cluster(c, order="plan")) for k, c in _CLUSTERS.items() if k != "128x8"}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(*_ROUND)
def test_plan_order_schedule_matches_step_by_step(cname, running, pending, now, seed, tilt, fast, hybrid):
    """Property ("plan" order, waves forced on: no backlog, spread or wait condition): a round decides as
    encoding the whole state before every decision; the plan made at the round's first decision is
    kept by both (placements take jobs off it) and the fill order takes over once no single-node job waits."""
    from unittest import mock

    from policies.prior import AdmissionPrior

    enc_ = _PLAN_ENCS[cname]
    net = random_net(enc_.spec, seed % 3, tilt)
    state = _random_state(cname, running, pending, now, seed)
    inf = float("inf")
    with (
        mock.patch("policies.encoding.PLAN_BACKLOG", 0.0),
        mock.patch("policies.encoding.PLAN_SPREAD", inf),
        mock.patch("policies.encoding.PLAN_WAIT", inf),
    ):
        pol = RLPolicy(net, enc_, fast=fast, prior=AdmissionPrior(), hybrid=hybrid)
        got = pol.schedule(state).place
        want = _step_by_step(enc_, net, state, hybrid)
    assert got == want


def test_plan_order_round_starts_the_first_wave():
    """The untrained prior in "plan" order on an idle 4x8 cluster with a long queue of 1-hour jobs of
    every demand 1..32 starts exactly the first planned wave: single-node jobs in exact complements."""
    from collections import Counter

    from policies.prior import AdmissionPrior
    from policies.waves import plan_waves

    cluster, perf = _CLUSTERS["4x8"], _PERFS["4x8"]
    enc_ = Encoder(cluster, perf, ObsSpec.for_cluster(cluster, order="plan"))
    state = _random_state("4x8", [], [("FSDP", g, 1.0) for g in range(1, 33) for _ in range(8)], 0.0, 0)
    state = ClusterState(0.0, cluster, state.free_gpus, [], [dataclasses.replace(j, done_samples=0.0) for j in state.pending])
    wave = plan_waves(Counter(j.gpu_demand for j in state.pending), 4, 8)[0]
    pol = RLPolicy(zero_net(enc_.spec), enc_, prior=AdmissionPrior())  # the prior decides
    placed = pol.schedule(state).place
    dem = {j.job_id: j.gpu_demand for j in state.pending}
    assert sorted((dem[j] for j, _p in placed), reverse=True) == wave
    assert all(p.num_nodes == 1 for _j, p in placed) and sum(dem[j] for j, _p in placed) == 32


@pytest.mark.parametrize("fast", [True, False])
def test_fill_order_safety_rule_in_the_tail(fast):
    """rl-hybrid in the fill order's tail (no small job waits) with a network that prefers "nothing":
    the safety rule walks the whole queue in fill order (not area order), as the step-by-step reference."""
    from policies.encoding import FILL_SMALL
    from policies.prior import AdmissionPrior

    enc_ = _FILL_ENCS["4x8"]
    lo = int(FILL_SMALL * enc_.spec.total_gpus) + 1
    rng = np.random.default_rng(0)
    acted = 0
    for t in range(60):
        pend = [(str(rng.choice(MODELS)), int(rng.integers(lo, 33)), float(rng.uniform(0.1, 20))) for _ in range(rng.integers(1, 15))]
        run = [(str(rng.choice(MODELS)), int(rng.choice([1, 2, 4, 8])), float(rng.uniform(0.1, 20))) for _ in range(rng.integers(0, 4))]
        state = _random_state("4x8", run, pend, 0.0, t)
        net = random_net(enc_.spec, t % 3, -3.0)
        pol = RLPolicy(net, enc_, fast=fast, prior=AdmissionPrior(), hybrid=True)
        assert pol.schedule(state).place == _step_by_step(enc_, net, state, True)
        acted += pol.stats["fallback_placements"] > 0
    assert acted >= 30  # the rule really acted in most rounds


def _step_by_step(enc_: Encoder, net: MLPNet, state: ClusterState, hybrid: bool) -> list:
    """Reference round: encode the whole state before every decision (:meth:`RLPolicy.decide`); for
    rl-hybrid, once the network chooses "nothing", the safety rule as ``test_rl._safety_rule_reference``."""
    from test_rl import _safety_rule_reference

    from policies.prior import AdmissionPrior

    ref = RLPolicy(net, enc_, fast=False, prior=AdmissionPrior(), hybrid=hybrid)
    want, cur = [], state
    enc_.begin_round()  # one round: the "plan" order's plan is made at its first decision and kept
    try:
        while cur.pending:
            if not enc_.encode(cur).any_placement:
                break
            _a, choice = ref.decide(cur)
            if choice is None:
                if hybrid:
                    want.extend(_safety_rule_reference(ref, cur))
                break
            want.append(choice)
            cur = apply_placement(cur, choice[0], choice[1], enc_.perf)
    finally:
        enc_.end_round()
    return want
