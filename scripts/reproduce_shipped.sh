#!/usr/bin/env bash
# Train the shipped 4x8 RL checkpoints again (docs/RL.md, "Reproducing the shipped checkpoints"):
#   bash scripts/reproduce_shipped.sh DIR
# writes DIR/traces (scripts/rl_traces.sh), the three training runs DIR/runs/g, DIR/runs/f2, DIR/runs/p2
# and DIR/shipped/rl-{base,hybrid}-4x8.{json,safetensors} (step 4: the aging the shipped files run with),
# then compares their weights with policies/checkpoints. Every path is relative to DIR, as the shipped
# checkpoints' training.command and training.config record them (training.recipe names this script).
# About 20 minutes of CPU. The weights come out bit for bit equal only at the commits the steps were run at
# (steps 1-2: 92542fe, step 3: dba8ae7; docs/RL.md says why): at other commits the networks are of the
# same kind, and the comparison at the end says they differ.
set -euo pipefail

usage() { echo "usage: bash scripts/reproduce_shipped.sh DIR   (writes DIR/traces, DIR/runs, DIR/shipped)"; }
die() { echo "reproduce_shipped.sh: error: $*" >&2; exit 2; }
case "${1:-}" in
  -h|--help) usage; exit 0 ;;
  -*) usage >&2; die "unknown option '$1' (a DIR that starts with '-': write ./$1)" ;;
esac
[[ $# -eq 1 ]] || { usage >&2; die "expected one DIR, got $# arguments"; }
[[ -n "$1" ]] || die "DIR must not be empty"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p -- "$1" || die "cannot make $1"
DIR="$(cd -- "$1" && pwd)"
[[ -z "$(ls -A -- "$DIR/runs" 2>/dev/null)" ]] || die "$DIR/runs holds earlier runs: give an empty or new DIR"
# rlsched's Python environment (activates REPO/.venv when setup.sh made one)
source "$REPO/scripts/python-env.sh"
"$PY" -c 'import rlsched' 2>/dev/null || die "rlsched is not installed for $PY (bash scripts/setup.sh installs it)"
rlsched() { "$PY" -m rlsched.cli "$@"; }

cd -- "$DIR"
echo "==> traces (scripts/rl_traces.sh) in $DIR/traces"
bash "$REPO/scripts/rl_traces.sh" traces
T=traces
common=(--algo maskable-ppo --traces "$T/train" --val-traces "$T/val" --aging 1800 --prior-scale 1 --lr 1e-4
        --cluster 4x8 --seed 0 --eval-freq 10000)
echo "==> 1. area order from the prior (runs/g)"
rlsched -v train "${common[@]}" --order area --timesteps 200000 --out runs/g
echo "==> 2. fill order from step 1's best (runs/f2)"
rlsched -v train "${common[@]}" --order fill --init runs/g/best --timesteps 100000 --out runs/f2
echo "==> 3. plan order from step 2's best (runs/p2)"
rlsched -v train "${common[@]}" --order plan --init runs/f2/best --timesteps 100000 --out runs/p2
echo "==> 4. shipped as rl-base / rl-hybrid with the 300 s aging (shipped/)"
"$PY" - <<'PY'
from policies.cluster import ClusterSpec
from trainer.train import ship_checkpoint

for path in ship_checkpoint("runs/p2/best", ClusterSpec.parse("4x8"), dest="shipped", aging_s=300, relative_to="."):
    print(f"written {path}")
PY
for mode in rl-base rl-hybrid; do
  mine="$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["weights_sha256"])' "shipped/$mode-4x8.json")"
  theirs="$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["weights_sha256"])' \
    "$REPO/policies/checkpoints/$mode-4x8.json")"
  if [[ "$mine" == "$theirs" ]]; then
    echo "$mode: the same weights as policies/checkpoints/$mode-4x8 (sha256 $mine)"
  else
    echo "$mode: other weights than policies/checkpoints/$mode-4x8 ($mine, shipped $theirs): expected at a" \
         "commit other than the ones docs/RL.md names"
  fi
done
