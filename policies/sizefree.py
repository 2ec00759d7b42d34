"""The cluster-size-free learned policy ``rl-sf``: a pointer-style scorer over candidate
(job, placement) pairs of :mod:`policies.codecs.sizefree`.

Network (:class:`SizeFreeNet`, numpy; the torch mirror is :mod:`trainer.sizefree.model`): one MLP
shared by every candidate row, ``score_i = w2 . relu(W1 . relu(W0 [x_i, ctx] + b0) + b1) + b2``
(``F + C -> H -> H -> 1``), where ``x_i`` is the candidate's ``F`` features and ``ctx`` the ``C``
pooled node / queue features; a softmax over the valid candidates (hold included) is the action
distribution. Nothing in it depends on the number of nodes or of waiting jobs beyond the codec's
``J``, so one checkpoint runs on any cluster.

Policy (:class:`SizeFreePolicy`, name ``rl-sf``): each round, with time frozen, it encodes the
round, starts the valid candidate of highest score (lowest index on ties) and repeats until it
picks hold or nothing fits. It never preempts; it is asked at events only (``time_invariant``).

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
from policies.codecs.sizefree import N_CAND, N_CTX, SizeFreeCodec, SizeFreeSpec
from policies.perf import ContentionModel
from policies.pick import PickPolicy, check_float_tensors, load_pick_checkpoint, masked_argmax, save_pick_checkpoint

__all__ = ["FORMAT", "TENSOR_NAMES", "SizeFreeNet", "SizeFreePolicy", "load_sizefree", "make_sizefree_policy",
           "save_sizefree", "shipped_sizefree", "tensor_shapes"]

FORMAT = "rlsched-sizefree"
FORMAT_VERSION = 1
TENSOR_NAMES = ("cand.0", "cand.1", "cand.2")


def tensor_shapes(hidden: int) -> dict[str, tuple[tuple[int, int], tuple[int]]]:
    """``prefix -> (weight shape, bias shape)`` for hidden width ``hidden``."""
    H = hidden
    dims = {"cand.0": (H, N_CAND + N_CTX), "cand.1": (H, H), "cand.2": (1, H)}
    return {k: (v, (v[0],)) for k, v in dims.items()}


class SizeFreeNet:
    """The shared candidate scorer in numpy (module docstring)."""

    def __init__(self, spec: SizeFreeSpec, tensors: Mapping[str, np.ndarray]) -> None:
        H = int(np.asarray(tensors["cand.0.weight"]).shape[0])
        self.spec, self.hidden = spec, H
        self.layers: list[tuple[np.ndarray, np.ndarray]] = []
        for p, (ws, bs) in tensor_shapes(H).items():
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
        rows = x[: spec.n_candidates * N_CAND].reshape(spec.n_candidates, N_CAND)
        ctx = x[spec.n_candidates * N_CAND:]
        (W0, b0), (W1, b1), (W2, b2) = self.layers
        h = np.maximum(rows @ W0[:N_CAND] + (ctx @ W0[N_CAND:] + b0), 0.0)
        h = np.maximum(h @ W1 + b1, 0.0)
        return (h @ W2 + b2).reshape(-1)

    @staticmethod
    def choose(scores: np.ndarray, mask: np.ndarray) -> int:
        """The valid action of highest score (lowest index on ties); :class:`ValueError` if none is usable."""
        return masked_argmax(scores, mask, "sizefree")


class SizeFreePolicy(PickPolicy):
    """``rl-sf`` (module docstring; the round loop is :class:`policies.pick.PickPolicy`'s)."""

    def __init__(self, net: SizeFreeNet, codec: SizeFreeCodec, name: str = "rl-sf", max_decisions: int = 10_000,
                 checkpoint: Path | None = None) -> None:
        if net.spec.jobs != codec.spec.jobs:
            raise PolicyError(f"rl-sf: network spec {net.spec} does not match the codec's {codec.spec}")
        super().__init__(net, codec, name, max_decisions, checkpoint)

    def pick(self, enc) -> int:
        return self.net.choose(self.net.scores(enc.obs), enc.mask)


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
                  training: Mapping[str, Any]) -> Path:
    """Write ``NAME.safetensors`` + ``NAME.json``; returns the JSON path (weights checked first)."""
    return save_pick_checkpoint(
        path, {k: v for k, v in tensors.items() if k.split(".")[0] == "cand"}, spec, fmt=FORMAT,
        version=FORMAT_VERSION, codec=SizeFreeCodec, check=_check_tensors, head={"policy": "rl-sf"},
        network=lambda net: {"kind": "sizefree-pointer", "hidden": net.hidden, "activation": "relu",
                             "tensors": list(TENSOR_NAMES)},
        tail={"training": dict(training)},
    )


def load_sizefree(path: str | Path) -> tuple[SizeFreeNet, dict[str, Any], Path]:
    """``(network, metadata, json path)``, fully checked; never unpickles.
    :raises CheckpointError: one line naming the file and the problem."""
    return load_pick_checkpoint(path, fmt=FORMAT, version=FORMAT_VERSION, label="rl-sf", codec=SizeFreeCodec,
                                check=_check_tensors)


def make_sizefree_policy(name: str, cluster: ClusterSpec, perf: ContentionModel | None = None,
                         checkpoint: str | Path | None = None) -> SizeFreePolicy:
    """``rl-sf`` (the shipped checkpoint, or ``checkpoint``) or ``rl-sf:/path`` on any cluster."""
    from policies.checkpoint import checkpoint_of_name

    ckpt = checkpoint_of_name(name, "rl-sf") or (Path(checkpoint) if checkpoint else shipped_sizefree())
    net, _meta, jpath = load_sizefree(ckpt)
    try:
        codec = SizeFreeCodec(cluster, perf or ContentionModel(cluster), net.spec)
    except CodecError as exc:
        raise PolicyError(f"{jpath}: {exc}") from None
    return SizeFreePolicy(net, codec, checkpoint=jpath)
