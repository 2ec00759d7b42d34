"""Checkpoint store: durable, checksummed, crash-safe job checkpoints.

One interface, :class:`CheckpointStore`, two backends:

* :class:`LocalFSStore` -- a directory on a (shared) filesystem, URL
  ``/path``, ``file:///path``.
* :class:`WebHDFSStore` -- HDFS through WebHDFS with the ``hdfs`` PyPI
  package (``pip install rlsched[hdfs]``), URL ``hdfs://namenode:9870/path``
  (the port is the NameNode *HTTP* port) or ``webhdfs://...``.

Layout (both backends), per job key::

    <root>/<job_key>/ckpt-<step:012d>.bin    checkpoint bytes
    <root>/<job_key>/ckpt-<step:012d>.json   manifest: {job_key, step, sha256, size, created}

Commit protocol: the data is written to a temporary name, made durable
(fsync / HDFS close), and renamed into place; only then is the manifest
written the same way. A checkpoint exists only once its manifest exists, and
it is valid only if the data's SHA-256 matches the manifest. So a crash at
any point leaves either the previous state or a complete checkpoint: never a
checkpoint that loads as valid with wrong bytes. Readers skip (and report)
corrupt checkpoints and fall back to older valid ones.

A store that cannot be read (NameNode down, network, permissions, I/O errors)
is not an empty store: reads then raise :class:`StoreUnavailable` instead of
reporting "no checkpoint" or "corrupt", so a job never restarts from step 0,
falls back to an older checkpoint, or has a good checkpoint pruned because
the store was briefly out of reach.

A write or delete that fails (disk full, permission denied, quota, I/O error)
raises :class:`StoreWriteError`, one line naming the store, the job key, the
path and the reason (``No space left on device (ENOSPC)``); it is an
:class:`OSError` too, with the original ``errno``.

A data file without its manifest (a writer killed between the two renames) is
an *orphan*: never a checkpoint, and removed by :meth:`CheckpointStore.prune`
and :meth:`LocalFSStore.clean_temp` once it is older than their age limit (a
younger one may be a save in progress, whose manifest comes next).
"""

from __future__ import annotations

import copy
import errno
import fcntl
import hashlib
import json
import logging
import math
import os
import re
import stat
import sys
import time
import uuid
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import BinaryIO, Iterator, Union
from urllib.parse import urlparse

log = logging.getLogger(__name__)

Data = Union[bytes, bytearray, memoryview, BinaryIO, str, os.PathLike]

# fullmatch: "$" would also match before a trailing newline ("abc\n")
_KEY_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
_NAME_RE = re.compile(r"ckpt-([0-9]{12})\.json")
_DATA_RE = re.compile(r"ckpt-([0-9]{12})\.bin")
#: Default age (s) past which :meth:`CheckpointStore.prune` removes a data file without a manifest.
ORPHAN_AGE_S = 600.0
_TMP_RE = re.compile(r"\.ckpt-[0-9]{12}\.(?:bin|json)\.tmp-[0-9a-f]{32}")  # _write_atomic's temp names
_SHA_RE = re.compile(r"[0-9a-f]{64}")
_CHUNK = 1 << 20
#: A manifest is a few hundred bytes; anything bigger is not one of ours (and is not read).
MAX_MANIFEST_BYTES = 64 << 10
#: Largest checkpoint size a manifest may claim (1 PiB): beyond it the manifest is malformed.
MAX_CHECKPOINT_BYTES = 1 << 50


class StoreError(Exception):
    """The store is unusable (bad URL, missing backend package, I/O failure)."""


class CheckpointNotFound(StoreError, KeyError):
    """No (valid) checkpoint for the requested job key / step."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "checkpoint not found"


class CheckpointCorrupt(StoreError):
    """A checkpoint's data does not match its manifest checksum/size."""


class StoreUnavailable(StoreError):
    """The store could not be read (network, permissions, I/O): nothing is known about its checkpoints."""


