"""rl-hybrid against rl-base on the held-out 4x8 groups of bench_baselines: utilisation gained, JCT paid.

Run (about 3 min of one core; Markdown to stdout, progress to stderr)::

    nice -n 10 python benchmarks/bench_hybrid.py --sets 6

The job sets are those of ``benchmarks/bench_baselines.py`` (same groups, same seeds, default 950..),
on the groups whose cluster the shipped checkpoints fit (4x8). Per group: mean utilisation of each
policy (%), the per-set difference rl-hybrid - rl-base in utilisation points and the per-set ratio of
average and p90 JCT (mean and 95 % half-width, Student t over sets: paired), and the number of sets on
which the two policies' per-job results differ at all (where rl-hybrid's safety rule changed something).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_baselines import groups, run_group  # noqa: E402

from trainer.evaluate import mean_ci  # noqa: E402

POLICIES = ("rl-base", "rl-hybrid")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", type=int, default=6, help="job sets per group (default 6)")
    ap.add_argument("--jobs", type=int, default=256, help="jobs per set (default 256)")
    ap.add_argument("--seed", type=int, default=950, help="base seed, as bench_baselines (default 950)")
    args = ap.parse_args(argv)
    if args.sets < 2:
        ap.error("--sets must be >= 2 (a paired interval needs two sets)")
    print("| group | util rl-base (%) | util rl-hybrid (%) | util difference (points, paired 95 %) | "
          "avg JCT hybrid / base | p90 JCT hybrid / base | sets that differ |")
    print("|---|---|---|---|---|---|---|")
    for g in groups(args.jobs, args.seed):
        if g.cluster != "4x8":
            continue
        res = run_group(g, args.sets, POLICIES)
        base, hyb = res["rl-base"], res["rl-hybrid"]
        ub = mean_ci([100 * s["avg_util"] for s in base])[0]
        uh = mean_ci([100 * s["avg_util"] for s in hyb])[0]
        du = mean_ci([100 * (h["avg_util"] - b["avg_util"]) for h, b in zip(hyb, base)])
        ja = mean_ci([h["avg_jct_s"] / b["avg_jct_s"] for h, b in zip(hyb, base)])
        jp = mean_ci([h["p90_jct_s"] / b["p90_jct_s"] for h, b in zip(hyb, base)])
        differ = sum(h["avg_jct_s"] != b["avg_jct_s"] or h["avg_util"] != b["avg_util"] for h, b in zip(hyb, base))
        print(f"| {g.name} | {ub:.1f} | {uh:.1f} | {du[0]:+.2f} +- {du[1]:.2f} | {ja[0]:.3f} +- {ja[1]:.3f} | "
              f"{jp[0]:.3f} +- {jp[1]:.3f} | {differ} / {args.sets} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
