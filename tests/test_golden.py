"""Per-job results of every heuristic and the shipped checkpoints on fixed traces stay as recorded.

The golden files (``tests/golden/*.json``) were written by ``python tests/golden/record.py``; a change
that moves a result on purpose (a bug fixed) rewrites them with that command and says why in its commit.
"""
from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

GOLDEN = Path(__file__).resolve().parent / "golden"
_spec = importlib.util.spec_from_file_location("golden_record", GOLDEN / "record.py")
record = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(record)

CASES = [(name, cl, src, p) for name, cl, src, pols in record.CASES for p in pols]


@pytest.mark.parametrize("name,cluster,src,policy", CASES, ids=[f"{c[0]}-{c[3]}" for c in CASES])
def test_per_job_results_match_golden(name, cluster, src, policy):
    want = json.loads((GOLDEN / f"{name}.json").read_text())["jobs"][policy]
    got = record.run_case(cluster, src, policy)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g[0] == w[0]
        assert g[3:5] == w[3:5], f"job {g[0]}: nodes/preemptions {g[3:5]} != {w[3:5]}"
        for a, b in zip(g[1:3] + g[5:], w[1:3] + w[5:]):
            assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6), f"job {g[0]}: {g} != {w}"