class StoreWriteError(StoreError, OSError):
    """Writing or deleting in the store failed (disk full, permission denied, I/O error).

    ``str()`` is one line naming the store, the job key, the path and the reason; ``errno``,
    ``strerror`` and ``filename`` are the failed call's. ``OSError`` too, so callers that catch
    ``OSError`` for I/O failures still do.
    """

    def __init__(self, message: str, exc: OSError | None = None, path: str = "") -> None:
        StoreError.__init__(self, message)
        self.errno = exc.errno if exc is not None else None
        self.strerror = exc.strerror if exc is not None else None
        self.filename = path or None

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "checkpoint store write failed"


def _reason(exc: BaseException) -> str:
    """One line: ``strerror (ENAME)`` of an OSError, else its text."""
    if isinstance(exc, OSError) and exc.strerror:
        name = errno.errorcode.get(exc.errno or 0)
        return f"{exc.strerror} ({name})" if name else exc.strerror
    return " ".join(str(exc).split()) or type(exc).__name__


class StoreNotOwner(StoreError):
    """A job's store directory (or a file in it) belongs to another user: it is neither read nor written.

    In a shared store anyone may create ``<root>/<job_key>/``; a directory created by another user
    before the job ran could hand the job planted checkpoints, or let that user replace its files."""


def validate_job_key(job_key: str) -> str:
    """Return ``job_key`` if it is a safe path component, else raise ValueError."""
    if not isinstance(job_key, str) or not _KEY_RE.fullmatch(job_key):
        raise ValueError(
            f"invalid job key {job_key!r}: need 1-128 chars of [A-Za-z0-9._-], not starting with '.' or '-'"
        )
    return job_key


def _validate_step(step: int) -> int:
    if not isinstance(step, int) or isinstance(step, bool) or step < 0 or step >= 10**12:
        raise ValueError(f"invalid checkpoint step {step!r}: need an int in [0, 1e12)")
    return step


@dataclass(frozen=True)
class CheckpointInfo:
    """A committed checkpoint: ``size`` in bytes, ``created`` in Unix seconds."""

    job_key: str
    step: int
    sha256: str
    size: int
    created: float
    uri: str

    def to_dict(self) -> dict:
        return asdict(self)


def _data_name(step: int) -> str:
    return f"ckpt-{step:012d}.bin"


def _manifest_name(step: int) -> str:
    return f"ckpt-{step:012d}.json"


def _parse_manifest(raw: bytes, job_key: str, step: int, uri: str) -> CheckpointInfo:
    """A manifest's CheckpointInfo; ValueError/KeyError/TypeError if it is malformed.

    Strict about types and ranges: a size that is not a plain integer in [0, MAX_CHECKPOINT_BYTES],
    a non-finite ``created`` or a sha256 that is not 64 hex digits makes it unparseable.
    """
    meta = json.loads(raw)
    if not isinstance(meta, dict):
        raise ValueError("manifest is not a JSON object")
    sha, size, created = meta["sha256"], meta["size"], meta["created"]
    if not isinstance(sha, str) or not _SHA_RE.fullmatch(sha):
        raise ValueError(f"bad sha256 {sha!r}")
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= MAX_CHECKPOINT_BYTES:
        raise ValueError(f"bad size {size!r}")
    if not isinstance(created, (int, float)) or isinstance(created, bool) or not math.isfinite(created):
        raise ValueError(f"bad created {created!r}")
    if meta.get("step") != step or meta.get("job_key") != job_key:
        raise ValueError("manifest names another job/step")
    return CheckpointInfo(job_key=job_key, step=step, sha256=sha, size=size, created=float(created), uri=uri)


def _as_bytes(data: Data) -> bytes:
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    if isinstance(data, (str, os.PathLike)):
        return Path(data).read_bytes()
    if hasattr(data, "read"):
        return data.read()
    raise TypeError(f"checkpoint data must be bytes, a binary file or a path, not {type(data).__name__}")


