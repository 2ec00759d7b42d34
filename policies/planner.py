"""The lookahead planner (policy name ``planner``): each round it scores candidate decisions by short
rollouts of a model of the cluster and applies the best one.

Why ``planner`` and not ``plan``: inside the RL codec ``plan`` already names a candidate order
(:data:`policies.orders.CANDIDATE_ORDERS`, :class:`policies.orders.Plan`), and a policy name of the same
spelling would make ``rl-base`` options and policy names ambiguous in docs and error messages.

What a round does (:meth:`PlannerPolicy.schedule`):

1. **Candidates**, in a fixed order. For every heuristic of ``[base, *alternatives]`` (names of
   :func:`policies.heuristics.make_heuristic`; default ``greedy`` then ``srtf:nosplit``,
   ``lgtf:nosplit``, ``lgtf``): its decision for this snapshot, paired with the heuristic itself as
   the *default policy* of the rollout ("follow this heuristic from now on"). Then up to
   ``holds`` *hold* variants of the base heuristic's decision when it preempts nothing and jobs run:
   the same decision without its ``i``-th placement, rolled out with :class:`HoldPolicy` (the base
   heuristic, with that job held back until the first of the jobs running after the decision stops: waiting for GPUs to
   free up rather than backfilling a job that would block a wider one, or splitting a job that a
   node would soon take whole). A candidate whose decision and default policy equal an earlier
   one's is dropped.
2. **Horizon**: the base candidate is rolled out until ``horizon`` jobs have completed (all known
   jobs when ``horizon`` is 0); the time it reaches is the horizon ``t_end`` of every other
   candidate, so all are scored over the same window.
3. **Score** (lower is better): the sum over the snapshot's jobs of their estimated completion
   time minus now (s): the completion time in the rollout, or for a job unfinished when the
   rollout stops, the stop time plus its remaining isolated run time
   (:attr:`~policies.state.JobInfo.remaining_time`). On a fixed set of jobs this is the rollout's
   average JCT times the job count, up to a constant, so it ranks candidates by average JCT.
4. The lowest score wins; ties go to the earlier candidate (the base heuristic's decision first).

The model is a :class:`RolloutModel`: the planner hands it the frozen snapshot, a first decision,
the default policy and the horizon, and gets a score back. ``policies/`` holds no simulator (it
does no I/O and does not import ``trainer``); :func:`make_planner` takes the model as an argument,
and the one implementation, :class:`trainer.rollout.SimRollout` (a private
:class:`trainer.simulator.Simulator` built from the snapshot by
:meth:`~trainer.simulator.Simulator.from_state`), is imported by :func:`make_planner` only when no
model is given (the registry's path: ``rlsched simulate --policy planner``). The model knows only
the jobs in the snapshot: arrivals after now are not simulated.

**Budget**: ``budget_s`` wall seconds per round (default :func:`default_budget`: 1 s at 4 nodes,
10 s at 128 nodes, log-linear in the node count in between, at most 10 s). Candidates are scored
in their fixed order until the budget is spent; a rollout that would run past it is abandoned
and its candidate dropped; when only the base candidate is left, its decision is taken without a
rollout (also when the model cannot simulate the snapshot, e.g. a job of a model the performance
model does not know). A round therefore takes at most ``budget_s`` plus the time of one rollout step (one
simulated round) and the candidates' own decisions. The budget is read on :attr:`PlannerPolicy.clock`
(default :func:`time.perf_counter`; tests hand a simulated clock), and :attr:`RoundStats.rollouts` /
:attr:`RoundStats.scored` say how many rollouts a round started and how many it scored.

**Determinism**: the rollouts are deterministic (the simulator is event-driven and sees no
arrivals), so for a given snapshot the decision is a function of the snapshot and the options as
long as the budget does not cut the search; where it does, which candidates were scored depends
on the machine's speed. :attr:`PlannerPolicy.last_round` records how many were scored.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from policies.base import Policy, PolicyError
from policies.cluster import ClusterSpec
from policies.heuristics import OrderedPolicy, make_heuristic
from policies.perf import ContentionModel
from policies.state import ClusterState, Decision

__all__ = [
    "DEFAULT_ALTERNATIVES",
    "DEFAULT_BASE",
    "DEFAULT_HOLDS",
    "DEFAULT_HORIZON",
    "PLANNER_OPTIONS",
    "HoldPolicy",
    "PlannerPolicy",
    "RolloutModel",
    "RoundStats",
    "default_budget",
    "make_planner",
    "parse_planner_name",
]

#: The default policy of the rollouts and the source of the first candidate.
DEFAULT_BASE = "greedy"
#: The other heuristics whose decisions are candidates (each rolled out with itself).
DEFAULT_ALTERNATIVES = ("srtf:nosplit", "lgtf:nosplit", "lgtf")
#: Hold variants of the base decision per round.
DEFAULT_HOLDS = 2
#: Completions the base rollout runs to (0: every job of the snapshot).
DEFAULT_HORIZON = 16
#: The planner's options (keyword arguments of :func:`make_planner`, ``planner:KEY=VALUE/KEY=VALUE``).
PLANNER_OPTIONS = ("budget_s", "horizon", "holds", "base", "alternatives")


class RolloutModel(Protocol):
    """What the planner needs of a cluster model."""

    def rollout(self, state: ClusterState, first: Decision, policy: Policy, *, completions: int = 0,
                until: float = math.inf, deadline: float = math.inf) -> tuple[float, float] | None:
        """Apply ``first`` to a private copy of ``state``, then let ``policy`` decide every round
        until ``completions`` jobs have completed (0: all) or the time ``until`` (s) is reached.
        Returns ``(score, stop time)`` (score: module docstring, s), or ``None`` when ``first`` is
        invalid, the rollout fails, or the model's clock (the planner's, :attr:`PlannerPolicy.clock`)
        passed ``deadline``."""
        ...


def default_budget(cluster: ClusterSpec) -> float:
    """Seconds per round: 1 s at 4 nodes, 10 s at 128 nodes, log-linear in between, in [1, 10]."""
    n = max(cluster.num_nodes, 1)
    b = 10.0 ** (math.log(n / 4.0) / math.log(32.0))
    return float(min(max(b, 1.0), 10.0))


@dataclass(slots=True)
class RoundStats:
    """One round of the planner: candidates built, rollouts started (``rollouts``), rollouts that
    returned a score (``scored``), the winner's index (0: base), and whether the budget cut the
    search (``cut``)."""

    candidates: int = 0
    rollouts: int = 0
    scored: int = 0
    chosen: int = 0
    cut: bool = False


class HoldPolicy(Policy):
    """``base`` with the jobs ``held`` left out of the queue while every job of ``running_at`` still
    runs (the rollout policy of a hold candidate); afterwards ``base`` alone. Pure."""

    def __init__(self, base: OrderedPolicy, held: frozenset[str], running_at: frozenset[str]) -> None:
        self.base = base
        self.held = held
        self.running_at = running_at
        self.name = f"{base.name}+hold"

    @property
    def time_invariant(self) -> bool:
        return self.base.time_invariant

    def reset(self) -> None:
        self.base.reset()

    def schedule(self, state: ClusterState) -> Decision:
        if self.running_at and self.running_at <= {j.job_id for j in state.running}:
            pending = [j for j in state.pending if j.job_id not in self.held]
            if len(pending) != len(state.pending):
                st = ClusterState(state.time, state.cluster, state.free_gpus, state.running, pending,
                                  state.usable, state.lookup)
                for k in ("_handed", "_contention"):  # the same running jobs: the same contention ledger
                    if k in state.__dict__:
                        st.__dict__[k] = state.__dict__[k]
                state = st
        return self.base.schedule(state)


def _key(dec: Decision) -> tuple:
    return (tuple((j, tuple(p.alloc)) for j, p in dec.place), tuple(dec.preempt), tuple(dec.resize))


@dataclass(eq=False)
class PlannerPolicy(Policy):
    """The lookahead planner (module docstring). Pure: snapshot in, :class:`Decision` out.

    :param model: the rollout model.
    :param base: the base heuristic (rollout default policy, first candidate).
    :param alternatives: other heuristics whose decisions are candidates.
    :param budget_s: wall seconds per round (> 0).
    :param horizon: completions of the base rollout that set the horizon (0: all jobs).
    :param holds: hold variants of the base decision per round (>= 0).
    :param clock: seconds, monotonic (default :func:`time.perf_counter`); the budget is measured on it
        and the model is handed deadlines on it (a model built by :func:`make_planner` reads the same
        clock).
    """

    model: RolloutModel
    base: OrderedPolicy
    alternatives: tuple[OrderedPolicy, ...] = ()
    budget_s: float = 1.0
    horizon: int = DEFAULT_HORIZON
    holds: int = DEFAULT_HOLDS
    name: str = "planner"
    clock: Callable[[], float] = time.perf_counter
    #: the last round's statistics
    last_round: RoundStats = field(default_factory=RoundStats)

    @property
    def time_invariant(self) -> bool:
        """Like its heuristics: the same snapshot gives the same decision when none preempts."""
        return all(h.time_invariant for h in (self.base, *self.alternatives))

    def reset(self) -> None:
        for h in (self.base, *self.alternatives):
            h.reset()

    def _decide(self, h: OrderedPolicy, state: ClusterState) -> Decision:
        h.place_limit = self.place_limit
        try:
            return h.schedule(state)
        finally:
            h.place_limit = None

    def candidates(self, state: ClusterState) -> list[tuple[Decision, Policy]]:
        """The round's candidates ``(first decision, default policy)`` in their fixed order."""
        out: list[tuple[Decision, Policy]] = []
        seen: set[tuple] = set()

        def add(dec: Decision, h: Policy, held: str = "") -> None:
            k = (_key(dec), id(h) if not held else id(self.base), held)
            if k not in seen:
                seen.add(k)
                out.append((dec, h))

        first = self._decide(self.base, state)
        add(first, self.base)
        for h in self.alternatives:
            add(self._decide(h, state), h)
        if not first.preempt and not first.resize:
            now_running = frozenset(j.job_id for j in state.running)
            for i in range(min(self.holds, len(first.place))):
                jid = first.place[i][0]
                rest = [x for k, x in enumerate(first.place) if k != i]
                running_at = now_running | {j for j, _p in rest}
                if running_at:  # something runs to wait for
                    add(Decision(place=rest), HoldPolicy(self.base, frozenset((jid,)), running_at), jid)
        return out

    def schedule(self, state: ClusterState) -> Decision:
        """Score the candidates by rollouts within the budget and return the best decision."""
        clock = self.clock
        deadline = clock() + self.budget_s
        cands = self.candidates(state)
        stats = self.last_round = RoundStats(candidates=len(cands))
        if len(cands) == 1:
            return cands[0][0]
        first, base = cands[0]
        stats.rollouts = 1
        got = self.model.rollout(state, first, base, completions=self.horizon, deadline=deadline)
        if got is None:  # out of time, or a snapshot the model cannot simulate: the base decision
            stats.cut = clock() >= deadline
            return first
        best_score, t_end = got
        stats.scored = 1
        best = 0
        for i in range(1, len(cands)):
            if clock() >= deadline:
                stats.cut = True
                break
            dec, h = cands[i]
            stats.rollouts += 1
            res = self.model.rollout(state, dec, h, until=t_end, deadline=deadline)
            if res is None:
                if clock() >= deadline:
                    stats.cut = True
                    break
                continue
            stats.scored += 1
            if res[0] < best_score * (1 - 1e-12) - 1e-9:
                best_score, best = res[0], i
        stats.chosen = best
        return cands[best][0]


