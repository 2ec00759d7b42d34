#!/usr/bin/env python
"""Slurm at scale, on real daemons of this machine (scripts/local-cluster.sh; root, Slurm 22.05).

``submit``: accepted jobs per second, with rlsched's job_submit.lua and without any job_submit plugin,
from each client of ``--client``: ``sbatch`` (``--clients`` concurrent ``sbatch --gpus=1 --wrap true``
processes, one per job) and ``libslurm`` (one process with ``--clients`` threads, one
``slurm_submit_batch_job`` RPC per job through :mod:`controller.libslurm`, the job ``sbatch --wrap``
sends; run in a child process, as libslurm serves one cluster per process). Each (client, mode) gets
a fresh cluster (``--nodes`` nodes, no controller, no agents; the capacity file job_submit.lua reads
is written as the controller writes it; ``--sched-params``: its SchedulerParameters). Without the
plugin the jobs are submitted held, so both modes end with the same number of held jobs and
slurmctld launches nothing. Reported per run: jobs/s from the first submission to the last
acceptance (client side included), and slurmctld's mean time per ``REQUEST_SUBMIT_BATCH_JOB`` RPC
from ``sdiag`` (server side, job_submit.lua included; it counts the wait for the job write lock, so
with concurrent clients ``server_bound_jobs_per_s``, 1 / that mean, is no bound). Every job must be
accepted (and with the plugin held and marked) or the run fails.

``lua``: CPU time per call of job_submit.lua's ``slurm_job_submit`` / ``slurm_job_modify`` in lua5.3 under a
stub ``slurm`` table (``--jobs`` calls each, default 100,000; the capacity file is read at every submission, as
in slurmctld): what the script itself adds to a submission, without slurmctld's work around it.

``rounds``: the controller (placements as one libslurm update RPC per job, or with ``--pins scontrol``
scontrol pins and one scontrol release) on a ``--nodes``-node cluster (one slurmd per node on this host) with
``--jobs`` managed jobs queued (GPU demands 1, 2, 4, 8, 16 in turn, model comments, each job sleeps
``--job-s`` s once started). The controller runs in this process (policy ``--policy``) for
``--rounds`` rounds ``--interval`` s apart, as ``Controller.run`` runs them (no automatic full garbage
collection inside a round; one between rounds when due); each round's wall time is measured around
``Controller.round`` (Slurm reads, decision, placements; the reason updates it hands to a writer thread
are waited for after it, outside the round, and reported apart: ``reasons_behind_s``, and
``round_with_reasons_s`` for the round and its writes together), and the time of every Slurm
command it ran (``scontrol (batch of updates on stdin)``: a round's pins in one process), and how many
queue reads were ``squeue --json`` and how many the cheaper text read (``queue_reads``). Every placement is then
checked against Slurm: each placed job that started must run on exactly the planned nodes with
exactly the planned GPUs per node (squeue's ``gres_detail``); the counts of exact, different and
not-yet-started placements are reported.

Usage (as root; each part brings its clusters up and down itself)::

    nice -n 10 python benchmarks/bench_slurm.py submit --jobs 2000 --clients 4 [--client sbatch|libslurm]
    nice -n 10 python benchmarks/bench_slurm.py rounds --nodes 64 --jobs 1000 --rounds 30 --job-s 20 [--pins scontrol]
    nice -n 10 python benchmarks/bench_slurm.py rounds --nodes 64 --jobs 1000 --rounds 30 --job-s 20 \
        --ctl-cpus 0 --node-cpus 1    # slurmctld + controller on CPU 0, every slurmd and its jobs on CPU 1
    nice -n 10 python benchmarks/bench_slurm.py all --json slurm-bench.json
    python benchmarks/bench_slurm.py lua              # no root, no daemons

``--ctl-cpus`` / ``--node-cpus`` (any part): slurmctld, this process (the controller, its ``squeue`` /
``sinfo``, the submitting clients) on the first CPU set, every slurmd (so every job step and job) on the
second (``taskset``, local-cluster.sh's options of the same names): the model of a cluster whose controller
host runs no jobs. Each ``rounds`` run records the 1-minute load average at its start, when the rounds start
and at their end, and slurmctld's CPU time over the rounds.

Targets (issue 33): at least 100 jobs/s through the plugin; a round at 64 nodes with 1,000 queued
jobs p99 under 1 s, every placement applied exactly.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import gc
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SCRIPT = REPO / "scripts" / "local-cluster.sh"


def _free_base(span: int) -> int:
    import socket

    for base in range(33000, 60000, 500):
        ok = True
        for p in range(base, base + span + 1):
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise SystemExit("bench_slurm: no free port range")


class Cluster:
    """One local cluster in a temporary directory, brought up and down with scripts/local-cluster.sh."""

    #: slurm.conf's SchedulerParameters for the clusters of this run (None: local-cluster.sh's default)
    sched_params: str | None = None
    #: taskset -c lists of slurmctld's side and of every slurmd (local-cluster.sh --ctl-cpus / --node-cpus;
    #: None: every CPU)
    ctl_cpus: str | None = None
    node_cpus: str | None = None

    def __init__(self, nodes: int, gpus: int, job_submit: bool) -> None:
        self.nodes, self.gpus = nodes, gpus
        self.dir = Path(tempfile.mkdtemp(prefix="rlsched-bench-", dir="/tmp"))
        self.dir.chmod(0o755)
        self.port = _free_base(nodes + 2)
        self.opts = ["--dir", str(self.dir), "--port", str(self.port), "--nodes", str(nodes), "--gpus", str(gpus),
                     "--other-nodes", "0", "--no-controller", "--no-agents"] + ([] if job_submit else ["--no-job-submit"])
        if self.sched_params:
            self.opts += ["--sched-params", self.sched_params]
        if self.ctl_cpus:
            self.opts += ["--ctl-cpus", self.ctl_cpus]
        if self.node_cpus:
            self.opts += ["--node-cpus", self.node_cpus]
        self.env: dict[str, str] = {}

    def up(self) -> float:
        t0 = time.perf_counter()
        p = subprocess.run(["bash", str(SCRIPT), "up", *self.opts], capture_output=True, text=True, timeout=600,
                           check=False)
        if p.returncode != 0:
            raise SystemExit(f"bench_slurm: local-cluster.sh up failed: {p.stderr.strip()[-1500:]}")
        took = time.perf_counter() - t0
        out = subprocess.run(["bash", "-c", f"source {shlex.quote(str(self.dir / 'env.sh'))} && env -0"],
                             capture_output=True, check=True).stdout.decode()
        self.env = dict(x.split("=", 1) for x in out.split("\0") if "=" in x)
        return took

    def down(self) -> None:
        subprocess.run(["bash", str(SCRIPT), "down", "--dir", str(self.dir)], capture_output=True, timeout=600,
                       check=False)
        shutil.rmtree(self.dir, ignore_errors=True)

    def run(self, args: list[str], timeout: float = 120) -> str:
        p = subprocess.run(args, capture_output=True, text=True, env=self.env, timeout=timeout, check=False)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(args)}: {p.stderr.strip()}")
        return p.stdout

    def slurmctld_cpu_s(self) -> float:
        """slurmctld's CPU time so far (user + system, s; ``/proc/PID/stat``), NaN when it cannot be read."""
        try:
            pid = int((self.dir / "run" / "slurmctld.pid").read_text().split()[0])
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            return float("nan")

    def write_capacity(self) -> None:
        """What the controller writes at its first round (controller.daemon.Controller._write_capacity)."""
        d = self.dir / "controller"
        d.mkdir(exist_ok=True)
        (d / "capacity").write_text(f"# written by bench_slurm.py as the controller writes it\npartition=gpu\n"
                                    f"gpus={self.nodes * self.gpus}\nnodes={self.nodes}\nmax_node_gpus={self.gpus}\n")

    def slurm(self):
        from controller.slurm import SlurmCLI

        return SlurmCLI(str(self.dir / "etc" / "slurm.conf"), 60.0)


