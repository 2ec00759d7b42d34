"""The ordered heuristics (``fifo``, ``srtf``, ``las``, ``greedy``, ...) on jobs that declare CPUs and memory:
they place a job only where its workers' (and parameter servers') CPUs and memory fit, so every decision they
make passes the validator's CPU / memory rule (policies/validate.py), and they run DL2's and Chic's elastic
traces to the end."""

from __future__ import annotations

import numpy as np
import pytest

from policies.cluster import ClusterSpec, NodeSpec, Placement
from policies.heuristics import cpu_mem_room
from policies.perf import ContentionModel
from policies.registry import make_policy
from policies.resources import ResourceDemand as RD
from policies.state import ClusterState, JobInfo
from policies.validate import check_decision

P = Placement.of

#: 3 nodes x 4 GPUs, 8 CPUs and 32 GB each
CLUSTER = ClusterSpec(tuple(NodeSpec(f"n{i}", 4, cpus=8, mem_gb=32.0) for i in range(3)))


def _job(jid: str, gpus: int, demand: RD | None, placement: dict | None = None, submit: float = 0.0,
         total: float = 1000.0) -> JobInfo:
    """A job of ``total`` samples (1 sample/s alone); running since time 0 when ``placement`` is given."""
    return JobInfo(jid, "MoE", gpus, submit, total, placement=P(placement) if placement else None,
                   demand=demand, start_time=0.0 if placement else None)


@pytest.mark.parametrize(
    "name, demand, free_cpus, free_mem, want",
    [
        ("plain GPUs: unchanged", RD(2), [8, 8, 8], [32.0, 32.0, 32.0], [4, 2, 0]),
        ("4 CPUs a GPU", RD(2, cpus_per_gpu=4), [8, 4, 8], [32.0, 32.0, 32.0], [2, 1, 0]),
        ("10 GB a GPU", RD(2, mem_gb_per_gpu=10.0), [8, 8, 8], [32.0, 5.0, 32.0], [3, 0, 0]),
        ("a PS's share: 1 worker + 1 PS of 4 CPUs", RD(1, cpus_per_gpu=4, ps=1, ps_cpus=4), [8, 7, 8],
         [32.0, 32.0, 32.0], [1, 0, 0]),
        ("a node without limits", RD(2, cpus_per_gpu=4), [None, 0, 8], [None, 32.0, 32.0], [4, 0, 0]),
        ("overdrawn node counts as none", RD(1, cpus_per_gpu=1), [-2, 8, 8], [32.0, 32.0, 32.0], [0, 2, 0]),
    ],
)
def test_cpu_mem_room(name, demand, free_cpus, free_mem, want) -> None:
    free = np.array([4, 2, 0])
    got = cpu_mem_room(demand, free, free_cpus, free_mem)
    assert got.tolist() == want, name
    assert free.tolist() == [4, 2, 0]  # not changed in place


def _state(pending: list[JobInfo], running: list[JobInfo] = ()) -> ClusterState:
    free = np.full(3, 4)
    for j in running:
        for n, c in j.placement.alloc:
            free[n] -= c
    return ClusterState(1e4, CLUSTER, free, list(running), pending)


# node 0 holds a job of 2 GPUs and 8 CPUs: 2 GPUs free there, no CPUs
_CPU_HOG = _job("hog", 2, RD(2, cpus_per_gpu=4), {0: 2})


