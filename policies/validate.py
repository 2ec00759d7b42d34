"""Decision validation: the one set of rules every backend applies a :class:`~policies.state.Decision` by.

:func:`check_decision` checks a decision against the snapshot it was made from and lists every
entry that cannot be applied, as a :class:`Problem` naming the entry, the job and why. It is
pure: it reads the :class:`~policies.state.ClusterState` only (free GPUs, usable nodes, the
running and pending jobs) and changes nothing.

Entries are checked in the order they are applied (:class:`~policies.state.Decision`):
preemptions, then resizes, then placements. An entry found invalid is left out of the
accounting, so the entries that remain (:func:`without`) are valid together: GPUs come free only
through valid preemptions and resizes, and each valid placement or resize takes its GPUs from
what the valid entries before it left. Two uses, same rules:

* all or nothing (the simulator): the first problem is an error and nothing is applied;
* drop the bad entries (the Slurm controller): each problem is logged and counted, and
  ``without(decision, problems)`` is applied.

Rules (the message of each problem names the job and the reason):

* preempt: the job must be running, and be preempted once;
* resize: the job must be running and not preempted by this decision, resized once, elastic
  (:attr:`~policies.state.JobInfo.elastic`), to a GPU total within ``[min_gpus, max_gpus]``,
  on a valid placement (below) that fits the free GPUs plus the job's own current ones;
* place: the job must be pending (or running and preempted by this decision: a migration),
  placed once, on a placement of exactly its ``gpu_demand`` GPUs that is valid and fits.

A valid placement (:func:`placement_problem`) has distinct nodes each with at least one GPU
(``Placement.of`` builds such), every node a node of the cluster and usable, and fits the free
GPUs of each of its nodes. GPUs freed on an unusable node do not count as free.

Beyond GPU counts, a job with a resource demand (:attr:`~policies.state.JobInfo.demand` with a GPU
type, CPUs or memory) is placed or resized only where :func:`policies.resources.placement_misfit`
finds it fits: every node has GPUs of its type, and its workers' and parameter servers' CPUs and
memory fit each node's free CPUs / memory (:meth:`~policies.state.ClusterState.free_cpu_mem`, plus
what the decision's valid preemptions and resizes release, less what its earlier valid entries
take; an elastic placement's parameter-server count replaces the demand's). A job without such a
demand fits wherever its GPUs do, so policies that ignore GPU types, CPUs and memory are checked
exactly as on a cluster that declares none. A placement that names a parameter-server count
(:class:`policies.elastic.ElasticPlacement`) gives a job whose demand has parameter servers at
least one and a job without them none.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from policies.cluster import Placement
from policies.resources import Allocation, placement_misfit
from policies.state import ClusterState, Decision, JobInfo

__all__ = ["AFTER_EARLIER", "Problem", "check_decision", "placement_problem", "ps_problem", "without"]

#: what "does not fit" messages of :func:`check_decision` add: the free GPUs are counted after the earlier entries
AFTER_EARLIER = " (after the decision's preemptions and earlier placements)"

Action = Literal["preempt", "resize", "place"]


@dataclass(frozen=True)
class Problem:
    """One decision entry that cannot be applied.

    :param action: which list of the decision holds it: ``"preempt"``, ``"resize"`` or ``"place"``.
    :param index: its position in that list (0-based).
    :param job_id: the job the entry names.
    :param message: one line naming the job and why.
    """

    action: Action
    index: int
    job_id: str
    message: str

    def __str__(self) -> str:
        return self.message


def placement_problem(job_id: str, demand: int, p: Placement, free: Sequence[int], usable: Sequence[bool] | None = None,
                      context: str = "", delta: dict[int, int] | None = None) -> str | None:
    """Why placement ``p`` of job ``job_id`` cannot be made now, or ``None`` when it can.

    :param demand: the GPU total ``p`` must have.
    :param free: free GPUs per node (its length is the number of nodes).
    :param usable: per node, whether jobs may be placed there; ``None``: every node is.
    :param context: appended to the "does not fit" reason (what ``free`` counts).
    :param delta: optional node -> change of its free GPUs: node ``n`` has ``free[n] + delta.get(n, 0)``.
    """
    alloc = p.alloc
    if p.total_gpus != demand:
        return f"job {job_id}: placement {p} has {p.total_gpus} GPUs, demand is {demand}"
    num_nodes = len(free)
    prev = -1
    for n, c in alloc:  # the common case in one pass: ascending nodes (so none repeats), each usable and fitting
        if n <= prev or c <= 0 or n >= num_nodes or (usable is not None and not usable[n]):
            break
        if c > (free[n] if delta is None else free[n] + delta.get(n, 0)):
            break
        prev = n
    else:
        return None
    seen = set()
    for n, c in alloc:
        if c <= 0 or n in seen:
            return f"job {job_id}: placement {p} repeats a node or has an empty one (build it with Placement.of)"
        seen.add(n)
    for n, c in alloc:
        if n < 0 or n >= num_nodes:
            return (f"job {job_id}: placement {p} does not fit: node {n} is not a node of the cluster "
                    f"({num_nodes} nodes)")
        if usable is not None and not usable[n]:
            return f"job {job_id}: placement {p} does not fit: node {n} is not usable (drained, down or missing)"
        f = free[n] if delta is None else free[n] + delta.get(n, 0)
        if c > f:
            return f"job {job_id}: placement {p} does not fit: node {n} has {int(f)} free GPUs, it needs {c}{context}"
    return None


def _names_ps(p: Placement) -> bool:
    """Whether ``p`` names a parameter-server count (an elastic placement); a plain :class:`Placement` never
    does (tested first: a failed attribute look-up costs an exception)."""
    return p.__class__ is not Placement and hasattr(p, "ps")


def _take(delta: dict[int, int], p: Placement, sign: int, usable) -> None:
    """Add ``sign`` times ``p``'s GPUs to ``delta`` (on usable nodes only, when ``usable`` is given)."""
    for n, c in p.alloc:
        if usable is None or usable[n]:
            delta[n] = delta.get(n, 0) + sign * c


