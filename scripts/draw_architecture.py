"""Draw docs/figures/architecture.png (python scripts/draw_architecture.py)."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

BOXES = {
    "sbatch": (0.3, 6.2, 2.2, 0.8, "users: sbatch --gpus=N\n--comment rlsched:model=M", "#eeeeee"),
    "lua": (3.4, 6.2, 2.6, 0.8, "job_submit.lua\n(hold, refuse user release)", "#fde2c8"),
    "ctld": (7.0, 6.2, 2.2, 0.8, "slurmctld\n(stock, unpatched)", "#fde2c8"),
    "ctrl": (6.8, 4.0, 2.8, 1.2, "rlsched controller\nSlurm adapter -> ClusterState\n-> policy -> scontrol", "#cfe3ff"),
    "pol": (3.0, 4.0, 2.6, 1.2, "policies/\ncluster + perf model\nencoder/decoder, RL, heuristics", "#d6f5d6"),
    "sim": (0.0, 1.8, 2.6, 1.2, "trainer/\nsimulator + Gymnasium env\nSB3 training, evaluation", "#d6f5d6"),
    "ckpt": (3.4, 1.8, 2.4, 1.2, "policy checkpoint\nsafetensors + JSON", "#eeeeee"),
    "agent": (6.8, 1.8, 2.8, 1.2, "node agents (gRPC, MUNGE)\nprofile CS, preempt", "#cfe3ff"),
    "job": (10.6, 1.8, 2.6, 1.2, "training job + job helper\nprogress, SIGUSR2 ->\ncheckpoint, resume", "#eeeeee"),
    "store": (10.6, 4.0, 2.6, 1.2, "checkpoint store\nshared FS / WebHDFS\n(atomic, checksummed)", "#eeeeee"),
}
ARROWS = [
    ("sbatch", "lua", ""), ("lua", "ctld", ""), ("ctrl", "ctld", "squeue/sinfo --json,\nscontrol update/release/requeue"),
    ("pol", "ctrl", "same encoder,\nsame policies"), ("pol", "sim", ""), ("sim", "ckpt", "train"), ("ckpt", "pol", "load"),
    ("ctrl", "agent", "JobStats, Preempt"), ("job", "agent", "ReportProgress"), ("job", "store", "save/resume"),
    ("agent", "store", "verify durable"),
]


def centre(b):
    x, y, w, h = BOXES[b][:4]
    return x + w / 2, y + h / 2


def edge(b, towards):
    """Point where the segment from box b's centre towards ``towards`` leaves the box."""
    x, y, w, h = BOXES[b][:4]
    cx, cy = centre(b)
    dx, dy = towards[0] - cx, towards[1] - cy
    pad = 0.12
    tx = (w / 2 + pad) / abs(dx) if dx else float("inf")
    ty = (h / 2 + pad) / abs(dy) if dy else float("inf")
    t = min(tx, ty)
    return cx + dx * t, cy + dy * t


def main() -> None:
    fig, ax = plt.subplots(figsize=(12, 7.6))
    for key, (x, y, w, h, text, colour) in BOXES.items():
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.05", fc=colour, ec="#333333"))
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=9)
    for a, b, label in ARROWS:
        p1 = edge(a, centre(b))
        p2 = edge(b, centre(a))
        ax.add_patch(FancyArrowPatch(p1, p2, arrowstyle="-|>", mutation_scale=14, color="#555555"))
        if label:
            horizontal = abs(p1[1] - p2[1]) < 0.2
            ax.text((p1[0] + p2[0]) / 2 + (0 if horizontal else 0.08), (p1[1] + p2[1]) / 2 + (0.12 if horizontal else 0.08),
                    label, ha="center" if horizontal else "left", va="bottom", fontsize=8, color="#1f4e9e")
    ax.set_xlim(-0.2, 13.4)
    ax.set_ylim(1.4, 7.3)
    ax.axis("off")
    ax.set_title("rlsched: one cluster model and one set of policies, two backends (simulator, Slurm)")
    out = Path(__file__).resolve().parents[1] / "docs" / "figures" / "architecture.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    print(out)


if __name__ == "__main__":
    main()
