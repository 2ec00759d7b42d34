"""Every heuristic on held-out synthetic job sets: mean and paired 95 % intervals against SRTF.

Run (about 10 min of one core; the Markdown goes to stdout, progress to stderr)::

    nice -n 10 python benchmarks/bench_baselines.py --sets 6 > /tmp/baselines.md

It prints the tables of docs/RESULTS.md, "Baselines: the best heuristic per group" and "Baselines: every
heuristic"; ``--docs [PATH]`` also writes them, at the end of the run, between the markers of :data:`BLOCKS`
(``<!-- NAME:begin -->`` / ``<!-- NAME:end -->``) of PATH (default docs/RESULTS.md); a page without those
markers is refused before anything runs. Each
group draws ``--sets`` job sets of ``--jobs`` jobs with :func:`trainer.generate.generate_sets` and
base seed ``--seed`` + group index (default 950..957: held out, disjoint from the seeds of the training,
validation and evaluation traces of RESULTS.md, "How to reproduce", and from 900..907, the sets on which
:data:`policies.placement.SWITCH_GAIN` was chosen); every policy runs every set in the simulator (defaults of
:class:`trainer.simulator.SimConfig`: 300 s rounds, event-triggered, 30 s restart overhead).

``rl-base-4x8`` (the fixed-shape 4x8 checkpoint) runs beside them on the 4x8 groups; the first table states
its average and p90 JCT over the best heuristic's, per set (paired). Per group and policy the tables give the mean average JCT (h) and p90 JCT (h) over the sets, and the
per-set ratio of the policy's average JCT to SRTF's on the same set (mean and 95 % half-width,
Student t over sets: a paired interval). The best heuristic of the group (lowest mean average JCT,
bold) comes first, the other rows follow by mean average JCT. ``greedy-balanced`` is the contention-aware placement without the
``nosplit`` rule (:class:`policies.placement.ContentionAwarePlacement` with ``nosplit=False``:
candidates split over any node count), kept here to show what the rule changes; its rows add
the share of single-node-sized jobs it split.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from policies.base import Policy  # noqa: E402
from policies.cluster import ClusterSpec  # noqa: E402
from policies.heuristics import ORDERS, OrderedPolicy  # noqa: E402
from policies.perf import ContentionModel  # noqa: E402
from policies.placement import ContentionAwarePlacement  # noqa: E402
from policies.registry import make_policy  # noqa: E402
from trainer.evaluate import mean_ci  # noqa: E402
from trainer.generate import GeneratorConfig, generate_sets  # noqa: E402
from trainer.metrics import summarize  # noqa: E402
from trainer.outputs import add_docs_option, doc_problem, write_marked  # noqa: E402
from trainer.simulator import SimConfig, Simulator  # noqa: E402


@dataclass(frozen=True)
class Group:
    """One trace group: a cluster and a generator configuration (``seed``: the group's base seed)."""

    name: str
    cluster: str
    cfg: GeneratorConfig


def groups(num_jobs: int, seed: int = 950) -> list[Group]:
    """The groups: demands 2/4/8 and 1..32 on 4x8, up to 64 on 16x8; zero and Poisson (90 %) arrivals.
    Group ``i`` draws with base seed ``seed + i``."""
    out = []
    for i, (name, cluster, demand, max_gpus, arrival, mix) in enumerate([
        ("248-zero", "4x8", "deepshare", 8, "zero", "normal"),
        ("248-poisson-90", "4x8", "deepshare", 8, "poisson", "normal"),
        ("uniform32-zero", "4x8", "uniform", 32, "zero", "normal"),
        ("uniform32-poisson-90", "4x8", "uniform", 32, "poisson", "normal"),
        ("uniform32-heavy-zero", "4x8", "uniform", 32, "zero", "heavy"),
        ("uniform32-heavy-poisson-90", "4x8", "uniform", 32, "poisson", "heavy"),
        ("16x8-uniform64-zero", "16x8", "uniform", 64, "zero", "normal"),
        ("16x8-uniform64-poisson-90", "16x8", "uniform", 64, "poisson", "normal"),
    ]):
        cfg = GeneratorConfig(num_jobs=num_jobs, mix=mix, demand=demand, max_gpus=max_gpus, arrival=arrival,
                              load=0.9, seed=seed + i)
        out.append(Group(name, cluster, cfg))
    return out


#: The heuristics compared (``sif`` is left out: it is ``sjf``'s order under SCED2's name, so the same runs).
POLICIES = ("srtf", "srtf:nosplit", "lgtf", "lgtf:nosplit", "las", "las2d", "las2d:nosplit", "sjf", "lrf",
            "fifo", "greedy", "greedy-balanced")
#: The learned policy run beside them where its shipped checkpoint fits the cluster (4x8).
RL = "rl-base-4x8"
#: The generated blocks of docs/RESULTS.md (``--docs``): the best heuristic per group, greedy against
#: srtf:nosplit, every heuristic per group.
BLOCKS = ("baselines-best", "baselines-greedy", "baselines-every")


def build(name: str, cluster: ClusterSpec, perf: ContentionModel) -> Policy:
    """A policy by name; ``greedy-balanced`` is SRTF with the splitting contention-aware placement."""
    if name == "greedy-balanced":
        return OrderedPolicy(name=name, order=ORDERS["srtf"], placement=ContentionAwarePlacement(perf),
                             preemptive=True)
    return make_policy(name, cluster, perf)


def is_heuristic(name: str) -> bool:
    from policies.registry import is_learned

    return not is_learned(name)


def run_group(g: Group, num_sets: int, policies: tuple[str, ...]) -> dict[str, list[dict]]:
    """``{policy: [summary of set k]}`` (summaries of :func:`trainer.metrics.summarize`, plus
    ``split_small``: the share of jobs of at most one node's GPUs placed on more than one node)."""
    cluster = ClusterSpec.parse(g.cluster)
    perf = ContentionModel(cluster)
    sets = generate_sets(cluster, g.cfg, num_sets, perf)
    node = cluster.max_gpus_per_node
    out: dict[str, list[dict]] = {p: [] for p in policies}
    for p in policies:
        t0 = time.perf_counter()
        for jobs in sets:
            res = Simulator(cluster, jobs, build(p, cluster, perf), perf, SimConfig()).run()
            s = summarize(res)
            small = [r for r in res.jobs if r.gpu_demand <= node]
            s["split_small"] = sum(r.num_nodes > 1 for r in small) / max(len(small), 1)
            out[p].append(s)
        print(f"{g.name} {p}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return out


def table(g: Group, res: dict[str, list[dict]], num_sets: int) -> str:
    """The group's Markdown table, best average JCT first."""
    base = [s["avg_jct_s"] for s in res["srtf"]]
    rows = []
    for p, sums in res.items():
        avg = mean_ci([s["avg_jct_s"] / 3600 for s in sums])[0]
        p90 = mean_ci([s["p90_jct_s"] / 3600 for s in sums])[0]
        ratio, half = mean_ci([s["avg_jct_s"] / b for s, b in zip(sums, base)])
        util = mean_ci([100 * s["avg_util"] for s in sums])[0]
        cs = mean_ci([s["avg_cs"] for s in sums])[0]
        split = 100 * float(np.mean([s["split_small"] for s in sums]))
        rows.append((avg, p, p90, ratio, half, util, cs, split))
    rows.sort(key=lambda r: (not is_heuristic(r[1]), r))
    rows = rows[:1] + sorted(rows[1:])
    cfg = g.cfg
    arrivals = "all at t = 0" if cfg.arrival == "zero" else f"Poisson, load {cfg.load:g}"
    demands = "2/4/8" if cfg.demand == "deepshare" else f"1..{cfg.max_gpus}"
    head = (f"#### {g.name}: {g.cluster}, demands {demands}, {cfg.mix} mix, {arrivals} "
            f"({num_sets} sets x {cfg.num_jobs} jobs, seed {cfg.seed})\n\n"
            "| policy | avg JCT (h) | p90 JCT (h) | avg JCT / SRTF (paired 95 %) | util (%) | avg CS | "
            "small jobs split (%) |\n|---|---|---|---|---|---|---|")
    lines = [head]
    for k, (avg, p, p90, ratio, half, util, cs, split) in enumerate(rows):
        name = f"**{p}**" if k == 0 else p  # the best heuristic
        ci = "" if math.isnan(half) else f" +- {half:.3f}"
        lines.append(f"| {name} | {avg:.2f} | {p90:.2f} | {ratio:.3f}{ci} | {util:.1f} | {cs:.3f} | {split:.1f} |")
    return "\n".join(lines) + "\n"


def paired(res: dict[str, list[dict]], a: str, b: str) -> tuple[float, float, int]:
    """Mean and 95 % half-width of ``a``'s average JCT over ``b``'s, per set; sets where ``a`` is not worse."""
    r = [x["avg_jct_s"] / y["avg_jct_s"] for x, y in zip(res[a], res[b])]
    m, h = mean_ci(r)
    return m, h, sum(v <= 1 + 1e-12 for v in r)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", type=int, default=6, help="job sets per group (default 6)")
    ap.add_argument("--jobs", type=int, default=256, help="jobs per set (default 256)")
    ap.add_argument("--groups", default="", help="comma-separated group names (default: all)")
    ap.add_argument("--no-rl", dest="rl", action="store_false", help=f"leave out {RL} (run on 4x8 groups)")
    ap.add_argument("--seed", type=int, default=950,
                    help="base seed: group i draws with seed + i (default 950, the held-out sets; 900 drew "
                         "the sets that chose the greedy placement's switch_gain)")
    add_docs_option(ap)
    args = ap.parse_args(argv)
    if args.docs is not None and (problem := doc_problem(args.docs, BLOCKS)):
        ap.error(f"--docs: {problem}")
    if args.sets < 2:
        ap.error("--sets must be >= 2 (a paired interval needs two sets)")
    chosen = [g for g in groups(args.jobs, args.seed) if not args.groups or g.name in args.groups.split(",")]
    if not chosen:
        ap.error(f"--groups {args.groups!r} names no group; groups: {', '.join(g.name for g in groups(1))}")
    best, vs = [], []
    tables = []
    for g in chosen:
        rl = (RL,) if args.rl and g.cluster == "4x8" else ()
        res = run_group(g, args.sets, POLICIES + rl)
        tables.append(table(g, res, args.sets))
        means = {p: float(np.mean([s["avg_jct_s"] for s in sums])) for p, sums in res.items() if is_heuristic(p)}
        top = min(means, key=means.__getitem__)
        m, h, n = paired(res, top, "srtf")
        if rl:
            a, ah, _ = paired(res, RL, top)
            p90 = mean_ci([x["p90_jct_s"] / y["p90_jct_s"] for x, y in zip(res[RL], res[top])])
            vs_rl = f"{a:.3f} +- {ah:.3f} | {p90[0]:.3f} +- {p90[1]:.3f}"
        else:
            vs_rl = "- (4x8 only) | -"
        best.append(f"| {g.name} | {top} | {means[top] / 3600:.2f} | {m:.3f} +- {h:.3f} | {vs_rl} |")
        gm, gh, gn = paired(res, "greedy", "srtf:nosplit")
        om, oh, _ = paired(res, "greedy-balanced", "srtf:nosplit")
        vs.append(f"| {g.name} | {gm:.3f} +- {gh:.3f} | {gn} / {args.sets} | {om:.3f} +- {oh:.3f} |")
    out = {
        "baselines-best": f"| group | best heuristic | its avg JCT (h) | / SRTF (paired 95 %) | {RL} avg JCT / best | "
                          f"{RL} p90 / best |\n|---|---|---|---|---|---|\n" + "\n".join(best),
        "baselines-greedy": "| group | greedy / srtf:nosplit (paired 95 %) | sets greedy not worse | "
                            "greedy-balanced / srtf:nosplit |\n|---|---|---|---|\n" + "\n".join(vs),
        "baselines-every": "\n".join(tables),
    }
    print("\n\n".join(out[b].strip() for b in BLOCKS))
    if args.docs is not None:
        write_marked(args.docs, out)
        print(f"Wrote blocks {', '.join(BLOCKS)} of {args.docs}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
