"""slurm_conf/job_submit.lua, run by a real Lua 5.3 interpreter with a stub ``slurm`` table.

slurmctld provides the ``slurm`` table (constants, logging) to the script; the
stub below has the same names and values as Slurm 22.05's (NO_VAL, SUCCESS,
ERROR, ESLURM_ACCESS_DENIED = 2002), so every branch is checked in
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
slurm = {SUCCESS = 0, ERROR = -1, NO_VAL = 4294967294, NO_VAL16 = 65534, ESLURM_ACCESS_DENIED = 2002,
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
    out[i] = {rc = rc}
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


def run_cases(cases: list[dict], managed_partition: str | None = None) -> list[dict]:
    src = SCRIPT.read_text()
    if managed_partition is not None:
        src = src.replace("local MANAGED_PARTITION = nil", f'local MANAGED_PARTITION = "{managed_partition}"')
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
        {"kind": "submit", "uid": 1001, "desc": {"tres_per_job": "gres:gpu:a100:2,gres:mps:10", "priority": NO_VAL}},
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
    assert [x["admin_comment"] for x in r[:3]] == ["rlsched:managed gpus=12", "rlsched:managed gpus=4", "rlsched:managed gpus=2"]
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
        _modify({**untouched, "priority": INFINITE}, state=1),  # running: not ours to guard
        _modify({**untouched, "priority": INFINITE}, ac=""),  # not a managed job
    ]
    r = run_cases(cases)
    assert [x["rc"] for x in r] == [2002, 2002, 2002, 2002, 2002, 2002, 0, 0, 0, 0]


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
        # allowed: no GPUs involved, another partition, an admin, a running job
        _modify({**untouched, "partition": "gpu"}, ac="", partition="cpu"),
        _modify({**untouched, "tres_per_job": "gres:gpu:8"}, ac="", partition="cpu"),
        _modify({**untouched, "partition": "cpu"}, ac="", partition="gpu", tres_per_job="gres:gpu:2"),
        _modify({**untouched, "tres_per_job": "gres:gpu:8"}, ac="", partition="gpu", uid=0),
        _modify({**untouched, "tres_per_job": "gres:gpu:8"}, ac="", partition="gpu", state=1),
    ]
    r = run_cases(cases, managed_partition="gpu")
    assert [x["rc"] for x in r] == [2002] * 5 + [0] * 5


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
    assert r[7]["priority"] == 0 and r[7]["admin_comment"] == "rlsched:managed gpus=2"
    # a pending CPU job of the managed partition cannot be given GPUs with a count-less --gres=gpu either
    untouched = {"priority": NO_VAL, "min_nodes": NO_VAL, "max_nodes": NO_VAL}
    r = run_cases([_modify({**untouched, "tres_per_node": "gres:gpu"}, ac="", partition="gpu")], managed_partition="gpu")
    assert r[0]["rc"] == 2002
