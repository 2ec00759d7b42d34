"""RL policies (policies.rl): names, checkpoints, simulator runs, hybrid rule."""

from __future__ import annotations

import numpy as np
import pytest
from ckpt_helpers import write_random_checkpoint as _write_random_checkpoint

from policies.base import PolicyError
from policies.checkpoint import CheckpointError, MLPNet
from policies.cluster import ClusterSpec
from policies.codecs.deepshare import DeepShareCodec, ObsSpec
from policies.perf import ContentionModel
from policies.rl import RLPolicy, make_rl_policy
from trainer.generate import GeneratorConfig, generate_jobs
from trainer.simulator import SimConfig, Simulator

C48 = ClusterSpec.parse("4x8")
PERF = ContentionModel(C48)


def write_random_checkpoint(path, cluster=C48, seed=0):
    """A valid checkpoint with random weights (same layout SB3's MaskablePPO exports)."""
    return _write_random_checkpoint(path, cluster, seed)


def _jobs(n=40, seed=0, arrival="zero"):
    return generate_jobs(C48, GeneratorConfig(num_jobs=n, seed=seed, arrival=arrival, duration_s=1800.0), PERF)


def _const_net(spec: ObsSpec, favour: int) -> MLPNet:
    """A network whose logits ignore the input and prefer action ``favour``, then lower indices."""
    n_in = int(np.prod(spec.shape))
    W1 = np.zeros((4, n_in), np.float32)
    b_out = -np.arange(spec.n_actions, dtype=np.float32) * 0.01
    b_out[favour] = 10.0
    return MLPNet([(W1, np.zeros(4, np.float32)), (np.zeros((spec.n_actions, 4), np.float32), b_out)])


def _run(policy, jobs):
    res = Simulator(C48, jobs, policy, PERF, SimConfig(check_invariants=True)).run()
    assert all(np.isfinite(r.finish_time) for r in res.jobs)
    return res


def test_names_and_errors(tmp_path):
    ck = write_random_checkpoint(tmp_path / "ck")
    p = make_rl_policy(f"rl-base:{ck}", C48, PERF)
    assert p.name == "rl-base" and not p.hybrid
    h = make_rl_policy("rl-hybrid", C48, PERF, checkpoint=ck)
    assert h.name == "rl-hybrid" and h.hybrid
    with pytest.raises(PolicyError, match="unknown RL policy"):
        make_rl_policy("rl-magic", C48, PERF)
    with pytest.raises(CheckpointError, match="not found"):
        make_rl_policy(f"rl-base:{tmp_path / 'missing'}", C48, PERF)
    with pytest.raises(CheckpointError, match="trained for a 4x8"):
        make_rl_policy(f"rl-base:{ck}", ClusterSpec.parse("2x8"))
    with pytest.raises(CheckpointError, match=r"no shipped.*`rlsched train --cluster 3x2 \.\.\.`"):
        make_rl_policy("rl-base", ClusterSpec.parse("3x2"))
    # a heterogeneous cluster: the hint names a cluster file, not its description ("3 nodes / 20 GPUs")
    (tmp_path / "c.yaml").write_text("nodes:\n  - {count: 2, gpus: 8}\n  - {count: 1, gpus: 4}\n")
    with pytest.raises(CheckpointError, match=r"--cluster FILE` \(FILE: this cluster's YAML/TOML file\)"):
        make_rl_policy("rl-base", ClusterSpec.parse(str(tmp_path / "c.yaml")))


def test_shipped_checkpoints_load():
    for name in ("rl-base", "rl-hybrid"):
        pol = make_rl_policy(name, C48, PERF)
        assert pol.checkpoint is not None and pol.checkpoint.meta["cluster_shape"] == "4x8"


def test_deterministic_replay(tmp_path):
    ck = write_random_checkpoint(tmp_path / "ck", seed=3)
    jobs = _jobs(30, 1, "poisson")
    a = _run(make_rl_policy(f"rl-base:{ck}", C48, PERF), jobs)
    b = _run(make_rl_policy(f"rl-base:{ck}", C48, PERF), jobs)
    assert [r.jct for r in a.jobs] == [r.jct for r in b.jobs]


def test_base_holds_hybrid_fills():
    spec = ObsSpec.for_cluster(C48)
    enc = DeepShareCodec(C48, PERF, spec)
    jobs = _jobs(40, 2)
    # A network that always prefers "nothing": rl-base then runs one job at a time
    # (nothing is masked only while the cluster is idle); rl-hybrid's safety rule fills the cluster.
    base = _run(RLPolicy(_const_net(spec, spec.noop), enc), jobs)
    hyb = _run(RLPolicy(_const_net(spec, spec.noop), enc, hybrid=True), jobs)
    assert hyb.makespan < base.makespan
    assert np.mean([r.jct for r in hyb.jobs]) < np.mean([r.jct for r in base.jobs])


