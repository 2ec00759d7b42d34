"""Comparison reports of several policies on one trace: PNG plots and a rich table.

Plots (matplotlib, Agg backend, nothing shown on screen):

* ``jct_cdf.png``: CDF of job completion time per policy (seed Fig. 5).
* ``util_timeline.png``: allocated GPUs (% of the cluster) over time, one
  panel per policy.
* ``util_kde.png``: kernel density of utilisation sampled every round
  (seed Fig. 7); a histogram where a KDE is degenerate (fewer than two
  distinct samples).
* ``cs_distribution.png``: share of jobs per average-CS bucket (seed Fig. 6).

Inputs are :class:`trainer.simulator.SimResult` objects and the dicts of
:func:`trainer.metrics.summarize`, keyed by policy name in display order.

Tables: :func:`comparison_tables` fits the comparison into :data:`TABLE_WIDTH`
(100) columns by splitting the metric columns over as many tables as needed
(each repeats the policy column); :func:`identical_notes` says, under the
table, which policies made identical decisions and what in the runs explains
it (the hybrid's safety rule never fired, no job was slowed by contention, no
preemption), computed from the runs.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import matplotlib

matplotlib.use("Agg")  # headless; must precede pyplot
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from rich.table import Table  # noqa: E402

from trainer.simulator import SimResult  # noqa: E402

__all__ = [
    "PLOT_FILES",
    "TABLE_WIDTH",
    "best_heuristic_first",
    "comparison_table",
    "comparison_tables",
    "identical_notes",
    "identical_set_notes",
    "print_tables_fitted",
    "table_console",
    "plot_jct_cdf",
    "plot_util_timeline",
    "plot_util_kde",
    "plot_cs_distribution",
    "write_plots",
]

#: File names written by :func:`write_plots`.
PLOT_FILES = ("jct_cdf.png", "util_timeline.png", "util_kde.png", "cs_distribution.png", "frag_timeline.png")

_H = 3600.0
_DPI = 120


#: colours after tab10's ten, for figures of more policies (dark or saturated, apart from tab10's)
_MORE_COLOURS = ("#000000", "#e6ab02", "#1b1b8f", "#66a61e", "#7a0019", "#008080", "#ff00ff", "#8c6d31", "#5f5f5f", "#00ced1")


def _colours(names: list[str]) -> dict[str, str]:
    """One colour per policy: tab10's, then :data:`_MORE_COLOURS` (20 distinct, then they repeat)."""
    cycle = plt.get_cmap("tab10")
    palette = [matplotlib.colors.to_hex(cycle(i)) for i in range(10)] + list(_MORE_COLOURS)
    return {n: palette[i % len(palette)] for i, n in enumerate(names)}


def _styles(names: list[str]) -> dict[str, str]:
    """Line styles so that identical curves of two policies stay distinguishable."""
    cycle = ("-", "--", ":", "-.")
    return {n: cycle[i % len(cycle)] for i, n in enumerate(names)}


def _title(base: str, subtitle: str | None) -> str:
    return f"{base}\n{subtitle}" if subtitle else base


# ---------------------------------------------------------------------- plots
def plot_jct_cdf(results: Mapping[str, SimResult], path: str | Path, subtitle: str | None = None) -> Path:
    """Empirical CDF of JCT (hours) per policy; the legend gives mean and p90."""
    names = list(results)
    col = _colours(names)
    ls = _styles(names)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for n in names:
        jct = np.sort([r.jct for r in results[n].jobs if math.isfinite(r.jct)]) / _H
        if jct.size == 0:
            continue
        y = np.arange(1, jct.size + 1) / jct.size
        label = f"{n} (mean {jct.mean():.2f} h, p90 {np.percentile(jct, 90):.2f} h)"
        ax.step(np.concatenate([[0.0], jct]), np.concatenate([[0.0], y]), where="post", color=col[n], ls=ls[n], label=label, lw=1.8)
    ax.set_ylim(0, 1.02)
    ax.set_xlim(left=0)
    return _finish(fig, ax, path, "Job completion time (hours, queueing included)", "Fraction of jobs",
                   _title("CDF of job completion time", subtitle), legend="lower right")


