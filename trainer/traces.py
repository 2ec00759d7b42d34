"""Job traces: one canonical schema, several readers.

Canonical columns (CSV or Parquet)::

    job_id, submit_time, model, gpu_demand, total_samples

``submit_time`` in seconds from the trace start; ``model`` any name or alias
known to :mod:`policies.workloads`; ``total_samples`` may be replaced by
``duration`` (seconds in isolation on the best placement of the target
cluster). Optional resource columns (:data:`DEMAND_COLUMNS`: ``gpu_type``,
``cpus_per_gpu``, ``mem_gb_per_gpu``; blank: not declared) give ``JobSpec.demand``.
Other columns (user, vc, ...) are kept in ``JobSpec.extra``.

Readers: canonical CSV / Parquet, DeepShare's JSON job sets, the Philly CSV
(:mod:`trainer.philly`). :func:`load_trace` picks one by file content.
Every reader reports a bad row as ``TraceError`` naming file, row and field;
text files must be UTF-8, CSV rows must have as many fields as the header,
job ids must be unique (also as JSON keys) and submit times at most
:data:`MAX_SUBMIT_TIME_S` seconds. CSV numbers are plain decimal literals
(:func:`plain_number`), JSON and Parquet numbers real numbers (not strings);
JSON text must be encodable as UTF-8 (no lone surrogate such as ``"\\ud800"``)
and JSON integers have at most :data:`MAX_JSON_DIGITS` digits.

Bounds: a trace file is at most :data:`MAX_TRACE_BYTES` (32 MiB, about ten
times the whole Philly trace) and :data:`MAX_TRACE_JOBS` (1,000,000) jobs. A
larger file is refused before it is read (its size from ``stat``; a Parquet
file's row count from its footer), and a CSV with more rows stops at the first
row beyond the limit. CSV rows are parsed one at a time into jobs, so a bad row
is reported as soon as it is reached, holding only the jobs before it. Measured
(``/usr/bin/time -v rlsched trace stats``, docs/TRACES.md, "Limits"): a
1,000,000-job CSV peaks at 538 MB RSS, the same with a bad last row at 492 MB;
a 200 MB CSV is refused before reading, at 85 MB (the interpreter and imports).
"""

from __future__ import annotations

import codecs
import csv
import decimal
import io
import json
import math
import numbers
import os
import re
import tempfile
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Iterable, Iterator, Sequence

from policies.cluster import ClusterSpec
from policies.job import JobSpec
from policies.perf import ContentionModel
from policies.workloads import UnknownModelError, canonical_model
from rlsched.text import printable

__all__ = [
    "TraceError",
    "CANONICAL_COLUMNS",
    "PARQUET_SUFFIXES",
    "TRACE_SUFFIXES",
    "TRACE_FORMATS",
    "current_umask",
    "not_utf8_error",
    "open_csv",
    "load_trace",
    "trace_format",
    "read_canonical",
    "read_deepshare_json",
    "write_trace",
    "validate_jobs",
    "plain_number",
    "MAX_SUBMIT_TIME_S",
    "MAX_SUBMIT_TIME_TEXT",
    "DEEPSHARE_KEYS",
    "DEMAND_COLUMNS",
    "MAX_TRACE_BYTES",
    "MAX_TRACE_JOBS",
    "MAX_JSON_DIGITS",
    "check_trace_size",
]

CANONICAL_COLUMNS = ("job_id", "submit_time", "model", "gpu_demand", "total_samples")

#: File suffixes (lower case) read as Parquet by :func:`read_canonical` and written so by :func:`write_trace`.
PARQUET_SUFFIXES = (".parquet", ".pq")
#: Every trace file suffix (lower case) :func:`load_trace` reads and :func:`write_trace` writes. Code that
#: collects the traces of a directory should use this list rather than a copy.
TRACE_SUFFIXES = (".csv", *PARQUET_SUFFIXES, ".json")
#: Largest submit time (s) a trace may hold, every reader, :func:`write_trace`, the generator and the simulator
#: check it: 1e9 s, about 31.7 years. Real traces span months (Philly: 109 days); a time far beyond it is a unit
#: or parsing mistake, and a simulated span of 1e12 s took a 25 GB utilisation grid (or spun for minutes).
MAX_SUBMIT_TIME_S = 1e9
#: :data:`MAX_SUBMIT_TIME_S` in words, for messages.
MAX_SUBMIT_TIME_TEXT = f"{MAX_SUBMIT_TIME_S:g} s (about {MAX_SUBMIT_TIME_S / (365.25 * 86400):.1f} years)"

