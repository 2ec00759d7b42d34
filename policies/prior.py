"""The admission prior: fixed logits that the RL policies' networks learn a residual on.

A policy's logits are ``network(obs) + prior(obs)``. The prior reads only the
option-speed channels of the observation (channel ``a`` for action
``a < K * S`` holds the option's predicted normalised speed,
``isolated(shape) / CS / best_isolated`` in ``(0, 1]``, on the slots it would
take; see :mod:`policies.codecs.deepshare`) and ranks the actions:

1. options whose predicted speed is at least ``theta``, lowest action index
   first (candidate 0, i.e. the least aged remaining GPU-time, on its first
   good option);
2. then "nothing" (hold the remaining jobs until the next event);
3. then the slow options (speed below ``theta``: a job split over nodes that
   loses locality or shares a network with other multi-node jobs).

``prior[a] = -scale * rank[a]``. With a network whose output is (near) zero,
the deterministic policy is therefore "start the first candidate that runs at
``>= theta`` of its best speed; otherwise wait", which is how an
*untrained* ``rl-base`` behaves (``rl-prior``). Training starts there and
learns where to deviate (e.g. accept a slow option at low load, or hold for
a large job). When no job runs, "nothing" is masked and the first valid
option is taken whatever its speed.

Why a prior at all: on job sets with mixed durations the plain "lowest valid
action" rule spreads 4- and 8-GPU jobs over 2-4 nodes of a fragmented cluster,
and PPO started from that rule does not learn to hold instead (docs/RL.md,
"Admission prior"). With ``theta = 0.8`` the untrained rule holds such jobs.

The same formula is implemented in numpy (:meth:`AdmissionPrior.logits`, used
at inference) and torch (:meth:`AdmissionPrior.logits_torch`, used by the
training policy :class:`trainer.prior_policy.MaskablePriorPolicy`); a test
checks they agree.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

__all__ = ["MAX_SCALE", "AdmissionPrior", "PriorError"]

#: Largest accepted :attr:`AdmissionPrior.scale`. Prior logits are ``-scale * rank`` with
#: ``0 <= rank <= 2 * K * S`` (a slow option ranks ``K * S + 1`` after its index), so with
#: ``scale <= 1e6`` every prior logit is at most ``2e6 * K * S`` in magnitude: finite in float32
#: (max ~3.4e38) for any action space that fits in memory (``K * S < 1e32``), and far from
#: overflowing when added to a network's logits. A larger scale (``1e300``, or ``Infinity``,
#: which Python's ``json`` accepts) overflows float32 to ``-inf`` on every action, and the
#: masked argmax then picks an invalid action. Trained priors use scale 1.
MAX_SCALE = 1e6


@functools.lru_cache(maxsize=64)
def _logit_tables(scale: float, ks: int) -> tuple[np.ndarray, np.ndarray]:
    """float32 ``[ks + 1]`` logits of :meth:`AdmissionPrior.logits` when every option is at or above
    ``theta`` and when every option is below it (computed with the same float32 operations)."""
    out = []
    for below in (0.0, 1.0):
        idx = np.arange(ks, dtype=np.float32)
        rank = idx + (ks + 1) * np.full(ks, below, dtype=np.float32)
        noop = np.full((1,), float(ks), dtype=np.float32)
        t = (-scale * np.concatenate([rank, noop], axis=-1)).astype(np.float32)
        t.flags.writeable = False
        out.append(t)
    return out[0], out[1]


@functools.lru_cache(maxsize=64)
def _logit_lists(scale: float, ks: int) -> tuple[list[float], list[float]]:
    """:func:`_logit_tables` as Python floats (exact: every float32 is a float64)."""
    fast, slow = _logit_tables(scale, ks)
    return fast.tolist(), slow.tolist()


@functools.lru_cache(maxsize=64)
def _f32_threshold(theta: float) -> float:
    """The smallest float64 ``x`` with ``float32(x) >= float32(theta)``.

    Rounding to float32 is monotonic, so ``float32(s) < float32(theta)`` (the
    comparison :meth:`AdmissionPrior.logits` makes) holds exactly when ``s < x``;
    found by bisection between the float32 below ``theta`` and ``theta``'s float32.
    """
    t32 = np.float32(theta)
    lo, hi = float(np.nextafter(t32, np.float32(-np.inf))), float(t32)
    while True:
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            return hi
        if np.float32(mid) >= t32:
            hi = mid
        else:
            lo = mid


class PriorError(ValueError):
    """A prior's parameters are invalid."""


