"""The one adapter between rlsched and Slurm: its command-line tools.

pyslurm matches no packaged Slurm, so the controller runs the Slurm commands
(``squeue``, ``sinfo``, ``scontrol``) with a timeout each. A
command that fails, times out or prints something unparseable raises
:class:`SlurmError`; the daemon logs it and tries again next round.

Reading is split in two layers so that Slurm version changes stay local:

* ``_num``, ``_state``, ``_str`` unwrap the few JSON encodings that changed
  between OpenAPI v0.0.38 (Slurm 22.05: plain ints, ``"RUNNING"``) and
  v0.0.39+ (23.x-25.x: ``{"set", "infinite", "number"}`` objects, state lists);
* :func:`parse_squeue_json`, :func:`parse_sinfo_json` turn one command's
  output into :class:`SlurmJob` / :class:`SlurmNode`.

Nodes are read from ``sinfo -h -N -a -O`` text (:func:`parse_sinfo_text`, random separators; the same
:class:`SlurmNode` fields as the JSON in about half of ``sinfo --json``'s time for 64 nodes on 22.05),
``sinfo --json`` where that text is not the rows asked for.

Jobs are read from ``squeue --json`` and, between JSON reads, from ``squeue -O``
text (:meth:`SlurmCLI.queue`, about a fifth of the JSON's time for 1,000 jobs on
22.05) whose field and row separators are random per call, so that no user's
text can forge a field; never from ``scontrol show job``: that prints
``Key=Value`` pairs in which users' own fields (job name, comment, paths) may
contain text such as `` JobState=PENDING``, and no parser can tell those apart
from Slurm's fields.

Placements are written in batches: a round's pins through one ``scontrol``
process reading ``update`` lines from stdin (:meth:`SlurmCLI.place_many`), its
releases in ``scontrol release a,b,c`` (:meth:`SlurmCLI.release_many`).

Tests feed them outputs captured from this machine's Slurm 22.05
(``tests/data/slurm/``).
"""

from __future__ import annotations

import json
import logging
import dataclasses
import datetime
import os
import re
import secrets
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

__all__ = [
    "SlurmError",
    "SlurmJob",
    "SlurmNode",
    "SlurmCLI",
    "expand_hostlist",
    "compress_nodes",
    "gpus_from_tres",
    "gpu_type_from_tres",
    "per_gpu_from_tres",
    "managed_gpus",
    "parse_gres_count",
    "parse_gres_type",
    "parse_squeue_json",
    "parse_sinfo_json",
    "parse_sinfo_text",
    "NODE_FIELDS",
    "parse_squeue_text",
    "squeue_chunks",
    "squeue_row",
    "overlay_text",
    "QUEUE_FIELDS",
    "MANAGED_MARK",
    "REASON_SEP",
    "with_reason",
    "queue_position",
    "dependency_met",
    "cons_tres_split",
]

log = logging.getLogger(__name__)

#: Marker job_submit.lua writes into the admin comment of jobs it holds.
MANAGED_MARK = "rlsched:managed"
#: Slurm's "infinite" for 32-bit fields (priority after release, UNLIMITED time).
INFINITE32 = 0xFFFFFFFF
NO_VAL32 = 0xFFFFFFFE
#: States of a job that waits in the queue. SPECIAL_EXIT: requeued held after
#: its exit code matched RequeueExitHold (a preempted job exiting 75).
PENDING_STATES = ("PENDING", "SPECIAL_EXIT", "REQUEUE_HOLD", "REQUEUED")


class SlurmError(RuntimeError):
    """A Slurm command failed, timed out or printed something unexpected."""

    def __init__(self, cmd: Sequence[str], message: str, *, timed_out: bool = False) -> None:
        super().__init__(f"{' '.join(cmd)}: {message}")
        self.cmd = list(cmd)
        self.message = message
        #: the command ran past its time limit: slurmctld may still have carried it out
        self.timed_out = timed_out


@dataclass
class SlurmNode:
    """One node as ``sinfo`` reports it.

    :param gpus: configured GPU GRES count.
    :param gpu_type: the GRES type of its GPUs (``gpu:v100:8`` -> ``"v100"``); None when the GRES names
        no type or names several.
    :param cpus: configured CPUs; None when sinfo gives none.
    :param mem_gb: configured memory (``RealMemory``, MB) in GB of 1024 MB; None when sinfo gives none
        or Slurm's default of 1 MB (RealMemory not configured).
    """

    name: str
    gpus: int
    gpus_used: int
    state: str  # lower case base state: idle, mixed, allocated, down, drained, ...
    flags: tuple[str, ...] = ()
    partitions: tuple[str, ...] = ()
    gpu_type: str | None = None
    cpus: int | None = None
    mem_gb: float | None = None

    @property
    def usable(self) -> bool:
        bad = {"down", "drain", "drained", "draining", "fail", "failing", "future", "unknown", "not_responding",
               "maint", "reserved", "reboot_requested", "reboot_issued", "inval", "invalid", "invalid_reg"}
        return self.state not in bad and not (bad & {f.lower() for f in self.flags})


@dataclass
class SlurmJob:
    """One job as ``squeue``/``scontrol`` report it.

    :param gpus: total GPUs requested (``--gpus=N``; ``tres_per_job``).
    :param gpu_type: the GPU type asked for (``--gpus=v100:4`` / ``--gres=gpu:v100:4``: ``tres_per_job`` /
        ``tres_per_node`` ``gres:gpu:v100:4``); None: any type (also when several types are named).
    :param cpus_per_gpu: ``--cpus-per-gpu`` (squeue ``cpus_per_tres`` ``gres:gpu:C``); 0: not asked.
    :param mem_gb_per_gpu: ``--mem-per-gpu`` (squeue ``memory_per_tres`` ``gres:gpu:M``, M in MB) in GB of
        1024 MB; 0.0: not asked.
    :param gpus_per_node: for a running job, node name -> allocated GPUs
        (from ``gres_detail``), in Slurm's node order.
    :param priority: 0 while held; ``None`` when unknown.
    :param time_limit_s: ``None`` for UNLIMITED.
    :param times: epoch seconds; ``None`` when not set.
    """

    job_id: int
    name: str
    user: str
    user_id: int
    state: str  # upper case: PENDING, RUNNING, COMPLETED, ...
    reason: str
    priority: int | None
    partition: str
    gpus: int
    nodes: list[str] = field(default_factory=list)
    gpus_per_node: dict[str, int] = field(default_factory=dict)
    required_nodes: list[str] = field(default_factory=list)
    num_nodes: int = 0
    comment: str = ""
    admin_comment: str = ""
    time_limit_s: float | None = None
    submit_time: float | None = None
    start_time: float | None = None
    eligible_time: float | None = None
    restarts: int = 0
    #: Slurm's dependency list (``afterok:12(unfulfilled),afterany:13(unfulfilled)``; "" for none).
    #: Slurm does not re-evaluate it while the job is held: see :func:`dependency_met`.
    dependency: str = ""
    #: whether Slurm may requeue it (``sbatch --no-requeue``: no; preempting it would end it)
    requeue: bool = True
    #: node running the batch script (rank 0 of the usual launchers); "" if not running
    batch_host: str = ""

    tres_style: str = "gres:gpu"  # how this Slurm writes GPU TRES: "gres:gpu" (22.05) or "gres/gpu" (23+)
    gpu_type: str | None = None
    cpus_per_gpu: int = 0
    mem_gb_per_gpu: float = 0.0

    @property
    def pin_tres(self) -> str:
        """The GPU TRES prefix a pin of this job writes (:meth:`SlurmCLI.pin_args` ``tres_style``):
        ``gres:gpu``, with the requested type kept (``gres:gpu:v100``), so a requeued job still asks for it."""
        return f"{self.tres_style}:{self.gpu_type}" if self.gpu_type else self.tres_style

    @property
    def managed(self) -> bool:
        return MANAGED_MARK in (self.admin_comment or "")

    def in_partition(self, partition: str | None) -> bool:
        """``None`` matches any; a pending job may list several (``gpu,debug``)."""
        return partition is None or partition in self.partition.split(",")

    @property
    def pending(self) -> bool:
        return self.state in PENDING_STATES

    @property
    def held(self) -> bool:
        return self.pending and self.priority == 0

    @property
    def admin_held(self) -> bool:
        """Held by an operator's ``scontrol hold`` (reason ``JobHeldAdmin``): rlsched leaves it alone.

        Every hold rlsched relies on is a user hold (``JobHeldUser``): job_submit.lua's
        priority 0, :meth:`SlurmCLI.hold` (``scontrol uhold``), ``scontrol requeuehold`` and
        ``RequeueExitHold`` (all checked on slurmctld 22.05)."""
        return self.held and self.reason == "JobHeldAdmin"

    @property
    def requeued_completing(self) -> bool:
        """Requeued held (``scontrol requeuehold`` or ``RequeueExitHold``) while Slurm still finishes its last
        run: slurmctld 22.05 keeps the ``COMPLETING`` flag, which squeue prints before the base state
        ``PENDING``, until every node reported the run's end (``_job_requeue_op``); only then is the job
        ``PENDING`` and is its begin time reset (``batch_requeue_fini``: a begin time already past becomes
        now + the credential lifetime, so a start time set before that is lost). A job that ends on its own
        shows ``COMPLETING`` too, but never with priority 0: a running job cannot be held."""
        return self.state == "COMPLETING" and self.priority == 0

    @property
    def running(self) -> bool:
        return self.state in ("RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED") and bool(self.nodes)


