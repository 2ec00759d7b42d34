"""``rlsched train-dl2``: DL2's training run (:func:`trainer.dl2.train.train`), writing ``OUT/dl2.json`` +
``OUT/dl2.safetensors``.

    nice -n 10 rlsched train-dl2 --out policies/checkpoints/dl2
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rlsched.argtypes import positive_float
from rlsched.argtypes import positive_int as _positive_int

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    from trainer.dl2.train import DL2TrainConfig

    d = DL2TrainConfig()
    p = sub.add_parser("train-dl2", help="train DL2 (supervised warm-up on DRF, then online actor-critic RL)")
    p.add_argument("--out", required=True, help="directory to write dl2.json + dl2.safetensors into")
    p.add_argument("--cluster", default=d.cluster, help="cluster file (default: %(default)s)")
    p.add_argument("--jobs", type=_positive_int, default=d.jobs, help="jobs per training sequence (default: %(default)s)")
    p.add_argument("--sl-traces", type=_positive_int, default=d.sl_traces, help="DRF episodes for the warm-up (default: %(default)s)")
    p.add_argument("--sl-epochs", type=_positive_int, default=d.sl_epochs, help="warm-up epochs (default: %(default)s)")
    p.add_argument("--rl-episodes", type=int, default=d.rl_episodes, help="online RL episodes, >= 0 (default: %(default)s)")
    p.add_argument("--val-seeds", type=_positive_int, default=d.val_seeds, help="validation sequences (default: %(default)s)")
    p.add_argument("--J", type=_positive_int, default=d.J, help="jobs per batch in the state (default: %(default)s)")
    p.add_argument("--epsilon", type=positive_float, default=d.epsilon, help="job-aware exploration (default: %(default)s)")
    p.add_argument("--seed", type=int, default=d.seed, help="seed (default: %(default)s)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from trainer.dl2.train import DL2TrainConfig, train

    if args.rl_episodes < 0:
        print(f"rlsched train-dl2: error: --rl-episodes must be >= 0, got {args.rl_episodes}", file=sys.stderr)
        return 2
    if not Path(args.cluster).is_file():
        print(f"rlsched train-dl2: error: cluster file {args.cluster} not found", file=sys.stderr)
        return 2
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        print(f"rlsched train-dl2: error: --out {out} exists and is not a directory", file=sys.stderr)
        return 2
    cfg = DL2TrainConfig(J=args.J, jobs=args.jobs, sl_traces=args.sl_traces, sl_epochs=args.sl_epochs,
                         rl_episodes=args.rl_episodes, val_seeds=args.val_seeds, epsilon=args.epsilon,
                         seed=args.seed, cluster=args.cluster)
    train(cfg, out / "dl2", progress_bar=not args.no_progress, log=lambda s: print(s, flush=True))
    return 0
