#!/usr/bin/env python3
"""End-to-end preemption demo without Slurm: agent + example job + Preempt + resume.

    python scripts/examples/preempt_demo.py [--auth munge:/path/socket] [--script train_tiny_lm.py] [--device cpu]

Starts `rlsched agent` (a fresh root key by default, the job using its per-job key;
or the given auth: munge as root needs a slurmctld that knows job 9001, since the
agent asks Slurm who owns the job whose process a privileged caller registers),
runs an example training script as a subprocess (SLURM_JOB_ID faked), waits until it has made
progress, prints its JobStats, preempts it through AgentClient, checks the
exit code (75) and the checkpoint, restarts it, and prints one JSON summary:
steps before/after, preemption latency, checkpoint size, throughput and CS, the job's device and
its profile. ``run_demo`` is the same as a function (scripts/gpu_check.py runs it).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))

from nodeagent.auth import SharedKeyAuthenticator, make_authenticator, write_job_key  # noqa: E402
from nodeagent.client import AgentClient, AgentError  # noqa: E402
from nodeagent.store import LocalFSStore  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_demo(script: str = "train_mlp.py", total_steps: int = 600, preempt_at: int = 200, step_sleep: float = 0.01,
             auth: str | None = None, job_args: list[str] | None = None, job_env: dict[str, str] | None = None,
             work: Path | None = None) -> dict:
    """Run the demo; returns its summary (see the module doc). ``job_args`` are appended to the job's
    command line (e.g. ``["--device", "cuda"]``), ``job_env`` to its environment; ``work``: the
    directory for the store, keys and logs (default: a new temporary one)."""
    work = work or Path(tempfile.mkdtemp(prefix="rlsched-demo-"))
    auth_spec = auth or f"sharedkey:{SharedKeyAuthenticator.generate(work / 'agent.key')}"
    job_auth = auth_spec  # munge: the job's own uid
    if auth_spec.startswith("sharedkey:"):  # the job gets its per-job key, as the Slurm Prolog would write it
        job_auth = f"jobkey:{write_job_key(auth_spec.split(':', 1)[1], work / 'jobkeys', '9001', os.geteuid())}"
    port = free_port()
    agent = subprocess.Popen([sys.executable, "-m", "rlsched.cli", "agent", "--node", "demo", "--listen",
                              f"127.0.0.1:{port}", "--store", str(work / "store"), "--auth", auth_spec],
                             stderr=open(work / "agent.log", "w"), cwd=REPO)
    env = {**os.environ, "RLSCHED_AGENT": f"127.0.0.1:{port}", "RLSCHED_AUTH": job_auth,
           "RLSCHED_JOB_KEY": "demo-job", "SLURM_JOB_ID": "9001", "PYTHONPATH": str(REPO), **(job_env or {})}
    cmd = [sys.executable, str(HERE / script), "--total-steps", str(total_steps), *(job_args or [])]
    out: dict = {"auth": auth_spec.split(":")[0], "script": script, "total_steps": total_steps}
    try:
        c = AgentClient(f"127.0.0.1:{port}", make_authenticator(auth_spec), timeout=5)
        for _ in range(300):
            try:
                c.health()
                break
            except AgentError:
                time.sleep(0.2)
        job = subprocess.Popen(cmd + ["--step-sleep", str(step_sleep)], env=env, stdout=subprocess.PIPE,
                               stderr=open(work / "job1.log", "w"), text=True)
        st = None
        while job.poll() is None:
            stats = [s for s in c.job_stats() if s["job_key"] == "demo-job"]
            if stats and stats[0]["step"] >= preempt_at:
                st = stats[0]
                break
            time.sleep(0.1)
        if st is None:
            job.communicate(timeout=60)
            raise RuntimeError(f"job ended (exit {job.returncode}) before it could be preempted; raise --total-steps "
                             f"or see {work / 'job1.log'}")
        out["stats_before_preempt"] = st
        t0 = time.monotonic()
        r = c.preempt("demo-job", "9001", timeout_s=60)
        out["preempt_rpc_s"] = round(time.monotonic() - t0, 3)
        stdout1, _ = job.communicate(timeout=60)
        out["start"] = _json_lines(stdout1, "start")
        out["preempt"] = r
        out["job_exit_code"] = job.returncode
        info = LocalFSStore(work / "store").latest("demo-job")
        out["checkpoint_bytes"] = info.size if info else None
        t1 = time.monotonic()
        job2 = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        (work / "job2.log").write_text(job2.stderr)
        out["resume_run_s"] = round(time.monotonic() - t1, 3)
        out["resume_exit_code"] = job2.returncode
        done = _json_lines(job2.stdout, "done")
        out["resume_done"] = done
        if done:
            out["resume"] = {k: done[k] for k in ("start_step", "steps_this_run", "final_step")}
            out["exact_total"] = (done["start_step"] + done["steps_this_run"] == total_steps == done["final_step"])
        else:
            out["exact_total"] = False
        c.close()
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=30)
    out["workdir"] = str(work)
    return out


def _json_lines(stdout: str, event: str) -> dict | None:
    """The last JSON line of a job's stdout whose ``event`` is ``event`` (None if it printed none)."""
    found = None
    for line in stdout.splitlines():
        if line.startswith("{"):
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if d.get("event") == event:
                found = d
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--auth", default=None, help="auth spec (default: a fresh sharedkey)")
    ap.add_argument("--script", default="train_mlp.py", help="example script in scripts/examples")
    ap.add_argument("--total-steps", type=int, default=600)
    ap.add_argument("--preempt-at", type=int, default=200, help="preempt once the agent saw this step")
    ap.add_argument("--step-sleep", type=float, default=0.01)
    ap.add_argument("--device", default=None, choices=("auto", "cuda", "cpu"), help="the job's --device")
    args = ap.parse_args()
    try:
        out = run_demo(args.script, args.total_steps, args.preempt_at, args.step_sleep, args.auth,
                       ["--device", args.device] if args.device else None)
    except RuntimeError as exc:
        print(f"preempt_demo: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(out, indent=2, default=str))
    return 0 if out.get("exact_total") and out.get("job_exit_code") == 75 else 1


if __name__ == "__main__":
    sys.exit(main())
