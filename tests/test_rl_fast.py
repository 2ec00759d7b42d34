"""Fast (structured-observation) RL inference path: same observations, logits and decisions as the dense path.

Covers the deepshare-v1 codec round (:class:`policies.codecs.deepshare.DeepShareRound`, incremental over
a round's placements) against the straightforward reference encoder and state transition
(``tests/oracles/deepshare_reference.py``), the linear first-layer plan
(:meth:`policies.codecs.deepshare.DeepShareCodec.linear_plan`, :meth:`policies.checkpoint.MLPNet.logits_from_first`)
against the dense tensor, and ``RLPolicy(fast=True)`` (the default) against the dense path
``RLPolicy(fast=False)``. Networks have random weights of the shipped architecture (obs -> 64 -> 64 ->
actions, tanh); the output bias is optionally tilted towards low action indices so that the policies
place many jobs per round (as trained ones do) rather than holding.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from oracles.deepshare_reference import apply_placement, candidates_reference, encode_reference
from random_states import random_state

from policies.checkpoint import CheckpointError, MLPNet
from policies.cluster import ClusterSpec, NodeSpec
from policies.codecs.deepshare import DeepShareCodec, ObsSpec
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
_CODECS = {k: DeepShareCodec(c, _PERFS[k]) for k, c in _CLUSTERS.items()}


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
        _NETS[key] = random_net(_CODECS[cname].spec, seed, tilt, activation=activation)
    return _NETS[key]


def _random_state(cname: str, running, pending, now: float, seed: int) -> ClusterState:
    """Random running jobs on random (also uneven, multi-node) placements plus a random queue."""
    return random_state(_CLUSTERS[cname], _PERFS[cname], running, pending, now, seed)


def _queue(demands):
    """1-30 pending jobs ``(model, demand, remaining hours)`` with demands drawn from ``demands``."""
    return st.lists(st.tuples(st.sampled_from(MODELS), demands, st.floats(0.01, 50)), min_size=1, max_size=30)


def _check_first_layer(net: MLPNet, codec: DeepShareCodec, enc) -> None:
    """The linear plan's first layer on the structured observation == the dense tensor's (float64, 1e-9),
    and the logits agree (1e-4)."""
    plan = net.first_layer_plan(codec)
    Wt, b = net.layers[0]
    ref = enc.obs.reshape(-1).astype(np.float64) @ Wt.astype(np.float64) + b.astype(np.float64)
    got = enc.first_layer(plan)
    assert got.dtype == np.float64 and got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-9, atol=1e-9 * max(1.0, float(np.abs(ref).max())))
    z = net.logits(enc.obs)
    zs = net.logits_from_first(got)
    assert zs.dtype == np.float32 and zs.shape == z.shape
    np.testing.assert_allclose(zs, z, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(z).max())))


_RUN = st.lists(
    st.tuples(st.sampled_from(MODELS), st.sampled_from([1, 2, 3, 4, 6, 8, 16]), st.floats(0.01, 50)), max_size=12
)
_PEND = st.lists(
    st.tuples(st.sampled_from(MODELS), st.sampled_from([1, 2, 3, 4, 5, 8, 12, 16, 32]), st.floats(0.01, 50)),
    max_size=14,
)


def _check_round(net: MLPNet, codec: DeepShareCodec, state: ClusterState, steps: int, rng) -> int:
    """Walk ``steps`` random valid placements with a codec round (with the network's linear plan) and
    with the reference (whole state re-encoded from scratch after each start); compare every step:
    bit-equal dense observations, masks, candidates, options, option speeds, the first layer and
    logits of the structured observation, and the round's state. Returns the placements made."""
    rnd = codec.begin(state, net.first_layer_plan(codec))
    cur = state
    for step in range(steps):
        got = rnd.encode(dense=True)
        ref = encode_reference(codec, cur)
        assert got.obs.tobytes() == ref.obs.tobytes()
        assert np.array_equal(ref.mask, got.mask) and got.valid == np.flatnonzero(ref.mask[:-1]).tolist()
        assert [list(o) for o in ref.options] == [list(o) for o in got.options] and ref.candidates == got.candidates
        np.testing.assert_array_equal(got.action_speeds(), ref.action_speeds())
        _check_first_layer(net, codec, got)
        sparse = rnd.encode(dense=False)  # the same round, structured form only: the same first layer
        assert sparse.obs is None and np.array_equal(sparse.first_layer(net.first_layer_plan(codec)),
                                                     got.first_layer(net.first_layer_plan(codec)))
        now = rnd.state()  # the round state equals apply_placement's: same free GPUs, same JobInfos in order
        assert np.array_equal(now.free_gpus, cur.free_gpus) and now.running == cur.running
        valid = np.flatnonzero(ref.mask[:-1])
        if valid.size == 0:
            return step
        a = int(rng.choice(valid))
        jid, p = ref.decode(a)
        rnd.place(jid, p)
        cur = apply_placement(cur, jid, p, codec.perf)
    return steps


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(["4x8", "16x4", "het"]),
    _RUN,
    _PEND,
    st.floats(0, 48 * 3600.0),
    st.integers(0, 2**31 - 1),
    st.sampled_from(["tanh", "relu"]),
)
def test_round_matches_reference_and_dense(cname, running, pending, now, seed, activation):
    """Property: a codec round == the reference encoder of the state after each placement, bit for bit;
    its structured observation's first layer == the dense tensor's (1e-9), logits (1e-4); its states ==
    the reference transition's."""
    state = _random_state(cname, running, pending, now, seed)
    _check_round(_net(cname, seed % 3, 0.0, activation), _CODECS[cname], state, 8, np.random.default_rng(seed))


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
def test_round_matches_reference_128x8(running, pending, seed):
    """The same on 128x8 states with many (multi-node) running jobs, 12 placements each (each dense
    encoding is 122,880 floats)."""
    state = _random_state("128x8", running, pending, 3600.0, seed)
    _check_round(_net("128x8", 0, 0.0), _CODECS["128x8"], state, 12, np.random.default_rng(seed))


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
    """Whole rounds on 128x8 (structured fast path vs dense, with or without the admission prior)."""
    from policies.prior import AdmissionPrior

    codec = _CODECS["128x8"]
    net = _net("128x8", seed % 2, 0.5)
    state = _random_state("128x8", running, pending, 7200.0, seed)
    prior = AdmissionPrior() if with_prior else None
    fast = RLPolicy(net, codec, hybrid=hybrid, fast=True, prior=prior)
    dense = RLPolicy(net, codec, hybrid=hybrid, fast=False, prior=prior)
    assert fast.schedule(state).place == dense.schedule(state).place
    assert fast.stats == dense.stats


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

    codec = _CODECS[cname]
    net = _net(cname, seed % 3, tilt)
    state = _random_state(cname, running, pending, now, seed)
    prior = AdmissionPrior() if with_prior else None
    fast = RLPolicy(net, codec, hybrid=hybrid, fast=True, prior=prior)
    dense = RLPolicy(net, codec, hybrid=hybrid, fast=False, prior=prior)
    a, b = fast.schedule(state), dense.schedule(state)
    assert a.place == b.place and a.preempt == b.preempt
    assert fast.stats == dense.stats
    assert fast.decide(state) == dense.decide(state)
    if a.place and not hybrid:  # a round's first decision is decide()'s
        assert fast.decide(state)[1] == a.place[0]


