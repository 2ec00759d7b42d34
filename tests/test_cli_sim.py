"""``rlsched simulate`` end to end, and its refusals of bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rlsched.cli import main
from trainer import report

REPO = Path(__file__).resolve().parents[1]
TRACE0 = REPO / "data" / "traces" / "deepshare" / "simulate" / "trace0.json"


def test_end_to_end_trace0(tmp_path, capsys):
    out = tmp_path / "runs" / "sim0"  # parent does not exist yet: created on success
    rc = main(["simulate", "--trace", str(TRACE0), "--policy", "fifo,srtf", "--cluster", "4x8", "--out", str(out)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(["jobs_fifo.parquet", "jobs_srtf.parquet", "summary.json", *report.PLOT_FILES])
    # No temporary directories left next to the output.
    assert [p.name for p in out.parent.iterdir()] == ["sim0"]
    doc = json.loads((out / "summary.json").read_text())
    assert doc["policies"] == ["fifo", "srtf"]
    assert doc["jobs"] == 256
    assert doc["cluster"]["describe"] == "4x8" and len(doc["cluster"]["nodes"]) == 4
    assert doc["trace"] == str(TRACE0.resolve())
    assert doc["config"]["round_len_s"] == 300.0 and doc["config"]["event_triggered"] is True
    for pol in ("fifo", "srtf"):
        s = doc["summaries"][pol]
        assert s["jobs"] == s["finished"] == 256
        assert 0 < s["avg_util"] <= 1
        assert s["p99_jct_s"] >= s["p90_jct_s"] >= s["median_jct_s"] > 0
        assert s["makespan_s"] >= s["max_jct_s"]
        t = pq.read_table(out / f"jobs_{pol}.parquet")
        assert t.num_rows == 256
        assert abs(sum(t.column("jct").to_pylist()) / 256 - s["avg_jct_s"]) < 1e-6 * s["avg_jct_s"]
    # SRTF beats FIFO's average JCT on this trace (all jobs arrive at once).
    assert doc["summaries"]["srtf"]["avg_jct_s"] < doc["summaries"]["fifo"]["avg_jct_s"]
    # The table went to stdout.
    assert "Avg JCT (h)" in captured.out and "fifo" in captured.out and "srtf" in captured.out
    assert f"{doc['summaries']['fifo']['avg_jct_s'] / 3600:.2f}" in captured.out


def test_options_reach_the_simulator(tmp_path, capsys):
    out = tmp_path / "o"
    rc = main([
        "simulate", "--trace", str(TRACE0), "--policy", "las", "--cluster", "4x8", "--out", str(out),
        "--round", "600", "--no-event-trigger", "--restart-overhead", "60", "--noise-cv", "0.2", "--seed", "3",
        "--metrics-interval", "1200", "--quiet",
    ])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert captured.out == ""
    doc = json.loads((out / "summary.json").read_text())
    assert doc["config"] == {
        "round_len_s": 600.0, "event_triggered": False, "restart_overhead_s": 60.0, "noise_cv": 0.2,
        "seed": 3, "metrics_interval_s": 1200.0, "contention": "sum",
    }
    assert doc["summaries"]["las"]["util_grid_step_s"] == 600.0


def test_contention_rule_reaches_the_simulator(tmp_path, capsys):
    """``--contention`` picks the ledger's rule: recorded in summary.json, and ``ds-min`` never exceeds its
    bound 1 / 0.35 while ``sum`` and ``link`` on the same trace and policy give other slowdowns."""
    from policies.ledger import DS_CS_CAP

    cs = {}
    for rule in ("sum", "ds-min", "link"):
        out = tmp_path / rule
        assert main(["simulate", "--trace", str(TRACE0), "--policy", "las", "--out", str(out), "--quiet",
                     "--contention", rule]) == 0, capsys.readouterr().err
        doc = json.loads((out / "summary.json").read_text())
        assert doc["config"]["contention"] == rule
        cs[rule] = (doc["summaries"]["las"]["avg_cs"], doc["summaries"]["las"]["max_cs"])
    assert cs["ds-min"][1] <= DS_CS_CAP + 1e-12
    assert len({v[0] for v in cs.values()}) == 3


def test_unknown_contention_rule_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--trace", str(TRACE0), "--out", str(tmp_path / "o"), "--contention", "max"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "invalid choice: 'max' (choose from 'sum', 'link', 'ds-min')" in err
    assert not (tmp_path / "o").exists()


def test_baseline_policies_by_name(tmp_path, capsys):
    """The baselines run from the command line on a hand-made 1x8 trace (MoE jobs at t = 0, no two fit
    together: a 5 GPUs 1.2 h, b 6 GPUs 0.5 h, c 8 GPUs 1 h, d 8 GPUs 0.25 h); the start times are worked
    out by hand: each job starts when the one before it ends, in the order's sequence."""
    from policies.cluster import ClusterSpec
    from policies.perf import ContentionModel

    perf = ContentionModel(ClusterSpec.parse("1x8"))
    rows = ["job_id,submit_time,model,gpu_demand,total_samples"]
    for jid, g, h in [("a", 5, 1.2), ("b", 6, 0.5), ("c", 8, 1.0), ("d", 8, 0.25)]:
        rows.append(f"{jid},0.0,MoE,{g},{h * 3600.0 * perf.best_isolated_throughput('MoE', g)!r}")
    trace = tmp_path / "t.csv"
    trace.write_text("\n".join(rows) + "\n")
    out = tmp_path / "o"
    pols = ["sif", "lgtf", "lrf", "las2d", "srtf:nosplit", "greedy", "lgtf-np:nosplit"]
    rc = main(["simulate", "--trace", str(trace), "--policy", ",".join(pols), "--cluster", "1x8", "--out", str(out),
               "--quiet"])
    assert rc == 0, capsys.readouterr().err
    doc = json.loads((out / "summary.json").read_text())
    assert doc["policies"] == pols
    starts = {"sif": {"d": 0.0, "b": 0.25, "c": 0.75, "a": 1.75},  # shortest ideal time
              "lgtf": {"d": 0.0, "b": 0.25, "a": 0.75, "c": 1.95},  # GPU-time 2, 3, 6, 8
              "lrf": {"a": 0.0, "b": 1.2, "c": 1.7, "d": 2.7}}  # GPUs 5, 6, 8, 8
    starts["srtf:nosplit"] = starts["greedy"] = starts["sif"]
    starts["lgtf-np:nosplit"] = starts["lgtf"]
    for pol, want in starts.items():
        t = pq.read_table(out / doc["files"][pol]).to_pydict()
        got = {j: s / 3600.0 for j, s in zip(t["job_id"], t["first_start"])}
        assert got == {j: pytest.approx(v, abs=1e-6) for j, v in want.items()}, pol


