"""Controller configuration: a TOML file, validated with errors naming the key.

Example (``slurm_conf/controller.toml.example`` has every key)::

    [slurm]
    conf = "/etc/slurm/slurm.conf"
    partition = "gpu"
    command_timeout_s = 20

    [controller]
    policy = "greedy"
    interval_s = 5
    state_dir = "/var/lib/rlsched"

    [metrics]
    port = 9810

    [agents]
    port_base = 50050          # agent of node k (1-based in cluster order) at 127.0.0.1:port_base+k
    auth = "sharedkey:/etc/rlsched/agent.key"

Units: seconds, GB/s. Unknown keys are errors (typos must not pass silently).
"""

from __future__ import annotations

import errno
import math
import os
import shutil
import socket
import stat
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

__all__ = [
    "ConfigError",
    "ControllerConfig",
    "SlurmSection",
    "ControllerSection",
    "MetricsSection",
    "AgentsSection",
    "SLURM_COMMANDS",
    "StartProblem",
    "start_problems",
    "load_config",
]


class ConfigError(ValueError):
    """A controller config file is missing, unparsable or has a bad value; names file and key."""


@dataclass
class SlurmSection:
    conf: str | None = None  # slurm.conf path; None: Slurm's default / $SLURM_CONF
    partition: str | None = None  # manage only this partition's marked jobs; None: any
    command_timeout_s: float = 20.0
    bin_dir: str | None = None
    libslurm: bool = True  # pin and release in one RPC through libslurm (22.05; with conf set, no bin_dir)


@dataclass
class ControllerSection:
    policy: str = "greedy"  # heuristic name or rl-base / rl-hybrid
    policy_checkpoint: str | None = None  # RL policy weights (safetensors)
    interval_s: float = 5.0
    state_dir: str = "/var/lib/rlsched"
    log_file: str | None = None  # JSON log lines; None: stderr only
    log_max_bytes: int = 10 * 1024 * 1024  # log_file is rotated at this size (bytes); 0: never
    log_backups: int = 5  # rotated log files kept (log_file.1 .. log_file.N)
    capacity_file: str | None = None  # partition GPUs for job_submit.lua; None: state_dir/capacity
    reason_updates_per_round: int = 10  # scontrol calls per round that write held jobs' reasons; 0: off
    default_model: str = "Transformer-XL"  # profile of jobs whose comment names no model
    default_runtime_s: float = 3600.0  # work estimate when neither samples nor a time limit is given
    start_grace_s: float = 60.0  # a released job that has not started after this is held again
    requeue_settle_s: float = 5.0  # a requeued job starts no earlier than this after its release
    cs_preempt_threshold: float = 0.0  # preempt a job whose measured CS exceeds this (0: off)
    min_run_s: float = 60.0  # never preempt a job that started less than this ago
    preempt_timeout_s: float = 60.0  # how long an agent may take to checkpoint
    preempt_without_agent: bool = False  # requeue without a checkpoint when the agent is unreachable
    max_placements_per_round: int = 64
    intra_bw_gbps: float = 16.0
    inter_bw_gbps: float = 5.0
    dry_run: bool = False  # log decisions, change nothing
    experience_dir: str | None = None  # learned elastic policies' experience journal; None: state_dir/experience
    experience_max_bytes: int = 256 * 1024 * 1024  # cap on that journal (oldest segments go); 0: record nothing


@dataclass
class MetricsSection:
    port: int = 0  # Prometheus port; 0: off
    address: str = "0.0.0.0"


@dataclass
class AgentsSection:
    enabled: bool = True
    port_base: int = 0  # agent for the k-th node (1-based) at host:port_base+k; 0: use [agents.addresses]
    host: str = "127.0.0.1"  # with port_base; "{node}" is replaced by the node name
    addresses: dict[str, str] = field(default_factory=dict)  # node name -> "host:port"
    auth: str = "munge"  # nodeagent.auth.make_authenticator spec
    timeout_s: float = 10.0


