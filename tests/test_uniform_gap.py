"""scripts/studies/uniform_gap.py: the simulator's model variants and the plan-greedy policy, on real simulations."""

from __future__ import annotations

import json

import numpy as np
import pytest
from bench_loader import load_study

from policies.cluster import ClusterSpec
from policies.perf import ContentionModel, feasible_node_counts
from policies.state import ClusterState, Decision
from trainer.generate import GeneratorConfig, generate_jobs
from trainer.simulator import SimConfig, Simulator
from trainer.traces import write_trace

ug = load_study("uniform_gap")

C48 = ClusterSpec.parse("4x8")
MULTI = [("MoE", 12, 2), ("FSDP", 16, 2), ("DLRM", 10, 2)]


def test_model_variants_remove_exactly_one_effect_each():
    real = ContentionModel(C48)
    nc, nl, neu = (ug.sim_model(k, C48) for k in ("no-contention", "no-locality-loss", "neutral"))
    pairs = [(a, b) for a in MULTI for b in MULTI]
    assert max(real.pair_cs(a, b) for a, b in pairs) > 1.0  # the real model slows shared multi-node jobs
    for a, b in pairs:
        assert nc.pair_cs(a, b) == neu.pair_cs(a, b) == 1.0
        assert nl.pair_cs(a, b) == real.pair_cs(a, b)
    slower = 0
    for model, g in (("MoE", 12), ("FSDP", 20), ("Transformer-XL", 6)):
        best = real.best_isolated_throughput(model, g)
        for n in feasible_node_counts(C48, g):
            assert nl.isolated_throughput(model, g, n) == neu.isolated_throughput(model, g, n) == pytest.approx(best)
            assert nc.isolated_throughput(model, g, n) == real.isolated_throughput(model, g, n)
            slower += real.isolated_throughput(model, g, n) < best * (1 - 1e-9)
    assert slower > 0  # the real model has shapes slower than the best one
    with pytest.raises(ValueError, match="unknown model"):
        ug.sim_model("ideal", C48)


class _Audit(ug.PlanGreedy):
    """PlanGreedy that checks each of its decisions: no single-node job split, nothing left that fits."""

    rounds = 0

    def schedule(self, state: ClusterState) -> Decision:
        dec = super().schedule(state)
        free = state.free_gpus.astype(int).copy()
        placed = set()
        for jid, p in dec.place:
            job = next(j for j in state.pending if j.job_id == jid)
            assert p.total_gpus == job.gpu_demand
            if job.gpu_demand <= 8:
                assert p.num_nodes == 1
            for v, c in p.alloc:
                free[v] -= c
            placed.add(jid)
        assert (free >= 0).all()
        for j in state.pending:
            if j.job_id in placed:
                continue
            if j.gpu_demand <= 8:
                assert free.max() < j.gpu_demand  # a waiting single-node job fits no node
            else:
                assert free.sum() < j.gpu_demand  # pack places any multi-node job that fits in total
        type(self).rounds += 1
        return dec


def test_plan_greedy_never_holds_a_fitting_job_and_neutral_runs_every_job_at_its_best_speed():
    perf = ContentionModel(C48)
    jobs = generate_jobs(C48, GeneratorConfig(num_jobs=40, demand="uniform", seed=3), perf)
    pol = _Audit(C48, perf)
    res = Simulator(C48, jobs, pol, perf, SimConfig()).run()
    assert _Audit.rounds > 5 and len(res.jobs) == 40
    assert any(r.run_time > r.ideal_time * (1 + 1e-6) for r in res.jobs)  # real model: some jobs slowed
    neutral = Simulator(C48, jobs, ug.PlanGreedy(C48, perf), ug.sim_model("neutral", C48), SimConfig()).run()
    for r in neutral.jobs:  # neutral model: every job runs exactly its isolated best time
        assert r.run_time == pytest.approx(r.ideal_time, rel=1e-6)
        assert r.avg_cs == 1.0
    got = ug.run(ug.PlanGreedy(C48, perf), [jobs], C48, perf)
    assert got["avg_jct_h"] == pytest.approx(np.mean([r.jct for r in res.jobs]) / 3600)
    assert got["avg_cs"] > 1.0


def test_cli_prints_a_table_and_writes_json(tmp_path, capsys):
    perf = ContentionModel(C48)
    sets = tmp_path / "sets"
    sets.mkdir()
    for s in range(2):
        write_trace(sets / f"set{s}.csv", generate_jobs(C48, GeneratorConfig(num_jobs=16, demand="uniform", seed=s), perf))
    out = tmp_path / "gap.json"
    assert ug.main(["--traces", str(sets), "--policies", "srtf,plan-greedy", "--models", "real,neutral", "--json", str(out)]) == 0
    assert "simulator runs each model" in capsys.readouterr().out
    got = json.loads(out.read_text())
    assert set(got) == {"srtf", "plan-greedy"} and all(set(v) == {"real", "neutral"} for v in got.values())
    assert all(np.isfinite(m["avg_jct_h"]) and m["avg_jct_h"] > 0 for v in got.values() for m in v.values())
    assert ug.main(["--traces", str(sets), "--models", "real,ideal"]) == 2
    assert ug.main(["--traces", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert "unknown model 'ideal'" in err and "missing: no such trace file or directory" in err
