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
from pathlib import Path

from rlsched.argtypes import positive_float
from rlsched.argtypes import positive_int as _positive_int
from trainer.common.train_cli import ConfigOption, add_config_options, cli_error, config_values

__all__ = ["register"]

#: The options of ``train-sced2`` that set fields of :class:`trainer.sced2.train.Sced2TrainConfig`.
TRAIN_OPTIONS = (
    ConfigOption("--cluster", "training cluster NODESxGPUS"),
    ConfigOption("--timesteps", "DQN steps", _positive_int),
    ConfigOption("--seq-jobs", "jobs per sequence", _positive_int),
    ConfigOption("--n-train", "training sequences", _positive_int),
    ConfigOption("--n-val", "validation sequences", _positive_int),
    ConfigOption("--load", "offered load of the sequences", positive_float),
    ConfigOption("--eval-every", "validate every N steps", _positive_int),
    ConfigOption("--seed", "seed", int),
)


def register(sub: argparse._SubParsersAction) -> None:
    from trainer.sced2.train import Sced2TrainConfig

    p = sub.add_parser("train-sced2", help="train SCED2's job-selection Q-network (DQN, prioritized replay)")
    p.add_argument("--out", required=True, help="checkpoint path NAME (writes NAME.json + NAME.safetensors)")
    add_config_options(p, Sced2TrainConfig(), TRAIN_OPTIONS)
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
        return cli_error("train-sced2", exc)
    cfg = Sced2TrainConfig(**config_values(args, TRAIN_OPTIONS))
    train(cfg, args.out, log=lambda s: print(s, flush=True))
    return 0


def _run_sequences(args: argparse.Namespace) -> int:
    from policies.cluster import ClusterSpec, ClusterSpecError
    from trainer.sced2.sequences import TEST_SEEDS, TRAIN_SEEDS, VAL_SEEDS, philly_pool, sample_sequence
    from trainer.traces import write_trace

    try:
        cluster = ClusterSpec.parse(args.cluster)
    except (ClusterSpecError, ValueError) as exc:
        return cli_error("sced2-sequences", exc)
    if not 0 <= args.one_gpu <= 1:
        return cli_error("sced2-sequences", f"--one-gpu must be in [0, 1], got {args.one_gpu}")
    seeds = {"train": TRAIN_SEEDS, "val": VAL_SEEDS, "test": TEST_SEEDS}[args.split]
    if args.count > len(seeds):
        return cli_error("sced2-sequences", f"--count: the {args.split} split has {len(seeds)} seeds")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pool = philly_pool(cluster)
    for s in seeds[: args.count]:
        jobs = sample_sequence(pool, cluster, args.jobs, s, load=args.load, one_gpu=args.one_gpu)
        path = out / f"{args.split}-{s}.csv"
        write_trace(path, jobs)
        print(path)
    return 0
