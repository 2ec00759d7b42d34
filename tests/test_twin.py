"""The digital twin (``trainer/twin.py``, ``rlsched twin``): the controller daemon's own rounds over the
simulator give the per-job results of ``rlsched simulate``; the simulated Slurm behaves as the controller
expects Slurm to; the command writes simulate's outputs plus the controller's state dir and refuses bad input."""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from controller.state import parse_comment
from policies.cluster import ClusterSpec, Placement
from policies.job import JobSpec
from policies.perf import ContentionModel
from rlsched.cli import main
from trainer import report
from trainer.cli_sim import build_policy
from trainer.simulator import SimConfig, Simulator
from trainer.traces import load_trace
from trainer.twin import EPOCH, MIN_JOB_AGE_S, SimulatedAgents, SimulatedSlurm, Twin, TwinError, cons_tres_split

REPO = Path(__file__).resolve().parents[1]
TRACE0 = REPO / "data" / "traces" / "deepshare" / "simulate" / "trace0.json"
POISSON = REPO / "tests" / "golden" / "poisson-16x8.csv"
HEAVY = REPO / "tests" / "golden" / "heavy-4x8.csv"


def _simulate(cluster: ClusterSpec, jobs, policy: str, cfg: SimConfig | None = None):
    perf = ContentionModel(cluster)
    return Simulator(cluster, jobs, build_policy(policy, cluster, perf), perf, cfg or SimConfig()).run()


def _assert_same_jobs(sim, twin) -> None:
    """Per job: first start and finish time (relative 1e-6), node count and preemptions equal."""
    assert [r.job_id for r in twin.jobs] == [r.job_id for r in sim.jobs]
    for s, t in zip(sim.jobs, twin.jobs):
        assert math.isclose(t.first_start, s.first_start, rel_tol=1e-6, abs_tol=1e-6), (s, t)
        assert math.isclose(t.finish_time, s.finish_time, rel_tol=1e-6), (s, t)
        assert (t.num_nodes, t.preemptions) == (s.num_nodes, s.preemptions), (s, t)


@pytest.fixture
def state_path(tmp_path):
    """Where the controller's state dir goes: in memory (``/dev/shm``) when there is one, as ``rlsched twin``
    keeps it (the journal is synced at every release and preemption), else ``tmp_path``."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK | os.X_OK)):
        yield tmp_path
        return
    d = Path(tempfile.mkdtemp(prefix="rlsched-twin-test-", dir=shm))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _twin(path: Path, cluster: ClusterSpec, jobs, policy: str, cfg: SimConfig | None = None, **kw) -> Twin:
    return Twin(cluster, jobs, policy, path / "ctl", cfg or SimConfig(), log_file=path / "ctl.log", **kw)


# --------------------------------------------------------------------------- twin == simulate
@pytest.mark.slow
@pytest.mark.parametrize("policy", ["fifo", "srtf", "las", "greedy", "rl-hybrid"])
def test_twin_agrees_with_simulate_on_the_deepshare_trace(state_path, policy):
    cluster = ClusterSpec.parse("4x8")
    jobs = load_trace(TRACE0, cluster=cluster)
    sim = _simulate(cluster, jobs, policy)
    twin = _twin(state_path, cluster, jobs, policy)
    res = twin.run()
    _assert_same_jobs(sim, res)
    ctl = res.meta["controller"]
    # every job went through the controller's release protocol (and LAS's preemptions through its agents)
    assert ctl["placements"] == len(jobs) + sim.preemptions and ctl["preemptions"] == sim.preemptions
    assert ctl["rounds"] == sim.rounds and ctl["rejected_placements"] == ctl["placement_mismatches"] == 0
    if policy == "las":
        assert sim.preemptions > 0
    journal = json.loads((state_path / "ctl" / "journal.json").read_text())
    assert journal["released"] == {} and journal["preempting"] == {}


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["fifo", "srtf", "las", "greedy", "srtf-np:spread"])
def test_twin_agrees_with_simulate_on_poisson_arrivals(state_path, policy):
    cluster = ClusterSpec.parse("16x8")
    jobs = load_trace(POISSON, cluster=cluster)
    assert len({j.submit_time for j in jobs}) > 100  # arrivals spread over time
    _assert_same_jobs(_simulate(cluster, jobs, policy), _twin(state_path, cluster, jobs, policy).run())


@pytest.mark.parametrize("policy,cfg", [
    ("las", SimConfig(noise_cv=0.3, seed=3, restart_overhead=100.0)),
    ("fifo", SimConfig(event_triggered=False, round_len=600.0)),
    ("greedy", SimConfig(round_len=60.0, restart_overhead=0.0)),
])
def test_twin_agrees_with_simulate_under_other_simulator_knobs(state_path, policy, cfg):
    """Noise (the agents report the noisy throughput), restart overhead, round length, no event trigger."""
    cluster = ClusterSpec.parse("4x8")
    jobs = load_trace(HEAVY, cluster=cluster)[:40]
    sim = _simulate(cluster, jobs, policy, cfg)
    res = _twin(state_path, cluster, jobs, policy, cfg).run()
    _assert_same_jobs(sim, res)
    assert res.rounds == sim.rounds


@pytest.mark.parametrize("policy", ["las", "greedy"])
def test_twin_agrees_with_simulate_on_a_cluster_of_two_gpu_types(state_path, policy):
    """sinfo carries each node's GRES type, CPUs and memory: the controller prices the nodes as the simulator."""
    cluster = ClusterSpec.parse(str(REPO / "slurm_conf" / "cluster-two-types.yaml"))
    assert {n.gpu_type for n in cluster.nodes} == {"v100", "k80"}
    jobs = load_trace(HEAVY, cluster=cluster)[:48]
    _assert_same_jobs(_simulate(cluster, jobs, policy), _twin(state_path, cluster, jobs, policy).run())


