"""Train RL placement policies with unmodified Stable-Baselines3 / sb3-contrib.

:func:`train` builds ``n_envs`` :class:`~trainer.env.PlacementEnv` copies in a
``DummyVecEnv`` (one process: the machine is shared), trains one of
``maskable-ppo`` (default; uses :meth:`PlacementEnv.action_masks`), ``ppo``,
``a2c`` or ``dqn`` with a small MLP, logs to TensorBoard (``OUT/tb``) and,
every ``eval_freq`` steps, runs the current network as ``rl-base`` through the
full simulator on the validation traces. The checkpoint with the lowest
*relative* validation JCT (mean over traces of its average JCT divided by a
reference heuristic's, :func:`trainer.env.reference_jct`; so a 1 % gain on a
3 h Poisson set counts as much as on a 60 h zero-arrival set) is kept as
``OUT/best``; the latest as ``OUT/last``
(both ``.safetensors`` + ``.json``, see :mod:`policies.checkpoint`); without
validation traces ``best`` is a copy of ``last`` at the end of every run.
``OUT/eval.csv`` lists every evaluation, each logged only once its network is
saved (``last`` first, then ``best`` if it is better), and TensorBoard gets them
at their own steps. ``last`` is saved with the step-0 evaluation too.

Resuming (``resume=True``) reloads ``OUT/last``'s weights (safetensors, never
a pickle) and step count and continues, with the optimiser's moments and the
reward statistics saved beside it (:mod:`trainer.train_state`); a DQN's replay
buffer is not stored, so it warms up again. The settings that define the run
(algorithm, reward and W1, prior, network shape, cluster, candidate order and
``k``, seed, validation traces by content) must be the run's own. The resumed
segment's random streams are seeded from the seed and the steps done
(:func:`segment_seed`); the score to beat is ``best``'s own, and evaluations
logged past ``last``'s steps (a run stopped before saving it) are dropped.
A run holds ``OUT/.lock``: a second one into the same ``OUT`` is refused.

Everything is checked before any work (:func:`check_run`: the options, ``--out``,
the ``--init`` checkpoint, the run to resume and its evaluation log); an
``overwrite`` deletes the previous run only once the new one is built and its
starting weights are loaded. ``eval.csv`` and ``summary.json`` are replaced
atomically (temp file + rename), like the checkpoints.

Stable-Baselines3 trains in whole rollouts, so the step count is rounded up to a
multiple of :func:`rollout_steps` (``n_steps x n_envs`` for the on-policy
algorithms); the summary reports the steps done.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import logging
import math
import os
import shlex
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from policies.checkpoint import (
    MAX_AGING_S,
    MIN_AGING_S,
    Checkpoint,
    CheckpointError,
    MLPNet,
    load_checkpoint,
    save_checkpoint,
    write_atomic,
)
from policies.cluster import ClusterSpec
from policies.codecs.deepshare import DeepShareCodec, ObsSpec
from policies.compat import CompatError, CompatMode, adapt_policy, compat_mode
from policies.job import JobSpec
from policies.orders import AGING_S, CANDIDATE_ORDERS, LEGACY_AGING_S
from policies.perf import ContentionModel
from policies.prior import AdmissionPrior, PriorError
from policies.rl import RLPolicy
from trainer.env import REWARDS, PlacementEnv, reference_jct
from trainer.outputs import unwritable
from trainer.simulator import SimConfig, Simulator
from trainer.train_state import STATE_NAME, read_train_state, restore_train_state, save_train_state

__all__ = [
    "ALGOS",
    "RunPlan",
    "TrainConfig",
    "TrainConfigError",
    "check_config",
    "check_run",
    "evaluate_net",
    "export_tensors",
    "inference_net",
    "rollout_steps",
    "train",
]

log = logging.getLogger(__name__)

ALGOS = ("maskable-ppo", "ppo", "a2c", "dqn")
#: A2C's rollout length (steps per environment per update)
A2C_N_STEPS = 16
#: DQN's ``train_freq`` (SB3's default: an update every 4 steps per environment)
DQN_TRAIN_FREQ = 4
#: DQN's warm-up: environment steps (of random actions, filling the replay buffer) before it learns;
#: a resumed DQN run (whose replay buffer starts empty) warms up again
DQN_LEARNING_STARTS = 1_000
#: seeds also go to numpy's legacy seeding (``np.random.seed``), which takes 32-bit values
MAX_SEED = 2**32 - 1


class TrainConfigError(ValueError):
    """Training options that cannot be used: a bad hyper-parameter, an ``--out`` that is a file, no traces."""


class TrainingDiverged(RuntimeError):
    """The network's weights became NaN / inf during training (e.g. a learning rate far too large).
    Nothing is saved from then on: ``OUT/last`` and ``OUT/best`` stay the last finite networks."""


def _check_finite(model, what: str) -> None:
    """:class:`TrainingDiverged` naming the tensors of ``model``'s policy that are not finite, if any."""
    import torch

    bad = [k for k, v in model.policy.state_dict().items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise _diverged(model, f"{bad[0]}{more} holds NaN/inf, so {what} is not saved")


def _diverged(model, why: str) -> TrainingDiverged:
    return TrainingDiverged(
        f"training diverged by step {int(model.num_timesteps)}: {why}; the run's last and best checkpoints are "
        "its last usable networks. Lower --lr and start a new run (--overwrite), or --resume from last"
    )


@dataclass
class TrainConfig:
    """Everything that defines a training run (stored in the checkpoint metadata)."""

    algo: str = "maskable-ppo"
    cluster: str = "4x8"
    reward: str = "jct-rel"
    w1: float = 0.4
    timesteps: int = 50_000
    n_envs: int = 2
    seed: int = 0
    net_arch: tuple[int, ...] = (64, 64)
    learning_rate: float = 3e-4
    n_steps: int = 512
    batch_size: int = 128
    n_epochs: int = 4
    gamma: float = 1.0
    ent_coef: float = 0.01
    eval_freq: int = 5_000
    round_len: float = 300.0
    k: int = 6
    #: candidate order of the observation (:class:`policies.codecs.deepshare.ObsSpec`): ``"plan"`` (the
    #: shipped networks'), ``"fill"`` or ``"area"``
    order: str = "plan"
    #: aging time constant of the candidate order (s; :attr:`policies.codecs.deepshare.ObsSpec.aging_s`)
    aging_s: float = AGING_S
    #: start from this checkpoint's weights (same algorithm and observation shape; the candidate
    #: order may differ) instead of the prior initialisation; step count and optimiser start fresh
    init: str | None = None
    prior_init: bool = True
    prior_scale: float = 1.0
    #: ``"admission"``: logits = network + :class:`policies.prior.AdmissionPrior` (maskable-ppo only);
    #: ``"bias"``: no prior term, the output bias starts at ``-prior_scale * index``.
    #: ``None``: ``"admission"`` for maskable-ppo, ``"bias"`` for the others.
    prior: str | None = None
    prior_theta: float = 0.8
    traces: list[str] = field(default_factory=list)
    val_traces: list[str] = field(default_factory=list)
    #: a peer simulator's rules to train under (:data:`policies.compat.COMPAT_NAMES`, ``--compat``):
    #: episodes, references and validation run by them and the codec offers only their placements;
    #: ``None``: rlsched's own rules
    compat: str | None = None


# ---------------------------------------------------------------------- weights
def _layer_names(algo: str, model) -> tuple[list[str], str]:
    sd = model.policy.state_dict()
    if algo == "dqn":
        idx = sorted({int(k.split(".")[2]) for k in sd if k.startswith("q_net.q_net.") and k.endswith(".weight")})
        return [f"q_net.q_net.{i}" for i in idx], "relu"
    idx = sorted(
        {int(k.split(".")[2]) for k in sd if k.startswith("mlp_extractor.policy_net.") and k.endswith(".weight")}
    )
    return [f"mlp_extractor.policy_net.{i}" for i in idx] + ["action_net"], "tanh"


def export_tensors(model) -> dict[str, np.ndarray]:
    """All tensors of an SB3 policy as float32 numpy arrays (for safetensors)."""
    return {k: v.detach().cpu().numpy().astype(np.float32) for k, v in model.policy.state_dict().items()}


def admission_prior(cfg: TrainConfig) -> AdmissionPrior | None:
    """The prior the run's policy adds to its logits (``None`` without one)."""
    kind = cfg.prior or ("admission" if cfg.algo == "maskable-ppo" else "bias")
    if kind == "admission":
        if cfg.algo != "maskable-ppo":
            raise ValueError(f"the admission prior needs --algo maskable-ppo (got {cfg.algo}); use --prior bias")
        return AdmissionPrior(cfg.prior_theta, cfg.prior_scale)
    if kind == "bias":
        return None
    raise ValueError(f"unknown prior {cfg.prior!r}; choose admission or bias")


# ---------------------------------------------------------------------- validation
#: the command-line option of a :class:`TrainConfig` field, for messages
_FLAGS = {
    "algo": "--algo",
    "reward": "--reward",
    "w1": "--w1",
    "timesteps": "--timesteps",
    "n_envs": "--n-envs",
    "seed": "--seed",
    "net_arch": "--net-arch",
    "learning_rate": "--lr",
    "gamma": "--gamma",
    "ent_coef": "--ent-coef",
    "eval_freq": "--eval-freq",
    "order": "--order",
    "aging_s": "--aging",
    "init": "--init",
    "prior": "--prior",
    "prior_scale": "--prior-scale",
    "prior_theta": "--prior-theta",
    "compat": "--compat",
}


def _flag(name: str) -> str:
    return _FLAGS.get(name, name)


def train_command(cfg: TrainConfig, out: str | Path, resume: bool = False) -> str:
    """The ``rlsched train`` command line of ``cfg`` into ``out``, every option that has one written out.

    Defaults are written too, so the line keeps meaning the same run when a default changes
    (``--aging`` did). Fields without an option (``n_steps``, ``batch_size``, ``n_epochs``,
    ``round_len``, ``k``) are left out: they are in ``training.config``. Trace directories and
    ``--out`` are written absolute. ``resume``: the command of a resumed segment (``--resume``;
    ``--no-prior-init`` is then the run's own setting and is left out).
    """
    words = ["rlsched", "train"]
    for name, flag in _FLAGS.items():
        v = getattr(cfg, name)
        if name == "prior" and v is None:  # the kind this algorithm gets (admission_prior)
            v = "admission" if cfg.algo == "maskable-ppo" else "bias"
        if v is None or (name == "w1" and cfg.reward != "seed"):
            continue
        if name == "net_arch":
            v = ",".join(str(int(x)) for x in v)
        elif name == "init":
            v = os.path.abspath(v)
        words += [flag, str(v)]
    words += ["--cluster", cfg.cluster]
    for d in cfg.traces:
        words += ["--traces", os.path.abspath(d)]
    for d in cfg.val_traces:
        words += ["--val-traces", os.path.abspath(d)]
    if not cfg.prior_init and not resume:
        words.append("--no-prior-init")
    words += ["--out", os.path.abspath(out)]
    if resume:
        words.append("--resume")
    return " ".join(shlex.quote(w) for w in words)


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _is_real(v: Any) -> bool:
    """A finite int or float (not a bool); ``False`` also for an int too large for a float."""
    if not isinstance(v, (int, float, np.integer, np.floating)) or isinstance(v, bool):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:  # an int beyond float range
        return False


def check_config(cfg: TrainConfig) -> ClusterSpec:
    """Validate every option of ``cfg`` (nothing is run); returns the parsed cluster.

    :raises TrainConfigError: naming the first bad option (its command-line flag where it has one).
    :raises ClusterSpecError: for a bad ``cfg.cluster``.
    """

    def bad(name: str, want: str) -> TrainConfigError:
        return TrainConfigError(f"{_flag(name)} must be {want}, got {getattr(cfg, name)!r}")

    if cfg.algo not in ALGOS:
        raise bad("algo", f"one of {', '.join(ALGOS)}")
    if cfg.reward not in REWARDS:
        raise bad("reward", f"one of {', '.join(REWARDS)}")
    if cfg.order not in CANDIDATE_ORDERS:
        raise bad("order", f"one of {', '.join(CANDIDATE_ORDERS)}")
    if not _is_real(cfg.aging_s) or not MIN_AGING_S <= cfg.aging_s <= MAX_AGING_S:
        raise bad("aging_s", f"a number of seconds in [{MIN_AGING_S:g}, {MAX_AGING_S:g}] (what a checkpoint may hold)")
    if cfg.prior not in (None, "admission", "bias"):
        raise bad("prior", "admission or bias")
    for name in ("timesteps", "n_envs", "eval_freq", "n_steps", "batch_size", "n_epochs", "k"):
        if not _is_int(getattr(cfg, name)) or getattr(cfg, name) < 1:
            raise bad(name, "a positive integer")
    if not _is_int(cfg.seed) or not 0 <= cfg.seed <= MAX_SEED:
        raise bad("seed", "an integer in [0, 2**32 - 1]")
    arch = cfg.net_arch
    if not isinstance(arch, (tuple, list)) or not arch or not all(_is_int(x) and x >= 1 for x in arch):
        raise bad("net_arch", "one or more positive layer sizes")
    if not _is_real(cfg.learning_rate) or cfg.learning_rate <= 0:
        raise bad("learning_rate", "a finite number > 0")
    if not _is_real(cfg.ent_coef) or cfg.ent_coef < 0:
        raise bad("ent_coef", "a finite number >= 0")
    if not _is_real(cfg.gamma) or not 0.0 <= cfg.gamma <= 1.0:
        raise bad("gamma", "a discount in [0, 1]")
    if not _is_real(cfg.w1) or not 0.0 <= cfg.w1 <= 1.0:
        raise bad("w1", "in [0, 1]")
    if not _is_real(cfg.round_len) or cfg.round_len <= 0:
        raise bad("round_len", "a finite number > 0")
    if not _is_real(cfg.prior_theta) or not 0.0 <= cfg.prior_theta <= 1.0:
        raise bad("prior_theta", "in [0, 1]")
    if not _is_real(cfg.prior_scale) or cfg.prior_scale <= 0:
        raise bad("prior_scale", "a finite number > 0")
    if cfg.init is not None and (not isinstance(cfg.init, (str, Path)) or not str(cfg.init)):
        raise bad("init", "a checkpoint path")
    if cfg.prior == "admission" and cfg.algo != "maskable-ppo":
        raise TrainConfigError(f"--prior admission needs --algo maskable-ppo (got {cfg.algo}); use --prior bias")
    if cfg.compat is not None:
        from policies.compat import COMPAT_NAMES

        if cfg.compat not in COMPAT_NAMES:
            raise bad("compat", f"one of {', '.join(COMPAT_NAMES)}")
        if cfg.round_len != compat_mode(cfg.compat).round_len:
            raise bad("round_len", f"the {cfg.compat} mode's round length, {compat_mode(cfg.compat).round_len:g} s")
    try:
        admission_prior(cfg)
    except (PriorError, ValueError) as exc:  # the checks above leave nothing for these; kept as a net
        raise TrainConfigError(f"bad prior settings: {exc}") from None
    cluster = ClusterSpec.parse(cfg.cluster)
    if cfg.compat is not None:
        try:
            compat_mode(cfg.compat).check_cluster(cluster)
        except CompatError as exc:
            raise TrainConfigError(str(exc)) from None
    return cluster


def rollout_steps(cfg: TrainConfig) -> int:
    """Environment steps of one SB3 rollout: ``learn`` runs whole rollouts, so a run's step count is rounded up
    to a multiple of this (counted from its start; ``n_steps x n_envs`` for the on-policy algorithms)."""
    per_env = {"maskable-ppo": cfg.n_steps, "ppo": cfg.n_steps, "a2c": A2C_N_STEPS, "dqn": DQN_TRAIN_FREQ}[cfg.algo]
    return per_env * cfg.n_envs


def _hidden_sizes(ck: Checkpoint) -> tuple[int, ...]:
    """Hidden layer sizes of a checkpoint's policy network (``MLPNet`` keeps ``W`` as ``(in, out)``)."""
    return tuple(int(W.shape[1]) for W, _b in ck.net.layers[:-1])


def _arch_text(sizes: Sequence[int]) -> str:
    return ",".join(str(int(x)) for x in sizes) or "(no hidden layers)"


def _cluster_text(c: ClusterSpec) -> str:
    return c.describe() if c.is_homogeneous else f"nodes of {','.join(str(n.gpus) for n in c.nodes)} GPUs"


def _model_tensor_shapes(cfg: TrainConfig, spec: ObsSpec) -> dict[str, tuple[int, ...]]:
    """Name and shape of every tensor of the SB3 policy :func:`_make_model` builds for ``cfg`` (its
    ``state_dict``, which :func:`_load_weights` fills), derived without building it: MLPs of ``cfg.net_arch``
    (``Linear`` and activation modules alternate; a ``Linear`` weight is ``(out, in)``) for the policy and
    the value (the on-policy algorithms) or for the Q-network and its target copy (DQN)."""
    hidden = [math.prod(spec.shape), *(int(x) for x in cfg.net_arch)]

    def mlp(prefix: str, sizes: Sequence[int]) -> dict[str, tuple[int, ...]]:
        out: dict[str, tuple[int, ...]] = {}
        for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:])):
            out[f"{prefix}.{2 * i}.weight"], out[f"{prefix}.{2 * i}.bias"] = (n_out, n_in), (n_out,)
        return out

    if cfg.algo == "dqn":
        q = [*hidden, spec.n_actions]
        return {**mlp("q_net.q_net", q), **mlp("q_net_target.q_net", q)}
    return {
        **mlp("mlp_extractor.policy_net", hidden),
        **mlp("mlp_extractor.value_net", hidden),
        "action_net.weight": (spec.n_actions, hidden[-1]),
        "action_net.bias": (spec.n_actions,),
        "value_net.weight": (1, hidden[-1]),
        "value_net.bias": (1,),
    }