def test_an_encoding_reads_its_first_layer_before_the_next_placement():
    """The running jobs' first-layer sum of an encoding is the round's at the encoding: read before the
    round's next placement it is kept, read after it is refused (it would be another state's)."""
    codec = _CODECS["4x8"]
    net = _net("4x8", 0, 0.0)
    plan = net.first_layer_plan(codec)
    state = _random_state("4x8", [("MoE", 4, 2.0), ("FSDP", 2, 1.0)], [("DLRM", 2, 1.0), ("MoE", 1, 3.0)], 600.0, 1)
    rnd = codec.begin(state, plan)
    read, unread = rnd.encode(dense=False), rnd.encode(dense=False)
    before = read.first_layer(plan)
    rnd.place(*read.decode(read.valid[0]))
    np.testing.assert_array_equal(read.first_layer(plan), before)
    with pytest.raises(ValueError, match="stale"):
        unread.first_layer(plan)
    assert not np.array_equal(rnd.encode(dense=False).first_layer(plan), before)
    with pytest.raises(ValueError, match="without this linear plan"):
        codec.begin(state).encode(dense=False).first_layer(plan)


def test_schedule_identical_128x8_and_prior():
    """A long all-pending round on 128x8 (hundreds of placements) and the rl-prior network."""
    codec = _CODECS["128x8"]
    rng = np.random.default_rng(5)
    pend = [
        (str(rng.choice(MODELS)), int(rng.choice([1, 2, 4, 8, 16, 32])), float(rng.uniform(0.1, 20))) for _ in range(150)
    ]
    run = [(str(rng.choice(MODELS)), int(rng.choice([1, 2, 4, 8, 16])), float(rng.uniform(0.1, 20))) for _ in range(60)]
    state = _random_state("128x8", run, pend, 7200.0, 11)
    for net in (_net("128x8", 1, 0.5), prior_net(codec.spec)):
        for hybrid in (False, True):
            a = RLPolicy(net, codec, hybrid=hybrid, fast=True).schedule(state)
            b = RLPolicy(net, codec, hybrid=hybrid, fast=False).schedule(state)
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
    cluster, perf, codec = _CLUSTERS[cname], _PERFS[cname], _CODECS[cname]
    jobs = generate_jobs(cluster, GeneratorConfig(num_jobs=256, seed=3), perf)
    net = _net(cname, 2, 0.3)
    a = _sim_records(RLPolicy(net, codec, hybrid=hybrid, fast=True), cluster, jobs, perf)
    b = _sim_records(RLPolicy(net, codec, hybrid=hybrid, fast=False), cluster, jobs, perf)
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
    except CheckpointError as exc:  # a checkpoint of another encoding version than this rlsched's
        pytest.skip(f"shipped checkpoint unavailable: {exc}")
    dense.fast = False
    jobs = generate_jobs(cluster, GeneratorConfig(num_jobs=256, seed=4), perf)
    assert _sim_records(fast, cluster, jobs, perf) == _sim_records(dense, cluster, jobs, perf)


