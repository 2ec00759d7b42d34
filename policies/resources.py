"""What a job asks for (:class:`ResourceDemand`) and what it is given (:class:`Allocation`).

A :class:`~policies.cluster.Placement` (node -> GPU count) is the GPU view every policy, the simulator
and the contention model use. An :class:`Allocation` is the richer view: per node, which GPUs (their
indices on the node), how many CPUs and how much memory, and the role of the processes there (``worker``:
one data-parallel worker per GPU; ``ps``: parameter servers, which hold no GPU). ``Allocation.placement``
gives the GPU view back.

Units: CPUs are cores (integers), memory is GB (as Slurm counts them, 1 GB = 1024 MB).

Pure: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from policies.cluster import GPU_TYPE_RE, ClusterSpec, Placement

__all__ = [
    "ps_layout",
    "nodes_of_type",
    "ResourceError",
    "ResourceDemand",
    "NodeShare",
    "Allocation",
    "WORKER",
    "PS",
    "placement_misfit",
    "free_cpu_mem",
]

#: Role of the processes of a job on a node: data-parallel workers (one per GPU) or parameter servers.
WORKER = "worker"
PS = "ps"
_ROLES = (WORKER, PS)


class ResourceError(ValueError):
    """A malformed demand or allocation, or an allocation that does not fit the cluster."""


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_amount(v: object) -> bool:
    """A finite number >= 0 (not a bool)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(v) and v >= 0
    except OverflowError:
        return False


@dataclass(frozen=True)
class ResourceDemand:
    """Resources one job asks for.

    :param gpus: total GPUs, one data-parallel worker each (>= 1); for an elastic job the count it
        asks for now.
    :param gpu_type: GPUs of this type only (matched like :func:`policies.gputypes.normalize_gpu_type`;
        an untyped node is the reference type ``titanxp``); None: any type.
    :param cpus_per_gpu: CPU cores each worker needs (0: none declared).
    :param mem_gb_per_gpu: memory each worker needs, GB (0: none declared).
    :param ps: number of parameter servers (0: none); they hold no GPU.
    :param ps_cpus: CPU cores of each parameter server.
    :param ps_mem_gb: memory of each parameter server, GB.
    :param min_gpus: smallest GPU count the job can run on; with ``max_gpus`` the elastic range
        ``min_gpus <= gpus <= max_gpus``; both None: not elastic.
    :param max_gpus: largest GPU count the job can use.

    Construction checks every field (:class:`ResourceError` naming it).
    """

    gpus: int
    gpu_type: str | None = None
    cpus_per_gpu: int = 0
    mem_gb_per_gpu: float = 0.0
    ps: int = 0
    ps_cpus: int = 0
    ps_mem_gb: float = 0.0
    min_gpus: int | None = None
    max_gpus: int | None = None

    def __post_init__(self) -> None:
        if not _is_int(self.gpus) or self.gpus < 1:
            raise ResourceError(f"demand: gpus must be a positive integer, got {self.gpus!r}")
        if self.gpu_type is None and self.cpus_per_gpu == 0 and self.mem_gb_per_gpu == 0 and self.ps == 0 \
                and self.ps_cpus == 0 and self.ps_mem_gb == 0 and self.min_gpus is None and self.max_gpus is None:
            return  # the plain demand of every existing trace: nothing more to check
        t = self.gpu_type
        if t is not None and (not isinstance(t, str) or not GPU_TYPE_RE.fullmatch(t)):
            raise ResourceError(f"demand: gpu_type must be a name of letters, digits, '_', '.', '-', got {t!r}")
        for name in ("cpus_per_gpu", "ps", "ps_cpus"):
            v = getattr(self, name)
            if not _is_int(v) or v < 0:
                raise ResourceError(f"demand: {name} must be an integer >= 0, got {v!r}")
        for name in ("mem_gb_per_gpu", "ps_mem_gb"):
            v = getattr(self, name)
            if not _is_amount(v):
                raise ResourceError(f"demand: {name} must be a finite number >= 0 (GB), got {v!r}")
        if self.ps == 0 and (self.ps_cpus or self.ps_mem_gb):
            raise ResourceError("demand: ps_cpus / ps_mem_gb given without parameter servers (ps = 0)")
        lo, hi = self.min_gpus, self.max_gpus
        if (lo is None) != (hi is None):
            raise ResourceError(f"demand: an elastic range needs both min_gpus and max_gpus, got {lo!r} and {hi!r}")
        if lo is not None:
            if not _is_int(lo) or not _is_int(hi) or not 1 <= lo <= self.gpus <= hi:
                raise ResourceError(
                    f"demand: elastic range must hold 1 <= min_gpus <= gpus <= max_gpus (integers), "
                    f"got min_gpus={lo!r}, gpus={self.gpus!r}, max_gpus={hi!r}"
                )

    @property
    def is_elastic(self) -> bool:
        """The job can run on more than one GPU count."""
        return self.min_gpus is not None and self.min_gpus < self.max_gpus  # type: ignore[operator]

    @property
    def declares_cpu_mem(self) -> bool:
        """Some CPUs or memory are asked for (workers or parameter servers)."""
        return bool(self.cpus_per_gpu or self.mem_gb_per_gpu or self.ps_cpus or self.ps_mem_gb)

    @property
    def total_cpus(self) -> int:
        """CPU cores of all workers and parameter servers."""
        return self.gpus * self.cpus_per_gpu + self.ps * self.ps_cpus

    @property
    def total_mem_gb(self) -> float:
        """Memory of all workers and parameter servers, GB."""
        return self.gpus * self.mem_gb_per_gpu + self.ps * self.ps_mem_gb

    def gpu_counts(self) -> range:
        """The GPU counts the job can run on: ``min_gpus..max_gpus`` when elastic, else ``gpus`` only."""
        if self.min_gpus is None:
            return range(self.gpus, self.gpus + 1)
        return range(self.min_gpus, self.max_gpus + 1)  # type: ignore[operator]

    def resized(self, gpus: int) -> "ResourceDemand":
        """The same demand at ``gpus`` GPUs (:class:`ResourceError` outside :meth:`gpu_counts`)."""
        if gpus not in self.gpu_counts():
            c = self.gpu_counts()
            raise ResourceError(f"demand: {gpus!r} GPUs is outside the job's range {c.start}..{c.stop - 1}")
        from dataclasses import replace

        return replace(self, gpus=gpus)


