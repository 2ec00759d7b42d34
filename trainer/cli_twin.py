"""``rlsched twin``: the controller daemon's own rounds over a trace, in the simulator (a digital twin).

Example::

    rlsched twin --trace data/traces/deepshare/simulate/trace0.json --policy greedy --cluster 4x8 --out runs/twin0

Each policy runs in a real ``controller.daemon.Controller`` (journal, release and preemption protocols,
limits, logs) whose Slurm and node agents are the simulator (:mod:`trainer.twin`), with rounds at the
times ``rlsched simulate`` runs them. Writes what ``simulate`` writes (``jobs_<policy>.parquet``,
``summary.json``, the plots; :mod:`trainer.cli_sim`) plus the controller's state dir and log:
``controller/`` (one policy) or ``controller/<policy>/`` (several) with ``journal.json``,
``status.json`` and ``controller.log`` (JSON lines; ``ts``/``time`` are simulated epoch times from
2024-01-01 00:00 UTC, ``sim_time_s`` the trace's time). ``summary.json`` adds ``twin``: per policy what
the controller did (rounds, placements, preemptions, placement mismatches, ...) and the controller
settings it ran with. Like ``simulate``, everything is checked before anything runs, a user error is
one line and exit status 2, and ``--out`` appears complete or not at all. A controller round that
fails stops the run: one line, exit status 1.

During the run the controller's state dir is kept in ``/dev/shm`` when it exists (its journal is
written, and synced, at every release and preemption) and copied into ``--out`` at the end; its log
is written into ``--out``'s staging directory directly.
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import json
import os
import shutil
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

from policies.base import PolicyError
from rlsched.argtypes import float_at_least, non_negative_float
from trainer.cli_sim import (
    DEFAULT_TRACE,
    MIN_ROUND_S,
    OutputDirError,
    add_contention_argument,
    add_out_arguments,
    add_sampling_arguments,
    _check_out,
    _file_stem,
    parse_policy_list,
    print_results,
    resolve_trace,
    run_all,
    sim_config,
    staged_output,
    summary_doc,
    write_results,
)

__all__ = ["register", "run_twin"]

#: the controller's state dir and log inside --out
CONTROLLER_DIR = "controller"
LOG_FILE = "controller.log"
#: files the controller writes into its state dir (``requests/``: where ``controller preempt`` drops requests)
_STATE_FILES = ("journal.json", "status.json", LOG_FILE, "requests")


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``twin`` to the ``rlsched`` subcommands."""
    p = sub.add_parser(
        "twin",
        help="run the controller daemon's own rounds over a job trace in the simulator (digital twin)",
        description=(
            "Run the controller daemon (its rounds, journal, release and preemption protocols) over a job trace, "
            "with the simulator as its Slurm and node agents, at the round times of 'rlsched simulate'. Writes what "
            "simulate writes (jobs_<policy>.parquet, summary.json, plots) and the controller's journal, status and "
            "log into --out/controller/ (all or nothing). Controller settings: min_run_s is the policy's own "
            "min_run; max_placements_per_round the cluster's GPUs; requeue_settle_s 0; start_grace_s, "
            "preempt_timeout_s and the command and agent timeouts keep their defaults and never bind (a released "
            "job starts at once, a checkpoint takes no time); bandwidths are the cluster's; CS-triggered "
            "preemption is off. Not modelled: Slurm's scheduling delays and launch failures, node and agent "
            "failures, operators' requests."
        ),
    )
    p.add_argument("--trace", default=DEFAULT_TRACE,
                   help="job trace: DeepShare JSON, canonical CSV/Parquet or Philly CSV (default: %(default)s)")
    p.add_argument("--policy", default="greedy",
                   help="the controller's policy, or a comma-separated list run one after the other: fifo, sjf, sif, lrf, "
                        "srtf, lgtf, las, las2d, greedy (optionally -np and :pack|:nosplit|:spread|:greedy), rl-base / rl-hybrid (shipped "
                        "checkpoints) or rl-base:CHECKPOINT / rl-hybrid:CHECKPOINT (default: %(default)s)")
    p.add_argument("--cluster", default="4x8",
                   help="NODESxGPUS or a YAML/TOML cluster file; its node names are the Slurm node names "
                        "(default: %(default)s)")
    add_out_arguments(p, "twin")
    p.add_argument("--round", type=float_at_least(MIN_ROUND_S), default=300.0,
                   help=f"round length in seconds, >= {MIN_ROUND_S:g}: the controller's interval_s; rounds also "
                        "follow arrivals and completions, as in simulate (default: %(default)s)")
    p.add_argument("--no-event-trigger", action="store_true",
                   help="run rounds only every --round seconds, not also right after arrivals and completions")
    p.add_argument("--restart-overhead", type=non_negative_float, default=30.0,
                   help="seconds a requeued job needs to resume from its checkpoint, without progress "
                        "(default: %(default)s)")
    p.add_argument("--noise-cv", type=non_negative_float, default=0.0,
                   help="coefficient of variation of a per-job speed factor, 0 = off; the agents report the "
                        "jobs' noisy throughput (default: %(default)s)")
    add_sampling_arguments(p)
    p.add_argument("--slurm-split", choices=("plan", "fill"), default="plan",
                   help="how Slurm splits a released job's GPUs over its nodes: 'plan', as the controller planned "
                        "it (what simulate assumes; exact for balanced placements); 'fill', as cons_tres splits "
                        "a total (one GPU per node, the rest filled in node order), jobs that do not fit waiting "
                        "released (default: %(default)s)")
    add_contention_argument(p, "the simulated cluster's (the controller's own model keeps 'sum')")
    p.add_argument("--quiet", action="store_true", help="no progress bar and no table")
    p.set_defaults(func=run_twin)


