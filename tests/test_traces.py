"""Canonical trace readers/writers (trainer/traces.py): round trips, DeepShare JSON, bad input."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.cluster import ClusterSpec
from policies.job import JobSpec
from policies.perf import ContentionModel
from policies.workloads import MODELS
from trainer.traces import (
    MAX_SUBMIT_TIME_S,
    TRACE_SUFFIXES,
    TraceError,
    load_trace,
    read_canonical,
    read_deepshare_json,
    trace_format,
    write_trace,
)

REPO = Path(__file__).resolve().parents[1]
DEEPSHARE = REPO / "data" / "traces" / "deepshare"
CLUSTER = ClusterSpec.homogeneous(4, 8)


@pytest.fixture(scope="module")
def perf() -> ContentionModel:
    return ContentionModel(CLUSTER)


def _jobs_strategy():
    job = st.tuples(
        st.floats(min_value=0, max_value=1e7, allow_nan=False, allow_infinity=False),
        st.sampled_from(MODELS),
        st.integers(min_value=1, max_value=32),
        st.floats(min_value=1e-3, max_value=1e13, allow_nan=False, allow_infinity=False),
    )
    return st.lists(job, min_size=1, max_size=30).map(
        lambda rows: [JobSpec(f"j{i}", s, m, g, w) for i, (s, m, g, w) in enumerate(rows)]
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(jobs=_jobs_strategy(), suffix=st.sampled_from(TRACE_SUFFIXES))
def test_round_trip_every_format(tmp_path: Path, jobs: list[JobSpec], suffix: str) -> None:
    path = tmp_path / f"t{suffix}"
    write_trace(path, jobs)
    back = load_trace(path, CLUSTER)
    assert back == jobs  # JobSpec equality: id, submit time, model, demand, samples (exact floats)
    assert not list(tmp_path.glob(".*.tmp"))


def test_round_trip_keeps_extra_columns(tmp_path: Path) -> None:
    jobs = [JobSpec("a", 0.0, "MoE", 8, 1000.0, {"user": "u1"}), JobSpec("b", 5.0, "DLRM", 2, 10.0, {"user": "Zoë"})]
    for suffix in (".csv", ".parquet", ".pq"):
        write_trace(tmp_path / f"x{suffix}", jobs)
        back = read_canonical(tmp_path / f"x{suffix}", CLUSTER)
        assert [j.extra["user"] for j in back] == ["u1", "Zoë"]  # CSV is written as UTF-8 whatever the locale


def test_aliases_and_duration_column(tmp_path: Path, perf: ContentionModel) -> None:
    p = tmp_path / "d.csv"
    p.write_text("job_id,submit_time,model,gpu_demand,duration\n1,0,gnn,4,3600\n2,10,LM,16,60\n")
    jobs = read_canonical(p, CLUSTER, perf)
    assert [j.model for j in jobs] == ["GraphSage", "Transformer-XL"]
    assert jobs[0].total_samples == pytest.approx(3600 * perf.best_isolated_throughput("GraphSage", 4))
    assert jobs[1].total_samples == pytest.approx(60 * perf.best_isolated_throughput("Transformer-XL", 16))


def test_deepshare_json_real_jobset() -> None:
    path = DEEPSHARE / "train" / "jobset0" / "episode0.json"
    jobs = read_deepshare_json(path, CLUSTER)
    raw = json.loads(path.read_text())
    assert len(jobs) == len(raw) == 256
    assert all(j.submit_time == 0 for j in jobs)
    assert {j.gpu_demand for j in jobs} <= {2, 4, 8}
    assert {j.model for j in jobs} <= set(MODELS)
    assert jobs[0].job_id == "0" and jobs[0].total_samples == raw["0"]["total_samples_to_train"]
    # load_trace picks the same reader by extension.
    assert load_trace(path, CLUSTER) == jobs


def test_deepshare_simulate_trace_loads() -> None:
    jobs = load_trace(DEEPSHARE / "simulate" / "trace0.json", CLUSTER)
    assert len(jobs) > 0 and len({j.job_id for j in jobs}) == len(jobs)


def test_load_trace_dispatches_philly(tmp_path: Path) -> None:
    p = tmp_path / "p.csv"
    p.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-09 07:01:55,66.0,1,66.0,vc1\n")
    jobs = load_trace(p, CLUSTER, seed=3)
    assert len(jobs) == 1 and jobs[0].extra["vc"] == "vc1"
    assert trace_format(p) == "philly"


# --------------------------------------------------------------------- bad input
HEADER = "job_id,submit_time,model,gpu_demand,total_samples\n"
GOOD = "a,0,MoE,8,1000\n"


def _where(exc: TraceError, path: Path, row: int | str | None, field: str | None) -> None:
    msg = str(exc)
    assert str(path) in msg
    if row is not None:
        assert re.search(rf"\brow {row}\b", msg), msg
        assert exc.row == row
    if field is not None:
        assert f"field {field!r}" in msg, msg
        assert exc.column == field


@pytest.mark.parametrize(
    "name, text, row, field, words",
    [
        ("missing_column", "job_id,submit_time,gpu_demand,total_samples\na,0,8,1\n", 1, "model", "missing column"),
        ("missing_work", "job_id,submit_time,model,gpu_demand\na,0,MoE,8\n", 1, "total_samples", "missing column"),
        ("bad_number", HEADER + GOOD + "b,soon,MoE,8,1000\n", 3, "submit_time", "expected a number"),
        ("bad_samples", HEADER + "a,0,MoE,8,lots\n", 2, "total_samples", "expected a number"),
        ("negative_time", HEADER + GOOD + GOOD.replace("a,0", "b,-5"), 3, "submit_time", "negative"),
        ("nan_time", HEADER + "a,nan,MoE,8,1000\n", 2, "submit_time", "finite"),
        ("unknown_model", HEADER + GOOD + "b,0,ResNet,8,1000\n", 3, "model", "unknown model"),
        ("too_big", HEADER + "a,0,MoE,64,1000\n", 2, "gpu_demand", "larger than the cluster"),
        ("zero_gpus", HEADER + "a,0,MoE,0,1000\n", 2, "gpu_demand", "positive"),
        ("frac_gpus", HEADER + "a,0,MoE,2.5,1000\n", 2, "gpu_demand", "integer"),
        ("zero_samples", HEADER + "a,0,MoE,8,0\n", 2, "total_samples", "positive"),
        ("duplicate_id", HEADER + GOOD + GOOD + GOOD.replace("a,", "c,"), 3, "job_id", "duplicate job id"),
        ("empty_id", HEADER + ",0,MoE,8,1000\n", 2, "job_id", "empty job id"),
        ("extra_field", HEADER + GOOD + "b,0,MoE,8,1000,oops\n", 3, None, "expected 5 fields as in the header, got 6"),
        ("missing_field", HEADER + GOOD + "b,0,MoE,8\n", 3, None, "expected 5 fields as in the header, got 4"),
        ("extra_field_extra_column", HEADER[:-1] + ",user\na,0,MoE,8,1,u\nb,0,MoE,8,1,u,x\n", 3, None, "got 7"),
        ("duplicate_column", HEADER[:-1] + ",model\na,0,MoE,8,1,LM\n", 1, "model", "column appears twice"),
        ("empty_samples", HEADER + "a,0,MoE,8,\n", 2, "total_samples", "expected a number, got ''"),
        ("empty_work", HEADER[:-1] + ",duration\na,0,MoE,8,,\n", 2, "total_samples", "got neither"),
        ("nan_samples_with_duration", HEADER[:-1] + ",duration\na,0,MoE,8,nan,60\n", 2, "total_samples", "finite"),
        ("empty_model", HEADER + "a,0,,8,1000\n", 2, "model", "empty model name"),
        ("huge_demand", HEADER + "a,0,MoE,1e400,1000\n", 2, "gpu_demand", "finite"),
    ],
)
def test_bad_canonical_csv(tmp_path: Path, name: str, text: str, row: int, field: str, words: str) -> None:
    path = tmp_path / f"{name}.csv"
    path.write_text(text)
    with pytest.raises(TraceError) as ei:
        load_trace(path, CLUSTER)
    assert words in str(ei.value)
    _where(ei.value, path, row, field)


@pytest.mark.parametrize(
    "text, row, field",
    [
        # Blank lines still count: the bad model is on line 5.
        (HEADER + GOOD + "\n" + "b,0,IMG,2,1000\n" + "c,0,ResNet,2,1000\n", 5, "model"),
        (HEADER + GOOD + "\n\n" + GOOD, 5, "job_id"),  # the duplicate, after two blank lines
        ("\n" + HEADER + GOOD + "b,0,MoE,8\n", 4, None),  # a blank line before the header
        # A quoted field spanning two lines: the next row starts on line 4; a row is named by its first line.
        (HEADER[:-1] + ',note\na,0,MoE,8,1,"two\nlines"\nb,0,ResNet,8,1,x\n', 4, "model"),
        (HEADER[:-1] + ',note\na,0,MoE,8,1,x\nb,0,ResNet,8,1,"two\nlines"\n', 3, "model"),
    ],
    ids=["after_blank_line", "duplicate_after_blank_lines", "blank_before_header", "after_multiline", "multiline"],
)
def test_csv_rows_are_file_lines(tmp_path: Path, text: str, row: int, field: str | None) -> None:
    path = tmp_path / "t.csv"
    path.write_text(text)
    with pytest.raises(TraceError) as ei:
        load_trace(path, CLUSTER)
    _where(ei.value, path, row, field)


def test_blank_lines_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("\n" + HEADER + "\n" + GOOD + "\n\n" + GOOD.replace("a,", "b,") + "\n")
    assert [j.job_id for j in load_trace(path, CLUSTER)] == ["a", "b"]


@pytest.mark.parametrize(
    "name, data, line",
    [
        ("t.csv", (HEADER + GOOD).encode() + b"\xff,0,IMG,2,1000\n", 3),
        ("t.csv", HEADER.encode() + GOOD.encode() * 3000 + b"b,0,caf\xe9,2,1000\n", 3002),  # past the first block
        ("t.csv", b"job_id,submit_time,model,gpu_demand,total_samples,\xff\n" + GOOD.encode(), 1),  # in the header
        ("t.json", b'{"a": {"model": "GNN", "gpu_demand": 2, "total_samples_to_train": 1},\n "b\xff": {}}', 2),
        ("t", b'{"a\xff": {"model": "GNN", "gpu_demand": 2, "total_samples_to_train": 1}}', 1),  # no suffix: JSON
        ("p.csv", b"timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-09 07:01:55,1,1,1,vc\n\xfe,1,1,1,vc\n", 3),
    ],
    ids=["csv", "csv_past_first_block", "csv_header", "json", "json_no_suffix", "philly"],
)
def test_not_utf8(tmp_path: Path, name: str, data: bytes, line: int) -> None:
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(TraceError) as ei:
        load_trace(path, CLUSTER)
    msg = str(ei.value)
    assert msg.startswith(f"{path}: not UTF-8 text: byte 0x") and f"at line {line} " in msg, msg
    assert "\n" not in msg


def test_duplicate_names_the_second_occurrence(tmp_path: Path) -> None:
    path = tmp_path / "dup.csv"
    path.write_text(HEADER + GOOD + "b,1,DLRM,2,5\n" + GOOD)
    with pytest.raises(TraceError) as ei:
        load_trace(path, CLUSTER)
    # Rows are file lines (header = line 1): the repeated "a" is on line 4.
    _where(ei.value, path, 4, "job_id")


@pytest.mark.parametrize("text", ["", HEADER])
def test_empty_file(tmp_path: Path, text: str) -> None:
    path = tmp_path / "empty.csv"
    path.write_text(text)
    with pytest.raises(TraceError) as ei:
        load_trace(path, CLUSTER)
    assert str(path) in str(ei.value)
    assert "no jobs" in str(ei.value)


def test_bad_parquet_rows_named(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {"job_id": "a", "submit_time": 0.0, "model": "MoE", "gpu_demand": 8, "total_samples": 10.0},
        {"job_id": "b", "submit_time": -1.0, "model": "MoE", "gpu_demand": 8, "total_samples": 10.0},
    ]
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(TraceError) as ei:
        load_trace(path, CLUSTER)
    _where(ei.value, path, 2, "submit_time")  # Parquet rows count from 1 (no header)
    rows[1]["submit_time"] = 1.0
    rows[1]["model"] = "Nope"
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(TraceError) as ei:
        load_trace(path, CLUSTER)
    _where(ei.value, path, 2, "model")
    pq.write_table(pa.Table.from_pylist([{"job_id": "a", "model": "MoE"}]), path)
    with pytest.raises(TraceError) as ei:
        load_trace(path, CLUSTER)
    _where(ei.value, path, 1, "submit_time")


_PQ_GOOD = {"job_id": "a", "submit_time": 0.0, "model": "MoE", "gpu_demand": 8, "total_samples": 10.0}


@pytest.mark.parametrize(
    "bad, row, field, words",
    [
        ({"job_id": None}, 2, "job_id", "empty job id"),  # a null id is no id, not the id "None"
        ({"job_id": " "}, 2, "job_id", "empty job id"),
        ({"job_id": "a"}, 2, "job_id", "duplicate job id 'a'"),
        ({"total_samples": float("nan")}, 2, "total_samples", "expected a finite number, got nan"),
        ({"total_samples": None}, 2, "total_samples", "expected a number, got None"),
        ({"model": None}, 2, "model", "empty model name"),
        ({"submit_time": float("inf")}, 2, "submit_time", "finite"),
    ],
)
def test_bad_parquet_values(tmp_path: Path, bad: dict, row: int, field: str, words: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [dict(_PQ_GOOD), {**_PQ_GOOD, "job_id": "b", **bad}]
    path = tmp_path / "bad.pq"
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(TraceError) as ei:
        load_trace(path, CLUSTER)
    assert words in str(ei.value)
    _where(ei.value, path, row, field)


def test_parquet_null_samples_fall_back_to_duration(tmp_path: Path, perf: ContentionModel) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{**_PQ_GOOD, "duration": None}, {**_PQ_GOOD, "job_id": "b", "total_samples": None, "duration": 60.0}]
    path = tmp_path / "mixed.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    a, b = load_trace(path, CLUSTER, perf)
    assert a.total_samples == 10.0
    assert b.total_samples == pytest.approx(60 * perf.best_isolated_throughput("MoE", 8))
    rows[1]["total_samples"] = float("nan")  # NaN is a bad value, not a missing one
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(TraceError) as ei:
        load_trace(path, CLUSTER, perf)
    _where(ei.value, path, 2, "total_samples")


def test_not_parquet(tmp_path: Path) -> None:
    path = tmp_path / "x.parquet"
    path.write_text("hello")
    with pytest.raises(TraceError, match="cannot read Parquet"):
        load_trace(path, CLUSTER)


@pytest.mark.parametrize(
    "doc, row, field",
    [
        ({"0": {"model": "MoE", "gpu_demand": 8}}, "0", "total_samples_to_train"),
        (
            {
                "0": {"model": "MoE", "gpu_demand": 8, "total_samples_to_train": 5},
                "7": {"model": "X", "gpu_demand": 2, "total_samples_to_train": 5},
            },
            "7",
            "model",
        ),
        ({"3": {"model": "MoE", "gpu_demand": 99, "total_samples_to_train": 5}}, "3", "gpu_demand"),
        ({"3": {"model": "MoE", "gpu_demand": 2, "total_samples_to_train": "x"}}, "3", "total_samples_to_train"),
    ],
)
def test_bad_deepshare_json(tmp_path: Path, doc: dict, row: str, field: str) -> None:
    path = tmp_path / "set.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(TraceError) as ei:
        load_trace(path, CLUSTER)
    _where(ei.value, path, row, field)


_JOB = '"model": "GNN", "gpu_demand": 2, "total_samples_to_train": 1000'


@pytest.mark.parametrize(
    "text, row, field, words",
    [
        # json.loads alone would keep only the second "a" (and the second gpu_demand).
        ("{\"a\": {%s}, \"b\": {%s}, \"a\": {%s}}" % (_JOB, _JOB, _JOB), "a", "job_id", "duplicate job id 'a'"),
        ('{"a": {%s, "gpu_demand": 4}}' % _JOB, "a", "gpu_demand", "field appears twice"),
        ('{"a": {"model": "GNN", "gpu_demand": 2, "total_samples_to_train": NaN}}', "a", "total_samples_to_train", "finite"),
        ('{"a": {"model": "GNN", "gpu_demand": 2, "total_samples_to_train": null}}', "a", "total_samples_to_train", "got None"),
        ('{"a": {"model": "GNN", "gpu_demand": true, "total_samples_to_train": 1}}', "a", "gpu_demand", "got True"),
        ('{"a": {"model": "GNN", "gpu_demand": 2, "total_samples_to_train": false}}', "a", "total_samples_to_train", "number"),
        ('{"a": {%s, "submit_time": true}}' % _JOB, "a", "submit_time", "expected a number, got True"),
        ('{"a": {"model": "GNN", "gpu_demand": 1%s, "total_samples_to_train": 1}}' % ("0" * 400), "a", "gpu_demand",
         "expected a finite number, got 1000"),
        ('{"a": {"model": null, "gpu_demand": 2, "total_samples_to_train": 1}}', "a", "model", "empty model name"),
    ],
    ids=["dup_id", "dup_field", "nan", "null", "true_demand", "false_samples", "true_submit", "huge_int", "null_model"],
)
def test_bad_deepshare_json_text(tmp_path: Path, text: str, row: str, field: str, words: str) -> None:
    path = tmp_path / "set.json"
    path.write_text(text)
    with pytest.raises(TraceError) as ei:
        load_trace(path, CLUSTER)
    assert words in str(ei.value)
    assert len(str(ei.value)) < 200  # a 400-digit number is shortened
    _where(ei.value, path, row, field)


def test_deepshare_json_with_bom(tmp_path: Path) -> None:
    path = tmp_path / "set.json"
    path.write_bytes(b"\xef\xbb\xbf" + ("{\"a\": {%s}}" % _JOB).encode())
    assert [j.job_id for j in load_trace(path, CLUSTER)] == ["a"]


@pytest.mark.parametrize(
    "text, words",
    [
        ("", "empty file: no JSON job set and no jobs"),  # as an empty CSV, not "Expecting value"
        (" \n", "empty file"),
        ("{", "not a readable JSON"),
        ("[1, 2]", "expected a JSON object"),
        ("{}", "no jobs"),
    ],
)
def test_unusable_json(tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "set.json"
    path.write_text(text)
    with pytest.raises(TraceError, match=words) as ei:
        load_trace(path, CLUSTER)
    assert str(path) in str(ei.value)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no such file"):
        load_trace(tmp_path / "nope.csv", CLUSTER)
    with pytest.raises(TraceError, match="is a directory"):
        load_trace(tmp_path, CLUSTER)


def test_write_trace_failure_leaves_nothing(tmp_path: Path) -> None:
    bad = [JobSpec("a", 0.0, "MoE", 8, 1.0, {"x": object()})]  # not representable in Parquet
    with pytest.raises(ValueError):  # pyarrow.ArrowInvalid
        write_trace(tmp_path / "out.parquet", bad)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("suffix", TRACE_SUFFIXES)
@pytest.mark.parametrize(
    "field, value, need",
    [
        ("total_samples", float("inf"), "a finite number > 0"),  # e.g. a huge duration times a throughput
        ("total_samples", float("nan"), "a finite number > 0"),
        ("total_samples", 0.0, "a finite number > 0"),
        ("submit_time", float("inf"), "a finite number >= 0"),  # e.g. a huge time_scale
        ("submit_time", -1.0, "a finite number >= 0"),
        ("gpu_demand", 0, "an integer >= 1"),
    ],
)
def test_write_trace_refuses_numbers_no_reader_accepts(
    tmp_path: Path, suffix: str, field: str, value: float, need: str
) -> None:
    """`trace generate` once wrote inf, which every later read refused."""
    good = JobSpec("a", 0.0, "MoE", 8, 1000.0)
    bad = replace(good, job_id="b", **{field: value})
    out = tmp_path / f"t{suffix}"
    with pytest.raises(TraceError) as ei:
        write_trace(out, [good, bad])
    assert str(ei.value) == f"{out}: not written: job 'b' has {field} {value!r}; a trace needs {need}"
    assert list(tmp_path.iterdir()) == []
    out.write_text("mine")  # an existing file is left as it was
    with pytest.raises(TraceError):
        write_trace(out, [bad])
    assert out.read_text() == "mine" and list(tmp_path.iterdir()) == [out]


def test_write_trace_uses_its_own_temporary_file(tmp_path: Path) -> None:
    """The temporary file was always `.NAME.tmp`: a second writer's temporary file was overwritten and deleted."""
    other = tmp_path / ".t.csv.tmp"
    other.write_text("another writer's half-written trace")
    jobs = [JobSpec("a", 0.0, "MoE", 8, 1000.0)]
    write_trace(tmp_path / "t.csv", jobs)
    assert other.read_text() == "another writer's half-written trace"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".t.csv.tmp", "t.csv"]
    assert read_canonical(tmp_path / "t.csv") == jobs


