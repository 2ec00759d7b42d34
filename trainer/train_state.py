"""What a training run needs besides its network to resume where it stopped, stored without pickle.

``OUT/last.state.safetensors`` sits beside a run's ``last`` checkpoint and holds

* the optimiser's per-parameter state (Adam's ``exp_avg`` / ``exp_avg_sq`` / ``step``, RMSprop's
  ``square_avg`` / ``step``, ...) as tensors named ``optim.<param index>.<name>``, the index being the
  parameter's position in the optimiser's parameter groups (as in ``torch.optim.Optimizer.state_dict``);
* the running statistics ``VecNormalize`` divides rewards by: ``vecnorm.ret_mean``, ``vecnorm.ret_var``,
  ``vecnorm.ret_count`` (float64 scalars).

Its safetensors header metadata says which ``last`` it belongs to: ``timesteps`` and ``weights_sha256`` (the
sha256 of ``last.safetensors``, as ``last.json`` records it). A state file that belongs to another ``last``
(written before a crash that came between the two saves) is not used: the run resumes with fresh optimiser
moments and reward statistics, as runs did before this file existed, and says so. A state file that does not
parse, holds non-finite numbers or does not fit the run's network is refused with the file named.

A DQN's replay buffer is not stored (it can hold hundreds of MB); a resumed DQN warms up again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from policies.checkpoint import CheckpointError, write_atomic

#: file name of the training state, in a run's ``--out``
STATE_NAME = "last.state.safetensors"
#: ``format`` value of the header metadata
STATE_FORMAT = "rlsched-train-state/1"
_VECNORM = ("ret_mean", "ret_var", "ret_count")
#: optimiser state entries that are never negative (Adam's, AdamW's, RMSprop's step counts and second moments)
_NON_NEGATIVE = ("step", "exp_avg_sq", "max_exp_avg_sq", "square_avg")


def save_train_state(path: Path, model: Any, venv: Any, timesteps: int, weights_sha256: str) -> None:
    """Write ``model``'s optimiser state and ``venv``'s reward statistics to ``path`` (atomically).

    :param model: a Stable-Baselines3 model (``model.policy.optimizer``, a ``torch.optim.Optimizer``).
    :param venv: the ``VecNormalize`` wrapper the model trains on (``ret_rms``: mean, var, count).
    :param timesteps: the step count of the ``last`` checkpoint this state goes with.
    :param weights_sha256: that checkpoint's ``weights_sha256``.
    """
    import torch
    from safetensors.numpy import save

    opt = model.policy.optimizer
    tensors: dict[str, np.ndarray] = {}
    scalars: list[str] = []  # entries that were Python numbers, not tensors (given back as floats)
    for idx, st in opt.state_dict()["state"].items():
        for name, v in st.items():
            key = f"optim.{int(idx)}.{name}"
            if torch.is_tensor(v):
                tensors[key] = v.detach().cpu().numpy().copy()
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                tensors[key] = np.asarray(float(v), dtype=np.float64)
                scalars.append(key)
            # anything else (none in torch's optimisers) is not stored: it restarts
    rms = venv.ret_rms
    tensors["vecnorm.ret_mean"] = np.asarray(rms.mean, dtype=np.float64).reshape(())
    tensors["vecnorm.ret_var"] = np.asarray(rms.var, dtype=np.float64).reshape(())
    tensors["vecnorm.ret_count"] = np.asarray(float(rms.count), dtype=np.float64)
    meta = {
        "format": STATE_FORMAT,
        "timesteps": str(int(timesteps)),
        "weights_sha256": weights_sha256.lower(),
        "optimizer": type(opt).__name__,
        "scalars": ",".join(scalars),
    }
    write_atomic(path, save(tensors, metadata=meta))


def read_train_state(path: Path) -> tuple[dict[str, str], dict[str, np.ndarray]]:
    """The header metadata and tensors of the state file ``path``, checked for form: the format tag, the
    three ``vecnorm`` scalars (variance > 0, count >= 0), every number finite, tensor names
    ``optim.<int>.<name>`` or ``vecnorm.*``.

    :raises CheckpointError: naming ``path`` and what is wrong (never a safetensors traceback).
    """
    from safetensors import safe_open

    def bad(why: str) -> CheckpointError:
        return CheckpointError(
            f"{path}: {why}; delete it to resume with fresh optimiser moments and reward statistics"
        )

    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = dict(f.metadata() or {})
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as exc:  # noqa: BLE001 - safetensors raises several kinds for a damaged file
        raise bad(f"not a readable training-state file ({' '.join(str(exc).split())[:200]})") from None
    if meta.get("format") != STATE_FORMAT:
        raise bad(f"format {meta.get('format')!r}, expected {STATE_FORMAT!r}")
    if not meta.get("timesteps", "").isdigit() or not meta.get("weights_sha256"):
        raise bad("its header does not name the checkpoint it belongs to (timesteps, weights_sha256)")
    for k, v in tensors.items():
        head, _, rest = k.partition(".")
        if head == "optim":
            idx, _, name = rest.partition(".")
            if not idx.isdigit() or not name:
                raise bad(f"tensor {k!r} is not named optim.<parameter index>.<name>")
        elif not (head == "vecnorm" and rest in _VECNORM):
            raise bad(f"unexpected tensor {k!r}")
        if v.dtype.kind != "f" or not np.all(np.isfinite(v)):
            raise bad(f"tensor {k!r} is not finite floating-point data")
        if head == "optim" and k.rsplit(".", 1)[-1] in _NON_NEGATIVE and np.any(v < 0):
            raise bad(f"tensor {k!r} holds negative values (a step count or second moment cannot)")
    for name in _VECNORM:
        v = tensors.get(f"vecnorm.{name}")
        if v is None or v.shape != ():
            raise bad(f"vecnorm.{name} is missing or not a scalar")
    if float(tensors["vecnorm.ret_var"]) <= 0 or float(tensors["vecnorm.ret_count"]) < 0:
        raise bad("vecnorm.ret_var must be > 0 and vecnorm.ret_count >= 0")
    return meta, tensors


def restore_train_state(path: Path, model: Any, venv: Any, timesteps: int, weights_sha256: str) -> str:
    """Load the state file ``path`` into ``model``'s optimiser and ``venv``'s reward statistics when it
    belongs to the checkpoint (``timesteps``, ``weights_sha256``) the model was loaded from.

    :returns: what was done, one line for the log ("restored ...", or why nothing was).
    :raises CheckpointError: a damaged file (:func:`read_train_state`), or one whose optimiser state does not
        fit the model (another optimiser, parameter index or shape).
    """
    import torch

    if not path.is_file():
        return f"no {path.name}: optimiser moments and reward statistics restart"
    meta, tensors = read_train_state(path)
    if int(meta["timesteps"]) != int(timesteps) or meta["weights_sha256"] != weights_sha256.lower():
        return (
            f"{path} belongs to another save of last (step {meta['timesteps']}, not {timesteps}): "
            "optimiser moments and reward statistics restart"
        )
    opt = model.policy.optimizer
    if meta.get("optimizer") != type(opt).__name__:
        raise CheckpointError(f"{path}: state of a {meta.get('optimizer')} optimiser; this run uses {type(opt).__name__}")
    params = [p for g in opt.param_groups for p in g["params"]]
    scalars = set(filter(None, meta.get("scalars", "").split(",")))
    state: dict[int, dict[str, Any]] = {}
    for k, v in tensors.items():
        if not k.startswith("optim."):
            continue
        idx_s, name = k[len("optim."):].split(".", 1)
        idx = int(idx_s)
        if idx >= len(params):
            raise CheckpointError(f"{path}: {k}: the run's optimiser has {len(params)} parameters")
        # a step count (a tensor or a number) is a scalar; every other entry has its parameter's shape
        want = () if name == "step" or k in scalars else tuple(params[idx].shape)
        if tuple(v.shape) != want:
            raise CheckpointError(f"{path}: {k} has shape {tuple(v.shape)}, expected {want}")
        state.setdefault(idx, {})[name] = float(v) if k in scalars else torch.from_numpy(v.copy())
    sd = opt.state_dict()
    opt.load_state_dict({"state": state, "param_groups": sd["param_groups"]})
    rms = venv.ret_rms
    rms.mean = np.asarray(tensors["vecnorm.ret_mean"], dtype=np.float64).reshape(())
    rms.var = np.asarray(tensors["vecnorm.ret_var"], dtype=np.float64).reshape(())
    rms.count = float(tensors["vecnorm.ret_count"])
    return (
        f"restored the optimiser state of {len(state)} parameters and the reward statistics "
        f"(mean {float(rms.mean):.4g}, var {float(rms.var):.4g}, count {rms.count:.0f}) from {path.name}"
    )
