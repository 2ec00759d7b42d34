#!/usr/bin/env bash
# Set up rlsched and run its main job on the shipped defaults: the shipped
# 256-job DeepShare job set on a simulated 4 x 8-GPU cluster, heuristics
# against the shipped RL policies. Results land in out/quickstart/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --no-slurm
# the environment setup.sh installed into (REPO/.venv on an externally managed system Python)
source scripts/python-env.sh
out=${1:-out/quickstart}
"$PY" -m rlsched.cli simulate \
  --trace data/traces/deepshare/simulate/trace0.json \
  --cluster 4x8 \
  --policy fifo,srtf,las,greedy,rl-base,rl-hybrid \
  --out "$out" --overwrite
echo
echo "Per-job records, summary.json and plots (JCT CDF, utilisation, CS) are in $out/"