# --------------------------------------------------------------------------- small parsers
def _num(v: Any) -> int | float | None:
    """Unwrap a JSON number: 22.05 plain ints; 23.x+ ``{"set","infinite","number"}``."""
    if isinstance(v, dict):
        if v.get("infinite"):
            return INFINITE32
        if not v.get("set", True):
            return None
        v = v.get("number")
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return v
    try:
        return int(str(v))
    except ValueError:
        return None


def _state(v: Any) -> str:
    """Job/node state: 22.05 a string, 23.x+ a list (first entry is the base state)."""
    if isinstance(v, list):
        v = v[0] if v else ""
    return str(v or "")


def _str(v: Any) -> str:
    return "" if v is None else str(v)


def _time(v: Any) -> float | None:
    n = _num(v)
    if n is None or n <= 0 or n in (INFINITE32, NO_VAL32):
        return None
    return float(n)


def _time_limit_s(v: Any) -> float | None:
    """squeue's ``time_limit`` is in minutes; ``None``/infinite means UNLIMITED."""
    n = _num(v)
    if n is None or n in (INFINITE32, NO_VAL32):
        return None
    return float(n) * 60.0


def gpus_from_tres(tres: str | None) -> int:
    """Total GPUs in a TRES string: ``gres:gpu:4`` (22.05), ``gres/gpu:4`` (23+), ``gres:gpu:a100:2`` -> 2."""
    total = 0
    for entry in (tres or "").split(","):
        entry = entry.strip()
        if "gpu" not in entry:
            continue
        m = re.search(r"(?:gres[:/])?gpu(?::[^:=,]+)?[:=](\d+)$", entry)
        if m:
            total += int(m.group(1))
    return total


def parse_gres_count(gres: str | None, name: str = "gpu") -> int:
    """GPUs in a node/job GRES string: ``gpu:8``, ``gpu:8(S:0)``, ``gpu:a100:4(IDX:0-3)``, ``gpu:tesla:2,mps:100``."""
    total = 0
    for entry in re.split(r",(?![^(]*\))", gres or ""):
        entry = re.sub(r"\(.*?\)", "", entry.strip())
        parts = entry.split(":")
        if not parts or parts[0] != name:
            continue
        try:
            total += int(parts[-1]) if len(parts) > 1 else 1
        except ValueError:
            continue
    return total


def parse_gres_type(gres: str | None, name: str = "gpu") -> str | None:
    """The type of the GPUs in a node GRES string: ``gpu:v100:8(S:0-1)`` -> ``"v100"``; None for
    ``gpu:8`` (no type) and for GPUs of several types (``gpu:v100:4,gpu:k80:4``)."""
    types = set()
    for entry in re.split(r",(?![^(]*\))", gres or ""):
        parts = re.sub(r"\(.*?\)", "", entry.strip()).split(":")
        if parts[0] != name:
            continue
        types.add(parts[1] if len(parts) == 3 and parts[1] else None)  # name:type:count, else untyped
    return types.pop() if len(types) == 1 else None


def gpu_type_from_tres(tres: str | None) -> str | None:
    """The GPU type a TRES string asks for: ``gres:gpu:v100:4`` (22.05), ``gres/gpu:v100:4`` or
    ``gres/gpu:v100=4`` (23+) -> ``"v100"``; None for untyped GPUs (``gres:gpu:4``), no GPUs, and
    GPUs of several types (``gres:gpu:v100:2,gres:gpu:k80:2``: no single type to check)."""
    types = set()
    for entry in (tres or "").split(","):
        m = re.fullmatch(r"(?:gres[:/])?gpu(?::([^:=,]+))?(?:[:=](\d+))?", entry.strip())
        if m:
            t, count = m.groups()
            types.add(None if t is not None and count is None and t.isdigit() else t)  # gres:gpu:4: a count
    return types.pop() if len(types) == 1 else None


def per_gpu_from_tres(tres: str | None) -> int:
    """The per-GPU amount in a per-TRES string (``cpus_per_tres`` / ``memory_per_tres`` of 22.05's squeue:
    ``gres:gpu:3``; ``gres/gpu:3``, ``gres:gpu:v100:3`` too); 0 when it names no GPU entry."""
    for entry in (tres or "").split(","):
        m = re.fullmatch(r"(?:gres[:/])?gpu(?::[^:=,]+)?[:=](\d+)", entry.strip())
        if m:
            return int(m.group(1))
    return 0


def _positive_int(v: Any) -> int | None:
    n = _num(v)
    if n is None or n in (INFINITE32, NO_VAL32) or isinstance(n, float) and not n.is_integer():
        return None
    return int(n) if n >= 1 else None


def _mem_gb(v: Any) -> float | None:
    """Configured memory (MB) in GB of 1024 MB; None for none, unset or Slurm's unconfigured 1 MB."""
    n = _num(v)
    if n is None or n in (INFINITE32, NO_VAL32) or n <= 1:
        return None
    return float(n) / 1024.0


def expand_hostlist(expr: str | None) -> list[str]:
    """Expand a Slurm host list: ``node[1-3,5],gpu7`` -> ``[node1, node2, node3, node5, gpu7]``.

    Zero padding is kept (``n[01-02]`` -> ``n01, n02``). Empty/``(null)`` -> ``[]``.
    """
    expr = (expr or "").strip()
    if not expr or expr in ("(null)", "None"):
        return []
    out: list[str] = []
    for item in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", expr):
        out.extend(_expand_one(item.strip()))
    return out