class _Free(Sequence):
    """Free CPUs (or memory) per node: the snapshot's, plus a per-node change (``None`` entries stay None)."""

    __slots__ = ("base", "delta")

    def __init__(self, base: Sequence, delta: dict) -> None:
        self.base, self.delta = base, delta

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, n):  # type: ignore[override]
        b = self.base[n]
        return None if b is None else b + self.delta.get(n, 0)


class CpuMemTaken:
    """The CPUs and memory a decision's accepted entries release and take, per node, over a snapshot;
    reads the snapshot's free CPUs / memory only when a job with a demand is placed. The decision
    validator (:func:`check_decision`) and the ordered heuristics (:class:`policies.heuristics.OrderedPolicy`,
    while they build a round's decision) keep one."""

    __slots__ = ("state", "cpus", "mem")

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.cpus: dict[int, int] = {}  # node -> change of its free CPU cores
        self.mem: dict[int, float] = {}  # node -> change of its free memory, GB

    def copy(self) -> "CpuMemTaken":
        """An independent copy (for a trial that may be dropped)."""
        out = CpuMemTaken(self.state)
        out.cpus, out.mem = dict(self.cpus), dict(self.mem)
        return out

    def free(self) -> tuple[Sequence[int | None], Sequence[float | None]]:
        """Free CPU cores and memory (GB) per node after the changes; ``None`` for a node that declares
        none (no limit)."""
        cpus, mem = self.state.free_cpu_mem()
        return _Free(cpus, self.cpus), _Free(mem, self.mem)

    def take(self, info: JobInfo, p: Placement, sign: int) -> None:
        """Add ``sign`` times what ``info``'s demand holds on ``p`` to the free CPUs and memory (+1: ``p``
        is released, -1: taken; nothing for a plain demand)."""
        d = info.demand_for(p)
        if d is None or not d.declares_cpu_mem:
            return
        for n, (_g, c, m) in Allocation.from_placement(p, d, self.state.cluster).per_node().items():
            if c:
                self.cpus[n] = self.cpus.get(n, 0) + sign * c
            if m:
                self.mem[n] = self.mem.get(n, 0.0) + sign * m

    def misfit(self, info: JobInfo, p: Placement) -> str | None:
        """Why ``info``'s demand does not fit on ``p`` beyond GPU counts (parameter-server count, GPU type,
        CPUs, memory), or None."""
        why = ps_problem(info, p)
        if why is not None:
            return why
        d = info.demand_for(p)
        if d is None:
            return None
        cpus, mem = self.free()
        why = placement_misfit(d, p, self.state.cluster, cpus, mem)
        return None if why is None else f"job {info.job_id}: placement {p} does not fit: {why}"


def ps_problem(info: JobInfo, p: Placement) -> str | None:
    """The parameter-server rule of a placement that names a PS count (``p.ps``, an elastic placement):
    a job whose demand has parameter servers gets at least one, a job without them none."""
    ps = getattr(p, "ps", None)
    if not isinstance(ps, int):
        return None
    d = info.demand
    if d is None or d.ps == 0:
        if ps:
            return f"job {info.job_id}: placement {p} gives {ps} parameter servers to a job without PSs"
    elif ps < 1:
        return f"job {info.job_id}: placement {p} gives a parameter-server job no PS"
    return None


