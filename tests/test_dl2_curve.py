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
    head = json.loads((REPO / "policies" / "checkpoints" / "dl2" / "dl2.json").read_text())["training"]
    hist = head["history"]
    # a network continued from parents (train-dl2 --init, possibly several runs deep) is drawn after the
    # first run's warm-up; each parent's RL episodes up to the network it kept come first
    ancestors = []
    node = hist.get("parent")
    while isinstance(node, dict):
        ancestors.append(node)
        node = node["history"].get("parent")
    warm = (ancestors[-1]["history"] if ancestors else hist)["sl_loss"]
    before = sum(int(a["selected"].rsplit(" ", 1)[1]) + 1 for a in ancestors
                 if str(a.get("selected", "")).startswith("RL episode "))
    assert f"{len(warm)} warm-up epochs, {before + len(hist['rl'])} RL episodes" in r.stdout
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_labels_name_the_teacher(tmp_path):
    """The warm-up panel and the reference line name the teacher of the warm-up (the parent's for --init)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("dl2_curve_under_test", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    ep = {"episode": 0, "train_jct": 1.0, "val_jct": 2.0, "updates": 3}
    child = {"training": {"config": {}, "history": {"sl_loss": [], "rl": [ep], "parent": {
        "selected": "warm-up", "config": {"teacher": "optimus"},
        "history": {"sl_loss": [3.0, 2.0], "drf_train_jct": [5.0], "rl": []}}}}}
    (tmp_path / "c.json").write_text(json.dumps(child))
    hist = mod.read_history(tmp_path / "c.json")
    assert hist["teacher"] == "Optimus" and hist["sl_loss"] == [3.0, 2.0] and hist["continued_after"] == 0
    plain = {"training": {"config": {"teacher": "drf"}, "history": {"sl_loss": [1.0], "rl": [ep]}}}
    (tmp_path / "p.json").write_text(json.dumps(plain))
    assert mod.read_history(tmp_path / "p.json")["teacher"] == "DRF"


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


def test_a_continued_run_is_drawn_after_its_parents_selected_episode(tmp_path):
    """A run started with --init continues its parent's curve from the parent's selected episode: the
    parent's warm-up and episodes 0..selected, then the run's own, updates counted across both."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from dl2_training_curve import read_history
    finally:
        sys.path.pop(0)

    def ep(k, u, jct):
        return {"episode": k, "updates": u, "train_jct": jct, "val_jct": jct + 1}

    parent = {"sl_loss": [3.0, 2.5], "drf_train_jct": [10.0], "val_warmup_jct": 9.0,
              "rl": [ep(0, 5, 100.0), ep(1, 7, 90.0), ep(2, 11, 120.0)]}
    hist = {"sl_loss": [], "rl": [ep(0, 3, 80.0)], "val_warmup_jct": 91.0,
            "parent": {"selected": "RL episode 1", "history": parent}}
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"training": {"history": hist}}))
    h = read_history(path)
    assert h["sl_loss"] == [3.0, 2.5] and h["drf_train_jct"] == [10.0] and h["val_warmup_jct"] == 9.0
    assert h["train_jct"] == [100.0, 90.0, 80.0] and h["val_jct"] == [101.0, 91.0, 81.0]
    assert h["steps"] == [5.0, 12.0, 15.0] and h["continued_after"] == 2
    out = tmp_path / "c.png"
    r = _run("--checkpoint", str(path), "--out", str(out))
    assert r.returncode == 0 and "2 warm-up epochs, 3 RL episodes" in r.stdout, r.stderr
