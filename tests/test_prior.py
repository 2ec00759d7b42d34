"""Admission prior (policies.prior) and its training policy (trainer.prior_policy)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.checkpoint import CheckpointError, load_checkpoint
from policies.cluster import ClusterSpec
from policies.perf import ContentionModel
from policies.prior import AdmissionPrior, PriorError
from policies.rl import make_rl_policy
from trainer.env import PlacementEnv
from trainer.generate import GeneratorConfig, generate_jobs
from trainer.simulator import SimConfig, Simulator
from trainer.train import TrainConfig, inference_net, train

CL = ClusterSpec.parse("2x4")
PERF = ContentionModel(CL)
C48 = ClusterSpec.parse("4x8")
PERF48 = ContentionModel(C48)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([0.0, 0.3, 0.79, 0.8, 0.95, 1.0]), min_size=1, max_size=30), st.floats(0.1, 3.0))
def test_numpy_and_torch_agree_and_rank(speeds, scale):
    pr = AdmissionPrior(0.8, scale)
    sp = np.asarray(speeds, np.float32)
    z = pr.logits(sp)
    zt = pr.logits_torch(torch.from_numpy(sp)[None]).numpy()[0]
    np.testing.assert_allclose(z, zt, rtol=0, atol=1e-6)
    ks = len(speeds)
    assert z.shape == (ks + 1,)
    good = [a for a in range(ks) if sp[a] >= 0.8]
    slow = [a for a in range(ks) if sp[a] < 0.8]
    order = list(np.argsort(-z, kind="stable"))
    # good options by index, then "nothing", then slow options by index
    assert order == good + [ks] + slow


def test_bad_parameters_are_clear(tmp_path):
    with pytest.raises(PriorError, match="theta"):
        AdmissionPrior(1.5)
    with pytest.raises(PriorError, match="scale"):
        AdmissionPrior(0.8, 0.0)
    with pytest.raises(PriorError, match="unknown action prior"):
        AdmissionPrior.from_dict({"kind": "magic"})
    assert AdmissionPrior.from_dict(None) is None
    assert AdmissionPrior.from_dict(AdmissionPrior(0.7, 2.0).to_dict()) == AdmissionPrior(0.7, 2.0)


def _tiny_run(tmp_path, **kw):
    trace = generate_jobs(CL, GeneratorConfig(num_jobs=10, seed=4, max_gpus=8, duration_s=1800.0), PERF)
    cfg = TrainConfig(cluster="2x4", timesteps=256, n_envs=1, n_steps=128, batch_size=64, eval_freq=10_000, **kw)
    train(cfg, [trace], [trace], tmp_path / "run")
    return trace, cfg


def test_training_policy_matches_exported_inference(tmp_path):
    """The SB3 training policy's logits equal the exported numpy network + prior (same observations)."""
    from sb3_contrib import MaskablePPO

    from trainer.prior_policy import MaskablePriorPolicy, PriorFlattenExtractor

    trace, _cfg = _tiny_run(tmp_path)
    ck = load_checkpoint(tmp_path / "run" / "last")
    assert ck.prior == AdmissionPrior(0.8, 1.0)
    assert json.loads(ck.json_path.read_text())["network"]["prior"]["kind"] == "admission"
    env = PlacementEnv([trace], CL, reward="jct", perf=PERF)
    spec = env.spec_obs
    model = MaskablePPO(
        MaskablePriorPolicy,
        env,
        policy_kwargs={
            "net_arch": {"pi": [16], "vf": [16]},
            "activation_fn": torch.nn.Tanh,
            "features_extractor_class": PriorFlattenExtractor,
            "features_extractor_kwargs": {"ks": spec.k * spec.options, "theta": 0.8, "scale": 1.0},
        },
        seed=0,
        device="cpu",
    )
    net = inference_net("maskable-ppo", model)
    obs, _ = env.reset(seed=0)
    ks = spec.k * spec.options
    for _ in range(12):
        mask = env.action_masks()
        with torch.no_grad():
            dist = model.policy.get_distribution(torch.from_numpy(obs[None]))
            lp = dist.distribution.logits.numpy()[0]
        z = net.logits(obs) + AdmissionPrior().logits(AdmissionPrior.speeds_from_obs(obs, ks))
        ref = z - np.log(np.exp(z - z.max()).sum()) - z.max()
        np.testing.assert_allclose(lp, ref, atol=1e-4)
        a = int(np.flatnonzero(mask)[0])
        obs, _, term, trunc, _ = env.step(a)
        if term or trunc:
            break


def test_prior_ablation_holds_only_instead_of_slow_options():
    """rl-prior places a slow option only when it may not hold, and finishes every job."""
    pol = make_rl_policy("rl-prior", C48, PERF48)
    seen = {"slow_forced": 0, "holds": 0}
    orig = pol.act

    def spy(enc):
        a = orig(enc)
        ks = enc.spec.k * enc.spec.options
        sp = enc.action_speeds()
        valid = np.flatnonzero(enc.mask[:ks])
        if a == ks:
            seen["holds"] += 1
            assert not any(sp[v] >= 0.8 for v in valid)
        elif sp[a] < 0.8:
            seen["slow_forced"] += 1
            assert not enc.mask[ks] and not any(sp[v] >= 0.8 for v in valid)
        else:
            assert a == min(v for v in valid if sp[v] >= 0.8)
        return a

    pol.act = spy
    jobs = generate_jobs(C48, GeneratorConfig(num_jobs=80, seed=3, jitter=0.9, duration_s=1800.0), PERF48)
    res = Simulator(C48, jobs, pol, PERF48, SimConfig(check_invariants=True)).run()
    assert all(np.isfinite(r.finish_time) for r in res.jobs)
    assert pol.stats["placements"] == len(jobs)
    assert seen["holds"] > 0  # the rule does hold on a mixed-duration set


