"""argparse types shared by the ``rlsched`` subcommands (trainer and node agent alike).

A light module on purpose: the node agent imports it without importing the trainer package.
Each raises :class:`argparse.ArgumentTypeError`, which argparse turns into a one-line usage
error naming the option.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

__all__ = ["int_at_least", "non_negative_float", "positive_float"]


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def positive_float(text: str) -> float:
    """A finite number > 0."""
    v = _number(text)
    if not math.isfinite(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return v


def non_negative_float(text: str) -> float:
    """A finite number >= 0."""
    v = _number(text)
    if not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}")
    return v


def int_at_least(lo: int) -> Callable[[str], int]:
    """The type of an integer option >= ``lo``."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"must be an integer >= {lo}, got {text!r}")
        return v

    return parse
