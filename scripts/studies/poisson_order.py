"""Holding or candidate order on `pow2` Poisson arrivals, and the candidate order's aging: RL against SRTF.

Run: ``python scripts/studies/poisson_order.py --traces /tmp/rl/traces/eval --groups poisson-90,poisson-95
[--aging 1800,300] [--json FILE]`` (about 3 minutes for the two groups).

For each group it runs, on every job set:

* ``srtf`` and ``greedy`` (contention-aware greedy in SRTF order; for the equal 1-hour
  jobs of these sets that is arrival order);
* ``rl-base theta=0``: the shipped network, with its shipped aging, and an admission
  prior that never ranks "nothing" above a placement, i.e. never holds;
* for each ``--aging`` value ``A`` (s): ``rl-base aging=A``, the shipped network with the
  candidate order's aging (:attr:`policies.codecs.deepshare.ObsSpec.aging_s`) set to ``A``, and
  ``plan-greedy aging=A``, that candidate order without a network or holding
  (``scripts/studies/uniform_gap.py``). Aging multiplies the candidate key by ``exp(-wait / A)``;
  on zero-arrival sets every job has waited equally and the order does not change. The
  shipped network was trained with 1800 s and runs with 300 s (docs/RL.md).

Prints mean avg / p90 JCT (h) and utilisation (%) per group and policy. An
explanation, not a timed benchmark; docs/RESULTS.md quotes it.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from policies.base import Policy, PolicyError
from policies.cluster import ClusterSpec
from policies.codecs.deepshare import DeepShareCodec
from policies.perf import ContentionModel
from policies.rl import RLPolicy, make_rl_policy
from trainer.evaluate import make_policy, select_groups
from trainer.metrics import summarize
from trainer.simulator import SimConfig, Simulator
from trainer.traces import load_trace

_UG = Path(__file__).resolve().with_name("uniform_gap.py")
_spec = importlib.util.spec_from_file_location("uniform_gap", _UG)
uniform_gap = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(uniform_gap)


def run(policy: Policy, files: list[Path], cluster: ClusterSpec, perf: ContentionModel) -> dict[str, float]:
    """Means over the job sets ``files`` of avg / p90 JCT (h) and utilisation (%)."""
    rows = []
    for f in files:
        policy.reset()
        s = summarize(Simulator(cluster, load_trace(f, cluster), policy, perf, SimConfig()).run())
        rows.append((s["avg_jct_s"] / 3600, s["p90_jct_s"] / 3600, 100 * s["avg_util"]))
    a = np.mean(rows, axis=0)
    return {"avg_jct_h": float(a[0]), "p90_jct_h": float(a[1]), "util_pct": float(a[2])}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--traces", required=True, help="directory with one sub-directory of job sets per group")
    ap.add_argument("--groups", default="poisson-90,poisson-95", help="comma-separated groups")
    ap.add_argument(
        "--aging", default="1800,300", help="comma-separated aging values (s, > 0) for rl-base and plan-greedy"
    )
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    cl = ClusterSpec.parse("4x8")
    perf = ContentionModel(cl)
    try:
        agings = [float(a) for a in args.aging.split(",") if a.strip()]  # the options first, then the traces
        if not agings or not all(np.isfinite(a) and a > 0 for a in agings):
            raise ValueError(f"--aging {args.aging!r}: expected positive numbers of seconds")
        groups, names = select_groups(args.traces, args.groups or ",")
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        base = make_rl_policy("rl-base", cl, perf)
    except PolicyError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    never_holds = RLPolicy(base.net, base.codec, prior=dataclasses.replace(base.prior, theta=0.0), name="rl-base theta=0")
    out: dict = {}
    table = Table(title="Poisson arrivals: avg JCT h / p90 JCT h / util % (mean over job sets)")
    table.add_column("policy")
    for g in names:
        table.add_column(g)
    rows: dict[str, list[str]] = {}

    def with_aging(a: float) -> RLPolicy:
        codec = DeepShareCodec(cl, perf, dataclasses.replace(base.codec.spec, aging_s=a))
        return RLPolicy(base.net, codec, prior=base.prior, name=f"rl-base aging={a:g}")

    try:
        for g in names:
            res = {
                "srtf": run(make_policy("srtf", cl, perf), groups[g], cl, perf),
                "greedy": run(make_policy("greedy", cl, perf), groups[g], cl, perf),
                "rl-base theta=0": run(never_holds, groups[g], cl, perf),
            }
            for a in agings:
                res[f"rl-base aging={a:g}"] = run(with_aging(a), groups[g], cl, perf)
                res[f"plan-greedy aging={a:g}"] = run(uniform_gap.PlanGreedy(cl, perf, aging_s=a), groups[g], cl, perf)
            out[g] = res
            for k, v in res.items():
                rows.setdefault(k, []).append(f"{v['avg_jct_h']:.2f} / {v['p90_jct_h']:.2f} / {v['util_pct']:.1f}")
    except (OSError, ValueError) as e:  # a trace that does not load (TraceError is a ValueError)
        print(f"error: {e}", file=sys.stderr)
        return 2
    for k, cells in rows.items():
        table.add_row(k, *cells)
    Console(width=max(Console().width, 120)).print(table)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
