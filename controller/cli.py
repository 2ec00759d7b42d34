"""``rlsched controller run|status|check-config``.

``run`` starts the daemon (foreground; systemd runs it as
``rlsched-controller.service``); ``status`` prints what the running daemon
last did (from ``state_dir/status.json``); ``check-config`` validates a
config file (``PATH`` or ``--config``) and what the daemon needs at start
(files exist, addresses resolve, the metrics port can be bound), and exits
0 or 2 with the bad key named.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import stat
import sys
import time
from pathlib import Path

from controller.config import MAX_INTERVAL_S, ConfigError, load_config, start_problems
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
        setup_logging(cfg.controller.log_file, max_bytes=cfg.controller.log_max_bytes,
                      backups=cfg.controller.log_backups)
    except OSError as exc:
        raise ConfigError(f"controller.log_file {cfg.controller.log_file}: cannot open it: {exc}") from None
    try:
        ctl = Controller(cfg)
    except OSError as exc:
        sd = cfg.controller.state_dir
        raise ConfigError(f"controller.state_dir {sd}: {dir_problem(sd) or exc.strerror or exc}") from None
    ctl.lock_state_dir()
    try:
        # a bad heuristic name stops the start-up here; RL policies need the
        # cluster's shape, so Controller.run() checks them at its first round
        if not cfg.controller.policy.lower().startswith("rl"):
            from policies.cluster import ClusterSpec
            from policies.registry import make_policy

            # the registry's error lists every policy name (heuristics and RL); any shape builds a heuristic
            make_policy(cfg.controller.policy, ClusterSpec.parse(_RL_DEFAULT_SHAPE))
        try:
            ctl.metrics.serve(cfg.metrics.port, cfg.metrics.address, controller=ctl)  # + status page
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
    except (ProcessLookupError, OverflowError):  # OverflowError: beyond pid_t, no process's
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


def _nearest_existing(path: Path) -> tuple[Path, os.stat_result]:
    """``path`` (made absolute) or its nearest ancestor that exists, with its ``stat`` (symbolic links followed).
    ValueError, saying why, when a folder on the way cannot be looked at or is a symbolic link to nothing."""
    p = Path(os.path.abspath(path))
    while True:
        try:
            return p, p.stat()
        except (FileNotFoundError, NotADirectoryError):  # not there, or a file on the way: look further up
            if p.is_symlink():
                raise ValueError(f"{p} is a symbolic link to nothing") from None
            p = p.parent  # "/" always exists
        except OSError as exc:
            raise ValueError(f"cannot look at {p}: {exc.strerror or exc}") from None


def _write_problem(folder: Path) -> str | None:
    """Why this process cannot make files in ``folder`` (an existing folder), or None."""
    if os.access(folder, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids):
        return None
    try:
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            return f"{folder} is on a read-only file system"
    except OSError:
        pass
    from controller.daemon import user_name

    return f"{folder} is not writable by {user_name(os.geteuid())}"


def dir_problem(path: str | Path) -> str | None:
    """Why the controller could not make or use the folder ``path`` (``controller.state_dir``: ``Controller``
    makes it with its parents), or None when it can. Nothing is made: ``path`` itself when it exists, else its
    nearest existing ancestor, must be a folder that this process's user can write into."""
    try:
        found, st = _nearest_existing(Path(path))
    except ValueError as exc:
        return str(exc)
    there = found == Path(os.path.abspath(path))
    if not stat.S_ISDIR(st.st_mode):
        return "not a directory" if there else f"cannot be made: {found} is not a directory"
    problem = _write_problem(found)
    return f"{'' if there else 'cannot be made: '}{problem}" if problem else None


def file_problem(path: str | Path) -> str | None:
    """Why no user could open ``path`` to append to it (``controller.log_file``), or None. Only what is wrong
    for every user: whether its folder exists and who may write there depends on who starts the controller
    (systemd makes /var/log/rlsched, ``LogsDirectory``, only then)."""
    try:
        found, st = _nearest_existing(Path(path))
    except ValueError as exc:
        return str(exc)
    if found == Path(os.path.abspath(path)):
        return "a directory, not a file" if stat.S_ISDIR(st.st_mode) else None
    return None if stat.S_ISDIR(st.st_mode) else f"cannot be made: {found} is not a directory"


