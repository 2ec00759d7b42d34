"""Performance model: how fast a job trains on a placement, alone and shared.

The model has two parts (equations and fit errors in ``docs/PERFORMANCE_MODEL.md``).

**Isolated throughput.** A data-parallel job of ``G`` GPUs spread over ``n``
nodes spends, per sample and GPU, a compute time ``a`` plus communication::

    tau(G, n) = a + b * u(G, n) + c * (n - 1)       [seconds per sample per GPU]
    u(G, n)   = 2 (G - 1) / G * (eta if n == 1 else 1)
    throughput(G, n) = G / tau(G, n)                  [samples / s]

``u`` is the ring all-reduce volume factor; ``eta`` = inter-node / intra-node
bandwidth (5 / 16 on the seed's testbed) makes a single-node job's
communication cheaper; ``c`` prices every extra node a job spans (latency,
hops, stragglers). ``a, b, c >= 0`` are fitted per model by non-negative
least squares on relative error to DeepShare's measured table, so in the
parametric part a job never gets faster by spreading over more nodes. Where
the table has the exact ``(model, G, n)`` the measured number is used, and
some measured values do grow with the node count at a fixed ``G`` (GraphSage,
MobileNetV3 at ``G = 8``; ``docs/PERFORMANCE_MODEL.md``, "Limits"), so over
measured shapes spreading can be faster. Elsewhere the parametric value is
scaled by the model's median measured/parametric ratio at the same ``G`` (if
any) so the two agree where they meet.

A model registered (:func:`policies.workloads.register_workload`) after a
:class:`ContentionModel` was built is unknown to it: pricing it raises
:class:`~policies.workloads.UnknownModelError` saying so (build a new model).

**Contention.** Only jobs spanning several nodes use the node's network link,
so only they slow each other (the seed's rule). Job ``A`` sharing node ``v``
with multi-node jobs ``B`` suffers extra communication time::

    CS(A | B) = measured 1 / ratio(A, B)            if both shapes are measured
              = 1 + k_A * chi_A * beta_B             otherwise
    achieved throughput = isolated / CS(A)

``chi_A`` is A's communication share of step time, ``beta_B`` B's measured
bandwidth (Table I) over the link bandwidth, ``k_A`` a per-model constant
fitted to the 36 x 36 measured matrix. This module prices a pair
(:meth:`ContentionModel.pair_cs`); :mod:`policies.ledger` combines the pairs
into a job's ``CS(A)`` (sum over the neighbours on a node, worst node, capped at
``1 / MIN_RATIO``) and keeps it per running job.

**GPU types.** The measurements are of TITAN Xp GPUs (speed factor 1). On
nodes of another type (:mod:`policies.gputypes`) only the computation part of
a step runs faster or slower; communication is priced by the links. A
synchronous data-parallel job runs at the pace of its slowest GPU, so with
``f`` the smallest speed factor over the job's nodes and ``s`` the
communication share of its step time at the reference speed::

    s = (b u(G, n) + c (n - 1)) / tau(G, n)
    throughput = isolated(G, n) / ((1 - s) / f + s)

``throughput(job, allocation, cluster)`` applies it; on a cluster without GPU
types (or wherever ``f == 1``) it returns ``isolated(G, n)`` itself.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np

from policies.cluster import ClusterSpec, Placement
from policies.gputypes import speed_factor
from policies.resources import Allocation
from policies.ledger import CONTENTION_RULES, DS_MIN_RATIO, MIN_RATIO, JobKey, check_contention
from policies.ledger import job_cs as _job_cs
from policies.ledger import node_cs as _node_cs
from policies.workloads import UnknownModelError, canonical_model, get_workload

if TYPE_CHECKING:
    from policies.job import JobSpec

__all__ = [
    "PerformanceModel",
    "ContentionModel",
    "MeasuredData",
    "load_measured_data",
    "JobKey",
    "MIN_RATIO",
    "estimate_eta",
    "CONTENTION_RULES",
]


@runtime_checkable
class PerformanceModel(Protocol):
    """What the simulator, policies and controller need from a performance model
    (:class:`ContentionModel` is the project's). Throughputs are samples/s."""

    def throughput(
        self, job: "JobSpec | str", allocation: "Allocation | Placement", cluster: ClusterSpec | None = None
    ) -> float:
        """Samples/s of ``job`` (a spec or a model name) alone on ``allocation``, seeing the attributes of
        ``cluster``'s nodes (GPU types: a synchronous job runs at the pace of its slowest GPU);
        ``cluster`` None: the model's own cluster."""

    def isolated_throughput(self, model: str, gpus: int, nodes: int) -> float:
        """Samples/s of a job alone on ``gpus`` GPUs over ``nodes`` nodes of the reference GPU."""

    def pair_cs(self, a: JobKey, b: JobKey) -> float:
        """Contention sensitivity (>= 1) of job ``a`` sharing a node with ``b``."""

    def best_isolated_throughput(self, model: str, gpus: int) -> float:
        """Fastest isolated throughput (samples/s) over the placements the model's cluster allows."""


@dataclass(frozen=True)
class MeasuredData:
    """DeepShare's measurements (see ``policies/data/NOTICE.md``)."""

    isolated: dict[JobKey, float]  # samples / s
    ratio: dict[tuple[JobKey, JobKey], float]  # achieved / isolated of the row job
    total_samples: dict[tuple[str, int], float]  # samples for ~1 h isolated


def _parse_key(text: str) -> JobKey:
    model, gpus, nodes = (s.strip() for s in text.split(","))
    return (canonical_model(model), int(gpus), int(nodes))


@lru_cache(maxsize=1)
def load_measured_data() -> MeasuredData:
    base = resources.files("policies") / "data" / "deepshare"
    isolated: dict[JobKey, float] = {}
    with (base / "isolated_thp.csv").open(encoding="utf-8-sig") as f:
        reader = csv.reader(f)
        next(reader)
        for row in reader:
            isolated[_parse_key(row[0])] = float(row[1])
    ratio: dict[tuple[JobKey, JobKey], float] = {}
    with (base / "shared_thp_ratio.csv").open(encoding="utf-8-sig") as f:
        reader = csv.reader(f)
        cols = [_parse_key(c) for c in next(reader)[1:]]
        for row in reader:
            rk = _parse_key(row[0])
            for ck, v in zip(cols, row[1:]):
                ratio[(rk, ck)] = float(v)
    total: dict[tuple[str, int], float] = {}
    with (base / "total_samples_trained.csv").open(encoding="utf-8-sig") as f:
        reader = csv.reader(f)
        demands = [int(x) for x in next(reader)[1:]]
        for row in reader:
            for d, v in zip(demands, row[1:]):
                total[(canonical_model(row[0]), d)] = float(v)
    return MeasuredData(isolated, ratio, total)


def _nnls(A: np.ndarray, y: np.ndarray) -> np.ndarray:
    from scipy.optimize import nnls

    x, _ = nnls(A, y)
    return x


def _u(gpus: int, nodes: int, eta: float) -> float:
    if gpus <= 1:
        return 0.0
    return 2.0 * (gpus - 1) / gpus * (eta if nodes == 1 else 1.0)


class ContentionModel:
    """The project's performance model (see module docstring).

    :param cluster: used for the intra/inter bandwidth ratio and link speed.
    :param data: measurements; defaults to DeepShare's.
    :param use_measured: use measured numbers where they exist (default). With
        ``False`` the model is purely parametric (used to state fit errors).
    :param contention: how the one-neighbour slowdowns combine into a job's CS, one of
        :data:`policies.ledger.CONTENTION_RULES`: ``"sum"`` (default), ``"link"`` (max-min
        sharing of each node's link, :meth:`link_terms`) or ``"ds-min"`` (DeepShare's worst pair,
        floored at ratio 0.35); the rules are written in :mod:`policies.ledger`.
    :raises ValueError: an unknown ``contention`` (one line listing the rules).
    """

    def __init__(
        self,
        cluster: ClusterSpec | None = None,
        data: MeasuredData | None = None,
        use_measured: bool = True,
        contention: str = "sum",
    ) -> None:
        #: The contention rule (:data:`policies.ledger.CONTENTION_RULES`) the ledger applies to this model.
        self.contention = check_contention(contention)
        self.cluster = cluster or ClusterSpec.homogeneous(4, 8)
        self.data = data or load_measured_data()
        self.use_measured = use_measured
        self.eta = self.cluster.bw_ratio
        self._link_mbps = self.cluster.inter_bw_gbps * 1000.0
        self.params: dict[str, tuple[float, float, float]] = {}
        self._calib: dict[tuple[str, int], float] = {}
        self._fit_isolated()
        self.kappa: dict[str, float] = {}
        self._fit_contention()
        self._iso_cache: dict[JobKey, float] = {}
        self._pair_cache: dict[tuple[JobKey, JobKey], float] = {}
        self._best_cache: dict[tuple[str, int], float] = {}
        self._factor_cache: dict[str, tuple[float, ...]] = {}  # model -> per-node factors of self.cluster
        self._speedup_cache: dict[tuple[str, int, int, float], float] = {}

    # ------------------------------------------------------------------ fitting
    def _fit_isolated(self) -> None:
        by_model: dict[str, list[tuple[int, int, float]]] = {}
        for (m, g, n), thp in self.data.isolated.items():
            by_model.setdefault(m, []).append((g, n, thp))
        for m, rows in by_model.items():
            # tau = g / thp; minimise relative error: divide each row by tau.
            A = np.array([[1.0, _u(g, n, self.eta), float(n - 1)] for g, n, _ in rows])
            tau = np.array([g / thp for g, n, thp in rows])
            coef = _nnls(A / tau[:, None], np.ones(len(rows)))
            if coef[0] <= 0:  # compute time must be positive
                coef[0] = float(tau.min()) * 1e-3
            self.params[m] = (float(coef[0]), float(coef[1]), float(coef[2]))
            ratios: dict[int, list[float]] = {}
            for g, n, thp in rows:
                ratios.setdefault(g, []).append(thp / self._parametric(m, g, n))
            for g, rs in ratios.items():
                self._calib[(m, g)] = float(np.median(rs))
        # Registered models without measurements: derive a, b from Table I.
        for name in list(_all_models()):
            if name in self.params:
                continue
            prof = get_workload(name)
            a = 1.0 / float(prof.per_gpu_throughput)
            # comm_comp is profiled on multi-node placements: b * u(8, 2) = comm_comp * a.
            b = prof.comm_comp * a / _u(8, 2, self.eta)
            self.params[name] = (a, b, 0.0)

    def _fit_contention(self) -> None:
        xs: dict[str, list[float]] = {}
        ys: dict[str, list[float]] = {}
        for (ka, kb), r in self.data.ratio.items():
            x = self._chi(ka) * self._beta(kb)
            xs.setdefault(ka[0], []).append(x)
            ys.setdefault(ka[0], []).append(1.0 / max(r, 1e-6) - 1.0)
        for m in _all_models():
            if m in xs:
                x, y = np.array(xs[m]), np.array(ys[m])
                self.kappa[m] = float(max((x * y).sum() / max((x * x).sum(), 1e-12), 0.0))
            else:
                self.kappa[m] = float(np.median(list(self.kappa.values()))) if self.kappa else 1.0

    # ------------------------------------------------------------------ pieces
    def _unfitted(self, model: str) -> UnknownModelError:
        """The error for a known model this instance has no parameters for (registered after it was built)."""
        return UnknownModelError(
            f"model {model!r} was registered after this ContentionModel was built, so it has no "
            "parameters for it; register workloads before building the ContentionModel (or build a new one)"
        )

    def _params(self, model: str) -> tuple[float, float, float]:
        p = self.params.get(model)
        if p is None:
            raise self._unfitted(model)
        return p

    def _parametric(self, model: str, gpus: int, nodes: int) -> float:
        a, b, c = self._params(model)
        tau = a + b * _u(gpus, nodes, self.eta) + c * max(nodes - 1, 0)
        return gpus / tau

    def _chi(self, key: JobKey) -> float:
        """Share of step time spent communicating (0 for a single-node job)."""
        m, g, n = key
        if n <= 1:
            return 0.0
        a, b, c = self._params(m)
        comm = b * _u(g, n, self.eta) + c * (n - 1)
        return comm / (a + comm)

    def _beta(self, key: JobKey) -> float:
        """Link load of a neighbour, as a fraction of link bandwidth."""
        m, g, n = key
        if n <= 1:
            return 0.0
        return get_workload(m).bandwidth_mbps / self._link_mbps

    # ------------------------------------------------------------------ API
    def isolated_throughput(self, model: str, gpus: int, nodes: int) -> float:
        key = (model, gpus, nodes)
        v = self._iso_cache.get(key)
        if v is None:
            m = canonical_model(model)
            if gpus < 1 or nodes < 1 or nodes > gpus:
                raise ValueError(f"impossible shape: {gpus} GPUs over {nodes} nodes")
            meas = self.data.isolated.get((m, gpus, nodes)) if self.use_measured else None
            if meas is not None:
                v = meas
            else:
                v = self._parametric(m, gpus, nodes)
                if self.use_measured:
                    v *= self._calib.get((m, gpus), 1.0)
                    if nodes == 1:  # never slower than a measured multi-node shape
                        best = max((t for (mm, g, n), t in self.data.isolated.items() if mm == m and g == gpus), default=0.0)
                        v = max(v, best)
            self._iso_cache[key] = v
        return v

    def throughput_for(self, model: str, placement: Placement) -> float:
        """:meth:`isolated_throughput` of ``placement``'s shape (reference GPUs; see :meth:`throughput`)."""
        return self.isolated_throughput(model, placement.total_gpus, placement.num_nodes)

    def throughput(
        self, job: "JobSpec | str", allocation: Allocation | Placement, cluster: ClusterSpec | None = None
    ) -> float:
        """Samples/s of ``job`` (a :class:`~policies.job.JobSpec` or a model name) alone on
        ``allocation`` (an :class:`~policies.resources.Allocation` or a :class:`Placement`) on
        ``cluster`` (None: this model's cluster).

        ``isolated(G, n)`` on a cluster without GPU types; otherwise scaled by the slowest GPU
        speed factor ``f`` over the allocation's GPU nodes (module docstring):
        ``isolated(G, n) / ((1 - s) / f + s)``.

        :raises policies.gputypes.UnknownGPUTypeError: a node's type is unknown and has no ``gpu_speed``.
        """
        model = job if isinstance(job, str) else job.model
        p = allocation.placement if isinstance(allocation, Allocation) else allocation
        iso = self.isolated_throughput(model, p.total_gpus, p.num_nodes)
        cl = self.cluster if cluster is None else cluster
        if not cl.is_typed:
            return iso
        factors = self.node_factors(model, cl)
        f = min(factors[v] for v in p.nodes)
        if f == 1.0:
            return iso
        key = (model, p.total_gpus, p.num_nodes, f)
        up = self._speedup_cache.get(key)
        if up is None:
            up = self._speedup_cache[key] = self.type_speedup(model, p.total_gpus, p.num_nodes, f)
        return iso * up

    def node_factors(self, model: str, cluster: ClusterSpec | None = None) -> tuple[float, ...]:
        """Each node's GPU speed factor for ``model`` (:func:`policies.gputypes.speed_factor`; 1.0 per
        node of a cluster without GPU types)."""
        cl = self.cluster if cluster is None else cluster
        if cl is not self.cluster:
            m = canonical_model(model)
            return tuple(speed_factor(n.gpu_type, m, n.gpu_speed) for n in cl.nodes)
        v = self._factor_cache.get(model)
        if v is None:
            m = canonical_model(model)
            v = self._factor_cache[model] = tuple(speed_factor(n.gpu_type, m, n.gpu_speed) for n in cl.nodes)
        return v

    def comm_share(self, model: str, gpus: int, nodes: int) -> float:
        """Share of a step spent communicating at the reference speed, from the fitted ``a, b, c``:
        ``(b u(G, n) + c (n - 1)) / tau(G, n)`` (intra-node all-reduce included; 0 for one GPU)."""
        a, b, c = self._params(canonical_model(model))
        comm = b * _u(gpus, nodes, self.eta) + c * max(nodes - 1, 0)
        return comm / (a + comm)

    def type_speedup(self, model: str, gpus: int, nodes: int, f: float) -> float:
        """Throughput multiplier of GPUs ``f`` times as fast as the reference: compute time / f."""
        s = self.comm_share(model, gpus, nodes)
        return 1.0 / ((1.0 - s) / f + s)

    def pair_cs(self, a: JobKey, b: JobKey) -> float:
        key = (a, b)
        v = self._pair_cache.get(key)
        if v is None:
            if a[2] <= 1 or b[2] <= 1:
                v = 1.0
            else:
                ca = (canonical_model(a[0]), a[1], a[2])
                cb = (canonical_model(b[0]), b[1], b[2])
                r = self.data.ratio.get((ca, cb)) if self.use_measured else None
                if r is not None:
                    v = 1.0 / max(r, MIN_RATIO)
                else:
                    kappa = self.kappa.get(ca[0])
                    if kappa is None:
                        raise self._unfitted(ca[0])
                    v = 1.0 + kappa * self._chi(ca) * self._beta(cb)
            self._pair_cache[key] = v
        return v

    def best_isolated_throughput(self, model: str, gpus: int) -> float:
        """Fastest isolated samples/s of ``gpus`` GPUs over the placements this model's cluster allows.

        Without GPU types: the best node count (:func:`feasible_node_counts`). With them, the best
        over speed levels: for each factor ``f`` of some node, the best node count on the nodes of
        factor ``>= f``, priced at ``f`` (the pace of the slowest GPU); the fastest type that can
        hold the job is one of these levels, so the result is at least its best shape's throughput.
        """
        key = (model, gpus)
        v = self._best_cache.get(key)
        if v is None:
            cl = self.cluster
            counts = feasible_node_counts(cl, gpus)  # raises when the job does not fit at all
            if cl.is_typed:
                v = self._best_typed(model, gpus, cl)
            else:
                v = max(self.isolated_throughput(model, gpus, n) for n in counts)
            self._best_cache[key] = v
        return v

    def _best_typed(self, model: str, gpus: int, cl: ClusterSpec) -> float:
        factors = self.node_factors(model, cl)
        m = canonical_model(model)
        best = 0.0
        for f in sorted(set(factors), reverse=True):
            caps = [g for g, fv in zip(cl.gpus_per_node, factors) if fv >= f]
            for n in _feasible_counts(caps, gpus):
                thp = self.isolated_throughput(model, gpus, n)
                if f != 1.0:
                    thp *= self.type_speedup(m, gpus, n, f)
                best = max(best, thp)
        return best

    def job_cs(self, me: JobKey, my_nodes: Iterable[int], neighbours_by_node: Mapping[int, Sequence[JobKey]]) -> float:
        """CS of a job on ``my_nodes`` given the other jobs on each node (>= 1): :func:`policies.ledger.job_cs`."""
        return _job_cs(self, me, (neighbours_by_node.get(v, ()) for v in my_nodes))

    def node_cs(self, me: JobKey, others: Iterable[JobKey]) -> float:
        """Uncapped CS of a job on one node shared with ``others``: :func:`policies.ledger.node_cs`."""
        return _node_cs(self, me, others)

    # ------------------------------------------------------------------ reporting
    def fit_report(self) -> dict:
        """Fit errors of the parametric parts against the measured tables."""
        iso_err = []
        for (m, g, n), thp in self.data.isolated.items():
            iso_err.append(abs(self._parametric(m, g, n) - thp) / thp)
        cs_err = []
        for (ka, kb), r in self.data.ratio.items():
            pred = 1.0 / (1.0 + self.kappa[ka[0]] * self._chi(ka) * self._beta(kb))
            cs_err.append(abs(pred - r))
        return {
            "contention": self.contention,
            "isolated_mape": float(np.mean(iso_err)),
            "isolated_max_rel_err": float(np.max(iso_err)),
            "ratio_mae": float(np.mean(cs_err)),
            "ratio_max_abs_err": float(np.max(cs_err)),
            "params": {m: dict(zip(("a", "b", "c"), p)) for m, p in self.params.items()},
            "kappa": dict(self.kappa),
        }


def _all_models() -> list[str]:
    from policies.workloads import known_models

    return known_models()


def feasible_node_counts(cluster: ClusterSpec, gpus: int) -> list[int]:
    """Node counts ``n`` on which ``gpus`` GPUs can be placed at all on this cluster.

    ``n`` is feasible when the ``n`` largest nodes hold at least ``gpus`` GPUs
    and ``n <= gpus`` (every node used gets at least one GPU).
    """
    out = _feasible_counts(cluster.gpus_per_node, gpus)
    if not out:
        raise ValueError(f"{gpus} GPUs do not fit on cluster {cluster.describe()} ({cluster.total_gpus} GPUs)")
    return out


def _feasible_counts(gpus_per_node: Sequence[int], gpus: int) -> list[int]:
    """Node counts ``n <= gpus`` whose ``n`` largest nodes of ``gpus_per_node`` hold ``gpus`` GPUs."""
    caps = sorted(gpus_per_node, reverse=True)
    out = []
    total = 0
    for n in range(1, min(gpus, len(caps)) + 1):
        total += caps[n - 1]
        if total >= gpus:
            out.append(n)
    return out


def estimate_eta(paths: Iterable[str | Path]) -> dict[str, float]:
    """Estimate ``eta`` (intra-node cost / inter-node cost of communication)
    from AdaptDL-style placement measurements.

    Each CSV (e.g. ``data/adaptdl-placements/*.csv``) has columns
    ``placement`` (one digit per node: GPUs used there, e.g. ``"22"`` = 2
    nodes x 2 GPUs) and ``sync_time`` (s of gradient synchronisation per
    step). In our model the communication time of ``G`` GPUs is
    ``b u(G, 1) = b 2 (G-1)/G eta`` on one node and ``b 2 (G-1)/G`` (plus the
    per-node term ``c (n-1)``, neglected here) on several, so for every ``G``
    measured both ways::

        eta_G = median sync_time(one node, G) / median sync_time(several nodes, G)

    :returns: ``{file stem: median over G of eta_G}`` plus ``"all"``, the
        median over files. Files with no ``G`` measured both ways are left out.
    :raises ValueError: naming the file (and row) of a malformed input.
    """
    out: dict[str, float] = {}
    for path in paths:
        path = Path(path)
        single: dict[int, list[float]] = {}
        multi: dict[int, list[float]] = {}
        try:
            f = path.open(newline="", encoding="utf-8-sig")
        except OSError as exc:
            raise ValueError(f"{path}: cannot open: {exc.strerror}") from exc
        with f:
            reader = csv.DictReader(f)
            missing = {"placement", "sync_time"} - set(reader.fieldnames or [])
            if missing:
                raise ValueError(f"{path}: missing column(s) {', '.join(sorted(missing))}")
            for row_no, row in enumerate(reader, start=2):
                pl = (row["placement"] or "").strip()
                if not pl.isdigit():
                    raise ValueError(f"{path}, row {row_no}, field 'placement': expected digits, got {pl!r}")
                try:
                    sync = float(row["sync_time"])
                except (TypeError, ValueError):
                    raise ValueError(
                        f"{path}, row {row_no}, field 'sync_time': expected a number, got {row['sync_time']!r}"
                    ) from None
                per_node = [int(ch) for ch in pl if ch != "0"]
                gpus, nodes = sum(per_node), len(per_node)
                if gpus < 2 or not math.isfinite(sync) or sync <= 0:
                    continue
                (single if nodes == 1 else multi).setdefault(gpus, []).append(sync)
        ratios = [
            float(np.median(single[g]) / np.median(multi[g])) for g in sorted(single) if g in multi
        ]
        if ratios:
            out[path.stem] = float(np.median(ratios))
    if out:
        out["all"] = float(np.median(list(out.values())))
    return out