@dataclass(frozen=True)
class AdmissionPrior:
    """Fixed logits over ``Discrete(K * S + 1)`` from the options' predicted speeds.

    :param theta: predicted normalised speed below which an option ranks after "nothing".
    :param scale: logit gap between consecutive ranks.
    """

    theta: float = 0.8
    scale: float = 1.0

    def __post_init__(self) -> None:
        for name in ("theta", "scale"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
                raise PriorError(f"prior {name} must be a number, got {v!r}")
            try:
                f = float(v)  # OverflowError for an int beyond float range (JSON allows 1000...0)
            except OverflowError:
                f = math.inf
            if not math.isfinite(f):
                raise PriorError(f"prior {name} must be finite, got {v!r}")
            object.__setattr__(self, name, f)
        if not 0.0 <= self.theta <= 1.0:
            raise PriorError(f"prior theta must be in [0, 1], got {self.theta}")
        if not 0.0 < self.scale <= MAX_SCALE:
            raise PriorError(
                f"prior scale must be in (0, {MAX_SCALE:g}] so that its float32 logits stay finite, got {self.scale}"
            )

    # ------------------------------------------------------------------ formula
    def logits(self, speeds: np.ndarray) -> np.ndarray:
        """Prior logits from option speeds.

        :param speeds: float ``[..., K * S]``: predicted normalised speed of each
            placement action (0 where infeasible).
        :returns: float32 ``[..., K * S + 1]`` (last = "nothing").
        """
        speeds = np.asarray(speeds, dtype=np.float32)
        ks = speeds.shape[-1]
        if speeds.ndim == 1:  # one state (inference): the two possible values of each logit, precomputed
            fast, slow = _logit_tables(self.scale, ks)
            out = fast.copy()
            np.copyto(out[:ks], slow[:ks], where=speeds < self.theta)
            return out
        idx = np.arange(ks, dtype=np.float32)
        rank = idx + (ks + 1) * (speeds < self.theta).astype(np.float32)
        noop = np.full(speeds.shape[:-1] + (1,), float(ks), dtype=np.float32)
        return (-self.scale * np.concatenate([rank, noop], axis=-1)).astype(np.float32)

    def masked_logits(self, speeds: Sequence[float], valid: Sequence[int], noop_valid: bool) -> np.ndarray:
        """:meth:`logits` of one state with invalid actions set to ``-inf`` (inference's fast path).

        Adding the result to float32 network logits gives exactly
        ``where(mask, z + logits(speeds), -inf)``, without the array passes.

        :param speeds: ``[K * S]`` option speeds (Python floats; compared after rounding to
            float32, as :meth:`logits` does).
        :param valid: indices of the valid placement actions.
        :param noop_valid: whether "nothing" (the last action) is valid.
        :returns: float32 ``[K * S + 1]``.
        """
        ks = len(speeds)
        fast, slow = _logit_lists(self.scale, ks)
        thr = _f32_threshold(self.theta)
        out = [-np.inf] * (ks + 1)
        for a in valid:
            out[a] = fast[a] if speeds[a] >= thr else slow[a]
        if noop_valid:
            out[ks] = fast[ks]
        return np.array(out).astype(np.float32)  # exact; faster than np.array(out, dtype=np.float32)

    def logits_torch(self, speeds):  # torch.Tensor [B, K*S] -> [B, K*S+1]
        """The same as :meth:`logits` for a torch tensor (training)."""
        import torch

        ks = speeds.shape[-1]
        idx = torch.arange(ks, dtype=speeds.dtype, device=speeds.device)
        rank = idx + (ks + 1) * (speeds < self.theta).to(speeds.dtype)
        noop = torch.full((*speeds.shape[:-1], 1), float(ks), dtype=speeds.dtype, device=speeds.device)
        return -self.scale * torch.cat([rank, noop], dim=-1)

    @staticmethod
    def speeds_from_obs(obs: np.ndarray, ks: int) -> np.ndarray:
        """Option speeds ``[..., K * S]`` from dense observations ``[..., C, N, 2G]`` (right half only:
        the left half's first channels mean something else)."""
        obs = np.asarray(obs)
        lead, g = obs.shape[:-3], obs.shape[-1] // 2
        return obs[..., :ks, :, g:].reshape(*lead, ks, -1).max(axis=-1)

    # ------------------------------------------------------------------ metadata
    def to_dict(self) -> dict[str, Any]:
        return {"kind": "admission", **asdict(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> AdmissionPrior | None:
        """``None`` for a checkpoint without a prior (its network carries everything)."""
        if d is None:
            return None
        if not isinstance(d, dict) or d.get("kind") != "admission":
            raise PriorError(f"unknown action prior {d!r} (expected kind 'admission')")
        missing = [k for k in ("theta", "scale") if k not in d]
        if missing:
            raise PriorError(f"bad action prior {d!r}: missing {', '.join(missing)}")
        extra = sorted(set(d) - {"kind", "theta", "scale"})
        if extra:
            raise PriorError(f"bad action prior {d!r}: unknown field(s) {', '.join(map(str, extra))}")
        # numbers only (no "0.8" strings, no bools), finite and in range: checked by __post_init__
        return cls(d["theta"], d["scale"])