def _bad_status(f: Path, why: str) -> ConfigError:
    return ConfigError(f"{f}: not a valid status file ({why})")


_JSON_TYPES = {"list": "array", "str": "string", "int": "number", "float": "number", "bool": "true/false",
               "NoneType": "null"}


def _finite(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _clock(t: float) -> str:
    """``t`` (seconds since the epoch) as local HH:MM:SS; ValueError when no clock time is that."""
    try:
        return time.strftime("%H:%M:%S", time.localtime(t))
    except (OverflowError, OSError) as exc:
        raise ValueError(str(exc)) from None


def read_status(state_dir: Path) -> dict:
    """``state_dir/status.json`` as the controller writes it (``Controller._write_status``); :class:`ConfigError`,
    one line naming the file, when there is none, it cannot be read, or it is not such a document."""
    try:
        found, st = _nearest_existing(state_dir)
    except ValueError as exc:
        raise ConfigError(f"{state_dir}: cannot use it as a state dir: {exc}") from None
    if not stat.S_ISDIR(st.st_mode):
        if found == Path(os.path.abspath(state_dir)):
            raise ConfigError(f"{state_dir}: not a directory (a state dir is a folder)")
        raise ConfigError(f"{state_dir}: no such state dir: {found} is not a directory")
    f = state_dir / "status.json"
    try:
        text = f.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{f}: no status yet (is the controller running with this state_dir?)") from None
    except IsADirectoryError:
        raise _bad_status(f, "a directory") from None
    except UnicodeDecodeError as exc:
        raise _bad_status(f, f"not UTF-8 text, byte {exc.start}") from None
    except OSError as exc:
        raise ConfigError(f"{f}: cannot read: {exc.strerror or exc}") from None
    if not text.strip():
        raise _bad_status(f, "empty")
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise _bad_status(f, f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise _bad_status(f, f"a JSON {_JSON_TYPES.get(type(doc).__name__, 'value')}, not an object")
    for key, ok, what in (
        ("time", _finite, "a number"),
        ("pid", lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
        ("policy", lambda v: isinstance(v, str), "a string"),
        ("rounds", lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
        ("last_round", lambda v: isinstance(v, dict), "an object"),
        ("history", lambda v: isinstance(v, list), "an array"),
    ):
        if key not in doc:
            raise _bad_status(f, f"no {key!r}")
        if not ok(doc[key]):
            raise _bad_status(f, f"{key!r} must be {what}, got {doc[key]!r:.40}")
    try:
        _clock(doc["time"])
        for i, h in enumerate(doc["history"]):
            if not (isinstance(h, dict) and _finite(h.get("t")) and isinstance(h.get("action"), str) and "job" in h
                    and isinstance(h.get("detail", {}), dict)):
                raise ValueError(f"history[{i}] is not an action (t, action, job, detail)")
            _clock(h["t"])
    except ValueError as exc:
        raise _bad_status(f, str(exc)) from None
    return doc


def cmd_status(args: argparse.Namespace) -> int:
    doc = read_status(_state_dir(args))
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    con = Console()
    age = time.time() - doc["time"]
    lr = doc["last_round"]
    pid = doc["pid"]
    gone = not pid_alive(pid)
    con.print(
        f"policy [bold]{escape(doc['policy'])}[/], {doc['rounds']} rounds, last {age:.0f} s ago "
        f"(pid {pid}{', [red]not running[/]' if gone else ''}); "
        f"queue {escape(str(lr.get('queue', '?')))}, running {escape(str(lr.get('running', '?')))}"
        + (f", waiting {escape(str(lr['waiting']))} (dependency or begin time)" if lr.get("waiting") else "")
        + (f"; [red]error: {escape(str(lr.get('error')))}[/]" if lr.get("error") else "")
    )
    agents = doc.get("agents")
    if isinstance(agents, dict) and agents.get("configured"):
        bad = agents.get("unreachable") if isinstance(agents.get("unreachable"), list) else []
        con.print(f"agents: {escape(str(agents['configured']))} configured"
                  + (f", [red]not answering: {escape(', '.join(map(str, bad)))}[/]" if bad else ", all answering"))
    t = Table(title="recent actions")
    for col in ("time", "action", "job", "GPUs per node"):
        t.add_column(col)
    for h in doc["history"]:
        t.add_row(_clock(h["t"]), escape(h["action"]), escape(str(h["job"])),
                  escape(", ".join(f"{k}:{v}" for k, v in h.get("detail", {}).items())))
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
        d.mkdir(exist_ok=True)  # the controller makes it when it starts; made here too in case none has
        for j in ids:
            f = d / f"preempt-{j}"
            f.write_text("")
            written.append(f)
    except OSError as exc:
        for f in written:
            f.unlink(missing_ok=True)
        raise ConfigError(f"{d}: cannot write a request: {exc.strerror or exc}; nothing requested") from None
    for j in ids:
        print(f"preemption of job {j} requested (applied at the controller's next round; `rlsched controller status` "
              "shows a failure, e.g. a job without the checkpoint helper)")
    if running_controller(state_dir) is None:
        print(f"rlsched controller: warning: no controller seems to be running on {state_dir} (no live pid in "
              "controller.lock or status.json): the request waits until one starts", file=sys.stderr)
    return 0


def _check_path(args: argparse.Namespace) -> str:
    """The file ``check-config`` checks: ``PATH`` or ``--config`` (one of them, or both the same), else the
    file ``run`` would read ($RLSCHED_CONTROLLER_CONFIG, then /etc/rlsched/controller.toml if it exists)."""
    if args.path and args.config and os.path.abspath(args.path) != os.path.abspath(args.config):
        raise ConfigError(f"two config files given ({args.path} and --config {args.config}): check one at a time")
    path = args.path or _config_path(args)
    if not path:
        raise ConfigError(f"no config file to check: give PATH or --config (no $RLSCHED_CONTROLLER_CONFIG, "
                          f"no {DEFAULT_CONFIG})")
    return path


def cmd_check(args: argparse.Namespace) -> int:
    """Validate the file, check what the daemon needs at start on this host (state dir, log file, and
    :func:`controller.config.start_problems`: slurm.conf, the Slurm commands, the metrics address and port,
    the agents' hosts), then build its agent authenticator (``[agents] auth``, as the daemon does with
    ``make_auth``: an unknown spec or an unusable key file is exit 2 here, where the daemon would run
    without agents) and its policy (``make_policy``).

    A heuristic needs nothing else. An RL policy needs the live partition's
    shape, which only Slurm knows: with ``--cluster`` it is built for that
    shape; without, for the shape its checkpoint was trained on (the shipped
    4x8 one when no checkpoint is named). So an unknown name or a checkpoint
    that is missing or does not load fails here, exit 2 with one line, instead
    of at the daemon's first round.
    """
    path = _check_path(args)
    cfg = load_config(path)
    c = cfg.controller
    problem = dir_problem(c.state_dir)
    if problem and os.geteuid() != 0 and " is not writable by " in problem:
        # who may write there depends on who starts the controller (root, or its service user):
        # an admin checking the file as themselves gets a warning, not a failure
        print(f"warning: {path}: controller.state_dir {c.state_dir}: {problem} (fine if the controller runs as "
              "another user)", file=sys.stderr)
    elif problem:
        raise ConfigError(f"{path}: controller.state_dir {c.state_dir}: {problem}")
    problem = c.log_file and file_problem(c.log_file)
    if problem:
        raise ConfigError(f"{path}: controller.log_file {c.log_file}: {problem}")
    for problem in start_problems(cfg):
        if not problem.fatal and os.geteuid() != 0:
            print(f"warning: {path}: {problem.key}: {problem.message} (fine if the controller runs as root)",
                  file=sys.stderr)
        elif problem.key == "metrics.port" and "already in use" in problem.message and (
            (pid := running_controller(Path(c.state_dir))) is not None
        ):
            print(f"note: {path}: {problem.key}: {problem.message}, by the running controller (pid {pid}); a "
                  "restart frees it", file=sys.stderr)
        else:
            raise ConfigError(f"{path}: {problem.key}: {problem.message}")
    if cfg.agents.enabled:  # the daemon builds it at its first round and, if that fails, runs without agents
        from controller.preemption import make_auth

        try:
            make_auth(cfg.agents.auth, cfg.slurm.conf)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None
    from controller.daemon import make_policy
    from policies.base import PolicyError
    from policies.cluster import ClusterSpec
    from policies.perf import ContentionModel

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
            from policies.registry import is_sizefree

            if rl and is_sizefree(name, c.policy_checkpoint):  # rl-base / rl-hybrid / rl-sf: one network, any shape
                if ckpt is not None:
                    from policies.sizefree import load_sizefree

                    if ":" not in name:
                        key = "controller.policy_checkpoint"
                    load_sizefree(ckpt)
                shape = "; size-free: runs on any cluster shape"
            elif ckpt is not None:
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
        raise PolicyError(f"{path}: {key}: {exc}") from None
    print(f"{path}: OK (policy {c.policy}, interval {c.interval_s:g} s{shape})")
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
    config_help = f"TOML config (default $RLSCHED_CONTROLLER_CONFIG or {DEFAULT_CONFIG})"
    r.add_argument("--config", help=config_help)
    r.add_argument("--policy", help="override controller.policy")
    r.add_argument("--interval", type=float_in_range(0.0, MAX_INTERVAL_S, lo_open=True),
                   help=f"override controller.interval_s (seconds, in (0, {MAX_INTERVAL_S:g}])")
    r.add_argument("--state-dir", help="override controller.state_dir")
    r.add_argument("--metrics-port", type=port_or_zero, help="override metrics.port (1..65535; 0: off)")
    r.add_argument("--once", action="store_true", help="run one round and exit (status 1 if it failed)")
    r.set_defaults(func=cmd_run)
    s = csub.add_parser("status", help="what the running controller did last",
                        description="Print what the controller last did, from STATE_DIR/status.json.")
    s.add_argument("--config", help=f"{config_help}; its controller.state_dir is read")
    s.add_argument("--state-dir", help="the controller's state dir (default: controller.state_dir of the config)")
    s.add_argument("--json", action="store_true", help="print status.json as JSON, for scripts")
    s.set_defaults(func=cmd_status)
    q = csub.add_parser("preempt", help="checkpoint and requeue running jobs (operator request)",
                        description="Ask the running controller to checkpoint and requeue jobs at its next round "
                                    "(a request file in STATE_DIR/requests; run it as the controller's user).")
    q.add_argument("job_ids", nargs="+", metavar="JOBID", help="Slurm job id")
    q.add_argument("--config", help=f"{config_help}; its controller.state_dir is used")
    q.add_argument("--state-dir", help="the controller's state dir (default: controller.state_dir of the config)")
    q.set_defaults(func=cmd_preempt)
    c = csub.add_parser("check-config", help="validate a controller config file and build its policy")
    c.add_argument("path", nargs="?", metavar="PATH",
                   help=f"the TOML config to check (or --config; default, as for run: $RLSCHED_CONTROLLER_CONFIG "
                        f"or {DEFAULT_CONFIG})")
    c.add_argument("--config", help="the same as PATH (as run, status and preempt take it)")
    c.add_argument("--cluster", metavar="NODESxGPUS",
                   help="build the policy for this cluster shape (e.g. 4x8, or a cluster file); default: "
                        "the RL checkpoint's training shape (shipped checkpoints: 4x8)")
    c.set_defaults(func=cmd_check)
    p.set_defaults(func=lambda a: (p.print_help(), 2)[1])
