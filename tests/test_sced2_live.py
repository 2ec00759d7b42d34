"""Live job profiles for SCED2: agents' measured speeds -> JobInfo.measured_speeds -> the sced2 codec.

No Slurm: the controller runs on tests/test_controller.py's in-memory Slurm and fake agents.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_controller import FakeAgents, FakeSlurm, _ctl, _request_preempt

from controller.state import PROFILED_ALONE, build_cluster, build_state, record_speed
from policies.cluster import ClusterSpec, Placement
from policies.codecs.sced2 import Sced2Codec, profile_nodes
from policies.perf import ContentionModel
from policies.state import ClusterState, JobInfo, MeasuredSpeeds


# --------------------------------------------------------------------------- MeasuredSpeeds / JobInfo
def test_measured_speeds_lookup_nearest_and_update():
    m = MeasuredSpeeds(((4, 1, 100.0), (4, 4, 40.0), (8, 2, 150.0)))
    assert m.at(4, 1) == 100.0 and m.at(4, 2) is None and m.at(2, 1) is None
    assert m.nearest(4, 2) == (1, 100.0)  # tie between 1 and 3 servers away: the fewer servers
    assert m.nearest(4, 3) == (4, 40.0)
    assert m.nearest(8, 8) == (2, 150.0) and m.nearest(2, 1) is None
    m2 = m.with_speed(4, 2, 70.0).with_speed(4, 1, 90.0)
    assert m2.by_shape == ((4, 1, 90.0), (4, 2, 70.0), (4, 4, 40.0), (8, 2, 150.0))
    assert m.at(4, 1) == 100.0  # frozen: with_speed makes a new one


@pytest.mark.parametrize("entries, what", [
    (((4, 5, 1.0),), "servers <= gpus"),
    (((4, 0, 1.0),), "servers <= gpus"),
    (((True, 1, 1.0),), "integers"),
    (((4, 1, 0.0),), "samples_per_s > 0"),
    (((4, 1, math.nan),), "samples_per_s > 0"),
    (((4, 1, "fast"),), "samples_per_s > 0"),
    (((4, 2, 1.0), (4, 1, 1.0)), "sorted and distinct"),
    (((4, 1, 1.0), (4, 1, 2.0)), "sorted and distinct"),
    (((4, 1),), "not (gpus, servers, samples_per_s)"),
])
def test_measured_speeds_refuse_bad_entries(entries, what):
    with pytest.raises(ValueError, match="measured speeds") as e:
        MeasuredSpeeds(entries)
    assert what in str(e.value)


def test_jobinfo_measured_speeds_field_is_checked():
    j = JobInfo("a", "MoE", 4, 0.0, 1e5, measured_speeds=MeasuredSpeeds(((4, 1, 10.0),)))
    assert j.measured_speeds.at(4, 1) == 10.0
    assert JobInfo("b", "MoE", 4, 0.0, 1e5).measured_speeds is None
    with pytest.raises(ValueError, match="job 'c': measured_speeds must be MeasuredSpeeds"):
        JobInfo("c", "MoE", 4, 0.0, 1e5, measured_speeds={(4, 1): 10.0})


def test_record_speed_takes_only_profiled_alone_figures():
    book: dict[str, MeasuredSpeeds] = {}
    record_speed(book, "7", 8, 2, {"isolated_source": "reference", "isolated_samples_per_s": 50.0})
    record_speed(book, "7", 8, 2, {"isolated_source": "simulator", "isolated_samples_per_s": 50.0})
    record_speed(book, "7", 8, 2, {"isolated_source": PROFILED_ALONE, "isolated_samples_per_s": 0.0})
    record_speed(book, "7", 8, 2, {"isolated_source": PROFILED_ALONE, "isolated_samples_per_s": math.inf})
    record_speed(book, "7", 8, 2, None)
    assert book == {}
    record_speed(book, "7", 8, 2, {"isolated_source": PROFILED_ALONE, "isolated_samples_per_s": 50.0})
    record_speed(book, "7", 8, 1, {"isolated_source": PROFILED_ALONE, "isolated_samples_per_s": 64.0})
    record_speed(book, "7", 8, 2, {"isolated_source": PROFILED_ALONE, "isolated_samples_per_s": 52.0})
    assert book["7"].by_shape == ((8, 1, 64.0), (8, 2, 52.0))


# --------------------------------------------------------------------------- build_state
def _read(s: FakeSlurm):
    nodes, jobs = s.nodes(), s.jobs()
    cluster = build_cluster(nodes, "gpu", 16.0, 5.0)
    return cluster, nodes, jobs


def test_build_state_hands_measured_speeds_to_running_and_requeued_jobs():
    s = FakeSlurm()
    run = s.submit(8, "rlsched:model=MoE")
    s.place(run, ["node1", "node2"], per_node=4)
    s.release(run)
    s.schedule(now=1000.0)
    wait = s.submit(2, "rlsched:model=GNN")
    cluster, nodes, jobs = _read(s)
    perf = ContentionModel(cluster)
    stats = {str(run): {"isolated_source": PROFILED_ALONE, "isolated_samples_per_s": 123.0, "samples_per_s": 100.0}}
    book: dict[str, MeasuredSpeeds] = {"999": MeasuredSpeeds(((1, 1, 5.0),))}  # a job Slurm no longer lists
    v = build_state(2000.0, cluster, nodes, jobs, perf, partition="gpu", default_model="MoE",
                    default_runtime_s=600.0, progress=stats, speeds=book)
    (r,) = v.state.running
    assert r.measured_speeds == MeasuredSpeeds(((8, 2, 123.0),))
    assert [j.measured_speeds for j in v.state.pending] == [None]
    assert set(book) == {str(run)}
    # requeued (held again): it waits with the speed measured while it ran; no stats now
    s.requeue_hold(run)
    cluster, nodes, jobs = _read(s)
    v = build_state(2100.0, cluster, nodes, jobs, perf, partition="gpu", default_model="MoE",
                    default_runtime_s=600.0, speeds=book)
    by_id = {j.job_id: j for j in v.state.pending}
    assert by_id[str(run)].measured_speeds == MeasuredSpeeds(((8, 2, 123.0),))
    assert by_id[str(wait)].measured_speeds is None
    # without a book nothing is handed over
    v = build_state(2100.0, cluster, nodes, jobs, perf, partition="gpu", default_model="MoE", default_runtime_s=600.0)
    assert all(j.measured_speeds is None for j in v.state.pending)


# --------------------------------------------------------------------------- controller rounds
def test_controller_rounds_keep_agent_profiles_for_sced2(tmp_path):
    """A sced2 controller: a job profiled alone by its agents on 2 servers is preempted and waits with
    that measured speed in the policy's state; its entry goes once Slurm no longer lists the job."""
    s = FakeSlurm()
    jid = s.submit(8, "rlsched:model=MoE,samples=1e6")
    s.place(jid, ["node1", "node2"], per_node=4)
    s.release(jid)
    s.schedule(now=1000.0)
    sid = str(jid)

    class Agents(FakeAgents):
        def stats(self, job_nodes=None):
            if jid not in s.job_list or s.job_list[jid].state != "RUNNING":
                return {}
            return {sid: {"slurm_job_id": sid, "state": "running", "step": 40, "total_steps": 100,
                          "samples_per_s": 90.0, "isolated_samples_per_s": 111.0, "isolated_source": PROFILED_ALONE}}

    ctl = _ctl(tmp_path, s, Agents(), policy="sced2")
    ctl.round()  # builds the policy
    seen = []  # the states the sced2 policy decides on
    decide = ctl.policy.schedule
    ctl.policy.schedule = lambda state: (seen.append(state), decide(state))[1]
    assert ctl.backend.speeds == {sid: MeasuredSpeeds(((8, 2, 111.0),))}
    (r,) = ctl.backend.view.state.running
    assert r.measured_speeds.at(8, 2) == 111.0
    _request_preempt(tmp_path, jid)
    rep = ctl.round()
    assert rep.preempted == [jid] and s.job_list[jid].held
    seen.clear()
    rep = ctl.round()  # sced2 decides with the job waiting, measured speed in hand, and starts it again
    assert [x for x, _ in rep.placed] == [jid]
    (p,) = [j for st in seen for j in st.pending if j.job_id == sid]
    assert p.measured_speeds == MeasuredSpeeds(((8, 2, 111.0),))
    codec = ctl.policy.codec
    assert codec.job_speed(p, Placement.of({0: 4, 1: 4})) == 111.0
    model = p.remaining_samples / np.asarray(codec.modelled_speeds(p), dtype=np.float64)
    assert not np.allclose(codec.profile_times(p), model)
    s.finish(jid)
    del s.job_list[jid]
    ctl.round()
    assert ctl.backend.speeds == {}


