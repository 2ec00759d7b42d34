#!/usr/bin/env bash
# GPU check of the job helper on one GPU: checkpoint, resume, throughput report, profile.
#
#   bash scripts/gpu-check.sh          # on a GPU host; exits 1 with "gpu-check: FAIL: ..." when there is no GPU
#   bash scripts/gpu-check.sh --cpu    # the same run on the CPU with gloo, labelled CPU FALLBACK
#   bash scripts/gpu-check.sh --help   # options (--total-steps, --preempt-at, --step-sleep, --workdir)
#
# Starts a local rlsched agent, runs scripts/examples/train_mlp.py on cuda:0 in a 1-rank NCCL group,
# preempts it through the agent, resumes it from its checkpoint and reads its torch.profiler window
# (CUDA activity, NCCL kernels, comm_fraction); prints what it measured, then PASS or FAIL (exit 1).
# The work is scripts/gpu_check.py; this wrapper picks rlsched's Python (scripts/python-env.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/python-env.sh
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" scripts/gpu_check.py "$@"