#: Largest trace file any reader opens (bytes): 32 MiB, about ten times the whole Philly trace (3.3 MB, 82,247
#: jobs). Checked with ``stat`` before reading, so a larger file costs no memory.
MAX_TRACE_BYTES = 32 * 2**20
#: Most jobs (data rows) a trace may hold: 1,000,000. A CSV stops at the first row beyond it.
MAX_TRACE_JOBS = 1_000_000
#: Most digits of a JSON integer (Python's own limit for converting text to ``int``, ``sys.get_int_max_str_digits``).
MAX_JSON_DIGITS = 4300


def check_trace_size(path: str | Path, limit: int | None = None, what: str = "trace") -> int:
    """The size of ``path`` in bytes; :class:`TraceError` if it is over ``limit`` (default
    :data:`MAX_TRACE_BYTES`) or cannot be read. Nothing of the file is read."""
    limit = MAX_TRACE_BYTES if limit is None else limit
    try:
        size = Path(path).stat().st_size
    except OSError as exc:
        raise TraceError(path, f"cannot open: {exc.strerror}") from exc
    if size > limit:
        raise TraceError(
            path,
            f"{size / 2**20:.1f} MiB is over the {limit / 2**20:.0f} MiB limit for a {what} file "
            f"(at most {MAX_TRACE_JOBS:,} jobs); split it by submit time and simulate the parts",
        )
    return size


def _too_many_jobs(path: Path, row: int | str | None = None) -> TraceError:
    return TraceError(path, f"more than {MAX_TRACE_JOBS:,} jobs, the limit for one trace; split it by submit time", row)


#: What :func:`trace_format` returns, and how messages name it.
TRACE_FORMATS = {"canonical": "canonical CSV/Parquet", "deepshare": "DeepShare JSON", "philly": "Philly CSV"}


class TraceError(ValueError):
    """A trace that cannot be used. The message names file, row and field."""

    def __init__(self, path: str | Path, message: str, row: int | str | None = None, column: str | None = None):
        where = str(path)
        if row is not None:
            where += f", row {row}"
        if column is not None:
            where += f", field {column!r}"
        # File text (a JSON key as row, a header name, a value) may hold terminal escapes: shown escaped.
        super().__init__(printable(f"{where}: {message}"))
        self.path, self.row, self.column = str(path), row, column


def not_utf8_error(path: str | Path, raw: bytes | None = None) -> TraceError:
    """The :class:`TraceError` for a file that is not UTF-8 text, naming the line of its first bad byte.

    ``raw`` is the file's content if the caller has it; otherwise the file is read again (error path only).
    """
    try:
        if raw is None:
            raw = Path(path).read_bytes()
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        bad = f"byte 0x{raw[exc.start]:02x} at line {line} (byte offset {exc.start})"
        return TraceError(path, f"not UTF-8 text: {bad}; save it as UTF-8")
    except OSError:  # cannot re-read it to locate the bad byte: the message without the position
        return TraceError(path, "not UTF-8 text; save it as UTF-8")
    return TraceError(path, "not UTF-8 text; save it as UTF-8")


def _show(value: Any) -> str:
    """``repr(value)``, shortened for messages (a JSON number may have hundreds of digits)."""
    r = repr(value)
    return r if len(r) <= 40 else f"{r[:24]}... ({len(r)} characters)"


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


#: A number as a CSV field may write it: a plain decimal or float literal (``12``, ``-0.5``, ``1e3``, ``.5``),
#: or nan / inf (refused later as not finite, with that message). ``float()`` takes more: ``1_000``, ``٣``
#: (any Unicode digit), which no other CSV tool reads as a number.
_PLAIN_NUMBER = re.compile(
    r"\s*[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|nan|inf|infinity)\s*", re.IGNORECASE
)


def plain_number(text: str) -> bool:
    """Whether ``text`` is a number as CSV writes it (see :data:`_PLAIN_NUMBER`), surrounding blanks allowed."""
    return _PLAIN_NUMBER.fullmatch(text) is not None


