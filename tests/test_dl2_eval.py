"""benchmarks/dl2_eval.py: the DL2 results section (tables, ACT-vs-rate and training figures) from one
run on a tiny setting, written between its markers; arrival-rate scaling; bad input refused."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "dl2_eval.py"


def _module():
    spec = importlib.util.spec_from_file_location("dl2_eval_under_test", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def ev():
    return _module()


@pytest.fixture(scope="module")
def tiny(ev):
    """Two arrival-rate factors x two seeds of 3 jobs, the shipped dl2 against DRF."""
    return ev.evaluate([1.0, 3.0], 2, 100, 3, ev.parse_policies("dl2,drf"), progress=False, log=lambda s: None)


def test_scaled_sequence_divides_submit_times(ev):
    a, ra = ev.scaled_sequence(100, 6, 1.0)
    b, rb = ev.scaled_sequence(100, 6, 2.5)
    assert [j.job_id for j in a] == [j.job_id for j in b]
    assert [j.submit_time / 2.5 for j in a] == pytest.approx([j.submit_time for j in b])
    assert rb == pytest.approx(2.5 * ra)


def test_summary_pairs_each_policy_with_dl2(ev, tiny):
    s = ev.summarize(tiny)
    assert s["ref"] == "dl2" and s["baselines"] == ["drf"] and list(s["by_rate"]) == ["1", "3"]
    for rate, b in s["by_rate"].items():
        runs = [r for r in tiny["runs"] if f"{r['rate']:g}" == rate]
        assert b["policies"]["drf"]["ratio"] == pytest.approx(
            sum(r["jct"]["dl2"] / r["jct"]["drf"] for r in runs) / len(runs))
        assert b["best_baseline"] == "drf" and "ratio" not in b["policies"]["dl2"]
    d = s["decision"]["dl2"]
    assert d["inferences"] > 0 and d["slots"] > 0 and math.isfinite(d["ms_per_inference"])


def test_outputs_and_docs_between_markers(ev, tiny, tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    for name in ("RESULTS.md", "ELASTIC.md"):
        (docs / name).write_text(f"# {name}\n\n@before@\n\n{ev.BEGIN}\nold text\n{ev.END}\n\n@after@\n")
    md = ev.write_outputs(tiny, tmp_path / "out", docs=True, docs_dir=docs)
    for f in ("dl2_act_vs_rate.png", "dl2_training.png"):
        assert (tmp_path / "out" / f).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (docs / "figures" / f).is_file()
    for name in ("RESULTS.md", "ELASTIC.md"):
        text = (docs / name).read_text()
        assert "old text" not in text and text.count(ev.BEGIN) == 1 and text.index("@before@") < text.index(ev.BEGIN)
        assert text.index(ev.END) < text.index("@after@") and md in text
    saved = json.loads((tmp_path / "out" / "dl2_results.json").read_text())
    assert saved["runs"] == tiny["runs"] and "| 3 |" in md and "figures/dl2_act_vs_rate.png" in md
    # the section renders again from the JSON alone
    again = ev.write_outputs({k: v for k, v in saved.items() if k != "summary"}, tmp_path / "again", docs=False)
    assert again == md


def test_reuse_takes_matching_runs_only(ev, tiny, tmp_path):
    part_file = tmp_path / "p" / "partial.json"
    again = ev.evaluate([1.0, 3.0], 2, 100, 3, ev.parse_policies("dl2,drf"), progress=False, log=lambda s: None,
                        reuse=tiny, partial=part_file)
    assert again["reused"] == 8 and again["runs"] == tiny["runs"]
    assert json.loads(part_file.read_text())["runs"] == tiny["runs"]  # written after each sequence
    other = dict(tiny, policy_ids={**tiny["policy_ids"], "drf": "something else"})
    part = ev.evaluate([1.0], 1, 100, 3, ev.parse_policies("dl2,drf"), progress=False, log=lambda s: None, reuse=other)
    assert part["reused"] == 1 and part["runs"][0]["jct"] == tiny["runs"][0]["jct"]
    shipped = REPO / "policies" / "checkpoints" / "dl2" / "dl2"
    relabelled = ev.evaluate([1.0], 1, 100, 3, ev.parse_policies(f"mine=dl2:{shipped},drf"), progress=False,
                             log=lambda s: None, reuse=[tiny])
    assert relabelled["reused"] == 2 and relabelled["runs"][0]["jct"]["mine"] == tiny["runs"][0]["jct"]["dl2"]


@pytest.mark.parametrize("args, why", [
    (["--rates", "1,0"], "must be a finite factor > 0"),
    (["--rates", "x"], "is not a number"),
    (["--policies", "a=dl2,a=drf"], "repeats a label"),
    (["--policies", "nosuch"], "nosuch"),
    (["--seeds", "0"], "must be >= 1"),
])
def test_bad_input_one_line_exit_2(args, why, tmp_path):
    r = subprocess.run([sys.executable, str(SCRIPT), "--jobs", "3", "--seeds", "1", "--rates", "1", "--no-progress",
                        "--out", str(tmp_path / "o"), *args], capture_output=True, text=True, timeout=300,
                       cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 2 and why in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_training_lines_name_the_warm_up_and_every_rl_run(ev):
    """A checkpoint continued by RL runs from an Optimus warm-up with log-scaled remaining work names the
    warm-up's teacher, epochs, loss and features, then each run's RL and what it kept."""
    root = {"config": {"arch": "rows", "hidden": [64, 64], "remaining": "log1p", "teacher": "optimus",
                       "sl_traces": 2, "jobs": 200, "sl_epochs": 6},
            "history": {"sl_loss": [3.4, 2.25], "rl": [], "val_warmup_jct": 6303.0}, "selected": "warm-up",
            "val_jct": 6303.0, "cpu_s": 200.0}
    middle = {"config": {"jobs": 200, "seed0": 1000, "sl_traces": 2, "rl_lr": 1e-4, "beta": 0.1, "beta_end": -1.0},
              "history": {"parent": root, "rl": [{"updates": 165}, {"updates": 192}]}, "selected": "init",
              "val_jct": 6303.0, "cpu_s": 400.0}
    meta = {"training": {"config": {"jobs": 200, "seed0": 1000, "sl_traces": 2, "rl_lr": 1e-5, "beta": 0.001,
                                    "beta_end": -1.0, "val_seeds": 2, "behaviour": "greedy", "sample_p": 0.1,
                                    "clip": 1.0},
                         "history": {"parent": middle, "rl": [{"updates": 181}, {"updates": 226}]},
                         "selected": "RL episode 1", "val_jct": 6259.0, "cpu_s": 300.0}}
    text = " ".join(ev._training_lines(meta))
    assert "3 `train-dl2` runs" in text
    assert ("(1) the per-row actor (`--arch rows`, row scorer 64x64, `--remaining log1p`); 2 Optimus episodes of 200 "
            "jobs for the warm-up (6 epochs, imitation cross-entropy 3.400 -> 2.250), validation JCT 6303 s; no RL "
            "episode, kept: warm-up") in text
    assert "(2) 2 RL episodes of 200 jobs (training sequences from seed 1002; 357 actor-critic updates" in text
    assert "sampling its actions, the seed's job-aware exploration, actor learning rate 0.0001" in text
    assert "(3) 2 RL episodes" in text and "acting greedily, sampling with probability 0.1" in text
    assert "clip 1.0), kept: RL episode 1 (validation JCT 6259 s)" in text and "15.0 min of CPU in all" in text
    assert "DRF" not in text