@dataclass
class ControllerConfig:
    slurm: SlurmSection = field(default_factory=SlurmSection)
    controller: ControllerSection = field(default_factory=ControllerSection)
    metrics: MetricsSection = field(default_factory=MetricsSection)
    agents: AgentsSection = field(default_factory=AgentsSection)
    path: str | None = None
    #: ``[controller]`` values set on the command line (``--policy``...): a reload keeps them
    overrides: dict[str, Any] = field(default_factory=dict)

    def agent_address(self, node: str, index: int) -> str | None:
        """Agent address of ``node`` (``index``: 0-based position in the cluster)."""
        a = self.agents
        if not a.enabled:
            return None
        if node in a.addresses:
            return a.addresses[node]
        if a.port_base:
            return f"{a.host.replace('{node}', node)}:{a.port_base + index + 1}"
        return None


_SECTIONS = {"slurm": SlurmSection, "controller": ControllerSection, "metrics": MetricsSection, "agents": AgentsSection}


def _check(where: str, key: str, value: Any, typ: Any) -> Any:
    """Validate one value against a dataclass field annotation (as a string)."""
    t = str(typ)
    optional = "None" in t
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{where}.{key}: must not be empty")
    if t.startswith("float"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}.{key}: expected a number, got {value!r}")
        try:
            v = float(value)
        except OverflowError:  # an integer beyond float range
            v = math.inf
        if not math.isfinite(v):  # TOML has nan and inf; no setting means either
            raise ConfigError(f"{where}.{key}: expected a finite number, got {value!r}")
        return v
    if t.startswith("int"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}.{key}: expected an integer, got {value!r}")
        return value
    if t.startswith("bool"):
        if not isinstance(value, bool):
            raise ConfigError(f"{where}.{key}: expected true or false, got {value!r}")
        return value
    if t.startswith("dict"):
        if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            raise ConfigError(f"{where}.{key}: expected a table of strings, got {value!r}")
        return dict(value)
    if t.startswith("str"):
        if not isinstance(value, str):
            raise ConfigError(f"{where}.{key}: expected a string, got {value!r}")
        return value
    return value


def _build(where: str, cls: type, raw: Any):
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a table, got {raw!r}")
    known = {f.name: f for f in fields(cls)}
    for k in raw:
        if k not in known:
            raise ConfigError(f"{where}.{k}: unknown key (known: {', '.join(sorted(known))})")
    kw = {k: _check(where, k, v, known[k].type) for k, v in raw.items()}
    return cls(**kw)


#: Longest round interval (a day): the daemon waits with ``Event.wait``, which raises ``OverflowError``
#: past ``threading.TIMEOUT_MAX``; a round a day is no scheduler anyway.
MAX_INTERVAL_S = 86400.0