def _sdiag_submit(cl: Cluster) -> tuple[int, float]:
    """(count, mean µs) of REQUEST_SUBMIT_BATCH_JOB from sdiag."""
    out = cl.run(["sdiag"])
    m = re.search(r"REQUEST_SUBMIT_BATCH_JOB\s+\(\s*\d+\)\s+count:(\d+)\s+ave_time:(\d+)", out)
    return (int(m.group(1)), float(m.group(2))) if m else (0, float("nan"))


def _lib_submit(conf: str, jobs: int, threads: int, hold: bool) -> dict:
    """The ``libslurm`` client (run in a child process of its own: libslurm serves one cluster per process):
    ``jobs`` batch jobs as ``sbatch --parsable --gpus=1 -o /dev/null --comment rlsched:model=GNN [--hold]
    --wrap true`` sends them (this process's environment, its uid and gid), ``threads`` at a time, each one
    ``slurm_submit_batch_job`` RPC. Returns the job ids, the wall time from the first submission to the last
    acceptance and this process's CPU time over it."""
    from controller.libslurm import open_libslurm

    lib = open_libslurm(conf)
    if lib is None:
        raise SystemExit("bench_slurm: libslurm client: no usable libslurm (libslurm.so.38, Slurm 22.05)")
    fields = {"script": "#!/bin/sh\n# This script was created by sbatch --wrap.\n\ntrue\n", "name": "wrap",
              "work_dir": os.getcwd(), "std_out": "/dev/null", "user_id": os.getuid(), "group_id": os.getgid(),
              "environment": [f"{k}={v}" for k, v in os.environ.items()], "tres_per_job": "gres:gpu:1",
              "comment": "rlsched:model=GNN"}
    if hold:
        fields["priority"] = 0
    t0, c0 = time.perf_counter(), time.process_time()
    with cf.ThreadPoolExecutor(threads) as ex:
        ids = list(ex.map(lambda _: lib.submit_batch(fields), range(jobs)))
    return {"ids": ids, "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}


def bench_submit(jobs: int, clients: int, nodes: int, gpus: int, kinds: Sequence[str] = ("sbatch", "libslurm"),
                 plugin_modes: Sequence[bool] = (True, False)) -> list[dict]:
    rows = []
    for client in kinds:
        for plugin in plugin_modes:
            rows.append(_submit_once(jobs, clients, nodes, gpus, client, plugin))
    return rows


def _submit_once(jobs: int, clients: int, nodes: int, gpus: int, client: str, plugin: bool) -> dict:
    cl = Cluster(nodes, gpus, job_submit=plugin)
    try:
        cl.up()
        if plugin:
            cl.write_capacity()
        args = ["sbatch", "--parsable", "--gpus=1", "-o", "/dev/null", "--comment", "rlsched:model=GNN"]
        if not plugin:
            args.append("--hold")
        args += ["--wrap", "true"]
        cl.run(["scontrol", "setdebug", "info"])  # (the level local-cluster.sh starts with)
        client_cpu = None
        if client == "sbatch":
            t0 = time.perf_counter()
            with cf.ThreadPoolExecutor(clients) as ex:
                ids = list(ex.map(lambda _: cl.run(args).strip(), range(jobs)))
            wall = time.perf_counter() - t0
        else:  # one process, `clients` threads, one RPC per job (see _lib_submit)
            p = subprocess.run([sys.executable, str(Path(__file__).resolve()), "_lib_submit", "--jobs", str(jobs),
                                "--clients", str(clients), "--conf", cl.env["SLURM_CONF"]]
                               + ([] if plugin else ["--hold"]), capture_output=True, text=True,
                               env={**cl.env, "PYTHONPATH": str(REPO)}, timeout=1200, check=False, cwd="/tmp")
            if p.returncode != 0:
                raise SystemExit(f"bench_slurm: libslurm client failed: {p.stderr.strip()[-1500:]}")
            got = json.loads(p.stdout.strip().splitlines()[-1])
            ids, wall, client_cpu = [str(i) for i in got["ids"]], got["wall_s"], got["cpu_s"]
        count, ave_us = _sdiag_submit(cl)
        queued = cl.slurm().jobs()
        held = [j for j in queued if j.held]
        marked = [j for j in queued if j.managed]
        if len(set(ids)) != jobs or len(queued) != jobs or len(held) != jobs or (plugin and len(marked) != jobs):
            raise SystemExit(f"bench_slurm: {'with' if plugin else 'without'} the plugin: {len(set(ids))} ids, "
                             f"{len(queued)} queued, {len(held)} held, {len(marked)} marked of {jobs}")
        row = {"client": client, "plugin": plugin, "jobs": jobs, "clients": clients, "wall_s": round(wall, 3),
               "jobs_per_s": round(jobs / wall, 1), "client_cpu_s": client_cpu, "sdiag_submit_count": count,
               "sdiag_submit_mean_us": ave_us, "load_at_start": _load(),
               "server_bound_jobs_per_s": round(1e6 / ave_us, 1) if ave_us == ave_us and ave_us > 0 else None}
        what = f"{clients} sbatch at a time" if client == "sbatch" else f"libslurm, one process, {clients} threads"
        print(f"submit ({client}) {'with' if plugin else 'without'} job_submit.lua: {jobs} jobs in {wall:.1f} s = "
              f"{jobs / wall:.1f} jobs/s ({what}); slurmctld {ave_us:.0f} us per submit RPC "
              f"(sdiag, {count} RPCs)", flush=True)
        return row
    finally:
        cl.down()


def cpu_list(text: str) -> set[int]:
    """The CPUs of a ``taskset -c`` list (``0``, ``0-3,8``); ValueError naming the list when it is not one."""
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()) or (hi and int(hi) < int(lo)):
            raise ValueError(f"not a CPU list (as taskset -c takes it, e.g. 0 or 0-3,8): {text!r}")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def _load() -> float:
    """The 1-minute load average of this host."""
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return float("nan")


