"""The rlsched controller: a crash-only daemon beside slurmctld.

Every ``interval_s`` seconds one :meth:`Controller.round`:

1. reads jobs (``squeue`` text laid over the last ``squeue --json``:
   :meth:`controller.slurm.SlurmCLI.queue`), then nodes (``sinfo`` text:
   :meth:`controller.slurm.SlurmCLI.nodes`) and, from the node agents, measured
   progress/throughput/CS;
2. finishes any preemption a previous (possibly crashed) round started;
3. holds back released jobs that did not start within ``start_grace_s``;
4. builds the same :class:`~policies.state.ClusterState` the simulator builds
   and asks the policy for a :class:`~policies.state.Decision` (one round of the round loop,
   :func:`policies.rounds.run_round`, over :class:`controller.backend.SlurmBackend`), which is
   validated by :func:`policies.validate.check_decision` (invalid entries are dropped, logged
   and counted);
5. applies it: preemptions first (agent checkpoint -> ``scontrol requeuehold``),
   then placements (``scontrol update ReqNodeList=.. NumNodes=.. TresPer*=..``,
   ``StartTime=now`` for every placement through one ``scontrol`` process, one
   journal write, one ``scontrol release a,b,c``). A preemption that fails drops the
   rest of the decision; the job is no victim for the policy for a while
   (30 s doubling to 10 min) and the policy decides again at once without it;
6. hands the held jobs' changed reasons (AdminComment) to a writer thread, which the
   next round waits for first (:meth:`Controller.wait_reasons`), and after them the periodic JSON read
   of every job when the next two rounds would make it (:meth:`Controller._refresh_behind`).

Placement in Slurm: jobs ask for a total (``--gpus=N``, recorded by
job_submit.lua in the admin comment). The controller pins the node set and
node count, rewrites the GPU request and releases the job, in one update RPC
per job where libslurm serves (:meth:`controller.slurm.SlurmCLI.pin_release_many`;
``scontrol`` pins and one ``scontrol release`` otherwise). A balanced placement
(k GPUs on each node) becomes ``TresPerNode=gres:gpu:k``, which Slurm honours
exactly; any other placement keeps ``TresPerJob=gres:gpu:N``, and Slurm's
cons_tres then chooses the split itself: one GPU on each node, the rest filled
in node order, each node up to the GPUs free when the job starts
(:func:`controller.slurm.cons_tres_split`). So the controller sends an uneven
placement as that split of its nodes and total, when the split is the same
whichever of the jobs that may start before it (the round's later placements
and its earlier ones of newer jobs, the released jobs not yet started) begin
first; otherwise the placement waits a round
(:meth:`controller.backend.SlurmBackend._slurm_split`; docs/SLURM.md,
"Per-node split"). The controller compares each started job's per-node GRES
with what it sent, counts mismatches (``rlsched_placement_mismatch_total``: a
change of free GPUs outside rlsched between the round and the start), and the
next round's state is built from what Slurm actually allocated
(``rlsched twin --slurm-split fill`` replays a trace with cons_tres's splits).

Crash-only: all state is rebuilt from Slurm each round. The journal
(``state_dir/journal.json``, written atomically) only remembers what Slurm
cannot: planned splits of released jobs, preemptions in progress, progress of
preempted jobs. Losing it loses no job: a released job is never released again
(it is no longer held), and a held job is simply placed again. A release or
preemption is recorded before it is made; one the journal cannot record (full
or unwritable state dir) is not made, while the rest of the round goes on.
"""

from __future__ import annotations

import fcntl
import gc
import json
import logging
import math
import os
import pwd
import signal
import stat
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from controller.backend import SlurmBackend
from controller.config import ConfigError, ControllerConfig, load_config
from controller.experience import ExperienceRecorder, experience_recorder
from controller.metrics import Metrics
from controller.preemption import NoAgents, Preempter, make_preempter
from controller.slurm import SlurmCLI, SlurmError, SlurmJob, queue_position, with_reason
from controller.state import SlurmView, build_cluster, natural_key
from policies.base import Policy, PolicyError
from policies.cluster import ClusterSpec
from policies.perf import ContentionModel
from policies.rounds import run_round

__all__ = ["Controller", "make_policy", "Journal", "RoundReport", "StateDirError", "atomic_write"]

log = logging.getLogger("controller.daemon")

#: generation-2 threshold while the loop runs: no automatic full collection (see :func:`idle_gc`)
_NO_AUTO_FULL_GC = 1 << 30


def idle_gc(every: int) -> bool:
    """Run a full garbage collection between rounds once ``every`` generation-1 collections have
    happened since the last one (the interpreter's own rule, taken out of the rounds). Returns
    whether it ran."""
    if gc.get_count()[2] >= max(1, every):
        gc.collect()
        return True
    return False


#: longest wait before a job Slurm did not start is placed again (s)
_MAX_BACKOFF_S = 3600.0

#: first wait (s) before a job whose preemption failed (its agent down, stuck, refusing) is offered to the
#: policy as a victim again; doubled after each further failure, at most _MAX_PREEMPT_BACKOFF_S
_PREEMPT_BACKOFF_S = 30.0
_MAX_PREEMPT_BACKOFF_S = 600.0

#: what Slurm says when the caller may not change a job (not an operator, or job_submit.lua's ADMIN_UIDS)
_DENIED = "Access/permission denied"

#: how often (s) and at least how long (s) a round waits for Slurm to finish a requeue before it places that job
_REQUEUE_POLL_S = 0.2
_REQUEUE_WAIT_MIN_S = 10.0

_FINISHED = ("COMPLETED", "FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED")


def make_policy(name: str, cluster: ClusterSpec, perf: ContentionModel, checkpoint: str | None = None,
                min_run_s: float | None = None) -> Policy:
    """The policy ``name`` (:func:`policies.registry.make_policy`) with the controller's options.

    :param checkpoint: ``controller.policy_checkpoint`` (the RL policies' checkpoint).
    :param min_run_s: ``controller.min_run_s`` (preemptive heuristics choose no job as a victim before it
        has run that long); ``None``: the heuristic's own default."""
    from policies.registry import make_policy as make

    return make(name, cluster, perf, checkpoint, min_run_s=min_run_s)


def user_name(uid: int) -> str:
    """The login name of ``uid`` (the number when it has none)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def unremovable(f: Path) -> str | None:
    """Why this process could not delete ``f`` (None: it can): its folder is not writable and searchable
    by this process's effective user, or is sticky and neither it nor ``f`` belongs to that user."""
    d = f.parent
    try:
        sd, sf = d.stat(), f.lstat()
    except OSError as exc:
        return exc.strerror or str(exc)
    euid = os.geteuid()
    me = user_name(euid)
    if not os.access(d, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids):
        return f"its folder {d} belongs to {user_name(sd.st_uid)} (mode {stat.S_IMODE(sd.st_mode):04o}), not writable by {me}"
    if sd.st_mode & stat.S_ISVTX and euid not in (0, sd.st_uid, sf.st_uid):
        return f"it belongs to {user_name(sf.st_uid)} and its folder {d} is sticky"
    return None


def _names(names: list[str], most: int = 8) -> str:
    """``a, b, c`` (the first ``most``, then how many more)."""
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more


class StateDirError(OSError):
    """A file in the state dir could not be written (full disk, read-only, a folder in its place);
    the message names the file (``errno``: the cause's)."""

    def __init__(self, path: Path, cause: OSError) -> None:
        super().__init__(f"cannot write {path}: {cause.strerror or cause}")
        self.errno = cause.errno


def atomic_write(path: Path, text: str, prefix: str, fsync: bool = False) -> None:
    """Replace ``path`` by ``text`` atomically (temp file in the same folder, then rename).
    :class:`StateDirError` naming ``path`` if that fails; the temp file is removed then."""
    tmp: str | None = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=prefix)
        with os.fdopen(fd, "w") as f:
            f.write(text)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise StateDirError(path, exc) from exc
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


