"""DAgger from the planner (trainer/sizefree/dagger.py): the planner's decisions as labels of the size-free
codec's candidates, on the states the learner visits."""

from __future__ import annotations

import numpy as np
import pytest

from policies.cluster import ClusterSpec, Placement
from policies.codecs.sizefree import SizeFreeCodec, SizeFreeSpec
from policies.job import JobSpec
from policies.perf import ContentionModel
from policies.state import ClusterState, JobInfo
from trainer.sizefree.dagger import TEACHER, PlannerTeacher, match_action

CL = ClusterSpec.parse("2x8")
PERF = ContentionModel(CL)
SPEC = SizeFreeSpec(jobs=4)


def _pending(jid: str, g: int, hours: float) -> JobInfo:
    best = PERF.best_isolated_throughput("FSDP", g)
    return JobInfo(jid, "FSDP", g, 0.0, best * 3600 * hours, best_thp=best)


def test_match_action_finds_the_candidate_or_the_nearest_of_its_job():
    st = ClusterState(0.0, CL, np.array([8, 8]), [], [_pending("a", 4, 1.0), _pending("b", 12, 2.0)])
    enc = SizeFreeCodec(CL, PERF, SPEC).begin(st).encode()
    for i, c in enumerate(enc.cands):
        if c is not None and enc.mask[i]:
            assert match_action(enc, c[0].job_id, c[1]) == i  # every candidate maps onto itself
    first_a = next(i for i, c in enumerate(enc.cands) if c is not None and c[0].job_id == "a")
    # "a" on node 1 instead of the candidate's node: the same job, one node -> its candidate
    other = Placement(((1 - enc.cands[first_a][1].nodes[0], 4),))
    assert match_action(enc, "a", other) == first_a
    assert match_action(enc, "zz", other) is None  # not a candidate


def _env(n: int = 10, seed: int = 3):
    from trainer.sizefree.env import SizeFreeEnv

    rng = np.random.default_rng(seed)
    jobs, t = [], 0.0
    for i in range(n):
        g = int(rng.choice([1, 2, 4, 8, 12, 16]))
        jobs.append(JobSpec(f"j{i}", t, "FSDP", g, float(rng.uniform(0.2, 2.0)) * 3600
                            * PERF.best_isolated_throughput("FSDP", g)))
        t += float(rng.exponential(600.0))
    return SizeFreeEnv([jobs], CL, SPEC)


def test_teacher_labels_follow_the_planner_and_reuse_its_plan():
    pytest.importorskip("gymnasium")
    env = _env()
    teacher = PlannerTeacher(env.cluster, env.perf)
    env.reset(options={"trace": 0})
    teacher.reset()
    done, steps, first = False, 0, True
    while not done:
        enc = env.encoding
        if enc is None:
            a = env.obs_spec.hold
        else:
            state = env.backend.snapshot()
            if first:  # the round's first label is the planner's first placement for this very snapshot
                dec = teacher.planner.schedule(state)
                want = match_action(enc, *dec.place[0]) if dec.place else env.obs_spec.hold
            label = teacher.label(state, enc)
            if first:
                assert label == want
                first = False
            assert label is None or enc.mask[label]
            a = label if label is not None else env.expert_action("greedy")
            teacher.taken(state, a, label, enc)
        _obs, _r, term, trunc, _ = env.step(a)
        done, steps = term or trunc, steps + 1
    st = teacher.stats()
    assert st["labels"] > 0 and st["cut"] == 0
    assert st["searches"] <= st["labels"] + st["unlabelled"]
    assert "greedy-np" in TEACHER and teacher.planner.budget_s == 5.0


def test_teacher_drops_its_plan_when_the_learner_deviates():
    st = ClusterState(0.0, CL, np.array([8, 8]), [], [_pending("a", 4, 1.0), _pending("b", 4, 2.0),
                                                      _pending("c", 8, 3.0)])
    codec = SizeFreeCodec(CL, PERF, SPEC)
    rnd = codec.begin(st)
    enc = rnd.encode()
    teacher = PlannerTeacher(CL, PERF)
    label = teacher.label(st, enc)
    assert label is not None and label != SPEC.hold
    other = next(i for i in range(SPEC.hold) if enc.mask[i] and enc.cands[i][0].job_id != enc.cands[label][0].job_id)
    teacher.taken(st, other, label, enc)
    assert teacher._plan is None  # the next label is a new search on the state the learner made
    n = teacher.searches
    rnd.place(*enc.decode(other))
    teacher.label(rnd.state(), rnd.encode())
    assert teacher.searches == n + 1


def test_tiny_planner_dagger_run(tmp_path):
    pytest.importorskip("sb3_contrib")
    from policies.sizefree import load_sizefree
    from trainer.sizefree.train import SizeFreeTrainConfig, train

    cfg = SizeFreeTrainConfig(clusters=("2x8",), max_gpus=16, jobs_per_set=6, sets_per_kind=1, loads=(0.9,), val_sets=1,
                              hidden=8,
                              bc_epochs=2, dagger=1, ppo_timesteps=0, jobs=4, expert="planner", compare=None)
    lines: list[str] = []
    path = train(cfg, tmp_path / "ck", log=lines.append, command="rlsched train-sizefree --expert planner")
    _net, meta, _ = load_sizefree(path)
    tr = meta["training"]
    assert tr["algo"].startswith("bc+dagger (planner teacher)") and tr["command"].endswith("--expert planner")
    assert any(ln.startswith("bc round 1 (dagger)") and "planner:" in ln for ln in lines)


def test_init_weights_load_into_the_torch_scorer():
    torch = pytest.importorskip("torch")
    from policies.sizefree import TENSOR_NAMES, load_sizefree, shipped_sizefree
    from trainer.sizefree.model import CandidateScorer

    net, _meta, _path = load_sizefree(shipped_sizefree())
    scorer = CandidateScorer(net.spec, net.hidden)
    scorer.load_tensors({f"{p}.{x}": w for p, (W, b) in zip(TENSOR_NAMES, net.layers)
                         for x, w in (("weight", W.T), ("bias", b))})
    obs = np.random.default_rng(0).uniform(-1, 1, size=(3, net.spec.size)).astype(np.float32)
    with torch.no_grad():
        got = scorer(torch.as_tensor(obs)).numpy()
    want = np.stack([net.scores(o) for o in obs])
    assert np.allclose(got, want, atol=1e-5)  # the shipped network, as numpy scores it
    with pytest.raises(ValueError, match="does not match the scorer's"):
        CandidateScorer(net.spec, 8).load_tensors(scorer.tensors())