def test_concurrent_writers_to_one_target(tmp_path: Path) -> None:
    import threading

    out = tmp_path / "t.parquet"
    sets = [[JobSpec(f"w{w}-{i}", float(i), "MoE", 8, 1000.0 + w) for i in range(200)] for w in range(6)]
    errors: list[BaseException] = []

    def write(jobs: list[JobSpec]) -> None:
        try:
            for _ in range(5):
                write_trace(out, jobs)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(jobs,)) for jobs in sets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert read_canonical(out) in sets  # one writer's whole trace, never a mix or a torn file
    assert [p.name for p in tmp_path.iterdir()] == ["t.parquet"]


def test_write_trace_file_mode_follows_umask(tmp_path: Path) -> None:
    import os

    old = os.umask(0o022)
    try:
        for suffix in TRACE_SUFFIXES:
            write_trace(tmp_path / f"t{suffix}", [JobSpec("a", 0.0, "MoE", 8, 1000.0)])
            assert (tmp_path / f"t{suffix}").stat().st_mode & 0o777 == 0o644  # not mkstemp's 0600
    finally:
        os.umask(old)


def test_write_trace_interrupted_leaves_nothing(tmp_path: Path, monkeypatch) -> None:
    import csv

    def boom(self, rows):
        raise KeyboardInterrupt

    monkeypatch.setattr(csv.DictWriter, "writerows", boom)
    (tmp_path / "t.csv").write_text("mine")
    with pytest.raises(KeyboardInterrupt):
        write_trace(tmp_path / "t.csv", [JobSpec("a", 0.0, "MoE", 8, 1000.0)])
    assert [p.name for p in tmp_path.iterdir()] == ["t.csv"] and (tmp_path / "t.csv").read_text() == "mine"


