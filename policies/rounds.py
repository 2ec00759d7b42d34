"""The round loop: the one place where a policy decides and a backend applies.

:func:`run_round` is one round over a :class:`~policies.backend.Backend`:

1. ``state = backend.snapshot()``;
2. the policy is asked (``policy.schedule(state)``, timed) unless no job is pending and the
   policy neither resizes nor moves running jobs (:attr:`~policies.base.Policy.resizes`,
   :attr:`~policies.base.Policy.moves`: a policy that only places,
   and preempts to place, has nothing to decide with an empty queue), or the round's
   ``place_limit`` is 0; otherwise the decision is empty;
3. placements past ``place_limit`` are cut off (a policy that honours
   :attr:`~policies.base.Policy.place_limit` returns no more);
4. ``problems = check_decision(state, decision)`` (:mod:`policies.validate`);
5. ``report = backend.apply(decision, problems)``: called every round, with the possibly empty
   decision; what happens to invalid entries is the backend's rule (all or nothing, or drop them).

:class:`RoundLoop` repeats it while ``backend.next_round()`` says a round follows. The simulator
(:meth:`trainer.simulator.Simulator.run`) and the Slurm controller
(:class:`controller.daemon.Controller`) both decide through :func:`run_round`. This module does
no I/O beyond calling the backend and the policy.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from policies.backend import ApplyReport, Backend
from policies.base import Policy
from policies.state import ClusterState, Decision
from policies.validate import Problem, check_decision

__all__ = ["RoundLoop", "RoundOutcome", "run_round"]

_perf_counter = time.perf_counter


@dataclass(slots=True)
class RoundOutcome:
    """One round of :func:`run_round`.

    :param state: the snapshot the round decided on (its ``time``: when, in the backend's seconds).
    :param decision: the policy's decision, cut to ``place_limit`` placements (empty when the
        policy was not asked).
    :param problems: what :func:`~policies.validate.check_decision` found in it.
    :param report: what the backend applied.
    :param asked: whether the policy was asked.
    :param decision_s: wall seconds ``policy.schedule`` took (0 when not asked).
    """

    state: ClusterState
    decision: Decision
    problems: list[Problem]
    report: ApplyReport
    asked: bool = False
    decision_s: float = 0.0


def run_round(backend: Backend, policy: Policy, place_limit: int | None = None) -> RoundOutcome:
    """Snapshot, decide, validate, apply: one round (see the module docstring).

    :param place_limit: at most this many placements are applied this round; it is set as the
        policy's :attr:`~policies.base.Policy.place_limit` before it is asked, so a policy can
        stop there (0 or less: the policy is not asked). ``None``: no limit from the loop (the
        policy's own ``place_limit`` is left as it is).
    """
    return _round(backend, policy, place_limit, True)  # type: ignore[return-value]


def _round(backend: Backend, policy: Policy, place_limit: int | None, outcome: bool) -> RoundOutcome | None:
    """:func:`run_round`; with ``outcome`` false it returns ``None`` and times nothing (what
    :meth:`RoundLoop.run` does when no one reads the outcome)."""
    state = backend.snapshot()
    asked = False
    took = 0.0
    if (state.pending or getattr(policy, "resizes", False) or getattr(policy, "moves", False)) and (
            place_limit is None or place_limit > 0):
        if place_limit is not None:
            policy.place_limit = place_limit
        if outcome:
            t0 = _perf_counter()
            decision = policy.schedule(state)
            took = _perf_counter() - t0
        else:
            decision = policy.schedule(state)
        asked = True
        if place_limit is not None and len(decision.place) > place_limit:
            decision = Decision(place=decision.place[:place_limit], preempt=decision.preempt, resize=decision.resize)
    else:
        decision = Decision()
    problems = check_decision(state, decision) if (decision.place or decision.preempt or decision.resize) else []
    if not outcome:
        # no one reads the snapshot after the policy and the checks: let it go before the backend applies
        # the decision, so that a backend that keeps a snapshot's arrays unchanged while one lives (the
        # simulator's free GPUs) changes them in place
        del state
        backend.apply(decision, problems)
        return None
    report = backend.apply(decision, problems)
    return RoundOutcome(state, decision, problems, report, asked, took)


class RoundLoop:
    """Rounds of :func:`run_round` while ``backend.next_round()`` is true.

    :param backend: the cluster.
    :param policy: the policy asked each round.
    :param place_limit: passed to every :func:`run_round`.
    """

    def __init__(self, backend: Backend, policy: Policy, place_limit: int | None = None) -> None:
        self.backend = backend
        self.policy = policy
        self.place_limit = place_limit
        #: rounds run so far
        self.rounds = 0

    def run(self, max_rounds: int | None = None, on_round: Callable[[RoundOutcome], None] | None = None) -> int:
        """Run rounds until the backend has none left or ``max_rounds`` rounds have run (counted
        from this call; ``next_round`` is not called once the limit is reached). ``on_round`` is
        called with each round's outcome. Returns the number of rounds this call ran."""
        backend, policy, limit = self.backend, self.policy, self.place_limit
        n = 0
        if on_round is None:  # no one reads the outcomes: none is built
            while (max_rounds is None or n < max_rounds) and backend.next_round():
                _round(backend, policy, limit, False)  # its snapshot is gone before the backend moves on
                n += 1
            self.rounds += n
            return n
        while (max_rounds is None or n < max_rounds) and backend.next_round():
            out = run_round(backend, policy, limit)
            n += 1
            on_round(out)
            del out  # the round's snapshot goes before the backend moves on (no copy-on-write of it there)
        self.rounds += n
        return n
