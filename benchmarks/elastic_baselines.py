"""Average JCT of the elastic baselines (DRF, Tetris, Optimus) in the settings of Chic and DL2, beside
FIFO and SRTF with each job fixed at its submitted size (1 worker, 1 PS).

For each setting and seed it generates a sequence (:func:`trainer.elastic.generate`), runs every policy
on the setting's cluster (``data/clusters/``) and prints, per setting, each policy's mean average JCT over
the seeds and its paired ratio to Optimus (mean and 95 % t-interval over seeds). With ``--docs`` it also
writes that table between the ``elastic-baselines`` markers of docs/ELASTIC.md ("Results"); the file is
left as it is if the run fails.

    PYTHONPATH=. nice -n 10 python3 benchmarks/elastic_baselines.py --docs     # docs/ELASTIC.md, "Results"
    PYTHONPATH=. python3 benchmarks/elastic_baselines.py --seeds 3 --settings chic:1.8
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
ELASTIC_MD = ROOT / "docs" / "ELASTIC.md"
#: the generated block of ELASTIC.md
BLOCK = "elastic-baselines"
#: the default settings: Chic's three rates (10 sequences of 30 jobs), DL2's pattern (5 of 200 jobs)
DEFAULT_SETTINGS = "chic:0.9,chic:1.8,chic:2.7,dl2"
#: sequences per setting unless ``--seeds`` says otherwise
DEFAULT_SEEDS = {"chic": 10, "dl2": 5}
#: column titles of the generated table
TITLES = {"optimus": "Optimus", "drf": "DRF", "tetris": "Tetris", "fifo": "FIFO (fixed 1 worker + 1 PS)",
          "srtf": "SRTF (fixed)"}
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


def _label(setting: str, rate: float | None) -> str:
    return f"Chic, {rate:g} jobs/h" if setting == "chic" else "DL2, 200 jobs"


def table(results: list[tuple[str, float | None, int, list[dict[str, float]], float]]) -> str:
    """The Markdown table of ``(setting, rate, jobs, rows, cpu_s)`` results (one row per seed, each a
    policy -> average JCT mapping)."""
    lines = ["| setting | sequences | " + " | ".join(TITLES[n] for n in POLICIES) + " |",
             "|---|---|" + "---|" * len(POLICIES)]
    for setting, rate, jobs, rows, _cpu in results:
        cells = []
        for name in POLICIES:
            jct = np.array([row[name] for row in rows])
            if name == "optimus":
                cells.append(f"{jct.mean():.0f} s")
                continue
            ratio = np.array([row[name] / row["optimus"] for row in rows])
            cells.append(f"{jct.mean():.0f} s ({ratio.mean():.3f} +- {_ci(ratio):.3f})")
        lines.append(f"| {_label(setting, rate)} | {len(rows)} x {jobs} jobs | " + " | ".join(cells) + " |")
    cpu = ", ".join(f"{_label(s, r)} {c:.0f} s" for s, r, _j, _rows, c in results)
    return "\n".join(lines) + (
        "\n\nEach cell: average JCT, mean over the sequences (seeds 100 onwards); in brackets the paired ratio "
        "to Optimus on the same sequences (mean +- 95 % t-interval half-width). 30 s resize pause; the "
        f"baselines re-plan every 600 s. CPU time of the simulations: {cpu}.")


def main() -> None:
    from trainer.elastic import generate
    from trainer.outputs import doc_problem, write_marked

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=None,
                    help="sequences per setting (seeds 100..100+N-1; default 10 for chic, 5 for dl2)")
    ap.add_argument("--settings", default=DEFAULT_SETTINGS, help="comma-separated chic:RATE (jobs/h) or dl2")
    ap.add_argument("--resize-overhead", type=float, default=None, help="resize pause, s (default: 30, checkpoint)")
    ap.add_argument("--docs", nargs="?", const=ELASTIC_MD, default=None, type=Path, metavar="PATH",
                    help=f"also write the table between the {BLOCK} markers of PATH (default {ELASTIC_MD})")
    args = ap.parse_args()
    if args.seeds is not None and args.seeds < 1:
        ap.error(f"--seeds must be >= 1, got {args.seeds}")
    settings = []
    for item in args.settings.split(","):
        setting, _, r = item.partition(":")
        if setting not in DEFAULT_SEEDS or (setting == "chic") != bool(r):
            ap.error(f"--settings: {item!r} is neither chic:RATE nor dl2")
        try:
            rate = float(r) if r else None
        except ValueError:
            ap.error(f"--settings: {item!r}: the rate {r!r} is not a number")
        if rate is not None and not rate > 0:
            ap.error(f"--settings: {item!r}: the rate must be > 0")
        settings.append((setting, rate))
    if args.docs is not None:
        problem = doc_problem(args.docs, [BLOCK])
        if problem:
            ap.error(problem)
    results = []
    print("\n".join(table([]).split("\n")[:2]), flush=True)  # the header, then a row per setting as it is done
    for setting, rate in settings:
        n = args.seeds if args.seeds is not None else DEFAULT_SEEDS[setting]
        t0 = time.process_time()
        rows = [run(setting, rate, 100 + s, args.resize_overhead) for s in range(n)]
        jobs = len(generate(setting, seed=100, rate=rate)["jobs"])
        results.append((setting, rate, jobs, rows, time.process_time() - t0))
        print(table(results[-1:]).split("\n")[2], flush=True)
    text = table(results)
    print()
    print(text)
    if args.docs is not None:
        write_marked(args.docs, {BLOCK: text})
        print(f"wrote the {BLOCK} block of {args.docs}")


if __name__ == "__main__":
    main()
