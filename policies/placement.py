"""Placement rules: given a job and free GPUs per node, choose a placement.

Every rule is a callable ``rule(job, free, state) -> Placement | None`` that
never mutates ``free`` (an int array ``[num_nodes]``). ``state`` is the
:class:`~policies.state.ClusterState` for rules that look at co-located jobs;
they read contention from its ledger (:meth:`~policies.state.ClusterState.contention`).

Searches over nodes run on a byte copy of ``free`` (one byte per node, when every
count is in ``[0, 255]``; ``bytes.find`` is a C scan), so a rule costs O(nodes)
machine work plus O(nodes it picks) Python work, not a Python loop over the cluster.
"""

from __future__ import annotations

import math
import operator
from typing import Any, Callable, Mapping, NamedTuple, Protocol

import numpy as np

from policies.cluster import Placement
from policies.ledger import ContentionLedger, job_key
from policies.perf import ContentionModel
from policies.state import ClusterState, JobInfo

__all__ = [
    "PlacementRule",
    "pack",
    "sced2_pack",
    "FreeCounts",
    "spread",
    "ContentionAwarePlacement",
    "SpanningSearch",
    "quiet_counts",
    "neighbour_loss",
    "FloorPacking",
    "SWITCH_GAIN",
    "balanced_candidates",
    "balanced_by_load",
    "PLACEMENT_RULES",
    "safety_fill",
]


class PlacementRule(Protocol):
    def __call__(self, job: JobInfo, free: np.ndarray, state: ClusterState) -> Placement | None: ...


def _total(free: np.ndarray, state: ClusterState | None) -> int:
    """Sum of ``free`` (the state's :attr:`~policies.state.ClusterState.total_free` for its own array)."""
    if state is not None and free is state.free_gpus:
        return state.total_free
    return int(free.sum())


#: Up to this many nodes a free array is read as a Python list (cheaper than numpy calls).
_SMALL = 64


def _as_bytes(free: np.ndarray, state: ClusterState | None = None) -> tuple[np.ndarray, int, bytes | None]:
    """``(free as an array, bound, one byte per node)``: ``bound`` is at least every count (the
    bitwise or of them all) and the bytes are ``None`` unless every count is an integer in
    ``[0, 255]`` (then callers search with numpy and ``bound`` is the largest count). For the
    state's own ``free_gpus``, its :meth:`~policies.state.ClusterState.free_bytes`."""
    if state is not None and free is state.free_gpus:
        got = state.free_bytes()
        if got is not None:
            return free, got[1], got[0]
    arr = np.asarray(free)
    if 0 < arr.size <= _SMALL and arr.dtype.kind in "iu":
        counts = arr.tolist()
        hi = max(counts)
        if hi <= 255 and min(counts) >= 0:
            return arr, hi, bytes(counts)
        return arr, hi, None
    if arr.size == 0:
        return arr, 0, None
    if arr.dtype.kind in "iu":
        bound = int(np.bitwise_or.reduce(arr))  # >= max, and negative if any count is
        if 0 <= bound <= 255:
            return arr, bound, arr.astype(np.uint8).tobytes()
    return arr, int(arr.max()), None


def pack(job: JobInfo, free: np.ndarray, state: ClusterState | None = None) -> Placement | None:
    """Packing placement (seed 003, SCED2): as few nodes, as few free GPUs as possible
    (:func:`sced2_pack` on ``free``; a Python list of at most ``_SMALL`` nodes, else bytes or an array)."""
    if 0 < len(free) <= _SMALL:
        counts = np.asarray(free).tolist()
        if type(counts[0]) is int:
            return sced2_pack(job.gpu_demand, _ListCounts(counts))
    need = job.gpu_demand
    if state is not None and free is state.free_gpus:
        got = state.__dict__.get("_free_bytes")  # state.free_bytes() where a backend handed the bytes in
        got = got[1] if got is not None and got[0] is free else state.free_bytes()
        if got is not None:  # sced2_pack's first step (one node that covers the demand) inline
            fb, bound = got
            find = fb.find
            for f in range(need, bound + 1):
                n = find(_BYTES[f])
                if n >= 0:  # one_node(n, need)
                    p = _new(Placement)
                    p.__dict__.update(alloc=((n, need),), total_gpus=need, nodes=(n,), num_nodes=1)
                    return p
            # no node covers the demand (sced2_pack's first step, done above)
            return sced2_pack(need, _ByteCounts(fb, bound, free, state, state.total_free), first=-1)
    return _pack(need, *_as_bytes(free, state), state)


_new = object.__new__
_node_of = operator.itemgetter(0)  # a (node, GPUs) pair's node


