"""The reward-weight branches of the size-free policy: the seed reward of ``SizeFreeEnv`` (``w1``), the
training config's ``reward`` section and ``rlsched train-sizefree --w1``, and evaluate's ``--branches``
with size-free checkpoints."""

from __future__ import annotations

import json

import numpy as np
import pytest

from policies.cluster import ClusterSpec
from policies.codecs.sizefree import SizeFreeSpec
from policies.job import JobSpec
from policies.sizefree import save_sizefree
from test_sizefree import _tensors  # random size-free weights

SPEC = SizeFreeSpec(jobs=4)
C48 = ClusterSpec.parse("4x8")


def _jobs(n: int, seed: int, max_g: int) -> list[JobSpec]:
    from trainer.generate import GeneratorConfig, generate_jobs

    return generate_jobs(C48, GeneratorConfig(num_jobs=n, seed=seed, max_gpus=max_g, duration_s=1800.0,
                                              demand="uniform", arrival="poisson", load=0.9))


def _episode(env) -> float:
    env.reset(seed=0, options={"trace": 0})
    total, done = 0.0, False
    while not done:
        _obs, r, term, trunc, _ = env.step(env.expert_action("greedy"))
        total += r
        done = term or trunc
    return total


def _first_decision_time(env) -> float:
    env.reset(seed=0, options={"trace": 0})
    return env.sim.time


def test_seed_reward_w1_0_is_the_allocated_gpu_hours_over_capacity():
    """W1 = 0: the return is the integral of the allocated fraction of GPUs (hours) from the first decision on;
    rl-sf never preempts, so that is sum(GPUs x run time) / capacity."""
    pytest.importorskip("gymnasium")
    from trainer.sizefree.env import SizeFreeEnv

    env = SizeFreeEnv([_jobs(12, 3, 16)], C48, SPEC, w1=0.0)
    t0 = _first_decision_time(env)
    total = _episode(env)
    busy = sum(j.spec.gpu_demand * (j.finish - max(j.first_start, t0)) for j in env.sim.jobs)
    assert total == pytest.approx(busy / 3600.0 / 32.0, rel=1e-9)
    assert total > 0


def test_seed_reward_w1_1_without_contention_is_minus_the_hours():
    """W1 = 1 with single-node jobs placed without splitting (CS 1 throughout): minus the hours from the first
    decision to the last completion."""
    pytest.importorskip("gymnasium")
    from trainer.sizefree.env import SizeFreeEnv

    env = SizeFreeEnv([_jobs(10, 5, 8)], C48, SPEC, w1=1.0)
    t0 = _first_decision_time(env)
    total = _episode(env)
    assert all(j.cs == pytest.approx(1.0) for j in env.sim.jobs if hasattr(j, "cs"))
    end = max(j.finish for j in env.sim.jobs)
    assert total == pytest.approx(-(end - t0) / 3600.0, rel=1e-9)


def test_default_reward_is_unchanged_and_w1_is_checked():
    pytest.importorskip("gymnasium")
    from trainer.sizefree.env import SizeFreeEnv

    env = SizeFreeEnv([_jobs(8, 7, 16)], C48, SPEC)
    assert env.w1 is None
    total = _episode(env)
    fin = np.array([j.finish - j.spec.submit_time for j in env.sim.jobs])
    assert total == pytest.approx(-fin.mean() / 3600, rel=1e-6)  # minus the average JCT in hours
    with pytest.raises(ValueError, match="w1"):
        SizeFreeEnv([_jobs(4, 7, 8)], C48, SPEC, w1=1.5)


def test_config_reward_section_and_cli_w1(capsys):
    from rlsched.cli import main
    from trainer.sizefree.cli import _command
    from trainer.sizefree.train import SizeFreeTrainConfig

    assert SizeFreeTrainConfig().reward() == {"kind": "jct"}
    assert SizeFreeTrainConfig(w1=0.3).reward() == {"kind": "seed", "w1": 0.3, "w2": 0.7}
    with pytest.raises(SystemExit) as exc:  # argparse's own refusal
        main(["train-sizefree", "--out", "/nonexistent/x", "--w1", "1.5"])
    assert exc.value.code == 2 and "--w1" in capsys.readouterr().err
    import argparse

    base = dict(out="o", clusters="4x8", max_gpus=32, demands="uniform", jobs_per_set=48, sets=4, dagger=1, bc_epochs=10,
                expert="greedy", teacher="planner", compare="none", init=None, ppo_timesteps=10, ppo_lr=3e-4,
                ppo_n_steps=512, ent_coef=0.01, seed=0, subproc=False)
    assert "--w1" not in _command(argparse.Namespace(**base, w1=None))
    assert "--w1 0.6" in _command(argparse.Namespace(**base, w1=0.6))


