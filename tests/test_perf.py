"""Tests for policies.perf: golden values, physics, contention rule, fit errors.

Golden values are computed here by hand from the equations in the module
docstring and ``docs/PERFORMANCE_MODEL.md``, using the fitted parameters
(which are themselves pinned, so a change of the fit is noticed and the docs
updated).
"""

from __future__ import annotations

import dataclasses
import math
import re
from itertools import pairwise
from pathlib import Path

import pytest

from policies.cluster import ClusterSpec
from policies.perf import MIN_RATIO, ContentionModel, feasible_node_counts, load_measured_data
from policies.workloads import MODELS, get_workload

DOCS = Path(__file__).resolve().parents[1] / "docs" / "PERFORMANCE_MODEL.md"
ETA = 5.0 / 16.0  # default cluster: 40 Gbps IB over PCIe Gen3 x16


@pytest.fixture(scope="module")
def model() -> ContentionModel:
    return ContentionModel()


@pytest.fixture(scope="module")
def parametric() -> ContentionModel:
    return ContentionModel(use_measured=False)


def by_hand(model: ContentionModel, name: str, gpus: int, nodes: int) -> float:
    """tau = a + b u + c (n - 1); u = 2 (G-1)/G (x eta on one node); thp = G / tau."""
    a, b, c = model.params[name]
    u = 0.0 if gpus == 1 else 2.0 * (gpus - 1) / gpus * (ETA if nodes == 1 else 1.0)
    return gpus / (a + b * u + c * (nodes - 1))


# ---------------------------------------------------------------------- data + fit
def test_measured_data_shape() -> None:
    d = load_measured_data()
    assert len(d.isolated) == 36  # 6 models x 6 shapes
    assert len(d.ratio) == 36 * 36
    assert {k[0] for k in d.isolated} == set(MODELS)
    assert {(g, n) for _, g, n in d.isolated} == {(2, 2), (4, 2), (4, 4), (8, 2), (8, 4), (8, 8)}
    assert all(0 < r <= 1.0 for r in d.ratio.values())


def test_fitted_params_pinned(model: ContentionModel) -> None:
    # Pinned to 3 significant digits (docs/PERFORMANCE_MODEL.md lists them).
    expected = {
        "FSDP": (2.389e-02, 9.346e-02, 0.0),
        "MoE": (8.712e-02, 3.532e-02, 4.353e-02),
        "Transformer-XL": (5.704e-02, 0.0, 1.832e-02),
    }
    for name, abc in expected.items():
        for got, want in zip(model.params[name], abc):
            assert got == pytest.approx(want, rel=1e-3, abs=1e-12), name
    for name in MODELS:
        a, b, c = model.params[name]
        assert a > 0 and b >= 0 and c >= 0


def test_fit_report(model: ContentionModel) -> None:
    rep = model.fit_report()
    for k in ("isolated_mape", "isolated_max_rel_err", "ratio_mae", "ratio_max_abs_err"):
        assert math.isfinite(rep[k]) and rep[k] >= 0
    assert rep["isolated_mape"] < 0.10  # the parametric form is a good fit
    assert rep["ratio_mae"] < 0.15
    assert set(rep["params"]) >= set(MODELS) and set(rep["kappa"]) >= set(MODELS)
    # The isolated MAPE recomputed by hand.
    d = model.data
    errs = [abs(by_hand(model, m, g, n) - t) / t for (m, g, n), t in d.isolated.items()]
    assert rep["isolated_mape"] == pytest.approx(sum(errs) / len(errs), rel=1e-9)


def test_fit_report_numbers_in_docs(model: ContentionModel) -> None:
    """The figures stated in docs/PERFORMANCE_MODEL.md are the current ones."""
    text = DOCS.read_text()
    rep = model.fit_report()
    for k in ("isolated_mape", "isolated_max_rel_err"):
        assert f"{100 * rep[k]:.2f} %" in text, k
    for k in ("ratio_mae", "ratio_max_abs_err"):
        assert f"{rep[k]:.3f}" in text, k
    for name in MODELS:
        assert re.search(rf"\| {re.escape(name)} \|.*{model.kappa[name]:.3f}", text), name


# ---------------------------------------------------------------------- isolated
@pytest.mark.parametrize("key", sorted(load_measured_data().isolated))
def test_measured_shapes_return_measured(model: ContentionModel, key: tuple) -> None:
    assert model.isolated_throughput(*key) == load_measured_data().isolated[key]


def test_alias_and_canonical_agree(model: ContentionModel) -> None:
    assert model.isolated_throughput("LM", 8, 2) == model.isolated_throughput("Transformer-XL", 8, 2)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("gpus, nodes", [(16, 2), (16, 4), (24, 3), (64, 8), (32, 4)])
