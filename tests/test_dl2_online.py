"""DL2's online learning beside the controller: the policy's recorded slots (policies/dl2.py), the experience
journal (controller/experience.py: framing, torn and damaged records, the size cap), the controller's
recording through the twin (its own rounds over the simulator), and ``rlsched train --online``
(trainer/dl2/online.py) updating a checkpoint that then loads and runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from controller.experience import (ExperienceError, ExperienceJournal, experience_recorder, read_experience)
from policies.cluster import ClusterSpec
from policies.dl2 import DL2Spec, Transition, load_dl2, load_dl2_critic, save_dl2
from policies.perf import ContentionModel
from policies.registry import make_policy
from rlsched.cli import main
from trainer.simulator import SimConfig, Simulator
from trainer.traces import load_trace
from trainer.twin import EPOCH, Twin

ROOT = Path(__file__).resolve().parents[1]
TRACE0 = ROOT / "data" / "traces" / "deepshare" / "simulate" / "trace0.json"
SPEC = DL2Spec(J=4)


def _actor(spec: DL2Spec, seed: int = 0, hidden: int = 16):
    rng = np.random.default_rng(seed)
    sizes = [spec.obs_size, hidden, spec.n_actions]
    return [(rng.normal(0, 0.1, (b, a)).astype(np.float32), rng.normal(0, 0.1, b).astype(np.float32))
            for a, b in zip(sizes, sizes[1:])]


def _transition(k: int, n: int = 3, spec: DL2Spec = SPEC, last: bool = False) -> Transition:
    rng = np.random.default_rng(k)
    obs = rng.random((n, spec.obs_size), dtype=np.float32)
    mask = np.zeros((n, spec.n_actions), bool)
    act = rng.integers(0, spec.n_actions, n)
    mask[np.arange(n), act] = True
    mask[:, -1] = True
    return Transition(600.0 * k, 600.0 * (k + 1), obs, mask, act.astype(np.int64), 0.25 * k,
                      None if last else rng.random(spec.obs_size, dtype=np.float32))


META = {"policy": "dl2", "spec": json.dumps(SPEC.to_dict()), "checkpoint": "/x/dl2.json", "weights_sha256": "ab" * 32}


# --------------------------------------------------------------------------- the journal
def test_journal_round_trip(tmp_path):
    with ExperienceJournal(tmp_path / "x", max_bytes=10**7) as j:
        for k in range(4):
            j.append(_transition(k, last=k == 3), META)
    recs = list(read_experience(tmp_path / "x"))
    assert len(recs) == 4
    for k, r in enumerate(recs):
        t, want = r.transition, _transition(k, last=k == 3)
        assert (t.time, t.end, t.reward) == (want.time, want.end, want.reward)
        assert np.array_equal(t.obs, want.obs) and np.array_equal(t.mask, want.mask)
        assert np.array_equal(t.action, want.action) and t.action.dtype == np.int64
        assert (t.next_obs is None) == (k == 3) and (k == 3 or np.array_equal(t.next_obs, want.next_obs))
        assert r.meta["spec"] == SPEC.to_dict() and r.meta["weights_sha256"] == META["weights_sha256"]
    assert b"pickle" not in (tmp_path / "x" / "experience-000001.rlx").read_bytes()


def _three(d: Path) -> Path:
    """A journal of three records in ``d``; its segment."""
    with ExperienceJournal(d, max_bytes=10**7) as j:
        for k in range(3):
            j.append(_transition(k), META)
    return d / "experience-000001.rlx"


def test_torn_last_record_is_skipped_with_a_warning_and_a_reopened_journal_starts_a_segment(tmp_path):
    d = tmp_path / "x"
    seg = _three(d)
    data = seg.read_bytes()
    for cut in (len(data) - 5, len(data) - (len(data) // 3) + 6):  # inside the payload; inside the header
        seg.write_bytes(data[:cut])
        warned: list[str] = []
        got = list(read_experience(d, warn=warned.append))
        assert len(got) == 2 and len(warned) == 1 and "torn last record" in warned[0] and str(seg) in warned[0]
    with ExperienceJournal(d, max_bytes=10**7) as j:  # after the crash: a new segment, never after the torn tail
        j.append(_transition(7), META)
    assert (d / "experience-000002.rlx").is_file()
    warned = []
    assert [r.transition.time for r in read_experience(d, warn=warned.append)] == [0.0, 600.0, 4200.0]
    assert len(warned) == 1


def test_damaged_record_ends_its_segment_with_a_warning(tmp_path):
    d = tmp_path / "x"
    seg = _three(d)
    data = bytearray(seg.read_bytes())
    first = 12 + int.from_bytes(data[4:8], "little")
    data[first + 20] ^= 0xFF  # a payload byte of the second record: its CRC fails
    seg.write_bytes(bytes(data))
    warned: list[str] = []
    assert len(list(read_experience(d, warn=warned.append))) == 1
    assert len(warned) == 1 and "CRC" in warned[0]
    data[first:first + 4] = bytes(4)  # four zero bytes: not the record magic
    seg.write_bytes(bytes(data))
    warned = []
    assert len(list(read_experience(d, warn=warned.append))) == 1 and "bad magic" in warned[0]


def test_journal_is_bounded(tmp_path):
    d = tmp_path / "x"
    size = len(__import__("controller.experience", fromlist=["encode_record"]).encode_record(_transition(0), META))
    cap = 6 * size
    with ExperienceJournal(d, max_bytes=cap) as j:
        for k in range(40):
            j.append(_transition(k), META)
    segs = sorted(d.glob("experience-*.rlx"))
    total = sum(f.stat().st_size for f in segs)
    assert total <= cap and len(segs) >= 2 and segs[0].name != "experience-000001.rlx"
    times = [r.transition.time for r in read_experience(d)]
    assert times == sorted(times) and times[-1] == 39 * 600.0 and len(times) < 40  # the newest kept, oldest gone


def test_journal_refusals(tmp_path):
    with pytest.raises(ExperienceError, match="no such experience directory"):
        list(read_experience(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ExperienceError, match="no experience segments"):
        list(read_experience(tmp_path / "empty"))
    with pytest.raises(ExperienceError, match="max_bytes"):
        ExperienceJournal(tmp_path / "y", max_bytes=0)


def test_only_online_learners_are_recorded(tmp_path):
    cl = ClusterSpec.parse("2x8")
    save_dl2(tmp_path / "ck", _actor(SPEC), SPEC)
    dl2 = make_policy(f"dl2:{tmp_path / 'ck'}", cl, ContentionModel(cl))
    assert experience_recorder(make_policy("fifo", cl, ContentionModel(cl)), tmp_path / "e", 1000) is None
    assert experience_recorder(dl2, tmp_path / "e", 0) is None and not dl2.record
    rec = experience_recorder(dl2, tmp_path / "e", 10**6)
    assert rec is not None and dl2.record and rec.meta["weights_sha256"] == load_dl2(tmp_path / "ck")[1]["weights_sha256"]


# --------------------------------------------------------------------------- the policy's slots
def test_recorded_slots_chain_and_stay_in_their_masks(tmp_path):
    cl = ClusterSpec.parse("2x8")
    perf = ContentionModel(cl)
    save_dl2(tmp_path / "ck", _actor(SPEC), SPEC)
    pol = make_policy(f"dl2:{tmp_path / 'ck'}", cl, perf)
    pol.record = True
    jobs = load_trace(TRACE0, cluster=cl)[:10]
    res = Simulator(cl, jobs, pol, perf, SimConfig()).run()
    pol.finish(res.makespan)
    ts = pol.take_experience()
    assert len(ts) >= 3 and pol.take_experience() == []
    assert sum(len(t) for t in ts) <= pol.inferences
    for a, b in zip(ts, ts[1:]):
        assert a.end == b.time and np.array_equal(a.next_obs, b.obs[0])  # s' is the next slot's first state
    for t in ts:
        assert t.mask[np.arange(len(t)), t.action].all() and 0.0 <= t.reward <= len(jobs)
    assert ts[-1].next_obs is None


# --------------------------------------------------------------------------- end to end through the twin
@pytest.mark.slow
def test_twin_records_experience_and_train_online_updates_the_checkpoint(tmp_path, capsys):
    cl = ClusterSpec.parse("2x8")
    perf = ContentionModel(cl)
    ck = tmp_path / "ck"
    save_dl2(ck, _actor(SPEC), SPEC, critic=_actor(SPEC, seed=1)[:-1] + [
        (np.full((1, 16), 0.01, np.float32), np.zeros(1, np.float32))])
    jobs = load_trace(TRACE0, cluster=cl)[:10]
    # the controller's own rounds on the simulator record the slots...
    twin = Twin(cl, jobs, f"dl2:{ck}", tmp_path / "ctl", SimConfig(), log_file=tmp_path / "ctl.log")
    twin.run()
    journal = tmp_path / "ctl" / "experience"
    recs = list(read_experience(journal))
    assert recs and all(r.meta["policy"] == "dl2" and r.meta["spec"] == SPEC.to_dict() for r in recs)
    # ... exactly as the policy records them in simulate (same states, actions and rewards)
    sim = make_policy(f"dl2:{ck}", cl, perf)
    sim.record = True
    Simulator(cl, jobs, sim, perf, SimConfig()).run()
    want = sim.take_experience()
    assert len(recs) == len(want)
    for r, w in zip(recs, want):
        t = r.transition
        assert t.time == pytest.approx(EPOCH + w.time) and t.reward == pytest.approx(w.reward, rel=1e-9, abs=1e-12)
        assert np.array_equal(t.action, w.action) and np.array_equal(t.mask, w.mask)
        assert np.allclose(t.obs, w.obs, atol=1e-5) and np.allclose(t.next_obs, w.next_obs, atol=1e-5)
    # train --online updates the weights into a new checkpoint; the old one is untouched
    out = tmp_path / "new"
    before = (tmp_path / "ck.json").read_bytes()
    assert main(["train", "--online", str(journal), "--init", str(ck), "--out", str(out), "--online-updates", "5"]) == 0
    assert (tmp_path / "ck.json").read_bytes() == before
    summary = json.loads(capsys.readouterr().out.split("\n", 1)[1])
    assert summary["updates"] == 5 and summary["records"] == len(recs)
    old, new = load_dl2(ck)[0], load_dl2(out / "dl2")[0]
    assert any(not np.array_equal(a[0], b[0]) for a, b in zip(old.weights, new.weights))
    _net, meta, _p, critic = load_dl2_critic(out / "dl2")
    assert critic is not None and meta["online"][-1]["parent_weights_sha256"] == load_dl2(ck)[1]["weights_sha256"]
    # the new checkpoint loads and decides: a simulate run with it finishes every job
    res = Simulator(cl, jobs, make_policy(f"dl2:{out / 'dl2'}", cl, perf), perf, SimConfig()).run()
    assert len(res.jobs) == len(jobs) and all(r.jct > 0 for r in res.jobs)
    # without --init: the checkpoint the journal names
    assert main(["train", "--online", str(journal), "--out", str(tmp_path / "new2"), "--online-updates", "1"]) == 0
    assert json.loads((tmp_path / "new2" / "dl2.json").read_text())["online"][-1]["parent"] == str(tmp_path / "ck.json")


def test_train_online_refusals(tmp_path, capsys):
    with ExperienceJournal(tmp_path / "j", max_bytes=10**7) as j:
        j.append(_transition(0), META)
    spec = DL2Spec(J=3)  # another layout than the journal's
    save_dl2(tmp_path / "ck", _actor(spec), spec)
    cases = [
        (["--online", str(tmp_path / "j"), "--init", str(tmp_path / "ck")], "no experience of ck.json's layout"),
        (["--online", str(tmp_path / "nope"), "--init", str(tmp_path / "ck")], "no such experience directory"),
        (["--online", str(tmp_path / "j"), "--traces", "x"], "--traces do not apply to --online"),
        (["--online", str(tmp_path / "j"), "--init", str(tmp_path / "missing")], "missing"),
    ]
    for extra, msg in cases:
        capsys.readouterr()
        assert main(["train", *extra, "--out", str(tmp_path / "o")]) == 2, extra
        err = capsys.readouterr().err.strip()
        assert msg in err and err.count("\n") == 0, err
    assert not (tmp_path / "o" / "dl2.json").exists()
