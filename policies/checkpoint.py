"""RL policy checkpoints: safetensors weights plus JSON metadata. Never unpickles.

A checkpoint is two files side by side::

    NAME.safetensors   the policy network's tensors (float32)
    NAME.json          metadata (below), including the sha256 of NAME.safetensors

Metadata fields (all required unless marked)::

    format            "rlsched-policy"
    format_version    1
    project_version   rlsched version that wrote it
    algo              maskable-ppo | ppo | a2c | dqn
    mode              default policy mode: rl-base | rl-hybrid
    cluster           ClusterSpec.to_dict() of the training cluster
    obs_spec          ObsSpec.to_dict() (shape, K, levels, encoding version)
    network           {"kind": "mlp", "layers": [prefix, ...], "activation": "tanh"|"relu"}
                      layer i computes act(x @ W_i.T + b_i) from tensors
                      "<prefix>.weight" / "<prefix>.bias"; the last has no activation
                      and outputs one logit (or Q-value) per action
    reward            {"kind": "jct"|"seed", "w1": float, "w2": float}
    training          free-form: traces, timesteps, seed, command, evaluation (optional content)
    weights_file      file name of the weights, relative to the JSON
    weights_sha256    hex sha256 of the weights file

:func:`load_checkpoint` checks everything (files present, JSON well formed,
hash, tensor shapes chaining from the observation size to the action count)
and raises :class:`CheckpointError` naming the file and the problem. Field
types are checked, not coerced: integers must be JSON integers (not ``8.9``,
not ``true``), numbers finite (``json`` accepts ``NaN`` / ``Infinity``); the
observation spec must make sense (``k >= 1``, ``1 <= levels <= 4``, ...;
:class:`~policies.encoding.ObsSpec`); the prior's scale is at most
:data:`policies.prior.MAX_SCALE`; the inference layers are float32 and their
outputs provably stay far below float32's limit for every observation (so the
logits can never become ``inf`` / NaN while scheduling). The ``training``
section is free-form except for the fields code reads (``timesteps``,
``config``, ``source``, ``config.traces``). :meth:`Checkpoint.check_cluster`
compares the cluster with the training cluster node by node.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from policies.base import PolicyError
from policies.cluster import ClusterSpec
from policies.encoding import EncodingError, ObsSpec, SparseObs
from policies.prior import AdmissionPrior, PriorError

__all__ = ["FORMAT", "Checkpoint", "CheckpointError", "MLPNet", "load_checkpoint", "resolve_paths", "save_checkpoint"]

FORMAT = "rlsched-policy"
FORMAT_VERSION = 1
ALGOS = ("maskable-ppo", "ppo", "a2c", "dqn")
MODES = ("rl-base", "rl-hybrid")
_MAX_JSON = 1 << 20
#: Largest accepted bound on a layer's pre-activation over all observations (every observation
#: value is in [0, 1]): float32's max is ~3.4e38, so the logits stay finite with room for the
#: admission prior (at most ``2e6 * K * S``, :data:`policies.prior.MAX_SCALE`) to be added.
_MAX_PREACT = 1e38


class CheckpointError(PolicyError):
    """A checkpoint that cannot be used (missing, corrupt, tampered, wrong shape)."""


class MLPNet:
    """A plain MLP evaluated with numpy (no torch needed at inference).

    :param weights: ``[(W, b), ...]`` with ``W`` of shape ``(out, in)``.
    :param activation: ``"tanh"`` or ``"relu"`` between layers.
    """

    def __init__(self, weights: list[tuple[np.ndarray, np.ndarray]], activation: str = "tanh") -> None:
        if activation not in ("tanh", "relu"):
            raise ValueError(f"unknown activation {activation!r}")
        self.layers = [(np.ascontiguousarray(W.T, dtype=np.float32), b.astype(np.float32)) for W, b in weights]
        self.activation = activation
        self._plans: dict[tuple, _SparsePlan] = {}

    @property
    def in_features(self) -> int:
        return self.layers[0][0].shape[0]

    @property
    def out_features(self) -> int:
        return self.layers[-1][0].shape[1]

    def logits(self, obs: np.ndarray) -> np.ndarray:
        """``obs`` of any shape with ``in_features`` elements -> float32 ``[out_features]``."""
        x = obs.reshape(-1).astype(np.float32, copy=False)
        last = len(self.layers) - 1
        for i, (W, b) in enumerate(self.layers):
            x = x @ W + b
            if i < last:
                x = np.tanh(x) if self.activation == "tanh" else np.maximum(x, 0.0)
        return x

    def _hidden(self, x: np.ndarray) -> np.ndarray:
        """Layers after the first, given the first layer's pre-activation ``x``."""
        last = len(self.layers) - 1
        tanh = self.activation == "tanh"
        for i, (W, b) in enumerate(self.layers):
            if i > 0:
                x = np.dot(x, W)  # == x @ W + b, with one temporary fewer
                x += b
            if i < last:
                x = np.tanh(x) if tanh else np.maximum(x, 0.0)
        return x

    def sparse_plan(self, spec: ObsSpec, exists: np.ndarray) -> _SparsePlan:
        """The precomputed first-layer sums for observations of ``spec`` with slot mask ``exists`` (cached)."""
        key = (spec, exists.tobytes())
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = _SparsePlan(self.layers[0], spec, exists)
        return plan

    def logits_sparse(self, sp: SparseObs, plan: _SparsePlan) -> np.ndarray:
        """:meth:`logits` of the observation ``sp`` (a :class:`~policies.encoding.SparseObs`) -> float32 ``[out]``.

        Exact algebra on the linear first layer (constant channels via
        precomputed column sums, sparse channels via their nonzero cells,
        running jobs via cached per-job sums), so it equals :meth:`logits` of
        ``sp.dense(...)`` up to float rounding (relative 1e-5; tested).
        """
        return self._hidden(plan.first_layer(sp).astype(np.float32))

    @staticmethod
    def choose(
        z32: np.ndarray, mask: np.ndarray, deterministic: bool = True, rng: np.random.Generator | None = None
    ) -> int:
        """Best valid action of logits ``z32`` (argmax of masked logits; lowest index on ties), or a sample."""
        if deterministic or rng is None:  # float32 -> float64 is exact: the same argmax without converting
            return int(np.argmax(np.where(mask, z32, -np.inf)))
        z = z32.astype(np.float64)
        z = np.where(mask, z, -np.inf)
        z = z - z.max()
        p = np.exp(z)
        p /= p.sum()
        return int(rng.choice(len(p), p=p))

    def act(
        self, obs: np.ndarray, mask: np.ndarray, deterministic: bool = True, rng: np.random.Generator | None = None
    ) -> int:
        """Best valid action (argmax of masked logits; lowest index on ties), or a sample."""
        return self.choose(self.logits(obs), mask, deterministic, rng)


