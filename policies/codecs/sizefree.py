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
* **preempt** (only with ``spec.preempt = K > 0``): up to ``K`` running jobs, each a candidate
  "stop this job and return it to the queue with its progress" (:meth:`SizeFreeRound.preempt`;
  :attr:`policies.state.Decision.preempt`): the preemptible running jobs
  (:attr:`~policies.state.JobInfo.preemptible`) not started or preempted in this round, the first
  ``ceil(K / 2)`` by remaining time (longest first), then further ones by remaining GPU-time
  (largest first) until there are ``K``; listed by remaining time, longest first;
* **hold** (the last action): start nothing more until the next event.

Action ``i < J * P`` is job ``i // P`` on placement slot ``i % P``; with ``K > 0`` action
``J * P + k`` (``k < K``) preempts victim ``k``; the last action is hold. With ``K = 0`` (the
default, and every checkpoint whose spec has no ``preempt`` field) the layout, features and masks
are exactly those without preemption.

Observation (float32, every value in ``[-1, 1]``, ``squash(t) = t / (t + tau)``), flat:
``[(J * P + K + 1) * F candidate features, C context features]``, with ``F`` = :data:`N_CAND`
(``K = 0``) or :data:`N_CAND` + :data:`N_RUN` (``K > 0``) and ``C`` = :data:`N_CTX`; its length
does not depend on the cluster's size.

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
18    (``K > 0``) 1 for a preempt row
19    (``K > 0``) ``squash`` of the time since the job last started (preempt rows)
20    (``K > 0``) times preempted ``p / (p + 1)``
21    (``K > 0``) fraction of the job's work done
====  ==========================================================================================

A preempt row (victim ``r`` running on placement ``p``) carries the same per-job features, read
on its current placement: 5 its contention now (ledger CS), 6 the effective GPUs its neighbours
gain when it stops, per GPU of the job, 7-9 its nodes, extra nodes and GPUs, 10 ``squash`` of its
remaining time at its current speed, 11 its remaining GPU-time per node, 12 ``squash`` of its time
in the system, 13 free GPUs after it stops over the cluster's GPUs, 14 / 15 its rank among the
victims by remaining time / remaining GPU-time (longest first) over ``K``, 16 its isolated speed
on ``p`` over its best, 17 its effective GPUs per GPU (``iso / CS / best``); slots 2-4 are 0.

