"""SCED2's results: the shipped ``sced2`` against FIFO / SIF / LRF (each with packing) and the project's
heuristics on held-out Philly-derived test sequences, with paired intervals; a load sweep; decision
latency at 15x8 and 128x8. Writes ``docs/SCED2_RESULTS.md`` (and prints it).

    nice -n 10 python3 scripts/sced2_results.py [--sequences 20] [--jobs 1000] [--out docs/SCED2_RESULTS.md]

Sequences: :func:`trainer.sced2.sequences.sample_sequence` with the test seeds
(:data:`~trainer.sced2.sequences.TEST_SEEDS`, never used in training or validation), 15x8, load 1.0,
68 % 1-GPU jobs. Every policy runs in the simulator with ``rlsched simulate``'s defaults
(:class:`~trainer.simulator.SimConfig`: 300 s rounds plus a round at every arrival / completion).

Paired intervals: per sequence the ratio ``metric(baseline) / metric(sced2)`` (above 1: sced2 better);
mean and 95 % Student-t interval over the sequences. "Best of FIFO/SIF/LRF" is chosen per metric
as the baseline with the lowest mean over the sequences (the seed's "best among the baselines").
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from policies.base import Policy  # noqa: E402
from policies.cluster import ClusterSpec  # noqa: E402
from policies.codecs.sced2 import Sced2Codec  # noqa: E402
from policies.state import Decision  # noqa: E402
from policies.perf import ContentionModel  # noqa: E402
from policies.registry import make_policy  # noqa: E402
from trainer.sced2.compare import t_interval as _interval  # noqa: E402
from trainer.sced2.sequences import TEST_SEEDS, philly_pool, sample_sequence  # noqa: E402
from trainer.outputs import replace_marked  # noqa: E402
from trainer.simulator import SimConfig, Simulator  # noqa: E402

SEED_BASELINES = ("fifo", "sif", "lrf")
PROJECT = ("srtf", "las", "greedy")
#: reference without learning: SIF restricted to the jobs sced2 sees (the first J = 10 by arrival)
WINDOW = "sif-w10"


class WindowSIF(Policy):
    """SIF over SCED2's window: repeatedly start, on SCED2's packing, the job of shortest ideal time
    among the first ``J`` waiting jobs by arrival that fits, until none fits. It sees exactly the jobs
    sced2 sees and never holds: how far selection within the window goes without learning."""

    name = WINDOW
    time_invariant = True

    def __init__(self, cluster: ClusterSpec, perf) -> None:
        self.codec = Sced2Codec(cluster, perf)

    def schedule(self, state):
        dec = Decision()
        rnd = self.codec.begin(state)
        while True:
            enc = rnd.encode(dense=False)
            ok = [i for i in range(len(enc.jobs)) if enc.mask[i]]
            if not ok:
                return dec
            i = min(ok, key=lambda i: (enc.jobs[i].total_time, enc.jobs[i].submit_time, enc.jobs[i].job_id))
            choice = enc.decode(i)
            rnd.place(*choice)
            dec.place.append(choice)


#: the policy name run as "sced2" (``sced2:/path`` with --checkpoint)
SCED2 = {"name": "sced2"}


def run(policy: str, cluster: ClusterSpec, jobs, perf) -> dict[str, float]:
    if policy == WINDOW:
        pol = WindowSIF(cluster, perf)
    else:
        pol = make_policy(SCED2["name"] if policy == "sced2" else policy, cluster, perf)
    t0 = time.process_time()
    res = Simulator(cluster, jobs, pol, perf, SimConfig()).run()
    f = np.asarray(res.samples_frag, float)
    used = np.asarray(res.util_used, float)
    tt = np.append(np.asarray(res.util_t, float), res.makespan)
    util = float((used * np.diff(tt)).sum() / (cluster.total_gpus * res.makespan)) if res.makespan > 0 else 0.0
    return {
        "avg_jct": float(np.mean([r.jct for r in res.jobs])),
        "makespan": float(res.makespan),
        "avg_wait": float(np.mean([r.queueing for r in res.jobs])),
        "avg_run": float(np.mean([r.run_time for r in res.jobs])),
        "effectiveness": float(np.mean([r.ideal_time / r.jct for r in res.jobs])),
        "frag": float(f[np.isfinite(f)].mean()) if f.size else math.nan,
        "util": util,
        "cpu_s": time.process_time() - t0,
    }


def table(results: dict[str, list[dict[str, float]]], names: list[str]) -> list[str]:
    out = ["| policy | avg JCT (h) | makespan (h) | avg wait (h) | avg run (h) | effectiveness | mean frag | util (%) |",
           "|---|---|---|---|---|---|---|---|"]
    for n in names:
        r = results[n]
        m = {k: float(np.mean([x[k] for x in r])) for k in r[0]}
        out.append(f"| {n} | {m['avg_jct'] / 3600:.2f} | {m['makespan'] / 3600:.2f} | {m['avg_wait'] / 3600:.2f} | "
                   f"{m['avg_run'] / 3600:.2f} | {m['effectiveness']:.3f} | {m['frag']:.3f} | {100 * m['util']:.1f} |")
    return out


def paired(results: dict[str, list[dict[str, float]]], pool: tuple[str, ...], label: str) -> list[str]:
    lines = []
    for key, what in (("avg_jct", "average JCT"), ("makespan", "makespan")):
        best = min(pool, key=lambda n: np.mean([x[key] for x in results[n]]))
        ratio = np.asarray([b[key] / s[key] for b, s in zip(results[best], results["sced2"])])
        lines.append(f"* {what}: best of {label} is **{best}**; {best} / sced2 = {_interval(ratio)} "
                     f"(paired over {len(ratio)} sequences; > 1: sced2 better)")
    return lines


def latency(shape: str, jobs_n: int, seed: int, load: float) -> str:
    cluster = ClusterSpec.parse(shape)
    perf = ContentionModel(cluster)
    pool = philly_pool(cluster)
    jobs = sample_sequence(pool, cluster, jobs_n, seed, load=load, perf=perf)
    pol = make_policy(SCED2["name"], cluster, perf)
    times: list[float] = []
    cpu: list[float] = []
    inner = pol.schedule

    def timed(state):
        t0, c0 = time.perf_counter(), time.thread_time()
        d = inner(state)
        times.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
        return d

    pol.schedule = timed  # type: ignore[method-assign]
    Simulator(cluster, jobs, pol, perf, SimConfig()).run()
    t = np.asarray(times) * 1e3
    c = np.asarray(cpu) * 1e3
    return (f"| {shape} | {len(t)} | {np.percentile(t, 50):.2f} | {np.percentile(t, 99):.2f} | {t.max():.2f} | "
            f"{np.percentile(c, 50):.2f} | {np.percentile(c, 99):.2f} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sequences", type=int, default=20)
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--sweep-sequences", type=int, default=5)
    ap.add_argument("--sweep-jobs", type=int, default=1000)
    ap.add_argument("--loads", default="0.5,1.0,1.5,2.0")
    ap.add_argument("--out", default=str(REPO / "docs" / "SCED2_RESULTS.md"))
    ap.add_argument("--results-md", default=str(REPO / "docs" / "RESULTS.md"),
                    help="also replace the SCED2 block of this file ('' to skip)")
    ap.add_argument("--checkpoint", default=None, help="sced2 checkpoint (default: the shipped one)")
    a = ap.parse_args(argv)
    if a.checkpoint:
        SCED2["name"] = f"sced2:{a.checkpoint}"
    t_start = time.time()
    cluster = ClusterSpec.parse("15x8")
    perf = ContentionModel(cluster)
    pool = philly_pool(cluster)
    names = ["sced2", *SEED_BASELINES, *PROJECT, WINDOW]
    seeds = list(TEST_SEEDS[: a.sequences])
    results: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    for s in seeds:
        jobs = sample_sequence(pool, cluster, a.jobs, s, perf=perf)
        for n in names:
            results[n].append(run(n, cluster, jobs, perf))
        print(f"sequence {s} done ({time.time() - t_start:.0f} s)", file=sys.stderr)
    headline = [
        f"15x8, {len(seeds)} held-out Philly-derived sequences of {a.jobs} jobs (load 1.0), means:",
        "",
        *table(results, names),
        "",
        *paired(results, SEED_BASELINES, "FIFO / SIF / LRF"),
        *paired(results, (*SEED_BASELINES, *PROJECT), "all heuristics here"),
    ]
    lines = [
        "# SCED2 results (generated)",
        "",
        "Written by `nice -n 10 python3 scripts/sced2_results.py"
        + (f" --sequences {a.sequences}" if a.sequences != 20 else "")
        + (f" --jobs {a.jobs}" if a.jobs != 1000 else "")
        + "`; design and discussion in docs/SCED2.md.",
        "",
        f"## Test sequences: 15x8, {len(seeds)} Philly-derived sequences of {a.jobs} jobs (test seeds "
        f"{seeds[0]}..{seeds[-1]}), load 1.0, 68 % 1-GPU",
        "",
        "Means over the sequences (effectiveness: the seed's eq. 2 with the simulated JCT, ideal time / JCT; "
        f"{WINDOW}: SIF over the first 10 waiting jobs by arrival, the jobs sced2 sees, no learning):",
        "",
        *table(results, names),
        "",
        "Paired ratios (95 % t-intervals over the sequences):",
        "",
        *paired(results, SEED_BASELINES, "FIFO / SIF / LRF"),
        *paired(results, (*SEED_BASELINES, *PROJECT), "all heuristics here"),
        "",
    ]
    loads = [float(x) for x in a.loads.split(",") if x.strip()]
    if loads and a.sweep_sequences > 0:
        lines += [f"## Load sweep: {a.sweep_sequences} test sequences of {a.sweep_jobs} jobs per load, 15x8", "",
                  "| load | sced2 avg JCT (h) | best of FIFO/SIF/LRF | its avg JCT (h) | ratio best / sced2 (JCT) | "
                  "ratio (makespan) |", "|---|---|---|---|---|---|"]
        for load in loads:
            res: dict[str, list[dict[str, float]]] = {n: [] for n in ("sced2", *SEED_BASELINES)}
            for s in seeds[: a.sweep_sequences]:
                jobs = sample_sequence(pool, cluster, a.sweep_jobs, s, load=load, perf=perf)
                for n in res:
                    res[n].append(run(n, cluster, jobs, perf))
            best = min(SEED_BASELINES, key=lambda n: np.mean([x["avg_jct"] for x in res[n]]))
            rj = np.asarray([b["avg_jct"] / s_["avg_jct"] for b, s_ in zip(res[best], res["sced2"])])
            rm = np.asarray([b["makespan"] / s_["makespan"] for b, s_ in zip(res[best], res["sced2"])])
            lines.append(f"| {load:g} | {np.mean([x['avg_jct'] for x in res['sced2']]) / 3600:.2f} | {best} | "
                         f"{np.mean([x['avg_jct'] for x in res[best]]) / 3600:.2f} | {_interval(rj)} | {_interval(rm)} |")
            print(f"load {load} done ({time.time() - t_start:.0f} s)", file=sys.stderr)
        lines.append("")
    lines += ["## Decision latency of `sced2` (one `schedule` call, ms, on this shared 2-core host under load)", "",
              "Wall time includes waiting for a core on the shared host; thread CPU time is the work itself.", "",
              "| cluster | calls | wall p50 | wall p99 | wall max | CPU p50 | CPU p99 |", "|---|---|---|---|---|---|---|",
              latency("15x8", 500, TEST_SEEDS[0], 1.0), latency("128x8", 2000, TEST_SEEDS[0], 1.0), "",
              f"Total wall time of this script: {time.time() - t_start:.0f} s.", ""]
    text = "\n".join(lines)
    Path(a.out).write_text(text)
    if a.results_md:
        _update_results_md(Path(a.results_md), headline, Path(a.out))
    print(text)
    return 0


BEGIN, END = "<!-- sced2-results:begin -->", "<!-- sced2-results:end -->"


def _update_results_md(path: Path, headline: list[str], full: Path) -> None:
    """Replace the block between :data:`BEGIN` and :data:`END` of ``path`` (docs/RESULTS.md) with the headline."""
    text = path.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{path}: no {BEGIN} ... {END} block to replace")
    rel = full.resolve().relative_to(REPO) if full.resolve().is_relative_to(REPO) else full
    block = "\n".join([BEGIN, "", *headline, "", f"All tables (load sweep, latency): `{rel}`.", "", END])
    path.write_text(replace_marked(text, BEGIN, END, block))


if __name__ == "__main__":
    raise SystemExit(main())
