"""rlsched beside the peers' own simulators: regenerates ``docs/FIDELITY.md`` and the seed-claim table of
``docs/RESULTS.md``.

Usage (from the repository root)::

    python benchmarks/peers.py --deepshare /path/to/deepshare-checkout \\
        [--out docs/FIDELITY.md] [--results-md docs/RESULTS.md] [--json docs/fidelity_results.json] [--jobs 2]
    python benchmarks/peers.py --from-json docs/fidelity_results.json   # documents only, no simulation

``--deepshare`` (or the environment variable ``RLSCHED_DEEPSHARE``) is a local checkout of the public
repository gajagajago/deepshare. Its simulator (``scheduler/cluster_env.py``, unmodified) is run in a
subprocess on each of DeepShare's 11 job sets (``data/traces/deepshare/``: ``simulate/trace0``,
``real/trace0``, ``train/jobset{0,1,2}/episode{0,1,2}``) for its LAS and SRTF, twice: as it is, and with
its progress loop iterating over a copy of the running list (see the "why" section that the command
writes). Its imports of pandas and gym are served by two small stand-ins written into a temporary
directory when those packages are missing (``read_csv`` + ``DataFrame.at``; gymnasium's ``Env`` and
``spaces``). Without a checkout the command says so and compares with the figures DeepShare's authors'
code gives as quoted in issue 34 (trace0, and the means over the 11 sets) only.

rlsched is run with ``--compat deepshare`` (:mod:`policies.compat`) on the same sets: ``ds-las``,
``ds-srtf``, our heuristics with the seed's placement rule (``fifo:ds``, ``sjf:ds``, ``srtf:ds``,
``las:ds``) and the shipped learned policies ``rl-base`` and ``rl-hybrid``; ``--policy NAME=SPEC``
(repeatable) adds a policy under the name ``NAME`` (``SPEC`` a policy name for
:func:`policies.registry.make_policy`, e.g. ``rl-base-compat=rl-base:/path/to/best`` for a checkpoint
trained with ``rlsched train --compat deepshare``). With ``--from-json`` only the added policies are
simulated; their rows are merged into the raw results (written back to ``--json``).

``--blox`` (or ``RLSCHED_BLOX``) is a local checkout of msr-fiddle/blox; ``--blox-python`` (or
``RLSCHED_BLOX_PYTHON``) a Python that can run its code (:data:`BLOX_PACKAGES`, e.g. a scratch venv).
Its simulator and scheduler loop (``simulator_simple.py``, ``las_scheduler.py`` with ``schedulers.Fifo``,
unmodified, on a temporary copy where its gRPC stubs are generated) run FIFO on its 32x4 cluster over a
Philly-derived stream of 1-GPU jobs (:func:`run_blox`); the jobs it hands out are replayed by rlsched's
simulator job for job (:func:`run_rlsched_blox`). With ``--from-json`` and a Blox checkout only the Blox
part runs; without a checkout (or with a Python that cannot run it) it is skipped with one line saying
why, and FIDELITY.md shows the figures recorded in the JSON or, if none, the issue's quoted figure
labelled as not measured here.

Nothing here is needed by the tests.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SETS = ["simulate/trace0", "real/trace0"] + [f"train/jobset{i}/episode{e}" for i in range(3) for e in range(3)]
HEURISTICS = ["fifo:ds", "sjf:ds", "srtf:ds", "las:ds"]
POLICIES = ["ds-las", "ds-srtf", *HEURISTICS, "rl-base", "rl-hybrid"]
#: DeepShare's figures as quoted in issue 34 (its code's output): trace0 run-only JCT (s), and the means
#: over the 11 sets (h), run-only and with queueing.
PUBLISHED = {"trace0": {"las": 6082.0, "srtf": 5975.0}, "mean_run_h": {"las": 1.75, "srtf": 1.72},
             "mean_queue_h": {"las": 38.7, "srtf": 69.7}}
BEGIN = "<!-- BEGIN PEERS -->"
END = "<!-- END PEERS -->"

_PANDAS_SHIM = '''import csv
class _At:
    def __init__(self, rows): self._rows = rows
    def __getitem__(self, key): return self._rows[key[0]][key[1]]
class _Frame:
    def __init__(self, rows): self.at = _At(rows)
def read_csv(path, header=0, index_col=0):
    with open(path, newline="") as f:
        rd = csv.reader(f); head = next(rd)
        return _Frame({r[0]: {h: float(v) for h, v in zip(head[1:], r[1:])} for r in rd})
'''
_GYM_SHIM = "from gymnasium import Env, spaces  # noqa: F401\n"
# The driver: imports DeepShare's ClusterEnv from the checkout and runs LAS or SRTF on one job set; records
# each job's finish round and run time through a subclass (DeepShare's code itself is not changed).
_DRIVER = '''import json, logging, os, sys
ds, sched, trace, fix = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
os.environ["DEEPSHARE_PATH"] = ds
sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)), ds]
logging.disable(logging.CRITICAL)
from scheduler.cluster_env import ClusterEnv
if fix:
    from scheduler.components.job_queue import JobQueue
    JobQueue.__iter__ = lambda self: iter(list(self.q))
finish = {}
class Env(ClusterEnv):
    def update_progress(self, job, samples):
        n = self.exitted_job_cnt.sum
        super().update_progress(job, samples)
        if self.exitted_job_cnt.sum != n:
            finish[job.id] = ((self.nr_round + 1) * self.round_dur, job.trained_time.sum)
import time
t0 = time.perf_counter()
env = Env(trace=trace)
_stp, jct, _util = env.start(train=False, simulate=True, model=None, scheduler=sched)
wall = time.perf_counter() - t0
print(json.dumps({"run_jct_s": jct, "jct_s": sum(f for f, _ in finish.values()) / len(finish), "jobs": len(finish),
                  "wall_s": wall}))
'''


def _shim_dir() -> Path:
    d = Path(tempfile.mkdtemp(prefix="rlsched-peers-"))
    (d / "ds_driver.py").write_text(_DRIVER)
    import importlib.util

    if importlib.util.find_spec("pandas") is None:
        (d / "pandas").mkdir()
        (d / "pandas" / "__init__.py").write_text(_PANDAS_SHIM)
    if importlib.util.find_spec("gym") is None:
        (d / "gym").mkdir()
        (d / "gym" / "__init__.py").write_text(_GYM_SHIM)
    return d


def run_deepshare(checkout: Path, sets_dir: Path, jobs: int) -> dict:
    """``{(set, sched, fixed): {"run_jct_s", "jct_s"}}`` from DeepShare's own simulator."""
    shim = _shim_dir()
    try:
        return _run_deepshare(shim, checkout, sets_dir, jobs)
    finally:
        shutil.rmtree(shim, ignore_errors=True)