def test_unmeasured_gpu_count_is_parametric(model: ContentionModel, name: str, gpus: int, nodes: int) -> None:
    # No measurement at this G: no calibration factor, pure formula.
    assert model.isolated_throughput(name, gpus, nodes) == pytest.approx(by_hand(model, name, gpus, nodes), rel=1e-12)


def test_golden_fsdp_16_on_2_nodes(model: ContentionModel) -> None:
    # FSDP: a = 0.023893, b = 0.093461, c = 0; u(16, 2) = 2 * 15 / 16 = 1.875.
    a, b, c = model.params["FSDP"]
    tau = a + b * 1.875 + c * 1
    assert model.isolated_throughput("FSDP", 16, 2) == pytest.approx(16 / tau)
    assert model.isolated_throughput("FSDP", 16, 2) == pytest.approx(16 / (0.023893 + 0.093461 * 1.875), rel=1e-3)


def test_golden_moe_8_on_3_nodes_is_calibrated(model: ContentionModel) -> None:
    # (MoE, 8, 3) is not measured but G = 8 is: the parametric value is scaled
    # by the median measured / parametric ratio over MoE's G = 8 shapes.
    d = model.data
    ratios = sorted(d.isolated[("MoE", 8, n)] / by_hand(model, "MoE", 8, n) for n in (2, 4, 8))
    assert model.isolated_throughput("MoE", 8, 3) == pytest.approx(by_hand(model, "MoE", 8, 3) * ratios[1], rel=1e-12)


@pytest.mark.parametrize("name", MODELS)
def test_one_gpu(model: ContentionModel, name: str) -> None:
    # One GPU: no communication at all, throughput = 1 / a.
    a = model.params[name][0]
    assert model.isolated_throughput(name, 1, 1) == pytest.approx(1.0 / a, rel=1e-12)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("gpus", [2, 4, 8])
def test_single_node_not_slower_than_measured(model: ContentionModel, name: str, gpus: int) -> None:
    one = model.isolated_throughput(name, gpus, 1)
    measured = [t for (m, g, n), t in model.data.isolated.items() if m == name and g == gpus]
    assert measured and one >= max(measured)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("gpus", [2, 3, 4, 8, 16, 24, 64])
def test_more_nodes_never_faster_parametric(parametric: ContentionModel, name: str, gpus: int) -> None:
    thp = [parametric.isolated_throughput(name, gpus, n) for n in range(1, min(gpus, 8) + 1)]
    assert all(x >= y for x, y in pairwise(thp)), thp


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("gpus", [16, 32, 64])
def test_more_nodes_never_faster_unmeasured_g(model: ContentionModel, name: str, gpus: int) -> None:
    thp = [model.isolated_throughput(name, gpus, n) for n in range(1, 9)]
    assert all(x >= y for x, y in pairwise(thp)), thp


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("nodes", [1, 2, 3, 8])
def test_more_gpus_more_throughput_from_two(parametric: ContentionModel, name: str, nodes: int) -> None:
    # For G >= 2 at a fixed node count, G / (A + B (G-1)/G) grows with G.
    # (G = 1 -> 2 need not: a communication-bound model such as FSDP can be
    # slower on 2 GPUs than on 1, see docs "Limits".)
    gs = [g for g in (2, 3, 4, 8, 16, 32, 64) if g >= nodes]
    thp = [parametric.isolated_throughput(name, g, nodes) for g in gs]
    assert all(x < y for x, y in pairwise(thp)), thp


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("gpus, nodes", [(1, 1), (16, 2), (12, 3), (24, 3), (64, 8), (8, 3)])
def test_sensible_values(model: ContentionModel, name: str, gpus: int, nodes: int) -> None:
    v = model.isolated_throughput(name, gpus, nodes)
    assert math.isfinite(v) and v > 0
    # Never better than perfect linear scaling of one GPU by more than the
    # calibration noise of the measured table (5 %).
    assert v <= gpus * model.isolated_throughput(name, 1, 1) * 1.05


@pytest.mark.parametrize("gpus, nodes", [(0, 1), (4, 0), (2, 3), (-1, 1)])
def test_impossible_shapes(model: ContentionModel, gpus: int, nodes: int) -> None:
    with pytest.raises(ValueError, match="impossible shape"):
        model.isolated_throughput("MoE", gpus, nodes)


def test_best_isolated_throughput() -> None:
    c = ClusterSpec.parse("8x8")
    m = ContentionModel(c)
    for name in MODELS:
        assert m.best_isolated_throughput(name, 16) == max(m.isolated_throughput(name, 16, n) for n in range(2, 9))
        assert m.best_isolated_throughput(name, 64) == m.isolated_throughput(name, 64, 8)
        assert m.best_isolated_throughput(name, 4) == m.isolated_throughput(name, 4, 1)


