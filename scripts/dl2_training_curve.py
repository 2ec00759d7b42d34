#!/usr/bin/env python3
"""Training curve of a DL2 checkpoint, drawn from the history its JSON header records.

    python3 scripts/dl2_training_curve.py [--checkpoint policies/checkpoints/dl2/dl2.json] \\
        [--out docs/figures/dl2_training.png]

Left: the supervised warm-up's cross-entropy per epoch (imitating its teacher, DRF or Optimus, as its
training config names it). Right: average JCT (s) at the
end of each RL episode (x: actor-critic updates so far, the seed's "steps", where the history records
them; else the episode) on the training sequence (while exploring) and on the validation sequences,
with the teacher's average JCT on the training sequences and the warm-up network's validation JCT as reference
lines. A checkpoint trained from a parent (``train-dl2 --init``) is drawn as one curve: the parent's
warm-up and RL episodes up to the network it was continued from, a marker, then its own episodes.
Reads the JSON only
(``training.history`` as ``rlsched train-dl2`` writes it); the weights are not opened.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

DEFAULT_CKPT = Path(__file__).resolve().parent.parent / "policies" / "checkpoints" / "dl2" / "dl2.json"


def _numbers(xs: object, what: str) -> list[float]:
    if not isinstance(xs, list) or not all(isinstance(x, (int, float)) and math.isfinite(x) for x in xs):
        raise ValueError(f"{what} is not a list of finite numbers")
    return [float(x) for x in xs]


def read_history(path: Path) -> dict:
    """``training.history`` of a DL2 checkpoint header, checked; ValueError (one line) when absent or malformed."""
    if path.stat().st_size > 16 * 2**20:
        raise ValueError("larger than 16 MiB: not a checkpoint header")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not JSON ({exc})") from None
    hist = (doc.get("training") or {}).get("history") if isinstance(doc, dict) else None
    if not isinstance(hist, dict):
        raise ValueError("no training.history (not a checkpoint written by rlsched train-dl2)")
    chain = _chain(hist, "training.history", (doc.get("training") or {}).get("config"))
    rl = chain.pop("rl")
    ups = [r.get("updates") for r in rl]
    steps = None  # actor-critic updates done by the end of each episode, where the history records them
    if rl and all(isinstance(u, int) and not isinstance(u, bool) and u >= 0 for u in ups):
        steps = [float(sum(ups[: k + 1])) for k in range(len(ups))]
    return {
        **chain,
        "steps": steps,
        "episode": [float(k) for k in range(len(rl))],
        "train_jct": _numbers([r.get("train_jct") for r in rl], "training.history.rl[].train_jct"),
        "val_jct": _numbers([r.get("val_jct") for r in rl], "training.history.rl[].val_jct"),
    }


def _teacher(config: object) -> str:
    """The warm-up teacher a training config names, as a label (``DRF`` when it names none)."""
    return "Optimus" if isinstance(config, dict) and config.get("teacher") == "optimus" else "DRF"


def _chain(hist: dict, what: str, config: object = None) -> dict:
    """The warm-up and RL episodes behind ``hist``. A run started from a parent checkpoint (``parent``,
    ``train-dl2 --init``) continues the parent's curve from the parent's selected network: the parent's
    warm-up and its RL episodes up to the selected one, then this run's (``continued_after``: how many
    episodes came before this run's; None without a parent)."""
    rl = hist.get("rl")
    if not isinstance(rl, list) or not all(isinstance(r, dict) for r in rl):
        raise ValueError(f"{what}.rl is not a list of episodes")
    out = {"sl_loss": _numbers(hist.get("sl_loss", []), what + ".sl_loss"),
           "drf_train_jct": _numbers(hist.get("drf_train_jct", []), what + ".drf_train_jct"),
           "val_warmup_jct": hist.get("val_warmup_jct"), "continued_after": None, "rl": list(rl),
           "teacher": _teacher(config)}
    parent = hist.get("parent")
    if isinstance(parent, dict) and isinstance(parent.get("history"), dict):
        base = _chain(parent["history"], what + ".parent.history", parent.get("config"))
        sel = str(parent.get("selected") or "").rsplit(" ", 1)
        own = len(parent["history"]["rl"])  # the parent's own episodes end its chain
        keep = int(sel[1]) + 1 if sel[0] == "RL episode" and sel[1].isdigit() else 0
        prl = base["rl"][: len(base["rl"]) - own + min(keep, own)]
        out.update(sl_loss=base["sl_loss"], drf_train_jct=base["drf_train_jct"], val_warmup_jct=base["val_warmup_jct"],
                   continued_after=len(prl), rl=[*prl, *rl], teacher=base["teacher"])
    return out


def draw(hist: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    a.plot(range(1, len(hist["sl_loss"]) + 1), hist["sl_loss"], marker="o")
    teacher = hist.get("teacher", "DRF")
    a.set(xlabel="warm-up epoch", ylabel=f"cross-entropy (imitating {teacher})", title="supervised warm-up")
    steps = hist.get("steps")
    x = steps if steps else hist["episode"]
    b.plot(x, hist["train_jct"], marker="o", label="training sequence (exploring)")
    b.plot(x, hist["val_jct"], marker="s", label="validation sequences (greedy)")
    if hist["drf_train_jct"]:
        b.axhline(sum(hist["drf_train_jct"]) / len(hist["drf_train_jct"]), color="grey", ls="--",
                  label=f"{teacher}, training sequences (mean)")
    v = hist["val_warmup_jct"]
    if isinstance(v, (int, float)) and math.isfinite(v):
        b.axhline(float(v), color="black", ls=":", label="warm-up network, validation")
    k = hist.get("continued_after")
    if k:
        b.axvline(x[k - 1], color="tab:red", ls="-.", lw=1, label="continued from here (train-dl2 --init)")
    b.set(xlabel="actor-critic updates (one per slot), at each RL episode's end" if steps else "RL episode",
          ylabel="average JCT (s)", title="actor-critic RL")
    for ax in (a, b):
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    b.legend(fontsize=8)
    save_png(fig, out)


def save_png(fig, out: Path) -> None:
    """Lay out ``fig``, write it to ``out`` as PNG (110 dpi) atomically (directories made), close it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", type=Path, default=DEFAULT_CKPT, help="a DL2 checkpoint's JSON header")
    p.add_argument("--out", type=Path, default=Path("docs/figures/dl2_training.png"))
    args = p.parse_args(argv)
    try:
        hist = read_history(args.checkpoint)
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        print(f"dl2_training_curve: {ascii(str(args.checkpoint))}: {why}", file=sys.stderr)
        return 2
    draw(hist, args.out)
    print(f"wrote {args.out}: {len(hist['sl_loss'])} warm-up epochs, {len(hist['episode'])} RL episodes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
