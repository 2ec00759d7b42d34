"""The event-driven simulator as a :class:`~policies.backend.Backend` of the round loop.

:class:`SimBackend` decides *when* rounds happen; :class:`~trainer.simulator.Simulator` holds the
mechanics (jobs starting, stopping, progressing, the contention rates). Time is simulated
seconds from the start of the trace.

When rounds happen (:meth:`SimBackend.next_round`, with ``round_len`` and ``event_triggered`` of
:class:`~trainer.simulator.SimConfig`):

* rounds fall on the boundaries ``k * round_len``; with ``event_triggered`` there is also a
  round right after every batch of arrivals and completions (events at the same time are one
  batch), without moving the next boundary;
* while nothing runs and nothing waits, time jumps to the next arrival; a round follows at once
  with ``event_triggered``, else at the first boundary at or after it (the events up to there
  processed); the next boundary is the first one after that round;
* a time-invariant policy (``policy.time_invariant``: same state, same decision) is not asked
  at a boundary when nothing changed since its last round (:attr:`Simulator.dirty` false) and
  ``keep_rounds()`` (if given) is false; the boundaries up to the next event are skipped. If
  then nothing runs or is due to arrive or complete, jobs wait forever:
  :class:`~trainer.simulator.SimulationError`;
* a round due while no job waits has nothing to decide unless the policy resizes or moves
  running jobs (:attr:`~policies.base.Policy.resizes`, :attr:`~policies.base.Policy.moves`) or
  ``every_round`` is set: the backend counts and
  closes it itself and :meth:`~SimBackend.next_round` goes on to the next one (the loop would
  take a snapshot and ask no policy);
* after each round: the dirty flag is cleared and metrics are sampled
  (:meth:`Simulator._sample_metrics`); a round that leaves the cluster idle with jobs waiting,
  no arrival to come and nothing started counts as idle, and ``max_idle_rounds`` idle rounds in
  a row raise :class:`~trainer.simulator.SimulationError` (a policy that never places).

With a compat mode (:attr:`~trainer.simulator.SimConfig.compat`) every round is opened (the peer
re-places running jobs every round) and a placement the mode forbids is an invalid entry.

Decisions are validated by :func:`policies.validate.check_decision` (GPUs, GPU type, CPUs, memory,
parameter servers) and applied all or nothing:
an invalid entry raises :class:`~trainer.simulator.SimulationError` with the first problem's
message before anything is applied.

A driver other than :class:`~policies.rounds.RoundLoop` may take the rounds: ``while
backend.next_round(): ...`` acting on the simulator in its own way between the calls (the
digital twin, :mod:`trainer.twin`, runs one ``Controller.round()`` there, which starts and
stops jobs through :meth:`Simulator.start` and :meth:`Simulator.preempt`). Such a driver sets
``every_round`` when it acts in every round whether or not jobs wait, and ``keep_rounds`` when
state outside the simulator that its rounds act on can call for a round while nothing in the
simulator changes. Jobs it starts other than through :meth:`~SimBackend.apply` do not count
as started for the idle guard (a job started there runs, so the round is not idle anyway).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from policies.backend import ApplyReport
from policies.state import ClusterState, Decision, JobInfo
from policies.validate import Problem, check_decision
from trainer.simulator import _EPS, SimulationError, Simulator

__all__ = ["SimBackend"]


class SimBackend:
    """The :class:`~policies.backend.Backend` of one :class:`Simulator` run (see the module docstring).

    :param sim: the simulator, freshly reset (:meth:`Simulator.reset_state`) or advanced by hand;
        its ``policy`` tells whether boundaries without change can be skipped
        (``time_invariant``) and names it in errors.
    :param progress: optional ``(finished jobs, all jobs) -> None``, called whenever the number
        of finished jobs has changed, between rounds.
    :param on_advance: optional ``(t) -> None``, called with the current time (s) right before
        :meth:`next_round` lets simulated time move on from ``t``: the cluster stays as it is
        then until the next call (or the next round), so a caller can integrate a quantity of
        the state over time (the Gymnasium environment's rewards) exactly, piece by piece.
    :param every_round: open every round that comes due, also while no job waits (``None``: only
        if the policy resizes or moves running jobs). For a driver that acts in every round (see the module docstring).
    :param keep_rounds: optional ``() -> bool``, asked at a boundary where a time-invariant policy
        would not be asked because nothing changed in the simulator: ``True`` holds the round
        anyway (something outside the simulator that the driver's rounds act on may change; the
        twin: a released job waits for GPUs in its simulated Slurm, and the controller checks its
        start grace every round).
    """

    def __init__(self, sim: Simulator, progress: Callable[[int, int], None] | None = None,
                 on_advance: Callable[[float], None] | None = None, *, every_round: bool | None = None,
                 keep_rounds: Callable[[], bool] | None = None) -> None:
        self.sim = sim
        self.progress = progress
        self.on_advance = on_advance
        rl = sim.cfg.round_len
        self._rl = rl
        self._event = sim.cfg.event_triggered
        self._invariant = bool(getattr(sim.policy, "time_invariant", False))
        # rounds opened also when no job waits
        self._every_round = bool((getattr(sim.policy, "resizes", False) or getattr(sim.policy, "moves", False))
                                 if every_round is None else every_round)
        self._compat = sim.cfg.compat  # a peer's rules: its placements only, and every round opened
        if self._compat is not None and self._compat.every_round:
            self._every_round = True
        self._keep = keep_rounds
        #: time (s) of the next round boundary
        self.next_boundary = 0.0 if sim.time == 0.0 else (math.floor(sim.time / rl + 1e-12) + 1) * rl
        self._open = False  # next_round() opened a round that was not closed yet
        self._progress_after = False  # report progress when that round closes
        self._started = 0  # jobs started in the open round
        self._idle_rounds = 0
        self._last_done = -1
        self._snap_epoch = -1  # the simulator's change count at the last snapshot
        self._lookup_fn = self._lookup  # the bound method, made once

    # ------------------------------------------------------------------ Backend
    def now(self) -> float:
        """Simulated seconds since the start of the trace."""
        return self.sim.time

    def snapshot(self) -> ClusterState:
        """:meth:`Simulator.state` with an O(1) job lookup for the validator."""
        sim = self.sim
        st = sim.state(self._lookup_fn)
        self._snap_epoch = sim._epoch
        return st

    def check(self, decision: Decision) -> list[Problem]:
        """``check_decision`` of ``decision`` on a snapshot taken now."""
        if not decision:
            return []
        st = self.snapshot()
        return check_decision(st, decision)

    def apply(self, decision: Decision, problems: Sequence[Problem] | None = None) -> ApplyReport:
        """Apply all of ``decision`` or, if any entry is invalid, none of it: :class:`SimulationError`
        with the first problem (``problems``: as found on the last snapshot; ``None``: checked now).
        Preemptions, then resizes, then placements; each counts as one decision
        (:attr:`Simulator.decisions`)."""
        place, preempt, resize = decision.place, decision.preempt, decision.resize
        if not (place or preempt or resize):
            return ApplyReport()
        sim = self.sim
        if (problems is not None and not problems and not preempt and not resize and self._compat is None
                and sim._epoch == self._snap_epoch and not sim.cfg.check_invariants):
            # placements alone, checked on a snapshot of the simulator as it is (the common round)
            n = len(place)
            pend = sim.pending
            if n == 1 and len(pend) == 1 and pend[0].spec.job_id == place[0][0]:
                sim._start(pend[0], place[0][1])  # the one waiting job (no look-up in the trace's index)
            else:
                by_id, start = sim.by_id, sim._start
                for jid, p in place:
                    start(by_id[jid], p)
            sim.decisions += n
            self._started += n
            return ApplyReport([place[0][0]] if n == 1 else [jid for jid, _p in place], [], [], [], [], False)
        if problems is None:
            problems = self.check(decision)
        if problems:
            raise SimulationError(problems[0].message)
        # the decision was checked on a snapshot of the simulator as it is: its placements fit
        checked = sim._epoch == self._snap_epoch
        if self._compat is not None:
            for jid, p in place:
                why = self._compat.placement_problem(jid, sim.by_id[jid].info.gpu_demand, p)
                if why is not None:
                    raise SimulationError(why)
        for jid in preempt:
            sim.preempt(jid)
        for jid, p in resize:
            sim.resize(jid, p)
        if checked:
            by_id, start = sim.by_id, sim._start
            for jid, p in place:
                start(by_id[jid], p)
        else:
            for jid, p in place:
                sim.start(jid, p)
        sim.decisions += len(place) + len(preempt) + len(resize)
        self._started += len(place)
        if sim.cfg.check_invariants:
            sim.check_invariants()
        return ApplyReport([jid for jid, _p in place], list(preempt), [jid for jid, _p in resize], [], [], False)

    def next_round(self) -> bool:
        """Close the round in progress, process events up to the next round in which jobs wait and
        open it (see the module docstring); rounds due while no job waits have nothing to decide
        and are counted and closed here. ``False`` once every job has finished."""
        sim = self.sim
        interval = sim.cfg.metrics_interval - _EPS
        if self._open:
            self._open = False
            if sim.running:  # _close_round() of a round that leaves jobs running (so it is not idle)
                sim.dirty = False
                if sim.time - sim._last_sample >= interval:
                    sim._sample_metrics()
                self._idle_rounds = 0
            else:
                self._close_round()
            if self._progress_after and self.progress is not None:
                self._report_progress()
        rl = self._rl
        hook = self.on_advance
        n_jobs = len(sim.jobs)
        event, every = self._event, self._every_round
        while sim.finished != n_jobs:  # not sim.done
            if hook is not None:
                hook(sim.time)
            if not sim.running and not sim.pending:
                # idle: jump to the next arrival (and, without event rounds, to the boundary after it)
                sim.advance_to_next_event()
                if not self._event:
                    boundary = math.ceil(sim.time / rl - 1e-12) * rl
                    while True:  # Simulator.advance_to_round, an event batch at a time
                        if hook is not None:
                            hook(sim.time)
                        if not sim.advance_to_next_event(until=boundary):
                            break
                self.next_boundary = (math.floor(sim.time / rl + 1e-12) + 1) * rl
                if self._round(False):
                    return True
                continue
            if sim.advance_to_next_event(self.next_boundary):
                if event:  # self._round(True), inline
                    sim.rounds += 1
                    self._started = 0
                    if sim.pending or every:
                        self._open = True
                        self._progress_after = True
                        return True
                    # _close_round() of a round in which no job waits (so it is not idle)
                    sim.dirty = False
                    if sim.time - sim._last_sample >= interval:
                        sim._sample_metrics()
                    self._idle_rounds = 0
            elif sim.dirty or not self._invariant or (self._keep is not None and self._keep()):
                self.next_boundary += rl
                if self._round(True):
                    return True
            else:
                # a time-invariant policy, nothing changed: skip the boundaries up to the next event
                t_arr = sim.jobs[sim.next_arrival].spec.submit_time if sim.next_arrival < len(sim.jobs) else math.inf
                t_next = min(sim._next_completion(), t_arr)
                if t_next == math.inf:
                    raise SimulationError(
                        f"policy {getattr(sim.policy, 'name', '?')} left {len(sim.pending)} jobs waiting "
                        "with nothing running and no event to come"
                    )
                self.next_boundary = max(self.next_boundary + rl, math.ceil(t_next / rl - 1e-12) * rl)
            if self.progress is not None:
                self._report_progress()
        return False

    # ------------------------------------------------------------------ rounds
    def _round(self, progress_after: bool) -> bool:
        """A round is due: count it; open it for the loop when jobs wait or every round is opened
        (``every_round``, a resizing policy) (True), else (nothing to decide: the loop would ask no
        policy) close it here (False)."""
        sim = self.sim
        sim.rounds += 1
        self._started = 0
        if sim.pending or self._every_round:
            self._open = True
            self._progress_after = progress_after
            return True
        self._close_round()
        return False

    def _close_round(self) -> None:
        sim = self.sim
        sim.dirty = False
        if sim.time - sim._last_sample >= sim.cfg.metrics_interval - _EPS:
            sim._sample_metrics()
        if not sim.running and sim.pending and self._started == 0 and sim.next_arrival >= len(sim.jobs):
            self._idle_rounds += 1
            if self._idle_rounds >= sim.cfg.max_idle_rounds:
                raise SimulationError(
                    f"policy {getattr(sim.policy, 'name', '?')} placed nothing for {self._idle_rounds} rounds "
                    f"while the cluster was idle and {len(sim.pending)} jobs waited"
                )
        else:
            self._idle_rounds = 0

    def _report_progress(self) -> None:
        sim = self.sim
        if self.progress is not None and sim.finished != self._last_done:
            self._last_done = sim.finished
            self.progress(sim.finished, len(sim.jobs))

    def _lookup(self, job_id: str) -> JobInfo | None:
        """The snapshot's running or pending job ``job_id`` (pending: arrived, not running, not finished)."""
        sim = self.sim
        pend = sim.pending
        if len(pend) == 1 and pend[0].spec.job_id == job_id:
            return pend[0].info  # the one waiting job (no look-up in the trace's index)
        j = sim.by_id.get(job_id)
        if j is None:
            return None
        info = j.info
        if info.placement is not None or (j.idx < sim.next_arrival and j.finish != j.finish):  # NaN: not finished
            return info
        return None