def test_feasible_node_counts() -> None:
    c = ClusterSpec.parse("4x8")
    assert feasible_node_counts(c, 1) == [1]
    assert feasible_node_counts(c, 8) == [1, 2, 3, 4]
    assert feasible_node_counts(c, 3) == [1, 2, 3]
    assert feasible_node_counts(c, 16) == [2, 3, 4]
    assert feasible_node_counts(c, 32) == [4]
    with pytest.raises(ValueError, match="do not fit"):
        feasible_node_counts(c, 33)
    from policies.cluster import NodeSpec

    het = ClusterSpec((NodeSpec("a", 8), NodeSpec("b", 4), NodeSpec("c", 2)))
    assert feasible_node_counts(het, 10) == [2, 3]
    assert feasible_node_counts(het, 13) == [3]


def test_eta_follows_cluster_bandwidth() -> None:
    fast = ClusterSpec.homogeneous(4, 8, intra_bw_gbps=16.0, inter_bw_gbps=16.0)
    m = ContentionModel(fast, use_measured=False)
    assert m.eta == 1.0
    # With equal bandwidths and c = 0, one node is exactly as fast as two.
    assert m.isolated_throughput("FSDP", 8, 1) == pytest.approx(m.isolated_throughput("FSDP", 8, 2))


# ---------------------------------------------------------------------- contention
def test_single_node_job_has_no_contention(model: ContentionModel) -> None:
    heavy = ("FSDP", 8, 4)
    assert model.pair_cs(("MoE", 8, 1), heavy) == 1.0
    assert model.pair_cs(heavy, ("MoE", 8, 1)) == 1.0
    assert model.job_cs(("MoE", 4, 1), [0], {0: [heavy, ("MoE", 8, 2)]}) == 1.0


def test_pair_cs_measured(model: ContentionModel) -> None:
    for (a, b), r in list(model.data.ratio.items())[::97]:
        assert model.pair_cs(a, b) == pytest.approx(1.0 / max(r, MIN_RATIO))
        assert model.pair_cs(a, b) >= 1.0


def test_pair_cs_parametric_by_hand(model: ContentionModel) -> None:
    # (MoE, 16, 2) next to (FSDP, 8, 2): 16 GPUs is not measured.
    a, b, c = model.params["MoE"]
    comm = b * (2 * 15 / 16) + c * 1
    chi = comm / (a + comm)
    beta = get_workload("FSDP").bandwidth_mbps / 5000.0  # link: 5 GB/s
    want = 1.0 + model.kappa["MoE"] * chi * beta
    assert model.pair_cs(("MoE", 16, 2), ("FSDP", 8, 2)) == pytest.approx(want, rel=1e-12)
    assert want > 1.0


def test_job_cs_combination_by_hand(model: ContentionModel) -> None:
    me = ("MoE", 8, 2)
    b, c, d = ("FSDP", 8, 2), ("Transformer-XL", 4, 2), ("DLRM", 4, 4)
    r = model.data.ratio
    node0 = (1 / r[(me, b)] - 1) + (1 / r[(me, c)] - 1)  # excess adds up on a node
    node1 = 1 / r[(me, d)] - 1
    want = 1 + max(node0, node1)  # the slowest node bounds the ring
    got = model.job_cs(me, [0, 1], {0: [b, c], 1: [d]})
    assert got == pytest.approx(want, rel=1e-12)
    # An empty neighbourhood costs nothing; a node not listed has no neighbours.
    assert model.job_cs(me, [0, 1], {}) == 1.0
    assert model.job_cs(me, [0, 1], {1: [d]}) == pytest.approx(1 / r[(me, d)])
    # The floor on achieved / isolated caps CS at 1 / MIN_RATIO.
    assert model.job_cs(me, [0], {0: [b] * 50}) == pytest.approx(1.0 / MIN_RATIO)


def test_contention_monotone_in_neighbours(model: ContentionModel) -> None:
    me = ("Transformer-XL", 8, 2)
    others = [("MoE", 8, 2), ("FSDP", 8, 4), ("DLRM", 8, 8), ("GraphSage", 4, 2)]
    prev = 1.0
    for k in range(1, len(others) + 1):
        cs = model.job_cs(me, [0, 1], {0: others[:k]})
        assert cs >= prev
        prev = cs


# ---------------------------------------------------------------------- eta from placements
def test_estimate_eta_synthetic(tmp_path: Path) -> None:
    from policies.perf import estimate_eta

    f = tmp_path / "toy.csv"
    f.write_text(
        "placement,local_bsz,step_time,sync_time\n"
        "1,8,0.5,0.001\n"  # one GPU: no communication, ignored
        "2,8,0.5,0.10\n"
        "11,8,0.9,0.40\n"  # G = 2: 0.10 / 0.40 = 0.25
        "4,8,0.5,0.30\n"
        "22,8,0.9,1.00\n"
        "1111,8,0.9,1.40\n"  # G = 4: 0.30 / median(1.0, 1.4) = 0.25
        "3,8,0.5,0.20\n"  # G = 3 only on one node: not used
    )
    g = tmp_path / "other.csv"
    g.write_text("placement,sync_time\n2,0.5\n11,1.0\n")
    est = estimate_eta([f, g])
    assert est["toy"] == pytest.approx(0.25)
    assert est["other"] == pytest.approx(0.5)
    assert est["all"] == pytest.approx(0.375)