class Journal:
    """Small JSON file of facts Slurm does not keep; atomic writes, tolerant reads.

    ``released``: job id -> {t, plan_by_name: {node name: gpus}}; ``preempting``:
    job id -> {t, stage: "asked"|"checkpointed", step, uri; when asked: start, gpus, restarts,
    nodes, seen_step, total_steps}; ``progress``: job id
    -> {step, total_steps, attained_service}; ``backoff``: job id -> {n: times held
    back, until: epoch s before which it is not placed again}.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, dict[str, Any]] = {"released": {}, "preempting": {}, "progress": {}, "backoff": {}}
        #: whether every release recorded before this start is known: the file was read and no
        #: ``released`` entry dropped (False for a missing, unreadable or damaged journal)
        self.intact = False
        try:
            raw = json.loads(path.read_text())
            if not isinstance(raw, dict):
                raise ValueError(f"expected a JSON object, got {type(raw).__name__}")
            for k in self.data:
                if isinstance(raw.get(k), dict):
                    self.data[k] = self._valid_entries(k, raw[k])
            rel = raw.get("released")
            self.intact = rel is None or (isinstance(rel, dict) and len(self.data["released"]) == len(rel))
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as exc:
            log.warning("journal %s unreadable (%s): starting from Slurm state only", path, exc)

    #: numeric fields an entry may carry (all optional but ``released``'s ``t``)
    _NUMBERS = ("t", "until", "n", "step", "total_steps", "attained_service", "start", "gpus", "restarts",
                "seen_step")

    def _valid_entries(self, section: str, entries: dict) -> dict[str, Any]:
        """``entries`` without those a round could not use (a hand-edited or damaged journal must not
        stop the controller every round): each a dict under a job id, its numbers finite, ``released``
        entries with a time ``t`` and a ``plan_by_name`` of node -> GPUs if any. Dropped ones are logged."""
        out: dict[str, Any] = {}
        for sid, e in entries.items():
            ok = isinstance(e, dict) and str(sid).isdigit()
            ok = ok and all(isinstance(e[f], (int, float)) and not isinstance(e[f], bool) and math.isfinite(e[f])
                            for f in self._NUMBERS if f in e)
            if ok and "nodes" in e:
                ok = isinstance(e["nodes"], list) and all(isinstance(n, str) for n in e["nodes"])
            if ok and section == "released":
                plan = e.get("plan_by_name", {})
                ok = "t" in e and isinstance(plan, dict) and all(
                    isinstance(g, int) and not isinstance(g, bool) for g in plan.values())
            if ok:
                out[str(sid)] = e
            else:
                log.warning("journal %s: dropping malformed %s entry for job %r: %r", self.path, section, sid, e)
        return out

    def __getitem__(self, k: str) -> dict[str, Any]:
        return self.data[k]

    def save(self) -> None:
        """Write the file atomically and durably; :class:`StateDirError` naming it if that fails
        (no temp file is left behind)."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StateDirError(self.path, exc) from exc
        atomic_write(self.path, json.dumps(self.data), ".journal.", fsync=True)


@dataclass
class RoundReport:
    """What one round did (also written to ``status.json``)."""

    time: float
    ok: bool
    error: str | None = None
    error_kind: str | None = None  # "slurm" | "policy" | "state_dir" | "internal"
    placed: list[tuple[int, dict[str, int]]] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    held_back: list[int] = field(default_factory=list)
    decision_s: float = 0.0
    queue: int = 0
    running: int = 0
    waiting: int = 0  # managed jobs held for their own reason (a dependency, --begin): not placeable yet
    reasons: int = 0  # jobs whose AdminComment reason this round rewrote


