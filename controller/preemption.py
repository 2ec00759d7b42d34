"""Checkpoint-based preemption through the node agents, behind a small interface.

The controller only needs two things from the agents, expressed by
:class:`Preempter`:

* ``stats()``: measured progress / throughput / CS per Slurm job id (best
  effort: an unreachable agent contributes nothing);
* ``checkpoint(job)``: ask the job to write a durable checkpoint and stop;
  returns a :class:`PreemptOutcome`. The agent runs the preemption
  asynchronously (its ``Preempt`` answers at once with an operation, polled
  with ``PreemptStatus``: ``AgentClient.preempt``); ``checkpoint`` waits for the
  outcome up to ``timeout_s`` plus the client timeout, as one long call did.

After a successful checkpoint the controller requeues the job in held state
(``scontrol requeuehold``) and places it again later; the job resumes from its
checkpoint. When no agent answers, nothing is preempted (unless
``preempt_without_agent`` is set, then the job is requeued and restarts from
whatever checkpoint it has): an agent that is down never loses a job.

Agents' replies are authenticated (``nodeagent.client``: code
``UNAUTHENTICATED_REPLY`` when a reply is not signed by the node's agent).
Such a reply is never taken as a checkpoint, nor as stats: whatever answered
on the agent's port is not the agent. It does not count as reaching an agent
(``reached_agent``), and it also rules out ``preempt_without_agent``'s requeue
(``unverified_reply``): something posing as the agent must not be able to
get a job requeued without its checkpoint.

:class:`AgentPreempter` talks to ``nodeagent.client.AgentClient``;
:class:`NoAgents` is used when agents are disabled or the agent package is not
installed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from controller.config import ConfigError
from controller.slurm import SlurmJob
from controller.state import PROFILED_ALONE

#: ``AgentError.code`` (``nodeagent.client.UNAUTHENTICATED_REPLY``) of a reply not signed by the node's agent;
#: spelt out here so that this module needs no agent package.
UNAUTHENTICATED_REPLY = "UNAUTHENTICATED_REPLY"

__all__ = ["PreemptOutcome", "Preempter", "NoAgents", "AgentPreempter", "make_auth", "make_preempter"]

log = logging.getLogger(__name__)

#: ``isolated_source`` of a job's merged stats when its reports' node said "profiled-alone" but another of
#: its nodes' agents did not (or did not report): the throughput is not one measured alone on every node
NOT_ALONE_EVERYWHERE = "profiled-alone-on-some-nodes"


@dataclass(frozen=True)
class PreemptOutcome:
    """Result of asking a job to checkpoint and stop.

    :param ok: a durable checkpoint exists and the job may be requeued.
    :param reached_agent: an agent answered (``False``: nobody to ask). A reply that is not
        authenticated as the agent's is not an agent's answer.
    :param checkpoint_step: optimizer step of the checkpoint (``None``: none).
    :param unverified_reply: something answered on an agent's port with a reply that is not
        authenticated as that node's agent's (an impostor, or an agent older than the controller):
        the job must not be requeued without a checkpoint either (``preempt_without_agent``).
    """

    ok: bool
    reached_agent: bool
    checkpoint_step: int | None = None
    checkpoint_uri: str = ""
    message: str = ""
    unverified_reply: bool = False
    #: every agent that answered said it does not know the job (NOT_FOUND): it does not run the
    #: checkpoint helper (or its agent lost track of it), so no agent can checkpoint it
    unknown_job: bool = False


class Preempter(Protocol):
    def stats(self, job_nodes: Mapping[str, Sequence[str]] | None = None) -> dict[str, dict[str, Any]]:
        """Slurm job id -> latest agent stats for running jobs (may be empty).

        :param job_nodes: Slurm job id -> the nodes Slurm runs it on; when given, a job's stats
            (and the job key preemption will use) are taken only from the agents of its nodes.
        """

    def checkpoint(self, job: SlurmJob, timeout_s: float) -> PreemptOutcome:
        """Checkpoint-and-stop ``job``; never raises for agent failures."""

    def preempted_step(self, slurm_job_id: str, nodes: Sequence[str]) -> int | None:
        """Step of the checkpoint at which the agents of ``nodes`` saw job ``slurm_job_id`` stop for a
        preemption (its final "preempted" report), ``None`` when none did or none answered. Used after a
        controller restart, for a preemption whose agent answer was lost; never raises."""


class NoAgents:
    """No node agents: no measured stats; preemption cannot checkpoint."""

    def stats(self, job_nodes: Mapping[str, Sequence[str]] | None = None) -> dict[str, dict[str, Any]]:
        return {}

    def checkpoint(self, job: SlurmJob, timeout_s: float) -> PreemptOutcome:
        return PreemptOutcome(False, False, message="no node agents configured")

    def preempted_step(self, slurm_job_id: str, nodes: Sequence[str]) -> int | None:
        return None


class AgentPreempter:
    """Preemption and stats via the node agents (one per node).

    :param addresses: node name -> ``host:port`` of its agent.
    :param client_factory: ``(address, node) -> AgentClient``-like object with
        ``job_stats()`` and ``preempt(job_key, slurm_job_id, timeout_s)`` (which starts the
        agent's preemption operation and polls it until it is done or ``timeout_s`` plus its own
        timeout passed; its dict has ``done`` False when the outcome never came); ``node`` is the
        node name its credentials are bound to (the agent refuses those for another node).
    :param probe_factory: the same for the quick ``health()`` asked before each ``Preempt``
        (a client with a short deadline); ``None``: no probe.

    :meth:`checkpoint` fails fast for a node whose agent is in the stats back-off
    (unreachable, not due for a retry yet), and asks a quick ``health()`` before starting a
    preemption: a stopped (SIGSTOP) or wedged agent costs the probe's deadline, not the
    client timeout of the start plus polls until ``preempt_timeout_s``, and is put in the back-off.
    """

    def __init__(self, addresses: dict[str, str], client_factory: Callable[[str, str], Any],
                 probe_factory: Callable[[str, str], Any] | None = None) -> None:
        self.addresses = dict(addresses)
        self._factory = client_factory
        self._probe_factory = probe_factory
        self._clients: dict[str, Any] = {}
        self._probes: dict[str, Any] = {}
        self._keys: dict[str, str] = {}  # slurm job id -> job_key reported by the job
        self.unreachable: set[str] = set()
        self._retry_at: dict[str, float] = {}  # node -> monotonic time of the next stats try
        self._failures: dict[str, int] = {}
        self._foreign: set[tuple[str, str]] = set()  # (node, job id) reports already logged as foreign
        self.unverified: set[str] = set()  # nodes whose last stats reply was not authenticated as their agent's

    def _client(self, node: str) -> Any | None:
        addr = self.addresses.get(node)
        if addr is None:
            return None
        c = self._clients.get(node)
        if c is None:
            c = self._clients[node] = self._factory(addr, node)
        return c

    def _node_stats(self, node: str) -> list[dict]:
        """Stats of one agent; a failing agent is retried with exponential backoff (2 s .. 60 s)."""
        c = self._client(node)
        if c is None or time.monotonic() < self._retry_at.get(node, 0.0):
            return []
        try:
            out = c.job_stats()
        except Exception as exc:  # noqa: BLE001 - any agent failure only loses stats
            self._mark_unreachable(node, exc)
            return []
        if node in self.unreachable:
            log.info("agent of %s is back", node, extra={"event": "agent_back", "node": node})
        self.unreachable.discard(node)
        self.unverified.discard(node)
        self._failures.pop(node, None)
        self._retry_at.pop(node, None)
        return out

    def _mark_unreachable(self, node: str, exc: BaseException) -> None:
        """Put ``node``'s agent in the back-off: stats skip it and :meth:`checkpoint` fails fast there
        until the retry time (2 s doubling to 60 s)."""
        if getattr(exc, "code", "") == UNAUTHENTICATED_REPLY:
            if node not in self.unverified:
                log.error("stats from the agent port of %s ignored: the reply is not from its agent: %s", node, exc,
                          extra={"event": "agent_reply_unverified", "node": node, "rpc": "JobStats"})
            self.unverified.add(node)
        elif node not in self.unreachable:
            log.warning("agent of %s unreachable: %s", node, exc, extra={"event": "agent_unreachable", "node": node})
        self.unreachable.add(node)
        k = self._failures[node] = self._failures.get(node, 0) + 1
        self._retry_at[node] = time.monotonic() + min(60.0, 2.0 ** k)

    def _not_ready(self, node: str) -> str | None:
        """Why ``node``'s agent is not asked to preempt now (None: ask it): it is in the back-off, or
        the quick health probe failed (which puts it there)."""
        if node in self.unverified:
            # something not authenticated as the agent answers there: ask it, so that its reply is
            # classified as unverified (no requeue without a checkpoint), never taken as "no agent"
            return None
        wait = self._retry_at.get(node, 0.0) - time.monotonic()
        if node in self.unreachable and wait > 0:
            return f"{node}: agent unreachable (retried in {wait:.0f} s)"
        addr = self.addresses.get(node)
        if self._probe_factory is None or addr is None:
            return None
        p = self._probes.get(node)
        if p is None:
            p = self._probes[node] = self._probe_factory(addr, node)
        try:
            p.health()
        except Exception as exc:  # noqa: BLE001 - any failure: do not wait on a Preempt there
            if getattr(exc, "code", "") == UNAUTHENTICATED_REPLY:
                return None  # answered, but not as the agent: the Preempt's reply is classified (above)
            self._mark_unreachable(node, exc)
            return f"{node}: health check failed: {exc}"
        return None

    def stats(self, job_nodes: Mapping[str, Sequence[str]] | None = None) -> dict[str, dict[str, Any]]:
        nodes = list(self.addresses)
        if not nodes:
            return {}
        with ThreadPoolExecutor(max_workers=min(8, len(nodes))) as ex:
            results = list(ex.map(self._node_stats, nodes))
        out: dict[str, dict[str, Any]] = {}
        reporting: dict[str, set[str]] = {}  # job id -> nodes whose agents report it
        not_alone: dict[str, set[str]] = {}  # job id -> nodes with a report not measured alone
        for node, per in zip(nodes, results):
            for s in per:
                sid = str(s.get("slurm_job_id") or "")
                if not sid or s.get("state") not in (None, "", "running"):
                    continue
                if job_nodes is not None and node not in job_nodes.get(sid, ()):
                    # not a job of that node (Slurm's view): a stale report, or whatever answers on
                    # the agent's port claiming another node's job; never learn its key from there
                    self._foreign_report(node, sid)
                    continue
                if s.get("job_key"):
                    self._keys[sid] = str(s["job_key"])
                reporting.setdefault(sid, set()).add(node)
                if s.get("isolated_source") != PROFILED_ALONE:
                    not_alone.setdefault(sid, set()).add(node)
                prev = out.get(sid)
                # several ranks/nodes report the same job: keep the most advanced
                if prev is None or (s.get("step") or 0) >= (prev.get("step") or 0):
                    out[sid] = s
        for sid, s in out.items():
            # each agent judges "alone" for its own node: a job was measured alone only if the agents of
            # all its nodes (Slurm's view; without it, of all nodes reporting it) say so
            on = set(job_nodes.get(sid, ())) if job_nodes is not None else reporting[sid]
            if s.get("isolated_source") == PROFILED_ALONE and (not_alone.get(sid) or not on <= reporting[sid]):
                out[sid] = {**s, "isolated_source": NOT_ALONE_EVERYWHERE}
        return out

    def preempted_step(self, slurm_job_id: str, nodes: Sequence[str]) -> int | None:
        best: int | None = None
        for node in nodes:  # only the nodes Slurm ran the job on (the controller recorded them)
            c = self._client(node)
            if c is None or time.monotonic() < self._retry_at.get(node, 0.0):
                continue
            try:
                per = c.job_stats(include_finished=True)
            except Exception as exc:  # noqa: BLE001 - any failure only loses this estimate
                self._mark_unreachable(node, exc)
                continue
            for s in per:
                step = s.get("last_checkpoint_step")
                if (str(s.get("slurm_job_id") or "") == str(slurm_job_id) and s.get("state") == "preempted"
                        and isinstance(step, int) and step >= 0 and (best is None or step > best)):
                    best = step
        return best

    def _foreign_report(self, node: str, sid: str) -> None:
        """Log (once per node and job) a report for a job Slurm does not run on that node."""
        if (node, sid) not in self._foreign:
            if len(self._foreign) >= 10000:  # bounded: jobs come and go
                self._foreign.clear()
            self._foreign.add((node, sid))
            log.warning("agent of %s reports job %s, which Slurm does not run there: ignored", node, sid,
                        extra={"event": "agent_foreign_job", "node": node, "job": sid})

    def checkpoint(self, job: SlurmJob, timeout_s: float) -> PreemptOutcome:
        sid = str(job.job_id)
        key = self._keys.get(sid) or default_job_key(sid, job.comment)
        last_err = "no agent for its nodes"
        reached = False
        not_found = 0  # agents that answered NOT_FOUND
        unverified: list[str] = []  # errors of replies not authenticated as the node's agent's
        nodes = sorted(job.nodes, key=lambda n: n != job.batch_host)  # the batch host first: rank 0 runs there
        for node in nodes:
            c = self._client(node)
            if c is None:
                continue
            why = self._not_ready(node)
            if why is not None:
                last_err = why
                continue
            try:
                r = c.preempt(key, sid, timeout_s)
            except Exception as exc:  # noqa: BLE001
                code = getattr(exc, "code", "")
                last_err = f"{node}: {exc}"
                if code == UNAUTHENTICATED_REPLY:
                    # whatever it says (ok=True, a checkpoint), it is not the agent: no checkpoint, no agent reached
                    unverified.append(last_err)
                    log.error("preemption of job %s: the reply on the agent port of %s is not from its agent, "
                              "not taken as a checkpoint: %s", sid, node, exc,
                              extra={"event": "agent_reply_unverified", "node": node, "job": job.job_id,
                                     "rpc": "Preempt"})
                elif code == "NOT_FOUND":  # the job does not run on that node's agent
                    reached = True
                    not_found += 1
                continue
            reached = True
            if r.get("done") is False:
                # accepted (the job may have been signalled), but no outcome came in time: not a checkpoint
                log.warning("preemption of job %s on %s: %s", sid, node, r.get("message"),
                            extra={"event": "agent_preempt_no_outcome", "node": node, "job": job.job_id,
                                   "operation": r.get("operation_id")})
            return PreemptOutcome(
                ok=bool(r.get("ok")) and r.get("done") is not False,
                reached_agent=True,
                checkpoint_step=r.get("checkpoint_step"),
                checkpoint_uri=str(r.get("checkpoint_uri") or ""),
                message=str(r.get("message") or ""),
            )
        if unverified:
            return PreemptOutcome(False, reached, message="; ".join(unverified), unverified_reply=True)
        return PreemptOutcome(False, reached, message=last_err, unknown_job=reached and not_found > 0)

    def close(self) -> None:
        for c in [*self._clients.values(), *self._probes.values()]:
            try:
                c.close()
            except Exception:  # noqa: BLE001
                pass
        self._clients.clear()
        self._probes.clear()


def default_job_key(slurm_job_id: str, comment: str | None) -> str:
    """The job key a job uses when it reported none yet (``nodeagent.convention``)."""
    try:
        from nodeagent.convention import job_key_for

        return job_key_for(slurm_job_id, comment)
    except Exception:  # noqa: BLE001 - agent package missing or a malformed comment
        return f"slurm-{slurm_job_id}"


def make_auth(auth_spec: str, slurm_conf: str | None = None) -> Any:
    """The node-agent authenticator of ``[agents] auth`` (``nodeagent.auth.make_authenticator``): the daemon
    signs its agent calls with it, and ``check-config`` builds it the same way. :class:`ConfigError` naming
    the key for an unknown spec or an unusable key file (missing, readable by others, too short).
    ``slurm_conf`` (``[slurm] conf``; munge only): where the SlurmUser is read, whose replies count as an
    agent's like root's (None: ``$SLURM_CONF`` or ``/etc/slurm/slurm.conf``)."""
    from nodeagent.auth import AuthError, make_authenticator

    kw = {"slurm_conf": slurm_conf} if slurm_conf and auth_spec.strip().startswith("munge") else {}
    try:
        return make_authenticator(auth_spec, **kw)
    except (ValueError, AuthError, OSError) as exc:
        raise ConfigError(f"agents.auth: {exc}") from None


#: deadline of the health probe before a Preempt (s; the agents' ``timeout_s`` when shorter)
PROBE_TIMEOUT_S = 3.0


def make_preempter(addresses: dict[str, str], auth_spec: str, timeout_s: float,
                   slurm_conf: str | None = None) -> Preempter:
    """An :class:`AgentPreempter` when the agent package and addresses exist, else :class:`NoAgents`.
    Its health probes use ``min(timeout_s, PROBE_TIMEOUT_S)``."""
    if not addresses:
        return NoAgents()
    try:
        from nodeagent.client import AgentClient
    except ImportError as exc:
        log.warning("node agent client not available (%s): running without agents", exc)
        return NoAgents()
    auth = make_auth(auth_spec, slurm_conf)
    probe_s = min(timeout_s, PROBE_TIMEOUT_S)
    return AgentPreempter(addresses, lambda addr, node: AgentClient(addr, auth, timeout=timeout_s, node=node),
                          probe_factory=lambda addr, node: AgentClient(addr, auth, timeout=probe_s, node=node))
