"""rl-hybrid's safety-rule efficiency floor: utilisation and JCT against rl-base.

Run: ``python benchmarks/hybrid_floor.py --traces /tmp/rl/traces/eval [--floors 0,0.5,0.6,0.7,0.8]
[--groups uniform,jitter,...] [--checkpoint PATH]``. The trace groups are the
evaluation groups of docs/RESULTS.md (one sub-directory per group).

For every group and floor it runs ``rl-base`` and ``rl-hybrid`` (same
network, shipped checkpoint by default; the floor only changes the hybrid's
safety rule, :data:`policies.rl.HYBRID_FLOOR`) through the simulator on every
job set and prints mean average JCT (h), utilisation (%) and the hybrid's
JCT relative to rl-base. Results are written as JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from policies.cluster import ClusterSpec
from policies.perf import ContentionModel
from policies.rl import RLPolicy, make_rl_policy
from trainer.evaluate import _groups, evaluate_group


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--traces", required=True, help="directory with one sub-directory of job sets per group")
    ap.add_argument("--groups", default=None, help="comma-separated groups (default: all)")
    ap.add_argument("--floors", default="0,0.5,0.6,0.7,0.8", help="comma-separated floors in [0, 1]")
    ap.add_argument("--checkpoint", default=None, help="policy checkpoint (default: the shipped 4x8 one)")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    cl = ClusterSpec.parse("4x8")
    perf = ContentionModel(cl)
    groups = _groups(Path(args.traces))
    names = args.groups.split(",") if args.groups else list(groups)
    missing = [g for g in names if g not in groups]
    if missing:
        print(f"error: {args.traces}: no trace group(s) {', '.join(missing)}", file=sys.stderr)
        return 2
    floors = [float(f) for f in args.floors.split(",")]
    ck = args.checkpoint
    base = make_rl_policy(f"rl-base:{ck}" if ck else "rl-base", cl, perf)
    table = Table(title="rl-hybrid efficiency floor (mean over job sets)")
    for c in ["group", "rl-base JCT h", "util %"] + [f"floor {f:g}: JCT h / util % / vs base" for f in floors]:
        table.add_column(c)
    out: dict = {}
    for g in names:
        pols = {"rl-base": base}
        for f in floors:
            pols[f"floor={f:g}"] = RLPolicy(
                base.net, base.encoder, hybrid=True, prior=base.prior, hybrid_floor=f, name=f"rl-hybrid(floor={f:g})"
            )
        r = evaluate_group(pols, groups[g], cl, perf)
        s = {k: v["summary"] for k, v in r.items()}
        out[g] = {k: {"avg_jct_h": v["avg_jct_s"]["mean"] / 3600, "util": v["avg_util"]["mean"]} for k, v in s.items()}
        b = out[g]["rl-base"]
        row = [g, f"{b['avg_jct_h']:.2f}", f"{100 * b['util']:.1f}"]
        for f in floors:
            h = out[g][f"floor={f:g}"]
            row.append(f"{h['avg_jct_h']:.2f} / {100 * h['util']:.1f} / {100 * (h['avg_jct_h'] / b['avg_jct_h'] - 1):+.1f} %")
        table.add_row(*row)
    Console(width=max(Console().width, 150)).print(table)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0 if np.isfinite([v["avg_jct_h"] for g in out.values() for v in g.values()]).all() else 1


if __name__ == "__main__":
    sys.exit(main())
