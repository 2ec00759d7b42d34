"""Experience journal: the (state, action, reward) of a learned policy's live rounds, for ``rlsched train
--online``.

A policy that learns online (one with ``take_experience()``, :class:`policies.dl2.DL2Policy`) records, while
the controller runs it, every slot it decides as a :class:`policies.dl2.Transition`: the state, the mask
and the action of each inference, DL2's reward of the slot (work done by each job until the next slot,
over its total, from what the controller observed at the next slot's round) and the next slot's first
state. :class:`ExperienceRecorder` takes them from the policy after each round and appends them to an
:class:`ExperienceJournal`; :func:`read_experience` reads them back.

**Files.** A directory (``controller.experience_dir``, default ``STATE_DIR/experience``) of segments
``experience-NNNNNN.rlx`` (``NNNNNN`` increasing). A segment is a sequence of records, each

    b"RLX1" | payload length (uint32 LE) | CRC-32 of the payload (uint32 LE) | payload

and a payload is zlib-compressed safetensors bytes: tensors ``obs`` ``(n, obs_size)`` float32, ``mask``
``(n, n_actions)`` bool, ``action`` ``(n,)`` int64 and, unless nothing followed, ``next_obs``
``(obs_size,)`` float32; the safetensors metadata (strings) holds ``time`` and ``end`` (the slot's start
and the round that closed it, epoch s), ``reward``, ``policy``, ``spec`` (the policy's state / action
layout, JSON), ``checkpoint`` and ``weights_sha256`` (the weights that acted). Nothing is pickled.

**Bounded.** A segment takes records until it would pass ``max_bytes / 4``, then the next one starts;
after each append the oldest segments are deleted while the journal holds more than ``max_bytes``
(the newest segment is never deleted: a single record larger than the cap is kept alone).

**Crash-safe.** Each record is one ``write`` of its bytes (then ``fsync``); a journal reopened after a
crash writes to a new segment, never after a record that may be torn. The reader checks every record's
length and CRC: a torn last record of a segment (short header or payload) is skipped with a warning;
a record with a bad magic or CRC ends that segment's reading with a warning (the rest cannot be framed).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import numpy as np

__all__ = ["MAGIC", "ExperienceError", "ExperienceJournal", "ExperienceRecorder", "Record", "read_experience",
           "experience_recorder"]

log = logging.getLogger("controller.daemon")

MAGIC = b"RLX1"
_HEAD = struct.Struct("<4sII")
_SEGMENT = re.compile(r"^experience-(\d{6,})\.rlx$")
#: the largest payload a reader accepts (a larger length field is damage, not a record)
MAX_RECORD_BYTES = 256 * 1024 * 1024


class ExperienceError(ValueError):
    """A journal that cannot be read or written; the message names the path."""


@dataclass(frozen=True)
class Record:
    """One record read back: the transition and its metadata (``policy``, ``spec`` (dict), ``checkpoint``,
    ``weights_sha256``), and where it was (``segment``, byte ``offset``)."""

    transition: Any  # policies.dl2.Transition
    meta: dict[str, Any]
    segment: Path
    offset: int


def _segments(directory: Path) -> list[tuple[int, Path]]:
    out = []
    for f in directory.iterdir():
        m = _SEGMENT.match(f.name)
        if m and f.is_file():
            out.append((int(m.group(1)), f))
    return sorted(out)


def encode_record(t: Any, meta: Mapping[str, str]) -> bytes:
    """The bytes of one record (module docstring) of transition ``t`` with string metadata ``meta``."""
    from safetensors.numpy import save

    tensors = {"obs": np.ascontiguousarray(t.obs, np.float32), "mask": np.ascontiguousarray(t.mask, bool),
               "action": np.ascontiguousarray(t.action, np.int64)}
    if t.next_obs is not None:
        tensors["next_obs"] = np.ascontiguousarray(t.next_obs, np.float32)
    md = {**{k: str(v) for k, v in meta.items()}, "time": repr(float(t.time)), "end": repr(float(t.end)),
          "reward": repr(float(t.reward))}
    payload = zlib.compress(save(tensors, metadata=md), 1)
    return _HEAD.pack(MAGIC, len(payload), zlib.crc32(payload)) + payload


def _decode(payload: bytes, where: str) -> tuple[Any, dict[str, Any]]:
    from safetensors.numpy import load

    from policies.dl2 import Transition

    try:
        raw = zlib.decompress(payload)
        n = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8 : 8 + n])
        md = dict(header.get("__metadata__") or {})
        tensors = load(raw)
    except Exception as exc:  # noqa: BLE001 - any decoding failure of a CRC-valid record is one error line
        raise ExperienceError(f"{where}: undecodable record: {type(exc).__name__}: {exc}") from None
    try:
        obs, mask, action = tensors["obs"], tensors["mask"], tensors["action"]
        nxt = tensors.get("next_obs")
        time_, end, reward = float(md["time"]), float(md["end"]), float(md["reward"])
        spec = json.loads(md.get("spec") or "{}")
    except (KeyError, ValueError) as exc:
        raise ExperienceError(f"{where}: record lacks {exc}") from None
    n_obs, n_act = spec.get("obs_size"), spec.get("n_actions")
    if obs.ndim != 2 or mask.ndim != 2 or action.shape != (len(obs),) or len(mask) != len(obs) \
            or obs.shape[1] != n_obs or mask.shape[1] != n_act or mask.dtype != bool \
            or (nxt is not None and nxt.shape != (n_obs,)):
        raise ExperienceError(f"{where}: record shapes obs {obs.shape}, mask {mask.shape}, action {action.shape} do not "
                              f"match its spec ({n_obs} -> {n_act})")
    if not (math.isfinite(reward) and np.isfinite(obs).all() and (nxt is None or np.isfinite(nxt).all())):
        raise ExperienceError(f"{where}: record holds NaN or infinite values")
    if len(action) and (action.min() < 0 or action.max() >= n_act or not mask[np.arange(len(action)), action].all()):
        raise ExperienceError(f"{where}: record has an action outside its mask")
    meta = {"policy": md.get("policy", ""), "spec": spec, "checkpoint": md.get("checkpoint", ""),
            "weights_sha256": md.get("weights_sha256", "")}
    return Transition(time_, end, obs, mask, action, reward, nxt), meta


def read_experience(directory: str | Path, warn: Callable[[str], None] | None = None) -> Iterator[Record]:
    """Every readable record of the journal in ``directory``, oldest first (module docstring for what is
    skipped; each skip is one ``warn`` line, default: a logged warning).

    :raises ExperienceError: the directory does not exist or holds no segment, or a CRC-valid record does
        not decode (one line naming the segment and offset).
    """
    warn = warn or (lambda msg: log.warning("%s", msg))
    d = Path(directory)
    if not d.is_dir():
        raise ExperienceError(f"{d}: no such experience directory")
    segs = _segments(d)
    if not segs:
        raise ExperienceError(f"{d}: no experience segments (experience-NNNNNN.rlx)")
    for _i, f in segs:
        data = f.read_bytes()
        off = 0
        while off < len(data):
            if len(data) - off < _HEAD.size:
                warn(f"{f}: torn last record at byte {off} ({len(data) - off} of {_HEAD.size} header bytes) skipped")
                break
            magic, n, crc = _HEAD.unpack_from(data, off)
            if magic != MAGIC or n > MAX_RECORD_BYTES:
                warn(f"{f}: no record at byte {off} (bad magic or length); the rest of the segment is skipped")
                break
            end = off + _HEAD.size + n
            if end > len(data):
                warn(f"{f}: torn last record at byte {off} ({len(data) - off - _HEAD.size} of {n} payload bytes) skipped")
                break
            payload = data[off + _HEAD.size : end]
            if zlib.crc32(payload) != crc:
                warn(f"{f}: record at byte {off} fails its CRC; the rest of the segment is skipped")
                break
            t, meta = _decode(payload, f"{f}@{off}")
            yield Record(t, meta, f, off)
            off = end


class ExperienceJournal:
    """Append-only, bounded, crash-safe journal of transitions in ``directory`` (module docstring).

    :param max_bytes: the cap on the journal's size (> 0).
    :param fsync: ``fsync`` each record after writing it.
    """

    def __init__(self, directory: str | Path, max_bytes: int, fsync: bool = True) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
            raise ExperienceError(f"{directory}: max_bytes must be an integer > 0, got {max_bytes!r}")
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.segment_bytes = max(max_bytes // 4, 1)
        self.fsync = fsync
        segs = _segments(self.dir)
        self._next = segs[-1][0] + 1 if segs else 1  # never append to a segment written before (torn tail?)
        self._fd: int | None = None
        self._path: Path | None = None
        self._size = 0
        self.records = 0

    def _open(self) -> None:
        self.close()
        self._path = self.dir / f"experience-{self._next:06d}.rlx"
        self._next += 1
        self._fd = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
        self._size = 0

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def append(self, t: Any, meta: Mapping[str, str]) -> Path:
        """Append transition ``t`` with ``meta``; returns the segment written. OSError from the file system."""
        rec = encode_record(t, meta)
        if self._fd is None or (self._size and self._size + len(rec) > self.segment_bytes):
            self._open()
        assert self._fd is not None and self._path is not None
        view = memoryview(rec)
        while view:  # os.write may write less than asked (a signal, a full disk); the rest follows
            k = os.write(self._fd, view)
            view = view[k:]
        if self.fsync:
            os.fsync(self._fd)
        self._size += len(rec)
        self.records += 1
        self._trim()
        return self._path

    def _trim(self) -> None:
        segs = _segments(self.dir)
        sizes = {f: f.stat().st_size for _i, f in segs}
        total = sum(sizes.values())
        for _i, f in segs[:-1]:
            if total <= self.max_bytes or f == self._path:
                break
            f.unlink()
            total -= sizes[f]

    def __enter__(self) -> "ExperienceJournal":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ExperienceRecorder:
    """Moves a policy's closed slots (``policy.take_experience()``) into ``journal`` after each round.
    A write that fails is logged once per error text and the round goes on (experience is never worth
    a round)."""

    def __init__(self, policy: Any, journal: ExperienceJournal) -> None:
        self.policy = policy
        self.journal = journal
        self.policy.record = True
        spec = getattr(policy, "spec", None)
        self.meta = {"policy": getattr(policy, "name", ""),
                     "spec": json.dumps(spec.to_dict() if spec is not None else {}, sort_keys=True),
                     "checkpoint": str(getattr(policy, "checkpoint", "") or ""),
                     "weights_sha256": str(getattr(policy, "weights_sha256", "") or "")}
        self._failed: str | None = None

    def collect(self) -> int:
        """Append what the policy closed since the last call; the number of transitions written."""
        n = 0
        for t in self.policy.take_experience():
            try:
                self.journal.append(t, self.meta)
            except OSError as exc:
                if str(exc) != self._failed:
                    log.warning("experience journal %s: write failed, slot dropped: %s", self.journal.dir, exc,
                                extra={"event": "experience_error"})
                self._failed = str(exc)
                continue
            self._failed = None
            n += 1
        return n


def experience_recorder(policy: Any, directory: str | Path, max_bytes: int) -> ExperienceRecorder | None:
    """The recorder of ``policy`` into ``directory`` (at most ``max_bytes``), or None when the policy does
    not learn online (no ``take_experience``) or ``max_bytes`` is 0. A directory that cannot be made is
    logged and gives None (the controller runs without recording)."""
    if max_bytes <= 0 or not callable(getattr(policy, "take_experience", None)):
        return None
    try:
        rec = ExperienceRecorder(policy, ExperienceJournal(directory, max_bytes))
    except OSError as exc:
        log.warning("experience journal %s: cannot be made, not recording: %s", directory, exc,
                    extra={"event": "experience_error"})
        return None
    log.info("recording %s's experience into %s (at most %d bytes)", rec.meta["policy"], directory, max_bytes,
             extra={"event": "experience", "dir": str(directory)})
    return rec
