"""``python3 -m trainer.sced2.compare``: two SCED2 checkpoints on the validation sequences."""

from __future__ import annotations

from pathlib import Path

from trainer.sced2.compare import main

SHIPPED = str(Path(__file__).resolve().parents[1] / "policies" / "checkpoints" / "sced2" / "sced2-m8")


def test_compare_prints_paired_ratio_of_two_checkpoints(capsys):
    assert main([SHIPPED, SHIPPED, "--sequences", "2", "--skip", "0", "--jobs", "40", "--cluster", "4x8"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| validation seed |")
    rows = [line.split("|")[1:-1] for line in out[2:]]
    assert [r[0].strip() for r in rows] == ["10000", "10001", "mean"]
    assert all(r[1] == r[2] for r in rows)  # the same checkpoint twice: equal JCTs
    assert rows[-1][3].strip() == "1.000 [1.000, 1.000]"


def test_compare_refuses_a_missing_checkpoint_in_one_line(tmp_path, capsys):
    assert main([str(tmp_path / "nope"), SHIPPED, "--sequences", "1", "--jobs", "10"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sced2 compare:") and "nope" in err[0]
    assert main([SHIPPED, SHIPPED, "--sequences", "0"]) == 2
    assert main([SHIPPED, SHIPPED, "--skip", "-1"]) == 2