@pytest.mark.parametrize("suffix", TRACE_SUFFIXES)
def test_philly_options_on_another_trace_are_refused(tmp_path: Path, suffix: str) -> None:
    """load_trace(path, limit=3) ignored limit for a canonical trace and returned every job."""
    path = tmp_path / f"t{suffix}"
    write_trace(path, [JobSpec(str(i), float(i), "MoE", 8, 1000.0) for i in range(5)])
    with pytest.raises(TraceError) as ei:
        load_trace(path, CLUSTER, limit=3, sample=0.5)
    kind = "DeepShare JSON" if suffix == ".json" else "canonical CSV/Parquet"
    assert str(ei.value) == f"{path}: is a {kind} trace; options limit, sample apply only to a Philly CSV"
    assert trace_format(path) == ("deepshare" if suffix == ".json" else "canonical")


# ---------------------------------------------------------------------- far-off submit times (defect: a 25 GB grid)
@pytest.mark.parametrize("value", ["1e12", "1e300", "1000000001", "99999999999999999999999"])
@pytest.mark.parametrize("suffix", [".csv", ".json", ".parquet"])
def test_submit_time_beyond_the_bound_is_refused(tmp_path: Path, value: str, suffix: str) -> None:
    """A finite but absurd submit time crashed `simulate` (a 24.8 GiB utilisation grid for 1e12)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / f"t{suffix}"
    if suffix == ".csv":
        path.write_text(HEADER + f"a,{value},MoE,2,10\n")
        row = 2
    elif suffix == ".json":
        path.write_text('{"a": {"model": "MoE", "gpu_demand": 2, "total_samples_to_train": 10, "submit_time": ' + value + "}}")
        row = "a"
    else:
        pq.write_table(pa.Table.from_pylist([{**_PQ_GOOD, "submit_time": float(value)}]), path)
        row = 1
    with pytest.raises(TraceError) as ei:
        load_trace(path, CLUSTER)
    assert "beyond the largest submit time 1e+09 s (about 31.7 years)" in str(ei.value)
    assert "\n" not in str(ei.value)
    _where(ei.value, path, row, "submit_time")


def test_submit_time_at_the_bound_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(HEADER + f"a,{MAX_SUBMIT_TIME_S!r},MoE,2,10\n")
    assert load_trace(path, CLUSTER)[0].submit_time == MAX_SUBMIT_TIME_S


@pytest.mark.parametrize("suffix", TRACE_SUFFIXES)
def test_write_trace_refuses_a_submit_time_beyond_the_bound(tmp_path: Path, suffix: str) -> None:
    out = tmp_path / f"t{suffix}"
    with pytest.raises(TraceError) as ei:
        write_trace(out, [JobSpec("a", 0.0, "MoE", 8, 10.0), JobSpec("b", 2e9, "MoE", 8, 10.0)])
    assert str(ei.value) == (
        f"{out}: not written: job 'b' has submit_time 2000000000.0; "
        "a trace needs a submit time of at most 1e+09 s (about 31.7 years)"
    )
    assert list(tmp_path.iterdir()) == []


def test_shipped_traces_still_load() -> None:
    """Every trace under data/traces loads with the bounds and numeric rules (Philly: test_philly.py::test_full_file)."""
    files = sorted((REPO / "data" / "traces").rglob("*.json"))
    assert len(files) >= 7
    for f in files:
        jobs = load_trace(f, CLUSTER)
        assert jobs and all(0 <= j.submit_time <= MAX_SUBMIT_TIME_S for j in jobs)


# ---------------------------------------------------------------------- DeepShare JSON keeps extra fields
def test_csv_json_csv_round_trip_keeps_extra_columns(tmp_path: Path) -> None:
    """`trace convert` to JSON dropped a CSV's `user` column (docs: other columns are kept and written back)."""
    src = tmp_path / "u.csv"
    src.write_text(HEADER[:-1] + ",user,vc\na,0,MoE,2,10,bob,\nb,5,GNN,4,1e6,Zoë,v1\n")
    jobs = load_trace(src, CLUSTER)
    write_trace(tmp_path / "u.json", jobs)
    doc = json.loads((tmp_path / "u.json").read_text(encoding="utf-8"))
    assert doc["a"] == {
        "model": "MoE", "gpu_demand": 2, "total_samples_to_train": 10.0, "submit_time": 0.0, "user": "bob", "vc": ""
    }
    back = load_trace(tmp_path / "u.json", CLUSTER)
    assert back == jobs and [j.extra for j in back] == [j.extra for j in jobs]
    write_trace(tmp_path / "u2.csv", back)
    assert (tmp_path / "u2.csv").read_text(encoding="utf-8").splitlines() == [
        HEADER[:-1] + ",user,vc",
        "a,0.0,MoE,2,10.0,bob,",
        "b,5.0,GraphSage,4,1000000.0,Zoë,v1",
    ]


