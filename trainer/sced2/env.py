"""Gymnasium environment of SCED2 (id ``rlsched/Sced2-v0``): one step is one pick.

:class:`Sced2Env` drives the round loop's simulator backend (:class:`trainer.sim_backend.SimBackend`)
the way :class:`policies.sced2.Sced2Policy` runs in it, with the same codec round
(:class:`policies.codecs.sced2.Sced2Round`):

* rounds come at events only (arrivals, completions; the simulator's policy is marked
  ``time_invariant``, so boundaries where nothing changed are skipped, as ``rlsched simulate``
  skips them for ``sced2``);
* action ``i < J`` starts waiting job ``i`` on its packing placement: ``backend.apply`` (validated,
  time does not move) and ``round.place``; the agent is asked again while some job fits;
* action ``J`` ("none"), or no job fitting, closes the round: ``backend.next_round()`` runs the
  simulation to the next event at which jobs wait, and a new codec round begins there.

**Observation**: the codec's flat observation followed by its action mask as ``0.0`` / ``1.0``
(``J + 1`` values), so that the Q-network (:class:`trainer.sced2.qnet.Sced2TorchQ`) masks invalid
actions itself, in acting and in the DQN target's max.

**Reward** (seed eq. 2): a pick of job ``j`` earns ``E_j = T_ideal / (T_wait + T_actual)`` at the
step that starts it, with ``T_ideal`` its isolated run time on its best placement, ``T_wait`` its
wait until this start and ``T_actual`` its isolated run time on the placement packing gave it.
This is the seed's definition (its ``T_actual`` is the remaining time it writes into the GPU state
at the start); it is known when the job starts, so it is credited then. The simulator's actual run
time also includes the contention of the jobs around it, known only when the job ends; crediting
that would delay the reward by the whole run, and SCED2's model of a job's speed has no
contention. "none" earns 0. The undiscounted return is the sum of ``E_j`` over the jobs started,
i.e. ``jobs x`` average effectiveness.

An episode ends (``terminated``) when every job has finished, or is ``truncated`` after
``max_steps`` steps. An invalid action (only with an agent that ignores the mask) earns
``invalid_penalty`` and is treated as "none", or, where "none" is masked too, leaves the state as it
is.
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
from policies.codecs.sced2 import Sced2Codec, Sced2Encoding, Sced2Round, Sced2Spec
from policies.job import JobSpec
from policies.perf import ContentionModel
from policies.state import ClusterState, Decision
from trainer.sim_backend import SimBackend
from trainer.simulator import SimConfig, Simulator

__all__ = ["ENV_ID", "Sced2Env"]

ENV_ID = "rlsched/Sced2-v0"


class _EventRounds(Policy):
    """The simulator's policy while the environment drives it: never asked (the environment decides);
    ``time_invariant`` so that rounds come at events only."""

    name = "sced2"
    time_invariant = True

    def schedule(self, state: ClusterState) -> Decision:  # pragma: no cover - the environment drives the rounds
        raise RuntimeError("Sced2Env decides its rounds itself")


class Sced2Env(gym.Env):
    """SCED2's picks on a simulated cluster (module docstring).

    :param traces: job sequences; each episode draws one (seeded by ``reset``), or plays
        ``reset(options={"trace": i})``.
    :param cluster: cluster spec or ``"15x8"`` (homogeneous).
    :param spec: the codec spec (``None``: :meth:`Sced2Spec.for_cluster` with ``jobs`` / ``k``).
    :param jobs: waiting jobs shown ``J`` (seed: 10).
    :param k: profiled placements (seed: 4).
    :param max_steps: truncate after this many steps.
    :param invalid_penalty: reward of an invalid action.
    :param perf: performance model (default :class:`ContentionModel` of ``cluster``).
    :param round_len: the simulator's round boundary (s); with event rounds and nothing changing
        between events it only bounds how far a skipped stretch is looked at.
    """

    metadata: ClassVar[dict] = {"render_modes": []}

    def __init__(
        self,
        traces: Sequence[Sequence[JobSpec]],
        cluster: ClusterSpec | str = "15x8",
        spec: Sced2Spec | None = None,
        jobs: int = 10,
        k: int = 4,
        max_steps: int = 100_000,
        invalid_penalty: float = -0.1,
        perf: ContentionModel | None = None,
        round_len: float = 300.0,
    ) -> None:
        super().__init__()
        if not traces or any(len(t) == 0 for t in traces):
            raise ValueError("Sced2Env needs at least one trace, and no empty trace")
        self.cluster = ClusterSpec.parse(cluster)
        self.perf = perf or ContentionModel(self.cluster)
        self.codec = Sced2Codec(self.cluster, self.perf, spec or Sced2Spec.for_cluster(self.cluster, jobs, k))
        self.obs_spec = self.codec.spec
        self.traces = [list(t) for t in traces]
        self.max_steps = int(max_steps)
        self.invalid_penalty = float(invalid_penalty)
        self.round_len = float(round_len)
        n = self.obs_spec.size + self.obs_spec.n_actions
        self.observation_space = spaces.Box(0.0, 1.0, shape=(n,), dtype=np.float32)
        self.action_space = spaces.Discrete(self.obs_spec.n_actions)
        self._sims: dict[int, Simulator] = {}
        self.sim: Simulator | None = None
        self.backend: SimBackend | None = None
        self._round: Sced2Round | None = None
        self._enc: Sced2Encoding | None = None
        self._steps = 0
        self.trace_index = -1
        #: effectiveness of every job started in the episode
        self.effectiveness: list[float] = []

    def _sim_for(self, i: int) -> Simulator:
        sim = self._sims.get(i)
        if sim is None:
            cfg = SimConfig(round_len=self.round_len, metrics_interval=math.inf,
                            max_idle_rounds=max(SimConfig.max_idle_rounds, self.max_steps + 1))
            sim = self._sims[i] = Simulator(self.cluster, self.traces[i], _EventRounds(), self.perf, cfg)
        else:
            sim.reset_state()
        return sim

    def _settle(self) -> None:
        """Close the round; run to the next round in which some job fits (``_enc`` ``None`` once every job
        has finished)."""
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
        out = np.zeros(self.observation_space.shape, dtype=np.float32)
        if self._enc is None:
            out[-1] = 1.0  # only "none"
            return out
        out[: self.obs_spec.size] = self._enc.obs
        out[self.obs_spec.size:] = self._enc.mask
        return out

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
        self.backend = SimBackend(self.sim)
        self._steps = 0
        self.effectiveness = []
        self._settle()
        return self._obs(), self._info()

    def action_masks(self) -> np.ndarray:
        """bool ``[J + 1]``: the valid actions now."""
        if self._enc is None:
            m = np.zeros(self.obs_spec.n_actions, dtype=bool)
            m[-1] = True
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
        if enc is not None:
            if 0 <= a < len(enc.mask) and enc.mask[a]:
                d = enc.decode(a)
            else:
                d = None
                reward += self.invalid_penalty
            if d is not None:
                job = enc.jobs[a]
                backend.apply(Decision(place=[d]))
                assert self._round is not None
                e = self.codec.effectiveness(job, d[1], sim.time)
                self.effectiveness.append(e)
                reward += e
                self._round.place(*d)
                self._enc = self._round.encode()
                if not self._enc.any_placement:
                    self._settle()
            elif enc.mask[self.obs_spec.noop]:
                self._settle()
            # else: an invalid action where "none" is masked too (an idle cluster that must start a job):
            # the state stays, so that time does not move on with nothing able to happen
        terminated = sim.done
        truncated = not terminated and self._steps >= self.max_steps
        return self._obs(), float(reward), terminated, truncated, self._info()


def register() -> None:
    """Register :data:`ENV_ID` with Gymnasium (idempotent)."""
    if ENV_ID not in gym.registry:
        gym.register(id=ENV_ID, entry_point="trainer.sced2.env:Sced2Env")


register()
