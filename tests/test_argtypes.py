"""rlsched/argtypes.py and every argparse type of the ``rlsched`` CLIs: one readable line per bad value.

argparse reports a type's ``ValueError`` as ``invalid <function name> value: 'x'`` (``invalid
_positive_int value: '1e5'``); every type must raise :class:`argparse.ArgumentTypeError` instead.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from rlsched.argtypes import (
    float_at_least,
    float_in_range,
    int_at_least,
    int_in_range,
    non_negative_float,
    non_negative_int,
    port_or_zero,
    positive_float,
    positive_int,
)
from rlsched.cli import build_parser, main

#: Values every type should answer with a value or ArgumentTypeError, never another exception.
AWKWARD = ["", " ", "x", "1e5", "2.0", "-1", "0", "nan", "inf", "-inf", "1e999", "²", "h:²", "٣", "1" * 5000]
AWKWARD += ["h:" + "1" * 5000, ",", "1,,2", "a:b", "0x10", "1_000"]


def _typed_actions(
    parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()
) -> Iterator[tuple[str, argparse.Action]]:
    """``("trace stats --limit", action)`` for every option of every subcommand with a type of its own."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _typed_actions(sub, (*prefix, name))
        elif callable(action.type) and action.type not in (int, float, str):
            yield " ".join((*prefix, action.option_strings[0])), action