def _num(
    path: Path,
    row: int | str,
    col: str,
    value: Any,
    *,
    integer: bool = False,
    positive: bool = False,
    text: bool = False,
) -> float:
    """``value`` as a finite number >= 0 (> 0 with ``positive``; an ``int`` with ``integer``).

    ``text``: the value comes from a text format (CSV), where numbers are written as plain decimal
    literals; otherwise (JSON, Parquet) it must be a number already: the string ``"2"`` or JSON
    ``true`` is not one.
    """
    try:
        if _blank(value) or isinstance(value, bool):  # JSON true is not the number 1
            raise ValueError
        if isinstance(value, str):
            if not (text and plain_number(value)):
                raise ValueError
        elif not isinstance(value, (numbers.Real, decimal.Decimal)):  # e.g. a Parquet timestamp or bytes
            raise TypeError
        x = float(value)
    except (TypeError, ValueError):
        kind = " (a string)" if isinstance(value, str) and not text and not _blank(value) else ""
        raise TraceError(path, f"expected a number, got {_show(value)}{kind}", row, col) from None
    except OverflowError:  # an integer beyond the float range, e.g. JSON 1e400 written out
        raise TraceError(path, f"expected a finite number, got {_show(value)}", row, col) from None
    if not math.isfinite(x):
        raise TraceError(path, f"expected a finite number, got {_show(value)}", row, col)
    if x < 0:
        raise TraceError(path, f"must not be negative, got {_show(value)}", row, col)
    if positive and x <= 0:
        raise TraceError(path, f"must be positive, got {_show(value)}", row, col)
    if integer:
        if x != int(x):
            raise TraceError(path, f"expected an integer, got {_show(value)}", row, col)
        return int(x)
    return x


def _as_written(value: Any) -> str:
    """An integer field's value as the file wrote it: CSV text as is, a JSON / Parquet integer in full (not
    rounded through a float: 2**64 - 1 is not 18446744073709551616), shortened for messages."""
    if isinstance(value, str):
        shown = value.strip()
    elif isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        shown = str(int(value))
    else:
        shown = str(value)
    return shown if len(shown) <= 40 else f"{shown[:24]}... ({len(shown)} digits)"


def _model(path: Path, row: int | str, value: Any) -> str:
    if _blank(value):
        raise TraceError(path, "empty model name", row, "model")
    try:
        return canonical_model(str(value))
    except UnknownModelError as exc:
        raise TraceError(path, str(exc), row, "model") from None


def _job_from_row(
    path: Path,
    rownum: int | str,
    rec: dict[str, Any],
    cluster: ClusterSpec | None,
    perf: ContentionModel | None,
    *,
    text: bool = False,
    names: dict[str, str] | None = None,
) -> JobSpec:
    """The job of one row. ``text``: the values are CSV text (see :func:`_num`). ``names``: how the file
    names a canonical field, for messages (DeepShare JSON: ``total_samples`` -> ``total_samples_to_train``)."""
    names = names or {}

    def field(c: str) -> str:
        return names.get(c, c)

    missing = [field(c) for c in ("job_id", "submit_time", "model", "gpu_demand") if c not in rec]
    if "total_samples" not in rec and "duration" not in rec:
        missing.append(f"{field('total_samples')} (or duration)")
    if missing:
        raise TraceError(path, f"missing column(s): {', '.join(missing)}", rownum)
    raw_id = rec["job_id"]
    # A Parquet null (or a float column's NaN) is no id, not the id "None" / "nan".
    missing_id = raw_id is None or (isinstance(raw_id, float) and math.isnan(raw_id))
    job_id = "" if missing_id else str(raw_id).strip()
    if not job_id:
        raise TraceError(path, "empty job id", rownum, field("job_id"))
    submit = _num(path, rownum, field("submit_time"), rec["submit_time"], text=text)
    if submit > MAX_SUBMIT_TIME_S:
        raise TraceError(
            path,
            f"{_show(rec['submit_time'])} is beyond the largest submit time {MAX_SUBMIT_TIME_TEXT}",
            rownum,
            field("submit_time"),
        )
    model = _model(path, rownum, rec["model"])
    raw_demand = rec["gpu_demand"]
    demand = int(_num(path, rownum, field("gpu_demand"), raw_demand, integer=True, positive=True, text=text))
    if cluster is not None and demand > cluster.total_gpus:
        raise TraceError(
            path,
            f"gpu_demand {_as_written(raw_demand)} is larger than the cluster ({cluster.total_gpus} GPUs)",
            rownum,
            field("gpu_demand"),
        )
    ts = rec.get("total_samples")
    # Fall back to duration only where total_samples is absent or empty (NaN is a bad total_samples).
    if not _blank(ts) or "duration" not in rec:
        samples = _num(path, rownum, field("total_samples"), ts, positive=True, text=text)
    else:
        if "total_samples" in rec and _blank(rec["duration"]):
            raise TraceError(
                path, "expected a number in total_samples or duration, got neither", rownum, "total_samples"
            )
        duration = _num(path, rownum, "duration", rec["duration"], positive=True, text=text)
        if perf is None:
            raise TraceError(path, "a 'duration' column needs the target cluster to convert to samples", rownum, "duration")
        samples = duration * perf.best_isolated_throughput(model, demand)
    extra = {k: v for k, v in rec.items() if k not in CANONICAL_COLUMNS and k not in DEMAND_COLUMNS and k != "duration"}
    if "duration" in rec and rec.get("duration") not in (None, ""):
        extra["duration"] = rec["duration"]
    return JobSpec(job_id, submit, model, demand, samples, extra, _demand_of_row(path, rownum, rec, demand, cluster, text))


