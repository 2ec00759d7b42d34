"""DL2's training (seed 000 section 4): offline supervised warm-up that imitates DRF, then online RL
with actor-critic, experience replay and job-aware exploration, on the simulator.

**Episodes.** One episode simulates one generated sequence (:func:`trainer.elastic.generate`, setting
``dl2``, ``jobs`` jobs, seeds ``seed0 + k``) on ``data/clusters/dl2.yaml`` with the PS performance
model; the policy (:class:`RecordingDL2`) decides every slot (``DL2Spec.slot_s`` s).

**Warm-up** (:func:`collect_drf`, :func:`supervised`): DRF written in DL2's action space (the teacher,
:func:`drf_action`: the batch's job with the smallest dominant share gets one worker, plus one PS for a
PS job, until that does not fit, then stop, as :class:`policies.elastic.DRFPolicy` plans) drives the
episodes; every (state, mask, DRF's action) is a sample (at most ``sl_samples`` kept, uniformly); the
actor is fitted by cross-entropy (logits of infeasible actions masked) with Adam at ``sl_lr``.
``teacher="optimus"`` (ours, not the seed's) makes Optimus the teacher instead: each slot, Optimus' plan
(:class:`policies.elastic.OptimusPolicy`, its marginal-gain greedy) is taken as DL2 actions in the order
Optimus adds the tasks (:func:`optimus_actions`: ``+both`` for a job's first worker and PS, then
``+worker`` or ``+PS`` alone), then stop; the slot ends at Optimus' allocation. Optimus plans few workers
and many PSs per job, which the measured PS speeds favour and DRF, adding both together, never does.

**Online RL** (in :func:`train`): the actor samples its actions; job-aware exploration (:func:`poor_action`)
replaces the sample with probability ``epsilon`` by the seed's fixed action when the batch holds a job
with several workers and no PS, several PSs and no worker, or workers / PSs in a ratio above 10. Every
inference of slot ``t`` is a sample ``(s, mask, a, r_t, s'_t)`` with ``r_t`` the slot's reward
(:func:`policies.dl2.slot_reward`) and ``s'_t`` the first state of slot ``t + 1`` (none at the end of the
episode); samples go to a replay buffer of ``replay`` samples; at the end of each slot one mini-batch of
``batch`` samples updates the critic to the TD target ``r + gamma V(s')`` and the actor by
``-log pi(a|s) * (r + gamma V(s') - V(s)) - beta * H(pi(.|s))`` (Adam at ``rl_lr``).

**Stabilisers** (options, all off by default, so the defaults run the seed's plain actor-critic):
``target_tau`` > 0 takes ``V(s')`` of the TD target from a target critic that follows the critic by
Polyak averaging (:func:`soft_update` after each update); ``adv_norm`` scales the advantages of each
mini-batch to mean 0, std 1; ``clip`` > 0 clips each network's gradient norm; ``beta_end`` >= 0 moves
the entropy weight linearly from ``beta`` (first RL episode) to ``beta_end`` (last,
:func:`entropy_weight`); ``critic_lr`` sets the critic's own learning rate; ``updates`` mini-batches
are taken at each slot's end. ``init`` starts the RL phase from a checkpoint's actor and critic instead
of a warm-up (the parent's training record is kept in ``history["parent"]``); RL from a run's warm-up
checkpoint gives the same weights as that run with RL (a test checks it).

**Actor** (``arch``): ``flat``, the seed's MLP over the flattened state (``hidden`` its layers), or
``rows`` (ours, :class:`policies.dl2.DL2RowsNet`: one shared-weight scorer per job row with pooled
context, ``hidden`` the row scorer's layers, :data:`STOP_HIDDEN` the stop scorer's; torch twin
:func:`make_actor` / :func:`torch_actor`). The critic is an MLP over the state in both (``hidden``).
``remaining`` / ``counts`` (ours; the defaults are the seed's linear features) pick the transforms of the
state's remaining-epochs and workers / PSs features (:data:`policies.dl2.REMAINING`, at the scales
:func:`train_spec` gives them); ``log1p`` remaining epochs puts Optimus' marginal gain, a product of the
remaining work and a per-model function of the shape, in a range an MLP fits (docs/ELASTIC.md, "Optimus'
shapes").

**Behaviour and exploration of RL episodes** (ours, options; the defaults are the seed's):
``behaviour="greedy"`` takes the most likely feasible action (what validation and deployment run)
except with probability ``sample_p``, when it samples the softmax; ``explore="ps"`` replaces the seed's
job-aware rule by :func:`ps_action` (``+PS`` to the PS job with the fewest PSs per worker), with the same
probability ``epsilon``.

Defaults are the seed's hyper-parameters (section 6.1): 2 hidden layers of 256, Adam, learning rates
0.005 (supervised) and 0.0001 (RL), mini-batch 256, gamma 0.9, epsilon 0.4, beta 0.1, replay 8192; J = 40
(its section 6.5: around 40 concurrent jobs at most). The run length (episodes, jobs per episode, the
supervised epochs) is ours, sized for a short CPU run.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from policies.dl2 import COUNTS_SCALE, REMAINING_SCALE, DL2Net, DL2Policy, DL2Spec, Transition, save_dl2
from policies.elastic import OptimusPolicy, PlanJob, dominant_share, fits_capacity

ROOT = Path(__file__).resolve().parents[2]

__all__ = ["DL2TrainConfig", "TEACHERS", "BEHAVIOURS", "EXPLORE_RULES", "drf_action", "optimus_actions", "poor_action",
           "ps_action", "make_actor", "torch_actor", "RecordingDL2", "collect_drf", "supervised", "Replay",
           "ac_update", "soft_update", "entropy_weight", "parent_record", "train_spec", "evaluate", "train"]


@dataclass
class DL2TrainConfig:
    """What :func:`train` runs (module docstring)."""

    J: int = 40
    arch: str = "flat"  # the actor: "flat" (the seed's MLP) or "rows" (per-row scorer, policies.dl2.DL2RowsNet)
    # the remaining-epochs feature: "linear" (the seed's) or "log1p" (ours; policies.dl2.REMAINING), at the
    # scale policies.dl2.REMAINING_SCALE gives it
    remaining: str = "linear"
    counts: str = "linear"  # the workers / PSs features: "linear" (the seed's) or "log1p" (ours; policies.dl2.COUNTS)
    hidden: tuple[int, ...] = (256, 256)
    jobs: int = 60  # jobs per training sequence
    sl_traces: int = 4
    sl_samples: int = 40000
    sl_epochs: int = 30
    sl_lr: float = 0.005
    rl_episodes: int = 8
    rl_lr: float = 1e-4
    batch: int = 256
    gamma: float = 0.9
    epsilon: float = 0.4
    beta: float = 0.1
    replay: int = 8192
    ratio: float = 10.0  # job-aware exploration's worker / PS ratio threshold
    val_seeds: int = 2
    seed0: int = 1000  # training sequences: seeds seed0, seed0 + 1, ...; validation: 2000, 2001, ...
    seed: int = 0
    cluster: str = "data/clusters/dl2.yaml"
    # stabilisers of the RL phase (module docstring, "Stabilisers"); the defaults are the seed's plain
    # actor-critic
    teacher: str = "drf"  # the warm-up's teacher: "drf" (the seed's) or "optimus" (ours, :func:`optimus_actions`)
    init: str = ""  # start RL from this checkpoint's actor (and critic): no warm-up
    critic_lr: float = 0.0  # 0: rl_lr
    beta_end: float = -1.0  # entropy weight of the last RL episode, linear from beta; < 0: beta throughout
    target_tau: float = 0.0  # Polyak rate of a target critic for the TD target; 0: the critic itself
    adv_norm: bool = False  # advantages normalised to mean 0 / std 1 per mini-batch
    clip: float = 0.0  # gradient-norm clip of both networks; 0: none
    updates: int = 1  # mini-batch updates at each slot's end
    # what RL's episodes do (ours; the defaults are the seed's): "sample" acts by sampling the softmax,
    # "greedy" takes the most likely feasible action (the one validation and deployment take) except with
    # probability sample_p, when it samples
    behaviour: str = "sample"
    sample_p: float = 0.1
    # job-aware exploration's rule: "poor" (the seed's, poor_action) or "ps" (toward +1 PS, ps_action)
    explore: str = "poor"


# ---------------------------------------------------------------------- teacher and exploration
#: The warm-up teachers (:class:`RecordingDL2` modes): DRF (the seed's), Optimus (ours).
TEACHERS = ("drf", "optimus")


def drf_action(batch: Sequence[PlanJob], used: Sequence[float], cap: Sequence[float], spec: DL2Spec) -> int:
    """DRF's next action in DL2's action space (module docstring): ``3i + 2`` (a PS job) or ``3i`` for the
    batch's job ``i`` with the smallest dominant share among those below their ``max_gpus``; stop when
    that job's increment does not fit or no job can grow."""
    best = None
    for i, j in enumerate(batch[: spec.J]):
        if j.w + 1 > j.hi:
            continue
        key = (dominant_share(j.use(j.w, j.p), cap), i)
        if best is None or key < best[0]:
            best = (key, i, j)
    if best is None:
        return spec.n_actions - 1
    _k, i, j = best
    kind = 2 if j.ps_job else 0
    dw, dp = 1, (1 if j.ps_job else 0)
    if not fits_capacity(used, j.use(dw, dp), cap):
        return spec.n_actions - 1
    return 3 * i + kind


