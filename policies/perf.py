"""Performance model: how fast a job trains on a placement, alone and shared.

The model has two parts (equations and fit errors in ``docs/PERFORMANCE_MODEL.md``).

**Isolated throughput.** A data-parallel job of ``G`` GPUs spread over ``n``
nodes spends, per sample and GPU, a compute time ``a`` plus communication::

    tau(G, n) = a + b * u(G, n) + c * (n - 1)       [seconds per sample per GPU]
    u(G, n)   = 2 (G - 1) / G * (eta if n == 1 else 1)
    throughput(G, n) = G / tau(G, n)                  [samples / s]

``u`` is the ring all-reduce volume factor; ``eta`` = inter-node / intra-node
bandwidth (5 / 16 on the seed's testbed) makes a single-node job's
communication cheaper (``ContentionModel(intra="adaptdl")``: a factor per model
family calibrated from AdaptDL's placement measurements instead, see
:func:`calibrate_intra`); ``c`` prices every extra node a job spans (latency,
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
(:meth:`ContentionModel.pair_cs`) and a job's link terms (:meth:`ContentionModel.link_terms`:
bandwidth demand ``d = sigma_m * bandwidth_m * G / n`` MB/s per node, ``sigma_m`` fitted by
:func:`fit_link_demand`, and communication share); :mod:`policies.ledger` combines them into a
job's ``CS(A)`` by the model's ``contention`` rule (``sum``: pairwise excesses summed on a node,
worst node, capped at ``1 / MIN_RATIO``; ``ds-min``: DeepShare's worst pair, floored at ratio
0.35; ``link``: max-min fair sharing of each node's link capacity, only communication stretching)
and keeps it per running job. :func:`neighbours_table` gives what the rules predict for several
identical neighbours.

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
from policies.ledger import CONTENTION_RULES, MIN_RATIO, JobKey, check_contention
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
    "LinkFit",
    "TESTBED_LINK_MBPS",
    "fit_link_demand",
    "neighbours_table",
    "neighbours_markdown",
    "link_fit_markdown",
    "calibrate_intra",
    "ADAPTDL_ETA",
    "ADAPTDL_FAMILY",
    "INTRA_CHOICES",
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


#: Intra-node factor ``eta`` of each AdaptDL model (file stem of ``data/adaptdl-placements/``):
#: ``(calibrated, low, high)``. Calibrated: from throughput at equal GPU count and local batch size,
#: one node against two (:func:`calibrate_intra`, ``"eta"``); low / high: the smallest and largest of
#: its per-GPU-count values and of the sync-time estimate (``"low"``, ``"high"``). Pinned here
#: (``policies/`` reads no files at run time); ``tests/test_perf.py`` recomputes them from the CSVs.
ADAPTDL_ETA: dict[str, tuple[float, float, float]] = {
    "bert": (0.0797, 0.0698, 0.0924),
    "cifar10": (0.2476, 0.1663, 0.8164),
    "deepspeech2": (0.3522, 0.3121, 0.3760),
    "imagenet": (0.0703, 0.0360, 0.1697),
    "ncf": (0.2579, 0.2121, 0.2583),
    "yolov3": (0.1812, 0.0462, 0.2011),
}

#: The AdaptDL model whose intra-node factor each of our families takes (``docs/PERFORMANCE_MODEL.md``,
#: "Single-node speeds from AdaptDL"): the closest gradient volume and communication pattern.
ADAPTDL_FAMILY: dict[str, str] = {
    "GraphSage": "ncf",
    "MobileNetV3": "cifar10",
    "DLRM": "ncf",
    "Transformer-XL": "bert",
    "FSDP": "bert",
    "MoE": "bert",
}

#: Named choices of ``ContentionModel(intra=...)``.
INTRA_CHOICES = ("bandwidth", "adaptdl", "adaptdl-low", "adaptdl-high")


def _intra_etas(intra: "str | float | Mapping[str, float]", default: float) -> dict[str, float]:
    """Per-model ``eta`` for ``intra`` (see :class:`ContentionModel`); models left out use ``default``."""
    if isinstance(intra, str):
        if intra not in INTRA_CHOICES:
            raise ValueError(f"intra must be one of {', '.join(INTRA_CHOICES)}, a number or a mapping, got {intra!r}")
        if intra == "bandwidth":
            return {}
        col = {"adaptdl": 0, "adaptdl-low": 1, "adaptdl-high": 2}[intra]
        return {m: ADAPTDL_ETA[f][col] for m, f in ADAPTDL_FAMILY.items()}
    if isinstance(intra, Mapping):
        out = {}
        for m, v in intra.items():
            out[canonical_model(m)] = _check_eta(v)
        return out
    v = _check_eta(intra)
    return {m: v for m in _all_models()}


def _check_eta(v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 0.0 <= v <= 1.0:
        raise ValueError(f"intra-node factor must be a number in [0, 1], got {v!r}")
    return float(v)


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
    :param intra: the intra-node factor ``eta`` of the single-node all-reduce term, per model:
        ``"bandwidth"`` (default): the cluster's ``inter_bw / intra_bw`` for every model;
        ``"adaptdl"``: each family's factor calibrated from AdaptDL's placement measurements
        (:data:`ADAPTDL_FAMILY`, :data:`ADAPTDL_ETA`; ``"adaptdl-low"`` / ``"adaptdl-high"``: the
        ends of its range); a number in ``[0, 1]``: that factor for every model; a mapping
        ``{model: factor}``: those models (others: the bandwidth ratio). It changes single-node
        predictions only (no multi-node shape uses it, and none was measured on one node).
    :raises ValueError: an unknown ``contention`` (one line listing the rules).
    """

    def __init__(
        self,
        cluster: ClusterSpec | None = None,
        data: MeasuredData | None = None,
        use_measured: bool = True,
        contention: str = "sum",
        intra: "str | float | Mapping[str, float]" = "bandwidth",
    ) -> None:
        #: The contention rule (:data:`policies.ledger.CONTENTION_RULES`) the ledger applies to this model.
        self.contention = check_contention(contention)
        self.cluster = cluster or ClusterSpec.homogeneous(4, 8)
        self.data = data or load_measured_data()
        self.use_measured = use_measured
        self.eta = self.cluster.bw_ratio
        self.intra = intra
        #: per-model intra-node factor where it differs from :attr:`eta` (``intra``)
        self.eta_by_model: dict[str, float] = _intra_etas(intra, self.eta)
        self._link_mbps = self.cluster.inter_bw_gbps * 1000.0
        self.params: dict[str, tuple[float, float, float]] = {}
        self._calib: dict[tuple[str, int], float] = {}
        self._fit_isolated()
        self.kappa: dict[str, float] = {}
        self._fit_contention()
        self._iso_cache: dict[JobKey, float] = {}
        self._pair_cache: dict[tuple[JobKey, JobKey], float] = {}
        self._link_cache: dict[JobKey, tuple[float, float]] = {}
        self._link_fit: LinkFit | None = None
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

    def eta_for(self, model: str) -> float:
        """The intra-node factor of ``model`` (``intra``; the cluster's bandwidth ratio by default)."""
        return self.eta_by_model.get(canonical_model(model), self.eta)

    def _parametric(self, model: str, gpus: int, nodes: int) -> float:
        a, b, c = self._params(model)
        eta = self.eta_by_model.get(model, self.eta) if nodes == 1 else self.eta
        tau = a + b * _u(gpus, nodes, eta) + c * max(nodes - 1, 0)
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
        m = canonical_model(model)
        a, b, c = self._params(m)
        eta = self.eta_by_model.get(m, self.eta) if nodes == 1 else self.eta
        comm = b * _u(gpus, nodes, eta) + c * max(nodes - 1, 0)
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

    # ------------------------------------------------------------------ the link rule's terms
    @property
    def link_capacity_mbps(self) -> float:
        """Capacity ``C`` of one node's network link (MB/s): the cluster's ``inter_bw_gbps`` x 1000."""
        return self._link_mbps

    def link_fit(self) -> "LinkFit":
        """The ``link`` rule's calibration (:func:`fit_link_demand` on this model's data and
        communication shares), computed on first use and shared by the models of the same data and
        fitted ``a, b, c`` (e.g. every cluster of the same ``eta``)."""
        f = self._link_fit
        if f is None:
            key = (id(self.data), tuple(sorted(self.params.items())))
            hit = _LINK_FITS.get(key)
            if hit is not None and hit[0] is self.data:
                f = hit[1]
            else:
                f = fit_link_demand(self)
                if len(_LINK_FITS) >= 8:
                    _LINK_FITS.clear()
                _LINK_FITS[key] = (self.data, f)
            self._link_fit = f
        return f

    def link_terms(self, key: JobKey) -> tuple[float, float]:
        """``(d, chi)`` of job ``key = (model, G, n)`` for the ``link`` rule: its bandwidth demand on
        each of its nodes' links, ``d = sigma_model * bandwidth_model * G / n`` (MB/s; Table I
        bandwidth, ``sigma`` fitted by :func:`fit_link_demand`), and its communication share
        ``chi = comm_share(model, G, n)``; ``(0, 0)`` for a single-node job."""
        v = self._link_cache.get(key)
        if v is None:
            m, g, n = canonical_model(key[0]), key[1], key[2]
            if n <= 1:
                v = (0.0, 0.0)
            else:
                sigma = self.link_fit().sigma.get(m)
                if sigma is None:
                    if m not in self.params:
                        raise self._unfitted(m)
                    sigma = self.link_fit().default_sigma
                v = (sigma * get_workload(m).bandwidth_mbps * g / n, self.comm_share(m, g, n))
            self._link_cache[key] = v
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
            **({"link": self.link_fit().as_dict()} if self.contention == "link" else {}),
        }


