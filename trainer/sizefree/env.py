"""Gymnasium environment of ``rl-sf`` (id ``rlsched/SizeFree-v0``): one step is one pick.

:class:`SizeFreeEnv` drives :class:`trainer.sim_backend.SimBackend` the way
:class:`policies.sizefree.SizeFreePolicy` runs in it, with the same codec round
(:class:`policies.codecs.sizefree.SizeFreeRound`): rounds come at events only (arrivals,
completions); action ``i`` < hold starts candidate ``i`` (``backend.apply``, time does not move) and
the agent is asked again while some candidate is valid; hold, or nothing valid, runs the simulation
to the next event at which some candidate is valid.

**Observation**: the codec's flat observation (its length is independent of the cluster).
**Mask**: :meth:`SizeFreeEnv.action_masks` (sb3-contrib's MaskablePPO reads it).

**Reward**: minus the growth of the jobs' summed time in system over the step,
``-(S(t1) - S(t0)) / (3600 n)``, ``S(t) = sum_j (min(t, finish_j) - submit_j)`` over the jobs
submitted by ``t``, ``n`` the trace's jobs: the undiscounted return of an episode is minus its
average JCT in hours (the quantity the policy is judged on).

An episode ends (``terminated``) when every job has finished, or is ``truncated`` after
``max_steps`` steps. An invalid action earns ``invalid_penalty`` and is treated as hold (or, where
hold is masked, leaves the state).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from policies.base import Policy
from policies.cluster import ClusterSpec
from policies.codecs.sizefree import N_CAND, SizeFreeCodec, SizeFreeEncoding, SizeFreeRound, SizeFreeSpec
from policies.job import JobSpec
from policies.perf import ContentionModel
from policies.state import ClusterState, Decision
from trainer.sim_backend import SimBackend
from trainer.simulator import SimConfig, Simulator

__all__ = ["ENV_ID", "SizeFreeEnv"]

ENV_ID = "rlsched/SizeFree-v0"


class _EventRounds(Policy):
    """The simulator's policy while the environment drives it (never asked; event rounds only)."""

    name = "rl-sf"
    time_invariant = True

    def schedule(self, state: ClusterState) -> Decision:  # pragma: no cover - the environment decides
        raise RuntimeError("SizeFreeEnv decides its rounds itself")