def plot_util_timeline(results: Mapping[str, SimResult], path: str | Path, subtitle: str | None = None) -> Path:
    """Allocated GPUs in % of the cluster over time (hours), one panel per policy."""
    names = list(results)
    col = _colours(names)
    k = max(len(names), 1)
    fig, axes = plt.subplots(k, 1, figsize=(8, 1.4 + 1.7 * k), sharex=True, squeeze=False)
    xmax = max((results[n].makespan for n in names), default=0.0) / _H
    for ax, n in zip(axes[:, 0], names):
        r = results[n]
        total = r.cluster.total_gpus
        t = np.append(np.asarray(r.util_t, float), r.makespan) / _H
        u = np.append(np.asarray(r.util_used, float), 0.0) / total * 100.0
        ax.fill_between(t, u, step="post", color=col[n], alpha=0.35)
        ax.step(t, u, where="post", color=col[n], lw=1.0)
        ax.set_ylim(0, 105)
        ax.set_ylabel("GPUs used (%)")
        ax.grid(alpha=0.3)
        ax.set_title(f"{n}: makespan {r.makespan / _H:.1f} h", loc="left", fontsize=9, pad=3)
    axes[-1, 0].set_xlabel("Time since trace start (hours)")
    axes[-1, 0].set_xlim(0, xmax * 1.01 if xmax > 0 else 1)
    fig.suptitle(_title("GPU utilisation over time", subtitle))
    return _save(fig, path)


def plot_frag_timeline(results: Mapping[str, SimResult], path: str | Path, subtitle: str | None = None) -> Path:
    """Fragmentation over time (SCED2's eq. 1: per server ``1 - (sum x)^2 / (n sum x^2)`` over its GPUs'
    remaining times ``x``, averaged over servers; seed 003, Fig. 4), one line per policy, from the
    simulator's samples (``samples_t`` / ``samples_frag``, taken at rounds)."""
    names = list(results)
    col = _colours(names)
    ls = _styles(names)
    fig, ax = plt.subplots(figsize=(8, 4.2))
    for n in names:
        r = results[n]
        t = np.asarray(r.samples_t, float) / _H
        f = np.asarray(r.samples_frag, float)
        ok = np.isfinite(f)
        if ok.any():
            ax.step(t[ok], f[ok], where="post", color=col[n], ls=ls[n], lw=1.0,
                    label=f"{n} (mean {float(f[ok].mean()):.3f})")
    ax.set_xlabel("Time since trace start (hours)")
    ax.set_ylabel("Mean server fragmentation")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    if names:
        ax.legend(fontsize=8)
    fig.suptitle(_title("Fragmentation over time (SCED2 eq. 1)", subtitle))
    return _save(fig, path)


def plot_util_kde(summaries: Mapping[str, Mapping], path: str | Path, subtitle: str | None = None) -> Path:
    """Density of per-round utilisation samples (%), Gaussian KDE per policy.

    Falls back to a density histogram for a policy whose samples have fewer
    than two distinct values (the KDE's covariance would be singular). The x axis
    runs from 5 points below the lowest policy's 1st percentile (rounded down to
    a multiple of 5, at least 0) to 100 %, so that a group whose samples all lie
    near 100 % shows its shape.
    """
    from scipy.stats import gaussian_kde

    names = list(summaries)
    col = _colours(names)
    ls = _styles(names)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    samples = {n: np.asarray(summaries[n].get("util_samples", []), float) * 100.0 for n in names}
    p1 = [float(np.percentile(s, 1)) for s in samples.values() if s.size]
    lo = max(0.0, 5.0 * math.floor((min(p1) - 5.0) / 5.0)) if p1 else 0.0
    xs = np.linspace(lo, 100.0, 401)
    for n in names:
        s = samples[n]
        if s.size == 0:
            continue
        label = f"{n} (mean of samples {s.mean():.1f}%)"
        dens = None
        if np.unique(s).size >= 2:
            try:
                dens = gaussian_kde(s)(xs)
            except (np.linalg.LinAlgError, ValueError):
                dens = None
        if dens is not None:
            ax.plot(xs, dens, color=col[n], ls=ls[n], lw=1.8, label=label)
            ax.fill_between(xs, dens, color=col[n], alpha=0.12)
        else:
            ax.hist(s, bins=np.linspace(lo, 100, 21), density=True, color=col[n], alpha=0.5, label=label + " [histogram]")
    ax.set_xlim(lo, 100)
    ax.set_ylim(bottom=0)
    return _finish(fig, ax, path, "GPU utilisation (% of cluster GPUs allocated, sampled every round)",
                   "Density (1 / %)", _title("Distribution of GPU utilisation (KDE)", subtitle), legend="upper left")


