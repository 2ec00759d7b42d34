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

__all__ = ["nearest_existing", "replace_marked", "unwritable"]


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
