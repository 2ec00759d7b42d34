"""Chic / Chic-Pair (policies/chic.py, trainer/chic/): state and action shapes, masks, the seed's reward on
hand-worked cases, one CE iteration improving a tiny problem, checkpoints, and `rlsched simulate` on a tiny
elastic trace."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from policies.checkpoint import CheckpointError
from policies.base import PolicyError
from policies.chic import (P1, P2, ChicNet, ChicPolicy, ChicSpec, Slot, action_mask, encode, load_chic_checkpoint,
                           make_chic_policy, save_chic_checkpoint, step_penalty, time_reward, _choose)
from policies.elastic import PlanJob
from policies.psmodel import EPOCH_SIZE, PS_MODELS
from policies.resources import ResourceDemand
from policies.state import JobInfo
from trainer.chic.train import Episode, cem_iteration, chic_setup, simulate_episode
from cli_helpers import run_cli

ROOT = Path(__file__).resolve().parents[1]


def _slot(model="VGG-16", epochs=150.0, w=0, p=0, hi=16, wv=(1.0, 2.0, 10.0), pv=(0.0, 4.0, 10.0)) -> Slot:
    d = ResourceDemand(gpus=1, cpus_per_gpu=int(wv[1]), mem_gb_per_gpu=wv[2], ps=1, ps_cpus=int(pv[1]),
                       ps_mem_gb=pv[2], min_gpus=1, max_gpus=hi)
    info = JobInfo(job_id=f"j{model}", model=model, gpu_demand=1, submit_time=0.0,
                   total_samples=epochs * EPOCH_SIZE[model], min_gpus=1, max_gpus=hi, demand=d)
    j = PlanJob(info, d, True, 1, hi, wv, pv, w=w, p=p)
    return Slot(j, PS_MODELS.index(model))


def test_state_and_action_shapes():
    c, cp = ChicSpec("chic", 3), ChicSpec("chic-pair", 3)
    m = len(PS_MODELS)
    assert (c.obs_size, c.n_actions) == (3 * (m + 3) + 1, 7)
    assert (cp.obs_size, cp.n_actions) == (3 * (m + 2) + 1, 4)
    assert [c.target(a) for a in range(6)] == [(0, 1, 0), (0, 0, 1), (1, 1, 0), (1, 0, 1), (2, 1, 0), (2, 0, 1)]
    assert [cp.target(a) for a in range(3)] == [(0, 1, 1), (1, 1, 1), (2, 1, 1)]
    s = _slot("VGG-16", 150.0, w=2, p=1)
    x = encode(c, [s, None, None], queue=4)
    assert x.shape == (c.obs_size,) and x.dtype == np.float32
    assert x[PS_MODELS.index("VGG-16")] == 1 and x[m] == pytest.approx(1.5) and x[m + 1] == pytest.approx(0.2)
    assert x[m + 2] == pytest.approx(0.1) and x[-1] == pytest.approx(0.4) and not x[m + 3:-1].any()
    xp = encode(cp, [None, s, None], queue=0)
    assert xp[(m + 2) + PS_MODELS.index("VGG-16")] == 1 and xp[-1] == 0 and xp.shape == (cp.obs_size,)
    with pytest.raises(PolicyError):
        ChicSpec("chic-trio", 3)


def test_masks_follow_free_resources_and_limits():
    c = ChicSpec("chic", 2)
    s = _slot()  # worker: 1 GPU, 2 CPUs, 10 GB; PS: 4 CPUs, 10 GB
    cap = (1.0, 5.0, 100.0)
    assert action_mask(c, [s, None], [0, 0, 0], cap).tolist() == [True, True, False, False, True]
    assert action_mask(c, [s, None], [0, 0, 0], cap, allow_empty=True).tolist() == [True, True, True, True, True]
    # the only GPU taken: no worker; 4 CPUs taken: 1 left, no PS either
    assert action_mask(c, [s, None], [1, 4, 0], cap).tolist() == [False, False, False, False, True]
    # max_gpus bounds workers and PSs
    s2 = _slot(w=2, p=2, hi=2)
    assert action_mask(c, [s2, None], [0, 0, 0], (10, 100, 1000)).tolist()[:2] == [False, False]
    cp = ChicSpec("chic-pair", 1)
    assert action_mask(cp, [s], [0, 0, 0], (1.0, 5.0, 100.0)).tolist() == [False, True]  # 2 + 4 CPUs > 5
    assert action_mask(cp, [s], [0, 0, 0], (1.0, 6.0, 100.0)).tolist() == [True, True]


def test_reward_hand_worked():
    # eq. (8): step of 600 s, slots with backlog 5 / 0 / 3, 2 queued, one arrival 100 s into the step:
    # -(2 * 600 + 2 * 600 + (600 - 100)) / 1200
    assert time_reward(600.0, [5, 0, 3], 2, [100.0]) == pytest.approx(-2900 / 1200)
    c = ChicSpec("chic", 2)
    s = _slot()
    assert step_penalty(c, [s, None], 2) == -P1  # worker to the empty slot
    assert step_penalty(c, [s, None], 0) == -P2  # first task of the workload
    s.job.w = 1
    assert step_penalty(c, [s, None], 0) == 0.0  # a second worker, still no PS
    assert step_penalty(c, [s, None], 1) == +P2  # its first PS: both now
    s.job.p = 1
    assert step_penalty(c, [s, None], 1) == 0.0 and step_penalty(c, [s, None], c.stop) == 0.0
    cp = ChicSpec("chic-pair", 2)
    s0 = _slot()
    assert step_penalty(cp, [s0, None], 0) == 0.0 and step_penalty(cp, [s0, None], 1) == -P1


def test_cem_iteration_improves_a_tiny_problem():
    """A bandit of 12 steps: the return counts the steps whose action equals the argmax of the state's first
    three entries. One CE iteration (N = 30 from the policy + 1 uniform) raises the policy's expected score."""
    spec = ChicSpec("chic", 1)  # 3 actions

    def states(seed):
        return np.random.default_rng(seed).normal(size=(12, spec.obs_size)).astype(np.float32)

    def rollout(net, mode, seed):
        rng = np.random.default_rng(seed + 1)
        steps, ret = [], 0.0
        for x in states(seed):
            mask = np.ones(3, bool)
            a = _choose(net.logits(x), mask, mode, rng)
            ret += float(a == int(np.argmax(x[:3])))
            steps.append((x, mask, a))
        return Episode(ret, 0.0, steps)

    def expected(net):
        xs = np.concatenate([states(s) for s in range(1000, 1040)])
        z = net.logits(xs)
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        return float(p[np.arange(len(xs)), xs[:, :3].argmax(1)].mean())

    net = ChicNet.init(spec.obs_size, 3, hidden=(16,), seed=3)
    before = expected(net)
    rng = np.random.default_rng(0)
    for _ in range(3):
        net, st = cem_iteration(net, rollout, n=30, rho=0.3, lr=0.01, smooth=0.7, fit_epochs=20, batch=64,
                                dropout=0.0, rng=rng)
        assert st["elite"] >= 1 and st["xi"] >= 0
    assert expected(net) > before + 0.05


