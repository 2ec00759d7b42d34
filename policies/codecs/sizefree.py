"""The cluster-size-free codec (codec name ``sizefree-v1``): candidate (job, placement) pairs scored
one by one.

Each scheduling round, with time frozen, the policy picks among *candidates* until it picks "hold":

* **jobs**: up to ``J`` waiting jobs: the first ``ceil(J / 2)`` by SRTF order (remaining isolated
  time, then submit time, then id), then further jobs in LGTF order (remaining GPU-time: remaining
  time x GPUs) until there are ``J``; listed in SRTF order;
* **placements** per job (``P = 3`` slots): ``nosplit`` (:class:`policies.placement.FloorPacking`),
  ``greedy`` (:class:`policies.placement.ContentionAwarePlacement` with ``nosplit=True``) and
  ``quiet`` (:func:`policies.placement.pack` on the nodes without multi-node jobs; for jobs larger
  than a node only). A slot is empty (masked) when the rule finds no placement or repeats an
  earlier slot's placement of the same job;
* **hold** (the last action, index ``J * P``): start nothing more until the next event.

Action ``i < J * P`` is job ``i // P`` on placement slot ``i % P``.

Observation (float32, every value in ``[-1, 1]``, ``squash(t) = t / (t + tau)``), flat:
``[(J * P + 1) * F candidate features, C context features]``, with ``F`` = :data:`N_CAND` and
``C`` = :data:`N_CTX`; its length does not depend on the cluster's size.

Candidate features (an empty slot is all 0; the hold row has only feature 0 set):

====  ==========================================================================================
0     1 for the hold row
1     1 for a real candidate
2-4   one-hot placement slot (nosplit, greedy, quiet)
5     the candidate's predicted contention, ``1 - 1 / CS`` (ledger :meth:`what_if`; 0: none)
6     effective GPUs its new neighbours lose, per GPU of the job (their ``G (1/CS_before - 1/CS_after)``)
7     nodes spanned ``n / (n + 4)``
8     extra nodes over the fewest that could hold it, ``(n - ceil(g / M)) / n``
9     GPUs ``g / (g + M)``
10    ``squash`` of its remaining run time on this placement (isolated speed / CS)
11    ``squash`` of its remaining GPU-time per node, ``remaining time x g / M``
12    ``squash`` of its waiting time
13    free GPUs left after it, over the cluster's GPUs
14    its rank in SRTF order over ``J``
15    its rank in LGTF order over ``J``
16    isolated speed on this placement over its best
17    the greedy score per GPU (its effective GPUs minus what neighbours lose, over ``g``), clipped
====  ==========================================================================================

Context (pooled over nodes, so independent of their number): mean and max over nodes of
[free GPUs / M, ``L / (L + 1)`` with ``L`` multi-node jobs on the node (link load of spanning jobs),
``squash`` of remaining GPU-seconds per GPU of the node (SCED2's view of future free GPUs), share of
the node's GPUs held by multi-node jobs] (8 values), then waiting jobs ``n / (n + J)``, free GPUs
over all, jobs started in this round ``s / (s + 1)``, and 1 when nothing runs (4 values).

Masks: a candidate is valid when its slot holds a placement (which fits the round's free GPUs);
hold is valid unless nothing runs, nothing was started in the round and some candidate is valid
(an idle cluster with jobs waiting would otherwise stay idle). Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from policies.cluster import ClusterSpec, Placement
from policies.codecs.base import CodecError
from policies.codecs.pick import (PickCodec, PickEncoding, as_started, check_spec_ints, check_tau, hold_mask,
                                  running_speed, spec_from_fields, take_waiting)
from policies.perf import ContentionModel
from policies.placement import ContentionAwarePlacement, FloorPacking, pack
from policies.state import ClusterState, JobInfo

__all__ = ["N_CAND", "N_CTX", "PLACEMENT_SLOTS", "SizeFreeCodec", "SizeFreeEncoding", "SizeFreeRound", "SizeFreeSpec"]

#: Features per candidate row.
N_CAND = 18
#: Context features.
N_CTX = 12
#: The placement slots of each job, in order.
PLACEMENT_SLOTS = ("nosplit", "greedy", "quiet")
LAYOUT_VERSION = 1


@dataclass(frozen=True)
class SizeFreeSpec:
    """Static shape of the size-free observation: ``jobs`` (``J``) candidate jobs, ``tau_s`` time
    scale (s). ``gpus_per_node`` is the normaliser ``M`` of GPU counts (not a constraint on the
    cluster)."""

    jobs: int = 8
    gpus_per_node: int = 8
    tau_s: float = 3600.0
    version: int = LAYOUT_VERSION

    def __post_init__(self) -> None:
        check_spec_ints("sizefree", self, ("jobs", "gpus_per_node", "version"))
        if self.version != LAYOUT_VERSION:
            raise CodecError(f"sizefree spec: layout version {self.version} is not {LAYOUT_VERSION}")
        if self.jobs > 256 or self.gpus_per_node > 255:
            raise CodecError(f"sizefree spec: jobs <= 256 and gpus_per_node <= 255 expected, got {self.jobs}, "
                             f"{self.gpus_per_node}")
        check_tau("sizefree", self.tau_s)

    @property
    def n_candidates(self) -> int:
        """Rows ``J * P + 1`` (the last is hold)."""
        return self.jobs * len(PLACEMENT_SLOTS) + 1

    @property
    def n_actions(self) -> int:
        return self.n_candidates

    @property
    def hold(self) -> int:
        return self.n_candidates - 1

    @property
    def size(self) -> int:
        return self.n_candidates * N_CAND + N_CTX

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.size,)

    def to_dict(self) -> dict[str, Any]:
        return {"jobs": self.jobs, "gpus_per_node": self.gpus_per_node, "tau_s": self.tau_s,
                "version": self.version, "slots": list(PLACEMENT_SLOTS), "cand_features": N_CAND,
                "ctx_features": N_CTX, "shape": list(self.shape)}

    @classmethod
    def from_dict(cls, d: Any) -> "SizeFreeSpec":
        spec = spec_from_fields("sizefree", d, lambda d: cls(d["jobs"], d["gpus_per_node"], d["tau_s"],
                                                             d.get("version", LAYOUT_VERSION)))
        if "slots" in d and list(d["slots"]) != list(PLACEMENT_SLOTS):
            raise CodecError(f"sizefree spec: placement slots {d['slots']} are not {list(PLACEMENT_SLOTS)}")
        return spec

    def check_cluster(self, cluster: ClusterSpec, layout: Sequence[int] | None = None) -> None:
        """Any cluster: nothing in the shape depends on it."""
        if cluster.total_gpus < 1:
            raise CodecError("sizefree: the cluster has no GPUs")


class SizeFreeEncoding(PickEncoding):
    """One encoded state: ``obs`` float32 ``[spec.size]`` (``None`` when not asked for), ``mask`` bool
    ``[J * P + 1]``, ``cands[i]`` the ``(job, placement)`` of action ``i`` (``None``: empty slot)."""

    __slots__ = ("spec", "obs", "mask", "cands")
    label = "sizefree"

    def __init__(self, spec: SizeFreeSpec, obs: np.ndarray | None, mask: np.ndarray,
                 cands: list[tuple[JobInfo, Placement] | None]) -> None:
        self.spec, self.obs, self.mask, self.cands = spec, obs, mask, cands

    def _entry(self, a: int) -> tuple[str, Placement]:
        c = self.cands[a]
        assert c is not None
        return c[0].job_id, c[1]


class SizeFreeRound:
    """One round of :class:`SizeFreeCodec`: its state (with the round's starts applied), per-node
    arrays, and encodings."""

    def __init__(self, codec: "SizeFreeCodec", state: ClusterState) -> None:
        self.codec = codec
        self.now = float(state.time)
        self.free = np.asarray(state.free_gpus, dtype=np.int64).copy()
        self._state = state
        self.cur = state
        self.idle = not state.running
        self.started: list[tuple[JobInfo, Placement]] = []
        self.waiting: list[JobInfo] = sorted(state.pending, key=codec.srtf_key)
        n = len(self.free)
        M = codec.spec.gpus_per_node
        self.span = np.zeros(n, dtype=np.float64)       # multi-node jobs per node
        self.span_gpus = np.zeros(n, dtype=np.float64)  # GPUs held by multi-node jobs
        self.rem_gs = np.zeros(n, dtype=np.float64)     # remaining GPU-seconds per node
        cap = np.asarray(state.cluster.gpus_per_node, dtype=np.float64)
        self.cap = np.maximum(cap, 1.0)
        self.M = M
        for r in state.running:
            if r.placement is None:
                continue
            self._add_node_load(r.placement, r.remaining_samples / max(running_speed(r), 1e-12))

    def _add_node_load(self, p: Placement, rem: float) -> None:
        multi = p.num_nodes > 1
        for nd, c in p.alloc:
            self.rem_gs[nd] += rem * c
            if multi:
                self.span[nd] += 1
                self.span_gpus[nd] += c

    # ------------------------------------------------------------------ protocol
    def state(self) -> ClusterState:
        return self.cur

    def queue_order(self) -> list[JobInfo]:
        return list(self.waiting)

    def place(self, job_id: str, placement: Placement) -> None:
        j = take_waiting("sizefree", self.waiting, self.free, job_id, placement)
        perf = self.codec.perf
        iso = perf.throughput_for(j.model, placement)
        self._add_node_load(placement, j.remaining_samples / max(iso, 1e-12))
        run = as_started(j, placement, self.now, iso)
        st = self.cur.with_running(add=[run])
        st.free_gpus = self.free.copy()
        st.pending = list(self.waiting)
        self.cur = st
        self.started.append((j, placement))

    # ------------------------------------------------------------------ candidates
    def candidate_jobs(self) -> list[JobInfo]:
        """The round's candidate jobs (module docstring), in SRTF order."""
        J = self.codec.spec.jobs
        w = self.waiting
        if len(w) <= J:
            return list(w)
        half = (J + 1) // 2
        chosen = {id(j) for j in w[:half]}
        by_gt = sorted(w, key=self.codec.lgtf_key)
        for j in by_gt:
            if len(chosen) >= J:
                break
            chosen.add(id(j))
        return [j for j in w if id(j) in chosen]

    def encode(self, dense: bool = True) -> SizeFreeEncoding:
        codec, spec = self.codec, self.codec.spec
        P = len(PLACEMENT_SLOTS)
        jobs = self.candidate_jobs()
        cands: list[tuple[JobInfo, Placement] | None] = [None] * (spec.n_candidates - 1)
        mask = np.zeros(spec.n_candidates, dtype=bool)
        total = int(self.free.sum())
        st = self.cur
        for i, j in enumerate(jobs):
            if j.gpu_demand > total:
                continue
            seen: list[Placement] = []
            # a job that fits on one node: greedy's choice is nosplit's and quiet has none (exactly)
            rules = codec.rules if j.gpu_demand > codec.max_node else codec.rules[:1]
            for s, rule in enumerate(rules):
                p = rule(j, self.free, st)
                if p is None or p in seen:
                    continue
                seen.append(p)
                cands[i * P + s] = (j, p)
                mask[i * P + s] = True
        hold_mask(mask, self.idle, bool(self.started))
        obs = self._dense(jobs, cands) if dense else None
        return SizeFreeEncoding(spec, obs, mask, cands)

    def _dense(self, jobs: list[JobInfo], cands: list[tuple[JobInfo, Placement] | None]) -> np.ndarray:
        codec, spec = self.codec, self.codec.spec
        P, M, J, tau = len(PLACEMENT_SLOTS), float(spec.gpus_per_node), spec.jobs, spec.tau_s
        sq = lambda t: t / (t + tau) if t > 0 else 0.0  # noqa: E731
        rows = np.zeros((spec.n_candidates, N_CAND), dtype=np.float32)
        rows[-1, 0] = 1.0
        total_gpus = float(self.cap.sum())
        free_total = float(self.free.sum())
        led = self.cur.contention(codec.perf) if any(c is not None for c in cands) else None
        lgtf_rank = {id(j): r for r, j in enumerate(sorted(jobs, key=codec.lgtf_key))}
        for i, c in enumerate(cands):
            if c is None:
                continue
            j, p = c
            g, n = j.gpu_demand, p.num_nodes
            k = i // P
            cs_me, after = led.what_if(j.model, p, exclude=j.job_id)
            iso = codec.perf.throughput_for(j.model, p)
            best = codec.best_thp(j)
            loss = 0.0
            for o, cs_a in after.items():
                info = led.info(o)
                cs_b = led.cs(o)
                iso_o = codec.perf.isolated_throughput(*led.key(o))
                loss += info.gpu_demand * iso_o * (1.0 / cs_b - 1.0 / cs_a) / max(info.best_thp, 1e-12)
            gain = g * iso / cs_me / max(j.best_thp, 1e-12)
            rem_t = j.remaining_samples / max(iso / cs_me, 1e-12)
            row = rows[i]
            row[1] = 1.0
            row[2 + i % P] = 1.0
            row[5] = 1.0 - 1.0 / max(cs_me, 1.0)
            row[6] = min(max(loss / g, 0.0), 1.0)
            row[7] = n / (n + 4.0)
            row[8] = (n - math.ceil(g / M)) / n if n > math.ceil(g / M) else 0.0
            row[9] = g / (g + M)
            row[10] = sq(rem_t)
            row[11] = sq(j.remaining_time * g / M)
            row[12] = sq(self.now - j.submit_time)
            row[13] = (free_total - g) / total_gpus
            row[14] = k / J
            row[15] = lgtf_rank[id(j)] / J
            row[16] = min(iso / max(best, 1e-12), 1.0)
            row[17] = min(max((gain - loss) / g, -1.0), 1.0)
        ctx = np.zeros(N_CTX, dtype=np.float32)
        cap = self.cap
        per = np.stack([
            self.free / cap,
            self.span / (self.span + 1.0),
            (lambda x: x / (x + tau))(self.rem_gs / cap),
            self.span_gpus / cap,
        ])
        ctx[0:4] = per.mean(axis=1)
        ctx[4:8] = per.max(axis=1)
        nw = len(self.waiting)
        ctx[8] = nw / (nw + J)
        ctx[9] = free_total / total_gpus
        s = len(self.started)
        ctx[10] = s / (s + 1.0)
        ctx[11] = 1.0 if (self.idle and not self.started) else 0.0
        return np.concatenate([rows.reshape(-1), ctx])


class _QuietPack:
    """:func:`pack` on the nodes without multi-node jobs, for jobs larger than a node (else ``None``)."""

    def __init__(self, perf: ContentionModel, max_node: int) -> None:
        self.perf, self.max_node = perf, max_node
        #: ``(state, free counts, quiet counts or None)`` of the last call: the quiet counts are built
        #: once per state (a round makes a new state at every pick) and free-GPU vector
        self._last: tuple[ClusterState, bytes, np.ndarray | None] | None = None

    def __call__(self, job: JobInfo, free: np.ndarray, state: ClusterState) -> Placement | None:
        if job.gpu_demand <= self.max_node:
            return None
        fb = np.asarray(free).tobytes()
        last = self._last
        if last is None or last[0] is not state or last[1] != fb:
            loads = state.contention(self.perf).loads()
            quiet = None
            if loads:
                quiet = np.array(free, dtype=np.int64)
                quiet[list(loads)] = 0
            last = self._last = (state, fb, quiet)
        return None if last[2] is None else pack(job, last[2])


class SizeFreeCodec(PickCodec):
    """The size-free codec for any cluster (module docstring)."""

    name: ClassVar[str] = "sizefree-v1"
    spec_class = SizeFreeSpec
    round_class = SizeFreeRound
    obs_low = -1.0

    def __init__(self, cluster: ClusterSpec, perf: ContentionModel, spec: SizeFreeSpec | None = None) -> None:
        spec = spec or SizeFreeSpec(gpus_per_node=max(cluster.gpus_per_node))
        self._init_spec(cluster, perf, spec, "sizefree")
        self.spec = spec
        #: GPUs of the largest node
        self.max_node = int(cluster.max_gpus_per_node)
        self.rules = (FloorPacking(perf), ContentionAwarePlacement(perf, nosplit=True),
                      _QuietPack(perf, self.max_node))

    @staticmethod
    def srtf_key(j: JobInfo) -> tuple:
        return (j.remaining_time, j.submit_time, j.job_id)

    @staticmethod
    def lgtf_key(j: JobInfo) -> tuple:
        return (j.remaining_time * j.gpu_demand, j.submit_time, j.job_id)

    def expert_action(self, enc: SizeFreeEncoding, slot: str = "nosplit") -> int:
        """The heuristic's pick in ``enc``: the first job in SRTF order whose ``slot`` placement is valid
        (``greedy`` falls back on the nosplit slot where it repeats it), else hold."""
        P = len(PLACEMENT_SLOTS)
        s = PLACEMENT_SLOTS.index(slot)
        for i in range(self.spec.jobs):
            for t in ((s, 0) if s else (0,)):
                if enc.mask[i * P + t]:
                    return i * P + t
        return self.spec.hold

