"""``rlsched trace``: generate job sets, convert traces, read Slurm accounting, print trace statistics.

Examples::

    rlsched trace generate --mix heavy --jobs 256 --cluster 4x8 --seed 1 --out heavy.csv
    rlsched trace generate --mix normal --arrival poisson --load 0.9 --sets 10 --out sets/normal
    rlsched trace stats data/philly/philly.csv --cluster 4x8
    rlsched trace stats heavy.csv --cluster 4x8 --json
    rlsched trace convert data/philly/philly.csv --cluster 4x8 --seed 0 --out philly-4x8.parquet
    rlsched trace from-sacct sacct.json --cluster 4x8 --partition gpu --out history.csv

Outputs are written atomically: a failed command leaves no file behind.
Missing parent directories of ``--out`` are created once the jobs are ready.
Exit status 2 on a bad trace or bad options, with one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from policies.cluster import ClusterSpec
from rlsched.argtypes import float_in_range, non_negative_int, positive_float, positive_int
from rlsched.text import printable
from trainer.generate import (
    DEMAND_DISTRIBUTIONS,
    MAX_JOBS,
    GeneratorConfig,
    GeneratorError,
    check_sets_directory,
    generate_jobs,
    generate_sets,
    write_sets,
)
from trainer.outputs import unwritable
from trainer.traces import TRACE_SUFFIXES

__all__ = ["register"]


def _fail(args: argparse.Namespace, msg: str) -> int:
    print(f"rlsched trace {args.trace_command}: error: {printable(msg)}", file=sys.stderr)
    return 2


def _check_out_file(out: Path, force: bool, sets_hint: bool = False) -> str | None:
    if out.suffix.lower() not in TRACE_SUFFIXES:
        hint = " (or use --sets N for a directory)" if sets_hint else ""
        endings = f"{', '.join(TRACE_SUFFIXES[:-1])} or {TRACE_SUFFIXES[-1]}"
        return f"{out}: output must be a file name ending in {endings}{hint}"
    if out.is_dir():
        return f"{out}: is a directory (use --sets N to write job sets into a directory)"
    if out.exists() and not force:
        return f"{out}: exists (use --overwrite to replace it)"
    why = unwritable(out.parent)
    return None if why is None else f"{out}: {why}"


def _make_parent(out: Path) -> None:
    """Create the output's missing parent directories (only once the output is ready)."""
    out.resolve().parent.mkdir(parents=True, exist_ok=True)


def _cmd_generate(args: argparse.Namespace) -> int:
    from trainer.traces import write_trace

    # Options that would change nothing here are an error, not silently ignored.
    if args.format is not None and args.sets is None:
        return _fail(
            args,
            f"--format applies only with --sets; a single --out file's format follows its suffix "
            f"(e.g. --out {Path(args.out).with_suffix('.' + args.format).name})",
        )
    if args.load is not None and args.arrival != "poisson":
        return _fail(args, "--load applies only with --arrival poisson (with zero arrivals every job comes at t=0)")
    cluster = ClusterSpec.parse(args.cluster)
    cfg = GeneratorConfig(
        num_jobs=args.jobs,
        mix=args.mix,
        max_gpus=args.max_gpus,
        min_gpus=args.min_gpus,
        demand=args.demand,
        duration_s=args.duration,
        jitter=args.jitter,
        arrival=args.arrival,
        load=GeneratorConfig.load if args.load is None else args.load,
        exact_mix=args.exact_mix,
        seed=args.seed,
    )
    out = Path(args.out)
    try:
        cfg = cfg.resolved(cluster)
        if args.sets is None:
            err = _check_out_file(out, args.overwrite, sets_hint=True)
            if err:
                return _fail(args, err)
            jobs = generate_jobs(cluster, cfg)
            _make_parent(out)
            write_trace(out, jobs)
            print(f"wrote {len(jobs)} jobs to {out}")
        else:
            if out.suffix.lower() in TRACE_SUFFIXES:
                return _fail(args, f"{out}: --sets writes a directory; give a directory path, not a file name")
            check_sets_directory(out, args.overwrite)  # before the (possibly long) generation
            sets = generate_sets(cluster, cfg, args.sets)
            _make_parent(out)
            paths = write_sets(out, sets, fmt=args.format or "csv", force=args.overwrite)
            print(f"wrote {len(paths)} job sets of {cfg.num_jobs} jobs to {out}/")
    except GeneratorError as exc:
        return _fail(args, str(exc))
    return 0


