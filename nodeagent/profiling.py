"""Reading the job helper's profile: the communication fraction of a few training steps.

Pure functions over profiler output; nothing here imports torch, so they run (and are tested) on hosts
without torch or without a GPU. Two sources:

* **host (CPU) activity** -- :func:`comm_fraction_from_events`: the union of the wall-time intervals of
  collective ops recorded on the host (``gloo:*``, ``nccl:*``, ``c10d::*``, ``record_param_comms``) over
  the wall time of the profiled steps. The helper's own stop-flag all-reduce (``rlsched::stop_check``)
  is excluded.
* **device (CUDA) activity** -- :func:`device_summary`: the union of the intervals of NCCL kernels (kernel
  name contains ``nccl``, any case: ``ncclDevKernel_AllReduce_Sum_f32_RING_LL``,
  ``ncclKernel_AllGather_RING_LL_Sum_int8_t``, ...) over the union of the intervals of all device
  activity (kernels, memcpy, memset) in the profiled steps: the share of the GPU's busy time during
  which a collective was running. Overlapped communication counts as communication time, as on the
  host; an NCCL kernel that waits for a slower peer counts for the time it waits.

:func:`summarize_events` takes ``torch.profiler`` events (``prof.events()``: objects with ``name``,
``time_range.start/end`` in microseconds and ``device_type``) and uses the device source when the
profile holds device activity, the host source otherwise. :func:`summarize_chrome_trace` reads the same
from a trace written by ``prof.export_chrome_trace`` (Kineto's JSON: ``traceEvents`` with ``cat``,
``name``, ``ts`` and ``dur`` in microseconds).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable

#: Host-side event names of collective communication (gloo:all_reduce, nccl:all_gather, c10d::allreduce_, ...).
COMM_OP_RE = re.compile(r"^(gloo|nccl|mpi|ucc|xccl):|^c10d::|^record_param_comms$|^ncclKernel|^ncclDevKernel")
#: The helper's stop-flag all-reduce (a record_function range); communication inside it is not the job's.
STOP_CHECK = "rlsched::stop_check"
#: Chrome-trace categories of device activity (Kineto): kernels, copies and sets on the GPU.
DEVICE_TRACE_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})


@dataclass(frozen=True)
class ProfileSummary:
    """What one profiling window measured.

    ``source``: ``"cuda"`` (from device activity) or ``"cpu"`` (from host-side collective ops).
    ``comm_fraction``: in [0, 1]; cuda: ``comm_us / busy_us``; cpu: ``comm_us / wall_us``.
    ``wall_us``: wall time of the profiled steps (microseconds). ``busy_us``: cuda: union of all device
    activity intervals; cpu: equal to ``wall_us``. ``comm_us``: union of the communication intervals.
    ``device_events`` / ``comm_kernels``: numbers of device activity records / NCCL kernels (0 on cpu).
    """

    source: str
    comm_fraction: float
    wall_us: float
    busy_us: float
    comm_us: float
    device_events: int = 0
    comm_kernels: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def union_us(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length of the union of ``(start, end)`` intervals (same unit as the input)."""
    total, cur_s, cur_e = 0.0, 0.0, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def is_comm_kernel(name: str) -> bool:
    """True for an NCCL kernel (its name contains ``nccl``, any case)."""
    return "nccl" in name.lower()


def comm_fraction_from_events(events: list[Any], wall_us: float) -> float:
    """Host source: fraction of ``wall_us`` covered by collective-op intervals (union), from profiler
    events (``name``, ``time_range.start/end`` in microseconds). Events inside the helper's own
    stop-flag all-reduce are ignored."""
    if wall_us <= 0:
        return 0.0
    excl = [(e.time_range.start, e.time_range.end) for e in events if e.name == STOP_CHECK]

    def excluded(s: float, e: float) -> bool:
        return any(a <= s and e <= b for a, b in excl)

    total = union_us(
        (e.time_range.start, e.time_range.end)
        for e in events
        if e.name != STOP_CHECK and COMM_OP_RE.search(e.name) and not excluded(e.time_range.start, e.time_range.end)
    )
    return max(0.0, min(1.0, total / wall_us))


def device_summary(spans: list[tuple[str, float, float]], wall_us: float) -> ProfileSummary:
    """Device source from ``(name, start_us, end_us)`` records of device activity (kernels, memcpy, memset)."""
    busy = union_us((s, e) for _, s, e in spans)
    comm_spans = [(s, e) for n, s, e in spans if is_comm_kernel(n)]
    comm = union_us(comm_spans)
    return ProfileSummary("cuda", max(0.0, min(1.0, comm / busy)) if busy > 0 else 0.0, float(wall_us), busy, comm,
                          len(spans), len(comm_spans))


def _on_device(event: Any) -> bool:
    """True for a profiler event recorded on a CUDA device (``device_type`` ``DeviceType.CUDA``)."""
    dt = getattr(event, "device_type", None)
    return getattr(dt, "name", dt) == "CUDA"


def summarize_events(events: list[Any], wall_us: float) -> ProfileSummary:
    """Summary of ``torch.profiler`` events of ``wall_us`` microseconds of steps: the device source when
    the events include CUDA activity, the host source otherwise (CPU-only profile, or a job that kept
    its work on the CPU while CUDA activity was recorded)."""
    spans = [(e.name, e.time_range.start, e.time_range.end) for e in events if _on_device(e)]
    if spans:
        return device_summary(spans, wall_us)
    host = [e for e in events if not _on_device(e)]
    cf = comm_fraction_from_events(host, wall_us)
    return ProfileSummary("cpu", cf, float(wall_us), float(wall_us), cf * wall_us if wall_us > 0 else 0.0)


class _TraceEvent:
    """A Chrome-trace ``X`` event shaped like a profiler event (``name``, ``time_range``, ``device_type``)."""

    __slots__ = ("name", "time_range", "device_type")

    def __init__(self, name: str, start: float, end: float, device: bool) -> None:
        self.name = name
        self.time_range = _Range(start, end)
        self.device_type = "CUDA" if device else "CPU"


@dataclass(frozen=True)
class _Range:
    start: float
    end: float


def summarize_chrome_trace(trace: dict | str | Path, wall_us: float | None = None) -> ProfileSummary:
    """:func:`summarize_events` over a Kineto Chrome trace (a dict, or the path of its JSON file).

    ``wall_us``: wall time of the profiled steps; default: from the first start to the last end of
    the trace's host-side events (or of all its events if it has none).
    Raises ValueError (naming the file) when the trace is not Kineto's JSON."""
    where = str(trace) if not isinstance(trace, dict) else "trace"
    if not isinstance(trace, dict):
        try:
            trace = json.loads(Path(trace).read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"{where}: cannot read a JSON profiler trace: {exc}") from None
    raw = trace.get("traceEvents") if isinstance(trace, dict) else None
    if not isinstance(raw, list):
        raise ValueError(f"{where}: not a profiler trace (no traceEvents list)")
    events = []
    for i, e in enumerate(raw):
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        try:
            ts, dur = float(e["ts"]), float(e.get("dur", 0.0))
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{where}: traceEvents[{i}] has no numeric ts/dur") from None
        events.append(_TraceEvent(str(e.get("name", "")), ts, ts + dur, e.get("cat") in DEVICE_TRACE_CATS))
    if wall_us is None:
        host = [e for e in events if e.device_type == "CPU"] or events
        wall_us = (max(e.time_range.end for e in host) - min(e.time_range.start for e in host)) if host else 0.0
    return summarize_events(events, wall_us)