Context (pooled over nodes, so independent of their number): mean and max over nodes of
[free GPUs / M, ``L / (L + 1)`` with ``L`` multi-node jobs on the node (link load of spanning jobs),
``squash`` of remaining GPU-seconds per GPU of the node (SCED2's view of future free GPUs), share of
the node's GPUs held by multi-node jobs] (8 values), then waiting jobs ``n / (n + J)``, free GPUs
over all, jobs started in this round ``s / (s + 1)``, and 1 when nothing runs (4 values).

Masks: a candidate is valid when its slot holds a placement (which fits the round's free GPUs);
hold is valid unless nothing runs, nothing was started in the round and some candidate is valid
(an idle cluster with jobs waiting would otherwise stay idle). With ``K > 0``: a preempt row is
valid when it holds a victim and some job waits; hold is valid unless nothing runs now (after the
round's starts and preemptions) and some start is valid. Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np

from policies.cluster import ClusterSpec, Placement
from policies.codecs.base import CodecError
from policies.codecs.pick import (PickCodec, PickEncoding, as_started, check_spec_ints, check_tau, hold_mask,
                                  running_speed, spec_from_fields, take_waiting)
from policies.perf import ContentionModel
from policies.placement import ContentionAwarePlacement, FloorPacking, SpanningSearch, neighbour_loss, pack, quiet_counts
from policies.state import ClusterState, JobInfo

__all__ = ["N_CAND", "N_CTX", "N_RUN", "PLACEMENT_SLOTS", "SizeFreeCodec", "SizeFreeEncoding", "SizeFreeRound",
           "SizeFreeSpec"]

#: Features per candidate row.
N_CAND = 18
#: Context features.
N_CTX = 12
#: Features added to every candidate row when preempt candidates are enabled (``spec.preempt > 0``).
N_RUN = 4
#: The placement slots of each job, in order.
PLACEMENT_SLOTS = ("nosplit", "greedy", "quiet")
LAYOUT_VERSION = 1


@dataclass(frozen=True)
class SizeFreeSpec:
    """Static shape of the size-free observation: ``jobs`` (``J``) candidate jobs, ``tau_s`` time
    scale (s), ``preempt`` (``K``) preempt candidates (0: none, the layout without preemption).
    ``gpus_per_node`` is the normaliser ``M`` of GPU counts (not a constraint on the cluster)."""

    jobs: int = 8
    gpus_per_node: int = 8
    tau_s: float = 3600.0
    version: int = LAYOUT_VERSION
    preempt: int = 0

    def __post_init__(self) -> None:
        check_spec_ints("sizefree", self, ("jobs", "gpus_per_node", "version"))
        k = self.preempt
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= 256:
            raise CodecError(f"sizefree spec: preempt must be an integer in [0, 256], got {k!r}")
        if self.version != LAYOUT_VERSION:
            raise CodecError(f"sizefree spec: layout version {self.version} is not {LAYOUT_VERSION}")
        if self.jobs > 256 or self.gpus_per_node > 255:
            raise CodecError(f"sizefree spec: jobs <= 256 and gpus_per_node <= 255 expected, got {self.jobs}, "
                             f"{self.gpus_per_node}")
        check_tau("sizefree", self.tau_s)

    @property
    def n_starts(self) -> int:
        """Start rows ``J * P``."""
        return self.jobs * len(PLACEMENT_SLOTS)

    @property
    def n_candidates(self) -> int:
        """Rows ``J * P + K + 1`` (the last is hold)."""
        return self.n_starts + self.preempt + 1

    @property
    def cand_features(self) -> int:
        """Features per candidate row: :data:`N_CAND`, plus :data:`N_RUN` with preempt rows."""
        return N_CAND + (N_RUN if self.preempt else 0)

    @property
    def n_actions(self) -> int:
        return self.n_candidates

    @property
    def hold(self) -> int:
        return self.n_candidates - 1

    @property
    def size(self) -> int:
        return self.n_candidates * self.cand_features + N_CTX

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.size,)

    def to_dict(self) -> dict[str, Any]:
        """The stored form; ``preempt`` is written only when preempt candidates are enabled (a spec
        without it reads as ``preempt = 0``)."""
        out: dict[str, Any] = {"jobs": self.jobs, "gpus_per_node": self.gpus_per_node, "tau_s": self.tau_s,
                               "version": self.version, "slots": list(PLACEMENT_SLOTS)}
        if self.preempt:
            out["preempt"] = self.preempt
        out.update({"cand_features": self.cand_features, "ctx_features": N_CTX, "shape": list(self.shape)})
        return out

    @classmethod
    def from_dict(cls, d: Any) -> "SizeFreeSpec":
        spec = spec_from_fields("sizefree", d, lambda d: cls(d["jobs"], d["gpus_per_node"], d["tau_s"],
                                                             d.get("version", LAYOUT_VERSION), d.get("preempt", 0)))
        if "slots" in d and list(d["slots"]) != list(PLACEMENT_SLOTS):
            raise CodecError(f"sizefree spec: placement slots {d['slots']} are not {list(PLACEMENT_SLOTS)}")
        if "cand_features" in d and d["cand_features"] != spec.cand_features:
            raise CodecError(f"sizefree spec: cand_features {d['cand_features']!r} is not {spec.cand_features}")
        return spec

    def check_cluster(self, cluster: ClusterSpec, layout: Sequence[int] | None = None) -> None:
        """Any cluster: nothing in the shape depends on it."""
        if cluster.total_gpus < 1:
            raise CodecError("sizefree: the cluster has no GPUs")


class SizeFreeEncoding(PickEncoding):
    """One encoded state: ``obs`` float32 ``[spec.size]`` (``None`` when not asked for), ``mask`` bool
    ``[J * P + K + 1]``, ``cands[i]`` the ``(job, placement)`` of start action ``i < J * P``
    (``None``: empty slot), ``victims[k]`` the running job of preempt action ``J * P + k`` (``None``:
    empty row; an empty list when ``K = 0``)."""

    __slots__ = ("spec", "obs", "mask", "cands", "victims")
    label = "sizefree"

    def __init__(self, spec: SizeFreeSpec, obs: np.ndarray | None, mask: np.ndarray,
                 cands: list[tuple[JobInfo, Placement] | None], victims: list[JobInfo | None] | None = None) -> None:
        self.spec, self.obs, self.mask, self.cands = spec, obs, mask, cands
        self.victims: list[JobInfo | None] = victims if victims is not None else []

    def victim(self, action: int) -> str | None:
        """The job id that action ``action`` preempts, ``None`` for a start or hold action.
        :raises ValueError: a masked preempt action."""
        k = int(action) - self.spec.n_starts
        if not 0 <= k < self.spec.preempt:
            return None
        v = self.victims[k]
        if v is None or not self.mask[int(action)]:
            raise ValueError(f"sizefree: preempt action {action!r} is masked")
        return v.job_id

    def preempt_action(self, job_id: str) -> int | None:
        """The valid action that preempts ``job_id``, ``None`` when it is no victim here."""
        n = self.spec.n_starts
        for k, v in enumerate(self.victims):
            if v is not None and v.job_id == job_id and self.mask[n + k]:
                return n + k
        return None

    def _entry(self, a: int) -> tuple[str, Placement]:
        if a >= self.spec.n_starts:
            raise ValueError(f"sizefree: action {a} preempts a running job; read it with victim()")
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
        #: jobs preempted in this round (ids), in order
        self.preempted: list[str] = []
        self.waiting: list[JobInfo] = sorted(state.pending, key=codec.srtf_key)
        #: ``job id -> (job, lgtf_key)``: each waiting job's LGTF key, computed once per round
        self._gt: dict[str, tuple[JobInfo, tuple]] = {}
        #: waiting jobs in LGTF order (some may have started since) and their ``id``s
        self._by_gt: list[JobInfo] = []
        self._gt_ids: set[int] = set()
        #: ledger prices (:class:`_PricedLedger`) of this round's states: they read only the multi-node
        #: running jobs on the nodes they name, so a start keeps those it leaves alone
        #: (:meth:`_prices_apart`); a preemption drops them all
        self._prices: dict[tuple, tuple[float, dict]] = {}
        #: ``job id -> (job, best speed, remaining samples, squashed remaining GPU-time per node,
        #: squashed wait)``: a candidate's own features, computed once per round
        self._jobc: dict[str, tuple] = {}
        #: ``(job id, placement) -> (ledger price, job, features 5-10, 16, 17)``: a candidate's
        #: features that read only its placement and price, reused while the round keeps that price
        #: (the same ``what_if`` answer object: :attr:`_prices`)
        self._rowc: dict[tuple, tuple] = {}
        #: ``(GPUs, model, best speed) -> SpanningSearch`` of the greedy slot for jobs larger than a
        #: node, on the current state: a start on one node keeps those it leaves alone
        #: (:meth:`~policies.placement.SpanningSearch.kept_after`), a multi-node start or a preemption
        #: drops them all
        self._spans: dict[tuple, SpanningSearch] = {}
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

    def _add_node_load(self, p: Placement, rem: float, sign: float = 1.0) -> None:
        multi = p.num_nodes > 1
        for nd, c in p.alloc:
            self.rem_gs[nd] += sign * rem * c
            if multi:
                self.span[nd] += sign
                self.span_gpus[nd] += sign * c

    # ------------------------------------------------------------------ protocol
    def state(self) -> ClusterState:
        return self.cur

    def queue_order(self) -> list[JobInfo]:
        return list(self.waiting)

    def place(self, job_id: str, placement: Placement) -> None:
        j = take_waiting("sizefree", self.waiting, self.free, job_id, placement)
        perf = self.codec.perf
        if self._spans:
            if placement.num_nodes > 1:
                self._spans = {}
            else:
                nd = placement.nodes[0]
                left = int(self.free[nd])
                loaded = self.cur.contention(perf).load(nd) > 0  # the multi-node jobs stay the same
                self._spans = {k: v for k, v in self._spans.items() if v.kept_after(nd, left, loaded)}
        iso = perf.throughput_for(j.model, placement)
        self._add_node_load(placement, j.remaining_samples / max(iso, 1e-12))
        run = as_started(j, placement, self.now, iso)
        if placement.num_nodes > 1 and self._prices:
            self._prices = self._prices_apart(placement.nodes)
        st = self.cur.with_running(add=[run])
        st.free_gpus = self.free.copy()
        st.pending = list(self.waiting)
        self.cur = st
        self.started.append((j, placement))

    def _prices_apart(self, nodes: Sequence[int]) -> dict[tuple, tuple[float, dict]]:
        """The kept ledger prices that a multi-node job started on ``nodes`` leaves as they are: those
        whose placement and whose multi-node neighbours (each priced on its own nodes) all avoid
        ``nodes`` (a price reads only the multi-node jobs on the nodes it names)."""
        S = set(nodes)
        led = self.cur.contention(self.codec.perf)  # the state before the start
        where = led.placement
        return {k: v for k, v in self._prices.items()
                if S.isdisjoint(k[1].nodes) and all(S.isdisjoint(where(o).nodes) for o in v[1])}

    def preempt(self, job_id: str) -> JobInfo:
        """Stop running job ``job_id`` (a victim: :meth:`victims`): its GPUs become free (on usable
        nodes), and it waits again with its progress (placement and start time cleared, one more
        preemption), as the simulator's :meth:`~trainer.simulator.Simulator.preempt` does; returns the
        waiting job. :raises ValueError: ``job_id`` is not a victim of this round."""
        r = next((v for v in self.victims() if v.job_id == job_id), None)
        if r is None:
            raise ValueError(f"sizefree round: job {job_id!r} is not a preemptible running job of this round")
        p = r.placement
        assert p is not None
        self._add_node_load(p, r.remaining_samples / max(running_speed(r), 1e-12), -1.0)
        usable = self.cur.usable
        for nd, c in p.alloc:
            if usable is None or usable[nd]:
                self.free[nd] += c
        back = replace(r, placement=None, start_time=None, isolated_thp=0.0, achieved_thp=0.0,
                       preemptions=r.preemptions + 1)
        self._prices = {}
        self._spans = {}
        self.waiting.append(back)
        self.waiting.sort(key=self.codec.srtf_key)
        st = self.cur.with_running(remove=[r])
        st.free_gpus = self.free.copy()
        st.pending = list(self.waiting)
        self.cur = st
        self.preempted.append(job_id)
        return back

    def victims(self) -> list[JobInfo]:
        """The round's preempt candidates (module docstring), longest remaining time first; empty when
        ``spec.preempt`` is 0."""
        K = self.codec.spec.preempt
        if not K:
            return []
        fresh = {j.job_id for j, _p in self.started}
        gone = set(self.preempted)
        run = [r for r in self.cur.running if r.placement is not None and r.preemptible
               and r.job_id not in fresh and r.job_id not in gone]
        by_t = sorted(run, key=_victim_key)
        if len(by_t) <= K:
            return by_t
        chosen = {id(r) for r in by_t[: (K + 1) // 2]}
        for r in sorted(run, key=_victim_gt_key):
            if len(chosen) >= K:
                break
            chosen.add(id(r))
        return [r for r in by_t if id(r) in chosen]

    # ------------------------------------------------------------------ candidates
    def candidate_jobs(self) -> list[JobInfo]:
        """The round's candidate jobs (module docstring), in SRTF order."""
        J = self.codec.spec.jobs
        w = self.waiting
        if len(w) <= J:
            return list(w)
        half = (J + 1) // 2
        chosen = {id(j) for j in w[:half]}
        here = {id(j) for j in w}
        if not here <= self._gt_ids:  # a job the LGTF list lacks (a preempted one): sort them again
            self._by_gt = sorted(w, key=self._lgtf)
            self._gt_ids = here
        for j in self._by_gt:  # the waiting jobs in LGTF order (keys are unique: they end with the id)
            if len(chosen) >= J:
                break
            if id(j) in here:
                chosen.add(id(j))
        return [j for j in w if id(j) in chosen]

    def _lgtf(self, j: JobInfo) -> tuple:
        """:meth:`SizeFreeCodec.lgtf_key` of ``j``, kept for the round (a job's key does not change while
        time is frozen)."""
        got = self._gt.get(j.job_id)
        if got is None or got[0] is not j:
            got = self._gt[j.job_id] = (j, self.codec.lgtf_key(j))
        return got[1]

    def encode(self, dense: bool = True) -> SizeFreeEncoding:
        codec, spec = self.codec, self.codec.spec
        P = len(PLACEMENT_SLOTS)
        jobs = self.candidate_jobs()
        cands: list[tuple[JobInfo, Placement] | None] = [None] * (spec.n_candidates - 1)
        mask = np.zeros(spec.n_candidates, dtype=bool)
        total = int(self.free.sum())
        st = self.cur
        # the state's own free-GPU array (equal to self.free) lets the rules use its cached byte form
        sf = st.free_gpus
        free = sf if isinstance(sf, np.ndarray) and sf.dtype.kind in "iu" else self.free
        # each rule's placement depends on the job only through codec.rule_keys (same free GPUs and
        # running jobs): computed once per key in this encoding
        memo: dict[tuple, Placement | None] = {}
        keys = codec.rule_keys if codec.rules is codec._own_rules else None  # (rules wrapped: no memo)
        if jobs:
            codec.greedy.priced(st.contention(codec.perf), self._prices)
        for i, j in enumerate(jobs):
            if j.gpu_demand > total:
                continue
            seen: list[Placement] = []
            # a job that fits on one node: greedy's choice is nosplit's and quiet has none (exactly)
            spanning = j.gpu_demand > codec.max_node
            rules = codec.rules if spanning else codec.rules[:1]
            if spanning and keys is not None:
                # the greedy search packs the job on the free GPUs and on the quiet nodes: the
                # nosplit and quiet slots' placements (same GPU count, same state)
                gk = (1, *keys[1](j))
                if gk not in memo:
                    sr = self._spans.get(gk)
                    if sr is None:
                        sr = self._spans[gk] = codec.greedy.spanning_search(j, free, st)
                    memo[gk] = sr.choice
                    memo.setdefault((0, *keys[0](j)), sr.packed)
                    if sr.quiet_known:
                        memo.setdefault((2, *keys[2](j)), sr.quiet)
            for s, rule in enumerate(rules):
                mk = (s, *keys[s](j)) if keys is not None else (s, id(j))
                if mk in memo:
                    p = memo[mk]
                else:
                    p = memo[mk] = rule(j, free, st)
                if p is None or p in seen:
                    continue
                seen.append(p)
                cands[i * P + s] = (j, p)
                mask[i * P + s] = True
        victims: list[JobInfo | None] = []
        if spec.preempt:
            vs = self.victims() if self.waiting else []
            victims = [*vs, *([None] * (spec.preempt - len(vs)))]
            S = spec.n_starts
            mask[S: S + len(vs)] = True
            # hold: valid unless nothing runs now and some start is valid
            mask[-1] = not (bool(mask[:S].any()) and not self.cur.running)
        else:
            hold_mask(mask, self.idle, bool(self.started))
        obs = self._dense(jobs, cands, victims) if dense else None
        return SizeFreeEncoding(spec, obs, mask, cands, victims)

    def _dense(self, jobs: list[JobInfo], cands: list[tuple[JobInfo, Placement] | None],
               victims: list[JobInfo | None]) -> np.ndarray:
        codec, spec = self.codec, self.codec.spec
        P, M, J, tau = len(PLACEMENT_SLOTS), float(spec.gpus_per_node), spec.jobs, spec.tau_s
        sq = lambda t: t / (t + tau) if t > 0 else 0.0  # noqa: E731
        rows = np.zeros((spec.n_candidates, spec.cand_features), dtype=np.float32)
        rows[-1, 0] = 1.0
        total_gpus = float(self.cap.sum())
        free_total = float(self.free.sum())
        anyone = any(c is not None for c in cands) or any(v is not None for v in victims)
        raw = self.cur.contention(codec.perf) if anyone else None
        led = codec.greedy.priced(raw) if raw is not None else None
        lgtf_rank = {id(j): r for r, j in enumerate(sorted(jobs, key=self._lgtf))}
        jc, rc = self._jobc, self._rowc
        perf = codec.perf
        for i, c in enumerate(cands):
            if c is None:
                continue
            j, p = c
            g = j.gpu_demand
            k = i // P
            price = led.what_if(j.model, p, exclude=j.job_id)
            got = jc.get(j.job_id)
            if got is None or got[0] is not j:  # the job's own terms, fixed while time is frozen
                got = jc[j.job_id] = (j, codec.best_thp(j), j.remaining_samples, sq(j.remaining_time * g / M),
                                      sq(self.now - j.submit_time))
            _j, best, rem_s, gt_sq, wait_sq = got
            rk = (j.job_id, p)
            kept = rc.get(rk)
            if kept is not None and kept[0] is price and kept[1] is j:
                on_p = kept[2]
            else:  # features 5-10, 16, 17: read the job, its placement and the ledger price only
                cs_me, after = price
                n = p.num_nodes
                iso = perf.throughput_for(j.model, p)
                loss = neighbour_loss(perf, led, after)
                gain = g * iso / cs_me / max(j.best_thp, 1e-12)
                rem_t = rem_s / max(iso / cs_me, 1e-12)
                on_p = (1.0 - 1.0 / max(cs_me, 1.0), min(max(loss / g, 0.0), 1.0), n / (n + 4.0),
                        (n - math.ceil(g / M)) / n if n > math.ceil(g / M) else 0.0, g / (g + M), sq(rem_t),
                        min(iso / max(best, 1e-12), 1.0), min(max((gain - loss) / g, -1.0), 1.0))
                rc[rk] = (price, j, on_p)
            row = rows[i]
            slot = i % P
            # features 1-17 in one assignment (each float rounded to float32 as an item assignment is)
            row[1:18] = (1.0, float(slot == 0), float(slot == 1), float(slot == 2), *on_p[:6],
                         gt_sq, wait_sq, (free_total - g) / total_gpus,
                         k / J, lgtf_rank[id(j)] / J, *on_p[6:])
            if spec.preempt:
                row[20] = j.preemptions / (j.preemptions + 1.0)
                row[21] = min(j.done_samples / max(j.total_samples, 1e-12), 1.0)
        if any(v is not None for v in victims):
            self._victim_rows(rows, victims, raw, free_total, total_gpus)
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

    def _victim_rows(self, rows: np.ndarray, victims: list[JobInfo | None], led: Any, free_total: float,
                     total_gpus: float) -> None:
        """Fill the preempt rows of ``rows`` (module docstring)."""
        codec, spec = self.codec, self.codec.spec
        M, K, tau = float(spec.gpus_per_node), spec.preempt, spec.tau_s
        sq = lambda t: t / (t + tau) if t > 0 else 0.0  # noqa: E731
        real = [v for v in victims if v is not None]
        gt_rank = {id(r): k for k, r in enumerate(sorted(real, key=_victim_gt_key))}
        usable = self.cur.usable
        for k, r in enumerate(victims):
            if r is None:
                continue
            p = r.placement
            assert p is not None
            g, n = r.gpu_demand, p.num_nodes
            cs = max(led.cs(r.job_id), 1.0)
            gain = 0.0
            if n > 1:  # a single-node job slows nobody: stopping it frees no link
                f = led.fork()
                for o in f.remove(r.job_id):
                    info = f.info(o)
                    iso_o = codec.perf.isolated_throughput(*f.key(o))
                    gain += info.gpu_demand * iso_o * (1.0 / f.cs(o) - 1.0 / led.cs(o)) / max(info.best_thp, 1e-12)
            iso = codec.perf.throughput_for(r.model, p)
            best = codec.best_thp(r)
            freed = sum(c for nd, c in p.alloc if usable is None or usable[nd])
            row = rows[spec.n_starts + k]
            row[1] = 1.0
            row[5] = 1.0 - 1.0 / cs
            row[6] = min(max(gain / g, 0.0), 1.0)
            row[7] = n / (n + 4.0)
            row[8] = (n - math.ceil(g / M)) / n if n > math.ceil(g / M) else 0.0
            row[9] = g / (g + M)
            row[10] = sq(r.remaining_samples / max(running_speed(r), 1e-12))
            row[11] = sq(r.remaining_time * g / M)
            row[12] = sq(self.now - r.submit_time)
            row[13] = min((free_total + freed) / total_gpus, 1.0)
            row[14] = k / K
            row[15] = gt_rank[id(r)] / K
            row[16] = min(iso / max(best, 1e-12), 1.0)
            row[17] = min(iso / cs / max(best, 1e-12), 1.0)
            row[18] = 1.0
            row[19] = sq(self.now - r.start_time) if r.start_time is not None else 0.0
            row[20] = r.preemptions / (r.preemptions + 1.0)
            row[21] = min(r.done_samples / max(r.total_samples, 1e-12), 1.0)


def _victim_key(r: JobInfo) -> tuple:
    """Victim order: longest remaining time first (then latest submit, then id)."""
    return (-r.remaining_time, -r.submit_time, r.job_id)


def _victim_gt_key(r: JobInfo) -> tuple:
    """Largest remaining GPU-time first."""
    return (-r.remaining_time * r.gpu_demand, -r.submit_time, r.job_id)


def _demand_key(j: JobInfo) -> tuple:
    return (j.gpu_demand,)


def _greedy_key(j: JobInfo) -> tuple:
    return (j.gpu_demand, j.model, j.best_thp)


class _PricedLedger:
    """A read view of a contention ledger that keeps its :meth:`what_if` answers, by ``(model,
    placement, exclude)``, for as long as the ledger does not change; ``info``, ``cs`` and ``key``
    are the ledger's own."""

    __slots__ = ("led", "version", "memo", "info", "cs", "key")

    def __init__(self, led: Any, memo: dict[tuple, tuple[float, dict]] | None = None) -> None:
        self.led, self.version = led, led.version
        self.memo: dict[tuple, tuple[float, dict]] = {} if memo is None else memo
        self.info, self.cs, self.key = led.info, led.cs, led.key

    def what_if(self, model: str, placement: Placement, exclude: Any = None) -> tuple[float, dict]:
        k = (model, placement, exclude)
        got = self.memo.get(k)
        if got is None:
            got = self.memo[k] = self.led.what_if(model, placement, exclude=exclude)
        return got


class _Greedy(ContentionAwarePlacement):
    """The ``greedy`` slot's rule (:class:`~policies.placement.ContentionAwarePlacement` with
    ``nosplit=True``), scoring on a :class:`_PricedLedger` of the state's ledger, so that the
    candidate features price its placements without computing them again."""

    def __init__(self, perf: ContentionModel) -> None:
        super().__init__(perf, nosplit=True)
        self._priced: _PricedLedger | None = None

    def priced(self, led: Any, memo: dict[tuple, tuple[float, dict]] | None = None) -> _PricedLedger:
        """The priced view of ``led``: a new one when ``led`` is another ledger (keeping the prices
        ``memo``, which the caller vouches for: the same multi-node jobs as where they were computed)
        or has changed since (no prices kept)."""
        pl = self._priced
        if pl is None or pl.led is not led:
            pl = self._priced = _PricedLedger(led, memo)
        elif pl.version != led.version or not led.valid:
            pl = self._priced = _PricedLedger(led)
        return pl

    def _score(self, job: JobInfo, cand: Placement, led: Any) -> float:
        return super()._score(job, cand, self.priced(led) if not isinstance(led, _PricedLedger) else led)


class _Nosplit(FloorPacking):
    """:class:`~policies.placement.FloorPacking` without a floor that hands :func:`pack` the state whose
    free-GPU array it is given (``free is state.free_gpus``), so the search reads the state's kept byte
    form (:meth:`~policies.state.ClusterState.free_bytes`); the same placement."""

    def __call__(self, job: JobInfo, free: np.ndarray, state: ClusterState) -> Placement | None:
        g = job.gpu_demand
        if int(free.max(initial=0)) < g and g <= state.cluster.max_gpus_per_node:
            return None  # a single-node job is never split
        return pack(job, free, state)


class _QuietPack:
    """:func:`pack` on the nodes without multi-node jobs (:func:`~policies.placement.quiet_counts`), for
    jobs larger than a node (else ``None``)."""

    def __init__(self, perf: ContentionModel, max_node: int) -> None:
        self.perf, self.max_node = perf, max_node
        #: ``(state, free counts, quiet counts or None)`` of the last call: the quiet counts are built
        #: once per state and free-GPU vector
        self._last: tuple[ClusterState, bytes, np.ndarray | None] | None = None

    def __call__(self, job: JobInfo, free: np.ndarray, state: ClusterState) -> Placement | None:
        if job.gpu_demand <= self.max_node:
            return None
        fb = np.asarray(free).tobytes()
        last = self._last
        if last is None or last[0] is not state or last[1] != fb:
            quiet = quiet_counts(np.asarray(free, dtype=np.int64), state.contention(self.perf))
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
        #: the greedy slot's rule; it keeps the ledger prices it computed, which the features read
        self.greedy = _Greedy(perf)
        self.rules = self._own_rules = (_Nosplit(perf), self.greedy, _QuietPack(perf, self.max_node))
        #: per rule, what of a waiting job its placement reads (with the free GPUs and running jobs):
        #: packing and quiet packing the GPU count; the greedy choice also the model and best speed
        #: (its score's normaliser)
        self.rule_keys = (_demand_key, _greedy_key, _demand_key)

    @staticmethod
    def srtf_key(j: JobInfo) -> tuple:
        return (j.remaining_time, j.submit_time, j.job_id)

    @staticmethod
    def lgtf_key(j: JobInfo) -> tuple:
        return (j.remaining_time * j.gpu_demand, j.submit_time, j.job_id)

    def expert_action(self, enc: SizeFreeEncoding, slot: str = "nosplit", order: str = "srtf") -> int:
        """The heuristic's pick in ``enc``: the first candidate job in ``order`` (``srtf``: remaining time,
        the candidates' own order; ``lgtf``: remaining GPU-time, :meth:`lgtf_key`) whose ``slot``
        placement is valid (``greedy`` falls back on the nosplit slot where it repeats it), else hold."""
        P = len(PLACEMENT_SLOTS)
        s = PLACEMENT_SLOTS.index(slot)
        if order not in ("srtf", "lgtf"):
            raise ValueError(f"sizefree expert: order must be srtf or lgtf, got {order!r}")
        idx: Sequence[int] = range(self.spec.jobs)
        if order == "lgtf":
            jobs = {}
            for i in idx:
                c = next((enc.cands[i * P + t] for t in range(P) if enc.cands[i * P + t] is not None), None)
                if c is not None:
                    jobs[i] = c[0]
            idx = sorted(jobs, key=lambda i: self.lgtf_key(jobs[i]))
        for i in idx:
            for t in ((s, 0) if s else (0,)):
                if enc.mask[i * P + t]:
                    return i * P + t
        return self.spec.hold

