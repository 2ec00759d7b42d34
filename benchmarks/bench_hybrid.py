"""rl-hybrid against rl-base on the held-out 4x8 groups of bench_baselines: utilisation gained, JCT paid.

Run (about 3 min of one core; Markdown to stdout, progress to stderr)::

    nice -n 10 python benchmarks/bench_hybrid.py --sets 6

The job sets are those of ``benchmarks/bench_baselines.py`` (same groups, same seeds, default 950..),
on the groups whose cluster the shipped checkpoints fit (4x8). Per group: mean utilisation of each
policy (%), the per-set difference rl-hybrid - rl-base in utilisation points and the per-set ratio of
average and p90 JCT (mean and 95 % half-width, Student t over sets: paired), and the number of sets on
which the two policies' per-job results differ at all (where rl-hybrid's safety rule changed something).

``--figure PATH`` also draws the trade-off (PNG): per set, rl-hybrid's utilisation gain over rl-base
(points, x) against its average JCT over rl-base's (y), one colour per group, each group's mean with
its paired 95 % intervals as error bars; the seed's claim (utilisation up at about 3 % JCT cost) is the
region right of 0 and below 1.03. docs/figures/hybrid_jct_vs_util.png is drawn by
``nice -n 10 python benchmarks/bench_hybrid.py --sets 6 --figure docs/figures/hybrid_jct_vs_util.png``.

``--docs [PATH]`` also writes the table between the ``<!-- hybrid-HYBRID:begin -->`` /
``<!-- hybrid-HYBRID:end -->`` markers of PATH (default docs/RESULTS.md; HYBRID is the second policy of
``--pair``) at the end of the run; a page without those markers is refused before anything runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_baselines import groups, run_group  # noqa: E402

from trainer.evaluate import mean_ci  # noqa: E402
from trainer.outputs import add_docs_option, doc_problem, write_marked  # noqa: E402

POLICIES = ("rl-base", "rl-hybrid")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", type=int, default=6, help="job sets per group (default 6)")
    ap.add_argument("--jobs", type=int, default=256, help="jobs per set (default 256)")
    ap.add_argument("--seed", type=int, default=950, help="base seed, as bench_baselines (default 950)")
    ap.add_argument("--figure", type=Path, default=None, help="also draw the JCT vs utilisation trade-off (PNG)")
    ap.add_argument("--pair", default=",".join(POLICIES),
                    help="BASE,HYBRID: the two policies compared (default %(default)s, the size-free ones; "
                         "rl-base-4x8,rl-hybrid-4x8 for the fixed-shape checkpoints)")
    add_docs_option(ap)
    args = ap.parse_args(argv)
    block = f"hybrid-{args.pair.split(',')[-1].strip()}"
    if args.docs is not None and (problem := doc_problem(args.docs, [block])):
        ap.error(f"--docs: {problem}")
    if args.sets < 2:
        ap.error("--sets must be >= 2 (a paired interval needs two sets)")
    pair = tuple(p.strip() for p in args.pair.split(","))
    if len(pair) != 2 or not all(pair):
        ap.error(f"--pair {args.pair!r}: expected BASE,HYBRID")
    if args.figure is not None and not args.figure.parent.is_dir():
        ap.error(f"--figure {args.figure}: folder {args.figure.parent} does not exist")
    points: list[tuple[str, list[float], list[float], tuple, tuple]] = []
    lines = [f"| group | util {pair[0]} (%) | util {pair[1]} (%) | util difference (points, paired 95 %) | "
             "avg JCT hybrid / base | p90 JCT hybrid / base | sets that differ |", "|---|---|---|---|---|---|---|"]
    print("\n".join(lines))
    for g in groups(args.jobs, args.seed):
        if g.cluster != "4x8":
            continue
        res = run_group(g, args.sets, pair)
        base, hyb = res[pair[0]], res[pair[1]]
        ub = mean_ci([100 * s["avg_util"] for s in base])[0]
        uh = mean_ci([100 * s["avg_util"] for s in hyb])[0]
        du = mean_ci([100 * (h["avg_util"] - b["avg_util"]) for h, b in zip(hyb, base)])
        ja = mean_ci([h["avg_jct_s"] / b["avg_jct_s"] for h, b in zip(hyb, base)])
        jp = mean_ci([h["p90_jct_s"] / b["p90_jct_s"] for h, b in zip(hyb, base)])
        points.append((g.name, [100 * (h["avg_util"] - b["avg_util"]) for h, b in zip(hyb, base)],
                       [h["avg_jct_s"] / b["avg_jct_s"] for h, b in zip(hyb, base)], du, ja))
        differ = sum(h["avg_jct_s"] != b["avg_jct_s"] or h["avg_util"] != b["avg_util"] for h, b in zip(hyb, base))
        lines.append(f"| {g.name} | {ub:.1f} | {uh:.1f} | {du[0]:+.2f} +- {du[1]:.2f} | {ja[0]:.3f} +- {ja[1]:.3f} | "
                     f"{jp[0]:.3f} +- {jp[1]:.3f} | {differ} / {args.sets} |")
        print(lines[-1], flush=True)
    if args.figure is not None:
        draw(points, args.figure, args.sets, args.jobs)
        print(f"\nFigure: {args.figure}", file=sys.stderr)
    if args.docs is not None:
        write_marked(args.docs, {block: "\n".join(lines)})
        print(f"Wrote block {block} of {args.docs}", file=sys.stderr)
    return 0


def draw(points, path: Path, sets: int, jobs: int) -> None:
    """The trade-off figure (module docstring): per-set points and per-group means with 95 % bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5.0))
    ax.axhline(1.0, color="0.6", lw=0.8)
    ax.axvline(0.0, color="0.6", lw=0.8)
    ax.axhline(1.03, color="0.6", lw=0.8, ls=":")
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, (name, du, ja, mdu, mja) in enumerate(points):
        c = colours[k % len(colours)]
        ax.scatter(du, ja, s=14, color=c, alpha=0.45)
        ax.errorbar([mdu[0]], [mja[0]], xerr=[mdu[1]], yerr=[mja[1]], fmt="o", color=c, ms=7, capsize=3,
                    label=f"{name}: {mdu[0]:+.2f} pt, {mja[0]:.3f} x")
    ax.set_xlabel("utilisation, rl-hybrid - rl-base (percentage points)")
    ax.set_ylabel("average JCT, rl-hybrid / rl-base")
    ax.set_title(f"rl-hybrid vs rl-base, 4x8 held-out groups ({sets} sets x {jobs} jobs; bars: paired 95 %)",
                 fontsize=9)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