def test_every_cli_type_raises_argument_type_error() -> None:
    actions = list(_typed_actions(build_parser()))
    assert len(actions) > 10  # simulate, agent, trace, train all have typed options
    for where, action in actions:
        for text in AWKWARD:
            try:
                action.type(text)
            except argparse.ArgumentTypeError as exc:
                assert str(exc) and "\n" not in str(exc), (where, text)
            except Exception as exc:  # noqa: BLE001 - the point of the test
                pytest.fail(f"{where} {text[:20]!r}: {type(exc).__name__}: {exc} (argparse: 'invalid ... value')")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "--timesteps", "1e5"], "argument --timesteps: expected a positive integer, got '1e5'"),
        (["train", "--n-envs", "0"], "argument --n-envs: expected a positive integer, got '0'"),
        (["agent", "--node", "n", "--store", "s", "--listen", "h:²"], "argument --listen: --listen must be HOST:PORT"),
        (["trace", "stats", "t.csv", "--limit", "1e3"], "argument --limit: expected a positive integer, got '1e3'"),
        (
            ["trace", "generate", "--out", "t.csv", "--jobs", "x"],
            "argument --jobs: expected a positive integer, got 'x'",
        ),
        (
            ["trace", "generate", "--out", "t.csv", "--seed", "-1"],
            "argument --seed: expected a non-negative integer, got '-1'",
        ),
        (["trace", "stats", "t.csv", "--sample", "2"], "argument --sample: must be a number in (0, 1], got '2'"),
        (["controller", "run", "--interval", "0"], "argument --interval: must be a number in (0, 86400], got '0'"),
        (
            ["controller", "run", "--metrics-port", "70000"],
            "argument --metrics-port: must be a port in [1, 65535] or 0 (off), got '70000'",
        ),
        (
            ["agent", "--node", "n", "--store", "s", "--allow-uid", "-1"],
            "argument --allow-uid: must be an integer in [0, 4294967294], got '-1'",
        ),
        (["train", "--gamma", "1.5"], "argument --gamma: must be a number in [0, 1], got '1.5'"),
    ],
)
def test_usage_errors_name_the_option_and_what_it_expects(
    tmp_path, monkeypatch, capsys, argv: list[str], message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    if argv[0] == "train":
        argv = [*argv[:1], "--traces", "t", "--out", "o", *argv[1:]]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"error: {message}" in err.splitlines()[-1], err
    assert "invalid" not in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("text, value", [("1", 1), ("007", 7), (" 3 ", 3)])
def test_positive_int(text: str, value: int) -> None:
    assert positive_int(text) == value


@pytest.mark.parametrize("text", ["0", "-2", "1e5", "2.0", "x", ""])
def test_positive_int_refuses(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=f"^expected a positive integer, got {text!r}$"):
        positive_int(text)


def test_float_at_least() -> None:
    one = float_at_least(1.0)
    assert one("1") == 1.0 and one("1e3") == 1000.0
    for text in ("0.999", "0", "-1", "nan", "inf"):
        with pytest.raises(argparse.ArgumentTypeError, match=f"^must be a number >= 1, got {text!r}$"):
            one(text)
    with pytest.raises(argparse.ArgumentTypeError, match="^expected a number, got 'x'$"):
        one("x")


def test_existing_messages_kept() -> None:
    """The node agent's tests and docs quote these."""
    with pytest.raises(argparse.ArgumentTypeError, match="^must be an integer >= 1, got '0'$"):
        int_at_least(1)("0")
    with pytest.raises(argparse.ArgumentTypeError, match="^expected an integer, got 'x'$"):
        int_at_least(0)("x")
    with pytest.raises(argparse.ArgumentTypeError, match="^must be a positive number, got 'nan'$"):
        positive_float("nan")
    with pytest.raises(argparse.ArgumentTypeError, match="^must be a number >= 0, got '-1'$"):
        non_negative_float("-1")
    assert non_negative_float("0") == 0.0


def test_bounds_that_mean_something_are_accepted() -> None:
    """A seed of 0, metrics port 0 (off), uid 0 (root) and the largest port stay valid."""
    parser = build_parser()
    gen = parser.parse_args(["trace", "generate", "--out", "t.csv", "--seed", "0", "--jitter", "0", "--sets", "1"])
    assert (gen.seed, gen.jitter, gen.sets) == (0, 0.0, 1)
    run = parser.parse_args(["controller", "run", "--metrics-port", "0", "--interval", "86400"])
    assert (run.metrics_port, run.interval) == (0, 86400.0)
    assert parser.parse_args(["controller", "run", "--metrics-port", "65535"]).metrics_port == 65535
    agent = parser.parse_args(["agent", "--node", "n", "--store", "s", "--allow-uid", "0", "--allow-uid", "4294967294"])
    assert agent.allow_uid == [0, 2**32 - 2]
    assert parser.parse_args(["trace", "stats", "t.csv", "--sample", "1"]).sample == 1.0


@pytest.mark.parametrize("text, value", [("0", 0), ("7", 7), (" 3 ", 3), (str(2**70), 2**70)])
def test_non_negative_int(text: str, value: int) -> None:
    assert non_negative_int(text) == value


@pytest.mark.parametrize("text", ["-1", "1e5", "2.0", "x", "", "nan"])
def test_non_negative_int_refuses(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=f"^expected a non-negative integer, got {text!r}$"):
        non_negative_int(text)


def test_int_in_range() -> None:
    small = int_in_range(-2, 5)
    assert small("-2") == -2 and small("5") == 5 and small.__name__ == "integer in [-2, 5]"
    for text in ("-3", "6", str(10**30)):
        with pytest.raises(argparse.ArgumentTypeError, match=rf"^must be an integer in \[-2, 5\], got {text!r}$"):
            small(text)
    with pytest.raises(argparse.ArgumentTypeError, match="^expected an integer, got '1.0'$"):
        small("1.0")


def test_port_or_zero() -> None:
    assert port_or_zero("0") == 0 and port_or_zero("1") == 1 and port_or_zero("65535") == 65535
    for text in ("-1", "65536", "99999999"):
        with pytest.raises(argparse.ArgumentTypeError) as exc:
            port_or_zero(text)
        assert str(exc.value) == f"must be a port in [1, 65535] or 0 (off), got {text!r}"
    with pytest.raises(argparse.ArgumentTypeError, match="^expected a port number, got 'http'$"):
        port_or_zero("http")


@pytest.mark.parametrize(
    "lo_open, hi_open, interval, inside, outside",
    [
        (False, False, "[0, 1]", ["0", "0.5", "1"], ["-0.1", "1.01"]),
        (True, False, "(0, 1]", ["1e-300", "1"], ["0", "-0", "1.5"]),
        (False, True, "[0, 1)", ["0", "0.999"], ["1", "-1e-9"]),
        (True, True, "(0, 1)", ["0.5"], ["0", "1"]),
    ],
)
def test_float_in_range(lo_open: bool, hi_open: bool, interval: str, inside: list[str], outside: list[str]) -> None:
    unit = float_in_range(0.0, 1.0, lo_open=lo_open, hi_open=hi_open)
    assert unit.__name__ == f"number in {interval}"
    for text in inside:
        assert unit(text) == float(text)
    for text in [*outside, "nan", "inf", "-inf", "1e999"]:
        with pytest.raises(argparse.ArgumentTypeError) as exc:
            unit(text)
        assert str(exc.value) == f"must be a number in {interval}, got {text!r}"
    with pytest.raises(argparse.ArgumentTypeError, match="^expected a number, got 'half'$"):
        unit("half")


def test_float_in_range_formats_its_bounds() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r"^must be a number in \(0, 86400\], got '86401'$"):
        float_in_range(0.0, 86400.0, lo_open=True)("86401")


@pytest.mark.parametrize(
    "argv, prog",
    [
        (["simulate", "--out", "o", "--trce", "x"], "rlsched simulate"),
        (["controller", "status", "--bogus"], "rlsched controller status"),
        (["controller", "status", "extra"], "rlsched controller status"),
        (["controller", "--bogus", "status"], "rlsched controller"),
        (["trace", "stats", "t.csv", "--nope"], "rlsched trace stats"),
        (["--bogus", "trace", "stats", "t.csv"], "rlsched"),
    ],
)
def test_unrecognized_arguments_point_to_the_subcommands_help(
    tmp_path, monkeypatch, capsys, argv: list[str], prog: str
) -> None:
    """A subcommand's unknown arguments are reported by the parser they were given to, pointing to its own
    help, not by the top-level parser ("(see 'rlsched --help')")."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    extra = argv[-2:] if argv[-1] == "x" else [next(a for a in argv if a in ("--bogus", "--nope", "extra"))]
    assert err == f"{prog}: error: unrecognized arguments: {' '.join(extra)} (see '{prog} --help')\n"
    assert list(tmp_path.iterdir()) == []
