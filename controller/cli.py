"""``rlsched controller run|status|check-config``.

``run`` starts the daemon (foreground; systemd runs it as
``rlsched-controller.service``); ``status`` prints what the running daemon
last did (from ``state_dir/status.json``); ``check-config`` validates a
config file and exits 0 or 2 with the bad key named.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from pathlib import Path

from controller.config import MAX_INTERVAL_S, ConfigError, load_config
from rlsched.argtypes import float_in_range, port_or_zero

DEFAULT_CONFIG = "/etc/rlsched/controller.toml"


def _config_path(args: argparse.Namespace) -> str | None:
    p = args.config or os.environ.get("RLSCHED_CONTROLLER_CONFIG")
    if p:
        return p
    return DEFAULT_CONFIG if Path(DEFAULT_CONFIG).exists() else None


def _load(args: argparse.Namespace):
    cfg = load_config(_config_path(args))
    c = cfg.controller
    if getattr(args, "policy", None):
        cfg.overrides["policy"] = args.policy
    if getattr(args, "interval", None) is not None:
        if not math.isfinite(args.interval) or args.interval <= 0:
            raise ConfigError(f"--interval: must be a finite number > 0, got {args.interval:g}")
        cfg.overrides["interval_s"] = args.interval
    if getattr(args, "state_dir", None):
        cfg.overrides["state_dir"] = args.state_dir
    for k, v in cfg.overrides.items():
        setattr(c, k, v)
    if getattr(args, "metrics_port", None) is not None:
        cfg.metrics.port = args.metrics_port
    return cfg


def cmd_run(args: argparse.Namespace) -> int:
    from controller.daemon import Controller, make_policy  # noqa: F401 - import errors surface early
    from controller.metrics import setup_logging

    cfg = _load(args)
    try:
        setup_logging(cfg.controller.log_file)
    except OSError as exc:
        raise ConfigError(f"controller.log_file {cfg.controller.log_file}: cannot open it: {exc}") from None
    try:
        ctl = Controller(cfg)
    except OSError as exc:
        raise ConfigError(f"controller.state_dir {cfg.controller.state_dir}: {exc}") from None
    ctl.lock_state_dir()
    try:
        # a bad heuristic name stops the start-up here; RL policies need the
        # cluster's shape, so Controller.run() checks them at its first round
        if not cfg.controller.policy.lower().startswith("rl"):
            from policies.heuristics import make_heuristic
            from policies.perf import ContentionModel

            make_heuristic(cfg.controller.policy, ContentionModel())
        try:
            ctl.metrics.serve(cfg.metrics.port, cfg.metrics.address)
        except OSError as exc:  # port in use, an address that does not resolve
            raise ConfigError(f"metrics.port {cfg.metrics.port} / metrics.address {cfg.metrics.address!r}: "
                              f"cannot serve Prometheus metrics there: {exc}") from None
        ctl.install_signals()
        ctl.run(max_rounds=1 if args.once else None)
        return 0 if (ctl.last is None or ctl.last.ok or not args.once) else 1
    finally:
        ctl.unlock_state_dir()


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (another user's counts: signal 0 is refused, not unknown)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _status_pid(state_dir: Path) -> int | None:
    """The pid a controller wrote to ``status.json`` (None: no file, or none in it)."""
    try:
        pid = json.loads((state_dir / "status.json").read_text()).get("pid")
    except (OSError, ValueError, AttributeError):
        return None
    return pid if isinstance(pid, int) and not isinstance(pid, bool) else None


def running_controller(state_dir: Path) -> int | None:
    """Pid of a live controller on ``state_dir``, from the pid its lock file (``controller.lock``, see
    :meth:`~controller.daemon.Controller.lock_state_dir`) or ``status.json`` names; None when neither
    names a live process. Reading only: taking the lock to test it could fail a controller starting then."""
    try:
        text = (state_dir / "controller.lock").read_text().strip()
    except OSError:
        text = ""
    for pid in (int(text) if text.isdigit() else None, _status_pid(state_dir)):
        if pid is not None and pid_alive(pid):
            return pid
    return None


def _state_dir(args: argparse.Namespace) -> Path:
    """``--state-dir``, else the config's ``controller.state_dir``."""
    return Path(args.state_dir) if args.state_dir else Path(load_config(_config_path(args)).controller.state_dir)


