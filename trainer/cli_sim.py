"""``rlsched simulate``: run policies over a trace in the simulator and compare them.

Example::

    rlsched simulate --trace data/traces/deepshare/simulate/trace0.json \\
        --policy fifo,srtf,las,greedy --cluster 4x8 --out runs/sim0

Everything is validated before any simulation runs (policy names, cluster,
trace, output directory); a user error prints one line and exits 2. All runs
happen in memory; the outputs are then written into a temporary directory
next to ``--out`` and renamed into place, so ``--out`` either appears
complete or not at all. Written files:

* ``jobs_<policy>.parquet``: per-job records (:func:`trainer.metrics.jobs_table`);
* ``summary.json``: every policy's metrics (:func:`trainer.metrics.summarize`),
  the simulator config, the trace path and the cluster; with ``--compat deepshare``
  (:mod:`policies.compat`) also the seed's metric, JCT without queueing (``avg_run_jct_s``,
  ``avg_run_jct_rounds_s``), which is printed beside ours;
* ``jct_cdf.png``, ``util_timeline.png``, ``util_kde.png``,
  ``cs_distribution.png`` (:mod:`trainer.report`).

``--out`` must not exist or be an empty directory, unless ``--overwrite`` and it holds only an
earlier ``simulate`` output (never another directory's files).
``--trace`` defaults to the repository's DeepShare evaluation trace
(``data/traces/deepshare/simulate/trace0.json``, found from any directory).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import fnmatch
import json
import math
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from policies.base import Policy, PolicyError
from rlsched.argtypes import float_at_least, non_negative_float, positive_float
from rlsched.text import printable
from trainer.outputs import unwritable

__all__ = [
    "register",
    "run_simulate",
    "build_policy",
    "OutputDirError",
    "seed_int",
    "positive_float",
    "non_negative_float",
]

DEFAULT_TRACE = "data/traces/deepshare/simulate/trace0.json"
DEFAULT_POLICIES = "fifo,srtf,las,greedy"


class OutputDirError(ValueError):
    """``--out`` cannot be used (exists and is not empty, or is a file)."""


#: Shortest ``--round`` (s). The run keeps one utilisation sample per round over the whole makespan
#: (``summary.json``'s ``util_samples``) and an RL policy is asked every round, so both grow as
#: makespan / round: 0.0001 s would take 19 GB for a 4-hour trace. Trace times and the costs that matter are
#: seconds or more (restart overhead 30 s, the controller's interval 5 s, jobs of minutes to hours).
MIN_ROUND_S = 1.0

#: seeds go to numpy's legacy seeding too (Stable-Baselines3), which takes 32-bit values
MAX_SEED = 2**32 - 1


def seed_int(text: str) -> int:
    """argparse type of ``--seed``: an integer in [0, 2**32 - 1] (shared by ``simulate`` and ``train``)."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 0 <= v <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"must be an integer in [0, 2**32 - 1], got {text!r}")
    return v


def add_contention_argument(p: argparse.ArgumentParser, what: str = "the simulator's") -> None:
    """``--contention``: the contention rule of the performance model (shared by ``simulate``, ``twin``
    and ``evaluate``; rules in ``docs/PERFORMANCE_MODEL.md``, section 2)."""
    from policies.ledger import CONTENTION_RULES

    p.add_argument("--contention", choices=CONTENTION_RULES, default="sum",
                   help=f"{what} rule for several jobs sharing a node's link: 'sum' of the pairwise slowdowns "
                        "(capped at 10x), 'link' (max-min sharing of the link's capacity, no cap) or 'ds-min' "
                        "(DeepShare's: the worst pair, at most 1/0.35x) (default: %(default)s)")


def add_out_arguments(p: argparse.ArgumentParser, command: str) -> None:
    """``--out`` and ``--overwrite`` (shared by ``simulate`` and ``twin``; ``command`` names the outputs
    ``--overwrite`` may replace)."""
    p.add_argument("--out", required=True, help="output directory (must not exist or be empty, see --overwrite)")
    p.add_argument("--overwrite", action="store_true", help=f"replace --out if it holds an earlier {command} output "
                   "(anything else in it is refused, never deleted)")


