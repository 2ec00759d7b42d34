"""Typed GPUs on real Slurm: the controller reads ``--gpus=TYPE:N`` and places such a job only on
nodes of that type; a job asking for a type its partition lacks stays held, and the controller says why.

The module starts its own cluster (tests/conftest.py, ``typed_slurm_cluster``): 4 nodes x 4 fake GPUs
with typed GRES, ``scripts/local-cluster.sh up --gpu-type a100:2,v100:2`` (node1-2 A100, node3-4 V100,
the unmanaged ``other1`` A100). Skipped when not root or without the Slurm binaries.
"""

from __future__ import annotations

import logging
import shlex
import subprocess
from pathlib import Path

import pytest

from controller.config import load_config
from controller.daemon import Controller

REPO = Path(__file__).resolve().parents[1]
LC = REPO / "scripts" / "local-cluster.sh"
V100 = {"node3", "node4"}
A100 = {"node1", "node2"}


@pytest.fixture
def cluster(typed_slurm_cluster):
    typed_slurm_cluster.cancel_all()
    yield typed_slurm_cluster
    typed_slurm_cluster.cancel_all()


def _controller(cluster, tmp_path, **kw) -> Controller:
    return Controller(load_config(cluster.controller_config(tmp_path, **kw)))


def _sbatch(cluster, user: str, gpus: str, seconds: int = 30) -> int:
    """A job of ``sleep seconds`` asking ``--gpus=gpus`` (e.g. ``v100:2``), submitted by ``user``."""
    out = cluster.run(["sbatch", "--parsable", f"--gpus={gpus}", "--comment=rlsched:model=GNN", "-o", "/dev/null",
                       "--wrap", f"sleep {seconds}"], user=user).stdout.strip()
    return int(out.split(";")[0])


def _slurm_nodes(cluster, job_id: int) -> set[str]:
    """The nodes Slurm runs the job on (``scontrol show hostnames`` of its node list)."""
    nodelist = cluster.run(["squeue", "-h", "-j", str(job_id), "-o", "%N"]).stdout.strip()
    return set(cluster.run(["scontrol", "show", "hostnames", nodelist]).stdout.split())


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_typed_job_runs_only_on_nodes_of_its_type(cluster, test_user, tmp_path):
    """fifo packs an untyped job onto node1; ``--gpus=v100:2`` and ``--gpus=v100:6`` land on node3-4 only
    (the second spanning both), ``--gpus=a100:2`` on an A100 node; Slurm runs each where it was placed,
    with GPUs of the type it asked for."""
    gres = dict(line.split() for line in cluster.run(["sinfo", "-h", "-N", "-o", "%N %G"]).stdout.splitlines())
    assert gres == {"node1": "gpu:a100:4", "node2": "gpu:a100:4", "node3": "gpu:v100:4", "node4": "gpu:v100:4",
                    "other1": "gpu:a100:4"}, gres
    v2, v6, a2, plain = (_sbatch(cluster, test_user, g) for g in ("v100:2", "v100:6", "a100:2", "2"))
    ctl = _controller(cluster, tmp_path, policy="fifo")
    rep = ctl.round()
    assert rep.ok, rep.error
    placed = dict(rep.placed)
    assert set(placed) == {v2, v6, a2, plain}, rep
    assert set(placed[v2]) <= V100 and sum(placed[v2].values()) == 2, placed
    assert set(placed[v6]) == V100 and sum(placed[v6].values()) == 6, placed
    assert set(placed[a2]) <= A100 and set(placed[plain]) <= A100, placed
    demand = {j.job_id: j.demand for j in ctl.backend.view.state.pending}
    assert demand[str(v2)].gpu_type == "v100" and demand[str(plain)] is None
    cluster.wait(lambda: all(cluster.job(j) is not None and cluster.job(j).state == "RUNNING" for j in placed),
                 30, "the placed jobs to run")
    for jid, where in placed.items():
        assert _slurm_nodes(cluster, jid) == set(where), (jid, where)
    for jid in (v2, v6):
        show = cluster.run(["scontrol", "show", "job", str(jid)]).stdout
        assert "gpu:v100" in show and "gpu:a100" not in show, show  # the pin kept the type: Slurm gave V100s


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_type_the_partition_lacks_stays_held_with_its_reason(cluster, test_user, tmp_path, caplog, monkeypatch):
    """Slurm takes ``--gpus=k80:1`` (job_submit.lua holds it); the controller leaves it held round after
    round, out of the policy's queue, and logs why, naming the types the partition has; a typed job
    behind it still runs."""
    k80 = _sbatch(cluster, test_user, "k80:1")
    v100 = _sbatch(cluster, test_user, "v100:1")
    ctl = _controller(cluster, tmp_path, policy="fifo")
    monkeypatch.setattr(logging.getLogger("controller"), "propagate", True)
    why = f"job {k80}: asks for GPU type k80, which no node of partition gpu has (types there: a100, v100); left held"
    with caplog.at_level(logging.WARNING, logger="controller"):
        for _ in range(2):
            rep = ctl.round()
            assert rep.ok, rep.error
            assert k80 not in dict(rep.placed)
            assert why in ctl.backend.view.warnings
            assert str(k80) not in {j.job_id for j in ctl.backend.view.state.pending}
            job = cluster.job(k80)
            assert job.pending and job.held and job.reason == "JobHeldUser", job
    assert why in caplog.text
    cluster.wait(lambda: cluster.job(v100) is not None and cluster.job(v100).state == "RUNNING", 30, "the v100 job to run")
    assert _slurm_nodes(cluster, v100) <= V100


@pytest.mark.parametrize("spec,words", [
    ("a100:3", "--gpu-type 'a100:3' types 3 nodes; --nodes is 4"),
    ("a100:2,v100", "'v100' in 'a100:2,v100' is not TYPE:COUNT"),
    ("9x", "'9x' is not a GPU type name"),
    ("a100:2,v:2:1", "'v:2:1' in 'a100:2,v:2:1' is not TYPE:COUNT"),
])
def test_local_cluster_refuses_a_bad_gpu_type(spec, words, tmp_path):
    """A bad ``--gpu-type`` stops the script with one line (exit 2) before anything is written."""
    d = tmp_path / "lc"
    p = subprocess.run(["bash", "-c", f"bash {shlex.quote(str(LC))} status --dir {shlex.quote(str(d))} "
                                      f"--nodes 4 --gpu-type {shlex.quote(spec)}"],
                       capture_output=True, text=True, timeout=30, check=False)
    line = p.stderr.strip()
    assert p.returncode == 2 and line.startswith("local-cluster: error: --gpu-type") and words in line, p.stderr
    assert "\n" not in line
    assert not d.exists()
