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
    codec             name of the observation / action codec (:mod:`policies.codecs`; optional,
                      default "deepshare-v1")
    obs_spec          the codec's spec, ``spec.to_dict()``; for deepshare-v1 ObsSpec.to_dict()
                      (shape, K, levels, encoding version, candidate order and aging_s:
                      optional, default "area" / 1800)
    network           {"kind": "mlp", "layers": [prefix, ...], "activation": "tanh"|"relu",
                       "prior": {"kind": "admission", "theta": float, "scale": float} (optional)}
                      layer i computes act(x @ W_i.T + b_i) from tensors
                      "<prefix>.weight" / "<prefix>.bias"; the last has no activation
                      and outputs one logit (or Q-value) per action
    reward            {"kind": "jct-rel"|"jct"|"progress"|"seed", "w1": float, "w2": float}
    training          free-form: traces, timesteps, seed, command, evaluation (optional content)
    weights_file      bare file name of the weights in the JSON's directory:
                      NAME.safetensors (NAME.<16 hex>.safetensors after an
                      interrupted save)
    weights_sha256    hex sha256 of the weights file

:func:`load_checkpoint` checks everything (files present, JSON well formed,
the weights' size against their safetensors header before their data is read (at most
:data:`MAX_WEIGHTS_BYTES`), their hash while they are read in chunks, tensor shapes chaining from the observation size to the action count)
and raises :class:`CheckpointError` naming the file and the problem. Field
types are checked, not coerced: integers must be JSON integers (not ``8.9``,
not ``true``), numbers finite (``json`` accepts ``NaN`` / ``Infinity``); the
codec must be registered and its spec make sense (deepshare-v1: ``k >= 1``,
``1 <= levels <= 4``, ...; :class:`~policies.codecs.deepshare.ObsSpec`) and ``obs_spec.aging_s`` be in
[:data:`MIN_AGING_S`, :data:`MAX_AGING_S`] = [1, 1e9] s; ``reward.kind`` is
one of :data:`REWARD_KINDS` and ``reward.w1`` / ``w2`` (optional) are in
[0, 1] (:func:`save_checkpoint` refuses the same values before writing); the
``weights_file`` is a bare file name (no ``/``, ``\\``, ``:`` or NUL); the
prior's scale is at most :data:`policies.prior.MAX_SCALE`; the inference
layers are float32 and their outputs provably stay far below float32's limit
for every observation (so the logits can never become ``inf`` / NaN while
scheduling). The ``training`` section is free-form except for the fields code
reads (``timesteps``, ``config``, ``source``, ``config.traces``).
:meth:`Checkpoint.check_cluster` compares the cluster with the training
cluster node by node.

:func:`save_checkpoint` replaces the pair in one atomic step: the weights are
first written as ``NAME.<first 16 hex digits of their sha256>.safetensors``,
renaming a ``NAME.json`` that names them is the commit point, then the weights
are written again as ``NAME.safetensors`` and ``NAME.json`` is renamed once
more to name them (files and directory fsynced); an interrupted save leaves
the old or the new checkpoint loadable, and the next save removes its
leftovers (staged weights, temp files).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from policies.base import PolicyError
from policies.cluster import ClusterSpec
from policies.codecs import DEFAULT_CODEC, Codec, CodecError, CodecSpec, ObsSpec, codec_class, spec_from_dict
from policies.perf import ContentionModel
from policies.prior import AdmissionPrior, PriorError

__all__ = [
    "FORMAT", "MAX_WEIGHTS_BYTES", "Checkpoint", "CheckpointError", "MLPNet", "checkpoint_of_name", "json_path",
    "load_checkpoint", "read_policy_files", "resolve_paths", "save_checkpoint", "write_policy_files",
]

