"""What allocations a policy plans in DL2's setting: per planned job and slot, the mean workers, PSs and
the speed of that shape relative to the model's fastest measured shape.

    PYTHONPATH=. nice -n 10 python3 -m trainer.dl2.shapes --seed 2000 --policies drf,optimus,dl2,sampled:dl2

One ``gen-elastic --setting dl2`` sequence of ``--jobs`` jobs (seed ``--seed``; 2000.. are the validation
sequences) on ``data/clusters/dl2.yaml`` with the PS performance model, as :mod:`trainer.dl2.train`
simulates it. Policies: ``drf``, ``tetris``, ``optimus``, ``dl2`` (the shipped checkpoint) or
``dl2:PATH``, and ``sampled:`` before a DL2 name for that network sampling its actions from its softmax
(as RL's episodes do, without job-aware exploration, seed ``--sample-seed``) instead of taking the most
likely one. A job-slot counts where the plan gives the job at least one worker; the relative speed is
``PSSpeedModel.measured_speed(w, max(p, 1))`` over the largest measured speed of that model over 1-16
workers and 1-23 PSs (:data:`policies.psmodel.MAX_PS`). Prints one line per policy: average JCT (s),
mean workers, PSs, relative speed, job-slots, inferences (DL2) and CPU seconds.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

__all__ = ["best_speeds", "plan_shapes", "main"]


def best_speeds() -> dict[str, float]:
    """Each PS model's largest measured speed over 1-16 workers and 1-:data:`~policies.psmodel.MAX_PS` PSs."""
    from policies.psmodel import MAX_PS, fit_ps_models

    return {k: max(m.measured_speed(w, p) for w in range(1, 17) for p in range(1, MAX_PS + 1))
            for k, m in fit_ps_models().items()}


def _recording(base):
    """``base`` (an elastic policy class) recording ``(w, p, speed / best)`` of every planned job."""
    from policies.psmodel import canonical_ps_model, fit_ps_models

    models, best = fit_ps_models(), best_speeds()

    class Recording(base):
        def plan(self, jobs, cap, state) -> None:
            super().plan(jobs, cap, state)
            for j in jobs:
                k = canonical_ps_model(j.info.model)
                if j.w >= 1 and k in models:
                    self.shapes.append((j.w, j.p, models[k].measured_speed(j.w, max(j.p, 1)) / best[k]))

    return Recording


def plan_shapes(name: str, seed: int, jobs: int = 200, sample_seed: int = 0) -> dict:
    """Run policy ``name`` (module docstring) on sequence ``seed``; its JCT and mean planned shape."""
    from policies.dl2 import DL2Policy, load_dl2, shipped_dl2
    from policies.elastic import DRFPolicy, OptimusPolicy, TetrisPolicy
    from trainer.dl2.train import DL2TrainConfig, RecordingDL2, _jobs, _setup, run_episode

    cluster, perf = _setup(DL2TrainConfig(jobs=jobs))
    sampled = name.startswith("sampled:")
    base_name = name[len("sampled:"):] if sampled else name
    heur = {"drf": DRFPolicy, "tetris": TetrisPolicy, "optimus": OptimusPolicy}
    if base_name in heur and not sampled:
        pol = _recording(heur[base_name])(perf)
    elif base_name == "dl2" or base_name.startswith("dl2:"):
        net, _meta, _p = load_dl2(shipped_dl2() if base_name == "dl2" else base_name[4:])
        if sampled:
            pol = _recording(RecordingDL2)(net, perf, "explore", np.random.default_rng(sample_seed), 0.0)
        else:
            pol = _recording(DL2Policy)(net, perf)
    else:
        raise ValueError(f"policy {name!r}: expected drf, tetris, optimus, dl2, dl2:PATH or sampled:<dl2 name>")
    pol.shapes = []
    c0 = time.process_time()
    jct = run_episode(cluster, perf, _jobs(seed, jobs), pol)
    s = np.array(pol.shapes, float).reshape(-1, 3)
    return {"policy": name, "seed": seed, "jct": jct, "workers": float(s[:, 0].mean()), "ps": float(s[:, 1].mean()),
            "rel_speed": float(s[:, 2].mean()), "job_slots": len(s), "inferences": getattr(pol, "inferences", None),
            "cpu_s": time.process_time() - c0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=2000)
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--policies", default="drf,optimus,dl2,sampled:dl2")
    ap.add_argument("--sample-seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.jobs < 1:
        print(f"trainer.dl2.shapes: --jobs must be >= 1, got {args.jobs}", file=sys.stderr)
        return 2
    for name in args.policies.split(","):
        try:
            r = plan_shapes(name.strip(), args.seed, args.jobs, args.sample_seed)
        except (ValueError, OSError) as exc:
            print(f"trainer.dl2.shapes: {exc}", file=sys.stderr)
            return 2
        inf = f", {r['inferences']:,} inferences" if r["inferences"] is not None else ""
        print(f"{r['policy']}: seed {r['seed']}, average JCT {r['jct']:,.0f} s; per planned job-slot: "
              f"{r['workers']:.2f} workers, {r['ps']:.2f} PSs, speed {r['rel_speed']:.3f} of the model's best shape "
              f"({r['job_slots']:,} job-slots{inf}, {r['cpu_s']:.0f} s CPU)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
