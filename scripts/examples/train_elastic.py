#!/usr/bin/env python3
"""Example elastic job: data-parallel MLP with a fixed global batch, resizable by the controller.

    sbatch --gpus=2 --ntasks=2 --requeue --comment rlsched:model=MLP,min_gpus=1,max_gpus=4 \\
        --wrap "python scripts/examples/train_elastic.py --launch --total-steps 300"

``--launch`` (the batch step) starts one worker per task of the job's current allocation with
``srun`` (:func:`nodeagent.jobhelper.launch`; a resize changes the task count with the GPU count)
and exits with the workers' status (75 after a preemption or resize checkpoint: Slurm requeues the
job held, the controller pins it at its new size and releases it). Each worker trains with the
global batch ``--global-batch`` whatever the world size ``W``: per-worker batch ``G / W``, step ``s``
covering the samples ``s*G .. s*G+G-1`` of one deterministic stream (sample ``i`` is drawn from a
generator seeded by ``(seed, i)``), rank ``r`` the ``r``-th slice (:class:`nodeagent.jobhelper.DataParallelPlan`).
DDP averages the ranks' mean gradients, which is the mean over the global batch, so a run resized
2 -> 4 -> 1 workers computes the same updates as one that never changed size (up to float rounding
of the all-reduce). CUDA + NCCL when the worker sees a GPU, CPU + gloo otherwise (``--device``). Prints JSON lines: ``start`` (world size, start step, data position, per-worker
batch, the world size of the checkpoint it resumed), ``done`` (final step, samples, loss, parameters).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from _common import (base_parser, configure, device_fields, emit, param_digest, setup_device,  # noqa: E402
                     setup_distributed, train_step, wrap_ddp)
from nodeagent.jobhelper import JobSession, launch  # noqa: E402

IN, OUT = 16, 4


def batch(seed: int, positions: range) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets of the samples at ``positions`` of the job's stream (each sample from its own seed)."""
    target = torch.randn(IN, OUT, generator=torch.Generator().manual_seed(seed + 7))
    xs = [torch.randn(IN, generator=torch.Generator().manual_seed(seed * 1_000_003 + i)) for i in positions]
    x = torch.stack(xs)
    return x, torch.tanh(x @ target)


def main() -> int:
    p = base_parser("elastic data-parallel MLP with a fixed global batch", "MLP")
    p.add_argument("--launch", action="store_true", help="batch step: start one worker per allocated task (srun)")
    p.add_argument("--global-batch", type=int, default=24, help="samples per step across all workers")
    p.add_argument("--hidden", type=int, default=32)
    p.set_defaults(total_steps=300, lr=0.05)
    args = p.parse_args()
    if args.launch:
        return launch([sys.executable, os.path.abspath(__file__), *[a for a in sys.argv[1:] if a != "--launch"]])
    configure(args)
    dev = setup_device(args)
    rank, world = setup_distributed(dev)
    net = nn.Sequential(nn.Linear(IN, args.hidden), nn.Tanh(), nn.Linear(args.hidden, OUT)).to(dev.device)
    model = wrap_ddp(net, dev)
    opt = torch.optim.SGD(net.parameters(), lr=args.lr)
    with JobSession.from_env(job_key=args.job_key, store=args.store, model=args.model_name,
                             total_steps=args.total_steps, report_every=args.report_every,
                             ckpt_every=args.ckpt_every, global_batch=args.global_batch) as s:
        plan = s.plan  # ValueError (one line) when the global batch is not a multiple of the world size
        start, state = s.resume()
        if state is not None:
            net.load_state_dict(state["model"])
            opt.load_state_dict(state["optim"])
        emit(event="start", rank=rank, world=world, start_step=start, position=plan.position(start),
             per_worker_batch=plan.per_worker, resumed_world=s.resumed_world_size, job_key=s.job_key,
             node=os.environ.get("SLURMD_NODENAME", ""), **device_fields(dev))
        loss = torch.tensor(float("nan"))
        steps_run = 0
        for step in s.steps(start, state_fn=lambda: {"model": net.state_dict(), "optim": opt.state_dict()}):
            x, y = batch(args.seed, plan.samples(step))
            loss = train_step(model, opt, x.to(dev.device), y.to(dev.device), args.step_sleep)
            steps_run += 1
        flat = torch.cat([t.detach().flatten() for t in net.state_dict().values()])
        emit(event="done", rank=rank, world=world, final_step=s.step, samples=plan.position(s.step),
             steps_this_run=steps_run, start_step=start, loss=float(loss.detach()),
             params_sha256=param_digest(net), params=[float(v) for v in flat[:32]],
             param_norm=float(flat.double().norm()))
    if world > 1:
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