class SizeFreeEnv(gym.Env):
    """``rl-sf``'s picks on a simulated cluster (module docstring).

    :param traces: job sets; each episode draws one (seeded by ``reset``) or plays
        ``reset(options={"trace": i})``.
    :param cluster: cluster spec or ``"4x8"``.
    :param spec: the codec spec (default :class:`SizeFreeSpec` with the cluster's largest node).
    """

    metadata: ClassVar[dict] = {"render_modes": []}

    def __init__(self, traces: Sequence[Sequence[JobSpec]], cluster: ClusterSpec | str = "4x8",
                 spec: SizeFreeSpec | None = None, max_steps: int = 100_000, invalid_penalty: float = -0.1,
                 perf: ContentionModel | None = None) -> None:
        super().__init__()
        if not traces or any(len(t) == 0 for t in traces):
            raise ValueError("SizeFreeEnv needs at least one trace, and no empty trace")
        self.cluster = ClusterSpec.parse(cluster)
        self.perf = perf or ContentionModel(self.cluster)
        self.codec = SizeFreeCodec(self.cluster, self.perf, spec)
        self.obs_spec = self.codec.spec
        self.traces = [list(t) for t in traces]
        self.max_steps = int(max_steps)
        self.invalid_penalty = float(invalid_penalty)
        self.observation_space = spaces.Box(-1.0, 1.0, shape=self.obs_spec.shape, dtype=np.float32)
        self.action_space = spaces.Discrete(self.obs_spec.n_actions)
        self._sims: dict[int, Simulator] = {}
        self.sim: Simulator | None = None
        self.backend: SimBackend | None = None
        self._round: SizeFreeRound | None = None
        self._enc: SizeFreeEncoding | None = None
        self._steps = 0
        self._t = 0.0
        self.trace_index = -1

    def _sim_for(self, i: int) -> Simulator:
        sim = self._sims.get(i)
        if sim is None:
            cfg = SimConfig(metrics_interval=math.inf,
                            max_idle_rounds=max(SimConfig.max_idle_rounds, self.max_steps + 1))
            sim = self._sims[i] = Simulator(self.cluster, self.traces[i], _EventRounds(), self.perf, cfg)
        else:
            sim.reset_state()
        return sim

    def _in_system(self, t: float) -> float:
        """``S(t)`` (module docstring), seconds."""
        sim = self.sim
        assert sim is not None
        fin = np.array([j.finish for j in sim.jobs], dtype=np.float64)
        end = np.where(np.isnan(fin), t, np.minimum(fin, t))
        return float(np.maximum(end - self._submit, 0.0).sum())

    def _settle(self) -> None:
        backend = self.backend
        assert backend is not None
        while backend.next_round():
            self._round = self.codec.begin(backend.snapshot())
            self._enc = self._round.encode()
            if self._enc.any_placement:
                return
        self._round = None
        self._enc = None

    def _obs(self) -> np.ndarray:
        if self._enc is None:
            out = np.zeros(self.obs_spec.shape, dtype=np.float32)
            out[(self.obs_spec.n_candidates - 1) * N_CAND] = 1.0  # the hold row only
            return out
        assert self._enc.obs is not None
        return np.clip(self._enc.obs, -1.0, 1.0)

    def _info(self) -> dict[str, Any]:
        sim = self.sim
        assert sim is not None
        return {"time": sim.time, "finished": sim.finished, "jobs": len(sim.jobs), "trace": self.trace_index}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        n = len(self.traces)
        if options and "trace" in options:
            idx = options["trace"]
            if isinstance(idx, (bool, np.bool_)) or not isinstance(idx, (int, np.integer)) or not 0 <= idx < n:
                raise ValueError(f"reset(options={{'trace': {idx!r}}}): expected an integer in [0, {n - 1}]")
            idx = int(idx)
        else:
            idx = int(self.np_random.integers(n))
        self.trace_index = idx
        self.sim = self._sim_for(idx)
        self._submit = np.array([j.spec.submit_time for j in self.sim.jobs], dtype=np.float64)
        self.backend = SimBackend(self.sim)
        self._steps = 0
        self._settle()
        self._t = self.sim.time
        return self._obs(), self._info()

    def action_masks(self) -> np.ndarray:
        """bool ``[J * P + 1]``: the valid actions now (only hold once every job has finished)."""
        if self._enc is None:
            m = np.zeros(self.obs_spec.n_actions, dtype=bool)
            m[-1] = True
            return m
        return self._enc.mask.copy()

    def expert_action(self, slot: str = "greedy") -> int:
        """The heuristic's pick now (:meth:`SizeFreeCodec.expert_action`)."""
        if self._enc is None:
            return self.obs_spec.hold
        return self.codec.expert_action(self._enc, slot)

    def step(self, action):
        sim, backend = self.sim, self.backend
        if sim is None or backend is None:
            raise RuntimeError("call reset() before step()")
        a = int(action)
        reward = 0.0
        self._steps += 1
        enc = self._enc
        s0 = self._in_system(sim.time)
        if enc is not None:
            if 0 <= a < len(enc.mask) and enc.mask[a]:
                d = enc.decode(a)
            else:
                d = None
                reward += self.invalid_penalty
            if d is not None:
                backend.apply(Decision(place=[d]))
                assert self._round is not None
                self._round.place(*d)
                self._enc = self._round.encode()
                if not self._enc.any_placement:
                    self._settle()
            elif enc.mask[self.obs_spec.hold]:
                self._settle()
        reward -= (self._in_system(sim.time) - s0) / (3600.0 * len(sim.jobs))
        terminated = sim.done
        truncated = not terminated and self._steps >= self.max_steps
        return self._obs(), float(reward), terminated, truncated, self._info()


def register() -> None:
    """Register :data:`ENV_ID` with Gymnasium (idempotent)."""
    if ENV_ID not in gym.registry:
        gym.register(id=ENV_ID, entry_point="trainer.sizefree.env:SizeFreeEnv")


register()
