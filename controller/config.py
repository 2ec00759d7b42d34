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

import math
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

__all__ = ["ConfigError", "ControllerConfig", "SlurmSection", "ControllerSection", "MetricsSection", "AgentsSection", "load_config"]


class ConfigError(ValueError):
    """A controller config file is missing, unparsable or has a bad value; names file and key."""


@dataclass
class SlurmSection:
    conf: str | None = None  # slurm.conf path; None: Slurm's default / $SLURM_CONF
    partition: str | None = None  # manage only this partition's marked jobs; None: any
    command_timeout_s: float = 20.0
    bin_dir: str | None = None


@dataclass
class ControllerSection:
    policy: str = "greedy"  # heuristic name or rl-base / rl-hybrid
    policy_checkpoint: str | None = None  # RL policy weights (safetensors)
    interval_s: float = 5.0
    state_dir: str = "/var/lib/rlsched"
    log_file: str | None = None  # JSON log lines; None: stderr only
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
