"""Chic and Chic-Pair (seed 001, Gong et al., IWQoS 2019): a policy network decides, one task at a
time, how many workers and parameter servers (PSs) each of the first ``I`` workloads gets.

**Workloads.** The jobs in the system in arrival order (submit time, then id); the first ``I``
(default 3, the seed's) are the *slots*, the rest the queue. Only slot jobs run.

**State** (:func:`encode`, float32, size ``I * (M + 3) + 1`` for Chic, ``I * (M + 2) + 1`` for
Chic-Pair, ``M`` = 8 PS models of :data:`policies.psmodel.PS_MODELS`), per slot: the model one-hot,
the backlog (remaining epochs / :data:`BACKLOG_SCALE`, the seed's remaining iterations), the workers
and (Chic only) the PSs allocated so far in this decision phase (each / :data:`COUNT_SCALE`); an empty
slot is all zeros. Last: the queue length / :data:`QUEUE_SCALE`. Nothing in it depends on the
cluster's size.

**Actions** (:class:`ChicSpec`): Chic has ``2I + 1``: ``2i`` adds a worker to slot ``i``, ``2i + 1``
a PS (0-based ``i``), the last stops. Chic-Pair has ``I + 1``: ``i`` adds a worker and a PS to slot
``i``, the last stops.

**Decision phase** (:meth:`ChicPolicy.decide`): every slot starts at 0 workers and 0 PSs; the network
is asked again and again, one task per answer, until it stops or the state is in the seed's S': no
task of a present workload fits the cluster's free aggregate GPUs / CPUs / memory (the seed's
condition (1)), or no task lowers any present workload's per-iteration time ``g_i(w, p)`` (condition
(2)), or no workload is present. ``g`` is the speed the simulator runs PS jobs at (DL2's measured
profile, ``g = "measured"``, the default: the seed's ``g_i`` is its simulator's own), that speed at the
PSs the workers' nodes can host (``g = "placed"``: the platform puts PSs only on a job's worker nodes,
:func:`ps_room`, so PSs past that room add nothing and a worker can help by making room for more) or
Optimus' fitted form (``g = "fitted"``, :meth:`policies.psmodel.PSPerformanceModel.fitted`); the
checkpoint records which. The mask (:func:`action_mask`) forbids a task that does not fit, more workers
than ``max_gpus``, more PSs than ``max_gpus`` or :data:`policies.psmodel.MAX_PS`, a task after which
no number of tasks of its kind lowers its workload's ``g`` (condition (2) applied task by task, with a
look-ahead over the measured profile's dips, :func:`_helps`; with ``g = "placed"`` also a worker that
makes room for more PSs, :func:`_helps_room`; a workload that cannot run yet, without
a PS or below the workers it can start on, takes only the kind it lacks: a preempted elastic job
restarts on exactly its last size, the platform's rule), and stopping while no workload can run yet.
An action on an empty slot is a no-op the seed punishes (``-p1``, :func:`step_penalty`); it is masked
here, in training too (:func:`action_mask` offers it only with ``allow_empty``): with it available the
cross-entropy method's elite was chosen by how few such no-ops a trajectory took, not by its
completion times (docs/ELASTIC.md). A phase ends after :data:`MAX_PHASE_STEPS` answers at most.

**When** (:meth:`ChicPolicy.schedule`): a new phase runs when the set of slot jobs changes (a slot
job finished, or a job arrived while fewer than ``I`` were in the system: the seed's two
triggers); otherwise the last plan stands and is re-applied where the cluster does not match it (a
waiting job starts on one worker, the platform's rule, and grows to its plan at the next round). A
plan under which nothing runs while jobs wait is planned again at the next round.
The plan is laid onto nodes as the elastic baselines lay theirs (:class:`policies.elastic.ElasticBaseline`).

**Reward** (seed, section 4.2; :func:`step_penalty`, :func:`time_reward`): ``r1`` = minus the time
all workloads spend in the system during the step, in units of :data:`REWARD_UNIT_S` (20 min);
``r2 = -p1`` for an action on an empty slot (never paid here: the action is masked); ``r3`` (Chic only) ``-p2`` when a task is first given
to a workload with neither worker nor PS, ``+p2`` when it then has both. Defaults ``p1 = 5``,
``p2 = 1`` (the seed's). Chic-Pair gives both tasks at once and has no ``r3`` (the seed says it drops
the worker-without-PS penalty).

**Network** (:class:`ChicNet`): fully connected, ReLU, hidden 64 / 32 / 4 (the seed's), softmax over
the unmasked actions; numpy only.

**Checkpoints**: ``NAME.safetensors`` (float32 tensors ``l{k}.weight`` ``(out, in)``, ``l{k}.bias``)
+ ``NAME.json`` (:func:`save_chic_checkpoint`, :func:`load_chic_checkpoint`), never pickled; the
shipped ones are ``policies/checkpoints/chic/chic.json`` and ``chic-pair.json``.

Pure: no I/O except reading and writing checkpoints.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from policies.base import PolicyError
from policies.elastic import ElasticBaseline, PlanJob, fits_capacity, materialize, plan_capacity, plan_jobs
from policies.psmodel import EPOCH_SIZE, MAX_PS, PS_MODELS, canonical_ps_model
from policies.state import ClusterState, Decision

__all__ = [
    "VARIANTS", "DEFAULT_I", "G_SOURCES", "HIDDEN", "P1", "P2", "REWARD_UNIT_S", "MAX_PHASE_STEPS",
    "ChicSpec", "ChicNet", "Slot", "encode", "action_mask", "step_penalty", "time_reward", "ps_room",
    "ChicPolicy", "ChicCheckpoint", "save_chic_checkpoint", "load_chic_checkpoint", "make_chic_policy",
    "shipped_checkpoint",
]

VARIANTS = ("chic", "chic-pair")
#: Workloads the agent schedules (the seed's default I).
DEFAULT_I = 3
#: Hidden layer widths (the seed's section 5).
HIDDEN = (64, 32, 4)
#: Penalty for an action on an empty slot (the seed's p1).
P1 = 5.0
#: Penalty for a workload with a worker but no PS or the reverse (the seed's p2).
P2 = 1.0
#: The unit of r1 (s): the seed's 20 minutes.
REWARD_UNIT_S = 1200.0
#: Sources of the per-iteration time ``g`` of condition (2) (:class:`ChicPolicy`); the first is the default.
G_SOURCES = ("measured", "fitted", "placed")
#: Most answers in one decision phase (a bound on no-op actions while sampling).
MAX_PHASE_STEPS = 256
#: Scales of the state's entries: remaining epochs, worker / PS counts, queue length.
BACKLOG_SCALE = 100.0
COUNT_SCALE = 10.0
QUEUE_SCALE = 10.0
FORMAT = "rlsched-chic"
FORMAT_VERSION = 1
_CKPT_DIR = Path(__file__).resolve().parent / "checkpoints" / "chic"


@dataclass(frozen=True)
class ChicSpec:
    """The variant (``chic`` or ``chic-pair``) and the number of slots ``I`` (>= 1)."""

    variant: str = "chic"
    slots: int = DEFAULT_I

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise PolicyError(f"chic: variant must be one of {', '.join(VARIANTS)}, got {self.variant!r}")
        if isinstance(self.slots, bool) or not isinstance(self.slots, int) or not 1 <= self.slots <= 64:
            raise PolicyError(f"chic: slots (I) must be an integer in 1..64, got {self.slots!r}")

    @property
    def pair(self) -> bool:
        return self.variant == "chic-pair"

    @property
    def per_slot(self) -> int:
        return len(PS_MODELS) + (2 if self.pair else 3)

    @property
    def obs_size(self) -> int:
        return self.slots * self.per_slot + 1

    @property
    def n_actions(self) -> int:
        return self.slots + 1 if self.pair else 2 * self.slots + 1

    @property
    def stop(self) -> int:
        """Index of the stop action (the last)."""
        return self.n_actions - 1

    def target(self, action: int) -> tuple[int, int, int]:
        """``(slot, workers added, PSs added)`` of a task action (not the stop action)."""
        if self.pair:
            return action, 1, 1
        return action // 2, 1 - action % 2, action % 2


@dataclass
class Slot:
    """A slot job during a decision phase: the planner's view (:class:`policies.elastic.PlanJob`) and
    its model's index in :data:`PS_MODELS`."""

    job: PlanJob
    model_index: int

    @property
    def backlog_epochs(self) -> float:
        info = self.job.info
        return info.remaining_samples / EPOCH_SIZE[PS_MODELS[self.model_index]]


