#!/usr/bin/env python3
"""GPU check of the job helper: one short job on one GPU, through a real node agent.

    bash scripts/gpu-check.sh            # needs a CUDA GPU; exits 1 with one line when there is none
    bash scripts/gpu-check.sh --cpu      # the same run on the CPU with gloo (labelled: not a GPU check)

What it runs (``scripts/examples/preempt_demo.py``'s ``run_demo``): an ``rlsched agent`` on a free local
port with a fresh key; ``train_mlp.py --device cuda --process-group`` (a 1-rank NCCL group, so DDP's
gradient all-reduce goes through NCCL; ``--device cpu``: gloo) as a fake Slurm job; once the agent has
seen ``--preempt-at`` steps, a Preempt RPC (checkpoint, exit 75); the job started again resumes from the
checkpoint and finishes the exact step count. The profiler's Chrome trace of the resumed run is written
(``RLSCHED_PROFILE_TRACE``) and read back with ``nodeagent.profiling.summarize_chrome_trace``.

It prints a few lines -- device, checkpoint/resume, throughput the agent measured, profile (CUDA
activity, NCCL kernels, comm_fraction) -- then ``PASS``, or ``FAIL: <step>: <why>`` and exits 1. The full
record is written to ``<workdir>/gpu-check.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts" / "examples"))

from nodeagent.profiling import summarize_chrome_trace  # noqa: E402


class CheckFailed(Exception):
    """A step of the check failed: ``step`` names it, the message says why."""

    def __init__(self, step: str, why: str) -> None:
        super().__init__(f"{step}: {why}")


def gpu_inventory() -> tuple[str | None, str]:
    """(name of CUDA device 0 or None, one line on torch's CUDA build and CUDA_VISIBLE_DEVICES)."""
    import torch

    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    where = (f"torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'}, "
             + (f"CUDA_VISIBLE_DEVICES={cvd!r}" if cvd is not None else "CUDA_VISIBLE_DEVICES unset"))
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return None, where
    try:
        v = torch.cuda.nccl.version()
        nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    except Exception as exc:  # a build without NCCL: the job's init_process_group("nccl") will say so
        nccl = f"unavailable ({exc})"
    return torch.cuda.get_device_name(0), f"{where}, NCCL {nccl}"


def _need(cond: bool, step: str, why: str) -> None:
    if not cond:
        raise CheckFailed(step, why)


def check(cpu: bool, total_steps: int, preempt_at: int, step_sleep: float, work: Path) -> list[str]:
    """Run the job and check each step; returns the readable lines (raises CheckFailed)."""
    from preempt_demo import run_demo

    device = "cpu" if cpu else "cuda"
    trace = work / "profile"
    try:
        out = run_demo("train_mlp.py", total_steps, preempt_at, step_sleep,
                       job_args=["--device", device, "--process-group", "--report-every", "2"],
                       job_env={"RLSCHED_PROFILE_TRACE": str(trace)}, work=work)
    except RuntimeError as exc:  # the job ended before the agent saw --preempt-at steps
        raise CheckFailed("job", str(exc)) from None
    (work / "gpu-check.json").write_text(json.dumps(out, indent=2, default=str))
    lines = []
    start = out.get("start") or {}
    want_backend = "gloo" if cpu else "nccl"
    _need(start.get("device", "").startswith(device) and start.get("backend") == want_backend, "device",
          f"the job ran on {start.get('device')!r} with backend {start.get('backend')!r}, not {device} with "
          f"{want_backend} (see {work / 'job1.log'})")
    lines.append(f"job        train_mlp.py on {start['device']}, process group {start['backend']} (1 rank)")
    pre = out.get("preempt") or {}
    _need(out.get("job_exit_code") == 75 and pre.get("ok"), "checkpoint",
          f"Preempt gave {pre.get('message', pre)!r}, job exit {out.get('job_exit_code')} (want 75; see "
          f"{work / 'job1.log'}, {work / 'agent.log'})")
    lines.append(f"checkpoint preempted at step {pre['checkpoint_step']}, exit 75; {out['checkpoint_bytes']:,} "
                 f"bytes; {pre['message']}")
    res = out.get("resume") or {}
    _need(out.get("resume_exit_code") == 0 and out.get("exact_total"), "resume",
          f"resumed run exit {out.get('resume_exit_code')}, steps {res} (want {total_steps} in total; see "
          f"{work / 'job2.log'})")
    lines.append(f"resume     from step {res['start_step']}: {res['steps_this_run']} more steps, {res['final_step']} "
                 f"of {total_steps} in total, exit 0")
    st = out.get("stats_before_preempt") or {}
    _need((st.get("samples_per_s") or 0) > 0, "throughput", f"the agent measured no throughput: {st}")
    cs = st.get("cs")
    lines.append(f"throughput {st['samples_per_s']:.0f} samples/s measured by the agent at step {st['step']}; "
                 + (f"isolated {st['isolated_samples_per_s']:.0f} ({st['isolated_source']}), CS {cs:.2f}"
                    if cs is not None else "isolated throughput not known yet (CS None)"))
    prof = (out.get("resume_done") or {}).get("profile")
    _need(prof is not None, "profile", f"the resumed run reported no profile (see {work / 'job2.log'})")
    if not cpu:
        _need(prof["source"] == "cuda" and prof["device_events"] > 0, "profile",
              f"the profiler recorded no CUDA activity ({prof['source']} source; see {work / 'job2.log'})")
        lines.append(f"profile    CUDA activity: {prof['device_events']} device records, GPU busy "
                     f"{prof['busy_us'] / 1e3:.2f} ms of {prof['wall_us'] / 1e3:.2f} ms wall; NCCL kernels "
                     f"{prof['comm_kernels']}, {prof['comm_us'] / 1e3:.3f} ms; "
                     f"comm_fraction {prof['comm_fraction']:.3f}")
    else:
        lines.append(f"profile    CPU activity: collectives {prof['comm_us'] / 1e3:.3f} ms of "
                     f"{prof['wall_us'] / 1e3:.2f} ms wall; comm_fraction {prof['comm_fraction']:.3f}")
    tfile = Path(f"{trace}.rank0.json")
    _need(tfile.is_file(), "trace", f"the profiler wrote no trace at {tfile}")
    t = summarize_chrome_trace(tfile)
    _need(t.source == prof["source"], "trace", f"the trace reads as {t.source} activity, the job's profile as "
                                               f"{prof['source']}")
    lines.append(f"trace      {tfile}: {t.source} activity, {t.device_events} device records, "
                 f"comm_fraction {t.comm_fraction:.3f} read back")
    cf = st.get("comm_fraction")
    lines.append("reported   " + (f"comm_fraction {cf:.3f} (first run's window) in the agent's JobStats"
                                  if cf is not None else "no comm_fraction in the agent's JobStats yet")
                 + f"; record in {work / 'gpu-check.json'}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 prog="gpu-check.sh")
    ap.add_argument("--cpu", action="store_true", help="run on the CPU with gloo (not a GPU check)")
    ap.add_argument("--total-steps", type=int, default=300)
    ap.add_argument("--preempt-at", type=int, default=80, help="preempt once the agent has seen this step")
    ap.add_argument("--step-sleep", type=float, default=0.01, help="seconds added to each step")
    ap.add_argument("--workdir", type=Path, default=None, help="directory for store, logs, trace (default: temp)")
    args = ap.parse_args(argv)
    if not 0 < args.preempt_at < args.total_steps:
        print(f"gpu-check: --preempt-at {args.preempt_at} must be in 1..{args.total_steps - 1} (--total-steps)",
              file=sys.stderr)
        return 2
    try:
        gpu, where = gpu_inventory()
    except ImportError as exc:
        print(f"gpu-check: FAIL: torch is not installed for {sys.executable} ({exc}); the check runs a torch job")
        return 1
    if args.cpu:
        print(f"gpu-check: CPU FALLBACK (--cpu): gloo on the CPU, NOT a GPU check ({where})")
    elif gpu is None:
        print(f"gpu-check: FAIL: no CUDA GPU visible ({where}); run on a GPU host, or with --cpu for the CPU path")
        return 1
    else:
        print(f"gpu-check: GPU {gpu} (cuda:0), NCCL; {where}")
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="rlsched-gpu-check-"))
    try:
        lines = check(args.cpu, args.total_steps, args.preempt_at, args.step_sleep, work)
    except CheckFailed as exc:
        print(f"gpu-check: FAIL: {exc}")
        return 1
    except Exception as exc:  # the agent or the job broke in a way the checks above do not name
        print(f"gpu-check: FAIL: run: {type(exc).__name__}: {exc} (logs in {work})")
        return 1
    for line in lines:
        print(f"  {line}")
    print("gpu-check: PASS" + (" (CPU fallback, not a GPU check)" if args.cpu else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
