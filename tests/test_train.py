"""Short training runs (trainer.train): learning beats random, checkpoints, resume, CLI."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from policies.checkpoint import CheckpointError, load_checkpoint
from policies.cluster import ClusterSpec
from policies.perf import ContentionModel
from policies.rl import make_rl_policy
from trainer.env import PlacementEnv
from trainer.generate import GeneratorConfig, generate_jobs
from trainer.train import TrainConfig, ship_checkpoint, source_revision, traces_fingerprint, train

CL = ClusterSpec.parse("2x4")
PERF = ContentionModel(CL)


def _trace(seed: int, n: int = 12):
    return generate_jobs(CL, GeneratorConfig(num_jobs=n, seed=seed, max_gpus=8, duration_s=1800.0), PERF)


def _episode_return(env: PlacementEnv, act) -> float:
    obs, _ = env.reset(seed=0, options={"trace": 0})
    total = 0.0
    while True:
        a = act(obs, env.action_masks())
        obs, r, term, trunc, _ = env.step(a)
        total += r
        if term or trunc:
            return total


@pytest.mark.slow
def test_training_beats_random(tmp_path):
    trace = _trace(1)
    cfg = TrainConfig(
        cluster="2x4",
        reward="jct",
        gamma=1.0,
        timesteps=6000,
        n_envs=2,
        n_steps=128,
        batch_size=64,
        eval_freq=3000,
        seed=0,
        learning_rate=1e-3,
        prior_init=False,
        prior="bias",  # the network alone, from random init: learning, not a prior, must beat random
    )
    summary = train(cfg, [trace], [trace], tmp_path / "run")
    assert summary["timesteps"] >= 6000
    ck = load_checkpoint(tmp_path / "run" / "best")
    env = PlacementEnv([trace], CL, reward="jct", perf=PERF)
    trained = _episode_return(env, lambda o, m: ck.net.act(o, m))
    rng = np.random.default_rng(0)
    rand = np.mean([_episode_return(env, lambda o, m: int(rng.choice(np.flatnonzero(m)))) for _ in range(10)])
    assert trained > rand
    # the run left TensorBoard logs, an evaluation log and both checkpoints
    assert any((tmp_path / "run" / "tb").rglob("events.out.tfevents.*"))
    assert (tmp_path / "run" / "eval.csv").read_text().count("\n") >= 2
    assert load_checkpoint(tmp_path / "run" / "last").meta["training"]["timesteps"] >= 6000


def test_resume_and_ship(tmp_path):
    trace = _trace(2, 8)
    cfg = TrainConfig(cluster="2x4", timesteps=256, n_envs=1, n_steps=128, batch_size=64, eval_freq=10_000)
    ticks: list[tuple[int, int]] = []
    train(cfg, [trace], [trace], tmp_path / "run", progress=lambda done, total: ticks.append((done, total)))
    first = load_checkpoint(tmp_path / "run" / "last").meta["training"]["timesteps"]
    assert ticks[-1] == (first, 256) and [d for d, _t in ticks] == sorted(d for d, _t in ticks) and len(ticks) >= 3
    cfg.timesteps = 512
    ticks.clear()
    s = train(cfg, [trace], [trace], tmp_path / "run", resume=True, progress=lambda d, t: ticks.append((d, t)))
    assert s["timesteps"] >= 512 > first
    assert ticks[0][0] > first and ticks[-1] == (s["timesteps"], 512)  # a resumed run counts on from where it was
    # a new run into a directory that holds one: refused, unless asked to start over
    before = (tmp_path / "run" / "last.json").read_bytes()
    with pytest.raises(CheckpointError, match="already holds a training run"):
        train(cfg, [trace], [trace], tmp_path / "run")
    assert (tmp_path / "run" / "last.json").read_bytes() == before
    cfg2 = dataclasses.replace(cfg, timesteps=128)
    train(cfg2, [trace], [trace], tmp_path / "over", overwrite=True)  # nothing there yet: a plain run
    (tmp_path / "over" / "summary.json").write_text("{}")  # a leftover of the run to be replaced
    s2 = train(cfg2, [trace], [trace], tmp_path / "over", overwrite=True)
    assert load_checkpoint(tmp_path / "over" / "last").meta["training"]["timesteps"] == s2["timesteps"] < 512
    assert json.loads((tmp_path / "over" / "summary.json").read_text())["timesteps"] == s2["timesteps"]
    shipped = ship_checkpoint(tmp_path / "run" / "best", CL, dest=tmp_path / "ship", command="rlsched train ...")
    assert [p.name for p in shipped] == ["rl-base-2x4.json", "rl-hybrid-2x4.json"]
    meta = json.loads(shipped[1].read_text())
    assert meta["mode"] == "rl-hybrid" and meta["training"]["command"] == "rlsched train ..."
    # provenance carried to the shipped files: the traces' content and the code's revision
    assert meta["training"]["traces_sha256"] == traces_fingerprint([trace])
    assert meta["training"]["val_traces_sha256"] == traces_fingerprint([trace])
    assert meta["training"]["source"] == source_revision()
    pol = make_rl_policy(f"rl-hybrid:{shipped[1]}", CL, PERF)
    assert pol.hybrid


def test_traces_fingerprint():
    a, b = _trace(1, 6), _trace(2, 6)
    fa = traces_fingerprint([a, b])
    assert len(fa) == 64 and fa == traces_fingerprint([list(a), list(b)])
    assert fa != traces_fingerprint([b, a])  # order of the job sets counts
    assert fa != traces_fingerprint([a + b])  # and how jobs are split into sets
    changed = [dataclasses.replace(a[0], gpu_demand=a[0].gpu_demand + 1), *a[1:]]
    assert fa != traces_fingerprint([changed, b])
    moved = [dataclasses.replace(a[0], extra={"user": "x"}), *a[1:]]
    assert fa == traces_fingerprint([moved, b])  # trace-only columns are not scheduling input


def test_source_revision(tmp_path, monkeypatch):
    import subprocess

    import trainer.train

    rev = source_revision()
    root = Path(trainer.train.__file__).resolve().parents[1]
    top = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], check=False, capture_output=True, text=True)
    if top.returncode == 0:  # the code is a git checkout (CI clones one): its commit
        assert rev is not None and rev["commit"] == top.stdout.strip() and isinstance(rev["dirty"], bool)
    # an installed copy inside some other git repository: not this code's revision
    other = tmp_path / "project"
    (other / "venv" / "site" / "trainer").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(other)], check=True)
    subprocess.run(
        ["git", "-C", str(other), "-c", "user.name=t", "-c", "user.email=t@example.org", "commit", "-q", "--allow-empty",
         "-m", "other"],
        check=True,
    )
    monkeypatch.setattr(trainer.train, "__file__", str(other / "venv" / "site" / "trainer" / "train.py"))
    assert source_revision() is None
    # no git on PATH: no revision, no error
    monkeypatch.setenv("PATH", str(tmp_path))
    assert source_revision() is None


@pytest.mark.parametrize("algo", ["ppo", "a2c", "dqn"])
def test_other_algos_export(tmp_path, algo):
    trace = _trace(3, 8)
    cfg = TrainConfig(algo=algo, cluster="2x4", timesteps=300, n_envs=1, n_steps=64, batch_size=32, eval_freq=10_000)
    train(cfg, [trace], [trace], tmp_path / algo)
    ck = load_checkpoint(tmp_path / algo / "best")
    assert ck.meta["algo"] == algo
    pol = make_rl_policy(f"rl-base:{ck.json_path}", CL, PERF)
    from trainer.simulator import Simulator

    res = Simulator(CL, trace, pol, PERF).run()
    assert all(np.isfinite(r.jct) for r in res.jobs)


def test_no_validation_traces(tmp_path, caplog):
    """Without validation traces: a warning, best = last, and a summary in strict JSON (nulls, no NaN)."""
    import json
    import logging

    trace = _trace(3, 8)
    cfg = TrainConfig(algo="a2c", cluster="2x4", timesteps=200, n_envs=1, n_steps=32, eval_freq=10_000)
    with caplog.at_level(logging.WARNING, logger="trainer.train"):
        summary = train(cfg, [trace], [], tmp_path / "r")
    assert any("no validation traces" in r.getMessage() for r in caplog.records)
    text = (tmp_path / "r" / "summary.json").read_text()
    assert "NaN" not in text
    on_disk = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    for key in ("best_val_rel_jct", "best_val_avg_jct_s", "final_val_rel_jct", "final_val_avg_jct_s"):
        assert summary[key] is None and on_disk[key] is None
    assert on_disk["evals"] == [] and not (tmp_path / "r" / "eval.csv").exists()
    best = (tmp_path / "r" / "best.safetensors").read_bytes()
    assert best == (tmp_path / "r" / "last.safetensors").read_bytes()


def test_cli_train_errors(tmp_path, capsys):
    from rlsched.cli import main

    assert main(["train", "--traces", str(tmp_path / "none"), "--out", str(tmp_path / "o")]) == 2
    assert "no such" in capsys.readouterr().err


def test_cli_resume_without_run_and_bad_arch(tmp_path, capsys):
    from rlsched.cli import main
    from trainer.traces import write_trace

    write_trace(tmp_path / "t.csv", _trace(5, 6))
    rc = main(
        ["train", "--traces", str(tmp_path / "t.csv"), "--cluster", "2x4", "--out", str(tmp_path / "o"), "--resume"]
    )
    assert rc == 2 and "nothing to resume" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    with pytest.raises(SystemExit) as e:
        main(["train", "--traces", str(tmp_path / "t.csv"), "--out", str(tmp_path / "o"), "--net-arch", "0"])
    assert e.value.code == 2


def test_init_from_checkpoint_and_its_errors(tmp_path):
    """--init: the run starts from the checkpoint's network (its first evaluation scores that network
    under the run's candidate order) and refuses a checkpoint of another algorithm or shape."""
    from policies.checkpoint import CheckpointError
    from trainer.train import evaluate_net

    trace = _trace(4, 8)
    src = TrainConfig(cluster="2x4", order="area", timesteps=256, n_envs=1, n_steps=128, batch_size=64, eval_freq=10_000)
    train(src, [trace], [trace], tmp_path / "a")
    ck = load_checkpoint(tmp_path / "a" / "last")
    assert ck.spec.order == "area"
    cfg = TrainConfig(
        cluster="2x4", order="fill", init=str(tmp_path / "a" / "last"), timesteps=128, n_envs=1, n_steps=128,
        batch_size=64, eval_freq=10_000,
    )
    s = train(cfg, [trace], [trace], tmp_path / "f")
    want = evaluate_net(ck.net, CL, PERF, [trace], prior=ck.prior, order="fill")
    assert s["evals"][0]["timesteps"] == 0 and s["evals"][0]["val_avg_jct_s"] == pytest.approx(want[0])
    out = load_checkpoint(tmp_path / "f" / "best")
    assert out.spec.order == "fill" and out.meta["training"]["config"]["init"] == str(tmp_path / "a" / "last")
    with pytest.raises(CheckpointError, match="was trained with maskable-ppo, not ppo"):
        train(TrainConfig(algo="ppo", cluster="2x4", init=cfg.init, timesteps=64, n_envs=1, n_steps=64, batch_size=32),
              [trace], [], tmp_path / "p")
    with pytest.raises(CheckpointError, match="observation"):
        train(TrainConfig(cluster="2x4", k=4, init=cfg.init, timesteps=64, n_envs=1, n_steps=64, batch_size=32),
              [trace], [], tmp_path / "k")
