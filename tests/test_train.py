"""Short training runs (trainer.train): learning beats random, checkpoints, resume, CLI."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from policies.checkpoint import CheckpointError, load_checkpoint
from policies.cluster import ClusterSpec
from policies.perf import ContentionModel
from policies.rl import make_rl_policy
from trainer.env import PlacementEnv
from trainer.generate import GeneratorConfig, generate_jobs
from trainer.train import (
    TrainConfig,
    _model_tensor_shapes,
    _stored_tensor_shapes,
    ship_checkpoint,
    source_revision,
    traces_fingerprint,
    train,
)

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
        timesteps=2000,
        n_envs=2,
        n_steps=128,
        batch_size=64,
        eval_freq=1000,
        seed=0,
        learning_rate=1e-3,
        prior_init=False,
        prior="bias",  # the network alone, from random init: learning, not a prior, must beat random
    )
    summary = train(cfg, [trace], [trace], tmp_path / "run")
    assert summary["timesteps"] >= 2000
    ck = load_checkpoint(tmp_path / "run" / "best")
    env = PlacementEnv([trace], CL, reward="jct", perf=PERF)
    trained = _episode_return(env, lambda o, m: ck.net.act(o, m))
    rng = np.random.default_rng(0)
    rand = np.mean([_episode_return(env, lambda o, m: int(rng.choice(np.flatnonzero(m)))) for _ in range(10)])
    assert trained > rand
    # the run left TensorBoard logs, an evaluation log and both checkpoints
    assert any((tmp_path / "run" / "tb").rglob("events.out.tfevents.*"))
    assert (tmp_path / "run" / "eval.csv").read_text().count("\n") >= 2
    assert load_checkpoint(tmp_path / "run" / "last").meta["training"]["timesteps"] >= 2000


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
    # the run's own command lines travel with it
    assert [c["start_timesteps"] for c in meta["training"]["commands"]] == [0]
    # provenance carried to the shipped files: the traces' content and the code's revision
    assert meta["training"]["traces_sha256"] == traces_fingerprint([trace])
    assert meta["training"]["val_traces_sha256"] == traces_fingerprint([trace])
    assert meta["training"]["source"] == source_revision()
    pol = make_rl_policy(f"rl-hybrid:{shipped[1]}", CL, PERF)
    assert pol.hybrid
    assert pol.codec.spec.aging_s == meta["training"]["config"]["aging_s"] == cfg.aging_s
    # shipped to run with another candidate-order aging: the same weights, the trained value kept in the config
    again = ship_checkpoint(tmp_path / "run" / "best", CL, dest=tmp_path / "ship2", aging_s=1234.0)
    meta2 = json.loads(again[0].read_text())
    assert meta2["obs_spec"]["aging_s"] == 1234.0 and meta2["training"]["config"]["aging_s"] == cfg.aging_s
    assert meta2["weights_sha256"] == json.loads(shipped[0].read_text())["weights_sha256"]
    assert make_rl_policy(f"rl-base:{again[0]}", CL, PERF).codec.spec.aging_s == 1234.0


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
    # what check_run expects of an --init checkpoint is what this algorithm's SB3 model saves
    assert _stored_tensor_shapes(ck.weights_path) == _model_tensor_shapes(cfg, ck.spec)
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


# ---------------------------------------------------------------------- refusals before any work
def _tiny_cfg(**kw) -> TrainConfig:
    base = dict(cluster="2x4", timesteps=64, n_envs=1, n_steps=64, batch_size=32, eval_freq=10_000)
    return TrainConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One finished tiny run (validation traces, so eval.csv exists) and its trace file; tests copy it."""
    from trainer.traces import write_trace

    d = tmp_path_factory.mktemp("tiny")
    trace = _trace(6, 6)
    write_trace(d / "t.csv", trace)
    train(_tiny_cfg(), [trace], [trace], d / "run")
    return d / "run", d / "t.csv", trace


def _copy_run(tiny_run, dest: Path) -> Path:
    import shutil

    shutil.copytree(tiny_run[0], dest)
    return dest


def _snapshot(run: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}


def _one_line_error(capsys, *needles: str) -> str:
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in err, err
    return err


@pytest.mark.parametrize(
    "option, value, needle",
    [
        ("--seed", "-1", "[0, 2**32 - 1]"),
        ("--seed", str(2**32), "[0, 2**32 - 1]"),
        ("--lr", "nan", "positive number"),
        ("--lr", "-1", "positive number"),
        ("--ent-coef", "nan", "number >= 0"),
        ("--prior-scale", "inf", "positive number"),
        ("--prior-scale", "0", "positive number"),
        ("--gamma", "5", "in [0, 1]"),
        ("--prior-theta", "nan", "in [0, 1]"),
        ("--aging", "0", "a number in [1, 1e+09]"),
        ("--aging", "inf", "a number in [1, 1e+09]"),
        ("--aging", "0.5", "a number in [1, 1e+09]"),
    ],
)
def test_cli_train_refuses_bad_numbers(tmp_path, capsys, option, value, needle):
    from rlsched.cli import main

    (tmp_path / "t.csv").write_text("job_id,submit_time,model,gpu_demand,total_samples\na,0,GNN,2,1000\n")
    with pytest.raises(SystemExit) as e:
        main(["train", "--traces", str(tmp_path / "t.csv"), "--cluster", "2x4", "--out", str(tmp_path / "o"),
              option, value])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}: " in err and needle in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "change, needle",
    [
        ({"learning_rate": math.nan}, "--lr must be a finite number > 0"),
        ({"learning_rate": -1.0}, "--lr must be a finite number > 0"),
        ({"ent_coef": math.nan}, "--ent-coef must be a finite number >= 0"),
        ({"gamma": 5.0}, "--gamma must be a discount in [0, 1]"),
        ({"prior_scale": math.inf}, "--prior-scale must be a finite number > 0"),
        ({"prior_scale": 0.0}, "--prior-scale must be a finite number > 0"),
        ({"prior_theta": 1.5}, "--prior-theta must be in [0, 1]"),
        ({"seed": -1}, "--seed must be an integer in [0, 2**32 - 1]"),
        ({"net_arch": (64, 0)}, "--net-arch must be one or more positive layer sizes"),
        ({"n_steps": 0}, "n_steps must be a positive integer"),
        ({"algo": "sac"}, "--algo must be one of"),
        ({"order": "random"}, "--order must be one of"),
        ({"aging_s": 0.0}, '--aging must be a number of seconds in [1, 1e+09] (what a checkpoint may hold)'),
        ({"aging_s": math.inf}, '--aging must be a number of seconds in [1, 1e+09] (what a checkpoint may hold)'),
        ({"aging_s": 10**400}, '--aging must be a number of seconds in [1, 1e+09] (what a checkpoint may hold)'),  # beyond float range: no OverflowError
        ({"aging_s": 0.5}, '--aging must be a number of seconds in [1, 1e+09] (what a checkpoint may hold)'),
        ({"algo": "ppo", "prior": "admission"}, "--prior admission needs --algo maskable-ppo"),
    ],
)
def test_check_config_names_the_bad_option(change, needle):
    from trainer.train import TrainConfigError, check_config

    with pytest.raises(TrainConfigError) as e:
        check_config(_tiny_cfg(**change))
    assert needle in str(e.value)
    assert check_config(_tiny_cfg()) == CL  # the defaults pass and give the parsed cluster