def _run_deepshare(shim: Path, checkout: Path, sets_dir: Path, jobs: int) -> dict:
    tasks = [(s, sched, fix) for sched in ("las", "srtf") for fix in (False, True) for s in SETS]

    def one(t):
        s, sched, fix = t
        out = subprocess.run([sys.executable, str(shim / "ds_driver.py"), str(checkout), sched,
                              str(sets_dir / f"{s}.json"), "1" if fix else "0"],
                             capture_output=True, text=True, check=False)
        if out.returncode != 0:
            raise SystemExit(f"peers: DeepShare's simulator failed on {s} ({sched}): "
                             f"{out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode}")
        return t, json.loads(out.stdout.strip().splitlines()[-1])

    with ThreadPoolExecutor(max_workers=jobs) as ex:
        return dict(ex.map(one, tasks))


#: Blox's run: its own simulator (``simulator_simple.SimulatorRunner``, 32 machines x 4 GPUs, 300 s rounds,
#: ``exponential=True``: Gavel-like durations, 1-GPU jobs) serving jobs over gRPC to its own scheduler loop
#: (``las_scheduler.main``) with its ``schedulers.Fifo``; the driver records every job the simulator hands out.
BLOX_LOAD = 8          # jobs per hour (Poisson arrivals), Blox's --jobs-per-hour
BLOX_TRACK = (0, 299)  # the job ids whose JCT both sides average (Blox's --start/--stop-id-track)
#: The issue's figure for this comparison (quoted, not measured here): FIFO, 1-GPU jobs, 32x4.
BLOX_QUOTED = {"blox_h": 36.50, "rlsched_h": 36.46, "speed": "95-190x"}
BLOX_PACKAGES = "pandas<2, numpy<2, protobuf>=4.25,<5, grpcio, grpcio-tools==1.62.3"

_BLOX_DRIVER = r"""
import argparse, json, os, sys, time
checkout, log, load, first, last, out = sys.argv[1:7]
load, first, last = float(load), int(first), int(last)
dep = os.path.join(checkout, "blox", "deployment")
sys.path[:0] = [checkout, os.path.join(checkout, "workload"), dep, os.path.join(dep, "grpc_stubs")]
from concurrent import futures
import grpc
import simulator_simple
import las_scheduler
from blox.deployment.grpc_stubs import simulator_pb2_grpc
jobs = {}
class Recorder(simulator_simple.SimulatorRunner):
    def _clean_sim_job(self, new_job):
        d = super()._clean_sim_job(new_job)
        jobs[int(d["job_id"])] = {"arrival_s": float(d["job_arrival_time"]), "gpus": int(d["num_GPUs"]),
                                  "duration_s": float(d["job_total_iteration"]) * float(d["job_iteration_time"])}
        return d
runner = Recorder(log, [load], (first, last), ["Fifo"], ["Place"], ["AcceptAll"], exp_prefix="blox")
runner._generate_workload({"load": load})  # parses the Philly log once (its pickle cache), before the clock
server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
simulator_pb2_grpc.add_SimServerServicer_to_server(runner, server)
server.add_insecure_port("[::]:50050")
server.start()
las_scheduler.schedulers.Las = las_scheduler.schedulers.Fifo  # its loop, with its FIFO policy
sys.argv = [sys.argv[0], "--simulate", "--scheduler-name", "Fifo", "--exp-prefix", "blox", "--load", str(int(load)),
            "--start-id-track", str(first), "--stop-id-track", str(last)]
args = las_scheduler.parse_args(argparse.ArgumentParser())
t0 = time.perf_counter()
try:
    las_scheduler.main(args)
except SystemExit:
    pass
wall = time.perf_counter() - t0
stats = json.load(open(f"blox_{first}_{last}_Fifo_accept_all_load_{load}_job_stats.json"))
json.dump({"jobs": jobs, "finish": {int(k): v for k, v in stats.items()}, "wall_s": wall}, open(out, "w"))
os._exit(0)
"""


def philly_cluster_log(philly_csv: Path, out: Path) -> int:
    """Write ``philly_csv`` (``timestamp,duration,num_gpus,...``, the Philly trace as shipped in ``data/philly``)
    as a ``cluster_job_log`` of msr-fiddle/philly-traces (one attempt per job), the input Blox's workload
    parser reads; returns the number of jobs."""
    import csv
    import datetime

    fmt = "%Y-%m-%d %H:%M:%S"
    rows = []
    with open(philly_csv, newline="") as f:
        for i, r in enumerate(csv.DictReader(f)):
            t = datetime.datetime.strptime(r["timestamp"], fmt)
            end = t + datetime.timedelta(seconds=float(r["duration"]))
            rows.append({"jobid": f"job{i}", "vc": r.get("cluster", ""), "user": "", "status": "Pass",
                         "submitted_time": r["timestamp"],
                         "attempts": [{"start_time": r["timestamp"], "end_time": end.strftime(fmt),
                                       "detail": [{"ip": "n0", "gpus": [f"gpu{k}" for k in range(int(r["num_gpus"]))]}]}]})
    out.write_text(json.dumps(rows))
    return len(rows)


