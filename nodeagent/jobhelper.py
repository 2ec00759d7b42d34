"""Job-side helper, imported by training scripts.

Typical use (see scripts/examples/)::

    with JobSession.from_env(model="MLP", total_steps=args.total_steps) as s:
        start, state = s.resume()                    # (0, None) on a fresh start
        if state is not None:
            net.load_state_dict(state["model"]); opt.load_state_dict(state["optim"])
        for step in s.steps(start, state_fn=lambda: {"model": net.state_dict(), "optim": opt.state_dict()},
                            samples_per_step=global_batch):
            train_one_step(step)                     # step = number of steps completed before this one

What the session does:

* **resume**: loads the newest *valid* checkpoint of the job key from the
  store (``torch.load(weights_only=True)``: tensors and plain containers only,
  nothing is unpickled).
* **report**: every ``report_every`` steps (at most once per
  ``min_report_interval_s``) sends a ProgressReport to the node
  agent from a background thread (latest report wins; an unreachable agent is
  logged and never stops training). The first report registers this PID.
* **profile**: for ``profile_steps`` steps after ``profile_warmup`` steps it
  runs ``torch.profiler`` (CPU activity, and CUDA activity when the job has
  initialised CUDA) and reports ``comm_fraction`` (:mod:`nodeagent.profiling`): with
  device activity recorded, (GPU time during which an NCCL kernel ran) /
  (GPU busy time); otherwise (wall time during which a communication op --
  gloo/nccl all_reduce, all_gather, broadcast, ... -- was in flight) / (wall
  time of the profiled steps). ``session.profile`` holds the window's numbers.
* **preemption**: SIGUSR2 sets a flag; at the next step boundary (all ranks
  agree through a MAX all-reduce of the flag when torch.distributed is
  initialised) rank 0 saves ``state_fn()`` at the completed step, every rank
  sends a final report and the process exits with :data:`EXIT_PREEMPTED` (75,
  EX_TEMPFAIL; use ``RequeueExitHold=75`` in slurm.conf so Slurm requeues the
  job held, for the controller to re-place). Every rank calls ``state_fn()``
  or none does (it may be collective); it is skipped when a checkpoint at that
  step was just written.
* **after the session**: SIGUSR2 is restored to the script's own handler, or
  *ignored* if it had none (SIG_DFL would let a late preemption kill the
  post-training work). Ignored signals are inherited by child processes.
* **finish**: after ``total_steps`` steps a final checkpoint is saved (so a
  requeue after completion does not redo work) and a final report sent.

Elastic data parallelism (a job the controller may resize: checkpoint -> requeue at another GPU
count and node list -> restart at the new world size; docs/ELASTIC.md, "Live on Slurm"):

* ``JobSession(..., global_batch=G)``: the job trains with a fixed *global* batch of ``G`` samples
  per step whatever its world size ``W``; :attr:`JobSession.plan` (:class:`DataParallelPlan`) gives
  each rank its per-worker batch ``G / W`` and its sample positions at each step (step ``s`` covers
  the job's samples ``s*G .. s*G+G-1``, rank ``r`` the ``r``-th slice of ``G / W``), so the step
  counter and the data position continue exactly across a resize. Checkpoints record ``G``, the
  world size and the data position (``ELASTIC_KEY``); :meth:`JobSession.resume` takes them out of
  the returned state, refuses a checkpoint of another global batch, and notes the world size the
  checkpoint was written at (:attr:`JobSession.resumed_world_size`).
* :func:`launch`: the batch script's launcher (``python job.py --launch``-style): starts one task
  per task of the job's *current* allocation with ``srun``. After a resize the batch environment's
  ``SLURM_NTASKS`` / ``SLURM_NPROCS`` / ``SLURM_GPUS`` are those of the submission (sbatch stores
  them; checked on Slurm 22.05.8), while ``SLURM_TASKS_PER_NODE`` is the allocation's: the launcher
  counts that (:func:`allocation_world_size`), overrides the stale ones, and returns ``srun``'s exit
  status (75 after a preemption checkpoint, so Slurm requeues the job held).

Environment (all optional except where noted):

``RLSCHED_JOB_KEY``  stable key; else comment ``key=``; else ``slurm-$SLURM_JOB_ID``.
``RLSCHED_COMMENT``  the job comment (else read with ``scontrol show job``).
``RLSCHED_AGENT``    ``host:port`` or ``node1=host:port,node2=host:port`` (picked by
                     ``$SLURMD_NODENAME``); empty/``none`` disables reporting.
``RLSCHED_AUTH``     ``munge`` (default), ``munge:/socket``, ``jobkey:/dir`` (per-job key, no MUNGE).
``RLSCHED_STORE``    checkpoint store URL; else the agent's store (Health).
``RLSCHED_PROFILE_TRACE``  if set, each rank writes its profiling window's Chrome trace to
                     ``$RLSCHED_PROFILE_TRACE.rank<r>.json``.
"""