def encode(spec: ChicSpec, slots: Sequence[Slot | None], queue: int) -> np.ndarray:
    """The state (module docstring): float32 ``[spec.obs_size]``. ``slots`` has ``spec.slots``
    entries (``None``: empty); their ``job.w`` / ``job.p`` are the counts allocated so far."""
    x = np.zeros(spec.obs_size, dtype=np.float32)
    m = len(PS_MODELS)
    for i, s in enumerate(slots):
        if s is None:
            continue
        o = i * spec.per_slot
        x[o + s.model_index] = 1.0
        x[o + m] = s.backlog_epochs / BACKLOG_SCALE
        x[o + m + 1] = s.job.w / COUNT_SCALE
        if not spec.pair:
            x[o + m + 2] = s.job.p / COUNT_SCALE
    x[-1] = queue / QUEUE_SCALE
    return x


def _helps(s: Slot, dw: int, dp: int, used: Sequence[float], cap: Sequence[float], speed) -> bool:
    """Whether adding tasks of this kind (``dw`` workers and ``dp`` PSs each) to the workload, one or
    more of them within its limits and the free aggregate ``cap - used``, raises its speed above the
    current one: condition (2) with a look-ahead, so that a measured ``g`` that dips between two
    counts (DL2's ResNet-50 at 1 worker: 47.3, 43.1, 49.3 for 5, 6, 7 PSs) does not end the growth
    at the dip. For a ``g`` convex along the direction (Optimus' fitted form) it is the one-step test."""
    j = s.job
    now = speed(j, j.w, j.p)
    hi_p = min(j.hi, MAX_PS)
    k = 1
    while j.w + k * dw <= j.hi and j.p + k * dp <= hi_p:
        add = tuple(k * (dw * a + dp * b) for a, b in zip(j.wv, j.pv))
        if not fits_capacity(used, add, cap):
            break
        if speed(j, j.w + k * dw, j.p + k * dp) > now:
            return True
        k += 1
    return False