class _SparsePlan:
    """First-layer sums of one network for one observation spec and slot mask.

    With ``W`` the first layer viewed as ``[C, N, 2G, H]`` (float64 copies):
    ``const`` = bias + channel 0 summed over existing left slots, ``queue``
    = channel 8 summed over them, ``cand[i]`` = channel ``K*S + i`` summed
    over existing right slots, ``prefix[v, g, c]`` = channels 1..7 summed over
    left columns ``< g`` of node ``v`` (span sums by one subtraction).
    Running jobs' contributions are memoised by value ``(feats, spans)``.
    """

    _JOB_MEMO_MAX = 65536

    def __init__(self, layer: tuple[np.ndarray, np.ndarray], spec: ObsSpec, exists: np.ndarray) -> None:
        Wt, b = layer  # Wt: [in, H]
        C, N, G2 = spec.shape
        G = G2 // 2
        H = Wt.shape[1]
        if Wt.shape[0] != C * N * G2 or exists.shape != (N, G):
            raise ValueError(f"first layer {Wt.shape} / slot mask {exists.shape} do not fit observation {spec.shape}")
        W = Wt.reshape(C, N, G2, H)
        ex = exists.astype(np.float64)
        left = W[:, :, :G, :].astype(np.float64)
        self.const = b.astype(np.float64) + np.einsum("vg,vgh->h", ex, left[0])
        self.queue = np.einsum("vg,vgh->h", ex, left[8])
        base = spec.k * spec.options
        self.cand = np.einsum("vg,cvgh->ch", ex, W[base:, :, G:, :].astype(np.float64))
        pre = np.zeros((7, N, G + 1, H), dtype=np.float64)
        np.cumsum(left[1:8], axis=2, out=pre[:, :, 1:, :])
        self.prefix = np.ascontiguousarray(pre.transpose(1, 2, 0, 3))  # [N, G+1, 7, H]
        self._prefix_rows = self.prefix.reshape(N * (G + 1), 7, H)  # row v * (G + 1) + g
        self.Wflat = Wt
        self.N, self.G2 = N, G2
        self._ks = base
        self._rprefix: np.ndarray | None = None
        self._table: np.ndarray | None = None
        self._cand_rows: list[int] = []
        self._cand_pad: list[float] = []
        self._queue_row = -1
        self._jobs: dict[tuple, np.ndarray] = {}

    def right_prefix(self) -> np.ndarray:
        """float64 ``[K*S, N, G+1, H]``: option channels summed over right-half columns ``G .. G+g-1`` (lazy)."""
        if self._rprefix is None:
            G = self.G2 // 2
            W = self.Wflat.reshape(-1, self.N, self.G2, self.Wflat.shape[1])
            rp = np.zeros((self._ks, self.N, G + 1, W.shape[3]), dtype=np.float64)
            np.cumsum(W[: self._ks, :, G:, :].astype(np.float64), axis=2, out=rp[:, :, 1:, :])
            self._rprefix = rp
        return self._rprefix

    def round_table(self) -> np.ndarray:
        """float64 ``[K*S*N*(G+1) + 5K + 1, H]`` (lazy): :meth:`right_prefix` flattened (row
        ``(c * N + v) * (G + 1) + g``), then the candidate rows ``cand``, then ``queue``."""
        if self._table is None:
            rp = self.right_prefix()
            self._table = np.concatenate([rp.reshape(-1, rp.shape[-1]), self.cand, self.queue[None, :]])
            n = rp.shape[0] * rp.shape[1] * rp.shape[2]
            self._cand_rows = list(range(n, n + len(self.cand)))
            self._cand_pad = [0.0] * len(self.cand)
            self._queue_row = n + len(self.cand)
        return self._table

    def _first_layer_round(self, sp: SparseObs) -> np.ndarray:
        """:meth:`first_layer` of a :class:`~policies.encoding.RoundEncoder` observation: the option
        spans (prefix-sum rows, gathered) and the candidate and queue values (a slice of
        :meth:`round_table`), each as a float32-rounded coefficient vector (the values the dense
        tensor holds) times those rows."""
        table = self.round_table()
        # candidate and queue rows are the table's last rows (a slice; absent candidates' values 0).
        # Values rounded to float32 as the dense tensor holds them, converted in one call
        # (np.array(list, float32) rounds the same but converts Python floats one by one).
        cq = sp.cand + self._cand_pad[len(sp.cand) :]
        cq.append(sp.queue)
        ns = len(sp.span_coef)
        x = np.array(sp.span_coef + cq).astype(np.float32).astype(np.float64)
        h = np.dot(x[ns:], table[self._cand_rows[0] :])
        if ns:
            h += np.dot(x[:ns], table.take(sp.span_idx, axis=0))
        h += self.const
        h += sp.left
        return h

    def job(self, feats: tuple[float, ...], spans: tuple[tuple[int, int, int], ...]) -> np.ndarray:
        """Contribution ``[H]`` of one running job (channels 1..7 over its visible slots)."""
        key = (feats, spans)
        v = self._jobs.get(key)
        if v is None:
            # feats . sum over spans of (prefix[end] - prefix[start]), as one matrix-vector product over
            # the gathered prefix rows, with the float32 features the dense tensor holds (negated for starts)
            f = np.array(feats).astype(np.float32).astype(np.float64)
            m = len(spans)
            if m == 1:
                (n, a, b), = spans
                v = np.dot(f, self.prefix[n, b] - self.prefix[n, a])
            else:
                G1 = self.G2 // 2 + 1
                rows = [n * G1 + b for n, _a, b in spans] + [n * G1 + a for n, a, _b in spans]
                coef = np.concatenate([f] * m + [-f] * m)
                X = self._prefix_rows.take(rows, axis=0)  # [2m, 7, H]
                v = np.dot(coef, X.reshape(2 * m * 7, -1))
            if len(self._jobs) >= self._JOB_MEMO_MAX:
                self._jobs.clear()
            self._jobs[key] = v
        return v

    def first_layer(self, sp: SparseObs) -> np.ndarray:
        """First-layer pre-activation (float64 ``[H]``) of the observation ``sp``."""
        if sp.span_idx is not None:  # RoundEncoder: spans, candidates and queue as two matrix-vector products
            return self._first_layer_round(sp)
        q = float(np.float32(sp.queue))
        h = self.const + q * self.queue
        if sp.left is not None:  # running jobs already summed (policies.encoding.RoundEncoder)
            h = h + sp.left
        elif sp.jobs:
            h = h + np.add.reduce([self.job(f, s) for f, s in sp.jobs])
        if sp.opt_c:
            idx = (np.asarray(sp.opt_c) * self.N + np.asarray(sp.opt_v)) * self.G2 + np.asarray(sp.opt_g)
            h = h + np.asarray(sp.opt_x, dtype=np.float32).astype(np.float64) @ self.Wflat[idx].astype(np.float64)
        if sp.cand:
            h = h + np.asarray(sp.cand, dtype=np.float32).astype(np.float64) @ self.cand[: len(sp.cand)]
        return h