def blox_blocker(checkout: Path, python: str) -> str | None:
    """Why Blox's simulator cannot run from ``checkout`` with ``python`` (None when it can)."""
    for f in ("simulator_simple.py", "las_scheduler.py", "schedulers/fifo.py", "blox/deployment/grpc_proto/rm.proto"):
        if not (checkout / f).is_file():
            return f"{checkout} is not a Blox checkout (no {f})"
    probe = ("import pandas, grpc, grpc_tools, google.protobuf as pb, matplotlib\n"
             "assert int(pandas.__version__.split('.')[0]) < 2, 'pandas ' + pandas.__version__ + ' (Blox uses DataFrame.append: needs pandas<2)'\n"
             "assert int(pb.__version__.split('.')[0]) < 5, 'protobuf ' + pb.__version__ + ' (Blox calls MessageToDict(including_default_value_fields=...): needs protobuf<5)'\n")
    out = subprocess.run([python, "-c", probe], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        last = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else str(out.returncode)
        return f"{python} cannot run Blox's code: {last}; --blox-python PYTHON names an interpreter with {BLOX_PACKAGES}"
    return None


def run_blox(checkout: Path, python: str, philly_csv: Path, load: float = BLOX_LOAD,
             track: tuple[int, int] = BLOX_TRACK) -> dict:
    """Blox's simulator, unmodified, on a copy of ``checkout`` (its gRPC stubs generated there by its own
    Makefile's ``protoc`` commands) in a subprocess: FIFO on its 32x4 cluster, the Philly-derived stream its
    workload generator draws from ``philly_csv``. Returns ``{"jobs": {id: {arrival_s, gpus, duration_s}},
    "finish": {id: [arrival_s, end_s]} (tracked ids), "wall_s"}``."""
    work = Path(tempfile.mkdtemp(prefix="rlsched-blox-"))
    try:
        copy = work / "blox"
        shutil.copytree(checkout, copy, ignore=shutil.ignore_patterns(".git", "workload_synergy", "*.pdf"))
        dep = copy / "blox" / "deployment"
        (dep / "grpc_stubs").mkdir(exist_ok=True)
        for proto in ("rm", "nm", "simulator", "frontend", "backend"):
            subprocess.run([python, "-m", "grpc_tools.protoc", "-I./grpc_proto", "--python_out=./grpc_stubs",
                            "--grpc_python_out=./grpc_stubs", f"./grpc_proto/{proto}.proto"],
                           cwd=dep, check=True, capture_output=True)
        philly_cluster_log(philly_csv, work / "cluster_job_log")
        (work / "blox_driver.py").write_text(_BLOX_DRIVER)
        out = subprocess.run([python, str(work / "blox_driver.py"), str(copy), str(work / "cluster_job_log"),
                              str(float(load)), str(track[0]), str(track[1]), str(work / "result.json")],
                             cwd=work, capture_output=True, text=True, check=False)
        if out.returncode != 0 or not (work / "result.json").is_file():
            tail = (out.stderr.strip() or out.stdout.strip()).splitlines()
            raise SystemExit(f"peers: Blox's simulator failed: {tail[-1] if tail else out.returncode}")
        res = json.loads((work / "result.json").read_text())
        res["jobs"] = {int(k): v for k, v in res["jobs"].items()}
        res["finish"] = {int(k): v for k, v in res["finish"].items()}
        return res
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_rlsched_blox(blox: dict, policy: str = "fifo") -> dict:
    """rlsched's simulator on the jobs Blox's simulator handed out, job for job (same ids, arrival times,
    GPUs, durations: 1-GPU jobs on one node run at their isolated speed), FIFO on 32x4; average JCT over
    Blox's tracked ids. Returns ``{"avg_jct_s", "blox_avg_jct_s", "jobs", "tracked", "wall_s"}``."""
    import csv

    from policies.cluster import ClusterSpec
    from policies.perf import ContentionModel
    from policies.registry import make_policy
    from trainer.simulator import Simulator
    from trainer.traces import load_trace

    cl = ClusterSpec.parse("32x4")
    perf = ContentionModel(cl)
    model = sorted({k[0] for k in perf.data.isolated})[0]
    with tempfile.TemporaryDirectory(prefix="rlsched-blox-") as d:
        path = Path(d) / "blox_stream.csv"
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["job_id", "submit_time", "model", "gpu_demand", "duration"])
            for jid, j in sorted(blox["jobs"].items()):
                w.writerow([f"b{jid}", j["arrival_s"], model, j["gpus"], j["duration_s"]])
        jobs = load_trace(path, cl, perf)
    t0 = time.perf_counter()
    res = Simulator(cl, jobs, make_policy(policy, cl, perf), perf).run()
    wall = time.perf_counter() - t0
    tracked = sorted(blox["finish"])
    jct = {r.job_id: r.jct for r in res.jobs}
    ours = [jct[f"b{i}"] for i in tracked]
    theirs = [blox["finish"][i][1] - blox["finish"][i][0] for i in tracked]
    return {"avg_jct_s": float(np.mean(ours)), "blox_avg_jct_s": float(np.mean(theirs)), "jobs": len(jobs),
            "tracked": len(tracked), "wall_s": wall, "blox_wall_s": blox["wall_s"],
            "max_abs_diff_s": float(np.max(np.abs(np.subtract(ours, theirs))))}


def run_rlsched(sets_dir: Path, policies: dict[str, str] | None = None) -> dict:
    """``{(set, policy): summary}`` of rlsched under ``--compat deepshare``; ``policies``: shown name -> the
    name :func:`policies.registry.make_policy` builds (default: :data:`POLICIES`, each under its own name)."""
    from policies.cluster import ClusterSpec
    from policies.compat import adapt_policy, compat_mode
    from policies.perf import ContentionModel
    from policies.registry import make_policy
    from trainer.metrics import summarize
    from trainer.simulator import SimConfig, Simulator
    from trainer.traces import load_trace

    cl = ClusterSpec.parse("4x8")
    mode = compat_mode("deepshare")
    perf = ContentionModel(cl, contention=mode.contention)
    policies = policies if policies is not None else {p: p for p in POLICIES}
    out = {}
    for s in SETS:
        jobs = load_trace(sets_dir / f"{s}.json", cl, perf)
        for name, spec in policies.items():
            pol = adapt_policy(make_policy(spec, cl, perf), mode)
            t0 = time.perf_counter()
            res = Simulator(cl, jobs, pol, perf, SimConfig(compat=mode)).run()
            sm = summarize(res)
            out[(s, name)] = {k: sm[k] for k in ("avg_jct_s", "avg_run_jct_s", "avg_run_jct_rounds_s")}
            out[(s, name)]["wall_s"] = time.perf_counter() - t0
    return out


def _pct(a: float, b: float) -> str:
    return f"{100 * (a - b) / b:+.1f} %"


def _ci(xs) -> tuple[float, float]:
    from scipy import stats

    x = np.asarray(xs, float)
    if x.size < 2:
        return float(x.mean()), math.nan
    return float(x.mean()), float(stats.t.ppf(0.975, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))


