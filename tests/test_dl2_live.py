"""DL2's online learning on real Slurm daemons: the controller runs ``dl2`` beside slurmctld, the policy grows an
elastic PyTorch job from 1 worker to 2 (gloo, CPU) live, the experience journal records that slot, and
``rlsched train --online`` turns the journal into a checkpoint that loads.

The cluster is the session's (tests/conftest.py: ``slurm_cluster``, 4 nodes x 8 fake GPUs, node agents),
started by the test itself; skipped when not root, without the Slurm binaries or without node agents.

**Why the weights are crafted.** A trained DL2 network grows a job only in some states, and which ones
depends on its training; the test needs a resize it can predict. Its checkpoint (written here in the real
format: ``save_dl2``, safetensors + JSON) is a 38 -> 8 -> 7 ReLU network (``J = 2`` job rows) whose
weights are small (standard deviation 0.01) and whose output bias is +10 on action 0 (one more worker to
the first job), 0 on stop and -10 on the others: the logits move by less than 0.1 over every state this
test reaches, so each inference takes action 0 while it is feasible, i.e. every slot plans the job at its
``max_gpus`` (2) workers. The slot is 6 s (``DL2Spec.slot_s``) so that a run of a few dozen seconds spans
several slots.

**What happens.** The first slot finds the job waiting and plans 2 workers; a waiting job starts at the GPUs
it asked for (1), so the next slot comes at the next round and resizes it to 2 (checkpoint through the
agent, ``requeuehold``, pin, release; controller/backend.py). The test runs a round only once each run of
the job (Slurm's restart count) has reported to its agents, so every slot boundary sees the job's real
progress (the agents' ``step`` / ``total_steps`` while it trains, the checkpoint step the controller recorded
while it restarts, the step last reported while Slurm ends its processes after its last step), never the
controller's estimate for jobs without reports.

**What is checked.** The journal's slot that holds the resize: its actions are twice action 0, its
states count the job's planned workers 0 -> 1 while the job ran on 1 GPU at the slot's start and on 2 at
its end (the controller's snapshots), and its reward is the job's progress across the slot: the
steps it reported between the two rounds over its ``total_steps`` (the remaining-work feature of its
states says the same), with the resumed run's first step (the job's own ``start`` line) in between. Every
slot's reward is the difference of the job's reported progress at its two rounds, that progress never goes
back, and the slots chain
(each ``next_obs`` is the next slot's first state). ``rlsched train --online JOURNAL --out DIR`` then
updates the network from the journal; the written checkpoint loads through the policy registry, names its
parent, and decides the same resize on the recorded state.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from controller.config import load_config
from controller.daemon import Controller
from controller.experience import read_experience
from policies.cluster import ClusterSpec
from policies.dl2 import FEATURES, DL2Spec, load_dl2, load_dl2_critic, save_dl2
from policies.perf import ContentionModel
from policies.registry import make_policy
from rlsched.cli import main
from tests.test_controller import FakeAgents, FakeSlurm, _ctl
from tests.test_resize import _running
from tests.test_resize_slurm import EXAMPLE, REPO, _free_port, job_diagnosed
from tests.test_slurm_integration import _events


TOTAL_STEPS = 60
FIRST, GROWN = 1, 2  # GPUs (workers) the job asks for, and its max_gpus: what DL2 grows it to
GLOBAL_BATCH = 24
SLOT_S = 6.0
SPEC = DL2Spec(J=2, slot_s=SLOT_S)
GROW = 0  # action 3 * 0 + 0: one more worker to job row 0
STOP = SPEC.n_actions - 1
L = len(SPEC.types)
REMAINING, WORKERS = L + FEATURES.index("remaining_epochs"), L + FEATURES.index("workers")


def _grow_first_job(path) -> str:
    """Write the crafted checkpoint (module docstring) to ``path``; its weights' sha256."""
    rng = np.random.default_rng(7)
    hidden = 8
    w1 = rng.normal(0.0, 0.01, (hidden, SPEC.obs_size)).astype(np.float32)
    b1 = np.full(hidden, 0.1, np.float32)
    w2 = rng.normal(0.0, 0.01, (SPEC.n_actions, hidden)).astype(np.float32)
    b2 = np.full(SPEC.n_actions, -10.0, np.float32)
    b2[GROW], b2[STOP] = 10.0, 0.0
    save_dl2(path, [(w1, b1), (w2, b2)], SPEC, extra={"training": {"crafted": "grows job row 0 (tests/test_dl2_live.py)"}})
    return load_dl2(path)[1]["weights_sha256"]


