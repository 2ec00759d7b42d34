#!/usr/bin/env python3
"""End-to-end preemption demo without Slurm: agent + example job + Preempt + resume.

    python scripts/examples/preempt_demo.py [--auth munge:/path/socket] [--script train_tiny_lm.py]

Starts `rlsched agent` (a fresh root key by default, the job using its per-job key;
or the given auth: munge as root needs a slurmctld that knows job 9001, since the
agent asks Slurm who owns the job whose process a privileged caller registers),
runs an example training script as a subprocess (SLURM_JOB_ID faked), waits until it has made
progress, prints its JobStats, preempts it through AgentClient, checks the
exit code (75) and the checkpoint, restarts it, and prints one JSON summary:
steps before/after, preemption latency, checkpoint size, throughput and CS.
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--auth", default=None, help="auth spec (default: a fresh sharedkey)")
    ap.add_argument("--script", default="train_mlp.py", help="example script in scripts/examples")
    ap.add_argument("--total-steps", type=int, default=600)
    ap.add_argument("--preempt-at", type=int, default=200, help="preempt once the agent saw this step")
    ap.add_argument("--step-sleep", type=float, default=0.01)
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="rlsched-demo-"))
    auth_spec = args.auth or f"sharedkey:{SharedKeyAuthenticator.generate(work / 'agent.key')}"
    job_auth = auth_spec  # munge: the job's own uid
    if auth_spec.startswith("sharedkey:"):  # the job gets its per-job key, as the Slurm Prolog would write it
        job_auth = f"jobkey:{write_job_key(auth_spec.split(':', 1)[1], work / 'jobkeys', '9001', os.geteuid())}"
    port = free_port()
    agent = subprocess.Popen([sys.executable, "-m", "rlsched.cli", "agent", "--node", "demo", "--listen",
                              f"127.0.0.1:{port}", "--store", str(work / "store"), "--auth", auth_spec],
                             stderr=open(work / "agent.log", "w"), cwd=REPO)
    env = {**os.environ, "RLSCHED_AGENT": f"127.0.0.1:{port}", "RLSCHED_AUTH": job_auth,
           "RLSCHED_JOB_KEY": "demo-job", "SLURM_JOB_ID": "9001", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, str(HERE / args.script), "--total-steps", str(args.total_steps)]
    out: dict = {"auth": auth_spec.split(":")[0], "script": args.script, "total_steps": args.total_steps}
    try:
        c = AgentClient(f"127.0.0.1:{port}", make_authenticator(auth_spec), timeout=5)
        for _ in range(300):
            try:
                c.health()
                break
            except AgentError:
                time.sleep(0.2)
        job = subprocess.Popen(cmd + ["--step-sleep", str(args.step_sleep)], env=env, stdout=subprocess.PIPE,
                               stderr=open(work / "job1.log", "w"), text=True)
        st = None
        while job.poll() is None:
            stats = [s for s in c.job_stats() if s["job_key"] == "demo-job"]
            if stats and stats[0]["step"] >= args.preempt_at:
                st = stats[0]
                break
            time.sleep(0.1)
        if st is None:
            raise SystemExit("job ended before it could be preempted; raise --total-steps")
        out["stats_before_preempt"] = st
        t0 = time.monotonic()
        r = c.preempt("demo-job", "9001", timeout_s=60)
        out["preempt_rpc_s"] = round(time.monotonic() - t0, 3)
        job.communicate(timeout=60)
        out["preempt"] = r
        out["job_exit_code"] = job.returncode
        info = LocalFSStore(work / "store").latest("demo-job")
        out["checkpoint_bytes"] = info.size if info else None
        t1 = time.monotonic()
        job2 = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        out["resume_run_s"] = round(time.monotonic() - t1, 3)
        done = [json.loads(x) for x in job2.stdout.splitlines() if x.startswith("{")][-1]
        out["resume"] = {k: done[k] for k in ("start_step", "steps_this_run", "final_step")}
        out["resume_exit_code"] = job2.returncode
        out["exact_total"] = done["start_step"] + done["steps_this_run"] == args.total_steps == done["final_step"]
        c.close()
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=30)
    out["workdir"] = str(work)
    print(json.dumps(out, indent=2, default=str))
    return 0 if out.get("exact_total") and out.get("job_exit_code") == 75 else 1


if __name__ == "__main__":
    sys.exit(main())
