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

__all__ = [
    "float_at_least",
    "float_in_range",
    "int_at_least",
    "int_in_range",
    "non_negative_float",
    "non_negative_int",
    "port_or_zero",
    "positive_float",
    "positive_int",
]


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


def _count(text: str, lo: int, expected: str) -> int:
    """An integer >= ``lo``; else "expected ``expected``, got 'text'"."""
    v = _integer(text, expected)
    if v < lo:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return v


def _int_type(ok: Callable[[int], bool], want: str) -> Callable[[str], int]:
    """The type of an integer option whose values pass ``ok``; else "must be an integer ``want``, got 'text'".
    Its ``__name__`` (argparse's name of the type) is ``integer want``."""

    def parse(text: str) -> int:
        v = _integer(text, "an integer")
        if not ok(v):
            raise argparse.ArgumentTypeError(f"must be an integer {want}, got {text!r}")
        return v

    parse.__name__ = f"integer {want}"
    return parse


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


def float_in_range(lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False) -> Callable[[str], float]:
    """The type of a finite number option in [lo, hi]; ``lo_open`` / ``hi_open`` exclude that end."""
    interval = f"{'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"

    def parse(text: str) -> float:
        v = _number(text)
        above = lo < v if lo_open else lo <= v
        below = v < hi if hi_open else v <= hi
        if not (math.isfinite(v) and above and below):
            raise argparse.ArgumentTypeError(f"must be a number in {interval}, got {text!r}")
        return v

    parse.__name__ = f"number in {interval}"
    return parse


def positive_int(text: str) -> int:
    """An integer >= 1."""
    return _count(text, 1, "a positive integer")


def int_at_least(lo: int) -> Callable[[str], int]:
    """The type of an integer option >= ``lo``."""
    return _int_type(lambda v: v >= lo, f">= {lo}")


def non_negative_int(text: str) -> int:
    """An integer >= 0 (a count that may be zero, a seed)."""
    return _count(text, 0, "a non-negative integer")


def int_in_range(lo: int, hi: int) -> Callable[[str], int]:
    """The type of an integer option in [lo, hi]."""
    return _int_type(lambda v: lo <= v <= hi, f"in [{lo}, {hi}]")


def port_or_zero(text: str) -> int:
    """A TCP port in [1, 65535], or 0 (for options where 0 means "off")."""
    v = _integer(text, "a port number")
    if not 0 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port in [1, 65535] or 0 (off), got {text!r}")
    return v
