"""Where an elastic job's parameter servers run: ``ps_placement`` of the cluster (``workers``: only on the
job's worker nodes, split evenly; ``spread``: on any node, each PS where the most CPUs are free), the
placements that name their PS nodes, the allocations and CPU / memory rules built from them, and the
baselines laying their plans onto a spread cluster."""

from __future__ import annotations

import dataclasses

import pytest

from policies.cluster import ClusterSpec, ClusterSpecError, NodeSpec
from policies.elastic import ElasticPlacement, materialize, plan_jobs, ps_layout
from policies.job import JobSpec
from policies.perf import ContentionModel
from policies.psmodel import EPOCH_SIZE, PSPerformanceModel
from policies.registry import make_policy
from policies.resources import PS, Allocation, ResourceDemand, ResourceError
from policies.validate import check_decision
from trainer.sim_backend import SimBackend
from trainer.simulator import SimConfig, Simulator

#: 3 nodes x (2 GPUs, 8 CPUs, 48 GB): DL2's servers
NODES = tuple(NodeSpec(f"n{i}", 2, cpus=8, mem_gb=48.0) for i in range(3))
WORKERS = ClusterSpec(NODES)
SPREAD = ClusterSpec(NODES, ps_placement="spread")


def _ps_job(jid: str = "a", workers: int = 1, ps: int = 1, epochs: float = 50.0) -> JobSpec:
    """A ResNet-50 job of ``workers`` workers (4 CPUs, 10 GB each) and ``ps`` PSs (4 CPUs, 10 GB each)."""
    d = ResourceDemand(gpus=workers, cpus_per_gpu=4, mem_gb_per_gpu=10.0, ps=ps, ps_cpus=4, ps_mem_gb=10.0,
                       min_gpus=1, max_gpus=6)
    return JobSpec(jid, 0.0, "ResNet-50", workers, epochs * EPOCH_SIZE["ResNet-50"], {}, d)


def test_cluster_file_key(tmp_path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("ps_placement: spread\nnodes:\n  - {gpus: 2, count: 2, cpus: 8, mem_gb: 48}\n")
    spec = ClusterSpec.parse(str(f))
    assert spec.ps_placement == "spread" and spec.describe() == "2x2(8 CPUs, 48 GB), PSs spread"
    assert ClusterSpec.parse("2x8").ps_placement == "workers"  # the default
    f.write_text("ps_placement: anywhere\nnodes:\n  - {gpus: 2}\n")
    with pytest.raises(ClusterSpecError, match=r"c\.yaml: ps_placement: expected one of workers, spread, got 'anywhere'"):
        ClusterSpec.parse(str(f))
    with pytest.raises(ClusterSpecError, match="ps_placement must be one of workers, spread"):
        ClusterSpec(NODES, ps_placement="x")


@pytest.mark.parametrize(
    "kw, words",
    [
        ({"ps": 3, "ps_nodes": ((2, 1), (0, 2))}, "ascending"),  # not ascending
        ({"ps": 3, "ps_nodes": ((0, 1), (1, 1))}, "summing to ps = 3"),
        ({"ps": 1, "ps_nodes": ((0, 0), (1, 1))}, "count >= 1"),
        ({"ps": 2, "ps_nodes": ((1, 1), (1, 1))}, "distinct"),
    ],
)
def test_ps_nodes_are_checked(kw, words) -> None:
    with pytest.raises(ValueError, match=words):
        ElasticPlacement(((0, 1),), **kw)


def test_layout_named_or_round_robin() -> None:
    named = ElasticPlacement.make({0: 1}, 3, {2: 2, 1: 1})
    assert named.ps_nodes == ((1, 1), (2, 2)) and str(named) == "{0:1}+3ps{1:1,2:2}"
    assert ps_layout(named, 3) == [(1, 1), (2, 2)]
    plain = ElasticPlacement.make({0: 1, 2: 1}, 3)
    assert ps_layout(plain, 3) == [(0, 2), (2, 1)]
    assert named != ElasticPlacement.make({0: 1}, 3)  # the PS nodes are part of the placement
    # the allocation puts the PSs where the placement says, on nodes without workers too
    d = ResourceDemand(gpus=1, cpus_per_gpu=4, mem_gb_per_gpu=10.0, ps=3, ps_cpus=4, ps_mem_gb=10.0)
    alloc = Allocation.from_placement(named, d, SPREAD)
    assert sorted((s.node, s.cpus) for s in alloc.shares if s.role == PS) == [(1, 4), (2, 8)]
    with pytest.raises(ResourceError, match="PS node 7 is not in the cluster"):
        Allocation.from_placement(ElasticPlacement.make({0: 1}, 3, {7: 3}), d, SPREAD)


@pytest.mark.parametrize("cluster, want_ps", [(WORKERS, 1), (SPREAD, 5)])
def test_materialize_places_planned_pss(cluster, want_ps) -> None:
    """One worker and a plan of 6 PSs on 3 nodes of 8 CPUs (4 a task): on the worker's node there is room
    for one PS; spread, the two other nodes take two each, so 5 run (the plan is cut to what fits)."""
    perf = PSPerformanceModel(ContentionModel(cluster))
    sim = Simulator(cluster, [_ps_job()], None, perf, SimConfig())
    be = SimBackend(sim)
    assert be.next_round()
    state = be.snapshot()
    jobs = plan_jobs(state)
    jobs[0].w, jobs[0].p = 1, 6
    dec = materialize(state, jobs)
    ((jid, p),) = dec.place
    assert p.total_gpus == 1 and p.ps == want_ps
    assert check_decision(state, dec) == []
    if cluster is SPREAD:  # the worker's node keeps one PS, the others take two each
        assert dict(ps_layout(p, p.ps)) == {n: (1 if n in p.nodes else 2) for n in range(3)}


def test_optimus_runs_more_pss_on_a_spread_cluster() -> None:
    """Optimus plans PS-heavy shapes for ResNet-50; on DL2's servers only a spread cluster runs them, and
    every decision passes the CPU / memory rules (the simulator checks them)."""
    runs = {}
    for cluster in (WORKERS, SPREAD):
        cl = dataclasses.replace(cluster, nodes=tuple(NodeSpec(f"n{i}", 2, cpus=8, mem_gb=48.0) for i in range(6)))
        perf = PSPerformanceModel(ContentionModel(cl))
        pol = make_policy("optimus", cl, perf)
        seen = []

        class Watch:
            def __getattr__(self, k):
                return getattr(pol, k)

            def schedule(self, state):
                seen.extend(getattr(j.placement, "ps", 0) for j in state.running)
                return pol.schedule(state)

        res = Simulator(cl, [_ps_job("a", epochs=2000.0), _ps_job("b", epochs=2000.0)], Watch(), perf,
                        SimConfig(check_invariants=True)).run()
        runs[cluster.ps_placement] = (max(seen), sum(r.jct for r in res.jobs) / 2)
    assert runs["workers"][0] <= 2 < runs["spread"][0]  # 1-2 worker nodes host 1-2 PSs
    assert runs["spread"][1] < runs["workers"][1]  # the PSs it planned make its jobs faster
