"""controller.slurm: parsing of real Slurm outputs and the command runner's errors.

The fixtures under tests/data/slurm/ were captured from Slurm 22.05.8 (Debian
12) running the 4 x 8-GPU cluster of scripts/local-cluster.sh: two running
jobs (12 GPUs on node[1-2] split 8+4, 4 GPUs on node4 after a requeue), two
held ones, and later finished / SPECIAL_EXIT (exit 75 + RequeueExitHold) jobs.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from controller.slurm import (
    SlurmCLI,
    SlurmError,
    expand_hostlist,
    gpu_type_from_tres,
    gpus_from_tres,
    managed_gpus,
    parse_gres_count,
    parse_gres_type,
    parse_sinfo_json,
    parse_squeue_json,
    per_gpu_from_tres,
)

DATA = Path(__file__).parent / "data" / "slurm"


def _read(name: str) -> str:
    return (DATA / name).read_text()


def test_squeue_json_running_and_held_jobs():
    jobs = {j.job_id: j for j in parse_squeue_json(_read("squeue_22.05.json"))}
    assert sorted(jobs) == [1, 2, 3, 4]
    j1 = jobs[1]
    assert j1.state == "RUNNING" and j1.running and not j1.held
    assert j1.nodes == ["node1", "node2"]
    assert j1.gpus == 12
    assert j1.gpus_per_node == {"node1": 8, "node2": 4}  # from gres_detail, in node order
    assert j1.required_nodes == ["node1", "node2"] and j1.num_nodes == 2
    assert j1.managed and j1.comment == "rlsched:model=MoE,samples=1000"
    assert j1.time_limit_s is None  # UNLIMITED
    assert j1.start_time and j1.submit_time and j1.start_time >= j1.submit_time
    assert jobs[2].restarts == 1 and jobs[2].gpus_per_node == {"node4": 4}
    j3 = jobs[3]
    assert j3.held and j3.pending and j3.priority == 0 and j3.reason == "JobHeldUser"
    assert j3.gpus == 16 and j3.nodes == [] and j3.time_limit_s == 30 * 60
    assert jobs[4].comment == ""


def test_squeue_json_finished_and_special_exit():
    jobs = {j.job_id: j for j in parse_squeue_json(_read("squeue_finished_special_exit_22.05.json"))}
    assert jobs[1].state == "COMPLETED" and not jobs[1].running and not jobs[1].pending
    assert jobs[3].state == "CANCELLED" and not jobs[3].held
    # exit 75 with RequeueExitHold=75: SPECIAL_EXIT, held, waits in the queue
    j17 = jobs[17]
    assert j17.state == "SPECIAL_EXIT" and j17.pending and j17.held and j17.restarts == 1


def test_sinfo_json_nodes():
    nodes = {n.name: n for n in parse_sinfo_json(_read("sinfo_22.05.json"))}
    assert sorted(nodes) == ["node1", "node2", "node3", "node4"]
    assert all(n.gpus == 8 for n in nodes.values())
    assert (nodes["node1"].gpus_used, nodes["node2"].gpus_used, nodes["node3"].gpus_used, nodes["node4"].gpus_used) == (8, 4, 0, 4)
    assert nodes["node3"].state == "idle" and nodes["node1"].state == "mixed"
    assert all(n.usable for n in nodes.values())
    assert nodes["node1"].partitions == ("gpu",)


def test_job_is_read_from_squeue_json_so_a_comment_cannot_forge_fields(tmp_path):
    """SlurmCLI.job() reads squeue --json: a user's comment or job name holding " JobState=PENDING
    Priority=0 NodeList=node9" stays text (scontrol's Key=Value lines could not be parsed safely)."""
    doc = json.loads(_read("squeue_22.05.json"))
    forged = " JobState=PENDING Priority=0 NodeList=node9 AdminComment=x"
    doc["jobs"][0]["comment"] = "rlsched:model=MoE" + forged
    doc["jobs"][0]["name"] = "train" + forged
    (tmp_path / "q.json").write_text(json.dumps(doc))
    d = _fake_bin(tmp_path, "squeue", f'cat "{tmp_path / "q.json"}"')
    cli = SlurmCLI(bin_dir=str(d))
    j = cli.job(1)
    assert (j.state, j.priority, j.nodes, j.managed) == ("RUNNING", 4294901759, ["node1", "node2"], True)
    assert j.comment.endswith(forged) and j.name.endswith(forged)
    assert cli.job(999) is None


