"""RL placement policies for the simulator and the Slurm controller.

* ``rl-base`` acts only on the network's choices: each round it encodes the
  state (a round of its codec, :mod:`policies.codecs.deepshare`), takes the best
  valid action, applies it to the round's state and repeats until the network chooses "nothing"
  (or nothing more fits). It may hold jobs although GPUs are free.
* ``rl-hybrid`` follows the network the same way; when the network chooses
  "nothing" while pending jobs still fit, a greedy safety rule schedules what
  fits, keeping utilisation up: one pass over every pending job in the
  network's own candidate order (:meth:`~policies.orders.CandidateOrder.queue_order`:
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

import math
from importlib import resources
from pathlib import Path

import numpy as np

from policies.base import Policy, PolicyError
from policies.checkpoint import Checkpoint, CheckpointError, MLPNet, load_checkpoint
from policies.cluster import ClusterSpec, Placement
from policies.codecs.deepshare import DeepShareCodec, DeepShareRound, Encoded, ObsSpec
from policies.perf import ContentionModel
from policies.placement import ContentionAwarePlacement, FloorPacking, safety_fill
from policies.prior import AdmissionPrior
from policies.state import ClusterState, Decision

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
    """A trained network plus a codec (:mod:`policies.codecs`), as a :class:`Policy`.

    :param net: the network (logits over the codec's actions).
    :param codec: the codec for the cluster (spec checked against the checkpoint).
    :param hybrid: add the greedy safety rule (``rl-hybrid``).
    :param deterministic: argmax (default) instead of sampling.
    :param seed: seeds sampling when not deterministic.
    :param max_decisions: safety cap on placements per round.
    :param fast: evaluate the network's first layer on the codec's structured observation
        (``codec.linear_plan``: constant channels as precomputed sums, option spans as prefix-sum
        differences, running jobs' sums kept by the round) instead of the dense tensor; same
        decisions (tested), an order of magnitude less work on large clusters. ``False``: the
        dense tensor through :meth:`MLPNet.logits`.
    :param prior: admission prior added to the network's logits
        (:class:`policies.prior.AdmissionPrior`); ``None``: the network alone.
    :param hybrid_floor: the safety rule's efficiency floor in ``[0, 1]``
        (effective GPUs per allocated GPU; ``0`` = no floor). Only used
        with ``hybrid``.
    :param hybrid_rule: the safety rule's placement: ``"packing"`` (default,
        :class:`~policies.placement.FloorPacking`) or ``"contention-aware"``
        (:class:`~policies.placement.ContentionAwarePlacement`, a variant kept for comparison:
        ``scripts/studies/hybrid_floor.py``, docs/RESULTS.md "rl-hybrid's safety rule"). Checked even
        without ``hybrid``.
    """

    time_invariant = False

    def __init__(
        self,
        net: MLPNet,
        codec: DeepShareCodec,
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
        spec = codec.spec
        n_in = int(np.prod(spec.shape))
        if net.in_features != n_in or net.out_features != spec.n_actions:
            raise PolicyError(
                f"network maps {net.in_features} -> {net.out_features} "
                f"but the codec needs {n_in} -> {spec.n_actions}"
            )
        self.net = net
        self.codec = codec
        self.hybrid = hybrid
        self.name = name or ("rl-hybrid" if hybrid else "rl-base")
        self.deterministic = deterministic
        self.seed = seed
        self.max_decisions = max_decisions
        self.checkpoint = checkpoint
        self.fast = fast
        self.prior = prior
        self._plan_of: tuple[MLPNet, object] | None = None  # (net, its first-layer plan for the codec)
        self._rng = np.random.default_rng(seed)
        #: Counters since the last reset(): rounds asked, network placements,
        #: "nothing" chosen while a placement was valid (holds), safety-rule placements.
        self.stats = {"rounds": 0, "placements": 0, "holds": 0, "fallback_placements": 0}
        #: rl-hybrid's safety rule (a :class:`~policies.placement.PlacementRule`): packing placement with an
        #: optional efficiency floor; ``None`` for rl-base
        self.rule: FloorPacking | ContentionAwarePlacement | None = None
        rules = {"packing": FloorPacking, "contention-aware": ContentionAwarePlacement}
        if hybrid_rule not in rules:
            raise PolicyError(f"rl-hybrid safety rule {hybrid_rule!r}: expected one of {', '.join(rules)}")
        if hybrid:
            try:
                self.rule = rules[hybrid_rule](codec.perf, min_efficiency=hybrid_floor)
            except ValueError as e:
                raise PolicyError(f"rl-hybrid safety rule: {e}") from None

    def reset(self) -> None:
        self._rng = np.random.default_rng(self.seed)
        self.stats = {k: 0 for k in self.stats}

    def _linear(self):
        """The network's first-layer plan for the codec (:meth:`MLPNet.first_layer_plan`), kept while ``net`` is the same."""
        held = self._plan_of
        if held is None or held[0] is not self.net:
            held = self._plan_of = (self.net, self.net.first_layer_plan(self.codec))
        return held[1]

    def begin(self, state: ClusterState) -> DeepShareRound:
        """A codec round on ``state`` as this policy runs it (with the network's first-layer plan on the fast path)."""
        return self.codec.begin(state, self._linear() if self.fast else None)

    def decide(self, state: ClusterState) -> tuple[int, tuple[str, object] | None]:
        """One network decision: ``(action, (job_id, placement) or None)``."""
        enc = self.begin(state).encode(dense=not self.fast)
        try:
            a = self.act(enc)
            return a, enc.decode(a)
        except ValueError as exc:
            self._raise_if_bad_logits(enc, exc)
            raise

    def logits(self, enc: Encoded) -> np.ndarray:
        """float32 ``[n_actions]``: the network's logits on an encoding (dense when it has ``obs``), without the prior."""
        if enc.obs is not None:
            return self.net.logits(enc.obs)
        return self.net.logits_from_first(enc.first_layer(self._linear()))

    def act(self, enc: Encoded) -> int:
        """The action for an :class:`~policies.codecs.deepshare.Encoded` of one of this policy's rounds.

        Logits are the network's plus, when the policy has one, the admission
        prior's (:mod:`policies.prior`).
        """
        if enc.obs is not None:
            if self.prior is None:
                return self.net.act(enc.obs, enc.mask, self.deterministic, self._rng)
            z = self.net.logits(enc.obs)
        else:
            z = self.logits(enc)
            if self.prior is not None and self.deterministic:
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

    def _raise_if_bad_logits(self, enc: Encoded, exc: ValueError) -> None:
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
            z = self.logits(enc)
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

    def _safety_fill(self, rnd: DeepShareRound, room: int | None = None) -> list[tuple[str, Placement]]:
        """rl-hybrid's safety rule (:func:`policies.placement.safety_fill` with ``hybrid_rule``:
        :class:`~policies.placement.FloorPacking` by default, with the efficiency floor) in the codec
        round ``rnd``, in its candidate order (:meth:`DeepShareRound.queue_order`); at most ``room``
        starts (``None``: no limit). Returns the starts."""
        return safety_fill(rnd, self.rule, room)

    def schedule(self, state: ClusterState) -> Decision:
        """All decisions of one round (see module docstring): one codec round
        (:meth:`DeepShareCodec.begin <policies.codecs.deepshare.DeepShareCodec.begin>`) on ``state``,
        encoded, acted on and updated placement by placement, so a call depends on its state alone.

        After each placement the codec round re-encodes only what the placement changed (the
        placed job's demand group among the candidates; the nodes and running jobs it touches).
        With :attr:`~policies.base.Policy.place_limit` set, the round stops after that many
        placements: the first ones of the unlimited round (tested).
        """
        dec = Decision()
        self.stats["rounds"] += 1
        rnd = self.begin(state)
        dense = not self.fast
        limit = self.place_limit  # the backend applies at most this many placements: stop there
        for _ in range(self.max_decisions):
            if rnd.waiting <= 0 or (limit is not None and len(dec.place) >= limit):
                break
            enc = rnd.encode(dense=dense)
            if not enc.any_placement:
                break
            try:
                a = self.act(enc)
                choice = enc.decode(a)
            except ValueError as exc:  # no usable logits (a broken checkpoint): a clear error, not a crash
                self._raise_if_bad_logits(enc, exc)
                raise
            if choice is None:
                self.stats["holds"] += 1
                if self.rule is not None:  # rl-hybrid: the safety rule places what it can
                    room = None if limit is None else limit - len(dec.place)
                    filled = self._safety_fill(rnd, room)
                    dec.place.extend(filled)
                    self.stats["fallback_placements"] += len(filled)
                break
            self.stats["placements"] += 1
            rnd.place(*choice)
            dec.place.append(choice)
        return dec


def make_rl_policy(
    name: str,
    cluster: ClusterSpec,
    perf: ContentionModel | None = None,
    checkpoint: str | Path | None = None,
    deterministic: bool = True,
    seed: int = 0,
    fast: bool = True,
    hybrid_floor: float = HYBRID_FLOOR,
    hybrid_rule: str = "packing",
) -> RLPolicy:
    """Build ``rl-base`` / ``rl-hybrid`` (optionally ``NAME:/path/ckpt``; else ``checkpoint``, else the
    shipped checkpoint for the cluster's shape) or ``rl-prior`` for ``cluster``, with the checkpoint's
    codec and spec. The remaining parameters are :class:`RLPolicy`'s.

    Raises :class:`~policies.base.PolicyError` (a :class:`CheckpointError`
    for checkpoint problems) with a one-line reason.
    """
    raw = name.strip()
    mode, sep, path = raw.partition(":")
    mode = mode.lower()
    opts = {"deterministic": deterministic, "seed": seed, "fast": fast, "hybrid_floor": hybrid_floor,
            "hybrid_rule": hybrid_rule}
    if mode == "rl-prior" and not sep:
        perf = perf or ContentionModel(cluster)
        codec = DeepShareCodec(cluster, perf, ObsSpec.for_cluster(cluster, order="plan"))  # the shipped networks' order
        return RLPolicy(zero_net(codec.spec), codec, name="rl-prior", prior=AdmissionPrior(), **opts)
    if mode not in RL_POLICY_NAMES or mode == "rl-prior":
        raise PolicyError(
            f"unknown RL policy {name!r}; expected rl-base or rl-hybrid (optionally :/path/to/checkpoint) or rl-prior"
        )
    if sep and not path:
        raise PolicyError(f"policy {name!r}: empty checkpoint path after ':'")
    ckpt_path = Path(path) if path else (Path(checkpoint) if checkpoint else shipped_checkpoint(mode, cluster))
    ckpt = load_checkpoint(ckpt_path)
    codec = ckpt.make_codec(cluster, perf or ContentionModel(cluster))
    if not isinstance(codec, DeepShareCodec):
        raise CheckpointError(f"{ckpt.json_path}: codec {ckpt.codec_name!r} is not one {mode} can run")
    return RLPolicy(ckpt.net, codec, hybrid=(mode == "rl-hybrid"), name=mode, checkpoint=ckpt, prior=ckpt.prior, **opts)
