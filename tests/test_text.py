from __future__ import annotations

import pytest

from rlsched.text import markup_safe, printable


@pytest.mark.parametrize(
    "raw, shown",
    [
        ("plain text, ünïcödé ok", "plain text, ünïcödé ok"),
        ("a\x1b[31mred", "a\\x1b[31mred"),
        ("two\nlines\r", "two\\nlines\\r"),
        ("tab\there", "tab\\there"),
        ("bidi\u202eevil", "bidi\\u202eevil"),
        ("lone \ud800", "lone \\ud800"),
        ("c1 \x9b1m del \x7f", "c1 \\x9b1m del \\x7f"),
    ],
)
def test_printable(raw: str, shown: str) -> None:
    assert printable(raw) == shown and printable(raw).isprintable()


def test_markup_safe_keeps_brackets_literal() -> None:
    from rich.console import Console

    con = Console(record=True, width=80, color_system=None)
    con.print(markup_safe("[bold red]x[/] \x1b[2J"))
    assert con.export_text().strip() == "[bold red]x[/] \\x1b[2J"
