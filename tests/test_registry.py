"""The one policy factory (policies.registry): names, options and errors, as the CLI, evaluate and the
controller use it."""

from __future__ import annotations

import pytest
from ckpt_helpers import write_random_checkpoint

from policies.base import PolicyError
from policies.checkpoint import CheckpointError
from policies.cluster import ClusterSpec
from policies.heuristics import OrderedPolicy
from policies.perf import ContentionModel
from policies.registry import OPTIONS, RL_NAMES, describe_names, make_policy, policy_names
from policies.rl import RLPolicy
from policies.sizefree import SizeFreePolicy

C48 = ClusterSpec.parse("4x8")
PERF = ContentionModel(C48)


def test_policy_names_cover_heuristics_and_rl():
    names = policy_names()
    assert names == ("fifo", "sjf", "sif", "lrf", "srtf", "lgtf", "las", "las2d", "greedy", "rl-base", "rl-hybrid",
                     "rl-base-4x8", "rl-hybrid-4x8", "rl-prior", "sced2", "rl-sf", "ds-las", "ds-srtf", "drf", "tetris",
                     "optimus", "chic", "chic-pair", "dl2", "planner")
    assert set(RL_NAMES) <= set(names)
    text = describe_names()
    assert all(n in text for n in names) and ":/path/to/checkpoint" in text and "-np" in text
    assert all(f":{p}" in text for p in ("pack", "nosplit", "spread", "greedy"))


@pytest.mark.parametrize(
    "name, kind, label",
    [
        ("fifo", OrderedPolicy, "fifo"),
        ("  LAS-np  ", OrderedPolicy, "las-np"),
        ("srtf:spread", OrderedPolicy, "srtf:spread"),
        ("greedy", OrderedPolicy, "greedy"),
        ("srtf:nosplit", OrderedPolicy, "srtf:nosplit"),
        ("LGTF", OrderedPolicy, "lgtf"),
        ("las2d:nosplit", OrderedPolicy, "las2d:nosplit"),
        ("sif", OrderedPolicy, "sif"),
        ("lrf-np:spread", OrderedPolicy, "lrf-np:spread"),
        ("rl-base", SizeFreePolicy, "rl-base"),
        ("rl-hybrid", SizeFreePolicy, "rl-hybrid"),
        ("rl-sf", SizeFreePolicy, "rl-sf"),
        ("rl-base-4x8", RLPolicy, "rl-base-4x8"),
        ("RL-Hybrid-4x8", RLPolicy, "rl-hybrid-4x8"),
        ("RL-Prior", RLPolicy, "rl-prior"),
    ],
)
def test_every_kind_of_name_builds(name, kind, label):
    pol = make_policy(name, C48, PERF)
    assert isinstance(pol, kind) and pol.name == label


@pytest.mark.parametrize("bad", ["nope", "rl-nosuch", "rlbase", "gredy:pack", "", "   "])
def test_an_unknown_name_lists_every_policy(bad):
    with pytest.raises(PolicyError) as ei:
        make_policy(bad, C48, PERF)
    msg = str(ei.value)
    assert len(msg.splitlines()) == 1
    assert all(n in msg for n in policy_names())
    assert ":nosplit" in msg
    if bad.strip():
        assert repr(bad) in msg and ("unknown RL policy" if bad.startswith("rl") else "unknown policy") in msg


@pytest.mark.parametrize("shape", ["4x8", "16x8", "128x8", "2x8:v100+2x4"])
def test_rl_base_and_rl_hybrid_are_size_free(shape):
    """One shipped network on any cluster: rl-base and rl-hybrid are it, without and with the safety rule."""
    cl = ClusterSpec.parse(shape)
    base, hyb, sf = (make_policy(n, cl) for n in ("rl-base", "rl-hybrid", "rl-sf"))
    assert isinstance(base, SizeFreePolicy) and base.rule is None and hyb.rule is not None and sf.rule is None
    assert base.checkpoint == hyb.checkpoint == sf.checkpoint
    assert hyb.rule.min_efficiency == 0.0 and (base.name, hyb.name, sf.name) == ("rl-base", "rl-hybrid", "rl-sf")