def _stored_tensor_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Name and shape of every tensor of a safetensors file, from its header (no tensor is read)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="np") as f:
        return {k: tuple(int(n) for n in f.get_slice(k).get_shape()) for k in f.keys()}


def _check_init_tensors(src: Checkpoint, cfg: TrainConfig, spec: ObsSpec) -> None:
    """Refuse an ``--init`` checkpoint whose weights are not exactly the tensors of this run's network (names
    and shapes), which :func:`_load_weights` would find only once the model is built. A shipped checkpoint
    (``policies/checkpoints``) keeps only the policy layers: no value network (no DQN target network)."""
    want, have = _model_tensor_shapes(cfg, spec), _stored_tensor_shapes(src.weights_path)
    missing = [k for k in want if k not in have]
    if missing:
        policy = {f"{p}.{x}" for p in src.meta["network"]["layers"] for x in ("weight", "bias")}
        hint = (
            "; it holds only the policy network, as a shipped checkpoint does: start from a training run's "
            "OUT/best or OUT/last"
            if set(have) == policy
            else ""
        )
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise CheckpointError(f"--init {cfg.init}: the weights lack {missing[0]}{more} of this run's network{hint}")
    extra = [k for k in have if k not in want]
    if extra:
        raise CheckpointError(
            f"--init {cfg.init}: the weights hold {extra[0]}, which this run's network does not have"
        )
    for k, shape in want.items():
        if have[k] != shape:
            raise CheckpointError(
                f"--init {cfg.init}: tensor {k} has shape {list(have[k])}, this run's network needs {list(shape)}"
            )


