"""Shared fixtures. ``slurm_cluster``: one real Slurm cluster per test session.

The cluster is 4 nodes x 8 (fake) GPUs on this machine, started with
``scripts/local-cluster.sh up`` in a fresh directory under /tmp on free ports
(node agents too, when ``rlsched agent`` exists; no controller: tests run
their own). It needs root (slurmd, useradd) and the Slurm binaries; otherwise
the tests using it are skipped with the reason.
"""

from __future__ import annotations

import os
import random
import shlex
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

REPO = Path(__file__).resolve().parents[1]
TEST_USER = "rlschedtest"


def _ports_free(ports: list[int]) -> bool:
    for p in ports:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", p))
            except OSError:
                return False
    return True


def _pick_port(nodes: int) -> int:
    rnd = random.Random(os.getpid())
    for _ in range(50):
        base = rnd.randrange(21000, 29000, 200)
        # slurmctld, the slurmd of node1..N and of other1 (the unmanaged partition), the agents
        if _ports_free([base] + [base + i for i in range(1, nodes + 2)] + [base + 50 + i for i in range(1, nodes + 1)]):
            return base
    raise RuntimeError("no free port range for the test cluster")


def _proc_start_epoch(pid: int) -> float | None:
    """When process ``pid`` started (seconds since the epoch, /proc/PID/stat field 22 after boot), or None if
    it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        if fields[0] == "Z":
            return None
        with open("/proc/stat") as fh:
            btime = next(int(line.split()[1]) for line in fh if line.startswith("btime "))
        return btime + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError, StopIteration):
        return None


@dataclass
class SlurmTestCluster:
    """Handle on the session's cluster: paths, environment and small helpers."""

    dir: Path
    port: int
    nodes: int
    gpus: int
    env: dict[str, str]
    agents: bool
    up_args: tuple[str, ...] = ()  # more options of `local-cluster.sh up` (e.g. --gpu-type)
    _procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def conf(self) -> str:
        return str(self.dir / "etc" / "slurm.conf")

    @property
    def jobs_dir(self) -> Path:
        return self.dir / "jobs"

    @property
    def munge_socket(self) -> str:
        return str(self.dir / "munge" / "munge.socket")

    def run(self, cmd: list[str] | str, user: str | None = None, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        """Run a command with this cluster's SLURM_CONF (as ``user`` via runuser)."""
        if isinstance(cmd, str):
            cmd = shlex.split(cmd)
        if user:
            passed = [f"{k}={v}" for k, v in self.env.items() if k.startswith(("SLURM_", "RLSCHED_"))]
            cmd = ["runuser", "-u", user, "--", "env", *passed, *cmd]
        p = subprocess.run(cmd, capture_output=True, text=True, env=self.env, timeout=timeout, cwd=str(self.jobs_dir), check=False)
        if check and p.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} -> {p.returncode}: {p.stderr.strip()}")
        return p

    def sbatch(self, script: str, gpus: int, comment: str = "", user: str | None = None, extra: list[str] | None = None) -> int:
        """Submit ``script`` (bash body) as a user would; returns the job id."""
        path = Path(tempfile.mkstemp(prefix="job-", suffix=".sh", dir=self.jobs_dir)[1])
        path.write_text("#!/bin/bash\n" + script + "\n")
        path.chmod(0o755)
        args = ["sbatch", "--parsable", f"--gpus={gpus}", "-o", str(self.jobs_dir / "%j.out"), "--open-mode=append"]
        if comment:
            args.append(f"--comment={comment}")
        args += extra or []
        out = self.run(args + [str(path)], user=user).stdout.strip()
        return int(out.split(";")[0])

    def slurm(self, timeout_s: float = 20.0):
        from controller.slurm import SlurmCLI

        return SlurmCLI(self.conf, timeout_s)

    def job(self, job_id: int):
        return {j.job_id: j for j in self.slurm().jobs()}.get(job_id)

    def wait(self, pred: Callable[[], bool], timeout: float, what: str, step: float = 0.3, tick: Callable[[], object] | None = None) -> None:
        """Poll ``pred`` (calling ``tick`` first each time, e.g. a controller round) until true."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if tick is not None:
                tick()
            if pred():
                return
            time.sleep(step)
        raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")

    def cancel_all(self) -> None:
        self.run(["scancel", "--user=root"], check=False)
        self.run(["scancel", f"--user={TEST_USER}"], check=False)
        end = time.monotonic() + 30
        while time.monotonic() < end:
            live = [j for j in self.slurm().jobs() if j.pending or j.state in ("RUNNING", "COMPLETING", "CONFIGURING")]
            if not live:
                return
            time.sleep(0.3)

    def controller_config(self, tmp: Path, **controller) -> Path:
        """Write a controller TOML for this cluster; returns its path."""
        c = {"policy": "fifo", "interval_s": 1.0, "state_dir": str(tmp / "ctl-state"), "min_run_s": 0.0,
             "start_grace_s": 30.0, "capacity_file": str(self.dir / "controller" / "capacity"), **controller}
        lines = ["[slurm]", f'conf = "{self.conf}"', 'partition = "gpu"', "command_timeout_s = 20", "[controller]"]
        for k, v in c.items():
            lines.append(f"{k} = {v!r}" if not isinstance(v, bool) else f"{k} = {str(v).lower()}")
        lines += ["[agents]", f"enabled = {str(self.agents).lower()}", f"port_base = {self.port + 50}",
                  f'auth = "munge:{self.munge_socket}"', "timeout_s = 5"]
        path = tmp / "controller.toml"
        path.write_text("\n".join(lines).replace("'", '"') + "\n")
        return path

    def pid(self, name: str) -> int | None:
        """The pid recorded in ``run/NAME.pid`` while it is still the process that wrote the file (alive, not
        a zombie, started no later than the file was written); None otherwise. A daemon that died leaves
        its pid to be reused by any later process (pid_max may be 32768): a test must never signal that."""
        f = self.dir / "run" / f"{name}.pid"
        try:
            pid = int(f.read_text().strip())
            written = f.stat().st_mtime
        except (OSError, ValueError):
            return None
        start = _proc_start_epoch(pid)
        return pid if start is not None and start <= written + 1.0 else None

    def script(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
        cmd = ["bash", str(REPO / "scripts" / "local-cluster.sh"), *args, "--dir", str(self.dir), "--port", str(self.port),
               "--nodes", str(self.nodes), "--gpus", str(self.gpus), "--no-controller"]
        if not self.agents:
            cmd.append("--no-agents")
        if args[:1] == ("up",):
            cmd += self.up_args
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        if p.returncode != 0:
            raise RuntimeError(f"local-cluster.sh {' '.join(args)} failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
        return p


def _read_env_sh(path: Path) -> dict[str, str]:
    out = subprocess.run(["bash", "-c", f"source {shlex.quote(str(path))} && env -0"], capture_output=True, check=True)
    return dict(item.split("=", 1) for item in out.stdout.decode().split("\0") if "=" in item)


@pytest.fixture(scope="session")
def slurm_cluster(request) -> SlurmTestCluster:
    yield from start_test_cluster(nodes=4, gpus=8)


@pytest.fixture(scope="module")
def typed_slurm_cluster(request) -> SlurmTestCluster:
    """A cluster of its own for a module: 4 nodes x 4 GPUs with typed GRES (node1-2 ``a100``, node3-4
    ``v100``, the unmanaged other1 ``a100``: ``local-cluster.sh up --gpu-type a100:2,v100:2``)."""
    yield from start_test_cluster(nodes=4, gpus=4, up_args=("--gpu-type", "a100:2,v100:2"))


def start_test_cluster(nodes: int, gpus: int, up_args: tuple[str, ...] = ()):
    """A fixture body: a fresh cluster of ``nodes`` x ``gpus`` (``local-cluster.sh up`` with ``up_args``)
    is yielded, and stopped and removed afterwards; skips without root or the Slurm binaries."""
    if os.geteuid() != 0:
        pytest.skip("real-Slurm tests need root (they start slurmctld/slurmd and add a test user)")
    missing = [b for b in ("slurmctld", "slurmd", "sbatch", "munged") if shutil.which(b) is None]
    if missing:
        pytest.skip(f"Slurm/MUNGE binaries missing: {', '.join(missing)} (bash scripts/setup.sh installs them)")
    if shutil.which("runuser") is None:
        pytest.skip("runuser (util-linux) missing")
    d = Path(tempfile.mkdtemp(prefix="rlsched-slurm-", dir="/tmp"))
    d.chmod(0o755)
    agents = subprocess.run(["rlsched", "agent", "--help"], capture_output=True, check=False).returncode == 0 if shutil.which("rlsched") else False
    cl = SlurmTestCluster(dir=d, port=_pick_port(nodes), nodes=nodes, gpus=gpus, env={}, agents=agents, up_args=up_args)
    try:
        cl.script("up")
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        subprocess.run(["bash", str(REPO / "scripts" / "local-cluster.sh"), "down", "--dir", str(d)], capture_output=True, check=False)
        pytest.fail(f"could not start the test Slurm cluster: {exc}")
    cl.env = _read_env_sh(d / "env.sh")
    yield cl
    subprocess.run(["bash", str(REPO / "scripts" / "local-cluster.sh"), "down", "--dir", str(d)], capture_output=True, timeout=120, check=False)
    if not os.environ.get("RLSCHED_KEEP_TEST_CLUSTER"):  # keep logs for debugging when set
        shutil.rmtree(d, ignore_errors=True)


# Exists while the test user is one this run created. The main process removes that user at the end of
# the run (``pytest_sessionfinish``): pytest-xdist's workers share the user, so no worker removes it.
_USER_MARK = Path(tempfile.gettempdir()) / f"rlsched-test-user-added.{os.getuid()}"


@pytest.fixture(scope="session")
def test_user() -> str:
    """An unprivileged user that submits jobs (created if missing; removed at the end of the run if this run
    created it, see ``pytest_sessionfinish``)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to add a test user")
    if subprocess.run(["id", TEST_USER], capture_output=True, check=False).returncode != 0:
        added = subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/bash", TEST_USER], capture_output=True, check=False)
        if added.returncode == 0:
            _USER_MARK.touch()
        elif subprocess.run(["id", TEST_USER], capture_output=True, check=False).returncode != 0:
            # not added by a parallel worker either: a real failure
            pytest.fail(f"useradd {TEST_USER} failed: {added.stderr.decode(errors='replace').strip()}")
    yield TEST_USER