class CheckpointStore(ABC):
    """Abstract checkpoint store. Implementations provide the five primitives below."""

    url: str

    def for_owner(self, uid: int | None) -> CheckpointStore:
        """This store, reading and writing only job directories and files that belong to ``uid``
        (``None``: any owner). The base store has no owners to check and returns itself."""
        return self

    # -- primitives -------------------------------------------------------
    @abstractmethod
    def _write_atomic(self, relpath: str, data: bytes) -> None:
        """Durably write ``data`` to ``relpath`` via temp file + rename."""

    @abstractmethod
    def _read(self, relpath: str, max_size: int | None = None) -> bytes:
        """The bytes of ``relpath``; :class:`FileNotFoundError` if it does not exist,
        :class:`StoreUnavailable` if it cannot be read, :class:`CheckpointCorrupt` if it is not a
        regular file or holds more than ``max_size`` bytes (then it is not read)."""

    def _sha256(self, relpath: str, size: int) -> str:
        """Hex SHA-256 of ``relpath``, which the manifest says holds ``size`` bytes.

        :class:`CheckpointCorrupt` if it is not a regular file or its size differs (checked before
        reading where the backend can); backends override this to hash in chunks.
        """
        blob = self._read(relpath, max_size=size)
        if len(blob) != size:
            raise CheckpointCorrupt(f"{self._uri(relpath)}: size {len(blob)}, manifest says {size}")
        return hashlib.sha256(blob).hexdigest()

    @abstractmethod
    def _listdir(self, relpath: str) -> list[str]:
        """Names in a directory ([] if it does not exist; :class:`StoreUnavailable` if it cannot be listed)."""

    @abstractmethod
    def _delete(self, relpath: str) -> None: ...

    @abstractmethod
    def _uri(self, relpath: str) -> str: ...

    def _mtime(self, relpath: str) -> float | None:
        """Modification time (Unix s) of ``relpath``; None if it does not exist or is not a regular file."""
        return None

    def _where(self, relpath: str) -> str:
        """``relpath`` as error messages name it (the backend's path or URI)."""
        return self._uri(relpath)

    def _write_error(self, job_key: str, what: str, relpath: str, exc: OSError) -> StoreWriteError:
        """The one-line error of a failed write/delete of ``relpath`` of job ``job_key``."""
        where = self._where(relpath)
        return StoreWriteError(f"checkpoint store {self.url}: job {job_key}: cannot {what} {where}: {_reason(exc)}",
                               exc, where)

    # -- public API -------------------------------------------------------
    def save(self, job_key: str, step: int, data: Data) -> CheckpointInfo:
        """Commit a checkpoint for ``job_key`` at ``step`` (overwrites the same step)."""
        validate_job_key(job_key)
        _validate_step(step)
        blob = _as_bytes(data)
        digest = hashlib.sha256(blob).hexdigest()
        self._write_or_fail(job_key, f"write checkpoint step {step} to", f"{job_key}/{_data_name(step)}", blob)
        info = CheckpointInfo(
            job_key=job_key,
            step=step,
            sha256=digest,
            size=len(blob),
            created=time.time(),
            uri=self._uri(f"{job_key}/{_data_name(step)}"),
        )
        manifest = json.dumps({k: v for k, v in info.to_dict().items() if k != "uri"}, sort_keys=True).encode()
        self._write_or_fail(job_key, f"write the manifest of checkpoint step {step} to",
                            f"{job_key}/{_manifest_name(step)}", manifest)
        log.info("checkpoint saved job_key=%s step=%d size=%d sha256=%s", job_key, step, len(blob), digest[:12])
        return info

    def _write_or_fail(self, job_key: str, what: str, relpath: str, data: bytes) -> None:
        """:meth:`_write_atomic`, any OSError raised as :class:`StoreWriteError` naming store, job and path."""
        try:
            self._write_atomic(relpath, data)
        except StoreWriteError:
            raise
        except OSError as exc:
            raise self._write_error(job_key, what, relpath, exc) from exc

    def _delete_or_fail(self, job_key: str, relpath: str) -> None:
        """:meth:`_delete`, any OSError raised as :class:`StoreWriteError` naming store, job and path."""
        try:
            self._delete(relpath)
        except StoreWriteError:
            raise
        except OSError as exc:
            raise self._write_error(job_key, "delete", relpath, exc) from exc

    def list(self, job_key: str) -> list[CheckpointInfo]:
        """Committed checkpoints of ``job_key`` (manifest present and parseable), ascending step.

        Data is not verified here; use :meth:`verify` / :meth:`latest`. Raises
        :class:`StoreUnavailable` if the store cannot be read (never an empty or partial list).
        """
        validate_job_key(job_key)
        out: list[CheckpointInfo] = []
        for name in self._listdir(job_key):
            m = _NAME_RE.fullmatch(name)
            if not m:
                continue
            step = int(m.group(1))
            try:
                raw = self._read(f"{job_key}/{name}", max_size=MAX_MANIFEST_BYTES)
            except FileNotFoundError:  # pruned since the listing
                continue
            except CheckpointCorrupt as exc:  # a FIFO, a symlink, a huge file: not a manifest
                log.warning("ignoring unreadable manifest %s/%s: %s", job_key, name, exc)
                continue
            try:
                info = _parse_manifest(raw, job_key, step, self._uri(f"{job_key}/{_data_name(step)}"))
            except (ValueError, KeyError, TypeError, OverflowError, RecursionError) as exc:
                log.warning("ignoring unreadable manifest %s/%s: %s", job_key, name, exc)
                continue
            out.append(info)
        return sorted(out, key=lambda i: i.step)

    def jobs(self) -> list[str]:
        """Job keys that have a directory in the store."""
        return sorted(n for n in self._listdir("") if _KEY_RE.fullmatch(n))

    def _load_info(self, info: CheckpointInfo) -> bytes:
        try:
            blob = self._read(f"{info.job_key}/{_data_name(info.step)}", max_size=info.size)
        except FileNotFoundError:  # the manifest is only written after its data: deleted or damaged since
            raise CheckpointCorrupt(f"{info.uri}: data file missing") from None
        if len(blob) != info.size or hashlib.sha256(blob).hexdigest() != info.sha256:
            raise CheckpointCorrupt(f"{info.uri}: checksum/size mismatch (manifest size {info.size}, got {len(blob)})")
        return blob

    def verify(self, info: CheckpointInfo) -> bool:
        """True if the checkpoint's data matches its manifest (:class:`StoreUnavailable` if it cannot be read).

        Hashes the data in chunks without holding it in memory; a data file that is not a regular file
        (a FIFO, a symlink, a device) or whose size differs from the manifest's is corrupt and not read.
        """
        try:
            try:
                digest = self._sha256(f"{info.job_key}/{_data_name(info.step)}", info.size)
            except FileNotFoundError:
                raise CheckpointCorrupt(f"{info.uri}: data file missing") from None
            if digest != info.sha256:
                raise CheckpointCorrupt(f"{info.uri}: checksum mismatch")
            return True
        except CheckpointCorrupt as exc:
            log.warning("corrupt checkpoint: %s", exc)
            return False

    def latest(self, job_key: str, verify: bool = True) -> CheckpointInfo | None:
        """Newest committed checkpoint (whose data verifies, if ``verify``), or None."""
        for info in reversed(self.list(job_key)):
            if not verify or self.verify(info):
                return info
        return None

    def load(self, job_key: str, step: int | None = None) -> tuple[CheckpointInfo, bytes]:
        """Bytes of checkpoint ``step`` (default: newest valid one), verified.

        Raises CheckpointNotFound if there is none, CheckpointCorrupt if the
        requested step exists but fails verification, StoreUnavailable if the
        store cannot be read.
        """
        infos = self.list(job_key)
        if step is not None:
            for info in infos:
                if info.step == step:
                    return info, self._load_info(info)
            raise CheckpointNotFound(f"no checkpoint for job {job_key!r} at step {step} in {self.url}")
        for info in reversed(infos):
            try:
                return info, self._load_info(info)
            except CheckpointCorrupt as exc:
                log.warning("skipping corrupt checkpoint: %s", exc)
        raise CheckpointNotFound(f"no valid checkpoint for job {job_key!r} in {self.url}")

    def prune(self, job_key: str, keep: int = 2, orphan_age_s: float = ORPHAN_AGE_S) -> list[int]:
        """Keep the newest ``keep`` valid checkpoints, delete everything older (and corrupt ones
        newer than those), and data files without a manifest (:meth:`orphans`) older than
        ``orphan_age_s`` seconds. Verifies newest-first and stops once ``keep`` valid ones are found,
        so it reads about ``keep`` checkpoints, not all. Returns the deleted steps (orphans included).
        Deletes nothing it could not read: :class:`StoreUnavailable` stops it; a delete that fails
        raises :class:`StoreWriteError`.
        """
        if keep < 1:
            raise ValueError("keep must be >= 1")
        kept = 0
        deleted = []
        for info in reversed(self.list(job_key)):
            if kept < keep and self.verify(info):
                kept += 1
                continue
            # manifest first: the checkpoint disappears atomically from readers' view
            self._delete_or_fail(job_key, f"{job_key}/{_manifest_name(info.step)}")
            self._delete_or_fail(job_key, f"{job_key}/{_data_name(info.step)}")
            deleted.append(info.step)
        for step in self.orphans(job_key, orphan_age_s):
            if self._mtime(f"{job_key}/{_manifest_name(step)}") is None:  # its manifest did not just appear
                self._delete_or_fail(job_key, f"{job_key}/{_data_name(step)}")
                log.info("removed orphan checkpoint data (no manifest) job_key=%s step=%d", job_key, step)
                deleted.append(step)
        return sorted(deleted)

    def orphans(self, job_key: str, older_than_s: float = 0.0) -> list[int]:
        """Steps of ``job_key``'s data files that have no manifest and were last modified more than
        ``older_than_s`` seconds ago (a younger one may be a save between its two renames)."""
        validate_job_key(job_key)
        names = self._listdir(job_key)
        manifests = {m.group(1) for m in map(_NAME_RE.fullmatch, names) if m}
        now = time.time()
        out = []
        for m in map(_DATA_RE.fullmatch, names):
            if m and m.group(1) not in manifests:
                t = self._mtime(f"{job_key}/{m.group(0)}")
                if t is not None and now - t > older_than_s:
                    out.append(int(m.group(1)))
        return sorted(out)


