# Sourced (not run) by scripts/*.sh: which Python environment rlsched lives in.
#
#   source scripts/python-env.sh      # sets PY; activates REPO/.venv when that is the one
#
# PY is ${PYTHON:-python3}, unless that interpreter is an externally managed
# system Python (PEP 668: Debian's /usr/bin/python3, which refuses
# `pip install`) and no virtualenv is active. Then rlsched lives in the
# repository's own virtualenv, REPO/.venv (scripts/setup.sh creates it), PY is
# REPO/.venv/bin/python and that environment is activated (PATH, VIRTUAL_ENV),
# so that `python3`, `rlsched` and `pytest` of the callers are the ones in it.
# Anywhere else (pyenv, conda, an activated virtualenv, a Python without the
# EXTERNALLY-MANAGED marker) nothing changes.

RLSCHED_REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RLSCHED_VENV="$RLSCHED_REPO_ROOT/.venv"
PY="${PYTHON:-python3}"

# true when "$1" is a Python outside any virtualenv whose stdlib carries the
# PEP 668 EXTERNALLY-MANAGED marker (how pip itself decides)
py_externally_managed() {
  "$1" - <<'EOF' 2>/dev/null
import os, sys, sysconfig
in_venv = sys.prefix != getattr(sys, "base_prefix", sys.prefix)
marker = os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")
sys.exit(0 if not in_venv and os.path.isfile(marker) else 1)
EOF
}

# true when rlsched has to live in REPO/.venv (see above)
py_needs_repo_venv() {
  [ -z "${VIRTUAL_ENV:-}" ] || return 1
  command -v "$PY" >/dev/null 2>&1 || return 0   # no python3 at all: setup.sh installs Debian's
  py_externally_managed "$PY"
}

py_activate_repo_venv() {
  export VIRTUAL_ENV="$RLSCHED_VENV"
  case ":$PATH:" in
    *":$RLSCHED_VENV/bin:"*) ;;
    *) export PATH="$RLSCHED_VENV/bin:$PATH" ;;
  esac
  PY="$RLSCHED_VENV/bin/python"
}

if py_needs_repo_venv && [ -x "$RLSCHED_VENV/bin/python" ]; then
  py_activate_repo_venv
fi
