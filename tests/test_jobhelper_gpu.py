"""The GPU path of the job helper and the example jobs, tested without a GPU.

No CUDA device exists where these tests run (torch here is a CPU build), so no real CUDA profile can be
recorded: the device-side tests feed the profile readers with events *constructed* to look like what
torch.profiler / Kineto produce on a GPU (``FunctionEvent`` objects with ``DeviceType.CUDA``; a Kineto
Chrome trace with ``kernel`` / ``gpu_memcpy`` records and NCCL kernel names). The CPU path is tested with
real profiles and traces recorded here. ``scripts/gpu-check.sh`` runs end to end in its ``--cpu`` mode.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent

from nodeagent.jobdevice import choose_device, local_rank_from_env
from nodeagent.jobhelper import JobSession
from nodeagent.profiling import (
    comm_fraction_from_events,
    device_summary,
    summarize_chrome_trace,
    summarize_events,
    union_us,
)
from nodeagent.store import LocalFSStore

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- device and backend choice
@pytest.mark.parametrize("env, count, want, expect", [
    ({}, 0, "auto", ("cpu", None, "gloo")),
    ({"CUDA_VISIBLE_DEVICES": ""}, 0, "auto", ("cpu", None, "gloo")),  # Slurm gave the job no GPU
    ({"LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "0,1"}, 2, "auto", ("cuda", 1, "nccl")),
    ({"SLURM_LOCALID": "3", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}, 4, "auto", ("cuda", 3, "nccl")),
    ({"LOCAL_RANK": "0", "SLURM_LOCALID": "2"}, 4, "auto", ("cuda", 0, "nccl")),  # torchrun's wins
    ({"SLURM_LOCALID": "3", "CUDA_VISIBLE_DEVICES": "5"}, 1, "auto", ("cuda", 0, "nccl")),  # --gpus-per-task=1
    ({"SLURM_LOCALID": "1"}, 2, "cpu", ("cpu", None, "gloo")),
    ({}, 1, "cuda", ("cuda", 0, "nccl")),
])
def test_device_and_backend_follow_local_rank_and_visible_gpus(env, count, want, expect) -> None:
    c = choose_device(want, count, env)
    assert (c.kind, c.index, c.backend) == expect
    assert c.device == (f"cuda:{expect[1]}" if expect[0] == "cuda" else "cpu")
    assert c.visible == count


@pytest.mark.parametrize("env, count, want, words", [
    ({"CUDA_VISIBLE_DEVICES": ""}, 0, "cuda", ["no CUDA device", "CUDA_VISIBLE_DEVICES=''"]),
    ({"SLURM_LOCALID": "2", "CUDA_VISIBLE_DEVICES": "0,1"}, 2, "auto",
     ["local rank 2", "2 visible", "--gpus-per-task"]),
    ({}, 1, "tpu", ["'tpu'", "auto, cuda, cpu"]),
    ({"LOCAL_RANK": "x"}, 1, "auto", ["LOCAL_RANK='x'"]),
    ({"SLURM_LOCALID": "-1"}, 1, "auto", ["SLURM_LOCALID='-1'"]),
])
def test_impossible_device_requests_are_one_clear_line(env, count, want, words) -> None:
    with pytest.raises(ValueError) as e:
        choose_device(want, count, env)
    msg = str(e.value)
    assert "\n" not in msg and all(w in msg for w in words), msg


def test_local_rank_defaults_to_zero() -> None:
    assert local_rank_from_env({}) == 0 and local_rank_from_env({"LOCAL_RANK": " 2 "}) == 2


def _examples_common():
    sys.path.insert(0, str(REPO / "scripts" / "examples"))
    try:
        import _common
    finally:
        sys.path.remove(str(REPO / "scripts" / "examples"))
    return _common


def test_example_setup_uses_the_shared_choice_and_refuses_cuda_without_a_gpu(capsys) -> None:
    common = _examples_common()
    args = common.base_parser("t", "M").parse_args(["--device", "auto"])
    dev = common.setup_device(args)
    assert (dev.device, dev.backend) == ("cpu", "gloo")  # this host has no GPU
    net = torch.nn.Linear(2, 2)
    assert common.wrap_ddp(net, dev) is net  # no process group: the module itself
    assert common.device_fields(dev) == {"device": "cpu", "backend": None}
    with pytest.raises(SystemExit) as e:
        common.setup_device(argparse.Namespace(device="cuda"))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--device cuda: CUDA requested but no CUDA device is visible" in err


def test_agent_hosts_import_the_helper_modules_without_torch() -> None:
    code = ("import sys; sys.modules['torch'] = None\n"
            "import nodeagent.jobdevice, nodeagent.profiling, nodeagent.jobhelper\n"
            "print(nodeagent.jobdevice.choose_device('auto', 0, {}).backend)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "gloo", p.stderr


# ---------------------------------------------------------------- profile readers
def _fe(name: str, start: float, end: float, cuda: bool = False) -> FunctionEvent:
    """A torch profiler event as ``prof.events()`` returns it (device events carry DeviceType.CUDA)."""
    return FunctionEvent(id=0, name=name, thread=0, start_us=start, end_us=end,
                         device_type=DeviceType.CUDA if cuda else DeviceType.CPU)


def test_union_of_intervals() -> None:
    assert union_us([(0, 10), (5, 20), (30, 31), (30.5, 30.7)]) == pytest.approx(21.0)
    assert union_us([]) == 0.0


def test_cuda_profile_counts_nccl_kernel_time_over_device_busy_time() -> None:
    """Constructed (no GPU here): a step of compute kernels, a memcpy, and NCCL all-reduce kernels on
    their own stream, one of them overlapping a compute kernel; host-side ops are ignored on this path."""
    events = [
        _fe("aten::addmm", 0, 400),  # host op: not device time
        _fe("nccl:all_reduce", 100, 350),  # host-side record of the collective: not device time
        _fe("Memcpy HtoD (Pageable -> Device)", 0, 10, cuda=True),
        _fe("ampere_sgemm_32x32_sliced1x4_tn", 20, 120, cuda=True),
        _fe("void at::native::vectorized_elementwise_kernel<4, at::native::ReluFunctor>", 120, 140, cuda=True),
        _fe("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", 130, 190, cuda=True),
        _fe("ncclKernel_AllGather_RING_LL_Sum_int8_t", 250, 270, cuda=True),
        # idle GPU 190..250: not busy time
    ]
    s = summarize_events(events, wall_us=400.0)
    assert s.source == "cuda" and s.device_events == 5 and s.comm_kernels == 2
    assert s.busy_us == pytest.approx(10 + 170 + 20)  # [0,10] [20,190] [250,270]
    assert s.comm_us == pytest.approx(60 + 20)
    assert s.comm_fraction == pytest.approx(80 / 200)
    assert s.wall_us == 400.0


def test_cuda_profile_without_nccl_kernels_is_zero_and_empty_device_busy_is_zero() -> None:
    assert device_summary([("gemm", 0, 50)], 100.0).comm_fraction == 0.0
    assert device_summary([], 100.0).comm_fraction == 0.0


def test_cpu_path_unchanged_when_no_device_activity_was_recorded() -> None:
    """CPU profile, or CUDA recorded while the job kept its work on the CPU: host collectives over wall."""
    events = [_fe("aten::mm", 0, 100), _fe("gloo:all_reduce", 10, 30), _fe("c10d::allreduce_", 20, 40),
              _fe("rlsched::stop_check", 80, 95), _fe("gloo:all_reduce", 82, 90)]
    s = summarize_events(events, 100.0)
    assert s.source == "cpu" and s.device_events == 0
    assert s.comm_fraction == pytest.approx(comm_fraction_from_events(events, 100.0)) == pytest.approx(0.3)


def _kineto_trace() -> dict:
    """A Chrome trace in Kineto's format, constructed (a GPU run writes one with RLSCHED_PROFILE_TRACE)."""
    ev = [
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python3"}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": 1, "tid": 1, "ts": 1000.0, "dur": 900.0},
        {"ph": "X", "cat": "cpu_op", "name": "nccl:all_reduce", "pid": 1, "tid": 1, "ts": 1500.0, "dur": 50.0},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 1010.0, "dur": 5.0},
        {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n", "pid": 0, "tid": 7,
         "ts": 1020.0, "dur": 200.0},
        {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "pid": 0, "tid": 7, "ts": 1220.0, "dur": 2.0},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, "
         "ncclWork*)", "pid": 0, "tid": 20, "ts": 1510.0, "dur": 100.0},
        {"ph": "X", "cat": "gpu_user_annotation", "name": "nccl:all_reduce", "pid": 0, "tid": 20, "ts": 1500.0,
         "dur": 300.0},  # an annotation span on the GPU timeline, not activity
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pageable)", "pid": 0, "tid": 7,
         "ts": 1700.0, "dur": 18.0},
        {"ph": "i", "name": "marker", "pid": 1, "tid": 1, "ts": 1800.0},
    ]
    return {"schemaVersion": 1, "traceEvents": ev}


