"""Decision latency of the RL policies and wall time of a training episode.

Run: ``taskset -c 1 python benchmarks/bench_rl.py [--repeats 200] [--clock cpu]`` (pins BLAS
to one thread; ``taskset`` for strictly one core). Not a timed test.

Every latency is measured for two inference paths back to back on the same
states, so the columns compare directly: ``dense`` (``RLPolicy(fast=False)``:
dense observation tensor, full first-layer matmul) and ``fast`` (the default:
the codec round's structured observation evaluated by the network's linear
first-layer plan, :meth:`policies.codecs.deepshare.DeepShareCodec.linear_plan`).
Both encode a round incrementally (:class:`policies.codecs.deepshare.DeepShareRound`).

Measured, for a 4x8 cluster (the shipped checkpoint; if it does not load,
e.g. while it is retrained for a new encoding version, a random network of
the same architecture whose output bias is tilted to low action indices so
that it places like the prior, i.e. long rounds) and a 128x8 cluster (a
network of the same architecture with random weights: the shipped checkpoint
is 4x8 only, and latency depends on the weights only through how many jobs a
round places). The random network picks candidates at random and so starts
large jobs early, which fills the cluster in few placements; ``128x8-prior``
tilts it like the 4x8 fallback, so it places like the admission prior (small
jobs first), as a network trained from the prior does, and its rounds start
several hundred jobs (fast path only):

* one decision: ``RLPolicy.decide`` = a codec round's first encoding
  + network (numpy MLP) + decode, on cluster states captured (evenly over time) from
  greedy simulations of a 256-job (4x8) / 2048-job (128x8) trace, half with
  every job arriving at t = 0 (long queues), half with Poisson arrivals at
  load 1.2;
* one round: ``RLPolicy.schedule`` (all decisions of the round) for rl-base
  and rl-hybrid (whose greedy safety rule runs when the network stops while
  jobs still fit);
* one round as the controller runs it (fast path, ``*_capped``): the same, stopped
  after the controller's default ``max_placements_per_round`` (64) placements
  (``Policy.place_limit``; the controller applies only that many per round, and the
  placements are the first 64 of the unlimited round);
* one training episode: a 256-job trace through ``PlacementEnv`` with the
  network choosing every action.

Full (generation-2) garbage collections run between the measured rounds, as
the controller runs them (``controller.daemon.idle_gc``): with the policies'
memos the heap holds ~10^6 objects and an automatic full pass inside a round
stalled it by ~0.2 s.

Prints p50 / p99 / max in milliseconds and writes JSON with ``--json``. ``--clock cpu`` reads every
figure from this process's CPU time instead of the wall clock: on a machine shared with other work,
wall-clock tails measure the neighbours' load (the process waits for the core), CPU time does not.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import argparse
import copy
import gc
import itertools
import json
import platform
import time

import numpy as np

from controller.config import ControllerSection
from controller.daemon import _NO_AUTO_FULL_GC, idle_gc
from policies.base import Policy
from policies.checkpoint import CheckpointError, MLPNet
from policies.cluster import ClusterSpec
from policies.codecs.deepshare import DeepShareCodec, ObsSpec
from policies.heuristics import make_heuristic
from policies.ledger import ContentionLedger
from policies.perf import ContentionModel
from policies.rl import RLPolicy, make_rl_policy
from policies.state import ClusterState, Decision
from trainer.env import PlacementEnv
from trainer.generate import GeneratorConfig, generate_jobs
from trainer.simulator import Simulator

#: the clock every figure is read from: wall time (``--clock wall``, the default) or this process's CPU
#: time (``--clock cpu``: excludes the time other processes hold the core, which on a shared machine
#: sets the wall-clock tails)
_now = time.perf_counter

#: the controller's default ``max_placements_per_round``: its rounds stop there (``Policy.place_limit``)
CAP = ControllerSection.max_placements_per_round


class _Recorder(Policy):
    """Wraps a policy and keeps copies of the states with pending jobs it is shown. Each copy carries a
    contention ledger of its running jobs, as the simulator and the controller hand theirs in
    (:meth:`ClusterState.use_contention`), built here when the state is captured, outside what is timed."""

    name = "recorder"

    def __init__(self, inner: Policy, every: int, perf: ContentionModel) -> None:
        self.inner, self.every, self.n, self.perf = inner, every, 0, perf
        self.states: list[ClusterState] = []

    def schedule(self, state: ClusterState) -> Decision:
        self.n += 1
        if self.n % self.every == 0 and state.pending:
            running = [copy.copy(j) for j in state.running]
            st = ClusterState(
                state.time,
                state.cluster,
                state.free_gpus.copy(),
                running,
                [copy.copy(j) for j in state.pending],
            )
            st.use_contention(ContentionLedger.from_jobs(
                self.perf, ((j.job_id, j.model, j.placement, j) for j in running), state.cluster.num_nodes))
            self.states.append(st)
        return self.inner.schedule(state)


def _states(cluster: ClusterSpec, perf: ContentionModel, jobs: int, limit: int, seed: int = 7) -> list[ClusterState]:
    """``limit`` states, evenly spaced over a zero-arrival run (long queues) and a Poisson run (load 1.2)."""
    out: list[ClusterState] = []
    for arrival in ("zero", "poisson"):
        trace = generate_jobs(cluster, GeneratorConfig(num_jobs=jobs, arrival=arrival, load=1.2, seed=seed), perf)
        rec = _Recorder(make_heuristic("greedy-np", perf), every=2, perf=perf)
        Simulator(cluster, trace, rec, perf).run()
        idx = np.linspace(0, len(rec.states) - 1, num=min(limit // 2, len(rec.states))).astype(int)
        out.extend(rec.states[i] for i in idx)
    return out


def _random_net(spec: ObsSpec, arch=(64, 64), seed=0, tilt: float = 0.0) -> MLPNet:
    """Random MLP; output bias ``-tilt * action index`` (``tilt`` 3: places like the prior)."""
    rng = np.random.default_rng(seed)
    sizes = [int(np.prod(spec.shape)), *arch, spec.n_actions]
    layers = [
        (rng.normal(0, 1 / np.sqrt(a), size=(b, a)).astype(np.float32), np.zeros(b, np.float32))
        for a, b in itertools.pairwise(sizes)
    ]
    layers[-1] = (layers[-1][0], (-tilt * np.arange(sizes[-1])).astype(np.float32))
    return MLPNet(layers)


def _pct(xs: list[float]) -> dict:
    a = np.asarray(xs) * 1000.0
    return {
        "n": int(a.size),
        "p50_ms": float(np.percentile(a, 50)),
        "p99_ms": float(np.percentile(a, 99)),
        "max_ms": float(a.max()),
    }


#: Inference paths measured back to back: dense tensor; structured observation with the network's
#: linear first-layer plan (default).
PATHS = ("dense", "fast")


def bench_cluster(
    shape: str, jobs: int, repeats: int, shipped: bool, tilt: float = 0.0, paths: tuple[str, ...] = PATHS
) -> dict:
    """Latency on ``shape``; ``tilt``: random weights whose output bias is ``-tilt * index`` (``shipped=False``)."""
    cluster = ClusterSpec.parse(shape)
    perf = ContentionModel(cluster)
    weights = "random (same architecture)"
    net = None
    prior = None
    if shipped:
        try:
            ship = make_rl_policy("rl-base", cluster, perf)
            net, codec, weights, prior = (
                ship.net,
                ship.codec,
                "shipped checkpoint (with its admission prior)",
                ship.prior,
            )
        except CheckpointError as exc:
            print(f"note: {exc}; using random weights tilted to low actions instead")
    if net is None:
        codec = DeepShareCodec(cluster, perf)
        tilt = 3.0 if shipped else tilt
        net = _random_net(codec.spec, tilt=tilt)
        if tilt:
            weights = f"random, output bias -{tilt:g} * index (places like the prior)"
    states = _states(cluster, perf, jobs, repeats)
    # caches (options, speeds, per-job sums) are warmed on *other* states (another trace seed),
    # as in a long-running controller; measured states are each seen once per path
    warm = _states(cluster, perf, jobs, repeats, seed=8)
    out = {
        "cluster": shape,
        "weights": weights,
        "obs_shape": list(codec.spec.shape),
        "states": len(states),
        "pending_mean": float(np.mean([len(s.pending) for s in states])),
        "running_mean": float(np.mean([len(s.running) for s in states])),
    }
    for path in paths:
        fast = path != "dense"
        # three independent policies (own codec and network copy, so no memo is shared between
        # what is measured back to back on one state)
        one_pol, base, hyb = (
            RLPolicy(copy.deepcopy(net), DeepShareCodec(cluster, perf, codec.spec), hybrid=h, fast=fast, prior=prior)
            for h in (False, False, True)
        )
        # fast path: the same rounds as the controller runs them, stopped at its placement cap
        capped = []
        if path == "fast":
            capped = [
                RLPolicy(copy.deepcopy(net), DeepShareCodec(cluster, perf, codec.spec), hybrid=h, prior=prior)
                for h in (False, True)
            ]
            for c in capped:
                c.place_limit = CAP
        one, rounds, hrounds, placed = [], [], [], []
        crounds: list[list[float]] = [[] for _ in capped]
        for st in warm:  # warm caches on other states
            one_pol.decide(st)
            base.schedule(st)
            hyb.schedule(st)
            for c in capped:
                c.schedule(st)
        # full garbage collections between rounds, as the controller runs them (controller.daemon.run)
        thresholds = gc.get_threshold()
        gc.set_threshold(thresholds[0], thresholds[1], _NO_AUTO_FULL_GC)
        try:
            for st in states:
                t0 = _now()
                one_pol.decide(st)
                one.append(_now() - t0)
                t0 = _now()
                d = base.schedule(st)
                rounds.append(_now() - t0)
                placed.append(len(d.place))
                t0 = _now()
                hyb.schedule(st)
                hrounds.append(_now() - t0)
                for c, ts in zip(capped, crounds):
                    t0 = _now()
                    c.schedule(st)
                    ts.append(_now() - t0)
                idle_gc(thresholds[2])
        finally:
            gc.set_threshold(*thresholds)
        out[path] = {
            "placements_per_round_mean": float(np.mean(placed)),
            "placements_per_round_max": int(np.max(placed)),
            "decision": _pct(one),
            "round_rl_base": _pct(rounds),
            "round_rl_hybrid": _pct(hrounds),
        }
        for key, ts in zip(("round_rl_base_capped", "round_rl_hybrid_capped"), crounds):
            out[path][key] = _pct(ts)
    return out


def bench_episode(repeats: int = 3) -> dict:
    cluster = ClusterSpec.parse("4x8")
    perf = ContentionModel(cluster)
    try:
        net = make_rl_policy("rl-base", cluster, perf).net
    except CheckpointError:
        net = _random_net(ObsSpec.for_cluster(cluster), tilt=3.0)
    walls, steps = [], []
    for seed in range(repeats):
        trace = generate_jobs(cluster, GeneratorConfig(num_jobs=256, seed=100 + seed), perf)
        env = PlacementEnv([trace], cluster, perf=perf)
        t0 = _now()
        obs, _ = env.reset(seed=0)
        n = 0
        while True:
            a = net.act(obs, env.action_masks())
            obs, _, term, trunc, _ = env.step(a)
            n += 1
            if term or trunc:
                break
        walls.append(_now() - t0)
        steps.append(n)
    return {"episode_jobs": 256, "wall_s": walls, "steps": steps, "max_wall_s": max(walls)}


def machine_reference(repeats: int = 7) -> dict:
    """Speed of this machine on a fixed workload shaped like a scheduling round.

    The rounds are bound by the Python interpreter and by numpy's per-call
    overhead on short vectors, which vary by 2-3x between the machines this
    project was measured on (and between Python builds, e.g. with or without
    PGO). So every run also times a fixed mix of both: 200,000 iterations of a
    pure-Python loop with dict and list work, and 20,000 numpy calls on
    64-element vectors. Latencies from two machines compare after dividing by
    this number. Returns the best of ``repeats`` runs, in milliseconds, per part
    and in total.
    """
    vec = np.arange(64, dtype=np.float64)
    best_py = best_np = float("inf")
    for _ in range(repeats):
        t0 = _now()
        d: dict[int, int] = {}
        acc: list[int] = []
        for i in range(200_000):
            d[i & 1023] = d.get(i & 1023, 0) + i
            if i % 7 == 0:
                acc.append(i)
        t1 = _now()
        for _ in range(5_000):
            w = vec * 0.5
            np.maximum(w, 3.0, out=w)
            w.argmax()
            float(w.sum())
        t2 = _now()
        best_py = min(best_py, t1 - t0)
        best_np = min(best_np, t2 - t1)
    return {
        "python_ms": best_py * 1e3,
        "numpy_ms": best_np * 1e3,
        "total_ms": (best_py + best_np) * 1e3,
        "python": platform.python_implementation() + " " + platform.python_version(),
        "numpy": np.__version__,
        "cpu": platform.processor() or platform.machine(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=200, help="states per cluster (default 200)")
    ap.add_argument("--json", default=None, help="also write results to this JSON file")
    ap.add_argument(
        "--only",
        choices=("4x8", "128x8", "128x8-prior", "episode"),
        default=None,
        help="run one part only (default: all)",
    )
    ap.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="time with the wall clock (default) or with this process's CPU time (time.process_time), which "
        "leaves out the time other processes hold the core: use it on a shared machine",
    )
    args = ap.parse_args()
    global _now
    _now = time.process_time if args.clock == "cpu" else time.perf_counter
    parts = {
        "4x8": lambda: bench_cluster("4x8", 256, args.repeats, shipped=True),
        "128x8": lambda: bench_cluster("128x8", 2048, args.repeats, shipped=False),
        # a network that places like the admission prior (what a network trained from it does):
        # rounds place many more jobs than the random network's; fast path only (dense takes seconds)
        "128x8-prior": lambda: bench_cluster("128x8", 2048, args.repeats, shipped=False, tilt=3.0, paths=("fast",)),
        "episode": bench_episode,
    }
    ref = machine_reference()
    out: dict = {"machine_reference": ref, "clock": args.clock}
    out.update({k: f() for k, f in parts.items() if args.only in (None, k)})
    print(
        f"machine reference: {ref['total_ms']:.1f} ms (python {ref['python_ms']:.1f} + numpy {ref['numpy_ms']:.1f} ms; "
        f"{ref['python']}, numpy {ref['numpy']}); divide latencies by it to compare machines; clock: {args.clock}"
    )
    for k in ("4x8", "128x8", "128x8-prior"):
        if k not in out:
            continue
        r = out[k]
        print(
            f"{k:6s} obs {r['obs_shape']} ({r['weights']}), {r['states']} states, pending~{r['pending_mean']:.0f} "
            f"running~{r['running_mean']:.0f}, rl-base places {r['fast']['placements_per_round_mean']:.1f}/round "
            f"(max {r['fast']['placements_per_round_max']})"
        )
        for key in ("decision", "round_rl_base", "round_rl_hybrid", "round_rl_base_capped", "round_rl_hybrid_capped"):
            for path in PATHS:
                if path not in r or key not in r[path]:
                    continue
                x = r[path][key]
                print(
                    f"    {key:22s} {path:13s} p50 {x['p50_ms']:8.3f} ms  p99 {x['p99_ms']:8.3f} ms  "
                    f"max {x['max_ms']:8.3f} ms"
                )
    e = out.get("episode")
    if e:
        print(
            f"training episode (256 jobs, 4x8): {', '.join(f'{w:.2f}' for w in e['wall_s'])} s ({args.clock}), "
            f"{e['steps']} steps"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
