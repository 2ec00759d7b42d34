"""Parameter-server speed model: how fast a PS job trains with ``w`` workers and ``p`` parameter servers.

**Form (Optimus, Peng et al., EuroSys 2018, synchronous training).** One training step of a job
with a fixed global batch ``M`` split over ``w`` workers costs the forward / backward computation of
``M / w`` samples on each worker, a constant per-step overhead, the push / pull of the gradients and
parameters through ``p`` parameter servers (each serves ``1 / p`` of the model to all ``w``
workers: ``w / p``), and the per-worker and per-PS costs of keeping them in step::

    tau(w, p) = t0 * (1 / w) + t1 + t2 * (w / p) + t3 * w + t4 * p     [seconds per unit of speed]
    speed(w, p) = 1 / tau(w, p)                                         t0..t4 >= 0

(``M`` is constant per model, so it is folded into ``t0``.) ``tau`` is convex in ``p`` for a fixed
``w`` and in ``w`` for a fixed ``p``, so the speed is unimodal along either axis: it rises while
more PSs (workers) cut the communication (computation) more than their own cost, then falls.

**Data.** Fitted per model by non-negative least squares on relative error (each row divided by
its measured ``tau``) to DL2's testbed measurements (Peng et al., the DL2 authors' public
repository, file ``config_speed.txt``; ``policies/data/NOTICE.md``): every model of DL2's Table 1
(ResNet-50, VGG-16, ResNeXt-110, Inception-BN, Seq2Seq, CTC, DSSM, WLM) over a grid of 1-23 PSs and
1-23 workers, each worker one GTX 1080Ti. ``speed`` is the job's speed as DL2's simulator uses it
(the sum of its workers' logged speeds); a job trains one epoch per ``epoch_size`` units of speed
times seconds (DL2's downscaled datasets, :data:`EPOCH_SIZE`). Measurements of 0 (runs that
failed) are left out. The fit errors are in ``docs/ELASTIC.md`` (:func:`fit_report`).

**Measured speed.** The simulator runs PS jobs at :meth:`PSSpeedModel.measured_speed`: the
measurement at a measured ``(w, p)``, elsewhere the fit times the measured / fitted ratio
interpolated linearly between the measured points (nearest point outside their hull), so the
fitted form shapes only what lies between and beyond the measurements.

Pure: reads the packaged CSV once, no other I/O.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import TYPE_CHECKING, Mapping

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from policies.cluster import ClusterSpec, Placement
    from policies.job import JobSpec
    from policies.ledger import JobKey
    from policies.perf import ContentionModel

__all__ = [
    "PS_MODELS",
    "EPOCH_SIZE",
    "MAX_PS",
    "PSSpeedModel",
    "PSPerformanceModel",
    "canonical_ps_model",
    "is_ps_model",
    "load_ps_measurements",
    "fit_ps_models",
    "fit_report",
]

#: The parameter-server models of the seeds (DL2's Table 1), canonical names.
PS_MODELS = ("ResNet-50", "VGG-16", "ResNeXt-110", "Inception-BN", "Seq2Seq", "CTC", "DSSM", "WLM")

#: Units of speed x seconds per training epoch of each model (DL2's downscaled datasets, from the
#: authors' simulator: ``epoch_sizes`` in ``trace.py``).
EPOCH_SIZE: Mapping[str, float] = {
    "ResNet-50": 115.0, "VGG-16": 115.0, "ResNeXt-110": 390.0, "Inception-BN": 120.0,
    "Seq2Seq": 780.0, "CTC": 193.0, "DSSM": 349.0, "WLM": 165.0,
}

#: Most parameter servers the speed model is asked about (the measured grid's largest count).
MAX_PS = 23

_ALIASES = {m.lower(): m for m in PS_MODELS}
_ALIASES.update({
    "resnet50": "ResNet-50", "vgg16": "VGG-16", "resnext110": "ResNeXt-110", "inceptionbn": "Inception-BN",
    "inception": "Inception-BN", "cnn-text-classification": "CTC", "seq2seq": "Seq2Seq",
})


def canonical_ps_model(name: str) -> str | None:
    """The canonical name of a parameter-server model (case-insensitive, DL2's spellings accepted),
    or None when ``name`` is not one."""
    if not isinstance(name, str):
        return None
    return _ALIASES.get(name.strip().lower())


def is_ps_model(name: str) -> bool:
    """Whether ``name`` is one of :data:`PS_MODELS` (any accepted spelling)."""
    return canonical_ps_model(name) is not None


@lru_cache(maxsize=1)
def load_ps_measurements() -> dict[str, list[tuple[int, int, float]]]:
    """DL2's measurements: model -> ``[(ps, workers, speed)]`` (speed 0 rows kept; the fit skips them)."""
    out: dict[str, list[tuple[int, int, float]]] = {m: [] for m in PS_MODELS}
    path = resources.files("policies") / "data" / "dl2" / "ps_speed.csv"
    with path.open(encoding="utf-8") as f:
        for row in csv.DictReader(f):
            out[row["model"]].append((int(row["ps"]), int(row["workers"]), float(row["speed"])))
    return out


def _features(w: float, p: float) -> list[float]:
    return [1.0 / w, 1.0, w / p, w, p]


@dataclass(frozen=True)
class PSSpeedModel:
    """The fitted speed model of one model: ``speed(w, p) = 1 / (t0/w + t1 + t2 w/p + t3 w + t4 p)``.

    :param model: canonical name.
    :param theta: ``(t0, t1, t2, t3, t4)``, each >= 0, seconds per unit of speed.
    :param mape: mean absolute relative error of the fitted speed over the measured points.
    :param max_ape: largest absolute relative error there.
    :param points: number of measured points fitted.
    """

    model: str
    theta: tuple[float, float, float, float, float]
    mape: float
    max_ape: float
    points: int
    measured: Mapping[tuple[int, int], float] = field(default_factory=dict, compare=False, repr=False)

    def step_time(self, workers: int, ps: int) -> float:
        """``tau(w, p)`` (s per unit of speed); ``inf`` when ``workers`` or ``ps`` is < 1."""
        if workers < 1 or ps < 1:
            return math.inf
        t0, t1, t2, t3, t4 = self.theta
        return t0 / workers + t1 + t2 * workers / ps + t3 * workers + t4 * ps

    def speed(self, workers: int, ps: int) -> float:
        """Speed with ``workers`` workers and ``ps`` PSs (DL2's unit); 0 without a worker or a PS."""
        tau = self.step_time(workers, ps)
        return 0.0 if tau == math.inf else 1.0 / tau

    def best_ps(self, workers: int, max_ps: int = MAX_PS, measured: bool = False) -> int:
        """The PS count in ``1..max_ps`` that gives ``workers`` workers the highest speed (fewest on ties);
        with ``measured``, by :meth:`measured_speed`."""
        f = self.measured_speed if measured else self.speed
        best, arg = -1.0, 1
        for p in range(1, max(1, max_ps) + 1):
            s = f(workers, p)
            if s > best * (1 + 1e-12):
                best, arg = s, p
        return arg

    def measured_speed(self, workers: int, ps: int) -> float:
        """The speed as measured: the measurement at a measured ``(workers, ps)``; elsewhere the fitted
        :meth:`speed` times the measured / fitted ratio interpolated linearly between the measured
        points around it (the nearest measured point's ratio outside them). 0 without a worker or a PS."""
        if workers < 1 or ps < 1:
            return 0.0
        got = self.measured.get((workers, ps))
        if got is not None:
            return got
        return self.speed(workers, ps) * _ratio(self.model, workers, ps)


@lru_cache(maxsize=4096)
def _ratio(model: str, workers: int, ps: int) -> float:
    """Measured / fitted speed at ``(workers, ps)``, interpolated over the measured points (module
    docstring of :meth:`PSSpeedModel.measured_speed`)."""
    return float(_interpolators(model)(workers, ps))


@lru_cache(maxsize=None)
def _interpolators(model: str):
    from scipy.interpolate import LinearNDInterpolator, NearestNDInterpolator

    m = fit_ps_models()[model]
    pts = np.array([(w, p) for (w, p) in m.measured], dtype=float)
    r = np.array([s / m.speed(w, p) for (w, p), s in m.measured.items()])
    lin, near = LinearNDInterpolator(pts, r), NearestNDInterpolator(pts, r)

    def f(w: int, p: int) -> float:
        v = float(lin(w, p))
        return v if math.isfinite(v) else float(near(w, p))

    return f


def _fit_one(model: str, rows: list[tuple[int, int, float]]) -> PSSpeedModel:
    from scipy.optimize import nnls

    pts = [(p, w, s) for p, w, s in rows if s > 0]
    if len(pts) < 5:
        raise ValueError(f"PS model {model}: {len(pts)} measured points, at least 5 needed")
    A = np.array([_features(w, p) for p, w, _ in pts])
    tau = np.array([1.0 / s for _, _, s in pts])
    theta, _ = nnls(A / tau[:, None], np.ones(len(pts)))
    if not (A @ theta > 0).all():
        raise ValueError(f"PS model {model}: the fit gives a non-positive step time")
    pred = 1.0 / (A @ theta)
    meas = np.array([s for _, _, s in pts])
    ape = np.abs(pred - meas) / meas
    measured = {(w, p): s for p, w, s in pts}
    return PSSpeedModel(model, tuple(float(x) for x in theta), float(ape.mean()), float(ape.max()), len(pts),  # type: ignore[arg-type]
                        measured)


@lru_cache(maxsize=1)
def fit_ps_models() -> dict[str, PSSpeedModel]:
    """Every model of :data:`PS_MODELS` fitted to :func:`load_ps_measurements` (cached)."""
    data = load_ps_measurements()
    return {m: _fit_one(m, data[m]) for m in PS_MODELS}


def fit_report() -> list[dict]:
    """Per model: its coefficients, measured points, mean and max absolute relative error of the speed."""
    return [
        {"model": m.model, "theta": list(m.theta), "points": m.points, "mape": m.mape, "max_ape": m.max_ape}
        for m in fit_ps_models().values()
    ]


class PSPerformanceModel:
    """A :class:`~policies.perf.PerformanceModel` that prices parameter-server jobs with
    :class:`PSSpeedModel` and every other job with ``base`` (the project's all-reduce
    :class:`~policies.perf.ContentionModel`).

    With ``use_measured`` (default) a PS job runs at :meth:`PSSpeedModel.measured_speed` (the
    measurements where measured, the fit scaled by the interpolated measured / fitted ratio
    elsewhere), else at the fitted :meth:`PSSpeedModel.speed` (:meth:`fitted`).

    A PS job's speed depends on its worker count (the placement's GPUs, one worker each) and its PS
    count: the ``ps`` attribute of the placement (:class:`policies.elastic.ElasticPlacement`), else
    the job's demand (``JobSpec.demand.ps``), else the best count for its workers. Where on the
    nodes the workers and PSs run does not change it (the measurements are of load-balanced
    deployments), and PS jobs neither suffer nor cause link contention here (``pair_cs`` is 1 when
    either job is a PS job): DL2's interference is not modelled.
    """

    def __init__(self, base: "ContentionModel", cluster: "ClusterSpec | None" = None, use_measured: bool = True) -> None:
        self.base = base
        self.cluster = cluster if cluster is not None else base.cluster
        self.use_measured = use_measured
        self.models = fit_ps_models()
        self._best: dict[tuple[str, int], float] = {}

    def fitted(self) -> "PSPerformanceModel":
        """This model with PS jobs priced by the fitted form alone (``use_measured=False``): what a
        white-box scheduler that fits Optimus' model believes."""
        return self if not self.use_measured else PSPerformanceModel(self.base, self.cluster, use_measured=False)

    def _speed(self, m: PSSpeedModel, workers: int, ps: int) -> float:
        return m.measured_speed(workers, ps) if self.use_measured else m.speed(workers, ps)

    def __getattr__(self, name: str):
        # everything else of the all-reduce model (fit_report, comm_share, ...) is the base's
        if name == "base":
            raise AttributeError(name)
        return getattr(self.base, name)

    def ps_model(self, model: str) -> PSSpeedModel | None:
        """The speed model of ``model`` when it is a PS model, else None."""
        c = canonical_ps_model(model)
        return None if c is None else self.models[c]

    def ps_count(self, job: "JobSpec | str", allocation: object) -> int:
        """The PS count a PS job runs with on ``allocation`` (see the class docstring)."""
        ps = getattr(allocation, "ps", None)
        if ps:
            return int(ps)
        d = getattr(job, "demand", None)
        if d is not None and d.ps:
            return int(d.ps)
        m = self.ps_model(job if isinstance(job, str) else job.model)
        assert m is not None
        return m.best_ps(int(getattr(allocation, "total_gpus", 1)), measured=self.use_measured)

    def throughput(self, job: "JobSpec | str", allocation: "Placement", cluster: "ClusterSpec | None" = None) -> float:
        model = job if isinstance(job, str) else job.model
        m = self.ps_model(model)
        if m is None:
            return self.base.throughput(job, allocation, cluster)
        return self._speed(m, int(allocation.total_gpus), self.ps_count(job, allocation))

    def isolated_throughput(self, model: str, gpus: int, nodes: int) -> float:
        m = self.ps_model(model)
        if m is None:
            return self.base.isolated_throughput(model, gpus, nodes)
        return self._speed(m, gpus, m.best_ps(gpus, measured=self.use_measured))

    def best_isolated_throughput(self, model: str, gpus: int) -> float:
        """All-reduce: the base's. PS model: the speed of ``gpus`` workers with their best PS count."""
        m = self.ps_model(model)
        if m is None:
            return self.base.best_isolated_throughput(model, gpus)
        key = (m.model, gpus)
        got = self._best.get(key)
        if got is None:
            got = self._best[key] = self._speed(m, gpus, m.best_ps(gpus, measured=self.use_measured))
        return got

    def pair_cs(self, a: "JobKey", b: "JobKey") -> float:
        if is_ps_model(a[0]) or is_ps_model(b[0]):
            return 1.0
        return self.base.pair_cs(a, b)

    def job_cs(self, me: "JobKey", my_nodes, neighbours_by_node) -> float:
        """:func:`policies.ledger.job_cs` with this model's :meth:`pair_cs`."""
        from policies.ledger import job_cs

        return job_cs(self, me, (neighbours_by_node.get(v, ()) for v in my_nodes))

    def node_cs(self, me: "JobKey", others) -> float:
        """:func:`policies.ledger.node_cs` with this model's :meth:`pair_cs`."""
        from policies.ledger import node_cs

        return node_cs(self, me, others)
