"""Round latency of the shipped 4x8 network in the "fill" and the "plan" candidate order.

Run: ``taskset -c 1 python benchmarks/bench_plan_order.py [--passes 2]``. Not a timed test.

The same network and admission prior, two codecs that differ only in
:attr:`policies.codecs.deepshare.ObsSpec.order`, timed back to back on each of the
same 200 states as ``bench_rl.py --only 4x8`` (caches warmed on other
states, garbage collection off while timing). The difference is the cost of
planning the waves (:mod:`policies.waves`) at each round's first decision.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import gc
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_rl import _states

from policies.cluster import ClusterSpec
from policies.codecs.deepshare import DeepShareCodec
from policies.perf import ContentionModel
from policies.rl import RLPolicy, make_rl_policy


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--passes", type=int, default=2, help="timing passes over the states (default 2)")
    args = ap.parse_args(argv)
    cluster = ClusterSpec.parse("4x8")
    perf = ContentionModel(cluster)
    ship = make_rl_policy("rl-base", cluster, perf)
    states = _states(cluster, perf, 256, 200)
    warm = _states(cluster, perf, 256, 200, seed=8)
    pols = {
        o: RLPolicy(
            copy.deepcopy(ship.net),
            DeepShareCodec(cluster, perf, dataclasses.replace(ship.codec.spec, order=o)),
            prior=ship.prior,
        )
        for o in ("fill", "plan")
    }
    for pol in pols.values():
        for st in warm:
            pol.schedule(st)
    for n in range(args.passes):
        ts: dict[str, list[float]] = {o: [] for o in pols}
        gc.disable()
        try:
            for st in states:
                for o, pol in pols.items():
                    t0 = time.perf_counter()
                    pol.schedule(st)
                    ts[o].append(time.perf_counter() - t0)
        finally:
            gc.enable()
        print(
            f"pass {n + 1}: "
            + "  ".join(
                f"{o}: round p50 {np.percentile(v, 50) * 1e3:.3f} p99 {np.percentile(v, 99) * 1e3:.3f} max {max(v) * 1e3:.3f} ms"
                for o, v in ts.items()
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
