"""The controller's status page (controller/status_page.py): data, escaping, authentication, the
metrics server hook, and the page in headless Chromium against the digital twin (the real
Controller over a simulated Slurm), its node x GPU map checked against the twin's Slurm state."""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import shutil
import socket
import stat
import subprocess
import urllib.error
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

import pytest

from controller.metrics import Metrics
from controller.status_page import TOKEN_FILE, StatusPage, load_token, render_html
from policies.cluster import ClusterSpec
from policies.job import JobSpec
from trainer.sim_backend import SimBackend
from trainer.simulator import SimConfig
from trainer.twin import Twin

REPO = Path(__file__).resolve().parents[1]
EVIL = "<script>alert('x')</script>&\"'<img src=x onerror=alert(1)>"


@pytest.fixture(autouse=True)
def _info_logs():
    """The page's action log reads the controller's INFO records (``setup_logging`` and the twin's
    ``run`` set that level): set it here, where rounds are stepped by hand."""
    logger = logging.getLogger("controller")
    saved = logger.level, logger.propagate
    logger.setLevel(logging.INFO)
    logger.propagate = False
    yield
    logger.setLevel(saved[0])
    logger.propagate = saved[1]


def _jobs(names=None) -> list[JobSpec]:
    """2x4 cluster: two long jobs fill it, a short one arrives at 400 s (srtf preempts for it), an
    8-GPU job waits; ``names``: trace job ids (they become Slurm job names)."""
    rows = [("MoE", 4, 0.0, 4e6), ("FSDP", 4, 0.0, 4e6), ("DLRM", 2, 400.0, 2e5), ("GraphSage", 8, 500.0, 1e5)]
    names = names or [f"j{i}" for i in range(len(rows))]
    return [JobSpec(job_id=n, model=m, gpu_demand=g, submit_time=t, total_samples=s)
            for n, (m, g, t, s) in zip(names, rows)]


class Stepper:
    """The twin's rounds one at a time (what ``Twin.run`` loops over)."""

    def __init__(self, tmp_path: Path, policy: str = "srtf", names=None) -> None:
        self.twin = Twin(ClusterSpec.homogeneous(2, 4), _jobs(names), policy, tmp_path / "state",
                         SimConfig(round_len=60))
        self.backend = SimBackend(self.twin.sim, None, every_round=True, keep_rounds=self.twin.slurm.waiting)

    def until(self, t: float) -> None:
        """Run rounds until the first one at simulated time >= ``t``."""
        while self.backend.next_round():
            self.twin._round()
            if self.twin.sim.time >= t:
                return
        raise AssertionError("the trace ended first")


def _slurm_map(twin: Twin) -> dict[str, dict[str, int]]:
    """Node -> job id -> GPUs, as the (simulated) Slurm reports its running jobs now."""
    out: dict[str, dict[str, int]] = {n.name: {} for n in twin.slurm.nodes()}
    for j in twin.slurm.jobs():
        if j.state == "RUNNING":
            for node, g in j.gpus_per_node.items():
                out[node][str(j.job_id)] = g
    return out


def _page_map(doc: dict) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for n in doc["nodes"]:
        m = out.setdefault(n["name"], {})
        for s in n["slots"]:
            if s["job"] is not None:
                m[s["job"]] = m.get(s["job"], 0) + 1
    return out


# ------------------------------------------------------------------------------------------ data
def test_snapshot_is_the_twins_slurm_state_with_reasons_and_decisions(tmp_path):
    st = Stepper(tmp_path)
    page = StatusPage(st.twin.controller)
    try:
        st.until(0.0)
        doc = page.snapshot()
        assert _page_map(doc) == _slurm_map(st.twin)
        assert doc["controller"]["agents"] == {"configured": 2, "unreachable": []}
        assert {r["job"] for r in doc["running"]} == {"10", "11"}
        placed = [a for r in doc["rounds"] for a in r["actions"] if a["action"] == "placed"]
        assert {a["job"] for a in placed} == {"10", "11"}
        assert all(a["round"] == 1 and "policy srtf placed it: queue position" in a["why"] for a in placed)
        for r in doc["running"]:
            assert r["cs_source"] in ("agent", None) and r["model"] in ("MoE", "FSDP")
        st.until(520.0)  # the 8-GPU job waits; srtf preempted a long job for the short one at 400 s
        doc = page.snapshot()
        assert _page_map(doc) == _slurm_map(st.twin)
        free = {n["name"]: sum(s["job"] is None for s in n["slots"]) for n in doc["nodes"]}
        assert free == {n.name: n.gpus - n.gpus_used for n in st.twin.slurm.nodes()}
        held = {str(j.job_id) for j in st.twin.slurm.jobs() if j.pending}
        assert {q["job"] for q in doc["queue"]} == held
        by_job = {q["job"]: q for q in doc["queue"]}
        assert "waiting for placement by srtf: position" in by_job["13"]["reason"]
        actions = [a for r in doc["rounds"] for a in r["actions"]]
        pre = [a for a in actions if a["action"] == "preempted"]
        assert pre and all(a["why"] == "policy srtf chose it as a victim" for a in pre)
        running = {r["job"]: r for r in doc["running"]}
        for r in running.values():
            if r["kind"] == "running":
                assert r["cs"] >= 1.0 and r["time_left_s"] > 0 and 0 <= r["progress"] <= 1
        html = render_html(doc)
        for jid in running:
            assert f'data-job="{jid}"' in html
    finally:
        page.close()


