"""The ``rlsched`` command line: one entry point, one module per subcommand group.

Each module listed in :data:`COMMAND_MODULES` has ``register(subparsers)``,
which adds its subcommands and sets ``func`` on them. Errors the user can fix
(bad trace, cluster spec, policy name, config) print one line to stderr and
exit with status 2 (text from files in it escaped, :func:`rlsched.text.printable`); nothing half-written is left behind by the commands.

The base install (``pip install rlsched``) holds only what every host needs; the
libraries some commands need come with extras (setup.cfg). Every subcommand
module imports at start-up with the base alone, so ``rlsched --help`` and the
agent run anywhere; a command that then needs a library of a missing extra
exits 2 with one line naming the library and the extra (:data:`OPTIONAL_MODULES`).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import os
import sys

from rlsched import __version__
from rlsched.text import printable

#: Modules that contribute subcommands (in help order).
COMMAND_MODULES: tuple[str, ...] = (
    "trainer.cli_sim",
    "trainer.cli_twin",
    "nodeagent.cli",
    "trainer.cli_trace",
    "trainer.cli_rl",
    "trainer.sced2.cli",
    "trainer.chic.cli",
    "trainer.sizefree.cli",
    "trainer.dl2.cli",
    "controller.cli",
)

#: Top-level modules that come with an extra (setup.cfg) -> (the distribution that provides it, the extra).
#: Libraries of both the controller and the trainer extras name the smaller one, ``controller``.
OPTIONAL_MODULES: dict[str, tuple[str, str]] = {
    "scipy": ("scipy", "controller"),
    "yaml": ("pyyaml", "controller"),
    "rich": ("rich", "controller"),
    "safetensors": ("safetensors", "controller"),
    "prometheus_client": ("prometheus-client", "controller"),
    "pyarrow": ("pyarrow", "trainer"),
    "matplotlib": ("matplotlib", "trainer"),
    "gymnasium": ("gymnasium", "trainer"),
    "stable_baselines3": ("stable-baselines3", "trainer"),
    "sb3_contrib": ("sb3-contrib", "trainer"),
    "torch": ("torch", "trainer"),
    "tensorboard": ("tensorboard", "trainer"),
    "hdfs": ("hdfs", "hdfs"),
}


def missing_extra(exc: ImportError) -> str | None:
    """What to install for a failed import of an optional library: ``"torch, which is not installed:
    install rlsched[trainer] (pip install 'rlsched[trainer]')"``; None when ``exc`` is about another module
    (a bug, reported with its traceback)."""
    top = (getattr(exc, "name", None) or "").partition(".")[0]
    if not isinstance(exc, ModuleNotFoundError) or top not in OPTIONAL_MODULES:
        return None
    dist, extra = OPTIONAL_MODULES[top]
    return f"{dist}, which is not installed: install rlsched[{extra}] (pip install 'rlsched[{extra}]')"


#: Optional libraries a command imports only after it has worked a while (plots written at the end of
#: an evaluation, the RL stack once training is set up): checked before it starts, so a missing extra
#: is reported before any work is done. Other commands report it at their first import of it.
COMMAND_NEEDS: dict[str, tuple[str, ...]] = {
    "simulate": ("scipy", "rich", "pyarrow", "matplotlib"),
    "evaluate": ("scipy", "rich", "pyarrow", "matplotlib"),
    "train": ("scipy", "rich", "safetensors", "gymnasium", "stable_baselines3", "sb3_contrib", "torch",
              "tensorboard"),
}


def _first_missing(modules: tuple[str, ...]) -> str | None:
    """The first of ``modules`` that cannot be imported here (found without importing it), else None."""
    for mod in modules:
        try:
            if importlib.util.find_spec(mod) is None:
                return mod
        except ImportError:
            return mod
    return None


def _user_errors() -> tuple[type[BaseException], ...]:
    from policies.base import PolicyError
    from policies.cluster import ClusterSpecError
    from trainer.simulator import SimulationError
    from trainer.traces import TraceError

    errs: list[type[BaseException]] = [PolicyError, ClusterSpecError, SimulationError, TraceError, FileNotFoundError]
    try:
        from controller.config import ConfigError  # type: ignore

        errs.append(ConfigError)
    except ImportError:
        pass
    return tuple(errs)


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line, like the commands' own errors.

    argparse prints the whole usage block before the error; here the error names the command,
    the option and what is wrong, and points to ``--help`` (exit status 2, as argparse). The
    subcommands' parsers are :class:`_SubcommandParser`, a subclass (see :meth:`add_subparsers`).
    """

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")

    def add_subparsers(self, **kwargs):  # type: ignore[override]
        kwargs.setdefault("parser_class", _SubcommandParser)
        return super().add_subparsers(**kwargs)


class _SubcommandParser(_Parser):
    """A subcommand's parser: it reports the arguments it does not know itself.

    argparse hands a subcommand's unknown arguments up to the top-level parser, whose error
    would then point to ``rlsched --help``; here the subcommand's own parser says it and points
    to its help (``rlsched controller status --help``). Only argparse calls this (on the
    arguments after the subcommand's name), so no caller loses the extras it asked for.
    """

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="rlsched",
        description="Learned, network-contention- and locality-aware GPU placement for Slurm.",
    )
    parser.add_argument("--version", action="version", version=f"rlsched {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in COMMAND_MODULES:
        importlib.import_module(mod).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=[logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)],
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    missing = _first_missing(COMMAND_NEEDS.get(args.command, ()))
    if missing is not None:
        what = missing_extra(ModuleNotFoundError(f"No module named {missing!r}", name=missing))
        print(f"rlsched {args.command}: error: this command needs {what}", file=sys.stderr)
        return 2
    try:
        rc = args.func(args)
    except _user_errors() as exc:
        print(f"rlsched {args.command}: error: {printable(exc)}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # the reader closed stdout early (`rlsched ... | head`): not the command's failure; send the rest
        # of the output (and the interpreter's final flush) to /dev/null instead of a traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:  # a file the user named that cannot be written or read (permissions, a full disk)
        print(f"rlsched {args.command}: error: {printable(exc)}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        what = missing_extra(exc)
        if what is None:
            raise
        print(f"rlsched {args.command}: error: this command needs {what}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"rlsched {args.command}: interrupted", file=sys.stderr)
        return 130
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
