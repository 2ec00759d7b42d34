"""The parameter-server speed model: fits to DL2's measurements, its shape, and the performance model
that prices PS jobs beside all-reduce ones."""

from __future__ import annotations

import math

import pytest

from policies.cluster import ClusterSpec, Placement
from policies.elastic import ElasticPlacement
from policies.perf import ContentionModel
from policies.psmodel import (
    EPOCH_SIZE,
    PS_MODELS,
    PSPerformanceModel,
    canonical_ps_model,
    fit_ps_models,
    fit_report,
    load_ps_measurements,
)


def test_every_seed_model_is_fitted_with_non_negative_coefficients():
    models = fit_ps_models()
    assert set(models) == set(PS_MODELS) == set(EPOCH_SIZE)
    for m in models.values():
        assert m.points >= 50
        assert all(t >= 0 for t in m.theta) and any(t > 0 for t in m.theta)


def test_fit_errors_are_the_documented_ones():
    # docs/ELASTIC.md, "Fit": mean absolute relative error of the speed per model, 3-12 %
    rep = {r["model"]: r for r in fit_report()}
    for name, r in rep.items():
        assert r["mape"] < 0.12, name
    assert rep["CTC"]["mape"] < 0.04 and rep["Inception-BN"]["mape"] < 0.05


def test_fit_recomputed_from_the_measurements():
    data = load_ps_measurements()
    m = fit_ps_models()["ResNeXt-110"]
    pts = [(p, w, s) for p, w, s in data["ResNeXt-110"] if s > 0]
    ape = [abs(m.speed(w, p) - s) / s for p, w, s in pts]
    assert math.isclose(sum(ape) / len(ape), m.mape, rel_tol=1e-9)
    assert math.isclose(max(ape), m.max_ape, rel_tol=1e-9)


@pytest.mark.parametrize("name", PS_MODELS)
def test_speed_is_unimodal_in_ps_and_in_workers(name):
    m = fit_ps_models()[name]
    for w in (1, 2, 4, 8, 16):
        s = [m.speed(w, p) for p in range(1, 24)]
        k = s.index(max(s))
        assert all(a <= b * (1 + 1e-12) for a, b in zip(s[:k], s[1:k + 1]))  # rises to its best ...
        assert all(a >= b * (1 - 1e-12) for a, b in zip(s[k:], s[k + 1:]))  # ... then falls
    for p in (1, 4, 12):
        s = [m.speed(w, p) for w in range(1, 24)]
        k = s.index(max(s))
        assert all(a <= b * (1 + 1e-12) for a, b in zip(s[:k], s[1:k + 1]))
        assert all(a >= b * (1 - 1e-12) for a, b in zip(s[k:], s[k + 1:]))


def test_no_worker_or_no_ps_trains_nothing():
    m = fit_ps_models()["VGG-16"]
    assert m.speed(0, 3) == 0.0 and m.speed(3, 0) == 0.0
    assert m.best_ps(4) in range(1, 24)
    assert m.speed(4, m.best_ps(4)) >= max(m.speed(4, p) for p in range(1, 24)) * (1 - 1e-12)


def test_more_ps_helps_a_ps_bound_job_as_measured():
    # DL2's measurements: ResNet-50 with 8 workers is faster with 4 PSs than with 1
    data = {(p, w): s for p, w, s in load_ps_measurements()["ResNet-50"]}
    m = fit_ps_models()["ResNet-50"]
    assert data[(4, 8)] > data[(1, 8)]
    assert m.speed(8, 4) > m.speed(8, 1)


def test_aliases():
    assert canonical_ps_model("resnet-50") == "ResNet-50"
    assert canonical_ps_model("cnn-text-classification") == "CTC"
    assert canonical_ps_model("MoE") is None


def test_performance_model_prices_ps_and_all_reduce_jobs():
    cl = ClusterSpec.homogeneous(4, 8)
    base = ContentionModel(cl)
    perf = PSPerformanceModel(base)
    m = fit_ps_models()["Seq2Seq"]
    meas = {(w, p): s for p, w, s in load_ps_measurements()["Seq2Seq"]}
    assert perf.throughput("Seq2Seq", ElasticPlacement.make({0: 3}, 5)) == meas[(3, 5)]  # measured
    fit = perf.fitted()
    assert not fit.use_measured and fit.throughput("Seq2Seq", ElasticPlacement.make({0: 3}, 5)) == m.speed(3, 5)
    # the PS count of a plain placement: the best one for its workers
    best = m.best_ps(3, measured=True)
    assert perf.throughput("Seq2Seq", Placement.of({0: 3})) == pytest.approx(m.measured_speed(3, best))
    assert perf.best_isolated_throughput("Seq2Seq", 3) == pytest.approx(m.measured_speed(3, best))
    assert fit.best_isolated_throughput("Seq2Seq", 3) == pytest.approx(m.speed(3, m.best_ps(3)))
    # all-reduce models are the base model's, contention included
    p = Placement.of({0: 4, 1: 4})
    assert perf.throughput("DLRM", p) == base.throughput("DLRM", p)
    a, b = ("DLRM", 8, 2), ("Transformer-XL", 8, 2)
    assert perf.pair_cs(a, b) == base.pair_cs(a, b) > 1.0
    assert perf.pair_cs(a, ("VGG-16", 8, 2)) == 1.0 == perf.pair_cs(("VGG-16", 8, 2), a)


def test_measured_speed_follows_the_measurements():
    data = load_ps_measurements()["Seq2Seq"]  # measured at odd counts only
    m = fit_ps_models()["Seq2Seq"]
    meas = {(w, p): s for p, w, s in data if s > 0}
    for (w, p), s in meas.items():
        assert m.measured_speed(w, p) == s
    # between measured points: between the neighbours' ratios to the fit
    r = [meas[(3, 3)] / m.speed(3, 3), meas[(5, 3)] / m.speed(5, 3)]
    got = m.measured_speed(4, 3) / m.speed(4, 3)
    assert min(r) - 1e-9 <= got <= max(r) + 1e-9
    # beyond the grid: the fit scaled by the nearest measured point's ratio
    assert m.measured_speed(40, 3) == pytest.approx(m.speed(40, 3) * meas[(11, 3)] / m.speed(11, 3))
    assert m.measured_speed(0, 3) == 0.0
    # along the diagonal (DL2's Fig. 1 setting) the measurements speed ResNet-50 up ~2x by 5:5
    r50 = fit_ps_models()["ResNet-50"]
    assert r50.measured_speed(5, 5) / r50.measured_speed(1, 1) > 2.0
