"""rlsched/argtypes.py and every argparse type of the ``rlsched`` CLIs: one readable line per bad value.

argparse reports a type's ``ValueError`` as ``invalid <function name> value: 'x'`` (``invalid
_positive_int value: '1e5'``); every type must raise :class:`argparse.ArgumentTypeError` instead.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from rlsched.argtypes import float_at_least, int_at_least, non_negative_float, positive_float, positive_int
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
