"""scripts/studies/idle_breakdown.py: idle classes on hand cases, and on real simulations they add up to the idle
time."""

from __future__ import annotations

import numpy as np
import pytest
from bench_loader import load_study

from policies.cluster import ClusterSpec
from policies.perf import ContentionModel
from trainer.evaluate import make_policy
from trainer.generate import GeneratorConfig, generate_jobs
from trainer.simulator import SimConfig, Simulator
from trainer.traces import write_trace

ib = load_study("idle_breakdown")

C48 = ClusterSpec.parse("4x8")


def test_classify_by_what_fits_the_free_gpus_as_they_lie():
    assert ib.classify([0, 0, 0, 0], [], 8) == "drained"
    assert ib.classify([3, 0, 2, 0], [4], 8) == "fragmented, single-node"  # 5 free, no node holds 4
    assert ib.classify([3, 0, 4, 0], [4, 12], 8) == "held, single-node"
    assert ib.classify([3, 0, 5, 8], [12], 8) == "held, multi-node"  # 8 + 4 fit, 8 + 5 (best fit)
    assert ib.classify([3, 0, 5, 8], [17], 8) == "fragmented, multi-node"
    assert ib.classify([8, 8, 8, 8], [9, 3], 8) == "held, single-node"  # a single-node job waits


@pytest.mark.parametrize("policy", ["srtf", "rl-base", "rl-hybrid"])
def test_classes_add_up_to_the_idle_gpu_time(policy):
    """On a real 24-job uniform set the classes sum to C x makespan minus the busy GPU-time of the
    simulator's allocation record, and work-conserving SRTF never holds a job that fits."""
    perf = ContentionModel(C48)
    jobs = generate_jobs(C48, GeneratorConfig(num_jobs=24, demand="uniform", seed=5), perf)
    res = Simulator(C48, jobs, make_policy(policy, C48, perf), perf, SimConfig()).run()
    busy = float(np.sum(np.diff(np.append(res.util_t, res.makespan)) * res.util_used)) / 3600.0
    out = ib.breakdown(make_policy(policy, C48, perf), jobs, C48, perf)
    idle = sum(out.get(c, 0.0) for c in ib.CLASSES)
    assert set(out) <= {*ib.CLASSES, "makespan_h", "avg_jct_h"}
    assert out["makespan_h"] == pytest.approx(res.makespan / 3600.0)
    assert idle == pytest.approx(32 * res.makespan / 3600.0 - busy, rel=1e-9)
    assert idle > 0.0
    if policy == "srtf":  # a work-conserving heuristic never leaves a fitting job waiting
        assert out.get("held, single-node", 0.0) == 0.0 and out.get("held, multi-node", 0.0) == 0.0


def test_cli_prints_a_table_and_writes_json(tmp_path, capsys):
    perf = ContentionModel(C48)
    sets = tmp_path / "sets"
    sets.mkdir()
    for s in range(2):
        write_trace(
            sets / f"set{s}.csv", generate_jobs(C48, GeneratorConfig(num_jobs=16, demand="uniform", seed=s), perf)
        )
    out = tmp_path / "idle.json"
    assert ib.main(["--traces", str(sets), "--policies", "srtf,rl-base", "--json", str(out)]) == 0
    assert "Idle GPU-h per job set" in capsys.readouterr().out
    import json

    got = json.loads(out.read_text())
    assert set(got) == {"srtf", "rl-base"} and all(v["makespan_h"] > 0 for v in got.values())
    empty = tmp_path / "empty"
    empty.mkdir()
    assert ib.main(["--traces", str(empty)]) == 2
    assert ib.main(["--traces", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert "empty: no trace files" in err and "missing: no such trace file or directory" in err