def optimus_actions(jobs: Sequence[PlanJob], cap: Sequence[float], spec: DL2Spec, optimus) -> list[list[int]]:
    """Optimus' plan of ``jobs`` within ``cap`` (``optimus``: a :class:`policies.elastic.OptimusPolicy`) as
    DL2 actions, one list per batch of ``spec.J`` jobs (rows ``3i + kind`` of that batch, stop not
    included), in the order Optimus' greedy takes the increments: a job's first worker and PS is ``+both``
    (``+worker`` for a job without PSs), further workers of its minimum ``+worker``, then each marginal-gain
    step ``+worker`` or ``+PS``. Planned on copies: ``jobs`` is unchanged. Every prefix of a batch's list
    fits ``cap`` (usage only grows towards Optimus' plan, which fits), so applying the lists batch after
    batch gives Optimus' allocation."""
    copies = [replace(j, w=0, p=0) for j in jobs]
    row = {id(c): k for k, c in enumerate(copies)}
    steps: list = []
    optimus.plan(copies, cap, None, steps)
    out: list[list[int]] = [[] for _ in range(0, len(jobs), spec.J)]
    for c, dw, dp in steps:
        b, i = divmod(row[id(c)], spec.J)
        if dw and dp:
            out[b].append(3 * i + 2)
            dw, dp = dw - 1, dp - 1
        out[b].extend([3 * i] * dw + [3 * i + 1] * dp)
    return out


