"""Training SCED2's Q-network: episodic DQN with prioritized replay on Philly-derived job sequences.

:func:`train` samples ``n_train`` training sequences (seeds from :data:`~trainer.sced2.sequences.TRAIN_SEEDS`)
and ``n_val`` validation sequences (:data:`~trainer.sced2.sequences.VAL_SEEDS`), trains
:class:`~trainer.sced2.dqn.Sced2DQN` on :class:`~trainer.sced2.env.Sced2Env` (one episode = one
sequence, drawn at random each reset), and every ``eval_every`` steps runs the greedy numpy policy
(:class:`policies.sced2.Sced2Policy` on the exported weights) through the simulator on the
validation sequences; the weights with the lowest mean average JCT there are saved
(:func:`policies.sced2.save_sced2`; the test sequences, :data:`~trainer.sced2.sequences.TEST_SEEDS`,
are never seen). Command: ``rlsched train-sced2`` (:mod:`trainer.sced2.cli`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from policies.cluster import ClusterSpec
from policies.codecs.sced2 import Sced2Codec, Sced2Spec
from policies.job import JobSpec
from policies.perf import ContentionModel
from policies.sced2 import Sced2Net, Sced2Policy, save_sced2
from trainer.sced2.sequences import TRAIN_SEEDS, VAL_SEEDS, philly_pool, sample_sequence
from trainer.simulator import SimConfig, Simulator

__all__ = ["Sced2TrainConfig", "avg_jct", "train"]


@dataclass
class Sced2TrainConfig:
    """A training run (defaults: the shipped checkpoint's run, docs/SCED2.md)."""

    cluster: str = "15x8"
    seq_jobs: int = 1000
    n_train: int = 30
    n_val: int = 3
    load: float = 1.0
    one_gpu: float = 0.68
    jobs: int = 10
    k: int = 4
    hidden: int = 32
    head: int = 64
    timesteps: int = 120_000
    lr: float = 5e-4
    buffer: int = 50_000
    learning_starts: int = 1_000
    batch: int = 64
    gamma: float = 0.99
    train_freq: int = 4
    target_update: int = 1_000
    exploration_fraction: float = 0.3
    exploration_final: float = 0.05
    per_alpha: float = 0.6
    per_beta0: float = 0.4
    eval_every: int = 15_000
    seed: int = 0


def avg_jct(policy: Sced2Policy | Any, cluster: ClusterSpec, jobs: list[JobSpec], perf: ContentionModel) -> float:
    """Average JCT (s) of ``policy`` on ``jobs`` in the simulator (default :class:`SimConfig`)."""
    res = Simulator(cluster, jobs, policy, perf, SimConfig()).run()
    return float(np.mean([r.jct for r in res.jobs]))


def train(cfg: Sced2TrainConfig, out: str | Path, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run ``cfg`` and save the best validated weights as checkpoint ``out``; returns the training record."""
    from trainer.sced2.dqn import PrioritizedReplayBuffer, Sced2DQN
    from trainer.sced2.env import Sced2Env
    from stable_baselines3.common.callbacks import BaseCallback

    from trainer.sced2.qnet import Sced2DQNPolicy, export_tensors

    import torch

    torch.set_num_threads(1)  # a tiny network: threads only contend (measured: 4x slower wall on 2 busy cores)
    say = log or (lambda s: None)
    t0 = time.time()
    cluster = ClusterSpec.parse(cfg.cluster)
    perf = ContentionModel(cluster)
    pool = philly_pool(cluster)
    tr_seeds = [TRAIN_SEEDS[i] + cfg.seed * 1000 for i in range(cfg.n_train)]
    va_seeds = [VAL_SEEDS[i] for i in range(cfg.n_val)]
    train_seqs = [sample_sequence(pool, cluster, cfg.seq_jobs, s, load=cfg.load, one_gpu=cfg.one_gpu, perf=perf)
                  for s in tr_seeds]
    val_seqs = [sample_sequence(pool, cluster, cfg.seq_jobs, s, load=cfg.load, one_gpu=cfg.one_gpu, perf=perf)
                for s in va_seeds]
    spec = Sced2Spec.for_cluster(cluster, cfg.jobs, cfg.k)
    env = Sced2Env(train_seqs, cluster, spec=spec, perf=perf)
    model = Sced2DQN(
        Sced2DQNPolicy, env, learning_rate=cfg.lr, buffer_size=cfg.buffer, learning_starts=cfg.learning_starts,
        batch_size=cfg.batch, gamma=cfg.gamma, train_freq=cfg.train_freq, target_update_interval=cfg.target_update,
        exploration_fraction=cfg.exploration_fraction, exploration_final_eps=cfg.exploration_final,
        replay_buffer_class=PrioritizedReplayBuffer,
        replay_buffer_kwargs={"alpha": cfg.per_alpha, "beta0": cfg.per_beta0, "seed": cfg.seed},
        policy_kwargs={"spec": spec.to_dict(), "hidden": cfg.hidden, "head": cfg.head}, seed=cfg.seed, verbose=0,
        device="cpu",
    )
    codec = Sced2Codec(cluster, perf, spec)
    fifo = _fifo_reference(cluster, val_seqs, perf)
    say(f"validation sequences {va_seeds}: FIFO average JCT {np.mean(fifo) / 3600:.2f} h")
    history: list[dict[str, float]] = []
    best: list[Any] = []  # [score, tensors, timesteps] of the best validated weights

    def validate() -> None:
        tensors = export_tensors(model.q_net)
        pol = Sced2Policy(Sced2Net(spec, tensors), codec)
        jcts = [avg_jct(pol, cluster, s, perf) for s in val_seqs]
        score = float(np.mean(jcts))
        n = model.num_timesteps
        history.append({"timesteps": n, "val_avg_jct_s": score,
                        "val_jct_vs_fifo": float(np.mean(np.asarray(jcts) / np.asarray(fifo))),
                        "wall_s": time.time() - t0})
        say(f"{n} steps: validation average JCT {score / 3600:.2f} h "
            f"({history[-1]['val_jct_vs_fifo']:.3f} x FIFO), {time.time() - t0:.0f} s")
        if not best or score < best[0]:
            best[:] = [score, tensors, n]

    class _Validate(BaseCallback):
        def _on_step(self) -> bool:
            if self.num_timesteps % cfg.eval_every == 0:
                validate()
            return True

    model.learn(cfg.timesteps, callback=_Validate())
    if not history or history[-1]["timesteps"] != model.num_timesteps:
        validate()
    record = {
        "config": asdict(cfg),
        "timesteps": cfg.timesteps,
        "train_seeds": tr_seeds,
        "val_seeds": va_seeds,
        "val_fifo_avg_jct_s": [float(x) for x in fifo],
        "history": history,
        "best_timesteps": best[2],
        "best_val_avg_jct_s": best[0],
        "wall_s": time.time() - t0,
        "sequences": "trainer.sced2.sequences (Philly, one_gpu share, load, SCED2_MIX)",
    }
    save_sced2(out, best[1], spec, cluster, record)
    say(f"saved {out} (best at {best[2]} steps), {record['wall_s']:.0f} s")
    return record


def _fifo_reference(cluster: ClusterSpec, seqs: list[list[JobSpec]], perf: ContentionModel) -> list[float]:
    from policies.registry import make_policy

    return [avg_jct(make_policy("fifo", cluster, perf), cluster, s, perf) for s in seqs]
