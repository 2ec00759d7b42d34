"""``rlsched train-chic`` (train Chic / Chic-Pair, :mod:`trainer.chic.train`) and ``rlsched chic-results``
(evaluate them against Optimus / DRF / Tetris and regenerate the docs' Chic sections,
:mod:`trainer.chic.results`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _pos_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{s!r} must be >= 1")
    return v


def _pos_float(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not a number") from None
    if not (v > 0 and v < float("inf")):
        raise argparse.ArgumentTypeError(f"{s!r} must be a finite number > 0")
    return v


def _rates(s: str) -> list[float]:
    return [_pos_float(x.strip()) for x in s.split(",") if x.strip()]


def register(sub: argparse._SubParsersAction) -> None:
    from trainer.chic.train import CEMConfig

    d = CEMConfig()
    p = sub.add_parser("train-chic", help="train Chic or Chic-Pair (seed 001) by its modified cross-entropy method",
                       description="Train Chic / Chic-Pair on gen-elastic --setting chic sequences (docs/ELASTIC.md, "
                                   "'Chic and Chic-Pair'). Writes OUT/VARIANT.json + .safetensors (the network with the "
                                   "best validation ACT) and OUT/VARIANT-history.json.")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--variant", choices=("chic", "chic-pair"), default=d.variant, help="(default: %(default)s)")
    p.add_argument("--slots", type=_pos_int, default=d.slots, help="I, workloads scheduled (default: %(default)s)")
    p.add_argument("--iterations", type=_pos_int, default=d.iterations, help="CE iterations K (default: %(default)s)")
    p.add_argument("--n", type=_pos_int, default=d.n, help="trajectories from the policy per iteration (default: %(default)s)")
    p.add_argument("--rho", type=_pos_float, default=d.rho, help="elite fraction (default: %(default)s)")
    p.add_argument("--lr", type=_pos_float, default=d.lr, help="Adam learning rate (default: %(default)s)")
    p.add_argument("--smooth", type=_pos_float, default=d.smooth, help="smoothing alpha (default: %(default)s)")
    p.add_argument("--fit-epochs", type=_pos_int, default=d.fit_epochs, help="Adam passes per iteration (default: %(default)s)")
    p.add_argument("--rate", type=_pos_float, default=d.rate, help="arrival rate of the sequences, jobs/h (default: %(default)s)")
    p.add_argument("--train-seqs", type=_pos_int, default=d.train_seqs, help="training sequences (default: %(default)s)")
    p.add_argument("--val-seqs", type=_pos_int, default=d.val_seqs, help="validation sequences (default: %(default)s)")
    p.add_argument("--val-every", type=_pos_int, default=d.val_every, help="validate every N iterations (default: %(default)s)")
    p.add_argument("--seed", type=int, default=d.seed, help="(default: %(default)s)")
    p.add_argument("--no-task-mask", action="store_true",
                   help="ablation: mask only tasks that do not fit (not those that do not lower the estimated "
                        "per-iteration time); condition (2) then only ends the phase")
    p.set_defaults(func=_cmd_train)

    r = sub.add_parser("chic-results", help="evaluate Chic / Chic-Pair against Optimus, DRF, Tetris on held-out sequences",
                       description="Run chic, chic-pair, optimus, drf, tetris on held-out gen-elastic --setting chic "
                                   "sequences at each rate; write OUT/chic_results.{json,md} and the figures; with --docs "
                                   "also the Chic sections of docs/ELASTIC.md and docs/RESULTS.md and docs/figures/chic_*.png.")
    r.add_argument("--out", required=True, help="output directory")
    r.add_argument("--rates", type=_rates, default=[0.9, 1.8, 2.7], help="jobs/h, comma-separated (default: 0.9,1.8,2.7)")
    r.add_argument("--seqs", type=_pos_int, default=30, help="test sequences per rate (default: %(default)s)")
    r.add_argument("--chic", default=None, help="Chic checkpoint (default: the shipped one)")
    r.add_argument("--chic-pair", default=None, help="Chic-Pair checkpoint (default: the shipped one)")
    r.add_argument("--docs", action="store_true", help="also regenerate the docs' Chic sections and figures")
    r.set_defaults(func=_cmd_results)


def _cmd_train(args: argparse.Namespace) -> int:
    from trainer.chic.train import CEMConfig, train

    cfg = CEMConfig(variant=args.variant, slots=args.slots, iterations=args.iterations, n=args.n, rho=args.rho,
                    lr=args.lr, smooth=args.smooth, fit_epochs=args.fit_epochs, rate=args.rate,
                    train_seqs=args.train_seqs, val_seqs=args.val_seqs, val_every=args.val_every, seed=args.seed,
                    task_mask=not args.no_task_mask)
    try:
        cfg.check()
    except ValueError as exc:
        print(f"rlsched train-chic: {exc}", file=sys.stderr)
        return 2
    h = train(cfg, args.out, progress=sys.stderr.isatty())
    print(f"{args.variant}: best validation ACT {h['best_val_act']:.0f} s at iteration {h['best_iteration']}; "
          f"{h['train_seconds']:.0f} s; checkpoint {Path(args.out) / args.variant}.json")
    return 0


def _cmd_results(args: argparse.Namespace) -> int:
    from trainer.chic.results import main

    if not args.rates:
        print("rlsched chic-results: --rates names no rate", file=sys.stderr)
        return 2
    res = main(Path(args.out), args.rates, args.seqs, {"chic": args.chic, "chic-pair": args.chic_pair}, args.docs,
               progress=sys.stderr.isatty())
    print((Path(args.out) / "chic_results.md").read_text(), end="")
    return 0 if res else 1