def validate_jobs(path: str | Path, jobs: Sequence[JobSpec], rows: Sequence[int | str] | None = None) -> None:
    """Reject an empty trace or a repeated job id.

    ``rows[i]`` is how the reader names job ``i``'s row (default ``i + 1``).
    """
    seen: set[str] = set()
    for i, j in enumerate(jobs):
        if j.job_id in seen:
            raise TraceError(path, f"duplicate job id {j.job_id!r}", rows[i] if rows is not None else i + 1, "job_id")
        seen.add(j.job_id)
    if not jobs:
        raise TraceError(path, "the trace has no jobs")


def read_canonical(path: str | Path, cluster: ClusterSpec | None = None, perf: ContentionModel | None = None) -> list[JobSpec]:
    """Read a canonical CSV or Parquet trace (see module docstring; bounds: :data:`MAX_TRACE_BYTES`,
    :data:`MAX_TRACE_JOBS`). Rows become jobs one at a time, so memory holds the jobs, not the rows' text."""
    path = Path(path)
    if cluster is not None and perf is None:
        perf = ContentionModel(cluster)
    check_trace_size(path)
    rows: Iterable[tuple[int, dict[str, Any]]]
    if path.suffix.lower() in PARQUET_SUFFIXES:
        rows = _read_parquet_rows(path)
        text = False
    else:
        rows = _read_csv_rows(path)
        text = True
    jobs: list[JobSpec] = []
    lines: list[int] = []
    for n, rec in rows:
        jobs.append(_job_from_row(path, n, rec, cluster, perf, text=text))
        lines.append(n)
    validate_jobs(path, jobs, lines)
    return jobs


def _read_parquet_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """The rows of a Parquet trace as ``(row, {column: value})``, row 1 first, read in record batches; the
    row count is checked against :data:`MAX_TRACE_JOBS` from the footer before any row is read."""
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as exc:  # noqa: BLE001
        raise TraceError(path, f"cannot read Parquet: {exc}") from exc
    _check_header(path, pf.schema_arrow.names)
    if pf.metadata.num_rows > MAX_TRACE_JOBS:
        raise _too_many_jobs(path)
    n = 0
    try:
        for batch in pf.iter_batches(batch_size=65536):
            for rec in batch.to_pylist():
                n += 1
                yield n, rec
    except TraceError:
        raise
    except Exception as exc:  # noqa: BLE001 - a corrupt page, an unreadable type
        raise TraceError(path, f"cannot read Parquet: {exc}", n + 1) from exc


@contextmanager
def open_csv(path: Path) -> Iterator[Any]:
    """A :func:`csv.reader` over text file ``path`` (UTF-8, a BOM skipped), closed on leaving the block.

    Reading errors in the block become one-line :class:`TraceError` s: a file that cannot be opened
    (``cannot open``), bytes that are not UTF-8 (:func:`not_utf8_error`), a malformed CSV (``not CSV``,
    with the reader's line).
    """
    try:
        f = path.open(newline="", encoding="utf-8-sig")
    except OSError as exc:
        raise TraceError(path, f"cannot open: {exc.strerror}") from exc
    reader = csv.reader(f)
    try:
        with f:
            yield reader
    except UnicodeDecodeError:
        raise not_utf8_error(path) from None
    except csv.Error as exc:
        raise TraceError(path, f"not CSV: {exc}", reader.line_num) from None


def _read_csv_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """The data rows of a canonical CSV as ``(line, {column: text})``, one at a time, blank lines skipped.

    ``line`` is the row's first line in the file as a person counts them (the
    header is on line 1 unless blank lines precede it). A row with more or
    fewer fields than the header is an error, as is a row beyond :data:`MAX_TRACE_JOBS`.
    """
    with open_csv(path) as reader:
        cols: list[str] = []
        for cols in reader:  # the header: the first row that is not blank
            if cols:
                break
        _check_header(path, cols, reader.line_num)
        width, last, count = len(cols), reader.line_num, 0
        for rec in reader:
            first, last = last + 1, reader.line_num
            if not rec:
                continue
            if len(rec) != width:
                raise TraceError(path, f"expected {width} fields as in the header, got {len(rec)}", first)
            count += 1
            if count > MAX_TRACE_JOBS:
                raise _too_many_jobs(path, first)
            yield first, dict(zip(cols, rec))


