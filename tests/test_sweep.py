"""scripts/train_sizefree_sweep.sbatch and trainer/sizefree/sweep.py: the size-free training sweep as a
Slurm job array (nothing is trained here)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rlsched.cli import build_parser
from trainer.sizefree import sweep

REPO = Path(__file__).resolve().parents[1]
SBATCH = REPO / "scripts" / "train_sizefree_sweep.sbatch"


def _directives() -> dict[str, str]:
    out = {}
    for line in SBATCH.read_text().splitlines():
        m = re.match(r"#SBATCH\s+--([\w-]+)=(\S+)", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def _array_indices(spec: str) -> list[int]:
    """The indices of an sbatch ``--array`` value (``0-11``, ``0,2,4-6``, optional ``%N`` limit)."""
    out: list[int] = []
    for part in spec.split("%")[0].split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def test_sbatch_parses_with_bash_n():
    p = subprocess.run(["bash", "-n", str(SBATCH)], capture_output=True, text=True, check=False)
    assert p.returncode == 0, p.stderr


def test_every_array_index_is_a_valid_train_sizefree_invocation(tmp_path):
    d = _directives()
    idx = _array_indices(d["array"])
    assert idx == list(range(len(sweep.settings())))  # the array covers the grid, nothing more
    parser = build_parser()
    seen = set()
    for i in idx:
        args = parser.parse_args(sweep.argv(i, tmp_path))
        assert args.command == "train-sizefree" and args.expert == "planner" and args.subproc
        assert args.out == str(tmp_path / f"run-{i}")
        key = (args.seed, args.ppo_lr, args.ent_coef)
        assert key not in seen  # every index a different setting
        seen.add(key)
    assert len(seen) == len(idx) == 12
    assert int(d["cpus-per-task"]) >= 2  # --subproc: one rollout process per training cluster


def test_out_of_range_index_is_refused(capsys):
    n = len(sweep.settings())
    for bad in (-1, n):
        with pytest.raises(IndexError, match=f"outside 0..{n - 1}"):
            sweep.argv(bad, "x")
        assert sweep.main(["--index", str(bad), "--print"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "sweep index" in err


def test_the_array_task_runs_its_setting(tmp_path):
    """The script run as array task 5 (SLURM_* set by hand, --print via a PYTHON wrapper that adds it):
    it runs `python -m trainer.sizefree.sweep --index 5` in the submit directory."""
    wrapper = tmp_path / "py"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} "$@" --print\n')
    wrapper.chmod(0o755)
    env = {**os.environ, "SLURM_ARRAY_TASK_ID": "5", "SLURM_SUBMIT_DIR": str(REPO), "PYTHON": str(wrapper),
           "RLSCHED_SWEEP_OUT": str(tmp_path / "out")}
    p = subprocess.run(["bash", str(SBATCH)], capture_output=True, text=True, env=env, timeout=60, check=False)
    assert p.returncode == 0, p.stderr
    want = "rlsched " + " ".join(sweep.argv(5, tmp_path / "out"))
    assert p.stdout.strip() == want
    # without a task index: refused with a line naming the variable (PYTHON here answers every call with
    # success, so that line is the only way to fail; the import check above already ran the real one)
    ok = tmp_path / "ok"
    ok.write_text("#!/bin/sh\nexit 0\n")
    ok.chmod(0o755)
    env.pop("SLURM_ARRAY_TASK_ID")
    p = subprocess.run(["bash", str(SBATCH)], capture_output=True, text=True, env={**env, "PYTHON": str(ok)},
                       timeout=60, check=False)
    assert p.returncode != 0 and "SLURM_ARRAY_TASK_ID" in p.stderr


def test_best_picks_the_lowest_validation_jct(tmp_path, capsys):
    def run(i: int, chosen: str, vals: dict) -> None:
        (tmp_path / f"run-{i}.json").write_text(json.dumps({"training": {"chosen": chosen, "val_avg_jct_h": vals}}))

    assert sweep.best(tmp_path) is None
    run(0, "bc", {"bc": 3.0, "ppo": 2.0})
    run(1, "ppo", {"bc": 3.0, "ppo": 2.5})
    run(2, "bc", {"bc": float("nan")})
    (tmp_path / "run-3.json").write_text("{")
    assert sweep.best(tmp_path) == (tmp_path / "run-1.json", 2.5)
    assert sweep.main(["--best", "--out-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"{tmp_path / 'run-1.json'}\t2.5000\n"


def test_the_smoke_setting_keeps_the_grid_and_shrinks_the_run(tmp_path):
    parser = build_parser()
    for i in range(len(sweep.settings())):
        full = parser.parse_args(sweep.argv(i, tmp_path))
        small = parser.parse_args(sweep.argv(i, tmp_path, smoke=True))
        # the same setting, teacher and parallel rollouts; a run of seconds
        assert (small.seed, small.ppo_lr, small.ent_coef) == (full.seed, full.ppo_lr, full.ent_coef)
        assert small.expert == "planner" and small.subproc and small.clusters == full.clusters
        assert small.ppo_timesteps < full.ppo_timesteps and small.jobs_per_set < full.jobs_per_set
        assert small.compare == "none"
    assert sweep.smoke_from_env({}) is False
    assert sweep.smoke_from_env({sweep.SMOKE_ENV: "0"}) is False
    assert sweep.smoke_from_env({sweep.SMOKE_ENV: "1"}) is True
    with pytest.raises(ValueError, match="RLSCHED_SWEEP_SMOKE='yes'"):
        sweep.smoke_from_env({sweep.SMOKE_ENV: "yes"})


def test_the_smoke_environment_variable_reaches_the_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(sweep.SMOKE_ENV, "1")
    assert sweep.main(["--index", "2", "--print", "--out-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == "rlsched " + " ".join(sweep.argv(2, tmp_path, smoke=True))
    monkeypatch.setenv(sweep.SMOKE_ENV, "2")
    assert sweep.main(["--index", "2", "--print"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "RLSCHED_SWEEP_SMOKE='2'" in err
