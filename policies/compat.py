"""DeepShare-compatible mode (``--compat deepshare``): the seed's simulator rules, and its LAS / SRTF.

The seed's own simulator (DeepShare, seed 002; its public code, ``scheduler/cluster_env.py`` and
``scheduler/rl_training/``) differs from rlsched's defaults in six rules. :class:`CompatMode` holds
them in one place; :class:`trainer.simulator.SimConfig` carries one (``compat``) and the simulator
and its backend read it:

==========================  ==============================================================================
rule                        DeepShare's code
==========================  ==============================================================================
cluster                     4 nodes x 8 GPUs; jobs of 2, 4 or 8 GPUs
placements                  never on one node: a job of ``G`` GPUs runs on one of 7 node sets (the 6
                            pairs and all 4 nodes), ``G / k`` GPUs on each of its ``k`` nodes, and only
                            the shapes ``(2 nodes, G/2)`` and, for ``G`` in {4, 8}, ``(4 nodes, G/4)``
contention                  a multi-node job's throughput ratio is the worst measured pair ratio over its
                            multi-node neighbours on all its nodes, floored at 0.35 (CS <= 1 / 0.35 =
                            2.86): :class:`~policies.perf.ContentionModel` with ``contention="ds-min"``
submission                  every job at t = 0 (the trace's submit times are ignored)
rounds                      one every 300 s, nothing in between (no event-triggered rounds); a preempted
                            job restarts at no cost
metric                      JCT without queueing: the seconds a job ran, counted in whole rounds
                            (``300 x`` the rounds it ran in); rlsched reports it beside its own JCT
                            (with queueing)
==========================  ==============================================================================

Policies ``ds-las`` and ``ds-srtf`` (:class:`DSOrderPolicy`) are DeepShare's LAS and SRTF as its code
runs them: every round it preempts every running job, stable-sorts the queue (the jobs that waited,
in their queue order, then the preempted ones in the order they had started) by

* ``ds-las``: seconds run so far, *descending* (``JobQueue.sort``: ``trained_time.sum``,
  ``reverse=True``; the job that ran longest goes first);
* ``ds-srtf``: fraction of the work done, ascending (``trained_samples / required_trained_samples``),

and places jobs from the head with :func:`ds_placement` until the head does not fit (no backfilling).
Re-placing every running job each round is DeepShare's "preempt every 300 s at no cost".

The queue order needs no memory: the simulator keeps waiting jobs in the order they were queued
and appends preempted jobs in the order of the decision, and the jobs that did not run keep their
sort keys, so a stable sort of ``pending + running (in start order)`` gives the same order as
DeepShare's in-place sort of its persistent queue.

Our own heuristics run in compat mode with the placement rule ``ds`` (:func:`ds_placement`, e.g.
``srtf:ds``); the learned policies through :func:`compat_codec`, which removes the codec's options
that the mode forbids.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from policies.base import Policy, PolicyError
from policies.cluster import ClusterSpec, Placement
from policies.state import ClusterState, Decision, JobInfo, time_key

__all__ = [
    "COMPAT_NAMES",
    "CompatError",
    "CompatMode",
    "DS_POLICY_NAMES",
    "DSOrderPolicy",
    "compat_mode",
    "adapt_policy",
    "compat_codec",
    "ds_placement",
    "make_ds_policy",
]


class CompatError(PolicyError):
    """An unknown compat mode, or a trace, cluster or placement the mode does not allow (one line naming
    it; a :class:`~policies.base.PolicyError`, so the command line exits 2 on it)."""


#: DeepShare's node sets on its 4-node cluster (``action_helper.decode_action``: actions 0-6).
DEEPSHARE_NODE_SETS: tuple[tuple[int, ...], ...] = (
    (0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3), (0, 1, 2, 3),
)
#: DeepShare's multi-node shapes per GPU demand, ``(nodes, GPUs per node)``, in the order its LAS / SRTF
#: try them (``find_las_srtf_placement`` walks ``placement_rule`` backwards and stops at one node).
DEEPSHARE_SHAPES: dict[int, tuple[tuple[int, int], ...]] = {
    2: ((2, 1),),
    4: ((4, 1), (2, 2)),
    8: ((4, 2), (2, 4)),
}


@dataclass(frozen=True)
class CompatMode:
    """One peer simulator's rules (module docstring), read by the simulator, its backend and the policies.

    :param name: the mode's name (``deepshare``).
    :param num_nodes: nodes the cluster must have.
    :param gpus_per_node: GPUs each node must have.
    :param node_sets: the sets of node indices a job may span (sorted tuples).
    :param shapes: GPU demand -> allowed ``(nodes, GPUs per node)`` shapes, in the order the peer tries them.
    :param contention: the :class:`~policies.perf.ContentionModel` rule (``contention=``).
    :param round_len: seconds between rounds.
    :param restart_overhead: seconds without progress after a preempted job restarts.
    :param submit_at_zero: every job is submitted at t = 0.
    :param every_round: ask the policy every round, also while no job waits (the peer re-places
        running jobs every round).
    """

    name: str
    num_nodes: int
    gpus_per_node: int
    node_sets: tuple[tuple[int, ...], ...]
    shapes: dict[int, tuple[tuple[int, int], ...]] = field(hash=False)
    contention: str = "ds-min"
    round_len: float = 300.0
    restart_overhead: float = 0.0
    submit_at_zero: bool = True
    every_round: bool = True

    def check_cluster(self, cluster: ClusterSpec) -> None:
        """:class:`CompatError` unless ``cluster`` is the peer's (node count and GPUs per node)."""
        g = cluster.gpus_per_node
        if cluster.num_nodes != self.num_nodes or any(int(x) != self.gpus_per_node for x in g):
            raise CompatError(
                f"--compat {self.name} needs the seed's cluster, {self.num_nodes} nodes of {self.gpus_per_node} GPUs "
                f"({self.num_nodes}x{self.gpus_per_node}); got {cluster.describe()}"
            )

    def check_job(self, job_id: str, gpu_demand: int) -> None:
        """:class:`CompatError` unless the peer can place a job of ``gpu_demand`` GPUs."""
        if gpu_demand not in self.shapes:
            raise CompatError(
                f"job {job_id!r}: gpu_demand {gpu_demand} is not one the {self.name} mode places "
                f"({', '.join(map(str, sorted(self.shapes)))} GPUs)"
            )

    def placement_problem(self, job_id: str, gpu_demand: int, p: Placement) -> str | None:
        """Why the mode forbids placing job ``job_id`` of ``gpu_demand`` GPUs on ``p`` (one line), or ``None``."""
        shapes = self.shapes.get(gpu_demand)
        if shapes is None:
            return f"job {job_id!r}: gpu_demand {gpu_demand} is not one the {self.name} mode places"
        per = {c for _n, c in p.alloc}
        shape = (p.num_nodes, next(iter(per)) if len(per) == 1 else -1)
        if shape not in shapes:
            allowed = ", ".join(f"{n} nodes x {c}" for n, c in shapes)
            return (f"job {job_id!r}: --compat {self.name} places {gpu_demand} GPUs only as {allowed} GPUs, "
                    f"got {p.num_nodes} node(s) {dict(p.alloc)}")
        if tuple(p.nodes) not in self.node_sets:
            return f"job {job_id!r}: --compat {self.name} allows no node set {tuple(p.nodes)}"
        return None

    def allows(self, gpu_demand: int, p: Placement) -> bool:
        """Whether the mode allows ``p`` for a job of ``gpu_demand`` GPUs."""
        return self.placement_problem("", gpu_demand, p) is None