def test_cem_iteration_groups_compare_trajectories_on_common_sequences():
    """With groups, every trajectory of a group runs on the group's sequence (its key) and the elite is
    taken per group: on a problem whose return is dominated by the sequence (an offset of 100 x key), the
    elite still holds trajectories of every group; without groups only the best sequence's."""
    spec = ChicSpec("chic", 1)
    seen = []

    def rollout(net, mode, seed, key=None):
        key = seed if key is None else key
        seen.append(key)
        rng = np.random.default_rng(seed)
        x = np.ones(spec.obs_size, np.float32)
        a = _choose(net.logits(x), np.ones(3, bool), mode, rng)
        return Episode(100.0 * (key % 7) + float(a == 0), 0.0, [(x, np.ones(3, bool), a)])

    net = ChicNet.init(spec.obs_size, 3, hidden=(8,), seed=0)
    _, st = cem_iteration(net, rollout, n=12, rho=0.3, lr=0.01, smooth=0.7, fit_epochs=1, batch=8, dropout=0.0,
                          rng=np.random.default_rng(1), groups=3)
    assert len(seen) == 13 and len(set(seen)) == 3  # 3 sequences, the uniform one on the first
    assert seen[:5] == [seen[0]] * 5 and st["elite"] >= 3 and st["return_std_within"] < 1.0
    with pytest.raises(ValueError, match="groups"):
        from trainer.chic.train import CEMConfig

        CEMConfig(groups=-1).check()


