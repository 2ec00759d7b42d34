"""Checkpoint save / load / rejection (policies.checkpoint)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from policies.base import PolicyError
from policies.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from policies.cluster import ClusterSpec
from policies.codecs.deepshare import ObsSpec

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
    assert meta["obs_spec"]["aging_s"] == spec.aging_s


def test_codec_name_and_spec_are_recorded(tmp_path):
    """A checkpoint records its codec's name and spec; the codec it builds is that codec with that spec."""
    from policies.codecs import DEFAULT_CODEC, DeepShareCodec
    from policies.perf import ContentionModel

    j = write_random_checkpoint(tmp_path / "ck")
    meta = json.loads(j.read_text())
    assert meta["codec"] == DEFAULT_CODEC == "deepshare-v1" and meta["obs_spec"] == ObsSpec.for_cluster(C48).to_dict()
    ck = load_checkpoint(j)
    assert ck.codec_name == "deepshare-v1"
    codec = ck.make_codec(C48, ContentionModel(C48))
    assert isinstance(codec, DeepShareCodec) and codec.spec == ck.spec
    with pytest.raises(CheckpointError, match=r"ck\.json: policy was trained for a 4x8 cluster"):
        ck.make_codec(ClusterSpec.parse("2x8"), ContentionModel(ClusterSpec.parse("2x8")))


@pytest.mark.parametrize("path", sorted((Path(__file__).parents[1] / "policies" / "checkpoints").glob("*.json")))
def test_a_checkpoint_without_codec_loads_as_deepshare_with_its_spec(path):
    """The shipped checkpoints name no codec: they load as deepshare-v1 with their stored observation spec."""
    meta = json.loads(path.read_text())
    assert "codec" not in meta
    ck = load_checkpoint(path)
    assert ck.codec_name == "deepshare-v1" and ck.spec == ObsSpec.from_dict(meta["obs_spec"])


def test_unknown_or_malformed_codec_is_refused(tmp_path):
    j = write_random_checkpoint(tmp_path / "ck")
    meta = json.loads(j.read_text())
    for bad, match in (("dl2-v9", r"unknown codec 'dl2-v9'; known codecs: deepshare-v1"),
                       (7, r"metadata field 'codec' must be a codec name \(a string\), got 7")):
        j.write_text(json.dumps({**meta, "codec": bad}))
        with pytest.raises(CheckpointError, match=match):
            load_checkpoint(j)
    spec = ObsSpec.for_cluster(C48)
    with pytest.raises(ValueError, match="unknown codec 'dl2-v9'"):
        save_checkpoint(tmp_path / "x", _tensors(spec, np.random.default_rng(0)), algo="maskable-ppo", mode="rl-base",
                        cluster=C48, spec=spec, layers=LAYERS, activation="tanh", reward={"kind": "jct"}, training={},
                        codec="dl2-v9")
    assert not (tmp_path / "x.json").exists()


def test_checkpoint_without_aging_runs_with_its_training_aging(tmp_path):
    """A checkpoint without ObsSpec.aging_s loads with LEGACY_AGING_S (1800 s), the aging it was trained with."""
    from policies.orders import LEGACY_AGING_S

    j = write_random_checkpoint(tmp_path / "ck")
    meta = json.loads(j.read_text())
    del meta["obs_spec"]["aging_s"]
    j.write_text(json.dumps(meta))
    assert load_checkpoint(j).spec.aging_s == LEGACY_AGING_S


def test_shipped_checkpoints_run_with_the_validated_aging():
    """The shipped network was trained with 1800 s and is shipped with 300 s (docs/RL.md)."""
    from policies.orders import AGING_S
    from policies.rl import make_rl_policy

    for mode in ("rl-base", "rl-hybrid"):
        pol = make_rl_policy(mode, C48)
        assert pol.codec.spec.aging_s == AGING_S == 300.0
        assert pol.checkpoint.meta["training"]["config"]["aging_s"] == 1800.0  # what it was trained with


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
    # a renamed pair: the weights file's name comes from the JSON, and the message says so
    write_random_checkpoint(tmp_path / "best")
    (tmp_path / "a.json").write_bytes((tmp_path / "best.json").read_bytes())
    (tmp_path / "best.json").rename(tmp_path / "b.json")
    (tmp_path / "best.safetensors").rename(tmp_path / "a.safetensors")
    with pytest.raises(CheckpointError, match=r"best\.safetensors: checkpoint weights not found \(named by .*a\.json's weights_file\)"):
        load_checkpoint(tmp_path / "a")


