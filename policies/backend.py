"""The backend protocol: what the round loop (:mod:`policies.rounds`) runs a policy against.

A backend is a cluster that policies schedule: the event-driven simulator
(:class:`trainer.sim_backend.SimBackend`) or Slurm (:class:`controller.backend.SlurmBackend`).
One round of the loop is::

    backend.next_round()           # wait / advance to the next round; False: no more rounds
    state = backend.snapshot()     # frozen ClusterState at backend.now()
    decision = policy.schedule(state)
    problems = policies.validate.check_decision(state, decision)
    report = backend.apply(decision, problems)

Units: times in seconds (``now()`` and :attr:`~policies.state.ClusterState.time` are the
backend's clock: simulated seconds from the trace's start, or epoch seconds on Slurm).

A decision is applied in the order :class:`~policies.state.Decision` fixes: preemptions, then
resizes, then placements. Backends differ in what they do with invalid entries:

* all or nothing (the simulator): any problem raises before anything is applied;
* drop the bad entries (Slurm): each problem is reported in :attr:`ApplyReport.rejected`
  (and logged, counted), and the rest is applied.

Applying may still fail per entry at run time on a real cluster (a checkpoint that does not
come, a Slurm command that fails): such entries are reported as rejected or deferred, and a
backend that drops the rest of a decision says so with :attr:`ApplyReport.decide_again`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from policies.state import ClusterState, Decision
from policies.validate import Problem

__all__ = ["ApplyReport", "Backend"]


@dataclass
class ApplyReport:
    """What :meth:`Backend.apply` did with one decision.

    :param placed: job ids started, in the order they were started.
    :param preempted: job ids stopped and returned to the queue.
    :param resized: job ids whose allocation changed.
    :param rejected: entries not applied, each with its reason: the problems
        :func:`~policies.validate.check_decision` found, and entries that failed when applied.
    :param deferred: job ids of valid preemptions left for a later round (the controller's
        preemption time budget, or after a failed preemption).
    :param decide_again: the backend dropped the rest of the decision (a preemption the policy
        counted on failed): the caller should ask the policy again on a fresh snapshot.
    """

    placed: list[str] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    resized: list[str] = field(default_factory=list)
    rejected: list[Problem] = field(default_factory=list)
    deferred: list[str] = field(default_factory=list)
    decide_again: bool = False


@runtime_checkable
class Backend(Protocol):
    """A cluster the round loop schedules.

    ``snapshot``, ``apply`` and ``next_round`` are called by one thread, in the order of the
    module docstring; ``snapshot`` is taken once per round and ``apply`` is called once per
    round, with the (possibly empty) decision made from that snapshot.
    """

    def now(self) -> float:
        """The backend's current time (s)."""
        ...

    def snapshot(self) -> ClusterState:
        """The cluster as policies see it now: a :class:`ClusterState` whose ``time`` is :meth:`now`.
        Valid until the next :meth:`apply` or :meth:`next_round`."""
        ...

    def apply(self, decision: Decision, problems: Sequence[Problem] | None = None) -> ApplyReport:
        """Apply ``decision`` (preemptions, resizes, placements, in that order).

        :param problems: ``check_decision(snapshot, decision)`` for the last :meth:`snapshot`, as
            the round loop computed it; ``None``: the backend computes it on a fresh snapshot.
            An all-or-nothing backend raises its error for the first problem and applies
            nothing; a drop-bad-entries backend applies the decision without them
            (:func:`policies.validate.without`) and lists them in :attr:`ApplyReport.rejected`.
        """
        ...

    def next_round(self) -> bool:
        """Advance (simulator) or wait (Slurm) until the next round is due. ``True``: a round
        follows (take a snapshot, decide, apply); ``False``: the backend is finished (every job
        done) or stopping, and no round follows."""
        ...