# --------------------------------------------------------------------------- the codec's mapping
def _codec_job(speeds=None, g=8, model="MoE"):
    cluster = ClusterSpec.parse("4x8")
    perf = ContentionModel(cluster)
    codec = Sced2Codec(cluster, perf)
    job = JobInfo("j", model, g, 0.0, 1e6, done_samples=2e5, best_thp=perf.best_isolated_throughput(model, g),
                  measured_speeds=speeds)
    return codec, perf, job


def test_codec_uses_measured_speeds_and_scales_the_model_elsewhere():
    codec, perf, plain = _codec_job()
    nodes = profile_nodes(8, 8, 4)
    assert nodes == (1, 3, 6, 8)
    model = [perf.isolated_throughput("MoE", 8, n) for n in nodes]
    assert codec.modelled_speeds(plain) == tuple(model)
    assert list(codec.profile_times(plain)) == [8e5 / v for v in model]  # nothing measured: the model, exactly
    measured = 0.5 * model[1]
    _, _, job = _codec_job(MeasuredSpeeds(((4, 1, 1.0), (8, 3, measured))))
    want = [model[0] * measured / model[1], measured, model[2] * measured / model[1], model[3] * measured / model[1]]
    assert np.allclose(codec.profile_speeds(job), want, rtol=1e-12)
    assert np.allclose(codec.profile_times(job), [8e5 / v for v in want], rtol=1e-12)
    # a placement's speed: measured at its server count, else scaled; relative to the best of the profile
    p3 = Placement.of({0: 4, 1: 2, 2: 2})
    assert codec.job_speed(job, p3) == measured
    assert codec.run_time(job, p3) == pytest.approx(8e5 / measured)
    p1 = Placement.of({0: 8})
    assert codec.relative_speed(job, p3) == pytest.approx(min(measured / max(want), 1.0))
    assert codec.relative_speed(job, p1) == pytest.approx(1.0)
    # only shapes of the job's GPU count count: measured at 4 GPUs says nothing about 8
    _, _, other = _codec_job(MeasuredSpeeds(((4, 1, 1.0),)))
    assert codec.profile_speeds(other) == tuple(model)
    assert codec.run_time(other, p3) == codec.run_time(plain, p3)


def test_encoding_changes_only_the_measured_jobs_features():
    codec, perf, plain = _codec_job()
    spec = codec.spec
    other = JobInfo("k", "DLRM", 2, 1.0, 5e5, best_thp=perf.best_isolated_throughput("DLRM", 2))
    st = ClusterState(100.0, codec.cluster, np.array([8, 8, 8, 8]), [], [plain, other])
    measured = JobInfo(**{**plain.__dict__, "measured_speeds": MeasuredSpeeds(((8, 1, 1.0),))})
    st2 = ClusterState(100.0, codec.cluster, np.array([8, 8, 8, 8]), [], [measured, other])
    a = codec.begin(st).encode().obs
    b = codec.begin(st2).encode().obs
    F = spec.job_features
    o = spec.gpu_size
    changed = np.flatnonzero(a != b)
    assert changed.size and set(changed) <= set(range(o, o + spec.k))  # the first job's k profile values
    assert np.all(b[o: o + spec.k] > a[o: o + spec.k])  # 1 sample/s: far slower than the model
    assert np.array_equal(a[o + F:], b[o + F:])
