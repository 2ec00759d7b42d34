"""Packaging: what each install (setup.cfg: the base and its extras) can run.

The in-process-free checks run ``rlsched`` in a subprocess whose ``-c`` prelude puts a
``sys.meta_path`` finder first that refuses the libraries of the extras a host lacks, as if they
were not installed: the node agent on the base alone, the controller (check-config, rounds with the
shipped RL policies and the heuristics) without the trainer stack, and the trainer commands there
failing with one line. The ``slow`` test asks pip (``--dry-run --report`` in a fresh virtualenv)
which distributions ``.[agent]`` and ``.[trainer]`` install.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import venv
from pathlib import Path
from urllib.parse import urlparse

import pytest

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"

#: top-level modules of the trainer extra that the controller extra does not bring
TRAINER_ONLY = ("torch", "stable_baselines3", "sb3_contrib", "gymnasium", "tensorboard", "matplotlib", "pyarrow")
#: top-level modules of the controller extra (the base install has none of them)
CONTROLLER = ("scipy", "yaml", "rich", "safetensors", "prometheus_client")

#: prelude of every ``python -c``: refuse to import the top-level modules named in $RLSCHED_TEST_REFUSE
REFUSE = textwrap.dedent("""\
    import os, sys
    _REFUSED = frozenset(filter(None, os.environ["RLSCHED_TEST_REFUSE"].split(",")))
    class _Refuse:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in _REFUSED:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None
    sys.meta_path.insert(0, _Refuse())
    """)
#: after REFUSE: the ``rlsched`` command with the arguments of the subprocess
CLI = "from rlsched.cli import main\nsys.exit(main(sys.argv[1:]))\n"
#: after a script: which refused modules got into sys.modules (none can; printed as the last line)
LOADED = "\nprint(sorted(m for m in sys.modules if m.partition('.')[0] in _REFUSED))\n"


def run_without(refused: tuple[str, ...], code: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``python -c REFUSE+code args`` with this checkout first on the path and ``refused`` not importable."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(TESTS)]),
           "RLSCHED_TEST_REFUSE": ",".join(refused), "MPLBACKEND": "Agg"}
    return subprocess.run([sys.executable, "-c", REFUSE + code, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_the_refusing_prelude_refuses():
    """The harness itself: a refused module cannot be imported, others can."""
    p = run_without(("json",), "import csv\ntry:\n    import json\nexcept ModuleNotFoundError as e:\n"
                    "    print('refused', e.name)\n", cwd=REPO)
    assert p.returncode == 0 and p.stdout.split() == ["refused", "json"], p.stderr


# --------------------------------------------------------------------------- agent host: the base alone
def test_agent_host_runs_on_the_base_install(tmp_path):
    """With only the base requirements (no controller, trainer or hdfs libraries), ``rlsched`` starts,
    the agent's help and key generation work, and a real agent serves a client over gRPC."""
    refused = TRAINER_ONLY + CONTROLLER + ("hdfs",)
    for argv in (["--help"], ["agent", "--help"], ["agent-keygen", "--help"], ["controller", "--help"]):
        p = run_without(refused, CLI, *argv, cwd=tmp_path)
        assert p.returncode == 0 and p.stdout.startswith("usage: rlsched"), (argv, p.stderr)
    p = run_without(refused, CLI, "agent-keygen", str(tmp_path / "agent.key"), cwd=tmp_path)
    assert p.returncode == 0 and (tmp_path / "agent.key").stat().st_mode & 0o777 == 0o600, p.stderr
    script = textwrap.dedent(f"""\
        from pathlib import Path
        from agent_helpers import serve_agent
        from nodeagent.auth import SharedKeyAuthenticator
        from nodeagent.client import AgentClient
        import nodeagent.jobhelper  # the helper a training job imports (torch only inside its calls)
        key = SharedKeyAuthenticator(Path({str(tmp_path / "agent.key")!r}))
        with serve_agent(Path({str(tmp_path)!r}), key) as srv:
            with AgentClient(srv.address, key, timeout=10) as c:
                h = c.health()
                print(h["node"], h["num_jobs"], c.job_stats())
        """) + LOADED
    p = run_without(refused, script, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == ["node-a 0 []", "[]"]


def test_controller_commands_on_the_base_install_name_the_controller_extra(tmp_path):
    """``controller check-config`` needs the controller extra (the performance model's fit): without it,
    exit 2 and one line naming the library and the extra."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[controller]\npolicy = "greedy"\nstate_dir = "{tmp_path}"\n[agents]\nenabled = false\n')
    p = run_without(TRAINER_ONLY + CONTROLLER, CLI, "controller", "check-config", str(cfg), cwd=tmp_path)
    assert p.returncode == 2 and p.stdout == "", p.stderr
    assert p.stderr.count("\n") == 1 and "install rlsched[controller]" in p.stderr, p.stderr


# --------------------------------------------------------------------------- controller host: no trainer stack
def test_commands_start_without_the_trainer_stack(tmp_path):
    """Every subcommand's help works without torch, SB3, gymnasium, tensorboard, matplotlib and pyarrow."""
    for argv in (["--help"], ["agent", "--help"], ["controller", "--help"], ["controller", "check-config", "--help"],
                 ["controller", "run", "--help"], ["trace", "--help"], ["trace", "from-sacct", "--help"],
                 ["simulate", "--help"], ["train", "--help"], ["evaluate", "--help"], ["checkpoint", "--help"]):
        p = run_without(TRAINER_ONLY, CLI, *argv, cwd=tmp_path)
        assert p.returncode == 0 and p.stdout.startswith("usage: rlsched"), (argv, p.stderr)


@pytest.mark.parametrize("policy", ["rl-hybrid", "rl-base", "greedy", "fifo"])
def test_controller_check_config_builds_policies_without_the_trainer_stack(tmp_path, policy):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[controller]\npolicy = "{policy}"\nstate_dir = "{tmp_path}"\n[agents]\nenabled = false\n')
    p = run_without(TRAINER_ONLY, CLI, "controller", "check-config", str(cfg), cwd=tmp_path)
    assert p.returncode == 0 and p.stdout.startswith(f"{cfg}: OK (policy {policy}"), p.stderr


def test_controller_rounds_run_shipped_rl_policies_and_heuristics_without_the_trainer_stack(tmp_path):
    """The daemon's round (tests/test_controller.py's in-memory Slurm) places jobs with the shipped
    RL checkpoints (numpy inference) and the heuristics; no trainer library is ever imported."""
    script = textwrap.dedent(f"""\
        from pathlib import Path
        from test_controller import FakeSlurm, _ctl
        for policy in ("rl-hybrid", "rl-base", "greedy", "fifo", "srtf", "las"):
            s = FakeSlurm()
            ids = [s.submit(g, "rlsched:model=" + m) for g, m in ((8, "MoE"), (4, "DLRM"), (2, "GraphSage"), (16, "FSDP"))]
            rep = _ctl(Path({str(tmp_path)!r}) / policy, s, policy=policy).round()
            placed = dict(rep.placed)
            assert rep.ok and placed and set(placed) <= set(ids), (policy, rep)
            assert all(sum(p.values()) == s.job_list[j].gpus for j, p in placed.items()), (policy, placed)
            print(policy, len(placed))
        """) + LOADED
    p = run_without(TRAINER_ONLY, script, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert [ln.split()[0] for ln in lines[:-1]] == ["rl-hybrid", "rl-base", "greedy", "fifo", "srtf", "las"]
    assert all(int(ln.split()[1]) >= 1 for ln in lines[:-1])
    assert lines[-1] == "[]"


def test_trainer_commands_fail_with_one_line_without_the_trainer_stack(tmp_path):
    """simulate / evaluate / train need the trainer extra: exit 2 with one line that names it, before any
    work (no output directory), instead of a traceback. ``trace generate`` (CSV) needs no extra."""
    trace = tmp_path / "t.csv"
    p = run_without(TRAINER_ONLY, CLI, "trace", "generate", "--jobs", "8", "--seed", "1", "--out", str(trace),
                    cwd=tmp_path)
    assert p.returncode == 0 and trace.exists(), p.stderr
    for argv in (["simulate", "--trace", str(trace), "--policy", "fifo", "--out", str(tmp_path / "sim")],
                 ["evaluate", "--traces", str(tmp_path), "--policies", "fifo", "--out", str(tmp_path / "ev")],
                 ["train", "--trace", str(trace), "--out", str(tmp_path / "tr")]):
        p = run_without(TRAINER_ONLY, CLI, *argv, cwd=tmp_path)
        assert p.returncode == 2 and p.stdout == "", (argv, p.stdout, p.stderr)
        assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, (argv, p.stderr)
        assert p.stderr.startswith(f"rlsched {argv[0]}: error: ") and "install rlsched[trainer]" in p.stderr
    assert sorted(x.name for x in tmp_path.iterdir()) == ["t.csv"]


def test_trace_from_sacct_runs_on_a_controller_host(tmp_path):
    """An admin turns the cluster's accounting into a CSV trace without the trainer stack; Parquet needs
    pyarrow (trainer extra): one line naming it, nothing written."""
    src = TESTS / "data" / "sacct" / "sacct_P.txt"
    p = run_without(TRAINER_ONLY, CLI, "trace", "from-sacct", str(src), "--out", str(tmp_path / "t.csv"), cwd=tmp_path)
    assert p.returncode == 0 and p.stdout.splitlines()[-1] == f"wrote 9 jobs to {tmp_path / 't.csv'}", p.stderr
    p = run_without(TRAINER_ONLY, CLI, "trace", "from-sacct", str(src), "--out", str(tmp_path / "t.parquet"),
                    cwd=tmp_path)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "install rlsched[trainer]" in p.stderr, p.stderr
    assert sorted(x.name for x in tmp_path.iterdir()) == ["t.csv"]


def test_missing_extra_names_only_optional_libraries():
    from rlsched.cli import OPTIONAL_MODULES, missing_extra

    assert missing_extra(ModuleNotFoundError("No module named 'torch.nn'", name="torch.nn")) == (
        "torch, which is not installed: install rlsched[trainer] (pip install 'rlsched[trainer]')")
    assert "rlsched[controller]" in missing_extra(ModuleNotFoundError("x", name="yaml"))
    # a module of this project or of the base install is a bug, not a missing extra
    for name in ("policies.nothere", "numpy", "grpc", None):
        assert missing_extra(ModuleNotFoundError("x", name=name)) is None
    assert missing_extra(ImportError("cannot import name 'x' from 'torch'", name="torch")) is None
    # every optional library belongs to an extra that setup.cfg declares
    extras = set(re.findall(r"^(\w+) =", _setup_cfg_section("options.extras_require"), re.M))
    assert {extra for _, extra in OPTIONAL_MODULES.values()} <= extras


def _setup_cfg_section(name: str) -> str:
    text = (REPO / "setup.cfg").read_text()
    return text.split(f"[{name}]\n", 1)[1].split("\n[", 1)[0]


# --------------------------------------------------------------------------- pip: what an install brings
#: distributions (PEP 503 names) an agent host must not get
HEAVY = ("torch", "stable-baselines3", "sb3-contrib", "tensorboard", "matplotlib")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _index_reachable() -> str | None:
    """None when pip's package index answers a TCP connection; else why not."""
    url = os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple/"
    u = urlparse(url)
    if u.scheme == "file":
        return None if Path(u.path).exists() else f"pip's index {url} does not exist"
    try:
        with socket.create_connection((u.hostname, u.port or (443 if u.scheme == "https" else 80)), timeout=5):
            return None
    except OSError as exc:
        return f"pip's package index {url} is unreachable ({exc})"


@pytest.fixture(scope="module")
def fresh_pip(tmp_path_factory) -> list[str]:
    """The pip command for a fresh virtualenv (no site packages): its own pip, or, where this Python has no
    ``ensurepip`` (Debian without python3-venv), this pip aimed at it with ``--python``. Either reads this
    machine's pip configuration (find-links, constraints, extra index URLs) as any pip here does."""
    d = tmp_path_factory.mktemp("venv")
    try:
        venv.create(d, with_pip=True, clear=True)
        return [str(d / "bin" / "pip")]
    except subprocess.CalledProcessError:
        venv.create(d, with_pip=False, clear=True)
        return [sys.executable, "-m", "pip", "--python", str(d / "bin" / "python")]


def _dry_run(pip: list[str], extra: str, tmp_path: Path) -> set[str]:
    """PEP 503 names of what ``pip install --dry-run --ignore-installed '<repo>[extra]'`` would install."""
    report = tmp_path / f"report-{extra}.json"
    p = subprocess.run([*pip, "install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report),
                        f"{REPO}[{extra}]"], capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        why = _index_reachable()
        if why is not None:
            pytest.skip(why)
        pytest.fail(f"pip install --dry-run '{REPO}[{extra}]' failed:\n{p.stderr[-3000:]}")
    doc = json.loads(report.read_text())
    return {_canonical(item["metadata"]["name"]) for item in doc["install"]}


@pytest.mark.slow
def test_agent_extra_installs_no_torch_and_trainer_extra_brings_the_rl_stack(fresh_pip, tmp_path):
    agent = _dry_run(fresh_pip, "agent", tmp_path)
    assert {"rlsched", "numpy", "grpcio", "protobuf"} <= agent
    assert not agent & set(HEAVY), sorted(agent & set(HEAVY))
    assert not [n for n in agent if n.startswith(("nvidia-", "triton", "cuda-"))], sorted(agent)
    trainer = _dry_run(fresh_pip, "trainer", tmp_path)
    assert {"torch", "stable-baselines3", "sb3-contrib", "gymnasium", "tensorboard", "matplotlib",
            "pyarrow"} <= trainer