def test_truncated(tmp_path):
    write_random_checkpoint(tmp_path / "ck")
    w = tmp_path / "ck.safetensors"
    w.write_bytes(w.read_bytes()[:1000])
    # found from the safetensors header's size before any hashing
    with pytest.raises(CheckpointError, match="but the file has 1,000; the weights are truncated"):
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

    assert main(["checkpoint", "rl-base-4x8"]) == 0
    out = capsys.readouterr().out
    assert "maskable-ppo" in out and "order plan" in out and "(verified)" in out and "dba8ae7" in out
    # re-shipped with another aging (table borders and line wraps removed: independent of the terminal width)
    assert "(aging 300 s; trained with 1800 s)" in " ".join(out.replace("\u2502", " ").split())

    write_random_checkpoint(tmp_path / "ck")
    assert main(["checkpoint", str(tmp_path / "ck"), "--cluster", "4x8", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["cluster"] == "4x8" and info["fits_cluster"] == "4x8" and info["mode"] == "rl-base"
    assert info["network"]["layers"][0] == [int(np.prod(ObsSpec.for_cluster(C48).shape)), 16]
    assert info["training"]["source"] is None  # written without provenance: shown as not recorded
    assert info["observation"]["aging_s"] == 300.0 and info["observation"]["trained_aging_s"] is None
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
    assert main(["checkpoint", "rl-hybrid-4x8", "--cluster", "16x4"]) == 2
    assert "4x8" in capsys.readouterr().err
    assert main(["checkpoint", "rl-hybrid-16x4"]) == 2
    assert "no shipped rl-hybrid checkpoint" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["rl-base", "rl-hybrid", "rl-sf", "rl-base-4x8", "rl-hybrid-4x8", "sced2", "chic",
                                  "chic-pair", "dl2"])
def test_cli_checkpoint_describes_what_the_name_resolves_to(name, capsys):
    """`rlsched checkpoint NAME` shows the checkpoint `make_policy(NAME)` runs with, for every learned name."""
    from policies.registry import checkpoint_path, make_policy
    from rlsched.cli import main

    cluster = ClusterSpec.parse("4x8")
    pol = make_policy(name, cluster)
    used = getattr(pol, "checkpoint", None)
    used = getattr(used, "json_path", used)  # the fixed-shape policies hold the loaded Checkpoint
    path = checkpoint_path(name, cluster)
    if used is not None:
        assert Path(used).resolve() == path.resolve()
    assert main(["checkpoint", name, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert Path(info["checkpoint"]).resolve() == path.resolve()
    meta = json.loads(path.read_text())
    assert info.get("format", meta["format"]) == meta["format"]
    assert info["weights_sha256"] == meta["weights_sha256"]
    if name in ("rl-base", "rl-hybrid", "rl-sf"):
        assert info["format"] == "rlsched-sizefree" and info["name"] == name and info["parameters"] > 0
    if name.endswith("-4x8"):
        assert info["mode"] == name[: -len("-4x8")] and info["cluster"] == "4x8"
    assert main(["checkpoint", name]) == 0  # the table
    assert path.name in " ".join(capsys.readouterr().out.split())


def test_cli_checkpoint_sizefree_cluster_and_errors(tmp_path, capsys):
    """A size-free checkpoint fits any cluster; rl-prior, a non-learned name and an unknown format: exit 2, one line."""
    from rlsched.cli import main

    assert main(["checkpoint", "rl-base", "--cluster", "16x8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["fits_cluster"] == "16x8"
    assert main(["checkpoint", "rl-prior"]) == 2
    assert "no checkpoint" in capsys.readouterr().err
    (tmp_path / "odd.json").write_text(json.dumps({"format": "something-else"}))
    assert main(["checkpoint", str(tmp_path / "odd")]) == 2
    err = capsys.readouterr().err
    assert "unknown checkpoint format" in err and err.count("\n") == 1


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


# ---------------------------------------------------------------- tampered fields: refused at load, naming the field
def _with_prior(path: Path) -> Path:
    """A valid checkpoint with the admission prior (as the shipped ones have)."""
    from policies.prior import AdmissionPrior

    spec = ObsSpec.for_cluster(C48)
    return save_checkpoint(
        path, _tensors(spec, np.random.default_rng(0)), algo="maskable-ppo", mode="rl-base", cluster=C48, spec=spec,
        layers=LAYERS, activation="tanh", reward={"kind": "jct-rel"}, training={"timesteps": 10}, prior=AdmissionPrior(),
    )


def _set(*keys_value):
    """An edit setting ``meta[k1][k2]... = value`` (``keys_value`` = keys then the value)."""
    *keys, value = keys_value

    def edit(m):
        for k in keys[:-1]:
            m = m[k]
        m[keys[-1]] = value

    return edit


def _obs(**kw):
    """An edit replacing obs_spec fields, with ``shape`` / ``n_actions`` dropped (so only the fields are judged)."""

    def edit(m):
        m["obs_spec"].update(kw)
        m["obs_spec"].pop("shape")
        m["obs_spec"].pop("n_actions")

    return edit


@pytest.mark.parametrize(
    "edit, msg",
    [
        # a prior whose float32 logits would overflow (simulate would crash with "action 0 is not valid")
        (_set("network", "prior", "scale", 1e300), r"network\.prior: prior scale must be in \(0, 1e\+06\] so that its float32 logits stay finite"),
        (_set("network", "prior", "scale", float("inf")), r"network\.prior: prior scale must be finite"),
        (_set("network", "prior", "scale", -1.0), r"network\.prior: prior scale"),
        (_set("network", "prior", "theta", float("nan")), r"network\.prior: prior theta must be finite"),
        (_set("network", "prior", "theta", "0.8"), r"network\.prior: prior theta must be a number"),
        (_set("network", "prior", "scale", True), r"network\.prior: prior scale must be a number"),
        (_set("network", "prior", "bonus", 1.0), r"network\.prior: .*unknown field\(s\) bonus"),
        # observation spec nonsense (k = 0 would idle simulate for 10,000 rounds)
        (_obs(k=0), r"obs_spec.*'k' must be >= 1, got 0"),
        (_obs(levels=0), r"obs_spec.*'levels' must be in \[1, 4\], got 0"),
        (_obs(levels=-3), r"obs_spec.*'levels'"),
        (_obs(num_nodes=0), r"obs_spec.*'num_nodes' must be >= 1"),
        (_obs(gpus_per_node=8.9), r"obs_spec.*'gpus_per_node' must be an integer, got 8\.9"),
        (_obs(k=6.0), r"obs_spec.*'k' must be an integer, got 6\.0"),
        (_obs(total_gpus=True), r"obs_spec.*'total_gpus' must be an integer, got True"),
        (_obs(total_gpus=64), r"obs_spec.*total_gpus 64 is impossible"),
        (_obs(version="3"), r"obs_spec.*'version' must be an integer"),
        (_obs(order=1), r"obs_spec.*'order' must be a string"),
        (_obs(aging_s=0), r"obs_spec.*aging_s must be a finite number of seconds > 0, got 0"),
        (_obs(aging_s=float("inf")), r"obs_spec.*aging_s must be a finite number of seconds > 0, got inf"),
        (_obs(aging_s="300"), r"obs_spec.*aging_s must be a finite number of seconds > 0, got '300'"),
        (_obs(aging_s=10**400), r"obs_spec.*aging_s must be a finite number of seconds > 0, got 10000"),
        # in type but out of range: refused naming the field (1e-300 s was accepted, and ages every waiting job to 0)
        (_obs(aging_s=1e-300), r"metadata field 'obs_spec\.aging_s' must be in \[1, 1e\+09\] seconds, got 1e-300"),
        (_obs(aging_s=0.5), r"'obs_spec\.aging_s' must be in \[1, 1e\+09\] seconds, got 0\.5"),
        (_obs(aging_s=2e9), r"'obs_spec\.aging_s' must be in \[1, 1e\+09\] seconds, got 2e\+09"),
        (_obs(order="bogus"), r"obs_spec.*unknown candidate order 'bogus'; expected one of area, fill, plan"),
        (_obs(order="FILL"), r"obs_spec.*unknown candidate order 'FILL'"),
        (_set("network", "prior", "theta", 1.5), r"network\.prior: prior theta must be in \[0, 1\], got 1\.5"),
        (_set("network", "prior", "theta", -0.1), r"network\.prior: prior theta must be in \[0, 1\]"),
        (_set("network", "prior", "scale", 0.0), r"network\.prior: prior scale must be in \(0, 1e\+06\]"),
        (_set("reward", "kind", "magic"),
         r"metadata field 'reward\.kind' must be one of progress, jct, jct-rel, seed, got 'magic'"),
        (_set("reward", "kind", 3), r"'reward\.kind' must be one of .*, got 3"),
        (lambda m: m["reward"].pop("kind"), r"'reward\.kind' must be one of .*, got None"),
        (_set("reward", "w1", 1.5), r"metadata field 'reward\.w1' must be a number in \[0, 1\], got 1\.5"),
        (_set("reward", "w1", float("nan")), r"'reward\.w1' must be a number in \[0, 1\], got nan"),
        (_set("reward", "w1", "0.4"), r"'reward\.w1' must be a number in \[0, 1\], got '0\.4'"),
        (_set("reward", "w2", -0.1), r"'reward\.w2' must be a number in \[0, 1\], got -0\.1"),
        (_set("reward", "w2", True), r"'reward\.w2' must be a number in \[0, 1\], got True"),
        (_set("obs_spec", "n_actions", 26), r"obs_spec.*n_actions 26 disagrees"),
        (_set("obs_spec", "shape", "big"), r"obs_spec.*shape big disagrees"),
        # non-integral / bool integers in the cluster, non-finite bandwidths, format_version True
        (lambda m: [n.update(gpus=8.9) for n in m["cluster"]["nodes"]], r"'cluster\.nodes\[0\]\.gpus' must be a positive integer, got 8\.9"),
        (_set("cluster", "nodes", 2, "gpus", True), r"'cluster\.nodes\[2\]\.gpus' must be a positive integer, got True"),
        (_set("cluster", "nodes", 1, "gpus", "8"), r"'cluster\.nodes\[1\]\.gpus'"),
        (_set("cluster", "nodes", 0, "name", 7), r"'cluster\.nodes\[0\]\.name' must be a non-empty string"),
        (_set("cluster", "nodes", []), r"'cluster\.nodes' must be a non-empty list"),
        (_set("cluster", "inter_bw_gbps", float("nan")), r"'cluster\.inter_bw_gbps' must be a finite number > 0, got nan"),
        (_set("cluster", "intra_bw_gbps", "16"), r"'cluster\.intra_bw_gbps' must be a finite number > 0"),
        (_set("cluster", "intra_bw_gbps", float("inf")), r"'cluster\.intra_bw_gbps'"),
        (_set("format_version", True), r"unsupported format_version True"),
        (_set("format_version", 1.0), r"unsupported format_version 1\.0"),
        # training fields that code reads with a fixed type (rlsched checkpoint's summary would crash on these)
        (_set("training", "timesteps", 8.9), r"'training\.timesteps' must be a non-negative integer, got 8\.9"),
        (_set("training", "config", "x"), r"'training\.config' must be an object or null"),
        (_set("training", "source", "abc"), r"'training\.source' must be an object or null"),
        (_set("training", "config", {"traces": [1, 2]}), r"'training\.config\.traces' must be a list of paths"),
    ],
)
def test_tampered_metadata_is_refused_at_load(tmp_path, edit, msg):
    j = _with_prior(tmp_path / "ck")
    assert load_checkpoint(j).prior is not None  # the untouched checkpoint loads
    meta = json.loads(j.read_text())
    edit(meta)
    j.write_text(json.dumps(meta))  # json writes NaN / Infinity as Python's json.loads accepts them
    with pytest.raises(CheckpointError, match=msg) as ei:
        load_checkpoint(j)
    assert str(j) in str(ei.value)


def test_infinite_prior_scale_is_refused_before_simulating(tmp_path, capsys):
    """End to end: `rlsched simulate` with a prior scale of 1e300 exits 2 at load with one line naming the
    field, instead of crashing mid-run with a ValueError."""
    from policies.perf import ContentionModel
    from rlsched.cli import main
    from trainer.generate import GeneratorConfig, generate_jobs
    from trainer.traces import write_trace

    j = _with_prior(tmp_path / "ck")
    meta = json.loads(j.read_text())
    meta["network"]["prior"]["scale"] = 1e300
    j.write_text(json.dumps(meta))
    write_trace(tmp_path / "t.csv", generate_jobs(C48, GeneratorConfig(num_jobs=8, seed=1), ContentionModel(C48)))
    rc = main(["simulate", "--trace", str(tmp_path / "t.csv"), "--cluster", "4x8", "--policy", f"rl-base:{j}",
               "--out", str(tmp_path / "sim"), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "network.prior: prior scale must be in (0, 1e+06]" in err and "Traceback" not in err
    assert not (tmp_path / "sim" / "summary.json").exists()


def _rewrite_weights(j: Path, change) -> None:
    """Apply ``change`` to the tensors, rewrite the weights and re-sign them (a tamperer who updates the hash)."""
    import hashlib

    from safetensors.numpy import load, save

    w = j.with_suffix(".safetensors")
    t = change(dict(load(w.read_bytes())))
    data = save(t)
    w.write_bytes(data)
    meta = json.loads(j.read_text())
    meta["weights_sha256"] = hashlib.sha256(data).hexdigest()
    j.write_text(json.dumps(meta))


@pytest.mark.parametrize(
    "change, msg",
    [
        (lambda t: {**t, "action_net.bias": np.zeros(25, np.int64)}, r"layer action_net is float32 / int64, expected float32"),
        (lambda t: {**t, "action_net.bias": t["action_net.bias"].astype(np.float16)}, r"float32 / float16"),
        # finite, but 1e37 x 16 hidden units overflows float32 logits
        (lambda t: {**t, "action_net.weight": np.full_like(t["action_net.weight"], 1e37)}, r"layer action_net can output values of magnitude 1\.6e\+38"),
        (lambda t: {**t, "mlp_extractor.policy_net.0.bias": np.full(16, 3e38, np.float32)}, r"layer mlp_extractor\.policy_net\.0 can output"),
    ],
)
def test_tampered_weights_with_a_matching_hash_are_refused(tmp_path, change, msg):
    j = _with_prior(tmp_path / "ck")
    _rewrite_weights(j, change)
    with pytest.raises(CheckpointError, match=msg):
        load_checkpoint(j)


@pytest.mark.parametrize("name", ["value_net.weight", "value_net.bias"])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_tensors_outside_the_policy_layers_are_refused(tmp_path, name, bad):
    """The value head (and a DQN's target network) is loaded to --resume or --init from: NaN / inf there
    is refused at load too, not found by a torch traceback after a resumed run has written files."""
    j = write_random_checkpoint(tmp_path / "ck")

    def poison(t):
        v = t[name].copy()
        v.flat[0] = bad
        return {**t, name: v}

    _rewrite_weights(j, poison)
    with pytest.raises(CheckpointError, match=f"tensor {name} holds non-finite values"):
        load_checkpoint(j)


@pytest.mark.parametrize("change, msg", [
    (lambda t: {**t, "value_net.bias": np.array([np.nan], np.float32)}, r"tensor value_net\.bias holds non-finite"),
    (lambda t: {**t, "action_net.bias": np.full_like(t["action_net.bias"], np.inf)}, r"layer action_net holds non-finite"),
    (lambda t: {**t, "action_net.weight": np.full_like(t["action_net.weight"], 1e37)}, r"layer action_net can output values"),
])
def test_save_refuses_what_load_would_refuse_and_writes_nothing(tmp_path, change, msg):
    """A diverged network (NaN, or finite weights whose logits overflow float32) is not saved: it would be a
    checkpoint that never loads. Nothing is written, not even the folder."""
    spec = ObsSpec.for_cluster(C48)
    t = change(_tensors(spec, np.random.default_rng(0)))
    with pytest.raises(CheckpointError, match=msg) as ei:
        save_checkpoint(tmp_path / "new" / "ck", t, algo="maskable-ppo", mode="rl-base", cluster=C48, spec=spec,
                        layers=LAYERS, activation="tanh", reward={"kind": "progress", "w1": 0.4, "w2": 0.6}, training={})
    assert isinstance(ei.value, ValueError) and "not saved" in str(ei.value)
    assert not (tmp_path / "new").exists()


def test_large_but_safe_weights_load(tmp_path):
    """The overflow bound is not a magnitude cap on single weights: tanh bounds hidden values, so a huge
    first-layer weight is fine as long as the logits stay bounded."""
    j = _with_prior(tmp_path / "ck")
    _rewrite_weights(j, lambda t: {**t, "mlp_extractor.policy_net.0.weight": t["mlp_extractor.policy_net.0.weight"] * 1e30})
    assert np.isfinite(load_checkpoint(j).net.logits(np.ones(ObsSpec.for_cluster(C48).shape, np.float32))).all()


# ---------------------------------------------------------------- heterogeneous clusters: the layout must match
def _het(*gpus: int) -> ClusterSpec:
    from policies.cluster import NodeSpec

    return ClusterSpec(tuple(NodeSpec(f"n{i}", g) for i, g in enumerate(gpus)))


def test_heterogeneous_checkpoint_needs_the_same_node_layout(tmp_path):
    """[8, 4, 4] and [8, 6, 2] share nodes, largest node, total and levels, but their slot-exists channels
    differ: the per-node GPU counts, in node order, must match, and the message describes both layouts
    (not as "3x8")."""
    from rlsched.cli import main

    j = write_random_checkpoint(tmp_path / "ck", cluster=_het(8, 4, 4))
    ck = load_checkpoint(j)
    ck.check_cluster(_het(8, 4, 4))  # same layout, other node names: fine
    with pytest.raises(CheckpointError) as ei:
        ck.check_cluster(_het(8, 6, 2))
    err = str(ei.value)
    assert "trained for a 1x8+2x4 cluster (3 nodes, 16 GPUs)" in err and "is a 1x8+1x6+1x2 cluster" in err
    assert "3x8" not in err and str(j) in err
    with pytest.raises(CheckpointError, match=r"is a 1x4\+1x8\+1x4 cluster"):  # node order matters too
        ck.check_cluster(_het(4, 8, 4))
    with pytest.raises(CheckpointError, match=r"trained for a 1x8\+2x4 cluster .* is a 4x8 cluster"):
        ck.check_cluster(C48)
    # the CLI: exit 2 with that one line (`rlsched checkpoint het844 --cluster c862.yaml`)
    (tmp_path / "c862.yaml").write_text("nodes:\n  - {gpus: 8}\n  - {gpus: 6}\n  - {gpus: 2}\n")
    assert main(["checkpoint", str(j), "--cluster", str(tmp_path / "c862.yaml"), "--json"]) == 2
    # and a policy refuses it
    from policies.rl import make_rl_policy

    with pytest.raises(CheckpointError, match="1x8\\+1x6\\+1x2"):
        make_rl_policy(f"rl-base:{j}", _het(8, 6, 2))
    make_rl_policy(f"rl-base:{j}", _het(8, 4, 4))


def test_out_of_float_range_integers_are_refused_not_crashing(tmp_path):
    """JSON integers beyond float range (``math.isfinite`` raises OverflowError on them) are refused cleanly."""
    j = _with_prior(tmp_path / "ck")
    text = j.read_text()
    huge = "1" + "0" * 400
    for field, value in (('"scale": 1.0', f'"scale": {huge}'), ('"inter_bw_gbps": 5.0', f'"inter_bw_gbps": {huge}')):
        assert field in text
        j.write_text(text.replace(field, value))
        with pytest.raises(CheckpointError, match="finite"):
            load_checkpoint(j)
    meta = json.loads(text)
    meta["obs_spec"] = [1]
    j.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError) as ei:
        load_checkpoint(j)
    assert str(ei.value) == f"{j}: metadata field 'obs_spec' has type list"  # the path once, the field named


def _raw_safetensors(tensors: dict[str, tuple[str, list[int], bytes]]) -> bytes:
    """A safetensors file written by hand (dtypes numpy cannot hold, such as BF16): name -> (dtype, shape, bytes)."""
    import struct

    header, off, body = {}, 0, b""
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
        body += data
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + body


def test_tampered_files_of_other_kinds_are_refused_not_crashing(tmp_path):
    """A BF16 tensor (numpy has no such dtype), a layer with no outputs, metadata nested too deep or holding
    an integer of more than 4300 digits: each is refused with a CheckpointError, not a traceback."""
    import hashlib

    j = _with_prior(tmp_path / "ck")
    w = j.with_suffix(".safetensors")
    good_meta, good_w = j.read_text(), w.read_bytes()

    def sign(data: bytes) -> None:
        w.write_bytes(data)
        meta = json.loads(good_meta)
        meta["weights_sha256"] = hashlib.sha256(data).hexdigest()
        j.write_text(json.dumps(meta))

    sign(_raw_safetensors({"action_net.bias": ("BF16", [25], b"\0" * 50)}))
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        load_checkpoint(j)
    w.write_bytes(good_w)
    j.write_text(good_meta)
    _rewrite_weights(j, lambda t: {**t, "mlp_extractor.policy_net.0.weight": np.zeros((0, t["mlp_extractor.policy_net.0.weight"].shape[1]), np.float32),
                                   "mlp_extractor.policy_net.0.bias": np.zeros(0, np.float32)})
    with pytest.raises(CheckpointError, match="at least one output"):
        load_checkpoint(j)
    for text in ("[" * 100_000 + "]" * 100_000, good_meta.replace('"format_version": 1', '"format_version": ' + "9" * 5000)):
        j.write_text(text)
        with pytest.raises(CheckpointError, match="metadata is not usable JSON"):
            load_checkpoint(j)


def test_cli_checkpoint_summary_survives_out_of_range_numbers(tmp_path, capsys):
    from rlsched.cli import main

    j = _with_prior(tmp_path / "ck")
    meta = json.loads(j.read_text())
    meta["training"].setdefault("config", {})
    meta["training"]["val_rel_jct"] = 10**400
    meta["training"]["config"]["aging_s"] = 10**400
    j.write_text(json.dumps(meta))
    assert main(["checkpoint", str(j)]) == 0
    assert main(["checkpoint", str(j), "--json"]) == 0
    out = capsys.readouterr().out
    assert "validation" not in out.split("{", 1)[0] and '"trained_aging_s": null' in out


# ---------------------------------------------------------------- range checks agree with what the code writes
def test_aging_bounds_are_inclusive_and_never_written_out_of_range(tmp_path):
    """The accepted aging range holds the shipped (300 s) and legacy (1800 s) values and its own bounds; save refuses
    what load would refuse, before writing anything (a run could not resume from its own checkpoint otherwise)."""
    from dataclasses import replace

    from policies.checkpoint import MAX_AGING_S, MIN_AGING_S
    from policies.orders import AGING_S, LEGACY_AGING_S

    spec = ObsSpec.for_cluster(C48)
    for aging in (MIN_AGING_S, AGING_S, LEGACY_AGING_S, MAX_AGING_S):
        j = save_checkpoint(
            tmp_path / "ok", _tensors(spec, np.random.default_rng(0)), algo="maskable-ppo", mode="rl-base",
            cluster=C48, spec=replace(spec, aging_s=aging), layers=LAYERS, activation="tanh", reward={"kind": "jct"},
            training={},
        )
        assert load_checkpoint(j).spec.aging_s == aging
    for aging, reward in ((1e-300, {"kind": "jct"}), (2e9, {"kind": "jct"}), (300.0, {"kind": "jct", "w1": 2.0})):
        with pytest.raises(ValueError, match=r"'obs_spec\.aging_s' must be in|'reward\.w1'"):
            save_checkpoint(
                tmp_path / "bad", _tensors(spec, np.random.default_rng(0)), algo="maskable-ppo", mode="rl-base",
                cluster=C48, spec=replace(spec, aging_s=aging), layers=LAYERS, activation="tanh", reward=reward,
                training={},
            )
    assert not list(tmp_path.glob("bad*")) and not list(tmp_path.glob(".bad*"))


def test_reward_kinds_are_the_trainers():
    trainer_env = pytest.importorskip("trainer.env")
    from policies.checkpoint import REWARD_KINDS

    assert tuple(trainer_env.REWARDS) == REWARD_KINDS


# ---------------------------------------------------------------- saving: the pair is replaced in one atomic step
def _tensors_of(j: Path) -> dict[str, np.ndarray]:
    """The tensors a checkpoint loads with (through load_checkpoint: verified against its hash)."""
    from safetensors.numpy import load

    ck = load_checkpoint(j)
    return load(ck.weights_path.read_bytes())


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def _files(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


#: save_checkpoint's writes, in order: (what, the file written)
SAVE_WRITES = [
    ("staged weights", "ck.{h}.safetensors"),
    ("metadata commit", "ck.json"),
    ("stable weights", "ck.safetensors"),
    ("final metadata", "ck.json"),
]


def test_save_writes_staged_weights_then_commits_and_ends_with_stable_names(tmp_path, monkeypatch):
    import hashlib

    import policies.checkpoint as ckmod

    write_random_checkpoint(tmp_path / "ck", seed=0)
    written, fsynced = [], []
    real, real_fsync = ckmod.write_atomic, ckmod.os.fsync
    monkeypatch.setattr(ckmod, "write_atomic", lambda path, data: (written.append(Path(path).name), real(path, data)))
    monkeypatch.setattr(ckmod.os, "fsync", lambda fd: (fsynced.append(fd), real_fsync(fd)))
    j = write_random_checkpoint(tmp_path / "ck", seed=1)
    monkeypatch.undo()
    meta = json.loads(j.read_text())
    h = hashlib.sha256((tmp_path / "ck.safetensors").read_bytes()).hexdigest()
    assert written == [name.format(h=h[:16]) for _what, name in SAVE_WRITES]
    assert meta["weights_file"] == "ck.safetensors" and meta["weights_sha256"] == h
    assert _files(tmp_path) == ["ck.json", "ck.safetensors"]  # the staged copy is gone
    assert len(fsynced) >= 2 * len(SAVE_WRITES)  # every file before its rename, the directory after it


@pytest.mark.parametrize("step", range(len(SAVE_WRITES)), ids=[w for w, _ in SAVE_WRITES])
def test_save_interrupted_in_any_write_leaves_a_consistent_checkpoint(tmp_path, monkeypatch, step):
    """Ctrl-C between replacing NAME.safetensors and NAME.json must not leave the new weights beside the old
    metadata (old sha256: every later load would fail). A KeyboardInterrupt raised inside each write (the temp
    file written, right before its rename) leaves the previous checkpoint intact before the commit and the new one
    after it; never a mix, and no temp file."""
    import policies.checkpoint as ckmod

    j = write_random_checkpoint(tmp_path / "ck", seed=0)
    old = _tensors_of(j)
    new = _tensors(ObsSpec.for_cluster(C48), np.random.default_rng(1))
    calls = []
    real_replace = ckmod.os.replace

    def replace(src, dst):
        calls.append(Path(dst).name)
        if len(calls) == step + 1:
            raise KeyboardInterrupt
        return real_replace(src, dst)

    monkeypatch.setattr(ckmod.os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        write_random_checkpoint(tmp_path / "ck", seed=1)
    monkeypatch.undo()
    assert _same(_tensors_of(j), old if step <= 1 else new)  # the commit is the metadata's first rename
    assert not [n for n in _files(tmp_path) if n.startswith(".")]  # the interrupted write removed its temp file
    # the next save completes and removes what the interrupted one left (the staged weights)
    write_random_checkpoint(tmp_path / "ck", seed=2)
    assert _same(_tensors_of(j), _tensors(ObsSpec.for_cluster(C48), np.random.default_rng(2)))
    assert _files(tmp_path) == ["ck.json", "ck.safetensors"]


@pytest.mark.parametrize("step", range(len(SAVE_WRITES) + 1), ids=[w for w, _ in SAVE_WRITES] + ["cleanup"])
def test_save_killed_in_any_step_leaves_a_consistent_checkpoint_and_the_next_save_cleans_up(
    tmp_path, monkeypatch, step
):
    """A SIGKILL / OOM kill runs no cleanup: it leaves half a temp file of the write it interrupted (or, in the
    last step, the staged weights). The checkpoint still loads (the previous one before the commit, the new one
    after), and the next save deletes the leftovers."""
    import policies.checkpoint as ckmod

    j = write_random_checkpoint(tmp_path / "ck", seed=0)
    old = _tensors_of(j)
    new = _tensors(ObsSpec.for_cluster(C48), np.random.default_rng(1))
    calls = []
    real_write = ckmod.write_atomic

    def killed(path, data):
        calls.append(path)
        if len(calls) == step + 1:
            (path.parent / f".{path.name}.k1ll_3d0").write_bytes(data[: len(data) // 2])  # as mkstemp names it
            raise KeyboardInterrupt  # stands for the kill: nothing after this runs
        real_write(path, data)

    monkeypatch.setattr(ckmod, "write_atomic", killed)
    monkeypatch.setattr(ckmod, "_remove_leftovers", lambda jpath: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        write_random_checkpoint(tmp_path / "ck", seed=1)
    monkeypatch.undo()
    assert _same(_tensors_of(j), old if step <= 1 else new)  # killed in the commit's write: not committed
    assert len(_files(tmp_path)) > 2  # leftovers: a temp file and / or the staged weights
    write_random_checkpoint(tmp_path / "ck", seed=2)
    assert _same(_tensors_of(j), _tensors(ObsSpec.for_cluster(C48), np.random.default_rng(2)))
    assert _files(tmp_path) == ["ck.json", "ck.safetensors"]


def test_a_checkpoint_left_naming_its_staged_weights_loads_and_is_resaved_with_stable_names(tmp_path):
    """The state a save interrupted after its commit leaves: NAME.json names NAME.<hash>.safetensors, and
    NAME.safetensors holds older weights. It loads (the new weights), and so does a run resumed from it."""
    import shutil

    j = write_random_checkpoint(tmp_path / "ck", seed=1)
    meta = json.loads(j.read_text())
    staged = f"ck.{meta['weights_sha256'][:16]}.safetensors"
    shutil.copy(tmp_path / "ck.safetensors", tmp_path / staged)
    write_random_checkpoint(tmp_path / "older", seed=0)
    shutil.copy(tmp_path / "older.safetensors", tmp_path / "ck.safetensors")
    j.write_text(json.dumps({**meta, "weights_file": staged}))
    ck = load_checkpoint(j)
    assert ck.weights_path.name == staged
    assert _same(_tensors_of(j), _tensors(ObsSpec.for_cluster(C48), np.random.default_rng(1)))
    write_random_checkpoint(tmp_path / "ck", seed=2)
    assert not (tmp_path / staged).exists() and load_checkpoint(j).weights_path.name == "ck.safetensors"


def test_checkpoints_with_the_plain_weights_name_load(tmp_path):
    """Checkpoints whose weights file is NAME.safetensors (the shipped ones, users' runs) load, and a new
    save over one keeps that name."""
    import hashlib

    from safetensors.numpy import save

    from rlsched import __version__

    shipped = sorted((Path(__file__).parent.parent / "policies" / "checkpoints").glob("*.json"))
    assert [p.name for p in shipped] == ["rl-base-4x8.json", "rl-hybrid-4x8.json"]
    for p in shipped:
        ck = load_checkpoint(p)
        assert ck.meta["weights_file"] == p.with_suffix(".safetensors").name == ck.weights_path.name
    # the plain layout written by hand (weights, then metadata, no staged file)
    spec = ObsSpec.for_cluster(C48)
    data = save(_tensors(spec, np.random.default_rng(0)))
    (tmp_path / "old.safetensors").write_bytes(data)
    (tmp_path / "old.json").write_text(json.dumps({
        "format": "rlsched-policy", "format_version": 1, "project_version": __version__, "algo": "ppo",
        "mode": "rl-base", "cluster": C48.to_dict(), "obs_spec": spec.to_dict(),
        "network": {"kind": "mlp", "layers": LAYERS, "activation": "tanh"}, "reward": {"kind": "jct"},
        "training": {}, "weights_file": "old.safetensors", "weights_sha256": hashlib.sha256(data).hexdigest(),
    }))
    assert _same(_tensors_of(tmp_path / "old.json"), _tensors(spec, np.random.default_rng(0)))
    write_random_checkpoint(tmp_path / "old", seed=1)
    assert _files(tmp_path) == ["old.json", "old.safetensors"]
    assert _same(_tensors_of(tmp_path / "old"), _tensors(spec, np.random.default_rng(1)))


def test_shipping_keeps_the_stable_file_names(tmp_path):
    """`rlsched train --export-shipped` (ship_checkpoint) replaces
    policies/checkpoints/rl-*-<shape>.{json,safetensors} in place: the same names, nothing else left beside
    them, also when shipped again over them."""
    train = pytest.importorskip("trainer.train")
    src = Path(__file__).parent.parent / "policies" / "checkpoints" / "rl-base-4x8"
    for _ in range(2):
        shipped = train.ship_checkpoint(src, C48, dest=tmp_path, command="test")
        assert [p.name for p in shipped] == ["rl-base-4x8.json", "rl-hybrid-4x8.json"]
        assert _files(tmp_path) == [
            "rl-base-4x8.json", "rl-base-4x8.safetensors", "rl-hybrid-4x8.json", "rl-hybrid-4x8.safetensors"
        ]
        for p in shipped:
            assert json.loads(p.read_text())["weights_file"] == p.with_suffix(".safetensors").name
            load_checkpoint(p)


def test_save_removes_only_its_own_leftovers(tmp_path):
    """The next save of NAME deletes staged weights and temp files of NAME that its metadata does not name, and
    nothing else: not another checkpoint's files (NAME.v2, a checkpoint literally named NAME.<16 hex>, weights
    another JSON names), nor files of other patterns."""
    import shutil

    write_random_checkpoint(tmp_path / "ck", seed=0)
    write_random_checkpoint(tmp_path / "ck.v2", seed=0)
    write_random_checkpoint(tmp_path / "ck.fedcba9876543210", seed=0)  # plain weights that look staged
    shutil.copy(tmp_path / "ck.json", tmp_path / "alias.json")  # names ck.safetensors
    orphans = [
        "ck.0123456789abcdef.safetensors",  # staged weights of an interrupted save
        ".ck.json.abcd_123",  # temp files of killed writes (tempfile.mkstemp's names)
        ".ck.safetensors.zzzz9999",
        ".ck.0123456789abcdef.safetensors.a1b2c3d4",
    ]
    kept = [
        "ck.0123456789ABCDEF.safetensors",  # not a name save_checkpoint writes
        "ck.0123456789abcde.safetensors",
        "ck.safetensors.bak",
        "xck.0123456789abcdef.safetensors",
        ".other.json.abcd_123",
        ".ck.json.toolong123",
        "notes.txt",
    ]
    for name in orphans + kept:
        (tmp_path / name).write_bytes(b"x")
    before = set(_files(tmp_path))
    write_random_checkpoint(tmp_path / "ck", seed=1)
    assert set(_files(tmp_path)) == before - set(orphans)
    for name in ("ck.v2", "ck.fedcba9876543210", "ck"):
        load_checkpoint(tmp_path / name)
    # saving the alias writes alias.safetensors and leaves ck.safetensors (named by ck.json) alone
    write_random_checkpoint(tmp_path / "alias", seed=3)
    assert load_checkpoint(tmp_path / "ck").weights_path.name == "ck.safetensors"
    assert load_checkpoint(tmp_path / "alias").weights_path.name == "alias.safetensors"


def test_a_save_between_reading_the_metadata_and_the_weights_loads_the_new_checkpoint(tmp_path, monkeypatch):
    """A reader (rlsched simulate on OUT/best while training) that read the metadata just before a save replaced
    the checkpoint finds the weights it names changed or deleted: it reads the metadata again and loads the new
    checkpoint instead of failing; an unchanged metadata with bad weights is still an error."""
    import policies.checkpoint as ckmod

    spec = ObsSpec.for_cluster(C48)
    j = write_random_checkpoint(tmp_path / "ck", seed=0)
    real_read = ckmod._read_weights
    for seed, staged in ((1, False), (2, True)):
        if staged:  # a checkpoint naming its staged weights, which the concurrent save deletes
            meta = json.loads(j.read_text())
            name = f"ck.{meta['weights_sha256'][:16]}.safetensors"
            (tmp_path / name).write_bytes((tmp_path / "ck.safetensors").read_bytes())
            j.write_text(json.dumps({**meta, "weights_file": name}))
        calls = []

        def read(path, seed=seed, calls=calls):
            calls.append(path.name)
            if len(calls) == 1:
                write_random_checkpoint(tmp_path / "ck", seed=seed)  # the concurrent save
            return real_read(path)

        monkeypatch.setattr(ckmod, "_read_weights", read)
        ck = load_checkpoint(j)
        monkeypatch.undo()
        assert len(calls) == 2 and ck.weights_path.name == "ck.safetensors"
        t = _tensors(spec, np.random.default_rng(seed))
        assert np.array_equal(ck.net.layers[-1][1], t["action_net.bias"])
        assert np.array_equal(ck.net.layers[0][0], t["mlp_extractor.policy_net.0.weight"].T)
    # without a concurrent save the error stands (and is a plain CheckpointError)
    w = tmp_path / "ck.safetensors"
    w.write_bytes(w.read_bytes()[:-3] + b"xyz")
    with pytest.raises(CheckpointError, match="does not match") as ei:
        load_checkpoint(j)
    assert type(ei.value) is CheckpointError


@pytest.mark.parametrize(
    "name",
    ["../ck.safetensors", "/etc/passwd", "{abs}", "sub/ck.safetensors", "sub\\ck.safetensors", "C:ck.safetensors",
     "..", ".", "", "ck.safetensors\0.txt"],
)
def test_weights_file_must_be_a_bare_name_in_the_metadatas_directory(tmp_path, name):
    """No path traversal through the metadata: weights_file is a file name beside the JSON, never a path (not even
    an absolute path to the checkpoint's own, valid weights)."""
    j = write_random_checkpoint(tmp_path / "ck")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "ck.safetensors").write_bytes((tmp_path / "ck.safetensors").read_bytes())
    meta = json.loads(j.read_text())
    meta["weights_file"] = name.format(abs=tmp_path / "ck.safetensors")
    j.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="weights_file must be a plain file name") as ei:
        load_checkpoint(j)
    assert str(j) in str(ei.value)


def test_weights_size_is_checked_against_the_header_before_reading(tmp_path, monkeypatch):
    """A weights file longer than its safetensors header says (sparse padding of 3 GiB, or a few bytes) is refused
    after reading only the header: the data is never read (no read of more than the header is attempted)."""
    import policies.checkpoint as ckmod

    j = write_random_checkpoint(tmp_path / "ck")
    w = tmp_path / "ck.safetensors"
    good = w.read_bytes()
    reads = []
    real_open = Path.open

    def counting_open(self, *a, **k):
        f = real_open(self, *a, **k)
        if self.name.endswith(".safetensors"):
            real_read = f.read

            def read(n=-1):
                reads.append(n)
                return real_read(n)

            f.read = read  # type: ignore[method-assign]
        return f

    monkeypatch.setattr(Path, "open", counting_open)
    with w.open("r+b") as f:  # padded to 3 GiB without writing (sparse): size over the limit
        f.truncate(3 * 2**30)
    with pytest.raises(CheckpointError, match="over the 268,435,456-byte limit"):
        load_checkpoint(j)
    assert reads == []  # refused from stat alone
    w.write_bytes(good + b"\0" * 4096)  # under the limit but not what the header describes
    reads.clear()
    with pytest.raises(CheckpointError, match=r"the header describes .* but the file has") as ei:
        load_checkpoint(j)
    assert "\n" not in str(ei.value)
    n = int.from_bytes(good[:8], "little")
    assert reads[:2] == [8, n] and all(r != -1 for r in reads)
    assert ckmod.MAX_WEIGHTS_BYTES == 256 * 2**20


def test_weights_are_hashed_in_chunks(tmp_path, monkeypatch):
    """The sha256 is computed while the weights are read in chunks, and the bytes parsed are the bytes hashed."""
    import policies.checkpoint as ckmod

    j = write_random_checkpoint(tmp_path / "ck")
    monkeypatch.setattr(ckmod, "_CHUNK", 1000)
    ck = load_checkpoint(j)
    assert ck.meta["weights_sha256"] == __import__("hashlib").sha256((tmp_path / "ck.safetensors").read_bytes()).hexdigest()
    data, sha = ckmod._read_weights(tmp_path / "ck.safetensors")
    assert data == (tmp_path / "ck.safetensors").read_bytes() and sha == ck.meta["weights_sha256"]


@pytest.mark.parametrize("header", [b"not json", b"[1, 2]", b'{"a": {"data_offsets": [0, -1]}}'])
def test_a_bad_safetensors_header_is_one_error(tmp_path, header):
    j = write_random_checkpoint(tmp_path / "ck")
    (tmp_path / "ck.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    with pytest.raises(CheckpointError, match="not a usable safetensors weights file"):
        load_checkpoint(j)


@pytest.mark.parametrize("mode", ["rl-base", "rl-hybrid"])
def test_shipped_checkpoints_record_repo_relative_provenance_and_a_recipe(mode):
    """The shipped metadata names no directory of the machine it was trained on: trace directories, --init and
    --out are relative to the recipe's DIR, and training.recipe names a script of the repository. The weights
    still match the metadata's sha256 (which covers the weights file only)."""
    import hashlib
    import re

    repo = Path(__file__).resolve().parents[1]
    j = repo / "policies" / "checkpoints" / f"{mode}-4x8.json"
    text = j.read_text()
    assert not re.search(r"/tmp/|/home/|/root/|[A-Za-z]:\\\\", text)
    ck = load_checkpoint(j)
    tr = ck.meta["training"]
    assert tr["config"]["traces"] == ["traces/train"] and tr["config"]["val_traces"] == ["traces/val"]
    assert tr["config"]["init"] == "runs/f2/best" and "--out runs/p2" in tr["command"]
    recipe = tr["recipe"]["command"].split()
    assert recipe[:2] == ["bash", "scripts/reproduce_shipped.sh"] and (repo / recipe[1]).is_file()
    w = repo / "policies" / "checkpoints" / f"{mode}-4x8.safetensors"
    assert hashlib.sha256(w.read_bytes()).hexdigest() == ck.meta["weights_sha256"]
    assert "session" not in text and "filled in" not in text


def test_relative_provenance_rewrites_paths_under_the_base_only():
    from trainer.train import SHIPPED_RECIPE, relative_provenance

    tr = {
        "config": {"traces": ["/w/t/train", "/elsewhere/t"], "val_traces": ["/w/t/val"], "init": "/w/runs/a/best"},
        "command": "rlsched train --traces /w/t/train --init '/w/runs/a b/best' --out /w/runs/c --cluster /etc/c.yaml",
        "commands": [{"start_timesteps": 0, "command": "rlsched train --out /w/runs/c"}],
        "timesteps": 5,
    }
    out = relative_provenance(tr, "/w")
    assert out["config"] == {"traces": ["t/train", "/elsewhere/t"], "val_traces": ["t/val"], "init": "runs/a/best"}
    assert out["command"] == "rlsched train --traces t/train --init 'runs/a b/best' --out runs/c --cluster /etc/c.yaml"
    assert out["commands"] == [{"start_timesteps": 0, "command": "rlsched train --out runs/c"}]
    assert out["recipe"] == SHIPPED_RECIPE and out["timesteps"] == 5
    assert tr["config"]["traces"][0] == "/w/t/train"  # the input is not changed
    assert relative_provenance(tr, "/wx")["config"]["init"] == "/w/runs/a/best"  # a prefix, not a parent


def test_ship_checkpoint_relative_to_keeps_the_weights(tmp_path):
    from trainer.train import ship_checkpoint

    j = write_random_checkpoint(tmp_path / "run" / "best")
    meta = json.loads(j.read_text())
    meta["training"] = {"config": {"traces": [str(tmp_path / "traces" / "train")], "init": None},
                        "command": f"rlsched train --traces {tmp_path / 'traces' / 'train'} --out {tmp_path / 'run'}"}
    j.write_text(json.dumps(meta))
    paths = ship_checkpoint(j, C48, dest=tmp_path / "ship", relative_to=tmp_path)
    for p in paths:
        ck = load_checkpoint(p)
        assert ck.meta["training"]["config"]["traces"] == ["traces/train"]
        assert ck.meta["training"]["command"] == "rlsched train --traces traces/train --out run"
        assert str(tmp_path) not in p.read_text()
        assert np.array_equal(ck.net.layers[0][0], load_checkpoint(j).net.layers[0][0])