def add_sampling_arguments(p: argparse.ArgumentParser) -> None:
    """``--seed`` (of the speed noise) and ``--metrics-interval`` (shared by ``simulate`` and ``twin``)."""
    p.add_argument("--seed", type=seed_int, default=0, help="seed of the speed noise, in [0, 2**32 - 1] (default: %(default)s)")
    p.add_argument("--metrics-interval", type=positive_float, default=None,
                   help="minimum seconds between fragmentation/CS samples (default: the round length)")


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``simulate`` to the ``rlsched`` subcommands."""
    from policies.registry import describe_names

    p = sub.add_parser(
        "simulate",
        help="run scheduling policies over a job trace in the simulator and compare them",
        description=(
            "Run scheduling policies over a job trace in the event-driven simulator and compare them. "
            "Writes jobs_<policy>.parquet, summary.json and PNG plots into --out (all or nothing)."
        ),
    )
    p.add_argument(
        "--trace",
        default=DEFAULT_TRACE,
        help="job trace: DeepShare JSON, canonical CSV/Parquet, Philly CSV or an elastic trace (docs/ELASTIC.md) (default: %(default)s)",
    )
    p.add_argument(
        "--policy",
        default=DEFAULT_POLICIES,
        help=f"comma-separated policies: {describe_names()}; docs/RESULTS.md, ELASTIC.md, SCED2.md (default: %(default)s)",
    )
    p.add_argument("--cluster", default="4x8", help="NODESxGPUS or a YAML/TOML cluster file (default: %(default)s)")
    add_out_arguments(p, "simulate")
    p.add_argument(
        "--round",
        type=float_at_least(MIN_ROUND_S),
        default=300.0,
        help=f"scheduling round length in seconds, >= {MIN_ROUND_S:g} (default: %(default)s)",
    )
    p.add_argument(
        "--no-event-trigger",
        action="store_true",
        help="schedule only at round boundaries, not also right after arrivals and completions",
    )
    p.add_argument("--restart-overhead", type=non_negative_float, default=30.0, help="seconds without progress each time a preempted job restarts (default: %(default)s)")
    add_resize_overhead_arg(p, "--restart-overhead")
    p.add_argument("--noise-cv", type=non_negative_float, default=0.0, help="coefficient of variation of a per-job speed factor, 0 = off (default: %(default)s)")
    add_sampling_arguments(p)
    add_compat_arg(p)
    add_contention_argument(p)
    p.add_argument("--quiet", action="store_true", help="no progress bar and no table")
    p.set_defaults(func=run_simulate)


def add_resize_overhead_arg(p: argparse.ArgumentParser, default: str) -> None:
    """``--resize-overhead S`` (``rlsched simulate`` and ``evaluate``): the pause of an elastic job after a
    resize (:attr:`trainer.simulator.SimConfig.resize_overhead`); ``default`` names what ``None`` means."""
    p.add_argument("--resize-overhead", type=non_negative_float, default=None, help="seconds without progress "
                   "after an elastic job is resized: a checkpoint-restart takes tens of seconds, DL2's hot scaling "
                   f"0.05 (default: {default})")


def add_compat_arg(p: argparse.ArgumentParser) -> None:
    """``--compat MODE`` (shared by ``simulate`` and ``evaluate``)."""
    p.add_argument(
        "--compat", default=None, metavar="MODE",
        help="run under a peer simulator's rules: 'deepshare' (4x8 cluster, its 7 node sets, no single-node "
             "placement, worst-pair contention floored at 0.35, all jobs at t = 0, 300 s rounds, free restarts; "
             "reports its run-only JCT beside ours; policies ds-las, ds-srtf, ORDER:ds, rl-base, rl-hybrid); "
             "overrides --round, --restart-overhead, --contention and the event trigger",
    )


def compat_setup(args: argparse.Namespace, cluster):
    """``(mode, perf)`` for ``--compat`` (``(None, None)`` without it): the mode (:func:`policies.compat.compat_mode`)
    and the performance model with its contention rule (which replaces ``--contention``).
    :class:`~policies.compat.CompatError` (one line) for an unknown mode or a cluster the mode does not allow."""
    name = getattr(args, "compat", None)
    if name is None:
        return None, None
    from policies.compat import compat_mode
    from policies.perf import ContentionModel

    mode = compat_mode(name)
    mode.check_cluster(cluster)
    return mode, ContentionModel(cluster, contention=mode.contention)


def compat_policy(policy: Policy, mode) -> Policy:
    """``policy`` for compat ``mode`` (:func:`policies.compat.adapt_policy`); as it is without a mode."""
    from policies.compat import adapt_policy

    return adapt_policy(policy, mode)


# ---------------------------------------------------------------------- validation
def parse_policy_list(text: str) -> list[str]:
    """Split ``"fifo, srtf"`` into names; rejects empty and repeated names."""
    names = [s.strip() for s in text.split(",")]
    if not text.strip() or any(not n for n in names):
        raise PolicyError(f"bad --policy {text!r}: expected comma-separated policy names, e.g. fifo,srtf")
    seen: set[str] = set()
    for n in names:
        if n.lower() in seen:
            raise PolicyError(f"policy {n!r} is listed twice in --policy")
        seen.add(n.lower())
    return names


def build_policy(name: str, cluster, perf) -> Policy:
    """The policy ``name`` (:func:`policies.registry.make_policy`)."""
    from policies.registry import make_policy

    return make_policy(name, cluster, perf)


def _file_stem(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "policy"


def _not_simulate_output(out: Path) -> str | None:
    """``None`` when directory ``out`` is empty or holds only what ``simulate --out`` writes (``summary.json``
    with its ``policies`` / ``files`` / ``summaries`` keys, ``jobs_*.parquet``, ``*.png``, all plain files);
    else the first thing that is not (named for the error)."""
    entries = sorted(out.iterdir())
    if not entries:
        return None
    for e in entries:
        plain = e.is_file() and not e.is_symlink()
        if not plain or not (e.name == "summary.json" or fnmatch.fnmatch(e.name, "jobs_*.parquet")
                             or e.name.endswith(".png")):
            return repr(e.name)
    try:
        doc = json.loads((out / "summary.json").read_text())
        ok = isinstance(doc, dict) and {"policies", "files", "summaries"} <= doc.keys()
    except (OSError, ValueError):
        ok = False
    return None if ok else "no simulate summary.json"


def _check_out(out: Path, overwrite: bool, command: str = "simulate",
               not_ours: Callable[[Path], str | None] = _not_simulate_output) -> None:
    """Refuse an ``--out`` that ``command`` cannot replace (:class:`OutputDirError`); ``not_ours(out)``
    names the first thing in an existing ``out`` that ``command`` did not write (``--overwrite``)."""
    # --out is replaced as a whole (renamed away, then deleted): never the working directory or one
    # that holds it (the shell would be left in a deleted directory, or it would be deleted with it)
    here = Path.cwd().resolve()
    target = out.resolve()
    if target == here or target in here.parents:
        raise OutputDirError(
            f"--out {out} is the current directory or one of its parents; {command} replaces --out as a whole, "
            "so name a directory below it (e.g. --out sim)"
        )
    if out.exists():
        if not out.is_dir():
            raise OutputDirError(f"--out {out} exists and is not a directory")
        if any(out.iterdir()) and not overwrite:
            raise OutputDirError(f"--out {out} exists and is not empty (use --overwrite to replace it)")
        if overwrite:
            stray = not_ours(out)
            if stray is not None:
                raise OutputDirError(
                    f"--out {out} holds {stray}, which {command} did not write; --overwrite replaces only an earlier "
                    f"{command} output (choose another --out, or empty it)"
                )
    why = unwritable(out)
    if why is not None:
        raise OutputDirError(f"--out {out}: {why}")


def _json_safe(x: Any) -> Any:
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


# ---------------------------------------------------------------------- command
def run_simulate(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except OutputDirError as exc:
        print(f"rlsched simulate: error: {printable(exc)}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    from policies.cluster import ClusterSpec
    from policies.perf import ContentionModel
    from trainer import metrics
    from trainer.simulator import Simulator
    from trainer.elastic import check_elastic_policy, elastic_perf, is_elastic_trace, load_jobs

    # 1. Validate everything before running anything.
    out = Path(os.path.normpath(args.out))  # "a/b/.." -> "a": out.name is the directory's own name
    _check_out(out, args.overwrite)
    cluster = ClusterSpec.parse(args.cluster)
    mode, perf = compat_setup(args, cluster)
    perf = perf or ContentionModel(cluster, contention=args.contention)
    elastic = is_elastic_trace(resolve_trace(args.trace))
    if elastic:  # workers and parameter servers (trainer/elastic.py, docs/ELASTIC.md)
        perf = elastic_perf(perf)
    names = parse_policy_list(args.policy)
    stems = {n: _file_stem(n) for n in names}
    if len(set(stems.values())) != len(stems):
        raise PolicyError(f"policies {names} map to clashing file names {sorted(stems.values())}")
    policies = {n: compat_policy(build_policy(n, cluster, perf), mode) for n in names}
    trace_path = resolve_trace(args.trace)
    if elastic:
        for n in names:
            check_elastic_policy(n, policies[n], f"--trace {trace_path}")
    if args.overwrite and out.exists() and out.resolve() in trace_path.resolve().parents:
        raise OutputDirError(f"--trace {args.trace} is inside --out {out}, which --overwrite would delete; "
                             "move the trace or choose another --out")
    jobs, _elastic = load_jobs(trace_path, cluster, perf)
    cfg = sim_config(args, mode)
    sims = {n: Simulator(cluster, jobs, policies[n], perf, cfg) for n in names}  # checks trace vs cluster

    # 2. Run, in memory.
    results, total_wall = run_all({n: sims[n].run for n in names}, len(jobs), args.quiet)
    summaries = {n: metrics.summarize(results[n], grid_step=args.round) for n in names}

    # 3. Write everything into a temporary directory next to --out, then rename.
    subtitle = f"{trace_path.name}, {len(jobs)} jobs, cluster {cluster.describe()}"
    doc = summary_doc(args, trace_path, jobs, cluster, cfg, names, stems, total_wall, summaries)
    with staged_output(out) as tmp:
        write_results(tmp, results, summaries, doc, stems, subtitle)

    if not args.quiet:
        from trainer.report import identical_notes

        notes = identical_notes(results, {n: getattr(policies[n], "stats", None) for n in names})
        print_results(summaries, f"rlsched simulate: {subtitle}",
                      f"Simulated {len(names)} policies in {total_wall:.2f} s; wrote {out}/", notes)
        print_compat(summaries)
    return 0


# ---------------------------------------------------------------------- shared with `rlsched twin`
def resolve_trace(arg: str) -> Path:
    """The ``--trace`` path; the default (:data:`DEFAULT_TRACE`, relative to the repository) is found
    from any directory."""
    trace_path = Path(arg)
    if arg == DEFAULT_TRACE and not trace_path.exists():
        repo_copy = Path(__file__).resolve().parents[1] / DEFAULT_TRACE
        if repo_copy.exists():
            trace_path = repo_copy
    return trace_path


def sim_config(args: argparse.Namespace, mode=None):
    """The :class:`~trainer.simulator.SimConfig` of the command line's simulator options; with a compat
    ``mode`` its rules (:meth:`~trainer.simulator.SimConfig.effective`)."""
    from trainer.simulator import SimConfig

    return SimConfig(
        round_len=args.round,
        event_triggered=not args.no_event_trigger,
        restart_overhead=args.restart_overhead,
        resize_overhead=getattr(args, "resize_overhead", None),
        noise_cv=args.noise_cv,
        seed=args.seed,
        metrics_interval=args.metrics_interval if args.metrics_interval is not None else args.round,
        compat=mode,
    ).effective()


def print_compat(summaries: dict) -> None:
    """Under a compat mode, one line per policy: our JCT (with queueing) and the peer's run-only JCT."""
    rows = [(n, s) for n, s in summaries.items() if s.get("compat")]
    for n, s in rows:
        print(f"{n}: --compat {s['compat']}: avg JCT {s['avg_jct_s'] / 3600:.2f} h with queueing; "
              f"run-only {s['avg_run_jct_s'] / 3600:.3f} h ({s['avg_run_jct_rounds_s']:.0f} s in whole rounds, "
              "DeepShare's metric)")