FORMAT = "rlsched-policy"
FORMAT_VERSION = 1
ALGOS = ("maskable-ppo", "ppo", "a2c", "dqn")
MODES = ("rl-base", "rl-hybrid")
#: Reward kinds a training run can record (:data:`trainer.env.REWARDS`; a test checks they agree).
REWARD_KINDS = ("progress", "jct", "jct-rel", "seed")
#: Accepted range of the candidate order's aging time constant (s; :attr:`ObsSpec.aging_s`, shipped
#: 300, legacy 1800). ``exp(-wait / aging_s)`` is finite for any value > 0, but below a second every
#: job that waited at all ages to a key of 0 (the order degenerates to demand, then submit time) and
#: above 1e9 s (~32 years) no job ages: such a value is a typo or a tampered file, refused at load and
#: never written.
MIN_AGING_S = 1.0
MAX_AGING_S = 1e9
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
        self._plans: dict[tuple, Any] = {}  # first-layer plans by codec plan key (first_layer_plan)

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

    def first_layer_plan(self, codec: Any) -> Any:
        """The codec's preparation of this network's first layer for its structured observations
        (``codec.linear_plan``, e.g. :meth:`policies.codecs.deepshare.DeepShareCodec.linear_plan`), cached
        under the codec's ``plan_key``."""
        key = codec.plan_key
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = codec.linear_plan(self.layers[0])
        return plan

    def logits_from_first(self, h: np.ndarray) -> np.ndarray:
        """float32 ``[out_features]`` from the first layer's pre-activation ``h`` (float64 ``[H]``, e.g.
        ``Encoded.first_layer(plan)``, rounded to float32 as :meth:`logits` computes it): the remaining layers.

        Exact algebra on the linear first layer, so it equals :meth:`logits` of the dense observation up to
        float rounding (relative 1e-5; tested).
        """
        return self._hidden(h.astype(np.float32))

    @staticmethod
    def choose(
        z32: np.ndarray, mask: np.ndarray, deterministic: bool = True, rng: np.random.Generator | None = None
    ) -> int:
        """Best valid action of logits ``z32`` (argmax of masked logits; lowest index on ties), or a sample.

        :raises ValueError: no valid action has a usable logit (NaN among them, which argmax would
            return, or ``-inf`` on all of them).
        """
        if deterministic or rng is None:  # float32 -> float64 is exact: the same argmax without converting
            m = np.where(mask, z32, -np.inf)
            i = int(m.argmax())
            if not math.isfinite(m[i]):
                raise ValueError(f"no usable logit: the best valid action {i} has {m[i]}")
            return i
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


@dataclass
class Checkpoint:
    """A loaded checkpoint: metadata, the network and the paths it came from."""

    meta: dict[str, Any]
    net: MLPNet
    #: the codec's spec (``obs_spec``)
    spec: CodecSpec
    cluster: ClusterSpec
    json_path: Path
    weights_path: Path
    #: the codec's registry name (``codec``; :data:`~policies.codecs.DEFAULT_CODEC` where the metadata names none)
    codec_name: str = DEFAULT_CODEC

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
        except CodecError as exc:
            raise CheckpointError(f"{self.json_path}: {exc}") from exc

    def make_codec(self, cluster: ClusterSpec, perf: ContentionModel) -> Codec:
        """The checkpoint's codec with its spec, for ``cluster`` (checked as :meth:`check_cluster`)."""
        self.check_cluster(cluster)
        return codec_class(self.codec_name)(cluster, perf, self.spec)


def resolve_paths(path: str | Path) -> tuple[Path, Path | None]:
    """``NAME``, ``NAME.json`` or ``NAME.safetensors`` -> (json path, weights path from the JSON later)."""
    p = Path(path)
    if p.suffix == ".safetensors":
        p = p.with_suffix(".json")
    elif p.suffix != ".json":
        p = p.with_name(p.name + ".json")
    return p, None


def json_path(path: str | Path) -> Path:
    """The checkpoint's JSON path for ``NAME``, ``NAME.json`` or ``NAME.safetensors``."""
    return resolve_paths(path)[0]