def ps_room(cluster, wv: Sequence[float], pv: Sequence[float], workers: int, max_ps: int = MAX_PS) -> int:
    """Most PSs (``<= max_ps``) a job with ``workers`` workers of ``(GPUs, CPUs, GB)`` ``wv`` and PSs of
    ``pv`` can run with, on the otherwise empty ``cluster``, laid out as the platform lays a growing job
    (:func:`policies.elastic.materialize`: workers packed onto the nodes with most GPUs first, in node
    order; PSs only on the job's worker nodes, split evenly, the first nodes taking the remainder,
    :func:`policies.elastic.node_usage`; on a ``spread`` cluster on any node's free CPUs and memory).
    0 when the workers do not fit; ``max_ps`` where the nodes
    declare no CPUs / memory."""
    gpn = cluster.gpus_per_node
    cpus = [math.inf if c is None else float(c) for c in cluster.cpus_per_node]
    mem = [math.inf if m is None else float(m) for m in cluster.mem_gb_per_node]
    order = sorted(range(len(gpn)), key=lambda n: (-gpn[n], n))
    counts: dict[int, int] = {}
    left = workers
    for n in order:
        if left == 0:
            break
        k = min(left, gpn[n])
        if wv[1] > 0:
            k = min(k, int(cpus[n] // wv[1]) if cpus[n] != math.inf else k)
        if wv[2] > 0:
            k = min(k, int(mem[n] // wv[2]) if mem[n] != math.inf else k)
        if k > 0:
            counts[n] = k
            left -= k
    if left or not counts:
        return 0
    if cluster.ps_placement == "spread":  # PSs on any node (materialize's spread_ps)
        room = 0
        for n in range(len(gpn)):
            c = cpus[n] - counts.get(n, 0) * wv[1]
            m = mem[n] - counts.get(n, 0) * wv[2]
            k = max_ps
            if pv[1] > 0 and c != math.inf:
                k = min(k, int((c + 1e-9) // pv[1]))
            if pv[2] > 0 and m != math.inf:
                k = min(k, int((m + 1e-6) // pv[2]))
            room += max(k, 0)
            if room >= max_ps:
                return max_ps
        return room
    nodes = sorted(counts)
    best = 0
    for p in range(1, max_ps + 1):
        base, extra = divmod(p, len(nodes))
        for i, n in enumerate(nodes):
            cnt = base + (1 if i < extra else 0)
            if counts[n] * wv[1] + cnt * pv[1] > cpus[n] + 1e-9 or counts[n] * wv[2] + cnt * pv[2] > mem[n] + 1e-6:
                return best
        best = p
    return best


def _helps_room(s: Slot, dw: int, dp: int, used: Sequence[float], cap: Sequence[float], speed, room) -> bool:
    """Condition (2) for ``g = "placed"``: :func:`_helps` on the placed speed (PSs past what the workers'
    nodes host, ``room(job, w)``, add nothing, so a PS there is refused), and, where no further PS raises
    the workload's placed speed at its worker count (its PSs fill the workers' room, or the measured
    profile peaks below it), a worker is also useful when some larger worker count ``w + k`` with ``p'``
    PSs, ``p <= p' <= room(job, w + k)`` (within the limits and the free aggregate ``cap - used``), is
    faster than now: on the platform workers on another node are what make room for more PSs (VGG-16 on
    the Chic cluster: 1 or 2 workers host 5 PSs, 1 : 4 at 18.7 being the best of them; 3 host 10, 22.0),
    while at a fixed PS count a worker only slows it. The look-ahead spans several workers because one
    more worker may add no room (VGG-16's second worker shares the first one's node)."""
    if _helps(s, dw, dp, used, cap, speed):
        return True
    j = s.job
    if not dw or dp or j.w + 1 > j.hi or _helps(s, 0, 1, used, cap, speed):
        return False
    now = speed(j, j.w, j.p)
    hi_p = min(j.hi, MAX_PS)
    for w in range(j.w + 1, j.hi + 1):
        most = _most_ps(j.wv, j.pv, w - j.w, used, cap)
        if most < 0:
            break
        for p in range(j.p, min(room(j, w), hi_p, j.p + most) + 1):
            if speed(j, w, p) > now:
                return True
    return False


def _most_ps(wv: Sequence[float], pv: Sequence[float], dw: int, used: Sequence[float], cap: Sequence[float]) -> int:
    """Most PSs of ``pv`` that fit the free aggregate ``cap - used`` beside ``dw`` more workers of ``wv``
    (the test of :func:`policies.elastic.fits_capacity`, solved for the PS count; at most
    :data:`policies.psmodel.MAX_PS`); -1 when the workers alone do not fit."""
    most = MAX_PS
    for a, b, u, c in zip(wv, pv, used, cap):
        left = c + 1e-9 - u - dw * a
        if left < 0:
            return -1
        if b > 0 and left != math.inf:
            most = min(most, int(left // b))
    return most


def _task_ok(s: Slot, dw: int, dp: int, used: Sequence[float], cap: Sequence[float], speed=None,
             room=None) -> bool:
    j = s.job
    if j.w + dw > j.hi or j.p + dp > min(j.hi, MAX_PS):
        return False
    if speed is not None:  # the task must lead to a lower per-iteration time (condition (2) per task)
        if j.w < j.lo or j.p == 0:  # not runnable yet: only the missing kind
            if (dw and j.w >= j.lo) or (dp and j.p >= 1 and not dw):
                return False
        elif room is not None:
            if not _helps_room(s, dw, dp, used, cap, speed, room):
                return False
        elif not _helps(s, dw, dp, used, cap, speed):
            return False
    add = tuple(dw * a + dp * b for a, b in zip(j.wv, j.pv))
    return fits_capacity(used, add, cap)


def action_mask(spec: ChicSpec, slots: Sequence[Slot | None], used: Sequence[float], cap: Sequence[float],
                allow_empty: bool = False, speed=None, room=None) -> np.ndarray:
    """bool ``[spec.n_actions]``: the task actions whose task fits the free aggregate ``cap - used``
    (GPUs, CPUs, GB) within the workload's limits; actions on empty slots when ``allow_empty``
    (the seed's punished no-op, for sampling); the stop action always.

    With ``speed(job, w, p)`` a task must also be useful: a workload that cannot run yet (no PS, or
    fewer workers than it can start on) takes only the kind it lacks; a runnable one only a task
    after which one or more tasks of the same kind raise its speed (the seed's condition (2), task
    by task, with the look-ahead of :func:`_helps`; with ``room(job, w)``, the PSs ``w`` workers' nodes
    host, also a worker that makes room for faster PS counts, :func:`_helps_room`)."""
    mask = np.zeros(spec.n_actions, dtype=bool)
    mask[spec.stop] = True
    for a in range(spec.stop):
        i, dw, dp = spec.target(a)
        s = slots[i]
        mask[a] = allow_empty if s is None else _task_ok(s, dw, dp, used, cap, speed, room)
    return mask


def step_penalty(spec: ChicSpec, slots: Sequence[Slot | None], action: int, p1: float = P1, p2: float = P2) -> float:
    """``r2 + r3`` of taking ``action`` in the current phase state (module docstring); counts before the
    action."""
    if action == spec.stop:
        return 0.0
    i, dw, dp = spec.target(action)
    s = slots[i]
    if s is None:
        return -p1
    if spec.pair:
        return 0.0
    w, p = s.job.w, s.job.p
    if w == 0 and p == 0:
        return -p2
    if (w == 0 and dw) or (p == 0 and dp):  # the missing kind arrives: both now
        return p2
    return 0.0


def time_reward(duration: float, slot_backlogs: Sequence[float], queue: int, arrivals: Sequence[float],
                unit: float = REWARD_UNIT_S) -> float:
    """The seed's eq. (8): ``-(sum_i D 1{B_i > 0} + N D + sum_j (D - A_j)) / unit`` for a step of
    ``duration`` D s, the slots' backlogs, ``queue`` = N waiting workloads and the arrival offsets
    ``A_j`` (s from the step's start) of the workloads arriving during it."""
    busy = sum(1 for b in slot_backlogs if b > 0)
    return -(busy * duration + queue * duration + sum(duration - a for a in arrivals)) / unit


class ChicNet:
    """A ReLU MLP evaluated with numpy: ``weights = [(W (out, in), b (out,)), ...]`` float32; the last
    layer outputs one logit per action."""

    def __init__(self, weights: Sequence[tuple[np.ndarray, np.ndarray]]) -> None:
        self.weights = [(np.asarray(W, np.float32), np.asarray(b, np.float32)) for W, b in weights]
        self._t = [(np.ascontiguousarray(W.T), b) for W, b in self.weights]

    @classmethod
    def init(cls, n_in: int, n_out: int, hidden: Sequence[int] = HIDDEN, seed: int = 0) -> "ChicNet":
        """He-initialised weights, zero biases; the last layer small (near-uniform first policy)."""
        rng = np.random.default_rng(seed)
        sizes = [n_in, *hidden, n_out]
        ws = []
        for k in range(len(sizes) - 1):
            std = math.sqrt(2.0 / sizes[k]) * (0.1 if k == len(sizes) - 2 else 1.0)
            ws.append((rng.normal(0, std, (sizes[k + 1], sizes[k])).astype(np.float32),
                       np.zeros(sizes[k + 1], np.float32)))
        return cls(ws)

    @property
    def in_features(self) -> int:
        return self.weights[0][0].shape[1]

    @property
    def out_features(self) -> int:
        return self.weights[-1][0].shape[0]

    def logits(self, x: np.ndarray) -> np.ndarray:
        """``x`` ``[in]`` or ``[n, in]`` -> logits ``[out]`` or ``[n, out]``."""
        last = len(self._t) - 1
        for k, (Wt, b) in enumerate(self._t):
            x = x @ Wt + b
            if k < last:
                x = np.maximum(x, 0.0)
        return x

    def flat(self) -> np.ndarray:
        return np.concatenate([np.concatenate([W.ravel(), b]) for W, b in self.weights]).astype(np.float64)

    def with_flat(self, v: np.ndarray) -> "ChicNet":
        out, o = [], 0
        for W, b in self.weights:
            nW, nb = W.size, b.size
            out.append((v[o:o + nW].reshape(W.shape), v[o + nW:o + nW + nb]))
            o += nW + nb
        return ChicNet(out)


def _choose(z: np.ndarray, mask: np.ndarray, mode: str, rng: np.random.Generator | None) -> int:
    if mode == "greedy" or rng is None:
        return int(np.where(mask, z, -np.inf).argmax())
    idx = np.flatnonzero(mask)
    if mode == "uniform":
        return int(idx[rng.integers(len(idx))])
    zz = z[idx].astype(np.float64)
    pr = np.exp(zz - zz.max())
    pr /= pr.sum()
    return int(idx[rng.choice(len(idx), p=pr)])


class ChicPolicy(ElasticBaseline):
    """Chic / Chic-Pair (module docstring) with network ``net``.

    :param mode: ``greedy`` (the best unmasked action; what schedules), ``sample`` (from the softmax;
        training) or ``uniform`` (uniform over the unmasked actions: the seed's extra trajectory).
    :param record: keep every step's ``(state, mask, action)`` in :attr:`steps` and the penalties'
        sum in :attr:`penalty` (training).
    :param task_mask: mask tasks that do not lower their workload's per-iteration time ``g`` (the
        default, module docstring); ``False``: only the resources and limits are masked and condition (2)
        ends the phase as the seed states it, when no task helps any workload (the ablation
        ``--no-task-mask``; recorded in the checkpoint).
    :param g: where the per-iteration time ``g_i(w, p)`` of conditions (2) and the task mask comes from
        (:data:`G_SOURCES`): ``measured`` (the speeds the simulator runs PS jobs at, DL2's profile: the
        seed's ``g_i``, which its simulator knows exactly), ``placed`` (the measured speed at the PSs the
        workers' nodes host, :meth:`tables`; the task mask then also offers a worker that makes room for
        faster PS counts) or ``fitted`` (Optimus' fitted form, what the ``optimus`` baseline plans
        with). Recorded in the checkpoint.
    Every answer's CPU time (s, this thread's, :func:`time.thread_time`: other processes on a loaded host
    do not count) goes to :attr:`step_times` (mask + encode + network + choice).
    """

    resizes = True
    time_invariant = False

    def __init__(self, net: ChicNet, spec: ChicSpec, perf=None, mode: str = "greedy", seed: int = 0,
                 record: bool = False, p1: float = P1, p2: float = P2, task_mask: bool = True,
                 g: str = "measured") -> None:
        self.name = spec.variant
        self.task_mask = bool(task_mask)
        super().__init__(perf, interval=0.0)
        if g not in G_SOURCES:
            raise PolicyError(f"policy {spec.variant}: g must be one of {', '.join(G_SOURCES)}, got {g!r}")
        self.g = g
        if g in ("measured", "placed") and perf is not None:
            self.estimator = perf
        self._cluster = None
        self._tables: dict = {}
        if net.in_features != spec.obs_size or net.out_features != spec.n_actions:
            raise PolicyError(f"policy {spec.variant}: the network maps {net.in_features} -> {net.out_features}, "
                              f"the state / actions of I={spec.slots} need {spec.obs_size} -> {spec.n_actions}")
        if mode not in ("greedy", "sample", "uniform"):
            raise PolicyError(f"policy {spec.variant}: mode must be greedy, sample or uniform, got {mode!r}")
        self.net, self.spec, self.mode = net, spec, mode
        self.rng = np.random.default_rng(seed)
        self.record, self.p1, self.p2 = record, p1, p2
        self.step_times: list[float] = []
        self.reset()

    def reset(self) -> None:
        super().reset()
        self._slots_ids: tuple[str, ...] = ()
        self._plan: dict[str, tuple[int, int]] = {}
        self.steps: list[tuple[np.ndarray, np.ndarray, int]] = []
        self.penalty = 0.0
        self.phases = 0

    # ------------------------------------------------------------------ g
    def room(self, j, w: int) -> int:
        """PSs ``w`` workers of job ``j`` can run with on the cluster of the last snapshot (:func:`ps_room`;
        :data:`policies.psmodel.MAX_PS` before any snapshot)."""
        key = ("room", tuple(j.wv), tuple(j.pv), w)
        got = self._tables.get(key)
        if got is None:
            got = self._tables[key] = MAX_PS if self._cluster is None else ps_room(self._cluster, j.wv, j.pv, w)
        return got

    def tables(self, j) -> np.ndarray:
        """``g = "placed"``: float64 ``[hi + 1, MAX_PS + 1]`` speeds of job ``j``'s model with ``w``
        workers and ``p`` PSs, the PSs cut to what ``w`` workers' nodes host (:meth:`room`)."""
        key = (j.info.model, j.hi, tuple(j.wv), tuple(j.pv))
        got = self._tables.get(key)
        if got is None:
            hi = max(j.hi, 1)
            got = np.zeros((hi + 1, MAX_PS + 1))
            for w in range(1, hi + 1):
                room = self.room(j, w)
                for p in range(1, MAX_PS + 1):
                    got[w, p] = 0.0 if room < 1 else super().speed(j, w, min(p, room))
            self._tables[key] = got
        return got

    def speed(self, j, w: int, p: int) -> float:
        """Estimated speed of job ``j`` with ``w`` workers and ``p`` PSs (the ``g`` of condition (2)):
        :meth:`policies.elastic.ElasticBaseline.speed` on the estimator of :attr:`g`; with ``g =
        "placed"`` the measured speed at the PSs the workers' nodes host (:meth:`tables`)."""
        if self.g != "placed" or not j.ps_job:
            return super().speed(j, w, p)
        t = self.tables(j)
        if 0 <= w < t.shape[0] and 0 <= p < t.shape[1]:
            return float(t[w, p])
        return super().speed(j, w, p)

    # ------------------------------------------------------------------ decision phase
    def _improvable(self, s: Slot) -> bool:
        """Whether a task would lower the workload's estimated per-iteration time (condition (2)); a
        workload that cannot run yet always can."""
        j = s.job
        if j.w < j.lo or j.p == 0:
            return True
        g = self.speed(j, j.w, j.p)
        if self.spec.pair:
            return self.speed(j, j.w + 1, j.p + 1) > g
        return self.speed(j, j.w + 1, j.p) > g or self.speed(j, j.w, j.p + 1) > g

    def decide(self, slots: list[Slot | None], queue: int, cap: Sequence[float]) -> None:
        """Run one decision phase: set ``job.w`` / ``job.p`` of every slot (module docstring)."""
        spec = self.spec
        used = [0.0, 0.0, 0.0]
        present = [s for s in slots if s is not None]
        for s in present:
            s.job.w = s.job.p = 0
        if not present:
            return
        self.phases += 1
        for _ in range(MAX_PHASE_STEPS):
            t0 = time.thread_time()
            mask = action_mask(spec, slots, used, cap, False, self.speed if self.task_mask else None,
                               self.room if self.task_mask and self.g == "placed" else None)
            real = any(mask[a] for a in range(spec.stop) if slots[spec.target(a)[0]] is not None)
            if not real or (not self.task_mask and not any(self._improvable(s) for s in present)):
                return  # S': the seed's conditions (1) / (2)
            if not any(s.job.w >= s.job.lo and s.job.p >= 1 for s in present):
                mask[spec.stop] = False  # no stop before a workload can run (else nothing ever changes)
            x = encode(spec, slots, queue)
            a = _choose(self.net.logits(x), mask, self.mode, self.rng)
            self.step_times.append(time.thread_time() - t0)
            if self.record:
                self.steps.append((x, mask, a))
                self.penalty += step_penalty(spec, slots, a, self.p1, self.p2)
            if a == spec.stop:
                return
            i, dw, dp = spec.target(a)
            s = slots[i]
            if s is None:
                continue
            j = s.job
            for k, v in enumerate(j.wv):
                used[k] += dw * v
            for k, v in enumerate(j.pv):
                used[k] += dp * v
            j.w += dw
            j.p += dp

    # ------------------------------------------------------------------ the round
    def plan(self, jobs, cap, state) -> None:
        """Set ``w`` / ``p`` of every job from Chic's plan for its first ``I`` jobs (the slots), planned
        again by the network (:meth:`decide`) only when the set of slot jobs changes (the seed's two
        triggers); jobs beyond the slots get 0 / 0."""
        spec = self.spec
        ids = tuple(j.info.job_id for j in jobs[:spec.slots])
        if ids != self._slots_ids:
            self._slots_ids = ids
            slots: list[Slot | None] = []
            for j in jobs[:spec.slots]:
                m = canonical_ps_model(j.info.model)
                if m is None or not j.ps_job:
                    raise PolicyError(f"policy {spec.variant}: job {j.info.job_id} ({j.info.model}) is not a "
                                      f"parameter-server job; Chic schedules PS jobs only")
                slots.append(Slot(j, PS_MODELS.index(m)))
            slots += [None] * (spec.slots - len(slots))
            self.decide(slots, len(jobs) - len(ids), cap)
            self._plan = {}
            for s in slots:
                if s is not None:
                    ok = s.job.w >= s.job.lo and s.job.p >= 1
                    self._plan[s.job.info.job_id] = (s.job.w, s.job.p) if ok else (0, 0)
        for j in jobs:
            j.w, j.p = self._plan.get(j.info.job_id, (0, 0))

    def schedule(self, state: ClusterState) -> Decision:
        if self._cluster is not state.cluster:
            self._cluster, self._tables = state.cluster, {}
        jobs = plan_jobs(state)
        self.plan(jobs, plan_capacity(state), state)
        dec = Decision() if all((j.w, j.p) == (j.cur_w, j.cur_p) for j in jobs) else materialize(state, jobs)
        if jobs and not dec.place and all(j.cur_w == 0 or j.info.job_id in dec.preempt for j in jobs):
            self._slots_ids = ()  # this plan runs nothing: the next round plans again
        return dec


# ---------------------------------------------------------------------- checkpoints
@dataclass
class ChicCheckpoint:
    """A loaded checkpoint: the spec, the network, the metadata."""

    spec: ChicSpec
    net: ChicNet
    meta: dict
    path: Path


def save_chic_checkpoint(path: str | Path, spec: ChicSpec, net: ChicNet, training: dict | None = None,
                         reward: dict | None = None, task_mask: bool = True, g: str = "measured") -> Path:
    """Write ``NAME.safetensors`` + ``NAME.json`` (atomically, weights first); returns the JSON path."""
    from policies.checkpoint import json_path, write_policy_files

    jpath = json_path(path)
    tensors = {}
    for k, (W, b) in enumerate(net.weights):
        if not (np.isfinite(W).all() and np.isfinite(b).all()):
            raise PolicyError(f"{jpath}: refusing to save non-finite weights (layer {k})")
        tensors[f"l{k}.weight"] = np.ascontiguousarray(W, np.float32)
        tensors[f"l{k}.bias"] = np.ascontiguousarray(b, np.float32)
    meta = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "variant": spec.variant, "slots": spec.slots,
        "models": list(PS_MODELS), "obs_size": spec.obs_size, "n_actions": spec.n_actions,
        "task_mask": bool(task_mask), "g": g,
        "network": {"kind": "mlp", "activation": "relu", "layers": [f"l{k}" for k in range(len(net.weights))]},
        "scales": {"backlog_epochs": BACKLOG_SCALE, "count": COUNT_SCALE, "queue": QUEUE_SCALE},
        "reward": reward or {"p1": P1, "p2": P2, "unit_s": REWARD_UNIT_S},
        "training": training or {},
    }
    return write_policy_files(jpath, tensors, meta)


def load_chic_checkpoint(path: str | Path) -> ChicCheckpoint:
    """Load and check a Chic checkpoint; :class:`~policies.checkpoint.CheckpointError` (one line naming the
    file) when it is missing, not JSON, of another format, its weights missing / of another hash / of
    shapes that do not chain from the state size to the action count, or not finite float32."""
    from policies.checkpoint import CheckpointError, read_policy_files

    meta, tensors, jpath, wpath = read_policy_files(path, fmt=FORMAT, version=FORMAT_VERSION, label="Chic")
    if meta.get("models") != list(PS_MODELS):
        raise CheckpointError(f"{jpath}: models {meta.get('models')!r} are not this build's PS models")
    try:
        spec = ChicSpec(meta.get("variant"), meta.get("slots"))
    except PolicyError as exc:
        raise CheckpointError(f"{jpath}: {exc}") from None
    wname = wpath.name
    layers = meta.get("network", {}).get("layers") if isinstance(meta.get("network"), dict) else None
    if not isinstance(layers, list) or not layers or set(tensors) != {f"{n}.{t}" for n in layers for t in ("weight", "bias")}:
        raise CheckpointError(f"{jpath}: network.layers does not name exactly the tensors of {wname}")
    ws, n_in = [], spec.obs_size
    for n in layers:
        W, b = tensors[f"{n}.weight"], tensors[f"{n}.bias"]
        if W.dtype != np.float32 or b.dtype != np.float32 or W.ndim != 2 or b.shape != (W.shape[0],) \
                or W.shape[1] != n_in:
            raise CheckpointError(f"{wpath}: layer {n} has shapes {W.shape} / {b.shape} ({W.dtype}); "
                                  f"float32 (out, {n_in}) / (out,) expected")
        if not (np.isfinite(W).all() and np.isfinite(b).all()):
            raise CheckpointError(f"{wpath}: layer {n} holds non-finite weights")
        ws.append((W, b))
        n_in = W.shape[0]
    if n_in != spec.n_actions:
        raise CheckpointError(f"{wpath}: the network outputs {n_in} logits; {spec.variant} with I={spec.slots} "
                              f"has {spec.n_actions} actions")
    if not isinstance(meta.get("task_mask", True), bool):
        raise CheckpointError(f"{jpath}: task_mask must be true or false")
    if meta.get("g", "fitted") not in G_SOURCES:
        raise CheckpointError(f"{jpath}: g must be one of {', '.join(G_SOURCES)}, got {meta.get('g')!r}")
    return ChicCheckpoint(spec, ChicNet(ws), meta, jpath)


def shipped_checkpoint(variant: str) -> Path:
    """The shipped checkpoint of ``variant``: ``policies/checkpoints/chic/<variant>.json``."""
    return _CKPT_DIR / f"{variant}.json"


def make_chic_policy(name: str, perf=None, checkpoint: str | Path | None = None) -> ChicPolicy:
    """``chic`` / ``chic-pair`` with the shipped checkpoint, ``checkpoint``, or the one ``NAME:/path`` names;
    the checkpoint's variant must match the name."""
    base, _, path = name.strip().partition(":")
    base = base.strip().lower()
    if base not in VARIANTS:
        raise PolicyError(f"unknown Chic policy {name!r}; Chic policies: {', '.join(VARIANTS)} (optionally :/path)")
    ck = load_chic_checkpoint(path.strip() or checkpoint or shipped_checkpoint(base))
    if ck.spec.variant != base:
        raise PolicyError(f"policy {name!r}: checkpoint {ck.path} is a {ck.spec.variant} checkpoint")
    return ChicPolicy(ck.net, ck.spec, perf, task_mask=ck.meta.get("task_mask", True),
                      g=ck.meta.get("g", "fitted"))