def test_unknown_placement_lists_the_placements(tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(["simulate", "--trace", str(TRACE0), "--policy", "srtf:nosplt", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert "'nosplt'" in err and all(p in err for p in ("pack", "nosplit", "spread", "greedy"))
    assert not out.exists()


def _assert_refused(argv, out: Path, capsys, needle: str):
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2
    assert needle in err
    assert len(err.strip().splitlines()) == 1, err
    assert not out.exists()
    assert not any(p.name.startswith(f".{out.name}") for p in out.parent.iterdir())


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--policy", "fifo,nosuch"], "unknown policy 'nosuch'"),
        (["--policy", "fifo,fifo"], "listed twice"),
        (["--policy", "fifo,"], "bad --policy"),
        (["--cluster", "4y8"], "bad cluster spec '4y8'"),
        (["--trace", "/nonexistent/trace.json"], "no such file"),
    ],
)
def test_bad_input_exit_2_and_no_output(tmp_path, capsys, extra, needle):
    out = tmp_path / "out"
    argv = ["simulate", "--trace", str(TRACE0), "--policy", "fifo,srtf", "--cluster", "4x8", "--out", str(out), *extra]
    _assert_refused(argv, out, capsys, needle)


def test_rl_policy_unavailable_or_unknown_is_a_clear_error(tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(["simulate", "--trace", str(TRACE0), "--policy", "fifo,rl-nosuch-checkpoint", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "rl-nosuch-checkpoint" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_trace_too_big_for_cluster(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text("job_id,submit_time,model,gpu_demand,total_samples\na,0,MoE,16,1000\n")
    out = tmp_path / "out"
    _assert_refused(["simulate", "--trace", str(trace), "--cluster", "1x8", "--out", str(out)], out, capsys, "row 2")


def test_existing_output_is_protected_and_overwrite_replaces_it(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    argv = ["simulate", "--trace", str(TRACE0), "--policy", "fifo", "--out", str(out), "--quiet"]
    assert main(argv) == 2
    assert "not empty" in capsys.readouterr().err
    assert (out / "keep.txt").read_text() == "mine"
    # --overwrite replaces an earlier simulate output only: a directory with other files is refused, untouched
    assert main([*argv, "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "holds 'keep.txt', which simulate did not write" in err and len(err.strip().splitlines()) == 1
    assert (out / "keep.txt").read_text() == "mine"
    (out / "keep.txt").unlink()
    assert main(argv) == 0
    first = (out / "summary.json").read_text()
    assert main(argv) == 2  # not empty now
    assert main([*argv, "--overwrite", "--policy", "srtf"]) == 0  # replaces its own earlier output
    assert (out / "summary.json").read_text() != first and (out / "jobs_srtf.parquet").exists()
    assert not (out / "jobs_fifo.parquet").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    # something that only looks like one (a stray file, a summary.json of something else) is refused too
    (out / "notes.md").write_text("x")
    assert main([*argv, "--overwrite"]) == 2 and (out / "notes.md").exists()
    (out / "notes.md").unlink()
    (out / "summary.json").write_text("{}")
    assert main([*argv, "--overwrite"]) == 2 and "no simulate summary.json" in capsys.readouterr().err


def test_empty_existing_output_dir_is_used(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    assert main(["simulate", "--trace", str(TRACE0), "--policy", "fifo", "--out", str(out), "--quiet"]) == 0
    assert (out / "jobs_fifo.parquet").exists()


def test_failure_while_writing_leaves_nothing(tmp_path, monkeypatch, capsys):
    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(report, "write_plots", boom)
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="disk full"):
        main(["simulate", "--trace", str(TRACE0), "--policy", "fifo", "--out", str(out), "--quiet"])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("value", ["-5", "0", "0.0001", "0.999", "nan", "inf"])
def test_bad_round_is_refused(tmp_path, capsys, value):
    """--round 0.0001 once took 19 GB (one utilisation sample per round of the makespan): refused by argparse."""
    with pytest.raises(SystemExit) as exc:  # (the trace does not exist: a missed refusal fails fast)
        main(["simulate", "--trace", str(tmp_path / "none.csv"), "--out", str(tmp_path / "o"), "--round", value])
    assert exc.value.code == 2
    assert f"argument --round: must be a number >= 1, got '{value}'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_shortest_round_runs(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("job_id,submit_time,model,gpu_demand,total_samples\na,0,GNN,2,1000\nb,5,IMG,4,2000\n")
    out = tmp_path / "o"
    argv = ["simulate", "--trace", str(trace), "--policy", "fifo", "--round", "1", "--out", str(out), "--quiet"]
    assert main(argv) == 0
    assert json.loads((out / "summary.json").read_text())["config"]["round_len_s"] == 1.0


def test_default_trace_is_found_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["simulate", "--policy", "fifo", "--out", "o", "--quiet"]) == 0
    doc = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert doc["trace"] == str(TRACE0.resolve()) and doc["jobs"] == 256


@pytest.mark.parametrize("seed", ["-1", str(2**32), "x"])
def test_bad_seed_is_refused(tmp_path, capsys, seed):
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--trace", str(TRACE0), "--out", str(tmp_path / "o"), "--seed", seed, "--quiet"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "argument --seed" in err and "Traceback" not in err
    assert ("[0, 2**32 - 1]" if seed != "x" else "expected an integer") in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("out", [".", "..", "sub/..", ""])
def test_out_that_is_the_working_directory_or_above_is_refused(tmp_path, monkeypatch, capsys, out):
    """`--out .` would replace the directory the shell is in: refused with one line, nothing moved."""
    here = tmp_path / "here"
    (here / "sub").mkdir(parents=True)
    (here / "keep").write_text("mine")
    monkeypatch.chdir(here)
    rc = main(["simulate", "--trace", str(TRACE0), "--policy", "fifo", "--out", out, "--overwrite", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "is the current directory or one of its parents" in err
    assert len(err.strip().splitlines()) == 1
    assert (here / "keep").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["here"] and sorted(p.name for p in here.iterdir()) == [
        "keep",
        "sub",
    ]


def test_out_with_dot_dot_is_normalised(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a").mkdir()
    assert main(["simulate", "--trace", str(TRACE0), "--policy", "fifo", "--out", "a/b/..", "--quiet"]) == 0
    assert (tmp_path / "a" / "summary.json").is_file() and not (tmp_path / "a" / "b").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]


def test_outputs_that_cannot_be_written_are_refused_before_any_work(tmp_path, capsys, monkeypatch):
    """A directory the user cannot write in (permissions, read-only mount) is found by a probe before anything
    runs, for every command that writes results; the error names the flag and the directory."""
    import tempfile

    from trainer import outputs

    locked = tmp_path / "locked"
    locked.mkdir()
    real = tempfile.mkstemp

    def mkstemp(*a, dir=None, **kw):  # noqa: A002 - tempfile's name
        if dir is not None and Path(dir) == locked:
            raise PermissionError(13, "Permission denied")
        return real(*a, dir=dir, **kw)

    monkeypatch.setattr(outputs.tempfile, "mkstemp", mkstemp)
    assert outputs.unwritable(locked / "a" / "b") == f"cannot write in {locked} (Permission denied)"
    assert outputs.unwritable(tmp_path / "ok" / "b") is None
    (tmp_path / "file").write_text("x")
    assert outputs.unwritable(tmp_path / "file" / "b") == f"{tmp_path / 'file'} is not a directory"
    out = locked / "sim"
    cases = [
        (["simulate", "--trace", str(TRACE0), "--policy", "fifo", "--out", str(out)], f"--out {out}: cannot write in"),
        (["trace", "generate", "--jobs", "4", "--out", str(locked / "t.csv")], "cannot write in"),
        (["trace", "generate", "--jobs", "4", "--sets", "2", "--out", str(locked / "sets")], "cannot write in"),
        (["evaluate", "--policies", "fifo", "--traces", str(TRACE0.parent), "--out", str(out)], f"--out {out}: cannot write"),
        (["train", "--traces", str(TRACE0.parent), "--timesteps", "64", "--out", str(out)], f"--out {out}: cannot write"),
    ]
    for argv, needle in cases:
        rc = main(argv)
        err = capsys.readouterr().err
        assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1, (argv, err)
        assert list(locked.iterdir()) == [], argv


def test_overwrite_never_deletes_the_trace_it_reads(tmp_path, capsys):
    out = tmp_path / "runs"
    out.mkdir()
    trace = out / TRACE0.name
    shutil.copy(TRACE0, trace)
    rc = main(["simulate", "--trace", str(trace), "--policy", "fifo", "--out", str(out), "--overwrite"])
    err = capsys.readouterr().err
    assert rc == 2 and "which simulate did not write" in err and len(err.strip().splitlines()) == 1, err
    assert trace.exists()