def test_sinfo_json_24_groups_nodes_by_partition():
    """Slurm 24.x: {"sinfo": [...]} entries per partition and state; nodes.nodes lists every host; a node
    in two partitions keeps both."""

    def entry(part, names, state, used="gpu:0"):
        return {"node": {"state": state}, "nodes": {"nodes": names, "total": len(names)},
                "gres": {"total": "gpu:8", "used": used}, "partition": {"name": part}}

    doc = {"sinfo": [entry("debug", ["node1", "node2"], ["IDLE"]),
                     entry("gpu", ["node1", "node2", "node3"], ["IDLE"]),
                     entry("gpu", ["node[4-5]"], ["MIXED", "DRAIN"], "gpu:3")], "errors": []}
    nodes = {n.name: n for n in parse_sinfo_json(json.dumps(doc))}
    assert sorted(nodes) == ["node1", "node2", "node3", "node4", "node5"]
    assert nodes["node1"].partitions == ("debug", "gpu") and nodes["node3"].partitions == ("gpu",)
    assert nodes["node4"].gpus_used == 3 and nodes["node4"].state == "mixed" and not nodes["node4"].usable


def test_newer_json_encodings_are_unwrapped():
    """23.x+ (OpenAPI v0.0.39+): numbers as {set, infinite, number}, states as lists."""
    doc = json.loads(_read("squeue_22.05.json"))
    j = doc["jobs"][2]  # held 16-GPU job
    j["priority"] = {"set": True, "infinite": False, "number": 0}
    j["time_limit"] = {"set": True, "infinite": False, "number": 30}
    j["job_state"] = ["PENDING"]
    j["submit_time"] = {"set": True, "infinite": False, "number": 1795239451}
    j["tres_per_job"] = "gres/gpu:16"
    r = doc["jobs"][0]
    r["job_state"] = ["RUNNING"]
    r["time_limit"] = {"set": False, "infinite": True, "number": 0}
    jobs = {x.job_id: x for x in parse_squeue_json(json.dumps(doc))}
    assert jobs[3].held and jobs[3].gpus == 16 and jobs[3].time_limit_s == 1800 and jobs[3].submit_time == 1795239451
    assert jobs[1].running and jobs[1].time_limit_s is None
    sdoc = json.loads(_read("sinfo_22.05.json"))
    sdoc["nodes"][0]["state"] = ["IDLE", "DRAIN"]
    n = parse_sinfo_json(json.dumps(sdoc))[0]
    assert n.state == "idle" and not n.usable


