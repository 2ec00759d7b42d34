"""Prometheus metrics and JSON log lines of the controller.

Each :class:`Metrics` owns its registry (so tests and several controllers in
one process do not collide) and, with ``port > 0``, serves it over HTTP
(``/metrics``), with the controller's status page beside it when a controller
is given (``/status``, ``/status.json``: :mod:`controller.status_page`).
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["Metrics", "JsonFormatter", "setup_logging"]


class Metrics:
    """Counters: rounds, decisions, preemptions, Slurm errors, state-dir write errors; gauges: queue, GPUs; latency histogram (s)."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.rounds = Counter("rlsched_rounds", "Scheduling rounds completed", ["outcome"], registry=r)
        self.decisions = Counter("rlsched_decisions", "Actions applied", ["action"], registry=r)
        self.preemptions = Counter("rlsched_preemptions", "Preemptions", ["outcome"], registry=r)
        self.slurm_errors = Counter("rlsched_slurm_errors", "Slurm commands that failed or timed out", registry=r)
        self.state_dir_errors = Counter(
            "rlsched_state_dir_errors", "Writes to the state dir (journal, status.json, lock pid) that failed", registry=r
        )
        self.placement_mismatch = Counter(
            "rlsched_placement_mismatch", "Jobs Slurm started with another per-node GPU split than planned", registry=r
        )
        self.latency = Histogram(
            "rlsched_decision_latency_seconds",
            "Policy decision time per round",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=r,
        )
        self.round_time = Histogram(
            "rlsched_round_seconds", "Whole round time (Slurm reads, policy, actions)",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30), registry=r,
        )
        self.queue = Gauge("rlsched_queue_length", "Held jobs waiting for placement", registry=r)
        self.running = Gauge("rlsched_running_jobs", "Managed jobs running", registry=r)
        self.waiting = Gauge(
            "rlsched_waiting_jobs", "Managed jobs held for a reason of their own (dependency, begin time)", registry=r
        )
        self.agents = Gauge("rlsched_agents", "Node agents configured", registry=r)
        self.agents_unreachable = Gauge(
            "rlsched_agents_unreachable", "Node agents that did not answer the last round (or not as the agent)",
            registry=r,
        )
        self.free_gpus = Gauge("rlsched_free_gpus", "Free GPUs in the managed partition", registry=r)
        self.policy_info = Gauge("rlsched_policy_info", "Active policy (value 1)", ["policy"], registry=r)
        self.port: int | None = None
        self.server: Any = None
        self.status_page: Any = None

    def serve(self, port: int, address: str = "0.0.0.0", controller: Any = None) -> None:
        """Serve ``/metrics`` on ``address:port`` from a daemon thread (``port`` 0: nothing) and, with
        ``controller``, its status page beside it (:func:`controller.status_page.start_server`).
        ``OSError`` when the address cannot be bound."""
        if port > 0:
            from controller.status_page import start_server

            self.server, self.status_page = start_server(self.registry, port, address, controller)
            self.port = port

    def set_policy(self, name: str) -> None:
        self.policy_info.clear()
        self.policy_info.labels(policy=name).set(1)

    def value(self, name: str, **labels: str) -> float:
        v = self.registry.get_sample_value(name, labels or None)
        return float(v or 0.0)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg and any ``extra={"event": ...}`` fields."""

    _std = set(vars(logging.makeLogRecord({})))

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for k, v in vars(record).items():
            if k not in self._std and k not in out and not k.startswith("_"):
                out[k] = v
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup_logging(log_file: str | None, level: int = logging.INFO, max_bytes: int = 10 * 1024 * 1024,
                  backups: int = 5) -> None:
    """Send the controller's logs as JSON lines to stderr and, optionally, ``log_file``.

    ``log_file`` is rotated (:class:`logging.handlers.RotatingFileHandler`) once a line would take it
    past ``max_bytes`` bytes: it becomes ``log_file.1`` (older ones move up to ``.backups``, the oldest
    is deleted). ``max_bytes=0``: never rotated."""
    root = logging.getLogger("controller")
    handlers: list[logging.Handler] = [logging.StreamHandler()]
    if log_file:  # opened first: a log file that cannot be opened (OSError) leaves logging as it was
        handlers.append(logging.handlers.RotatingFileHandler(log_file, maxBytes=max_bytes, backupCount=backups))
    root.setLevel(level)
    root.propagate = False
    for h in list(root.handlers):
        root.removeHandler(h)
        h.close()
    for h in handlers:
        h.setFormatter(JsonFormatter())
        root.addHandler(h)