class Controller:
    """One controller instance. ``round()`` is the unit of work; ``run()`` loops.

    :param cfg: validated configuration.
    :param slurm: the Slurm adapter (tests may pass one with other timeouts).
    :param preempter: agent access; default built from ``cfg.agents``.
    :param clock: epoch seconds (tests may fix it).
    """

    def __init__(
        self,
        cfg: ControllerConfig,
        slurm: SlurmCLI | None = None,
        preempter: Preempter | None = None,
        clock: Callable[[], float] = time.time,
        metrics: Metrics | None = None,
    ) -> None:
        self.cfg = cfg
        self.slurm = slurm or SlurmCLI(cfg.slurm.conf, cfg.slurm.command_timeout_s, cfg.slurm.bin_dir,
                                       libslurm=cfg.slurm.libslurm)
        self._preempter = preempter
        self.clock = clock
        self.metrics = metrics or Metrics()
        self.state_dir = Path(cfg.controller.state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        # made here, by the controller's user: a folder `controller preempt` made would be the caller's
        # (root's), and the controller could not remove the requests in it
        self.requests_dir.mkdir(exist_ok=True)
        self.journal = Journal(self.state_dir / "journal.json")
        # until the first round: adopt managed jobs pending without a hold as released by a controller
        # before this one when the journal that would say so is missing or damaged (_check_released)
        self._adopt_unreleased = not self.journal.intact
        self.cluster: ClusterSpec | None = None
        self.perf: ContentionModel | None = None
        self.policy: Policy | None = None
        self.policy_name = cfg.controller.policy
        self._reload = threading.Event()
        self._stop = threading.Event()
        self.rounds = 0
        self.history: list[dict[str, Any]] = []  # recent actions for `status`
        self.last: RoundReport | None = None
        self._forced: set[str] = set()
        self._stats: dict[str, dict[str, Any]] = {}
        # job id -> (Slurm's restart count of its run, the last step / total_steps its agents reported in that
        # run): the progress of a running job whose agents no longer report it (it finished its steps and
        # Slurm still runs its teardown), which neither a checkpoint step of an earlier run nor the estimate
        # for jobs without reports may undercut (:meth:`last_reports`)
        self._last_report: dict[str, tuple[int, dict[str, int]]] = {}
        self._warned: set[str] = set()
        self._stuck_requests: set[tuple[str, int]] = set()  # (name, inode) of requests it could not remove
        # job id -> (failed preemptions in a row, clock time before which the policy may not choose it as a
        # victim). In memory, not in the journal: it only saves futile attempts, and a restart that forgets
        # it costs one attempt per job, which fails fast (agent back-off, health probe); keeping it out of
        # the journal also keeps it working when the state dir is not writable
        self._preempt_failed: dict[str, tuple[int, float]] = {}
        # a round failed with a Slurm error (slurmctld down?): the next round that reads the queue gives
        # released jobs their start grace again (Slurm could not start them meanwhile)
        self._slurm_failed = False
        self._state_error: str | None = None  # this round's first failed state-dir write (RoundReport.error)
        self._deferred: set[str] = set()  # victims SlurmBackend.apply left for later (time budget, after a failure)
        self._preempt_budget_end = 0.0  # clock time after which this round starts no other preemption
        self._capacity_written: str | None = None  # last text written to capacity_file
        self._unwritable: dict[str, str] = {}  # state-dir file -> its last write error (logged once until it works)
        #: the decide-and-act path: snapshot from Slurm, apply to Slurm (controller/backend.py)
        self.backend = SlurmBackend(self)
        #: the reason writes the last round handed off (:meth:`_update_reasons`), and the thread writing them
        self._reason_writes: Future | None = None
        self._reason_writer: ThreadPoolExecutor | None = None
        #: a learned elastic policy's experience journal (controller/experience.py), None when not recording
        self.experience: ExperienceRecorder | None = None

    @property
    def requests_dir(self) -> Path:
        """Where ``rlsched controller preempt`` drops its request files (``state_dir/requests``)."""
        return self.state_dir / "requests"

    def _warn_once(self, msg: str, event: str, level: int = logging.WARNING, key: str | None = None) -> None:
        """Log ``msg`` the first time only (``_warned``: not every round); ``key``: what makes it the same
        message (default: its text)."""
        key = key or msg
        if key not in self._warned:
            self._warned.add(key)
            log.log(level, msg, extra={"event": event})

    def _slurm_hint(self, exc: SlurmError) -> None:
        """After Slurm refused a change with "Access/permission denied", say once what to fix."""
        if _DENIED in str(exc):
            me = user_name(os.geteuid())
            self._warn_once(
                f"Slurm refuses the controller's changes ({_DENIED}): run the controller as the SlurmUser of "
                f"slurm.conf, or make its user {me} a Slurm operator (sacctmgr modify user {me} set "
                f"adminlevel=Operator); unless it runs as root, its uid must also be in job_submit.lua's ADMIN_UIDS",
                "slurm_permission", logging.ERROR)

    # ------------------------------------------------------------------ setup
    @property
    def preempter(self) -> Preempter:
        if self._preempter is None:
            self._preempter = self._build_preempter()
        return self._preempter

    def _build_preempter(self) -> Preempter:
        if self.cluster is None or not self.cfg.agents.enabled:
            return NoAgents()
        addrs = {}
        for i, n in enumerate(self.cluster.nodes):
            a = self.cfg.agent_address(n.name, i)
            if a:
                addrs[n.name] = a
        try:
            return make_preempter(addrs, self.cfg.agents.auth, self.cfg.agents.timeout_s, self.cfg.slurm.conf)
        except Exception as exc:  # noqa: BLE001 - bad key etc.: run without agents, say why
            log.error("cannot set up agent access (%s): running without agents", exc, extra={"event": "agents_disabled"})
            return NoAgents()

    def _ensure_cluster(self, cluster: ClusterSpec) -> None:
        if self.cluster == cluster and self.policy is not None:
            return
        if self.cluster != cluster:
            log.info("cluster: %s (%s)", cluster.describe(), ", ".join(f"{n.name}:{n.gpus}" for n in cluster.nodes),
                     extra={"event": "cluster"})
            self.perf = ContentionModel(cluster)
            if self._preempter is not None and not isinstance(self._preempter, NoAgents) and hasattr(self._preempter, "close"):
                self._preempter.close()  # type: ignore[attr-defined]
                self._preempter = None
            self.cluster = cluster
            self._check_agent_addresses(cluster)
        assert self.perf is not None
        self.policy = make_policy(self.policy_name, cluster, self.perf, self.cfg.controller.policy_checkpoint,
                                  min_run_s=self.cfg.controller.min_run_s)
        self.metrics.set_policy(self.policy.name)
        log.info("policy: %s", self.policy.name, extra={"event": "policy", "policy": self.policy.name})
        self._start_experience()

    def _start_experience(self) -> None:
        """Record the policy's experience when it learns online (:mod:`controller.experience`)."""
        if self.experience is not None:
            self.experience.journal.close()
        c = self.cfg.controller
        self.experience = experience_recorder(self.policy, c.experience_dir or self.state_dir / "experience",
                                              c.experience_max_bytes)

    def _check_agent_addresses(self, cluster: ClusterSpec) -> None:
        """Warn (once) about ``[agents] addresses`` keys that name no node of the partition, and about
        nodes no agent address reaches (their jobs get no measured stats and cannot be checkpointed)."""
        a = self.cfg.agents
        if not a.enabled:
            return
        names = [n.name for n in cluster.nodes]
        where = f"partition {self.cfg.slurm.partition}" if self.cfg.slurm.partition else "the cluster"
        unknown = sorted(set(a.addresses) - set(names), key=natural_key)
        if unknown:
            self._warn_once(f"[agents] addresses: {_names(unknown)} not a Slurm node of {where} "
                            f"(nodes: {_names(names)}): no agent is asked there; use the node names sinfo shows",
                            "agent_address_unknown")
        missing = [n for i, n in enumerate(names) if not self.cfg.agent_address(n, i)]
        if missing:
            self._warn_once(f"no agent address for node(s) {_names(missing)} ([agents] addresses or port_base): "
                            "their jobs get no measured stats and cannot be checkpointed for preemption",
                            "agent_address_missing")

    def request_reload(self) -> None:
        """Re-read the config file and rebuild the policy before the next round (SIGHUP)."""
        self._reload.set()

    def stop(self) -> None:
        self._stop.set()

    def _do_reload(self) -> None:
        self._reload.clear()
        try:
            new = load_config(self.cfg.path) if self.cfg.path else self.cfg
            name = self.cfg.overrides.get("policy", new.controller.policy)
            if self.cluster is not None and self.perf is not None:
                pol = make_policy(name, self.cluster, self.perf, new.controller.policy_checkpoint,
                                  min_run_s=self.cfg.overrides.get("min_run_s", new.controller.min_run_s))
                self.policy = pol
                self.metrics.set_policy(pol.name)
            # keep Slurm/agent wiring and the command line's overrides; policy-related settings take effect
            for k, v in self.cfg.overrides.items():
                setattr(new.controller, k, v)
            new.controller.state_dir = self.cfg.controller.state_dir  # the journal stays where it is
            self.cfg.controller = new.controller
            self.policy_name = name
            if self.policy is not None:
                self._start_experience()
            log.info("reloaded: policy %s", name, extra={"event": "reload", "policy": name})
        except (ConfigError, PolicyError) as exc:
            log.error("reload failed, keeping policy %s: %s", self.policy_name, exc, extra={"event": "reload_failed"})

    # ------------------------------------------------------------------ one round
    def round(self) -> RoundReport:
        """Read Slurm, decide, act. Never raises for Slurm/agent/policy failures. The reason writes of the
        round before are waited for first (:meth:`wait_reasons`), within this round's time."""
        t0 = time.perf_counter()
        self.wait_reasons()
        now = self.clock()
        rep = RoundReport(time=now, ok=True)
        self._state_error = None
        try:
            if self._reload.is_set():
                self._do_reload()
            self._round(now, rep)
        except SlurmError as exc:
            rep.ok, rep.error, rep.error_kind = False, str(exc), "slurm"
            self._slurm_failed = True
            self.metrics.slurm_errors.inc()
            log.error("round failed: %s", exc, extra={"event": "slurm_error"})
            self._slurm_hint(exc)
        except StateDirError as exc:  # every journal write goes through _save(): not expected
            self._write_failed("journal", exc)
            rep.ok, rep.error, rep.error_kind = False, str(exc), "state_dir"
        except PolicyError as exc:
            rep.ok, rep.error, rep.error_kind = False, str(exc), "policy"
            log.error("policy error: %s", exc, extra={"event": "policy_error"})
        except Exception as exc:  # noqa: BLE001 - crash-only: log, keep the daemon alive
            rep.ok, rep.error, rep.error_kind = False, f"{type(exc).__name__}: {exc}", "internal"
            log.exception("round failed unexpectedly", extra={"event": "round_error"})
        if rep.ok and self._state_error is not None:
            # the round went on without what needs a journal write (releases, preemptions): say so
            rep.ok, rep.error, rep.error_kind = False, self._state_error, "state_dir"
        self.rounds += 1
        self.metrics.rounds.labels(outcome="ok" if rep.ok else "error").inc()
        self.metrics.round_time.observe(time.perf_counter() - t0)
        self.last = rep
        self._write_status(rep)
        return rep

    def _round(self, now: float, rep: RoundReport) -> None:
        c = self.cfg.controller
        # jobs before nodes: a released job that starts in between then shows as in flight (its GPUs
        # reserved) while sinfo already counts them used, which errs towards fewer free GPUs; the
        # other order would show it running while sinfo still had its GPUs free (double booking)
        jobs = self._read_jobs()
        nodes = self.slurm.nodes()
        try:
            cluster = build_cluster(nodes, self.cfg.slurm.partition, c.intra_bw_gbps, c.inter_bw_gbps)
        except ValueError as exc:
            raise SlurmError(["sinfo"], str(exc)) from None
        self._ensure_cluster(cluster)
        self._write_capacity(cluster)
        assert self.perf is not None and self.policy is not None
        by_id = {str(j.job_id): j for j in jobs}
        changed = self._finish_preemptions(by_id)
        changed |= self._check_released(now, by_id, rep)
        self._slurm_failed = False  # the grace of in-flight releases was restarted (_check_released)
        self._adopt_unreleased = False  # adopted once, from the first queue read after the start
        if changed:
            jobs = self._read_jobs()
            nodes = self.slurm.nodes()
        # stats only from the agents of each job's nodes (Slurm's view), not from any agent claiming it
        job_nodes = {str(j.job_id): list(j.nodes) for j in jobs if j.state in ("RUNNING", "CONFIGURING")}
        stats = self._stats = self.preempter.stats(job_nodes=job_nodes)
        self._note_reports(jobs, stats)
        stale = [sid for sid in self.journal["progress"] if sid not in by_id]
        for sid in stale:  # Slurm forgot the job (MinJobAge): so can we
            self.journal["progress"].pop(sid)
        if stale:
            self._save()
        for sid in [sid for sid in self._preempt_failed if sid not in job_nodes]:  # ended or requeued
            del self._preempt_failed[sid]
        # one preemption may take preempt_timeout_s + the agent client's timeout; once the round has spent
        # that long on preemptions it starts no other (deferred to the next round, not failed): a round of
        # several slow victims would otherwise hold up everything else (and status.json) for minutes
        self._preempt_budget_end = self.clock() + c.preempt_timeout_s + self.cfg.agents.timeout_s
        self._deferred = set()
        if self._decide(now, cluster, nodes, jobs, stats, rep, last=False):
            # a preemption failed: the policy had counted that victim's GPUs as freed, so its decision was
            # dropped (the rest of its preemptions too: they may have served the same placement). Decide
            # again at once, without that victim (_preempt_failed), from a fresh read of Slurm (this round's
            # preemptions included), so other held jobs get the free GPUs in this round
            log.info("a preemption failed: deciding again without that victim", extra={"event": "replan"})
            jobs = self._read_jobs()
            nodes = self.slurm.nodes()
            self._decide(self.clock(), cluster, nodes, jobs, stats, rep, last=True)
        self._update_reasons(rep)
        self._refresh_behind()

    def _refresh_behind(self) -> None:
        """Where the adapter reads the queue as text over a periodic JSON read of every job
        (:meth:`SlurmCLI.refresh`), make that JSON read behind this round, after its reason writes, when the
        next two rounds would otherwise make it themselves; :meth:`wait_reasons` waits for it too."""
        due = getattr(self.slurm, "refresh_due", None)
        if due is None or not due(2 * self.cfg.controller.interval_s):
            return
        if self._reason_writer is None:
            self._reason_writer = ThreadPoolExecutor(1, thread_name_prefix="rlsched-reasons")
        self._reason_writes = self._reason_writer.submit(self._refresh, self._reason_writes)

    def _refresh(self, before: Future | None) -> None:
        """The JSON read of :meth:`_refresh_behind`, in the writer thread once ``before`` (the round's reason
        writes, if any) is done; a failure is logged (the next round reads the JSON itself)."""
        if before is not None:
            try:
                before.result()
            except Exception:  # noqa: BLE001 - crash-only: a failed write must not end the daemon
                self.metrics.slurm_errors.inc()
                log.exception("writing reasons failed unexpectedly", extra={"event": "reason_failed"})
        try:
            self.slurm.refresh()
        except SlurmError as exc:
            log.info("reading the queue as JSON behind the round failed (%s); the next round reads it", exc,
                     extra={"event": "refresh_failed"})

    def _note_reports(self, jobs: list[SlurmJob], stats: dict[str, dict]) -> None:
        """Keep the last step each running job's agents reported in its current run (Slurm's restart count);
        forget it once the job no longer runs or runs again (a requeue: its checkpoint step counts then)."""
        runs = {str(j.job_id): j.restarts for j in jobs if j.state in ("RUNNING", "CONFIGURING")}
        for sid in [sid for sid, (run, _p) in self._last_report.items() if runs.get(sid) != run]:
            del self._last_report[sid]
        for sid, s in stats.items():
            step, total = s.get("step"), s.get("total_steps")
            if sid in runs and isinstance(step, int) and not isinstance(step, bool) and total:
                self._last_report[sid] = (runs[sid], {"step": step, "total_steps": total})

    def last_reports(self, stats: dict[str, Any]) -> dict[str, dict[str, int]]:
        """Job id -> ``{step, total_steps}`` last reported in its current run, for the running jobs ``stats``
        (this round's agent stats) lacks: a job that finished its steps is no longer reported as running
        while Slurm still runs it, and its progress stays what it reached (DL2's reward of a slot is the
        difference of two rounds' progress)."""
        return {sid: p for sid, (_run, p) in self._last_report.items() if sid not in stats}

    def _read_jobs(self) -> list[SlurmJob]:
        """Every job Slurm shows: :meth:`SlurmCLI.queue` (a cheap text read laid over the last JSON read)
        where the adapter has it, else its ``jobs()``."""
        queue = getattr(self.slurm, "queue", None)
        return queue() if queue is not None else self.slurm.jobs()

    def _decide(self, now: float, cluster: ClusterSpec, nodes: list, jobs: list[SlurmJob], stats: dict[str, dict],
                rep: RoundReport, last: bool) -> bool:
        """One decision: :func:`policies.rounds.run_round` over :attr:`backend` (state from this Slurm read,
        the policy's decision plus operator requests and contention victims, validated, applied; see
        :mod:`controller.backend`). True when a preemption failed and the decision was dropped (the
        caller decides again; never when ``last``)."""
        assert self.policy is not None
        # only the first max_placements_per_round placements are applied: the policy may stop there
        limit = self.cfg.controller.max_placements_per_round - len(rep.placed)
        self.backend.prepare(now, cluster, nodes, jobs, stats, rep, last)
        out = run_round(self.backend, self.policy, place_limit=limit)
        if self.experience is not None:
            self.experience.collect()
        if out.asked:
            rep.decision_s += out.decision_s
            self.metrics.latency.observe(out.decision_s)
        for f in self.backend.taken:  # consumed only once acted on: a round that fails before (or defers it) keeps the request
            if f.name[len("preempt-"):] not in self._deferred:
                self._remove_request(f)
        return out.report.decide_again

    # ------------------------------------------------------------------ what users see
    @property
    def capacity_file(self) -> Path:
        """The partition's GPUs for job_submit.lua (``controller.capacity_file``, default
        ``state_dir/capacity``)."""
        f = self.cfg.controller.capacity_file
        return Path(f) if f else self.state_dir / "capacity"

    def _write_capacity(self, cluster: ClusterSpec) -> None:
        """Write the managed partition's GPU capacity for job_submit.lua, which refuses at ``sbatch`` a
        job asking for more GPUs than the partition has (it reads the file at each submission; no file:
        no check). ``key=value`` lines: ``partition``, ``gpus`` (configured total, drained and down
        nodes included: a job that fits them can run once they are back), ``nodes``, ``max_node_gpus``.
        Written (atomically, readable by everyone) only when it changed."""
        text = (f"# written by the rlsched controller: GPUs of the managed partition, read by job_submit.lua\n"
                f"partition={self.cfg.slurm.partition or ''}\ngpus={cluster.total_gpus}\n"
                f"nodes={cluster.num_nodes}\nmax_node_gpus={max(n.gpus for n in cluster.nodes)}\n")
        if text == self._capacity_written:
            return
        try:
            self.capacity_file.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(self.capacity_file, text, ".capacity.")
            os.chmod(self.capacity_file, 0o644)
        except (StateDirError, OSError) as exc:
            self._warn_once(f"cannot write the capacity file {self.capacity_file} for job_submit.lua: {exc}",
                            "capacity_unwritable", key="capacity_unwritable")
            return
        self._capacity_written = text

    def _reasons(self, rep: RoundReport) -> list[tuple[str, list[int]]]:
        """The AdminComments this round should change: ``[(text, [job ids])]``, most urgent first
        (the head of the queue, in arrival order, then jobs placed or running, then jobs waiting for a
        reason of their own, then the rest of the queue by band). Jobs whose AdminComment already reads
        so are left out; jobs an administrator holds are never touched."""
        view = self.backend.view
        if view is None or self.cluster is None:
            return []
        placed = {str(j) for j, _ in rep.placed}
        want: list[tuple[int, int, str]] = []  # (rank, job id, new admin comment)
        queue = [p.job_id for p in view.state.pending if p.job_id not in placed]
        for k, jid in enumerate(queue, 1):
            want.append((k if k <= 10 else 10_000 + k, int(jid),
                         f"rlsched: waiting for placement, {queue_position(k, len(queue))}"))
        for sj in list(view.jobs.values()) + view.in_flight:
            if str(sj.job_id) in placed or sj.state == "RUNNING" or (sj.pending and not sj.held):
                want.append((20, sj.job_id, "rlsched: placed"))
        for sid, why in view.waiting.items():
            sj = self.backend.jobs_by_id.get(sid)
            if sj is not None and not sj.admin_held:
                want.append((30, sj.job_id, f"rlsched: not placed yet: {why}"))
        total = self.cluster.total_gpus
        for sj in self.backend.jobs_by_id.values():
            if (sj.gpus > total and sj.managed and sj.held and not sj.admin_held
                    and sj.in_partition(self.cfg.slurm.partition)):
                want.append((40, sj.job_id, f"rlsched: can never start: asks for {sj.gpus} GPUs, the partition "
                                            f"has {total}"))
        groups: dict[str, tuple[int, list[int]]] = {}
        seen: set[int] = set()
        for rank, jid, reason in sorted(want, key=lambda w: w[0]):
            sj = self.backend.jobs_by_id.get(str(jid))
            if sj is None or jid in seen:
                continue
            seen.add(jid)
            text = with_reason(sj.admin_comment, reason)
            if text != sj.admin_comment:
                groups.setdefault(text, (rank, []))[1].append(jid)
        return [(t, ids) for t, (_, ids) in sorted(groups.items(), key=lambda g: g[1][0])]

    def _update_reasons(self, rep: RoundReport) -> None:
        """Write each managed job's state for its owner into its AdminComment, after job_submit.lua's
        mark (``rlsched:managed gpus=8 | rlsched: waiting for placement, position 3 of 7``), where
        ``scontrol show job`` and ``squeue --json`` show it. AdminComment, not Comment: the comment is
        the user's (it declares the workload, and they may edit it at any time), the admin comment only
        operators can write, so no user can forge it. Only changed texts are written, jobs with the
        same text in one ``scontrol update`` call, at most ``reason_updates_per_round`` calls per round
        (the head of the queue first; the rest follow in later rounds), run side by side and behind the
        round where the adapter has ``set_admin_comments`` (each failed one logged and counted; see
        :meth:`wait_reasons`), else one after another (a failed call is logged and counted and ends the
        round's updates). The round itself stays ok."""
        budget = self.cfg.controller.reason_updates_per_round
        setter = getattr(self.slurm, "set_admin_comment", None)
        if budget <= 0 or setter is None or self.cfg.controller.dry_run:
            return
        many = getattr(self.slurm, "set_admin_comments", None)
        if many is not None:  # the calls at once (SlurmCLI), behind the round: see wait_reasons
            groups = self._reasons(rep)[:budget]
            if groups:
                if self._reason_writer is None:
                    self._reason_writer = ThreadPoolExecutor(1, thread_name_prefix="rlsched-reasons")
                self._reason_writes = self._reason_writer.submit(self._write_reasons, many, groups, rep)
            return
        for text, ids in self._reasons(rep)[:budget]:
            try:
                setter(ids, text)
            except SlurmError as exc:
                self.metrics.slurm_errors.inc()
                log.warning("writing the reason of job(s) %s failed: %s", _names([str(i) for i in ids]), exc,
                            extra={"event": "reason_failed"})
                return
            rep.reasons += len(ids)

    def _write_reasons(self, many: Callable, groups: list[tuple[str, list[int]]], rep: RoundReport) -> None:
        """Write ``groups`` with the adapter's ``set_admin_comments`` (its ``scontrol`` calls side by side), each
        failed one logged and counted; ``rep.reasons`` counts the jobs written."""
        for (text, ids), exc in zip(groups, many(groups)):
            if exc is None:
                rep.reasons += len(ids)
                continue
            self.metrics.slurm_errors.inc()
            log.warning("writing the reason of job(s) %s failed: %s", _names([str(i) for i in ids]), exc,
                        extra={"event": "reason_failed"})

    def wait_reasons(self) -> None:
        """Wait until the reason writes the last round handed off are done.

        With an adapter that has ``set_admin_comments`` (:class:`SlurmCLI`) a round does not wait for its
        own reason writes: it hands them to a writer thread and returns once its placements are applied
        (they are the round's last Slurm commands, and the slowest part of a round that moves the head of
        a long queue: up to ``reason_updates_per_round`` ``scontrol`` processes). The next round, and
        :meth:`run` when it ends, waits for them before anything else, so no two rounds' Slurm work
        overlaps and each round reads the comments written before it. The round's report counts the jobs
        written (``RoundReport.reasons``) once they are."""
        fut, self._reason_writes = self._reason_writes, None
        if fut is None:
            return
        try:
            fut.result()
        except Exception:  # noqa: BLE001 - crash-only: a failed write must not end the daemon
            self.metrics.slurm_errors.inc()
            log.exception("writing reasons failed unexpectedly", extra={"event": "reason_failed"})

    # ------------------------------------------------------------------ preemption
    def _admin_requests(self, view: SlurmView) -> tuple[list[str], list[Path]]:
        """Preemptions an operator asked for (``rlsched controller preempt JOBID``): the job ids, and
        their request files, which the caller removes once the round has acted on them (requests
        for jobs that are not running are dropped here). A request this process could not remove
        (written by another user, e.g. root) is logged once and skipped: acted on, it would stay and
        preempt its job again at every later start."""
        d = self.requests_dir
        try:
            names = sorted(e.name for e in os.scandir(d) if e.name.startswith("preempt-"))
        except FileNotFoundError:
            return [], []
        except OSError as exc:
            self._warn_once(f"cannot read preempt requests in {d}: {exc.strerror or exc}; remove the folder "
                            f"(the controller makes it again when it starts)", "preempt_request_unreadable")
            return [], []
        out, taken = [], []
        for name in names:
            f = d / name
            sid = name[len("preempt-"):]
            if self._stuck(f):  # said when removing it failed
                continue
            why = unremovable(f)
            if why is not None:
                self._skip_request(f, why)
                continue
            if any(j.job_id == sid for j in view.state.running):
                out.append(sid)
                taken.append(f)
                log.info("operator asked to preempt job %s", sid, extra={"event": "preempt_request", "job": sid})
            elif self._remove_request(f):
                log.warning("preempt request for job %s ignored: not a running managed job", sid,
                            extra={"event": "preempt_request_ignored", "job": sid})
        return out, taken

    def _stuck(self, f: Path) -> bool:
        """Whether removing this very file (name and inode) failed before: skip it without trying again."""
        try:
            ino = f.lstat().st_ino
        except OSError:
            return False
        return (f.name, ino) in self._stuck_requests

    def _remove_request(self, f: Path) -> bool:
        """Delete a request file; False (logged once, remembered) if that fails."""
        ino = 0
        try:
            ino = f.lstat().st_ino
            f.unlink()
        except FileNotFoundError:
            return True
        except OSError as exc:
            self._stuck_requests.add((f.name, ino))
            self._skip_request(f, exc.strerror or str(exc))
            return False
        return True

    def _skip_request(self, f: Path, why: str) -> None:
        """Say once that request ``f`` cannot be used, why, and how operators avoid it."""
        try:
            owner = user_name(f.lstat().st_uid)
        except OSError:
            owner = "?"
        me = user_name(os.geteuid())
        self._warn_once(f"preempt request {f} (owned by {owner}) skipped: the controller (user {me}) cannot remove "
                        f"it: {why}. Remove it by hand (a folder {f.parent} that is not {me}'s too), and run "
                        f"`rlsched controller preempt` as the controller's user (runuser -u {me} -- rlsched "
                        f"controller preempt JOBID)", "preempt_request_stuck", logging.ERROR, key=f"request {f}")

    def _cs_victims(self, view: SlurmView, stats: dict[str, dict], now: float) -> list[str]:
        thr = self.cfg.controller.cs_preempt_threshold
        if thr <= 0:
            return []
        out = []
        for j in view.state.running:
            if not j.preemptible:  # --no-requeue, or its preemption failed a moment ago
                continue
            cs = (stats.get(j.job_id) or {}).get("cs")
            if cs and cs > thr and j.start_time is not None and now - j.start_time >= self.cfg.controller.min_run_s:
                out.append(j.job_id)
        return out

    def _preempt(self, job: SlurmJob, now: float, force: bool = False) -> bool | None:
        """Checkpoint (agent) then requeue held. True when the job is back in the queue, None when the
        checkpoint failed (the job keeps running; it is no victim for the policy for a while), False
        when it was not tried or the job finished meanwhile."""
        sid = str(job.job_id)
        c = self.cfg.controller
        if not force and job.start_time is not None and now - job.start_time < c.min_run_s:
            log.info("not preempting job %s: started %.0f s ago (< min_run_s)", sid, now - job.start_time,
                     extra={"event": "preempt_skipped", "job": job.job_id})
            return False
        if not job.requeue:  # requeuehold would fail after the checkpoint: the job would just end
            log.info("not preempting job %s: submitted with --no-requeue", sid,
                     extra={"event": "preempt_skipped", "job": job.job_id})
            return False
        if c.dry_run:
            log.info("dry run: would preempt job %s", sid, extra={"event": "dry_run", "job": job.job_id})
            return False
        # intent before action, as for releases: a restart must know the agent may have been asked, and
        # what it needs to record the job's progress if the answer is lost but the job did stop (the
        # restart count tells a requeue since; the nodes say which agents saw the checkpoint)
        asked_t = self.clock()
        entry: dict[str, Any] = {"t": asked_t, "stage": "asked", "start": job.start_time or asked_t,
                                 "gpus": job.gpus, "restarts": job.restarts, "nodes": list(job.nodes)}
        seen = self._stats.get(sid) or {}
        for src, dst in (("step", "seen_step"), ("total_steps", "total_steps")):
            if isinstance(seen.get(src), int) and not isinstance(seen.get(src), bool):
                entry[dst] = seen[src]
        self.journal["preempting"][sid] = entry
        if not self._save():
            self.journal["preempting"].pop(sid, None)
            log.warning("not preempting job %s: the journal cannot record it", sid,
                        extra={"event": "preempt_skipped", "job": job.job_id})
            return False
        out = self.preempter.checkpoint(job, c.preempt_timeout_s)
        t = self.clock()  # a checkpoint may take a while: times below are when it ended
        # without an agent, requeue only if allowed and nothing posed as the agent (an unauthenticated reply)
        # without a checkpoint, requeue only if allowed, and only when no agent could make one: none answered,
        # or those that did do not know the job (it does not run the checkpoint helper); never when something
        # posed as the agent (an unauthenticated reply)
        no_checkpoint_possible = not out.reached_agent or out.unknown_job
        if not out.ok and not (c.preempt_without_agent and no_checkpoint_possible and not out.unverified_reply):
            self.journal["preempting"].pop(sid, None)
            self._save()
            self.metrics.preemptions.labels(outcome="failed").inc()
            n = self._preempt_failed.get(sid, (0, 0.0))[0] + 1
            wait = min(_PREEMPT_BACKOFF_S * 2 ** (n - 1), _MAX_PREEMPT_BACKOFF_S)
            self._preempt_failed[sid] = (n, t + wait)
            hint = (" (the job does not run the checkpoint helper, so it cannot be checkpointed; "
                    "docs/AGENT.md)" if out.unknown_job else "")
            log.warning("preemption of job %s failed, job keeps running (no victim for the policy for %.0f s): %s%s",
                        sid, wait, out.message, hint,
                        extra={"event": "preempt_failed", "job": job.job_id, "agent": out.reached_agent,
                               "unverified_reply": out.unverified_reply, "times": n})
            self._note("preempt_failed", job.job_id, {"why": ("no checkpoint helper" if out.unknown_job
                                                              else out.message[:120])})
            return None
        self._preempt_failed.pop(sid, None)
        total_steps = (self._stats.get(sid) or {}).get("total_steps")
        if out.ok and total_steps and out.checkpoint_step is not None and out.checkpoint_step >= total_steps:
            # it finished all its steps meanwhile: nothing to resume, do not requeue
            self.journal["preempting"].pop(sid, None)
            self._save()
            log.info("job %s finished (step %s of %s) before it could be preempted", sid, out.checkpoint_step, total_steps,
                     extra={"event": "preempt_too_late", "job": job.job_id})
            return False
        self.journal["preempting"][sid] = {"t": t, "stage": "checkpointed", "step": out.checkpoint_step,
                                           "uri": out.checkpoint_uri}
        self._record_progress(sid, job.gpus * max(t - (job.start_time or t), 0.0), out.checkpoint_step, total_steps)
        # not recorded on disk: requeue anyway (the job is checkpointed and stopping; it is in memory)
        self._save()
        self._requeue(job)
        log.info("preempted job %s (checkpoint step %s %s)", sid, out.checkpoint_step, out.checkpoint_uri,
                 extra={"event": "preempted", "job": job.job_id, "checkpoint_step": out.checkpoint_step})
        self.metrics.preemptions.labels(outcome="ok" if out.ok else "no_checkpoint").inc()
        return True

    def _record_progress(self, sid: str, service: float, step: int | None, total_steps: int | None) -> None:
        """Add ``service`` (GPU-seconds) to job ``sid``'s attained service and record the step it resumes
        from, so that the rounds while it waits know its done and remaining work (journal, not saved here)."""
        prog = self.journal["progress"].setdefault(sid, {})
        prog["attained_service"] = float(prog.get("attained_service", 0.0)) + service
        if step is not None:
            prog["step"] = step
            if total_steps:
                prog["total_steps"] = total_steps

    def _recover_asked(self, sid: str, e: dict[str, Any], j: SlurmJob) -> None:
        """A preemption whose agent answer was lost (the controller stopped during the call) and whose
        job has since been requeued (exit 75 after its checkpoint, RequeueExitHold): record its progress
        as :meth:`_preempt` would have. The step is the one the agents saw it checkpoint at, else the
        step it had reached when it was asked (a lower bound); its service ends at the ask."""
        nodes = e.get("nodes")
        if not isinstance(nodes, list) or "restarts" not in e or j.restarts <= int(e["restarts"]):
            return  # an older journal entry, or not requeued since the ask: nothing known to record
        step = self.preempter.preempted_step(sid, [str(n) for n in nodes])
        source = "agent"
        if step is None and "seen_step" in e:
            step, source = int(e["seen_step"]), "last stats"
        total = e.get("total_steps")
        service = float(e.get("gpus", 0)) * max(float(e["t"]) - float(e.get("start", e["t"])), 0.0)
        self._record_progress(sid, service, step, int(total) if total else None)
        log.info("job %s was requeued after a preemption whose answer was lost: progress recorded "
                 "(step %s from %s)", sid, step, source if step is not None else "nowhere",
                 extra={"event": "preempt_recovered", "job": j.job_id, "checkpoint_step": step})

    def _requeue(self, job: SlurmJob) -> None:
        """``scontrol requeuehold``; fine if Slurm already requeued it (exit 75 + RequeueExitHold), also while
        it still finishes that run (:attr:`SlurmJob.requeued_completing`: slurmctld refuses the requeue of a
        job it already requeued, "Job is pending execution")."""
        sid = str(job.job_id)
        try:
            self.slurm.requeue_hold(job.job_id)
        except SlurmError:
            now_job = self.slurm.job(job.job_id)
            if now_job is None or not (now_job.held or now_job.requeued_completing):
                raise  # retried next round (journal stage "checkpointed")
        self.journal["preempting"].pop(sid, None)
        self.journal["released"].pop(sid, None)
        self._save()
        try:
            self.slurm.unplace(job.job_id)
        except SlurmError as exc:  # cosmetic: the next placement overwrites it
            log.info("could not clear node list of job %s: %s", sid, exc)
        self.metrics.decisions.labels(action="requeue").inc()
        self._note("requeue", job.job_id, {})

    def _await_requeued(self, job: SlurmJob) -> str | None:
        """Wait until Slurm has finished the requeue of ``job`` (this round's :meth:`_preempt` of a job it
        moves or resizes): None once the job shows pending and held, else why not (it is not placed this
        round; a later round places it). While the job's last run completes (:attr:`SlurmJob.requeued_completing`,
        usually well under a second, seconds on a loaded host), a pin and release would be undone by Slurm:
        it resets a past start time when the run is over, and the controller would meanwhile see a released
        job that is not pending. Polls every ``_REQUEUE_POLL_S`` up to the round's preemption time left
        (``preempt_timeout_s + agents.timeout_s`` from the round's start), at least ``_REQUEUE_WAIT_MIN_S``."""
        sid = str(job.job_id)
        t0 = time.monotonic()
        end = t0 + max(self._preempt_budget_end - self.clock(), _REQUEUE_WAIT_MIN_S)
        reads = 0
        while True:
            j = self.slurm.job(job.job_id)
            reads += 1
            if j is None or not (j.pending or j.requeued_completing):
                return f"job {sid}: requeued, then {'gone' if j is None else j.state} before it could be placed"
            if j.pending:
                if reads > 1:
                    log.info("job %s: Slurm finished its requeue %.1f s after the first read (COMPLETING till then)",
                             sid, time.monotonic() - t0, extra={"event": "requeue_completed", "job": job.job_id})
                if j.held:
                    return None
                return f"job {sid}: requeued held, then released by someone else; not placed"
            if time.monotonic() >= end:
                log.warning("job %s: Slurm still finishes its last run after its requeue: held, placed by a later "
                            "round", sid, extra={"event": "requeue_completing", "job": job.job_id})
                return f"job {sid}: requeued held, but Slurm still finishes its last run (COMPLETING); placed later"
            time.sleep(_REQUEUE_POLL_S)

    def _finish_preemptions(self, by_id: dict[str, SlurmJob]) -> bool:
        """Complete preemptions a crashed/failed earlier round left half done."""
        changed = False
        if self.cfg.controller.dry_run:
            return False
        for sid, e in list(self.journal["preempting"].items()):
            j = by_id.get(sid) or self.slurm.job(int(sid))
            if j is None or j.state == "CANCELLED" or j.pending or j.requeued_completing:
                if j is not None and (j.pending or j.requeued_completing) and e.get("stage") != "checkpointed":
                    self._recover_asked(sid, e, j)
                self.journal["preempting"].pop(sid, None)
                self._save()
                continue
            if e.get("stage") != "checkpointed" and j.state in _FINISHED:
                # asked, but no checkpoint was confirmed and the job has ended on its own (a job the agent
                # checkpointed exits 75 and RequeueExitHold=75 requeues it held: pending, above). Requeuing
                # would run a COMPLETED or FAILED job again
                log.info("job %s ended (%s) while its preemption was unconfirmed: not requeued", sid, j.state,
                         extra={"event": "preempt_dropped", "job": j.job_id})
                self.journal["preempting"].pop(sid, None)
                self._save()
                continue
            if e.get("stage") == "checkpointed":
                log.info("finishing preemption of job %s (state %s)", sid, j.state, extra={"event": "preempt_resume", "job": j.job_id})
                try:
                    self._requeue(j)
                    changed = True
                except SlurmError as exc:
                    log.error("requeue of job %s failed: %s", sid, exc, extra={"event": "requeue_failed"})
                    self._slurm_hint(exc)
            else:  # asked, job still running: the answer was lost; the policy may ask again
                self.journal["preempting"].pop(sid, None)
                self._save()
        return changed

    # ------------------------------------------------------------------ placement
    def _check_released(self, now: float, by_id: dict[str, SlurmJob], rep: RoundReport) -> bool:
        """Verify started jobs against their plan; hold back released jobs that never started."""
        rel = self.journal["released"]
        backoff = self.journal["backoff"]
        changed = False
        dirty = False
        if self._slurm_failed:
            # the last round(s) could not reach Slurm (slurmctld down?): Slurm could not start released
            # jobs meanwhile, so their start grace counts from now, not from their release
            late = [sid for sid, r in rel.items()
                    if float(r["t"]) < now and sid in by_id and by_id[sid].pending and not by_id[sid].held]
            for sid in late:
                rel[sid]["t"] = now
            if late:
                dirty = True
                log.info("Slurm was unreachable: start grace of released job(s) %s restarts now", _names(late),
                         extra={"event": "grace_restarted"})
        for sid in list(backoff):  # gone, or started at last
            j = by_id.get(sid)
            if j is None or not j.pending:
                backoff.pop(sid)
                dirty = True
        for sid, r in list(rel.items()):
            j = by_id.get(sid)
            if j is not None and j.state == "COMPLETING":
                # a job released while Slurm finished its last run (requeued) or one that ends: Slurm shows
                # which once the run is over (PENDING, or COMPLETED...); the entry stays till then, so a requeued
                # job is not taken for one released by someone else, and it cannot start before: its grace
                # restarts
                if float(r["t"]) < now:
                    r["t"] = now
                    dirty = True
                continue
            if j is None or not (j.pending or j.state in ("RUNNING", "CONFIGURING")):
                rel.pop(sid)
                dirty = True
                continue
            if j.state in ("RUNNING", "CONFIGURING") and j.gpus_per_node:
                plan = r.get("plan_by_name")
                if plan and plan != j.gpus_per_node:
                    self.metrics.placement_mismatch.inc()
                    log.warning("job %s started with split %s, planned %s", sid, j.gpus_per_node, plan,
                                extra={"event": "placement_mismatch", "job": j.job_id})
                rel.pop(sid)
                dirty = True
        # managed jobs pending without a hold: released by this controller and not started yet, or
        # released by someone else (a job its owner requeued, one Slurm requeued after a node
        # failure): the journal records every release before it is made, so a job it does not hold
        # was not released here and is held again at once, before Slurm starts it where it likes
        for sid, j in by_id.items():
            if not j.managed or not j.pending or j.held:
                continue
            if not j.in_partition(self.cfg.slurm.partition):
                continue
            if sid not in rel and self._adopt_unreleased:
                # the journal was lost: such a job may have been released before the restart; give it
                # the grace of a release made now (held back if it has not started by then)
                rel[sid] = {"t": now}
                dirty = True
                continue
            if sid not in rel:
                if self.cfg.controller.dry_run:
                    continue
                try:
                    self.slurm.hold(j.job_id)
                    rep.held_back.append(j.job_id)
                    changed = True
                    self.metrics.decisions.labels(action="rehold").inc()
                    log.warning("job %s is pending without a hold but was not released by rlsched (requeued by "
                                "its owner or by Slurm?): held again", sid,
                                extra={"event": "rehold", "job": j.job_id})
                except SlurmError as exc:  # it may have started meanwhile
                    log.info("hold of job %s failed: %s", sid, exc)
                    self._slurm_hint(exc)
                continue
            r = rel[sid]
            grace = self.cfg.controller.start_grace_s
            if now - float(r["t"]) > grace and not self.cfg.controller.dry_run:
                try:
                    self.slurm.hold(j.job_id)
                    rel.pop(sid)
                    rep.held_back.append(j.job_id)
                    changed = True
                    # placed again at once the first time (a node may have failed); if Slurm keeps
                    # refusing it (resources it cannot give on those nodes, a limit...), wait longer
                    # each time: grace x 2^(n-1) after the n-th hold-back, at most an hour
                    b = backoff.setdefault(sid, {"n": 0})
                    b["n"] = n = int(b.get("n", 0)) + 1
                    b["until"] = now + (0.0 if n == 1 else min(grace * 2 ** (n - 1), _MAX_BACKOFF_S))
                    self.metrics.decisions.labels(action="hold_back").inc()
                    log.warning("job %s released %.0f s ago but not started (%s): held again, placed again in %.0f s",
                                sid, now - float(r["t"]), j.reason, b["until"] - now,
                                extra={"event": "held_back", "job": j.job_id, "times": b["n"]})
                except SlurmError as exc:  # it may have started meanwhile
                    log.info("hold of job %s failed: %s", sid, exc)
                    self._slurm_hint(exc)
            dirty = True
        if dirty:
            self._save()
        return changed

    # ------------------------------------------------------------------ state dir writes
    def _save(self) -> bool:
        """Write the journal; False (logged once, counted, the round's error) when the state dir cannot
        take it. The journal in memory stays authoritative for this process either way."""
        try:
            self.journal.save()
        except StateDirError as exc:
            self._write_failed("journal", exc)
            return False
        self._write_ok("journal")
        return True

    def _write_failed(self, what: str, exc: StateDirError) -> None:
        """Count a failed state-dir write; log it once (event ``state_dir_unwritable``) until that file
        can be written again, and make it this round's error."""
        self.metrics.state_dir_errors.inc()
        msg = str(exc)
        if what == "journal" and self._state_error is None:
            self._state_error = f"state dir unwritable: {msg}"
        if self._unwritable.get(what) != msg:
            self._unwritable[what] = msg
            effect = {"journal": "no job is released or preempted until it can be written (the rest of each round goes on)",
                      "status": "status.json is stale",
                      "lock": "the state dir is locked, but the lock file does not name this process"}[what]
            log.error("state dir unwritable: %s: %s", msg, effect,
                      extra={"event": "state_dir_unwritable", "file": what})

    def _write_ok(self, what: str) -> None:
        if self._unwritable.pop(what, None) is not None:
            log.info("state dir: %s written again", what, extra={"event": "state_dir_writable", "file": what})

    # ------------------------------------------------------------------ status
    def _note(self, action: str, job_id: int, detail: dict) -> None:
        self.history.append({"t": self.clock(), "action": action, "job": job_id, "detail": detail})
        del self.history[:-50]

    def _agents_status(self) -> dict[str, Any]:
        """The node agents as the last round saw them: how many are configured, which did not answer
        (or answered as something else than the agent); also set as the ``rlsched_agents_*`` gauges."""
        pre = self._preempter  # not built before the first round
        addresses = getattr(pre, "addresses", {}) or {}
        bad = sorted(set(getattr(pre, "unreachable", ())) | set(getattr(pre, "unverified", ())))
        self.metrics.agents.set(len(addresses))
        self.metrics.agents_unreachable.set(len(bad))
        return {"configured": len(addresses), "unreachable": bad}

    def _write_status(self, rep: RoundReport) -> None:
        doc = {
            "time": rep.time,
            "pid": os.getpid(),
            "policy": self.policy.name if self.policy else self.policy_name,
            "rounds": self.rounds,
            "interval_s": self.cfg.controller.interval_s,
            "cluster": self.cluster.to_dict() if self.cluster else None,
            "last_round": {"ok": rep.ok, "error": rep.error, "error_kind": rep.error_kind, "queue": rep.queue,
                           "running": rep.running, "placed": rep.placed, "preempted": rep.preempted,
                           "held_back": rep.held_back, "decision_s": rep.decision_s, "waiting": rep.waiting,
                           "reasons": rep.reasons},
            "agents": self._agents_status(),
            "history": self.history[-20:],
            "metrics_port": self.metrics.port,
        }
        try:
            # one line: json's C encoder (indent=1 takes its pure-Python one, ~10 times slower)
            atomic_write(self.state_dir / "status.json", json.dumps(doc), ".status.")
        except StateDirError as exc:
            self._write_failed("status", exc)
        else:
            self._write_ok("status")

    # ------------------------------------------------------------------ loop
    def install_signals(self) -> None:
        signal.signal(signal.SIGHUP, lambda *_: self.request_reload())
        signal.signal(signal.SIGTERM, lambda *_: self.stop())
        signal.signal(signal.SIGINT, lambda *_: self.stop())

    def lock_state_dir(self) -> None:
        """Hold an exclusive lock on ``state_dir/controller.lock`` while this process lives (released when it
        exits, crash included): a second controller on the same state dir (a manual ``run --once`` beside the
        service) would place and release the same held jobs. :class:`ConfigError` if another one holds it."""
        path = self.state_dir / "controller.lock"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:  # a folder in its place, a read-only or full state dir
            raise ConfigError(f"controller.state_dir {self.state_dir}: cannot open its lock file {path}: "
                              f"{exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise ConfigError(f"controller.state_dir {self.state_dir}: in use by another running controller "
                              f"(pid {other}); stop it first, or give this one another state_dir") from None
        except OSError as exc:
            os.close(fd)
            raise ConfigError(f"controller.state_dir {self.state_dir}: cannot lock {path}: {exc.strerror or exc}") from None
        self._lock_fd = fd
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        except OSError as exc:
            # the lock is what keeps a second controller out, and it is held; the pid only tells
            # `controller status`/`preempt` which process runs. Go on: rounds need no free space but
            # for the journal, and say why it is missing
            self._write_failed("lock", StateDirError(path, exc))

    def unlock_state_dir(self) -> None:
        """Release :meth:`lock_state_dir`'s lock (a no-op without one)."""
        fd, self._lock_fd = getattr(self, "_lock_fd", None), None
        if fd is not None:
            os.close(fd)

    def run(self, max_rounds: int | None = None) -> None:
        """Round after round until stopped (SIGTERM/SIGINT) or ``max_rounds``.

        A policy that cannot be built (unknown name, missing RL checkpoint) raises
        :class:`PolicyError` as soon as a round gets as far as building it (the
        first round that reaches Slurm): better a failed start than a daemon that
        never schedules. Once built, a reload that fails keeps the old policy.
        """
        log.info("controller started (pid %d, interval %.3g s, policy %s)", os.getpid(), self.cfg.controller.interval_s,
                 self.policy_name, extra={"event": "start"})
        # Full (generation-2) garbage collections run between rounds, not inside one: with the RL
        # policies' memos the heap holds ~10^6 objects and an automatic full pass would stall a 128x8
        # round by ~0.2 s (docs/BENCHMARKS.md). Generations 0 and 1 stay automatic.
        thresholds = gc.get_threshold()
        gc.set_threshold(thresholds[0], thresholds[1], _NO_AUTO_FULL_GC)
        try:
            while self.backend.next_round():  # every interval_s until stopped
                rep = self.round()
                if self.policy is None and rep.error_kind == "policy":
                    # never built (Slurm may have been down at the first rounds): fail the start
                    raise PolicyError(rep.error or "policy could not be built")
                if max_rounds is not None and self.rounds >= max_rounds:
                    break
                idle_gc(thresholds[2])
        finally:
            self.wait_reasons()
            gc.set_threshold(*thresholds)
        log.info("controller stopped after %d rounds", self.rounds, extra={"event": "stop"})
