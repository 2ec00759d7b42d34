"""Gymnasium environment contract (trainer.env)."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.cluster import ClusterSpec
from policies.job import JobSpec
from policies.perf import ContentionModel
from trainer.env import ENV_ID, PlacementEnv, load_trace_dir, reference_jct
from trainer.generate import GeneratorConfig, generate_jobs
from trainer.traces import TRACE_SUFFIXES, TraceError, write_trace

C48 = ClusterSpec.parse("4x8")
PERF = ContentionModel(C48)


def _jobs(n: int = 24, seed: int = 0, arrival: str = "zero") -> list[JobSpec]:
    return generate_jobs(C48, GeneratorConfig(num_jobs=n, seed=seed, arrival=arrival, duration_s=1800.0), PERF)


def _run(env: PlacementEnv, policy: str, seed: int, rng_seed: int = 0):
    rng = np.random.default_rng(rng_seed)
    obs, _ = env.reset(seed=seed)
    total, steps, trace = 0.0, 0, []
    while True:
        m = env.action_masks()
        a = int(rng.choice(np.flatnonzero(m))) if policy == "random" else int(np.flatnonzero(m)[0])
        obs, r, term, trunc, info = env.step(a)
        assert env.observation_space.contains(obs)
        trace.append((a, r))
        total += r
        steps += 1
        if term or trunc:
            return total, steps, trace, info


def test_gymnasium_check_env():
    from gymnasium.utils.env_checker import check_env

    env = PlacementEnv([_jobs()], C48, perf=PERF)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_env(env, skip_render_check=True)


def test_sb3_check_env():
    from stable_baselines3.common.env_checker import check_env

    for reward in ("progress", "jct", "jct-rel", "seed"):
        check_env(PlacementEnv([_jobs()], C48, reward=reward, perf=PERF), warn=False)


def test_registered_id():
    env = gym.make(ENV_ID, traces=[_jobs(8)], cluster="4x8")
    obs, _info = env.reset(seed=1)
    assert obs.shape == env.observation_space.shape
    env.close()


@pytest.mark.parametrize("reward", ["progress", "jct", "jct-rel", "seed"])
def test_episode_finishes_all_jobs(reward):
    env = PlacementEnv([_jobs(32)], C48, reward=reward, perf=PERF, shaping=False)
    total, _steps, _, info = _run(env, "random", 0)
    assert info["finished"] == 32 and env.sim.done
    assert np.isfinite(total)
    if reward == "progress":  # every job contributes its whole progress exactly once
        assert total == pytest.approx(32.0, rel=1e-6)
    if reward == "jct":  # undiscounted return = -sum(JCT) / (round_len * jobs)
        res = env.sim.result()
        assert total == pytest.approx(-sum(r.jct for r in res.jobs) / (300.0 * 32), rel=1e-6)
    if reward == "jct-rel":  # undiscounted return = -avg JCT / reference avg JCT (greedy-np)
        res = env.sim.result()
        ref = reference_jct([_jobs(32)], C48, PERF)[0]
        assert env.reference == [ref]
        assert total == pytest.approx(-np.mean([r.jct for r in res.jobs]) / ref, rel=1e-6)


def test_jct_rel_reference_checked():
    with pytest.raises(ValueError, match="reference"):
        PlacementEnv([_jobs(8)], C48, reward="jct-rel", perf=PERF, reference=[0.0])
    with pytest.raises(ValueError, match="reference"):
        PlacementEnv([_jobs(8)], C48, reward="jct-rel", perf=PERF, reference=[1.0, 2.0])


def test_empty_traces_are_rejected_with_a_clear_error():
    """An empty trace is refused when the environment is built (reset() would pop an empty event heap)."""
    with pytest.raises(ValueError, match=r"trace 0 \(0-based\) has no jobs"):
        PlacementEnv([[]], C48, perf=PERF)
    with pytest.raises(ValueError, match=r"trace 1 \(0-based\) has no jobs \(2 empty traces\)"):
        PlacementEnv([_jobs(4), [], []], C48, perf=PERF)


def _uniform_batch() -> list[JobSpec]:
    """Equal-length jobs of every demand 1..32, all at t = 0: the "plan" order's waves."""
    out = []
    for d in range(1, 33):
        b = PERF.best_isolated_throughput("FSDP", d)
        out += [JobSpec(f"u{d}-{i}", 0.0, "FSDP", d, 3600.0 * b * (1 + 0.001 * i)) for i in range(4)]
    return out


