"""controller.libslurm: the job_desc_msg_t, slurm_job_info_t and job_info_msg_t layouts against slurm.h, the
descriptors it writes, the job records it reads, and (``-m slurm``) a pin and its release in one update RPC and
one job's per-node GRES on real slurmctld 22.05."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from controller.libslurm import (INFINITE, JOB_INFO_LAYOUTS, JOB_INFO_MSG_LAYOUTS, LAYOUTS, JobDetail, LibSlurm,
                                 open_libslurm, pin_update)

HEADER = Path("/usr/include/slurm/slurm.h")


@pytest.mark.parametrize("struct,layouts", [("job_desc_msg_t", LAYOUTS), ("slurm_job_info_t", JOB_INFO_LAYOUTS),
                                            ("job_info_msg_t", JOB_INFO_MSG_LAYOUTS)])
def test_layout_matches_slurm_h(tmp_path, struct, layouts):
    """Every offset and the size of each layout for API 38 are those gcc computes from the installed slurm.h
    (22.05)."""
    gcc = shutil.which("gcc")
    if gcc is None or not HEADER.exists():
        pytest.skip("needs gcc and slurm/slurm.h (Debian: libslurm-dev)")
    version = (HEADER.parent / "slurm_version.h").read_text()
    if "SLURM_VERSION_NUMBER 0x1605" not in version:
        pytest.skip("slurm.h is not Slurm 22.05's")
    size, fields = layouts[38]
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include <slurm/slurm.h>', 'int main(void) {',
             f'printf("size %zu\\n", sizeof({struct}));']
    lines += [f'printf("{f} %zu %zu\\n", offsetof({struct}, {f}), sizeof((({struct}*)0)->{f}));' for f in fields]
    lines += ["return 0; }"]
    (tmp_path / "off.c").write_text("\n".join(lines) + "\n")
    subprocess.run([gcc, str(tmp_path / "off.c"), "-o", str(tmp_path / "off")], check=True, capture_output=True)
    out = dict((ln.split(" ", 1) for ln in subprocess.run([str(tmp_path / "off")], capture_output=True, text=True,
                                                           check=True).stdout.splitlines()))
    assert int(out.pop("size")) == size
    widths = {"str": 8, "strv": 8, "ptr": 8, "u32": 4, "u16": 2, "time": 8}
    got = {f: tuple(int(x) for x in v.split()) for f, v in out.items()}
    assert got == {f: (off, widths[kind]) for f, (off, kind) in fields.items()}


class _Fn:
    """A stand-in for a ctypes function: callable, takes argtypes / restype."""

    def __init__(self, f):
        self.f = f

    def __call__(self, *a):
        return self.f(*a)


def _fake_lib(sent: list):
    def init(buf):
        ctypes.memset(buf, 0xFF, LAYOUTS[38][0])  # Slurm's "not set" values are all-ones patterns

    def update(buf):
        sent.append(bytes(buf))
        return 0

    return SimpleNamespace(slurm_init_job_desc_msg=_Fn(init), slurm_update_job=_Fn(update),
                           slurm_get_errno=_Fn(lambda: 0), slurm_strerror=_Fn(lambda e: b"No error"),
                           slurm_submit_batch_job=_Fn(lambda *a: -1),
                           slurm_free_submit_response_response_msg=_Fn(lambda *a: None),
                           slurm_load_job=_Fn(lambda *a: -1), slurm_free_job_info_msg=_Fn(lambda *a: None))


def _read(raw: bytes, field: str):
    off, kind = LAYOUTS[38][1][field]
    if kind == "u32":
        return int.from_bytes(raw[off:off + 4], "little")
    if kind == "time":
        return int.from_bytes(raw[off:off + 8], "little", signed=True)
    ptr = int.from_bytes(raw[off:off + 8], "little")
    return None if ptr == 2 ** 64 - 1 else ctypes.string_at(ptr).decode()


def test_a_pin_with_its_release_is_one_update_with_the_fields_scontrol_sets():
    sent: list[bytes] = []
    lib = LibSlurm(_fake_lib(sent), 38 << 16, "/etc/slurm/slurm.conf")
    keep = []
    for up in (pin_update(7, "node[1-2]", 2, 8, 4, "gres:gpu", 0, release=True, now=1000),
               pin_update(9, "node3,node5", 2, 5, None, "gres:gpu:a100", 5, release=False, now=1000)):
        # the strings must outlive the call to be read back here: hold the descriptor's own copies
        buf, k = lib._desc({**up.fields, "job_id": up.job_id})
        keep.append(k)
        sent.append(bytes(buf))
    a, b = sent
    assert (_read(a, "job_id"), _read(a, "req_nodes"), _read(a, "min_nodes"), _read(a, "max_nodes")) == \
        (7, "node[1-2]", 2, 0xFFFFFFFF)  # the maximum is left unset, as scontrol's NumNodes= leaves it
    assert (_read(a, "tres_per_job"), _read(a, "tres_per_node"), _read(a, "begin_time"), _read(a, "priority")) == \
        ("", "gres:gpu:4", 1000, INFINITE)
    assert (_read(b, "tres_per_node"), _read(b, "tres_per_job"), _read(b, "begin_time")) == ("", "gres:gpu:a100:5", 1005)
    assert _read(b, "priority") == 0xFFFFFFFF and _read(b, "comment") is None  # left as Slurm's "not set"
    with pytest.raises(ValueError, match="no job_desc_msg_t field"):
        lib._desc({"nice": 5})


def test_no_libslurm_without_a_slurm_conf_file(tmp_path):
    assert open_libslurm(str(tmp_path / "missing.conf")) is None


def _job_records(*jobs: dict) -> tuple[ctypes.Array, list]:
    """A job_info_msg_t holding ``jobs`` (field -> value of slurm_job_info_t), laid out as LAYOUTS say; the list
    keeps the memory it points to alive."""
    size, f = JOB_INFO_LAYOUTS[38]
    msize, m = JOB_INFO_MSG_LAYOUTS[38]
    msg, array = ctypes.create_string_buffer(msize), ctypes.create_string_buffer(size * len(jobs))
    keep: list = [array]
    ctypes.c_uint32.from_buffer(msg, m["record_count"][0]).value = len(jobs)
    ctypes.c_void_p.from_buffer(msg, m["job_array"][0]).value = ctypes.addressof(array)
    for k, job in enumerate(jobs):
        base = k * size
        for name, value in job.items():
            off, kind = f[name]
            if kind == "str":
                b = ctypes.create_string_buffer(value.encode())
                keep.append(b)
                ctypes.c_void_p.from_buffer(array, base + off).value = ctypes.addressof(b)
            elif kind == "strv":
                items = [ctypes.create_string_buffer(v.encode()) for v in value]
                arr = (ctypes.c_void_p * len(items))(*[ctypes.addressof(x) for x in items])
                keep += [items, arr]
                ctypes.c_void_p.from_buffer(array, base + off).value = ctypes.addressof(arr)
            else:
                (ctypes.c_uint16 if kind == "u16" else ctypes.c_uint32).from_buffer(array, base + off).value = value
    return msg, keep


def test_job_detail_reads_the_record_of_the_job_asked_for():
    msg, keep = _job_records(
        {"job_id": 8, "job_state": 1, "nodes": "node[1-2]", "restart_cnt": 0, "gres_detail_cnt": 0},
        {"job_id": 9, "job_state": 1 | 0x8000, "nodes": "node[3-4]", "restart_cnt": 2, "gres_detail_cnt": 2,
         "gres_detail_str": ["gpu:8(IDX:0-7)", "gpu:2(IDX:0-1)"]})
    asked, freed = [], []

    def load(resp, job_id, flags):
        asked.append((job_id, flags))
        if job_id == 5:
            return -1
        resp._obj.value = ctypes.addressof(msg)
        return 0

    fake = _fake_lib([])
    fake.slurm_load_job, fake.slurm_free_job_info_msg = _Fn(load), _Fn(lambda p: freed.append(p))
    fake.slurm_get_errno = _Fn(lambda: 2017)  # ESLURM_INVALID_JOB_ID: slurmctld no longer has the job
    lib = LibSlurm(fake, 38 << 16, "/etc/slurm/slurm.conf")
    assert lib.job_detail(9) == JobDetail(9, "RUNNING", "node[3-4]", 2, ("gpu:8(IDX:0-7)", "gpu:2(IDX:0-1)"))
    assert lib.job_detail(8) == JobDetail(8, "RUNNING", "node[1-2]", 0, ())
    assert lib.job_detail(5) is None
    assert asked == [(9, 2), (8, 2), (5, 2)] and len(freed) == 2  # SHOW_DETAIL; each answer freed
    del keep


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_pin_and_release_in_one_rpc_on_slurm(live_cluster, test_user):
    """slurmctld 22.05 takes a pin and its release in one update from libslurm; a refused pin leaves the job
    held (nothing of the release applied), and the owner still cannot release it."""
    from controller.slurm import SlurmCLI

    cluster = live_cluster
    slurm = SlurmCLI(cluster.conf, libslurm=True)
    if slurm.pin_release_many([]) is None:
        pytest.skip("libslurm.so.38 not usable in this process (another slurm.conf was opened first)")
    a = cluster.sbatch("sleep 3", 5, comment="rlsched:model=GNN", user=test_user)
    b = cluster.sbatch("sleep 3", 4, comment="rlsched:model=GNN", user=test_user)
    res = slurm.pin_release_many([(a, ["node2", "node3"], 5, None, "gres:gpu", 0),
                                  (b, ["node1", "nodeX"], 4, 2, "gres:gpu", 0)])
    assert res[0] is None and res[1] is not None and "Invalid node name" in str(res[1]) and not res[1].timed_out
    cluster.wait(lambda: cluster.job(a).state in ("RUNNING", "COMPLETED"), 20, "job a to start")
    ja = cluster.job(a)
    if ja.state == "RUNNING":
        assert ja.gpus_per_node == {"node2": 4, "node3": 1}  # one GPU each, then node order
        # the same split read for this job alone (the queue read's way to a job that started unevenly)
        lib = slurm._libslurm()
        d = lib.job_detail(a)
        assert d is not None and d.state == "RUNNING" and d.nodes == "node[2-3]" and d.restarts == 0
        assert [x.split("(")[0] for x in d.gres_detail] == ["gpu:4", "gpu:1"]
        assert lib.job_detail(10 ** 8) is None  # no such job
    jb = cluster.job(b)
    assert jb.held and jb.required_nodes != ["node1", "nodeX"]
    p = cluster.run(["scontrol", "release", str(b)], user=test_user, check=False)
    assert p.returncode != 0 and cluster.job(b).held