def checkpoint_of_name(name: str, base: str) -> Path | None:
    """The checkpoint named in policy name ``base:/path`` (``None`` for plain ``base``; case and spaces
    around ``base`` ignored).

    :raises PolicyError: the name is not ``base`` nor ``base:PATH``, or ``PATH`` is empty.
    """
    head, sep, path = name.strip().partition(":")
    if head.strip().lower() != base:
        raise PolicyError(f"unknown policy {name!r}: expected {base} or {base}:/path/to/checkpoint")
    if sep and not path.strip():
        raise PolicyError(f"policy {name!r}: empty checkpoint path after ':'")
    return Path(path.strip()) if sep else None


def read_policy_files(path: str | Path, *, fmt: str, version: int, label: str) -> tuple[dict, dict, Path, Path]:
    """The metadata and tensors of a learned-policy checkpoint of any family (``NAME.json`` beside the
    safetensors weights it names), the checks every family shares done once:

    * the JSON (``NAME``, ``NAME.json`` or ``NAME.safetensors`` given) is at most :data:`_MAX_JSON` bytes, an
      object with ``format == fmt`` and ``format_version == version``;
    * ``weights_file`` is a plain file name in the JSON's directory;
    * the weights' size is checked against their safetensors header before the data is read, and their
      sha256, computed while reading, must equal ``weights_sha256`` (:func:`_read_weights`).

    The family then checks its own fields (codec, spec, tensor names and shapes). Never unpickles.

    :param label: the family's name in messages (``sced2``, ``rl-sf``, ...).
    :returns: ``(metadata, {name: numpy array}, json path, weights path)``.
    :raises CheckpointError: one line naming the file and the problem.
    """
    jpath, _ = resolve_paths(path)
    raw = _read_json_bytes(jpath)
    try:
        meta = json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise CheckpointError(f"{jpath}: unreadable {label} checkpoint metadata: {exc}") from None
    if not isinstance(meta, dict) or meta.get("format") != fmt:
        got = meta.get("format") if isinstance(meta, dict) else None
        raise CheckpointError(f"{jpath}: not a {label} checkpoint (format={got!r}, expected {fmt!r})")
    fv = meta.get("format_version")
    if fv != version or isinstance(fv, bool):
        raise CheckpointError(f"{jpath}: unsupported format_version {fv!r} (expected {version})")
    wname = meta.get("weights_file")
    problem = _weights_name_problem(wname) if isinstance(wname, str) else f"weights_file must be a string, got {wname!r}"
    if problem:
        raise CheckpointError(f"{jpath}: {problem}")
    wpath = jpath.with_name(wname)
    try:
        data, digest = _read_weights(wpath)
    except FileNotFoundError:
        raise CheckpointError(f"{wpath}: {label} weights file not found") from None
    except OSError as exc:
        raise CheckpointError(f"{wpath}: cannot read the {label} weights: {exc.strerror or exc}") from None
    if digest != str(meta.get("weights_sha256", "")).lower():
        raise CheckpointError(f"{wpath}: sha256 does not match the metadata; the weights are truncated or were modified")
    from safetensors import SafetensorError
    from safetensors.numpy import load as st_load

    try:
        tensors = st_load(data)
    except (SafetensorError, ValueError, OSError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{wpath}: not a readable safetensors file: {exc}") from None
    return meta, tensors, jpath, wpath


def _refuse_constant(name: str) -> Any:
    """``json.loads`` hook: NaN / Infinity are not JSON."""
    raise ValueError(f"{name} is not a JSON value")


def write_policy_files(path: str | Path, tensors: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> Path:
    """Write a learned-policy checkpoint of any family: ``NAME.safetensors`` (``tensors`` as float32) and
    ``NAME.json`` (``meta`` plus ``weights_file`` and ``weights_sha256``), each atomically, weights first;
    returns the JSON path (:func:`read_policy_files` reads it back)."""
    from safetensors.numpy import save as st_save

    jpath, _ = resolve_paths(path)
    data = st_save({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in tensors.items()})
    wpath = jpath.with_suffix(".safetensors")
    doc = {**meta, "weights_file": wpath.name, "weights_sha256": hashlib.sha256(data).hexdigest()}
    write_atomic(wpath, data)
    write_atomic(jpath, (json.dumps(doc, indent=2, default=_json_default) + "\n").encode())
    return jpath


#: Largest weights file accepted (bytes): 256 MiB. The shipped networks hold about 40 kB; a policy MLP
#: that this scheduler evaluates per decision on a CPU is far below this.
MAX_WEIGHTS_BYTES = 256 * 2**20
#: Largest safetensors header (bytes) accepted, as the ``safetensors`` library limits it (100 MB).
_MAX_HEADER = 100_000_000
#: Bytes read per step while hashing the weights.
_CHUNK = 1 << 20


def _weights_size_problem(f: Any, size: int) -> str | None:
    """Why the open safetensors file ``f`` of ``size`` bytes (``stat``) cannot be the weights, found from its
    header alone (the first ``8 + N`` bytes): over :data:`MAX_WEIGHTS_BYTES`, a header that is not a JSON object
    of tensors with ``data_offsets``, or a size other than ``8 + N + (the largest data offset)``, which is what a
    safetensors file of those tensors measures. ``None``: the size matches the header."""
    if size > MAX_WEIGHTS_BYTES:
        return f"{size:,} bytes is over the {MAX_WEIGHTS_BYTES:,}-byte limit for policy weights"
    head = f.read(8)
    if len(head) < 8:
        return f"{size} bytes is too short for a safetensors file (an 8-byte header length comes first)"
    n = int.from_bytes(head, "little")
    if n > min(_MAX_HEADER, size - 8):
        return f"its header length {n:,} does not fit the file's {size:,} bytes"
    try:
        header = json.loads(f.read(n).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return "its header is not JSON"
    if not isinstance(header, dict):
        return "its header is not a JSON object"
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(x) and x >= 0 for x in offsets)):
            return f"tensor {name!r} has no valid data_offsets in the header"
        end = max(end, offsets[1])
    if 8 + n + end != size:
        return (f"the header describes {8 + n + end:,} bytes (8 + {n:,} header + {end:,} data) but the file has "
                f"{size:,}; the weights are truncated or were modified")
    return None


def _read_weights(path: Path) -> tuple[bytes, str]:
    """The weights file's bytes and their sha256 (hex), read once (the bytes hashed are the bytes parsed).

    The size is checked against the safetensors header before the data is read
    (:func:`_weights_size_problem`), so a huge or padded file is refused after reading its header only;
    the data is then read and hashed in :data:`_CHUNK` steps, never beyond the size the header gives.

    :raises CheckpointError: the size does not match the header, or the file changed size while read.
    :raises OSError: the file cannot be read (``FileNotFoundError``: it is gone).
    """
    with path.open("rb") as f:
        size = os.fstat(f.fileno()).st_size
        problem = _weights_size_problem(f, size)
        if problem:
            raise CheckpointError(f"{path}: not a usable safetensors weights file: {problem}")
        f.seek(0)
        buf = bytearray(size)
        view = memoryview(buf)
        digest = hashlib.sha256()
        done = 0
        while done < size:
            got = f.readinto(view[done : min(size, done + _CHUNK)])
            if not got:
                break
            digest.update(view[done : done + got])
            done += got
        if done != size or f.read(1):
            raise CheckpointError(f"{path}: the weights file changed size while it was read ({size:,} bytes at start)")
    return bytes(buf), digest.hexdigest()


def _require(meta: Mapping, key: str, typ: type | tuple, where: Path) -> Any:
    if key not in meta:
        raise CheckpointError(f"{where}: metadata field {key!r} is missing")
    v = meta[key]
    if not isinstance(v, typ):
        raise CheckpointError(f"{where}: metadata field {key!r} has type {type(v).__name__}")
    return v


class _StaleWeights(CheckpointError):
    """The weights named by the metadata are gone or do not match its hash: maybe a concurrent
    :func:`save_checkpoint` replaced the checkpoint between reading the metadata and the weights."""

    def __init__(self, message: str, raw: bytes) -> None:
        super().__init__(message)
        self.raw = raw  # the metadata bytes this attempt read


#: Attempts of :func:`load_checkpoint` when a save replaces the checkpoint while it reads.
_LOAD_TRIES = 3


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Load and fully validate a checkpoint (see module docstring). Never unpickles.

    A checkpoint that :func:`save_checkpoint` replaces while it is read loads as before or as
    after the save, never as a mix: the weights are read once (the bytes hashed are the bytes
    parsed), and when they are gone or do not match the metadata's hash while the metadata has
    changed since it was read, it is read again.
    """
    jpath, _ = resolve_paths(path)
    for attempt in range(_LOAD_TRIES):
        try:
            return _load(jpath)
        except _StaleWeights as exc:
            try:
                changed = _read_json_bytes(jpath) != exc.raw
            except CheckpointError:
                changed = True  # replaced right now: another attempt reports what is there
            if not changed or attempt == _LOAD_TRIES - 1:
                raise CheckpointError(str(exc)) from None
    raise AssertionError("unreachable")


def _read_json_bytes(jpath: Path) -> bytes:
    """The metadata file's bytes (at most :data:`_MAX_JSON`), or :class:`CheckpointError`."""
    if not jpath.is_file():
        raise CheckpointError(f"{jpath}: checkpoint metadata not found (expected NAME.json beside NAME.safetensors)")
    try:
        with jpath.open("rb") as f:
            raw = f.read(_MAX_JSON + 1)
    except OSError as exc:
        raise CheckpointError(f"{jpath}: cannot read the checkpoint metadata: {exc}") from None
    if len(raw) > _MAX_JSON:
        raise CheckpointError(f"{jpath}: metadata is larger than {_MAX_JSON} bytes")
    return raw


def _weights_name_problem(wname: str) -> str | None:
    """Why ``wname`` cannot be a ``weights_file``: it must be a bare file name, so that the weights lie in the
    JSON's own directory (no ``../x``, no absolute path, no drive (``C:x``), no NUL); ``None`` if it can."""
    if (
        not wname
        or wname in (".", "..")
        or any(c in wname for c in ("/", "\\", ":", "\0"))
        or Path(wname).name != wname
    ):
        return f"weights_file must be a plain file name in the metadata's directory, got {wname!r}"
    return None


def _range_problem(spec: CodecSpec, reward: Mapping) -> str | None:
    """Metadata values of the right type but out of the range any rlsched run writes (``None``: all in range).
    The candidate order (``obs_spec.order``) and the prior's ``theta`` / ``scale`` are range-checked where they
    are built (:class:`~policies.codecs.deepshare.ObsSpec`, :class:`AdmissionPrior`)."""
    if isinstance(spec, ObsSpec) and not MIN_AGING_S <= spec.aging_s <= MAX_AGING_S:
        return (
            f"metadata field 'obs_spec.aging_s' must be in [{MIN_AGING_S:g}, {MAX_AGING_S:g}] seconds, "
            f"got {spec.aging_s:g}"
        )
    kind = reward.get("kind")
    if not isinstance(kind, str) or kind not in REWARD_KINDS:
        return f"metadata field 'reward.kind' must be one of {', '.join(REWARD_KINDS)}, got {kind!r}"
    for key in ("w1", "w2"):  # optional (w1 weighs the seed reward; w2 = 1 - w1)
        if key in reward and not (_is_number(reward[key]) and 0 <= reward[key] <= 1):
            return f"metadata field 'reward.{key}' must be a number in [0, 1], got {reward[key]!r}"
    return None


def _load(jpath: Path) -> Checkpoint:
    """One attempt of :func:`load_checkpoint`; :class:`_StaleWeights` where a concurrent save may explain the error."""
    from safetensors import SafetensorError
    from safetensors.numpy import load as st_load

    raw = _read_json_bytes(jpath)
    try:
        meta = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
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
    reward = _require(meta, "reward", dict, jpath)
    _check_training(_require(meta, "training", dict, jpath), jpath)
    cluster = _cluster_from_dict(_require(meta, "cluster", dict, jpath), jpath)
    codec = meta.get("codec", DEFAULT_CODEC)
    if not isinstance(codec, str):
        raise CheckpointError(f"{jpath}: metadata field 'codec' must be a codec name (a string), got {codec!r}")
    try:
        codec_class(codec)
    except CodecError as exc:
        raise CheckpointError(f"{jpath}: {exc}") from None
    spec_meta = _require(meta, "obs_spec", dict, jpath)
    try:
        spec = spec_from_dict(codec, spec_meta)
        spec.check_cluster(cluster)
    except (CodecError, ValueError, KeyError, TypeError, OverflowError) as exc:
        raise CheckpointError(f"{jpath}: bad obs_spec metadata: {exc}") from exc
    problem = _range_problem(spec, reward)
    if problem:
        raise CheckpointError(f"{jpath}: {problem}")
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
    problem = _weights_name_problem(wname)
    if problem:
        raise CheckpointError(f"{jpath}: {problem}")
    wpath = jpath.with_name(wname)
    want = _require(meta, "weights_sha256", str, jpath).lower()
    if not wpath.is_file():
        raise _StaleWeights(f"{wpath}: checkpoint weights not found (named by {jpath}'s weights_file)", raw)
    try:
        data, got = _read_weights(wpath)
    except FileNotFoundError:
        raise _StaleWeights(f"{wpath}: checkpoint weights not found (named by {jpath}'s weights_file)", raw) from None
    except CheckpointError as exc:
        raise _StaleWeights(str(exc), raw) from None
    except OSError as exc:
        raise CheckpointError(f"{wpath}: cannot read the checkpoint weights: {exc}") from None
    if got != want:
        raise _StaleWeights(
            f"{wpath}: sha256 {got[:16]}... does not match the metadata's {want[:16]}...; "
            "the weights are truncated or were modified",
            raw,
        )
    try:
        tensors = st_load(data)
    except (SafetensorError, ValueError, OSError, KeyError, TypeError) as exc:  # KeyError: a dtype numpy lacks (BF16)
        raise CheckpointError(f"{wpath}: not a readable safetensors file: {exc}") from exc
    weights = check_tensors(tensors, layers, spec, activation, str(wpath), "the weights are corrupt or were modified")
    try:
        AdmissionPrior.from_dict(net_meta.get("prior"))
    except PriorError as exc:
        raise CheckpointError(f"{jpath}: network.prior: {exc}") from exc
    return Checkpoint(meta, MLPNet(weights, activation), spec, cluster, jpath, wpath, codec)


def check_tensors(
    tensors: Mapping[str, np.ndarray], layers: Sequence[str], spec: CodecSpec, activation: str, where: str, why: str
) -> list[tuple[np.ndarray, np.ndarray]]:
    """The inference layers ``layers`` of ``tensors``, checked as :func:`load_checkpoint` needs them: present,
    float32, shapes chaining from the observation to the action space, every tensor of the file finite
    (value heads and DQN target networks too: they are loaded to resume or ``--init`` from), and no layer
    able to overflow float32 (a bound over all inputs in [-1, 1], in float64: finite weights like 1e37 x 64
    hidden units would give inf / NaN logits mid-simulation).

    :param where: what the messages name (the weights file; ``save_checkpoint``: the checkpoint to save).
    :param why: appended to the overflow message (how such weights came about).
    :raises CheckpointError: naming ``where``, the tensor and what is wrong.
    """
    weights = []
    n_in = math.prod(spec.shape)  # exact (np.prod would wrap around for absurd fields)
    for prefix in layers:
        W, b = tensors.get(prefix + ".weight"), tensors.get(prefix + ".bias")
        if W is None or b is None:
            raise CheckpointError(f"{where}: tensors {prefix}.weight / {prefix}.bias missing")
        if W.ndim != 2 or b.shape != (W.shape[0],) or W.shape[1] != n_in or W.shape[0] == 0:
            raise CheckpointError(
                f"{where}: layer {prefix} has shape {tuple(W.shape)} / {tuple(b.shape)}, "
                f"expected (*, {n_in}) with matching bias and at least one output"
            )
        if W.dtype != np.float32 or b.dtype != np.float32:  # save_checkpoint writes float32 only
            raise CheckpointError(f"{where}: layer {prefix} is {W.dtype} / {b.dtype}, expected float32")
        weights.append((W, b))
        n_in = W.shape[0]
    if n_in != spec.n_actions:
        raise CheckpointError(f"{where}: network outputs {n_in} values but the action space has {spec.n_actions}")
    inference = {f"{p}.{x}" for p in layers for x in ("weight", "bias")}
    for name, t in tensors.items():
        if t.dtype.kind in "fc" and not np.isfinite(t).all():
            what = f"layer {name.rsplit('.', 1)[0]}" if name in inference else f"tensor {name}"
            raise CheckpointError(f"{where}: {what} holds non-finite values")
    bound = np.ones(math.prod(spec.shape), dtype=np.float64)
    for i, ((W, b), prefix) in enumerate(zip(weights, layers)):
        pre = np.abs(W.astype(np.float64)) @ bound + np.abs(b.astype(np.float64))
        worst = float(pre.max())
        if not worst <= _MAX_PREACT:
            raise CheckpointError(
                f"{where}: layer {prefix} can output values of magnitude {worst:.3g}, above the {_MAX_PREACT:g} "
                f"that keeps float32 logits finite with margin; {why}"
            )
        bound = np.minimum(pre, 1.0) if activation == "tanh" and i < len(weights) - 1 else pre
    return weights


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
    spec: CodecSpec,
    layers: list[str],
    activation: str,
    reward: Mapping[str, Any],
    training: Mapping[str, Any],
    prior: AdmissionPrior | None = None,
    codec: str = DEFAULT_CODEC,
) -> Path:
    """Write ``NAME.safetensors`` + ``NAME.json``, replacing a previous checkpoint ``NAME`` in one atomic step;
    returns the JSON path.

    ``tensors`` may hold more than the inference layers (e.g. the value head,
    used to resume training); only ``layers`` are read at inference.

    The pair is consistent at every instant, whatever interrupts the save (Ctrl-C, SIGKILL, OOM, power
    loss): the new weights are first written under a name no checkpoint uses yet,
    ``NAME.<first 16 hex digits of their sha256>.safetensors``; replacing ``NAME.json`` with metadata
    naming them is the commit (before it the previous checkpoint loads, intact; after it the new one).
    Then the weights are written again as ``NAME.safetensors`` and ``NAME.json`` is replaced once more
    to name that file (the same hash, so each state in between loads the same new checkpoint), and the
    staged file is deleted: a completed save leaves the stable names. Every file is fsynced before
    the rename that publishes it. An interrupted save leaves at most the staged weights and temp
    files, which the next save of ``NAME`` deletes (:func:`_remove_leftovers`).

    :param codec: the registry name of the observation / action codec whose spec ``spec`` is.
    :raises ValueError: an unknown ``algo`` / ``mode`` / ``codec``, a ``spec`` not of that codec, metadata
        out of the range
        :func:`load_checkpoint` accepts (e.g. ``spec.aging_s`` outside
        [:data:`MIN_AGING_S`, :data:`MAX_AGING_S`]), or a tensor with NaN / inf (it would not
        load); nothing is written then.
    """
    from safetensors.numpy import save as st_save

    from rlsched import __version__

    if algo not in ALGOS:
        raise ValueError(f"unknown algo {algo!r}")
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}")
    if spec_from_dict(codec, spec.to_dict()) != spec:  # a CodecError (a ValueError) for an unknown codec
        raise ValueError(f"{spec!r} is not a spec of codec {codec!r} (it does not load back as itself)")
    problem = _range_problem(spec, reward)
    if problem:
        raise ValueError(problem)
    jpath, _ = resolve_paths(path)
    arrays = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in tensors.items()}
    # what load_checkpoint would refuse is not written (a CheckpointError, a ValueError)
    check_tensors(arrays, layers, spec, activation, f"{jpath}: not saved", "the network diverged")
    jpath.parent.mkdir(parents=True, exist_ok=True)
    wpath = jpath.with_suffix(".safetensors")
    data = st_save(arrays)
    sha = hashlib.sha256(data).hexdigest()
    staged = jpath.with_name(f"{_stem(jpath)}.{sha[:16]}.safetensors")
    meta = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "project_version": __version__,
        "algo": algo,
        "mode": mode,
        "cluster": cluster.to_dict(),
        "cluster_shape": cluster.describe(),
        "codec": codec,
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
        "weights_sha256": sha,
    }

    def metadata(weights_file: str) -> bytes:
        return (json.dumps({**meta, "weights_file": weights_file}, indent=2, default=_json_default) + "\n").encode()

    final = metadata(wpath.name)  # serialised before any write: a value json cannot write fails here
    write_atomic(staged, data)  # 1. the new weights, under a name the current NAME.json does not use
    write_atomic(jpath, metadata(staged.name))  # 2. the commit: NAME.json now names them
    write_atomic(wpath, data)  # 3. the same weights under the stable name (NAME.json still names the staged file)
    write_atomic(jpath, final)  # 4. NAME.json names the stable file (same hash)
    _remove_leftovers(jpath)  # 5. the staged file, and what interrupted saves left
    return jpath


