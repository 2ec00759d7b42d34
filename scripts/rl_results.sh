#!/usr/bin/env bash
# docs/RESULTS.md's issue-30 part (RL placement against the best heuristic) and its figures, regenerated
# by one command:
#
#   bash scripts/rl_results.sh [--dry-run] [--planner-cache DIR]
#
# Runs, in order, each writing its tables between their markers of docs/RESULTS.md (`--docs`; a run that
# fails leaves the page as it is):
#   1. benchmarks/bench_baselines.py --sets 6             "Baselines: the best heuristic per group" and
#                                                          "Baselines: every heuristic" (2.3 min CPU)
#   2. benchmarks/bench_hybrid.py --sets 6 --pair rl-base-4x8,rl-hybrid-4x8 --figure ...
#                                                          rl-hybrid-4x8 against rl-base-4x8, with
#                                                          docs/figures/hybrid_jct_vs_util.png (50 s CPU)
#   3. benchmarks/bench_sizefree.py --sets 3 --jobs 128 --policy rl-base,rl-hybrid --no-latency
#                                                          the size-free table (9 s CPU)
#   4. benchmarks/bench_planner.py --cache DIR             the planner's tables (6.2 min CPU; DIR keeps
#                                                          each run, default /tmp/planner-cache)
#   5. bash scripts/rl_branches.sh results                 "Generated tables", docs/rl_results.json and
#                                                          docs/figures/rl_*.png (102 s CPU)
# Each step niced; one whole run took 12.7 min of CPU with an empty planner cache and 6.4 min with a
# full one (docs/RESULTS.md's header, on a loaded 2-core machine). At the end it
# prints each step's CPU (user + system of its processes) and wall seconds and the total. --dry-run
# prints the commands and checks that every script exists and accepts its options (each one's --help
# lists it), running nothing.
set -euo pipefail

die() { echo "rl_results.sh: error: $*" >&2; exit 2; }
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | grep '^#' | sed 's/^# \{0,1\}//'; }
DRY=0
CACHE=/tmp/planner-cache
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --dry-run) DRY=1; shift ;;
    --planner-cache) [[ $# -ge 2 && -n "$2" ]] || die "--planner-cache needs a directory"; CACHE="$2"; shift 2 ;;
    *) usage >&2; die "unknown argument '$1'" ;;
  esac
done
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd -- "$REPO"
source "$REPO/scripts/python-env.sh"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"

STEPS=(
  "benchmarks/bench_baselines.py --sets 6 --docs"
  "benchmarks/bench_hybrid.py --sets 6 --pair rl-base-4x8,rl-hybrid-4x8 --figure docs/figures/hybrid_jct_vs_util.png --docs"
  "benchmarks/bench_sizefree.py --sets 3 --jobs 128 --policy rl-base,rl-hybrid --no-latency --docs"
  "benchmarks/bench_planner.py --cache $CACHE --docs"
)

# every script must exist and list each option it is given in its --help
for s in "${STEPS[@]}"; do
  read -r -a argv <<< "$s"
  [[ -f "${argv[0]}" ]] || die "${argv[0]}: no such script"
  help="$("$PY" "${argv[0]}" --help)" || die "${argv[0]} --help failed"
  for a in "${argv[@]:1}"; do
    [[ "$a" == --* ]] || continue
    grep -qE -- "(^|[ ,])$a([ =,]|\$)" <<< "$help" || die "${argv[0]} has no option $a"
  done
done
[[ -f scripts/rl_branches.sh ]] || die "scripts/rl_branches.sh: no such script"
bash -n scripts/rl_branches.sh || die "scripts/rl_branches.sh: syntax error"

# CPU_S: CPU seconds (user + system) of the finished children of this shell. `times` must run in this
# shell (in a pipe or $(...) it runs in a subshell, which has no children), so cpu_s sets a variable.
TIMES="$(mktemp)"
trap 'rm -f -- "$TIMES"' EXIT
cpu_s() {
  times >"$TIMES"
  CPU_S="$(sed -n 2p "$TIMES" | awk '{ s = 0; for (i = 1; i <= 2; i++) { split($i, p, "m"); sub("s", "", p[2]); s += 60 * p[1] + p[2] } printf "%.1f", s }')"
}
now_s() { date +%s.%N; }
REPORT=()
timed() {  # timed NAME CMD...: run CMD, record its CPU and wall seconds under NAME
  local name="$1" c0 w0
  shift
  cpu_s; c0="$CPU_S"; w0="$(now_s)"
  "$@"
  cpu_s
  REPORT+=("$(awk -v n="$name" -v c0="$c0" -v c1="$CPU_S" -v w0="$w0" -v w1="$(now_s)" \
    'BEGIN { printf "%-22s %8.1f s CPU %8.1f s wall", n, c1 - c0, w1 - w0 }')")
}
cpu_s; C0="$CPU_S"; W0="$(now_s)"

for s in "${STEPS[@]}"; do
  echo "== nice -n 10 $PY $s"
  if [[ $DRY -eq 0 ]]; then
    read -r -a argv <<< "$s"
    timed "$(basename "${argv[0]}")" nice -n 10 "$PY" "${argv[@]}"
  fi
done
echo "== bash scripts/rl_branches.sh results"
[[ $DRY -eq 1 ]] && exit 0
timed "rl_branches.sh results" bash scripts/rl_branches.sh results

# what each step and the whole command took (CPU: user + system of every process it ran)
echo "== time"
printf '%s\n' "${REPORT[@]}"
cpu_s
awk -v c0="$C0" -v c1="$CPU_S" -v w0="$W0" -v w1="$(now_s)" \
  'BEGIN { printf "%-22s %8.1f s CPU %8.1f s wall\n", "total", c1 - c0, w1 - w0 }'
