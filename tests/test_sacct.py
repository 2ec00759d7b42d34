"""``rlsched trace from-sacct`` (trainer/sacct.py, trainer/cli_trace.py): Slurm accounting history -> a trace.

The fixtures in tests/data/sacct/ are one history written in the three formats the reader takes:
``sacct --json`` of Slurm 22.05 (openapi/dbv0.0.38) and of 23.11 (data_parser/v0.0.40), and
``sacct -P`` with its header. Their layouts follow Slurm's own source, cited in
tests/data/sacct/README.md (SchedMD/slurm: src/plugins/openapi/dbv0.0.38/parse.c at slurm-22-05-8-1,
src/plugins/data_parser/v0.0.40/parsers.c at slurm-23-11-10-1, src/sacct/print.c and
src/common/parse_time.c), which also lists what each job record is there for.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from policies.cluster import ClusterSpec
from policies.perf import ContentionModel
from policies.workloads import MODELS, UnknownModelError
from rlsched.cli import main
from trainer import sacct as sacct_mod
from trainer.generate import parse_mix
from trainer.philly import draw_models
from trainer.sacct import SacctError, read_sacct
from trainer.traces import load_trace

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "sacct"
JSON_22 = DATA / "sacct_22.05.json"
JSON_23 = DATA / "sacct_23.11.json"
PARSABLE = DATA / "sacct_P.txt"
CLUSTER = ClusterSpec.homogeneous(4, 8)

#: the kept jobs of the fixtures on 4 x 8, in submit order
KEPT = ["4101", "4103", "4110_0", "4110_1", "4110_2", "4115", "4116", "4120", "4130+0"]
#: job id -> (GPUs, elapsed s, submit s after the first kept submission)
FACTS = {
    "4101": (4, 3600, 0), "4103": (8, 7200, 120), "4110_0": (1, 1800, 300), "4110_1": (1, 2000, 300),
    "4110_2": (1, 1500, 300), "4115": (16, 5400, 900), "4116": (1, 600, 1500), "4120": (2, 1200, 4500),
    "4130+0": (1, 2400, 6100),
}
#: job id -> position among the 16 job records of the fixtures, for those whose model is drawn
DRAWN = {"4103": 2, "4116": 8, "4120": 12, "4130+0": 14}


def _as_rows(jobs):
    return [(j.job_id, j.submit_time, j.model, j.gpu_demand, j.total_samples, j.extra) for j in jobs]


def _fail_line(capsys) -> str:
    """stderr of a failed command, which must be exactly one line; stdout empty."""
    out = capsys.readouterr()
    assert out.out == "" and out.err.count("\n") == 1, out
    return out.err


# --------------------------------------------------------------------------- the rule
@pytest.mark.parametrize("path", [JSON_22, JSON_23, PARSABLE], ids=["json-22.05", "json-23.11", "parsable2"])
def test_fixture_history_becomes_the_documented_trace(path):
    jobs, summary = read_sacct(path, CLUSTER, seed=5)
    assert [j.job_id for j in jobs] == KEPT
    perf = ContentionModel(CLUSTER)
    draws = draw_models(16, 5, parse_mix("normal"))
    comment_models = {"4101": "MoE", "4110_0": "GraphSage", "4110_1": "GraphSage", "4110_2": "GraphSage",
                      "4115": "FSDP"}
    for j in jobs:
        gpus, elapsed, submit = FACTS[j.job_id]
        assert (j.gpu_demand, j.submit_time, j.extra["duration"]) == (gpus, submit, elapsed)
        want = comment_models.get(j.job_id) or MODELS[int(draws[DRAWN[j.job_id]])]
        assert j.model == want, j.job_id
        # the work takes the measured run time alone on the job's best placement
        assert j.total_samples / perf.best_isolated_throughput(j.model, gpus) == pytest.approx(elapsed, rel=1e-12)
    by_id = {j.job_id: j for j in jobs}
    assert by_id["4103"].extra["alloc_gpu_type"] == "a100" and "alloc_gpu_type" not in by_id["4101"].extra
    assert all(j.demand is None for j in by_id.values())  # the type a job ran on is no demand of the replay
    assert by_id["4116"].extra["partition"] == "debug" and by_id["4110_2"].extra["state"] == "FAILED"
    assert by_id["4115"].extra["user"] == "frank" and by_id["4115"].extra["job_name"] == "gpt2-fsdp"
    assert summary.records == 16 and summary.kept == 9
    assert {k: v for k, v in summary.skipped.items() if k != "step"} == {
        "no_gpu": 2, "never_started": 2, "running": 1, "ran_0s": 1, "too_large": 1}
    assert summary.skipped["step"] == (30 if path == PARSABLE else 0)  # JSON nests steps in their job
    assert (summary.from_comments, summary.drawn, summary.from_default) == (5, 4, 0)
    assert summary.comment_problems == 1 and "'LLaMA'" in summary.first_comment_problem


def test_three_formats_of_one_history_give_the_same_trace():
    a = _as_rows(read_sacct(JSON_22, CLUSTER)[0])
    assert _as_rows(read_sacct(JSON_23, CLUSTER)[0]) == a
    assert _as_rows(read_sacct(PARSABLE, CLUSTER)[0]) == a


def test_default_model_seed_partition_and_cluster():
    base, _ = read_sacct(PARSABLE, CLUSTER, seed=0)
    dflt, s = read_sacct(PARSABLE, CLUSTER, default_model="dlrm")
    assert (s.from_default, s.drawn) == (4, 0)
    for a, b in zip(base, dflt):
        assert b.model == ("DLRM" if a.job_id in DRAWN else a.model)
    # another seed changes only drawn models, never a comment's
    other, _ = read_sacct(PARSABLE, CLUSTER, seed=1)
    assert [j.model for j in other if j.job_id not in DRAWN] == [j.model for j in base if j.job_id not in DRAWN]
    assert [j.model for j in other] != [j.model for j in base]
    # partitions: submit times restart at the first kept job
    debug, s = read_sacct(PARSABLE, CLUSTER, partitions=["debug"])
    assert [(j.job_id, j.submit_time) for j in debug] == [("4116", 0.0)] and s.skipped["partition"] == 13
    gpu, s = read_sacct(PARSABLE, CLUSTER, partitions=["gpu"])
    assert [j.job_id for j in gpu] == [i for i in KEPT if i != "4116"] and s.skipped["partition"] == 1
    # the 64-GPU job fits 8 x 8
    big, s = read_sacct(JSON_23, ClusterSpec.homogeneous(8, 8))
    assert "4118" in {j.job_id for j in big} and s.skipped["too_large"] == 0


def _variant(tmp_path: Path, name: str, transform) -> Path:
    lines = PARSABLE.read_text().splitlines()
    p = tmp_path / name
    p.write_bytes(transform(lines))
    return p


def test_parsable_variants_read_alike(tmp_path):
    """``-p`` (trailing delimiter), ``--delimiter``, CRLF line ends with a BOM, ``ElapsedRaw`` and UNIX-second
    times (``SLURM_TIME_FORMAT=%s``), reordered columns: the same trace."""
    want = _as_rows(read_sacct(PARSABLE, CLUSTER)[0])

    def raw_times(lines):
        from datetime import datetime, timezone

        def secs(t):
            return t if t in ("Unknown", "") else str(int(datetime.fromisoformat(t).replace(tzinfo=timezone.utc)
                                                          .timestamp()))

        def el(t):
            d, _, hms = t.rpartition("-")
            h, m, s = hms.split(":")
            return str(int(d or 0) * 86400 + int(h) * 3600 + int(m) * 60 + int(s))

        out = ["ElapsedRaw|JobID|Submit|Start|State|ReqTRES|AllocTRES|Comment|Partition|User|JobName"]
        for ln in lines[1:]:
            f = ln.split("|")
            out.append("|".join([el(f[5]), f[0], secs(f[2]), secs(f[3]), f[6], f[8], f[7], f[9], f[10], f[11], f[1]]))
        return ("\n".join(out) + "\n").encode()

    variants = {
        "p.txt": lambda ls: ("\n".join(ln + "|" for ln in ls) + "\n").encode(),
        "tab.txt": lambda ls: ("\n".join(ln.replace("|", "\t") for ln in ls) + "\n").encode(),
        "crlf.txt": lambda ls: b"\xef\xbb\xbf" + ("\r\n".join(ls) + "\r\n\r\n").encode(),
        "raw.txt": raw_times,
    }
    for name, transform in variants.items():
        assert _as_rows(read_sacct(_variant(tmp_path, name, transform), CLUSTER)[0]) == want, name


def test_parsable_input_is_streamed(tmp_path):
    """The -P reader holds the kept jobs, not the file: reading 24 MB of step lines (200,000) raises the
    process's peak memory by a few MB at most (a subprocess, so its peak is this read's)."""
    lines = PARSABLE.read_text().splitlines()
    step = next(ln for ln in lines if ln.startswith("4101.batch"))
    big = tmp_path / "big.txt"
    with big.open("w") as f:
        f.write("\n".join(lines) + "\n")
        for _ in range(20):
            f.write((step + "\n") * 10_000)
    assert big.stat().st_size > 20_000_000
    script = textwrap.dedent(f"""\
        import resource
        from policies.cluster import ClusterSpec
        from trainer.sacct import read_sacct
        c = ClusterSpec.homogeneous(4, 8)
        read_sacct({str(PARSABLE)!r}, c)  # every import and the performance model's fit done
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        jobs, summary = read_sacct({str(big)!r}, c)
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(len(jobs), summary.skipped["step"], after - before)
        """)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    kept, steps, grown_kib = map(int, p.stdout.split())
    assert (kept, steps) == (9, 200_030)
    assert grown_kib < 8 * 1024, grown_kib


# --------------------------------------------------------------------------- the command
def test_cli_writes_the_trace_and_it_replays_in_simulate(tmp_path, capsys):
    out = tmp_path / "history" / "trace.csv"
    assert main(["trace", "from-sacct", str(JSON_22), "--cluster", "4x8", "--seed", "3", "--out", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == f"{JSON_22}: sacct --json (Slurm 22.05.8, openapi/dbv0.0.38): 16 job records"
    assert printed[1] == "  kept 9 GPU jobs (models: 5 from rlsched comments, 4 drawn with seed 3)"
    assert printed[2].startswith("  skipped 7: 2 without GPUs, 2 never started")
    assert printed[-1] == f"wrote 9 jobs to {out}"
    trace = load_trace(out, CLUSTER)
    assert _as_rows(trace)[:1] and [j.job_id for j in trace] == KEPT
    assert [(j.model, j.total_samples) for j in trace] == [
        (j.model, j.total_samples) for j in read_sacct(JSON_22, CLUSTER, seed=3)[0]]
    pq_out = tmp_path / "trace.parquet"
    assert main(["trace", "from-sacct", str(PARSABLE), "--seed", "3", "--out", str(pq_out)]) == 0
    assert [(j.job_id, j.submit_time, j.model, j.gpu_demand, j.total_samples) for j in load_trace(pq_out, CLUSTER)] \
        == [(j.job_id, j.submit_time, j.model, j.gpu_demand, j.total_samples) for j in trace]

    sim = tmp_path / "sim"
    assert main(["simulate", "--trace", str(out), "--cluster", "4x8", "--policy", "fifo,greedy", "--out", str(sim),
                 "--quiet"]) == 0
    for policy in ("fifo", "greedy"):
        rows = {r["job_id"]: r for r in pq.read_table(sim / f"jobs_{policy}.parquet").to_pylist()}
        assert set(rows) == set(KEPT)
        for jid, (gpus, elapsed, submit) in FACTS.items():
            r = rows[jid]
            assert (r["gpu_demand"], r["submit_time"]) == (gpus, submit)
            # the simulator's isolated time on the best placement is the measured run time
            assert r["ideal_time"] == pytest.approx(elapsed, rel=1e-9), (policy, jid)
            assert r["finish_time"] >= r["submit_time"] + elapsed * (1 - 1e-9)
        # 4101 starts alone on the empty cluster and runs uncontended: its measured hour
        assert rows["4101"]["jct"] == pytest.approx(3600, rel=1e-9)


def _bad(tmp_path: Path, name: str, text: str | bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return p


HEADER = "JobID|JobName|Submit|Start|End|Elapsed|State|AllocTRES|ReqTRES|Comment|Partition|User"
GOOD = ("4101|bert|2024-03-04T09:10:00|2024-03-04T09:10:30|2024-03-04T10:10:30|01:00:00|COMPLETED|"
        "cpu=16,gres/gpu=4,mem=64G,node=1|cpu=16,gres/gpu=4|rlsched:model=MoE|gpu|alice")


def _json_doc(**job_changes) -> str:
    doc = json.loads(JSON_22.read_text())
    job = doc["jobs"][0]
    for key, value in job_changes.items():
        obj = job
        *parents, last = key.split("__")
        for k in parents:
            obj = obj[k]
        if value is None:
            del obj[last]
        else:
            obj[last] = value
    return json.dumps(doc)


BAD_INPUTS = [
    ("nohdr.txt", GOOD + "\n", ["line 1", "header line", "--noheader"]),
    ("cols.txt", "JobID|Submit|Start|State|AllocTRES\n", ["line 1", "missing column(s) elapsed or elapsedraw"]),
    ("pipe.txt", f"{HEADER}\n{GOOD}\n{GOOD.replace('4101', '4102').replace('model=MoE', 'model=MoE|x')}\n",
     ["line 3", "expected 12 fields, got 13", "--delimiter"]),
    ("elapsed.txt", f"{HEADER}\n{GOOD.replace('01:00:00', '1h')}\n", ["line 2 (job 4101)", "field 'Elapsed'", "'1h'"]),
    ("time.txt", f"{HEADER}\n{GOOD.replace('2024-03-04T09:10:00', 'yesterday')}\n",
     ["line 2 (job 4101)", "field 'Submit'", "'yesterday'"]),
    ("mixed.txt", f"{HEADER}\n{GOOD}\n{GOOD.replace('4101', '4102').replace('2024-03-04T09:10:00', '1709543400')}\n",
     ["line 3 (job 4102)", "field 'Submit'", "UNIX seconds, earlier times in date-times"]),
    ("tres.txt", f"{HEADER}\n{GOOD.replace('gres/gpu=4,mem', 'gres/gpu=four,mem')}\n",
     ["line 2 (job 4101)", "field 'AllocTRES'", "gres/gpu=four"]),
    ("superscript.txt", HEADER + "\n" + GOOD.replace("gres/gpu=4,mem", "gres/gpu=\u00b2,mem") + "\n",
     ["line 2 (job 4101)", "field 'AllocTRES'"]),
    ("jobid.txt", f"{HEADER}\n{GOOD.replace('4101|', 'job4101|')}\n", ["line 2", "field 'JobID'", "'job4101'"]),
    ("dup.txt", f"{HEADER}\n{GOOD}\n{GOOD}\n", ["line 3 (job 4101)", "again (first at line 2 (job 4101))",
                                                 "--duplicates"]),
    ("latin1.txt", f"{HEADER}\n{GOOD}\n".replace("alice", "al\xefce").encode("latin-1"),
     ["line 2", "not UTF-8 text: byte 0xef"]),
    ("cpu.txt", f"{HEADER}\n{GOOD.replace('gres/gpu=4,', '').replace('gres/gpu=4', '')}\n",
     ["no GPU job that ran is left of its 1 job records", "1 without GPUs"]),
    ("empty.txt", "\n\n", ["empty file"]),
    ("broken.json", '{"meta": {}, "jobs": [', ["not valid JSON", "line 1 column"]),
    ("nojobs.json", '{"meta": {}, "errors": [{"description": "Unable to contact slurmdbd"}]}',
     ["field 'jobs'", "Unable to contact slurmdbd"]),
    ("noelapsed.json", _json_doc(time__elapsed=None), ["job 4101 (jobs[0])", "field 'time.elapsed'", "missing"]),
    ("strid.json", _json_doc(job_id="4101"), ["jobs[0]", "field 'job_id'", "expected a whole number"]),
    ("state.json", _json_doc(state__current=7), ["job 4101 (jobs[0])", "field 'state.current'"]),
    ("gpucount.json", _json_doc(tres__allocated=[{"type": "gres", "name": "gpu", "id": 1001, "count": "4"}]),
     ["job 4101 (jobs[0])", "field 'tres.allocated[0].count'"]),
]


@pytest.mark.parametrize("name,text,words", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, capsys, name, text, words):
    src = _bad(tmp_path, name, text)
    out = tmp_path / "out" / "trace.csv"
    assert main(["trace", "from-sacct", str(src), "--out", str(out)]) == 2
    err = _fail_line(capsys)
    assert err.startswith(f"rlsched trace from-sacct: error: {src}"), err
    for w in words:
        assert w in err, (w, err)
    assert not (tmp_path / "out").exists()
    with pytest.raises(SacctError):
        read_sacct(src, CLUSTER)


def test_json_over_the_size_limit_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sacct_mod, "MAX_JSON_BYTES", 100_000)
    out = tmp_path / "t.csv"
    assert main(["trace", "from-sacct", str(JSON_22), "--out", str(out)]) == 2
    err = _fail_line(capsys)
    assert f"{JSON_22}: 0 MiB is over the 0 MiB limit" in err and "sacct -P --format=JobID," in err
    assert not out.exists()


def test_bad_options_and_outputs_exit_2(tmp_path, capsys):
    out = tmp_path / "t.csv"
    assert main(["trace", "from-sacct", str(tmp_path / "none.json"), "--out", str(out)]) == 2
    assert "none.json: cannot open: No such file or directory" in _fail_line(capsys)
    assert main(["trace", "from-sacct", str(PARSABLE), "--default-model", "llama", "--out", str(out)]) == 2
    assert "--default-model: unknown model 'llama'" in _fail_line(capsys)
    assert main(["trace", "from-sacct", str(PARSABLE), "--out", str(tmp_path / "t.txt")]) == 2
    assert "output must be a file name ending in .csv" in _fail_line(capsys)
    out.write_text("mine")
    assert main(["trace", "from-sacct", str(PARSABLE), "--out", str(out)]) == 2
    assert "exists (use --overwrite to replace it)" in _fail_line(capsys)
    assert out.read_text() == "mine"
    assert main(["trace", "from-sacct", str(PARSABLE), "--out", str(out), "--overwrite"]) == 0
    assert [j.job_id for j in load_trace(out, CLUSTER)] == KEPT
    with pytest.raises(SystemExit) as exc:
        main(["trace", "from-sacct", str(PARSABLE), "--out", str(out), "--seed", "-1"])
    assert exc.value.code == 2


def test_read_sacct_rejects_bad_arguments():
    with pytest.raises(ValueError, match="seed must be >= 0"):
        read_sacct(PARSABLE, CLUSTER, seed=-1)
    with pytest.raises(UnknownModelError, match="unknown model"):
        read_sacct(PARSABLE, CLUSTER, default_model="nope")
    with pytest.raises(ValueError):
        read_sacct(PARSABLE, CLUSTER, mix="1:2")
    assert np.isfinite([j.total_samples for j in read_sacct(PARSABLE, CLUSTER, mix="heavy")[0]]).all()