#: ``lua`` part: the script under a stub ``slurm`` table, N calls of each kind timed with os.clock (CPU time)
_LUA_BENCH = r"""
slurm = {SUCCESS = 0, ERROR = -1, NO_VAL = 4294967294, NO_VAL16 = 65534, NO_VAL64 = 18446744073709551614,
         JOB_SHARED_OK = 1, ESLURM_ACCESS_DENIED = 2002, log_info = function(...) end, log_user = function(...) end}
dofile(SCRIPT)
local parts = {gpu = {flag_default = 1}, other = {flag_default = 0}}
local function timed(what, f)
  local t = os.clock()
  for i = 1, N do f(i) end
  print(string.format("%s %.3f", what, (os.clock() - t) / N * 1e6))
end
timed("submit", function(i)
  local d = {tres_per_job = "gres:gpu:4", priority = 4294967294, comment = "rlsched:model=GNN", name = "j"}
  assert(slurm_job_submit(d, parts, 1001) == 0 and d.priority == 0)
end)
local rec = {job_id = 7, admin_comment = "rlsched:managed gpus=4 | rlsched: placed", priority = 0, partition = "gpu"}
timed("modify_admin", function(i) assert(slurm_job_modify({req_nodes = "node1"}, rec, parts, 0) == 0) end)
timed("modify_user_allowed", function(i) assert(slurm_job_modify({comment = "x"}, rec, parts, 1001) == 0) end)
timed("modify_user_refused", function(i) assert(slurm_job_modify({nice = 5}, rec, parts, 1001) ~= 0) end)
"""


