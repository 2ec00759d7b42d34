"""Slurm as a :class:`~policies.backend.Backend` of the round loop (:mod:`policies.rounds`).

:class:`SlurmBackend` is the controller's decide-and-act path: :meth:`~SlurmBackend.snapshot`
builds the :class:`~policies.state.ClusterState` from what the controller read from Slurm and its
agents (:func:`controller.state.build_state`), :meth:`~SlurmBackend.apply` acts on the decision.
Time is epoch seconds (the controller's clock).

Applying a decision (:meth:`SlurmBackend.apply`), in order:

1. the backend's own preemptions are added after the policy's (each once): running jobs whose
   measured contention sensitivity exceeds ``cs_preempt_threshold`` and jobs an operator asked
   to preempt (``rlsched controller preempt``);
2. entries :func:`policies.validate.check_decision` finds invalid are dropped, each logged and
   counted (``rlsched_decisions_total{action="rejected"}``);
3. preemptions: agent checkpoint, then ``scontrol requeuehold`` (:meth:`Controller._preempt`,
   journal entry first). Once the round has spent ``preempt_timeout_s + agents.timeout_s`` on
   preemptions, the remaining ones are deferred to the next round. A preemption that fails
   (the checkpoint did not come) stops the others (deferred): unless this is the round's second
   decision, the rest of the decision is dropped and :attr:`ApplyReport.decide_again` is set
   (the policy had counted the victim's GPUs as free; it decides again without that victim);
4. resizes (:meth:`SlurmBackend._resize`): Slurm cannot change a running job's GPUs, so a resize of
   a running elastic job (its comment's ``min_gpus`` / ``max_gpus``) is a checkpoint and a requeue
   held, as a preemption (:meth:`Controller._preempt`), then a placement at the new size: its
   AdminComment mark becomes ``rlsched:managed gpus=M`` (what the controller reads as its GPUs
   from then on) and, once Slurm has finished the requeue (:meth:`Controller._await_requeued`:
   pending and held, no longer COMPLETING; else the job stays held at its new size for a later
   round), its pin sets the new node list, GPUs and ``NumTasks=M NumCPUs=M`` (one task per GPU;
   :meth:`controller.slurm.SlurmCLI.pin_args`), ahead of the decision's placements. A resize
   whose checkpoint fails or is not tried (``min_run_s``, ``--no-requeue``) is rejected and the job keeps running at its size; one that
   names parameter servers is rejected (PS jobs are simulation-only), and so is every resize when
   the adapter cannot rewrite an AdminComment (the twin's simulated Slurm);
5. placements, at most the round's place limit (cut by the round loop): a job this decision
   preempts (a move, :attr:`policies.base.Policy.moves`) is placed in the same round once its
   preemption was made and Slurm has finished the requeue (it is requeued held, then pinned and
   released like any held job, with
   ``requeue_settle_s``), else rejected; each is checked again against the GPUs actually free (a
   preemption not made frees nothing), then all pinned (``scontrol update`` lines through one
   ``scontrol`` process; one by one when that fails, to tell which was refused; a requeued job's
   pin carries its ``StartTime=now+requeue_settle_s``), all recorded in the journal (one write)
   and all released (one ``scontrol release a,b,c``; when Slurm refuses one, a queue read tells
   which are still held: those were not released). Where the adapter pins through libslurm
   (:meth:`controller.slurm.SlurmCLI.pin_release_many`), the journal write comes first and each
   placement is then one update RPC that pins and releases (resizes keep the path above). A release
   the journal cannot record is not made (nor any other this round). An adapter without
   ``place_many`` / ``release_many`` gets pin, journal, release one job at a time.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from controller.slurm import MANAGED_MARK, SlurmError, SlurmJob, cons_tres_split
from controller.state import SlurmView, build_state
from policies.backend import ApplyReport
from policies.cluster import ClusterSpec, Placement
from policies.state import ClusterState, Decision, MeasuredSpeeds
from policies.validate import Problem, check_decision, placement_problem

if TYPE_CHECKING:
    from controller.daemon import Controller, RoundReport

__all__ = ["SlurmBackend"]

log = logging.getLogger("controller.daemon")


class SlurmBackend:
    """The :class:`~policies.backend.Backend` of one :class:`~controller.daemon.Controller`.

    The controller reads Slurm, then calls :meth:`prepare` with what it read and runs
    :func:`policies.rounds.run_round` over this backend; a controller round decides a second
    time when :attr:`ApplyReport.decide_again` is set. See the module docstring for what
    :meth:`apply` does.
    """

    def __init__(self, ctl: Controller) -> None:
        self.ctl = ctl
        self._inputs: tuple | None = None
        #: the last snapshot's Slurm view (jobs behind the policy's state)
        self.view: SlurmView | None = None
        #: running jobs an operator asked to preempt, and their request files (removed by the
        #: controller once acted on), as of the last snapshot
        self.forced: list[str] = []
        self.taken: list[Path] = []
        #: running jobs over the contention threshold, as of the last snapshot
        self.victims: list[str] = []
        #: every job of the last snapshot's Slurm read, by job id (managed or not, any state)
        self.jobs_by_id: dict[str, SlurmJob] = {}
        #: Slurm job id -> isolated throughputs its agents measured, by placement shape (kept from round to
        #: round and updated by :func:`controller.state.build_state`; policies see them as JobInfo.measured_speeds)
        self.speeds: dict[str, MeasuredSpeeds] = {}
        self._snapshot_end = 0.0
        self._next_due: float | None = None
        # GPUs free per node as this apply() goes (after the preemptions made), and the usable nodes
        self._free: Any = None
        self._usable: list[bool] = []

    def prepare(self, now: float, cluster: ClusterSpec, nodes: list, jobs: list[SlurmJob], stats: dict[str, dict],
                rep: RoundReport, last: bool) -> None:
        """What the next :meth:`snapshot` is built from: the round's time (epoch s), the partition's
        cluster, Slurm's nodes and jobs as just read, the agents' per-job stats, the round's report
        (filled in by snapshot and apply) and whether this is the round's last decision."""
        self._inputs = (now, cluster, nodes, jobs, stats, rep, last)

    # ------------------------------------------------------------------ Backend
    def now(self) -> float:
        """Epoch seconds (the controller's clock)."""
        return self.ctl.clock()

    def snapshot(self) -> ClusterState:
        """The policy's state (:func:`controller.state.build_state`) from the prepared Slurm read, the
        journal (progress of preempted jobs, planned splits of released jobs, back-offs) and the agents'
        stats. Also takes the operator's preempt requests and the contention victims (added by
        :meth:`apply`), logs per-job warnings once, and sets the round's counts and gauges."""
        assert self._inputs is not None, "prepare() first"
        ctl = self.ctl
        now, cluster, nodes, jobs, stats, rep, _last = self._inputs
        c = ctl.cfg.controller
        assert ctl.perf is not None
        progress: dict[str, dict[str, Any]] = {}
        for sid, p in ctl.journal["progress"].items():
            progress[sid] = dict(p)
        for sid, p in ctl.last_reports(stats).items():  # running, no longer reported: what it reached
            progress.setdefault(sid, {}).update(p)
        for sid, s in stats.items():
            progress.setdefault(sid, {}).update(s)
        plans = {sid: r.get("plan_by_name") or {} for sid, r in ctl.journal["released"].items()}
        skip = {sid: f"not started after {b['n']} release(s): not placed again before {time.ctime(b['until'])}"
                for sid, b in ctl.journal["backoff"].items() if now < float(b.get("until", 0))}
        no_preempt = {sid for sid, (_, until) in ctl._preempt_failed.items() if now < until}
        if not c.preempt_without_agent:
            # only a job that runs the checkpoint helper (it reports to its nodes' agents) can be checkpointed;
            # offering others as victims only made preemptions fail, round after round (each backed off)
            no_preempt |= {str(j.job_id) for j in jobs if j.state == "RUNNING" and str(j.job_id) not in stats}
        view = build_state(
            now, cluster, nodes, jobs, ctl.perf,
            partition=ctl.cfg.slurm.partition, default_model=c.default_model,
            default_runtime_s=c.default_runtime_s, progress=progress, planned=plans, skip=skip,
            no_preempt=no_preempt, speeds=self.speeds,
        )
        for w in view.warnings:  # each distinct warning once, not every round
            if w not in ctl._warned:
                ctl._warned.add(w)
                log.warning(w, extra={"event": "job_warning"})
        for sid, why in view.waiting.items():  # normal (a dependency, --begin): said once, as info
            w = f"job {sid} waits: {why}"
            if w not in ctl._warned:
                ctl._warned.add(w)
                log.info(w, extra={"event": "job_waiting", "job": sid})
        if len(ctl._warned) > 10000:
            ctl._warned.clear()
        st = view.state
        rep.queue, rep.running, rep.waiting = len(st.pending), len(st.running), len(view.waiting)
        ctl.metrics.queue.set(len(st.pending))
        ctl.metrics.waiting.set(len(view.waiting))
        ctl.metrics.running.set(len(st.running))
        ctl.metrics.free_gpus.set(st.total_free)
        self.view = view
        self.jobs_by_id = {str(j.job_id): j for j in jobs}
        self.forced, self.taken = ctl._admin_requests(view)
        self.victims = ctl._cs_victims(view, stats, now)
        self._snapshot_end = time.perf_counter()
        return st

    def apply(self, decision: Decision, problems: Sequence[Problem] | None = None) -> ApplyReport:
        """Act on ``decision`` plus the backend's own preemptions, dropping invalid entries (see the
        module docstring). ``problems``: ``check_decision`` of ``decision`` on the last snapshot (computed
        here when ``None``, or when own preemptions were added)."""
        assert self._inputs is not None and self.view is not None, "snapshot() first"
        ctl = self.ctl
        view = self.view
        now, _cluster, _nodes, _jobs, _stats, rep, last = self._inputs
        took = time.perf_counter() - self._snapshot_end  # the policy's decision and its validation
        preempt = list(decision.preempt)
        for sid in self.victims + self.forced:
            if sid not in preempt:
                preempt.append(sid)
        if len(preempt) != len(decision.preempt):
            decision = Decision(place=decision.place, preempt=preempt, resize=decision.resize)
            problems = None
        if problems is None:
            problems = check_decision(view.state, decision)
        ctl._forced = set(self.forced)
        report = ApplyReport()
        if not decision:
            return report
        log.info("decision: place %s preempt %s resize %s", [(j, str(p)) for j, p in decision.place], decision.preempt,
                 [(j, str(p)) for j, p in decision.resize],
                 extra={"event": "decision", "decision_s": round(rep.decision_s + took, 6)})
        for prob in problems:
            self._reject(report, prob)
        bad = {(p.action, p.index) for p in problems}
        if not self._preempt(decision, bad, now, rep, last, report):
            return report
        resized = self._resize(decision, bad, now, rep, report)
        self._place(decision, bad, rep, report, resized)
        return report

    def next_round(self) -> bool:
        """Wait until the controller's next round is due (``interval_s`` after the last one began; the
        first at once), or until the controller is stopped. ``False`` once it is stopping."""
        ctl = self.ctl
        if self._next_due is not None:
            ctl._stop.wait(max(0.0, self._next_due - time.monotonic()))
        if ctl._stop.is_set():
            return False
        self._next_due = time.monotonic() + ctl.cfg.controller.interval_s
        return True

    # ------------------------------------------------------------------ apply, step by step
    def _reject(self, report: ApplyReport, prob: Problem) -> None:
        """Log and count one entry that is not applied."""
        report.rejected.append(prob)
        self.ctl.metrics.decisions.labels(action="rejected").inc()
        log.warning("rejected %s of job %s: %s", prob.action, prob.job_id, prob.message,
                    extra={"event": "placement_rejected" if prob.action == "place" else f"{prob.action}_rejected",
                           "job": prob.job_id})

    def _preempt(self, decision: Decision, bad: set, now: float, rep: RoundReport, last: bool,
                 report: ApplyReport) -> bool:
        """The valid preemptions, in order; their GPUs count as free (``self._free``) once made. False when
        one failed and this is not the round's last decision (the rest of the decision is dropped)."""
        ctl = self.ctl
        view = self.view
        assert view is not None
        st = view.state
        free = st.free_gpus.astype(int).copy()
        usable = [True] * len(free) if st.usable is None else [bool(u) for u in st.usable]
        self._free, self._usable = free, usable
        failed = False
        for k, jid in enumerate(decision.preempt):
            if ("preempt", k) in bad:
                continue
            info = st.job(jid)
            sj = view.jobs[jid]
            assert info is not None and info.placement is not None
            if failed:
                ctl._deferred.add(jid)
                report.deferred.append(jid)
                continue
            if ctl.clock() >= ctl._preempt_budget_end:
                ctl._deferred.add(jid)
                report.deferred.append(jid)
                log.warning("preemption of job %s deferred to the next round: this round spent its time on "
                            "preemptions (preempt_timeout_s + agents.timeout_s)", jid,
                            extra={"event": "preempt_deferred", "job": sj.job_id})
                continue
            ctl._deferred.discard(jid)  # tried now (it may have been deferred by the first decision)
            try:
                done = ctl._preempt(sj, now, force=jid in ctl._forced)
                if done:
                    rep.preempted.append(sj.job_id)
                    report.preempted.append(jid)
                    for n, g in info.placement.alloc:
                        if usable[n]:  # GPUs on a drained/down node free nothing
                            free[n] += g
                elif done is None:
                    # its GPUs were counted as freed; the other victims may have been chosen for the same
                    # placement: preempting them now could stop them for nothing
                    failed = True
                    if not last:
                        rest = [p for i, p in enumerate(decision.preempt) if i > k and ("preempt", i) not in bad]
                        ctl._deferred.update(rest)
                        report.deferred.extend(rest)
                        report.decide_again = True
                        return False
            except SlurmError as exc:
                ctl.metrics.slurm_errors.inc()
                log.error("preemption of job %s failed: %s", jid, exc, extra={"event": "preempt_failed"})
                ctl._slurm_hint(exc)
        return True

    def _resize(self, decision: Decision, bad: set, now: float, rep: RoundReport,
                report: ApplyReport) -> list[_Pin]:
        """The valid resizes, in order: each job is checkpointed and requeued held (as a preemption;
        its GPUs count as free once that is made), its AdminComment mark is rewritten to the new GPU
        total, and it becomes a pin at its new placement with ``NumTasks`` = its new GPUs (returned, for
        :meth:`_place` to pin, journal and release ahead of the placements). Rejected (the job keeps
        running at its size): resizes with parameter servers, resizes the adapter cannot write, and
        resizes whose checkpoint or requeue was not made."""
        ctl = self.ctl
        view = self.view
        assert view is not None and ctl.cluster is not None
        free, usable = self._free, self._usable
        out: list[_Pin] = []
        for i, (jid, p) in enumerate(decision.resize):
            if ("resize", i) in bad:
                continue
            sj = view.jobs[jid]
            info = view.state.job(jid)
            assert info is not None and info.placement is not None
            why, text = None, ""
            if Placement.of(dict(p.alloc)) == Placement.of(dict(info.placement.alloc)):
                why = f"job {jid}: already runs on that placement (a resize would only restart it)"
            elif getattr(p, "ps", 0):
                why = f"job {jid}: a resize with parameter servers is simulation-only (no live PS jobs)"
            elif getattr(ctl.slurm, "set_admin_comment", None) is None:
                why = f"job {jid}: this Slurm adapter cannot rewrite a job's GPU count, so it cannot resize"
            elif ctl.cfg.controller.dry_run:
                log.info("dry run: would resize job %s to %s", jid, dict(p.alloc), extra={"event": "dry_run"})
                continue
            if why is None:
                try:
                    done = ctl._preempt(sj, now)
                except SlurmError as exc:
                    ctl.metrics.slurm_errors.inc()
                    ctl._slurm_hint(exc)
                    done, why = False, f"job {jid}: requeue for its resize failed: {exc}"
                if not done and why is None:
                    why = (f"job {jid}: not checkpointed and requeued (see the log: too young for min_run_s, "
                           "--no-requeue, or its checkpoint failed); it keeps running at its size")
                if done:
                    rep.preempted.append(sj.job_id)
                    for n, g in info.placement.alloc:
                        if usable[n]:
                            free[n] += g
                    text = _with_gpus(sj.admin_comment, p.total_gpus)
                    try:
                        ctl.slurm.set_admin_comment([sj.job_id], text)
                    except SlurmError as exc:  # held, checkpointed: placed again at its old size by a later round
                        ctl.metrics.slurm_errors.inc()
                        ctl._slurm_hint(exc)
                        why = f"job {jid}: requeued, but its new GPU count could not be written: {exc}"
                    else:  # held at its new size: placed now once Slurm has finished the requeue, else later
                        why = ctl._await_requeued(sj)
            if why is not None:
                self._reject(report, Problem("resize", i, jid, why))
                continue
            # what the round's reasons and later reads of this snapshot see: the new GPU count
            sj = replace(sj, gpus=p.total_gpus, admin_comment=text)
            view.jobs[jid] = sj
            self.jobs_by_id[jid] = sj
            problem = placement_problem(jid, p.total_gpus, p, free, usable, " (after the preemptions and resizes "
                                                                           "made this round)")
            if problem is not None:  # requeued held at its new size: a later round places it
                self._reject(report, Problem("resize", i, jid, problem))
                continue
            report.resized.append(jid)
            ctl.metrics.decisions.labels(action="resize").inc()
            ctl._note("resize", sj.job_id, {"from": info.placement.total_gpus, "to": p.total_gpus})
            log.info("resizing job %s from %d to %d GPUs", jid, info.placement.total_gpus, p.total_gpus,
                     extra={"event": "resize", "job": sj.job_id, "gpus": p.total_gpus})
            out.append(self._pin(jid, sj, p, moved=True, tasks=p.total_gpus))
        return out

    def _pin(self, jid: str, sj: SlurmJob, p: Any, moved: bool, tasks: int | None = None) -> _Pin:
        """A placement on its way to Slurm; its GPUs are reserved in ``self._free``."""
        ctl = self.ctl
        assert ctl.cluster is not None
        names = [ctl.cluster.nodes[n].name for n in p.nodes]
        plan_by_name = {ctl.cluster.nodes[n].name: g for n, g in p.alloc}
        counts = {g for _, g in p.alloc}
        per_node = counts.pop() if len(counts) == 1 and p.num_nodes > 1 else None
        settle = round(ctl.cfg.controller.requeue_settle_s) if sj.restarts > 0 or moved else 0
        for n, g in p.alloc:  # reserved now: later placements of this decision see them taken
            self._free[n] -= g
        return _Pin(jid, sj, p, names, plan_by_name, per_node, settle, p.total_gpus, tasks)

    def _place(self, decision: Decision, bad: set, rep: RoundReport, report: ApplyReport,
               resized: Sequence[_Pin] = ()) -> None:
        """The valid placements, in order, after the resized jobs' pins (``resized``): pin, journal,
        release (see the module docstring)."""
        ctl = self.ctl
        view = self.view
        assert view is not None and ctl.cluster is not None
        c = ctl.cfg.controller
        free, usable = self._free, self._usable
        todo: list[_Pin] = list(resized)
        fills = bool(getattr(ctl.slurm, "fills_splits", False))
        if fills:  # GPUs per node index of the decision's placements not yet looked at (see _slurm_split)
            later: dict[int, int] = {}
            for i, (_, p) in enumerate(decision.place):
                if ("place", i) not in bad:
                    for n, g in p.alloc:
                        later[n] = later.get(n, 0) + g
            # GPUs of the jobs released earlier that have not started yet, and the decision's placements sent so
            # far: (Slurm job id, placement)
            in_flight = self._in_flight_gpus()
            sent: list[tuple[int, Placement]] = []
        for i, (jid, p) in enumerate(decision.place):
            if ("place", i) in bad:
                continue
            if fills:
                for n, g in p.alloc:
                    later[n] -= g
            sj = view.jobs[jid]
            info = view.state.job(jid)
            moved = info is not None and info.placement is not None
            if moved and jid not in report.preempted:
                # its preemption was not made (deferred or failed): it still runs
                why = (f"job {jid}: was running when the round began and its preemption was not made this round; "
                       "it can be placed again once it is requeued")
            else:
                # a pending job, or one this round requeued held (a move: once Slurm has finished that requeue,
                # else a later round places it), against the GPUs actually free (a preemption that was not made
                # frees nothing)
                why = ((ctl._await_requeued(sj) if moved else None)
                       or placement_problem(jid, sj.gpus, p, free, usable, " (after the preemptions made this round)"))
            if why is not None:
                self._reject(report, Problem("place", i, jid, why))
                continue
            if fills:
                # earlier placements of newer jobs may start after this one (they are sent first, but Slurm
                # starts released jobs in priority order, which may favour the older job)
                maybe_after = dict(in_flight)
                first: dict[int, int] = {}  # the GPUs of this decision's earlier placements of older jobs
                for other, q in sent:
                    into = maybe_after if other > sj.job_id else first
                    for n, g in q.alloc:
                        into[n] = into.get(n, 0) + g
                exact, why = self._slurm_split(jid, p, later, maybe_after, first)
                if exact is None:
                    ctl.metrics.decisions.labels(action="split_deferred").inc()
                    self._reject(report, Problem("place", i, jid, why or ""))
                    continue
                if exact != p:
                    ctl.metrics.decisions.labels(action="split_set").inc()
                    log.info("job %s: split %s set to %s, the split Slurm gives these nodes", jid,
                             {ctl.cluster.nodes[n].name: g for n, g in p.alloc},
                             {ctl.cluster.nodes[n].name: g for n, g in exact.alloc},
                             extra={"event": "split_set", "job": sj.job_id})
                    p = exact
                sent.append((sj.job_id, p))
            if c.dry_run:
                log.info("dry run: would place job %s on %s", jid, {ctl.cluster.nodes[n].name: g for n, g in p.alloc},
                         extra={"event": "dry_run"})
                continue
            todo.append(self._pin(jid, sj, p, moved))
        if not todo:
            return
        if getattr(ctl.slurm, "place_many", None) is None or getattr(ctl.slurm, "release_many", None) is None:
            for x in todo:  # an adapter without batch calls: pin, journal, release one job at a time
                if not self._place_one(x, rep, report):
                    break
            return
        self._place_batch(todo, rep, report)

    def _in_flight_gpus(self) -> dict[int, int]:
        """GPUs per node index of the jobs released earlier that have not started (the journal's plan, else
        the job's GPUs on each node it was pinned to: at most that many): in the controller's free GPUs they
        are taken, in Slurm's they are free until those jobs start."""
        ctl = self.ctl
        assert self.view is not None and ctl.cluster is not None
        index = {nd.name: k for k, nd in enumerate(ctl.cluster.nodes)}
        out: dict[int, int] = {}
        for j in self.view.in_flight:
            plan = (ctl.journal["released"].get(str(j.job_id)) or {}).get("plan_by_name") or \
                {n: j.gpus for n in j.required_nodes}
            for name, g in plan.items():
                if name in index:
                    out[index[name]] = out.get(index[name], 0) + int(g)
        return out

    def _slurm_split(self, jid: str, p: Placement, later: dict[int, int], unstarted: dict[int, int],
                     first: dict[int, int] | None = None) -> tuple[Placement | None, str | None]:
        """The placement to send Slurm for ``p`` so that it starts exactly as sent, with ``p``'s nodes and GPU
        total (the performance model's key and the co-located jobs stay the policy's), or ``(None, why)``.

        One node, or the same GPUs on each node (``TresPerNode``): ``p`` itself. Any other split is a
        ``TresPerJob`` total, which Slurm 22.05 splits itself (:func:`controller.slurm.cons_tres_split`: one
        GPU per node, the rest in node order up to each node's free GPUs when the job starts). Which GPUs
        are free then depends on which jobs start first: Slurm starts released jobs in priority order
        (release order under ``priority/basic``; age among the factors of ``priority/multifactor``). This
        decision's earlier placements of older jobs count as started first; its later placements, its
        earlier placements of newer jobs and the jobs released earlier that have not started may start
        before this job or after it. Its split is computed both ways: with all of them started (the GPUs
        free after this decision's earlier placements, ``self._free``, minus the ``later`` ones') and with
        none (``self._free`` plus ``unstarted``, the GPUs of the jobs that may start after it). A job that
        runs on its nodes may also end before it starts: the third split has every GPU of its nodes free but
        those of ``first`` (this decision's earlier placements of older jobs). Slurm's split only grows on a
        node as GPUs free up there (node by node, in order), so when the split with the fewest GPUs free and
        the split with the most are the same, every state in between gives it too: that split is the
        placement (``p`` itself when the policy chose Slurm's split); when they differ, no split is sure,
        and the placement waits for the next round, when those jobs have started (or ended)."""
        counts = {g for _, g in p.alloc}
        if p.num_nodes <= 1 or len(counts) == 1:
            return p, None
        free = self._free
        nodes = list(p.nodes)
        a = cons_tres_split(nodes, p.total_gpus, {n: int(free[n]) - later.get(n, 0) for n in nodes})
        b = cons_tres_split(nodes, p.total_gpus, {n: int(free[n]) + unstarted.get(n, 0) for n in nodes})
        ctl = self.ctl
        assert ctl.cluster is not None
        first = first or {}
        c = cons_tres_split(nodes, p.total_gpus, {n: max(int(free[n]) + unstarted.get(n, 0),
                                                         int(ctl.cluster.nodes[n].gpus) - first.get(n, 0))
                                                  for n in nodes})
        if a is not None and a == b == c:
            return Placement.of(a), None
        names = ",".join(ctl.cluster.nodes[n].name for n in nodes)
        return None, (f"job {jid}: Slurm splits its {p.total_gpus} GPUs over {names} by the GPUs free when it "
                      "starts, which depends on jobs beside it starting or ending first; placed again next round")

    def _unreserve(self, x: _Pin) -> None:
        for n, g in x.p.alloc:
            self._free[n] += g

    def _placed(self, x: _Pin, rep: RoundReport, report: ApplyReport) -> None:
        ctl = self.ctl
        rep.placed.append((x.sj.job_id, x.plan_by_name))
        report.placed.append(x.jid)
        ctl.metrics.decisions.labels(action="place").inc()
        ctl._note("place", x.sj.job_id, x.plan_by_name)
        log.info("placed job %s on %s", x.jid, x.plan_by_name,
                 extra={"event": "placed", "job": x.sj.job_id, "plan": x.plan_by_name})

    def _failed(self, x: _Pin, exc: SlurmError) -> None:
        """A pin or release Slurm refused: the job stays held, its GPUs free, its journal entry dropped."""
        ctl = self.ctl
        ctl.metrics.slurm_errors.inc()
        self._unreserve(x)
        log.error("placing job %s failed: %s", x.jid, exc, extra={"event": "place_failed", "job": x.sj.job_id})
        ctl._slurm_hint(exc)

    def _release_timed_out(self, x: _Pin, exc: SlurmError) -> None:
        """slurmctld may have released it after all: its GPUs stay reserved (and its journal entry, which
        reserves them in later rounds while it is pending and unheld), so this round places nothing else
        there; the next round sees it held (a candidate again) or released."""
        self.ctl.metrics.slurm_errors.inc()
        log.warning("releasing job %s timed out (%s): its GPUs stay reserved until Slurm shows whether it was "
                    "released", x.jid, exc, extra={"event": "release_timeout", "job": x.sj.job_id})

    def _record(self, todo: list[_Pin]) -> bool:
        """Journal the releases of ``todo`` before they are made (one write). That is what makes restarts
        safe: a job pending without a hold that the journal does not list was not released by rlsched and
        is held again (``_check_released``), and a crash right after a release cannot release it twice.
        False (entries dropped, nothing released this round) when the journal cannot record them."""
        ctl = self.ctl
        rel = ctl.journal["released"]
        t = ctl.clock()
        for x in todo:
            rel[x.jid] = {"t": t, "plan_by_name": x.plan_by_name}
        if ctl._save():
            return True
        for x in todo:
            rel.pop(x.jid, None)
            self._unreserve(x)
        log.warning("not releasing job(s) %s this round: the journal cannot record them",
                    ", ".join(x.jid for x in todo), extra={"event": "place_skipped", "job": todo[0].sj.job_id})
        return False

    def _place_one(self, x: _Pin, rep: RoundReport, report: ApplyReport) -> bool:
        """Pin, journal and release one job (three steps, one ``scontrol`` each but the journal). False when
        the journal could not record it (no other job is released this round)."""
        ctl = self.ctl
        try:
            ctl.slurm.place(x.sj.job_id, x.names, x.gpus, x.per_node, x.sj.pin_tres, **x.extra)
        except SlurmError as exc:
            self._failed(x, exc)
            return True
        if not self._record([x]):
            return False
        try:
            ctl.slurm.release(x.sj.job_id, x.settle)
        except SlurmError as exc:
            if exc.timed_out:
                self._release_timed_out(x, exc)
                return True
            ctl.journal["released"].pop(x.jid, None)
            ctl._save()
            self._failed(x, exc)
            return True
        self._placed(x, rep, report)
        return True

    def _place_batch(self, todo: list[_Pin], rep: RoundReport, report: ApplyReport) -> None:
        """All of a decision's placements in three steps: every pin through one ``scontrol`` process (one
        by one if that fails, to tell which), one journal write recording every release, one ``scontrol
        release a,b,c``. A refused release is found out from a queue read: jobs still held were not
        released (journal entries dropped, GPUs free again); the rest were."""
        ctl = self.ctl
        slurm = ctl.slurm
        if getattr(slurm, "pin_release_many", None) is not None:
            todo = self._pin_release(todo, rep, report)
            if not todo:
                return
        pins = [slurm.pin_args(x.sj.job_id, x.names, x.gpus, x.per_node, x.sj.pin_tres, x.settle, **x.extra)
                for x in todo]
        try:
            slurm.place_many(pins)
            pinned = todo
        except SlurmError as exc:
            log.info("pinning %d job(s) in one scontrol call failed (%s): pinning them one by one", len(todo), exc,
                     extra={"event": "pin_batch_failed"})
            pinned = []
            for x in todo:
                try:
                    slurm.place(x.sj.job_id, x.names, x.gpus, x.per_node, x.sj.pin_tres, x.settle, **x.extra)
                    pinned.append(x)
                except SlurmError as exc1:
                    self._failed(x, exc1)
        if not pinned or not self._record(pinned):
            return
        try:
            slurm.release_many([x.sj.job_id for x in pinned])
        except SlurmError as exc:
            if exc.timed_out:
                for x in pinned:
                    self._release_timed_out(x, exc)
                return
            try:
                now_jobs = {str(j.job_id): j for j in slurm.jobs()}
            except SlurmError as exc2:  # cannot tell which were released: keep their GPUs and entries
                for x in pinned:
                    self._release_timed_out(x, exc2)
                return
            released = []
            for x in pinned:
                j = now_jobs.get(x.jid)
                if j is not None and j.held:
                    ctl.journal["released"].pop(x.jid, None)
                    self._failed(x, exc)
                else:
                    released.append(x)
            ctl._save()
            pinned = released
        for x in pinned:
            self._placed(x, rep, report)

    def _pin_release(self, todo: list[_Pin], rep: RoundReport, report: ApplyReport) -> list[_Pin]:
        """The plain placements of ``todo`` (not resizes) pinned and released in one update RPC each
        (:meth:`controller.slurm.SlurmCLI.pin_release_many`, libslurm), after one journal write recording
        every release. A refused one stays held (journal entry dropped, GPUs free again); one without an
        answer keeps its GPUs and entry (:meth:`_release_timed_out`). Returns what is left for the
        pin-then-release path: the resizes, or everything where the adapter does not use libslurm."""
        ctl = self.ctl
        plain = [x for x in todo if x.tasks is None]
        rest = [x for x in todo if x.tasks is not None]
        if not plain or ctl.slurm.pin_release_many([]) is None:  # (an empty call only says whether it can)
            return todo
        if not self._record(plain):
            return []
        res = ctl.slurm.pin_release_many([(x.sj.job_id, x.names, x.gpus, x.per_node, x.sj.pin_tres, x.settle)
                                          for x in plain])
        assert res is not None
        dropped = False
        for x, err in zip(plain, res):
            if err is None:
                self._placed(x, rep, report)
            elif err.timed_out:
                self._release_timed_out(x, err)
            else:
                ctl.journal["released"].pop(x.jid, None)
                dropped = True
                self._failed(x, err)
        if dropped:
            ctl._save()
        return rest


@dataclass
class _Pin:
    """One placement of a decision on its way to Slurm."""

    jid: str
    sj: SlurmJob
    p: Any  # policies.state.Placement
    names: list[str]
    plan_by_name: dict[str, int]
    per_node: int | None
    settle: int
    gpus: int  # the job's GPU total on this placement (a resized job's new one)
    tasks: int | None = None  # a resized job's new task count (NumTasks), else None: left as it is

    @property
    def extra(self) -> dict[str, int]:
        """Keyword arguments of the adapter's pin beyond the common ones (none for a plain placement)."""
        return {} if self.tasks is None else {"tasks": self.tasks}


def _with_gpus(admin_comment: str | None, gpus: int) -> str:
    """``admin_comment`` with job_submit.lua's mark (``rlsched:managed gpus=N``) set to ``gpus``, the rest
    (the reason after it) kept: after a resize the controller reads the job's GPUs from there."""
    text = admin_comment or ""
    new, n = re.subn(re.escape(MANAGED_MARK) + r"\s+gpus=\d+", f"{MANAGED_MARK} gpus={int(gpus)}", text, count=1)
    return new if n else f"{MANAGED_MARK} gpus={int(gpus)}"
