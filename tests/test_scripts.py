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
