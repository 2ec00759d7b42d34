#!/usr/bin/env python3
"""Example job: a tiny causal Transformer language model on a synthetic token stream.

    python scripts/examples/train_tiny_lm.py                               # ~45 s on one core
    srun -n 2 python scripts/examples/train_tiny_lm.py --total-steps 200   # DDP: NCCL on GPUs, else gloo

The "language" is noisy modular arithmetic sequences (x_{t+1} = x_t + d mod V, with 5%
random tokens), so the loss visibly falls within a few hundred steps on a CPU. Batches
are a pure function of (seed, step, rank): preemption + resume reproduces the
uninterrupted run exactly. The final stdout line is JSON (steps, loss, parameter digest).
"""

from __future__ import annotations

import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from _common import (base_parser, configure, device_fields, emit, param_digest, setup_device,  # noqa: E402
                     setup_distributed, step_generator, wrap_ddp)
from nodeagent.jobhelper import JobSession  # noqa: E402


class TinyLM(nn.Module):
    """Decoder-only Transformer: tokens (B, T) int64 -> logits (B, T, vocab)."""

    def __init__(self, vocab: int, d_model: int, n_layers: int, n_heads: int, seq_len: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.zeros(1, seq_len, d_model))
        layer = nn.TransformerEncoderLayer(d_model, n_heads, dim_feedforward=4 * d_model, dropout=0.0,
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq_len), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        h = self.tok(x) + self.pos[:, :t]
        h = self.blocks(h, mask=self.mask[:t, :t], is_causal=True)
        return self.head(h)


def batch(args, step: int, rank: int) -> torch.Tensor:
    g = step_generator(args.seed, step, rank)
    b, t, v = args.batch_size, args.seq_len + 1, args.vocab
    start = torch.randint(0, v, (b, 1), generator=g)
    delta = torch.randint(1, 4, (b, 1), generator=g)
    seq = (start + delta * torch.arange(t)) % v
    noise = torch.rand(b, t, generator=g) < 0.05
    return torch.where(noise, torch.randint(0, v, (b, t), generator=g), seq)


def main() -> int:
    p = base_parser("tiny Transformer LM on a synthetic token stream", "LM")
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.set_defaults(batch_size=16, total_steps=5000, lr=3e-3)  # ~45 s single-process on one core
    args = p.parse_args()
    configure(args)
    dev = setup_device(args)
    rank, world = setup_distributed(dev, always=args.process_group)
    net = TinyLM(args.vocab, args.d_model, args.layers, args.heads, args.seq_len).to(dev.device)
    model = wrap_ddp(net, dev)
    opt = torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=0.01)
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
        loss_v, steps_run, t0 = math.nan, 0, time.perf_counter()
        for step in s.steps(start, state_fn=lambda: {"model": net.state_dict(), "optim": opt.state_dict()},
                            samples_per_step=args.batch_size * world):
            tokens = batch(args, step, rank).to(dev.device)
            logits = model(tokens[:, :-1])
            loss = nn.functional.cross_entropy(logits.reshape(-1, args.vocab), tokens[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            loss_v = loss.item()
            steps_run += 1
            if rank == 0 and step % 50 == 0:
                print(f"step {step} loss {loss_v:.3f}", file=sys.stderr, flush=True)
            if args.step_sleep:
                time.sleep(args.step_sleep)
        emit(event="done", rank=rank, final_step=s.step, steps_this_run=steps_run, start_step=start,
             loss=loss_v, params_sha256=param_digest(net), comm_fraction=s.comm_fraction,
             profile=s.profile.as_dict() if s.profile else None,
             seconds=round(time.perf_counter() - t0, 3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