#: Capacity of one node's network link on the seed's testbed (MB/s: 40 Gbps InfiniBand = 5 GB/s), where
#: the pair table was measured: the ``link`` rule is calibrated at this capacity.
TESTBED_LINK_MBPS = 5000.0

#: Calibrations of the ``link`` rule by (data, fitted parameters): ``(data, fit)``, the data kept so that
#: its id stays its own.
_LINK_FITS: dict[tuple, tuple["MeasuredData", "LinkFit"]] = {}

#: Grid of ``log(sigma)`` searched by :func:`fit_link_demand` (sigma from 0.05 to 1,097).
_LOG_SIGMA_GRID = np.linspace(-3.0, 7.0, 401)


@dataclass(frozen=True)
class LinkFit:
    """The ``link`` rule's calibration against the one-neighbour table (:func:`fit_link_demand`).

    :param sigma: per measured model, the demand scale: a job's demand on a node's link is
        ``sigma * Table I bandwidth * (GPUs on the node)`` MB/s.
    :param default_sigma: the median of ``sigma``, for models without measurements.
    :param capacity_mbps: link capacity the table was measured (and the fit made) at.
    :param mae, rmse, max_abs_err: error of the predicted achieved / isolated ratio of the row job
        over the table's pairs; ``worst``: the pair with the largest error.
    :param per_model_mae: ``mae`` over the rows of each model.
    :param sum_mae, sum_rmse, sum_max_abs_err: the same errors of the ``sum`` rule's parametric
        one-neighbour CS (``1 + kappa chi beta``; measured pairs themselves are used as measured).
    :param pairs: number of pairs fitted.
    """

    sigma: dict[str, float]
    default_sigma: float
    capacity_mbps: float
    mae: float
    rmse: float
    max_abs_err: float
    worst: tuple[JobKey, JobKey]
    per_model_mae: dict[str, float]
    sum_mae: float
    sum_rmse: float
    sum_max_abs_err: float
    pairs: int

    def as_dict(self) -> dict:
        """A JSON-ready copy (keys of ``worst`` as lists)."""
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["sigma"], d["per_model_mae"] = dict(self.sigma), dict(self.per_model_mae)
        d["worst"] = [list(self.worst[0]), list(self.worst[1])]
        return d


