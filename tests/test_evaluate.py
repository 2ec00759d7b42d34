"""Evaluation over trace groups (trainer.evaluate)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from ckpt_helpers import write_random_checkpoint

from policies.cluster import ClusterSpec
from trainer.evaluate import BEGIN, END, EvaluationError, mean_ci, run_evaluation
from trainer.generate import GeneratorConfig, generate_jobs
from trainer.traces import write_trace

C = ClusterSpec.parse("2x4")


def test_mean_ci():
    m, h = mean_ci([1.0, 2.0, 3.0])
    assert m == 2.0 and h == pytest.approx(4.302653 * 1.0 / np.sqrt(3), rel=1e-5)
    m, h = mean_ci([5.0])
    assert m == 5.0 and math.isnan(h)  # one sample: no interval


def test_run_evaluation_writes_tables_and_figures(tmp_path):
    for g in ("normal", "heavy"):
        d = tmp_path / "traces" / g
        d.mkdir(parents=True)
        for k in range(2):
            jobs = generate_jobs(C, GeneratorConfig(num_jobs=10, mix=g, seed=k, max_gpus=8, duration_s=900.0))
            write_trace(d / f"set{k}.csv", jobs)
    md = tmp_path / "RESULTS.md"
    md.write_text(f"# Results\n\nhand-written intro\n\n{BEGIN}\nold\n{END}\n\nhand-written outro\n")
    ticks: list[tuple[int, int]] = []
    res = run_evaluation(
        ["srtf", "las", "rl-prior", "p0=rl-prior"], tmp_path / "traces", C, out=tmp_path / "out", results_md=md,
        progress=lambda done, total: ticks.append((done, total)),
    )
    assert list(res) == ["normal", "heavy"]
    assert ticks == [(k, 16) for k in range(1, 17)]  # 4 policies x 2 groups x 2 sets, one tick per run
    doc = json.loads((tmp_path / "out" / "rl_results.json").read_text())
    s = doc["results"]["normal"]["srtf"]["summary"]["avg_jct_s"]
    sets = [r["avg_jct_s"] for r in doc["results"]["normal"]["srtf"]["sets"]]
    assert s["mean"] == pytest.approx(np.mean(sets)) and len(sets) == 2
    text = md.read_text()
    assert "hand-written intro" in text and "hand-written outro" in text and "old" not in text
    assert "| rl-prior |" in text and "| p0 |" in text and "### heavy" in text
    assert res["normal"]["p0"]["summary"] == res["normal"]["rl-prior"]["summary"]
    figs = {p.name for p in (tmp_path / "out" / "figures").iterdir()}
    assert {"rl_jct_cdf_normal.png", "rl_cs_distribution_normal.png", "rl_util_kde_normal.png"} <= figs


def test_missing_traces(tmp_path):
    with pytest.raises(FileNotFoundError):
        run_evaluation(["srtf"], tmp_path / "nope", C, out=tmp_path / "out")


def _write_sets(d, names):
    d.mkdir(parents=True, exist_ok=True)
    for k, name in enumerate(names):
        jobs = generate_jobs(C, GeneratorConfig(num_jobs=6, seed=k, max_gpus=8, duration_s=900.0))
        write_trace(d / name, jobs)


def _no_simulation(monkeypatch):
    import trainer.evaluate

    def boom(*a, **k):
        raise AssertionError("a simulation ran before the options were checked")

    monkeypatch.setattr(trainer.evaluate, "Simulator", boom)


def test_empty_policy_list_is_refused(tmp_path, monkeypatch, capsys):
    from rlsched.cli import main
    from trainer.evaluate import EvaluationError

    _write_sets(tmp_path / "traces", ["set0.csv"])
    _no_simulation(monkeypatch)
    with pytest.raises(EvaluationError, match="no policies"):
        run_evaluation([], tmp_path / "traces", C, out=tmp_path / "out")
    for arg in (",", " , ,", ""):
        rc = main(["evaluate", "--policies", arg, "--traces", str(tmp_path / "traces"), "--cluster", "2x4",
                   "--out", str(tmp_path / "out"), "--results-md", str(tmp_path / "out" / "R.md")])
        err = capsys.readouterr().err
        assert rc == 2 and "--policies" in err and "names no policy" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_unusable_outputs_are_refused_before_any_simulation(tmp_path, monkeypatch, capsys):
    from rlsched.cli import main

    _write_sets(tmp_path / "traces", ["set0.csv"])
    _no_simulation(monkeypatch)
    afile = tmp_path / "afile"
    afile.write_text("mine")
    with_figures_file = tmp_path / "o2"
    with_figures_file.mkdir()
    (with_figures_file / "figures").write_text("x")
    cases = [
        (["--out", str(afile)], f"--out {afile} exists and is not a directory"),
        (["--out", str(afile / "sub")], f"{afile} is not a directory"),
        (["--out", str(with_figures_file)], "figures exists and is not a directory"),
        (["--out", str(tmp_path / "o3"), "--results-md", str(tmp_path)], "--results-md"),
        (["--out", str(tmp_path / "o3"), "--results-md", str(afile / "R.md")], f"{afile} is not a directory"),
        # a results file that the run itself would make a directory, or another output (all failed only after
        # the simulations: "[Errno 21] Is a directory")
        (["--out", str(tmp_path / "o3"), "--results-md", str(tmp_path / "o3")], "is the --out directory"),
        (["--out", str(tmp_path / "o3" / "a"), "--results-md", str(tmp_path / "o3")], "is a directory --out"),
        (["--out", str(tmp_path / "o3"), "--results-md", str(tmp_path / "o3" / "figures")], "figures directory"),
        (["--out", str(tmp_path / "o3"), "--results-md", str(tmp_path / "o3" / "rl_results.json")],
         "also an output of --out"),
        (["--out", str(with_figures_file / "x"), "--results-md", str(with_figures_file / "x")], "the --out directory"),
    ]
    with_results_dir = tmp_path / "o4"
    (with_results_dir / "rl_results.json").mkdir(parents=True)
    cases.append((["--out", str(with_results_dir)], "rl_results.json exists and is not a file"))
    # markers the generated tables could not be put between (the file and rl_results.json stay as they were)
    for name, text, found in (("swapped.md", f"x\n{END}\ny\n{BEGIN}\n", "found 1 and 1, in the wrong order"),
                              ("twice.md", f"{BEGIN}\n{END}\n{BEGIN}\n", "found 2 and 1"),
                              ("half.md", f"{BEGIN}\nhand-written\n", "found 1 and 0")):
        (tmp_path / name).write_text(text)
        cases.append((["--out", str(tmp_path / "o3"), "--results-md", str(tmp_path / name)], found))
    for extra, needle in cases:
        rc = main(["evaluate", "--policies", "srtf", "--traces", str(tmp_path / "traces"), "--cluster", "2x4", *extra])
        err = capsys.readouterr().err
        assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1, err
    assert afile.read_text() == "mine" and not (tmp_path / "o3").exists()


def _evaluate(tmp_path, policies, **kw):
    return run_evaluation(policies, tmp_path / "traces", C, out=tmp_path / "out", results_md=tmp_path / "R.md", **kw)


def _snapshot(tmp_path):
    """Every file under tmp_path/out and R.md: {relative path: bytes} (hidden temporary files included)."""
    files = [*(tmp_path / "out").rglob("*"), tmp_path / "R.md", *tmp_path.glob(".R.md*")]
    return {str(f.relative_to(tmp_path)): f.read_bytes() for f in files if f.is_file()}


@pytest.mark.parametrize("error", [RuntimeError("plotting failed"), KeyboardInterrupt()])
def test_a_failure_after_the_simulations_leaves_the_previous_outputs(tmp_path, monkeypatch, error):
    """The outputs are written as a set: a plot that fails (or Ctrl-C) after the first figure was saved leaves
    the old results and figures, no new figure beside them."""
    import trainer.report

    _write_sets(tmp_path / "traces" / "normal", ["set0.csv", "set1.csv"])
    _evaluate(tmp_path, ["srtf", "las"])
    (tmp_path / "out" / "figures" / "architecture.png").write_bytes(b"not evaluate's")
    before = _snapshot(tmp_path)

    def fail(*a, **k):
        raise error

    monkeypatch.setattr(trainer.report, "plot_cs_distribution", fail)  # after the JCT CDF was saved
    with pytest.raises(type(error)):
        _evaluate(tmp_path, ["srtf"])  # other policies: a different JCT CDF
    assert _snapshot(tmp_path) == before
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["figures", "rl_results.json"]  # no temporaries


def test_a_failed_rename_is_undone(tmp_path, monkeypatch):
    """An error while moving the outputs into place puts the previous ones back."""
    import os

    _write_sets(tmp_path / "traces" / "normal", ["set0.csv"])
    _evaluate(tmp_path, ["srtf", "las"])
    before = _snapshot(tmp_path)
    replace = os.replace

    def flaky(src, dst):
        if str(dst).endswith("R.md"):  # the last rename: every other output was already moved
            raise OSError("disk gone")
        replace(src, dst)

    monkeypatch.setattr(os, "replace", flaky)
    with pytest.raises(OSError, match="disk gone"):
        _evaluate(tmp_path, ["srtf"])
    monkeypatch.undo()
    assert _snapshot(tmp_path) == before


def test_stale_figures_of_an_earlier_run_are_removed_and_others_kept(tmp_path):
    """Evaluate's figures are replaced as a set: those of an earlier run's figure group (and branch plot) go,
    files that are not evaluate's stay (docs/figures/architecture.png)."""
    _write_sets(tmp_path / "traces" / "normal", ["set0.csv"])
    _write_sets(tmp_path / "traces" / "heavy", ["set0.csv"])
    _evaluate(tmp_path, ["srtf"], figure_groups=["heavy"])
    figdir = tmp_path / "out" / "figures"
    others = ["architecture.png", "rl_notes.png", "rl_jct_cdf_heavy.svg"]
    for name in others:
        (figdir / name).write_text("mine")
    (figdir / "rl_branches_jct_vs_util.png").write_text("an old branch plot")
    assert {"rl_jct_cdf_heavy.png", "rl_util_kde_heavy.png"} <= {p.name for p in figdir.iterdir()}
    _evaluate(tmp_path, ["srtf"], figure_groups=["normal"])
    new = ["rl_cs_distribution_normal.png", "rl_jct_cdf_normal.png", "rl_util_kde_normal.png"]
    assert sorted(p.name for p in figdir.iterdir()) == sorted(new + others)
    assert all((figdir / name).read_text() == "mine" for name in others)
    meta = json.loads((tmp_path / "out" / "rl_results.json").read_text())["meta"]
    assert sorted(Path(f).name for f in meta["figures"]) == new


