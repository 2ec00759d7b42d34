"""SCED2 (seed 003): codec, size-free network, masking, checkpoints, environment, DQN smoke, simulate."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from policies.base import PolicyError
from policies.cluster import ClusterSpec, Placement
from policies.codecs import make_codec
from policies.codecs.base import CodecError
from policies.codecs.sced2 import Sced2Codec, Sced2Spec, profile_nodes
from policies.job import JobSpec
from policies.perf import ContentionModel
from policies.registry import make_policy
from policies.sced2 import (
    TENSOR_NAMES,
    Sced2Net,
    Sced2Policy,
    load_sced2,
    save_sced2,
    tensor_shapes,
)
from policies.state import ClusterState, JobInfo
from trainer.simulator import SimConfig, Simulator
from cli_helpers import run_cli

REPO = Path(__file__).resolve().parents[1]
C48 = ClusterSpec.parse("4x8")
PERF48 = ContentionModel(C48)


def _tensors(spec: Sced2Spec, seed: int = 0, hidden: int = 8, head: int = 12) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for p, (ws, bs) in tensor_shapes(spec, hidden, head).items():
        out[p + ".weight"] = (rng.normal(size=ws) * 0.5).astype(np.float32)
        out[p + ".bias"] = (rng.normal(size=bs) * 0.1).astype(np.float32)
    return out


def _info(jid: str, g: int, t: float = 0.0, model: str = "FSDP", samples: float = 1e6, placement=None,
          start=None) -> JobInfo:
    best = PERF48.best_isolated_throughput(model, g)
    iso = PERF48.throughput_for(model, placement) if placement is not None else 0.0
    return JobInfo(jid, model, g, t, samples, placement=placement, isolated_thp=iso, achieved_thp=iso,
                   best_thp=best, start_time=start)


def _jobs(n: int, seed: int, cluster: ClusterSpec = C48) -> list[JobSpec]:
    """A small loaded sequence: arrivals every ~200 s, demands 1..8, 10-60 min each."""
    rng = np.random.default_rng(seed)
    perf = ContentionModel(cluster)
    out, t = [], 0.0
    models = ("FSDP", "MoE", "DLRM", "MobileNetV3", "Transformer-XL")
    for i in range(n):
        g = int(rng.choice([1, 1, 1, 2, 4, 8]))
        m = models[int(rng.integers(len(models)))]
        out.append(JobSpec(f"j{i}", t, m, g, float(rng.uniform(600, 3600)) * perf.best_isolated_throughput(m, g)))
        t += float(rng.exponential(200.0))
    return out


# ---------------------------------------------------------------------- codec
def test_profile_nodes_go_from_concentrated_to_scattered():
    assert profile_nodes(1, 8, 4) == (1, 1, 1, 1)
    assert profile_nodes(4, 8, 4) == (1, 2, 3, 4)
    assert profile_nodes(16, 8, 4) == (2, 7, 11, 16)
    assert profile_nodes(16, 8, 1) == (2,)


def test_codec_shapes_and_layout():
    codec = make_codec("sced2-v1", C48, PERF48)
    spec = codec.spec
    assert isinstance(codec, Sced2Codec)
    assert spec.shape == (4 * 8 + 10 * (4 + 3) + 4,) and spec.n_actions == 11
    running = [_info("r0", 6, placement=Placement(((0, 6),)), start=0.0),
               _info("r1", 3, placement=Placement(((0, 2), (1, 1))), start=0.0, samples=5e5)]
    pending = [_info(f"p{i}", g, t=float(i)) for i, g in enumerate([1, 2, 4, 8, 16, 1, 1, 1, 1, 1, 1, 2])]
    st = ClusterState(100.0, C48, np.array([0, 7, 8, 8]), running, pending)
    enc = codec.begin(st).encode()
    obs = enc.obs
    assert obs.shape == spec.shape and obs.dtype == np.float32
    assert (obs >= 0).all() and (obs <= 1).all()
    gpu = obs[:32].reshape(4, 8)
    assert (gpu[0] > 0).all() and (gpu[1, 1:] == 0).all() and gpu[1, 0] > 0 and (gpu[2:] == 0).all()
    assert (np.diff(gpu[0]) <= 0).all()  # longest remaining first
    jobs = obs[32: 32 + 70].reshape(10, 7)
    assert (jobs[:, 4] > 0).all()  # 10 job slots filled (demand feature)
    np.testing.assert_allclose(jobs[1, 4], 2 / (2 + 8), rtol=1e-6)
    assert jobs[0, 5] > jobs[9, 5]  # waited longer
    stats = obs[-4:]
    np.testing.assert_allclose(stats[0], 2 / (2 + 10), rtol=1e-6)  # two more waiting beyond J
    # profile: concentrated is never slower than scattered for a locality-sensitive model
    assert jobs[3, 0] <= jobs[3, 3]


def test_masking_demand_and_none():
    codec = Sced2Codec(C48, PERF48)
    running = [_info("r0", 8, placement=Placement(((0, 8),)), start=0.0)]
    pending = [_info("big", 32, t=0.0), _info("small", 2, t=1.0)]
    enc = codec.begin(ClusterState(10.0, C48, np.array([0, 8, 8, 8]), running, pending)).encode()
    assert enc.mask.tolist() == [False, True] + [False] * 8 + [True]
    assert enc.decode(1) == ("small", Placement(((1, 2),)))
    with pytest.raises(ValueError):
        enc.decode(0)
    with pytest.raises(ValueError):
        enc.decode(2)  # empty slot
    # idle cluster with a job that fits: "none" is masked (time would not move)
    enc = codec.begin(ClusterState(10.0, C48, np.array([8, 8, 8, 8]), [], pending)).encode()
    assert not enc.mask[-1] and enc.mask[0] and enc.mask[1]


def test_round_place_updates_state_and_next_encoding():
    codec = Sced2Codec(C48, PERF48)
    pending = [_info("a", 4, t=0.0), _info("b", 8, t=1.0)]
    rnd = codec.begin(ClusterState(5.0, C48, np.array([8, 8, 8, 8]), [], pending))
    enc = rnd.encode()
    jid, p = enc.decode(0)
    rnd.place(jid, p)
    assert [j.job_id for j in rnd.queue_order()] == ["b"]
    enc2 = rnd.encode()
    assert enc2.mask[-1]  # something was started this round: "none" is allowed
    assert (enc2.obs[:32].reshape(4, 8) > 0).sum() == 4
    st = rnd.state()
    assert [j.job_id for j in st.running] == ["a"] and st.total_free == 28
    with pytest.raises(ValueError):
        rnd.place("a", p)


def test_spec_checks():
    with pytest.raises(CodecError):
        Sced2Spec.for_cluster(ClusterSpec.parse("2x8+2x4"))
    spec = Sced2Spec.for_cluster(C48)
    assert Sced2Spec.from_dict(spec.to_dict()) == spec
    with pytest.raises(CodecError):
        spec.check_cluster(ClusterSpec.parse("4x4"))
    spec.check_cluster(ClusterSpec.parse("64x8"))  # size-free
    with pytest.raises(CodecError):
        Sced2Spec.from_dict({**spec.to_dict(), "jobs": 0})


# ---------------------------------------------------------------------- network
@pytest.mark.parametrize("shape", ["4x8", "15x8", "64x8"])
def test_one_network_runs_on_any_number_of_servers(shape):
    spec = Sced2Spec.for_cluster(C48)
    net = Sced2Net(spec, _tensors(spec))
    cl = ClusterSpec.parse(shape)
    perf = ContentionModel(cl)
    codec = Sced2Codec(cl, perf, spec)
    assert codec.spec.nodes == cl.num_nodes
    pol = Sced2Policy(net, codec)
    res = Simulator(cl, _jobs(30, 1, cl), pol, perf, SimConfig()).run()
    assert len(res.jobs) == 30 and all(r.finish_time >= r.submit_time for r in res.jobs)
    assert pol.stats["placements"] == 30


def test_network_output_size_and_ties():
    spec = Sced2Spec.for_cluster(C48)
    net = Sced2Net(spec, _tensors(spec))
    obs = np.zeros(spec.size, np.float32)
    assert net.q_values(obs).shape == (spec.n_actions,)
    with pytest.raises(ValueError):
        net.q_values(np.zeros(spec.size + 3, np.float32))
    q = np.zeros(11, np.float32)
    mask = np.zeros(11, bool)
    mask[[3, 5]] = True
    assert Sced2Net.choose(q, mask) == 3


def test_torch_mirror_matches_numpy():
    th = pytest.importorskip("torch")
    from gymnasium import spaces

    from trainer.sced2.qnet import Sced2TorchQ, export_tensors

    spec = Sced2Spec.for_cluster(C48)
    n = spec.size + spec.n_actions
    q = Sced2TorchQ(spaces.Box(0, 1, (n,), np.float32), spaces.Discrete(spec.n_actions), spec, hidden=8, head=12)
    net = Sced2Net(spec, export_tensors(q))
    rng = np.random.default_rng(0)
    obs = rng.random((5, n)).astype(np.float32)
    obs[:, spec.size:] = 1.0
    obs[0, 32 + 4::7][:10] = 0.0  # no job present in the first observation
    got = q.q_all(th.as_tensor(obs)).detach().numpy()
    want = np.stack([net.q_values(o[: spec.size]) for o in obs])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    obs[1, spec.size + 2] = 0.0
    masked = q(th.as_tensor(obs)).detach().numpy()
    assert masked[1, 2] < -1e5 and masked[1, 3] == pytest.approx(got[1, 3])


# ---------------------------------------------------------------------- checkpoints
def test_checkpoint_round_trip_and_refusals(tmp_path):
    spec = Sced2Spec.for_cluster(C48)
    t = _tensors(spec, seed=3)
    j = save_sced2(tmp_path / "ck", t, spec, C48, {"timesteps": 0})
    net, meta, jpath = load_sced2(tmp_path / "ck.safetensors")
    assert jpath == j and meta["codec"] == "sced2-v1" and meta["network"]["tensors"] == list(TENSOR_NAMES)
    obs = np.random.default_rng(1).random(spec.size).astype(np.float32)
    np.testing.assert_array_equal(net.q_values(obs), Sced2Net(spec, t).q_values(obs))
    # the same checkpoint on a 15x8 cluster through the registry
    pol = make_policy(f"sced2:{j}", ClusterSpec.parse("15x8"))
    assert isinstance(pol, Sced2Policy) and pol.codec.spec.nodes == 15
    with pytest.raises(PolicyError, match="servers of 8 GPUs"):
        make_policy(f"sced2:{j}", ClusterSpec.parse("4x4"))
    with pytest.raises(PolicyError, match="option"):
        make_policy(f"sced2:{j}", C48, deterministic=True)
    # tampered weights
    w = tmp_path / "ck.safetensors"
    raw = bytearray(w.read_bytes())
    raw[-1] ^= 1
    w.write_bytes(bytes(raw))
    with pytest.raises(PolicyError, match="sha256|truncated"):
        load_sced2(j)
    # not a sced2 checkpoint (an rl-base one)
    with pytest.raises(PolicyError, match="not a sced2 checkpoint"):
        load_sced2(REPO / "policies" / "checkpoints" / "rl-base-4x8.json")
    bad = dict(t)
    bad["q.0.weight"] = np.full_like(bad["q.0.weight"], np.nan)
    with pytest.raises(ValueError, match="finite"):
        save_sced2(tmp_path / "bad", bad, spec, C48, {})
    assert not (tmp_path / "bad.json").exists()


# ---------------------------------------------------------------------- environment and training
def test_env_contract_and_episode():
    pytest.importorskip("gymnasium")
    from gymnasium.utils.env_checker import check_env

    from trainer.sced2.env import Sced2Env

    env = Sced2Env([_jobs(12, 0), _jobs(10, 1)], C48)
    check_env(env, skip_render_check=True)
    rng = np.random.default_rng(0)
    obs, info = env.reset(seed=0, options={"trace": 0})
    rewards, n = [], 0
    while True:
        m = env.action_masks()
        assert (obs[-11:] > 0.5).tolist() == m.tolist()
        obs, r, term, trunc, info = env.step(int(rng.choice(np.flatnonzero(m))))
        rewards.append(r)
        n += 1
        assert env.observation_space.contains(obs)
        if term or trunc:
            break
    assert term and info["finished"] == 12
    assert len(env.effectiveness) == 12 and all(0 < e <= 1 + 1e-9 for e in env.effectiveness)
    assert sum(rewards) == pytest.approx(sum(env.effectiveness))
    with pytest.raises(ValueError):
        env.reset(options={"trace": 2})


def test_prioritized_replay_weights_and_updates():
    pytest.importorskip("stable_baselines3")
    from gymnasium import spaces

    from trainer.sced2.dqn import PrioritizedReplayBuffer

    buf = PrioritizedReplayBuffer(100, spaces.Box(0, 1, (3,), np.float32), spaces.Discrete(2), device="cpu", seed=0)
    for i in range(10):
        buf.add(np.zeros((1, 3)), np.ones((1, 3)), np.array([[i % 2]]), np.array([1.0]), np.array([False]), [{}])
    assert (buf.priorities[:10] == 1.0).all()
    buf.update_priorities(np.arange(10), np.r_[np.zeros(9), 100.0])
    buf.sample(64)
    assert (buf.last_indices == 9).mean() > 0.9  # the large-error transition dominates
    assert buf.last_weights.max() == pytest.approx(1.0)


@pytest.mark.slow
def test_tiny_dqn_training_exports_a_loadable_checkpoint(tmp_path):
    pytest.importorskip("stable_baselines3")
    from trainer.sced2.dqn import PrioritizedReplayBuffer, Sced2DQN
    from trainer.sced2.env import Sced2Env
    from trainer.sced2.qnet import Sced2DQNPolicy, export_tensors

    env = Sced2Env([_jobs(15, 2)], C48)
    model = Sced2DQN(Sced2DQNPolicy, env, learning_starts=20, buffer_size=500, batch_size=8, train_freq=2,
                     target_update_interval=20, replay_buffer_class=PrioritizedReplayBuffer,
                     policy_kwargs={"spec": env.obs_spec.to_dict(), "hidden": 8, "head": 8}, seed=0, device="cpu")
    model.learn(120)
    assert model.num_timesteps == 120 and model._n_updates > 0
    assert model.replay_buffer.max_priority != 1.0 or (model.replay_buffer.priorities[:100] != 1.0).any()
    j = save_sced2(tmp_path / "tiny", export_tensors(model.q_net), env.obs_spec, C48, {"timesteps": 120})
    pol = make_policy(f"sced2:{j}", C48)
    res = Simulator(C48, _jobs(15, 3), pol, PERF48, SimConfig()).run()
    assert len(res.jobs) == 15


@pytest.mark.slow
def test_simulate_runs_sced2(tmp_path):
    pytest.importorskip("matplotlib")
    from trainer.traces import write_trace

    spec = Sced2Spec.for_cluster(C48)
    ck = save_sced2(tmp_path / "ck", _tensors(spec), spec, C48, {})
    trace = tmp_path / "t.csv"
    write_trace(trace, _jobs(20, 4))
    out = tmp_path / "out"
    r = run_cli("simulate", "--policy", f"sced2:{ck},fifo", "--cluster", "4x8", "--trace", str(trace), "--out",
                str(out), "--quiet", home=tmp_path)
    assert r.returncode == 0, r.stderr
    summary = json.loads((out / "summary.json").read_text())
    names = list(summary["summaries"]) if isinstance(summary["summaries"], dict) else summary["policies"]
    assert any(n.startswith("sced2") for n in names)
    assert (out / "frag_timeline.png").is_file()


@pytest.mark.slow
def test_twin_runs_sced2_through_the_controller_like_simulate(tmp_path):
    """The controller's own round (the digital twin: simulated Slurm and agents) loads ``sced2:/path`` and
    places every job with it, as ``simulate`` does."""
    pytest.importorskip("pyarrow")
    from trainer.twin import Twin

    spec = Sced2Spec.for_cluster(C48)
    ck = save_sced2(tmp_path / "ck", _tensors(spec, seed=5), spec, C48, {})
    jobs = _jobs(14, 6)
    name = f"sced2:{ck}"
    sim = Simulator(C48, jobs, make_policy(name, C48, PERF48), PERF48, SimConfig()).run()
    res = Twin(C48, jobs, name, tmp_path / "ctl", SimConfig(), log_file=tmp_path / "ctl.log").run()
    assert [r.job_id for r in res.jobs] == [r.job_id for r in sim.jobs]
    for s, t in zip(sim.jobs, res.jobs):
        assert t.first_start == pytest.approx(s.first_start, rel=1e-6, abs=1e-6)
        assert t.finish_time == pytest.approx(s.finish_time, rel=1e-6)
    assert res.meta["controller"]["placements"] == len(jobs)


def test_shipped_checkpoint_runs_on_any_number_of_8_gpu_servers():
    """``sced2`` (the shipped sced2-m8 checkpoint) loads on 4x8, 15x8 and 64x8 and places every job."""
    for shape in ("4x8", "15x8", "64x8"):
        cl = ClusterSpec.parse(shape)
        pol = make_policy("sced2", cl)
        assert isinstance(pol, Sced2Policy) and pol.codec.spec.nodes == cl.num_nodes
    res = Simulator(C48, _jobs(20, 7), make_policy("sced2", C48), PERF48, SimConfig()).run()
    assert len(res.jobs) == 20
    with pytest.raises(PolicyError, match="no shipped sced2 checkpoint"):
        make_policy("sced2", ClusterSpec.parse("4x4"))


def test_env_invalid_actions_cost_and_never_strand_an_idle_cluster():
    from trainer.sced2.env import Sced2Env

    env = Sced2Env([_jobs(6, 8)], C48, invalid_penalty=-0.5)
    obs, _ = env.reset(seed=0)
    m = env.action_masks()
    assert not m[-1]  # idle cluster, jobs waiting: "none" is masked
    bad = int(np.flatnonzero(~m)[0])
    obs2, r, term, trunc, _ = env.step(bad)
    assert r == -0.5 and not term and np.array_equal(obs2, obs)  # the state stays
    rng = np.random.default_rng(1)
    for _ in range(500):  # random actions, valid or not, still finish the episode
        _, _, term, trunc, info = env.step(int(rng.integers(env.action_space.n)))
        if term or trunc:
            break
    assert term and info["finished"] == 6
