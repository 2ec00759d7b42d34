"""DL2's online learning from live experience: ``rlsched train --online JOURNAL --out DIR``.

The controller, running ``dl2``, records every slot it decided into an experience journal
(:mod:`controller.experience`: the state, mask and action of each inference, DL2's reward of the slot
observed at the next slot's round, the next slot's first state). :func:`update_online` reads that journal
and updates a DL2 checkpoint with the actor-critic step of DL2's online RL
(:func:`trainer.dl2.train.ac_update`: the critic to ``r + gamma V(s')``, the actor by the advantage-weighted
log-likelihood plus ``beta`` x entropy) on mini-batches drawn at random from an experience-replay buffer
of the journal's newest ``replay`` samples (:class:`trainer.dl2.train.Replay`), and writes a new checkpoint
(actor and critic). It never touches the checkpoint the controller runs: the researcher decides when the
controller loads the new one (``controller.policy = "dl2:DIR/dl2"``, then SIGHUP or a restart).

* **Which experience.** Every record whose state / action layout (``spec``) is the checkpoint's; the others
  are skipped and counted (a journal written by a policy of another ``J`` or job-type list). Records of
  other weights than the checkpoint's are used too (replay is off-policy, as the seed's buffer is); the
  summary counts them.
* **How many updates.** ``updates`` mini-batches; by default one per recorded slot, the seed's rate (one
  mini-batch at each slot's end), at least one.
* **The critic.** The checkpoint's (``critic.{k}``) when it has one, else a new one with the actor's hidden
  sizes (its first updates then fit the value before the advantages mean much).
* **Provenance.** The new checkpoint's JSON keeps the parent's ``training`` and appends to ``online`` one
  entry per update run: the parent's weights sha256, the journal, records / samples / slots used and
  skipped, the slots' time span, updates, mean losses, hyper-parameters.

Defaults are the seed's (section 6.1): Adam at 0.0001, mini-batch 256, gamma 0.9, beta 0.1, replay 8192.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

__all__ = ["OnlineConfig", "OnlineError", "read_journal", "update_online"]


class OnlineError(ValueError):
    """Input that cannot be used (no usable experience, a bad checkpoint); one line."""


@dataclass
class OnlineConfig:
    """What :func:`update_online` runs (module docstring)."""

    updates: int | None = None  # None: one per recorded slot (at least 1)
    batch: int = 256
    lr: float = 1e-4
    gamma: float = 0.9
    beta: float = 0.1
    replay: int = 8192
    seed: int = 0


def read_journal(journal: str | Path, spec: Any, warn: Callable[[str], None] | None = None) -> tuple[list, dict[str, Any]]:
    """The transitions of ``journal`` whose layout is ``spec``'s (oldest first) and what was read:
    ``records``, ``skipped_spec``, ``samples``, ``first`` / ``last`` (slot start times, s) and
    ``weights`` (weights sha256 -> samples recorded with them).

    :raises controller.experience.ExperienceError: the journal cannot be read (one line).
    """
    from controller.experience import read_experience

    want = spec.to_dict()
    keys = ("J", "types", "features", "scales", "obs_size", "n_actions")
    out, skipped, weights = [], 0, {}
    for rec in read_experience(journal, warn=warn):
        got = rec.meta["spec"]
        if any(got.get(k) != want.get(k) for k in keys) or got.get("arch", "flat") != want["arch"]:
            skipped += 1
            continue
        out.append(rec.transition)
        sha = rec.meta.get("weights_sha256") or "unknown"
        weights[sha] = weights.get(sha, 0) + len(rec.transition)
    info = {"records": len(out), "skipped_spec": skipped, "samples": int(sum(len(t) for t in out)),
            "first": out[0].time if out else None, "last": out[-1].time if out else None, "weights": weights}
    return out, info


def _torch_mlp(layers: list[tuple[np.ndarray, np.ndarray]]):
    """A torch MLP (:func:`trainer.dl2.train._mlp`) holding ``layers`` (``(W (out, in), b)``)."""
    from trainer.dl2.train import _load_layers, _mlp

    model = _mlp([layers[0][0].shape[1], *(w.shape[0] for w, _b in layers)])
    _load_layers(model, layers)
    return model


def update_online(checkpoint: str | Path, journal: str | Path, out: str | Path, cfg: OnlineConfig | None = None,
                  log: Callable[[str], None] = print, warn: Callable[[str], None] | None = None) -> tuple[Path, dict[str, Any]]:
    """Update the DL2 ``checkpoint`` from the experience in ``journal`` (module docstring); write ``out``
    (``NAME`` -> ``NAME.json`` + ``NAME.safetensors``). Returns the new JSON path and this run's summary.

    :raises OnlineError: the journal holds no experience of the checkpoint's layout.
    :raises CheckpointError, ExperienceError: unreadable checkpoint / journal (one line each).
    """
    import torch

    from policies.dl2 import load_dl2_critic, save_dl2
    from trainer.dl2.train import Replay, _mlp, _net, _weights, ac_update, torch_actor

    cfg = cfg or OnlineConfig()
    t0 = time.perf_counter()
    net, meta, jpath, critic_layers = load_dl2_critic(checkpoint)
    spec = net.spec
    trans, info = read_journal(journal, spec, warn=warn)
    if not info["samples"]:
        raise OnlineError(f"{journal}: no experience of {jpath.name}'s layout (J={spec.J}, {len(spec.types)} job types, "
                          f"arch {spec.arch}, remaining {spec.remaining}, counts {spec.counts}): "
                          f"{info['records']} usable records, {info['skipped_spec']} of another layout")
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    actor = torch_actor(net)
    if critic_layers is not None:
        critic = _torch_mlp(critic_layers)
    else:
        critic = _mlp([spec.obs_size, *net.hidden, 1])
    replay = Replay(cfg.replay, spec.obs_size, spec.n_actions)
    for t in trans:
        replay.add(t)
    updates = cfg.updates if cfg.updates is not None else max(len(trans), 1)
    opt_a = torch.optim.Adam(actor.parameters(), lr=cfg.lr)
    opt_c = torch.optim.Adam(critic.parameters(), lr=cfg.lr)
    losses = [ac_update(actor, critic, opt_a, opt_c, replay.sample(rng, cfg.batch), cfg.gamma, cfg.beta)
              for _ in range(updates)]
    run = {"parent_weights_sha256": meta.get("weights_sha256"), "parent": str(jpath), "journal": str(journal),
           **info, "replay_samples": replay.n, "updates": updates,
           "actor_loss": float(np.mean([x[0] for x in losses])), "critic_loss": float(np.mean([x[1] for x in losses])),
           "config": asdict(cfg), "wall_s": round(time.perf_counter() - t0, 2)}
    if not (math.isfinite(run["actor_loss"]) and math.isfinite(run["critic_loss"])):
        raise OnlineError(f"{journal}: the update diverged (actor loss {run['actor_loss']}, critic loss "
                          f"{run['critic_loss']}); nothing written")
    extra = {k: v for k, v in meta.items() if k not in ("format", "format_version", "spec", "actor_layers",
                                                        "weights_file", "weights_sha256")}
    extra["online"] = [*(meta.get("online") or []), run]
    new = save_dl2(out, _net(actor, spec), spec, extra=extra, critic=_weights(critic))
    log(f"wrote {new}: {updates} actor-critic updates on {replay.n} replayed samples of {info['records']} slots "
        f"(actor loss {run['actor_loss']:.4f}, critic loss {run['critic_loss']:.4f})")
    return new, run


# ---------------------------------------------------------------------- `rlsched train --online`
#: ``rlsched train`` options that mean something here; every other given one is refused in --online mode
_OWN = {"online", "online_updates", "init", "out", "seed", "lr", "gamma", "func", "command"}


def add_arguments(p) -> None:
    """``rlsched train``'s ``--online`` options (the rest of that command trains the placement PPO policies)."""
    from rlsched.argtypes import positive_int

    p.add_argument(
        "--online", metavar="JOURNAL", default=None,
        help="DL2 online mode: update a DL2 checkpoint from the experience journal the controller records while "
             "it runs dl2 (STATE_DIR/experience; trainer/dl2/online.py): actor-critic updates with experience "
             "replay, written to OUT/dl2.json + OUT/dl2.safetensors. --init CKPT is the DL2 checkpoint to "
             "update (default: the one the journal's records name, else the shipped dl2); --seed, --lr (default "
             "1e-4) and --gamma (default 0.9) apply; the controller keeps its checkpoint until it is pointed at "
             "the new one")
    p.add_argument("--online-updates", type=positive_int, default=None, metavar="N",
                   help="with --online: mini-batch updates (default: one per recorded slot)")