def pytest_sessionfinish(session, exitstatus) -> None:
    """Remove the test user this run added, once: in the main process (pytest-xdist's controller, or the
    only process without it), after every worker has finished."""
    if hasattr(session.config, "workerinput") or not _USER_MARK.exists():
        return
    subprocess.run(["userdel", TEST_USER], capture_output=True, check=False)
    _USER_MARK.unlink(missing_ok=True)


def pytest_collection_modifyitems(session, config, items) -> None:
    """Test files that start real daemons or long jobs (marked ``slurm``) run first: with pytest-xdist's
    ``--dist loadfile`` (scripts/test.sh) a file runs on one worker, and a long file taken last would leave
    the other worker idle at the end. The order inside a file is kept."""
    first = {item.fspath for item in items if item.get_closest_marker("slurm")}
    items.sort(key=lambda item: item.fspath not in first)  # stable: keeps every other order


@pytest.fixture
def live_cluster(slurm_cluster: SlurmTestCluster) -> SlurmTestCluster:
    """The session cluster with an empty queue before and after the test."""
    slurm_cluster.cancel_all()
    yield slurm_cluster
    slurm_cluster.cancel_all()


@pytest.fixture(autouse=True)
def _controller_logger_restored():
    """Each test starts with the ``controller`` logger as the previous test found it: the daemon's CLI
    (``controller.metrics.setup_logging``) turns its propagation off and attaches stream handlers to the
    test's captured stderr, which would hide later tests' log records from ``caplog``."""
    import logging

    lg = logging.getLogger("controller")
    saved = list(lg.handlers), lg.propagate, lg.level
    yield
    for h in list(lg.handlers):
        if h not in saved[0]:
            lg.removeHandler(h)
    for h in saved[0]:
        if h not in lg.handlers:
            lg.addHandler(h)
    lg.propagate, lg.level = saved[1], saved[2]
