"""DL2's Gymnasium environment (id ``rlsched/DL2-v0``): one step is one DL2 inference on a simulated
elastic cluster.

:class:`DL2Env` runs an elastic trace (:mod:`trainer.elastic`) through the simulator's own round loop,
``Simulator.run()``, the loop ``rlsched simulate`` and ``rlsched evaluate`` run, with a
:class:`policies.dl2.DL2Policy` whose every inference (:meth:`~policies.dl2.DL2Policy.choose`) is handed
to the agent. Everything else is that policy's: when a slot opens (every ``slot_s`` s, 600 by default),
the jobs in batches of ``J``, the state and the action mask of each inference
(:class:`policies.dl2.SlotBatch`), when a batch ends (stop, nothing but stop feasible, or an action the
mask forbids, which ends the batch as stop does), and how the slot's worker / PS counts are laid onto
nodes (:func:`policies.elastic.materialize`). The simulation runs in a worker thread that waits while the
agent decides: the two never run at once, so an episode is deterministic.

* **Observation**: :func:`policies.dl2.encode` of the batch (``J * (L + 5)`` numbers, plus :data:`policies.dl2.GLOBALS`
  in the ``rows`` layout), float32, in ``Box(0, inf)`` (the free fractions of the ``rows`` layout from -1).
* **Action**: ``Discrete(3J + 1)`` (``3i`` +worker to job ``i``, ``3i + 1`` +PS, ``3i + 2`` both, ``3J``
  stop). The feasible ones: ``info["action_mask"]`` and :meth:`DL2Env.action_masks` (MaskablePPO).
* **Reward**: the seed's slot reward (:func:`policies.dl2.slot_reward`: per job of the slot, the work it
  did in the slot over its total work), paid on the first step after the slot ended (the step whose
  action led, through the simulation, to the next slot's first inference or to the episode's end), 0 on
  the other steps of a slot. Every slot counts, also one without an inference, and the last one is
  closed at the end with every job's remaining work, so an episode's undiscounted return is the number
  of jobs in the trace whatever the agent does; what the agent changes is how early the work is done.
* **Episode**: one trace (drawn with the seeded generator, or ``reset(options={"trace": i})``), ended
  (``terminated``) when every job has finished; ``truncated`` after ``max_steps`` steps. The last step's
  ``info`` has ``avg_jct_s`` and ``makespan_s``.

For a teacher (the DRF warm-up, :func:`trainer.dl2.train.drf_action`) the environment shows what the
policy sees at the current inference: :attr:`DL2Env.batch` (its jobs with the workers / PSs decided so
far), :attr:`DL2Env.used` (aggregate GPUs, CPUs, GB given out in the slot) and :attr:`DL2Env.cap`.
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from policies.cluster import ClusterSpec
from policies.dl2 import DL2Policy, DL2Spec, load_dl2, progress, shipped_dl2, slot_reward
from policies.job import JobSpec
from trainer.common.pick_env import check_traces, register_env, trace_option
from trainer.elastic import elastic_perf
from trainer.simulator import SimConfig, Simulator

__all__ = ["ENV_ID", "DL2Env", "register"]

ENV_ID = "rlsched/DL2-v0"


class _Abort(Exception):
    """Raised in the simulation thread to end an episode the agent left (reset or close)."""


_ABORT = object()


def _abort_all(queues: list[queue.Queue]) -> None:
    for q in queues:
        q.put(_ABORT)


class _DrivenDL2(DL2Policy):
    """:class:`DL2Policy` whose inferences the environment answers (:meth:`choose` waits for the agent's
    action) and whose slots pay the seed's reward to the environment."""

    def __init__(self, net, perf, to_env: queue.Queue, to_sim: queue.Queue) -> None:
        super().__init__(net, perf)
        self._to_env, self._to_sim = to_env, to_sim
        self.cap: tuple = (0.0, 0.0, 0.0)
        self.batch: Sequence = ()
        self.pending = 0.0  # reward of the slots closed since the last inference
        self._prev: dict[str, tuple[float, float]] | None = None  # progress at the open slot's start
        self.time_now = 0.0  # the open slot's time (s)

    def plan(self, jobs, cap, state) -> None:
        self.time_now = float(state.time)
        if self._prev is not None:
            self.pending += slot_reward(self._prev, state)
        self._prev = progress(state)
        self.cap = tuple(cap)
        super().plan(jobs, cap, state)

    def close_last(self) -> None:
        """Every job has finished: the open slot pays each of its jobs' remaining work."""
        if self._prev is not None:
            self.pending += sum(rem / tot for rem, tot in self._prev.values() if tot > 0)
            self._prev = None

    def choose(self, obs: np.ndarray, mask: np.ndarray, batch) -> int:
        self.inferences += 1
        self.batch = batch
        reward, self.pending = self.pending, 0.0
        self._to_env.put(("ask", obs, mask, reward, self.time_now))
        a = self._to_sim.get()
        if a is _ABORT:
            raise _Abort
        return int(a)


