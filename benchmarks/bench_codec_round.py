"""CPU time of a DeepShare codec round's start: ``codec.begin(state)`` and its first ``encode(dense=False)``.

Run: ``nice -n 10 python3 benchmarks/bench_codec_round.py --cluster 4x8 --jobs 256`` (and
``--cluster 128x8 --jobs 2048``). Not a timed test.

States are captured as ``bench_rl.py`` captures them (``--states`` of them, evenly over greedy
simulations, each with a contention ledger of its running jobs as the backends hand theirs in); the
codec's memos are warmed on the same states first. Each state is timed ``--passes`` times with the
process's CPU time (``time.process_time``) and the minimum kept, so other load on a shared machine
mostly drops out; printed: the sums over the states, in ms, of ``begin``, ``begin`` + first
``encode`` and the first ``encode`` alone.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_rl  # noqa: E402

from policies.cluster import ClusterSpec  # noqa: E402
from policies.codecs.deepshare import DeepShareCodec  # noqa: E402
from policies.perf import ContentionModel  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cluster", default="4x8", help="cluster spec (default 4x8)")
    ap.add_argument("--jobs", type=int, default=256, help="jobs of each captured simulation (default 256)")
    ap.add_argument("--states", type=int, default=60, help="states measured (default 60)")
    ap.add_argument("--passes", type=int, default=30, help="timings per state, the minimum kept (default 30)")
    args = ap.parse_args()
    cluster = ClusterSpec.parse(args.cluster)
    perf = ContentionModel(cluster)
    states = bench_rl._states(cluster, perf, args.jobs, args.states)
    codec = DeepShareCodec(cluster, perf)
    for st in states:
        codec.begin(st).encode(dense=False)

    def timed(fn) -> float:
        best = [float("inf")] * len(states)
        for _ in range(args.passes):
            for i, st in enumerate(states):
                t0 = time.process_time()
                fn(st)
                best[i] = min(best[i], time.process_time() - t0)
        return sum(best) * 1e3

    begin = timed(codec.begin)
    both = timed(lambda st: codec.begin(st).encode(dense=False))
    enc = [float("inf")] * len(states)
    for _ in range(args.passes):
        rounds = [codec.begin(st) for st in states]
        for i, r in enumerate(rounds):
            t0 = time.process_time()
            r.encode(dense=False)
            enc[i] = min(enc[i], time.process_time() - t0)
    print(f"{args.cluster}, {len(states)} states, ms summed over them (min of {args.passes} CPU-time passes): "
          f"begin {begin:.3f}, begin+encode {both:.3f}, encode alone {sum(enc) * 1e3:.3f}")


if __name__ == "__main__":
    main()