#: The compat modes by name.
COMPAT_NAMES = ("deepshare",)


def compat_mode(name: str) -> CompatMode:
    """The compat mode ``name`` (:data:`COMPAT_NAMES`); :class:`CompatError` for another name."""
    key = name.strip().lower() if isinstance(name, str) else name
    if key == "deepshare":
        return CompatMode(
            name="deepshare", num_nodes=4, gpus_per_node=8, node_sets=DEEPSHARE_NODE_SETS, shapes=DEEPSHARE_SHAPES,
        )
    raise CompatError(f"unknown compat mode {name!r}; modes: {', '.join(COMPAT_NAMES)}")


def ds_placement(job: JobInfo, free: np.ndarray, state: ClusterState | None = None,
                 mode: CompatMode | None = None) -> Placement | None:
    """DeepShare's LAS / SRTF placement (``find_las_srtf_placement``): for each of the job's shapes
    ``(k nodes, c GPUs each)`` widest first, the first ``k`` nodes (by index) with at least ``c`` free
    GPUs; ``None`` when no shape fits. A node set the mode does not allow is skipped (on the seed's
    4 nodes every pair and the full set are allowed, so nothing is skipped there)."""
    mode = mode or _DEEPSHARE
    shapes = mode.shapes.get(job.gpu_demand, ())
    for k, c in shapes:
        nodes = [i for i in range(len(free)) if int(free[i]) >= c][:k]
        if len(nodes) < k:
            continue
        if tuple(nodes) not in mode.node_sets:
            continue
        return Placement(tuple((n, c) for n in nodes))
    return None


