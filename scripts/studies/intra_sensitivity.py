"""How much the headline comparisons move with the single-node (intra-node) factor.

Run: ``python scripts/studies/intra_sensitivity.py [--policies fifo,srtf,...] [--json FILE]``.

No single-node shape was measured by DeepShare, so a single-node job's speed comes from the
intra-node factor ``eta`` of the performance model (``docs/PERFORMANCE_MODEL.md``, "Single-node
speeds from AdaptDL"). This study runs each policy on two fixed job sets under each choice of
``ContentionModel(cluster, intra=...)``:

* ``bandwidth``: the cluster's inter / intra bandwidth ratio for every model (0.3125, the default);
* ``adaptdl``: each family's factor calibrated from AdaptDL's placement measurements;
* ``adaptdl-low`` / ``adaptdl-high``: the ends of the calibrated family's range;
* ``min`` / ``max``: every model at the smallest / largest calibrated factor over the six AdaptDL
  models (the range if the family mapping were wrong).

The job sets, both on 4x8 (the cluster of the shipped RL checkpoints): ``trace0`` (DeepShare's job
set 0, all jobs at t = 0) and ``poisson-4x8`` (256 jobs drawn by :func:`trainer.generate.generate_jobs`:
mix ``normal``, demands powers of two up to 32, 1 h each alone, Poisson arrivals at 90 % offered load,
seed 1). Their work (samples) is set once with the default model, so every setting runs the same
jobs. The simulator and the policies use the same model. Prints the
mean JCT (h) per policy and setting and each policy's mean JCT relative to SRTF's; ``--json``
writes the numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from policies.cluster import ClusterSpec  # noqa: E402
from policies.perf import ADAPTDL_ETA, ContentionModel  # noqa: E402
from trainer.cli_sim import build_policy  # noqa: E402
from trainer.generate import GeneratorConfig, generate_jobs  # noqa: E402
from trainer.simulator import SimConfig, Simulator  # noqa: E402
from trainer.traces import load_trace  # noqa: E402

#: (name, cluster, trace file or a generator configuration)
SETS = [
    ("trace0", "4x8", "data/traces/deepshare/simulate/trace0.json"),
    ("poisson-4x8", "4x8", GeneratorConfig(num_jobs=256, arrival="poisson", load=0.9, seed=1)),
]
POLICIES = ["fifo", "srtf", "srtf:spread", "greedy", "las", "rl-base", "rl-hybrid"]


def settings() -> list[tuple[str, object]]:
    cal = [v[0] for v in ADAPTDL_ETA.values()]
    return [("bandwidth", "bandwidth"), ("adaptdl", "adaptdl"), ("adaptdl-low", "adaptdl-low"),
            ("adaptdl-high", "adaptdl-high"), (f"min {min(cal):.3f}", min(cal)), (f"max {max(cal):.3f}", max(cal))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    out: dict = {}
    for set_name, cl_text, src in SETS:
        cluster = ClusterSpec.parse(cl_text)
        jobs = (load_trace(REPO / src, cluster=cluster) if isinstance(src, str)
                else generate_jobs(cluster, src, ContentionModel(cluster)))
        res: dict[str, dict[str, float]] = {}
        for label, intra in settings():
            perf = ContentionModel(cluster, intra=intra)
            for pol in policies:
                r = Simulator(cluster, jobs, build_policy(pol, cluster, perf), perf, SimConfig()).run()
                res.setdefault(pol, {})[label] = float(np.mean([j.jct for j in r.jobs]) / 3600.0)
        out[set_name] = res
        labels = [s for s, _ in settings()]
        print(f"\n{set_name} ({cl_text}, {len(jobs)} jobs): mean JCT (h); in brackets relative to srtf")
        print("| policy | " + " | ".join(labels) + " |")
        print("|---|" + "---|" * len(labels))
        for pol in policies:
            cells = []
            for lab in labels:
                v = res[pol][lab]
                ref = res.get("srtf", {}).get(lab)
                cells.append(f"{v:.2f}" + (f" ({v / ref:.2f})" if ref and pol != "srtf" else ""))
            print(f"| {pol} | " + " | ".join(cells) + " |")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
