"""The controller against real Slurm daemons (slurmctld + 4 slurmd, 8 fake GPUs each).

One cluster per session (tests/conftest.py: ``slurm_cluster``), started by the
tests themselves with scripts/local-cluster.sh; skipped when not root or
without the Slurm binaries. Jobs are tiny (sleeps, or the example training
script with a few steps) and rounds short, so the module runs in about a minute.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from controller.config import load_config
from controller.daemon import Controller

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[1]
#: what scontrol prints when job_submit.lua refuses a change of a held managed job (ESLURM_JOB_HELD)
HELD_TEXT = "Job is in held state, pending scheduler release"


def _controller(cluster, tmp_path, **kw) -> Controller:
    return Controller(load_config(cluster.controller_config(tmp_path, **kw)))


def _state(cluster, jid: int) -> str:
    j = cluster.job(jid)
    return j.state if j else "GONE"


# --------------------------------------------------------------------------- placement
def test_held_jobs_run_exactly_where_the_policy_placed_them(live_cluster, test_user, tmp_path):
    cluster = live_cluster
    ids = {}
    for gpus, model in ((8, "MoE"), (12, "LM"), (4, "GNN")):
        ids[gpus] = cluster.sbatch("echo ran on $SLURM_JOB_NODELIST; sleep 2", gpus,
                                   comment=f"rlsched:model={model},samples=1000", user=test_user)
    time.sleep(2.5)  # > one Slurm scheduling interval: nothing may start on its own
    for jid in ids.values():
        j = cluster.job(jid)
        assert j.state == "PENDING" and j.held and j.reason == "JobHeldUser" and j.managed, j
        assert j.user == test_user
    ctl = _controller(cluster, tmp_path, policy="fifo")
    rep = ctl.round()
    assert rep.ok, rep.error
    plans = dict(rep.placed)
    assert set(plans) == set(ids.values())
    # packing on an idle 4x8 cluster: 8 -> one node, 12 -> a full node + 4, 4 -> the rest of that node
    assert sorted(len(p) for p in plans.values()) == [1, 1, 2]
    for jid, plan in plans.items():
        cluster.wait(lambda jid=jid: _state(cluster, jid) in ("RUNNING", "COMPLETED"), 20, f"job {jid} to start")
        j = cluster.job(jid)
        if j.state == "RUNNING":
            assert set(j.nodes) == set(plan), (jid, j.nodes, plan)
            assert j.gpus_per_node == plan, (jid, j.gpus_per_node, plan)
    for jid, plan in plans.items():
        cluster.wait(lambda jid=jid: _state(cluster, jid) == "COMPLETED", 30, f"job {jid} to complete")
        out = (cluster.jobs_dir / f"{jid}.out").read_text()
        ran_on = out.split("ran on ", 1)[1].split()[0]
        from controller.slurm import expand_hostlist

        assert set(expand_hostlist(ran_on)) == set(plan)
    assert ctl.round().ok


def test_dependencies_and_begin_times_are_kept(live_cluster, test_user, tmp_path):
    """A held job's --dependency is not re-evaluated by Slurm while it is held: the controller judges
    it and places the job only once it is met; a --begin time in the future is honoured too."""
    cluster = live_cluster
    first = cluster.sbatch("sleep 3", 2, user=test_user)
    after = cluster.sbatch("true", 2, user=test_user, extra=[f"--dependency=afterok:{first}"])
    later = cluster.sbatch("true", 2, user=test_user, extra=["--begin=now+3600"])
    ctl = _controller(cluster, tmp_path, policy="fifo")
    rep = ctl.round()
    assert rep.ok, rep.error
    assert [j for j, _ in rep.placed] == [first]
    assert cluster.job(after).dependency == f"afterok:{first}(unfulfilled)"
    # rounds go on: the dependent job is placed once the first one has completed (Slurm would still
    # show "(unfulfilled)" for it while held), and then runs
    cluster.wait(lambda: _state(cluster, after) == "COMPLETED", 30, "dependent job to run", tick=ctl.round)
    j = cluster.job(later)
    assert j.held and j.state == "PENDING", j
    rep = ctl.round()
    assert rep.ok and later not in [x for x, _ in rep.placed]


def test_balanced_and_unbalanced_splits_are_exact(live_cluster, tmp_path):
    """Balanced plans become TresPerNode and start exactly as planned; an unbalanced one is sent as the split
    Slurm gives its node set and total (fifo:spread plans {2, 2, 1, 1}; Slurm 22.05 gives one GPU per node,
    the rest in node order: {3, 1, 1, 1}) and starts exactly as sent."""
    cluster = live_cluster
    a = cluster.sbatch("sleep 2", 12, comment="rlsched:model=LM")
    b = cluster.sbatch("sleep 2", 6, comment="rlsched:model=GNN")
    ctl = _controller(cluster, tmp_path, policy="fifo:spread")
    rep = ctl.round()
    plans = dict(rep.placed)
    assert plans[a] == {"node1": 3, "node2": 3, "node3": 3, "node4": 3}, plans
    assert plans[b] == {"node1": 3, "node2": 1, "node3": 1, "node4": 1}, plans  # unbalanced: TresPerJob
    assert ctl.metrics.value("rlsched_decisions_total", action="split_set") == 1
    started = {}
    for jid in (a, b):
        cluster.wait(lambda jid=jid: _state(cluster, jid) == "RUNNING", 20, f"job {jid} to start")
        started[jid] = cluster.job(jid).gpus_per_node
    assert started == plans  # both exact
    ctl.round()
    assert ctl.metrics.value("rlsched_placement_mismatch_total") == 0
    for jid in (a, b):
        cluster.wait(lambda jid=jid: _state(cluster, jid) == "COMPLETED", 30, f"job {jid} to complete")
    assert cluster.job(a).gpus == 12 and cluster.job(b).gpus == 6


def test_rl_policy_places_jobs_on_real_slurm(live_cluster, tmp_path):
    """The shipped RL policy (rl-hybrid, 4x8 checkpoint) drives the live cluster like any heuristic."""
    cluster = live_cluster
    rl = pytest.importorskip("policies.rl")
    from policies.base import PolicyError
    from policies.cluster import ClusterSpec

    try:
        rl.make_rl_policy("rl-hybrid", ClusterSpec.homogeneous(4, 8))
    except PolicyError as exc:
        pytest.skip(f"no usable rl-hybrid checkpoint for 4x8: {exc}")
    ids = [cluster.sbatch("sleep 2", g, comment=f"rlsched:model={m}") for g, m in ((8, "MoE"), (12, "LM"), (2, "GNN"))]
    ctl = _controller(cluster, tmp_path, policy="rl-hybrid")
    rep = ctl.round()
    assert rep.ok, rep.error
    plans = dict(rep.placed)
    assert sorted(plans) == sorted(ids)
    for jid in ids:
        cluster.wait(lambda jid=jid: _state(cluster, jid) == "COMPLETED", 30, f"job {jid} to complete",
                     tick=ctl.round)
        assert sum(plans[jid].values()) == cluster.job(jid).gpus
    assert ctl.policy.name.startswith("rl-hybrid")


def test_sced2_policy_places_jobs_on_real_slurm(live_cluster, test_user, tmp_path):
    """``policy: sced2`` (the shipped checkpoint for 8-GPU servers) drives the live cluster: the jobs
    sbatch held are placed where the policy's own decision put them (that decision is recorded as the
    round asks for it) and Slurm runs each on exactly those nodes and GPUs."""
    cluster = live_cluster
    ids = [cluster.sbatch("sleep 3", g, comment=f"rlsched:model={m},samples=1000", user=test_user)
           for g, m in ((8, "MoE"), (4, "GNN"), (2, "IMG"))]
    time.sleep(1.5)
    for jid in ids:
        j = cluster.job(jid)
        assert j.state == "PENDING" and j.held and j.managed, j
    ctl = _controller(cluster, tmp_path, policy="sced2")
    decided: list = []  # every decision the round loop hands to the backend, as the policy made it
    apply = ctl.backend.apply

    def recording(decision, problems=None):
        decided.append(decision)
        return apply(decision, problems)

    ctl.backend.apply = recording  # type: ignore[method-assign]
    rep = ctl.round()
    assert rep.ok, rep.error
    assert ctl.policy is not None and ctl.policy.name.startswith("sced2"), ctl.policy
    placed = dict(rep.placed)
    for _ in range(5):  # sced2 may start some jobs at a later event (one round each)
        if len(placed) == len(ids):
            break
        rep = ctl.round()
        assert rep.ok, rep.error
        placed.update(dict(rep.placed))
    assert sorted(placed) == sorted(ids), placed
    # what was applied is the policy's decision, node for node and GPU for GPU
    names = [n.name for n in ctl.cluster.nodes]
    wanted = {int(jid): {names[n]: g for n, g in p.alloc} for d in decided for jid, p in d.place}
    assert wanted == placed, (wanted, placed)
    for jid in ids:
        assert sum(placed[jid].values()) == cluster.job(jid).gpus
        cluster.wait(lambda jid=jid: _state(cluster, jid) in ("RUNNING", "COMPLETED"), 20, f"job {jid} to start")
        j = cluster.job(jid)
        if j.state == "RUNNING":
            assert j.gpus_per_node == placed[jid], (jid, j.gpus_per_node, placed[jid])
    for jid in ids:
        cluster.wait(lambda jid=jid: _state(cluster, jid) == "COMPLETED", 30, f"job {jid} to complete",
                     tick=ctl.round)
    assert ctl.metrics.value("rlsched_placement_mismatch_total") == 0


def test_batched_pins_and_releases_report_any_refusal(live_cluster, tmp_path):
    """What the controller's batched placement relies on (slurmctld 22.05): one scontrol process applies
    every pin read from stdin and fails when any one of them was refused; ``scontrol release a,b,c``
    releases every job it can and fails when it could not release one."""
    from controller.slurm import SlurmCLI, SlurmError

    cluster = live_cluster
    a, b = (cluster.sbatch("sleep 2", g, comment="rlsched:model=GNN") for g in (4, 8))
    slurm = cluster.slurm()
    gone = max(a, b) + 1000
    slurm.place_many([SlurmCLI.pin_args(a, ["node1"], 4), SlurmCLI.pin_args(b, ["node2", "node3"], 8, 4)])
    assert cluster.job(a).required_nodes == ["node1"] and cluster.job(b).required_nodes == ["node2", "node3"]
    with pytest.raises(SlurmError):
        slurm.place_many([SlurmCLI.pin_args(gone, ["node4"], 4), SlurmCLI.pin_args(a, ["node4"], 4)])
    assert cluster.job(a).required_nodes == ["node4"]  # the lines after a refused one are still applied
    assert cluster.job(a).held and cluster.job(b).held
    with pytest.raises(SlurmError):
        slurm.release_many([a, gone, b])
    for jid, plan in ((a, {"node4": 4}), (b, {"node2": 4, "node3": 4})):
        cluster.wait(lambda jid=jid: _state(cluster, jid) in ("RUNNING", "COMPLETED"), 20, f"job {jid} to start")
        j = cluster.job(jid)
        if j.state == "RUNNING":
            assert j.gpus_per_node == plan, (jid, j.gpus_per_node)


def test_cheap_queue_read_agrees_with_squeue_json(live_cluster, test_user):
    """SlurmCLI.queue()'s text read laid over the last ``squeue --json`` gives the jobs the JSON gives:
    held, pinned and released, running on one node and on two (balanced), a comment with newlines and
    field-like text."""
    from controller.slurm import SlurmCLI

    cluster = live_cluster
    tricky = "rlsched:model=GNN|x\nJobId=1 State=RUNNING:S0:E0,"
    a = cluster.sbatch("sleep 20", 4, comment=tricky, user=test_user)
    b = cluster.sbatch("sleep 20", 8, comment="rlsched:model=LM", user=test_user)
    c = cluster.sbatch("sleep 20", 2, comment="rlsched:model=IMG", user=test_user)
    slurm = cluster.slurm()
    slurm.queue()
    assert slurm.queue_reads == {"json": 1, "text": 0}
    slurm.place_many([SlurmCLI.pin_args(a, ["node1"], 4), SlurmCLI.pin_args(b, ["node2", "node3"], 8, 4)])
    slurm.release_many([a, b])
    cluster.wait(lambda: all(_state(cluster, j) == "RUNNING" for j in (a, b)), 20, "jobs to start")
    fields = ("job_id", "state", "reason", "partition", "gpus", "nodes", "gpus_per_node", "required_nodes",
              "num_nodes", "comment", "admin_comment", "restarts", "dependency", "requeue", "batch_host", "tres_style")
    for _ in range(2):
        text = {j.job_id: j for j in slurm.queue()}
        assert slurm.queue_reads["text"] >= 1, slurm.queue_reads
        full = {j.job_id: j for j in slurm.jobs()}
        assert set(text) == set(full)
        for jid in (a, b, c):
            t, f = text[jid], full[jid]
            assert {k: getattr(t, k) for k in fields} == {k: getattr(f, k) for k in fields}, jid
            assert t.held == f.held and t.running == f.running
            if f.running:
                assert abs(t.start_time - f.start_time) <= 1.0
    assert text[a].comment == tricky and text[b].gpus_per_node == {"node2": 4, "node3": 4}


def test_requested_cpus_and_memory_per_gpu_reach_the_controllers_snapshot(live_cluster, test_user, tmp_path):
    """A job submitted with --gpus=2 --cpus-per-gpu=3 --mem-per-gpu=2G is in the controller's snapshot with
    that demand while held and, read through the cheap text queue read, once running (the pin keeps it),
    where its 6 CPUs and 4 GB are taken from its node's free CPUs / memory (nodes: 32 CPUs, 64000 MB). A job
    that asks for GPUs only has no demand. The test cluster's GPUs are untyped (``Gres=gpu:8``: Slurm
    refuses ``--gpus=v100:2`` there): tests/test_slurm_typed.py runs typed jobs on a cluster of its own."""
    from policies.resources import ResourceDemand

    cluster = live_cluster
    a = cluster.sbatch("sleep 30", 2, comment="rlsched:model=GNN", user=test_user,
                       extra=["--cpus-per-gpu=3", "--mem-per-gpu=2G"])
    b = cluster.sbatch("sleep 30", 2, comment="rlsched:model=GNN", user=test_user)
    want = ResourceDemand(2, cpus_per_gpu=3, mem_gb_per_gpu=2.0)
    ctl = _controller(cluster, tmp_path, policy="fifo")
    assert ctl.round().ok
    held = {j.job_id: j.demand for j in ctl.backend.view.state.pending}
    assert held == {str(a): want, str(b): None}
    cluster.wait(lambda: all(_state(cluster, j) == "RUNNING" for j in (a, b)), 20, "jobs to start")
    assert ctl.round().ok
    assert ctl.slurm.queue_reads["text"] >= 1, ctl.slurm.queue_reads
    view = ctl.backend.view
    running = {j.job_id: j for j in view.state.running}
    assert running[str(a)].demand == want and running[str(b)].demand is None
    (node,) = running[str(a)].placement.as_dict()
    cpus, mem = view.state.free_cpu_mem()
    assert cpus[node] == 32 - 6 and mem[node] == pytest.approx(64000 / 1024 - 4.0)
    # Slurm gave it what it asked for
    assert cluster.job(a).cpus_per_gpu == 3 and "cpu=6," in _show(cluster, a, "TRES")


def test_owner_cannot_release_or_repin_a_held_job(live_cluster, test_user):
    cluster = live_cluster
    jid = cluster.sbatch("sleep 1", 4, comment="rlsched:model=MoE", user=test_user)
    for cmd in (["scontrol", "release", str(jid)],
                ["scontrol", "update", f"JobId={jid}", "ReqNodeList=node2"],
                ["scontrol", "update", f"JobId={jid}", "NumNodes=2"],
                ["scontrol", "update", f"JobId={jid}", "Priority=100"],
                ["scontrol", "hold", str(jid)]):
        p = cluster.run(cmd, user=test_user, check=False)
        assert p.returncode != 0, cmd
        assert HELD_TEXT in p.stderr, (cmd, p.stderr)  # job_submit.lua: the job is held for the scheduler
    j = cluster.job(jid)
    assert j.held and j.required_nodes == [] and j.num_nodes == 1
    # harmless changes and cancelling stay allowed
    assert cluster.run(["scontrol", "update", f"JobId={jid}", "Comment=rlsched:model=GNN"], user=test_user, check=False).returncode == 0
    # --gres=gpu:N (per node) is refused at submission with a message saying what to use
    p = cluster.run(["sbatch", "--gres=gpu:2", "--wrap", "true"], user=test_user, check=False)
    assert p.returncode != 0 and "--gpus=N" in p.stderr
    cluster.run(["scancel", str(jid)], user=test_user)
    cluster.wait(lambda: _state(cluster, jid) == "CANCELLED", 10, "cancel")


def test_operator_hold_is_left_alone_until_uhold_hands_it_back(live_cluster, test_user, tmp_path):
    """An operator's ``scontrol hold`` (JobHeldAdmin) keeps a job out of rlsched's hands; ``scontrol
    uhold`` gives it back (JobHeldUser, which the owner still cannot release), and it is placed."""
    cluster = live_cluster
    jid = cluster.sbatch("sleep 1", 2, comment="rlsched:model=GNN", user=test_user)
    cluster.run(["scontrol", "hold", str(jid)])
    assert cluster.job(jid).admin_held
    ctl = _controller(cluster, tmp_path, policy="fifo")
    rep = ctl.round()
    assert rep.ok and rep.placed == [], rep
    cluster.run(["scontrol", "uhold", str(jid)])
    j = cluster.job(jid)
    assert j.held and not j.admin_held and j.reason == "JobHeldUser"
    p = cluster.run(["scontrol", "release", str(jid)], user=test_user, check=False)
    assert p.returncode != 0 and HELD_TEXT in p.stderr
    rep = ctl.round()
    assert [x for x, _ in rep.placed] == [jid], rep
    cluster.wait(lambda: _state(cluster, jid) == "COMPLETED", 30, f"job {jid} to complete", tick=ctl.round)


def test_gpu_jobs_cannot_escape_the_hold(live_cluster, test_user):
    """Every way a user could get GPUs in the managed partition without the controller placing the job
    is refused by job_submit.lua (real slurmctld): GPUs per task / node / socket at submission, GPUs
    added to a pending CPU job, a pending GPU job moved in from another partition."""
    cluster = live_cluster
    for opts in (["-n", "2", "--gpus-per-task=1"], ["--gpus-per-node=1"], ["--gpus-per-socket=1", "--sockets-per-node=1"],
                 ["--gres=gpu"]):  # no count: one GPU per node for Slurm
        p = cluster.run(["sbatch", *opts, "-o", "/dev/null", "--wrap", "true"], user=test_user, check=False)
        assert p.returncode != 0 and "--gpus=N" in p.stderr, (opts, p.stderr)
    # one placement is one job: GPU job arrays and heterogeneous GPU jobs are refused; so is --hold (never releasable)
    for opts, needle in ((["--array=0-3", "--gpus=2"], "job arrays of GPU jobs"),
                         (["--gpus=1", "-o", "/dev/null", "--wrap", "true", ":", "--gpus=2"], "heterogeneous GPU jobs"),
                         (["--hold", "--gpus=1"], "--hold is not accepted")):
        p = cluster.run(["sbatch", *opts, "-o", "/dev/null", "--wrap", "true"], user=test_user, check=False)
        assert p.returncode != 0 and needle in p.stderr, (opts, p.stderr)
    # a held CPU job of the managed partition (not ours) cannot be given GPUs
    p = cluster.run(["sbatch", "--parsable", "--hold", "-o", "/dev/null", "--wrap", "sleep 30"], user=test_user)
    cpu_job = int(p.stdout.strip().split(";")[0])
    for upd in ("TresPerJob=gres:gpu:8", "Gres=gpu"):
        p = cluster.run(["scontrol", "update", f"JobId={cpu_job}", upd], user=test_user, check=False)
        assert p.returncode != 0 and "Access/permission denied" in p.stderr, (upd, p.stderr)
    assert cluster.job(cpu_job).gpus == 0 and not cluster.job(cpu_job).managed
    # a GPU job of another partition cannot be moved into the managed one
    cluster.run(["scontrol", "create", "PartitionName=side", "Nodes=node4", "Default=NO", "State=UP"])
    try:
        p = cluster.run(["sbatch", "--parsable", "-p", "side", "--hold", "--gpus=1", "-o", "/dev/null",
                         "--wrap", "sleep 30"], user=test_user)
        other = int(p.stdout.strip().split(";")[0])
        assert not cluster.job(other).managed  # not the managed partition: Slurm's business
        p = cluster.run(["scontrol", "update", f"JobId={other}", "Partition=gpu"], user=test_user, check=False)
        assert p.returncode != 0 and "Access/permission denied" in p.stderr
        assert cluster.job(other).partition == "side"
        cluster.run(["scancel", str(other)])
    finally:
        cluster.run(["scontrol", "delete", "PartitionName=side"], check=False)
    cluster.run(["scancel", str(cpu_job)])


def _show(cluster, jid: int, key: str) -> str:
    """One ``Key=Value`` of ``scontrol -o show job`` (our own test jobs: no user text imitates a key)."""
    out = cluster.run(["scontrol", "-o", "show", "job", str(jid)]).stdout
    m = re.search(rf"(?:^|\s){key}=(\S*)", out)
    return m.group(1) if m else ""


def _ctld_log(cluster) -> str:
    return (cluster.dir / "log" / "slurmctld.log").read_text(errors="replace")


def _denied(cluster, jid: int, upd: str, user: str, held: bool = False) -> None:
    p = cluster.run(["scontrol", "update", f"JobId={jid}", *upd.split()], user=user, check=False)
    want = HELD_TEXT if held else "Access/permission denied"
    assert p.returncode != 0 and want in p.stderr, (upd, p.returncode, p.stderr)


def test_owner_cannot_release_a_held_job_with_nice_or_any_field_off_the_allowlist(live_cluster, test_user):
    """``scontrol update Nice=1`` by the owner would release a held managed job (22.05 sets the priority to
    MAX(0 + old nice - new nice, 2)) and run it at once on a node pinned at submission (-w node4).
    job_modify lets the owner change only comment, name, time limit, dependency and mail settings;
    everything else, cleared values (``ReqNodeList=``) included, is refused."""
    cluster = live_cluster
    jid = cluster.sbatch("sleep 1", 4, comment="rlsched:model=MoE", user=test_user)
    cluster.run(["scontrol", "update", f"JobId={jid}", "ReqNodeList=node4"])  # a pin left by the controller (root)
    for upd in ("Nice=1", "ReqNodeList=", "ReqNodeList=node2", "ExcNodeList=node1,node2,node3", "ExcNodeList=",
                "StartTime=now", "EligibleTime=now", "Features=", "OverSubscribe=no", "QOS=normal", "Partition=gpu",
                "TimeMin=1", "Requeue=0", "NumTasks=2", "Comment=rlsched:model=GNN Nice=1"):
        _denied(cluster, jid, upd, test_user, held=True)
    log = _ctld_log(cluster)
    for field in ("nice", "req_nodes", "exc_nodes", "begin_time", "features", "shared", "qos", "partition"):
        assert f"cannot change {field} of managed job {jid}" in log, field  # refused by job_submit.lua itself
    # the harmless fields stay open to the owner, and none of them releases the job
    for upd in ("Comment=rlsched:model=GNN,samples=10", "Name=renamed", "TimeLimit=10", "Dependency=",
                "MailType=END", "MailUser=nobody@example.org"):
        p = cluster.run(["scontrol", "update", f"JobId={jid}", upd], user=test_user, check=False)
        assert p.returncode == 0, (upd, p.stderr)
    time.sleep(2.5)  # > one Slurm scheduling interval
    j = cluster.job(jid)
    assert j.state == "PENDING" and j.held and j.reason == "JobHeldUser", j
    assert j.required_nodes == ["node4"] and j.comment == "rlsched:model=GNN,samples=10" and j.name == "renamed"
    assert _show(cluster, jid, "ExcNodeList") == "(null)"
    # root (the controller) still does what placing needs
    cluster.run(["scontrol", "update", f"JobId={jid}", "ReqNodeList=node2", "NumNodes=1"])
    cluster.run(["scontrol", "update", f"JobId={jid}", "StartTime=now"])
    assert cluster.job(jid).required_nodes == ["node2"]
    # and a GPU job cannot carry a node list its user chose in the first place
    for opts, needle in ((["-w", "node4"], "-w/--nodelist"), (["--exclude=node1,node2,node3"], "--exclude")):
        p = cluster.run(["sbatch", "--gpus=4", *opts, "-o", "/dev/null", "--wrap", "true"], user=test_user, check=False)
        assert p.returncode != 0 and needle in p.stderr and "the scheduler chooses the nodes" in p.stderr, (opts, p.stderr)


def test_owner_cannot_repin_or_start_a_requeued_managed_job(live_cluster, test_user, tmp_path):
    """``scontrol requeue`` of one's own running managed job does not pass job_modify; the job comes back
    pending (not held) with its old priority, and ``ReqNodeList= ExcNodeList=node1,node2,node3`` plus
    ``StartTime=now`` would restart it on node4 with no controller involved. Every one of those updates is
    refused (holding the requeued job again is the controller's part)."""
    cluster = live_cluster
    jid = cluster.sbatch("sleep 300", 2, comment="rlsched:model=GNN", user=test_user)
    # placed as the controller does it (root): pin, then release
    cluster.run(["scontrol", "update", f"JobId={jid}", "ReqNodeList=node1", "NumNodes=1"])
    cluster.run(["scontrol", "release", str(jid)])
    cluster.wait(lambda: _state(cluster, jid) == "RUNNING", 20, "the placed job to start")
    assert cluster.job(jid).nodes == ["node1"]
    _denied(cluster, jid, "Nice=1", test_user)  # running: guarded as well
    ctl = _controller(cluster, tmp_path, policy="fifo")
    assert ctl.round().ok  # a controller that has seen the running job (its first round adopts nothing later)
    cluster.run(["scontrol", "requeue", str(jid)], user=test_user)
    cluster.wait(lambda: _state(cluster, jid) == "PENDING", 20, "the requeued job to pend")
    j = cluster.job(jid)
    assert not j.held and j.restarts == 1, j  # Slurm keeps its priority: not held
    for upd in ("ReqNodeList=", "ExcNodeList=node1,node2,node3", "ReqNodeList= ExcNodeList=node1,node2,node3",
                "StartTime=now", "EligibleTime=now", "Nice=1", "Features=", "NumNodes=1", "TresPerJob=gres:gpu:8",
                "Partition=gpu"):
        _denied(cluster, jid, upd, test_user)
    time.sleep(2.5)
    j = cluster.job(jid)
    assert j.state == "PENDING" and j.reason == "BeginTime" and j.required_nodes == ["node1"], j
    assert _show(cluster, jid, "ExcNodeList") == "(null)"
    # the controller never released this job (its journal says so): it holds it again at once, before
    # its BeginTime lets Slurm start it on the old pin, and places it itself
    rep = ctl.round()
    assert rep.ok and jid in rep.held_back, rep
    assert ctl.metrics.value("rlsched_decisions_total", action="rehold") == 1
    assert jid in dict(rep.placed), rep  # the same round reads the queue again and places it
    cluster.run(["scancel", str(jid)])


def test_exclusive_jobs_and_exclusive_moves_are_refused_in_the_managed_partition(live_cluster, test_user):
    """``sbatch --exclusive -w node2`` without GPUs would run at once with all 8 GPUs of node2
    (SLURM_GPUS_ON_NODE=8), ``salloc --exclusive`` + ``srun --gres=gpu:8`` likewise, and a managed
    ``--gpus=4 --exclusive`` job would get 8. --exclusive (=user, =mcs too) is refused in the managed partition; a
    job there cannot become exclusive later, nor can one from another partition move in."""
    cluster = live_cluster
    for cmd in (["sbatch", "--exclusive", "-w", "node2", "-o", "/dev/null", "--wrap", "true"],
                ["sbatch", "--exclusive=user", "-o", "/dev/null", "--wrap", "true"],
                ["sbatch", "--gpus=4", "--exclusive", "-o", "/dev/null", "--wrap", "true"],
                ["salloc", "--exclusive", "-w", "node2", "true"]):
        p = cluster.run(cmd, user=test_user, check=False)
        assert p.returncode != 0 and "--exclusive is not accepted in this partition" in p.stderr, (cmd, p.stderr)
    # without --exclusive a CPU allocation has no GPUs, and its steps cannot take any (steps skip job_submit)
    p = cluster.run(["salloc", "-w", "node2", "srun", "--gres=gpu:8", "true"], user=test_user, check=False, timeout=60)
    assert p.returncode != 0 and "Invalid generic resource" in p.stderr, p.stderr
    # a pending CPU job of the managed partition cannot be made exclusive (OverSubscribe=no) afterwards
    p = cluster.run(["sbatch", "--parsable", "--hold", "-o", "/dev/null", "--wrap", "sleep 30"], user=test_user)
    cpu_job = int(p.stdout.strip().split(";")[0])
    _denied(cluster, cpu_job, "OverSubscribe=no", test_user)
    assert f"change OverSubscribe (--exclusive) of job {cpu_job}" in _ctld_log(cluster)
    # nor can an exclusive job of another partition move in
    cluster.run(["scontrol", "create", "PartitionName=side", "Nodes=node4", "Default=NO", "State=UP"])
    try:
        p = cluster.run(["sbatch", "--parsable", "-p", "side", "--hold", "--exclusive", "-o", "/dev/null",
                         "--wrap", "sleep 30"], user=test_user)
        other = int(p.stdout.strip().split(";")[0])
        _denied(cluster, other, "Partition=gpu", test_user)
        assert cluster.job(other).partition == "side"
        assert f"move job {other} into the managed partition" in _ctld_log(cluster)
        cluster.run(["scancel", str(other)])
    finally:
        cluster.run(["scontrol", "delete", "PartitionName=side"], check=False)
    cluster.run(["scancel", str(cpu_job)])


# --------------------------------------------------------------------------- crash-only
def _start_controller(cfg: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rlsched.cli", "controller", "run", "--config", str(cfg)],
                            stdout=log.open("a"), stderr=subprocess.STDOUT, cwd=str(REPO))


def _starts(log: Path) -> int:
    text = log.read_text() if log.exists() else ""
    return sum('"event": "start"' in line for line in text.splitlines())


def test_killed_controller_loses_no_job_and_starts_none_twice(live_cluster, tmp_path):
    cluster = live_cluster
    cfg = cluster.controller_config(tmp_path, policy="fifo", interval_s=0.5)
    script = 'echo "start $SLURM_JOB_ID restarts=${SLURM_RESTART_COUNT:-0}"; sleep 3'
    ids = [cluster.sbatch(script, 8, comment="rlsched:model=MoE") for _ in range(8)]  # 64 GPUs on 32: two waves
    log = tmp_path / "controller.log"
    proc = _start_controller(cfg, log)
    try:
        cluster.wait(lambda: sum(_state(cluster, j) == "RUNNING" for j in ids) >= 1, 30, "first placements")
        proc.send_signal(signal.SIGKILL)  # crash mid-run
        proc.wait(10)
        time.sleep(1.0)
        proc = _start_controller(cfg, log)
        cluster.wait(lambda: _starts(log) == 2, 30, "second controller to start")
        cluster.wait(lambda: sum(_state(cluster, j) in ("RUNNING", "COMPLETED") for j in ids) >= 5, 40, "second wave")
        proc.send_signal(signal.SIGKILL)  # and once more
        proc.wait(10)
        proc = _start_controller(cfg, log)
        cluster.wait(lambda: _starts(log) == 3, 30, "third controller to start")
        cluster.wait(lambda: all(_state(cluster, j) == "COMPLETED" for j in ids), 60, "all jobs to complete")
        # hot reload: SIGHUP re-reads the config and rebuilds the policy
        cfg.write_text(cfg.read_text().replace('policy = "fifo"', 'policy = "las"'))
        proc.send_signal(signal.SIGHUP)
        cluster.wait(lambda: '"event": "reload"' in log.read_text(), 15, "reload")
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
    for jid in ids:
        j = cluster.job(jid)
        assert j.state == "COMPLETED" and j.restarts == 0
        starts = [line for line in (cluster.jobs_dir / f"{jid}.out").read_text().splitlines() if line.startswith("start ")]
        assert starts == [f"start {jid} restarts=0"], (jid, starts)
    events = [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")]
    placed = [e["job"] for e in events if e.get("event") == "placed"]
    assert sorted(placed) == sorted(ids), "every job placed exactly once across the three controllers"
    assert sum(e.get("event") == "start" for e in events) == 3
    assert [e["policy"] for e in events if e.get("event") == "reload"] == ["las"]


def test_slurmctld_outage_and_command_timeouts_do_not_stop_the_controller(live_cluster, tmp_path):
    cluster = live_cluster
    jid = cluster.sbatch("sleep 1", 2, comment="rlsched:model=GNN")
    ctl = _controller(cluster, tmp_path)
    ctl.slurm.timeout_s = 0.001  # every Slurm command times out
    rep = ctl.round()
    assert not rep.ok and "timed out" in rep.error
    ctl.slurm.timeout_s = 20
    pid = cluster.pid("slurmctld")
    assert pid is not None, "slurmctld is not the process its pid file names"
    os.kill(pid, signal.SIGTERM)
    cluster.wait(lambda: not os.path.exists(f"/proc/{pid}"), 30, "slurmctld to stop")
    ctl.slurm.timeout_s = 5
    rep = ctl.round()
    assert not rep.ok and ("sinfo" in rep.error or "squeue" in rep.error), rep.error
    assert ctl.metrics.value("rlsched_slurm_errors_total") == 2
    cluster.script("up")  # slurmctld comes back with its saved state
    ctl.slurm.timeout_s = 20
    rep = ctl.round()
    assert rep.ok, rep.error
    assert [j for j, _ in rep.placed] == [jid]  # the held job survived the outage and is placed
    cluster.wait(lambda: _state(cluster, jid) == "COMPLETED", 30, "job to complete")


# --------------------------------------------------------------------------- what users see
def _as_user_json(cluster, user: str) -> dict[int, dict]:
    out = cluster.run(["squeue", "--json"], user=user).stdout
    return {j["job_id"]: j for j in json.loads(out)["jobs"]}


def test_users_see_why_their_jobs_wait_and_impossible_requests_are_refused(live_cluster, test_user, tmp_path):
    """The owner reads each held job's state in its AdminComment (squeue --json, scontrol show job), the
    controller writes it only when it changes; --gpus above the partition's GPUs is refused at sbatch
    with the size; a refused release says the job is held for the scheduler."""
    cluster = live_cluster
    ctl = _controller(cluster, tmp_path, policy="fifo")
    assert ctl.round().ok  # writes the capacity file job_submit.lua reads
    p = cluster.run(["sbatch", "--gpus=64", "-o", "/dev/null", "--wrap", "true"], user=test_user, check=False)
    assert p.returncode != 0
    assert ("rlsched: --gpus=64 is more than the 32 GPUs of partition gpu (4 nodes, at most 8 GPUs each): "
            "the job could never start; ask for at most 32") in p.stderr, p.stderr
    first = [cluster.sbatch("sleep 30", 8, comment="rlsched:model=MoE", user=test_user) for _ in range(4)]
    held = [cluster.sbatch("sleep 1", g, comment="rlsched:model=GNN", user=test_user) for g in (8, 4, 2)]
    j = _as_user_json(cluster, test_user)[held[0]]
    assert j["admin_comment"] == "rlsched:managed gpus=8 | rlsched: waiting for the scheduler's next round"
    rep = ctl.round()
    assert rep.ok and sorted(x for x, _ in rep.placed) == sorted(first), rep
    ctl.wait_reasons()  # written behind the round
    seen = _as_user_json(cluster, test_user)
    for k, jid in enumerate(held, 1):
        assert seen[jid]["admin_comment"].endswith(f"| rlsched: waiting for placement, position {k} of 3"), seen[jid]
    for jid in first:
        assert seen[jid]["admin_comment"] == "rlsched:managed gpus=8 | rlsched: placed"
    show = cluster.run(["scontrol", "show", "job", str(held[2])], user=test_user).stdout
    assert "AdminComment=rlsched:managed gpus=2 | rlsched: waiting for placement, position 3 of 3" in show
    assert rep.reasons == 7
    rep = ctl.round()
    assert rep.ok and rep.reasons == 0  # nothing changed: no scontrol call
    p = cluster.run(["scontrol", "release", str(held[0])], user=test_user, check=False)
    assert p.returncode != 0 and HELD_TEXT in p.stderr, p.stderr
    assert "rlsched: refused uid" in _ctld_log(cluster) and f"of managed job {held[0]}" in _ctld_log(cluster)


def test_unmanaged_partition_passes_through_and_jobs_see_their_gpus(live_cluster, test_user, tmp_path):
    """A GPU job of the second partition ('other') is not held nor marked and runs as Slurm schedules it;
    jobs of both partitions get CUDA_VISIBLE_DEVICES from their GRES indices (gres.conf File= on
    /dev/null symlinks)."""
    cluster = live_cluster
    script = 'echo "gpus=$CUDA_VISIBLE_DEVICES job_gpus=$SLURM_JOB_GPUS"'
    other = cluster.sbatch(script, 3, user=test_user, extra=["-p", "other"])
    j = cluster.job(other)
    assert not j.managed and "rlsched" not in (j.admin_comment or ""), j
    cluster.wait(lambda: _state(cluster, other) == "COMPLETED", 30, "the unmanaged job to run on its own")
    out = (cluster.jobs_dir / f"{other}.out").read_text()
    assert "gpus=0,1,2 job_gpus=0,1,2" in out, out
    ctl = _controller(cluster, tmp_path, policy="fifo")
    a = cluster.sbatch(script + "; sleep 2", 4, comment="rlsched:model=GNN", user=test_user)
    b = cluster.sbatch(script, 2, comment="rlsched:model=GNN", user=test_user)
    rep = ctl.round()
    assert rep.ok and dict(rep.placed)[a] == {"node1": 4} and dict(rep.placed)[b] == {"node1": 2}, rep
    for jid in (a, b):
        cluster.wait(lambda jid=jid: _state(cluster, jid) == "COMPLETED", 30, f"job {jid} to complete")
    seen = {jid: re.search(r"gpus=(\S+)", (cluster.jobs_dir / f"{jid}.out").read_text()).group(1) for jid in (a, b)}
    ids = [set(seen[jid].split(",")) for jid in (a, b)]
    assert [len(x) for x in ids] == [4, 2] and not (ids[0] & ids[1]), seen  # distinct GPUs of node1
    assert ids[0] | ids[1] <= {str(g) for g in range(8)}


def test_each_up_starts_a_new_run_directory(tmp_path):
    """A fresh `up` writes its logs into DIR/runs/<time>/log, DIR/log points at the newest; a second
    `up` of the stopped cluster starts another one and leaves the first run's logs in place."""
    from tests.conftest import _pick_port

    d = tmp_path / "cl"
    port = _pick_port(1) + 100
    cmd = ["bash", str(REPO / "scripts" / "local-cluster.sh")]
    opts = ["--dir", str(d), "--port", str(port), "--nodes", "1", "--other-nodes", "0", "--no-controller",
            "--no-agents"]
    runs = []
    try:
        for _ in range(2):
            p = subprocess.run(cmd + ["up"] + opts, capture_output=True, text=True, timeout=120, check=False)
            assert p.returncode == 0, p.stderr[-2000:]
            link = d / "log"
            assert link.is_symlink() and (link / "slurmctld.log").is_file()
            runs.append(link.resolve())
            subprocess.run(cmd + ["down", "--dir", str(d)], capture_output=True, timeout=120, check=False)
            time.sleep(1.1)  # run directories are named by the second
    finally:
        subprocess.run(cmd + ["down", "--dir", str(d)], capture_output=True, timeout=120, check=False)
    assert runs[0] != runs[1] and runs[0].parent.parent == runs[1].parent.parent == d / "runs"
    assert (runs[0] / "slurmctld.log").stat().st_size > 0  # the first run's logs are kept


# --------------------------------------------------------------------------- agents / preemption
def _train_job(cluster, steps: int, sleep: float, gpus: int = 2) -> int:
    py = sys.executable
    script = f"{py} {REPO}/scripts/examples/train_mlp.py --total-steps {steps} --step-sleep {sleep} --report-every 2 --threads 1"
    return cluster.sbatch(script, gpus, comment="rlsched:model=MoE,samples=100000", extra=["--requeue"])


def _events(cluster, jid: int) -> list[dict]:
    out = []
    for line in (cluster.jobs_dir / f"{jid}.out").read_text().splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def _diagnose(cluster, jid: int, ctl: Controller | None = None) -> str:
    """Job record, its output and the controller's last round, for failure messages."""
    out = cluster.jobs_dir / f"{jid}.out"
    text = out.read_text()[-3000:] if out.exists() else "(no output file)"
    show = cluster.run(["scontrol", "-o", "show", "job", str(jid)], check=False).stdout
    last = ctl.last if ctl is not None else None
    return f"\n--- scontrol: {show}\n--- output:\n{text}\n--- last round: {last}\n--- journal: {ctl.journal.data if ctl else None}"


def _agent_step(ctl: Controller, jid: int) -> int:
    return int((ctl.preempter.stats().get(str(jid)) or {}).get("step") or 0)


def _reporting_job(cluster, tmp_path, steps: int) -> tuple[Controller, int, int]:
    """A controller and a training job running under it that its node agent has seen report progress;
    returns ``(controller, job id, pid of that agent)``. Skips without node agents."""
    if not cluster.agents:
        pytest.skip("no `rlsched agent` command: node agents not available")
    ctl = _controller(cluster, tmp_path)
    jid = _train_job(cluster, steps=steps, sleep=0.15)
    cluster.wait(lambda: _state(cluster, jid) == "RUNNING", 30, "job to start", tick=ctl.round)
    cluster.wait(lambda: _agent_step(ctl, jid) > 0, 60, "progress reports")
    node = cluster.job(jid).nodes[0]
    apid = cluster.pid(f"agent-{node}")
    assert apid is not None, f"the agent of {node} is not the process its pid file names"
    return ctl, jid, apid


def test_killed_agent_does_not_lose_the_job(live_cluster, tmp_path):
    cluster = live_cluster
    ctl, jid, apid = _reporting_job(cluster, tmp_path, steps=60)
    os.kill(apid, signal.SIGKILL)
    try:
        (Path(ctl.cfg.controller.state_dir) / "requests").mkdir(parents=True, exist_ok=True)
        (Path(ctl.cfg.controller.state_dir) / "requests" / f"preempt-{jid}").write_text("")
        rep = ctl.round()
        assert rep.ok and rep.preempted == []  # no agent, no checkpoint: no preemption
        assert ctl.metrics.value("rlsched_preemptions_total", outcome="failed") == 1
        assert _state(cluster, jid) == "RUNNING"
        cluster.wait(lambda: _state(cluster, jid) == "COMPLETED", 90, "job to finish without its agent", tick=ctl.round, step=1.0)
    finally:
        cluster.script("up")  # restarts the killed agent
    done = [e for e in _events(cluster, jid) if e.get("event") == "done"]
    assert done and done[-1]["final_step"] == 60
    assert cluster.job(jid).restarts == 0


def test_stopped_agent_does_not_hold_up_the_round(live_cluster, tmp_path):
    """A stopped (SIGSTOP) agent does not hold each round for preempt_timeout_s + agents.timeout_s per
    victim: the round's stats call finds it unreachable (agents.timeout_s, 5 s here) and the preemption
    fails fast: no Preempt waits on it; the job keeps running and is no victim for a while."""
    cluster = live_cluster
    ctl, jid, apid = _reporting_job(cluster, tmp_path, steps=200)
    os.kill(apid, signal.SIGSTOP)
    try:
        reqs = Path(ctl.cfg.controller.state_dir) / "requests"
        reqs.mkdir(parents=True, exist_ok=True)
        (reqs / f"preempt-{jid}").write_text("")
        t = time.monotonic()
        rep = ctl.round()
        took = time.monotonic() - t
        assert rep.ok and rep.preempted == [], rep
        assert took < ctl.cfg.agents.timeout_s + 5.0, took  # was >= preempt_timeout_s (60 s) + 5 s
        assert ctl.metrics.value("rlsched_preemptions_total", outcome="failed") == 1
        assert _state(cluster, jid) == "RUNNING"
    finally:
        os.kill(apid, signal.SIGCONT)


def test_preemption_round_trip_resumes_and_finishes_exactly(live_cluster, tmp_path):
    cluster = live_cluster
    if not cluster.agents:
        pytest.skip("no `rlsched agent` command: node agents not available")
    total = 80
    ctl = _controller(cluster, tmp_path)
    jid = _train_job(cluster, steps=total, sleep=0.15)
    cluster.wait(lambda: _state(cluster, jid) == "RUNNING", 30, "job to start", tick=ctl.round)
    cluster.wait(lambda: _agent_step(ctl, jid) >= 10, 60, "10 steps")
    reqs = Path(ctl.cfg.controller.state_dir) / "requests"
    reqs.mkdir(parents=True, exist_ok=True)
    (reqs / f"preempt-{jid}").write_text("")
    rep = ctl.round()
    assert rep.ok and rep.preempted == [jid], rep
    step = ctl.journal["progress"][str(jid)]["step"]
    assert 0 < step < total
    ckpts = list((cluster.dir / "checkpoints").rglob("*"))
    assert any(f"{step:012d}" in p.name for p in ckpts), ckpts
    try:
        cluster.wait(lambda: cluster.job(jid).restarts == 1, 20, "requeue")
        cluster.wait(lambda: _state(cluster, jid) == "COMPLETED", 120, "resumed job to finish", tick=ctl.round, step=1.0)
    except AssertionError as exc:
        raise AssertionError(str(exc) + _diagnose(cluster, jid, ctl)) from None
    assert cluster.job(jid).restarts == 1
    ev = _events(cluster, jid)
    starts = [e for e in ev if e.get("event") == "start"]
    assert [s["start_step"] for s in starts] == [0, step], starts
    done = [e for e in ev if e.get("event") == "done"]
    assert done[-1]["final_step"] == total and done[-1]["start_step"] == step
    assert done[-1]["steps_this_run"] == total - step
    assert ctl.metrics.value("rlsched_preemptions_total", outcome="ok") == 1
