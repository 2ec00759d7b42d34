"""RL placement policies for the simulator and the Slurm controller.

* ``rl-base`` acts only on the network's choices: each round it encodes the
  state (:mod:`policies.encoding`), takes the best valid action, applies it to
  a local copy of the state and repeats until the network chooses "nothing"
  (or nothing more fits). It may hold jobs although GPUs are free.
* ``rl-hybrid`` follows the network the same way; when the network chooses
  "nothing" while pending jobs still fit, a greedy safety rule schedules what
  fits, keeping utilisation up: one pass over every pending job in the
  network's own candidate order (:meth:`~policies.encoding.Encoder.queue_order`:
  the ``"plan"`` / ``"fill"`` / ``"area"`` order, over the whole queue rather
  than the ``K`` candidates), starting each job that fits, packed
  (:class:`~policies.placement.FloorPacking`: a single-node job whole on the
  best-fitting node, a larger one by :func:`~policies.placement.pack`) in the
  state left by the starts before it. Like backfilling, it only uses GPUs
  that would otherwise idle while the work already started runs: a job
  qualifies only if its estimated remaining time is at most that of the
  longest-remaining running job, so the rule never pushes the network's
  later plan back by occupying GPUs past that horizon. With the plan order
  this is the plan's own packing (``plan-greedy`` of
  ``scripts/studies/uniform_gap.py``) restricted to that horizon. An optional
  *efficiency floor* (``hybrid_floor=``, default :data:`HYBRID_FLOOR` = 0)
  starts a job only where the performance model predicts at least that many
  effective GPUs per GPU allocated, counting what the job's new neighbours
  lose. The rule and its default were chosen on the validation traces
  (docs/RESULTS.md, "rl-hybrid's safety rule").

Inference is deterministic by default (argmax over the masked logits, lowest
index on ties), so simulations replay exactly. Neither policy preempts. Both
honour :attr:`policies.base.Policy.place_limit`: a round stops after that many
placements (the controller's per-round cap), which are the first ones of the
unlimited round.

Names accepted by :func:`make_rl_policy`: ``rl-base``, ``rl-hybrid`` (the
shipped checkpoint for the cluster's shape, from ``policies/checkpoints/``)
and ``rl-base:/path/ckpt`` / ``rl-hybrid:/path/ckpt`` (``ckpt``, ``ckpt.json``
or ``ckpt.safetensors``); and ``rl-prior``, the untrained *admission prior*
alone (an ablation, no network; :mod:`policies.prior`): candidate 0 (least
aged remaining GPU-time) on its first option predicted to run at >= 80 % of
its best speed, else the next candidate, else "nothing" (hold). It shows how
much of the RL policies' result comes from the action space and its prior
rather than from learning.
"""

from __future__ import annotations

import bisect
import heapq
import math
from importlib import resources
from pathlib import Path

import numpy as np

from policies.base import Policy, PolicyError
from policies.checkpoint import Checkpoint, CheckpointError, MLPNet, load_checkpoint
from policies.cluster import ClusterSpec, Placement
from policies.encoding import FILL_SMALL, Encoder, ObsSpec, RoundEncoder
from policies.perf import ContentionModel
from policies.placement import ContentionAwarePlacement, FloorPacking
from policies.prior import AdmissionPrior
from policies.state import ClusterState, Decision, JobInfo

__all__ = ["HYBRID_FLOOR", "RL_POLICY_NAMES", "RLPolicy", "make_rl_policy", "prior_net", "shipped_checkpoint", "zero_net"]

RL_POLICY_NAMES = ("rl-base", "rl-hybrid", "rl-prior")

#: ``rl-hybrid``'s safety rule starts a job only if its packing placement yields at least
#: this many effective GPUs per GPU allocated (its own normalised speed minus its
#: neighbours' loss, per GPU). 0 (no floor) was chosen on the validation traces: the highest
#: utilisation gain over rl-base, with every group's average JCT within 2.2 % of rl-base's
#: (docs/RESULTS.md, "rl-hybrid's safety rule").
HYBRID_FLOOR = 0.0