def poor_action(batch: Sequence[PlanJob], mask: np.ndarray, ratio: float) -> int | None:
    """The seed's job-aware exploration action for the first job of ``batch`` in a poor state (several
    workers and no PS: +PS; several PSs and no worker: +worker; workers / PSs above ``ratio`` either way:
    one of the fewer), when the mask allows it; None when no job is in a poor state."""
    for i, j in enumerate(batch):
        if 3 * i + 2 >= len(mask) - 1:
            break
        if not j.ps_job:
            continue
        a = None
        if j.w > 1 and j.p == 0:
            a = 3 * i + 1
        elif j.p > 1 and j.w == 0:
            a = 3 * i
        elif j.w and j.p and j.w / j.p > ratio:
            a = 3 * i + 1
        elif j.w and j.p and j.p / j.w > ratio:
            a = 3 * i
        if a is not None and mask[a]:
            return a
    return None


def ps_action(batch: Sequence[PlanJob], mask: np.ndarray) -> int | None:
    """Exploration toward the shapes the measured PS speeds favour (ours): ``+PS`` to the PS job of ``batch``
    that has at least one worker and the fewest PSs per worker (the first such on ties), when the mask
    allows it; None when no job can take one."""
    best = None
    for i, j in enumerate(batch):
        if 3 * i + 1 >= len(mask) - 1:
            break
        if j.ps_job and j.w >= 1 and mask[3 * i + 1]:
            key = j.p / j.w
            if best is None or key < best[0]:
                best = (key, 3 * i + 1)
    return None if best is None else best[1]


#: RL behaviours (:class:`DL2TrainConfig` ``behaviour``) and exploration rules (``explore``).
BEHAVIOURS = ("sample", "greedy")
EXPLORE_RULES = ("poor", "ps")