def test_sampling_is_seeded(tmp_path):
    ck = write_random_checkpoint(tmp_path / "ck", seed=4)
    jobs = _jobs(24, 5)
    runs = [
        [
            r.first_start
            for r in _run(make_rl_policy(f"rl-base:{ck}", C48, PERF, deterministic=False, seed=s), jobs).jobs
        ]
        for s in (1, 1)
    ]
    assert runs[0] == runs[1]


def test_network_shape_checked():
    spec = ObsSpec.for_cluster(C48)
    with pytest.raises(PolicyError, match="network maps"):
        RLPolicy(MLPNet([(np.zeros((3, 5), np.float32), np.zeros(3, np.float32))]), DeepShareCodec(C48, PERF, spec))


def test_prior_places_every_job_once():
    pol = make_rl_policy("rl-prior", C48, PERF)
    jobs = _jobs(30, 6, "poisson")
    _run(pol, jobs)
    assert pol.name == "rl-prior"
    assert pol.stats["placements"] == len(jobs) and pol.stats["fallback_placements"] == 0
    with pytest.raises(PolicyError):
        make_rl_policy("rl-prior:/some/path", C48, PERF)


def _round_plan(codec, state):
    """The "plan" order's plan of a round on ``state`` (made at the round's start and kept); ``None`` for
    the other orders."""
    if codec.order.name != "plan":
        return None
    counts: dict[int, int] = {}
    for j in state.pending:
        counts[j.gpu_demand] = counts.get(j.gpu_demand, 0) + 1
    return codec.order.plan(counts, state.time, state.pending)


def _naive_schedule(pol: RLPolicy, state):
    """Reference: re-encode the full state after every placement, with the straightforward encoder
    (the round's plan kept, as a round keeps it)."""
    from oracles.deepshare_reference import apply_placement, candidates_reference, encode_reference

    from policies.state import Decision

    dec, cur = Decision(), state
    plan = _round_plan(pol.codec, state)
    while cur.pending:
        enc = encode_reference(pol.codec, cur, candidates_reference(pol.codec, cur, plan))
        if not enc.any_placement:
            break
        choice = enc.decode(pol.act(enc))
        if choice is None:
            if pol.hybrid:
                dec.place.extend(_safety_rule_reference(pol, cur, plan))
            break
        dec.place.append(choice)
        cur = apply_placement(cur, *choice, PERF)
    return dec


def _safety_rule_reference(pol: RLPolicy, state, plan=None) -> list:
    """rl-hybrid's safety rule, spelled out: one pass over the whole queue in candidate order (``plan``:
    the round's plan); a job starts if it ends within the longest running job's remaining time and the
    rule places it, each start applied to the state before the next job is tried."""
    from oracles.deepshare_reference import apply_placement

    horizon = max((r.remaining_time for r in state.running), default=0.0)
    out, cur = [], state
    for j in pol.codec.order.queue_order(state.pending, state.time, state.total_free, plan):
        if j.gpu_demand <= cur.total_free and j.remaining_time <= horizon:
            p = pol.rule(j, cur.free_gpus, cur)
            if p is not None:
                out.append((j.job_id, p))
                cur = apply_placement(cur, j.job_id, p, pol.codec.perf)
    return out


