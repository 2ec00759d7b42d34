"""The DeepShare-style codec (``deepshare-v1``): observations of RL-base / RL-Hybrid and their actions.

The Gymnasium environment (:mod:`trainer.env`) and the deployed policies (:mod:`policies.rl`,
called by the simulator and by the Slurm controller) run the same :class:`DeepShareRound`, so
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
candidates (:mod:`policies.orders`: one waiting job per GPU demand, in the spec's
candidate order ``"area"``, ``"fill"`` or ``"plan"`` with aging time constant
:attr:`ObsSpec.aging_s`) times ``S`` placement options each. Channel ``k * S + s``
holds, on the free slots that option ``s`` of candidate ``k`` would take, the
job's predicted normalised speed there, ``isolated(shape) / CS / best_isolated``
in ``(0, 1]`` (locality and contention in one number), and 0 elsewhere; an
infeasible option is all 0. Channels ``K * S + 5 k + (0..4)`` broadcast candidate
``k``'s bandwidth, comm ratio, remaining time, demand (same normalisations as
channels 2, 3, 4, 7) and waiting time so far (``log1p(wait / 1 h) / log1p(64)``,
clipped) over the existing right-half slots. ``C = max(9, K * S + 5 K)``.

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
round. :attr:`Encoded.mask` marks the valid ones; "nothing" is invalid only when
no job runs and some placement is valid (holding an idle cluster can never
help and would deadlock a trace whose jobs all arrived).

Implementation
--------------
A :class:`DeepShareRound` is built once per round from its state and updated by each placement:
only the nodes a placement changes, the running jobs whose columns shift or whose slowdown
changes, and the placed job's demand group are re-encoded, so a round of ``m`` placements on a
cluster with ``R`` running jobs costs ``O(R + m * (jobs per node + K * S))`` Python steps. The
observation is available dense (``encode(dense=True)``) or as a :class:`SparseObs` that a
network's linear first layer evaluates without building the tensor (:meth:`DeepShareCodec.linear_plan`,
:meth:`Encoded.first_layer`). Balanced options come from a :class:`NodeIndex` (nodes bucketed by
free GPUs and multi-node load) and are memoised on the free GPUs and loads; option speeds are
memoised on the job's shape and the multi-node neighbours of its nodes. Contention (predicted
option speeds, multi-node loads, running jobs' slowdown after a start) is read only through
:class:`_RoundContention`, from one :class:`~policies.ledger.ContentionLedger`: a copy of the state's
(:meth:`~policies.state.ClusterState.contention`) with the round's starts added. A straightforward encoder in the tests
(``tests/oracles/deepshare_reference.py``) is the specification these must match bit for bit.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Sequence
from functools import partial
from dataclasses import asdict, dataclass, field
from typing import ClassVar

import numpy as np

from policies.cluster import ClusterSpec, Placement
from policies.codecs.base import Box, CodecError, Discrete
from policies.orders import AGING_S, CANDIDATE_ORDERS, LEGACY_AGING_S, CandidateOrder
from policies.ledger import JobKey
from policies.perf import ContentionModel
from policies.placement import sced2_pack
from policies.state import ClusterState, JobInfo
from policies.workloads import get_workload

__all__ = [
    "CAND_FEATURES",
    "LEFT_CHANNELS",
    "MAX_LEVELS",
    "DeepShareCodec",
    "DeepShareRound",
    "Encoded",
    "EncodingError",
    "NodeIndex",
    "ObsSpec",
    "SparseObs",
    "describe_layout",
]

LEFT_CHANNELS = 9
CAND_FEATURES = 5
#: Most balanced placement levels (``n = 1, 2, 4, 8`` nodes): :meth:`ObsSpec.for_cluster` uses
#: ``min(MAX_LEVELS, floor(log2 N) + 1)``.
MAX_LEVELS = 4
_HOUR = 3600.0
_REM_NORM = math.log1p(64.0)
_QUEUE_NORM = math.log1p(256.0)
_MEMO_MAX = 65536  # entries of each of the codec's memos before it is cleared


class EncodingError(CodecError):
    """The DeepShare spec is malformed or does not fit the cluster it is used on."""


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
    """The ``deepshare-v1`` spec: static shape of observations and actions for one cluster shape.

    :param num_nodes: ``N``.
    :param gpus_per_node: ``G``, the largest node's GPU count.
    :param total_gpus: GPUs of the cluster (normalises demands).
    :param k: candidate jobs.
    :param levels: balanced options per candidate (``n = 1, 2, 4, ...`` nodes).
    :param version: encoding version; bumped on any change of meaning.
    :param order: candidate order (:mod:`policies.orders`), ``"area"``, ``"fill"`` or ``"plan"``.
        A stored spec without this field uses ``"area"``.
    :param aging_s: aging time constant of the candidate order (s, finite, > 0): a job's
        remaining GPU-time key is multiplied by ``exp(-wait / aging_s)``. It changes nothing
        when every job has waited equally (all submitted together). A stored spec without this
        field uses :data:`~policies.orders.LEGACY_AGING_S` (1800 s).

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
    """An observation in structured form: what :class:`_LinearPlan` evaluates without the dense tensor.

    Fields (``G`` = ``spec.gpus_per_node``, ``N`` = ``spec.num_nodes``):

    :param queue: channel 8's value (queue length), broadcast over existing left-half slots
        (channel 0 is the constant 1 over the same slots).
    :param cand: candidate broadcast values; ``cand[i]`` fills channel ``K * S + i`` over
        every existing right-half slot.
    :param span_idx: the option cells as column spans. Span ``i`` writes value ``x > 0``
        into channel ``c``, node ``v``, right-half columns ``G + a .. G + b - 1``; it is stored
        as the row ``(c * N + v) * (G + 1) + b`` of a linear plan's right-prefix table with
        coefficient ``x``, followed, if ``a > 0``, by the same row with ``a`` and coefficient
        ``-x`` (the prefix row of column 0 is zero, so it is left out). ``span_coef`` holds
        the coefficients (:meth:`spans` decodes them).
    :param speeds: ``[K * S]`` predicted speed of each placement action (0 where infeasible).
    :param left_of: gives :attr:`left` (computed on first use); ``None`` for a round without a linear plan.
    """

    queue: float
    cand: list[float]
    span_idx: list[int]
    span_coef: list[float]
    speeds: list[float]
    left_of: Callable[[], np.ndarray] | None = field(default=None, repr=False)
    _left: np.ndarray | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def left(self) -> np.ndarray | None:
        """float64 ``[H]``: the running jobs' (channels 1..7) contribution to the first layer of the round's
        linear plan, summed; ``None`` for a round without a linear plan. Computed on first use, which must
        come before the round's next placement (:class:`ValueError` otherwise), and kept."""
        if self._left is None and self.left_of is not None:
            self._left = self.left_of()
        return self._left

    def spans(self, spec: ObsSpec) -> list[tuple[int, int, int, int, float]]:
        """``(channel, node, first column, end column, value)`` of each option span (right-half
        columns counted from 0), decoded from ``span_idx`` / ``span_coef``."""
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


