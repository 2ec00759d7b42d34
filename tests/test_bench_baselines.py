"""benchmarks/bench_baselines.py on tiny sets: its tables lead with the best heuristic and pair against SRTF."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "bench_baselines", Path(__file__).resolve().parents[1] / "benchmarks" / "bench_baselines.py")
bench = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("bench_baselines", bench)  # its dataclasses look their module up
_spec.loader.exec_module(bench)


def test_tables_on_tiny_sets(capsys):
    assert bench.main(["--sets", "2", "--jobs", "12", "--groups", "uniform32-poisson-90", "--no-rl"]) == 0
    out = capsys.readouterr().out
    summary, greedy = [blk for blk in out.split("\n\n") if blk.strip()][:2]
    row = summary.splitlines()[2].split("|")
    assert row[1].strip() == "uniform32-poisson-90" and bench.is_heuristic(row[2].strip())
    assert "greedy / srtf:nosplit" in greedy
    lines = [ln for ln in out.splitlines() if ln.startswith("| ")]
    table = [ln for ln in lines if ln.split("|")[1].strip().strip("*") in bench.POLICIES]
    assert table[0].split("|")[1].strip() == f"**{row[2].strip()}**"  # the best heuristic first, bold
    srtf = next(ln for ln in table if ln.split("|")[1].strip() == "srtf")
    assert srtf.split("|")[4].strip() == "1.000 +- 0.000"  # SRTF paired with itself
    assert len(table) == len(bench.POLICIES)


def test_bad_arguments_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--sets", "1"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        bench.main(["--groups", "nosuch"])
    assert e.value.code == 2 and "names no group" in capsys.readouterr().err


def test_hybrid_table_on_tiny_sets(capsys):
    _h = importlib.util.spec_from_file_location(
        "bench_hybrid", Path(__file__).resolve().parents[1] / "benchmarks" / "bench_hybrid.py")
    hyb = importlib.util.module_from_spec(_h)
    _h.loader.exec_module(hyb)
    assert hyb.main(["--sets", "2", "--jobs", "6"]) == 0
    rows = [ln.split("|") for ln in capsys.readouterr().out.splitlines()[2:]]
    assert [r[1].strip() for r in rows] == [g.name for g in bench.groups(6) if g.cluster == "4x8"]
    for r in rows:
        differ = int(r[7].split("/")[0])
        if differ == 0:  # identical runs: no difference, ratios 1
            assert r[4].strip() == "+0.00 +- 0.00" and r[5].strip() == "1.000 +- 0.000"


def test_hybrid_figure_on_tiny_sets(tmp_path, capsys):
    _h = importlib.util.spec_from_file_location(
        "bench_hybrid", Path(__file__).resolve().parents[1] / "benchmarks" / "bench_hybrid.py")
    hyb = importlib.util.module_from_spec(_h)
    _h.loader.exec_module(hyb)
    out = tmp_path / "trade.png"
    assert hyb.main(["--sets", "2", "--jobs", "6", "--figure", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(SystemExit) as e:
        hyb.main(["--sets", "2", "--figure", str(tmp_path / "nodir" / "x.png")])
    assert e.value.code == 2 and "does not exist" in capsys.readouterr().err
