"""Training of Chic / Chic-Pair by the seed's modified cross-entropy method (seed 001, section 4.3,
Algorithm 1), numpy only.

Iteration ``k`` (:func:`cem_iteration`):

1. ``N`` trajectories (default 35, the seed's), each on a workload sequence drawn at random from the
   training set, actions sampled from the current policy ``pi(a | s; theta~_{k-1})``;
2. one trajectory on a random sequence with actions uniform over the unmasked actions (the seed's
   ``x_{N+1}``, which keeps actions from never being tried);
3. returns ``R(x) = sum_t r_t`` (the seed's reward: ``-sum of JCTs / 20 min`` plus the penalties,
   :mod:`policies.chic`); the level ``xi_k = R_(floor((1 - rho) N))`` of the ascending returns
   (1-based, ``rho`` = 0.3: the best ~30 %) ;
4. ``theta^_k`` maximises the log-likelihood of the elite trajectories' (``R >= xi_k``) actions in
   their states (masked softmax), by Adam (learning rate 0.01, the seed's) started from
   ``theta~_{k-1}``, ``fit_epochs`` passes over the elite steps in minibatches, dropout 0.5 on the
   first hidden layer (the seed's);
5. ``theta~_k = alpha theta^_k + (1 - alpha) theta~_{k-1}`` (``alpha`` = :attr:`CEMConfig.smooth`).

With :attr:`CEMConfig.groups` = K > 0 (ours, ``--groups``) steps 1-3 run on K common sequences: the N
trajectories in K groups, each group on one sequence drawn at random (the uniform trajectory in the
first), and the level and the elite taken within each group, so that trajectories are ranked by what
their actions did on the same jobs rather than by how much work their sequence held.

Every ``val_every`` (2, the seed's) iterations the greedy policy runs the validation sequences (30,
the seed's) and the one with the lowest average completion time is kept (the seed's model selection).

Where the seed is silent or ambiguous the choice is ours, and :class:`CEMConfig` names it: the
seed's eq. (9) sums action probabilities while its CE derivation (eq. 2) maximises their log; we
maximise the log-likelihood (the cross-entropy). The seed calls both Adam's learning rate and the
smoothing weight ``alpha`` and gives 0.01; we use 0.01 for Adam and ``smooth`` = 0.7 for the
smoothing, and ``fit_epochs`` = 5 Adam passes per iteration (not given).

Sequences: ``rlsched trace gen-elastic --setting chic`` (:func:`trainer.elastic.generate`), 30 jobs
each (the seed's W); training seeds from :data:`TRAIN_SEED0`, validation from :data:`VAL_SEED0`,
disjoint from each other and from the test seeds (:data:`TEST_SEED0`, the ones
``benchmarks/elastic_baselines.py`` and :mod:`trainer.chic.results` evaluate on).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from policies.chic import (P1, P2, REWARD_UNIT_S, ChicNet, ChicPolicy, ChicSpec, save_chic_checkpoint)

#: First seed of the test sequences (``benchmarks/elastic_baselines.py``; never trained or validated on).
TEST_SEED0 = 100
#: First seed of the validation sequences.
VAL_SEED0 = 500
#: First seed of the training sequences.
TRAIN_SEED0 = 10_000
_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class CEMConfig:
    """Hyper-parameters (seed's values where it gives them; module docstring)."""

    variant: str = "chic"
    slots: int = 3            # I (seed)
    iterations: int = 30      # K
    n: int = 35               # N trajectories from the policy per iteration (seed)
    rho: float = 0.3          # elite fraction (seed's 0.3 quantile)
    lr: float = 0.01          # Adam (seed)
    smooth: float = 0.7       # alpha of the smoothed update (ours; see module docstring)
    fit_epochs: int = 5       # Adam passes over the elite steps per iteration (ours)
    batch: int = 256
    dropout: float = 0.5      # on the first hidden layer (seed)
    rate: float = 1.8         # arrival rate of the training / validation sequences, jobs/h (seed's Fig. 6)
    jobs: int = 30            # W, jobs per training sequence (seed)
    val_jobs: int = 30        # jobs per validation sequence (the test sequences' W, whatever the training W)
    train_seqs: int = 200
    val_seqs: int = 30        # seed
    val_every: int = 2        # seed
    p1: float = P1
    p2: float = P2
    seed: int = 0
    resize_overhead: float | None = None  # simulator's default (30 s, checkpoint-restart)
    task_mask: bool = True    # mask tasks that do not lower g (policies.chic.ChicPolicy); False: the ablation
    g: str = "measured"       # where condition (2)'s g comes from (policies.chic.G_SOURCES)
    groups: int = 0           # 0: each trajectory on its own random sequence (seed); k: k common sequences (ours)
    init: str | None = None   # a Chic checkpoint of the same variant and I to start from (None: random, seeded)

    def check(self) -> None:
        if self.variant not in ("chic", "chic-pair"):
            raise ValueError(f"variant must be chic or chic-pair, got {self.variant!r}")
        for k in ("slots", "iterations", "n", "fit_epochs", "batch", "jobs", "val_jobs", "train_seqs", "val_seqs",
                  "val_every"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{k} must be an integer >= 1, got {v!r}")
        for k, lo, hi in (("rho", 0.0, 1.0), ("smooth", 0.0, 1.0), ("dropout", 0.0, 0.99)):
            v = getattr(self, k)
            if not (lo <= v <= hi) or (k != "dropout" and v == 0):
                raise ValueError(f"{k} must be in ({lo}, {hi}], got {v!r}")
        if isinstance(self.groups, bool) or not isinstance(self.groups, int) or self.groups < 0:
            raise ValueError(f"groups must be an integer >= 0, got {self.groups!r}")
        if not (self.lr > 0 and self.rate > 0 and math.isfinite(self.lr) and math.isfinite(self.rate)):
            raise ValueError("lr and rate must be finite and > 0")
        from policies.chic import G_SOURCES

        if self.g not in G_SOURCES:
            raise ValueError(f"g must be one of {', '.join(G_SOURCES)}, got {self.g!r}")
        if VAL_SEED0 + self.val_seqs > TRAIN_SEED0 or TEST_SEED0 + 100 > VAL_SEED0:
            raise ValueError("training, validation and test seeds overlap")


@dataclass
class Episode:
    """One trajectory: its return, the sequence's average JCT (s), its steps (state, mask, action)."""

    ret: float
    act: float
    steps: list = field(default_factory=list)


# ---------------------------------------------------------------------- fitting (numpy backprop + Adam)
def fit_elite(net: ChicNet, X: np.ndarray, M: np.ndarray, A: np.ndarray, lr: float = 0.01, epochs: int = 5,
              batch: int = 256, dropout: float = 0.5, rng: np.random.Generator | None = None) -> ChicNet:
    """``net`` after Adam on the mean negative log-likelihood of actions ``A`` [n] in states ``X``
    [n, in] under the softmax restricted to mask ``M`` [n, out] (dropout ``dropout`` on the first
    hidden layer while fitting)."""
    rng = rng or np.random.default_rng(0)
    params = [p.astype(np.float64).copy() for W, b in net.weights for p in (W, b)]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    b1, b2, eps, t = 0.9, 0.999, 1e-8, 0
    n = len(A)
    L = len(net.weights)
    for _ in range(epochs):
        order = rng.permutation(n)
        for s in range(0, n, batch):
            idx = order[s:s + batch]
            x, mk, a = X[idx].astype(np.float64), M[idx], A[idx]
            acts, drops = [x], []
            h = x
            for k in range(L):
                W, b = params[2 * k], params[2 * k + 1]
                h = h @ W.T + b
                if k < L - 1:
                    h = np.maximum(h, 0.0)
                    if k == 0 and dropout > 0:
                        d = (rng.random(h.shape) >= dropout) / (1.0 - dropout)
                        h = h * d
                        drops.append(d)
                    acts.append(h)
            z = np.where(mk, h, -np.inf)
            z = z - z.max(axis=1, keepdims=True)
            p = np.exp(z)
            p /= p.sum(axis=1, keepdims=True)
            g = p
            g[np.arange(len(a)), a] -= 1.0
            g /= len(a)
            grads = [None] * len(params)
            for k in range(L - 1, -1, -1):
                grads[2 * k] = g.T @ acts[k]
                grads[2 * k + 1] = g.sum(axis=0)
                if k > 0:
                    g = g @ params[2 * k]
                    g = g * (acts[k] > 0)  # ReLU, and dropout's zeros
                    if k == 1 and drops:
                        g = g / (1.0 - dropout)  # dropout's scale of the kept units
            t += 1
            for i, gr in enumerate(grads):
                m[i] = b1 * m[i] + (1 - b1) * gr
                v[i] = b2 * v[i] + (1 - b2) * gr * gr
                mh = m[i] / (1 - b1 ** t)
                vh = v[i] / (1 - b2 ** t)
                params[i] -= lr * mh / (np.sqrt(vh) + eps)
    return ChicNet([(params[2 * k].astype(np.float32), params[2 * k + 1].astype(np.float32)) for k in range(L)])


def _level(rets: np.ndarray, rho: float) -> float:
    """The level ``xi`` of returns ``rets`` (ascending order statistic ``floor((1 - rho) n)``, 1-based)."""
    order = np.sort(rets)
    return float(order[max(int(math.floor((1 - rho) * len(rets))) - 1, 0)])


def cem_iteration(net: ChicNet, rollout: Callable[..., Episode], n: int, rho: float,
                  lr: float, smooth: float, fit_epochs: int, batch: int, dropout: float,
                  rng: np.random.Generator, groups: int = 0) -> tuple[ChicNet, dict]:
    """One iteration of Algorithm 1 (module docstring). ``rollout(net, mode, seed)`` runs one trajectory
    (``mode``: ``sample`` or ``uniform``) on a sequence chosen by ``seed``. With ``groups`` > 0 the
    ``n`` trajectories are split into that many groups of (nearly) equal size, each group on one
    sequence drawn at random (``rollout(net, mode, seed, key)``: ``key`` chooses the sequence), the
    uniform trajectory in the first; the level and the elite are taken within each group (common
    sequences: trajectories compete on the same jobs, not on how much work their sequence holds).
    Returns the smoothed network and the iteration's statistics."""
    if groups <= 0:
        eps = [rollout(net, "sample", int(rng.integers(2**31))) for _ in range(n)]
        eps.append(rollout(net, "uniform", int(rng.integers(2**31))))
        rets = np.array([e.ret for e in eps])
        xi = float(np.sort(rets)[max(int(math.floor((1 - rho) * n)) - 1, 0)])  # over all n + 1 returns
        elite = [e for e in eps if e.ret >= xi and e.steps and math.isfinite(e.ret)]
        within = math.nan
    else:
        g = min(groups, n)
        sizes = [n // g + (1 if k < n % g else 0) for k in range(g)]
        eps, elite, xis, spread = [], [], [], []
        uni = None
        for k, size in enumerate(sizes):
            key = int(rng.integers(2**31))
            grp = [rollout(net, "sample", int(rng.integers(2**31)), key) for _ in range(size)]
            if k == 0:
                uni = rollout(net, "uniform", int(rng.integers(2**31)), key)
            r = np.array([e.ret for e in grp])
            xk = _level(r, rho)
            xis.append(xk)
            fin = r[np.isfinite(r)]
            if len(fin) > 1:
                spread.append(float(fin.std()))
            elite += [e for e in grp + ([uni] if k == 0 else []) if e.ret >= xk and e.steps and math.isfinite(e.ret)]
            eps += grp
        uniform_elite = uni.ret >= xis[0]
        eps.append(uni)
        rets = np.array([e.ret for e in eps])
        xi = float(np.mean(xis))
        within = float(np.mean(spread)) if spread else math.nan
    ok = np.isfinite(rets[:n])
    stats = {"xi": xi, "mean_return": float(rets[:n][ok].mean()) if ok.any() else -math.inf,
             "uniform_return": float(rets[n]),
             "uniform_elite": bool(rets[n] >= xi) if groups <= 0 else bool(uniform_elite), "elite": len(elite),
             "failed": int((~ok).sum()), "mean_act": float(np.mean([e.act for e in eps[:n] if math.isfinite(e.act)] or [math.inf])),
             "return_std": float(rets[:n][ok].std()) if ok.sum() > 1 else math.nan}
    if groups > 0:
        stats["return_std_within"] = within
    steps = [s for e in elite for s in e.steps]
    if not steps:
        return net, stats
    X = np.stack([s[0] for s in steps])
    M = np.stack([s[1] for s in steps])
    A = np.array([s[2] for s in steps])
    fitted = fit_elite(net, X, M, A, lr, fit_epochs, batch, dropout, rng)
    new = net.with_flat(smooth * fitted.flat() + (1 - smooth) * net.flat())
    stats["elite_steps"] = len(A)
    return ChicNet([(W.astype(np.float32), b.astype(np.float32)) for W, b in new.weights]), stats


# ---------------------------------------------------------------------- the platform's simulator
def chic_setup():
    """The Chic cluster (``data/clusters/chic.yaml``) and the simulator's performance model."""
    from policies.cluster import ClusterSpec
    from policies.perf import ContentionModel
    from policies.psmodel import PSPerformanceModel

    cluster = ClusterSpec.parse(str(_ROOT / "data" / "clusters" / "chic.yaml"))
    return cluster, PSPerformanceModel(ContentionModel(cluster))


def sequences(seed0: int, count: int, rate: float, jobs: int = 30) -> list:
    """``count`` job lists of ``gen-elastic --setting chic`` with seeds ``seed0 ..``."""
    from trainer.elastic import generate, parse_elastic_trace

    return [parse_elastic_trace(generate("chic", seed=seed0 + s, rate=rate, jobs=jobs)) for s in range(count)]


def run_policy(policy, cluster, perf, jobs, resize_overhead: float | None = None) -> float:
    """Average JCT (s) of ``policy`` on ``jobs`` in the simulator."""
    from trainer.simulator import SimConfig, Simulator

    res = Simulator(cluster, jobs, policy, perf, SimConfig(resize_overhead=resize_overhead)).run()
    return float(np.mean([r.jct for r in res.jobs]))


def simulate_episode(net: ChicNet, spec: ChicSpec, cluster, perf, jobs, mode: str, seed: int,
                     p1: float = P1, p2: float = P2, resize_overhead: float | None = None,
                     task_mask: bool = True, g: str = "measured") -> Episode:
    """One trajectory in the simulator. Its return is the seed's: the r1 terms of all steps sum to
    ``-(sum of the jobs' times in the system) / 20 min`` (every job finishes in the episode), plus
    the penalties of the actions taken."""
    from trainer.simulator import SimConfig, Simulator

    from trainer.simulator import SimulationError

    pol = ChicPolicy(net, spec, perf, mode=mode, seed=seed, record=True, p1=p1, p2=p2, task_mask=task_mask, g=g)
    try:
        res = Simulator(cluster, jobs, pol, perf, SimConfig(resize_overhead=resize_overhead, max_idle_rounds=200)).run()
    except SimulationError:  # the policy left waiting jobs idle for 200 rounds: the worst return, never elite
        return Episode(-math.inf, math.inf, [])
    jct = [r.jct for r in res.jobs]
    return Episode(-float(np.sum(jct)) / REWARD_UNIT_S + pol.penalty, float(np.mean(jct)), pol.steps)


def checkpoint_name(variant: str, rate: float | None = None) -> str:
    """File stem of a checkpoint: ``<variant>`` (trained at the default 1.8 jobs/h, the seed's
    "Chic(1.8/h)") or ``<variant>-r<rate>`` (trained at ``rate`` jobs/h, the seed's per-rate retraining)."""
    return variant if rate is None else f"{variant}-r{rate:g}"


def train(cfg: CEMConfig, out: str | Path, progress: bool = True, name: str | None = None) -> dict:
    """Train (module docstring); write ``OUT/<name>.json`` + ``.safetensors`` (the validation-best
    network) and ``OUT/<name>-history.json`` (``name`` default: the variant). Returns the history."""
    cfg.check()
    name = name or cfg.variant
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    spec = ChicSpec(cfg.variant, cfg.slots)
    cluster, perf = chic_setup()
    train_set = sequences(TRAIN_SEED0, cfg.train_seqs, cfg.rate, cfg.jobs)
    val_set = sequences(VAL_SEED0, cfg.val_seqs, cfg.rate, cfg.val_jobs)
    rng = np.random.default_rng(cfg.seed)
    if cfg.init is None:
        net = ChicNet.init(spec.obs_size, spec.n_actions, seed=cfg.seed)
    else:
        from policies.chic import load_chic_checkpoint

        ck = load_chic_checkpoint(cfg.init)
        if ck.spec != spec:
            raise ValueError(f"--init {cfg.init}: a {ck.spec.variant} checkpoint with I={ck.spec.slots}, "
                             f"not {spec.variant} with I={spec.slots}")
        net = ck.net

    def rollout(nt: ChicNet, mode: str, seed: int, key: int | None = None) -> Episode:
        jobs = train_set[(seed if key is None else key) % len(train_set)]
        return simulate_episode(nt, spec, cluster, perf, jobs, mode, seed, cfg.p1, cfg.p2, cfg.resize_overhead,
                                cfg.task_mask, cfg.g)

    def validate(nt: ChicNet) -> float:
        from trainer.simulator import SimulationError

        try:
            return float(np.mean([run_policy(ChicPolicy(nt, spec, perf, task_mask=cfg.task_mask, g=cfg.g), cluster, perf, j,
                                             cfg.resize_overhead)
                                  for j in val_set]))
        except SimulationError:
            return math.inf

    # where the training cluster runs PSs (the validation ACTs below are on it)
    history = {"config": asdict(cfg), "ps_placement": cluster.ps_placement, "iterations": []}
    best_act, best_net, best_it = validate(net), net, 0
    history["iterations"].append({"iteration": 0, "val_act": best_act})
    t_start, c_start = time.perf_counter(), time.process_time()
    bar = None
    if progress:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        bar = Progress(TextColumn(f"train-chic {name}"), BarColumn(), MofNCompleteColumn(),
                       TimeElapsedColumn(), TextColumn("{task.fields[info]}"))
        bar.start()
        task = bar.add_task("", total=cfg.iterations, info="")
    try:
        for k in range(1, cfg.iterations + 1):
            t0 = time.perf_counter()
            net, st = cem_iteration(net, rollout, cfg.n, cfg.rho, cfg.lr, cfg.smooth, cfg.fit_epochs, cfg.batch,
                                    cfg.dropout, rng, cfg.groups)
            st["iteration"] = k
            if k % cfg.val_every == 0 or k == cfg.iterations:
                st["val_act"] = validate(net)
                if st["val_act"] < best_act:
                    best_act, best_net, best_it = st["val_act"], net, k
            st["seconds"] = time.perf_counter() - t0
            history["iterations"].append(st)
            (out / f"{name}-history.json").write_text(json.dumps(history, indent=1))
            if bar is not None:
                bar.update(task, advance=1, info=f"xi {st['xi']:.1f}  mean R {st['mean_return']:.1f}  "
                           f"val ACT {st.get('val_act', float('nan')):.0f} s (best {best_act:.0f} s @ {best_it})")
    finally:
        if bar is not None:
            bar.stop()
    history.update(best_iteration=best_it, best_val_act=best_act, train_seconds=time.perf_counter() - t_start,
                   train_cpu_seconds=time.process_time() - c_start)
    training = {"algorithm": "modified cross-entropy method (seed 001, Algorithm 1)", "config": asdict(cfg),
                "best_iteration": best_it, "best_val_act_s": best_act, "ps_placement": cluster.ps_placement,
                "train_seconds": history["train_seconds"],
                "train_cpu_seconds": history["train_cpu_seconds"],
                "train_seeds": [TRAIN_SEED0, TRAIN_SEED0 + cfg.train_seqs - 1],
                "val_seeds": [VAL_SEED0, VAL_SEED0 + cfg.val_seqs - 1],
                "command": f"rlsched train-chic --variant {cfg.variant} --iterations {cfg.iterations} "
                           f"--rate {cfg.rate:g} --g {cfg.g} --seed {cfg.seed}"
                           f"{'' if cfg.slots == 3 else f' --slots {cfg.slots}'}{'' if cfg.n == 35 else f' --n {cfg.n}'}"
                           f"{'' if cfg.jobs == 30 else f' --jobs {cfg.jobs}'}"
                           f"{'' if cfg.groups == 0 else f' --groups {cfg.groups}'}"
                           f"{'' if cfg.rho == 0.3 else f' --rho {cfg.rho:g}'}"
                           f"{'' if cfg.init is None else f' --init {cfg.init}'}"
                           f"{'' if cfg.task_mask else ' --no-task-mask'} --out DIR"}
    save_chic_checkpoint(out / name, spec, best_net, training,
                         {"p1": cfg.p1, "p2": cfg.p2, "unit_s": REWARD_UNIT_S}, cfg.task_mask, cfg.g)
    (out / f"{name}-history.json").write_text(json.dumps(history, indent=1))
    return history


# ---------------------------------------------------------------------- shipping
#: Arrival rate (jobs/h) of the default checkpoint ``<variant>.json`` (the seed's "Chic(1.8/h)").
DEFAULT_RATE = 1.8
_SHIPPED = _ROOT / "policies" / "checkpoints" / "chic"


def shipped_name(variant: str, rate: float) -> str:
    """Shipped file stem of ``variant`` trained at ``rate``: ``<variant>`` at :data:`DEFAULT_RATE`,
    ``<variant>-r<rate>`` otherwise."""
    return checkpoint_name(variant, None if math.isclose(rate, DEFAULT_RATE) else rate)


def validation_act(path: str | Path, rate: float, seqs: int = 30) -> float:
    """Average JCT (s) of the checkpoint ``path`` (greedy) over the validation sequences at ``rate``."""
    from policies.chic import make_chic_policy, load_chic_checkpoint

    ck = load_chic_checkpoint(path)
    cluster, perf = chic_setup()
    return float(np.mean([run_policy(make_chic_policy(f"{ck.spec.variant}:{ck.path}", perf), cluster, perf, j)
                          for j in sequences(VAL_SEED0, seqs, rate)]))


def ship_if_better(candidate: str | Path, rate: float, dest: str | Path = _SHIPPED, seqs: int = 30) -> dict:
    """Ship the checkpoint ``candidate`` (trained at ``rate``) as ``dest/<shipped_name>`` when its
    average JCT on the validation sequences at ``rate`` is below the one of every checkpoint that could
    serve that rate otherwise (``dest/<shipped_name>`` if present, and the default ``dest/<variant>``:
    a per-rate network is shipped only when it beats the default one at its rate; the incumbent
    recorded is the better of them). The shipped JSON records the comparison under
    ``training.selection``; the history file beside the candidate is copied beside it. Returns the
    comparison."""
    from policies.chic import load_chic_checkpoint

    dest = Path(dest)
    ck = load_chic_checkpoint(candidate)
    variant = ck.spec.variant
    name = shipped_name(variant, rate)
    new = validation_act(ck.path, rate, seqs)
    incumbent, old = dest / f"{name}.json", None
    for path in dict.fromkeys((dest / f"{name}.json", dest / f"{variant}.json")):
        if path.is_file():
            act = validation_act(path, rate, seqs)
            if old is None or act < old:
                incumbent, old = path, act
    rec = {"rate": rate, "val_seeds": [VAL_SEED0, VAL_SEED0 + seqs - 1], "val_act_s": new,
           "incumbent": incumbent.name if incumbent.is_file() else None, "incumbent_val_act_s": old,
           "shipped": bool(old is None or new < old), "as": f"{name}.json"}
    if rec["shipped"]:
        training = dict(ck.meta.get("training", {}))
        training["selection"] = {k: v for k, v in rec.items() if k != "shipped"}
        save_chic_checkpoint(dest / name, ck.spec, ck.net, training, ck.meta.get("reward"),
                             ck.meta.get("task_mask", True), ck.meta.get("g", "fitted"))
        hist = ck.path.with_name(f"{ck.path.stem}-history.json")
        if hist.is_file():
            (dest / f"{name}-history.json").write_text(hist.read_text())
    return rec
