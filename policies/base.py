"""The policy interface shared by the simulator and the controller."""

from __future__ import annotations

from abc import ABC, abstractmethod

from policies.state import ClusterState, Decision

__all__ = ["Policy", "PolicyError"]


class PolicyError(ValueError):
    """Unknown policy name, bad policy options or an unusable checkpoint."""


class Policy(ABC):
    """A scheduling policy: cluster state in, decision out, no I/O.

    Implementations must be deterministic functions of the state (and of
    their own fixed parameters) so that simulations replay exactly.
    """

    #: Short name used in reports and on the command line.
    name: str = "policy"

    #: At most this many placements per :meth:`schedule` call (``None``: no limit). A backend that
    #: applies only the first ``n`` placements of a round (the controller's
    #: ``max_placements_per_round``) sets it, so that a policy whose rounds are costly can stop there.
    #: A policy that honours it (the heuristics and the RL policies do) returns exactly the first
    #: ``n`` placements of the decision it would make without it, and only the preemptions those
    #: ``n`` need: a preemption made for a later placement would stop a job for nothing. One that
    #: ignores it still places correctly, because the backend applies only the first ``n``, but
    #: the backend applies all of its preemptions.
    place_limit: int | None = None

    #: ``True``: the policy may resize running elastic jobs (:attr:`~policies.state.Decision.resize`),
    #: so the round loop asks it every round, also when no job is pending (a policy that only
    #: places and preempts to place has nothing to decide then, and is not asked).
    resizes: bool = False

    #: ``True``: the policy may move running jobs (preempt one and place it again in the same
    #: decision, :attr:`~policies.state.Decision.place`), so the round loop asks it every round,
    #: also when no job is pending, as for :attr:`resizes`.
    moves: bool = False

    @abstractmethod
    def schedule(self, state: ClusterState) -> Decision:
        """Return the jobs to preempt and the placements to apply this round."""

    def reset(self) -> None:
        """Forget any per-episode memory (called when a simulation starts)."""
