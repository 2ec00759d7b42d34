"""DL2 against DRF, Tetris and Optimus in DL2's setting (seed 000 section 6: 200 jobs on 500 servers of
2 GPUs, ``data/clusters/dl2.yaml``), on held-out sequences (seeds 100.., training uses 1000.. and
validation 2000..), with paired intervals, and DL2's decision time per inference.

For each seed it generates a ``dl2`` sequence (:func:`trainer.elastic.generate`), runs every policy on
it with the PS performance model, and prints each policy's mean average JCT, DL2's paired JCT ratio to
each baseline (mean and 95 % t-interval over seeds), and DL2's time per inference and per slot.

    PYTHONPATH=. nice -n 10 python3 benchmarks/dl2_eval.py --seeds 3          # docs/ELASTIC.md, "DL2"
    PYTHONPATH=. python3 benchmarks/dl2_eval.py --seeds 1 --policy dl2:/tmp/run/dl2
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BASELINES = ("drf", "tetris", "optimus")


def _ci(x: np.ndarray) -> float:
    from scipy import stats

    if len(x) < 2:
        return math.nan
    return float(stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))


def run(seed: int, dl2: str, jobs: int) -> tuple[dict[str, float], float, int, float]:
    """Average JCT per policy on seed ``seed``; DL2's total plan seconds, inferences and slots."""
    from policies.cluster import ClusterSpec
    from policies.perf import ContentionModel
    from policies.psmodel import PSPerformanceModel
    from policies.registry import make_policy
    from trainer.elastic import generate, parse_elastic_trace
    from trainer.simulator import SimConfig, Simulator

    cluster = ClusterSpec.parse(str(ROOT / "data" / "clusters" / "dl2.yaml"))
    perf = PSPerformanceModel(ContentionModel(cluster))
    seq = parse_elastic_trace(generate("dl2", seed=seed, jobs=jobs))
    out: dict[str, float] = {}
    spent, slots = [0.0], [0]
    pol_dl2 = None
    for name in (dl2, *BASELINES):
        pol = make_policy(name, cluster, perf)
        if name == dl2:
            pol_dl2 = pol
            inner = pol.plan

            def timed(jobs_, cap, state, inner=inner):
                t = time.perf_counter()
                inner(jobs_, cap, state)
                spent[0] += time.perf_counter() - t
                slots[0] += 1

            pol.plan = timed
        res = Simulator(cluster, seq, pol, perf, SimConfig()).run()
        out["dl2" if name == dl2 else name] = float(np.mean([r.jct for r in res.jobs]))
    return out, spent[0], pol_dl2.inferences, slots[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3, help="held-out sequences (seeds 100..100+N-1)")
    ap.add_argument("--jobs", type=int, default=200, help="jobs per sequence (the seed's 200)")
    ap.add_argument("--policy", default="dl2", help="the DL2 policy name (dl2 or dl2:/path)")
    args = ap.parse_args()
    rows, spent, inf, slots = [], 0.0, 0, 0
    t0 = time.perf_counter()
    for s in range(args.seeds):
        r, sp, n, k = run(100 + s, args.policy, args.jobs)
        rows.append(r)
        spent, inf, slots = spent + sp, inf + n, slots + k
        print(f"seed {100 + s}: " + ", ".join(f"{p} {v:.0f} s" for p, v in r.items()), flush=True)
    print(f"\n{args.seeds} held-out sequences of {args.jobs} jobs, {time.perf_counter() - t0:.0f} s\n")
    print("| policy | avg JCT (s), mean over seeds | DL2 JCT / policy JCT (paired, 95 % CI) |")
    print("|---|---|---|")
    for name in ("dl2", *BASELINES):
        jct = np.array([r[name] for r in rows])
        ratio = np.array([r["dl2"] / r[name] for r in rows])
        cell = "-" if name == "dl2" else f"{ratio.mean():.3f} +- {_ci(ratio):.3f}"
        print(f"| {name} | {jct.mean():.0f} | {cell} |")
    print(f"\nDL2 decision time: {1e3 * spent / max(inf, 1):.3f} ms per inference ({inf} inferences), "
          f"{1e3 * spent / max(slots, 1):.1f} ms per slot ({slots} slots), one process")


if __name__ == "__main__":
    main()
