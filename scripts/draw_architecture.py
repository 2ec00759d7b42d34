"""Draw docs/figures/architecture.png (python scripts/draw_architecture.py).

One picture of the platform: the pure core model and policies (top), the one round loop over
the backend protocol (middle), and the two backends with what runs on each (bottom).
"""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

GREEN, BLUE, GREY, ORANGE, YELLOW = "#d6f5d6", "#cfe3ff", "#eeeeee", "#fde2c8", "#fff4c2"

#: name -> (x, y, width, height, text, colour)
BOXES = {
    # policies/: pure (no I/O, no torch)
    "core": (0.2, 7.0, 3.3, 1.5,
             "core model\ncluster.py  NodeSpec / ClusterSpec\nresources.py  ResourceDemand / Allocation\n"
             "job.py, state.py  ClusterState / Decision", GREEN),
    "perf": (3.8, 7.0, 3.0, 1.5,
             "performance model\nperf.py  PerformanceModel protocol\ngputypes.py  per-type speeds\n"
             "ledger.py  the one contention ledger", GREEN),
    "pol": (7.1, 7.0, 3.1, 1.5,
            "policies\nheuristics.py = order x placement\norders.py, placement.py\nrl.py = codec + numpy network",
            GREEN),
    "codec": (10.5, 7.0, 2.9, 1.5,
              "codecs/\nbase.py  Codec protocol\ndeepshare.py  obs / action\ncheckpoint.py  codec + spec",
              GREEN),
    "reg": (7.1, 5.4, 3.1, 0.9, "registry.py\nthe one policy factory", GREEN),
    # the loop
    "rounds": (2.2, 3.65, 4.0, 1.15,
               "rounds.py  run_round / RoundLoop\nsnapshot -> schedule -> validate -> apply", YELLOW),
    "validate": (2.2, 5.4, 4.0, 0.9, "validate.py  check_decision\n(one set of rules)", YELLOW),
    "backend": (7.1, 3.65, 3.1, 1.15, "backend.py  Backend protocol\nnow() snapshot() apply()\nnext_round()",
                YELLOW),
    # backends
    "sim": (0.2, 0.9, 3.6, 1.6,
            "SimBackend (trainer/sim_backend.py)\nover the event-driven Simulator\n"
            "simulate, evaluate, Gymnasium env,\ntwin", BLUE),
    "slurm": (7.1, 0.9, 3.6, 1.6,
              "SlurmBackend (controller/backend.py)\nbuild_state from squeue/sinfo;\n"
              "journal, scontrol update/release,\npreempt via node agents", BLUE),
    "twin": (4.15, 0.9, 2.6, 1.6, "rlsched twin:\nthe controller's rounds\nwith SimulatedSlurm +\nSimulatedAgents", GREY),
    "ctld": (11.1, 1.8, 2.3, 0.7, "slurmctld (stock)\njob_submit.lua holds", ORANGE),
    "agent": (11.1, 0.6, 2.3, 0.9, "node agents (gRPC)\nCS profile, preempt", ORANGE),
}
ARROWS = [
    ("core", "perf", ""), ("perf", "pol", ""), ("codec", "pol", ""), ("pol", "reg", ""),
    ("reg", "rounds", "policy"), ("validate", "rounds", ""), ("rounds", "backend", "calls"),
    ("backend", "sim", "implements"), ("backend", "slurm", "implements"),
    ("twin", "slurm", "Controller.round()"), ("twin", "sim", "round times"),
    ("slurm", "ctld", ""), ("slurm", "agent", ""),
]


def centre(b):
    x, y, w, h = BOXES[b][:4]
    return x + w / 2, y + h / 2


def edge(b, towards):
    """Point where the segment from box b's centre towards ``towards`` leaves the box."""
    x, y, w, h = BOXES[b][:4]
    cx, cy = centre(b)
    dx, dy = towards[0] - cx, towards[1] - cy
    if dx == 0 and dy == 0:
        return cx, cy
    sx = (w / 2) / abs(dx) if dx else float("inf")
    sy = (h / 2) / abs(dy) if dy else float("inf")
    s = min(sx, sy)
    return cx + dx * s, cy + dy * s


def main() -> None:
    fig, ax = plt.subplots(figsize=(14, 9))
    ax.set_xlim(-0.1, 13.6)
    ax.set_ylim(0.2, 9.2)
    ax.axis("off")
    ax.add_patch(FancyBboxPatch((0.05, 3.4), 13.5, 5.4, boxstyle="round,pad=0.02", fc="none", ec="#5a9a5a",
                                ls="--"))
    ax.text(0.15, 8.65, "policies/  (pure: frozen snapshot in, decision out; no I/O, no torch)", fontsize=10,
            color="#2f6f2f")
    for name, (x, y, w, h, text, colour) in BOXES.items():
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.05", fc=colour, ec="#555555"))
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=8.5)
    for a, b, label in ARROWS:
        pa = edge(a, centre(b))
        pb = edge(b, centre(a))
        ax.add_patch(FancyArrowPatch(pa, pb, arrowstyle="-|>", mutation_scale=12, color="#333333", lw=1.1))
        if label:
            ax.text((pa[0] + pb[0]) / 2, (pa[1] + pb[1]) / 2 + 0.12, label, ha="center", fontsize=7.5,
                    color="#333333", bbox=dict(fc="white", ec="none", alpha=0.8, pad=0.5))
    out = Path(__file__).resolve().parents[1] / "docs" / "figures" / "architecture.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
