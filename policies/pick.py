"""One-pick learned policies: what :mod:`policies.sced2` (``sced2``) and :mod:`policies.sizefree`
(``rl-sf``) share.

A one-pick policy scores the actions of a one-pick codec round (:mod:`policies.codecs.pick`) with a
numpy network and starts the valid action of highest score, one at a time with time frozen, until
it picks "nothing" or no start is valid:

* :class:`PickPolicy`: that round loop, the per-round counters and the place limit; a subclass
  gives :meth:`PickPolicy.scores`;
* :func:`masked_argmax`: the valid action of highest score (lowest index on ties);
* :func:`check_float_tensors`, :func:`save_pick_checkpoint` and :func:`load_pick_checkpoint`: the
  weight checks, the checkpoint writer and reader the families share (``NAME.safetensors`` + ``NAME.json`` with the codec's name and spec;
  never unpickles).

Pure apart from reading checkpoint files; no torch.
"""

from __future__ import annotations

from abc import abstractmethod

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from policies.base import Policy
from policies.codecs.base import CodecError
from policies.state import ClusterState, Decision

__all__ = ["PickPolicy", "check_float_tensors", "load_pick_checkpoint", "masked_argmax", "save_pick_checkpoint"]


def masked_argmax(scores: np.ndarray, mask: np.ndarray, label: str, what: str = "score") -> int:
    """The valid action of highest score (lowest index on ties); :class:`ValueError` naming ``label`` and
    ``what`` the scores are when the best valid one is not finite (or none is valid)."""
    m = np.where(mask, scores, -np.inf)
    i = int(m.argmax())
    if not math.isfinite(m[i]):
        raise ValueError(f"{label}: no usable {what} (best valid action {i} has {m[i]})")
    return i


def check_float_tensors(tensors: Mapping[str, np.ndarray], prefixes: Sequence[str], where: str,
                        build: Callable[[], Any]) -> Any:
    """Check that every ``<prefix>.weight`` / ``<prefix>.bias`` is present, float32, finite and of
    magnitude at most 1e6, then return ``build()`` (the network); every problem, and a
    :class:`ValueError` / :class:`KeyError` of ``build``, is a :class:`ValueError` naming ``where``."""
    for p in prefixes:
        for x in ("weight", "bias"):
            t = tensors.get(f"{p}.{x}")
            if t is None:
                raise ValueError(f"{where}: tensor {p}.{x} is missing")
            if t.dtype != np.float32 or not np.isfinite(t).all() or np.abs(t).max(initial=0.0) > 1e6:
                raise ValueError(f"{where}: tensor {p}.{x} must be finite float32 of magnitude <= 1e6")
    try:
        return build()
    except (ValueError, KeyError) as exc:
        raise ValueError(f"{where}: {exc}") from None


def save_pick_checkpoint(path: str | Path, tensors: Mapping[str, np.ndarray], spec: Any, *, fmt: str, version: int,
                         codec: type, check: Callable[[Mapping[str, np.ndarray], Any, str], Any],
                         head: Mapping[str, Any], network: Callable[[Any], dict], tail: Mapping[str, Any]) -> Path:
    """Write a one-pick policy's checkpoint, ``NAME.safetensors`` + ``NAME.json``; returns the JSON path.

    The tensors (as float32) are checked first by ``check(tensors, spec, json path)`` (the family's
    :func:`check_float_tensors`, raising :class:`ValueError`), which builds the network ``net``. The
    JSON holds, in order: ``format``, ``format_version``, ``project_version``, the ``head`` fields, the
    codec's name (``codec``) and ``obs_spec``, ``network(net)`` as ``network``, then the ``tail`` fields.
    """
    from policies.checkpoint import json_path, write_policy_files
    from rlsched import __version__

    jpath = json_path(path)
    arrays = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in tensors.items()}
    net = check(arrays, spec, str(jpath))
    meta = {"format": fmt, "format_version": version, "project_version": __version__, **head,
            "codec": codec.name, "obs_spec": spec.to_dict(), "network": network(net), **tail}
    return write_policy_files(jpath, arrays, meta)


def load_pick_checkpoint(path: str | Path, *, fmt: str, version: int, label: str, codec: type,
                         check: Callable[[Mapping[str, np.ndarray], Any, str], Any]) -> tuple[Any, dict[str, Any], Path]:
    """``(network, metadata, json path)`` of a one-pick policy's checkpoint: the shared file checks
    (:func:`policies.checkpoint.read_policy_files` with ``fmt``, ``version``, ``label``), the codec's name
    (``codec.name``) and spec (``codec.spec_from_dict`` of ``obs_spec``), then ``check(tensors, spec,
    weights path)`` (raising :class:`ValueError`) builds the network. Never unpickles.

    :raises CheckpointError: one line naming the file and the problem.
    """
    from policies.checkpoint import CheckpointError, read_policy_files

    meta, tensors, jpath, wpath = read_policy_files(path, fmt=fmt, version=version, label=label)
    if meta.get("codec") != codec.name:
        raise CheckpointError(f"{jpath}: codec {meta.get('codec')!r} is not {codec.name!r}")
    try:
        spec = codec.spec_from_dict(meta.get("obs_spec"))
    except (CodecError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{jpath}: bad obs_spec: {exc}") from None
    try:
        net = check(tensors, spec, str(wpath))
    except ValueError as exc:
        raise CheckpointError(str(exc)) from None
    return net, meta, jpath


class PickPolicy(Policy):
    """A one-pick learned policy (module docstring): ``net`` scores the actions of ``codec``'s rounds.

    :param net: the network (its ``spec`` is the codec spec it was trained on).
    :param codec: the codec for the cluster.
    :param name: the policy's name.
    :param max_decisions: safety cap on starts per round.
    :param checkpoint: the checkpoint it was loaded from (reported, not read).
    """

    #: asked at arrivals and completions only: time goes to the next event after "nothing"
    time_invariant = True

    def __init__(self, net: Any, codec: Any, name: str, max_decisions: int = 10_000,
                 checkpoint: Path | None = None) -> None:
        self.net, self.codec, self.name = net, codec, name
        self.max_decisions = max_decisions
        self.checkpoint = checkpoint
        #: counters since the last reset(): rounds, starts, "nothing" picked while a start was valid
        self.stats = {"rounds": 0, "placements": 0, "holds": 0}

    def reset(self) -> None:
        self.stats = {k: 0 for k in self.stats}

    @abstractmethod
    def pick(self, enc: Any) -> int:
        """The action taken in encoding ``enc``: the valid one of highest score."""

    def take_other(self, rnd: Any, enc: Any, action: int, dec: Decision) -> bool:
        """Apply ``action`` of ``enc`` to the round ``rnd`` and to ``dec`` when it is neither a start nor
        "nothing" (a subclass's further actions, e.g. the size-free policy's preemptions) and return
        ``True``; the round then goes on. The base codecs have no such action: ``False``."""
        return False

    def schedule(self, state: ClusterState) -> Decision:
        dec = Decision()
        self.stats["rounds"] += 1
        if not state.pending:
            return dec
        rnd = self.codec.begin(state)
        limit = self.place_limit
        for _ in range(self.max_decisions):
            if not rnd.waiting or (limit is not None and len(dec.place) >= limit):
                break
            enc = rnd.encode()
            if not enc.any_placement:
                break
            a = self.pick(enc)
            if self.take_other(rnd, enc, a, dec):
                continue
            choice = enc.decode(a)
            if choice is None:
                self.stats["holds"] += 1
                break
            rnd.place(*choice)
            dec.place.append(choice)
            self.stats["placements"] += 1
        return dec