def _expand_one(item: str) -> list[str]:
    m = re.search(r"\[([^\]]*)\]", item)
    if not m:
        return [item] if item else []
    pre, post = item[: m.start()], item[m.end():]
    names: list[str] = []
    for part in m.group(1).split(","):
        if "-" in part:
            a, b = part.split("-", 1)
            width = len(a) if a.startswith("0") else 0
            names.extend(f"{pre}{i:0{width}d}" for i in range(int(a), int(b) + 1))
        else:
            names.append(pre + part)
    return [x for n in names for x in _expand_one(n + post)]


def compress_nodes(names: Iterable[str]) -> str:
    """Node names for ``ReqNodeList=``: a plain comma list (Slurm accepts it everywhere)."""
    return ",".join(names)


def managed_gpus(admin_comment: str | None) -> int | None:
    """GPUs the user asked for, as job_submit.lua recorded it (``rlsched:managed gpus=N``).

    The controller rewrites a job's TRES when it places it (per-node for
    balanced placements), so the original total is read from here.
    """
    m = re.search(re.escape(MANAGED_MARK) + r"\s+gpus=(\d+)", admin_comment or "")
    return int(m.group(1)) if m else None


#: separates job_submit.lua's mark (``rlsched:managed gpus=N``) from the reason the controller writes
#: after it in a managed job's AdminComment
REASON_SEP = " | "


def with_reason(admin_comment: str | None, reason: str | None) -> str:
    """``admin_comment`` with its reason (the text after :data:`REASON_SEP`) replaced by ``reason``
    (removed when ``reason`` is empty); the mark before it is kept as it is."""
    base = (admin_comment or "").split(REASON_SEP, 1)[0].rstrip()
    return f"{base}{REASON_SEP}{reason}" if reason else base


#: upper ends of the position bands beyond the first 10 places (then x10 each step)
_BANDS = (10, 20, 50)


def _band_edges(n: int) -> tuple[int, int]:
    """(lo, hi) of the band holding ``n`` > 10: 11-20, 21-50, 51-100, 101-200, 201-500, ..."""
    scale, lo = 1, 10
    while True:
        for b in _BANDS:
            hi = b * scale
            if hi > lo:
                if n <= hi:
                    return lo + 1, hi
                lo = hi
        scale *= 10


def queue_position(pos: int, total: int) -> str:
    """Where a held job stands among the ``total`` jobs waiting for placement (1 = next in arrival
    order), as written into its AdminComment: exact up to 10 (``position 3 of 7``), in bands beyond
    (``position 21-50 of more than 500``, the total's band too), so that the text, and
    with it the ``scontrol update`` that writes it, changes only when a job crosses a band edge."""
    if pos < 1 or total < pos:
        raise ValueError(f"queue_position: position {pos} of {total}")
    where = str(pos) if pos <= 10 else "{}-{}".format(*_band_edges(pos))
    of = str(total) if total <= 10 else f"more than {_band_edges(total)[0] - 1}"
    return f"position {where} of {of}"


def _tres_style(*tres: str | None) -> str:
    return "gres/gpu" if any("gres/gpu" in (t or "") for t in tres) else "gres:gpu"


def _gres_detail_per_node(nodes: list[str], detail: Any) -> dict[str, int]:
    """``gres_detail`` is one GRES string per allocated node, in node-list order."""
    if not isinstance(detail, list) or len(detail) != len(nodes):
        return {}
    return {n: parse_gres_count(str(d)) for n, d in zip(nodes, detail)}


# --------------------------------------------------------------------------- command outputs
def _job_from_json(j: dict) -> SlurmJob:
    nodes = expand_hostlist(_str(j.get("nodes")))
    tres = _str(j.get("tres_per_job")) or ""
    gpus = gpus_from_tres(tres)
    per_node = _gres_detail_per_node(nodes, j.get("gres_detail"))
    if not gpus and per_node:
        gpus = sum(per_node.values())
    if not gpus:  # GPUs per node (--gres=gpu:N, or a balanced placement by the controller)
        per = gpus_from_tres(_str(j.get("tres_per_node")))
        gpus = per * max(len(nodes), int(_num(j.get("node_count")) or 1))
    admin = _str(j.get("admin_comment"))
    gpus = managed_gpus(admin) or gpus
    gpu_type = gpu_type_from_tres(tres) if gpus_from_tres(tres) else gpu_type_from_tres(_str(j.get("tres_per_node")))
    prio = _num(j.get("priority"))
    return SlurmJob(
        job_id=int(_num(j.get("job_id")) or 0),
        name=_str(j.get("name")),
        user=_str(j.get("user_name")),
        user_id=int(_num(j.get("user_id")) or 0),
        state=_state(j.get("job_state")).upper(),
        reason=_str(j.get("state_reason")),
        priority=None if prio is None else int(prio),
        partition=_str(j.get("partition")),
        gpus=gpus,
        nodes=nodes,
        gpus_per_node=per_node,
        required_nodes=expand_hostlist(_str(j.get("required_nodes"))),
        num_nodes=int(_num(j.get("node_count")) or 0),
        comment=_str(j.get("comment")),
        admin_comment=_str(j.get("admin_comment")),
        time_limit_s=_time_limit_s(j.get("time_limit")),
        submit_time=_time(j.get("submit_time")),
        start_time=_time(j.get("start_time")),
        eligible_time=_time(j.get("eligible_time")),
        restarts=int(_num(j.get("restart_cnt")) or 0),
        tres_style=_tres_style(tres, _str(j.get("tres_per_node"))),
        dependency="" if _str(j.get("dependency")) == "(null)" else _str(j.get("dependency")),
        requeue=j.get("requeue") is not False,
        batch_host=_str(j.get("batch_host")),
        gpu_type=gpu_type,
        cpus_per_gpu=per_gpu_from_tres(_str(j.get("cpus_per_tres"))),
        mem_gb_per_gpu=per_gpu_from_tres(_str(j.get("memory_per_tres"))) / 1024.0,
    )


def parse_squeue_json(text: str) -> list[SlurmJob]:
    """Jobs from ``squeue --json`` (any state squeue still shows)."""
    doc = _load_json(text, "squeue --json")
    jobs = doc.get("jobs")
    if not isinstance(jobs, list):
        raise ValueError("squeue --json: no 'jobs' list in output")
    return [_job_from_json(j) for j in jobs]


def parse_sinfo_json(text: str) -> list[SlurmNode]:
    """Nodes from ``sinfo --json`` (one entry per node; duplicates per partition merged)."""
    doc = _load_json(text, "sinfo --json")
    raw = doc.get("nodes")
    if raw is None and isinstance(doc.get("sinfo"), list):  # 23.x+: per-partition entries
        raw = [n for e in doc["sinfo"] for n in _sinfo_entry_nodes(e)]
    if not isinstance(raw, list):
        raise ValueError("sinfo --json: no 'nodes' list in output")
    seen: dict[str, SlurmNode] = {}
    for n in raw:
        name = _str(n.get("name") or n.get("hostname"))
        if not name:
            continue
        parts = tuple(str(p) for p in (n.get("partitions") or []))
        if name in seen:  # listed once per partition (23.x+): merge the partitions
            old = seen[name]
            old.partitions = old.partitions + tuple(p for p in parts if p not in old.partitions)
            continue
        state_v = n.get("state")
        flags = tuple(str(f) for f in (n.get("state_flags") or []))
        if isinstance(state_v, list):  # 23.x+: ["IDLE", "DRAIN"]
            flags = flags + tuple(str(s) for s in state_v[1:])
        seen[name] = SlurmNode(
            name=name,
            gpus=parse_gres_count(_str(n.get("gres"))),
            gpus_used=parse_gres_count(_str(n.get("gres_used"))),
            state=_state(state_v).lower(),
            flags=flags,
            partitions=parts,
            gpu_type=parse_gres_type(_str(n.get("gres"))),
            cpus=_positive_int(n.get("cpus")),
            mem_gb=_mem_gb(n.get("real_memory")),
        )
    return list(seen.values())


