"""Cluster description and placements.

A cluster is an ordered list of nodes, each with a number of GPUs. Nodes are
referred to by their index in that list (0-based) everywhere inside the
project; names only matter at the edges (Slurm, reports).

A :class:`Placement` maps node indices to GPU counts, e.g. ``{0: 4, 2: 4}``
places an 8-GPU job on nodes 0 and 2 with 4 GPUs each.
"""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

__all__ = ["ClusterSpecError", "NodeSpec", "ClusterSpec", "Placement", "MAX_NODES", "MAX_GPUS_PER_NODE"]

#: Keys a cluster file may hold at its top level and in each ``nodes`` entry (anything else is a typo).
FILE_KEYS = ("nodes", "intra_bw_gbps", "inter_bw_gbps")
NODE_KEYS = ("name", "gpus", "count")

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


@dataclass(frozen=True)
class NodeSpec:
    """One node: its name and number of GPUs."""

    name: str
    gpus: int


@dataclass(frozen=True)
class ClusterSpec:
    """The static shape of a cluster.

    :param nodes: the nodes, in index order.
    :param intra_bw_gbps: GPU-to-GPU bandwidth inside a node (GB/s); PCIe Gen3
        x16 = 16 GB/s as in the seed's testbed.
    :param inter_bw_gbps: bandwidth of a node's network link (GB/s); 40 Gbps
        InfiniBand = 5 GB/s as in the seed's testbed.
    """

    nodes: tuple[NodeSpec, ...]
    intra_bw_gbps: float = 16.0
    inter_bw_gbps: float = 5.0

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
    def homogeneous(cls, num_nodes: int, gpus_per_node: int, prefix: str = "node", **kw) -> "ClusterSpec":
        """``num_nodes`` nodes named ``node1..nodeN`` with ``gpus_per_node`` GPUs each
        (at most :data:`MAX_NODES` x :data:`MAX_GPUS_PER_NODE`)."""
        if num_nodes < 1 or gpus_per_node < 1:
            raise ClusterSpecError(f"cluster {num_nodes}x{gpus_per_node}: both numbers must be >= 1")
        if num_nodes > MAX_NODES or gpus_per_node > MAX_GPUS_PER_NODE:  # before building the node list
            raise ClusterSpecError(
                f"cluster {_count(num_nodes)}x{_count(gpus_per_node)}: at most {MAX_NODES:,} nodes "
                f"of at most {MAX_GPUS_PER_NODE} GPUs"
            )
        return cls(tuple(NodeSpec(f"{prefix}{i + 1}", gpus_per_node) for i in range(num_nodes)), **kw)

    @classmethod
    def parse(cls, spec: "str | Path | ClusterSpec") -> "ClusterSpec":
        """Parse ``"4x8"`` (nodes x GPUs per node) or a YAML / TOML file.

        The file lists nodes and, optionally, bandwidths::

            intra_bw_gbps = 16
            inter_bw_gbps = 5
            [[nodes]]
            name = "node"
            gpus = 8
            count = 4        # optional: node1..node4 (with count > 1, name is a prefix)

        Nodes without a name are numbered on from the nodes before them (``node1``, ``node2``, ...).
        Any other key (e.g. a misspelt ``gpu_per_node``) is an error naming it.
        """
        if isinstance(spec, ClusterSpec):
            return spec
        text = str(spec).strip()
        m = re.fullmatch(r"([0-9]+)\s*[xX]\s*([0-9]+)", text)
        if m:
            nodes_text, gpus_text = m.groups()
            # Python refuses to convert integers of over 4300 digits; over 9 digits is far too large anyway.
            if max(len(nodes_text.lstrip("0")), len(gpus_text.lstrip("0"))) > 9:
                raise ClusterSpecError(
                    f"cluster {_count(nodes_text)}x{_count(gpus_text)}: at most {MAX_NODES:,} nodes "
                    f"of at most {MAX_GPUS_PER_NODE} GPUs"
                )
            return cls.homogeneous(int(nodes_text), int(gpus_text))
        path = Path(text)
        if text and path.is_dir():
            raise ClusterSpecError(
                f"bad cluster spec {text!r}: is a directory; expected NODESxGPUS (e.g. 4x8) or a YAML/TOML file"
            )
        if not text or not path.is_file():
            raise ClusterSpecError(
                f"bad cluster spec {text!r}: expected NODESxGPUS (e.g. 4x8) or a YAML/TOML file that exists"
            )
        return cls.from_file(path)

    @classmethod
    def from_file(cls, path: Path) -> "ClusterSpec":
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
                raise ClusterSpecError(f"{path}: nodes[{i}]: each node needs 'gpus' (and optionally 'name', 'count')")
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
            if "name" in entry:  # with count > 1 a prefix: NAME1 .. NAMEcount
                name = entry["name"]
                if isinstance(name, bool) or name is None or not str(name).strip():
                    raise ClusterSpecError(
                        f"{path}: nodes[{i}].name: expected a non-empty name (or no 'name' key), got {name!r}"
                    )
                name = str(name)
                if count == 1:
                    nodes.append(NodeSpec(name, gpus))
                else:
                    nodes.extend(NodeSpec(f"{name}{k + 1}", gpus) for k in range(count))
            else:  # unnamed nodes are numbered on from the nodes before them: node1, node2, ...
                nodes.extend(NodeSpec(f"node{len(nodes) + 1}", gpus) for _ in range(count))
        kw = {}
        for k in ("intra_bw_gbps", "inter_bw_gbps"):
            if k in doc:
                try:
                    if isinstance(doc[k], bool):  # YAML/TOML true is not the number 1
                        raise TypeError
                    kw[k] = float(doc[k])
                except (TypeError, ValueError, OverflowError):
                    raise ClusterSpecError(f"{path}: {k}: expected a number, got {doc[k]!r}") from None
        try:
            return cls(tuple(nodes), **kw)
        except ClusterSpecError as exc:
            raise ClusterSpecError(f"{path}: {exc}") from exc

    # ------------------------------------------------------------------ properties
    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @property
    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)

    @property
    def max_gpus_per_node(self) -> int:
        return max(n.gpus for n in self.nodes)

    @property
    def gpus_per_node(self) -> tuple[int, ...]:
        return tuple(n.gpus for n in self.nodes)

    @property
    def is_homogeneous(self) -> bool:
        return len(set(self.gpus_per_node)) == 1

    @property
    def bw_ratio(self) -> float:
        """inter-node / intra-node bandwidth (< 1 on real hardware)."""
        return self.inter_bw_gbps / self.intra_bw_gbps

    def node_index(self, name: str) -> int:
        for i, n in enumerate(self.nodes):
            if n.name == name:
                return i
        raise KeyError(f"unknown node {name!r}")

    def describe(self) -> str:
        if self.is_homogeneous:
            return f"{self.num_nodes}x{self.nodes[0].gpus}"
        return f"{self.num_nodes} nodes / {self.total_gpus} GPUs"

    def to_dict(self) -> dict:
        return {
            "nodes": [{"name": n.name, "gpus": n.gpus} for n in self.nodes],
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