def _default_checkpoint(journal: Path) -> Path:
    """The checkpoint the journal's newest record names when its file exists, else the shipped one."""
    from controller.experience import read_experience
    from policies.dl2 import shipped_dl2

    named = ""
    for rec in read_experience(journal, warn=lambda _m: None):
        named = rec.meta.get("checkpoint") or named
    return Path(named) if named and Path(named).is_file() else shipped_dl2()


def run_cli(args) -> int:
    """``rlsched train --online JOURNAL --out DIR``; exit 2 with one line on bad input."""
    import sys

    from controller.experience import ExperienceError
    from policies.checkpoint import CheckpointError

    def fail(msg: str) -> int:
        print(f"rlsched train --online: error: {msg}", file=sys.stderr)
        return 2

    given = sorted(k for k, v in vars(args).items() if k not in _OWN and v not in (None, False))
    if given:
        return fail(f"{', '.join('--' + k.replace('_', '-') for k in given)} do not apply to --online "
                    "(it takes --init, --out, --seed, --lr, --gamma, --online-updates)")
    journal = Path(args.online)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        return fail(f"--out {out} exists and is not a directory")
    if args.gamma is not None and not 0.0 <= args.gamma <= 1.0:
        return fail(f"--gamma must be in [0, 1], got {args.gamma}")
    cfg = OnlineConfig(updates=args.online_updates, seed=0 if args.seed is None else args.seed,
                       lr=1e-4 if args.lr is None else args.lr, gamma=0.9 if args.gamma is None else args.gamma)
    try:
        ckpt = Path(args.init) if args.init else _default_checkpoint(journal)
        out.mkdir(parents=True, exist_ok=True)
        new, run = update_online(ckpt, journal, out / "dl2", cfg, log=lambda s: print(s, flush=True),
                                 warn=lambda m: print(f"rlsched train --online: warning: {m}", file=sys.stderr))
    except (ExperienceError, CheckpointError, OnlineError) as exc:
        return fail(str(exc))
    except OSError as exc:
        return fail(f"{exc.filename or out}: {exc.strerror or exc}")
    print(json.dumps({k: v for k, v in run.items() if k != "config"}, indent=2, default=str))
    return 0