def one_node(node: int, gpus: int) -> Placement:
    """``Placement(((node, gpus),))`` (``gpus`` > 0), its fields set directly (the common placement of a
    packing rule, made once per scheduled job)."""
    p = _new(Placement)
    p.__dict__.update(alloc=((node, gpus),), total_gpus=gpus, nodes=(node,), num_nodes=1)
    return p


class FreeCounts(Protocol):
    """Free GPUs per node as :func:`sced2_pack` reads them: a scratch view it may change (nodes taken
    whole), not the cluster's free GPUs."""

    def best_fit(self, need: int) -> int:
        """The node with the fewest free GPUs that are at least ``need`` (lowest index on ties), or -1."""

    def take_most(self) -> tuple[int, int]:
        """``(node, its free GPUs)`` of the node with the most free GPUs (lowest index on ties), which
        is then taken whole (0 free from now on); ``(-1, 0)`` if no node has a free GPU."""

    def total(self) -> int:
        """Free GPUs of all nodes (before any :meth:`take_most`)."""


def sced2_pack(need: int, counts: FreeCounts, *, first: int | None = None) -> Placement | None:
    """SCED2 packing (seed 003) of ``need`` GPUs: repeatedly take the node with the fewest free GPUs
    that covers the rest of the demand (lowest index on ties); if none can, take the node with the
    most free GPUs (lowest index on ties) whole and loop. ``None`` if fewer than ``need`` GPUs are free.
    ``first``: ``counts.best_fit(need)`` where the caller has it already.

    The one implementation of the algorithm: :func:`pack` runs it on the free GPUs as bytes or as an
    array, :class:`policies.codecs.deepshare.NodeIndex` on its buckets of nodes by free GPUs.
    """
    n = counts.best_fit(need) if first is None else first
    if n >= 0:
        return one_node(n, need)
    total = need
    if need > counts.total():
        return None
    alloc: list[tuple[int, int]] = []
    while n < 0:  # every node has fewer than `need` free GPUs: the fullest one goes whole
        n, take = counts.take_most()
        if take <= 0:
            return None
        alloc.append((n, take))
        need -= take
        n = counts.best_fit(need)
    alloc.append((n, need))
    alloc.sort()  # distinct nodes (those taken whole have 0 left), counts > 0
    p = _new(Placement)  # Placement(tuple(alloc)), its fields set directly
    p.__dict__.update(alloc=tuple(alloc), total_gpus=total, nodes=tuple(map(_node_of, alloc)), num_nodes=len(alloc))
    return p


class _ByteCounts:
    """:class:`FreeCounts` of one byte per node (``bound``: at least every count); searches are
    ``bytes.find`` (C scans) on the bytes as given, never copied. A node taken whole keeps its byte:
    :func:`sced2_pack` takes nodes at a count that only falls, each time the first node of the largest
    count left, so the nodes taken at the count ``at`` of the last take are the first ones of that count
    (a search for it starts after the last one, ``start``), every node of a larger count is taken, and
    no node of a smaller count is."""

    __slots__ = ("avail", "hi", "arr", "state", "at", "start", "sum")

    def __init__(self, fb: bytes, bound: int, arr: np.ndarray, state: ClusterState | None,
                 total: int | None = None) -> None:
        self.avail: bytes = fb
        self.hi, self.arr, self.state = bound, arr, state
        self.at = -1  # the count of the last node taken (-1: none taken)
        self.start = 0  # the node after it
        self.sum = total  # the free GPUs of all nodes, where the caller has them

    def best_fit(self, need: int) -> int:
        find, at = self.avail.find, self.at
        for f in range(need, self.hi + 1):
            n = find(_BYTES[f], self.start) if f == at else find(_BYTES[f])
            if n >= 0:
                return n
        return -1

    def take_most(self) -> tuple[int, int]:
        find, hi, at = self.avail.find, self.hi, self.at
        while hi > 0:
            n = find(_BYTES[hi], self.start) if hi == at else find(_BYTES[hi])
            if n >= 0:
                break
            hi -= 1
        self.hi = hi
        if hi <= 0:
            return -1, 0
        self.at, self.start = hi, n + 1
        return n, hi

    def total(self) -> int:
        return _total(self.arr, self.state) if self.sum is None else self.sum


class _ListCounts:
    """:class:`FreeCounts` of a Python list of free GPUs per node (a small cluster: no numpy call)."""

    __slots__ = ("avail",)

    def __init__(self, counts: list[int]) -> None:
        self.avail = counts

    def best_fit(self, need: int) -> int:
        best, fewest = -1, 0
        for n, c in enumerate(self.avail):
            if c >= need and (best < 0 or c < fewest):
                best, fewest = n, c
        return best

    def take_most(self) -> tuple[int, int]:
        avail = self.avail
        n = max(range(len(avail)), key=avail.__getitem__)  # the first of the largest
        take = avail[n]
        if take <= 0:
            return -1, 0
        avail[n] = 0
        return n, take

    def total(self) -> int:
        return sum(self.avail)