@dataclass
class Encoded:
    """One encoded state of a :class:`DeepShareRound`: the observation, the valid-action mask and what
    the actions mean.

    :param obs: float32 ``spec.shape``, or ``None`` where the round encoded only ``sparse``.
    :param mask: bool ``[spec.n_actions]``.
    :param candidates: the ``<= K`` candidate jobs, in action order.
    :param options: ``options[k][s]``: placement of option ``s`` of candidate ``k`` or ``None``.
    :param spec: the spec.
    :param sparse: the observation in structured form.
    :param valid: the valid placement actions in increasing order.
    """

    obs: np.ndarray | None
    mask: np.ndarray
    candidates: list[JobInfo]
    options: list[Sequence[Placement | None]]
    spec: ObsSpec = field(repr=False)
    sparse: SparseObs = field(repr=False)
    valid: list[int] = field(repr=False)

    def action_speeds(self) -> np.ndarray:
        """float32 ``[K * S]``: predicted normalised speed of each placement action (0 if infeasible);
        the maximum of option channel ``a`` over its cells (all cells of an option hold the same value)."""
        return np.array(self.sparse.speeds).astype(np.float32)

    @property
    def any_placement(self) -> bool:
        return bool(self.valid)

    def first_layer(self, plan: _LinearPlan) -> np.ndarray:
        """float64 ``[H]``: a linear layer's pre-activation on this observation (:meth:`DeepShareCodec.linear_plan`;
        the round must have been begun with the same plan)."""
        return plan.first_layer(self.sparse)

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


def _job_id(j: JobInfo) -> str:
    return j.job_id


def _rem(job: JobInfo) -> float:
    return min(math.log1p(max(job.remaining_time, 0.0) / _HOUR) / _REM_NORM, 1.0)


class NodeIndex:
    """Nodes bucketed by free GPUs (and by multi-node load and free GPUs), index-sorted.

    Gives the balanced options (the first ``n`` nodes with room in the order least multi-node load,
    fewest free GPUs, index) and :func:`policies.placement.pack`'s placement without sorting or
    scanning all nodes: the cost depends on the GPUs per node and the jobs' node counts, not on
    the cluster size. Updated in place as a round places jobs (:meth:`update`).

    :param free: free GPUs per node; ``mload``: multi-node jobs per node.
    """

    def __init__(self, free: Sequence[int], mload: Sequence[int]) -> None:
        fr = np.asarray(free, dtype=np.int64)
        ml = np.asarray(mload, dtype=np.int64)
        if fr.shape != ml.shape or fr.ndim != 1:
            raise ValueError(f"free GPUs {fr.shape} and multi-node loads {ml.shape} must be one value per node")
        if fr.size and (fr.min() < 0 or ml.min() < 0):
            raise ValueError("free GPUs and multi-node loads must be >= 0")
        self.free = fr.tolist()
        self.mload = ml.tolist()
        self.fmax = int(fr.max()) if fr.size else 0
        self.total = int(fr.sum())
        # buckets by free GPUs, each index-sorted (a stable sort by free GPUs keeps index order)
        counts = np.bincount(fr, minlength=self.fmax + 1).tolist()
        by_f = np.argsort(fr, kind="stable").tolist()
        self._by_f: list[list[int]] = []
        end = 0
        for c in counts:
            self._by_f.append(by_f[end : end + c])
            end += c
        # buckets by (multi-node load, free GPUs), each index-sorted, in (load, free) order
        order = np.lexsort((np.arange(fr.size), fr, ml))
        m_o, f_o = ml[order], fr[order]
        cuts = (np.flatnonzero((m_o[1:] != m_o[:-1]) | (f_o[1:] != f_o[:-1])) + 1).tolist()
        nodes, m_l, f_l = order.tolist(), m_o.tolist(), f_o.tolist()
        self._by_mf: dict[tuple[int, int], list[int]] = {}
        self._loads: dict[int, int] = {}  # nodes per load
        self._fs: dict[int, list[int]] = {}  # per load, the free counts of its non-empty buckets, ascending
        for a, b in zip([0, *cuts], [*cuts, len(nodes)]) if nodes else ():
            m, f = m_l[a], f_l[a]
            self._by_mf[(m, f)] = nodes[a:b]
            self._loads[m] = self._loads.get(m, 0) + (b - a)
            self._fs.setdefault(m, []).append(f)
        self._load_order = sorted(self._loads)  # the loads present, ascending

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
        """:func:`policies.placement.pack` of a ``g``-GPU job on the current free GPUs
        (:func:`policies.placement.sced2_pack` on these buckets)."""
        return sced2_pack(g, _IndexCounts(self))


