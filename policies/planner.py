"""The lookahead planner (policy name ``planner``): each round it scores candidate decisions by short
rollouts of a model of the cluster and applies the best one.

Why ``planner`` and not ``plan``: inside the RL codec ``plan`` already names a candidate order
(:data:`policies.orders.CANDIDATE_ORDERS`, :class:`policies.orders.Plan`), and a policy name of the same
spelling would make ``rl-base`` options and policy names ambiguous in docs and error messages.

What a round does (:meth:`PlannerPolicy.schedule`):

1. **Candidates**, in a fixed order. For every heuristic of ``[base, *alternatives]`` (names of
   :func:`policies.heuristics.make_heuristic`; default ``greedy`` then ``srtf:nosplit``,
   ``lgtf:nosplit``, ``lgtf``): its decision for this snapshot, paired with the heuristic itself as
   the *default policy* of the rollout ("follow this heuristic from now on"; with ``follow=base``
   the base heuristic instead, so that candidates differ in their first decision only). Then up to
   ``holds`` *hold* variants of the base heuristic's decision when it preempts nothing and jobs run:
   the same decision without its ``i``-th placement, rolled out with :class:`HoldPolicy` (the base
   heuristic, with that job held back until the first of the jobs running after the decision stops: waiting for GPUs to
   free up rather than backfilling a job that would block a wider one, or splitting a job that a
   node would soon take whole). A candidate whose decision and default policy equal an earlier
   one's is dropped.
2. **Horizon**: the base candidate is rolled out until ``horizon`` jobs have completed (as many
   as the snapshot holds when ``horizon`` is 0; without arrivals: all of them); the time it
   reaches is the horizon ``t_end`` of every other candidate, so all are scored over the same window.
3. **Score** (lower is better): the sum over the snapshot's jobs (and the sampled arrivals submitted
   by the stop time) of their estimated completion time minus the later of now and their submit
   time (s): the completion time in the rollout, or for a job unfinished when the rollout stops,
   the stop time plus its remaining isolated run time
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
the jobs in the snapshot, plus the arrivals the planner samples (next paragraph).

**Sampled arrivals** (option ``arrivals=K``, default :data:`DEFAULT_ARRIVALS`; 0: the rollouts see
only the snapshot's jobs). An :class:`ArrivalModel` is estimated from the snapshot alone: the
arrival rate from the submit times of the jobs it holds (running and pending: the number of jobs
submitted after the :data:`ARRIVAL_WINDOW` + 1-th most recent distinct submit time, over the time
from that one to the most recent; no two distinct submit times, e.g. every job submitted at t = 0: rate 0, no arrivals), and
job shapes (model, GPUs, samples, resource demand) drawn with replacement from those same recent
jobs. ``K`` sample paths (Poisson at that rate after ``now``, each with
``2 x horizon`` jobs, or ``2 x`` the snapshot's job count when ``horizon`` is 0) are drawn from a
generator seeded by the snapshot (:func:`snapshot_seed`: its jobs' shapes and submit times
relative to the earliest, so a run is reproducible and the seed does not depend on the clock's
origin), and every candidate is rolled out once per path (common random numbers): its score is
the mean over the paths, and the base candidate's stop time on a path is the horizon of the others
on that path. The score then sums over every job present by the stop time, an arrival counted from
its submit time. The snapshot under-represents short jobs that arrived and already finished, so the
rate is an underestimate and the shapes lean to longer jobs where such jobs are common; the
estimate does not read the clock (the time since the last arrival does not lower it), so the
planner stays time-invariant between events, and after a trace's last arrival it still expects
arrivals at the last rate.

**Work budget** (option ``work=N``, 0: none): at most ``N`` simulated rounds (default-policy calls
inside the rollouts) per planner round, counted over all its rollouts; a rollout that would exceed
it is abandoned, its candidate dropped and the search stopped there, as with the wall budget. It is
deterministic: with ``work`` set and no ``budget_s`` given, there is no wall budget, and the decision
is a function of the snapshot and the options alone on any machine.

**Budget**: ``budget_s`` wall seconds per round (default :func:`default_budget`: 1 s at 4 nodes,
10 s at 128 nodes, log-linear in the node count in between, at most 10 s). Candidates are scored
in their fixed order until the budget is spent; a rollout that would run past it is abandoned
and its candidate dropped; when only the base candidate is left, its decision is taken without a
rollout (also when the model cannot simulate the snapshot, e.g. a job of a model the performance
model does not know). A round therefore takes at most ``budget_s`` plus the time of one rollout step (one
simulated round) and the candidates' own decisions. The budget is read on :attr:`PlannerPolicy.clock`
(default :func:`time.perf_counter`; tests hand a simulated clock), and :attr:`RoundStats.rollouts` /
:attr:`RoundStats.scored` say how many rollouts a round started and how many it scored.

**Determinism**: the rollouts are deterministic (the simulator is event-driven, and the sampled
arrivals come from a generator seeded by the snapshot), so for a given snapshot the decision is a
function of the snapshot and the options as long as the wall budget does not cut the search; where
it does, which candidates were scored depends on the machine's speed (the work budget does not
have this dependence). :attr:`PlannerPolicy.last_round` records how many were scored.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import numpy as np

from policies.base import Policy, PolicyError
from policies.cluster import ClusterSpec
from policies.heuristics import OrderedPolicy, make_heuristic
from policies.job import JobSpec
from policies.perf import ContentionModel
from policies.resources import ResourceDemand
from policies.state import ClusterState, Decision, JobInfo

__all__ = [
    "ARRIVAL_WINDOW",
    "DEFAULT_ALTERNATIVES",
    "DEFAULT_ARRIVALS",
    "DEFAULT_BASE",
    "DEFAULT_HOLDS",
    "DEFAULT_HORIZON",
    "PLANNER_OPTIONS",
    "ArrivalModel",
    "HoldPolicy",
    "PlannerPolicy",
    "Rollout",
    "RolloutModel",
    "RoundStats",
    "default_budget",
    "make_planner",
    "parse_planner_name",
    "snapshot_seed",
]

#: The default policy of the rollouts and the source of the first candidate.
DEFAULT_BASE = "greedy"
#: The other heuristics whose decisions are candidates (each rolled out with itself).
DEFAULT_ALTERNATIVES = ("srtf:nosplit", "lgtf:nosplit", "lgtf")
#: Hold variants of the base decision per round.
DEFAULT_HOLDS = 2
#: Completions the base rollout runs to (0: every job of the snapshot).
DEFAULT_HORIZON = 16
#: Sampled arrival paths per candidate (0: the rollouts see the snapshot's jobs only).
DEFAULT_ARRIVALS = 0
#: Recent distinct submit times the arrival model is estimated from (:class:`ArrivalModel`).
ARRIVAL_WINDOW = 16
#: The planner's options (keyword arguments of :func:`make_planner`, ``planner:KEY=VALUE/KEY=VALUE``).
PLANNER_OPTIONS = ("budget_s", "horizon", "holds", "base", "alternatives", "arrivals", "work", "follow")


class Rollout(NamedTuple):
    """One rollout's result: ``score`` (s, module docstring; ``None`` when the rollout ran out of its
    ``max_rounds`` before its horizon), the snapshot-clock time it stopped at (s), and the simulated
    rounds it took."""

    score: float | None
    stop: float
    rounds: int


class RolloutModel(Protocol):
    """What the planner needs of a cluster model."""

    def rollout(self, state: ClusterState, first: Decision, policy: Policy, *, completions: int = 0,
                until: float = math.inf, deadline: float = math.inf, arrivals: Sequence[JobSpec] = (),
                max_rounds: int = 0) -> Rollout | None:
        """Apply ``first`` to a private copy of ``state`` in which the jobs of ``arrivals`` (submitted
        after ``state.time``) arrive later, then let ``policy`` decide every round until
        ``completions`` jobs have completed (0: every job, the arrivals' too) or the time ``until``
        (s) is reached, or ``max_rounds`` rounds have run (0: no limit; the result's score is then
        ``None``). Returns a :class:`Rollout`, or ``None`` when ``first`` is invalid, the rollout
        fails, or the model's clock (the planner's, :attr:`PlannerPolicy.clock`) passed ``deadline``.
        The planner passes ``arrivals`` and ``max_rounds`` only when it has some (a model of the
        snapshot's jobs alone may leave them out)."""
        ...


@dataclass(frozen=True, slots=True)
class ArrivalModel:
    """Future arrivals as estimated from one snapshot (module docstring, "Sampled arrivals"):
    a Poisson process of ``rate`` jobs/s whose jobs' shapes are drawn uniformly from ``shapes``
    (``(model, GPUs, total samples, resource demand or None)``)."""

    rate: float
    shapes: tuple[tuple[str, int, float, ResourceDemand | None], ...]

    @classmethod
    def estimate(cls, state: ClusterState, window: int = ARRIVAL_WINDOW) -> "ArrivalModel":
        """The model of ``state``'s running and pending jobs: with ``u`` the ``window + 1`` most recent
        distinct submit times (fewer when there are fewer), the rate is the number of jobs submitted
        after ``u[0]`` over ``u[-1] - u[0]`` (s), and the shapes are those jobs'. Rate 0 and no shapes
        with fewer than two distinct submit times."""
        jobs: list[JobInfo] = [*state.running, *state.pending]
        times = sorted({min(j.submit_time, state.time) for j in jobs})
        if len(times) < 2 or window < 1:
            return cls(0.0, ())
        u = times[-min(window, len(times) - 1) - 1:]
        span = u[-1] - u[0]
        recent = [j for j in jobs if min(j.submit_time, state.time) > u[0]]
        if not span > 0 or not recent:
            return cls(0.0, ())
        shapes = sorted(((j.model, int(j.gpu_demand), float(j.total_samples),
                          j.demand if j.demand is not None and j.demand.gpus == j.gpu_demand else None)
                         for j in recent), key=lambda s: (s[0], s[1], s[2]))
        return cls(len(recent) / span, tuple(shapes))

    def sample(self, rng: np.random.Generator, now: float, count: int, prefix: str) -> tuple[JobSpec, ...]:
        """``count`` jobs arriving after ``now`` (s): exponential gaps of mean ``1 / rate``, shapes drawn
        with replacement; ids ``f"{prefix}{i}"``. Empty when the rate is 0."""
        if not self.rate > 0 or count <= 0 or not self.shapes:
            return ()
        t = now + np.cumsum(rng.exponential(1.0 / self.rate, size=count))
        pick = rng.integers(len(self.shapes), size=count)
        after = math.nextafter(now, math.inf)
        out = []
        for i in range(count):
            model, gpus, samples, demand = self.shapes[int(pick[i])]
            out.append(JobSpec(f"{prefix}{i}", max(float(t[i]), after), model, gpus, samples, demand=demand))
        return tuple(out)


def snapshot_seed(state: ClusterState) -> int:
    """A 64-bit seed from the snapshot's jobs: their models, GPU demands, total samples and submit times
    relative to the earliest (rounded to whole seconds), in a canonical order. The same jobs give the
    same seed whatever the clock's origin (simulator seconds or the controller's epoch seconds) and
    whatever the time of the round."""
    jobs = [*state.running, *state.pending]
    t0 = min((j.submit_time for j in jobs), default=0.0)
    rows = sorted((j.model, int(j.gpu_demand), float(j.total_samples).hex(), round(j.submit_time - t0))
                  for j in jobs)
    return int.from_bytes(hashlib.blake2b(repr(rows).encode(), digest_size=8).digest(), "little")


def default_budget(cluster: ClusterSpec) -> float:
    """Seconds per round: 1 s at 4 nodes, 10 s at 128 nodes, log-linear in between, in [1, 10]."""
    n = max(cluster.num_nodes, 1)
    b = 10.0 ** (math.log(n / 4.0) / math.log(32.0))
    return float(min(max(b, 1.0), 10.0))


@dataclass(slots=True)
class RoundStats:
    """One round of the planner: candidates built, rollouts started (``rollouts``), candidates whose
    rollouts all returned a score (``scored``), the winner's index (0: base), whether the wall or
    work budget cut the search (``cut``), the arrival paths each candidate was rolled out on
    (``paths``: 1 without sampled arrivals) and the simulated rounds of all rollouts (``work``)."""

    candidates: int = 0
    rollouts: int = 0
    scored: int = 0
    chosen: int = 0
    cut: bool = False
    paths: int = 1
    work: int = 0


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
    :param horizon: completions of the base rollout that set the horizon (0: as many as the snapshot holds).
    :param holds: hold variants of the base decision per round (>= 0).
    :param arrivals: sampled arrival paths per candidate (0: none; module docstring).
    :param work: simulated rounds per planner round over all rollouts (0: no limit).
    :param follow: the default policy of a heuristic's candidate: ``"own"`` (that heuristic) or ``"base"``
        (the base heuristic: the candidates then differ in their first decision only).
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
    arrivals: int = DEFAULT_ARRIVALS
    work: int = 0
    follow: str = "own"
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
            add(self._decide(h, state), self.base if self.follow == "base" else h)
        if not first.preempt and not first.resize:
            now_running = frozenset(j.job_id for j in state.running)
            for i in range(min(self.holds, len(first.place))):
                jid = first.place[i][0]
                rest = [x for k, x in enumerate(first.place) if k != i]
                running_at = now_running | {j for j, _p in rest}
                if running_at:  # something runs to wait for
                    add(Decision(place=rest), HoldPolicy(self.base, frozenset((jid,)), running_at), jid)
        return out

    def arrival_paths(self, state: ClusterState) -> list[tuple[JobSpec, ...]]:
        """The round's sampled arrival paths (module docstring): ``arrivals`` paths when the
        snapshot's arrival model has a positive rate, else one empty path (the snapshot's jobs only)."""
        if self.arrivals <= 0:
            return [()]
        model = ArrivalModel.estimate(state)
        if not model.rate > 0:
            return [()]
        n_known = len(state.running) + len(state.pending)
        count = 2 * (self.horizon if self.horizon > 0 else n_known)
        ids = {j.job_id for j in (*state.running, *state.pending)}
        prefix = "~arrival:"
        while any(i.startswith(prefix) for i in ids):
            prefix = "~" + prefix
        seed = snapshot_seed(state)
        return [model.sample(np.random.default_rng([seed, k]), state.time, count, f"{prefix}{k}.")
                for k in range(self.arrivals)]

    def schedule(self, state: ClusterState) -> Decision:
        """Score the candidates by rollouts within the budgets and return the best decision."""
        clock = self.clock
        deadline = clock() + self.budget_s
        cands = self.candidates(state)
        stats = self.last_round = RoundStats(candidates=len(cands))
        if len(cands) == 1:
            return cands[0][0]
        paths = self.arrival_paths(state)
        stats.paths = len(paths)
        first, base = cands[0]
        goal = self.horizon if self.horizon > 0 else len(state.running) + len(state.pending)
        ends: list[float] = []
        total = 0.0
        for arr in paths:
            got = self._rollout(state, first, base, arr, deadline, stats, completions=goal)
            if got is None:  # out of time or work, or a snapshot the model cannot simulate: the base decision
                return first
            total += got.score  # type: ignore[operator]
            ends.append(got.stop)
        best_score, best = total / len(paths), 0
        stats.scored = 1
        for i in range(1, len(cands)):
            if clock() >= deadline or (self.work > 0 and stats.work >= self.work):
                stats.cut = True
                break
            dec, h = cands[i]
            total = 0.0
            for arr, t_end in zip(paths, ends):
                got = self._rollout(state, dec, h, arr, deadline, stats, until=t_end)
                if got is None:
                    break
                total += got.score  # type: ignore[operator]
            else:
                stats.scored += 1
                score = total / len(paths)
                if score < best_score * (1 - 1e-12) - 1e-9:
                    best_score, best = score, i
                continue
            if stats.cut:
                break
        stats.chosen = best
        return cands[best][0]

    def _rollout(self, state: ClusterState, dec: Decision, h: Policy, arrivals: tuple[JobSpec, ...],
                 deadline: float, stats: RoundStats, **kw: float) -> Rollout | None:
        """One rollout, counted in ``stats``; ``None`` (and ``stats.cut`` set when a budget ran out) when
        it gave no score."""
        extra: dict[str, object] = {}
        if arrivals:
            extra["arrivals"] = arrivals
        if self.work > 0:
            left = self.work - stats.work
            if left <= 0:
                stats.cut = True
                return None
            extra["max_rounds"] = left
        stats.rollouts += 1
        got = self.model.rollout(state, dec, h, deadline=deadline, **kw, **extra)  # type: ignore[arg-type]
        if got is None:
            stats.cut = self.clock() >= deadline
            return None
        stats.work += got.rounds
        if got.score is None:
            stats.cut = True
            return None
        return got


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
    """The planner for ``cluster``: options from ``name`` (``planner:budget_s=2/horizon=0/arrivals=4/work=2000``)
    and keyword arguments (:data:`PLANNER_OPTIONS`; keyword arguments win). ``budget_s`` defaults to
    :func:`default_budget`, or to no wall budget when ``work`` (> 0) is given without it. ``model`` defaults to
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
    horizon = int(_number(name, "horizon", opts.get("horizon", DEFAULT_HORIZON), True, 0, False))
    holds = int(_number(name, "holds", opts.get("holds", DEFAULT_HOLDS), True, 0, False))
    arrivals = int(_number(name, "arrivals", opts.get("arrivals", DEFAULT_ARRIVALS), True, 0, False))
    work = int(_number(name, "work", opts.get("work", 0), True, 0, False))
    follow = str(opts.get("follow", "own")).strip().lower()
    if follow not in ("own", "base"):
        raise PolicyError(f"policy {name!r}: follow must be own or base, got {opts.get('follow')!r}")
    if "budget_s" in opts:
        budget = _number(name, "budget_s", opts["budget_s"], False, 0.0, True)
    else:  # a work budget alone: no wall budget, so the search is the same on any machine
        budget = math.inf if work > 0 else default_budget(cluster)
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
                         holds=holds, arrivals=arrivals, work=work, follow=follow, name=name.strip(),
                         clock=clock)