def _validate(cfg: ControllerConfig, where: str) -> None:
    c, s, m, a = cfg.controller, cfg.slurm, cfg.metrics, cfg.agents
    positive = [
        ("slurm.command_timeout_s", s.command_timeout_s),
        ("controller.interval_s", c.interval_s),
        ("controller.default_runtime_s", c.default_runtime_s),
        ("controller.start_grace_s", c.start_grace_s),
        ("controller.preempt_timeout_s", c.preempt_timeout_s),
        ("controller.intra_bw_gbps", c.intra_bw_gbps),
        ("controller.inter_bw_gbps", c.inter_bw_gbps),
        ("agents.timeout_s", a.timeout_s),
    ]
    for key, v in positive:
        if v <= 0:
            raise ConfigError(f"{where}{key}: must be > 0, got {v:g}")
    if c.interval_s > MAX_INTERVAL_S:
        raise ConfigError(f"{where}controller.interval_s: must be at most {MAX_INTERVAL_S:g} s (a day), got {c.interval_s:g}")
    if c.requeue_settle_s < 0 or c.requeue_settle_s >= c.start_grace_s:
        raise ConfigError(f"{where}controller.requeue_settle_s: must be >= 0 and < start_grace_s ({c.start_grace_s:g}), got {c.requeue_settle_s:g}")
    if c.min_run_s < 0:
        raise ConfigError(f"{where}controller.min_run_s: must be >= 0, got {c.min_run_s:g}")
    if c.cs_preempt_threshold != 0 and c.cs_preempt_threshold <= 1:
        raise ConfigError(f"{where}controller.cs_preempt_threshold: must be 0 (off) or > 1 (CS >= 1), got {c.cs_preempt_threshold:g}")
    for key, v in (("log_max_bytes", c.log_max_bytes), ("log_backups", c.log_backups),
                   ("reason_updates_per_round", c.reason_updates_per_round),
                   ("experience_max_bytes", c.experience_max_bytes)):
        if v < 0:
            raise ConfigError(f"{where}controller.{key}: must be >= 0, got {v}")
    if c.max_placements_per_round < 1:
        raise ConfigError(f"{where}controller.max_placements_per_round: must be >= 1")
    if not (0 <= m.port <= 65535):
        raise ConfigError(f"{where}metrics.port: must be 0..65535, got {m.port}")
    if not (0 <= a.port_base <= 65000):
        raise ConfigError(f"{where}agents.port_base: must be 0..65000, got {a.port_base}")
    for node, addr in a.addresses.items():
        host, _, port = addr.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"{where}agents.addresses.{node}: expected HOST:PORT, got {addr!r}")
    if not c.policy.strip():
        raise ConfigError(f"{where}controller.policy: must name a policy")
    try:
        from policies.workloads import canonical_model

        c.default_model = canonical_model(c.default_model)
    except KeyError as exc:
        raise ConfigError(f"{where}controller.default_model: {exc}") from None


def parse_config(doc: dict, where: str = "") -> ControllerConfig:
    """Build a config from a parsed TOML document. ``where``: prefix for messages (``"file: "``)."""
    for k in doc:
        if k not in _SECTIONS:
            raise ConfigError(f"{where}[{k}]: unknown section (known: {', '.join(_SECTIONS)})")
    kw = {name: _build(f"{where}{name}", cls, doc.get(name, {})) for name, cls in _SECTIONS.items()}
    cfg = ControllerConfig(**kw)
    _validate(cfg, where)
    return cfg


def load_config(path: str | Path | None) -> ControllerConfig:
    """Read and validate a TOML config; ``None`` gives the defaults."""
    if path is None:
        cfg = parse_config({})
        return cfg
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{p}: config file not found") from None
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: not UTF-8 text (byte {exc.start})") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML: {exc}") from None
    cfg = parse_config(doc, where=f"{p}: ")
    cfg.path = str(p)
    return cfg


# --------------------------------------------------------------------------- what the daemon needs at start

#: The Slurm commands the controller runs (:class:`controller.slurm.SlurmCLI`).
SLURM_COMMANDS = ("scontrol", "squeue", "sinfo")


@dataclass(frozen=True)
class StartProblem:
    """Something the daemon needs at start that this host lacks: the config key and why.

    ``fatal``: the daemon would fail (or run uselessly: no Slurm command, no metrics port); otherwise
    the outcome depends on the user the daemon runs as (a port below 1024 as a user other than root),
    and ``check-config`` warns."""

    key: str
    message: str
    fatal: bool = True