_FILL_CODECS = {k: DeepShareCodec(c, _PERFS[k], ObsSpec.for_cluster(c, order="fill")) for k, c in _CLUSTERS.items() if k != "128x8"}
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

    ``schedule`` keeps the ranked groups incrementally and re-applies the fill order with its running
    free-GPU count; the reference encodes the whole state from scratch (the order's candidates of the
    whole queue) and applies each placement. With ``hybrid``, once the
    network chooses "nothing" the reference runs the safety rule as spelled out in
    ``test_rl._safety_rule_reference``.
    """
    from policies.orders import FILL_SMALL
    from policies.prior import AdmissionPrior

    codec = _FILL_CODECS[cname]
    if tail:  # no small job waits: the tail rule is on from the first decision
        lo = int(FILL_SMALL * codec.spec.total_gpus) + 1
        pending = [(m, max(g, lo), r) for m, g, r in pending]
    net = random_net(codec.spec, seed % 3, tilt)
    state = _random_state(cname, running, pending, now, seed)
    pol = RLPolicy(net, codec, fast=fast, prior=AdmissionPrior(), hybrid=hybrid)
    got = pol.schedule(state).place
    want = _step_by_step(codec, net, state, hybrid)
    assert got == want
    if hybrid:
        assert pol.stats["fallback_placements"] == len(want) - pol.stats["placements"]


_PLAN_CODECS = {k: DeepShareCodec(c, _PERFS[k], ObsSpec.for_cluster(c, order="plan")) for k, c in _CLUSTERS.items() if k != "128x8"}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(*_ROUND)
def test_plan_order_schedule_matches_step_by_step(cname, running, pending, now, seed, tilt, fast, hybrid):
    """Property ("plan" order, waves forced on: no backlog, spread or wait condition): a round decides as
    encoding the whole state from scratch before every decision; the plan made at the round's start is
    kept by both (placements take jobs off it) and the fill order takes over once no single-node job waits."""
    from unittest import mock

    from policies.prior import AdmissionPrior

    codec = _PLAN_CODECS[cname]
    net = random_net(codec.spec, seed % 3, tilt)
    state = _random_state(cname, running, pending, now, seed)
    inf = float("inf")
    with (
        mock.patch("policies.orders.PLAN_BACKLOG", 0.0),
        mock.patch("policies.orders.PLAN_SPREAD", inf),
        mock.patch("policies.orders.PLAN_WAIT", inf),
    ):
        pol = RLPolicy(net, codec, fast=fast, prior=AdmissionPrior(), hybrid=hybrid)
        got = pol.schedule(state).place
        want = _step_by_step(codec, net, state, hybrid)
    assert got == want


def test_plan_order_round_starts_the_first_wave():
    """The untrained prior in "plan" order on an idle 4x8 cluster with a long queue of 1-hour jobs of
    every demand 1..32 starts exactly the first planned wave: single-node jobs in exact complements."""
    from collections import Counter

    from policies.prior import AdmissionPrior
    from policies.waves import plan_waves

    cluster, perf = _CLUSTERS["4x8"], _PERFS["4x8"]
    codec = DeepShareCodec(cluster, perf, ObsSpec.for_cluster(cluster, order="plan"))
    state = _random_state("4x8", [], [("FSDP", g, 1.0) for g in range(1, 33) for _ in range(8)], 0.0, 0)
    state = ClusterState(0.0, cluster, state.free_gpus, [], [dataclasses.replace(j, done_samples=0.0) for j in state.pending])
    wave = plan_waves(Counter(j.gpu_demand for j in state.pending), 4, 8)[0]
    pol = RLPolicy(zero_net(codec.spec), codec, prior=AdmissionPrior())  # the prior decides
    placed = pol.schedule(state).place
    dem = {j.job_id: j.gpu_demand for j in state.pending}
    assert sorted((dem[j] for j, _p in placed), reverse=True) == wave
    assert all(p.num_nodes == 1 for _j, p in placed) and sum(dem[j] for j, _p in placed) == 32


@pytest.mark.parametrize("fast", [True, False])
def test_fill_order_safety_rule_in_the_tail(fast):
    """rl-hybrid in the fill order's tail (no small job waits) with a network that prefers "nothing":
    the safety rule walks the whole queue in fill order (not area order), as the step-by-step reference."""
    from policies.orders import FILL_SMALL
    from policies.prior import AdmissionPrior

    codec = _FILL_CODECS["4x8"]
    lo = int(FILL_SMALL * codec.spec.total_gpus) + 1
    rng = np.random.default_rng(0)
    acted = 0
    for t in range(60):
        pend = [(str(rng.choice(MODELS)), int(rng.integers(lo, 33)), float(rng.uniform(0.1, 20))) for _ in range(rng.integers(1, 15))]
        run = [(str(rng.choice(MODELS)), int(rng.choice([1, 2, 4, 8])), float(rng.uniform(0.1, 20))) for _ in range(rng.integers(0, 4))]
        state = _random_state("4x8", run, pend, 0.0, t)
        net = random_net(codec.spec, t % 3, -3.0)
        pol = RLPolicy(net, codec, fast=fast, prior=AdmissionPrior(), hybrid=True)
        assert pol.schedule(state).place == _step_by_step(codec, net, state, True)
        acted += pol.stats["fallback_placements"] > 0
    assert acted >= 30  # the rule really acted in most rounds


def _step_by_step(codec: DeepShareCodec, net: MLPNet, state: ClusterState, hybrid: bool) -> list:
    """Reference round: the whole state encoded from scratch before every decision (the reference encoder,
    with the order's candidates of the whole remaining queue and, in the "plan" order, the plan made at the
    round's start); for rl-hybrid, once the network chooses "nothing", the safety rule as
    ``test_rl._safety_rule_reference``."""
    from test_rl import _round_plan, _safety_rule_reference

    from policies.prior import AdmissionPrior

    ref = RLPolicy(net, codec, fast=False, prior=AdmissionPrior(), hybrid=hybrid)
    plan = _round_plan(codec, state)
    want, cur = [], state
    while cur.pending:
        enc = encode_reference(codec, cur, candidates_reference(codec, cur, plan))
        if not enc.any_placement:
            break
        choice = enc.decode(ref.act(enc))
        if choice is None:
            if hybrid:
                want.extend(_safety_rule_reference(ref, cur, plan))
            break
        want.append(choice)
        cur = apply_placement(cur, choice[0], choice[1], codec.perf)
    return want
