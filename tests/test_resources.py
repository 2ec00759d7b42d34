"""policies.resources (ResourceDemand, Allocation, the CPU/memory/type fit check), JobSpec.demand, and
GPU types end to end: a two-type cluster file through the simulator and ``rlsched simulate``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from policies.cluster import ClusterSpec, NodeSpec, Placement
from policies.job import JobSpec
from policies.perf import ContentionModel
from policies.resources import (
    PS,
    WORKER,
    Allocation,
    NodeShare,
    ResourceDemand,
    ResourceError,
    free_cpu_mem,
    placement_misfit,
)

REPO = Path(__file__).resolve().parents[1]
TRACE0 = REPO / "data" / "traces" / "deepshare" / "simulate" / "trace0.json"
TWO_TYPES = REPO / "slurm_conf" / "cluster-two-types.yaml"


def _cluster() -> ClusterSpec:
    """node0: 8 V100, 32 CPUs, 256 GB; node1: 8 K80, 16 CPUs, 64 GB; node2: 4 GPUs, nothing declared."""
    return ClusterSpec((
        NodeSpec("a", 8, "v100", cpus=32, mem_gb=256.0),
        NodeSpec("b", 8, "k80", cpus=16, mem_gb=64.0),
        NodeSpec("c", 4),
    ))


# ---------------------------------------------------------------------- ResourceDemand
def test_plain_demand() -> None:
    d = ResourceDemand(4)
    assert (d.gpus, d.gpu_type, d.ps, d.min_gpus, d.max_gpus) == (4, None, 0, None, None)
    assert not d.is_elastic and not d.declares_cpu_mem
    assert list(d.gpu_counts()) == [4] and d.total_cpus == 0 and d.total_mem_gb == 0


def test_full_demand_totals_and_elastic_range() -> None:
    d = ResourceDemand(4, "v100", cpus_per_gpu=6, mem_gb_per_gpu=32.0, ps=2, ps_cpus=4, ps_mem_gb=16.0,
                       min_gpus=2, max_gpus=8)
    assert d.is_elastic and d.declares_cpu_mem
    assert d.total_cpus == 4 * 6 + 2 * 4 and d.total_mem_gb == 4 * 32.0 + 2 * 16.0
    assert list(d.gpu_counts()) == [2, 3, 4, 5, 6, 7, 8]
    r = d.resized(8)
    assert r.gpus == 8 and r.total_cpus == 8 * 6 + 8 and r.min_gpus == 2 and r.max_gpus == 8
    with pytest.raises(ResourceError, match=r"9 GPUs is outside the job's range 2\.\.8"):
        d.resized(9)
    with pytest.raises(ResourceError, match="outside the job's range 4..4"):
        ResourceDemand(4).resized(2)
    assert not ResourceDemand(4, min_gpus=4, max_gpus=4).is_elastic  # a range of one count


@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"gpus": 0}, "gpus must be a positive integer, got 0"),
        ({"gpus": 2.5}, "gpus must be a positive integer, got 2.5"),
        ({"gpus": True}, "gpus must be a positive integer, got True"),
        ({"gpus": 2, "gpu_type": "v 100"}, "gpu_type must be a name"),
        ({"gpus": 2, "gpu_type": ""}, "gpu_type must be a name"),
        ({"gpus": 2, "cpus_per_gpu": -1}, "cpus_per_gpu must be an integer >= 0, got -1"),
        ({"gpus": 2, "cpus_per_gpu": 1.5}, "cpus_per_gpu must be an integer >= 0"),
        ({"gpus": 2, "mem_gb_per_gpu": math.nan}, "mem_gb_per_gpu must be a finite number >= 0"),
        ({"gpus": 2, "mem_gb_per_gpu": -1.0}, "mem_gb_per_gpu must be a finite number >= 0"),
        ({"gpus": 2, "ps": -1}, "ps must be an integer >= 0"),
        ({"gpus": 2, "ps_cpus": 2}, "without parameter servers"),
        ({"gpus": 2, "ps": 1, "ps_mem_gb": math.inf}, "ps_mem_gb must be a finite number"),
        ({"gpus": 2, "min_gpus": 1}, "needs both min_gpus and max_gpus"),
        ({"gpus": 2, "min_gpus": 3, "max_gpus": 4}, "1 <= min_gpus <= gpus <= max_gpus"),
        ({"gpus": 2, "min_gpus": 0, "max_gpus": 4}, "1 <= min_gpus <= gpus <= max_gpus"),
        ({"gpus": 5, "min_gpus": 1, "max_gpus": 4}, "1 <= min_gpus <= gpus <= max_gpus"),
    ],
)
def test_bad_demands_are_one_line_errors(kw: dict, msg: str) -> None:
    with pytest.raises(ResourceError, match=msg) as err:
        ResourceDemand(**kw)
    assert "\n" not in str(err.value) and str(err.value).startswith("demand: ")


# ---------------------------------------------------------------------- JobSpec
def test_jobspec_resources() -> None:
    j = JobSpec("a", 0.0, "MoE", 4, 100.0)
    assert j.demand is None and j.resources == ResourceDemand(4)
    d = ResourceDemand(4, "k80", cpus_per_gpu=2)
    j2 = JobSpec("b", 0.0, "MoE", 4, 100.0, demand=d)
    assert j2.resources is d
    with pytest.raises(ResourceError, match=r"job 'c': demand.gpus \(8\) differs from gpu_demand \(4\)"):
        JobSpec("c", 0.0, "MoE", 4, 100.0, demand=ResourceDemand(8))
    with pytest.raises(ResourceError, match="demand must be a ResourceDemand"):
        JobSpec("d", 0.0, "MoE", 4, 100.0, demand=4)  # type: ignore[arg-type]


def test_existing_traces_load_unchanged() -> None:
    from trainer.traces import load_trace

    jobs = load_trace(TRACE0)
    assert len(jobs) == 256 and all(j.demand is None for j in jobs)
    assert all(j.resources == ResourceDemand(j.gpu_demand) for j in jobs)


# ---------------------------------------------------------------------- Allocation
def test_allocation_from_placement_workers_and_parameter_servers() -> None:
    cl = _cluster()
    d = ResourceDemand(8, cpus_per_gpu=2, mem_gb_per_gpu=8.0, ps=3, ps_cpus=1, ps_mem_gb=4.0)
    p = Placement.of({0: 4, 1: 4})
    a = Allocation.from_placement(p, d, cl, used_gpu_indices={1: [0, 2]})
    assert a.shares == (
        NodeShare(0, PS, (), 2, 8.0),  # PS 0 and 2 on the first node
        NodeShare(0, WORKER, (0, 1, 2, 3), 8, 32.0),
        NodeShare(1, PS, (), 1, 4.0),  # PS 1 on the second
        NodeShare(1, WORKER, (1, 3, 4, 5), 8, 32.0),  # the lowest indices not in use
    )
    assert a.placement == p and a.nodes == (0, 1)
    assert (a.total_gpus, a.total_cpus, a.total_mem_gb) == (8, d.total_cpus, d.total_mem_gb)
    assert a.per_node() == {0: (4, 10, 40.0), 1: (4, 9, 36.0)}
    assert a.gpu_indices() == {0: (0, 1, 2, 3), 1: (1, 3, 4, 5)}
    # a plain demand: GPU indices only
    b = Allocation.from_placement(Placement.of({2: 3}), ResourceDemand(3), cl)
    assert b.shares == (NodeShare(2, WORKER, (0, 1, 2)),) and b.placement == Placement.of({2: 3})


def test_allocation_from_placement_refusals() -> None:
    cl = _cluster()
    with pytest.raises(ResourceError, match=r"placement \{0:4\} has 4 GPUs, the demand accepts 8"):
        Allocation.from_placement(Placement.of({0: 4}), ResourceDemand(8), cl)
    elastic = ResourceDemand(4, min_gpus=2, max_gpus=6)
    assert Allocation.from_placement(Placement.of({0: 6}), elastic, cl).total_gpus == 6
    with pytest.raises(ResourceError, match="the demand accepts 2..6"):
        Allocation.from_placement(Placement.of({0: 8}), elastic, cl)
    with pytest.raises(ResourceError, match="node 3 is not in the cluster"):
        Allocation.from_placement(Placement.of({3: 2}), ResourceDemand(2), cl)
    with pytest.raises(ResourceError, match="node 2 has 1 free GPU indices, 2 needed"):
        Allocation.from_placement(Placement.of({2: 2}), ResourceDemand(2), cl, used_gpu_indices={2: [0, 1, 3]})


@pytest.mark.parametrize(
    "share, msg",
    [
        (dict(node=-1, role=WORKER, gpus=(0,)), "node must be an index >= 0"),
        (dict(node=0, role="chief", gpus=(0,)), "role must be one of worker, ps"),
        (dict(node=0, role=WORKER, gpus=()), "a worker share holds at least one GPU"),
        (dict(node=0, role=PS, gpus=(1,)), "a parameter server holds no GPU"),
        (dict(node=0, role=WORKER, gpus=(1, 0)), "ascending distinct GPU indices"),
        (dict(node=0, role=WORKER, gpus=(0, 0)), "ascending distinct GPU indices"),
        (dict(node=0, role=WORKER, gpus=[0]), "ascending distinct GPU indices"),
        (dict(node=0, role=WORKER, gpus=(0,), cpus=-2), "cpus must be an integer >= 0"),
        (dict(node=0, role=WORKER, gpus=(0,), mem_gb=math.nan), "mem_gb must be a finite number >= 0"),
    ],
)
def test_bad_node_shares(share: dict, msg: str) -> None:
    with pytest.raises(ResourceError, match=msg):
        NodeShare(**share)


def test_allocation_of_sorts_and_refuses_duplicates() -> None:
    a = Allocation.of([NodeShare(1, WORKER, (0,)), NodeShare(0, WORKER, (2,)), NodeShare(0, PS, (), 1)])
    assert [(s.node, s.role) for s in a.shares] == [(0, PS), (0, WORKER), (1, WORKER)]
    with pytest.raises(ResourceError, match="two worker shares on node 0"):
        Allocation.of([NodeShare(0, WORKER, (0,)), NodeShare(0, WORKER, (1,))])
    with pytest.raises(ResourceError, match="sorted by"):
        Allocation((NodeShare(1, WORKER, (0,)), NodeShare(0, WORKER, (0,))))


def test_allocation_fits() -> None:
    cl = _cluster()
    a = Allocation.of([NodeShare(0, WORKER, (0, 1), cpus=8, mem_gb=64.0), NodeShare(1, PS, (), cpus=16, mem_gb=64.0)])
    assert a.fits(cl) and a.misfit(cl) is None
    assert a.misfit(cl, free_gpus=[1, 8, 4]) == "node 0 (a): 2 GPUs needed, 1 free"
    assert a.misfit(cl, free_cpus=[32, 15, None]) == "node 1 (b): 16 CPUs needed, 15 free"
    assert a.misfit(cl, free_mem_gb=[63.5, 64.0, None]) == "node 0 (a): 64 GB of memory needed, 63.5 GB free"
    assert a.misfit(cl, used_gpu_indices={0: [1, 5]}) == "node 0 (a): GPUs [1] are in use"
    big = Allocation.of([NodeShare(2, WORKER, (3, 4))])
    assert big.misfit(cl) == "node 2 (c): GPU index 4 does not exist (the node has 4 GPUs)"
    # node 2 declares no CPUs or memory: never a constraint there
    assert Allocation.of([NodeShare(2, WORKER, (0,), cpus=1000, mem_gb=1e6)]).fits(cl)
    # a None entry of free_cpus: not checked either
    assert a.fits(cl, free_cpus=[None, None, None])
    assert Allocation.of([NodeShare(5, WORKER, (0,))]).misfit(cl) == "node 5 is not in the cluster (3 nodes)"


# ---------------------------------------------------------------------- the validator's check
def test_placement_misfit() -> None:
    cl = _cluster()
    p = Placement.of({0: 4, 1: 4})
    # a plain demand always fits (GPU counts are the validator's own check)
    assert placement_misfit(ResourceDemand(8), p, cl) is None
    assert placement_misfit(ResourceDemand(8, "V100"), p, cl) == (
        "node 1 (b) has GPUs of type k80, the job asks for V100"
    )
    assert placement_misfit(ResourceDemand(4, "tesla_v100"), Placement.of({0: 4}), cl) is None
    a100 = ClusterSpec((NodeSpec("x", 8, "A100", gpu_speed=2.0),))  # a type the speed table lacks
    assert placement_misfit(ResourceDemand(8, "nvidia-a100"), Placement.of({0: 8}), a100) is None
    # an untyped node is the reference type
    assert placement_misfit(ResourceDemand(4, "titanxp"), Placement.of({2: 4}), cl) is None
    assert "has GPUs of type titanxp (the reference), the job asks for k80" in placement_misfit(
        ResourceDemand(4, "k80"), Placement.of({2: 4}), cl
    )
    d = ResourceDemand(8, cpus_per_gpu=4, mem_gb_per_gpu=8.0)
    assert placement_misfit(d, Placement.of({0: 8}), cl) is None  # 32 CPUs, 64 GB on node 0
    assert placement_misfit(d, p, cl) is None  # 16 of node 1's 16 CPUs, 32 of its 64 GB
    assert placement_misfit(d, Placement.of({1: 8}), cl) == "node 1 (b): 32 CPUs needed, 16 free"
    # free CPUs/memory from the running jobs' allocations
    four = ResourceDemand(4, cpus_per_gpu=5, mem_gb_per_gpu=50.0)
    running = [Allocation.from_placement(Placement.of({0: 4}), four, cl)]
    cpus, mem = free_cpu_mem(cl, running)
    assert cpus == [12, 16, None] and mem == [56.0, 64.0, None]
    assert placement_misfit(d, Placement.of({0: 4, 1: 4}), cl, cpus, mem) == "node 0 (a): 16 CPUs needed, 12 free"
    assert placement_misfit(d, Placement.of({0: 3, 1: 4, 2: 1}), cl, cpus, mem) is None
    assert placement_misfit(d, Placement.of({0: 4}), cl) == "placement {0:4} has 4 GPUs, the demand accepts 8"


def test_free_cpu_mem_never_below_zero() -> None:
    cl = _cluster()
    over = Allocation.of([NodeShare(1, WORKER, (0,), cpus=100, mem_gb=100.0)])
    assert free_cpu_mem(cl, [over]) == ([32, 0, None], [256.0, 0.0, None])


# ---------------------------------------------------------------------- GPU types end to end
def test_simulator_runs_jobs_on_slow_nodes_slower() -> None:
    """The isolated rate of a started job follows its nodes' GPU type: V100 faster, K80 slower than the
    reference, a job over both at the K80 pace; on an untyped cluster it is the reference rate."""
    from trainer.simulator import Simulator

    cl = ClusterSpec.parse(TWO_TYPES)
    perf = ContentionModel(cl)
    jobs = [JobSpec(j, 0.0, "MoE", 4, 1e6) for j in ("fast", "slow", "mixed")]
    sim = Simulator(cl, jobs, None, perf)
    sim.reset_state()
    sim.advance_to_next_event()
    sim.start("fast", Placement.of({0: 4}))
    sim.start("slow", Placement.of({2: 4}))
    sim.start("mixed", Placement.of({1: 2, 3: 2}))
    iso = {j.job_id: j.isolated_thp for j in sim.state().running}
    ref = perf.isolated_throughput("MoE", 4, 1)
    assert iso["fast"] == pytest.approx(ref * perf.type_speedup("MoE", 4, 1, perf.node_factors("MoE")[0]), rel=1e-12)
    assert iso["fast"] > ref > iso["slow"]
    ref2 = perf.isolated_throughput("MoE", 4, 2)
    assert iso["mixed"] == pytest.approx(ref2 * perf.type_speedup("MoE", 4, 2, perf.node_factors("MoE")[2]), rel=1e-12)
    # the same starts on the untyped 4x8 cluster run at the reference rate
    plain = ClusterSpec.parse("4x8")
    sim2 = Simulator(plain, jobs, None, ContentionModel(plain))
    sim2.reset_state()
    sim2.advance_to_next_event()
    sim2.start("slow", Placement.of({2: 4}))
    assert sim2.state().running[0].isolated_thp == ref


def test_simulate_cli_on_a_two_type_cluster(tmp_path, capsys) -> None:
    """``rlsched simulate --cluster slurm_conf/cluster-two-types.yaml`` runs policies that ignore GPU types;
    every job's rate is its shape's reference rate times the V100 or the K80 speed-up (slowest node), and
    both occur."""
    from rlsched.cli import main

    out = tmp_path / "o"
    rc = main(["simulate", "--cluster", str(TWO_TYPES), "--policy", "fifo,srtf,greedy", "--trace", str(TRACE0),
               "--out", str(out), "--quiet"])
    assert rc == 0, capsys.readouterr().err
    doc = json.loads((out / "summary.json").read_text())
    assert doc["cluster"]["describe"] == "2x8:v100(64 CPUs, 512 GB)+2x8:k80(32 CPUs, 256 GB), 2 switches"
    assert [n["gpu_type"] for n in doc["cluster"]["nodes"]] == ["v100", "v100", "k80", "k80"]
    cl = ClusterSpec.parse(TWO_TYPES)
    perf = ContentionModel(cl)
    v100, k80 = perf.node_factors("MoE")[0], perf.node_factors("MoE")[2]
    assert v100 > 1 > k80
    for pol in ("fifo", "srtf", "greedy"):
        s = doc["summaries"][pol]
        assert s["jobs"] == s["finished"] == 256
        rows = pq.read_table(out / f"jobs_{pol}.parquet").to_pylist()
        seen = set()
        for r in rows:
            if r["avg_cs"] != 1.0 or r["preemptions"]:
                continue  # contention or restarts change the rate: only clean runs are compared
            rate = r["total_samples"] / r["run_time"]
            ref = perf.isolated_throughput(r["model"], r["gpu_demand"], r["num_nodes"])
            fast, slow = perf.node_factors(r["model"])[0], perf.node_factors(r["model"])[2]
            ups = {
                "v100": perf.type_speedup(r["model"], r["gpu_demand"], r["num_nodes"], fast),
                "k80": perf.type_speedup(r["model"], r["gpu_demand"], r["num_nodes"], slow),
            }
            kind = [k for k, u in ups.items() if math.isclose(rate, ref * u, rel_tol=1e-9)]
            assert len(kind) == 1, (pol, r, rate / ref, ups)
            seen.add(kind[0])
        assert seen == {"v100", "k80"}, pol


def test_shipped_rl_checkpoints_serve_a_typed_cluster_of_their_layout() -> None:
    """The observation sees GPU counts, not types, CPUs or memory: a 4 x 8 cluster of two GPU types gets the
    4x8 checkpoints, and the RL policy built on it decides on a typed cluster's state."""
    from policies.rl import make_rl_policy, shipped_checkpoint
    from trainer.simulator import Simulator

    cl = ClusterSpec.parse(TWO_TYPES)
    assert shipped_checkpoint("rl-hybrid", cl) == shipped_checkpoint("rl-hybrid", ClusterSpec.parse("4x8"))
    pol = make_rl_policy("rl-hybrid", cl, ContentionModel(cl))
    jobs = [JobSpec(str(i), 0.0, m, g, 1e5) for i, (m, g) in enumerate([("MoE", 8), ("DLRM", 4), ("FSDP", 16)])]
    res = Simulator(cl, jobs, pol, ContentionModel(cl)).run()
    assert all(math.isfinite(r.finish_time) for r in res.jobs)
