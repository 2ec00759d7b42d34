"""scripts/*.sh, slurm_conf/* and the README's commands, without starting anything.

The scripts' live behaviour (a real cluster: up, status, down, failures) is in
tests/test_slurm_integration.py and docs/SLURM.md; here: argument checks that
come before anything is written, the choice of Python environment, and the
consistency of the shipped configuration files.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "scripts"
CONF = REPO / "slurm_conf"


def _bash(cmd: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, env=env, cwd=cwd, timeout=60,
                          check=False)


@pytest.mark.parametrize("script", sorted(p.name for p in SCRIPTS.glob("*.sh")))
def test_scripts_parse(script):
    p = subprocess.run(["bash", "-n", str(SCRIPTS / script)], capture_output=True, text=True, check=False)
    assert p.returncode == 0, p.stderr


# --------------------------------------------------------------------------- scripts/python-env.sh
def _fake_repo(tmp_path: Path, venv: bool) -> Path:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(SCRIPTS / "python-env.sh", repo / "scripts")
    if venv:
        (repo / ".venv" / "bin").mkdir(parents=True)
        py = repo / ".venv" / "bin" / "python"
        py.write_text("#!/bin/sh\nexit 0\n")
        py.chmod(0o755)
    return repo


def _fake_python(tmp_path: Path, externally_managed: bool) -> Path:
    """A 'python' that answers python-env.sh's PEP 668 probe (the probe script comes on stdin)."""
    p = tmp_path / ("python-em" if externally_managed else "python-free")
    p.write_text(f"#!/bin/sh\ncat >/dev/null\nexit {0 if externally_managed else 1}\n")
    p.chmod(0o755)
    return p


def _select(repo: Path, python: Path | str, **env: str) -> tuple[str, str, str]:
    e = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    e.update(PYTHON=str(python), PATH="/usr/bin:/bin", **env)
    p = _bash(f'source {shlex.quote(str(repo / "scripts" / "python-env.sh"))}; '
              'printf "%s|%s|%s" "$PY" "${VIRTUAL_ENV:-}" "$PATH"', env=e)
    assert p.returncode == 0, p.stderr
    py, venv, path = p.stdout.split("|")
    return py, venv, path


def test_python_env_uses_the_repo_venv_only_for_an_externally_managed_python(tmp_path):
    repo = _fake_repo(tmp_path, venv=True)
    em, free = _fake_python(tmp_path, True), _fake_python(tmp_path, False)
    # externally managed (Debian's python3) and setup.sh made .venv: that one, activated
    py, venv, path = _select(repo, em)
    assert py == str(repo / ".venv" / "bin" / "python") and venv == str(repo / ".venv")
    assert path.split(":")[0] == str(repo / ".venv" / "bin")
    # any other Python (pyenv, conda, ...): unchanged, even with a .venv in the checkout
    assert _select(repo, free) == (str(free), "", "/usr/bin:/bin")
    # an active virtualenv: unchanged
    assert _select(repo, em, VIRTUAL_ENV=str(tmp_path / "other"))[:2] == (str(em), str(tmp_path / "other"))
    # externally managed, but no .venv yet (setup.sh has not run): unchanged; setup.sh creates it
    assert _select(_fake_repo(tmp_path / "b", venv=False), em)[:2] == (str(em), "")


def test_pep668_probe_on_real_interpreters(tmp_path):
    probe = f"source {shlex.quote(str(SCRIPTS / 'python-env.sh'))}; py_externally_managed \"$1\""
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}

    def managed(python: str) -> bool:
        return subprocess.run(["bash", "-c", probe, "probe", python], env=env, capture_output=True,
                              check=False).returncode == 0

    import sysconfig

    marker = Path(sysconfig.get_path("stdlib")) / "EXTERNALLY-MANAGED"
    assert managed(sys.executable) == (sys.prefix == sys.base_prefix and marker.is_file())
    debian = Path("/usr/bin/python3")
    if debian.exists() and Path("/usr/lib/python3.11/EXTERNALLY-MANAGED").is_file():
        assert managed(str(debian))
        # a virtualenv made from it is not (pip installs into it)
        venv = tmp_path / "venv"
        if subprocess.run([str(debian), "-m", "venv", "--without-pip", str(venv)], capture_output=True,
                          check=False).returncode == 0:
            assert not managed(str(venv / "bin" / "python"))


