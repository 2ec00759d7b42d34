"""Running the ``rlsched`` command in a subprocess, for the tests that check its output and exit status."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args: str, cwd: str | Path = ROOT, home: str | Path | None = None) -> subprocess.CompletedProcess:
    """``python -m rlsched.cli ARGS`` with this checkout first on ``PYTHONPATH`` and a minimal ``PATH``,
    output captured as text, never raising on a non-zero exit.

    :param cwd: the working directory (default: the repository root).
    :param home: ``HOME`` of the run, with matplotlib's non-interactive ``Agg`` backend (``None``: neither set).
    """
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    if home is not None:
        env.update(MPLBACKEND="Agg", HOME=str(home))
    return subprocess.run([sys.executable, "-m", "rlsched.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, check=False)