class _ArrayCounts:
    """:class:`FreeCounts` of an array of free GPUs (counts beyond a byte); searches are numpy scans."""

    __slots__ = ("arr", "avail", "state")

    def __init__(self, arr: np.ndarray, state: ClusterState | None) -> None:
        self.arr, self.state = arr, state
        self.avail = arr.astype(np.int64)

    def best_fit(self, need: int) -> int:
        avail = self.avail
        ok = np.flatnonzero(avail >= need)
        if ok.size:
            return int(ok[np.argmin(avail[ok])])  # argmin takes the lowest index on ties
        return -1

    def take_most(self) -> tuple[int, int]:
        avail = self.avail
        if not avail.size:
            return -1, 0
        n = int(np.argmax(avail))
        take = int(avail[n])
        avail[n] = 0
        return n, take

    def total(self) -> int:
        return _total(self.arr, self.state)


def _pack(need: int, arr: np.ndarray, bound: int, fb: bytes | None, state: ClusterState | None = None) -> Placement | None:
    """:func:`pack` of ``need`` GPUs on ``_as_bytes(free)`` (``state``: whose ``free_gpus`` it may be)."""
    return sced2_pack(need, _ArrayCounts(arr, state) if fb is None else _ByteCounts(fb, bound, arr, state))


_BYTES = [bytes((i,)) for i in range(256)]


def spread(job: JobInfo, free: np.ndarray, state: ClusterState | None = None) -> Placement | None:
    """Spread placement: one GPU at a time to the node with the most free GPUs.

    Uses as many nodes as possible; the locality-agnostic extreme that the
    seed's LAS / SRTF baselines approximate (they never use one node).
    """
    need = job.gpu_demand
    if need > int(free.sum()):
        return None
    alloc: dict[int, int] = {}
    if len(free) <= _SPREAD_LIST_MAX_NODES:  # a Python list: max() takes the first largest, as argmax does
        left = free.tolist()
        nodes = range(len(left))
        at = left.__getitem__
        for _ in range(need):
            n = max(nodes, key=at)
            alloc[n] = alloc.get(n, 0) + 1
            left[n] -= 1
        return Placement.of(alloc)
    avail = free.astype(np.int64).copy()
    for _ in range(need):
        n = int(np.argmax(avail))
        alloc[n] = alloc.get(n, 0) + 1
        avail[n] -= 1
    return Placement.of(alloc)


#: :func:`spread` searches clusters of at most this many nodes in a Python list, larger ones with numpy.
_SPREAD_LIST_MAX_NODES = 64


def balanced_candidates(gpus: int, free: np.ndarray, order: np.ndarray) -> list[Placement]:
    """Balanced placements of ``gpus`` GPUs for every feasible node count.

    For ``n`` nodes each node gets ``ceil(gpus / n)`` (the last fewer); nodes
    are taken in ``order`` (an index array of preference) among those with
    enough free GPUs.
    """
    out: list[Placement] = []
    num_nodes = len(free)
    for n in range(1, min(gpus, num_nodes) + 1):
        per = math.ceil(gpus / n)
        if (n - 1) * per >= gpus:  # would leave a node empty
            continue
        chosen = [int(i) for i in order if free[i] >= per][:n]
        if len(chosen) < n:
            continue
        alloc = {}
        left = gpus
        for i in chosen:
            take = min(per, left)
            alloc[i] = take
            left -= take
        out.append(Placement.of(alloc))
    return out


def balanced_by_load(
    gpus: int,
    free: np.ndarray,
    load: Callable[[int], int],
    loaded: Callable[[], Mapping[int, int]],
    load_bytes: bytes | None = None,
) -> list[Placement]:
    """:func:`balanced_candidates` with nodes in the order (multi-node jobs there, free GPUs, index).

    The same list as ``balanced_candidates(gpus, free, np.lexsort((free, load_array)))``, found
    without sorting the cluster: nodes without multi-node jobs come first, in order of free GPUs
    then index, and are searched count by count (:func:`_as_bytes`); the loaded nodes are ranked
    only when those run short (and enough nodes are free enough at all).

    :param load: number of multi-node jobs on a node.
    :param loaded: ``{node: that number}`` for every node with at least one (called only if needed).
    :param load_bytes: the same numbers as one byte per node
        (:meth:`~policies.ledger.ContentionLedger.load_bytes`), if known: ranking the loaded nodes is
        then one vectorised pass.
    """
    arr, hi, fb = _as_bytes(free)
    if fb is None:
        if len(arr) == 0:
            return []
        load_arr = np.zeros(len(arr))
        for v, c in loaded().items():
            load_arr[v] = c
        return balanced_candidates(gpus, arr, np.lexsort((arr, load_arr)))
    bal = _Balanced(gpus, arr, hi, fb, load, loaded, load_bytes)
    return [c for c in map(bal.candidate, bal.counts) if c is not None]