def _two_flow_ratio(sa: np.ndarray, sb: np.ndarray, bw_a: np.ndarray, bw_b: np.ndarray, chi_a: np.ndarray,
                    cap: float) -> np.ndarray:
    """Achieved / isolated of job A beside one job B under the ``link`` rule, elementwise: demands
    ``da = sa bw_a``, ``db = sb bw_b``; A's max-min share ``x`` of ``cap``;
    ``1 / (1 + chi_a (min(da, cap) / x - 1))``."""
    da, db = sa * bw_a, sb * bw_b
    x = np.where(da + db <= cap, da, np.where(db < cap / 2, np.minimum(da, cap - db), np.minimum(da, cap / 2)))
    alone = np.minimum(da, cap)
    return 1.0 / (1.0 + chi_a * (alone / x - 1.0))


def fit_link_demand(model: "ContentionModel", capacity_mbps: float = TESTBED_LINK_MBPS) -> LinkFit:
    """Calibrate the ``link`` rule's per-model demand scales ``sigma`` to the measured pair table.

    For every measured pair ``(A, B)`` (one neighbour, sharing a node's link of ``capacity_mbps``)
    the rule predicts A's achieved / isolated ratio from the demands ``d = sigma_m * bandwidth_m *
    G / n`` and A's communication share ``chi_A = model.comm_share(A)`` (:func:`policies.ledger.node_cs`,
    ``link``). ``sigma`` minimises the sum of squared ratio errors by coordinate search over
    ``log sigma`` in [-3, 7] (401 grid points; sweeps over the models until none moves, from sigma = 1):
    the objective is piecewise smooth with flat parts (a demand above the capacity is the capacity
    alone), where gradient methods stop early. The link capacity and the scales are one degree of
    freedom (scaling both changes nothing), so the capacity is held at the testbed's.
    """
    data = model.data
    pairs = [(a, b, r) for (a, b), r in sorted(data.ratio.items()) if a[2] > 1 and b[2] > 1]
    models = sorted({a[0] for a, _b, _r in pairs} | {b[0] for _a, b, _r in pairs})
    idx = {m: i for i, m in enumerate(models)}
    ia = np.array([idx[a[0]] for a, _b, _r in pairs])
    ib = np.array([idx[b[0]] for _a, b, _r in pairs])
    bw_a = np.array([get_workload(a[0]).bandwidth_mbps * a[1] / a[2] for a, _b, _r in pairs])
    bw_b = np.array([get_workload(b[0]).bandwidth_mbps * b[1] / b[2] for _a, b, _r in pairs])
    chi_a = np.array([model.comm_share(*a) for a, _b, _r in pairs])
    ratio = np.array([r for _a, _b, r in pairs])
    x = np.zeros(len(models))
    grid = _LOG_SIGMA_GRID
    eg = np.exp(grid)[:, None]
    for _sweep in range(50):
        moved = False
        for j in range(len(models)):
            s = np.exp(x)
            c = (ia == j) | (ib == j)  # the pairs sigma_j enters: the rest of the sum does not move
            sa = np.where(ia[c] == j, eg, s[ia[c]][None, :])
            sb = np.where(ib[c] == j, eg, s[ib[c]][None, :])
            sse = ((_two_flow_ratio(sa, sb, bw_a[c], bw_b[c], chi_a[c], capacity_mbps) - ratio[c]) ** 2).sum(axis=1)
            k = int(np.argmin(sse))  # the first of equal minima
            cur = _two_flow_ratio(s[ia[c]], s[ib[c]], bw_a[c], bw_b[c], chi_a[c], capacity_mbps)
            now = ((cur - ratio[c]) ** 2).sum()
            if grid[k] != x[j] and sse[k] < now:
                x[j] = grid[k]
                moved = True
        if not moved:
            break
    s = np.exp(x)
    err = np.abs(_two_flow_ratio(s[ia], s[ib], bw_a, bw_b, chi_a, capacity_mbps) - ratio)
    kappa_err = np.array([abs(1.0 / (1.0 + model.kappa[a[0]] * model._chi(a) * model._beta(b)) - r)
                          for a, b, r in pairs])
    w = int(np.argmax(err))
    sigma = {m: float(s[i]) for i, m in enumerate(models)}
    return LinkFit(
        sigma=sigma,
        default_sigma=float(np.median(list(sigma.values()))),
        capacity_mbps=float(capacity_mbps),
        mae=float(err.mean()),
        rmse=float(np.sqrt((err ** 2).mean())),
        max_abs_err=float(err.max()),
        worst=(pairs[w][0], pairs[w][1]),
        per_model_mae={m: float(err[ia == i].mean()) for i, m in enumerate(models)},
        sum_mae=float(kappa_err.mean()),
        sum_rmse=float(np.sqrt((kappa_err ** 2).mean())),
        sum_max_abs_err=float(kappa_err.max()),
        pairs=len(pairs),
    )