def test_figures_for_every_group_by_default_or_the_groups_given(tmp_path, capsys):
    """The per-group figures are drawn for every trace group by default (whatever the groups are named, e.g.
    the ones scripts/rl_traces.sh writes), or for the groups given; a group given that does not exist is an
    error naming the groups there, before any simulation."""
    from rlsched.cli import main

    groups = ("heavy", "normal", "uniform-normal")
    for g in groups:
        _write_sets(tmp_path / "traces" / g, ["set0.csv"])
    _evaluate(tmp_path, ["srtf"])
    figdir = tmp_path / "out" / "figures"
    kinds = ("rl_jct_cdf", "rl_cs_distribution", "rl_util_kde")
    assert {p.name for p in figdir.iterdir()} == {f"{k}_{g}.png" for k in kinds for g in groups}
    with pytest.raises(EvaluationError, match=r"no trace group 'nosuch' in .*; its groups: normal, heavy, "
                                              r"uniform-normal \(default: all of them\)"):
        _evaluate(tmp_path, ["srtf"], figure_groups=["nosuch"])
    rc = main(["evaluate", "--policies", "srtf", "--traces", str(tmp_path / "traces"), "--cluster", "2x4",
               "--out", str(tmp_path / "out"), "--figure-groups", "heavy, uniform-normal"])
    assert rc == 0
    assert {p.name for p in figdir.iterdir()} == {f"{k}_{g}.png" for k in kinds for g in ("heavy", "uniform-normal")}
    capsys.readouterr()
    rc = main(["evaluate", "--policies", "srtf", "--traces", str(tmp_path / "traces"), "--cluster", "2x4",
               "--out", str(tmp_path / "out"), "--figure-groups", "all"])
    assert rc == 0 and {p.name for p in figdir.iterdir()} == {f"{k}_{g}.png" for k in kinds for g in groups}