def _check_header(path: Path, cols: Sequence[str], row: int = 1) -> None:
    """Raise for missing or repeated columns, naming the header row and the first such field."""
    if not cols:
        raise TraceError(path, "empty file: no header and no jobs")
    if len(set(cols)) != len(cols):
        dup = next(c for i, c in enumerate(cols) if c in cols[:i])
        raise TraceError(path, "column appears twice in the header", row, dup)
    needed = ["job_id", "submit_time", "model", "gpu_demand"]
    missing = [c for c in needed if c not in cols]
    if "total_samples" not in cols and "duration" not in cols:
        missing.append("total_samples")
    if missing:
        more = f" (also missing: {', '.join(missing[1:])})" if len(missing) > 1 else ""
        hint = " (or 'duration')" if missing[0] == "total_samples" else ""
        raise TraceError(
            path, f"missing column{hint}{more}; header has: {', '.join(cols)}", row, missing[0]
        )


class _JsonObject(dict):
    """A JSON object that remembers the keys it repeats (``json.loads`` keeps only the last value)."""

    __slots__ = ("repeated",)

    def __init__(self, pairs: list[tuple[str, Any]]):
        super().__init__(pairs)
        self.repeated: list[str] = []
        if len(self) != len(pairs):
            seen: set[str] = set()
            for k, _ in pairs:
                if k in seen:
                    self.repeated.append(k)
                seen.add(k)


#: The keys of one job in DeepShare JSON that map to :class:`JobSpec` fields (any other key is kept in ``extra``),
#: and how messages name the canonical fields there.
DEEPSHARE_KEYS = ("model", "gpu_demand", "total_samples_to_train", "submit_time")
_DEEPSHARE_NAMES = {"total_samples": "total_samples_to_train"}
#: Keys a DeepShare JSON job may not hold: canonical column names that would clash with its fields in a CSV.
_DEEPSHARE_REFUSED = {
    "job_id": "the job id is the key of the job's object",
    "total_samples": "DeepShare JSON names the work 'total_samples_to_train'",
}


class _JsonIntTooLong(ValueError):
    """A JSON integer with more than :data:`MAX_JSON_DIGITS` digits."""


def _json_int(text: str) -> int:
    """``json.loads``'s ``parse_int``: ``int(text)``, refusing more than :data:`MAX_JSON_DIGITS` digits
    with a message of its own (``int()`` raises a ValueError that ``json`` does not place)."""
    digits = len(text.lstrip("-"))
    if digits > MAX_JSON_DIGITS:
        raise _JsonIntTooLong(f"an integer of {digits} digits (at most {MAX_JSON_DIGITS}) starting {text[:12]}...")
    return int(text)


def _unencodable(doc: Any, where: str = "") -> str | None:
    """Where ``doc`` (parsed JSON) holds a string that is not valid Unicode text (a lone surrogate, which
    JSON's ``\\ud800`` escape can write and no UTF-8 file, Parquet column or terminal can hold), or None."""
    stack: list[tuple[Any, str]] = [(doc, where)]
    while stack:
        obj, at = stack.pop()
        if isinstance(obj, str):
            try:
                obj.encode("utf-8")
            except UnicodeEncodeError as exc:
                return f"{at or 'a value'} holds a lone surrogate {obj[exc.start]!r}, not Unicode text"
        elif isinstance(obj, dict):
            for k, v in obj.items():
                try:
                    k.encode("utf-8")
                except UnicodeEncodeError as exc:
                    return f"the key {k!r} holds a lone surrogate {k[exc.start]!r}, not Unicode text"
                stack.append((v, f"the value of key {k!r}"))
        elif isinstance(obj, list):
            stack.extend((v, at) for v in obj)
    return None