@pytest.mark.parametrize("jobs", [_uniform_batch(), _jobs(40, seed=3, arrival="poisson")], ids=["batch", "poisson"])
def test_env_rounds_match_the_policy_rounds(jobs):
    """The env driven by a policy's own choices gives the simulator's results with that policy: the
    env's codec rounds (a new one after every advance of time) are RLPolicy.schedule's, so the
    "plan" order's plan is made and kept exactly as in the simulator."""
    from policies.rl import make_rl_policy
    from trainer.simulator import SimConfig, Simulator

    pol = make_rl_policy("rl-prior", C48, PERF)
    want = Simulator(C48, jobs, pol, PERF, SimConfig()).run()
    env = PlacementEnv([jobs], C48, perf=PERF, order="plan", k=pol.codec.spec.k, aging_s=pol.codec.spec.aging_s)
    env.reset(seed=0)
    done = False
    while not done:
        a = pol.act(env._enc) if env._enc is not None else env.spec_obs.noop
        *_, term, trunc, _info = env.step(a)
        done = term or trunc
    got = {j.spec.job_id: (j.first_start, j.finish) for j in env.sim.jobs}
    assert got == {r.job_id: (r.first_start, r.finish_time) for r in want.jobs}


def test_deterministic_replay():
    a = _run(PlacementEnv([_jobs(seed=1), _jobs(seed=2)], C48, perf=PERF), "random", seed=7, rng_seed=3)
    b = _run(PlacementEnv([_jobs(seed=1), _jobs(seed=2)], C48, perf=PERF), "random", seed=7, rng_seed=3)
    assert a[2] == b[2] and a[0] == b[0]


def test_invalid_action_is_penalised_not_applied():
    env = PlacementEnv([_jobs(16)], C48, reward="jct", perf=PERF, invalid_penalty=-0.5)
    env.reset(seed=0)
    env.step(int(np.flatnonzero(env.action_masks())[0]))  # start one job so waiting is allowed
    running = len(env.sim.running)
    bad = int(np.flatnonzero(~env.action_masks())[-1])
    _, r, *_ = env.step(bad)
    assert r <= -0.5  # penalty plus the (negative) jct reward of the time that passed
    assert len(env.sim.running) <= running  # nothing was started
    env.sim.check_invariants()


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10_000), st.integers(0, 10_000), st.sampled_from(["zero", "poisson"]))
def test_masked_random_policy_never_applies_invalid(trace_seed, rng_seed, arrival):
    """Property: with the mask, every applied placement fits and invariants hold."""
    env = PlacementEnv([_jobs(20, trace_seed, arrival)], C48, perf=PERF)
    env.reset(seed=0)
    rng = np.random.default_rng(rng_seed)
    for _ in range(400):
        m = env.action_masks()
        assert m.any()
        a = int(rng.choice(np.flatnonzero(m)))
        _, _, term, trunc, _ = env.step(a)
        env.sim.check_invariants()
        if term or trunc:
            break
    assert env.sim.done


def test_first_valid_beats_random():
    env = PlacementEnv([_jobs(48, 3)], C48, reward="jct", perf=PERF)
    first = _run(env, "first", 0)[0]
    rand = np.mean([_run(env, "random", 0, s)[0] for s in range(3)])
    assert first > rand


def _key(jobs):
    return [(j.job_id, j.submit_time, j.model, j.gpu_demand, j.total_samples) for j in jobs]