def test_refused_overwrite_keeps_the_previous_run(tmp_path, tiny_run, capsys):
    """--overwrite deletes the previous run only after the new one is checked, built and its weights loaded."""
    from rlsched.cli import main
    from trainer.train import TrainConfigError

    run = _copy_run(tiny_run, tmp_path / "run")
    before = _snapshot(run)
    assert {"best.json", "last.json", "eval.csv", "summary.json"} <= set(before)
    trace = tiny_run[2]
    base = ["train", "--traces", str(tiny_run[1]), "--cluster", "2x4", "--timesteps", "64", "--n-envs", "1",
            "--out", str(run), "--overwrite"]
    # a bad prior scale (argparse) and a mistyped --init: exit 2, and the run is still there
    with pytest.raises(SystemExit):
        main([*base, "--prior-scale", "0"])
    capsys.readouterr()
    assert _snapshot(run) == before
    assert main([*base, "--init", str(tmp_path / "nosuch")]) == 2
    _one_line_error(capsys, "nosuch.json", "not found")
    assert _snapshot(run) == before
    # an --init checkpoint of another network shape: refused up front, naming --net-arch
    assert main([*base, "--init", str(run / "last"), "--net-arch", "32"]) == 2
    _one_line_error(capsys, "hidden layers 64,64", "--net-arch is 32")
    assert _snapshot(run) == before
    # library callers: the same checks, the same guarantee
    with pytest.raises(TrainConfigError, match="--prior-scale"):
        train(_tiny_cfg(prior_scale=0.0), [trace], [trace], run, overwrite=True)
    with pytest.raises(CheckpointError, match="nosuch.json: checkpoint metadata not found"):
        train(_tiny_cfg(init=str(tmp_path / "nosuch")), [trace], [trace], run, overwrite=True)
    assert _snapshot(run) == before
    # --init from the run being overwritten works: its weights are loaded before its files go
    s = train(_tiny_cfg(init=str(run / "last")), [trace], [trace], run, overwrite=True)
    assert s["evals"][0]["timesteps"] == 0
    assert load_checkpoint(run / "last").meta["training"]["config"]["init"] == str(run / "last")


def _no_model(monkeypatch) -> None:
    """Make building the model (and the reference JCTs before it) fail: a check must come before them."""
    import trainer.train as tt

    def boom(*a, **k):
        raise AssertionError("the run was built before its --init checkpoint was checked")

    monkeypatch.setattr(tt, "_make_model", boom)
    monkeypatch.setattr(tt, "reference_jct", boom)


def test_init_from_a_shipped_checkpoint_is_refused_up_front(tmp_path, tiny_run, monkeypatch, capsys):
    """A shipped checkpoint keeps only the policy layers: --init names that in check_run, before the traces
    are read or the model is built (not in load_state_dict, after both)."""
    from rlsched.cli import main
    from trainer.train import check_run

    _no_model(monkeypatch)
    shipped = ship_checkpoint(tiny_run[0] / "best", CL, dest=tmp_path / "ship")[0]
    needle = "holds only the policy network, as a shipped checkpoint does"
    with pytest.raises(CheckpointError, match="lack mlp_extractor.value_net.0.weight and 5 more") as e:
        check_run(_tiny_cfg(init=str(shipped)), tmp_path / "o")
    assert needle in str(e.value)
    with pytest.raises(CheckpointError, match=needle):
        train(_tiny_cfg(init=str(shipped)), [tiny_run[2]], [tiny_run[2]], tmp_path / "o")
    rc = main(["train", "--traces", str(tiny_run[1]), "--cluster", "2x4", "--out", str(tmp_path / "o"),
               "--init", str(shipped)])
    assert rc == 2
    _one_line_error(capsys, f"--init {shipped}", needle)
    assert not (tmp_path / "o").exists()


def test_init_tensors_of_another_network_are_refused_up_front(tmp_path, tiny_run, monkeypatch):
    """Every tensor of the --init weights must be one of this run's network, of its shape."""
    from safetensors.numpy import load_file

    from policies.checkpoint import save_checkpoint
    from trainer.train import check_run

    _no_model(monkeypatch)
    ck = load_checkpoint(tiny_run[0] / "last")
    tensors = load_file(str(ck.weights_path))

    def resave(name: str, changed: dict) -> str:
        meta = ck.meta
        return str(save_checkpoint(
            tmp_path / name, {**tensors, **changed}, algo=meta["algo"], mode=meta["mode"], cluster=ck.cluster,
            spec=ck.spec, layers=meta["network"]["layers"], activation=meta["network"]["activation"],
            reward=meta["reward"], training=meta["training"], prior=ck.prior,
        ))

    cases = [
        (resave("wide", {"value_net.weight": np.zeros((1, 3), np.float32)}),
         "tensor value_net.weight has shape [1, 3], this run's network needs [1, 64]"),
        (resave("extra", {"extra.weight": np.zeros(2, np.float32)}), "the weights hold extra.weight"),
    ]
    for init, needle in cases:
        with pytest.raises(CheckpointError, match=re.escape(needle)):
            check_run(_tiny_cfg(init=init), tmp_path / "o")
    check_run(_tiny_cfg(init=str(ck.json_path)), tmp_path / "o")  # the run's own checkpoint fits


def test_out_that_is_a_file_is_refused(tmp_path, capsys):
    from rlsched.cli import main
    from trainer.traces import write_trace
    from trainer.train import TrainConfigError

    write_trace(tmp_path / "t.csv", _trace(5, 6))
    afile = tmp_path / "afile"
    afile.write_text("mine")
    for out, needle in ((afile, "exists and is not a directory"), (afile / "sub", f"{afile} is not a directory")):
        rc = main(["train", "--traces", str(tmp_path / "t.csv"), "--cluster", "2x4", "--timesteps", "64",
                   "--out", str(out)])
        assert rc == 2
        _one_line_error(capsys, needle)
    assert afile.read_text() == "mine"
    with pytest.raises(TrainConfigError, match="not a directory"):
        train(_tiny_cfg(), [_trace(5, 6)], [], afile)


