"""benchmarks/peers.py's Blox part without a Blox checkout: the skip line, the quoted figure, the recorded one.

None of these needs the peer's code: they run ``--from-json`` (no simulation) on the shipped raw results.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture()
def peers(monkeypatch):
    monkeypatch.delenv("RLSCHED_BLOX", raising=False)
    monkeypatch.delenv("RLSCHED_BLOX_PYTHON", raising=False)
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import peers as mod
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    return mod


def _files(tmp_path):
    return ["--out", str(tmp_path / "F.md"), "--results-md", str(tmp_path / "R.md"), "--json", str(tmp_path / "r.json")]


def test_no_checkout_skips_blox_with_one_line_and_writes_the_rest(peers, tmp_path, capsys):
    raw = json.loads((REPO / "docs" / "fidelity_results.json").read_text())
    raw.pop("blox", None)
    src = tmp_path / "in.json"
    src.write_text(json.dumps(raw))
    assert peers.main(["--from-json", str(src), *_files(tmp_path)]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    skip = [line for line in err if "Blox" in line]
    assert len(skip) == 1 and "skipping the Blox comparison" in skip[0] and "--blox PATH" in skip[0]
    text = (tmp_path / "F.md").read_text()
    blox = text[text.index("## Blox"):text.index("## Other comparisons of issue 34")]
    assert "not measured here" in blox and "36.50 h" in blox and "36.46 h" in blox
    # the rest is still written: DeepShare's tables and the pointers to the other comparisons
    assert "| simulate/trace0 | ds-las |" in text
    assert "docs/PERFORMANCE_MODEL.md" in text and "philly_restarts.py" in text and "intra_sensitivity.py" in text


def test_recorded_blox_figures_are_rendered_without_a_checkout(peers, tmp_path, capsys):
    raw = json.loads((REPO / "docs" / "fidelity_results.json").read_text())
    raw["blox"] = {"avg_jct_s": 3600.0 * 10, "blox_avg_jct_s": 3600.0 * 10.5, "jobs": 40, "tracked": 20,
                   "wall_s": 0.5, "blox_wall_s": 50.0, "max_abs_diff_s": 300.0, "load": 8, "track": [0, 19],
                   "checkout": "blox"}
    src = tmp_path / "in.json"
    src.write_text(json.dumps(raw))
    assert peers.main(["--from-json", str(src), *_files(tmp_path)]) == 0
    assert "not re-run" in capsys.readouterr().err
    blox = (tmp_path / "F.md").read_text().split("## Blox", 1)[1]
    assert "| average JCT, tracked jobs (h) | 10.50 | 10.00 | -0.50 h (-4.8 %) |" in blox
    assert "| 50.0 | 0.50 | 100x |" in blox and "not measured here" not in blox.split("## Other", 1)[0]


def test_not_a_blox_checkout_is_named(peers, tmp_path, capsys):
    why = peers.blox_blocker(tmp_path, sys.executable)
    assert why is not None and str(tmp_path) in why and "not a Blox checkout" in why


def test_philly_cluster_log_has_blox_schema(peers, tmp_path):
    csv = tmp_path / "p.csv"
    csv.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-09 07:01:55,3600.0,2,7200.0,vc1\n")
    assert peers.philly_cluster_log(csv, tmp_path / "log") == 1
    (job,) = json.loads((tmp_path / "log").read_text())
    assert job["submitted_time"] == "2017-10-09 07:01:55" and job["vc"] == "vc1"
    (att,) = job["attempts"]
    assert att["end_time"] == "2017-10-09 08:01:55" and len(att["detail"][0]["gpus"]) == 2
