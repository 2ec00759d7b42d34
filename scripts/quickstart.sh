#!/usr/bin/env bash
# Set up rlsched and run its main job on the shipped defaults: the shipped
# 256-job DeepShare job set on a simulated 4 x 8-GPU cluster, heuristics
# against the shipped RL policies.
#
#   bash scripts/quickstart.sh        # results in out/quickstart/ of the repository (replaced each time)
#   bash scripts/quickstart.sh DIR    # results in DIR (relative to the current directory)
#
# DIR may be missing, empty, or the output of an earlier run (summary.json,
# jobs_*.parquet and plots, as `rlsched simulate --out` writes them), which is
# replaced; any other non-empty DIR is refused, so nothing of yours is deleted.
set -euo pipefail

usage() { sed -n '6,7p' "$0" | sed 's/^#  *//'; }
die() { echo "quickstart.sh: error: $*" >&2; exit 2; }

# is_simulate_output DIR: true when DIR holds only what `rlsched simulate --out` writes
# (trainer/cli_sim.py), summary.json with its keys included.
is_simulate_output() {
  local d="$1" f
  [[ -f "$d/summary.json" ]] || return 1
  for f in '"policies"' '"files"' '"summaries"'; do
    grep -F "$f" "$d/summary.json" >/dev/null || return 1
  done
  for f in "$d"/* "$d"/.[!.]* "$d"/..?*; do
    [[ -e "$f" || -L "$f" ]] || continue  # an unmatched glob
    case "${f##*/}" in
      summary.json|jobs_*.parquet|*.png) [[ -f "$f" && ! -L "$f" ]] || return 1 ;;
      *) return 1 ;;
    esac
  done
}

case "${1:-}" in
  -h|--help) usage; exit 0 ;;
  -*) die "unknown option '$1' (usage: bash scripts/quickstart.sh [DIR])" ;;
esac
[[ $# -le 1 ]] || die "too many arguments (usage: bash scripts/quickstart.sh [DIR])"

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ $# -eq 0 ]]; then
  out="$REPO/out/quickstart"
  overwrite=(--overwrite)  # the default output directory is this script's own: replaced every run
else
  [[ -n "$1" ]] || die "DIR must not be empty"
  out="$(realpath -m -- "$1")"  # relative to the caller's directory, before the cd below
  overwrite=()
  here="$(pwd -P)"
  if [[ "$here" == "$out" || "$here" == "$out"/* ]]; then
    die "$out is the current directory or one of its parents; name a directory below it"
  fi
  if [[ -e "$out" || -L "$out" ]]; then
    [[ -d "$out" && ! -L "$out" ]] || die "$out exists and is not a directory"
    if [[ -n "$(ls -A -- "$out")" ]]; then
      is_simulate_output "$out" \
        || die "$out exists and is not the output of an earlier quickstart/simulate run: refusing to replace it (choose another DIR, or empty it)"
      overwrite=(--overwrite)
    fi
  fi
fi

cd "$REPO"
bash scripts/setup.sh --no-slurm
# the environment setup.sh installed into (REPO/.venv on an externally managed system Python)
source scripts/python-env.sh
"$PY" -m rlsched.cli simulate \
  --trace data/traces/deepshare/simulate/trace0.json \
  --cluster 4x8 \
  --policy fifo,srtf,las,greedy,rl-base,rl-hybrid \
  --out "$out" "${overwrite[@]}"
echo
echo "Per-job records, summary.json and plots (JCT CDF, utilisation, CS) are in $out/"
