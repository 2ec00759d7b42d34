"""Catalogue of training workloads (model families) the project knows.

The six models measured by DeepShare (seed 002, Table I) are built in. Each
profile carries the communication characteristics from that table; the
performance model (:mod:`policies.perf`) fits the rest to measured
throughputs. Other models can be registered with :func:`register_workload`.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

__all__ = [
    "WorkloadProfile",
    "UnknownModelError",
    "MODELS",
    "canonical_model",
    "get_workload",
    "register_workload",
    "known_models",
]


class UnknownModelError(KeyError):
    """Raised for a model name that is neither built in nor registered."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else "unknown model"


@dataclass(frozen=True)
class WorkloadProfile:
    """Static description of a model family.

    :param name: canonical name (e.g. ``"MoE"``).
    :param bandwidth_mbps: average network bandwidth consumed by one job of
        this model (MB/s), measured by the seed (Table I).
    :param comm_comp: communication-to-computation time ratio (Table I).
    :param pattern: collective used (AllReduce, AllToAll, ...).
    :param per_gpu_throughput: samples/s of one GPU alone. Only needed for
        models without measurements; the built-in six are fitted from data.
    :param family_index: small integer used by observation encoders.
    """

    name: str
    bandwidth_mbps: float
    comm_comp: float
    pattern: str = "AllReduce"
    per_gpu_throughput: float | None = None
    family_index: int = 0


# Seed 002, Table I (profiled on 4 nodes x 8 TITAN Xp, 40 Gbps InfiniBand).
_BUILTIN = (
    WorkloadProfile("GraphSage", 24.63, 0.57, "AllReduce", family_index=0),
    WorkloadProfile("MobileNetV3", 211.25, 2.43, "AllReduce", family_index=1),
    WorkloadProfile("DLRM", 170.28, 13.36, "AllReduce", family_index=2),
    WorkloadProfile("Transformer-XL", 854.82, 1.87, "AllReduce", family_index=3),
    WorkloadProfile("FSDP", 2672.40, 7.32, "ReduceScatter+AllGather", family_index=4),
    WorkloadProfile("MoE", 929.48, 13.79, "AllToAll", family_index=5),
)

#: The six measured models, in the seed's GNN:IMG:DLRM:LM:FSDP:MoE mix order.
MODELS: tuple[str, ...] = tuple(p.name for p in _BUILTIN)

_REGISTRY: dict[str, WorkloadProfile] = {p.name: p for p in _BUILTIN}
_ALIASES: dict[str, str] = {
    "gnn": "GraphSage",
    "graphsage": "GraphSage",
    "img": "MobileNetV3",
    "mobilenet": "MobileNetV3",
    "mobilenetv3": "MobileNetV3",
    "dlrm": "DLRM",
    "lm": "Transformer-XL",
    "transformer-xl": "Transformer-XL",
    "transformerxl": "Transformer-XL",
    "fsdp": "FSDP",
    "gpt2-fsdp": "FSDP",
    "moe": "MoE",
    "gpt2-moe": "MoE",
}


def canonical_model(name: str) -> str:
    """Map a model name or alias (case-insensitive) to its canonical name."""
    if name in _REGISTRY:
        return name
    key = str(name).strip().lower()
    if key in _ALIASES:
        return _ALIASES[key]
    for canon in _REGISTRY:
        if canon.lower() == key:
            return canon
    raise UnknownModelError(
        f"unknown model {name!r}; known: {', '.join(known_models())} (aliases: GNN, IMG, LM)"
    )


def get_workload(name: str) -> WorkloadProfile:
    return _REGISTRY[canonical_model(name)]


def known_models() -> list[str]:
    return list(_REGISTRY)


def _finite(v: object) -> bool:
    try:
        return not isinstance(v, bool) and isinstance(v, numbers.Real) and math.isfinite(v)
    except (TypeError, OverflowError):
        return False


def register_workload(profile: WorkloadProfile, aliases: tuple[str, ...] = ()) -> None:
    """Add a model the performance model can price.

    Every field is checked (:class:`ValueError` naming the model and the field):
    ``name`` a non-empty string; ``bandwidth_mbps`` (MB/s) and ``comm_comp`` finite numbers
    >= 0 (a negative or NaN one would give negative throughputs, a contention sensitivity below 1
    or NaN); ``per_gpu_throughput`` (samples/s) a finite number > 0 (required: the model has no
    measurements); ``pattern`` a string; ``family_index`` an integer >= 0; ``aliases`` non-empty
    strings.

    A :class:`~policies.perf.ContentionModel` prices the models registered when it was built:
    register before building one (one built before raises a clear error for the new model).
    """
    name = profile.name
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"register_workload: name must be a non-empty string, got {name!r}")
    for field_name, v in (("bandwidth_mbps", profile.bandwidth_mbps), ("comm_comp", profile.comm_comp)):
        if not _finite(v) or v < 0:
            raise ValueError(f"workload {name!r}: {field_name} must be a finite number >= 0, got {v!r}")
    thp = profile.per_gpu_throughput
    if not _finite(thp) or thp <= 0:  # type: ignore[operator]
        raise ValueError(
            f"workload {name!r}: per_gpu_throughput must be a finite number > 0 (samples/s of one GPU), got {thp!r}"
        )
    if not isinstance(profile.pattern, str):
        raise ValueError(f"workload {name!r}: pattern must be a string, got {profile.pattern!r}")
    fi = profile.family_index
    if isinstance(fi, bool) or not isinstance(fi, numbers.Integral) or fi < 0:
        raise ValueError(f"workload {name!r}: family_index must be an integer >= 0, got {fi!r}")
    for a in aliases:
        if not isinstance(a, str) or not a.strip():
            raise ValueError(f"workload {name!r}: aliases must be non-empty strings, got {a!r}")
    idx = profile.family_index or len(_REGISTRY)
    _REGISTRY[profile.name] = WorkloadProfile(
        profile.name, profile.bandwidth_mbps, profile.comm_comp, profile.pattern, profile.per_gpu_throughput, idx
    )
    for a in aliases:
        _ALIASES[a.lower()] = profile.name
