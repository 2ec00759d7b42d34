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
    p.add_argument("--rates", type=_rates, default=None,
                   help="train one network per arrival rate (comma-separated jobs/h, the seed's per-rate retraining); "
                        "writes OUT/VARIANT-rRATE.json each (replaces --rate)")
    p.add_argument("--g", choices=("measured", "fitted", "placed"), default=d.g,
                   help="per-iteration time g of condition (2): the simulator's measured speeds, Optimus' fitted "
                        "form, or the measured speed at the PSs the workers' nodes host (placed: what the shipped "
                        "Chic networks plan with) (default: %(default)s)")
    p.add_argument("--groups", type=int, default=d.groups,
                   help="0: each trajectory on its own random training sequence (the seed's); K: the N trajectories "
                        "of an iteration on K common sequences, level and elite taken per sequence (default: %(default)s)")
    p.add_argument("--init", default=None,
                   help="start from this Chic checkpoint (same variant and I) instead of random weights")
    p.add_argument("--jobs", type=_pos_int, default=d.jobs,
                   help="W, jobs per training sequence (episode); validation sequences keep 30 (default: %(default)s)")
    p.add_argument("--train-seqs", type=_pos_int, default=d.train_seqs, help="training sequences (default: %(default)s)")
    p.add_argument("--val-seqs", type=_pos_int, default=d.val_seqs, help="validation sequences (default: %(default)s)")
    p.add_argument("--val-every", type=_pos_int, default=d.val_every, help="validate every N iterations (default: %(default)s)")
    p.add_argument("--seed", type=int, default=d.seed, help="(default: %(default)s)")
    p.add_argument("--ship", action="store_true",
                   help="after each run, copy the network into policies/checkpoints/chic/ (VARIANT.json at 1.8 jobs/h, "
                        "VARIANT-rRATE.json at other rates) when its validation ACT at its rate is below the checkpoint's "
                        "that serves that rate now")
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
    r.add_argument("--jobs", type=_pos_int, default=30, help="jobs per test sequence (default: %(default)s, the seed's W)")
    r.add_argument("--chic", default=None, help="Chic checkpoint (default: the shipped one)")
    r.add_argument("--chic-pair", default=None, help="Chic-Pair checkpoint (default: the shipped one)")
    r.add_argument("--docs", action="store_true", help="also regenerate the docs' Chic sections and figures")
    r.set_defaults(func=_cmd_results)

    from trainer.chic.study import STUDY_ITERATIONS

    st = sub.add_parser("chic-study", help="the seed's W / I study (Fig. 7): Chic / Chic-Pair trained per cell, "
                                           "evaluated on held-out sequences",
                        description="Train Chic and Chic-Pair with W = 30 / 60 jobs per episode (1.8 jobs/h) and "
                                    "Chic-Pair with I = 2 / 3 / 4 slots (0.9 and 2.7 jobs/h), the same shortened "
                                    "cross-entropy schedule for every cell, and run each on the test sequences with "
                                    "Optimus; write OUT/chic_study.{json,md,png} (cells' checkpoints in OUT/cells, "
                                    "reused when their configuration matches); with --docs also the chic-study blocks "
                                    "of docs/ELASTIC.md and docs/RESULTS.md and docs/figures/chic_study.png.")
    st.add_argument("--out", required=True, help="output directory")
    st.add_argument("--iterations", type=_pos_int, default=STUDY_ITERATIONS,
                    help="CE iterations per cell (default: %(default)s)")
    st.add_argument("--seqs", type=_pos_int, default=30, help="test sequences per cell (default: %(default)s)")
    st.add_argument("--retrain", action="store_true", help="train every cell even where its checkpoint exists")
    st.add_argument("--cells", default=None,
                    help="only these cells, comma-separated (to train cells in parallel processes; with --docs the "
                         "table names the cells left out)")
    st.add_argument("--docs", action="store_true", help="also regenerate the docs' study blocks and figure")
    st.set_defaults(func=_cmd_study)


def _cmd_train(args: argparse.Namespace) -> int:
    import dataclasses

    from trainer.chic.train import CEMConfig, checkpoint_name, ship_if_better, train

    cfg = CEMConfig(variant=args.variant, slots=args.slots, iterations=args.iterations, n=args.n, rho=args.rho,
                    lr=args.lr, smooth=args.smooth, fit_epochs=args.fit_epochs, rate=args.rate, jobs=args.jobs, groups=args.groups, init=args.init,
                    train_seqs=args.train_seqs, val_seqs=args.val_seqs, val_every=args.val_every, seed=args.seed,
                    task_mask=not args.no_task_mask, g=args.g)
    try:
        cfg.check()
    except ValueError as exc:
        print(f"rlsched train-chic: {exc}", file=sys.stderr)
        return 2
    if args.rates is not None and not args.rates:
        print("rlsched train-chic: --rates names no rate", file=sys.stderr)
        return 2
    for rate in args.rates or [None]:
        c = cfg if rate is None else dataclasses.replace(cfg, rate=rate)
        name = checkpoint_name(args.variant, rate)
        from policies.base import PolicyError

        try:
            h = train(c, args.out, progress=sys.stderr.isatty(), name=name)
        except (ValueError, OSError, PolicyError) as exc:
            print(f"rlsched train-chic: {exc}", file=sys.stderr)
            return 2
        print(f"{name}: best validation ACT {h['best_val_act']:.0f} s at iteration {h['best_iteration']}; "
              f"{h['train_seconds']:.0f} s; checkpoint {Path(args.out) / name}.json", flush=True)
        if args.ship:
            rec = ship_if_better(Path(args.out) / f"{name}.json", c.rate)
            was = "no checkpoint" if rec["incumbent"] is None else f"{rec['incumbent_val_act_s']:.0f} s of {rec['incumbent']}"
            print(f"{name}: validation ACT {rec['val_act_s']:.0f} s against {was}: "
                  f"{'shipped as ' + rec['as'] if rec['shipped'] else 'not shipped'}", flush=True)
    return 0


def _cmd_results(args: argparse.Namespace) -> int:
    from trainer.chic.results import main

    if not args.rates:
        print("rlsched chic-results: --rates names no rate", file=sys.stderr)
        return 2
    res = main(Path(args.out), args.rates, args.seqs, {"chic": args.chic, "chic-pair": args.chic_pair}, args.docs,
               progress=sys.stderr.isatty(), jobs_per_seq=args.jobs)
    print((Path(args.out) / "chic_results.md").read_text(), end="")
    return 0 if res else 1


def _cmd_study(args: argparse.Namespace) -> int:
    from trainer.chic.study import CELLS, main

    cells = CELLS
    if args.cells is not None:
        names = [c.strip() for c in args.cells.split(",") if c.strip()]
        unknown = sorted(set(names) - {c[0] for c in CELLS})
        if unknown or not names:
            print(f"rlsched chic-study: --cells: unknown cell(s) {', '.join(unknown) or '(none named)'}; cells: "
                  f"{', '.join(c[0] for c in CELLS)}", file=sys.stderr)
            return 2
        cells = tuple(c for c in CELLS if c[0] in names)
    main(Path(args.out), args.iterations, args.seqs, args.retrain, args.docs, progress=sys.stderr.isatty(),
         cells=cells)
    print((Path(args.out) / "chic_study.md").read_text(), end="")
    return 0
