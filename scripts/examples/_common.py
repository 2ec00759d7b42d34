"""Shared plumbing for the example training scripts (argument parsing, torch.distributed setup, hashing).

Distributed setup follows srun's environment: rank = SLURM_PROCID (or RANK), world = SLURM_NTASKS (or
WORLD_SIZE), MASTER_ADDR defaults to localhost (our one-host test cluster), MASTER_PORT defaults to
29500 + SLURM_JOB_ID % 1000. With one task the scripts run single-process without torch.distributed
(unless ``--process-group``: a 1-rank group).

Device and backend (``--device auto|cuda|cpu``, default ``$RLSCHED_DEVICE`` or ``auto``): a process that
sees a GPU trains on it with NCCL, otherwise on the CPU with gloo; the GPU index comes from the local
rank and ``CUDA_VISIBLE_DEVICES`` as Slurm sets them (``nodeagent.jobdevice``). Data are drawn on the
CPU from the per-(step, rank) generator and moved to the device, so the batches are the same on both.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import sys
import time

import torch
import torch.distributed as dist

from nodeagent.jobdevice import DEVICE_CHOICES, DeviceChoice, pick_device


def base_parser(desc: str, model: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=desc)
    p.add_argument("--total-steps", type=int, default=300, help="optimizer steps in total, across preemptions")
    p.add_argument("--batch-size", type=int, default=32, help="per-rank batch size")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model-name", default=model, help="model family reported to the agent")
    p.add_argument("--job-key", default=None, help="checkpoint key (default: from env / Slurm comment)")
    p.add_argument("--store", default=None, help="checkpoint store URL (default: $RLSCHED_STORE / agent)")
    p.add_argument("--report-every", type=int, default=5)
    p.add_argument("--ckpt-every", type=int, default=0, help="periodic checkpoint interval in steps (0: off)")
    p.add_argument("--reference-samples-per-s", type=float, default=0.0, help="known isolated throughput")
    p.add_argument("--step-sleep", type=float, default=0.0, help="extra seconds per step (slows tests down)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--device", choices=DEVICE_CHOICES, default=os.environ.get("RLSCHED_DEVICE", "auto"),
                   help="auto: CUDA + NCCL when this process sees a GPU, else CPU + gloo (default $RLSCHED_DEVICE "
                        "or auto)")
    p.add_argument("--process-group", action="store_true",
                   help="initialise torch.distributed even with one task (a 1-rank NCCL / gloo group)")
    return p


def setup_device(args: argparse.Namespace) -> DeviceChoice:
    """The process's device and backend (``args.device``); exits 2 with one line if it cannot have it."""
    try:
        choice = pick_device(args.device)
    except ValueError as exc:
        print(f"{sys.argv[0]}: --device {args.device}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    logging.getLogger("rlsched.example").info("device %s: %s", choice.device, choice.why)
    return choice


def setup_distributed(device: DeviceChoice | None = None, always: bool = False) -> tuple[int, int]:
    """Initialise torch.distributed from srun/torchrun env if more than one task (or ``always``), with the
    backend of ``device`` (gloo when None); returns (rank, world_size)."""
    world = int(os.environ.get("SLURM_NTASKS", os.environ.get("WORLD_SIZE", "1")))
    rank = int(os.environ.get("SLURM_PROCID", os.environ.get("RANK", "0")))
    if world > 1 or always:
        os.environ.setdefault("MASTER_ADDR", "localhost")
        os.environ.setdefault("MASTER_PORT", str(29500 + int(os.environ.get("SLURM_JOB_ID", "0") or 0) % 1000))
        on_gpu = device is not None and device.kind == "cuda"
        dist.init_process_group(device.backend if device else "gloo", rank=rank, world_size=world,
                                **({"device_id": torch.device(device.device)} if on_gpu else {}))
    return rank, world


def device_fields(device: DeviceChoice) -> dict[str, object]:
    """The device and process-group backend (None without torch.distributed), for a script's JSON lines."""
    return {"device": device.device, "backend": dist.get_backend() if dist.is_initialized() else None}


def wrap_ddp(net: torch.nn.Module, device: DeviceChoice) -> torch.nn.Module:
    """``net`` wrapped in DistributedDataParallel when torch.distributed is initialised (on its GPU with
    NCCL), else ``net`` itself."""
    if not (dist.is_available() and dist.is_initialized()):
        return net
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(net, device_ids=[device.index] if device.kind == "cuda" else None)


def param_digest(module: torch.nn.Module) -> str:
    """SHA-256 of all parameters (bitwise), to compare runs."""
    h = hashlib.sha256()
    for name, p in sorted(module.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def emit(**fields: object) -> None:
    print(json.dumps(fields, sort_keys=True), flush=True)


def configure(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def step_generator(seed: int, step: int, rank: int) -> torch.Generator:
    """Deterministic per-(step, rank) RNG, so a resumed run sees exactly the same data."""
    return torch.Generator().manual_seed(seed * 1_000_003 + step * 1_009 + rank)


def now() -> float:
    return time.perf_counter()


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
               step_sleep: float = 0.0) -> torch.Tensor:
    """One optimizer step of mean-squared-error regression of ``y`` on ``x`` (then ``step_sleep`` s of
    sleep, to slow tests down); returns the loss."""
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if step_sleep:
        time.sleep(step_sleep)
    return loss
