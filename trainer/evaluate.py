"""Evaluate policies over trace sets: tables with confidence intervals, the seed's figures.

:func:`run_evaluation` runs every policy on every job set of every trace
group (a sub-directory of ``--traces``, e.g. ``normal/``, ``heavy/``,
``poisson-90/``), with the full simulator, and writes:

* ``OUT/rl_results.json``: per group, per policy, per set: the scalar metrics of
  :func:`trainer.metrics.summarize`; and per group and policy the mean and
  95% confidence half-width (Student t over sets) of average JCT, p90 JCT,
  utilisation and average CS, and the paired ratio of its average JCT to the group's best
  heuristic's (``jct_vs_best``: per set policy / best heuristic, mean and half-width,
  :func:`paired_to_best`);
* ``OUT/figures/``: for each of the ``figure_groups`` (default: every group;
  a named group that does not exist is an error) the JCT CDF
  (seed Fig. 5, jobs of all sets pooled), the CS distribution (Fig. 6) and
  the utilisation KDE (Fig. 7), named after the group (an elastic group whose jobs all have
  parameter servers gets no CS distribution: PS jobs neither suffer nor cause contention in the
  performance model, so every such job's CS is 1); and, with ``branches``, average JCT versus
  utilisation of RL branches A-E next to the heuristics, one panel per group
  (Fig. 8);
* with ``results_md``: the Markdown tables between the markers
  ``<!-- BEGIN GENERATED -->`` and ``<!-- END GENERATED -->`` of that file
  (the hand-written text around them is kept; the markers are appended if
  missing).

The outputs are written as a set, after every simulation: all are first written
to a temporary directory inside ``OUT`` (the Markdown file beside itself), then
renamed into place; an error or an interrupt before that (a failed plot, Ctrl-C)
leaves the previous outputs as they were. The figures of ``OUT/figures/`` that
match :data:`FIGURE_PATTERNS` are evaluate's own: each run replaces all of them,
so the figures of an earlier run's other groups do not linger; every other file
there (``docs/figures/architecture.png``) is left alone.

Policy names are those of :func:`policies.registry.make_policy`; ``ALIAS=NAME`` shows
``NAME`` as ``ALIAS`` (e.g. ``rl-poisson=rl-base:/runs/poisson/best``); an ``=``
after a ``:`` or ``/`` is part of the name (``rl-base:sweep/lr=1e-4/best``). Each
shown name may appear once, and no entry may be empty (:func:`policy_specs`).
With ``branches``, each branch checkpoint must have been trained with the seed
reward and that branch's W1 (:data:`BRANCHES`).

Everything is checked before the first simulation: the policies, the outputs and
every trace file of every group (all are read up front, :func:`load_job_sets`), so a
bad file in the last group is reported at once, not after the groups before it ran.

**Elastic traces** (``docs/ELASTIC.md``, :mod:`trainer.elastic`): a group whose files are elastic traces
(workers and parameter servers; ``rlsched trace gen-elastic --seeds N --out DIR`` writes one) runs
under :func:`trainer.elastic.elastic_perf` of the performance model, as ``rlsched simulate`` runs such a
trace, with the resize pause ``resize_overhead``. A group may not mix elastic and fixed-size traces; a
learned fixed-size policy (``rl-*``, ``sced2``, ``rl-sf``) is refused on an elastic group
(:func:`trainer.elastic.check_elastic_policy`), as is a compat mode; the elastic policies (``drf``,
``tetris``, ``optimus``, ``chic``, ``chic-pair``, ``dl2``) and the heuristics run on it.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from policies.base import Policy, PolicyError
from policies.cluster import ClusterSpec
from policies.job import JobSpec
from policies.perf import ContentionModel
from policies.registry import is_learned
from trainer.elastic import check_elastic_policy, elastic_perf
from trainer.metrics import summarize
from trainer.outputs import nearest_existing, replace_marked, unwritable
from trainer.simulator import SimConfig, Simulator
from trainer.traces import TRACE_SUFFIXES

__all__ = [
    "BEGIN",
    "END",
    "EvaluationError",
    "evaluate_group",
    "load_job_sets",
    "make_policy",
    "markdown_tables",
    "mean_ci",
    "paired_to_best",
    "policy_specs",
    "print_tables",
    "run_evaluation",
]

log = logging.getLogger(__name__)

BEGIN = "<!-- BEGIN GENERATED -->"
END = "<!-- END GENERATED -->"
METRICS = (
    ("avg_jct_s", "Avg JCT (h)", 1 / 3600.0),
    ("p90_jct_s", "p90 JCT (h)", 1 / 3600.0),
    ("avg_util", "Util (%)", 100.0),
    ("avg_cs", "Avg CS", 1.0),
)
#: branch -> W1 of the seed reward its checkpoint was trained with (``rlsched train --reward seed --w1 W1``)
BRANCHES = {"A": 0.3, "B": 0.4, "C": 0.5, "D": 0.6, "E": 0.7}
#: the groups whose JCT CDF, CS distribution and utilisation KDE are drawn by default: ``None``, every group
#: of ``--traces`` (whatever ``scripts/rl_traces.sh`` or the RESULTS.md commands named them)
FIGURE_GROUPS: Sequence[str] | None = None

#: evaluate's own files in ``OUT/figures/`` (:func:`fnmatch.fnmatchcase` patterns; ``*`` is a group name)
FIGURE_PATTERNS = ("rl_jct_cdf_*.png", "rl_cs_distribution_*.png", "rl_util_kde_*.png", "rl_branches_jct_vs_util.png")


class EvaluationError(ValueError):
    """Evaluation options that cannot be used: no policies, an empty or repeated policy entry, or an output
    that cannot be written."""


def make_policy(name: str, cluster: ClusterSpec, perf: ContentionModel) -> Policy:
    """The policy ``name`` (:func:`policies.registry.make_policy`)."""
    from policies.registry import make_policy as make

    return make(name, cluster, perf)


def policy_specs(policies: Sequence[str]) -> dict[str, str]:
    """``{shown name: policy name}`` of the ``--policies`` entries, in order: ``NAME`` (shown as itself) or
    ``ALIAS=NAME`` (blanks around either are ignored). An entry is ``ALIAS=NAME`` only where the text before
    its first ``=`` holds no ``:`` or ``/``: ``rl-base:sweep/lr=1e-4/best`` is a name (a checkpoint path).

    :raises EvaluationError: naming the first empty entry (``srtf,,las``, a comma at an end), entry with an
        empty alias or name (``=srtf``, ``a=``) or shown name given twice (``srtf,srtf``, ``a=srtf,a=las``).
    """
    specs: dict[str, str] = {}
    entry_of: dict[str, int] = {}
    listed = ",".join(p.strip() for p in policies)
    for i, entry in enumerate(policies, start=1):
        alias, eq, name = (part.strip() for part in entry.partition("="))
        if not eq or ":" in alias or "/" in alias:  # NAME, or a NAME whose checkpoint path holds an '='
            alias = name = entry.strip()
        if not entry.strip():
            raise EvaluationError(
                f"--policies {listed!r}: entry {i} of {len(policies)} is empty (remove the extra comma)"
            )
        if not alias or not name:
            empty = "alias" if not alias else "policy name"
            raise EvaluationError(
                f"--policies: entry {i} {entry.strip()!r} has an empty {empty}; expected NAME or ALIAS=NAME"
            )
        if alias in specs:
            raise EvaluationError(
                f"--policies: {alias!r} is given twice (entries {entry_of[alias]} and {i}); list each policy once "
                "(ALIAS=NAME shows one under another name)"
            )
        specs[alias], entry_of[alias] = name, i
    return specs


def mean_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """Mean and confidence half-width (Student t) of ``values`` (non-finite ones left out); half-width
    NaN for one value (one sample gives no interval), both NaN for none."""
    from scipy.stats import t

    x = np.asarray([v for v in values if math.isfinite(v)], float)
    if x.size == 0:
        return math.nan, math.nan
    if x.size == 1:
        return float(x[0]), math.nan
    return float(x.mean()), float(t.ppf(0.5 + level / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))


def _groups(traces: Path) -> dict[str, list[Path]]:
    exts = TRACE_SUFFIXES  # every suffix trainer.traces.load_trace reads (.pq too)
    if traces.is_file():
        return {traces.stem: [traces]}
    if not traces.is_dir():
        raise FileNotFoundError(f"{traces}: no such trace directory")
    out: dict[str, list[Path]] = {}
    direct = sorted(f for f in traces.iterdir() if f.is_file() and f.suffix.lower() in exts)
    if direct:
        out[traces.name] = direct
    for d in sorted(x for x in traces.iterdir() if x.is_dir()):
        files = sorted(f for f in d.rglob("*") if f.is_file() and f.suffix.lower() in exts)
        if files:
            out[d.name] = files
    if not out:
        raise FileNotFoundError(f"{traces}: no trace files ({', '.join('*' + x for x in exts)})")
    order = ["normal", "heavy", "medium", "low"]
    return dict(sorted(out.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order else len(order), kv[0])))


def _elastic_group(group: str, files: Sequence[Path]) -> bool:
    """Whether the trace group's files are elastic traces (:func:`trainer.elastic.is_elastic_trace`);
    :class:`EvaluationError` naming one file of each kind when it mixes the two."""
    from trainer.elastic import is_elastic_trace

    kind = {f: is_elastic_trace(f) for f in files}
    if len(set(kind.values())) > 1:
        e = next(f for f, k in kind.items() if k)
        n = next(f for f, k in kind.items() if not k)
        raise EvaluationError(
            f"trace group {group!r} mixes elastic traces ({e.name}) and fixed-size traces ({n.name}); put each kind "
            "in its own group directory"
        )
    return bool(files) and all(kind.values())


def select_groups(traces: str | Path, names: str | None) -> tuple[dict[str, list[Path]], list[str]]:
    """The trace groups under ``traces`` and the ones named in ``names`` (comma-separated; ``None`` or
    empty: all), for the benchmarks. Raises :class:`FileNotFoundError` for a missing directory and
    :class:`ValueError` naming unknown groups (one-line messages)."""
    groups = _groups(Path(traces))
    chosen = [g.strip() for g in names.split(",") if g.strip()] if names else list(groups)
    missing = [g for g in chosen if g not in groups]
    if missing or not chosen:
        raise ValueError(f"{traces}: no trace group(s) {', '.join(missing) or '(none given)'}")
    return groups, chosen


def load_job_sets(files: Sequence[Path], cluster: ClusterSpec, perf: ContentionModel) -> list[list[JobSpec]]:
    """The job set of each file, read and checked for ``cluster`` by :func:`trainer.elastic.load_jobs` (an
    elastic trace by its reader, any other by :func:`trainer.traces.load_trace`), and by the simulator's own
    checks under ``perf`` (e.g. a job that would run longer alone than it accepts), before anything runs.

    :raises TraceError: for the first unusable file, naming it (and its row and field, or the job).
    """
    from trainer.elastic import load_jobs
    from trainer.simulator import SimulationError, Simulator
    from trainer.traces import TraceError

    out = []
    for f in files:
        jobs, _elastic = load_jobs(f, cluster, perf)
        try:
            Simulator(cluster, jobs, None, perf)
        except SimulationError as exc:
            raise TraceError(f, str(exc)) from None
        out.append(jobs)
    return out


def evaluate_group(
    policies: Mapping[str, Policy],
    files: Sequence[Path],
    cluster: ClusterSpec,
    perf: ContentionModel,
    keep_jobs: bool = False,
    on_set: Callable[[], None] | None = None,
    jobs: Sequence[Sequence[JobSpec]] | None = None,
    compat: Any = None,
    resize_overhead: float | None = None,
) -> dict[str, Any]:
    """Run each policy on each file; returns ``{policy: {"sets": [...], "summary": {...}, ...}}``.

    :param on_set: called after each (policy, job set) simulation, e.g. to advance a progress bar.
    :param jobs: the job sets of ``files``, already read (:func:`load_job_sets`); default: read them here.
    :param compat: a :class:`policies.compat.CompatMode` to simulate under (``perf`` must have its contention
        rule); each set's row then also has ``avg_run_jct_s`` and ``avg_run_jct_rounds_s`` (JCT without
        queueing, :func:`trainer.metrics.summarize`).
    :param resize_overhead: seconds an elastic job makes no progress after a resize
        (:attr:`trainer.simulator.SimConfig.resize_overhead`; ``None``: the restart pause, 30 s).
    """
    out: dict[str, Any] = {}
    traces = list(jobs) if jobs is not None else load_job_sets(files, cluster, perf)
    node_gpus = max(n.gpus for n in cluster.nodes)
    needs_span = sum(1 for job_set in traces for j in job_set if j.gpu_demand > node_gpus)
    for name, pol in policies.items():
        sets, jcts, cs, util = [], [], [], []
        for f, job_set in zip(files, traces, strict=True):
            t0 = time.perf_counter()
            res = Simulator(cluster, job_set, pol, perf, SimConfig(compat=compat, resize_overhead=resize_overhead)).run()
            s = summarize(res)
            row = {
                k: s[k]
                for k in (
                    "avg_jct_s",
                    "p90_jct_s",
                    "avg_util",
                    "avg_cs",
                    "makespan_s",
                    "finished",
                    "jobs",
                    "preemptions",
                )
            }
            for k in ("avg_run_jct_s", "avg_run_jct_rounds_s"):
                if k in s:
                    row[k] = s[k]
            row["trace"] = f"{f.parent.name}/{f.name}"
            row["wall_s"] = time.perf_counter() - t0
            if isinstance(getattr(pol, "stats", None), dict):
                row["policy_stats"] = dict(pol.stats)
            sets.append(row)
            if on_set is not None:
                on_set()
            if keep_jobs:
                jcts.extend(r.jct for r in res.jobs)
                cs.extend(r.avg_cs for r in res.jobs)
                util.extend(s["util_samples"])
        summary = {}
        for key, _, _ in METRICS:
            m, h = mean_ci([r[key] for r in sets])
            # JSON null where there is no interval (one job set), rather than a NaN no strict parser reads
            summary[key] = {"mean": m, "ci95": h if math.isfinite(h) else None}
        # needs_span: jobs of the group that ask for more GPUs than a node has (print_tables' notes)
        out[name] = {"sets": sets, "summary": summary, "needs_span": needs_span}
        if keep_jobs:
            out[name]["jobs_jct_s"] = jcts
            out[name]["jobs_avg_cs"] = cs
            out[name]["util_samples"] = util
        log.debug(  # the printed tables show these numbers (print_tables): at INFO they would show twice
            "  %-14s avg JCT %.2f h, util %.1f%%",
            name,
            summary["avg_jct_s"]["mean"] / 3600,
            100 * summary["avg_util"]["mean"],
        )
    return out


def paired_to_best(data: Mapping[str, Any], learned: set[str] | frozenset[str]) -> str | None:
    """Add to each policy's ``summary`` of one group (:func:`evaluate_group`'s result) the paired ratio of its
    average JCT to the best heuristic's, ``jct_vs_best``: ``{"best": name, "mean": m, "ci95": h}``, the mean and
    95 % Student-t half-width over the job sets of ``policy avg JCT / best heuristic avg JCT`` on the same set
    (``ci95`` null for one set; the best heuristic's own ratio is 1 on every set). The best heuristic is the
    policy not in ``learned`` (shown names) with the lowest mean average JCT (the first on ties); returns its
    name, or None (nothing added) when every policy is learned or none has a finite mean."""
    heur = {n: d["summary"]["avg_jct_s"]["mean"] for n, d in data.items() if n not in learned}
    heur = {n: v for n, v in heur.items() if math.isfinite(v)}
    if not heur:
        return None
    best = min(heur, key=heur.__getitem__)
    ref = [r["avg_jct_s"] for r in data[best]["sets"]]
    for d in data.values():
        ratio = [r["avg_jct_s"] / b if b > 0 else math.nan for r, b in zip(d["sets"], ref, strict=True)]
        m, h = mean_ci(ratio)
        d["summary"]["jct_vs_best"] = {"best": best, "mean": m, "ci95": h if math.isfinite(h) else None}
    return best


def _plots(group: str, data: Mapping[str, Any], figdir: Path, cluster: str, cs_figure: bool = True,
           seconds: bool = False) -> list[Path]:
    """The JCT CDF (in hours; in ``seconds``, as an elastic group's tables), CS distribution (only with
    ``cs_figure``) and utilisation KDE of one group; ``cluster`` (its description, e.g. ``4x8``) goes into
    every title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from trainer.metrics import cs_bucket_labels, cs_buckets
    from trainer.report import plot_cs_distribution, plot_util_kde

    from trainer.report import _colours

    paths = []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    styles = ("-", "--", ":", "-.")
    colours = _colours(list(data))
    for i, (name, d) in enumerate(data.items()):
        x = np.sort(np.asarray(d["jobs_jct_s"], float)) / (1.0 if seconds else 3600.0)
        ax.plot(x, np.arange(1, x.size + 1) / x.size, ls=styles[i % 4], lw=1.6, color=colours[name],
                label=f"{name} (avg {x.mean():.0f} s)" if seconds else f"{name} (avg {x.mean():.1f} h)")
    ax.set_xlabel("JCT (seconds)" if seconds else "JCT (hours)")
    ax.set_ylabel("CDF")
    ax.grid(alpha=0.3)
    ax.set_title(f"CDF of JCT ({group} mix, all sets pooled, {cluster})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    p = figdir / f"rl_jct_cdf_{group}.png"
    try:
        fig.savefig(p, dpi=120)
    finally:
        plt.close(fig)
    paths.append(p)
    summaries = {
        n: {
            "util_samples": d["util_samples"],
            "cs_bucket_labels": cs_bucket_labels(),
            "cs_buckets": cs_buckets(d["jobs_avg_cs"]),
            "avg_cs": float(np.mean(d["jobs_avg_cs"])),
        }
        for n, d in data.items()
    }
    subtitle = f"{group} mix, all sets, {cluster}"
    if cs_figure:
        paths.append(plot_cs_distribution(summaries, figdir / f"rl_cs_distribution_{group}.png", subtitle))
    paths.append(plot_util_kde(summaries, figdir / f"rl_util_kde_{group}.png", subtitle))
    return paths


#: how far above a group's median average JCT a point may lie and still set the panel's scale (x)
BRANCH_PLOT_Y_SPAN = 1.5


def _off_scale(points: Mapping[str, tuple[float, float]]) -> dict[str, tuple[float, float]]:
    """The points ``{name: (utilisation %, average JCT h)}`` whose JCT exceeds :data:`BRANCH_PLOT_Y_SPAN`
    x the median JCT of all of them (left out of a panel's axes by :func:`_branch_plot`)."""
    if not points:
        return {}
    ymed = float(np.median([y for _x, y in points.values()]))
    return {n: xy for n, xy in points.items() if xy[1] > BRANCH_PLOT_Y_SPAN * ymed}


def _branch_plot(results: Mapping[str, Any], branch_names: Sequence[str], figdir: Path) -> Path:
    """The seed's Fig. 8 per group: average JCT (h) against utilisation (%) of every policy and of the
    branches A-E (``rl-base@X`` / ``rl-hybrid@X``, each mode one line through A..E with A and E
    labelled). Each policy keeps one marker and colour in every panel (one legend below the panels).
    A point more than :data:`BRANCH_PLOT_Y_SPAN` x the panel's median average JCT is left out of the
    axes and named with its numbers under the panel's title, so that the rest stay apart."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    groups = list(results)
    ncol = min(3, len(groups))
    nrow = math.ceil(len(groups) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(5.6 * ncol, 4.4 * nrow + 1.2), squeeze=False)
    for ax in axes.flat[len(groups) :]:
        ax.axis("off")
    others = list(dict.fromkeys(n for g in groups for n in results[g] if n not in branch_names))
    heur = [n for n in others if not n.startswith("rl-")]
    learned = [n for n in others if n.startswith("rl-")]
    markers = "osD^v<>PXh*p"
    blues = plt.get_cmap("tab10")
    style: dict[str, dict[str, Any]] = {}
    for i, n in enumerate(heur):  # heuristics: tab10 colours (reds left out), hollow markers
        c = blues([0, 2, 4, 5, 7, 8, 9, 1][i % 8])
        style[n] = {"marker": markers[i % len(markers)], "facecolors": "none", "edgecolors": c, "linewidths": 1.4}
    reds = plt.get_cmap("Reds")
    for i, n in enumerate(learned):  # learned policies: filled, in shades of red-brown
        c = reds(0.55 + 0.45 * i / max(1, len(learned) - 1))
        style[n] = {"marker": markers[i % len(markers)], "color": c, "edgecolors": "black", "linewidths": 0.4}
    modes = {"rl-base": "tab:pink", "rl-hybrid": "tab:red"}
    for ax, g in zip(axes.flat, groups):
        pts = {n: (100 * d["summary"]["avg_util"]["mean"], d["summary"]["avg_jct_s"]["mean"] / 3600)
               for n, d in results[g].items()}
        off = _off_scale(pts)
        for n in others:
            if n in pts and n not in off:
                ax.scatter(*pts[n], s=42, zorder=2, **style[n])
        for mode, colour in modes.items():
            line = [(n.split("@")[-1], pts[n]) for n in branch_names if n.split("@")[0] == mode and n in pts and n not in off]
            if not line:
                continue
            xs, ys = [xy[0] for _b, xy in line], [xy[1] for _b, xy in line]
            ax.plot(xs, ys, "-o", color=colour, ms=4, lw=1.0, zorder=3)
            for b, (x, y) in (line[0], line[-1]):
                ax.annotate(b, (x, y), fontsize=8, color=colour, xytext=(4, 2 if mode == "rl-hybrid" else -9),
                            textcoords="offset points", zorder=4)
        ax.margins(x=0.12, y=0.15)
        ax.set_title(g, fontsize=11)
        if off:  # under the title, one line per two points
            items = [f"{n} {y:.1f} h at {x:.1f} %" for n, (x, y) in off.items()]
            note = "\n".join("; ".join(items[i : i + 2]) for i in range(0, len(items), 2))
            ax.text(0.0, 1.01, f"off scale: {note}", transform=ax.transAxes, fontsize=7, va="bottom", ha="left",
                    color="0.3")
            ax.set_title(g, fontsize=11, pad=8 + 10 * (1 + (len(items) - 1) // 2))
        ax.set_xlabel("utilisation (%)")
        ax.set_ylabel("average JCT (h)")
        ax.grid(alpha=0.3)
    handles = [Line2D([], [], ls="none", ms=7, marker=style[n]["marker"],
                      mfc=style[n].get("color", "none"), mec=style[n].get("edgecolors"), label=n) for n in others]
    handles += [Line2D([], [], color=c, marker="o", ms=4, lw=1.0, label=f"{m} branches A..E (W1 0.3..0.7)")
                for m, c in modes.items()]
    fig.legend(handles=handles, loc="lower center", ncol=min(6, len(handles)), fontsize=8, frameon=False)
    fig.suptitle("Average JCT vs utilisation per group: heuristics (hollow), learned policies (filled), "
                 "reward-weight branches A-E (lines)")
    fig.tight_layout(rect=(0, 0.07 + 0.02 * math.ceil(len(handles) / 6), 1, 0.97))
    p = figdir / "rl_branches_jct_vs_util.png"
    try:
        fig.savefig(p, dpi=120)
    finally:
        plt.close(fig)
    return p


def _metrics(data: Mapping[str, Any]) -> tuple[tuple[str, str, float], ...]:
    """The :data:`METRICS` of one group's tables: JCTs in hours, in seconds for an elastic group (its jobs
    run minutes: DL2's and Chic's settings; ``"elastic"`` set by :func:`run_evaluation`)."""
    if not any(d.get("elastic") for d in data.values()):
        return METRICS
    return tuple((k, h.replace("(h)", "(s)"), 1.0) if k.endswith("_jct_s") else (k, h, sc) for k, h, sc in METRICS)


def _cell(summary: Mapping[str, Any], key: str, scale: float) -> str:
    """``"mean ± half-width"`` of metric ``key`` (times ``scale``); the mean alone where there is no
    interval (``ci95`` null: one job set)."""
    m, h = summary[key]["mean"], summary[key]["ci95"]
    fmt = ("{:.3f}" if key == "avg_cs" else "{:.1f}" if scale == 100.0 else "{:.0f}" if scale == 1.0
           else "{:.2f}")
    return fmt.format(m * scale) + ("" if h is None else f" ± {fmt.format(h * scale)}")


def _best_first(data: Mapping[str, Any]) -> list[str]:
    """A group's policies, its best heuristic first: the one :func:`paired_to_best` compared with, else
    the lowest mean average JCT among the names :func:`trainer.report.best_heuristic_first` calls heuristics."""
    from trainer.report import best_heuristic_first  # matplotlib: only when tables are made

    best = {d["summary"].get("jct_vs_best", {}).get("best") for d in data.values()}
    if len(best) == 1 and (b := best.pop()) in data:
        return [b, *(n for n in data if n != b)]
    return best_heuristic_first({n: d["summary"]["avg_jct_s"]["mean"] for n, d in data.items()})


#: the column of the paired ratio to the best heuristic (:func:`paired_to_best`) in the tables
PAIRED_HEAD = "JCT / best heur."


def _paired_cell(summary: Mapping[str, Any]) -> str:
    """``"mean ± half-width"`` of ``jct_vs_best`` (3 decimals; the mean alone without an interval, ``-``
    where there is none)."""
    r = summary.get("jct_vs_best")
    if not r or not math.isfinite(r["mean"]):
        return "-"
    return f"{r['mean']:.3f}" + ("" if r["ci95"] is None else f" ± {r['ci95']:.3f}")


def markdown_tables(results: Mapping[str, Any], cluster: str) -> str:
    """Markdown: one table per group (its best heuristic first), mean +- 95% CI over sets, the paired ratio
    to the best heuristic (a column, where :func:`paired_to_best` added it), plus ratios of means of
    ``rl-base`` / ``rl-hybrid`` to the baselines (the best heuristic first)."""
    lines: list[str] = []
    for g, data in results.items():
        nsets = len(next(iter(data.values()))["sets"])
        what = "1 job set, no interval" if nsets == 1 else f"{nsets} job sets"
        lines.append(f"### {g} ({what}, {cluster})\n")
        paired = any("jct_vs_best" in d["summary"] for d in data.values())
        metrics = _metrics(data)
        heads = [h for _, h, _ in metrics] + ([PAIRED_HEAD] if paired else [])
        lines.append("| Policy | " + " | ".join(heads) + " |")
        lines.append("|---|" + "---|" * len(heads))
        order = _best_first(data)
        for name in order:
            d = data[name]
            cells = [_cell(d["summary"], key, scale) for key, _, scale in metrics]
            if paired:
                cells.append(_paired_cell(d["summary"]))
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        if paired:
            lines.append(f"\n{PAIRED_HEAD}: each policy's average JCT over {order[0]}'s (the best heuristic) on the "
                         "same job set, mean ± 95 % t half-width over the sets.")
        ratios = []
        for rl in [n for n in data if n in ("rl-base", "rl-hybrid")]:
            for base in [n for n in order if not n.startswith("rl-")]:
                a = data[rl]["summary"]["avg_jct_s"]["mean"] / data[base]["summary"]["avg_jct_s"]["mean"]
                p = data[rl]["summary"]["p90_jct_s"]["mean"] / data[base]["summary"]["p90_jct_s"]["mean"]
                ratios.append(f"{rl}/{base}: avg {a:.3f}, p90 {p:.3f}")
        if ratios:
            lines.append("\nRatios of mean JCT (RL / baseline): " + "; ".join(ratios) + ".")
        lines.append("")
    return "\n".join(lines)


def print_tables(results: Mapping[str, Any], cluster: str, console: Any = None) -> None:
    """The tables of :func:`markdown_tables` on a terminal (:mod:`rich`): per group, each policy's
    mean +- 95% interval of the :data:`METRICS` (the mean alone for a group of one job set) and its paired
    ratio to the best heuristic (:data:`PAIRED_HEAD`, where :func:`paired_to_best` added it).

    :param results: :func:`run_evaluation`'s results (groups -> policies -> ``summary``).
    :param console: a :class:`rich.console.Console` (default: standard output).
    """
    from rich.table import Table
    from rich.text import Text

    from rlsched.text import printable
    from trainer.report import TABLE_WIDTH, identical_set_notes, print_tables_fitted, table_console

    console = console or table_console()
    for g, data in results.items():
        nsets = len(next(iter(data.values()))["sets"])
        what = "1 job set, no interval" if nsets == 1 else f"{nsets} job sets, mean ± 95% interval"
        table = Table(title=f"{g} ({what}, {cluster})", title_justify="left")
        # a long name (rl-base:/path/to/checkpoint) folds, so the table stays within TABLE_WIDTH columns
        paired = any("jct_vs_best" in d["summary"] for d in data.values())
        metrics = _metrics(data)
        heads = [h for _, h, _ in metrics] + ([PAIRED_HEAD] if paired else [])
        table.add_column("Policy", overflow="fold", max_width=max(TABLE_WIDTH - 16 * len(heads) - 4, 12))
        for head in heads:
            table.add_column(head, justify="right")
        for name in _best_first(data):
            d = data[name]
            cells = [_cell(d["summary"], key, scale) for key, _, scale in metrics]
            table.add_row(Text(printable(name)), *cells, *([_paired_cell(d["summary"])] if paired else []))
        span = {d.get("needs_span") for d in data.values()}
        notes = identical_set_notes(data, [k for k, _, _ in METRICS] + ["makespan_s"],
                                    span.pop() if len(span) == 1 else None)
        print_tables_fitted(console, [table], notes)


def _check_outputs(outdir: Path, results_md: Path | None) -> None:
    """Refuse outputs that could only fail after all the simulations: an ``out`` (or its ``figures/``) that is
    a file, an ``out/rl_results.json`` that is not a file, a results file that is a directory (or will be one:
    ``out``, a parent of it, ``out/figures``) or one of the other outputs, or a parent that is a file."""
    for d in (outdir, outdir / "figures"):
        anc = nearest_existing(d)
        if anc.is_dir():
            continue
        if anc == outdir:
            raise EvaluationError(f"--out {outdir} exists and is not a directory")
        if anc == d:
            raise EvaluationError(f"--out {outdir}: {d} exists and is not a directory")
        raise EvaluationError(f"--out {outdir}: {anc} is not a directory")
    rj = outdir / "rl_results.json"
    if (rj.exists() or rj.is_symlink()) and not rj.is_file():
        raise EvaluationError(f"--out {outdir}: {rj} exists and is not a file")
    if results_md is not None:
        if results_md.is_dir():
            raise EvaluationError(f"--results-md {results_md} is a directory")
        md, out = results_md.resolve(), outdir.resolve()
        if md == out or md in out.parents:
            what = "the --out directory" if md == out else f"a directory --out {outdir} is in"
            raise EvaluationError(f"--results-md {results_md} is {what}; give a file (e.g. {results_md}/RESULTS.md)")
        if md == out / "figures":
            raise EvaluationError(f"--results-md {results_md} is the figures directory of --out {outdir}; give a file")
        if md == out / "rl_results.json" or (md.parent == out / "figures" and _own_figure(md.name)):
            raise EvaluationError(
                f"--results-md {results_md} is also an output of --out {outdir}; give another file"
            )
        if results_md.is_file():  # its hand-written text is kept: it must be readable
            try:
                text = results_md.read_text()
            except (OSError, UnicodeDecodeError) as exc:
                raise EvaluationError(f"--results-md {results_md}: cannot read it ({exc})") from None
            # the generated part replaces the text between the markers: they must be there once, in order
            b, e = text.count(BEGIN), text.count(END)
            if (b or e) and not (b == e == 1 and text.index(BEGIN) < text.index(END)):
                raise EvaluationError(
                    f"--results-md {results_md}: expected one {BEGIN!r} line followed by one {END!r} line "
                    f"(found {b} and {e}{', in the wrong order' if b == e == 1 else ''}); fix the file or remove both")
        why = unwritable(results_md.parent)
        if why is not None:
            raise EvaluationError(f"--results-md {results_md}: {why}")
    why = unwritable(outdir)
    if why is not None:
        raise EvaluationError(f"--out {outdir}: {why}")


def run_evaluation(
    policies: Sequence[str],
    traces: str | Path,
    cluster: str | ClusterSpec = "4x8",
    out: str | Path = "docs",
    branches: str | Path | None = None,
    results_md: str | Path | None = None,
    figure_groups: Sequence[str] | None = FIGURE_GROUPS,
    progress: Callable[[int, int], None] | None = None,
    contention: str = "sum",
    compat: str | None = None,
    resize_overhead: float | None = None,
) -> dict[str, Any]:
    """Evaluate and write results (see module docstring); returns the results dict.

    :param resize_overhead: seconds an elastic job makes no progress after a resize (``rlsched simulate
        --resize-overhead``; ``None``: the restart pause, 30 s; DL2's hot scaling:
        :data:`trainer.simulator.HOT_RESIZE_OVERHEAD_S`); finite, >= 0.

    :param contention: the performance model's contention rule (:data:`policies.ledger.CONTENTION_RULES`).
    :param compat: a compat mode's name (``deepshare``, :mod:`policies.compat`): every policy runs under the
        peer's rules (learned policies offered only its placements; the mode's contention rule replaces
        ``contention``) and each set's row also has the peer's run-only JCT (``avg_run_jct_s``,
        ``avg_run_jct_rounds_s``).
    :param figure_groups: the groups that get the JCT CDF, CS distribution and utilisation KDE (``None``:
        every group); :class:`EvaluationError` naming the trace groups when one of them does not exist.
    :param progress: called as ``progress(done, total)`` after each simulation of one policy on one
        job set (``total`` = policies x job sets over all groups), e.g. to drive a progress bar.
    """
    if not policies:
        raise EvaluationError("no policies to evaluate (e.g. srtf,las,rl-base)")
    specs = policy_specs(policies)
    if resize_overhead is not None and not (math.isfinite(resize_overhead) and resize_overhead >= 0):
        raise EvaluationError(f"--resize-overhead must be a finite number of seconds >= 0, got {resize_overhead!r}")
    _check_outputs(Path(out), Path(results_md) if results_md else None)
    cl = ClusterSpec.parse(cluster)
    from trainer.cli_sim import compat_policy, compat_setup

    compat_rules, perf = compat_setup(argparse.Namespace(compat=compat), cl)
    perf = perf or ContentionModel(cl, contention=contention)
    pols: dict[str, Policy] = {}
    for alias, name in specs.items():
        pols[alias] = compat_policy(make_policy(name, cl, perf), compat_rules)
        if alias != name:
            pols[alias].name = alias
    branch_names: list[str] = []
    if branches:
        bdir = Path(branches)
        for br, w1 in BRANCHES.items():
            ck = bdir / f"{br}.json"
            if not ck.is_file():
                ck = bdir / f"branch-{br}" / "last.json"
            if not ck.is_file():
                raise PolicyError(
                    f"{bdir}: branch {br} checkpoint missing (expected {br}.json, as `scripts/rl_branches.sh train` "
                    "writes, or branch-{br}/last.json, i.e. the `rlsched train --out DIR/branch-X` runs)"
                )
            for mode in ("rl-base", "rl-hybrid"):
                nm = f"{mode}@{br}"
                if nm in pols:
                    raise EvaluationError(f"--policies: {nm!r} is also the name of a --branches policy; rename it")
                pols[nm] = make_policy(f"{mode}:{ck}", cl, perf)
                pols[nm].name = nm
                if compat_rules is not None:
                    compat_policy(pols[nm], compat_rules)
                branch_names.append(nm)
            _check_branch(getattr(pols[nm], "checkpoint", None), br, w1, ck)
    groups = _groups(Path(traces))
    elastic = {g: _elastic_group(g, files) for g, files in groups.items()}
    learned = {alias for alias, name in specs.items() if is_learned(name)} | set(branch_names)
    perfs = {False: perf}
    kinds = {False: pols}
    if any(elastic.values()):
        if compat_rules is not None:
            raise EvaluationError(f"--compat {compat}: a compat mode applies to fixed-size traces; trace group(s) "
                                  f"{', '.join(g for g, e in elastic.items() if e)} are elastic")
        perfs[True] = elastic_perf(perf)
        # the same names built again under the PS performance model (Optimus and Tetris estimate with it)
        kinds[True] = {}
        where = "trace group " + ", ".join(g for g, e in elastic.items() if e)
        for alias, pol in pols.items():
            name = specs.get(alias, alias)
            built = kinds[True][alias] = make_policy(name, cl, perfs[True]) if alias in specs else pol
            check_elastic_policy(name, built, where, shown=alias)
            built.name = pol.name
    if figure_groups is None:
        fig_groups = list(groups)
    else:
        unknown = [g for g in dict.fromkeys(figure_groups) if g not in groups]
        if unknown or not figure_groups:
            raise EvaluationError(
                f"--figure-groups: no trace group {', '.join(map(repr, unknown)) or '(none given)'} in {traces}; "
                f"its groups: {', '.join(groups)} (default: all of them)"
            )
        fig_groups = [g for g in groups if g in set(figure_groups)]
    # every file of every group is read and checked before the first (long) simulation
    job_sets = {g: load_job_sets(files, cl, perfs[elastic[g]]) for g, files in groups.items()}
    # an elastic group of PS jobs only gets no CS figure: their CS is 1 by the model (module docstring)
    no_cs = {g for g in groups if elastic[g] and all(j.demand is not None and j.demand.ps > 0
                                                     for js in job_sets[g] for j in js)}
    results: dict[str, Any] = {}
    t0 = time.perf_counter()
    total = len(pols) * sum(len(files) for files in groups.values())
    done = 0

    def _tick() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total)

    for g, files in groups.items():
        log.info("group %s: %d traces", g, len(files))
        results[g] = evaluate_group(
            kinds[elastic[g]], files, cl, perfs[elastic[g]], keep_jobs=(g in fig_groups), on_set=_tick,
            jobs=job_sets.pop(g), compat=compat_rules, resize_overhead=resize_overhead
        )
        paired_to_best(results[g], learned)
        if elastic[g]:  # the tables show its JCTs in seconds (_metrics)
            for d in results[g].values():
                d["elastic"] = True
    outdir = Path(out)
    figdir = outdir / "figures"
    md = Path(results_md) if results_md else None
    main = [n for n in pols if n not in branch_names]
    slim = {
        g: {n: {k: v for k, v in d.items() if k in ("sets", "summary", "elastic")} for n, d in data.items()}
        for g, data in results.items()
    }
    md_text = None
    if md is not None:
        text = md.read_text() if md.is_file() else "# Results\n\n"
        gen = f"{BEGIN}\n\n" + markdown_tables({g: {n: slim[g][n] for n in main} for g in slim}, cl.describe())
        if branch_names:
            gen += "\n### Branches A-E (W1 = 0.3 .. 0.7), mean over sets\n\n" + _branch_table(slim, branch_names)
        gen += f"\n{END}"
        md_text = replace_marked(text, BEGIN, END, gen)
    # everything is written to a temporary directory inside OUT (the Markdown file beside itself), then
    # renamed into place by _commit: an error or interrupt before that leaves the previous outputs intact
    created = _make_dirs(figdir) + (_make_dirs(md.parent) if md is not None else [])
    stage: Path | None = None
    md_tmp: Path | None = None
    try:
        stage = Path(tempfile.mkdtemp(dir=outdir, prefix=".evaluate.tmp-"))
        staged = stage / "figures"
        staged.mkdir()
        figs = [f for g in fig_groups
                for f in _plots(g, {n: results[g][n] for n in main}, staged, cl.describe(), cs_figure=g not in no_cs,
                                seconds=elastic[g])]
        if branch_names:
            figs.append(_branch_plot(results, branch_names, staged))
        meta = {
            "cluster": cl.describe(),
            "contention": perf.contention,
            "compat": compat_rules.name if compat_rules is not None else None,
            "elastic_groups": [g for g, e in elastic.items() if e],
            "resize_overhead_s": resize_overhead,
            "cs_figure_skipped": sorted(no_cs & set(fig_groups)),
            "policies": list(pols),
            "traces": str(traces),
            "wall_s": time.perf_counter() - t0,
            "figures": [str(figdir / f.name) for f in figs],
        }
        _write_text(
            stage / "rl_results.json",
            json.dumps(_round6({"meta": meta, "results": slim}), separators=(",", ":"), default=float) + "\n",
        )
        if md is not None and md_text is not None:
            fd, tmp = tempfile.mkstemp(dir=md.parent, prefix=f".{md.name}.tmp-")
            os.close(fd)
            md_tmp = Path(tmp)
            _write_text(md_tmp, md_text)
        _commit(stage, figdir, [f.name for f in figs], outdir / "rl_results.json", md_tmp, md)
        md_tmp = None
        created = []
    finally:
        if md_tmp is not None:
            md_tmp.unlink(missing_ok=True)
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)
        for d in reversed(created):  # after an error: the directories this run made, if empty
            try:
                d.rmdir()
            except OSError:
                pass
    return results


def _own_figure(name: str) -> bool:
    """Whether ``name`` is one of evaluate's own figures (:data:`FIGURE_PATTERNS`)."""
    return any(fnmatch.fnmatchcase(name, pat) for pat in FIGURE_PATTERNS)


