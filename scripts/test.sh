#!/usr/bin/env bash
# Set up and run the whole test suite (what CI runs): bash scripts/test.sh [pytest args]
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit $?
# the environment setup.sh installed into (REPO/.venv on an externally managed system Python)
source scripts/python-env.sh
# Two pytest-xdist workers (RLSCHED_TEST_WORKERS=N for another count, 0 for one process), a test file
# per worker at a time (a file's module fixtures, such as its Slurm cluster, start once).
"$PY" -m pytest -q -n "${RLSCHED_TEST_WORKERS:-2}" --dist loadfile "$@"
rc=$?
# pytest exits 5 when it collected no tests: that is a failure of the suite, say so.
if [ "$rc" = 5 ]; then
  echo "scripts/test.sh: pytest collected no tests" >&2
fi
exit $rc