def test_the_fixed_shape_checkpoints_keep_their_names():
    pol = make_policy("rl-hybrid-4x8", C48, PERF)
    assert isinstance(pol, RLPolicy) and pol.hybrid and pol.checkpoint.json_path.name == "rl-hybrid-4x8.json"
    with pytest.raises(PolicyError, match=r"runs on a 4x8 cluster only, not 16x8; rl-base / rl-hybrid \(size-free\)"):
        make_policy("rl-base-4x8", ClusterSpec.parse("16x8"))
    with pytest.raises(PolicyError, match="empty checkpoint path"):
        make_policy("rl-base-4x8:", C48, PERF)


def test_checkpoint_argument_and_name_path(tmp_path):
    """A fixed-shape checkpoint named to rl-base / rl-hybrid runs as the fixed-shape policy (controller configs
    and evaluate aliases that name one keep working); a size-free one as the size-free policy."""
    ck = write_random_checkpoint(tmp_path / "ck", C48)
    by_arg = make_policy("rl-hybrid", C48, PERF, checkpoint=ck)
    by_name = make_policy(f"rl-base:{ck}", C48, PERF, checkpoint=tmp_path / "ignored")
    assert by_arg.checkpoint.json_path == by_name.checkpoint.json_path == ck
    assert by_arg.hybrid and not by_name.hybrid
    assert make_policy(f"rl-hybrid-4x8:{ck}", C48, PERF).checkpoint.json_path == ck
    shipped = make_policy("rl-sf", C48).checkpoint
    sf = make_policy(f"rl-hybrid:{shipped}", ClusterSpec.parse("16x8"))
    assert isinstance(sf, SizeFreePolicy) and sf.rule is not None and sf.checkpoint == shipped
    assert make_policy("srtf", C48, PERF, checkpoint=ck).name == "srtf"  # heuristics ignore it
    with pytest.raises(CheckpointError, match="not found"):
        make_policy(f"rl-base:{tmp_path / 'missing'}", C48, PERF)
    with pytest.raises(PolicyError, match="empty checkpoint path"):
        make_policy("rl-base:", C48, PERF)


def test_options_reach_the_policies():
    assert make_policy("srtf", C48, PERF, min_run_s=42).min_run == 42.0
    assert make_policy("srtf", C48, PERF, min_run_s=None).min_run == make_policy("srtf", C48, PERF).min_run
    rl = make_policy("rl-hybrid-4x8", C48, PERF, min_run_s=42, deterministic=False, seed=3, fast=False,
                     hybrid_floor=0.5)
    assert (rl.deterministic, rl.seed, rl.fast, rl.rule.min_efficiency) == (False, 3, False, 0.5)
    sf = make_policy("rl-hybrid", C48, PERF, min_run_s=42, deterministic=True, hybrid_floor=0.5)
    assert sf.rule.min_efficiency == 0.5
    assert make_policy("rl-prior", C48, PERF, seed=9).seed == 9
    assert set(OPTIONS) == {"min_run_s", "deterministic", "seed", "fast", "hybrid_floor", "hybrid_rule",
                            "budget_s", "horizon", "holds", "base", "alternatives", "arrivals", "work", "follow"}


@pytest.mark.parametrize(
    "name, options, match",
    [
        ("srtf", {"min_runs": 1}, r"unknown option 'min_runs'; options: min_run_s, deterministic"),
        ("srtf", {"seed": 1}, r"option 'seed' applies to the RL policies only"),
        ("srtf", {"min_run_s": -1}, r"min_run_s must be a finite number of seconds >= 0, got -1"),
        ("las", {"min_run_s": float("nan")}, r"min_run_s must be"),
        ("srtf", {"min_run_s": True}, r"min_run_s must be"),
        ("rl-hybrid", {"hybrid_rule": "best"}, r"safety rule 'best'"),
        ("rl-hybrid", {"hybrid_floor": 2.0}, r"min_efficiency"),
        ("rl-hybrid-4x8", {"hybrid_rule": "best"}, r"safety rule 'best'"),
        ("rl-base", {"hybrid_floor": 0.5}, r"option 'hybrid_floor' does not apply to rl-base \(size-free\)"),
        ("rl-base", {"seed": 1}, r"option 'seed' does not apply to rl-base \(size-free\)"),
        ("rl-hybrid", {"deterministic": False}, r"size-free policies are deterministic"),
    ],
)
def test_bad_options_are_one_clear_line(name, options, match):
    with pytest.raises(PolicyError, match=match):
        make_policy(name, C48, PERF, **options)


def test_perf_defaults_to_the_clusters_model():
    assert make_policy("greedy", C48).name == "greedy"
    assert make_policy("rl-prior", C48).codec.perf.cluster == C48