class _IndexCounts:
    """:class:`policies.placement.FreeCounts` of a :class:`NodeIndex`'s free-GPU buckets, with the nodes
    one packing has taken whole kept aside (the index is not changed)."""

    __slots__ = ("nix", "taken")

    def __init__(self, nix: NodeIndex) -> None:
        self.nix = nix
        self.taken: set[int] = set()

    def best_fit(self, need: int) -> int:
        by_f, taken = self.nix._by_f, self.taken
        for f in range(need, self.nix.fmax + 1):
            for v in by_f[f]:
                if v not in taken:
                    return v
        return -1

    def take_most(self) -> tuple[int, int]:
        by_f, taken = self.nix._by_f, self.taken
        for f in range(self.nix.fmax, 0, -1):
            for v in by_f[f]:
                if v not in taken:
                    taken.add(v)
                    return v, f
        return -1, 0

    def total(self) -> int:
        return self.nix.total


class _LinearPlan:
    """A linear layer ``x @ Wt + b`` (``Wt``: ``[C * N * 2G, H]``) prepared for :class:`SparseObs` observations
    of one spec and slot mask (:meth:`DeepShareCodec.linear_plan`).

    With ``W`` the layer viewed as ``[C, N, 2G, H]`` (float64 copies): ``const`` = bias + channel 0
    summed over existing left slots, ``queue`` = channel 8 summed over them, ``cand[i]`` = channel
    ``K*S + i`` summed over existing right slots, ``prefix[v, g, c]`` = channels 1..7 summed over
    left columns ``< g`` of node ``v`` and the right-prefix table the option channels summed over
    right-half columns ``< g`` (a span's sum by one subtraction). Running jobs' contributions
    (:meth:`job`) are memoised by value ``(feats, spans)``.
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
        self.H = H
        self.N, self.G2 = N, G2
        rp = np.zeros((base, N, G + 1, H), dtype=np.float64)
        np.cumsum(W[:base, :, G:, :].astype(np.float64), axis=2, out=rp[:, :, 1:, :])
        # the right-prefix rows (row (c * N + v) * (G + 1) + g), then the candidate rows, then the queue row
        self._table = np.concatenate([rp.reshape(-1, H), self.cand, self.queue[None, :]])
        self._cand_row = base * N * (G + 1)
        self._cand_pad = [0.0] * len(self.cand)
        self._jobs: dict[tuple, np.ndarray] = {}

    def job(self, key: tuple[tuple[float, ...], tuple[tuple[int, int, int], ...]]) -> np.ndarray:
        """Contribution ``[H]`` of one running job, ``key = (feats, spans)``: its values of channels 1..7
        over its visible slots ``(node, first column, end column)``."""
        v = self._jobs.get(key)
        if v is None:
            feats, spans = key
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
        """float64 ``[H]``: the layer's pre-activation on ``sp``: the option spans (prefix-sum rows,
        gathered) and the candidate and queue values (a slice of the table), each as a float32-rounded
        coefficient vector (the values the dense tensor holds) times those rows, plus the constant
        channels and the running jobs' summed contribution ``sp.left``."""
        left = sp.left
        if left is None:
            raise ValueError("the observation's round was begun without this linear plan")
        table = self._table
        # candidate and queue rows are the table's last rows (a slice; absent candidates' values 0).
        # Values rounded to float32 as the dense tensor holds them, converted in one call
        # (np.array(list, float32) rounds the same but converts Python floats one by one).
        cq = sp.cand + self._cand_pad[len(sp.cand) :]
        cq.append(sp.queue)
        ns = len(sp.span_coef)
        x = np.array(sp.span_coef + cq).astype(np.float32).astype(np.float64)
        h = np.dot(x[ns:], table[self._cand_row :])
        if ns:
            h += np.dot(x[:ns], table.take(sp.span_idx, axis=0))
        h += self.const
        h += left
        return h


