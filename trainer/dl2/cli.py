"""``rlsched train-dl2``: DL2's training run (:func:`trainer.dl2.train.train`), writing ``OUT/dl2.json`` +
``OUT/dl2.safetensors``.

    nice -n 10 rlsched train-dl2 --out policies/checkpoints/dl2
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rlsched.argtypes import non_negative_float, positive_float
from rlsched.argtypes import positive_int as _positive_int
from trainer.common.train_cli import ConfigOption, add_config_options, cli_error, config_values

__all__ = ["register"]

def _switch(text: str) -> bool:
    """0 / 1 (also false / true, no / yes) as a bool."""
    t = text.strip().lower()
    if t in ("1", "true", "yes"):
        return True
    if t in ("0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected 0 or 1, got {text!r}")


def _sizes(text: str) -> tuple[int, ...]:
    """Comma-separated positive layer widths, e.g. ``64,64``."""
    try:
        out = tuple(int(t) for t in text.split(","))
    except ValueError:
        out = ()
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return out


#: The options that set fields of :class:`trainer.dl2.train.DL2TrainConfig`.
OPTIONS = (
    ConfigOption("--cluster", "cluster file"),
    ConfigOption("--jobs", "jobs per training sequence", _positive_int),
    ConfigOption("--sl-traces", "DRF episodes for the warm-up", _positive_int),
    ConfigOption("--sl-samples", "warm-up samples kept (uniformly) from the teacher's episodes", _positive_int),
    ConfigOption("--sl-epochs", "warm-up epochs", _positive_int),
    ConfigOption("--rl-episodes", "online RL episodes, >= 0", int),
    ConfigOption("--val-seeds", "validation sequences", _positive_int),
    ConfigOption("--J", "jobs per batch in the state", _positive_int),
    ConfigOption("--arch", "actor: flat (the seed's MLP over the flattened rows) or rows (a shared-weight scorer per job row)"),
    ConfigOption("--remaining", "remaining-epochs feature: linear (the seed's) or log1p (ours, ln(1 + epochs) x 0.1)"),
    ConfigOption("--counts", "workers / PSs features: linear (the seed's) or log1p (ours, ln(1 + count) x 0.3)"),
    ConfigOption("--hidden", "hidden layer widths (flat: the MLP's; rows: the row scorer's)", _sizes),
    ConfigOption("--epsilon", "job-aware exploration", positive_float),
    ConfigOption("--teacher", "warm-up teacher: drf (the seed's) or optimus"),
    ConfigOption("--seed", "seed", int),
    ConfigOption("--seed0", "first training sequence's seed (warm-up: seed0.., RL: seed0 + sl_traces..)", int),
    ConfigOption("--init", "start RL from this checkpoint (its actor and critic; no warm-up)"),
    ConfigOption("--rl-lr", "actor learning rate of RL", positive_float),
    ConfigOption("--critic-lr", "critic learning rate of RL (0: --rl-lr)", non_negative_float),
    ConfigOption("--beta", "entropy weight", non_negative_float),
    ConfigOption("--beta-end", "entropy weight of the last RL episode, linear from --beta (< 0: --beta throughout)",
                 float),
    ConfigOption("--target-tau", "Polyak rate of a target critic (0: none)", non_negative_float),
    ConfigOption("--adv-norm", "normalise advantages per mini-batch (0 / 1)", _switch),
    ConfigOption("--clip", "gradient-norm clip (0: none)", non_negative_float),
    ConfigOption("--updates", "mini-batch updates per slot", _positive_int),
    ConfigOption("--behaviour", "RL episodes act by: sample (the seed's) or greedy (most likely action, "
                 "sampling with probability --sample-p)"),
    ConfigOption("--sample-p", "probability of a sampled action with --behaviour greedy", non_negative_float),
    ConfigOption("--explore", "job-aware exploration: poor (the seed's rule) or ps (+1 PS to the job with the "
                 "fewest PSs per worker)"),
)


def register(sub: argparse._SubParsersAction) -> None:
    from trainer.dl2.train import DL2TrainConfig

    p = sub.add_parser("train-dl2", help="train DL2 (supervised warm-up on DRF, then online actor-critic RL)")
    p.add_argument("--out", required=True, help="directory to write dl2.json + dl2.safetensors into")
    add_config_options(p, DL2TrainConfig(), OPTIONS)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from policies.dl2 import ARCHES, COUNTS, REMAINING
    from trainer.dl2.train import BEHAVIOURS, EXPLORE_RULES, TEACHERS, DL2TrainConfig, train

    if args.rl_episodes < 0:
        return cli_error("train-dl2", f"--rl-episodes must be >= 0, got {args.rl_episodes}")
    if not Path(args.cluster).is_file():
        return cli_error("train-dl2", f"cluster file {args.cluster} not found")
    if args.init and not Path(args.init).exists() and not Path(args.init + ".json").exists():
        return cli_error("train-dl2", f"--init {args.init} not found")
    for flag, value, allowed in (("--arch", args.arch, ARCHES), ("--remaining", args.remaining, REMAINING),
                                 ("--counts", args.counts, COUNTS), ("--behaviour", args.behaviour, BEHAVIOURS),
                                 ("--explore", args.explore, EXPLORE_RULES), ("--teacher", args.teacher, TEACHERS)):
        if value not in allowed:
            return cli_error("train-dl2", f"{flag} must be one of {', '.join(allowed)}, got {value!r}")
    if not 0 <= args.sample_p <= 1:
        return cli_error("train-dl2", f"--sample-p must be in [0, 1], got {args.sample_p}")
    if not 0 <= args.target_tau <= 1:
        return cli_error("train-dl2", f"--target-tau must be in [0, 1], got {args.target_tau}")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        return cli_error("train-dl2", f"--out {out} exists and is not a directory")
    cfg = DL2TrainConfig(**config_values(args, OPTIONS))
    train(cfg, out / "dl2", progress_bar=not args.no_progress, log=lambda s: print(s, flush=True))
    return 0