def test_chrome_trace_reader_uses_kernels_copies_and_sets(tmp_path: Path) -> None:
    s = summarize_chrome_trace(_kineto_trace())
    assert s.source == "cuda" and s.device_events == 4 and s.comm_kernels == 1
    assert s.busy_us == pytest.approx(200 + 2 + 100 + 18)
    assert s.comm_fraction == pytest.approx(100 / 320)
    assert s.wall_us == pytest.approx(900.0)  # host events span 1000..1900
    import json

    f = tmp_path / "t.json"
    f.write_text(json.dumps(_kineto_trace()))
    assert summarize_chrome_trace(f, wall_us=5.0) == summarize_chrome_trace(_kineto_trace(), wall_us=5.0)


@pytest.mark.parametrize("content, words", [("{", "cannot read"), ('{"x": 1}', "no traceEvents"),
                                            ('{"traceEvents": [{"ph": "X", "ts": "a"}]}', "traceEvents[0]")])
def test_bad_trace_is_one_line_naming_the_file(tmp_path: Path, content: str, words: str) -> None:
    f = tmp_path / "bad.json"
    f.write_text(content)
    with pytest.raises(ValueError) as e:
        summarize_chrome_trace(f)
    assert str(f) in str(e.value) and words in str(e.value) and "\n" not in str(e.value)