class DeepShareCodec:
    """The ``deepshare-v1`` codec for one cluster (see the module docstring).

    :param cluster: the cluster the policy runs on.
    :param perf: the performance model that predicts options' speeds and running jobs' slowdowns.
    :param spec: observation spec; defaults to :meth:`ObsSpec.for_cluster`. A spec from a
        checkpoint is checked against ``cluster``.

    The codec holds memos (options by free GPUs and loads, option speeds by shape and neighbours,
    interned placements) shared by its rounds; they are caches of pure functions, so every round
    is a function of its state alone.
    """

    name: ClassVar[str] = "deepshare-v1"

    def __init__(self, cluster: ClusterSpec, perf: ContentionModel, spec: ObsSpec | None = None) -> None:
        self.cluster = cluster
        self.perf = perf
        self.spec = spec or ObsSpec.for_cluster(cluster)
        self.spec.check_cluster(cluster)
        #: the candidate order (rl-hybrid's safety rule walks the whole queue in it)
        self.order = CandidateOrder(self.spec.order, self.spec.k, self.spec.aging_s, cluster.gpus_per_node)
        self._link = cluster.inter_bw_gbps * 1000.0
        self._logtot = math.log2(1 + cluster.total_gpus)
        G = self.spec.gpus_per_node
        caps = np.array(cluster.gpus_per_node, dtype=np.int64)
        exists = (np.arange(G)[None, :] < caps[:, None]).astype(np.float32)  # [N, G]
        exists.flags.writeable = False
        self._exists = exists
        self._mf: dict[str, tuple[float, float]] = {}
        self._small = max(cluster.gpus_per_node, default=0) < 32768  # free / load fit in an int16
        self._opt_memo: dict[tuple[int, bytes], tuple[Placement | None, ...]] = {}
        self._placements: dict[tuple, Placement] = {}  # balanced placements (immutable, shared)
        self._levels: dict[int, list[tuple[int, int] | None]] = {}  # balanced levels by demand
        self._sigs: dict[tuple, int] = {}  # neighbour tuples -> ids (_signature)
        self._next_sid = 0
        self._single: dict[tuple[str, int], float] = {}  # single-node option speeds by (model, demand)
        self._mspeed: dict[tuple, float] = {}  # multi-node option speeds
        self._plan_key = (self.name, self.spec, exists.tobytes())

    # ------------------------------------------------------------------ the codec protocol
    @classmethod
    def spec_from_dict(cls, d: dict) -> ObsSpec:
        """The spec stored by :meth:`ObsSpec.to_dict` (:class:`EncodingError` if malformed)."""
        return ObsSpec.from_dict(d)

    @property
    def observation_space(self) -> Box:
        return Box(self.spec.shape, np.float32, 0.0, 1.0)

    @property
    def action_space(self) -> Discrete:
        return Discrete(self.spec.n_actions)

    @property
    def exists(self) -> np.ndarray:
        """float32 ``[N, G]`` (read-only): 1 where a node has that GPU slot (channel 0's left half)."""
        return self._exists

    def begin(self, state: ClusterState, linear: _LinearPlan | None = None) -> DeepShareRound:
        """A round on ``state`` (not modified).

        :param linear: a linear plan of this codec (:meth:`linear_plan`): the round then keeps the
            running jobs' contribution to it, summed, in every encoding's ``sparse.left``, so that
            :meth:`Encoded.first_layer` evaluates the layer without the dense tensor.
        """
        return DeepShareRound(self, state, linear)

    # ------------------------------------------------------------------ network evaluation
    @property
    def plan_key(self) -> tuple:
        """What a linear plan depends on besides the layer (name, spec and slot mask): a network caches its
        plans under it."""
        return self._plan_key

    def linear_plan(self, layer: tuple[np.ndarray, np.ndarray]) -> _LinearPlan:
        """A linear layer ``(Wt [C * N * 2G, H], b [H])`` prepared to be evaluated on this codec's structured
        observations (:meth:`Encoded.first_layer`): exact algebra on the layer (constant channels as
        precomputed sums, option spans as differences of prefix sums, running jobs as memoised per-job
        sums), equal to ``obs.reshape(-1) @ Wt + b`` of the dense observation up to float rounding."""
        return _LinearPlan(layer, self.spec, self._exists)

    # ------------------------------------------------------------------ features and options (memoised)
    def _model_feats(self, model: str) -> tuple[float, float]:
        """``(bandwidth / link, comm ratio r / (1 + r))`` of a model (pure functions of the model and the link)."""
        v = self._mf.get(model)
        if v is None:
            w = get_workload(model)
            r = w.comm_comp
            v = self._mf[model] = (min(w.bandwidth_mbps / self._link, 1.0), r / (1.0 + r))
        return v

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

    def _cand_feats(self, job: JobInfo, now: float) -> tuple[float, ...]:
        """A candidate's five broadcast values at time ``now`` (s) (see the module docstring)."""
        wait = min(math.log1p(max(now - job.submit_time, 0.0) / _HOUR) / _REM_NORM, 1.0)
        bw, cc = self._model_feats(job.model)
        return (bw, cc, _rem(job), math.log2(1 + job.gpu_demand) / self._logtot, wait)

    def _okey(self, free: np.ndarray, loads: bytes) -> bytes:
        """Options-memo key of free GPUs and multi-node loads (``loads``: :meth:`_RoundContention.loads`)."""
        if self._small:
            return free.astype(np.int16).tobytes() + loads
        return free.tobytes() + loads

    def _options(self, g: int, nix: NodeIndex) -> tuple[Placement | None, ...]:
        """The ``S`` placement options of a ``g``-GPU job on the free GPUs of ``nix`` (module docstring)."""
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

    def _signature(self, keys: Sequence[JobKey]) -> int:
        """A small int naming the neighbour tuple ``keys`` (0 for none), stable for this codec.

        Ids are never reused (a live round may still hold ids of tuples the memo dropped).
        """
        if not keys:
            return 0
        t = tuple(keys)
        sid = self._sigs.get(t)
        if sid is None:
            if len(self._sigs) >= _MEMO_MAX:  # speed entries under dropped ids go too
                self._sigs.clear()
                self._mspeed.clear()
            self._next_sid += 1
            sid = self._sigs[t] = self._next_sid
        return sid


