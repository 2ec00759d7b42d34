"""``rlsched train-sizefree``: the training run of ``rl-sf`` (:func:`trainer.sizefree.train.train`).

``rlsched train-sizefree --out OUT`` clones a teacher (default the ``greedy`` heuristic; with DAgger
rounds), fine-tunes with MaskablePPO on uniform 1..32-GPU job sets on 4x8 and 16x8, and writes
``OUT.json`` + ``OUT.safetensors``. The shipped ``rl-sf`` is
``rlsched train-sizefree --out OUT --clusters 4x8,16x8,16x8:64 --expert best`` (docs/RL.md).
"""

from __future__ import annotations

import argparse
import shlex
import sys

from rlsched.argtypes import float_in_range
from rlsched.argtypes import positive_int as _positive_int

__all__ = ["register"]

#: argparse type: a number in [0, 1]
_unit = float_in_range(0.0, 1.0)


def register(sub: argparse._SubParsersAction) -> None:
    from trainer.sizefree.train import SizeFreeTrainConfig

    d = SizeFreeTrainConfig()
    p = sub.add_parser("train-sizefree", help="train the cluster-size-free policy rl-sf (cloning, then MaskablePPO)")
    p.add_argument("--out", required=True, help="checkpoint path NAME (writes NAME.json + NAME.safetensors)")
    p.add_argument("--clusters", default=",".join(d.clusters), help="training clusters, comma-separated; CLUSTER:G draws that cluster's sets with demands "
                        "up to G instead of --max-gpus, e.g. 16x8:64 (default: %(default)s)")
    p.add_argument("--max-gpus", type=_positive_int, default=d.max_gpus, help="largest demand (default: %(default)s)")
    p.add_argument("--demands", default=",".join(d.demands),
                   help="demand distributions of the training sets, comma-separated (uniform, pow2, deepshare; "
                        "default: %(default)s)")
    p.add_argument("--jobs-per-set", type=_positive_int, default=d.jobs_per_set,
                   help="jobs per set (default: %(default)s)")
    p.add_argument("--sets", type=_positive_int, default=d.sets_per_kind,
                   help="training sets per cluster and arrival kind (default: %(default)s)")
    p.add_argument("--dagger", type=int, default=d.dagger, help="DAgger rounds after cloning (default: %(default)s)")
    p.add_argument("--bc-epochs", type=int, default=d.bc_epochs,
                   help="epochs per cloning fit; 0: no cloning, PPO fine-tunes the --init network "
                        "(default: %(default)s)")
    p.add_argument("--ppo-timesteps", type=int, default=d.ppo_timesteps,
                   help="PPO steps, 0: none (default: %(default)s)")
    p.add_argument("--ppo-lr", type=float, default=d.ppo_lr, help="PPO learning rate (default: %(default)s)")
    p.add_argument("--ent-coef", type=float, default=d.ent_coef, help="PPO entropy coefficient (default: %(default)s)")
    p.add_argument("--expert", choices=("greedy", "nosplit", "lgtf", "best", "planner"), default=d.expert,
                   help="the teacher: a heuristic (greedy, nosplit: SRTF order on that placement slot; lgtf: "
                        "least remaining GPU-time first on the greedy slot), best (per training set the one of "
                        "greedy and lgtf with the lower average JCT on it), or the lookahead planner (DAgger "
                        "labels from its decisions on the states the network visits) (default: %(default)s)")
    p.add_argument("--teacher", default=None,
                   help="the planner with --expert planner, as a policy name (default: the preemptive planner "
                        "trainer.sizefree.dagger.TEACHER_PREEMPT with --preempt, else the non-preemptive TEACHER)")
    p.add_argument("--preempt", type=int, default=d.preempt,
                   help="preempt candidates K of the codec spec: the network may stop up to K running jobs "
                        "(0: none; default: %(default)s)")
    p.add_argument("--compare", default=d.compare,
                   help="checkpoint (or rl-sf, the shipped one) also run on the validation sets, 'none' for none "
                        "(default: %(default)s)")
    p.add_argument("--init", default=None,
                   help="start from this size-free checkpoint's weights (rl-sf: the shipped one); the first "
                        "round then labels the network's own states")
    p.add_argument("--ppo-n-steps", type=_positive_int, default=d.n_steps,
                   help="PPO rollout steps per environment per update (default: %(default)s)")
    p.add_argument("--subproc", action="store_true", help="PPO rollouts in subprocesses (SubprocVecEnv)")
    p.add_argument("--w1", type=_unit, default=None,
                   help="PPO maximises the seed's reward -W1*CS + W2*Util (W2 = 1 - W1, a reward-weight branch; "
                        "the fine-tuned network is written) instead of minus the average JCT (default)")
    p.add_argument("--seed", type=int, default=d.seed, help="seed (default: %(default)s)")
    p.set_defaults(func=_run)