def _check_out_dir(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise TrainConfigError(f"--out {out} exists and is not a directory")
    why = unwritable(out)
    if why is not None:
        raise TrainConfigError(f"--out {out}: {why}")


def _check_resume(last: Checkpoint, cfg: TrainConfig, cluster: ClusterSpec, spec: ObsSpec) -> None:
    """Refuse to continue ``last`` with settings that define another run; the message names the value to
    pass (the run's own), whichever side is the default."""

    def differs(setting: str, ours: Any, theirs: Any, fix: str | None = None) -> CheckpointError:
        fix = fix or f"pass {setting} {theirs}"
        return CheckpointError(
            f"{last.json_path}: the run was trained with {setting} {theirs}, not {ours}; --resume continues a run "
            f"with its own settings ({fix}, or start a new run with --overwrite or another --out)"
        )

    if last.meta.get("algo") != cfg.algo:
        raise differs("--algo", cfg.algo, last.meta.get("algo"))
    if [n.gpus for n in last.cluster.nodes] != [n.gpus for n in cluster.nodes]:
        fix = None if last.cluster.is_homogeneous else "pass a --cluster file with the run's nodes"
        raise differs("--cluster", _cluster_text(cluster), _cluster_text(last.cluster), fix)
    for bw in ("intra_bw_gbps", "inter_bw_gbps"):
        if getattr(last.cluster, bw) != getattr(cluster, bw):
            theirs = getattr(last.cluster, bw)
            fix = f"pass a --cluster with {bw} {theirs}"
            raise differs(f"a --cluster with {bw}", getattr(cluster, bw), theirs, fix)
    last.check_cluster(cluster)  # the observation encoding's version
    if last.spec.order != spec.order:
        raise differs("--order", spec.order, last.spec.order)
    if last.spec.aging_s != spec.aging_s:
        # a config without aging_s was trained with LEGACY_AGING_S (1800 s), not the default: name the value to pass
        raise differs("--aging", f"{spec.aging_s:g} s", f"{last.spec.aging_s:g} s", f"pass --aging {last.spec.aging_s:g}")
    if last.spec.k != spec.k:
        raise differs("k (candidates)", spec.k, last.spec.k, f"use k={last.spec.k}")
    if _hidden_sizes(last) != tuple(cfg.net_arch):
        raise differs("--net-arch", _arch_text(cfg.net_arch), _arch_text(_hidden_sizes(last)))
    rew = last.meta.get("reward") or {}
    if rew.get("kind") != cfg.reward:
        raise differs("--reward", cfg.reward, rew.get("kind"))
    if cfg.reward == "seed" and rew.get("w1") != cfg.w1:
        raise differs("--w1", cfg.w1, rew.get("w1"))
    theirs, ours = last.prior, admission_prior(cfg)
    if (theirs is None) != (ours is None):
        kind = {True: "bias", False: "admission"}
        raise differs("--prior", kind[ours is None], kind[theirs is None])
    if theirs is not None and ours is not None:
        if theirs.theta != ours.theta:
            raise differs("--prior-theta", ours.theta, theirs.theta)
        if theirs.scale != ours.scale:
            raise differs("--prior-scale", ours.scale, theirs.scale)
    # the seed: a resumed segment draws from (seed, steps done), :func:`segment_seed`; a run that does not
    # record its seed (or records a malformed one) is not checked
    run_cfg = last.meta["training"].get("config")
    run_seed = run_cfg.get("seed") if isinstance(run_cfg, dict) else None
    if _is_int(run_seed) and run_seed != cfg.seed:
        raise differs("--seed", cfg.seed, run_seed)
    run_compat = run_cfg.get("compat") if isinstance(run_cfg, dict) else None
    if run_compat != cfg.compat:
        raise differs("--compat", cfg.compat or "(none)", run_compat or "(none)",
                      f"pass --compat {run_compat}" if run_compat else "drop --compat")


def _check_resume_val_traces(last: Checkpoint, cfg: TrainConfig, val_traces: Sequence[Sequence[JobSpec]]) -> None:
    """Refuse to continue ``last`` on another validation set (its best score was measured on the run's own):
    compared by content (:func:`traces_fingerprint`, ``training.val_traces_sha256``; a run that does not
    record it is not checked)."""
    training = last.meta["training"]
    if "val_traces_sha256" not in training:
        return
    theirs = training.get("val_traces_sha256")
    ours = traces_fingerprint(val_traces) if val_traces else None
    if theirs == ours:
        return
    run_cfg = training.get("config")
    paths = run_cfg.get("val_traces") if isinstance(run_cfg, dict) else None
    paths = paths if isinstance(paths, list) else []

    def what(sha: str | None, names: Sequence[str]) -> str:
        if sha is None:
            return "no validation traces"
        return f"validation traces {', '.join(str(n) for n in names) or '(unnamed)'} (sha256 {sha})"

    fix = "pass the run's --val-traces" if theirs is not None else "drop --val-traces"
    raise CheckpointError(
        f"{last.json_path}: the run was trained with {what(theirs, paths)}, not {what(ours, cfg.val_traces)}; --resume "
        f"continues a run with its own settings ({fix}, or start a new run with --overwrite or another --out)"
    )


def segment_seed(seed: int, start_steps: int) -> int:
    """The seed of a run's segment that starts at ``start_steps``: ``seed`` itself for a new run, else one
    drawn from both (``numpy.random.SeedSequence``), so a resumed segment plays other episodes (and other
    exploration) than the run's start; in [0, 2**32 - 1] like ``--seed``."""
    if start_steps == 0:
        return int(seed)
    return int(np.random.SeedSequence([int(seed), int(start_steps)]).generate_state(1, np.uint32)[0])


def _read_eval_log(path: Path) -> list[dict[str, float]]:
    """``eval.csv`` of a run to resume; a damaged one is an error (not a traceback half-way through)."""
    if not path.is_file():
        return []
    try:
        with path.open(newline="", encoding="utf-8") as f:
            # an empty cell: a column that some rows lack (e.g. val_rel_jct in rows written without it)
            rows = [{k: float(v) for k, v in r.items() if v != ""} for r in csv.DictReader(f)]
        if any("timesteps" not in r for r in rows):  # (missing or extra cells fail float() above)
            raise ValueError("a row has no timesteps")
    except (OSError, UnicodeDecodeError, csv.Error, ValueError, TypeError) as exc:
        raise CheckpointError(
            f"{path}: cannot read the run's evaluation log ({exc}); repair or delete it to resume"
        ) from None
    return rows


def _rows_up_to(rows: list[dict[str, float]], steps: int) -> list[dict[str, float]]:
    """The evaluation rows that belong to a run resumed from ``steps``: those of ``steps`` or fewer (a row
    past ``last`` is from a segment whose checkpoint was never saved, e.g. an interrupt), one per step (the
    later row of a repeated step: the one the checkpoints continue), in step order."""
    by_step: dict[float, dict[str, float]] = {}
    for r in rows:
        if r["timesteps"] <= steps:
            by_step.pop(r["timesteps"], None)
            by_step[r["timesteps"]] = r
    return sorted(by_step.values(), key=lambda r: r["timesteps"])


@dataclass
class RunPlan:
    """What :func:`check_run` found: the parsed cluster and what the run starts from."""

    cluster: ClusterSpec
    spec: ObsSpec
    init: Checkpoint | None = None
    last: Checkpoint | None = None
    start_steps: int = 0
    #: the evaluation log of the run to resume, up to ``last``'s steps (:func:`_rows_up_to`)
    eval_rows: list[dict[str, float]] = field(default_factory=list)
    #: rows of ``OUT/eval.csv`` that :attr:`eval_rows` leaves out (the resumed run rewrites the log)
    dropped_rows: int = 0
    #: the run's ``best`` checkpoint (resume; ``None`` if it has none)
    best: Checkpoint | None = None


def check_run(cfg: TrainConfig, out: str | Path, resume: bool = False, overwrite: bool = False) -> RunPlan:
    """Everything :func:`train` checks before doing any work or deleting anything: the options
    (:func:`check_config`), ``out`` (a directory; a run there only with ``resume`` or ``overwrite``), the
    ``init`` checkpoint (algorithm, cluster, observation and network shape, every tensor the run's model
    loads: :func:`_check_init_tensors`; not with ``resume``) and, with ``resume``, the run's
    ``last`` checkpoint (the same settings, :func:`_check_resume`), its ``best`` checkpoint and its evaluation
    log. Reads only. (The validation traces, which are not read yet, are compared in :func:`train`.)

    :raises TrainConfigError: bad options or ``out``.
    :raises CheckpointError: an unusable ``init`` checkpoint or run to resume.
    """
    cluster = check_config(cfg)
    if resume and cfg.init:
        raise TrainConfigError(
            f"--init {cfg.init} starts a new run from a checkpoint's weights and --resume continues the run in "
            f"{out} from its last checkpoint: give one of them"
        )
    out = Path(out)
    _check_out_dir(out)
    spec = ObsSpec.for_cluster(cluster, cfg.k, cfg.order, cfg.aging_s)
    plan = RunPlan(cluster, spec)
    if resume:
        if not (out / "last.json").is_file():
            raise CheckpointError(f"{out / 'last.json'}: nothing to resume (no previous run in {out})")
    elif any(f.exists() for f in _run_files(out)) and not overwrite:
        raise CheckpointError(
            f"{out} already holds a training run: --resume continues it, --overwrite starts over (and "
            "deletes its checkpoints), or choose another --out"
        )
    if cfg.init:
        src = plan.init = load_checkpoint(cfg.init)
        if src.meta.get("algo") != cfg.algo:
            raise CheckpointError(f"--init {cfg.init}: was trained with {src.meta.get('algo')}, not {cfg.algo}")
        if src.spec.shape != spec.shape or src.spec.n_actions != spec.n_actions:
            raise CheckpointError(
                f"--init {cfg.init}: observation {list(src.spec.shape)} / {src.spec.n_actions} actions, "
                f"this run needs {list(spec.shape)} / {spec.n_actions}"
            )
        try:
            src.check_cluster(cluster)
        except CheckpointError as exc:
            raise CheckpointError(f"--init {exc}") from None
        if _hidden_sizes(src) != tuple(cfg.net_arch):
            raise CheckpointError(
                f"--init {cfg.init}: network has hidden layers {_arch_text(_hidden_sizes(src))}, "
                f"this run's --net-arch is {_arch_text(cfg.net_arch)}"
            )
        _check_init_tensors(src, cfg, spec)  # e.g. a shipped checkpoint (no value network)
        theirs, ours = src.prior, admission_prior(cfg)
        if (theirs is None) != (ours is None):
            # the network learnt logits meant to be added to the prior, or to stand alone: the other way
            # round it would start from a policy it was never trained as
            kind = {True: "bias", False: "admission"}
            raise CheckpointError(
                f"--init {cfg.init}: was trained with --prior {kind[theirs is None]}, this run uses --prior "
                f"{kind[ours is None]}; pass --prior {kind[theirs is None]}"
            )
        if theirs is not None and ours is not None and (theirs.theta, theirs.scale) != (ours.theta, ours.scale):
            log.warning(
                "--init %s was trained with --prior-theta %g --prior-scale %g; this run uses %g and %g",
                cfg.init, theirs.theta, theirs.scale, ours.theta, ours.scale,
            )
    if resume:
        last = plan.last = load_checkpoint(out / "last")
        _check_resume(last, cfg, cluster, spec)
        steps = last.meta["training"].get("timesteps", 0)
        if not _is_int(steps) or steps < 0:
            raise CheckpointError(f"{last.json_path}: training.timesteps {steps!r} is not a step count")
        plan.start_steps = int(steps)
        rows = _read_eval_log(out / "eval.csv")
        plan.eval_rows = _rows_up_to(rows, plan.start_steps)
        plan.dropped_rows = len(rows) - len(plan.eval_rows)
        if (out / STATE_NAME).is_file():
            read_train_state(out / STATE_NAME)  # a damaged one is refused now, not after building the run
        if (out / "best.json").is_file():
            # its score is the one to beat (not the log's: a row may be of a network that was never saved)
            try:
                plan.best = load_checkpoint(out / "best")
            except CheckpointError as exc:
                raise CheckpointError(
                    f"cannot resume: the run's best checkpoint does not load ({exc}); repair it, or delete "
                    f"{out / 'best.json'} and {out / 'best.safetensors'} (the resumed run selects a new best)"
                ) from None
    return plan


def _run_files(out: Path) -> list[Path]:
    """The files of a run in ``out`` that a new run replaces (``tb/`` logs are kept)."""
    return [out / f"{n}{x}" for n in ("best", "last") for x in (".json", ".safetensors")] + [
        out / STATE_NAME,
        out / "eval.csv",
        out / "summary.json",
    ]


def _load_weights(model, ck: Checkpoint, what: str) -> None:
    """Load ``ck``'s tensors into the SB3 model; a mismatch is a :class:`CheckpointError`, not a torch traceback."""
    import torch
    from safetensors.numpy import load_file

    sd = {k: torch.from_numpy(v.copy()) for k, v in load_file(str(ck.weights_path)).items()}
    try:
        model.policy.load_state_dict(sd)
    except RuntimeError as e:
        detail = " ".join(str(e).split())  # torch's message spans lines: keep the error to one
        if len(detail) > 300:
            detail = detail[:300] + " ..."
        raise CheckpointError(f"{what}: weights do not fit this run's network ({detail})") from None


def inference_net(algo: str, model) -> MLPNet:
    """The numpy network :class:`RLPolicy` would run for ``model`` now."""
    layers, act = _layer_names(algo, model)
    t = export_tensors(model)
    return MLPNet([(t[p + ".weight"], t[p + ".bias"]) for p in layers], act)


def evaluate_net(
    net: MLPNet,
    cluster: ClusterSpec,
    perf: ContentionModel,
    traces: Sequence[Sequence[JobSpec]],
    hybrid: bool = False,
    round_len: float = 300.0,
    k: int = 6,
    prior: AdmissionPrior | None = None,
    order: str = "area",
    aging_s: float = AGING_S,
    compat: CompatMode | None = None,
) -> list[float]:
    """Average JCT (s, with queueing) of ``net`` as rl-base (or rl-hybrid) on each trace, via the full
    simulator; under ``compat`` by the mode's rules (:func:`policies.compat.adapt_policy`; ``perf`` must have
    the mode's contention rule)."""
    codec = DeepShareCodec(cluster, perf, ObsSpec.for_cluster(cluster, k, order, aging_s))
    out = []
    for jobs in traces:
        pol = adapt_policy(RLPolicy(net, codec, hybrid=hybrid, prior=prior), compat)
        res = Simulator(cluster, jobs, pol, perf, SimConfig(round_len=round_len, compat=compat)).run()
        out.append(float(np.mean([r.jct for r in res.jobs])))
    return out


# ---------------------------------------------------------------------- training
def _make_model(cfg: TrainConfig, venv, tb: str | None, seed: int | None = None, start_steps: int = 0):
    """The SB3 model of ``cfg`` on ``venv``, seeded with ``seed`` (default ``cfg.seed``; a resumed run
    passes :func:`segment_seed`). A DQN resumed at ``start_steps`` warms its (new, empty) replay buffer up
    again: learning starts :data:`DQN_LEARNING_STARTS` steps after ``start_steps``."""
    import torch

    if cfg.algo == "maskable-ppo":
        from sb3_contrib import MaskablePPO as Algo
    elif cfg.algo == "ppo":
        from stable_baselines3 import PPO as Algo
    elif cfg.algo == "a2c":
        from stable_baselines3 import A2C as Algo
    elif cfg.algo == "dqn":
        from stable_baselines3 import DQN as Algo
    else:
        raise ValueError(f"unknown algo {cfg.algo!r}; choose from {', '.join(ALGOS)}")
    arch = list(cfg.net_arch)
    common: dict[str, Any] = {
        "learning_rate": cfg.learning_rate,
        "gamma": cfg.gamma,
        "seed": cfg.seed if seed is None else seed,
        "verbose": 0,
        "tensorboard_log": tb,
        "device": "cpu",
    }
    if admission_prior(cfg) is not None:
        from trainer.prior_policy import MaskablePriorPolicy, PriorFlattenExtractor

        spec = venv.get_attr("spec_obs", [0])[0]
        return Algo(
            MaskablePriorPolicy,
            venv,
            n_steps=cfg.n_steps,
            batch_size=cfg.batch_size,
            n_epochs=cfg.n_epochs,
            ent_coef=cfg.ent_coef,
            policy_kwargs={
                "net_arch": {"pi": arch, "vf": arch},
                "activation_fn": torch.nn.Tanh,
                "features_extractor_class": PriorFlattenExtractor,
                "features_extractor_kwargs": {
                    "ks": spec.k * spec.options,
                    "theta": cfg.prior_theta,
                    "scale": cfg.prior_scale,
                },
            },
            **common,
        )
    if cfg.algo in ("maskable-ppo", "ppo"):
        return Algo(
            "MlpPolicy",
            venv,
            n_steps=cfg.n_steps,
            batch_size=cfg.batch_size,
            n_epochs=cfg.n_epochs,
            ent_coef=cfg.ent_coef,
            policy_kwargs={"net_arch": {"pi": arch, "vf": arch}, "activation_fn": torch.nn.Tanh},
            **common,
        )
    if cfg.algo == "a2c":
        return Algo(
            "MlpPolicy",
            venv,
            n_steps=16,
            ent_coef=cfg.ent_coef,
            policy_kwargs={"net_arch": {"pi": arch, "vf": arch}, "activation_fn": torch.nn.Tanh},
            **common,
        )
    return Algo(
        "MlpPolicy",
        venv,
        buffer_size=50_000,
        learning_starts=start_steps + DQN_LEARNING_STARTS,
        batch_size=cfg.batch_size,
        exploration_fraction=0.3,
        target_update_interval=1_000,
        policy_kwargs={"net_arch": arch},
        **common,
    )


def _init_prior(algo: str, model, scale: float = 1.0, admission: bool = False) -> None:
    """Start from the prior: output weights x 0.01 and an output bias of 0 (``admission``: the
    policy's prior term carries the preference) or ``-scale * index`` (``bias``).

    The initial deterministic policy is then the prior's: ``rl-prior`` (with
    the admission prior) or the lowest valid action (with the bias prior;
    candidate 0 on the first option that fits, "nothing", the last index,
    least preferred), and training refines it. Plain SB3 modules are edited in
    place before learning starts.
    """
    import torch

    head = model.policy.q_net.q_net[-1] if algo == "dqn" else model.policy.action_net
    with torch.no_grad():
        head.weight.mul_(0.01)
        if admission:  # the prior term carries the preference; the network starts near 0
            head.bias.zero_()
        else:
            head.bias.copy_(-scale * torch.arange(head.bias.numel(), dtype=head.bias.dtype))
    if algo == "dqn":
        model.policy.q_net_target.load_state_dict(model.policy.q_net.state_dict())


def traces_fingerprint(traces: Sequence[Sequence[JobSpec]]) -> str:
    """SHA-256 (hex) of the job sets' scheduling fields, in order: equal for the same traces
    however they are stored or named (``extra`` columns are not part of it)."""
    h = hashlib.sha256()
    for i, jobs in enumerate(traces):
        h.update(f"set {i} {len(jobs)}\n".encode())
        for j in jobs:
            h.update(f"{j.job_id}\t{j.submit_time!r}\t{j.model}\t{j.gpu_demand}\t{j.total_samples!r}\n".encode())
    return h.hexdigest()


def source_revision() -> dict[str, Any] | None:
    """The git commit of the code that runs, ``{"commit": sha, "dirty": bool}`` (``dirty``: tracked
    files differ from it), or ``None`` when the code is not the top of a git checkout (an installed
    copy) or git is missing."""
    root = Path(__file__).resolve().parent.parent
    try:
        # the checkout must be this code's own (not, say, a project repository around an installed copy)
        top = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--show-toplevel"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        if not top or Path(top).resolve() != root:
            return None
        sha = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": sha, "dirty": bool(dirty)} if sha else None


def _save(
    path: Path, cfg: TrainConfig, model, cluster: ClusterSpec, env: PlacementEnv, extra: dict, mode: str = "rl-base"
) -> Path:
    _check_finite(model, path.name)
    layers, act = _layer_names(cfg.algo, model)
    # the compat mode (or None) also at the top of the training section: a checkpoint trained under a peer's
    # rules says so where `rlsched evaluate` / peers.py readers look first
    training = {"config": asdict(cfg), "compat": cfg.compat, "timesteps": int(model.num_timesteps), **extra}
    try:
        return save_checkpoint(
            path,
            export_tensors(model),
            algo=cfg.algo,
            mode=mode,
            cluster=cluster,
            spec=env.spec_obs,
            codec=env.codec.name,
            layers=layers,
            activation=act,
            reward={"kind": cfg.reward, "w1": cfg.w1, "w2": round(1.0 - cfg.w1, 6)},
            training=training,
            prior=admission_prior(cfg),
        )
    except CheckpointError as exc:  # finite weights so large that the logits could overflow float32
        raise _diverged(model, str(exc)) from None


#: the lock file a training run holds in its ``--out`` (:func:`_run_lock`)
LOCK_NAME = ".lock"
#: the columns of ``OUT/eval.csv``
EVAL_COLUMNS = ("timesteps", "val_avg_jct_s", "val_rel_jct", "wall_s")


@contextlib.contextmanager
def _run_lock(out: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``OUT/.lock`` (creating ``out``) while a run works there: a second
    ``train`` into the same ``out`` is refused instead of mixing its files with the first's. The lock file
    stays (removing it would race with a run that opened it); a directory this call created is removed again
    if the run left nothing else in it (it failed before writing)."""
    import fcntl

    created = [p for p in (out, *out.parents) if not p.exists()]
    out.mkdir(parents=True, exist_ok=True)
    path = out / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise TrainConfigError(
                f"--out {out} is in use by another training run (it holds the lock {path}); wait for it to finish "
                "or choose another --out"
            ) from None
        try:
            yield
        finally:
            if created and [p.name for p in out.iterdir()] == [LOCK_NAME]:
                try:
                    path.unlink()
                    for d in created:  # out, then the parents this call made
                        d.rmdir()
                except OSError:
                    pass
    finally:
        os.close(fd)


def train(
    cfg: TrainConfig,
    train_traces: Sequence[Sequence[JobSpec]],
    val_traces: Sequence[Sequence[JobSpec]],
    out: str | Path,
    resume: bool = False,
    progress: Callable[[int, int], None] | None = None,
    overwrite: bool = False,
    episodes: Callable[[int, float], None] | None = None,
) -> dict:
    """Train, evaluate periodically, keep the best; returns a summary dict (also ``OUT/summary.json``).

    The run holds ``OUT/.lock`` (:func:`_run_lock`) while it works: a second run into ``out`` is refused.

    :param resume: continue the run in ``out`` from its ``last`` checkpoint (with the run's own settings,
        seed and validation traces; the resumed segment's random streams are seeded with
        :func:`segment_seed`, so it plays other episodes than the run's first steps).
    :param overwrite: start a new run in ``out`` even if it holds one (its checkpoints, evaluation
        log and summary are removed once the new run is built and its starting weights are loaded);
        without it, or ``resume``, an existing run is an error.
    :param progress: called as ``progress(steps done, steps in all)`` every 64 environment steps or
        so and once at the end (steps counted from 0, a resumed run starting where it left off; "in
        all" is ``cfg.timesteps`` rounded up to whole rollouts, :func:`rollout_steps`), e.g. to drive a
        progress bar.
    :param episodes: called as ``episodes(episodes finished, that episode's return)`` when an episode of
        any training environment ends (the count from 0 in this segment; the return is the raw reward sum
        of the episode, before :class:`~stable_baselines3.common.vec_env.VecNormalize`, as SB3's ``Monitor``
        records it), e.g. for the progress bar's episode count and last reward.
    :raises TrainConfigError, CheckpointError: from :func:`check_run` and the validation traces' check,
        before any work; a :class:`TrainConfigError` if another run holds ``out``.
    """
    out = Path(out)
    # 1. check everything (options, --out, --init, the run to resume) before any work (or creating --out)
    plan = check_run(cfg, out, resume=resume, overwrite=overwrite)
    if not train_traces:
        raise TrainConfigError("no training traces")
    if cfg.compat is not None:  # every job must be one the mode places (one line naming the first that is not)
        mode = compat_mode(cfg.compat)
        for what, sets in (("training", train_traces), ("validation", val_traces)):
            for i, t in enumerate(sets):
                for j in t:
                    try:
                        mode.check_job(j.job_id, j.gpu_demand)
                    except CompatError as exc:
                        raise TrainConfigError(f"{what} trace {i} (0-based): {exc}") from None
    if plan.last is not None:
        _check_resume_val_traces(plan.last, cfg, val_traces)
    with _run_lock(out):
        # again under the lock: another run may have written to out since
        plan = check_run(cfg, out, resume=resume, overwrite=overwrite)
        if plan.last is not None:
            _check_resume_val_traces(plan.last, cfg, val_traces)
        return _train_locked(cfg, plan, train_traces, val_traces, out, resume, progress, episodes)


def _segment_commands(plan: RunPlan, cfg: TrainConfig, out: Path, start_steps: int) -> list[dict[str, Any]]:
    """``training.commands``: the earlier segments' (from the run's ``last``, when resumed) and this one's."""
    earlier: list = []
    if plan.last is not None:
        got = plan.last.meta.get("training", {}).get("commands")
        if isinstance(got, list):
            earlier = [c for c in got if isinstance(c, dict) and c.get("start_timesteps", -1) < start_steps]
    this = {"start_timesteps": start_steps, "command": train_command(cfg, out, resume=start_steps > 0)}
    return [*earlier, this]


def _train_locked(
    cfg: TrainConfig,
    plan: RunPlan,
    train_traces: Sequence[Sequence[JobSpec]],
    val_traces: Sequence[Sequence[JobSpec]],
    out: Path,
    resume: bool,
    progress: Callable[[int, int], None] | None,
    episodes: Callable[[int, float], None] | None = None,
) -> dict:
    """:func:`train` once ``out`` is locked and ``plan`` checked."""
    import torch
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.logger import TensorBoardOutputFormat
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.utils import configure_logger
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    cluster = plan.cluster
    start_steps = plan.start_steps
    # a new run is seeded with --seed; a resumed segment with one drawn from it and the steps done
    seed = segment_seed(cfg.seed, start_steps)
    remaining = max(cfg.timesteps - start_steps, 0)
    chunk = rollout_steps(cfg)
    planned = start_steps + -(-remaining // chunk) * chunk
    if planned != max(cfg.timesteps, start_steps):
        log.info(
            "--timesteps %d: training runs whole rollouts of %d steps, so it stops at %d", cfg.timesteps, chunk, planned
        )

    # 2. build the run (nothing written yet)
    torch.set_num_threads(1)
    mode = compat_mode(cfg.compat) if cfg.compat is not None else None
    perf = ContentionModel(cluster) if mode is None else ContentionModel(cluster, contention=mode.contention)
    if not val_traces:
        log.warning("no validation traces: no periodic evaluation, and best = last (give --val-traces to select)")
    t_ref = time.perf_counter()
    train_ref = reference_jct(train_traces, cluster, perf, cfg.round_len, compat=mode) if cfg.reward == "jct-rel" else None
    val_ref = reference_jct(val_traces, cluster, perf, cfg.round_len, compat=mode) if val_traces else []
    log.info("reference JCTs (%s) of %d traces in %.1f s", "greedy-np" if mode is None else "greedy-np:ds",
             len(train_traces) + len(val_traces), time.perf_counter() - t_ref)
    # provenance in every checkpoint's metadata: the code's git revision, the traces' content and the
    # segment of the run that wrote it (where it started and its seed, segment_seed)
    prov = {
        "source": source_revision(),
        "traces_sha256": traces_fingerprint(train_traces),
        "val_traces_sha256": traces_fingerprint(val_traces) if val_traces else None,
        "segment": {"start_timesteps": start_steps, "seed": seed},
        # how to run it again: one entry per segment (a resumed run has several), every option written out
        "commands": _segment_commands(plan, cfg, out, start_steps),
    }

    def factory(i: int):
        def _f():
            env = PlacementEnv(
                train_traces,
                cluster,
                reward=cfg.reward,
                w1=cfg.w1,
                round_len=cfg.round_len,
                perf=perf,
                k=cfg.k,
                order=cfg.order,
                aging_s=cfg.aging_s,
                gamma=cfg.gamma,
                reference=train_ref,
                compat=mode,
            )
            env.reset(seed=seed * 1000 + i)
            return Monitor(env)

        return _f

    base_venv = DummyVecEnv([factory(i) for i in range(cfg.n_envs)])
    base_venv.seed(seed)
    probe = base_venv.envs[0].unwrapped
    # Returns are O(100) (one unit per job); normalise rewards (not observations, so the
    # network sees exactly what the deployed codec produces) to keep the critic trainable.
    venv = VecNormalize(base_venv, norm_obs=False, norm_reward=True, gamma=cfg.gamma)
    prior = admission_prior(cfg)
    model = _make_model(cfg, venv, str(out / "tb"), seed=seed, start_steps=start_steps)
    if cfg.prior_init:
        _init_prior(cfg.algo, model, cfg.prior_scale, admission=prior is not None)
    if plan.init is not None:
        src = plan.init
        _load_weights(model, src, f"--init {cfg.init}")  # check_run compared the tensors; a safety net
        log.info("initialised from %s (%s order, %s steps)", src.json_path, src.spec.order, src.meta["training"].get("timesteps"))
    if plan.last is not None:
        _load_weights(model, plan.last, f"{plan.last.json_path} (--resume)")
        model.num_timesteps = start_steps
        log.info("resumed from %s at %d steps (seed %d for this segment)", plan.last.json_path, start_steps, seed)
        log.info("%s", restore_train_state(out / STATE_NAME, model, venv, start_steps, plan.last.meta["weights_sha256"]))

    # 3. only now replace the previous run (--overwrite), then train
    if not resume:
        for f in _run_files(out):
            f.unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    eval_rows: list[dict] = list(plan.eval_rows)
    eval_csv = out / "eval.csv"
    # the score to beat: the run's best checkpoint's own (a resumed run), not the log's
    best_val = {
        k: float(v)
        for k, v in (plan.best.meta["training"] if plan.best is not None else {}).items()
        if k in ("val_avg_jct_s", "val_rel_jct") and _is_real(v)
    }
    best = best_val.get("val_rel_jct", math.inf)
    # the evaluation log's wall clock goes on from the resumed run's
    wall0 = float(eval_rows[-1].get("wall_s", 0.0)) if eval_rows else 0.0
    t_start = time.perf_counter()

    def write_log() -> None:
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=list(EVAL_COLUMNS), extrasaction="ignore")
        w.writeheader()
        w.writerows(eval_rows)
        write_atomic(eval_csv, buf.getvalue().encode())  # a crash never leaves half a log for --resume

    if plan.dropped_rows:
        log.warning(
            "%s: %d evaluation(s) past %s's %d steps (a run stopped before saving it) left out of the log",
            eval_csv, plan.dropped_rows, plan.last.json_path if plan.last else "last", start_steps,
        )
        write_log()
    # TensorBoard: SB3's logger (configured as learn() would), whose writer also takes the evaluations,
    # each at its own step (the SB3 logger's record() would stamp them at the next rollout's end)
    logger = configure_logger(model.verbose, str(out / "tb"), cfg.algo, reset_num_timesteps=not resume)
    model.set_logger(logger)
    tb = next((f.writer for f in logger.output_formats if isinstance(f, TensorBoardOutputFormat)), None)

    def write_last() -> None:
        """Save ``last`` and then the training state that goes with it (:mod:`trainer.train_state`)."""
        _save(out / "last", cfg, model, cluster, probe, prov)
        sha = json.loads((out / "last.json").read_text())["weights_sha256"]
        save_train_state(out / STATE_NAME, model, venv, int(model.num_timesteps), sha)

    def save_and_evaluate(save_last: bool) -> None:
        """Save ``last`` (``save_last``), then evaluate on the validation traces: a better network is saved
        as ``best`` before its row is logged, so every score in the log is of a network that was saved."""
        nonlocal best
        if save_last:
            write_last()
        if not val_traces:
            return
        steps = int(model.num_timesteps)
        net = inference_net(cfg.algo, model)
        jcts = evaluate_net(net, cluster, perf, val_traces, round_len=cfg.round_len, k=cfg.k, prior=prior, order=cfg.order, aging_s=cfg.aging_s,
                            compat=mode)
        m = float(np.mean(jcts))
        rel = float(np.mean(np.asarray(jcts) / np.asarray(val_ref)))
        if rel < best:
            best = rel
            best_val.clear()
            best_val.update(val_avg_jct_s=m, val_rel_jct=rel)
            _save(out / "best", cfg, model, cluster, probe, {**prov, "val_avg_jct_s": m, "val_rel_jct": rel})
        wall = wall0 + time.perf_counter() - t_start
        eval_rows.append({"timesteps": float(steps), "val_avg_jct_s": m, "val_rel_jct": rel, "wall_s": wall})
        write_log()
        if tb is not None:
            tb.add_scalar("eval/val_avg_jct_h", m / 3600.0, global_step=steps)
            tb.add_scalar("eval/val_rel_jct", rel, global_step=steps)
            tb.flush()
        log.info("eval at %d steps: val avg JCT %.2f h, %.4f x greedy-np (best %.4f)", steps, m / 3600, rel, best)

    class EvalCallback(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            # on the --eval-freq grid (a resumed run too: it evaluates where an uninterrupted one would)
            self.next_eval = (start_steps // cfg.eval_freq + 1) * cfg.eval_freq
            self.shown = start_steps
            self.episodes = 0  # finished in this segment, over all environments

        def _on_step(self) -> bool:
            if episodes is not None:
                for info in self.locals.get("infos", ()):
                    ep = info.get("episode") if isinstance(info, dict) else None
                    if ep is not None:  # Monitor's record of an episode that just ended
                        self.episodes += 1
                        episodes(self.episodes, float(ep["r"]))
            if progress is not None and self.num_timesteps - self.shown >= 64:
                self.shown = self.num_timesteps
                progress(self.num_timesteps, planned)
            if self.num_timesteps >= self.next_eval:
                self.next_eval += cfg.eval_freq
                save_and_evaluate(save_last=True)
            return True

    try:
        if val_traces and (not eval_rows or eval_rows[-1]["timesteps"] < start_steps):
            # the starting point (the prior; or a resumed network whose evaluation was never logged, an
            # interrupt right after saving it) competes for "best" too: training never ships worse than it.
            # A new run saves it as "last" first, so a run stopped from here on can be resumed.
            save_and_evaluate(save_last=plan.last is None)
        if remaining:
            try:
                model.learn(
                    total_timesteps=remaining,
                    callback=EvalCallback(),
                    reset_num_timesteps=not resume,
                    tb_log_name=cfg.algo,
                    progress_bar=False,
                )
            except ValueError as exc:  # e.g. torch.distributions refusing NaN logits: say why, if that is it
                _check_finite(model, "the network")
                if "invalid values" in str(exc):  # finite weights whose outputs overflowed to NaN / inf
                    raise _diverged(model, "the network's outputs became NaN/inf") from exc
                raise
        if progress is not None:
            progress(int(model.num_timesteps), planned)
        steps = int(model.num_timesteps)
        if remaining or plan.last is None:  # a resume with nothing to train keeps last (and its provenance)
            write_last()
        if val_traces and not (eval_rows and eval_rows[-1]["timesteps"] == float(steps)):
            save_and_evaluate(save_last=False)
        final = eval_rows[-1] if eval_rows else {}
        if not val_traces or not (out / "best.json").is_file():
            # without validation traces best = last, at the end of every run (a resumed one too)
            scores: dict[str, float] = {}
            if val_traces and final.get("timesteps") == float(steps):  # (the final network's own scores)
                scores = {k: v for k, v in final.items() if k.startswith("val_")}
            _save(out / "best", cfg, model, cluster, probe, {**prov, **scores})
            best_val.clear()
            best_val.update(scores)
    finally:
        logger.close()
    summary = {
        "timesteps": steps,
        "wall_s": time.perf_counter() - t_start,
        # null without validation traces (strict JSON has no NaN)
        "best_val_rel_jct": best_val.get("val_rel_jct"),
        "best_val_avg_jct_s": best_val.get("val_avg_jct_s"),
        "final_val_rel_jct": final.get("val_rel_jct"),
        "final_val_avg_jct_s": final.get("val_avg_jct_s"),
        "evals": eval_rows,
        "best": str(out / "best.json"),
        "segment": prov["segment"],
    }
    write_atomic(out / "summary.json", (json.dumps(summary, indent=2, default=str, allow_nan=False) + "\n").encode())
    return summary


def ship_checkpoint(
    best: str | Path,
    cluster: ClusterSpec,
    dest: str | Path | None = None,
    command: str | None = None,
    aging_s: float | None = None,
    relative_to: str | Path | None = None,
) -> list[Path]:
    """Copy a trained checkpoint's policy network as ``rl-base-<shape>`` and ``rl-hybrid-<shape>``.

    Both get the same weights (the seed's two policies share one trained
    network and differ in how "nothing" is handled); ``mode`` in the metadata
    records which one the file is.

    :param dest: target directory (default: the ``policies/checkpoints`` package directory).
    :param command: the command that produced it, recorded in the metadata.
    :param aging_s: run the shipped policies with this candidate-order aging (s;
        :attr:`~policies.codecs.deepshare.ObsSpec.aging_s`) instead of the one it was trained with. The
        weights are unchanged; the trained value stays in ``training.config`` (``aging_s``;
        written in as :data:`~policies.orders.LEGACY_AGING_S` for a config without it).
    :param relative_to: a directory: the paths under it that ``training`` records (trace directories,
        ``--init``, ``--out``, in the config and the command lines) are written relative to it
        (:func:`relative_provenance`), so the shipped files name no directory of the machine they were
        trained on; ``training.recipe`` then records the one command that trains them again.
    """
    from importlib import resources

    from safetensors.numpy import load_file

    ck = load_checkpoint(best)
    ck.check_cluster(cluster)
    dest = Path(dest) if dest else Path(str(resources.files("policies"))) / "checkpoints"
    layers = ck.meta["network"]["layers"]
    # Ship only what inference reads (the value head stays in the training run's files).
    tensors = {k: v for k, v in load_file(str(ck.weights_path)).items() if k.rsplit(".", 1)[0] in layers}
    training = dict(ck.meta["training"])
    if command:
        training["command"] = command
    if isinstance(training.get("config"), dict) and "aging_s" not in training["config"]:
        # a config without aging_s was trained with LEGACY_AGING_S: record it (the spec may differ when re-shipped)
        training["config"] = {**training["config"], "aging_s": LEGACY_AGING_S}
    if relative_to is not None:
        training = relative_provenance(training, relative_to)
    spec = ck.spec if aging_s is None else replace(ck.spec, aging_s=aging_s)
    out = []
    for mode in ("rl-base", "rl-hybrid"):
        out.append(
            save_checkpoint(
                dest / f"{mode}-{cluster.describe()}",
                tensors,
                algo=ck.meta["algo"],
                mode=mode,
                cluster=ck.cluster,
                spec=spec,
                codec=ck.codec_name,
                layers=ck.meta["network"]["layers"],
                activation=ck.meta["network"]["activation"],
                reward=ck.meta["reward"],
                training=training,
                prior=ck.prior,
            )
        )
    return out


#: ``training.recipe`` of checkpoints shipped with paths relative to a run directory: the one command that
#: trains the shipped 4x8 checkpoints again, in a directory DIR the recorded paths are relative to.
SHIPPED_RECIPE = {
    "command": "bash scripts/reproduce_shipped.sh DIR",
    "paths": "relative to DIR (trace directories, --init, --out)",
    "docs": "docs/RL.md, Reproducing the shipped checkpoints",
}


def relative_provenance(training: Mapping[str, Any], base: str | Path) -> dict[str, Any]:
    """``training`` (a checkpoint's metadata section) with every path under ``base`` written relative to it:
    ``config.traces`` / ``config.val_traces`` entries, ``config.init``, and those paths inside the command
    lines (``command``, ``commands[].command``); adds ``recipe`` (:data:`SHIPPED_RECIPE`). Paths elsewhere
    are kept as they are. Pure: ``training`` is not changed."""
    root = os.path.abspath(base)

    def rel(p: Any) -> Any:
        if not isinstance(p, str) or not os.path.isabs(p):
            return p
        q = os.path.normpath(p)
        return os.path.relpath(q, root) if q == root or q.startswith(root.rstrip(os.sep) + os.sep) else p

    def rel_command(cmd: Any) -> Any:
        if not isinstance(cmd, str):
            return cmd
        try:
            words = shlex.split(cmd)
        except ValueError:
            return cmd
        return shlex.join(rel(w) for w in words)

    out = dict(training)
    cfg = out.get("config")
    if isinstance(cfg, dict):
        cfg = dict(cfg)
        for key in ("traces", "val_traces"):
            if isinstance(cfg.get(key), list):
                cfg[key] = [rel(p) for p in cfg[key]]
        if "init" in cfg:
            cfg["init"] = rel(cfg["init"])
        out["config"] = cfg
    if "command" in out:
        out["command"] = rel_command(out["command"])
    if isinstance(out.get("commands"), list):
        out["commands"] = [{**c, "command": rel_command(c.get("command"))} if isinstance(c, dict) else c
                           for c in out["commands"]]
    out["recipe"] = dict(SHIPPED_RECIPE)
    return out
