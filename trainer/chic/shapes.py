"""How much better fixed per-model shapes do than Chic and Optimus on lone jobs (a study behind
docs/ELASTIC.md, "What is left", item 5).

For each of the Chic setting's models it keeps, of the validation sequences at ``--rate``, only that
model's jobs (at their arrival times, so nearly every job runs alone), and runs on them: Optimus (every
600 s), Optimus re-planning at every round, the shipped Chic network that serves the rate, and a policy
that gives every job the same ``w`` workers and ``p`` PSs, for every ``w`` in 1..4 and ``p`` in 1..16
(laid onto nodes and started as every elastic policy is: one worker first, its plan at the next round).
It prints each one's average JCT and the best fixed shapes.

    PYTHONPATH=. nice -n 10 python3 -m trainer.chic.shapes --rate 0.9 --seqs 8
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

import numpy as np

from policies.chic import ChicPolicy, Slot, make_chic_policy
from policies.elastic import OptimusPolicy, fits_capacity
from trainer.chic.train import VAL_SEED0, chic_setup, run_policy, sequences


class FixedShape(ChicPolicy):
    """Chic's slots and triggers with every slot job planned at ``shapes[model]`` = ``(w, p)`` while the
    aggregate capacity lasts (the network is not asked)."""

    def __init__(self, net, spec, perf, shapes: dict[str, tuple[int, int]]) -> None:
        super().__init__(net, spec, perf)
        self.shapes = shapes

    def decide(self, slots: list[Slot | None], queue: int, cap: Sequence[float]) -> None:
        used = [0.0, 0.0, 0.0]
        for s in slots:
            if s is None:
                continue
            j = s.job
            w, p = self.shapes[j.info.model]
            add = j.use(w, p)
            j.w, j.p = (w, p) if fits_capacity(used, add, cap) else (0, 0)
            if j.w:
                used = [u + a for u, a in zip(used, add)]


def study(rate: float, seqs: int, top: int = 3) -> list[dict]:
    """Per model: the average JCT of Optimus, Optimus every round, Chic and the ``top`` best fixed shapes."""
    from trainer.chic.results import checkpoint_for

    cluster, perf = chic_setup()
    chic = make_chic_policy(f"chic:{checkpoint_for('chic', rate)}", perf)
    base = sequences(VAL_SEED0, seqs, rate)
    out = []
    for model in ("ResNet-50", "VGG-16", "ResNeXt-110"):
        sub = [s for s in ([j for j in seq if j.model == model] for seq in base) if s]

        def act(make) -> float:
            return float(np.mean([run_policy(make(), cluster, perf, s) for s in sub]))

        row = {"model": model, "sequences": len(sub), "jobs": sum(len(s) for s in sub),
               "optimus": act(lambda: OptimusPolicy(perf)),
               "optimus_every_round": act(lambda: OptimusPolicy(perf, interval=0.0)),
               "chic": act(lambda: make_chic_policy(f"chic:{checkpoint_for('chic', rate)}", perf))}
        fixed = sorted((act(lambda w=w, p=p: FixedShape(chic.net, chic.spec, perf, {model: (w, p)})), w, p)
                       for w in range(1, 5) for p in range(1, 17))
        row["best_fixed"] = [{"workers": w, "ps": p, "act_s": a} for a, w, p in fixed[:top]]
        out.append(row)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m trainer.chic.shapes", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=0.9, help="arrival rate, jobs/h (default: %(default)s)")
    ap.add_argument("--seqs", type=int, default=8, help="validation sequences (default: %(default)s)")
    a = ap.parse_args(argv)
    if not (a.rate > 0 and a.seqs >= 1):
        print("trainer.chic.shapes: --rate must be > 0 and --seqs >= 1", file=sys.stderr)
        return 2
    print("| model | lone jobs | Optimus | Optimus, every round | Chic | best fixed shapes (workers : PSs, ACT) |")
    print("|---|---|---|---|---|---|")
    for r in study(a.rate, a.seqs):
        best = ", ".join(f"{b['workers']} : {b['ps']} {b['act_s']:.0f} s" for b in r["best_fixed"])
        print(f"| {r['model']} | {r['jobs']} | {r['optimus']:.0f} s | {r['optimus_every_round']:.0f} s | "
              f"{r['chic']:.0f} s | {best} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
