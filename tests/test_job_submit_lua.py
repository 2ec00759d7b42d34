"""slurm_conf/job_submit.lua, run by a real Lua 5.3 interpreter with a stub ``slurm`` table.

slurmctld provides the ``slurm`` table (constants, logging) to the script; the
stub below has the same names and values as Slurm 22.05's (NO_VAL, NO_VAL16,
NO_VAL64, JOB_SHARED_*, SUCCESS, ERROR, ESLURM_ACCESS_DENIED = 2002), so every branch is checked in
milliseconds. The same rules against real slurmctld are in
tests/test_slurm_integration.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

LUA = shutil.which("lua5.3") or shutil.which("lua")
SCRIPT = Path(__file__).resolve().parents[1] / "slurm_conf" / "job_submit.lua"

pytestmark = pytest.mark.skipif(LUA is None, reason="lua5.3 interpreter not installed")

STUB = r"""
slurm = {SUCCESS = 0, ERROR = -1, NO_VAL = 4294967294, NO_VAL16 = 65534, NO_VAL64 = 18446744073709551614,
         JOB_SHARED_NONE = 0, JOB_SHARED_OK = 1, JOB_SHARED_USER = 2, JOB_SHARED_MCS = 3, ESLURM_ACCESS_DENIED = 2002,
         log_info = function(...) end, log_user = function(fmt, ...) user_msg = string.format(fmt, ...) end}
dofile(SCRIPT)
local parts = {gpu = {flag_default = 1}, cpu = {flag_default = 0}}
local out = {}
for i, case in ipairs(CASES) do
  user_msg = nil
  local rc
  if case.kind == "submit" then
    rc = slurm_job_submit(case.desc, parts, case.uid)
    out[i] = {rc = rc, priority = case.desc.priority, admin_comment = case.desc.admin_comment, msg = user_msg}
  else
    rc = slurm_job_modify(case.desc, case.rec, parts, case.uid)
    out[i] = {rc = rc, msg = user_msg}
  end