def neighbours_table(gpus: int = 4, nodes: int = 4, ks: Sequence[int] = (1, 2, 3, 4),
                     cluster: ClusterSpec | None = None) -> list[tuple[str, str, list[float]]]:
    """CS of a job ``(model, gpus, nodes)`` with ``k`` identical neighbours on each of its nodes, for
    every measured model, every rule of :data:`~policies.ledger.CONTENTION_RULES` and every ``k`` in
    ``ks``: rows ``(model, rule, [CS at each k])`` (model in measured order, rules in
    :data:`~policies.ledger.CONTENTION_RULES` order). ``cluster``: the link capacity (default: the testbed's 4 x 8)."""
    from policies.ledger import job_cs

    cl = cluster or ClusterSpec.homogeneous(4, 8)
    data = load_measured_data()
    perfs = {rule: ContentionModel(cl, data, contention=rule) for rule in CONTENTION_RULES}
    models = list(dict.fromkeys(k[0] for k in data.isolated))
    rows = []
    for m in models:
        me = (m, gpus, nodes)
        for rule, perf in perfs.items():
            rows.append((m, rule, [job_cs(perf, me, [[me] * k]) for k in ks]))
    return rows


def link_fit_markdown() -> str:
    """The ``link`` rule's calibration (:func:`fit_link_demand` of the default model) as the Markdown
    table ``docs/PERFORMANCE_MODEL.md`` quotes: per model, ``sigma``, the demand of a ``(G, n) = (8, 2)``
    job (MB/s on each node's link), its communication share there, and the ratio MAE of the ``link``
    rule and of the ``sum`` rule's parametric pair rule over the model's rows; then all rows."""
    m = ContentionModel()
    fit = m.link_fit()
    sums: dict[str, list[float]] = {}
    for (a, b), r in m.data.ratio.items():
        sums.setdefault(a[0], []).append(abs(1.0 / (1.0 + m.kappa[a[0]] * m._chi(a) * m._beta(b)) - r))
    lines = [
        "| model | sigma | demand at (8, 2) (MB/s) | chi at (8, 2) | ratio MAE, link | ratio MAE, sum (parametric) |",
        "|---|---|---|---|---|---|",
    ]
    for name in dict.fromkeys(k[0] for k in m.data.isolated):
        d, chi = m.link_terms((name, 8, 2))
        lines.append(f"| {name} | {fit.sigma[name]:.3g} | {d:.0f} | {chi:.3f} | {fit.per_model_mae[name]:.3f} "
                     f"| {float(np.mean(sums[name])):.3f} |")
    w = fit.worst
    lines.append(f"| all ({fit.pairs} pairs) | | | | {fit.mae:.3f} (RMSE {fit.rmse:.3f}, worst {fit.max_abs_err:.3f}) "
                 f"| {fit.sum_mae:.3f} (RMSE {fit.sum_rmse:.3f}, worst {fit.sum_max_abs_err:.3f}) |")
    lines.append("")
    lines.append(f"Link capacity {fit.capacity_mbps:.0f} MB/s; worst link pair: {w[0]} beside {w[1]}.")
    return "\n".join(lines)