def shipped_checkpoint(mode: str, cluster: ClusterSpec) -> Path:
    """Path (``.json``) of the shipped checkpoint of ``mode`` for ``cluster``'s GPU layout (GPU types,
    CPUs and memory do not enter the observation)."""
    base = Path(str(resources.files("policies") / "checkpoints"))
    p = base / f"{mode}-{cluster.describe_gpus()}.json"
    if not p.is_file():
        have = sorted(x.stem for x in base.glob("*.json")) if base.is_dir() else []
        how = (f"--cluster {cluster.describe_gpus()}" if cluster.is_homogeneous
               else "--cluster FILE` (FILE: this cluster's YAML/TOML file)")
        raise CheckpointError(
            f"no shipped {mode} checkpoint for a {cluster.describe_gpus()} cluster (shipped: {', '.join(have) or 'none'}); "
            f"train one with `rlsched train {how}{' ...`' if cluster.is_homogeneous else ''} and use "
            f"{mode}:/path/to/checkpoint"
        )
    return p


def prior_net(spec) -> MLPNet:
    """A constant network preferring lower action indices ("nothing", the last, least).

    The initialisation of runs without the admission prior (``--prior bias``).
    """
    n_in = int(np.prod(spec.shape))
    bias = -np.arange(spec.n_actions, dtype=np.float32)
    return MLPNet([(np.zeros((spec.n_actions, n_in), np.float32), bias)])


def zero_net(spec) -> MLPNet:
    """A network whose logits are all 0 (with a prior: the prior's own policy)."""
    n_in = int(np.prod(spec.shape))
    return MLPNet([(np.zeros((spec.n_actions, n_in), np.float32), np.zeros(spec.n_actions, np.float32))])