def test_helper_writes_a_cpu_trace_that_reads_back_as_cpu_activity(tmp_path: Path, monkeypatch) -> None:
    """Recorded here (CPU only): the helper's trace of its profiling window holds no device activity."""
    monkeypatch.setenv("RLSCHED_PROFILE_TRACE", str(tmp_path / "prof"))
    with JobSession("trace-job", "1", LocalFSStore(tmp_path / "store"), None, None, total_steps=8,
                    profile_warmup=1, profile_steps=3, install_signal=False) as s:
        for _ in s.steps(0, state_fn=lambda: {"w": torch.zeros(2)}, samples_per_step=1):
            torch.randn(64, 64) @ torch.randn(64, 64)
    assert s.profile is not None and s.profile.source == "cpu" and s.comm_fraction == s.profile.comm_fraction
    t = summarize_chrome_trace(tmp_path / "prof.rank0.json")
    assert t.source == "cpu" and t.device_events == 0 and t.wall_us > 0


# ---------------------------------------------------------------- the session's profiler on CUDA
class _FakeProfile:
    """Stands in for torch.profiler.profile on this GPU-less host: records the activities asked for and
    returns constructed CUDA events; ``refuse_cuda`` makes it fail to start with CUDA activity, as it
    does where CUPTI is missing."""

    started: list[list[str]] = []
    refuse_cuda = False

    def __init__(self, activities) -> None:
        self.activities = [a.name for a in activities]

    def __enter__(self):
        if self.refuse_cuda and "CUDA" in self.activities:
            raise RuntimeError("CUPTI not found")
        _FakeProfile.started.append(self.activities)
        return self

    def __exit__(self, *exc) -> None:
        return None

    def events(self):
        if "CUDA" not in self.activities:
            return [_fe("aten::mm", 0, 100), _fe("gloo:all_reduce", 0, 25)]
        return [_fe("aten::mm", 0, 100), _fe("sgemm", 0, 60, cuda=True),
                _fe("ncclDevKernel_AllReduce", 50, 90, cuda=True)]


