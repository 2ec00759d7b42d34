"""The controller's read-only status page, served beside ``/metrics``.

Paths (GET or HEAD only; anything else is 405, nothing changes state):

* ``/status``: one HTML page (inline CSS, no scripts, no external assets): the node x GPU map with
  each GPU's job, its model, measured contention sensitivity (CS) and time left (the left half of
  DeepShare's Figure 2, live), the running jobs, the queue with each job's reason, and the last rounds'
  actions with why;
* ``/status.json``: the same data as one JSON object (:meth:`StatusPage.snapshot`).

Authentication is that of ``rlsched controller status``: it reads ``state_dir/status.json``, which
only the controller's user and root can read (mode 0600). The page asks for the secret in
``state_dir/status-token`` (made by the controller when it serves the page, mode 0600, in the same
folder, so exactly those users can read it), as ``Authorization: Bearer TOKEN`` or as the password
of HTTP basic authentication (any user name). Other requests get 401. ``/metrics`` stays as
Prometheus serves it.

What the page shows is the controller's view after its last round: the Slurm read that round
began with, plus what the round did (jobs it placed are shown on the GPUs it planned for them,
jobs it requeued are back in the queue). Per-GPU slots are filled in job id order from each
job's GPU count per node (Slurm reports counts per node, not which GPU indices a job holds).
Running jobs' CS is the agents' measurement (``cs_source: "agent"``) when their agents answered,
else the performance model's prediction (``"model"``); time left is remaining samples over the
achieved samples/s of the last round. Every text that comes from Slurm or a job (names, users,
comments, reasons, log messages) is HTML-escaped.

Decisions and why: :class:`DecisionLog` keeps the controller's own action log records (logger
``controller.daemon``: placements, preemptions, hold-backs, rejections, failures) of the last
:data:`ROUNDS_KEPT` rounds that did something, each tagged with its round, and adds the reason
the log line does not carry (a placement's queue position and wait; whether a preemption was
the policy's choice, the CS threshold's or an operator's request). It sees the INFO records the
controller's logger passes (``controller.metrics.setup_logging`` and the twin set INFO).
"""

from __future__ import annotations

import base64
import collections
import hashlib
import hmac
import html
import json
import logging
import math
import os
import secrets
import socket
import stat
import threading
import time
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any, Callable, Iterable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

if TYPE_CHECKING:
    from controller.daemon import Controller

__all__ = ["StatusPage", "DecisionLog", "render_html", "load_token", "TOKEN_FILE", "ROUNDS_KEPT", "serve",
           "start_server"]

log = logging.getLogger("controller.status_page")

#: the secret's file in the state dir (mode 0600)
TOKEN_FILE = "status-token"
#: rounds with actions the page lists (newest first)
ROUNDS_KEPT = 10
#: actions kept per round (the rest are counted: ``more``)
ACTIONS_KEPT = 200
#: log events of ``controller.daemon`` that are actions (or failed ones) of a round
ACTION_EVENTS = frozenset({
    "placed", "preempted", "resize", "held_back", "rehold", "placement_rejected", "preempt_rejected",
    "resize_rejected", "preempt_failed", "preempt_skipped", "preempt_deferred", "preempt_request", "place_failed",
    "place_skipped",
    "release_timeout", "dry_run", "replan", "preempt_too_late", "preempt_dropped", "requeue_failed",
    "placement_mismatch", "policy_error", "slurm_error", "round_error",
})