@dataclass
class Checkpoint:
    """A loaded checkpoint: metadata, the network and the paths it came from."""

    meta: dict[str, Any]
    net: MLPNet
    spec: ObsSpec
    cluster: ClusterSpec
    json_path: Path
    weights_path: Path

    @property
    def mode(self) -> str:
        return str(self.meta["mode"])

    @property
    def prior(self) -> AdmissionPrior | None:
        """The admission prior added to the network's logits (``None``: the network alone)."""
        return AdmissionPrior.from_dict(self.meta["network"].get("prior"))

    def check_cluster(self, cluster: ClusterSpec) -> None:
        """Raise :class:`CheckpointError` unless ``cluster`` has the training cluster's shape:
        the observation spec's (nodes, largest node, total GPUs, levels) and the GPU count of
        every node, in node order (heterogeneous clusters: ``[8, 4, 4]`` is not ``[8, 6, 2]``)."""
        try:
            self.spec.check_cluster(cluster, layout=self.cluster.gpus_per_node)
        except EncodingError as exc:
            raise CheckpointError(f"{self.json_path}: {exc}") from exc


def resolve_paths(path: str | Path) -> tuple[Path, Path | None]:
    """``NAME``, ``NAME.json`` or ``NAME.safetensors`` -> (json path, weights path from the JSON later)."""
    p = Path(path)
    if p.suffix == ".safetensors":
        p = p.with_suffix(".json")
    elif p.suffix != ".json":
        p = p.with_name(p.name + ".json")
    return p, None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _require(meta: Mapping, key: str, typ: type | tuple, where: Path) -> Any:
    if key not in meta:
        raise CheckpointError(f"{where}: metadata field {key!r} is missing")
    v = meta[key]
    if not isinstance(v, typ):
        raise CheckpointError(f"{where}: metadata field {key!r} has type {type(v).__name__}")
    return v


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Load and fully validate a checkpoint (see module docstring). Never unpickles."""
    from safetensors import SafetensorError
    from safetensors.numpy import load as st_load

    jpath, _ = resolve_paths(path)
    if not jpath.is_file():
        raise CheckpointError(f"{jpath}: checkpoint metadata not found (expected NAME.json beside NAME.safetensors)")
    if jpath.stat().st_size > _MAX_JSON:
        raise CheckpointError(f"{jpath}: metadata is larger than {_MAX_JSON} bytes")
    try:
        meta = json.loads(jpath.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{jpath}: metadata is not valid JSON: {exc}") from exc
    except (RecursionError, ValueError) as exc:  # nested too deep; an integer of more than 4300 digits
        raise CheckpointError(f"{jpath}: metadata is not usable JSON: {type(exc).__name__}: {exc}") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{jpath}: metadata must be a JSON object")
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{jpath}: not an rlsched policy checkpoint (format={meta.get('format')!r})")
    fv = meta.get("format_version")
    if isinstance(fv, bool) or not isinstance(fv, int) or fv != FORMAT_VERSION:  # not True, not 1.0
        raise CheckpointError(
            f"{jpath}: unsupported format_version {meta.get('format_version')!r} (expected {FORMAT_VERSION})"
        )
    algo = _require(meta, "algo", str, jpath)
    if algo not in ALGOS:
        raise CheckpointError(f"{jpath}: unknown algo {algo!r}")
    mode = _require(meta, "mode", str, jpath)
    if mode not in MODES:
        raise CheckpointError(f"{jpath}: unknown mode {mode!r}; expected one of {', '.join(MODES)}")
    _require(meta, "project_version", str, jpath)
    _require(meta, "reward", dict, jpath)
    _check_training(_require(meta, "training", dict, jpath), jpath)
    cluster = _cluster_from_dict(_require(meta, "cluster", dict, jpath), jpath)
    spec_meta = _require(meta, "obs_spec", dict, jpath)
    try:
        spec = ObsSpec.from_dict(spec_meta)
        spec.check_cluster(cluster)
    except (EncodingError, ValueError, KeyError, TypeError, OverflowError) as exc:
        raise CheckpointError(f"{jpath}: bad obs_spec metadata: {exc}") from exc
    net_meta = _require(meta, "network", dict, jpath)
    if net_meta.get("kind") != "mlp":
        raise CheckpointError(f"{jpath}: network kind {net_meta.get('kind')!r} is not supported (expected 'mlp')")
    layers = net_meta.get("layers")
    if not isinstance(layers, list) or not layers or not all(isinstance(x, str) for x in layers):
        raise CheckpointError(f"{jpath}: network.layers must be a non-empty list of tensor name prefixes")
    activation = net_meta.get("activation")
    if activation not in ("tanh", "relu"):
        raise CheckpointError(f"{jpath}: network.activation must be 'tanh' or 'relu', got {activation!r}")
    wname = _require(meta, "weights_file", str, jpath)
    if "/" in wname or "\\" in wname or wname in ("", ".", ".."):
        raise CheckpointError(f"{jpath}: weights_file must be a plain file name, got {wname!r}")
    wpath = jpath.with_name(wname)
    if not wpath.is_file():
        raise CheckpointError(f"{wpath}: checkpoint weights not found")
    want = _require(meta, "weights_sha256", str, jpath).lower()
    try:
        got = _sha256(wpath)
    except OSError as exc:
        raise CheckpointError(f"{wpath}: cannot read the checkpoint weights: {exc}") from None
    if got != want:
        raise CheckpointError(
            f"{wpath}: sha256 {got[:16]}... does not match the metadata's {want[:16]}...; "
            "the weights are truncated or were modified"
        )
    try:
        tensors = st_load(wpath.read_bytes())
    except (SafetensorError, ValueError, OSError, KeyError, TypeError) as exc:  # KeyError: a dtype numpy lacks (BF16)
        raise CheckpointError(f"{wpath}: not a readable safetensors file: {exc}") from exc
    weights = []
    n_in = math.prod(spec.shape)  # exact (np.prod would wrap around for absurd fields)
    for i, prefix in enumerate(layers):
        W, b = tensors.get(prefix + ".weight"), tensors.get(prefix + ".bias")
        if W is None or b is None:
            raise CheckpointError(f"{wpath}: tensors {prefix}.weight / {prefix}.bias missing")
        if W.ndim != 2 or b.shape != (W.shape[0],) or W.shape[1] != n_in or W.shape[0] == 0:
            raise CheckpointError(
                f"{wpath}: layer {prefix} has shape {tuple(W.shape)} / {tuple(b.shape)}, "
                f"expected (*, {n_in}) with matching bias and at least one output"
            )
        if W.dtype != np.float32 or b.dtype != np.float32:  # save_checkpoint writes float32 only
            raise CheckpointError(f"{wpath}: layer {prefix} is {W.dtype} / {b.dtype}, expected float32")
        if not (np.isfinite(W).all() and np.isfinite(b).all()):
            raise CheckpointError(f"{wpath}: layer {prefix} holds non-finite values")
        weights.append((W, b))
        n_in = W.shape[0]
    if n_in != spec.n_actions:
        raise CheckpointError(f"{wpath}: network outputs {n_in} values but the action space has {spec.n_actions}")
    # Finite weights can still overflow float32 (e.g. 1e37 x 64 hidden units): bound every layer's
    # pre-activation over all inputs in [-1, 1] (observations are in [0, 1]; tanh keeps hidden
    # values in [-1, 1], relu keeps the bound), in float64, so that a checkpoint whose logits could
    # become inf / NaN is refused here rather than mid-simulation.
    bound = np.ones(math.prod(spec.shape), dtype=np.float64)
    for i, ((W, b), prefix) in enumerate(zip(weights, layers)):
        pre = np.abs(W.astype(np.float64)) @ bound + np.abs(b.astype(np.float64))
        worst = float(pre.max())
        if not worst <= _MAX_PREACT:
            raise CheckpointError(
                f"{wpath}: layer {prefix} can output values of magnitude {worst:.3g}, above the {_MAX_PREACT:g} "
                "that keeps float32 logits finite with margin; the weights are corrupt or were modified"
            )
        bound = np.minimum(pre, 1.0) if activation == "tanh" and i < len(weights) - 1 else pre
    try:
        AdmissionPrior.from_dict(net_meta.get("prior"))
    except PriorError as exc:
        raise CheckpointError(f"{jpath}: network.prior: {exc}") from exc
    return Checkpoint(meta, MLPNet(weights, activation), spec, cluster, jpath, wpath)


def _is_int(v: Any) -> bool:
    """A JSON integer: not a bool (``True == 1``), not a float (``8.9`` or ``8.0``)."""
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    """A finite JSON number (``json.loads`` accepts ``NaN`` / ``Infinity``), not a bool."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:  # an int beyond float range
        return False