def _not_twin_output(out: Path) -> str | None:
    """``None`` when directory ``out`` is empty or holds only what ``twin --out`` writes (``summary.json``
    with a ``twin`` key, ``jobs_*.parquet``, ``*.png``, and the ``controller`` folder); else the first
    thing that is not (named for the error)."""
    entries = sorted(out.iterdir())
    if not entries:
        return None
    for e in entries:
        if e.is_symlink():
            return repr(e.name)
        if e.name == CONTROLLER_DIR and e.is_dir():
            continue
        if not e.is_file() or not (e.name == "summary.json" or fnmatch.fnmatch(e.name, "jobs_*.parquet")
                                   or e.name.endswith(".png")):
            return repr(e.name)
    try:
        doc = json.loads((out / "summary.json").read_text())
        ok = isinstance(doc, dict) and {"policies", "files", "summaries", "twin"} <= doc.keys()
    except (OSError, ValueError):
        ok = False
    return None if ok else "no twin summary.json"


def _memory_dir() -> Path | None:
    """``/dev/shm`` when this process can write there (a tmpfs on Linux), else None."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK) else None


def run_twin(args: argparse.Namespace) -> int:
    from trainer.twin import TwinError

    try:
        return _run(args)
    except OutputDirError as exc:
        print(f"rlsched twin: error: {exc}", file=sys.stderr)
        return 2
    except TwinError as exc:
        print(f"rlsched twin: controller failed: {exc}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    from policies.cluster import ClusterSpec
    from policies.perf import ContentionModel
    from trainer import metrics
    from trainer.traces import load_trace
    from trainer.twin import Twin

    # 1. Validate everything before running anything.
    out = Path(os.path.normpath(args.out))
    _check_out(out, args.overwrite, command="twin", not_ours=_not_twin_output)
    cluster = ClusterSpec.parse(args.cluster)
    perf = ContentionModel(cluster, contention=args.contention)
    names = parse_policy_list(args.policy)
    stems = {n: _file_stem(n) for n in names}
    if len(set(stems.values())) != len(stems):
        raise PolicyError(f"policies {names} map to clashing file names {sorted(stems.values())}")
    trace_path = resolve_trace(args.trace)
    if args.overwrite and out.exists() and out.resolve() in trace_path.resolve().parents:
        raise OutputDirError(f"--trace {args.trace} is inside --out {out}, which --overwrite would delete; "
                             "move the trace or choose another --out")
    jobs = load_trace(trace_path, cluster, perf)
    cfg = sim_config(args)
    sub = {n: Path(CONTROLLER_DIR) if len(names) == 1 else Path(CONTROLLER_DIR) / stems[n] for n in names}

    with ExitStack() as stack:
        tmp = stack.enter_context(staged_output(out))
        # the controller's state dir during the run: in memory when possible (it syncs its journal at
        # every release and preemption), copied into --out afterwards
        mem = _memory_dir()
        work = Path(tempfile.mkdtemp(prefix="rlsched-twin-", dir=mem)) if mem is not None else tmp
        if work != tmp:
            stack.callback(shutil.rmtree, work, True)
        # (the log, which only grows, is written where it stays)
        twins = {n: Twin(cluster, jobs, n, work / sub[n], cfg, perf=perf, log_file=tmp / sub[n] / LOG_FILE,
                         split=args.slurm_split) for n in names}  # builds each policy, checks trace vs cluster

        # 2. Run, in memory.
        results, total_wall = run_all({n: twins[n].run for n in names}, len(jobs), args.quiet)
        summaries = {n: metrics.summarize(results[n], grid_step=args.round) for n in names}

        # 3. Write everything into the directory that replaces --out at the end of this block.
        if work != tmp:
            for n in names:
                shutil.copytree(work / sub[n], tmp / sub[n], dirs_exist_ok=True)
        subtitle = f"{trace_path.name}, {len(jobs)} jobs, cluster {cluster.describe()}"
        doc = summary_doc(args, trace_path, jobs, cluster, cfg, names, stems, total_wall, summaries)
        doc["twin"] = {
            "slurm_split": args.slurm_split,
            "epoch": next(iter(twins.values())).epoch,
            "controller_dirs": {n: str(sub[n]) for n in names},
            "controller": {n: results[n].meta["controller"] for n in names},
            "controller_settings": {n: dataclasses.asdict(twins[n].config.controller) | {"state_dir": str(sub[n])}
                                    for n in names},
        }
        write_results(tmp, results, summaries, doc, stems, subtitle)

    if not args.quiet:
        ctl = {n: results[n].meta["controller"] for n in names}
        rounds = sum(c["rounds"] for c in ctl.values())
        print_results(summaries, f"rlsched twin: {subtitle}",
                      f"Ran the controller with {len(names)} {'policy' if len(names) == 1 else 'policies'} "
                      f"({rounds} rounds) in {total_wall:.2f} s; wrote {out}/ (controller journal, status and log "
                      f"in {out / CONTROLLER_DIR}/)")
        for n, c in ctl.items():
            if c["placement_mismatches"] or c["held_back"] or c["rejected_placements"]:
                print(f"{n}: Slurm started {c['placement_mismatches']} job(s) on another split than planned, "
                      f"{c['held_back']} released job(s) were held back, the controller rejected "
                      f"{c['rejected_placements']} placement(s) (see {out / sub[n] / LOG_FILE})")
            elif c["inexact_splits"] and args.slurm_split == "plan":
                print(f"{n}: {c['inexact_splits']} placement(s) are unbalanced splits that Slurm's cons_tres may "
                      "split otherwise (--slurm-split fill shows the effect)")
        tw = next(iter(twins.values()))
        if not tw.same_node_order:
            print(f"note: the controller orders nodes by name ({', '.join(tw.controller_order[:6])}...), the cluster "
                  "file lists them in another order: policies that break ties by node break them differently "
                  "than simulate")
    return 0