# ------------------------------------------------------------------ local FS


class LocalFSStore(CheckpointStore):
    """Checkpoints in a local or shared (NFS/Lustre/...) directory.

    :param owner_uid: only job directories (``<root>/<job_key>``) and files owned by this uid are read
        or written (:class:`StoreNotOwner` otherwise). Default: the caller's effective uid, except for
        root, which checks no owner unless asked (the agent asks per job, :meth:`for_owner`).
    """

    def __init__(self, root: str | os.PathLike[str], owner_uid: int | None | str = "auto") -> None:
        self.root = Path(root).resolve()
        self.url = str(self.root)
        if owner_uid == "auto":
            owner_uid = os.geteuid() or None
        self.owner_uid: int | None = owner_uid  # type: ignore[assignment]
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create checkpoint store directory {self.root}: {exc}") from None

    def for_owner(self, uid: int | None) -> LocalFSStore:
        view = copy.copy(self)
        view.owner_uid = uid
        return view

    def _check_owner(self, st: os.stat_result, relpath: str) -> None:
        """Raise :class:`StoreNotOwner` if ``st`` (of ``relpath``) is not the expected owner's."""
        if self.owner_uid is not None and st.st_uid != self.owner_uid:
            raise StoreNotOwner(
                f"{self._path(relpath)} belongs to uid {st.st_uid}, not to uid {self.owner_uid} (the job's owner): "
                "another user created it, so it is neither read nor written; remove it or use another job key"
            )

    def _path(self, relpath: str) -> Path:
        return self.root / relpath if relpath else self.root

    def _write_atomic(self, relpath: str, data: bytes) -> None:
        final = self._path(relpath)
        final.parent.mkdir(parents=True, exist_ok=True)
        if self.owner_uid is not None and final.parent != self.root:
            st = os.lstat(final.parent)
            if stat.S_ISLNK(st.st_mode):
                raise StoreError(f"{final.parent}: a symlink below the store root, not a job directory")
            self._check_owner(st, str(Path(relpath).parent))
        tmp = final.parent / f".{final.name}.tmp-{uuid.uuid4().hex}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                view = memoryview(data)
                for off in range(0, len(view), _CHUNK):
                    f.write(view[off : off + _CHUNK])
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        dfd = os.open(final.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    # Reads run in the (root) agent on paths below the store root that jobs control. So they follow
    # no symlink below the root (O_NOFOLLOW on every component), open without blocking (a FIFO),
    # accept only regular files and compare the size before reading anything.
    def _open_below_root(self, relpath: str, directory: bool = False) -> int:
        """fd of ``relpath`` opened component by component from the root without following symlinks."""
        parts = [x for x in relpath.split("/") if x]
        if any(x in (".", "..") for x in parts):
            raise ValueError(f"bad store path {relpath!r}")
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for i, part in enumerate(parts):
                last = i == len(parts) - 1
                flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
                if not last or directory:
                    flags |= os.O_DIRECTORY
                nfd = os.open(part, flags, dir_fd=fd)
                os.close(fd)
                fd = nfd
                if self.owner_uid is not None:  # the job directory and its files: the job owner's only
                    self._check_owner(os.fstat(fd), "/".join(parts[: i + 1]))
            return fd
        except BaseException:
            os.close(fd)
            raise

    def _open_regular(self, relpath: str, max_size: int | None) -> tuple[int, int]:
        """(fd, size) of a regular file at ``relpath``, blocking mode restored; see :meth:`_read`."""
        p = self._path(relpath)
        try:
            fd = self._open_below_root(relpath)
        except FileNotFoundError:
            raise
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                raise CheckpointCorrupt(f"{p}: a symlink or not a regular file below the store root") from None
            raise StoreUnavailable(f"cannot read {p}: {exc}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise CheckpointCorrupt(f"{p}: not a regular file (mode {stat.filemode(st.st_mode)})")
            if max_size is not None and st.st_size > max_size:
                raise CheckpointCorrupt(f"{p}: {st.st_size} bytes, more than the {max_size} expected")
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
            return fd, st.st_size
        except BaseException:
            os.close(fd)
            raise

    def _chunks(self, fd: int, relpath: str, limit: int) -> Iterator[bytes]:
        """The file's bytes in chunks; CheckpointCorrupt once it yields more than ``limit`` bytes."""
        total = 0
        while True:
            try:
                b = os.read(fd, _CHUNK)
            except OSError as exc:
                raise StoreUnavailable(f"cannot read {self._path(relpath)}: {exc}") from None
            if not b:
                return
            total += len(b)
            if total > limit:  # it grew since fstat
                raise CheckpointCorrupt(f"{self._path(relpath)}: more than the {limit} bytes expected")
            yield b

    def _read(self, relpath: str, max_size: int | None = None) -> bytes:
        fd, _ = self._open_regular(relpath, max_size)
        try:
            return b"".join(self._chunks(fd, relpath, max_size if max_size is not None else sys.maxsize))
        finally:
            os.close(fd)

    def _sha256(self, relpath: str, size: int) -> str:
        fd, actual = self._open_regular(relpath, size)
        try:
            if actual != size:
                raise CheckpointCorrupt(f"{self._path(relpath)}: size {actual}, manifest says {size}")
            h = hashlib.sha256()
            n = 0
            for b in self._chunks(fd, relpath, size):
                h.update(b)
                n += len(b)
            if n != size:
                raise CheckpointCorrupt(f"{self._path(relpath)}: read {n} bytes, manifest says {size}")
            return h.hexdigest()
        finally:
            os.close(fd)

    def _listdir(self, relpath: str) -> list[str]:
        p = self._path(relpath)
        try:
            fd = self._open_below_root(relpath, directory=True)
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # a symlinked job directory is not a store directory
                log.warning("ignoring %s: a symlink below the store root", p)
                return []
            raise StoreUnavailable(f"cannot list {p}: {exc}") from None
        try:
            return os.listdir(fd)
        except OSError as exc:
            raise StoreUnavailable(f"cannot list {p}: {exc}") from None
        finally:
            os.close(fd)

    def _delete(self, relpath: str) -> None:
        self._path(relpath).unlink(missing_ok=True)

    def _uri(self, relpath: str) -> str:
        return self._path(relpath).as_uri()

    def _where(self, relpath: str) -> str:
        return str(self._path(relpath))

    def _mtime(self, relpath: str) -> float | None:
        try:
            st = os.lstat(self._path(relpath))
        except OSError:
            return None
        return st.st_mtime if stat.S_ISREG(st.st_mode) else None

    def clean_temp(self, job_key: str, older_than_s: float = 3600.0) -> int:
        """Remove what crashed writers left in ``job_key``'s directory, older than ``older_than_s``
        seconds: temp files, and data files without a manifest (orphans); returns how many. Like the
        reads, it follows no symlink and touches nothing in a directory of another owner
        (:class:`StoreNotOwner`). A delete that fails raises :class:`StoreWriteError`."""
        validate_job_key(job_key)
        try:
            fd = self._open_below_root(job_key, directory=True)
        except (FileNotFoundError, NotADirectoryError):
            return 0
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return 0  # a symlinked job directory is not a store directory
            raise StoreUnavailable(f"cannot list {self._path(job_key)}: {exc}") from None
        n = 0
        now = time.time()
        try:
            try:
                names = os.listdir(fd)
            except OSError as exc:
                raise StoreUnavailable(f"checkpoint store {self.url}: job {job_key}: cannot list "
                                       f"{self._path(job_key)}: {_reason(exc)}") from None
            manifests = {m.group(1) for m in map(_NAME_RE.fullmatch, names) if m}
            for name in names:
                data = _DATA_RE.fullmatch(name)
                if not _TMP_RE.fullmatch(name) and not (data and data.group(1) not in manifests):
                    continue
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    if not stat.S_ISREG(st.st_mode) or now - st.st_mtime <= older_than_s:
                        continue
                    if data:  # an orphan, unless its manifest appeared since the listing
                        try:
                            os.stat(_manifest_name(int(data.group(1))), dir_fd=fd, follow_symlinks=False)
                            continue
                        except FileNotFoundError:
                            pass
                    os.unlink(name, dir_fd=fd)
                    n += 1
                except FileNotFoundError:  # another cleaner was first
                    continue
                except OSError as exc:
                    raise self._write_error(job_key, "delete", f"{job_key}/{name}", exc) from exc
        finally:
            os.close(fd)
        return n


# ------------------------------------------------------------------- WebHDFS


class WebHDFSStore(CheckpointStore):
    """Checkpoints in HDFS over WebHDFS (``hdfs`` package, imported lazily).

    ``url``: ``hdfs://namenode:9870/base/path`` or ``webhdfs://...``; the
    HDFS user is ``$HADOOP_USER_NAME`` (default: the current user). HDFS
    rename is atomic and a file's contents are durable once its ``create``
    completes (the client closes the output stream), so the same
    temp + rename + manifest protocol gives crash safety.
    """

    def __init__(self, url: str, user: str | None = None, timeout_s: float = 30.0) -> None:
        try:
            from hdfs import InsecureClient  # type: ignore[import-not-found]
        except ImportError:
            raise StoreError(
                f"checkpoint store {url!r} needs the 'hdfs' package: pip install 'rlsched[hdfs]'"
            ) from None
        u = urlparse(url)
        if u.scheme not in ("hdfs", "webhdfs") or not u.hostname:
            raise StoreError(f"bad WebHDFS URL {url!r}: expected hdfs://namenode:port/path")
        port = u.port or 9870
        self.url = url
        self.base = "/" + u.path.strip("/") if u.path.strip("/") else "/"
        self._http = f"http://{u.hostname}:{port}"
        user = user or os.environ.get("HADOOP_USER_NAME") or _current_user()
        self._client = InsecureClient(self._http, user=user, timeout=timeout_s)
        try:
            self._client.makedirs(self.base)
        except Exception as exc:  # hdfs raises HdfsError / requests errors
            raise StoreError(f"cannot use WebHDFS store {url}: {exc}") from None

    def _p(self, relpath: str) -> str:
        return f"{self.base.rstrip('/')}/{relpath}" if relpath else self.base

    def _write_atomic(self, relpath: str, data: bytes) -> None:
        final = self._p(relpath)
        parent, _, name = final.rpartition("/")
        tmp = f"{parent}/.{name}.tmp-{uuid.uuid4().hex}"
        try:
            self._client.write(tmp, data=data, overwrite=False)
            try:
                self._client.delete(final)  # WebHDFS RENAME does not overwrite
            except Exception:
                pass
            self._client.rename(tmp, final)
        except Exception as exc:
            try:
                self._client.delete(tmp)
            except Exception:
                pass
            raise StoreError(f"WebHDFS write of {final} failed: {exc}") from None

    def _read(self, relpath: str, max_size: int | None = None) -> bytes:
        try:
            kw = {} if max_size is None else {"length": max_size + 1}  # never more than one byte too many
            with self._client.read(self._p(relpath), **kw) as r:
                data = r.read()
            if max_size is not None and len(data) > max_size:
                raise CheckpointCorrupt(f"{self._uri(relpath)}: more than the {max_size} bytes expected")
            return data
        except CheckpointCorrupt:
            raise
        except Exception as exc:  # hdfs raises HdfsError / requests errors
            if _hdfs_missing(exc):
                raise FileNotFoundError(self._p(relpath)) from None
            raise StoreUnavailable(f"WebHDFS read of {self._p(relpath)} failed: {exc}") from None

    def _sha256(self, relpath: str, size: int) -> str:
        h = hashlib.sha256()
        n = 0
        try:
            with self._client.read(self._p(relpath), length=size + 1, chunk_size=_CHUNK) as chunks:
                for b in chunks:
                    n += len(b)
                    if n > size:
                        break
                    h.update(b)
        except Exception as exc:  # hdfs raises HdfsError / requests errors
            if _hdfs_missing(exc):
                raise FileNotFoundError(self._p(relpath)) from None
            raise StoreUnavailable(f"WebHDFS read of {self._p(relpath)} failed: {exc}") from None
        if n != size:
            raise CheckpointCorrupt(f"{self._uri(relpath)}: {'more than' if n > size else 'only'} {min(n, size)} "
                                    f"bytes, manifest says {size}")
        return h.hexdigest()

    def _listdir(self, relpath: str) -> list[str]:
        try:
            return list(self._client.list(self._p(relpath)))
        except Exception as exc:  # hdfs raises HdfsError / requests errors
            if _hdfs_missing(exc):
                return []
            raise StoreUnavailable(f"WebHDFS listing of {self._p(relpath)} failed: {exc}") from None

    def _delete(self, relpath: str) -> None:
        try:
            self._client.delete(self._p(relpath))
        except Exception as exc:
            raise StoreError(f"WebHDFS delete of {self._p(relpath)} failed: {exc}") from None

    def _uri(self, relpath: str) -> str:
        u = urlparse(self.url)
        return f"{u.scheme}://{u.netloc}{self._p(relpath)}"

    def _mtime(self, relpath: str) -> float | None:
        try:
            st = self._client.status(self._p(relpath), strict=False)
        except Exception as exc:  # hdfs raises HdfsError / requests errors
            raise StoreUnavailable(f"WebHDFS status of {self._p(relpath)} failed: {exc}") from None
        if not st or st.get("type") != "FILE":
            return None
        return float(st.get("modificationTime", 0)) / 1000.0


def _hdfs_missing(exc: BaseException) -> bool:
    """Whether a WebHDFS error says the path does not exist (the NameNode's FileNotFoundException)."""
    return getattr(exc, "exception", None) == "FileNotFoundException"


def _current_user() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def open_store(url: str) -> CheckpointStore:
    """Open a store from a URL: a path or ``file://`` (LocalFSStore), ``hdfs://``/``webhdfs://`` (WebHDFSStore)."""
    if not url:
        raise StoreError("empty checkpoint store URL")
    u = urlparse(url)
    if u.scheme in ("hdfs", "webhdfs"):
        return WebHDFSStore(url)
    if u.scheme == "file":
        return LocalFSStore(u.path)
    if u.scheme == "" or len(u.scheme) == 1:  # plain path (or a Windows drive letter)
        return LocalFSStore(url)
    raise StoreError(f"unsupported checkpoint store URL {url!r}: use a path, file://, or hdfs://")
