"""trainer.report: plots are written and readable; the comparison table is right."""

from __future__ import annotations

import matplotlib.image as mpimg
import numpy as np
import pytest
from rich.console import Console

from policies.cluster import ClusterSpec
from policies.heuristics import make_heuristic
from policies.job import JobSpec
from policies.perf import ContentionModel
from trainer import metrics, report
from trainer.simulator import SimConfig, Simulator


@pytest.fixture(scope="module")
def runs():
    """Two policies on a small mixed trace (2x4 cluster, 8 jobs, staggered arrivals)."""
    cluster = ClusterSpec.homogeneous(2, 4)
    perf = ContentionModel(cluster)
    models = ["MoE", "FSDP", "DLRM", "Transformer-XL", "GraphSage", "MobileNetV3", "MoE", "FSDP"]
    demands = [4, 4, 2, 2, 1, 2, 4, 1]
    jobs = [
        JobSpec(f"j{i}", 600.0 * i, m, g, perf.best_isolated_throughput(m, g) * 1800.0 * (1 + i % 3))
        for i, (m, g) in enumerate(zip(models, demands))
    ]
    results, summaries = {}, {}
    for name in ("fifo:spread", "srtf"):
        r = Simulator(cluster, jobs, make_heuristic(name, perf), perf, SimConfig()).run()
        results[name] = r
        summaries[name] = metrics.summarize(r, grid_step=300.0)
    return results, summaries


def _png_ok(path):
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] > 300 and img.shape[1] > 500
    # Not a blank canvas: some pixels differ from the background.
    assert np.std(img[..., :3]) > 0.02


def test_write_plots(runs, tmp_path):
    results, summaries = runs
    paths = report.write_plots(results, summaries, tmp_path, subtitle="tiny, 8 jobs, 2x4")
    assert [p.name for p in paths] == list(report.PLOT_FILES)
    for p in paths:
        _png_ok(p)


def test_kde_falls_back_to_histogram_when_degenerate(tmp_path):
    summaries = {
        "flat": {"util_samples": [1.0] * 10},  # one distinct value: singular KDE
        "one": {"util_samples": [0.5]},
        "empty": {"util_samples": []},
        "ok": {"util_samples": [0.25, 0.5, 0.75, 1.0]},
    }
    _png_ok(report.plot_util_kde(summaries, tmp_path / "kde.png"))


def test_cs_distribution_plot_accepts_zero_jobs(tmp_path):
    s = {"p": {"cs_bucket_labels": metrics.cs_bucket_labels(), "cs_buckets": [0.0] * 6, "avg_cs": float("nan")}}
    _png_ok(report.plot_cs_distribution(s, tmp_path / "cs.png"))


def test_comparison_table_values_and_best(runs):
    _, summaries = runs
    table = report.comparison_table(summaries, title="T")
    assert table.row_count == 2
    headers = [c.header for c in table.columns]
    assert headers[0] == "Policy" and "Avg JCT (h)" in headers and "Avg util (%)" in headers
    console = Console(width=250, record=True, color_system=None)
    console.print(table)
    text = console.export_text()
    for name, s in summaries.items():
        assert name in text
        assert f"{s['avg_jct_s'] / 3600:.2f}" in text
        assert f"{s['avg_util'] * 100:.1f}" in text
    # The best heuristic (lowest average JCT) is the first row, and its average JCT is highlighted.
    col = headers.index("Avg JCT (h)")
    cells = list(table.columns[col].cells)
    best = min(summaries, key=lambda n: summaries[n]["avg_jct_s"])
    assert list(table.columns[0].cells)[0] == best
    if len({round(s["avg_jct_s"], 6) for s in summaries.values()}) > 1:
        assert "bold green" in cells[0] and "bold green" not in cells[1]


@pytest.mark.parametrize(
    "avg, want",
    [
        ({"srtf": 5.0, "greedy": 4.0, "rl-base": 3.0}, ["greedy", "srtf", "rl-base"]),  # RL is never the heuristic
        ({"rl-base": 3.0, "fifo": 9.0, "srtf:nosplit": 4.0, "las": 4.0}, ["srtf:nosplit", "rl-base", "fifo", "las"]),
        ({"srtf": 4.0, "rl-fill": 1.0, "RL-area": 1.0}, ["srtf", "rl-fill", "RL-area"]),  # aliases of RL checkpoints
        ({"srtf": float("nan"), "las": None, "rl-base": 1.0}, ["srtf", "las", "rl-base"]),  # no finite value: as given
        ({"las": float("nan"), "srtf": 7.0}, ["srtf", "las"]),
    ],
)
def test_best_heuristic_first(avg, want):
    assert report.best_heuristic_first(avg) == want


def test_evaluate_tables_lead_with_the_best_heuristic():
    from trainer.evaluate import markdown_tables

    def summ(avg):
        return {"summary": {k: {"mean": avg if k != "avg_cs" else 1.0, "ci95": None}
                            for k in ("avg_jct_s", "p90_jct_s", "avg_util", "avg_cs")}, "sets": [{}]}

    results = {"g": {"srtf": summ(5.0), "rl-base": summ(3.0), "srtf:nosplit": summ(4.0)}}
    md = markdown_tables(results, "4x8")
    rows = [ln.split("|")[1].strip() for ln in md.splitlines() if ln.startswith("| ") and "Policy" not in ln]
    assert rows == ["srtf:nosplit", "srtf", "rl-base"]
    assert "rl-base/srtf:nosplit: avg 0.750" in md.split("Ratios")[1].split(";")[0]


def test_comparison_table_missing_values_show_dash():
    table = report.comparison_table({"x": {"jobs": 0, "avg_jct_s": float("nan"), "avg_util": None}})
    console = Console(width=250, record=True, color_system=None)
    console.print(table)
    assert "-" in console.export_text()
    assert table.row_count == 1