class RecordingDL2(DL2Policy):
    """DL2 that records its slots for training: ``mode`` ``"teacher"`` (DRF's actions, :func:`drf_action`),
    ``"optimus"`` (Optimus' plan of the slot as actions, :func:`optimus_actions`, then stop), ``"explore"``
    (sampled actions with job-aware exploration) or ``"greedy"`` (the policy itself).
    ``slots`` collects the :class:`~policies.dl2.Transition` of each slot (the policy's own recording,
    :attr:`DL2Policy.record`); ``on_slot`` (if set) is called with each."""

    def __init__(self, net: DL2Net, perf, mode: str, rng: np.random.Generator, epsilon: float = 0.4,
                 ratio: float = 10.0, on_slot: Callable | None = None, behaviour: str = "sample",
                 sample_p: float = 0.1, explore: str = "poor") -> None:
        super().__init__(net, perf)
        self.mode, self.rng, self.epsilon, self.ratio = mode, rng, epsilon, ratio
        self.behaviour, self.sample_p, self.explore = behaviour, sample_p, explore
        self.on_slot = on_slot
        self.record = True
        self.slots: list[Transition] = []
        self._cap: tuple = ()
        self._optimus = OptimusPolicy(perf, self.spec.slot_s) if mode == "optimus" else None
        self._script: list[list[int]] = []  # mode "optimus": this slot's actions per batch
        self._batch_of: dict[int, int] = {}  # id of a batch's first job -> batch index

    def on_transition(self, t: Transition) -> None:
        self.slots.append(t)
        if self.on_slot is not None:
            self.on_slot(t)

    def plan(self, jobs, cap, state) -> None:
        self._cap = cap
        if self._optimus is not None:
            self._script = optimus_actions(jobs, cap, self.spec, self._optimus)
            self._batch_of = {id(jobs[s]): b for b, s in enumerate(range(0, len(jobs), self.spec.J))}
        super().plan(jobs, cap, state)

    def choose(self, obs, mask, batch) -> int:
        self.inferences += 1
        if self.mode == "teacher":
            a = drf_action(batch, self.used, self._cap, self.spec)
            if a != self.spec.n_actions - 1 and not mask[a]:
                a = self.spec.n_actions - 1
            return a
        if self.mode == "optimus":
            script = self._script[self._batch_of[id(batch[0])]]
            a = script.pop(0) if script else self.spec.n_actions - 1
            if not mask[a]:  # stop masked (nothing runnable yet) or an increment Optimus did not take
                a = self.spec.n_actions - 1 if mask[-1] else int(np.argmax(mask))
            return a
        if self.mode == "explore":
            a = None
            if self.rng.random() < self.epsilon:
                a = poor_action(batch, mask, self.ratio) if self.explore == "poor" else ps_action(batch, mask)
            if a is None:
                if self.behaviour == "greedy" and self.rng.random() >= self.sample_p:
                    a = int(np.argmax(np.where(mask, self.net.logits(obs, mask), -np.inf)))
                else:
                    a = int(self.rng.choice(len(mask), p=self.net.probs(obs, mask)))
            return a
        return int(np.argmax(np.where(mask, self.net.logits(obs, mask), -np.inf)))


# ---------------------------------------------------------------------- episodes
def _setup(cfg: DL2TrainConfig):
    from policies.cluster import ClusterSpec
    from policies.perf import ContentionModel
    from policies.psmodel import PSPerformanceModel

    path = Path(cfg.cluster)
    cluster = ClusterSpec.parse(str(path if path.is_absolute() or path.exists() else ROOT / path))
    return cluster, PSPerformanceModel(ContentionModel(cluster))


def _jobs(seed: int, n: int):
    from trainer.elastic import generate, parse_elastic_trace

    return parse_elastic_trace(generate("dl2", seed=seed, jobs=n))


def run_episode(cluster, perf, jobs, policy) -> float:
    """Simulate ``jobs`` under ``policy``; the average JCT (s)."""
    from trainer.simulator import SimConfig, Simulator

    res = Simulator(cluster, jobs, policy, perf, SimConfig()).run()
    if isinstance(policy, RecordingDL2):
        policy.finish(res.makespan)
    return float(np.mean([r.jct for r in res.jobs]))


# ---------------------------------------------------------------------- torch parts
def _mlp(sizes: Sequence[int]):
    import torch.nn as nn

    layers: list = []
    for k in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[k], sizes[k + 1]))
        if k < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def _weights(model) -> list[tuple[np.ndarray, np.ndarray]]:
    import torch.nn as nn

    return [(m.weight.detach().cpu().numpy().copy(), m.bias.detach().cpu().numpy().copy())
            for m in model if isinstance(m, nn.Linear)]


def _load_layers(model, layers) -> None:
    import torch
    import torch.nn as nn

    with torch.no_grad():
        for m, (w, b) in zip((m for m in model if isinstance(m, nn.Linear)), layers):
            m.weight.copy_(torch.as_tensor(np.asarray(w, np.float32)))
            m.bias.copy_(torch.as_tensor(np.asarray(b, np.float32)))


