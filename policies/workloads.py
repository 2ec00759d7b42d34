"""Catalogue of training workloads (model families) the project knows.

The six models measured by DeepShare (seed 002, Table I) are built in. Each
profile carries the communication characteristics from that table; the
performance model (:mod:`policies.perf`) fits the rest to measured
throughputs. Other models can be registered with :func:`register_workload`.
"""

from __future__ import annotations

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


def register_workload(profile: WorkloadProfile, aliases: tuple[str, ...] = ()) -> None:
    """Add a model the performance model can price (needs ``per_gpu_throughput``)."""
    if profile.per_gpu_throughput is None or profile.per_gpu_throughput <= 0:
        raise ValueError(f"{profile.name}: a registered workload needs a positive per_gpu_throughput")
    idx = profile.family_index or len(_REGISTRY)
    _REGISTRY[profile.name] = WorkloadProfile(
        profile.name, profile.bandwidth_mbps, profile.comm_comp, profile.pattern, profile.per_gpu_throughput, idx
    )
    for a in aliases:
        _ALIASES[a.lower()] = profile.name
