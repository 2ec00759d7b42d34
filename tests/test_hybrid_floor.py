"""scripts/studies/hybrid_floor.py: rl-hybrid's safety-rule variants against rl-base, on real simulations."""

from __future__ import annotations

import json

import numpy as np
from bench_loader import load_study

from policies.cluster import ClusterSpec
from policies.perf import ContentionModel
from trainer.generate import GeneratorConfig, generate_jobs
from trainer.traces import write_trace

hf = load_study("hybrid_floor")

C48 = ClusterSpec.parse("4x8")


def test_cli_compares_rules_and_floors(tmp_path, capsys):
    perf = ContentionModel(C48)
    for g, demand in (("uniform", "uniform"), ("pow2", "pow2")):
        d = tmp_path / "groups" / g
        d.mkdir(parents=True)
        for s in range(2):
            cfg = GeneratorConfig(num_jobs=24, demand=demand, seed=s)
            write_trace(d / f"set{s}.csv", generate_jobs(C48, cfg, perf))
    out = tmp_path / "hf.json"
    args = ["--traces", str(tmp_path / "groups"), "--floors", "0,0.7", "--rules", "packing,contention-aware"]
    assert hf.main(args + ["--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "over the 2 groups" in text and "packing 0.7" in text and "contention-aware 0" in text
    got = json.loads(out.read_text())
    assert set(got) == {"uniform", "pow2"}
    want = {"rl-base", "packing 0", "packing 0.7", "contention-aware 0", "contention-aware 0.7"}
    assert all(set(v) == want for v in got.values())
    assert all(np.isfinite(m["avg_jct_h"]) and 0 < m["util"] <= 1 for v in got.values() for m in v.values())
    # bad input: one line on stderr, exit 2, nothing written
    bad = [
        (["--rules", "best"], "safety rule 'best'"),
        (["--floors", "0,x"], "--floors '0,x'"),
        (["--floors", "1.5"], "min_efficiency"),
        (["--floors", ","], "--floors is empty"),
        (["--rules", " , "], "--rules is empty"),
        (["--groups", "nope"], "nope"),
        (["--groups", ","], "(none given)"),
        (["--checkpoint", str(tmp_path / "nockpt")], "nockpt"),
        (["--json", str(tmp_path / "no" / "dir" / "x.json")], "does not exist"),
    ]
    for extra, want in bad:
        assert hf.main(args[:2] + extra) == 2, extra
        err = capsys.readouterr().err
        assert want in err and len(err.strip().splitlines()) == 1, (extra, err)
    assert hf.main(["--traces", str(tmp_path / "missing")]) == 2
    assert "missing: no such trace directory" in capsys.readouterr().err
    broken = tmp_path / "broken" / "g"
    broken.mkdir(parents=True)
    (broken / "set0.csv").write_text("job_id,model\n1,MoE,extra\n")
    assert hf.main(["--traces", str(tmp_path / "broken"), "--floors", "0", "--rules", "packing"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: group g:") and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "no").exists()


def test_floors_are_deduplicated(tmp_path, capsys):
    """``-0`` and ``0`` are one variant; repeated rules run once."""
    perf = ContentionModel(C48)
    d = tmp_path / "g" / "u"
    d.mkdir(parents=True)
    write_trace(d / "set0.csv", generate_jobs(C48, GeneratorConfig(num_jobs=12, demand="uniform", seed=3), perf))
    out = tmp_path / "x.json"
    assert hf.main(["--traces", str(tmp_path / "g"), "--floors", "0,-0,0.0", "--rules", "packing,packing", "--json", str(out)]) == 0
    assert set(json.loads(out.read_text())["u"]) == {"rl-base", "packing 0"}