#: ``sinfo -h -N -a -O`` fields of the node read (:meth:`SlurmCLI.nodes`), in output order: one row per node
#: and partition
NODE_FIELDS = ("NodeList", "PartitionName", "StateComplete", "Gres", "GresUsed", "CPUs", "Memory")


def parse_sinfo_text(text: str, sep: str, end: str) -> list[SlurmNode]:
    """Nodes from ``sinfo -h -N -a -O NodeList:<sep>,...,Memory:<end>`` (:data:`NODE_FIELDS`), the same
    :class:`SlurmNode` fields as :func:`parse_sinfo_json` gives: ``StateComplete`` is the base state and
    its flags joined by ``+`` (``idle+drain``, as 22.05 prints it), ``Gres`` / ``GresUsed`` the node's GRES
    strings, ``Memory`` its RealMemory (MB). A node in several partitions has a row for each; they are
    merged. ``sep`` / ``end`` are random per call; a row with another number of fields, or output that
    does not end with a complete row, is a ValueError. Nodes in no partition are not listed."""
    chunks = text.split(end + "\n")
    if chunks[-1].strip():
        raise ValueError("sinfo: output does not end with a complete row")
    seen: dict[str, SlurmNode] = {}
    for chunk in chunks[:-1]:
        vals = [v.strip() for v in chunk.split(sep)]
        if len(vals) != len(NODE_FIELDS):
            raise ValueError(f"sinfo: a row has {len(vals)} fields, expected {len(NODE_FIELDS)}")
        name, part, state, gres, used, cpus, mem = vals
        if not name:
            continue
        part = _text_none(part)
        if name in seen:
            old = seen[name]
            if part and part not in old.partitions:
                old.partitions = old.partitions + (part,)
            continue
        base, *flags = state.split("+")
        seen[name] = SlurmNode(
            name=name,
            gpus=parse_gres_count(_text_none(gres)),
            gpus_used=parse_gres_count(_text_none(used)),
            state=base.rstrip("*~#!%$@^-").lower(),
            flags=tuple(f.upper() for f in flags if f),
            partitions=(part,) if part else (),
            gpu_type=parse_gres_type(_text_none(gres)),
            cpus=_positive_int(cpus if cpus.isdigit() else None),
            mem_gb=_mem_gb(mem if mem.isdigit() else None),
        )
    return list(seen.values())


def _sinfo_entry_nodes(entry: dict) -> list[dict]:
    """Slurm 24.x ``sinfo --json`` groups nodes by partition and state: ``nodes.nodes`` is a list of
    host names (one per node; a host-list expression is expanded too). CPUs and memory (MB) per node
    are ``cpus.minimum`` and ``memory.minimum`` (the smallest node of the group)."""
    raw = (entry.get("nodes") or {}).get("nodes") or []
    if isinstance(raw, str):
        raw = [raw]
    names = [n for item in raw for n in expand_hostlist(_str(item))]
    gres = _str((entry.get("gres") or {}).get("total"))
    used = _str((entry.get("gres") or {}).get("used"))
    state = (entry.get("node") or {}).get("state")
    part = _str((entry.get("partition") or {}).get("name"))
    cpus = entry.get("cpus")
    mem = entry.get("memory")
    cpus = cpus.get("minimum") if isinstance(cpus, dict) else None
    mem = mem.get("minimum") if isinstance(mem, dict) else None
    return [{"name": n, "gres": gres, "gres_used": used, "state": state, "partitions": [part], "cpus": cpus,
             "real_memory": mem} for n in names]


def _load_json(text: str, what: str) -> dict:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what}: output is not JSON ({exc.msg} at char {exc.pos})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{what}: expected a JSON object")
    errs = doc.get("errors") or []
    if errs:
        raise ValueError(f"{what}: Slurm reported errors: {errs}")
    return doc


# --------------------------------------------------------------------------- dependencies
#: Final job states (the job will not run again unless requeued).
FINAL_STATES = frozenset(
    ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED")
)
_DEP_ITEM = re.compile(r"(\w+)(?::([^()]*))?(?:\((\w+)\))?")


def _one_dependency(kind: str, targets: str, status: str | None, job: SlurmJob, by_id: Mapping[int, SlurmJob]) -> bool | None:
    if status == "failed":  # Slurm found it can never be satisfied
        return False
    if kind == "singleton":  # no other job of the same name and user may run
        return not any(o.job_id != job.job_id and o.name == job.name and o.user_id == job.user_id and o.running
                       for o in by_id.values())
    if kind not in ("after", "afterany", "afterok", "afternotok"):
        return None  # aftercorr, afterburstbuffer, expand: left to Slurm
    met: bool | None = True
    for t in targets.split(":"):
        tid, _, delay = t.partition("+")
        if not tid.isdigit():  # an array element (12_3, 12_*): left to Slurm
            return None
        o = by_id.get(int(tid))
        if o is None:  # purged by Slurm: long finished
            continue
        if kind == "after":
            ok = not o.pending
        elif kind == "afterany":
            ok = o.state in FINAL_STATES
        elif kind == "afterok":
            if o.state in FINAL_STATES and o.state != "COMPLETED":
                return False
            ok = o.state == "COMPLETED"
        else:  # afternotok
            if o.state == "COMPLETED":
                return False
            ok = o.state in FINAL_STATES
        if not ok:
            return False
        if delay:  # "+minutes" after the target started / ended: Slurm keeps the clock
            met = None
    return met


def dependency_met(job: SlurmJob, by_id: Mapping[int, SlurmJob]) -> bool | None:
    """Whether a held job's ``--dependency`` is satisfied, judged from the other jobs' states.

    Slurm does not re-evaluate the dependencies of a held job (22.05: a held job's list still
    reads ``afterany:4(unfulfilled)`` long after job 4 ended), so the controller must, or it
    would release jobs that cannot start. ``True``: no dependency or all met (``?``-lists: one);
    ``False``: not yet, or never (``(failed)``); ``None``: cannot tell here (array elements,
    ``+minutes`` delays, ``aftercorr``...): Slurm decides once the job is released.

    :param by_id: every job squeue shows, by id (a target missing from it has been purged, i.e.
        ended long ago, and counts as met).
    """
    dep = (job.dependency or "").strip()
    if not dep or dep == "(null)":
        return True
    any_of = "?" in dep
    results = []
    for item in re.split(r"[,?]", dep):
        m = _DEP_ITEM.fullmatch(item.strip())
        if m is None:
            return None
        kind, targets, status = m.groups()
        results.append(_one_dependency(kind, targets or "", status, job, by_id))
    if any_of:
        return True if True in results else (None if None in results else False)
    return False if False in results else (None if None in results else True)


# --------------------------------------------------------------------------- squeue's text output
#: ``squeue -O`` fields of the cheap queue read (:meth:`SlurmCLI.queue`), in output order: everything
#: that changes while a job waits or runs. ``Comment`` (the user's workload declaration, free text)
#: comes last; AdminComment and the per-node GRES of a running job are not among 22.05's ``-O`` fields
QUEUE_FIELDS = ("JobID", "State", "PriorityLong", "Reason", "Partition", "NodeList", "NumNodes", "tres-per-job",
                "tres-per-node", "RestartCnt", "Requeue", "BatchHost", "ReqNodes", "StartTime", "EligibleTime",
                "Dependency", "Comment")


def _text_none(v: str) -> str:
    return "" if v in ("N/A", "n/a", "(null)", "None") else v


_TEXT_TIME = re.compile(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)")