def validation_table(ours: dict, ds: dict | None) -> str:
    rows = ["| job set | DeepShare LAS (s) | rlsched ds-las (s) | diff | DeepShare SRTF (s) | rlsched ds-srtf (s) "
            "| diff |", "|---|---:|---:|---:|---:|---:|---:|"]
    ref = {}
    for s in SETS:
        cells = [s]
        for sched in ("las", "srtf"):
            o = ours[(s, f"ds-{sched}")]["avg_run_jct_rounds_s"]
            r = ds[(s, sched, False)]["run_jct_s"] if ds else (PUBLISHED["trace0"][sched] if s == "simulate/trace0" else None)
            ref[(s, sched)] = r
            cells += [f"{r:,.0f}" if r is not None else "n/a", f"{o:,.0f}", _pct(o, r) if r is not None else "n/a"]
        rows.append("| " + " | ".join(cells) + " |")
    cells = ["mean (h)"]
    for sched in ("las", "srtf"):
        o = np.mean([ours[(s, f"ds-{sched}")]["avg_run_jct_rounds_s"] for s in SETS]) / 3600
        r = (np.mean([ref[(s, sched)] for s in SETS]) / 3600) if ds else PUBLISHED["mean_run_h"][sched]
        cells += [f"{r:.3f}", f"{o:.3f}", _pct(o, r)]
    rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def queue_table(ours: dict, ds: dict | None) -> str:
    head = ("| job set | policy | DeepShare as is (h) | DeepShare, loop fixed (h) | rlsched (h) | vs as is | vs fixed |\n"
            "|---|---|---:|---:|---:|---:|---:|")
    rows = [head]
    for sched in ("las", "srtf"):
        for s in SETS + ["mean"]:
            if s == "mean":
                o = np.mean([ours[(x, f"ds-{sched}")]["avg_jct_s"] for x in SETS]) / 3600
                a = np.mean([ds[(x, sched, False)]["jct_s"] for x in SETS]) / 3600 if ds else PUBLISHED["mean_queue_h"][sched]
                f = np.mean([ds[(x, sched, True)]["jct_s"] for x in SETS]) / 3600 if ds else None
            else:
                o = ours[(s, f"ds-{sched}")]["avg_jct_s"] / 3600
                a = ds[(s, sched, False)]["jct_s"] / 3600 if ds else None
                f = ds[(s, sched, True)]["jct_s"] / 3600 if ds else None
            rows.append(f"| {s} | ds-{sched} | {a:.2f} | " if a is not None else f"| {s} | ds-{sched} | n/a | ")
            rows[-1] += (f"{f:.2f} | " if f is not None else "n/a | ") + f"{o:.2f} | " + \
                (f"{_pct(o, a)} | " if a is not None else "n/a | ") + (f"{_pct(o, f)} |" if f is not None else "n/a |")
    return "\n".join(rows)


def misses(ours: dict, ds: dict | None) -> str:
    """Which sets miss 5 % against DeepShare's own figures, per metric, and by how much."""
    if not ds:
        return "Per-set misses need `--deepshare PATH`."
    out = []
    for label, key, ref_key, fixed in (("run-only JCT", "avg_run_jct_rounds_s", "run_jct_s", False),
                                       ("JCT with queueing, DeepShare as is", "avg_jct_s", "jct_s", False),
                                       ("JCT with queueing, DeepShare's loop fixed", "avg_jct_s", "jct_s", True)):
        bad, worst = [], 0.0
        for sched in ("las", "srtf"):
            for s in SETS:
                o, r = ours[(s, f"ds-{sched}")][key], ds[(s, sched, fixed)][ref_key]
                d = 100 * (o - r) / r
                worst = max(worst, abs(d))
                if abs(d) > 5.0:
                    bad.append(f"{s} ds-{sched} {d:+.1f} %")
        out.append(f"* {label}: largest difference {worst:.1f} %; "
                   + (f"beyond 5 %: {', '.join(bad)}." if bad else "every set within 5 %."))
    return "\n".join(out)


def speed_table(ours: dict, ds: dict | None) -> str:
    """Wall time per job set of DeepShare's loop (as is) and rlsched's simulator, LAS and SRTF."""
    if not ds:
        return "(needs `--deepshare PATH`)"
    rows = ["| policy | DeepShare (s, mean over sets) | rlsched (s) | ratio (min-max over sets) |", "|---|---:|---:|---:|"]
    for sched in ("las", "srtf"):
        d = np.array([ds[(s, sched, False)]["wall_s"] for s in SETS])
        o = np.array([ours[(s, f"ds-{sched}")]["wall_s"] for s in SETS])
        r = d / o
        rows.append(f"| ds-{sched} | {d.mean():.1f} | {o.mean():.2f} | {r.mean():.1f}x ({r.min():.1f}-{r.max():.1f}x) |")
    return "\n".join(rows)


def _policies(ours: dict) -> list[str]:
    """The policies in ``ours``: :data:`POLICIES`, then the added ones (``--policy``) in the order run."""
    extra = []
    for _s, p in ours:
        if p not in POLICIES and p not in extra:
            extra.append(p)
    return [*POLICIES, *extra]


#: the two of DeepShare's 11 job sets that are not among its training episodes (``train/...``)
HELD_OUT = ["simulate/trace0", "real/trace0"]


def extra_note(extras: dict[str, str]) -> str:
    """What the added policies are (``--policy``), in words."""
    if not extras:
        return ""
    lines = ["Added policies (`--policy NAME=SPEC`):", ""]
    lines += [f"* `{n}` = `{_rel_spec(spec)}`" for n, spec in extras.items()]
    return "\n".join(lines) + "\n"


def held_out_table(ours: dict, extras: dict[str, str]) -> str:
    """Per held-out set (:data:`HELD_OUT`) and metric: every policy's average JCT (h), and it against ds-las,
    ds-srtf and that set's best heuristic for that metric."""
    names = _policies(ours)
    out = []
    for s in HELD_OUT:
        for m, label in (("avg_run_jct_rounds_s", "run-only JCT, whole rounds"), ("avg_jct_s", "JCT with queueing")):
            best = min(HEURISTICS, key=lambda p: ours[(s, p)][m])
            out.append(f"**{s}, {label}**; best of our heuristics: `{best}`\n")
            out.append("| policy | JCT (h) | vs ds-las | vs ds-srtf | vs best heuristic |")
            out.append("|---|---:|---:|---:|---:|")
            for p in names:
                v = ours[(s, p)][m]
                out.append(f"| {p} | {v / 3600:.3f} | {_pct(v, ours[(s, 'ds-las')][m])} | "
                           f"{_pct(v, ours[(s, 'ds-srtf')][m])} | {_pct(v, ours[(s, best)][m])} |")
            out.append("")
    return "\n".join(out)


