"""trainer.train_state: a resumed run gets back its optimiser moments and reward statistics (pickle-free)."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from policies.checkpoint import CheckpointError
from policies.cluster import ClusterSpec
from policies.perf import ContentionModel
from trainer.generate import GeneratorConfig, generate_jobs
from trainer.train import TrainConfig, train
from trainer.train_state import STATE_FORMAT, STATE_NAME, read_train_state

CL = ClusterSpec.parse("2x4")
TRACE = generate_jobs(CL, GeneratorConfig(num_jobs=6, seed=6, max_gpus=8, duration_s=1800.0), ContentionModel(CL))


def _cfg(**kw) -> TrainConfig:
    base = dict(cluster="2x4", timesteps=64, n_envs=1, n_steps=64, batch_size=32, eval_freq=10_000)
    return TrainConfig(**{**base, **kw})


@pytest.fixture
def models(monkeypatch):
    """The SB3 models train() builds, in order."""
    import trainer.train as tt

    made: list = []
    make = tt._make_model
    monkeypatch.setattr(tt, "_make_model", lambda *a, **kw: made.append(make(*a, **kw)) or made[-1])
    return made


def _optim_arrays(model) -> dict[str, np.ndarray]:
    out = {}
    for idx, st in model.policy.optimizer.state_dict()["state"].items():
        for name, v in st.items():
            out[f"{idx}.{name}"] = np.asarray(v.detach().numpy() if hasattr(v, "detach") else v)
    return out


@pytest.mark.parametrize("algo, cfg", [("maskable-ppo", {}), ("a2c", {}), ("dqn", {"timesteps": 1100, "batch_size": 16})])
def test_resume_restores_optimiser_and_reward_statistics(tmp_path, models, algo, cfg, caplog):
    """The resumed model starts with the optimiser state (Adam / RMSprop moments and step counts) and the
    VecNormalize return statistics the run had when it saved ``last``, bit for bit."""
    run = tmp_path / "run"
    c = _cfg(algo=algo, **cfg)
    train(c, [TRACE], [], run)
    first = models[-1]
    saved = _optim_arrays(first)
    assert saved, "the optimiser took steps, so it has state to keep"
    rms = first.get_env().ret_rms
    with caplog.at_level(logging.INFO, logger="trainer.train"):
        train(c, [TRACE], [], run, resume=True)  # nothing left to train: the model as restored
    resumed = models[-1]
    assert resumed is not first
    got = _optim_arrays(resumed)
    assert got.keys() == saved.keys()
    for k in saved:
        assert np.array_equal(got[k], saved[k]), k
    r2 = resumed.get_env().ret_rms
    assert (float(r2.mean), float(r2.var), r2.count) == (float(rms.mean), float(rms.var), rms.count)
    assert rms.count > 0
    assert any("restored the optimiser state" in r.getMessage() for r in caplog.records)


def test_resume_goes_on_training_with_the_restored_state(tmp_path, models):
    """A resumed segment trains from the restored moments: its optimiser's step count goes on from the saved one."""
    run = tmp_path / "run"
    train(_cfg(), [TRACE], [], run)
    step0 = {k: float(v) for k, v in _optim_arrays(models[-1]).items() if k.endswith(".step")}
    train(_cfg(timesteps=128), [TRACE], [], run, resume=True)
    step1 = {k: float(v) for k, v in _optim_arrays(models[-1]).items() if k.endswith(".step")}
    assert step0 and step1.keys() == step0.keys() and all(step1[k] == 2 * step0[k] for k in step0)
    meta, _ = read_train_state(run / STATE_NAME)
    assert meta["timesteps"] == "128" and meta["format"] == STATE_FORMAT
    assert meta["weights_sha256"] == json.loads((run / "last.json").read_text())["weights_sha256"]


def test_state_of_another_save_is_not_used(tmp_path, models, caplog):
    """A state file that belongs to another save of ``last`` (a crash between the two writes) is left
    unused, with a log line; the run resumes with fresh moments, as without a state file."""
    run = tmp_path / "run"
    train(_cfg(), [TRACE], [], run)
    tensors = load_file(str(run / STATE_NAME))
    meta, _ = read_train_state(run / STATE_NAME)
    save_file(tensors, str(run / STATE_NAME), metadata={**meta, "timesteps": "0"})
    with caplog.at_level(logging.INFO, logger="trainer.train"):
        train(_cfg(), [TRACE], [], run, resume=True)
    assert _optim_arrays(models[-1]) == {}
    assert any("belongs to another save of last" in r.getMessage() for r in caplog.records)


def _damage(path: Path, how: str) -> None:
    tensors = load_file(str(path))
    meta, _ = read_train_state(path)
    if how == "garbage":
        path.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{not json")
    elif how == "truncated":
        path.write_bytes(path.read_bytes()[:-7])
    elif how == "nan":
        k = next(k for k in tensors if k.endswith("exp_avg"))
        tensors[k] = tensors[k].copy()
        tensors[k].flat[0] = np.nan
        save_file(tensors, str(path), metadata=meta)
    elif how == "shape":
        k = next(k for k in tensors if k.endswith("exp_avg"))
        tensors[k] = np.zeros(tensors[k].shape + (2,), dtype=tensors[k].dtype)
        save_file(tensors, str(path), metadata=meta)
    elif how == "scalar":  # a second moment as a scalar: fits no parameter (only step counts are scalars)
        k = next(k for k in tensors if k.endswith("exp_avg"))
        tensors[k] = np.asarray(0.5, dtype=tensors[k].dtype)
        save_file(tensors, str(path), metadata=meta)
    elif how == "negative":
        k = next(k for k in tensors if k.endswith("exp_avg_sq"))
        tensors[k] = -np.ones_like(tensors[k])
        save_file(tensors, str(path), metadata=meta)
    elif how == "format":
        save_file(tensors, str(path), metadata={**meta, "format": "other/9"})
    elif how == "variance":
        tensors["vecnorm.ret_var"] = np.asarray(-1.0)
        save_file(tensors, str(path), metadata=meta)
    elif how == "name":
        tensors["optim.x.exp_avg"] = np.zeros(1, dtype=np.float32)
        save_file(tensors, str(path), metadata=meta)


@pytest.mark.parametrize("how, needle", [
    ("garbage", "not a readable training-state file"), ("truncated", "not a readable training-state file"),
    ("nan", "is not finite"), ("shape", "has shape"), ("scalar", r"has shape \(\), expected \(\d+"),
    ("negative", "holds negative values"), ("format", "expected 'rlsched-train-state/1'"),
    ("variance", "ret_var must be > 0"), ("name", "is not named optim.<parameter index>.<name>"),
])
def test_damaged_state_is_refused_before_anything_is_written(tmp_path, how, needle):
    run = tmp_path / "run"
    train(_cfg(), [TRACE], [], run)
    _damage(run / STATE_NAME, how)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    with pytest.raises(CheckpointError, match=needle) as ei:
        train(dataclasses.replace(_cfg(), timesteps=128), [TRACE], [], run, resume=True)
    assert str(run / STATE_NAME) in str(ei.value)
    if how not in ("shape", "scalar"):  # a well-formed file for another network: tensor and shapes are named
        assert "delete it" in str(ei.value)
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before


def test_overwrite_removes_the_state(tmp_path):
    run = tmp_path / "run"
    train(_cfg(), [TRACE], [], run)
    assert (run / STATE_NAME).is_file()
    (run / STATE_NAME).write_bytes(b"junk")  # would be refused by --resume; --overwrite replaces the run
    train(_cfg(), [TRACE], [], run, overwrite=True)
    read_train_state(run / STATE_NAME)
