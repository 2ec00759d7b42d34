"""Observation encoder and action decoder of the RL policies (the only ones).

Both the Gymnasium environment (:mod:`trainer.env`) and the deployed policies
(:mod:`policies.rl`, called by the simulator and by the Slurm controller on a
Slurm-built :class:`~policies.state.ClusterState`) use :class:`Encoder`, so
training and serving see exactly the same tensors.

Observation
-----------
A float32 tensor of shape ``(C, N, 2 * G)``: ``N`` nodes, ``G`` = the largest
GPU count of a node, ``C`` channels. It generalises the seed's two-half
``<nodes, 2 x GPUs per node>`` picture: the *left half* (columns ``0..G-1``)
shows what runs on every GPU slot, the *right half* (columns ``G..2G-1``) the
candidate jobs and where each of their placement options would put them.

Left half, one cell per GPU slot ``(node v, slot g)``; running jobs fill a
node's slots from ``g = 0`` in job-id order, free slots follow:

=====  =========================================================================
ch     meaning (0 where the slot is free unless stated)
=====  =========================================================================
0      slot exists (1 for ``g < gpus[v]``; heterogeneous nodes have fewer)
1      slot occupied
2      occupant's network bandwidth (Table I) / link bandwidth, clipped to 1
3      occupant's comm/comp ratio r as r / (1 + r)
4      occupant's remaining isolated time, ``log1p(t / 1 h) / log1p(64)`` clipped to 1
5      occupant's current slowdown ``CS - 1``, clipped to 1
6      occupant spans several nodes
7      occupant's GPU demand, ``log2(1 + G_job) / log2(1 + total GPUs)``
8      queue length ``log1p(pending) / log1p(256)``, clipped, on every existing slot
=====  =========================================================================

Right half: ``K`` (default 6: every power-of-two demand of a 32-GPU cluster)
candidates (see :meth:`Encoder.candidates`) times ``S``
placement options each. Channel ``k * S + s`` holds, on the free slots that
option ``s`` of candidate ``k`` would take, the job's predicted normalised
speed there, ``isolated(shape) / CS / best_isolated`` in ``(0, 1]`` (locality
and contention in one number), and 0 elsewhere; an infeasible option is all 0.
Channels ``K * S + 5 k + (0..4)`` broadcast candidate ``k``'s bandwidth, comm
ratio, remaining time, demand (same normalisations as channels 2, 3, 4, 7)
and waiting time so far (``log1p(wait / 1 h) / log1p(64)``, clipped) over
the existing right-half slots. ``C = max(9, K * S + 5 K)``.

Candidates: pending jobs are grouped by GPU demand; each group is represented
by its job with the shortest estimated remaining time (SRTF key, ties by
submit time then id); groups are ordered by the representative's *aged*
remaining GPU-time, ``remaining time x demand x exp(-wait / aging_s)``
(``aging_s`` = :attr:`ObsSpec.aging_s`: 300 s, :data:`AGING_S`, for new specs and the
shipped checkpoints; 1800 s, :data:`LEGACY_AGING_S`, for checkpoints written before the
field existed; ``wait`` = time since submission), and the first ``K``
are the candidates. So candidate 0 is what a "shortest remaining GPU-area
first, with aging" rule would run, and every SRTF head of a demand class is
visible. Without aging (encoding version 2) a large job could be overtaken
by later small ones indefinitely under continuous arrivals; with it the
untrained prior's average JCT on Poisson traces at 80-95 % load dropped from
6.0-8.7 h to 3.2-7.1 h, at or below SRTF's (docs/RESULTS.md). Jobs that
arrive together (equal waits) keep the plain GPU-time order.

That is the ``"area"`` order (:attr:`ObsSpec.order`). The ``"fill"`` order
(:meth:`Encoder.fill_order`, used by the shipped networks) adds a tail rule:
once no small job waits, a job of more than half the cluster is put first,
followed by the jobs that fit beside it and end no later, largest first.
Smallest-area-first alone leaves such jobs for the end, where each runs
beside an idle gap (docs/RESULTS.md). The ``"plan"`` order (the shipped
networks' since 2026-11-21) puts the single-node jobs of a long queue of
equal-length jobs (a batch, or under arrivals mostly demands that fill no
node exactly) in the waves of :mod:`policies.waves` (node-sized exact
complements, most jobs first) and is the fill order otherwise
(:meth:`Encoder.plan_remaining`, docs/RL.md).

Options ``s = 0..L-1`` are *balanced* placements over ``n = 2^s`` nodes
(``ceil(G_job / n)`` GPUs on each, the last fewer), nodes taken least
network-loaded first (fewest multi-node jobs), then best fit (fewest free
GPUs), then index; option ``s = L`` is SCED2 packing (:func:`policies.placement.pack`),
which also covers uneven shapes. ``L = min(4, floor(log2 N) + 1)``, so
``S = L + 1``.

Action
------
``Discrete(K * S + 1)``: action ``a < K * S`` starts candidate ``a // S`` on
option ``a % S``; action ``K * S`` ("nothing") schedules nothing more this
round. :meth:`Encoded.mask` marks the valid ones; "nothing" is invalid only when
no job runs and some placement is valid (holding an idle cluster can never
help and would deadlock a trace whose jobs all arrived).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
import operator
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from policies.cluster import ClusterSpec, Placement
from policies.perf import MIN_RATIO, ContentionModel, JobKey
from policies.placement import pack
from policies.state import TIME_KEY_SCALE, ClusterState, JobInfo, time_key
from policies.waves import plan_order
from policies.workloads import get_workload

__all__ = [
    "AGING_S",
    "CANDIDATE_ORDERS",
    "LEGACY_AGING_S",
    "CAND_FEATURES",
    "FILL_SMALL",
    "LEFT_CHANNELS",
    "MAX_LEVELS",
    "Encoded",
    "Encoder",
    "EncodingError",
    "NodeIndex",
    "ObsSpec",
    "RoundEncoder",
    "SparseObs",
    "apply_placement",
    "describe_layout",
]

LEFT_CHANNELS = 9
CAND_FEATURES = 5
_HOUR = 3600.0
_REM_NORM = math.log1p(64.0)
_QUEUE_NORM = math.log1p(256.0)
_MEMO_MAX = 65536  # entries of the encoder's option memo before it is cleared
#: Default aging time constant of the candidate order (s; :attr:`ObsSpec.aging_s`): a job's
#: remaining GPU-time key is multiplied by ``exp(-wait / aging_s)``. Chosen on Poisson traces
#: disjoint from training and evaluation (docs/RL.md, "Stronger aging, 300 s").
AGING_S = 300.0
#: The aging of checkpoints written before :attr:`ObsSpec.aging_s` existed (their training order).
LEGACY_AGING_S = 1800.0
#: Candidate orders an :class:`ObsSpec` may name.
CANDIDATE_ORDERS = ("area", "fill", "plan")
#: Most balanced placement levels (``n = 1, 2, 4, 8`` nodes): :meth:`ObsSpec.for_cluster` uses
#: ``min(MAX_LEVELS, floor(log2 N) + 1)``.
MAX_LEVELS = 4
#: ``"fill"`` order: the tail rule starts once no pending job needs at most this fraction of the cluster's GPUs.
FILL_SMALL = 0.15
#: ``"plan"`` order: waves are planned only while the waiting jobs need at least this many times the cluster's GPUs ...
PLAN_BACKLOG = 8.0
#: ... and their estimated remaining times agree within this ratio (longest / shortest) ...
PLAN_SPREAD = 1.25
#: ... and they were all submitted within this many seconds (a batch: waves have no ageing), ...
PLAN_WAIT = 1800.0
#: ... or at least this share of the waiting GPU demand is in *odd* demands: demands that neither
#: divide nor are multiples of a node's GPUs. Those fill no node exactly in any order, so only
#: there is the packing gain of waves worth running them under arrivals, without ageing.
PLAN_ODD = 0.5


def _neg_demand(j: JobInfo) -> int:
    return -j.gpu_demand


_floor = math.floor
_SRTF_FIELDS = operator.attrgetter("total_samples", "done_samples", "best_thp", "submit_time", "job_id", "gpu_demand")


class EncodingError(ValueError):
    """The encoder's spec does not fit the cluster it is used on."""


def describe_layout(gpus: Sequence[int]) -> str:
    """A node layout (GPUs of each node, in node order) as runs ``COUNTxGPUS`` joined by ``+``.

    ``[8, 8, 8, 8]`` -> ``"4x8"`` (what :meth:`ClusterSpec.describe` says of a homogeneous
    cluster); ``[8, 4, 4]`` -> ``"1x8+2x4"``; ``[4, 8, 4]`` -> ``"1x4+1x8+1x4"`` (order matters:
    the observation has one row per node).
    """
    return "+".join(f"{len(list(run))}x{g}" for g, run in itertools.groupby(gpus))


def _spec_int(name: str, v: object, lo: int, hi: int | None = None) -> int:
    """``v`` as an ``int`` in ``[lo, hi]``; :class:`EncodingError` for bools, non-integral or
    non-numeric values (``8.9`` is not silently truncated to 8) and values out of range."""
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise EncodingError(f"observation spec field {name!r} must be an integer, got {v!r}")
    v = int(v)
    if v < lo or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise EncodingError(f"observation spec field {name!r} must be {rng}, got {v}")
    return v


