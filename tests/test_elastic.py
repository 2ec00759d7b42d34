"""Elastic jobs with parameter servers: the trace schema and generator, the simulator's resizes and
PS counts, the CPU / memory rules, and the DRF / Tetris / Optimus baselines."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from policies.base import Policy
from policies.cluster import ClusterSpec, Placement
from policies.elastic import (
    DEFAULT_INTERVAL_S,
    ELASTIC_POLICIES,
    ElasticPlacement,
    free_resources,
    make_elastic_policy,
    node_usage,
)
from policies.job import JobSpec
from policies.perf import ContentionModel
from policies.psmodel import EPOCH_SIZE, PSPerformanceModel, fit_ps_models
from policies.registry import make_policy
from policies.resources import Allocation, ResourceDemand
from policies.state import Decision
from policies.validate import check_decision
from trainer.elastic import (
    CHIC_RESOURCES,
    FORMAT,
    ElasticTraceError,
    generate,
    is_elastic_trace,
    parse_elastic_trace,
    read_elastic_trace,
    write_trace,
)
from trainer.sim_backend import SimBackend
from trainer.simulator import SimConfig, SimulationError, Simulator
from cli_helpers import run_cli

ROOT = Path(__file__).resolve().parents[1]
CHIC = ClusterSpec.parse(str(ROOT / "data" / "clusters" / "chic.yaml"))


def _job(**kw):
    rec = {"job_id": "a", "submit_time": 0.0, "model": "ResNet-50", "epochs": 10, "workers": 1,
           "min_workers": 1, "max_workers": 8, "worker": {"gpus": 1, "cpus": 2, "mem_gb": 8},
           "ps": {"count": 1, "cpus": 3, "mem_gb": 9}}
    rec.update(kw)
    return rec


def _doc(*jobs):
    return {"format": FORMAT, "version": 1, "jobs": list(jobs)}


# ---------------------------------------------------------------------- schema
def test_parse_builds_demands():
    (j,) = parse_elastic_trace(_doc(_job()))
    assert j.model == "ResNet-50" and j.gpu_demand == 1
    assert j.total_samples == 10 * EPOCH_SIZE["ResNet-50"]
    d = j.demand
    assert (d.cpus_per_gpu, d.mem_gb_per_gpu, d.ps, d.ps_cpus, d.ps_mem_gb) == (2, 8.0, 1, 3, 9.0)
    assert (d.min_gpus, d.max_gpus) == (1, 8) and d.is_elastic


def test_all_reduce_jobs_can_be_elastic():
    rec = _job(model="DLRM", total_samples=1e5, workers=2, min_workers=1, max_workers=4)
    del rec["epochs"], rec["ps"]
    (j,) = parse_elastic_trace(_doc(rec))
    assert j.model == "DLRM" and j.demand.ps == 0 and j.demand.gpu_counts() == range(1, 5)


@pytest.mark.parametrize("change, words", [
    ({"model": "AlexNet"}, "model 'AlexNet' is unknown"),
    ({"epochs": -1}, "epochs must be > 0"),
    ({"total_samples": 5}, "exactly one of epochs and total_samples"),
    ({"workers": 0}, "workers must be >= 1"),
    ({"workers": 9}, "min_workers <= workers <= max_workers"),
    ({"max_workers": None}, "both min_workers and max_workers"),
    ({"worker": {"gpus": 2}}, "worker.gpus must be 1"),
    ({"ps": {"count": 0}}, "ps.count must be >= 1"),
    ({"submit_time": float("nan")}, "submit_time must be >= 0 and finite"),
    ({"colour": "red"}, "unknown key 'colour'"),
])
def test_bad_jobs_get_one_line(change, words):
    rec = _job(**change)
    rec = {k: v for k, v in rec.items() if v is not None}
    with pytest.raises(ElasticTraceError) as e:
        parse_elastic_trace(_doc(rec), "t.json")
    msg = str(e.value)
    assert words in msg and "t.json: job 0 ('a')" in msg and "\n" not in msg


def test_ps_model_needs_ps_and_all_reduce_refuses_it():
    rec = _job()
    del rec["ps"]
    with pytest.raises(ElasticTraceError, match="parameter-server model; give ps"):
        parse_elastic_trace(_doc(rec))
    rec = _job(model="MoE", total_samples=10.0)
    del rec["epochs"]
    with pytest.raises(ElasticTraceError, match="takes no ps"):
        parse_elastic_trace(_doc(rec))


def test_document_errors():
    for doc, words in ((["x"], "not an elastic trace"), ({"format": FORMAT, "version": 2, "jobs": []}, "version 2"),
                       ({"format": FORMAT, "version": 1, "jobs": []}, "non-empty list"),
                       (_doc(_job(), _job()), "duplicate job_id")):
        with pytest.raises(ElasticTraceError, match=words):
            parse_elastic_trace(doc)


# ---------------------------------------------------------------------- generator
def test_chic_setting():
    doc = generate("chic", seed=3, rate=2.7)
    jobs = parse_elastic_trace(doc)
    assert len(jobs) == 30 and jobs[0].submit_time == 0.0
    for j, rec in zip(jobs, doc["jobs"]):
        wc, wm, pc, pm = CHIC_RESOURCES[j.model]
        d = j.demand
        assert (d.cpus_per_gpu, d.mem_gb_per_gpu, d.ps_cpus, d.ps_mem_gb) == (wc, wm, pc, pm)
        assert 100 <= rec["epochs"] <= 200
    gaps = [b.submit_time - a.submit_time for a, b in zip(jobs, jobs[1:])]
    assert 0.2 * 3600 / 2.7 < sum(gaps) / len(gaps) < 3 * 3600 / 2.7
    assert generate("chic", seed=3, rate=2.7) == doc  # seeded


def test_dl2_setting():
    doc = generate("dl2", seed=1)
    jobs = parse_elastic_trace(doc)
    assert len(jobs) == 200 and {j.model for j in jobs} <= set(fit_ps_models())
    slots = [int(j.submit_time // 1200) for j in jobs]
    assert max(slots.count(s) for s in set(slots)) <= 10
    assert all(1 <= j.demand.cpus_per_gpu <= 4 and 1 <= j.demand.ps_cpus <= 4 for j in jobs)
    with pytest.raises(ElasticTraceError, match="rate applies to the chic setting"):
        generate("dl2", rate=1.0)


def test_cli_gen_and_simulate(tmp_path):
    trace = tmp_path / "chic.json"
    r = run_cli("trace", "gen-elastic", "--setting", "chic", "--jobs", "8", "--out", str(trace), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert is_elastic_trace(trace) and len(read_elastic_trace(trace)) == 8
    r = run_cli("trace", "gen-elastic", "--setting", "chic", "--rate", "-1", "--out", str(tmp_path / "x.json"),
                cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "rate must be" in r.stderr
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_doc(_job(epochs="many"))))
    r = run_cli("simulate", "--trace", str(bad), "--cluster", str(ROOT / "data/clusters/chic.yaml"), "--policy",
                "optimus", "--out", str(tmp_path / "o"), cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "epochs must be a number" in r.stderr
    r = run_cli("simulate", "--trace", str(trace), "--cluster", str(ROOT / "data/clusters/chic.yaml"), "--policy",
                "optimus,drf,tetris", "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert all(p in r.stdout for p in ("optimus", "drf", "tetris"))



def test_gen_elastic_seeds_writes_a_group_directory(tmp_path):
    """``--seeds N --out DIR``: N traces of consecutive seeds (each the single-file generator's), refused
    whole when one exists (without --overwrite), when DIR is a .json name or lies under a file."""
    from trainer.elastic import gen_elastic_dir

    d = tmp_path / "grp"
    r = run_cli("trace", "gen-elastic", "--setting", "chic", "--jobs", "5", "--rate", "0.9", "--seed", "7",
                "--seeds", "3", "--out", str(d), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert sorted(f.name for f in d.iterdir()) == ["chic-7.json", "chic-8.json", "chic-9.json"]
    want = parse_elastic_trace(generate("chic", seed=8, jobs=5, rate=0.9))
    assert read_elastic_trace(d / "chic-8.json") == want
    r = run_cli("trace", "gen-elastic", "--setting", "chic", "--seeds", "4", "--seed", "6", "--out", str(d),
                cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "chic-7.json exists (3 of the 4 files" in r.stderr
    assert not (d / "chic-6.json").exists()  # nothing written
    assert len(gen_elastic_dir(d, "chic", 4, seed=6, jobs=2, overwrite=True)) == 4
    (tmp_path / "f").write_text("")
    for out, why in ((tmp_path / "g.json", "is a directory"), (tmp_path / "f" / "g", "f is not a directory")):
        with pytest.raises(ElasticTraceError, match=why):
            gen_elastic_dir(out, "dl2", 1)
    assert len(gen_elastic_dir(tmp_path / "a" / "b", "chic", 1, jobs=2)) == 1  # parents made
    with pytest.raises(ElasticTraceError, match="--seeds must be in"):
        gen_elastic_dir(d, "chic", 0)


def test_simulate_refuses_a_fixed_size_learned_policy_on_an_elastic_trace(tmp_path):
    trace = tmp_path / "chic.json"
    write_trace(generate("chic", seed=1, jobs=3), trace)
    r = run_cli("simulate", "--trace", str(trace), "--cluster", str(ROOT / "data/clusters/chic.yaml"), "--policy",
                "fifo,rl-base", "--out", str(tmp_path / "o"), cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "policy 'rl-base' does not run on elastic traces" in r.stderr and not (tmp_path / "o").exists()

# ---------------------------------------------------------------------- resources
def test_node_usage_places_ps_as_allocation_does():
    d = ResourceDemand(gpus=5, cpus_per_gpu=2, mem_gb_per_gpu=8, ps=5, ps_cpus=3, ps_mem_gb=9, min_gpus=1,
                       max_gpus=8)
    cl = ClusterSpec.parse("3x4")
    p = Placement.of({0: 2, 1: 1, 2: 2})
    want = {n: (c, m) for n, (_g, c, m) in Allocation.from_placement(p, d, cl).per_node().items()}
    assert node_usage(p, d, 5) == want


def _sim(jobs, policy=None, cluster=CHIC, **cfg):
    perf = PSPerformanceModel(ContentionModel(cluster))
    return Simulator(cluster, jobs, policy, perf, SimConfig(**cfg))


def _spec(jid="a", model="ResNet-50", epochs=100.0, t=0.0, **kw):
    d = dict(gpus=1, cpus_per_gpu=2, mem_gb_per_gpu=8, ps=1, ps_cpus=3, ps_mem_gb=9, min_gpus=1, max_gpus=8)
    d.update(kw)
    return JobSpec(jid, t, model, d["gpus"], epochs * EPOCH_SIZE[model], {}, ResourceDemand(**d))


def test_cpu_and_memory_rules():
    sim = _sim([_spec()])
    sim.advance_to_next_event()
    st = SimBackend(sim).snapshot()
    # 2 workers + 6 PSs on one node: 4 + 18 = 22 CPUs of 24: fits; 7 PSs: 25 CPUs do not
    ok = Decision(place=[("a", ElasticPlacement.make({0: 1}, 7))])
    assert check_decision(st, ok) == []
    bad = Decision(place=[("a", ElasticPlacement.make({0: 1}, 8))])
    (pr,) = check_decision(st, bad)
    assert pr.action == "place" and "node 0 (chic1): 26 CPUs needed, 24 free" in pr.message
    none = Decision(place=[("a", ElasticPlacement.make({0: 1}, 0))])
    assert "no PS" in check_decision(st, none)[0].message
    with pytest.raises(SimulationError, match="26"):
        SimBackend(sim).apply(bad)


def test_resize_changes_workers_and_ps_and_pauses():
    m = fit_ps_models()["ResNet-50"]
    sim = _sim([_spec(epochs=1000.0)], resize_overhead=40.0)
    sim.advance_to_next_event()
    be = SimBackend(sim)
    be.apply(Decision(place=[("a", ElasticPlacement.make({0: 1}, 1))]))
    j = sim.by_id["a"]
    assert j.rate == pytest.approx(m.measured_speed(1, 1))
    sim.advance_to_round(100.0)
    be.apply(Decision(resize=[("a", ElasticPlacement.make({0: 2, 1: 2}, 4))]))
    assert j.info.gpu_demand == 4 and j.rate == pytest.approx(m.measured_speed(4, 4))
    assert j.t_ref == pytest.approx(140.0)  # the pause
    done = j.done
    be.apply(Decision(resize=[("a", ElasticPlacement.make({0: 2, 1: 2}, 2))]))  # PSs only
    assert j.rate == pytest.approx(m.measured_speed(4, 2)) and j.done == done
    with pytest.raises(SimulationError, match="outside its range"):
        be.apply(Decision(resize=[("a", ElasticPlacement.make({0: 2, 1: 2, 2: 2, 3: 2, 4: 1}, 2))]))
    st = be.snapshot()
    cpus, mem = free_resources(st)
    assert cpus[0] == 24 - 2 * 2 - 3 and mem[1] == 120 - 2 * 8 - 9


class _Plain(Policy):
    name = "plain"

    def schedule(self, state):
        free = list(state.free_gpus)
        dec = Decision()
        for j in state.pending:
            for n, f in enumerate(free):
                if f >= j.gpu_demand:
                    dec.place.append((j.job_id, Placement.of({n: j.gpu_demand})))
                    free[n] -= j.gpu_demand
                    break
        return dec


def test_plain_placement_of_a_ps_job_runs_its_demanded_ps():
    m = fit_ps_models()["VGG-16"]
    sim = _sim([_spec(model="VGG-16", ps=3, gpus=2, min_gpus=1, max_gpus=4, epochs=5.0)], _Plain())
    res = sim.run()
    (r,) = res.jobs
    assert r.run_time == pytest.approx(5.0 * EPOCH_SIZE["VGG-16"] / m.measured_speed(2, 3))


# ---------------------------------------------------------------------- baselines
@pytest.mark.parametrize("name", sorted(ELASTIC_POLICIES))
def test_baselines_finish_every_job_within_the_nodes(name):
    doc = generate("chic", seed=5, jobs=12, rate=2.7)
    jobs = parse_elastic_trace(doc)
    perf = PSPerformanceModel(ContentionModel(CHIC))
    pol = make_policy(name, CHIC, perf)
    assert pol.name == name and pol.resizes and pol.interval == DEFAULT_INTERVAL_S
    sim = Simulator(CHIC, jobs, pol, perf, SimConfig(check_invariants=True))
    seen = []
    orig = sim.check_invariants

    def check():
        orig()
        cpus, mem = free_resources(SimBackend(sim).snapshot())
        seen.append(min(cpus))
        assert min(cpus) >= 0 and min(mem) >= -1e-6

    sim.check_invariants = check
    res = sim.run()
    assert all(math.isfinite(r.finish_time) and r.done_samples == pytest.approx(r.total_samples) for r in res.jobs)
    assert seen


def test_optimus_grows_a_lone_job_by_marginal_gain():
    perf = PSPerformanceModel(ContentionModel(CHIC))
    pol = make_elastic_policy("optimus", perf)
    sim = _sim([_spec(epochs=2000.0)], pol)
    be = SimBackend(sim)
    assert be.next_round()
    be.apply(pol.schedule(be.snapshot()))  # starts at its gpu_demand (1 worker) with its planned PSs
    j = sim.by_id["a"]
    assert j.info.placement.total_gpus == 1
    assert be.next_round()
    be.apply(pol.schedule(be.snapshot()))  # grows to the plan next round
    p = j.info.placement
    m = fit_ps_models()["ResNet-50"]
    assert p.total_gpus > 1 and p.ps >= 1
    assert m.speed(p.total_gpus, p.ps) > m.speed(1, 1)  # by the fitted form Optimus plans with
    assert not pol.estimator.use_measured and perf.use_measured


def test_drf_shares_by_dominant_resource():
    perf = PSPerformanceModel(ContentionModel(CHIC))
    pol = make_elastic_policy("drf", perf, interval=0)
    jobs = [_spec("a", epochs=5000.0), _spec("b", epochs=5000.0, t=0.0)]
    sim = _sim(jobs, pol)
    be = SimBackend(sim)
    for _ in range(3):
        assert be.next_round()
        be.apply(pol.schedule(be.snapshot()))
    a, b = sim.by_id["a"].info.placement, sim.by_id["b"].info.placement
    assert a is not None and b is not None
    assert abs(a.total_gpus - b.total_gpus) <= 1 and abs(a.ps - b.ps) <= 1


def test_baselines_are_deterministic():
    jobs = parse_elastic_trace(generate("chic", seed=9, jobs=10, rate=2.7))
    perf = PSPerformanceModel(ContentionModel(CHIC))
    for name in ELASTIC_POLICIES:
        runs = [[(r.job_id, r.finish_time) for r in Simulator(CHIC, jobs, make_policy(name, CHIC, perf), perf).run().jobs]
                for _ in range(2)]
        assert runs[0] == runs[1]


def test_workers_spread_to_leave_room_for_ps():
    """4 nodes x (2 GPUs, 8 CPUs); a job of 4 workers (4 CPUs each) and PSs of 4 CPUs: packed two
    workers a node leave no CPU for a PS, one worker a node leaves room for one PS each."""
    from policies.cluster import NodeSpec

    cl = ClusterSpec(tuple(NodeSpec(f"n{i}", 2, cpus=8, mem_gb=48.0) for i in range(4)))
    job = _spec(gpus=4, min_gpus=1, max_gpus=4, ps=2, cpus_per_gpu=4, ps_cpus=4, epochs=50.0)
    for name in ELASTIC_POLICIES:
        perf = PSPerformanceModel(ContentionModel(cl))
        pol = make_policy(name, cl, perf)
        sim = Simulator(cl, [job], pol, perf)
        be = SimBackend(sim)
        assert be.next_round()
        dec = pol.schedule(be.snapshot())
        ((jid, p),) = dec.place
        assert p.max_per_node == 1 and 1 <= p.ps <= 4, name
        be.apply(dec)
