"""Training of ``rl-sf``: behaviour cloning of a heuristic with DAgger rounds, then MaskablePPO.

1. **Job sets** (:func:`training_sets`): :func:`trainer.generate.generate_sets`, demands of each
   distribution of ``demands`` (default ``uniform``: ``1..max_gpus``; ``pow2``: powers of two up to
   ``max_gpus``; a cluster entry ``CLUSTER:G`` uses ``G`` instead of ``max_gpus``) on each training cluster, zero arrivals and Poisson arrivals at each load of
   ``loads``; training seeds ``seed + 1000 * d + 10 * k`` (``d`` the demand distribution's index,
   ``k`` the arrival kind), validation sets from ``seed + 5000``. Both ranges are disjoint from the
   benchmark's held-out seeds (950..957).
2. **Behaviour cloning** (:func:`behaviour_clone`): states from episodes played by the heuristic
   (``expert``: :data:`HEURISTIC_EXPERTS`; default ``greedy``, SRTF order with the contention-aware
   nosplit placement; ``best``: per training set the one of :data:`BEST_OF` with the lower average
   JCT on it, :func:`best_experts`), labelled with its pick; then ``dagger`` rounds that play the current network (its argmax) and
   label the states it visits with the heuristic's pick; cross-entropy over the masked scores.
3. **MaskablePPO** (sb3-contrib, :class:`trainer.sizefree.model.SizeFreeMaskablePolicy`) from the
   cloned weights, one environment per training cluster (``DummyVecEnv``, or ``SubprocVecEnv`` with
   ``subproc``), reward minus average JCT (:mod:`trainer.sizefree.env`).
4. **Selection**: the cloned and the fine-tuned network are run on the validation sets (the policy
   itself, :class:`policies.sizefree.SizeFreePolicy`, in the simulator); the one with the lower mean
   average JCT is written, with both numbers in the checkpoint's ``training`` section.

With ``w1`` (a reward-weight branch, seed 002's ``-W1 * CS + W2 * Util``, :mod:`trainer.sizefree.env`)
PPO maximises that reward instead, and the fine-tuned network is written whatever its validation
JCT (the branch is defined by its reward; both validation numbers are recorded). The checkpoint's
``reward`` section names the reward: ``{"kind": "jct"}`` or ``{"kind": "seed", "w1": W1, "w2": W2}``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from policies.cluster import ClusterSpec
from policies.codecs.sizefree import SizeFreeCodec, SizeFreeSpec
from policies.job import JobSpec
from policies.perf import ContentionModel
from policies.sizefree import TENSOR_NAMES, SizeFreeNet, SizeFreePolicy, save_sizefree
from trainer.sizefree.dagger import TEACHER, TEACHER_PREEMPT

__all__ = ["BEST_OF", "HEURISTIC_EXPERTS", "SizeFreeTrainConfig", "behaviour_clone", "best_experts", "init_tensors",
           "split_cluster", "train", "training_sets", "validate"]


@dataclass(frozen=True)
class SizeFreeTrainConfig:
    """``rlsched train-sizefree``'s settings (module docstring)."""

    clusters: tuple[str, ...] = ("4x8", "16x8")
    max_gpus: int = 32
    #: demand distributions of the training and validation sets (:data:`trainer.generate.DEMAND_DISTRIBUTIONS`)
    demands: tuple[str, ...] = ("uniform",)
    jobs_per_set: int = 48
    sets_per_kind: int = 4
    loads: tuple[float, ...] = (0.85, 0.9)
    val_sets: int = 2
    hidden: int = 64
    expert: str = "greedy"
    #: the planner teaching with ``expert="planner"``; ``None``: :data:`TEACHER_PREEMPT` with preempt
    #: candidates, else :data:`TEACHER`
    teacher: str | None = None
    compare: str | None = "rl-sf"
    init: str | None = None
    bc_epochs: int = 10
    dagger: int = 1
    ppo_timesteps: int = 8192
    ppo_lr: float = 3e-4
    ent_coef: float = 0.01
    n_steps: int = 512
    subproc: bool = False
    seed: int = 7000
    jobs: int = 8
    #: preempt candidates of the codec spec (``K``; 0: the network cannot preempt)
    preempt: int = 0
    #: ``None``: PPO's reward is minus the average JCT; else W1 of the seed reward (module docstring)
    w1: float | None = None
    extra: dict = field(default_factory=dict)

    def teacher_name(self) -> str:
        """The teacher planner's name (:attr:`teacher`, else the default for :attr:`preempt`)."""
        return self.teacher or (TEACHER_PREEMPT if self.preempt else TEACHER)

    def reward(self) -> dict:
        """The checkpoint's ``reward`` section (module docstring)."""
        if self.w1 is None:
            return {"kind": "jct"}
        return {"kind": "seed", "w1": float(self.w1), "w2": round(1.0 - float(self.w1), 12)}


