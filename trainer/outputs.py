"""Checks on output paths, made before any long work: a command that would fail only when it
writes its results (after every simulation or training step) fails at once instead; and
:func:`replace_marked`, how a generated section of a Markdown document is written again.

Pure path checks plus one probe: a temporary file created and removed in the nearest existing
directory, the only reliable test of "can I write here" (permissions, read-only mounts, immutable
directories; ``os.access`` is wrong for root).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["RESULTS_MD", "add_docs_option", "doc_problem", "marked", "nearest_existing", "replace_marked",
           "unwritable", "write_marked"]

RESULTS_MD = Path(__file__).resolve().parents[1] / "docs" / "RESULTS.md"


def replace_marked(text: str, begin: str, end: str, block: str) -> str:
    """``text`` with its section from the first ``begin`` marker to the first ``end`` marker after it
    (both included) replaced by ``block`` (which carries the markers); where ``text`` lacks either
    marker, ``block`` is appended after a blank line, ``text``'s trailing whitespace removed."""
    if begin in text and end in text:
        pre, rest = text.split(begin, 1)
        _, post = rest.split(end, 1)
        return pre + block + post
    return text.rstrip() + "\n\n" + block + "\n"


def nearest_existing(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def unwritable(path: str | Path) -> str | None:
    """Why a file or directory could not be created at ``path``, or ``None`` if it could.

    ``path``, or where it does not exist its nearest existing ancestor, must be a directory in which a
    file can be created.
    """
    anc = nearest_existing(Path(os.path.abspath(path)))
    if not anc.is_dir():
        return f"{anc} is not a directory"
    try:
        fd, probe = tempfile.mkstemp(dir=anc, prefix=".rlsched-write-probe-")
    except OSError as exc:
        return f"cannot write in {anc} ({exc.strerror or exc})"
    os.close(fd)
    os.unlink(probe)
    return None


def marked(name: str) -> tuple[str, str]:
    """The begin / end markers of the generated block ``name`` of a Markdown document."""
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def add_docs_option(ap) -> None:
    """``--docs [PATH]`` on the ``argparse`` parser ``ap``: write the generated tables into PATH
    (default :data:`RESULTS_MD`) between their markers."""
    ap.add_argument("--docs", nargs="?", const=RESULTS_MD, default=None, type=Path, metavar="PATH",
                    help=f"also write the tables between their markers of PATH (default {RESULTS_MD}); "
                         "the file is left as it is if the run fails")


def doc_problem(path: str | Path, names) -> str | None:
    """Why the blocks ``names`` of the document at ``path`` could not be rewritten (file missing or
    unwritable, a marker missing or out of order), or ``None``: checked before a long run."""
    path = Path(path)
    if not path.is_file():
        return f"{path}: no such file"
    if not os.access(path, os.W_OK):
        return f"{path}: not writable"
    text = path.read_text()
    for name in names:
        begin, end = marked(name)
        if begin not in text or end not in text or text.index(end) < text.index(begin):
            return f"{path}: lacks the markers {begin} ... {end}"
    return None


def write_marked(path: str | Path, blocks: dict[str, str]) -> None:
    """Replace each block ``name`` of the document at ``path`` by ``blocks[name]`` (Markdown without the
    markers; one blank line is kept on each side inside the markers). Writes once, after every block
    is in place; raises ``ValueError`` (the file untouched) where a marker is missing."""
    path = Path(path)
    problem = doc_problem(path, blocks)
    if problem:
        raise ValueError(problem)
    text = path.read_text()
    for name, body in blocks.items():
        begin, end = marked(name)
        text = replace_marked(text, begin, end, f"{begin}\n\n{body.strip()}\n\n{end}")
    path.write_text(text)
