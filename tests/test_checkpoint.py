"""Checkpoint save / load / rejection (policies.checkpoint)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from policies.base import PolicyError
from policies.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from policies.cluster import ClusterSpec
from policies.encoding import ObsSpec

C48 = ClusterSpec.parse("4x8")


def _tensors(spec: ObsSpec, rng: np.random.Generator) -> dict[str, np.ndarray]:
    n_in = int(np.prod(spec.shape))
    return {
        "mlp_extractor.policy_net.0.weight": rng.normal(size=(16, n_in)).astype(np.float32) * 0.05,
        "mlp_extractor.policy_net.0.bias": np.zeros(16, np.float32),
        "mlp_extractor.policy_net.2.weight": rng.normal(size=(16, 16)).astype(np.float32) * 0.1,
        "mlp_extractor.policy_net.2.bias": np.zeros(16, np.float32),
        "action_net.weight": rng.normal(size=(spec.n_actions, 16)).astype(np.float32),
        "action_net.bias": np.zeros(spec.n_actions, np.float32),
        "value_net.weight": np.zeros((1, 16), np.float32),
        "value_net.bias": np.zeros(1, np.float32),
    }


LAYERS = ["mlp_extractor.policy_net.0", "mlp_extractor.policy_net.2", "action_net"]


def write_random_checkpoint(path: Path, cluster: ClusterSpec = C48, seed: int = 0, mode: str = "rl-base") -> Path:
    spec = ObsSpec.for_cluster(cluster)
    return save_checkpoint(
        path,
        _tensors(spec, np.random.default_rng(seed)),
        algo="maskable-ppo",
        mode=mode,
        cluster=cluster,
        spec=spec,
        layers=LAYERS,
        activation="tanh",
        reward={"kind": "progress", "w1": 0.4, "w2": 0.6},
        training={"traces": ["x"]},
    )


def test_round_trip(tmp_path):
    j = write_random_checkpoint(tmp_path / "ck")
    assert j.name == "ck.json" and (tmp_path / "ck.safetensors").is_file()
    ck = load_checkpoint(tmp_path / "ck")
    spec = ObsSpec.for_cluster(C48)
    assert ck.spec == spec and ck.mode == "rl-base" and ck.cluster == C48
    t = _tensors(spec, np.random.default_rng(0))
    obs = np.random.default_rng(1).random(spec.shape, dtype=np.float32)
    ref = np.tanh(
        np.tanh(obs.reshape(-1) @ t["mlp_extractor.policy_net.0.weight"].T) @ t["mlp_extractor.policy_net.2.weight"].T
    )
    ref = ref @ t["action_net.weight"].T
    np.testing.assert_allclose(ck.net.logits(obs), ref, rtol=1e-4, atol=1e-5)
    # both path spellings work
    assert load_checkpoint(tmp_path / "ck.safetensors").spec == spec
    meta = json.loads(j.read_text())
    assert meta["reward"]["w2"] == 0.6 and meta["project_version"] and len(meta["weights_sha256"]) == 64


def test_masked_argmax_respects_mask(tmp_path):
    ck = load_checkpoint(write_random_checkpoint(tmp_path / "ck"))
    spec = ck.spec
    obs = np.zeros(spec.shape, np.float32)
    for i in range(spec.n_actions):
        mask = np.zeros(spec.n_actions, bool)
        mask[i] = True
        assert ck.net.act(obs, mask) == i


def test_missing(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(tmp_path / "nope")
    write_random_checkpoint(tmp_path / "ck")
    (tmp_path / "ck.safetensors").unlink()
    with pytest.raises(CheckpointError, match="weights not found"):
        load_checkpoint(tmp_path / "ck")


def test_truncated(tmp_path):
    write_random_checkpoint(tmp_path / "ck")
    w = tmp_path / "ck.safetensors"
    w.write_bytes(w.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="sha256"):
        load_checkpoint(tmp_path / "ck")


def test_tampered_weights(tmp_path):
    write_random_checkpoint(tmp_path / "ck")
    w = tmp_path / "ck.safetensors"
    data = bytearray(w.read_bytes())
    data[-5] ^= 0xFF
    w.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="modified"):
        load_checkpoint(tmp_path / "ck")


def test_tampered_hash_on_garbage(tmp_path):
    """Even with a matching hash, non-safetensors bytes are rejected (no unpickling anywhere)."""
    import hashlib
    import pickle

    j = write_random_checkpoint(tmp_path / "ck")
    w = tmp_path / "ck.safetensors"
    w.write_bytes(pickle.dumps({"evil": 1}))
    meta = json.loads(j.read_text())
    meta["weights_sha256"] = hashlib.sha256(w.read_bytes()).hexdigest()
    j.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="safetensors"):
        load_checkpoint(j)


@pytest.mark.parametrize(
    "edit, msg",
    [
        (lambda m: m.pop("weights_sha256"), "weights_sha256"),
        (lambda m: m.update(format="other"), "not an rlsched"),
        (lambda m: m.update(mode="rl-magic"), "mode"),
        (lambda m: m.update(weights_file="../x.safetensors"), "plain file name"),
        (lambda m: m["obs_spec"].update(k=5), "obs_spec"),
        (lambda m: m["network"].update(activation="gelu"), "activation"),
    ],
)
def test_bad_metadata(tmp_path, edit, msg):
    j = write_random_checkpoint(tmp_path / "ck")
    meta = json.loads(j.read_text())
    edit(meta)
    j.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=msg):
        load_checkpoint(j)


def test_not_json(tmp_path):
    j = write_random_checkpoint(tmp_path / "ck")
    j.write_text("{not json")
    with pytest.raises(CheckpointError, match="JSON"):
        load_checkpoint(j)


def test_wrong_cluster_shape(tmp_path):
    ck = load_checkpoint(write_random_checkpoint(tmp_path / "ck"))
    with pytest.raises(CheckpointError, match="trained for a 4x8"):
        ck.check_cluster(ClusterSpec.parse("8x8"))
    assert issubclass(CheckpointError, PolicyError)


def test_cli_checkpoint_show(tmp_path, capsys):
    """`rlsched checkpoint`: the shipped one by name, a file, JSON; exit 2 with one line when unusable."""
    from rlsched.cli import main

    assert main(["checkpoint", "rl-base"]) == 0
    out = capsys.readouterr().out
    assert "maskable-ppo" in out and "order plan" in out and "(verified)" in out and "dba8ae7" in out

    write_random_checkpoint(tmp_path / "ck")
    assert main(["checkpoint", str(tmp_path / "ck"), "--cluster", "4x8", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["cluster"] == "4x8" and info["fits_cluster"] == "4x8" and info["mode"] == "rl-base"
    assert info["network"]["layers"][0] == [int(np.prod(ObsSpec.for_cluster(C48).shape)), 16]
    assert info["training"]["source"] is None  # written without provenance: shown as not recorded
    assert main(["checkpoint", str(tmp_path / "ck.json")]) == 0
    assert "(not recorded)" in capsys.readouterr().out

    # another cluster, tampered weights, a missing file, no shipped checkpoint: exit 2, one line naming the problem
    assert main(["checkpoint", str(tmp_path / "ck"), "--cluster", "8x8"]) == 2
    assert "4x8" in capsys.readouterr().err
    w = tmp_path / "ck.safetensors"
    data = bytearray(w.read_bytes())
    data[-5] ^= 0xFF
    w.write_bytes(bytes(data))
    assert main(["checkpoint", str(tmp_path / "ck")]) == 2
    err = capsys.readouterr().err
    assert "modified" in err and err.count("\n") == 1
    assert main(["checkpoint", str(tmp_path / "missing")]) == 2
    assert "not found" in capsys.readouterr().err
    assert main(["checkpoint", "rl-hybrid", "--cluster", "16x4"]) == 2
    assert "no shipped rl-hybrid checkpoint" in capsys.readouterr().err


def test_cli_output_to_a_closed_pipe_is_quiet():
    """`rlsched checkpoint rl-base --json | head -1`: no traceback, exit 0 (rlsched.cli.main)."""
    import subprocess
    import sys

    code = "import sys; from rlsched.cli import main; sys.exit(main(['checkpoint', 'rl-base', '--json']))"
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout.readline().strip() == b"{"
    p.stdout.close()  # the reader goes away, as `head -1` does
    err = p.stderr.read()
    assert p.wait(timeout=60) == 0 and b"Traceback" not in err, err