@dataclass(frozen=True)
class ObsSpec:
    """Static shape of observations and actions for one cluster shape.

    :param num_nodes: ``N``.
    :param gpus_per_node: ``G``, the largest node's GPU count.
    :param total_gpus: GPUs of the cluster (normalises demands).
    :param k: candidate jobs.
    :param levels: balanced options per candidate (``n = 1, 2, 4, ...`` nodes).
    :param version: encoding version; bumped on any change of meaning.
    :param order: candidate order, ``"area"`` (least aged remaining GPU-time first) or
        ``"fill"`` (the same, plus the tail rule of :meth:`Encoder.fill_order`). Checkpoints
        written before this field existed use ``"area"``.
    :param aging_s: aging time constant of the candidate order (s, finite, > 0): a job's
        remaining GPU-time key is multiplied by ``exp(-wait / aging_s)``. It changes nothing
        when every job has waited equally (all submitted together). Checkpoints written before
        this field existed use :data:`LEGACY_AGING_S` (1800 s).

    Construction validates every field (:class:`EncodingError`): integers (not bools,
    not ``8.9``), ``N, G, k, version >= 1``, ``1 <= levels <= MAX_LEVELS``, and
    ``G + N - 1 <= total_gpus <= N * G`` (every node has 1..G GPUs). ``k = 0`` would leave
    the policy only "nothing" to choose, so it could never start a job.
    """

    num_nodes: int
    gpus_per_node: int
    total_gpus: int
    k: int = 6
    levels: int = 3
    version: int = 3
    order: str = "area"
    aging_s: float = AGING_S

    def __post_init__(self) -> None:
        for name, lo, hi in (
            ("num_nodes", 1, None),
            ("gpus_per_node", 1, None),
            ("total_gpus", 1, None),
            ("k", 1, None),
            ("levels", 1, MAX_LEVELS),
            ("version", 1, None),
        ):
            object.__setattr__(self, name, _spec_int(name, getattr(self, name), lo, hi))
        N, G, T = self.num_nodes, self.gpus_per_node, self.total_gpus
        if not G + N - 1 <= T <= N * G:
            raise EncodingError(
                f"observation spec total_gpus {T} is impossible for {N} nodes of at most {G} GPUs "
                f"(expected {G + N - 1}..{N * G})"
            )
        if not isinstance(self.order, str) or self.order not in CANDIDATE_ORDERS:
            raise EncodingError(f"unknown candidate order {self.order!r}; expected one of {', '.join(CANDIDATE_ORDERS)}")
        a = self.aging_s
        try:  # float() of an int beyond float range raises OverflowError
            ok = not isinstance(a, bool) and isinstance(a, (int, float, np.integer, np.floating)) and 0 < float(a) < math.inf
        except OverflowError:
            ok = False
        if not ok:
            text = repr(a) if len(repr(a)) <= 40 else repr(a)[:37] + "..."
            raise EncodingError(f"observation spec aging_s must be a finite number of seconds > 0, got {text}")
        object.__setattr__(self, "aging_s", float(a))

    @classmethod
    def for_cluster(cls, cluster: ClusterSpec, k: int = 6, order: str = "area", aging_s: float = AGING_S) -> ObsSpec:
        levels = min(MAX_LEVELS, math.floor(math.log2(cluster.num_nodes)) + 1)
        return cls(cluster.num_nodes, cluster.max_gpus_per_node, cluster.total_gpus, k, levels, order=order, aging_s=aging_s)

    @property
    def options(self) -> int:
        """``S``: placement options per candidate."""
        return self.levels + 1

    @property
    def n_actions(self) -> int:
        return self.k * self.options + 1

    @property
    def noop(self) -> int:
        """Index of the "schedule nothing" action."""
        return self.k * self.options

    @property
    def channels(self) -> int:
        return max(LEFT_CHANNELS, self.k * self.options + CAND_FEATURES * self.k)

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.channels, self.num_nodes, 2 * self.gpus_per_node)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["shape"] = list(self.shape)
        d["n_actions"] = self.n_actions
        return d

    @classmethod
    def from_dict(cls, d: dict) -> ObsSpec:
        """The spec of :meth:`to_dict`'s output; every field validated (see the class), and the
        redundant ``shape`` / ``n_actions``, when present, must agree with the fields."""
        if not isinstance(d, dict):
            raise EncodingError(f"observation spec must be a JSON object, got {d!r}")
        missing = [f for f in ("num_nodes", "gpus_per_node", "total_gpus", "k", "levels", "version") if f not in d]
        if missing:
            raise EncodingError(f"bad observation spec {d!r}: missing {', '.join(missing)}")
        order = d.get("order", "area")
        if not isinstance(order, str):
            raise EncodingError(f"observation spec field 'order' must be a string, got {order!r}")
        spec = cls(
            d["num_nodes"], d["gpus_per_node"], d["total_gpus"], d["k"], d["levels"], d["version"], order,
            d.get("aging_s", LEGACY_AGING_S),
        )
        if "shape" in d and (not isinstance(d["shape"], list) or d["shape"] != list(spec.shape)):
            raise EncodingError(f"observation spec shape {d['shape']} disagrees with its fields {list(spec.shape)}")
        if "n_actions" in d and (isinstance(d["n_actions"], bool) or d["n_actions"] != spec.n_actions):
            raise EncodingError(
                f"observation spec n_actions {d['n_actions']!r} disagrees with its fields ({spec.n_actions})"
            )
        return spec

    def describe(self) -> str:
        """``"a 4x8 cluster (4 nodes, 32 GPUs)"`` when the total is ``N x G`` (homogeneous), else
        ``"a heterogeneous cluster of 3 nodes, at most 8 GPUs each (16 GPUs)"``: the spec alone does
        not know a heterogeneous cluster's layout (see :meth:`check_cluster`)."""
        N, G, T = self.num_nodes, self.gpus_per_node, self.total_gpus
        if T == N * G:
            return _describe_cluster((G,) * N)
        return f"a heterogeneous cluster of {N} nodes, at most {G} GPUs each ({T} GPUs)"

    def check_cluster(self, cluster: ClusterSpec, layout: Sequence[int] | None = None) -> None:
        """Raise :class:`EncodingError` unless this spec was made for ``cluster``'s shape.

        :param layout: GPUs of each node of the cluster the spec was made for (a checkpoint's
            training cluster, ``ClusterSpec.gpus_per_node``). The spec itself holds only ``N``,
            the largest node and the total, which heterogeneous clusters can share with a
            different layout (``[8, 4, 4]`` and ``[8, 6, 2]``) although the observation's
            slot-exists channel, and so what the network was trained on, differs. With
            ``layout`` the GPU counts must match node by node too.
        """
        other = ObsSpec.for_cluster(cluster, self.k)
        if self.version != other.version:
            raise EncodingError(
                f"policy uses observation encoding version {self.version}, "
                f"this rlsched encodes version {other.version}; retrain it"
            )
        mine = (self.num_nodes, self.gpus_per_node, self.total_gpus, self.levels)
        theirs = (other.num_nodes, other.gpus_per_node, other.total_gpus, other.levels)
        got = tuple(cluster.gpus_per_node)
        want = None if layout is None else tuple(int(g) for g in layout)
        if mine != theirs or (want is not None and want != got):
            trained = self.describe() if want is None else _describe_cluster(want)
            raise EncodingError(
                f"policy was trained for {trained} but the cluster is {_describe_cluster(got)}; "
                "train or pick a checkpoint for this shape"
            )


def _describe_cluster(gpus: Sequence[int]) -> str:
    """``"a 4x8 cluster (4 nodes, 32 GPUs)"``, ``"a 1x8+2x4 cluster (3 nodes, 16 GPUs)"``, ``"an 8x8 ..."``."""
    text = describe_layout(gpus)
    article = "an" if text.startswith(("8", "11x", "18x")) else "a"  # "an eight", "an eleven", "an eighteen"
    return f"{article} {text} cluster ({len(gpus)} nodes, {sum(gpus)} GPUs)"


@dataclass
class SparseObs:
    """An observation in structured form (:meth:`Encoder.encode` with ``dense=False``).

    :meth:`dense` rebuilds the float32 ``spec.shape`` tensor bit for bit
    (tested); :meth:`policies.checkpoint.MLPNet.logits_sparse` evaluates a
    network on it without building that tensor. Fields (``G`` = ``spec.gpus_per_node``):

    :param queue: channel 8's value (queue length), broadcast over existing left-half slots
        (channel 0 is the constant 1 over the same slots).
    :param jobs: per running job with visible slots: ``(feats, spans)``, ``feats`` the 7
        values of channels 1..7, ``spans`` ``((node, first column, end column), ...)`` in the left half.
    :param opt_c: option channel of each written right-half cell; ``opt_v`` its node,
        ``opt_g`` its column (``G..2G-1``), ``opt_x`` its value (predicted speed).
    :param cand: candidate broadcast values; ``cand[i]`` fills channel ``K * S + i`` over
        every existing right-half slot.
    :param left: set by :class:`RoundEncoder` only: float64 ``[H]``, the running jobs'
        first-layer contribution for one network's plan (channels 1..7), already summed;
        ``jobs`` is then empty and :meth:`dense` is unavailable (use ``RoundEncoder.jobs()``).
    :param span_idx: set by :class:`RoundEncoder` only (``opt_c``, ``opt_v``, ``opt_g``, ``opt_x``
        are then empty): the option cells as column spans. Span ``i`` writes value ``x > 0``
        into channel ``c``, node ``v``, right-half columns ``G + a .. G + b - 1``; it is stored
        as the row ``(c * N + v) * (G + 1) + b`` of the network plan's right-prefix table with
        coefficient ``x``, followed, if ``a > 0``, by the same row with ``a`` and coefficient
        ``-x`` (the prefix row of column 0 is zero, so it is left out). ``span_coef`` holds
        the coefficients (:meth:`spans` decodes them).
    :param speeds: set by :class:`RoundEncoder` only: ``[K * S]`` predicted speed of each
        placement action (0 where infeasible), what :meth:`Encoded.action_speeds` returns.
    """

    queue: float
    jobs: list[tuple[tuple[float, ...], tuple[tuple[int, int, int], ...]]]
    opt_c: list[int]
    opt_v: list[int]
    opt_g: list[int]
    opt_x: list[float]
    cand: list[float]
    left: np.ndarray | None = None
    span_idx: list[int] | None = None
    span_coef: list[float] | None = None
    speeds: list[float] | None = None

    def spans(self, spec: ObsSpec) -> list[tuple[int, int, int, int, float]]:
        """``(channel, node, first column, end column, value)`` of each option span (right-half
        columns counted from 0), decoded from ``span_idx`` / ``span_coef``."""
        if self.span_idx is None or self.span_coef is None:
            raise ValueError("only a RoundEncoder observation holds option spans")
        N, G1 = spec.num_nodes, spec.gpus_per_node + 1
        idx, coef = self.span_idx, self.span_coef
        if len(idx) != len(coef):
            raise ValueError(f"{len(idx)} span rows but {len(coef)} coefficients")
        out = []
        i = 0
        while i < len(idx):
            cv, b = divmod(idx[i], G1)
            x = coef[i]
            if not x > 0:
                raise ValueError(f"span row {i}: value {x} is not positive")
            a = 0
            if i + 1 < len(idx) and coef[i + 1] < 0:  # a start row: same cells, value -x
                cv2, a = divmod(idx[i + 1], G1)
                if cv2 != cv or coef[i + 1] != -x or not 0 < a < b:
                    raise ValueError(f"span rows {i}, {i + 1}: start does not match end")
                i += 1
            i += 1
            c, v = divmod(cv, N)
            out.append((c, v, a, b, x))
        return out

    def dense(self, spec: ObsSpec, exists: np.ndarray) -> np.ndarray:
        """The float32 ``spec.shape`` observation (same writes as :meth:`Encoder.encode`).

        :param exists: float32 ``[N, G]`` slot-exists mask (``Encoder._exists``).
        """
        if self.left is not None:
            raise ValueError("a RoundEncoder observation holds only the running jobs' summed contribution")
        G = spec.gpus_per_node
        obs = np.zeros(spec.shape, dtype=np.float32)
        obs[0, :, :G] = exists
        sv: list[int] = []
        sg: list[int] = []
        sj: list[int] = []
        for r, (_f, spans) in enumerate(self.jobs):
            for v, a, b in spans:
                sv.extend([v] * (b - a))
                sg.extend(range(a, b))
                sj.extend([r] * (b - a))
        if sv:
            obs[1:8, sv, sg] = np.asarray([f for f, _s in self.jobs], dtype=np.float32)[sj].T
        obs[8, :, :G] = exists * self.queue
        if self.opt_c:
            obs[self.opt_c, self.opt_v, self.opt_g] = np.asarray(self.opt_x, dtype=np.float32)
        if self.cand:
            base = spec.k * spec.options
            vals = np.asarray(self.cand, dtype=np.float32)
            obs[base : base + len(self.cand), :, G:] = exists[None, :, :] * vals[:, None, None]
        return obs