# --------------------------------------------------------------------------- scripts/local-cluster.sh
LC = SCRIPTS / "local-cluster.sh"


def test_local_cluster_refuses_a_dir_with_whitespace_before_writing_anything(tmp_path):
    d = tmp_path / "with space" / "lc"
    p = _bash(f"bash {shlex.quote(str(LC))} up --dir {shlex.quote(str(d))}")
    assert p.returncode == 2 and "--dir must not contain whitespace" in p.stderr
    assert not (tmp_path / "with space").exists()
    p = _bash(f"bash {shlex.quote(str(LC))} up --dir {shlex.quote(str(tmp_path / 'gpu[1]'))}")
    assert p.returncode == 2 and "--dir may contain only" in p.stderr


def test_local_cluster_makes_a_relative_dir_absolute(tmp_path):
    for cmd, env in ((f"bash {shlex.quote(str(LC))} status --dir rel/lc", {}),
                     (f"bash {shlex.quote(str(LC))} status", {"RLSCHED_CLUSTER_DIR": "rel/lc"})):
        p = _bash(cmd, env={**os.environ, **env}, cwd=tmp_path)
        assert p.returncode == 1 and p.stdout.strip() == f"no cluster at {tmp_path / 'rel' / 'lc'}"
    p = _bash(f"bash {shlex.quote(str(LC))} down --dir rel/lc", cwd=tmp_path)
    assert p.returncode == 0 and f"nothing running at {tmp_path / 'rel' / 'lc'}" in p.stderr


def test_local_cluster_status_sees_processes_it_may_not_signal():
    """`status` as a user: root's daemons are running, not 'stopped' (kill -0 says EPERM for them)."""
    p = _bash(f"source <(sed -n '/^alive()/,/^pid_alive()/p' {shlex.quote(str(LC))}); "
              "alive 1 && echo one; alive $$ && echo self; alive 999999999 || echo gone; alive x || echo bad")
    assert p.stdout.split() == ["one", "self", "gone", "bad"], p.stderr


def _as_nobody(cmd: str) -> str:
    """``cmd`` run as an unprivileged user: nobody when we are root, else ourselves. (`up` checks its
    options before it checks for root: as a user, a script that failed to refuse them would still
    start nothing.)"""
    if os.geteuid() != 0:
        return cmd
    if shutil.which("runuser") is None:
        pytest.skip("runuser (util-linux) missing")
    return f"runuser -u nobody -- bash -c {shlex.quote(cmd)}"


@pytest.mark.parametrize("opt", ["--nodes", "--gpus", "--dir", "--port", "--policy", "--interval", "--metrics-port"])
def test_local_cluster_options_need_a_value(opt, tmp_path):
    d = shlex.quote(str(tmp_path / "lc"))
    for args in (f"--dir {d} {opt}", f"--dir {d} {opt} --no-agents"):  # missing, or the next option taken for it
        p = _bash(_as_nobody(f"bash {shlex.quote(str(LC))} up {args}"))
        assert p.returncode == 2 and p.stderr.strip() == f"local-cluster: error: {opt} needs a value (see --help)", p.stderr
    assert not (tmp_path / "lc").exists()


