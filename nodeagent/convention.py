"""The user contract shared by the controller and the job helper.

Users tag jobs for rlsched with the Slurm job comment::

    sbatch --gpus=N --comment "rlsched:model=<name>[,samples=<n>][,key=<job key>]" job.sh

* ``model``   model family (policies.workloads names/aliases, e.g. MoE, LM, GNN).
* ``samples`` total samples the job will process (for SRTF-like policies).
* ``key``     optional stable job key; default ``slurm-<SLURM_JOB_ID>``
              (the Slurm job id survives requeue, so it is stable too).

Checkpoints are keyed by the job key, never by anything that changes on
requeue. :func:`job_key_for` is the single definition both sides use.
"""

from __future__ import annotations

import re

PREFIX = "rlsched:"
# fullmatch, not match: "$" also matches before a trailing newline
_KEY_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")


class CommentError(ValueError):
    """A job comment that starts with ``rlsched:`` but is malformed."""


def parse_comment(comment: str | None) -> dict[str, str] | None:
    """Parse ``"rlsched:model=MoE,samples=100"`` -> ``{"model": "MoE", "samples": "100"}``.

    Returns None if the comment is not an rlsched comment (no ``rlsched:``
    prefix, e.g. empty or "(null)"). Raises CommentError for a malformed one.
    """
    if not comment:
        return None
    c = comment.strip()
    if not c.startswith(PREFIX):
        return None
    out: dict[str, str] = {}
    body = c[len(PREFIX):].strip()
    for part in filter(None, (p.strip() for p in body.split(","))):
        k, sep, v = part.partition("=")
        k, v = k.strip(), v.strip()
        if not sep or not k or not v:
            raise CommentError(f"bad rlsched comment field {part!r} in {comment!r}: expected key=value")
        if k in out:
            raise CommentError(f"duplicate field {k!r} in rlsched comment {comment!r}")
        out[k] = v
    if "samples" in out:
        try:
            if int(out["samples"]) <= 0:
                raise ValueError
        except ValueError:
            raise CommentError(f"samples must be a positive integer in {comment!r}") from None
    if "key" in out and not _KEY_RE.fullmatch(out["key"]):
        raise CommentError(f"key must match [A-Za-z0-9._-]{{1,128}} in {comment!r}")
    return out


def job_key_for(slurm_job_id: str | int, comment: str | None = None) -> str:
    """The stable checkpoint key of a job: comment ``key=`` if given, else ``slurm-<id>``."""
    fields = parse_comment(comment) or {}
    if "key" in fields:
        return fields["key"]
    return f"slurm-{slurm_job_id}"  # array tasks keep their "<id>_<task>" form