def check_decision(state: ClusterState, decision: Decision) -> list[Problem]:
    """Every entry of ``decision`` that cannot be applied to ``state``, in the order of application
    (preemptions, resizes, placements; see the module docstring for the rules). Empty: all of it
    can. Pure: reads ``state`` only."""
    usable = state.usable
    free = state.free_gpus
    fb = state.__dict__.get("_free_bytes")  # state.free_bytes() where a backend handed the bytes in
    fb = fb[1] if fb is not None and fb[0] is free else state.free_bytes()
    if fb is not None:
        free = fb[0]  # the same counts as free_gpus, read as Python ints (no numpy scalar per node)
    job = state.lookup or state.job  # ClusterState.job calls the backend's lookup when there is one
    place = decision.place
    if len(place) == 1 and not decision.preempt and not decision.resize:
        # one placement alone (most rounds of a simulation): the same rules as the loops below, without
        # their bookkeeping, for a waiting job with a plain demand on a plain Placement
        jid, p = place[0]
        info = job(jid)
        if info is not None and info.placement is None and info.demand is None and p.__class__ is Placement:
            if p.total_gpus == info.gpu_demand:  # placement_problem's first pass
                prev, size = -1, len(free)
                for n, c in p.alloc:  # ascending nodes (so none repeats), each usable and fitting
                    if n <= prev or c <= 0 or n >= size or c > free[n] or (usable is not None and not usable[n]):
                        break
                    prev = n
                else:
                    return []
            why = placement_problem(jid, info.gpu_demand, p, free, usable, AFTER_EARLIER)
            return [] if why is None else [Problem("place", 0, jid, why)]
    problems: list[Problem] = []
    delta: dict[int, int] = {}  # node -> change of its free GPUs by the entries accepted so far
    res = CpuMemTaken(state)  # CPUs and memory released and taken by the accepted entries

    gone: set[str] = set()
    for i, jid in enumerate(decision.preempt):
        info = job(jid)
        if info is None or info.placement is None:
            problems.append(Problem("preempt", i, jid, f"decision preempts job {jid!r}, which is not running"))
        elif jid in gone:
            problems.append(Problem("preempt", i, jid, f"decision preempts job {jid!r} twice"))
        else:
            gone.add(jid)
            _take(delta, info.placement, +1, usable)
            if info.demand is not None:
                res.take(info, info.placement, +1)

    resized: set[str] = set()
    for i, (jid, p) in enumerate(decision.resize):
        info = job(jid)
        if info is None or info.placement is None:
            why = f"decision resizes job {jid!r}, which is not running"
        elif jid in gone:
            why = f"decision resizes job {jid!r}, which it also preempts"
        elif jid in resized:
            why = f"decision resizes job {jid!r} twice"
        elif not info.elastic:
            why = f"job {jid}: not elastic (no min_gpus/max_gpus range): it cannot be resized"
        elif not info.min_gpus <= p.total_gpus <= info.max_gpus:  # type: ignore[operator]
            why = (f"job {jid}: resize to {p.total_gpus} GPUs is outside its range "
                   f"[{info.min_gpus}, {info.max_gpus}]")
        else:
            own = info.placement
            _take(delta, own, +1, usable)  # its own GPUs are free for its new placement
            why = placement_problem(jid, p.total_gpus, p, free, usable,
                                    " (with its own GPUs, after the decision's preemptions and earlier resizes)", delta)
            if why is None and (info.demand is not None or _names_ps(p)):
                res.take(info, own, +1)  # and its own CPUs and memory
                why = res.misfit(info, p)
                if why is None:
                    res.take(info, p, -1)
                else:
                    res.take(info, own, -1)
            if why is None:
                _take(delta, p, -1, None)
            else:
                _take(delta, own, -1, usable)
        if why is None:
            resized.add(jid)
        else:
            problems.append(Problem("resize", i, jid, why))

    placed: set[str] = set()
    for i, (jid, p) in enumerate(decision.place):
        info = job(jid)
        if info is None:
            why = (f"job {jid}: not pending (decision places job {jid!r}, which is neither pending nor running: "
                   "not submitted yet, finished or unknown)")
        elif jid in placed:
            why = f"decision places job {jid!r} twice"
        elif info.placement is not None and jid not in gone:
            why = f"job {jid}: already running (decision places it without preempting it)"
        else:
            why = placement_problem(jid, info.gpu_demand, p, free, usable, AFTER_EARLIER, delta)
            if why is None and (info.demand is not None or _names_ps(p)):
                why = res.misfit(info, p)
                if why is not None and (res.cpus or res.mem):
                    why += AFTER_EARLIER
        if why is None:
            placed.add(jid)
            for n, c in p.alloc:  # _take(delta, p, -1, None)
                delta[n] = delta.get(n, 0) - c
            if info.demand is not None:  # type: ignore[union-attr]
                res.take(info, p, -1)  # type: ignore[arg-type]
        else:
            problems.append(Problem("place", i, jid, why))
    return problems


def without(decision: Decision, problems: Sequence[Problem]) -> Decision:
    """``decision`` less the entries ``problems`` name (by action and index); a new :class:`Decision`.
    With ``problems = check_decision(state, decision)`` what is left is valid on ``state`` as a whole."""
    if not problems:
        return decision
    bad = {(p.action, p.index) for p in problems}
    return Decision(
        place=[e for i, e in enumerate(decision.place) if ("place", i) not in bad],
        preempt=[e for i, e in enumerate(decision.preempt) if ("preempt", i) not in bad],
        resize=[e for i, e in enumerate(decision.resize) if ("resize", i) not in bad],
    )