def test_json_unknown_keys_are_kept_in_extra(tmp_path: Path) -> None:
    path = tmp_path / "z.json"
    path.write_text('{"a": {"model": "MoE", "gpu_demand": 2, "total_samples_to_train": 10, "zzz": 1, "tags": ["x"]}}')
    (job,) = load_trace(path, CLUSTER)
    assert job.extra == {"zzz": 1, "tags": ["x"]}
    write_trace(tmp_path / "z2.json", [job])
    assert json.loads((tmp_path / "z2.json").read_text())["a"]["zzz"] == 1


@pytest.mark.parametrize(
    "key, words",
    [("total_samples", "names the work 'total_samples_to_train'"), ("job_id", "the job id is the key")],
)
def test_json_keys_that_clash_with_canonical_columns_are_refused(tmp_path: Path, key: str, words: str) -> None:
    """Kept in extra, they would overwrite the canonical column when written as CSV."""
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"a": {"model": "MoE", "gpu_demand": 2, "total_samples_to_train": 10, key: 5}}))
    with pytest.raises(TraceError) as ei:
        load_trace(path, CLUSTER)
    assert words in str(ei.value)
    _where(ei.value, path, "a", key)


@pytest.mark.parametrize(
    "suffix, key", [(".json", "total_samples_to_train"), (".json", "submit_time"), (".csv", "total_samples")]
)
def test_write_trace_refuses_an_extra_field_named_like_a_format_field(tmp_path: Path, suffix: str, key: str) -> None:
    out = tmp_path / f"t{suffix}"
    with pytest.raises(TraceError, match=f"not written: job 'a' has an extra field '{key}', which is a field of"):
        write_trace(out, [JobSpec("a", 0.0, "MoE", 8, 10.0, {key: 1})])
    assert list(tmp_path.iterdir()) == []


