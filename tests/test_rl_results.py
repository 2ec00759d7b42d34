"""The `--docs` path of the issue-30 benchmarks (tables written between markers of a Markdown page) and
scripts/rl_results.sh, the one command that runs them (its options checked with --dry-run)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from benchmarks import bench_baselines, bench_hybrid
from trainer.outputs import doc_problem, marked, write_marked

REPO = Path(__file__).resolve().parents[1]


def _doc(tmp_path: Path, *names: str) -> Path:
    parts = ["# Page\n\nprose before\n"]
    for n in names:
        b, e = marked(n)
        parts.append(f"{b}\n\nold table {n}\n\n{e}\n\nprose after {n}\n")
    p = tmp_path / "RESULTS.md"
    p.write_text("\n".join(parts))
    return p


def test_write_marked_replaces_blocks_and_keeps_prose(tmp_path):
    p = _doc(tmp_path, "a", "b")
    write_marked(p, {"a": "| x |\n|---|\n| 1 |\n", "b": "| y |"})
    text = p.read_text()
    assert "old table" not in text
    assert "<!-- a:begin -->\n\n| x |\n|---|\n| 1 |\n\n<!-- a:end -->" in text
    assert "prose before" in text and "prose after a" in text and "prose after b" in text


def test_write_marked_missing_marker_leaves_file(tmp_path):
    p = _doc(tmp_path, "a")
    before = p.read_text()
    assert "lacks the markers <!-- b:begin -->" in doc_problem(p, ["a", "b"])
    with pytest.raises(ValueError, match="b:begin"):
        write_marked(p, {"a": "new", "b": "new"})
    assert p.read_text() == before


def test_bench_hybrid_docs_tiny(tmp_path, capsys):
    p = _doc(tmp_path, "hybrid-srtf")
    assert bench_hybrid.main(["--sets", "2", "--jobs", "6", "--pair", "fifo,srtf", "--docs", str(p)]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    text = p.read_text()
    block = text.split("<!-- hybrid-srtf:begin -->\n\n", 1)[1].split("\n\n<!-- hybrid-srtf:end -->", 1)[0]
    assert block.splitlines() == printed  # the page gets exactly the printed table
    assert block.startswith("| group | util fifo (%) | util srtf (%) |")
    rows = [r for r in block.splitlines()[2:] if r.startswith("| ")]
    assert [r.split(" | ")[0][2:] for r in rows] == [g.name for g in bench_hybrid.groups(6) if g.cluster == "4x8"]
    assert "prose after hybrid-srtf" in text


def test_bench_baselines_docs_tiny(tmp_path):
    p = _doc(tmp_path, *bench_baselines.BLOCKS)
    assert bench_baselines.main(["--sets", "2", "--jobs", "6", "--groups", "248-zero", "--no-rl",
                                 "--docs", str(p)]) == 0
    text = p.read_text()
    assert "old table" not in text
    assert "| 248-zero | " in text.split("<!-- baselines-best:begin -->")[1].split("<!-- baselines-best:end -->")[0]
    assert "#### 248-zero: 4x8, demands 2/4/8" in text


def test_bench_docs_refuses_page_without_markers(tmp_path):
    p = _doc(tmp_path, "other")
    before = p.read_text()
    with pytest.raises(SystemExit) as exc:
        bench_hybrid.main(["--sets", "2", "--jobs", "6", "--pair", "fifo,srtf", "--docs", str(p)])
    assert exc.value.code == 2
    assert p.read_text() == before


def test_rl_results_script_names_existing_scripts_and_options():
    script = REPO / "scripts" / "rl_results.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run(["bash", str(script), "--dry-run"], capture_output=True, text=True, env=env, cwd=REPO)
    assert r.returncode == 0, r.stderr
    steps = [ln for ln in r.stdout.splitlines() if ln.startswith("== ")]
    assert len(steps) == 5 and steps[-1] == "== bash scripts/rl_branches.sh results"
    for ln in steps[:-1]:
        assert "--docs" in ln and (REPO / ln.split()[5]).is_file()
    bad = subprocess.run(["bash", str(script), "--nope"], capture_output=True, text=True, env=env, cwd=REPO)
    assert bad.returncode == 2 and "unknown argument '--nope'" in bad.stderr


def test_bench_planner_docs_from_cache(tmp_path, capsys):
    """bench_planner --docs writes its three tables; a second run reads every result from --cache and
    writes the same page."""
    from benchmarks import bench_planner

    p = _doc(tmp_path, *bench_planner.BLOCKS)
    argv = ["--sets", "2", "--jobs", "6", "--groups", "248-poisson-90", "--planner", "planner:work=300",
            "--cache", str(tmp_path / "cache"), "--docs", str(p)]
    assert bench_planner.main(argv) == 0
    first = p.read_text()
    assert "old table" not in first and "| 248-poisson-90 | rl-base | " in first
    assert "| 248-poisson-90 | 4x8 | " in first.split("planner-best:begin")[1].split("planner-best:end")[0]
    capsys.readouterr()
    assert bench_planner.main(argv) == 0
    assert "set 0" not in capsys.readouterr().err  # every run read back from the cache
    # the JCT tables are the same; the rounds table keeps the CPU times measured by the first run
    assert p.read_text() == first