def test_rl_traces_groups_get_figures_by_default():
    """The default figure groups are every group, so they match the groups scripts/rl_traces.sh writes."""
    import trainer.evaluate as ev
    from rlsched.cli import build_parser

    args = build_parser().parse_args(["evaluate", "--policies", "srtf", "--traces", "x", "--out", "y"])
    assert args.figure_groups == "all" and ev.FIGURE_GROUPS is None


def test_evaluate_prints_each_number_once(tmp_path, capsys):
    """The table is printed once, and no log line repeats its numbers (stdout and stderr together)."""
    from rlsched.cli import main

    _write_sets(tmp_path / "traces" / "normal", ["set0.csv", "set1.csv"])
    rc = main(["evaluate", "--policies", "srtf,las", "--traces", str(tmp_path / "traces"), "--cluster", "2x4",
               "--out", str(tmp_path / "out")])
    assert rc == 0
    cap = capsys.readouterr()
    text = cap.out + cap.err
    res = json.loads((tmp_path / "out" / "rl_results.json").read_text())["results"]["normal"]
    for name in ("srtf", "las"):
        avg = f"{res[name]['summary']['avg_jct_s']['mean'] / 3600:.2f}"
        assert text.count(name) >= 1
        assert len(re.findall(rf"(?<![\d.]){re.escape(avg)} ±", text)) >= 1
    assert text.count("normal (2 job sets") == 1  # the table's title: one table per group
    assert "avg JCT" not in cap.err  # no per-policy log line with the same numbers


