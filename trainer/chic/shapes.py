"""How much better fixed per-model shapes do than Chic and Optimus on lone jobs (a study behind
docs/ELASTIC.md, "What is left", item 5).

For each of the Chic setting's models it keeps, of the validation sequences at ``--rate``, only that
model's jobs (at their arrival times, so nearly every job runs alone), and runs on them: Optimus (every
600 s), Optimus re-planning at every round, the shipped Chic network that serves the rate, and a policy
that gives every job the same ``w`` workers and ``p`` PSs, for every ``w`` in 1..4 and ``p`` in 1..16
(laid onto nodes and started as every elastic policy is: one worker first, its plan at the next round).
It prints each one's average JCT and the best fixed shapes.

    PYTHONPATH=. nice -n 10 python3 -m trainer.chic.shapes --rate 0.9 --seqs 8

``--force VGG-16=3:10`` instead runs the serving network on the validation sequences as it plans and
with that model's planned jobs forced to that shape where it fits (:class:`ForcedShape`).
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


class ForcedShape(ChicPolicy):
    """The network's plan (:meth:`ChicPolicy.decide`), then every planned job of a model in ``shapes`` set
    to ``shapes[model]`` = ``(w, p)`` where that fits beside the rest of the plan (the aggregate)."""

    def __init__(self, net, spec, perf, shapes: dict[str, tuple[int, int]], **kw) -> None:
        super().__init__(net, spec, perf, **kw)
        self.shapes = shapes

    def decide(self, slots: list[Slot | None], queue: int, cap: Sequence[float]) -> None:
        super().decide(slots, queue, cap)
        used = [0.0, 0.0, 0.0]
        for s in slots:
            if s is not None and s.job.w:
                used = [u + a for u, a in zip(used, s.job.use(s.job.w, s.job.p))]
        for s in slots:
            if s is None or not s.job.w or s.job.info.model not in self.shapes:
                continue
            j = s.job
            rest = [u - a for u, a in zip(used, j.use(j.w, j.p))]
            w, p = self.shapes[j.info.model]
            if fits_capacity(rest, j.use(w, p), cap):
                used = [u + a for u, a in zip(rest, j.use(w, p))]
                j.w, j.p = w, p


def forced(rate: float, seqs: int, shapes: dict[str, tuple[int, int]]) -> tuple[float, float]:
    """Average JCT (s) over ``seqs`` validation sequences at ``rate`` of the Chic network that serves the
    rate, as it plans and with the models of ``shapes`` forced to their shapes (:class:`ForcedShape`)."""
    from policies.chic import load_chic_checkpoint
    from trainer.chic.results import checkpoint_for

    cluster, perf = chic_setup()
    ck = load_chic_checkpoint(checkpoint_for("chic", rate))
    kw = dict(task_mask=ck.meta.get("task_mask", True), g=ck.meta.get("g", "fitted"))
    base = sequences(VAL_SEED0, seqs, rate)
    plain = float(np.mean([run_policy(ChicPolicy(ck.net, ck.spec, perf, **kw), cluster, perf, s) for s in base]))
    force = float(np.mean([run_policy(ForcedShape(ck.net, ck.spec, perf, shapes, **kw), cluster, perf, s)
                           for s in base]))
    return plain, force


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
    ap.add_argument("--force", default=None, metavar="MODEL=W:P[,...]",
                    help="instead: the serving network's validation ACT as it plans and with these models' jobs "
                         "forced to W workers and P PSs where they fit (e.g. VGG-16=3:10)")
    a = ap.parse_args(argv)
    if not (a.rate > 0 and a.seqs >= 1):
        print("trainer.chic.shapes: --rate must be > 0 and --seqs >= 1", file=sys.stderr)
        return 2
    if a.force is not None:
        shapes = {}
        for item in a.force.split(","):
            model, _, wp = item.partition("=")
            w, _, p = wp.partition(":")
            if not (model.strip() and w.strip().isdigit() and p.strip().isdigit() and int(w) >= 1 and int(p) >= 1):
                print(f"trainer.chic.shapes: --force: {item!r} is not MODEL=W:P with W, P >= 1", file=sys.stderr)
                return 2
            shapes[model.strip()] = (int(w), int(p))
        plain, force = forced(a.rate, a.seqs, shapes)
        print(f"validation ACT at {a.rate:g} jobs/h over {a.seqs} sequences: {plain:.1f} s as the network plans, "
              f"{force:.1f} s with {a.force}")
        return 0
    print("| model | lone jobs | Optimus | Optimus, every round | Chic | best fixed shapes (workers : PSs, ACT) |")
    print("|---|---|---|---|---|---|")
    for r in study(a.rate, a.seqs):
        best = ", ".join(f"{b['workers']} : {b['ps']} {b['act_s']:.0f} s" for b in r["best_fixed"])
        print(f"| {r['model']} | {r['jobs']} | {r['optimus']:.0f} s | {r['optimus_every_round']:.0f} s | "
              f"{r['chic']:.0f} s | {best} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