def test_load_trace_dir_reads_every_trace_suffix(tmp_path: Path):
    """The directory loader takes every suffix load_trace reads (``.pq`` was skipped)."""
    sets = [_jobs(6, seed=k) for k in range(len(TRACE_SUFFIXES))]
    assert ".pq" in TRACE_SUFFIXES
    for k, suffix in enumerate(TRACE_SUFFIXES):
        sub = tmp_path / "sub" if k % 2 else tmp_path  # searched recursively
        sub.mkdir(exist_ok=True)
        write_trace(sub / f"set{k}{suffix.upper() if k == 1 else suffix}", sets[k])  # suffixes case-insensitive
    (tmp_path / "README.md").write_text("not a trace")
    got = load_trace_dir(tmp_path, C48)
    assert sorted(map(_key, got)) == sorted(map(_key, sets))
    assert _key(load_trace_dir(tmp_path / "sub" / f"set1{TRACE_SUFFIXES[1].upper()}", C48)[0]) == _key(sets[1])


def test_load_trace_dir_empty_names_the_suffixes(tmp_path: Path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(TraceError) as ei:
        load_trace_dir(tmp_path, C48)
    assert str(tmp_path) in str(ei.value) and "no trace files" in str(ei.value)
    assert all(f"*{s}" in str(ei.value) for s in TRACE_SUFFIXES)


@pytest.mark.parametrize("bad", [-1, 2, 1.7, 1.0, True, np.bool_(False), "0", None])
def test_reset_trace_option_must_be_an_index_in_range(bad):
    """options={"trace": t} takes only an integer index in range: -1, 1.7, True and out-of-range values are
    a ValueError (not taken as another index, nor a bare IndexError)."""
    env = PlacementEnv([_jobs(4), _jobs(4, seed=1)], C48, perf=PERF)
    with pytest.raises(ValueError, match=r"'trace'.*integer index in \[0, 1\] \(2 traces\)"):
        env.reset(seed=0, options={"trace": bad})


def test_reset_trace_option_picks_the_trace():
    env = PlacementEnv([_jobs(4), _jobs(4, seed=1)], C48, perf=PERF)
    for t in (1, np.int64(0), 0):
        _, info = env.reset(seed=0, options={"trace": t})
        assert info["trace"] == int(t) and type(info["trace"]) is int


_GOLDEN = Path(__file__).resolve().parent / "golden"


def _record_env():
    import importlib.util

    spec = importlib.util.spec_from_file_location("golden_record_env", _GOLDEN / "record_env.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_REC = _record_env()


@pytest.mark.parametrize("case", _REC.CASES, ids=[c[0] for c in _REC.CASES])
def test_episodes_match_golden(case):
    """Episodes of a seeded random policy (masked, and some cases with invalid actions) on trace0 slices and
    the golden Poisson / heavy sets, every reward kind, shaping on and off, truncation: the actions, masks,
    flags and finished counts of every step (digest), step counts, final times and reward sums are as
    recorded by ``tests/golden/record_env.py``."""
    want = json.loads((_GOLDEN / "env.json").read_text())[case[0]]
    got = _REC.summary(_REC.play(case))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert (g["steps"], g["finished"], g["terminated"], g["truncated"]) == (
            w["steps"], w["finished"], w["terminated"], w["truncated"])
        assert g["digest"] == w["digest"]
        assert math.isclose(g["time"], w["time"], rel_tol=1e-12)
        assert math.isclose(g["reward_sum"], w["reward_sum"], rel_tol=1e-9, abs_tol=1e-12)


def test_agent_ignoring_the_mask_is_truncated_not_stopped():
    """An agent that always answers "nothing", also where it is invalid (an idle cluster with jobs waiting),
    leaves the cluster idle round after round: each step costs the penalty and moves to the next round, and
    the episode is truncated at max_steps, past the simulator's default idle-round guard (no error)."""
    from trainer.simulator import SimConfig

    steps = SimConfig.max_idle_rounds + 5
    env = PlacementEnv([_jobs(2)], C48, reward="jct", perf=PERF, max_steps=steps, invalid_penalty=-0.5)
    env.reset(seed=0)
    noop = env.spec_obs.noop
    assert not env.action_masks()[noop]
    t0 = env.sim.time
    for i in range(steps):
        _, r, term, trunc, info = env.step(noop)
        assert r == pytest.approx(-0.5 - 2 / 2) and not term and trunc == (i == steps - 1)
    assert info["time"] == pytest.approx(t0 + steps * 300.0) and not env.sim.running