def test_estimate_eta_errors(tmp_path: Path) -> None:
    from policies.perf import estimate_eta

    bad = tmp_path / "bad.csv"
    bad.write_text("placement,step_time\n2,0.1\n")
    with pytest.raises(ValueError, match="bad.csv: missing column.*sync_time"):
        estimate_eta([bad])
    bad.write_text("placement,sync_time\n2,0.1\n1x1,0.2\n")
    with pytest.raises(ValueError, match="bad.csv, row 3, field 'placement'"):
        estimate_eta([bad])
    bad.write_text("placement,sync_time\n2,fast\n")
    with pytest.raises(ValueError, match="row 2, field 'sync_time'"):
        estimate_eta([bad])
    with pytest.raises(ValueError, match="cannot open"):
        estimate_eta([tmp_path / "missing.csv"])


def test_estimate_eta_adaptdl_data() -> None:
    from policies.perf import estimate_eta

    files = sorted((Path(__file__).resolve().parents[1] / "data" / "adaptdl-placements").glob("*.csv"))
    assert len(files) == 6
    est = estimate_eta(files)
    assert set(est) == {f.stem for f in files} | {"all"}
    # Intra-node communication is cheaper than inter-node on that testbed.
    assert all(0.0 < v < 1.0 for v in est.values())
    # The figure quoted in docs/PERFORMANCE_MODEL.md.
    assert f"{est['all']:.3f}" in DOCS.read_text()


# ---------------------------------------------------------------------- registered workloads
@pytest.fixture()
def registry(monkeypatch):
    """The workload registry, restored after the test."""
    from policies import workloads

    monkeypatch.setattr(workloads, "_REGISTRY", dict(workloads._REGISTRY))
    monkeypatch.setattr(workloads, "_ALIASES", dict(workloads._ALIASES))
    return workloads


@pytest.mark.parametrize(
    "field, value, msg",
    [
        ("bandwidth_mbps", -100.0, r"workload 'New': bandwidth_mbps must be a finite number >= 0, got -100.0"),
        ("bandwidth_mbps", float("nan"), r"bandwidth_mbps must be a finite number >= 0, got nan"),
        ("bandwidth_mbps", float("inf"), r"bandwidth_mbps must be a finite number >= 0, got inf"),
        ("bandwidth_mbps", "900", r"bandwidth_mbps must be a finite number >= 0, got '900'"),
        ("comm_comp", -1.0, r"workload 'New': comm_comp must be a finite number >= 0, got -1.0"),
        ("comm_comp", float("nan"), r"comm_comp must be a finite number >= 0, got nan"),
        ("comm_comp", True, r"comm_comp must be a finite number >= 0, got True"),
        ("per_gpu_throughput", None, r"per_gpu_throughput must be a finite number > 0"),
        ("per_gpu_throughput", 0.0, r"per_gpu_throughput must be a finite number > 0"),
        ("per_gpu_throughput", float("nan"), r"per_gpu_throughput must be a finite number > 0 .*got nan"),
        ("per_gpu_throughput", float("inf"), r"per_gpu_throughput must be a finite number > 0 .*got inf"),
        ("family_index", -1, r"family_index must be an integer >= 0, got -1"),
        ("family_index", 1.5, r"family_index must be an integer >= 0, got 1.5"),
        ("pattern", None, r"pattern must be a string"),
        ("name", "", r"name must be a non-empty string"),
    ],
)
def test_register_workload_validates_every_field(registry, field, value, msg) -> None:
    """A negative or NaN bandwidth / comm ratio (which would give negative throughputs, CS < 1 or NaN) is a
    clear error, and nothing is registered."""
    import dataclasses

    good = registry.WorkloadProfile("New", 500.0, 2.0, per_gpu_throughput=100.0)
    registry.register_workload(dataclasses.replace(good, name="Fine"))  # the base profile is valid
    before = registry.known_models()
    with pytest.raises(ValueError, match=msg):
        registry.register_workload(dataclasses.replace(good, **{field: value}))
    assert registry.known_models() == before
    with pytest.raises(ValueError, match=r"aliases must be non-empty strings"):
        registry.register_workload(good, aliases=("",))


def test_registered_workload_is_priced_sensibly(registry) -> None:
    registry.register_workload(registry.WorkloadProfile("New", 500.0, 2.0, per_gpu_throughput=100.0), aliases=("nw",))
    m = ContentionModel(ClusterSpec.parse("4x8"))
    assert m.isolated_throughput("nw", 1, 1) == pytest.approx(100.0)
    assert 0 < m.isolated_throughput("New", 8, 2) < 800.0
    assert m.pair_cs(("New", 8, 2), ("MoE", 8, 2)) >= 1.0


