"""The intra-node factor calibrated from AdaptDL's placement measurements (policies.perf:
``calibrate_intra``, ``ADAPTDL_ETA``, ``ADAPTDL_FAMILY``, ``ContentionModel(intra=...)``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from policies.cluster import ClusterSpec
from policies.perf import (ADAPTDL_ETA, ADAPTDL_FAMILY, INTRA_CHOICES, ContentionModel, calibrate_intra,
                           load_measured_data)
from policies.workloads import MODELS

ADAPTDL = Path(__file__).resolve().parents[1] / "data" / "adaptdl-placements"
C88 = ClusterSpec.parse("8x8")


@pytest.fixture(scope="module")
def models() -> dict[str, ContentionModel]:
    return {k: ContentionModel(C88, intra=k) for k in INTRA_CHOICES}


def test_pinned_factors_follow_from_the_csvs() -> None:
    cal = calibrate_intra(sorted(ADAPTDL.glob("*.csv")))
    assert sorted(cal) == sorted(ADAPTDL_ETA)
    for name, (eta, lo, hi) in ADAPTDL_ETA.items():
        got = cal[name]
        assert (got["eta"], got["low"], got["high"]) == pytest.approx((eta, lo, hi), abs=5e-5), name
        assert lo <= eta <= hi
        assert sorted(got["per_g"]) == [2, 3, 4]  # single-node GPU counts AdaptDL measured against two nodes
        # one node is faster than two at every G (AdaptDL's throughput ratio)
        assert all(r >= 1.0 for r in got["thp_ratio"].values()), name


def test_family_mapping_covers_every_model() -> None:
    assert sorted(ADAPTDL_FAMILY) == sorted(MODELS)
    assert set(ADAPTDL_FAMILY.values()) <= set(ADAPTDL_ETA)


def test_bandwidth_is_the_default_and_unchanged(models) -> None:
    default = ContentionModel(C88)
    assert default.eta_by_model == {} and default.intra == "bandwidth"
    for m in MODELS:
        assert default.eta_for(m) == C88.bw_ratio
        for g, n in ((1, 1), (4, 1), (8, 1), (8, 2), (16, 2)):
            assert models["bandwidth"].isolated_throughput(m, g, n) == default.isolated_throughput(m, g, n)


def test_adaptdl_changes_single_node_shapes_only(models) -> None:
    base, cal = models["bandwidth"], models["adaptdl"]
    data = load_measured_data()
    for m in MODELS:
        assert cal.eta_for(m) == ADAPTDL_ETA[ADAPTDL_FAMILY[m]][0]
        assert cal.params[m] == base.params[m]  # the fit uses multi-node shapes only
        for g, n in ((2, 2), (8, 2), (8, 8), (16, 2), (24, 3)):
            assert cal.isolated_throughput(m, g, n) == base.isolated_throughput(m, g, n)
        # by hand: tau = a + b 2 (G-1)/G eta, times the model's calibration at G, floored at the best
        # measured multi-node shape of the same G
        a, b, _c = cal.params[m]
        eta = cal.eta_for(m)
        for g in (4, 8):
            best = max(t for (mm, gg, _n), t in data.isolated.items() if mm == m and gg == g)
            want = max(g / (a + b * 2 * (g - 1) / g * eta) * cal._calib.get((m, g), 1.0), best)
            assert cal.isolated_throughput(m, g, 1) == pytest.approx(want, rel=1e-12)
    # FSDP (communication-bound, mapped to BERT: eta 0.08 against 0.3125) gains most on one node
    assert cal.isolated_throughput("FSDP", 8, 1) > 1.9 * base.isolated_throughput("FSDP", 8, 1)


def test_range_orders_single_node_speeds(models) -> None:
    # a smaller factor means cheaper intra-node communication: never slower
    for m in MODELS:
        lo, mid, hi = (models[k].isolated_throughput(m, 8, 1) for k in ("adaptdl-low", "adaptdl", "adaptdl-high"))
        assert lo >= mid >= hi


def test_number_and_mapping_choices() -> None:
    one = ContentionModel(C88, intra=0.1)
    assert all(one.eta_for(m) == 0.1 for m in MODELS)
    some = ContentionModel(C88, intra={"fsdp": 0.2})
    assert some.eta_for("FSDP") == 0.2 and some.eta_for("MoE") == C88.bw_ratio
    # GPU-type speed-ups see the same factor (communication share of a one-node step)
    assert one.comm_share("FSDP", 8, 1) < ContentionModel(C88).comm_share("FSDP", 8, 1)


@pytest.mark.parametrize("bad", ["pcie", -0.1, 1.5, float("nan"), True, {"FSDP": 2.0}])
def test_bad_intra(bad) -> None:
    with pytest.raises(ValueError, match="intra"):
        ContentionModel(C88, intra=bad)


def test_calibrate_intra_errors(tmp_path: Path) -> None:
    bad = tmp_path / "x.csv"
    bad.write_text("placement,local_bsz,step_time\n1,4,0.5\n")
    with pytest.raises(ValueError, match=r"x\.csv: missing column\(s\) sync_time"):
        calibrate_intra([bad])
    bad.write_text("placement,local_bsz,step_time,sync_time\n1a,4,0.5,0.1\n")
    with pytest.raises(ValueError, match=r"x\.csv, row 2, field 'placement'"):
        calibrate_intra([bad])
    bad.write_text("placement,local_bsz,step_time,sync_time\n2,4,fast,0.1\n")
    with pytest.raises(ValueError, match=r"x\.csv, row 2, field 'step_time'"):
        calibrate_intra([bad])
    with pytest.raises(ValueError, match="cannot open"):
        calibrate_intra([tmp_path / "missing.csv"])


def test_calibrate_intra_synthetic(tmp_path: Path) -> None:
    # compute 1.0 s, two-node sync 0.5 s, one-node sync 0.1 s: step 1.5 vs 1.1 -> eta = 0.2
    f = tmp_path / "m.csv"
    f.write_text("placement,local_bsz,step_time,sync_time\n"
                 "2,8,1.1,0.1\n11,8,1.5,0.5\n4,8,1.1,0.1\n22,8,1.5,0.5\n1,8,1.0,0.0\n")
    got = calibrate_intra([f])["m"]
    assert got["eta"] == pytest.approx(0.2) and got["sync"] == pytest.approx(0.2)
    assert got["per_g"] == pytest.approx({2: 0.2, 4: 0.2})
    assert got["thp_ratio"] == pytest.approx({2: 1.5 / 1.1, 4: 1.5 / 1.1})
