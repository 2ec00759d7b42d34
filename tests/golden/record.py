"""Record (or check) the golden per-job results that the platform refactor must preserve.

    python tests/golden/record.py          # rewrite tests/golden/*.json
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))

from policies.cluster import ClusterSpec  # noqa: E402
from policies.perf import ContentionModel  # noqa: E402
from trainer.cli_sim import build_policy  # noqa: E402
from trainer.simulator import SimConfig, Simulator  # noqa: E402
from trainer.traces import load_trace  # noqa: E402

#: (case name, cluster, trace file, policies). poisson-16x8.csv and heavy-4x8.csv were drawn once by
#: ``rlsched trace generate`` (uniform demands up to 32; Poisson at 90 % load, seed 11; heavy mix, seed 5).
CASES = [
    ("trace0-4x8", "4x8", "data/traces/deepshare/simulate/trace0.json",
     ["fifo", "sjf", "srtf", "las", "greedy", "srtf-np", "las:spread", "fifo:pack", "rl-base-4x8", "rl-hybrid-4x8"]),
    ("poisson-16x8", "16x8", "tests/golden/poisson-16x8.csv",
     ["fifo", "srtf", "las", "greedy", "srtf-np:spread", "srtf:nosplit", "lgtf", "las2d:nosplit"]),
    ("heavy-4x8", "4x8", "tests/golden/heavy-4x8.csv",
     ["fifo", "srtf", "las", "greedy", "srtf:spread", "rl-base-4x8", "rl-hybrid-4x8", "srtf:nosplit", "lgtf", "las2d",
      "sif", "lrf"]),
]


def jobs_for(cluster: ClusterSpec, src: str):
    return load_trace(REPO / src, cluster=cluster)


def run_case(cluster_text: str, src, policy: str) -> list[list]:
    cluster = ClusterSpec.parse(cluster_text)
    perf = ContentionModel(cluster)
    jobs = jobs_for(cluster, src)
    pol = build_policy(policy, cluster, perf)
    res = Simulator(cluster, jobs, pol, perf, SimConfig()).run()
    return [[r.job_id, r.first_start, r.finish_time, r.num_nodes, r.preemptions, r.avg_cs] for r in res.jobs]


def write_golden(path: Path, cluster: str, trace: str, jobs: dict[str, list[list]]) -> None:
    """Write the results as JSON, one job's row per line (small diffs when a result moves)."""
    lines = [f'{{"cluster": {json.dumps(cluster)}, "trace": {json.dumps(trace)}, "jobs": {{']
    for k, (policy, rows) in enumerate(jobs.items()):
        lines.append(f"{json.dumps(policy)}: [")
        lines.extend(json.dumps(r) + ("," if i < len(rows) - 1 else "") for i, r in enumerate(rows))
        lines.append("]" + ("," if k < len(jobs) - 1 else ""))
    lines.append("}}")
    path.write_text("\n".join(lines) + "\n")


def main() -> None:
    for name, cl, src, pols in CASES:
        out = {}
        for p in pols:
            t0 = time.perf_counter()
            out[p] = run_case(cl, src, p)
            print(f"{name} {p}: {time.perf_counter() - t0:.2f} s", flush=True)
        write_golden(HERE / f"{name}.json", cl, src, out)


if __name__ == "__main__":
    main()
