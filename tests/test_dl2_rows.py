"""DL2's per-row actor (``arch`` ``rows``, policies.dl2.DL2RowsNet): the state's free-capacity globals,
permutation equivariance, independence of J, numpy / torch agreement, checkpoints, training and the flat
layout kept as it is."""

from __future__ import annotations

import json

import numpy as np
import pytest

from policies.checkpoint import CheckpointError
from policies.dl2 import (GLOBALS, DL2Net, DL2RowsNet, DL2Spec, SlotBatch, apply_action, encode, free_fractions,
                          load_dl2, make_net, rows_inputs, save_dl2, shipped_dl2)
from test_dl2 import _job, _random_actor

CAP = (10.0, 100.0, 1000.0)


def _rows_net(spec: DL2Spec, seed: int = 0, hidden: int = 12) -> DL2RowsNet:
    rng = np.random.default_rng(seed)
    n_in, n_ctx = rows_inputs(spec)

    def layers(sizes):
        return [(rng.normal(0, 0.3, (b, a)).astype(np.float32), rng.normal(0, 0.3, b).astype(np.float32))
                for a, b in zip(sizes, sizes[1:])]

    return make_net(spec, {"row": layers([n_in, hidden, hidden, 3]), "stop": layers([n_ctx + 2 * hidden, 8, 1])})


def _state(spec: DL2Spec, n: int, seed: int = 0):
    """A state of ``n`` jobs and a mask, drawn at random."""
    rng = np.random.default_rng(seed)
    x = np.zeros((spec.J, spec.row), np.float32)
    x[:n] = rng.random((n, spec.row))
    g = rng.random(len(GLOBALS)).astype(np.float32)
    m = np.zeros(spec.n_actions, bool)
    m[: 3 * n] = rng.random(3 * n) < 0.6
    m[-1] = True
    return np.concatenate([x.reshape(-1), g]), m


def test_rows_layout_holds_the_free_capacity():
    spec = DL2Spec(J=3, arch="rows")
    flat = DL2Spec(J=3)
    assert spec.obs_size == flat.obs_size + 3 and spec.n_actions == flat.n_actions
    assert spec.to_dict()["arch"] == "rows" and DL2Spec.from_dict(spec.to_dict()) == spec
    a, b = _job("a"), _job("b", model="VGG-16", t=600.0)
    a.w, a.p = 2, 1
    used = (2.0, 7.0, 30.0)
    obs = encode([a, b], CAP, 1200.0, spec, used)
    assert np.array_equal(obs[: flat.obs_size], encode([a, b], CAP, 1200.0, flat))
    assert obs[-3:] == pytest.approx([0.8, 0.93, 0.97])
    assert free_fractions(used, (10.0, float("inf"), 0.0)) == pytest.approx([0.8, 1.0, 1.0])
    with pytest.raises(ValueError, match="arch must be one of"):
        DL2Spec(arch="graph")


