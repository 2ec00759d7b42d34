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

from collections.abc import Sequence

import numpy as np
from gymnasium import spaces

from policies.cluster import ClusterSpec
from policies.codecs.sced2 import Sced2Codec, Sced2Encoding, Sced2Spec
from policies.job import JobSpec
from policies.perf import ContentionModel
from trainer.common.pick_env import EventRounds, PickEnv, register_env

__all__ = ["ENV_ID", "Sced2Env"]

ENV_ID = "rlsched/Sced2-v0"


class Sced2Env(PickEnv):
    """SCED2's picks on a simulated cluster (module docstring; the step / reset bookkeeping is
    :class:`trainer.common.pick_env.PickEnv`'s).

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
        super().__init__(traces, cluster, max_steps, invalid_penalty, round_len,
                         sim_policy=EventRounds("sced2", "Sced2Env"))
        self.perf = perf or ContentionModel(self.cluster)
        self.codec = Sced2Codec(self.cluster, self.perf, spec or Sced2Spec.for_cluster(self.cluster, jobs, k))
        self.obs_spec = self.codec.spec
        n = self.obs_spec.size + self.obs_spec.n_actions
        self.observation_space = spaces.Box(0.0, 1.0, shape=(n,), dtype=np.float32)
        self.action_space = spaces.Discrete(self.obs_spec.n_actions)
        self.noop_action = self.obs_spec.noop
        #: effectiveness of every job started in the episode
        self.effectiveness: list[float] = []

    def _obs(self) -> np.ndarray:
        out = np.zeros(self.observation_space.shape, dtype=np.float32)
        if self._enc is None:
            out[-1] = 1.0  # only "none"
            return out
        out[: self.obs_spec.size] = self._enc.obs
        out[self.obs_spec.size:] = self._enc.mask
        return out

    def _on_reset(self, settled: bool) -> None:
        if not settled:
            self.effectiveness = []

    def _on_pick(self, enc: Sced2Encoding, action: int, decision) -> float:
        """The picked job's effectiveness at its start (module docstring)."""
        assert self.sim is not None
        e = self.codec.effectiveness(enc.jobs[action], decision[1], self.sim.time)
        self.effectiveness.append(e)
        return e


def register() -> None:
    """Register :data:`ENV_ID` with Gymnasium (idempotent)."""
    register_env(ENV_ID, "trainer.sced2.env:Sced2Env")


register()
