"""Live resize on real Slurm daemons: an elastic PyTorch job (gloo, CPU) resized 2 -> 4 -> 1 workers.

The cluster is the session's (tests/conftest.py: ``slurm_cluster``, 4 nodes x 8 fake GPUs, node
agents), started by the test itself; skipped when not root, without the Slurm binaries or without
node agents. A policy that resizes (``resizes = True``) decides each resize from the job's progress
as the agents report it; the controller carries it out (controller/backend.py): checkpoint through
the agent, ``scontrol requeuehold``, the new GPU count in the AdminComment mark, a pin with the new
node list, GPUs and ``NumTasks``, release. The job (scripts/examples/train_elastic.py) restarts at
the new world size with the same global batch and finishes its exact step count, with the parameters
of a run that never changed size.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import pytest

from controller.config import load_config
from controller.daemon import Controller
from policies.base import Policy
from policies.cluster import Placement
from policies.state import ClusterState, Decision
from tests.test_slurm_integration import _events

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "scripts" / "examples" / "train_elastic.py"
TOTAL_STEPS = 120
GLOBAL_BATCH = 24


class ResizeSchedule(Policy):
    """Places pending jobs on the first node with room; resizes the running elastic job through
    ``stages``: ``(from GPUs, progress fraction, {node index: GPUs})`` -- once the job runs on
    ``from`` GPUs and its progress (done / total samples) has reached the fraction, it is resized to
    that placement."""

    name = "resize-schedule"
    resizes = True

    def __init__(self, stages: list[tuple[int, float, dict[int, int]]]) -> None:
        self.stages = stages

    def schedule(self, state: ClusterState) -> Decision:
        dec = Decision()
        for j in state.running:
            if not j.elastic or j.placement is None:
                continue
            for size, frac, alloc in self.stages:
                if j.placement.total_gpus == size and j.done_samples >= frac * j.total_samples:
                    dec.resize.append((j.job_id, Placement.of(alloc)))
                    break
        free = [int(f) for f in state.free_gpus]
        for j in state.pending:
            n = next((i for i, f in enumerate(free) if f >= j.gpu_demand), None)
            if n is not None:
                dec.place.append((j.job_id, Placement.of({n: j.gpu_demand})))
                free[n] -= j.gpu_demand
        return dec


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def job_diagnosed(cluster, jid: int, detail: Callable[[], str]) -> Iterator[None]:
    """Re-raise an AssertionError of the block with Slurm's record of job ``jid``, ``detail()`` and the end
    of the job's output."""
    try:
        yield
    except AssertionError as exc:
        show = cluster.run(["scontrol", "-o", "show", "job", str(jid)], check=False).stdout
        out = cluster.jobs_dir / f"{jid}.out"
        text = out.read_text()[-4000:] if out.exists() else "(no output)"
        raise AssertionError(f"{exc}\nslurm: {show}\n{detail()}\noutput:\n{text}") from None


