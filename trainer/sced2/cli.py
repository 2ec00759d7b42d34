"""``rlsched train-sced2`` and ``rlsched sced2-sequences``: SCED2's training run and its job sequences.

``rlsched train-sced2 --out policies/checkpoints/sced2/sced2-m8 --timesteps 20000`` trains SCED2's
Q-network (:func:`trainer.sced2.train.train`) on Philly-derived sequences and writes the checkpoint
``OUT.json`` + ``OUT.safetensors``.

``rlsched sced2-sequences --split test --count 5 --out DIR`` writes Philly-derived sequences
(:mod:`trainer.sced2.sequences`) as canonical CSV traces ``DIR/<split>-<seed>.csv`` for
``rlsched simulate --trace`` / ``rlsched evaluate --traces``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rlsched.argtypes import positive_float
from rlsched.argtypes import positive_int as _positive_int

__all__ = ["register"]


def _fail(command: str, exc: BaseException) -> int:
    print(f"rlsched {command}: error: {exc}", file=sys.stderr)
    return 2


def register(sub: argparse._SubParsersAction) -> None:
    from trainer.sced2.train import Sced2TrainConfig

    d = Sced2TrainConfig()
    p = sub.add_parser("train-sced2", help="train SCED2's job-selection Q-network (DQN, prioritized replay)")
    p.add_argument("--out", required=True, help="checkpoint path NAME (writes NAME.json + NAME.safetensors)")
    p.add_argument("--cluster", default=d.cluster, help="training cluster NODESxGPUS (default: %(default)s)")
    p.add_argument("--timesteps", type=_positive_int, default=d.timesteps, help="DQN steps (default: %(default)s)")
    p.add_argument("--seq-jobs", type=_positive_int, default=d.seq_jobs, help="jobs per sequence (default: %(default)s)")
    p.add_argument("--n-train", type=_positive_int, default=d.n_train, help="training sequences (default: %(default)s)")
    p.add_argument("--n-val", type=_positive_int, default=d.n_val, help="validation sequences (default: %(default)s)")
    p.add_argument("--load", type=positive_float, default=d.load, help="offered load of the sequences (default: %(default)s)")
    p.add_argument("--eval-every", type=_positive_int, default=d.eval_every, help="validate every N steps (default: %(default)s)")
    p.add_argument("--seed", type=int, default=d.seed, help="seed (default: %(default)s)")
    p.set_defaults(func=_run_train)

    q = sub.add_parser("sced2-sequences", help="write SCED2's Philly-derived job sequences as trace files")
    q.add_argument("--out", required=True, help="directory to write <split>-<seed>.csv into")
    q.add_argument("--split", choices=("train", "val", "test"), default="test", help="seed range (default: %(default)s)")
    q.add_argument("--count", type=_positive_int, default=5, help="sequences (default: %(default)s)")
    q.add_argument("--jobs", type=_positive_int, default=1000, help="jobs per sequence (default: %(default)s)")
    q.add_argument("--cluster", default="15x8", help="cluster NODESxGPUS (default: %(default)s)")
    q.add_argument("--load", type=positive_float, default=1.0, help="offered load (default: %(default)s)")
    q.add_argument("--one-gpu", type=float, default=0.68, help="share of 1-GPU jobs (default: %(default)s)")
    q.set_defaults(func=_run_sequences)


def _run_train(args: argparse.Namespace) -> int:
    from policies.cluster import ClusterSpec, ClusterSpecError
    from trainer.sced2.train import Sced2TrainConfig, train

    try:
        ClusterSpec.parse(args.cluster)
    except (ClusterSpecError, ValueError) as exc:
        return _fail("train-sced2", exc)
    cfg = Sced2TrainConfig(cluster=args.cluster, timesteps=args.timesteps, seq_jobs=args.seq_jobs,
                           n_train=args.n_train, n_val=args.n_val, load=args.load, eval_every=args.eval_every,
                           seed=args.seed)
    train(cfg, args.out, log=lambda s: print(s, flush=True))
    return 0


def _run_sequences(args: argparse.Namespace) -> int:
    from policies.cluster import ClusterSpec, ClusterSpecError
    from trainer.sced2.sequences import TEST_SEEDS, TRAIN_SEEDS, VAL_SEEDS, philly_pool, sample_sequence
    from trainer.traces import write_trace

    try:
        cluster = ClusterSpec.parse(args.cluster)
    except (ClusterSpecError, ValueError) as exc:
        return _fail("sced2-sequences", exc)
    if not 0 <= args.one_gpu <= 1:
        return _fail("sced2-sequences", ValueError(f"--one-gpu must be in [0, 1], got {args.one_gpu}"))
    seeds = {"train": TRAIN_SEEDS, "val": VAL_SEEDS, "test": TEST_SEEDS}[args.split]
    if args.count > len(seeds):
        return _fail("sced2-sequences", ValueError(f"--count: the {args.split} split has {len(seeds)} seeds"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pool = philly_pool(cluster)
    for s in seeds[: args.count]:
        jobs = sample_sequence(pool, cluster, args.jobs, s, load=args.load, one_gpu=args.one_gpu)
        path = out / f"{args.split}-{s}.csv"
        write_trace(path, jobs)
        print(path)
    return 0