def neighbours_markdown(gpus: int = 4, nodes: int = 4, ks: Sequence[int] = (1, 2, 3, 4)) -> str:
    """:func:`neighbours_table` as the Markdown table ``docs/PERFORMANCE_MODEL.md`` quotes (CS to 3 decimals)."""
    lines = [
        "| model | rule | " + " | ".join(f"k = {k}" for k in ks) + " |",
        "|---|---|" + "---|" * len(ks),
    ]
    for m, rule, cs in neighbours_table(gpus, nodes, ks):
        lines.append(f"| {m} | {rule} | " + " | ".join(f"{c:.3f}" for c in cs) + " |")
    return "\n".join(lines)


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
        for per_node, (sync,) in _placement_csv(path, ("sync_time",)):
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


def _placement_csv(path: Path, columns: tuple[str, ...]) -> list[tuple[list[int], list[float]]]:
    """Rows of an AdaptDL placements CSV: the GPUs per used node (``placement``, one digit per node,
    nodes with 0 left out) and the float values of ``columns``, in file order.
    :raises ValueError: naming the file (and row and field) of a malformed input."""
    try:
        f = path.open(newline="", encoding="utf-8-sig")
    except OSError as exc:
        raise ValueError(f"{path}: cannot open: {exc.strerror}") from exc
    out = []
    with f:
        reader = csv.DictReader(f)
        missing = {"placement", *columns} - set(reader.fieldnames or [])
        if missing:
            raise ValueError(f"{path}: missing column(s) {', '.join(sorted(missing))}")
        for row_no, row in enumerate(reader, start=2):
            pl = (row["placement"] or "").strip()
            if not pl.isdigit():
                raise ValueError(f"{path}, row {row_no}, field 'placement': expected digits, got {pl!r}")
            vals = []
            for col in columns:
                try:
                    vals.append(float(row[col]))
                except (TypeError, ValueError):
                    raise ValueError(
                        f"{path}, row {row_no}, field {col!r}: expected a number, got {row[col]!r}"
                    ) from None
            out.append(([int(ch) for ch in pl if ch != "0"], vals))
    return out


