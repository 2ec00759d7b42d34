"""argparse types shared by the ``rlsched`` subcommands (trainer and node agent alike).

A light module on purpose: the node agent imports it without importing the trainer package.
Each raises :class:`argparse.ArgumentTypeError` for every bad value (never a bare
``ValueError``, which argparse would report as ``invalid <function name> value``), so the
usage error is one line naming the option and saying what it expects, e.g.
``argument --timesteps: expected a positive integer, got '1e5'``.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

__all__ = ["float_at_least", "int_at_least", "non_negative_float", "positive_float", "positive_int"]


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def _integer(text: str, expected: str) -> int:
    """``int(text)``; else "expected ``expected``, got 'text'" (also for '1e5', '2.0' and over-long digit strings)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None


def _at_least(text: str, lo: float) -> float:
    v = _number(text)
    if not math.isfinite(v) or v < lo:
        raise argparse.ArgumentTypeError(f"must be a number >= {lo:g}, got {text!r}")
    return v


def positive_float(text: str) -> float:
    """A finite number > 0."""
    v = _number(text)
    if not math.isfinite(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return v


def non_negative_float(text: str) -> float:
    """A finite number >= 0."""
    return _at_least(text, 0.0)


def float_at_least(lo: float) -> Callable[[str], float]:
    """The type of a finite number option >= ``lo``."""

    def parse(text: str) -> float:
        return _at_least(text, lo)

    parse.__name__ = f"number >= {lo:g}"
    return parse


def positive_int(text: str) -> int:
    """An integer >= 1."""
    v = _integer(text, "a positive integer")
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def int_at_least(lo: int) -> Callable[[str], int]:
    """The type of an integer option >= ``lo``."""

    def parse(text: str) -> int:
        v = _integer(text, "an integer")
        if v < lo:
            raise argparse.ArgumentTypeError(f"must be an integer >= {lo}, got {text!r}")
        return v

    parse.__name__ = f"integer >= {lo}"
    return parse