#: The heuristic teachers (``expert``): ``name -> (placement slot, order)`` of
#: :meth:`policies.codecs.sizefree.SizeFreeCodec.expert_action`.
HEURISTIC_EXPERTS = {"greedy": ("greedy", "srtf"), "nosplit": ("nosplit", "srtf"), "lgtf": ("greedy", "lgtf")}
#: The heuristic teachers ``expert="best"`` chooses from, per training set.
BEST_OF = ("greedy", "lgtf")


def split_cluster(entry: str) -> tuple[str, int | None]:
    """``"16x8:64"`` -> ``("16x8", 64)`` (the cluster and the largest demand of its sets); ``"4x8"`` ->
    ``("4x8", None)`` (the run's ``max_gpus``). :raises ValueError: a bad largest demand."""
    c, sep, m = entry.partition(":")
    if not sep:
        return c, None
    try:
        g = int(m)
    except ValueError:
        g = 0
    if g < 1:
        raise ValueError(f"cluster {entry!r}: the largest demand after ':' must be a positive integer")
    return c, g


def _sets(cluster: ClusterSpec, cfg: SizeFreeTrainConfig, base: int, count: int,
          max_gpus: int | None = None) -> list[list[JobSpec]]:
    from trainer.generate import GeneratorConfig, generate_sets

    perf = ContentionModel(cluster)
    out: list[list[JobSpec]] = []
    kinds = [("zero", 0.9)] + [("poisson", ld) for ld in cfg.loads]
    for d, demand in enumerate(cfg.demands):
        for k, (arrival, load) in enumerate(kinds):
            # the first demand distribution keeps seeds base + 10 k; the d-th adds 1000 d
            g = GeneratorConfig(num_jobs=cfg.jobs_per_set, demand=demand, max_gpus=max_gpus or cfg.max_gpus,
                                arrival=arrival,
                                load=load, seed=base + 1000 * d + 10 * k)
            out.extend(generate_sets(cluster, g, count, perf))
    return out


def training_sets(cfg: SizeFreeTrainConfig) -> dict[str, tuple[list[list[JobSpec]], list[list[JobSpec]]]]:
    """``{cluster entry: (training sets, validation sets)}``; an entry ``CLUSTER:G`` draws demands up to
    ``G`` on that cluster (:func:`split_cluster`), else up to ``max_gpus``."""
    out = {}
    for i, c in enumerate(cfg.clusters):
        name, g = split_cluster(c)
        cl = ClusterSpec.parse(name)
        out[c] = (_sets(cl, cfg, cfg.seed + 100 * i, cfg.sets_per_kind, g),
                  _sets(cl, cfg, cfg.seed + 5000 + 100 * i, cfg.val_sets, g))
    return out


def _expert_jct(env, expert: str, idx: int) -> float:
    """Average JCT (s) of trace ``idx`` played by the heuristic teacher ``expert`` in ``env``."""
    slot, order = HEURISTIC_EXPERTS[expert]
    env.reset(options={"trace": idx})
    done = False
    while not done:
        _o, _r, term, trunc, _ = env.step(env.expert_action(slot, order))
        done = term or trunc
    return float(np.mean([j.finish - j.spec.submit_time for j in env.sim.jobs]))


def best_experts(env, candidates: tuple[str, ...] = BEST_OF) -> list[str]:
    """Per trace of ``env``, the heuristic teacher of ``candidates`` with the lowest average JCT when it
    plays the whole trace in ``env`` (the teacher ``expert="best"``; first on ties)."""
    out = []
    for idx in range(len(env.traces)):
        jct = [_expert_jct(env, e, idx) for e in candidates]
        out.append(candidates[int(np.argmin(jct))])
    return out