def summary_doc(args: argparse.Namespace, trace_path: Path, jobs: list, cluster, cfg, names: list[str],
                stems: dict[str, str], total_wall: float, summaries: dict) -> dict:
    """``summary.json``: the run's inputs, simulator config, files and every policy's metrics."""
    return {
        "created_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "trace": str(trace_path.resolve()),
        "jobs": len(jobs),
        "cluster": {"spec": str(args.cluster), "describe": cluster.describe(), **cluster.to_dict()},
        "config": {
            "round_len_s": cfg.round_len,
            "event_triggered": cfg.event_triggered,
            "restart_overhead_s": cfg.restart_overhead,
            "noise_cv": cfg.noise_cv,
            "seed": cfg.seed,
            "metrics_interval_s": cfg.metrics_interval,
            "compat": cfg.compat.name if cfg.compat is not None else None,
            "contention": cfg.compat.contention if cfg.compat is not None else getattr(args, "contention", "sum"),
        },
        "policies": list(names),
        "files": {n: f"jobs_{stems[n]}.parquet" for n in names},
        "total_wall_time_s": total_wall,
        "summaries": summaries,
    }


@contextlib.contextmanager
def staged_output(out: Path) -> Iterator[Path]:
    """A new directory next to ``out`` to write into; when the block ends without an error it replaces
    ``out`` (renamed into place, an earlier ``out`` deleted), otherwise it is removed: ``out`` either
    appears complete or not at all."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it 0700; give it a normal directory's mode
    try:
        yield tmp
        if out.exists():
            old = out.with_name(f".{out.name}.old-{int(time.time() * 1e6)}")
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def write_results(d: Path, results: dict, summaries: dict, doc: dict, stems: dict[str, str], subtitle: str) -> None:
    """``jobs_<policy>.parquet``, ``summary.json`` (``doc``) and the plots, into directory ``d``."""
    from trainer import metrics, report

    for n, res in results.items():
        metrics.write_jobs_parquet(res, d / f"jobs_{stems[n]}.parquet")
    (d / "summary.json").write_text(json.dumps(_json_safe(doc), indent=2) + "\n")
    report.write_plots(results, summaries, d, subtitle=subtitle)


def run_all(runs: dict[str, Callable[..., Any]], jobs: int, quiet: bool) -> tuple[dict[str, Any], float]:
    """Call each ``run(progress=...)`` in turn, with a progress bar on a terminal's stderr unless ``quiet``
    (``progress(done, total)``: jobs finished); their results by name, and the wall time in seconds."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    err_console = Console(stderr=True)
    show_progress = not quiet and err_console.is_terminal
    results = {}
    t0 = time.perf_counter()
    with Progress(
        TextColumn("[bold]{task.description:>12}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("jobs finished"),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
        disable=not show_progress,
    ) as progress:
        for n, run in runs.items():
            task = progress.add_task(n, total=jobs)
            results[n] = run(progress=lambda done, total, _t=task: progress.update(_t, completed=done))
            progress.update(task, completed=jobs)
    return results, time.perf_counter() - t0


def print_results(summaries: dict, title: str, footer: str, notes: list[str] | None = None) -> None:
    """The comparison table, at most :data:`trainer.report.TABLE_WIDTH` (100) columns wide (split into
    several tables when wider), the ``notes`` (e.g. :func:`trainer.report.identical_notes`), then ``footer``."""
    from trainer import report

    out_console = report.table_console()
    width = min(out_console.width, report.TABLE_WIDTH) if out_console.is_terminal else report.TABLE_WIDTH
    tables = report.comparison_tables(summaries, title=title, width=width)
    report.print_tables_fitted(out_console, tables, notes or ())
    out_console.print(footer)