def bench_lua(calls: int, nodes: int, gpus: int) -> dict:
    """CPU time per call of slurm_conf/job_submit.lua's functions in lua5.3 (the script alone: slurmctld's own
    work around it, such as building the ``slurm.jobs`` table of every job before each call, is not in it)."""
    lua = shutil.which("lua5.3") or shutil.which("lua")
    if lua is None:
        raise SystemExit("bench_slurm: lua: no lua5.3 interpreter")
    with tempfile.TemporaryDirectory(prefix="rlsched-lua-") as d:
        cap = Path(d) / "capacity"
        cap.write_text(f"partition=gpu\ngpus={nodes * gpus}\nnodes={nodes}\nmax_node_gpus={gpus}\n")
        src = (REPO / "slurm_conf" / "job_submit.lua").read_text()
        src = src.replace("local CAPACITY_FILE = nil", f"local CAPACITY_FILE = {json.dumps(str(cap))}")
        script = Path(d) / "job_submit.lua"
        script.write_text(src)
        prog = f"SCRIPT = {json.dumps(str(script))}\nN = {int(calls)}\n" + _LUA_BENCH
        p = subprocess.run([lua, "-"], input=prog, capture_output=True, text=True, timeout=600, check=False)
    if p.returncode != 0:
        raise SystemExit(f"bench_slurm: lua: {p.stderr.strip()}")
    res = {k: float(v) for k, v in (line.split() for line in p.stdout.split("\n") if line.strip())}
    print("job_submit.lua CPU time per call (lua5.3, " + f"{calls} calls each): "
          + ", ".join(f"{k} {v:.1f} us" for k, v in res.items()), flush=True)
    return {"calls": calls, "cpu_us_per_call": res}