def test_model_registered_after_the_contention_model_gives_a_clear_error(registry) -> None:
    """An UnknownModelError naming the model, not a bare KeyError('Late') from the parameter table."""
    from policies.workloads import UnknownModelError

    m = ContentionModel(ClusterSpec.parse("4x8"))
    registry.register_workload(registry.WorkloadProfile("Late", 500.0, 2.0, per_gpu_throughput=100.0))
    for call in (
        lambda: m.isolated_throughput("Late", 4, 1),
        lambda: m.best_isolated_throughput("Late", 8),
        lambda: m.pair_cs(("Late", 8, 2), ("MoE", 8, 2)),
    ):
        with pytest.raises(UnknownModelError, match=r"model 'Late' was registered after this ContentionModel was built"):
            call()
    assert ContentionModel(ClusterSpec.parse("4x8")).isolated_throughput("Late", 1, 1) == pytest.approx(100.0)


# ---------------------------------------------------------------------- GPU types
GAVEL_CSV = Path(__file__).resolve().parents[1] / "policies" / "data" / "gavel" / "single_gpu_throughputs.csv"


def _gavel_factor_by_hand(gavel_model: str, gpu_type: str) -> float:
    """Geometric mean over the model's batch sizes of thp(type) / thp(P100), read from the CSV here."""
    import csv

    logs = []
    with GAVEL_CSV.open() as f:
        for row in csv.DictReader(f):
            if row["model"] == gavel_model and float(row[gpu_type]) > 0 and float(row["p100"]) > 0:
                logs.append(math.log(float(row[gpu_type]) / float(row["p100"])))
    return math.exp(sum(logs) / len(logs))


def test_gavel_data_is_whole() -> None:
    from policies.gputypes import gavel_throughputs

    rows = gavel_throughputs()
    assert len(rows) == 26  # Gavel's single-GPU table: 7 models, 26 (model, batch size) rows
    assert {r.model for r in rows} == {
        "ResNet-18", "ResNet-50", "Transformer", "A3C", "LM", "Recommendation", "CycleGAN"
    }
    assert all(r.steps_per_s["p100"] > 0 and r.steps_per_s["v100"] > 0 for r in rows)
    assert [(r.model, r.batch_size) for r in rows if r.steps_per_s["k80"] == 0] == [("ResNet-50", 128)]


def test_speed_table_follows_from_gavel_and_the_mapping() -> None:
    from policies.gputypes import FAMILY_TO_GAVEL, REFERENCE_TYPE, speed_table

    t = speed_table()
    assert sorted(t) == ["k80", "p100", "titanxp", "v100"] and REFERENCE_TYPE == "titanxp"
    assert set(FAMILY_TO_GAVEL) == set(MODELS)
    every = ("ResNet-18", "ResNet-50", "Transformer", "A3C", "LM", "Recommendation", "CycleGAN")
    for gt in ("k80", "v100"):
        overall = math.exp(sum(math.log(_gavel_factor_by_hand(m, gt)) for m in every) / len(every))
        for fam, (gm, why) in FAMILY_TO_GAVEL.items():
            want = overall if gm == "*" else _gavel_factor_by_hand(gm, gt)
            assert t[gt][fam] == pytest.approx(want, rel=1e-12), (gt, fam)
            assert why
        assert t[gt]["*"] == pytest.approx(overall, rel=1e-12)
    assert all(v == 1.0 for v in t["p100"].values()) and all(v == 1.0 for v in t["titanxp"].values())


def test_speed_factors_pinned() -> None:
    """The numbers docs/PERFORMANCE_MODEL.md states ("GPU types, CPUs and memory")."""
    from policies.gputypes import speed_table

    from policies.gputypes import FAMILY_TO_GAVEL

    t = speed_table()
    want = {  # family: (V100, K80)
        "MobileNetV3": (1.526, 0.277), "GraphSage": (1.398, 0.305), "DLRM": (1.533, 0.316),
        "Transformer-XL": (1.295, 0.393), "FSDP": (1.295, 0.393), "MoE": (1.295, 0.393),
    }
    docs = DOCS.read_text()
    for fam, (v100, k80) in want.items():
        assert (round(t["v100"][fam], 3), round(t["k80"][fam], 3)) == (v100, k80), fam
        gm = FAMILY_TO_GAVEL[fam][0].replace("*", "all (geometric mean)")
        assert f"| {fam} | {gm} | {v100:.3f} | {k80:.3f} |" in docs, fam