def _check_branch(ckpt: Any, branch: str, w1: float, path: Path) -> None:
    """Refuse a branch checkpoint not trained with the seed reward and the branch's W1 (:data:`BRANCHES`).
    ``ckpt``: the policy's checkpoint, a loaded fixed-shape :class:`~policies.checkpoint.Checkpoint` (its
    ``meta``) or the JSON path of a size-free one (its ``reward`` section is read)."""
    if isinstance(ckpt, Path):
        try:
            meta = json.loads(ckpt.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise EvaluationError(f"--branches: {ckpt}: unreadable ({exc})") from None
    else:
        meta = ckpt.meta if ckpt is not None else None
    reward = meta.get("reward") if isinstance(meta, dict) else None
    reward = reward if isinstance(reward, dict) else {}
    kind, got = reward.get("kind"), reward.get("w1")
    number = isinstance(got, (int, float)) and not isinstance(got, bool)
    if kind != "seed" or not number or not math.isclose(got, w1, rel_tol=0.0, abs_tol=1e-9):
        raise EvaluationError(
            f"--branches: {path} is not a branch {branch} checkpoint: it was trained with reward {kind!r}, "
            f"W1 {got!r}; branch {branch} is reward 'seed', W1 {w1} (rlsched train-sizefree --w1 {w1}, "
            f"scripts/rl_branches.sh train; or the fixed-shape rlsched train --reward seed --w1 {w1})"
        )


def _make_dirs(path: Path) -> list[Path]:
    """Create ``path`` and its missing parents; returns the directories created, outermost first."""
    missing = [p for p in (path, *path.parents) if not p.exists()][::-1]
    path.mkdir(parents=True, exist_ok=True)
    return missing


def _write_text(path: Path, text: str) -> None:
    with path.open("w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(path, 0o644)


def _commit(stage: Path, figdir: Path, figures: Sequence[str], results: Path, md_tmp: Path | None,
            md: Path | None) -> None:
    """Rename the outputs staged in ``stage`` (``figures/``, ``rl_results.json``) and ``md_tmp`` into place.

    Evaluate's previous figures in ``figdir`` (:data:`FIGURE_PATTERNS`) and ``results`` are first moved into
    ``stage/previous`` (deleted with ``stage``), so the figures are replaced as a set; renaming ``md_tmp``
    over ``md`` comes last. Only renames within one directory tree (and one beside ``md``): on an error
    every rename done is undone, leaving the previous outputs in place.
    """
    prev = stage / "previous"
    prev.mkdir()
    done: list[tuple[Path, Path]] = []

    def move(src: Path, dst: Path) -> None:
        os.replace(src, dst)
        done.append((src, dst))

    try:
        for f in sorted(figdir.iterdir()):
            if _own_figure(f.name) and not f.is_dir():
                move(f, prev / f.name)
        for name in figures:
            move(stage / "figures" / name, figdir / name)
        if results.is_file():
            move(results, prev / results.name)
        move(stage / results.name, results)
        if md_tmp is not None and md is not None:
            os.replace(md_tmp, md)
    except BaseException:
        for src, dst in reversed(done):
            try:
                os.replace(dst, src)
            except OSError as exc:
                log.error("could not restore %s from %s: %s", src, dst, exc)
        raise


def _round6(x: Any) -> Any:
    """Floats to 6 significant digits (keeps the JSON small), recursively."""
    if isinstance(x, float):
        return float(f"{x:.6g}")
    if isinstance(x, dict):
        return {k: _round6(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_round6(v) for v in x]
    return x


def _branch_table(results: Mapping[str, Any], names: Sequence[str]) -> str:
    groups = list(results)
    lines = [
        "| Policy | " + " | ".join(f"{g} avg JCT (h) / util (%)" for g in groups) + " |",
        "|---|" + "---|" * len(groups),
    ]
    for n in names:
        cells = []
        for g in groups:
            s = results[g][n]["summary"]
            cells.append(f"{s['avg_jct_s']['mean'] / 3600:.2f} / {100 * s['avg_util']['mean']:.1f}")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