class DSPlacement:
    """:func:`ds_placement` as a :data:`policies.placement.PLACEMENT_RULES` rule (``ORDER:ds``)."""

    uses_running = False

    def __init__(self, perf=None) -> None:  # noqa: ARG002 - the rules' factory signature
        self.mode = _DEEPSHARE

    def __call__(self, job: JobInfo, free: np.ndarray, state: ClusterState) -> Placement | None:
        return ds_placement(job, free, state, self.mode)


def _las_key(j: JobInfo) -> float:
    # seconds run so far (DeepShare's trained_time); descending: negated. Millisecond keys (time_key)
    # so that float rounding of equal run times does not break DeepShare's ties.
    return -time_key(j.attained_service / j.gpu_demand)


def _srtf_key(j: JobInfo) -> float:
    return j.done_samples / j.total_samples


#: The DeepShare orderings by policy name.
DS_ORDERS: dict[str, Callable[[JobInfo], float]] = {"ds-las": _las_key, "ds-srtf": _srtf_key}
DS_POLICY_NAMES = tuple(DS_ORDERS)


class DSOrderPolicy(Policy):
    """DeepShare's LAS or SRTF (module docstring): each round, preempt every running job, stable-sort
    ``pending + running`` by the order's key and place from the head until one does not fit.

    :param name: ``ds-las`` or ``ds-srtf``.
    :param mode: the compat mode whose shapes and node sets :func:`ds_placement` uses.
    """

    def __init__(self, name: str, mode: CompatMode | None = None) -> None:
        if name not in DS_ORDERS:
            raise PolicyError(f"unknown DeepShare ordering {name!r}; choose from {', '.join(DS_ORDERS)}")
        self.name = name
        self.key = DS_ORDERS[name]
        self.mode = mode or _DEEPSHARE

    #: asked every round: it re-places the running jobs (DeepShare preempts all of them every round)
    time_invariant = False
    #: ``True`` so that the round loop asks it also while no job waits (it re-places the running jobs
    #: then too, as DeepShare does); it never resizes a job
    resizes = True

    def schedule(self, state: ClusterState) -> Decision:
        """Preempt every running job (in start order) and place ``pending + running`` in the order's stable
        sort until the head does not fit. With :attr:`place_limit` ``n``: the first ``n`` placements of that
        round, still with every running job preempted (the policy re-places all of them by design)."""
        dec = Decision()
        running = list(state.running)
        queue = list(state.pending) + running
        queue.sort(key=self.key)  # stable: ties keep queue order, as DeepShare's list.sort
        free = np.array(state.free_gpus, dtype=np.int64)
        usable = state.usable
        for j in running:
            dec.preempt.append(j.job_id)
            for n, c in j.placement.alloc:  # type: ignore[union-attr]
                if usable is None or usable[n]:
                    free[n] += c
        limit = self.place_limit
        for j in queue:
            if limit is not None and len(dec.place) >= limit:
                break
            p = ds_placement(j, free, state, self.mode)
            if p is None:
                break  # DeepShare stops at the first job that does not fit
            for n, c in p.alloc:
                free[n] -= c
            dec.place.append((j.job_id, p))
        return dec