def _type_key(gpu_type: str | None) -> str:
    from policies.gputypes import REFERENCE_TYPE, normalize_gpu_type

    return REFERENCE_TYPE if gpu_type is None else normalize_gpu_type(gpu_type)


def nodes_of_type(cluster: ClusterSpec, gpu_type: str) -> tuple[bool, ...]:
    """Whether each node of ``cluster`` has GPUs of ``gpu_type``, matched as :func:`placement_misfit`
    matches (normalized names; an untyped node has the reference type). Kept per cluster object and
    type (the 64 latest)."""
    key = (id(cluster), gpu_type)
    hit = _TYPE_NODES.get(key)
    if hit is not None and hit[0] is cluster:
        return hit[1]
    want = _type_key(gpu_type)
    got = tuple(_type_key(n.gpu_type) == want for n in cluster.nodes)
    if len(_TYPE_NODES) >= 64:
        _TYPE_NODES.clear()
    _TYPE_NODES[key] = (cluster, got)
    return got


_TYPE_NODES: dict[tuple[int, str], tuple[ClusterSpec, tuple[bool, ...]]] = {}


@dataclass(frozen=True)
class NodeShare:
    """What one job holds on one node in one role.

    :param node: node index.
    :param role: :data:`WORKER` or :data:`PS`.
    :param gpus: indices of the GPUs on the node, ascending (a worker holds >= 1, a PS none).
    :param cpus: CPU cores (>= 0).
    :param mem_gb: memory, GB (>= 0).
    """

    node: int
    role: str
    gpus: tuple[int, ...] = ()
    cpus: int = 0
    mem_gb: float = 0.0

    def __post_init__(self) -> None:
        where = f"allocation: node {self.node!r} ({self.role!r}): "
        if not _is_int(self.node) or self.node < 0:
            raise ResourceError(f"{where}node must be an index >= 0")
        if self.role not in _ROLES:
            raise ResourceError(f"{where}role must be one of {', '.join(_ROLES)}")
        g = self.gpus
        if not isinstance(g, tuple) or not all(_is_int(i) and i >= 0 for i in g) or list(g) != sorted(set(g)):
            raise ResourceError(f"{where}gpus must be ascending distinct GPU indices >= 0, got {g!r}")
        if self.role == WORKER and not g:
            raise ResourceError(f"{where}a worker share holds at least one GPU")
        if self.role == PS and g:
            raise ResourceError(f"{where}a parameter server holds no GPU, got {g!r}")
        if not _is_int(self.cpus) or self.cpus < 0:
            raise ResourceError(f"{where}cpus must be an integer >= 0, got {self.cpus!r}")
        if not _is_amount(self.mem_gb):
            raise ResourceError(f"{where}mem_gb must be a finite number >= 0, got {self.mem_gb!r}")