def test_sizefree_checkpoint_records_the_reward(tmp_path):
    from policies.sizefree import load_sizefree

    p = save_sizefree(tmp_path / "b", _tensors(), SPEC, {}, reward={"kind": "seed", "w1": 0.5, "w2": 0.5})
    _net, meta, _ = load_sizefree(p)
    assert meta["reward"] == {"kind": "seed", "w1": 0.5, "w2": 0.5}
    p = save_sizefree(tmp_path / "c", _tensors(), SPEC, {})
    assert "reward" not in load_sizefree(p)[1]


def test_evaluate_takes_sizefree_branches_and_refuses_a_wrong_w1(tmp_path):
    from trainer.evaluate import BRANCHES, EvaluationError, run_evaluation
    from trainer.traces import write_trace

    d = tmp_path / "traces" / "mix"
    d.mkdir(parents=True)
    write_trace(d / "s0.csv", _jobs(6, 11, 16))
    for i, (br, w1) in enumerate(BRANCHES.items()):
        rew = {"kind": "seed", "w1": w1, "w2": round(1 - w1, 12)}
        save_sizefree(tmp_path / "ok" / br, _tensors(i), SPEC, {}, reward=rew)
        save_sizefree(tmp_path / "bad" / br, _tensors(i), SPEC, {},
                      reward={"kind": "jct"} if br == "D" else rew)
    res = run_evaluation(["srtf"], tmp_path / "traces", "4x8", out=tmp_path / "out", branches=tmp_path / "ok",
                         results_md=tmp_path / "R.md")
    names = [f"{m}@{b}" for b in BRANCHES for m in ("rl-base", "rl-hybrid")]
    assert list(res["mix"]) == ["srtf", *names]
    assert (tmp_path / "out" / "figures" / "rl_branches_jct_vs_util.png").is_file()
    md = (tmp_path / "R.md").read_text()
    assert "### Branches A-E" in md and all(f"| {n} |" in md for n in names)
    with pytest.raises(EvaluationError, match="branch D is reward 'seed', W1 0.6"):
        run_evaluation(["srtf"], tmp_path / "traces", "4x8", out=tmp_path / "o2", branches=tmp_path / "bad")
    assert json.loads((tmp_path / "out" / "rl_results.json").read_text())["meta"]["policies"][1:] == names


def test_rl_branches_script_runs_the_documented_commands(tmp_path):
    """scripts/rl_branches.sh: 'train' runs train-sizefree once per branch with its W1, 'results' generates the
    five trace groups and runs one evaluate with the shipped branches; anything else: exit 2, one line."""
    import os
    import shutil
    import subprocess

    from test_scripts import SCRIPTS, _fake_repo  # a repository with scripts/python-env.sh

    repo = _fake_repo(tmp_path, venv=False)
    shutil.copy(SCRIPTS / "rl_branches.sh", repo / "scripts")
    calls = tmp_path / "calls"
    py = tmp_path / "python"
    py.write_text(f'#!/bin/sh\nprintf "%s|" "$@" >>"{calls}"\necho >>"{calls}"\n')
    py.chmod(0o755)
    env = {**os.environ, "PYTHON": str(py), "VIRTUAL_ENV": str(tmp_path / "venv")}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(repo / "scripts" / "rl_branches.sh"), *args], capture_output=True,
                              text=True, env=env, cwd=tmp_path, timeout=60, check=False)

    from trainer.evaluate import BRANCHES

    assert run("train", "out").returncode == 0
    lines = [ln for ln in calls.read_text().splitlines() if "train-sizefree" in ln]
    assert len(lines) == len(BRANCHES)
    for ln, (br, w1) in zip(lines, BRANCHES.items()):
        assert f"--out|out/{br}|--w1|{w1}|" in ln
    calls.unlink()
    assert run("results", "ev dir").returncode == 0
    lines = calls.read_text().splitlines()
    gens = [ln for ln in lines if "|trace|generate|" in ln]
    evals = [ln for ln in lines if "|evaluate|" in ln]
    assert len(gens) == 5 and all("|--out|ev dir/" in g for g in gens) and len(evals) == 1
    assert "|--branches|policies/checkpoints/branches|--traces|ev dir|" in evals[0]
    assert "|--results-md|docs/RESULTS.md|" in evals[0]
    for args in ((), ("foo",), ("train", "a", "b")):
        p = run(*args)
        assert p.returncode == 2 and "rl_branches.sh: error: " in p.stderr, (args, p.stderr)
