"""Chic / Chic-Pair against Optimus, DRF and Tetris on held-out sequences (``rlsched chic-results``).

For each arrival rate (default 0.9, 1.8, 2.7 jobs/h, the seed's) and each test seed
(:data:`trainer.chic.train.TEST_SEED0` onwards, never trained or validated on) it generates a
``gen-elastic --setting chic`` sequence of 30 jobs, runs every policy in the simulator on
``data/clusters/chic.yaml`` and records each policy's average JCT. Per rate and policy it reports
the mean over sequences and the paired ratio to Optimus and to the best baseline at that rate (mean
and 95 % t-interval over the sequences), and Chic's decision time per step (mask + encode + network
+ choice, one answer of a decision phase, this host).

Writes, all from this one run:

* ``OUT/chic_results.json`` (every number), ``OUT/chic_act_vs_rate.png`` (ACT vs arrival rate, with
  the intervals), ``OUT/chic_training.png`` (the training curves from the ``*-history.json`` files
  beside the checkpoints: the level xi_k and the mean return per iteration, validation ACT with
  Optimus' on the same validation sequences);
* with ``--docs``: the generated sections of ``docs/ELASTIC.md`` and ``docs/RESULTS.md`` (between
  ``<!-- chic-results:begin -->`` and ``<!-- chic-results:end -->``) and the figures copied to
  ``docs/figures/``.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from trainer.chic.train import TEST_SEED0, VAL_SEED0, chic_setup, run_policy, sequences
from trainer.outputs import replace_marked

BASELINES = ("optimus", "drf", "tetris")
LEARNED = ("chic", "chic-pair")
#: The seed's claims: ACT below Optimus (section 6.2.1) and decision time per step (section 4.2).
SEED_CLAIM = {"chic": 12.65, "chic-pair": 10.08, "step_ms": 0.78}
BEGIN, END = "<!-- chic-results:begin -->", "<!-- chic-results:end -->"
_ROOT = Path(__file__).resolve().parents[2]


def _ci(x: np.ndarray) -> float:
    from scipy import stats

    if len(x) < 2:
        return math.nan
    return float(stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))


def evaluate(rates: Sequence[float], seqs: int, checkpoints: dict[str, str | None], progress: bool = True) -> dict:
    """Run every policy on every (rate, test seed); the numbers of the module docstring."""
    from policies.chic import ChicPolicy, make_chic_policy
    from policies.registry import make_policy

    cluster, perf = chic_setup()
    names = [*BASELINES, *LEARNED]
    out: dict = {"rates": list(rates), "seqs": seqs, "test_seeds": [TEST_SEED0, TEST_SEED0 + seqs - 1], "by_rate": {}}
    step_times: dict[str, list[float]] = {n: [] for n in LEARNED}
    bar = None
    if progress:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        bar = Progress(TextColumn("chic-results"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
        bar.start()
        task = bar.add_task("", total=len(rates) * seqs)
    t0 = time.perf_counter()
    try:
        for rate in rates:
            rows = []
            for jobs in sequences(TEST_SEED0, seqs, rate):
                row = {}
                for n in names:
                    if n in LEARNED:
                        pol = make_chic_policy(n if checkpoints.get(n) is None else f"{n}:{checkpoints[n]}", perf)
                    else:
                        pol = make_policy(n, cluster, perf)
                    row[n] = run_policy(pol, cluster, perf, jobs)
                    if isinstance(pol, ChicPolicy):
                        step_times[n].extend(pol.step_times)
                rows.append(row)
                if bar is not None:
                    bar.update(task, advance=1)
            act = {n: np.array([r[n] for r in rows]) for n in names}
            best = min(BASELINES, key=lambda n: act[n].mean())
            res = {"best_baseline": best, "policies": {}}
            for n in names:
                vs_opt = act[n] / act["optimus"]
                vs_best = act[n] / act[best]
                res["policies"][n] = {"act_s": float(act[n].mean()), "act_ci_s": _ci(act[n]),
                                      "ratio_optimus": float(vs_opt.mean()), "ratio_optimus_ci": _ci(vs_opt),
                                      "ratio_best": float(vs_best.mean()), "ratio_best_ci": _ci(vs_best),
                                      "per_seq_s": [float(x) for x in act[n]]}
            out["by_rate"][f"{rate:g}"] = res
    finally:
        if bar is not None:
            bar.stop()
    out["decision_ms"] = {n: {"steps": len(v), "median": 1e3 * float(np.median(v)), "p99": 1e3 * float(np.quantile(v, 0.99)),
                              "mean": 1e3 * float(np.mean(v))} for n, v in step_times.items() if v}
    out["seconds"] = time.perf_counter() - t0
    return out


def validation_optimus(rate: float, seqs: int) -> float:
    """Optimus' average JCT on the validation sequences (the training curves' reference line)."""
    from policies.registry import make_policy

    cluster, perf = chic_setup()
    return float(np.mean([run_policy(make_policy("optimus", cluster, perf), cluster, perf, j)
                          for j in sequences(VAL_SEED0, seqs, rate)]))


def figures(res: dict, histories: dict[str, dict], out: Path) -> list[Path]:
    """``chic_act_vs_rate.png`` and (with histories) ``chic_training.png`` in ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    rates = res["rates"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for n in [*BASELINES, *LEARNED]:
        y = [res["by_rate"][f"{r:g}"]["policies"][n]["act_s"] for r in rates]
        e = [res["by_rate"][f"{r:g}"]["policies"][n]["act_ci_s"] for r in rates]
        ax.errorbar(rates, y, yerr=e, marker="o", capsize=3, label=n)
    ax.set_xlabel("arrival rate (jobs/h)")
    ax.set_ylabel("average completion time (s)")
    ax.set_title(f"Chic setting, {res['seqs']} held-out sequences per rate (95 % CI)")
    ax.legend()
    fig.tight_layout()
    p = out / "chic_act_vs_rate.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)
    if histories:
        fig, axes = plt.subplots(len(histories), 2, figsize=(10, 3.2 * len(histories)), squeeze=False)
        for row, (n, h) in enumerate(histories.items()):
            its = [s for s in h["iterations"] if "xi" in s]
            a0, a1 = axes[row]
            a0.plot([s["iteration"] for s in its], [s["xi"] for s in its], label="level xi_k")
            a0.plot([s["iteration"] for s in its], [s["mean_return"] for s in its], label="mean return R(x_n)")
            a0.set_title(f"{n}: returns per iteration")
            a0.set_xlabel("iteration")
            a0.legend()
            va = [s for s in h["iterations"] if "val_act" in s]
            a1.plot([s["iteration"] for s in va], [s["val_act"] for s in va], marker=".", label=f"{n} (greedy)")
            if h.get("optimus_val_act"):
                a1.axhline(h["optimus_val_act"], color="k", ls="--", label="optimus")
            a1.set_title(f"{n}: validation ACT (s)")
            a1.set_xlabel("iteration")
            a1.legend()
        fig.tight_layout()
        p = out / "chic_training.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
    return paths


def markdown(res: dict, histories: dict[str, dict]) -> str:
    """The generated section (tables) of both documents."""
    lines = [f"Test sequences: seeds {res['test_seeds'][0]}-{res['test_seeds'][1]} of `gen-elastic --setting chic` "
             f"(30 jobs each), {res['seqs']} per rate; cluster `data/clusters/chic.yaml`; 30 s resize pause. "
             "Each cell: mean average JCT over the sequences; in brackets the paired ratio to Optimus "
             "(mean +- 95 % t-interval half-width over the sequences).", "",
             "| rate (jobs/h) | best baseline | Optimus | DRF | Tetris | Chic | Chic-Pair |", "|---|---|---|---|---|---|---|"]
    for r in res["rates"]:
        b = res["by_rate"][f"{r:g}"]
        cells = []
        for n in [*BASELINES, *LEARNED]:
            p = b["policies"][n]
            cells.append(f"{p['act_s']:.0f} s" if n == "optimus" else
                         f"{p['act_s']:.0f} s ({p['ratio_optimus']:.3f} +- {p['ratio_optimus_ci']:.3f})")
        lines.append(f"| {r:g} | {b['best_baseline']} | " + " | ".join(cells) + " |")
    lines += ["", "Against the seed's claim (ACT below Optimus; negative: above):", "",
              "| rate (jobs/h) | Chic: ours | Chic: seed | Chic-Pair: ours | Chic-Pair: seed |", "|---|---|---|---|---|"]
    for r in res["rates"]:
        b = res["by_rate"][f"{r:g}"]["policies"]
        lines.append(f"| {r:g} | {100 * (1 - b['chic']['ratio_optimus']):.1f} % | >= {SEED_CLAIM['chic']} % | "
                     f"{100 * (1 - b['chic-pair']['ratio_optimus']):.1f} % | >= {SEED_CLAIM['chic-pair']} % |")
    lines += ["", "Decision time per step (mask + encode + network + choice of one answer in a decision phase, numpy, one process on this shared 2-core host, niced; seed: < 0.78 ms on one i5 core):", "",
              "| policy | steps timed | median | p99 | mean |", "|---|---|---|---|---|"]
    for n, d in res.get("decision_ms", {}).items():
        lines.append(f"| {n} | {d['steps']} | {d['median']:.3f} ms | {d['p99']:.3f} ms | {d['mean']:.3f} ms |")
    if histories:
        lines += ["", "Training (the shipped checkpoints; `training` in their JSON):", "",
                  "| policy | iterations | trajectories / iteration | best validation ACT (iteration) | "
                  "Optimus on the validation set | training wall time |", "|---|---|---|---|---|---|"]
        for n, h in histories.items():
            c = h["config"]
            lines.append(f"| {n} | {c['iterations']} | {c['n']} + 1 uniform | {h['best_val_act']:.0f} s "
                         f"({h['best_iteration']}) | {h.get('optimus_val_act', float('nan')):.0f} s | "
                         f"{h['train_seconds'] / 60:.1f} min |")
    lines += ["", "![ACT vs arrival rate](figures/chic_act_vs_rate.png)"]
    if histories:
        lines += ["", "![Training curves](figures/chic_training.png)"]
    return "\n".join(lines)


def replace_section(path: Path, body: str) -> None:
    """Put ``body`` between the markers in ``path`` (appending the markers at the end when absent)."""
    path.write_text(replace_marked(path.read_text(), BEGIN, END, f"{BEGIN}\n{body}\n{END}"))


def load_histories(checkpoints: dict[str, str | None]) -> dict[str, dict]:
    """``<variant>-history.json`` beside each checkpoint (shipped: ``policies/checkpoints/``)."""
    from policies.chic import shipped_checkpoint

    out = {}
    for n in LEARNED:
        ck = Path(checkpoints.get(n) or shipped_checkpoint(n))
        h = ck.parent / f"{n}-history.json"
        if h.is_file():
            out[n] = json.loads(h.read_text())
    return out


def main(out: Path, rates: Sequence[float], seqs: int, checkpoints: dict[str, str | None], docs: bool,
         progress: bool = True) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    res = evaluate(rates, seqs, checkpoints, progress)
    hist = load_histories(checkpoints)
    for h in hist.values():
        c = h["config"]
        h["optimus_val_act"] = validation_optimus(c["rate"], c["val_seqs"])
    res["training"] = {n: {k: h.get(k) for k in ("best_iteration", "best_val_act", "train_seconds", "optimus_val_act")}
                       for n, h in hist.items()}
    (out / "chic_results.json").write_text(json.dumps(res, indent=1))
    figs = figures(res, hist, out)
    md = markdown(res, hist)
    (out / "chic_results.md").write_text(md + "\n")
    if docs:
        fig_dir = _ROOT / "docs" / "figures"
        for f in figs:
            shutil.copyfile(f, fig_dir / f.name)
        replace_section(_ROOT / "docs" / "ELASTIC.md", md)
        replace_section(_ROOT / "docs" / "RESULTS.md", md.replace("](figures/", "](figures/"))
    return res
