"""rl-sf: size-free codec shapes, masks, network, torch mirror, checkpoints, environment, simulate."""

from __future__ import annotations

import json

import numpy as np
import pytest

from policies.checkpoint import CheckpointError
from policies.cluster import ClusterSpec, Placement
from policies.codecs import make_codec
from policies.codecs.sizefree import N_CAND, PLACEMENT_SLOTS, SizeFreeCodec, SizeFreeSpec
from policies.job import JobSpec
from policies.perf import ContentionModel
from policies.registry import is_learned, make_policy
from policies.sizefree import SizeFreeNet, SizeFreePolicy, load_sizefree, save_sizefree, tensor_shapes
from policies.state import ClusterState, JobInfo
from trainer.simulator import SimConfig, Simulator
from cli_helpers import run_cli

SPEC = SizeFreeSpec(jobs=4)


def _tensors(seed: int = 0, hidden: int = 8) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for p, (ws, bs) in tensor_shapes(hidden).items():
        out[p + ".weight"] = (rng.normal(size=ws) * 0.5).astype(np.float32)
        out[p + ".bias"] = (rng.normal(size=bs) * 0.1).astype(np.float32)
    return out


def _jobs(n: int, seed: int, cluster: ClusterSpec, max_g: int = 16) -> list[JobSpec]:
    rng = np.random.default_rng(seed)
    perf = ContentionModel(cluster)
    out, t = [], 0.0
    models = ("FSDP", "MoE", "DLRM", "MobileNetV3", "Transformer-XL")
    for i in range(n):
        g = int(rng.integers(1, max_g + 1))
        m = models[int(rng.integers(len(models)))]
        out.append(JobSpec(f"j{i}", t, m, g, float(rng.uniform(600, 3600)) * perf.best_isolated_throughput(m, g)))
        t += float(rng.exponential(300.0))
    return out


def _state(cluster: ClusterSpec, running: list[tuple[str, int, Placement]],
           pending: list[tuple[str, int]]) -> ClusterState:
    perf = ContentionModel(cluster)
    free = np.array(cluster.gpus_per_node, dtype=np.int64)
    run = []
    for jid, g, p in running:
        iso = perf.throughput_for("FSDP", p)
        run.append(JobInfo(jid, "FSDP", g, 0.0, 1e7, placement=p, isolated_thp=iso, achieved_thp=iso,
                           best_thp=perf.best_isolated_throughput("FSDP", g), start_time=0.0))
        for nd, c in p.alloc:
            free[nd] -= c
    pend = [JobInfo(jid, "FSDP", g, 10.0, 1e7, best_thp=perf.best_isolated_throughput("FSDP", g)) for jid, g in pending]
    return ClusterState(100.0, cluster, free, run, pend)


@pytest.mark.parametrize("shape", ["4x8", "16x8", "64x8"])
def test_same_weights_same_shapes_on_any_cluster(shape):
    cluster = ClusterSpec.parse(shape)
    perf = ContentionModel(cluster)
    codec = make_codec("sizefree-v1", cluster, perf, SPEC)
    st = _state(cluster, [("r0", 12, Placement(((0, 8), (1, 4))))], [("a", 4), ("b", 16), ("c", 1)])
    enc = codec.begin(st).encode()
    assert enc.obs.shape == SPEC.shape and enc.mask.shape == (SPEC.n_actions,)
    assert np.all(enc.obs >= -1) and np.all(enc.obs <= 1)
    net = SizeFreeNet(SPEC, _tensors())
    assert net.scores(enc.obs).shape == (SPEC.n_actions,)
    pol = SizeFreePolicy(net, SizeFreeCodec(cluster, perf, SPEC))
    res = Simulator(cluster, _jobs(12, 1, cluster), pol, perf, SimConfig()).run()
    assert len(res.jobs) == 12 and pol.stats["placements"] >= 12


