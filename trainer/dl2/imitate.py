"""How well each DL2 actor architecture imitates a teacher: masked cross-entropy and accuracy (the share of
states where the actor's most likely feasible action is the teacher's) on held-out teacher samples.

    PYTHONPATH=. nice -n 10 python3 -m trainer.dl2.imitate --teacher drf --archs flat,rows --out DIR \
        [--remaining linear|log1p] [--counts linear|log1p]

Teacher episodes (:func:`trainer.dl2.train.collect_drf`, DRF or Optimus in DL2's action space) on the
training sequences ``--seed0 ..`` (``--traces`` of them, ``--jobs`` jobs each) give the training samples
(at most ``--samples``), and one episode on validation sequence ``--val-seed`` (2000..) the held-out ones
(at most ``--samples`` / 4). ``--remaining`` and ``--counts`` pick the transforms of the state's
remaining-epochs and workers / PSs features (:data:`policies.dl2.REMAINING`, :data:`policies.dl2.COUNTS`,
at the scales :func:`trainer.dl2.train.train_spec` gives them). Samples are recorded once in the ``rows``
layout (its state holds the :data:`policies.dl2.GLOBALS` after the job rows) and cached in ``DIR/samples-*.npz``; the ``flat`` actor
reads the same states without the globals. Each architecture is fitted by
:func:`trainer.dl2.train.supervised` (Adam, ``--lr``, mini-batches of 256, ``--epochs``) and its
cross-entropy / accuracy measured on both sets after each epoch; one JSON line per epoch and a summary
line per architecture are printed and written to ``DIR/imitate-TEACHER.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from policies.dl2 import COUNTS, REMAINING

__all__ = ["teacher_samples", "measure", "main"]


def teacher_samples(teacher: str, seed0: int, traces: int, jobs: int, samples: int, J: int = 40,
                    cache: Path | None = None, remaining: str = "linear",
                    counts: str = "linear") -> tuple[np.ndarray, np.ndarray, np.ndarray, list[float]]:
    """(obs in the ``rows`` layout, masks, actions, each episode's JCT) of ``teacher`` episodes on sequences
    ``seed0 .. seed0 + traces - 1`` (``jobs`` jobs), at most ``samples`` kept uniformly, the state's
    remaining-epochs and workers / PSs features transformed by ``remaining`` / ``counts``; read from /
    written to ``cache`` (npz) when given."""
    if cache is not None and cache.exists():
        with np.load(cache) as z:
            return z["obs"], z["mask"], z["act"], list(z["jct"])
    from trainer.dl2.train import DL2TrainConfig, _net, collect_drf, make_actor, train_spec

    cfg = DL2TrainConfig(J=J, arch="rows", jobs=jobs, sl_traces=traces, sl_samples=samples, seed0=seed0,
                         teacher=teacher, remaining=remaining, counts=counts)
    spec = train_spec(cfg)
    obs, mask, act, jct = collect_drf(cfg, spec, _net(make_actor(spec, (8,)), spec))
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(cache, obs=obs, mask=mask, act=act, jct=np.asarray(jct))
    return obs, mask, act, jct


def measure(actor, obs: np.ndarray, mask: np.ndarray, act: np.ndarray) -> tuple[float, float]:
    """(masked cross-entropy, accuracy) of torch ``actor`` on the samples."""
    import torch
    import torch.nn.functional as F

    from trainer.dl2.train import _masked_logits

    with torch.no_grad():
        ce, hit = 0.0, 0
        for s in range(0, len(act), 4096):
            o, m = torch.as_tensor(obs[s : s + 4096]), torch.as_tensor(mask[s : s + 4096])
            a = torch.as_tensor(act[s : s + 4096], dtype=torch.long)
            z = _masked_logits(actor, o, m)
            ce += F.cross_entropy(z, a, reduction="sum").item()
            hit += int((z.argmax(-1) == a).sum())
    return ce / len(act), hit / len(act)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--teacher", default="drf", choices=("drf", "optimus"))
    ap.add_argument("--archs", default="flat,rows")
    ap.add_argument("--remaining", default="linear", choices=REMAINING)
    ap.add_argument("--counts", default="linear", choices=COUNTS)
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--traces", type=int, default=1)
    ap.add_argument("--seed0", type=int, default=1000)
    ap.add_argument("--val-seed", type=int, default=2000)
    ap.add_argument("--samples", type=int, default=40000)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--lr", type=float, default=0.005)
    ap.add_argument("--flat-hidden", default="256,256")
    ap.add_argument("--rows-hidden", default="64,64")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    import torch

    from trainer.dl2.train import DL2TrainConfig, make_actor, supervised, train_spec

    out = Path(args.out)
    c0 = time.process_time()
    tag = (f"{args.teacher}-{args.jobs}j" + ("" if args.remaining == "linear" else f"-{args.remaining}")
           + ("" if args.counts == "linear" else f"-counts-{args.counts}"))
    tr = teacher_samples(args.teacher, args.seed0, args.traces, args.jobs, args.samples,
                         cache=out / f"samples-{tag}-{args.seed0}x{args.traces}-{args.samples}.npz",
                         remaining=args.remaining, counts=args.counts)
    va = teacher_samples(args.teacher, args.val_seed, 1, args.jobs, max(args.samples // 4, 1),
                         cache=out / f"samples-{tag}-{args.val_seed}x1-{max(args.samples // 4, 1)}.npz",
                         remaining=args.remaining, counts=args.counts)
    print(f"samples: {len(tr[2])} training (teacher JCT {np.mean(tr[3]):.0f} s), {len(va[2])} held-out; "
          f"{time.process_time() - c0:.0f} s CPU", flush=True)
    results = []
    for arch in args.archs.split(","):
        spec = train_spec(DL2TrainConfig(J=40, arch=arch, remaining=args.remaining, counts=args.counts))
        hidden = tuple(int(h) for h in (args.rows_hidden if arch == "rows" else args.flat_hidden).split(","))
        n = spec.obs_size
        sets = [(o[:, :n].copy(), m, a) for o, m, a, _j in (tr, va)]
        torch.manual_seed(args.seed)
        actor = make_actor(spec, hidden)
        curve: list[dict] = []
        c1 = time.process_time()

        def on_epoch(loss, actor=actor, curve=curve, arch=arch):
            (tce, tacc), (vce, vacc) = measure(actor, *sets[0]), measure(actor, *sets[1])
            curve.append({"epoch": len(curve) + 1, "train_ce": tce, "train_acc": tacc, "val_ce": vce, "val_acc": vacc,
                          "cpu_s": round(time.process_time() - c1, 1)})
            print(json.dumps({"arch": arch, **curve[-1]}), flush=True)

        supervised(actor, *sets[0], args.epochs, args.lr, 256, args.seed, on_epoch=on_epoch)
        results.append({"arch": arch, "hidden": list(hidden), "curve": curve})
        last = curve[-1]
        print(f"{arch} {hidden}: held-out cross-entropy {last['val_ce']:.3f}, accuracy {last['val_acc']:.3f} "
              f"(training {last['train_ce']:.3f} / {last['train_acc']:.3f}), {last['cpu_s']:.0f} s CPU", flush=True)
    (out / f"imitate-{tag}.json").write_text(json.dumps(
        {"args": vars(args), "train_samples": len(tr[2]), "val_samples": len(va[2]), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
