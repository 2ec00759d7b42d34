"""SCED2 (seed 003) as a policy: a shared-weight Q-network picks waiting jobs, SCED2's packing places them.

Network (:class:`Sced2Net`, numpy; the torch mirror used in training is
:class:`trainer.sced2.qnet.Sced2TorchQ`), on the observation of :mod:`policies.codecs.sced2`
(``N`` servers of ``M`` GPUs, ``J`` job slots of ``F`` features, 4 statistics); ``relu`` between
layers, ``H`` = :attr:`Sced2Net.hidden`, ``Hq`` = :attr:`Sced2Net.head`:

* **server network** (seed eq. 3, ``w_shared``), the same weights on every server's row:
  ``[M GPUs' squashed remaining times, fraction of its GPUs busy]`` (``M + 1``) ``-> H -> H``;
* **job network**, the same weights on every job slot: ``F -> H -> H``;
* **pooling**: the servers' embeddings are pooled by mean and max (``2H``), so the rest of the
  network sees a fixed-size summary however many servers there are (the seed concatenates the
  ``F_i``, which ties a network to one cluster size; pooling keeps the shared per-server weights
  and makes one checkpoint run on any number of servers);
* **heads**: per job slot ``j``, ``Q_j = head([G_j, pooled servers, statistics])``
  (``H + 2H + 4 -> Hq -> 1``, the same weights for every slot); "none",
  ``Q_none = none([pooled servers, statistics, mean of the present jobs' G_j])``
  (``2H + 4 + H -> Hq -> 1``). Output: ``J + 1`` Q-values.

Policy (:class:`Sced2Policy`, name ``sced2``): each round, with time frozen, it encodes the round's
state, takes the valid action of highest Q (lowest index on ties), starts that job on its packing
placement in the round's state, and repeats until the network picks "none" or no waiting job fits.
It never preempts. It is asked only at events (arrivals, completions): ``time_invariant`` is true,
as in the seed, where time goes to the next event after "none".

Checkpoints: ``NAME.safetensors`` (float32 tensors, names :data:`TENSOR_NAMES`) plus ``NAME.json``
(format ``rlsched-sced2``, the codec's name and spec, the network's sizes, the training section,
the weights' sha256); :func:`load_sced2` checks all of it and never unpickles. Pure apart from
reading / writing checkpoint files; no torch.
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
from policies.codecs.sced2 import N_STATS, Sced2Codec, Sced2Spec
from policies.perf import ContentionModel
from policies.pick import PickPolicy, check_float_tensors, load_pick_checkpoint, masked_argmax, save_pick_checkpoint

__all__ = [
    "FORMAT",
    "Sced2Net",
    "Sced2Policy",
    "TENSOR_NAMES",
    "load_sced2",
    "make_sced2_policy",
    "save_sced2",
    "shipped_sced2",
    "tensor_shapes",
]

FORMAT = "rlsched-sced2"
FORMAT_VERSION = 1
#: The network's tensors, in order (``.weight`` of shape ``(out, in)`` and ``.bias`` each).
TENSOR_NAMES = ("srv.0", "srv.1", "job.0", "job.1", "q.0", "q.1", "none.0", "none.1")
#: Masked Q-value (torch mirror too): far below any reachable Q, finite so that no NaN arises.
MASKED_Q = -1e6


def tensor_shapes(spec: Sced2Spec, hidden: int, head: int) -> dict[str, tuple[tuple[int, int], tuple[int]]]:
    """``prefix -> (weight shape, bias shape)`` of the network for ``spec`` (independent of its ``nodes``)."""
    M, F, H, Hq = spec.gpus_per_node, spec.job_features, hidden, head
    dims = {
        "srv.0": (H, M + 1), "srv.1": (H, H), "job.0": (H, F), "job.1": (H, H),
        "q.0": (Hq, 3 * H + N_STATS), "q.1": (1, Hq), "none.0": (Hq, 3 * H + N_STATS), "none.1": (1, Hq),
    }
    return {k: (v, (v[0],)) for k, v in dims.items()}


def _relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0.0, out=x)


class Sced2Net:
    """SCED2's shared-weight Q-network in numpy (module docstring).

    :param spec: the codec spec it reads (any ``nodes``).
    :param tensors: ``"<prefix>.weight"`` / ``"<prefix>.bias"`` for every prefix of :data:`TENSOR_NAMES`.
    """

    def __init__(self, spec: Sced2Spec, tensors: Mapping[str, np.ndarray]) -> None:
        H = int(np.asarray(tensors["srv.1.weight"]).shape[0])
        Hq = int(np.asarray(tensors["q.0.weight"]).shape[0])
        want = tensor_shapes(spec, H, Hq)
        self.spec, self.hidden, self.head = spec, H, Hq
        self.layers: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for p, (ws, bs) in want.items():
            W, b = np.asarray(tensors[p + ".weight"]), np.asarray(tensors[p + ".bias"])
            if W.shape != ws or b.shape != bs:
                raise ValueError(f"sced2 network: {p} has shape {W.shape} / {b.shape}, expected {ws} / {bs}")
            self.layers[p] = (np.ascontiguousarray(W.T, dtype=np.float32), b.astype(np.float32))

    def _mlp2(self, name: str, x: np.ndarray) -> np.ndarray:
        W0, b0 = self.layers[name + ".0"]
        W1, b1 = self.layers[name + ".1"]
        return _relu(_relu(x @ W0 + b0) @ W1 + b1)

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        """float32 ``[J + 1]``: the Q-values of a flat observation (any number of servers: its length
        gives ``N``)."""
        spec = self.spec
        M, J, F, k = spec.gpus_per_node, spec.jobs, spec.job_features, spec.k
        x = np.asarray(obs, dtype=np.float32).reshape(-1)
        n_gpu = x.size - J * F - N_STATS
        if n_gpu <= 0 or n_gpu % M:
            raise ValueError(f"sced2 network: observation of {x.size} values is not N * {M} + {J * F + N_STATS}")
        gpu = x[:n_gpu].reshape(-1, M)
        jobs = x[n_gpu: n_gpu + J * F].reshape(J, F)
        stats = x[n_gpu + J * F:]
        srv_in = np.concatenate([gpu, (gpu > 0).mean(axis=1, keepdims=True, dtype=np.float32)], axis=1)
        S = self._mlp2("srv", srv_in)
        pooled = np.concatenate([S.mean(axis=0), S.max(axis=0)])
        G = self._mlp2("job", jobs)
        present = jobs[:, k] > 0
        mean_g = G[present].mean(axis=0) if present.any() else np.zeros(self.hidden, np.float32)
        ctx = np.concatenate([pooled, stats])
        W0, b0 = self.layers["q.0"]
        W1, b1 = self.layers["q.1"]
        h = _relu(G @ W0[: self.hidden] + (ctx @ W0[self.hidden:] + b0))
        q_jobs = (h @ W1 + b1).reshape(-1)
        W0, b0 = self.layers["none.0"]
        W1, b1 = self.layers["none.1"]
        q_none = _relu(np.concatenate([ctx, mean_g]) @ W0 + b0) @ W1 + b1
        return np.concatenate([q_jobs, q_none]).astype(np.float32, copy=False)

    @staticmethod
    def choose(q: np.ndarray, mask: np.ndarray) -> int:
        """The valid action of highest Q (lowest index on ties); :class:`ValueError` if none is usable."""
        return masked_argmax(q, mask, "sced2", "Q-value")


class Sced2Policy(PickPolicy):
    """SCED2 as a :class:`Policy` (module docstring): the network picks jobs, packing places them (the
    round loop is :class:`policies.pick.PickPolicy`'s; seed: time goes to the next event after "none").

    :param net: the Q-network.
    :param codec: the codec for the cluster.
    :param max_decisions: safety cap on starts per round.
    """

    def __init__(self, net: Sced2Net, codec: Sced2Codec, name: str = "sced2", max_decisions: int = 10_000,
                 checkpoint: Path | None = None) -> None:
        if (net.spec.gpus_per_node, net.spec.jobs, net.spec.k) != (codec.spec.gpus_per_node, codec.spec.jobs, codec.spec.k):
            raise PolicyError(f"sced2: network spec {net.spec} does not match the codec's {codec.spec}")
        super().__init__(net, codec, name, max_decisions, checkpoint)

    def pick(self, enc) -> int:
        return self.net.choose(self.net.q_values(enc.obs), enc.mask)


# ---------------------------------------------------------------------- checkpoints
def shipped_sced2(gpus_per_node: int) -> Path:
    """Path (``.json``) of the shipped SCED2 checkpoint for servers of ``gpus_per_node`` GPUs."""
    base = Path(str(resources.files("policies") / "checkpoints" / "sced2"))
    p = base / f"sced2-m{gpus_per_node}.json"
    if not p.is_file():
        have = sorted(x.stem for x in base.glob("*.json")) if base.is_dir() else []
        raise PolicyError(
            f"no shipped sced2 checkpoint for servers of {gpus_per_node} GPUs (shipped: {', '.join(have) or 'none'}); "
            "train one with `rlsched train-sced2` and use sced2:/path/to/checkpoint"
        )
    return p


def save_sced2(path: str | Path, tensors: Mapping[str, np.ndarray], spec: Sced2Spec, cluster: ClusterSpec,
               training: Mapping[str, Any]) -> Path:
    """Write ``NAME.safetensors`` + ``NAME.json`` (module docstring); returns the JSON path. The weights
    are checked as :func:`load_sced2` checks them before anything is written (:class:`ValueError`)."""
    return save_pick_checkpoint(
        path, tensors, spec, fmt=FORMAT, version=FORMAT_VERSION, codec=Sced2Codec, check=_check_tensors,
        head={"algo": "dqn", "policy": "sced2"},
        network=lambda net: {"kind": "sced2-shared", "hidden": net.hidden, "head": net.head, "activation": "relu",
                             "tensors": list(TENSOR_NAMES)},
        tail={
            "cluster": cluster.to_dict(),
            "cluster_shape": cluster.describe(),
            "reward": {"kind": "effectiveness", "per": "scheduled job", "formula": "T_ideal / (T_wait + T_actual)"},
            "training": dict(training),
        },
    )


def _check_tensors(tensors: Mapping[str, np.ndarray], spec: Sced2Spec, where: str) -> Sced2Net:
    return check_float_tensors(tensors, TENSOR_NAMES, where, lambda: Sced2Net(spec, tensors))


def load_sced2(path: str | Path) -> tuple[Sced2Net, dict[str, Any], Path]:
    """``(network, metadata, json path)`` of a SCED2 checkpoint, fully checked (format, codec, spec, hash,
    tensor names, shapes, dtypes, finite values). Never unpickles.

    :raises PolicyError: one line naming the file and the problem.
    """
    return load_pick_checkpoint(path, fmt=FORMAT, version=FORMAT_VERSION, label="sced2", codec=Sced2Codec,
                                check=_check_tensors)


def make_sced2_policy(name: str, cluster: ClusterSpec, perf: ContentionModel | None = None,
                      checkpoint: str | Path | None = None) -> Sced2Policy:
    """``sced2`` (the shipped checkpoint for the cluster's GPUs per server, or ``checkpoint``) or
    ``sced2:/path/ckpt`` for ``cluster`` (any number of servers). :class:`PolicyError` with one line."""
    from policies.checkpoint import checkpoint_of_name

    named = checkpoint_of_name(name, "sced2")
    if not cluster.is_homogeneous:
        raise PolicyError(f"policy {name!r}: sced2 needs servers with equal GPU counts, got {cluster.describe_gpus()}")
    ckpt = named or (Path(checkpoint) if checkpoint else shipped_sced2(cluster.gpus_per_node[0]))
    net, _meta, jpath = load_sced2(ckpt)
    try:
        codec = Sced2Codec(cluster, perf or ContentionModel(cluster), net.spec)
    except CodecError as exc:
        raise PolicyError(f"{jpath}: {exc}") from None
    return Sced2Policy(net, codec, name="sced2", checkpoint=jpath)