def test_local_cluster_refuses_ports_that_clash_or_overflow(tmp_path):
    up = f"bash {shlex.quote(str(LC))} up --dir {shlex.quote(str(tmp_path / 'lc'))}"
    p = _bash(_as_nobody(f"{up} --nodes 60 --port 7600"))
    assert p.returncode == 2 and "port 7651 would be used by both the slurmd of node51 and the agent of node1" in p.stderr
    p = _bash(_as_nobody(f"{up} --port 65500 --no-agents --no-controller --nodes 40"))
    # 40 managed nodes and other1, the unmanaged partition's node
    assert p.returncode == 2 and "--nodes 40 and --other-nodes 1 need ports up to 65541, above 65535" in p.stderr, p.stderr
    p = _bash(_as_nobody(f"{up} --port 65500 --no-agents --no-controller --nodes 35 --other-nodes x"))
    assert p.returncode == 2 and "--other-nodes must be a number" in p.stderr, p.stderr
    assert not (tmp_path / "lc").exists()


def test_local_cluster_down_needs_root():
    d = Path(tempfile.mkdtemp(prefix="lc-down-", dir="/tmp"))  # readable by nobody (tmp_path is not)
    try:
        d.chmod(0o755)
        (d / "run").mkdir(mode=0o755)
        (d / "run" / "slurmctld.pid").write_text("999999999\n")  # a dead pid: nothing to signal
        t0 = time.monotonic()
        p = _bash(_as_nobody(f"bash {shlex.quote(str(LC))} down --dir {shlex.quote(str(d))}"))
        assert p.returncode == 2 and "down needs root" in p.stderr, p.stderr
        assert time.monotonic() - t0 < 20 and (d / "run" / "slurmctld.pid").exists()
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _port_in_use(port: int, shadow: str = "", py: str = sys.executable) -> bool:
    """scripts/local-cluster.sh's port_in_use; ``shadow`` defines functions that hide its tools."""
    p = _bash(f"source <(sed -n '/^port_in_use()/,/^}}/p' {shlex.quote(str(LC))}); {shadow}\n"
              f"PY={shlex.quote(py)}; port_in_use {port}")
    assert p.returncode in (0, 1), p.stderr
    return p.returncode == 0


def test_local_cluster_port_check_with_and_without_ss():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        backends = {"bind test": "ss() { return 1; }", "/dev/tcp": "ss() { return 1; }"}
        if shutil.which("ss"):
            backends["ss"] = ""
        for name, shadow in backends.items():
            py = "/nonexistent/python" if name == "/dev/tcp" else sys.executable
            assert _port_in_use(port, shadow, py), name
    for name, shadow in backends.items():
        py = "/nonexistent/python" if name == "/dev/tcp" else sys.executable
        assert not _port_in_use(port, shadow, py), name


@pytest.mark.skipif(os.geteuid() != 0, reason="`up` needs root")
def test_local_cluster_up_refuses_a_busy_port_before_doing_anything(tmp_path):
    import socket

    d = tmp_path / "lc"
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", 0))
        s.listen()
        port = s.getsockname()[1]
        try:
            p = _bash(f"bash {shlex.quote(str(LC))} up --dir {shlex.quote(str(d))} --port {port} --nodes 1 "
                      "--no-controller --no-agents")
        finally:  # had it started anything, stop it
            _bash(f"bash {shlex.quote(str(LC))} down --dir {shlex.quote(str(d))}")
    assert p.returncode == 2 and f"port {port} (for the slurmctld) is already in use" in p.stderr, p.stderr
    assert not d.exists()


