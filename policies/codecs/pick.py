"""Shared pieces of the one-pick codecs (:mod:`policies.codecs.sced2`, :mod:`policies.codecs.sizefree`).

A one-pick codec offers, each round, a list of (job, placement) starts plus a last action, "nothing"
(SCED2's "none", the size-free codec's "hold"); the agent picks one start at a time until it picks
"nothing". What both write the same way lives here:

* spec checks (:func:`check_spec_ints`, :func:`check_tau`) and the stored-form reader
  (:func:`spec_from_fields`);
* :class:`PickEncoding`: ``any_placement`` and ``decode`` over a mask whose last entry is "nothing";
* :func:`hold_mask`: "nothing" is valid unless nothing runs, nothing was started in the round and
  some start is valid (an idle cluster with jobs waiting would otherwise stay idle);
* :func:`running_speed`, :func:`as_started`: a running job's speed (samples/s) and a waiting job
  started on a placement at its isolated speed;
* :func:`take_waiting`: the checks and free-GPU bookkeeping of ``CodecRound.place``;
* :class:`PickCodec`: spec type check, spaces, ``begin``, ``spec_from_dict`` and the cached best
  isolated throughput per ``(model, GPUs)``.

Pure: no I/O.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np

from policies.cluster import ClusterSpec, Placement
from policies.codecs.base import Box, CodecError, Discrete
from policies.perf import ContentionModel
from policies.state import ClusterState, JobInfo

__all__ = [
    "PickCodec",
    "PickEncoding",
    "as_started",
    "check_spec_ints",
    "check_tau",
    "hold_mask",
    "running_speed",
    "spec_from_fields",
    "take_waiting",
]


def check_spec_ints(label: str, spec: Any, names: Sequence[str]) -> None:
    """:class:`CodecError` unless each attribute ``names`` of ``spec`` is an integer >= 1 (``label``:
    the codec's name in the message)."""
    for name in names:
        v = getattr(spec, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise CodecError(f"{label} spec: {name} must be an integer >= 1, got {v!r}")


def check_tau(label: str, t: Any) -> None:
    """:class:`CodecError` unless ``t`` is a number of seconds in ``[1, 1e9]``."""
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or not 1.0 <= t <= 1e9:
        raise CodecError(f"{label} spec: tau_s must be a number of seconds in [1, 1e9], got {t!r}")


def spec_from_fields(label: str, d: Any, build: Callable[[dict], Any]) -> Any:
    """A spec from its stored form ``d`` (an object): ``build(d)`` with a missing field reported as
    :class:`CodecError`, and a stored ``shape`` checked against the spec's."""
    if not isinstance(d, dict):
        raise CodecError(f"{label} spec must be an object, got {type(d).__name__}")
    try:
        spec = build(d)
    except KeyError as exc:
        raise CodecError(f"{label} spec: field {exc.args[0]!r} is missing") from None
    if "shape" in d and list(d["shape"]) != list(spec.shape):
        raise CodecError(f"{label} spec: shape {d['shape']} does not match its fields ({list(spec.shape)})")
    return spec


def running_speed(r: JobInfo) -> float:
    """Samples/s of running job ``r``: its measured speed, else its isolated speed on its placement,
    else its best isolated speed."""
    return r.achieved_thp if r.achieved_thp > 0 else (r.isolated_thp if r.isolated_thp > 0 else r.best_thp)


def as_started(j: JobInfo, p: Placement, now: float, iso: float) -> JobInfo:
    """``j`` running on ``p`` from ``now`` at its isolated speed ``iso`` (samples/s)."""
    return replace(j, placement=p, start_time=now, isolated_thp=iso, achieved_thp=iso)


def take_waiting(label: str, waiting: list[JobInfo], free: np.ndarray, job_id: str, placement: Placement) -> JobInfo:
    """Start waiting job ``job_id`` on ``placement``: take it out of ``waiting`` and its GPUs out of
    ``free`` (int, per node; both modified); returns the job.

    :raises ValueError: the job is not waiting, the placement has another GPU count than the job needs,
        or it does not fit ``free``.
    """
    for i, j in enumerate(waiting):
        if j.job_id == job_id:
            break
    else:
        raise ValueError(f"{label} round: job {job_id!r} is not waiting")
    if placement.total_gpus != j.gpu_demand:
        raise ValueError(f"{label} round: placement of {job_id!r} has {placement.total_gpus} GPUs, "
                         f"the job needs {j.gpu_demand}")
    for n, c in placement.alloc:
        if not 0 <= n < len(free) or free[n] < c:
            raise ValueError(f"{label} round: placement of {job_id!r} does not fit the free GPUs of node {n}")
    for n, c in placement.alloc:
        free[n] -= c
    del waiting[i]
    return j


def hold_mask(mask: np.ndarray, idle: bool, any_started: bool) -> None:
    """Set the last entry of ``mask`` ("nothing"): valid unless the cluster was idle at the round's start,
    nothing was started in the round and some start is valid."""
    mask[-1] = not (bool(mask[:-1].any()) and idle and not any_started)


class PickEncoding(ABC):
    """One encoded state of a one-pick round: ``mask`` bool ``[starts + 1]`` (the last action is
    "nothing"); a subclass gives :meth:`_entry`, the ``(job_id, placement)`` of start ``a``."""

    __slots__ = ()
    #: the codec's name in messages
    label: ClassVar[str] = "codec"
    mask: np.ndarray

    @property
    def any_placement(self) -> bool:
        return bool(self.mask[:-1].any())

    @abstractmethod
    def _entry(self, a: int) -> tuple[str, Placement]:
        """The ``(job_id, placement)`` of start action ``a`` (``0 <= a < len(mask) - 1``)."""

    def decode(self, action: int) -> tuple[str, Placement] | None:
        a = int(action)
        if not 0 <= a < len(self.mask) or not self.mask[a]:
            raise ValueError(f"{self.label}: action {action!r} is out of range or masked")
        if a == len(self.mask) - 1:
            return None
        return self._entry(a)


class PickCodec:
    """Base of the one-pick codecs: ``cluster``, ``perf``, ``spec`` and the shared codec methods.

    A subclass sets :attr:`spec_class`, :attr:`round_class`, ``name`` and :attr:`obs_low`, and calls
    :meth:`_init_spec` with the spec it will use.
    """

    name: ClassVar[str] = "pick"
    #: the spec class the codec reads (``spec_class.from_dict`` reads a stored spec)
    spec_class: ClassVar[type]
    #: the round class (``round_class(codec, state)``)
    round_class: ClassVar[type]
    #: lower bound of the dense observation's values (the upper is 1)
    obs_low: ClassVar[float] = 0.0
    spec: Any

    def _init_spec(self, cluster: ClusterSpec, perf: ContentionModel, spec: Any, label: str) -> None:
        """Check ``spec`` (its type and :meth:`check_cluster`) and set ``cluster``, ``perf``, an empty
        best-throughput cache."""
        if not isinstance(spec, self.spec_class):
            raise CodecError(f"{label} codec needs a {self.spec_class.__name__}, got {type(spec).__name__}")
        spec.check_cluster(cluster)
        self.cluster = cluster
        self.perf = perf
        self._best: dict[tuple[str, int], float] = {}

    @classmethod
    def spec_from_dict(cls, d: Any) -> Any:
        return cls.spec_class.from_dict(d)

    @property
    def observation_space(self) -> Box:
        return Box(self.spec.shape, low=self.obs_low)

    @property
    def action_space(self) -> Discrete:
        return Discrete(self.spec.n_actions)

    def begin(self, state: ClusterState) -> Any:
        return self.round_class(self, state)

    def best_thp(self, job: JobInfo) -> float:
        """``job``'s best isolated throughput (samples/s) over its placements (cached per model, GPUs)."""
        key = (job.model, job.gpu_demand)
        v = self._best.get(key)
        if v is None:
            v = self._best[key] = self.perf.best_isolated_throughput(job.model, job.gpu_demand)
        return v
