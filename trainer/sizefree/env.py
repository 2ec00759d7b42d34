"""Gymnasium environment of ``rl-sf`` (id ``rlsched/SizeFree-v0``): one step is one pick.

:class:`SizeFreeEnv` drives :class:`trainer.sim_backend.SimBackend` the way
:class:`policies.sizefree.SizeFreePolicy` runs in it, with the same codec round
(:class:`policies.codecs.sizefree.SizeFreeRound`): rounds come at events only (arrivals,
completions); action ``i`` < hold starts candidate ``i`` (``backend.apply``, time does not move) and
the agent is asked again while some candidate is valid; hold, or nothing valid, runs the simulation
to the next event at which some candidate is valid. With preempt candidates in the codec spec
(``spec.preempt`` > 0), a preempt action stops its running job
(``backend.apply(Decision(preempt=[job]))``, the simulator's preemption: the job waits again with
its progress and pays the restart overhead when it starts again) and on the codec round
(:meth:`~policies.codecs.sizefree.SizeFreeRound.preempt`); time does not move and the agent is
asked again.

**Observation**: the codec's flat observation (its length is independent of the cluster).
**Mask**: :meth:`SizeFreeEnv.action_masks` (sb3-contrib's MaskablePPO reads it).

**Reward**: minus the growth of the jobs' summed time in system over the step,
``-(S(t1) - S(t0)) / (3600 n)``, ``S(t) = sum_j (min(t, finish_j) - submit_j)`` over the jobs
submitted by ``t``, ``n`` the trace's jobs: the undiscounted return of an episode is minus its
average JCT in hours (the quantity the policy is judged on).

With ``w1`` (the reward-weight branches A-E, seed 002's eq. 2): the reward is instead the time
integral of ``-W1 * CS + W2 * Util`` over the step, ``W2 = 1 - W1``, in hours (rate per hour times
the step's simulated hours; placement steps, which do not move time, earn 0): ``CS`` the mean
contention sensitivity of the running jobs (1 when none runs), ``Util`` the allocated fraction of
the cluster's GPUs. The time before the first decision earns nothing.

An episode ends (``terminated``) when every job has finished, or is ``truncated`` after
``max_steps`` steps. An invalid action earns ``invalid_penalty`` and is treated as hold (or, where
hold is masked, leaves the state).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from gymnasium import spaces

from policies.cluster import ClusterSpec
from policies.codecs.sizefree import SizeFreeCodec, SizeFreeSpec
from policies.job import JobSpec
from policies.perf import ContentionModel
from policies.state import Decision
from trainer.common.pick_env import EventRounds, PickEnv, register_env
from trainer.sim_backend import SimBackend
from trainer.simulator import Simulator

__all__ = ["ENV_ID", "SizeFreeEnv"]

ENV_ID = "rlsched/SizeFree-v0"


class SizeFreeEnv(PickEnv):
    """``rl-sf``'s picks on a simulated cluster (module docstring; the step / reset bookkeeping is
    :class:`trainer.common.pick_env.PickEnv`'s).

    :param traces: job sets; each episode draws one (seeded by ``reset``) or plays
        ``reset(options={"trace": i})``.
    :param cluster: cluster spec or ``"4x8"``.
    :param spec: the codec spec (default :class:`SizeFreeSpec` with the cluster's largest node).
    :param w1: ``None`` for the JCT reward; else W1 in ``[0, 1]`` of the seed reward (module docstring).
    """

    def __init__(self, traces: Sequence[Sequence[JobSpec]], cluster: ClusterSpec | str = "4x8",
                 spec: SizeFreeSpec | None = None, max_steps: int = 100_000, invalid_penalty: float = -0.1,
                 perf: ContentionModel | None = None, w1: float | None = None) -> None:
        if w1 is not None and not 0.0 <= w1 <= 1.0:
            raise ValueError(f"SizeFreeEnv: w1 must be in [0, 1] or None, got {w1!r}")
        super().__init__(traces, cluster, max_steps, invalid_penalty, sim_policy=EventRounds("rl-sf", "SizeFreeEnv"))
        self.w1 = None if w1 is None else float(w1)
        # the seed reward's integration (w1 set): reward earned and not paid yet, time of the last
        # on_advance call (s) and the reward rate (per hour) of the state since then
        self._acc = 0.0
        self._t_prev = 0.0
        self._rate_prev = 0.0
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
            out[(self.obs_spec.n_candidates - 1) * self.obs_spec.cand_features] = 1.0  # the hold row only
            return out
        assert self._enc.obs is not None
        return np.clip(self._enc.obs, -1.0, 1.0)

    def _seed_rate(self) -> float:
        """``-W1 * CS + W2 * Util`` of the current (constant) state, per hour."""
        sim = self.sim
        assert sim is not None and self.w1 is not None
        cs = float(np.mean([j.cs for j in sim.running.values()])) if sim.running else 1.0
        util = 1.0 - float(sim.free.sum()) / float(sim.capacity.sum())
        return -self.w1 * cs + (1.0 - self.w1) * util

    def _integrate(self, t: float) -> None:
        """The backend's ``on_advance`` hook at time ``t`` (s), before time moves on: add the seed reward of
        the state held since the last call, then take the rate of the state at ``t``."""
        self._acc += self._rate_prev * (t - self._t_prev) / 3600.0
        self._t_prev = t
        self._rate_prev = self._seed_rate()

    def _backend_for(self, sim: Simulator) -> SimBackend:
        return SimBackend(sim) if self.w1 is None else SimBackend(sim, on_advance=self._integrate)

    def _on_reset(self, settled: bool) -> None:
        assert self.sim is not None
        if not settled:
            self._submit = np.array([j.spec.submit_time for j in self.sim.jobs], dtype=np.float64)
            self._acc, self._t_prev, self._rate_prev = 0.0, self.sim.time, 0.0
        elif self.w1 is not None:  # the time before the first decision earns nothing
            self._integrate(self.sim.time)
            self._acc = 0.0

    def _step_begin(self) -> None:
        assert self.sim is not None
        if self.w1 is None:
            self._s0 = self._in_system(self.sim.time)

    def _step_reward(self, reward: float) -> float:
        """Minus the growth of ``S`` over the step, in hours per job, or the seed reward earned over the
        step (module docstring)."""
        sim = self.sim
        assert sim is not None
        if self.w1 is not None:
            self._integrate(sim.time)
            r, self._acc = self._acc, 0.0
            return reward + r
        return reward - (self._in_system(sim.time) - self._s0) / (3600.0 * len(sim.jobs))

    def step(self, action):
        """One pick (module docstring): a valid preempt action here, anything else as
        :meth:`trainer.common.pick_env.PickEnv.step`."""
        enc = self._enc
        a = int(action)
        if enc is None or not 0 <= a < len(enc.mask) or not enc.mask[a] or enc.victim(a) is None:
            return super().step(action)
        sim, backend = self.sim, self.backend
        assert sim is not None and backend is not None and self._round is not None
        self._steps += 1
        self._step_begin()
        jid = enc.victim(a)
        # the round first: the simulator's preemption changes the snapshot's job records in place
        self._round.preempt(jid)
        backend.apply(Decision(preempt=[jid]))  # validated on a fresh snapshot; time does not move
        self._enc = self._round.encode()
        if not self._enc.any_placement:
            self._settle()
        reward = self._step_reward(0.0)
        terminated = sim.done
        truncated = not terminated and self._steps >= self.max_steps
        return self._obs(), float(reward), terminated, truncated, self._info()

    @property
    def encoding(self):
        """The codec's encoding of the current state (:class:`policies.codecs.sizefree.SizeFreeEncoding`: its
        mask and candidates are the step's), ``None`` once every job has finished."""
        return self._enc

    def expert_action(self, slot: str = "greedy", order: str = "srtf") -> int:
        """The heuristic's pick now (:meth:`SizeFreeCodec.expert_action`)."""
        if self._enc is None:
            return self.obs_spec.hold
        return self.codec.expert_action(self._enc, slot, order)


def register() -> None:
    """Register :data:`ENV_ID` with Gymnasium (idempotent)."""
    register_env(ENV_ID, "trainer.sizefree.env:SizeFreeEnv")


register()
