"""Philly trace reader (trainer/philly.py): the conversion rule, speed on the full file, bad rows."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.cluster import ClusterSpec
from policies.perf import ContentionModel
from policies.workloads import MODELS
from trainer.philly import read_philly
from trainer.traces import MAX_SUBMIT_TIME_S, TraceError, load_trace

REPO = Path(__file__).resolve().parents[1]
PHILLY = REPO / "data" / "philly" / "philly.csv"
CLUSTER = ClusterSpec.homogeneous(4, 8)
HEADER = "timestamp,duration,num_gpus,gpu_time,cluster\n"
SLICE = (
    HEADER
    + "2017-10-09 07:01:55,66.0,1,66.0,vcA\n"
    + "2017-10-09 06:13:03,2951.0,4,11804.0,vcB\n"
    + "2017-10-09 06:13:36,2759.0,64,176576.0,vcA\n"
    + "2017-10-10 06:13:03,100.0,8,800.0,vcB\n"
    + "2017-10-09 06:13:03,10.0,2,20.0,vcC\n"
)


@pytest.fixture(scope="module")
def perf() -> ContentionModel:
    return ContentionModel(CLUSTER)


@pytest.fixture()
def small(tmp_path: Path) -> Path:
    p = tmp_path / "slice.csv"
    p.write_text(SLICE)
    return p


def test_small_slice_rule(small: Path, perf: ContentionModel) -> None:
    jobs = read_philly(small, CLUSTER, seed=0, perf=perf)
    by_id = {j.job_id: j for j in jobs}
    assert set(by_id) == {"0", "1", "2", "3", "4"}  # 0-based data-row index
    # Sorted by submit time, ties in row order; times from the earliest timestamp.
    assert [j.job_id for j in jobs] == ["1", "4", "2", "0", "3"]
    assert by_id["1"].submit_time == 0.0
    assert by_id["2"].submit_time == 33.0
    assert by_id["0"].submit_time == 48 * 60 + 52
    assert by_id["3"].submit_time == 86400.0
    # 64 GPUs are clipped to the 32 of the cluster; others kept.
    assert [by_id[i].gpu_demand for i in "01234"] == [1, 4, 32, 8, 2]
    assert by_id["2"].extra["philly_gpus"] == 64
    assert by_id["0"].extra["vc"] == "vcA"
    # total_samples = duration * best isolated throughput of (model, demand).
    for j, dur in zip((by_id[i] for i in "01234"), (66.0, 2951.0, 2759.0, 100.0, 10.0)):
        assert j.model in MODELS
        assert j.total_samples == pytest.approx(dur * perf.best_isolated_throughput(j.model, j.gpu_demand))
        assert j.extra["duration"] == dur


def test_models_are_per_row_and_seeded(small: Path, perf: ContentionModel) -> None:
    a = {j.job_id: j.model for j in read_philly(small, CLUSTER, seed=7, perf=perf)}
    b = {j.job_id: j.model for j in read_philly(small, CLUSTER, seed=7, perf=perf)}
    assert a == b
    # Filters never change a job's model.
    only_a = read_philly(small, CLUSTER, seed=7, perf=perf, virtual_clusters=["vcA"])
    assert {j.job_id for j in only_a} == {"0", "2"}
    assert all(a[j.job_id] == j.model for j in only_a)
    assert only_a[0].submit_time == 0.0  # re-based on the kept jobs
    # A one-model mix gives only that model.
    moe = read_philly(small, CLUSTER, seed=7, perf=perf, mix={"MoE": 1})
    assert {j.model for j in moe} == {"MoE"}


def test_options(small: Path, perf: ContentionModel) -> None:
    base = {j.job_id: j for j in read_philly(small, CLUSTER, perf=perf)}
    dropped = read_philly(small, CLUSTER, perf=perf, oversize="drop")
    assert "2" not in {j.job_id for j in dropped} and len(dropped) == 4
    with pytest.raises(TraceError) as ei:
        read_philly(small, CLUSTER, perf=perf, oversize="error")
    assert f"{small}, row 4, field 'num_gpus'" in str(ei.value)
    capped = {j.job_id: j for j in read_philly(small, CLUSTER, perf=perf, max_gpus=4)}
    assert capped["3"].gpu_demand == 4 and capped["2"].gpu_demand == 4
    scaled = {j.job_id: j for j in read_philly(small, CLUSTER, perf=perf, gpu_scale=0.25)}
    assert [scaled[i].gpu_demand for i in "01234"] == [1, 1, 16, 2, 1]  # max(1, round(g / 4))
    half = {j.job_id: j for j in read_philly(small, CLUSTER, perf=perf, time_scale=0.5)}
    assert half["3"].submit_time == 43200.0
    assert half["3"].total_samples == pytest.approx(base["3"].total_samples / 2)
    win = read_philly(small, CLUSTER, perf=perf, window=(0, 3600))
    assert {j.job_id for j in win} == {"0", "1", "2", "4"}
    lim = read_philly(small, CLUSTER, perf=perf, limit=2)
    assert [j.job_id for j in lim] == ["1", "4"]
    with pytest.raises(TraceError, match="no jobs left"):
        read_philly(small, CLUSTER, perf=perf, virtual_clusters=["nope"])


def test_absurd_gpu_count_is_clipped_not_wrapped(tmp_path: Path) -> None:
    path = tmp_path / "p.csv"
    path.write_text(HEADER + "2017-10-09 07:01:55,5,1e300,5,a\n")
    (job,) = read_philly(path, CLUSTER)
    assert job.gpu_demand == 32
    with pytest.raises(TraceError, match="row 2, field 'num_gpus'"):
        read_philly(path, CLUSTER, oversize="error")


@pytest.mark.parametrize("name", ["gpu_scale", "time_scale"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), 0.0, -1.0])
def test_scales_must_be_finite_and_positive(small: Path, name: str, value: float) -> None:
    """NaN and inf are refused too (NaN fails no `<= 0` test; inf would give inf demands and times)."""
    with pytest.raises(ValueError, match=f"^{name} must be a finite number > 0, got {value!r}$"):
        read_philly(small, CLUSTER, **{name: value})


def test_time_scale_overflow_is_refused(tmp_path: Path) -> None:
    """Durations stay priceable but the submit times overflow: it wrote submit_time inf before."""
    path = tmp_path / "p.csv"
    path.write_text(HEADER + "2017-10-09 07:01:55,1,1,1,a\n2017-10-19 07:01:55,1,1,1,a\n")
    assert len(read_philly(path, CLUSTER, time_scale=1000)) == 2  # 8.64e8 s: within MAX_SUBMIT_TIME_S
    with pytest.raises(TraceError, match=r"row 3, field 'timestamp': .* beyond the largest submit time 1e\+09 s"):
        read_philly(path, CLUSTER, time_scale=1e300)  # finite, but 8.64e305 s
    with pytest.raises(TraceError) as ei:
        read_philly(path, CLUSTER, time_scale=1e303)
    assert str(ei.value) == (
        f"{path}, row 3, field 'timestamp': submit time overflows the float range with time_scale 1e+303"
    )
    with pytest.raises(TraceError, match="field 'duration': too large to price as samples with time_scale 1e\\+307"):
        read_philly(path, CLUSTER, time_scale=1e307)


def test_needs_cluster(small: Path) -> None:
    with pytest.raises(TraceError, match="needs the target cluster"):
        read_philly(small, None)


@pytest.mark.parametrize(
    "rows, row, field, words",
    [
        ("2017-10-09 07:01:55,66.0,1,66.0,a\nyesterday,5,1,5,a\n", 3, "timestamp", "date-time"),
        ("2017-10-09 07:01:55,66.0,1,66.0,a\n,5,1,5,a\n", 3, "timestamp", "date-time"),
        ("2017-10-09 07:01:55,abc,1,66.0,a\n", 2, "duration", "expected a number"),
        ("2017-10-09 07:01:55,5,1,5,a\n2017-10-09 07:01:55,-5,1,5,a\n", 3, "duration", "positive"),
        ("2017-10-09 07:01:55,0,1,0,a\n", 2, "duration", "positive"),
        ("2017-10-09 07:01:55,inf,1,0,a\n", 2, "duration", "finite"),
        ("2017-10-09 07:01:55,5,,5,a\n", 2, "num_gpus", "expected a number"),
        ("2017-10-09 07:01:55,5,0,5,a\n", 2, "num_gpus", "positive integer"),
        ("2017-10-09 07:01:55,5,1.5,5,a\n", 2, "num_gpus", "positive integer"),
        ("2017-10-09 07:01:55,1e308,8,5,a\n", 2, "duration", "too large"),
        ("2017-10-09 07:01:55,5,1,5,a\n2017-10-09 07:01:55,5,1\n", 3, None, "expected 5 fields"),
    ],
)
def test_bad_rows(tmp_path: Path, rows: str, row: int, field: str | None, words: str) -> None:
    path = tmp_path / "philly.csv"
    path.write_text(HEADER + rows)
    with pytest.raises(TraceError) as ei:
        read_philly(path, CLUSTER)
    msg = str(ei.value)
    assert words in msg
    assert str(path) in msg and re.search(rf"\brow {row}\b", msg), msg
    if field:
        assert f"field {field!r}" in msg


@pytest.mark.parametrize(
    "data, line",
    [
        (b"timestamp,duration,num_gpus,gpu_time,cl\xfcster\n2017-10-09 07:01:55,5,1,5,a\n", 1),
        (HEADER.encode() + b"2017-10-09 07:01:55,5,1,5,a\n2017-10-09 07:01:55,5,1,5,\xff\n", 3),
        (HEADER.encode() + b"2017-10-09 07:01:55,5,1,5,a\n" * 5000 + b"2017-10-09 07:01:55,5,1,5,\x80\n", 5002),
    ],
    ids=["header", "row", "past_first_block"],
)
def test_not_utf8(tmp_path: Path, data: bytes, line: int) -> None:
    path = tmp_path / "philly.csv"
    path.write_bytes(data)
    with pytest.raises(TraceError) as ei:
        read_philly(path, CLUSTER)
    msg = str(ei.value)
    assert msg.startswith(f"{path}: not UTF-8 text: byte 0x") and f"at line {line} " in msg, msg


def test_missing_column_and_empty(tmp_path: Path) -> None:
    path = tmp_path / "philly.csv"
    path.write_text("timestamp,num_gpus,cluster\n2017-10-09 07:01:55,1,a\n")
    with pytest.raises(TraceError) as ei:
        read_philly(path, CLUSTER)
    assert f"{path}, row 1, field 'duration': missing column" in str(ei.value)
    path.write_text("")
    with pytest.raises(TraceError, match="empty file"):
        read_philly(path, CLUSTER)
    path.write_text(HEADER + "\n")
    with pytest.raises(TraceError, match="no jobs"):
        read_philly(path, CLUSTER)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rows=st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=10**7),  # seconds after 2017-09-01
            st.floats(min_value=1.0, max_value=1e6, allow_nan=False),
            st.sampled_from([1, 2, 3, 4, 8, 16, 32, 64, 128]),
        ),
        min_size=1,
        max_size=40,
    ),
    seed=st.integers(min_value=0, max_value=2**31),
)
def test_any_valid_rows(tmp_path: Path, perf: ContentionModel, rows, seed: int) -> None:
    t0 = np.datetime64("2017-09-01T00:00:00")
    text = HEADER + "".join(
        f"{str(t0 + np.timedelta64(t, 's')).replace('T', ' ')},{d!r},{g},{d * g!r},vc\n" for t, d, g in rows
    )
    path = tmp_path / "p.csv"
    path.write_text(text)
    jobs = read_philly(path, CLUSTER, seed=seed, perf=perf)
    assert len(jobs) == len(rows)
    assert min(j.submit_time for j in jobs) == 0.0
    assert [j.submit_time for j in jobs] == sorted(j.submit_time for j in jobs)
    for j in jobs:
        t, d, g = rows[int(j.job_id)]
        assert j.gpu_demand == min(g, CLUSTER.total_gpus)
        assert j.submit_time == t - min(r[0] for r in rows)
        assert j.total_samples / perf.best_isolated_throughput(j.model, j.gpu_demand) == pytest.approx(d)


def test_full_file(perf: ContentionModel) -> None:
    """The whole 82,247-job file: complete, and the model mix close to 1:1:1:1:1:1 (its read time is a
    benchmark figure, docs/BENCHMARKS.md, not a test)."""
    jobs = read_philly(PHILLY, CLUSTER, seed=0, perf=perf)
    assert len(jobs) == 82247
    assert len({j.job_id for j in jobs}) == len(jobs)
    assert max(j.gpu_demand for j in jobs) == 32
    assert Counter(j.gpu_demand for j in jobs)[1] == 76627
    n = len(jobs)
    for c in Counter(j.model for j in jobs).values():
        assert abs(c / n - 1 / 6) < 5 * np.sqrt((1 / 6) * (5 / 6) / n)
    # load_trace recognises the file by its header.
    again = load_trace(PHILLY, CLUSTER, perf=perf)
    assert again == jobs
    assert jobs[-1].submit_time == pytest.approx(
        (np.datetime64("2017-12-22T08:02:11") - np.datetime64("2017-09-04T10:30:41")).astype(int)
    )
    assert jobs[-1].submit_time < MAX_SUBMIT_TIME_S / 100  # 109 days: far inside the bound


def test_timestamps_centuries_apart_are_refused(tmp_path: Path) -> None:
    """Years 0001 and 9999 both parse; 3.2e11 s of trace made `simulate` allocate gigabytes."""
    path = tmp_path / "p.csv"
    path.write_text(HEADER + "0001-01-01 00:00:00,5,1,5,a\n9999-12-31 23:59:59,5,1,5,a\n")
    with pytest.raises(TraceError) as ei:
        read_philly(path, CLUSTER)
    assert str(ei.value) == (
        f"{path}, row 3, field 'timestamp': '9999-12-31 23:59:59' is 3.155e+11 s after the earliest kept job's "
        "'0001-01-01 00:00:00' (row 2), beyond the largest submit time 1e+09 s (about 31.7 years)"
    )
    assert len(read_philly(path, CLUSTER, limit=1)) == 1  # the bound is on the jobs kept


@pytest.mark.parametrize("col, value", [("duration", "1_000"), ("num_gpus", "\u0663"), ("duration", "1__0")])
def test_numbers_are_plain_decimal_literals(tmp_path: Path, col: str, value: str) -> None:
    """numpy, like float(), reads `1_000` and Arabic-Indic digits; the canonical CSV reader does not."""
    fields = {"duration": "5", "num_gpus": "1", col: value}
    path = tmp_path / "p.csv"
    path.write_text(HEADER + f"2017-10-09 07:01:55,{fields['duration']},{fields['num_gpus']},5,a\n", encoding="utf-8")
    with pytest.raises(TraceError) as ei:
        read_philly(path, CLUSTER)
    assert str(ei.value) == f"{path}, row 2, field '{col}': expected a number, got {value!r}"
