"""Average JCT of the elastic baselines (DRF, Tetris, Optimus) in the settings of Chic and DL2, beside
FIFO and SRTF with each job fixed at its submitted size (1 worker, 1 PS).

For each setting and seed it generates a sequence (:func:`trainer.elastic.generate`), runs the three
baselines on the setting's cluster (``data/clusters/``) and prints, per setting, each policy's mean
average JCT over the seeds and its paired ratio to Optimus (mean and 95 % t-interval over seeds).

    PYTHONPATH=. nice -n 10 python3 benchmarks/elastic_baselines.py            # docs/ELASTIC.md, "Results"
    PYTHONPATH=. python3 benchmarks/elastic_baselines.py --seeds 3 --settings chic:1.8
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
#: the elastic baselines, then two fixed-size heuristics (each job on its submitted workers and PSs, no resize)
POLICIES = ("optimus", "drf", "tetris", "fifo", "srtf")


def run(setting: str, rate: float | None, seed: int, resize_overhead: float | None) -> dict[str, float]:
    from policies.cluster import ClusterSpec
    from policies.perf import ContentionModel
    from policies.registry import make_policy
    from trainer.elastic import elastic_perf, generate, parse_elastic_trace
    from trainer.simulator import SimConfig, Simulator

    cluster = ClusterSpec.parse(str(ROOT / "data" / "clusters" / f"{setting}.yaml"))
    perf = elastic_perf(ContentionModel(cluster))
    jobs = parse_elastic_trace(generate(setting, seed=seed, rate=rate))
    out = {}
    for name in POLICIES:
        res = Simulator(cluster, jobs, make_policy(name, cluster, perf), perf,
                        SimConfig(resize_overhead=resize_overhead)).run()
        out[name] = float(np.mean([r.jct for r in res.jobs]))
    return out


def _ci(x: np.ndarray) -> float:
    from scipy import stats

    if len(x) < 2:
        return math.nan
    return float(stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10, help="sequences per setting (seeds 100..100+N-1)")
    ap.add_argument("--settings", default="chic:0.9,chic:1.8,chic:2.7,dl2",
                    help="comma-separated chic:RATE (jobs/h) or dl2")
    ap.add_argument("--resize-overhead", type=float, default=None, help="resize pause, s (default: 30, checkpoint)")
    args = ap.parse_args()
    print("| setting | policy | avg JCT (s), mean over seeds | JCT / Optimus JCT (paired, 95 % CI) |")
    print("|---|---|---|---|")
    for item in args.settings.split(","):
        setting, _, r = item.partition(":")
        rate = float(r) if r else None
        t0 = time.perf_counter()
        rows = [run(setting, rate, 100 + s, args.resize_overhead) for s in range(args.seeds)]
        for name in POLICIES:
            jct = np.array([row[name] for row in rows])
            ratio = np.array([row[name] / row["optimus"] for row in rows])
            print(f"| {item} ({args.seeds} seeds, {time.perf_counter() - t0:.0f} s) | {name} | {jct.mean():.0f} | "
                  f"{ratio.mean():.3f} +- {_ci(ratio):.3f} |")


if __name__ == "__main__":
    main()
