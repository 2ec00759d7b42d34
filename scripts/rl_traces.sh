#!/usr/bin/env bash
# Training and validation traces of the shipped 4x8 RL checkpoints (docs/RL.md,
# "Reproducing the shipped checkpoints"). Seeds are disjoint from the evaluation
# seeds of docs/RESULTS.md. Usage: scripts/rl_traces.sh OUTDIR (replaces OUTDIR/train, OUTDIR/val).
set -euo pipefail
T=${1:?usage: scripts/rl_traces.sh OUTDIR}
rm -rf "$T/train" "$T/val"
for mix in normal heavy medium low; do
  rlsched trace generate --mix $mix --sets 3 --seed 101 --out $T/train/$mix
  rlsched trace generate --mix $mix --sets 1 --seed 202 --out $T/val/$mix
  rlsched trace generate --mix $mix --demand uniform --sets 4 --seed 121 --out $T/train/uniform-$mix
  rlsched trace generate --mix $mix --demand uniform --sets 2 --seed 221 --out $T/val/uniform-$mix
done
rlsched trace generate --mix normal --jitter 0.9 --sets 3 --seed 111 --out $T/train/jitter
rlsched trace generate --mix normal --jitter 0.9 --sets 2 --seed 211 --out $T/val/jitter
rlsched trace generate --mix normal --demand uniform --jitter 0.9 --sets 3 --seed 131 --out $T/train/uniform-jitter
rlsched trace generate --mix normal --demand uniform --jitter 0.9 --sets 2 --seed 231 --out $T/val/uniform-jitter
for L in 80 85 90 95; do
  rlsched trace generate --mix normal --arrival poisson --load 0.$L --sets 2 --seed 1$L --out $T/train/poisson-$L
  rlsched trace generate --mix normal --arrival poisson --load 0.$L --jitter 0.9 --sets 1 --seed 4$L --out $T/train/poisson-jitter-$L
  rlsched trace generate --mix normal --demand uniform --arrival poisson --load 0.$L --sets 2 --seed 14$L --out $T/train/uniform-poisson-$L
done
for L in 80 95; do
  rlsched trace generate --mix normal --arrival poisson --load 0.$L --sets 1 --seed 2$L --out $T/val/poisson-$L
  rlsched trace generate --mix normal --arrival poisson --load 0.$L --jitter 0.9 --sets 1 --seed 5$L --out $T/val/poisson-jitter-$L
  rlsched trace generate --mix normal --demand uniform --arrival poisson --load 0.$L --sets 2 --seed 24$L --out $T/val/uniform-poisson-$L
done