class RLPolicy(Policy):
    """A trained network plus the shared encoder, as a :class:`Policy`.

    :param net: the network (logits over actions).
    :param encoder: encoder for the cluster (spec checked against the checkpoint).
    :param hybrid: add the greedy safety rule (``rl-hybrid``).
    :param deterministic: argmax (default) instead of sampling.
    :param seed: seeds sampling when not deterministic.
    :param max_decisions: safety cap on placements per round.
    :param fast: evaluate the network on the encoder's structured observation
        (:meth:`MLPNet.logits_sparse`: constant channels as precomputed sums,
        sparse channels through their nonzero cells, running jobs' sums
        memoised) instead of the dense tensor; same decisions (tested), an
        order of magnitude less work on large clusters. ``False``: the dense path.
    :param prior: admission prior added to the network's logits
        (:class:`policies.prior.AdmissionPrior`); ``None``: the network alone.
    :param hybrid_floor: the safety rule's efficiency floor in ``[0, 1]``
        (effective GPUs per allocated GPU; ``0`` = no floor). Only used
        with ``hybrid``.
    :param hybrid_rule: the safety rule's placement: ``"packing"`` (default,
        :class:`~policies.placement.FloorPacking`) or ``"contention-aware"``
        (:class:`~policies.placement.ContentionAwarePlacement`; with
        ``hybrid_floor=0.7`` it is the rule shipped before, kept for comparison,
        ``scripts/studies/hybrid_floor.py``). Checked even without ``hybrid``.
    """

    time_invariant = False

    def __init__(
        self,
        net: MLPNet,
        encoder: Encoder,
        hybrid: bool = False,
        name: str | None = None,
        deterministic: bool = True,
        seed: int = 0,
        max_decisions: int = 10_000,
        checkpoint: Checkpoint | None = None,
        fast: bool = True,
        prior: AdmissionPrior | None = None,
        hybrid_floor: float = HYBRID_FLOOR,
        hybrid_rule: str = "packing",
    ) -> None:
        n_in = int(np.prod(encoder.spec.shape))
        if net.in_features != n_in or net.out_features != encoder.spec.n_actions:
            raise PolicyError(
                f"network maps {net.in_features} -> {net.out_features} "
                f"but the encoder needs {n_in} -> {encoder.spec.n_actions}"
            )
        self.net = net
        self.encoder = encoder
        self.hybrid = hybrid
        self.name = name or ("rl-hybrid" if hybrid else "rl-base")
        self.deterministic = deterministic
        self.seed = seed
        self.max_decisions = max_decisions
        self.checkpoint = checkpoint
        self.fast = fast
        self.prior = prior
        self._plan = None  # the network's first-layer sums for this encoder (built on first use)
        #: Fast path only: encode a round incrementally (:class:`~policies.encoding.RoundEncoder`);
        #: ``False`` re-encodes the whole state per placement (same decisions; kept for benchmarks/tests).
        self.incremental = True
        self._rng = np.random.default_rng(seed)
        #: Counters since the last reset(): rounds asked, network placements,
        #: "nothing" chosen while a placement was valid (holds), safety-rule placements.
        self.stats = {"rounds": 0, "placements": 0, "holds": 0, "fallback_placements": 0}
        #: rl-hybrid's safety rule: packing placement with an optional efficiency floor
        self._rule: FloorPacking | ContentionAwarePlacement | None = None
        rules = {"packing": FloorPacking, "contention-aware": ContentionAwarePlacement}
        if hybrid_rule not in rules:
            raise PolicyError(f"rl-hybrid safety rule {hybrid_rule!r}: expected one of {', '.join(rules)}")
        if hybrid:
            try:
                self._rule = rules[hybrid_rule](encoder.perf, min_efficiency=hybrid_floor)
            except ValueError as e:
                raise PolicyError(f"rl-hybrid safety rule: {e}") from None

    def reset(self) -> None:
        self._rng = np.random.default_rng(self.seed)
        self.stats = {k: 0 for k in self.stats}
        self.encoder.end_round()  # forget any round's plan

    def decide(self, state: ClusterState) -> tuple[int, tuple[str, object] | None]:
        """One network decision: ``(action, (job_id, placement) or None)``."""
        enc = self.encoder.encode(state, dense=not self.fast)
        try:
            a = self._act(enc)
            return a, enc.decode(a)
        except ValueError as exc:
            self._raise_if_bad_logits(enc, exc)
            raise

    def _act(self, enc) -> int:
        """The action for an :class:`~policies.encoding.Encoded` (sparse when ``fast``).

        Logits are the network's plus, when the policy has one, the admission
        prior's (:mod:`policies.prior`).
        """
        if enc.obs is not None:
            if self.prior is None:
                return self.net.act(enc.obs, enc.mask, self.deterministic, self._rng)
            z = self.net.logits(enc.obs)
        else:
            if self._plan is None:
                self._plan = self.net.sparse_plan(self.encoder.spec, self.encoder._exists)
            z = self.net.logits_sparse(enc.sparse, self._plan)
            if self.prior is not None and self.deterministic and enc.valid is not None:
                # prior and mask in one vector: the same float32 sums and argmax as below (tested)
                add = self.prior.masked_logits(enc.sparse.speeds, enc.valid, bool(enc.mask[-1]))
                add += z
                i = int(add.argmax())
                if not math.isfinite(add[i]):  # argmax returns a NaN first: no usable logit
                    raise ValueError(f"no usable logit: the best valid action {i} has {add[i]}")
                return i
        if self.prior is not None:
            z = z + self.prior.logits(enc.action_speeds())
        return self.net.choose(z, enc.mask, self.deterministic, self._rng)

    def _raise_if_bad_logits(self, enc, exc: ValueError) -> None:
        """After choosing or decoding an action failed with ``exc``: raise a clear error if the
        logits are to blame; return (the caller re-raises ``exc``) otherwise.

        Called only after a failure, so the per-decision path pays nothing for it (a ``try``
        costs nothing in Python 3.11 until something raises). A valid encoding always has a
        valid action, so an invalid choice means the logits gave no valid action a usable
        value: NaN, or ``-inf`` on every valid action (float32 overflow of the network or its
        prior; :func:`~policies.checkpoint.load_checkpoint` refuses the checkpoints known to do
        that, this is defence in depth). That is the checkpoint's problem: a
        :class:`CheckpointError` naming it (a :class:`PolicyError` for a network without one).
        """
        try:
            if enc.obs is not None:
                z = self.net.logits(enc.obs)
            else:
                if self._plan is None:
                    self._plan = self.net.sparse_plan(self.encoder.spec, self.encoder._exists)
                z = self.net.logits_sparse(enc.sparse, self._plan)
            if self.prior is not None:
                z = z + self.prior.logits(enc.action_speeds())
            mask = np.asarray(enc.mask, dtype=bool)
            broken = bool(np.isnan(z).any()) or not bool(np.isfinite(z[mask]).any())
        except Exception:  # noqa: BLE001 - diagnosis only: the caller re-raises the original error
            return
        if not broken:
            return
        what = "network + admission prior" if self.prior is not None else "network"
        msg = (
            f"the {what} logits are NaN, or -inf on every valid action (float32 overflow: weights or "
            f"prior scale far too large), so {self.name} cannot choose an action ({exc})"
        )
        if self.checkpoint is not None:
            raise CheckpointError(f"{self.checkpoint.json_path}: {msg}; the checkpoint is unusable") from exc
        raise PolicyError(f"{self.name}: {msg}") from exc

    def _safety_fill(
        self, state: ClusterState, pending: list[JobInfo], free: int, place, room: int | None = None
    ) -> int:
        """rl-hybrid's safety rule: one pass over ``pending`` in the candidate order
        (:meth:`Encoder.queue_order`), starting every job that is estimated to end no later than
        the longest-running job already started (remaining isolated time, s) and that the rule
        (``hybrid_rule``: :class:`~policies.placement.FloorPacking` by default, with the
        efficiency floor) can place in the current state.
        ``place(job, placement)`` applies a start and returns the new state; ``room``: at most this
        many starts (``None``: no limit). Returns the number of jobs started."""
        n = 0
        horizon = max((r.remaining_time for r in state.running), default=0.0)
        for job in self.encoder.queue_order(pending, state.time, free):
            if room is not None and n >= room:
                break
            if job.gpu_demand > free or job.remaining_time > horizon:
                continue
            p = self._rule(job, state.free_gpus, state)
            if p is not None:
                state = place(job, p)
                free -= job.gpu_demand
                n += 1
        return n

    def schedule(self, state: ClusterState) -> Decision:
        """All decisions of one round (see module docstring).

        Pending jobs are grouped by demand into SRTF heaps once per round; after
        each placement only the placed job's group changes, so a round of
        ``m`` placements costs ``m`` encodings of the cluster, not ``m``
        passes over the queue. On the fast path the cluster side is encoded
        incrementally too (:class:`~policies.encoding.RoundEncoder`: only the
        nodes and jobs a placement changes are re-encoded). The result equals
        re-encoding the full state after each placement (tested). With
        :attr:`~policies.base.Policy.place_limit` set, the round stops after that many
        placements: the first ones of the unlimited round (tested).

        The call is one encoder round (:meth:`Encoder.begin_round
        <policies.encoding.Encoder.begin_round>`): the ``"plan"`` order's plan is made from this
        state and kept for this call's decisions only, so a call depends on its state alone.
        """
        enc_ = self.encoder
        enc_.begin_round()
        try:
            return self._schedule(state)
        finally:
            enc_.end_round()

    def _schedule(self, state: ClusterState) -> Decision:
        """:meth:`schedule` inside its encoder round."""
        from policies.encoding import apply_placement

        enc_ = self.encoder
        dec = Decision()
        self.stats["rounds"] += 1
        # per demand, a heap of (Encoder.srtf_key..., position, job): each group's next job pops off in SRTF order
        groups = enc_.srtf_heaps(state.pending)
        left = len(state.pending)
        cur = state
        cache: dict = {}  # running jobs' encoded features, by object (apply_placement never mutates)
        # demand-group heads sorted by Encoder.rank_key (unique keys; fixed within the round): after a
        # placement only the placed job's group changes, so its head is replaced by bisection
        now, K = state.time, enc_.spec.k
        ranked = sorted((enc_.rank_key(g[0][-1], now), g[0][-1]) for g in groups.values())
        rkeys = [k for k, _j in ranked]
        rjobs = [j for _k, j in ranked]
        # incremental encoder state for the rest of the round, built at the first placement
        # (a round that places nothing costs one plain encoding)
        inc: RoundEncoder | None = None
        fill = enc_.spec.order == "fill"
        planned = enc_.spec.order == "plan"
        # "plan" order: the round's plan and its candidates, kept by placement (None: fill order all round)
        cursor = enc_.plan_cursor(rjobs, {d: len(g) for d, g in groups.items()}, now, state.pending) if planned and left > 0 else None

        def _start(job: JobInfo, p: Placement) -> None:
            """Record a start and apply it to the round's state."""
            nonlocal inc, cur
            dec.place.append((job.job_id, p))
            if inc is None and self.fast and self.incremental:
                if self._plan is None:
                    self._plan = self.net.sparse_plan(enc_.spec, enc_._exists)
                inc = RoundEncoder(enc_, state, self._plan)
            if inc is not None:
                inc.place(job, p, enc_.perf)
            else:
                cur = apply_placement(cur, job.job_id, p, enc_.perf, job=job, drop_pending=False)

        def _now() -> ClusterState:
            """The round's state after the starts so far."""
            return inc.state() if inc is not None else cur

        def _start_now(job: JobInfo, p: Placement) -> ClusterState:
            _start(job, p)
            return _now()

        free = state.total_free
        # Encoder.fill_order equals rjobs[:K] while a small job waits: count the small groups left
        lim = FILL_SMALL * enc_.spec.total_gpus
        n_small = sum(1 for d in groups if d <= lim) if fill else 0
        limit = self.place_limit  # the backend applies at most this many placements: stop there
        for _ in range(self.max_decisions):
            if left <= 0 or (limit is not None and len(dec.place) >= limit):
                break
            if cursor is not None and cursor.n_single:
                cands = cursor.heads()
            elif planned:
                cands = enc_.fill_order(rjobs, free)
            else:
                cands = enc_.fill_order(rjobs, free) if fill and not n_small else rjobs[:K]
            if inc is not None:
                enc = inc.encode(cands, left)
            else:
                enc = enc_.encode(cur, candidates=cands, queue_len=left, cache=cache, dense=not self.fast)
            if not enc.any_placement:
                break
            try:
                a = self._act(enc)
                choice = enc.decode(a)
            except ValueError as exc:  # no usable logits (a broken checkpoint): a clear error, not a crash
                self._raise_if_bad_logits(enc, exc)
                raise
            if choice is None:
                self.stats["holds"] += 1
                if self._rule is not None:  # rl-hybrid: the safety rule places what it can
                    rest = [e[-1] for g in groups.values() for e in g]
                    room = None if limit is None else limit - len(dec.place)
                    self.stats["fallback_placements"] += self._safety_fill(_now(), rest, free, _start_now, room)
                break
            self.stats["placements"] += 1
            p = choice[1]
            i = a // enc.spec.options  # candidates are rjobs[:K], in that order ("area")
            job = enc.candidates[i]
            if fill or planned:  # a reordered selection of rjobs
                i = next((n for n, r in enumerate(rjobs) if r is job), -1)
            free -= p.total_gpus
            grp = groups[job.gpu_demand]
            if rjobs[i] is not job or heapq.heappop(grp)[-1] is not job:
                raise RuntimeError(f"candidate ranking lost job {job.job_id}")
            del rkeys[i], rjobs[i]
            if fill and not grp and job.gpu_demand <= lim:
                n_small -= 1
            nxt = grp[0][-1] if grp else None
            if nxt is not None:
                k = enc_.rank_key(nxt, now)
                i = bisect.bisect_left(rkeys, k)
                rkeys.insert(i, k)
                rjobs.insert(i, nxt)
            if cursor is not None:
                cursor.started(job, nxt)
            left -= 1
            _start(job, p)
        return dec