def _rows_actor_class():
    import torch
    import torch.nn as nn

    from policies.dl2 import GLOBALS, ROWS_COUNT_SCALE, rows_inputs

    class RowsActor(nn.Module):
        """The torch twin of :class:`policies.dl2.DL2RowsNet` (same inputs, pooling and layers)."""

        def __init__(self, spec: DL2Spec, hidden: Sequence[int], stop_hidden: Sequence[int]) -> None:
            super().__init__()
            self.spec = spec
            n_in, n_ctx = rows_inputs(spec)
            self.row = _mlp([n_in, *hidden, 3])
            self.stop = _mlp([n_ctx + 2 * hidden[-1], *stop_hidden, 1])

        def forward(self, obs, mask):
            spec = self.spec
            B = obs.shape[0]
            x = obs[:, : spec.J * spec.row].reshape(B, spec.J, spec.row)
            g = obs[:, spec.J * spec.row :]
            m = mask[:, : 3 * spec.J].reshape(B, spec.J, 3).to(obs.dtype)
            u = torch.cat([x, m], -1)
            pf = (u != 0).any(-1, keepdim=True).to(obs.dtype)
            n = pf.sum(-2)
            mean = (u * pf).sum(-2) / n.clamp(min=1.0)
            has = n > 0
            mx = torch.where(has, u.masked_fill(pf == 0, -torch.inf).amax(-2), torch.zeros_like(mean))
            mn = torch.where(has, u.masked_fill(pf == 0, torch.inf).amin(-2), torch.zeros_like(mean))
            ctx = torch.cat([mean, mx, mn, g, n * ROWS_COUNT_SCALE], -1)
            lt = (u[:, None, :, :] < u[:, :, None, :]) & (pf[:, None, :, :] > 0)
            rank = lt.sum(-2).to(obs.dtype) / (n[:, None, :] - 1.0).clamp(min=1.0)
            z = torch.cat([u, rank, ctx[:, None, :].expand(B, spec.J, ctx.shape[-1])], -1)
            h = self.row[:-1](z)
            inc = self.row[-1](h)
            hm = torch.where(has, h.masked_fill(pf == 0, -torch.inf).amax(-2), torch.zeros_like(h[:, 0]))
            hmean = (h * pf).sum(-2) / n.clamp(min=1.0)
            stop = self.stop(torch.cat([ctx, hm, hmean], -1))
            return torch.cat([inc.reshape(B, 3 * spec.J), stop], -1)

    assert len(GLOBALS) == 3
    return RowsActor


#: Hidden layer of the ``rows`` actor's stop scorer.
STOP_HIDDEN = (64,)


def make_actor(spec: DL2Spec, hidden: Sequence[int]):
    """A fresh torch actor of ``spec.arch``: the flat MLP ``obs_size -> hidden -> 3J + 1`` or the per-row
    scorer (:class:`policies.dl2.DL2RowsNet`, row MLP ``hidden``, stop MLP :data:`STOP_HIDDEN`)."""
    if spec.arch == "rows":
        return _rows_actor_class()(spec, hidden, STOP_HIDDEN)
    return _mlp([spec.obs_size, *hidden, spec.n_actions])


def torch_actor(net):
    """A torch actor holding the weights of ``net`` (:class:`DL2Net` or :class:`policies.dl2.DL2RowsNet`)."""
    if net.arch == "rows":
        actor = _rows_actor_class()(net.spec, net.hidden, tuple(w.shape[0] for w, _b in net.stop[:-1]))
        _load_layers(actor.row, net.row)
        _load_layers(actor.stop, net.stop)
        return actor
    actor = _mlp([net.spec.obs_size, *net.hidden, net.spec.n_actions])
    _load_layers(actor, net.weights)
    return actor


def _net(actor, spec: DL2Spec):
    """The numpy actor (:func:`policies.dl2.make_net`) of torch ``actor``."""
    from policies.dl2 import make_net

    if spec.arch == "rows":
        return make_net(spec, {"row": _weights(actor.row), "stop": _weights(actor.stop)})
    return make_net(spec, {"actor": _weights(actor)})


def _masked_logits(actor, obs, mask):
    out = actor(obs, mask) if getattr(actor, "spec", None) is not None else actor(obs)
    return out.masked_fill(~mask, -1e9)