#: (option, attribute) of every option, in the order the recorded command names them
_OPTIONS = (("--out", "out"), ("--clusters", "clusters"), ("--max-gpus", "max_gpus"), ("--demands", "demands"),
            ("--jobs-per-set", "jobs_per_set"), ("--sets", "sets"), ("--dagger", "dagger"),
            ("--bc-epochs", "bc_epochs"), ("--expert", "expert"), ("--teacher", "teacher"), ("--compare", "compare"),
            ("--init", "init"), ("--preempt", "preempt"), ("--ppo-timesteps", "ppo_timesteps"), ("--ppo-lr", "ppo_lr"),
            ("--ppo-n-steps", "ppo_n_steps"), ("--ent-coef", "ent_coef"), ("--w1", "w1"), ("--seed", "seed"))


def _command(args: argparse.Namespace) -> str:
    """The run's command line with every option spelled out (recorded in the checkpoint)."""
    parts = ["rlsched", "train-sizefree"]
    for flag, attr in _OPTIONS:
        if ((attr == "teacher" and args.expert != "planner") or (attr in ("init", "w1") and getattr(args, attr) is None)
                or (attr == "preempt" and not getattr(args, "preempt", 0))):
            continue
        parts += [flag, str(getattr(args, attr))]
    if args.subproc:
        parts.append("--subproc")
    return " ".join(shlex.quote(p) for p in parts)


def _run(args: argparse.Namespace) -> int:
    from policies.base import PolicyError
    from policies.cluster import ClusterSpec, ClusterSpecError
    from trainer.sizefree.train import SizeFreeTrainConfig, split_cluster, train

    from trainer.generate import DEMAND_DISTRIBUTIONS

    clusters = tuple(c.strip() for c in args.clusters.split(",") if c.strip())
    demands = tuple(d.strip() for d in args.demands.split(",") if d.strip())
    try:
        if not clusters:
            raise ValueError("--clusters is empty")
        bad = [d for d in demands if d not in DEMAND_DISTRIBUTIONS] if demands else ["(none)"]
        if bad:
            raise ValueError(f"--demands: {', '.join(bad)} is not one of {', '.join(DEMAND_DISTRIBUTIONS)}")
        for c in clusters:
            ClusterSpec.parse(split_cluster(c)[0])
        if args.dagger < 0 or args.ppo_timesteps < 0:
            raise ValueError("--dagger and --ppo-timesteps must be >= 0")
        if args.bc_epochs < 0 or (args.bc_epochs == 0 and not args.init):
            raise ValueError("--bc-epochs must be >= 1, or 0 with --init (PPO from that network)")
        if not 0 <= args.preempt <= 256:
            raise ValueError(f"--preempt must be in [0, 256], got {args.preempt}")
        if not (0 < args.ppo_lr < 1) or not (0 <= args.ent_coef < 1):
            raise ValueError("--ppo-lr must be in (0, 1) and --ent-coef in [0, 1)")
        if args.teacher is None:
            from trainer.sizefree.dagger import TEACHER, TEACHER_PREEMPT

            args.teacher = TEACHER_PREEMPT if args.preempt else TEACHER
        if args.expert == "planner":
            from policies.planner import make_planner

            make_planner(args.teacher, ClusterSpec.parse(split_cluster(clusters[0])[0]))
    except PolicyError as exc:
        print(f"rlsched train-sizefree: error: --teacher: {exc}", file=sys.stderr)
        return 2
    except (ClusterSpecError, ValueError) as exc:
        print(f"rlsched train-sizefree: error: {exc}", file=sys.stderr)
        return 2
    cfg = SizeFreeTrainConfig(clusters=clusters, max_gpus=args.max_gpus, demands=demands,
                              jobs_per_set=args.jobs_per_set, sets_per_kind=args.sets, dagger=args.dagger,
                              bc_epochs=args.bc_epochs,
                              ppo_timesteps=args.ppo_timesteps, ppo_lr=args.ppo_lr, ent_coef=args.ent_coef,
                              expert=args.expert, teacher=args.teacher, n_steps=args.ppo_n_steps,
                              compare=None if args.compare.lower() == "none" else args.compare,
                              init=args.init, subproc=args.subproc, seed=args.seed, w1=args.w1,
                              preempt=args.preempt)
    command = _command(args)
    train(cfg, args.out, log=lambda s: print(s, flush=True), command=command)
    return 0
