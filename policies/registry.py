"""The one policy factory: every policy that ``rlsched simulate``, ``rlsched evaluate``, the twin and the
controller run is built here, by name.

Names (case-insensitive, blanks around them ignored):

=====================================  ===================================================================
``fifo``, ``sjf``, ``sif``, ``lrf``,   heuristics (:mod:`policies.heuristics`): a scheduling order plus a
``srtf``, ``lgtf``, ``las``,           placement rule; ``-np`` turns preemption off (``las-np``),
``las2d``, ``greedy``                  ``:pack`` / ``:nosplit`` / ``:spread`` / ``:greedy`` picks the
                                       placement (``srtf:nosplit``); ``greedy`` is SRTF with the
                                       ``greedy`` placement
``rl-base``, ``rl-hybrid``             learned policies (:mod:`policies.rl`) with the shipped checkpoint for
                                       the cluster's shape, or the ``checkpoint`` argument; ``NAME:/path``
                                       names a checkpoint (``ckpt``, ``ckpt.json`` or ``ckpt.safetensors``)
``rl-prior``                           the untrained admission prior alone (an ablation, no checkpoint)
``drf``, ``tetris``, ``optimus``       elastic baselines deciding workers and parameter servers
                                       (:mod:`policies.elastic`, re-plan every 600 s)
``sced2``                              SCED2 (:mod:`policies.sced2`): a shared-weight Q-network picks jobs,
                                       packing places them; the shipped checkpoint for the servers' GPU
                                       count (any number of servers), ``sced2:/path`` another one
``ds-las``, ``ds-srtf``                DeepShare's own LAS / SRTF for ``--compat deepshare``
                                       (:mod:`policies.compat`); they take no options
``chic``, ``chic-pair``                Chic / Chic-Pair (:mod:`policies.chic`) with the shipped checkpoint,
                                       the ``checkpoint`` argument, or ``NAME:/path``
``planner``                            the lookahead planner (:mod:`policies.planner`): candidate
                                       decisions scored by simulator rollouts; options as
                                       ``planner:budget_s=2/horizon=0`` or keyword arguments
``rl-sf``                              the cluster-size-free learned policy (:mod:`policies.sizefree`):
                                       a shared scorer over candidate (job, placement) pairs; any
                                       cluster; ``rl-sf:/path`` another checkpoint
``dl2``                                DL2 (:mod:`policies.dl2`): an actor network adds workers / PSs to
                                       elastic jobs each slot; the shipped checkpoint, ``dl2:/path`` another
=====================================  ===================================================================

Options (keyword arguments of :func:`make_policy`; :data:`OPTIONS`):

* ``min_run_s``: preemptive heuristics choose no job as a victim before it has run this long (s;
  ``None``: the heuristic's default); the planner passes it to its heuristics. The RL policies never
  preempt and ignore it.
* ``deterministic``, ``seed``, ``fast``, ``hybrid_floor``, ``hybrid_rule``: the RL policies'
  (:class:`policies.rl.RLPolicy`); a heuristic refuses them.
* ``budget_s``, ``horizon``, ``holds``, ``base``, ``alternatives``: the planner's
  (:func:`policies.planner.make_planner`); other policies refuse them.

Building a policy reads nothing but its checkpoint file.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from policies.base import Policy, PolicyError
from policies.cluster import ClusterSpec
from policies.compat import DS_POLICY_NAMES, make_ds_policy
from policies.heuristics import HEURISTIC_NAMES, ORDERS, PLACEMENT_NAMES, make_heuristic
from policies.perf import ContentionModel

__all__ = ["LEARNED_NAMES", "OPTIONS", "RL_NAMES", "is_learned", "describe_names", "make_policy", "policy_names"]

#: The learned policies' names (:mod:`policies.rl`).
RL_NAMES = ("rl-base", "rl-hybrid", "rl-prior")
#: Every learned policy's base name (a checkpoint decides): the RL policies, SCED2, rl-sf, Chic, Chic-Pair and DL2.
LEARNED_NAMES = (*RL_NAMES, "sced2", "rl-sf", "chic", "chic-pair", "dl2")


def is_learned(name: str) -> bool:
    """Whether the policy ``name`` (any variant: ``rl-base:/path``, ``SCED2``) is a learned policy, i.e.
    its base name is one of :data:`LEARNED_NAMES` or starts with ``rl`` (evaluate's aliases of RL
    checkpoints, e.g. ``rl-f2``); results tables compare learned policies with the best of the others."""
    base = name.partition(":")[0].strip().lower()
    return base in LEARNED_NAMES or base.startswith("rl")


#: The RL policies' options (:class:`policies.rl.RLPolicy`'s parameters).
_RL_OPTIONS = ("deterministic", "seed", "fast", "hybrid_floor", "hybrid_rule")
#: The planner's options (:data:`policies.planner.PLANNER_OPTIONS`).
_PLANNER_OPTIONS = ("budget_s", "horizon", "holds", "base", "alternatives")
#: Every option :func:`make_policy` accepts.
OPTIONS = ("min_run_s", *_RL_OPTIONS, *_PLANNER_OPTIONS)
#: Heuristic base names besides the orders (:func:`policies.heuristics.make_heuristic`).
_HEURISTIC_ALIASES = ("greedy", "contention-greedy")


def policy_names() -> tuple[str, ...]:
    """Every policy name (heuristics, the RL policies, SCED2, DeepShare's own orders, the elastic baselines,
    Chic, DL2 and the planner), without variants (``-np``, ``:PLACEMENT``, ``:/path``)."""
    return (*HEURISTIC_NAMES, *RL_NAMES, "sced2", "rl-sf", *DS_POLICY_NAMES, "drf", "tetris", "optimus", "chic",
            "chic-pair", "dl2", "planner")


def describe_names() -> str:
    """Every policy name with its variants, for error messages."""
    return (
        f"{', '.join(HEURISTIC_NAMES)} (optionally -np and :{'|:'.join(PLACEMENT_NAMES)}), "
        "rl-base, rl-hybrid (optionally :/path/to/checkpoint), rl-prior, sced2, rl-sf (optionally :/path/to/checkpoint), "
        "drf, tetris, optimus, ds-las, ds-srtf, chic, chic-pair (optionally :/path/to/checkpoint), planner (optionally :KEY=VALUE/KEY=VALUE), dl2 (optionally :/path/to/checkpoint)"
    )


def _is_heuristic(base: str) -> bool:
    """Whether ``base`` (a lower-case name before any ``:``) names a heuristic."""
    order = base[:-3] if base.endswith("-np") else base
    return order in ORDERS or order in _HEURISTIC_ALIASES


def make_policy(
    name: str,
    cluster: ClusterSpec,
    perf: ContentionModel | None = None,
    checkpoint: str | Path | None = None,
    **options: Any,
) -> Policy:
    """The policy ``name`` (module docstring) for ``cluster``.

    :param perf: the performance model (default :class:`ContentionModel` of ``cluster``).
    :param checkpoint: the RL policies' checkpoint when ``name`` names none (``rl-base:/path`` wins);
        the shipped one for the cluster's shape when neither does. Other policies ignore it.
    :param options: :data:`OPTIONS` (module docstring).
    :raises PolicyError: an unknown name or option, a bad option value, or (a
        :class:`~policies.checkpoint.CheckpointError`) an unusable checkpoint; one line naming it.
        An unknown name's message lists every policy name.
    """
    if not isinstance(name, str) or not name.strip():
        raise PolicyError(f"empty policy name; policies: {describe_names()}")
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise PolicyError(f"policy {name!r}: unknown option {unknown[0]!r}; options: {', '.join(OPTIONS)}")
    raw = name.strip()
    base = raw.partition(":")[0].strip().lower()
    perf = perf or ContentionModel(cluster)
    min_run_s = options.pop("min_run_s", None)
    if min_run_s is not None and (
        isinstance(min_run_s, bool) or not isinstance(min_run_s, (int, float)) or not math.isfinite(min_run_s)
        or min_run_s < 0
    ):
        raise PolicyError(f"policy {name!r}: min_run_s must be a finite number of seconds >= 0, got {min_run_s!r}")
    if base == "planner":  # the lookahead planner (policies/planner.py)
        other = sorted(k for k in options if k not in _PLANNER_OPTIONS)
        if other:
            raise PolicyError(f"policy {name!r}: option {other[0]!r} does not apply to the planner")
        from policies.planner import make_planner

        planner = make_planner(raw, cluster, perf, **options)
        if min_run_s is not None:  # the planner's heuristics (decisions and rollouts) choose victims with it
            for h in (planner.base, *planner.alternatives):
                h.min_run = float(min_run_s)
        return planner
    planner_opts = sorted(k for k in options if k in _PLANNER_OPTIONS)
    if planner_opts:
        raise PolicyError(f"policy {name!r}: option {planner_opts[0]!r} applies to the planner only")
    if base in ("drf", "tetris", "optimus"):  # elastic baselines (policies/elastic.py)
        if options:
            raise PolicyError(f"policy {name!r}: option {sorted(options)[0]!r} applies to the RL policies only")
        from policies.elastic import make_elastic_policy

        return make_elastic_policy(base, perf)
    if base == "rl-sf":  # the cluster-size-free learned policy (policies/sizefree.py)
        if options:
            raise PolicyError(f"policy {name!r}: option {sorted(options)[0]!r} does not apply to rl-sf")
        from policies.sizefree import make_sizefree_policy

        return make_sizefree_policy(raw, cluster, perf, checkpoint=checkpoint)
    if base == "dl2":  # DL2 (seed 000): elastic workers / PSs, its own checkpoint format
        if options:
            raise PolicyError(f"policy {name!r}: option {sorted(options)[0]!r} does not apply to dl2")
        from policies.dl2 import make_dl2_policy

        return make_dl2_policy(raw, perf, checkpoint=checkpoint)
    if base == "sced2":  # SCED2 (seed 003): its own checkpoint format and codec
        if options:
            raise PolicyError(f"policy {name!r}: option {sorted(options)[0]!r} does not apply to sced2")
        from policies.sced2 import make_sced2_policy

        return make_sced2_policy(raw, cluster, perf, checkpoint=checkpoint)
    if base in DS_POLICY_NAMES:
        if raw.lower() != base or options or min_run_s is not None:
            raise PolicyError(f"policy {name!r}: {base} takes no variant and no option")
        return make_ds_policy(base)
    if base in ("chic", "chic-pair"):  # Chic / Chic-Pair (policies/chic.py)
        if options:
            raise PolicyError(f"policy {name!r}: option {sorted(options)[0]!r} applies to the RL policies only")
        from policies.chic import make_chic_policy

        return make_chic_policy(raw, perf, checkpoint)
    if base.startswith("rl"):
        if base not in RL_NAMES:
            raise PolicyError(f"unknown RL policy {name!r}; policies: {describe_names()}")
        try:
            from policies.rl import make_rl_policy
        except ImportError as exc:  # pragma: no cover - an install without the RL policies' dependencies
            raise PolicyError(f"policy {name!r}: the RL policies cannot be imported ({exc})") from None
        return make_rl_policy(raw, cluster, perf, checkpoint=checkpoint, **options)
    if not _is_heuristic(base):
        raise PolicyError(f"unknown policy {name!r}; policies: {describe_names()}")
    if options:
        raise PolicyError(f"policy {name!r}: option {sorted(options)[0]!r} applies to the RL policies only")
    pol = make_heuristic(raw, perf)
    if min_run_s is not None:
        pol.min_run = float(min_run_s)
    return pol
