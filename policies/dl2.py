"""DL2 (seed 000): a policy network that decides, every scheduling slot, how many workers and parameter
servers each elastic job gets, one increment per inference.

**State** (:class:`DL2Spec`, :func:`encode`): the first ``J`` jobs of a batch, in arrival order
(``submit_time``, then ``job_id``), each a row of ``L + 5`` numbers, flattened to ``J * (L + 5)``
(rows of absent jobs are 0):

* ``L`` numbers: the one-hot job type (:data:`JOB_TYPES`: DL2's eight PS models, then the platform's
  all-reduce models);
* slots run: seconds since submission / ``slot_s``, times ``scales["slots"]``;
* remaining epochs: remaining work / the model's epoch size (:data:`policies.psmodel.EPOCH_SIZE`; for
  an all-reduce model, 100 x the fraction of its work left), transformed by ``DL2Spec.remaining``
  (:data:`REMAINING`: ``linear``, the seed's, the epochs themselves; ``log1p``, ours, ``ln(1 + epochs)``),
  times ``scales["epochs"]``;
* dominant share allocated this slot: the largest of (GPUs, CPUs, memory) of the ``w`` workers and
  ``p`` PSs decided so far in this slot, each over the cluster's total;
* workers and PSs decided so far in this slot, transformed by ``DL2Spec.counts`` (``linear``, the seed's:
  the counts; ``log1p``, ours: ``ln(1 + count)``), times ``scales["tasks"]`` each.

The ``rows`` layout (``DL2Spec.arch``, for :class:`DL2RowsNet`) appends :data:`GLOBALS` to the
flattened rows: the fraction of the cluster's GPUs, CPUs and memory the slot has not given out yet
(``J * (L + 5) + 3`` numbers); ``flat``, the seed's, has none.

**Action** (``3J + 1``): ``3i`` one more worker to job ``i``, ``3i + 1`` one more PS, ``3i + 2`` one of
each, ``3J`` stop. :func:`action_mask` marks what is feasible: a job row that exists, at most its
``max_gpus`` workers and :data:`policies.psmodel.MAX_PS` PSs, no PS for a job without PSs, and the
increment fits the cluster's aggregate free GPUs / CPUs / memory. Stop is feasible once some job of
the slot has a runnable allocation (at least its minimum workers, and a PS if it is a PS job), or when
nothing else is: a slot never leaves every job waiting while it could start one (without this rule an
untrained or unlucky actor can stop at once and idle the cluster forever).

**A slot** (:class:`DL2Policy`, every ``slot_s`` seconds, 600 by default, the baselines' interval):
every job in the system starts the slot at 0 workers and 0 PSs (DL2 decides each job anew each slot);
the jobs are taken in batches of ``J`` in arrival order (the seed's section 6.5); within a batch the
actor (numpy: the seed's MLP over the flattened state, :class:`DL2Net`, or the per-row scorer,
:class:`DL2RowsNet`; softmax output) is run repeatedly, each time taking its most
likely feasible action (:meth:`DL2Policy.choose`; training overrides it to sample and explore), until
it says stop or nothing but stop is feasible. The counts are then laid onto nodes as the elastic
baselines lay theirs (:func:`policies.elastic.materialize`: shrinking resizes, growing ones, new jobs
at their submitted size; a job planned below its minimum waits).

**Experience** (:attr:`DL2Policy.record`, :meth:`DL2Policy.take_experience`): with ``record`` on, the
policy keeps each slot's inferences (state, mask, action) and, when the next slot starts, closes the slot
into a :class:`Transition` with DL2's reward (:func:`slot_reward`: the work each job of the slot's start
did until the next slot's start, over its total, summed; from the snapshots the policy is given, so live
it is what the controller observes) and the next slot's first state. What the live controller records
for ``rlsched train --online``, and what training replays.

**Checkpoint**: ``NAME.safetensors`` (``actor.{k}.weight`` ``(out, in)`` / ``actor.{k}.bias``, float32,
for ``flat``; ``actor.row.{k}`` and ``actor.stop.{k}`` for ``rows``; an optional critic is ignored here)
+ ``NAME.json`` (:data:`FORMAT`, the spec: ``J``, job types, feature names, scales, slot, action layout,
``arch`` (absent: ``flat``), ``remaining`` / ``counts`` (absent: ``linear``); the weights' sha256; ``actor_layers`` or ``row_layers`` / ``stop_layers``). :func:`load_dl2` checks all of it
and never unpickles.

Pure: a frozen snapshot in, a :class:`~policies.state.Decision` out; reads only its checkpoint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from policies.elastic import _EPS, DEFAULT_INTERVAL_S, ElasticBaseline, PlanJob, add_use, dominant_share, fits_capacity
from policies.psmodel import EPOCH_SIZE, MAX_PS, PS_MODELS
from policies.state import ClusterState
from policies.workloads import MODELS

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "JOB_TYPES",
    "FEATURES",
    "DL2Spec",
    "ARCHES",
    "REMAINING",
    "REMAINING_SCALE",
    "COUNTS",
    "COUNTS_SCALE",
    "GLOBALS",
    "DL2Net",
    "DL2RowsNet",
    "make_net",
    "rows_inputs",
    "rows_context",
    "rows_ranks",
    "free_fractions",
    "DL2Policy",
    "Transition",
    "SlotBatch",
    "encode",
    "remaining_feature",
    "count_feature",
    "action_mask",
    "apply_action",
    "slot_reward",
    "save_dl2",
    "load_dl2",
    "load_dl2_critic",
    "shipped_dl2",
    "make_dl2_policy",
]

FORMAT = "rlsched-dl2"
FORMAT_VERSION = 1
#: Job types of the one-hot encoding: DL2's PS models, then the all-reduce models.
JOB_TYPES: tuple[str, ...] = (*PS_MODELS, *(m for m in MODELS if m not in PS_MODELS))
#: Per-job features after the one-hot type.
FEATURES = ("slots_run", "remaining_epochs", "dominant_share", "workers", "ps")
#: Actor architectures: ``flat`` (the seed's MLP over the flattened rows) and ``rows`` (one shared-weight
#: scorer per job row with pooled context, :class:`DL2RowsNet`).
ARCHES = ("flat", "rows")
#: Transforms of the remaining-epochs feature (``DL2Spec.remaining``): ``linear`` (the seed's: the epochs) or
#: ``log1p`` (ours: ``ln(1 + epochs)``; the jobs of DL2's validation sequence 2000 submit 88 to 149,000 epochs:
#: 0.88 to 1,490 at the linear scale 0.01, 0.45 to 1.19 at the log scale 0.1).
REMAINING = ("linear", "log1p")
#: The remaining-epochs scale (``scales["epochs"]``) a trainer gives each transform.
REMAINING_SCALE = {"linear": 0.01, "log1p": 0.1}
#: Transforms of the workers / PSs features (``DL2Spec.counts``), as :data:`REMAINING`: ``linear`` (the
#: seed's) or ``log1p`` (ours: ``ln(1 + count)``, 0 to 3.18 for 0 to 23 tasks), and the scale
#: (``scales["tasks"]``) a trainer gives each.
COUNTS = REMAINING
COUNTS_SCALE = {"linear": 0.1, "log1p": 0.3}
#: The state's numbers after the job rows in the ``rows`` layout: the fraction of the cluster's GPUs, CPUs and
#: memory the slot has not yet given out.
GLOBALS = ("free_gpus", "free_cpus", "free_mem")
_CHECKPOINT_DIR = Path(__file__).resolve().parent / "checkpoints"


@dataclass(frozen=True)
class DL2Spec:
    """The state / action layout (module docstring). ``J`` jobs a batch, ``types`` the one-hot order."""

    J: int = 40
    types: tuple[str, ...] = JOB_TYPES
    slot_s: float = DEFAULT_INTERVAL_S
    scales: Mapping[str, float] = field(default_factory=lambda: {"slots": 0.02, "epochs": 0.01, "tasks": 0.1})
    arch: str = "flat"
    remaining: str = "linear"
    counts: str = "linear"

    def __post_init__(self) -> None:
        if self.arch not in ARCHES:
            raise ValueError(f"DL2 spec: arch must be one of {', '.join(ARCHES)}, got {self.arch!r}")
        if self.remaining not in REMAINING:
            raise ValueError(f"DL2 spec: remaining must be one of {', '.join(REMAINING)}, got {self.remaining!r}")
        if self.counts not in COUNTS:
            raise ValueError(f"DL2 spec: counts must be one of {', '.join(COUNTS)}, got {self.counts!r}")
        if isinstance(self.J, bool) or not isinstance(self.J, int) or self.J < 1:
            raise ValueError(f"DL2 spec: J must be an integer >= 1, got {self.J!r}")
        if not self.types or len(set(self.types)) != len(self.types):
            raise ValueError("DL2 spec: types must be distinct model names, at least one")
        if not (isinstance(self.slot_s, (int, float)) and math.isfinite(self.slot_s) and self.slot_s > 0):
            raise ValueError(f"DL2 spec: slot_s must be a positive number of seconds, got {self.slot_s!r}")
        for k in ("slots", "epochs", "tasks"):
            v = self.scales.get(k) if isinstance(self.scales, Mapping) else None
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"DL2 spec: scales[{k!r}] must be a positive number, got {v!r}")

    @property
    def row(self) -> int:
        return len(self.types) + len(FEATURES)

    @property
    def n_globals(self) -> int:
        """Numbers after the job rows: :data:`GLOBALS` in the ``rows`` layout, none in ``flat``."""
        return len(GLOBALS) if self.arch == "rows" else 0

    @property
    def obs_size(self) -> int:
        return self.J * self.row + self.n_globals

    @property
    def n_actions(self) -> int:
        return 3 * self.J + 1

    def to_dict(self) -> dict[str, Any]:
        d = {"J": self.J, "types": list(self.types), "features": list(FEATURES), "slot_s": float(self.slot_s),
             "scales": {k: float(v) for k, v in self.scales.items()}, "obs_size": self.obs_size,
             "n_actions": self.n_actions,
             "actions": "3*i: +1 worker to job i; 3*i+1: +1 PS; 3*i+2: +1 worker and +1 PS; 3*J: stop",
             "arch": self.arch}
        if self.n_globals:
            d["globals"] = list(GLOBALS)
        if self.remaining != "linear":  # absent: linear (every checkpoint written without the field)
            d["remaining"] = self.remaining
        if self.counts != "linear":  # likewise
            d["counts"] = self.counts
        return d

    @classmethod
    def from_dict(cls, d: Any) -> "DL2Spec":
        if not isinstance(d, dict):
            raise ValueError("spec must be an object")
        if list(d.get("features", [])) != list(FEATURES):
            raise ValueError(f"features {d.get('features')!r} are not {list(FEATURES)!r}")
        types = d.get("types")
        if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
            raise ValueError("types must be a list of model names")
        arch = d.get("arch", "flat")
        if arch == "rows" and list(d.get("globals", [])) != list(GLOBALS):
            raise ValueError(f"globals {d.get('globals')!r} are not {list(GLOBALS)!r}")
        spec = cls(J=d.get("J"), types=tuple(types), slot_s=d.get("slot_s"), scales=dict(d.get("scales") or {}),
                   arch=arch, remaining=d.get("remaining", "linear"), counts=d.get("counts", "linear"))
        if d.get("obs_size") != spec.obs_size or d.get("n_actions") != spec.n_actions:
            raise ValueError(f"obs_size / n_actions {d.get('obs_size')!r} / {d.get('n_actions')!r} do not match "
                             f"J={spec.J} and {len(spec.types)} types ({spec.obs_size} / {spec.n_actions})")
        return spec


class DL2Net:
    """The seed's actor (``arch`` ``flat``): a ReLU MLP over the flattened state, ``weights`` =
    ``[(W (out, in), b (out,)), ...]``; :meth:`probs` softmax over the feasible actions."""

    arch = "flat"

    def __init__(self, weights: Sequence[tuple[np.ndarray, np.ndarray]], spec: DL2Spec) -> None:
        self.weights = [(np.asarray(w, np.float32), np.asarray(b, np.float32)) for w, b in weights]
        self.spec = spec
        if spec.arch != "flat":
            raise ValueError(f"a flat actor needs a flat spec, got arch {spec.arch!r}")
        if self.weights[0][0].shape[1] != spec.obs_size or self.weights[-1][0].shape[0] != spec.n_actions:
            raise ValueError(f"actor shape {self.weights[0][0].shape[1]} -> {self.weights[-1][0].shape[0]} does not "
                             f"match the spec ({spec.obs_size} -> {spec.n_actions})")

    @property
    def hidden(self) -> tuple[int, ...]:
        return tuple(w.shape[0] for w, _b in self.weights[:-1])

    def tensors(self) -> dict[str, np.ndarray]:
        """The actor's tensors as the checkpoint names them."""
        return _layer_tensors("actor", self.weights)

    def logits(self, obs: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        """Logits of the ``3J + 1`` actions for ``obs`` ``(..., obs_size)``; ``mask`` is not an input here."""
        return _mlp_forward(self.weights, np.asarray(obs, np.float32))

    def probs(self, obs: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return _softmax(self.logits(obs, mask), mask)


def _mlp_forward(layers: Sequence[tuple[np.ndarray, np.ndarray]], x: np.ndarray) -> np.ndarray:
    for k, (w, b) in enumerate(layers):
        x = x @ w.T + b
        if k < len(layers) - 1:
            np.maximum(x, 0.0, out=x)
    return x


def _softmax(z: np.ndarray, mask: np.ndarray) -> np.ndarray:
    z = np.where(mask, z.astype(np.float64), -np.inf)
    z -= z.max()
    e = np.exp(z)
    return e / e.sum()


def _layer_tensors(prefix: str, layers: Sequence[tuple[np.ndarray, np.ndarray]]) -> dict[str, np.ndarray]:
    out = {}
    for k, (w, b) in enumerate(layers):
        out[f"{prefix}.{k}.weight"] = np.ascontiguousarray(w, np.float32)
        out[f"{prefix}.{k}.bias"] = np.ascontiguousarray(b, np.float32)
    return out


#: Scale of the count of job rows in the pooled context of :class:`DL2RowsNet` (1 / the seed's J = 40).
ROWS_COUNT_SCALE = 0.025


def rows_inputs(spec: DL2Spec) -> tuple[int, int]:
    """``(row input, context)`` widths of :class:`DL2RowsNet` for ``spec``: a row's input is its ``L + 5``
    features and its 3 feasible increments (0 / 1), ``u`` = ``L + 8`` numbers, then the rank of each of
    them among the batch's job rows (:func:`rows_ranks`), then the context; the context is the mean, max
    and min of ``u`` over the batch's job rows, :data:`GLOBALS` and the row count x
    :data:`ROWS_COUNT_SCALE`."""
    u = spec.row + 3
    ctx = 3 * u + len(GLOBALS) + 1
    return 2 * u + ctx, ctx


def rows_ranks(u: np.ndarray, present: np.ndarray) -> np.ndarray:
    """Each row's rank in each column of ``u`` ``(..., J, F)`` among the ``present`` ``(..., J)`` rows: the
    number of present rows with a smaller value over (rows - 1), in [0, 1] (0: the smallest, ties equal),
    float32 ``(..., J, F)``."""
    lt = (u[..., None, :, :] < u[..., :, None, :]) & present[..., None, :, None]
    n = present.sum(-1)[..., None, None].astype(np.float32)
    return (lt.sum(-2).astype(np.float32) / np.maximum(n - 1.0, 1.0)).astype(np.float32)


class DL2RowsNet:
    """The per-row actor (``arch`` ``rows``): one small ReLU MLP (``row``: ``(W (out, in), b)`` layers, input
    :func:`rows_inputs`, output 3) scores each job row of the batch into its +worker / +PS / +both logits,
    from the row's features, its feasible increments (the mask's 3 entries), their ranks among the batch's
    rows (:func:`rows_ranks`: which job has the smallest dominant share, which arrived first) and a context
    pooled over the batch's rows (mean, max, min; :func:`rows_inputs`) with the slot's free capacity
    (:data:`GLOBALS`); a
    second one (``stop``, output 1) gives the stop logit from the context and the mean and max over the
    rows of the row MLP's last hidden layer. The same weights score every row, so the logits are
    permutation-equivariant in the rows and the weights do not depend on ``J``. A row is a job when its
    features or its mask entries are not all 0 (absent rows are all 0)."""

    arch = "rows"

    def __init__(self, row: Sequence[tuple[np.ndarray, np.ndarray]], stop: Sequence[tuple[np.ndarray, np.ndarray]],
                 spec: DL2Spec) -> None:
        self.row = [(np.asarray(w, np.float32), np.asarray(b, np.float32)) for w, b in row]
        self.stop = [(np.asarray(w, np.float32), np.asarray(b, np.float32)) for w, b in stop]
        self.spec = spec
        if spec.arch != "rows":
            raise ValueError(f"a rows actor needs a rows spec, got arch {spec.arch!r}")
        n_in, n_ctx = rows_inputs(spec)
        h = self.row[-1][0].shape[1]
        if self.row[0][0].shape[1] != n_in or self.row[-1][0].shape[0] != 3:
            raise ValueError(f"row scorer {self.row[0][0].shape[1]} -> {self.row[-1][0].shape[0]} does not match the "
                             f"spec ({n_in} -> 3)")
        if len(self.row) < 2 or self.stop[0][0].shape[1] != n_ctx + 2 * h or self.stop[-1][0].shape[0] != 1:
            raise ValueError(f"stop scorer {self.stop[0][0].shape[1]} -> {self.stop[-1][0].shape[0]} does not match "
                             f"the spec ({n_ctx} + 2 x {h} -> 1, with a hidden layer in the row scorer)")

    @property
    def hidden(self) -> tuple[int, ...]:
        return tuple(w.shape[0] for w, _b in self.row[:-1])

    def tensors(self) -> dict[str, np.ndarray]:
        """The actor's tensors as the checkpoint names them."""
        return {**_layer_tensors("actor.row", self.row), **_layer_tensors("actor.stop", self.stop)}

    def logits(self, obs: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Logits of the ``3J + 1`` actions for ``obs`` ``(..., obs_size)`` and ``mask`` ``(..., 3J + 1)``."""
        spec = self.spec
        obs = np.asarray(obs, np.float32)
        lead = obs.shape[:-1]
        x = obs[..., : spec.J * spec.row].reshape(*lead, spec.J, spec.row)
        g = obs[..., spec.J * spec.row :]
        m = np.asarray(mask, bool)[..., : 3 * spec.J].reshape(*lead, spec.J, 3).astype(np.float32)
        u = np.concatenate([x, m], -1)
        present = (u != 0).any(-1)
        ctx, pf, n = rows_context(u, present, g)
        z = np.concatenate([u, rows_ranks(u, present), np.broadcast_to(ctx[..., None, :], (*u.shape[:-1], ctx.shape[-1]))], -1)
        h = _mlp_forward(self.row[:-1], z)
        np.maximum(h, 0.0, out=h)
        w, b = self.row[-1]
        inc = h @ w.T + b
        hm = np.where(pf, h, -np.inf).max(-2)
        hm = np.where(n > 0, hm, 0.0).astype(np.float32)
        hmean = (h * pf).sum(-2) / np.maximum(n, 1.0)
        stop = _mlp_forward(self.stop, np.concatenate([ctx, hm, hmean], -1))
        return np.concatenate([inc.reshape(*lead, 3 * spec.J), stop], -1)

    def probs(self, obs: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return _softmax(self.logits(obs, mask), mask)


def rows_context(u: np.ndarray, present: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:class:`DL2RowsNet`'s context of rows ``u`` ``(..., J, F)`` (``present`` ``(..., J)`` bool) and globals
    ``g`` ``(..., 3)``: ``(context (..., 3F + 4), present as (..., J, 1) float32, row count (..., 1))``; the
    mean / max / min of an empty batch are 0."""
    pf = present[..., None].astype(np.float32)
    n = pf.sum(-2)
    mean = (u * pf).sum(-2) / np.maximum(n, 1.0)
    mx = np.where(n > 0, np.where(pf > 0, u, -np.inf).max(-2), 0.0)
    mn = np.where(n > 0, np.where(pf > 0, u, np.inf).min(-2), 0.0)
    ctx = np.concatenate([mean, mx, mn, g, n * ROWS_COUNT_SCALE], -1).astype(np.float32)
    return ctx, pf, n


def make_net(spec: DL2Spec, layers: Mapping[str, Sequence[tuple[np.ndarray, np.ndarray]]]) -> "DL2Net | DL2RowsNet":
    """The actor of ``spec.arch`` from its layers: ``{"actor": [...]}`` (flat) or ``{"row": [...], "stop":
    [...]}`` (rows)."""
    if spec.arch == "rows":
        return DL2RowsNet(layers["row"], layers["stop"], spec)
    return DL2Net(layers["actor"], spec)


# ---------------------------------------------------------------------- state / action
def _type_index(spec: DL2Spec) -> dict[str, int]:
    return {t: i for i, t in enumerate(spec.types)}


def _remaining_epochs(j: PlanJob) -> float:
    info = j.info
    rem = max(info.total_samples - info.done_samples, 0.0)
    size = EPOCH_SIZE.get(info.model)
    if size:
        return rem / size
    return 100.0 * rem / info.total_samples if info.total_samples > 0 else 0.0


def remaining_feature(j: PlanJob, spec: DL2Spec) -> float:
    """The remaining-epochs feature of ``j`` under ``spec``: the epochs (``linear``) or ``ln(1 + epochs)``
    (``log1p``), times ``scales["epochs"]``."""
    e = _remaining_epochs(j)
    if spec.remaining == "log1p":
        e = math.log1p(e)
    return e * spec.scales["epochs"]


def count_feature(n: int, spec: DL2Spec) -> float:
    """The feature of ``n`` workers or PSs under ``spec``: ``n`` (``linear``) or ``ln(1 + n)`` (``log1p``),
    times ``scales["tasks"]``."""
    return (math.log1p(n) if spec.counts == "log1p" else n) * spec.scales["tasks"]


def free_fractions(used: Sequence[float], cap: Sequence[float]) -> np.ndarray:
    """:data:`GLOBALS`: ``(cap - used) / cap`` per resource (1 for a resource of capacity 0 or infinite),
    float32 ``(3,)``."""
    c = np.asarray(cap, np.float64)
    ok = (c > 0) & (c != math.inf)
    f = np.ones(3, np.float64)
    f[ok] = (c[ok] - np.asarray(used, np.float64)[ok]) / c[ok]
    return f.astype(np.float32)


def encode(batch: Sequence[PlanJob], cap: Sequence[float], now: float, spec: DL2Spec,
           used: Sequence[float] = (0.0, 0.0, 0.0)) -> np.ndarray:
    """The state (module docstring) of ``batch`` (at most ``J`` jobs, arrival order) with their ``w`` /
    ``p`` decided so far this slot, on a cluster of aggregate ``cap`` (GPUs, CPUs, GB) at ``now`` (s);
    shape ``(J * (L + 5),)`` (``flat``) or ``(J * (L + 5) + 3,)`` (``rows``: then :func:`free_fractions`
    of ``used``, the aggregate the slot has given out), float32."""
    L = len(spec.types)
    if spec.n_globals:
        return np.concatenate([encode(batch, cap, now, replace(spec, arch="flat")), free_fractions(used, cap)])
    out = np.zeros((spec.J, spec.row), np.float32)
    ti = _type_index(spec)
    sc = spec.scales
    for i, j in enumerate(batch[: spec.J]):
        k = ti.get(j.info.model)
        if k is not None:
            out[i, k] = 1.0
        out[i, L] = max(now - j.info.submit_time, 0.0) / spec.slot_s * sc["slots"]
        out[i, L + 1] = remaining_feature(j, spec)
        out[i, L + 2] = dominant_share(j.use(j.w, j.p), cap)
        out[i, L + 3] = count_feature(j.w, spec)
        out[i, L + 4] = count_feature(j.p, spec)
    return out.reshape(-1)


def _increment(j: PlanJob, kind: int) -> tuple[int, int] | None:
    """(workers, PSs) that action ``kind`` (0 worker, 1 PS, 2 both) adds to ``j``, or None when it cannot."""
    dw, dp = (1, 0) if kind == 0 else (0, 1) if kind == 1 else (1, 1)
    if dp and not j.ps_job:
        return None
    if j.w + dw > j.hi or j.p + dp > MAX_PS:
        return None
    return dw, dp


def action_mask(batch: Sequence[PlanJob], used: Sequence[float], cap: Sequence[float], spec: DL2Spec,
                allow_stop: bool = True) -> np.ndarray:
    """Feasible actions (module docstring), shape ``(3J + 1,)`` bool; ``used`` is the aggregate
    (GPUs, CPUs, GB) the slot's decisions take so far. Stop is feasible unless ``allow_stop`` is False
    and another action is."""
    m = np.zeros(spec.n_actions, bool)
    for i, j in enumerate(batch[: spec.J]):
        for kind in range(3):
            inc = _increment(j, kind)
            if inc is not None and fits_capacity(used, j.use(*inc), cap):
                m[3 * i + kind] = True
    m[-1] = allow_stop or not m[:-1].any()
    return m


def apply_action(batch: Sequence[PlanJob], used: list[float], action: int, spec: DL2Spec) -> bool:
    """Apply ``action`` to ``batch`` / ``used`` in place; False for stop. ValueError for an action the
    mask forbids structurally (no such job, past its range, a PS to a job without PSs)."""
    if action == spec.n_actions - 1:
        return False
    i, kind = divmod(int(action), 3)
    if not 0 <= i < min(len(batch), spec.J):
        raise ValueError(f"action {action}: no job in row {i}")
    j = batch[i]
    inc = _increment(j, kind)
    if inc is None:
        raise ValueError(f"action {action}: job {j.info.job_id} cannot take it")
    j.w += inc[0]
    j.p += inc[1]
    add_use(used, j.use(*inc))
    return True


class SlotBatch:
    """One batch of a slot in array form: its state (:func:`encode`) and feasible actions
    (:func:`action_mask`), kept up to date after each action by recomputing only what the action changes
    (the acted-on job's row and the capacity fit of every increment), with the same floating-point
    operations as those two functions, so :attr:`obs` and :meth:`mask` equal theirs bit for bit.

    :ivar obs: ``(J * (L + 5),)`` float32, the current state (updated in place: copy it to keep it).
    """

    def __init__(self, batch: Sequence[PlanJob], cap: Sequence[float], now: float, spec: DL2Spec) -> None:
        self.batch = list(batch[: spec.J])
        self.spec = spec
        self.obs = encode(self.batch, cap, now, spec)
        self._rows = self.obs[: spec.J * spec.row].reshape(spec.J, spec.row)
        self._capt = tuple(cap)
        n = len(self.batch)
        self._cap = np.asarray(cap, np.float64)
        self._lim = self._cap + _EPS
        self._share = (self._cap > 0) & (self._cap != math.inf)
        wv = np.array([j.wv for j in self.batch], np.float64).reshape(n, 3)
        pv = np.array([j.pv for j in self.batch], np.float64).reshape(n, 3)
        self._wv, self._pv = wv, pv
        # increment of kind k (0 worker, 1 PS, 2 both) of job i: j.use(*inc) = dw * wv + dp * pv
        self._inc = np.stack([1 * wv + 0 * pv, 0 * wv + 1 * pv, 1 * wv + 1 * pv], axis=1)  # (n, 3, 3)
        self._ok = np.zeros((n, 3), bool)  # structurally feasible (_increment is not None)
        for i in range(n):
            self._structure(i)

    def _structure(self, i: int) -> None:
        j = self.batch[i]
        for kind in range(3):
            self._ok[i, kind] = _increment(j, kind) is not None

    def mask(self, used: Sequence[float], allow_stop: bool = True) -> np.ndarray:
        """:func:`action_mask` of the batch at ``used``."""
        m = np.zeros(self.spec.n_actions, bool)
        n = len(self.batch)
        if n:
            fit = (np.asarray(used, np.float64) + self._inc <= self._lim).all(axis=2)
            m[: 3 * n] = (self._ok & fit).reshape(-1)
        m[-1] = allow_stop or not m[:-1].any()
        return m

    def set_used(self, used: Sequence[float]) -> None:
        """The slot has given out ``used`` (GPUs, CPUs, GB): refresh :data:`GLOBALS` (``rows`` layout)."""
        if self.spec.n_globals:
            self.obs[self.spec.J * self.spec.row :] = free_fractions(used, self._capt)

    def update(self, i: int) -> None:
        """Job ``i``'s ``w`` / ``p`` changed: refresh its row and its feasible increments."""
        j = self.batch[i]
        L = len(self.spec.types)
        v = j.w * self._wv[i] + j.p * self._pv[i]
        shares = v[self._share] / self._cap[self._share]
        self._rows[i, L + 2] = float(shares.max()) if shares.size else 0.0
        self._rows[i, L + 3] = count_feature(j.w, self.spec)
        self._rows[i, L + 4] = count_feature(j.p, self.spec)
        self._structure(i)


def slot_reward(prev: Mapping[str, tuple[float, float]], state: ClusterState) -> float:
    """DL2's reward of the slot that ends at ``state``: the sum over the jobs of ``prev`` (``job_id ->
    (remaining work, total work)`` at the slot's start) of the work done in the slot over the job's total
    (epochs trained / total epochs); a job no longer in ``state`` finished its remaining work."""
    now = {j.job_id: max(j.total_samples - j.done_samples, 0.0) for j in (*state.running, *state.pending)}
    r = 0.0
    for jid, (rem, total) in prev.items():
        if total > 0:
            r += (rem - now.get(jid, 0.0)) / total
    return r


def progress(state: ClusterState) -> dict[str, tuple[float, float]]:
    """``job_id -> (remaining work, total work)`` of every job in ``state`` (:func:`slot_reward`'s ``prev``)."""
    return {j.job_id: (max(j.total_samples - j.done_samples, 0.0), j.total_samples)
            for j in (*state.running, *state.pending)}


# ---------------------------------------------------------------------- the policy
@dataclass(frozen=True)
class Transition:
    """One slot of experience: the ``n`` inferences of the slot that started at ``time`` (s, the
    snapshots' clock) and DL2's reward of the slot, observed at ``end`` (the next slot's start).

    :ivar obs: ``(n, obs_size)`` float32, the state at each inference;
    :ivar mask: ``(n, n_actions)`` bool, the feasible actions there;
    :ivar action: ``(n,)`` int64, the action taken;
    :ivar reward: :func:`slot_reward` of the slot (the same for its ``n`` samples);
    :ivar next_obs: ``(obs_size,)`` float32, the next slot's first state; None when nothing follows (the
        end of a simulated episode).
    """

    time: float
    end: float
    obs: np.ndarray
    mask: np.ndarray
    action: np.ndarray
    reward: float
    next_obs: np.ndarray | None

    def __len__(self) -> int:
        return len(self.action)


class DL2Policy(ElasticBaseline):
    """DL2 (module docstring) with the actor ``net``. ``record``: keep experience
    (:meth:`take_experience`)."""

    name = "dl2"

    def __init__(self, net: "DL2Net | DL2RowsNet", perf=None, checkpoint: Path | None = None) -> None:
        super().__init__(perf, net.spec.slot_s)
        self.net = net
        self.spec = net.spec
        self.checkpoint = checkpoint
        self.weights_sha256: str | None = None  # of the checkpoint's weights (make_dl2_policy)
        self.inferences = 0
        self.used: list[float] = [0.0, 0.0, 0.0]
        self.record = False
        self._samples: list[tuple[np.ndarray, np.ndarray, int]] | None = None  # this slot's, when recording
        self._start: tuple[float, dict[str, tuple[float, float]]] | None = None  # (time, progress) at its start
        self._closed: list[Transition] = []

    def choose(self, obs: np.ndarray, mask: np.ndarray, batch: Sequence[PlanJob]) -> int:
        """The action taken in state ``obs``: the most likely feasible one."""
        self.inferences += 1
        z = np.where(mask, self.net.logits(obs, mask), -np.inf)
        return int(np.argmax(z))

    # -------------------------------------------------------------- experience
    def _close(self, end: float, reward: float, next_obs: np.ndarray | None) -> None:
        if self._start is not None and self._samples:
            o, m, a = zip(*self._samples)
            self.on_transition(Transition(self._start[0], end, np.stack(o), np.stack(m), np.asarray(a, np.int64),
                                          float(reward), next_obs))
        self._samples, self._start = None, None

    def on_transition(self, t: Transition) -> None:
        """A slot closed (recording on): kept for :meth:`take_experience`."""
        self._closed.append(t)

    def take_experience(self) -> list[Transition]:
        """The transitions closed since the last call (recording on), oldest first; forgets them."""
        out, self._closed = self._closed, []
        return out

    def finish(self, time: float) -> None:
        """Close the open slot at the end of an episode at ``time`` (every job done: each job's remaining
        work at the slot's start counts; no next state)."""
        if self._start is not None:
            self._close(time, sum(rem / tot for rem, tot in self._start[1].values() if tot > 0), None)

    # -------------------------------------------------------------- the slot
    def plan(self, jobs, cap, state) -> None:
        if self.record:
            obs0 = encode(jobs[: self.spec.J], cap, state.time, self.spec)
            if self._start is not None:
                self._close(state.time, slot_reward(self._start[1], state), obs0)
            self._start, self._samples = (state.time, progress(state)), []
        used = self.used = [0.0, 0.0, 0.0]  # aggregate (GPUs, CPUs, GB) taken so far this slot
        # every action but stop adds a worker or a PS: a bound on a slot's actions that a network
        # adding PSs before workers cannot exhaust with its jobs still at 0 workers
        limit = int(sum(min(j.hi, 10**6) + (MAX_PS if j.ps_job else 0) for j in jobs)) + 2
        runnable = any(j.w >= max(j.lo, 1) and (j.p >= 1 or not j.ps_job) for j in jobs)
        for start in range(0, len(jobs), self.spec.J):
            batch = jobs[start : start + self.spec.J]
            sb = SlotBatch(batch, cap, state.time, self.spec)
            for _ in range(limit):
                mask = sb.mask(used, allow_stop=runnable)
                if not mask[:-1].any():
                    break
                sb.set_used(used)
                obs = sb.obs.copy()
                a = self.choose(obs, mask, batch)
                if self._samples is not None:
                    self._samples.append((obs, mask, a))
                if not mask[a] or not apply_action(batch, used, a, self.spec):
                    break
                sb.update(a // 3)
                j = batch[a // 3]
                runnable = runnable or (j.w >= max(j.lo, 1) and (j.p >= 1 or not j.ps_job))


# ---------------------------------------------------------------------- checkpoints
def save_dl2(path: str | Path, actor: "Sequence[tuple[np.ndarray, np.ndarray]] | DL2Net | DL2RowsNet", spec: DL2Spec,
             extra: Mapping[str, Any] | None = None,
             critic: Sequence[tuple[np.ndarray, np.ndarray]] | None = None) -> Path:
    """Write ``path.safetensors`` + ``path.json`` (module docstring), each atomically; returns the JSON path.
    ``actor``: a flat actor's layers, or a :class:`DL2Net` / :class:`DL2RowsNet` of ``spec``."""
    from policies.checkpoint import write_policy_files

    net = actor if isinstance(actor, (DL2Net, DL2RowsNet)) else DL2Net(actor, spec)  # shape check
    if net.spec != spec:
        raise ValueError("save_dl2: the actor's spec is not the spec given")
    base = Path(path)
    if base.suffix in (".json", ".safetensors"):
        base = base.with_suffix("")
    tensors = net.tensors()
    tensors.update(_layer_tensors("critic", critic or ()))
    layers = ({"actor_layers": len(net.weights)} if isinstance(net, DL2Net)
              else {"row_layers": len(net.row), "stop_layers": len(net.stop)})
    meta = {"format": FORMAT, "format_version": FORMAT_VERSION, "spec": spec.to_dict(), **layers, **dict(extra or {})}
    return write_policy_files(base.with_name(base.name + ".json"), tensors, meta)


def _chain(tensors: Mapping[str, np.ndarray], prefix: str, n: int, wpath: Path) -> list[tuple[np.ndarray, np.ndarray]]:
    """Layers ``prefix.{0..n-1}.weight`` / ``.bias`` of ``tensors``, checked (present, chaining, finite)."""
    from policies.checkpoint import CheckpointError

    layers: list[tuple[np.ndarray, np.ndarray]] = []
    for k in range(n):
        w, b = tensors.get(f"{prefix}.{k}.weight"), tensors.get(f"{prefix}.{k}.bias")
        if w is None or b is None:
            raise CheckpointError(f"{wpath}: missing tensor {prefix}.{k}.weight or {prefix}.{k}.bias")
        if w.ndim != 2 or b.shape != (w.shape[0],) or (layers and layers[-1][0].shape[0] != w.shape[1]):
            raise CheckpointError(f"{wpath}: {prefix}.{k} has shapes {w.shape} / {b.shape} that do not chain")
        if not (np.isfinite(w).all() and np.isfinite(b).all()):
            raise CheckpointError(f"{wpath}: {prefix}.{k} holds NaN or infinite values")
        layers.append((w, b))
    return layers


def _read(path: str | Path) -> tuple["DL2Net | DL2RowsNet", dict[str, Any], Path, Path, dict[str, np.ndarray]]:
    from policies.checkpoint import CheckpointError, read_policy_files

    meta, tensors, jpath, wpath = read_policy_files(path, fmt=FORMAT, version=FORMAT_VERSION, label="dl2")
    try:
        spec = DL2Spec.from_dict(meta.get("spec"))
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{jpath}: bad spec: {exc}") from None
    counts = {}
    for key in (("actor_layers",) if spec.arch == "flat" else ("row_layers", "stop_layers")):
        n = meta.get(key)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise CheckpointError(f"{jpath}: {key} must be an integer >= 1, got {n!r}")
        counts[key] = n
    try:
        if spec.arch == "flat":
            net = make_net(spec, {"actor": _chain(tensors, "actor", counts["actor_layers"], wpath)})
        else:
            net = make_net(spec, {"row": _chain(tensors, "actor.row", counts["row_layers"], wpath),
                                  "stop": _chain(tensors, "actor.stop", counts["stop_layers"], wpath)})
    except ValueError as exc:
        raise CheckpointError(f"{wpath}: {exc}") from None
    return net, meta, jpath, wpath, tensors


def load_dl2(path: str | Path) -> tuple["DL2Net | DL2RowsNet", dict[str, Any], Path]:
    """``(actor, metadata, json path)`` of a DL2 checkpoint (``NAME``, ``NAME.json`` or
    ``NAME.safetensors``), checked: format, spec, sha256, tensor names, shapes, finite values.

    :raises CheckpointError: one line naming the file and the problem.
    """
    net, meta, jpath, _wpath, _t = _read(path)
    return net, meta, jpath


def load_dl2_critic(path: str | Path) -> tuple["DL2Net | DL2RowsNet", dict[str, Any], Path, list[tuple[np.ndarray, np.ndarray]] | None]:
    """:func:`load_dl2` plus the critic's layers (``critic.{k}``: ``obs_size`` -> ... -> 1), or None
    when the checkpoint has none. :raises CheckpointError: one line, as :func:`load_dl2`."""
    from policies.checkpoint import CheckpointError

    net, meta, jpath, wpath, tensors = _read(path)
    n = sum(1 for k in tensors if k.startswith("critic.") and k.endswith(".weight"))
    if not n:
        return net, meta, jpath, None
    critic = _chain(tensors, "critic", n, wpath)
    if critic[0][0].shape[1] != net.spec.obs_size or critic[-1][0].shape[0] != 1:
        raise CheckpointError(f"{wpath}: critic maps {critic[0][0].shape[1]} -> {critic[-1][0].shape[0]}, "
                              f"not {net.spec.obs_size} -> 1")
    return net, meta, jpath, critic


def shipped_dl2() -> Path:
    """The shipped DL2 checkpoint (``policies/checkpoints/dl2/dl2``)."""
    return _CHECKPOINT_DIR / "dl2" / "dl2"


def make_dl2_policy(name: str, perf=None, checkpoint: str | Path | None = None) -> DL2Policy:
    """``dl2`` (the shipped checkpoint, or ``checkpoint``) or ``dl2:/path``. :class:`PolicyError` with one line."""
    from policies.checkpoint import checkpoint_of_name

    ckpt = checkpoint_of_name(name, "dl2") or (Path(checkpoint) if checkpoint else shipped_dl2())
    net, meta, jpath = load_dl2(ckpt)
    pol = DL2Policy(net, perf, checkpoint=jpath)
    pol.weights_sha256 = str(meta.get("weights_sha256") or "") or None
    return pol
