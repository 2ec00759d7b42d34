"""DL2 against DRF, Tetris and Optimus in DL2's setting (seed 000 section 6: 200 jobs on 500 servers of
2 GPUs, ``data/clusters/dl2.yaml``), on held-out sequences (seeds 100.., training uses 1000.. and
validation 2000..), with paired intervals, and DL2's decision time per inference.

For each seed it generates a ``dl2`` sequence (:func:`trainer.elastic.generate`), runs every policy on
it with the PS performance model, and prints each policy's mean average JCT, the first DL2 policy's
paired JCT ratio to each other policy (mean and 95 % t-interval over seeds), and each DL2 policy's time
per inference and per slot. ``--policies`` names the policies (``LABEL=SPEC`` labels one, e.g.
``dl2-long=dl2:/tmp/run/dl2``); ``--json`` writes the per-seed results, and ``--merge`` prints the table
of such files together, joining a seed's results from several files (so seeds, or policies, can run in
separate processes).

    PYTHONPATH=. nice -n 10 python3 benchmarks/dl2_eval.py --seeds 3          # docs/ELASTIC.md, "DL2"
    PYTHONPATH=. python3 benchmarks/dl2_eval.py --seeds 1 --policies dl2-run=dl2:/tmp/run/dl2,drf,optimus
    PYTHONPATH=. python3 benchmarks/dl2_eval.py --seed0 100 --seeds 1 --json a.json   # then --merge a.json b.json
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BASELINES = ("drf", "tetris", "optimus")


def _ci(x: np.ndarray) -> float:
    """95 % t-interval half-width of ``x`` (NaN for one value)."""
    from trainer.evaluate import mean_ci

    return mean_ci(list(x))[1]


def _parse(policies: str) -> list[tuple[str, str]]:
    out = []
    for item in (x.strip() for x in policies.split(",") if x.strip()):
        label, eq, spec = item.partition("=")
        out.append((label.strip(), spec.strip()) if eq else (item, item))
    return out


def run(seed: int, policies: list[tuple[str, str]], jobs: int) -> dict:
    """Average JCT per policy label on seed ``seed``, and each DL2 policy's plan seconds, inferences, slots."""
    from policies.cluster import ClusterSpec
    from policies.dl2 import DL2Policy
    from policies.perf import ContentionModel
    from policies.psmodel import PSPerformanceModel
    from policies.registry import make_policy
    from trainer.elastic import generate, parse_elastic_trace
    from trainer.simulator import SimConfig, Simulator

    cluster = ClusterSpec.parse(str(ROOT / "data" / "clusters" / "dl2.yaml"))
    perf = PSPerformanceModel(ContentionModel(cluster))
    seq = parse_elastic_trace(generate("dl2", seed=seed, jobs=jobs))
    out: dict = {"seed": seed, "jobs": jobs, "jct": {}, "timing": {}}
    for label, spec in policies:
        pol = make_policy(spec, cluster, perf)
        spent, slots = [0.0], [0]
        if isinstance(pol, DL2Policy):
            inner = pol.plan

            def timed(jobs_, cap, state, inner=inner, spent=spent, slots=slots):
                t = time.perf_counter()
                inner(jobs_, cap, state)
                spent[0] += time.perf_counter() - t
                slots[0] += 1

            pol.plan = timed
        res = Simulator(cluster, seq, pol, perf, SimConfig()).run()
        out["jct"][label] = float(np.mean([r.jct for r in res.jobs]))
        if isinstance(pol, DL2Policy):
            out["timing"][label] = {"plan_s": spent[0], "inferences": pol.inferences, "slots": slots[0]}
        print(f"seed {seed}: {label} {out['jct'][label]:.0f} s", flush=True)
    return out


def table(rows: list[dict]) -> str:
    """The markdown table of per-seed results ``rows`` (policies every row has, first DL2 policy as reference)."""
    rows = sorted(rows, key=lambda r: r["seed"])
    labels = [k for k in rows[0]["jct"] if all(k in r["jct"] for r in rows)]
    dl2 = [k for k in labels if any(k in r["timing"] for r in rows)]
    if not dl2:
        raise SystemExit("no DL2 policy in the results")
    ref = dl2[0]
    lines = [f"{len(rows)} held-out sequences of {rows[0]['jobs']} jobs (seeds {', '.join(str(r['seed']) for r in rows)})", "",
             f"| policy | avg JCT (s), mean over seeds | {ref} JCT / policy JCT (paired, 95 % CI) |", "|---|---|---|"]
    for name in labels:
        jct = np.array([r["jct"][name] for r in rows])
        ratio = np.array([r["jct"][ref] / r["jct"][name] for r in rows])
        cell = "-" if name == ref else f"{ratio.mean():.3f} +- {_ci(ratio):.3f}"
        lines.append(f"| {name} | {jct.mean():.0f} | {cell} |")
    lines.append("")
    lines.append("per seed (s): " + "; ".join(f"seed {r['seed']}: " + ", ".join(f"{k} {r['jct'][k]:.0f}" for k in labels)
                                           for r in rows))
    for name in dl2:
        t = [r["timing"][name] for r in rows if name in r["timing"]]
        spent, inf, slots = sum(x["plan_s"] for x in t), sum(x["inferences"] for x in t), sum(x["slots"] for x in t)
        lines.append(f"{name} decision time: {1e3 * spent / max(inf, 1):.3f} ms per inference ({inf} inferences), "
                     f"{1e3 * spent / max(slots, 1):.1f} ms per slot ({slots} slots), one process")
    return "\n".join(lines)


def main() -> None:
    import json

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3, help="held-out sequences (seeds SEED0..SEED0+N-1)")
    ap.add_argument("--seed0", type=int, default=100, help="first seed (default 100: held out; training uses "
                    "1000.., validation 2000..)")
    ap.add_argument("--jobs", type=int, default=200, help="jobs per sequence (the seed's 200)")
    ap.add_argument("--policies", default="dl2," + ",".join(BASELINES),
                    help="comma-separated policies, LABEL=SPEC to label one (default: %(default)s)")
    ap.add_argument("--json", help="also write the per-seed results here")
    ap.add_argument("--merge", nargs="+", metavar="JSON", help="print the table of these --json files, run nothing")
    args = ap.parse_args()
    if args.merge:
        by_seed: dict = {}
        for f in args.merge:  # rows of one seed (and job count) from several files are one row
            for r in json.loads(Path(f).read_text()):
                row = by_seed.setdefault((r["seed"], r["jobs"]), {"seed": r["seed"], "jobs": r["jobs"], "jct": {}, "timing": {}})
                row["jct"].update(r["jct"])
                row["timing"].update(r["timing"])
        print(table(list(by_seed.values())))
        return
    t0 = time.perf_counter()
    rows = [run(args.seed0 + s, _parse(args.policies), args.jobs) for s in range(args.seeds)]
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print(f"\n{time.perf_counter() - t0:.0f} s\n")
    print(table(rows))


if __name__ == "__main__":
    main()
