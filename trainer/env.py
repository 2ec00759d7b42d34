"""Gymnasium environment over the project's simulator (id ``rlsched/Placement-v0``).

:class:`PlacementEnv` is a driver of the round loop's simulator backend
(:class:`trainer.sim_backend.SimBackend`): the backend alone decides when rounds happen and
moves simulated time, :func:`policies.validate.check_decision` alone validates what is
applied, and the codec (:class:`policies.codecs.deepshare.DeepShareCodec`) encodes each
round as it does for the deployed policies. One environment step is one scheduling decision
(see :mod:`policies.codecs.deepshare` for the observation and the ``Discrete(K * S + 1)``
action):

* a placement action is applied as ``backend.apply(Decision(place=[(job, placement)]))``
  (validated on a fresh snapshot; time does not move) and on the codec round
  (``round.place``), which is encoded again: the agent is asked again (several jobs per
  round) while some placement is valid;
* "nothing" (or no valid placement left) closes the round: ``backend.next_round()`` processes
  events up to the next round in which jobs wait (the next arrival / completion batch or the
  next round boundary, ``round_len`` s, whichever comes first), and a new codec round is begun
  on its snapshot (the ``"plan"`` order replans, as :meth:`policies.rl.RLPolicy.schedule`
  does each round). While no placement is valid the environment goes on to the next round on
  its own (no decision to make), so an episode is about ``jobs + events + useful rounds``
  steps long.

The episode ends (``terminated``) when every job has finished (the backend has no round
left), or is ``truncated`` after ``max_steps`` steps. The backend's idle guard
(:attr:`trainer.simulator.SimConfig.max_idle_rounds`) is set above ``max_steps``.

Rewards are paid for simulated time, so placement steps earn 0 and a step
that advances from ``t0`` to ``t1`` earns the integral over ``[t0, t1]``
in units of rounds (``dt / round_len``). The backend calls the environment
(``on_advance``) right before each move of simulated time; the state is
constant between two calls, so the integral is summed exactly, piece by
piece: rate of the state times the piece's length. The rate per round is:

* ``"seed"`` (seed eq. 2): ``-W1 * CS + W2 * Util`` per round, ``W2 = 1 - W1``,
  ``CS`` the mean contention sensitivity of running jobs (1 if none),
  ``Util`` the allocated fraction of GPUs.
* ``"progress"`` (DL2): the normalised progress of all jobs, ``sum_j
  (samples done in the interval) / total_samples_j``, i.e. per round the sum
  over running jobs of ``achieved_thp * round_len / total_samples``. Each job
  contributes exactly 1 over its life, so the undiscounted return is the
  number of jobs whatever the policy; discounting makes progress *earlier*
  worth more, and a job needing 1 GPU earns as much per second as one needing
  32, so it pays to run many jobs at full speed soon (short, small and
  uncontended first), which is what lowers average JCT. But the discount
  is per step, not per unit of time, which biases it (see docs/RL.md).
* ``"jct"``: ``-(jobs in the system) / (jobs in the trace)`` per round. Its
  undiscounted sum is ``-sum(JCT) / (round_len * jobs)``: exactly the average
  JCT, negated and scaled, so with ``gamma = 1`` the agent optimises exactly
  the objective.
* ``"jct-rel"``: the same, divided by a *reference* average JCT of the
  episode's trace (``reference_jct``; by default what non-preemptive greedy,
  SRTF order with contention-aware placement, achieves on it, computed once
  per trace): the undiscounted return is ``-avgJCT / avgJCT_ref``, about -1
  on every trace. With ``"jct"`` a zero-arrival set of 256 jobs (average JCT
  20-60 h) returns 10-20 x more than a Poisson set (3-7 h), so the gradient
  and the reward normaliser see almost only the former; ``"jct-rel"`` weighs
  a 1 % gain equally on every trace. This is the training default
  (:class:`trainer.train.TrainConfig`) and the reward of the shipped policies (docs/RL.md).

With ``shaping`` (default for ``"progress"``) the reward also gets the
potential-based term ``gamma * phi(s') - phi(s)`` (Ng et al., 1999: it leaves
the optimal policy unchanged), where ``phi`` is the current progress rate
``sum_j achieved_thp_j * round_len / total_samples_j`` of the running jobs.
A placement then pays at once what it will earn per round, and one that
slows its neighbours costs at once, instead of the credit arriving only
after the next time step. ``gamma`` must be the algorithm's discount.

An invalid action (only possible with algorithms that ignore
:meth:`action_masks`) is treated as "nothing" and costs ``invalid_penalty``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import numpy as np
from gymnasium import spaces

from policies.cluster import ClusterSpec
from policies.compat import CompatMode, compat_codec, compat_mode
from policies.codecs.deepshare import DeepShareCodec, ObsSpec
from policies.job import JobSpec
from policies.orders import AGING_S
from policies.perf import ContentionModel
from trainer.common.pick_env import PickEnv, register_env
from trainer.sim_backend import SimBackend
from trainer.simulator import SimConfig, Simulator

__all__ = ["ENV_ID", "REWARDS", "PlacementEnv", "load_trace_dir", "reference_jct", "register"]

ENV_ID = "rlsched/Placement-v0"
REWARDS = ("progress", "jct", "jct-rel", "seed")


def reference_jct(
    traces: Sequence[Sequence[JobSpec]],
    cluster: ClusterSpec,
    perf: ContentionModel | None = None,
    round_len: float = 300.0,
    policy: str = "greedy-np",
    compat: CompatMode | None = None,
) -> list[float]:
    """Average JCT (s) of the heuristic ``policy`` on each trace (the ``"jct-rel"`` reference). Under a
    compat mode the simulator runs by its rules and the heuristic places with the mode's rule
    (``policy:ds``, e.g. ``greedy-np:ds``); ``perf`` must then have the mode's contention rule."""
    from policies.heuristics import make_heuristic

    perf = perf or ContentionModel(cluster, contention=compat.contention if compat is not None else "sum")
    if compat is not None and ":" not in policy:
        policy = f"{policy}:ds"
    out = []
    for jobs in traces:
        cfg = SimConfig(round_len=round_len, compat=compat)
        res = Simulator(cluster, list(jobs), make_heuristic(policy, perf), perf, cfg).run()
        out.append(float(np.mean([r.jct for r in res.jobs])))
    return out


