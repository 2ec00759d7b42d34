#!/usr/bin/env bash
# Install rlsched and everything it needs on a fresh Debian 12 machine.
#   bash scripts/setup.sh           # Python package + Slurm/MUNGE and Chromium from Debian (when root)
#   bash scripts/setup.sh --no-slurm  # Python package only
#
# Python: ${PYTHON:-python3} and its pip, or the active virtualenv. An
# externally managed system Python (PEP 668, e.g. Debian's /usr/bin/python3,
# where `pip install` is refused) gets a virtualenv of its own in .venv here
# instead (python3-venv is installed from Debian when root); scripts/test.sh,
# quickstart.sh, rl_traces.sh and local-cluster.sh then use .venv by themselves
# (scripts/python-env.sh), and `source .venv/bin/activate` puts rlsched on
# your shell's PATH.
set -euo pipefail
cd "$(dirname "$0")/.."

want_slurm=1
for a in "$@"; do
  case "$a" in
    --no-slurm) want_slurm=0 ;;
    *) echo "setup.sh: unknown option $a" >&2; exit 2 ;;
  esac
done

apt_updated=0
apt_install() {  # apt_install PKG...: from Debian, quietly (root only)
  export DEBIAN_FRONTEND=noninteractive
  if [ "$apt_updated" = 0 ]; then apt-get update -qq; apt_updated=1; fi
  apt-get install -y -qq "$@" >/dev/null
}

if [ "$want_slurm" = 1 ]; then
  if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null || ! command -v lua5.3 >/dev/null; then
    if [ "$(id -u)" = 0 ]; then
      echo "==> installing Slurm, MUNGE and Lua from Debian"
      apt_install slurm-wlm munge lua5.3
    else
      echo "setup.sh: not root: skipping the Slurm/MUNGE install (the live-cluster tests will be skipped)" >&2
    fi
  fi
  # slurm.h and a C compiler: tests/test_libslurm.py checks controller/libslurm.py's struct offsets against them
  if [ ! -f /usr/include/slurm/slurm.h ] || ! command -v gcc >/dev/null; then
    if [ "$(id -u)" = 0 ]; then
      echo "==> installing libslurm-dev and gcc from Debian (the libslurm layout test)"
      apt_install libslurm-dev gcc libc6-dev
    else
      echo "setup.sh: not root: skipping libslurm-dev (the libslurm layout test will be skipped)" >&2
    fi
  fi
  # headless Chromium: tests/test_status_page.py loads the controller's status page in it
  if ! command -v chromium >/dev/null; then
    if [ "$(id -u)" = 0 ]; then
      echo "==> installing Chromium from Debian (headless browser for the status page test)"
      apt_install chromium
    else
      echo "setup.sh: not root: skipping the Chromium install (the status page's browser test will be skipped)" >&2
    fi
  fi
fi

# sets PY (and activates .venv when it exists and is the environment to use)
source scripts/python-env.sh

if py_needs_repo_venv && ! { [ -x "$RLSCHED_VENV/bin/python" ] && "$RLSCHED_VENV/bin/python" -c '' 2>/dev/null; }; then
  # PEP 668: this Python refuses `pip install` outside a virtualenv: make one for rlsched
  if ! { command -v "$PY" >/dev/null && "$PY" -c 'import ensurepip, venv' 2>/dev/null; }; then
    if [ "$(id -u)" = 0 ]; then
      echo "==> installing python3, python3-venv and python3-pip from Debian"
      apt_install python3 python3-venv python3-pip
    else
      echo "setup.sh: $PY is an externally managed Python (PEP 668) without the venv module:" \
           "install python3-venv (apt-get install python3-venv), or activate a virtualenv and run this again" >&2
      exit 2
    fi
  fi
  echo "==> $PY is externally managed (PEP 668): creating a virtualenv for rlsched in .venv"
  "$PY" -m venv --clear "$RLSCHED_VENV"
  py_activate_repo_venv
fi
if ! "$PY" -m pip --version >/dev/null 2>&1; then
  echo "setup.sh: $PY has no pip: install it (Debian: apt-get install python3-pip), or activate a virtualenv" >&2
  exit 2
fi

echo "==> installing Python packages into $("$PY" -c 'import sys; print(sys.prefix)')"
# torch==2.13.0 is whatever build the package indexes offer: the CPU-only
# build where a local CPU wheel is provided (this project's CI machines have
# torch-2.13.0+cpu in pip's find-links), otherwise PyPI's default build, which
# pulls GBs of CUDA libraries. For the CPU build from PyTorch's own index:
#   PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu bash scripts/setup.sh
# pip's own output is shown (what it downloads, with sizes, and a progress bar on a terminal): from PyPI
# torch alone is GBs and takes minutes, which a quiet install would spend silently. PIP_QUIET=1 (pip's own
# variable) quiets it.
pip_install() {
  "$PY" -m pip install --disable-pip-version-check --progress-bar on "$@"
}
echo "==> pip install torch==2.13.0 (from PyPI: GBs of CUDA libraries, minutes; pip shows its progress)"
pip_install "torch==2.13.0"
# [trainer]: simulation, evaluation and RL training (it includes the controller's libraries);
# [test]: pytest (two workers with pytest-xdist) and grpcio-tools; [hdfs]: the WebHDFS checkpoint store. An agent host needs only
# `pip install 'rlsched[agent]'`, a controller host 'rlsched[controller]' (setup.cfg).
echo "==> pip install -e '.[trainer,test,hdfs]' (numpy, scipy, SB3, pyarrow, grpcio, ...)"
pip_install -e ".[trainer,test,hdfs]"
echo "==> rlsched $("$PY" -c 'import rlsched; print(rlsched.__version__)') installed"
if [ "${VIRTUAL_ENV:-}" = "$RLSCHED_VENV" ]; then
  echo "==> rlsched is in $RLSCHED_VENV: scripts/*.sh use it by themselves;" \
       "'source .venv/bin/activate' puts rlsched on your shell's PATH"
fi
