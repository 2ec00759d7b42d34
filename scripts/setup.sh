#!/usr/bin/env bash
# Install rlsched and everything it needs on a fresh Debian 12 machine.
#   bash scripts/setup.sh           # Python package + Slurm/MUNGE from Debian (when root)
#   bash scripts/setup.sh --no-slurm  # Python package only
set -euo pipefail
cd "$(dirname "$0")/.."

want_slurm=1
for a in "$@"; do
  case "$a" in
    --no-slurm) want_slurm=0 ;;
    *) echo "setup.sh: unknown option $a" >&2; exit 2 ;;
  esac
done

if [ "$want_slurm" = 1 ]; then
  if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null || ! command -v lua5.3 >/dev/null; then
    if [ "$(id -u)" = 0 ]; then
      echo "==> installing Slurm, MUNGE and Lua from Debian"
      export DEBIAN_FRONTEND=noninteractive
      apt-get update -qq
      apt-get install -y -qq slurm-wlm munge lua5.3 >/dev/null
    else
      echo "setup.sh: not root: skipping the Slurm/MUNGE install (the live-cluster tests will be skipped)" >&2
    fi
  fi
fi

PY=${PYTHON:-python3}
echo "==> installing Python packages"
# The CPU build of PyTorch; any other spec pulls GBs of CUDA wheels.
"$PY" -m pip install -q --disable-pip-version-check "torch==2.13.0"
"$PY" -m pip install -q --disable-pip-version-check -e ".[test,hdfs]"
echo "==> rlsched $("$PY" -c 'import rlsched; print(rlsched.__version__)') installed"