def make_rl_policy(
    name: str,
    cluster: ClusterSpec,
    perf: ContentionModel | None = None,
    checkpoint: str | Path | None = None,
    deterministic: bool = True,
    seed: int = 0,
) -> RLPolicy:
    """Build ``rl-base`` / ``rl-hybrid`` (optionally ``NAME:/path/ckpt``) for ``cluster``.

    Raises :class:`~policies.base.PolicyError` (a :class:`CheckpointError`
    for checkpoint problems) with a one-line reason.
    """
    raw = name.strip()
    mode, sep, path = raw.partition(":")
    mode = mode.lower()
    if mode == "rl-prior" and not sep:
        perf = perf or ContentionModel(cluster)
        enc = Encoder(cluster, perf, ObsSpec.for_cluster(cluster, order="plan"))  # the shipped networks' order
        return RLPolicy(zero_net(enc.spec), enc, name="rl-prior", prior=AdmissionPrior())
    if mode not in RL_POLICY_NAMES or mode == "rl-prior":
        raise PolicyError(
            f"unknown RL policy {name!r}; expected rl-base or rl-hybrid (optionally :/path/to/checkpoint) or rl-prior"
        )
    if sep and not path:
        raise PolicyError(f"policy {name!r}: empty checkpoint path after ':'")
    ckpt_path = Path(path) if path else (Path(checkpoint) if checkpoint else shipped_checkpoint(mode, cluster))
    ckpt = load_checkpoint(ckpt_path)
    ckpt.check_cluster(cluster)
    perf = perf or ContentionModel(cluster)
    enc = Encoder(cluster, perf, ckpt.spec)
    return RLPolicy(
        ckpt.net,
        enc,
        hybrid=(mode == "rl-hybrid"),
        name=mode,
        deterministic=deterministic,
        seed=seed,
        checkpoint=ckpt,
        prior=ckpt.prior,
    )