def test_speed_factor_names_and_overrides() -> None:
    from policies.gputypes import UnknownGPUTypeError, check_speed, normalize_gpu_type, speed_factor, speed_table

    v = speed_table()["v100"]
    for name in ("v100", "V100", "Tesla-V100", "tesla_v100", "NVIDIA V100", "nvidia-tesla-v100"):
        assert normalize_gpu_type(name) == "v100" and speed_factor(name, "MoE") == v["MoE"]
    assert normalize_gpu_type("Titan_Xp") == "titanxp" and speed_factor("TITAN-XP", "MoE") == 1.0
    assert normalize_gpu_type("A100") == normalize_gpu_type("nvidia_a100") == "a100"  # unknown: still comparable
    assert speed_factor(None, "MoE") == 1.0
    assert speed_factor("v100", "moe") == v["MoE"]  # an alias of the model
    assert speed_factor("v100", "not-a-model") == v["*"]
    assert speed_factor("a100", "MoE", gpu_speed=2.5) == 2.5
    assert speed_factor("v100", "MoE", gpu_speed=0.9) == 0.9  # the node's own factor wins
    with pytest.raises(UnknownGPUTypeError) as err:
        speed_factor("a100", "MoE")
    assert str(err.value) == (
        "unknown GPU type 'a100' (known: k80, p100, titanxp, v100); give the node's speed relative to a "
        "TITAN Xp with gpu_speed in a cluster file"
    )
    check_speed("a100", 2.0)
    check_speed(None, None)
    with pytest.raises(UnknownGPUTypeError, match="^x: unknown GPU type 'h100'"):
        check_speed("h100", None, "x: ")


def test_contention_model_is_a_performance_model(model: ContentionModel) -> None:
    from policies.perf import PerformanceModel

    assert isinstance(model, PerformanceModel)


def test_untyped_throughput_is_the_isolated_throughput_bit_for_bit() -> None:
    """Every number on a cluster without GPU types stays as it was (the golden tests rely on it); a
    cluster all of the reference type (or of P100, taken as equal to it) gives the same numbers."""
    from policies.cluster import Placement
    from policies.job import JobSpec
    from policies.resources import Allocation, ResourceDemand

    plain = ContentionModel(ClusterSpec.parse("4x8"))
    for spec in ("4x8:titanxp", "4x8:p100"):
        same = ContentionModel(ClusterSpec.parse(spec))
        assert same.cluster.is_typed
        for name in MODELS:
            for g in (1, 2, 4, 8, 16, 32):
                assert same.best_isolated_throughput(name, g) == plain.best_isolated_throughput(name, g)
    for name in MODELS:
        for p in map(Placement.of, ({0: 1}, {0: 8}, {0: 4, 2: 4}, {0: 8, 1: 8, 3: 8})):
            iso = plain.isolated_throughput(name, p.total_gpus, p.num_nodes)
            assert plain.throughput(name, p) == iso
            job = JobSpec("j", 0.0, name, p.total_gpus, 1.0)
            alloc = Allocation.from_placement(p, ResourceDemand(p.total_gpus), plain.cluster)
            assert plain.throughput(job, alloc) == iso
            assert plain.throughput(job, p, ClusterSpec.parse("4x8:p100")) == iso


def test_typed_throughput_by_hand() -> None:
    """thp = isolated / ((1 - s) / f + s), f the slowest factor over the job's nodes, s the communication
    share (b u + c (n - 1)) / tau of the fitted model; one GPU: exactly f times the reference."""
    from policies.cluster import Placement
    from policies.gputypes import speed_table

    cl = ClusterSpec.parse("2x8:v100+2x8:k80")
    m = ContentionModel(cl)
    for name in MODELS:
        fv, fk = speed_table()["v100"][name], speed_table()["k80"][name]
        assert m.node_factors(name) == (fv, fv, fk, fk)
        one = m.throughput(name, Placement.of({1: 1}))
        assert one == pytest.approx(fv * m.isolated_throughput(name, 1, 1), rel=1e-12)
        for p, f in ((Placement.of({0: 8}), fv), (Placement.of({2: 4, 3: 4}), fk), (Placement.of({1: 4, 2: 4}), fk),
                     (Placement.of({0: 8, 1: 8}), fv)):
            g, n = p.total_gpus, p.num_nodes
            a, b, c = m.params[name]
            u = 0.0 if g == 1 else 2.0 * (g - 1) / g * (ETA if n == 1 else 1.0)
            s = (b * u + c * (n - 1)) / (a + b * u + c * (n - 1))
            want = m.isolated_throughput(name, g, n) / ((1 - s) / f + s)
            assert m.throughput(name, p) == pytest.approx(want, rel=1e-12), (name, p)
        # faster GPUs: faster, slower: slower; a job over both types runs at the slow pace
        iso = m.isolated_throughput(name, 8, 2)
        assert m.throughput(name, Placement.of({0: 4, 1: 4})) > iso > m.throughput(name, Placement.of({1: 4, 2: 4}))
        assert m.throughput(name, Placement.of({1: 4, 2: 4})) == m.throughput(name, Placement.of({2: 4, 3: 4}))