class StepAgents(FakeAgents):
    """Agents whose running jobs report ``steps[job id]`` of 100 steps (a job not in ``steps`` is not reported)."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: dict[str, int] = {}

    def stats(self, job_nodes=None):
        return {sid: {"slurm_job_id": sid, "state": "running", "step": self.steps[sid], "total_steps": 100}
                for sid in (job_nodes or {}) if sid in self.steps}


def test_a_running_job_its_agents_no_longer_report_keeps_the_progress_it_reported(tmp_path):
    """The agents report a job as running only while it trains; once its steps are done Slurm may run it a while
    longer (its processes ending). Its progress in the policy's state stays the step it last reported in that
    run (not the estimate for jobs without reports), and is forgotten when Slurm runs it again (a requeue)."""
    s = FakeSlurm()
    jid = _running(s, 2, "rlsched:model=MoE,samples=1000")
    sid = str(jid)
    agents = StepAgents()
    ctl = _ctl(tmp_path, s, agents)

    def done() -> float:
        return next(i for i in ctl.backend.view.state.running if i.job_id == sid).done_samples

    agents.steps[sid] = 40
    assert ctl.round().ok and done() == 400.0
    del agents.steps[sid]  # its training finished: no longer reported as running
    assert ctl.round().ok and done() == 400.0 and ctl.last_reports({}) == {sid: {"step": 40, "total_steps": 100}}
    s.job_list[jid].restarts += 1  # requeued and running again: that run has not reported
    assert ctl.round().ok and ctl.last_reports({}) == {}


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_dl2_grows_an_elastic_job_live_and_train_online_learns_from_the_journal(live_cluster, tmp_path, capsys):
    cluster = live_cluster
    if not cluster.agents:
        pytest.skip("no `rlsched agent` command: node agents not available (a resize checkpoints through them)")
    ck = tmp_path / "grow" / "dl2"
    sha = _grow_first_job(ck)
    journal = tmp_path / "experience"
    script = (f"export MASTER_PORT={_free_port()} PYTHONPATH={REPO}\n"
              f"exec {sys.executable} {EXAMPLE} --launch --total-steps {TOTAL_STEPS} --global-batch {GLOBAL_BATCH} "
              f"--step-sleep 0.15 --report-every 1 --threads 1")
    jid = cluster.sbatch(script, FIRST, comment=f"rlsched:model=MoE,samples=120000,min_gpus=1,max_gpus={GROWN}",
                         extra=[f"--ntasks={FIRST}", "--requeue"])
    sid = str(jid)
    ctl = Controller(load_config(cluster.controller_config(tmp_path, policy=f"dl2:{ck}", experience_dir=str(journal))))
    errors: list[str] = []
    # per round that saw the job: (round time, its GPUs and done fraction in the policy's snapshot, the step
    # its agents reported in that round, None when they reported none)
    rounds: list[tuple[float, int, float, int | None]] = []
    reported_runs: set[int] = set()  # Slurm restart counts of the job's runs that have reported to their agents

    def reporting(j) -> bool:
        return sid in ctl.preempter.stats(job_nodes={sid: list(j.nodes)})

    def tick() -> None:
        j = cluster.job(jid)
        if j is not None and j.state == "RUNNING" and j.restarts not in reported_runs:
            if not reporting(j):
                return  # a run that has not reported yet: no round until it has (the reward is its real progress)
            reported_runs.add(j.restarts)
        rep = ctl.round()
        if not rep.ok:
            errors.append(str(rep.error))
        view = ctl.backend.view
        info = next((i for i in (*view.state.running, *view.state.pending) if i.job_id == sid), None) if view else None
        if info is not None:
            rounds.append((rep.time, info.placement.total_gpus if info.placement is not None else 0,
                           info.done_samples / info.total_samples, (ctl._stats.get(sid) or {}).get("step")))

    def first_steps() -> bool:  # the first run has reported a few steps (so its checkpoint is past step 0)
        j = cluster.job(jid)
        ok = j is not None and j.state == "RUNNING" and \
            (ctl.preempter.stats(job_nodes={sid: list(j.nodes)}).get(sid) or {}).get("step", 0) >= 3
        if ok:
            reported_runs.add(j.restarts)
        return ok

    with job_diagnosed(cluster, jid, lambda: f"rounds: {rounds}\nround errors: {errors[-3:]}"):
        tick()  # the first slot: the job waits; placed on the GPU it asked for (the plan is 2)
        assert ctl.experience is not None and rounds and rounds[0][1] == 0, (rounds, errors)
        cluster.wait(first_steps, 150, "the job's first steps reported to its agent")
        cluster.wait(lambda: (j := cluster.job(jid)) is not None and j.state == "COMPLETED", 300,
                     "the grown job to finish", tick=tick, step=1.0)
    assert not errors, errors
    assert ctl.metrics.value("rlsched_decisions_total", action="resize") == 1
    ctl.experience.journal.close()

    # the job ran at 2 workers, then at 4 from the checkpoint the controller recorded, and finished its steps
    ev = _events(cluster, jid)
    starts = {}
    for e in ev:
        if e.get("event") == "start":
            starts.setdefault(e["world"], e)
    assert list(starts) == [FIRST, GROWN], ev
    s1 = starts[GROWN]["start_step"]
    assert 3 <= s1 < TOTAL_STEPS and starts[GROWN]["resumed_world"] == FIRST and starts[FIRST]["start_step"] == 0, starts
    done = [e for e in ev if e.get("event") == "done"]
    assert sorted(e["rank"] for e in done) == list(range(GROWN)), done  # only the resumed run reaches the end
    assert all(e["final_step"] == TOTAL_STEPS and e["world"] == GROWN for e in done), done

    # every snapshot holds the job's real progress: the step its agents reported that round; without a report
    # (restarting, or its steps done and Slurm still running it) a step it reported before or the checkpoint
    # step its resumed run started at; it never goes back
    reports = {0, s1} | {step for *_x, step in rounds if step is not None}
    for t, gpus, frac, step in rounds:
        if step is not None:
            assert frac == pytest.approx(step / TOTAL_STEPS, abs=1e-12), (t, gpus, frac, step)
        assert any(frac == pytest.approx(k / TOTAL_STEPS, abs=1e-12) for k in reports), (t, gpus, frac, sorted(reports))
    fracs = [frac for _t, _g, frac, _s in rounds]
    assert fracs == sorted(fracs), rounds
    at = {round(t, 6): (gpus, frac) for t, gpus, frac, _s in rounds}

    recs = list(read_experience(journal))
    assert len(recs) >= 2, recs
    for r in recs:
        assert r.meta["policy"] == "dl2" and r.meta["spec"] == SPEC.to_dict() and r.meta["weights_sha256"] == sha
        assert r.meta["checkpoint"] == str(ck.with_suffix(".json"))
    ts = [r.transition for r in recs]
    for a, b in zip(ts, ts[1:]):
        assert a.end == b.time and np.array_equal(a.next_obs, b.obs[0])
    for t in ts:  # DL2's reward: the job's progress between the slot's two rounds, over its total
        f0, f1 = at[round(t.time, 6)][1], at[round(t.end, 6)][1]
        assert t.reward == pytest.approx(f1 - f0, abs=1e-9), (t.time, t.end, t.reward, f0, f1)
        assert t.obs[0, REMAINING] == pytest.approx(1.0 - f0, abs=1e-6)
        assert t.next_obs[REMAINING] == pytest.approx(1.0 - f1, abs=1e-6)
        assert (t.action == GROW).all() and len(t) == GROWN  # planned at max_gpus each slot
        assert np.allclose(t.obs[:, WORKERS], SPEC.scales["tasks"] * np.arange(GROWN))  # workers planned so far
    # the slot of the resize: FIRST GPUs at its start, GROWN at its end; its reward spans the checkpoint and restart
    resized = [t for t in ts if at[round(t.time, 6)][0] == FIRST and at[round(t.end, 6)][0] == GROWN]
    assert len(resized) == 1, [(t.time, t.end, at[round(t.time, 6)], at[round(t.end, 6)]) for t in ts]
    t = resized[0]
    f0, f1 = at[round(t.time, 6)][1], at[round(t.end, 6)][1]
    assert f0 * TOTAL_STEPS <= s1 <= f1 * TOTAL_STEPS, (f0, s1, f1, t.reward)

    # rlsched train --online reads the journal and writes a checkpoint that loads and decides the same resize
    new = tmp_path / "online"
    capsys.readouterr()
    assert main(["train", "--online", str(journal), "--out", str(new)]) == 0
    summary = json.loads(capsys.readouterr().out.split("\n", 1)[1])
    assert summary["records"] == len(recs) and summary["updates"] == len(recs)
    assert summary["samples"] == sum(len(t) for t in ts) and summary["weights"] == {sha: summary["samples"]}
    _net, meta, _j, critic = load_dl2_critic(new / "dl2")
    assert critic is not None and meta["online"][-1]["parent_weights_sha256"] == sha
    assert meta["weights_sha256"] != sha
    cl = ClusterSpec.parse("4x8")
    pol = make_policy(f"dl2:{new / 'dl2'}", cl, ContentionModel(cl))
    assert pol.name == "dl2" and pol.weights_sha256 == meta["weights_sha256"]
    assert pol.choose(t.obs[0], t.mask[0], []) == GROW
