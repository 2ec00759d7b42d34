"""scripts/studies/poisson_order.py: holding vs candidate order on Poisson arrivals, on real simulations."""

from __future__ import annotations

import json

import numpy as np
from bench_loader import load_study

from policies.cluster import ClusterSpec
from policies.perf import ContentionModel
from trainer.generate import GeneratorConfig, generate_jobs
from trainer.traces import write_trace

po = load_study("poisson_order")

C48 = ClusterSpec.parse("4x8")


def test_cli_compares_policies_and_agings(tmp_path, capsys):
    perf = ContentionModel(C48)
    d = tmp_path / "g" / "p"
    d.mkdir(parents=True)
    for s in range(2):
        cfg = GeneratorConfig(num_jobs=24, arrival="poisson", load=0.95, seed=s)
        write_trace(d / f"set{s}.csv", generate_jobs(C48, cfg, perf))
    out = tmp_path / "po.json"
    assert po.main(["--traces", str(tmp_path / "g"), "--groups", "p", "--aging", "1800,60", "--json", str(out)]) == 0
    assert "plan-greedy aging=60" in capsys.readouterr().out
    got = json.loads(out.read_text())["p"]
    want = {"srtf", "greedy", "rl-base theta=0"} | {f"{p} aging={a}" for p in ("rl-base", "plan-greedy") for a in (1800, 60)}
    assert set(got) == want
    assert all(np.isfinite(v["avg_jct_h"]) and v["avg_jct_h"] > 0 and v["p90_jct_h"] > 0 and 0 < v["util_pct"] <= 100
               for v in got.values())
    # the aging reaches both policies: on these arrivals the stronger one reorders the queue
    for pol in ("rl-base", "plan-greedy"):
        assert got[f"{pol} aging=1800"] != got[f"{pol} aging=60"], pol
    for extra, msg in ((["--aging", "0"], "positive"), (["--aging", "x"], "could not convert"),
                       (["--groups", "nope"], "nope")):
        assert po.main(["--traces", str(tmp_path / "g")] + extra) == 2
        err = capsys.readouterr().err
        assert msg in err and len(err.strip().splitlines()) == 1, err
    assert po.main(["--traces", str(tmp_path / "missing")]) == 2
    assert "no such trace directory" in capsys.readouterr().err
