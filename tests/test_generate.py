"""DeepShare-style generator (trainer/generate.py): determinism, mixes, demands, ~1 h jobs, Poisson load."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import trainer.traces
from policies.cluster import ClusterSpec
from policies.perf import ContentionModel
from policies.workloads import MODELS
from trainer.generate import (
    MAX_JOBS,
    MIXES,
    GeneratorConfig,
    GeneratorError,
    arrival_rate,
    demand_values,
    generate_jobs,
    generate_sets,
    parse_mix,
    write_sets,
)
from trainer.trace_stats import isolated_durations, trace_stats
from trainer.traces import load_trace

CLUSTER = ClusterSpec.homogeneous(4, 8)


@pytest.fixture(scope="module")
def perf() -> ContentionModel:
    return ContentionModel(CLUSTER)


def _key(jobs):
    return [(j.job_id, j.submit_time, j.model, j.gpu_demand, j.total_samples) for j in jobs]


def test_parse_mix() -> None:
    assert parse_mix("heavy") == pytest.approx(np.array([1, 1, 1, 1, 4, 4]) / 12)
    assert parse_mix("1:1:4:4:1:1") == pytest.approx(parse_mix("medium"))
    assert parse_mix({"GNN": 1, "IMG": 1}) == pytest.approx([0.5, 0.5, 0, 0, 0, 0])
    for bad in ("mostly", "1:1:1", "1:1:1:1:1:x", "0:0:0:0:0:0", "1:1:1:1:1:-1"):
        with pytest.raises(GeneratorError):
            parse_mix(bad)


@pytest.mark.parametrize(
    "mix, words",
    [
        # Each weight is finite, but the sum overflows to inf and every probability would be 0.
        ("1e308:1e308:1e308:1:1:1", "with a finite sum"),
        ("1e308:1e308:0:0:0:0", "with a finite sum"),
        ("inf:1:1:1:1:1", "finite"),
        ("nan:1:1:1:1:1", "finite"),
        ("1e999:1:1:1:1:1", "finite"),
        ((1, 1, 1, 1, 1, float("nan")), "finite"),
        ((True, 1, 1, 1, 1, 1), "weights must be numbers"),
        ((1, 1, 1, 1, 1, "x"), "weights must be numbers"),
        ((1, 1, 1, 1, 1, None), "weights must be numbers"),
        ((10**400, 1, 1, 1, 1, 1), "finite"),
        ({"GNN": 1, "ResNet": 1}, "not one of the measured models"),
        ({"GNN": "x"}, "weights must be numbers"),
    ],
)
def test_parse_mix_rejects(mix, words: str) -> None:
    with pytest.raises(GeneratorError, match=words):
        parse_mix(mix)
    with pytest.raises(GeneratorError, match=words):
        GeneratorConfig(mix=mix).resolved(CLUSTER)


def test_parse_mix_tiny_and_large_weights() -> None:
    assert parse_mix("1e300:1e300:0:0:0:0") == pytest.approx([0.5, 0.5, 0, 0, 0, 0])
    assert parse_mix("1e-300:0:0:0:0:3e-300") == pytest.approx([0.25, 0, 0, 0, 0, 0.75])


def test_deterministic_for_a_seed(perf: ContentionModel) -> None:
    cfg = GeneratorConfig(mix="heavy", arrival="poisson", jitter=0.1, seed=42)
    a = generate_jobs(CLUSTER, cfg, perf)
    b = generate_jobs(CLUSTER, cfg, ContentionModel(CLUSTER))
    assert _key(a) == _key(b)
    assert _key(a) != _key(generate_jobs(CLUSTER, replace(cfg, seed=43), perf))
    assert [j.job_id for j in a] == [str(i) for i in range(256)]


@pytest.mark.parametrize("mix", list(MIXES))
def test_mix_proportions_iid(perf: ContentionModel, mix: str) -> None:
    n = 6000
    jobs = generate_jobs(CLUSTER, GeneratorConfig(num_jobs=n, mix=mix, seed=1), perf)
    p = parse_mix(mix)
    counts = np.array([sum(j.model == m for j in jobs) for m in MODELS])
    sigma = np.sqrt(n * p * (1 - p))
    assert np.all(np.abs(counts - n * p) < 4.5 * sigma), (counts, n * p)


@pytest.mark.parametrize("mix", list(MIXES))
def test_exact_mix(perf: ContentionModel, mix: str) -> None:
    jobs = generate_jobs(CLUSTER, GeneratorConfig(mix=mix, exact_mix=True, seed=5), perf)
    quota = parse_mix(mix) * 256
    counts = np.array([sum(j.model == m for j in jobs) for m in MODELS])
    assert counts.sum() == 256 and np.all(np.abs(counts - quota) < 1)
    # Shuffled, not blocks: the first 24 jobs are not all one model.
    assert len({j.model for j in jobs[:24]}) > 1


def test_demand_distributions(perf: ContentionModel) -> None:
    cfg = GeneratorConfig(num_jobs=3000, seed=2).resolved(CLUSTER)
    assert cfg.max_gpus == 32
    assert list(demand_values(cfg)) == [1, 2, 4, 8, 16, 32]
    jobs = generate_jobs(CLUSTER, cfg, perf)
    counts = np.bincount([j.gpu_demand for j in jobs])
    assert set(np.flatnonzero(counts)) == {1, 2, 4, 8, 16, 32}
    assert np.all(np.abs(counts[[1, 2, 4, 8, 16, 32]] - 500) < 4.5 * np.sqrt(3000 * (1 / 6) * (5 / 6)))
    uni = generate_jobs(CLUSTER, replace(cfg, demand="uniform", min_gpus=3, max_gpus=12), perf)
    assert {j.gpu_demand for j in uni} == set(range(3, 13))
    ds = generate_jobs(CLUSTER, replace(cfg, demand="deepshare"), perf)
    assert {j.gpu_demand for j in ds} == {2, 4, 8}


def test_default_cap_follows_small_cluster() -> None:
    small = ClusterSpec.homogeneous(2, 4)
    assert GeneratorConfig().resolved(small).max_gpus == 8
    with pytest.raises(GeneratorError, match="larger than cluster"):
        GeneratorConfig(max_gpus=32).resolved(small)


@pytest.mark.parametrize(
    "kw",
    [
        {"num_jobs": 0},
        {"min_gpus": 0},
        {"min_gpus": 8, "max_gpus": 4},
        {"demand": "zipf"},
        {"demand": "deepshare", "max_gpus": 1},
        {"duration_s": 0},
        {"jitter": 1.0},
        {"arrival": "bursty"},
        {"arrival": "poisson", "load": 0},
        {"seed": -1},
        {"mix": "nope"},
    ],
)
def test_bad_config(kw: dict) -> None:
    with pytest.raises(GeneratorError):
        GeneratorConfig(**kw).resolved(CLUSTER)


@pytest.mark.parametrize(
    "kw, words",
    [
        # each was written as inf (or a ZeroDivisionError traceback), which no trace reader accepts
        ({"duration_s": 1e306}, "total_samples overflows the float range (inf); lower duration_s (1e+306)"),
        ({"duration_s": 1.7e308, "jitter": 0.5}, "duration overflows the float range (inf); lower duration_s"),
        ({"arrival": "poisson", "load": 2e-305}, "submit_time overflows the float range (inf); raise load (2e-305)"),
        ({"arrival": "poisson", "load": 5e-324}, "mean gap between arrivals beyond the float range"),
        ({"arrival": "poisson", "load": 1e-306}, "mean gap between arrivals beyond the float range"),
    ],
)
def test_overflow_is_refused(perf: ContentionModel, kw: dict, words: str) -> None:
    with pytest.raises(GeneratorError, match=re.escape(words)):
        generate_jobs(CLUSTER, GeneratorConfig(**kw), perf)


def test_largest_finite_values_are_written(tmp_path: Path, perf: ContentionModel) -> None:
    jobs = generate_jobs(CLUSTER, GeneratorConfig(duration_s=1e300), perf)  # the simulator refuses them, not the trace
    trainer.traces.write_trace(tmp_path / "t.csv", jobs)
    assert _key(load_trace(tmp_path / "t.csv", CLUSTER)) == _key(jobs)
    # Poisson arrivals as late as MAX_SUBMIT_TIME_S allows (the mean gap is about 1.3e6 s here)
    jobs = generate_jobs(CLUSTER, GeneratorConfig(num_jobs=100, duration_s=1e6, arrival="poisson", load=0.25), perf)
    assert 1e7 < jobs[-1].submit_time <= trainer.traces.MAX_SUBMIT_TIME_S
    trainer.traces.write_trace(tmp_path / "p.csv", jobs)
    assert _key(load_trace(tmp_path / "p.csv", CLUSTER)) == _key(jobs)


def test_about_one_hour_isolated(perf: ContentionModel) -> None:
    jobs = generate_jobs(CLUSTER, GeneratorConfig(mix="normal", seed=3), perf)
    dur = isolated_durations(jobs, perf)
    assert dur == pytest.approx(np.full(len(jobs), 3600.0), rel=1e-9)
    jit = generate_jobs(CLUSTER, GeneratorConfig(jitter=0.2, seed=3, num_jobs=2000), perf)
    dj = isolated_durations(jit, perf)
    assert dj.min() >= 3600 * 0.8 and dj.max() <= 3600 * 1.2
    assert abs(dj.mean() - 3600) < 3600 * 0.2 / np.sqrt(3 * 2000) * 4.5
    assert [j.extra["duration"] for j in jit] == pytest.approx(list(dj))


def test_zero_arrivals(perf: ContentionModel) -> None:
    jobs = generate_jobs(CLUSTER, GeneratorConfig(seed=9), perf)
    assert all(j.submit_time == 0.0 for j in jobs)
    assert trace_stats(jobs, CLUSTER, perf)["offered_load"] is None


@pytest.mark.parametrize("load", [0.5, 0.9, 1.5])
def test_poisson_load(perf: ContentionModel, load: float) -> None:
    n = 20000
    cfg = GeneratorConfig(num_jobs=n, arrival="poisson", load=load, seed=11)
    jobs = generate_jobs(CLUSTER, cfg, perf)
    rate = arrival_rate(cfg, CLUSTER)
    assert rate == pytest.approx(load * 32 / (10.5 * 3600))  # E[G] = 63 / 6 for pow2 1..32
    submit = np.array([j.submit_time for j in jobs])
    assert submit[0] == 0.0 and np.all(np.diff(submit) >= 0)
    gaps = np.diff(submit)
    assert gaps.mean() == pytest.approx(1 / rate, rel=4.5 / np.sqrt(n))
    assert np.std(gaps) / np.mean(gaps) == pytest.approx(1.0, abs=0.05)  # exponential: CV = 1
    measured = trace_stats(jobs, CLUSTER, perf)["offered_load"]
    # Relative sd of the estimate ~ sqrt(1 + CV(G)^2) / sqrt(n) ~ 1.1 %; allow 5 %.
    assert measured == pytest.approx(load, rel=0.05)


def test_sets_are_stable_and_independent(perf: ContentionModel) -> None:
    cfg = GeneratorConfig(num_jobs=64, seed=4)
    three = generate_sets(CLUSTER, cfg, 3, perf)
    five = generate_sets(CLUSTER, cfg, 5, perf)
    assert [_key(s) for s in three] == [_key(s) for s in five[:3]]
    assert len({tuple(_key(s)) for s in five}) == 5


@pytest.mark.parametrize("fmt", ["csv", "parquet", "json"])
def test_write_sets(tmp_path: Path, perf: ContentionModel, fmt: str) -> None:
    sets = generate_sets(CLUSTER, GeneratorConfig(num_jobs=16, arrival="poisson"), 3, perf)
    out = tmp_path / "sets"
    paths = write_sets(out, sets, fmt)
    assert [p.name for p in paths] == [f"set{k}.{fmt}" for k in range(3)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sets"]
    for p, s in zip(paths, sets):
        assert _key(load_trace(p, CLUSTER)) == _key(s)
    with pytest.raises(GeneratorError, match="not empty"):
        write_sets(out, sets, fmt)
    write_sets(out, sets[:1], fmt, force=True)
    assert [p.name for p in out.iterdir()] == [f"set0.{fmt}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sets"]


@pytest.mark.parametrize("rel", [".", "..", "sub/..", "sub/../..", "/"])
@pytest.mark.parametrize("force", [False, True])
def test_write_sets_refuses_cwd_and_ancestors(
    tmp_path: Path, perf: ContentionModel, monkeypatch, rel: str, force: bool
) -> None:
    """Writing into "." once failed with "PosixPath('.') has an empty name"; replacing it would remove the cwd."""
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    (work / "keep.txt").write_text("mine")
    monkeypatch.chdir(work)
    sets = generate_sets(CLUSTER, GeneratorConfig(num_jobs=4), 2, perf)
    words = "file-system root" if rel == "/" else "is the current directory or contains it"
    with pytest.raises(GeneratorError, match=words) as ei:
        write_sets(rel, sets, force=force)
    assert str(ei.value).startswith(f"{rel}: ")
    assert (work / "keep.txt").read_text() == "mine"
    assert sorted(p.name for p in work.iterdir()) == ["keep.txt", "sub"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"]


def test_write_sets_relative_paths(tmp_path: Path, perf: ContentionModel, monkeypatch) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "a" / "b")
    sets = generate_sets(CLUSTER, GeneratorConfig(num_jobs=4), 2, perf)
    paths = write_sets("../sets", sets)  # a sibling of the cwd is fine
    assert paths == [tmp_path / "a" / "sets" / "set0.csv", tmp_path / "a" / "sets" / "set1.csv"]
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["b", "sets"]
    paths = write_sets("x/../new", sets)
    assert sorted(p.name for p in (tmp_path / "a" / "b" / "new").iterdir()) == ["set0.csv", "set1.csv"]
    assert _key(load_trace(paths[1], CLUSTER)) == _key(sets[1])


def test_write_sets_failure_leaves_nothing(tmp_path: Path, perf: ContentionModel, monkeypatch) -> None:
    sets = generate_sets(CLUSTER, GeneratorConfig(num_jobs=4), 3, perf)
    real = trainer.traces.write_trace
    calls = []

    def failing(path, jobs):  # simulate a disk error on the second file
        calls.append(path)
        if len(calls) == 2:
            raise OSError("disk full")
        real(path, jobs)

    monkeypatch.setattr(trainer.traces, "write_trace", failing)
    with pytest.raises(OSError):
        write_sets(tmp_path / "sets", sets)
    assert list(tmp_path.iterdir()) == []
    # An existing directory survives a failed --force replacement unchanged.
    monkeypatch.setattr(trainer.traces, "write_trace", real)
    write_sets(tmp_path / "sets", sets[:1])
    calls.clear()
    monkeypatch.setattr(trainer.traces, "write_trace", failing)
    with pytest.raises(OSError):
        write_sets(tmp_path / "sets", sets, force=True)
    assert [p.name for p in tmp_path.iterdir()] == ["sets"]
    assert [p.name for p in (tmp_path / "sets").iterdir()] == ["set0.csv"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(min_value=0, max_value=2**32),
    mix=st.sampled_from(list(MIXES)),
    lo=st.integers(min_value=1, max_value=32),
    span=st.integers(min_value=0, max_value=31),
    demand=st.sampled_from(["pow2", "uniform"]),
    arrival=st.sampled_from(["zero", "poisson"]),
)
def test_generated_jobs_are_valid(perf: ContentionModel, seed, mix, lo, span, demand, arrival) -> None:
    hi = min(32, lo + span)
    cfg = GeneratorConfig(num_jobs=50, mix=mix, min_gpus=lo, max_gpus=hi, demand=demand, arrival=arrival, seed=seed)
    try:
        cfg.resolved(CLUSTER)
    except GeneratorError:
        assert demand == "pow2"  # a range with no power of two in it
        return
    jobs = generate_jobs(CLUSTER, cfg, perf)
    assert len(jobs) == 50
    assert all(lo <= j.gpu_demand <= hi and j.model in MODELS and j.total_samples > 0 for j in jobs)
    assert isolated_durations(jobs, perf) == pytest.approx(np.full(50, 3600.0))


# ---------------------------------------------------------------------- limits
def test_num_jobs_is_bounded(perf: ContentionModel) -> None:
    """--jobs 1000000000 was a numpy _ArrayMemoryError traceback."""
    assert GeneratorConfig(num_jobs=MAX_JOBS).resolved(CLUSTER).num_jobs == 1_000_000
    with pytest.raises(GeneratorError, match=r"^num_jobs 1000001 is more than the generator's limit of 1,000,000 jobs"):
        generate_jobs(CLUSTER, GeneratorConfig(num_jobs=MAX_JOBS + 1), perf)


def test_all_sets_together_are_bounded(perf: ContentionModel) -> None:
    with pytest.raises(GeneratorError, match=r"^3 sets of 500000 jobs are 1,500,000 jobs, more than the generator's"):
        generate_sets(CLUSTER, GeneratorConfig(num_jobs=500_000), 3, perf)


def test_submit_time_beyond_the_trace_bound_is_refused(perf: ContentionModel) -> None:
    """A tiny Poisson load drew arrivals that no trace reader (nor the simulator) accepts."""
    with pytest.raises(GeneratorError) as ei:
        generate_jobs(CLUSTER, GeneratorConfig(num_jobs=20, arrival="poisson", load=1e-6), perf)
    assert re.fullmatch(
        r"job \d+: submit_time \S+ s is beyond the largest submit time 1e\+09 s \(about 31\.7 years\); "
        r"raise load \(1e-06\), lower duration_s \(3600\) or draw fewer jobs",
        str(ei.value),
    ), str(ei.value)
