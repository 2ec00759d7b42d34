"""The one policy factory: every policy that ``rlsched simulate``, ``rlsched evaluate``, the twin and the
controller run is built here, by name.

Names (case-insensitive, blanks around them ignored):

=====================================  ===================================================================
``fifo``, ``sjf``, ``sif``, ``lrf``,   heuristics (:mod:`policies.heuristics`): a scheduling order plus a
``srtf``, ``lgtf``, ``las``,           placement rule; ``-np`` turns preemption off (``las-np``),
``las2d``, ``greedy``                  ``:pack`` / ``:nosplit`` / ``:spread`` / ``:greedy`` picks the
                                       placement (``srtf:nosplit``); ``greedy`` is SRTF with the
                                       ``greedy`` placement
``rl-base``, ``rl-hybrid``             the shipped learned policies, cluster-size-free (:mod:`policies.sizefree`):
                                       the shipped size-free network on any cluster; ``rl-hybrid`` adds the
                                       greedy safety rule; ``NAME:/path`` (or the ``checkpoint`` argument)
                                       names a checkpoint (``ckpt``, ``ckpt.json`` or ``ckpt.safetensors``):
                                       a size-free one runs as above, a fixed-shape one (format
                                       ``rlsched-policy``) as ``rl-base-SHAPE`` / ``rl-hybrid-SHAPE`` do
``rl-base-4x8``, ``rl-hybrid-4x8``     the fixed-shape learned policies (:mod:`policies.rl`, DeepShare-style
                                       codec) with their shipped checkpoint
                                       (``policies/checkpoints/rl-base-4x8.*``); a cluster of that GPU
                                       layout only; ``NAME:/path`` another fixed-shape checkpoint
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
``rl-sf``                              the size-free network without a safety rule, as ``rl-base`` (the
                                       same shipped checkpoint); ``rl-sf:/path`` another size-free one
``dl2``                                DL2 (:mod:`policies.dl2`): an actor network adds workers / PSs to
                                       elastic jobs each slot; the shipped checkpoint, ``dl2:/path`` another
=====================================  ===================================================================

Options (keyword arguments of :func:`make_policy`; :data:`OPTIONS`):

* ``min_run_s``: preemptive heuristics choose no job as a victim before it has run this long (s;
  ``None``: the heuristic's default); the planner passes it to its heuristics. The RL policies never
  preempt and ignore it.
* ``deterministic``, ``seed``, ``fast``, ``hybrid_floor``, ``hybrid_rule``: the fixed-shape RL policies'
  (:class:`policies.rl.RLPolicy`); a heuristic refuses them. The size-free ones take ``hybrid_floor`` and
  ``hybrid_rule`` (``rl-hybrid``'s safety rule) and ``deterministic=True`` (they are deterministic), and
  refuse the others.
* ``budget_s``, ``horizon``, ``holds``, ``base``, ``alternatives``, ``arrivals``, ``work``, ``follow``: the planner's
  (:func:`policies.planner.make_planner`); other policies refuse them.

Building a policy reads nothing but its checkpoint file.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from policies.base import Policy, PolicyError
from policies.cluster import ClusterSpec
from policies.compat import DS_POLICY_NAMES, make_ds_policy
from policies.heuristics import HEURISTIC_NAMES, ORDERS, PLACEMENT_NAMES, make_heuristic
from policies.perf import ContentionModel

__all__ = ["FIXED_RL_NAMES", "LEARNED_NAMES", "OPTIONS", "RL_NAMES", "SIZEFREE_NAMES", "checkpoint_path",
           "describe_names", "is_learned", "is_sizefree", "make_policy", "policy_names"]

#: The shipped learned policies' names: ``rl-base`` / ``rl-hybrid`` (size-free), the fixed-shape
#: checkpoints they replaced (``rl-base-4x8`` / ``rl-hybrid-4x8``, :mod:`policies.rl`) and ``rl-prior``.
RL_NAMES = ("rl-base", "rl-hybrid", "rl-base-4x8", "rl-hybrid-4x8", "rl-prior")
#: Names the size-free network runs under (:mod:`policies.sizefree`).
SIZEFREE_NAMES = ("rl-base", "rl-hybrid", "rl-sf")
#: The shipped fixed-shape checkpoints (``policies/checkpoints/MODE-SHAPE.*``).
FIXED_RL_NAMES = ("rl-base-4x8", "rl-hybrid-4x8")
#: ``rl-base-SHAPE`` / ``rl-hybrid-SHAPE``: a fixed-shape checkpoint by its shipped name
_FIXED = re.compile(r"^(rl-base|rl-hybrid)-(\d+x\d+)$")
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
_PLANNER_OPTIONS = ("budget_s", "horizon", "holds", "base", "alternatives", "arrivals", "work", "follow")
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
        "rl-base, rl-hybrid (size-free; optionally :/path/to/checkpoint), rl-base-4x8, rl-hybrid-4x8 (fixed shape; "
        "optionally :/path/to/checkpoint), rl-prior, sced2, rl-sf (optionally :/path/to/checkpoint), "
        "drf, tetris, optimus, ds-las, ds-srtf, chic, chic-pair (optionally :/path/to/checkpoint), planner (optionally :KEY=VALUE/KEY=VALUE), dl2 (optionally :/path/to/checkpoint)"
    )


def _names_fixed_checkpoint(raw: str, checkpoint: str | Path | None) -> bool:
    """Whether the checkpoint ``raw`` (``NAME:/path``) or ``checkpoint`` names is a fixed-shape one (its JSON's
    ``format`` is ``rlsched-policy``, :mod:`policies.checkpoint`). An unreadable or missing file counts as not
    (the size-free loader then names the problem)."""
    from policies.checkpoint import FORMAT, resolve_paths

    _, sep, path = raw.partition(":")
    where = path.strip() if sep else checkpoint
    if not where:
        return False
    try:
        jpath = resolve_paths(where)[0]
        with jpath.open("rb") as f:
            meta = json.loads(f.read(1 << 20).decode("utf-8"))
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return False
    return isinstance(meta, dict) and meta.get("format") == FORMAT


def is_sizefree(name: str, checkpoint: str | Path | None = None) -> bool:
    """Whether the registry builds ``name`` (with the ``checkpoint`` argument) on the size-free network:
    ``rl-sf``, and ``rl-base`` / ``rl-hybrid`` unless they name a fixed-shape checkpoint."""
    raw = name.strip()
    base = raw.partition(":")[0].strip().lower()
    return base == "rl-sf" or (base in SIZEFREE_NAMES and not _names_fixed_checkpoint(raw, checkpoint))


def checkpoint_path(name: str, cluster: ClusterSpec | None = None) -> Path:
    """The checkpoint (its ``.json``) the learned policy ``name`` runs with, as :func:`make_policy` resolves
    it: the one ``NAME:/path`` names, else the shipped one of the name: ``rl-base`` / ``rl-hybrid`` /
    ``rl-sf`` the size-free ``policies/checkpoints/sizefree/rl-sf``, ``rl-base-SHAPE`` /
    ``rl-hybrid-SHAPE`` the fixed-shape ``policies/checkpoints/NAME``, ``sced2`` the one for ``cluster``'s
    GPUs per server (default 8), ``chic`` / ``chic-pair`` and ``dl2`` theirs.

    :raises PolicyError: a name that is not a learned policy's, ``rl-prior`` (no checkpoint), an empty
        path after ``:``, or no shipped checkpoint of that name (one line).
    """
    from policies.checkpoint import resolve_paths

    raw = name.strip() if isinstance(name, str) else ""
    head, sep, path = raw.partition(":")
    base = head.strip().lower()
    fixed = _FIXED.match(base)
    if base not in LEARNED_NAMES and fixed is None:
        raise PolicyError(f"{name!r} is not a learned policy's name; learned policies: "
                          f"{', '.join(n for n in LEARNED_NAMES if n != 'rl-prior')}, rl-base-SHAPE, rl-hybrid-SHAPE")
    if base == "rl-prior":
        raise PolicyError("rl-prior is the untrained admission prior: it has no checkpoint")
    if sep:
        if not path.strip():
            raise PolicyError(f"policy {name!r}: empty checkpoint path after ':'")
        return resolve_paths(path.strip())[0]
    if base in SIZEFREE_NAMES:
        from policies.sizefree import shipped_sizefree

        return shipped_sizefree()
    if fixed is not None:
        from policies.rl import shipped_checkpoint

        return shipped_checkpoint(fixed.group(1), ClusterSpec.parse(fixed.group(2)))
    if base == "sced2":
        from policies.sced2 import shipped_sced2

        gpn = cluster.gpus_per_node[0] if cluster is not None and cluster.is_homogeneous else 8
        return shipped_sced2(gpn)
    if base == "dl2":
        from policies.dl2 import shipped_dl2

        got = resolve_paths(shipped_dl2())[0]
    else:  # chic, chic-pair
        from policies.chic import shipped_checkpoint as shipped_chic

        got = shipped_chic(base)
    if not got.is_file():
        raise PolicyError(f"no shipped {base} checkpoint ({got} is missing)")
    return got


def _sizefree(name: str, raw: str, base: str, cluster: ClusterSpec, perf: ContentionModel,
              checkpoint: str | Path | None, options: dict[str, Any]) -> Policy:
    """``rl-base`` / ``rl-hybrid`` / ``rl-sf`` on the size-free network (module docstring)."""
    hybrid = base == "rl-hybrid"
    opts = dict(options)
    if opts.pop("deterministic", True) is not True:
        raise PolicyError(f"policy {name!r}: the size-free policies are deterministic (deterministic=False applies "
                          "to rl-base-4x8 / rl-hybrid-4x8 only)")
    hyb = {k: opts.pop(k) for k in ("hybrid_floor", "hybrid_rule") if k in opts}
    if opts or (hyb and not hybrid):
        bad = sorted(opts or hyb)[0]
        raise PolicyError(f"policy {name!r}: option {bad!r} does not apply to {base} (size-free)")
    from policies.sizefree import make_sizefree_policy

    return make_sizefree_policy(raw, cluster, perf, checkpoint=checkpoint, hybrid=hybrid, **hyb)


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
    fixed = _FIXED.match(base)
    if is_sizefree(raw, checkpoint):
        return _sizefree(name, raw, base, cluster, perf, checkpoint, options)
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
        if base not in RL_NAMES and fixed is None and base not in SIZEFREE_NAMES:
            raise PolicyError(f"unknown RL policy {name!r}; policies: {describe_names()}")
        try:
            from policies.rl import make_rl_policy, shipped_checkpoint
        except ImportError as exc:  # pragma: no cover - an install without the RL policies' dependencies
            raise PolicyError(f"policy {name!r}: the RL policies cannot be imported ({exc})") from None
        if fixed is None:  # rl-base:/fixed-shape-checkpoint, rl-prior
            return make_rl_policy(raw, cluster, perf, checkpoint=checkpoint, **options)
        mode, shape = fixed.groups()
        _, sep, path = raw.partition(":")
        if sep and not path.strip():
            raise PolicyError(f"policy {name!r}: empty checkpoint path after ':'")
        if not sep and checkpoint is None:
            if shape != cluster.describe_gpus():
                raise PolicyError(f"policy {name!r}: the shipped {base} checkpoint runs on a {shape} cluster only, "
                                  f"not {cluster.describe_gpus()}; rl-base / rl-hybrid (size-free) run on any cluster")
            checkpoint = shipped_checkpoint(mode, cluster)
        pol = make_rl_policy(f"{mode}:{path.strip()}" if sep else mode, cluster, perf, checkpoint=checkpoint, **options)
        pol.name = base
        return pol
    if not _is_heuristic(base):
        raise PolicyError(f"unknown policy {name!r}; policies: {describe_names()}")
    if options:
        raise PolicyError(f"policy {name!r}: option {sorted(options)[0]!r} applies to the RL policies only")
    pol = make_heuristic(raw, perf)
    if min_run_s is not None:
        pol.min_run = float(min_run_s)
    return pol