def read_deepshare_json(
    path: str | Path, cluster: ClusterSpec | None = None, perf: ContentionModel | None = None, **_: Any
) -> list[JobSpec]:
    """Read DeepShare's job-set JSON: ``{"id": {model, gpu_demand, total_samples_to_train}}``.

    All jobs are submitted at time 0, as in DeepShare, unless a job has a
    ``submit_time`` (s). Any other key of a job (``user``, ``duration``, ...) is kept in
    ``JobSpec.extra``, as a CSV keeps other columns (DeepShare's own code ignores such keys).
    A job id or a field given twice is an error (plain ``json.loads`` would keep the last one);
    so are ``job_id`` and ``total_samples`` keys (CSV column names that would clash on conversion).
    Errors name the key as the file writes it (``total_samples_to_train``).
    """
    path = Path(path)
    if cluster is not None and perf is None:
        perf = ContentionModel(cluster)
    check_trace_size(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise TraceError(path, f"cannot open: {exc.strerror}") from exc
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise not_utf8_error(path, raw) from None
    del raw
    if not text.strip():
        raise TraceError(path, "empty file: no JSON job set and no jobs")
    try:
        doc = json.loads(text, object_pairs_hook=_JsonObject, parse_int=_json_int)
    except json.JSONDecodeError as exc:
        raise TraceError(path, f"not a readable JSON job set: {exc}") from exc
    except _JsonIntTooLong as exc:
        raise TraceError(path, f"not a readable JSON job set: {exc}") from None
    except RecursionError:
        raise TraceError(path, "not a readable JSON job set: nested too deeply") from None
    del text
    bad = _unencodable(doc)
    if bad is not None:
        raise TraceError(path, f"not a usable JSON job set: {bad}")
    if not isinstance(doc, dict):
        raise TraceError(path, "expected a JSON object mapping job ids to jobs")
    if doc.repeated:
        raise TraceError(path, f"duplicate job id {doc.repeated[0]!r}", doc.repeated[0], "job_id")
    jobs = []
    for jid, props in doc.items():
        if not isinstance(props, dict):
            raise TraceError(path, "expected an object", jid)
        if props.repeated:
            raise TraceError(path, "field appears twice in this job", jid, props.repeated[0])
        for k in ("model", "gpu_demand", "total_samples_to_train"):
            if k not in props:
                raise TraceError(path, "missing field", jid, k)
        for k, why in _DEEPSHARE_REFUSED.items():
            if k in props:
                raise TraceError(path, f"not a field of a DeepShare JSON job: {why}", jid, k)
        rec = {
            "job_id": jid,
            "submit_time": props.get("submit_time", 0),
            "model": props["model"],
            "gpu_demand": props["gpu_demand"],
            "total_samples": props["total_samples_to_train"],
            **{k: props[k] for k in DEMAND_COLUMNS if k in props},
        }
        job = _job_from_row(path, jid, rec, cluster, perf, names=_DEEPSHARE_NAMES)
        job.extra.update((k, v) for k, v in props.items() if k not in DEEPSHARE_KEYS and k not in DEMAND_COLUMNS)
        jobs.append(job)
    validate_jobs(path, jobs, list(doc))
    return jobs


def trace_format(path: str | Path) -> str:
    """Which reader :func:`load_trace` uses for ``path``: a key of :data:`TRACE_FORMATS`.

    By extension and, for ``.csv`` and no extension, the first line.
    :raises TraceError: the file does not exist, is a directory or cannot be opened.
    """
    path = Path(path)
    if not path.exists():
        raise TraceError(path, "no such file")
    if path.is_dir():
        raise TraceError(path, "is a directory, expected a trace file")
    suffix = path.suffix.lower()
    head = b""
    if suffix in ("", ".csv"):
        # Sniff the first line as bytes: decoding (and its errors) is the reader's job.
        try:
            with path.open("rb") as f:
                head = f.readline().removeprefix(codecs.BOM_UTF8)
        except OSError as exc:
            raise TraceError(path, f"cannot open: {exc.strerror}") from exc
    if suffix == ".json" or (suffix == "" and head[:1] == b"{"):
        return "deepshare"
    if suffix == ".csv" and head.startswith(b"timestamp,") and b"num_gpus" in head:
        return "philly"
    return "canonical"


def load_trace(
    path: str | Path, cluster: ClusterSpec | None = None, perf: ContentionModel | None = None, **philly_options: Any
) -> list[JobSpec]:
    """Load any supported trace, choosing the reader with :func:`trace_format`.

    ``philly_options`` (seed, mix, gpu_scale, ...) go to
    :func:`trainer.philly.read_philly`; they are an error for any other trace
    (rather than silently ignored: ``limit=100`` would not limit it).
    """
    path = Path(path)
    fmt = trace_format(path)
    if fmt == "philly":
        from trainer.philly import read_philly

        return read_philly(path, cluster, perf=perf, **philly_options)
    if philly_options:
        raise TraceError(
            path, f"is a {TRACE_FORMATS[fmt]} trace; options {', '.join(philly_options)} apply only to a Philly CSV"
        )
    if fmt == "deepshare":
        return read_deepshare_json(path, cluster, perf)
    return read_canonical(path, cluster, perf)


def current_umask() -> int:
    """The process's umask (read by setting it and putting it back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


#: What :func:`write_trace` checks (every reader checks it too): field, rule for a finite number, wording.
_WRITE_RULES: tuple[tuple[str, Callable[[float], bool], str], ...] = (
    ("submit_time", lambda v: v >= 0, "a finite number >= 0"),
    ("submit_time", lambda v: v <= MAX_SUBMIT_TIME_S, f"a submit time of at most {MAX_SUBMIT_TIME_TEXT}"),
    ("gpu_demand", lambda v: v >= 1 and v == int(v), "an integer >= 1"),
    ("total_samples", lambda v: v > 0, "a finite number > 0"),
)


def _unwritable_number(jobs: Sequence[JobSpec], json_out: bool = False) -> str | None:
    """Why ``jobs`` cannot be written as a trace the readers accept again (e.g. an overflow to ``inf``, or
    an ``extra`` field named like a field of the format, which would overwrite it), or None."""
    taken = set(CANONICAL_COLUMNS) | set(DEMAND_COLUMNS) | (set(DEEPSHARE_KEYS) | set(_DEEPSHARE_REFUSED) if json_out else set())
    for j in jobs:
        clash = next((k for k in j.extra if k in taken), None)
        if clash is not None:
            fmt = "DeepShare JSON" if json_out else "the trace"
            return f"job {j.job_id!r} has an extra field {clash!r}, which is a field of {fmt} itself"
        for name, rule, need in _WRITE_RULES:
            v = getattr(j, name)
            finite = isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)
            if not (finite and rule(v)):
                return f"job {j.job_id!r} has {name} {_show(v)}; a trace needs {need}"
    return None


def write_trace(path: str | Path, jobs: Sequence[JobSpec]) -> None:
    """Write a trace atomically: canonical CSV or Parquet by suffix, or DeepShare JSON for
    ``.json``. Every format keeps ``extra``: as more columns, or more keys of each JSON job.

    The jobs are checked first (:class:`TraceError` for a number no reader
    accepts, e.g. ``inf``; nothing is written). The file is written to a
    unique temporary file beside ``path`` (so concurrent writers never share
    one), then renamed over ``path``; on any error the temporary file is removed.
    """
    path = Path(path)
    why = _unwritable_number(jobs, json_out=path.suffix.lower() == ".json") or _unwritable_demand(jobs)
    if why is not None:
        raise TraceError(path, f"not written: {why}")
    suffix = path.suffix.lower()
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(tmp_name)
    try:
        os.fchmod(fd, 0o666 & ~current_umask())  # mkstemp makes it 0600; give it a normal file's mode
        with os.fdopen(fd, "wb") as f:
            if suffix == ".json":
                _write_json(f, jobs)
            elif suffix in PARQUET_SUFFIXES:
                _write_parquet(f, jobs)
            else:
                _write_csv(f, jobs)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _rows(jobs: Sequence[JobSpec]) -> tuple[list[dict[str, Any]], list[str]]:
    """The canonical rows of ``jobs`` and the columns they add: :data:`DEMAND_COLUMNS` if some job has a
    demand, then the (sorted) ``extra`` columns."""
    has_demand = any(j.demand is not None for j in jobs)
    extra_cols = (list(DEMAND_COLUMNS) if has_demand else []) + sorted({k for j in jobs for k in j.extra})
    rows = [
        {
            "job_id": j.job_id,
            "submit_time": j.submit_time,
            "model": j.model,
            "gpu_demand": j.gpu_demand,
            "total_samples": j.total_samples,
            **{k: j.extra.get(k) for k in extra_cols},
            **(_demand_fields(j) if has_demand else {}),
        }
        for j in jobs
    ]
    return rows, extra_cols


def _write_json(f: IO[bytes], jobs: Sequence[JobSpec]) -> None:
    """DeepShare's job-set format, plus submit_time and the job's ``extra`` fields as further keys (DeepShare's
    code ignores them; :func:`read_deepshare_json` reads them back into ``extra``)."""
    doc = {
        j.job_id: {
            "model": j.model,
            "gpu_demand": j.gpu_demand,
            "total_samples_to_train": j.total_samples,
            "submit_time": j.submit_time,
            **j.extra,
            **_demand_fields(j, declared_only=True),
        }
        for j in jobs
    }
    # An extra value JSON has no type for (a Parquet timestamp, a Decimal) is written as text, as a CSV writes it.
    f.write(json.dumps(doc, default=str).encode("utf-8"))


def _write_parquet(f: IO[bytes], jobs: Sequence[JobSpec]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows, _ = _rows(jobs)
    pq.write_table(pa.Table.from_pylist(rows), f)


def _write_csv(f: IO[bytes], jobs: Sequence[JobSpec]) -> None:
    rows, extra_cols = _rows(jobs)
    text = io.TextIOWrapper(f, encoding="utf-8", newline="")
    w = csv.DictWriter(text, fieldnames=list(CANONICAL_COLUMNS) + extra_cols)
    w.writeheader()
    w.writerows(rows)
    text.flush()
    text.detach()  # ``f`` is closed by the caller


# ---------------------------------------------------------------------- resource demand columns
#: Optional columns (CSV / Parquet) or keys (DeepShare JSON) of a job's resource demand
#: (:class:`policies.resources.ResourceDemand`): the GPU type it needs (a name as in cluster specs, e.g.
#: ``v100``; matched like :func:`policies.gputypes.normalize_gpu_type`), CPU cores per GPU (an integer
#: >= 0) and memory per GPU (GB, a number >= 0). Blank (or absent, or null) means not declared; a job
#: declaring none of them has ``JobSpec.demand = None`` (any GPU type, no CPUs or memory).
DEMAND_COLUMNS = ("gpu_type", "cpus_per_gpu", "mem_gb_per_gpu")


def _demand_of_row(path: Path, row: int | str, rec: dict[str, Any], gpus: int, cluster: ClusterSpec | None,
                   text: bool) -> "ResourceDemand | None":
    """The :class:`~policies.resources.ResourceDemand` of one row's :data:`DEMAND_COLUMNS`, or None when it
    declares none; :class:`TraceError` naming the row and column of a bad value."""
    from policies.cluster import GPU_TYPE_RE
    from policies.resources import ResourceDemand

    raw_t, raw_c, raw_m = (rec.get(c) for c in DEMAND_COLUMNS)
    if _blank(raw_t) and _blank(raw_c) and _blank(raw_m):
        return None
    gpu_type = None
    if not _blank(raw_t):
        if not isinstance(raw_t, str) or not GPU_TYPE_RE.fullmatch(raw_t.strip()):
            raise TraceError(path, f"expected a GPU type name (letters, digits, '_', '.', '-'), got {_show(raw_t)}",
                             row, "gpu_type")
        gpu_type = raw_t.strip()
        if cluster is not None:
            from policies.gputypes import REFERENCE_TYPE, normalize_gpu_type

            want = normalize_gpu_type(gpu_type)
            have = {normalize_gpu_type(n.gpu_type) if n.gpu_type else REFERENCE_TYPE for n in cluster.nodes}
            if want not in have:
                raise TraceError(path, f"no node of the cluster has GPUs of type {gpu_type} "
                                 f"(its types: {', '.join(sorted(have))})", row, "gpu_type")
    cpus = 0 if _blank(raw_c) else int(_num(path, row, "cpus_per_gpu", raw_c, integer=True, text=text))
    mem = 0.0 if _blank(raw_m) else _num(path, row, "mem_gb_per_gpu", raw_m, text=text)
    return ResourceDemand(gpus, gpu_type=gpu_type, cpus_per_gpu=cpus, mem_gb_per_gpu=mem)


def _demand_fields(j: JobSpec, declared_only: bool = False) -> dict[str, Any]:
    """``j.demand`` as :data:`DEMAND_COLUMNS` values, None where not declared (a CSV / Parquet row); with
    ``declared_only`` (a JSON job) only the declared ones."""
    d = j.demand
    out = {c: None for c in DEMAND_COLUMNS}
    if d is not None:
        out = {"gpu_type": d.gpu_type, "cpus_per_gpu": d.cpus_per_gpu or None, "mem_gb_per_gpu": d.mem_gb_per_gpu or None}
    return {k: v for k, v in out.items() if v is not None} if declared_only else out


def _unwritable_demand(jobs: Sequence[JobSpec]) -> str | None:
    """Why a job's demand cannot be written in :data:`DEMAND_COLUMNS` (parameter servers or an elastic range), or None."""
    for j in jobs:
        d = j.demand
        if d is not None and (d.ps or d.min_gpus is not None):
            return (f"job {j.job_id!r} declares parameter servers or an elastic range; a trace's demand columns "
                    f"hold only {', '.join(DEMAND_COLUMNS)}")
    return None