def claim_summary(ours: dict) -> str:
    """The seed's claim against these runs, in words (numbers from the runs)."""
    def mean(p, m):
        return float(np.mean([ours[(s, p)][m] for s in SETS]))

    def rel(p, q, m):
        return 100 * (mean(p, m) - mean(q, m)) / mean(q, m)

    run, q = "avg_run_jct_rounds_s", "avg_jct_s"
    lines = []
    for p in ("rl-base", "rl-hybrid"):
        lines.append(
            f"* `{p}`: run-only JCT {rel(p, 'ds-srtf', run):+.1f} % / {rel(p, 'ds-las', run):+.1f} % against "
            f"ds-srtf / ds-las (the seed's claim for RL-base: -15.4 % / -18.2 %); with queueing "
            f"{rel(p, 'ds-srtf', q):+.1f} % / {rel(p, 'ds-las', q):+.1f} %.")
    for p in _policies(ours)[len(POLICIES):]:
        lines.append(
            f"* `{p}` (added; its 11-set means include its training sets): run-only JCT {rel(p, 'ds-srtf', run):+.1f} % / "
            f"{rel(p, 'ds-las', run):+.1f} % against ds-srtf / ds-las; with queueing {rel(p, 'ds-srtf', q):+.1f} % / "
            f"{rel(p, 'ds-las', q):+.1f} %.")
    lines.append(
        f"* The run-only metric rewards running few jobs at a time: `rl-base` has the shortest run-only JCT "
        f"({mean('rl-base', run) / 3600:.2f} h) and the longest JCT with queueing ({mean('rl-base', q) / 3600:.1f} h) "
        "of all policies here; the seed's metric alone cannot tell a scheduler that shortens jobs from one "
        "that keeps GPUs idle.")
    return "\n".join(lines)


def seed_claim_table(ours: dict) -> str:
    """Mean over the 11 sets (95 % interval over sets) of run-only and queueing-included JCT, and the paired
    difference of each policy against the best of our heuristics (per metric)."""
    out = []
    for metric, label in (("avg_run_jct_rounds_s", "run-only JCT, whole rounds (the seed's metric)"),
                          ("avg_jct_s", "JCT with queueing (ours)")):
        names = _policies(ours)
        per = {p: np.array([ours[(s, p)][metric] for s in SETS]) / 3600 for p in names}
        best = min(HEURISTICS, key=lambda p: per[p].mean())
        out.append(f"**{label}**; best of our heuristics: `{best}`\n")
        out.append("| policy | mean (h) | 95 % CI | vs best heuristic, paired | vs ds-las | vs ds-srtf |")
        out.append("|---|---:|---:|---:|---:|---:|")
        for p in names:
            m, h = _ci(per[p])
            d, dh = _ci(per[p] - per[best])
            rel = lambda q: f"{100 * (per[p].mean() - per[q].mean()) / per[q].mean():+.1f} %"  # noqa: E731
            out.append(f"| {p} | {m:.3f} | ±{h:.3f} | {d:+.3f} ± {dh:.3f} h | {rel('ds-las')} | {rel('ds-srtf')} |")
        out.append("")
    return "\n".join(out)


def checkpoint_training(extras: dict[str, str]) -> dict[str, dict]:
    """For each added policy whose SPEC names a checkpoint (``rl-base:/path``), its training run from the
    checkpoint's metadata: compat mode, steps, validation score, training / validation sets (repo-relative)
    and the commands of its segments. Stored in the raw results so ``--from-json`` keeps it."""
    out = {}
    for name, spec in extras.items():
        path = spec.partition(":")[2]
        meta_path = Path(path if path.endswith(".json") else path + ".json")
        if not path or not meta_path.is_file():
            continue
        try:
            tr = json.loads(meta_path.read_text()).get("training", {})
        except (OSError, ValueError):
            continue
        cfg = tr.get("config", {}) if isinstance(tr.get("config"), dict) else {}
        out[name] = {"compat": tr.get("compat"), "timesteps": tr.get("timesteps"),
                     "val_avg_jct_s": tr.get("val_avg_jct_s"), "val_rel_jct": tr.get("val_rel_jct"),
                     "traces": [_rel(t) for t in cfg.get("traces", [])],
                     "val_traces": [_rel(t) for t in cfg.get("val_traces", [])],
                     "commands": [c.get("command") for c in tr.get("commands", []) if isinstance(c, dict)]}
    return out


def training_note(training: dict[str, dict]) -> str:
    """The added checkpoints' training runs (:func:`checkpoint_training`), in words (one line per run: the
    policies that share a checkpoint's run share the line)."""
    runs: list[tuple[list[str], dict]] = []
    for name, t in training.items():
        for names, u in runs:
            if u == t:
                names.append(name)
                break
        else:
            runs.append(([name], t))
    lines = []
    for names, t in runs:
        val = t.get("val_avg_jct_s")
        lines.append(
            f"* {' and '.join(f'`{n}`' for n in names)}: trained with `--compat {t.get('compat')}` (its best checkpoint: "
            f"{t.get('timesteps')} steps) on {_files(t.get('traces', []))}; validation (best-checkpoint "
            f"selection) on {_files(t.get('val_traces', [])) or 'none'}"
            + (f" (its best: JCT with queueing {val / 3600:.2f} h, {t.get('val_rel_jct'):.3f} x greedy-np:ds)"
               if isinstance(val, (int, float)) else "") + ".")
    return ("\n".join(lines) + "\n") if lines else ""


def added_line(extras: dict[str, str]) -> str:
    """The sentence that says which rows ``--policy`` added (simulated after the rest, ``--from-json``)."""
    if not extras:
        return ""
    names = ", ".join(f"`{n}`" for n in extras)
    return (f" The rows of {names} were added with `--policy` (see \"Training in compat mode\"): with "
            "`--from-json` only they are simulated, the other rows are the raw results of the run above.")


def _files(paths: list[str]) -> str:
    """``paths`` in words: their common directory once, then each file under it."""
    if len(paths) < 2:
        return ", ".join(f"`{p}`" for p in paths)
    base = os.path.commonpath(paths)
    return f"`{base}/` " + ", ".join(f"`{os.path.relpath(p, base)}`" for p in paths)


def _rel_spec(spec: str) -> str:
    """``NAME:PATH`` with ``PATH`` written relative to the repository when it lies in it."""
    base, colon, path = spec.partition(":")
    return f"{base}:{_rel(path)}" if colon and path else spec


def _rel(path: str) -> str:
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return path