def cmd_status(args: argparse.Namespace) -> int:
    state_dir = _state_dir(args)
    f = state_dir / "status.json"
    try:
        doc = json.loads(f.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{f}: no status yet (is the controller running with this state_dir?)") from None
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    from rich.console import Console
    from rich.table import Table

    con = Console()
    age = time.time() - float(doc.get("time", 0))
    lr = doc.get("last_round", {})
    pid = doc.get("pid")
    gone = isinstance(pid, int) and not pid_alive(pid)
    con.print(
        f"policy [bold]{doc.get('policy')}[/], {doc.get('rounds')} rounds, last {age:.0f} s ago "
        f"(pid {pid}{', [red]not running[/]' if gone else ''}); queue {lr.get('queue')}, running {lr.get('running')}"
        + (f"; [red]error: {lr.get('error')}[/]" if lr.get("error") else "")
    )
    t = Table(title="recent actions")
    for col in ("time", "action", "job", "GPUs per node"):
        t.add_column(col)
    for h in doc.get("history", []):
        t.add_row(time.strftime("%H:%M:%S", time.localtime(h["t"])), h["action"], str(h["job"]),
                  ", ".join(f"{k}:{v}" for k, v in h.get("detail", {}).items()))
    con.print(t)
    return 0


def _check_request_owner(state_dir: Path) -> None:
    """:class:`ConfigError` unless this process's effective user owns ``state_dir`` (the controller's user):
    the controller deletes each request once done, which it cannot do with files another user (root)
    made in a folder that user made."""
    from controller.daemon import user_name

    try:
        owner = state_dir.stat().st_uid
    except FileNotFoundError:
        raise ConfigError(f"{state_dir}: no such state dir (the controller makes it when it starts; "
                          "is this its controller.state_dir?)") from None
    if owner != os.geteuid():
        name = user_name(owner)
        raise ConfigError(f"{state_dir} belongs to {name}, the controller's user, not {user_name(os.geteuid())}: "
                          f"run this as {name} (runuser -u {name} -- rlsched controller preempt ...), so that "
                          "the controller can remove the request once it has acted on it")


def cmd_preempt(args: argparse.Namespace) -> int:
    """Ask the running controller to checkpoint-and-requeue jobs (next round). All ids are checked before
    anything is written; the caller must be the state dir's owner; no live controller: a warning."""
    bad = [j for j in args.job_ids if not re.fullmatch(r"[0-9]+", j)]
    if bad:
        raise ConfigError(f"job ids must be numbers, got {', '.join(map(repr, bad))}; nothing requested")
    ids = list(dict.fromkeys(str(int(j)) for j in args.job_ids))
    state_dir = _state_dir(args)
    _check_request_owner(state_dir)
    d = state_dir / "requests"
    written: list[Path] = []
    try:
        d.mkdir(exist_ok=True)  # a controller started before it made the folder itself
        for j in ids:
            f = d / f"preempt-{j}"
            f.write_text("")
            written.append(f)
    except OSError as exc:
        for f in written:
            f.unlink(missing_ok=True)
        raise ConfigError(f"{d}: cannot write a request: {exc.strerror or exc}; nothing requested") from None
    for j in ids:
        print(f"preemption of job {j} requested (applied at the controller's next round)")
    if running_controller(state_dir) is None:
        print(f"rlsched controller: warning: no controller seems to be running on {state_dir} (no live pid in "
              "controller.lock or status.json): the request waits until one starts", file=sys.stderr)
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    """Validate the file, then build its agent authenticator (``[agents] auth``, as the daemon does with
    ``make_auth``: an unknown spec or an unusable key file is exit 2 here, where the daemon would run
    without agents) and its policy (``make_policy``).

    A heuristic needs nothing else. An RL policy needs the live partition's
    shape, which only Slurm knows: with ``--cluster`` it is built for that
    shape; without, for the shape its checkpoint was trained on (the shipped
    4x8 one when no checkpoint is named). So an unknown name or a checkpoint
    that is missing or does not load fails here, exit 2 with one line, instead
    of at the daemon's first round.
    """
    cfg = load_config(args.path)
    if cfg.agents.enabled:  # the daemon builds it at its first round and, if that fails, runs without agents
        from controller.preemption import make_auth

        try:
            make_auth(cfg.agents.auth, cfg.slurm.conf)
        except ConfigError as exc:
            raise ConfigError(f"{args.path}: {exc}") from None
    from controller.daemon import make_policy
    from policies.base import PolicyError
    from policies.cluster import ClusterSpec
    from policies.perf import ContentionModel

    c = cfg.controller
    name = c.policy.strip()
    rl = name.lower().startswith("rl")
    key = "controller.policy"
    shape = ""
    try:
        if args.cluster:
            cluster = ClusterSpec.parse(args.cluster)
            shape = f"; built for {cluster.describe()}"
        else:
            cluster = ClusterSpec.parse(_RL_DEFAULT_SHAPE)  # heuristics work on any shape
            ckpt = _named_checkpoint(name, c.policy_checkpoint) if rl else None
            if ckpt is not None:
                from policies.checkpoint import load_checkpoint

                if ":" not in name:
                    key = "controller.policy_checkpoint"
                cluster = load_checkpoint(ckpt).cluster
                shape = f"; trained on {cluster.describe()}: the partition must have that shape"
            elif rl and name.lower() != "rl-prior":
                shape = f"; checked with the shipped {_RL_DEFAULT_SHAPE} checkpoint: other shapes need their own"
        key = "controller.policy"
        make_policy(name, cluster, ContentionModel(cluster), c.policy_checkpoint)
    except PolicyError as exc:
        raise PolicyError(f"{args.path}: {key}: {exc}") from None
    print(f"{args.path}: OK (policy {c.policy}, interval {c.interval_s:g} s{shape})")
    return 0


#: cluster shape of the shipped RL checkpoints (policies/checkpoints/rl-*-4x8.*)
_RL_DEFAULT_SHAPE = "4x8"


def _named_checkpoint(policy: str, policy_checkpoint: str | None) -> str | None:
    """The checkpoint an RL policy name uses, as ``policies.rl.make_rl_policy`` picks it
    (``NAME:/path`` first, then ``policy_checkpoint``); None: the shipped one for the shape."""
    mode, sep, path = policy.partition(":")
    if mode.strip().lower() == "rl-prior" and not sep:
        return None
    if sep:
        return path or None
    return policy_checkpoint or None


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("controller", help="the placement daemon beside slurmctld")
    csub = p.add_subparsers(dest="controller_command", metavar="SUBCOMMAND")
    r = csub.add_parser("run", help="run the controller (foreground)")
    r.add_argument("--config", help=f"TOML config (default $RLSCHED_CONTROLLER_CONFIG or {DEFAULT_CONFIG})")
    r.add_argument("--policy", help="override controller.policy")
    r.add_argument("--interval", type=float_in_range(0.0, MAX_INTERVAL_S, lo_open=True),
                   help=f"override controller.interval_s (seconds, in (0, {MAX_INTERVAL_S:g}])")
    r.add_argument("--state-dir", help="override controller.state_dir")
    r.add_argument("--metrics-port", type=port_or_zero, help="override metrics.port (1..65535; 0: off)")
    r.add_argument("--once", action="store_true", help="run one round and exit (status 1 if it failed)")
    r.set_defaults(func=cmd_run)
    s = csub.add_parser("status", help="what the running controller did last")
    s.add_argument("--config")
    s.add_argument("--state-dir")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_status)
    q = csub.add_parser("preempt", help="checkpoint and requeue running jobs (operator request)")
    q.add_argument("job_ids", nargs="+", metavar="JOBID")
    q.add_argument("--config")
    q.add_argument("--state-dir")
    q.set_defaults(func=cmd_preempt)
    c = csub.add_parser("check-config", help="validate a controller config file and build its policy")
    c.add_argument("path")
    c.add_argument("--cluster", metavar="NODESxGPUS",
                   help="build the policy for this cluster shape (e.g. 4x8, or a cluster file); default: "
                        "the RL checkpoint's training shape (shipped checkpoints: 4x8)")
    c.set_defaults(func=cmd_check)
    p.set_defaults(func=lambda a: (p.print_help(), 2)[1])