class DL2Env(gym.Env):
    """DL2 as a Gymnasium environment (module docstring).

    :param traces: elastic job sets (:func:`trainer.elastic.read_elastic_trace`), at least one.
    :param cluster: the cluster (a spec or its text form / file, e.g. ``data/clusters/dl2.yaml``).
    :param checkpoint: a DL2 checkpoint whose spec (``J``, job types, scales, slot, layout) the environment
        uses (default: the shipped ``dl2``); its weights take no decision here.
    :param max_steps: truncate an episode after this many steps.
    :param round_len: the simulator's round boundary (s).
    :param resize_overhead: seconds an elastic job makes no progress after a resize (``None``: 30 s).
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, traces: Sequence[Sequence[JobSpec]], cluster: ClusterSpec | str,
                 checkpoint: str | None = None, max_steps: int = 1_000_000, round_len: float = 300.0,
                 resize_overhead: float | None = None) -> None:
        from policies.perf import ContentionModel

        super().__init__()
        self.traces = check_traces("DL2Env", traces)
        self.cluster = cluster if isinstance(cluster, ClusterSpec) else ClusterSpec.parse(cluster)
        self.perf = elastic_perf(ContentionModel(self.cluster))
        self.net, _meta, _path = load_dl2(checkpoint if checkpoint is not None else shipped_dl2())
        self.dl2_spec: DL2Spec = self.net.spec
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
            raise ValueError(f"DL2Env: max_steps must be an integer >= 1, got {max_steps!r}")
        self.max_steps = max_steps
        self.cfg = SimConfig(round_len=round_len, resize_overhead=resize_overhead)
        for i, jobs in enumerate(self.traces):  # the simulator's own checks, before any episode
            Simulator(self.cluster, jobs, None, self.perf, self.cfg)
        # every row feature is >= 0; the free fractions of GLOBALS lie in [0, 1] up to the capacity check's
        # tolerance, so their bound is -1; no feature has an upper bound (remaining epochs, slots run)
        low = np.zeros(self.dl2_spec.obs_size, np.float32)
        low[self.dl2_spec.J * self.dl2_spec.row:] = -1.0
        self.observation_space = spaces.Box(low, np.full_like(low, np.inf), dtype=np.float32)
        self.action_space = spaces.Discrete(self.dl2_spec.n_actions)
        self._thread: threading.Thread | None = None
        # the running episode's action queue: when the environment is collected mid-episode (never closed),
        # its simulation thread is told to end
        self._live: list[queue.Queue] = []
        weakref.finalize(self, _abort_all, self._live)
        self._policy: _DrivenDL2 | None = None
        self._obs = np.zeros(self.dl2_spec.obs_size, np.float32)
        self._mask = np.zeros(self.dl2_spec.n_actions, bool)
        self._steps = 0
        self._done = True

    # ------------------------------------------------------------------ what a teacher reads
    @property
    def batch(self) -> Sequence:
        """The current inference's batch (:class:`policies.elastic.PlanJob`, ``w`` / ``p`` decided so far)."""
        return self._policy.batch if self._policy is not None else ()

    @property
    def used(self) -> list[float]:
        """Aggregate (GPUs, CPUs, GB) the open slot has given out so far."""
        return list(self._policy.used) if self._policy is not None else [0.0, 0.0, 0.0]

    @property
    def cap(self) -> tuple:
        """The cluster's aggregate (GPUs, CPUs, GB) the open slot plans within."""
        return self._policy.cap if self._policy is not None else (0.0, 0.0, 0.0)

    def action_masks(self) -> np.ndarray:
        """The feasible actions of the current inference, ``(3J + 1,)`` bool."""
        return self._mask.copy()

    # ------------------------------------------------------------------ the episode
    def _stop_episode(self) -> None:
        t = self._thread
        if t is not None and t.is_alive():
            self._to_sim.put(_ABORT)
            t.join()
        self._thread = None

    def _next(self) -> tuple:
        msg = self._to_env.get()
        if msg[0] == "error":
            self._thread = None
            self._done = True
            raise msg[1]
        return msg

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._stop_episode()
        i = trace_option(options, len(self.traces), self.np_random)
        self._to_env: queue.Queue = queue.Queue()
        self._to_sim: queue.Queue = queue.Queue()
        to_env = self._to_env
        pol = self._policy = _DrivenDL2(self.net, self.perf, to_env, self._to_sim)
        sim = Simulator(self.cluster, self.traces[i], pol, self.perf, self.cfg)
        self._live[:] = [self._to_sim]

        def run() -> None:  # refers to no environment: an environment dropped mid-episode can be collected
            try:
                res = sim.run()
            except _Abort:
                return
            except BaseException as exc:  # noqa: BLE001 - handed to the environment's thread, re-raised there
                to_env.put(("error", exc))
                return
            pol.close_last()
            to_env.put(("done", res, pol.pending))

        self._thread = threading.Thread(target=run, name="DL2Env-simulation", daemon=True)
        self._thread.start()
        msg = self._next()
        if msg[0] != "ask":
            self._thread = None
            raise ValueError(f"DL2Env: trace {i} finished without a DL2 inference (no job could ever be given a worker)")
        _kind, self._obs, self._mask, _reward, t = msg
        self._steps, self._done, self._trace = 0, False, i
        return self._obs.copy(), {"action_mask": self._mask.copy(), "time": t, "trace": i}

    def step(self, action):
        if self._done:
            raise RuntimeError("DL2Env: step() after the episode ended; call reset()")
        if not self.action_space.contains(action):
            raise ValueError(f"DL2Env: action {action!r} is not in Discrete({self.dl2_spec.n_actions})")
        self._steps += 1
        self._to_sim.put(int(action))
        msg = self._next()
        if msg[0] == "done":
            _kind, res, reward = msg
            self._thread, self._done = None, True
            self._mask = np.zeros(self.dl2_spec.n_actions, bool)
            jct = [r.jct for r in res.jobs]
            info = {"action_mask": self._mask.copy(), "time": float(res.makespan), "trace": self._trace,
                    "avg_jct_s": float(np.mean(jct)), "makespan_s": float(res.makespan)}
            return self._obs.copy(), float(reward), True, False, info
        _kind, self._obs, self._mask, reward, t = msg
        truncated = self._steps >= self.max_steps
        if truncated:
            self._stop_episode()
            self._done = True
        return (self._obs.copy(), float(reward), False, truncated,
                {"action_mask": self._mask.copy(), "time": t, "trace": self._trace})

    def close(self) -> None:
        self._stop_episode()
        super().close()


def register() -> None:
    """Register :data:`ENV_ID` with Gymnasium (idempotent)."""
    register_env(ENV_ID, "trainer.dl2.env:DL2Env")