@dataclass(frozen=True)
class Allocation:
    """The resources one job holds: :class:`NodeShare` s sorted by ``(node, role)``, at most one per
    node and role. Build one with :meth:`of` or :meth:`from_placement`."""

    shares: tuple[NodeShare, ...]

    def __post_init__(self) -> None:
        keys = [(s.node, s.role) for s in self.shares]
        if keys != sorted(set(keys)):
            raise ResourceError(
                f"allocation: shares must be sorted by (node, role), one per node and role, got {keys} "
                "(build it with Allocation.of)"
            )

    @classmethod
    def of(cls, shares: Iterable[NodeShare]) -> "Allocation":
        """Sort ``shares``; two shares of one node and role are an error."""
        items = sorted(shares, key=lambda s: (s.node, s.role))
        for a, b in zip(items, items[1:]):
            if (a.node, a.role) == (b.node, b.role):
                raise ResourceError(f"allocation: two {a.role} shares on node {a.node}")
        return cls(tuple(items))

    @classmethod
    def from_placement(
        cls,
        placement: Placement,
        demand: ResourceDemand,
        cluster: ClusterSpec,
        used_gpu_indices: Mapping[int, Iterable[int]] | None = None,
    ) -> "Allocation":
        """The allocation of ``demand`` on ``placement``.

        Workers take the lowest GPU indices of each node that ``used_gpu_indices`` (node -> indices
        already held by other jobs) leaves free, with ``cpus_per_gpu`` / ``mem_gb_per_gpu`` per GPU.
        Parameter servers run where the placement's ``ps_nodes`` say (an elastic placement on a
        ``spread`` cluster, :func:`ps_layout`), else server ``i`` on the ``i % k``-th
        of the placement's ``k`` nodes (ascending node index); ``ps_cpus`` / ``ps_mem_gb`` each.

        :raises ResourceError: the placement's GPU count is not one the demand accepts, a node index
            is outside the cluster, or a node has too few free GPU indices.
        """
        if placement.total_gpus not in demand.gpu_counts():
            raise ResourceError(
                f"allocation: placement {placement} has {placement.total_gpus} GPUs, the demand accepts "
                f"{_counts_text(demand)}"
            )
        used = used_gpu_indices or {}
        shares: list[NodeShare] = []
        for node, count in placement.alloc:
            if node >= cluster.num_nodes:
                raise ResourceError(f"allocation: node {node} is not in the cluster ({cluster.num_nodes} nodes)")
            taken = set(used.get(node, ()))
            free = [i for i in range(cluster.nodes[node].gpus) if i not in taken]
            if len(free) < count:
                raise ResourceError(
                    f"allocation: node {node} has {len(free)} free GPU indices, {count} needed"
                )
            shares.append(
                NodeShare(node, WORKER, tuple(free[:count]), count * demand.cpus_per_gpu, count * demand.mem_gb_per_gpu)
            )
        for node, k in ps_layout(placement, demand.ps):
            if node >= cluster.num_nodes:  # (a PS node the placement names; worker nodes are checked above)
                raise ResourceError(f"allocation: PS node {node} is not in the cluster ({cluster.num_nodes} nodes)")
            shares.append(NodeShare(node, PS, (), k * demand.ps_cpus, k * demand.ps_mem_gb))
        return cls.of(shares)

    # ------------------------------------------------------------------ views
    @property
    def placement(self) -> Placement:
        """The GPU view: node -> number of GPUs held by workers."""
        return Placement.of((s.node, len(s.gpus)) for s in self.shares if s.role == WORKER)

    @property
    def nodes(self) -> tuple[int, ...]:
        """Every node the job holds something on, ascending."""
        return tuple(sorted({s.node for s in self.shares}))

    @property
    def total_gpus(self) -> int:
        return sum(len(s.gpus) for s in self.shares)

    @property
    def total_cpus(self) -> int:
        return sum(s.cpus for s in self.shares)

    @property
    def total_mem_gb(self) -> float:
        return math.fsum(s.mem_gb for s in self.shares)

    def per_node(self) -> dict[int, tuple[int, int, float]]:
        """``{node: (gpus, cpus, mem_gb)}`` summed over roles."""
        out: dict[int, tuple[int, int, float]] = {}
        for s in self.shares:
            g, c, m = out.get(s.node, (0, 0, 0.0))
            out[s.node] = (g + len(s.gpus), c + s.cpus, m + s.mem_gb)
        return out

    def gpu_indices(self) -> dict[int, tuple[int, ...]]:
        """``{node: GPU indices}`` of the nodes where the job holds GPUs."""
        return {s.node: s.gpus for s in self.shares if s.gpus}

    # ------------------------------------------------------------------ fitting
    def misfit(
        self,
        cluster: ClusterSpec,
        free_gpus: Sequence[int] | None = None,
        free_cpus: Sequence[int | None] | None = None,
        free_mem_gb: Sequence[float | None] | None = None,
        used_gpu_indices: Mapping[int, Iterable[int]] | None = None,
    ) -> str | None:
        """Why this allocation does not fit (one line), or None when it does.

        Checked per node: the node exists; GPU indices exist on it and none is in
        ``used_gpu_indices``; GPUs within ``free_gpus`` (default: the node's GPUs); CPUs and memory
        within ``free_cpus`` / ``free_mem_gb`` (default: the node's declared CPUs / memory). A node
        that declares no CPUs (memory), or a None entry in ``free_cpus`` (``free_mem_gb``), is not
        checked for them.
        """
        used = used_gpu_indices or {}
        indices = self.gpu_indices()
        for node, (gpus, cpus, mem) in self.per_node().items():
            if node >= cluster.num_nodes:
                return f"node {node} is not in the cluster ({cluster.num_nodes} nodes)"
            spec = cluster.nodes[node]
            where = f"node {node} ({spec.name})"
            idx = indices.get(node, ())
            if idx and idx[-1] >= spec.gpus:
                return f"{where}: GPU index {idx[-1]} does not exist (the node has {spec.gpus} GPUs)"
            clash = sorted(set(idx) & set(used.get(node, ())))
            if clash:
                return f"{where}: GPUs {clash} are in use"
            cap_g = spec.gpus if free_gpus is None else free_gpus[node]
            if gpus > cap_g:
                return f"{where}: {gpus} GPUs needed, {cap_g} free"
            cap_c = spec.cpus if free_cpus is None else free_cpus[node]
            if cpus and spec.cpus is not None and cap_c is not None and cpus > cap_c:
                return f"{where}: {cpus} CPUs needed, {cap_c} free"
            cap_m = spec.mem_gb if free_mem_gb is None else free_mem_gb[node]
            if mem and spec.mem_gb is not None and cap_m is not None and mem > cap_m + 1e-9:
                return f"{where}: {mem:g} GB of memory needed, {cap_m:g} GB free"
        return None

    def fits(
        self,
        cluster: ClusterSpec,
        free_gpus: Sequence[int] | None = None,
        free_cpus: Sequence[int | None] | None = None,
        free_mem_gb: Sequence[float | None] | None = None,
        used_gpu_indices: Mapping[int, Iterable[int]] | None = None,
    ) -> bool:
        """:meth:`misfit` is None."""
        return self.misfit(cluster, free_gpus, free_cpus, free_mem_gb, used_gpu_indices) is None