def test_gpu_speed_from_the_cluster_file_is_used(tmp_path: Path) -> None:
    from policies.cluster import Placement

    f = tmp_path / "c.yaml"
    f.write_text("nodes:\n  - {gpus: 8, gpu_type: h100, gpu_speed: 3.0}\n  - {gpus: 8}\n")
    m = ContentionModel(ClusterSpec.parse(f))
    assert m.node_factors("MoE") == (3.0, 1.0)
    assert m.throughput("DLRM", Placement.of({0: 1})) == pytest.approx(3.0 * m.isolated_throughput("DLRM", 1, 1))
    assert m.throughput("DLRM", Placement.of({1: 8})) == m.isolated_throughput("DLRM", 8, 1)


def test_unknown_type_built_in_code_fails_when_priced() -> None:
    from policies.cluster import NodeSpec, Placement
    from policies.gputypes import UnknownGPUTypeError

    m = ContentionModel(ClusterSpec((NodeSpec("n", 8, "h100"),)))
    with pytest.raises(UnknownGPUTypeError, match="unknown GPU type 'h100'"):
        m.throughput("MoE", Placement.of({0: 8}))
    with pytest.raises(UnknownGPUTypeError, match="unknown GPU type 'h100'"):
        m.best_isolated_throughput("MoE", 8)


def test_best_isolated_throughput_on_a_typed_cluster() -> None:
    """The best over speed levels: each level's nodes (factor >= f) at their best node count, priced at f."""
    from policies.cluster import NodeSpec

    # 1 V100 node of 4 GPUs, 3 K80 nodes of 8: 4 GPUs fit on the V100 node, 8 only on K80 nodes (or
    # spread over both, at the K80 pace)
    cl = ClusterSpec((NodeSpec("v", 4, "v100"), *(NodeSpec(f"k{i}", 8, "k80") for i in range(3))))
    m = ContentionModel(cl)
    plain = ContentionModel(ClusterSpec((NodeSpec("v", 4), *(NodeSpec(f"k{i}", 8) for i in range(3)))))
    for name in MODELS:
        fv, fk = m.node_factors(name)[0], m.node_factors(name)[1]
        assert m.best_isolated_throughput(name, 4) == pytest.approx(
            m.isolated_throughput(name, 4, 1) * m.type_speedup(name, 4, 1, fv), rel=1e-12
        )
        want8 = max(plain.isolated_throughput(name, 8, n) * m.type_speedup(name, 8, n, fk) for n in range(1, 5))
        assert m.best_isolated_throughput(name, 8) == pytest.approx(want8, rel=1e-12)
        # an all-V100 cluster: every demand faster than on reference GPUs
        fast, ref = ContentionModel(ClusterSpec.parse("4x8:v100")), ContentionModel(ClusterSpec.parse("4x8"))
        for g in (1, 4, 8, 16, 32):
            assert fast.best_isolated_throughput(name, g) > ref.best_isolated_throughput(name, g)
    with pytest.raises(ValueError, match="do not fit"):
        m.best_isolated_throughput("MoE", 29)


def test_comm_share(model: ContentionModel) -> None:
    for name in MODELS:
        assert model.comm_share(name, 1, 1) == 0.0
        for g, n in ((8, 1), (8, 2), (16, 4)):
            assert 0.0 <= model.comm_share(name, g, n) < 1.0
        assert model.type_speedup(name, 8, 2, 1.0) == pytest.approx(1.0, rel=1e-15)


# ---------------------------------------------------------------------- contention rules: link and ds-min
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from policies.ledger import CONTENTION_RULES, CS_CAP, DS_CS_CAP, job_cs, node_cs  # noqa: E402
from policies.perf import (  # noqa: E402
    TESTBED_LINK_MBPS,
    fit_link_demand,
    link_fit_markdown,
    neighbours_markdown,
    neighbours_table,
)


@pytest.fixture(scope="module")
def rules() -> dict[str, ContentionModel]:
    return {rule: ContentionModel(contention=rule) for rule in CONTENTION_RULES}


_KEYS = sorted({a for a, _b in load_measured_data().ratio})
_key = st.one_of(st.sampled_from(_KEYS), st.tuples(st.sampled_from(list(MODELS)), st.sampled_from([8, 16, 32]),
                                                   st.sampled_from([1, 2, 4, 8])))


def test_contention_is_recorded(rules) -> None:
    for rule, m in rules.items():
        assert m.contention == rule and m.fit_report()["contention"] == rule
    assert rules["link"].fit_report()["link"]["mae"] == rules["link"].link_fit().mae
    assert "link" not in rules["sum"].fit_report()


