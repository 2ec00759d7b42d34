"""DL2's Gymnasium environment (trainer.dl2.env): one step per DL2 inference over the simulator's round loop."""

from __future__ import annotations

import threading
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from policies.cluster import ClusterSpec
from policies.perf import ContentionModel
from policies.registry import make_policy
from trainer.dl2.env import ENV_ID, DL2Env, register
from trainer.dl2.train import drf_action
from trainer.elastic import elastic_perf, generate, parse_elastic_trace
from trainer.simulator import SimConfig, Simulator

CHIC = ClusterSpec.parse("data/clusters/chic.yaml")


def _trace(seed: int, jobs: int = 6) -> list:
    return parse_elastic_trace(generate("chic", seed=seed, jobs=jobs))


def _avg_jct(policy: str, jobs: list, resize_overhead: float | None = None) -> float:
    perf = elastic_perf(ContentionModel(CHIC))
    res = Simulator(CHIC, jobs, make_policy(policy, CHIC, perf), perf, SimConfig(resize_overhead=resize_overhead)).run()
    return float(np.mean([r.jct for r in res.jobs]))


def _play(env: DL2Env, choose, trace: int = 0) -> tuple[list[float], dict, int]:
    """An episode of ``trace`` with ``choose(env, obs, mask) -> action``; (rewards, last info, steps)."""
    obs, info = env.reset(seed=0, options={"trace": trace})
    rewards, steps, done = [], 0, False
    while not done:
        obs, r, term, trunc, info = env.step(choose(env, obs, info["action_mask"]))
        rewards.append(r)
        steps += 1
        done = term or trunc
    return rewards, info, steps


def _drf(env: DL2Env, obs, mask) -> int:
    a = drf_action(env.batch, env.used, env.cap, env.dl2_spec)
    return a if mask[a] else env.dl2_spec.n_actions - 1


def test_passes_gymnasiums_env_checker():
    env = DL2Env([_trace(1, 4), _trace(2, 4)], CHIC)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the observation's upper bound is infinite (remaining epochs)
        check_env(env, skip_render_check=True)
    env.close()


@pytest.mark.parametrize("seed", [1, 2])
def test_an_episode_driven_by_drfs_actions_reproduces_drf(seed):
    """DL2's DRF teacher (trainer.dl2.train.drf_action) through the environment gives DRF's average JCT on a
    small trace, bit for bit; the slot rewards sum to the number of jobs (each job's work counts once)."""
    jobs = _trace(seed, 8)
    env = DL2Env([jobs], CHIC)
    rewards, info, steps = _play(env, _drf)
    assert steps > len(jobs)
    assert info["avg_jct_s"] == _avg_jct("drf", jobs)
    assert sum(rewards) == pytest.approx(len(jobs), abs=1e-9)
    assert min(rewards) >= -1e-12 and sum(r > 0 for r in rewards) >= 2  # paid at slot ends, not every step


def test_the_shipped_networks_greedy_actions_reproduce_dl2_with_a_hot_resize_pause():
    """The shipped network's most likely feasible action at every step gives what `dl2` gives in the
    simulator, also with the resize pause set (DL2's hot scaling)."""
    jobs = _trace(3, 8)
    env = DL2Env([jobs], CHIC, resize_overhead=0.05)

    def greedy(env, obs, mask):
        return int(np.argmax(np.where(mask, env.net.logits(obs, mask), -np.inf)))

    _r, info, _n = _play(env, greedy)
    assert info["avg_jct_s"] == _avg_jct("dl2", jobs, resize_overhead=0.05)
    assert info["avg_jct_s"] != _avg_jct("dl2", jobs)  # the pause is the simulator's, here 0.05 s, not 30 s


def test_reset_mid_episode_truncation_and_close_leave_no_simulation_thread():
    before = threading.active_count()
    env = DL2Env([_trace(1), _trace(2)], CHIC, max_steps=3)
    obs, info = env.reset(seed=5)
    assert obs.shape == env.observation_space.shape and info["action_mask"].dtype == bool
    assert np.array_equal(env.action_masks(), info["action_mask"])
    env.step(env.dl2_spec.n_actions - 1 if info["action_mask"][-1] else int(np.argmax(info["action_mask"])))
    env.reset(options={"trace": 1})  # the running episode is ended, its thread joined
    assert threading.active_count() == before + 1
    done = False
    for _ in range(3):
        _o, _r, term, trunc, info = env.step(int(np.argmax(info["action_mask"])))
        done = term or trunc
        if done:
            break
    assert done and trunc and not term
    assert threading.active_count() == before
    with pytest.raises(RuntimeError, match="reset"):
        env.step(0)
    env.reset()
    with pytest.raises(ValueError, match="not in Discrete"):
        env.step(env.dl2_spec.n_actions)
    env.close()
    assert threading.active_count() == before


def test_bad_arguments_are_refused_in_one_line():
    with pytest.raises(ValueError, match="at least one trace"):
        DL2Env([], CHIC)
    with pytest.raises(ValueError, match="max_steps"):
        DL2Env([_trace(1)], CHIC, max_steps=0)
    env = DL2Env([_trace(1)], CHIC)
    with pytest.raises(ValueError, match="trace option"):
        env.reset(options={"trace": 4})
    env.close()


def test_registered_with_gymnasium():
    register()
    env = gym.make(ENV_ID, traces=[_trace(1, 3)], cluster=CHIC)
    obs, info = env.reset(seed=0)
    assert obs.shape == (env.unwrapped.dl2_spec.obs_size,)
    env.close()


def test_sb3_checker_and_a_few_maskableppo_updates():
    """Stable-Baselines3's env checker passes and MaskablePPO (sb3-contrib) learns on it through
    action_masks(): two rollouts of 64 steps over episodes of two tiny traces."""
    pytest.importorskip("sb3_contrib")
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.env_checker import check_env as sb3_check

    env = DL2Env([_trace(1, 3), _trace(2, 3)], CHIC)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sb3_check(env)
        model = MaskablePPO("MlpPolicy", env, n_steps=64, batch_size=32, n_epochs=1, seed=0, device="cpu")
        model.learn(128)
    assert model.num_timesteps == 128
    env.close()


def test_an_environment_dropped_mid_episode_ends_its_thread():
    import gc
    import time

    before = threading.active_count()
    env = DL2Env([_trace(1)], CHIC)
    env.reset(seed=0)
    assert threading.active_count() == before + 1
    del env
    gc.collect()
    for _ in range(200):  # the thread ends on its own once told (no join here)
        if threading.active_count() == before:
            break
        time.sleep(0.01)
    assert threading.active_count() == before