# --------------------------------------------------------------------------- slurm_conf/
def _conf_lines(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "=" in line and not line.startswith(("NodeName", "PartitionName")):
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def test_slurm_conf_fragment_gives_jobs_a_default_memory_so_they_can_share_nodes():
    frag = _conf_lines(CONF / "slurm.conf.fragment")
    if "Memory" in frag["SelectTypeParameters"]:
        assert {"DefMemPerCPU", "DefMemPerGPU", "DefMemPerNode"} & frag.keys()
    # the one-machine cluster uses the same selection parameters
    lc = LC.read_text()
    assert f'echo "SelectTypeParameters={frag["SelectTypeParameters"]}"' in lc
    for k in ("DefMemPerCPU", "DefMemPerGPU", "DefMemPerNode"):
        assert (k in frag) == (f'echo "{k}=' in lc)


def test_controller_example_names_the_fragments_nodes():
    nodes = re.search(r"^# NodeName=(\w+)\[(\d+)-(\d+)\]", (CONF / "slurm.conf.fragment").read_text(), re.M)
    prefix, lo, hi = nodes.group(1), nodes.group(2), nodes.group(3)
    names = {f"{prefix}{i:0{len(lo)}d}" for i in range(int(lo), int(hi) + 1)}
    ex = tomllib.loads((CONF / "controller.toml.example").read_text())
    assert set(ex["agents"]["addresses"]) == names
    assert re.search(rf"^NodeName={prefix}\[{lo}-{hi}\]", (CONF / "gres.conf.example").read_text(), re.M)


def test_systemd_units_run_the_documented_install_and_require_a_store():
    ctl = (CONF / "rlsched-controller.service").read_text()
    agent = (CONF / "rlsched-agent@.service").read_text()
    for unit in (ctl, agent):
        execs = re.findall(r"^Exec(?:Start|StartPre)=(\S+)", unit, re.M)
        assert execs and all(e in ("/opt/rlsched/bin/rlsched", "/bin/sh") for e in execs), execs
    assert "/opt/rlsched" in (REPO / "docs" / "SLURM.md").read_text()
    # no node-local default store: RLSCHED_STORE comes from /etc/default/rlsched-agent or the start fails
    assert not re.search(r"^Environment=RLSCHED_STORE=", agent, re.M)
    pre = re.search(r"^ExecStartPre=/bin/sh -c '(.*)'$", agent, re.M).group(1).replace("$$", "$")
    env = {k: v for k, v in os.environ.items() if k != "RLSCHED_STORE"}
    p = subprocess.run(["sh", "-c", pre], env=env, capture_output=True, text=True, check=False)
    assert p.returncode != 0 and "RLSCHED_STORE" in p.stderr and "/etc/default/rlsched-agent" in p.stderr
    p = subprocess.run(["sh", "-c", pre], env={**env, "RLSCHED_STORE": "/shared/ckpt"}, capture_output=True,
                       check=False)
    assert p.returncode == 0


# --------------------------------------------------------------------------- scripts/quickstart.sh
QS = SCRIPTS / "quickstart.sh"


def test_quickstart_usage_and_bad_arguments(tmp_path):
    p = _bash(f"bash {shlex.quote(str(QS))} --help", cwd=tmp_path)
    assert p.returncode == 0 and "quickstart.sh DIR" in p.stdout
    for args in ("--bogus", "a b", "''"):
        p = _bash(f"bash {shlex.quote(str(QS))} {args}", cwd=tmp_path)
        assert p.returncode == 2 and p.stderr.startswith("quickstart.sh: error: "), (args, p.stderr)
    assert sorted(os.listdir(tmp_path)) == []


def test_quickstart_refuses_a_foreign_directory_resolved_from_the_callers_cwd(tmp_path):
    """A relative DIR is the caller's; a non-empty DIR that no simulate run wrote is never replaced."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me\n")
    (tmp_path / "afile").write_text("x\n")
    for arg, why in (("mine", "is not the output of an earlier quickstart/simulate run"),
                     ("afile", "exists and is not a directory"),
                     (".", "is the current directory or one of its parents")):
        p = _bash(f"bash {shlex.quote(str(QS))} {arg}", cwd=tmp_path)
        assert p.returncode == 2 and why in p.stderr and str((tmp_path / arg).resolve()) in p.stderr, p.stderr
        assert "==>" not in p.stdout  # refused before setup.sh ran
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me\n"


def test_quickstart_recognises_a_previous_simulate_output(tmp_path):
    def is_output(d: Path) -> bool:
        p = _bash(f"source <(sed -n '/^is_simulate_output()/,/^}}/p' {shlex.quote(str(QS))}); "
                  f"is_simulate_output {shlex.quote(str(d))}")
        return p.returncode == 0

    d = tmp_path / "run"
    d.mkdir()
    assert not is_output(d)
    # what trainer/cli_sim.py writes
    (d / "summary.json").write_text('{"policies": ["fifo"], "files": {"fifo": "jobs_fifo.parquet"}, "summaries": {}}')
    (d / "jobs_fifo.parquet").write_bytes(b"PAR1")
    (d / "jct_cdf.png").write_bytes(b"png")
    assert is_output(d)
    (d / "notes.txt").write_text("mine\n")  # anything else: not replaced
    assert not is_output(d)
    (d / "notes.txt").unlink()
    (d / "summary.json").write_text('{"something": "else"}')
    assert not is_output(d)


# --------------------------------------------------------------------------- scripts/rl_traces.sh
RT = SCRIPTS / "rl_traces.sh"


def test_rl_traces_usage_and_bad_arguments(tmp_path):
    p = _bash(f"bash {shlex.quote(str(RT))} --help", cwd=tmp_path)
    assert p.returncode == 0 and p.stdout.startswith("usage: ")
    for args in ("", "--out", "-x", "a b", "''"):
        p = _bash(f"bash {shlex.quote(str(RT))} {args}", cwd=tmp_path)
        assert p.returncode == 2 and "rl_traces.sh: error: " in p.stderr, (args, p.stderr)
    assert sorted(os.listdir(tmp_path)) == []  # no directory named after an option


def test_rl_traces_runs_rlsched_of_the_repo_venv_and_quotes_outdir(tmp_path):
    """Like the other scripts it uses python-env.sh: with an externally managed python3, REPO/.venv."""
    repo = _fake_repo(tmp_path, venv=True)
    shutil.copy(RT, repo / "scripts")
    calls = tmp_path / "calls"
    py = repo / ".venv" / "bin" / "python"
    py.write_text(f'#!/bin/sh\nprintf "%s|" "$@" >>{shlex.quote(str(calls))}\necho >>{shlex.quote(str(calls))}\n')
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env.update(PYTHON=str(_fake_python(tmp_path, True)), PATH="/usr/bin:/bin")
    out = tmp_path / "out dir"
    (out / "train" / "old").mkdir(parents=True)
    p = _bash(f"bash {shlex.quote(str(repo / 'scripts' / 'rl_traces.sh'))} 'out dir'", env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    lines = calls.read_text().splitlines()
    assert lines[0] == "-c|import rlsched|"
    gens = [ln.split("|") for ln in lines[1:]]
    assert gens and all(g[:4] == ["-m", "rlsched.cli", "trace", "generate"] for g in gens)
    assert "--mix|normal|--sets|3|--seed|101|--out|out dir/train/normal|" in lines[1]
    assert not (out / "train" / "old").exists()  # OUTDIR/train replaced


# --------------------------------------------------------------------------- README.md
def _readme_rlsched_commands() -> list[list[str]]:
    text = (REPO / "README.md").read_text()
    cmds = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("#", 1)[0].strip()
            if line.startswith("rlsched "):
                cmds.append(shlex.split(line)[1:])
    return cmds


def test_every_rlsched_command_in_the_readme_parses():
    from rlsched.cli import build_parser

    cmds = _readme_rlsched_commands()
    assert ["controller", "run", "--config", "/etc/rlsched/controller.toml"] in cmds
    parser = build_parser()
    for argv in cmds:
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:  # --help: 0; a bad command: 2
            assert exc.code == 0, f"README: rlsched {' '.join(argv)} does not parse"
        else:
            assert getattr(args, "func", None), f"README: rlsched {' '.join(argv)} names no command"


def test_readme_keeps_two_setup_commands():
    text = (REPO / "README.md").read_text()
    section = text.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    assert re.findall(r"```bash\n(.*?)\n```", section, re.S) == ["bash scripts/quickstart.sh", "bash scripts/test.sh"]


# --------------------------------------------------------------------------- scripts/setup.sh
def test_setup_shows_pips_output(tmp_path):
    """setup.sh runs pip without -q: what pip downloads (torch from PyPI: GBs, minutes) and its progress
    reach the user, with a line saying what comes before each install."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    for name in ("setup.sh", "python-env.sh"):
        shutil.copy(SCRIPTS / name, repo / "scripts")
    log = tmp_path / "pip.log"
    py = tmp_path / "python"
    py.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        f'  -m) shift; if [ "$2" = install ]; then echo "$*" >>{shlex.quote(str(log))}; '
        'echo "Downloading fake-2.13.0.whl (2100.0 MB)"; fi; exit 0 ;;\n'
        '  -c) echo /fake/prefix; exit 0 ;;\n'
        '  *) cat >/dev/null; exit 1 ;;\n'
        "esac\n"
    )
    py.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PIP_QUIET")}
    env.update(PYTHON=str(py), PATH="/usr/bin:/bin")
    p = _bash(f"bash {shlex.quote(str(repo / 'scripts' / 'setup.sh'))} --no-slurm", env=env, cwd=repo)
    assert p.returncode == 0, p.stderr
    calls = log.read_text().splitlines()
    assert len(calls) == 2 and all(c.startswith("pip install") and " -q" not in c and "--progress-bar on" in c
                                   for c in calls), calls
    assert p.stdout.count("Downloading fake-2.13.0.whl (2100.0 MB)") == 2
    assert "==> pip install torch==2.13.0" in p.stdout and "==> pip install -e" in p.stdout