def parse_planner_name(name: str) -> dict[str, str]:
    """``planner`` or ``planner:KEY=VALUE/KEY=VALUE`` -> ``{KEY: VALUE}`` (``/`` separates options because
    ``--policy`` lists are comma-separated and heuristic names hold ``:``; ``alternatives`` are joined
    by ``+``: ``planner:base=lgtf/alternatives=srtf:nosplit+greedy``). :class:`PolicyError` (one line)
    for a malformed or unknown option."""
    raw = name.strip()
    _, sep, rest = raw.partition(":")
    out: dict[str, str] = {}
    if not sep:
        return out
    for item in rest.split("/"):
        k, eq, v = item.partition("=")
        k = k.strip().lower()
        if not eq or not k or not v.strip():
            raise PolicyError(f"policy {name!r}: planner options are KEY=VALUE separated by /, got {item!r}")
        if k not in PLANNER_OPTIONS:
            raise PolicyError(f"policy {name!r}: unknown planner option {k!r}; options: {', '.join(PLANNER_OPTIONS)}")
        out[k] = v.strip()
    return out


def _number(name: str, key: str, v: object, integer: bool, low: float, strict: bool) -> float:
    try:
        if isinstance(v, bool):
            raise ValueError
        x = int(v) if integer and not isinstance(v, float) else float(v)  # type: ignore[arg-type]
        if integer and isinstance(v, float):
            raise ValueError
    except (TypeError, ValueError):
        kind = "an integer" if integer else "a number"
        raise PolicyError(f"policy {name!r}: {key} must be {kind}, got {v!r}") from None
    if not math.isfinite(x) or x < low or (strict and x <= low):
        raise PolicyError(f"policy {name!r}: {key} must be {'>' if strict else '>='} {low:g}, got {v!r}")
    return x


