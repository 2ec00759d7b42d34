"""Digital twin: the controller daemon's own rounds, run against the simulator instead of Slurm.

:class:`Twin` builds a real :class:`controller.daemon.Controller` (the code ``rlsched controller run``
runs: its journal, release protocol, preemption protocol, limits and logs) and hands it

* :class:`SimulatedSlurm`, the Slurm adapter (the :class:`controller.slurm.SlurmCLI` methods the
  controller calls) over a :class:`trainer.simulator.Simulator`: every job of the trace is a managed
  GPU job as ``slurm_conf/job_submit.lua`` leaves it (held with priority 0, admin comment
  ``rlsched:managed gpus=N``, user comment ``rlsched:model=M,samples=S``) from its submit time on,
  with an integer job id; ``place`` records the node list and the GPU request, ``release`` starts the
  job in the simulator at once on its nodes, running jobs show RUNNING with their per-node split,
  finished ones COMPLETED until ``min_job_age_s`` (Slurm's ``MinJobAge``) has passed, and
  ``requeue_hold`` puts a job back in the queue, held. The per-node split is, with ``split="plan"``
  (the default), the one the controller planned (its journal), which is what ``rlsched simulate``
  assumes and what Slurm does for balanced placements (``TresPerNode``); with ``split="fill"`` it is
  what Slurm's cons_tres gives a ``TresPerJob`` request (:func:`cons_tres_split`: one GPU per node,
  the rest in node order), so an unbalanced plan may start on another split, and a job whose split
  does not fit waits released until it does or the controller holds it back;
* :class:`SimulatedAgents`, the node agents (:class:`controller.preemption.Preempter`): ``stats()``
  reports each running job's progress, throughput and CS from the simulator, ``checkpoint()``
  preempts the job in the simulator (its progress is kept, as a checkpoint keeps it);
* a clock: epoch seconds ``epoch + simulated time`` (``epoch``: :data:`EPOCH`, 2024-01-01 00:00 UTC).

The simulated ``sinfo`` reports each node of the cluster as Slurm would: name, GPUs (used and
configured), GRES GPU type, CPUs and memory, all in one partition (:data:`PARTITION`). The controller
builds its cluster from that; a cluster whose nodes the controller would see otherwise (a
``gpu_speed`` of its own, which Slurm cannot carry) stops the twin with a :class:`TwinError` naming
the node, since the controller would price it otherwise than the simulator. A node's ``switch`` is not
a Slurm node field and nothing prices it.

Rounds happen exactly when ``rlsched simulate`` runs them. :meth:`Twin.run` is the daemon's own loop
(``Controller.run``: ``while backend.next_round(): round()``) with the simulator's backend
(:class:`trainer.sim_backend.SimBackend`, the one place that decides when the simulator's rounds
happen) in place of the daemon's wall-clock interval: ``SimBackend.next_round()`` moves simulated
time to the next round (a round after each batch of arrivals and completions when
``event_triggered``, one on every ``round_len`` s boundary, boundaries with nothing changed skipped
for time-invariant policies) and the twin runs one ``Controller.round()`` there. Two options of the
backend make its rounds the daemon's:

* ``every_round``: the daemon runs its round whether or not a job waits, so every round the backend
  counts is a controller round (``simulate`` counts the rounds in which no job waits too, and asks
  no policy in them);
* ``keep_rounds`` (:meth:`SimulatedSlurm.waiting`): while a released job waits for GPUs in the
  simulated Slurm (``"fill"`` split) no boundary is skipped, since the controller checks its start
  grace every round.

Between rounds :class:`TwinSimulator` runs Slurm's scheduler after each batch of events (released
jobs that wait start once they fit). The controller's decisions reach the simulator only through the
simulated Slurm and agents; the backend's ``apply`` is never called. :meth:`Twin.run` is the only code
that ties the controller to the simulator's round times; :class:`SimulatedSlurm` and
:class:`SimulatedAgents` use the simulator's public mechanics only.

Controller settings (``[controller]``) and what they become in the twin:

* ``policy``: the twin's policy (``make_policy``, the controller's own factory);
* ``min_run_s``: the policy's own ``min_run`` (heuristics: 300 s, what ``simulate`` uses; policies
  that never preempt: 0), so the controller and the policy refuse the same preemptions;
* ``interval_s``: the simulator's round length (the rounds are the backend's, as above);
* ``max_placements_per_round``: the cluster's GPU count (a round cannot place more jobs);
* ``requeue_settle_s``: 0 (the simulated Slurm starts a released job at once, no launch delay);
* ``start_grace_s``, ``preempt_timeout_s``, ``[agents] timeout_s``, ``[slurm] command_timeout_s``:
  defaults; they never bind, since a released job starts during the release, a checkpoint takes no
  time and the clock does not move during a round;
* ``intra_bw_gbps`` / ``inter_bw_gbps``: the cluster's bandwidths (the controller's performance model
  is then the simulator's);
* ``cs_preempt_threshold``: 0 (off), ``preempt_without_agent``: false, ``dry_run``: false;
* ``[agents]``: enabled, ``port_base`` 50050 (every node has an agent; the simulated agents are handed
  to the controller, so no address is ever used);
* ``default_model`` / ``default_runtime_s``: unused (every job declares its model and samples);
* the simulator's ``restart_overhead`` is the time a requeued job needs to resume from its checkpoint.

What the twin does not model: Slurm's own scheduling delays (a released job starts at once) and
launch failures, node failures and drains, agents that fail or answer late, checkpoints that take
time or lose progress (a preempted job resumes from exactly where it stopped), operators' requests
(``rlsched controller preempt``), reloads, jobs outside the controller's partition, dependencies and
begin times. Agents report progress in samples (one step = one sample, fractional), so the
controller sees exactly the simulator's progress.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from controller.config import MAX_INTERVAL_S, ControllerConfig, parse_config
from controller.daemon import Controller, make_policy
from controller.metrics import JsonFormatter
from controller.preemption import PreemptOutcome
from controller.slurm import MANAGED_MARK, SlurmError, SlurmJob, SlurmNode, cons_tres_split
from controller.state import natural_key
from policies.cluster import ClusterSpec, Placement
from policies.job import JobSpec
from policies.perf import ContentionModel
from policies.state import JobInfo
from trainer.sim_backend import SimBackend
from trainer.simulator import SimConfig, SimResult, Simulator, SimulationError

__all__ = [
    "EPOCH",
    "PARTITION",
    "MIN_JOB_AGE_S",
    "TwinError",
    "cons_tres_split",
    "SPLITS",
    "SimulatedSlurm",
    "SimulatedAgents",
    "TwinSimulator",
    "Twin",
    "twin_config",
]

#: epoch seconds of simulated time 0 (2024-01-01 00:00:00 UTC): the controller works in epoch seconds
EPOCH = 1_704_067_200.0
#: the partition the simulated Slurm's nodes and jobs are in, and the controller manages
PARTITION = "gpu"
#: seconds a finished job stays in the simulated ``squeue`` (Slurm's default ``MinJobAge``)
MIN_JOB_AGE_S = 300.0
#: user the simulated jobs belong to
USER, USER_ID = "twin", 1000


class TwinError(RuntimeError):
    """The twin cannot go on: a controller round failed, or the simulated Slurm was asked for
    something Slurm would refuse or could not start (the message says what, and which job)."""


#: how the simulated Slurm splits a job's GPUs over its nodes (see :class:`SimulatedSlurm`)
SPLITS = ("plan", "fill")


class SimulatedSlurm:
    """The controller's Slurm adapter over a simulator (see the module docstring).

    :param sim: the simulator (its public mechanics: ``state()``, ``start()``, ``preempt()``, ``time``).
    :param jobs: the trace it runs (each job gets a Slurm job id: :attr:`slurm_id`).
    :param split: how a released job's GPUs are split over its nodes. ``"plan"``: as the controller
        planned it (its journal's ``plan_by_name``, read through ``planned``), which is what
        ``rlsched simulate`` assumes; exact in Slurm for balanced placements (``TresPerNode``).
        ``"fill"``: as :func:`cons_tres_split` says Slurm splits a ``TresPerJob`` request; a job
        whose split does not fit waits released (``Resources``) and starts once it fits (after
        each simulator event), unless the controller holds it back first (``start_grace_s``).
        Either way :attr:`inexact` counts the releases whose ``"fill"`` split differs from the plan.
    :param planned: Slurm job id -> the controller's planned split (node name -> GPUs), or None.
    :param epoch: epoch seconds of simulated time 0.
    :param min_job_age_s: seconds a finished job stays visible (COMPLETED).

    Job ids are ``10**d + k`` (``d``: the number of digits of the job count, ``k``: the job's rank in
    (submit time, trace job id) order): all of one width, so their string order is their number order,
    and the order in which the controller breaks ties between jobs submitted together (job id) is the
    simulator's (trace job id).
    """

    def __init__(self, sim: Simulator, jobs: Sequence[JobSpec], split: str = "plan",
                 planned: Callable[[int], Mapping[str, int] | None] | None = None, epoch: float = EPOCH,
                 min_job_age_s: float = MIN_JOB_AGE_S) -> None:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
        if split == "plan" and planned is None:
            raise ValueError("split 'plan' needs the controller's plans (planned=)")
        self.sim = sim
        self.split = split
        self.planned = planned
        self.epoch = float(epoch)
        self.min_job_age_s = float(min_job_age_s)
        self.cluster: ClusterSpec = sim.cluster
        self.names = [n.name for n in self.cluster.nodes]
        self.index = {n: i for i, n in enumerate(self.names)}
        order = sorted(jobs, key=lambda j: (j.submit_time, j.job_id))
        base = 10 ** len(str(len(order)))
        self.specs = {j.job_id: j for j in jobs}
        #: trace job id -> Slurm job id, and back
        self.slurm_id = {j.job_id: base + k for k, j in enumerate(order)}
        self.trace_id = {s: t for t, s in self.slurm_id.items()}
        self._req: dict[str, tuple[list[str], int | None]] = {}  # trace id -> (ReqNodeList, TresPerNode)
        self._released: dict[str, None] = {}  # released jobs that have not started, in release order
        self._seen: set[str] = set()  # trace ids of the jobs seen waiting or running, until purged
        self._ended: dict[str, float] = {}  # trace id -> simulated time it was first seen finished
        self._cache: dict[str, tuple[tuple, SlurmJob]] = {}
        self.calls = 0
        #: releases whose cons_tres split (:func:`cons_tres_split`, free GPUs then) differs from the plan
        self.inexact = 0
        #: releases after which Slurm could not start the job at once (``"fill"`` only)
        self.waited = 0
        #: what the simulated Slurm could not do though the controller asked it (the twin stops on it)
        self.errors: list[str] = []

    # ------------------------------------------------------------------ helpers
    def _epoch(self, t: float) -> float:
        return self.epoch + t

    def _tid(self, job_id: int) -> str:
        tid = self.trace_id.get(int(job_id))
        if tid is None:
            raise SlurmError(["scontrol"], f"slurm_load_jobs error: Invalid job id specified ({job_id})")
        return tid

    def _fail(self, cmd: list[str], msg: str) -> SlurmError:
        return SlurmError(cmd, f"exit status 1: {msg}")

    def _base(self, tid: str, **kw: Any) -> SlurmJob:
        s = self.specs[tid]
        return SlurmJob(
            job_id=self.slurm_id[tid], name=f"job{tid}", user=USER, user_id=USER_ID, partition=PARTITION,
            gpus=s.gpu_demand, comment=f"rlsched:model={s.model},samples={s.total_samples!r}",
            admin_comment=f"{MANAGED_MARK} gpus={s.gpu_demand}", submit_time=self._epoch(s.submit_time),
            eligible_time=self._epoch(s.submit_time), **kw,
        )

    def _pending_job(self, info: JobInfo) -> SlurmJob:
        tid = info.job_id
        req, _ = self._req.get(tid, ([], None))
        released = tid in self._released
        key = ("P", info.preemptions, tuple(req), released)
        hit = self._cache.get(tid)
        if hit is not None and hit[0] == key:
            return hit[1]
        j = self._base(tid, state="PENDING", reason="Resources" if released else "JobHeldUser",
                       priority=1 if released else 0, required_nodes=list(req), num_nodes=max(len(req), 1),
                       restarts=info.preemptions)
        self._cache[tid] = (key, j)
        return j

    def _running_job(self, info: JobInfo) -> SlurmJob:
        tid = info.job_id
        p = info.placement
        assert p is not None and info.start_time is not None
        key = ("R", info.preemptions, p.alloc, info.start_time)
        hit = self._cache.get(tid)
        if hit is not None and hit[0] == key:
            return hit[1]
        split = {self.names[n]: g for n, g in sorted(p.alloc)}
        nodes = list(split)
        req, _ = self._req.get(tid, (nodes, None))
        j = self._base(tid, state="RUNNING", reason="None", priority=1, nodes=nodes, gpus_per_node=split,
                       required_nodes=list(req), num_nodes=len(nodes), start_time=self._epoch(info.start_time),
                       restarts=info.preemptions, batch_host=nodes[0])
        self._cache[tid] = (key, j)
        return j

    def _completed_job(self, tid: str) -> SlurmJob:
        hit = self._cache.get(tid)
        if hit is not None and hit[0] == ("C",):
            return hit[1]
        j = self._base(tid, state="COMPLETED", reason="None", priority=0)
        self._cache[tid] = (("C",), j)
        return j

    def _live(self) -> tuple[dict[str, JobInfo], dict[str, JobInfo]]:
        """The simulator's pending and running jobs now, by trace id."""
        st = self.sim.state()
        pending, running = {j.job_id: j for j in st.pending}, {j.job_id: j for j in st.running}
        self._seen.update(pending)  # every job starts through release(), which sees it here first
        return pending, running

    # ------------------------------------------------------------------ reading (squeue, sinfo)
    def jobs(self) -> list[SlurmJob]:
        """Every job ``squeue`` would show: arrived and pending (held, or released and waiting for
        resources), running, finished less than ``min_job_age_s`` ago; in job id order."""
        self.calls += 1
        now = self.sim.time
        pending, running = self._live()
        out: dict[str, SlurmJob] = {}
        for tid, info in pending.items():
            out[tid] = self._pending_job(info)
        for tid, info in running.items():
            out[tid] = self._running_job(info)
        for tid in self._seen - out.keys():  # seen waiting or running before, neither now: finished
            self._ended.setdefault(tid, now)
        for tid, t in list(self._ended.items()):
            if now - t >= self.min_job_age_s:  # purged by Slurm
                del self._ended[tid]
                self._seen.discard(tid)
                self._cache.pop(tid, None)
                self._req.pop(tid, None)
            else:
                out[tid] = self._completed_job(tid)
        return sorted(out.values(), key=lambda j: j.job_id)

    def job(self, job_id: int) -> SlurmJob | None:
        return next((j for j in self.jobs() if j.job_id == int(job_id)), None)

    def nodes(self) -> list[SlurmNode]:
        """Every node of the cluster, in the partition, with its used GPUs, GRES GPU type, CPUs and memory
        (what ``sinfo`` reports; a node's ``switch`` and ``gpu_speed`` are not Slurm node fields)."""
        self.calls += 1
        free = self.sim.state().free_gpus
        out = []
        for i, n in enumerate(self.cluster.nodes):
            used = n.gpus - int(free[i])
            state = "idle" if used == 0 else ("allocated" if used >= n.gpus else "mixed")
            out.append(SlurmNode(n.name, n.gpus, used, state, (), (PARTITION,), gpu_type=n.gpu_type, cpus=n.cpus,
                                 mem_gb=n.mem_gb))
        return out

    def version(self) -> str:
        return "slurm rlsched-twin"

    # ------------------------------------------------------------------ acting (scontrol)
    def place(self, job_id: int, nodes: Sequence[str], gpus: int, per_node: int | None = None,
              tres_style: str = "gres:gpu") -> None:
        """``scontrol update ReqNodeList=.. NumNodes=.. TresPer*=..`` of a pending job."""
        self.calls += 1
        cmd = ["scontrol", "update", f"JobId={job_id}"]
        tid = self._tid(job_id)
        pending, _ = self._live()
        if tid not in pending:
            raise self._fail(cmd, "Job is no longer pending execution")
        unknown = [n for n in nodes if n not in self.index]
        if unknown or not nodes:
            raise self._fail(cmd, f"Invalid node name specified ({','.join(unknown) or 'empty node list'})")
        if gpus != self.specs[tid].gpu_demand or (per_node is not None and per_node * len(nodes) != gpus):
            raise self._fail(cmd, f"Invalid generic resource (gres) specification (gpus={gpus}, per node {per_node})")
        self._req[tid] = (list(nodes), per_node)

    def _split(self, tid: str, free: Sequence[int]) -> dict[int, int] | None:
        """Where Slurm starts job ``tid`` now (node index -> GPUs), None if it cannot yet."""
        req, per_node = self._req.get(tid, ([], None))
        fill = cons_tres_split([self.index[n] for n in req], self.specs[tid].gpu_demand, free, per_node)
        if self.split == "fill":
            return fill
        assert self.planned is not None
        plan = self.planned(self.slurm_id[tid])
        if not plan:
            return fill
        split = {self.index[n]: int(g) for n, g in plan.items()}
        if sorted(plan) != sorted(req) or sum(split.values()) != self.specs[tid].gpu_demand:
            self.errors.append(f"job {self.slurm_id[tid]} (trace job {tid}): planned split {dict(plan)} is not "
                               f"its node list {req} and {self.specs[tid].gpu_demand} GPUs")
            return None
        return split if all(free[n] >= g for n, g in split.items()) else None

    def release(self, job_id: int, delay_s: int = 0) -> None:
        """``scontrol update StartTime=now`` and ``scontrol release``: the job starts at once on its node
        list if its split (``split``) fits (``delay_s`` is not modelled), else waits released."""
        self.calls += 1
        cmd = ["scontrol", "release", str(job_id)]
        tid = self._tid(job_id)
        pending, _ = self._live()
        if tid not in pending or tid in self._released:
            raise self._fail(cmd, "Job is not held")
        free = self.sim.state().free_gpus
        req, per_node = self._req.get(tid, ([], None))
        plan = self.planned(job_id) if self.planned is not None else None
        if per_node is None and plan:
            fill = cons_tres_split([self.index[n] for n in req], self.specs[tid].gpu_demand, free)
            if fill is None or {self.names[n]: g for n, g in fill.items()} != dict(plan):
                self.inexact += 1
        self._released[tid] = None
        if not self._start(tid, free) and not self.errors:
            if self.split == "plan":
                self.errors.append(f"job {job_id} (trace job {tid}) released on {req} with plan {plan}: "
                                   f"does not fit the free GPUs {[int(f) for f in free]}")
            else:
                self.waited += 1

    def _start(self, tid: str, free: Sequence[int]) -> bool:
        split = self._split(tid, free)
        if split is None:
            return False
        try:
            self.sim.start(tid, Placement.of(split))
        except SimulationError as exc:
            self.errors.append(f"job {self.slurm_id[tid]} (trace job {tid}): {exc}")
            return False
        del self._released[tid]
        return True

    def waiting(self) -> bool:
        """Whether a released job waits for resources (``"fill"`` only)."""
        return bool(self._released)

    def start_released(self) -> None:
        """Slurm's scheduler: start the released jobs that fit now, in release order."""
        for tid in list(self._released):
            self._start(tid, self.sim.state().free_gpus)

    def hold(self, job_id: int) -> None:
        """``scontrol uhold`` of a pending job (a released one that did not start is held again)."""
        self.calls += 1
        tid = self._tid(job_id)
        pending, _ = self._live()
        if tid not in pending:
            raise self._fail(["scontrol", "uhold", str(job_id)], "Job is no longer pending execution")
        self._released.pop(tid, None)

    def unplace(self, job_id: int) -> None:
        """``scontrol update ReqNodeList= NumNodes=1``."""
        self.calls += 1
        self._req.pop(self._tid(job_id), None)

    def requeue_hold(self, job_id: int) -> None:
        """``scontrol requeuehold``: a job still running stops (its progress kept) and waits, held; one
        its agent stopped already is in the queue, held, as ``RequeueExitHold`` leaves it."""
        self.calls += 1
        tid = self._tid(job_id)
        _, running = self._live()
        if tid in running:
            self.sim.preempt(tid)
        elif tid in self._ended:
            raise self._fail(["scontrol", "requeuehold", str(job_id)], "Job has already finished")
        self._released.pop(tid, None)
        self.start_released()  # its GPUs are free


class SimulatedAgents:
    """The node agents of a simulated cluster (:class:`controller.preemption.Preempter`).

    ``stats()`` reports, per running job, what an agent reports: ``step`` / ``total_steps`` (in
    samples), ``samples_per_s`` (achieved), ``isolated_samples_per_s``, ``cs``; ``checkpoint()``
    stops the job in the simulator at once, its progress kept (``checkpoint_step``: samples done).
    """

    def __init__(self, sim: Simulator, slurm: SimulatedSlurm) -> None:
        self.sim = sim
        self.slurm = slurm
        #: one agent per node (``controller status`` counts them)
        self.addresses = {n.name: f"simulated:{n.name}" for n in sim.cluster.nodes}
        self.unreachable: set[str] = set()
        self._checkpoints: dict[str, float] = {}  # Slurm job id -> step of its last preemption

    def stats(self, job_nodes: Mapping[str, Sequence[str]] | None = None) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for info in self.sim.state().running:
            sid = str(self.slurm.slurm_id[info.job_id])
            if job_nodes is not None and sid not in job_nodes:
                continue
            out[sid] = {
                "job_key": f"twin-{info.job_id}", "slurm_job_id": sid, "model": info.model,
                "step": info.done_samples, "total_steps": info.total_samples,
                "samples_per_s": info.achieved_thp, "isolated_samples_per_s": info.isolated_thp,
                "isolated_source": "simulator", "cs": info.cs, "state": "running",
                "world_size": info.gpu_demand,
            }
        return out

    def checkpoint(self, job: SlurmJob, timeout_s: float) -> PreemptOutcome:
        tid = self.slurm.trace_id.get(job.job_id)
        running = {j.job_id: j for j in self.sim.state().running}
        if tid is None or tid not in running:
            return PreemptOutcome(False, True, message=f"job {job.job_id} does not run here", unknown_job=True)
        self.sim.preempt(tid)
        step = self._done(tid)
        self._checkpoints[str(job.job_id)] = step
        return PreemptOutcome(True, True, checkpoint_step=step, checkpoint_uri=f"twin://{tid}/{step!r}",  # type: ignore[arg-type]
                              message="checkpointed")

    def _done(self, tid: str) -> float:
        """Samples a stopped job has done (its checkpoint)."""
        for j in self.sim.state().pending:
            if j.job_id == tid:
                return float(j.done_samples)
        raise TwinError(f"trace job {tid} is not waiting after its preemption")

    def preempted_step(self, slurm_job_id: str, nodes: Sequence[str]) -> int | None:
        return self._checkpoints.get(str(slurm_job_id))  # type: ignore[return-value]


class TwinSimulator(Simulator):
    """A :class:`~trainer.simulator.Simulator` with Slurm's scheduler beside it: after each batch of
    events it processes (arrivals, completions), :attr:`on_event` runs (the twin's
    :meth:`SimulatedSlurm.start_released`: released jobs that fit now start).

    Its ``policy`` is the controller's policy as the controller's factory builds it: it names the
    results (``SimResult.policy``) and the backend's errors, and its ``time_invariant`` tells the
    backend whether boundaries with nothing changed are skipped. Neither the simulator nor the
    backend asks it: each round is one ``Controller.round()``, which asks the controller's own
    instance (:meth:`Twin.run`).
    """

    #: called after each event batch the simulator processes: Slurm's scheduler
    on_event: Callable[[], None] | None = None

    def advance_to_next_event(self, until: float = math.inf) -> bool:
        moved = super().advance_to_next_event(until)
        if moved and self.on_event is not None:
            self.on_event()
        return moved


def twin_config(policy: str, cluster: ClusterSpec, sim: SimConfig, state_dir: str | Path,
                min_run_s: float) -> ControllerConfig:
    """The controller configuration the twin runs (see the module docstring for each setting)."""
    doc = {
        "slurm": {"partition": PARTITION},
        "controller": {
            "policy": policy,
            "interval_s": min(float(sim.round_len), MAX_INTERVAL_S),
            "state_dir": str(state_dir),
            "min_run_s": float(min_run_s),
            "max_placements_per_round": max(cluster.total_gpus, 1),
            "requeue_settle_s": 0.0,
            "cs_preempt_threshold": 0.0,
            "preempt_without_agent": False,
            "dry_run": False,
            "intra_bw_gbps": float(cluster.intra_bw_gbps),
            "inter_bw_gbps": float(cluster.inter_bw_gbps),
        },
        "metrics": {"port": 0},
        # addresses as a deployment would give them (agent of node k at port 50050 + k); the simulated agents
        # are handed to the controller directly, so nothing is ever sent there
        "agents": {"enabled": True, "port_base": 50050, "host": "{node}"},
    }
    return parse_config(doc)


class _SimClock(logging.Filter):
    """Stamps each log record with the simulated time: ``created`` (the JSON lines' ``ts`` and
    ``time``) in epoch seconds, and ``sim_time_s``."""

    def __init__(self, twin: "Twin") -> None:
        super().__init__()
        self.twin = twin

    def filter(self, record: logging.LogRecord) -> bool:
        record.created = self.twin.now()
        record.sim_time_s = self.twin.sim.time
        return True


class Twin:
    """The controller daemon (``Controller.round()``) run over one trace in the simulator.

    :param cluster: the cluster (node names become the Slurm node names).
    :param jobs: the trace.
    :param policy: a policy name as the controller takes it (``fifo``, ``greedy``, ``rl-hybrid``,
        ``rl-base:CHECKPOINT``...).
    :param state_dir: the controller's state dir (journal.json, status.json).
    :param config: the simulator's knobs (round length, event trigger, restart overhead, noise).
    :param log_file: where the controller's log goes as JSON lines (``None``: nowhere).
    :param split: how the simulated Slurm splits a released job's GPUs over its nodes
        (:class:`SimulatedSlurm`: ``"plan"`` or ``"fill"``).
    :param epoch: epoch seconds of simulated time 0.

    :meth:`run` returns the simulator's :class:`~trainer.simulator.SimResult`, the same per-job
    records ``rlsched simulate`` writes. :class:`~policies.base.PolicyError` for a policy the
    controller cannot build, :class:`~trainer.simulator.SimulationError` for a trace the cluster
    cannot run, :class:`TwinError` when a controller round fails.
    """

    def __init__(self, cluster: ClusterSpec, jobs: Sequence[JobSpec], policy: str, state_dir: str | Path,
                 config: SimConfig | None = None, perf: ContentionModel | None = None,
                 log_file: str | Path | None = None, split: str = "plan", epoch: float = EPOCH) -> None:
        self.cluster = cluster
        self.epoch = float(epoch)
        self.sim_config = config or SimConfig()
        perf = perf or ContentionModel(cluster)
        # the controller's own factory, to learn what the round timing needs (the name, time invariance:
        # boundaries with nothing changed skipped) and the policy's min_run; it is never asked to schedule,
        # the controller builds its own instance in its first round
        probe = make_policy(policy, cluster, perf)
        self.policy_name = probe.name
        self.sim = TwinSimulator(cluster, jobs, probe, perf, self.sim_config)
        self.slurm = SimulatedSlurm(self.sim, jobs, split, self._planned, self.epoch)
        self.sim.on_event = self.slurm.start_released
        self.agents = SimulatedAgents(self.sim, self.slurm)
        self.config = twin_config(policy, cluster, self.sim_config, state_dir,
                                  float(getattr(probe, "min_run", 0.0)))
        self.controller = Controller(self.config, slurm=self.slurm, preempter=self.agents,  # type: ignore[arg-type]
                                     clock=self.now)
        self.log_file = None if log_file is None else Path(log_file)
        self._ran = False
        self._cluster_checked = False
        self.placed = self.preempted = 0
        #: node names in the order the controller indexes them (natural name order): policies that break
        #: ties by node index break them as in ``simulate`` only when it is the cluster's own order
        self.controller_order = sorted((n.name for n in cluster.nodes), key=natural_key)

    @property
    def same_node_order(self) -> bool:
        return self.controller_order == [n.name for n in self.cluster.nodes]

    def _planned(self, job_id: int) -> Mapping[str, int] | None:
        """The split the controller planned for a job it released (its journal's ``plan_by_name``)."""
        entry = self.controller.journal["released"].get(str(job_id))
        return None if entry is None else entry.get("plan_by_name")

    def now(self) -> float:
        """The controller's clock: epoch seconds of the simulated time."""
        return self.epoch + self.sim.time

    def _round(self) -> None:
        rep = self.controller.round()
        self.placed += len(rep.placed)
        self.preempted += len(rep.preempted)
        if self.slurm.errors:
            raise TwinError(f"at t={self.sim.time:.6g} s: {self.slurm.errors[0]}")
        if not rep.ok:
            raise TwinError(f"controller round at t={self.sim.time:.6g} s failed ({rep.error_kind}): {rep.error}")
        if not self._cluster_checked and self.controller.cluster is not None:
            self._check_cluster(self.controller.cluster)
            self._cluster_checked = True

    def _check_cluster(self, seen: ClusterSpec) -> None:
        """:class:`TwinError` unless the controller's cluster (built from the simulated ``sinfo``) is the
        simulator's, in natural name order, up to each node's ``switch`` (which nothing prices)."""
        mine = sorted(self.cluster.nodes, key=lambda n: natural_key(n.name))
        if (seen.intra_bw_gbps, seen.inter_bw_gbps) != (self.cluster.intra_bw_gbps, self.cluster.inter_bw_gbps):
            raise TwinError(f"the controller's bandwidths {seen.intra_bw_gbps}/{seen.inter_bw_gbps} GB/s are not the "
                            f"cluster's {self.cluster.intra_bw_gbps}/{self.cluster.inter_bw_gbps}")
        if len(seen.nodes) != len(mine):
            raise TwinError(f"the controller sees {len(seen.nodes)} nodes, the cluster has {len(mine)}")
        for a, b in zip(seen.nodes, mine):
            if a != dataclasses.replace(b, switch=None):
                raise TwinError(
                    f"node {b.name}: the controller, reading it from Slurm, sees {a}, the cluster declares {b}: "
                    "Slurm carries a node's name, GPUs, GPU type, CPUs and memory, not a gpu_speed of its own "
                    "(a GPU type the speed table lacks is priced at 1.0), so the controller would price it "
                    "otherwise than the simulator")

    def run(self, progress: Callable[[int, int], None] | None = None) -> SimResult:
        """Run every job of the trace to its end (once: the controller's state dir and the simulated
        Slurm carry on from it): ``while backend.next_round(): Controller.round()`` over the
        simulator's backend (see the module docstring). ``progress``: optional ``(finished jobs,
        all jobs) -> None``, called as jobs finish. While it runs, the controller's log (logger
        ``controller``) goes only to ``log_file``, as JSON lines with simulated times, not to the
        handlers it had."""
        if self._ran:
            raise RuntimeError("a Twin runs its trace once; make another one to run it again")
        self._ran = True
        logger = logging.getLogger("controller")
        saved = (logger.level, logger.propagate, list(logger.handlers))
        handler: logging.Handler
        if self.log_file is not None:
            self.log_file.parent.mkdir(parents=True, exist_ok=True)
            handler = logging.FileHandler(self.log_file)
            handler.setFormatter(JsonFormatter())
            handler.addFilter(_SimClock(self))
        else:
            handler = logging.NullHandler()
        for h in saved[2]:
            logger.removeHandler(h)
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False  # thousands of lines: they go to the log file, not the console
        t0 = time.perf_counter()
        backend = SimBackend(self.sim, progress, every_round=True, keep_rounds=self.slurm.waiting)
        try:
            while backend.next_round():
                self._round()
        finally:
            logger.removeHandler(handler)
            handler.close()
            for h in saved[2]:
                logger.addHandler(h)
            logger.setLevel(saved[0])
            logger.propagate = saved[1]
        res = self.sim.result(time.perf_counter() - t0)
        res.meta["controller"] = self.summary()
        return res

    def summary(self) -> dict[str, Any]:
        """What the controller did: rounds, placements, preemptions, and how often Slurm started a job
        on another split than planned or the controller rejected a placement of the policy."""
        m = self.controller.metrics
        return {
            "policy": self.controller.policy.name if self.controller.policy else self.policy_name,
            "rounds": self.controller.rounds,
            "placements": self.placed,
            "preemptions": self.preempted,
            "placement_mismatches": int(m.value("rlsched_placement_mismatch_total")),
            "rejected_placements": int(m.value("rlsched_decisions_total", action="rejected")),
            "held_back": int(m.value("rlsched_decisions_total", action="hold_back")),
            "inexact_splits": self.slurm.inexact,
            "waited_for_resources": self.slurm.waited,
            "split": self.slurm.split,
            "slurm_calls": self.slurm.calls,
            "epoch": self.epoch,
        }
