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

from collections.abc import Sequence

import numpy as np
from gymnasium import spaces

from policies.cluster import ClusterSpec
from policies.codecs.sizefree import N_CAND, SizeFreeCodec, SizeFreeSpec
from policies.job import JobSpec
from policies.perf import ContentionModel
from trainer.common.pick_env import EventRounds, PickEnv, register_env

__all__ = ["ENV_ID", "SizeFreeEnv"]

ENV_ID = "rlsched/SizeFree-v0"


class SizeFreeEnv(PickEnv):
    """``rl-sf``'s picks on a simulated cluster (module docstring; the step / reset bookkeeping is
    :class:`trainer.common.pick_env.PickEnv`'s).

    :param traces: job sets; each episode draws one (seeded by ``reset``) or plays
        ``reset(options={"trace": i})``.
    :param cluster: cluster spec or ``"4x8"``.
    :param spec: the codec spec (default :class:`SizeFreeSpec` with the cluster's largest node).
    """

    def __init__(self, traces: Sequence[Sequence[JobSpec]], cluster: ClusterSpec | str = "4x8",
                 spec: SizeFreeSpec | None = None, max_steps: int = 100_000, invalid_penalty: float = -0.1,
                 perf: ContentionModel | None = None) -> None:
        super().__init__(traces, cluster, max_steps, invalid_penalty, sim_policy=EventRounds("rl-sf", "SizeFreeEnv"))
        self.perf = perf or ContentionModel(self.cluster)
        self.codec = SizeFreeCodec(self.cluster, self.perf, spec)
        self.obs_spec = self.codec.spec
        self.observation_space = spaces.Box(-1.0, 1.0, shape=self.obs_spec.shape, dtype=np.float32)
        self.action_space = spaces.Discrete(self.obs_spec.n_actions)
        self.noop_action = self.obs_spec.hold
        self._submit = np.zeros(0, dtype=np.float64)
        self._s0 = 0.0

    def _in_system(self, t: float) -> float:
        """``S(t)`` (module docstring), seconds."""
        sim = self.sim
        assert sim is not None
        fin = np.array([j.finish for j in sim.jobs], dtype=np.float64)
        end = np.where(np.isnan(fin), t, np.minimum(fin, t))
        return float(np.maximum(end - self._submit, 0.0).sum())

    def _obs(self) -> np.ndarray:
        if self._enc is None:
            out = np.zeros(self.obs_spec.shape, dtype=np.float32)
            out[(self.obs_spec.n_candidates - 1) * N_CAND] = 1.0  # the hold row only
            return out
        assert self._enc.obs is not None
        return np.clip(self._enc.obs, -1.0, 1.0)

    def _on_reset(self, settled: bool) -> None:
        if not settled:
            assert self.sim is not None
            self._submit = np.array([j.spec.submit_time for j in self.sim.jobs], dtype=np.float64)

    def _step_begin(self) -> None:
        assert self.sim is not None
        self._s0 = self._in_system(self.sim.time)

    def _step_reward(self, reward: float) -> float:
        """Minus the growth of ``S`` over the step, in hours per job (module docstring)."""
        sim = self.sim
        assert sim is not None
        return reward - (self._in_system(sim.time) - self._s0) / (3600.0 * len(sim.jobs))

    def expert_action(self, slot: str = "greedy") -> int:
        """The heuristic's pick now (:meth:`SizeFreeCodec.expert_action`)."""
        if self._enc is None:
            return self.obs_spec.hold
        return self.codec.expert_action(self._enc, slot)


def register() -> None:
    """Register :data:`ENV_ID` with Gymnasium (idempotent)."""
    register_env(ENV_ID, "trainer.sizefree.env:SizeFreeEnv")


register()