def collect_drf(cfg: DL2TrainConfig, spec: DL2Spec, net: DL2Net, log=None) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[float]]:
    """(obs, masks, actions) of teacher episodes (``cfg.teacher``: DRF, :func:`drf_action`, or Optimus,
    :func:`optimus_actions`) on sequences ``seed0 .. seed0 + sl_traces - 1`` (at
    most ``sl_samples``, kept uniformly) and each episode's average JCT."""
    cluster, perf = _setup(cfg)
    rng = np.random.default_rng(cfg.seed)
    obs, masks, acts, jcts = [], [], [], []
    for k in range(cfg.sl_traces):
        pol = RecordingDL2(net, perf, "optimus" if cfg.teacher == "optimus" else "teacher", rng)
        jcts.append(run_episode(cluster, perf, _jobs(cfg.seed0 + k, cfg.jobs), pol))
        for tr in pol.slots:
            obs.extend(tr.obs)
            masks.extend(tr.mask)
            acts.extend(int(a) for a in tr.action)
        if log:
            log(k, len(acts), jcts[-1])
    idx = np.arange(len(acts))
    if len(idx) > cfg.sl_samples:
        idx = np.sort(rng.choice(idx, cfg.sl_samples, replace=False))
    return (np.stack([obs[i] for i in idx]), np.stack([masks[i] for i in idx]), np.array([acts[i] for i in idx]),
            jcts)


def supervised(actor, obs: np.ndarray, masks: np.ndarray, acts: np.ndarray, epochs: int, lr: float,
               batch: int, seed: int = 0, on_epoch: Callable | None = None) -> list[float]:
    """Fit ``actor`` to ``acts`` by masked cross-entropy (Adam, ``lr``, mini-batches of ``batch``); the
    mean loss of each epoch."""
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(seed)
    o, m, a = torch.as_tensor(obs), torch.as_tensor(masks), torch.as_tensor(acts, dtype=torch.long)
    opt = torch.optim.Adam(actor.parameters(), lr=lr)
    losses = []
    for _e in range(epochs):
        perm = torch.randperm(len(a), generator=g)
        tot, n = 0.0, 0
        for s in range(0, len(a), batch):
            b = perm[s : s + batch]
            loss = F.cross_entropy(_masked_logits(actor, o[b], m[b]), a[b])
            opt.zero_grad()
            loss.backward()
            opt.step()
            tot += loss.item() * len(b)
            n += len(b)
        losses.append(tot / max(n, 1))
        if on_epoch:
            on_epoch(losses[-1])
    return losses


class Replay:
    """A ring buffer of ``(obs, mask, action, reward, next obs, has next)`` samples."""

    def __init__(self, size: int, obs_size: int, n_actions: int) -> None:
        self.size, self.n = size, 0
        self.o = np.zeros((size, obs_size), np.float32)
        self.o2 = np.zeros((size, obs_size), np.float32)
        self.m = np.zeros((size, n_actions), bool)
        self.a = np.zeros(size, np.int64)
        self.r = np.zeros(size, np.float32)
        self.d = np.zeros(size, np.float32)
        self._i = 0

    def add(self, t: Transition) -> None:
        """The samples of one slot (its reward and next state shared by all)."""
        for o, m, a in zip(t.obs, t.mask, t.action):
            k = self._i
            self.o[k], self.m[k], self.a[k], self.r[k] = o, m, a, t.reward
            if t.next_obs is not None:
                self.o2[k], self.d[k] = t.next_obs, 1.0
            else:
                self.o2[k], self.d[k] = 0.0, 0.0
            self._i = (k + 1) % self.size
            self.n = min(self.n + 1, self.size)

    def sample(self, rng: np.random.Generator, batch: int):
        idx = rng.integers(0, self.n, size=min(batch, self.n))
        return self.o[idx], self.m[idx], self.a[idx], self.r[idx], self.o2[idx], self.d[idx]


def ac_update(actor, critic, opt_a, opt_c, sample, gamma: float, beta: float, target=None, adv_norm: bool = False,
              clip: float = 0.0) -> tuple[float, float]:
    """One actor-critic step on a replay mini-batch (module docstring); (actor loss, critic loss).
    ``target``: a critic of the same shape giving ``V(s')`` of the TD target (None: ``critic``);
    ``adv_norm``: advantages scaled to mean 0, std 1 over the mini-batch; ``clip`` > 0: each network's
    gradient norm clipped to it."""
    import torch
    import torch.nn.functional as F

    o, m, a, r, o2, d = (torch.as_tensor(x) for x in sample)
    with torch.no_grad():
        target = r + gamma * d * (critic if target is None else target)(o2).squeeze(-1)
    v = critic(o).squeeze(-1)
    lc = F.mse_loss(v, target)
    opt_c.zero_grad()
    lc.backward()
    if clip > 0:
        torch.nn.utils.clip_grad_norm_(critic.parameters(), clip)
    opt_c.step()
    adv = (target - v.detach())
    if adv_norm and len(adv) > 1:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    logits = _masked_logits(actor, o, m)
    logp = F.log_softmax(logits, -1)
    p = logp.exp()
    ent = -(p * logp.masked_fill(~m, 0.0)).sum(-1)
    la = -(logp.gather(1, a[:, None]).squeeze(1) * adv).mean() - beta * ent.mean()
    opt_a.zero_grad()
    la.backward()
    if clip > 0:
        torch.nn.utils.clip_grad_norm_(actor.parameters(), clip)
    opt_a.step()
    return la.item(), lc.item()


