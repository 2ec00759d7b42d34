#!/usr/bin/env bash
# Train the reward-weight branches A-E of the size-free policy (seed 002's reward -W1*CS + W2*Util,
# W1 = 0.3 / 0.4 / 0.5 / 0.6 / 0.7, trainer.evaluate.BRANCHES) and write them as OUT/A..E.{json,safetensors}
# (default OUT: policies/checkpoints/branches, the shipped ones):
#   bash scripts/train_branches.sh [OUT]
# Each branch is one `rlsched train-sizefree --w1 W1` run: cloning of the greedy heuristic with one DAgger
# round, then MaskablePPO on the seed reward (the fine-tuned network is written), on 4x8 with uniform 1..32-GPU
# job sets (zero arrivals and Poisson 85 / 90 % load). The runs are sequential, niced, about 2-4 minutes of
# CPU each. `rlsched evaluate --branches OUT` evaluates them (docs/RESULTS.md, "Generated tables").
set -euo pipefail

die() { echo "train_branches.sh: error: $*" >&2; exit 2; }
case "${1:-}" in
  -h|--help) sed -n '2,9p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
  -*) die "unknown option '$1' (an OUT that starts with '-': write ./$1)" ;;
esac
[[ $# -le 1 ]] || die "expected at most one OUT, got $# arguments"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$REPO/policies/checkpoints/branches}"
[[ -n "$OUT" ]] || die "OUT must not be empty"
mkdir -p -- "$OUT" || die "cannot make $OUT"
source "$REPO/scripts/python-env.sh"
"$PY" -c 'import rlsched' 2>/dev/null || die "rlsched is not installed for $PY (bash scripts/setup.sh installs it)"

for BW in A:0.3 B:0.4 C:0.5 D:0.6 E:0.7; do
  B="${BW%%:*}"; W="${BW#*:}"
  echo "== branch $B (W1 $W)"
  nice -n 10 "$PY" -m rlsched.cli train-sizefree --out "$OUT/$B" --w1 "$W" --clusters 4x8 --sets 4 --dagger 1 \
    --bc-epochs 20 --ppo-timesteps 16384 --ppo-n-steps 1024 --compare none --seed 7000
done