def test_masks_candidates_and_hold():
    cluster = ClusterSpec.parse("4x8")
    codec = SizeFreeCodec(cluster, ContentionModel(cluster), SPEC)
    P = len(PLACEMENT_SLOTS)
    # a 12-GPU job spans two nodes; node 0 full, node 1 has 4 free
    st = _state(cluster, [("r0", 12, Placement(((0, 8), (1, 4))))], [("big", 24), ("one", 2), ("huge", 32)])
    rnd = codec.begin(st)
    enc = rnd.encode()
    jobs = [c[0].job_id for c in enc.cands if c is not None]
    assert "huge" not in jobs  # 20 GPUs free: it cannot fit
    assert enc.mask[-1]  # something runs: hold is allowed
    # duplicates are masked: a single-node job's greedy slot repeats nosplit's
    i_one = next(i for i, c in enumerate(enc.cands) if c is not None and c[0].job_id == "one")
    assert i_one % P == 0 and not enc.mask[i_one + 1] and not enc.mask[i_one + 2]
    # rows of empty slots are zero; the hold row has only its flag
    rows = enc.obs[: SPEC.n_candidates * N_CAND].reshape(SPEC.n_candidates, N_CAND)
    assert np.all(rows[~enc.mask[:]][:, 1] == 0)
    assert rows[-1, 0] == 1 and np.all(rows[-1, 1:] == 0)
    # a candidate spanning the loaded node sees predicted contention for itself or its neighbour
    span = [i for i, c in enumerate(enc.cands) if c is not None and c[1].num_nodes > 1 and 1 in c[1].nodes]
    assert all(rows[i, 5] > 0 or rows[i, 6] > 0 for i in span)
    # placing updates the round: the job leaves, free GPUs drop
    rnd.place(*enc.decode(i_one))
    enc2 = rnd.encode()
    assert all(c is None or c[0].job_id != "one" for c in enc2.cands)
    assert int(rnd.free.sum()) == 18
    with pytest.raises(ValueError):
        enc.decode(SPEC.n_actions)


def test_idle_cluster_cannot_hold():
    cluster = ClusterSpec.parse("4x8")
    codec = SizeFreeCodec(cluster, ContentionModel(cluster), SPEC)
    enc = codec.begin(_state(cluster, [], [("a", 4)])).encode()
    assert not enc.mask[-1] and enc.any_placement
    assert codec.expert_action(enc) == 0


def test_torch_mirror_matches_numpy():
    torch = pytest.importorskip("torch")
    from trainer.sizefree.model import CandidateScorer

    cluster = ClusterSpec.parse("16x8")
    codec = SizeFreeCodec(cluster, ContentionModel(cluster), SPEC)
    obs = codec.begin(_state(cluster, [("r0", 12, Placement(((0, 8), (1, 4))))], [("a", 4), ("b", 16)])).encode().obs
    m = CandidateScorer(SPEC, hidden=8)
    net = SizeFreeNet(SPEC, m.tensors())
    with torch.no_grad():
        t = m(torch.as_tensor(obs[None]))[0].numpy()
    np.testing.assert_allclose(net.scores(obs), t, rtol=1e-5, atol=1e-5)


