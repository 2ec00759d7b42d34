"""``rlsched controller check-config`` checks what the daemon needs at start (controller.config.start_problems):
slurm.conf, the Slurm commands, the metrics address and port, the agents' hosts. No Slurm needed."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from controller.config import SLURM_COMMANDS, parse_config, start_problems
from rlsched.cli import main


def _bin_dir(tmp_path: Path, commands=SLURM_COMMANDS) -> Path:
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    for c in commands:
        f = d / c
        f.write_text("#!/bin/sh\nexit 0\n")
        f.chmod(0o755)
    return d


def _check(tmp_path: Path, capsys, toml: str) -> tuple[int, str]:
    f = tmp_path / "c.toml"
    bin_dir = _bin_dir(tmp_path)
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=t\n")
    head = f"[controller]\nstate_dir = {str(tmp_path / 'state')!r}\n[agents]\nenabled = false\n"
    if "[slurm]" not in toml:
        head += f"[slurm]\nconf = {str(conf)!r}\nbin_dir = {str(bin_dir)!r}\n"
    f.write_text(head + toml)
    rc = main(["controller", "check-config", str(f)])
    cap = capsys.readouterr()
    return rc, cap.err + cap.out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_config_that_passes(tmp_path, capsys):
    rc, out = _check(tmp_path, capsys, f"[metrics]\nport = {_free_port()}\naddress = '127.0.0.1'\n")
    assert rc == 0 and "OK" in out


@pytest.mark.parametrize(
    "slurm, needle",
    [
        ("conf = '{tmp}/missing.conf'", "slurm.conf: {tmp}/missing.conf does not exist"),
        ("conf = '{tmp}'", "slurm.conf: {tmp} is not a regular file"),
        ("conf = '{tmp}/slurm.conf'\nbin_dir = '{tmp}/nobin'", "slurm.bin_dir: {tmp}/nobin is not a directory"),
        ("conf = '{tmp}/slurm.conf'\nbin_dir = '{tmp}/half'", "slurm.bin_dir: {tmp}/half/squeue is not an executable"),
    ],
)
def test_slurm_files_must_exist(tmp_path, capsys, slurm, needle):
    (tmp_path / "slurm.conf").write_text("ClusterName=t\n")
    _bin_dir(tmp_path)
    half = tmp_path / "half"
    half.mkdir()
    (half / "scontrol").write_text("#!/bin/sh\n")
    (half / "scontrol").chmod(0o755)
    (half / "squeue").write_text("not executable\n")
    rc, out = _check(tmp_path, capsys, "[slurm]\n" + slurm.format(tmp=tmp_path) + "\n")
    assert rc == 2 and out.count("\n") == 1 and needle.format(tmp=tmp_path) in out


def test_slurm_commands_on_path_and_slurm_conf_env(tmp_path):
    cfg = parse_config({})
    empty = tmp_path / "empty"
    empty.mkdir()
    got = start_problems(cfg, environ={"PATH": str(empty)})
    assert [(p.key, p.fatal) for p in got] == [("slurm.bin_dir", True)]
    assert "scontrol, squeue, sinfo not found on PATH" in got[0].message
    bin_dir = _bin_dir(tmp_path)
    assert start_problems(cfg, environ={"PATH": str(bin_dir)}) == []
    got = start_problems(cfg, environ={"PATH": str(bin_dir), "SLURM_CONF": str(tmp_path / "nope.conf")})
    assert [p.key for p in got] == ["slurm.conf"] and "$SLURM_CONF names" in got[0].message


def test_metrics_address_must_resolve_and_port_be_free(tmp_path, capsys):
    rc, out = _check(tmp_path, capsys, "[metrics]\nport = 9810\naddress = 'no-such-host.invalid'\n")
    assert rc == 2 and "metrics.address: 'no-such-host.invalid' does not resolve" in out
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        rc, out = _check(tmp_path, capsys, f"[metrics]\nport = {port}\naddress = '127.0.0.1'\n")
    assert rc == 2 and f"metrics.port: port {port} on 127.0.0.1 is already in use" in out
    rc, out = _check(tmp_path, capsys, "[metrics]\nport = 0\naddress = 'no-such-host.invalid'\n")
    assert rc == 0  # metrics off: the address is not used


def test_metrics_port_held_by_the_running_controller_is_a_note(tmp_path, capsys):
    """``check-config && systemctl reload``: the running controller holds its own port."""
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "controller.lock").write_text(str(os.getpid()))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        rc, out = _check(tmp_path, capsys, f"[metrics]\nport = {port}\naddress = '127.0.0.1'\n")
    assert rc == 0 and f"by the running controller (pid {os.getpid()})" in out


@pytest.mark.skipif(os.geteuid() == 0, reason="root may bind any port")
def test_privileged_port_as_a_user_is_a_warning(tmp_path, capsys):
    rc, out = _check(tmp_path, capsys, "[metrics]\nport = 80\naddress = '127.0.0.1'\n")
    assert rc == 0 and "warning:" in out and "needs privileges" in out


def test_agent_hosts_must_resolve(tmp_path):
    key = tmp_path / "agent.key"
    key.write_text("k" * 32)
    key.chmod(stat.S_IRUSR | stat.S_IWUSR)
    cfg = parse_config({"agents": {"addresses": {"n1": "localhost:50051", "n2": "nohost.invalid:50052"},
                                   "auth": f"sharedkey:{key}"}})
    got = [p for p in start_problems(cfg) if p.key.startswith("agents")]
    assert [p.key for p in got] == ["agents.addresses.n2"] and "'nohost.invalid' does not resolve" in got[0].message
    cfg = parse_config({"agents": {"port_base": 50050, "host": "nohost.invalid"}})
    assert [p.key for p in start_problems(cfg) if p.key.startswith("agents")] == ["agents.host"]
    cfg = parse_config({"agents": {"port_base": 50050, "host": "{node}.invalid"}})  # per node, by the daemon
    assert [p for p in start_problems(cfg) if p.key.startswith("agents")] == []
    cfg = parse_config({"agents": {"enabled": False, "addresses": {"n2": "nohost.invalid:1"}}})
    assert [p for p in start_problems(cfg) if p.key.startswith("agents")] == []


@pytest.mark.parametrize("command, policy", [("run", "gredy"), ("check-config", "gredy"), ("check-config", "rl-hybird")])
def test_unknown_policy_error_lists_every_policy_name(tmp_path, capsys, command, policy):
    """`controller run` (before its first round: heuristic names; RL names need the partition's shape) and
    `check-config` refuse an unknown policy with one line naming every policy (heuristics and RL), as
    simulate and evaluate do (policies.registry)."""
    from policies.registry import policy_names

    f = tmp_path / "c.toml"
    f.write_text(f"[controller]\nstate_dir = {str(tmp_path / 'state')!r}\npolicy = {policy!r}\n"
                 f"[agents]\nenabled = false\n[slurm]\nbin_dir = {str(_bin_dir(tmp_path))!r}\n")
    argv = ["controller", command] + (["--config", str(f), "--once"] if command == "run" else [str(f)])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and repr(policy) in err
    assert all(name in err for name in policy_names()), err