def make_planner(name: str, cluster: ClusterSpec, perf: ContentionModel | None = None,
                 model: RolloutModel | None = None, clock: Callable[[], float] = time.perf_counter,
                 **options: object) -> PlannerPolicy:
    """The planner for ``cluster``: options from ``name`` (``planner:budget_s=2/horizon=0``) and
    keyword arguments (:data:`PLANNER_OPTIONS`; keyword arguments win). ``model`` defaults to
    :class:`trainer.rollout.SimRollout` over ``perf`` reading ``clock`` (imported here, not at module
    level); ``clock`` is the planner's (:attr:`PlannerPolicy.clock`).

    :raises PolicyError: an unknown option, a bad value or an unknown heuristic; one line naming it.
    """
    opts: dict[str, object] = dict(parse_planner_name(name))
    unknown = sorted(set(options) - set(PLANNER_OPTIONS))
    if unknown:
        raise PolicyError(
            f"policy {name!r}: unknown planner option {unknown[0]!r}; options: {', '.join(PLANNER_OPTIONS)}")
    opts.update({k: v for k, v in options.items() if v is not None})
    perf = perf or ContentionModel(cluster)
    budget = (_number(name, "budget_s", opts["budget_s"], False, 0.0, True) if "budget_s" in opts
              else default_budget(cluster))
    horizon = int(_number(name, "horizon", opts.get("horizon", DEFAULT_HORIZON), True, 0, False))
    holds = int(_number(name, "holds", opts.get("holds", DEFAULT_HOLDS), True, 0, False))
    base_name = str(opts.get("base", DEFAULT_BASE))
    alts = opts.get("alternatives", DEFAULT_ALTERNATIVES)
    if isinstance(alts, str):
        alts = tuple(a for a in (x.strip() for x in alts.split("+")) if a)
    try:
        base = make_heuristic(base_name, perf)
        alternatives = tuple(make_heuristic(str(a), perf) for a in alts)  # type: ignore[union-attr]
    except PolicyError as exc:
        raise PolicyError(f"policy {name!r}: {exc}") from None
    if model is None:
        from trainer.rollout import SimRollout  # the simulator lives in trainer (module docstring)

        model = SimRollout(perf, clock=clock)
    return PlannerPolicy(model=model, base=base, alternatives=alternatives, budget_s=budget, horizon=horizon,
                         holds=holds, name=name.strip(), clock=clock)
