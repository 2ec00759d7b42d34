"""DL2's feature transforms (``DL2Spec.remaining``, ``DL2Spec.counts``): ``log1p`` encodes ln(1 + epochs) /
ln(1 + workers or PSs) at its scale, is recorded in the checkpoint's spec and read back; a spec without the
fields is the seed's linear features, so the checkpoints written without them keep their layout."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from policies.checkpoint import CheckpointError
from policies.dl2 import (COUNTS_SCALE, JOB_TYPES, REMAINING_SCALE, DL2Spec, SlotBatch, action_mask, apply_action,
                          count_feature, encode, load_dl2, remaining_feature, save_dl2, shipped_dl2)
from policies.psmodel import EPOCH_SIZE
from test_dl2 import _job, _random_actor

CAP = (10.0, 100.0, 1000.0)
L = len(JOB_TYPES)


def _log_spec(J: int = 3, arch: str = "flat", counts: str = "linear") -> DL2Spec:
    spec = DL2Spec(J=J, arch=arch, remaining="log1p", counts=counts)
    return DL2Spec(J=J, arch=arch, remaining="log1p", counts=counts,
                   scales={**spec.scales, "epochs": REMAINING_SCALE["log1p"], "tasks": COUNTS_SCALE[counts]})


def test_log1p_feature_values_and_the_linear_default():
    a = _job("a", total=230.0 * EPOCH_SIZE["ResNet-50"], done=30.0 * EPOCH_SIZE["ResNet-50"])  # 200 epochs left
    b = _job("b", model="GPT-2", ps=False, total=1000.0, done=250.0)  # all-reduce: 100 x 0.75 = 75 left
    lin, log = DL2Spec(J=3), _log_spec()
    rl = encode([a, b], CAP, 0.0, lin).reshape(3, -1)
    rg = encode([a, b], CAP, 0.0, log).reshape(3, -1)
    assert rl[0, L + 1] == pytest.approx(2.0) and rl[1, L + 1] == pytest.approx(0.75)
    assert rg[0, L + 1] == pytest.approx(0.1 * math.log1p(200.0)) and rg[1, L + 1] == pytest.approx(0.1 * math.log1p(75.0))
    assert remaining_feature(a, log) == pytest.approx(0.1 * math.log1p(200.0))
    # every other column is the same under either transform
    keep = np.ones(rl.shape[1], bool)
    keep[L + 1] = False
    assert np.array_equal(rl[:, keep], rg[:, keep])
    assert DL2Spec().remaining == "linear" and "remaining" not in DL2Spec().to_dict()
    with pytest.raises(ValueError, match="remaining must be one of linear, log1p"):
        DL2Spec(remaining="sqrt")
    with pytest.raises(ValueError, match="counts must be one of linear, log1p"):
        DL2Spec(counts="sqrt")


def test_log1p_counts():
    a = _job("a")
    a.w, a.p = 3, 7
    spec = _log_spec(J=2, counts="log1p")
    row = encode([a], CAP, 0.0, spec).reshape(2, -1)[0]
    assert row[L + 3] == pytest.approx(0.3 * math.log1p(3)) and row[L + 4] == pytest.approx(0.3 * math.log1p(7))
    assert count_feature(0, spec) == 0.0 and count_feature(4, DL2Spec()) == pytest.approx(0.4)
    assert spec.to_dict()["counts"] == "log1p" and DL2Spec.from_dict(spec.to_dict()) == spec
    assert "counts" not in _log_spec().to_dict()


def test_log1p_spec_round_trips_through_a_checkpoint(tmp_path):
    spec = _log_spec(J=2)
    assert spec.to_dict()["remaining"] == "log1p" and DL2Spec.from_dict(spec.to_dict()) == spec
    save_dl2(tmp_path / "ck", _random_actor(spec), spec)
    net, meta, jpath = load_dl2(tmp_path / "ck")
    assert net.spec == spec and meta["spec"]["remaining"] == "log1p"
    meta["spec"]["remaining"] = "cube"
    jpath.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="bad spec: DL2 spec: remaining must be one of"):
        load_dl2(tmp_path / "ck")


def test_checkpoints_without_the_fields_read_as_linear():
    for name in ("dl2-3ep", "dl2-flat", "dl2-40"):
        net, meta, _p = load_dl2(shipped_dl2().with_name(name))
        assert "remaining" not in meta["spec"] and "counts" not in meta["spec"]
        assert (net.spec.remaining, net.spec.counts) == ("linear", "linear")
        assert (net.spec.scales["epochs"], net.spec.scales["tasks"]) == (0.01, 0.1)


def test_slot_batch_equals_encode_with_log1p():
    spec = _log_spec(J=4, arch="rows", counts="log1p")
    batch = [_job("a", done=300.0), _job("b", model="VGG-16", hi=6, t=600.0), _job("c", model="GPT-2", ps=False)]
    used = [0.0, 0.0, 0.0]
    sb = SlotBatch(batch, CAP, 1800.0, spec)
    rng = np.random.default_rng(1)
    for _ in range(12):
        sb.set_used(used)
        assert np.array_equal(sb.obs, encode(batch, CAP, 1800.0, spec, used))
        mask = action_mask(batch, used, CAP, spec, allow_stop=False)
        assert np.array_equal(sb.mask(used, allow_stop=False), mask)
        legal = np.flatnonzero(mask[:-1])
        if not legal.size:
            break
        a = int(rng.choice(legal))
        apply_action(batch, used, a, spec)
        sb.update(a // 3)


def test_train_spec_and_cli_option(capsys):
    from rlsched.cli import build_parser, main
    from trainer.common.train_cli import config_values
    from trainer.dl2.cli import OPTIONS
    from trainer.dl2.train import DL2TrainConfig, train_spec

    args = build_parser().parse_args(["train-dl2", "--out", "RUN", "--remaining", "log1p", "--arch", "rows",
                                      "--counts", "log1p"])
    cfg = DL2TrainConfig(**config_values(args, OPTIONS))
    spec = train_spec(cfg)
    assert spec.remaining == "log1p" and spec.scales["epochs"] == 0.1 and spec.arch == "rows"
    assert spec.counts == "log1p" and spec.scales["tasks"] == 0.3
    assert train_spec(DL2TrainConfig()) == DL2Spec()
    assert main(["train-dl2", "--out", "RUN", "--remaining", "sqrt"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--remaining must be one of linear, log1p" in err[0]
    assert main(["train-dl2", "--out", "RUN", "--counts", "cube"]) == 2
    assert "--counts must be one of linear, log1p" in capsys.readouterr().err