def test_checkpoint_round_trip_and_refusals(tmp_path):
    t = _tensors(3)
    path = save_sizefree(tmp_path / "ck", t, SPEC, {"note": "test"})
    net, meta, jp = load_sizefree(tmp_path / "ck.safetensors")
    assert meta["codec"] == "sizefree-v1" and meta["obs_spec"]["jobs"] == SPEC.jobs and jp == path
    obs = np.random.default_rng(0).uniform(0, 1, SPEC.size).astype(np.float32)
    np.testing.assert_array_equal(net.scores(obs), SizeFreeNet(SPEC, t).scores(obs))
    pol = make_policy(f"rl-sf:{path}", ClusterSpec.parse("16x8"))
    assert isinstance(pol, SizeFreePolicy) and is_learned("rl-sf")
    w = tmp_path / "ck.safetensors"
    w.write_bytes(w.read_bytes()[:-4])
    with pytest.raises(CheckpointError, match="sha256|truncated"):
        load_sizefree(path)
    path = save_sizefree(tmp_path / "ck", t, SPEC, {"note": "test"})  # intact weights: the metadata is at fault
    meta["obs_spec"]["jobs"] = 5
    (tmp_path / "bad.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="obs_spec"):
        load_sizefree(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="missing"):
        save_sizefree(tmp_path / "x", {k: v for k, v in t.items() if k != "cand.2.bias"}, SPEC, {})


def test_env_checker_and_episode():
    pytest.importorskip("gymnasium")
    from gymnasium.utils.env_checker import check_env

    from trainer.sizefree.env import SizeFreeEnv

    cluster = ClusterSpec.parse("4x8")
    env = SizeFreeEnv([_jobs(10, 2, cluster), _jobs(8, 3, cluster)], cluster, SPEC)
    check_env(env, skip_render_check=True)
    obs, _ = env.reset(seed=0, options={"trace": 0})
    total, done = 0.0, False
    while not done:
        a = env.expert_action("greedy")
        assert env.action_masks()[a]
        obs, r, term, trunc, _ = env.step(a)
        assert env.observation_space.contains(obs)
        total += r
        done = term or trunc
    # the return is minus the average JCT in hours
    res = env.sim.result() if hasattr(env.sim, "result") else None
    fin = np.array([j.finish - j.spec.submit_time for j in env.sim.jobs])
    assert total == pytest.approx(-fin.mean() / 3600, rel=1e-6)
    assert res is None or len(res.jobs) == 10


@pytest.mark.slow
def test_simulate_rl_sf_on_16x8(tmp_path):
    from trainer.traces import write_trace

    ck = save_sizefree(tmp_path / "ck", _tensors(), SPEC, {})
    trace = tmp_path / "t.csv"
    write_trace(trace, _jobs(16, 4, ClusterSpec.parse("16x8"), max_g=32))
    out = tmp_path / "out"
    r = run_cli("simulate", "--policy", f"rl-sf:{ck}", "--cluster", "16x8", "--trace", str(trace), "--out", str(out),
                "--quiet", home=tmp_path)
    assert r.returncode == 0, r.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert "rl-sf" in json.dumps(summary)


def test_shipped_checkpoint_runs_on_several_sizes():
    from policies.sizefree import shipped_sizefree

    try:
        shipped_sizefree()
    except Exception:
        pytest.skip("no shipped rl-sf checkpoint")
    for shape in ("4x8", "16x8", "64x8"):
        cluster = ClusterSpec.parse(shape)
        pol = make_policy("rl-sf", cluster)
        res = Simulator(cluster, _jobs(10, 5, cluster), pol, ContentionModel(cluster), SimConfig()).run()
        assert len(res.jobs) == 10


def test_train_cli_refuses_bad_input(capsys):
    from rlsched.cli import main

    assert main(["train-sizefree", "--out", "/nonexistent/x", "--clusters", "4y8"]) == 2
    assert main(["train-sizefree", "--out", "/nonexistent/x", "--ppo-lr", "0"]) == 2
    assert main(["train-sizefree", "--out", "/nonexistent/x", "--demands", "uniform,pow3"]) == 2
    err = capsys.readouterr().err
    assert err.count("rlsched train-sizefree: error:") == 3 and "--demands: pow3 is not one of" in err


@pytest.mark.slow
def test_tiny_training_run_writes_a_loadable_checkpoint(tmp_path):
    pytest.importorskip("sb3_contrib")
    from trainer.sizefree.train import SizeFreeTrainConfig, train

    cfg = SizeFreeTrainConfig(clusters=("4x8",), jobs_per_set=6, sets_per_kind=1, loads=(0.9,), val_sets=1, hidden=8,
                              bc_epochs=2, dagger=1, ppo_timesteps=64, n_steps=64, jobs=4)
    path = train(cfg, tmp_path / "ck", log=lambda s: None)
    net, meta, _ = load_sizefree(path)
    assert meta["training"]["chosen"] in ("bc", "ppo") and net.spec.jobs == 4
    assert make_policy(f"rl-sf:{path}", ClusterSpec.parse("16x8")).name == "rl-sf"


def test_training_sets_draw_every_demand_distribution():
    """--demands uniform,pow2: the uniform sets are those of the default config (same seeds), then pow2 sets."""
    from trainer.sizefree.train import SizeFreeTrainConfig, training_sets

    kw = dict(clusters=("4x8",), jobs_per_set=24, sets_per_kind=1, loads=(0.9,), val_sets=1)
    one = training_sets(SizeFreeTrainConfig(**kw))["4x8"]
    both = training_sets(SizeFreeTrainConfig(demands=("uniform", "pow2"), **kw))["4x8"]
    for sets_one, sets_both in zip(one, both):  # training, validation
        assert len(sets_one) == 2 and len(sets_both) == 4
        assert [[(j.job_id, j.gpu_demand) for j in s] for s in sets_both[:2]] == \
            [[(j.job_id, j.gpu_demand) for j in s] for s in sets_one]
        pow2 = {j.gpu_demand for s in sets_both[2:] for j in s}
        assert pow2 <= {1, 2, 4, 8, 16, 32} and len(pow2) > 2
        assert any(j.gpu_demand not in (1, 2, 4, 8, 16, 32) for s in sets_both[:2] for j in s)


def test_expert_action_orders_by_remaining_time_or_gpu_time():
    """srtf (the default) picks the shortest job; lgtf the least remaining GPU-time (time x GPUs)."""
    cluster = ClusterSpec.parse("4x8")
    perf = ContentionModel(cluster)
    codec = SizeFreeCodec(cluster, perf, SPEC)
    # "short" runs less time on 8 GPUs (more GPU-time) than "narrow" on 1 GPU
    pend = [JobInfo("short", "FSDP", 8, 0.0, 1800 * perf.best_isolated_throughput("FSDP", 8),
                    best_thp=perf.best_isolated_throughput("FSDP", 8)),
            JobInfo("narrow", "FSDP", 1, 0.0, 3600 * perf.best_isolated_throughput("FSDP", 1),
                    best_thp=perf.best_isolated_throughput("FSDP", 1))]
    st = ClusterState(0.0, cluster, np.array(cluster.gpus_per_node, dtype=np.int64), [], pend)
    enc = codec.begin(st).encode()
    P = len(PLACEMENT_SLOTS)
    pick = lambda a: enc.cands[a][0].job_id  # noqa: E731
    assert pick(codec.expert_action(enc, "greedy")) == "short" == pick(codec.expert_action(enc, "greedy", "srtf"))
    assert pick(codec.expert_action(enc, "greedy", "lgtf")) == "narrow"
    assert codec.expert_action(enc, "greedy", "lgtf") % P in (0, 1)
    with pytest.raises(ValueError, match="order must be srtf or lgtf"):
        codec.expert_action(enc, "greedy", "fifo")


def test_cluster_entries_with_their_own_largest_demand():
    """CLUSTER:G draws that cluster's sets with demands up to G; the other entries' sets are unchanged."""
    from trainer.sizefree.train import SizeFreeTrainConfig, split_cluster, training_sets

    assert split_cluster("16x8:64") == ("16x8", 64) and split_cluster("4x8") == ("4x8", None)
    for bad in ("16x8:0", "16x8:x"):
        with pytest.raises(ValueError, match="largest demand"):
            split_cluster(bad)
    kw = dict(jobs_per_set=24, sets_per_kind=1, loads=(0.9,), val_sets=1)
    one = training_sets(SizeFreeTrainConfig(clusters=("4x8", "16x8"), **kw))
    three = training_sets(SizeFreeTrainConfig(clusters=("4x8", "16x8", "16x8:64"), **kw))
    for c in ("4x8", "16x8"):
        assert [[j.gpu_demand for j in s] for s in one[c][0]] == [[j.gpu_demand for j in s] for s in three[c][0]]
    wide = [j.gpu_demand for sets in three["16x8:64"] for s in sets for j in s]
    assert max(wide) <= 64 and max(wide) > 32


def test_best_teacher_takes_the_better_heuristic_per_set():
    pytest.importorskip("gymnasium")
    from trainer.sizefree.env import SizeFreeEnv
    from trainer.sizefree.train import BEST_OF, _expert_jct, best_experts

    cluster = ClusterSpec.parse("4x8")
    env = SizeFreeEnv([_jobs(12, s, cluster, max_g=32) for s in (6, 7)], cluster, SPEC)
    got = best_experts(env)
    assert len(got) == 2
    for idx, e in enumerate(got):
        jct = {x: _expert_jct(env, x, idx) for x in BEST_OF}
        assert jct[e] == min(jct.values()) and e == min(BEST_OF, key=lambda x: (jct[x], BEST_OF.index(x)))


def test_validation_groups_split_each_cluster_by_arrival_kind():
    from trainer.sizefree.validation import KINDS, SUITE, groups

    gs = groups()
    assert len(gs) == len(SUITE.clusters) * len(KINDS)
    assert all(len(sets) == SUITE.val_sets for _c, sets in gs.values())
    zero = gs["16x8:64-zero"][1]
    assert all(j.submit_time == 0.0 for s in zero for j in s)
    assert any(j.submit_time > 0 for s in gs["4x8-poisson-90"][1] for j in s)
