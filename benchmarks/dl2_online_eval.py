"""DL2's online learning end to end, measured: the controller (the twin: its own rounds over the simulator)
runs ``dl2`` on one trace and records its experience; ``trainer.dl2.online.update_online`` (what
``rlsched train --online`` runs) updates the checkpoint from that journal; both checkpoints then run on
held-out traces, and the new one's average JCT is compared with the old one's (paired ratio, mean and
95 % t-interval over the traces).

    PYTHONPATH=. nice -n 10 python3 benchmarks/dl2_online_eval.py          # docs/ELASTIC.md, "Online learning"

Defaults: record on the DeepShare ``simulate/trace0`` (256 jobs, 4x8), evaluate on ``real/trace0`` and the
DeepShare training episodes ``train/jobset0`` (the same cluster and job mix, other sequences).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DS = ROOT / "data" / "traces" / "deepshare"


def _ci(x: np.ndarray) -> float:
    """95 % t-interval half-width of ``x`` (NaN for one value)."""
    from trainer.evaluate import mean_ci

    return mean_ci(list(x))[1]


def main() -> None:
    from policies.cluster import ClusterSpec
    from policies.dl2 import shipped_dl2
    from policies.perf import ContentionModel
    from policies.registry import make_policy
    from trainer.dl2.online import OnlineConfig, update_online
    from trainer.simulator import SimConfig, Simulator
    from trainer.traces import load_trace
    from trainer.twin import Twin

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", default=str(DS / "simulate" / "trace0.json"), help="trace the twin runs dl2 on")
    ap.add_argument("--eval", nargs="+", default=[str(DS / "real" / "trace0.json"),
                                                  *sorted(str(p) for p in (DS / "train" / "jobset0").glob("*.json"))],
                    help="held-out traces")
    ap.add_argument("--cluster", default="4x8")
    ap.add_argument("--updates", type=int, default=None, help="actor-critic updates (default: one per recorded slot)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    cl = ClusterSpec.parse(args.cluster)
    perf = ContentionModel(cl)
    t0 = time.process_time()
    with tempfile.TemporaryDirectory(prefix="dl2-online-") as tmp:
        Twin(cl, load_trace(args.record, cluster=cl), "dl2", Path(tmp) / "ctl", SimConfig(),
             log_file=Path(tmp) / "ctl.log").run()
        new, run = update_online(shipped_dl2(), Path(tmp) / "ctl" / "experience", Path(tmp) / "new" / "dl2",
                                 OnlineConfig(updates=args.updates, seed=args.seed), log=lambda s: None)
        print(f"recorded {run['records']} slots ({run['samples']} inferences) on {Path(args.record).name}; "
              f"{run['updates']} updates (actor loss {run['actor_loss']:.4f}, critic loss {run['critic_loss']:.4f})",
              flush=True)
        rows = []
        for tr in args.eval:
            jobs = load_trace(tr, cluster=cl)
            jct = {}
            for label, spec in (("shipped", "dl2"), ("online", f"dl2:{new}")):
                res = Simulator(cl, jobs, make_policy(spec, cl, perf), perf, SimConfig()).run()
                jct[label] = float(np.mean([r.jct for r in res.jobs]))
            rows.append((tr, jct))
            print(f"{Path(tr).parent.name}/{Path(tr).name}: shipped {jct['shipped']:.0f} s, online {jct['online']:.0f} s",
                  flush=True)
    ratio = np.array([j["online"] / j["shipped"] for _t, j in rows])
    print(f"\nonline / shipped average JCT over {len(rows)} held-out traces: {ratio.mean():.4f} +- {_ci(ratio):.4f} "
          f"(paired, 95 % t-interval); {time.process_time() - t0:.0f} s CPU")


if __name__ == "__main__":
    main()