#: how the compat-mode checkpoint of docs/FIDELITY.md is trained and added (the commands, no results)
COMPAT_RECIPE = """
### Training in compat mode

`rlsched train --compat deepshare` trains under the mode's rules (`trainer/env.py`: the episodes'
simulator runs with `SimConfig(compat=...)`, the codec offers only the mode's placements, the
`jct-rel` reference is `greedy-np:ds` under the mode, validation runs under the mode, and the
checkpoint records `training.compat`). The run below starts from scratch (the admission prior's
initialisation): `--init` takes a training run's checkpoint with its value network, which the shipped
files do not carry. DeepShare's 9 training episodes less one are trained on;
`train/jobset2/episode2` is held out for validation (best-checkpoint selection). The network is not
shipped (0.9 MB per policy file); these commands make it again (about 10 minutes of wall time here,
one core at nice 10, 250,880 steps),
then add it to these tables without re-running DeepShare's simulator or the other rows:

```
T=data/traces/deepshare/train
nice -n 10 rlsched train --compat deepshare \\
    $(for f in jobset0/episode0 jobset0/episode1 jobset0/episode2 jobset1/episode0 jobset1/episode1 \\
               jobset1/episode2 jobset2/episode0 jobset2/episode1; do echo --traces $T/$f.json; done) \\
    --val-traces $T/jobset2/episode2.json --timesteps 60000 --n-envs 2 --eval-freq 4000 --seed 0 --out runs/compat-ds
nice -n 10 rlsched train --resume --timesteps 250000 --out runs/compat-ds
python benchmarks/peers.py --from-json docs/fidelity_results.json \\
    --policy rl-base-compat=rl-base:runs/compat-ds/best --policy rl-hybrid-compat=rl-hybrid:runs/compat-ds/best
```

`rl-base-compat` and `rl-hybrid-compat` are the same network, run as rl-base and as rl-hybrid.
"""


def compat_trained_section(ours: dict, extras: dict[str, str], training: dict[str, dict] | None = None) -> str:
    """The added policies (checkpoints trained in compat mode) on the two held-out sets, for both documents."""
    if not extras:
        return ""
    return f"""
### Checkpoints trained in compat mode, on the two held-out job sets

{extra_note(extras)}
{training_note(training or {})}
The 11-set means above include these policies' own training episodes (8 of DeepShare's 9 `train/...`
sets were trained on and the 9th validated, as listed), so for a checkpoint trained in compat mode only
`simulate/trace0` and `real/trace0` are held out: the tables below are those two sets alone. One set each, one simulation each
(the mode is deterministic): no interval.

{held_out_table(ours, extras)}"""


def fidelity_doc(ours: dict, ds: dict | None, checkout: Path | None, wall: float,
                 extras: dict[str, str] | None = None, training: dict[str, dict] | None = None,
                 blox: dict | None = None, blox_why: str | None = None) -> str:
    extras = extras or {}
    src = (f"DeepShare's own simulator from the checkout given ({checkout.name}), run by this command"
           if ds else "no DeepShare checkout given: reference figures are those quoted in issue 34 (trace0 and the "
                      "11-set means); per-set references need `--deepshare PATH`")
    return f"""# Fidelity: rlsched beside the peers' own simulators

Generated by `python benchmarks/peers.py --deepshare PATH` (PATH: a checkout of gajagajago/deepshare;
also `RLSCHED_DEEPSHARE`); {wall:.0f} s of wall time here. Reference: {src}.{added_line(extras)}

## DeepShare-compatible mode (`--compat deepshare`)

`rlsched simulate|evaluate --compat deepshare` runs the seed's simulator rules (`policies/compat.py`):
the 4x8 cluster, no single-node placement, its 7 node sets (the 6 pairs and all 4 nodes, from its
`action_helper.decode_action`), `G/k` GPUs on each of `k` nodes with the shapes (2 nodes, G/2) and
(4 nodes, G/4), its contention rule (worst measured pair over a job's multi-node neighbours, ratio
floored at 0.35: `ContentionModel(cluster, contention="ds-min")`), every job at t = 0, a round every
300 s and nothing in between, free restarts, and its metric (JCT without queueing) beside ours.
`ds-las` / `ds-srtf` are its LAS and SRTF as its code sorts (`JobQueue.sort`): seconds run so far
*descending* (the job that ran longest first) and fraction of work done ascending, stable; every
round it preempts every running job and places from the head with its rule (widest shape first,
lowest-index nodes with room) until the head does not fit.

### Validation: run-only JCT per job set (DeepShare's metric)

Both columns count a job's run time in whole 300 s rounds, as DeepShare's code does
(`trained_time` grows by 300 per round run). Target: within 5 % per set.

{validation_table(ours, ds)}

### JCT with queueing

{queue_table(ours, ds)}

### Per set against the 5 % target

{misses(ours, ds)}

### Why the numbers differ where they do

* **Run-only JCT** (the seed's metric) differs by the per-set amounts above. rlsched moves time
  continuously: a job that finishes mid-round stops there and its neighbours speed up for the rest
  of the round, while DeepShare holds every ratio for the whole round; rlsched's exact run time
  (`avg_run_jct_s` in `summary.json`) is on average about half a round below the whole-round count.
* **JCT with queueing**: DeepShare's progress loop (`for j in self.scheduled_job_list:
  self.update_progress(...)`) removes a finishing job from the list it iterates over, so the job
  after it in the list gets no progress and no run time for that round, though it holds its GPUs.
  Under LAS such a job re-enters the queue with the run time it had, behind every job with equal
  run time, and can wait until the end of the trace (trace0: job 7, 8 GPUs, first placed in round
  22, skipped that round with 0 s run, then queued behind 250 jobs and finished in the last round).
  rlsched does not reproduce this; the "loop fixed" column runs DeepShare's unmodified code with
  only that list iterated over a copy (the command's driver), and is the like-for-like reference for
  JCT with queueing.

## The seed's claim on its own terms

The seed reports RL-base 15.4 % / 18.2 % below SRTF / LAS in average JCT. Below, every policy runs in
`--compat deepshare` on DeepShare's 11 job sets: `ds-las`, `ds-srtf` (the seed's baselines), our
heuristics with the seed's placement rule (`ORDER:ds`; `greedy:ds` equals `srtf:ds`, the placement
rule being the seed's), and the shipped `rl-base` / `rl-hybrid` checkpoints (trained under rlsched's
default rules, not in compat mode; their placement options are cut to the seed's, and rl-hybrid's
safety rule falls back to the seed's placement). Differences are paired by job set; the interval is a
Student t 95 % interval over the 11 sets.

{seed_claim_table(ours)}
{claim_summary(ours)}

The shipped checkpoints were trained on rlsched's own generated job sets (`scripts/rl_traces.sh`,
docs/RL.md), so DeepShare's 11 sets are held out for them.
{COMPAT_RECIPE if extras else ""}{compat_trained_section(ours, extras, training)}
Left: DeepShare's own RL checkpoints (SB3 PPO files) run through its simulator (issue 34 quotes
1.27-1.55 h run-only and 29.4-50.7 h with queueing on trace0 for them; not re-measured here).

## Speed

Wall time of one run on one job set, this machine (2 shared cores; DeepShare's runs two at a time,
so its times are inflated by the sharing as much as ours are by the other engineers' work):

{speed_table(ours, ds)}

{blox_section(blox, blox_why)}
## Other comparisons of issue 34

Measured and regenerated in `docs/PERFORMANCE_MODEL.md` (not by this command); headline numbers as
recorded there:

* **Contention among several neighbours** (section 2, "Several neighbours: three contention rules"):
  the rules `sum` (default), `link` (max-min link sharing) and `ds-min` (DeepShare's worst pair,
  floor 0.35) agree within 10 % of average JCT on DeepShare's trace0 with packing placements (SRTF
  within 0.4 %); with spread placements average CS is 2.4 (`sum`), 2.1-2.2 (`link`) and 1.6
  (`ds-min`), and `fifo:spread` takes 53.5 h against 35.0 h (`sum` against `ds-min`). Command, per
  rule: `rlsched simulate --trace data/traces/deepshare/simulate/trace0.json --policy
  fifo,srtf,las,fifo:spread,las:spread --contention RULE`.
* **Restarts after preemption, LAS on Philly** (section 9, "Philly, whole trace"): on all 82,247
  jobs (125x8), LAS with moves has 0.84x FIFO's makespan (2613.5 h against 3122.5 h; without moves
  2.84x) and 3.65 h mean JCT (without: 44.35 h); jobs left on more nodes than they need: 4 (without:
  4,232), worst run slowdown 1.33x (without: 44x). Command: `nice -n 10 python
  scripts/studies/philly_restarts.py --json philly.json`.
* **Single-node speeds** (section 8, "Single-node speeds from AdaptDL"): the intra-node factor
  calibrated per model family from AdaptDL's placements changes single-node speeds of FSDP and MoE
  by 2x and 1.16x; rl-base / SRTF mean JCT on trace0 is 0.89 with the default factor and 0.82-0.86
  across the calibrated range (1.00 and 0.73-0.87 on a Poisson 4x8 set). Command: `python
  scripts/studies/intra_sensitivity.py`.
"""


