"""Text from files and other programs, made safe to show on a terminal.

:func:`printable` is applied to every error line the ``rlsched`` command prints and to free-form
text it shows from files (a checkpoint's ``training.command``, CSV header names, JSON keys): a
terminal escape sequence (``ESC [ 2 J``), a carriage return or a line break in such text would
otherwise act on the terminal or split the one-line error. :func:`markup_safe` adds rich's markup
escaping for text that goes through a rich console (``[bold]`` is shown, not interpreted).
"""

from __future__ import annotations

__all__ = ["printable", "markup_safe"]

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(ch: str) -> str:
    if ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def printable(text: object) -> str:
    """``str(text)`` with every character that is not printable (``str.isprintable``: control characters
    C0 / C1 and DEL, line and paragraph separators, bidi and other format characters, lone surrogates)
    written as a Python escape (``\\x1b``, ``\\n``, ``\\u202e``, ``\\ud800``), so the result is one line
    that a terminal shows as is. Printable text, non-ASCII letters included, is unchanged; the ASCII
    space stays a space."""
    s = str(text)
    if s.isprintable():
        return s
    return "".join(ch if ch.isprintable() else _escape_char(ch) for ch in s)


def markup_safe(text: object) -> str:
    """:func:`printable` text escaped for rich markup: ``[red]`` in it prints as ``[red]``."""
    from rich.markup import escape

    return escape(printable(text))
