"""scripts/dl2_training_curve.py: the shipped DL2 checkpoint's training history drawn; bad headers refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "dl2_training_curve.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def test_draws_the_shipped_history(tmp_path):
    out = tmp_path / "curve.png"
    r = _run("--out", str(out))
    assert r.returncode == 0, r.stderr
    head = json.loads((REPO / "policies" / "checkpoints" / "dl2" / "dl2.json").read_text())["training"]["history"]
    assert f"{len(head['sl_loss'])} warm-up epochs, {len(head['rl'])} RL episodes" in r.stdout
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_header_one_line_exit_2(tmp_path):
    cases = {"{}": "no training.history", "[1": "not JSON",
             json.dumps({"training": {"history": {"rl": [{"episode": 0, "train_jct": "x", "val_jct": 1}]}}}):
             "rl[].train_jct is not a list of finite numbers"}
    for i, (text, why) in enumerate(cases.items()):
        bad = tmp_path / f"bad{i}.json"
        bad.write_text(text)
        out = tmp_path / f"o{i}.png"
        r = _run("--checkpoint", str(bad), "--out", str(out))
        assert r.returncode == 2 and why in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert not out.exists()
    r = _run("--checkpoint", str(tmp_path / "missing.json"))
    assert r.returncode == 2 and "No such file" in r.stderr
