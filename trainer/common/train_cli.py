"""The shell the ``rlsched train-*`` commands share: options that set fields of a training config.

A training command lists its config options once, as :class:`ConfigOption` rows; :func:`add_config_options`
adds them to its parser (each with the config's default and ``(default: ...)`` in its help) and
:func:`config_values` reads them back as the config's keyword arguments. :func:`cli_error` prints the
one-line error of a command and returns its exit status, 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["ConfigOption", "add_config_options", "cli_error", "config_values"]


@dataclass(frozen=True)
class ConfigOption:
    """One option of a training command that sets the config field ``field``.

    :param flag: the option, e.g. ``"--seq-jobs"`` (its argparse destination is the flag's name with
        ``-`` as ``_``, e.g. ``seq_jobs``).
    :param help: what it sets; ``" (default: %(default)s)"`` is appended.
    :param type: argparse type (``None``: the string as given).
    :param field: the config field (``None``: the destination).
    """

    flag: str
    help: str
    type: Callable[[str], Any] | None = None
    field: str | None = None

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    @property
    def config_field(self) -> str:
        return self.field or self.dest


def add_config_options(parser: argparse.ArgumentParser, defaults: Any, options: Sequence[ConfigOption]) -> None:
    """Add ``options`` to ``parser``, each defaulting to its field of the config ``defaults``."""
    for o in options:
        kw: dict[str, Any] = {"default": getattr(defaults, o.config_field), "help": f"{o.help} (default: %(default)s)"}
        if o.type is not None:
            kw["type"] = o.type
        parser.add_argument(o.flag, **kw)


def config_values(args: argparse.Namespace, options: Sequence[ConfigOption]) -> dict[str, Any]:
    """The config keyword arguments ``options`` give in parsed ``args``."""
    return {o.config_field: getattr(args, o.dest) for o in options}


def cli_error(command: str, message: object) -> int:
    """Print ``rlsched COMMAND: error: MESSAGE`` on stderr; returns 2 (the exit status of bad input)."""
    print(f"rlsched {command}: error: {message}", file=sys.stderr)
    return 2
