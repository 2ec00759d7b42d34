"""The seed's study of the episode length ``W`` and the slot count ``I`` (seed 001, section 6.2.3,
Fig. 7), repeated in our simulator (``rlsched chic-study``).

Cells (:data:`CELLS`), each one training run of :func:`trainer.chic.train.train` with the same
shortened cross-entropy schedule (``iterations`` per cell, default :data:`STUDY_ITERATIONS`; N = 35
trajectories + 1 uniform, validation every 2 iterations on the 30 validation sequences of 30 jobs at
the cell's rate, the best one kept) and otherwise the shipped networks' configuration:

* ``W``: Chic and Chic-Pair trained on episodes of ``W`` = 30 and 60 jobs at 1.8 jobs/h (the seed's
  Fig. 7(a); its rate is not stated there, 1.8 jobs/h is the one of its convergence study);
* ``I``: Chic-Pair with ``I`` = 2, 3, 4 slots at 0.9 and 2.7 jobs/h (its Fig. 7(b)).

Condition (2)'s ``g`` is the measured one (``g = "measured"``) in every cell.

Each trained network runs the test sequences of ``rlsched chic-results`` (seeds
:data:`trainer.chic.train.TEST_SEED0` onwards, 30 jobs each) at its rate, with Optimus on the same
sequences. Reported per cell: the mean ACT and its 95 % t-interval, the paired ratio to Optimus, the
best validation ACT and its iteration, the training CPU time; and the paired differences the seed
states in words (``W`` = 60 minus 30; ``I`` = 2 and 4 minus 3), each with its 95 % t-interval over
the sequences, beside the seed's statement (:data:`SEED_FINDINGS`).

Writes ``OUT/chic_study.json``, ``OUT/chic_study.md``, ``OUT/chic_study.png`` and the cells'
checkpoints ``OUT/cells/<cell>.json`` with their test ACTs ``OUT/cells/<cell>-test.json`` (a cell whose
checkpoint exists with the same configuration is not trained or run again: ``--retrain`` forces it); with ``--docs`` also the blocks between
``<!-- chic-study:begin -->`` and ``<!-- chic-study:end -->`` of docs/ELASTIC.md and docs/RESULTS.md
and ``docs/figures/chic_study.png``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from trainer.chic.train import TEST_SEED0, CEMConfig, chic_setup, run_policy, sequences, train
from trainer.outputs import replace_marked

#: CE iterations per cell (the shipped networks: 40 for Chic, 20 for Chic-Pair); the same for every cell.
STUDY_ITERATIONS = 20
#: (cell name, variant, rate jobs/h, W, I) of the study.
CELLS = (
    ("chic-W30", "chic", 1.8, 30, 3),
    ("chic-W60", "chic", 1.8, 60, 3),
    ("chic-pair-W30", "chic-pair", 1.8, 30, 3),
    ("chic-pair-W60", "chic-pair", 1.8, 60, 3),
    *((f"chic-pair-I{i}-r{r:g}", "chic-pair", r, 30, i) for r in (0.9, 2.7) for i in (2, 3, 4)),
)
#: The seed's statements (section 6.2.3), quoted beside our numbers.
SEED_FINDINGS = {
    "W": "W = 60 \"yields a slightly better result, but the training time is much longer\"",
    "I0.9": "at 0.9 jobs/h \"the ACT achieved for different I values is similar\"",
    "I2.7": "at 2.7 jobs/h \"setting I = 2 limits the performance\"; I = 4 \"could decrease the ACT by 71.28 secs\" "
            "against I = 3",
}
#: The seed's one stated number: I = 4 minus I = 3 at 2.7 jobs/h, s of ACT.
SEED_I4_MINUS_I3_S = -71.28
BEGIN, END = "<!-- chic-study:begin -->", "<!-- chic-study:end -->"
_ROOT = Path(__file__).resolve().parents[2]


def _ci(x: np.ndarray) -> float:
    from scipy import stats

    return math.nan if len(x) < 2 else float(stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))


def cell_config(variant: str, rate: float, w: int, i: int, iterations: int, **over) -> CEMConfig:
    """The training configuration of one cell (module docstring); ``over``: other :class:`CEMConfig` fields
    (tests' tiny settings)."""
    return CEMConfig(**{**dict(variant=variant, rate=rate, jobs=w, slots=i, iterations=iterations, g="measured"),
                        **over})


def _trained(path: Path, cfg: CEMConfig) -> bool:
    """Whether the checkpoint ``path`` was trained with ``cfg`` (a field its record lacks counts as its
    default, the behaviour before the field existed)."""
    if not path.is_file():
        return False
    try:
        got = json.loads(path.read_text()).get("training", {}).get("config")
    except (OSError, ValueError):
        return False
    return isinstance(got, dict) and {**dataclasses.asdict(CEMConfig()), **got} == dataclasses.asdict(cfg)


def _tests(cache: dict, rate: float, seqs: int) -> list:
    if rate not in cache:
        cache[rate] = sequences(TEST_SEED0, seqs, rate)
    return cache[rate]


def _cached(path: Path, key: dict, again: bool, compute) -> list[float]:
    """The per-sequence ACTs stored in ``path`` under ``key`` (the cell's configuration and the number of
    test sequences), or ``compute()`` stored there (also when ``again``)."""
    if not again and path.is_file():
        try:
            got = json.loads(path.read_text())
            if got.get("key") == key:
                return got["per_seq_s"]
        except (OSError, ValueError, KeyError):
            pass  # an unreadable or foreign cache entry: the cell is trained again below
    vals = [float(x) for x in compute()]
    path.write_text(json.dumps({"key": key, "per_seq_s": vals}))
    return vals


def run(out: Path, iterations: int = STUDY_ITERATIONS, seqs: int = 30, retrain: bool = False,
        cells: Sequence[tuple] = CELLS, progress: bool = False, log=print, over: dict | None = None) -> dict:
    """Train (or reuse) every cell, evaluate it on the test sequences; the numbers of the module docstring."""
    from policies.chic import make_chic_policy
    from policies.registry import make_policy

    cdir = out / "cells"
    cdir.mkdir(parents=True, exist_ok=True)
    cluster, perf = chic_setup()
    res: dict = {"iterations": iterations, "n": cell_config("chic", 1.8, 30, 3, iterations, **(over or {})).n,
                 "seqs": seqs, "test_seeds": [TEST_SEED0, TEST_SEED0 + seqs - 1], "cells": {}, "optimus": {}}
    tests: dict[float, list] = {}
    for name, variant, rate, w, i in cells:
        cfg = cell_config(variant, rate, w, i, iterations, **(over or {}))
        ck = cdir / f"{name}.json"
        if retrain or not _trained(ck, cfg):
            h = train(cfg, cdir, progress=progress, name=name)
            log(f"chic-study {name}: best validation ACT {h['best_val_act']:.0f} s at iteration "
                f"{h['best_iteration']}; {h['train_cpu_seconds']:.0f} s CPU")
        hist = json.loads((cdir / f"{name}-history.json").read_text())
        if f"{rate:g}" not in res["optimus"]:
            res["optimus"][f"{rate:g}"] = _cached(cdir / f"optimus-r{rate:g}-test.json", {"seqs": seqs}, retrain, lambda: [
                run_policy(make_policy("optimus", cluster, perf), cluster, perf, j) for j in _tests(tests, rate, seqs)])
        c0 = time.process_time()
        acts = _cached(cdir / f"{name}-test.json", {"seqs": seqs, "config": dataclasses.asdict(cfg)}, retrain, lambda: [
            run_policy(make_chic_policy(f"{variant}:{ck}", perf), cluster, perf, j) for j in _tests(tests, rate, seqs)])
        res["cells"][name] = {"variant": variant, "rate": rate, "W": w, "I": i, "per_seq_s": acts,
                              "best_val_act_s": hist["best_val_act"], "best_iteration": hist["best_iteration"],
                              "train_cpu_s": hist["train_cpu_seconds"], "eval_cpu_s": time.process_time() - c0}
        log(f"chic-study {name}: test ACT {np.mean(acts):.0f} s")
    return summarise(res)


def summarise(res: dict) -> dict:
    """Add to ``res`` each cell's mean, interval and ratio to Optimus, and the paired differences."""
    for c in res["cells"].values():
        a = np.array(c["per_seq_s"])
        o = np.array(res["optimus"][f"{c['rate']:g}"])
        c.update(act_s=float(a.mean()), act_ci_s=_ci(a), ratio_optimus=float((a / o).mean()),
                 ratio_optimus_ci=_ci(a / o), optimus_s=float(o.mean()))
    diffs = {}

    def diff(key: str, a: str, b: str, label: str) -> None:
        if a in res["cells"] and b in res["cells"]:
            d = np.array(res["cells"][a]["per_seq_s"]) - np.array(res["cells"][b]["per_seq_s"])
            diffs[key] = {"label": label, "a": a, "b": b, "mean_s": float(d.mean()), "ci_s": _ci(d)}

    for v in ("chic", "chic-pair"):
        diff(f"{v} W60-W30", f"{v}-W60", f"{v}-W30", f"{v}: W = 60 minus W = 30 (1.8 jobs/h)")
    for r in ("0.9", "2.7"):
        for i in (2, 4):
            diff(f"I{i}-I3 r{r}", f"chic-pair-I{i}-r{r}", f"chic-pair-I3-r{r}",
                 f"Chic-Pair at {r} jobs/h: I = {i} minus I = 3")
    res["differences"] = diffs
    return res


def figure(res: dict, path: Path) -> Path:
    """Two panels: test ACT of W = 30 / 60 (Chic, Chic-Pair, 1.8 jobs/h) and of Chic-Pair's I = 2 / 3 / 4
    (0.9 and 2.7 jobs/h), 95 % intervals, Optimus dashed (the seed's Fig. 7)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    C = res["cells"]
    fig, (a0, a1) = plt.subplots(1, 2, figsize=(10, 4))
    for k, v in enumerate(("chic", "chic-pair")):
        names = [f"{v}-W30", f"{v}-W60"]
        if not all(n in C for n in names):
            continue
        x = np.arange(2) + 3 * k
        a0.bar(x, [C[n]["act_s"] for n in names], yerr=[C[n]["act_ci_s"] for n in names], capsize=4,
               color=["tab:red", "tab:orange"] if v == "chic" else ["tab:blue", "tab:cyan"])
        for xx, n in zip(x, names):
            a0.text(xx, C[n]["act_s"] / 2, f"W={C[n]['W']}", ha="center", color="w", fontsize=9)
        a0.hlines(C[names[0]]["optimus_s"], x[0] - 0.4, x[1] + 0.4, colors="k", linestyles="--")
    a0.set_xticks([0.5, 3.5], ["Chic", "Chic-Pair"])
    a0.set_ylabel("average completion time (s)")
    a0.set_title("(a) episode length W, 1.8 jobs/h (dashed: Optimus)")
    for k, r in enumerate(("0.9", "2.7")):
        names = [f"chic-pair-I{i}-r{r}" for i in (2, 3, 4)]
        if not all(n in C for n in names):
            continue
        x = np.arange(3) + 4 * k
        a1.bar(x, [C[n]["act_s"] for n in names], yerr=[C[n]["act_ci_s"] for n in names], capsize=4,
               color=["tab:green", "tab:blue", "tab:purple"])
        for xx, n in zip(x, names):
            a1.text(xx, C[n]["act_s"] / 2, f"I={C[n]['I']}", ha="center", color="w", fontsize=9)
        a1.hlines(C[names[0]]["optimus_s"], x[0] - 0.4, x[-1] + 0.4, colors="k", linestyles="--")
    a1.set_xticks([1, 5], ["0.9 jobs/h", "2.7 jobs/h"])
    a1.set_title("(b) Chic-Pair, slots I (dashed: Optimus)")
    fig.suptitle(f"Chic setting, {res['seqs']} test sequences of 30 jobs per bar (95 % CI); "
                 f"{res['iterations']} CE iterations per network", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _d(D: dict, k: str) -> str:
    d = D[k]
    return f"{d['mean_s']:+.1f} +- {d['ci_s']:.1f} s"


def findings(res: dict) -> list[str]:
    """What the numbers say against each of the seed's statements (bullets of the generated block)."""
    C, D = res["cells"], res["differences"]
    out = []
    w = [v for v in ("chic", "chic-pair") if f"{v} W60-W30" in D]
    if w:
        cpu = " / ".join(f"{C[f'{v}-W60']['train_cpu_s'] / max(C[f'{v}-W30']['train_cpu_s'], 1e-9):.1f}x" for v in w)
        out.append("**W** (seed: " + SEED_FINDINGS["W"] + "): W = 60 minus W = 30 is "
                   + " and ".join(f"{_d(D, f'{v} W60-W30')} for {v}" for v in w)
                   + f" of test ACT; training took {cpu} the CPU time of W = 30.")
    for r, key in (("0.9", "I0.9"), ("2.7", "I2.7")):
        ks = [k for k in (f"I2-I3 r{r}", f"I4-I3 r{r}") if k in D]
        if ks:
            txt = (f"**I at {r} jobs/h** (seed: {SEED_FINDINGS[key]}): "
                   + " and ".join(f"I = {k[1]} minus I = 3 {_d(D, k)}" for k in ks))
            if r == "2.7" and f"I4-I3 r{r}" in D:
                txt += f" (the seed: {SEED_I4_MINUS_I3_S:+.2f} s for I = 4)"
            out.append(txt + ".")
    return out


def markdown(res: dict) -> str:
    """The generated block: the cells' table, the paired differences beside the seed's findings."""
    C, D = res["cells"], res["differences"]
    lines = [f"Every cell: one training run of {res['iterations']} cross-entropy iterations ({res.get('n', 35)} + 1 "
             "trajectories each; "
             "the shipped networks have 40 / 20), the validation-best network of it, run on test seeds "
             f"{res['test_seeds'][0]}-{res['test_seeds'][1]} (30 jobs each) at its rate with Optimus on the same "
             "sequences; mean +- 95 % t-interval half-width over the sequences.", "",
             "| cell | variant | rate (jobs/h) | W | I | test ACT | / Optimus (paired) | best validation ACT (iteration) "
             "| training CPU time |", "|---|---|---|---|---|---|---|---|---|"]
    for n, c in C.items():
        lines.append(f"| {n} | {c['variant']} | {c['rate']:g} | {c['W']} | {c['I']} | {c['act_s']:.0f} +- "
                     f"{c['act_ci_s']:.0f} s | {c['ratio_optimus']:.3f} +- {c['ratio_optimus_ci']:.3f} | "
                     f"{c['best_val_act_s']:.0f} s ({c['best_iteration']}) | {c['train_cpu_s'] / 60:.1f} min |")
    lines += ["", "Paired differences of test ACT (negative: the first is faster), beside the seed (section 6.2.3, "
              "Fig. 7):", "", "| difference | ours (s, 95 % CI) | seed |", "|---|---|---|"]
    seed = {"chic W60-W30": SEED_FINDINGS["W"], "chic-pair W60-W30": SEED_FINDINGS["W"],
            "I2-I3 r0.9": SEED_FINDINGS["I0.9"], "I4-I3 r0.9": SEED_FINDINGS["I0.9"],
            "I2-I3 r2.7": "I = 2 \"limits the performance\" (higher ACT; no number given)",
            "I4-I3 r2.7": f"{SEED_I4_MINUS_I3_S:+.2f} s"}
    for k, d in D.items():
        lines.append(f"| {d['label']} | {d['mean_s']:+.1f} +- {d['ci_s']:.1f} | {seed.get(k, '')} |")
    lines += ["", *[f"* {f}" for f in findings(res)]]
    missing = [c[0] for c in CELLS if c[0] not in C]
    if missing:
        lines += ["", f"Cells not run here: {', '.join(missing)}."]
    lines += ["", "![W and I study](figures/chic_study.png)"]
    return "\n".join(lines)


def replace_section(path: Path, body: str) -> None:
    """Put ``body`` between the study's markers in ``path`` (appended at the end where they are absent)."""
    path.write_text(replace_marked(path.read_text(), BEGIN, END, f"{BEGIN}\n{body}\n{END}"))


def main(out: Path, iterations: int = STUDY_ITERATIONS, seqs: int = 30, retrain: bool = False, docs: bool = False,
         progress: bool = False, root: Path = _ROOT, cells: Sequence[tuple] = CELLS, over: dict | None = None) -> dict:
    """Run the study, write ``out``'s files and, with ``docs``, the docs' blocks and figure under ``root``."""
    out.mkdir(parents=True, exist_ok=True)
    c0 = time.process_time()
    res = run(out, iterations, seqs, retrain, cells, progress, over=over)
    res["cpu_seconds"] = time.process_time() - c0
    (out / "chic_study.json").write_text(json.dumps(res, indent=1))
    fig = figure(res, out / "chic_study.png")
    md = markdown(res)
    (out / "chic_study.md").write_text(md + "\n")
    if docs:
        (root / "docs" / "figures").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(fig, root / "docs" / "figures" / fig.name)
        for doc in ("ELASTIC.md", "RESULTS.md"):
            replace_section(root / "docs" / doc, md)
    return res