@pytest.mark.parametrize("policy", ["fifo", "srtf", "las", "greedy", "sjf", "srtf:spread", "las:nosplit", "lrf"])
@pytest.mark.parametrize(
    "case, pending, running, want",
    [
        # one waiting job (the heuristics' one-job path): pack would take node 0's 2 free GPUs
        ("one job, node 0 has GPUs but no CPUs", [_job("a", 2, RD(2, cpus_per_gpu=2))], [_CPU_HOG],
         {"a": {1, 2}}),
        # two jobs in one round, 8 CPUs each: together they take all of nodes 1 and 2's CPUs
        ("two jobs share the round's CPUs", [_job("a", 2, RD(2, cpus_per_gpu=4), submit=1.0),
                                             _job("b", 2, RD(2, cpus_per_gpu=4), submit=2.0)], [_CPU_HOG],
         {"a": {1, 2}, "b": {1, 2}}),
        # memory alone: nodes 0 and 1 have 3 GPUs but 8 GB free, too little for one GPU of 12 GB
        ("memory", [_job("m", 2, RD(2, mem_gb_per_gpu=12.0))],
         [_job("h0", 1, RD(1, mem_gb_per_gpu=24.0), {0: 1}), _job("h1", 1, RD(1, mem_gb_per_gpu=24.0), {1: 1})],
         {"m": {2}}),
    ],
)
def test_heuristics_respect_cpus_and_memory(policy, case, pending, running, want) -> None:
    state = _state(pending, running)
    pol = make_policy(policy, CLUSTER, ContentionModel(CLUSTER))
    dec = pol.schedule(state)
    assert check_decision(state, dec) == [], case
    placed = dict(dec.place)
    assert set(placed) == set(want), case
    for jid, nodes in want.items():
        assert set(placed[jid].nodes) <= nodes, (case, placed[jid])


def test_a_job_that_fits_nowhere_waits() -> None:
    # every node has GPUs but at most 6 free CPUs; the job's one worker and PS need 8 on one node
    running = [_job(f"r{i}", 1, RD(1, cpus_per_gpu=2), {i: 1}) for i in range(3)]
    state = _state([_job("ps", 1, RD(1, cpus_per_gpu=4, ps=1, ps_cpus=4))], running)
    for policy in ("fifo", "srtf", "greedy"):
        assert make_policy(policy, CLUSTER, ContentionModel(CLUSTER)).schedule(state).place == [], policy


def test_preemption_frees_the_cpus_it_needs() -> None:
    # Node 0 runs a long plain job on 2 of its 4 GPUs and a long job holding all 8 of its CPUs on the other 2;
    # nodes 1 and 2 are full of plain short jobs. The waiting short job (2 GPUs, 4 CPUs a GPU) fits only
    # on node 0, and only once the CPU holder is preempted: freeing GPUs alone (the plain job) is not enough.
    running = [
        _job("plain", 2, None, {0: 2}, total=1e9),
        _job("cpu", 2, RD(2, cpus_per_gpu=4), {0: 2}, total=1e8),
        _job("s1", 4, None, {1: 4}, total=1e4 + 5),
        _job("s2", 4, None, {2: 4}, total=1e4 + 5),
    ]
    short = JobInfo("short", "MoE", 2, 50.0, 10.0, demand=RD(2, cpus_per_gpu=4))
    state = _state([short], running)
    dec = make_policy("srtf", CLUSTER, ContentionModel(CLUSTER)).schedule(state)
    assert check_decision(state, dec) == []
    assert dict(dec.place)["short"].nodes == (0,)
    assert "cpu" in dec.preempt  # the GPUs the plain job frees would not have given it CPUs


@pytest.mark.parametrize("setting, cluster_file", [("dl2", "data/clusters/dl2.yaml"), ("chic", "data/clusters/chic.yaml")])
def test_heuristics_run_elastic_traces(tmp_path, setting, cluster_file) -> None:
    """On DL2's setting (2 GPUs and 8 CPUs a node; one worker and one PS need 8 CPUs) a GPU-only placement
    puts a second job on a node whose CPUs the first took; the simulator refuses such a decision. The
    heuristics run the whole trace, every job to the end."""
    from policies.psmodel import PSPerformanceModel
    from trainer.elastic import generate, read_elastic_trace, write_trace
    from trainer.simulator import SimConfig, Simulator

    path = tmp_path / "t.json"
    write_trace(generate(setting, seed=4, jobs=30), path)
    cluster = ClusterSpec.parse(cluster_file)
    jobs = read_elastic_trace(path)
    perf = PSPerformanceModel(ContentionModel(cluster))
    assert any(j.demand is not None and j.demand.declares_cpu_mem for j in jobs)
    for name in ("fifo", "srtf", "las", "greedy"):
        res = Simulator(cluster, jobs, make_policy(name, cluster, perf), perf, SimConfig(check_invariants=True)).run()
        assert len(res.jobs) == 30 and all(r.finish_time > r.submit_time for r in res.jobs), name
