"""The codec protocol: what every learned-policy family implements to turn cluster states into
network inputs and network outputs into decisions.

A *codec* is built for one cluster (and performance model) from its *spec* (the static shape of
observations and actions, stored in checkpoints). Each scheduling round it *begins* a
:class:`CodecRound` on a frozen :class:`~policies.state.ClusterState`; the round then

* *encodes* the round's current state into an :class:`Encoding`: the observation, the mask of
  valid actions and what each action means;
* *decodes* an action (through the encoding) into a decision entry, ``(job_id, placement)``, or
  ``None`` for "schedule nothing more this round";
* applies a *placement* to its state (the per-round state transition), so that the round's next
  encoding sees it.

The same round object serves the deployed policies (:mod:`policies.rl`, whose rounds run in the
simulator and the Slurm controller) and the training environment (:mod:`trainer.env`), so training
and serving see exactly the same observations.

Spaces are plain shapes and dtypes (:class:`Box`, :class:`Discrete`): ``policies`` does not import
Gymnasium; the environment builds its spaces from them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from policies.cluster import ClusterSpec, Placement
from policies.state import ClusterState, JobInfo

__all__ = ["Box", "Codec", "CodecError", "CodecRound", "CodecSpec", "Discrete", "Encoding"]


class CodecError(ValueError):
    """A codec spec that is malformed or does not fit the cluster it is used on."""


@dataclass(frozen=True)
class Box:
    """A dense observation: an array of ``shape`` and ``dtype`` with every value in ``[low, high]``."""

    shape: tuple[int, ...]
    dtype: type = np.float32
    low: float = 0.0
    high: float = 1.0


@dataclass(frozen=True)
class Discrete:
    """Actions ``0 .. n - 1``."""

    n: int


@runtime_checkable
class CodecSpec(Protocol):
    """Static shape of a codec's observations and actions for one cluster shape (stored in checkpoints)."""

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the dense observation."""

    @property
    def n_actions(self) -> int:
        """Number of actions."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form; the codec class's ``spec_from_dict`` reads it back."""

    def check_cluster(self, cluster: ClusterSpec, layout: Sequence[int] | None = None) -> None:
        """Raise :class:`CodecError` unless the spec was made for ``cluster``'s shape
        (``layout``: GPUs of each node of the cluster it was made for, when known)."""


@runtime_checkable
class Encoding(Protocol):
    """One encoded state of a round."""

    #: bool ``[n_actions]``: the valid actions (at least one is always valid)
    mask: np.ndarray

    @property
    def any_placement(self) -> bool:
        """Whether some placement action is valid (else the round has nothing to decide)."""

    @property
    def obs(self) -> np.ndarray | None:
        """The dense observation (``spec.shape``, float32), or ``None`` when the round encoded only a
        structured form (``encode(dense=False)``)."""

    def decode(self, action: int) -> tuple[str, Placement] | None:
        """Action -> ``(job_id, placement)``, or ``None`` for "schedule nothing more this round".

        :raises ValueError: an out-of-range or masked action.
        """


@runtime_checkable
class CodecRound(Protocol):
    """One scheduling round of a codec: a state, the placements taken from it, and their encodings."""

    def encode(self, dense: bool = True) -> Encoding:
        """The current state (the round's state after its placements so far), encoded.

        :param dense: build the dense observation (``Encoding.obs``); ``False`` lets a codec give only
            a cheaper structured form that its policies evaluate directly.
        """

    def place(self, job_id: str, placement: Placement) -> None:
        """Start waiting job ``job_id`` on ``placement`` (the round's state transition).

        :raises ValueError: the job is not waiting or the placement does not fit the free GPUs.
        """

    def state(self) -> ClusterState:
        """The round's current state (a new :class:`ClusterState`; the round's input is never modified)."""

    def queue_order(self) -> list[JobInfo]:
        """Every job still waiting, in the codec's candidate order."""


@runtime_checkable
class Codec(Protocol):
    """A learned-policy family's observation / action codec for one cluster."""

    #: registry name, e.g. ``"deepshare-v1"``; recorded in checkpoints
    name: ClassVar[str]
    #: the spec (static shapes)
    spec: CodecSpec

    @property
    def observation_space(self) -> Box:
        """Shape, dtype and range of the dense observation."""

    @property
    def action_space(self) -> Discrete:
        """The actions."""

    def begin(self, state: ClusterState) -> CodecRound:
        """Start a round on ``state`` (not modified)."""