def _checkpoint(path, kind="seed", w1=0.4, seed=0):
    """A small valid 2x4 checkpoint with random weights and the given reward."""
    return write_random_checkpoint(path, C, seed, reward={"kind": kind, "w1": w1, "w2": round(1 - w1, 6)})


def test_branch_checkpoints_must_be_the_seed_reward_with_the_branch_w1(tmp_path, monkeypatch, capsys):
    from rlsched.cli import main
    from trainer.evaluate import BRANCHES, EvaluationError

    _write_sets(tmp_path / "traces" / "normal", ["set0.csv"])
    for i, (br, w1) in enumerate(BRANCHES.items()):
        _checkpoint(tmp_path / "ok" / f"{br}.json", w1=w1, seed=i)
        _checkpoint(tmp_path / "jct" / f"branch-{br}" / "last.json", kind="jct-rel", w1=0.4, seed=i)
        _checkpoint(tmp_path / "w1" / f"{br}.json", w1=w1 if br != "C" else 0.4, seed=i)
    res = run_evaluation(["srtf"], tmp_path / "traces", C, out=tmp_path / "out", branches=tmp_path / "ok")
    assert list(res["normal"]) == ["srtf", *(f"{m}@{b}" for b in BRANCHES for m in ("rl-base", "rl-hybrid"))]
    _no_simulation(monkeypatch)
    cases = [
        ("jct", tmp_path / "jct" / "branch-A" / "last.json", "reward 'jct-rel', W1 0.4; branch A is reward 'seed', W1 0.3"),
        ("w1", tmp_path / "w1" / "C.json", "reward 'seed', W1 0.4; branch C is reward 'seed', W1 0.5"),
    ]
    for d, bad, needle in cases:
        with pytest.raises(EvaluationError, match=re.escape(f"--branches: {bad} is not a branch")):
            run_evaluation(["srtf"], tmp_path / "traces", C, out=tmp_path / "o2", branches=tmp_path / d)
        rc = main(["evaluate", "--policies", "srtf", "--traces", str(tmp_path / "traces"), "--cluster", "2x4",
                   "--out", str(tmp_path / "o2"), "--branches", str(tmp_path / d)])
        err = capsys.readouterr().err
        assert rc == 2 and str(bad) in err and needle in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o2").exists()


def test_an_equals_sign_in_a_checkpoint_path_is_not_an_alias(tmp_path):
    from trainer.evaluate import policy_specs

    specs = policy_specs(["rl-base:sweep/lr=1e-4/best", "x=rl-base:a/b=c", "a=srtf", "srtf:spread", "p=las:spread"])
    assert specs == {
        "rl-base:sweep/lr=1e-4/best": "rl-base:sweep/lr=1e-4/best",
        "x": "rl-base:a/b=c",
        "a": "srtf",
        "srtf:spread": "srtf:spread",
        "p": "las:spread",
    }
    _write_sets(tmp_path / "traces" / "normal", ["set0.csv"])
    _checkpoint(tmp_path / "sweep" / "lr=1e-4" / "best")
    ck = f"rl-base:{tmp_path}/sweep/lr=1e-4/best"
    res = run_evaluation([ck, f"r={ck}"], tmp_path / "traces", C, out=tmp_path / "out")
    assert list(res["normal"]) == [ck, "r"]
    assert res["normal"][ck]["summary"] == res["normal"]["r"]["summary"]


def test_pq_trace_files_are_evaluated(tmp_path):
    """A trace directory's .pq files count, as trainer.traces.load_trace reads them."""
    _write_sets(tmp_path / "traces" / "normal", ["set0.pq", "set1.parquet", "set2.csv"])
    res = run_evaluation(["srtf"], tmp_path / "traces", C, out=tmp_path / "out")
    names = [r["trace"] for r in res["normal"]["srtf"]["sets"]]
    assert names == ["normal/set0.pq", "normal/set1.parquet", "normal/set2.csv"]