end
-- minimal JSON writer (flat tables of numbers/strings)
local items = {}
for i, o in ipairs(out) do
  local f = {}
  for k, v in pairs(o) do
    if type(v) == "string" then v = string.format("%q", v) end
    f[#f + 1] = string.format("%q: %s", k, tostring(v))
  end
  items[#items + 1] = "{" .. table.concat(f, ", ") .. "}"
end
print("[" .. table.concat(items, ", ") .. "]")
"""


def _lua_value(v) -> str:
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_lua_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, str):
        return json.dumps(v)
    return str(v)


#: what job_submit.lua writes after its mark until the controller's first reason
WAITING = " | rlsched: waiting for the scheduler's next round"


def run_cases(cases: list[dict], managed_partition: str | None = None, capacity_file: str | None = None) -> list[dict]:
    src = SCRIPT.read_text()
    if managed_partition is not None:
        src = src.replace("local MANAGED_PARTITION = nil", f'local MANAGED_PARTITION = "{managed_partition}"')
    if capacity_file is not None:
        assert "local CAPACITY_FILE = nil" in src
        src = src.replace("local CAPACITY_FILE = nil", f"local CAPACITY_FILE = {json.dumps(capacity_file)}")
    fd, name = tempfile.mkstemp(suffix=".lua")
    tmp = Path(name)
    with os.fdopen(fd, "w") as f:
        f.write(src)
    try:
        prog = f"SCRIPT = {json.dumps(str(tmp))}\nCASES = {{{', '.join(_lua_value(c) for c in cases)}}}\n" + STUB
        p = subprocess.run([LUA, "-"], input=prog, capture_output=True, text=True, timeout=30, check=False)
    finally:
        tmp.unlink(missing_ok=True)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


NO_VAL = 4294967294
INFINITE = 4294967295


def test_submit_holds_gpu_jobs_of_the_managed_partition():
    r = run_cases([
        {"kind": "submit", "uid": 1001, "desc": {"tres_per_job": "gres:gpu:12", "priority": NO_VAL}},
        {"kind": "submit", "uid": 1001, "desc": {"tres_per_job": "gres/gpu:4", "partition": "gpu", "priority": NO_VAL}},
        {"kind": "submit", "uid": 1001, "desc": {"tres_per_job": "gres:gpu:a100:2,gres:nic:1", "priority": NO_VAL}},
        {"kind": "submit", "uid": 1001, "desc": {"priority": NO_VAL}},  # no GPUs: Slurm schedules it
        {"kind": "submit", "uid": 1001, "desc": {"tres_per_job": "gres:gpu:2", "partition": "cpu", "priority": NO_VAL}},
        {"kind": "submit", "uid": 1001, "desc": {"tres_per_node": "gres:gpu:2", "priority": NO_VAL}},
        # --gpus-per-task / --gpus-per-socket would escape the hold just as well: refused too
        {"kind": "submit", "uid": 1001, "desc": {"tres_per_task": "gres:gpu:1", "num_tasks": 8, "priority": NO_VAL}},
        {"kind": "submit", "uid": 1001, "desc": {"tres_per_socket": "gres:gpu:4", "priority": NO_VAL}},
        {"kind": "submit", "uid": 1001, "desc": {"tres_per_task": "gres:gpu:1", "partition": "cpu", "priority": NO_VAL}},
    ])
    assert [x["rc"] for x in r] == [0, 0, 0, 0, 0, -1, -1, -1, 0]
    assert "--gpus-per-task" in r[6]["msg"]
    assert [x["priority"] for x in r[:3]] == [0, 0, 0]
    assert [x["admin_comment"] for x in r[:3]] == [f"rlsched:managed gpus={n}{WAITING}" for n in (12, 4, 2)]
    assert r[3]["priority"] == NO_VAL and "admin_comment" not in r[3]
    assert r[4]["priority"] == NO_VAL  # other partition: untouched
    assert "--gpus=N" in r[5]["msg"]


def test_named_managed_partition():
    r = run_cases([
        {"kind": "submit", "uid": 5, "desc": {"tres_per_job": "gres:gpu:2", "priority": NO_VAL}},  # default = gpu
        {"kind": "submit", "uid": 5, "desc": {"tres_per_job": "gres:gpu:2", "partition": "cpu,gpu", "priority": NO_VAL}},
    ], managed_partition="gpu")
    assert [x["priority"] for x in r] == [0, 0]
    r = run_cases([{"kind": "submit", "uid": 5, "desc": {"tres_per_job": "gres:gpu:2", "priority": NO_VAL}}],
                  managed_partition="cpu")
    assert r[0]["priority"] == NO_VAL  # the default partition is not the managed one


def _modify(desc: dict, uid: int = 1001, state: int = 0, ac: str = "rlsched:managed gpus=4", **rec) -> dict:
    return {"kind": "modify", "uid": uid, "desc": desc,
            "rec": {"admin_comment": ac, "job_state": state, "job_id": 7, **rec}}


def test_modify_rules():
    untouched = {"priority": NO_VAL, "min_nodes": NO_VAL, "max_nodes": NO_VAL}
    cases = [
        _modify({**untouched, "priority": INFINITE}),  # scontrol release
        _modify({**untouched, "priority": 0}),  # scontrol hold
        _modify({**untouched, "req_nodes": "node2"}),
        _modify({**untouched, "min_nodes": 2}),
        _modify({**untouched, "tres_per_job": "gres:gpu:8"}),
        _modify({**untouched, "partition": "cpu"}),
        _modify({**untouched, "comment": "rlsched:model=GNN"}),  # harmless: allowed
        _modify({**untouched, "priority": INFINITE}, uid=0),  # root / the controller
        # guarded in every state: a requeued managed job is pending again with its old priority
        _modify({**untouched, "priority": INFINITE}, state=1),
        _modify({**untouched, "priority": INFINITE}, ac=""),  # not a managed job
    ]
    r = run_cases(cases)
    assert [x["rc"] for x in r] == [2002, 2002, 2002, 2002, 2002, 2002, 0, 0, 2002, 0]


def test_unmanaged_jobs_cannot_become_gpu_jobs_of_the_managed_partition():
    """A job the controller does not manage (no GPUs at submission, or another partition) must not gain
    GPUs in the managed partition by a later update: Slurm would start it unplaced."""
    untouched = {"priority": NO_VAL, "min_nodes": NO_VAL, "max_nodes": NO_VAL}
    cases = [
        _modify({**untouched, "tres_per_job": "gres:gpu:8"}, ac="", partition="gpu"),
        _modify({**untouched, "tres_per_node": "gres:gpu:2"}, ac="", partition="gpu"),
        _modify({**untouched, "tres_per_task": "gres:gpu:1"}, ac="", partition="gpu"),
        _modify({**untouched, "partition": "gpu"}, ac="", partition="cpu", tres_per_job="gres:gpu:2"),
        _modify({**untouched, "partition": "gpu"}, ac="", partition="cpu", tres_per_task="gres:gpu:1"),
        # a CPU job may not move in either: it may be --exclusive (all GPUs of its node), which job_rec
        # does not show in 22.05; nor may a job there gain GPUs in any state (Slurm refuses a running one too)
        _modify({**untouched, "partition": "gpu"}, ac="", partition="cpu"),
        _modify({**untouched, "tres_per_job": "gres:gpu:8"}, ac="", partition="gpu", state=1),
        # allowed: no GPUs involved, another partition, an admin
        _modify({**untouched, "tres_per_job": "gres:gpu:8"}, ac="", partition="cpu"),
        _modify({**untouched, "partition": "cpu"}, ac="", partition="gpu", tres_per_job="gres:gpu:2"),
        _modify({**untouched, "tres_per_job": "gres:gpu:8"}, ac="", partition="gpu", uid=0),
        _modify({**untouched, "partition": "gpu"}, ac="", partition="cpu", uid=0),
    ]
    r = run_cases(cases, managed_partition="gpu")
    assert [x["rc"] for x in r] == [2002] * 7 + [0] * 4


def test_gpu_requests_without_a_count_arrays_het_jobs_and_hold_are_refused():
    """--gres=gpu (no count: one GPU per node for Slurm) must not pass as "no GPUs" and run unplaced; a GPU
    job array or heterogeneous job would run several jobs on one placement (or never run); --hold could
    never be released by its owner. Checked against real slurmctld in tests/test_slurm_integration.py."""
    r = run_cases([
        {"kind": "submit", "uid": 1001, "desc": {"tres_per_node": "gres:gpu", "priority": NO_VAL}},
        {"kind": "submit", "uid": 1001, "desc": {"tres_per_node": "gres/gpu:a100", "priority": NO_VAL}},
        {"kind": "submit", "uid": 1001, "desc": {"tres_per_job": "gres:gpu:2", "array_inx": "0-3", "priority": NO_VAL,
                                                 "het_job_offset": NO_VAL}},
        {"kind": "submit", "uid": 1001, "desc": {"tres_per_job": "gres:gpu:1", "het_job_offset": 0, "priority": NO_VAL}},
        {"kind": "submit", "uid": 1001, "desc": {"tres_per_job": "gres:gpu:2", "het_job_offset": 1, "priority": NO_VAL}},
        {"kind": "submit", "uid": 1001, "desc": {"tres_per_job": "gres:gpu:1", "priority": 0, "het_job_offset": NO_VAL}},
        # still accepted: arrays, het jobs and holds without GPUs; a GPU job with none of them; "gpuX" is no GPU
        {"kind": "submit", "uid": 1001, "desc": {"array_inx": "0-3", "priority": 0, "het_job_offset": 0}},
        {"kind": "submit", "uid": 1001, "desc": {"tres_per_job": "gres:gpu:2", "array_inx": "", "priority": NO_VAL,
                                                 "het_job_offset": NO_VAL}},
        {"kind": "submit", "uid": 1001, "desc": {"tres_per_node": "gres:gpux:2", "priority": NO_VAL}},
        {"kind": "submit", "uid": 1001, "desc": {"tres_per_job": "gres:gpu:2", "array_inx": "0-3", "partition": "cpu",
                                                 "priority": NO_VAL}},
    ])
    assert [x["rc"] for x in r] == [-1] * 6 + [0] * 4, r
    assert "--gpus=N" in r[0]["msg"] and "--gpus=N" in r[1]["msg"]
    assert "job arrays of GPU jobs are not accepted" in r[2]["msg"]
    assert "heterogeneous GPU jobs are not accepted" in r[3]["msg"] and "heterogeneous" in r[4]["msg"]
    assert "--hold is not accepted" in r[5]["msg"] and "--begin" in r[5]["msg"]
    assert r[7]["priority"] == 0 and r[7]["admin_comment"] == "rlsched:managed gpus=2" + WAITING
    # a pending CPU job of the managed partition cannot be given GPUs with a count-less --gres=gpu either
    untouched = {"priority": NO_VAL, "min_nodes": NO_VAL, "max_nodes": NO_VAL}
    r = run_cases([_modify({**untouched, "tres_per_node": "gres:gpu"}, ac="", partition="gpu")], managed_partition="gpu")
    assert r[0]["rc"] == 2002


# ----------------------------------------------------------------------------- allowlist
NO_VAL16 = 65534
NO_VAL64 = 18446744073709551614.0  # as slurmctld 22.05 pushes it: a double (2^64)

# What slurmctld 22.05 passes job_modify for fields an `scontrol update` does not set (logged
# field by field from a real slurmctld: tests/test_slurm_integration.py checks the same rules
# there). Strings not set are nil; a cleared one (`ReqNodeList=`) is "".
UNCHANGED_22_05 = {
    "alloc_node": "localhost", "begin_time": 0, "bitflags": 503316480, "boards_per_node": 0,
    "contiguous": NO_VAL16, "cores_per_socket": NO_VAL16, "cpu_freq_min": NO_VAL, "cpu_freq_max": NO_VAL,
    "cpu_freq_gov": NO_VAL, "cpus_per_task": NO_VAL16, "delay_boot": NO_VAL, "end_time": 0, "group_id": NO_VAL,
    "immediate": 0, "mail_type": NO_VAL16, "max_cpus": NO_VAL, "max_nodes": NO_VAL, "min_cpus": NO_VAL,
    "min_nodes": NO_VAL, "nice": NO_VAL, "ntasks_per_board": 0, "ntasks_per_core": NO_VAL16,
    "ntasks_per_gpu": NO_VAL16, "ntasks_per_node": NO_VAL16, "ntasks_per_socket": NO_VAL16,
    "ntasks_per_tres": NO_VAL16, "num_tasks": NO_VAL, "het_job_offset": 0, "power_flags": 0,
    "pn_min_cpus": NO_VAL16, "pn_min_memory": NO_VAL64, "pn_min_tmp_disk": NO_VAL, "priority": NO_VAL,
    "reboot": NO_VAL16, "req_switch": NO_VAL, "requeue": NO_VAL16, "shared": NO_VAL16, "oversubscribe": NO_VAL16,
    "site_factor": NO_VAL, "sockets_per_board": 0, "sockets_per_node": NO_VAL16, "threads_per_core": NO_VAL16,
    "time_limit": NO_VAL, "time_min": NO_VAL, "user_id": 1001, "user_name": "rlschedtest", "wait4switch": NO_VAL,
}
NICE_OFFSET = 0x80000000
ALLOWED = {"comment", "name", "time_limit", "dependency", "mail_type", "mail_user"}


def _checked_fields() -> dict[str, str]:
    """MODIFY_FIELDS of job_submit.lua: field -> kind."""
    import re

    return dict(re.findall(r'\{ "(\w+)", "([snz])" \}', SCRIPT.read_text()))


def _upd(**fields) -> dict:
    return {**UNCHANGED_22_05, **fields}


def test_the_owner_may_change_only_allowlisted_fields_of_a_managed_job():
    """`scontrol update Nice=1` released a held managed job (22.05: priority = MAX(0 + old - new nice, 2)),
    and `ReqNodeList=` (cleared, ""), `ExcNodeList=`, `StartTime=now` re-pinned or freed a requeued one:
    whatever is not on the allowlist is refused, in every job state, cleared values included."""
    refused = [
        _upd(nice=NICE_OFFSET + 1),  # scontrol update Nice=1
        _upd(req_nodes=""),  # ReqNodeList= (clearing the controller's pin)
        _upd(req_nodes="node4"),
        _upd(exc_nodes="node1,node2,node3"),
        _upd(exc_nodes=""),
        _upd(begin_time=1795313323),  # StartTime=now / EligibleTime=now
        _upd(features="a"), _upd(features=""), _upd(prefer="a"),
        _upd(shared=0), _upd(shared=1),  # OverSubscribe=no / yes
        _upd(partition="gpu"), _upd(qos="normal"), _upd(account=""), _upd(reservation=""), _upd(wckey=""),
        _upd(licenses=""), _upd(contiguous=1), _upd(reboot=1), _upd(requeue=0), _upd(time_min=5),
        _upd(num_tasks=2), _upd(pn_min_cpus=2), _upd(min_mem_per_node=100, pn_min_memory=100), _upd(site_factor=5),
        _upd(tres_per_job=""), _upd(tres_per_node="gres:"),  # TresPerJob= / Gres=
        _upd(array_inx="%1"), _upd(min_nodes=2, max_nodes=2),
        _upd(comment="x", nice=NICE_OFFSET + 1),  # an allowed field does not carry a refused one
    ]
    allowed = [
        _upd(), _upd(comment="rlsched:model=GNN,samples=10"), _upd(comment=""), _upd(name="foo"), _upd(time_limit=10),
        _upd(dependency="afterok:1"), _upd(dependency=""), _upd(mail_type=2), _upd(mail_user="a@b"),
        _upd(comment="x", name="y", time_limit=5, dependency="singleton", mail_type=2, mail_user="a@b"),
    ]
    cases = [_modify(d) for d in refused] + [_modify(d) for d in allowed]
    cases += [_modify(_upd(nice=NICE_OFFSET + 1), state=1), _modify(_upd(req_nodes=""), state=3)]  # running, ...
    cases += [_modify(d, uid=0) for d in refused]  # root / the controller: anything
    r = run_cases(cases)
    n, a = len(refused), len(allowed)
    assert [x["rc"] for x in r[:n]] == [2002] * n, r[:n]
    assert [x["rc"] for x in r[n:n + a]] == [0] * a
    assert [x["rc"] for x in r[n + a:n + a + 2]] == [2002, 2002]
    assert [x["rc"] for x in r[n + a + 2:]] == [0] * n


def test_every_checked_field_outside_the_allowlist_is_refused():
    """The allowlist is complete: each field job_modify can see, set to anything but its unchanged value, is
    refused for a managed job unless it is one of the six harmless ones."""
    fields = _checked_fields()
    assert len(fields) > 80 and ALLOWED <= set(fields)
    for must in ("nice", "priority", "req_nodes", "exc_nodes", "begin_time", "features", "shared", "partition",
                 "min_nodes", "tres_per_job", "tres_per_node", "qos", "reservation", "account", "site_factor"):
        assert must in fields and must not in ALLOWED, must
    names = sorted(fields)
    values = {"s": ["x", ""], "n": [1, 0], "z": [1]}
    cases, expect = [], []
    for f in names:
        for v in values[fields[f]]:
            cases.append(_modify(_upd(**{f: v})))
            expect.append(0 if f in ALLOWED else 2002)
    # unchanged values never count: NO_VAL, NO_VAL16, NO_VAL64, and 0 for the "z" fields
    for f in names:
        for v in ({"n": [NO_VAL, NO_VAL16, NO_VAL64], "z": [0, NO_VAL], "s": []}[fields[f]]):
            cases.append(_modify(_upd(**{f: v})))
            expect.append(0)
    r = run_cases(cases)
    got = [x["rc"] for x in r]
    bad = [(c["desc"], e, g) for c, e, g in zip(cases, expect, got) if e != g]
    assert not bad, bad[:5]


def test_exclusive_and_gpu_sharing_and_user_pins_are_refused_at_submission():
    """--exclusive gives a CPU job all 8 GPUs of its node (and a --gpus=4 job 8): refused in the managed
    partition for every job (=user and =mcs too); mps/shard GRES likewise. A GPU job may not carry -w or
    --exclude: the controller chooses its nodes."""
    def sub(**desc):
        return {"kind": "submit", "uid": 1001, "desc": {"priority": NO_VAL, "shared": NO_VAL16, **desc}}
    r = run_cases([
        sub(shared=0), sub(shared=2), sub(shared=3), sub(shared=0, tres_per_job="gres:gpu:4"),  # --exclusive[=user|mcs]
        sub(shared=4),  # an exclusive kind newer than 22.05
        sub(tres_per_node="gres:mps:50"), sub(tres_per_node="gres/shard:2"),
        sub(tres_per_job="gres:gpu:2,gres:mps:10"),
        sub(tres_per_job="gres:gpu:4", req_nodes="node4"), sub(tres_per_job="gres:gpu:4", exc_nodes="node1,node2"),
        # accepted: unset / --oversubscribe; another partition; CPU jobs with a node list; an empty list
        sub(), sub(shared=1, tres_per_job="gres:gpu:2"), sub(shared=0, partition="cpu"),
        sub(shared=0, partition="cpu", tres_per_node="gres:mps:5"), sub(req_nodes="node4"), sub(exc_nodes="node1"),
        sub(tres_per_job="gres:gpu:2", req_nodes="", exc_nodes=""),
        {"kind": "submit", "uid": 1001, "desc": {"priority": NO_VAL, "tres_per_job": "gres:gpu:2"}},  # no shared field
    ])
    assert [x["rc"] for x in r] == [-1] * 10 + [0] * 8, r
    assert all("--exclusive is not accepted" in x["msg"] for x in r[:5])
    assert all("mps" in x["msg"] for x in r[5:8])
    assert "-w/--nodelist" in r[8]["msg"] and "--exclude" in r[9]["msg"]
    assert r[11]["priority"] == 0 and r[16]["priority"] == 0 and r[17]["priority"] == 0
    assert r[14]["priority"] == NO_VAL  # a CPU job with -w: Slurm's business


def test_unmanaged_jobs_cannot_become_exclusive_or_gain_gpu_sharing_in_the_managed_partition():
    cases = [
        _modify(_upd(shared=0), ac="", partition="gpu"),  # OverSubscribe=no: exclusive
        _modify(_upd(shared=1), ac="", partition="gpu"),
        _modify(_upd(tres_per_node="gres:mps:100"), ac="", partition="gpu"),
        _modify(_upd(partition="gpu"), ac="", partition="cpu"),
        # allowed: another partition, an admin, harmless changes, leaving the managed partition
        _modify(_upd(shared=0), ac="", partition="cpu"),
        _modify(_upd(shared=0), ac="", partition="gpu", uid=0),
        _modify(_upd(req_nodes="", exc_nodes="node1", nice=NICE_OFFSET + 5), ac="", partition="gpu"),
        _modify(_upd(partition="cpu"), ac="", partition="gpu"),
    ]
    r = run_cases(cases, managed_partition="gpu")
    assert [x["rc"] for x in r] == [2002] * 4 + [0] * 4


def _submit(gpus: int) -> dict:
    return {"kind": "submit", "uid": 1001, "desc": {"tres_per_job": f"gres:gpu:{gpus}", "priority": NO_VAL}}


def test_requests_larger_than_the_partition_are_refused_at_submission(tmp_path):
    """The controller's capacity file says how many GPUs the partition has; a larger --gpus is refused
    with the partition's size, one that fits is held as usual; without the file nothing is checked."""
    cap = tmp_path / "capacity"
    cap.write_text("# written by the rlsched controller\npartition=gpu\ngpus=32\nnodes=4\nmax_node_gpus=8\n")
    r = run_cases([_submit(64), _submit(32), _submit(33)], capacity_file=str(cap))
    assert r[0]["rc"] == -1 and r[2]["rc"] == -1
    assert r[0]["msg"] == ("rlsched: --gpus=64 is more than the 32 GPUs of partition gpu (4 nodes, at most 8 GPUs "
                           "each): the job could never start; ask for at most 32")
    assert r[1]["rc"] == 0 and r[1]["priority"] == 0 and r[1]["admin_comment"] == "rlsched:managed gpus=32" + WAITING
    # no file (the controller has not run yet), or one without a GPU count: held, not refused
    for f in (tmp_path / "missing", tmp_path / "empty"):
        if f.name == "empty":
            f.write_text("partition=gpu\n")
        r = run_cases([_submit(64)], capacity_file=str(f))
        assert r[0]["rc"] == 0 and r[0]["priority"] == 0, f


def test_refused_update_of_a_held_job_says_it_is_held():
    """Slurm 22.05 discards log_user() from job_modify, so the refusal's error code is what the user reads:
    ESLURM_JOB_HELD (2042, "Job is in held state, pending scheduler release") while the managed job is
    held, ESLURM_ACCESS_DENIED (2002) once it was released or runs; allowed fields pass either way. The
    reason goes to log_user() too, which Slurm 23.02 and later print to the caller."""
    untouched = {"priority": NO_VAL, "min_nodes": NO_VAL, "max_nodes": NO_VAL}
    release = {**untouched, "priority": INFINITE}
    r = run_cases([_modify(release, priority=0), _modify({**untouched, "nice": 1}, priority=0),
                   _modify(release, priority=1000, state=1), _modify({**untouched, "comment": "x"}, priority=0)])
    assert [x["rc"] for x in r] == [2042, 2042, 2002, 0]
    assert r[1]["msg"].startswith("rlsched: cannot change nice of managed job") and "its owner may change only" in r[1]["msg"]
    assert "priority" in r[0]["msg"] and "msg" not in r[3]
