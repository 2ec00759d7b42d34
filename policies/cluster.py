"""Cluster description and placements.

A cluster is an ordered list of nodes, each with a number of GPUs and, optionally, their type
(with a speed factor, :mod:`policies.gputypes`), CPUs, memory and the switch it hangs off. Nodes
are referred to by their index in that list (0-based) everywhere inside the project; names only
matter at the edges (Slurm, reports).

A :class:`Placement` maps node indices to GPU counts, e.g. ``{0: 4, 2: 4}``
places an 8-GPU job on nodes 0 and 2 with 4 GPUs each.
"""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Iterable, Mapping

__all__ = [
    "ClusterSpecError", "NodeSpec", "ClusterSpec", "Placement", "MAX_NODES", "MAX_GPUS_PER_NODE", "NODE_ATTRS",
    "is_finite_number",
]

#: Keys a cluster file may hold at its top level and in each ``nodes`` entry (anything else is a typo).
FILE_KEYS = ("nodes", "intra_bw_gbps", "inter_bw_gbps", "ps_placement")
#: Where a cluster runs elastic jobs' parameter servers (:attr:`ClusterSpec.ps_placement`).
PS_PLACEMENTS = ("workers", "spread")
NODE_KEYS = ("name", "gpus", "count", "gpu_type", "gpu_speed", "cpus", "mem_gb", "switch")
#: The optional node attributes (everything of :class:`NodeSpec` but name and GPU count).
NODE_ATTRS = ("gpu_type", "gpu_speed", "cpus", "mem_gb", "switch")
#: A GPU type name: letters, digits, ``_ . -`` (as in Slurm GRES types, ``gpu:v100:8``).
GPU_TYPE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")
#: One group of an ``NxG[:TYPE]`` spec (groups are joined by ``+``).
_GROUP_RE = r"([0-9]+)\s*[xX]\s*([0-9]+)(?:\s*:\s*([A-Za-z0-9][A-Za-z0-9_.\-]*))?"
_SPEC_RE = re.compile(rf"{_GROUP_RE}(?:\s*\+\s*{_GROUP_RE})*")

#: Most nodes of a cluster (``NxG`` or a file). Real clusters stay far below it (the largest this repository
#: uses is 128x8); the simulator keeps per-node state, so ``100000000x8`` took gigabytes and never started.
MAX_NODES = 65_536
#: Most GPUs of one node (today's largest nodes hold 8 to 16).
MAX_GPUS_PER_NODE = 64


class ClusterSpecError(ValueError):
    """Raised for a malformed cluster specification."""


def _yaml_load(path: Path, raw: str):
    """``yaml.safe_load`` of a cluster file that refuses a key given twice in one mapping (plain YAML keeps
    the last) and reports a syntax error as one line naming the file and line."""
    import yaml

    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):  # type: ignore[override]
            if isinstance(node, yaml.MappingNode):
                seen: set = set()
                for key_node, _value in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":  # "<<: *anchor": keys given here override it
                        continue
                    key = self.construct_object(key_node, deep=True)
                    try:
                        repeated = key in seen
                        seen.add(key)
                    except TypeError:  # an unhashable key: the base class reports it
                        continue
                    if repeated:
                        line = key_node.start_mark.line + 1
                        raise ClusterSpecError(f"{path}: line {line}: key {key!r} appears twice in one mapping")
            return super().construct_mapping(node, deep=deep)

    try:
        return yaml.load(raw, Loader=Loader)  # a SafeLoader subclass: safe
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        what = str(exc.problem or exc.context or "not YAML")
        if exc.context and exc.problem:
            cm = exc.context_mark
            what += f" ({exc.context}{f' at line {cm.line + 1}' if cm is not None else ''})"
        raise ClusterSpecError(f"{path}: cannot parse cluster file: {where}{' '.join(what.split())}") from None
    except yaml.YAMLError as exc:
        text = " ".join(str(exc).split())
        raise ClusterSpecError(f"{path}: cannot parse cluster file: {text}") from None