def _text_time(v: str) -> float | None:
    """squeue's local ``2026-11-26T20:23:41`` as epoch seconds; None for ``N/A``, ``Unknown``, ``None``."""
    m = _TEXT_TIME.fullmatch(v)
    if m is None:
        return None
    try:  # time.strptime costs ~50 us a call (it looks the locale up each time); this a few
        return datetime.datetime(*map(int, m.groups())).timestamp()
    except (OverflowError, ValueError):
        return None


def parse_squeue_text(text: str, sep: str, end: str) -> list[dict[str, str]]:
    """Rows of ``squeue -h -O F1:<sep>,...,Comment:<end>``: one dict per job, :data:`QUEUE_FIELDS` -> text.

    ``sep`` / ``end`` are random per call (:meth:`SlurmCLI.queue`), so no job's text can contain them:
    a row is everything up to ``end`` and a newline, its fields are split at ``sep``. A row with another
    number of fields is an error (ValueError)."""
    return [squeue_row(chunk, sep) for chunk in squeue_chunks(text, end)]


def squeue_chunks(text: str, end: str) -> list[str]:
    """The rows of ``squeue -h -O ...,Comment:<end>`` output as text, each without its ``end`` and newline
    (ValueError when the output does not end with a complete row)."""
    chunks = text.split(end + "\n")
    if chunks[-1].strip():
        raise ValueError("squeue: output does not end with a complete row")
    return chunks[:-1]


def squeue_row(chunk: str | Sequence[str], sep: str) -> dict[str, str]:
    """One row of :func:`squeue_chunks` (or its fields, split at ``sep``): :data:`QUEUE_FIELDS` -> text
    (stripped, the comment as it is); ValueError when it has another number of fields."""
    vals = chunk.split(sep) if isinstance(chunk, str) else chunk
    if len(vals) != len(QUEUE_FIELDS):
        raise ValueError(f"squeue: a row has {len(vals)} fields, expected {len(QUEUE_FIELDS)}")
    row = dict(zip(QUEUE_FIELDS, (v.strip() for v in vals)))
    row["Comment"] = vals[-1]
    return row


def cons_tres_split(nodes: Sequence[int], gpus: int, free: Sequence[int] | Mapping[int, int],
                    per_node: int | None = None) -> dict[int, int] | None:
    """The per-node GPU split Slurm's cons_tres gives a job pinned to ``nodes`` (node indices).

    ``per_node`` (``TresPerNode``): exactly that many on each node. Otherwise (``TresPerJob`` of
    ``gpus``): one GPU on each node, then the rest filled in node order (ascending index, Slurm's
    node table order), each node up to its ``free`` GPUs (``free[n]``: a sequence or a mapping by node
    index). Measured on slurmctld 22.05.8 (docs/SLURM.md, "Per-node split").
    ``None`` when it does not fit.
    """
    order = sorted(set(nodes))
    if not order:
        return None
    if per_node is not None:
        if per_node * len(order) != gpus or any(free[n] < per_node for n in order):
            return None
        return {n: per_node for n in order}
    if gpus < len(order) or any(free[n] < 1 for n in order):
        return None
    split = {n: 1 for n in order}
    left = gpus - len(order)
    for n in order:
        take = min(left, int(free[n]) - 1)
        split[n] += take
        left -= take
    return split if left == 0 else None


def _running_split(nodes: list[str], gpus: int, tres_per_node: str) -> dict[str, int] | None:
    """The per-node GPUs of a running job when its text row tells them: all on its one node, or
    ``TresPerNode`` on each node (the controller's balanced placements); None otherwise."""
    if len(nodes) == 1 and gpus > 0:
        return {nodes[0]: gpus}
    per = gpus_from_tres(tres_per_node)
    if nodes and per > 0 and per * len(nodes) == gpus:
        return {n: per for n in nodes}
    return None


def overlay_text(job: SlurmJob, row: Mapping[str, str]) -> SlurmJob | None:
    """``job`` (from the last ``squeue --json``) with the fields of its text ``row`` (:func:`parse_squeue_text`),
    or None when the row is a change the text cannot describe (it started on several nodes with an
    uneven split since that JSON read and still holds them: its per-node GPUs are only in the JSON).
    An ended job that was not running at that read gets the split its row tells, else none."""
    nodes = expand_hostlist(_text_none(row["NodeList"]))
    tres_job, tres_node = _text_none(row["tres-per-job"]), _text_none(row["tres-per-node"])
    gpus = gpus_from_tres(tres_job)
    if not gpus:
        gpus = gpus_from_tres(tres_node) * max(len(nodes), int(row["NumNodes"] or 1))
    gpus = managed_gpus(job.admin_comment) or gpus or job.gpus
    restarts = int(row["RestartCnt"])
    state = row["State"].upper()
    per_node: dict[str, int] = {}
    if nodes:
        if job.nodes == nodes and job.restarts == restarts:
            per_node = dict(job.gpus_per_node)  # a job's allocation does not change while it has it
        else:
            split = _running_split(nodes, gpus, tres_node)
            if split is None and state in ("RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED"):
                return None  # the controller needs the split of a job that holds GPUs
            per_node = split or {}
    prio = int(row["PriorityLong"])
    return dataclasses.replace(
        job, state=state, reason=row["Reason"], priority=prio, partition=row["Partition"], gpus=gpus, nodes=nodes,
        gpus_per_node=per_node, required_nodes=expand_hostlist(_text_none(row["ReqNodes"])),
        num_nodes=int(row["NumNodes"] or 0), restarts=restarts, requeue=row["Requeue"] != "0",
        batch_host=_text_none(row["BatchHost"]), start_time=_text_time(row["StartTime"]) if nodes else job.start_time,
        eligible_time=_text_time(row["EligibleTime"]), dependency=_text_none(row["Dependency"]),
        comment=_text_none(row["Comment"]), tres_style=_tres_style(tres_job, tres_node))


