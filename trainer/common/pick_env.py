"""The one-pick Gymnasium environment: the bookkeeping every learned-policy environment of rlsched
shares (:class:`trainer.env.PlacementEnv`, :class:`trainer.sced2.env.Sced2Env`,
:class:`trainer.sizefree.env.SizeFreeEnv`).

:class:`PickEnv` drives the round loop's simulator backend (:class:`trainer.sim_backend.SimBackend`)
with a codec round (:class:`policies.codecs.base.CodecRound`): one environment step is one pick of
the codec's actions.

* ``reset`` plays one of the traces (drawn with the environment's seeded generator, or
  ``options={"trace": i}``), on a simulator kept per trace and reset between episodes, and goes on
  to the first round with a placement to decide;
* a placement action is applied as ``backend.apply(Decision(place=[(job, placement)]))``
  (validated on a fresh snapshot; time does not move) and on the codec round (``round.place``),
  which is encoded again: the agent is asked again while some placement is valid;
* the codec's "nothing" action (its :attr:`PickEnv.noop_action`), or no valid placement left,
  closes the round: ``backend.next_round()`` runs the simulation to the next round with a
  placement to decide, and a codec round begins on its snapshot. With no round left every job
  has finished (``terminated``);
* an invalid action (only from an agent that ignores :meth:`PickEnv.action_masks`) earns
  ``invalid_penalty``; it closes the round where "nothing" is valid (or where the subclass sets
  :attr:`PickEnv.invalid_closes_round`), and else leaves the state as it is;
* an episode is ``truncated`` after ``max_steps`` steps.

A subclass builds its codec (``self.codec``), its observation and action spaces and the index of
its "nothing" action, gives the observation of the current encoding (:meth:`PickEnv._obs`), and
adds its reward through the hooks :meth:`PickEnv._backend_for` (e.g. a backend that reports each move
of time), :meth:`PickEnv._on_reset`, :meth:`PickEnv._on_pick`, :meth:`PickEnv._step_begin` and
:meth:`PickEnv._step_reward`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import math
from collections.abc import Sequence
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

from policies.base import Policy
from policies.cluster import ClusterSpec
from policies.codecs.base import CodecRound, Encoding
from policies.compat import CompatMode
from policies.job import JobSpec
from policies.state import ClusterState, Decision
from trainer.sim_backend import SimBackend
from trainer.simulator import SimConfig, Simulator

__all__ = ["EventRounds", "PickEnv", "check_traces", "register_env", "trace_option"]


class EventRounds(Policy):
    """The simulator's policy while an environment drives it: never asked (the environment decides);
    ``time_invariant``, so that rounds come at events only (arrivals, completions).

    :param name: the policy name the simulator reports (the deployed policy's).
    :param owner: the environment's class name, for the error should it be asked.
    """

    time_invariant = True

    def __init__(self, name: str, owner: str) -> None:
        self.name = name
        self.owner = owner

    def schedule(self, state: ClusterState) -> Decision:  # pragma: no cover - the environment drives the rounds
        raise RuntimeError(f"{self.owner} decides its rounds itself")


def check_traces(owner: str, traces: Sequence[Sequence[JobSpec]]) -> list[list[JobSpec]]:
    """The job sets as lists; :class:`ValueError` naming ``owner`` when there is none or one is empty."""
    if not traces:
        raise ValueError(f"{owner} needs at least one trace")
    empty = [i for i, t in enumerate(traces) if len(t) == 0]
    if empty:
        raise ValueError(
            f"{owner}: trace {empty[0]} (0-based) has no jobs"
            + (f" ({len(empty)} empty traces)" if len(empty) > 1 else "")
            + "; an episode needs at least one job"
        )
    return [list(t) for t in traces]


def trace_option(options: dict | None, n: int, rng: np.random.Generator) -> int:
    """The trace index of an episode: ``options["trace"]`` (an integer in ``[0, n)``; anything else is a
    :class:`ValueError`) or a uniform draw from ``rng``."""
    if options and "trace" in options:
        idx = options["trace"]
        if isinstance(idx, (bool, np.bool_)) or not isinstance(idx, (int, np.integer)) or not 0 <= idx < n:
            raise ValueError(
                f"reset(options={{'trace': {idx!r}}}): the trace option must be an integer index "
                f"in [0, {n - 1}] ({n} trace{'s' if n != 1 else ''})"
            )
        return int(idx)
    return int(rng.integers(n))


def register_env(env_id: str, entry_point: str) -> None:
    """Register ``env_id`` with Gymnasium at ``entry_point`` (``"module:Class"``; idempotent)."""
    if env_id not in gym.registry:
        gym.register(id=env_id, entry_point=entry_point)


class PickEnv(gym.Env, ABC):
    """One pick per step on a simulated cluster (module docstring).

    :param traces: job sets; each episode draws one uniformly (seeded by ``reset``), or plays the one of
        ``reset(options={"trace": i})``.
    :param cluster: cluster spec or its text form.
    :param max_steps: truncate episodes after this many steps.
    :param invalid_penalty: reward of an invalid action.
    :param round_len: the simulator's round boundary (s).
    :param compat: the peer simulator's rules the episodes run under (``None``: rlsched's own).
    :param sim_policy: the simulator's policy (``None``: rounds at every boundary as well as at events;
        :class:`EventRounds`: at events only).

    Attributes a subclass sets in its constructor: ``codec`` (the codec), ``perf`` (its performance
    model), ``observation_space``, ``action_space`` and :attr:`noop_action`.
    """

    metadata: ClassVar[dict] = {"render_modes": []}
    #: ``True``: an invalid action closes the round even where "nothing" is masked.
    invalid_closes_round: ClassVar[bool] = False

    def __init__(self, traces: Sequence[Sequence[JobSpec]], cluster: ClusterSpec | str, max_steps: int,
                 invalid_penalty: float, round_len: float = SimConfig.round_len,
                 compat: CompatMode | None = None, sim_policy: Policy | None = None) -> None:
        super().__init__()
        self.traces = check_traces(type(self).__name__, traces)
        self.cluster = ClusterSpec.parse(cluster)
        self.compat = compat
        self.max_steps = int(max_steps)
        self.invalid_penalty = float(invalid_penalty)
        self.round_len = float(round_len)
        self._sim_policy = sim_policy
        #: index of the codec's "nothing" action (set by the subclass)
        self.noop_action = -1
        self._sims: dict[int, Simulator] = {}
        self.sim: Simulator | None = None
        #: the round timing of the episode's simulator (created by ``reset``)
        self.backend: SimBackend | None = None
        self._round: CodecRound | None = None  # the codec's round of the current simulator round
        self._enc: Encoding | None = None  # the current encoding; None once every job has finished
        self._steps = 0
        self.trace_index = -1

    # ------------------------------------------------------------------ subclass hooks
    @abstractmethod
    def _obs(self) -> np.ndarray:
        """The observation of the current encoding (``self._enc``, ``None`` once every job has finished)."""

    def _backend_for(self, sim: Simulator) -> SimBackend:
        """The episode's backend over ``sim``."""
        return SimBackend(sim)

    def _on_reset(self, settled: bool) -> None:
        """Called by ``reset`` before (``settled`` false) and after the first round is reached."""

    def _on_pick(self, enc: Encoding, action: int, decision: tuple[str, Any]) -> float:
        """Reward of the valid placement ``action`` of ``enc``, ``decision`` its ``(job_id, placement)``
        (called after ``backend.apply``, before ``round.place``)."""
        return 0.0

    def _step_begin(self) -> None:
        """Called at the start of ``step``, before the action changes anything."""

    def _step_reward(self, reward: float) -> float:
        """The step's reward from the pick's ``reward`` (after the action and any move of time)."""
        return reward

    # ------------------------------------------------------------------ shared bookkeeping
    def _sim_for(self, i: int) -> Simulator:
        sim = self._sims.get(i)
        if sim is None:
            # the backend's idle guard (rounds in a row with the cluster idle, jobs waiting and nothing
            # started) stays above max_steps: an agent that ignores the mask truncates first. No
            # fragmentation / CS samples (metrics_interval): the rewards do not read them.
            cfg = SimConfig(round_len=self.round_len, metrics_interval=math.inf,
                            max_idle_rounds=max(SimConfig.max_idle_rounds, self.max_steps + 1), compat=self.compat)
            sim = self._sims[i] = Simulator(self.cluster, self.traces[i], self._sim_policy, self.perf, cfg)
        else:
            sim.reset_state()
        return sim

    def _settle(self) -> None:
        """Close the round and move on to the next round with a decision to make: ``backend.next_round()``
        (rounds in which jobs wait), a new codec round on its snapshot, until some placement is valid.
        With no round left every job has finished: no encoding (``self._enc`` is ``None``)."""
        backend = self.backend
        assert backend is not None
        while backend.next_round():
            self._round = self.codec.begin(backend.snapshot())
            self._enc = self._round.encode()
            if self._enc.any_placement:
                return
        self._round = None
        self._enc = None

    def _info(self) -> dict[str, Any]:
        sim = self.sim
        assert sim is not None
        return {"time": sim.time, "finished": sim.finished, "jobs": len(sim.jobs), "trace": self.trace_index}

    # ------------------------------------------------------------------ gym API
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.trace_index = trace_option(options, len(self.traces), self.np_random)
        self.sim = sim = self._sim_for(self.trace_index)
        self.backend = self._backend_for(sim)
        self._steps = 0
        self._round = None  # a new episode: no round (nor plan) from the last one
        self._enc = None
        self._on_reset(False)
        self._settle()
        self._on_reset(True)
        return self._obs(), self._info()

    def action_masks(self) -> np.ndarray:
        """bool ``[n_actions]``: the valid actions now (only "nothing" once every job has finished);
        sb3-contrib's MaskablePPO calls this."""
        if self._enc is None:
            m = np.zeros(self.action_space.n, dtype=bool)
            m[self.noop_action] = True
            return m
        return self._enc.mask.copy()

    def step(self, action):
        sim, backend = self.sim, self.backend
        if sim is None or backend is None:
            raise RuntimeError("call reset() before step()")
        a = int(action)
        reward = 0.0
        self._steps += 1
        enc = self._enc
        self._step_begin()
        if enc is not None:  # else the episode is over: nothing to do
            if 0 <= a < len(enc.mask) and enc.mask[a]:
                d = enc.decode(a)
            else:
                d = None
                reward += self.invalid_penalty
            if d is not None:
                backend.apply(Decision(place=[d]))  # validated on a fresh snapshot; time does not move
                reward += self._on_pick(enc, a, d)
                assert self._round is not None
                self._round.place(*d)
                self._enc = self._round.encode()
                if not self._enc.any_placement:
                    self._settle()
            elif self.invalid_closes_round or enc.mask[self.noop_action]:
                self._settle()
            # else: an invalid action where "nothing" is masked too (an idle cluster that must start a
            # job): the state stays, so that time does not move on with nothing able to happen
        reward = self._step_reward(reward)
        terminated = sim.done
        truncated = not terminated and self._steps >= self.max_steps
        return self._obs(), float(reward), terminated, truncated, self._info()