def _check_keys(path: Path, where: str, doc: Mapping, known: tuple[str, ...]) -> None:
    """Raise for the first key of ``doc`` not in ``known`` (a misspelt key would otherwise be ignored)."""
    for key in doc:
        if key not in known:
            raise ClusterSpecError(f"{path}: {where}unknown key {key!r} (accepted: {', '.join(known)})")


def _count(n: int | str) -> str:
    """The number ``n`` (or its digits) for a message, shortened when it has many digits."""
    text = str(n)
    return text if len(text) <= 20 else f"{text[:6]}... ({len(text)} digits)"


def _node_attrs(path: Path, i: int, entry: Mapping) -> dict:
    """The optional attributes of cluster-file entry ``nodes[i]`` (:data:`NODE_ATTRS`), each checked:
    :class:`ClusterSpecError` naming the file, the entry and the key otherwise."""
    from policies.gputypes import UnknownGPUTypeError, check_speed

    where = f"{path}: nodes[{i}]."
    out: dict = {}
    t = entry.get("gpu_type")
    if t is not None:
        if not isinstance(t, str) or not GPU_TYPE_RE.fullmatch(t):
            raise ClusterSpecError(
                f"{where}gpu_type: expected a GPU type name (letters, digits, '_', '.', '-'), got {t!r}"
            )
        out["gpu_type"] = t
    for key in ("gpu_speed", "mem_gb"):
        v = entry.get(key)
        if v is not None:
            if not is_finite_number(v) or v <= 0:
                raise ClusterSpecError(f"{where}{key}: expected a positive finite number, got {v!r}")
            out[key] = float(v)
    c = entry.get("cpus")
    if c is not None:
        if isinstance(c, bool) or not isinstance(c, int) or c < 1:
            raise ClusterSpecError(f"{where}cpus: expected a positive integer, got {c!r}")
        out["cpus"] = c
    sw = entry.get("switch")
    if sw is not None:
        if isinstance(sw, bool) or not isinstance(sw, (str, int)) or not str(sw).strip():
            raise ClusterSpecError(f"{where}switch: expected a non-empty name, got {sw!r}")
        out["switch"] = str(sw)
    try:
        check_speed(out.get("gpu_type"), out.get("gpu_speed"))
    except UnknownGPUTypeError as exc:
        raise ClusterSpecError(f"{where}gpu_type: {exc}") from None
    return out