def _conf_problem(path: str) -> str | None:
    """Why ``path`` is no readable slurm.conf (not found, not a regular file, unreadable), or None."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return f"{path} does not exist"
    except OSError as exc:
        return f"{path}: cannot look at it: {exc.strerror}"
    if not stat.S_ISREG(st.st_mode):
        return f"{path} is not a regular file"
    if not os.access(path, os.R_OK):
        return f"{path} is not readable"
    return None


def _resolve_problem(host: str) -> str | None:
    """Why ``host`` (a name or address) does not resolve (``getaddrinfo``), or None."""
    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        return f"host {host!r} does not resolve ({getattr(exc, 'strerror', None) or exc})"
    return None


def _bind_problem(address: str, port: int) -> StartProblem | None:
    """Why a TCP server could not listen on ``address:port`` (tried: bound and closed at once; not fatal for a
    permission error, which depends on the daemon's user), or None: it can."""
    try:
        infos = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        return StartProblem("metrics.address", f"{address!r} does not resolve ({getattr(exc, 'strerror', None) or exc})")
    family, socktype, proto, _, sockaddr = infos[0]
    try:
        with socket.socket(family, socktype, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as http.server does
            sock.bind(sockaddr)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return StartProblem("metrics.port", f"port {port} on {address} is already in use")
        if exc.errno == errno.EACCES:
            return StartProblem("metrics.port", f"port {port} on {address} needs privileges this user lacks", False)
        key = "metrics.address" if exc.errno == errno.EADDRNOTAVAIL else "metrics.port"
        return StartProblem(key, f"cannot listen on {address}:{port}: {exc.strerror or exc}")
    return None


def start_problems(cfg: ControllerConfig, *, environ: dict[str, str] | None = None) -> list[StartProblem]:
    """What the daemon of ``cfg`` needs at start and this host lacks, in config order (empty: nothing).

    Checked, reading and binding only (nothing is made or kept open):

    * ``slurm.conf``: the file exists, is a regular file and readable (unset: ``$SLURM_CONF`` if set, else
      Slurm's built-in path, which only the Slurm commands know);
    * ``slurm.bin_dir``: the folder exists and holds :data:`SLURM_COMMANDS` as executables (unset: they are
      on ``PATH``);
    * ``metrics.address`` / ``metrics.port`` (port > 0): the address resolves and the port can be bound now;
    * ``agents.addresses`` and ``agents.host`` (when agents are enabled): every host resolves (a ``host`` with
      ``{node}`` is resolved per node by the daemon once Slurm names the nodes, so it is not checked here).

    The state dir, the log file, the agent key and the policy are checked by ``rlsched controller check-config``
    itself (:func:`controller.cli.cmd_check`)."""
    env = os.environ if environ is None else environ
    out: list[StartProblem] = []
    s, m, a = cfg.slurm, cfg.metrics, cfg.agents
    if s.conf is not None:
        problem = _conf_problem(s.conf)
        if problem:
            out.append(StartProblem("slurm.conf", problem))
    elif env.get("SLURM_CONF"):
        problem = _conf_problem(env["SLURM_CONF"])
        if problem:
            out.append(StartProblem("slurm.conf", f"unset, and $SLURM_CONF names {problem}"))
    if s.bin_dir is not None:
        if not os.path.isdir(s.bin_dir):
            out.append(StartProblem("slurm.bin_dir", f"{s.bin_dir} is not a directory"))
        else:
            for cmd in SLURM_COMMANDS:
                exe = os.path.join(s.bin_dir, cmd)
                if not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
                    out.append(StartProblem("slurm.bin_dir", f"{exe} is not an executable file"))
                    break
    else:
        missing = [cmd for cmd in SLURM_COMMANDS if shutil.which(cmd, path=env.get("PATH")) is None]
        if missing:
            out.append(StartProblem("slurm.bin_dir", f"unset, and {', '.join(missing)} not found on PATH: install "
                                    "the Slurm client commands or set slurm.bin_dir"))
    if m.port > 0:
        got = _bind_problem(m.address, m.port)
        if got:
            out.append(got)
    if a.enabled:
        for node, addr in a.addresses.items():
            host = addr.rpartition(":")[0].strip("[]")
            problem = _resolve_problem(host)
            if problem:
                out.append(StartProblem(f"agents.addresses.{node}", problem))
        if a.port_base and "{node}" not in a.host:
            problem = _resolve_problem(a.host)
            if problem:
                out.append(StartProblem("agents.host", problem))
    return out
