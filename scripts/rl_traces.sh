#!/usr/bin/env bash
# Training and validation traces of the shipped 4x8 RL checkpoints (docs/RL.md,
# "Reproducing the shipped checkpoints"). Seeds are disjoint from the evaluation
# seeds of docs/RESULTS.md. Usage: scripts/rl_traces.sh OUTDIR (replaces OUTDIR/train, OUTDIR/val).
set -euo pipefail

usage() { echo "usage: bash scripts/rl_traces.sh OUTDIR   (writes OUTDIR/train and OUTDIR/val, replacing them)"; }
die() { echo "rl_traces.sh: error: $*" >&2; exit 2; }
case "${1:-}" in
  -h|--help) usage; exit 0 ;;
  -*) usage >&2; die "unknown option '$1' (an OUTDIR that starts with '-': write ./$1)" ;;
esac
[[ $# -eq 1 ]] || { usage >&2; die "expected one OUTDIR, got $# arguments"; }
[[ -n "$1" ]] || die "OUTDIR must not be empty"
T="$1"
# rlsched's Python environment (activates REPO/.venv when setup.sh made one, see there)
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/python-env.sh"
"$PY" -c 'import rlsched' 2>/dev/null || die "rlsched is not installed for $PY (bash scripts/setup.sh installs it)"
rlsched() { "$PY" -m rlsched.cli "$@"; }
rm -rf -- "$T/train" "$T/val"
for mix in normal heavy medium low; do
  rlsched trace generate --mix "$mix" --sets 3 --seed 101 --out "$T/train/$mix"
  rlsched trace generate --mix "$mix" --sets 1 --seed 202 --out "$T/val/$mix"
  rlsched trace generate --mix "$mix" --demand uniform --sets 4 --seed 121 --out "$T/train/uniform-$mix"
  rlsched trace generate --mix "$mix" --demand uniform --sets 2 --seed 221 --out "$T/val/uniform-$mix"
done
rlsched trace generate --mix normal --jitter 0.9 --sets 3 --seed 111 --out "$T/train/jitter"
rlsched trace generate --mix normal --jitter 0.9 --sets 2 --seed 211 --out "$T/val/jitter"
rlsched trace generate --mix normal --demand uniform --jitter 0.9 --sets 3 --seed 131 --out "$T/train/uniform-jitter"
rlsched trace generate --mix normal --demand uniform --jitter 0.9 --sets 2 --seed 231 --out "$T/val/uniform-jitter"
for L in 80 85 90 95; do
  rlsched trace generate --mix normal --arrival poisson --load "0.$L" --sets 2 --seed "1$L" --out "$T/train/poisson-$L"
  rlsched trace generate --mix normal --arrival poisson --load "0.$L" --jitter 0.9 --sets 1 --seed "4$L" --out "$T/train/poisson-jitter-$L"
  rlsched trace generate --mix normal --demand uniform --arrival poisson --load "0.$L" --sets 2 --seed "14$L" --out "$T/train/uniform-poisson-$L"
done
for L in 80 95; do
  rlsched trace generate --mix normal --arrival poisson --load "0.$L" --sets 1 --seed "2$L" --out "$T/val/poisson-$L"
  rlsched trace generate --mix normal --arrival poisson --load "0.$L" --jitter 0.9 --sets 1 --seed "5$L" --out "$T/val/poisson-jitter-$L"
  rlsched trace generate --mix normal --demand uniform --arrival poisson --load "0.$L" --sets 2 --seed "24$L" --out "$T/val/uniform-poisson-$L"
done