def make_ds_policy(name: str) -> DSOrderPolicy:
    """``ds-las`` / ``ds-srtf`` (:class:`DSOrderPolicy`) on the DeepShare mode."""
    return DSOrderPolicy(name.strip().lower())


def compat_codec(codec, mode: CompatMode):
    """Make a :class:`~policies.codecs.deepshare.DeepShareCodec` offer only the placement options ``mode``
    allows (the others become infeasible, so the policy's action mask drops them). Changes ``codec`` in
    place (its class becomes a subclass that filters :meth:`_options`) and returns it."""
    base = type(codec)
    if getattr(base, "_compat_mode", None) is not None:
        return codec
    sub = _COMPAT_CODECS.get((base, mode.name))
    if sub is None:
        orig = base._options

        def _options(self, g, nix):
            opts = orig(self, g, nix)
            return tuple(p if p is not None and self._compat_mode.allows(g, p) else None for p in opts)

        sub = type(f"Compat{base.__name__}", (base,), {"_options": _options, "_compat_mode": mode})
        _COMPAT_CODECS[(base, mode.name)] = sub
    codec.__class__ = sub
    memo = getattr(codec, "_opt_memo", None)
    if memo is not None:
        memo.clear()
    return codec


class CompatRule:
    """A placement rule restricted to ``mode``: ``rule``'s placement when the mode allows it, else
    :func:`ds_placement` (rl-hybrid's safety rule under a compat mode)."""

    def __init__(self, rule, mode: CompatMode) -> None:
        self.rule = rule
        self.mode = mode
        self.uses_running = getattr(rule, "uses_running", False)

    def __call__(self, job: JobInfo, free: np.ndarray, state: ClusterState) -> Placement | None:
        p = self.rule(job, free, state)
        if p is not None and self.mode.allows(job.gpu_demand, p):
            return p
        return ds_placement(job, free, state, self.mode)


def adapt_policy(policy: Policy, mode: CompatMode | None) -> Policy:
    """``policy`` under compat ``mode`` (changed in place and returned): a learned policy's codec offers only
    the mode's placements (:func:`compat_codec`; the size-free codec's placement slots through
    :class:`CompatRule`) and rl-hybrid's safety rule places only as the mode allows
    (:class:`CompatRule`); other policies are left as they are (a heuristic must use the ``ds`` placement
    rule, ``ORDER:ds``, or the simulator refuses its placements)."""
    if mode is None:
        return policy
    codec = getattr(policy, "codec", None)
    if codec is not None and hasattr(codec, "rules"):  # the size-free codec: each placement slot as the mode allows
        codec.rules = tuple(r if isinstance(r, CompatRule) else CompatRule(r, mode) for r in codec.rules)
    elif codec is not None:
        compat_codec(codec, mode)
    rule = getattr(policy, "rule", None)
    if rule is not None and not isinstance(rule, CompatRule):
        policy.rule = CompatRule(rule, mode)
    return policy


_COMPAT_CODECS: dict[tuple[type, str], type] = {}
_DEEPSHARE = compat_mode("deepshare")


def _register_placement() -> None:
    from policies.placement import PLACEMENT_RULES

    PLACEMENT_RULES.setdefault("ds", DSPlacement)


_register_placement()
