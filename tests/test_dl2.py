"""DL2 (policies/dl2.py, trainer/dl2/): state / action layout and masks, the slot reward, the supervised
warm-up, checkpoints, and a simulate run on an elastic trace."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from policies.checkpoint import CheckpointError
from policies.cluster import ClusterSpec
from policies.dl2 import (DL2Net, DL2Spec, FEATURES, JOB_TYPES, SlotBatch, action_mask, apply_action, encode,
                          load_dl2, save_dl2, slot_reward)
from policies.elastic import PlanJob
from policies.resources import ResourceDemand
from policies.state import ClusterState, JobInfo
from cli_helpers import run_cli

ROOT = Path(__file__).resolve().parents[1]


def _job(jid: str, model: str = "ResNet-50", ps: bool = True, hi: int = 4, t: float = 0.0,
         total: float = 1000.0, done: float = 0.0) -> PlanJob:
    d = ResourceDemand(1, cpus_per_gpu=2, mem_gb_per_gpu=10, ps=1 if ps else 0, ps_cpus=3 if ps else 0,
                       ps_mem_gb=10 if ps else 0, min_gpus=1, max_gpus=hi)
    info = JobInfo(jid, model, 1, t, total, done, min_gpus=1, max_gpus=hi, demand=d)
    return PlanJob(info, d, ps, 1, hi, (1.0, 2.0, 10.0), (0.0, 3.0 if ps else 0.0, 10.0 if ps else 0.0))


def _random_actor(spec: DL2Spec, seed: int = 0, hidden: int = 16):
    rng = np.random.default_rng(seed)
    sizes = [spec.obs_size, hidden, spec.n_actions]
    return [(rng.normal(0, 0.1, (b, a)).astype(np.float32), rng.normal(0, 0.1, b).astype(np.float32))
            for a, b in zip(sizes, sizes[1:])]


def test_state_and_action_shapes():
    spec = DL2Spec(J=3)
    assert spec.row == len(JOB_TYPES) + len(FEATURES) and spec.n_actions == 10
    a, b = _job("a", t=0.0, total=2 * 3.0, done=0.0), _job("b", model="VGG-16", t=600.0)
    a.w, a.p = 2, 1
    obs = encode([a, b], (10.0, 100.0, 1000.0), 1200.0, spec)
    assert obs.shape == (spec.obs_size,) and obs.dtype == np.float32
    rows = obs.reshape(spec.J, spec.row)
    L = len(JOB_TYPES)
    assert rows[0, JOB_TYPES.index("ResNet-50")] == 1 and rows[1, JOB_TYPES.index("VGG-16")] == 1
    assert rows[0, L] == pytest.approx(2 * 0.02)  # two slots since submission, scaled
    # dominant share of 2 workers + 1 PS: GPUs 2/10 vs CPUs 7/100 vs memory 30/1000 -> 0.2
    assert rows[0, L + 2] == pytest.approx(0.2) and rows[0, L + 3] == pytest.approx(0.2) and rows[0, L + 4] == pytest.approx(0.1)
    assert not rows[2].any()  # an absent job is a zero row


def test_masks():
    spec = DL2Spec(J=3)
    ps_job, flat, full = _job("a"), _job("b", model="GPT-2", ps=False), _job("c", hi=1)
    full.w = 1
    m = action_mask([ps_job, flat, full], [0.0, 0.0, 0.0], (10.0, 100.0, 1000.0), spec)
    assert m.shape == (10,) and m[-1]
    assert list(m[0:3]) == [True, True, True]
    assert list(m[3:6]) == [True, False, False]  # no PS for an all-reduce job
    assert list(m[6:9]) == [False, True, False]  # at max_gpus: a PS only
    # an exhausted cluster: only stop
    m = action_mask([ps_job, flat], [10.0, 0.0, 0.0], (10.0, 100.0, 1000.0), spec)
    assert m[:-1].sum() == 1 and m[1]  # a PS needs no GPU: it still fits
    m = action_mask([ps_job, flat], [10.0, 100.0, 1000.0], (10.0, 100.0, 1000.0), spec)
    assert m.sum() == 1 and m[-1]
    used = [0.0, 0.0, 0.0]
    assert apply_action([ps_job], used, 2, spec) and (ps_job.w, ps_job.p) == (1, 1) and used == [1.0, 5.0, 20.0]
    assert not apply_action([ps_job], used, spec.n_actions - 1, spec)
    with pytest.raises(ValueError, match="no job in row 1"):
        apply_action([ps_job], used, 3, spec)


def test_slot_reward_hand_worked():
    # a: 50 of 100 left at the slot's start, 30 at its end; b: 10 of 40 left, finished in the slot
    prev = {"a": (50.0, 100.0), "b": (10.0, 40.0)}
    cl = ClusterSpec.parse("1x4")
    st = ClusterState(time=600.0, cluster=cl, free_gpus=np.array([4]), running=(),
                      pending=(JobInfo("a", "ResNet-50", 1, 0.0, 100.0, 70.0),))
    assert slot_reward(prev, st) == pytest.approx(20 / 100 + 10 / 40)


def test_supervised_warmup_reduces_imitation_loss():
    torch = pytest.importorskip("torch")
    from trainer.dl2.train import _mlp, supervised

    spec = DL2Spec(J=2)
    rng = np.random.default_rng(0)
    obs = rng.random((64, spec.obs_size)).astype(np.float32)
    masks = np.ones((64, spec.n_actions), bool)
    acts = (obs[:, 0] > 0.5).astype(np.int64) * 3  # a rule the actor can learn
    torch.manual_seed(0)
    torch.set_num_threads(1)
    actor = _mlp([spec.obs_size, 32, spec.n_actions])
    losses = supervised(actor, obs, masks, acts, epochs=20, lr=0.005, batch=16)
    assert losses[-1] < 0.5 * losses[0]


def test_checkpoint_round_trip_and_refusals(tmp_path):
    spec = DL2Spec(J=2)
    actor = _random_actor(spec)
    jpath = save_dl2(tmp_path / "ck", actor, spec, extra={"note": "test"})
    net, meta, jp = load_dl2(tmp_path / "ck.safetensors")
    assert jp == jpath and meta["spec"]["n_actions"] == spec.n_actions and net.spec == spec
    obs = np.random.default_rng(1).random(spec.obs_size).astype(np.float32)
    assert np.allclose(net.logits(obs), DL2Net(actor, spec).logits(obs))
    w = tmp_path / "ck.safetensors"
    data = bytearray(w.read_bytes())
    data[-1] ^= 1
    w.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="sha256 does not match"):
        load_dl2(tmp_path / "ck")
    meta["format"] = "pickle"
    jpath.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="not a dl2 checkpoint"):
        load_dl2(jpath)
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="unreadable dl2 checkpoint metadata"):
        load_dl2(tmp_path / "x.json")
    with pytest.raises(CheckpointError, match="not found"):
        load_dl2(tmp_path / "missing")


def test_dl2_policy_runs_jobs_to_completion(tmp_path):
    from policies.perf import ContentionModel
    from policies.psmodel import PSPerformanceModel
    from policies.registry import make_policy
    from trainer.elastic import generate, parse_elastic_trace
    from trainer.simulator import SimConfig, Simulator

    cl = ClusterSpec.parse(str(ROOT / "data/clusters/chic.yaml"))
    perf = PSPerformanceModel(ContentionModel(cl))
    spec = DL2Spec(J=4)
    save_dl2(tmp_path / "ck", _random_actor(spec), spec)
    jobs = parse_elastic_trace(generate("chic", seed=5, jobs=3))
    pol = make_policy(f"dl2:{tmp_path / 'ck'}", cl, perf)
    res = Simulator(cl, jobs, pol, perf, SimConfig()).run()
    assert len(res.jobs) == 3 and all(r.jct > 0 for r in res.jobs) and pol.inferences > 0


@pytest.mark.slow
def test_simulate_dl2_and_drf_on_an_elastic_trace(tmp_path):
    from trainer.elastic import generate, write_trace

    trace = tmp_path / "t.json"
    write_trace(generate("dl2", seed=3, jobs=4), trace)
    r = run_cli("simulate", "--policy", "dl2,drf", "--trace", str(trace), "--cluster",
                str(ROOT / "data/clusters/dl2.yaml"), "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "dl2" in r.stdout and "drf" in r.stdout
    r = run_cli("simulate", "--policy", f"dl2:{tmp_path / 'nope'}", "--trace", str(trace), "--cluster",
                str(ROOT / "data/clusters/dl2.yaml"), "--out", str(tmp_path / "out2"), cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "nope" in r.stderr


def test_shipped_checkpoint_loads_through_the_registry():
    from policies.dl2 import DL2Policy
    from policies.registry import is_learned, make_policy

    cl = ClusterSpec.parse(str(ROOT / "data/clusters/dl2.yaml"))
    pol = make_policy("dl2", cl)
    assert isinstance(pol, DL2Policy) and pol.spec.J == 40 and pol.spec.n_actions == 121
    assert is_learned("dl2") and is_learned("dl2:/x")
    with pytest.raises(Exception, match="empty checkpoint path"):
        make_policy("dl2:", cl)


def test_slot_batch_equals_encode_and_mask_along_a_random_slot():
    """SlotBatch's incremental state and mask equal encode / action_mask bit for bit after every action."""
    spec = DL2Spec(J=5)
    rng = np.random.default_rng(3)
    batch = [_job("a"), _job("b", model="GPT-2", ps=False, hi=3, t=600.0), _job("c", model="VGG-16", hi=6, done=200.0),
             _job("d", hi=2, t=1200.0)]
    cap = (9.0, 40.0, 200.0)
    used = [1.0, 4.0, 20.0]
    sb = SlotBatch(batch, cap, 3000.0, spec)
    for _ in range(60):
        ref = action_mask(batch, used, cap, spec, allow_stop=False)
        got = sb.mask(used, allow_stop=False)
        assert np.array_equal(got, ref)
        assert np.array_equal(sb.obs, encode(batch, cap, 3000.0, spec))
        legal = np.flatnonzero(ref[:-1])
        if not legal.size:
            break
        a = int(rng.choice(legal))
        assert apply_action(batch, used, a, spec)
        sb.update(a // 3)
    assert not legal.size  # the slot ran until nothing fit


@pytest.mark.slow
def test_train_writes_checkpoint_history_and_cpu(tmp_path):
    """A tiny train-dl2 run: warm-up, one RL episode, the checkpoint with its history, CPU seconds, complete."""
    from trainer.dl2.train import DL2TrainConfig, train

    cfg = DL2TrainConfig(J=4, hidden=(16,), jobs=4, sl_traces=1, sl_samples=300, sl_epochs=2, rl_episodes=1,
                         val_seeds=1, batch=16, replay=64)
    jpath = train(cfg, tmp_path / "dl2", progress_bar=False, log=lambda s: None)
    net, meta, _ = load_dl2(jpath)
    tr = meta["training"]
    assert net.spec.J == 4 and tr["complete"] is True and tr["cpu_s"] > 0
    assert len(tr["history"]["sl_loss"]) == 2 and len(tr["history"]["rl"]) == 1
    assert tr["history"]["rl"][0]["cpu_s"] <= tr["cpu_s"] and tr["config"]["cluster"] == "data/clusters/dl2.yaml"


def test_ac_update_stabilisers_target_critic_normalised_advantage_clip():
    """The target critic supplies V(s') of the TD target; normalised advantages and a gradient clip keep
    an update's step bounded whatever the reward scale; soft_update moves the target by tau."""
    import torch

    from trainer.dl2.train import _mlp, ac_update, soft_update

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    n, obs, acts = 32, 6, 4
    o = rng.random((n, obs), dtype=np.float32)
    m = np.ones((n, acts), bool)
    a = rng.integers(0, acts, n)
    o2 = rng.random((n, obs), dtype=np.float32)
    d = np.ones(n, np.float32)

    def step(scale, **kw):
        torch.manual_seed(1)
        actor, critic = _mlp([obs, 8, acts]), _mlp([obs, 8, 1])
        before = [p.detach().clone() for p in actor.parameters()]
        opt_a = torch.optim.SGD(actor.parameters(), lr=1.0)
        opt_c = torch.optim.SGD(critic.parameters(), lr=1e-3)
        r = (scale * rng.random(n)).astype(np.float32)
        ac_update(actor, critic, opt_a, opt_c, (o, m, a, r, o2, d), 0.9, 0.0, **kw)
        return math.sqrt(sum(float((p.detach() - b).norm()) ** 2 for p, b in zip(actor.parameters(), before)))

    # SGD at lr 1 moves the actor (total norm over its parameters) by at most the clip per update
    assert step(1000.0, clip=0.5) <= 0.5 + 1e-5
    assert step(1000.0) > 10.0
    # normalised advantages: a reward scale of 1 or 1000 gives steps of the same order
    s1, s2 = step(1.0, adv_norm=True), step(1000.0, adv_norm=True)
    assert 0.2 < s1 / s2 < 5.0

    # a target critic returning 0 makes the TD target r alone: the critic's loss is its MSE to r
    torch.manual_seed(2)
    actor, critic, target = _mlp([obs, 8, acts]), _mlp([obs, 8, 1]), _mlp([obs, 8, 1])
    with torch.no_grad():
        for p in target.parameters():
            p.zero_()
    r = rng.random(n).astype(np.float32)
    v = critic(torch.as_tensor(o)).squeeze(-1).detach().numpy()
    opt = torch.optim.SGD(critic.parameters(), lr=0.0)
    _la, lc = ac_update(actor, critic, torch.optim.SGD(actor.parameters(), lr=0.0), opt, (o, m, a, r, o2, d), 0.9,
                        0.1, target=target)
    assert lc == pytest.approx(float(np.mean((v - r) ** 2)), rel=1e-5)
    w0 = [p.detach().clone() for p in target.parameters()]
    soft_update(target, critic, 0.25)
    for pt, p0, pc in zip(target.parameters(), w0, critic.parameters()):
        assert torch.allclose(pt, 0.75 * p0 + 0.25 * pc.detach())


def test_entropy_weight_schedule():
    from trainer.dl2.train import DL2TrainConfig, entropy_weight

    assert [entropy_weight(DL2TrainConfig(rl_episodes=3), e) for e in range(3)] == [0.1, 0.1, 0.1]
    sched = [entropy_weight(DL2TrainConfig(rl_episodes=3, beta_end=0.0), e) for e in range(3)]
    assert sched == pytest.approx([0.1, 0.05, 0.0])
    assert entropy_weight(DL2TrainConfig(rl_episodes=1, beta_end=0.02), 0) == 0.02


@pytest.mark.slow
def test_train_from_init_repeats_the_full_run(tmp_path):
    """RL started with --init from a run's warm-up checkpoint (rl_episodes 0) gives the same weights as
    the one run with warm-up and RL, stabilisers on: the one-command recipe of a checkpoint trained that
    way."""
    from dataclasses import replace

    from trainer.dl2.train import DL2TrainConfig, train

    cfg = DL2TrainConfig(J=4, hidden=(16,), jobs=4, sl_traces=1, sl_samples=300, sl_epochs=2, rl_episodes=1,
                         val_seeds=1, batch=16, replay=64, rl_lr=0.01, adv_norm=True, target_tau=0.1, clip=1.0,
                         beta_end=0.0, updates=2)
    full, _m, _p = load_dl2(train(cfg, tmp_path / "full", progress_bar=False, log=lambda s: None))
    warm = train(replace(cfg, rl_episodes=0), tmp_path / "warm", progress_bar=False, log=lambda s: None)
    again_path = train(replace(cfg, init=str(warm)), tmp_path / "again", progress_bar=False, log=lambda s: None)
    again, meta, _p = load_dl2(again_path)
    assert meta["training"]["history"]["init"] == str(warm)
    assert len(meta["training"]["history"]["rl"]) == 1
    for (w1, b1), (w2, b2) in zip(full.weights, again.weights):
        assert np.array_equal(w1, w2) and np.array_equal(b1, b2)


def test_plan_shapes_reports_planned_workers_ps_and_relative_speed():
    """trainer.dl2.shapes: the mean shape a policy plans, its speed within (0, 1] of the model's best."""
    from trainer.dl2.shapes import best_speeds, plan_shapes

    best = best_speeds()
    assert set(best) and all(v > 0 for v in best.values())
    r = plan_shapes("drf", 2000, jobs=4)
    assert r["job_slots"] > 0 and r["workers"] >= 1 and r["ps"] >= 1 and 0 < r["rel_speed"] <= 1 + 1e-9
    assert r["jct"] > 0 and r["inferences"] is None
    with pytest.raises(ValueError, match="expected drf"):
        plan_shapes("sampled:drf", 2000, jobs=4)


def test_optimus_teacher_actions_give_optimus_allocation():
    """The optimus teacher's actions, applied batch by batch through DL2's masks, are all feasible and end at
    Optimus' allocation (J = 2, so the five jobs span three batches); an episode under the teacher has
    Optimus' JCT."""
    from policies.elastic import OptimusPolicy, make_elastic_policy
    from trainer.dl2.train import DL2TrainConfig, RecordingDL2, _jobs, _setup, optimus_actions, run_episode

    _cluster, perf = _setup(DL2TrainConfig())
    spec = DL2Spec(J=2)
    cap = (9.0, 200.0, 1000.0)

    def jobs():
        return [_job("a", "ResNet-50", hi=8, total=5e5), _job("b", "VGG-16", hi=8, t=1.0, total=2e5),
                _job("c", "MobileNetV3", ps=False, hi=4, t=2.0), _job("d", "Seq2Seq", hi=8, t=3.0, total=1e6),
                _job("e", "ResNet-50", hi=2, t=4.0)]

    ref = jobs()
    OptimusPolicy(perf, spec.slot_s).plan(ref, cap, None)
    mine = jobs()
    script = optimus_actions(mine, cap, spec, OptimusPolicy(perf, spec.slot_s))
    assert [(j.w, j.p) for j in mine] == [(0, 0)] * 5  # planned on copies
    assert len(script) == 3 and sum(map(len, script)) > 5
    used = [0.0, 0.0, 0.0]
    kinds = set()
    for b, acts in enumerate(script):
        batch = mine[2 * b: 2 * b + 2]
        for a in acts:
            assert action_mask(batch, used, cap, spec)[a], (b, a)
            assert apply_action(batch, used, a, spec)
            kinds.add(a % 3)
    assert [(j.w, j.p) for j in mine] == [(j.w, j.p) for j in ref]
    assert kinds == {0, 1, 2}  # +worker, +PS alone and +both all occur
    assert any(j.p > j.w for j in ref)  # Optimus leaves DRF's diagonal
    cluster, perf = _setup(DL2TrainConfig())
    net = DL2Net(_random_actor(DL2Spec()), DL2Spec())
    teacher = RecordingDL2(net, perf, "optimus", np.random.default_rng(0))
    got = run_episode(cluster, perf, _jobs(1000, 8), teacher)
    assert got == run_episode(cluster, perf, _jobs(1000, 8), make_elastic_policy("optimus", perf, DL2Spec().slot_s))
    assert sum(len(t.action) for t in teacher.slots) > 0


def test_train_dl2_cli_sl_samples_reaches_config_and_rejects_zero(capsys):
    """``--sl-samples N`` sets the warm-up's sample cap; 0 is refused by the parser (exit 2, one line)."""
    from rlsched.cli import build_parser
    from trainer.common.train_cli import config_values
    from trainer.dl2.cli import OPTIONS
    from trainer.dl2.train import DL2TrainConfig

    args = build_parser().parse_args(["train-dl2", "--out", "RUN", "--sl-samples", "60000", "--sl-epochs", "6"])
    cfg = DL2TrainConfig(**config_values(args, OPTIONS))
    assert (cfg.sl_samples, cfg.sl_epochs) == (60000, 6)
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["train-dl2", "--out", "RUN", "--sl-samples", "0"])
    assert exc.value.code == 2 and "--sl-samples" in capsys.readouterr().err