def _collect(env, scorer, episodes: list[int], expert: str | list[str], use_net: bool,
             teacher=None) -> tuple[list, list, list]:
    """States, masks and the teacher's labels along episodes played by the teacher or the network.

    ``teacher``: a :class:`trainer.sizefree.dagger.PlannerTeacher` (labels from the planner), else the
    heuristic teacher ``expert`` (:data:`HEURISTIC_EXPERTS`; a list: one per trace) labels. A state the teacher leaves unlabelled is not kept; the teacher's
    own episodes then take the ``greedy`` slot's pick there."""
    import torch

    obs_l, mask_l, lab_l = [], [], []
    for idx in episodes:
        obs, _ = env.reset(options={"trace": idx})
        slot, order = ("greedy", "srtf") if teacher is not None else \
            HEURISTIC_EXPERTS[expert if isinstance(expert, str) else expert[idx]]
        if teacher is not None:
            teacher.reset()
        done = False
        while not done:
            m = env.action_masks()
            enc = env.encoding  # the encoding the mask and the observation came from
            state = env.backend.snapshot() if teacher is not None and enc is not None else None
            if teacher is None:
                label = env.expert_action(slot, order)
            elif enc is None:
                label = env.obs_spec.hold
            else:
                label = teacher.label(state, enc)
            if label is not None and m.sum() > 1:  # a choice to learn
                obs_l.append(obs.copy())
                mask_l.append(m)
                lab_l.append(label)
            if use_net:
                with torch.no_grad():
                    s = scorer(torch.as_tensor(obs[None]))[0].numpy()
                a = int(np.where(m, s, -np.inf).argmax())
            else:
                a = label if label is not None else env.expert_action("greedy")
            if teacher is not None and enc is not None:
                teacher.taken(state, a, label, enc)
            obs, _r, term, trunc, _ = env.step(a)
            done = term or trunc
    return obs_l, mask_l, lab_l