def test_link_fit_is_the_ledger_rule_on_one_neighbour(rules) -> None:
    """The calibration's vectorised one-neighbour prediction is :func:`policies.ledger.node_cs` under ``link``."""
    m = rules["link"]
    fit = m.link_fit()
    errs = [abs(1.0 / node_cs(m, a, [b]) - r) for (a, b), r in m.data.ratio.items()]
    assert len(errs) == fit.pairs == 36 * 36
    assert sum(errs) / len(errs) == pytest.approx(fit.mae, rel=1e-12)
    assert max(errs) == pytest.approx(fit.max_abs_err, rel=1e-12)
    # the fit beats taking Table I's bandwidths as they are (sigma = 1 for every model)
    flat = ContentionModel(contention="link")
    flat._link_fit = dataclasses.replace(fit, sigma={k: 1.0 for k in fit.sigma})
    flat_mae = sum(abs(1.0 / node_cs(flat, a, [b]) - r) for (a, b), r in m.data.ratio.items()) / len(errs)
    assert fit.mae < flat_mae


def test_link_fit_pinned_and_quoted_in_the_docs(rules) -> None:
    fit = rules["link"].link_fit()
    assert fit.capacity_mbps == TESTBED_LINK_MBPS == 5000.0
    assert fit.mae == pytest.approx(0.1279, abs=5e-4) and fit.sum_mae == pytest.approx(0.1058, abs=5e-4)
    text = DOCS.read_text()
    assert link_fit_markdown() in text
    assert neighbours_markdown() in text


def test_link_one_neighbour_physics(rules) -> None:
    """One neighbour at most halves a saturated link: CS <= 1 + chi; jobs whose demands fit the link do not slow."""
    m = rules["link"]
    for a in _KEYS:
        d, chi = m.link_terms(a)
        for b in _KEYS:
            cs = node_cs(m, a, [b])
            assert 1.0 <= cs <= 1.0 + chi + 1e-12
            if d + m.link_terms(b)[0] <= m.link_capacity_mbps:
                assert cs == 1.0
    assert m.link_terms(("MoE", 8, 1)) == (0.0, 0.0)


def test_link_has_no_cap_and_a_wider_link_helps() -> None:
    m = ContentionModel(contention="link")
    me = ("FSDP", 8, 8)
    assert job_cs(m, me, [[me] * 40]) > CS_CAP  # no arbitrary cap
    assert m.link_capacity_mbps == 5000.0
    # 100 Gbps links (intra-node bandwidth scaled alike, so eta and the fitted a, b, c stay)
    cl = dataclasses.replace(ClusterSpec.homogeneous(4, 8), inter_bw_gbps=12.5, intra_bw_gbps=40.0)
    fast = ContentionModel(cl, contention="link")
    assert fast.link_capacity_mbps == 12500.0 and fast.link_fit() == m.link_fit()
    for k in (1, 2, 4, 8):
        assert job_cs(fast, me, [[me] * k]) <= job_cs(m, me, [[me] * k])


@settings(max_examples=150, deadline=None)
@given(_key, st.lists(_key, max_size=6), _key, st.sampled_from(CONTENTION_RULES))
def test_every_rule_is_at_least_one_and_monotone_in_neighbours(me, others, extra, rule) -> None:
    """CS >= 1 under every rule, and a further neighbour on a node never lowers it (nor reordering changes
    ``ds-min`` and ``link``); ``ds-min`` stays within 1 / 0.35, ``sum`` within its cap."""
    m = _RULE_MODELS[rule]
    base = job_cs(m, me, [others])
    more = job_cs(m, me, [others + [extra]])
    assert base >= 1.0 and more >= base - 1e-12
    if me[2] <= 1:
        assert base == more == 1.0
    if rule == "ds-min":
        assert more <= DS_CS_CAP
    if rule == "sum":
        assert more <= CS_CAP
    if rule != "sum":
        assert job_cs(m, me, [others[::-1]]) == base


_RULE_MODELS = {rule: ContentionModel(contention=rule) for rule in CONTENTION_RULES}


def test_neighbours_table(rules) -> None:
    """One neighbour: ``sum`` and ``ds-min`` give the measured pair, ``link`` its fit; more identical
    neighbours: ``sum`` grows by the pair's excess each, ``ds-min`` stays, ``link`` grows."""
    rows = neighbours_table()
    assert len(rows) == 6 * 3
    r = load_measured_data().ratio
    for model_name, rule, cs in rows:
        me = (model_name, 4, 4)
        one = 1.0 / r[(me, me)]
        assert cs == sorted(cs)  # monotone in k
        if rule == "sum":
            assert cs == pytest.approx([1 + k * (one - 1) for k in (1, 2, 3, 4)], rel=1e-12)
        elif rule == "ds-min":
            assert cs == pytest.approx([min(one, DS_CS_CAP)] * 4, rel=1e-12)
        else:
            assert cs[0] == pytest.approx(node_cs(rules["link"], me, [me]), rel=1e-12)


def test_fit_link_demand_is_deterministic(rules) -> None:
    a, b = fit_link_demand(rules["sum"]), rules["link"].link_fit()
    assert a == b
