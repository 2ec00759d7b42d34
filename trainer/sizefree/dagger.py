"""The planner as the teacher of ``rl-sf``: DAgger labels from :mod:`policies.planner` decisions.

:class:`PlannerTeacher` labels a state of :class:`trainer.sizefree.env.SizeFreeEnv` (a pick inside a
round: the snapshot with the round's starts applied, and the codec's encoding of it) with the action
that follows the planner's decision for that snapshot:

* the planner decides the snapshot (:meth:`policies.planner.PlannerPolicy.schedule`: its candidate
  decisions scored by simulator rollouts); its preemptions, then its placements in the decision's
  order (the order the simulator applies a decision in), are the *plan*;
* a preemption of the plan is labelled with the encoding's preempt action of that job (a codec
  spec with preempt candidates, ``spec.preempt`` > 0); a job the plan preempts and places again
  (a move) is stopped first and then started on the new placement;
* the label is the plan's next placement mapped onto the encoding's candidates: the candidate with
  the same job and the same per-node GPU counts, else the same job on the same number of nodes, else
  the same job's first valid slot; a plan with no placement left labels *hold* (the planner held the
  rest back) when hold is valid;
* the plan is kept while the learner follows it (the next pick then needs no new search) and dropped
  as soon as the state is not the one the plan expects (the learner picked otherwise, or time moved),
  so every label is the planner's decision for the state the learner is in (DAgger: states visited by
  the learner, actions of the teacher).

A label is ``None`` (the state is not used) when the plan's next job is not among the encoding's
candidates (the codec offers ``J`` jobs and ``K`` victims), the planner's decision resizes, or it
preempts while the encoding has no preempt candidates (``spec.preempt`` = 0).

The teacher's planners: :data:`TEACHER` (for a spec without preempt candidates) has base
``greedy-np``, alternatives ``srtf-np:nosplit``, ``lgtf-np:nosplit`` and ``lgtf-np``;
:data:`TEACHER_PREEMPT` (with preempt candidates) is the preemptive planner: base ``greedy``
(preempts for waiting jobs and moves running ones), alternatives ``srtf:nosplit``,
``lgtf:nosplit`` and ``lgtf``. Both: two hold variants, horizon 8 completions, a 5 s budget (large
enough that the search is rarely cut, so the labels do not depend on the machine's speed;
:attr:`PlannerTeacher.cut` counts the rounds where it was).
"""

from __future__ import annotations

from policies.cluster import ClusterSpec, Placement
from policies.perf import ContentionModel
from policies.planner import PlannerPolicy, make_planner
from policies.state import ClusterState

__all__ = ["TEACHER", "TEACHER_PREEMPT", "PlannerTeacher", "match_action"]

#: The non-preemptive teacher planner's name and options (module docstring).
TEACHER = ("planner:base=greedy-np/alternatives=srtf-np:nosplit+lgtf-np:nosplit+lgtf-np"
           "/holds=2/horizon=8/budget_s=5")
#: The preemptive teacher planner (module docstring), for specs with preempt candidates.
TEACHER_PREEMPT = "planner:base=greedy/alternatives=srtf:nosplit+lgtf:nosplit+lgtf/holds=2/horizon=8/budget_s=5"


def _counts(p: Placement) -> tuple[tuple[int, int], ...]:
    return tuple(sorted((int(n), int(c)) for n, c in p.alloc))


def match_action(enc, job_id: str, placement: Placement) -> int | None:
    """The action of ``enc`` (a :class:`policies.codecs.sizefree.SizeFreeEncoding`) that starts ``job_id``
    on ``placement``, or the nearest of that job (module docstring); ``None``: the job is no candidate."""
    want = _counts(placement)
    same_job: list[tuple[int, Placement]] = []
    for i, c in enumerate(enc.cands[: enc.spec.n_starts]):
        if c is None or not enc.mask[i] or c[0].job_id != job_id:
            continue
        if _counts(c[1]) == want:
            return i
        same_job.append((i, c[1]))
    for i, p in same_job:
        if p.num_nodes == placement.num_nodes:
            return i
    return same_job[0][0] if same_job else None


class PlannerTeacher:
    """Labels picks with the planner's decisions (module docstring).

    :param cluster: the environment's cluster.
    :param perf: its performance model.
    :param name: the planner's name and options (:func:`policies.planner.make_planner`).
    """

    def __init__(self, cluster: ClusterSpec, perf: ContentionModel, name: str = TEACHER) -> None:
        self.planner: PlannerPolicy = make_planner(name, cluster, perf)
        #: the plan's steps: ``(job_id, None)`` preempts, ``(job_id, placement)`` starts
        self._plan: list[tuple[str, Placement | None]] | None = None
        self._expect: tuple | None = None
        #: planner searches run, rounds the budget cut, labels given, states left unlabelled
        self.searches = 0
        self.cut = 0
        self.labels = 0
        self.unlabelled = 0
        #: labels that preempt
        self.preempt_labels = 0

    @staticmethod
    def _key(state: ClusterState) -> tuple:
        return (float(state.time), frozenset(j.job_id for j in state.running),
                frozenset(j.job_id for j in state.pending))

    def reset(self) -> None:
        """Forget the plan (a new episode)."""
        self._plan, self._expect = None, None
        self.planner.reset()

    def label(self, state: ClusterState, enc) -> int | None:
        """The teacher's action for ``state`` encoded as ``enc``, or ``None`` (module docstring)."""
        key = self._key(state)
        if self._plan is None or self._expect != key:
            dec = self.planner.schedule(state)
            self.searches += 1
            self.cut += self.planner.last_round.cut
            if (dec.preempt and not enc.spec.preempt) or dec.resize:
                self._plan, self._expect = None, None
                self.unlabelled += 1
                return None
            self._plan, self._expect = [*((j, None) for j in dec.preempt), *dec.place], key
        hold = enc.spec.hold
        if not self._plan:
            if enc.mask[hold]:
                self.labels += 1
                return hold
            self._plan = None  # hold is not allowed here: ask again next time
            self.unlabelled += 1
            return None
        jid, p = self._plan[0]
        a = enc.preempt_action(jid) if p is None else match_action(enc, jid, p)
        if a is None:
            self._plan = None
            self.unlabelled += 1
            return None
        self.labels += 1
        self.preempt_labels += p is None
        return a

    def taken(self, state_before: ClusterState, action: int, label: int | None, enc) -> None:
        """Tell the teacher the learner took ``action`` where it labelled ``label``: when they agree on a
        start (a preemption), the plan moves to its next step and expects the state with that job
        started (stopped and waiting)."""
        if self._plan is None or label is None or action != label or action == enc.spec.hold:
            self._plan, self._expect = None, None
            return
        jid, p = self._plan.pop(0)
        t, run, pend = self._key(state_before)
        self._expect = (t, run - {jid}, pend | {jid}) if p is None else (t, run | {jid}, pend - {jid})

    def stats(self) -> dict[str, int]:
        return {"searches": self.searches, "cut": self.cut, "labels": self.labels, "unlabelled": self.unlabelled,
                "preempt_labels": self.preempt_labels}