def _fit(scorer, data: tuple[list, list, list], epochs: int, seed: int, log: Callable[[str], None]) -> float:
    import torch

    obs = torch.as_tensor(np.asarray(data[0], dtype=np.float32))
    mask = torch.as_tensor(np.asarray(data[1], dtype=bool))
    lab = torch.as_tensor(np.asarray(data[2], dtype=np.int64))
    opt = torch.optim.Adam(scorer.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(seed)
    n = len(lab)
    acc = 0.0
    for ep in range(epochs):
        perm = torch.randperm(n, generator=g)
        for i in range(0, n, 256):
            b = perm[i: i + 256]
            s = scorer(obs[b]).masked_fill(~mask[b], -1e9)
            loss = torch.nn.functional.cross_entropy(s, lab[b])
            opt.zero_grad()
            loss.backward()
            opt.step()
        if ep == epochs - 1 or ep % 10 == 0:
            with torch.no_grad():
                s = scorer(obs).masked_fill(~mask, -1e9)
                acc = float((s.argmax(1) == lab).float().mean())
            log(f"  bc epoch {ep}: loss {loss.item():.4f}, agreement with the teacher {acc:.3f} ({n} states)")
    return acc


def behaviour_clone(envs: list, scorer, cfg: SizeFreeTrainConfig, log: Callable[[str], None],
                    init_acts: bool | None = None) -> float:
    """Clone the teacher into ``scorer`` (module docstring, step 2); returns the final agreement.

    Round 0 plays the teacher's own picks (the network's when ``init_acts``, default: when ``cfg.init``
    gave it trained weights), rounds ``1..cfg.dagger`` the network's (DAgger); every round adds its
    labelled states to the data set and refits on all of it."""
    if init_acts is None:
        init_acts = bool(cfg.init)
    teachers = None
    if cfg.expert == "planner":
        from trainer.sizefree.dagger import PlannerTeacher

        teachers = [PlannerTeacher(env.cluster, env.perf, cfg.teacher_name()) for env in envs]
    experts: list = [cfg.expert] * len(envs)
    if cfg.expert == "best":
        experts = [best_experts(env) for env in envs]
        log("per-set teachers: " + "; ".join(f"env {k}: " + ", ".join(e) for k, e in enumerate(experts)))
    data: tuple[list, list, list] = ([], [], [])
    acc = 0.0
    for rnd in range(cfg.dagger + 1):
        t0 = time.perf_counter()
        for k, env in enumerate(envs):
            got = _collect(env, scorer, list(range(len(env.traces))), experts[k], use_net=rnd > 0 or init_acts,
                           teacher=None if teachers is None else teachers[k])
            for d, x in zip(data, got):
                d.extend(x)
        extra = ""
        if teachers is not None:
            st = {k: sum(t.stats()[k] for t in teachers) for k in teachers[0].stats()}
            extra = (f"; planner: {st['searches']} searches ({st['cut']} cut by the budget), "
                     f"{st['unlabelled']} states unlabelled, {st['preempt_labels']} preempt labels so far")
        log(f"bc round {rnd} ({'teacher' if rnd == 0 and not init_acts else 'dagger'}): {len(data[2])} labelled states "
            f"({time.perf_counter() - t0:.0f} s{extra})")
        acc = _fit(scorer, data, cfg.bc_epochs, cfg.seed + rnd, log)
    return acc


def init_tensors(net: SizeFreeNet, spec: SizeFreeSpec, where: str) -> dict[str, np.ndarray]:
    """The tensors of ``net`` for a run with codec spec ``spec``: the same when the specs agree; a
    network without preempt candidates starting a run with them gets zero input weights for the
    :data:`~policies.codecs.sizefree.N_RUN` added features (inserted after its candidate features),
    so its start and hold rows score as before. :class:`ValueError` naming ``where`` otherwise."""
    from policies.codecs.sizefree import N_CAND

    old = net.spec
    same = (old.jobs, old.gpus_per_node, old.tau_s) == (spec.jobs, spec.gpus_per_node, spec.tau_s)
    if not same or (old.preempt and old.preempt != spec.preempt):
        raise ValueError(f"--init {where}: its codec spec {old} does not fit the run's {spec}")
    out = {f"{p}.{x}": np.asarray(w, dtype=np.float32) for p, (W, b) in zip(TENSOR_NAMES, net.layers)
           for x, w in (("weight", W.T), ("bias", b))}
    if not old.preempt and spec.preempt:
        W0 = out["cand.0.weight"]
        add = np.zeros((W0.shape[0], spec.cand_features - N_CAND), dtype=np.float32)
        out["cand.0.weight"] = np.ascontiguousarray(np.concatenate([W0[:, :N_CAND], add, W0[:, N_CAND:]], axis=1))
    return out


def validate(net: SizeFreeNet, val: dict[str, list[list[JobSpec]]]) -> float:
    """Mean average JCT (h) of ``rl-sf`` with ``net`` over the validation sets of every cluster."""
    from trainer.metrics import summarize
    from trainer.simulator import SimConfig, Simulator

    out = []
    for c, sets in val.items():
        cl = ClusterSpec.parse(split_cluster(c)[0])
        perf = ContentionModel(cl)
        for jobs in sets:
            pol = SizeFreePolicy(net, SizeFreeCodec(cl, perf, net.spec))
            out.append(summarize(Simulator(cl, jobs, pol, perf, SimConfig()).run())["avg_jct_s"] / 3600)
    return float(np.mean(out))


def _heuristic_val(name: str, val: dict[str, list[list[JobSpec]]]) -> float:
    from policies.registry import make_policy
    from trainer.metrics import summarize
    from trainer.simulator import SimConfig, Simulator

    out = []
    for c, sets in val.items():
        cl = ClusterSpec.parse(split_cluster(c)[0])
        perf = ContentionModel(cl)
        for jobs in sets:
            res = Simulator(cl, jobs, make_policy(name, cl, perf), perf, SimConfig()).run()
            out.append(summarize(res)["avg_jct_s"] / 3600)
    return float(np.mean(out))


def train(cfg: SizeFreeTrainConfig, out: str | Path, log: Callable[[str], None] = print,
          command: str = "rlsched train-sizefree --out OUT") -> Path:
    """The whole run (module docstring); writes ``out.json`` + ``out.safetensors``; returns the JSON path.
    ``command`` is recorded in the checkpoint's ``training`` section."""
    import torch
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    from trainer.sizefree.env import SizeFreeEnv
    from trainer.sizefree.model import SizeFreeMaskablePolicy

    t0 = time.perf_counter()
    torch.manual_seed(cfg.seed)
    spec = SizeFreeSpec(jobs=cfg.jobs, preempt=cfg.preempt)
    sets = training_sets(cfg)
    val = {c: v for c, (_t, v) in sets.items()}
    envs = [SizeFreeEnv(tr, split_cluster(c)[0], spec) for c, (tr, _v) in sets.items()]
    log(f"training sets: {', '.join(f'{c}: {len(t)}' for c, (t, _v) in sets.items())} x {cfg.jobs_per_set} jobs")

    def make(i: int):
        c, (tr, _v) = list(sets.items())[i]
        return lambda: SizeFreeEnv(tr, split_cluster(c)[0], spec, w1=cfg.w1)

    venv_cls = SubprocVecEnv if cfg.subproc else DummyVecEnv
    venv = venv_cls([make(i) for i in range(len(sets))])
    model = MaskablePPO(SizeFreeMaskablePolicy, venv, learning_rate=cfg.ppo_lr, n_steps=cfg.n_steps, batch_size=256,
                        n_epochs=4, gamma=1.0, gae_lambda=0.95, ent_coef=cfg.ent_coef, seed=cfg.seed, verbose=0,
                        policy_kwargs={"spec": spec.to_dict(), "hidden": cfg.hidden})
    scorer = model.policy.scorer
    init_net = None
    if cfg.init:
        from policies.sizefree import load_sizefree, shipped_sizefree

        init_net, _m, init_path = load_sizefree(shipped_sizefree() if cfg.init == "rl-sf" else cfg.init)
        scorer.load_tensors(init_tensors(init_net, spec, str(init_path)))
        log(f"initial weights: {init_path}")
    # a network that never saw preempt rows does not play round 0: its scores for them are untrained
    if cfg.bc_epochs > 0:
        acc = behaviour_clone(envs, scorer, cfg, log, init_acts=init_net is not None and init_net.spec == spec)
    else:  # no cloning: PPO fine-tunes the --init network (the "bc" numbers are that network's)
        acc = float("nan")
        log("no cloning (bc_epochs 0): PPO starts from the initial weights")
    bc_tensors = scorer.tensors()
    bc_val = validate(SizeFreeNet(spec, bc_tensors), val)
    heur = "greedy" if cfg.expert in ("planner", "best") else cfg.expert
    heur_val = _heuristic_val(heur, val)
    cmp_val = float("nan")
    if cfg.compare:
        from policies.sizefree import load_sizefree, make_sizefree_policy

        ref = make_sizefree_policy("rl-sf", ClusterSpec.parse(split_cluster(cfg.clusters[0])[0])) if cfg.compare == "rl-sf" else None
        ref_net = ref.net if ref is not None else load_sizefree(cfg.compare)[0]
        cmp_val = validate(ref_net, val)
    log(f"validation avg JCT: heuristic {heur} {heur_val:.3f} h, {cfg.compare or 'no reference'} {cmp_val:.3f} h, "
        f"cloned {bc_val:.3f} h ({time.perf_counter() - t0:.0f} s)")
    ppo_val = float("nan")
    chosen = "bc"
    tensors = bc_tensors
    if cfg.ppo_timesteps > 0:
        model.learn(total_timesteps=cfg.ppo_timesteps)
        ppo_tensors = scorer.tensors()
        ppo_val = validate(SizeFreeNet(spec, ppo_tensors), val)
        log(f"validation avg JCT after {cfg.ppo_timesteps} PPO steps: {ppo_val:.3f} h "
            f"({time.perf_counter() - t0:.0f} s)")
        if ppo_val < bc_val or cfg.w1 is not None:
            chosen, tensors = "ppo", ppo_tensors
    venv.close()
    training = {
        "algo": f"bc+dagger ({'planner' if cfg.expert == 'planner' else 'heuristic'} teacher), then maskable-ppo",
        "config": {k: (list(v) if isinstance(v, tuple) else v)
                                                          for k, v in asdict(cfg).items()},
        "bc_agreement": acc if np.isfinite(acc) else None,
        "val_avg_jct_h": {k: (v if np.isfinite(v) else None)  # None: not run (JSON has no NaN)
                          for k, v in {"heuristic": heur_val, "reference": cmp_val, "bc": bc_val, "ppo": ppo_val}.items()},
        "chosen": chosen, "wall_s": round(time.perf_counter() - t0, 1),
        "command": command,
    }
    path = save_sizefree(out, tensors, spec, training, reward=cfg.reward())
    log(f"wrote {path} ({chosen}; {time.perf_counter() - t0:.0f} s)")
    return path