def test_slot_batch_keeps_the_rows_state_bit_for_bit():
    spec = DL2Spec(J=4, arch="rows")
    jobs = [_job("a"), _job("b", model="GPT-2", ps=False), _job("c", t=300.0)]
    sb = SlotBatch(jobs, CAP, 900.0, spec)
    used = [0.0, 0.0, 0.0]
    for a in (0, 2, 3, 7, 8, 1):
        apply_action(jobs, used, a, spec)
        sb.update(a // 3)
        sb.set_used(used)
        assert np.array_equal(sb.obs, encode(jobs, CAP, 900.0, spec, used))


def test_rows_actor_is_permutation_equivariant_and_free_of_J():
    spec = DL2Spec(J=5, arch="rows")
    net = _rows_net(spec)
    obs, mask = _state(spec, 4)
    z = net.logits(obs, mask)
    perm = [3, 0, 2, 1, 4]
    x = obs[: 5 * spec.row].reshape(5, spec.row)[perm].reshape(-1)
    m = np.concatenate([mask[:15].reshape(5, 3)[perm].reshape(-1), mask[-1:]])
    z2 = net.logits(np.concatenate([x, obs[-3:]]), m)
    assert np.allclose(z2[:15].reshape(5, 3), z[:15].reshape(5, 3)[perm], atol=1e-5)
    assert z2[-1] == pytest.approx(z[-1], abs=1e-5)
    # the same weights on a batch of J = 9 with the same 4 jobs: the same logits for them and for stop
    big = DL2Spec(J=9, arch="rows")
    net9 = DL2RowsNet(net.row, net.stop, big)
    x9 = np.zeros((9, spec.row), np.float32)
    x9[:5] = obs[: 5 * spec.row].reshape(5, spec.row)
    m9 = np.zeros(big.n_actions, bool)
    m9[:15], m9[-1] = mask[:15], mask[-1]
    z9 = net9.logits(np.concatenate([x9.reshape(-1), obs[-3:]]), m9)
    assert np.allclose(z9[:12], z[:12], atol=1e-5) and z9[-1] == pytest.approx(z[-1], abs=1e-5)
    # batched inputs give each state's logits
    obs2, mask2 = _state(spec, 2, seed=1)
    zb = net.logits(np.stack([obs, obs2]), np.stack([mask, mask2]))
    assert np.allclose(zb[0], z, atol=1e-6) and np.allclose(zb[1], net.logits(obs2, mask2), atol=1e-6)


def test_numpy_and_torch_rows_actors_agree_and_round_trip(tmp_path):
    torch = pytest.importorskip("torch")
    from trainer.dl2.train import _net, make_actor, torch_actor

    spec = DL2Spec(J=6, arch="rows")
    torch.manual_seed(0)
    actor = make_actor(spec, (16, 16))
    net = _net(actor, spec)
    states = [_state(spec, n, seed=n) for n in (0, 1, 4, 6)]
    obs, mask = np.stack([s[0] for s in states]), np.stack([s[1] for s in states])
    zt = actor(torch.as_tensor(obs), torch.as_tensor(mask)).detach().numpy()
    assert np.allclose(net.logits(obs, mask), zt, atol=1e-5)
    jpath = save_dl2(tmp_path / "ck", net, spec, extra={"note": "rows"})
    back, meta, _p = load_dl2(jpath)
    assert isinstance(back, DL2RowsNet) and meta["spec"]["arch"] == "rows" and meta["row_layers"] == 3
    assert np.array_equal(back.logits(obs, mask), net.logits(obs, mask))
    again = torch_actor(back)(torch.as_tensor(obs), torch.as_tensor(mask)).detach().numpy()
    assert np.array_equal(again, zt)
    # a row scorer of the wrong width is refused with one line
    meta["spec"]["J"] = 7
    meta["spec"]["obs_size"] = 7 * spec.row + 3
    meta["spec"]["n_actions"] = 22
    (tmp_path / "bad.json").write_text(json.dumps({**meta, "weights_sha256": meta["weights_sha256"]}))
    (tmp_path / "bad.safetensors").write_bytes((tmp_path / "ck.safetensors").read_bytes())
    back7, _m, _p = load_dl2(tmp_path / "bad")  # the weights do not depend on J
    assert back7.spec.J == 7
    del meta["stop_layers"]
    (tmp_path / "bad.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="stop_layers must be an integer"):
        load_dl2(tmp_path / "bad")


def test_flat_checkpoints_stay_flat(tmp_path):
    net, meta, _p = load_dl2(shipped_dl2().with_name("dl2-flat"))  # written before specs named their arch
    assert isinstance(net, DL2Net) and net.spec.arch == "flat" and "arch" not in meta["spec"]
    rows, rmeta, _p = load_dl2(shipped_dl2())
    assert isinstance(rows, DL2RowsNet) and rmeta["spec"]["arch"] == "rows" and rows.spec.J == 40
    spec = DL2Spec(J=2)
    save_dl2(tmp_path / "ck", _random_actor(spec), spec)
    back, meta2, _p = load_dl2(tmp_path / "ck")
    assert isinstance(back, DL2Net) and meta2["spec"]["arch"] == "flat" and "globals" not in meta2["spec"]
    with pytest.raises(ValueError, match="needs a rows spec"):
        DL2RowsNet(_rows_net(DL2Spec(J=2, arch="rows")).row, _rows_net(DL2Spec(J=2, arch="rows")).stop, spec)


def test_rows_policy_and_training_run(tmp_path):
    pytest.importorskip("torch")
    from trainer.dl2.train import DL2TrainConfig, train

    cfg = DL2TrainConfig(arch="rows", J=8, hidden=(16, 16), jobs=6, sl_traces=1, sl_samples=500, sl_epochs=2,
                         rl_episodes=1, val_seeds=1, batch=32, replay=256)
    jpath = train(cfg, tmp_path / "run", progress_bar=False, log=lambda s: None)
    net, meta, _p = load_dl2(jpath)
    assert isinstance(net, DL2RowsNet) and meta["training"]["complete"] and meta["training"]["config"]["arch"] == "rows"
    assert len(meta["training"]["history"]["rl"]) == 1 and meta["training"]["val_jct"] > 0


def test_ps_exploration_and_greedy_behaviour():
    from trainer.dl2.train import RecordingDL2, ps_action

    spec = DL2Spec(J=3, arch="rows")
    a, b, c = _job("a"), _job("b"), _job("c", model="GPT-2", ps=False)
    a.w, a.p, b.w, b.p, c.w = 4, 2, 2, 2, 3
    mask = np.ones(spec.n_actions, bool)
    assert ps_action([a, b, c], mask) == 1  # job a has the fewest PSs per worker
    mask[1] = False
    assert ps_action([a, b, c], mask) == 4
    mask[4] = False
    assert ps_action([a, b, c], mask) is None
    net = _rows_net(spec)
    obs = encode([a, b, c], CAP, 600.0, spec)
    m = np.ones(spec.n_actions, bool)
    greedy = RecordingDL2(net, None, "explore", np.random.default_rng(0), epsilon=0.0, behaviour="greedy", sample_p=0.0)
    assert greedy.choose(obs, m, [a, b, c]) == int(np.argmax(net.logits(obs, m)))
    explore = RecordingDL2(net, None, "explore", np.random.default_rng(0), epsilon=1.0, explore="ps")
    assert explore.choose(obs, m, [a, b, c]) == 1