from __future__ import annotations

import atexit
import io
import math
import logging
import os
import queue
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

from nodeagent.convention import job_key_for, parse_comment
from nodeagent.profiling import STOP_CHECK as _STOP_CHECK
from nodeagent.profiling import ProfileSummary, summarize_events
from nodeagent.profiling import comm_fraction_from_events  # noqa: F401  (public name of this module too)
from nodeagent.store import CheckpointInfo, CheckpointNotFound, CheckpointStore, open_store, validate_job_key

log = logging.getLogger("rlsched.jobhelper")

#: Exit status after a preemption checkpoint (EX_TEMPFAIL): requeue me.
EXIT_PREEMPTED = 75
#: Key of the helper's own entry in a checkpoint of a job with a global batch (see :class:`JobSession`).
ELASTIC_KEY = "rlsched_elastic"
DEFAULT_AGENT = "127.0.0.1:50051"

_UNSET = object()


def resolve_agent_address(spec: str | None, node: str | None) -> str | None:
    """Pick this node's agent from ``RLSCHED_AGENT``-style ``spec``; None if disabled."""
    if spec is None:
        return DEFAULT_AGENT
    spec = spec.strip()
    if not spec or spec.lower() == "none":
        return None
    if "=" not in spec:
        return spec
    table: dict[str, str] = {}
    for part in spec.split(","):
        k, sep, v = part.partition("=")
        if sep:  # "node1=a:1, node2=b:2": spaces around names and addresses are not part of them
            table[k.strip()] = v.strip()
    node = node.strip() if node else node
    addr = table.get(node) if node else None
    if addr is None:
        addr = table.get("*")
    if addr is None:
        raise ValueError(f"RLSCHED_AGENT={spec!r} has no entry for node {node!r}")
    if not addr:
        raise ValueError(f"RLSCHED_AGENT={spec!r} has an empty address for node {node!r}")
    return addr


# ----------------------------------------------------------------------------- elastic data parallelism
@dataclass(frozen=True)
class DataParallelPlan:
    """How one rank of a data-parallel job with a fixed global batch splits each step's samples.

    :param global_batch: samples the whole job processes per optimizer step (``G``).
    :param world_size: ranks (workers) at this run (``W``); ``G`` must be a multiple of it.
    :param rank: this rank, ``0 .. W-1``.
    """

    global_batch: int
    world_size: int
    rank: int

    def __post_init__(self) -> None:
        g, w, r = self.global_batch, self.world_size, self.rank
        if not (isinstance(g, int) and isinstance(w, int) and isinstance(r, int)) or g < 1 or w < 1:
            raise ValueError(f"data-parallel plan needs global_batch >= 1 and world_size >= 1, got {g!r}, {w!r}")
        if not 0 <= r < w:
            raise ValueError(f"rank {r} is outside world size {w}")
        if g % w:
            raise ValueError(f"global batch {g} is not a multiple of the world size {w}: the workers' shares "
                             f"would differ (a multiple of {math.lcm(*range(1, w + 1))} divides every size up to {w})")

    @property
    def per_worker(self) -> int:
        """Samples this rank processes per step: ``global_batch / world_size``."""
        return self.global_batch // self.world_size

    def position(self, step: int) -> int:
        """The job's data position before ``step``: samples processed by all ranks in steps ``0 .. step-1``."""
        return int(step) * self.global_batch

    def samples(self, step: int) -> range:
        """This rank's sample positions at ``step`` (global indices into the job's sample stream)."""
        start = self.position(step) + self.rank * self.per_worker
        return range(start, start + self.per_worker)


def tasks_per_node(value: str) -> list[int]:
    """Slurm's ``SLURM_TASKS_PER_NODE`` (``"3,1"``, ``"2(x3),1"``) as one count per node."""
    out: list[int] = []
    for part in filter(None, (p.strip() for p in (value or "").split(","))):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part)
        if m is None:
            raise ValueError(f"SLURM_TASKS_PER_NODE={value!r}: {part!r} is not N or N(xK)")
        out += [int(m.group(1))] * int(m.group(2) or 1)
    return out