@dataclass
class Encoded:
    """One encoded state: the observation, the valid-action mask and what the actions mean.

    :param obs: float32 ``spec.shape``.
    :param mask: bool ``[spec.n_actions]``.
    :param candidates: the ``<= K`` candidate jobs, in action order.
    :param options: ``options[k][s]``: placement of option ``s`` of candidate ``k`` or ``None``.
    :param sparse: the observation in structured form (only from ``encode(..., dense=False)``,
        whose ``obs`` is then ``None``).
    """

    obs: np.ndarray | None
    mask: np.ndarray
    candidates: list[JobInfo]
    options: list[Sequence[Placement | None]]
    spec: ObsSpec = field(repr=False, default=None)  # type: ignore[assignment]
    sparse: SparseObs | None = field(repr=False, default=None)
    #: valid placement actions, when the encoder counted them (else derived from ``mask``)
    n_valid: int | None = field(repr=False, default=None)
    #: the valid placement actions in increasing order (set by :class:`RoundEncoder`; else ``None``)
    valid: list[int] | None = field(repr=False, default=None)

    def action_speeds(self) -> np.ndarray:
        """float32 ``[K * S]``: predicted normalised speed of each placement action (0 if infeasible).

        The maximum of option channel ``a`` over the cells (all cells of an
        option hold the same value); read from ``obs`` or from ``sparse``.
        """
        ks = self.spec.k * self.spec.options
        if self.sparse is not None and self.sparse.speeds is not None:
            return np.array(self.sparse.speeds).astype(np.float32)
        if self.obs is not None:
            return self.obs[:ks, :, self.spec.gpus_per_node :].reshape(ks, -1).max(axis=1)  # right half only
        out = np.zeros(ks, dtype=np.float32)
        if self.sparse is not None and self.sparse.opt_c:
            np.maximum.at(out, np.asarray(self.sparse.opt_c), np.asarray(self.sparse.opt_x, dtype=np.float32))
        return out

    @property
    def any_placement(self) -> bool:
        if self.n_valid is not None:
            return self.n_valid > 0
        return bool(self.mask[:-1].any())

    def decode(self, action: int) -> tuple[str, Placement] | None:
        """Action index -> ``(job_id, placement)``, or ``None`` for "nothing".

        Raises :class:`ValueError` for an out-of-range or masked action.
        """
        a = int(action)
        if a < 0 or a >= len(self.mask):
            raise ValueError(f"action {a} out of range [0, {len(self.mask)})")
        if not self.mask[a]:
            raise ValueError(f"action {a} is not valid in this state")
        if a == len(self.mask) - 1:
            return None
        S = self.spec.options
        k, s = divmod(a, S)
        p = self.options[k][s]
        assert p is not None
        return self.candidates[k].job_id, p


def _balanced_alloc(chosen: Sequence[int], g: int, per: int) -> tuple[tuple[int, int], ...]:
    """``Placement.alloc`` of ``g`` GPUs, ``per`` on each chosen node in turn (the last fewer).

    Callers guarantee ``(len(chosen) - 1) * per < g``, so every count is positive; the
    result is sorted by node, as ``Placement.of`` would make it.
    """
    alloc: list[tuple[int, int]] = []
    left = g
    for i in chosen:
        take = min(per, left)
        alloc.append((i, take))
        left -= take
    alloc.sort()
    return tuple(alloc)


def _bw(model: str, link_mbps: float) -> float:
    return min(get_workload(model).bandwidth_mbps / link_mbps, 1.0)


def _cc(model: str) -> float:
    r = get_workload(model).comm_comp
    return r / (1.0 + r)


def _rem(job: JobInfo) -> float:
    return min(math.log1p(max(job.remaining_time, 0.0) / _HOUR) / _REM_NORM, 1.0)


