"""GPU types and their speed relative to the reference GPU of the measured data.

DeepShare's throughputs (``policies/data/deepshare/``), which the performance model is fitted to, were
measured on NVIDIA TITAN Xp GPUs: that card is the *reference*, speed factor 1. A node of another type
computes ``factor`` times as fast as the reference for a given model family::

    factor(type, family) = geomean over batch sizes b of  thp_Gavel(type, m, b) / thp_Gavel(P100, m, b)

with ``m`` the Gavel model mapped to the family (:data:`FAMILY_TO_GAVEL`) and ``thp_Gavel`` the
measured single-GPU throughput (steps/s at batch size ``b``) that Gavel (Narayanan et al., OSDI 2020)
publishes for K80, P100 and V100 (``policies/data/gavel/single_gpu_throughputs.csv``, attribution in
``policies/data/NOTICE.md``). Batch sizes a type could not run (throughput 0) are left out.

**Assumption: TITAN Xp = P100.** Gavel has no TITAN Xp; both are Pascal cards without tensor cores.
The TITAN Xp has 1.30x the P100 PCIe's peak FP32 rate (12.1 vs 9.3 TFLOPS) and 0.75x its memory
bandwidth (548 vs 732 GB/s), so the true TITAN Xp / P100 ratio lies roughly between 0.75 and 1.3 and
depends on the model; every factor here carries that uncertainty on top of the spread over batch
sizes (``docs/PERFORMANCE_MODEL.md``, "GPU types, CPUs and memory").

Type names are matched case-insensitively, ignoring ``-``, ``_`` and spaces and a leading ``nvidia`` or
``tesla`` (``V100``, ``tesla_v100``, ``Titan-Xp``). A type the table lacks is an error naming the known
types; a cluster file can give such a node's factor directly (``gpu_speed``), which then applies to
every model and also overrides the table for a known type.

Pure: the table is read once from package data; no other I/O.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Mapping

__all__ = [
    "REFERENCE_TYPE",
    "GAVEL_TYPES",
    "FAMILY_TO_GAVEL",
    "UnknownGPUTypeError",
    "GavelRow",
    "gavel_throughputs",
    "gavel_model_factors",
    "speed_table",
    "known_gpu_types",
    "normalize_gpu_type",
    "is_known_gpu_type",
    "speed_factor",
    "check_speed",
]

#: The GPU the measured data come from (DeepShare: 4 nodes x 8 TITAN Xp); factor 1 for every model.
REFERENCE_TYPE = "titanxp"
#: The GPU types Gavel measured, in the column order of its table.
GAVEL_TYPES = ("k80", "p100", "v100")
#: Gavel's type taken as equal to the reference (see the module docstring).
_REFERENCE_EQUIVALENT = "p100"

#: Our model family -> (Gavel model or ``"*"`` for the geometric mean over all Gavel models, why).
FAMILY_TO_GAVEL: dict[str, tuple[str, str]] = {
    "MobileNetV3": (
        "ResNet-50",
        "an ImageNet CNN image classifier like MobileNetV3; Gavel's other CNN, ResNet-18 on CIFAR-10, is "
        "input-bound at small batches (V100 slower than P100 at batch 16 and 32)",
    ),
    "GraphSage": (
        "*",
        "Gavel has no graph neural network; the geometric mean over all of Gavel's models",
    ),
    "DLRM": (
        "Recommendation",
        "the same task (recommendation; Gavel's model is an autoencoder over MovieLens-20M, DLRM adds "
        "embedding tables)",
    ),
    "Transformer-XL": (
        "Transformer",
        "the same layer types (self-attention and feed-forward matrix products); Gavel's LM is an LSTM",
    ),
    "FSDP": (
        "Transformer",
        "GPT-2 trained with FSDP is a stack of Transformer blocks",
    ),
    "MoE": (
        "Transformer",
        "GPT-2 mixture-of-experts: Transformer blocks whose feed-forward layers are experts",
    ),
}

_ALIASES = {"titanxp": REFERENCE_TYPE, "titanxpascal": REFERENCE_TYPE}
_PREFIX = re.compile(r"^(nvidia|tesla)+")


class UnknownGPUTypeError(ValueError):
    """A GPU type name the speed table does not know (and no ``gpu_speed`` was given)."""


@dataclass(frozen=True)
class GavelRow:
    """One row of Gavel's single-GPU table: ``model`` at ``batch_size`` (None: Gavel gives none),
    steps/s alone on one GPU of each type (0.0: the type could not run it)."""

    model: str
    batch_size: int | None
    steps_per_s: Mapping[str, float]


@lru_cache(maxsize=1)
def gavel_throughputs() -> tuple[GavelRow, ...]:
    """Gavel's measured single-GPU throughputs (``policies/data/gavel/single_gpu_throughputs.csv``)."""
    path = resources.files("policies") / "data" / "gavel" / "single_gpu_throughputs.csv"
    rows = []
    with path.open(encoding="utf-8") as f:
        for rec in csv.DictReader(f):
            bs = rec["batch_size"].strip()
            rows.append(GavelRow(rec["model"], int(bs) if bs else None, {t: float(rec[t]) for t in GAVEL_TYPES}))
    return tuple(rows)