@pytest.mark.parametrize("refuse_cuda", [False, True])
def test_session_profiles_cuda_activity_when_cuda_is_available(tmp_path: Path, monkeypatch, refuse_cuda) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # the job put its model on the GPU
    monkeypatch.setattr(torch.profiler, "profile", _FakeProfile)
    monkeypatch.setattr(_FakeProfile, "started", [])
    monkeypatch.setattr(_FakeProfile, "refuse_cuda", refuse_cuda)
    with JobSession("cuda-job", "1", LocalFSStore(tmp_path / "store"), None, None, total_steps=6,
                    profile_warmup=1, profile_steps=2, install_signal=False, save_final=False) as s:
        list(s.steps(0, state_fn=dict, samples_per_step=1))
    if refuse_cuda:  # no CUPTI: the window is profiled on the CPU only, with the host measure
        assert _FakeProfile.started == [["CPU"]]
        assert s.profile.source == "cpu" and s.comm_fraction == pytest.approx(s.profile.comm_us / s.profile.wall_us)
    else:
        assert _FakeProfile.started == [["CPU", "CUDA"]]
        assert s.profile.source == "cuda" and s.profile.comm_kernels == 1
        assert s.comm_fraction == pytest.approx(40 / 90)


@pytest.mark.parametrize("available", [False, True])
def test_cpu_job_profiles_cpu_activity_only(tmp_path: Path, monkeypatch, available: bool) -> None:
    """A CPU-only host, or a GPU host whose job never initialised CUDA: no CUDA activity is asked for."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    monkeypatch.setattr(torch.profiler, "profile", _FakeProfile)
    monkeypatch.setattr(_FakeProfile, "started", [])
    with JobSession("cpu-job", "1", LocalFSStore(tmp_path / "store"), None, None, total_steps=6,
                    profile_warmup=1, profile_steps=2, install_signal=False, save_final=False) as s:
        list(s.steps(0, state_fn=dict, samples_per_step=1))
    assert _FakeProfile.started == [["CPU"]] and s.profile.source == "cpu"


# ---------------------------------------------------------------- scripts/gpu-check.sh
def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_gpu_check_without_a_gpu_fails_with_one_clear_line(capsys) -> None:
    assert _gpu_check().main([]) == 1
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith("gpu-check: FAIL: no CUDA GPU visible") and "--cpu" in out


def test_gpu_check_refuses_a_preemption_step_outside_the_run(capsys) -> None:
    assert _gpu_check().main(["--cpu", "--total-steps", "50", "--preempt-at", "50"]) == 2
    assert "--preempt-at 50 must be in 1..49" in capsys.readouterr().err


@pytest.mark.slow
def test_gpu_check_cpu_mode_end_to_end(tmp_path: Path) -> None:
    """The whole check (agent, job, Preempt, resume, throughput, profile, trace) in its CPU mode."""
    p = subprocess.run(["bash", str(REPO / "scripts" / "gpu-check.sh"), "--cpu", "--total-steps", "150",
                        "--preempt-at", "50", "--workdir", str(tmp_path)],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    lines = p.stdout.splitlines()
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert lines[0].startswith("gpu-check: CPU FALLBACK (--cpu)") and "NOT a GPU check" in lines[0]
    assert lines[-1] == "gpu-check: PASS (CPU fallback, not a GPU check)"
    body = {ln.split()[0]: ln for ln in lines[1:-1]}
    assert set(body) == {"job", "checkpoint", "resume", "throughput", "profile", "trace", "reported"}, lines
    assert "on cpu, process group gloo" in body["job"] and "exit 75" in body["checkpoint"]
    assert "150 of 150 in total" in body["resume"] and "CPU activity" in body["profile"]
    assert (tmp_path / "gpu-check.json").is_file() and (tmp_path / "profile.rank0.json").is_file()


def _fake_demo_record(work: Path, device: str, backend: str, profile: dict, **over) -> dict:
    """A run_demo record shaped like a real one (keys as preempt_demo.run_demo returns them)."""
    rec = {
        "start": {"event": "start", "device": device, "backend": backend, "rank": 0, "world": 1, "start_step": 0},
        "stats_before_preempt": {"step": 82, "samples_per_s": 5000.0, "isolated_samples_per_s": 5100.0,
                                 "isolated_source": "profiled-alone", "cs": 1.02, "comm_fraction": 0.1},
        "preempt": {"ok": True, "checkpoint_step": 84, "message": "checkpoint at step 84 is durable and verified"},
        "job_exit_code": 75, "checkpoint_bytes": 262235, "resume_exit_code": 0, "exact_total": True,
        "resume": {"start_step": 84, "steps_this_run": 216, "final_step": 300},
        "resume_done": {"event": "done", "profile": profile}, "workdir": str(work),
    }
    rec.update(over)
    return rec


def _patched_gpu_check(monkeypatch, tmp_path: Path, record: dict, trace: dict | None, gpu: str | None):
    import json

    mod = _gpu_check()
    import preempt_demo  # on sys.path through gpu_check

    def fake_run_demo(script, total, preempt_at, sleep, job_args=None, job_env=None, work=None):
        assert job_args[:3] == ["--device", "cpu" if gpu is None else "cuda", "--process-group"]
        if trace is not None:
            Path(job_env["RLSCHED_PROFILE_TRACE"] + ".rank0.json").write_text(json.dumps(trace))
        return record

    monkeypatch.setattr(preempt_demo, "run_demo", fake_run_demo)
    monkeypatch.setattr(mod, "gpu_inventory", lambda: (gpu, "torch 2.x, CUDA build 12.4, NCCL 2.21.5"))
    return mod


def test_gpu_check_gpu_mode_prints_the_cuda_profile(monkeypatch, tmp_path: Path, capsys) -> None:
    """The GPU mode's checks and lines, fed a constructed record (no GPU here to produce a real one)."""
    prof = summarize_chrome_trace(_kineto_trace()).as_dict()
    rec = _fake_demo_record(tmp_path, "cuda:0", "nccl", prof)
    mod = _patched_gpu_check(monkeypatch, tmp_path, rec, _kineto_trace(), "NVIDIA H100 80GB HBM3")
    assert mod.main(["--workdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("gpu-check: GPU NVIDIA H100 80GB HBM3 (cuda:0), NCCL") and out[-1] == "gpu-check: PASS"
    assert "on cuda:0, process group nccl" in out[1]
    prof_line = next(ln for ln in out if ln.strip().startswith("profile"))
    assert "CUDA activity: 4 device records" in prof_line and "NCCL kernels 1" in prof_line
    assert "comm_fraction 0.312" in prof_line


@pytest.mark.parametrize("case, step", [("cpu-profile", "profile"), ("no-checkpoint", "checkpoint"),
                                        ("short", "resume"), ("gloo", "device")])
def test_gpu_check_names_the_failed_step(monkeypatch, tmp_path: Path, capsys, case: str, step: str) -> None:
    cpu_prof = {"source": "cpu", "comm_fraction": 0.0, "wall_us": 10.0, "busy_us": 10.0, "comm_us": 0.0,
                "device_events": 0, "comm_kernels": 0}
    over = {"no-checkpoint": {"job_exit_code": 1, "preempt": {"ok": False, "message": "no new checkpoint"}},
            "short": {"exact_total": False, "resume_exit_code": 1}}.get(case, {})
    rec = _fake_demo_record(tmp_path, "cuda:0", "gloo" if case == "gloo" else "nccl", cpu_prof, **over)
    mod = _patched_gpu_check(monkeypatch, tmp_path, rec, None, "Some GPU")
    assert mod.main(["--workdir", str(tmp_path)]) == 1
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith(f"gpu-check: FAIL: {step}: "), last