def load_trace_dir(path: str | Path, cluster: ClusterSpec) -> list[list[JobSpec]]:
    """All traces under ``path`` (a trace file or a directory searched recursively), sorted by path.

    In a directory, every file whose suffix is in :data:`trainer.traces.TRACE_SUFFIXES` is a trace. An
    elastic trace (:func:`trainer.elastic.is_elastic_trace`) is refused: :class:`TraceError` naming it and
    DL2's environment (:class:`trainer.dl2.env.DL2Env`), which plays such traces.
    """
    from trainer.elastic import is_elastic_trace
    from trainer.traces import TRACE_SUFFIXES, TraceError, load_trace

    p = Path(path)
    if p.is_file():
        files = [p]
    elif not p.is_dir():
        raise TraceError(p, "no such trace file or directory")
    else:
        files = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in TRACE_SUFFIXES)
    if not files:
        raise TraceError(p, f"no trace files ({', '.join('*' + s for s in TRACE_SUFFIXES)}) in this directory")
    for f in files:
        if is_elastic_trace(f):
            raise TraceError(f, f"an elastic trace: {ELASTIC_REFUSAL}")
    return [load_trace(f, cluster) for f in files]


#: why :class:`PlacementEnv` does not play elastic jobs, and what does
ELASTIC_REFUSAL = ("the placement environment plays fixed-size jobs without parameter servers; DL2's environment, "
                   "trainer.dl2.env.DL2Env (rlsched/DL2-v0), plays elastic traces")