@pytest.mark.parametrize(
    "change, needle, fix",
    [
        ({"net_arch": (32,)}, "--net-arch 64,64, not 32", "pass --net-arch 64,64"),
        ({"cluster": "4x8"}, "--cluster 2x4, not 4x8", "pass --cluster 2x4"),
        ({"reward": "jct"}, "--reward jct-rel, not jct", "pass --reward jct-rel"),
        ({"prior": "bias"}, "--prior admission, not bias", "pass --prior admission"),
        ({"prior_theta": 0.5}, "--prior-theta 0.8, not 0.5", "pass --prior-theta 0.8"),
        ({"prior_scale": 2.0}, "--prior-scale 1.0, not 2.0", "pass --prior-scale 1.0"),
        ({"algo": "ppo", "prior": "bias"}, "--algo maskable-ppo, not ppo", "pass --algo maskable-ppo"),
        ({"order": "area"}, "--order plan, not area", "pass --order plan"),
        ({"k": 4}, "k (candidates) 6, not 4", "use k=6"),
        ({"aging_s": 1800.0}, "--aging 300 s, not 1800 s", "pass --aging 300"),
        ({"seed": 1}, "--seed 0, not 1", "pass --seed 0"),
    ],
)
def test_resume_refuses_other_settings(tmp_path, tiny_run, change, needle, fix):
    run = _copy_run(tiny_run, tmp_path / "run")
    before = _snapshot(run)
    trace = tiny_run[2]
    with pytest.raises(CheckpointError) as e:
        train(_tiny_cfg(timesteps=128, **change), [trace], [trace], run, resume=True)
    assert needle in str(e.value) and "--resume continues a run with its own settings" in str(e.value)
    assert f"({fix}, or start a new run" in str(e.value) and "drop the option" not in str(e.value)
    assert _snapshot(run) == before


def test_resume_of_a_run_without_aging_names_the_value_to_pass(tmp_path, tiny_run):
    """A run whose spec has no aging_s was trained with 1800 s (LEGACY_AGING_S); resuming it with the
    default (300 s) is refused with the value to pass, not "drop the option"."""
    run = _copy_run(tiny_run, tmp_path / "run")
    meta = json.loads((run / "last.json").read_text())
    del meta["obs_spec"]["aging_s"]
    (run / "last.json").write_text(json.dumps(meta))
    trace = tiny_run[2]
    with pytest.raises(CheckpointError, match=r"--aging 1800 s, not 300 s; .*\(pass --aging 1800, or start a new run"):
        train(_tiny_cfg(timesteps=128), [trace], [trace], run, resume=True)
    train(_tiny_cfg(timesteps=128, aging_s=1800.0), [trace], [trace], run, resume=True)  # the named value resumes
    assert load_checkpoint(run / "last").spec.aging_s == 1800.0


def test_training_and_validation_use_the_runs_aging(tmp_path, monkeypatch):
    """--aging reaches the training environments, the validation encoder and the checkpoints."""
    import trainer.train as tt

    seen: dict[str, list[float]] = {"env": [], "eval": []}
    env_init, eval_net = tt.PlacementEnv.__init__, tt.evaluate_net

    def spy_env(self, *a, **kw):
        env_init(self, *a, **kw)
        seen["env"].append(self.spec_obs.aging_s)

    def spy_eval(*a, **kw):
        seen["eval"].append(kw["aging_s"])
        return eval_net(*a, **kw)

    monkeypatch.setattr(tt.PlacementEnv, "__init__", spy_env)
    monkeypatch.setattr(tt, "evaluate_net", spy_eval)
    trace = _trace(6, 6)
    train(_tiny_cfg(aging_s=1234.0), [trace], [trace], tmp_path / "run")
    assert seen["env"] and set(seen["env"]) == {1234.0}
    assert seen["eval"] and set(seen["eval"]) == {1234.0}
    for name in ("best", "last"):
        ck = load_checkpoint(tmp_path / "run" / name)
        assert ck.spec.aging_s == 1234.0 and ck.meta["training"]["config"]["aging_s"] == 1234.0


def test_cli_train_passes_aging(tmp_path, monkeypatch):
    import trainer.train as tt
    from rlsched.cli import main

    got = {}

    def fake_train(cfg, *a, **kw):
        got["aging_s"] = cfg.aging_s
        return {"timesteps": 0}

    monkeypatch.setattr(tt, "train", fake_train)
    (tmp_path / "t.csv").write_text("job_id,submit_time,model,gpu_demand,total_samples\na,0,GNN,2,1000\n")
    main(["train", "--traces", str(tmp_path / "t.csv"), "--cluster", "2x4", "--out", str(tmp_path / "o"), "--aging", "900"])
    assert got == {"aging_s": 900.0}


def test_resume_refuses_other_bandwidth_and_seed_w1(tmp_path, tiny_run):
    trace = tiny_run[2]
    run = _copy_run(tiny_run, tmp_path / "run")
    toml = tmp_path / "c.toml"
    toml.write_text("inter_bw_gbps = 10\n[[nodes]]\ngpus = 4\ncount = 2\n")
    with pytest.raises(CheckpointError, match="inter_bw_gbps 5.0, not 10.0"):
        train(_tiny_cfg(cluster=str(toml), timesteps=128), [trace], [trace], run, resume=True)
    # W1 is part of the run only for the seed reward
    seed_run = tmp_path / "seed"
    train(_tiny_cfg(reward="seed", w1=0.4, gamma=0.99), [trace], [], seed_run)
    with pytest.raises(CheckpointError, match="--w1 0.4, not 0.3"):
        train(_tiny_cfg(reward="seed", w1=0.3, gamma=0.99, timesteps=128), [trace], [], seed_run, resume=True)
    # what may change on a resume (learning rate, discount): accepted
    s = train(_tiny_cfg(reward="seed", w1=0.4, gamma=0.9, learning_rate=1e-4, timesteps=128), [trace], [], seed_run,
              resume=True)
    assert s["timesteps"] == 128


