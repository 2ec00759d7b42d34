"""``rlsched trace`` (trainer/cli_trace.py): generate / stats / convert, exit codes, no partial output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from policies.cluster import ClusterSpec
from rlsched.cli import main
from trainer.traces import load_trace

CLUSTER = ClusterSpec.homogeneous(4, 8)
PHILLY_SLICE = (
    "timestamp,duration,num_gpus,gpu_time,cluster\n"
    "2017-10-09 07:01:55,66.0,1,66.0,vcA\n"
    "2017-10-09 06:13:03,2951.0,4,11804.0,vcB\n"
    "2017-10-09 06:13:36,2759.0,64,176576.0,vcA\n"
)


def test_generate_file_and_stats(tmp_path: Path, capsys) -> None:
    out = tmp_path / "heavy.csv"
    assert main(["trace", "generate", "--mix", "heavy", "--jobs", "40", "--seed", "3", "--out", str(out)]) == 0
    jobs = load_trace(out, CLUSTER)
    assert len(jobs) == 40 and all(j.submit_time == 0 for j in jobs)
    out2 = tmp_path / "heavy.parquet"
    assert main(["trace", "generate", "--mix", "heavy", "--jobs", "40", "--seed", "3", "--out", str(out2)]) == 0
    assert load_trace(out2, CLUSTER) == jobs  # same seed, same jobs, either format
    capsys.readouterr()
    assert main(["trace", "stats", str(out), "--cluster", "4x8", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["jobs"] == 40 and s["isolated_duration_s"]["max"] == pytest.approx(3600)
    assert main(["trace", "stats", str(out)]) == 0
    assert "model mix" in capsys.readouterr().out


def test_generate_sets(tmp_path: Path, capsys) -> None:
    out = tmp_path / "sets"
    rc = main(
        [
            "trace",
            "generate",
            "--jobs",
            "20",
            "--arrival",
            "poisson",
            "--load",
            "0.9",
            "--sets",
            "4",
            "--format",
            "parquet",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    assert sorted(p.name for p in out.iterdir()) == [f"set{k}.parquet" for k in range(4)]
    # Refuses to overwrite without --overwrite, and leaves the directory as it was.
    assert main(["trace", "generate", "--jobs", "5", "--sets", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "not empty" in err and "--overwrite" in err
    assert len(list(out.iterdir())) == 4
    assert main(["trace", "generate", "--jobs", "5", "--sets", "2", "--out", str(out), "--overwrite"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["set0.csv", "set1.csv"]
    # --force, the option's earlier name, still works
    assert main(["trace", "generate", "--jobs", "5", "--sets", "3", "--out", str(out), "--force"]) == 0
    assert len(list(out.iterdir())) == 3


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--max-gpus", "64"], "larger than cluster"),
        (["--mix", "mostly-moe"], "bad mix"),
        (["--cluster", "4by8"], "cluster"),
        # each weight finite, the sum not: numpy's "probabilities contain NaN" traceback before
        (["--mix", "1e308:1e308:1e308:1:1:1"], "with a finite sum"),
        (["--mix", "inf:1:1:1:1:1"], "finite"),
    ],
)
def test_generate_bad_options_write_nothing(tmp_path: Path, capsys, extra: list[str], words: str) -> None:
    out = tmp_path / "x.csv"
    assert main(["trace", "generate", "--out", str(out), *extra]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "extra, message",
    [
        # each names the option and its range (not argparse's "invalid int value: '1e3'", nor a later refusal)
        (["--jobs", "0"], "argument --jobs: expected a positive integer, got '0'"),
        (["--jobs", "1e3"], "argument --jobs: expected a positive integer, got '1e3'"),
        (["--min-gpus", "-1"], "argument --min-gpus: expected a positive integer, got '-1'"),
        (["--max-gpus", "0"], "argument --max-gpus: expected a positive integer, got '0'"),
        (["--sets", "0"], "argument --sets: expected a positive integer, got '0'"),
        (["--seed", "-3"], "argument --seed: expected a non-negative integer, got '-3'"),
        (["--seed", "x"], "argument --seed: expected a non-negative integer, got 'x'"),
        (["--arrival", "poisson", "--load", "-1"], "argument --load: must be a positive number, got '-1'"),
        (["--load", "nan"], "argument --load: must be a positive number, got 'nan'"),
        (["--duration", "inf"], "argument --duration: must be a positive number, got 'inf'"),
        (["--duration", "0"], "argument --duration: must be a positive number, got '0'"),
        (["--jitter", "1"], "argument --jitter: must be a number in [0, 1), got '1'"),
        (["--jitter", "-0.1"], "argument --jitter: must be a number in [0, 1), got '-0.1'"),
    ],
)
def test_generate_bad_numbers_are_usage_errors(tmp_path: Path, capsys, extra: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["trace", "generate", "--out", str(tmp_path / "x.csv"), *extra])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err == f"rlsched trace generate: error: {message} (see 'rlsched trace generate --help')\n", err
    assert "invalid" not in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_generate_seed_zero_and_bounds_still_accepted(tmp_path: Path) -> None:
    out = tmp_path / "x.csv"
    argv = ["--jobs", "1", "--seed", "0", "--jitter", "0", "--min-gpus", "1", "--max-gpus", "1", "--sets", "1"]
    assert main(["trace", "generate", *argv, "--out", str(tmp_path / "sets")]) == 0
    assert main(["trace", "generate", "--jobs", "2", "--seed", str(2**70), "--out", str(out)]) == 0  # any seed >= 0
    assert len(load_trace(out, CLUSTER)) == 2


def test_generate_bad_out(tmp_path: Path, capsys) -> None:
    assert main(["trace", "generate", "--out", str(tmp_path / "x.txt")]) == 2
    assert main(["trace", "generate", "--sets", "2", "--out", str(tmp_path / "x.csv")]) == 2
    (tmp_path / "keep.csv").write_text("mine")
    assert main(["trace", "generate", "--out", str(tmp_path / "keep.csv")]) == 2
    assert main(["trace", "generate", "--out", str(tmp_path / "keep.csv" / "x.csv")]) == 2
    assert (tmp_path / "keep.csv").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.csv"]
    # Missing parents are created for a good output.
    assert main(["trace", "generate", "--jobs", "3", "--out", str(tmp_path / "a" / "b" / "x.csv")]) == 0
    assert main(["trace", "generate", "--jobs", "3", "--sets", "2", "--out", str(tmp_path / "c" / "sets")]) == 0
    assert len(load_trace(tmp_path / "a" / "b" / "x.csv", CLUSTER)) == 3
    assert sorted(p.name for p in (tmp_path / "c" / "sets").iterdir()) == ["set0.csv", "set1.csv"]


@pytest.mark.parametrize("bw", ["intra_bw_gbps = nan", "inter_bw_gbps = inf", "inter_bw_gbps = -inf"])
def test_generate_non_finite_bandwidth_exits_2(tmp_path: Path, capsys, bw: str) -> None:
    cluster = tmp_path / "c.toml"
    cluster.write_text(f"{bw}\n[[nodes]]\ngpus = 4\ncount = 2\n")
    out = tmp_path / "g.csv"
    argv = ["trace", "generate", "--jobs", "4", "--cluster", str(cluster), "--max-gpus", "4", "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(cluster) in err and f"bandwidths must be positive and finite: {bw}" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.toml"]


@pytest.mark.parametrize(
    "argv, words",
    [
        (["generate", "--jobs", "3", "--sets", "2", "--out", "."], "is the current directory or contains it"),
        (["generate", "--jobs", "3", "--sets", "2", "--out", ".", "--overwrite"], "is the current directory"),
        (["generate", "--jobs", "3", "--sets", "2", "--out", "..", "--overwrite"], "is the current directory"),
        (["generate", "--jobs", "3", "--out", "."], "output must be a file name ending in .csv"),
        (["convert", "t.csv", "--out", "."], "output must be a file name ending in .csv, .parquet, .pq or .json"),
        (["convert", "t.csv", "--out", "..", "--overwrite"], "output must be a file name"),
    ],
)
def test_out_dot_is_refused(tmp_path: Path, monkeypatch, capsys, argv: list[str], words: str) -> None:
    """``--out .`` is refused with one line (not "PosixPath('.') has an empty name"); with --overwrite it must not
    replace the cwd."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "t.csv").write_text("job_id,submit_time,model,gpu_demand,total_samples\na,0,MoE,8,10\n")
    monkeypatch.chdir(work)
    assert main(["trace", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err, err
    assert "--sets" not in err or argv[0] == "generate"  # convert has no --sets option to suggest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"]
    assert sorted(p.name for p in work.iterdir()) == ["t.csv"]


_BAD_UTF8_CSV = b"job_id,submit_time,model,gpu_demand,total_samples\na,0,GNN,2,1000\n\xff,0,IMG,2,1000\n"


@pytest.mark.parametrize(
    "name, text, where",
    [
        (
            "t.csv",
            "job_id,submit_time,model,gpu_demand,total_samples\na,0,MoE,8,10\nb,-1,MoE,8,10\n",
            "row 3, field 'submit_time'",
        ),
        ("t.csv", "job_id,submit_time,model,gpu_demand,total_samples\na,0,Llama,8,10\n", "row 2, field 'model'"),
        ("t.csv", "job_id,submit_time,model,gpu_demand,total_samples\na,0,MoE,33,10\n", "row 2, field 'gpu_demand'"),
        (
            "t.csv",
            "job_id,submit_time,model,gpu_demand,total_samples\na,0,MoE,8,10\na,0,MoE,8,10\n",
            "row 3, field 'job_id'",
        ),
        ("t.csv", "job_id,submit_time,gpu_demand,total_samples\na,0,8,10\n", "row 1, field 'model'"),
        ("t.csv", "", "empty file"),
        ("p.csv", PHILLY_SLICE + "2017-10-09 06:13:36,x,1,1,vcA\n", "row 5, field 'duration'"),
        ("t.csv", _BAD_UTF8_CSV, "not UTF-8 text: byte 0xff at line 3"),
        ("p.csv", PHILLY_SLICE.encode() + b"\xff,1,1,1,vc\n", "not UTF-8 text: byte 0xff at line 5"),
        ("t.json", b'{"a\xff": {"model": "GNN", "gpu_demand": 2, "total_samples_to_train": 1}}', "not UTF-8 text"),
        # A ragged row was accepted, and convert wrote a nameless column or crashed.
        (
            "t.csv",
            "job_id,submit_time,model,gpu_demand,total_samples,user\na,0,GNN,2,1000,alice\nb,0,IMG,2,1000,bob,oops\n",
            "row 3: expected 6 fields as in the header, got 7",
        ),
        # after a blank line, rows are still file lines
        (
            "t.csv",
            "job_id,submit_time,model,gpu_demand,total_samples\na,0,GNN,2,1\n\nb,0,X,2,1\n",
            "row 4, field 'model'",
        ),
        (
            "t.json",
            '{"a": {"model": "GNN", "gpu_demand": 2, "total_samples_to_train": 1}, '
            '"a": {"model": "IMG", "gpu_demand": 4, "total_samples_to_train": 1}}',
            "row a, field 'job_id': duplicate job id 'a'",
        ),
        ("t.json", '{"a": {"model": "GNN", "gpu_demand": true, "total_samples_to_train": 1}}', "field 'gpu_demand'"),
    ],
)
def test_bad_trace_exits_2_and_writes_nothing(
    tmp_path: Path, capsys, name: str, text: str | bytes, where: str
) -> None:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    assert main(["trace", "stats", str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and where in err and err.count("\n") == 1, err
    out = tmp_path / "out.parquet"
    assert main(["trace", "convert", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and where in err and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]
    # An existing output is left as it was, even with --overwrite.
    out.write_text("mine")
    assert main(["trace", "convert", str(path), "--out", str(out), "--overwrite"]) == 2
    assert out.read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([name, "out.parquet"])


def test_convert_philly_slice(tmp_path: Path, capsys) -> None:
    src = tmp_path / "philly.csv"
    src.write_text(PHILLY_SLICE)
    out = tmp_path / "c.parquet"
    assert (
        main(["trace", "convert", str(src), "--cluster", "4x8", "--seed", "5", "--vc", "vcA", "--out", str(out)]) == 0
    )
    jobs = load_trace(out, CLUSTER)
    assert {j.job_id for j in jobs} == {"0", "2"}
    assert max(j.gpu_demand for j in jobs) == 32
    assert {j.extra["vc"] for j in jobs} == {"vcA"}
    capsys.readouterr()
    assert main(["trace", "stats", str(src), "--window-h", "0:0.5", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["jobs"] == 2
    assert main(["trace", "stats", str(src), "--window-h", "5"]) == 2
    assert main(["trace", "stats", str(src), "--oversize", "error"]) == 2
    assert "row 4, field 'num_gpus'" in capsys.readouterr().err


def test_trace_without_action_is_usage_error(capsys) -> None:
    with pytest.raises(SystemExit) as ei:
        main(["trace"])
    assert ei.value.code == 2


@pytest.mark.parametrize(
    "extra, words",
    [
        # each would write inf (or raise ZeroDivisionError), and every later read would refuse the file
        (["--duration", "1e306"], "job 1: total_samples overflows the float range (inf); lower duration_s (1e+306)"),
        (["--arrival", "poisson", "--load", "2e-305"], "submit_time overflows the float range (inf); raise load"),
        (["--arrival", "poisson", "--load", "5e-324"], "mean gap between arrivals beyond the float range"),
    ],
)
@pytest.mark.parametrize("sets", [[], ["--sets", "2"]])
def test_generate_overflow_exits_2_and_writes_nothing(
    tmp_path: Path, capsys, extra: list[str], words: str, sets: list[str]
) -> None:
    out = tmp_path / "new" / ("sets" if sets else "x.csv")
    assert main(["trace", "generate", "--out", str(out), *sets, *extra]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("action", ["stats", "convert"])
@pytest.mark.parametrize("option", ["--gpu-scale", "--time-scale"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-2", "x"])
def test_philly_scales_must_be_finite_and_positive(
    tmp_path: Path, capsys, action: str, option: str, value: str
) -> None:
    """--gpu-scale nan passed the `must be positive` check and ended in a traceback."""
    src = tmp_path / "philly.csv"
    src.write_text(PHILLY_SLICE)
    argv = ["trace", action, str(src), f"{option}={value}"]
    if action == "convert":
        argv += ["--out", str(tmp_path / "o.csv")]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    expected = "expected a number" if value == "x" else "must be a positive number"
    assert f"error: argument {option}: {expected}, got {value!r}" in err
    assert [p.name for p in tmp_path.iterdir()] == ["philly.csv"]


@pytest.mark.parametrize("name", ["t.csv", "t.parquet", "t.json"])
@pytest.mark.parametrize(
    "extra, flags",
    [
        (["--limit", "2"], "--limit applies"),
        (["--sample", "0.5", "--limit", "2"], "--sample and --limit apply"),
        (["--seed", "1", "--vc", "a", "--window-h", "0:1"], "--seed, --vc and --window-h apply"),
        (
            ["--gpu-scale", "2", "--time-scale", "0.5", "--mix", "heavy", "--oversize", "drop"],
            "--mix, --gpu-scale, --time-scale and --oversize apply",
        ),
    ],
)
def test_philly_options_on_another_trace_are_refused(
    tmp_path: Path, capsys, name: str, extra: list[str], flags: str
) -> None:
    """--limit / --sample are refused for a canonical trace rather than silently ignored."""
    from policies.job import JobSpec
    from trainer.traces import write_trace

    src = tmp_path / name
    write_trace(src, [JobSpec(str(i), float(i), "MoE", 8, 1000.0) for i in range(5)])
    kind = "DeepShare JSON" if name.endswith(".json") else "canonical CSV/Parquet"
    for action in (["stats"], ["convert", "--out", str(tmp_path / "o.csv")]):
        assert main(["trace", action[0], str(src), *extra, *action[1:]]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{src} is a {kind} trace; {flags} only to Philly CSV input" in err, err
    assert [p.name for p in tmp_path.iterdir()] == [name]
    assert main(["trace", "stats", str(src), "--json"]) == 0  # without them it is read
    assert json.loads(capsys.readouterr().out)["jobs"] == 5


def test_limit_and_sample_still_apply_to_philly(tmp_path: Path, capsys) -> None:
    src = tmp_path / "philly.csv"
    src.write_text(PHILLY_SLICE)
    assert main(["trace", "stats", str(src), "--limit", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["jobs"] == 1
    assert main(["trace", "stats", str(src), "--sample", "1", "--seed", "0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["jobs"] == 3
    with pytest.raises(SystemExit):
        main(["trace", "stats", str(src), "--limit", "0"])
    assert "argument --limit: expected a positive integer, got '0'" in capsys.readouterr().err
    for value in ("0", "1.5", "nan"):
        with pytest.raises(SystemExit):
            main(["trace", "stats", str(src), "--sample", value])
        assert f"argument --sample: must be a number in (0, 1], got {value!r}" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["trace", "convert", str(src), "--seed", "-1", "--out", str(tmp_path / "o.csv")])
    assert "argument --seed: expected a non-negative integer, got '-1'" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["philly.csv"]


# ---------------------------------------------------------------------- options that would be ignored; limits
@pytest.mark.parametrize(
    "extra, message",
    [
        # wrote CSV with rc 0: --format only applies to --sets
        (["--format", "parquet"], "--format applies only with --sets; a single --out file's format follows its suffix"),
        (["--format", "csv"], "--format applies only with --sets"),
        # the default arrival is zero: every job at t=0 whatever the load
        (["--load", "0.5"], "--load applies only with --arrival poisson (with zero arrivals every job comes at t=0)"),
        (["--arrival", "zero", "--load", "0.9"], "--load applies only with --arrival poisson"),
        (["--jobs", "1000000000"], "num_jobs 1000000000 is more than the generator's limit of 1,000,000 jobs"),
        (["--jobs", "200000", "--sets", "10"], "10 sets of 200000 jobs are 2,000,000 jobs"),
    ],
)
def test_generate_refuses_ignored_options_and_too_many_jobs(
    tmp_path: Path, capsys, extra: list[str], message: str
) -> None:
    out = tmp_path / ("sets" if "--sets" in extra else "b.csv")
    assert main(["trace", "generate", "--out", str(out), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rlsched trace generate: error: {message}") and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []


def test_generate_format_and_load_still_work_where_they_apply(tmp_path: Path) -> None:
    out = tmp_path / "sets"
    argv = ["--jobs", "5", "--sets", "2", "--format", "json", "--arrival", "poisson", "--load", "0.5"]
    assert main(["trace", "generate", *argv, "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["set0.json", "set1.json"]
    assert load_trace(out / "set1.json", CLUSTER)[-1].submit_time > 0


def test_convert_csv_to_json_and_back_keeps_extra_columns(tmp_path: Path) -> None:
    """`user` was lost on the way through DeepShare JSON."""
    src = tmp_path / "u.csv"
    src.write_text("job_id,submit_time,model,gpu_demand,total_samples,user\na,0,MoE,2,10,bob\n")
    assert main(["trace", "convert", str(src), "--out", str(tmp_path / "u.json")]) == 0
    assert main(["trace", "convert", str(tmp_path / "u.json"), "--out", str(tmp_path / "u2.csv")]) == 0
    assert (tmp_path / "u2.csv").read_text().splitlines() == [
        "job_id,submit_time,model,gpu_demand,total_samples,user",
        "a,0.0,MoE,2,10.0,bob",
    ]


def test_convert_refuses_far_submit_time_and_writes_nothing(tmp_path: Path, capsys) -> None:
    src = tmp_path / "t.csv"
    src.write_text("job_id,submit_time,model,gpu_demand,total_samples\na,1e12,MoE,2,10\n")
    out = tmp_path / "t.json"
    assert main(["trace", "convert", str(src), "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"rlsched trace: error: {src}, row 2, field 'submit_time': '1e12' is beyond the largest submit time "
        "1e+09 s (about 31.7 years)\n"
    )
    assert not out.exists()


def test_generate_sets_overwrite_replaces_only_earlier_sets(tmp_path, capsys):
    """`trace generate --sets N --out DIR --overwrite` replaces DIR only when it holds earlier job sets;
    a DIR holding anything else (a thesis.tex) is refused and left as it is."""
    out = tmp_path / "d"
    out.mkdir()
    (out / "thesis.tex").write_text("precious")
    argv = ["trace", "generate", "--sets", "2", "--jobs", "8", "--cluster", "2x4", "--out", str(out), "--overwrite"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "holds 'thesis.tex', which is not a job set" in err and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in out.iterdir()) == ["thesis.tex"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]  # no temporary sibling left
    (out / "thesis.tex").unlink()
    assert main(argv) == 0
    argv[3] = "3"
    assert main(argv) == 0  # its own earlier sets are replaced
    assert sorted(p.name for p in out.iterdir()) == ["set0.csv", "set1.csv", "set2.csv"]


@pytest.mark.parametrize(
    "name, text, words",
    [
        ("long.json", '{"a": {"model": "IMG", "gpu_demand": ' + "1" * 5000 + ', "total_samples_to_train": 9}}',
         "an integer of 5000 digits"),
        ("sur.json", '{"\\ud800": {"model": "IMG", "gpu_demand": 1, "total_samples_to_train": 9}}', "lone surrogate"),
        ("esc.csv", "job_id,submit_time,model\x1b[2J,gpu_demand,total_samples\nj,0,IMG,1,9\n", "\\x1b[2J"),
    ],
)
@pytest.mark.parametrize("action", ["stats", "convert"])
def test_input_errors_are_one_escaped_line_exit_2(tmp_path: Path, capsys, name, text, words, action) -> None:
    p = tmp_path / name
    p.write_text(text)
    argv = ["trace", action, str(p)] + (["--out", str(tmp_path / "o.csv")] if action == "convert" else [])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err and "\x1b" not in err and "Traceback" not in err
    assert not (tmp_path / "o.csv").exists()


def test_checkpoint_command_is_shown_escaped(tmp_path: Path, capsys) -> None:
    """``rlsched checkpoint`` shows ``training.command`` with terminal escapes escaped and rich markup as text."""
    import shutil

    repo = Path(__file__).resolve().parents[1] / "policies" / "checkpoints"
    for suffix in (".json", ".safetensors"):
        shutil.copy(repo / f"rl-base-4x8{suffix}", tmp_path / f"ck{suffix}")
    meta = json.loads((tmp_path / "ck.json").read_text())
    meta["weights_file"] = "ck.safetensors"
    meta["training"].pop("commands", None)
    meta["training"]["command"] = "rlsched \x1b]0;owned\x07train [bold red]--x[/] \x1b[2J"
    (tmp_path / "ck.json").write_text(json.dumps(meta))
    assert main(["checkpoint", str(tmp_path / "ck")]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "[bold red]--x[/]" in out and "\\x1b]0;owned\\x07train" in out  # shown, not interpreted