def _geomean(values: list[float]) -> float:
    return math.exp(math.fsum(math.log(v) for v in values) / len(values))


@lru_cache(maxsize=1)
def gavel_model_factors() -> dict[str, dict[str, float]]:
    """``{Gavel model: {type: factor relative to P100}}``: geometric mean over the model's batch sizes
    of ``thp(type) / thp(P100)``, batch sizes with a zero on either side left out."""
    by_model: dict[str, list[GavelRow]] = {}
    for row in gavel_throughputs():
        by_model.setdefault(row.model, []).append(row)
    out: dict[str, dict[str, float]] = {}
    for model, rows in by_model.items():
        ref = _REFERENCE_EQUIVALENT
        out[model] = {
            t: _geomean([r.steps_per_s[t] / r.steps_per_s[ref] for r in rows
                        if min(r.steps_per_s[t], r.steps_per_s[ref]) > 0])
            for t in GAVEL_TYPES
        }
    return out


@lru_cache(maxsize=1)
def speed_table() -> dict[str, dict[str, float]]:
    """``{type: {family: factor}}`` for every known type and each family of :data:`FAMILY_TO_GAVEL`,
    plus ``"*"``: the factor of any other model (geometric mean over all Gavel models). The reference
    type and P100 are exactly 1."""
    per_model = gavel_model_factors()
    overall = {t: _geomean([f[t] for f in per_model.values()]) for t in GAVEL_TYPES}
    table: dict[str, dict[str, float]] = {}
    for t in GAVEL_TYPES:
        row = {fam: (overall[t] if gm == "*" else per_model[gm][t]) for fam, (gm, _why) in FAMILY_TO_GAVEL.items()}
        row["*"] = overall[t]
        table[t] = row
    table[REFERENCE_TYPE] = {fam: 1.0 for fam in table[GAVEL_TYPES[0]]}
    return table


def known_gpu_types() -> list[str]:
    """The type names the speed table knows, sorted."""
    return sorted(speed_table())


def _key(name: str) -> str:
    return _PREFIX.sub("", re.sub(r"[\s_\-]", "", name.strip().lower()))


def normalize_gpu_type(name: str) -> str:
    """A type name as types are compared: lower case without ``-``, ``_``, spaces and a leading
    ``nvidia`` / ``tesla`` (``"Tesla-V100"`` -> ``"v100"``, ``"NVIDIA_A100"`` -> ``"a100"``), aliases
    resolved (``"titan_xp"`` -> ``"titanxp"``); known to the table or not."""
    key = _key(name)
    return _ALIASES.get(key, key)


def is_known_gpu_type(name: str) -> bool:
    key = _key(name)
    return _ALIASES.get(key, key) in speed_table()


def _unknown(name: str, where: str = "") -> UnknownGPUTypeError:
    return UnknownGPUTypeError(
        f"{where}unknown GPU type {name!r} (known: {', '.join(known_gpu_types())}); give the node's "
        "speed relative to a TITAN Xp with gpu_speed in a cluster file"
    )


def speed_factor(gpu_type: str | None, model: str, gpu_speed: float | None = None) -> float:
    """Relative speed (reference TITAN Xp = 1) of one GPU of ``gpu_type`` training ``model``.

    ``gpu_speed`` (a node's own factor) wins when given; ``gpu_type`` None is the reference (1.0).
    ``model`` is a family name or alias; a model the table does not map gets the all-model mean.

    :raises UnknownGPUTypeError: ``gpu_type`` is not known and no ``gpu_speed`` was given.
    """
    if gpu_speed is not None:
        return float(gpu_speed)
    if gpu_type is None:
        return 1.0
    key = _key(gpu_type)
    row = speed_table().get(_ALIASES.get(key, key))
    if row is None:
        raise _unknown(gpu_type)
    f = row.get(model)
    if f is None:  # an alias ("moe") or a model the table does not map
        from policies.workloads import UnknownModelError, canonical_model

        try:
            f = row.get(canonical_model(model))
        except UnknownModelError:
            f = None
    return row["*"] if f is None else f


def check_speed(gpu_type: str | None, gpu_speed: float | None, where: str = "") -> None:
    """Raise :class:`UnknownGPUTypeError` (prefixed by ``where``) unless a node of ``gpu_type`` with
    ``gpu_speed`` has a speed factor: an untyped node, a known type, or an explicit ``gpu_speed``."""
    if gpu_type is not None and gpu_speed is None and not is_known_gpu_type(gpu_type):
        raise _unknown(gpu_type, where)
