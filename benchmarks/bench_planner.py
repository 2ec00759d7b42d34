"""The lookahead planner (``planner``, :mod:`policies.planner`) against the best heuristic per group.

Run (the Markdown goes to stdout, progress to stderr)::

    nice -n 10 python benchmarks/bench_planner.py --sets 3 --jobs 64 > /tmp/planner.md

(docs/RESULTS.md, "Planner", ran the four groups with 64 jobs this way and the two 1..32 zero-arrival
groups with ``--jobs 32``, one ``--groups`` each.)

It writes the tables of docs/RESULTS.md, "Planner". The groups are the 4x8 groups of
``benchmarks/bench_baselines.py`` (same generator settings and base seeds 950 + group index:
held-out sets), drawn smaller (``--sets`` sets of ``--jobs`` jobs). On every set every heuristic of
:data:`HEURISTICS` and the planner (default options, ``budget_s`` as given) run in the simulator (defaults
of :class:`trainer.simulator.SimConfig`). The best heuristic of a group is the one with the lowest
mean average JCT over the group's sets; the planner is compared with it per set (paired: the per-set
ratio of average JCTs and of p90 JCTs, mean and 95 % half-width, Student t over sets). Latency is the
wall time of each ``planner.schedule`` call (one round), over every round of the group.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_baselines import groups  # noqa: E402
from policies.cluster import ClusterSpec  # noqa: E402
from policies.perf import ContentionModel  # noqa: E402
from policies.registry import make_policy  # noqa: E402
from trainer.evaluate import mean_ci  # noqa: E402
from trainer.generate import generate_sets  # noqa: E402
from trainer.metrics import summarize  # noqa: E402
from trainer.simulator import SimConfig, Simulator  # noqa: E402

#: The heuristics the planner is compared with: every group's best of bench_baselines, and plain SRTF.
HEURISTICS = ("srtf", "srtf:nosplit", "lgtf", "lgtf:nosplit", "greedy")
#: The 4x8 groups run by default.
DEFAULT_GROUPS = ("248-zero", "248-poisson-90", "uniform32-zero", "uniform32-poisson-90",
                  "uniform32-heavy-zero", "uniform32-heavy-poisson-90")


def run_planner(cluster: ClusterSpec, perf: ContentionModel, jobs, budget_s: float | None):
    """The planner's summary on one set and its per-round latencies (s) and switch count."""
    pol = make_policy("planner", cluster, perf, budget_s=budget_s)
    inner = pol.schedule
    lat: list[float] = []
    switched = [0, 0]

    def timed(state):
        t0 = time.perf_counter()
        dec = inner(state)
        lat.append(time.perf_counter() - t0)
        switched[0] += pol.last_round.chosen != 0
        switched[1] += pol.last_round.cut
        return dec

    pol.schedule = timed  # type: ignore[method-assign]
    res = Simulator(cluster, jobs, pol, perf, SimConfig()).run()
    return summarize(res), lat, switched


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", type=int, default=3, help="job sets per group (default 3)")
    ap.add_argument("--jobs", type=int, default=64, help="jobs per set (default 64)")
    ap.add_argument("--groups", default=",".join(DEFAULT_GROUPS), help="comma-separated 4x8 group names")
    ap.add_argument("--budget-s", type=float, default=None, help="planner budget per round (default: 1 s at 4x8)")
    ap.add_argument("--seed", type=int, default=950, help="base seed as in bench_baselines (default 950)")
    args = ap.parse_args(argv)
    if args.sets < 2:
        ap.error("--sets must be >= 2 (a paired interval needs two sets)")
    if args.budget_s is not None and not args.budget_s > 0:
        ap.error("--budget-s must be > 0")
    known = {g.name: g for g in groups(args.jobs, args.seed) if g.cluster == "4x8"}
    names = [n.strip() for n in args.groups.split(",") if n.strip()]
    bad = [n for n in names if n not in known]
    if bad or not names:
        ap.error(f"--groups: unknown 4x8 group {bad[0] if bad else ''!r}; groups: {', '.join(known)}")
    print(f"Sets: {args.sets} x {args.jobs} jobs per group, base seed {args.seed}, 4x8.\n")
    print("| group | best heuristic | its avg JCT (h) | planner avg JCT (h) | planner / best avg JCT (paired 95 %) | "
          "planner / best p90 | sets better / worse / all |")
    print("|---|---|---|---|---|---|---|", flush=True)
    lat_rows = []
    for name in names:
        g = known[name]
        cluster = ClusterSpec.parse(g.cluster)
        perf = ContentionModel(cluster)
        sets = generate_sets(cluster, g.cfg, args.sets, perf)
        res: dict[str, list[dict]] = {h: [] for h in HEURISTICS}
        for h in HEURISTICS:
            for jobs in sets:
                pol = make_policy(h, cluster, perf)
                res[h].append(summarize(Simulator(cluster, jobs, pol, perf, SimConfig()).run()))
        res["planner"] = []
        lats: list[float] = []
        sw = [0, 0]
        t0 = time.perf_counter()
        for jobs in sets:
            s, lat, switched = run_planner(cluster, perf, jobs, args.budget_s)
            res["planner"].append(s)
            lats += lat
            sw[0] += switched[0]
            sw[1] += switched[1]
        print(f"{name}: planner {time.perf_counter() - t0:.1f} s over {len(lats)} rounds", file=sys.stderr, flush=True)
        means = {h: float(np.mean([s["avg_jct_s"] for s in res[h]])) for h in HEURISTICS}
        top = min(means, key=means.__getitem__)
        r, rh = mean_ci([p["avg_jct_s"] / b["avg_jct_s"] for p, b in zip(res["planner"], res[top])])
        q, qh = mean_ci([p["p90_jct_s"] / b["p90_jct_s"] for p, b in zip(res["planner"], res[top])])
        better = sum(p["avg_jct_s"] < b["avg_jct_s"] * (1 - 1e-9) for p, b in zip(res["planner"], res[top]))
        worse = sum(p["avg_jct_s"] > b["avg_jct_s"] * (1 + 1e-9) for p, b in zip(res["planner"], res[top]))
        pm = float(np.mean([s["avg_jct_s"] for s in res["planner"]]))
        print(f"| {name} | {top} | {means[top] / 3600:.3f} | {pm / 3600:.3f} | {r:.3f} +- {rh:.3f} | "
                    f"{q:.3f} +- {qh:.3f} | {better} / {worse} / {args.sets} |", flush=True)
        a = np.asarray(lats) * 1e3
        lat_rows.append(f"| {name} | {len(a)} | {np.percentile(a, 50):.0f} | {np.percentile(a, 99):.0f} | "
                        f"{a.max():.0f} | {100 * sw[0] / max(len(a), 1):.1f} | {sw[1]} |")
        print(f"latency {lat_rows[-1]}", file=sys.stderr, flush=True)
    print("\n| group | planner rounds | p50 (ms) | p99 (ms) | max (ms) | rounds not taking the base decision (%) | "
          "rounds cut by the budget |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(lat_rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