def soft_update(target, source, tau: float) -> None:
    """``target <- (1 - tau) target + tau source``, parameter by parameter (same shapes)."""
    import torch

    with torch.no_grad():
        for pt, ps in zip(target.parameters(), source.parameters()):
            pt.mul_(1.0 - tau).add_(ps, alpha=tau)


def entropy_weight(cfg: DL2TrainConfig, episode: int) -> float:
    """The entropy weight of RL episode ``episode`` (0-based): ``beta``, or linear from ``beta`` (first)
    to ``beta_end`` (last) when ``beta_end`` >= 0."""
    if cfg.beta_end < 0 or cfg.rl_episodes <= 1:
        return cfg.beta if cfg.beta_end < 0 else cfg.beta_end
    return cfg.beta + (cfg.beta_end - cfg.beta) * episode / (cfg.rl_episodes - 1)


def parent_record(meta: dict) -> dict:
    """What a run started from the checkpoint with JSON header ``meta`` keeps of it (``history["parent"]``):
    its weights' sha256, the network it had selected, that network's validation JCT, its CPU seconds,
    training config and history."""
    tr = meta.get("training") or {}
    return {"weights_sha256": meta.get("weights_sha256"), "selected": tr.get("selected"), "val_jct": tr.get("val_jct"),
            "cpu_s": tr.get("cpu_s"), "config": tr.get("config"), "history": tr.get("history")}


def train_spec(cfg: DL2TrainConfig) -> DL2Spec:
    """The state / action layout a run of ``cfg`` trains: ``J``, ``arch`` and the remaining-epochs and
    workers / PSs transforms at their scales (:data:`policies.dl2.REMAINING_SCALE`,
    :data:`policies.dl2.COUNTS_SCALE`)."""
    spec = DL2Spec(J=cfg.J, arch=cfg.arch, remaining=cfg.remaining, counts=cfg.counts)
    return replace(spec, scales={**spec.scales, "epochs": REMAINING_SCALE[cfg.remaining],
                                 "tasks": COUNTS_SCALE[cfg.counts]})


def evaluate(cfg: DL2TrainConfig, net: DL2Net, seeds: Sequence[int]) -> float:
    """Mean over ``seeds`` of the greedy policy's average JCT (s) on ``cfg.jobs``-job sequences."""
    cluster, perf = _setup(cfg)
    return float(np.mean([run_episode(cluster, perf, _jobs(s, cfg.jobs), DL2Policy(net, perf)) for s in seeds]))