def _reference(tmp_path: Path) -> dict:
    """The same job run in one process that never changes size (no Slurm, no agent)."""
    env = {**os.environ, "RLSCHED_AGENT": "none", "PYTHONPATH": str(REPO)}
    for k in [k for k in env if k.startswith("SLURM_")]:
        env.pop(k)
    p = subprocess.run([sys.executable, str(EXAMPLE), "--total-steps", str(TOTAL_STEPS), "--global-batch",
                        str(GLOBAL_BATCH), "--store", f"file://{tmp_path / 'ref-store'}", "--job-key", "reference"],
                       capture_output=True, text=True, env=env, timeout=300, check=False)
    assert p.returncode == 0, p.stderr[-2000:]
    done = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{") and '"done"' in x]
    return done[-1]


def test_elastic_job_resizes_2_4_1_and_finishes_its_exact_steps(live_cluster, tmp_path):
    cluster = live_cluster
    if not cluster.agents:
        pytest.skip("no `rlsched agent` command: node agents not available (a resize checkpoints through them)")
    script = (f"export MASTER_PORT={_free_port()} PYTHONPATH={REPO}\n"
              f"exec {sys.executable} {EXAMPLE} --launch --total-steps {TOTAL_STEPS} --global-batch {GLOBAL_BATCH} "
              f"--step-sleep 0.15 --report-every 2 --threads 1")
    jid = cluster.sbatch(script, 2, comment="rlsched:model=MoE,samples=120000,min_gpus=1,max_gpus=4",
                         extra=["--ntasks=2", "--requeue"])
    ctl = Controller(load_config(cluster.controller_config(tmp_path, min_run_s=0.0)))
    assert ctl.round().ok  # builds the cluster and the configured policy; nothing runs yet
    # 2 GPUs on node1 -> 4 GPUs on node1 + node2 (2 each) at a quarter of its steps -> 1 GPU on node3 at half;
    # each resize leaves the job at least a quarter of its steps (18 s of sleep alone) to be seen by a round
    ctl.policy = ResizeSchedule([(2, 0.25, {0: 2, 1: 2}), (4, 0.5, {2: 1})])
    seen: list[tuple[int, int, dict[str, int]]] = []  # (restarts, GPUs, per-node GPUs) of each run Slurm started
    errors: list[str] = []

    def tick() -> None:
        rep = ctl.round()
        if not rep.ok:
            errors.append(str(rep.error))
        j = cluster.job(jid)
        if j is not None and j.state == "RUNNING" and j.gpus_per_node:
            obs = (j.restarts, j.gpus, dict(j.gpus_per_node))
            if not seen or seen[-1] != obs:
                seen.append(obs)

    with job_diagnosed(cluster, jid, lambda: f"runs: {seen}\nround errors: {errors[-3:]}"):
        cluster.wait(lambda: (j := cluster.job(jid)) is not None and j.state == "COMPLETED", 480,
                     "the resized job to finish", tick=tick, step=1.0)
    assert not errors, errors
    j = cluster.job(jid)
    assert j.restarts == 2, j
    assert ctl.metrics.value("rlsched_decisions_total", action="resize") == 2

    # Slurm ran it at the three sizes, on the node lists the policy chose
    assert [(r, g) for r, g, _ in seen] == [(0, 2), (1, 4), (2, 1)], seen
    assert seen[1][2] == {"node1": 2, "node2": 2} and seen[2][2] == {"node3": 1}, seen

    ev = _events(cluster, jid)
    starts = [e for e in ev if e.get("event") == "start"]
    by_step: dict[int, list[dict]] = {}  # the ranks' start lines of each run (runs start at distinct steps)
    for e in starts:
        by_step.setdefault(e["start_step"], []).append(e)
    runs = [{**next(e for e in group if e["rank"] == 0), "nodes": {e["node"] for e in group},
             "ranks": sorted(e["rank"] for e in group)} for group in by_step.values()]
    assert [r["world"] for r in runs] == [2, 4, 1], starts
    assert [r["ranks"] for r in runs] == [[0, 1], [0, 1, 2, 3], [0]], starts
    assert [r["per_worker_batch"] for r in runs] == [12, 6, 24]
    assert [r["resumed_world"] for r in runs] == [None, 2, 4]
    assert runs[1]["nodes"] == {"node1", "node2"} and runs[2]["nodes"] == {"node3"}, runs
    s0, s1, s2 = (r["start_step"] for r in runs)
    assert s0 == 0 < s1 < s2 < TOTAL_STEPS, runs
    # the data position continues exactly: each run starts at the samples the checkpoint had consumed
    assert [r["position"] for r in runs] == [0, s1 * GLOBAL_BATCH, s2 * GLOBAL_BATCH]
    done = [e for e in ev if e.get("event") == "done"]
    assert len(done) == 1, done  # only the last run reaches the end
    d = done[0]
    assert d["world"] == 1 and d["start_step"] == s2
    assert d["final_step"] == TOTAL_STEPS and d["steps_this_run"] == TOTAL_STEPS - s2
    assert d["samples"] == TOTAL_STEPS * GLOBAL_BATCH

    # same global batch at every size: the parameters of a run that never changed size, up to the
    # float rounding of the all-reduce
    ref = _reference(tmp_path)
    assert ref["final_step"] == TOTAL_STEPS
    assert d["params"] == pytest.approx(ref["params"], abs=1e-5)
    assert d["param_norm"] == pytest.approx(ref["param_norm"], rel=1e-5)