@pytest.mark.parametrize("seed", range(4))
def test_incremental_round_equals_naive(tmp_path, seed):
    """The grouped, incremental, cached schedule() gives exactly the naive re-encoding result."""
    import copy

    from policies.heuristics import make_heuristic
    from policies.state import ClusterState, Decision

    ck = write_random_checkpoint(tmp_path / "ck", seed=seed)
    pols = [make_rl_policy(f"rl-base:{ck}", C48, PERF), make_rl_policy(f"rl-hybrid:{ck}", C48, PERF)]
    spec = ObsSpec.for_cluster(C48)
    pols.append(RLPolicy(_const_net(spec, spec.noop), DeepShareCodec(C48, PERF, spec), hybrid=True))
    pols.append(make_rl_policy("rl-prior", C48, PERF))

    states = []

    class Recorder:
        name = "rec"

        def __init__(self):
            self.inner = make_heuristic("greedy-np", PERF)

        def reset(self):
            pass

        def schedule(self, st):
            if st.pending:  # copy: the simulator mutates its JobInfo objects later
                states.append(
                    ClusterState(
                        st.time,
                        st.cluster,
                        st.free_gpus.copy(),
                        [copy.copy(j) for j in st.running],
                        [copy.copy(j) for j in st.pending],
                    )
                )
            return self.inner.schedule(st) if len(states) % 3 else Decision()

    Simulator(C48, _jobs(60, seed, "poisson" if seed % 2 else "zero"), Recorder(), PERF).run()
    assert states
    for st in states[:: max(1, len(states) // 40)]:
        for pol in pols:
            got = pol.schedule(st)
            want = _naive_schedule(pol, st)
            assert got.place == want.place


@pytest.mark.parametrize("rule_name", ["packing", "contention-aware"])
@pytest.mark.parametrize("floor", [0.0, 0.6, 0.9])
def test_hybrid_safety_rule_respects_floor(floor, rule_name):
    """Every safety-rule placement yields at least ``floor`` effective GPUs per GPU (perf model)."""
    from policies.placement import ContentionAwarePlacement, FloorPacking
    from policies.rl import HYBRID_FLOOR

    spec = ObsSpec.for_cluster(C48)
    pol = RLPolicy(_const_net(spec, spec.noop), DeepShareCodec(C48, PERF, spec), hybrid=True, hybrid_floor=floor,
                   hybrid_rule=rule_name)
    default = RLPolicy(_const_net(spec, spec.noop), DeepShareCodec(C48, PERF, spec), hybrid=True).rule
    assert isinstance(default, FloorPacking) and default.min_efficiency == HYBRID_FLOOR
    assert isinstance(pol.rule, FloorPacking if rule_name == "packing" else ContentionAwarePlacement)
    rule = pol.rule
    effs = []
    inner = rule.__call__

    def checked(job, free, state):
        p = inner(job, free, state)
        if p is not None:
            effs.append(rule.score(job, p, state) / job.gpu_demand)
        return p

    pol.rule = checked
    jobs = _jobs(60, 3, "poisson")
    res = _run(pol, jobs)
    assert len(res.jobs) == len(jobs)  # everything still finishes (idle cluster: network must place)
    assert pol.stats["fallback_placements"] > 0 and effs
    if floor > 0:  # floor 0 skips the check (and multi-node scores may then be negative)
        assert min(effs) >= floor - 1e-9


def test_hybrid_floor_checked():
    spec = ObsSpec.for_cluster(C48)
    with pytest.raises(PolicyError, match="min_efficiency"):
        RLPolicy(_const_net(spec, spec.noop), DeepShareCodec(C48, PERF, spec), hybrid=True, hybrid_floor=-0.1)
    with pytest.raises(PolicyError, match="safety rule 'best'.*packing, contention-aware"):
        RLPolicy(_const_net(spec, spec.noop), DeepShareCodec(C48, PERF, spec), hybrid=True, hybrid_rule="best")


def test_hybrid_rule_fills_within_the_horizon_and_packs():
    """The safety rule's starts: each job ends (by its estimate) before the longest-running job
    already started, single-node jobs are never split, and every start fits the GPUs left."""
    spec = ObsSpec.for_cluster(C48)
    pol = RLPolicy(_const_net(spec, spec.noop), DeepShareCodec(C48, PERF, spec), hybrid=True)
    seen = []
    inner = pol.rule

    def spy(job, free, state):
        # the round's state when the rule is asked: the jobs started so far this round run; the safety
        # rule's own starts end within the horizon, so they never raise it
        p = inner(job, free, state)
        if p is not None:
            horizon = max((r.remaining_time for r in state.running), default=0.0)
            seen.append((job.remaining_time <= horizon, job.gpu_demand > 8 or p.num_nodes == 1, p.fits(free)))
        return p

    pol.rule = spy
    res = _run(pol, _jobs(60, 4, "zero"))
    assert len(res.jobs) == 60 and seen and pol.stats["fallback_placements"] == len(seen)
    assert all(a and b and c for a, b, c in seen)


def test_hybrid_rule_never_splits_a_single_node_job():
    """Fixed states: the network holds; a 4-GPU job that pack would split over nodes waits, and
    with a node that holds it the rule starts it whole there (the best-fitting node)."""
    from policies.cluster import Placement
    from policies.placement import pack
    from policies.state import ClusterState, JobInfo

    spec = ObsSpec.for_cluster(C48)
    pol = RLPolicy(_const_net(spec, spec.noop), DeepShareCodec(C48, PERF, spec), hybrid=True)

    def state(used: list[int]) -> ClusterState:
        running = [JobInfo(f"r{n}", "MoE", u, 0.0, 1e9, placement=Placement.of({n: u}), isolated_thp=1.0,
                           achieved_thp=1.0, best_thp=1.0, start_time=0.0) for n, u in enumerate(used) if u]
        job = JobInfo("p", "MoE", 4, 0.0, 3600.0, best_thp=1.0)  # ends long before the running jobs
        return ClusterState(0.0, C48, np.array([8 - u for u in used], dtype=np.int64), running, [job])

    split = state([5, 5, 6, 8])  # free [3, 3, 2, 0]
    assert pack(split.pending[0], split.free_gpus).num_nodes == 2
    assert pol.schedule(split).place == [] and pol.stats["holds"] == 1
    fits = state([3, 0, 4, 2])  # free [5, 8, 4, 6]
    assert pol.schedule(fits).place == [("p", Placement.of({2: 4}))]
    assert pol.stats["fallback_placements"] == 1


class _Keep:
    """Wraps a policy in a simulation and keeps copies of the states it schedules (pending jobs only)."""

    def __init__(self, inner) -> None:
        self.inner, self.states = inner, []
        self.name, self.time_invariant = inner.name, False

    def reset(self) -> None:
        self.inner.reset()

    def schedule(self, state):
        import copy

        from policies.state import ClusterState

        if state.pending:
            self.states.append(ClusterState(state.time, state.cluster, state.free_gpus.copy(),
                                            [copy.copy(j) for j in state.running], [copy.copy(j) for j in state.pending]))
        return self.inner.schedule(state)


def _holding_hybrid(cluster, perf):
    """rl-hybrid with a network that prefers "nothing" whenever it is valid: the safety rule (floor 0)
    makes every placement after a round's first."""
    shipped = make_rl_policy("rl-hybrid", cluster, perf)
    spec = shipped.codec.spec
    n_in = int(np.prod(spec.shape))
    net = MLPNet([(np.zeros((spec.n_actions, n_in), np.float32), np.arange(spec.n_actions, dtype=np.float32))])
    return RLPolicy(net, DeepShareCodec(cluster, perf, spec), hybrid=True, hybrid_floor=0.0)


def _simulated_states(name: str, num_jobs: int, seed: int):
    """The states a 4x8 simulation of a heavy `uniform` trace showed policy ``name`` (the policy ``name``
    or the holding rl-hybrid), and a fresh policy of the same kind to replay them on."""
    cluster = ClusterSpec.parse("4x8")
    perf = ContentionModel(cluster)
    jobs = generate_jobs(cluster, GeneratorConfig(num_jobs=num_jobs, demand="uniform", mix="heavy", seed=seed), perf)

    def make():
        return _holding_hybrid(cluster, perf) if name == "holding-hybrid" else make_rl_policy(name, cluster, perf)

    keep = _Keep(make())
    Simulator(cluster, jobs, keep, perf, SimConfig()).run()
    return keep.states, make()


@pytest.mark.parametrize("name", ["rl-base", "rl-hybrid", "holding-hybrid"])
def test_place_limit_returns_the_first_placements_of_the_unlimited_round(name):
    """With place_limit = n a round is exactly the first n placements of the unlimited round, on every
    state of a `uniform` simulation (network placements and rl-hybrid's safety-rule placements alike)."""
    states, pol = _simulated_states(name, num_jobs=64, seed=12)
    cuts = fallback = 0
    for st in states:
        pol.place_limit = None
        full = pol.schedule(st).place
        for n in (1, 2, 3, 7):
            cuts += len(full) > n
            pol.place_limit = n
            before = pol.stats["fallback_placements"]
            got = pol.schedule(st).place
            fallback += pol.stats["fallback_placements"] - before
            assert [(j, p.alloc) for j, p in got] == [(j, p.alloc) for j, p in full[:n]]
    assert cuts >= 3  # the limit did cut rounds short
    if name == "holding-hybrid":
        assert fallback > 0  # the safety rule's placements were cut too


@pytest.mark.parametrize("name", ["rl-base", "rl-hybrid", "rl-prior", "holding-hybrid"])
def test_rl_policies_never_place_on_unusable_nodes(name):
    """On every state of a simulation, with nodes 0 and 2 marked unusable (ClusterState.usable) although
    their GPUs are reported free: no placement touches them, and the network placements fit the usable
    nodes' free GPUs."""
    import dataclasses

    states, pol = _simulated_states(name, num_jobs=48, seed=5)
    usable = np.array([False, True, False, True])
    placed = 0
    for st in states:
        st = dataclasses.replace(st, usable=usable)
        free = st.free_gpus.copy()
        assert free[~usable].sum() == 0
        for _jid, p in pol.schedule(st).place:
            assert all(usable[v] for v in p.nodes), p
            assert p.fits(free)
            for v, c in p.alloc:
                free[v] -= c
            placed += 1
    assert placed > 0


# ---------------------------------------------------------------- unusable logits: a clear error, not a crash
def _idle_with_one_16_gpu_job():
    """An idle 4x8 cluster and one 16-GPU job: action 0 (candidate 0 on one node) is invalid,
    and so is "nothing" (idle cluster), so argmax over all--inf logits (index 0) is invalid."""
    from policies.state import ClusterState, JobInfo

    best = PERF.best_isolated_throughput("MoE", 16)
    job = JobInfo("big", "MoE", 16, 0.0, total_samples=3600 * best, best_thp=best)
    return ClusterState(0.0, C48, np.array(C48.gpus_per_node), [], [job])


def _inf_net(spec: ObsSpec, value: float = -np.inf) -> MLPNet:
    """Finite hidden layer, output bias ``value`` on every action (what float32 overflow gives)."""
    n_in = int(np.prod(spec.shape))
    out = np.full(spec.n_actions, value, np.float32)
    return MLPNet([(np.zeros((4, n_in), np.float32), np.zeros(4, np.float32)), (np.zeros((spec.n_actions, 4), np.float32), out)])


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # sampling: -inf - -inf
@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("with_prior", [True, False])
@pytest.mark.parametrize("deterministic", [True, False])
@pytest.mark.parametrize("value", [-np.inf, np.nan])
def test_unusable_logits_raise_policy_error_not_value_error(fast, with_prior, deterministic, value):
    """All -inf logits (e.g. a prior scale of 1e300) raise a PolicyError that says why, not
    ``ValueError: action 0 is not valid in this state``, on every path (dense / sparse, with / without the
    prior's fused path, argmax / sampling, decide / schedule). All-NaN logits too: numpy's argmax returns
    the first NaN, which is then a valid action, so such a network would otherwise run silently (and be
    scored) as "the lowest valid action"."""
    from policies.prior import AdmissionPrior

    spec = ObsSpec.for_cluster(C48)
    state = _idle_with_one_16_gpu_job()
    pol = RLPolicy(_inf_net(spec, value), DeepShareCodec(C48, PERF, spec), fast=fast, deterministic=deterministic,
                   prior=AdmissionPrior() if with_prior else None)
    enc = pol.begin(state).encode(dense=not fast)
    assert not enc.mask[0] and not enc.mask[-1] and enc.mask.any()  # the trap: argmax of all -inf is index 0
    for call in (pol.decide, pol.schedule):
        with pytest.raises(PolicyError, match="cannot choose an action") as ei:
            call(state)
        assert type(ei.value) is PolicyError and "-inf on every valid action" in str(ei.value)
        assert isinstance(ei.value.__cause__, ValueError)


def test_unusable_logits_name_the_checkpoint(tmp_path):
    """With a checkpoint (here one whose network is replaced after loading, as no loadable
    checkpoint can overflow any more), the error is a CheckpointError naming its file."""
    from policies.checkpoint import load_checkpoint

    ck = load_checkpoint(write_random_checkpoint(tmp_path / "ck"))
    pol = make_rl_policy(f"rl-base:{tmp_path / 'ck'}", C48, PERF)
    net = _inf_net(ck.spec)
    net.layers[-1][1][0] = np.nan  # NaN on the (masked) action 0, -inf on the rest
    pol.net = net
    with pytest.raises(CheckpointError, match=r"ck\.json: .*NaN.*the checkpoint is unusable"):
        pol.schedule(_idle_with_one_16_gpu_job())


def test_other_errors_pass_through_unchanged():
    """Only a logits problem is rewritten: an invalid action from anything else keeps its own error."""
    spec = ObsSpec.for_cluster(C48)
    pol = RLPolicy(_const_net(spec, 0), DeepShareCodec(C48, PERF, spec))
    state = _idle_with_one_16_gpu_job()
    pol.act = lambda enc: 0  # a bug elsewhere choosing an invalid action, with fine logits
    with pytest.raises(ValueError, match="action 0 is not valid") as ei:
        pol.decide(state)
    assert not isinstance(ei.value, PolicyError)
