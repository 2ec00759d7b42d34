"""The planner's rollout model (:class:`policies.planner.RolloutModel`) over the event-driven simulator.

:class:`SimRollout` builds a private :class:`~trainer.simulator.Simulator` from a frozen snapshot
(:meth:`Simulator.from_state <trainer.simulator.Simulator.from_state>`: the snapshot's running and
pending jobs, plus the sampled future arrivals the planner hands it, if any), applies the candidate's
first decision, and lets the default policy decide every round (the
:class:`~trainer.sim_backend.SimBackend` round times: boundaries every ``round_len`` s and right after
arrivals / completions) until the horizon. It lives in ``trainer`` because the simulator does;
:mod:`policies.planner` only knows the protocol.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

from policies.base import Policy
from policies.job import JobSpec
from policies.perf import ContentionModel
from policies.planner import Rollout
from policies.rounds import run_round
from policies.state import ClusterState, Decision
from trainer.sim_backend import SimBackend
from trainer.simulator import SimConfig, SimulationError, Simulator

__all__ = ["SimRollout"]

#: Rounds between two looks at the clock during a rollout.
_CLOCK_EVERY = 8


class SimRollout:
    """:class:`policies.planner.RolloutModel` over :class:`Simulator`.

    :param perf: the performance model (its contention rule prices the rollouts).
    :param config: the simulator's settings for the rollouts (default :class:`SimConfig`: 300 s rounds,
        event-triggered, 30 s restart overhead, no speed noise; fragmentation / CS metrics sampled once,
        since the score does not read them).
    :param clock: the clock (s) the rollout's ``deadline`` is measured on (default :func:`time.perf_counter`).
    """

    def __init__(self, perf: ContentionModel, config: SimConfig | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.perf = perf
        self.config = config or SimConfig(metrics_interval=math.inf)
        self.clock = clock

    def rollout(self, state: ClusterState, first: Decision, policy: Policy, *, completions: int = 0,
                until: float = math.inf, deadline: float = math.inf, arrivals: Sequence[JobSpec] = (),
                max_rounds: int = 0) -> Rollout | None:
        """See :meth:`policies.planner.RolloutModel.rollout`. Score: the sum over the jobs present by the
        stop time (the snapshot's, and the arrivals submitted by then) of (completion time in the rollout,
        or stop time + remaining isolated run time) minus (the later of the job's submit time and now), in s."""
        try:
            sim = Simulator.from_state(state, policy, self.perf, self.config, arrivals=arrivals)
            backend = SimBackend(sim)
            if first:
                if backend.check(first):
                    return None
                backend.apply(first, [])
            shift = sim.time_shift  # the simulator's clock is the snapshot's minus this
            until -= shift
            t0 = sim.time
            n0 = sim.finished
            goal = len(sim.jobs) if completions <= 0 else min(completions, len(sim.jobs))
            k = 0
            while not sim.done and sim.finished - n0 < goal and backend.next_round():
                if sim.time >= until or sim.finished - n0 >= goal:
                    break
                if max_rounds and k >= max_rounds:  # out of work before the horizon: no score
                    return Rollout(None, sim.time + shift, k)
                run_round(backend, policy)
                k += 1
                if k % _CLOCK_EVERY == 0 and self.clock() > deadline:
                    return None
        except (SimulationError, ValueError):  # a snapshot the simulator cannot model (unknown model, no work)
            return None
        t_stop = sim.time
        score = 0.0
        for j in sim.jobs:
            sub = j.spec.submit_time
            if sub > t_stop:  # not arrived by the stop time
                continue
            t_in = sub if sub > t0 else t0
            f = j.finish
            if f == f:  # finished
                score += f - t_in
            else:
                left = max(j.spec.total_samples - j.progress(t_stop), 0.0)
                score += t_stop - t_in + left / j.info.best_thp
        return Rollout(score, t_stop + shift, k)