def test_checkpoint_round_trip_and_refusals(tmp_path):
    spec = ChicSpec("chic-pair", 3)
    net = ChicNet.init(spec.obs_size, spec.n_actions, seed=1)
    j = save_chic_checkpoint(tmp_path / "cp", spec, net, {"note": "test"})
    ck = load_chic_checkpoint(tmp_path / "cp.safetensors")
    x = np.random.default_rng(0).normal(size=spec.obs_size).astype(np.float32)
    assert ck.spec == spec and np.array_equal(ck.net.logits(x), net.logits(x))
    assert not any(p.suffix == ".pkl" for p in tmp_path.iterdir())
    # a chic-pair checkpoint under the name chic is refused
    with pytest.raises(PolicyError, match="chic-pair checkpoint"):
        make_chic_policy(f"chic:{j}")
    assert isinstance(make_chic_policy(f"chic-pair:{j}"), ChicPolicy) and make_chic_policy(f"chic-pair:{j}").task_mask
    save_chic_checkpoint(tmp_path / "nm", spec, net, task_mask=False)
    assert make_chic_policy(f"chic-pair:{tmp_path / 'nm'}").task_mask is False
    # tampered weights
    w = tmp_path / "cp.safetensors"
    blob = bytearray(w.read_bytes())
    blob[-1] ^= 1
    w.write_bytes(bytes(blob))
    with pytest.raises(CheckpointError, match="sha256"):
        load_chic_checkpoint(j)
    # a pickle in place of the weights
    import pickle

    w.write_bytes(pickle.dumps({"x": 1}))
    with pytest.raises(CheckpointError):
        load_chic_checkpoint(j)
    # wrong shapes: an I = 2 network under I = 3 metadata
    save_chic_checkpoint(tmp_path / "s", ChicSpec("chic", 2), ChicNet.init(ChicSpec("chic", 2).obs_size, 5))
    meta = json.loads((tmp_path / "s.json").read_text())
    meta["slots"] = 3
    (tmp_path / "s.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="shapes"):
        load_chic_checkpoint(tmp_path / "s.json")
    (tmp_path / "o.json").write_text(json.dumps({"format": "rlsched-policy"}))
    with pytest.raises(CheckpointError, match="not a Chic checkpoint"):
        load_chic_checkpoint(tmp_path / "o.json")
    (tmp_path / "n.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="unreadable Chic checkpoint metadata"):
        load_chic_checkpoint(tmp_path / "n.json")
    with pytest.raises(CheckpointError, match="not found"):
        load_chic_checkpoint(tmp_path / "missing")


def test_shipped_checkpoints_load():
    for v in ("chic", "chic-pair"):
        pol = make_chic_policy(v)
        assert pol.spec.variant == v and pol.spec.slots == 3
    # every shipped checkpoint (per-rate ones too) loads, names its variant in its file name, and records a
    # repo-relative recipe; the ones trained with --ship record the validation comparison that shipped them
    for j in sorted((ROOT / "policies" / "checkpoints" / "chic").glob("*.json")):
        if j.name.endswith("-history.json"):
            continue
        ck = load_chic_checkpoint(j)
        assert j.stem == ck.spec.variant or j.stem.startswith(ck.spec.variant + "-r")
        tr = ck.meta["training"]
        assert tr["command"].startswith("rlsched train-chic") and "/work" not in json.dumps(ck.meta)
        sel = tr.get("selection")
        if sel is not None:
            assert sel["as"] == j.name and sel["val_act_s"] < (sel["incumbent_val_act_s"] or float("inf"))
            assert (j.parent / f"{j.stem}-history.json").is_file()


def test_episode_runs_in_the_simulator():
    from trainer.elastic import generate, parse_elastic_trace

    spec = ChicSpec("chic", 3)
    cluster, perf = chic_setup()
    jobs = parse_elastic_trace(generate("chic", seed=1, jobs=5))
    net = ChicNet.init(spec.obs_size, spec.n_actions)
    for mode, task_mask in (("greedy", True), ("sample", True), ("uniform", True), ("greedy", False)):
        ep = simulate_episode(net, spec, cluster, perf, jobs, mode, seed=2, task_mask=task_mask)
        assert ep.act > 0 and ep.steps and all(m[a] for _x, m, a in ep.steps)
        assert ep.ret <= -5 * ep.act / 1200 + 1e-9 or mode != "greedy"


def test_cli_simulate_chic_pair_optimus(tmp_path):
    trace = tmp_path / "tiny.json"
    r = run_cli("trace", "gen-elastic", "--setting", "chic", "--jobs", "6", "--out", str(trace), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = run_cli("simulate", "--trace", str(trace), "--cluster", str(ROOT / "data/clusters/chic.yaml"), "--policy",
                "chic,chic-pair,optimus", "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert all(p in r.stdout for p in ("chic", "chic-pair", "optimus"))
    r = run_cli("simulate", "--trace", str(trace), "--cluster", str(ROOT / "data/clusters/chic.yaml"), "--policy",
                f"chic:{tmp_path / 'nope'}", "--out", str(tmp_path / "out2"), cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "not found" in r.stderr


def test_task_mask_looks_past_dips_of_g():
    """With a g that dips (speed 47 at 5 PSs, 43 at 6, 49 at 7) a PS is still offered at 5 PSs, since 7 are
    faster; past the best count (and past the limits or the free resources) it is not."""
    table = {5: 47.0, 6: 43.0, 7: 49.0, 8: 40.0}

    def speed(job, w, p):
        return table.get(p, 30.0) - 5.0 * (w - 1)

    c = ChicSpec("chic", 1)
    s = _slot("ResNet-50", w=1, p=5, hi=16, wv=(1.0, 2.0, 8.0), pv=(0.0, 3.0, 9.0))
    big = (10.0, 120.0, 600.0)
    assert action_mask(c, [s], [0, 0, 0], big, speed=speed).tolist() == [False, True, True]
    # the one-step test alone would refuse it: 6 PSs are slower than 5
    assert speed(s.job, 1, 6) < speed(s.job, 1, 5)
    # room for one more PS only (3 CPUs free): 6 PSs do not help, so it is refused
    assert action_mask(c, [s], [0, 117, 0], big, speed=speed).tolist() == [False, False, True]
    s.job.p = 7
    assert action_mask(c, [s], [0, 0, 0], big, speed=speed).tolist() == [False, False, True]
    # Chic-Pair looks along the diagonal
    cp = ChicSpec("chic-pair", 1)
    sp = _slot("ResNet-50", w=3, p=3, hi=16)
    diag = {3: 35.1, 4: 32.4, 5: 38.6, 6: 32.0}
    assert action_mask(cp, [sp], [0, 0, 0], big, speed=lambda j, w, p: diag.get(w, 10.0)).tolist() == [True, True]
    sp.job.w = sp.job.p = 5
    assert action_mask(cp, [sp], [0, 0, 0], big, speed=lambda j, w, p: diag.get(w, 10.0)).tolist() == [False, True]


def test_g_source_recorded_and_used(tmp_path):
    from policies.psmodel import PSPerformanceModel

    spec = ChicSpec("chic-pair", 3)
    net = ChicNet.init(spec.obs_size, spec.n_actions, seed=1)
    _cluster, perf = chic_setup()
    save_chic_checkpoint(tmp_path / "m", spec, net)
    save_chic_checkpoint(tmp_path / "f", spec, net, g="fitted")
    pm, pf = make_chic_policy(f"chic-pair:{tmp_path / 'm'}", perf), make_chic_policy(f"chic-pair:{tmp_path / 'f'}", perf)
    assert (pm.g, pf.g) == ("measured", "fitted")
    assert pm.estimator is perf and isinstance(pf.estimator, PSPerformanceModel) and not pf.estimator.use_measured
    s = _slot("VGG-16", w=3, p=3)
    ms = perf.ps_model("VGG-16")
    assert pm.speed(s.job, 3, 3) == pytest.approx(ms.measured_speed(3, 3))
    assert pf.speed(s.job, 3, 3) == pytest.approx(ms.speed(3, 3))
    # a checkpoint without the key is read as fitted (the rule it was trained with); a bad value is refused
    meta = json.loads((tmp_path / "m.json").read_text())
    del meta["g"]
    (tmp_path / "m.json").write_text(json.dumps(meta))
    assert make_chic_policy(f"chic-pair:{tmp_path / 'm'}", perf).g == "fitted"
    meta["g"] = "oracle"
    (tmp_path / "m.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="g must be one of"):
        load_chic_checkpoint(tmp_path / "m.json")
    with pytest.raises(PolicyError, match="g must be one of"):
        ChicPolicy(net, spec, perf, g="oracle")


def test_pair_bound_hand_worked():
    from policies.psmodel import fit_ps_models
    from trainer.chic.results import pair_bound
    from trainer.elastic import generate, parse_elastic_trace

    jobs = parse_elastic_trace(generate("chic", seed=3, jobs=4))
    ms = fit_ps_models()
    want = np.mean([j.total_samples / max(ms[j.model].measured_speed(k, k) for k in range(1, 11)) for j in jobs])
    assert pair_bound(jobs) == pytest.approx(want)


@pytest.mark.slow
def test_train_ship_and_results_on_a_tiny_setting(tmp_path):
    """One CE iteration on 5-job sequences, shipping by validation (first into an empty directory, then not
    again: the same network is not better than itself), and `chic-results` on two 5-job sequences writing
    its files and the marked sections of the documents under a scratch root."""
    from trainer.chic.results import BEGIN, END, main
    from trainer.chic.train import CEMConfig, ship_if_better, train

    cfg = CEMConfig(variant="chic-pair", iterations=1, n=2, train_seqs=2, val_seqs=2, jobs=5, val_every=1)
    hist = train(cfg, tmp_path / "run", progress=False, name="chic-pair-r1.8")
    assert len(hist["iterations"]) == 2 and "val_act" in hist["iterations"][1]
    ship = tmp_path / "ship"
    ship.mkdir()
    rec = ship_if_better(tmp_path / "run" / "chic-pair-r1.8.json", 1.8, dest=ship, seqs=2)
    assert rec["shipped"] and rec["as"] == "chic-pair.json" and rec["incumbent"] is None
    assert (ship / "chic-pair-history.json").is_file()
    shipped = load_chic_checkpoint(ship / "chic-pair.json")
    assert shipped.meta["training"]["selection"]["val_act_s"] == pytest.approx(rec["val_act_s"])
    again = ship_if_better(tmp_path / "run" / "chic-pair-r1.8.json", 1.8, dest=ship, seqs=2)
    assert not again["shipped"] and again["incumbent"] == "chic-pair.json"
    assert again["val_act_s"] == pytest.approx(again["incumbent_val_act_s"])
    root = tmp_path / "root"
    (root / "docs").mkdir(parents=True)
    for doc in ("ELASTIC.md", "RESULTS.md"):
        (root / "docs" / doc).write_text(f"# head\n\n{BEGIN}\nstale\n{END}\n\ntail\n")
    res = main(tmp_path / "out", [1.8], 2, {"chic-pair": str(ship / "chic-pair.json")}, True, progress=False,
               root=root, jobs_per_seq=5)
    p = res["by_rate"]["1.8"]["policies"]
    assert p["optimus"]["ratio_optimus"] == pytest.approx(1.0) and len(p["chic-pair"]["per_seq_s"]) == 2
    assert p["chic-pair (1.8/h)"]["per_seq_s"] == p["chic-pair"]["per_seq_s"]  # the same network
    best = res["by_rate"]["1.8"]["best_baseline"]
    assert p[best]["act_s"] == min(p[n]["act_s"] for n in ("optimus", "optimus (measured g)", "optimus (placed g)", "drf", "tetris"))
    for doc in ("ELASTIC.md", "RESULTS.md"):
        text = (root / "docs" / doc).read_text()
        assert "stale" not in text and text.startswith("# head") and text.rstrip().endswith("tail")
        assert "| 1.8 |" in text and "chic-pair-r1.8" not in text and "pair bound" in text
    assert (root / "docs" / "figures" / "chic_act_vs_rate.png").stat().st_size > 0
    assert (root / "docs" / "figures" / "chic_training.png").stat().st_size > 0
    assert json.loads((tmp_path / "out" / "chic_results.json").read_text())["seqs"] == 2


def test_fixed_shape_study_policy_plans_its_shapes_while_capacity_lasts():
    from trainer.chic.shapes import FixedShape

    spec = ChicSpec("chic", 3)
    _cluster, perf = chic_setup()
    pol = FixedShape(ChicNet.init(spec.obs_size, spec.n_actions), spec, perf, {"VGG-16": (3, 10)})
    a, b, c = _slot(), _slot(), _slot()  # VGG-16: worker 1 GPU / 2 CPUs / 10 GB, PS 4 CPUs / 10 GB
    pol.decide([a, b, c], 0, (10.0, 100.0, 600.0))  # 3 x 2 + 10 x 4 = 46 CPUs each: two fit in 100
    assert [(s.job.w, s.job.p) for s in (a, b, c)] == [(3, 10), (3, 10), (0, 0)]


def _workers_setup():
    """The Chic cluster's nodes with PSs only on the worker nodes (``ps_placement: workers``), where the
    placed ``g`` differs from the measured one, and the performance model."""
    import dataclasses

    cluster, perf = chic_setup()
    return dataclasses.replace(cluster, ps_placement="workers"), perf


def test_ps_room_hand_worked():
    """On the Chic cluster's nodes (5 x 2 GPUs, 24 cores, 120 GB) with PSs on the worker nodes
    (``ps_placement: workers``): a VGG-16 worker (2 cores, 10 GB) leaves 22 cores for PSs of 4 cores: 5;
    two workers packed on one node leave 20 cores: 5; three workers on two nodes (2 + 1) host 5 + 5.
    ResNet-50's PSs of 3 cores: 22 // 3 = 7 beside one worker. With PSs on any node (``spread``, the
    shipped cluster file) one VGG-16 worker leaves 5 + 4 x 6 = 29 PSs of room: the cap, 23."""
    import dataclasses

    from policies.chic import ps_room

    spread, _perf = chic_setup()
    assert spread.ps_placement == "spread"
    assert [ps_room(spread, (1.0, 2.0, 10.0), (0.0, 4.0, 10.0), w) for w in (1, 6)] == [23, 23]
    assert ps_room(spread, (1.0, 2.0, 10.0), (0.0, 4.0, 10.0), 1, max_ps=30) == 29
    assert ps_room(spread, (1.0, 2.0, 8.0), (0.0, 3.0, 9.0), 11) == 0  # 10 GPUs
    cluster = dataclasses.replace(spread, ps_placement="workers")
    vgg = [ps_room(cluster, (1.0, 2.0, 10.0), (0.0, 4.0, 10.0), w) for w in range(1, 7)]
    assert vgg == [5, 5, 10, 10, 15, 15]
    assert ps_room(cluster, (1.0, 2.0, 8.0), (0.0, 3.0, 9.0), 1) == 7
    assert ps_room(cluster, (1.0, 2.0, 8.0), (0.0, 3.0, 9.0), 11) == 0  # 10 GPUs
    assert ps_room(cluster, (1.0, 2.0, 8.0), (0.0, 3.0, 9.0), 10, max_ps=4) == 4


def test_placed_g_caps_ps_and_offers_the_worker_that_makes_room():
    """g = "placed": a VGG-16 job at 2 workers / 5 PSs runs as 2 : 5 with any more PSs (its node hosts 5),
    so a PS is not offered; a third worker is, since 3 workers host 10 PSs (measured 22.0 > 19.8); with
    at most 2 workers neither is. With the measured g a worker is never offered at a fixed PS count (it
    only slows)."""
    spec = ChicSpec("chic", 1)
    net = ChicNet.init(spec.obs_size, spec.n_actions, seed=1)
    cluster, perf = _workers_setup()
    placed, measured = ChicPolicy(net, spec, perf, g="placed"), ChicPolicy(net, spec, perf, g="measured")
    placed._cluster = cluster
    ms = perf.ps_model("VGG-16")
    s = _slot("VGG-16", w=2, p=5, hi=10)
    assert placed.speed(s.job, 2, 9) == pytest.approx(ms.measured_speed(2, 5))
    assert placed.speed(s.job, 3, 10) == pytest.approx(ms.measured_speed(3, 10))
    assert placed.speed(s.job, 3, 10) > placed.speed(s.job, 2, 5)
    big = (10.0, 120.0, 600.0)
    m = action_mask(spec, [s], [0, 0, 0], big, speed=placed.speed, room=placed.room)
    assert m.tolist() == [True, False, True]
    two = _slot("VGG-16", w=2, p=5, hi=2)
    assert action_mask(spec, [two], [0, 0, 0], big, speed=placed.speed, room=placed.room).tolist() == [False, False, True]
    assert action_mask(spec, [s], [0, 0, 0], big, speed=measured.speed).tolist()[0] is False
    # 14 CPUs free: a third worker and 3 PSs fit (3 : 8, measured 20.8); 9 free: 3 : 6 at most (19.3), refused
    assert action_mask(spec, [s], [0, 120 - 14, 0], big, speed=placed.speed, room=placed.room).tolist()[0] is True
    assert action_mask(spec, [s], [0, 120 - 9, 0], big, speed=placed.speed, room=placed.room).tolist()[0] is False
    s.job.w, s.job.p = 3, 10  # the best the layout allows: only stop
    assert action_mask(spec, [s], [0, 0, 0], big, speed=placed.speed, room=placed.room).tolist() == [False, False, True]


def _reachable(spec, pol, model, wv, pv, cap=(10.0, 120.0, 600.0)):
    """Every (workers, PSs) the task mask lets a lone job of ``model`` reach from 0 : 0, and those where
    it offers no task."""
    seen, ends, front = set(), set(), [(0, 0)]
    while front:
        w, p = front.pop()
        if (w, p) in seen:
            continue
        seen.add((w, p))
        s = _slot(model, w=w, p=p, hi=16, wv=wv, pv=pv)
        m = action_mask(spec, [s], list(s.job.use(w, p)), cap, speed=pol.speed, room=pol.room)
        if not m[0] and not m[1]:
            ends.add((w, p))
        front += [(w + 1, p)] * bool(m[0]) + [(w, p + 1)] * bool(m[1])
    return seen, ends


def test_placed_g_reaches_the_fastest_placed_shape_from_an_empty_plan():
    """g = "placed" on the Chic cluster: a lone VGG-16 job's PSs stop raising its speed at 1 : 4 (18.7;
    1 : 5 is 17.8 and its node hosts 5), where a second worker adds no room (2 : 5, 19.8) but a third
    does (3 : 10, 22.0): the mask offers the worker there, and the plans it allows end only at 3 : 10,
    the fastest shape the layout runs. ResNet-50 (room 7 / 6 / 12 for 1 / 2 / 3 workers) reaches 3 : 10
    (55.3, against 49.3 at 1 : 7)."""
    spec = ChicSpec("chic", 1)
    cluster, perf = _workers_setup()
    pol = ChicPolicy(ChicNet.init(spec.obs_size, spec.n_actions, seed=1), spec, perf, g="placed")
    pol._cluster = cluster
    at14 = _slot("VGG-16", w=1, p=4, hi=16)
    assert action_mask(spec, [at14], list(at14.job.use(1, 4)), (10.0, 120.0, 600.0), speed=pol.speed,
                       room=pol.room).tolist() == [True, False, True]
    seen, ends = _reachable(spec, pol, "VGG-16", (1.0, 2.0, 10.0), (0.0, 4.0, 10.0))
    assert (3, 10) in seen and ends == {(3, 10)} and max(w for w, _ in seen) == 3
    job = _slot("VGG-16", hi=16).job
    assert max(pol.speed(job, w, p) for w, p in seen) == pytest.approx(pol.speed(job, 3, 10))
    seen, ends = _reachable(spec, pol, "ResNet-50", (1.0, 2.0, 8.0), (0.0, 3.0, 9.0))
    job = _slot("ResNet-50", hi=16, wv=(1.0, 2.0, 8.0), pv=(0.0, 3.0, 9.0)).job
    assert (3, 10) in ends and pol.speed(job, 3, 10) > pol.speed(job, 1, 7)


@pytest.mark.slow
def test_w_i_study_on_a_tiny_setting(tmp_path):
    """Two cells of one CE iteration (tiny N / sequences), evaluated on two test sequences; the paired
    difference, the table, the figure and the marked blocks; a second run reuses the trained cells."""
    from trainer.chic.study import BEGIN, END, main

    cells = (("chic-pair-I2-r2.7", "chic-pair", 2.7, 30, 2), ("chic-pair-I3-r2.7", "chic-pair", 2.7, 30, 3))
    over = dict(n=2, train_seqs=2, val_seqs=2, val_every=1)
    root = tmp_path / "root"
    (root / "docs").mkdir(parents=True)
    for doc in ("ELASTIC.md", "RESULTS.md"):
        (root / "docs" / doc).write_text(f"# head\n\n{BEGIN}\nstale\n{END}\n")
    logs = []
    res = main(tmp_path / "out", iterations=1, seqs=2, docs=True, root=root, cells=cells, over=over)
    c2, c3 = res["cells"]["chic-pair-I2-r2.7"], res["cells"]["chic-pair-I3-r2.7"]
    d = res["differences"]["I2-I3 r2.7"]
    assert d["mean_s"] == pytest.approx(c2["act_s"] - c3["act_s"])
    assert load_chic_checkpoint(tmp_path / "out" / "cells" / "chic-pair-I2-r2.7.json").spec.slots == 2
    text = (root / "docs" / "RESULTS.md").read_text()
    assert "stale" not in text and "| chic-pair-I2-r2.7 | chic-pair | 2.7 | 30 | 2 |" in text
    assert "I = 2 minus I = 3 |" in text and "no number given" in text and "Cells not run here: chic-W30" in text
    assert (root / "docs" / "figures" / "chic_study.png").stat().st_size > 0
    from trainer.chic import study

    again = study.run(tmp_path / "out", 1, 2, cells=cells, over=over, log=logs.append)
    assert not any("best validation" in m for m in logs)  # not trained again
    assert again["cells"]["chic-pair-I2-r2.7"]["per_seq_s"] == c2["per_seq_s"]


def test_forced_shape_policy_overrides_the_networks_plan_where_it_fits():
    from trainer.chic.shapes import ForcedShape

    spec = ChicSpec("chic", 3)
    _cluster, perf = chic_setup()
    pol = ForcedShape(ChicNet.init(spec.obs_size, spec.n_actions, seed=2), spec, perf, {"VGG-16": (3, 10)})
    a, b = _slot(), _slot("ResNet-50", wv=(1.0, 2.0, 8.0), pv=(0.0, 3.0, 9.0))
    pol.decide([a, b, None], 0, (10.0, 120.0, 600.0))
    assert (a.job.w, a.job.p) == (3, 10) and b.job.w >= 1 and b.job.p >= 1  # the network plans ResNet-50
    c = _slot()
    pol.decide([c, None, None], 0, (10.0, 40.0, 600.0))  # 3 x 2 + 10 x 4 = 46 CPUs do not fit in 40
    assert (c.job.w, c.job.p) != (3, 10) and c.job.w >= 1


def test_placed_optimus_reference_plans_with_the_speed_its_nodes_host():
    """The results' "Optimus, placed g" baseline: the measured speed with the PSs cut to what the workers'
    nodes host (VGG-16 at 2 workers runs 9 PSs as 5), so the greedy's PS gains stop at the room."""
    from trainer.chic.results import PlacedOptimus

    cluster, perf = _workers_setup()
    pol = PlacedOptimus(perf)
    pol._cluster = cluster
    ms = perf.ps_model("VGG-16")
    job = _slot("VGG-16", hi=10).job
    assert pol.speed(job, 2, 9) == pytest.approx(ms.measured_speed(2, 5))
    assert pol.speed(job, 3, 10) == pytest.approx(ms.measured_speed(3, 10))
    assert pol.speed(job, 11, 1) == 0.0  # 11 workers do not fit the 10 GPUs
    assert pol.remaining_time(job, 2, 6) == pytest.approx(pol.remaining_time(job, 2, 5))
