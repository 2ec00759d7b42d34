"""DL2 against DRF, Tetris and Optimus in DL2's setting (seed 000 section 6: 200 jobs on 500 servers of
2 GPUs, ``data/clusters/dl2.yaml``), on held-out sequences at several arrival rates, with paired
intervals, DL2's decision time per inference and its training curve: the DL2 section of
``docs/RESULTS.md`` and ``docs/ELASTIC.md`` by one command.

**Sequences.** For each seed (``--seed0`` onwards; 100.. are held out: training uses 1000.., validation
2000..) a ``gen-elastic --setting dl2`` sequence of ``--jobs`` jobs (:func:`trainer.elastic.generate`:
the per-slot arrival counts of DL2's Fig. 8(a)); for each arrival-rate factor ``k`` of ``--rates`` its
submit times are divided by ``k`` (:func:`scaled_sequence`), so the same jobs arrive ``k`` times as fast
(the seed runs that pattern "with arrival rates scaled down" and has no figure over rates; factor 1 is
its setting). Every policy runs every (factor, seed) with the PS performance model and a 30 s resize
pause; the same jobs under every policy make the comparison paired.

**Reported** (:func:`summarize`, :func:`markdown`): per factor, the mean arrival rate (jobs/h over the
sequence), each policy's average JCT (mean over seeds) and the paired ratio of the first DL2 policy's
JCT to each other policy's (mean and 95 % t-interval over seeds), the best baseline; each DL2 policy's
decision time (thread CPU time of its slot planning: mask, state, network, per inference and per
slot); the shipped checkpoint's training (its JSON header) and the selection it records.

**Outputs** (``--out DIR``, default ``out/dl2-results``): ``dl2_results.json`` (every number),
``dl2_results.md`` (the generated section), ``dl2_act_vs_rate.png`` (average JCT against arrival rate,
one line per policy, 95 % intervals over seeds) and ``dl2_training.png`` (the checkpoint's training
curve, :mod:`scripts.dl2_training_curve`); with ``--docs`` the figures go to ``docs/figures/`` and the
section replaces the text between ``<!-- dl2-results:begin -->`` and ``<!-- dl2-results:end -->`` in
``docs/RESULTS.md`` and ``docs/ELASTIC.md``. ``--reuse JSON...`` takes the runs of earlier
``dl2_results.json`` files (or of the ``dl2_results.partial.json`` a run writes after each sequence) that
match (same policy, a DL2 policy by its weights' sha256 whatever its label, factor, seed, job count) instead of
running them again; ``--from-json`` renders a saved result.

    PYTHONPATH=. nice -n 10 python3 benchmarks/dl2_eval.py --docs       # the docs' DL2 section
    PYTHONPATH=. nice -n 10 python3 benchmarks/dl2_eval.py --seed0 2000 --seeds 2 --rates 1 \\
        --policies new=dl2:RUN/dl2,shipped=dl2 --out out/dl2-val          # validation of a new run
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import shutil
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: the elastic baselines and FIFO, each job fixed at its submitted 1 worker and 1 PS (the best fixed-size heuristic
#: here: SRTF and LAS make the same decisions on these lightly loaded sequences, docs/ELASTIC.md "Results")
BASELINES = ("drf", "tetris", "optimus", "fifo")
#: The shipped network (per-row actor, Optimus warm-up, log-scaled remaining work, RL), its warm-up network, the
#: per-row actors after a 6-epoch and a 3-epoch DRF warm-up, the seed's flat network and a shorter flat run (kept
#: beside it), and the baselines; run from the repository root.
DEFAULT_POLICIES = ("dl2,dl2-wu=dl2:policies/checkpoints/dl2/dl2-wu,dl2-drf=dl2:policies/checkpoints/dl2/dl2-drf,"
                    "dl2-3ep=dl2:policies/checkpoints/dl2/dl2-3ep,"
                    "dl2-flat=dl2:policies/checkpoints/dl2/dl2-flat,dl2-40=dl2:policies/checkpoints/dl2/dl2-40,"
                    + ",".join(BASELINES))
DEFAULT_RATES = (1.0, 2.0, 4.0)
BEGIN, END = "<!-- dl2-results:begin -->", "<!-- dl2-results:end -->"
#: The seed's claims (section 6.3): average JCT below DRF and below Optimus (%), decision time (ms).
SEED_CLAIM = {"drf": 44.1, "optimus": 17.5, "inference_ms": 3.0}


def _ci(x: Sequence[float]) -> float:
    """95 % t-interval half-width of ``x`` (NaN for one value)."""
    from trainer.evaluate import mean_ci

    return mean_ci(list(x))[1]


def parse_policies(policies: str) -> list[tuple[str, str]]:
    """``LABEL=SPEC`` / ``SPEC`` items of a comma-separated list as ``(label, spec)``; ValueError (one line)
    for an empty list or a repeated label."""
    out = []
    for item in (x.strip() for x in policies.split(",") if x.strip()):
        label, eq, spec = item.partition("=")
        out.append((label.strip(), spec.strip()) if eq else (item, item))
    if not out:
        raise ValueError("--policies names no policy")
    labels = [a for a, _ in out]
    if len(set(labels)) != len(labels):
        raise ValueError(f"--policies repeats a label: {', '.join(labels)}")
    return out


def parse_rates(text: str) -> list[float]:
    """Comma-separated arrival-rate factors, each a finite number > 0; ValueError (one line) otherwise."""
    out = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        try:
            r = float(item)
        except ValueError:
            raise ValueError(f"--rates: {item!r} is not a number") from None
        if not (math.isfinite(r) and r > 0):
            raise ValueError(f"--rates: {item!r} must be a finite factor > 0")
        out.append(r)
    if not out:
        raise ValueError("--rates names no factor")
    return out


def scaled_sequence(seed: int, jobs: int, rate: float) -> tuple[list, float]:
    """The ``dl2`` sequence of ``seed`` with ``jobs`` jobs, its submit times divided by ``rate``; (job
    specs, mean arrival rate in jobs/h over the sequence)."""
    from trainer.elastic import generate, parse_elastic_trace

    doc = generate("dl2", seed=seed, jobs=jobs)
    for j in doc["jobs"]:
        j["submit_time"] = j["submit_time"] / rate
    t = [j["submit_time"] for j in doc["jobs"]]
    span = max(t) - min(t)
    per_h = 3600.0 * (len(t) - 1) / span if span > 0 else math.nan
    return parse_elastic_trace(doc), per_h


def policy_ids(policies: list[tuple[str, str]], cluster, perf) -> dict[str, str]:
    """What each label runs: its spec, and for a DL2 policy its weights' sha256 (``dl2`` names whatever
    checkpoint is shipped). Building each policy here also refuses a bad name or checkpoint before any run."""
    from policies.dl2 import DL2Policy
    from policies.registry import make_policy

    out = {}
    for label, spec in policies:
        pol = make_policy(spec, cluster, perf)
        out[label] = f"{spec} sha256:{pol.weights_sha256}" if isinstance(pol, DL2Policy) else spec
    return out


def _same(pid: str) -> str:
    """What decides that two runs are of the same policy: a DL2 policy's weights (whatever its label or
    path), else the spec."""
    spec, sep, sha = pid.partition(" sha256:")
    return f"dl2 sha256:{sha}" if sep else spec


def run_sequence(seq: list, policies: list[tuple[str, str]], cluster, perf, on_policy=None) -> tuple[dict, dict, dict]:
    """Average JCT (s) per label on ``seq``; per DL2 label its planning's thread CPU seconds, inferences
    and slots; per label the process CPU seconds of its simulation."""
    from policies.dl2 import DL2Policy
    from policies.registry import make_policy
    from trainer.simulator import SimConfig, Simulator

    jct, timing, cpu = {}, {}, {}
    for label, spec in policies:
        c0 = time.process_time()
        pol = make_policy(spec, cluster, perf)
        spent, slots = [0.0], [0]
        if isinstance(pol, DL2Policy):
            inner = pol.plan

            def timed(jobs_, cap, state, inner=inner, spent=spent, slots=slots):
                t = time.thread_time()
                inner(jobs_, cap, state)
                spent[0] += time.thread_time() - t
                slots[0] += 1

            pol.plan = timed
        res = Simulator(cluster, seq, pol, perf, SimConfig()).run()
        jct[label] = float(np.mean([r.jct for r in res.jobs]))
        if isinstance(pol, DL2Policy):
            timing[label] = {"plan_cpu_s": spent[0], "inferences": pol.inferences, "slots": slots[0]}
        cpu[label] = round(time.process_time() - c0, 2)
        if on_policy:
            on_policy(label, jct[label])
    return jct, timing, cpu


def evaluate(rates: Sequence[float], seeds: int, seed0: int, jobs: int, policies: list[tuple[str, str]],
             progress: bool = True, log=print, reuse: dict | None = None, partial: Path | None = None) -> dict:
    """Run every policy on every (seed, rate factor), seed by seed; the per-run results (module docstring).
    ``reuse``: earlier results (one or a list) whose runs of the same policy (:func:`policy_ids`; a DL2
    policy by its weights, whatever its label), factor, seed and job count are taken from them instead of
    being run again (only from results of the same job count and the same PS layout, ``ps_placement``
    of the cluster file). ``partial``: the results so far are
    written there after each sequence (a ``reuse`` file for a run that was stopped)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from policies.cluster import ClusterSpec
    from policies.perf import ContentionModel
    from policies.psmodel import PSPerformanceModel

    cluster = ClusterSpec.parse(str(ROOT / "data" / "clusters" / "dl2.yaml"))
    perf = PSPerformanceModel(ContentionModel(cluster))
    out: dict = {"rates": list(rates), "seeds": list(range(seed0, seed0 + seeds)), "jobs": jobs,
                 "policies": [list(p) for p in policies], "cluster": "data/clusters/dl2.yaml",
                 "ps_placement": cluster.ps_placement, "runs": []}
    ids = policy_ids(policies, cluster, perf)
    out["policy_ids"], out["reused"] = ids, 0
    old: dict = {}  # (rate, seed, what runs) -> (JCT, DL2 timing, CPU s) of the reused results
    for prev in ([reuse] if isinstance(reuse, dict) else list(reuse or [])):
        # runs of another job count or PS layout are other experiments (a file without the layout: workers)
        if prev.get("jobs") != jobs or prev.get("ps_placement", "workers") != cluster.ps_placement:
            continue
        rids = prev.get("policy_ids") or {}
        for r in prev.get("runs", []):
            for label in r["jct"]:
                if label in rids:
                    old[(r["rate"], r["seed"], _same(rids[label]))] = (
                        r["jct"][label], r["timing"].get(label), (r.get("cpu_s") or {}).get(label))
    c0 = time.process_time()
    with Progress(TextColumn("dl2-eval {task.fields[info]}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  disable=not progress) as bar:
        task = bar.add_task("", total=len(rates) * seeds * len(policies), info="")
        for seed in out["seeds"]:
            for rate in rates:
                seq, per_h = scaled_sequence(seed, jobs, rate)

                def done(label, jct, rate=rate, seed=seed):
                    bar.update(task, advance=1, info=f"x{rate:g} seed {seed}: {label} {jct:.0f} s")
                    if not progress:
                        log(f"x{rate:g} seed {seed}: {label} {jct:.0f} s")

                todo = [p for p in policies if (rate, seed, _same(ids[p[0]])) not in old]
                jct, timing, cpu = run_sequence(seq, todo, cluster, perf, on_policy=done)
                for label, _spec in policies:
                    if label in jct:
                        continue
                    jct[label], t, cpu[label] = old[(rate, seed, _same(ids[label]))]
                    out["reused"] += 1
                    if t is not None:
                        timing[label] = t
                    done(label, jct[label])
                out["runs"].append({"rate": rate, "seed": seed, "jobs_per_h": per_h,
                                    "jct": {p[0]: jct[p[0]] for p in policies},
                                    "timing": {p[0]: timing[p[0]] for p in policies if p[0] in timing},
                                    "cpu_s": {p[0]: cpu[p[0]] for p in policies}})
                if partial is not None:
                    partial.parent.mkdir(parents=True, exist_ok=True)
                    partial.write_text(json.dumps(out, indent=1))
    out["cpu_s"] = round(time.process_time() - c0, 1)
    return out


def summarize(res: dict) -> dict:
    """Per rate factor: mean jobs/h, each policy's mean JCT and 95 % half-width over seeds, the first DL2
    label's paired JCT ratio to each other policy; the best baseline; each DL2 label's decision times."""
    labels = [p[0] for p in res["policies"]]
    dl2 = [k for k in labels if any(k in r["timing"] for r in res["runs"])]
    ref = dl2[0] if dl2 else None
    base = [k for k in labels if k not in dl2]
    out: dict = {"ref": ref, "dl2": dl2, "baselines": base, "by_rate": {}}
    for rate in res["rates"]:
        runs = sorted((r for r in res["runs"] if r["rate"] == rate), key=lambda r: r["seed"])
        b: dict = {"jobs_per_h": float(np.mean([r["jobs_per_h"] for r in runs])), "seeds": [r["seed"] for r in runs],
                   "policies": {}}
        for k in labels:
            jct = [r["jct"][k] for r in runs]
            d = {"jct": float(np.mean(jct)), "jct_ci": _ci(jct), "per_seed": jct}
            if ref is not None and k != ref:
                ratio = [r["jct"][ref] / r["jct"][k] for r in runs]
                d["ratio"], d["ratio_ci"] = float(np.mean(ratio)), _ci(ratio)
            b["policies"][k] = d
        if base:
            b["best_baseline"] = min(base, key=lambda k: b["policies"][k]["jct"])
        out["by_rate"][f"{rate:g}"] = b
    out["decision"] = {}
    for k in dl2:
        t = [r["timing"][k] for r in res["runs"] if k in r["timing"]]
        spent, inf, slots = (sum(x[f] for x in t) for f in ("plan_cpu_s", "inferences", "slots"))
        out["decision"][k] = {"inferences": inf, "slots": slots, "ms_per_inference": 1e3 * spent / max(inf, 1),
                              "ms_per_slot": 1e3 * spent / max(slots, 1)}
    return out


def _curve_module():
    spec = importlib.util.spec_from_file_location("dl2_training_curve", ROOT / "scripts" / "dl2_training_curve.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def checkpoint_of(res: dict) -> Path:
    """The checkpoint JSON of the first DL2 label (``dl2`` is the shipped one)."""
    from policies.checkpoint import checkpoint_of_name
    from policies.dl2 import shipped_dl2

    s = summarize(res)
    spec = dict(map(tuple, res["policies"])).get(s["ref"] or "", "dl2")
    ck = checkpoint_of_name(spec, "dl2") or shipped_dl2()
    ck = Path(ck)
    return ck if ck.suffix == ".json" else ck.with_name(ck.name + ".json")


def act_figure(res: dict, path: Path) -> None:
    """Average JCT (h) against arrival rate (jobs/h), one line per policy, 95 % intervals over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = summarize(res)
    rates = [f"{r:g}" for r in res["rates"]]
    x = [s["by_rate"][r]["jobs_per_h"] for r in rates]
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for k, (label, _spec) in enumerate(res["policies"]):
        y = [s["by_rate"][r]["policies"][label]["jct"] / 3600 for r in rates]
        e = [s["by_rate"][r]["policies"][label]["jct_ci"] / 3600 for r in rates]
        e = [0.0 if not math.isfinite(v) else v for v in e]
        ax.errorbar(x, y, yerr=e, marker="os^vD<>"[k % 7], capsize=3, label=label)
    ax.set(xlabel="mean arrival rate (jobs/h; DL2's Fig. 8(a) pattern x " + ", ".join(rates) + ")",
           ylabel="average JCT (h)",
           title=f"DL2's setting: {res['jobs']} jobs, {len(res['seeds'])} held-out sequences per rate")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    _curve_module().save_png(fig, path)


def _fmt_ratio(d: dict) -> str:
    ci = d.get("ratio_ci", math.nan)
    return f"{d['ratio']:.3f} +- {ci:.3f}" if math.isfinite(ci) else f"{d['ratio']:.3f}"


def _warmup_words(c: dict, h: dict) -> str:
    """The warm-up of a run with training config ``c`` and history ``h``, in words."""
    feats = [f"`--{k} {c[k]}`" for k in ("remaining", "counts") if c.get(k, "linear") != "linear"]
    return (("the per-row actor (`--arch rows`, row scorer " + "x".join(str(x) for x in c.get("hidden") or [])
             + (", " + ", ".join(feats) if feats else "") + "); " if c.get("arch") == "rows" else
             ("; ".join(feats) + "; " if feats else ""))
            + f"{c.get('sl_traces')} {'Optimus' if c.get('teacher') == 'optimus' else 'DRF'} "
            f"episode{'' if c.get('sl_traces') == 1 else 's'} of {c.get('jobs')} jobs for the warm-up "
            f"({c.get('sl_epochs')} epochs, imitation cross-entropy "
            + (f"{h['sl_loss'][0]:.3f} -> {h['sl_loss'][-1]:.3f}" if h.get("sl_loss") else "-") + ")")


def _rl_words(c: dict, h: dict) -> str:
    """The RL episodes of one run (training config ``c``, history ``h``), in words."""
    rl = h.get("rl") or []
    if not rl:
        return "no RL episode"
    updates = sum(int(e.get("updates") or 0) for e in rl)
    stab = [f"{k} {c[k]}" for k in ("target_tau", "adv_norm", "clip", "critic_lr") if c.get(k)]
    beta = f"entropy weight {c.get('beta')}" + (f" -> {c.get('beta_end')}" if (c.get("beta_end") or -1) >= 0 else "")
    act = ("acting greedily, sampling with probability " + str(c.get("sample_p")) if c.get("behaviour") == "greedy"
           else "sampling its actions")
    return (f"{len(rl)} RL episodes of {c.get('jobs')} jobs (training sequences from seed "
            f"{c.get('seed0', 0) + c.get('sl_traces', 0)}; {updates} actor-critic updates, {c.get('updates', 1)} per "
            f"slot, {act}, " + ("exploring toward +1 PS" if c.get("explore") == "ps" else "the seed's job-aware exploration")
            + f", actor learning rate {c.get('rl_lr')}, {beta}" + (", " + ", ".join(stab) if stab else "") + ")")


def _training_lines(meta: dict) -> list[str]:
    tr = meta.get("training") or {}
    c, h = tr.get("config") or {}, tr.get("history") or {}
    rl = h.get("rl") or []
    lines = []
    par = h.get("parent") if isinstance(h.get("parent"), dict) else None
    if c and par:
        # the chain of runs, each started (--init) from the network the one before kept; the first has the warm-up
        chain = [tr]
        while isinstance((chain[0].get("history") or {}).get("parent"), dict):
            chain.insert(0, chain[0]["history"]["parent"])
        steps = []
        for k, run in enumerate(chain):
            rc, rh = run.get("config") or {}, run.get("history") or {}
            head = f"{_warmup_words(rc, rh)}, validation JCT {rh.get('val_warmup_jct', math.nan):.0f} s; " if k == 0 else ""
            steps.append(head + f"{_rl_words(rc, rh)}, kept: {run.get('selected')} (validation JCT "
                         f"{run.get('val_jct', math.nan):.0f} s)")
        cpus = [run.get("cpu_s") for run in chain]
        lines += [
            f"Training of this checkpoint (`training` in its JSON): {len(chain)} `train-dl2` runs, each started "
            f"(`--init`) from the network the one before kept: " + "; then ".join(f"({k + 1}) {x}" for k, x in enumerate(steps))
            + f"; validation on {c.get('val_seeds')} sequences of {c.get('jobs')} jobs (seeds 2000..); "
            + (f"{sum(cpus) / 60:.1f} min of CPU in all." if all(isinstance(x, (int, float)) for x in cpus)
               else "CPU time not recorded for every run.")]
    elif c:
        updates = sum(int(e.get("updates") or 0) for e in rl)
        cpu = tr.get("cpu_s")
        lines += [
            f"Training of this checkpoint (`training` in its JSON): {_warmup_words(c, h)}"
            + (f", then no RL episode completed" if not rl else
               f", then {len(rl)} RL episodes of {c.get('jobs')} jobs with {updates} actor-critic updates")
            + (" (one per slot" if rl else " (RL configured")
            + (", acting greedily, sampling with probability " + str(c.get("sample_p"))
               if c.get("behaviour") == "greedy" else "")
            + (", exploring toward +1 PS" if c.get("explore") == "ps" else "") + ")"
            + ("" if tr.get("complete", True) else f" (of {c.get('rl_episodes')} planned: the run was stopped; "
               "`complete` is false)")
            + f"; validation on {c.get('val_seeds')} sequences of {c.get('jobs')} jobs (seeds 2000..); "
            f"kept: {tr.get('selected')} (validation JCT {tr.get('val_jct', math.nan):.0f} s); "
            + (f"{cpu / 60:.1f} min of CPU." if isinstance(cpu, (int, float)) else
               f"{tr.get('cpu_wall_s', math.nan) / 60:.1f} min wall (CPU time not recorded).")]
    sel = meta.get("selection") or {}
    vals = sel.get("avg_jct_s") or sel.get("mean_avg_jct_s") or {}
    if vals:
        what = "average JCT" if sel.get("avg_jct_s") else "average JCT, mean over the sequences"
        parts = "; ".join(f"{k}: " + " / ".join(f"{v:,.0f}" for v in (vs if isinstance(vs, list) else [vs])) + " s"
                          for k, vs in vals.items())
        lines += ["", f"Selection (`selection` in its JSON): {sel.get('rule')}; {sel.get('validation')}; {what}: "
                  f"{parts}."]
    return lines


def _run_cpu(res: dict) -> float:
    """CPU seconds of every simulation of ``res`` (reused runs counted at their own measurement)."""
    return float(sum(v for r in res["runs"] for v in (r.get("cpu_s") or {}).values() if v is not None))


def markdown(res: dict, meta: dict, ckpt: Path) -> str:
    """The generated section (tables, figure links) of results ``res`` and the checkpoint header ``meta``."""
    s = summarize(res)
    ref, labels = s["ref"], [p[0] for p in res["policies"]]
    specs = ", ".join(f"{a}" if a == b else f"{a} = `{b}`" for a, b in res["policies"])
    try:
        rel = ckpt.resolve().relative_to(ROOT)
    except ValueError:
        rel = ckpt
    lines = [f"Held-out sequences: seeds {res['seeds'][0]}-{res['seeds'][-1]} of `gen-elastic --setting dl2` "
             f"({res['jobs']} jobs each) at arrival-rate factors {', '.join(f'{r:g}' for r in res['rates'])} "
             f"(submit times / factor); cluster `{res['cluster']}`; 30 s resize pause; policies {specs}"
             f" (`{ref}`: `{rel}`). Each cell: mean average JCT over the {len(res['seeds'])} sequences; in brackets "
             f"{ref}'s JCT / the policy's (paired, mean +- 95 % t-interval half-width; < 1: {ref} faster). "
             f"{_run_cpu(res) / 60:.0f} min of CPU for all the simulations.", "",
             "| factor | jobs/h | best baseline | " + " | ".join(labels) + " |",
             "|---|---|---|" + "---|" * len(labels)]
    for r, b in s["by_rate"].items():
        cells = []
        for k in labels:
            d = b["policies"][k]
            cells.append(f"{d['jct']:,.0f} s" + (f" ({_fmt_ratio(d)})" if "ratio" in d else ""))
        lines.append(f"| {r} | {b['jobs_per_h']:.2f} | {b.get('best_baseline', '-')} | " + " | ".join(cells) + " |")
    if ref and any(k in labels for k in ("drf", "optimus")):
        lines += ["", f"Against the seed's claim (average JCT of {ref} below the baseline's, from the paired "
                  "ratio; negative: above):", "", "| factor | below DRF: ours | seed | below Optimus: ours | seed |",
                  "|---|---|---|---|---|"]
        for r, b in s["by_rate"].items():
            def pct(k):
                return f"{100 * (1 - b['policies'][k]['ratio']):.1f} %" if k in b["policies"] else "-"

            lines.append(f"| {r} | {pct('drf')} | {SEED_CLAIM['drf']} % | {pct('optimus')} | {SEED_CLAIM['optimus']} % |")
    lines += ["", "Per sequence (average JCT, s):", "",
              "| factor | seed | " + " | ".join(labels) + " |", "|---|---|" + "---|" * len(labels)]
    for run in sorted(res["runs"], key=lambda x: (x["rate"], x["seed"])):
        lines.append(f"| {run['rate']:g} | {run['seed']} | " + " | ".join(f"{run['jct'][k]:,.0f}" for k in labels) + " |")
    lines += ["", "Decision time (thread CPU time of the slot planning: mask, state update, network, choice; "
              f"one process on the shared 2-core host, niced; seed: < {SEED_CLAIM['inference_ms']:g} ms per inference):",
              "", "| policy | inferences | slots | per inference | per slot |", "|---|---|---|---|---|"]
    for k, d in s["decision"].items():
        lines.append(f"| {k} | {d['inferences']:,} | {d['slots']:,} | {d['ms_per_inference']:.3f} ms | "
                     f"{d['ms_per_slot']:.1f} ms |")
    tl = _training_lines(meta)
    if tl:
        lines += ["", *tl]
    lines += ["", "![DL2: average JCT against arrival rate](figures/dl2_act_vs_rate.png)", "",
              "![DL2 training curve](figures/dl2_training.png)"]
    return "\n".join(lines)


def write_outputs(res: dict, out: Path, docs: bool, docs_dir: Path = ROOT / "docs") -> str:
    """Write ``out``'s JSON, section and figures (module docstring); with ``docs`` also the docs' section
    and figures under ``docs_dir``. Returns the section."""
    from trainer.outputs import replace_marked

    out.mkdir(parents=True, exist_ok=True)
    ckpt = checkpoint_of(res)
    meta = json.loads(ckpt.read_text(encoding="utf-8"))
    (out / "dl2_results.json").write_text(json.dumps({**res, "summary": summarize(res)}, indent=1))
    act_figure(res, out / "dl2_act_vs_rate.png")
    curve = _curve_module()
    curve.draw(curve.read_history(ckpt), out / "dl2_training.png")
    md = markdown(res, meta, ckpt)
    (out / "dl2_results.md").write_text(md + "\n")
    if docs:
        (docs_dir / "figures").mkdir(parents=True, exist_ok=True)
        for f in ("dl2_act_vs_rate.png", "dl2_training.png"):
            shutil.copyfile(out / f, docs_dir / "figures" / f)
        for name in ("RESULTS.md", "ELASTIC.md"):
            p = docs_dir / name
            p.write_text(replace_marked(p.read_text(), BEGIN, END, f"{BEGIN}\n{md}\n{END}"))
    return md


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3, help="sequences per rate (seeds SEED0..SEED0+N-1)")
    ap.add_argument("--seed0", type=int, default=100, help="first seed (default 100: held out; training uses "
                    "1000.., validation 2000..)")
    ap.add_argument("--jobs", type=int, default=200, help="jobs per sequence (the seed's 200)")
    ap.add_argument("--rates", default=",".join(f"{r:g}" for r in DEFAULT_RATES),
                    help="arrival-rate factors of DL2's pattern (default: %(default)s)")
    ap.add_argument("--policies", default=DEFAULT_POLICIES,
                    help="comma-separated policies, LABEL=SPEC to label one (default: %(default)s)")
    ap.add_argument("--out", type=Path, default=Path("out/dl2-results"), help="directory for the JSON, section, figures")
    ap.add_argument("--from-json", type=Path, help="render the outputs of a dl2_results.json, run nothing")
    ap.add_argument("--docs", action="store_true", help="also write the section and figures into docs/")
    ap.add_argument("--reuse", type=Path, nargs="+", help="dl2_results.json files whose runs of the same policies "
                    "(DL2: the same weights), factors, seeds and job count are taken instead of run again")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    try:
        if args.seeds < 1 or args.jobs < 1:
            raise ValueError(f"--seeds and --jobs must be >= 1, got {args.seeds} and {args.jobs}")
        if args.from_json:
            res = json.loads(args.from_json.read_text(encoding="utf-8"))
            res.pop("summary", None)
        else:
            reuse = [json.loads(f.read_text(encoding="utf-8")) for f in args.reuse or ()]
            res = evaluate(parse_rates(args.rates), args.seeds, args.seed0, args.jobs, parse_policies(args.policies),
                           progress=not args.no_progress, reuse=reuse, partial=args.out / "dl2_results.partial.json")
        print(write_outputs(res, args.out, args.docs))
    except (ValueError, OSError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        print(f"dl2_eval: {why}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