class _Balanced:
    """The balanced candidates of :func:`balanced_by_load`, one node count at a time.

    :attr:`counts` are the node counts ``n`` that can give a candidate (each node ``ceil(gpus / n)``
    GPUs, none left empty, at most ``hi``: a bound on the free counts); :meth:`candidate` builds the
    one for ``n`` (``None`` if too few nodes are free enough), sharing the node searches between counts.
    """

    __slots__ = ("gpus", "arr", "hi", "fb", "load", "loaded", "lb", "counts", "_zero", "_cursor", "_by_load",
                 "_ranked")

    def __init__(self, gpus: int, arr: np.ndarray, hi: int, fb: bytes, load: Callable[[int], int],
                 loaded: Callable[[], Mapping[int, int]], load_bytes: bytes | None = None) -> None:
        self.gpus, self.arr, self.hi, self.fb, self.load, self.loaded = gpus, arr, hi, fb, load, loaded
        self.lb = load_bytes if load_bytes is not None and len(load_bytes) == len(arr) else None
        self.counts = [n for n in range(1, min(gpus, len(arr)) + 1)
                       if (n - 1) * -(-gpus // n) < gpus and -(-gpus // n) <= hi]
        self._zero: dict[int, list[int]] = {}  # free count -> unloaded nodes with it found so far, by index
        self._cursor: dict[int, int] = {}  # free count -> where its search goes on (-1: all found)
        self._by_load: list[tuple[int, int, int]] | None = None
        self._ranked: dict[int, list[int]] = {}  # per node -> loaded nodes with >= per free, in order

    def _loaded_ranked(self, per: int) -> list[int]:
        """Nodes with multi-node jobs and at least ``per`` free GPUs, by (load, free, index)."""
        got = self._ranked.get(per)
        if got is None:
            arr, lb = self.arr, self.lb
            if lb is not None:
                la = np.frombuffer(lb, dtype=np.uint8)
                idx = np.flatnonzero((la > 0) & (arr >= per))
                got = idx[np.lexsort((idx, arr[idx], la[idx]))].tolist()
            else:
                if self._by_load is None:
                    self._by_load = sorted((c, int(arr[v]), v) for v, c in self.loaded().items() if arr[v] >= 1)
                got = [v for _c, fv, v in self._by_load if fv >= per]
            self._ranked[per] = got
        return got

    def candidate(self, n: int) -> Placement | None:
        gpus, fb, load, lb = self.gpus, self.fb, self.load, self.lb
        per = -(-gpus // n)
        chosen: list[int] = []
        for f in range(per, self.hi + 1):
            found = self._zero.get(f)
            if found is None:
                found = self._zero[f] = []
                self._cursor[f] = 0
            want = n - len(chosen)
            pos = self._cursor[f]
            byte = _BYTES[f]
            while len(found) < want and pos >= 0:
                i = fb.find(byte, pos)
                if i < 0:
                    pos = -1
                    break
                pos = i + 1
                if not (lb[i] if lb is not None else load(i)):
                    found.append(i)
            self._cursor[f] = pos
            chosen.extend(found[:want])
            if len(chosen) == n:
                break
        if len(chosen) < n:
            # too few nodes without multi-node jobs: loaded ones follow, if enough are free enough at all
            if sum(fb.count(_BYTES[f]) for f in range(per, self.hi + 1)) < n:
                return None
            for v in self._loaded_ranked(per):
                chosen.append(v)
                if len(chosen) == n:
                    break
            if len(chosen) < n:
                return None
        alloc = []
        left = gpus
        for i in chosen:
            take = per if per < left else left
            alloc.append((i, take))
            left -= take
        alloc.sort()
        return Placement(tuple(alloc))


#: :class:`ContentionAwarePlacement`'s default ``switch_gain`` (effective GPUs per GPU), chosen on the
#: held-out groups of ``benchmarks/bench_baselines.py`` among 0, 0.02, 0.05 and 0.1 (docs/RESULTS.md).
SWITCH_GAIN = 0.05


def neighbour_loss(perf: ContentionModel, led: Any, after: Mapping[Any, float]) -> float:
    """Effective GPUs the running jobs ``after`` (``{job: its CS with the new job}``, the second item of
    ``led.what_if``) lose: ``sum G (iso / CS_before - iso / CS_after) / best`` over them, ``CS_before``
    from ``led``."""
    loss = 0.0
    for o, cs_a in after.items():
        info = led.info(o)
        cs_b = led.cs(o)
        iso_o = perf.isolated_throughput(*led.key(o))
        loss += info.gpu_demand * iso_o * (1.0 / cs_b - 1.0 / cs_a) / max(info.best_thp, 1e-12)
    return loss


def quiet_counts(free: np.ndarray, led: ContentionLedger) -> np.ndarray | None:
    """``free`` (int64, a new array) with 0 on every node that holds a multi-node job of ``led``, or
    ``None`` when no multi-node job runs (no node is quiet-but-loaded: the quiet nodes are all)."""
    lb = led.load_bytes()
    if lb is not None:  # one byte per node: its multi-node jobs (one vectorised pass)
        on = np.frombuffer(lb, dtype=np.uint8) > 0
        if not on.any():
            return None
        return np.where(on, 0, np.asarray(free)).astype(np.int64, copy=False)
    loads = led.loads()
    if not loads:
        return None
    quiet = np.array(free, dtype=np.int64)
    quiet[list(loads)] = 0
    return quiet


class SpanningSearch(NamedTuple):
    """What :meth:`ContentionAwarePlacement.spanning_search` computed for a job larger than a node:
    ``choice`` the rule's placement (``None``: the job waits); ``packed`` :func:`pack` of the job on
    the free GPUs (``None``: they do not hold it); ``quiet`` :func:`pack` of the job on
    :func:`quiet_counts` of the free GPUs (``None`` also when no multi-node job runs), valid only when
    ``quiet_known`` (the search stops before it when ``packed`` is ``None``); ``balanced`` the
    balanced candidate on ``packed``'s node count (:func:`balanced_by_load`; ``None``: none, or not
    searched because no multi-node job runs)."""

    choice: Placement | None
    packed: Placement | None
    quiet: Placement | None
    quiet_known: bool
    balanced: Placement | None = None

    def kept_after(self, node: int, left: int, loaded: bool) -> bool:
        """Whether the search gives the same four placements after the free GPUs of ``node`` drop to
        ``left`` (a job started on that one node) with the same multi-node jobs (``loaded``: ``node``
        holds one); ``False`` means "search again", not "it differs". Sufficient conditions, from the
        searches' definitions:

        * :func:`sced2_pack` takes the fullest nodes whole, then the best fit for the rest: a node
          outside its placement with fewer free GPUs than the placement's smallest share is neither
          taken nor a fit, before or after; a failed packing (too few GPUs) stays failed;
        * the quiet packing reads 0 for a loaded node, whatever its free GPUs;
        * the balanced candidate on ``k`` nodes reads only nodes with at least ``ceil(g / k)`` free
          GPUs (and stays ``None`` when fewer GPUs are free);
        * the scores read the multi-node jobs, which are the same.
        """
        p = self.packed
        if p is None:
            return True
        if node in p.nodes or left >= min(c for _n, c in p.alloc):
            return False
        q = self.quiet
        if q is not None and not loaded and (node in q.nodes or left >= min(c for _n, c in q.alloc)):
            return False
        b = self.balanced
        if b is not None and (node in b.nodes or left >= -(-p.total_gpus // p.num_nodes)):
            return False
        return True


class ContentionAwarePlacement:
    """Greedy: the placement the performance model predicts hurts least.

    Each candidate is scored by the change in *effective GPUs* of all jobs involved::

        sum_j  G_j * achieved_j / best_j

    i.e. the new job's normalised speed times its size, minus what its new
    neighbours lose (contention from the state's ledger,
    :meth:`~policies.state.ClusterState.contention`). The highest score wins;
    ties go to fewer nodes, then to the earlier candidate.

    Candidates:

    * ``nosplit=True`` (the ``greedy`` placement of the heuristics): the candidates of the
      ``nosplit`` rule (:class:`FloorPacking`). A job that fits on one node (at most
      ``state.cluster.max_gpus_per_node`` GPUs) gets the best-fit node that holds it, or waits
      (``None``): single-node jobs neither suffer nor cause contention in the model, so every
      node that holds one scores the same. A larger job gets the node count ``k`` of
      :func:`pack` (the fewest nodes that hold it) and :func:`pack`'s placement unless one of
      two others on ``k`` nodes scores more than ``switch_gain`` effective GPUs per GPU of the
      job above it (then the best of them): :func:`pack` on the nodes without multi-node jobs,
      and the balanced placement over the least loaded nodes (:func:`balanced_by_load`). The
      score does not price the holes a placement leaves, and pack's shape leaves the fewest;
      the bar keeps it unless contention costs clearly more (docs/RESULTS.md, "Why greedy lost").
    * ``nosplit=False``: the packing placement plus one balanced placement per
      feasible node count (nodes ordered by network load, then best fit:
      :func:`balanced_by_load`), so a job may be split over more nodes than it needs
      (``rl-hybrid``'s ``contention-aware`` safety rule).
      On Poisson arrivals this variant fragments the cluster: single-node-sized jobs
      are split when no node holds them, and balanced multi-node placements leave
      holes that the next single-node job cannot use (docs/RESULTS.md, "Why greedy lost").

    :param min_efficiency: admission floor in ``[0, 1]``: the best placement is
        returned only if its score per GPU (net effective GPUs gained per GPU
        allocated) is at least this; otherwise ``None`` (the job waits).
        ``0`` (default) admits every placement that fits. ``rl-hybrid``'s
        safety rule uses a floor so that filling idle GPUs never buys
        utilisation with heavy contention.
    :param nosplit: choose among the ``nosplit`` rule's placements (above).
    :param switch_gain: with ``nosplit``, the score per GPU of the job by which another placement of a
        multi-node job must beat :func:`pack`'s to be chosen (>= 0; default :data:`SWITCH_GAIN`).
    """

    #: it reads the running jobs of the state it is given (a policy placing several jobs in one
    #: round must hand it the state with the round's earlier starts)
    uses_running = True

    def __init__(self, perf: ContentionModel, min_efficiency: float = 0.0, nosplit: bool = False,
                 switch_gain: float = SWITCH_GAIN) -> None:
        if not 0.0 <= min_efficiency <= 1.0:
            raise ValueError(f"min_efficiency must be in [0, 1], got {min_efficiency}")
        if not (0.0 <= switch_gain and math.isfinite(switch_gain)):
            raise ValueError(f"switch_gain must be a finite number >= 0, got {switch_gain}")
        self.perf = perf
        self.min_efficiency = float(min_efficiency)
        self.nosplit = bool(nosplit)
        self.switch_gain = float(switch_gain)

    def __call__(self, job: JobInfo, free: np.ndarray, state: ClusterState) -> Placement | None:
        if self.nosplit:
            return self._fewest_nodes(job, free, state)
        gpus = job.gpu_demand
        arr, hi, fb = _as_bytes(free, state)
        if gpus > _total(arr, state):
            return None
        if fb is None:  # counts beyond a byte: the plain search
            cands = balanced_by_load(gpus, arr, state.contention(self.perf).load, state.contention(self.perf).loads)
            p = pack(job, arr)
            if p is not None and p not in cands:
                cands.append(p)
            return self._choose(job, cands, state.contention(self.perf))
        led = state.contention(self.perf)
        perf, model = self.perf, job.model
        best_thp = max(job.best_thp, 1e-12)
        bal = _Balanced(gpus, arr, hi, fb, led.load, led.loads, led.load_bytes())
        built: dict[int, Placement | None] = {}
        best, best_score = None, -math.inf
        # Candidates in order: balanced ones by node count, then pack's (unless it is one of them).
        # A candidate's score is at most its isolated gain (CS >= 1, neighbours only lose), so one
        # whose isolated gain is already below the best score so far cannot be chosen: it is
        # neither built nor scored (the choice is the same as scoring every candidate).
        for n in bal.counts:
            if gpus * perf.isolated_throughput(model, gpus, n) / 1.0 / best_thp < best_score - 1e-9:
                continue
            c = built[n] = bal.candidate(n)
            if c is not None:
                best, best_score = self._better(job, c, led, best, best_score)
        p = _pack(gpus, arr, hi, fb, state)
        if p is not None:
            n = p.num_nodes
            if n in bal.counts and n not in built:
                built[n] = bal.candidate(n)
            if built.get(n) != p and (
                gpus * perf.isolated_throughput(model, gpus, n) / 1.0 / best_thp >= best_score - 1e-9
            ):
                best, best_score = self._better(job, p, led, best, best_score)
        if best is None:
            return None
        if self.min_efficiency > 0.0 and best_score < self.min_efficiency * gpus - 1e-9:
            return None
        return best

    def _fewest_nodes(self, job: JobInfo, free: np.ndarray, state: ClusterState) -> Placement | None:
        """The ``nosplit=True`` choice (class docstring)."""
        gpus = job.gpu_demand
        if len(free) <= _SMALL:
            fits = int(free.max(initial=0)) >= gpus
            arr = hi = fb = None
        else:  # pack's first step, the best-fit node, searched in the bytes (C scans): -1 if none holds it
            arr, hi, fb = _as_bytes(free, state)
            if fb is None:
                fits = int(arr.max()) >= gpus
            else:
                n = _ByteCounts(fb, hi, arr, state).best_fit(gpus)
                fits = n >= 0
                if fits and self.min_efficiency <= 0.0:
                    return Placement(((n, gpus),))  # = pack(job, free, state)
        if fits:
            p = pack(job, free, state)  # one node holds it: pack's best fit
            if p is None or self.min_efficiency <= 0.0:
                return p
            return self._choose(job, [p], state.contention(self.perf))
        if gpus <= state.cluster.max_gpus_per_node:
            return None  # a single-node job is never split
        return self._spanning(job, free, state, arr, hi, fb).choice

    def spanning_search(self, job: JobInfo, free: np.ndarray, state: ClusterState) -> "SpanningSearch":
        """The ``nosplit=True`` search for a job larger than every node of ``state.cluster``
        (``job.gpu_demand > max_gpus_per_node``): its choice (what the rule returns) with the two
        packings it computed on the way (:class:`SpanningSearch`)."""
        if job.gpu_demand <= state.cluster.max_gpus_per_node:
            raise ValueError(f"spanning_search: job {job.job_id!r} ({job.gpu_demand} GPUs) fits on one node")
        return self._spanning(job, free, state, None, None, None)

    def _spanning(self, job: JobInfo, free: np.ndarray, state: ClusterState, arr: np.ndarray | None,
                  hi: int | None, fb: bytes | None) -> "SpanningSearch":
        """:meth:`spanning_search` (``arr, hi, fb``: ``_as_bytes(free, state)`` when known, else ``None``)."""
        gpus = job.gpu_demand
        if arr is None:
            arr, hi, fb = _as_bytes(free, state)
        assert hi is not None
        p = _pack(gpus, arr, hi, fb, state)
        if p is None:
            return SpanningSearch(None, None, None, False)
        led = state.contention(self.perf)
        quiet = quiet_counts(arr, led)
        if quiet is None:  # no multi-node job runs: no candidate can score better than pack's
            return SpanningSearch(self._choose(job, [p], led), p, None, True)
        k = p.num_nodes
        cands: list[Placement] = []
        q = pack(job, quiet)
        if q is not None and q.num_nodes == k and q != p:
            cands.append(q)
        if fb is None:
            bal = [c for c in balanced_by_load(gpus, arr, led.load, led.loads) if c.num_nodes == k]
        else:
            b = _Balanced(gpus, arr, hi, fb, led.load, led.loads, led.load_bytes())
            c = b.candidate(k) if k in b.counts else None
            bal = [] if c is None else [c]
        cands.extend(c for c in bal if c != p and c not in cands)
        best, best_score = p, self._score(job, p, led)
        bar = best_score + self.switch_gain * gpus
        # every candidate has pack's node count, so its score is at most their common isolated gain
        # (CS >= 1, neighbours only lose): none beats the bar unless that gain does
        if cands and gpus * self.perf.isolated_throughput(*job_key(job.model, p)) / 1.0 / max(job.best_thp, 1e-12) > bar:
            for c in cands:
                sc = self._score(job, c, led)
                if sc > bar + 1e-9 and sc > best_score + 1e-9:
                    best, best_score = c, sc
        b0 = bal[0] if bal else None
        if self.min_efficiency > 0.0 and best_score < self.min_efficiency * gpus - 1e-9:
            return SpanningSearch(None, p, q, True, b0)
        return SpanningSearch(best, p, q, True, b0)

    def _better(self, job: JobInfo, c: Placement, led: ContentionLedger, best: Placement | None,
                best_score: float) -> tuple[Placement | None, float]:
        """``(c, its score)`` if ``c`` beats ``best`` (a higher score, or as high on fewer nodes), else them."""
        s = self._score(job, c, led)
        if s > best_score + 1e-9 or (abs(s - best_score) <= 1e-9 and best is not None and c.num_nodes < best.num_nodes):
            return c, s
        return best, best_score

    def _choose(self, job: JobInfo, cands: list[Placement], led: ContentionLedger) -> Placement | None:
        """The best of ``cands`` (see :meth:`_better`), subject to the floor."""
        best, best_score = None, -math.inf
        for c in cands:
            best, best_score = self._better(job, c, led, best, best_score)
        if best is None:
            return None
        if self.min_efficiency > 0.0 and best_score < self.min_efficiency * job.gpu_demand - 1e-9:
            return None
        return best

    def score(self, job: JobInfo, cand: Placement, state: ClusterState | ContentionLedger) -> float:
        """Net effective GPUs that placing ``job`` on ``cand`` adds, given the running jobs of
        ``state`` (or a contention ledger whose ``info`` are the running :class:`JobInfo`)."""
        led = state.contention(self.perf) if isinstance(state, ClusterState) else state
        return self._score(job, cand, led)

    def _score(self, job: JobInfo, cand: Placement, led: ContentionLedger) -> float:
        perf = self.perf
        cs_me, after = led.what_if(job.model, cand, exclude=job.job_id)
        iso = perf.isolated_throughput(*job_key(job.model, cand))
        gain = job.gpu_demand * iso / cs_me / max(job.best_thp, 1e-12)
        if cand.num_nodes <= 1:
            return gain
        return gain - neighbour_loss(perf, led, after)


class FloorPacking:
    """The ``nosplit`` placement: packing (:func:`pack`) that keeps single-node jobs whole, with an
    optional floor.

    A job of at most the largest node's GPUs (``state.cluster.max_gpus_per_node``;
    on a homogeneous cluster: one node's) goes to the node with the fewest free
    GPUs that holds it (lowest index on ties) and waits (``None``) if no node
    does; a larger job is placed by :func:`pack`, which takes the nodes with the most free GPUs
    first and so uses as few nodes as the free GPUs allow. It is the heuristics' ``nosplit``
    placement (``srtf:nosplit``), ``rl-hybrid``'s safety-rule placement, and ``plan-greedy``'s (``scripts/studies/uniform_gap.py``: the ``"plan"``
    candidate order without a network).

    :param perf: performance model, for the floor's score.
    :param min_efficiency: admission floor in ``[0, 1]``: the packing placement
        is returned only if it yields at least this many effective GPUs per GPU
        allocated (:meth:`ContentionAwarePlacement.score`: the job's normalised
        speed times its size minus what its new neighbours lose). ``0``
        (default): every placement that fits.
    """

    def __init__(self, perf: ContentionModel, min_efficiency: float = 0.0) -> None:
        self._scorer = ContentionAwarePlacement(perf, min_efficiency)
        self.perf = perf
        self.min_efficiency = self._scorer.min_efficiency
        #: only the floor reads the running jobs (see ContentionAwarePlacement.uses_running)
        self.uses_running = self.min_efficiency > 0.0

    def __call__(self, job: JobInfo, free: np.ndarray, state: ClusterState) -> Placement | None:
        # (the cluster's largest node, a pass over its nodes, is read only when no node holds the job)
        if int(free.max(initial=0)) < job.gpu_demand and job.gpu_demand <= state.cluster.max_gpus_per_node:
            return None  # a single-node job is never split
        p = pack(job, free)
        if p is None or self.min_efficiency <= 0.0:
            return p
        if self.score(job, p, state) < self.min_efficiency * job.gpu_demand - 1e-9:
            return None
        return p

    def score(self, job: JobInfo, cand: Placement, state: ClusterState | ContentionLedger) -> float:
        """Net effective GPUs that ``cand`` adds (:meth:`ContentionAwarePlacement.score`)."""
        return self._scorer.score(job, cand, state)


#: The heuristics' placements by name: ``name -> (performance model -> rule)``.
PLACEMENT_RULES: dict[str, Callable[..., PlacementRule]] = {
    "pack": lambda perf: pack,
    "nosplit": lambda perf: FloorPacking(perf),
    "spread": lambda perf: spread,
    "greedy": lambda perf: ContentionAwarePlacement(perf, nosplit=True),
}


def safety_fill(rnd: Any, rule: PlacementRule, room: int | None = None) -> list[tuple[str, Placement]]:
    """The hybrid policies' safety rule (``rl-hybrid``, ``rl-hybrid-4x8``): one pass over the round's waiting
    jobs in its queue order (``rnd.queue_order()``), starting in the round (``rnd.place``) every job that is
    estimated to end no later than the longest-remaining job running in the round's state (remaining
    isolated time, s) and that ``rule`` places in the round's current state (``rnd.state()``). At most
    ``room`` starts (``None``: no limit). Returns the starts, in order.

    ``rnd`` is a codec round (:class:`policies.codecs.base.CodecRound`: ``state()``, ``queue_order()``,
    ``place(job_id, placement)``)."""
    out: list[tuple[str, Placement]] = []
    state = rnd.state()
    horizon = max((r.remaining_time for r in state.running), default=0.0)
    free = int(np.asarray(state.free_gpus).sum())
    for job in rnd.queue_order():
        if room is not None and len(out) >= room:
            break
        if job.gpu_demand > free or job.remaining_time > horizon:
            continue
        p = rule(job, state.free_gpus, state)
        if p is not None:
            rnd.place(job.job_id, p)
            out.append((job.job_id, p))
            state = rnd.state()
            free -= job.gpu_demand
    return out