def test_a_node_speed_slurm_cannot_carry_stops_the_twin(state_path, tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("nodes:\n  - {name: n, gpus: 8, count: 2, gpu_type: a100, gpu_speed: 2.5}\n")
    cluster = ClusterSpec.parse(str(f))
    perf = ContentionModel(cluster)
    tw = _twin(state_path, cluster, [_job(perf, "a", 4, 1.0)], "fifo")
    with pytest.raises(TwinError, match="node n1: the controller, reading it from Slurm, sees .*gpu_speed=1.0"):
        tw.run()


# --------------------------------------------------------------------------- the simulated Slurm and agents
def _job(perf: ContentionModel, jid: str, gpus: int, hours: float, t: float = 0.0, model: str = "MobileNetV3") -> JobSpec:
    return JobSpec(jid, t, model, gpus, hours * 3600 * perf.best_isolated_throughput(model, gpus))


def test_simulated_slurm_shows_jobs_as_job_submit_lua_leaves_them_and_acts_like_scontrol():
    cluster = ClusterSpec.parse("2x8")
    perf = ContentionModel(cluster)
    jobs = [_job(perf, "x", 4, 1.0, t=10.0), _job(perf, "b", 4, 1.0), _job(perf, "a", 12, 2.0)]
    sim = Simulator(cluster, jobs, None, perf)
    slurm = SimulatedSlurm(sim, jobs, split="fill")
    # ids of one width in (submit time, trace id) order: the tie order of both backends
    assert slurm.slurm_id == {"a": 10, "b": 11, "x": 12}
    assert slurm.jobs() == []  # nothing has arrived
    sim.advance_to_next_event()  # a and b arrive at t=0
    held = {j.job_id: j for j in slurm.jobs()}
    assert sorted(held) == [10, 11]
    a = held[10]
    assert a.managed and a.held and not a.admin_held and a.gpus == 12 and a.partition == "gpu"
    assert a.submit_time == EPOCH and a.restarts == 0
    req = parse_comment(a.comment)
    assert (req.model, req.samples, req.problem) == ("MobileNetV3", jobs[2].total_samples, None)
    assert [n.gpus_used for n in slurm.nodes()] == [0, 0]
    # scontrol update + release: cons_tres's split of 12 GPUs over both nodes, TresPerNode exactly
    slurm.place(10, ["node2", "node1"], 12, per_node=6)
    slurm.release(10)
    run = {j.job_id: j for j in slurm.jobs()}[10]
    assert run.state == "RUNNING" and run.gpus_per_node == {"node1": 6, "node2": 6} and run.start_time == EPOCH
    assert [(n.gpus_used, n.state) for n in slurm.nodes()] == [(6, "mixed"), (6, "mixed")]
    from controller.slurm import SlurmError

    with pytest.raises(SlurmError, match="no longer pending"):
        slurm.place(10, ["node1"], 12)
    with pytest.raises(SlurmError, match="not held"):
        slurm.release(10)
    # a job that does not fit waits released (Resources), then starts once it fits
    slurm.place(11, ["node1"], 4)
    slurm.release(11)
    assert slurm.waiting() and slurm.waited == 1
    b = {j.job_id: j for j in slurm.jobs()}[11]
    assert b.pending and not b.held and b.reason == "Resources" and b.required_nodes == ["node1"]
    slurm.requeue_hold(10)  # stops it (progress kept) and holds it: b's node has room now
    now = {j.job_id: j for j in slurm.jobs()}
    assert now[10].held and now[10].restarts == 1
    assert now[11].state == "RUNNING" and now[11].gpus_per_node == {"node1": 4}
    assert not slurm.waiting()


def test_finished_jobs_show_completed_until_min_job_age():
    cluster = ClusterSpec.parse("1x8")
    perf = ContentionModel(cluster)
    jobs = [_job(perf, "a", 8, 1.0), _job(perf, "late", 8, 1.0, t=7200.0 + 2 * MIN_JOB_AGE_S)]
    sim = Simulator(cluster, jobs, None, perf)
    slurm = SimulatedSlurm(sim, jobs, split="fill")
    sim.advance_to_next_event()
    slurm.place(10, ["node1"], 8)
    slurm.release(10)
    sim.advance_to_next_event()  # a completes at 3600 s
    assert sim.time == pytest.approx(3600.0)
    assert [(j.job_id, j.state) for j in slurm.jobs()] == [(10, "COMPLETED")]
    sim.advance_to_next_event(until=3600.0 + MIN_JOB_AGE_S)
    assert slurm.jobs() == [] and slurm.job(10) is None  # purged, as Slurm does after MinJobAge


def test_simulated_agents_report_progress_and_checkpoint_by_preempting():
    cluster = ClusterSpec.parse("2x8")
    perf = ContentionModel(cluster)
    jobs = [_job(perf, "a", 16, 1.0, model="Transformer-XL")]
    sim = Simulator(cluster, jobs, None, perf)
    slurm = SimulatedSlurm(sim, jobs, split="fill")
    agents = SimulatedAgents(sim, slurm)
    sim.advance_to_next_event()
    sim.start("a", Placement.of({0: 8, 1: 8}))
    sim.advance_to_next_event(until=600.0)
    st = agents.stats()["10"]
    info = sim.state().running[0]
    assert st["step"] == info.done_samples > 0 and st["total_steps"] == jobs[0].total_samples
    assert st["samples_per_s"] == info.achieved_thp and st["isolated_samples_per_s"] == info.isolated_thp
    assert agents.stats(job_nodes={}) == {}  # only jobs Slurm runs on the agents' nodes
    out = agents.checkpoint(slurm.job(10), 60.0)
    assert out.ok and out.reached_agent and out.checkpoint_step == pytest.approx(st["step"])
    assert agents.preempted_step("10", ["node1"]) == out.checkpoint_step
    assert sim.state().running == [] and sim.state().pending[0].done_samples == out.checkpoint_step
    assert not agents.checkpoint(slurm.job(10), 60.0).ok  # not running any more


@pytest.mark.parametrize("nodes,gpus,free,per_node,want", [
    ([0], 4, [8, 8], None, {0: 4}),
    ([1, 0], 12, [8, 8], 6, {0: 6, 1: 6}),
    ([0, 1], 10, [4, 8], None, {0: 4, 1: 6}),  # one each, then node order: node 0 takes all it has
    ([0, 1], 10, [8, 8], None, {0: 8, 1: 2}),
    ([0, 2], 3, [8, 0, 1], None, {0: 2, 2: 1}),
    ([0, 1], 12, [8, 3], None, None),  # does not fit
    ([0, 1], 1, [8, 8], None, None),  # fewer GPUs than nodes
    ([0, 1], 12, [8, 5], 6, None),
])
def test_cons_tres_split(nodes, gpus, free, per_node, want):
    assert cons_tres_split(nodes, gpus, free, per_node) == want


def test_unbalanced_plans_cons_tres_cannot_honour(state_path):
    """pack plans b = {node1: 2, node2: 8} beside a on node1 (4 free there): cons_tres fills node1 first
    and gives {node1: 4, node2: 6}, so c, planned on node1's last 2 GPUs, cannot start. With the "plan"
    split the twin gives each job its plan (as simulate assumes) and counts b as inexact; with "fill"
    the controller sees the mismatch, holds c back after its start grace and places it elsewhere."""
    cluster = ClusterSpec.parse("3x8")
    perf = ContentionModel(cluster)
    jobs = [_job(perf, "a", 4, 10.0), _job(perf, "b", 10, 1.0), _job(perf, "c", 2, 1.0)]
    sim = _simulate(cluster, jobs, "fifo")
    plan = _twin(state_path / "plan", cluster, jobs, "fifo").run()
    _assert_same_jobs(sim, plan)
    assert plan.meta["controller"]["inexact_splits"] == 1 and plan.meta["controller"]["placement_mismatches"] == 0
    fill = _twin(state_path / "fill", cluster, jobs, "fifo", split="fill").run()
    ctl = fill.meta["controller"]
    assert (ctl["placement_mismatches"], ctl["held_back"], ctl["waited_for_resources"]) == (1, 1, 1)
    c = {r.job_id: r for r in fill.jobs}["c"]
    assert c.first_start == 300.0 and c.num_nodes == 1  # held back and placed again at the next round
    log = [json.loads(x) for x in (state_path / "fill" / "ctl.log").read_text().splitlines()]
    events = [(e["event"], e.get("job"), e["sim_time_s"]) for e in log if e.get("event") in ("placement_mismatch", "held_back")]
    assert events == [("placement_mismatch", 11, 300.0), ("held_back", 12, 300.0)]
    assert all(abs(e["ts"] - (EPOCH + e["sim_time_s"])) < 1e-3 for e in log)


# --------------------------------------------------------------------------- CLI
def test_cli_writes_simulates_outputs_and_the_controller_state(tmp_path, capsys):
    out = tmp_path / "runs" / "twin"
    rc = main(["twin", "--trace", str(HEAVY), "--policy", "fifo", "--cluster", "4x8", "--out", str(out)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["controller", "jobs_fifo.parquet", "summary.json", *report.PLOT_FILES])
    assert [p.name for p in out.parent.iterdir()] == ["twin"]  # no temporary directory left
    assert sorted(p.name for p in (out / "controller").iterdir()) == ["controller.log", "journal.json", "requests",
                                                                     "status.json"]
    status = json.loads((out / "controller" / "status.json").read_text())
    assert status["policy"] == "fifo" and status["last_round"]["ok"]
    doc = json.loads((out / "summary.json").read_text())
    assert doc["policies"] == ["fifo"] and doc["jobs"] == 96
    ctl = doc["twin"]["controller"]["fifo"]
    assert ctl["placements"] == 96 and ctl["rounds"] == doc["summaries"]["fifo"]["rounds"] > 0
    settings = doc["twin"]["controller_settings"]["fifo"]
    assert settings["min_run_s"] == 300.0 and settings["requeue_settle_s"] == 0.0
    assert "Avg JCT (h)" in captured.out and "Ran the controller" in captured.out
    # the same per-job results as `rlsched simulate` on the same trace, policy and cluster
    sim_out = tmp_path / "sim"
    assert main(["simulate", "--trace", str(HEAVY), "--policy", "fifo", "--cluster", "4x8", "--out", str(sim_out),
                 "--quiet"]) == 0
    a = pq.read_table(sim_out / "jobs_fifo.parquet").to_pylist()
    b = pq.read_table(out / "jobs_fifo.parquet").to_pylist()
    assert [r["job_id"] for r in a] == [r["job_id"] for r in b]
    for x, y in zip(a, b):
        assert (x["num_nodes"], x["preemptions"]) == (y["num_nodes"], y["preemptions"])
        assert math.isclose(x["finish_time"], y["finish_time"], rel_tol=1e-6)
        assert math.isclose(x["first_start"], y["first_start"], rel_tol=1e-6, abs_tol=1e-6)
    assert doc["summaries"]["fifo"]["avg_jct_s"] == pytest.approx(
        json.loads((sim_out / "summary.json").read_text())["summaries"]["fifo"]["avg_jct_s"], rel=1e-9)


def test_cli_contention_rule_is_the_simulated_clusters(tmp_path, capsys):
    """``twin --contention ds-min`` simulates the cluster under that rule: recorded, and the per-job results
    equal ``simulate --contention ds-min`` (FIFO's decisions do not read contention)."""
    out, sim_out = tmp_path / "twin", tmp_path / "sim"
    common = ["--trace", str(HEAVY), "--policy", "fifo", "--cluster", "4x8", "--quiet", "--contention", "ds-min"]
    assert main(["twin", *common, "--out", str(out)]) == 0, capsys.readouterr().err
    assert main(["simulate", *common, "--out", str(sim_out)]) == 0, capsys.readouterr().err
    doc = json.loads((out / "summary.json").read_text())
    assert doc["config"]["contention"] == "ds-min"
    a = pq.read_table(sim_out / "jobs_fifo.parquet").to_pylist()
    b = pq.read_table(out / "jobs_fifo.parquet").to_pylist()
    for x, y in zip(a, b, strict=True):
        assert math.isclose(x["finish_time"], y["finish_time"], rel_tol=1e-6)


@pytest.mark.slow
def test_cli_several_policies_and_overwrite(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["twin", "--trace", str(HEAVY), "--cluster", "4x8", "--out", str(out), "--quiet"]
    assert main([*argv, "--policy", "fifo,sjf"]) == 0
    assert sorted(p.name for p in (out / "controller").iterdir()) == ["fifo", "sjf"]
    assert (out / "controller" / "sjf" / "journal.json").exists()
    assert main([*argv, "--policy", "fifo"]) == 2  # not empty
    assert "not empty" in capsys.readouterr().err
    assert main([*argv, "--policy", "srtf", "--overwrite"]) == 0  # replaces its own earlier output
    assert (out / "jobs_srtf.parquet").exists() and not (out / "jobs_fifo.parquet").exists()
    (out / "notes.md").write_text("mine")
    assert main([*argv, "--policy", "srtf", "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "holds 'notes.md', which twin did not write" in err and len(err.strip().splitlines()) == 1
    assert (out / "notes.md").read_text() == "mine"
    # a simulate output is not a twin output
    sim = tmp_path / "sim"
    assert main(["simulate", "--trace", str(HEAVY), "--policy", "fifo", "--out", str(sim), "--quiet"]) == 0
    assert main([*argv[:-3], "--out", str(sim), "--quiet", "--policy", "fifo", "--overwrite"]) == 2
    assert "no twin summary.json" in capsys.readouterr().err


@pytest.mark.parametrize("extra,needle", [
    (["--policy", "nope"], "unknown policy 'nope'"),
    (["--policy", "fifo,fifo"], "listed twice"),
    (["--cluster", "0x8"], "both numbers must be >= 1"),
    (["--cluster", "1x4"], "row 2"),
    (["--trace", "/nonexistent/trace.csv"], "nonexistent"),
    (["--policy", "rl-hybrid:/nonexistent/ckpt"], "nonexistent"),
])
def test_bad_input_is_one_line_exit_2_and_no_output(tmp_path, capsys, extra, needle):
    out = tmp_path / "out"
    argv = ["twin", "--trace", str(HEAVY), "--cluster", "4x8", "--policy", "fifo", "--out", str(out), "--quiet"]
    rc = main([*argv, *extra])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert needle in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("extra", [["--slurm-split", "exact"], ["--round", "0"], ["--seed", "-1"],
                                   ["--contention", "max"]])
def test_bad_options_are_refused_by_the_parser(tmp_path, capsys, extra):
    with pytest.raises(SystemExit) as exc:
        main(["twin", "--trace", str(HEAVY), "--out", str(tmp_path / "o"), *extra])
    assert exc.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_a_failed_controller_round_stops_the_twin_with_one_line(tmp_path, capsys, monkeypatch):
    from controller.slurm import SlurmError
    from trainer import twin

    def down(self):
        raise SlurmError(["sinfo", "--json"], "exit status 1: Unable to contact slurm controller")

    monkeypatch.setattr(twin.SimulatedSlurm, "nodes", down)
    out = tmp_path / "out"
    rc = main(["twin", "--trace", str(HEAVY), "--policy", "fifo", "--out", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 1 and len(err.strip().splitlines()) == 1, err
    assert "controller round at t=0 s failed (slurm)" in err and "Unable to contact" in err
    assert list(tmp_path.iterdir()) == []


def test_the_controller_log_goes_only_to_the_twin_log_while_it_runs(state_path):
    import logging

    cluster = ClusterSpec.parse("1x8")
    perf = ContentionModel(cluster)
    jobs = [_job(perf, "a", 8, 1.0), _job(perf, "b", 8, 1.0)]
    logger = logging.getLogger("controller")
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record)

    mine = Keep()
    logger.addHandler(mine)
    try:
        tw = _twin(state_path, cluster, jobs, "fifo")
        res = tw.run()
        assert [r.finish_time for r in res.jobs] == pytest.approx([3600.0, 7200.0])
        assert seen == [] and mine in logger.handlers  # none reached it during the run; it is back after
        placed = [json.loads(x) for x in (state_path / "ctl.log").read_text().splitlines() if '"placed"' in x]
        assert [(e["job"], e["sim_time_s"]) for e in placed] == [(10, 0.0), (11, pytest.approx(3600.0))]
        with pytest.raises(RuntimeError, match="once"):
            tw.run()
    finally:
        logger.removeHandler(mine)