def test_comparison_table_transposed(runs):
    _, summaries = runs
    table = report.comparison_table(summaries, transpose=True)
    order = report.best_heuristic_first({n: s["avg_jct_s"] for n, s in summaries.items()})
    assert sorted(order) == sorted(summaries)
    assert [c.header for c in table.columns] == ["Metric", *order]
    assert table.row_count == len(report._COLUMNS)
    console = Console(width=80, record=True, color_system=None)
    console.print(table)
    text = console.export_text()
    assert "…" not in text  # fits 80 columns without truncation
    assert "Avg JCT (h)" in text


def test_a_failed_save_closes_its_figure(runs, tmp_path):
    """A plot whose file cannot be written raises and leaves no open figure behind (pyplot keeps them all)."""
    import matplotlib.pyplot as plt

    results, summaries = runs
    plt.close("all")
    with pytest.raises(OSError):
        report.plot_util_kde(summaries, tmp_path / "missing" / "util_kde.png")
    assert plt.get_fignums() == []


# ---- tables fit 100 columns; notes on identical decisions ----

def _render(tables, notes=(), width=report.TABLE_WIDTH) -> str:
    con = Console(width=width, record=True, color_system=None)
    report.print_tables_fitted(con, tables, notes)
    return con.export_text()


def test_comparison_tables_fit_100_columns(runs):
    """Every metric of every policy is shown, in tables at most 100 columns wide (the one wide table is
    about 170); names with markup or escapes are shown as written, folded when long."""
    _, summaries = runs
    many = {**summaries, "rl-base:/some/long/path/to/a/[bold]checkpoint[/]/best": summaries["srtf"]}
    tables = report.comparison_tables(many, title="comparison")
    assert len(tables) >= 2
    text = _render(tables)
    lines = text.splitlines()
    assert max(len(x) for x in lines) <= 100
    for _, head, _, _, _ in report._COLUMNS:  # every metric is in some table
        assert all(word in text for word in head.split()), head
    assert text.count("fifo:spread") == len(tables)  # the policy column repeats in each table
    assert "[bold]" in text  # markup shown, not interpreted
    assert report._table_width(report.comparison_table(many)) > 100
    one = report.comparison_tables(summaries, width=10_000)
    assert len(one) == 1


def _same_run(res):
    from dataclasses import replace

    return replace(res, jobs=[replace(j) for j in res.jobs])


def test_identical_notes_name_the_pair_and_why(runs):
    results, _ = runs
    srtf = results["srtf"]
    res = {"srtf": srtf, "greedy": _same_run(srtf), "fifo:spread": results["fifo:spread"]}
    notes = report.identical_notes(res)
    assert len(notes) == 1 and notes[0].startswith("Note: srtf and greedy made identical decisions")
    node = max(n.gpus for n in srtf.cluster.nodes)
    if all(j.gpu_demand <= node for j in srtf.jobs):
        assert "no job needed to span nodes" in notes[0]
    res = {"rl-base": srtf, "rl-hybrid": _same_run(srtf)}
    notes = report.identical_notes(res, {"rl-hybrid": {"fallback_placements": 0}, "rl-base": {}})
    assert notes and "rl-hybrid's safety rule never fired" in notes[0]
    notes = report.identical_notes(res, {"rl-hybrid": {"fallback_placements": 3}})
    assert "rl-hybrid's safety rule placed 3 jobs" in notes[0]
    assert report.identical_notes({"srtf": srtf, "fifo:spread": results["fifo:spread"]}) == []
    moved = _same_run(srtf)
    moved.jobs[0] = __import__("dataclasses").replace(moved.jobs[0], finish_time=moved.jobs[0].finish_time + 1.0)
    assert report.identical_notes({"srtf": srtf, "greedy": moved}) == []


def test_identical_notes_with_spanning_jobs():
    """On a trace whose jobs need more GPUs than a node has, the note says how many, not 'no job'."""
    cluster = ClusterSpec.homogeneous(2, 4)
    perf = ContentionModel(cluster)
    jobs = [JobSpec(f"j{i}", 100.0 * i, "MoE", g, perf.best_isolated_throughput("MoE", g) * 900.0)
            for i, g in enumerate([8, 2, 6, 1])]
    res = {n: Simulator(cluster, jobs, make_heuristic(n, perf), perf, SimConfig()).run() for n in ("srtf", "greedy")}
    notes = report.identical_notes(res)
    assert len(notes) == 1 and "2 jobs needed to span nodes, and the placements put them alike" in notes[0]


def test_twenty_policies_get_twenty_colours():
    names = [f"p{i}" for i in range(20)]
    cols = report._colours(names)
    assert len(set(cols.values())) == 20
    assert report._colours(names[:10]) == {n: cols[n] for n in names[:10]}  # tab10's first ten unchanged


def test_kde_axis_starts_below_the_lowest_samples(tmp_path, monkeypatch):
    """Samples all near 100 % (a saturated group): the x axis starts at 5 points below the lowest 1st
    percentile (95 %, policy a's) rounded down to a multiple of 5, i.e. at 90 %, not at 0."""
    import matplotlib.pyplot as plt

    seen = {}
    real_close = plt.close

    def keep(fig=None):
        if fig is not None and fig.axes:
            seen["xlim"] = fig.axes[0].get_xlim()
        real_close(fig)

    monkeypatch.setattr(plt, "close", keep)
    summaries = {"a": {"util_samples": [0.95] * 20 + [0.99] * 480 + [1.0] * 500},
                 "b": {"util_samples": [0.97, 1.0] * 100}}
    _png_ok(report.plot_util_kde(summaries, tmp_path / "kde.png"))
    assert seen["xlim"] == (90.0, 100.0)
