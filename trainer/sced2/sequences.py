"""SCED2's job sequences sampled from the Philly trace (``data/philly/philly.csv``).

SCED2 (seed 003, section IV-A) trains and tests on sequences of jobs *sampled* from a production
trace, with arrival gaps following the trace's gap distribution, 1,000 jobs per sequence. We
sample the Philly trace the same way (docs/SCED2.md):

1. **pool** (:func:`philly_pool`): every Philly row with ``duration`` in ``(0, 24 h]`` (the seed's
   jobs run minutes to hours, Fig. 3(b); 0.9 % of the rows are longer), its GPUs capped at the
   cluster's; and the trace's arrival gaps: the differences of its sorted submit times (mean
   114 s, coefficient of variation 15: bursts and lulls).
2. **demand** (:func:`sample_sequence`): each job is a 1-GPU row with probability
   ``one_gpu`` (default 0.68, the seed's trace; Philly has 93 % 1-GPU jobs) and otherwise a row
   with more GPUs, drawn uniformly within its class. Its ``duration`` is its isolated run time on
   its best placement (the rule of :mod:`trainer.philly`).
3. **model**: the seed's categories, CV 10 % / NLP 60 % / speech 30 %, onto the performance
   model's workloads (:data:`SCED2_MIX`): CV -> MobileNetV3; NLP -> Transformer-XL, FSDP, MoE
   (20 % each); speech (no speech model here) -> DLRM, the one moderately locality-sensitive
   workload (1.4x between 1 and 8 servers at 8 GPUs; DeepSpeech 1.6x in the seed's Fig. 1).
4. **arrivals**: gaps drawn i.i.d. from the trace's gaps, all multiplied by one factor so that
   the sequence's offered load, ``sum(GPUs x duration) / (last arrival x cluster GPUs)``,
   equals ``load`` (default 1.0: SCED2's setting is a queue that builds up, its baselines wait
   19,075 s on average).

Every draw comes from ``numpy.random.default_rng([seed, 3])``: a sequence is a function of the
pool, its length, the seed and the parameters. Training, validation and test sequences use
disjoint seed ranges (:data:`TRAIN_SEEDS`, :data:`VAL_SEEDS`, :data:`TEST_SEEDS`).
"""

from __future__ import annotations

import csv
import datetime as _dt
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from policies.cluster import ClusterSpec
from policies.job import JobSpec
from policies.perf import ContentionModel

__all__ = [
    "PHILLY_CSV",
    "SCED2_MIX",
    "TEST_SEEDS",
    "TRAIN_SEEDS",
    "VAL_SEEDS",
    "PhillyPool",
    "philly_pool",
    "sample_sequence",
]

#: The shipped Philly trace (repository-relative).
PHILLY_CSV = Path(__file__).resolve().parents[2] / "data" / "philly" / "philly.csv"
#: Model shares of the seed's categories (module docstring, rule 3).
SCED2_MIX = {"MobileNetV3": 0.10, "Transformer-XL": 0.20, "FSDP": 0.20, "MoE": 0.20, "DLRM": 0.30}
#: Seeds of training, validation and test sequences (disjoint).
TRAIN_SEEDS = range(0, 10_000)
VAL_SEEDS = range(10_000, 10_100)
TEST_SEEDS = range(20_000, 20_100)
#: Longest job kept in the pool (s).
MAX_DURATION_S = 24 * 3600.0


@dataclass(frozen=True)
class PhillyPool:
    """The Philly rows and gaps sequences are drawn from.

    :ivar durations: float64 ``[rows]``, run time (s).
    :ivar gpus: int64 ``[rows]``, GPUs (capped at the cluster's).
    :ivar gaps: float64 ``[rows - 1]``, arrival gaps of the whole trace (s).
    """

    durations: np.ndarray
    gpus: np.ndarray
    gaps: np.ndarray


def philly_pool(cluster: ClusterSpec, path: str | Path = PHILLY_CSV) -> PhillyPool:
    """The pool of rule 1 (module docstring) for ``cluster``."""
    path = Path(path)
    dur, gpus, times = [], [], []
    with path.open(newline="", encoding="utf-8-sig") as f:
        for i, row in enumerate(csv.DictReader(f), start=2):
            try:
                d, g = float(row["duration"]), int(float(row["num_gpus"]))
                t = _dt.datetime.fromisoformat(row["timestamp"]).timestamp()
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{path}:{i}: unreadable Philly row ({exc})") from None
            times.append(t)
            if 0 < d <= MAX_DURATION_S and g >= 1:
                dur.append(d)
                gpus.append(min(g, cluster.total_gpus))
    if len(dur) < 2:
        raise ValueError(f"{path}: fewer than 2 usable Philly rows")
    return PhillyPool(np.asarray(dur), np.asarray(gpus, dtype=np.int64), np.diff(np.sort(np.asarray(times))))


def sample_sequence(
    pool: PhillyPool,
    cluster: ClusterSpec,
    n_jobs: int,
    seed: int,
    *,
    load: float = 1.0,
    one_gpu: float = 0.68,
    perf: ContentionModel | None = None,
    prefix: str = "",
) -> list[JobSpec]:
    """One sequence of ``n_jobs`` jobs (rules 2-4 of the module docstring), sorted by submit time,
    ids ``f"{prefix}{i}"``; ``extra`` keeps the pool row and its duration."""
    if n_jobs < 1:
        raise ValueError(f"n_jobs must be >= 1, got {n_jobs}")
    if not 0 < load <= 100 or not 0 <= one_gpu <= 1:
        raise ValueError(f"load must be in (0, 100] and one_gpu in [0, 1], got {load}, {one_gpu}")
    perf = perf or ContentionModel(cluster)
    rng = np.random.default_rng([seed, 3])
    ones = np.flatnonzero(pool.gpus == 1)
    multi = np.flatnonzero(pool.gpus > 1)
    pick_one = rng.random(n_jobs) < one_gpu
    if not len(multi):
        pick_one[:] = True
    rows = np.where(pick_one, ones[rng.integers(len(ones), size=n_jobs)],
                    multi[rng.integers(max(len(multi), 1), size=n_jobs)] if len(multi) else 0)
    names = list(SCED2_MIX)
    probs = np.asarray([SCED2_MIX[m] for m in names])
    models = rng.choice(len(names), size=n_jobs, p=probs / probs.sum())
    gaps = pool.gaps[rng.integers(len(pool.gaps), size=n_jobs)]
    gaps[0] = 0.0
    arrivals = np.cumsum(gaps)
    work = float((pool.gpus[rows] * pool.durations[rows]).sum())
    span = float(arrivals[-1])
    if span > 0:
        arrivals *= work / (load * cluster.total_gpus * span)
    jobs = []
    for i in range(n_jobs):
        r, m = int(rows[i]), names[int(models[i])]
        g = int(pool.gpus[r])
        d = float(pool.durations[r])
        jobs.append(JobSpec(f"{prefix}{i}", float(arrivals[i]), m, g, d * perf.best_isolated_throughput(m, g),
                            extra={"pool_row": r, "duration": d}))
    return jobs