def test_bad_prior_in_checkpoint_is_rejected(tmp_path):
    _tiny_run(tmp_path)
    j = tmp_path / "run" / "last.json"
    meta = json.loads(j.read_text())
    meta["network"]["prior"] = {"kind": "admission", "theta": 7}
    j.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="prior"):
        load_checkpoint(j)


def test_admission_needs_maskable(tmp_path, capsys):
    from rlsched.cli import main
    from trainer.traces import write_trace

    write_trace(tmp_path / "t.csv", generate_jobs(CL, GeneratorConfig(num_jobs=4, seed=1, max_gpus=8), PERF))
    rc = main(["train", "--algo", "ppo", "--prior", "admission", "--traces", str(tmp_path / "t.csv"),
               "--cluster", "2x4", "--out", str(tmp_path / "o")])
    assert rc == 2 and "maskable-ppo" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from([0.0, 0.3, 0.79999, 0.7999999821186066, 0.7999999821186067, 0.8, 0.80001, 1.0]), min_size=24, max_size=24)
    | st.lists(st.floats(0.0, 1.0), min_size=24, max_size=24),
    st.lists(st.booleans(), min_size=25, max_size=25),
    st.sampled_from([0.0, 0.5, 0.6, 0.8, 1.0]),
    st.sampled_from([0.5, 1.0, 3.0]),
    st.lists(st.floats(-5.0, 5.0, width=32), min_size=25, max_size=25),
)
def test_masked_logits_equal_masked_sum(speeds, mask, theta, scale, z):
    """Inference's fused path: ``z + masked_logits`` == ``where(mask, z + logits(speeds), -inf)``, bit for bit,
    including speeds within a float32 rounding of theta."""
    if not any(mask):
        mask[-1] = True
    prior = AdmissionPrior(theta=theta, scale=scale)
    m = np.array(mask)
    z32 = np.array(z, dtype=np.float32)
    valid = np.flatnonzero(m[:-1]).tolist()
    got = z32 + prior.masked_logits(speeds, valid, bool(m[-1]))
    want = np.where(m, z32 + prior.logits(np.array(speeds, dtype=np.float32)), -np.inf)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)
    assert int(np.argmax(got)) == int(np.argmax(want))


def test_scale_is_bounded_so_logits_stay_finite_in_float32():
    """A scale of 1e300 or Infinity (json.loads accepts it) would make every prior logit -inf in float32 and
    the masked argmax pick an invalid action; the scale must be finite and at most MAX_SCALE (1e6), which
    keeps every logit finite for any realistic action space, in numpy and torch alike."""
    from policies.prior import MAX_SCALE

    for bad, msg in ((1e300, r"\(0, 1e\+06\]"), (MAX_SCALE * 1.0001, "scale must be in"), (float("inf"), "finite"),
                     (float("nan"), "finite"), (-1.0, "scale must be in"), (True, "number"), ("1", "number")):
        with pytest.raises(PriorError, match=msg):
            AdmissionPrior(0.8, bad)
    for bad in (float("nan"), float("inf"), -0.1, True, "0.8", None):
        with pytest.raises(PriorError, match="theta"):
            AdmissionPrior(bad, 1.0)
    top = AdmissionPrior(0.8, MAX_SCALE)
    for ks in (24, 4096):  # 4x8's K*S, and a far larger action space
        slow = np.zeros(ks, np.float32)  # all options slow: the largest ranks (up to 2*ks)
        z = top.logits(slow)
        assert z.dtype == np.float32 and np.isfinite(z).all() and z.min() == np.float32(-MAX_SCALE * 2 * ks)
        assert np.isfinite(top.logits_torch(torch.from_numpy(slow)[None]).numpy()).all()
        assert np.isfinite(top.masked_logits(slow.tolist(), list(range(ks)), True)).all()
    assert AdmissionPrior(1, 2) == AdmissionPrior(1.0, 2.0)  # JSON integers are numbers too


def test_from_dict_is_strict():
    ok = {"kind": "admission", "theta": 0.8, "scale": 1.0}
    assert AdmissionPrior.from_dict(ok) == AdmissionPrior()
    for edit, msg in (({"scale": 1e300}, "scale"), ({"theta": "0.8"}, "theta must be a number"),
                      ({"scale": None}, "scale must be a number"), ({"extra": 1}, r"unknown field\(s\) extra")):
        with pytest.raises(PriorError, match=msg):
            AdmissionPrior.from_dict({**ok, **edit})
    with pytest.raises(PriorError, match="missing scale"):
        AdmissionPrior.from_dict({"kind": "admission", "theta": 0.8})
