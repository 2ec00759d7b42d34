#!/usr/bin/env bash
# Set up and run the whole test suite (what CI runs): bash scripts/test.sh [pytest args]
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit $?
# the environment setup.sh installed into (REPO/.venv on an externally managed system Python)
source scripts/python-env.sh
"$PY" -m pytest -q "$@"
rc=$?
# pytest exits 5 when it collected no tests: that is a failure of the suite, say so.
if [ "$rc" = 5 ]; then
  echo "scripts/test.sh: pytest collected no tests" >&2
fi
exit $rc
