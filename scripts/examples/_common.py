"""Shared plumbing for the example training scripts (argument parsing, torch.distributed setup, hashing).

Distributed setup follows srun's environment: rank = SLURM_PROCID (or RANK), world = SLURM_NTASKS (or
WORLD_SIZE), MASTER_ADDR defaults to localhost (our one-host test cluster), MASTER_PORT defaults to
29500 + SLURM_JOB_ID % 1000. With one task the scripts run single-process without torch.distributed.
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
    return p


def setup_distributed() -> tuple[int, int]:
    """Initialise gloo from srun/torchrun env if more than one task; returns (rank, world_size)."""
    world = int(os.environ.get("SLURM_NTASKS", os.environ.get("WORLD_SIZE", "1")))
    rank = int(os.environ.get("SLURM_PROCID", os.environ.get("RANK", "0")))
    if world > 1:
        os.environ.setdefault("MASTER_ADDR", "localhost")
        os.environ.setdefault("MASTER_PORT", str(29500 + int(os.environ.get("SLURM_JOB_ID", "0") or 0) % 1000))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    return rank, world


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