def blox_section(blox: dict | None, why: str | None) -> str:
    """The "Blox" section: measured figures when ``blox`` (a :func:`run_rlsched_blox` result plus ``load``,
    ``track`` and ``checkout``) is given, else the issue's quoted figure and ``why`` it was not measured."""
    head = f"""## Blox

Generated by `python benchmarks/peers.py --from-json docs/fidelity_results.json --blox PATH
--blox-python PY` (PATH: a checkout of msr-fiddle/blox, also `RLSCHED_BLOX`; PY: a Python with
{BLOX_PACKAGES},
also `RLSCHED_BLOX_PYTHON`; without `--from-json` the DeepShare part runs too).
Blox's simulator runs unmodified in a subprocess on a copy of the checkout (its gRPC stubs generated
there with its Makefile's `protoc` commands): `simulator_simple.SimulatorRunner` (32 machines x 4 GPUs,
300 s rounds, its Philly workload: `workload.Workload` over a `cluster_job_log` written from
`data/philly/philly.csv`, 1-GPU jobs, Poisson arrivals, Gavel-like durations, seed 1) serves jobs over
gRPC to its own scheduler loop (`las_scheduler.main`, with `schedulers.Fifo` in place of `Las`, its
consolidated placement and accept-all admission). The driver records every job the simulator hands out
(id, arrival, GPUs, iterations x seconds per iteration); the same jobs, job for job, are a trace for
rlsched's simulator (`fifo`, 32x4; a 1-GPU job runs at its isolated speed, so the model does not
matter). Both averages are over the job ids Blox tracks (its `--start/--stop-id-track`). Blox's
processes talk over its fixed local ports 50050 and 50051, so one such run at a time per host.
"""
    if blox is None:
        return head + f"""
Not measured in this run: {why}. The issue's figure (quoted from issue 34, **not measured here**):
FIFO with 1-GPU jobs on 32x4, rlsched {BLOX_QUOTED['rlsched_h']:.2f} h against Blox
{BLOX_QUOTED['blox_h']:.2f} h average JCT; rlsched {BLOX_QUOTED['speed']} faster than Blox's loop.
"""
    r = blox
    diff = r["avg_jct_s"] - r["blox_avg_jct_s"]
    return head + f"""
Load {r['load']:g} jobs per hour, tracked jobs {r['track'][0]}-{r['track'][1]} ({r['tracked']}); Blox's run
handed out {r['jobs']} jobs before every tracked one had finished (all of them are in rlsched's trace).

| | Blox | rlsched | difference |
|---|---:|---:|---:|
| average JCT, tracked jobs (h) | {r['blox_avg_jct_s'] / 3600:.2f} | {r['avg_jct_s'] / 3600:.2f} | {diff / 3600:+.2f} h ({_pct(r['avg_jct_s'], r['blox_avg_jct_s'])}) |
| largest per-job difference (s) | | | {r['max_abs_diff_s']:,.0f} |
| wall time of the loop (s) | {r['blox_wall_s']:.1f} | {r['wall_s']:.2f} | {r['blox_wall_s'] / r['wall_s']:.0f}x |

Why they differ: Blox starts jobs only at round boundaries and ends a job at the round boundary after
its last iteration (its JCT counts from the arrival to that boundary); rlsched starts a job on arrival
when a GPU is free and ends it at its exact finish time. Wall time: Blox's is `las_scheduler.main`
from its first round to its last (its gRPC calls to the simulator included; the parse of the Philly
log is done before the clock starts, into the pickle cache its workload reads); rlsched's is one
`Simulator.run` on the same jobs; one run each on this machine (2 cores shared with other work).
The issue quoted 36.46 vs 36.50 h and 95-190x for a run whose load and tracked window it does not
state.
"""