# ---------------------------------------------------------------------------------------------- secret
def load_token(state_dir: str | Path) -> str:
    """The page's secret: ``state_dir/status-token``, made (mode 0600, 43 URL-safe characters) when
    missing. A token file group or others can read is replaced by a new one (the old secret counts
    as known). ``OSError`` when the state dir cannot hold it."""
    path = Path(state_dir) / TOKEN_FILE
    try:
        st = path.stat()
        if stat.S_ISREG(st.st_mode) and not st.st_mode & 0o077 and st.st_uid == os.geteuid():
            text = path.read_bytes().decode("ascii", "replace").strip()
            if len(text) >= 32 and text.isprintable():
                return text
        log.warning("%s: readable by others, not this user's, or not a secret this page wrote: replaced by a new "
                    "one", path,
                    extra={"event": "status_token_replaced"})
    except FileNotFoundError:
        pass
    token = secrets.token_urlsafe(32)
    tmp = path.with_name(f".{TOKEN_FILE}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, (token + "\n").encode())
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    return token


def _authorized(header: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header carries ``token`` (Bearer, or Basic with it as password)."""
    if not header:
        return False
    scheme, _, value = header.strip().partition(" ")
    value = value.strip()
    if scheme.lower() == "basic":
        try:
            value = base64.b64decode(value, validate=True).decode("utf-8").partition(":")[2]
        except (ValueError, UnicodeDecodeError):
            return False
    elif scheme.lower() != "bearer":
        return False
    # compare digests: equal length, constant time whatever was sent
    return hmac.compare_digest(hashlib.sha256(value.encode("utf-8", "surrogatepass")).digest(),
                               hashlib.sha256(token.encode()).digest())


# ---------------------------------------------------------------------------------------------- decisions
class DecisionLog(logging.Handler):
    """The last :data:`ROUNDS_KEPT` rounds' actions, from the controller's own log records.

    Attached to logger ``controller.daemon`` (where :class:`~controller.daemon.Controller` and
    :class:`~controller.backend.SlurmBackend` log each action with an ``event``); each record of
    :data:`ACTION_EVENTS` becomes ``{"round", "time", "action", "job", "message", "why"}``.
    ``round`` is the controller's round in progress (``rounds + 1``), ``time`` its clock (epoch s).
    """

    def __init__(self, ctl: Controller, keep: int = ROUNDS_KEPT) -> None:
        super().__init__(logging.INFO)
        self.ctl = ctl
        self.keep = keep
        self._rounds: collections.OrderedDict[int, list[dict[str, Any]]] = collections.OrderedDict()
        self._more: dict[int, int] = {}  # round -> actions beyond ACTIONS_KEPT (not kept)
        self._positions: tuple[Any, dict[str, int]] = (None, {})  # (view, job id -> queue index)
        self._mu = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        event = getattr(record, "event", None)
        if event not in ACTION_EVENTS:
            return
        try:
            ctl = self.ctl
            job = getattr(record, "job", None)
            entry = {"round": ctl.rounds + 1, "time": float(ctl.clock()), "action": str(event),
                     "job": None if job is None else str(job), "message": record.getMessage(),
                     "why": self._why(str(event), None if job is None else str(job))}
        except Exception:  # noqa: BLE001 - the page must never break a round
            self.handleError(record)
            return
        with self._mu:
            actions = self._rounds.setdefault(entry["round"], [])
            if len(actions) < ACTIONS_KEPT:
                actions.append(entry)
            else:
                self._more[entry["round"]] = self._more.get(entry["round"], 0) + 1
            while len(self._rounds) > self.keep:
                r, _ = self._rounds.popitem(last=False)
                self._more.pop(r, None)

    def _why(self, event: str, job: str | None) -> str | None:
        """What the log line does not say: why the policy's round did this to ``job``."""
        ctl = self.ctl
        backend = getattr(ctl, "backend", None)
        view = getattr(backend, "view", None)
        policy = ctl.policy.name if ctl.policy is not None else ctl.policy_name
        if view is None or job is None:
            return None
        if event == "placed":
            if self._positions[0] is not view:  # one index per view: a round may place many jobs
                self._positions = (view, {j.job_id: k for k, j in enumerate(view.state.pending)})
            queue = self._positions[1]
            if job not in queue:
                return f"placed by policy {policy}"
            info = view.state.pending[queue[job]]
            waited = max(view.state.time - info.submit_time, 0.0)
            return (f"policy {policy} placed it: queue position {queue[job] + 1} of {len(queue)}, "
                    f"waited {_duration(waited)}, {info.gpu_demand} GPU(s) of {info.model}")
        if event in ("preempted", "preempt_failed", "preempt_deferred", "preempt_skipped"):
            if job in (backend.forced or ()):
                return "an operator asked for it (rlsched controller preempt)"
            if job in (backend.victims or ()):
                cs = (ctl._stats.get(job) or {}).get("cs")
                thr = ctl.cfg.controller.cs_preempt_threshold
                return (f"measured CS {cs:.2f} above cs_preempt_threshold {thr:g}" if isinstance(cs, (int, float))
                        else f"CS above cs_preempt_threshold {thr:g}")
            return f"policy {policy} chose it as a victim"
        return None

    def rounds(self) -> list[dict[str, Any]]:
        """``[{"round", "time", "actions": [...], "more": actions not kept}]``, newest first."""
        with self._mu:
            items = [(r, list(a), self._more.get(r, 0)) for r, a in self._rounds.items()]
        return [{"round": r, "time": a[0]["time"], "actions": a, "more": more} for r, a, more in reversed(items)]


# ---------------------------------------------------------------------------------------------- snapshot
def _copy(d: Any) -> Any:
    """A shallow copy of a dict/list another thread may change (retried while it does)."""
    for _ in range(100):
        try:
            return dict(d) if isinstance(d, dict) else list(d)
        except RuntimeError:  # changed size during iteration
            continue
    return {} if isinstance(d, dict) else []


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _duration(s: float | None) -> str:
    """``42 s``, ``3 min``, ``2.5 h``, ``3.1 d``; ``—`` for none."""
    if s is None or not math.isfinite(s):
        return "—"
    s = max(s, 0.0)
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    if s < 172800:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"


class StatusPage:
    """The status page of one controller: :meth:`snapshot` (the data), :meth:`wsgi` (the HTTP app).

    :param ctl: the controller whose last round is shown.
    :param token: the secret (default: :func:`load_token` of the controller's state dir).
    """

    def __init__(self, ctl: Controller, token: str | None = None) -> None:
        self.ctl = ctl
        self.token = token if token is not None else load_token(ctl.state_dir)
        self.decisions = DecisionLog(ctl)
        logging.getLogger("controller.daemon").addHandler(self.decisions)

    def close(self) -> None:
        """Stop recording the controller's actions."""
        logging.getLogger("controller.daemon").removeHandler(self.decisions)

    # -------------------------------------------------------------------------------------- data
    def snapshot(self) -> dict[str, Any]:
        """The page's data as of the controller's last round (see the module docstring).

        ``{"time", "controller": {policy, rounds, interval_s, last_round, agents}, "nodes": [{name, gpus,
        gpu_type, state, usable, slots: [{gpu, job, kind}]}], "running": [{job, name, user, model,
        gpus, placement, cs, cs_source, samples_per_s, progress, time_left_s, time_limit_left_s,
        kind}], "queue": [{job, name, user, model, gpus, waited_s, reason, kind}], "rounds": [...]}``.
        Slot ``kind``: ``running``, ``placed`` (released this round, as planned), ``starting``
        (released earlier, not started yet), ``free`` or ``down``; times are epoch s / seconds.
        """
        ctl = self.ctl
        rep = ctl.last
        backend = getattr(ctl, "backend", None)
        view = getattr(backend, "view", None)
        inputs = getattr(backend, "_inputs", None)
        policy = ctl.policy.name if ctl.policy is not None else ctl.policy_name
        doc: dict[str, Any] = {
            "time": float(ctl.clock()),
            "controller": {
                "policy": policy, "rounds": ctl.rounds, "interval_s": ctl.cfg.controller.interval_s,
                "last_round": None if rep is None else {
                    "time": rep.time, "ok": rep.ok, "error": rep.error, "error_kind": rep.error_kind,
                    "queue": rep.queue, "running": rep.running, "waiting": rep.waiting,
                    "placed": [[j, dict(p)] for j, p in rep.placed], "preempted": list(rep.preempted),
                    "held_back": list(rep.held_back), "decision_s": rep.decision_s},
            },
            "nodes": [], "running": [], "queue": [], "rounds": self.decisions.rounds(),
        }
        pre = getattr(ctl, "_preempter", None)  # the node agents as the last round saw them
        addresses = getattr(pre, "addresses", None) or {}
        bad = set(getattr(pre, "unreachable", ()) or ()) | set(getattr(pre, "unverified", ()) or ())
        doc["controller"]["agents"] = {"configured": len(addresses), "unreachable": sorted(map(str, bad))}
        if view is None or inputs is None:
            return doc
        st = view.state
        doc["round_time"] = st.time
        slurm_nodes = {n.name: n for n in inputs[2]}
        stats = _copy(ctl._stats)
        released = _copy(ctl.journal["released"])
        placed = {str(j): dict(p) for j, p in (rep.placed if rep is not None else [])}
        preempted = {str(j) for j in (rep.preempted if rep is not None else [])}
        # GPUs per node of each job on the map: running (as Slurm allocated), placed this round and
        # released earlier but not started (as planned)
        on: dict[str, list[tuple[str, int, str]]] = {n.name: [] for n in st.cluster.nodes}
        running = []
        for info in st.running:
            sj = view.jobs[info.job_id]
            if info.job_id in preempted:
                continue
            per_node = {st.cluster.nodes[n].name: g for n, g in info.placement.alloc}
            for name, g in per_node.items():
                on[name].append((info.job_id, g, "running"))
            s = stats.get(info.job_id) or {}
            cs = _num(s.get("cs"))
            thp = info.achieved_thp
            left = info.remaining_samples / thp if thp > 0 else None
            limit_left = (sj.time_limit_s - max(st.time - info.start_time, 0.0)
                          if sj.time_limit_s is not None and info.start_time is not None else None)
            running.append({
                "job": info.job_id, "name": sj.name, "user": sj.user, "model": info.model, "gpus": info.gpu_demand,
                "placement": per_node, "cs": cs if cs is not None else info.cs,
                "cs_source": "agent" if cs is not None else "model", "samples_per_s": thp,
                "progress": (info.done_samples / info.total_samples) if info.total_samples > 0 else None,
                "time_left_s": left, "time_limit_left_s": limit_left, "kind": "running",
            })
        pending = {j.job_id: j for j in st.pending}
        for jid, plan in placed.items():
            info = pending.get(jid)
            sj = view.jobs.get(jid)
            if info is None or sj is None:
                # not held in this view: a view newer than the report (read while a round runs) shows
                # the job as it is since (running, or released and starting)
                continue
            for name, g in plan.items():
                if name in on:
                    on[name].append((jid, int(g), "placed"))
            running.append({
                "job": jid, "name": sj.name, "user": sj.user, "model": info.model, "gpus": info.gpu_demand,
                "placement": plan, "cs": None, "cs_source": None, "samples_per_s": None,
                "progress": (info.done_samples / info.total_samples) if info.total_samples > 0 else None,
                "time_left_s": info.remaining_time, "time_limit_left_s": sj.time_limit_s, "kind": "placed",
            })
        for sj in view.in_flight:
            plan = (released.get(str(sj.job_id)) or {}).get("plan_by_name") or {}
            for name, g in plan.items():
                if name in on:
                    on[name].append((str(sj.job_id), int(g), "starting"))
        for i, spec in enumerate(st.cluster.nodes):
            usable = True if st.usable is None else bool(st.usable[i])
            sn = slurm_nodes.get(spec.name)
            slots: list[dict[str, Any]] = []
            for jid, g, kind in sorted(on[spec.name], key=lambda t: (_id_key(t[0]), t[2])):
                slots += [{"gpu": len(slots) + k, "job": jid, "kind": kind} for k in range(g)]
            while len(slots) < spec.gpus:
                slots.append({"gpu": len(slots), "job": None, "kind": "free" if usable else "down"})
            doc["nodes"].append({"name": spec.name, "gpus": spec.gpus, "gpu_type": spec.gpu_type,
                                 "state": sn.state if sn is not None else "missing", "usable": usable,
                                 "slots": slots})
        doc["running"] = running
        queue = []
        waiting_placement = [j for j in st.pending if j.job_id not in placed]
        for k, info in enumerate(waiting_placement):
            sj = view.jobs[info.job_id]
            requeued = " (requeued this round)" if info.job_id in preempted else ""
            queue.append({"job": info.job_id, "name": sj.name, "user": sj.user, "model": info.model,
                          "gpus": info.gpu_demand, "waited_s": max(st.time - info.submit_time, 0.0),
                          "reason": f"waiting for placement by {policy}: position {k + 1} of "
                                    f"{len(waiting_placement)}{requeued}", "kind": "queued"})
        for j in st.running:
            if j.job_id in preempted:
                sj = view.jobs[j.job_id]
                queue.append({"job": j.job_id, "name": sj.name, "user": sj.user, "model": j.model,
                              "gpus": j.gpu_demand, "waited_s": 0.0,
                              "reason": "preempted this round: requeued held, placed again from the next round",
                              "kind": "requeued"})
        for sj in view.in_flight:
            queue.append({"job": str(sj.job_id), "name": sj.name, "user": sj.user, "model": None, "gpus": sj.gpus,
                          "waited_s": max(st.time - (sj.submit_time or st.time), 0.0),
                          "reason": f"released by rlsched, waiting for Slurm to start it (Slurm: {sj.reason})",
                          "kind": "starting"})
        all_jobs = {str(j.job_id): j for j in inputs[3]}
        for sid, why in _copy(view.waiting).items():
            sj = all_jobs.get(sid)
            queue.append({"job": sid, "name": sj.name if sj else "", "user": sj.user if sj else "", "model": None,
                          "gpus": sj.gpus if sj else None,
                          "waited_s": max(st.time - (sj.submit_time or st.time), 0.0) if sj else None,
                          "reason": why, "kind": "waiting"})
        # managed, held jobs in the partition that are in none of the lists above: left out of the
        # policy's queue (e.g. more GPUs than the partition has); the controller's warning says why
        listed = {q["job"] for q in queue} | {r["job"] for r in running}
        part = ctl.cfg.slurm.partition
        for sid, sj in all_jobs.items():
            if sid in listed or not (sj.managed and sj.pending and sj.in_partition(part)):
                continue
            why = next((w.partition(": ")[2] for w in view.warnings if w.startswith(f"job {sid}: ")), None)
            queue.append({"job": sid, "name": sj.name, "user": sj.user, "model": None, "gpus": sj.gpus,
                          "waited_s": max(st.time - (sj.submit_time or st.time), 0.0),
                          "reason": why or f"not placeable (Slurm: {sj.reason})", "kind": "left out"})
        doc["queue"] = queue
        return doc

    # -------------------------------------------------------------------------------------- HTTP
    def wsgi(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        """The WSGI app of ``/status`` and ``/status.json`` (see the module docstring)."""
        path = environ.get("PATH_INFO", "")
        method = environ.get("REQUEST_METHOD", "GET")
        if method not in ("GET", "HEAD"):
            return _respond(start_response, "405 Method Not Allowed", "text/plain", b"read-only: GET or HEAD\n",
                            [("Allow", "GET, HEAD")], method)
        if not _authorized(environ.get("HTTP_AUTHORIZATION"), self.token):
            return _respond(start_response, "401 Unauthorized", "text/plain",
                            b"the secret in the controller's state_dir/status-token is needed "
                            b"(Authorization: Bearer TOKEN, or basic auth with it as password)\n",
                            [("WWW-Authenticate", 'Basic realm="rlsched controller", charset="UTF-8"')], method)
        try:
            doc = self.snapshot()
            if path == "/status.json":
                body, ctype = json.dumps(doc, indent=1, default=str).encode(), "application/json"
            else:
                body, ctype = render_html(doc).encode(), "text/html; charset=utf-8"
        except Exception:  # noqa: BLE001 - a page that cannot be built says so; the controller goes on
            log.exception("status page could not be built", extra={"event": "status_page_error"})
            return _respond(start_response, "500 Internal Server Error", "text/plain",
                            b"status page could not be built: see the controller's log\n", [], method)
        return _respond(start_response, "200 OK", ctype, body, [], method)


def _respond(start_response: Callable, status: str, ctype: str, body: bytes, headers: list, method: str
             ) -> list[bytes]:
    start_response(status, [("Content-Type", ctype), ("Content-Length", str(len(body))),
                            ("Cache-Control", "no-store"), ("X-Content-Type-Options", "nosniff"),
                            ("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'"),
                            *headers])
    return [] if method == "HEAD" else [body]


def _id_key(jid: str) -> tuple:
    return (0, int(jid), "") if jid.isdigit() else (1, 0, jid)


# ---------------------------------------------------------------------------------------------- HTML
_CSS = """
body{font:14px/1.35 system-ui,sans-serif;margin:1em 2em;color:#222}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.4em}
table{border-collapse:collapse}td,th{border:1px solid #bbb;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#eee}.map td.gpu{width:7.5em;height:4.2em;font-size:12px}
.free{background:#fff;color:#999}.down{background:#ccc;color:#555}
.placed,.starting{border:2px dashed #333}.err{color:#b00}.muted{color:#777}
"""


def _e(v: Any) -> str:
    """HTML-escaped text (quotes too)."""
    return html.escape("" if v is None else str(v), quote=True)


def _hue(jid: str) -> int:
    return int(hashlib.sha256(jid.encode()).hexdigest()[:4], 16) % 360


def _f(v: Any, fmt: str) -> str:
    return "—" if _num(v) is None else format(v, fmt)


def render_html(doc: dict[str, Any]) -> str:
    """The page of one :meth:`StatusPage.snapshot`: every value from Slurm or a job escaped."""
    c = doc["controller"]
    lr = c.get("last_round") or {}
    out = ["<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
           "<title>rlsched controller</title>", f"<style>{_CSS}</style></head><body>",
           "<h1>rlsched controller</h1>",
           f"<p id=summary>policy <b>{_e(c['policy'])}</b>, {_e(c['rounds'])} rounds (every "
           f"{_e(_f(c['interval_s'], 'g'))} s); as of {_e(_clock(doc.get('round_time')))} "
           f"(page {_e(_clock(doc['time']))}); queue {_e(lr.get('queue', '—'))}, "
           f"running {_e(lr.get('running', '—'))}"
           f", waiting {_e(lr.get('waiting', '—'))}"]
    ag = c.get("agents") or {}
    if ag.get("configured"):
        out.append(f"; agents: {_e(ag['configured'])} configured")
        if ag.get("unreachable"):
            out.append(f", <span class=err>not answering: {_e(', '.join(ag['unreachable']))}</span>")
    if lr.get("error"):
        out.append(f"; <span class=err>last round failed ({_e(lr.get('error_kind'))}): {_e(lr['error'])}</span>")
    out.append("</p>")
    jobs = {r["job"]: r for r in doc["running"]}
    out.append("<h2>Nodes x GPUs</h2>")
    if not doc["nodes"]:
        out.append("<p class=muted>no round has read Slurm yet</p>")
    else:
        width = max(n["gpus"] for n in doc["nodes"])
        out.append("<table class=map id=map><tr><th>node</th>"
                   + "".join(f"<th>GPU {g}</th>" for g in range(width)) + "</tr>")
        for n in doc["nodes"]:
            label = f"{_e(n['name'])}<br><span class=muted>{_e(n['state'])}" + (
                f" {_e(n['gpu_type'])}" if n.get("gpu_type") else "") + "</span>"
            out.append(f"<tr data-node=\"{_e(n['name'])}\"><th>{label}</th>")
            for s in n["slots"]:
                jid = s["job"]
                if jid is None:
                    out.append(f"<td class=\"gpu {s['kind']}\" data-gpu={s['gpu']}>{_e(s['kind'])}</td>")
                    continue
                r = jobs.get(jid, {})
                if s["kind"] == "running":
                    mark = "" if r.get("cs_source") == "agent" else "*"
                    text = (f"<b>{_e(jid)}</b> {_e(r.get('model'))}<br>CS {_e(_f(r.get('cs'), '.2f'))}{mark}"
                            f"<br>{_e(_duration(r.get('time_left_s')))} left")
                else:
                    text = f"<b>{_e(jid)}</b> {_e(r.get('model'))}<br>{_e(s['kind'])}"
                out.append(f"<td class=\"gpu {s['kind']}\" data-gpu={s['gpu']} data-job=\"{_e(jid)}\" "
                           f"style=\"background:hsl({_hue(jid)},55%,82%)\">{text}</td>")
            out.append("</tr>")
        out.append("</table><p class=muted>CS: contention sensitivity (isolated / achieved throughput), "
                   "measured by the node agents; * : predicted by the performance model (no agent stats). "
                   "Dashed: released by the controller (this round, or earlier and not started yet), not yet "
                   "seen running in Slurm; node states are Slurm's at the round's read. GPU columns are slots "
                   "filled in job id order (Slurm reports GPUs per node, not their indices).</p>")
    out.append("<h2>Running jobs</h2>")
    rows = [[r["job"], r["user"], r["name"], r["model"], r["gpus"],
             ", ".join(f"{k}:{v}" for k, v in r["placement"].items()),
             _f(r["cs"], ".2f") + ("" if r["cs_source"] in ("agent", None) else "*"),
             _f(r["samples_per_s"], ".1f"), "—" if r["progress"] is None else f"{100 * r['progress']:.0f}%",
             _duration(r["time_left_s"]), _duration(r["time_limit_left_s"]), r["kind"]] for r in doc["running"]]
    out.append(_table("running", ["job", "user", "name", "model", "GPUs", "GPUs per node", "CS", "samples/s",
                                  "progress", "time left", "time limit left", "state"], rows))
    out.append("<h2>Queue</h2>")
    rows = [[q["job"], q["user"], q["name"], q["model"] or "—", q["gpus"], _duration(q["waited_s"]), q["reason"]]
            for q in doc["queue"]]
    out.append(_table("queue", ["job", "user", "name", "model", "GPUs", "waited", "reason"], rows))
    out.append("<h2>Last rounds' actions</h2>")
    rows = [[a["round"], _clock(a["time"]), a["action"], a["job"] or "—", a["why"] or "", a["message"]]
            for r in doc["rounds"] for a in r["actions"]]
    rows += [[r["round"], _clock(r["time"]), f"{r['more']} more actions", "", "", "see the controller's log"]
             for r in doc["rounds"] if r.get("more")]
    out.append(_table("rounds", ["round", "time", "action", "job", "why", "log"], rows))
    out.append("</body></html>")
    return "".join(out)


def _table(tid: str, head: list[str], rows: list[list[Any]]) -> str:
    if not rows:
        return f"<p class=muted id={tid}>none</p>"
    return (f"<table id={tid}><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{_e(v)}</td>" for v in row) + "</tr>" for row in rows) + "</table>")


def _clock(t: Any) -> str:
    """Epoch seconds as UTC ``YYYY-MM-DD HH:MM:SS``; ``—`` for none."""
    if _num(t) is None:
        return "—"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))
    except (OverflowError, OSError, ValueError):
        return "—"