#: The Philly-only read options: keyword of :func:`trainer.philly.read_philly` -> the flag that sets it.
#: Their argparse default is None ("not given"); read_philly's own defaults are the documented ones.
_PHILLY_FLAGS = {
    "seed": "--seed",
    "mix": "--mix",
    "gpu_scale": "--gpu-scale",
    "time_scale": "--time-scale",
    "virtual_clusters": "--vc",
    "window": "--window-h",
    "sample": "--sample",
    "limit": "--limit",
    "oversize": "--oversize",
}


def _window(text: str) -> tuple[float, float]:
    """``--window-h START:END`` (hours) as seconds."""
    try:
        a, b = (float(x) * 3600.0 for x in text.split(":"))
    except ValueError:
        raise GeneratorError(f"--window-h {text!r}: expected START:END in hours, e.g. 0:24") from None
    if not 0 <= a < b:
        raise GeneratorError(f"--window-h {text!r}: need 0 <= START < END")
    return a, b


def _philly_options(args: argparse.Namespace) -> dict[str, Any]:
    """The Philly-only options given on the command line, checked, as :func:`read_philly` keywords."""
    if args.seed is not None and args.seed < 0:
        raise GeneratorError(f"--seed must be >= 0, got {args.seed}")
    if args.sample is not None and not 0 < args.sample <= 1:
        raise GeneratorError(f"--sample must be in (0, 1], got {args.sample}")
    opts = {
        "seed": args.seed,
        "mix": args.mix,
        "gpu_scale": args.gpu_scale,
        "time_scale": args.time_scale,
        "virtual_clusters": args.vc,
        "window": None if args.window_h is None else _window(args.window_h),
        "sample": args.sample,
        "limit": args.limit,
        "oversize": args.oversize,
    }
    return {k: v for k, v in opts.items() if v is not None}


def _load(args: argparse.Namespace):
    """The cluster and the trace's jobs; Philly-only options on another trace are an error, not ignored."""
    from trainer.traces import TRACE_FORMATS, load_trace, trace_format

    cluster = ClusterSpec.parse(args.cluster)
    opts = _philly_options(args)
    fmt = trace_format(args.trace)  # before the read: a Philly CSV may take a while
    if opts and fmt != "philly":
        flags = [_PHILLY_FLAGS[k] for k in opts]
        named = flags[0] if len(flags) == 1 else f"{', '.join(flags[:-1])} and {flags[-1]}"
        raise GeneratorError(
            f"{args.trace} is a {TRACE_FORMATS[fmt]} trace; {named} "
            f"{'applies' if len(flags) == 1 else 'apply'} only to Philly CSV input"
        )
    return cluster, load_trace(args.trace, cluster, **opts)


def _cmd_stats(args: argparse.Namespace) -> int:
    from trainer.trace_stats import render_stats, trace_stats

    try:
        cluster, jobs = _load(args)
    except GeneratorError as exc:
        return _fail(args, str(exc))
    stats = trace_stats(jobs, cluster)
    if args.json:
        print(json.dumps(stats, indent=2))
    else:
        render_stats(stats, title=Path(args.trace).name)
    return 0


def _cmd_convert(args: argparse.Namespace) -> int:
    from trainer.traces import write_trace

    out = Path(args.out)
    err = _check_out_file(out, args.overwrite)
    if err:
        return _fail(args, err)
    try:
        _, jobs = _load(args)
    except GeneratorError as exc:
        return _fail(args, str(exc))
    _make_parent(out)
    write_trace(out, jobs)
    print(f"wrote {len(jobs)} jobs to {out}")
    return 0


