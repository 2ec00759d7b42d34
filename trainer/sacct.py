"""Reader for Slurm accounting history (``sacct``): a real cluster's GPU jobs as a trace.

An admin exports the jobs of a period and replays them against any policy
(``rlsched trace from-sacct``, then ``rlsched simulate``). Two inputs, told
apart by content:

* ``sacct --json``: one JSON document (at most :data:`MAX_JSON_BYTES`, as it is
  parsed whole). Slurm 22.05 writes it with the ``openapi/dbv0.0.38`` plugin;
  23.02 and later with ``data_parser/v0.0.39`` and newer, where the job state
  became a list of flags and the array task id / het offset a
  ``{"set", "infinite", "number"}`` object. Both are read. Fields used per job:
  ``job_id``, ``array.{job_id,task_id,task}``, ``het.{job_id,job_offset}``,
  ``time.{submission,start,elapsed}``, ``state.current``,
  ``tres.{allocated,requested}`` (lists of ``{"type", "name", "id", "count"}``),
  ``comment.job``, ``partition``, ``user``, ``name``. Steps are nested in their
  job (``steps``) and not read.
* ``sacct --parsable2`` (``-P``) or ``--parsable`` (``-p``) with its header line,
  read line by line. The delimiter is the header's first character that is not
  a letter or digit (``|``, or what ``--delimiter`` set). Columns
  (case-insensitive): ``JobID``, ``Submit``, ``Start``, ``State``, ``Elapsed``
  or ``ElapsedRaw``, ``AllocTRES`` and/or ``ReqTRES`` are required;
  ``Comment``, ``Partition``, ``User``, ``JobName`` are used when present
  (:data:`SACCT_FORMAT` has them all). Times are sacct's default
  ``YYYY-MM-DDTHH:MM:SS`` (local time of the sacct host; a daylight-saving
  change inside the period shifts later submissions by the change) or UNIX
  seconds (``SLURM_TIME_FORMAT=%s``); ``Unknown`` / ``None`` is no time.

The rule (also in ``docs/TRACES.md``):

1. **records** -- a job step (``123.batch``, ``123.0``, ``-P`` only) is skipped;
   every other record is a job: array tasks (``123_4``) and het-job components
   (``123+1``) are jobs of their own. Job records are numbered in input order.
2. **kept** -- a job is kept when its TRES hold GPUs (``gres/gpu=N``, else the
   sum of ``gres/gpu:TYPE=N``; allocated TRES, requested ones for a job never
   allocated), it ran in one of ``partitions`` (all when None), it started
   (a start time and a state other than ``PENDING``), it finished (not
   ``RUNNING`` / ``SUSPENDED`` / ...), it ran more than 0 s and it needs no more
   GPUs than the target cluster has. Each other job is counted under its reason
   (:data:`SKIP_REASONS`, the first that applies in that order).
3. **job id** -- Slurm's as sacct prints it (``123``, ``123_4``, ``123+1``).
4. **submit time** -- seconds since the earliest submission of the kept jobs.
5. **model** -- ``rlsched:model=NAME`` in the job's comment
   (:func:`controller.state.parse_comment`, the controller's own reading; a
   bad value there is ignored, as the controller ignores it); else
   ``default_model`` if given; else the Philly reader's seeded draw
   (:func:`trainer.philly.draw_models`: one draw per job record, in record
   order, mix ``mix``), so a job's model depends only on the seed and its
   position among the job records.
6. **work** -- ``total_samples`` is the work that takes the job's measured run
   time (``Elapsed``) alone on its best placement on the target cluster
   (:func:`trainer.philly.isolated_samples`, the Philly reader's rule 5): the
   original cluster's placement and interference are not in the record.

Jobs are returned sorted by submit time (ties in input order). Each keeps
``extra = {"user", "partition", "job_name", "state", "duration"}`` (the elapsed
seconds), plus ``"alloc_gpu_type"`` where its GPU TRES name one type (what the job ran on, kept as
information: it is not a demand column, :data:`trainer.traces.DEMAND_COLUMNS`, so a replay does not
require that type). Bad input is a
:class:`SacctError` naming the file, the line or job, and the field.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from policies.cluster import ClusterSpec
from policies.job import JobSpec
from policies.perf import ContentionModel
from policies.workloads import MODELS, canonical_model
from trainer.generate import GeneratorError, parse_mix
from trainer.philly import draw_models, isolated_samples
from rlsched.text import printable
from trainer.traces import MAX_SUBMIT_TIME_S, MAX_SUBMIT_TIME_TEXT, MAX_TRACE_JOBS, TraceError, not_utf8_error

__all__ = ["MAX_JSON_BYTES", "SACCT_FORMAT", "SKIP_REASONS", "SacctError", "SacctSummary", "read_sacct"]

#: ``sacct --format`` with every field the ``-P`` reader uses.
SACCT_FORMAT = "JobID,JobName,Submit,Start,End,Elapsed,State,AllocTRES,ReqTRES,Comment,Partition,User"
#: Largest ``sacct --json`` file read (bytes): 64 MiB. The document is parsed whole, which takes several times
#: its size in memory. Longer histories: one file per period (``sacct -S/-E``), or the ``-P`` format, read line by line.
MAX_JSON_BYTES = 64 * 1024 * 1024
#: Why a job record is not in the trace (rule 2, checked in this order; ``step``: ``-P`` step lines).
SKIP_REASONS = {
    "step": "job steps",
    "no_gpu": "without GPUs",
    "partition": "in other partitions",
    "never_started": "never started (cancelled or still pending)",
    "running": "still running or suspended (no final run time)",
    "ran_0s": "ran 0 s",
    "too_large": "with more GPUs than the cluster",
}
#: Job states (the state's first word) of a job that has not finished.
_ACTIVE_STATES = frozenset({"RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING", "RESIZING", "STAGE_OUT", "SIGNALING"})
#: Job states sacct reports (``squeue``'s base states); a JSON state list names one of them beside flags.
_BASE_STATES = frozenset({
    "PENDING", "RUNNING", "SUSPENDED", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
    "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY", "REQUEUED", "RESIZING", "REVOKED", "SPECIAL_EXIT",
})
#: A job record's id in ``-P`` output: ``123``, array task ``123_4`` or pending tasks ``123_[5-9%2]``, het
#: component ``123+1``; a step adds ``.batch`` / ``.extern`` / ``.N``.
_JOB_ID = re.compile(r"[0-9]+(?:_(?:[0-9]+|\[[^\]]*\]))?(?:\+[0-9]+)?")
_ELAPSED = re.compile(r"(?:([0-9]+)-)?(?:([0-9]+):)?([0-9]+):([0-9]+(?:\.[0-9]*)?)")
_DIGITS = re.compile(r"[0-9]+")
_EPOCH = datetime(1970, 1, 1)


class SacctError(TraceError):
    """Bad ``sacct`` input: the message names the file, the line or job, and the field."""

    def __init__(self, path: str | Path, message: str, where: str | None = None, column: str | None = None):
        loc = str(path) + (f", {where}" if where else "") + (f", field {column!r}" if column else "")
        ValueError.__init__(self, printable(f"{loc}: {message}"))
        self.path, self.row, self.column = str(path), where, column


@dataclass(slots=True)
class _Record:
    """One job record: where it is (for messages), and what the trace needs of it."""

    where: str
    job_id: str
    submit: float  # s since 1970 (the file's clock)
    started: bool
    state: str  # the base state (first word)
    elapsed: float  # s
    gpus: int
    gpu_type: str | None
    comment: str
    partition: str
    user: str
    name: str


@dataclass
class SacctSummary:
    """What :func:`read_sacct` read and kept (counts of job records; steps are not job records)."""

    source: str
    records: int = 0
    steps: int = 0
    kept: int = 0
    skipped: Counter = field(default_factory=Counter)
    from_comments: int = 0
    from_default: int = 0
    drawn: int = 0
    seed: int = 0
    default_model: str | None = None
    comment_problems: int = 0
    first_comment_problem: str | None = None

    def skip_text(self) -> str:
        """``"2 without GPUs, 1 ran 0 s"`` (job records only), or ``"none"``."""
        parts = [f"{self.skipped[k]} {text}" for k, text in SKIP_REASONS.items() if k != "step" and self.skipped[k]]
        return ", ".join(parts) or "none"

    def lines(self) -> list[str]:
        """The summary as printed by ``rlsched trace from-sacct``."""
        models = []
        if self.from_comments:
            models.append(f"{self.from_comments} from rlsched comments")
        if self.from_default:
            models.append(f"{self.from_default} --default-model {self.default_model}")
        if self.drawn:
            models.append(f"{self.drawn} drawn with seed {self.seed}")
        out = [
            f"{self.source}: {self.records} job records",
            f"  kept {self.kept} GPU jobs (models: {', '.join(models)})",
            f"  skipped {self.records - self.kept}: {self.skip_text()}",
        ]
        if self.skipped["step"]:
            out.append(f"  skipped {self.skipped['step']} job step lines")
        if self.comment_problems:
            n = self.comment_problems
            out.append(f"  {n} rlsched comment{'s' if n != 1 else ''} had a value the controller ignores "
                       f"(first: {self.first_comment_problem})")
        return out


# --------------------------------------------------------------------------- sacct -P
def _elapsed(path: Path, where: str, col: str, text: str) -> float:
    t = text.strip()
    if col == "elapsedraw":
        if _DIGITS.fullmatch(t):
            return float(t)
        raise SacctError(path, f"expected whole seconds, got {text!r}", where, "ElapsedRaw")
    m = _ELAPSED.fullmatch(t)
    if not m:
        raise SacctError(path, f"expected a run time like 1-02:03:04 or 02:03:04, got {text!r}", where, "Elapsed")
    d, h, mi, s = m.groups()
    return int(d or 0) * 86400.0 + int(h or 0) * 3600.0 + int(mi) * 60.0 + float(s)


class _Clock:
    """Times of ``-P`` output as seconds: ISO date-times as wall-clock seconds, or UNIX seconds; one kind per file."""

    def __init__(self, path: Path) -> None:
        self.path, self.kind = path, None

    def __call__(self, where: str, col: str, text: str) -> float | None:
        t = text.strip()
        if t in ("", "Unknown", "None"):
            return None
        if _DIGITS.fullmatch(t):
            kind, value = "UNIX seconds", float(t)
        else:
            try:
                dt = datetime.fromisoformat(t)
            except ValueError:
                raise SacctError(self.path, f"expected a date-time like 2024-03-04T09:30:00 (sacct's default "
                                 f"SLURM_TIME_FORMAT) or UNIX seconds (SLURM_TIME_FORMAT=%s), got {text!r}",
                                 where, col) from None
            kind = "date-times"
            value = dt.timestamp() if dt.tzinfo is not None else (dt - _EPOCH).total_seconds()
        if self.kind is None:
            self.kind = kind
        elif kind != self.kind:
            raise SacctError(self.path, f"{text!r} is in {kind}, earlier times in {self.kind}", where, col)
        return value


def _tres_gpus(path: Path, where: str, col: str, text: str) -> tuple[int, str | None]:
    """GPUs in a TRES string ``cpu=8,mem=64G,node=1,gres/gpu:a100=4,gres/gpu=4``: (count, the one GPU type or None)."""
    total: int | None = None
    typed: dict[str, int] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        key, sep, value = item.partition("=")
        key = key.strip().lower()
        if key != "gres/gpu" and not key.startswith("gres/gpu:"):
            continue
        if not sep or not _DIGITS.fullmatch(value.strip()):
            raise SacctError(path, f"expected {key}=<GPUs>, got {item!r}", where, col)
        if key == "gres/gpu":
            total = int(value)
        else:
            typed[key.partition(":")[2]] = typed.get(key.partition(":")[2], 0) + int(value)
    gpus = total if total is not None else sum(typed.values())
    return gpus, (next(iter(typed)) if len(typed) == 1 else None)


def _header(path: Path, line: str) -> tuple[list[str], str, bool]:
    """(lower-case column names, delimiter, whether rows end with the delimiter) of a ``-P``/``-p`` header."""
    m = re.search(r"[^A-Za-z0-9]", line)
    if m is None or not line[:1].isalpha():
        raise SacctError(path, f"not sacct --json nor sacct -P output with a header line (expected e.g. "
                         f"{SACCT_FORMAT.replace(',', '|')}; run sacct without --noheader)", "line 1")
    delim = m.group(0)
    names = line.split(delim)
    trailing = names[-1] == ""  # sacct -p: every line ends with the delimiter
    if trailing:
        names.pop()
    names = [n.strip().lower() for n in names]
    need = [("jobid",), ("submit",), ("start",), ("state",), ("elapsed", "elapsedraw"), ("alloctres", "reqtres")]
    missing = [" or ".join(alts) for alts in need if not any(a in names for a in alts)]
    if missing:
        raise SacctError(path, f"missing column(s) {', '.join(missing)} (header: {line.strip()!r}; sacct "
                         f"--format={SACCT_FORMAT} has all)", "line 1")
    return names, delim, trailing


def _parsable_records(path: Path, summary: SacctSummary) -> Iterator[_Record | None]:
    """The records of ``sacct -P``/``-p`` output, read line by line (None for a step)."""
    names: list[str] | None = None
    clock = _Clock(path)
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            try:
                line = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as exc:
                raise SacctError(path, f"not UTF-8 text: byte 0x{raw[exc.start]:02x}; save it as UTF-8",
                                 f"line {lineno}") from None
            if not line.strip():
                continue
            if names is None:
                names, delim, trailing = _header(path, line)
                col = {n: i for i, n in enumerate(names)}
                elapsed_col = "elapsedraw" if "elapsedraw" in col else "elapsed"
                summary.source = f"{path}: sacct -P ({len(names)} columns)"

                def get(name: str) -> str:  # the current line's field ``name`` ("" where there is no such column)
                    return fields[col[name]] if name in col else ""

                continue
            fields = line.split(delim)
            if trailing and fields and fields[-1] == "":
                fields.pop()
            if len(fields) != len(names):
                raise SacctError(path, f"expected {len(names)} fields, got {len(fields)} (does a field hold "
                                 f"{delim!r}? then run sacct with --delimiter set to a character none holds)",
                                 f"line {lineno}")

            jid = get("jobid").strip()
            where = f"line {lineno} (job {jid})"
            base_id = jid.split(".", 1)[0]
            if not _JOB_ID.fullmatch(base_id) or (base_id != jid and not jid[len(base_id) + 1:]):
                raise SacctError(path, f"expected a Slurm job id like 123, 123_4, 123+1 or step 123.batch, "
                                 f"got {jid!r}", f"line {lineno}", "JobID")
            if base_id != jid:
                yield None
                continue
            submit = clock(where, "Submit", get("submit"))
            if submit is None:
                raise SacctError(path, f"expected the submit time, got {get('submit')!r}", where, "Submit")
            start = clock(where, "Start", get("start"))
            state = (get("state").split() or [""])[0].upper()
            alloc, req = get("alloctres"), get("reqtres")
            tres_col, tres = ("AllocTRES", alloc) if alloc.strip() else ("ReqTRES", req)
            gpus, gpu_type = _tres_gpus(path, where, tres_col, tres)
            yield _Record(
                where, jid, submit, start is not None and state != "PENDING", state,
                _elapsed(path, where, elapsed_col, get(elapsed_col)), gpus, gpu_type, get("comment"),
                get("partition").strip(), get("user").strip(), get("jobname"),
            )
    if names is None:
        raise SacctError(path, "empty file: no header and no jobs")


# --------------------------------------------------------------------------- sacct --json
_MISSING = object()


def _no_val(value: Any) -> Any:
    """A number that Slurm may write as ``{"set", "infinite", "number"}`` (23.02 and later): the number, or None
    where it is not set; other values as they are."""
    if isinstance(value, dict) and "number" in value:
        return value["number"] if value.get("set", True) and not value.get("infinite", False) else None
    return value


def _json_get(path: Path, where: str, obj: Any, key: str, kind: str, required: bool = True) -> Any:
    """``obj[a][b]...`` for ``key`` ``"a.b..."``, checked: ``kind`` ``int`` (>= 0; None where not set), ``str``
    (None -> ""), ``list`` or ``any``."""
    value: Any = obj
    for part in key.split("."):
        value = value.get(part, _MISSING) if isinstance(value, dict) else _MISSING
        if value is _MISSING:
            if required:
                raise SacctError(path, "missing (is this sacct --json output?)", where, key)
            return None if kind != "str" else ""
    if kind == "int":
        value = _no_val(value)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or value != int(value):
            raise SacctError(path, f"expected a whole number >= 0, got {value!r}", where, key)
        return int(value)
    if kind == "str":
        if value is None:
            return ""
        if not isinstance(value, str):
            raise SacctError(path, f"expected a string, got {value!r}", where, key)
    if kind == "list" and not isinstance(value, list):
        raise SacctError(path, f"expected a list, got {value!r}", where, key)
    return value


def _json_tres_gpus(path: Path, where: str, key: str, tres: list) -> tuple[int, str | None]:
    """GPUs in a TRES list ``[{"type": "gres", "name": "gpu", "count": 4}, {"name": "gpu:a100", ...}]``."""
    total: int | None = None
    typed: dict[str, int] = {}
    for i, t in enumerate(tres):
        if not isinstance(t, dict):
            raise SacctError(path, f"expected a TRES object, got {t!r}", where, f"{key}[{i}]")
        name = t.get("name") or ""
        if t.get("type") != "gres" or not isinstance(name, str) or not (name == "gpu" or name.startswith("gpu:")):
            continue
        count = t.get("count")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise SacctError(path, f"expected a GPU count >= 0, got {count!r}", where, f"{key}[{i}].count")
        if name == "gpu":
            total = count
        else:
            typed[name[4:]] = typed.get(name[4:], 0) + count
    gpus = total if total is not None else sum(typed.values())
    return gpus, (next(iter(typed)) if len(typed) == 1 else None)


def _json_state(path: Path, where: str, value: Any) -> str:
    """The base state of ``state.current``: a string (22.05, 23.02) or a list of flags (23.11 and later)."""
    if isinstance(value, str):
        return (value.split() or [""])[0].upper()
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        base = [v.upper() for v in value if v.upper() in _BASE_STATES]
        return base[0] if base else value[0].upper()
    raise SacctError(path, f"expected a job state, got {value!r}", where, "state.current")


def _json_job_id(path: Path, where: str, job: dict) -> str:
    """The job's id as sacct prints it: ``123``, array task ``123_4`` (``123_[5-9]`` for pending tasks), het
    component ``123+1``."""
    jid = _json_get(path, where, job, "job_id", "int")
    if jid is None:
        raise SacctError(path, "expected a job id, got none", where, "job_id")
    array_job = _json_get(path, where, job, "array.job_id", "int", required=False)
    if array_job:
        task = _json_get(path, where, job, "array.task_id", "int", required=False)
        if task is not None:
            return f"{array_job}_{task}"
        tasks = _json_get(path, where, job, "array.task", "str", required=False)
        return f"{array_job}_[{tasks}]" if tasks else str(jid)
    het_job = _json_get(path, where, job, "het.job_id", "int", required=False)
    offset = _json_get(path, where, job, "het.job_offset", "int", required=False)
    if het_job and offset is not None:
        return f"{het_job}+{offset}"
    return str(jid)


def _json_source(path: Path, doc: dict) -> str:
    meta = doc.get("meta") if isinstance(doc.get("meta"), dict) else {}
    slurm = meta.get("Slurm") or meta.get("slurm") or {}
    plugin = meta.get("plugin") or {}
    release = slurm.get("release") if isinstance(slurm, dict) else None
    parser = (plugin.get("data_parser") or plugin.get("type")) if isinstance(plugin, dict) else None
    what = ", ".join(str(x) for x in (f"Slurm {release}" if release else None, parser) if x)
    return f"{path}: sacct --json" + (f" ({what})" if what else "")


def _json_records(path: Path, summary: SacctSummary) -> Iterator[_Record]:
    """The job records of ``sacct --json`` output (its steps are nested in them)."""
    size = path.stat().st_size
    if size > MAX_JSON_BYTES:
        raise SacctError(path, f"{size / 2**20:.0f} MiB is over the {MAX_JSON_BYTES / 2**20:.0f} MiB limit for "
                         f"sacct --json input, which is parsed whole: export a shorter period per file (sacct -S/-E) "
                         f"or use sacct -P --format={SACCT_FORMAT}, which is read line by line")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise not_utf8_error(path, raw) from None
    del raw
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SacctError(path, f"not valid JSON: {exc.msg}", f"line {exc.lineno} column {exc.colno}") from None
    del text
    jobs = doc.get("jobs") if isinstance(doc, dict) else None
    if not isinstance(jobs, list):
        errors = doc.get("errors") if isinstance(doc, dict) else None
        said = f"; sacct reported: {errors[0].get('description') or errors[0]}" if (
            isinstance(errors, list) and errors and isinstance(errors[0], dict)) else ""
        raise SacctError(path, f"not sacct --json output: no 'jobs' list{said}", None, "jobs")
    summary.source = _json_source(path, doc)
    for i, job in enumerate(jobs):
        where = f"jobs[{i}]"
        if not isinstance(job, dict):
            raise SacctError(path, f"expected a job object, got {job!r}"[:200], where)
        jid = _json_get(path, where, job, "job_id", "int")
        where = f"job {jid} (jobs[{i}])"
        jid_text = _json_job_id(path, where, job)
        where = f"job {jid_text} (jobs[{i}])"
        submit = _json_get(path, where, job, "time.submission", "int")
        if not submit:
            raise SacctError(path, f"expected the submit time, got {submit!r}", where, "time.submission")
        start = _json_get(path, where, job, "time.start", "int")
        elapsed = _json_get(path, where, job, "time.elapsed", "int")
        state = _json_state(path, where, _json_get(path, where, job, "state.current", "any"))
        alloc = _json_get(path, where, job, "tres.allocated", "list")
        key, tres = ("tres.allocated", alloc) if alloc else ("tres.requested",
                                                            _json_get(path, where, job, "tres.requested", "list"))
        gpus, gpu_type = _json_tres_gpus(path, where, key, tres)
        yield _Record(
            where, jid_text, float(submit), bool(start) and state != "PENDING", state, float(elapsed or 0), gpus,
            gpu_type, _json_get(path, where, job, "comment.job", "str", required=False),
            _json_get(path, where, job, "partition", "str", required=False).strip(),
            _json_get(path, where, job, "user", "str", required=False).strip(),
            _json_get(path, where, job, "name", "str", required=False),
        )


# --------------------------------------------------------------------------- the trace
def _skip_reason(rec: _Record, partitions: frozenset[str] | None, cap: int) -> str | None:
    """Rule 2: why ``rec`` is not in the trace (a key of :data:`SKIP_REASONS`), or None."""
    if rec.gpus <= 0:
        return "no_gpu"
    if partitions is not None and not partitions & set(rec.partition.split(",")):
        return "partition"
    if not rec.started:
        return "never_started"
    if rec.state in _ACTIVE_STATES:
        return "running"
    if rec.elapsed <= 0:
        return "ran_0s"
    if rec.gpus > cap:
        return "too_large"
    return None


def _input_format(path: Path) -> str:
    """``json`` or ``parsable`` from the first non-blank byte of the file."""
    try:
        with path.open("rb") as f:
            head = f.read(4096)
            while head and not head.lstrip(b"\xef\xbb\xbf \t\r\n"):
                more = f.read(4096)
                if not more:
                    break
                head += more
    except OSError as exc:
        raise SacctError(path, f"cannot open: {exc.strerror}") from exc
    head = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if not head:
        raise SacctError(path, "empty file: no header and no jobs")
    return "json" if head[:1] in (b"{", b"[") else "parsable"


def read_sacct(
    path: str | Path,
    cluster: ClusterSpec,
    *,
    seed: int = 0,
    default_model: str | None = None,
    partitions: Sequence[str] | None = None,
    mix: str = "normal",
    perf: ContentionModel | None = None,
) -> tuple[list[JobSpec], SacctSummary]:
    """The GPU jobs of ``sacct --json`` or ``sacct -P`` output as a trace for ``cluster`` (rules in the module
    docstring), and a summary of what was kept and skipped.

    :param path: the sacct output file.
    :param cluster: the target cluster: it prices the work and bounds the GPU demand.
    :param seed: seed of the model draw for jobs whose comment names no model (>= 0).
    :param default_model: the model of those jobs instead of the draw.
    :param partitions: keep only jobs of these partitions (None: all).
    :param mix: model mix of the draw (anything :func:`trainer.generate.parse_mix` takes).
    :param perf: performance model; defaults to ``ContentionModel(cluster)``.
    :raises SacctError: bad input, or no job left (with the counts of why).
    :raises UnknownModelError: a ``default_model`` that is no known model.
    :raises ValueError: a bad ``seed`` or ``mix``.
    """
    from controller.state import parse_comment

    path = Path(path)
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    default = canonical_model(default_model) if default_model is not None else None
    try:
        probs = parse_mix(mix)
    except GeneratorError as exc:
        raise ValueError(str(exc)) from None
    wanted = frozenset(p.strip() for p in partitions) if partitions is not None else None
    summary = SacctSummary(source=str(path), seed=seed, default_model=default)
    fmt = _input_format(path)
    records = _json_records(path, summary) if fmt == "json" else _parsable_records(path, summary)
    kept: list[tuple[int, _Record]] = []
    for rec in records:
        if rec is None:
            summary.skipped["step"] += 1
            continue
        index = summary.records
        summary.records += 1
        reason = _skip_reason(rec, wanted, cluster.total_gpus)
        if reason is not None:
            summary.skipped[reason] += 1
        else:
            kept.append((index, rec))
            if len(kept) > MAX_TRACE_JOBS:
                raise SacctError(path, f"more than {MAX_TRACE_JOBS:,} GPU jobs, the limit for one trace: export a "
                                 "shorter period per file (sacct -S/-E)", rec.where)
    if not kept:
        raise SacctError(path, f"no GPU job that ran is left of its {summary.records} job records "
                         f"(skipped: {summary.skip_text()})")
    seen: dict[str, str] = {}
    for _, rec in kept:
        if rec.job_id in seen:
            raise SacctError(path, f"job id {rec.job_id} again (first at {seen[rec.job_id]}): one record per job "
                             "is expected; run sacct without -D/--duplicates", rec.where, "job id")
        seen[rec.job_id] = rec.where

    draws = draw_models(summary.records, seed, probs)
    models: list[str] = []
    for index, rec in kept:
        req = parse_comment(rec.comment)
        if req.problem:
            summary.comment_problems += 1
            summary.first_comment_problem = summary.first_comment_problem or f"job {rec.job_id}: {req.problem}"
        if req.model is not None:
            models.append(req.model)
            summary.from_comments += 1
        elif default is not None:
            models.append(default)
            summary.from_default += 1
        else:
            models.append(MODELS[int(draws[index])])
            summary.drawn += 1
    summary.kept = len(kept)

    t0 = min(rec.submit for _, rec in kept)
    for _, rec in kept:
        if rec.submit - t0 > MAX_SUBMIT_TIME_S:
            raise SacctError(path, f"submitted {rec.submit - t0:.4g} s after the earliest kept job, beyond the "
                             f"largest submit time {MAX_SUBMIT_TIME_TEXT}", rec.where, "submit time")
    perf = perf or ContentionModel(cluster)
    seconds = np.array([rec.elapsed for _, rec in kept], dtype=np.float64)
    samples = isolated_samples(perf, models, [rec.gpus for _, rec in kept], seconds)
    bad = np.flatnonzero(~np.isfinite(samples))
    if bad.size:
        rec = kept[int(bad[0])][1]
        raise SacctError(path, f"run time {rec.elapsed:g} s is too large to price as samples", rec.where, "elapsed")
    jobs = []
    for (_, rec), model, work in zip(kept, models, samples.tolist()):
        extra: dict[str, Any] = {"user": rec.user, "partition": rec.partition, "job_name": rec.name,
                                 "state": rec.state, "duration": rec.elapsed}
        if rec.gpu_type:
            extra["alloc_gpu_type"] = rec.gpu_type
        jobs.append(JobSpec(rec.job_id, rec.submit - t0, model, rec.gpus, work, extra))
    order = sorted(range(len(jobs)), key=lambda i: jobs[i].submit_time)  # stable: ties in input order
    return [jobs[i] for i in order], summary
