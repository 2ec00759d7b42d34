"""DL2's remaining-epochs transform (``DL2Spec.remaining``): ``log1p`` encodes ln(1 + epochs) at its scale,
is recorded in the checkpoint's spec and read back; a spec without the field is the seed's linear feature,
so the shipped checkpoints keep their layout."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from policies.checkpoint import CheckpointError
from policies.dl2 import (JOB_TYPES, REMAINING_SCALE, DL2Spec, SlotBatch, encode, load_dl2, remaining_feature,
                          save_dl2, shipped_dl2)
from policies.psmodel import EPOCH_SIZE
from test_dl2 import _job, _random_actor

CAP = (10.0, 100.0, 1000.0)
L = len(JOB_TYPES)


def _log_spec(J: int = 3, arch: str = "flat") -> DL2Spec:
    spec = DL2Spec(J=J, arch=arch, remaining="log1p")
    return DL2Spec(J=J, arch=arch, remaining="log1p", scales={**spec.scales, "epochs": REMAINING_SCALE["log1p"]})


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


def test_shipped_checkpoints_read_as_linear():
    for name in ("dl2", "dl2-3ep", "dl2-flat", "dl2-40"):
        net, meta, _p = load_dl2(shipped_dl2().with_name(name))
        if "remaining" not in meta["spec"]:
            assert net.spec.remaining == "linear" and net.spec.scales["epochs"] == 0.01


def test_slot_batch_equals_encode_with_log1p():
    spec = _log_spec(J=4, arch="rows")
    batch = [_job("a", done=300.0), _job("b", model="VGG-16", hi=6, t=600.0)]
    sb = SlotBatch(batch, CAP, 1800.0, spec)
    assert np.array_equal(sb.obs, encode(batch, CAP, 1800.0, spec))


def test_train_spec_and_cli_option(capsys):
    from rlsched.cli import build_parser, main
    from trainer.common.train_cli import config_values
    from trainer.dl2.cli import OPTIONS
    from trainer.dl2.train import DL2TrainConfig, train_spec

    args = build_parser().parse_args(["train-dl2", "--out", "RUN", "--remaining", "log1p", "--arch", "rows"])
    cfg = DL2TrainConfig(**config_values(args, OPTIONS))
    spec = train_spec(cfg)
    assert spec.remaining == "log1p" and spec.scales["epochs"] == 0.1 and spec.arch == "rows"
    assert train_spec(DL2TrainConfig()) == DL2Spec()
    assert main(["train-dl2", "--out", "RUN", "--remaining", "sqrt"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--remaining must be one of linear, log1p" in err[0]
