"""The training sweep of the size-free policy, one ``rlsched train-sizefree`` run per setting.

:data:`SWEEP` is the grid (seed x PPO learning rate x entropy coefficient, every run with the planner
as DAgger teacher and the shipped run's other settings, :data:`COMMON`); :func:`argv` is the
``rlsched train-sizefree`` argument list of setting ``index`` (0-based, the order of
:func:`settings`). ``scripts/train_sizefree_sweep.sbatch`` runs the grid as a Slurm job array, one
array task per setting::

    sbatch scripts/train_sizefree_sweep.sbatch            # runs/sizefree-sweep/run-<index>.{json,safetensors}
    python3 -m trainer.sizefree.sweep --best --out-dir runs/sizefree-sweep

``python3 -m trainer.sizefree.sweep --index N --out-dir DIR`` runs setting ``N`` (``--print``: only
prints its command); ``--count`` prints the number of settings; ``--best`` names the finished run
with the lowest validation average JCT (the checkpoint's ``training.val_avg_jct_h`` of the network it
kept), one line, tab-separated: path, hours.

``--smoke`` (or the environment variable ``RLSCHED_SWEEP_SMOKE=1``, which ``sbatch`` passes on to
the array tasks) swaps :data:`COMMON` for :data:`SMOKE`: the same grid and code path (planner teacher,
DAgger, PPO in ``SubprocVecEnv`` processes) on one 8-job set per kind and 64 PPO steps, a run of
seconds that checks a cluster's setup before the real sweep (tests/test_sweep_slurm.py).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shlex
import sys
from pathlib import Path

__all__ = ["COMMON", "SMOKE", "SMOKE_ENV", "SWEEP", "argv", "best", "main", "settings", "smoke_from_env"]

#: Settings every run of the sweep shares (the shipped run's; docs/RL.md).
COMMON = ("--expert", "planner", "--sets", "6", "--jobs-per-set", "64", "--dagger", "4", "--bc-epochs", "20",
          "--ppo-timesteps", "65536", "--subproc")
#: The smoke setting's shared options (``--smoke``): the same teacher, clusters and parallel rollouts
#: on 1 set per kind of 8 jobs, 1 DAgger round of 1 epoch, 64 PPO steps (rollouts of 32 per
#: environment) and no reference checkpoint.
SMOKE = ("--expert", "planner", "--sets", "1", "--jobs-per-set", "8", "--dagger", "1", "--bc-epochs", "1",
         "--ppo-timesteps", "64", "--ppo-n-steps", "32", "--compare", "none", "--subproc")
#: The environment variable that selects :data:`SMOKE` (value ``1``; ``0`` or unset: :data:`COMMON`).
SMOKE_ENV = "RLSCHED_SWEEP_SMOKE"
#: The grid: option -> values; settings are its product in this order (the last option varies fastest).
SWEEP: dict[str, tuple[str, ...]] = {
    "--seed": ("7000", "7100", "7200"),
    "--ppo-lr": ("0.0001", "0.0003"),
    "--ent-coef": ("0.0", "0.01"),
}


def settings() -> list[dict[str, str]]:
    """Every setting of :data:`SWEEP`, in array-index order."""
    keys = list(SWEEP)
    return [dict(zip(keys, vals)) for vals in itertools.product(*(SWEEP[k] for k in keys))]


def smoke_from_env(environ: dict[str, str] | None = None) -> bool:
    """Whether :data:`SMOKE_ENV` asks for the smoke setting (``1``; ``0`` or empty: no).

    :raises ValueError: any other value (one line naming the variable and the value)."""
    v = (os.environ if environ is None else environ).get(SMOKE_ENV, "").strip()
    if v in ("", "0"):
        return False
    if v == "1":
        return True
    raise ValueError(f"{SMOKE_ENV}={v!r}: expected 1 (the smoke setting) or 0")


def argv(index: int, out_dir: str | Path, smoke: bool = False) -> list[str]:
    """``rlsched train-sizefree``'s arguments for setting ``index`` (writes ``OUT_DIR/run-<index>``);
    ``smoke``: with :data:`SMOKE` instead of :data:`COMMON`.

    :raises IndexError: ``index`` outside ``0 .. len(settings()) - 1``."""
    grid = settings()
    if isinstance(index, bool) or not 0 <= index < len(grid):
        raise IndexError(f"sweep index {index!r} is outside 0..{len(grid) - 1}")
    out = ["train-sizefree", "--out", str(Path(out_dir) / f"run-{index}"), *(SMOKE if smoke else COMMON)]
    for k, v in grid[index].items():
        out += [k, v]
    return out


def best(out_dir: str | Path) -> tuple[Path, float] | None:
    """The finished run of ``out_dir`` (``run-*.json``) with the lowest validation average JCT (h) of the
    network it kept; ``None`` when none has finished."""
    found: list[tuple[float, Path]] = []
    for j in sorted(Path(out_dir).glob("run-*.json")):
        try:
            tr = json.loads(j.read_text())["training"]
            v = float(tr["val_avg_jct_h"][tr["chosen"]])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if v == v:
            found.append((v, j))
    if not found:
        return None
    v, j = min(found)
    return j, v


def main(args: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m trainer.sizefree.sweep", description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", default="runs/sizefree-sweep", help="where the runs write (default: %(default)s)")
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--index", type=int, help="run setting INDEX (0-based)")
    what.add_argument("--count", action="store_true", help="print the number of settings")
    what.add_argument("--best", action="store_true", help="print the best finished run and its validation JCT (h)")
    ap.add_argument("--print", dest="dry", action="store_true", help="with --index: print the command only")
    ap.add_argument("--smoke", action="store_true",
                    help=f"with --index: the tiny smoke setting (seconds; also {SMOKE_ENV}=1)")
    a = ap.parse_args(args)
    if a.count:
        print(len(settings()))
        return 0
    if a.best:
        got = best(a.out_dir)
        if got is None:
            print(f"sweep: error: no finished run-*.json in {a.out_dir}", file=sys.stderr)
            return 2
        print(f"{got[0]}\t{got[1]:.4f}")
        return 0
    try:
        cmd = argv(a.index, a.out_dir, smoke=a.smoke or smoke_from_env())
    except (IndexError, ValueError) as exc:
        print(f"sweep: error: {exc}", file=sys.stderr)
        return 2
    print("rlsched " + " ".join(shlex.quote(x) for x in cmd), flush=True)
    if a.dry:
        return 0
    Path(a.out_dir).mkdir(parents=True, exist_ok=True)
    from rlsched.cli import main as rlsched_main

    return int(rlsched_main(cmd) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