def _counts_text(demand: ResourceDemand) -> str:
    c = demand.gpu_counts()
    return f"{c.start}" if len(c) == 1 else f"{c.start}..{c.stop - 1}"


def free_cpu_mem(
    cluster: ClusterSpec, running: Iterable[Allocation]
) -> tuple[list[int | None], list[float | None]]:
    """Free CPUs and memory (GB) per node given the allocations of the running jobs; None for a node
    that declares none (no constraint there). Never below 0."""
    cpus: list[int | None] = list(cluster.cpus_per_node)
    mem: list[float | None] = list(cluster.mem_gb_per_node)
    for a in running:
        for s in a.shares:
            if cpus[s.node] is not None and s.cpus:
                cpus[s.node] = max(cpus[s.node] - s.cpus, 0)  # type: ignore[operator]
            if mem[s.node] is not None and s.mem_gb:
                mem[s.node] = max(mem[s.node] - s.mem_gb, 0.0)  # type: ignore[operator]
    return cpus, mem


def placement_misfit(
    demand: ResourceDemand,
    placement: Placement,
    cluster: ClusterSpec,
    free_cpus: Sequence[int | None] | None = None,
    free_mem_gb: Sequence[float | None] | None = None,
) -> str | None:
    """Why ``placement`` cannot host ``demand`` beyond its GPU counts (one line), or None when it can.

    The check a decision validator runs after the GPU-count check: every node of the placement has
    the demand's ``gpu_type`` (if any); and, where the demand declares CPUs / memory and a node
    declares them, the node's workers and parameter servers (placed as
    :meth:`Allocation.from_placement` does) fit ``free_cpus`` / ``free_mem_gb`` (default: the node's
    capacity; :func:`free_cpu_mem` computes them from the running jobs' allocations). A plain GPU
    demand (no type, CPUs or memory) always fits: the answer is None at once.
    """
    if demand.gpu_type is None and not demand.declares_cpu_mem:
        return None
    if demand.gpu_type is not None:
        want = _type_key(demand.gpu_type)
        for node in placement.nodes:
            if node < cluster.num_nodes and _type_key(cluster.nodes[node].gpu_type) != want:
                spec = cluster.nodes[node]
                return (
                    f"node {node} ({spec.name}) has GPUs of type {spec.gpu_type or 'titanxp (the reference)'}, "
                    f"the job asks for {demand.gpu_type}"
                )
    if not demand.declares_cpu_mem:
        return None
    try:
        alloc = Allocation.from_placement(placement, demand, cluster)
    except ResourceError as exc:
        return str(exc).removeprefix("allocation: ")
    return alloc.misfit(cluster, None, free_cpus, free_mem_gb)


def ps_layout(placement: Placement, ps: int) -> list[tuple[int, int]]:
    """``(node, PSs)`` of a job's ``ps`` parameter servers on ``placement``: its ``ps_nodes`` where it
    names them (a :class:`policies.elastic.ElasticPlacement` laid out by a ``spread`` cluster), else PS ``i`` on the
    ``i % k``-th of the placement's ``k`` nodes (ascending)."""
    lay = getattr(placement, "ps_nodes", ())
    if lay and sum(c for _, c in lay) == ps:
        return list(lay)
    k = placement.num_nodes
    if not ps or not k:
        return []
    base, extra = divmod(ps, k)
    return [(n, base + (1 if i < extra else 0)) for i, n in enumerate(placement.nodes) if base + (1 if i < extra else 0)]