class Encoder:
    """Build observations and masks from a :class:`ClusterState`.

    :param cluster: the cluster the policy runs on.
    :param perf: performance model used to predict options' speeds.
    :param spec: observation spec; defaults to :meth:`ObsSpec.for_cluster`.
        A spec from a checkpoint is checked against ``cluster``.
    """

    def __init__(self, cluster: ClusterSpec, perf: ContentionModel, spec: ObsSpec | None = None) -> None:
        self.cluster = cluster
        self.perf = perf
        self.spec = spec or ObsSpec.for_cluster(cluster)
        self.spec.check_cluster(cluster)
        self._link = cluster.inter_bw_gbps * 1000.0
        self._caps = np.array(cluster.gpus_per_node, dtype=np.int64)
        self._logtot = math.log2(1 + cluster.total_gpus)
        _N, G = self.spec.num_nodes, self.spec.gpus_per_node
        self._exists = (np.arange(G)[None, :] < self._caps[:, None]).astype(np.float32)  # [N, G]
        self._mf: dict[str, tuple[float, float]] = {}
        self._opt_memo: dict[tuple[int, bytes], tuple[Placement | None, ...]] = {}
        self._speed_memo: dict[tuple[str, int, int], float] = {}
        self._multi_memo: dict[tuple, float] = {}
        self._small = max(cluster.gpus_per_node, default=0) < 32768  # free / load fit in an int16
        self._placements: dict[tuple, Placement] = {}  # balanced placements (immutable, shared; _options_indexed)
        self._levels: dict[int, list[tuple[int, int] | None]] = {}  # _options_indexed's levels by demand
        self._sigs: dict[tuple, int] = {}  # neighbour tuples -> ids (signature())
        self._node_cs: dict[tuple, float] = {}  # node CS by (job key, neighbour signature)
        self._mspeed: dict[tuple, float] = {}  # multi-node option speeds (_speed_multi)
        self._next_sid = 0
        # _plan_memo's memo: [time, plan (None: fill order), planned counts, positions by demand]; kept
        # only while a round is open (begin_round / end_round)
        self._plan: list | None = None
        self._in_round = False

    # ------------------------------------------------------------------ rounds
    def begin_round(self) -> None:
        """Start a scheduling round: the ``"plan"`` order's plan made by the round's first call
        (:meth:`plan_remaining`) is kept for its later calls, until :meth:`end_round` or the next
        :meth:`begin_round`.

        A round is one state and the placements taken from it (one :meth:`RLPolicy.schedule
        <policies.rl.RLPolicy.schedule>` call; in :class:`trainer.env.PlacementEnv`, the steps
        between two advances of time): its calls see the same time and queue, less the jobs
        started. Outside a round every call plans afresh, so the encoder is a pure function of
        its arguments there. O(1).
        """
        self._plan = None
        self._in_round = True

    def end_round(self) -> None:
        """End the round (:meth:`begin_round`) and forget its plan. O(1)."""
        self._plan = None
        self._in_round = False

    # ------------------------------------------------------------------ candidates
    @staticmethod
    def srtf_key(j: JobInfo) -> tuple:
        """Order inside a demand group: estimated remaining time, submit time, id.

        ``JobInfo.remaining_time`` written out (the same arithmetic, so the same floats), as a
        :func:`~policies.state.time_key`: this key sorts every pending job once per round."""
        t = max(j.total_samples - j.done_samples, 0.0) / j.best_thp
        return (_floor(t * TIME_KEY_SCALE + 0.5) / TIME_KEY_SCALE, j.submit_time, j.job_id)

    @staticmethod
    def srtf_heaps(pending: Sequence[JobInfo]) -> dict[int, list[tuple]]:
        """Pending jobs by demand, each group a :mod:`heapq` heap of ``(*srtf_key(j), position, j)``.

        Popping a group gives its jobs in :meth:`srtf_key` order (ties, which only duplicate ids
        could make, in queue order, as a stable sort), at ``O(n)`` for the keys and heaps plus
        ``O(log n)`` per job taken, instead of a full sort.
        """
        groups: dict[int, list[tuple]] = {}
        for n, ((t, d, b, s, i, g), j) in enumerate(zip(map(_SRTF_FIELDS, pending), pending)):
            # srtf_key's arithmetic (t - d > 0 iff t > d), time_key inlined
            k = (_floor((t - d if t > d else 0.0) / b * TIME_KEY_SCALE + 0.5) / TIME_KEY_SCALE, s, i, n, j)
            h = groups.get(g)
            if h is None:
                groups[g] = [k]
            else:
                h.append(k)
        for h in groups.values():
            heapq.heapify(h)
        return groups

    def rank_candidates(self, reps: Sequence[JobInfo], now: float = 0.0, memo: dict | None = None) -> list[JobInfo]:
        """Order demand-group representatives by aged remaining GPU-time at time ``now`` (s); keep the first ``K``.

        :param memo: a dict the caller keeps for one ``now`` and unchanged pending jobs (one round):
            sort keys by job id, computed once.
        """

        rank_key = self.rank_key

        def key(j: JobInfo) -> tuple:
            if memo is not None:
                k = memo.get(j.job_id)
                if k is not None:
                    return k
            k = rank_key(j, now)
            if memo is not None:
                memo[j.job_id] = k
            return k

        return sorted(reps, key=key)[: self.spec.k]

    def rank_key(self, j: JobInfo, now: float) -> tuple:
        """Candidate order key at time ``now`` (s): remaining GPU-time aged by the spec's
        :attr:`~ObsSpec.aging_s`, demand, submit time, id (unique per job)."""
        age = math.exp(-max(now - j.submit_time, 0.0) / self.spec.aging_s)
        return (time_key(j.remaining_time) * j.gpu_demand * age, j.gpu_demand, j.submit_time, j.job_id)

    def candidates(self, pending: Sequence[JobInfo], now: float = 0.0, free: int | None = None) -> list[JobInfo]:
        """The ``<= K`` candidate jobs at time ``now`` (s) (see module docstring).

        :param free: free GPUs of the cluster; needed by the ``"fill"`` order (:meth:`fill_order`).
        """
        best: dict[int, JobInfo] = {}
        best_key: dict[int, tuple] = {}
        srtf_key = self.srtf_key
        for j in pending:
            k = srtf_key(j)
            cur = best_key.get(j.gpu_demand)
            if cur is None or k < cur:
                best[j.gpu_demand], best_key[j.gpu_demand] = j, k
        if self.spec.order == "plan":
            counts: dict[int, int] = {}
            for j in pending:
                counts[j.gpu_demand] = counts.get(j.gpu_demand, 0) + 1
            if free is None:
                raise ValueError("the 'plan' candidate order needs the cluster's free GPU count")
            return self.plan_heads(sorted(best.values(), key=lambda j: self.rank_key(j, now)), counts, now, free, pending)
        if self.spec.order == "fill":
            if free is None:
                raise ValueError("the 'fill' candidate order needs the cluster's free GPU count")
            return self.fill_order(sorted(best.values(), key=lambda j: self.rank_key(j, now)), free)
        return self.rank_candidates(list(best.values()), now)

    def queue_order(self, pending: Sequence[JobInfo], now: float, free: int) -> list[JobInfo]:
        """Every pending job in candidate order at time ``now`` (s) with ``free`` free GPUs.

        Not only the best job of each demand (:meth:`candidates`) and not cut to ``K``: jobs by
        :meth:`rank_key`, and in the ``"fill"`` order's tail (no job of at most ``FILL_SMALL x C``
        GPUs waits) rearranged by :meth:`fill_order`. rl-hybrid's safety rule walks this list.
        """
        if self.spec.order == "plan":
            by_d: dict[int, list[JobInfo]] = {}
            for j in sorted(pending, key=self.srtf_key, reverse=True):
                by_d.setdefault(j.gpu_demand, []).append(j)
            counts = {d: len(js) for d, js in by_d.items()}
            order = self.plan_remaining(counts, now, pending)
            if order is not None and any(d <= self.spec.gpus_per_node for d in counts):
                return [by_d[d].pop() for d in order]
        ranked = sorted(pending, key=lambda j: self.rank_key(j, now))
        if self.spec.order != "area" and not any(j.gpu_demand <= FILL_SMALL * self.spec.total_gpus for j in ranked):
            return self.fill_order(ranked, free, k=len(ranked))
        return ranked

    def plan_remaining(self, counts: dict[int, int], now: float, pending: Sequence[JobInfo]) -> list[int] | None:
        """The ``"plan"`` order's demands still to start, one per waiting job
        (:func:`policies.waves.plan_order`), or ``None`` where the order falls back to ``"fill"``.

        Inside a round (:meth:`begin_round`) a plan is made at the round's first call and kept for
        its later calls while ``now`` (s) is unchanged and no demand has more waiting jobs than
        planned: a round's placements then only take jobs off it (each from the first wave that
        holds its demand), so the waves stay those planned at the round's start. Any other call,
        and every call outside a round, plans from ``counts`` (waiting jobs per demand) and
        ``pending`` (the waiting jobs; read only when planning). Waves are planned only where they
        model the queue: the waiting jobs need at least :data:`PLAN_BACKLOG` times the cluster's
        GPUs, their estimated remaining times agree within :data:`PLAN_SPREAD` (longest /
        shortest), and either they were submitted within :data:`PLAN_WAIT` of each other or at
        least :data:`PLAN_ODD` of their GPU demand is in demands that neither divide nor are
        multiples of a node's GPUs (waves ignore waiting time, so under arrivals they could starve
        a job: they are used there only where the packing gain is large); otherwise the round uses
        the ``"fill"`` order.
        """
        memo = self._plan_memo(counts, now, pending)
        if memo is None:
            return None
        order, planned = memo[1], memo[2]
        skip = {d: planned[d] - counts.get(d, 0) for d in planned}  # started: the first occurrences
        rest = []
        for d in order:
            if skip[d]:
                skip[d] -= 1
            else:
                rest.append(d)
        return rest

    def _plan_memo(self, counts: dict[int, int], now: float, pending: Sequence[JobInfo]) -> list | None:
        """:meth:`plan_remaining`'s plan as ``[now, order, planned counts, positions]`` (``None``: the
        ``"fill"`` order), ``positions[d]`` the indices of demand ``d`` in ``order``, ascending.

        The rest of the plan depends only on ``counts``: the jobs started since the plan was made
        are the first ``planned[d] - counts[d]`` occurrences of each demand ``d``, so a round's
        calls cost ``O(demands)``, not ``O(jobs)``. The memo is kept only inside a round
        (:meth:`begin_round`): another queue at the same time is another round.
        """
        memo = self._plan
        if memo is not None and memo[0] == now:  # only set inside a round
            planned = memo[2]
            get = planned.get
            if all(c <= get(d, 0) for d, c in counts.items()):
                return None if memo[1] is None else memo
        spec = self.spec
        order = None
        G = spec.gpus_per_node
        total = sum(d * c for d, c in counts.items())
        if total >= PLAN_BACKLOG * spec.total_gpus:
            # srtf_key's remaining time and the submit times, read in one pass (same arithmetic and floats)
            fields = list(map(_SRTF_FIELDS, pending))
            rem = [(t - d if t > d else 0.0) / b for t, d, b, _s, _i, _g in fields]
            lo = min(rem, default=0.0)
            sub = [f[3] for f in fields]
            batch = max(sub) - min(sub) <= PLAN_WAIT
            odd = sum(d * c for d, c in counts.items() if d % G and G % d) >= PLAN_ODD * total
            if lo > 0.0 and max(rem) <= PLAN_SPREAD * lo and (batch or odd):
                C = spec.total_gpus
                fit = {d: c for d, c in counts.items() if 0 < d <= C}  # larger jobs can never start: last
                order = plan_order(fit, spec.num_nodes, spec.gpus_per_node, self.cluster.gpus_per_node)
                order += [d for d in sorted(counts) if not 0 < d <= C for _ in range(counts[d])]
        pos: dict[int, list[int]] = {}
        for n, d in enumerate(order or ()):
            q = pos.get(d)
            if q is None:
                pos[d] = [n]
            else:
                q.append(n)
        memo = [now, order, dict(counts), pos]
        if self._in_round:
            self._plan = memo
        return None if order is None else memo

    def plan_heads(
        self, heads: Sequence[JobInfo], counts: dict[int, int], now: float, free: int, pending: Sequence[JobInfo]
    ) -> list[JobInfo]:
        """The ``"plan"`` order's ``<= K`` candidates.

        While a single-node job (at most ``G`` GPUs) waits and :meth:`plan_remaining` has a plan:
        the demand-group heads ``heads`` in the order their demands first appear in the plan.
        Otherwise the ``"fill"`` order (:meth:`fill_order`) of ``heads``, which must then be in
        ``"area"`` order.

        :param heads: one waiting job per demand (its SRTF head).
        :param counts: waiting jobs per demand; ``free``: free GPUs of the cluster;
            ``pending``: the waiting jobs (see :meth:`plan_remaining`).
        """
        cursor = self.plan_cursor(heads, counts, now, pending)
        if cursor is None or not cursor.n_single:
            return self.fill_order(heads, free)
        return cursor.heads()

    def plan_cursor(
        self, heads: Sequence[JobInfo], counts: dict[int, int], now: float, pending: Sequence[JobInfo]
    ) -> PlanCursor | None:
        """A round's :meth:`plan_heads` kept up to date by placement (``None``: no plan this round).

        Within a round ``now`` is fixed and ``counts`` only decrease, so the plan made (or kept) by
        the first call stays valid for the whole round; the cursor keeps the demand-group heads
        sorted by plan position and updates them by bisection after each start, instead of
        re-validating the plan and re-sorting every head per decision. Same candidates as
        :meth:`plan_heads` (tested).
        """
        memo = self._plan_memo(counts, now, pending)
        if memo is None:
            return None
        return PlanCursor(memo[2], memo[3], heads, counts, self.spec.gpus_per_node, self.spec.k)

    def fill_order(self, ranked: Sequence[JobInfo], free: int, k: int | None = None) -> list[JobInfo]:
        """The ``"fill"`` candidate order: ``<= K`` (or ``<= k``) of ``ranked`` (jobs in ``"area"`` order;
        the candidates use the demand-group heads).

        Smallest-GPU-area-first is the right order while small jobs wait, but on a
        cluster of ``C`` GPUs it leaves the jobs of more than ``C / 2`` GPUs for the
        end, where no two of them fit together and each runs beside an idle gap.
        Once no pending job needs at most ``FILL_SMALL x C`` GPUs, this order puts
        the first such large job (``C / 2 < demand < C``) ahead, followed by the
        jobs of at most ``C / 2`` GPUs that fit in the ``free`` GPUs and whose
        estimated remaining time is at most the large job's, largest first (a
        best-fit filling of the large job's gap that ends with it), then the rest
        in ``"area"`` order.
        Jobs of exactly ``C`` GPUs leave no gap and keep their place. While any small
        job waits, or no large job does, the order is ``"area"``.
        """
        K = self.spec.k if k is None else k
        C = self.spec.total_gpus
        half = C / 2
        big = None
        for j in ranked:
            d = j.gpu_demand
            if d <= FILL_SMALL * C:
                return list(ranked[:K])
            if big is None and half < d < C:
                big = j
        if big is None:
            return list(ranked[:K])
        tb = time_key(big.remaining_time)
        fit = sorted(
            (j for j in ranked if j.gpu_demand <= half and j.gpu_demand <= free and time_key(j.remaining_time) <= tb),
            key=_neg_demand,
        )
        head = [big, *fit]
        if len(head) < K:
            taken = {id(j) for j in head}
            head.extend(j for j in ranked if id(j) not in taken)
        return head[:K]

    def _options(self, job: JobInfo, free: np.ndarray, order: np.ndarray) -> list[Placement | None]:
        out: list[Placement | None] = []
        g = job.gpu_demand
        for lvl in range(self.spec.levels):
            n = 1 << lvl
            per = math.ceil(g / n)
            if n > g or (n - 1) * per >= g:
                out.append(None)
                continue
            chosen = [int(i) for i in order if free[i] >= per][:n]
            if len(chosen) < n:
                out.append(None)
                continue
            alloc: dict[int, int] = {}
            left = g
            for i in chosen:
                take = min(per, left)
                alloc[i] = take
                left -= take
            out.append(Placement.of(alloc))
        out.append(pack(job, free) if g <= int(free.sum()) else None)
        return out

    def predicted_speed(self, job: JobInfo, p: Placement, multi_keys: list[list[JobKey]]) -> float:
        """``isolated(shape) / CS / best_isolated`` of ``job`` on ``p`` given multi-node neighbours per node."""
        perf = self.perf
        iso = perf.isolated_throughput(job.model, p.total_gpus, p.num_nodes)
        if p.num_nodes > 1:
            key = (job.model, p.total_gpus, p.num_nodes)
            cs = perf.job_cs(key, p.nodes, {v: multi_keys[v] for v in p.nodes})
        else:
            cs = 1.0
        best = perf.best_isolated_throughput(job.model, job.gpu_demand)
        return float(min(iso / cs / max(best, 1e-12), 1.0))

    # ------------------------------------------------------------------ encode
    def _model_feats(self, model: str) -> tuple[float, float]:
        """Cached ``(_bw, _cc)`` of a model (pure functions of the model and the link)."""
        v = self._mf.get(model)
        if v is None:
            v = self._mf[model] = (_bw(model, self._link), _cc(model))
        return v

    def _options_fast(
        self, job: JobInfo, free: np.ndarray, order: np.ndarray, free_ord: np.ndarray, free_sum: int, key: bytes
    ) -> list[Placement | None]:
        """:meth:`_options` with the node scan vectorised and memoised (same placements; tested).

        The options are a pure function of the demand, the free GPUs and the
        node order (itself a function of free GPUs and multi-node load), so
        they are memoised on ``(demand, key)`` with ``key`` the bytes of free
        GPUs and multi-node load; the memo is bounded (cleared when full).
        """
        g = job.gpu_demand
        hit = self._opt_memo.get((g, key))
        if hit is not None:
            return list(hit)
        out: list[Placement | None] = []
        for lvl in range(self.spec.levels):
            n = 1 << lvl
            per = math.ceil(g / n)
            if n > g or (n - 1) * per >= g:
                out.append(None)
                continue
            chosen = order[free_ord >= per][:n].tolist()
            if len(chosen) < n:
                out.append(None)
                continue
            out.append(Placement(_balanced_alloc(chosen, g, per)))
        out.append(pack(job, free) if g <= free_sum else None)
        if len(self._opt_memo) >= _MEMO_MAX:
            self._opt_memo.clear()
        self._opt_memo[(g, key)] = tuple(out)
        return out

    def _job_feats(self, j: JobInfo, multi: bool) -> tuple[float, ...]:
        """A running job's left-half values of channels 1..7 (see the module docstring)."""
        bw, cc = self._model_feats(j.model)
        return (
            1.0,
            bw,
            cc,
            _rem(j),
            min(max(j.cs - 1.0, 0.0), 1.0),
            1.0 if multi else 0.0,
            math.log2(1 + j.gpu_demand) / self._logtot,
        )

    def _speed(self, job: JobInfo, p: Placement, multi_keys: list[list[JobKey]]) -> float:
        """:meth:`predicted_speed`, memoised (by value: single-node placements by shape, multi-node ones
        by placement and the multi-node neighbours on its nodes, which is all the prediction reads)."""
        if len(p.alloc) > 1:
            mk = (job.model, job.gpu_demand, p.alloc, tuple(tuple(multi_keys[v]) for v, _c in p.alloc))
            v = self._multi_memo.get(mk)
            if v is None:
                if len(self._multi_memo) >= _MEMO_MAX:
                    self._multi_memo.clear()
                v = self._multi_memo[mk] = self.predicted_speed(job, p, multi_keys)
            return v
        k = (job.model, job.gpu_demand, p.total_gpus)
        v = self._speed_memo.get(k)
        if v is None:
            v = self._speed_memo[k] = self.predicted_speed(job, p, multi_keys)
        return v

    def _right_half(
        self,
        now: float,
        cands: Sequence[JobInfo],
        free: np.ndarray,
        mload: np.ndarray,
        used: Sequence[int],
        multi_keys: list[list[JobKey]],
        any_running: bool,
    ) -> tuple:
        """Mask, options and right-half cells of :meth:`encode`.

        :param free: int64 ``[N]`` free GPUs; ``mload``: int64 ``[N]`` multi-node jobs per node;
            ``used``: ``[N]`` GPUs taken by running jobs per node (left-half fill, may exceed ``G``);
            ``multi_keys[v]``: multi-node jobs' keys on node ``v`` in job-id order.
        :returns: ``(mask, options, opt_c, opt_v, opt_g, opt_x, cand)`` as in :class:`SparseObs`.
        """
        spec = self.spec
        N, G = spec.num_nodes, spec.gpus_per_node
        logtot = self._logtot
        order = np.lexsort((np.arange(N), free, mload))  # least loaded, best fit, index
        free_ord = free[order]
        free_sum = int(free.sum())
        okey = self._okey(free, mload)
        S = spec.options
        mask = np.zeros(spec.n_actions, dtype=bool)
        options: list[list[Placement | None]] = []
        oc: list[int] = []  # option channel, node, column (right half) and speed per written cell
        ov: list[int] = []
        og: list[int] = []
        ox: list[float] = []
        cf: list[float] = []
        for k, job in enumerate(cands):
            opts = self._options_fast(job, free, order, free_ord, free_sum, okey)
            options.append(opts)
            for s, p in enumerate(opts):
                if p is None:
                    continue
                mask[k * S + s] = True
                speed = self._speed(job, p, multi_keys)
                ch = k * S + s
                for v, c in p.alloc:
                    a = used[v]
                    b = min(a + c, G)
                    if b > a:
                        oc.extend([ch] * (b - a))
                        ov.extend([v] * (b - a))
                        og.extend(range(G + a, G + b))
                        ox.extend([speed] * (b - a))
            wait = min(math.log1p(max(now - job.submit_time, 0.0) / _HOUR) / _REM_NORM, 1.0)
            bw, cc = self._model_feats(job.model)
            cf.extend((bw, cc, _rem(job), math.log2(1 + job.gpu_demand) / logtot, wait))
        any_place = bool(mask[:-1].any())
        mask[spec.noop] = any_running or not any_place
        return mask, options, oc, ov, og, ox, cf

    def _cand_feats(self, job: JobInfo, now: float) -> tuple[float, ...]:
        """A candidate's five broadcast values at time ``now`` (s) (see the module docstring)."""
        wait = min(math.log1p(max(now - job.submit_time, 0.0) / _HOUR) / _REM_NORM, 1.0)
        bw, cc = self._model_feats(job.model)
        return (bw, cc, _rem(job), math.log2(1 + job.gpu_demand) / self._logtot, wait)

    def _options_indexed(self, g: int, nix: NodeIndex) -> tuple[Placement | None, ...]:
        """:meth:`_options_fast` of a ``g``-GPU job from a :class:`NodeIndex` (same placements; tested)."""
        levels = self._levels.get(g)
        if levels is None:  # (nodes, GPUs per node) of each balanced level, None where it cannot exist
            levels = []
            for lvl in range(self.spec.levels):
                n = 1 << lvl
                per = -(-g // n)
                levels.append(None if n > g or (n - 1) * per >= g else (n, per))
            self._levels[g] = levels
        out: list[Placement | None] = []
        interned = self._placements
        for lv in levels:
            chosen = None if lv is None else nix.first_nodes(*lv)
            if chosen is None:
                out.append(None)
                continue
            n, per = lv
            if n == 1:  # the alloc, built directly where every node gets `per` GPUs
                key: tuple = ((chosen[0], g),)
            elif n * per == g:
                key = tuple(zip(sorted(chosen), itertools.repeat(per)))
            else:
                key = _balanced_alloc(chosen, g, per)
            pl = interned.get(key)
            if pl is None:
                if len(interned) >= _MEMO_MAX:
                    interned.clear()
                pl = interned[key] = Placement(key)
            out.append(pl)
        out.append(nix.pack(g))
        return tuple(out)

    def _speed_multi(self, job: JobInfo, p: Placement, multi_keys: Sequence[Sequence[JobKey]], sig: Sequence[int]) -> float:
        """:meth:`predicted_speed` of a multi-node placement (the same floats).

        The speed depends only on the job, the placement's shape and the set of neighbour signatures
        ``sig[v]`` of its nodes (ids of the tuples ``multi_keys[v]``, 0: none; the worst node decides),
        so it is memoised under that key. On a miss, per-node CS
        (:meth:`~policies.perf.ContentionModel.node_cs`) is memoised by the job's key and the signature.
        """
        key = (job.model, job.gpu_demand, p.total_gpus, p.num_nodes, frozenset(map(sig.__getitem__, p.nodes)))
        v = self._mspeed.get(key)
        if v is not None:
            return v
        perf = self.perf
        me = key[0], key[2], key[3]
        memo = self._node_cs
        worst = 1.0
        for v in p.nodes:
            sid = sig[v]
            if sid:
                c = memo.get((me, sid))
                if c is None:
                    if len(memo) >= _MEMO_MAX:
                        memo.clear()
                    c = memo[(me, sid)] = perf.node_cs(me, multi_keys[v])
                worst = max(worst, c)
        cs = min(worst, 1.0 / MIN_RATIO)
        iso = perf.isolated_throughput(job.model, p.total_gpus, p.num_nodes)
        best = perf.best_isolated_throughput(job.model, job.gpu_demand)
        if len(self._mspeed) >= _MEMO_MAX:
            self._mspeed.clear()
        v = self._mspeed[key] = float(min(iso / cs / max(best, 1e-12), 1.0))
        return v

    def signature(self, keys: Sequence[JobKey]) -> int:
        """A small int naming the neighbour tuple ``keys`` (0 for none), stable for this encoder.

        Ids are never reused (a live :class:`RoundEncoder` may still hold ids of tuples the memo dropped).
        """
        if not keys:
            return 0
        t = tuple(keys)
        sid = self._sigs.get(t)
        if sid is None:
            if len(self._sigs) >= _MEMO_MAX:  # node-CS and speed entries under dropped ids go too
                self._sigs.clear()
                self._node_cs.clear()
                self._mspeed.clear()
            self._next_sid += 1
            sid = self._sigs[t] = self._next_sid
        return sid

    def _right_half_round(
        self,
        now: float,
        cands: Sequence[JobInfo],
        free: np.ndarray,
        mload: np.ndarray,
        used: Sequence[int],
        multi_keys: list[list[JobKey]],
        any_running: bool,
        cf_memo: dict,
        nix: NodeIndex,
        sig: Sequence[int],
        pspeed: dict,
    ) -> tuple:
        """:meth:`_right_half` for :class:`RoundEncoder`: the same mask, options, values and
        candidate features, with the option cells as column spans and per-action speeds.

        Options come from the options memo or, on a miss, from ``nix`` (no scan over all nodes).

        :param cf_memo: a dict kept by the caller for one time ``now`` (one round): candidates'
            broadcast features by job id (they depend only on the job and ``now``).
        :param nix: the round's :class:`NodeIndex` (``free`` and ``mload`` in bucket form).
        :param sig: :meth:`signature` of ``multi_keys[v]`` per node.
        :param pspeed: a dict the caller keeps while ``sig`` is unchanged: multi-node option speeds
            by ``(id(placement), model, demand)`` (the placement is kept in the value and checked).
        :returns: ``(mask, options, span_idx, span_coef, cand, speeds, valid)`` as in :class:`SparseObs`
            and :class:`Encoded`.
        """
        spec = self.spec
        N, G, S = spec.num_nodes, spec.gpus_per_node, spec.options
        G1 = G + 1
        NG1 = N * G1
        okey = self._okey(free, mload)
        memo = self._opt_memo
        valid: list[int] = []
        options: list[Sequence[Placement | None]] = []
        idx: list[int] = []  # span end / start rows, in pairs
        coef: list[float] = []  # +value / -value
        cf: list[float] = []
        speeds = [0.0] * (spec.k * S)
        single = self._speed_memo
        for k, job in enumerate(cands):
            g = job.gpu_demand
            opts = memo.get((g, okey))
            if opts is None:
                opts = self._options_indexed(g, nix)
                if len(memo) >= _MEMO_MAX:
                    memo.clear()
                memo[(g, okey)] = opts
            options.append(opts)
            sspeed = single.get((job.model, g, g))
            ch = k * S - 1
            for p in opts:
                ch += 1
                if p is None:
                    continue
                valid.append(ch)
                alloc = p.alloc
                if len(alloc) == 1:  # single node: speed by shape only (as _speed)
                    speed = sspeed
                    if speed is None:
                        speed = sspeed = self._speed(job, p, multi_keys)
                    v, c = alloc[0]
                    a = used[v]
                    b = a + c
                    if b > G:  # noqa: PLR1730 (cheaper than min() in this hot loop)
                        b = G
                    if b > a:
                        base = ch * NG1 + v * G1
                        if a:
                            idx += (base + b, base + a)
                            coef += (speed, -speed)
                        else:  # prefix row 0 is zero: the end row alone
                            idx.append(base + b)
                            coef.append(speed)
                        speeds[ch] = speed
                    continue
                pk = (id(p), job.model, g)
                e = pspeed.get(pk)
                if e is not None and e[0] is p:
                    speed = e[1]
                else:
                    speed = self._speed_multi(job, p, multi_keys, sig)
                    pspeed[pk] = (p, speed)
                chb = ch * NG1
                for v, c in alloc:
                    a = used[v]
                    b = a + c
                    if b > G:  # noqa: PLR1730
                        b = G
                    if b > a:
                        base = chb + v * G1
                        if a:
                            idx += (base + b, base + a)
                            coef += (speed, -speed)
                        else:
                            idx.append(base + b)
                            coef.append(speed)
                        speeds[ch] = speed
            f = cf_memo.get(job.job_id)
            if f is None:
                f = cf_memo[job.job_id] = self._cand_feats(job, now)
            cf.extend(f)
        mask = np.zeros(spec.n_actions, dtype=bool)
        if valid:
            mask[valid] = True
        mask[spec.noop] = any_running or not valid
        return mask, options, idx, coef, cf, speeds, valid

    def _okey(self, free: np.ndarray, mload: np.ndarray) -> bytes:
        """Options-memo key of free GPUs and multi-node load (compact: 4 bytes per node)."""
        if self._small:
            return free.astype(np.int16).tobytes() + mload.astype(np.int16).tobytes()
        return free.tobytes() + mload.tobytes()

    def encode(
        self,
        state: ClusterState,
        candidates: Sequence[JobInfo] | None = None,
        queue_len: int | None = None,
        cache: dict | None = None,
        dense: bool = True,
    ) -> Encoded:
        """Encode ``state`` (the fast path; bit-identical to :meth:`encode_reference`, tested).

        Same observation, mask, candidates and options as the straightforward
        :meth:`encode_reference`, with the per-slot / per-channel numpy writes
        batched into a few fancy-index assignments, per-model features cached
        and the node scans of the balanced options vectorised.

        :param candidates: precomputed :meth:`candidates` of the pending jobs
            (a caller taking several decisions per round maintains them
            incrementally); computed from ``state.pending`` when ``None``.
        :param queue_len: number of pending jobs; ``len(state.pending)`` when ``None``.
        :param cache: a dict the caller keeps for several encodings of states
            whose :class:`JobInfo` objects are not mutated in between (one
            scheduling round: :func:`apply_placement` makes new objects for the
            jobs it changes); running jobs' left-half features are reused from
            it by object identity. ``None``: no reuse.
        :param dense: build ``obs``; with ``False`` the result's ``obs`` is ``None``
            and ``sparse`` holds the same observation as a :class:`SparseObs`
            (``sparse.dense(spec, self._exists)`` equals ``obs`` bit for bit; tested).
        """
        spec = self.spec
        N, G = spec.num_nodes, spec.gpus_per_node
        if len(state.free_gpus) != N:
            raise EncodingError(f"state has {len(state.free_gpus)} nodes, the encoder expects {N}")
        obs = np.zeros(spec.shape, dtype=np.float32) if dense else None
        free = np.asarray(state.free_gpus, dtype=np.int64)
        used = [0] * N
        multi_load = [0] * N
        multi_keys: list[list[JobKey]] = [[] for _ in range(N)]
        exists = self._exists
        if obs is not None:
            obs[0, :, :G] = exists
        jobs_sp: list[tuple[tuple[float, ...], tuple[tuple[int, int, int], ...]]] = []
        sv: list[int] = []  # per occupied slot: node, column, index of its job's feature row
        sg: list[int] = []
        sj: list[int] = []
        rows: list[tuple[float, ...]] = []
        for j in sorted(state.running, key=lambda x: x.job_id):
            p = j.placement
            if p is None:
                continue
            alloc = p.alloc
            multi = len(alloc) > 1
            hit = cache.get(id(j)) if cache is not None else None
            if hit is not None and hit[0] is j:
                feats = hit[1]
            else:
                feats = self._job_feats(j, multi)
                if cache is not None:
                    cache[id(j)] = (j, feats)
            r = len(rows)
            rows.append(feats)
            key = (j.model, p.total_gpus, len(alloc)) if multi else None
            spans: list[tuple[int, int, int]] = []
            for v, c in alloc:
                a = used[v]
                b = min(a + c, G)
                if b > a:
                    if obs is not None:
                        sv.extend([v] * (b - a))
                        sg.extend(range(a, b))
                        sj.extend([r] * (b - a))
                    else:
                        spans.append((v, a, b))
                used[v] = a + c
                if multi:
                    multi_load[v] += 1
                    multi_keys[v].append(key)  # type: ignore[arg-type]
            if spans:
                jobs_sp.append((feats, tuple(spans)))
        if sv:
            obs[1:8, sv, sg] = np.asarray(rows, dtype=np.float32)[sj].T  # type: ignore[index]
        n_pending = len(state.pending) if queue_len is None else int(queue_len)
        q = min(math.log1p(n_pending) / _QUEUE_NORM, 1.0)
        if obs is not None:
            obs[8, :, :G] = exists * q

        if candidates is None:
            cands = self.candidates(state.pending, state.time, state.total_free if spec.order != "area" else None)
        else:
            cands = list(candidates)[: spec.k]
        mask, options, oc, ov, og, ox, cf = self._right_half(
            state.time, cands, free, np.asarray(multi_load, dtype=np.int64), used, multi_keys, bool(state.running)
        )
        base = spec.k * spec.options
        if obs is None:
            return Encoded(None, mask, cands, options, spec, SparseObs(q, jobs_sp, oc, ov, og, ox, cf))
        if oc:
            obs[oc, ov, og] = np.asarray(ox, dtype=np.float32)
        if cf:
            vals = np.asarray(cf, dtype=np.float32)
            obs[base : base + len(cf), :, G:] = exists[None, :, :] * vals[:, None, None]
        return Encoded(obs, mask, cands, options, spec)

    def encode_reference(
        self, state: ClusterState, candidates: Sequence[JobInfo] | None = None, queue_len: int | None = None
    ) -> Encoded:
        """The straightforward encoder (the specification :meth:`encode` must match bit for bit).

        Kept for the equivalence tests (``tests/test_encoding.py``); same parameters as :meth:`encode`.
        """
        spec = self.spec
        N, G = spec.num_nodes, spec.gpus_per_node
        if len(state.free_gpus) != N:
            raise EncodingError(f"state has {len(state.free_gpus)} nodes, the encoder expects {N}")
        obs = np.zeros(spec.shape, dtype=np.float32)
        free = np.asarray(state.free_gpus, dtype=np.int64)
        used = np.zeros(N, dtype=np.int64)
        multi_load = np.zeros(N, dtype=np.int64)
        multi_keys: list[list[JobKey]] = [[] for _ in range(N)]
        left = obs[:, :, :G]
        left[0] = self._exists
        for j in sorted(state.running, key=lambda x: x.job_id):
            p = j.placement
            if p is None:
                continue
            multi = p.num_nodes > 1
            feats = (
                1.0,
                _bw(j.model, self._link),
                _cc(j.model),
                _rem(j),
                min(max(j.cs - 1.0, 0.0), 1.0),
                1.0 if multi else 0.0,
                math.log2(1 + j.gpu_demand) / self._logtot,
            )
            for v, c in p.alloc:
                a, b = int(used[v]), min(int(used[v]) + c, G)
                if b > a:
                    left[1:8, v, a:b] = np.asarray(feats, dtype=np.float32)[:, None]
                used[v] += c
                if multi:
                    multi_load[v] += 1
                    multi_keys[v].append((j.model, p.total_gpus, p.num_nodes))
        n_pending = len(state.pending) if queue_len is None else int(queue_len)
        q = min(math.log1p(n_pending) / _QUEUE_NORM, 1.0)
        left[8] = self._exists * q

        if candidates is None:
            cands = self.candidates(state.pending, state.time, state.total_free if spec.order != "area" else None)
        else:
            cands = list(candidates)[: spec.k]
        order = np.lexsort((np.arange(N), free, multi_load))  # least loaded, best fit, index
        S = spec.options
        mask = np.zeros(spec.n_actions, dtype=bool)
        options: list[list[Placement | None]] = []
        right = obs[:, :, G:]
        base = spec.k * S
        for k, job in enumerate(cands):
            opts = self._options(job, free, order)
            options.append(opts)
            for s, p in enumerate(opts):
                if p is None:
                    continue
                mask[k * S + s] = True
                speed = self.predicted_speed(job, p, multi_keys)
                ch = right[k * S + s]
                for v, c in p.alloc:
                    a, b = int(used[v]), min(int(used[v]) + c, G)
                    ch[v, a:b] = speed
            wait = min(math.log1p(max(state.time - job.submit_time, 0.0) / _HOUR) / _REM_NORM, 1.0)
            cf = (
                _bw(job.model, self._link),
                _cc(job.model),
                _rem(job),
                math.log2(1 + job.gpu_demand) / self._logtot,
                wait,
            )
            for i, val in enumerate(cf):
                right[base + CAND_FEATURES * k + i] = self._exists * val
        any_place = bool(mask[:-1].any())
        mask[spec.noop] = bool(state.running) or not any_place
        return Encoded(obs, mask, cands, options, spec)


def apply_placement(
    state: ClusterState,
    job_id: str,
    p: Placement,
    perf: ContentionModel,
    job: JobInfo | None = None,
    drop_pending: bool = True,
) -> ClusterState:
    """The state after starting pending job ``job_id`` on ``p`` (a new object; ``state`` is untouched).

    Updates free GPUs, moves the job to running with its isolated / achieved
    throughput, and recomputes the achieved throughput of multi-node
    neighbours whose contention changes. Used by the RL policies to take
    several decisions in one round.

    :param job: the pending job, if the caller has it (saves a search).
    :param drop_pending: remove the job from ``pending`` (O(pending)). A caller
        that tracks pending jobs itself (and passes ``candidates`` /
        ``queue_len`` to :meth:`Encoder.encode`) may skip it; the returned
        state then still lists the job as pending.
    """
    free = np.asarray(state.free_gpus, dtype=np.int64).copy()
    if not p.fits(free):
        raise ValueError(f"placement {p} of job {job_id} does not fit free GPUs {free.tolist()}")
    if job is None or job.job_id != job_id:
        job = next((j for j in state.pending if j.job_id == job_id), None)
    if job is None:
        raise ValueError(f"job {job_id} is not pending")
    for v, c in p.alloc:
        free[v] -= c
    iso = perf.isolated_throughput(job.model, p.total_gpus, p.num_nodes)
    new = JobInfo(
        **{**job.__dict__, "placement": p, "isolated_thp": iso, "achieved_thp": iso, "start_time": state.time}
    )
    running = list(state.running) + [new]
    if p.num_nodes > 1:
        by_node: dict[int, list[JobInfo]] = {}
        for j in running:
            if j.placement is not None and j.placement.num_nodes > 1:
                for v in j.placement.nodes:
                    by_node.setdefault(v, []).append(j)
        touched = {j.job_id for v in p.nodes for j in by_node.get(v, [])}
        out = []
        for j in running:
            if j.job_id in touched:
                key = (j.model, j.placement.total_gpus, j.placement.num_nodes)
                neigh = {
                    v: [
                        (o.model, o.placement.total_gpus, o.placement.num_nodes)
                        for o in by_node.get(v, [])
                        if o.job_id != j.job_id
                    ]
                    for v in j.placement.nodes
                }
                cs = perf.job_cs(key, j.placement.nodes, neigh)
                iso_j = j.isolated_thp or perf.isolated_throughput(
                    j.model, j.placement.total_gpus, j.placement.num_nodes
                )
                j = JobInfo(**{**j.__dict__, "isolated_thp": iso_j, "achieved_thp": iso_j / cs})
            out.append(j)
        running = out
    pending = [j for j in state.pending if j.job_id != job_id] if drop_pending else state.pending
    return ClusterState(state.time, state.cluster, free, running, pending, state.usable)


class NodeIndex:
    """Nodes bucketed by free GPUs (and by multi-node load and free GPUs), index-sorted.

    Gives :meth:`Encoder._options_fast`'s balanced options and
    :func:`policies.placement.pack`'s placement without sorting or scanning all
    nodes: the cost depends on the GPUs per node and the jobs' node counts,
    not on the cluster size. Updated in place as a round places jobs
    (:meth:`update`); equal results are tested.

    :param free: free GPUs per node; ``mload``: multi-node jobs per node.
    """

    def __init__(self, free: Sequence[int], mload: Sequence[int]) -> None:
        self.free = [int(f) for f in free]
        self.mload = [int(m) for m in mload]
        self.fmax = max(self.free, default=0)
        self.total = sum(self.free)
        self._by_f: list[list[int]] = [[] for _ in range(self.fmax + 1)]
        self._by_mf: dict[tuple[int, int], list[int]] = {}
        self._loads: dict[int, int] = {}
        for v, (f, m) in enumerate(zip(self.free, self.mload, strict=True)):
            self._by_f[f].append(v)
            self._by_mf.setdefault((m, f), []).append(v)
            self._loads[m] = self._loads.get(m, 0) + 1
        self._load_order = sorted(self._loads)  # the loads present, ascending
        self._fs: dict[int, list[int]] = {}  # per load, the free counts of its non-empty buckets, ascending
        for m, f in sorted(self._by_mf):
            self._fs.setdefault(m, []).append(f)

    def update(self, v: int, free: int, mload: int) -> None:
        """Node ``v`` now has ``free`` free GPUs (no more than before) and ``mload`` multi-node jobs."""
        f0, m0 = self.free[v], self.mload[v]
        if free > f0:
            raise ValueError(f"node {v}: free GPUs may only shrink within a round ({f0} -> {free})")
        if (f0, m0) == (free, mload):
            return
        b = self._by_f[f0]
        del b[bisect.bisect_left(b, v)]
        bisect.insort(self._by_f[free], v)
        b = self._by_mf[(m0, f0)]
        del b[bisect.bisect_left(b, v)]
        if not b:
            del self._by_mf[(m0, f0)]
            self._fs[m0].remove(f0)
        b = self._by_mf.get((mload, free))
        if b is None:
            self._by_mf[(mload, free)] = [v]
            bisect.insort(self._fs.setdefault(mload, []), free)
        else:
            bisect.insort(b, v)
        self._loads[m0] -= 1
        if not self._loads[m0]:
            del self._loads[m0]
            self._load_order.remove(m0)
        if mload not in self._loads:
            bisect.insort(self._load_order, mload)
        self._loads[mload] = self._loads.get(mload, 0) + 1
        self.free[v], self.mload[v] = free, mload
        self.total += free - f0

    def first_nodes(self, n: int, per: int) -> list[int] | None:
        """The first ``n`` nodes with at least ``per`` free GPUs in the order (multi-node load,
        free GPUs, index), or ``None`` if fewer exist."""
        chosen: list[int] = []
        by_mf = self._by_mf
        fs_by_load = self._fs
        for m in self._load_order:
            fs = fs_by_load[m]
            for f in fs[bisect.bisect_left(fs, per) :]:
                chosen.extend(by_mf[(m, f)][: n - len(chosen)])
                if len(chosen) == n:
                    return chosen
        return None

    def pack(self, g: int) -> Placement | None:
        """:func:`policies.placement.pack` of a ``g``-GPU job on the current free GPUs."""
        need = g
        if need > self.total:
            return None
        by_f, fmax = self._by_f, self.fmax
        taken: set[int] = set()  # nodes taken whole (their free GPUs are then 0)
        alloc: dict[int, int] = {}
        while need > 0:
            n = -1
            for f in range(need, fmax + 1):  # best fit: fewest free GPUs that cover the rest, lowest index
                for v in by_f[f]:
                    if v not in taken:
                        n = v
                        break
                if n >= 0:
                    break
            if n >= 0:
                take = need
            else:  # most free GPUs, lowest index
                take = 0
                for f in range(fmax, 0, -1):
                    for v in by_f[f]:
                        if v not in taken:
                            n, take = v, f
                            break
                    if n >= 0:
                        break
                if take <= 0:
                    return None
                taken.add(n)
            alloc[n] = alloc.get(n, 0) + take
            need -= take
        return Placement(tuple(sorted(alloc.items())))  # == Placement.of(alloc): nodes distinct, counts > 0


class PlanCursor:
    """The ``"plan"`` order's candidates during one round (:meth:`Encoder.plan_cursor`).

    :param planned: waiting jobs per demand when the plan was made.
    :param pos: per demand, its positions in the plan (ascending).
    :param heads: one waiting job per demand (its SRTF head); ``counts``: waiting jobs per demand.
    :param G: GPUs per node; ``k``: candidates per decision.
    """

    __slots__ = ("_G", "_jobs", "_k", "_keys", "_planned", "_pos", "counts", "n_single")

    def __init__(
        self,
        planned: dict[int, int],
        pos: dict[int, list[int]],
        heads: Sequence[JobInfo],
        counts: dict[int, int],
        G: int,
        k: int,
    ) -> None:
        self._planned, self._pos, self._G, self._k = planned, pos, G, k
        self.counts = dict(counts)
        # a demand's first remaining occurrence in the plan: the one after the planned[d] - counts[d] started
        first = sorted((pos[d][planned[d] - self.counts[d]], j) for j in heads if self.counts.get(d := j.gpu_demand))
        self._keys = [n for n, _j in first]
        self._jobs = [j for _n, j in first]
        #: demands of at most G GPUs with jobs waiting (the plan's heads are the candidates while > 0)
        self.n_single = sum(1 for d, c in self.counts.items() if c and d <= G)

    def heads(self) -> list[JobInfo]:
        """The ``<= K`` candidates in plan order (valid while :attr:`n_single` > 0)."""
        return self._jobs[: self._k]

    def started(self, job: JobInfo, nxt: JobInfo | None) -> None:
        """``job`` (a head) was started; ``nxt`` is its demand group's new head (``None``: none left)."""
        d = job.gpu_demand
        c = self.counts[d]
        key = self._pos[d][self._planned[d] - c]
        i = bisect.bisect_left(self._keys, key)
        if i >= len(self._jobs) or self._jobs[i] is not job:
            raise RuntimeError(f"plan cursor lost job {job.job_id}")
        del self._keys[i], self._jobs[i]
        c -= 1
        self.counts[d] = c
        if c:
            if nxt is not None:
                key = self._pos[d][self._planned[d] - c]
                i = bisect.bisect_left(self._keys, key)
                self._keys.insert(i, key)
                self._jobs.insert(i, nxt)
        elif d <= self._G:
            self.n_single -= 1


class RoundEncoder:
    """Incremental :meth:`Encoder.encode` (``dense=False``) over the placements of one round.

    Built once from the round's state; :meth:`place` then applies a placement
    exactly as :func:`apply_placement` does (same :class:`JobInfo` objects and
    throughputs, ``running`` in the same order) but updates only what it
    changes: free GPUs, per-node used GPUs, multi-node load and neighbour keys
    of the placement's nodes, and, for the running jobs on those nodes (their
    left-half columns may shift) and the multi-node jobs whose contention
    changed (their slowdown feature), their features, slot spans and their
    first-layer contribution ``plan.job(feats, spans)`` (float64 ``[H]``,
    one row of a ``[jobs, H]`` matrix summed per encoding).
    :meth:`encode` gives the same mask, candidates, options and right-half
    cells as ``Encoder.encode(self.state(), ..., dense=False)`` and the
    running jobs' summed contribution in ``SparseObs.left`` (tested), so a
    round of ``m`` placements on a cluster with ``R`` running jobs costs
    ``O(R + m * (jobs per node + K * S))`` Python steps instead of ``O(m * R)``.

    :param enc: the encoder.
    :param state: the round's initial state (not modified).
    :param plan: the network's first-layer plan (:meth:`policies.checkpoint.MLPNet.sparse_plan`)
        for ``enc.spec`` and ``enc._exists``.
    """

    def __init__(self, enc: Encoder, state: ClusterState, plan) -> None:
        N = enc.spec.num_nodes
        if len(state.free_gpus) != N:
            raise EncodingError(f"state has {len(state.free_gpus)} nodes, the encoder expects {N}")
        self.enc, self.plan = enc, plan
        self.time, self.cluster = state.time, state.cluster
        self.pending = state.pending
        self.usable = state.usable
        self.free = np.asarray(state.free_gpus, dtype=np.int64).copy()
        self.used = [0] * N
        self.mload = np.zeros(N, dtype=np.int64)
        self.multi_keys: list[list[JobKey]] = [[] for _ in range(N)]  # job-id order (encode's)
        self._multi_ids: list[list[str]] = [[] for _ in range(N)]
        self._node_ids: list[list[str]] = [[] for _ in range(N)]  # running jobs per node, id order
        self._node_c: list[dict[str, int]] = [{} for _ in range(N)]
        self.running: list[JobInfo] = list(state.running)  # apply_placement's order
        self._pos: dict[str, int] = {}
        self._by_node: dict[int, list[int]] = {}  # multi-node jobs (running indices, running order)
        self._feats: dict[str, tuple[float, ...]] = {}
        self._spans: dict[str, tuple[tuple[int, int, int], ...]] = {}
        self._row: dict[str, int] = {}
        self._cf: dict[str, tuple[float, ...]] = {}  # candidates' broadcast features (fixed within the round)
        H = plan.const.shape[0]
        self._contrib = np.zeros((max(16, 2 * len(self.running) + 8), H), dtype=np.float64)
        self._n = 0
        self._mkey: dict[int, JobKey] = {}  # multi-node jobs' keys by running index
        self._ncs: dict[str, dict[int, float]] = {}  # per-node CS of multi-node jobs touched this round
        for i, j in enumerate(self.running):
            self._pos[j.job_id] = i
            p = j.placement
            if p is not None and p.num_nodes > 1:
                self._mkey[i] = (j.model, p.total_gpus, p.num_nodes)
                for v in p.nodes:
                    self._by_node.setdefault(v, []).append(i)
        for j in sorted(self.running, key=lambda x: x.job_id):
            if j.placement is not None:
                self._add_to_nodes(j)
        offs = [self._offsets(v) for v in range(N)]
        for j in self.running:
            if j.placement is not None:
                self._refresh(j, offs)
        self.nodes = NodeIndex(self.free.tolist(), self.mload.tolist())
        self.sig = [enc.signature(k) for k in self.multi_keys]
        self._pspeed: dict[tuple, tuple[Placement, float]] = {}  # _right_half_round's, while sig holds

    # ------------------------------------------------------------------ internals
    def _add_to_nodes(self, j: JobInfo) -> None:
        """Register running job ``j`` in the per-node structures (id order kept)."""
        p = j.placement
        multi = p.num_nodes > 1
        key = (j.model, p.total_gpus, p.num_nodes) if multi else None
        for v, c in p.alloc:
            ids = self._node_ids[v]
            ids.insert(bisect.bisect_right(ids, j.job_id), j.job_id)
            self._node_c[v][j.job_id] = c
            self.used[v] += c
            if multi:
                self.mload[v] += 1
                mids = self._multi_ids[v]
                at = bisect.bisect_right(mids, j.job_id)
                mids.insert(at, j.job_id)
                self.multi_keys[v].insert(at, key)  # type: ignore[arg-type]

    def _offsets(self, v: int) -> dict[str, int]:
        """First left-half column of each running job on node ``v`` (before clipping to ``G``)."""
        out: dict[str, int] = {}
        a = 0
        cs = self._node_c[v]
        for jid in self._node_ids[v]:
            out[jid] = a
            a += cs[jid]
        return out

    def _refresh(self, j: JobInfo, offs, new_info: bool = True) -> None:
        """Recompute ``j``'s features (unless ``new_info`` is false: only its columns moved), spans and
        contribution row; ``offs[v]``: :meth:`_offsets` of its nodes, or ``None``: its columns did not
        move (spans kept; features recomputed)."""
        G = self.enc.spec.gpus_per_node
        p = j.placement
        multi = p.num_nodes > 1
        feats = None if new_info else self._feats.get(j.job_id)
        if feats is None:
            feats = self.enc._job_feats(j, multi)
        if offs is None:  # columns unchanged
            spans_t = self._spans[j.job_id]
        else:
            spans = []
            for v, c in p.alloc:
                a = offs[v][j.job_id]
                b = min(a + c, G)
                if b > a:
                    spans.append((v, a, b))
            spans_t = tuple(spans)
        row = self._row.get(j.job_id)
        if row is None:
            if self._n == len(self._contrib):
                self._contrib = np.concatenate([self._contrib, np.zeros_like(self._contrib)])
            row = self._row[j.job_id] = self._n
            self._n += 1
        self._feats[j.job_id] = feats
        self._spans[j.job_id] = spans_t
        self._contrib[row] = self.plan.job(feats, spans_t) if spans_t else 0.0

    # ------------------------------------------------------------------ API
    def place(self, job: JobInfo, p: Placement, perf: ContentionModel) -> None:
        """Start pending ``job`` on ``p`` (as :func:`apply_placement` with ``drop_pending=False``)."""
        free = self.free
        N = len(free)
        for v, c in p.alloc:
            if not (0 <= v < N and c <= free[v]):
                raise ValueError(f"placement {p} of job {job.job_id} does not fit free GPUs {free.tolist()}")
        if job.job_id in self._pos:
            raise ValueError(f"job {job.job_id} is already running")
        for v, c in p.alloc:
            free[v] -= c
        iso = perf.isolated_throughput(job.model, p.total_gpus, p.num_nodes)
        new = object.__new__(JobInfo)  # == JobInfo(**{**job.__dict__, ...}) as apply_placement builds it
        new.__dict__.update(job.__dict__)
        new.placement, new.isolated_thp, new.achieved_thp, new.start_time = p, iso, iso, self.time
        idx = len(self.running)
        self.running.append(new)
        self._pos[new.job_id] = idx
        self._add_to_nodes(new)
        for v in p.nodes:
            self.nodes.update(v, int(free[v]), int(self.mload[v]))
            if p.num_nodes > 1:
                self.sig[v] = self.enc.signature(self.multi_keys[v])
        if p.num_nodes > 1:
            self._pspeed.clear()  # neighbour signatures changed
        changed: set[str] = {new.job_id}
        if p.num_nodes > 1:
            by_node = self._by_node
            self._mkey[idx] = (new.model, p.total_gpus, p.num_nodes)
            for v in p.nodes:
                by_node.setdefault(v, []).append(idx)
            touched = sorted({i for v in p.nodes for i in by_node.get(v, [])})
            run = self.running
            ncs = self._ncs
            pset = set(p.nodes)
            for i in touched:
                j = run[i]
                jp = j.placement
                key = (j.model, jp.total_gpus, jp.num_nodes)
                # per-node CS (perf.job_cs's terms, same neighbour order); only this placement's
                # nodes gained a neighbour, so a job seen before recomputes only those
                per = ncs.get(j.job_id)
                if per is None:
                    per = ncs[j.job_id] = {}
                    redo = jp.nodes
                else:
                    redo = [v for v in jp.nodes if v in pset]
                for v in redo:
                    per[v] = perf.node_cs(key, [self._mkey[k] for k in by_node.get(v, ()) if k != i])
                cs = min(max(1.0, max(per.values(), default=1.0)), 1.0 / MIN_RATIO)  # == perf.job_cs (max is order-free)
                iso_j = j.isolated_thp or perf.isolated_throughput(j.model, jp.total_gpus, jp.num_nodes)
                new_j = object.__new__(JobInfo)  # == JobInfo(**{**j.__dict__, ...})
                new_j.__dict__.update(j.__dict__)
                new_j.isolated_thp, new_j.achieved_thp = iso_j, iso_j / cs
                run[i] = new_j
                changed.add(j.job_id)
        moved: set[str] = set()  # jobs after the new one on its nodes: their columns shift
        for v in p.nodes:
            ids = self._node_ids[v]
            moved.update(ids[ids.index(new.job_id) + 1 :])
        offs: dict[int, dict[str, int]] = {}
        for jid in changed | moved:
            j = self.running[self._pos[jid]]
            if jid not in moved and jid != new.job_id:  # only its slowdown changed: same columns
                self._refresh(j, None)
                continue
            for v in j.placement.nodes:
                if v not in offs:
                    offs[v] = self._offsets(v)
            self._refresh(j, offs, jid in changed)

    def state(self, pending: list[JobInfo] | None = None) -> ClusterState:
        """The current state (``pending``: the round's initial pending jobs unless given)."""
        return ClusterState(
            self.time, self.cluster, self.free, self.running, self.pending if pending is None else pending, self.usable
        )

    def jobs(self) -> list[tuple[tuple[float, ...], tuple[tuple[int, int, int], ...]]]:
        """``SparseObs.jobs`` of the current state (job-id order; for tests)."""
        out = []
        for jid in sorted(self._row):
            if self._spans[jid]:
                out.append((self._feats[jid], self._spans[jid]))
        return out

    def encode(self, candidates: Sequence[JobInfo], queue_len: int) -> Encoded:
        """:meth:`Encoder.encode` of the current state with these ``candidates`` and queue length, ``dense=False``;
        ``sparse.jobs`` is empty, ``sparse.left`` holds their summed contribution and the option
        cells are column spans (``sparse.span_idx`` / ``span_coef`` set) with per-action ``sparse.speeds``."""
        enc = self.enc
        spec = enc.spec
        cands = list(candidates)[: spec.k]
        q = min(math.log1p(int(queue_len)) / _QUEUE_NORM, 1.0)
        mask, options, idx, coef, cf, speeds, valid = enc._right_half_round(
            self.time,
            cands,
            self.free,
            self.mload,
            self.used,
            self.multi_keys,
            bool(self.running),
            self._cf,
            self.nodes,
            self.sig,
            self._pspeed,
        )
        left = np.add.reduce(self._contrib[: self._n], axis=0)  # == .sum(axis=0), without the wrapper
        sp = SparseObs(q, [], [], [], [], [], cf, left, idx, coef, speeds)
        return Encoded(None, mask, cands, options, spec, sp, len(valid), valid)