@pytest.mark.parametrize(
    "expr,expected",
    [
        ("node[1-3,5]", ["node1", "node2", "node3", "node5"]),
        ("node1,gpu[01-02]", ["node1", "gpu01", "gpu02"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("", []),
        ("(null)", []),
    ],
)
def test_expand_hostlist(expr, expected):
    assert expand_hostlist(expr) == expected


def test_tres_and_gres_counts():
    assert gpus_from_tres("gres:gpu:12") == 12
    assert gpus_from_tres("gres/gpu:4") == 4
    assert gpus_from_tres("gres:gpu:a100:2,gres:mps:100") == 2
    assert gpus_from_tres("") == 0 and gpus_from_tres(None) == 0
    assert parse_gres_count("gpu:8(IDX:0-7)") == 8
    assert parse_gres_count("gpu:a100:4(S:0-1),mps:200") == 4
    assert parse_gres_count("(null)") == 0


@pytest.mark.parametrize(
    "gres, gpu_type",
    [
        ("gpu:v100:8(S:0-1)", "v100"),
        ("gpu:a100:4(IDX:0-3),mps:100", "a100"),
        ("tmpsize:7T,gpu:l40s:4(S:0-1)", "l40s"),
        ("gpu:8(S:0)", None),  # no type
        ("gpu:v100:4,gpu:k80:4", None),  # two types on one node: no single type
        ("mps:100", None),
        ("", None),
        (None, None),
    ],
)
def test_gres_type(gres, gpu_type):
    assert parse_gres_type(gres) == gpu_type


def test_sinfo_json_keeps_gres_type_cpus_and_memory():
    """22.05 node records: the GRES type (gpu:v100:8 -> v100), cpus and real_memory (MB -> GB of 1024 MB);
    RealMemory left at Slurm's default of 1 MB is no memory figure."""
    doc = json.loads(_read("sinfo_22.05.json"))
    doc["nodes"][0]["gres"] = "gpu:v100:8(S:0-1)"
    doc["nodes"][1]["gres"] = "gpu:k80:8(S:0)"
    doc["nodes"][2]["real_memory"] = 1
    doc["nodes"][3]["cpus"] = {"set": True, "infinite": False, "number": 48}  # 23.x+ encoding
    nodes = {n.name: n for n in parse_sinfo_json(json.dumps(doc))}
    n1, n2, n3, n4 = (nodes[f"node{i}"] for i in range(1, 5))
    assert (n1.gpu_type, n1.gpus, n1.cpus, n1.mem_gb) == ("v100", 8, 32, 64000 / 1024)
    assert (n2.gpu_type, n2.gpus) == ("k80", 8)
    assert n3.gpu_type is None and n3.mem_gb is None and n3.cpus == 32
    assert n4.cpus == 48


def test_sinfo_json_24_keeps_gres_type_cpus_and_memory():
    """24.x partition/state groups: cpus.minimum and memory.minimum (MB) per node, the GRES type of gres.total."""
    doc = {"sinfo": [
        {"node": {"state": ["IDLE"]}, "nodes": {"nodes": ["fast[1-2]"]}, "partition": {"name": "gpu"},
         "gres": {"total": "gpu:v100:8(S:0-1)", "used": "gpu:v100:0"},
         "cpus": {"minimum": 64, "maximum": 64, "total": 128}, "memory": {"minimum": 524288, "maximum": 524288}},
        {"node": {"state": ["IDLE"]}, "nodes": {"nodes": ["slow1"]}, "partition": {"name": "gpu"},
         "gres": {"total": "gpu:8", "used": "gpu:0"}},
    ], "errors": []}
    nodes = {n.name: n for n in parse_sinfo_json(json.dumps(doc))}
    assert (nodes["fast2"].gpu_type, nodes["fast2"].cpus, nodes["fast2"].mem_gb) == ("v100", 64, 512.0)
    assert (nodes["slow1"].gpu_type, nodes["slow1"].cpus, nodes["slow1"].mem_gb) == (None, None, None)


def test_bad_outputs_are_value_errors():
    with pytest.raises(ValueError, match="not JSON"):
        parse_squeue_json("squeue: error: slurm_load_jobs")
    with pytest.raises(ValueError, match="no 'jobs'"):
        parse_squeue_json("{}")
    with pytest.raises(ValueError, match="reported errors"):
        parse_sinfo_json('{"errors": [{"error": "Unable to contact slurm controller"}], "nodes": []}')


# ----------------------------------------------------------------- the runner
def _fake_bin(tmp_path: Path, name: str, body: str) -> Path:
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    f = d / name
    f.write_text("#!/bin/sh\n" + body + "\n")
    f.chmod(f.stat().st_mode | stat.S_IEXEC)
    return d


def test_runner_failure_and_timeout_raise_slurm_error(tmp_path):
    d = _fake_bin(tmp_path, "squeue", "echo 'squeue: error: Unable to contact slurm controller' >&2; exit 1")
    _fake_bin(tmp_path, "sinfo", "sleep 5")
    _fake_bin(tmp_path, "scontrol", "echo not-json")
    cli = SlurmCLI(timeout_s=0.5, bin_dir=str(d))
    with pytest.raises(SlurmError, match="exit status 1: squeue: error: Unable to contact slurm controller"):
        cli.jobs()
    with pytest.raises(SlurmError, match=r"timed out after 0.5 s"):
        cli.nodes()
    with pytest.raises(SlurmError, match="cannot run"):
        SlurmCLI(bin_dir=str(tmp_path / "nowhere")).jobs()


def test_runner_passes_slurm_conf(tmp_path):
    d = _fake_bin(tmp_path, "squeue", 'printf \'{"jobs": [], "conf": "%s"}\' "$SLURM_CONF"')
    cli = SlurmCLI(conf="/some/slurm.conf", bin_dir=str(d))
    assert json.loads(cli.run(["squeue", "--json"]))["conf"] == "/some/slurm.conf"
    assert cli.jobs() == []
    assert os.environ.get("SLURM_CONF") != "/some/slurm.conf"


def test_managed_demand_survives_tres_rewrites():
    """After a balanced placement the job has TresPerNode=gres:gpu:6 and no TresPerJob: the demand stays 12."""
    doc = json.loads(_read("squeue_22.05.json"))
    j = doc["jobs"][0]
    j["tres_per_job"], j["tres_per_node"] = "", "gres:gpu:6"
    j["job_state"], j["priority"], j["nodes"], j["gres_detail"] = "PENDING", 0, "", []
    (job,) = [x for x in parse_squeue_json(json.dumps(doc)) if x.job_id == 1]
    assert job.gpus == 12 and job.held and job.tres_style == "gres:gpu"
    assert managed_gpus("rlsched:managed gpus=16") == 16 and managed_gpus("other") is None


def test_place_expresses_balanced_and_total_requests(tmp_path):
    d = _fake_bin(tmp_path, "scontrol", 'echo "$@" >> "$(dirname "$0")/calls"')
    cli = SlurmCLI(bin_dir=str(d))
    cli.place(7, ["node3", "node4"], 12, per_node=6)
    cli.place(8, ["node1", "node2"], 12)
    cli.place(9, ["n1"], 4, tres_style="gres/gpu")
    cli.release(9, delay_s=5)
    cli.release(8)
    calls = (d / "calls").read_text().splitlines()
    # the pin sets StartTime=now; a release with a settle delay moves it first, one without needs no update
    assert calls == [
        "update JobId=7 ReqNodeList=node3,node4 NumNodes=2 TresPerJob= TresPerNode=gres:gpu:6 StartTime=now",
        "update JobId=8 ReqNodeList=node1,node2 NumNodes=2 TresPerNode= TresPerJob=gres:gpu:12 StartTime=now",
        "update JobId=9 ReqNodeList=n1 NumNodes=1 TresPerNode= TresPerJob=gres/gpu:4 StartTime=now",
        "update JobId=9 StartTime=now+5",
        "release 9",
        "release 8",
    ]
    with pytest.raises(ValueError, match="is not 12"):
        cli.place(7, ["a", "b"], 12, per_node=5)


def test_squeue_json_reads_requested_gpu_type_cpus_and_memory_per_gpu():
    """Recorded on the test cluster (slurmctld 22.05.8): job 1 held, submitted with --gpus=4 --cpus-per-gpu=3
    --mem-per-gpu=2G (``cpus_per_tres`` ``gres:gpu:3``, ``memory_per_tres`` ``gres:gpu:2048``); job 2 with
    --gpus=2 --cpus-per-gpu=5 --mem-per-gpu=1500M, running after a balanced pin (TresPerNode, no TresPerJob).
    Its nodes have untyped GPUs, so the typed request is the same JSON with ``tres_per_job`` as 22.05 writes
    ``--gpus=v100:4``."""
    doc = json.loads(_read("squeue_demand_22.05.json"))
    jobs = {j.job_id: j for j in parse_squeue_json(json.dumps(doc))}
    a, b = jobs[1], jobs[2]
    assert (a.gpus, a.gpu_type, a.cpus_per_gpu, a.mem_gb_per_gpu) == (4, None, 3, 2.0) and a.held
    assert (b.gpus, b.gpu_type, b.cpus_per_gpu, b.mem_gb_per_gpu) == (2, None, 5, 1500 / 1024) and b.running
    doc["jobs"][0]["tres_per_job"] = "gres:gpu:v100:4"
    doc["jobs"][1]["tres_per_node"] = "gres:gpu:k80:1"
    jobs = {j.job_id: j for j in parse_squeue_json(json.dumps(doc))}
    assert jobs[1].gpu_type == "v100" and jobs[1].gpus == 4 and jobs[1].pin_tres == "gres:gpu:v100"
    assert jobs[2].gpu_type == "k80" and jobs[2].gpus == 2 and jobs[2].pin_tres == "gres:gpu:k80"
    # a job that asks for none of them (the older recording)
    plain = parse_squeue_json(_read("squeue_22.05.json"))
    assert all((j.gpu_type, j.cpus_per_gpu, j.mem_gb_per_gpu) == (None, 0, 0.0) for j in plain)
    assert all(j.pin_tres == j.tres_style for j in plain)


@pytest.mark.parametrize(
    "tres, gpu_type",
    [
        ("gres:gpu:v100:4", "v100"),
        ("gres/gpu:a100:2", "a100"),
        ("gres/gpu:a100=2", "a100"),
        ("gres:gpu:tesla_k80", "tesla_k80"),  # a type without a count is one GPU
        ("gres:gpu:4", None),
        ("gres:gpu", None),
        ("gres:gpu:v100:2,gres:gpu:k80:2", None),  # several types: no single one
        ("gres:gpu:v100:2,gres:mps:100", "v100"),
        ("gres:mps:100", None),
        ("", None),
        (None, None),
    ],
)
def test_gpu_type_from_tres(tres, gpu_type):
    assert gpu_type_from_tres(tres) == gpu_type


def test_per_gpu_amounts_from_tres():
    assert per_gpu_from_tres("gres:gpu:3") == 3 and per_gpu_from_tres("gres:gpu:2048") == 2048
    assert per_gpu_from_tres("gres/gpu:5") == 5 and per_gpu_from_tres("gres:gpu:v100:6") == 6
    assert per_gpu_from_tres("gres:mps:100") == 0 and per_gpu_from_tres("") == 0 and per_gpu_from_tres(None) == 0


def test_pins_keep_the_requested_gpu_type(tmp_path):
    d = _fake_bin(tmp_path, "scontrol", 'echo "$@" >> "$(dirname "$0")/calls"')
    cli = SlurmCLI(bin_dir=str(d))
    cli.place(7, ["node3", "node4"], 8, per_node=4, tres_style="gres:gpu:v100")
    cli.place(8, ["node1"], 2, tres_style="gres:gpu:v100")
    assert (d / "calls").read_text().splitlines() == [
        "update JobId=7 ReqNodeList=node3,node4 NumNodes=2 TresPerJob= TresPerNode=gres:gpu:v100:4 StartTime=now",
        "update JobId=8 ReqNodeList=node1 NumNodes=1 TresPerNode= TresPerJob=gres:gpu:v100:2 StartTime=now",
    ]


def test_queue_reads_json_from_then_on_when_the_text_listing_is_not_as_asked(tmp_path):
    """A squeue that answers ``-O`` with something other than the rows asked for (here: JSON, as a wrapper
    might) makes SlurmCLI.queue() read ``squeue --json`` at once and from then on, as nodes() does for sinfo,
    instead of failing the round."""
    (tmp_path / "q.json").write_text(_read("squeue_22.05.json"))
    log = tmp_path / "calls"
    d = _fake_bin(tmp_path, "squeue", f'echo "$*" >> "{log}"; cat "{tmp_path / "q.json"}"')
    cli = SlurmCLI(bin_dir=str(d))
    want = sorted(j.job_id for j in cli.jobs())
    assert want and [j.job_id for j in cli.queue()] and sorted(j.job_id for j in cli.queue()) == want
    calls = log.read_text().splitlines()
    # jobs(); queue() #1: the JSON read (nothing known yet); queue() #2: -O tried once, then JSON
    assert [c.startswith("--json") for c in calls] == [True, True, False, True]
    assert sorted(j.job_id for j in cli.queue()) == want
    assert log.read_text().splitlines()[4:] == ["--json"]  # no -O attempt any more