class _RoundContention:
    """The contention a round's encodings and placements read, all of it from one
    :class:`~policies.ledger.ContentionLedger`: a copy of the state's own
    (:meth:`ClusterState.contention <policies.state.ClusterState.contention>`: the one a backend keeps and
    hands in, else built from the running jobs in running order; O(jobs + loaded nodes)), to which the round
    adds its multi-node starts. Single-node starts use no network link: they change no CS and no multi-node load.

    The only code of the codec that reads contention:

    * the predicted speed of a placement option (:meth:`single_speed`, :meth:`multi_speed`:
      ``isolated(shape) / CS / best_isolated``, CS the ledger's :meth:`~policies.ledger.ContentionLedger.price`
      of the option with each node's multi-node neighbours summed in job-id order);
    * every node's number of multi-node jobs (:meth:`loads`, :meth:`load_list`, :meth:`load`: the ledger's
      counts), which orders the balanced options' nodes and keys the options memo;
    * the slowdown of the running multi-node jobs a start touches (:meth:`start`: their CS in the ledger
      after adding the started job, each summed in the ledger's order: the backend's start order, which is
      the order of the state's running jobs, then the round's starts).

    Memoised: single-node speeds by shape; multi-node speeds by shape and the neighbour signatures of the
    nodes (:meth:`DeepShareCodec._signature` of the ledger's :meth:`~policies.ledger.ContentionLedger.node_keys`
    in job-id order, computed per node on first use and dropped for the nodes a start touches).

    :param codec: the codec (its memos and performance model).
    :param state: the round's state (its contention ledger is copied, not changed).
    """

    def __init__(self, codec: DeepShareCodec, state: ClusterState) -> None:
        self.codec, self.perf = codec, codec.perf
        N = codec.spec.num_nodes
        # a copy, not a fork: a backend may apply the round's placements to its own ledger while the round goes on
        self.ledger = state.contention(self.perf).copy()
        # a node's multi-node jobs (<= its GPUs) fit in a byte where the ledger keeps them so
        self._bytes = codec.spec.gpus_per_node <= 255 and self.ledger.load_bytes() is not None
        self._sig: list[int | None] = [None] * N  # per node, the signature of its neighbours' keys in id order
        self._pspeed: dict[tuple, tuple[Placement, float]] = {}  # multi-node option speeds while signatures hold

    def loads(self) -> bytes:
        """Every node's number of multi-node jobs as bytes (one byte per node where every node has at most
        255 GPUs, else 8): part of the options-memo key."""
        if self._bytes:
            return self.ledger.load_bytes()  # type: ignore[return-value]
        return np.array(self.load_list(), dtype=np.int64).tobytes()

    def load_list(self) -> list[int]:
        """Every node's number of multi-node jobs, in node order."""
        if self._bytes:
            return list(self.ledger.load_bytes())  # type: ignore[arg-type]
        load = self.ledger.load
        return [load(v) for v in range(len(self._sig))]

    def load(self, v: int) -> int:
        """Number of multi-node jobs on node ``v``."""
        return self.ledger.load(v)

    def _sigs(self, nodes: Sequence[int]) -> frozenset[int]:
        """The neighbour signatures of ``nodes``."""
        sig = self._sig
        out = []
        for v in nodes:
            s = sig[v]
            if s is None:
                s = sig[v] = self.codec._signature(self.ledger.node_keys(v, by_id=True))
            out.append(s)
        return frozenset(out)

    def single_speed(self, job: JobInfo) -> float:
        """Predicted normalised speed of ``job`` on one node (no contention: only multi-node jobs share links)."""
        key = (job.model, job.gpu_demand)
        v = self.codec._single.get(key)
        if v is None:
            perf = self.perf
            iso = perf.isolated_throughput(job.model, job.gpu_demand, 1)
            best = perf.best_isolated_throughput(job.model, job.gpu_demand)
            v = self.codec._single[key] = float(min(iso / max(best, 1e-12), 1.0))
        return v

    def multi_speed(self, job: JobInfo, p: Placement) -> float:
        """Predicted normalised speed of ``job`` on the multi-node placement ``p``."""
        pk = (id(p), job.model, job.gpu_demand)
        e = self._pspeed.get(pk)
        if e is not None and e[0] is p:
            return e[1]
        codec = self.codec
        key = (job.model, job.gpu_demand, p.total_gpus, p.num_nodes, self._sigs(p.nodes))
        speed = codec._mspeed.get(key)
        if speed is None:
            perf = self.perf
            cs = self.ledger.price(job.model, p, by_id=True)
            iso = perf.isolated_throughput(job.model, p.total_gpus, p.num_nodes)
            best = perf.best_isolated_throughput(job.model, job.gpu_demand)
            if len(codec._mspeed) >= _MEMO_MAX:
                codec._mspeed.clear()
            speed = codec._mspeed[key] = float(min(iso / cs / max(best, 1e-12), 1.0))
        self._pspeed[pk] = (p, speed)
        return speed

    def start(self, job: JobInfo, p: Placement, pos: dict[str, int]) -> list[tuple[int, float]]:
        """Add ``job``, just started on ``p``, to the ledger when ``p`` spans several nodes; returns
        ``(running index, CS)`` of every multi-node job on ``p``'s nodes, itself included, in running order
        (``pos``: running index by job id); ``[]`` for a single-node start (it slows nobody)."""
        if len(p.alloc) <= 1:
            return []
        led = self.ledger
        led.add(job.job_id, job.model, p)
        for v in p.nodes:
            self._sig[v] = None  # its neighbours changed
        self._pspeed.clear()
        touched = {o for v in p.nodes for o in led.neighbours(v)}
        return sorted((pos[o], led.cs(o)) for o in touched)


