"""Canonical trace readers/writers (trainer/traces.py): round trips, DeepShare JSON, bad input."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.cluster import ClusterSpec
from policies.job import JobSpec
from policies.perf import ContentionModel
from policies.workloads import MODELS
from trainer.traces import TraceError, load_trace, read_canonical, read_deepshare_json, write_trace

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
@given(jobs=_jobs_strategy(), suffix=st.sampled_from([".csv", ".parquet", ".json"]))
def test_round_trip_every_format(tmp_path: Path, jobs: list[JobSpec], suffix: str) -> None:
    path = tmp_path / f"t{suffix}"
    write_trace(path, jobs)
    back = load_trace(path, CLUSTER)
    assert back == jobs  # JobSpec equality: id, submit time, model, demand, samples (exact floats)
    assert not list(tmp_path.glob(".*.tmp"))


def test_round_trip_keeps_extra_columns(tmp_path: Path) -> None:
    jobs = [JobSpec("a", 0.0, "MoE", 8, 1000.0, {"user": "u1"}), JobSpec("b", 5.0, "DLRM", 2, 10.0, {"user": "u2"})]
    for suffix in (".csv", ".parquet"):
        write_trace(tmp_path / f"x{suffix}", jobs)
        back = read_canonical(tmp_path / f"x{suffix}", CLUSTER)
        assert [j.extra["user"] for j in back] == ["u1", "u2"]


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
    ],
)
def test_bad_canonical_csv(tmp_path: Path, name: str, text: str, row: int, field: str, words: str) -> None:
    path = tmp_path / f"{name}.csv"
    path.write_text(text)
    with pytest.raises(TraceError) as ei:
        load_trace(path, CLUSTER)
    assert words in str(ei.value)
    _where(ei.value, path, row, field)


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
        ({"3": {"model": "MoE", "gpu_demand": 2, "total_samples_to_train": "x"}}, "3", "total_samples"),
    ],
)
def test_bad_deepshare_json(tmp_path: Path, doc: dict, row: str, field: str) -> None:
    path = tmp_path / "set.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(TraceError) as ei:
        load_trace(path, CLUSTER)
    _where(ei.value, path, row, field)


@pytest.mark.parametrize(
    "text, words", [("", "not a readable JSON"), ("[1, 2]", "expected a JSON object"), ("{}", "no jobs")]
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
