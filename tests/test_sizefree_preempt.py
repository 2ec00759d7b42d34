"""rl-sf with preempt candidates (codec spec ``preempt`` = K > 0): which running jobs are victims,
masks, the round's preemption, the policy and the environment emitting preemptions, the planner
teacher's preempt labels, and the shipped checkpoint (K = 0) left as it was."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from policies.cluster import ClusterSpec, Placement
from policies.codecs.base import CodecError
from policies.codecs.sizefree import N_CAND, N_CTX, N_RUN, SizeFreeCodec, SizeFreeSpec
from policies.job import JobSpec
from policies.perf import ContentionModel
from policies.sizefree import SizeFreeNet, SizeFreePolicy, load_sizefree, shipped_sizefree, tensor_shapes
from policies.state import ClusterState, Decision, JobInfo
from trainer.simulator import SimConfig, Simulator
from cli_helpers import run_cli

SPEC = SizeFreeSpec(jobs=4, preempt=2)
CLUSTER = ClusterSpec.parse("2x8")


def _info(perf: ContentionModel, jid: str, g: int, p: Placement | None = None, done: float = 0.0,
          preemptible: bool = True) -> JobInfo:
    iso = perf.throughput_for("FSDP", p) if p is not None else 0.0
    return JobInfo(jid, "FSDP", g, 0.0, 1e7, done_samples=done, placement=p, isolated_thp=iso, achieved_thp=iso,
                   best_thp=perf.best_isolated_throughput("FSDP", g), start_time=0.0 if p is not None else None,
                   preemptible=preemptible)


def _state(running: list[JobInfo], pending: list[JobInfo], cluster: ClusterSpec = CLUSTER) -> ClusterState:
    free = np.array(cluster.gpus_per_node, dtype=np.int64)
    for r in running:
        for nd, c in r.placement.alloc:
            free[nd] -= c
    return ClusterState(100.0, cluster, free, running, pending)


def _full_cluster(perf: ContentionModel, locked: bool = False) -> ClusterState:
    """2x8 full: r0 (8 GPUs on node 0, long), r1 (8 GPUs on node 1, not preemptible when ``locked``);
    w (8 GPUs) waits."""
    r0 = _info(perf, "r0", 8, Placement(((0, 8),)), done=2e6)
    r1 = _info(perf, "r1", 8, Placement(((1, 8),)), done=8e6, preemptible=not locked)
    return _state([r0, r1], [_info(perf, "w", 8)])


def _flag_net(spec: SizeFreeSpec, flag_weight: float) -> SizeFreeNet:
    """A network whose score is ``flag_weight`` on preempt rows (feature 18) and 0 elsewhere."""
    shapes = tensor_shapes(4, spec)
    t = {p + ".weight": np.zeros(ws, np.float32) for p, (ws, _b) in shapes.items()}
    t.update({p + ".bias": np.zeros(bs, np.float32) for p, (_w, bs) in shapes.items()})
    t["cand.0.weight"][0, N_CAND] = 1.0
    t["cand.1.weight"][0, 0] = 1.0
    t["cand.2.weight"][0, 0] = flag_weight
    return SizeFreeNet(spec, t)


def test_spec_layout_and_stored_form():
    assert SPEC.n_candidates == 4 * 3 + 2 + 1 and SPEC.hold == SPEC.n_candidates - 1
    assert SPEC.cand_features == N_CAND + N_RUN
    assert SPEC.size == SPEC.n_candidates * (N_CAND + N_RUN) + N_CTX
    d = SPEC.to_dict()
    assert d["preempt"] == 2 and SizeFreeSpec.from_dict(json.loads(json.dumps(d))) == SPEC
    # without preempt candidates: no field, the layout without preemption
    d0 = SizeFreeSpec(jobs=4).to_dict()
    assert "preempt" not in d0 and d0["cand_features"] == N_CAND
    with pytest.raises(CodecError, match="cand_features"):
        SizeFreeSpec.from_dict({**d, "cand_features": N_CAND, "shape": list(SPEC.shape)})
    with pytest.raises(CodecError, match="preempt"):
        SizeFreeSpec(preempt=-1)


def test_victims_only_preemptible_running_jobs_and_only_while_jobs_wait():
    perf = ContentionModel(CLUSTER)
    codec = SizeFreeCodec(CLUSTER, perf, SPEC)
    S = SPEC.n_starts
    enc = codec.begin(_full_cluster(perf)).encode()
    assert [v.job_id for v in enc.victims] == ["r0", "r1"]  # longest remaining first
    assert enc.mask[S] and enc.mask[S + 1] and not enc.mask[:S].any() and enc.mask[SPEC.hold]
    rows = enc.obs[: SPEC.n_candidates * SPEC.cand_features].reshape(SPEC.n_candidates, -1)
    assert rows[S, N_CAND] == 1.0 and rows[S + 1, N_CAND] == 1.0 and not rows[:S, N_CAND].any()
    assert rows[S, N_CAND + 3] == pytest.approx(0.2) and rows[S + 1, N_CAND + 3] == pytest.approx(0.8)  # work done
    # a job that is not preemptible is no victim
    enc = codec.begin(_full_cluster(perf, locked=True)).encode()
    assert [v and v.job_id for v in enc.victims] == ["r0", None]
    assert enc.mask[S] and not enc.mask[S + 1]
    assert enc.victim(S) == "r0" and enc.victim(0) is None and enc.victim(SPEC.hold) is None
    with pytest.raises(ValueError, match="masked"):
        enc.victim(S + 1)
    # nothing waits: no preempt row is valid (nothing to preempt for)
    st = _full_cluster(perf)
    enc = codec.begin(replace(st, pending=[])).encode()
    assert not enc.mask[:-1].any()
    # without preempt candidates the same state offers none
    enc0 = SizeFreeCodec(CLUSTER, perf, SizeFreeSpec(jobs=4)).begin(_full_cluster(perf)).encode()
    assert enc0.victims == [] and enc0.mask.shape == (13,) and not enc0.any_placement


def test_round_preempt_frees_gpus_requeues_and_allows_a_move():
    perf = ContentionModel(CLUSTER)
    codec = SizeFreeCodec(CLUSTER, perf, SPEC)
    rnd = codec.begin(_full_cluster(perf))
    back = rnd.preempt("r0")
    assert back.placement is None and back.done_samples == 2e6 and back.preemptions == 1
    assert list(rnd.free) == [8, 0] and "r0" in [j.job_id for j in rnd.waiting]
    assert [r.job_id for r in rnd.cur.running] == ["r1"]
    enc = rnd.encode()
    # r0 is no victim any more; r1 still is; w and r0 can start on node 0
    assert [v and v.job_id for v in enc.victims] == ["r1", None]
    started = {enc.cands[i][0].job_id for i in range(SPEC.n_starts) if enc.mask[i]}
    assert started == {"w", "r0"}
    with pytest.raises(ValueError, match="not a preemptible"):
        rnd.preempt("r0")
    # a job started in the round is no victim
    rnd.place("r0", Placement(((0, 8),)))
    assert [v and v.job_id for v in rnd.encode().victims] == ["r1", None]
    # hold is masked once nothing runs and a start is valid
    rnd2 = codec.begin(_full_cluster(perf))
    rnd2.preempt("r0")
    rnd2.preempt("r1")
    enc2 = rnd2.encode()
    assert not rnd2.cur.running and enc2.mask[:SPEC.n_starts].any() and not enc2.mask[SPEC.hold]


def test_policy_emits_preemptions_and_the_simulator_applies_them():
    perf = ContentionModel(CLUSTER)
    pol = SizeFreePolicy(_flag_net(SPEC, 10.0), SizeFreeCodec(CLUSTER, perf, SPEC))
    dec = pol.schedule(_full_cluster(perf))
    # preempt rows score 10 and the rest 0: both victims stop, then the lowest-index starts follow
    assert dec.preempt == ["r0", "r1"] and len(dec.place) == 2 and pol.stats["preemptions"] == 2
    assert {j for j, _p in dec.place} <= {"w", "r0", "r1"}
    # a negative flag weight never preempts
    pol_np = SizeFreePolicy(_flag_net(SPEC, -10.0), SizeFreeCodec(CLUSTER, perf, SPEC))
    assert pol_np.schedule(_full_cluster(perf)) == Decision()
    # in the simulator: every job finishes, with preemptions counted
    jobs = [JobSpec(f"j{i}", 600.0 * i, "FSDP", 8, 1800.0 * perf.best_isolated_throughput("FSDP", 8)) for i in range(5)]
    res = Simulator(CLUSTER, jobs, SizeFreePolicy(_flag_net(SPEC, 10.0), SizeFreeCodec(CLUSTER, perf, SPEC)),
                    perf, SimConfig()).run()
    assert len(res.jobs) == 5 and res.preemptions > 0
    res_np = Simulator(CLUSTER, jobs, SizeFreePolicy(_flag_net(SPEC, -10.0), SizeFreeCodec(CLUSTER, perf, SPEC)),
                       perf, SimConfig()).run()
    assert len(res_np.jobs) == 5 and res_np.preemptions == 0


def test_env_preempt_action_stops_the_job_in_the_simulator():
    from trainer.sizefree.env import SizeFreeEnv

    perf = ContentionModel(CLUSTER)
    jobs = [JobSpec("a", 0.0, "FSDP", 8, 7200.0 * perf.best_isolated_throughput("FSDP", 8)),
            JobSpec("b", 0.0, "FSDP", 8, 7200.0 * perf.best_isolated_throughput("FSDP", 8)),
            JobSpec("c", 60.0, "FSDP", 8, 600.0 * perf.best_isolated_throughput("FSDP", 8))]
    env = SizeFreeEnv([jobs], CLUSTER, SPEC)
    env.reset(options={"trace": 0})
    while not env.encoding.victims or env.encoding.victims[0] is None:  # start a and b, hold until c arrives
        m = env.action_masks()
        env.step(int(np.flatnonzero(m[:SPEC.n_starts])[0]) if m[:SPEC.n_starts].any() else SPEC.hold)
    enc = env.encoding
    assert env.sim.time == 60.0 and [j.job_id for j in env.backend.snapshot().pending] == ["c"]
    S = SPEC.n_starts
    victim = enc.victim(S)
    obs, _r, term, _t, _i = env.step(S)
    snap = env.backend.snapshot()
    assert env.sim.preemptions == 1 and env.sim.time == 60.0 and not term
    assert victim in {j.job_id for j in snap.pending} and victim not in {j.job_id for j in snap.running}
    assert obs.shape == SPEC.shape and env.encoding.mask[:S].any()
    done = False
    while not done:  # finish the episode on the first valid action
        _o, _r, term, trunc, _i = env.step(int(np.flatnonzero(env.action_masks())[0]))
        done = term or trunc
    assert env.sim.done


class _StubPlanner:
    """A planner stand-in that returns a fixed decision (the teacher's label mapping under test)."""

    def __init__(self, dec: Decision) -> None:
        self.dec = dec
        self.last_round = type("R", (), {"cut": False})()

    def schedule(self, state):
        return self.dec

    def reset(self):
        """Nothing to reset: the teacher always returns the same decision."""


def test_teacher_labels_preemptions_then_the_move():
    from trainer.sizefree.dagger import TEACHER_PREEMPT, PlannerTeacher

    perf = ContentionModel(CLUSTER)
    codec = SizeFreeCodec(CLUSTER, perf, SPEC)
    teacher = PlannerTeacher(CLUSTER, perf, TEACHER_PREEMPT)
    teacher.planner = _StubPlanner(Decision(preempt=["r0"], place=[("w", Placement(((0, 8),))),
                                                               ("r0", Placement(((0, 8),)))]))
    st = _full_cluster(perf)
    rnd = codec.begin(st)
    enc = rnd.encode()
    a = teacher.label(st, enc)
    assert a == SPEC.n_starts and enc.victim(a) == "r0" and teacher.stats()["preempt_labels"] == 1
    teacher.taken(st, a, a, enc)
    rnd.preempt("r0")
    st2 = rnd.state()
    enc2 = rnd.encode()
    a2 = teacher.label(st2, enc2)  # the plan goes on without a new search
    assert enc2.decode(a2) == ("w", Placement(((0, 8),))) and teacher.searches == 1
    # a spec without preempt candidates leaves a preempting decision unlabelled
    codec0 = SizeFreeCodec(CLUSTER, perf, SizeFreeSpec(jobs=4))
    teacher.reset()
    assert teacher.label(st, codec0.begin(st).encode()) is None and teacher.unlabelled == 1


def test_shipped_checkpoint_has_no_preempt_and_padding_keeps_its_scores():
    from trainer.sizefree.train import init_tensors

    net, meta, _p = load_sizefree(shipped_sizefree())
    assert net.spec.preempt == 0 and "preempt" not in meta["obs_spec"]
    assert net.spec.to_dict() == meta["obs_spec"]  # the stored spec reads and writes back unchanged
    spec = replace(net.spec, preempt=4)
    padded = SizeFreeNet(spec, init_tensors(net, spec, "shipped"))
    cluster = ClusterSpec.parse("4x8")
    perf = ContentionModel(cluster)
    r0 = _info(perf, "r0", 12, Placement(((0, 8), (1, 4))))
    st = _state([r0], [_info(perf, "a", 4), _info(perf, "b", 16), _info(perf, "c", 1)], cluster)
    e0 = SizeFreeCodec(cluster, perf, net.spec).begin(st).encode()
    e1 = SizeFreeCodec(cluster, perf, spec).begin(st).encode()
    s0, s1 = net.scores(e0.obs), padded.scores(e1.obs)
    S = net.spec.n_starts
    np.testing.assert_allclose(s1[:S], s0[:S], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s1[-1], s0[-1], rtol=1e-5, atol=1e-5)
    assert e1.mask[S] and [v and v.job_id for v in e1.victims][:1] == ["r0"]
    with pytest.raises(ValueError, match="does not fit"):
        init_tensors(net, replace(spec, jobs=6), "shipped")


def test_cli_preempt_option_checked():
    got = run_cli("train-sizefree", "--out", "/nonexistent/x", "--preempt", "-1")
    assert got.returncode == 2 and "--preempt" in got.stderr and len(got.stderr.strip().splitlines()) == 1
    got = run_cli("train-sizefree", "--out", "/nonexistent/x", "--bc-epochs", "0")  # no cloning needs --init
    assert got.returncode == 2 and "--bc-epochs" in got.stderr and len(got.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("name", ["preempt-p1", "preempt-p4"])
def test_kept_preempt_checkpoint_loads_and_runs_on_any_cluster(name):
    """The kept preempt-candidate checkpoints (not shipped: docs/RESULTS.md, size-free section) load with
    K = 4 and run."""
    from pathlib import Path

    from policies.sizefree import make_sizefree_policy

    path = Path(__file__).parents[1] / "policies" / "checkpoints" / "sizefree" / f"{name}.json"
    net, meta, _p = load_sizefree(path)
    assert net.spec.preempt == 4 and meta["obs_spec"]["cand_features"] == N_CAND + N_RUN
    for shape in ("4x8", "16x8"):
        cluster = ClusterSpec.parse(shape)
        perf = ContentionModel(cluster)
        pol = make_sizefree_policy(f"rl-sf:{path}", cluster, perf)
        jobs = [JobSpec(f"j{i}", 300.0 * i, "FSDP", g, 1200.0 * perf.best_isolated_throughput("FSDP", g))
                for i, g in enumerate((8, 12, 4, 16, 2, 24, 8, 1))]
        res = Simulator(cluster, jobs, pol, perf, SimConfig()).run()
        assert len(res.jobs) == 8 and pol.stats["placements"] >= 8


def test_shipped_checkpoint_per_job_results_pinned():
    """The shipped ``rl-sf`` behind ``rl-base`` / ``rl-hybrid`` (codec spec without preempt candidates):
    per-job results on two fixed traces as recorded from the codec without preemption
    (``tests/data/sizefree-rl-sf-golden.json``: job, first start, finish, nodes, preemptions, mean CS)."""
    import sys
    from pathlib import Path

    root = Path(__file__).parents[1]
    sys.path.insert(0, str(root / "tests" / "golden"))
    try:
        from record import run_case
    finally:
        sys.path.pop(0)
    want = json.loads((root / "tests" / "data" / "sizefree-rl-sf-golden.json").read_text())
    traces = {"heavy-4x8": ("4x8", "tests/golden/heavy-4x8.csv"), "poisson-16x8": ("16x8", "tests/golden/poisson-16x8.csv")}
    for key, rows in want.items():
        name, policy = key.split()
        got = run_case(*traces[name], policy)
        assert len(got) == len(rows), key
        for g, w in zip(got, rows):
            assert g[0] == w[0] and g[3:5] == w[3:5], (key, g, w)
            np.testing.assert_allclose(g[1:3] + g[5:], w[1:3] + w[5:], rtol=1e-9, atol=1e-9, err_msg=key)
