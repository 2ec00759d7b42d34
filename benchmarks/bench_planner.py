"""The lookahead planner (``planner``, :mod:`policies.planner`) against the best heuristic, and the
learned policy against the planner, per group, on the held-out sets of ``benchmarks/bench_sizefree.py``.

Run (the Markdown goes to stdout, progress to stderr)::

    nice -n 10 python benchmarks/bench_planner.py --cache /tmp/planner-cache > /tmp/planner.md

(docs/RESULTS.md, "Planner", is this command's output; ``--docs [PATH]`` writes its three tables between
the ``<!-- planner-best|planner-vs|planner-rounds:begin/end -->`` markers of PATH, default docs/RESULTS.md,
at the end of the run; a page without them is refused before anything runs.) The groups, sets and best-heuristic reference
are ``bench_sizefree.py``'s: :data:`benchmarks.bench_sizefree.GROUPS` from
:func:`benchmarks.bench_baselines.groups` (``--jobs`` jobs per set, base seed ``--seed`` + group index,
950 by default: held-out), ``--sets`` sets per group, and per group the best of
:data:`benchmarks.bench_sizefree.HEURISTICS` by mean average JCT over the sets. On every set each
planner of ``--planner`` and each learned policy of ``--learned`` runs in the simulator (defaults of
:class:`trainer.simulator.SimConfig`). Ratios are paired per set (the per-set ratio of average and of
p90 JCTs; mean and 95 % half-width, Student t over sets): each planner against the best heuristic,
each learned policy against the best heuristic and against the first planner ("within 3 %": the
learned policy's average JCT at most 1.03 x the planner's).

Choosing the planner's options on validation sets: the same command with another ``--seed`` (the
validation groups are ``--seed 2950``, disjoint from the held-out 950.. and from the size-free
trainer's 7000.. / 12000.. seeds) and several ``--planner`` specs, e.g.
``--sets 2 --jobs 64 --planner planner:arrivals=0/work=6000,planner:arrivals=2/work=6000 --learned ''``.

Per round of each planner: the CPU time of ``planner.schedule`` (:func:`time.process_time`), the
simulated rounds its rollouts took (``RoundStats.work``), and whether a budget cut it.

``--cache DIR`` keeps each (group, set, policy) result as a JSON file and reuses it on the next run
with the same arguments, so an interrupted run resumes where it stopped; a learned policy's key also
holds its checkpoint's sha256, so a result of another checkpoint under the same name is not reused.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_baselines import Group, groups  # noqa: E402
from benchmarks.bench_sizefree import GROUPS, HEURISTICS  # noqa: E402
from policies.base import PolicyError  # noqa: E402
from policies.cluster import ClusterSpec  # noqa: E402
from policies.perf import ContentionModel  # noqa: E402
from policies.planner import PlannerPolicy  # noqa: E402
from policies.registry import make_policy  # noqa: E402
from trainer.evaluate import mean_ci  # noqa: E402
from trainer.generate import generate_sets  # noqa: E402
from trainer.metrics import summarize  # noqa: E402
from trainer.outputs import add_docs_option, doc_problem, write_marked  # noqa: E402
from trainer.simulator import SimConfig, Simulator  # noqa: E402

#: The planner measured by default: its default options with a work budget of simulated rounds per round
#: instead of the wall budget, so the runs are the same on any machine (docs/RESULTS.md, "Planner").
DEFAULT_PLANNERS = ("planner:work=6000",)
#: The learned policies compared with the planner by default.
DEFAULT_LEARNED = ("rl-base",)
#: "Within 3 %": the learned policy's average JCT over the planner's.
WITHIN = 1.03
#: The generated blocks of docs/RESULTS.md (``--docs``): against the best heuristic, learned against the first
#: planner, the planner's rounds.
BLOCKS = ("planner-best", "planner-vs", "planner-rounds")


def run_one(cluster: ClusterSpec, perf: ContentionModel, jobs, policy: str) -> dict:
    """One policy on one set: the summary of :func:`trainer.metrics.summarize`, the run's CPU seconds
    (``cpu_s``) and, for a planner, its per-round CPU seconds (``round_cpu_s``), simulated rounds
    (``round_work``) and cut flags (``round_cut``)."""
    pol = make_policy(policy, cluster, perf)
    rounds: dict[str, list] = {"round_cpu_s": [], "round_work": [], "round_cut": [], "round_switch": []}
    if isinstance(pol, PlannerPolicy):
        inner = pol.schedule

        def timed(state):
            t0 = time.process_time()
            dec = inner(state)
            rounds["round_cpu_s"].append(time.process_time() - t0)
            st = pol.last_round
            rounds["round_work"].append(st.work)
            rounds["round_cut"].append(bool(st.cut))
            rounds["round_switch"].append(st.chosen != 0)
            return dec

        pol.schedule = timed  # type: ignore[method-assign]
    t0 = time.process_time()
    s = summarize(Simulator(cluster, jobs, pol, perf, SimConfig()).run())
    out = {k: float(v) for k, v in s.items() if isinstance(v, (int, float))}
    out["cpu_s"] = time.process_time() - t0
    if rounds["round_cpu_s"]:
        out.update(rounds)
    return out


def run_key(g: Group, policy: str) -> str:
    """The policy as run on ``g``'s sets: on a zero-arrival group a planner's ``arrivals`` option is left
    out, because with every job submitted at t = 0 the arrival model's rate is 0 and the planner runs
    exactly as with ``arrivals=0`` (tests/test_planner.py checks it), so such planners run once."""
    base, sep, rest = policy.partition(":")
    if base.strip().lower() != "planner" or g.cfg.arrival != "zero" or not sep:
        return policy
    kept = [o for o in rest.split("/") if o.partition("=")[0].strip().lower() != "arrivals"]
    return base + (":" + "/".join(kept) if kept else "")


def _weights(policy: str) -> str:
    """For a learned policy with a checkpoint, the sha256 of its checkpoint JSON (which records the weights'
    sha256), so a cached result of a replaced checkpoint is not reused; ``""`` for any other policy."""
    from policies.registry import checkpoint_path, is_learned

    if not is_learned(policy):
        return ""
    try:
        return hashlib.sha256(checkpoint_path(policy).read_bytes()).hexdigest()
    except (PolicyError, OSError):
        return ""


def _cache_file(cache: Path | None, g: Group, k: int, policy: str) -> Path | None:
    if cache is None:
        return None
    w = _weights(policy)
    tag = hashlib.sha1(f"{g.name}|{g.cfg!r}|{k}|{run_key(g, policy)}{'|' + w if w else ''}".encode()).hexdigest()[:16]
    return cache / f"{g.name}-{k}-{tag}.json"


def run_group(g: Group, num_sets: int, policies: list[str], cache: Path | None) -> dict[str, list[dict]]:
    """``{policy: [result of set k]}`` (:func:`run_one`), read from ``cache`` where it holds them."""
    cluster = ClusterSpec.parse(g.cluster)
    perf = ContentionModel(cluster)
    sets = generate_sets(cluster, g.cfg, num_sets, perf)
    out: dict[str, list[dict]] = {p: [] for p in policies}
    done: dict[tuple[str, int], dict] = {}
    for p in policies:
        for k, jobs in enumerate(sets):
            f = _cache_file(cache, g, k, p)
            if (run_key(g, p), k) in done:
                out[p].append(done[run_key(g, p), k])
                continue
            if f is not None and f.exists():
                out[p].append(json.loads(f.read_text()))
                continue
            r = done[run_key(g, p), k] = run_one(cluster, perf, jobs, run_key(g, p))
            print(f"{g.name} set {k} {p}: avg JCT {r['avg_jct_s'] / 3600:.3f} h, {r['cpu_s']:.1f} s CPU",
                  file=sys.stderr, flush=True)
            if f is not None:
                f.parent.mkdir(parents=True, exist_ok=True)
                f.write_text(json.dumps(r))
            out[p].append(r)
    return out


def _paired(a: list[dict], b: list[dict], key: str) -> tuple[float, float]:
    return mean_ci([x[key] / y[key] for x, y in zip(a, b)])


def _count(a: list[dict], b: list[dict]) -> str:
    better = sum(x["avg_jct_s"] < y["avg_jct_s"] * (1 - 1e-9) for x, y in zip(a, b))
    worse = sum(x["avg_jct_s"] > y["avg_jct_s"] * (1 + 1e-9) for x, y in zip(a, b))
    return f"{better} / {worse} / {len(a)}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", type=int, default=3, help="job sets per group (default 3)")
    ap.add_argument("--jobs", type=int, default=128, help="jobs per set (default 128, as bench_sizefree.py)")
    ap.add_argument("--groups", default=",".join(GROUPS), help="comma-separated groups (default bench_sizefree's)")
    ap.add_argument("--planner", default=",".join(DEFAULT_PLANNERS),
                    help=f"planner specs, comma-separated (default {','.join(DEFAULT_PLANNERS)}); the first is "
                         "the one the learned policies are compared with")
    ap.add_argument("--learned", default=",".join(DEFAULT_LEARNED),
                    help="learned policies compared with the best heuristic and the first planner, comma-separated "
                         "('' for none; default rl-base)")
    ap.add_argument("--seed", type=int, default=950, help="base seed as in bench_baselines (default 950: held out)")
    ap.add_argument("--cache", type=Path, default=None, help="directory of per-run results to reuse and fill")
    add_docs_option(ap)
    args = ap.parse_args(argv)
    if args.docs is not None and (problem := doc_problem(args.docs, BLOCKS)):
        ap.error(f"--docs: {problem}")
    if args.sets < 2:
        ap.error("--sets must be >= 2 (a paired interval needs two sets)")
    if args.jobs < 1:
        ap.error("--jobs must be >= 1")
    known = {g.name: g for g in groups(args.jobs, args.seed)}
    names = [n.strip() for n in args.groups.split(",") if n.strip()]
    bad = [n for n in names if n not in known]
    if bad or not names:
        ap.error(f"--groups: unknown group {bad[0] if bad else ''!r}; groups: {', '.join(known)}")
    planners = [p.strip() for p in args.planner.split(",") if p.strip()]
    learned = [p.strip() for p in args.learned.split(",") if p.strip()]
    if not planners:
        ap.error("--planner names no planner")
    for p in planners + learned:
        try:
            make_policy(p, ClusterSpec.parse("4x8"))
        except PolicyError as exc:
            ap.error(f"--planner / --learned: {exc}")
    if any(not p.partition(":")[0].strip().lower() == "planner" for p in planners):
        ap.error("--planner: every spec must be a planner (planner or planner:KEY=VALUE/...)")
    ref = planners[0]
    print(f"Sets: {args.sets} x {args.jobs} jobs per group, base seed {args.seed}; best heuristic of "
          f"{', '.join(HEURISTICS)} per group.\n")
    best_rows = ["| group | cluster | best heuristic | its avg JCT (h) | policy | its avg JCT (h) | avg JCT / best "
                 "(paired 95 %) | p90 / best (paired 95 %) | sets better / worse / all |",
                 "|---|---|---|---|---|---|---|---|---|"]
    print("\n".join(best_rows), flush=True)
    vs_rows, lat_rows = [], []
    for name in names:
        g = known[name]
        res = run_group(g, args.sets, [*HEURISTICS, *planners, *learned], args.cache)
        means = {h: float(np.mean([s["avg_jct_s"] for s in res[h]])) for h in HEURISTICS}
        top = min(means, key=means.__getitem__)
        for p in (*planners, *learned):
            a, ah = _paired(res[p], res[top], "avg_jct_s")
            b, bh = _paired(res[p], res[top], "p90_jct_s")
            mine = float(np.mean([s["avg_jct_s"] for s in res[p]]))
            best_rows.append(f"| {name} | {g.cluster} | {top} | {means[top] / 3600:.2f} | {p} | {mine / 3600:.2f} | "
                             f"{a:.3f} +- {ah:.3f} | {b:.3f} +- {bh:.3f} | {_count(res[p], res[top])} |")
            print(best_rows[-1], flush=True)
        for p in learned:
            a, ah = _paired(res[p], res[ref], "avg_jct_s")
            b, bh = _paired(res[p], res[ref], "p90_jct_s")
            verdict = "yes" if a <= WITHIN else "no"
            vs_rows.append(f"| {name} | {p} | {a:.3f} +- {ah:.3f} | {b:.3f} +- {bh:.3f} | "
                           f"{_count(res[p], res[ref])} | {verdict} |")
        for p in planners:
            cpu = np.concatenate([np.asarray(s["round_cpu_s"], float) for s in res[p]]) * 1e3
            work = np.concatenate([np.asarray(s["round_work"], float) for s in res[p]])
            cut = sum(sum(s["round_cut"]) for s in res[p])
            sw = sum(sum(s["round_switch"]) for s in res[p])
            run_cpu = float(np.mean([s["cpu_s"] for s in res[p]]))
            lat_rows.append(f"| {name} | {p} | {len(cpu)} | {np.percentile(cpu, 50):.0f} | {np.percentile(cpu, 99):.0f} | "
                            f"{cpu.max():.0f} | {np.percentile(work, 50):.0f} | {work.max():.0f} | "
                            f"{100 * sw / max(len(cpu), 1):.1f} | {cut} | {run_cpu:.0f} |")
    out = {"planner-best": "\n".join(best_rows)}
    if learned:
        out["planner-vs"] = ("| group | policy | avg JCT / planner (paired 95 %) | p90 / planner (paired 95 %) | "
                             "sets better / worse / all | within 3 % |\n|---|---|---|---|---|---|\n" + "\n".join(vs_rows))
        print(f"\nLearned policy against the planner `{ref}` (paired per set; within 3 %: mean ratio <= {WITHIN}):\n")
        print(out["planner-vs"])
    out["planner-rounds"] = ("| group | planner | rounds | p50 CPU (ms) | p99 CPU (ms) | max CPU (ms) | p50 simulated "
                             "rounds | max simulated rounds | rounds not taking the base decision (%) | rounds cut by "
                             "a budget | CPU per set (s) |\n|---|---|---|---|---|---|---|---|---|---|---|\n"
                             + "\n".join(lat_rows))
    print("\nPlanner rounds (CPU time of one `schedule` call; simulated rounds of its rollouts):\n")
    print(out["planner-rounds"])
    if args.docs is not None:
        write_marked(args.docs, out)
        print(f"Wrote blocks {', '.join(out)} of {args.docs}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
