"""Training under ``--compat deepshare``: the Gymnasium env, ``rlsched train --compat`` and peers.py's added
policies (``--policy NAME=SPEC``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from policies.checkpoint import CheckpointError, load_checkpoint
from policies.cluster import ClusterSpec
from policies.compat import CompatError, compat_mode
from policies.perf import ContentionModel
from trainer.env import PlacementEnv
from trainer.traces import load_trace
from trainer.train import TrainConfig, TrainConfigError, check_config, check_run
from cli_helpers import run_cli

REPO = Path(__file__).resolve().parents[1]
TRACE0 = REPO / "data" / "traces" / "deepshare" / "simulate" / "trace0.json"
C48 = ClusterSpec.parse("4x8")
MODE = compat_mode("deepshare")


def _tiny_trace(tmp_path: Path, n: int = 12) -> Path:
    """The first ``n`` jobs of DeepShare's trace0, in its own format."""
    raw = json.loads(TRACE0.read_text())
    p = tmp_path / "tiny.json"
    p.write_text(json.dumps({str(i): raw[str(i)] for i in range(n)}))
    return p


def test_env_places_only_the_modes_shapes():
    jobs = load_trace(TRACE0, C48)[:16]
    env = PlacementEnv([jobs], C48, reward="jct-rel", compat="deepshare", order="plan")
    assert env.perf.contention == MODE.contention and env.sim is None
    rng = np.random.default_rng(0)
    env.reset(seed=0)
    assert env.sim.cfg.compat == MODE and env.sim.cfg.event_triggered is False
    shapes, steps, done = set(), 0, False
    while not done:
        mask = env.action_masks()
        if env._enc is not None:  # every action the mask offers decodes to a placement the mode allows
            for a in np.flatnonzero(mask):
                d = env._enc.decode(int(a))
                if d is not None:
                    jid, p = d
                    assert MODE.allows(env.sim.by_id[jid].info.gpu_demand, p), (jid, p)
        _obs, _r, term, trunc, _info = env.step(int(rng.choice(np.flatnonzero(mask))))
        steps += 1
        for j in env.backend.snapshot().running:
            assert MODE.allows(j.gpu_demand, j.placement), (j.job_id, j.placement)
            assert j.placement.num_nodes >= 2 and tuple(j.placement.nodes) in MODE.node_sets
            shapes.add((j.gpu_demand, j.placement.num_nodes))
        done = term or trunc
    assert term and env.sim.finished == 16
    allowed = {(g, k) for g, sh in MODE.shapes.items() for k, _c in sh}
    assert shapes <= allowed and len(shapes) >= 3  # several of the seed's shapes, none other
    assert all(j.spec.submit_time == 0.0 for j in env.sim.jobs)  # every job at t = 0


def test_env_refuses_bad_combinations():
    jobs = load_trace(TRACE0, C48)[:4]
    with pytest.raises(CompatError, match="4x8"):
        PlacementEnv([jobs], "2x16", reward="jct", compat="deepshare")
    with pytest.raises(ValueError, match="contention"):
        PlacementEnv([jobs], C48, reward="jct", compat="deepshare", perf=ContentionModel(C48))
    with pytest.raises(ValueError, match="round_len"):
        PlacementEnv([jobs], C48, reward="jct", compat="deepshare", round_len=60.0)
    with pytest.raises(CompatError, match="unknown compat mode"):
        PlacementEnv([jobs], C48, reward="jct", compat="blox")


def test_check_config_compat():
    assert check_config(TrainConfig(compat="deepshare")).num_nodes == 4
    with pytest.raises(TrainConfigError, match="--compat must be one of deepshare"):
        check_config(TrainConfig(compat="blox"))
    with pytest.raises(TrainConfigError, match=r"needs the seed's cluster.*got 2x4"):
        check_config(TrainConfig(compat="deepshare", cluster="2x4"))


def test_train_compat_writes_checkpoint_with_mode(tmp_path):
    from trainer.env import load_trace_dir
    from trainer.train import train

    tiny = load_trace_dir(_tiny_trace(tmp_path, 8), C48)
    out = tmp_path / "run"
    cfg = TrainConfig(compat="deepshare", timesteps=256, n_envs=1, n_steps=128, batch_size=64, eval_freq=10_000)
    train(cfg, tiny, [], out)  # no validation traces: best = last
    tr = load_checkpoint(out / "last").meta["training"]
    assert tr["compat"] == "deepshare" and tr["config"]["compat"] == "deepshare"
    assert tr["timesteps"] >= 256
    assert "--compat deepshare" in tr["commands"][-1]["command"]
    # continuing the run without the mode is refused, naming the option
    with pytest.raises(CheckpointError, match="--compat"):
        check_run(TrainConfig(compat=None, n_envs=1, n_steps=128, batch_size=64, timesteps=512), out, resume=True)


@pytest.mark.slow
def test_train_cli_compat(tmp_path):
    tiny = _tiny_trace(tmp_path, 8)
    out = tmp_path / "run"
    r = run_cli("train", "--compat", "deepshare", "--traces", str(tiny), "--timesteps", "300", "--n-envs", "1",
             "--out", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    assert load_checkpoint(out / "last").meta["training"]["compat"] == "deepshare"


def test_train_cli_compat_bad_input(tmp_path):
    tiny = _tiny_trace(tmp_path)
    r = run_cli("train", "--compat", "deepshare", "--cluster", "2x4", "--traces", str(tiny), "--out", str(tmp_path / "a"))
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "rlsched train: error: --compat deepshare needs the seed's cluster, 4 nodes of 8 GPUs (4x8); got 2x4"]
    raw = json.loads(tiny.read_text())
    raw["0"]["gpu_demand"] = 1  # the seed never places a 1-GPU job
    bad = tmp_path / "one_gpu.json"
    bad.write_text(json.dumps(raw))
    r = run_cli("train", "--compat", "deepshare", "--traces", str(bad), "--out", str(tmp_path / "b"))
    assert r.returncode == 2, r.stderr[-2000:]
    assert len(r.stderr.strip().splitlines()) == 1 and "gpu_demand 1" in r.stderr
    assert not (tmp_path / "b" / "last.json").exists()


def test_peers_policy_option(tmp_path):
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import peers
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    files = ["--out", str(tmp_path / "F.md"), "--results-md", str(tmp_path / "R.md"), "--json", str(tmp_path / "r.json")]
    assert peers.main(["--from-json", str(REPO / "docs" / "fidelity_results.json"), "--policy", "nameonly", *files]) == 2
    assert peers.main(["--from-json", str(REPO / "docs" / "fidelity_results.json"), "--policy", "ds-las=fifo:ds",
                       *files]) == 2
    assert not (tmp_path / "F.md").exists()
    assert peers.main(["--from-json", str(REPO / "docs" / "fidelity_results.json"), *files]) == 0
    text = (tmp_path / "F.md").read_text()
    assert "The seed's claim on its own terms" in text and "| ds-las |" in text
