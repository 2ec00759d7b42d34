"""The size-free policies (``rl-base``, ``rl-hybrid``, ``rl-sf``, or ``NAME:/checkpoint``) against the best
heuristic per group, on 4x8 and 16x8 with one checkpoint, and their per-round latency at 128x8 and 1024x8.

Run (a few minutes of one core; Markdown to stdout, progress to stderr)::

    nice -n 10 python benchmarks/bench_sizefree.py --sets 3 --jobs 128 > /tmp/sizefree.md

``--docs [PATH]`` also writes the groups table between the ``<!-- sizefree-POLICIES:begin -->`` /
``<!-- sizefree-POLICIES:end -->`` markers of PATH (default docs/RESULTS.md; POLICIES is ``--policy``),
once the table is complete; a page without those markers is refused before anything runs.

Groups are :func:`benchmarks.bench_baselines.groups` (held-out base seeds 950..957, disjoint from
``rlsched train-sizefree``'s 7000.. training and 12000.. validation seeds). Per group every
heuristic of :data:`HEURISTICS` and every policy of ``--policy`` run every set; the best heuristic
is the one of lowest mean average JCT over the sets, and each policy is compared with it per set
(paired ratios of average and p90 JCT, mean and 95 % half-width, Student t over sets).

Latency: :func:`latency` fills a cluster to about 90 % with running jobs of 1..32 GPUs (pack
placements), queues 64 jobs, and times the policy's ``schedule`` (one whole controller round: every
pick until hold; for ``rl-hybrid`` also its safety rule) on ``--rounds`` such random states; one
process, BLAS pinned to one thread (run it under ``taskset -c 0`` for one core), wall clock or, with
``--clock cpu``, the process's CPU time (docs/BENCHMARKS.md, "Size-free policy latency")::

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 nice -n 10 taskset -c 0 \
        python benchmarks/bench_sizefree.py --policy rl-base --no-groups --rounds 40 --clock cpu
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_baselines import groups, run_group  # noqa: E402
from policies.cluster import ClusterSpec  # noqa: E402
from policies.perf import ContentionModel  # noqa: E402
from policies.placement import pack  # noqa: E402
from policies.registry import make_policy  # noqa: E402
from policies.state import ClusterState, JobInfo  # noqa: E402
from trainer.evaluate import mean_ci  # noqa: E402
from trainer.outputs import add_docs_option, doc_problem, write_marked  # noqa: E402

HEURISTICS = ("srtf:nosplit", "greedy", "lgtf", "lgtf:nosplit")
GROUPS = ("248-poisson-90", "uniform32-zero", "uniform32-poisson-90", "uniform32-heavy-poisson-90",
          "16x8-uniform64-zero", "16x8-uniform64-poisson-90")


def latency(shape: str, rounds: int, policy: str, seed: int = 0, clock: str = "wall") -> tuple[float, float]:
    """``(p50, p99)`` seconds of one ``policy`` round on random ~90 %-full states of ``shape``, on the wall
    clock (``time.perf_counter``) or this process's CPU time (``clock="cpu"``, ``time.process_time``: what
    one core spends, not counting time the process waited for a CPU on a loaded machine)."""
    now = time.process_time if clock == "cpu" else time.perf_counter
    cluster = ClusterSpec.parse(shape)
    perf = ContentionModel(cluster)
    pol = make_policy(policy, cluster, perf)
    rng = np.random.default_rng(seed)
    models = ("FSDP", "MoE", "DLRM", "MobileNetV3", "Transformer-XL", "ResNet-50")
    models = tuple(m for m in models if _known(perf, m))
    times = []
    for r in range(rounds):
        free = np.array(cluster.gpus_per_node, dtype=np.int64)
        running, k = [], 0
        while free.sum() > 0.1 * cluster.total_gpus:
            g = int(rng.integers(1, 33))
            m = models[int(rng.integers(len(models)))]
            best = perf.best_isolated_throughput(m, g)
            j = JobInfo(f"r{k}", m, g, 0.0, best * 3600 * 4, done_samples=best * 3600 * float(rng.uniform(0, 3)),
                        best_thp=best)
            p = pack(j, free)
            k += 1
            if p is None:
                break
            for nd, c in p.alloc:
                free[nd] -= c
            iso = perf.throughput_for(m, p)
            running.append(JobInfo(j.job_id, m, g, 0.0, j.total_samples, j.done_samples, placement=p,
                                   isolated_thp=iso, achieved_thp=iso * 0.9, best_thp=best, start_time=0.0))
        pending = []
        for i in range(64):
            g = int(rng.integers(1, 33))
            m = models[int(rng.integers(len(models)))]
            best = perf.best_isolated_throughput(m, g)
            pending.append(JobInfo(f"p{i}", m, g, float(i), best * 3600, best_thp=best))
        st = ClusterState(4 * 3600.0, cluster, free, running, pending)
        t0 = now()
        pol.schedule(st)
        times.append(now() - t0)
        print(f"latency {shape} round {r}: {times[-1] * 1e3:.1f} ms", file=sys.stderr, flush=True)
    return float(np.percentile(times, 50)), float(np.percentile(times, 99))


def _known(perf: ContentionModel, model: str) -> bool:
    try:
        perf.best_isolated_throughput(model, 1)
        return True
    except Exception:  # noqa: BLE001 - a model name the performance model does not know
        return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", type=int, default=3, help="job sets per group (default 3)")
    ap.add_argument("--jobs", type=int, default=128, help="jobs per set (default 128)")
    ap.add_argument("--policy", default="rl-base",
                    help="the learned policies, comma-separated, each against the same best heuristic; the "
                         "latency is measured for the first (default rl-base, the shipped size-free checkpoint)")
    ap.add_argument("--groups", default=",".join(GROUPS), help="comma-separated groups")
    ap.add_argument("--rounds", type=int, default=20, help="latency rounds per cluster (default 20)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="latency clock: wall time, or the process's CPU time (default wall)")
    ap.add_argument("--no-latency", dest="lat", action="store_false")
    ap.add_argument("--no-groups", dest="grp", action="store_false")
    add_docs_option(ap)
    args = ap.parse_args(argv)
    block = "sizefree-" + ",".join(p.strip() for p in args.policy.split(",") if p.strip())
    if args.docs is not None and not args.grp:
        ap.error("--docs writes the groups table: drop --no-groups")
    if args.docs is not None and (problem := doc_problem(args.docs, [block])):
        ap.error(f"--docs: {problem}")
    if args.sets < 2:
        ap.error("--sets must be >= 2 (a paired interval needs two sets)")
    want = [g for g in args.groups.split(",") if g]
    chosen = [g for g in groups(args.jobs) if g.name in want]
    learned = [p.strip() for p in args.policy.split(",") if p.strip()]
    if not learned:
        ap.error("--policy names no policy")
    if args.grp:
        lines = ["| group | cluster | best heuristic | its avg JCT (h) | policy | its avg JCT (h) | avg JCT / best "
                 "(paired 95 %) | p90 / best (paired 95 %) | sets not worse |", "|---|---|---|---|---|---|---|---|---|"]
        print("\n".join(lines))
        for g in chosen:
            res = run_group(g, args.sets, (*HEURISTICS, *learned))
            means = {p: float(np.mean([s["avg_jct_s"] for s in res[p]])) for p in HEURISTICS}
            top = min(means, key=means.__getitem__)
            for pol in learned:
                r = [x["avg_jct_s"] / y["avg_jct_s"] for x, y in zip(res[pol], res[top])]
                r90 = [x["p90_jct_s"] / y["p90_jct_s"] for x, y in zip(res[pol], res[top])]
                a, ah = mean_ci(r)
                b, bh = mean_ci(r90)
                mine = float(np.mean([s["avg_jct_s"] for s in res[pol]])) / 3600
                lines.append(f"| {g.name} | {g.cluster} | {top} | {means[top] / 3600:.2f} | {pol} | {mine:.2f} | "
                             f"{a:.3f} +- {ah:.3f} | {b:.3f} +- {bh:.3f} | {sum(v <= 1 + 1e-12 for v in r)} / {len(r)} |")
                print(lines[-1], flush=True)
        if args.docs is not None:
            write_marked(args.docs, {block: "\n".join(lines)})
            print(f"Wrote block {block} of {args.docs}", file=sys.stderr)
    if args.lat:
        import benchmarks.bench_rl as bench_rl

        bench_rl._now = time.process_time if args.clock == "cpu" else time.perf_counter
        ref = bench_rl.machine_reference()
        print(f"\nmachine reference (benchmarks/bench_rl.py, {args.clock} clock): {ref['total_ms']:.1f} ms")
        print("\n| cluster | policy | clock | rounds | p50 (ms) | p99 (ms) |\n|---|---|---|---|---|---|")
        for shape, n in (("128x8", args.rounds), ("1024x8", max(args.rounds // 2, 2))):
            p50, p99 = latency(shape, n, learned[0], clock=args.clock)
            print(f"| {shape} | {learned[0]} | {args.clock} | {n} | {p50 * 1e3:.1f} | {p99 * 1e3:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
