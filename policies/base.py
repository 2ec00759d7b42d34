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

    @abstractmethod
    def schedule(self, state: ClusterState) -> Decision:
        """Return the jobs to preempt and the placements to apply this round."""

    def reset(self) -> None:
        """Forget any per-episode memory (called when a simulation starts)."""