def plot_cs_distribution(summaries: Mapping[str, Mapping], path: str | Path, subtitle: str | None = None) -> Path:
    """Grouped bars: % of jobs per average-contention-sensitivity bucket."""
    names = list(summaries)
    col = _colours(names)
    labels = next((list(s["cs_bucket_labels"]) for s in summaries.values()), [])
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    x = np.arange(len(labels))
    width = 0.8 / max(len(names), 1)
    for i, n in enumerate(names):
        vals = np.asarray(summaries[n]["cs_buckets"], float) * 100.0
        avg = _num(summaries[n].get("avg_cs"))
        ax.bar(x + (i - (len(names) - 1) / 2) * width, vals, width, color=col[n], label=f"{n} (avg CS {avg:.3f})")
    ax.set_xticks(x, labels)
    ax.set_ylim(0, 105)
    return _finish(fig, ax, path, "Job's average contention sensitivity (isolated / achieved throughput)", "Jobs (%)",
                   _title("Proportion of jobs by average contention sensitivity", subtitle), grid="y")


def _finish(fig, ax, path: str | Path, xlabel: str, ylabel: str, title: str, legend: str = "best",
            grid: str = "both") -> Path:
    """Label ``ax`` (axes, ``title``), draw its grid on ``grid`` axes and its legend at ``legend``, and save
    ``fig`` to ``path`` (:func:`_save`)."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(axis=grid, alpha=0.3)
    ax.set_title(title)
    ax.legend(loc=legend, fontsize=8)
    return _save(fig, path)


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    try:
        fig.tight_layout()
        fig.savefig(path, dpi=_DPI)
    finally:  # a failed save must not leak the figure (pyplot keeps every open one)
        plt.close(fig)
    return path


def write_plots(
    results: Mapping[str, SimResult],
    summaries: Mapping[str, Mapping],
    outdir: str | Path,
    subtitle: str | None = None,
) -> list[Path]:
    """Write every plot of :data:`PLOT_FILES` into ``outdir`` (which must exist)."""
    out = Path(outdir)
    return [
        plot_jct_cdf(results, out / PLOT_FILES[0], subtitle),
        plot_util_timeline(results, out / PLOT_FILES[1], subtitle),
        plot_util_kde(summaries, out / PLOT_FILES[2], subtitle),
        plot_cs_distribution(summaries, out / PLOT_FILES[3], subtitle),
        plot_frag_timeline(results, out / PLOT_FILES[4], subtitle),
    ]


# ---------------------------------------------------------------------- table
#: (summary key, header, scale, format, lower is better?) per column.
_COLUMNS: tuple[tuple[str, str, float, str, bool | None], ...] = (
    ("jobs", "Jobs", 1.0, "{:.0f}", None),
    ("avg_jct_s", "Avg JCT (h)", 1 / _H, "{:.2f}", True),
    ("median_jct_s", "Median JCT (h)", 1 / _H, "{:.2f}", True),
    ("p90_jct_s", "p90 JCT (h)", 1 / _H, "{:.2f}", True),
    ("p99_jct_s", "p99 JCT (h)", 1 / _H, "{:.2f}", True),
    ("avg_queueing_s", "Avg queue (h)", 1 / _H, "{:.2f}", True),
    ("makespan_s", "Makespan (h)", 1 / _H, "{:.2f}", True),
    ("avg_util", "Avg util (%)", 100.0, "{:.1f}", False),
    ("avg_cs", "Avg CS", 1.0, "{:.3f}", True),
    ("mean_frag", "Mean frag", 1.0, "{:.3f}", True),
    ("preemptions", "Preempt.", 1.0, "{:.0f}", True),
    ("wall_time_s", "Wall (s)", 1.0, "{:.2f}", None),
)


def _num(v) -> float:
    """A summary value as float; ``None`` (NaN after a JSON round trip) and junk become NaN."""
    try:
        return math.nan if v is None else float(v)
    except (TypeError, ValueError):
        return math.nan


def best_heuristic_first(avg_jct: Mapping[str, float]) -> list[str]:
    """The policy names of ``avg_jct`` (name -> average JCT) with the best heuristic first: the name of the
    lowest finite value among the heuristics (the names :func:`policies.registry.is_learned` does not
    call learned); the other names keep their order (first on ties)."""
    names = list(avg_jct)
    from policies.registry import is_learned

    vals = {n: _num(v) for n, v in avg_jct.items() if not is_learned(n)}
    vals = {n: v for n, v in vals.items() if math.isfinite(v)}
    if vals:
        best = min(vals, key=vals.__getitem__)
        names.remove(best)
        names.insert(0, best)
    return names


def comparison_table(
    summaries: Mapping[str, Mapping],
    title: str | None = None,
    transpose: bool = False,
    columns: Sequence[str] | None = None,
) -> Table:
    """A rich table, one row per policy, one column per metric (``transpose``:
    one row per metric, one column per policy, for narrow terminals); the best
    heuristic (:func:`best_heuristic_first`) comes first; the best value of each
    comparable metric is bold green (ties all bold).
    ``columns``: the summary keys of :data:`_COLUMNS` to show (default all), in that order."""
    summaries = {n: summaries[n] for n in best_heuristic_first({n: s.get("avg_jct_s") for n, s in summaries.items()})}
    best: dict[str, float] = {}
    for key, _, _, _, lower in _COLUMNS:
        vals = [_num(s.get(key)) for s in summaries.values()]
        vals = [v for v in vals if math.isfinite(v)]
        if lower is not None and len(vals) > 1 and min(vals) != max(vals):
            best[key] = min(vals) if lower else max(vals)

    def cell(s: Mapping, key: str, scale: float, fmt: str) -> str:
        v = _num(s.get(key))
        text = "-" if not math.isfinite(v) else fmt.format(v * scale)
        if key in best and math.isfinite(v) and v == best[key]:
            text = f"[bold green]{text}[/]"
        return text

    shown = [c for c in _COLUMNS if columns is None or c[0] in columns]
    table = Table(title=title or "Policy comparison", header_style="bold", title_justify="left")
    if transpose:
        table.add_column("Metric", style="cyan", no_wrap=True)
        for name in summaries:
            table.add_column(_plain(name), justify="right", no_wrap=True)
        for key, head, scale, fmt, _ in shown:
            table.add_row(head, *(cell(s, key, scale, fmt) for s in summaries.values()))
        return table
    # a long name (rl-base:/path/to/checkpoint) folds rather than widening the table
    table.add_column("Policy", style="cyan", overflow="fold", max_width=_NAME_WIDTH)
    for _, head, _, _, _ in shown:
        table.add_column(head, justify="right")
    for name, s in summaries.items():
        table.add_row(_plain(name), *(cell(s, key, scale, fmt) for key, _, scale, fmt, _ in shown))
    return table


#: Widest a printed results table is (terminal columns): wider comparisons are split (:func:`comparison_tables`).
TABLE_WIDTH = 100
#: Widest the policy-name column grows before a name folds onto more lines.
_NAME_WIDTH = 28


def _plain(name: str) -> str:
    """A policy name for a rich table cell: escaped (:func:`rlsched.text.markup_safe`), so ``[x]`` in a
    checkpoint path is shown as written and a control character as an escape."""
    from rlsched.text import markup_safe

    return markup_safe(name)


def _table_width(table: Table) -> int:
    """Columns ``table`` takes when nothing limits its width."""
    from rich.console import Console

    con = Console(width=10_000)
    return con.measure(table, options=con.options.update_width(10_000)).maximum


def comparison_tables(
    summaries: Mapping[str, Mapping], title: str | None = None, width: int = TABLE_WIDTH
) -> list[Table]:
    """:func:`comparison_table` fitted into ``width`` columns: one table when it fits, else the metric
    columns in order over as few tables as fit (each with the policy column; titles ``... (1/2)``).
    A single metric that does not fit beside the policy column still gets a table of its own."""
    keys = [c[0] for c in _COLUMNS]
    whole = comparison_table(summaries, title)
    if _table_width(whole) <= width:
        return [whole]
    chunks: list[list[str]] = []
    for key in keys:
        if chunks and _table_width(comparison_table(summaries, title, columns=chunks[-1] + [key])) <= width:
            chunks[-1].append(key)
        else:
            chunks.append([key])
    base = title or "Policy comparison"
    return [
        comparison_table(summaries, f"{base} ({i}/{len(chunks)})", columns=chunk)
        for i, chunk in enumerate(chunks, start=1)
    ]


def print_tables_fitted(console: Any, tables: Sequence[Table], notes: Sequence[str] = ()) -> None:
    """Print ``tables`` and then ``notes`` (plain text, wrapped) on ``console``, at most :data:`TABLE_WIDTH`
    columns wide."""
    from rich.text import Text

    width = min(console.width, TABLE_WIDTH) if console.is_terminal else TABLE_WIDTH
    for t in tables:
        console.print(t, width=width)
    for note in notes:
        console.print(Text(note), width=width)


def table_console(stderr: bool = False) -> Any:
    """A rich console for results tables: the terminal's, or :data:`TABLE_WIDTH` columns in logs and pipes
    (rich would otherwise assume 80)."""
    from rich.console import Console

    con = Console(stderr=stderr)
    return con if con.is_terminal else Console(stderr=stderr, width=TABLE_WIDTH)


# ---------------------------------------------------------------------- identical decisions
def _same_jobs(a: SimResult, b: SimResult) -> bool:
    """Whether every job started and finished at the same times (1e-9 s relative) on as many nodes, with as
    many preemptions, in both runs: the observable trace of identical decisions."""
    if len(a.jobs) != len(b.jobs):
        return False
    rb = {r.job_id: r for r in b.jobs}
    for r in a.jobs:
        o = rb.get(r.job_id)
        if o is None or r.num_nodes != o.num_nodes or r.preemptions != o.preemptions:
            return False
        for x, y in ((r.first_start, o.first_start), (r.finish_time, o.finish_time)):
            if not (x == y or (math.isfinite(x) and math.isfinite(y) and abs(x - y) <= 1e-9 * max(1.0, abs(x)))):
                return False
    return True


def _kind(name: str) -> tuple[str, str, str, bool]:
    """``(family, order or checkpoint, placement or mode, preemptive)`` of a policy name as the registry reads
    it: ``greedy`` is the SRTF order with the contention-aware placement, a heuristic's placement defaults
    to ``pack``, ``-np`` turns preemption off; RL names are ``rl-base`` / ``rl-hybrid`` (``:CHECKPOINT``)."""
    n = name.strip().lower()
    if n.startswith("rl-"):
        mode, _, ckpt = n.partition(":")
        return "rl", ckpt, mode, True
    preemptive = not n.endswith("-np")
    base = n[:-3] if not preemptive else n
    order, _, place = base.partition(":")
    if order in ("greedy", "contention-greedy"):
        order, place = "srtf", place or "greedy"
    return "heuristic", order, place or "pack", preemptive


def _why_identical(names: Sequence[str], facts: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """What the runs of ``names`` (``facts`` per policy: ``fallback`` safety-rule placements or None,
    ``preemptions``, ``needs_span`` jobs asking for more GPUs than a node has or None, ``max_cs`` the worst
    job's average CS, ``max_wait`` the longest queueing time in seconds or None) say about why the rule that tells them apart never changed a decision."""
    kinds = {n: _kind(n) for n in names}
    ref = kinds[names[0]]
    why: list[str] = []
    for n in names:
        fb = facts[n].get("fallback")
        if fb is not None and kinds[n][2] == "rl-hybrid":
            why.append(f"{n}'s safety rule never fired" if fb == 0 else f"{n}'s safety rule placed {fb} jobs")
    if any(k[0] == "heuristic" and k[2] != ref[2] for k in kinds.values()):  # placements differ
        span = [facts[n].get("needs_span") for n in names]
        if all(x == 0 for x in span):
            why.append("no job needed to span nodes (none asked for more GPUs than a node has), so the "
                       "placements differ only in which node")
        elif all(x is not None for x in span):
            why.append(f"{max(span)} jobs needed to span nodes, and the placements put them alike")
        worst = max((facts[n].get("max_cs", math.nan) for n in names), default=math.nan)
        if math.isfinite(worst) and worst <= 1.0 + 1e-9:
            why.append("no job was slowed by contention (average CS 1.000 for every job)")
    if any(k[0] == "heuristic" and k[1] != ref[1] for k in kinds.values()):  # orders differ
        if all(facts[n].get("max_wait") == 0 for n in names):
            why.append("no job waited (each started at its submit time), so the orders had nothing to rank")
    if any(k[0] == "heuristic" and k[3] != ref[3] for k in kinds.values()):  # preemption on in one only
        if all(facts[n].get("preemptions") == 0 for n in names):
            why.append("no job was preempted, so turning preemption off changed nothing")
    return why


def _groups_of_equal(names: Sequence[str], same: Any) -> list[list[str]]:
    groups: list[list[str]] = []
    for n in names:
        for g in groups:
            if same(g[0], n):
                g.append(n)
                break
        else:
            groups.append([n])
    return [g for g in groups if len(g) > 1]


def _note(group: Sequence[str], evidence: str, why: Sequence[str]) -> str:
    names = ", ".join(group[:-1]) + f" and {group[-1]}"
    reason = "; ".join(why) if why else "the runs do not show why (the policies' rules chose alike)"
    return f"Note: {names} made identical decisions ({evidence}): {reason}."


def identical_notes(
    results: Mapping[str, SimResult], stats: Mapping[str, Mapping[str, Any] | None] | None = None
) -> list[str]:
    """One note per set of policies whose runs made identical decisions (:func:`_same_jobs`), saying what in
    the runs explains it (:func:`_why_identical`). ``stats``: each policy's ``stats`` dict after its run, if
    any (rl-hybrid counts ``fallback_placements``, its safety rule's placements)."""
    stats = stats or {}
    names = list(results)
    facts = {}
    for n in names:
        st = stats.get(n) or {}
        jobs = results[n].jobs
        node = max(x.gpus for x in results[n].cluster.nodes)
        facts[n] = {
            "fallback": st.get("fallback_placements"),
            "preemptions": results[n].preemptions,
            "needs_span": sum(1 for r in jobs if r.gpu_demand > node),
            "max_wait": max((r.queueing for r in jobs), default=0.0),
            "max_cs": max((r.avg_cs for r in jobs if math.isfinite(r.avg_cs)), default=math.nan),
        }
    evidence = "every job started and finished at the same times on as many nodes"
    return [_note(g, evidence, _why_identical(g, facts))
            for g in _groups_of_equal(names, lambda a, b: _same_jobs(results[a], results[b]))]


def identical_set_notes(
    data: Mapping[str, Mapping[str, Any]], keys: Sequence[str], needs_span: int | None = None
) -> list[str]:
    """:func:`identical_notes` for :mod:`trainer.evaluate`'s results of one group (``{policy: {"sets": [...]}}``,
    per-set metric rows): policies whose every job set gave the same ``keys`` metrics (and preemptions), with
    the facts those rows hold (summed ``policy_stats``, preemptions, per-set average CS, which is 1 only when
    every job's is, CS being at least 1). ``needs_span``: jobs of the group asking for more GPUs than a node has."""
    names = list(data)

    def rows(n: str) -> list[tuple]:
        return [tuple(r.get(k) for k in (*keys, "preemptions")) for r in data[n]["sets"]]

    facts = {}
    for n in names:
        sets = data[n]["sets"]
        fb = [r.get("policy_stats", {}).get("fallback_placements") for r in sets]
        facts[n] = {
            "fallback": sum(fb) if fb and all(isinstance(x, int) for x in fb) else None,
            "preemptions": sum(int(r.get("preemptions") or 0) for r in sets),
            "needs_span": needs_span,
            "max_cs": max((float(r["avg_cs"]) for r in sets if r.get("avg_cs") is not None), default=math.nan),
        }
    evidence = "the same metrics on every job set"
    return [_note(g, evidence, _why_identical(g, facts)) for g in _groups_of_equal(names, lambda a, b: rows(a) == rows(b))]