def train(cfg: DL2TrainConfig, out: str | Path, progress_bar: bool = True, log: Callable[[str], None] = print) -> Path:
    """Warm-up then online RL (module docstring); writes the checkpoint ``out`` (the actor with the best
    validation JCT among: after warm-up, after each RL episode); returns its JSON path."""
    import torch
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    import copy

    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    spec = train_spec(cfg)
    actor = make_actor(spec, cfg.hidden)
    critic = _mlp([spec.obs_size, *cfg.hidden, 1])
    if cfg.init:
        from policies.dl2 import load_dl2_critic
        from trainer.dl2.online import _torch_mlp

        inet, _meta, ipath, icritic = load_dl2_critic(cfg.init)
        spec = inet.spec
        actor = torch_actor(inet)
        critic = _torch_mlp(icritic) if icritic is not None else _mlp([spec.obs_size, *inet.hidden, 1])
    net = _net(actor, spec)
    val_seeds = [2000 + k for k in range(cfg.val_seeds)]
    t0, c0 = time.perf_counter(), time.process_time()
    history: dict = {"sl_loss": [], "rl": []}
    config = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items()}

    def save(best, done: bool) -> Path:
        """Write the best actor so far with the history so far (after the warm-up and each RL episode,
        so an interrupted run leaves its best checkpoint and curve)."""
        extra = {"training": {"config": config, "history": history, "selected": best[3], "val_jct": best[0],
                              "complete": done, "cpu_wall_s": round(time.perf_counter() - t0, 1),
                              "cpu_s": round(time.process_time() - c0, 1)}}
        return save_dl2(out, best[1], spec, extra=extra, critic=best[2])

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[info]}"), disable=not progress_bar) as bar:
        if cfg.init:
            history["init"] = str(ipath)
            history["parent"] = parent_record(_meta)
            best = (evaluate(cfg, net, val_seeds), net, _weights(critic), "init")
            history["val_warmup_jct"] = best[0]
            log(f"init {ipath}: validation JCT {best[0]:.0f} s")
        else:
            t = bar.add_task("DRF episodes", total=cfg.sl_traces, info="")
            obs, masks, acts, drf_jct = collect_drf(
                cfg, spec, net, log=lambda k, n, j: bar.update(t, advance=1, info=f"{n} samples, DRF JCT {j:.0f} s"))
            history["drf_train_jct"] = drf_jct
            t = bar.add_task("supervised warm-up", total=cfg.sl_epochs, info="")
            history["sl_loss"] = supervised(actor, obs, masks, acts, cfg.sl_epochs, cfg.sl_lr, cfg.batch, cfg.seed,
                                            on_epoch=lambda l: bar.update(t, advance=1, info=f"cross-entropy {l:.4f}"))
            del obs, masks, acts
            net = _net(actor, spec)
            best = (evaluate(cfg, net, val_seeds), net, _weights(critic), "warm-up")
            history["val_warmup_jct"] = best[0]
            log(f"warm-up: imitation loss {history['sl_loss'][0]:.3f} -> {history['sl_loss'][-1]:.3f}, "
                f"validation JCT {best[0]:.0f} s")
        save(best, False)
        opt_a = torch.optim.Adam(actor.parameters(), lr=cfg.rl_lr)
        opt_c = torch.optim.Adam(critic.parameters(), lr=cfg.critic_lr or cfg.rl_lr)
        target = copy.deepcopy(critic) if cfg.target_tau > 0 else None
        replay = Replay(cfg.replay, spec.obs_size, spec.n_actions)
        t = bar.add_task("online RL episodes", total=cfg.rl_episodes, info="")
        cluster, perf = _setup(cfg)
        for ep in range(cfg.rl_episodes):
            losses: list = []
            beta = entropy_weight(cfg, ep)
            pol = RecordingDL2(_net(actor, spec), perf, "explore", rng, cfg.epsilon, cfg.ratio,
                               behaviour=cfg.behaviour, sample_p=cfg.sample_p, explore=cfg.explore)

            def on_slot(item, pol=pol, losses=losses, beta=beta):
                replay.add(item)
                if replay.n >= cfg.batch:
                    for _u in range(cfg.updates):
                        losses.append(ac_update(actor, critic, opt_a, opt_c, replay.sample(rng, cfg.batch), cfg.gamma,
                                                beta, target=target, adv_norm=cfg.adv_norm, clip=cfg.clip))
                        if target is not None:
                            soft_update(target, critic, cfg.target_tau)
                    pol.net = _net(actor, spec)

            pol.on_slot = on_slot
            jct = run_episode(cluster, perf, _jobs(cfg.seed0 + cfg.sl_traces + ep, cfg.jobs), pol)
            net = _net(actor, spec)
            val = evaluate(cfg, net, val_seeds)
            rew = float(sum(tr.reward for tr in pol.slots))
            history["rl"].append({"episode": ep, "train_jct": jct, "val_jct": val, "reward": rew, "updates": len(losses),
                                  "beta": beta,
                                  "actor_loss": float(np.mean([x[0] for x in losses])) if losses else None,
                                  "critic_loss": float(np.mean([x[1] for x in losses])) if losses else None,
                                  "cpu_s": round(time.process_time() - c0, 1)})
            if val < best[0]:
                best = (val, net, _weights(critic), f"RL episode {ep}")
            save(best, False)
            bar.update(t, advance=1, info=f"train JCT {jct:.0f} s, val JCT {val:.0f} s, reward {rew:.2f}")
            log(f"RL episode {ep}: train JCT {jct:.0f} s, validation JCT {val:.0f} s, {len(losses)} updates, "
                f"beta {beta:g}, cpu {time.process_time() - c0:.0f} s")
    jpath = save(best, True)
    log(f"wrote {jpath} (selected: {best[3]}, validation JCT {best[0]:.0f} s, {time.perf_counter() - t0:.0f} s)")
    return jpath