def test_reproduce_shipped_usage_and_bad_arguments(tmp_path):
    s = SCRIPTS / "reproduce_shipped.sh"
    p = _bash(f"bash {shlex.quote(str(s))} --help", cwd=tmp_path)
    assert p.returncode == 0 and "reproduce_shipped.sh DIR" in p.stdout
    for args in ("--bogus", "a b", "''"):
        p = _bash(f"bash {shlex.quote(str(s))} {args}", cwd=tmp_path)
        assert p.returncode == 2 and p.stderr.count("reproduce_shipped.sh: error: ") == 1, (args, p.stderr)
    (tmp_path / "d" / "runs" / "g").mkdir(parents=True)
    p = _bash(f"bash {shlex.quote(str(s))} d", cwd=tmp_path)
    assert p.returncode == 2 and "holds earlier runs" in p.stderr


def _stop_pidfiles(pidfile: Path) -> subprocess.CompletedProcess:
    """scripts/local-cluster.sh's stop_pidfiles (with the helpers it calls) on one pid file."""
    src = "; ".join(f"source <(sed -n '/^{f}()/,/^}}/p' {shlex.quote(str(LC))})"
                    for f in ("alive", "pidfile_pid", "stop_pidfiles"))
    return _bash(f"{src}; stop_pidfiles {shlex.quote(str(pidfile))}")


def test_local_cluster_never_signals_a_reused_pid(tmp_path):
    """A pid file whose daemon died may name a later process that reused the pid: `down` must leave that
    process alone (the file was written before it started), and still stop the process that wrote it."""
    stale = tmp_path / "stale.pid"
    stale.write_text("0\n")
    os.utime(stale, (time.time() - 30, time.time() - 30))  # written 30 s before the process below started
    later = subprocess.Popen(["sleep", "60"])
    try:
        stale.write_text(f"{later.pid}\n")
        os.utime(stale, (time.time() - 30, time.time() - 30))
        p = _stop_pidfiles(stale)
        assert p.returncode == 0, p.stderr
        assert later.poll() is None, "a process that started after its pid file was written was signalled"
        own = tmp_path / "own.pid"
        own.write_text(f"{later.pid}\n")  # written after the process started: it is the recorded one
        p = _stop_pidfiles(own)
        assert p.returncode == 0, p.stderr
        assert later.wait(timeout=10) == -15 and not own.exists()
    finally:
        later.kill()
        later.wait()
