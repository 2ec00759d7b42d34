"""Slurm's C API (``libslurm``) through :mod:`ctypes`: job updates and batch submissions in this process.

Every ``scontrol`` or ``sbatch`` run is a process (start-up, configuration read, a MUNGE credential) and
sends one RPC per job. :class:`LibSlurm` sends the same RPCs from this process: ``slurm_update_job`` and
``slurm_submit_batch_job`` with a ``job_desc_msg_t`` that ``slurm_init_job_desc_msg`` filled with Slurm's
"not set" values, then the fields given written at their offsets. The controller's pins, releases and
AdminComment reasons use it (:class:`controller.slurm.SlurmCLI`), ``benchmarks/bench_slurm.py`` its
submissions. :meth:`LibSlurm.job_detail` reads one job's per-node GRES (``slurm_load_job``, fields of
``slurm_job_info_t`` read at their offsets): the queue read asks it for a job that started on several nodes
with an uneven split, instead of reading every job as JSON.

It also does what ``scontrol`` cannot on Slurm 22.05: a pin and its release in one update RPC. A
release is an update with ``priority = INFINITE`` (``scontrol release``), and ``scontrol update
Priority=4294967295`` is refused by scontrol's parser, while any other ``Priority=`` of a held job is
ignored by slurmctld (``ignore priority reset request on held JobId``). Through the C API the pin
fields and ``priority = INFINITE`` travel in one message; slurmctld applies the node list, node count,
GPU TRES and start time first and releases last (``_update_job``): when a pin field is refused
(``Invalid node name specified``) the job stays held (checked on slurmctld 22.05.8).

Offsets are those of ``slurm/slurm.h`` for the Slurm releases in :data:`LAYOUTS` (by API number,
``slurm_api_version() >> 16``; x86-64 Linux). A library of another release, or none, gives
:func:`open_libslurm` ``None``: callers keep using the commands. ``tests/test_libslurm.py`` compares the
offsets with the header's (``offsetof``, when gcc and ``libslurm-dev`` are present).

``slurm_init`` configures the library for the whole process, so one process talks to one cluster
through it: the first ``slurm.conf`` opened wins; :func:`open_libslurm` gives ``None`` for any other.
``slurm_init`` ends the process (Slurm's ``fatal()``) on a ``slurm.conf`` it cannot read or parse, so a
child process runs it first (:func:`_probe`); only a configuration that passed is loaded here.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["LAYOUTS", "JOB_INFO_LAYOUTS", "JOB_INFO_MSG_LAYOUTS", "INFINITE", "NO_VAL", "JobDetail", "LibSlurm",
           "LibSlurmError", "open_libslurm"]

INFINITE = 0xFFFFFFFF
NO_VAL = 0xFFFFFFFE

#: ``job_desc_msg_t``: size in bytes and field -> (offset, C type), by the library's API number
#: (``slurm_api_version() >> 16``, the soname's number: 38 is Slurm 22.05); x86-64, from ``offsetof`` over
#: ``slurm/slurm.h``
LAYOUTS: dict[int, tuple[int, dict[str, tuple[int, str]]]] = {
    38: (880, {
        "admin_comment": (16, "str"), "begin_time": (80, "time"), "comment": (120, "str"), "environment": (224, "strv"),
        "env_size": (268, "u32"), "group_id": (312, "u32"), "job_id": (324, "u32"),
        "name": (400, "str"), "num_tasks": (420, "u32"), "partition": (448, "str"), "priority": (472, "u32"),
        "req_nodes": (512, "str"), "script": (536, "str"), "tres_per_job": (648, "str"),
        "tres_per_node": (656, "str"), "user_id": (680, "u32"), "work_dir": (696, "str"),
        "min_cpus": (708, "u32"), "min_nodes": (716, "u32"), "max_nodes": (720, "u32"), "std_out": (816, "str"),
    }),
}
#: ``slurm_job_info_t`` (one job of ``job_info_msg_t.job_array``): size and the fields :meth:`LibSlurm.job_detail`
#: reads, and ``job_info_msg_t``: size and its fields; same keys and source as :data:`LAYOUTS`
JOB_INFO_LAYOUTS: dict[int, tuple[int, dict[str, tuple[int, str]]]] = {
    38: (904, {"gres_detail_cnt": (344, "u32"), "gres_detail_str": (352, "strv"), "job_id": (388, "u32"),
               "job_state": (400, "u32"), "nodes": (480, "str"), "restart_cnt": (648, "u16")}),
}
JOB_INFO_MSG_LAYOUTS: dict[int, tuple[int, dict[str, tuple[int, str]]]] = {
    38: (32, {"record_count": (16, "u32"), "job_array": (24, "ptr")}),
}
#: slurm.h's ``SHOW_DETAIL`` (per-node resources, ``gres_detail_str`` among them) and slurm_errno.h's
#: ``ESLURM_INVALID_JOB_ID`` (a job slurmctld no longer has)
SHOW_DETAIL = 0x0002
ESLURM_INVALID_JOB_ID = 2017
#: ``enum job_states`` (``job_state & JOB_STATE_BASE``, 0xff) as squeue names them
JOB_STATES = ("PENDING", "RUNNING", "SUSPENDED", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL",
              "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY")
#: the library file of each API number (Debian 12: libslurm.so.38, Slurm 22.05)
SONAMES = {38: "libslurm.so.38"}
#: errno values of a message that may have reached slurmctld without its answer coming back (the update may
#: have been applied): slurm_errno.h's SLURM_COMMUNICATIONS_* / SLURMCTLD_COMMUNICATIONS_* and
#: SLURM_PROTOCOL_SOCKET_IMPL_TIMEOUT
_UNSURE = {1001, 1002, 1003, 1004, 1005, 1006, 1007, 1008, 5004}


class LibSlurmError(Exception):
    """A libslurm call that failed: ``errno`` is Slurm's error number, ``unsure`` whether slurmctld may have
    applied it all the same (a communication error or time-out)."""

    def __init__(self, what: str, errno: int, message: str) -> None:
        super().__init__(f"{what}: {message} (Slurm error {errno})")
        self.errno = errno
        self.message = message
        self.unsure = errno in _UNSURE


@dataclass(frozen=True)
class Update:
    """One job update: the fields of ``job_desc_msg_t`` to set (the rest stay "not set"). Strings are written
    as given (``""`` clears a TRES); ``begin_time`` is epoch seconds."""

    job_id: int
    fields: Mapping[str, int | str | Sequence[str]]


@dataclass(frozen=True)
class JobDetail:
    """What ``slurm_load_job(..., SHOW_DETAIL)`` tells of one job: its state (``JOB_STATES`` name), its nodes
    (Slurm's compressed list, ``""`` for none), its restart count and ``gres_detail``: one GRES string per
    allocated node in node-list order (``gpu:8(IDX:0-7)``), as ``squeue --json`` gives it."""

    job_id: int
    state: str
    nodes: str
    restarts: int
    gres_detail: tuple[str, ...]


class LibSlurm:
    """``libslurm`` loaded and initialised for one ``slurm.conf`` (see the module docstring)."""

    def __init__(self, lib: ctypes.CDLL, api: int, conf: str) -> None:
        self.lib = lib
        self.api = api
        self.conf = conf
        self.size, self.fields = LAYOUTS[api >> 16]
        lib.slurm_get_errno.restype = ctypes.c_int
        lib.slurm_strerror.restype = ctypes.c_char_p
        lib.slurm_strerror.argtypes = [ctypes.c_int]
        lib.slurm_update_job.argtypes = [ctypes.c_void_p]
        lib.slurm_update_job.restype = ctypes.c_int
        lib.slurm_submit_batch_job.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
        lib.slurm_submit_batch_job.restype = ctypes.c_int
        lib.slurm_free_submit_response_response_msg.argtypes = [ctypes.c_void_p]
        lib.slurm_init_job_desc_msg.argtypes = [ctypes.c_void_p]
        self.job_info = JOB_INFO_LAYOUTS.get(api >> 16)
        self.job_info_msg = JOB_INFO_MSG_LAYOUTS.get(api >> 16)
        if self.job_info is not None:
            lib.slurm_load_job.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint32, ctypes.c_uint16]
            lib.slurm_load_job.restype = ctypes.c_int
            lib.slurm_free_job_info_msg.argtypes = [ctypes.c_void_p]
        self.calls = 0

    # ------------------------------------------------------------------ job descriptors
    def _desc(self, fields: Mapping[str, int | str | Sequence[str]]) -> tuple[ctypes.Array, list]:
        """A ``job_desc_msg_t`` with Slurm's defaults and ``fields`` set; the list keeps the strings it points to
        alive for as long as the descriptor is used."""
        buf = ctypes.create_string_buffer(self.size)
        self.lib.slurm_init_job_desc_msg(buf)
        keep: list = []
        for name, value in fields.items():
            try:
                off, kind = self.fields[name]
            except KeyError:
                raise ValueError(f"libslurm: no job_desc_msg_t field {name!r} in this layout") from None
            if kind == "str":
                s = ctypes.create_string_buffer(str(value).encode())
                keep.append(s)
                ctypes.c_void_p.from_buffer(buf, off).value = ctypes.addressof(s)
            elif kind == "strv":
                items = [ctypes.create_string_buffer(str(v).encode()) for v in value]  # type: ignore[union-attr]
                arr = (ctypes.c_void_p * (len(items) + 1))(*[ctypes.addressof(x) for x in items], None)
                keep += [items, arr]
                ctypes.c_void_p.from_buffer(buf, off).value = ctypes.addressof(arr)
            elif kind == "u32":
                ctypes.c_uint32.from_buffer(buf, off).value = int(value)  # type: ignore[arg-type]
            elif kind == "time":
                ctypes.c_int64.from_buffer(buf, off).value = int(value)  # type: ignore[arg-type]
        return buf, keep

    def _error(self, what: str) -> LibSlurmError:
        e = int(self.lib.slurm_get_errno())
        msg = self.lib.slurm_strerror(e)
        return LibSlurmError(what, e, msg.decode(errors="replace") if msg else "unknown error")

    # ------------------------------------------------------------------ calls
    def update(self, up: Update) -> None:
        """One ``slurm_update_job`` RPC (what ``scontrol update`` sends for one job). :class:`LibSlurmError`
        when slurmctld refused it or did not answer. Threads may call it at once (ctypes lets go of the GIL
        for the call; the error number is libslurm's per thread)."""
        buf, keep = self._desc({**up.fields, "job_id": int(up.job_id)})
        with _lock:  # (updates may be sent from several threads at once)
            self.calls += 1
        rc = self.lib.slurm_update_job(buf)
        del keep
        if rc != 0:
            raise self._error(f"update of job {int(up.job_id)}")

    def submit_batch(self, fields: Mapping[str, int | str | Sequence[str]]) -> int:
        """One ``slurm_submit_batch_job`` RPC; returns the job id. ``fields`` must hold ``script``,
        ``environment`` (with ``env_size``, set here), ``work_dir``, ``user_id`` and ``group_id``, as
        ``sbatch`` fills them."""
        f = dict(fields)
        if "environment" in f:
            f["env_size"] = len(f["environment"])  # type: ignore[arg-type]
        buf, keep = self._desc(f)
        resp = ctypes.c_void_p()
        self.calls += 1
        rc = self.lib.slurm_submit_batch_job(buf, ctypes.byref(resp))
        del keep
        if rc != 0:
            raise self._error("batch job submission")
        try:
            return int(ctypes.c_uint32.from_address(resp.value).value)  # submit_response_msg_t.job_id, offset 0
        finally:
            self.lib.slurm_free_submit_response_response_msg(resp)


    def job_detail(self, job_id: int) -> JobDetail | None:
        """One ``slurm_load_job`` RPC with ``SHOW_DETAIL`` (what ``scontrol show job -d`` asks; slurmctld
        packs that one job only): the job's :class:`JobDetail`, ``None`` when slurmctld no longer has it.
        :class:`LibSlurmError` when the call failed, ValueError where this release has no
        :data:`JOB_INFO_LAYOUTS` entry."""
        if self.job_info is None or self.job_info_msg is None:
            raise ValueError(f"libslurm: no slurm_job_info_t layout for API {self.api >> 16}")
        size, f = self.job_info
        _, m = self.job_info_msg
        resp = ctypes.c_void_p()
        self.calls += 1
        rc = self.lib.slurm_load_job(ctypes.byref(resp), int(job_id), SHOW_DETAIL)
        if rc != 0:
            err = self._error(f"job {int(job_id)}'s record")
            if err.errno == ESLURM_INVALID_JOB_ID:
                return None
            raise err
        try:
            base = int(resp.value or 0)
            count = ctypes.c_uint32.from_address(base + m["record_count"][0]).value
            array = ctypes.c_void_p.from_address(base + m["job_array"][0]).value or 0
            for k in range(count):
                rec = array + k * size
                if ctypes.c_uint32.from_address(rec + f["job_id"][0]).value != int(job_id):
                    continue
                state = ctypes.c_uint32.from_address(rec + f["job_state"][0]).value & 0xFF
                nodes = ctypes.c_char_p.from_address(rec + f["nodes"][0]).value
                n = ctypes.c_uint32.from_address(rec + f["gres_detail_cnt"][0]).value
                strs = ctypes.c_void_p.from_address(rec + f["gres_detail_str"][0]).value
                detail = tuple((ctypes.c_char_p.from_address(strs + 8 * i).value or b"").decode(errors="replace")
                               for i in range(n)) if strs else ()
                return JobDetail(int(job_id), JOB_STATES[state] if state < len(JOB_STATES) else str(state),
                                 (nodes or b"").decode(errors="replace"),
                                 ctypes.c_uint16.from_address(rec + f["restart_cnt"][0]).value, detail)
            return None
        finally:
            self.lib.slurm_free_job_info_msg(resp)


def pin_update(job_id: int, nodes: str, num_nodes: int, gpus: int, per_node: int | None, tres_style: str,
               delay_s: int, release: bool, now: float | None = None) -> Update:
    """The update that :meth:`controller.slurm.SlurmCLI.pin_args` writes for ``scontrol update`` (``nodes``:
    the compressed node list), with ``release`` also the release (``priority = INFINITE``)."""
    tres = ({"tres_per_job": "", "tres_per_node": f"{tres_style}:{per_node}"} if per_node is not None
            else {"tres_per_node": "", "tres_per_job": f"{tres_style}:{gpus}"})
    t = int(time.time() if now is None else now) + max(0, int(delay_s))
    # NumNodes=n as scontrol sends it: the minimum only (a maximum set here would stay with the job and make
    # a later pin to more nodes invalid: "max_nodes < min_nodes", checked on 22.05.8)
    fields: dict[str, int | str] = {"req_nodes": nodes, "min_nodes": num_nodes, **tres, "begin_time": t}
    if release:
        fields["priority"] = INFINITE
    return Update(int(job_id), fields)


_lock = threading.Lock()
_opened: dict[str, LibSlurm | None] = {}  # the one conf this process initialised libslurm with -> library


_PROBE = """
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)
lib.slurm_init.argtypes = [ctypes.c_char_p]
lib.slurm_init(sys.argv[2].encode())
lib.slurm_fini()
"""


def _probe(name: str, conf: str, timeout_s: float = 30.0) -> bool:
    """Whether ``slurm_init(conf)`` of library ``name`` returns (in a child process: it exits on a bad file)."""
    try:
        p = subprocess.run([sys.executable, "-c", _PROBE, name, conf], capture_output=True, timeout=timeout_s,
                           check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return p.returncode == 0


def open_libslurm(conf: str, path: str | None = None) -> LibSlurm | None:
    """``libslurm`` initialised for the ``slurm.conf`` file ``conf``, or ``None`` where it cannot be used: no
    library, a release without a layout in :data:`LAYOUTS`, a file that is missing or that ``slurm_init``
    does not take (:func:`_probe`), a host that is not x86-64 Linux, or this process initialised the library for another ``slurm.conf``
    already. ``path``: the library file (default: the soname of each known release)."""
    key = os.path.abspath(conf)
    if not os.path.isfile(key) or platform.machine() != "x86_64" or not sys.platform.startswith("linux"):
        return None  # the offsets of LAYOUTS are x86-64 Linux's
    with _lock:
        if _opened:
            (k, lib), = _opened.items()
            return lib if k == key else None
        lib = None
        for name in ([path] if path else [*SONAMES.values(), ctypes.util.find_library("slurm")]):
            if not name:
                continue
            try:
                cdll = ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)  # its plugins resolve their symbols in it
                cdll.slurm_api_version.restype = ctypes.c_long
                api = int(cdll.slurm_api_version())
            except (OSError, AttributeError):
                continue
            if (api >> 16) not in LAYOUTS or not _probe(name, key):
                continue
            cdll.slurm_init.argtypes = [ctypes.c_char_p]
            cdll.slurm_init(key.encode())
            lib = LibSlurm(cdll, api, key)
            break
        _opened[key] = lib
        return lib
