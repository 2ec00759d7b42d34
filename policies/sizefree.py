"""The cluster-size-free learned policy ``rl-sf``: a pointer-style scorer over candidate
(job, placement) pairs of :mod:`policies.codecs.sizefree`.

Network (:class:`SizeFreeNet`, numpy; the torch mirror is :mod:`trainer.sizefree.model`): one MLP
shared by every candidate row, ``score_i = w2 . relu(W1 . relu(W0 [x_i, ctx] + b0) + b1) + b2``
(``F + C -> H -> H -> 1``), where ``x_i`` is the candidate's ``F`` features (``spec.cand_features``:
start, preempt and hold rows alike) and ``ctx`` the ``C`` pooled node / queue features; a softmax
over the valid candidates (hold included) is the action distribution. Nothing in it depends on the
number of nodes or of waiting jobs beyond the codec's ``J``, so one checkpoint runs on any cluster.

Policy (:class:`SizeFreePolicy`; the registry's ``rl-base`` and ``rl-sf``, and ``rl-hybrid`` with
the safety rule): each round, with time frozen, it encodes the round, starts the valid candidate of
highest score (lowest index on ties) and repeats until it picks hold or nothing fits. With a
checkpoint whose codec spec has preempt candidates (``preempt`` > 0), a pick of a preempt row stops
that running job (:meth:`SizeFreePolicy.take_other`, :attr:`~policies.state.Decision.preempt`; it
waits again with its progress and may start again in the same round, a move) and the round goes on;
a spec without them never preempts. With a safety rule (``rl-hybrid``), when the network picks hold
while a candidate was valid, the rule then starts what it can in the same round
(:func:`policies.placement.safety_fill`: one pass over the waiting jobs in SRTF order, each job
estimated to end no later than the longest-remaining running job, placed by
:class:`~policies.placement.FloorPacking` with the efficiency floor ``hybrid_floor``, or
:class:`~policies.placement.ContentionAwarePlacement` with ``hybrid_rule="contention-aware"``), the
rule of the fixed-shape ``rl-hybrid-4x8`` (:mod:`policies.rl`). It is asked at events only
(``time_invariant``).

Checkpoints: ``NAME.safetensors`` (float32 tensors :data:`TENSOR_NAMES`, ``.weight`` ``(out, in)``
and ``.bias``) plus ``NAME.json`` (format ``rlsched-sizefree``, the codec's name and spec, the
network's sizes, the training section, the weights' sha256); :func:`load_sizefree` checks all of it
and never unpickles. The critic of PPO is not stored (only the actor acts). Pure apart from reading
/ writing checkpoint files; no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from policies.base import PolicyError
from policies.cluster import ClusterSpec
from policies.codecs.base import CodecError
from policies.codecs.sizefree import N_CTX, SizeFreeCodec, SizeFreeSpec
from policies.perf import ContentionModel
from policies.pick import PickPolicy, check_float_tensors, load_pick_checkpoint, masked_argmax, save_pick_checkpoint
from policies.placement import ContentionAwarePlacement, FloorPacking, safety_fill
from policies.state import ClusterState, Decision

__all__ = ["FORMAT", "NAMES", "TENSOR_NAMES", "SizeFreeNet", "SizeFreePolicy", "load_sizefree",
           "make_sizefree_policy", "save_sizefree", "shipped_sizefree", "tensor_shapes"]

#: The names the size-free network runs under: without a safety rule (``rl-base``, ``rl-sf``) and with it
#: (``rl-hybrid``).
NAMES = ("rl-base", "rl-hybrid", "rl-sf")
#: The safety rule's placements by ``hybrid_rule`` (those of :class:`policies.rl.RLPolicy`).
SAFETY_RULES = {"packing": FloorPacking, "contention-aware": ContentionAwarePlacement}

FORMAT = "rlsched-sizefree"
FORMAT_VERSION = 1
TENSOR_NAMES = ("cand.0", "cand.1", "cand.2")


def tensor_shapes(hidden: int, spec: SizeFreeSpec | None = None) -> dict[str, tuple[tuple[int, int], tuple[int]]]:
    """``prefix -> (weight shape, bias shape)`` for hidden width ``hidden`` and the candidate features of
    ``spec`` (default: a spec without preempt candidates)."""
    H = hidden
    F = (spec or SizeFreeSpec()).cand_features
    dims = {"cand.0": (H, F + N_CTX), "cand.1": (H, H), "cand.2": (1, H)}
    return {k: (v, (v[0],)) for k, v in dims.items()}


class SizeFreeNet:
    """The shared candidate scorer in numpy (module docstring)."""

    def __init__(self, spec: SizeFreeSpec, tensors: Mapping[str, np.ndarray]) -> None:
        H = int(np.asarray(tensors["cand.0.weight"]).shape[0])
        self.spec, self.hidden = spec, H
        self.layers: list[tuple[np.ndarray, np.ndarray]] = []
        for p, (ws, bs) in tensor_shapes(H, spec).items():
            W, b = np.asarray(tensors[p + ".weight"]), np.asarray(tensors[p + ".bias"])
            if W.shape != ws or b.shape != bs:
                raise ValueError(f"sizefree network: {p} has shape {W.shape} / {b.shape}, expected {ws} / {bs}")
            self.layers.append((np.ascontiguousarray(W.T, dtype=np.float32), b.astype(np.float32)))

    def scores(self, obs: np.ndarray) -> np.ndarray:
        """float32 ``[J * P + 1]``: the score of every candidate row of a flat observation."""
        spec = self.spec
        x = np.asarray(obs, dtype=np.float32).reshape(-1)
        if x.size != spec.size:
            raise ValueError(f"sizefree network: observation of {x.size} values, expected {spec.size}")
        F = spec.cand_features
        rows = x[: spec.n_candidates * F].reshape(spec.n_candidates, F)
        ctx = x[spec.n_candidates * F:]
        (W0, b0), (W1, b1), (W2, b2) = self.layers
        h = np.maximum(rows @ W0[:F] + (ctx @ W0[F:] + b0), 0.0)
        h = np.maximum(h @ W1 + b1, 0.0)
        return (h @ W2 + b2).reshape(-1)

    @staticmethod
    def choose(scores: np.ndarray, mask: np.ndarray) -> int:
        """The valid action of highest score (lowest index on ties); :class:`ValueError` if none is usable."""
        return masked_argmax(scores, mask, "sizefree")


class SizeFreePolicy(PickPolicy):
    """The size-free policy (module docstring; the round loop is :class:`policies.pick.PickPolicy`'s).

    :param rule: the safety rule's placement (a :class:`~policies.placement.PlacementRule`), ``None``
        for none (``rl-base``, ``rl-sf``). :attr:`stats` counts its starts as ``fallback_placements``.
    """

    def __init__(self, net: SizeFreeNet, codec: SizeFreeCodec, name: str = "rl-sf", max_decisions: int = 10_000,
                 checkpoint: Path | None = None, rule: Any = None) -> None:
        if net.spec.jobs != codec.spec.jobs or net.spec.preempt != codec.spec.preempt:
            raise PolicyError(f"{name}: network spec {net.spec} does not match the codec's {codec.spec}")
        super().__init__(net, codec, name, max_decisions, checkpoint)
        self.rule = rule
        self.stats["fallback_placements"] = 0
        self.stats["preemptions"] = 0

    def pick(self, enc) -> int:
        return self.net.choose(self.net.scores(enc.obs), enc.mask)

    def take_other(self, rnd, enc, action: int, dec: Decision) -> bool:
        """A preempt action (codec spec ``preempt`` > 0): stop its job in the round and in ``dec``."""
        victim = enc.victim(action) if self.codec.spec.preempt else None
        if victim is None:
            return False
        rnd.preempt(victim)
        dec.preempt.append(victim)
        self.stats["preemptions"] += 1
        return True

    def schedule(self, state: ClusterState) -> Decision:
        holds = self.stats["holds"]
        dec = super().schedule(state)
        if self.rule is None or self.stats["holds"] == holds:  # no safety rule, or the network did not hold
            return dec
        limit = self.place_limit
        room = None if limit is None else limit - len(dec.place)
        if room is not None and room <= 0:
            return dec
        rnd = self.codec.begin(state)  # the round as the network left it: its preemptions and starts applied
        for jid in dec.preempt:
            rnd.preempt(jid)
        for jid, p in dec.place:
            rnd.place(jid, p)
        filled = safety_fill(rnd, self.rule, room)
        dec.place.extend(filled)
        self.stats["fallback_placements"] += len(filled)
        return dec


# ---------------------------------------------------------------------- checkpoints
def shipped_sizefree() -> Path:
    """Path (``.json``) of the shipped ``rl-sf`` checkpoint."""
    p = Path(str(resources.files("policies") / "checkpoints" / "sizefree" / "rl-sf.json"))
    if not p.is_file():
        raise PolicyError("no shipped rl-sf checkpoint; train one with `rlsched train-sizefree` and use rl-sf:/path")
    return p


def _check_tensors(tensors: Mapping[str, np.ndarray], spec: SizeFreeSpec, where: str) -> SizeFreeNet:
    return check_float_tensors(tensors, TENSOR_NAMES, where, lambda: SizeFreeNet(spec, tensors))


def save_sizefree(path: str | Path, tensors: Mapping[str, np.ndarray], spec: SizeFreeSpec,
                  training: Mapping[str, Any], reward: Mapping[str, Any] | None = None) -> Path:
    """Write ``NAME.safetensors`` + ``NAME.json``; returns the JSON path (weights checked first).
    ``reward``, when given, is written as the JSON's ``reward`` section (the training reward, e.g.
    ``{"kind": "seed", "w1": 0.3, "w2": 0.7}``)."""
    return save_pick_checkpoint(
        path, {k: v for k, v in tensors.items() if k.split(".")[0] == "cand"}, spec, fmt=FORMAT,
        version=FORMAT_VERSION, codec=SizeFreeCodec, check=_check_tensors, head={"policy": "rl-sf"},
        network=lambda net: {"kind": "sizefree-pointer", "hidden": net.hidden, "activation": "relu",
                             "tensors": list(TENSOR_NAMES)},
        tail={"training": dict(training), **({"reward": dict(reward)} if reward is not None else {})},
    )


def load_sizefree(path: str | Path) -> tuple[SizeFreeNet, dict[str, Any], Path]:
    """``(network, metadata, json path)``, fully checked; never unpickles.
    :raises CheckpointError: one line naming the file and the problem."""
    return load_pick_checkpoint(path, fmt=FORMAT, version=FORMAT_VERSION, label="rl-sf", codec=SizeFreeCodec,
                                check=_check_tensors)


def make_sizefree_policy(name: str, cluster: ClusterSpec, perf: ContentionModel | None = None,
                         checkpoint: str | Path | None = None, hybrid: bool | None = None,
                         hybrid_floor: float | None = None, hybrid_rule: str = "packing") -> SizeFreePolicy:
    """The size-free policy ``name`` (:data:`NAMES`, optionally ``NAME:/path``; else ``checkpoint``, else
    the shipped checkpoint) on any cluster.

    :param hybrid: add the safety rule (default: for ``rl-hybrid`` only).
    :param hybrid_floor: the safety rule's efficiency floor in ``[0, 1]`` (default
        :data:`policies.rl.HYBRID_FLOOR`).
    :param hybrid_rule: the safety rule's placement, a key of :data:`SAFETY_RULES`.
    :raises PolicyError: an unknown name or rule, a bad floor, or (a :class:`CheckpointError`) an unusable
        checkpoint; one line.
    """
    from policies.checkpoint import checkpoint_of_name

    base = name.strip().partition(":")[0].strip().lower()
    if base not in NAMES:
        raise PolicyError(f"unknown policy {name!r}: expected {', '.join(NAMES)} (optionally :/path/to/checkpoint)")
    ckpt = checkpoint_of_name(name, base) or (Path(checkpoint) if checkpoint else shipped_sizefree())
    if hybrid_rule not in SAFETY_RULES:
        raise PolicyError(f"rl-hybrid safety rule {hybrid_rule!r}: expected one of {', '.join(SAFETY_RULES)}")
    if hybrid_floor is None:
        from policies.rl import HYBRID_FLOOR

        hybrid_floor = HYBRID_FLOOR
    perf = perf or ContentionModel(cluster)
    rule = None
    if base == "rl-hybrid" if hybrid is None else hybrid:
        try:
            rule = SAFETY_RULES[hybrid_rule](perf, min_efficiency=hybrid_floor)
        except ValueError as exc:
            raise PolicyError(f"rl-hybrid safety rule: {exc}") from None
    net, _meta, jpath = load_sizefree(ckpt)
    try:
        codec = SizeFreeCodec(cluster, perf, net.spec)
    except CodecError as exc:
        raise PolicyError(f"{jpath}: {exc}") from None
    return SizeFreePolicy(net, codec, name=base, checkpoint=jpath, rule=rule)
