#!/usr/bin/env python3
"""Example job: an MLP regressor on synthetic data, with rlsched checkpoint/preemption support.

    python scripts/examples/train_mlp.py                              # single process, ~35 s on a CPU core
    srun -n 2 python scripts/examples/train_mlp.py --total-steps 300  # DDP: NCCL on GPUs, else gloo

Data for step s on rank r is drawn from a generator seeded by (seed, s, r), so a run that is
preempted and resumed computes exactly the same updates as an uninterrupted one; the final
line printed is JSON with the step count and a digest of the parameters.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from _common import (base_parser, configure, device_fields, emit, param_digest, setup_device,  # noqa: E402
                     setup_distributed, step_generator, wrap_ddp)
from nodeagent.jobhelper import JobSession  # noqa: E402

IN, OUT = 32, 4


def main() -> int:
    p = base_parser("MLP on synthetic regression data", "MLP")
    p.add_argument("--hidden", type=int, default=128)
    p.set_defaults(total_steps=20000)  # about 35 s single-process on one CPU core
    args = p.parse_args()
    configure(args)
    dev = setup_device(args)
    rank, world = setup_distributed(dev, always=args.process_group)
    net = nn.Sequential(nn.Linear(IN, args.hidden), nn.ReLU(), nn.Linear(args.hidden, args.hidden), nn.ReLU(),
                        nn.Linear(args.hidden, OUT)).to(dev.device)
    target = torch.randn(IN, OUT, generator=torch.Generator().manual_seed(args.seed + 7))
    model = wrap_ddp(net, dev)
    opt = torch.optim.Adam(net.parameters(), lr=args.lr)
    with JobSession.from_env(job_key=args.job_key, store=args.store, model=args.model_name,
                             total_steps=args.total_steps, report_every=args.report_every,
                             ckpt_every=args.ckpt_every,
                             reference_samples_per_s=args.reference_samples_per_s) as s:
        start, state = s.resume()
        if state is not None:
            net.load_state_dict(state["model"])
            opt.load_state_dict(state["optim"])
        emit(event="start", rank=rank, world=world, start_step=start, job_key=s.job_key,
             **device_fields(dev))
        loss = torch.tensor(float("nan"))
        steps_run = 0
        for step in s.steps(start, state_fn=lambda: {"model": net.state_dict(), "optim": opt.state_dict()},
                            samples_per_step=args.batch_size * world):
            g = step_generator(args.seed, step, rank)
            x = torch.randn(args.batch_size, IN, generator=g)
            y = torch.tanh(x @ target) + 0.01 * torch.randn(args.batch_size, OUT, generator=g)
            loss = nn.functional.mse_loss(model(x.to(dev.device)), y.to(dev.device))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            steps_run += 1
            if args.step_sleep:
                time.sleep(args.step_sleep)
        emit(event="done", rank=rank, final_step=s.step, steps_this_run=steps_run, start_step=start,
             loss=float(loss.detach()), params_sha256=param_digest(net), comm_fraction=s.comm_fraction,
             profile=s.profile.as_dict() if s.profile else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
