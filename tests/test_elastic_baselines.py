"""benchmarks/elastic_baselines.py: the table of the elastic baselines and the fixed-size heuristics, and its
``--docs`` block (docs/ELASTIC.md, "Results")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "elastic_baselines.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, cwd=ROOT, timeout=300)


def test_docs_block_written_between_the_markers(tmp_path) -> None:
    doc = tmp_path / "E.md"
    doc.write_text("before\n<!-- elastic-baselines:begin -->\nold\n<!-- elastic-baselines:end -->\nafter\n")
    r = _run("--seeds", "2", "--settings", "chic:1.8,chic:2.7", "--docs", str(doc))
    assert r.returncode == 0, r.stderr
    text = doc.read_text()
    assert text.startswith("before\n") and text.endswith("after\n") and "old" not in text
    rows = [ln for ln in text.splitlines() if ln.startswith("| Chic")]
    assert [ln.split(" | ")[0] for ln in rows] == ["| Chic, 1.8 jobs/h", "| Chic, 2.7 jobs/h"]
    for ln in rows:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        assert cells[1] == "2 x 30 jobs"
        # Optimus' own cell carries no ratio; every other policy's carries its paired ratio to it
        assert cells[2].endswith(" s") and "(" not in cells[2]
        assert all("+-" in c for c in cells[3:]) and len(cells) == 7
        # FIFO and SRTF never queue a job here: the same average JCT
        assert cells[5] == cells[6]


def test_bad_arguments_one_line_and_the_document_untouched(tmp_path) -> None:
    doc = tmp_path / "E.md"
    doc.write_text("no markers\n")
    for args, words in [
        (["--settings", "chic:x"], "the rate 'x' is not a number"),
        (["--settings", "chic"], "is neither chic:RATE nor dl2"),
        (["--settings", "chic:-1"], "the rate must be > 0"),
        (["--seeds", "0"], "--seeds must be >= 1"),
        (["--docs", str(doc)], "lacks the markers"),
    ]:
        r = _run(*args)
        assert r.returncode == 2 and words in r.stderr, (args, r.stderr)
    assert doc.read_text() == "no markers\n"