def _stem(jpath: Path) -> str:
    """``NAME`` of ``NAME.json``."""
    return jpath.name[: -len(".json")] if jpath.name.endswith(".json") else jpath.stem


def _remove_leftovers(jpath: Path) -> None:
    """Delete the files of checkpoint ``NAME`` (``jpath`` = ``NAME.json``) that its metadata does not name:
    staged weights ``NAME.<16 hex>.safetensors`` and :func:`write_atomic`'s temp files of ``NAME.json``,
    ``NAME.safetensors`` and staged weights, as an interrupted :func:`save_checkpoint` leaves them.

    Only these exact name patterns: another checkpoint's files (``NAME.v2.safetensors``, or weights
    that ``NAME.json`` names but another checkpoint owns) are never touched, nor is a staged-looking
    file that is a checkpoint's own plain weights (``NAME.<16 hex>.json`` beside it). Best effort: a file
    that cannot be deleted stays (it is harmless; the next save tries again).
    """
    name = re.escape(_stem(jpath))
    staged = re.compile(name + r"\.([0-9a-f]{16})\.safetensors")
    temp = re.compile(r"\." + name + r"\.(?:json|safetensors|([0-9a-f]{16})\.safetensors)\.[a-z0-9_]{8}")
    try:
        referenced = json.loads(jpath.read_bytes()).get("weights_file")
    except (OSError, ValueError, AttributeError):
        return  # no readable metadata: nothing can be told apart from its weights
    try:
        entries = list(os.scandir(jpath.parent))
    except OSError:
        return
    for entry in entries:
        m = staged.fullmatch(entry.name) or temp.fullmatch(entry.name)
        if m is None or entry.name == referenced:
            continue
        if m.group(1) and jpath.with_name(f"{_stem(jpath)}.{m.group(1)}.json").exists():
            continue  # the plain weights of a checkpoint named NAME.<16 hex>
        try:
            os.unlink(entry.path)
        except OSError:
            pass


def write_atomic(path: Path, payload: bytes) -> None:
    """Write ``payload`` to ``path`` via a temp file + rename: never half-written.

    The temp file is fsynced before the rename and the directory after it, so that once this
    returns the new contents survive a crash or power loss (a rename can reach the disk before the
    data it publishes otherwise, leaving an empty file).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable (POSIX; a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        f = float(o)
        return f if math.isfinite(f) else None
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