def test_cli_resume_with_other_net_arch_is_one_line(tmp_path, tiny_run, capsys):
    from rlsched.cli import main

    run = _copy_run(tiny_run, tmp_path / "run")
    before = _snapshot(run)
    rc = main(["train", "--traces", str(tiny_run[1]), "--cluster", "2x4", "--timesteps", "1100", "--n-envs", "1",
               "--net-arch", "32", "--out", str(run), "--resume"])
    assert rc == 2
    _one_line_error(capsys, "--net-arch 64,64, not 32")
    assert _snapshot(run) == before


def test_damaged_eval_log_is_refused_and_writes_are_atomic(tmp_path, tiny_run, monkeypatch, capsys):
    """eval.csv / summary.json are replaced atomically; a damaged eval.csv (e.g. half a row) stops --resume
    with one line instead of float('')."""
    import csv

    import trainer.train as tt
    from rlsched.cli import main

    trace = tiny_run[2]
    run = _copy_run(tiny_run, tmp_path / "run")
    before = _snapshot(run)
    # a crash while the evaluation log is written leaves the old log whole
    def boom(self, rows):
        raise RuntimeError("disk full")

    with monkeypatch.context() as m:
        m.setattr(csv.DictWriter, "writerows", boom)
        with pytest.raises(RuntimeError, match="disk full"):
            train(_tiny_cfg(timesteps=128), [trace], [trace], run, resume=True)
    assert (run / "eval.csv").read_bytes() == before["eval.csv"]
    assert not [p.name for p in run.iterdir() if p.name.startswith(".") and p.name != ".lock"]  # (the run's lock)
    # the log and the summary go through the temp-file + rename helper
    written: list[str] = []
    real = tt.write_atomic
    monkeypatch.setattr(tt, "write_atomic", lambda path, data: (written.append(Path(path).name), real(path, data)))
    s = train(_tiny_cfg(timesteps=128), [trace], [trace], run, resume=True)
    monkeypatch.undo()
    assert "eval.csv" in written and "summary.json" in written
    assert len(s["evals"]) == len(list(csv.DictReader((run / "eval.csv").open()))) >= 2
    # a half-written log: refused naming the file, nothing changed
    text = (run / "eval.csv").read_text()
    (run / "eval.csv").write_text(text[: text.rindex("\n", 0, len(text) - 1) + 5])
    damaged = _snapshot(run)
    with pytest.raises(CheckpointError, match="eval.csv: cannot read the run's evaluation log"):
        train(_tiny_cfg(timesteps=256), [trace], [trace], run, resume=True)
    rc = main(["train", "--traces", str(tiny_run[1]), "--val-traces", str(tiny_run[1]), "--cluster", "2x4",
               "--timesteps", "256", "--n-envs", "1", "--out", str(run), "--resume"])
    assert rc == 2
    _one_line_error(capsys, "eval.csv", "repair or delete it")
    assert _snapshot(run) == damaged


def test_timesteps_round_up_to_whole_rollouts(tmp_path, caplog):
    import logging

    from trainer.train import rollout_steps

    cfg = _tiny_cfg(algo="ppo", prior="bias", timesteps=100, n_steps=32, n_envs=2)
    assert rollout_steps(cfg) == 64
    ticks: list[tuple[int, int]] = []
    with caplog.at_level(logging.INFO, logger="trainer.train"):
        s = train(cfg, [_trace(7, 6)], [], tmp_path / "r", progress=lambda d, t: ticks.append((d, t)))
    assert s["timesteps"] == 128 and ticks[-1] == (128, 128)
    assert any("whole rollouts of 64 steps, so it stops at 128" in r.getMessage() for r in caplog.records)


def test_checkpoint_summary_shows_segment_commands_and_the_legacy_command(tiny_run):
    import copy

    from trainer.cli_rl import checkpoint_summary

    ck = load_checkpoint(tiny_run[0] / "last")
    cmds = checkpoint_summary(ck)["training"]["commands"]
    assert len(cmds) == 1 and cmds[0].startswith("rlsched train --algo maskable-ppo") and "--aging" in cmds[0]
    old = copy.copy(ck)
    old.meta = copy.deepcopy(ck.meta)
    del old.meta["training"]["commands"]
    assert checkpoint_summary(old)["training"]["commands"] is None
    old.meta["training"]["command"] = "rlsched train --seed 0"  # as the shipped checkpoints hold it
    assert checkpoint_summary(old)["training"]["commands"] == ["rlsched train --seed 0"]