def _read_placement_rows(path: Path) -> list[tuple[int, int, int, float, float]]:
    """``(gpus, nodes, local_bsz, step_time, sync_time)`` of each row of an AdaptDL placements CSV
    (columns ``placement``, ``local_bsz``, ``step_time``, ``sync_time``); rows with a non-positive or
    non-finite time are left out. :raises ValueError: naming the file (and row) of a malformed input."""
    out = []
    for per_node, vals in _placement_csv(path, ("local_bsz", "step_time", "sync_time")):
        if not per_node or not all(math.isfinite(v) and v > 0 for v in vals):
            continue
        bsz, step, sync = vals
        out.append((sum(per_node), len(per_node), int(bsz), step, sync))
    return out


def calibrate_intra(paths: Iterable[str | Path]) -> dict[str, dict]:
    """Calibrate the intra-node factor ``eta`` from AdaptDL placement measurements
    (``data/adaptdl-placements/*.csv``: ``placement``, ``local_bsz``, ``step_time`` and ``sync_time``
    in seconds per step; see ``data/NOTICE.md``).

    For each GPU count ``G`` measured on one node and on two nodes (2, 3, 4) and each local batch
    size measured both ways, with median step times ``s1`` (one node), ``s2`` (two nodes) and the
    two-node median sync time ``y2``, the two-node compute time is ``s2 - y2`` and the one-node
    communication time ``s1 - (s2 - y2)``, so::

        eta_G,b = (s1 - s2 + y2) / y2 = 1 - (s2 - s1) / y2        [clipped to [0, 1]]

    the share of the two-node communication time that a one-node placement still pays, read from
    throughput (``G * local_bsz / step_time``) at equal GPU count. In our model
    ``tau(G, 1) = a + b u(G, 2) eta``, so this is the model's ``eta`` where ``c`` is small.

    :returns: per file stem: ``eta`` (median over ``G`` of the median over batch sizes), ``per_g``
        ``{G: value}``, ``sync`` (the same with the sync-time ratio ``y1 / y2``), ``thp_ratio``
        ``{G: median one-node / two-node throughput}``, ``low`` / ``high`` (smallest / largest of
        the ``per_g`` values and ``sync``). Files without a ``G`` measured both ways are left out.
    """
    out: dict[str, dict] = {}
    for path in paths:
        path = Path(path)
        cells: dict[tuple[int, int, int], list[tuple[float, float]]] = {}
        for g, n, bsz, step, sync in _read_placement_rows(path):
            cells.setdefault((g, n, bsz), []).append((step, sync))
        med = {k: (float(np.median([s for s, _ in v])), float(np.median([y for _, y in v]))) for k, v in cells.items()}
        per_g: dict[int, float] = {}
        sync_g: dict[int, float] = {}
        thp_g: dict[int, float] = {}
        for g in sorted({k[0] for k in med if k[1] == 1 and k[0] >= 2}):
            e_step, e_sync, ratio = [], [], []
            for (gg, n, bsz), (s1, y1) in med.items():
                if gg != g or n != 1 or (g, 2, bsz) not in med:
                    continue
                s2, y2 = med[(g, 2, bsz)]
                e_step.append(min(max(1.0 - (s2 - s1) / y2, 0.0), 1.0))
                e_sync.append(y1 / y2)
                ratio.append(s2 / s1)
            if e_step:
                per_g[g] = float(np.median(e_step))
                sync_g[g] = float(np.median(e_sync))
                thp_g[g] = float(np.median(ratio))
        if not per_g:
            continue
        eta = float(np.median(list(per_g.values())))
        sync = float(np.median(list(sync_g.values())))
        vals = list(per_g.values()) + [sync]
        out[path.stem] = {"eta": eta, "per_g": per_g, "sync": sync, "thp_ratio": thp_g,
                          "low": float(min(vals)), "high": float(max(vals))}
    return out