def is_finite_number(v: object) -> bool:
    """A finite real number, not a bool (``True == 1``); also what a JSON number must be, as ``json.loads``
    accepts ``NaN`` / ``Infinity``."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:  # an int beyond float range
        return False


@dataclass(frozen=True)
class NodeSpec:
    """One node.

    :param name: unique within the cluster.
    :param gpus: number of GPUs (1 .. :data:`MAX_GPUS_PER_NODE`).
    :param gpu_type: GPU type name (``"v100"``, matched case-insensitively); ``None``: the reference
        GPU of the measured data (TITAN Xp), speed factor 1.
    :param cpus: CPU cores (a positive integer); ``None``: not declared (never a constraint).
    :param mem_gb: memory in GB (a positive finite number); ``None``: not declared.
    :param switch: name of the network switch (or rack) the node hangs off, for locality beyond the
        node; ``None``: not declared.
    :param gpu_speed: the node's GPU speed relative to the reference (a positive finite number); wins
        over the table of :mod:`policies.gputypes` and lets a type the table lacks be used.

    The optional fields are checked on construction (:class:`ClusterSpecError` naming the node).
    """

    name: str
    gpus: int
    gpu_type: str | None = None
    cpus: int | None = None
    mem_gb: float | None = None
    switch: str | None = None
    gpu_speed: float | None = None

    def __post_init__(self) -> None:
        if (self.gpu_type is None and self.cpus is None and self.mem_gb is None and self.switch is None
                and self.gpu_speed is None):
            return
        where = f"node {self.name!r}: "
        t = self.gpu_type
        if t is not None and (not isinstance(t, str) or not GPU_TYPE_RE.fullmatch(t)):
            raise ClusterSpecError(f"{where}gpu_type must be a name of letters, digits, '_', '.', '-', got {t!r}")
        c = self.cpus
        if c is not None and (isinstance(c, bool) or not isinstance(c, int) or c < 1):
            raise ClusterSpecError(f"{where}cpus must be a positive integer, got {c!r}")
        for key in ("mem_gb", "gpu_speed"):
            v = getattr(self, key)
            if v is not None and (not is_finite_number(v) or v <= 0):
                raise ClusterSpecError(f"{where}{key} must be a positive finite number, got {v!r}")
        sw = self.switch
        if sw is not None and (not isinstance(sw, str) or not sw.strip()):
            raise ClusterSpecError(f"{where}switch must be a non-empty name, got {sw!r}")

    @property
    def attributes(self) -> dict:
        """The optional attributes that are set, in :data:`NODE_ATTRS` order."""
        return {k: getattr(self, k) for k in NODE_ATTRS if getattr(self, k) is not None}


@dataclass(frozen=True)
class ClusterSpec:
    """The static shape of a cluster.

    :param nodes: the nodes, in index order.
    :param intra_bw_gbps: GPU-to-GPU bandwidth inside a node (GB/s); PCIe Gen3
        x16 = 16 GB/s as in the seed's testbed.
    :param inter_bw_gbps: bandwidth of a node's network link (GB/s); 40 Gbps
        InfiniBand = 5 GB/s as in the seed's testbed.
    :param ps_placement: where the cluster runs an elastic job's parameter servers
        (:data:`PS_PLACEMENTS`): ``"workers"`` (default) only on the job's worker nodes, split
        evenly; ``"spread"`` on any node, each PS where the most CPUs are free (the load-balancing
        placement DL2 deploys workers and PSs with, seed 000, sections 3 and 5).
    """

    nodes: tuple[NodeSpec, ...]
    intra_bw_gbps: float = 16.0
    inter_bw_gbps: float = 5.0
    ps_placement: str = "workers"

    def __post_init__(self) -> None:
        if not self.nodes:
            raise ClusterSpecError("a cluster needs at least one node")
        if len(self.nodes) > MAX_NODES:
            raise ClusterSpecError(f"a cluster has at most {MAX_NODES:,} nodes, got {len(self.nodes):,}")
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            raise ClusterSpecError(f"duplicate node names in cluster: {names}")
        for n in self.nodes:
            if not isinstance(n.name, str) or not n.name.strip():
                raise ClusterSpecError(f"node names must be non-empty strings, got {n.name!r}")
            if not isinstance(n.gpus, int) or n.gpus < 1:
                raise ClusterSpecError(f"node {n.name!r}: gpus must be a positive integer, got {n.gpus!r}")
            if n.gpus > MAX_GPUS_PER_NODE:
                raise ClusterSpecError(f"node {n.name!r}: at most {MAX_GPUS_PER_NODE} GPUs per node, got {n.gpus}")
        if self.ps_placement not in PS_PLACEMENTS:
            raise ClusterSpecError(f"ps_placement must be one of {', '.join(PS_PLACEMENTS)}, got {self.ps_placement!r}")
        for name in ("intra_bw_gbps", "inter_bw_gbps"):
            bw = getattr(self, name)
            try:
                ok = not isinstance(bw, bool) and math.isfinite(bw) and bw > 0
            except TypeError:
                ok = False
            if not ok:
                raise ClusterSpecError(f"bandwidths must be positive and finite: {name} = {bw!r} (GB/s)")

    # ------------------------------------------------------------------ factories
    @classmethod
    def homogeneous(
        cls, num_nodes: int, gpus_per_node: int, prefix: str = "node", gpu_type: str | None = None, **kw
    ) -> "ClusterSpec":
        """``num_nodes`` nodes named ``node1..nodeN`` with ``gpus_per_node`` GPUs each, of ``gpu_type``
        (None: the reference GPU), at most :data:`MAX_NODES` x :data:`MAX_GPUS_PER_NODE`."""
        if num_nodes < 1 or gpus_per_node < 1:
            raise ClusterSpecError(f"cluster {num_nodes}x{gpus_per_node}: both numbers must be >= 1")
        if num_nodes > MAX_NODES or gpus_per_node > MAX_GPUS_PER_NODE:  # before building the node list
            raise ClusterSpecError(
                f"cluster {_count(num_nodes)}x{_count(gpus_per_node)}: at most {MAX_NODES:,} nodes "
                f"of at most {MAX_GPUS_PER_NODE} GPUs"
            )
        return cls(tuple(NodeSpec(f"{prefix}{i + 1}", gpus_per_node, gpu_type) for i in range(num_nodes)), **kw)

    @classmethod
    def parse(cls, spec: "str | Path | ClusterSpec") -> "ClusterSpec":
        """Parse ``"4x8"`` (nodes x GPUs per node), ``"4x8:v100"`` (of one GPU type), groups joined by
        ``+`` (``"2x8:v100+2x8:k80"``: nodes numbered on, ``node1..node4``) or a YAML / TOML file.

        The file lists nodes and, optionally, bandwidths::

            intra_bw_gbps = 16
            inter_bw_gbps = 5
            [[nodes]]
            name = "node"
            gpus = 8
            count = 4        # optional: node1..node4 (with count > 1, name is a prefix)
            gpu_type = "v100"  # optional, and so are gpu_speed, cpus, mem_gb, switch

        Nodes without a name are numbered on from the nodes before them (``node1``, ``node2``, ...).
        Any other key (e.g. a misspelt ``gpu_per_node``) is an error naming it, and so is a GPU type
        :mod:`policies.gputypes` does not know on a node without ``gpu_speed``.
        """
        if isinstance(spec, ClusterSpec):
            return spec
        text = str(spec).strip()
        if _SPEC_RE.fullmatch(text):
            return cls._from_groups(text)
        path = Path(text)
        if text and path.is_dir():
            raise ClusterSpecError(
                f"bad cluster spec {text!r}: is a directory; expected NODESxGPUS (e.g. 4x8) or a YAML/TOML file"
            )
        if not text or not path.is_file():
            raise ClusterSpecError(
                f"bad cluster spec {text!r}: expected NODESxGPUS[:TYPE], groups joined by '+' "
                "(e.g. 4x8, 2x8:v100+2x8:k80), or a YAML/TOML file that exists"
            )
        return cls.from_file(path)

    @classmethod
    def _from_groups(cls, text: str) -> "ClusterSpec":
        """The cluster of an ``NxG[:TYPE](+NxG[:TYPE])*`` spec (matched by ``_SPEC_RE``)."""
        from policies.gputypes import UnknownGPUTypeError, check_speed

        groups = re.findall(_GROUP_RE, text)
        for nodes_text, gpus_text, _t in groups:
            # Python refuses to convert integers of over 4300 digits; over 9 digits is far too large anyway.
            if max(len(nodes_text.lstrip("0")), len(gpus_text.lstrip("0"))) > 9:
                what = f"{_count(nodes_text)}x{_count(gpus_text)}"
                raise ClusterSpecError(
                    f"cluster {what if len(groups) == 1 else _count(text)}: at most {MAX_NODES:,} nodes "
                    f"of at most {MAX_GPUS_PER_NODE} GPUs"
                )
        if len(groups) == 1 and not groups[0][2]:
            return cls.homogeneous(int(groups[0][0]), int(groups[0][1]))
        nodes: list[NodeSpec] = []
        for nodes_text, gpus_text, gpu_type in groups:
            n, g = int(nodes_text), int(gpus_text)
            if n < 1 or g < 1:
                raise ClusterSpecError(f"cluster {text}: {n}x{g}: both numbers must be >= 1")
            if g > MAX_GPUS_PER_NODE or len(nodes) + n > MAX_NODES:  # before building the nodes
                raise ClusterSpecError(
                    f"cluster {_count(text)}: at most {MAX_NODES:,} nodes of at most {MAX_GPUS_PER_NODE} GPUs"
                )
            if gpu_type:
                try:
                    check_speed(gpu_type, None)
                except UnknownGPUTypeError as exc:
                    raise ClusterSpecError(f"cluster {text}: {exc}") from None
            first = len(nodes) + 1
            nodes.extend(NodeSpec(f"node{first + k}", g, gpu_type or None) for k in range(n))
        return cls(tuple(nodes))

    @classmethod
    def from_file(cls, path: Path) -> "ClusterSpec":
        """Read a YAML (any suffix but ``.toml``) or TOML cluster file (format: :meth:`parse`,
        ``docs/PERFORMANCE_MODEL.md``, "Cluster files"); every error is one line naming the file."""
        try:
            raw = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ClusterSpecError(f"{path}: cannot read cluster file: {exc}") from exc
        try:
            if path.suffix.lower() == ".toml":
                doc = tomllib.loads(raw)  # refuses a key given twice itself
            else:
                doc = _yaml_load(path, raw)
        except ClusterSpecError:
            raise
        except Exception as exc:  # noqa: BLE001 - report any parser error uniformly, on one line
            text = " ".join(str(exc).split())
            raise ClusterSpecError(f"{path}: cannot parse cluster file: {text}") from exc
        if isinstance(doc, Mapping):
            _check_keys(path, "", doc, FILE_KEYS)  # first: "node:" is a typo, not a missing "nodes"
        if not isinstance(doc, Mapping) or "nodes" not in doc:
            raise ClusterSpecError(f"{path}: expected a mapping with a 'nodes' list")
        if not isinstance(doc["nodes"], list):
            raise ClusterSpecError(f"{path}: 'nodes' must be a list of node entries")
        nodes: list[NodeSpec] = []
        for i, entry in enumerate(doc["nodes"]):
            if isinstance(entry, Mapping):
                _check_keys(path, f"nodes[{i}]: ", entry, NODE_KEYS)
            if not isinstance(entry, Mapping) or "gpus" not in entry:
                raise ClusterSpecError(
                    f"{path}: nodes[{i}]: each node needs 'gpus' (and optionally {', '.join(NODE_KEYS[2:])} "
                    "and 'name')"
                )
            gpus = entry["gpus"]
            if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 1:
                raise ClusterSpecError(f"{path}: nodes[{i}].gpus: expected a positive integer, got {gpus!r}")
            if gpus > MAX_GPUS_PER_NODE:
                raise ClusterSpecError(
                    f"{path}: nodes[{i}].gpus: at most {MAX_GPUS_PER_NODE} GPUs per node, got {gpus}"
                )
            count = entry.get("count", 1)
            if not isinstance(count, int) or isinstance(count, bool) or count < 1:
                raise ClusterSpecError(f"{path}: nodes[{i}].count: expected a positive integer, got {count!r}")
            if count > MAX_NODES - len(nodes):  # before building the nodes
                raise ClusterSpecError(
                    f"{path}: nodes[{i}].count: {_count(count)} would make {_count(len(nodes) + count)} nodes, "
                    f"more than the limit of {MAX_NODES:,}"
                )
            attrs = _node_attrs(path, i, entry)
            if "name" in entry:  # with count > 1 a prefix: NAME1 .. NAMEcount
                name = entry["name"]
                if isinstance(name, bool) or name is None or not str(name).strip():
                    raise ClusterSpecError(
                        f"{path}: nodes[{i}].name: expected a non-empty name (or no 'name' key), got {name!r}"
                    )
                name = str(name)
                if count == 1:
                    nodes.append(NodeSpec(name, gpus, **attrs))
                else:
                    nodes.extend(NodeSpec(f"{name}{k + 1}", gpus, **attrs) for k in range(count))
            else:  # unnamed nodes are numbered on from the nodes before them: node1, node2, ...
                nodes.extend(NodeSpec(f"node{len(nodes) + 1}", gpus, **attrs) for _ in range(count))
        kw = {}
        for k in ("intra_bw_gbps", "inter_bw_gbps"):
            if k in doc:
                try:
                    if isinstance(doc[k], bool):  # YAML/TOML true is not the number 1
                        raise TypeError
                    kw[k] = float(doc[k])
                except (TypeError, ValueError, OverflowError):
                    raise ClusterSpecError(f"{path}: {k}: expected a number, got {doc[k]!r}") from None
        if "ps_placement" in doc:
            if doc["ps_placement"] not in PS_PLACEMENTS:
                raise ClusterSpecError(f"{path}: ps_placement: expected one of {', '.join(PS_PLACEMENTS)}, "
                                       f"got {doc['ps_placement']!r}")
            kw["ps_placement"] = doc["ps_placement"]
        try:
            return cls(tuple(nodes), **kw)
        except ClusterSpecError as exc:
            raise ClusterSpecError(f"{path}: {exc}") from exc

    # ------------------------------------------------------------------ properties
    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    # the nodes never change: these sums over them are computed once per spec (placement rules and the
    # controller read them for every job they place)
    @cached_property
    def total_gpus(self) -> int:
        """GPUs of all nodes (summed once: the spec is frozen; the controller reads it per job each round)."""
        return sum(n.gpus for n in self.nodes)

    @cached_property
    def max_gpus_per_node(self) -> int:
        return max(n.gpus for n in self.nodes)

    @cached_property
    def gpus_per_node(self) -> tuple[int, ...]:
        return tuple(n.gpus for n in self.nodes)

    @property
    def is_homogeneous(self) -> bool:
        """All nodes have the same number of GPUs (their types may differ: see :attr:`is_typed`)."""
        return len(set(self.gpus_per_node)) == 1

    @cached_property
    def gpu_types(self) -> tuple[str | None, ...]:
        """Each node's GPU type (None: the reference GPU)."""
        return tuple(n.gpu_type for n in self.nodes)

    @cached_property
    def is_typed(self) -> bool:
        """Some node declares a GPU type or its own speed, so GPU speeds may differ from the reference."""
        return any(n.gpu_type is not None or n.gpu_speed is not None for n in self.nodes)

    @cached_property
    def has_attributes(self) -> bool:
        """Some node declares an optional attribute (:data:`NODE_ATTRS`)."""
        return any(
            n.gpu_type is not None or n.gpu_speed is not None or n.cpus is not None or n.mem_gb is not None
            or n.switch is not None
            for n in self.nodes
        )

    @property
    def cpus_per_node(self) -> tuple[int | None, ...]:
        """Each node's CPUs (None: not declared)."""
        return tuple(n.cpus for n in self.nodes)

    @property
    def mem_gb_per_node(self) -> tuple[float | None, ...]:
        """Each node's memory in GB (None: not declared)."""
        return tuple(n.mem_gb for n in self.nodes)

    @property
    def switches(self) -> tuple[str | None, ...]:
        """Each node's switch (None: not declared)."""
        return tuple(n.switch for n in self.nodes)

    @property
    def bw_ratio(self) -> float:
        """inter-node / intra-node bandwidth (< 1 on real hardware)."""
        return self.inter_bw_gbps / self.intra_bw_gbps

    def node_index(self, name: str) -> int:
        for i, n in enumerate(self.nodes):
            if n.name == name:
                return i
        raise KeyError(f"unknown node {name!r}")

    def describe_gpus(self) -> str:
        """The GPU layout alone: ``"4x8"`` when every node has the same GPU count, else
        ``"N nodes / T GPUs"`` (types, CPUs and memory left out)."""
        if self.is_homogeneous:
            return f"{self.num_nodes}x{self.nodes[0].gpus}"
        return f"{self.num_nodes} nodes / {self.total_gpus} GPUs"

    def describe(self) -> str:
        """Short text for reports: :meth:`describe_gpus` when no node declares an optional attribute;
        otherwise runs of alike nodes joined by ``+``, each ``NxG[:TYPE]`` with its other attributes in
        parentheses, and the number of switches: ``"2x8:v100(64 CPUs, 512 GB)+2x8:k80, 2 switches"``."""
        if not self.has_attributes:
            return self.describe_gpus()
        runs: list[list] = []
        for n in self.nodes:
            key = (n.gpus, n.gpu_type, n.gpu_speed, n.cpus, n.mem_gb)
            if runs and runs[-1][0] == key:
                runs[-1][1] += 1
            else:
                runs.append([key, 1])
        parts = []
        for (gpus, gpu_type, speed, cpus, mem), count in runs:
            extra = [f"speed {speed:g}"] if speed is not None else []
            extra += [f"{cpus} CPUs"] if cpus is not None else []
            extra += [f"{mem:g} GB"] if mem is not None else []
            typed = f":{gpu_type}" if gpu_type else ""
            parts.append(f"{count}x{gpus}{typed}{'(' + ', '.join(extra) + ')' if extra else ''}")
        text = "+".join(parts)
        switches = {s for s in self.switches if s is not None}
        if switches:
            text += f", {len(switches)} switch{'es' if len(switches) != 1 else ''}"
        if self.ps_placement != "workers":
            text += f", PSs {self.ps_placement}"
        return text

    def to_dict(self) -> dict:
        """Plain data: ``nodes`` (``name``, ``gpus`` and the attributes each node sets) and bandwidths."""
        return {
            "nodes": [{"name": n.name, "gpus": n.gpus, **n.attributes} for n in self.nodes],
            "intra_bw_gbps": self.intra_bw_gbps,
            "inter_bw_gbps": self.inter_bw_gbps,
        }


