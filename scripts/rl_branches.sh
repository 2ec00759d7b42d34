#!/usr/bin/env bash
# The reward-weight branches A-E of the size-free policy and the results page built on them:
#
#   bash scripts/rl_branches.sh train [OUT]
#     trains the five branches (seed 002's reward -W1*CS + W2*Util, W1 = 0.3 / 0.4 / 0.5 / 0.6 / 0.7,
#     trainer.evaluate.BRANCHES) into OUT/A..E.{json,safetensors} (default OUT: policies/checkpoints/branches,
#     the shipped ones). Each is one `rlsched train-sizefree --w1 W1` run: cloning of the greedy heuristic
#     with one DAgger round, then 6,144 MaskablePPO steps on the seed reward (the fine-tuned network is
#     written), on 4x8 with uniform 1..32-GPU job sets (zero arrivals, Poisson 85 / 90 % load). Sequential,
#     niced, about 1.5 minutes of CPU each.
#
#   bash scripts/rl_branches.sh results [DIR]
#     regenerates docs/RESULTS.md's "Generated tables", docs/rl_results.json and the figures
#     docs/figures/rl_{jct_cdf,cs_distribution,util_kde}_{normal,uniform}.png and rl_branches_jct_vs_util.png.
#     DIR (default /tmp/rlsched-eval) receives the evaluation traces, replaced on each run: five groups of 3
#     held-out job sets of 256 jobs for 4x8 (seeds 7 / 390 / 27 / 37 / 391, disjoint from every training and
#     validation seed of the shipped checkpoints). Then one `rlsched evaluate` runs the best heuristics, the
#     size-free rl-base / rl-hybrid, the fixed-shape 4x8 checkpoints, rl-prior and the shipped branches on
#     every set. About 3 minutes of CPU.
set -euo pipefail

die() { echo "rl_branches.sh: error: $*" >&2; exit 2; }
usage() { sed -n '2,19p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
case "${1:-}" in
  -h|--help) usage; exit 0 ;;
  train|results) ;;
  *) usage >&2; die "expected 'train [OUT]' or 'results [DIR]', got '${1:-}'" ;;
esac
[[ $# -le 2 ]] || die "expected at most one path after '$1', got $(($# - 1))"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$REPO/scripts/python-env.sh"
"$PY" -c 'import rlsched' 2>/dev/null || die "rlsched is not installed for $PY (bash scripts/setup.sh installs it)"
rlsched() { "$PY" -m rlsched.cli "$@"; }

if [[ "$1" == train ]]; then
  OUT="${2:-policies/checkpoints/branches}"  # relative to the repository (as the checkpoints record it)
  [[ -z "${2:-}" ]] && cd -- "$REPO"
  [[ -n "$OUT" ]] || die "OUT must not be empty"
  mkdir -p -- "$OUT" || die "cannot make $OUT"
  for BW in A:0.3 B:0.4 C:0.5 D:0.6 E:0.7; do
    B="${BW%%:*}"; W="${BW#*:}"
    echo "== branch $B (W1 $W)"
    nice -n 10 "$PY" -m rlsched.cli train-sizefree --out "$OUT/$B" --w1 "$W" --clusters 4x8 --sets 3 --dagger 1 \
      --bc-epochs 10 --ppo-timesteps 6144 --ppo-n-steps 1024 --compare none --seed 7000
  done
  exit 0
fi

E="${2:-/tmp/rlsched-eval}"
[[ -n "$E" ]] || die "DIR must not be empty"
for g in normal poisson-90 uniform uniform-heavy uniform-poisson-90; do rm -rf -- "${E:?}/$g"; done
rlsched trace generate --mix normal --sets 3 --seed 7 --out "$E/normal"
rlsched trace generate --mix normal --arrival poisson --load 0.90 --sets 3 --seed 390 --out "$E/poisson-90"
rlsched trace generate --mix normal --demand uniform --sets 3 --seed 27 --out "$E/uniform"
rlsched trace generate --mix heavy --demand uniform --sets 3 --seed 37 --out "$E/uniform-heavy"
rlsched trace generate --mix normal --demand uniform --arrival poisson --load 0.90 --sets 3 --seed 391 \
  --out "$E/uniform-poisson-90"
cd -- "$REPO"
nice -n 10 "$PY" -m rlsched.cli evaluate \
  --policies lgtf,lgtf:nosplit,srtf:nosplit,greedy,srtf,las,rl-prior,rl-base,rl-hybrid,rl-base-4x8,rl-hybrid-4x8 \
  --branches policies/checkpoints/branches --traces "$E" --cluster 4x8 --figure-groups normal,uniform \
  --out docs --results-md docs/RESULTS.md
