"""The size-free policy's validation groups: per-group average JCT of policies on validation sets only.

:data:`SUITE` is the training configuration whose validation sets (:func:`trainer.sizefree.train.training_sets`,
generator seeds from 12000, disjoint from training and from ``benchmarks/bench_sizefree.py``'s held-out
seeds 950..957) form the groups: clusters ``4x8`` and ``16x8`` with demands 1..32 (the validation sets of
the shipped run, ``rlsched train-sizefree``'s defaults, which its ``training.val_avg_jct_h`` averages), and
``16x8:64`` (16x8 with demands 1..64, where jobs span up to 8 nodes); per cluster zero arrivals and
Poisson arrivals at 85 % and 90 % load, 2 sets of 48 jobs each, so 9 groups of 2 sets.

For each policy (a registry name, e.g. ``greedy``, ``lgtf``, ``planner:work=6000``, ``rl-sf``, or
``rl-sf:/path/to/checkpoint.json``) it runs every set in the simulator and reports per group the mean
average JCT (h) and, against the best heuristic of :data:`HEURISTICS` on that group (lowest mean), the
mean per-set ratio; ``overall`` is the mean average JCT over the 12 sets of the shipped run's
validation (``4x8`` and ``16x8`` entries: the criterion ``train-sizefree`` records) and ``all`` the mean
over all 18 sets.

    python3 -m trainer.sizefree.validation --policy rl-sf,rl-sf:OUT.json [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from trainer.sizefree.train import SizeFreeTrainConfig, split_cluster, training_sets

__all__ = ["HEURISTICS", "SUITE", "groups", "main", "run_policy"]

#: The configuration whose validation sets are the groups (module docstring).
SUITE = SizeFreeTrainConfig(clusters=("4x8", "16x8", "16x8:64"))
#: The heuristics the best per group is taken from (those of ``benchmarks/bench_sizefree.py``).
HEURISTICS = ("srtf:nosplit", "greedy", "lgtf", "lgtf:nosplit")
#: Arrival kinds of a cluster entry's validation sets, in their order (``train._sets``).
KINDS = ("zero", "poisson-85", "poisson-90")


def groups(cfg: SizeFreeTrainConfig = SUITE) -> dict[str, tuple[str, list]]:
    """``{group name: (cluster entry, sets)}``: each entry's validation sets split by arrival kind."""
    out = {}
    for c, (_tr, val) in training_sets(cfg).items():
        per = len(val) // len(KINDS)
        for k, kind in enumerate(KINDS):
            out[f"{c}-{kind}"] = (c, val[k * per: (k + 1) * per])
    return out


def run_policy(name: str, entry: str, sets: list) -> list[float]:
    """Average JCT (h) of policy ``name`` on each of ``sets`` on the cluster of ``entry``."""
    from policies.cluster import ClusterSpec
    from policies.perf import ContentionModel
    from policies.registry import make_policy
    from trainer.metrics import summarize
    from trainer.simulator import SimConfig, Simulator

    cl = ClusterSpec.parse(split_cluster(entry)[0])
    perf = ContentionModel(cl)
    return [summarize(Simulator(cl, jobs, make_policy(name, cl, perf), perf, SimConfig()).run())["avg_jct_s"] / 3600
            for jobs in sets]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m trainer.sizefree.validation", description=__doc__.split("\n")[0])
    p.add_argument("--policy", required=True, help="policies, comma-separated (registry names, rl-sf:PATH)")
    p.add_argument("--no-heuristics", action="store_true", help="skip the best-heuristic reference")
    p.add_argument("--json", default=None, help="also write the per-set numbers to this JSON file")
    args = p.parse_args(argv)
    names = [n.strip() for n in args.policy.split(",") if n.strip()]
    if not names:
        print("trainer.sizefree.validation: error: --policy is empty", file=sys.stderr)
        return 2
    gs = groups()
    todo = list(dict.fromkeys(([] if args.no_heuristics else list(HEURISTICS)) + names))
    res: dict[str, dict[str, list[float]]] = {}
    cpu: dict[str, float] = {}
    for n in todo:
        t0 = time.process_time()
        try:
            res[n] = {g: run_policy(n, c, sets) for g, (c, sets) in gs.items()}
        except Exception as exc:  # noqa: BLE001 - one line naming the policy
            print(f"trainer.sizefree.validation: error: --policy {n}: {exc}", file=sys.stderr)
            return 2
        cpu[n] = time.process_time() - t0
    shipped = [g for g, (c, _s) in gs.items() if c in ("4x8", "16x8")]
    head = "| policy | " + " | ".join(gs) + " | overall (12 sets) | all (18 sets) |"
    print(head)
    print("|---" * (len(gs) + 3) + "|")
    best = {}
    if not args.no_heuristics:
        best = {g: min(HEURISTICS, key=lambda h: float(np.mean(res[h][g]))) for g in gs}
    for n in todo:
        cells = []
        for g in gs:
            m = float(np.mean(res[n][g]))
            if best:
                r = float(np.mean(np.asarray(res[n][g]) / np.asarray(res[best[g]][g])))
                cells.append(f"{m:.3f} ({r:.3f})")
            else:
                cells.append(f"{m:.3f}")
        ov = float(np.mean([x for g in shipped for x in res[n][g]]))
        al = float(np.mean([x for g in gs for x in res[n][g]]))
        print(f"| {n} | " + " | ".join(cells) + f" | {ov:.3f} | {al:.3f} |", flush=True)
    if best:
        print("best heuristic per group: " + ", ".join(f"{g}: {h}" for g, h in best.items()))
    print("CPU s per policy: " + ", ".join(f"{n} {cpu[n]:.0f}" for n in todo))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"per_set_avg_jct_h": res, "best": best, "cpu_s": cpu}, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