def test_no_round_yet_gives_an_empty_map(tmp_path):
    st = Stepper(tmp_path)
    page = StatusPage(st.twin.controller, token="t" * 40)
    try:
        doc = page.snapshot()
        assert doc["nodes"] == [] and doc["controller"]["last_round"] is None
        assert "no round has read Slurm yet" in render_html(doc)
    finally:
        page.close()


# ------------------------------------------------------------------------------------------ escaping
class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: set[str] = set()
        self.attrs: set[str] = set()
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        self.attrs.update(a for a, _ in attrs)

    def handle_data(self, data):
        self.text.append(data)


def test_every_text_from_slurm_and_jobs_is_escaped(tmp_path):
    st = Stepper(tmp_path, names=[EVIL + "0", "j1", EVIL + "2", "j3"])
    page = StatusPage(st.twin.controller)
    try:
        st.until(520.0)
        doc = page.snapshot()
    finally:
        page.close()
    # and every other text field of the page, by hand
    doc["controller"]["policy"] = EVIL
    doc["controller"]["last_round"]["error"] = EVIL
    doc["controller"]["last_round"]["error_kind"] = EVIL
    doc["controller"]["agents"] = {"configured": 2, "unreachable": [EVIL]}
    doc["nodes"][0]["name"] = EVIL
    doc["nodes"][0]["state"] = EVIL
    doc["nodes"][0]["gpu_type"] = EVIL
    for q in doc["queue"]:
        q.update(user=EVIL, reason=EVIL, model=EVIL)
    for r in doc["running"]:
        r.update(user=EVIL, model=EVIL)
    for r in doc["rounds"]:
        for a in r["actions"]:
            a.update(message=EVIL, why=EVIL, action=EVIL)
    page_html = render_html(doc)
    p = _Tags()
    p.feed(page_html)
    assert p.tags <= {"html", "head", "meta", "title", "style", "body", "h1", "h2", "p", "b", "br", "span", "table",
                      "tr", "th", "td"}
    assert not any(a.startswith("on") or a == "src" for a in p.attrs)
    text = "".join(p.text)
    assert text.count(EVIL) >= 10  # shown as text, intact
    assert "<script" not in page_html and "<img" not in page_html


