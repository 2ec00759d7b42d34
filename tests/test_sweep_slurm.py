"""scripts/train_sizefree_sweep.sbatch submitted to a real Slurm cluster (tests/conftest.py
``live_cluster``: slurmctld + 4 slurmd on this machine) as a job array of 2 tasks in the smoke setting
(``RLSCHED_SWEEP_SMOKE=1``: trainer.sizefree.sweep.SMOKE, the planner teacher, DAgger and PPO in
SubprocVecEnv processes on 8-job sets).

sbatch is called from the repository root with the environment a cluster user's login would give it
(the system PATH, no virtualenv, no PYTHONPATH; the interpreter named by ``PYTHON``, as the sbatch file
documents), so what each task sees is what ``--export=ALL`` carries to slurmd. Each task must finish
COMPLETED with exit 0, write ``run-<i>.json`` + ``.safetensors`` that load as a size-free checkpoint
with that index's grid setting, and log its command and ``wrote``; then
``python3 -m trainer.sizefree.sweep --best`` names the run with the lowest validation JCT. A third
submission without ``PYTHON`` (the system Python, which lacks torch) must fail with the sbatch file's
one-line message."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainer.sizefree import sweep

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[1]
SBATCH = REPO / "scripts" / "train_sizefree_sweep.sbatch"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _submit(cluster, out: Path, logs: Path, array: str, python: str | None) -> int:
    """``sbatch --array=ARRAY`` of the sweep from the repository root; returns the array's job id."""
    env = {k: v for k, v in cluster.env.items() if k.startswith(("SLURM_", "MUNGE"))}
    env.update(PATH=SYSTEM_PATH, HOME="/root", LANG="C.UTF-8", RLSCHED_SWEEP_SMOKE="1", RLSCHED_SWEEP_OUT=str(out))
    if python:
        env["PYTHON"] = python
    p = subprocess.run(["sbatch", "--parsable", f"--array={array}", f"--output={logs}/sizefree-sweep-%A_%a.log",
                        str(SBATCH)], capture_output=True, text=True, env=env, cwd=str(REPO), timeout=60, check=False)
    assert p.returncode == 0, p.stderr
    return int(p.stdout.strip().split(";")[0])


def _tasks(cluster, job: int) -> dict[int, dict[str, str]]:
    """``scontrol show job`` of every task of array ``job``: {task index: fields}."""
    p = cluster.run(["scontrol", "-o", "show", "job", str(job)], check=False)
    out = {}
    for line in p.stdout.splitlines():
        f = dict(m.groups() for m in re.finditer(r"(\w+)=(\S*)", line))
        if f.get("ArrayJobId") == str(job) and f.get("ArrayTaskId", "").isdigit():
            out[int(f["ArrayTaskId"])] = f
    return out


def _wait_done(cluster, job: int, n: int, timeout: float) -> dict[int, dict[str, str]]:
    end = time.monotonic() + timeout
    tasks: dict[int, dict[str, str]] = {}
    while time.monotonic() < end:
        tasks = _tasks(cluster, job)
        if len(tasks) == n and all(t["JobState"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL",
                                                    "OUT_OF_MEMORY") for t in tasks.values()):
            return tasks
        time.sleep(0.3)
    raise AssertionError(f"array {job} not done after {timeout:g} s: "
                         f"{ {i: t.get('JobState') for i, t in tasks.items()} }")


def test_the_sweep_runs_as_a_job_array_on_slurm(live_cluster, tmp_path):
    from policies.sizefree import load_sizefree

    out, logs = tmp_path / "runs", tmp_path / "logs"
    logs.mkdir()
    job = _submit(live_cluster, out, logs, "0-1", python=sys.executable)
    tasks = _wait_done(live_cluster, job, 2, timeout=600)
    grid = sweep.settings()
    vals = {}
    for i in (0, 1):
        log = logs / f"sizefree-sweep-{job}_{i}.log"
        text = log.read_text() if log.exists() else "(no log)"
        assert tasks[i]["JobState"] == "COMPLETED" and tasks[i]["ExitCode"] == "0:0", f"task {i}: {tasks[i]}\n{text[-3000:]}"
        # the task ran its own setting in the smoke configuration, and wrote its checkpoint
        assert text.splitlines()[0] == "rlsched " + " ".join(sweep.argv(i, out, smoke=True)), text[:500]
        assert f"wrote {out / f'run-{i}.json'}" in text
        assert (out / f"run-{i}.safetensors").stat().st_size > 0
        net, meta, _path = load_sizefree(out / f"run-{i}.json")
        cfg = meta["training"]["config"]
        assert (str(cfg["seed"]), cfg["ppo_lr"], cfg["ent_coef"]) == (
            grid[i]["--seed"], float(grid[i]["--ppo-lr"]), float(grid[i]["--ent-coef"]))
        assert cfg["expert"] == "planner" and cfg["subproc"] and cfg["jobs_per_set"] == 8
        assert tuple(cfg["clusters"]) == ("4x8", "16x8")
        tr = json.loads((out / f"run-{i}.json").read_text())["training"]
        vals[i] = tr["val_avg_jct_h"][tr["chosen"]]
        assert vals[i] > 0
    # --best: the run with the lowest validation JCT of the two, as the sbatch file's header says
    want = min(vals, key=lambda i: (vals[i], i))
    p = subprocess.run([sys.executable, "-m", "trainer.sizefree.sweep", "--best", "--out-dir", str(out)],
                       capture_output=True, text=True, cwd=str(REPO), timeout=120, check=False,
                       env={"PATH": SYSTEM_PATH, "PYTHONPATH": str(REPO), "HOME": "/root"})
    assert p.returncode == 0, p.stderr
    path, hours = p.stdout.strip().split("\t")
    assert path == str(out / f"run-{want}.json") and float(hours) == pytest.approx(vals[want], abs=5e-5)


def test_a_task_without_a_usable_python_stops_with_one_line(live_cluster, tmp_path):
    """No PYTHON: python-env.sh's choice on the system PATH is Debian's python3 without torch (skipped
    where that one has the packages)."""
    sysenv = subprocess.run(["bash", "-c", f"source {SBATCH.parent / 'python-env.sh'} && echo \"$PY\""],
                            capture_output=True, text=True, env={"PATH": SYSTEM_PATH}, cwd=str(REPO), check=True)
    py = sysenv.stdout.strip()
    if subprocess.run([py, "-c", "import rlsched, torch, sb3_contrib"], capture_output=True, env={"PATH": SYSTEM_PATH,
                      "PYTHONPATH": str(REPO)}, check=False).returncode == 0:
        pytest.skip(f"{py} on the system PATH has rlsched's packages")
    out, logs = tmp_path / "runs", tmp_path / "logs"
    logs.mkdir()
    job = _submit(live_cluster, out, logs, "3", python=None)
    tasks = _wait_done(live_cluster, job, 1, timeout=120)
    assert tasks[3]["JobState"] == "FAILED" and tasks[3]["ExitCode"] == "2:0", tasks[3]
    text = (logs / f"sizefree-sweep-{job}_3.log").read_text()
    assert text.count("\n") == 1 and "cannot import rlsched, torch and sb3_contrib" in text and "PYTHON=" in text
    assert not out.exists()