# --------------------------------------------------------------------------- the adapter
class SlurmCLI:
    """Runs Slurm commands with a timeout; every failure is a :class:`SlurmError`.

    :param conf: slurm.conf to use (``SLURM_CONF``); ``None``: Slurm's default.
    :param timeout_s: per-command time limit in seconds.
    :param bin_dir: where the Slurm commands are (``None``: ``PATH``).
    :param rpc_workers: libslurm update RPCs :meth:`pin_release_many` sends at once (1: in order).
    """

    #: Slurm gives an uneven (``TresPerJob``) placement its own split (:func:`cons_tres_split`): the controller
    #: sends only splits it applies exactly (:meth:`controller.backend.SlurmBackend._slurm_split`)
    fills_splits = True

    def __init__(self, conf: str | None = None, timeout_s: float = 20.0, bin_dir: str | None = None,
                 full_read_s: float = 60.0, libslurm: bool = False, rpc_workers: int = 8) -> None:
        self.conf = conf
        #: whether :meth:`pin_release_many` may use libslurm (it does only with ``conf`` given and no
        #: ``bin_dir``: commands from a directory of their own are what the caller wants run)
        self.libslurm = libslurm
        self._lib: Any = None
        self._lib_tried = False
        self._lib_lock = threading.Lock()
        self.timeout_s = timeout_s
        self.bin_dir = bin_dir
        self.full_read_s = full_read_s
        self.calls = 0  # commands run (for metrics/tests)
        self._lock = threading.Lock()
        #: the last ``squeue --json`` read by :meth:`queue`: job id -> job, and when (monotonic s)
        self._known: dict[int, SlurmJob] = {}
        self._known_t = -float("inf")
        self._pools: dict[int, ThreadPoolExecutor] = {}  # threads of set_admin_comments, pin_release_many
        #: update RPCs :meth:`pin_release_many` keeps in flight at once (1: one after another)
        self.rpc_workers = rpc_workers
        #: whether :meth:`nodes` reads sinfo's text (until its output is found not to be the rows asked for)
        self._node_text = True
        self._queue_text = True
        #: how :meth:`queue` read the queue: "json" or "text" reads so far
        self.queue_reads = {"json": 0, "text": 0}
        #: jobs whose per-node GPUs :meth:`queue` read through libslurm (one job each) instead of the JSON
        self.detail_reads = 0
        #: :meth:`queue`'s text rows as of its last read: job id text -> (row fields, the job they were
        #: laid over, the job they gave); a row that reads the same over the same job gives that job again
        self._rows: dict[str, tuple[list[str], SlurmJob, SlurmJob]] = {}

    # ------------------------------------------------------------------ plumbing
    def _cmd(self, name: str) -> str:
        return os.path.join(self.bin_dir, name) if self.bin_dir else name

    def run(self, args: Sequence[str], stdin: str | None = None) -> str:
        """Run one Slurm command (``stdin``: text fed to it), return its stdout; raise SlurmError on any
        failure."""
        cmd = [self._cmd(args[0]), *args[1:]]
        env = dict(os.environ)
        if self.conf:
            env["SLURM_CONF"] = self.conf
        with self._lock:
            self.calls += 1
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=self.timeout_s, env=env, check=False,
                                  input=stdin, stdin=None if stdin is not None else subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise SlurmError(cmd, f"timed out after {self.timeout_s:g} s", timed_out=True) from None
        except OSError as exc:
            raise SlurmError(cmd, f"cannot run: {exc.strerror or exc}") from None
        if proc.returncode != 0:
            msg = (proc.stderr or proc.stdout or "").strip().splitlines()
            raise SlurmError(cmd, f"exit status {proc.returncode}: {msg[-1] if msg else 'no message'}")
        return proc.stdout

    def _parse(self, args: Sequence[str], parser, text: str):
        try:
            return parser(text)
        except (ValueError, KeyError, TypeError) as exc:
            raise SlurmError(list(args), f"unexpected output: {exc}") from None

    # ------------------------------------------------------------------ reading
    def nodes(self) -> list[SlurmNode]:
        """Every node in a partition, from ``sinfo -h -N -a -O`` text (:func:`parse_sinfo_text`; about half of
        ``sinfo --json``'s time for 64 nodes on 22.05) with field and row separators random per call.
        Where that output is not the rows asked for (a Slurm whose ``-O`` fields differ, a wrapper that
        answers in JSON), ``sinfo --json`` (:func:`parse_sinfo_json`), from then on."""
        if self._node_text:
            sep, end = "S" + secrets.token_hex(8), "E" + secrets.token_hex(8)
            fmt = ",".join(f"{f}:{sep}" for f in NODE_FIELDS[:-1]) + f",{NODE_FIELDS[-1]}:{end}"
            args = ["sinfo", "-h", "-N", "-a", "-O", fmt]
            out = self.run(args)
            try:
                return parse_sinfo_text(out, sep, end)
            except ValueError as exc:
                self._node_text = False
                log.info("sinfo -O output not as asked (%s): reading nodes with sinfo --json", exc)
        args = ["sinfo", "--json"]
        return self._parse(args, parse_sinfo_json, self.run(args))

    def jobs(self) -> list[SlurmJob]:
        """All jobs squeue shows (``squeue --json`` ignores filters before 23.x; filter in Python)."""
        args = ["squeue", "--json"]
        return self._parse(args, parse_squeue_json, self.run(args))

    def job(self, job_id: int) -> SlurmJob | None:
        """One job (``None`` once Slurm has purged it). A job of the last ``squeue --json`` read is read
        alone, as its ``squeue -h -t all -O ... -j ID`` text row laid over that read (:func:`overlay_text`,
        the separators random per call as in :meth:`queue`; a few ms against 0.3 to 1.1 s for the JSON of
        1,000 jobs); any other job, or a row the text cannot describe, from :meth:`jobs`.

        Not ``scontrol show job``: its ``Key=Value`` text cannot be parsed safely
        (a user's comment or job name may hold `` JobState=...``)."""
        jid = int(job_id)
        old = self._known.get(jid)
        if self._queue_text and old is not None:
            sep, end = "S" + secrets.token_hex(8), "E" + secrets.token_hex(8)
            fmt = ",".join(f"{f}:{sep}" for f in QUEUE_FIELDS[:-1]) + f",{QUEUE_FIELDS[-1]}:{end}"
            args = ["squeue", "-h", "-t", "all", "-O", fmt, "-j", str(jid)]
            try:
                rows = parse_squeue_text(self.run(args), sep, end)
                row = next((r for r in rows if r["JobID"] == str(jid)), None)
                new = overlay_text(old, row) if row is not None else None
            except (SlurmError, ValueError):  # purged ("Invalid job id"), or not the rows asked for
                new = None
            if new is not None:
                return new
        return next((j for j in self.jobs() if j.job_id == jid), None)

    def queue(self) -> list[SlurmJob]:
        """All jobs, as :meth:`jobs` gives them, from a cheaper read where it can: ``squeue -h -t all -O``
        of :data:`QUEUE_FIELDS` (about a fifth of ``squeue --json``'s time for 1,000 jobs on 22.05),
        laid over the jobs of the last ``squeue --json`` (:func:`overlay_text`). The JSON is read again
        when the text shows a job it does not have, a job started on several nodes with an uneven
        split (where libslurm is in use, that job alone is read through it instead:
        :meth:`_with_detail`, one RPC of a few ms against 0.3 to 1.1 s for 1,000 jobs of JSON on a loaded host), or when
        it is ``full_read_s`` old (the fields only it has, AdminComment aside, which
        :meth:`set_admin_comment` keeps, are at most that stale: job name, user, time limit, submit
        time). A job's requested GPU type, CPUs per GPU and memory per GPU (:class:`SlurmJob`
        ``gpu_type``, ``cpus_per_gpu``, ``mem_gb_per_gpu``) come from that JSON read too: a user cannot
        change them (job_submit.lua's allowlist) and a pin keeps them (its TRES keeps the type:
        :attr:`SlurmJob.pin_tres`; ``cpus_per_tres`` / ``memory_per_tres`` survive the update and a
        requeue, checked on slurmctld 22.05). The text's separators are random per call, so no job's
        text can forge a field. A row that reads as at the last read, over the same JSON job, gives the
        job object of that read again (for 1,000 queued jobs most rows do): the jobs returned are shared
        between reads, to be read, not changed. Where the text is not the rows asked for (a Slurm whose
        ``-O`` fields differ, a wrapper that answers in JSON), every read is ``squeue --json`` from then on."""
        chunks: list[list[str]] | None = None
        if self._queue_text and time.monotonic() - self._known_t < self.full_read_s:
            sep, end = "S" + secrets.token_hex(8), "E" + secrets.token_hex(8)
            fmt = ",".join(f"{f}:{sep}" for f in QUEUE_FIELDS[:-1]) + f",{QUEUE_FIELDS[-1]}:{end}"
            args = ["squeue", "-h", "-t", "all", "-O", fmt]
            text = self.run(args)
            try:
                chunks = [c.split(sep) for c in squeue_chunks(text, end)]
                bad = next((len(v) for v in chunks if len(v) != len(QUEUE_FIELDS)), None)
                if bad is not None:
                    raise ValueError(f"a row has {bad} fields, expected {len(QUEUE_FIELDS)}")
            except ValueError as exc:
                chunks, self._queue_text = None, False
                log.info("squeue -O output not as asked (%s): reading the queue with squeue --json", exc)
        if chunks is not None:
            out: list[SlurmJob] | None = []
            rows: dict[str, tuple[list[str], SlurmJob, SlurmJob]] = {}
            for vals in chunks:
                jid = vals[0].strip()
                seen = self._rows.get(jid)
                try:
                    old = self._known.get(int(jid))
                    if seen is not None and seen[1] is old and seen[0] == vals:
                        new: SlurmJob | None = seen[2]  # unchanged since the last read
                    else:
                        row = self._parse(args, lambda v: squeue_row(v, sep), vals)
                        new = overlay_text(old, row) if old is not None else None
                        if new is None and old is not None:  # started on several nodes, unevenly
                            old = self._with_detail(old, row)
                            new = overlay_text(old, row) if old is not None else None
                except ValueError:  # an array element's "12_3", an unexpected number: the JSON knows
                    new = None
                if new is None or old is None:
                    out = None
                    break
                out.append(new)
                rows[jid] = (vals, old, new)
            if out is not None:
                self.queue_reads["text"] += 1
                self._rows = rows
                return out
        t = time.monotonic()
        jobs = self.jobs()
        self.queue_reads["json"] += 1
        self._known, self._known_t = {j.job_id: j for j in jobs}, t
        return [dataclasses.replace(j, nodes=list(j.nodes), gpus_per_node=dict(j.gpus_per_node),
                                    required_nodes=list(j.required_nodes)) for j in jobs]

    def refresh_due(self, ahead_s: float) -> bool:
        """Whether :meth:`queue` would read every job as JSON within ``ahead_s`` seconds (its last JSON read
        ``full_read_s`` old by then)."""
        return time.monotonic() + ahead_s - self._known_t >= self.full_read_s

    def refresh(self) -> None:
        """Read ``squeue --json`` now, as the jobs :meth:`queue` lays its text over (and from then on counts
        ``full_read_s`` from): the controller calls it behind a round, between rounds, so that the periodic
        JSON read of every job is not one round's work (0.3 to 1.1 s for 1,000 jobs on this host).
        :class:`SlurmError` as :meth:`jobs`; nothing changes then."""
        t = time.monotonic()
        jobs = self.jobs()
        self._known, self._known_t = {j.job_id: j for j in jobs}, t
        self.queue_reads["json"] += 1

    def _with_detail(self, job: SlurmJob, row: Mapping[str, str]) -> SlurmJob | None:
        """``job`` (of the last JSON read) with the nodes, restart count and per-node GPUs it holds now, read
        for this one job through libslurm (:meth:`controller.libslurm.LibSlurm.job_detail`, one RPC), where
        :meth:`queue` would otherwise read every job as JSON for them; kept as the job that later text rows
        are laid over. ``None`` where libslurm is not in use or its answer is not the allocation of the text
        ``row`` (another start in between): the JSON read then."""
        lib = self._libslurm()
        if lib is None or getattr(lib, "job_info", None) is None:
            return None
        from controller.libslurm import LibSlurmError

        nodes = expand_hostlist(_text_none(row["NodeList"]))
        with self._lock:
            self.calls += 1
        try:
            d = lib.job_detail(job.job_id)
            restarts = int(row["RestartCnt"])
        except (LibSlurmError, ValueError) as exc:
            log.info("job %s: per-node GPUs not read through libslurm (%s): reading the queue as JSON", job.job_id, exc)
            return None
        if d is None or expand_hostlist(d.nodes) != nodes or d.restarts != restarts:
            return None
        split = _gres_detail_per_node(nodes, list(d.gres_detail))
        if not split or min(split.values()) < 1:
            return None
        self.detail_reads += 1
        new = dataclasses.replace(job, nodes=nodes, restarts=restarts, gpus_per_node=split)
        self._known[job.job_id] = new
        return new

    # ------------------------------------------------------------------ acting
    @staticmethod
    def pin_args(job_id: int, nodes: Sequence[str], gpus: int, per_node: int | None = None,
                 tres_style: str = "gres:gpu", delay_s: int = 0, tasks: int | None = None) -> list[str]:
        """The ``scontrol update`` arguments (after ``update``) that pin a held job: see :meth:`place`.
        ``tasks``: also set the job's task count and its minimum CPUs to it (``NumTasks``, ``NumCPUs``; a
        resized job runs one task per GPU). Slurm 22.05 keeps a requeued job's node count at its last
        allocation's when ``NumNodes`` is lowered without ``NumCPUs`` (the job then never starts on fewer
        nodes: ``BadConstraints``); with ``NumCPUs`` in the same update it takes both."""
        if not nodes:
            raise ValueError("place: empty node list")
        if per_node is not None and per_node * len(nodes) != gpus:
            raise ValueError(f"place: {per_node} GPUs on each of {len(nodes)} nodes is not {gpus}")
        for v in (*nodes, tres_style):
            if not v or any(ch.isspace() or ch in "\"'=" for ch in v):
                raise ValueError(f"place: {v!r} cannot be written into an scontrol command")
        tres = (["TresPerJob=", f"TresPerNode={tres_style}:{per_node}"] if per_node is not None
                else ["TresPerNode=", f"TresPerJob={tres_style}:{gpus}"])
        start = f"StartTime=now+{int(delay_s)}" if delay_s > 0 else "StartTime=now"
        ntasks = [f"NumTasks={int(tasks)}", f"NumCPUs={int(tasks)}"] if tasks is not None else []
        return [f"JobId={int(job_id)}", f"ReqNodeList={compress_nodes(nodes)}", f"NumNodes={len(nodes)}", *ntasks,
                *tres, start]

    def place(self, job_id: int, nodes: Sequence[str], gpus: int, per_node: int | None = None,
              tres_style: str = "gres:gpu", delay_s: int = 0, tasks: int | None = None) -> None:
        """Pin a held job to exactly ``nodes`` (it stays held until :meth:`release`).

        ``per_node``: a balanced placement, ``per_node`` GPUs on each node,
        expressed exactly as ``TresPerNode`` (``TresPerJob`` cleared in the
        same update, which 22.05 accepts). Otherwise ``TresPerJob=gpus`` and
        Slurm splits the total over the nodes, filling them in node order.
        ``tres_style`` is the TRES prefix written before the count: ``gres:gpu`` (22.05), ``gres/gpu``
        (23+), with the job's GPU type where it asked for one (``gres:gpu:v100``; :attr:`SlurmJob.pin_tres`).
        The same update sets ``StartTime=now`` (``now+delay_s`` with ``delay_s > 0``;
        the job stays held; this replaces the 120 s BeginTime Slurm adds after a
        requeue), so that :meth:`release` needs no update of its own.
        """
        self.run(["scontrol", "update", *self.pin_args(job_id, nodes, gpus, per_node, tres_style, delay_s, tasks)])

    def place_many(self, pins: Sequence[Sequence[str]]) -> None:
        """Apply several pins (each :meth:`pin_args`) in one ``scontrol`` process: its command mode
        reads one ``update ...`` line per job from stdin (the values hold no spaces or quotes, which
        that mode would keep). :class:`SlurmError` when any of them failed (scontrol's exit status
        says that one did, not which): the caller pins them one by one then (a pin is idempotent)."""
        if pins:
            self.run(["scontrol"], stdin="".join("update " + " ".join(p) + "\n" for p in pins) + "quit\n")

    def _libslurm(self):
        """The :class:`controller.libslurm.LibSlurm` of this adapter's ``slurm.conf``, or ``None`` (opened once)."""
        with self._lib_lock:  # (the reason writes call it from threads of their own)
            if not self._lib_tried:
                self._lib_tried = True
                if self.libslurm and self.conf and not self.bin_dir:
                    from controller.libslurm import open_libslurm

                    self._lib = open_libslurm(self.conf)
                    log.info("libslurm %s for pins, releases and reasons", "in use" if self._lib is not None else
                             "not usable (library, release or slurm.conf): scontrol")
            return self._lib

    def pin_release_many(self, pins: Sequence[tuple[int, Sequence[str], int, int | None, str, int]]
                         ) -> list[SlurmError | None] | None:
        """Pin and release each held job of ``pins`` (``(job_id, nodes, gpus, per_node, tres_style,
        delay_s)``, as :meth:`place` takes them) in ONE update RPC per job, through libslurm in this process
        (:mod:`controller.libslurm`: ``scontrol`` cannot send a release with other fields on 22.05). Returns
        one entry per pin: ``None`` when Slurm took it, else its :class:`SlurmError` (``timed_out`` when
        slurmctld may have applied it: no answer came); a refused pin leaves the job held. ``None`` (nothing
        sent) where libslurm is not in use: the caller pins with :meth:`place_many` and releases with
        :meth:`release_many`. Up to :attr:`rpc_workers` updates are in flight at once (each waits in
        slurmctld for its job write lock, which launching jobs also take; the waits overlap), except when a
        pin is an uneven split over several nodes (``per_node`` None): which split Slurm gives it depends on
        the order the releases arrive in, so all of that call's updates go one after another, in order."""
        lib = self._libslurm()
        if lib is None:
            return None
        from controller.libslurm import LibSlurmError, pin_update

        sends = []
        for job_id, nodes, gpus, per_node, tres_style, delay_s in pins:
            args = self.pin_args(job_id, nodes, gpus, per_node, tres_style, delay_s)  # checks the values
            sends.append((args, pin_update(job_id, args[1].split("=", 1)[1], len(nodes), gpus, per_node, tres_style,
                                           delay_s, release=True)))

        def one(send) -> SlurmError | None:
            args, up = send
            with self._lock:
                self.calls += 1
            try:
                lib.update(up)
            except LibSlurmError as exc:
                return SlurmError(["slurm_update_job", *args, "Priority=INFINITE"], exc.message, timed_out=exc.unsure)
            return None

        # an uneven TresPerJob split depends on which jobs start first, which depends on the order their
        # releases reach slurmctld (controller.backend.SlurmBackend._slurm_split): those rounds go in order
        uneven = any(per_node is None and len(set(nodes)) > 1 for _, nodes, _, per_node, _, _ in pins)
        if uneven or self.rpc_workers <= 1 or len(sends) <= 1:
            return [one(x) for x in sends]
        return list(self._pool(self.rpc_workers).map(one, sends))

    def _pool(self, workers: int) -> ThreadPoolExecutor:
        """The adapter's pool of ``workers`` threads (one per worker count, kept for the adapter's life: starting
        threads each round cost tens of ms on a loaded host)."""
        with self._lock:
            pool = self._pools.get(workers)
            if pool is None:
                pool = self._pools[workers] = ThreadPoolExecutor(max(1, workers), thread_name_prefix="rlsched-slurm")
        return pool

    def release(self, job_id: int, delay_s: int = 0) -> None:
        """Release a held job that :meth:`place` pinned, to start in ``delay_s`` seconds.

        :meth:`place` set ``StartTime=now``; with ``delay_s > 0`` it becomes
        ``now+delay_s`` first: a few seconds are kept for requeued jobs (a batch
        job relaunched on the node it just left within ~1 s can fail to launch
        while the old step is still being cleaned up).
        """
        if delay_s > 0:
            self.run(["scontrol", "update", f"JobId={job_id}", f"StartTime=now+{int(delay_s)}"])
        self.run(["scontrol", "release", str(job_id)])

    def release_many(self, job_ids: Sequence[int]) -> None:
        """Release held jobs in one ``scontrol release a,b,c`` per 200 jobs (their start times were set
        when pinned). :class:`SlurmError` when Slurm refused any of them: the caller reads the queue to
        see which were released."""
        ids = [int(j) for j in job_ids]
        for k in range(0, len(ids), 200):
            self.run(["scontrol", "release", ",".join(str(j) for j in ids[k:k + 200])])

    def hold(self, job_id: int) -> None:
        """Hold a pending job again, as a *user* hold (``uhold``, reason ``JobHeldUser``).

        Not ``scontrol hold``: run by the controller (an operator) that would be an admin
        hold, which rlsched reads as "an administrator wants this job left alone"
        (:attr:`SlurmJob.admin_held`). The owner still cannot release it: job_submit.lua's
        ``slurm_job_modify`` refuses priority changes of managed jobs."""
        self.run(["scontrol", "uhold", str(job_id)])

    def set_admin_comment(self, job_ids: Sequence[int], text: str) -> None:
        """Set the AdminComment of every job in ``job_ids`` to ``text``: one ``scontrol update
        JobId=a,b,c AdminComment=...`` per 200 jobs (scontrol takes a job list; its command mode
        read from stdin would keep quotes in the value, so jobs with different texts take one call
        each). Only an operator (the controller) may set it; users can read it
        (``scontrol show job``, ``squeue --json``). Through libslurm where :meth:`pin_release_many` uses it:
        the same update RPC per job, from this process (every job is tried; :class:`SlurmError` names the
        first refused one)."""
        ids = [int(j) for j in job_ids]
        lib = self._libslurm()
        if lib is not None:
            from controller.libslurm import LibSlurmError, Update

            first: SlurmError | None = None
            for j in ids:
                with self._lock:
                    self.calls += 1
                try:
                    lib.update(Update(j, {"admin_comment": text}))
                except LibSlurmError as exc:
                    first = first or SlurmError(["slurm_update_job", f"JobId={j}", "AdminComment=..."], exc.message,
                                                timed_out=exc.unsure)
                    continue
                if j in self._known:
                    self._known[j] = dataclasses.replace(self._known[j], admin_comment=text)
            if first is not None:
                raise first
            return
        for k in range(0, len(ids), 200):
            part = ids[k:k + 200]
            self.run(["scontrol", "update", "JobId=" + ",".join(str(j) for j in part), f"AdminComment={text}"])
            for j in part:  # what queue() lays the text read over
                if j in self._known:
                    self._known[j] = dataclasses.replace(self._known[j], admin_comment=text)

    def set_admin_comments(self, groups: Sequence[tuple[str, Sequence[int]]],
                           workers: int = 8) -> list[SlurmError | None]:
        """:meth:`set_admin_comment` for each ``(text, job ids)`` of ``groups``, up to ``workers`` ``scontrol``
        processes at a time (each text needs a process of its own; slurmctld takes the updates one after
        another, the processes' start-up and credentials overlap). Returns, per group, None when it was
        written, else its :class:`SlurmError`."""
        def one(g: tuple[str, Sequence[int]]) -> SlurmError | None:
            try:
                self.set_admin_comment(g[1], g[0])
            except SlurmError as exc:
                return exc
            return None

        if len(groups) <= 1:
            return [one(g) for g in groups]
        return list(self._pool(workers).map(one, groups))

    def unplace(self, job_id: int) -> None:
        """Clear a held job's node pin (it goes back to the pool)."""
        self.run(["scontrol", "update", f"JobId={job_id}", "ReqNodeList=", "NumNodes=1"])

    def requeue_hold(self, job_id: int) -> None:
        """Requeue a running (or just finished) batch job in held state."""
        self.run(["scontrol", "requeuehold", str(job_id)])

    def version(self) -> str:
        return self.run(["sinfo", "--version"]).strip()
