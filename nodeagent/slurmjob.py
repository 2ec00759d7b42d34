"""What the node agent asks Slurm and the kernel about a job, to check who may report on it.

A progress report names a Slurm job id, and possibly a process (pid) to signal
on preemption. Neither can be taken from the caller's word, nor from the
process's environment (``SLURM_JOB_ID`` is whatever the caller exported). The
agent checks them against what users cannot forge:

* the **owner UID of the Slurm job**, as slurmctld reports it
  (``squeue --jobs=ID --states=all -o "%A|%U|%T"``: numeric job id, numeric
  uid, state; no user-controlled field is parsed) -- it must equal the
  caller's authenticated UID;
* the **job cgroup of the process** (``/proc/<pid>/cgroup`` naming
  ``job_<id>``, as ``proctrack/cgroup`` and ``task/cgroup`` create it) -- where
  Slurm uses cgroups on the node, the process must be in that job's cgroup.

:class:`SlurmJobs` does both; tests pass their own ``lookup``. When slurmctld
cannot be asked (down, timing out, a bad ``squeue``), :meth:`SlurmJobs.job`
raises :class:`SlurmUnavailable` and the agent **refuses** the report
(UNAVAILABLE, the helper retries with its next report): accepting an
unverifiable report could hand a job's key and its SIGUSR2 to another user. So
an outage of slurmctld delays the *first* report of new jobs (answers are
cached; running jobs whose owner was already verified keep reporting), and a
failed lookup is remembered for ``failure_ttl_s`` so a burst of reports does
not start a burst of ``squeue`` processes.

A report naming a job the agent has not cached costs one ``squeue`` (up to its
``timeout_s``) in one of the agent's few gRPC worker threads, and any user may
name any job id. So the lookups made for an unprivileged caller (``uid`` given
to :meth:`SlurmJobs.job`) are limited: at most ``max_lookups_per_uid`` in
flight at once per uid and ``max_lookups_total`` for all uids together, and at most ``lookup_burst`` at once
then ``lookup_rate_per_s`` per second (a token bucket). A lookup over either
limit is not made: :class:`LookupLimited` is raised at once (the agent answers
RESOURCE_EXHAUSTED; the helper retries with its next report). Answers from the
cache are never limited, and "Slurm does not know this job" is remembered for
``missing_ttl_s`` per uid, so naming the same unknown id again costs nothing
(per uid: one user cannot make a job look absent to its owner).
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

#: Job states after which a job id will not run again (its job key is free).
TERMINAL_STATES = frozenset(
    ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")
)
_JOB_ID_RE = re.compile(r"[0-9]+(?:_[0-9]+)?")
_CGROUP_JOB_RE = re.compile(r"/job_([0-9]+)(?=/|$)")
#: Where Slurm's cgroup plugins put jobs: v2 <root>/system.slice/slurmstepd.scope/job_<id>,
#: v1 <root>/<controller>/slurm/uid_<uid>/job_<id>.
_SLURM_JOB_CGROUP_GLOBS = ("system.slice/slurmstepd.scope/job_*", "*/slurm/uid_*/job_*", "slurm/uid_*/job_*")


class SlurmUnavailable(Exception):
    """Slurm could not be asked (slurmctld down or slow, squeue missing): nothing is known."""


class LookupLimited(Exception):
    """A lookup for an unprivileged uid over its limits (see :class:`SlurmJobs`): Slurm was not asked.

    ``uid``: the caller it was refused for. Not cached: the same lookup is made once the uid is within
    its limits again.
    """

    def __init__(self, message: str, uid: int) -> None:
        super().__init__(message)
        self.uid = uid


@dataclass(frozen=True)
class SlurmJobInfo:
    """A job as slurmctld knows it: numeric ``job_id`` (what cgroups name), owner ``uid``, ``state``."""

    job_id: str
    uid: int
    state: str

    @property
    def gone(self) -> bool:
        """True once the job has ended for good (it will not be requeued)."""
        return self.state.split()[0].upper() in TERMINAL_STATES if self.state else False


#: ``lookup(slurm_job_id)`` -> the job, None if Slurm does not know it (purged / never existed);
#: raises SlurmUnavailable if Slurm cannot be asked.
Lookup = Callable[[str], "SlurmJobInfo | None"]


def squeue_lookup(slurm_job_id: str, *, squeue: str = "squeue", slurm_conf: str | None = None,
                  timeout_s: float = 10.0) -> SlurmJobInfo | None:
    """Ask slurmctld (``squeue``) for a job's numeric id, owner UID and state."""
    if not _JOB_ID_RE.fullmatch(slurm_job_id):
        return None  # not a Slurm job id ("local", ...): Slurm cannot know it
    env = dict(os.environ)
    if slurm_conf and os.path.exists(slurm_conf):
        env["SLURM_CONF"] = slurm_conf
    cmd = [squeue, "--noheader", f"--jobs={slurm_job_id}", "--states=all", "--format=%A|%U|%T"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmUnavailable(f"cannot run {squeue}: {exc}") from None
    err = " ".join(r.stderr.split())
    if r.returncode != 0:
        if "invalid job id" in err.lower():
            return None
        raise SlurmUnavailable(f"{squeue} failed (rc={r.returncode}): {err[-300:] or 'no message'}")
    for line in r.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3 and parts[0].isdigit() and parts[1].isdigit():
            return SlurmJobInfo(job_id=parts[0], uid=int(parts[1]), state=parts[2].strip())
    if r.stdout.strip():
        raise SlurmUnavailable(f"unexpected {squeue} output: {r.stdout.strip()[:200]!r}")
    return None  # rc 0, no line: Slurm no longer knows the job


def proc_job_ids(pid: int, proc: str = "/proc") -> set[str] | None:
    """Numeric Slurm job ids named by ``pid``'s cgroups (empty: in no job cgroup; None: unreadable)."""
    try:
        text = Path(proc, str(pid), "cgroup").read_text()
    except OSError:
        return None
    return {m.group(1) for line in text.splitlines() for m in _CGROUP_JOB_RE.finditer(line.split(":", 2)[-1])}


def slurm_cgroups_in_use(cgroup_fs: str = "/sys/fs/cgroup") -> bool:
    """Whether Slurm puts jobs into cgroups here: some job cgroup exists (then every job process is in one)."""
    root = Path(cgroup_fs)
    return any(next(iter(root.glob(g)), None) is not None for g in _SLURM_JOB_CGROUP_GLOBS)


class SlurmJobs:
    """Cached Slurm job lookups plus the process-side checks, for the agent.

    ``lookup``: a :data:`Lookup` (default: :func:`squeue_lookup`, each call limited to ``timeout_s``
    seconds). ``require_cgroup``: refuse processes that are in no Slurm job cgroup (None: once this
    machine is seen to have Slurm job cgroups, see :func:`slurm_cgroups_in_use`). Known jobs are
    cached for ``cache_ttl_s`` seconds (a job's owner never changes), failures for ``failure_ttl_s``
    seconds, and "Slurm does not know this job" for ``missing_ttl_s`` seconds (0: not cached) per
    asking uid. ``clock``: seconds, monotonic (all the TTLs and rates use it).

    Limits on the lookups made for an unprivileged caller (:meth:`job` with ``uid``), which is
    whoever names a job id in a report (any user, any id): at most ``max_lookups_per_uid``
    lookups in flight per uid and ``max_lookups_total`` in all (so several users together cannot
    hold every worker thread), and a token bucket per uid of ``lookup_burst`` lookups refilled at
    ``lookup_rate_per_s`` lookups per second. Over either, :class:`LookupLimited` at once. Answers
    from a cache are never limited; callers without a uid (privileged ones, the agent's own
    housekeeping) never are. ``max_entries`` bounds each cache.
    """

    def __init__(self, lookup: Lookup | None = None, *, squeue: str = "squeue", slurm_conf: str | None = None,
                 timeout_s: float = 10.0, cache_ttl_s: float = 300.0, failure_ttl_s: float = 2.0,
                 require_cgroup: bool | None = None, proc: str = "/proc", cgroup_fs: str = "/sys/fs/cgroup",
                 clock: Callable[[], float] = time.monotonic, max_entries: int = 4096,
                 max_lookups_per_uid: int = 4, lookup_rate_per_s: float = 2.0, lookup_burst: int = 20,
                 missing_ttl_s: float = 10.0, max_lookups_total: int = 8) -> None:
        if max_lookups_per_uid < 1:
            raise ValueError(f"max_lookups_per_uid must be >= 1, got {max_lookups_per_uid}")
        if max_lookups_total < 1:
            raise ValueError(f"max_lookups_total must be >= 1, got {max_lookups_total}")
        if not (math.isfinite(lookup_rate_per_s) and lookup_rate_per_s > 0):
            raise ValueError(f"lookup_rate_per_s must be a finite number > 0, got {lookup_rate_per_s}")
        if lookup_burst < 1:
            raise ValueError(f"lookup_burst must be >= 1, got {lookup_burst}")
        if not (math.isfinite(missing_ttl_s) and missing_ttl_s >= 0):
            raise ValueError(f"missing_ttl_s must be a finite number >= 0, got {missing_ttl_s}")
        self._lookup: Lookup = lookup or (
            lambda jid: squeue_lookup(jid, squeue=squeue, slurm_conf=slurm_conf, timeout_s=timeout_s))
        self.cache_ttl_s = cache_ttl_s
        self.failure_ttl_s = failure_ttl_s
        self.missing_ttl_s = missing_ttl_s
        self.proc = proc
        self.cgroup_fs = cgroup_fs
        self._require_cgroup = require_cgroup
        self.clock = clock
        self.max_entries = max_entries
        self.max_lookups_per_uid = max_lookups_per_uid
        self.max_lookups_total = max_lookups_total
        self.lookup_rate_per_s = lookup_rate_per_s
        self.lookup_burst = lookup_burst
        self._known: dict[str, tuple[float, SlurmJobInfo]] = {}
        self._failed: dict[str, tuple[float, str]] = {}
        #: (asking uid or None, job id) -> when Slurm said it does not know the job
        self._missing: dict[tuple[int | None, str], float] = {}
        self._in_flight: dict[int, int] = {}  # uid -> its lookups running now
        self._buckets: dict[int, tuple[float, float]] = {}  # uid -> (tokens, clock when counted)
        self._lock = threading.Lock()

    def job(self, slurm_job_id: str, *, fresh: bool = False, uid: int | None = None) -> SlurmJobInfo | None:
        """The job (cached unless ``fresh``), None if Slurm does not know it; SlurmUnavailable if it cannot tell.

        ``uid``: the unprivileged caller the lookup is made for; if Slurm must be asked, the lookup
        counts against that uid's limits and :class:`LookupLimited` is raised (Slurm not asked) when
        it is over them. None: not limited (privileged callers, the agent itself).
        """
        now = self.clock()
        with self._lock:
            hit = self._known.get(slurm_job_id)
            if hit is not None and not fresh and now - hit[0] <= self.cache_ttl_s and not hit[1].gone:
                return hit[1]
            fail = self._failed.get(slurm_job_id)
            if fail is not None and now - fail[0] <= self.failure_ttl_s:
                raise SlurmUnavailable(fail[1])
            gone_at = self._missing.get((uid, slurm_job_id))
            if gone_at is not None and not fresh and now - gone_at <= self.missing_ttl_s:
                return None
            if uid is not None:
                self._admit(uid, now)
        try:
            info = self._lookup(slurm_job_id)
        except SlurmUnavailable as exc:
            with self._lock:
                self._failed[slurm_job_id] = (now, str(exc))
                self._trim(self._failed)
            raise
        finally:
            if uid is not None:
                with self._lock:
                    left = self._in_flight.get(uid, 0) - 1
                    if left > 0:
                        self._in_flight[uid] = left
                    else:
                        self._in_flight.pop(uid, None)
        with self._lock:
            self._failed.pop(slurm_job_id, None)
            if info is None:
                self._known.pop(slurm_job_id, None)
                if self.missing_ttl_s > 0:
                    self._missing[(uid, slurm_job_id)] = now
                    self._trim(self._missing)
            else:
                self._known[slurm_job_id] = (now, info)
                self._trim(self._known)
                self._missing.pop((uid, slurm_job_id), None)
        return info

    def _admit(self, uid: int, now: float) -> None:
        """Count one lookup for ``uid`` (an in-flight slot and a token), or raise LookupLimited. Lock held."""
        busy = self._in_flight.get(uid, 0)
        total = sum(self._in_flight.values())
        if total >= self.max_lookups_total:
            raise LookupLimited(
                f"{total} Slurm job lookups for unprivileged callers are in flight on this node (limit "
                f"{self.max_lookups_total} in all: --lookups-in-flight)", uid)
        if busy >= self.max_lookups_per_uid:
            raise LookupLimited(
                f"uid {uid} already has {busy} Slurm job lookups in flight on this node (limit "
                f"{self.max_lookups_per_uid} per uid: --lookups-in-flight-per-uid)", uid)
        tokens, then = self._buckets.get(uid, (float(self.lookup_burst), now))
        tokens = min(float(self.lookup_burst), tokens + max(0.0, now - then) * self.lookup_rate_per_s)
        if tokens < 1.0:
            self._buckets[uid] = (tokens, now)
            raise LookupLimited(
                f"uid {uid} asked Slurm about too many jobs this agent has not cached (limit "
                f"{self.lookup_burst} at once, then {self.lookup_rate_per_s:g} per second per uid: "
                f"--lookup-burst-per-uid, --lookup-rate-per-uid); next lookup in "
                f"{(1.0 - tokens) / self.lookup_rate_per_s:.1f}s", uid)
        self._buckets[uid] = (tokens - 1.0, now)
        self._in_flight[uid] = busy + 1
        if len(self._buckets) > self.max_entries:  # a full bucket is the same as none: forget those
            full = [u for u, (t, c) in self._buckets.items()
                    if u not in self._in_flight and t + max(0.0, now - c) * self.lookup_rate_per_s >= self.lookup_burst]
            for u in full:
                del self._buckets[u]

    def _trim(self, d: dict) -> None:
        while len(d) > self.max_entries:
            d.pop(next(iter(d)))

    def require_cgroup(self) -> bool:
        if self._require_cgroup is not None:
            return self._require_cgroup
        if slurm_cgroups_in_use(self.cgroup_fs):
            self._require_cgroup = True  # for good: Slurm does not stop using cgroups while running
        return bool(self._require_cgroup)

    def pid_job_ids(self, pid: int) -> set[str] | None:
        """Numeric job ids of ``pid``'s Slurm cgroups (see :func:`proc_job_ids`)."""
        return proc_job_ids(pid, self.proc)