def test_json_writes_extra_values_json_has_no_type_for_as_text(tmp_path: Path) -> None:
    import datetime

    job = JobSpec("a", 0.0, "MoE", 8, 10.0, {"created": datetime.date(2017, 10, 9)})
    write_trace(tmp_path / "t.json", [job])
    assert load_trace(tmp_path / "t.json", CLUSTER)[0].extra == {"created": "2017-10-09"}  # as a CSV writes it


# ---------------------------------------------------------------------- numbers: one rule per format
@pytest.mark.parametrize("value", ["1_000", "1__0", "٣", "0x10", "1e", "--1"])
def test_csv_numbers_are_plain_decimal_literals(tmp_path: Path, value: str) -> None:
    """float() takes `1_000` and non-ASCII digits; no CSV tool reads them as numbers."""
    path = tmp_path / "t.csv"
    path.write_text(HEADER + f"a,{value},MoE,2,10\n", encoding="utf-8")
    with pytest.raises(TraceError) as ei:
        load_trace(path, CLUSTER)
    assert f"expected a number, got {value!r}" in str(ei.value)
    _where(ei.value, path, 2, "submit_time")


def test_csv_plain_number_forms_still_accepted(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(HEADER + "a, 5 ,MoE,2.0,1e3\nb,.5,MoE,+2,10.\nc,0,MoE,2,1E+3\n")
    assert [(j.submit_time, j.gpu_demand, j.total_samples) for j in load_trace(path, CLUSTER)] == [
        (5.0, 2, 1000.0), (0.5, 2, 10.0), (0.0, 2, 1000.0)
    ]


@pytest.mark.parametrize("key", ["gpu_demand", "total_samples_to_train", "submit_time"])
def test_json_numbers_must_be_json_numbers(tmp_path: Path, key: str) -> None:
    """`"gpu_demand": "2"` was accepted while `true` was refused."""
    job = {"model": "MoE", "gpu_demand": 2, "total_samples_to_train": 10, key: "2"}
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"a": job}))
    with pytest.raises(TraceError) as ei:
        load_trace(path, CLUSTER)
    assert "expected a number, got '2' (a string)" in str(ei.value)
    _where(ei.value, path, "a", key)