def _controller_toml(cl: Cluster, policy: str, interval: float, state: Path, reason_calls: int,
                     libslurm: bool = True) -> Path:
    f = state.parent / "controller.toml"
    f.write_text("\n".join([
        "[slurm]", f'conf = "{cl.dir / "etc" / "slurm.conf"}"', 'partition = "gpu"', "command_timeout_s = 60",
        f"libslurm = {'true' if libslurm else 'false'}",
        "[controller]", f'policy = "{policy}"', f"interval_s = {interval}", f'state_dir = "{state}"',
        "min_run_s = 0.0", "start_grace_s = 120.0", f"reason_updates_per_round = {reason_calls}", f'capacity_file = "{cl.dir / "controller" / "capacity"}"',
        "[agents]", "enabled = false", ""]))
    return f


def bench_rounds(nodes: int, gpus: int, jobs: int, rounds: int, interval: float, policy: str, job_s: float,
                 clients: int, reason_calls: int, profile: str | None = None, libslurm: bool = True) -> dict:
    from controller.config import load_config
    from controller.daemon import Controller

    cl = Cluster(nodes, gpus, job_submit=True)
    try:
        load0 = _load()
        up_s = cl.up()
        print(f"rounds: {nodes} slurmd up in {up_s:.1f} s", flush=True)
        cl.write_capacity()
        sizes = [1, 2, 4, 8, 16]
        models = ["GNN", "IMG", "LM", "MoE", "DLRM"]

        def submit(k: int) -> int:
            out = cl.run(["sbatch", "--parsable", f"--gpus={sizes[k % 5]}", "-o", "/dev/null",
                          "--comment", f"rlsched:model={models[k % 5]},samples=1000", "--wrap", f"sleep {job_s:g}"])
            return int(out.strip().split(";")[0])

        t0 = time.perf_counter()
        with cf.ThreadPoolExecutor(clients) as ex:
            ids = list(ex.map(submit, range(jobs)))
        print(f"rounds: {jobs} jobs queued in {time.perf_counter() - t0:.1f} s", flush=True)
        state = Path(tempfile.mkdtemp(prefix="ctl-", dir=cl.dir)) / "state"
        ctl = Controller(load_config(_controller_toml(cl, policy, interval, state, reason_calls, libslurm)))
        # time spent in each Slurm command (one process each), per round
        spent: dict[str, float] = {}
        calls: dict[str, int] = {}
        run = ctl.slurm.run
        lock = threading.Lock()

        def timed(args, stdin=None):
            t = time.perf_counter()
            try:
                return run(args, stdin=stdin)
            finally:
                key = args[0] if args[0] != "scontrol" else (f"scontrol {args[1]}" if len(args) > 1 else
                                                               "scontrol (batch of updates on stdin)")
                with lock:  # the reason writes run in threads of their own
                    spent[key] = spent.get(key, 0.0) + time.perf_counter() - t
                    calls[key] = calls.get(key, 0) + 1

        ctl.slurm.run = timed  # type: ignore[method-assign]
        pin_release = ctl.slurm.pin_release_many

        def timed_pr(pins):
            t = time.perf_counter()
            try:
                return pin_release(pins)
            finally:
                if pins:
                    key = "libslurm pin+release (one update RPC per job)"
                    with lock:
                        spent[key] = spent.get(key, 0.0) + time.perf_counter() - t
                        calls[key] = calls.get(key, 0) + 1

        ctl.slurm.pin_release_many = timed_pr  # type: ignore[method-assign]
        times, placed, queue, per_round, behind, reasons_written, cpu = [], {}, [], [], [], [], []
        per_cmd: list[dict[str, float]] = []
        slurm = cl.slurm()
        started: dict[int, dict[str, int]] = {}
        # full garbage collections between rounds, not in them, as Controller.run runs its rounds
        from controller.daemon import _NO_AUTO_FULL_GC, idle_gc

        thresholds = gc.get_threshold()
        gc.set_threshold(thresholds[0], thresholds[1], _NO_AUTO_FULL_GC)
        prof = None
        if profile:
            import cProfile

            prof = cProfile.Profile()
        load_rounds = _load()
        ctld0 = cl.slurmctld_cpu_s()
        for r in range(rounds):
            t, c = time.perf_counter(), time.process_time()
            if prof is not None and r > 0:  # the first round (imports, policy build) is left out
                prof.enable()
            before = dict(spent)
            rep = ctl.round()
            if prof is not None:
                prof.disable()
            dt = time.perf_counter() - t
            with lock:  # the Slurm commands' time in this round (reason writes of the last round's thread included)
                per_cmd.append({k: round(v - before.get(k, 0.0), 3) for k, v in spent.items() if v > before.get(k, 0.0)})
            cpu.append(time.process_time() - c)
            # the reason writes the round handed off (Controller.wait_reasons), waited for here, outside the
            # round, as the next round would at its start
            tw = time.perf_counter()
            wait = getattr(ctl, "wait_reasons", None)  # (a controller that writes them in the round has none)
            if wait is not None:
                wait()
            behind.append(time.perf_counter() - tw)
            if not rep.ok:
                raise SystemExit(f"bench_slurm: round {r} failed: {rep.error}")
            times.append(dt)
            queue.append(rep.queue)
            reasons_written.append(rep.reasons)
            per_round.append(len(rep.placed))
            for jid, plan in rep.placed:
                placed[jid] = plan
            # what Slurm started (read outside the measured round)
            for j in slurm.jobs():
                if j.job_id in placed and j.job_id not in started and j.state == "RUNNING" and j.gpus_per_node:
                    started[j.job_id] = dict(j.gpus_per_node)
            idle_gc(thresholds[2])
            time.sleep(max(0.0, interval - (time.perf_counter() - t)))
        gc.set_threshold(*thresholds)
        ctld_cpu = cl.slurmctld_cpu_s() - ctld0
        load_end = _load()
        if prof is not None:
            prof.dump_stats(profile)
        exact = sum(1 for jid, plan in placed.items() if started.get(jid) == plan)
        differ = {jid: (placed[jid], started[jid]) for jid in started if started[jid] != placed[jid]}
        never = [jid for jid in placed if jid not in started]
        # the first round builds the policy (imports, contention model): reported on its own
        ts = sorted(times[1:] or times)
        quiet = sorted(t for t, n in zip(times[1:], per_round[1:]) if n == 0) or [float("nan")]

        def pct(q: float, xs: list[float] | None = None) -> float:
            xs = ts if xs is None else xs
            return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]

        # a round with its reason writes: what the round would take if it waited for them itself
        whole = sorted(t + b for t, b in zip(times[1:], behind[1:])) or ts

        res = {"pins": "libslurm" if ctl.slurm.pin_release_many([]) is not None else "scontrol",
               "load_at_start": load0, "load_at_rounds": load_rounds, "load_at_end": load_end,
               "ctl_cpus": Cluster.ctl_cpus, "node_cpus": Cluster.node_cpus,
               # slurmctld's own CPU time (user + system) over the rounds, all its threads
               "slurmctld_cpu_s": round(ctld_cpu, 2),
               "nodes": nodes, "gpus_per_node": gpus, "jobs": jobs, "rounds": rounds, "interval_s": interval,
               "policy": policy, "job_s": job_s, "slurmd_up_s": round(up_s, 2),
               "round_s": {"p50": round(pct(0.5), 4), "p90": round(pct(0.9), 4), "p99": round(pct(0.99), 4),
                           "max": round(ts[-1], 4), "mean": round(sum(ts) / len(ts), 4)},
               "round_with_reasons_s": {"p50": round(pct(0.5, whole), 4), "p90": round(pct(0.9, whole), 4),
                                        "p99": round(pct(0.99, whole), 4), "max": round(whole[-1], 4)},
               "reasons_behind_s": [round(b, 4) for b in behind],
               # the controller's own CPU time in each round (this process, its threads included; not the Slurm
               # commands it runs): less sensitive to the host's load than the wall times
               "round_cpu_s": [round(x, 4) for x in cpu],
               "round_cpu_s_mean": round(sum(cpu[1:]) / max(1, len(cpu) - 1), 4),
               "reasons_written": sum(r for r in reasons_written),
               "first_round_s": round(times[0], 4), "queue_first": queue[0], "queue_last": queue[-1],
               "placed_per_round": per_round, "round_times_s": [round(t, 4) for t in times],
               "round_command_s": per_cmd,
               "rounds_without_placements_p50_s": round(quiet[len(quiet) // 2], 4),
               "placed": len(placed), "started_exact": exact, "started_different": len(differ),
               "not_started_seen": len(never), "differences": {str(k): v for k, v in list(differ.items())[:10]},
               "mismatch_metric": ctl.metrics.value("rlsched_placement_mismatch_total"),
               # uneven splits the controller set to Slurm's split, and placements it kept for the next round
               # because Slurm's split depended on which jobs start first (SlurmBackend._slurm_split)
               "splits_set": ctl.metrics.value("rlsched_decisions_total", action="split_set"),
               "splits_deferred": ctl.metrics.value("rlsched_decisions_total", action="split_deferred"),
               "slurm_calls": ctl.slurm.calls, "reason_updates_per_round": reason_calls,
               "queue_reads": dict(getattr(ctl.slurm, "queue_reads", {})),
               # jobs that started unevenly, read alone through libslurm instead of a JSON read of every job
               "detail_reads": getattr(ctl.slurm, "detail_reads", 0),
               "slurm_command_s": {k: round(v, 3) for k, v in spent.items()},
               "slurm_command_calls": calls,
               "slurm_command_mean_ms": {k: round(1000 * spent[k] / calls[k], 1) for k in spent}}
        print(f"rounds ({res['pins']} pins): {nodes} nodes x {gpus} GPUs, {jobs} queued, {policy}: round p50 {res['round_s']['p50']:.3f} s, "
              f"p99 {res['round_s']['p99']:.3f} s, max {res['round_s']['max']:.3f} s over rounds 2-{rounds} (first {times[0]:.2f} s; "
              f"with the reason writes behind each round: p50 {res['round_with_reasons_s']['p50']:.3f} s, "
              f"p99 {res['round_with_reasons_s']['p99']:.3f} s); "
              f"{len(placed)} placed, {exact} started exactly as planned, {len(differ)} differently, "
              f"{len(never)} not seen running; {res['splits_set']:g} split(s) set to Slurm's, "
              f"{res['splits_deferred']:g} deferred; load {load0:.1f} / {load_rounds:.1f} / {load_end:.1f} "
              f"(start, rounds, end); slurmctld {ctld_cpu:.1f} s CPU over the rounds", flush=True)
        return res
    finally:
        cl.down()


def _slurm_version() -> str:
    p = subprocess.run(["slurmctld", "-V"], capture_output=True, text=True, check=False)
    return (p.stdout + p.stderr).strip()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["submit", "rounds", "lua", "all", "_lib_submit"])
    ap.add_argument("--client", default="sbatch,libslurm",
                    help="submit: the clients, comma-separated: sbatch (one process per job) and/or libslurm (one "
                         "process, --clients threads, one RPC per job); default both")
    ap.add_argument("--plugin", choices=["both", "with", "without"], default="both",
                    help="submit: with job_submit.lua, without a plugin, or both (default)")
    ap.add_argument("--pins", choices=["libslurm", "scontrol"], default="libslurm",
                    help="rounds: the controller's placements as one libslurm update RPC per job that pins and "
                         "releases (default), or scontrol pins then one scontrol release (slurm.libslurm = false)")
    ap.add_argument("--sched-params", help="slurm.conf SchedulerParameters of the clusters (default: "
                                           "local-cluster.sh's, sched_interval=2,defer_batch)")
    ap.add_argument("--ctl-cpus", help="CPUs (a taskset -c list) of slurmctld and of this process (the controller, "
                                       "its squeue/sinfo, the submitting clients): local-cluster.sh --ctl-cpus")
    ap.add_argument("--node-cpus", help="CPUs (a taskset -c list) of every slurmd, hence of the job steps and jobs: "
                                        "local-cluster.sh --node-cpus. With --ctl-cpus: a controller host that "
                                        "runs no jobs, on one machine")
    ap.add_argument("--conf", help=argparse.SUPPRESS)  # _lib_submit: the cluster's slurm.conf
    ap.add_argument("--hold", action="store_true", help=argparse.SUPPRESS)  # _lib_submit: submit held
    ap.add_argument("--jobs", type=int, default=None, help="jobs to submit (submit: 2000, rounds: 1000)")
    ap.add_argument("--clients", type=int, default=4, help="concurrent sbatch processes (default 4)")
    ap.add_argument("--nodes", type=int, default=None, help="slurmd (submit: 4, rounds: 64)")
    ap.add_argument("--gpus", type=int, default=8, help="GPUs per node (default 8)")
    ap.add_argument("--rounds", type=int, default=40, help="controller rounds (default 40)")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between round starts (default 1)")
    ap.add_argument("--policy", default="greedy", help="controller policy (default greedy)")
    ap.add_argument("--job-s", type=float, default=15.0, help="how long each job of `rounds` sleeps (default 15)")
    ap.add_argument("--reason-calls", type=int, default=10,
                    help="controller.reason_updates_per_round for `rounds` (default 10, the controller's default)")
    ap.add_argument("--profile", help="rounds: write a cProfile of rounds 2 to --rounds here (pstats format; the main "
                                      "thread's wall time, Slurm commands included)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    if args.what == "_lib_submit":  # the libslurm client of `submit`, in a process of its own
        print(json.dumps(_lib_submit(args.conf, args.jobs or 2000, args.clients, args.hold)))
        return 0
    if args.what == "lua":  # no daemons: any user
        out = {"host": {"cpus": os.cpu_count(), "python": platform.python_version()},
               "lua": bench_lua(args.jobs or 100000, args.nodes or 4, args.gpus)}
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
        return 0
    if os.geteuid() != 0:
        print("bench_slurm: error: needs root (it starts slurmctld and slurmd)", file=sys.stderr)
        return 2
    Cluster.sched_params = args.sched_params
    allowed = os.sched_getaffinity(0)
    for opt, v in (("--node-cpus", args.node_cpus), ("--ctl-cpus", args.ctl_cpus)):
        try:
            cpus = cpu_list(v) if v else None
            if cpus is not None and not cpus <= allowed:
                raise ValueError(f"CPUs {sorted(cpus - allowed)} are not this process's ({sorted(allowed)})")
            if cpus is not None and opt == "--ctl-cpus":  # before any thread starts: they all inherit it
                os.sched_setaffinity(0, cpus)
        except (ValueError, OSError) as exc:
            print(f"bench_slurm: error: {opt}: {exc}", file=sys.stderr)
            return 2
    Cluster.ctl_cpus, Cluster.node_cpus = args.ctl_cpus, args.node_cpus
    out: dict = {"host": {"cpus": os.cpu_count(), "python": platform.python_version(),
                          "ctl_cpus": args.ctl_cpus, "node_cpus": args.node_cpus,
                          "slurm": _slurm_version()}, "sched_params": args.sched_params or "sched_interval=2,defer_batch"}
    if args.what in ("submit", "all"):
        kinds = [k.strip() for k in args.client.split(",") if k.strip()]
        if not kinds or any(k not in ("sbatch", "libslurm") for k in kinds):
            print(f"bench_slurm: error: --client {args.client!r}: give sbatch and/or libslurm", file=sys.stderr)
            return 2
        modes = {"both": (True, False), "with": (True,), "without": (False,)}[args.plugin]
        out["submit"] = bench_submit(args.jobs or 2000, args.clients, args.nodes or 4, args.gpus, kinds, modes)
    if args.what in ("rounds", "all"):
        out["rounds"] = bench_rounds(args.nodes or 64, args.gpus, args.jobs or 1000, args.rounds, args.interval,
                                     args.policy, args.job_s, args.clients, args.reason_calls, args.profile,
                                     args.pins == "libslurm")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