def _cmd_from_sacct(args: argparse.Namespace) -> int:
    from policies.workloads import UnknownModelError, canonical_model
    from trainer.sacct import read_sacct
    from trainer.traces import PARQUET_SUFFIXES, TraceError, write_trace

    out = Path(args.out)
    err = _check_out_file(out, args.overwrite)
    if err:
        return _fail(args, err)
    if args.default_model is not None:
        try:
            canonical_model(args.default_model)
        except UnknownModelError as exc:
            return _fail(args, f"--default-model: {exc}")
    if out.suffix.lower() in PARQUET_SUFFIXES:
        import pyarrow  # noqa: F401 - a missing trainer extra is reported before the input is read
    cluster = ClusterSpec.parse(args.cluster)
    try:
        jobs, summary = read_sacct(args.input, cluster, seed=args.seed, default_model=args.default_model,
                                   partitions=args.partition)
    except TraceError as exc:
        return _fail(args, str(exc))
    _make_parent(out)
    write_trace(out, jobs)
    for line in summary.lines():  # sacct text (comments, job ids) escaped
        print(printable(line))
    print(f"wrote {len(jobs)} jobs to {out}")
    return 0


def _add_read_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("trace", help="trace file: canonical .csv/.parquet, DeepShare .json, or the Philly CSV")
    p.add_argument("--cluster", default="4x8", help="target cluster: NODESxGPUS or a YAML/TOML file (default 4x8)")
    g = p.add_argument_group("Philly CSV only (an error with another trace; see docs/TRACES.md)")
    g.add_argument("--seed", type=non_negative_int, help="seed of the per-row model draw, >= 0 (default 0)")
    g.add_argument("--mix", help="model mix: normal|heavy|medium|low or 6 weights a:b:c:d:e:f (default normal)")
    g.add_argument(
        "--gpu-scale", type=positive_float, help="factor on num_gpus before clipping to the cluster (default 1)"
    )
    g.add_argument("--time-scale", type=positive_float, help="factor on submit times and durations (default 1)")
    g.add_argument("--vc", action="append", help="keep only this virtual cluster id (repeatable)")
    g.add_argument("--window-h", metavar="START:END", help="keep jobs submitted START..END hours after the first")
    g.add_argument(
        "--sample",
        type=float_in_range(0.0, 1.0, lo_open=True),
        help="keep each job with this probability, in (0, 1] (seeded; default 1)",
    )
    g.add_argument("--limit", type=positive_int, help="keep the first N jobs by submit time")
    g.add_argument("--oversize", choices=("clip", "drop", "error"), help="demands above the cluster (default clip)")


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``rlsched trace {generate,stats,convert,from-sacct}``."""
    from trainer.sacct import MAX_JSON_BYTES, SACCT_FORMAT

    trace = sub.add_parser(
        "trace", help="generate job sets, convert traces, read Slurm accounting, print trace statistics"
    )
    tsub = trace.add_subparsers(dest="trace_command", metavar="ACTION", required=True)

    g = tsub.add_parser(
        "generate",
        help="DeepShare-style synthetic job sets",
        description="Draw DeepShare-style job sets (rules in docs/TRACES.md).",
    )
    g.add_argument(
        "--mix", default="normal", help="normal|heavy|medium|low or 6 weights GNN:IMG:DLRM:LM:FSDP:MoE (default normal)"
    )
    g.add_argument(
        "--jobs",
        type=positive_int,
        default=256,
        help=f"jobs per set, 1..{MAX_JOBS:,} (all sets together at most that; default 256)",
    )
    g.add_argument(
        "--max-gpus", type=positive_int, default=None, help="largest GPU demand (default min(32, cluster GPUs))"
    )
    g.add_argument("--min-gpus", type=positive_int, default=1, help="smallest GPU demand, >= 1 (default 1)")
    g.add_argument("--demand", choices=DEMAND_DISTRIBUTIONS, default="pow2", help="demand distribution (default pow2)")
    g.add_argument(
        "--duration", type=positive_float, default=3600.0, help="isolated run time per job, s, > 0 (default 3600)"
    )
    g.add_argument(
        "--jitter",
        type=float_in_range(0.0, 1.0, hi_open=True),
        default=0.0,
        help="relative jitter on the duration, in [0, 1) (default 0)",
    )
    g.add_argument("--cluster", default="4x8", help="target cluster: NODESxGPUS or a YAML/TOML file (default 4x8)")
    g.add_argument(
        "--arrival", choices=("zero", "poisson"), default="zero", help="all at t=0 or Poisson (default zero)"
    )
    g.add_argument(
        "--load",
        type=positive_float,
        default=None,
        help="offered load for --arrival poisson, > 0 (default 0.9; an error with zero arrivals)",
    )
    g.add_argument("--exact-mix", action="store_true", help="apportion models exactly instead of i.i.d. draws")
    g.add_argument("--seed", type=non_negative_int, default=0, help="random seed, >= 0 (default 0)")
    g.add_argument(
        "--sets", type=positive_int, default=None, help="write N >= 1 sets set0..set{N-1} into the --out directory"
    )
    g.add_argument(
        "--format",
        choices=("csv", "parquet", "json"),
        default=None,
        help="file format with --sets (default csv; an error without --sets: a file's suffix sets its format)",
    )
    g.add_argument("--out", required=True, help="output .csv/.parquet/.json file, or a directory with --sets")
    g.add_argument(
        "--overwrite", "--force", dest="overwrite", action="store_true", help="replace an existing output"
    )
    g.set_defaults(func=_cmd_generate)

    s = tsub.add_parser(
        "stats", help="summary of a trace on a cluster", description="Summary of a trace on a target cluster."
    )
    _add_read_options(s)
    s.add_argument("--json", action="store_true", help="print the summary as JSON")
    s.set_defaults(func=_cmd_stats)

    c = tsub.add_parser(
        "convert",
        help="any supported trace -> canonical CSV/Parquet (or DeepShare JSON)",
        description="Read any supported trace for a cluster and write it in the canonical schema.",
    )
    _add_read_options(c)
    c.add_argument("--out", required=True, help="output .csv/.parquet/.json file")
    c.add_argument(
        "--overwrite", "--force", dest="overwrite", action="store_true", help="replace an existing output"
    )
    c.set_defaults(func=_cmd_convert)

    f = tsub.add_parser(
        "from-sacct",
        help="a real cluster's GPU jobs (sacct --json or sacct -P output) -> a trace to replay",
        description="Turn Slurm accounting history into a trace (rules in docs/TRACES.md): GPU jobs that ran, "
        "submit times from the first kept submission, the model from the job's rlsched:model= comment, the work "
        "so that the job alone on its best placement runs its measured Elapsed time. Input: sacct --json "
        f"(at most {MAX_JSON_BYTES // 2**20} MiB), or sacct -P with its header, e.g. "
        f"sacct --allusers --allocations -P --format={SACCT_FORMAT} -S 2024-03-01 -E 2024-04-01 > sacct.txt",
    )
    f.add_argument("input", help="sacct --json output, or sacct -P / -p output with its header line")
    f.add_argument("--out", required=True, help="output trace .csv/.parquet (or DeepShare .json)")
    f.add_argument("--cluster", default="4x8", help="target cluster: NODESxGPUS or a YAML/TOML file (default 4x8)")
    f.add_argument("--partition", action="append", help="keep only jobs of this partition (repeatable; default all)")
    f.add_argument("--default-model", help="model of jobs whose comment names none (default: a seeded draw)")
    f.add_argument("--seed", type=non_negative_int, default=0,
                   help="seed of the model draw for jobs whose comment names no model, >= 0 (default 0)")
    f.add_argument(
        "--overwrite", "--force", dest="overwrite", action="store_true", help="replace an existing output"
    )
    f.set_defaults(func=_cmd_from_sacct)

    from trainer.elastic import register_gen_elastic

    register_gen_elastic(tsub)