def allocation_world_size(env: Mapping[str, str] | None = None) -> int:
    """Tasks of the job's current allocation (the sum of ``SLURM_TASKS_PER_NODE``, which slurmd sets at
    each start); ``SLURM_NTASKS`` only where that is missing. A resized job runs one task per GPU (the
    controller sets ``NumTasks`` to its new GPU count), so this is its world size."""
    env = os.environ if env is None else env
    tpn = env.get("SLURM_TASKS_PER_NODE", "").strip()
    n = sum(tasks_per_node(tpn)) if tpn else int(env.get("SLURM_NTASKS", "") or 1)
    if n < 1:
        raise ValueError(f"SLURM_TASKS_PER_NODE={tpn!r}: no tasks")
    return n


def srun_command(argv: Sequence[str], env: Mapping[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """``(command, environment)`` that start ``argv`` once per task of the current allocation with
    ``srun`` (see :func:`allocation_world_size`): the submission's stale ``SLURM_NTASKS`` /
    ``SLURM_NPROCS`` are replaced by the allocation's task count and its ``SLURM_GPUS`` is dropped
    (srun reads them as ``--ntasks`` / ``--gpus``)."""
    if not argv:
        raise ValueError("launch: no command to start")
    env = dict(os.environ if env is None else env)
    world = allocation_world_size(env)
    env["SLURM_NTASKS"] = env["SLURM_NPROCS"] = str(world)
    env.pop("SLURM_GPUS", None)
    return ["srun", f"--ntasks={world}", "--kill-on-bad-exit=0", *argv], env


def launch(argv: Sequence[str], env: Mapping[str, str] | None = None) -> int:
    """Run :func:`srun_command` of ``argv`` and return its exit status (``EXIT_PREEMPTED`` when the ranks
    stopped at a preemption checkpoint). SIGTERM / SIGUSR2 reaching the launcher are not passed on:
    the node agent signals the ranks themselves, and Slurm ends the step on a requeue."""
    cmd, run_env = srun_command(argv, env)
    log.info("launching %d task(s): %s", int(run_env["SLURM_NTASKS"]), " ".join(cmd))
    main = threading.current_thread() is threading.main_thread()
    prev = signal.signal(signal.SIGUSR2, signal.SIG_IGN) if main else None
    try:
        return subprocess.run(cmd, env=run_env, check=False).returncode
    finally:
        if prev is not None:
            signal.signal(signal.SIGUSR2, prev)


#: Where a field of ``scontrol show job`` output begins: whitespace, then a capitalised ``Name=``
#: (JobId=, StdErr=, CPUs/Task=, ...), not right after a comma: rlsched comments are
#: "model=MoE, key=x", whose lower-case keys after ", " belong to the Comment value.
_SCONTROL_FIELD = re.compile(r"(?<![,\s])\s+(?=[A-Z][A-Za-z0-9_/:]*=)")


def scontrol_field(text: str, name: str) -> str | None:
    """Value of field ``name`` in ``scontrol [-o] show job`` output (the first job), spaces included.

    A value runs up to the next field (see :data:`_SCONTROL_FIELD`), so ``Comment=rlsched:model=MoE,
    key=moe-run-7 StdOut=...`` gives ``rlsched:model=MoE, key=moe-run-7``.
    """
    for token in _SCONTROL_FIELD.split(text.strip().split("\n\n")[0].strip()):
        k, sep, v = token.partition("=")
        if sep and k == name:
            return v.strip()
    return None


def _comment_from_slurm(job_id: str) -> str | None:
    try:
        r = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0:
        return None
    return scontrol_field(r.stdout.splitlines()[0] if r.stdout.strip() else "", "Comment")


class _Reporter(threading.Thread):
    """Background sender: latest-wins queue, never raises into training."""

    def __init__(self, client: Any, timeout: float = 2.0) -> None:
        super().__init__(daemon=True, name="rlsched-reporter")
        self.client = client
        self.timeout = timeout
        self.q: queue.Queue = queue.Queue(maxsize=1)
        self._last_err = 0.0
        self.sent = 0
        self.failed = 0

    def offer(self, report: Any) -> None:
        try:
            self.q.get_nowait()
        except queue.Empty:
            pass
        try:
            self.q.put_nowait(report)
        except queue.Full:
            pass

    def drain(self) -> None:
        """Drop a queued, not yet sent report (a final report supersedes it)."""
        try:
            self.q.get_nowait()
        except queue.Empty:
            pass

    def send_now(self, report: Any) -> bool:
        try:
            self.client.report_progress(report, timeout=self.timeout)
            self.sent += 1
            return True
        except Exception as exc:
            self.failed += 1
            if time.monotonic() - self._last_err > 60:
                self._last_err = time.monotonic()
                log.warning("rlsched progress report not accepted (%s); training continues", exc)
            return False

    def run(self) -> None:
        while True:
            item = self.q.get()
            if item is None:
                return
            self.send_now(item)

    def close(self) -> None:
        self.offer(None)
        self.join(timeout=self.timeout + 1)


def _destroy_process_group() -> None:
    """atexit hook of a preempted distributed job: destroy torch's default process group while the
    interpreter is still whole. A process that exits with the group alive can abort while it is torn
    down (gloo's worker threads: "terminate called without an active exception", SIGABRT), and then
    exits -6 instead of 75, which Slurm would not requeue as held (``RequeueExitHold=75``;
    pytorch/pytorch#190489). A no-op if the job destroyed it."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception as exc:  # noqa: BLE001 -- exiting anyway: say why, keep the exit code
        log.warning("destroying the process group at exit failed: %s", exc)


class JobSession:
    """One process's view of an rlsched job: resume, report, checkpoint, preempt.

    ``total_steps``: optimizer steps the job runs in total (across restarts).
    ``samples_per_step`` (in :meth:`steps`): samples the *whole job* processes per step.
    ``global_batch``: > 0 for an elastic data-parallel job: samples per step across all ranks, the
    same at every world size (:attr:`plan`; the default ``samples_per_step``); its checkpoints record
    it with the world size and data position (module docstring).
    """

    def __init__(
        self,
        job_key: str,
        slurm_job_id: str,
        store: CheckpointStore | str | None,
        agent_address: str | None = None,
        auth: Any = None,
        *,
        model: str = "",
        total_steps: int = 0,
        report_every: int = 5,
        min_report_interval_s: float = 0.5,
        ckpt_every: int = 0,
        keep_checkpoints: int = 2,
        reference_samples_per_s: float = 0.0,
        profile_warmup: int = 3,
        profile_steps: int = 3,
        save_final: bool = True,
        install_signal: bool = True,
        global_batch: int = 0,
    ) -> None:
        self.job_key = validate_job_key(job_key)
        self.slurm_job_id = str(slurm_job_id)
        self.model = model
        self.total_steps = int(total_steps)
        self.report_every = max(1, int(report_every))
        self.min_report_interval_s = max(0.0, float(min_report_interval_s))
        self._last_report_t = -1e9
        self.ckpt_every = max(0, int(ckpt_every))
        self.keep_checkpoints = max(0, int(keep_checkpoints))
        self.reference = float(reference_samples_per_s)
        self.profile_warmup = profile_warmup
        self.profile_steps = profile_steps
        self.save_final = save_final
        self.install_signal = install_signal
        self.agent_address = agent_address
        self._auth = auth
        self._store_spec = store
        self._store: CheckpointStore | None = store if isinstance(store, CheckpointStore) else None
        self._client: Any = None
        self._reporter: _Reporter | None = None
        self._stop = threading.Event()
        self._prev_handler: Any = None
        self._t0 = time.monotonic()
        self._samples = 0
        self.step = 0
        self.checkpoint_step = -1
        self.comm_fraction = -1.0
        self.profile: ProfileSummary | None = None  # the last profiling window's measurements
        self.preempted = False
        self._ctl_group: Any = _UNSET
        self.global_batch = int(global_batch)
        if self.global_batch < 0:
            raise ValueError(f"global_batch must be >= 0, got {global_batch!r}")
        #: world size the resumed checkpoint was written at (None: fresh start, or no record of it)
        self.resumed_world_size: int | None = None

    # ------------------------------------------------------------ creation
    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **kw: Any) -> "JobSession":
        """Build a session from the Slurm / rlsched environment (see module doc); ``kw`` override."""
        env = dict(os.environ if env is None else env)
        slurm_job_id = env.get("SLURM_JOB_ID", "local")
        comment = env.get("RLSCHED_COMMENT")
        if comment is None and "SLURM_JOB_ID" in env and not env.get("RLSCHED_JOB_KEY"):
            comment = _comment_from_slurm(slurm_job_id)
        try:
            fields = parse_comment(comment) or {}
        except ValueError as exc:  # a malformed comment must not kill the training job
            log.warning("ignoring malformed job comment: %s", exc)
            fields, comment = {}, None
        job_key = kw.pop("job_key", None) or env.get("RLSCHED_JOB_KEY") or job_key_for(slurm_job_id, comment)
        kw.setdefault("model", fields.get("model", ""))
        agent = kw.pop("agent_address", None)
        if not agent:
            try:
                agent = resolve_agent_address(env.get("RLSCHED_AGENT"), env.get("SLURMD_NODENAME"))
            except ValueError as exc:  # a misconfigured RLSCHED_AGENT must not kill the training job
                log.warning("%s; progress reporting disabled", exc)
                agent = None
        auth = kw.pop("auth", None)
        if auth is None and agent is not None:
            from nodeagent.auth import make_authenticator

            try:
                auth = make_authenticator(env.get("RLSCHED_AUTH", "munge"))
            except Exception as exc:
                log.warning("cannot set up rlsched agent auth (%s); progress reporting disabled", exc)
                agent = None
        store = kw.pop("store", None) or env.get("RLSCHED_STORE")
        return cls(job_key, slurm_job_id, store, agent, auth, **kw)

    # ------------------------------------------------------------- context
    def __enter__(self) -> "JobSession":
        if self.agent_address and self._auth is not None:
            from nodeagent.client import AgentClient

            self._client = AgentClient(self.agent_address, self._auth, timeout=2.0)
            self._reporter = _Reporter(self._client)
            self._reporter.start()
        if self.install_signal and threading.current_thread() is threading.main_thread():
            prev = signal.signal(signal.SIGUSR2, self._on_signal)
            self._prev_handler = signal.SIG_DFL if prev is None else prev  # None: set outside Python
        self._t0 = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._reporter is not None:
            self._reporter.close()
        if self._client is not None:
            self._client.close()
        if self._prev_handler is not None:
            # SIG_DFL would let a late SIGUSR2 (a Preempt racing with the end of training) kill the
            # process during whatever it does after the session (evaluation, export): Slurm would record
            # FAILED. So a default disposition becomes "ignore"; a handler of the script's own is restored.
            prev = self._prev_handler
            signal.signal(signal.SIGUSR2, signal.SIG_IGN if prev == signal.SIG_DFL else prev)
            self._prev_handler = None

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._stop.set()

    def request_stop(self) -> None:
        """Ask for a preemption checkpoint at the next step boundary (what SIGUSR2 does)."""
        self._stop.set()

    # --------------------------------------------------------------- store
    @property
    def store(self) -> CheckpointStore:
        if self._store is None:
            url = self._store_spec if isinstance(self._store_spec, str) and self._store_spec else None
            if url is None and self._client is not None:
                try:
                    url = self._client.health()["store_url"] or None
                except Exception as exc:
                    log.warning("cannot ask the agent for its store URL: %s", exc)
            if url is None:
                raise RuntimeError("no checkpoint store: set RLSCHED_STORE (or run next to an rlsched agent)")
            # owner check for root too (open_store alone checks none for root, as the agent needs): a root
            # job must not resume a checkpoint another user planted under its job key in a shared store
            self._store = open_store(url).for_owner(os.geteuid())
        return self._store

    # ----------------------------------------------------------- distributed
    @staticmethod
    def _dist() -> Any:
        try:
            import torch.distributed as dist

            return dist if dist.is_available() and dist.is_initialized() else None
        except ImportError:
            return None

    @staticmethod
    def _env_rank_world() -> tuple[int, int]:
        """(rank, world size) from torchrun's RANK/WORLD_SIZE, else srun's SLURM_PROCID/SLURM_NTASKS."""
        env = os.environ
        for rank_var, world_var in (("RANK", "WORLD_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS")):
            if env.get(rank_var, "").strip():
                try:
                    rank = max(0, int(env[rank_var]))
                    world = int(env.get(world_var, "") or 0)
                except ValueError:
                    continue
                return rank, max(world, rank + 1)  # never rank >= world (the agent would refuse every report)
        return 0, 1

    @property
    def rank(self) -> int:
        d = self._dist()
        return d.get_rank() if d else self._env_rank_world()[0]

    @property
    def world_size(self) -> int:
        d = self._dist()
        return d.get_world_size() if d else self._env_rank_world()[1]

    def _ctl(self) -> tuple[Any, Any]:
        """(torch.distributed, group) for the helper's own small CPU collectives (stop vote, resume step,
        barriers), or (None, None) when not distributed. ``group`` is None (the default group) if that group
        handles CPU tensors; else (e.g. ``nccl``: backend config ``cuda:nccl``) a gloo side group, created
        once, at the first of these collectives -- which every rank reaches in the same order, as
        ``new_group`` requires."""
        d = self._dist()
        if d is None:
            return None, None
        if self._ctl_group is _UNSET:
            cpu = "cpu:" in str(d.get_backend_config())
            self._ctl_group = None if cpu else d.new_group(backend="gloo")
        return d, self._ctl_group

    def should_stop(self) -> bool:
        """True if any rank got SIGUSR2 (collective: every rank must call it at the same step)."""
        d, group = self._ctl()
        if d is None:
            return self._stop.is_set()
        import torch

        with torch.profiler.record_function(_STOP_CHECK):
            flag = torch.tensor([1 if self._stop.is_set() else 0], dtype=torch.int32)
            d.all_reduce(flag, op=d.ReduceOp.MAX, group=group)
        return bool(flag.item())

    @property
    def plan(self) -> DataParallelPlan:
        """This rank's share of each step at the current world size (needs ``global_batch``)."""
        if self.global_batch <= 0:
            raise ValueError("JobSession.plan needs global_batch > 0")
        return DataParallelPlan(self.global_batch, self.world_size, self.rank)

    def _take_elastic(self, state: Any, step: int) -> None:
        """Take the helper's record out of a resumed ``state`` and check it against this run."""
        meta = state.pop(ELASTIC_KEY, None) if isinstance(state, dict) else None
        if not isinstance(meta, dict):
            return
        g, w = meta.get("global_batch"), meta.get("world_size")
        if self.global_batch and isinstance(g, int) and g != self.global_batch:
            raise ValueError(f"job {self.job_key!r}: checkpoint step {step} was trained with global batch {g}, "
                             f"this run asks for {self.global_batch}: a resized job must keep its global batch")
        self.resumed_world_size = w if isinstance(w, int) else None
        if self.global_batch and self.resumed_world_size is not None:
            log.info("job %s resumes at step %d (data position %d) at world size %d (checkpoint written at %d): "
                     "%d samples per worker per step", self.job_key, step, step * self.global_batch,
                     self.world_size, self.resumed_world_size, self.global_batch // max(1, self.world_size))

    # ------------------------------------------------------------- public
    def resume(self) -> tuple[int, dict | None]:
        """(step, state) of the newest valid checkpoint, or (0, None)."""
        import torch

        clean = getattr(self.store, "clean_temp", None)  # temp files of earlier runs killed mid-save
        if clean is not None and self.rank == 0:
            try:
                if n := clean(self.job_key):
                    log.info("removed %d temp file(s) that crashed saves of job %s left", n, self.job_key)
            except Exception as exc:  # housekeeping only; load() below reports a store that cannot be read
                log.warning("cleaning leftover temp files failed: %s", exc)
        d, group = self._ctl()
        if d is None or d.get_world_size() == 1:
            try:
                info, blob = self.store.load(self.job_key)
            except CheckpointNotFound:
                self.step = 0
                return 0, None
        else:
            info, blob = self._agreed_checkpoint(d, group)
            if info is None:
                self.step = 0
                return 0, None
        state = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
        self._take_elastic(state, info.step)
        self.step = self.checkpoint_step = info.step
        log.info("resumed job %s from step %d (%s)", self.job_key, info.step, info.uri)
        return info.step, state

    def _agreed_checkpoint(self, d: Any, group: Any) -> tuple[CheckpointInfo | None, bytes]:
        """Rank 0 picks the newest valid checkpoint and broadcasts its step and sha256; every other rank
        loads exactly that one (its own store view may be stale or differ: resuming at different steps
        would hang the job at its first collective). Then all ranks vote: if any failed, every rank raises
        (a clear error, no hang)."""
        import torch

        err: BaseException | None = None
        info: CheckpointInfo | None = None
        blob = b""
        msg = torch.zeros(33, dtype=torch.int64)  # [step (-1: none, -2: rank 0 failed), sha256 bytes]
        if self.rank == 0:
            try:
                info, blob = self.store.load(self.job_key)
                msg[0] = info.step
                msg[1:] = torch.tensor(list(bytes.fromhex(info.sha256)), dtype=torch.int64)
            except CheckpointNotFound:
                msg[0] = -1
            except Exception as exc:  # noqa: BLE001 -- re-raised after the others were told
                err, msg[0] = exc, -2
        d.broadcast(msg, src=0, group=group)
        step = int(msg[0])
        sha = bytes(int(b) for b in msg[1:]).hex()
        if self.rank != 0 and step >= 0:
            try:
                info, blob = self.store.load(self.job_key, step=step)
                if info.sha256 != sha:
                    raise RuntimeError(f"its sha256 is {info.sha256[:12]}..., rank 0's is {sha[:12]}...")
            except Exception as exc:  # noqa: BLE001 -- reported to every rank, then raised
                err = RuntimeError(
                    f"rank {self.rank} cannot load checkpoint step {step} (sha256 {sha[:12]}...) of job "
                    f"{self.job_key!r} from store {self.store.url}, which rank 0 resumes from: {exc}. "
                    "Every rank must see the same checkpoint store (a shared file system, not a node-local "
                    "directory or a stale NFS cache)")
                err.__cause__ = exc
        ok = torch.tensor([0 if err is not None else 1], dtype=torch.int32)
        d.all_reduce(ok, op=d.ReduceOp.MIN, group=group)
        if err is not None:
            log.error("%s", err)
            raise err
        if step == -2 or not int(ok):
            raise RuntimeError(
                f"cannot resume job {self.job_key!r}: "
                + ("rank 0 could not read the checkpoint store" if step == -2 else
                   f"another rank could not load checkpoint step {step} that rank 0 chose from {self.store.url}")
                + " (see that rank's log)")
        return (info, blob) if step >= 0 else (None, b"")

    def save(self, step: int, state: dict, *, prune: bool = True) -> CheckpointInfo | None:
        """Checkpoint ``state`` (tensors / plain containers) at ``step``; rank 0 writes, others only record
        the step (all ranks call it together, so all decide alike whether to call ``state_fn`` again).

        Older checkpoints beyond the newest ``keep_checkpoints`` valid ones are deleted (0: keep all),
        unless ``prune`` is False: the preemption save leaves that to the resumed run's first save, as
        pruning reads back and hashes the checkpoints it keeps, time the preempted job would spend
        before it exits.
        """
        import torch

        if self.rank != 0:
            # every rank records the step: the skip decisions below (preemption, final save) must be the
            # same on all ranks, as state_fn() may be collective (e.g. gathering a sharded state dict)
            self.checkpoint_step = int(step)
            return None
        if self.global_batch and isinstance(state, dict):
            state = {**state, ELASTIC_KEY: {"global_batch": self.global_batch, "world_size": self.world_size,
                                            "step": int(step), "position": int(step) * self.global_batch}}
        buf = io.BytesIO()
        torch.save(state, buf)
        info = self.store.save(self.job_key, int(step), buf.getvalue())
        self.checkpoint_step = info.step
        if self.keep_checkpoints and prune:
            try:
                self.store.prune(self.job_key, keep=self.keep_checkpoints)
            except Exception as exc:  # garbage collection must never fail a save
                log.warning("pruning old checkpoints failed: %s", exc)
        return info

    def _report_msg(self, step: int, samples: int, state: str = "running", final: bool = False) -> Any:
        from proto import rlsched_agent_pb2 as pb

        return pb.ProgressReport(
            job_key=self.job_key,
            slurm_job_id=self.slurm_job_id if self.slurm_job_id.replace("_", "").isalnum() else "local",
            step=int(step),
            total_steps=max(self.total_steps, int(step)),
            samples=int(samples),
            elapsed_s=time.monotonic() - self._t0,
            model=self.model,
            checkpoint_step=self.checkpoint_step,
            pid=os.getpid(),
            reference_samples_per_s=self.reference,
            comm_fraction=self.comm_fraction,
            rank=self.rank,
            world_size=self.world_size,
            final=final,
            state=state,
        )

    def report(self, step: int, samples: int, *, state: str = "running", final: bool = False) -> None:
        """Queue a progress report (non-blocking; final reports are sent synchronously, best effort).

        ``samples``: samples processed by the whole job since this process started.
        """
        self.step = step
        if self._reporter is None:
            return
        now = time.monotonic()
        if not final and now - self._last_report_t < self.min_report_interval_s:
            return  # rate limit: each report costs a credential (a munge call) on both ends
        self._last_report_t = now
        msg = self._report_msg(step, samples, state, final)
        if final:
            self._reporter.drain()
            self._reporter.send_now(msg)
        else:
            self._reporter.offer(msg)

    def steps(
        self,
        start: int,
        state_fn: Callable[[], dict],
        samples_per_step: int | None = None,
    ) -> Iterator[int]:
        """Yield step indices ``start .. total_steps-1``; handle reports, profiling, checkpoints, preemption.
        ``samples_per_step`` defaults to ``global_batch``."""
        if self.total_steps <= 0:
            raise ValueError("JobSession.steps needs total_steps > 0")
        if samples_per_step is None:
            if self.global_batch <= 0:
                raise ValueError("JobSession.steps needs samples_per_step (or a session with global_batch)")
            samples_per_step = self.global_batch
        step = start
        self.report(step, self._samples)  # registers the PID with the agent
        prof = None
        prof_t0 = 0.0
        prof_from = start + self.profile_warmup
        try:
            while step < self.total_steps:
                if self.should_stop():
                    self._preempt_exit(step, state_fn)
                if self.profile_steps > 0 and step == prof_from and prof is None:
                    prof = self._start_profiler()
                    prof_t0 = time.perf_counter()
                yield step
                step += 1
                self._samples += samples_per_step
                self.step = step
                if prof is not None and step == prof_from + self.profile_steps:
                    prof, p = None, prof
                    self._finish_profiler(p, time.perf_counter() - prof_t0)
                if self.ckpt_every and step % self.ckpt_every == 0 and step < self.total_steps:
                    self.save(step, state_fn())
                if step % self.report_every == 0:
                    self.report(step, self._samples)
            if prof is not None:
                prof, p = None, prof
                self._finish_profiler(p, time.perf_counter() - prof_t0)
        finally:
            if prof is not None:  # the loop ended inside the profiled steps (an error, a break, preemption)
                self._stop_profiler(prof)
        if self.save_final and self.checkpoint_step != step:
            self.save(step, state_fn())
        self._barrier()
        self.report(step, self._samples, state="finished", final=True)

    # ------------------------------------------------------------ internals
    def _barrier(self) -> None:
        d, group = self._ctl()
        if d is not None:
            d.barrier(group=group)

    def _preempt_exit(self, step: int, state_fn: Callable[[], dict]) -> None:
        t = time.monotonic()
        info = self.save(step, state_fn(), prune=False) if self.checkpoint_step != step else None
        self._barrier()  # every rank waits until rank 0's checkpoint is durable
        self.checkpoint_step = step
        self.preempted = True
        log.warning("preempted at step %d: checkpoint %s saved in %.2fs; exiting with %d",
                    step, info.uri if info else "(already saved)", time.monotonic() - t, EXIT_PREEMPTED)
        self.report(step, self._samples, state="preempted", final=True)
        if self._dist() is not None:
            atexit.register(_destroy_process_group)
        raise SystemExit(EXIT_PREEMPTED)

    def _start_profiler(self) -> Any:
        """Start ``torch.profiler`` with CPU activity, plus CUDA activity when CUDA is available and the job
        has initialised it (a CPU job on a GPU host gets no CUDA context from the helper). If the CUDA
        profiler cannot start (e.g. no CUPTI), the window is profiled on the CPU only."""
        try:
            import torch
            from torch.profiler import ProfilerActivity, profile
        except Exception as exc:
            log.warning("torch.profiler unavailable: %s", exc)
            return None
        tries = [[ProfilerActivity.CPU]]
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            tries.insert(0, [ProfilerActivity.CPU, ProfilerActivity.CUDA])
        for activities in tries:
            try:
                p = profile(activities=activities)
                p.__enter__()
                return p
            except Exception as exc:
                log.warning("torch.profiler with %s failed to start: %s", [a.name for a in activities], exc)
        return None

    @staticmethod
    def _stop_profiler(prof: Any) -> None:
        """Stop a profiler whose steps did not complete, measuring nothing (the process goes on unprofiled)."""
        try:
            prof.__exit__(None, None, None)
        except Exception as exc:
            log.warning("stopping the profiler failed: %s", exc)

    def _finish_profiler(self, prof: Any, wall_s: float) -> None:
        """Stop the profiler and set ``comm_fraction`` and ``profile`` from its events (see
        :mod:`nodeagent.profiling`: NCCL kernels over device busy time when the window recorded CUDA
        activity, host collective ops over wall time otherwise). With ``RLSCHED_PROFILE_TRACE=PATH`` rank
        r also writes the window's Chrome trace to ``PATH.rank<r>.json``."""
        try:
            prof.__exit__(None, None, None)
            summary = summarize_events(list(prof.events()), wall_s * 1e6)
            self.profile, self.comm_fraction = summary, summary.comm_fraction
            log.info("profiled %d steps (%s activity): comm_fraction=%.3f", self.profile_steps, summary.source,
                     self.comm_fraction)
        except Exception as exc:
            log.warning("profiling failed: %s", exc)
            return
        trace = os.environ.get("RLSCHED_PROFILE_TRACE", "").strip()
        if trace:
            try:
                prof.export_chrome_trace(f"{trace}.rank{self.rank}.json")
            except Exception as exc:
                log.warning("cannot write the profiler trace %s.rank%d.json: %s", trace, self.rank, exc)
