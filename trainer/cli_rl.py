"""``rlsched train`` and ``rlsched evaluate``: the RL command group.

``rlsched train --algo maskable-ppo --traces DIR --w1 0.4 --cluster 4x8 --seed S --out DIR``
trains a policy (see :mod:`trainer.train`); ``--resume`` continues ``OUT/last``.
``--export-shipped`` copies ``OUT/best`` into ``policies/checkpoints`` as the
``rl-base`` and ``rl-hybrid`` checkpoints of the cluster's shape.
``rlsched train --online JOURNAL --out DIR`` is DL2's online mode instead: it updates a DL2 checkpoint
from the experience the controller recorded while running ``dl2`` (:mod:`trainer.dl2.online`).

``rlsched evaluate --policies srtf,las,greedy,rl-base,rl-hybrid --traces DIR``
runs every policy on every trace and writes the tables and figures (see
:mod:`trainer.evaluate`; groups of elastic traces too, with ``--resize-overhead S``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from policies.checkpoint import MAX_AGING_S, MIN_AGING_S
from rlsched.argtypes import float_in_range
from rlsched.argtypes import positive_int as _positive_int
from rlsched.text import printable
from trainer.cli_sim import add_contention_argument, non_negative_float, positive_float, seed_int

__all__ = ["register"]

log = logging.getLogger(__name__)


def _arch(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return sizes


#: argparse type: a number in [0, 1]
_unit = float_in_range(0.0, 1.0)


def _fail(command: str, exc: BaseException) -> int:
    """One line on stderr and exit status 2, as ``rlsched.cli`` does for the shared user errors."""
    print(f"rlsched {command}: error: {printable(exc)}", file=sys.stderr)
    return 2


def register(sub: argparse._SubParsersAction) -> None:
    from policies.orders import AGING_S

    p = sub.add_parser("train", help="train an RL placement policy with Stable-Baselines3")
    p.add_argument(
        "--algo",
        choices=("maskable-ppo", "ppo", "a2c", "dqn"),
        default=None,
        help="RL algorithm (default maskable-ppo)",
    )
    p.add_argument(
        "--traces",
        action="append",
        default=None,
        help="training trace file or directory (searched recursively; repeatable; required for a new run)",
    )
    p.add_argument(
        "--val-traces",
        action="append",
        default=None,
        help="validation traces for best-model selection (repeatable; default: none, last = best)",
    )
    p.add_argument("--cluster", default=None, help="cluster: NODESxGPUS or YAML/TOML file (default 4x8)")
    p.add_argument(
        "--reward",
        choices=("jct-rel", "jct", "progress", "seed"),
        default=None,
        help="jct-rel (default: -jobs in system per round / the trace's greedy-np average JCT), "
        "jct (unscaled), progress (DL2), or the seed's -W1*CS+W2*Util (the default when --w1 is given)",
    )
    p.add_argument("--w1", type=_unit, default=None, help="W1 of the seed reward, W2 = 1 - W1 (default 0.4); "
                   "alone it selects --reward seed, with another --reward it is refused")
    p.add_argument(
        "--timesteps",
        type=_positive_int,
        default=None,
        help="environment steps in all (a resumed run counts its steps done), rounded up to whole rollouts "
        "(default 50000)",
    )
    p.add_argument("--n-envs", type=_positive_int, default=None, help="vectorised environments (default 2)")
    p.add_argument("--eval-freq", type=_positive_int, default=None, help="evaluate every N steps (default 5000)")
    p.add_argument("--net-arch", type=_arch, default=None, help="hidden layer sizes, e.g. 64,64 (default 64,64)")
    p.add_argument("--lr", type=positive_float, default=None, help="learning rate, > 0 (default 3e-4)")
    p.add_argument(
        "--ent-coef", type=non_negative_float, default=None, help="entropy bonus, >= 0 (PPO/A2C, default 0.01)"
    )
    p.add_argument(
        "--gamma", type=_unit, default=None, help="discount in [0, 1] (default 1.0; use 0.99 for progress / seed)"
    )
    p.add_argument("--seed", type=seed_int, default=None, help="random seed in [0, 2**32 - 1] (default 0)")
    p.add_argument(
        "--no-prior-init", action="store_true", help="start from SB3's random output layer instead of the action prior"
    )
    p.add_argument(
        "--prior-scale",
        type=positive_float,
        default=None,
        help="logit gap between consecutive actions of the prior init (default 1)",
    )
    p.add_argument(
        "--prior",
        choices=("admission", "bias"),
        default=None,
        help="admission: logits = network + the admission prior (policies/prior.py; maskable-ppo only, its default); "
        "bias: the network alone, output bias initialised to prefer lower actions (default for other algos)",
    )
    p.add_argument(
        "--prior-theta",
        type=_unit,
        default=None,
        help="admission prior: predicted normalised speed below which an option ranks after 'nothing' (default 0.8)",
    )
    p.add_argument(
        "--order",
        choices=("fill", "area", "plan"),
        default=None,
        help="candidate order: area = least aged remaining GPU-time first; fill = the same plus a tail rule "
        "that pairs a job of more than half the cluster with jobs filling its gap; plan = waves of a long queue of "
        "equal-length jobs packed node by node (policies/waves.py), fill otherwise (policies/orders.py; default plan, the shipped networks' order)",
    )
    p.add_argument(
        "--aging",
        type=float_in_range(MIN_AGING_S, MAX_AGING_S),
        default=None,
        metavar="SECONDS",
        help=f"aging time constant of the candidate order: a job's remaining GPU-time key is multiplied by "
        f"exp(-wait / SECONDS), {MIN_AGING_S:g} to {MAX_AGING_S:g} (default {AGING_S:g}; the shipped networks were trained with 1800 and run with "
        f"{AGING_S:g}, docs/RL.md)",
    )
    p.add_argument(
        "--init",
        metavar="CKPT",
        help="start from this checkpoint's weights (a training run's OUT/best or OUT/last, not a shipped one; same "
        "algorithm and observation shape) instead of the prior initialisation; the step count starts at 0 (a new "
        "run: not with --resume)",
    )
    p.add_argument(
        "--compat", default=None, metavar="MODE",
        help="train under a peer simulator's rules: 'deepshare' (4x8 cluster, its 7 node sets, no single-node "
             "placement, worst-pair contention floored at 0.35, all jobs at t = 0, 300 s rounds, free restarts; "
             "policies/compat.py): episodes, the jct-rel reference (greedy-np:ds) and validation run by them, the "
             "codec offers only its placements, and the checkpoint records the mode (training.compat)",
    )
    p.add_argument("--out", required=True, help="output directory (best.*, last.*, eval.csv, tb/)")
    again = p.add_mutually_exclusive_group()
    again.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in OUT from OUT/last: every option not given takes the run's own value (traces, "
        "cluster, reward, hyper-parameters, seed, --timesteps, ...); a given one that defines the run (algorithm, "
        "cluster, reward, prior, network, order, aging, seed, validation traces) must equal the run's",
    )
    again.add_argument(
        "--overwrite", action="store_true", help="start over in an OUT that holds a run (deletes its checkpoints)"
    )
    p.add_argument(
        "--export-shipped", action="store_true", help="also copy OUT/best to policies/checkpoints as rl-base/rl-hybrid"
    )
    from trainer.dl2.online import add_arguments as add_online_arguments

    add_online_arguments(p)  # --online: DL2's updates from the controller's experience (trainer/dl2/online.py)
    p.set_defaults(func=_cmd_train)

    e = sub.add_parser("evaluate", help="evaluate policies over trace sets; tables, figures, docs/RESULTS.md")
    e.add_argument(
        "--policies",
        default="srtf,srtf:spread,las,las:spread,greedy,rl-prior,rl-base,rl-hybrid",
        help="comma-separated policy names, each optionally ALIAS=NAME and each (shown name) once; an '=' after "
        "':' or '/' belongs to the name (rl-base:sweep/lr=1e-4/best) (default: %(default)s)",
    )
    e.add_argument(
        "--traces",
        required=True,
        help="directory of trace sets: one sub-directory per mix (normal/, heavy/, ...) or trace files; a group of "
        "elastic traces (rlsched trace gen-elastic --seeds N --out DIR/GROUP) runs with the elastic policies "
        "(docs/ELASTIC.md); a group may not mix the two kinds",
    )
    e.add_argument("--cluster", default="4x8", help="cluster (default 4x8)")
    add_contention_argument(e)
    e.add_argument(
        "--branches",
        default=None,
        help="directory with the branch runs branch-A..branch-E (their last.json) or A.json..E.json, "
        "for the avg-JCT-vs-utilisation figure; each trained with --reward seed and --w1 0.3/0.4/0.5/0.6/0.7 for A..E",
    )
    e.add_argument(
        "--out",
        required=True,
        help="where the outputs go: OUT/rl_results.json and the rl_* figures in OUT/figures/ (replaced as a set; "
        "the repository's are in docs); the tables are also printed",
    )
    e.add_argument(
        "--results-md", default=None, help="write the Markdown results section to this file (e.g. docs/RESULTS.md)"
    )
    e.add_argument(
        "--figure-groups",
        default="all",
        help="comma-separated trace groups that get the JCT CDF, CS distribution and utilisation KDE figures, "
        "or 'all' (default: all, every group of --traces, e.g. the ones scripts/rl_traces.sh writes)",
    )
    from trainer.cli_sim import add_compat_arg, add_resize_overhead_arg

    add_compat_arg(e)
    add_resize_overhead_arg(e, "the restart pause, 30 s")
    e.set_defaults(func=_cmd_evaluate)

    c = sub.add_parser(
        "checkpoint",
        help="check a policy checkpoint and show what it holds (never unpickles; exit 2 if unusable)",
        description="Load a checkpoint as the simulator and the controller would (metadata, sha256 of the "
        "weights, layer shapes, finite values; nothing is unpickled) and show its format, observation spec, "
        "network, reward and training provenance. With --cluster, also check that it runs on that cluster.",
    )
    c.add_argument(
        "checkpoint",
        metavar="CKPT",
        help="a checkpoint of any learned family (PATH.json, PATH.safetensors or PATH without suffix), or a "
        "learned policy's name (rl-base, rl-hybrid, rl-sf, rl-base-4x8, rl-hybrid-4x8, sced2, chic, chic-pair, "
        "dl2, optionally NAME:/path) for the checkpoint that name runs with (policies.registry.checkpoint_path)",
    )
    c.add_argument("--cluster", default=None, help="check that it fits this cluster (NODESxGPUS or a file)")
    c.add_argument("--json", action="store_true", help="print the summary as JSON")
    c.set_defaults(func=_cmd_checkpoint)


def _log_progress() -> None:
    """Let the trainer's INFO lines (evaluations, resumes, reference JCTs) through without ``-v``, as on
    a terminal so in logs and pipes; ``-vv`` (DEBUG) stays as it is."""
    lg = logging.getLogger("trainer")
    if lg.getEffectiveLevel() > logging.INFO:
        lg.setLevel(logging.INFO)


def _cmd_train(args: argparse.Namespace) -> int:
    from policies.prior import PriorError
    from trainer.train import TrainConfigError, TrainingDiverged

    if args.online is not None:
        from trainer.dl2.online import run_cli

        return run_cli(args)

    _log_progress()
    try:
        return _train(args)
    except (TrainConfigError, PriorError) as exc:
        return _fail("train", exc)
    except TrainingDiverged as exc:  # not the user's input: exit 1, one line
        print(f"rlsched train: error: {exc}", file=sys.stderr)
        return 1


#: ``rlsched train`` option (argparse dest) -> the :class:`~trainer.train.TrainConfig` field it sets. Each
#: defaults to ``None`` on the command line: a new run takes TrainConfig's default, a resumed run its own
#: value (its ``last`` checkpoint's ``training.config``)
_RUN_OPTIONS = {
    "algo": "algo", "cluster": "cluster", "reward": "reward", "w1": "w1", "timesteps": "timesteps",
    "n_envs": "n_envs", "eval_freq": "eval_freq", "net_arch": "net_arch", "lr": "learning_rate",
    "ent_coef": "ent_coef", "gamma": "gamma", "seed": "seed", "prior_scale": "prior_scale", "prior": "prior",
    "prior_theta": "prior_theta", "order": "order", "aging": "aging_s", "traces": "traces",
    "val_traces": "val_traces", "compat": "compat",
}


def _run_config(out: Path) -> dict[str, Any]:
    """The ``training.config`` of the run in ``out`` (its ``last.json``), ``{}`` if there is none to read
    (``check_run`` then says why the run cannot be resumed)."""
    try:
        cfg = json.loads((out / "last.json").read_text())["training"]["config"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return cfg if isinstance(cfg, dict) else {}


def _resolve_options(args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
    """TrainConfig fields from the options given, else (``--resume``) the run's own values, else the defaults;
    and the options taken from the run (for the log)."""
    from trainer.train import TrainConfig, TrainConfigError

    defaults = TrainConfig()
    run = _run_config(Path(args.out)) if args.resume else {}
    values: dict[str, Any] = {}
    from_run: list[str] = []
    for dest, fld in _RUN_OPTIONS.items():
        given = getattr(args, dest)
        if given is not None:
            # trace directories are recorded absolute, so that --resume from another directory finds them
            if fld in ("traces", "val_traces"):
                values[fld] = [os.path.abspath(d) for d in given]
            elif fld == "cluster" and os.path.isfile(given):  # a cluster file, not NODESxGPUS
                values[fld] = os.path.abspath(given)
            else:
                values[fld] = given
        elif fld in run and (run[fld] is not None or fld == "prior"):
            v = run[fld]
            values[fld] = tuple(v) if fld == "net_arch" and isinstance(v, list) else v
            from_run.append("--" + dest.replace("_", "-"))
        else:
            values[fld] = getattr(defaults, fld)
    # --no-prior-init only shapes a new network: a resumed run records its own setting
    values["prior_init"] = bool(run["prior_init"]) if args.resume and "prior_init" in run and not args.no_prior_init \
        else not args.no_prior_init
    if not values["traces"]:
        raise TrainConfigError("--traces is required (a resumed run takes its own when its last.json names them)")
    if args.w1 is not None and args.reward is None and "--reward" not in from_run:
        values["reward"] = "seed"  # --w1 alone asks for the seed reward (the command line)
    if args.w1 is not None and values["reward"] != "seed":
        raise TrainConfigError(f"--w1 weighs the seed reward only; this run's reward is {values['reward']} "
                               "(pass --reward seed, or drop --w1)")
    return values, from_run


def _train(args: argparse.Namespace) -> int:
    from trainer.env import load_trace_dir
    from trainer.train import TrainConfig, check_run, train

    values, from_run = _resolve_options(args)
    if from_run:
        log.info("--resume: %s taken from the run", ", ".join(from_run))
    cfg = TrainConfig(**values, init=os.path.abspath(args.init) if args.init else None)
    # options, --out, --init and the run to resume, before the traces are even read (train() checks again)
    cluster = check_run(cfg, args.out, resume=args.resume, overwrite=args.overwrite).cluster
    train_sets = [t for d in cfg.traces for t in load_trace_dir(d, cluster)]
    val_sets = [t for d in cfg.val_traces for t in load_trace_dir(d, cluster)]
    with train_progress() as (update, episode):
        summary = train(
            cfg, train_sets, val_sets, args.out, resume=args.resume, overwrite=args.overwrite, progress=update,
            episodes=episode,
        )
    if args.export_shipped:
        from trainer.train import ship_checkpoint

        # the command lines are in the checkpoint already (training.commands, every option written out)
        # paths relative to the directory the run's files share (its --out, traces and --init), so the
        # shipped files name no directory of this machine (training.recipe says how to train them again)
        used = [os.path.abspath(args.out), *cfg.traces, *cfg.val_traces, *([cfg.init] if cfg.init else [])]
        base = os.path.commonpath(used)
        for path in ship_checkpoint(Path(args.out) / "best", cluster, relative_to=base if base != os.sep else None):
            print(f"shipped {path}")
    print(json.dumps({k: v for k, v in summary.items() if k != "evals"}, indent=2, default=str))
    return 0


@contextlib.contextmanager
def _progress_bar(what: str, unit: str) -> Iterator[Callable[[int, int], None]]:
    """A rich progress bar on stderr, shown on a terminal only (logs and pipes keep their log lines);
    yields ``update(done, total)``."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    err = Console(stderr=True)
    with Progress(
        TextColumn(f"[bold]{what}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(unit),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    ) as bar:
        task = bar.add_task(what, total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


#: Lines :func:`train_progress` writes to a log or pipe over a run (one per this share of the steps).
PROGRESS_LINES = 20


@contextlib.contextmanager
def train_progress(console: Any = None) -> Iterator[tuple[Callable[[int, int], None], Callable[[int, float], None]]]:
    """``rlsched train``'s progress: yields ``(update(steps done, steps in all), episode(episodes, return))``
    for :func:`trainer.train.train`'s ``progress`` and ``episodes``.

    On a terminal: a rich bar on stderr with steps done / in all, episodes finished, the last episode's
    return, elapsed time and the time left (rich's estimate from the recent rate). In a log or pipe: one
    INFO log line (as the evaluations' lines, shown without ``-v``) per 1/:data:`PROGRESS_LINES` of the
    steps with the same fields, so a long run is never silent between evaluations. ``console``: the
    terminal of the bar (default: stderr's)."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    err = console or Console(stderr=True)
    state = {"episodes": 0, "reward": None, "t0": time.monotonic(), "next": 0.0}

    def reward_text() -> str:
        return "-" if state["reward"] is None else f"{state['reward']:.4g}"

    def episode(n: int, ret: float) -> None:
        state["episodes"], state["reward"] = n, ret

    if err.is_terminal:
        with Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("steps, {task.fields[episodes]} episodes, last reward {task.fields[reward]}"),
            TimeElapsedColumn(),
            TextColumn("left"),
            TimeRemainingColumn(),
            console=err,
            transient=True,
        ) as bar:
            task = bar.add_task("train", total=None, episodes=0, reward="-")

            def update(done: int, total: int) -> None:
                bar.update(task, completed=done, total=total, episodes=state["episodes"], reward=reward_text())

            yield update, episode
        return

    first: list[float] = []

    def update_log(done: int, total: int) -> None:
        now = time.monotonic()
        if not first:  # the first report: steps and time the rate is measured from
            first.extend((done, now))
            state["next"] = done + max(1, total // PROGRESS_LINES)
            return
        if (done < state["next"] and done < total) or done == state.get("shown"):
            return
        state["shown"] = done
        while state["next"] <= done:
            state["next"] += max(1, total // PROGRESS_LINES)
        elapsed = now - state["t0"]
        rate = (done - first[0]) / (now - first[1]) if now > first[1] else 0.0
        left = f"{(total - done) / rate / 60:.1f} min left" if rate > 0 and done < total else "done"
        log.info("train: %s/%s steps (%.0f%%), %s episodes, last reward %s, %.1f min, %s", f"{done:,}", f"{total:,}",
                 100 * done / max(total, 1), f"{state['episodes']:,}", reward_text(), elapsed / 60, left)

    yield update_log, episode


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from trainer.evaluate import EvaluationError, print_tables, run_evaluation

    # empty entries are kept: run_evaluation refuses them (and repeated names), naming the entry
    policies = [p.strip() for p in args.policies.split(",")]
    if not any(policies):
        return _fail("evaluate", f"--policies {args.policies!r} names no policy; expected e.g. srtf,las,rl-base")
    _log_progress()
    try:
        with _progress_bar("evaluate", "policy x job set runs") as update:
            results = run_evaluation(
                policies=policies,
                traces=args.traces,
                cluster=args.cluster,
                contention=args.contention,
                out=args.out,
                branches=args.branches,
                results_md=args.results_md,
                figure_groups=None if args.figure_groups.strip() == "all"
                else [g.strip() for g in args.figure_groups.split(",") if g.strip()],
                progress=update,
                compat=args.compat,
                resize_overhead=args.resize_overhead,
            )
    except EvaluationError as exc:
        return _fail("evaluate", exc)
    from policies.cluster import ClusterSpec

    print_tables(results, ClusterSpec.parse(args.cluster).describe())
    print(f"written: {os.path.join(args.out, 'rl_results.json')}, figures in {os.path.join(args.out, 'figures')}"
          + (f", tables in {args.results_md}" if args.results_md else " (--results-md FILE: the tables as Markdown)"))
    return 0


#: shown for a free-form ``training`` metadata field of an unexpected type
MALFORMED = "(malformed)"


def _field(value: Any, ok: Callable[[Any], bool]) -> Any:
    """``value`` if it is absent (``None``) or passes ``ok``, else :data:`MALFORMED`."""
    return value if value is None or ok(value) else MALFORMED


def _is_str_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _is_source(v: Any) -> bool:
    return isinstance(v, dict) and isinstance(v.get("commit"), str) and isinstance(v.get("dirty", False), bool)


def _finite(v: object) -> float | None:
    """``v`` as a finite float if it is a number (not a bool) that is one, else ``None`` (a hand-edited
    file may hold an integer beyond float range)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def checkpoint_summary(ck) -> dict:
    """What :func:`_cmd_checkpoint` shows of a loaded :class:`~policies.checkpoint.Checkpoint`."""
    meta = ck.meta
    # "training" is free-form provenance (load_checkpoint only requires an object): type-check what is shown
    tr = meta.get("training")
    tr = tr if isinstance(tr, dict) else {}
    cfg = tr.get("config")
    cfg_ok = cfg is None or isinstance(cfg, dict)
    cfg = cfg if isinstance(cfg, dict) else {}
    prior = ck.prior
    # the aging the network was trained with, when the file records another one to run with (re-shipped)
    ta = _finite(cfg.get("aging_s"))
    trained_aging = ta if ta is not None and ta != ck.spec.aging_s else None
    return {
        "checkpoint": str(ck.json_path),
        "weights": str(ck.weights_path),
        "weights_sha256": meta.get("weights_sha256"),
        "project_version": meta.get("project_version"),
        "algo": meta.get("algo"),
        "mode": meta.get("mode"),
        "cluster": ck.cluster.describe(),
        "observation": {
            "codec": ck.codec_name,
            "shape": list(ck.spec.shape),
            "actions": ck.spec.n_actions,
            "candidates": ck.spec.k,
            "options": ck.spec.options,
            "order": ck.spec.order,
            "aging_s": ck.spec.aging_s,
            "trained_aging_s": trained_aging,
            "encoding_version": ck.spec.version,
        },
        "network": {
            "layers": [[int(W.shape[0]), int(W.shape[1])] for W, _b in ck.net.layers],
            "parameters": int(sum(W.size + b.size for W, b in ck.net.layers)),
            "activation": ck.net.activation,
            "prior": prior.to_dict() if prior is not None else None,
        },
        "reward": meta.get("reward"),
        "training": {
            "timesteps": _field(tr.get("timesteps"), lambda v: isinstance(v, int) and not isinstance(v, bool)),
            "val_rel_jct": _field(
                tr.get("val_rel_jct"), lambda v: _finite(v) is not None
            ),
            "traces": _field(cfg.get("traces"), _is_str_list) if cfg_ok else MALFORMED,
            "init": _field(cfg.get("init"), lambda v: isinstance(v, str)) if cfg_ok else MALFORMED,
            "commands": _commands(tr),
            "source": _field(tr.get("source"), _is_source),
            "traces_sha256": _field(tr.get("traces_sha256"), lambda v: isinstance(v, str)),
            "val_traces_sha256": _field(tr.get("val_traces_sha256"), lambda v: isinstance(v, str)),
            "recipe": _field(tr.get("recipe"), lambda v: isinstance(v, dict) and isinstance(v.get("command"), str)),
        },
    }


def _commands(tr: dict) -> list[str] | str | None:
    """The command lines of a checkpoint's training segments, first first (``training.commands``; a
    checkpoint without them has one ``training.command``, as typed); :data:`MALFORMED` if unreadable."""
    got = tr.get("commands")
    if got is None:
        legacy = tr.get("command")
        return None if legacy is None else [legacy] if isinstance(legacy, str) else MALFORMED
    ok = isinstance(got, list) and all(isinstance(c, dict) and isinstance(c.get("command"), str) for c in got)
    return [c["command"] for c in got] if ok else MALFORMED


#: checkpoint format (the JSON's ``format``) -> (module, loader, label) of the families other than the
#: fixed-shape ``rlsched-policy`` one (:func:`policies.checkpoint.load_checkpoint`)
_FAMILIES = {
    "rlsched-sizefree": ("policies.sizefree", "load_sizefree", "size-free"),
    "rlsched-sced2": ("policies.sced2", "load_sced2", "sced2"),
    "rlsched-chic": ("policies.chic", "load_chic_checkpoint", "chic"),
    "rlsched-dl2": ("policies.dl2", "load_dl2", "dl2"),
}


def _json_format(jpath: Path) -> Any:
    """The ``format`` field of the checkpoint JSON ``jpath``; ``None`` when unreadable (the loader then
    names the problem)."""
    try:
        with jpath.open("rb") as f:
            meta = json.loads(f.read(1 << 20).decode("utf-8"))
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return None
    return meta.get("format") if isinstance(meta, dict) else None


def family_summary(path: Path, cluster=None) -> dict:
    """What :func:`_cmd_checkpoint` shows of a size-free, SCED2, Chic or DL2 checkpoint (``path``: its JSON):
    the family's loader checks it (format, hash, tensor names and shapes, finite values; never unpickles),
    then its fields and tensor shapes are listed. With ``cluster``, the policy is built on that cluster
    (``fits_cluster``), which refuses one it cannot run on.

    :raises PolicyError: an unknown format or an unusable checkpoint (one line)."""
    import importlib

    from policies.base import PolicyError
    from policies.checkpoint import read_policy_files

    fmt = _json_format(path)
    if fmt not in _FAMILIES:
        raise PolicyError(f"{path}: unknown checkpoint format {fmt!r}; known: rlsched-policy, {', '.join(_FAMILIES)}")
    module, loader, label = _FAMILIES[fmt]
    got = getattr(importlib.import_module(module), loader)(path)
    meta = got.meta if hasattr(got, "meta") else got[1]
    meta, tensors, jpath, wpath = read_policy_files(path, fmt=fmt, version=meta.get("format_version"), label=label)
    policy = meta.get("variant") if fmt == "rlsched-chic" else meta.get("policy") if fmt != "rlsched-dl2" else "dl2"
    training = meta.get("training") if isinstance(meta.get("training"), dict) else {}
    info = {
        "checkpoint": str(jpath),
        "weights": str(wpath),
        "format": fmt,
        "policy": policy,
        "codec": meta.get("codec"),
        "observation": meta.get("obs_spec", meta.get("spec")),
        "network": meta.get("network"),
        "tensors": {k: list(v.shape) for k, v in sorted(tensors.items())},
        "parameters": int(sum(v.size for v in tensors.values())),
        "reward": meta.get("reward"),
        "training": {k: v for k, v in training.items() if k != "history"},
        "weights_sha256": meta.get("weights_sha256"),
        "project_version": meta.get("project_version"),
    }
    if cluster is not None and fmt != "rlsched-dl2":  # DL2 decides per job, on no cluster shape
        from policies.registry import make_policy

        make_policy(f"{'rl-sf' if fmt == 'rlsched-sizefree' else policy}:{jpath}", cluster)
        info["fits_cluster"] = cluster.describe()
    return info


def _show_family(info: dict) -> None:
    """The table of :func:`family_summary` (file text escaped, no rich markup)."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    def compact(v: Any) -> str:
        return "(not recorded)" if v is None else json.dumps(v, separators=(", ", ": "), default=str)

    tr = info["training"]
    rows = [
        ("format", info["format"]),
        ("policy", str(info["policy"])),
        ("codec", str(info["codec"] or "-")),
        ("observation", compact(info["observation"])),
        ("network", f"{compact(info['network'])} ({info['parameters']:,} parameters)"),
        ("tensors", ", ".join(f"{k} {v}" for k, v in info["tensors"].items())),
        ("reward", compact(info["reward"])),
        ("training", compact({k: v for k, v in tr.items() if k not in ("command", "config")})
         if tr else "(not recorded)"),
        ("config", compact(tr.get("config"))),
        ("command", str(tr.get("command") or "(not recorded)")),
        ("weights sha256", f"{info['weights_sha256']} (verified)"),
        ("rlsched version", str(info["project_version"])),
    ]
    if "fits_cluster" in info:
        rows.insert(2, ("cluster", f"runs on {info['fits_cluster']}"))
    if "name" in info:
        rows.insert(1, ("name", f"{info['name']} runs with this checkpoint"))
    t = Table(title=Text(f"{info.get('name', info['policy'])} checkpoint: {printable(info['checkpoint'])}"),
              show_header=False,
              title_justify="left")
    t.add_column("field", style="bold")
    t.add_column("value", overflow="fold")
    for k, v in rows:
        t.add_row(k, Text("\n".join(printable(line) for line in str(v).split("\n"))))
    Console(width=max(100, Console().width)).print(t)


def _cmd_checkpoint(args: argparse.Namespace) -> int:
    from policies.checkpoint import FORMAT, load_checkpoint, resolve_paths
    from policies.cluster import ClusterSpec
    from policies.registry import LEARNED_NAMES, checkpoint_path

    cluster = ClusterSpec.parse(args.cluster) if args.cluster else None
    name = args.checkpoint
    base = name.partition(":")[0].strip().lower()
    named = base in LEARNED_NAMES or re.fullmatch(r"rl-(base|hybrid)-\d+x\d+", base) is not None
    path = checkpoint_path(name, cluster) if named else resolve_paths(name)[0]
    if _json_format(path) not in (None, FORMAT):
        info = family_summary(path, cluster)
        if named:
            info["name"] = name
        if args.json:
            print(json.dumps(info, indent=2, default=str))
        else:
            _show_family(info)
        return 0
    ck = load_checkpoint(path)
    if cluster is not None:
        ck.check_cluster(cluster)
    info = checkpoint_summary(ck)
    if cluster is not None:
        info["fits_cluster"] = cluster.describe()
    if args.json:
        print(json.dumps(info, indent=2, default=str))
        return 0
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from rlsched.text import printable

    t = Table(title=Text(f"{info['mode']} checkpoint: {printable(info['checkpoint'])}"), show_header=False,
              title_justify="left")
    t.add_column("field", style="bold")
    t.add_column("value", overflow="fold")
    ob, net, trn = info["observation"], info["network"], info["training"]
    rew = info["reward"] or {}
    src = trn["source"]
    if src is None:
        code = "(not recorded)"
    elif src == MALFORMED:
        code = MALFORMED
    else:
        code = f"{src['commit']}{' (uncommitted changes)' if src.get('dirty') else ''}"
    steps = trn["timesteps"]
    trained = "(not recorded)" if steps is None else MALFORMED if steps == MALFORMED else f"{steps} steps"
    if isinstance(trn["val_rel_jct"], (int, float)):
        trained += f", validation {trn['val_rel_jct']:.4f} x greedy-np"
    traces = trn["traces"]
    rows = [
        ("algorithm", str(info["algo"])),
        ("cluster", info["cluster"] + (f" (fits {info['fits_cluster']})" if cluster is not None else "")),
        ("observation", (f"{ob['shape']}, {ob['actions']} actions ({ob['candidates']} candidates x {ob['options']} "
                         f"options + nothing), order {ob['order']} (aging {ob['aging_s']:g} s"
                         + (f"; trained with {ob['trained_aging_s']:g} s" if ob["trained_aging_s"] is not None else "")
                         + f"), codec {ob['codec']} v{ob['encoding_version']}")),
        ("network", (f"{' -> '.join(str(a) for a, _b in net['layers'])} -> {net['layers'][-1][1]} "
                     f"({net['activation']}, {net['parameters']:,} parameters)")),
        ("admission prior", json.dumps(net["prior"]) if net["prior"] else "none"),
        ("reward", f"{rew.get('kind')}" + (f" (W1 {rew.get('w1')}, W2 {rew.get('w2')})" if rew.get("kind") == "seed" else "")),
        ("trained", trained),
        ("initialised from", str(trn["init"] or "the prior")),
        ("training traces", traces if traces == MALFORMED else ", ".join(traces or []) or "-"),
        ("commands", trn["commands"] if trn["commands"] == MALFORMED
         else "\n".join(printable(c) for c in trn["commands"] or []) or "(not recorded)"),
        ("code", code),
        ("recipe", "(not recorded)" if trn["recipe"] is None else MALFORMED if trn["recipe"] == MALFORMED
         else trn["recipe"]["command"] + (f" (paths {trn['recipe']['paths']})" if isinstance(
             trn["recipe"].get("paths"), str) else "")),
        ("traces sha256", trn["traces_sha256"] or "(not recorded)"),
        ("weights sha256", f"{info['weights_sha256']} (verified)"),
        ("rlsched version", str(info["project_version"])),
    ]
    for k, v in rows:  # file text: escaped (rlsched.text.printable), shown as plain Text (no rich markup)
        t.add_row(k, Text("\n".join(printable(line) for line in str(v).split("\n"))))
    Console(width=max(100, Console().width)).print(t)
    return 0