def test_bad_trace_in_a_later_group_is_refused_before_any_simulation(tmp_path, monkeypatch, capsys):
    """Every file of every group is read before the first simulation: a bad trace in the last group is
    reported at once, not after the groups before it have been evaluated."""
    from rlsched.cli import main
    from trainer.traces import TraceError

    _write_sets(tmp_path / "traces" / "normal", ["set0.csv", "set1.csv"])
    _write_sets(tmp_path / "traces" / "zz", ["set0.csv"])
    bad = tmp_path / "traces" / "zz" / "set1.csv"
    bad.write_text("job_id,submit_time,model,gpu_demand,total_samples\nj0,0,MoE,64,1000\n")
    _no_simulation(monkeypatch)
    with pytest.raises(TraceError, match="larger than the cluster"):
        run_evaluation(["srtf"], tmp_path / "traces", C, out=tmp_path / "out")
    rc = main(["evaluate", "--policies", "srtf,las", "--traces", str(tmp_path / "traces"), "--cluster", "2x4",
               "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2 and f"{bad}, row 2, field 'gpu_demand'" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "policies, needle",
    [
        ("srtf,srtf", "'srtf' is given twice (entries 1 and 2)"),
        (" srtf , las, srtf", "'srtf' is given twice (entries 1 and 3)"),
        ("a=srtf,a=las", "'a' is given twice (entries 1 and 2)"),
        ("srtf,,las", "entry 2 of 3 is empty"),
        ("srtf,las,", "entry 3 of 3 is empty"),
        (",srtf", "entry 1 of 2 is empty"),
        ("srtf, ,las", "entry 2 of 3 is empty"),
        ("=srtf", "entry 1 '=srtf' has an empty alias"),
        ("srtf,a=", "entry 2 'a=' has an empty policy name"),
    ],
)
def test_repeated_or_empty_policy_entries_are_refused(tmp_path, monkeypatch, capsys, policies, needle):
    from rlsched.cli import main
    from trainer.evaluate import EvaluationError

    _write_sets(tmp_path / "traces", ["set0.csv"])
    _no_simulation(monkeypatch)
    rc = main(["evaluate", "--policies", policies, "--traces", str(tmp_path / "traces"), "--cluster", "2x4",
               "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2 and "--policies" in err and needle in err and len(err.strip().splitlines()) == 1, err
    with pytest.raises(EvaluationError, match=re.escape(needle)):  # library callers: the same check
        run_evaluation([p.strip() for p in policies.split(",")], tmp_path / "traces", C, out=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_figure_titles_name_the_cluster_evaluated(tmp_path, monkeypatch):
    import matplotlib.axes

    titles: list[str] = []
    set_title = matplotlib.axes.Axes.set_title

    def spy(self, label, *a, **k):
        titles.append(label)
        return set_title(self, label, *a, **k)

    monkeypatch.setattr(matplotlib.axes.Axes, "set_title", spy)
    _write_sets(tmp_path / "traces" / "normal", ["set0.csv"])
    run_evaluation(["srtf"], tmp_path / "traces", C, out=tmp_path / "out")
    cdf = [t for t in titles if t.startswith("CDF of JCT")]
    assert cdf == ["CDF of JCT (normal mix, all sets pooled, 2x4)"]
    assert len(titles) == 3 and all("2x4" in t and "4x8" not in t for t in titles), titles


def test_evaluate_needs_an_explicit_out(tmp_path, capsys, monkeypatch):
    """--out is required: a default of ./docs, run from the repository root with other traces, would silently
    replace the committed results (the documented command passes --out docs)."""
    from rlsched.cli import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as ei:
        main(["evaluate", "--policies", "srtf", "--traces", str(tmp_path)])
    err = capsys.readouterr().err
    assert ei.value.code == 2 and "--out" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "docs").exists()


def test_a_job_the_simulator_refuses_is_named_with_its_file_before_anything_runs(tmp_path, capsys):
    """A job that would run longer alone than the simulator accepts: refused up front, naming the file (the
    message named only the job, and came when that set's turn came)."""
    from rlsched.cli import main

    d = tmp_path / "traces" / "g"
    d.mkdir(parents=True)
    (d / "set0.csv").write_text("job_id,submit_time,model,gpu_demand,total_samples\na,0,MoE,2,1e10\n")
    rc = main(["evaluate", "--policies", "srtf", "--traces", str(tmp_path / "traces"), "--cluster", "2x4",
               "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert f"{d / 'set0.csv'}: job 'a': total_samples 1e+10" in err and "longest isolated run" in err
    assert not (tmp_path / "out").exists()


def test_the_command_prints_the_tables_and_one_job_set_has_no_interval(tmp_path, capsys):
    """The tables are printed without --results-md; a group of one job set shows its means alone (a
    half-width of 0 looked certain) and writes ``ci95: null``; a group of two keeps its intervals."""
    from rlsched.cli import main

    for g, n in (("one", 1), ("two", 2)):
        d = tmp_path / "traces" / g
        d.mkdir(parents=True)
        for k in range(n):
            jobs = generate_jobs(C, GeneratorConfig(num_jobs=8, seed=k, max_gpus=8, duration_s=900.0))
            write_trace(d / f"set{k}.csv", jobs)
    out, md = tmp_path / "out", tmp_path / "R.md"
    words = ["evaluate", "--policies", "srtf,las", "--traces", str(tmp_path / "traces"), "--cluster", "2x4"]
    assert main([*words, "--out", str(out), "--results-md", str(md)]) == 0
    printed = capsys.readouterr().out
    assert "one (1 job set, no interval, 2x4)" in printed and "two (2 job sets, mean ± 95% interval, 2x4)" in printed
    assert str(out / "rl_results.json") in printed
    doc = json.loads((out / "rl_results.json").read_text())["results"]
    one, two = doc["one"]["srtf"]["summary"], doc["two"]["srtf"]["summary"]
    assert all(v["ci95"] is None for v in one.values())
    assert all(isinstance(v["ci95"], float) for v in two.values())
    text = md.read_text()
    one_rows = "".join(x for x in text.split("### one")[1].split("###")[0].splitlines() if x.startswith("|"))
    two_rows = "".join(x for x in text.split("### two")[1].splitlines() if x.startswith("|"))
    assert "| srtf |" in one_rows and "±" not in one_rows
    assert two_rows.count("±") == 2 * 5  # two policies x (four metrics + the paired ratio to the best heuristic)


def test_evaluate_notes_identical_policies(tmp_path, capsys):
    """Policies whose every job set came out the same get a note under their group's table saying why,
    from the runs (here srtf and srtf-np: no job was preempted); the table fits 100 columns."""
    from rlsched.cli import main

    _write_sets(tmp_path / "traces" / "normal", ["set0.csv"])
    rc = main(["evaluate", "--policies", "srtf,srtf-np", "--traces", str(tmp_path / "traces"), "--cluster",
               "2x4", "--out", str(tmp_path / "out")])
    assert rc == 0
    out = capsys.readouterr().out
    res = json.loads((tmp_path / "out" / "rl_results.json").read_text())["results"]["normal"]
    keys = ("avg_jct_s", "p90_jct_s", "avg_util", "avg_cs", "makespan_s", "preemptions")
    assert [[r[k] for k in keys] for r in res["srtf"]["sets"]] == [[r[k] for k in keys] for r in res["srtf-np"]["sets"]]
    assert res["srtf"]["sets"][0]["preemptions"] == 0
    flat = " ".join(out.split())
    assert ("Note: srtf and srtf-np made identical decisions (the same metrics on every job set): no job was "
            "preempted, so turning preemption off changed nothing.") in flat
    assert max(len(line) for line in out.splitlines() if not line.startswith("written: ")) <= 100


def test_contention_rule_is_used_and_recorded(tmp_path, capsys):
    """``evaluate --contention ds-min`` prices contention by DeepShare's rule (no average CS above 1 / 0.35) and
    records the rule in rl_results.json."""
    from policies.ledger import DS_CS_CAP
    from rlsched.cli import main

    d = tmp_path / "traces" / "normal"
    d.mkdir(parents=True)
    write_trace(d / "set0.csv", generate_jobs(C, GeneratorConfig(num_jobs=12, mix="heavy", seed=1, max_gpus=8,
                                                                    duration_s=900.0)))
    out = tmp_path / "out"
    assert main(["evaluate", "--policies", "las", "--traces", str(tmp_path / "traces"), "--cluster", "2x4",
                 "--contention", "ds-min", "--out", str(out)]) == 0, capsys.readouterr().err
    doc = json.loads((out / "rl_results.json").read_text())
    assert doc["meta"]["contention"] == "ds-min"
    assert 1.0 <= doc["results"]["normal"]["las"]["sets"][0]["avg_cs"] <= DS_CS_CAP + 1e-6


def test_branch_plot_leaves_far_points_off_its_axes(tmp_path):
    """A policy far above the median JCT (las at 93 h among 55-62 h) is named under the title instead of
    squeezing the others; the figure is a PNG."""
    from trainer.evaluate import _branch_plot, _off_scale

    pts = {"srtf": (87.4, 58.3), "las": (88.1, 93.0), "lgtf": (78.8, 61.6), "rl-base@A": (82.0, 59.0),
           "rl-hybrid@A": (82.3, 58.9), "rl-base@E": (82.1, 58.8), "rl-hybrid@E": (82.2, 58.7)}
    assert _off_scale(pts) == {"las": (88.1, 93.0)}
    assert _off_scale({}) == {}

    def res(x, y):
        return {"summary": {"avg_util": {"mean": x / 100}, "avg_jct_s": {"mean": y * 3600}}}

    results = {"uniform": {n: res(*xy) for n, xy in pts.items()}}
    p = _branch_plot(results, ["rl-base@A", "rl-hybrid@A", "rl-base@E", "rl-hybrid@E"], tmp_path)
    assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------------- elastic trace groups
CHIC_YAML = str(Path(__file__).resolve().parents[1] / "data" / "clusters" / "chic.yaml")


def _elastic_group(d: Path, seeds=(1, 2), jobs: int = 4) -> list[Path]:
    from trainer.elastic import gen_elastic_dir

    d.parent.mkdir(parents=True, exist_ok=True)
    return gen_elastic_dir(d, "chic", len(seeds), seed=seeds[0], jobs=jobs)


def _sim_jct(policy: str, trace: Path, resize_overhead=None) -> float:
    """Average JCT of ``policy`` on an elastic trace as `rlsched simulate` runs it."""
    from policies.perf import ContentionModel
    from policies.registry import make_policy
    from trainer.elastic import elastic_perf, read_elastic_trace
    from trainer.simulator import SimConfig, Simulator

    cl = ClusterSpec.parse(CHIC_YAML)
    perf = elastic_perf(ContentionModel(cl))
    res = Simulator(cl, read_elastic_trace(trace), make_policy(policy, cl, perf), perf,
                    SimConfig(resize_overhead=resize_overhead)).run()
    return float(np.mean([r.jct for r in res.jobs]))


def test_elastic_group_runs_as_simulate_with_paired_ratios_and_its_figures(tmp_path):
    """An elastic group beside a fixed-size one: each set's JCT is what `simulate` gives on that trace (PS
    model, resize pause), every policy gets its paired ratio to the best heuristic, the JCT CDF and
    utilisation KDE are drawn and the CS distribution (PS jobs: CS 1 by the model) is not; the fixed-size
    group's numbers are those of evaluating it alone."""
    files = _elastic_group(tmp_path / "traces" / "chic")
    fixed = tmp_path / "traces" / "fixed"
    fixed.mkdir()
    cl = ClusterSpec.parse(CHIC_YAML)
    for k in range(2):
        write_trace(fixed / f"set{k}.csv", generate_jobs(cl, GeneratorConfig(num_jobs=6, seed=k, max_gpus=2,
                                                                             duration_s=900.0)))
    md = tmp_path / "R.md"
    pols = ["optimus", "drf", "fifo", "mine=dl2"]
    res = run_evaluation(pols, tmp_path / "traces", CHIC_YAML, out=tmp_path / "out", results_md=md,
                         resize_overhead=0.05)
    chic = res["chic"]
    for name, spec in (("optimus", "optimus"), ("drf", "drf"), ("mine", "dl2")):
        assert [r["avg_jct_s"] for r in chic[name]["sets"]] == [_sim_jct(spec, f, 0.05) for f in files]
    heur = {n: chic[n]["summary"]["avg_jct_s"]["mean"] for n in ("optimus", "drf", "fifo")}
    best = min(heur, key=heur.__getitem__)
    for name, d in chic.items():
        ratio = [r["avg_jct_s"] / b["avg_jct_s"] for r, b in zip(d["sets"], chic[best]["sets"])]
        got = d["summary"]["jct_vs_best"]
        assert got["best"] == best and got["mean"] == pytest.approx(np.mean(ratio), rel=1e-12)
        assert got["ci95"] == pytest.approx(mean_ci(ratio)[1], rel=1e-9, abs=1e-12)
    alone = run_evaluation(pols, fixed, CHIC_YAML, out=tmp_path / "o2")
    assert [r["avg_jct_s"] for r in alone["fixed"]["fifo"]["sets"]] == [r["avg_jct_s"] for r in res["fixed"]["fifo"]["sets"]]
    doc = json.loads((tmp_path / "out" / "rl_results.json").read_text())
    assert doc["meta"]["elastic_groups"] == ["chic"] and doc["meta"]["resize_overhead_s"] == 0.05
    assert doc["meta"]["cs_figure_skipped"] == ["chic"]
    figs = sorted(f.name for f in (tmp_path / "out" / "figures").iterdir())
    assert "rl_jct_cdf_chic.png" in figs and "rl_util_kde_chic.png" in figs
    assert "rl_cs_distribution_chic.png" not in figs and "rl_cs_distribution_fixed.png" in figs
    text = md.read_text().split("### chic")[1].split("###")[0]
    rows = [x for x in text.splitlines() if x.startswith("| ")]
    assert rows[0].endswith("| JCT / best heur. |") and rows[1].startswith(f"| {best} |")
    assert f"over {best}'s (the best heuristic)" in text


def test_elastic_resize_pause_is_the_simulators(tmp_path):
    files = _elastic_group(tmp_path / "traces" / "chic", seeds=(3,), jobs=5)
    default = run_evaluation(["drf", "chic"], tmp_path / "traces", CHIC_YAML, out=tmp_path / "a")
    for p in ("drf", "chic"):
        assert default["chic"][p]["sets"][0]["avg_jct_s"] == _sim_jct(p, files[0])
    assert _sim_jct("drf", files[0]) != _sim_jct("drf", files[0], 0.05)  # the pause matters on this trace


@pytest.mark.parametrize("case", ["mixed", "rl-base", "compat"])
def test_elastic_groups_refuse_in_one_line(tmp_path, capsys, case):
    """A group mixing elastic and fixed-size traces, a learned fixed-size policy on an elastic group, a compat
    mode with an elastic group: exit 2, one line, nothing written."""
    from rlsched.cli import main

    files = _elastic_group(tmp_path / "traces" / "chic", seeds=(1,), jobs=3)
    words = ["evaluate", "--policies", "drf,fifo", "--traces", str(tmp_path / "traces"), "--cluster", CHIC_YAML,
             "--out", str(tmp_path / "out")]
    want = {"mixed": "trace group 'chic' mixes elastic traces (chic-1.json) and fixed-size traces (set0.csv)",
            "rl-base": "policy 'rl-base' does not run on elastic traces (trace group chic)",
            "compat": "a compat mode applies to fixed-size traces; trace group(s) chic are elastic"}[case]
    if case == "mixed":
        write_trace(files[0].parent / "set0.csv", generate_jobs(C, GeneratorConfig(num_jobs=3, seed=0, max_gpus=2)))
    elif case == "rl-base":
        words[2] = "drf,rl-base"
    elif case == "compat":
        words[6] = "4x8"  # the mode's cluster
        words += ["--compat", "deepshare"]
    rc = main(words)
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and want in err, err
    assert not (tmp_path / "out" / "rl_results.json").exists()
    with pytest.raises(EvaluationError, match="--resize-overhead must be a finite number of seconds >= 0"):
        run_evaluation(["drf"], tmp_path / "traces", CHIC_YAML, out=tmp_path / "out", resize_overhead=math.inf)


def test_paired_to_best_picks_the_best_non_learned_policy():
    """The ratio is per set against the heuristic of lowest mean (learned names excluded, whatever they look
    like); all learned: nothing added."""
    from trainer.evaluate import paired_to_best

    def group(**jcts):
        return {n: {"sets": [{"avg_jct_s": v} for v in vs],
                    "summary": {"avg_jct_s": {"mean": float(np.mean(vs)), "ci95": None}}} for n, vs in jcts.items()}

    data = group(srtf=[10.0, 20.0], las=[12.0, 18.0], mine=[5.0, 10.0])
    assert paired_to_best(data, {"mine"}) == "srtf"  # las's mean 15 equals srtf's: the first wins
    r = data["mine"]["summary"]["jct_vs_best"]
    assert r["best"] == "srtf" and r["mean"] == 0.5 and r["ci95"] == 0.0
    assert data["las"]["summary"]["jct_vs_best"]["mean"] == pytest.approx((1.2 + 0.9) / 2)
    only = group(mine=[1.0])
    assert paired_to_best(only, {"mine"}) is None and "jct_vs_best" not in only["mine"]["summary"]
