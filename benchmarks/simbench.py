"""What the simulator benchmarks (``bench_simulator.py``, ``bench_scale.py``) share; a helper module,
not a benchmark.

Importing it sets single-threaded BLAS (``OMP_NUM_THREADS`` and the like, unless set) before numpy is
imported, so a script imports it first, and puts the repository root on ``sys.path``. :func:`use_code`
makes a script time the simulator of another checkout (e.g. a ``git worktree`` of an older commit)
with this script's cases and clock.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def use_code(path: Path) -> Path:
    """Import ``policies`` / ``trainer`` from the checkout at ``path`` (call before importing them):
    first on ``sys.path``. :class:`SystemExit` with one line unless it is an rlsched checkout."""
    path = path.resolve()
    if not (path / "trainer" / "simulator.py").is_file():
        raise SystemExit(f"--code {path}: not an rlsched checkout (no trainer/simulator.py there)")
    if "trainer.simulator" in sys.modules and not sys.modules["trainer.simulator"].__file__.startswith(str(path)):
        raise SystemExit(f"--code {path}: the simulator was imported from elsewhere already")
    if str(path) in sys.path:
        sys.path.remove(str(path))
    sys.path.insert(0, str(path))
    return path


def pin_one_core() -> str:
    """Pin this process to one CPU (Linux); returns a description."""
    try:
        cpu = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpu})
        return f"pinned to CPU {cpu}"
    except (AttributeError, OSError):
        return "not pinned (no sched_setaffinity)"


def machine(pin: str) -> dict[str, Any]:
    """The machine a run measured: CPU, CPU count, Python, numpy, pinning, load average (1, 5, 15 min)."""
    import numpy as np

    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "python": platform.python_version(), "numpy": np.__version__, "pinning": pin,
            "load_average": [round(x, 2) for x in load] if load else None}


def machine_line(title: str, m: dict[str, Any]) -> str:
    """``title`` and :func:`machine`'s fields on one line."""
    load = m["load_average"]
    return (f"[bold]{title}[/] - {m['cpu']}, {m['cpus']} CPUs, Python {m['python']}, numpy {m['numpy']}, {m['pinning']}"
            + (f", load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}" if load else ""))


def timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """``(fn(), wall seconds, CPU seconds of this process)``."""
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - t0, time.process_time() - c0


def spread(xs: Sequence[float]) -> dict[str, float]:
    """Median, minimum and maximum of ``xs`` (seconds)."""
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}
