"""Import a script of ``benchmarks/`` or ``scripts/studies/`` (directories of scripts, not packages) as a
module, for its tests."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
STUDIES = REPO / "scripts" / "studies"


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load_benchmark(name: str) -> ModuleType:
    """The module of ``benchmarks/<name>.py``, executed once per call."""
    return _load(name, BENCHMARKS / f"{name}.py")


def load_study(name: str) -> ModuleType:
    """The module of ``scripts/studies/<name>.py``, executed once per call."""
    return _load(name, STUDIES / f"{name}.py")
