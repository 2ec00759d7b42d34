"""Which device and torch.distributed backend a training process uses: CUDA with NCCL when this process
sees a GPU, the CPU with gloo otherwise.

Imported by training jobs (the example scripts' ``_common.py``); torch is imported only inside
:func:`pick_device`, so the module itself loads without torch (agent hosts need none).

The GPU index follows Slurm's and torchrun's environment:

* the local rank is ``LOCAL_RANK`` (torchrun), else ``SLURM_LOCALID`` (srun), else 0;
* the GPUs torch can see are the ones ``CUDA_VISIBLE_DEVICES`` lists (Slurm sets it from the job's GRES;
  an empty value means none). With one visible GPU the process uses it, whatever its local rank
  (``--gpus-per-task=1`` / ``--gpu-bind``: Slurm gives each task its own single GPU). With several, local
  rank r uses visible GPU r (``--gpus=N`` with N tasks on the node: every task sees all N GPUs).
  A local rank at or beyond the number of visible GPUs (more tasks than GPUs on the node) is refused:
  NCCL needs one GPU per rank.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

#: What a job may ask for: ``auto`` (CUDA when visible, else CPU), ``cuda`` (fail without a GPU), ``cpu``.
DEVICE_CHOICES = ("auto", "cuda", "cpu")


@dataclass(frozen=True)
class DeviceChoice:
    """Where one process trains. ``kind``: ``"cuda"`` or ``"cpu"``; ``index``: CUDA device index among the
    visible ones (None on CPU); ``backend``: ``"nccl"`` (CUDA) or ``"gloo"`` (CPU); ``local_rank``: the
    process's rank on its node; ``visible``: CUDA devices this process sees; ``why``: one readable line."""

    kind: str
    index: int | None
    backend: str
    local_rank: int
    visible: int
    why: str

    @property
    def device(self) -> str:
        """torch device string: ``cuda:<index>`` or ``cpu``."""
        return f"cuda:{self.index}" if self.kind == "cuda" else "cpu"


def local_rank_from_env(env: Mapping[str, str]) -> int:
    """This process's rank on its node: ``LOCAL_RANK`` (torchrun), else ``SLURM_LOCALID`` (srun), else 0."""
    for var in ("LOCAL_RANK", "SLURM_LOCALID"):
        v = env.get(var, "").strip()
        if v:
            try:
                r = int(v)
            except ValueError:
                raise ValueError(f"{var}={v!r} is not a rank (a non-negative integer)") from None
            if r < 0:
                raise ValueError(f"{var}={v!r} is not a rank (a non-negative integer)")
            return r
    return 0


def choose_device(want: str, cuda_count: int, env: Mapping[str, str]) -> DeviceChoice:
    """The device for a process that sees ``cuda_count`` CUDA devices (pure; see the module doc).

    Raises ValueError with one line naming the cause: an unknown ``want``, ``want="cuda"`` without a
    visible GPU, or a local rank with no GPU of its own."""
    if want not in DEVICE_CHOICES:
        raise ValueError(f"device {want!r} is not one of {', '.join(DEVICE_CHOICES)}")
    lr = local_rank_from_env(env)
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    seen = f"CUDA_VISIBLE_DEVICES={cvd!r}" if cvd is not None else "CUDA_VISIBLE_DEVICES unset"
    if want == "cpu":
        return DeviceChoice("cpu", None, "gloo", lr, cuda_count, "CPU requested; gloo")
    if cuda_count <= 0:
        if want == "cuda":
            raise ValueError(f"CUDA requested but no CUDA device is visible ({seen})")
        return DeviceChoice("cpu", None, "gloo", lr, 0, f"no CUDA device visible ({seen}); CPU with gloo")
    if cuda_count == 1:
        idx = 0
    elif lr < cuda_count:
        idx = lr
    else:
        raise ValueError(f"local rank {lr} has no GPU of its own: {cuda_count} visible ({seen}); "
                         "NCCL needs one GPU per rank (ask Slurm for --gpus-per-task=1, or use --device cpu)")
    return DeviceChoice("cuda", idx, "nccl", lr, cuda_count,
                        f"local rank {lr} on visible CUDA device {idx} of {cuda_count} ({seen}); NCCL")


def pick_device(want: str = "auto", env: Mapping[str, str] | None = None) -> DeviceChoice:
    """:func:`choose_device` for this process (torch's visible CUDA devices); makes a chosen GPU the
    current CUDA device (``torch.cuda.set_device``), so NCCL and ``.cuda()`` use it."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    choice = choose_device(want, count, os.environ if env is None else env)
    if choice.kind == "cuda":
        torch.cuda.set_device(choice.index)
    return choice