def _replace_section(path: Path, body: str, extras: dict[str, str] | None = None) -> None:
    from trainer.outputs import replace_marked

    text = path.read_text() if path.is_file() else "# Results\n"
    added = ""
    if extras:
        added = (" The rows of " + ", ".join(f"`{n}`" for n in extras) + " are added by `python benchmarks/peers.py "
                 "--from-json docs/fidelity_results.json "
                 + " ".join(f"--policy {n}={_rel_spec(sp)}" for n, sp in extras.items())
                 + "` (how that checkpoint is trained: docs/FIDELITY.md, \"Training in compat mode\").")
    block = f"{BEGIN}\n\n## The seed's claim in DeepShare-compatible mode\n\n" \
            f"Generated by `python benchmarks/peers.py` (details: docs/FIDELITY.md).{added}\n\n{body}\n{END}"
    path.write_text(replace_marked(text, BEGIN, END, block))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--deepshare", default=os.environ.get("RLSCHED_DEEPSHARE"),
                    help="checkout of gajagajago/deepshare (default: $RLSCHED_DEEPSHARE)")
    ap.add_argument("--sets", default=str(ROOT / "data/traces/deepshare"), help="DeepShare's job sets (*.json)")
    ap.add_argument("--out", default=str(ROOT / "docs/FIDELITY.md"))
    ap.add_argument("--results-md", default=str(ROOT / "docs/RESULTS.md"))
    ap.add_argument("--jobs", type=int, default=2, help="DeepShare runs in parallel (default 2)")
    ap.add_argument("--json", default=str(ROOT / "docs/fidelity_results.json"),
                    help="where the raw results go (default: docs/fidelity_results.json)")
    ap.add_argument("--from-json", default=None,
                    help="rewrite the documents from an earlier run's raw results, without simulating (only the "
                         "--policy additions are simulated and merged in)")
    ap.add_argument("--policy", action="append", default=[], metavar="NAME=SPEC",
                    help="also run SPEC (a policy name, e.g. rl-base:/path/to/best) under the name NAME "
                         "(repeatable), e.g. rl-base-compat=rl-base:runs/compat/best")
    ap.add_argument("--blox", default=os.environ.get("RLSCHED_BLOX"),
                    help="checkout of msr-fiddle/blox (default: $RLSCHED_BLOX); without it the Blox part is skipped")
    ap.add_argument("--blox-python", default=os.environ.get("RLSCHED_BLOX_PYTHON", sys.executable),
                    help=f"Python that runs Blox's code ({BLOX_PACKAGES}; default: $RLSCHED_BLOX_PYTHON, else this one)")
    ap.add_argument("--philly", default=str(ROOT / "data/philly/philly.csv"),
                    help="the Philly trace Blox's workload draws from (default: data/philly/philly.csv)")
    args = ap.parse_args(argv)
    extras: dict[str, str] = {}
    for item in args.policy:
        name, eq, spec = (x.strip() for x in item.partition("="))
        if not eq or not name or not spec:
            print(f"peers: error: --policy {item!r}: expected NAME=SPEC, e.g. rl-base-compat=rl-base:/path/best",
                  file=sys.stderr)
            return 2
        if name in POLICIES or name in extras or "|" in name:
            print(f"peers: error: --policy {item!r}: the name {name!r} is taken (or has a '|')", file=sys.stderr)
            return 2
        extras[name] = spec
    sets_dir = Path(args.sets)
    missing = [s for s in SETS if not (sets_dir / f"{s}.json").is_file()]
    if missing:
        print(f"peers: error: job set {missing[0]}.json not in {sets_dir}", file=sys.stderr)
        return 2
    checkout = Path(args.deepshare) if args.deepshare else None
    if checkout is not None and not (checkout / "scheduler" / "cluster_env.py").is_file():
        print(f"peers: error: {checkout} is not a DeepShare checkout (no scheduler/cluster_env.py)", file=sys.stderr)
        return 2
    if checkout is None and not args.from_json:
        print("peers: no DeepShare checkout (--deepshare PATH or RLSCHED_DEEPSHARE): skipping its simulator; "
              "comparing with the figures quoted in issue 34 only", file=sys.stderr)
    blox_checkout = Path(args.blox) if args.blox else None
    blox_why = None
    if blox_checkout is None:
        blox_why = "no Blox checkout (--blox PATH or RLSCHED_BLOX)"
    else:
        blox_why = blox_blocker(blox_checkout, args.blox_python)
        if blox_why is None and not Path(args.philly).is_file():
            blox_why = f"no Philly trace at {args.philly} (--philly)"
    t0 = time.perf_counter()
    if args.from_json:
        raw = json.loads(Path(args.from_json).read_text())
        ds = {tuple(k.split("|")[:2]) + (k.endswith("|fixed"),): v for k, v in raw["deepshare"].items()} \
            if raw["deepshare"] else None
        ours = {tuple(k.split("|")): v for k, v in raw["rlsched"].items()}
        wall = raw["wall_s"]
        checkout = Path(raw["checkout"]) if raw.get("checkout") else None
        known = {**raw.get("extra_policies", {}), **extras}
        training = {**raw.get("extra_training", {}), **checkpoint_training(extras)}
        if extras:
            try:
                ours.update(run_rlsched(sets_dir, extras))
            except ValueError as exc:  # PolicyError / CheckpointError / SimulationError: one line
                print(f"peers: error: {exc}", file=sys.stderr)
                return 2
            raw["rlsched"] = {f"{s}|{p}": v for (s, p), v in ours.items()}
            raw["extra_policies"] = known
            raw["extra_training"] = training
            Path(args.json).write_text(json.dumps(raw, indent=1) + "\n")
        extras = known
    else:
        ds = run_deepshare(checkout, sets_dir, max(1, args.jobs)) if checkout is not None else None
        try:
            ours = run_rlsched(sets_dir, {**{p: p for p in POLICIES}, **extras})
        except ValueError as exc:
            print(f"peers: error: {exc}", file=sys.stderr)
            return 2
        wall = time.perf_counter() - t0
        raw = {"checkout": str(checkout) if checkout else None, "wall_s": wall,
               "deepshare": {f"{s}|{sch}|{'fixed' if fx else 'as-is'}": v for (s, sch, fx), v in ds.items()} if ds else None,
               "rlsched": {f"{s}|{p}": v for (s, p), v in ours.items()}, "extra_policies": extras,
               "extra_training": checkpoint_training(extras)}
        training = raw["extra_training"]
        Path(args.json).write_text(json.dumps(raw, indent=1) + "\n")
    blox = None
    if blox_why is None:
        print(f"peers: running Blox's simulator from {blox_checkout} with {args.blox_python}", file=sys.stderr)
        blox = run_rlsched_blox(run_blox(blox_checkout, args.blox_python, Path(args.philly)))
        blox.update(load=BLOX_LOAD, track=list(BLOX_TRACK), checkout=blox_checkout.name)
        raw["blox"] = blox
        Path(args.json).write_text(json.dumps(raw, indent=1) + "\n")
    elif raw.get("blox"):
        blox = raw["blox"]
        print(f"peers: Blox part not re-run ({blox_why}): its figures are the ones recorded in the JSON",
              file=sys.stderr)
    else:
        print(f"peers: skipping the Blox comparison: {blox_why}; FIDELITY.md quotes issue 34's figure for it "
              "(labelled as not measured here)", file=sys.stderr)
    Path(args.out).write_text(fidelity_doc(ours, ds, checkout, wall, extras, training, blox, blox_why))
    _replace_section(Path(args.results_md), seed_claim_table(ours) + compat_trained_section(ours, extras, training),
                     extras)
    print(f"peers: wrote {args.out} and the seed-claim section of {args.results_md} ({wall:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