@dataclass(frozen=True)
class Placement:
    """GPUs given to one job: sorted ``(node_index, gpu_count)`` pairs.

    Use :meth:`of` to build one from a mapping. Immutable and hashable.
    """

    alloc: tuple[tuple[int, int], ...]
    total_gpus: int = field(init=False, compare=False)
    #: node indices, in ``alloc`` order (derived, cached: read in every scheduling step)
    nodes: tuple[int, ...] = field(init=False, compare=False, repr=False)
    num_nodes: int = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        nodes, counts = zip(*self.alloc) if self.alloc else ((), ())
        d = self.__dict__  # frozen: set the derived fields without the frozen __setattr__
        d["total_gpus"] = sum(counts)
        d["nodes"] = nodes
        d["num_nodes"] = len(nodes)

    @classmethod
    def of(cls, mapping: Mapping[int, int] | Iterable[tuple[int, int]]) -> "Placement":
        items = mapping.items() if isinstance(mapping, Mapping) else mapping
        merged: dict[int, int] = {}
        for node, count in items:
            if count < 0:
                raise ValueError(f"negative GPU count {count} on node {node}")
            if count:
                merged[int(node)] = merged.get(int(node), 0) + int(count)
        return cls(tuple(sorted(merged.items())))

    @property
    def max_per_node(self) -> int:
        return max((c for _, c in self.alloc), default=0)

    @property
    def shape(self) -> tuple[int, int]:
        """``(total_gpus, num_nodes)``: the key of the performance model."""
        return (self.total_gpus, self.num_nodes)

    def as_dict(self) -> dict[int, int]:
        return dict(self.alloc)

    def fits(self, free: "Iterable[int]") -> bool:
        free = list(free)
        return all(0 <= n < len(free) and c <= free[n] for n, c in self.alloc)

    def __str__(self) -> str:
        return "{" + ", ".join(f"{n}:{c}" for n, c in self.alloc) + "}"
