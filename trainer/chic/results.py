"""Chic / Chic-Pair against Optimus, DRF and Tetris on held-out sequences (``rlsched chic-results``).

For each arrival rate (default 0.9, 1.8, 2.7 jobs/h, the seed's) and each test seed
(:data:`trainer.chic.train.TEST_SEED0` onwards, never trained or validated on) it generates a
``gen-elastic --setting chic`` sequence of 30 jobs, runs every policy in the simulator on
``data/clusters/chic.yaml`` and records each policy's average JCT (ACT):

* the baselines: ``optimus`` (planning with Optimus' fitted speed form, as it fits its own model),
  ``optimus`` planning with the measured speeds the simulator runs at (:data:`OPTIMUS_MEASURED`) and
  with those speeds at the PSs its workers' nodes host (:data:`OPTIMUS_PLACED`, :class:`PlacedOptimus`:
  the ``g = "placed"`` that Chic's 0.9 jobs/h network plans with), ``drf``, ``tetris``; the best of them
  per rate is the reference;
* Chic and Chic-Pair as the seed runs them in its Fig. 4(a): at each rate the network trained at that
  rate (``<variant>-r<rate>.json`` beside the default checkpoint; the default one where no per-rate
  network was shipped) and, as its Fig. 4(c), the network trained once at 1.8 jobs/h
  (``<variant>.json``);
* two references that explain the numbers: :data:`OPTIMUS_EVERY_ROUND` (Optimus re-planning at every
  round, i.e. at every arrival and completion as Chic does, instead of every 600 s) and the pair bound
  (:func:`pair_bound`: no Chic-Pair policy can have a lower ACT).

Per rate and policy it reports the mean over sequences and the paired ratio to Optimus and to the
best baseline (mean and 95 % t-interval over the sequences), and the decision time per step (mask +
encode + network + choice, one answer of a decision phase, CPU time of the thread on this host).

Writes, all from this one run: ``OUT/chic_results.json`` (every number), ``OUT/chic_results.md``,
``OUT/chic_act_vs_rate.png`` (ACT vs arrival rate with the intervals, the seed's Fig. 4),
``OUT/chic_training.png`` (the training curves from the ``*-history.json`` files beside the
checkpoints: the level xi_k and the mean return per iteration, and the validation ACT per iteration
with Optimus' on the same validation sequences, the seed's Fig. 6); with ``--docs`` also the generated
sections of ``docs/ELASTIC.md`` and ``docs/RESULTS.md`` (between ``<!-- chic-results:begin -->`` and
``<!-- chic-results:end -->``) and the figures copied to ``docs/figures/``.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from policies.chic import ps_room
from policies.elastic import OptimusPolicy
from trainer.chic.train import (TEST_SEED0, VAL_SEED0, chic_setup, run_policy, sequences,
                                shipped_name)
from trainer.outputs import replace_marked

OPTIMUS_MEASURED = "optimus (measured g)"
OPTIMUS_PLACED = "optimus (placed g)"
OPTIMUS_EVERY_ROUND = "optimus (every round)"
PAIR_FITTED = "chic-pair (fitted g)"
BASELINES = ("optimus", OPTIMUS_MEASURED, OPTIMUS_PLACED, "drf", "tetris")
LEARNED = ("chic", "chic-pair")
ONCE = {"chic": "chic (1.8/h)", "chic-pair": "chic-pair (1.8/h)"}
#: The seed's claims: ACT below Optimus (section 6.2.1) and decision time per step (section 4.2).
SEED_CLAIM = {"chic": 12.65, "chic-pair": 10.08, "step_ms": 0.78}
BEGIN, END = "<!-- chic-results:begin -->", "<!-- chic-results:end -->"
_ROOT = Path(__file__).resolve().parents[2]


def _ci(x: np.ndarray) -> float:
    from scipy import stats

    if len(x) < 2:
        return math.nan
    return float(stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))


def _rel(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(_ROOT))
    except ValueError:
        return str(path)


def checkpoint_for(variant: str, rate: float, override: str | None = None) -> Path:
    """The checkpoint that serves ``variant`` at ``rate``: ``override`` when given, else the per-rate one
    (``<variant>-r<rate>.json`` among the shipped ones) when shipped, else the default ``<variant>.json``."""
    from policies.chic import shipped_checkpoint

    if override:
        return Path(override)
    default = shipped_checkpoint(variant)
    per_rate = default.with_name(f"{shipped_name(variant, rate)}.json")
    return per_rate if per_rate.is_file() else default


def pair_bound(jobs) -> float:
    """A lower bound on the ACT (s) of any Chic-Pair policy on ``jobs``: every job alone from its arrival,
    never paused, at the fastest measured speed of any equal worker / PS count the cluster's 10 GPUs
    allow. (Chic-Pair gives workers and PSs in pairs, so a job's speed never exceeds that.)"""
    from policies.psmodel import fit_ps_models

    cluster, _perf = chic_setup()
    gpus = int(sum(n.gpus for n in cluster.nodes))
    ms = fit_ps_models()
    best = {}
    for j in jobs:
        if j.model not in best:
            best[j.model] = max(ms[j.model].measured_speed(k, k) for k in range(1, gpus + 1))
    return float(np.mean([j.total_samples / best[j.model] for j in jobs]))


def _instrumented_run(pol, cluster, perf, jobs) -> tuple[float, dict]:
    """Average JCT (s) of ``pol`` on ``jobs``, and what it ran: job-seconds of running PS jobs, their
    worker-seconds and PS-seconds (the allocation each decision leaves, held until the next round), the
    resizes it ordered, and the jobs' summed waiting (JCT - running time) and running times."""
    from trainer.simulator import SimConfig, Simulator

    st = {"t": None, "alloc": {}, "job_s": 0.0, "worker_s": 0.0, "ps_s": 0.0, "resizes": 0}
    inner = pol.schedule

    def close(t: float) -> None:
        if st["t"] is not None:
            dt = t - st["t"]
            for w, p in st["alloc"].values():
                st["job_s"] += dt
                st["worker_s"] += w * dt
                st["ps_s"] += p * dt

    def schedule(state):
        dec = inner(state)
        close(state.time)
        from policies.elastic import job_ps

        alloc = {j.job_id: (j.placement.total_gpus, job_ps(j)) for j in state.running}
        for jid in dec.preempt:
            alloc.pop(jid, None)
        for jid, pl in [*dec.resize, *dec.place]:
            alloc[jid] = (pl.total_gpus, getattr(pl, "ps", 0))
        st["resizes"] += len(dec.resize)
        st["t"], st["alloc"] = state.time, alloc
        return dec

    pol.schedule = schedule
    res = Simulator(cluster, jobs, pol, perf, SimConfig()).run()
    close(res.makespan)
    st.update(jobs=len(res.jobs), wait_s=float(sum(r.queueing for r in res.jobs)),
              run_s=float(sum(r.run_time for r in res.jobs)))
    del st["t"], st["alloc"]
    return float(np.mean([r.jct for r in res.jobs])), st


class PlacedOptimus(OptimusPolicy):
    """Optimus (:class:`policies.elastic.OptimusPolicy`, every 600 s) planning with the measured speed at
    the PSs its workers' nodes host (:func:`policies.chic.ps_room` on the snapshot's cluster; PSs past that
    room add nothing): the speeds of Chic's ``g = "placed"``, given to the baseline too."""

    def __init__(self, perf) -> None:
        super().__init__(perf)
        self.estimator = perf  # the measured speeds, cut to the room below
        self._cluster, self._rooms = None, {}

    def schedule(self, state):
        if self._cluster is not state.cluster:
            self._cluster, self._rooms = state.cluster, {}
        return super().schedule(state)

    def speed(self, j, w: int, p: int) -> float:
        if j.ps_job and w >= 1 and p >= 1 and self._cluster is not None:
            key = (j.wv, j.pv, w)
            room = self._rooms.get(key)
            if room is None:
                room = self._rooms[key] = ps_room(self._cluster, j.wv, j.pv, w)
            if room < 1:
                return 0.0
            p = min(p, room)
        return super().speed(j, w, p)


def _make(name: str, cluster, perf, ckpt: dict[str, Path]):
    from policies.chic import make_chic_policy
    from policies.elastic import OptimusPolicy
    from policies.registry import make_policy

    if name == OPTIMUS_MEASURED:
        pol = OptimusPolicy(perf)
        pol.estimator = perf  # plans with the speeds the simulator runs at
        return pol
    if name == OPTIMUS_PLACED:
        return PlacedOptimus(perf)
    if name == OPTIMUS_EVERY_ROUND:
        return OptimusPolicy(perf, interval=0.0)
    if name == PAIR_FITTED:  # the Chic-Pair network with condition (2) on Optimus' fitted form
        pol = make_chic_policy(f"chic-pair:{ckpt['chic-pair']}", perf)
        pol.g, pol.estimator = "fitted", perf.fitted()
        return pol
    if name in ckpt:
        variant = name.split(" ")[0]
        return make_chic_policy(f"{variant}:{ckpt[name]}", perf)
    return make_policy(name, cluster, perf)


def evaluate(rates: Sequence[float], seqs: int, overrides: dict[str, str | None] | None = None,
             progress: bool = True, jobs_per_seq: int = 30) -> dict:
    """Run every policy on every (rate, test seed) (``jobs_per_seq`` jobs a sequence); the numbers of the
    module docstring."""
    from policies.chic import ChicPolicy, shipped_checkpoint

    overrides = overrides or {}
    cluster, perf = chic_setup()
    out: dict = {"rates": list(rates), "seqs": seqs, "jobs": jobs_per_seq, "test_seeds": [TEST_SEED0, TEST_SEED0 + seqs - 1],
                 "by_rate": {}}
    step_times: dict[str, list[float]] = {n: [] for n in LEARNED}
    bar = None
    if progress:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        bar = Progress(TextColumn("chic-results"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
        bar.start()
        task = bar.add_task("", total=len(rates) * seqs)
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        for rate in rates:
            ckpt = {v: checkpoint_for(v, rate, overrides.get(v)) for v in LEARNED}
            for v in LEARNED:
                ckpt[ONCE[v]] = Path(overrides.get(v) or shipped_checkpoint(v))
            names = [*BASELINES, *LEARNED, *ONCE.values(), OPTIMUS_EVERY_ROUND, PAIR_FITTED]
            rows, shapes = [], []
            for jobs in sequences(TEST_SEED0, seqs, rate, jobs_per_seq):
                row = {"pair bound": pair_bound(jobs)}
                shapes_row = {}
                for n in names:
                    same = next((m for m in LEARNED if n == ONCE[m] and ckpt[n] == ckpt[m]), None)
                    if same is not None:  # the per-rate network is the trained-once one
                        row[n] = row[same]
                        continue
                    pol = _make(n, cluster, perf, ckpt)
                    row[n], shapes_row[n] = _instrumented_run(pol, cluster, perf, jobs)
                    if isinstance(pol, ChicPolicy) and n in LEARNED:
                        step_times[n].extend(pol.step_times)
                rows.append(row)
                shapes.append(shapes_row)
                if bar is not None:
                    bar.update(task, advance=1)
            act = {n: np.array([r[n] for r in rows]) for n in rows[0]}
            best = min(BASELINES, key=lambda n: act[n].mean())
            res = {"best_baseline": best, "checkpoints": {n: _rel(p) for n, p in ckpt.items()}, "policies": {},
                   "shapes": {}}
            for n in shapes[0]:
                tot = {k: sum(sh[n][k] for sh in shapes) for k in shapes[0][n]}
                res["shapes"][n] = {"workers": tot["worker_s"] / max(tot["job_s"], 1e-9),
                                    "ps": tot["ps_s"] / max(tot["job_s"], 1e-9),
                                    "resizes_per_job": tot["resizes"] / tot["jobs"],
                                    "wait_s": tot["wait_s"] / tot["jobs"], "run_s": tot["run_s"] / tot["jobs"]}
            for n in act:
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
    out["seconds"], out["cpu_seconds"] = time.perf_counter() - t0, time.process_time() - c0
    return out


def validation_act(policy: str, rate: float, seqs: int, ps_placement: str | None = None) -> float:
    """Average JCT of ``policy`` (a registry name, e.g. ``optimus`` or ``chic:PATH``) on the validation
    sequences at ``rate``, on the Chic cluster with its PSs laid out by ``ps_placement`` (None: as its
    file says)."""
    import dataclasses

    from policies.perf import ContentionModel
    from policies.psmodel import PSPerformanceModel
    from policies.registry import make_policy

    cluster, perf = chic_setup()
    if ps_placement is not None and ps_placement != cluster.ps_placement:
        cluster = dataclasses.replace(cluster, ps_placement=ps_placement)
        perf = PSPerformanceModel(ContentionModel(cluster))
    return float(np.mean([run_policy(make_policy(policy, cluster, perf), cluster, perf, j)
                          for j in sequences(VAL_SEED0, seqs, rate)]))


def load_histories(res: dict) -> dict[str, dict]:
    """``<stem>-history.json`` beside every checkpoint the evaluation used, by checkpoint stem."""
    out = {}
    for r in res["by_rate"].values():
        for p in r["checkpoints"].values():
            path = Path(p) if Path(p).is_absolute() else _ROOT / p
            h = path.with_name(f"{path.stem}-history.json")
            if path.stem not in out and h.is_file():
                out[path.stem] = json.loads(h.read_text())
                out[path.stem]["checkpoint"] = str(path)
    return out


_COLORS = {"optimus": "k", OPTIMUS_MEASURED: "0.55", OPTIMUS_PLACED: "0.75", "drf": "tab:brown", "tetris": "tab:purple",
           "chic": "tab:red", "chic-pair": "tab:blue", ONCE["chic"]: "tab:red", ONCE["chic-pair"]: "tab:blue",
           "pair bound": "tab:cyan"}


def figures(res: dict, histories: dict[str, dict], out: Path) -> list[Path]:
    """``chic_act_vs_rate.png`` and (with histories) ``chic_training.png`` in ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    rates = res["rates"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for n in [*BASELINES, *LEARNED, *ONCE.values(), "pair bound"]:
        y = [res["by_rate"][f"{r:g}"]["policies"][n]["act_s"] for r in rates]
        e = [res["by_rate"][f"{r:g}"]["policies"][n]["act_ci_s"] for r in rates]
        ls = "--" if n in ONCE.values() else ":" if n == "pair bound" else "-"
        ax.errorbar(rates, y, yerr=e, marker="o", capsize=3, label=n, color=_COLORS[n], ls=ls)
    ax.set_xlabel("arrival rate (jobs/h)")
    ax.set_ylabel("average completion time (s)")
    ax.set_title(f"Chic setting, {res['seqs']} held-out sequences per rate (95 % CI)")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    p = out / "chic_act_vs_rate.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)
    if histories:
        variants = [v for v in LEARNED if any(h["config"]["variant"] == v for h in histories.values())]
        fig, axes = plt.subplots(len(variants), 2, figsize=(11, 3.4 * len(variants)), squeeze=False)
        cmap = plt.get_cmap("viridis")
        for row, v in enumerate(variants):
            a0, a1 = axes[row]
            hs = sorted(((h["config"]["rate"], stem, h) for stem, h in histories.items() if h["config"]["variant"] == v))
            for k, (rate, stem, h) in enumerate(hs):
                c = cmap(k / max(len(hs) - 1, 1) * 0.85)
                its = [s for s in h["iterations"] if "xi" in s]
                a0.plot([s["iteration"] for s in its], [s["xi"] for s in its], color=c, label=f"{rate:g}/h: level xi_k")
                a0.plot([s["iteration"] for s in its], [s["mean_return"] for s in its], color=c, ls=":",
                        label=f"{rate:g}/h: mean R(x_n)")
                va = [s for s in h["iterations"] if "val_act" in s and math.isfinite(s["val_act"])]
                a1.plot([s["iteration"] for s in va], [s["val_act"] for s in va], marker=".", color=c,
                        label=f"{stem} ({rate:g}/h)")
                if h.get("optimus_val_act"):
                    a1.axhline(h["optimus_val_act"], color=c, ls="--", lw=1, label=f"optimus ({rate:g}/h)")
            a0.set_title(f"{v}: returns per CE iteration")
            a0.set_xlabel("iteration")
            a0.legend(fontsize=7)
            a1.set_title(f"{v}: validation ACT (s), greedy")
            a1.set_xlabel("iteration")
            a1.legend(fontsize=7)
        fig.tight_layout()
        p = out / "chic_training.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
    return paths


def _cell(p: dict, key: str = "ratio_optimus") -> str:
    return f"{p['act_s']:.0f} s ({p[key]:.3f} +- {p[key + '_ci']:.3f})"


def _ratios(B: dict, R: list[str], n: str) -> str:
    return " / ".join(f"{B[r]['policies'][n]['ratio_optimus']:.3f}" for r in R)


def findings(res: dict) -> list[str]:
    """The findings the tables support, worded from the numbers (bullets of the generated section)."""
    R = [f"{r:g}" for r in res["rates"]]
    B = res["by_rate"]
    rates = " / ".join(R)
    ref = "1.8" if "1.8" in R else R[0]
    out = []
    below = {r: 1 - B[r]["policies"]["chic"]["ratio_optimus"] for r in R}
    met = [r for r in R if below[r] * 100 >= SEED_CLAIM["chic"]]
    missed = [r for r in R if r not in met]
    reach = ("reached at every rate" if not missed else "missed at every rate" if not met else
             f"reached at {' / '.join(met)} jobs/h and missed at {' / '.join(missed)}")
    ci = " / ".join(f"{B[r]['policies']['chic']['ratio_optimus_ci']:.3f}" for r in R)
    out.append(f"**Chic against Optimus**: its ACT is {_ratios(B, R, 'chic')} of Optimus' at {rates} jobs/h "
               f"(paired 95 % half-widths {ci}), i.e. "
               + " / ".join(f"{100 * below[r]:.1f} %" for r in R)
               + f" below it; the seed's {SEED_CLAIM['chic']} % is {reach}. Against the best baseline of each rate: "
               + " / ".join(f"{B[r]['policies']['chic']['ratio_best']:.3f}" for r in R) + ".")
    sh = B[ref].get("shapes", {})
    if "chic" in sh and OPTIMUS_EVERY_ROUND in sh and "optimus" in sh:
        c, e, o = sh["chic"], sh[OPTIMUS_EVERY_ROUND], sh["optimus"]
        out.append(f"**Where Chic's gain comes from**: Optimus re-planning at every round (every arrival and "
                   f"completion, as Chic's triggers) instead of every 600 s is {_ratios(B, R, OPTIMUS_EVERY_ROUND)} x "
                   f"Optimus. At {ref} jobs/h Chic's jobs run on {c['workers']:.2f} workers and {c['ps']:.2f} PSs "
                   f"(time-weighted), Optimus-every-round's on {e['workers']:.2f} / {e['ps']:.2f}, Optimus' on "
                   f"{o['workers']:.2f} / {o['ps']:.2f}; they wait {c['wait_s']:.0f} / {e['wait_s']:.0f} / "
                   f"{o['wait_s']:.0f} s per job and run {c['run_s']:.0f} / {e['run_s']:.0f} / {o['run_s']:.0f} s. "
                   + ("So Chic plans shapes like Optimus' and gains by re-planning as soon as a job arrives instead of "
                      "leaving it waiting for the next 600 s re-plan." if c["run_s"] > 0.98 * e["run_s"] else
                      "So Chic gains by re-planning as soon as a job arrives instead of leaving it waiting for the next "
                      "600 s re-plan, and by running its jobs faster than Optimus' shapes do (the training table's g "
                      "column: the speeds each network plans with)."))
    spread = chic_setup()[0].ps_placement == "spread"
    if OPTIMUS_PLACED in B[R[0]]["policies"] and spread:
        out.append(f"**Optimus with the placed speeds**: {_ratios(B, R, OPTIMUS_PLACED)} x Optimus: the cluster "
                   "spreads PSs over every node, so the placed speeds are the measured ones (the row before).")
    elif OPTIMUS_PLACED in B[R[0]]["policies"]:
        same = all(B[r]["policies"][OPTIMUS_PLACED]["per_seq_s"] == B[r]["policies"][OPTIMUS_MEASURED]["per_seq_s"]
                   for r in R)
        out.append(f"**Optimus with the placed speeds**: planning on the measured speed at the PSs its workers' "
                   f"nodes host (the g of the placed Chic networks) it is {_ratios(B, R, OPTIMUS_PLACED)} x Optimus"
                   + (", the same ACT as on the measured speeds on every sequence" if same else "")
                   + ": its greedy adds the task of largest marginal gain one at a time, and on the placed speeds "
                   "the worker that makes room for more PSs first slows the job, so it is never added.")
    bound = {r: B[r]["policies"]["pair bound"]["ratio_optimus"] for r in R}
    need = 1 - SEED_CLAIM["chic-pair"] / 100
    out_of_reach = [r for r in R if bound[r] > need]
    txt = (f"**Chic-Pair against Optimus**: {_ratios(B, R, 'chic-pair')} x Optimus at {rates} jobs/h. The pair "
           f"bound is {' / '.join(f'{bound[r]:.3f}' for r in R)} x Optimus")
    if out_of_reach:
        txt += (f": the seed's {SEED_CLAIM['chic-pair']} % below Optimus (a ratio of {need:.3f}) is beyond what a "
                f"schedule of pairs reaches at {' / '.join(out_of_reach)} jobs/h, whatever its training (up to the "
                "start rule's slack)")
    txt += (". Chic-Pair's ACT is " + " / ".join(
        f"{B[r]['policies']['chic-pair']['act_s'] / B[r]['policies']['pair bound']['act_s']:.3f}" for r in R)
            + " x the bound. With the same network and condition (2) on Optimus' fitted form it is "
            + _ratios(B, R, PAIR_FITTED) + " x Optimus.")
    if "chic-pair" in sh:
        cp = sh["chic-pair"]
        txt += (f" At {ref} jobs/h its jobs run on {cp['workers']:.2f} workers and {cp['ps']:.2f} PSs for "
                f"{cp['run_s']:.0f} s (Chic: {sh['chic']['run_s']:.0f} s)." if "chic" in sh else "")
    out.append(txt)
    once = [r for r in R if B[r]["checkpoints"]["chic"] != B[r]["checkpoints"][ONCE["chic"]]]
    if once:
        out.append("**Per-rate training against the 1.8/h network**: at " + " / ".join(once) + " jobs/h Chic is "
                   + " / ".join(f"{B[r]['policies']['chic']['ratio_optimus']:.3f}" for r in once) + " x Optimus with "
                   "its own network and " + " / ".join(f"{B[r]['policies'][ONCE['chic']]['ratio_optimus']:.3f}" for r in once)
                   + " with the 1.8/h one.")
    return out


def markdown(res: dict, histories: dict[str, dict]) -> str:
    """The generated section (tables and the findings they support) of both documents."""
    R = [f"{r:g}" for r in res["rates"]]
    B = res["by_rate"]
    lines = [f"Test sequences: seeds {res['test_seeds'][0]}-{res['test_seeds'][1]} of `gen-elastic --setting chic` "
             f"({res.get('jobs', 30)} jobs each), {res['seqs']} per rate; cluster `data/clusters/chic.yaml`; 30 s resize pause. Each "
             "cell: mean average JCT over the sequences; in brackets the paired ratio to Optimus (mean +- 95 % "
             "t-interval half-width over the sequences). Chic / Chic-Pair: the network trained at that rate where one "
             "was shipped (the seed's Fig. 4(a)); \"(1.8/h)\": the one trained at 1.8 jobs/h (its Fig. 4(c)).", "",
             "| rate (jobs/h) | best baseline | Optimus | Optimus, measured g | Optimus, placed g | DRF | Tetris | Chic | "
             "Chic (1.8/h) | Chic-Pair | Chic-Pair (1.8/h) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in R:
        b = B[r]
        cells = [f"{b['policies']['optimus']['act_s']:.0f} s"]
        cells += [_cell(b["policies"][n]) for n in (*BASELINES[1:], "chic", ONCE["chic"], "chic-pair", ONCE["chic-pair"])]
        lines.append(f"| {r} | {b['best_baseline']} | " + " | ".join(cells) + " |")
    lines += ["", *[f"* {f}" for f in findings(res)]]
    lines += ["", "Checkpoints per rate: " + "; ".join(
        f"{r}: " + ", ".join(f"`{B[r]['checkpoints'][v]}`" for v in LEARNED) for r in R) + ".", "",
        "Against the best baseline and the seed's claim (ACT below Optimus; negative: above):", "",
        "| rate (jobs/h) | Chic / best baseline | Chic-Pair / best baseline | Chic below Optimus: ours | seed | "
        "Chic-Pair below Optimus: ours | seed |", "|---|---|---|---|---|---|---|"]
    for r in R:
        p = B[r]["policies"]
        lines.append(f"| {r} | {p['chic']['ratio_best']:.3f} +- {p['chic']['ratio_best_ci']:.3f} | "
                     f"{p['chic-pair']['ratio_best']:.3f} +- {p['chic-pair']['ratio_best_ci']:.3f} | "
                     f"{100 * (1 - p['chic']['ratio_optimus']):.1f} % | >= {SEED_CLAIM['chic']} % | "
                     f"{100 * (1 - p['chic-pair']['ratio_optimus']):.1f} % | >= {SEED_CLAIM['chic-pair']} % |")
    lines += ["", "What bounds Chic-Pair, what re-planning at every arrival and completion is worth to Optimus, and "
              "what condition (2) on the fitted form costs Chic-Pair (pair bound: every job alone from its arrival, "
              "never paused, at the fastest measured speed of any equal worker / PS count on 10 GPUs, the best a "
              "schedule of pairs can do; a new job here first runs on one worker with its planned PSs until the "
              "next round, the platform's start rule, so a policy can come slightly below it):", "",
              "| rate (jobs/h) | pair bound | Optimus, every round | Chic-Pair's network, g fitted |", "|---|---|---|---|"]
    for r in R:
        p = B[r]["policies"]
        lines.append(f"| {r} | {_cell(p['pair bound'])} | {_cell(p[OPTIMUS_EVERY_ROUND])} | {_cell(p[PAIR_FITTED])} |")
    ref = "1.8" if "1.8" in R else R[0]
    lines += ["", f"What each policy runs at {ref} jobs/h (all its sequences pooled; workers and PSs: per running job, "
              "weighted by time; resizes: ordered per job, each pauses the job 30 s; waiting: JCT minus running time; "
              "every rate in `chic_results.json`, `shapes`):", "",
              "| rate (jobs/h) | policy | workers | PSs | resizes / job | waiting (s / job) | running (s / job) |",
              "|---|---|---|---|---|---|---|"]
    for r in [ref]:
        for n, sh in B[r].get("shapes", {}).items():
            lines.append(f"| {r} | {n} | {sh['workers']:.2f} | {sh['ps']:.2f} | {sh['resizes_per_job']:.2f} | "
                         f"{sh['wait_s']:.0f} | {sh['run_s']:.0f} |")
    lines += ["", "Decision time per step (CPU time of the thread: mask + encode + network + choice of one answer in a "
              "decision phase, numpy, one process on this shared 2-core host, niced; seed: < 0.78 ms on one i5 core):", "",
              "| policy | steps timed | median | p99 | mean |", "|---|---|---|---|---|"]
    for n, d in res.get("decision_ms", {}).items():
        lines.append(f"| {n} | {d['steps']} | {d['median']:.3f} ms | {d['p99']:.3f} ms | {d['mean']:.3f} ms |")
    if histories:
        cl, _perf = chic_setup()
        lines += ["", "Training (the checkpoints above; `training` in their JSON, curves in `<name>-history.json` "
                  "beside them). The validation ACTs of training are on the cluster it ran on, whose PS placement "
                  f"(`ps_placement`) the fourth column names; the last two columns run the network and Optimus on "
                  f"the same validation sequences on `data/clusters/chic.yaml` (PSs {cl.ps_placement}):", "",
                  "| checkpoint | trained at (jobs/h) | g | PSs in training | iterations | trajectories / iteration | "
                  "best validation ACT (iteration) | Optimus there | training CPU time | validation ACT on chic.yaml | "
                  "Optimus there |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for stem, h in sorted(histories.items()):
            c = h["config"]
            cpu = h.get("train_cpu_seconds")
            cpu_s = f"{cpu / 60:.1f} min" if cpu is not None else f"{h['train_seconds'] / 60:.1f} min (wall)"
            lines.append(f"| {stem} | {c['rate']:g} | {c.get('g', 'fitted')} | {h.get('ps_placement', 'workers')} | "
                         f"{c['iterations']} | {c['n']} + 1 uniform | "
                         f"{h['best_val_act']:.0f} s ({h['best_iteration']}) | "
                         f"{h.get('optimus_val_act', float('nan')):.0f} s | {cpu_s} | "
                         f"{h.get('val_act_now', float('nan')):.0f} s | {h.get('optimus_val_now', float('nan')):.0f} s |")
    lines += ["", "![ACT vs arrival rate](figures/chic_act_vs_rate.png)"]
    if histories:
        lines += ["", "![Training curves](figures/chic_training.png)"]
    lines += ["", f"Evaluation (this table): {res.get('cpu_seconds', res['seconds']):.0f} s of CPU."]
    return "\n".join(lines)


def replace_section(path: Path, body: str) -> None:
    """Put ``body`` between the markers in ``path`` (appending the markers at the end when absent)."""
    path.write_text(replace_marked(path.read_text(), BEGIN, END, f"{BEGIN}\n{body}\n{END}"))


def main(out: Path, rates: Sequence[float], seqs: int, overrides: dict[str, str | None], docs: bool,
         progress: bool = True, root: Path = _ROOT, jobs_per_seq: int = 30) -> dict:
    """Evaluate, write ``out``'s files and, with ``docs``, the docs' sections and figures under ``root``."""
    out.mkdir(parents=True, exist_ok=True)
    res = evaluate(rates, seqs, overrides, progress, jobs_per_seq)
    hist = load_histories(res)
    for h in hist.values():
        c = h["config"]
        # a history without the key was trained with PSs on the worker nodes (the platform's only layout then)
        h["ps_placement"] = h.get("ps_placement", "workers")
        h["optimus_val_act"] = validation_act("optimus", c["rate"], c["val_seqs"], h["ps_placement"])
        h["val_act_now"] = validation_act(f"{c['variant']}:{h['checkpoint']}", c["rate"], c["val_seqs"])
        h["optimus_val_now"] = validation_act("optimus", c["rate"], c["val_seqs"])
    res["training"] = {n: {k: h.get(k) for k in ("best_iteration", "best_val_act", "train_seconds",
                                                  "train_cpu_seconds", "ps_placement", "optimus_val_act",
                                                  "val_act_now", "optimus_val_now")}
                       for n, h in hist.items()}
    (out / "chic_results.json").write_text(json.dumps(res, indent=1))
    figs = figures(res, hist, out)
    md = markdown(res, hist)
    (out / "chic_results.md").write_text(md + "\n")
    if docs:
        fig_dir = root / "docs" / "figures"
        fig_dir.mkdir(parents=True, exist_ok=True)
        for f in figs:
            shutil.copyfile(f, fig_dir / f.name)
        for doc in ("ELASTIC.md", "RESULTS.md"):
            replace_section(root / "docs" / doc, md)
    return res