class DeepShareRound:
    """One scheduling round of :class:`DeepShareCodec`: a state, the placements taken from it, their encodings.

    Built once from the round's state; :meth:`place` applies a placement (free GPUs, the job running
    with its isolated / achieved throughput, the achieved throughput of multi-node neighbours whose
    contention changes, the job off the queue) and updates only what it changes: per-node used GPUs,
    multi-node load and neighbour keys of the placement's nodes; for the running jobs on those nodes
    (their left-half columns may shift) and the multi-node jobs whose contention changed (their
    slowdown feature), their features, slot spans and linear-plan contribution; and the placed job's
    demand group among the candidates (:class:`~policies.orders.RoundQueue`).

    :param codec: the codec.
    :param state: the round's initial state (not modified).
    :param linear: :meth:`DeepShareCodec.linear_plan` to keep the running jobs' contribution for
        (``None``: none; :meth:`Encoded.first_layer` is then unavailable).
    """

    def __init__(self, codec: DeepShareCodec, state: ClusterState, linear: _LinearPlan | None = None) -> None:
        spec = codec.spec
        N, G = spec.num_nodes, spec.gpus_per_node
        if len(state.free_gpus) != N:
            raise EncodingError(f"state has {len(state.free_gpus)} nodes, the codec expects {N}")
        self.codec, self.plan = codec, linear
        self.time, self.cluster, self.usable = state.time, state.cluster, state.usable
        self._pending = state.pending
        self.queue = codec.order.round(state.pending, state.time)
        self.free = np.asarray(state.free_gpus, dtype=np.int64).copy()
        self._free_total = int(self.free.sum())
        self.used = [0] * N
        self.running: list[JobInfo] = list(state.running)  # running order; starts append
        # built at the round's first start (_index): running index by job id, running job ids per node
        # in id order and their GPUs there
        self._pos: dict[str, int] | None = None
        self._node_ids: list[list[str]] = []
        self._node_c: list[dict[str, int]] = []
        # per running job: its left-half values of channels 1..7 and its visible slots (node, first
        # column, end column), as one key of the linear plan's job memo
        self._js: dict[str, tuple[tuple[float, ...], tuple[tuple[int, int, int], ...]]] = {}
        self._cf: dict[str, tuple[float, ...]] = {}  # candidates' broadcast features (fixed within the round)
        self._started: set[int] = set()  # ids of the JobInfo objects started this round
        self._waiting: dict[str, JobInfo] | None = None  # job id -> waiting job (built on first need)
        self._cands: list[JobInfo] = []  # the last encoding's candidates
        self._state: ClusterState | None = None
        used = self.used
        js = self._js
        feats_of = codec._job_feats
        for j in sorted(self.running, key=_job_id):  # id order: the left half's column order
            p = j.placement
            if p is None:
                continue
            jid = j.job_id
            multi = p.num_nodes > 1
            spans = []
            for v, c in p.alloc:
                a = used[v]
                b = used[v] = a + c
                if b > G:  # noqa: PLR1730 (cheaper than min() in this loop)
                    b = G
                if b > a:
                    spans.append((v, a, b))
            js[jid] = (feats_of(j, multi), tuple(spans))
        # the running jobs' linear-plan contributions, row i for running[i] (built when an encoding's
        # `left` is first read, then kept by placement); placements so far; the last `left`
        self._contrib: np.ndarray | None = None
        self._version = 0
        self._left_memo: tuple[int, np.ndarray] | None = None
        self._cont = _RoundContention(codec, state)
        self._nodes: NodeIndex | None = None  # built at the first options-memo miss

    # ------------------------------------------------------------------ internals
    def _left(self, version: int) -> np.ndarray:
        """The running jobs' summed linear-plan contribution after ``version`` placements (the current number)."""
        if version != self._version:
            raise ValueError("the encoding is stale: its round has placed a job since")
        memo = self._left_memo
        if memo is not None and memo[0] == version:
            return memo[1]
        if self._contrib is None:
            job, js, zero = self.plan.job, self._js, np.zeros(self.plan.H)
            rows = [job(k) if (k := js.get(j.job_id)) is not None and k[1] else zero for j in self.running]
            self._contrib = np.array(rows, dtype=np.float64).reshape(len(rows), self.plan.H)
        left = np.add.reduce(self._contrib[: len(self.running)], axis=0)  # == .sum(axis=0), without the wrapper
        self._left_memo = (version, left)
        return left

    def _set_row(self, jid: str) -> None:
        """Store running job ``jid``'s linear-plan contribution (its features and spans as they are now), once
        the rows exist."""
        if self._contrib is None:
            return
        row = self._pos[jid]
        if row >= len(self._contrib):
            grown = np.zeros((max(16, 2 * row), self.plan.H), dtype=np.float64)
            grown[: len(self._contrib)] = self._contrib
            self._contrib = grown
        key = self._js[jid]
        self._contrib[row] = self.plan.job(key) if key[1] else 0.0

    def _offsets(self, v: int) -> dict[str, int]:
        """First left-half column of each running job on node ``v`` (before clipping to ``G``)."""
        out: dict[str, int] = {}
        a = 0
        cs = self._node_c[v]
        for jid in self._node_ids[v]:
            out[jid] = a
            a += cs[jid]
        return out

    def _index(self) -> None:
        """Build the structures only starts need (:attr:`_pos`, :attr:`_node_ids`, :attr:`_node_c`) from the
        running jobs, before the round's first start."""
        self._pos = {j.job_id: i for i, j in enumerate(self.running)}
        N = self.codec.spec.num_nodes
        node_ids: list[list[str]] = [[] for _ in range(N)]
        node_c: list[dict[str, int]] = [{} for _ in range(N)]
        for j in sorted(self.running, key=_job_id):
            p = j.placement
            if p is not None:
                jid = j.job_id
                for v, c in p.alloc:
                    node_ids[v].append(jid)
                    node_c[v][jid] = c
        self._node_ids, self._node_c = node_ids, node_c

    def _node_index(self) -> NodeIndex:
        if self._nodes is None:
            self._nodes = NodeIndex(self.free.tolist(), self._cont.load_list())
        return self._nodes

    def _waiting_job(self, job_id: str) -> JobInfo:
        for j in self._cands:
            if j.job_id == job_id and id(j) not in self._started:
                return j
        if self._waiting is None:
            self._waiting = {}
            for j in self._pending:
                self._waiting.setdefault(j.job_id, j)
        j = self._waiting.get(job_id)
        if j is None or id(j) in self._started:
            raise ValueError(f"job {job_id} is not waiting")
        return j

    # ------------------------------------------------------------------ the round protocol
    def encode(self, dense: bool = True) -> Encoded:
        """The current state encoded: candidates (:meth:`~policies.orders.RoundQueue.candidates`), mask,
        options and the observation (dense when ``dense``; always as :class:`SparseObs`)."""
        codec = self.codec
        spec = codec.spec
        N, G, S = spec.num_nodes, spec.gpus_per_node, spec.options
        G1 = G + 1
        NG1 = N * G1
        now = self.time
        cands = self.queue.candidates(self._free_total)
        self._cands = cands
        q = min(math.log1p(self.queue.left) / _QUEUE_NORM, 1.0)
        free, used = self.free, self.used
        cont = self._cont
        okey = codec._okey(free, cont.loads())
        memo = codec._opt_memo
        cf_memo = self._cf
        valid: list[int] = []
        options: list[Sequence[Placement | None]] = []
        idx: list[int] = []  # span end / start rows, in pairs
        coef: list[float] = []  # +value / -value
        cf: list[float] = []
        speeds = [0.0] * (spec.k * S)
        for k, job in enumerate(cands):
            g = job.gpu_demand
            opts = memo.get((g, okey))
            if opts is None:
                opts = codec._options(g, self._node_index())
                if len(memo) >= _MEMO_MAX:
                    memo.clear()
                memo[(g, okey)] = opts
            options.append(opts)
            sspeed = None
            ch = k * S - 1
            for p in opts:
                ch += 1
                if p is None:
                    continue
                valid.append(ch)
                alloc = p.alloc
                if len(alloc) == 1:  # single node: speed by shape only
                    if sspeed is None:
                        sspeed = cont.single_speed(job)
                    speed = sspeed
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
                speed = cont.multi_speed(job, p)
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
                f = cf_memo[job.job_id] = codec._cand_feats(job, now)
            cf.extend(f)
        mask = np.zeros(spec.n_actions, dtype=bool)
        if valid:
            mask[valid] = True
        mask[spec.noop] = bool(self.running) or not valid
        left_of = partial(self._left, self._version) if self.plan is not None else None
        sp = SparseObs(q, cf, idx, coef, speeds, left_of)
        return Encoded(self._dense(sp) if dense else None, mask, cands, options, spec, sp, valid)

    def _dense(self, sp: SparseObs) -> np.ndarray:
        """The float32 ``spec.shape`` observation of the current state (its option cells and candidate and
        queue values from ``sp``)."""
        spec = self.codec.spec
        G = spec.gpus_per_node
        exists = self.codec._exists
        obs = np.zeros(spec.shape, dtype=np.float32)
        obs[0, :, :G] = exists
        sv: list[int] = []  # per occupied slot: node, column, index of its job's feature row
        sg: list[int] = []
        sj: list[int] = []
        rows: list[tuple[float, ...]] = []
        for feats, spans in self._js.values():
            if not spans:
                continue
            r = len(rows)
            rows.append(feats)
            for v, a, b in spans:
                sv.extend([v] * (b - a))
                sg.extend(range(a, b))
                sj.extend([r] * (b - a))
        if sv:
            obs[1:8, sv, sg] = np.asarray(rows, dtype=np.float32)[sj].T
        obs[8, :, :G] = exists * sp.queue
        for c, v, a, b, x in sp.spans(spec):
            obs[c, v, G + a : G + b] = np.float32(x)
        if sp.cand:
            base = spec.k * spec.options
            vals = np.asarray(sp.cand, dtype=np.float32)
            obs[base : base + len(sp.cand), :, G:] = exists[None, :, :] * vals[:, None, None]
        return obs

    def place(self, job_id: str, p: Placement) -> None:
        """Start waiting job ``job_id`` on ``p``.

        :raises ValueError: the job is not waiting in this round, or ``p`` does not fit the free GPUs.
        """
        job = self._waiting_job(job_id)
        free = self.free
        N = len(free)
        for v, c in p.alloc:
            if not (0 <= v < N and c <= free[v]):
                raise ValueError(f"placement {p} of job {job.job_id} does not fit free GPUs {free.tolist()}")
        if self._pos is None:
            self._index()
        if job.job_id in self._pos:
            raise ValueError(f"job {job.job_id} is already running")
        self.queue.started(job)
        self._version += 1
        self._started.add(id(job))
        self._state = None
        self._cands = []
        self._start(job, p)

    def _start(self, job: JobInfo, p: Placement) -> None:
        """The cluster side of :meth:`place` (``job`` checked waiting, ``p`` checked to fit)."""
        codec = self.codec
        G = codec.spec.gpus_per_node
        perf = codec.perf
        free = self.free
        for v, c in p.alloc:
            free[v] -= c
        self._free_total -= p.total_gpus
        iso = perf.isolated_throughput(job.model, p.total_gpus, p.num_nodes)
        new = object.__new__(JobInfo)  # == JobInfo(**{**job.__dict__, ...}) without re-validating
        new.__dict__.update(job.__dict__)
        new.placement, new.isolated_thp, new.achieved_thp, new.start_time = p, iso, iso, self.time
        idx = len(self.running)
        self.running.append(new)
        jid = new.job_id
        self._pos[jid] = idx
        cont = self._cont
        for v, c in p.alloc:
            ids = self._node_ids[v]
            ids.insert(bisect.bisect_right(ids, jid), jid)
            self._node_c[v][jid] = c
            self.used[v] += c
        touched = cont.start(new, p, self._pos)
        if self._nodes is not None:
            for v, _c in p.alloc:
                self._nodes.update(v, int(free[v]), cont.load(v))
        changed: set[str] = {jid}
        if touched:
            run = self.running
            for i, cs in touched:
                j = run[i]
                jp = j.placement
                iso_j = j.isolated_thp or perf.isolated_throughput(j.model, jp.total_gpus, jp.num_nodes)
                new_j = object.__new__(JobInfo)  # == JobInfo(**{**j.__dict__, ...})
                new_j.__dict__.update(j.__dict__)
                new_j.isolated_thp, new_j.achieved_thp = iso_j, iso_j / cs
                run[i] = new_j
                changed.add(j.job_id)
        moved: set[str] = set()  # jobs after the new one on its nodes: their columns shift
        for v, _c in p.alloc:
            ids = self._node_ids[v]
            moved.update(ids[ids.index(jid) + 1 :])
        offs: dict[int, dict[str, int]] = {}
        feats_of = codec._job_feats
        js = self._js
        for x in changed | moved:
            j = self.running[self._pos[x]]
            jp = j.placement
            feats, spans_t = js.get(x, (None, ()))
            if x in changed:
                feats = feats_of(j, len(jp.alloc) > 1)
            if x in moved or x == jid:
                spans = []
                for v, c in jp.alloc:
                    o = offs.get(v)
                    if o is None:
                        o = offs[v] = self._offsets(v)
                    a = o[x]
                    b = min(a + c, G)
                    if b > a:
                        spans.append((v, a, b))
                spans_t = tuple(spans)
            js[x] = (feats, spans_t)
            self._set_row(x)

    def state(self) -> ClusterState:
        """The round's current state: its free GPUs, running jobs (with their throughputs) and the jobs still
        waiting, in arrival order (a new object)."""
        if self._state is None:
            started = self._started
            pending = [j for j in self._pending if id(j) not in started] if started else list(self._pending)
            self._state = ClusterState(self.time, self.cluster, self.free.copy(), list(self.running), pending, self.usable)
        return self._state

    def queue_order(self) -> list[JobInfo]:
        """Every job still waiting, in the candidate order (:meth:`~policies.orders.CandidateOrder.queue_order`
        with the round's plan)."""
        return self.queue.queue_order(self._free_total)

    @property
    def total_free(self) -> int:
        """Free GPUs of the cluster now."""
        return self._free_total

    @property
    def waiting(self) -> int:
        """Jobs still waiting."""
        return self.queue.left