def _cluster_from_dict(d: Mapping, where: Path) -> ClusterSpec:
    """The training cluster of the metadata, every field type-checked (no ``int(8.9)`` truncation,
    no ``NaN`` bandwidths): :class:`CheckpointError` naming the field otherwise."""
    from policies.cluster import ClusterSpecError, NodeSpec

    nodes = d.get("nodes")
    if not isinstance(nodes, list) or not nodes:
        raise CheckpointError(f"{where}: metadata field 'cluster.nodes' must be a non-empty list, got {nodes!r}")
    specs = []
    for i, n in enumerate(nodes):
        if not isinstance(n, dict):
            raise CheckpointError(f"{where}: metadata field 'cluster.nodes[{i}]' must be an object, got {n!r}")
        name, gpus = n.get("name"), n.get("gpus")
        if not isinstance(name, str) or not name:
            raise CheckpointError(f"{where}: metadata field 'cluster.nodes[{i}].name' must be a non-empty string, got {name!r}")
        if not _is_int(gpus) or gpus < 1:
            raise CheckpointError(f"{where}: metadata field 'cluster.nodes[{i}].gpus' must be a positive integer, got {gpus!r}")
        specs.append(NodeSpec(name, gpus))
    bw = {}
    for key, default in (("intra_bw_gbps", 16.0), ("inter_bw_gbps", 5.0)):
        v = d.get(key, default)
        if not _is_number(v) or v <= 0:
            raise CheckpointError(f"{where}: metadata field 'cluster.{key}' must be a finite number > 0, got {v!r}")
        bw[key] = float(v)
    try:
        return ClusterSpec(tuple(specs), **bw)
    except ClusterSpecError as exc:
        raise CheckpointError(f"{where}: bad cluster metadata: {exc}") from exc