def test_checkpoint_summary_marks_malformed_training_metadata(tmp_path, tiny_run, capsys):
    """`rlsched checkpoint` on free-form `training` metadata of unexpected types: shown as (malformed)."""
    import copy

    from rlsched.cli import main
    from trainer.cli_rl import MALFORMED, checkpoint_summary

    ck = load_checkpoint(tiny_run[0] / "last")
    good = checkpoint_summary(ck)["training"]
    assert good["timesteps"] == 64 and good["traces"] == [] and good["traces_sha256"] == traces_fingerprint(
        [tiny_run[2]]
    )
    # config / source a string, traces of ints, and more, on the loaded metadata
    bad = copy.copy(ck)
    bad.meta = copy.deepcopy(ck.meta)
    bad.meta["training"].update(config="x", source="abc", timesteps="many", val_rel_jct="low", commands=["rlsched"])
    info = checkpoint_summary(bad)["training"]
    for key in ("traces", "init", "source", "timesteps", "val_rel_jct", "commands"):
        assert info[key] == MALFORMED, key
    bad.meta["training"]["config"] = {"traces": [1, 2], "init": 7}
    bad.meta["training"]["source"] = {"commit": 5}
    info = checkpoint_summary(bad)["training"]
    assert info["traces"] == info["init"] == info["source"] == MALFORMED
    # on disk, fields that loading keeps as they are: the table and --json show them, exit 0
    meta = json.loads((tiny_run[0] / "last.json").read_text())
    meta["training"].update(commands=[{"command": 5}], traces_sha256=3, source={"commit": 5, "dirty": "yes"})
    meta["training"]["config"]["init"] = 7
    (tmp_path / "ck.json").write_text(json.dumps(meta))
    (tmp_path / meta["weights_file"]).write_bytes((tiny_run[0] / meta["weights_file"]).read_bytes())
    assert main(["checkpoint", str(tmp_path / "ck"), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["training"]
    assert shown["commands"] == shown["traces_sha256"] == shown["source"] == shown["init"] == MALFORMED
    assert main(["checkpoint", str(tmp_path / "ck")]) == 0
    captured = capsys.readouterr()
    assert captured.out.count(MALFORMED) == 4 and "64 steps" in captured.out and captured.err == ""


# ---------------------------------------------------------------------- resume: best, log, seeds, lock
def _eval_steps(run: Path) -> list[float]:
    import csv

    return [float(r["timesteps"]) for r in csv.DictReader((run / "eval.csv").open())]


def test_resume_without_val_traces_saves_best_as_last(tmp_path):
    """Without validation traces best = last at the end of every run, a resumed one too (it stayed the first
    segment's network, which --export-shipped then shipped)."""
    trace = _trace(6, 6)
    run = tmp_path / "run"
    train(_tiny_cfg(), [trace], [], run)
    s = train(_tiny_cfg(timesteps=128), [trace], [], run, resume=True)
    assert s["timesteps"] == 128
    assert (run / "best.safetensors").read_bytes() == (run / "last.safetensors").read_bytes()
    assert load_checkpoint(run / "best").meta["training"]["timesteps"] == 128


def test_interrupted_evaluation_leaves_no_score_without_its_network(tmp_path, monkeypatch):
    """An interrupt while a new best is saved: the log never holds a score whose network is gone, and the
    resumed run's best is best.json's own score (it was the log's minimum, that phantom included)."""
    import trainer.train as tt

    trace = _trace(6, 6)
    run = tmp_path / "run"
    calls = [0]
    phase = ["a"]

    def fake_eval(net, cluster, perf, traces, **kw):  # phase a: every evaluation better; phase b: all worse
        calls[0] += 1
        return [5000.0 - 100 * calls[0] if phase[0] == "a" else 9000.0] * len(traces)

    real_save, best_saves = tt._save, [0]

    def save(path, *a, **kw):
        if path.name == "best":
            best_saves[0] += 1
            if best_saves[0] == 3:  # the evaluation at step 128: Ctrl-C while its network is saved as best
                raise KeyboardInterrupt
        return real_save(path, *a, **kw)

    monkeypatch.setattr(tt, "evaluate_net", fake_eval)
    with monkeypatch.context() as m:
        m.setattr(tt, "_save", save)
        with pytest.raises(KeyboardInterrupt):
            train(_tiny_cfg(timesteps=192, eval_freq=64), [trace], [trace], run)
    best_json = load_checkpoint(run / "best").meta["training"]
    assert best_json["timesteps"] == 64
    assert max(_eval_steps(run)) <= load_checkpoint(run / "last").meta["training"]["timesteps"]
    phase[0] = "b"
    s = train(_tiny_cfg(timesteps=192, eval_freq=64), [trace], [trace], run, resume=True)
    steps = _eval_steps(run)
    assert steps == sorted(set(steps)) == [0.0, 64.0, 128.0, 192.0]  # one row per step
    assert [r["timesteps"] for r in s["evals"]] == steps
    best_meta = load_checkpoint(run / "best").meta["training"]
    assert best_meta["timesteps"] == 64 and best_meta["val_rel_jct"] == best_json["val_rel_jct"]
    assert s["best_val_rel_jct"] == best_meta["val_rel_jct"] == min(r["val_rel_jct"] for r in s["evals"])


def test_resume_drops_log_rows_past_last_and_continues_wall_clock(tmp_path, tiny_run):
    """Rows past last's steps (a segment whose checkpoint was never saved) and repeated steps are left out of
    the resumed log (rewritten); the best score comes from best.json, not from the log; wall_s goes on."""
    import csv

    run = _copy_run(tiny_run, tmp_path / "run")
    rows = list(csv.DictReader((run / "eval.csv").open()))
    assert [float(r["timesteps"]) for r in rows] == [0.0, 64.0]
    rows[-1]["wall_s"] = "1000000.0"
    phantom = {**rows[-1], "timesteps": "128.0", "val_rel_jct": "0.01", "wall_s": "1000001.0"}
    with (run / "eval.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows([rows[0], {**rows[1], "val_rel_jct": "0.02", "wall_s": "5.0"}, rows[1], phantom])
    trace = tiny_run[2]
    s = train(_tiny_cfg(timesteps=128), [trace], [trace], run, resume=True)
    assert _eval_steps(run) == [0.0, 64.0, 128.0]
    assert [r["timesteps"] for r in s["evals"]] == [0.0, 64.0, 128.0]
    assert 0.01 not in [r["val_rel_jct"] for r in s["evals"]] and s["evals"][1]["wall_s"] == 1e6
    assert s["evals"][2]["wall_s"] >= 1e6  # the clock of the log goes on from the resumed run's
    assert s["best_val_rel_jct"] == load_checkpoint(run / "best").meta["training"]["val_rel_jct"] > 0.02


def test_resumed_segment_is_seeded_from_seed_and_steps(tmp_path, monkeypatch):
    """A resumed segment draws from (seed, steps done), not from the seed alone (it replayed the first
    segment's episodes and exploration); the checkpoints and the summary record the segment's seed."""
    import stable_baselines3.common.base_class as bc

    import trainer.train as tt
    from trainer.train import segment_seed

    seeds: dict[str, list] = {"env": [], "model": []}
    env_reset, model_seed = tt.PlacementEnv.reset, bc.set_random_seed

    def spy_reset(self, *, seed=None, options=None):
        if seed is not None:
            seeds["env"].append(seed)
        return env_reset(self, seed=seed, options=options)

    monkeypatch.setattr(tt.PlacementEnv, "reset", spy_reset)
    monkeypatch.setattr(bc, "set_random_seed", lambda s, **kw: (seeds["model"].append(s), model_seed(s, **kw)))
    trace = _trace(6, 6)
    run = tmp_path / "run"
    first = train(_tiny_cfg(seed=7), [trace], [], run)
    assert first["segment"] == {"start_timesteps": 0, "seed": 7} and seeds["model"] == [7]
    fresh = {k: list(v) for k, v in seeds.items()}
    for v in seeds.values():
        v.clear()
    s = train(_tiny_cfg(seed=7, timesteps=128), [trace], [], run, resume=True)
    seg = segment_seed(7, 64)
    assert seg != 7 and 0 <= seg < 2**32 and segment_seed(7, 0) == 7
    assert seeds["model"] == [seg] and not set(seeds["env"]) & set(fresh["env"])
    assert s["segment"] == {"start_timesteps": 64, "seed": seg}
    assert load_checkpoint(run / "last").meta["training"]["segment"] == {"start_timesteps": 64, "seed": seg}


def test_resumed_dqn_warms_up_again(tmp_path, monkeypatch):
    """A resumed DQN starts with an empty replay buffer: it learns only after a new warm-up."""
    import trainer.train as tt
    from trainer.train import DQN_LEARNING_STARTS

    models = []
    make = tt._make_model
    monkeypatch.setattr(tt, "_make_model", lambda *a, **kw: models.append(make(*a, **kw)) or models[-1])
    trace = _trace(6, 6)
    run = tmp_path / "run"
    cfg = _tiny_cfg(algo="dqn", timesteps=DQN_LEARNING_STARTS + 4, batch_size=16)
    train(cfg, [trace], [], run)
    assert models[-1].learning_starts == DQN_LEARNING_STARTS and models[-1]._n_updates > 0
    train(dataclasses.replace(cfg, timesteps=DQN_LEARNING_STARTS + 104), [trace], [], run, resume=True)
    assert models[-1].learning_starts == 2 * DQN_LEARNING_STARTS + 4
    assert models[-1]._n_updates == 0  # 100 steps into the new warm-up: no gradient step on a near-empty buffer


def test_resume_refuses_other_validation_traces(tmp_path, tiny_run, capsys):
    """The best score was measured on the run's validation set: another one (or none) is refused, naming
    both fingerprints; the same content under another name resumes."""
    from rlsched.cli import main
    from trainer.traces import write_trace

    run = _copy_run(tiny_run, tmp_path / "run")
    before = _snapshot(run)
    trace, other = tiny_run[2], _trace(9, 6)
    theirs, ours = traces_fingerprint([trace]), traces_fingerprint([other])
    with pytest.raises(CheckpointError) as e:
        train(_tiny_cfg(timesteps=128), [trace], [other], run, resume=True)
    assert theirs in str(e.value) and ours in str(e.value) and "pass the run's --val-traces" in str(e.value)
    with pytest.raises(CheckpointError, match=f"validation traces .*sha256 {theirs}.*, not no validation traces"):
        train(_tiny_cfg(timesteps=128), [trace], [], run, resume=True)
    write_trace(tmp_path / "other.csv", other)
    rc = main(["train", "--traces", str(tiny_run[1]), "--val-traces", str(tmp_path / "other.csv"), "--cluster", "2x4",
               "--timesteps", "128", "--n-envs", "1", "--out", str(run), "--resume"])
    assert rc == 2
    _one_line_error(capsys, theirs, ours, str(tmp_path / "other.csv"))
    assert _snapshot(run) == before
    write_trace(tmp_path / "same.csv", trace)
    assert train(_tiny_cfg(timesteps=128, val_traces=[str(tmp_path / "same.csv")]), [trace], [trace], run,
                 resume=True)["timesteps"] == 128


def test_tensorboard_evaluations_at_their_steps(tmp_path):
    """Every evaluation (step 0, periodic, final; a resumed run's too) is in TensorBoard at its own step."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trace = _trace(6, 6)
    run = tmp_path / "run"
    train(_tiny_cfg(timesteps=192, eval_freq=100), [trace], [trace], run)
    s = train(_tiny_cfg(timesteps=256, eval_freq=100), [trace], [trace], run, resume=True)
    logs = [d for d in (run / "tb").iterdir() if d.is_dir()]
    assert len(logs) == 1  # the resumed run logs on in the run's directory
    ea = EventAccumulator(str(logs[0]))
    ea.Reload()
    want = [0, 100, 192, 200, 256]  # 200: the resumed run stays on the --eval-freq grid
    assert [int(r["timesteps"]) for r in s["evals"]] == want
    rel = ea.Scalars("eval/val_rel_jct")
    assert [e.step for e in rel] == want
    assert [e.value for e in rel] == pytest.approx([r["val_rel_jct"] for r in s["evals"]])
    assert [e.step for e in ea.Scalars("eval/val_avg_jct_h")] == want


def test_run_stopped_after_its_first_evaluation_resumes(tmp_path):
    """Stopped before its first periodic evaluation, a run has last (saved with the step-0 evaluation), so
    --resume continues it (with best.* and eval.csv only it would be refused both as a new run and as a
    resume)."""
    trace = _trace(6, 6)
    run = tmp_path / "run"

    def stop(done, total):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(_tiny_cfg(timesteps=256), [trace], [trace], run, progress=stop)
    assert load_checkpoint(run / "last").meta["training"]["timesteps"] == 0 and _eval_steps(run) == [0.0]
    with pytest.raises(CheckpointError, match="already holds a training run"):
        train(_tiny_cfg(timesteps=256), [trace], [trace], run)
    s = train(_tiny_cfg(timesteps=128), [trace], [trace], run, resume=True)
    assert s["timesteps"] == 128 and [r["timesteps"] for r in s["evals"]] == [0.0, 128.0]


def test_resume_names_the_runs_value_and_refuses_init(tmp_path, tiny_run, capsys):
    """A run trained with a non-default setting, resumed with another value given: the message says what to
    pass (not "drop the option"). --init with --resume is refused (it was ignored, yet recorded)."""
    from rlsched.cli import main
    from trainer.train import TrainConfigError, check_run

    trace = tiny_run[2]
    run = tmp_path / "run"
    train(_tiny_cfg(order="area"), [trace], [], run)
    base = ["train", "--traces", str(tiny_run[1]), "--cluster", "2x4", "--timesteps", "128", "--n-envs", "1",
            "--out", str(run), "--resume"]
    before = _snapshot(run)
    assert main([*base, "--order", "plan"]) == 2
    err = _one_line_error(capsys, "--order area, not plan", "(pass --order area, or start a new run")
    assert "drop the option" not in err
    with pytest.raises(TrainConfigError, match="--init .* and --resume .*: give one of them"):
        check_run(_tiny_cfg(order="area", init=str(tiny_run[0] / "last")), run, resume=True)
    assert main([*base, "--order", "area", "--init", str(tiny_run[0] / "last")]) == 2
    _one_line_error(capsys, "--init", "--resume", "give one of them")
    assert _snapshot(run) == before


def test_resume_takes_the_runs_own_options(tmp_path, caplog):
    """`rlsched train --out RUN --resume` alone continues the run with its own traces, cluster, reward,
    hyper-parameters and seed: options not given are not replaced by the defaults (gamma 0.99 by 1.0, the
    learning rate by 3e-4), and no run-defining option has to be repeated."""
    import logging

    from rlsched.cli import main
    from trainer.traces import write_trace

    write_trace(tmp_path / "t.csv", _trace(6, 6))
    run = tmp_path / "run"
    new = ["train", "--traces", str(tmp_path / "t.csv"), "--cluster", "2x4", "--n-envs", "1", "--order", "area",
           "--aging", "1800", "--reward", "seed", "--w1", "0.3", "--gamma", "0.99", "--lr", "1e-4", "--ent-coef", "0",
           "--seed", "5", "--prior", "bias", "--algo", "ppo", "--timesteps", "512", "--eval-freq", "512",
           "--no-prior-init", "--out", str(run)]
    assert main(new) == 0
    first = load_checkpoint(run / "last").meta["training"]["config"]
    with caplog.at_level(logging.INFO, logger="trainer"):
        assert main(["train", "--out", str(run), "--resume", "--timesteps", "1024"]) == 0
    cfg = load_checkpoint(run / "last").meta["training"]
    assert cfg["timesteps"] == 1024
    assert {k: v for k, v in cfg["config"].items() if k != "timesteps"} == {
        k: v for k, v in first.items() if k != "timesteps"}
    assert any("taken from the run" in r.getMessage() and "--gamma" in r.getMessage() for r in caplog.records)
    capsys_free = main(["train", "--out", str(run), "--resume", "--lr", "5e-5", "--timesteps", "1536"])
    assert capsys_free == 0 and load_checkpoint(run / "last").meta["training"]["config"]["learning_rate"] == 5e-5


def test_relative_trace_dirs_are_recorded_absolute_for_resume(tmp_path, monkeypatch):
    """A run started with relative --traces / --val-traces / --cluster FILE resumes from another working
    directory: the run records them absolute (not as typed, relative to the first cwd)."""
    from rlsched.cli import main
    from trainer.traces import write_trace

    (tmp_path / "proj" / "tr").mkdir(parents=True)
    write_trace(tmp_path / "proj" / "tr" / "t.csv", _trace(6, 6))
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "proj")
    (tmp_path / "proj" / "c.yaml").write_text("nodes:\n  - {gpus: 4, count: 2}\n")
    base = ["--cluster", "c.yaml", "--n-envs", "1", "--algo", "ppo", "--eval-freq", "512", "--no-prior-init"]
    assert main(["train", "--traces", "tr", "--val-traces", "tr", *base, "--timesteps", "512", "--out", "run"]) == 0
    cfg = load_checkpoint(tmp_path / "proj" / "run" / "last").meta["training"]["config"]
    assert cfg["traces"] == cfg["val_traces"] == [str(tmp_path / "proj" / "tr")]
    assert cfg["cluster"] == str(tmp_path / "proj" / "c.yaml")
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert main(["train", "--out", str(tmp_path / "proj" / "run"), "--resume", "--timesteps", "1024"]) == 0
    assert load_checkpoint(tmp_path / "proj" / "run" / "last").meta["training"]["timesteps"] == 1024


def test_recorded_commands_rerun_the_run_exactly(tmp_path, monkeypatch):
    """training.commands holds each segment's command with every option written out (defaults too, so
    a later change of a default cannot change its meaning); run again, it gives the same weights.
    It is recorded for every run, however it was started, not only for --export-shipped."""
    import shlex

    from safetensors.numpy import load_file

    from rlsched.cli import main
    from trainer.traces import write_trace

    write_trace(tmp_path / "t.csv", _trace(6, 6))
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    assert main(["train", "--traces", "t.csv", "--cluster", "2x4", "--n-envs", "1", "--reward", "seed",
                 "--w1", "0.3", "--timesteps", "512", "--eval-freq", "512", "--out", "run"]) == 0
    assert main(["train", "--out", "run", "--resume", "--timesteps", "1024"]) == 0
    cmds = load_checkpoint(run / "last").meta["training"]["commands"]
    assert [c["start_timesteps"] for c in cmds] == [0, 512]
    first, second = (shlex.split(c["command"]) for c in cmds)
    assert first[:2] == ["rlsched", "train"] and "--resume" not in first and second[-1] == "--resume"
    for opt, val in (("--aging", "300.0"), ("--w1", "0.3"), ("--prior", "admission"), ("--timesteps", "512"),
                     ("--traces", str(tmp_path / "t.csv")), ("--out", str(run))):
        assert first[first.index(opt) + 1] == val
    # the same two commands into another directory, from another cwd: the same network
    again = tmp_path / "again"
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    for words in (first, second):
        words[words.index("--out") + 1] = str(again)
        assert main(words[1:]) == 0
    a, b = load_file(str(run / "last.safetensors")), load_file(str(again / "last.safetensors"))
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_w1_without_the_seed_reward_is_refused(tmp_path, capsys):
    from rlsched.cli import main
    from trainer.traces import write_trace

    write_trace(tmp_path / "t.csv", _trace(6, 6))
    words = ["train", "--traces", str(tmp_path / "t.csv"), "--reward", "jct-rel", "--w1", "0.3"]
    assert main([*words, "--out", str(tmp_path / "o")]) == 2
    _one_line_error(capsys, "--w1 weighs the seed reward only", "jct-rel")
    assert not (tmp_path / "o").exists()
    assert main(["train", "--out", str(tmp_path / "o")]) == 2
    _one_line_error(capsys, "--traces is required")


def test_w1_alone_selects_the_seed_reward(tmp_path):
    """The issue's command line (``--w1 0.4`` and no ``--reward``) trains on the seed reward; a resumed
    run keeps its own reward, so there ``--w1`` with a non-seed run is still refused (``check_run``)."""
    from rlsched.cli import build_parser
    from trainer.cli_rl import _resolve_options

    def resolve(*words: str) -> dict:
        args = build_parser().parse_args(["train", "--traces", str(tmp_path), "--out", str(tmp_path / "o"), *words])
        return _resolve_options(args)[0]

    assert resolve("--w1", "0.4")["reward"] == "seed" and resolve("--w1", "0.4")["w1"] == 0.4
    assert resolve()["reward"] == "jct-rel"
    assert resolve("--reward", "seed")["reward"] == "seed"


def test_a_second_run_into_the_same_out_is_refused(tmp_path):
    """A run holds OUT/.lock: another one into the same --out is refused before it writes anything."""
    import fcntl
    import os

    from trainer.train import TrainConfigError

    trace = _trace(6, 6)
    run = tmp_path / "run"
    train(_tiny_cfg(), [trace], [trace], run)
    before = _snapshot(run)
    fd = os.open(run / ".lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as the running training holds it
        with pytest.raises(TrainConfigError, match="is in use by another training run"):
            train(_tiny_cfg(timesteps=128), [trace], [trace], run, resume=True)
        with pytest.raises(TrainConfigError, match="is in use by another training run"):
            train(_tiny_cfg(), [trace], [trace], run, overwrite=True)
        assert _snapshot(run) == before
    finally:
        os.close(fd)
    assert train(_tiny_cfg(timesteps=128), [trace], [trace], run, resume=True)["timesteps"] == 128


def test_failed_run_leaves_no_out_directory(tmp_path, monkeypatch):
    """The lock creates --out; a run that fails before writing anything removes it again."""
    import trainer.train as tt

    def boom(*a, **k):
        raise RuntimeError("no references")

    monkeypatch.setattr(tt, "reference_jct", boom)
    with pytest.raises(RuntimeError, match="no references"):
        train(_tiny_cfg(), [_trace(6, 6)], [], tmp_path / "a" / "run")
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("algo, kw", [
    ("maskable-ppo", {"timesteps": 1024, "eval_freq": 512}),
    ("a2c", {"timesteps": 256, "eval_freq": 128}),
    ("dqn", {"timesteps": 1100, "eval_freq": 1050}),
])
def test_diverged_training_stops_with_one_line_and_keeps_last_usable(tmp_path, capsys, algo, kw):
    """--lr 1e37 drives the weights to NaN (ppo, dqn) or to finite values whose logits overflow (a2c). The run
    stops with exit 1 and one line naming the step; nothing unusable is saved: last and best still load
    (the step-0 network). Before, a NaN DQN was scored as "the lowest valid action", saved as best (which
    then did not load) and the run exited 0; ppo/a2c died with a torch traceback."""
    from rlsched.cli import main
    from trainer.traces import write_trace

    trace = _trace(6, 6)
    write_trace(tmp_path / "t.csv", trace)
    run = tmp_path / "run"
    args = ["train", "--algo", algo, "--traces", str(tmp_path / "t.csv"), "--val-traces", str(tmp_path / "t.csv"),
            "--cluster", "2x4", "--n-envs", "1", "--lr", "1e37", "--no-prior-init", "--prior", "bias", "--out", str(run)]
    args += ["--timesteps", str(kw["timesteps"]), "--eval-freq", str(kw["eval_freq"])]
    assert main(args) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("rlsched train: error: training diverged by step ")
    assert "Lower --lr" in err and "Traceback" not in err
    diverged_at = int(re.search(r"diverged by step (\d+)", err).group(1))
    for name in ("last", "best"):  # saved before the divergence, and usable
        ck = load_checkpoint(run / name)
        assert ck.meta["training"]["timesteps"] <= diverged_at


def test_init_from_a_network_trained_with_another_prior_is_refused(tmp_path, tiny_run):
    """A network trained to stand alone (--prior bias) would start a prior run as network + prior, a policy
    it never was (and the reverse); --resume refuses this, and now --init too, naming the value to pass."""
    src = tmp_path / "bias"
    train(_tiny_cfg(prior="bias"), [tiny_run[2]], [], src)
    with pytest.raises(CheckpointError, match=r"trained with --prior bias, this run uses --prior admission; pass --prior bias"):
        train(_tiny_cfg(init=str(src / "last")), [tiny_run[2]], [], tmp_path / "new")
    assert not (tmp_path / "new").exists()
    train(_tiny_cfg(init=str(src / "last"), prior="bias"), [tiny_run[2]], [], tmp_path / "ok")


def test_resume_with_nothing_to_train_keeps_last(tmp_path, tiny_run):
    """--timesteps not above the steps done: nothing trains, and last (its weights and provenance) is kept."""
    run = _copy_run(tiny_run, tmp_path / "run")
    before = (run / "last.json").read_bytes(), (run / "last.safetensors").read_bytes()
    train(_tiny_cfg(timesteps=64, learning_rate=1e-5), [tiny_run[2]], [tiny_run[2]], run, resume=True)
    assert ((run / "last.json").read_bytes(), (run / "last.safetensors").read_bytes()) == before


def test_resumed_run_evaluates_on_the_eval_freq_grid(tmp_path):
    """A run resumed at 64 steps with --eval-freq 96 evaluates at 96 and 192, as an uninterrupted run would,
    not at 64 + 96 = 160."""
    trace = _trace(6, 6)
    run = tmp_path / "run"
    train(_tiny_cfg(eval_freq=96), [trace], [trace], run)
    assert _eval_steps(run) == [0.0, 64.0]
    train(_tiny_cfg(eval_freq=96, timesteps=256), [trace], [trace], run, resume=True)
    assert _eval_steps(run) == [0.0, 64.0, 96.0, 192.0, 256.0]


def test_progress_reports_episodes_and_their_reward(tmp_path):
    """train's ``episodes`` callback counts finished episodes and gives each one's return (Monitor's raw sum)."""
    eps: list[tuple[int, float]] = []
    ticks: list[tuple[int, int]] = []
    train(_tiny_cfg(timesteps=256), [_trace(2, 4)], [], tmp_path / "run",
          progress=lambda d, t: ticks.append((d, t)), episodes=lambda n, r: eps.append((n, r)))
    assert len(eps) >= 2 and [n for n, _ in eps] == list(range(1, len(eps) + 1))
    assert all(np.isfinite(r) for _, r in eps)
    assert ticks[-1][0] == ticks[-1][1]


def test_train_progress_display(caplog):
    """The CLI's display: on a terminal a bar with steps, episodes, last reward and the time left; in a log,
    an INFO line per 1/20 of the steps with the same fields (never silent between evaluations)."""
    import io
    import logging

    from rich.console import Console

    from trainer.cli_rl import PROGRESS_LINES, train_progress

    buf = io.StringIO()
    with caplog.at_level(logging.INFO, logger="trainer"):
        with train_progress(Console(file=buf, width=200)) as (update, episode):
            update(0, 1000)
            for done in range(64, 1001, 64):
                episode(done // 64, -1.5 * done)
                update(done, 1000)
            update(1000, 1000)
    assert buf.getvalue() == ""
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("train: ")]
    assert PROGRESS_LINES // 2 <= len(lines) <= PROGRESS_LINES + 1
    assert lines[-1].startswith("train: 1,000/1,000 steps (100%), 15 episodes, last reward -1440") and "done" in lines[-1]
    assert "min left" in lines[0] and "episodes" in lines[0]
    buf = io.StringIO()
    with train_progress(Console(file=buf, width=200, force_terminal=True)) as (update, episode):
        episode(3, 12.5)
        update(500, 1000)
    text = buf.getvalue()  # the bar's last frame, drawn when the block ends
    assert "500/1000" in text and "3 episodes, last reward 12.5" in text and "left" in text