# ---------------------------------------------------------------------------------------------- server
class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


def serve(port: int, address: str, app: Callable) -> _Server:
    """Serve the WSGI ``app`` on ``address:port`` (IPv4 or IPv6, as the address resolves) from a
    daemon thread; returns the server (``shutdown()`` stops it)."""
    family = socket.getaddrinfo(address or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]

    class Server(_Server):
        address_family = family

    httpd = make_server(address, port, app, Server, handler_class=_QuietHandler)
    threading.Thread(target=httpd.serve_forever, name="rlsched-http", daemon=True).start()
    return httpd


def start_server(registry: Any, port: int, address: str, controller: Controller | None = None
                 ) -> tuple[_Server, StatusPage | None]:
    """The controller's HTTP server (:func:`serve`): Prometheus' ``/metrics`` of ``registry`` (it
    answers every path but the page's) and, with ``controller``, its :class:`StatusPage` at
    ``/status`` and ``/status.json``. Returns the server and the page. ``OSError`` when the address
    cannot be bound or the page's secret cannot be written (the message names the file)."""
    from prometheus_client import make_wsgi_app

    metrics_app = make_wsgi_app(registry)
    page = None
    if controller is not None:
        try:
            page = StatusPage(controller)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot write the status page's secret "
                                     f"{Path(controller.state_dir) / TOKEN_FILE}: {exc.strerror or exc}") from None

    def app(environ: dict, start_response: Callable) -> Iterable[bytes]:
        if page is not None and environ.get("PATH_INFO") in ("/status", "/status.json"):
            return page.wsgi(environ, start_response)
        return metrics_app(environ, start_response)

    try:
        return serve(port, address, app), page
    except BaseException:
        if page is not None:
            page.close()
        raise