def _check_training(tr: Mapping, where: Path) -> None:
    """The parts of the free-form ``training`` section that code reads with a fixed type
    (``rlsched checkpoint``'s summary, ``rlsched train --resume``): ``timesteps`` a non-negative
    integer, ``config`` and ``source`` objects (or null), ``config.traces`` / ``config.val_traces``
    lists of strings (or null). Anything else in it is kept as is."""
    ts = tr.get("timesteps")
    if ts is not None and (not _is_int(ts) or ts < 0):
        raise CheckpointError(f"{where}: metadata field 'training.timesteps' must be a non-negative integer, got {ts!r}")
    for key in ("config", "source"):
        v = tr.get(key)
        if v is not None and not isinstance(v, dict):
            raise CheckpointError(f"{where}: metadata field 'training.{key}' must be an object or null, got {v!r}")
    cfg = tr.get("config") or {}
    for key in ("traces", "val_traces"):
        v = cfg.get(key)
        if v is not None and not (isinstance(v, list) and all(isinstance(x, str) for x in v)):
            raise CheckpointError(
                f"{where}: metadata field 'training.config.{key}' must be a list of paths (strings) or null, got {v!r}"
            )


def save_checkpoint(
    path: str | Path,
    tensors: Mapping[str, np.ndarray],
    *,
    algo: str,
    mode: str,
    cluster: ClusterSpec,
    spec: ObsSpec,
    layers: list[str],
    activation: str,
    reward: Mapping[str, Any],
    training: Mapping[str, Any],
    prior: AdmissionPrior | None = None,
) -> Path:
    """Write ``NAME.safetensors`` + ``NAME.json`` atomically; returns the JSON path.

    ``tensors`` may hold more than the inference layers (e.g. the value head,
    used to resume training); only ``layers`` are read at inference.
    """
    from safetensors.numpy import save as st_save

    from rlsched import __version__

    if algo not in ALGOS:
        raise ValueError(f"unknown algo {algo!r}")
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}")
    jpath, _ = resolve_paths(path)
    jpath.parent.mkdir(parents=True, exist_ok=True)
    wpath = jpath.with_suffix(".safetensors")
    data = st_save({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in tensors.items()})
    meta = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "project_version": __version__,
        "algo": algo,
        "mode": mode,
        "cluster": cluster.to_dict(),
        "cluster_shape": cluster.describe(),
        "obs_spec": spec.to_dict(),
        "network": {
            "kind": "mlp",
            "layers": list(layers),
            "activation": activation,
            **({"prior": prior.to_dict()} if prior is not None else {}),
        },
        "reward": dict(reward),
        "training": dict(training),
        "weights_file": wpath.name,
        "weights_sha256": hashlib.sha256(data).hexdigest(),
    }
    for target, payload in (
        (wpath, data),
        (jpath, (json.dumps(meta, indent=2, default=_json_default) + "\n").encode()),
    ):
        write_atomic(target, payload)
    return jpath


def write_atomic(path: Path, payload: bytes) -> None:
    """Write ``payload`` to ``path`` via a temp file + rename: never half-written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        f = float(o)
        return f if math.isfinite(f) else None
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