class PlacementEnv(PickEnv):
    """Scheduling decisions on a simulated cluster (the step / reset bookkeeping is
    :class:`trainer.common.pick_env.PickEnv`'s; an invalid action closes the round).

    :param traces: job sets; each episode draws one uniformly (seeded by ``reset``), or plays the one of
        ``reset(options={"trace": i})`` (an integer, ``0 <= i < len(traces)``; anything else is a ValueError).
    :param cluster: cluster spec or ``"4x8"``.
    :param reward: ``"progress"``, ``"jct"``, ``"jct-rel"`` or ``"seed"``.
    :param w1: weight of CS in the seed reward (``W2 = 1 - w1``).
    :param round_len: seconds per scheduling round.
    :param max_steps: truncate episodes after this many steps.
    :param invalid_penalty: reward of an invalid action (treated as "nothing").
    :param perf: performance model (default :class:`ContentionModel` of ``cluster``).
    :param k: candidate jobs in the observation.
    :param order: candidate order (:mod:`policies.orders`), ``"area"``, ``"fill"`` or ``"plan"``.
    :param aging_s: aging time constant of the candidate order (s; :attr:`policies.codecs.deepshare.ObsSpec.aging_s`).
    :param shaping: add potential-based shaping (default: on for ``"progress"``).
    :param gamma: discount used by the shaping term.
    :param reference: ``"jct-rel"`` only: reference average JCT (s) per trace;
        default :func:`reference_jct` (greedy-np) computed here.
    :param compat: a peer simulator's rules (:class:`policies.compat.CompatMode` or its name, e.g.
        ``"deepshare"``; ``None``: rlsched's own). The episodes' simulator runs under
        :attr:`trainer.simulator.SimConfig.compat` (its round length, contention rule, t = 0 submission),
        the codec offers only the mode's placements (:func:`policies.compat.compat_codec`), and the
        ``"jct-rel"`` reference is greedy-np with the mode's placement rule. ``perf`` (default: the mode's
        contention rule) and ``round_len`` must agree with the mode (``ValueError`` naming them otherwise).
    """

    invalid_closes_round: ClassVar[bool] = True

    def __init__(
        self,
        traces: Sequence[Sequence[JobSpec]],
        cluster: ClusterSpec | str = "4x8",
        reward: str = "jct",
        w1: float = 0.4,
        round_len: float = 300.0,
        max_steps: int = 20_000,
        invalid_penalty: float = -0.1,
        perf: ContentionModel | None = None,
        k: int = 6,
        order: str = "area",
        aging_s: float = AGING_S,
        shaping: bool | None = None,
        gamma: float = 0.99,
        reference: Sequence[float] | None = None,
        compat: CompatMode | str | None = None,
    ) -> None:
        mode = compat_mode(compat) if isinstance(compat, str) else compat
        for i, jobs in enumerate(traces):
            ps = next((j for j in jobs if j.demand is not None and j.demand.ps), None)
            if ps is not None:
                raise ValueError(f"PlacementEnv: trace {i}, job {ps.job_id!r} has parameter servers: {ELASTIC_REFUSAL}")
        super().__init__(traces, cluster, max_steps, invalid_penalty, round_len, compat=mode)
        if reward not in REWARDS:
            raise ValueError(f"reward {reward!r}: expected one of {', '.join(REWARDS)}")
        if not 0.0 <= w1 <= 1.0:
            raise ValueError(f"w1 must be in [0, 1], got {w1}")
        if mode is not None:
            mode.check_cluster(self.cluster)  # CompatError (a ValueError-like PolicyError), one line
            if perf is not None and getattr(perf, "contention", "sum") != mode.contention:
                raise ValueError(f"compat {mode.name}: perf must use the contention rule {mode.contention!r}, "
                                 f"got {getattr(perf, 'contention', 'sum')!r}")
            if float(round_len) != float(mode.round_len):
                raise ValueError(f"compat {mode.name}: round_len must be the mode's {mode.round_len:g} s, got {round_len!r}")
            for i, t in enumerate(traces):
                for j in t:
                    mode.check_job(f"{j.job_id} (trace {i})", j.gpu_demand)
        self.perf = perf or ContentionModel(self.cluster, contention=mode.contention if mode is not None else "sum")
        self.spec_obs = ObsSpec.for_cluster(self.cluster, k, order, aging_s)
        self.codec = DeepShareCodec(self.cluster, self.perf, self.spec_obs)
        if mode is not None:
            compat_codec(self.codec, mode)
        self.reference: list[float] | None = None
        if reward == "jct-rel":
            ref = reference if reference is not None else reference_jct(self.traces, self.cluster, self.perf, round_len,
                                                                      compat=mode)
            if len(ref) != len(self.traces) or not all(math.isfinite(r) and r > 0 for r in ref):
                raise ValueError(f"reference: need one positive average JCT per trace ({len(self.traces)}), got {list(ref)[:5]}...")
            self.reference = [float(r) for r in ref]
        self.reward_kind = reward
        self.w1 = float(w1)
        self.shaping = (reward == "progress") if shaping is None else bool(shaping)
        self.gamma = float(gamma)
        self._phi = 0.0
        box = self.codec.observation_space
        self.observation_space = spaces.Box(box.low, box.high, shape=box.shape, dtype=box.dtype)
        self.action_space = spaces.Discrete(self.codec.action_space.n)
        self.noop_action = self.spec_obs.noop
        # reward integration (the backend's on_advance hook): reward earned and not paid yet, the time
        # of the last hook call and the reward rate (per round) of the state since then
        self._acc = 0.0
        self._t_prev = 0.0
        self._rate_prev = 0.0

    # ------------------------------------------------------------------ helpers
    def _potential(self) -> float:
        sim = self.sim
        assert sim is not None
        return sum(j.rate / j.spec.total_samples for j in sim.running.values()) * self.round_len

    def _rate(self) -> float:
        """Reward per round of the current (constant) state."""
        sim = self.sim
        assert sim is not None
        if self.reward_kind == "progress":
            return (
                sum(j.rate / j.spec.total_samples for j in sim.running.values() if sim.time >= j.t_ref) * self.round_len
            )
        if self.reward_kind == "jct":
            return -(len(sim.pending) + len(sim.running)) / len(sim.jobs)
        if self.reward_kind == "jct-rel":
            assert self.reference is not None
            n = len(sim.pending) + len(sim.running)
            return -n / len(sim.jobs) * self.round_len / self.reference[self.trace_index]
        cs = float(np.mean([j.cs for j in sim.running.values()])) if sim.running else 1.0
        util = 1.0 - float(sim.free.sum()) / float(sim.capacity.sum())
        return -self.w1 * cs + (1.0 - self.w1) * util

    def _integrate(self, t: float) -> None:
        """The backend's ``on_advance`` hook, called at time ``t`` (s) before time moves on: the state has
        been constant since the last call (at ``_t_prev``); add its reward over ``[_t_prev, t]`` and take
        the rate of the state at ``t``."""
        self._acc += self._rate_prev * (t - self._t_prev) / self.round_len
        self._t_prev = t
        self._rate_prev = self._rate()

    def _earned(self) -> float:
        """The reward integrated up to the backend's current time since the last call."""
        assert self.backend is not None
        self._integrate(self.backend.now())
        r, self._acc = self._acc, 0.0
        return r

    def _obs(self) -> np.ndarray:
        if self._enc is None:
            return np.zeros(self.spec_obs.shape, dtype=np.float32)
        return self._enc.obs

    # ------------------------------------------------------------------ PickEnv hooks
    def _backend_for(self, sim: Simulator) -> SimBackend:
        return SimBackend(sim, on_advance=self._integrate)

    def _on_reset(self, settled: bool) -> None:
        if not settled:
            assert self.sim is not None
            self._acc, self._t_prev, self._rate_prev = 0.0, self.sim.time, 0.0
        else:
            self._earned()  # the time before the first decision earns nothing
            self._phi = self._potential()

    def _step_reward(self, reward: float) -> float:
        """The reward integrated over the step's time, plus the shaping term (module docstring)."""
        reward += self._earned()
        if self.shaping:
            assert self.sim is not None
            phi = 0.0 if self.sim.done else self._potential()
            reward += self.gamma * phi - self._phi
            self._phi = phi
        return reward


def register() -> None:
    """Register :data:`ENV_ID` with Gymnasium (idempotent)."""
    register_env(ENV_ID, "trainer.env:PlacementEnv")


register()
