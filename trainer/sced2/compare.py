"""Two SCED2 checkpoints on the validation sequences: which one to ship.

    python3 -m trainer.sced2.compare OLD NEW [--sequences 10] [--skip 3] [--cluster 15x8] [--jobs 1000]

Runs both checkpoints (``NAME`` of ``NAME.json`` + ``NAME.safetensors``) greedily in the simulator
(:class:`~trainer.simulator.SimConfig` defaults, as ``rlsched simulate``) on ``--sequences`` validation
sequences (:data:`~trainer.sced2.sequences.VAL_SEEDS`, load 1.0, 68 % 1-GPU; never the test seeds) after
the first ``--skip`` (default 3: the ones ``rlsched train-sced2`` selects its weights on) and prints, per sequence and in the mean, the average JCT (h) of each and the paired ratio
``OLD / NEW`` (above 1: NEW is better) with its 95 % Student-t interval. Exit status 0; a checkpoint
that does not load gives one line on stderr and status 2.
"""

from __future__ import annotations

import argparse
import math
import sys

import numpy as np

from policies.cluster import ClusterSpec, ClusterSpecError
from policies.perf import ContentionModel
from trainer.sced2.sequences import VAL_SEEDS, philly_pool, sample_sequence
from trainer.sced2.train import avg_jct

__all__ = ["compare", "main", "t_interval"]


def compare(old: str, new: str, cluster: ClusterSpec, sequences: int = 10, jobs: int = 1000, skip: int = 3
            ) -> list[tuple[int, float, float]]:
    """``[(validation seed, old average JCT s, new average JCT s)]`` over ``sequences`` validation seeds
    after the first ``skip``."""
    from policies.registry import make_policy

    perf = ContentionModel(cluster)
    pool = philly_pool(cluster)
    pols = [make_policy(f"sced2:{p}", cluster, perf) for p in (old, new)]
    out = []
    for s in VAL_SEEDS[skip: skip + sequences]:
        seq = sample_sequence(pool, cluster, jobs, s, perf=perf)
        out.append((s, avg_jct(pols[0], cluster, seq, perf), avg_jct(pols[1], cluster, seq, perf)))
    return out


def t_interval(x: np.ndarray) -> str:
    """``"mean [lo, hi]"`` of ``x`` (3 decimals) with its 95 % Student-t interval; the mean alone for one value."""
    from scipy.stats import t

    m = float(np.mean(x))
    if len(x) < 2:
        return f"{m:.3f}"
    h = float(t.ppf(0.975, len(x) - 1)) * float(np.std(x, ddof=1)) / math.sqrt(len(x))
    return f"{m:.3f} [{m - h:.3f}, {m + h:.3f}]"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--sequences", type=int, default=10)
    ap.add_argument("--skip", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--cluster", default="15x8")
    a = ap.parse_args(argv)
    if a.skip < 0 or not 1 <= a.sequences <= len(VAL_SEEDS) - a.skip or a.jobs < 1:
        print(f"sced2 compare: need --skip >= 0, 1 <= --sequences <= {len(VAL_SEEDS)} - --skip, --jobs >= 1",
              file=sys.stderr)
        return 2
    try:
        cluster = ClusterSpec.parse(a.cluster)
        rows = compare(a.old, a.new, cluster, a.sequences, a.jobs, a.skip)
    except (ClusterSpecError, ValueError, OSError) as exc:
        print(f"sced2 compare: {exc}", file=sys.stderr)
        return 2
    print("| validation seed | old avg JCT (h) | new avg JCT (h) | old / new |")
    print("|---|---|---|---|")
    for s, o, n in rows:
        print(f"| {s} | {o / 3600:.2f} | {n / 3600:.2f} | {o / n:.3f} |")
    o = np.asarray([r[1] for r in rows])
    n = np.asarray([r[2] for r in rows])
    print(f"| mean | {o.mean() / 3600:.2f} | {n.mean() / 3600:.2f} | {t_interval(o / n)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