# ------------------------------------------------------------------------------------------ auth, HTTP
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, headers=None, method="GET") -> tuple[int, bytes, dict]:
    req = urllib.request.Request(url, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


@pytest.fixture
def served(tmp_path):
    """A stepped twin whose controller's metrics server (with the page) runs on a free port."""
    st = Stepper(tmp_path)
    st.until(520.0)
    m: Metrics = st.twin.controller.metrics
    port = _free_port()
    m.serve(port, "127.0.0.1", controller=st.twin.controller)
    yield st, f"http://127.0.0.1:{port}", m.status_page.token
    m.server.shutdown()
    m.server.server_close()
    m.status_page.close()


def test_page_needs_the_state_dirs_secret_and_changes_nothing(served):
    st, base, token = served
    state_dir = st.twin.controller.state_dir
    f = state_dir / TOKEN_FILE
    assert f.read_text().strip() == token and stat.S_IMODE(f.stat().st_mode) == 0o600
    for path in ("/status", "/status.json"):
        code, body, headers = _get(base + path)
        assert code == 401 and headers["WWW-Authenticate"].startswith("Basic ") and b"status-token" in body
        assert _get(base + path, {"Authorization": "Bearer " + token[:-1] + "x"})[0] == 401
        assert _get(base + path, {"Authorization": "Basic !!!"})[0] == 401
        assert _get(base + path, {"Authorization": "Token " + token})[0] == 401
        assert _get(base + path, {"Authorization": "Bearer " + token})[0] == 200
        basic = base64.b64encode(f"anyone:{token}".encode()).decode()
        assert _get(base + path, {"Authorization": "Basic " + basic})[0] == 200
        code, body, _ = _get(base + path, {"Authorization": "Bearer " + token}, method="POST")
        assert code == 405
        code, body, _ = _get(base + path, {"Authorization": "Bearer " + token}, method="HEAD")
        assert code == 200 and body == b""
    code, body, headers = _get(base + "/status", {"Authorization": "Bearer " + token})
    assert headers["Content-Type"].startswith("text/html")
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    assert b"<script" not in body
    # the JSON endpoint is the page's data
    code, body, _ = _get(base + "/status.json", {"Authorization": "Bearer " + token})
    doc = json.loads(body)
    assert _page_map(doc) == _slurm_map(st.twin)
    assert doc["controller"]["policy"] == "srtf" and doc["queue"]
    # Prometheus' /metrics is unchanged beside it
    code, body, _ = _get(base + "/metrics")
    assert code == 200 and b"rlsched_rounds_total" in body


def test_token_file_is_kept_and_replaced_when_others_can_read_it(tmp_path):
    a = load_token(tmp_path)
    assert len(a) >= 40 and load_token(tmp_path) == a
    f = tmp_path / TOKEN_FILE
    os.chmod(f, 0o644)
    b = load_token(tmp_path)
    assert b != a and stat.S_IMODE(f.stat().st_mode) == 0o600 and f.read_text().strip() == b
    assert not [p for p in tmp_path.iterdir() if p.name != TOKEN_FILE]  # no temp file left


def test_metrics_without_a_controller_serve_no_page(tmp_path):
    m = Metrics()
    port = _free_port()
    m.serve(port, "127.0.0.1")
    try:
        assert m.status_page is None
        assert _get(f"http://127.0.0.1:{port}/metrics")[0] == 200
        body = _get(f"http://127.0.0.1:{port}/status")[1]  # Prometheus' app answers every path
        assert b"<html" not in body and b"rlsched_rounds_total" in body
    finally:
        m.server.shutdown()
        m.server.server_close()


# ------------------------------------------------------------------------------------------ Grafana
def test_grafana_dashboard_uses_only_exported_metrics():
    dash = json.loads((REPO / "slurm_conf" / "grafana-rlsched.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 10
    used = {n for e in exprs for n in re.findall(r"\brlsched_[a-z_]+", e)}
    m = Metrics()
    m.set_policy("fifo")
    m.rounds.labels(outcome="ok").inc()  # a labelled counter has samples once a label is used
    m.decisions.labels(action="place").inc()
    m.preemptions.labels(outcome="ok").inc()
    m.latency.observe(0.01)
    m.round_time.observe(0.1)
    exported = {s.name for fam in m.registry.collect() for s in fam.samples}
    assert used and used <= exported, sorted(used - exported)
    # every metric the controller exports is on the dashboard (its base name, counters' _total)
    bases = {fam.name + ("_total" if fam.type == "counter" else "") for fam in m.registry.collect()}
    shown = {b for b in bases if any(u == b or u.startswith(b + "_") for u in used)}
    assert shown == bases, sorted(bases - shown)


# ------------------------------------------------------------------------------------------ Chromium
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class _MapDom(HTMLParser):
    """Node -> job id -> GPU cells, and the queue's job ids, from Chromium's dumped DOM."""

    def __init__(self) -> None:
        super().__init__()
        self.map: dict[str, dict[str, int]] = {}
        self.free: dict[str, int] = {}
        self.node: str | None = None
        self.queue: list[str] = []
        self._table: str | None = None
        self._col = -1
        self._cell = ""

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table":
            self._table = a.get("id")
        elif tag == "tr" and self._table == "map":
            self.node = a.get("data-node")
            if self.node is not None:
                self.map[self.node] = {}
                self.free[self.node] = 0
        elif tag == "tr":
            self._col = -1
        elif tag == "td" and self._table == "map" and self.node is not None:
            if "data-job" in a:
                self.map[self.node][a["data-job"]] = self.map[self.node].get(a["data-job"], 0) + 1
            elif "free" in (a.get("class") or "").split():
                self.free[self.node] += 1
        elif tag == "td":
            self._col += 1
            self._cell = ""

    def handle_data(self, data):
        if self._table == "queue" and self._col == 0:
            self._cell += data

    def handle_endtag(self, tag):
        if tag == "td" and self._table == "queue" and self._col == 0:
            self.queue.append(self._cell.strip())
        elif tag == "table":
            self._table = None


def _dump_dom(url: str, profile: Path) -> str:
    cmd = [CHROMIUM, "--headless", "--disable-gpu", "--no-first-run", f"--user-data-dir={profile}",
           "--dump-dom", url]
    if os.geteuid() == 0:
        cmd.insert(1, "--no-sandbox")  # Chromium refuses to run as root with its sandbox
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (scripts/setup.sh installs it)")
def test_page_in_headless_chromium_shows_the_twins_slurm_state(served, tmp_path):
    st, base, token = served
    url = base.replace("http://", f"http://rlsched:{token}@") + "/status"
    for t in (None, 1500.0):
        if t is not None:
            st.until(t)
        dom = _dump_dom(url, tmp_path / "chromium")
        assert "<h1>rlsched controller</h1>" in dom
        p = _MapDom()
        p.feed(dom)
        assert p.map == _slurm_map(st.twin)
        assert p.free == {n.name: n.gpus - n.gpus_used for n in st.twin.slurm.nodes()}
        assert sorted(p.queue) == sorted(str(j.job_id) for j in st.twin.slurm.jobs() if j.pending)
    # without the secret Chromium is refused (401: headless, it shows nothing), not given the page
    dom = _dump_dom(base + "/status", tmp_path / "chromium")
    assert "rlsched controller</h1>" not in dom and "data-job" not in dom


# ------------------------------------------------------------------------------------------ reasons (in-memory Slurm)
def test_preemption_reasons_and_queue_reasons_on_an_in_memory_slurm(tmp_path):
    """With tests/test_controller.py's in-memory Slurm: a job over the CS threshold and one an operator
    asked to preempt say why; a job larger than the partition, one an admin held and one waiting for a
    dependency are in the queue with their reasons."""
    from test_controller import FakeAgents, FakeSlurm, _ctl, _running

    s = FakeSlurm()  # 4 x 8 GPUs
    slow, asked, fine = _running(s, 8, "node1"), _running(s, 8, "node2"), _running(s, 8, "node3")
    big = s.submit(64, "rlsched:model=MoE")
    admin = s.submit(2, "rlsched:model=MoE")
    s.job_list[admin].reason = "JobHeldAdmin"
    dep = s.submit(2, "rlsched:model=MoE")
    s.job_list[dep].dependency = f"afterok:{fine}(unfulfilled)"

    class Agents(FakeAgents):
        def stats(self, job_nodes=None):
            return {str(slow): {"cs": 1.8, "step": 10, "total_steps": 100}, str(asked): {"cs": 1.1},
                    str(fine): {"cs": 1.05, "step": 50, "total_steps": 100, "samples_per_s": 2.0}}

    ctl = _ctl(tmp_path, s, Agents(), cs_preempt_threshold=1.5, min_run_s=60.0, now=1100.0)
    ctl.requests_dir.mkdir(parents=True, exist_ok=True)
    (ctl.requests_dir / f"preempt-{asked}").write_text("")
    page = StatusPage(ctl)
    try:
        rep = ctl.round()
        assert sorted(rep.preempted) == sorted([slow, asked]), rep
        doc = page.snapshot()
    finally:
        page.close()
    why = {a["job"]: a["why"] for r in doc["rounds"] for a in r["actions"] if a["action"] == "preempted"}
    assert why[str(slow)] == "measured CS 1.80 above cs_preempt_threshold 1.5"
    assert why[str(asked)] == "an operator asked for it (rlsched controller preempt)"
    q = {x["job"]: x for x in doc["queue"]}
    assert "asks for 64 GPUs, the partition has 32" in q[str(big)]["reason"] and q[str(big)]["kind"] == "left out"
    assert "held by an administrator" in q[str(admin)]["reason"]
    assert f"dependency afterok:{fine}" in q[str(dep)]["reason"]
    for jid in (slow, asked):
        assert q[str(jid)]["kind"] == "requeued"
    run = {r["job"]: r for r in doc["running"]}
    assert set(run) == {str(fine)}
    r = run[str(fine)]
    assert r["cs"] == 1.05 and r["cs_source"] == "agent" and r["samples_per_s"] == 2.0 and r["progress"] == 0.5
    # the map: node3 holds the job left running, node1 and node2 were freed by the preemptions
    slots = {n["name"]: [x["job"] for x in n["slots"]] for n in doc["nodes"]}
    assert slots["node3"] == [str(fine)] * 8 and slots["node1"] == [None] * 8 and slots["node2"] == [None] * 8


def test_a_secret_that_cannot_be_written_fails_the_start_naming_the_file(tmp_path):
    st = Stepper(tmp_path)
    f = st.twin.controller.state_dir / TOKEN_FILE
    (f / "x").mkdir(parents=True)  # a folder in its place: not replaceable, whoever runs this
    m = st.twin.controller.metrics
    with pytest.raises(OSError, match=re.escape(f"cannot write the status page's secret {f}")):
        m.serve(_free_port(), "127.0.0.1", controller=st.twin.controller)
    assert m.server is None and m.status_page is None
    assert not [p for p in f.parent.iterdir() if p.name.startswith(".status-token")]  # no temp file left