@pytest.mark.parametrize("column", ["gpu_demand", "total_samples", "submit_time"])
def test_parquet_numbers_must_be_numeric_columns(tmp_path: Path, column: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "t.parquet"
    pq.write_table(pa.Table.from_pylist([{**_PQ_GOOD, column: "2"}]), path)
    with pytest.raises(TraceError) as ei:
        load_trace(path, CLUSTER)
    assert "expected a number, got '2' (a string)" in str(ei.value)
    _where(ei.value, path, 1, column)


def test_oversized_demand_is_printed_as_written(tmp_path: Path) -> None:
    """It was printed after float rounding: 99999999999999991611392, 18446744073709551616."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    csv_path = tmp_path / "t.csv"
    csv_path.write_text(HEADER + "a,0,MoE,99999999999999999999999,10\n")
    with pytest.raises(TraceError, match=r"gpu_demand 99999999999999999999999 is larger than the cluster \(32 GPUs\)"):
        load_trace(csv_path, CLUSTER)
    pq_path = tmp_path / "t.parquet"
    table = pa.Table.from_pylist([{**_PQ_GOOD, "gpu_demand": 2**64 - 1}], schema=pa.schema([
        ("job_id", pa.string()), ("submit_time", pa.float64()), ("model", pa.string()),
        ("gpu_demand", pa.uint64()), ("total_samples", pa.float64()),
    ]))
    pq.write_table(table, pq_path)
    with pytest.raises(TraceError, match=r"gpu_demand 18446744073709551615 is larger than the cluster"):
        load_trace(pq_path, CLUSTER)
    json_path = tmp_path / "t.json"
    json_path.write_text('{"a": {"model": "MoE", "gpu_demand": 64.0, "total_samples_to_train": 1}}')
    with pytest.raises(TraceError, match=r"gpu_demand 64 is larger than the cluster"):
        load_trace(json_path, CLUSTER)


def test_json_errors_name_the_key_as_written(tmp_path: Path) -> None:
    """They said field 'total_samples', a key the file does not have."""
    path = tmp_path / "t.json"
    path.write_text('{"a": {"model": "MoE", "gpu_demand": 2, "total_samples_to_train": -1}}')
    with pytest.raises(TraceError) as ei:
        load_trace(path, CLUSTER)
    assert str(ei.value) == f"{path}, row a, field 'total_samples_to_train': must not be negative, got -1"


# ---------------------------------------------------------------------- resource demand columns
def _demand_jobs() -> list[JobSpec]:
    from policies.resources import ResourceDemand

    return [
        JobSpec("a", 0.0, "MoE", 4, 1000.0, {"user": "x"}, ResourceDemand(4, gpu_type="v100", cpus_per_gpu=4, mem_gb_per_gpu=16.5)),
        JobSpec("b", 1.0, "DLRM", 2, 500.0, {"user": "y"}),
        JobSpec("c", 2.0, "DLRM", 2, 500.0, {"user": "z"}, ResourceDemand(2, cpus_per_gpu=2)),
    ]


@pytest.mark.parametrize("suffix", [".csv", ".parquet", ".json"])
def test_demand_columns_round_trip(tmp_path: Path, suffix: str) -> None:
    from trainer.traces import DEMAND_COLUMNS

    jobs = _demand_jobs()
    path = tmp_path / f"t{suffix}"
    write_trace(path, jobs)
    back = load_trace(path)
    assert back == jobs and [j.demand for j in back] == [j.demand for j in jobs]
    assert [j.extra for j in back] == [j.extra for j in jobs]  # the demand columns are not extra
    if suffix == ".csv":
        header = path.read_text().splitlines()[0].split(",")
        assert header[5:8] == list(DEMAND_COLUMNS)
        assert path.read_text().splitlines()[2].startswith("b,1.0,DLRM,2,500.0,,,,")  # blank: not declared


def test_trace_without_demands_writes_no_demand_columns(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    write_trace(path, [JobSpec("a", 0.0, "MoE", 4, 1000.0)])
    assert path.read_text().splitlines()[0] == "job_id,submit_time,model,gpu_demand,total_samples"
    assert load_trace(path)[0].demand is None


@pytest.mark.parametrize(
    "column, value, words",
    [
        ("gpu_type", "v 100", "field 'gpu_type': expected a GPU type name"),
        ("cpus_per_gpu", "2.5", "field 'cpus_per_gpu': expected an integer, got '2.5'"),
        ("cpus_per_gpu", "-1", "field 'cpus_per_gpu': must not be negative"),
        ("mem_gb_per_gpu", "lots", "field 'mem_gb_per_gpu': expected a number, got 'lots'"),
        ("mem_gb_per_gpu", "inf", "field 'mem_gb_per_gpu': expected a finite number"),
    ],
)
def test_bad_demand_values_name_file_row_and_column(tmp_path: Path, column: str, value: str, words: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(f"job_id,submit_time,model,gpu_demand,total_samples,{column}\na,0,MoE,4,100,\nb,0,MoE,4,100,{value}\n")
    with pytest.raises(TraceError) as ei:
        load_trace(path)
    msg = str(ei.value)
    assert msg.startswith(f"{path}, row 3, ") and words in msg and "\n" not in msg


def test_demand_type_must_exist_in_the_cluster(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"a": {"model": "MoE", "gpu_demand": 2, "total_samples_to_train": 100, "gpu_type": "k80"}}))
    with pytest.raises(TraceError, match=r"row a, field 'gpu_type': no node of the cluster has GPUs of type k80"):
        load_trace(path, ClusterSpec.parse("2x8:v100"))
    assert load_trace(path, ClusterSpec.parse("1x8:K80+1x8"))[0].demand.gpu_type == "k80"
    path.write_text(json.dumps({"a": {"model": "MoE", "gpu_demand": 2, "total_samples_to_train": 100, "cpus_per_gpu": "4"}}))
    with pytest.raises(TraceError, match=r"field 'cpus_per_gpu': expected a number, got '4' \(a string\)"):
        load_trace(path)


def test_write_refuses_a_demand_the_columns_cannot_hold(tmp_path: Path) -> None:
    from policies.resources import ResourceDemand

    job = JobSpec("a", 0.0, "MoE", 4, 1000.0, demand=ResourceDemand(4, ps=1, ps_cpus=2))
    with pytest.raises(TraceError, match="declares parameter servers or an elastic range"):
        write_trace(tmp_path / "t.csv", [job])
    assert not (tmp_path / "t.csv").exists()
# ---- bounds: size and job limits, streaming, JSON limits, escaped text ----

_HEADER = "job_id,submit_time,model,gpu_demand,total_samples\n"


def test_a_file_over_the_size_limit_is_refused_before_reading(tmp_path: Path, monkeypatch) -> None:
    """A 200 MB trace (sparse here) is refused from its size alone, in every text format, naming the limit."""
    import trainer.traces as tr

    for name in ("big.csv", "big.json", "big"):
        p = tmp_path / name
        with p.open("wb") as f:
            f.write(_HEADER.encode())
            f.truncate(200 * 10**6)
        opened = []
        monkeypatch.setattr(Path, "open", lambda self, *a, **k: opened.append(self) or (_ for _ in ()).throw(AssertionError))
        monkeypatch.setattr(Path, "read_bytes", lambda self: opened.append(self) or b"")
        with pytest.raises(TraceError, match=r"190\.7 MiB is over the 32 MiB limit for a trace file"):
            read_canonical(p) if name != "big.json" else read_deepshare_json(p)
        monkeypatch.undo()
        assert opened == []
    assert tr.MAX_TRACE_BYTES == 32 * 2**20 and tr.MAX_TRACE_JOBS == 1_000_000


def test_philly_file_over_the_size_limit_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "philly.csv"
    with p.open("wb") as f:
        f.write(b"timestamp,duration,num_gpus,gpu_time,cluster\n")
        f.truncate(40 * 2**20)
    with pytest.raises(TraceError, match="over the 32 MiB limit for a Philly trace file"):
        load_trace(p, CLUSTER)


def test_rows_beyond_the_job_limit_stop_the_read(tmp_path: Path, monkeypatch) -> None:
    import trainer.traces as tr

    monkeypatch.setattr(tr, "MAX_TRACE_JOBS", 3)
    p = tmp_path / "t.csv"
    p.write_text(_HEADER + "".join(f"j{i},0,IMG,1,10\n" for i in range(5)))
    with pytest.raises(TraceError, match=r"row 5: more than 3 jobs"):
        read_canonical(p)
    write_trace(tmp_path / "t.parquet", [JobSpec(f"j{i}", 0.0, "IMG", 1, 10.0) for i in range(5)])
    with pytest.raises(TraceError, match="more than 3 jobs"):
        read_canonical(tmp_path / "t.parquet")


def test_csv_rows_become_jobs_one_at_a_time(tmp_path: Path, monkeypatch) -> None:
    """A bad row is reported when it is reached: rows after it are never parsed, and the rows before it
    were turned into jobs as they were read (no list of all rows' text first)."""
    import trainer.traces as tr

    p = tmp_path / "t.csv"
    p.write_text(_HEADER + "a,0,IMG,1,10\nb,0,IMG,1,oops\n" + "".join(f"c{i},0,IMG,1,10\n" for i in range(1000)))
    seen = []
    real = tr._read_csv_rows

    def rows(path):
        for n, rec in real(path):
            seen.append(n)
            yield n, rec

    monkeypatch.setattr(tr, "_read_csv_rows", rows)
    with pytest.raises(TraceError, match=r"row 3, field 'total_samples': expected a number"):
        read_canonical(p)
    assert seen == [2, 3]


def test_parquet_rows_stream(tmp_path: Path) -> None:
    jobs = [JobSpec(f"j{i}", float(i), "IMG", 1 + i % 4, 10.0 + i) for i in range(70_000)]
    write_trace(tmp_path / "t.parquet", jobs)
    back = read_canonical(tmp_path / "t.parquet")
    assert [j.job_id for j in back] == [j.job_id for j in jobs] and back[-1].total_samples == jobs[-1].total_samples


def test_deepshare_json_long_integer_and_lone_surrogate(tmp_path: Path) -> None:
    p = tmp_path / "long.json"
    p.write_text('{"a": {"model": "IMG", "gpu_demand": ' + "7" * 5000 + ', "total_samples_to_train": 10}}')
    with pytest.raises(TraceError, match=r"an integer of 5000 digits \(at most 4300\)"):
        read_deepshare_json(p)
    p = tmp_path / "sur.json"
    p.write_text('{"\\ud800x": {"model": "IMG", "gpu_demand": 1, "total_samples_to_train": 10}}')
    with pytest.raises(TraceError, match=r"the key '\\ud800x' holds a lone surrogate") as ei:
        read_deepshare_json(p)
    str(ei.value).encode("utf-8")  # the message itself is valid text
    p.write_text('{"a": {"model": "IMG", "gpu_demand": 1, "total_samples_to_train": 10, "user": ["\\udc00"]}}')
    with pytest.raises(TraceError, match=r"the value of key 'user' holds a lone surrogate"):
        read_deepshare_json(p)


def test_file_text_in_errors_is_escaped(tmp_path: Path) -> None:
    """Header names, JSON keys and values reach messages with control characters escaped (one line, no
    terminal escape sequences)."""
    p = tmp_path / "h.csv"
    p.write_text("job_id,submit_time,\x1b[2Jmodel,gpu_demand,total_samples\nj,0,IMG,1,10\n")
    with pytest.raises(TraceError) as ei:
        read_canonical(p)
    assert "\x1b" not in str(ei.value) and "\\x1b[2Jmodel" in str(ei.value)
    p = tmp_path / "k.json"
    p.write_text('{"a\\u001b]0;x\\u0007\\nb": {"model": "no\\u009bsuch", "gpu_demand": 1, "total_samples_to_train": 1}}')
    with pytest.raises(TraceError) as ei:
        read_deepshare_json(p)
    msg = str(ei.value)
    assert msg.isprintable() and "a\\x1b]0;x\\x07\\nb" in msg and "\\x9b" in msg
