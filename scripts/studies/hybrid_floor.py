"""rl-hybrid's safety rule (placement and efficiency floor): utilisation and JCT against rl-base.

Run: ``python scripts/studies/hybrid_floor.py --traces /tmp/rl/traces/eval [--floors 0,0.5,0.7]
[--rules packing,contention-aware] [--groups uniform,jitter,...] [--checkpoint PATH]``.
The trace groups are the evaluation groups of docs/RESULTS.md (one
sub-directory per group).

For every group, rule (``RLPolicy(hybrid_rule=...)``) and floor
(``hybrid_floor=``, :data:`policies.rl.HYBRID_FLOOR`) it runs ``rl-base`` and
``rl-hybrid`` (same network, shipped checkpoint by default; only the hybrid's
safety rule differs) through the simulator on every job set and prints mean
average JCT (h), utilisation (%) and the hybrid's JCT relative to rl-base.
A second table summarises each variant over the groups: mean and worst JCT
change, mean utilisation change, and in how many groups utilisation went up or
down. Results are written as JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from policies.base import PolicyError
from policies.cluster import ClusterSpec
from policies.perf import ContentionModel
from policies.rl import RLPolicy, make_rl_policy
from trainer.evaluate import evaluate_group, select_groups


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--traces", required=True, help="directory with one sub-directory of job sets per group")
    ap.add_argument("--groups", default=None, help="comma-separated groups (default: all)")
    ap.add_argument("--floors", default="0,0.5,0.7", help="comma-separated floors in [0, 1]")
    ap.add_argument("--rules", default="packing,contention-aware", help="comma-separated safety-rule placements")
    ap.add_argument("--checkpoint", default=None, help="policy checkpoint (default: the shipped 4x8 one)")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    cl = ClusterSpec.parse("4x8")
    perf = ContentionModel(cl)
    try:
        groups, names = select_groups(args.traces, args.groups)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        # "+ 0.0" folds -0 into 0; dict.fromkeys drops repeats, keeping the order given
        floors = list(dict.fromkeys(float(f) + 0.0 for f in args.floors.split(",") if f.strip()))
    except ValueError:
        print(f"error: --floors {args.floors!r}: expected comma-separated numbers", file=sys.stderr)
        return 2
    rules = list(dict.fromkeys(r.strip() for r in args.rules.split(",") if r.strip()))
    if not floors or not rules:
        print(f"error: --{'floors' if not floors else 'rules'} is empty", file=sys.stderr)
        return 2
    if args.json:
        parent = Path(args.json).resolve().parent
        if not parent.is_dir():
            print(f"error: --json {args.json}: directory {parent} does not exist", file=sys.stderr)
            return 2
    ck = args.checkpoint
    variants: dict[str, tuple[str, float]] = {f"{r} {f:g}": (r, f) for r in rules for f in floors}
    try:
        base = make_rl_policy(f"rl-base:{ck}" if ck else "rl-base", cl, perf)
        for key, (r, f) in variants.items():
            RLPolicy(base.net, base.codec, hybrid=True, prior=base.prior, hybrid_floor=f, hybrid_rule=r)
    except PolicyError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    table = Table(title="rl-hybrid safety rule (rule floor: mean JCT h / util % / JCT vs rl-base; mean over job sets)")
    for c in ["group", "rl-base JCT h", "util %"] + list(variants):
        table.add_column(c)
    out: dict = {}
    for g in names:
        pols = {"rl-base": base}
        for key, (r, f) in variants.items():
            pols[key] = RLPolicy(
                base.net, base.codec, hybrid=True, prior=base.prior, hybrid_floor=f, hybrid_rule=r, name=f"rl-hybrid({key})"
            )
        try:
            res = evaluate_group(pols, groups[g], cl, perf)
        except (OSError, ValueError) as e:  # a trace that does not load (TraceError is a ValueError)
            print(f"error: group {g}: {e}", file=sys.stderr)
            return 2
        s = {k: v["summary"] for k, v in res.items()}
        out[g] = {k: {"avg_jct_h": v["avg_jct_s"]["mean"] / 3600, "util": v["avg_util"]["mean"]} for k, v in s.items()}
        b = out[g]["rl-base"]
        row = [g, f"{b['avg_jct_h']:.2f}", f"{100 * b['util']:.1f}"]
        for key in variants:
            h = out[g][key]
            row.append(f"{h['avg_jct_h']:.2f} / {100 * h['util']:.1f} / {100 * (h['avg_jct_h'] / b['avg_jct_h'] - 1):+.1f} %")
        table.add_row(*row)
    console = Console(width=max(Console().width, 150))
    console.print(table)
    summary = Table(title=f"over the {len(names)} groups: rl-hybrid against rl-base")
    for c in ["rule floor", "mean JCT change", "worst group", "mean util change (pp)", "util up / down (groups)"]:
        summary.add_column(c)
    for key in variants:
        rel = np.array([out[g][key]["avg_jct_h"] / out[g]["rl-base"]["avg_jct_h"] - 1 for g in names]) * 100
        du = np.array([out[g][key]["util"] - out[g]["rl-base"]["util"] for g in names]) * 100
        w = int(np.argmax(rel))
        summary.add_row(
            key, f"{rel.mean():+.2f} %", f"{rel[w]:+.1f} % ({names[w]})", f"{du.mean():+.2f}",
            f"{int((du > 1e-9).sum())} / {int((du < -1e-9).sum())}",
        )
    console.print(summary)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0 if np.isfinite([v["avg_jct_h"] for g in out.values() for v in g.values()]).all() else 1


if __name__ == "__main__":
    sys.exit(main())
