"""A round's placements in batched Slurm calls (controller.backend ``_place_batch``, SlurmCLI's
``place_many`` / ``release_many``), without Slurm daemons: the in-memory FakeSlurm of
tests/test_controller.py with the two batch calls added. Against real daemons:
tests/test_slurm_integration.py and benchmarks/bench_slurm.py."""

from __future__ import annotations

import json
import time

import pytest

from controller.slurm import QUEUE_FIELDS, SlurmCLI, SlurmError, parse_sinfo_json, parse_sinfo_text, parse_squeue_text
from tests.test_controller import FakeSlurm, _ctl


class BatchSlurm(FakeSlurm):
    """FakeSlurm with ``pin_args`` / ``place_many`` / ``release_many`` as SlurmCLI has them.

    ``refuse_pin``: job ids whose pin Slurm refuses; ``refuse_release``: job ids it will not release;
    ``journal``: where the controller's journal is, to check that every release was recorded first."""

    pin_args = staticmethod(SlurmCLI.pin_args)

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.refuse_pin: set[int] = set()
        self.refuse_release: set[int] = set()
        self.journal = None
        self.batches: list[tuple[str, list[int]]] = []

    def place(self, job_id, nodes, gpus=None, per_node=None, tres_style="gres:gpu", delay_s=0):
        if job_id in self.refuse_pin:
            self._call("place", job_id, list(nodes))
            raise SlurmError(["scontrol", "update", f"JobId={job_id}"],
                             "exit status 1: Requested node configuration is not available")
        super().place(job_id, nodes, gpus, per_node, tres_style)
        self.delays[job_id] = delay_s

    def place_many(self, pins):
        ids = [int(p[0].split("=", 1)[1]) for p in pins]
        self.batches.append(("place_many", ids))
        if self.refuse_pin & set(ids):
            raise SlurmError(["scontrol"],
                             "exit status 1: slurm_update error: Requested node configuration is not available")
        for p in pins:
            kv = dict(a.split("=", 1) for a in p)
            jid = int(kv["JobId"])
            per = kv["TresPerNode"].rsplit(":", 1)[1] if kv["TresPerNode"] else None
            j, nodes = self.job_list[jid], kv["ReqNodeList"].split(",")
            j.required_nodes, j.num_nodes, self.per_node[jid] = nodes, len(nodes), int(per) if per else None
            self.delays[jid] = int(kv["StartTime"].partition("+")[2] or 0)

    def release_many(self, job_ids):
        ids = [int(j) for j in job_ids]
        self.batches.append(("release_many", ids))
        recorded = json.loads(self.journal.read_text())["released"]
        assert all(str(j) in recorded for j in ids), "released before the journal recorded it"
        for j in ids:
            if j not in self.refuse_release:
                assert self.job_list[j].priority == 0, "released twice"
                self.job_list[j].priority, self.job_list[j].reason = 1000, "None"
        if self.refuse_release & set(ids):
            raise SlurmError(["scontrol", "release"], "exit status 1: Invalid job id specified")


def _round(tmp_path, s: BatchSlurm):
    ctl = _ctl(tmp_path, s, policy="fifo")
    s.journal = ctl.journal.path
    return ctl, ctl.round()


def test_a_rounds_placements_take_one_pin_call_and_one_release_call(tmp_path):
    s = BatchSlurm()
    ids = [s.submit(g, comment="rlsched:model=GNN") for g in (8, 4, 4, 2)]
    ctl, rep = _round(tmp_path, s)
    assert rep.ok, rep.error
    assert sorted(j for j, _ in rep.placed) == ids
    assert [b for b, _ in s.batches] == ["place_many", "release_many"]
    assert s.batches[0][1] == s.batches[1][1] and sorted(s.batches[1][1]) == ids
    assert not [c for c in s.calls if c[0] in ("place", "release")]  # no per-job calls
    s.schedule()
    for jid, plan in rep.placed:
        assert s.job_list[jid].gpus_per_node == plan
    assert ctl.round().ok


def test_a_refused_pin_is_found_one_by_one_and_the_others_are_placed(tmp_path):
    s = BatchSlurm()
    a, b, c = (s.submit(g, comment="rlsched:model=GNN") for g in (4, 4, 4))
    s.refuse_pin = {b}
    ctl, rep = _round(tmp_path, s)
    assert sorted(j for j, _ in rep.placed) == [a, c]
    assert s.batches[-1] == ("release_many", [a, c])
    assert str(b) not in ctl.journal["released"] and s.job_list[b].held
    assert ctl.metrics.value("rlsched_slurm_errors_total") == 1
    s.refuse_pin = set()
    rep = ctl.round()  # placed again by the next round
    assert [j for j, _ in rep.placed] == [b]


def test_a_refused_release_leaves_that_job_held_and_unjournaled(tmp_path):
    s = BatchSlurm()
    a, b = (s.submit(g, comment="rlsched:model=GNN") for g in (8, 8))
    s.refuse_release = {a}
    ctl, rep = _round(tmp_path, s)
    assert [j for j, _ in rep.placed] == [b]
    assert str(a) not in ctl.journal["released"] and str(b) in ctl.journal["released"]
    assert s.job_list[a].held and not s.job_list[b].held


def test_requeued_jobs_get_their_settle_time_in_the_pin(tmp_path):
    s = BatchSlurm()
    jid = s.submit(4, comment="rlsched:model=GNN")
    s.job_list[jid].restarts = 1
    ctl, rep = _round(tmp_path, s)
    assert [j for j, _ in rep.placed] == [jid]
    assert s.delays[jid] == round(ctl.cfg.controller.requeue_settle_s) > 0


def test_pin_and_release_commands(monkeypatch):
    cli = SlurmCLI()
    seen = []
    monkeypatch.setattr(cli, "run", lambda args, stdin=None: seen.append((list(args), stdin)) or "")
    cli.place_many([SlurmCLI.pin_args(7, ["n1", "n2"], 8, 4), SlurmCLI.pin_args(9, ["n3"], 2, delay_s=5)])
    cli.release_many(list(range(1, 402)))
    assert seen[0] == (["scontrol"], "update JobId=7 ReqNodeList=n1,n2 NumNodes=2 TresPerJob= TresPerNode=gres:gpu:4 "
                       "StartTime=now\nupdate JobId=9 ReqNodeList=n3 NumNodes=1 TresPerNode= TresPerJob=gres:gpu:2 "
                       "StartTime=now+5\nquit\n")
    assert [a[:2] for a, _ in seen[1:]] == [["scontrol", "release"]] * 3  # 200 job ids a call
    assert seen[1][0][2] == ",".join(str(i) for i in range(1, 201)) and seen[3][0][2] == "401"
    with pytest.raises(ValueError, match="cannot be written"):
        SlurmCLI.pin_args(7, ["n1 TresPerJob=gres:gpu:64"], 8)


# --------------------------------------------------------------------------- the cheap queue read
def _json_job(jid: int, **kw) -> dict:
    j = {"job_id": jid, "name": f"j{jid}", "user_name": "alice", "user_id": 1001, "job_state": "PENDING",
         "state_reason": "JobHeldUser", "priority": 0, "partition": "gpu", "tres_per_job": "gres:gpu:4",
         "tres_per_node": "", "nodes": "", "node_count": 1, "required_nodes": "", "comment": "rlsched:model=GNN",
         "admin_comment": "rlsched:managed gpus=4", "time_limit": 60, "submit_time": 1000 + jid, "start_time": 0,
         "eligible_time": 0, "restart_cnt": 0, "dependency": "", "requeue": True, "batch_host": ""}
    j.update(kw)
    return j


class TextSlurm(SlurmCLI):
    """SlurmCLI whose commands answer from ``self.json_jobs`` (``squeue --json``) and ``self.rows``
    (``squeue -O``: field -> text per job, the rest as a pending held job prints it)."""

    def __init__(self) -> None:
        super().__init__()
        self.json_jobs: list[dict] = []
        self.rows: list[dict] = []
        self.ran: list[str] = []

    def run(self, args, stdin=None):
        if list(args[:2]) == ["squeue", "--json"]:
            self.ran.append("json")
            return json.dumps({"jobs": self.json_jobs})
        if args[0] == "scontrol":
            self.ran.append(" ".join(args[:2]))
            return ""
        assert args[:5] == ["squeue", "-h", "-t", "all", "-O"], args
        self.ran.append("text")
        fmt = args[5].split(",")
        sep, end = fmt[0].split(":", 1)[1], fmt[-1].split(":", 1)[1]
        out = []
        for r in self.rows:
            row = {"State": "PENDING", "PriorityLong": "0", "Reason": "JobHeldUser", "Partition": "gpu", "NodeList": "",
                   "NumNodes": "1", "tres-per-job": "gres:gpu:4", "tres-per-node": "N/A", "RestartCnt": "0",
                   "Requeue": "1", "BatchHost": "n/a", "ReqNodes": "", "StartTime": "N/A", "EligibleTime": "N/A",
                   "Dependency": "(null)", "Comment": "rlsched:model=GNN", **r}
            out.append(sep.join(row[f] for f in QUEUE_FIELDS) + end + "\n")
        return "".join(out)


def test_queue_reads_text_over_the_last_json_and_json_when_it_must():
    s = TextSlurm()
    s.json_jobs = [_json_job(1), _json_job(2, tres_per_job="gres:gpu:8", admin_comment="rlsched:managed gpus=8")]
    s.rows = [{"JobID": "1"}, {"JobID": "2", "tres-per-job": "gres:gpu:8"}]
    first = s.queue()
    assert s.ran == ["json"] and [j.job_id for j in first] == [1, 2]
    # job 1 released and started on one node; job 2 pinned to two nodes, balanced, and started
    s.rows = [{"JobID": "1", "State": "RUNNING", "PriorityLong": "4294901757", "Reason": "None", "NodeList": "node3",
               "StartTime": "2026-11-26T20:23:41", "BatchHost": "node3", "ReqNodes": "node3"},
              {"JobID": "2", "State": "RUNNING", "Reason": "None", "NodeList": "node[1-2]", "NumNodes": "2",
               "tres-per-job": "N/A", "tres-per-node": "gres:gpu:4", "PriorityLong": "5",
               "Comment": "rlsched:model=LM S0000 E1111\nmore text"}]
    a, b = s.queue()
    assert s.ran == ["json", "text"]
    assert a.running and a.nodes == ["node3"] and a.gpus_per_node == {"node3": 4} and not a.held
    assert a.start_time is not None and a.batch_host == "node3" and a.admin_comment == "rlsched:managed gpus=4"
    assert b.gpus == 8 and b.gpus_per_node == {"node1": 4, "node2": 4} and b.comment.endswith("more text")
    assert b.tres_style == "gres:gpu" and b.name == "j2" and b.time_limit_s == 3600.0
    # an uneven split over several nodes is only in the JSON; so is a new job
    s.rows[1].update({"tres-per-job": "gres:gpu:8", "tres-per-node": "N/A"})
    s.queue()
    assert s.ran[-1] == "json"
    s.json_jobs.append(_json_job(3))
    s.rows = [{"JobID": "1"}, {"JobID": "2"}]
    s.queue()
    assert s.ran[-1] == "text"
    s.rows.append({"JobID": "3"})
    assert [j.job_id for j in s.queue()] == [1, 2, 3] and s.ran[-1] == "json"


def test_an_uneven_start_is_read_for_that_job_alone_through_libslurm():
    from controller.libslurm import JobDetail

    class Lib:
        job_info = (904, {})

        def __init__(self) -> None:
            self.asked: list[int] = []
            self.answer = JobDetail(2, "RUNNING", "node[1-2]", 0, ("gpu:6(IDX:0-5)", "gpu:2(IDX:0-1)"))

        def job_detail(self, job_id):
            self.asked.append(job_id)
            return self.answer

    s = TextSlurm()
    s._lib, s._lib_tried = Lib(), True
    s.json_jobs = [_json_job(1), _json_job(2, tres_per_job="gres:gpu:8", admin_comment="rlsched:managed gpus=8")]
    s.rows = [{"JobID": "1"}, {"JobID": "2", "tres-per-job": "gres:gpu:8"}]
    s.queue()
    s.rows[1].update({"State": "RUNNING", "NodeList": "node[1-2]", "NumNodes": "2", "Reason": "None"})
    _, b = s.queue()
    assert s.ran == ["json", "text"] and s._lib.asked == [2] and s.detail_reads == 1
    assert b.running and b.gpus_per_node == {"node1": 6, "node2": 2} and b.name == "j2"
    s.rows[1]["PriorityLong"] = "7"  # a later change of its row keeps the split read
    _, b2 = s.queue()
    assert s.ran[-1] == "text" and s._lib.asked == [2] and b2.gpus_per_node == b.gpus_per_node
    # an answer that is not the allocation the text shows (it was requeued and started again in between)
    s.rows[1].update({"NodeList": "node[3-4]", "RestartCnt": "1"})
    s.queue()
    assert s._lib.asked == [2, 2] and s.ran[-1] == "json"


def test_libslurm_placements_overlap_unless_one_is_an_uneven_split():
    import threading

    from controller.libslurm import LibSlurmError

    class Lib:
        def __init__(self, meet: int) -> None:
            self.meet = threading.Barrier(meet, timeout=10) if meet > 1 else None
            self.lock = threading.Lock()
            self.order: list[int] = []
            self.busy = self.most = 0

        def update(self, up):
            with self.lock:
                self.order.append(up.job_id)
                self.busy += 1
                self.most = max(self.most, self.busy)
            try:
                if self.meet is not None:
                    self.meet.wait()  # returns only once that many updates are in flight together
                if up.job_id == 13:
                    raise LibSlurmError("update of job 13", 2017, "Invalid job id specified")
            finally:
                with self.lock:
                    self.busy -= 1

    s = SlurmCLI("/etc/slurm/slurm.conf", rpc_workers=4)
    balanced = [(j, ["node1", "node2"], 8, 4, "gres:gpu", 0) for j in (11, 12, 13, 14)]
    s._lib, s._lib_tried = Lib(4), True
    res = s.pin_release_many(balanced)
    assert res[:2] == [None, None] and res[3] is None and "Invalid job id" in str(res[2])
    assert s._lib.most == 4 and sorted(s._lib.order) == [11, 12, 13, 14]
    s._lib = Lib(1)
    res = s.pin_release_many(balanced[:2] + [(15, ["node3", "node4"], 9, None, "gres:gpu", 0)] + balanced[2:])
    assert s._lib.order == [11, 12, 15, 13, 14] and s._lib.most == 1
    assert [r is None for r in res] == [True, True, True, False, True]


def test_the_periodic_json_read_is_made_behind_the_round(tmp_path):
    s = TextSlurm()
    s.json_jobs = [_json_job(1)]
    s.rows = [{"JobID": "1"}]
    s.queue()
    assert not s.refresh_due(1.0) and s.refresh_due(s.full_read_s)
    s.refresh()
    s.queue()
    assert s.ran == ["json", "json", "text"] and s.queue_reads == {"json": 2, "text": 1}

    class Due(BatchSlurm):
        def __init__(self) -> None:
            super().__init__()
            self.due, self.refreshed = [], 0

        def refresh_due(self, ahead_s):
            self.due.append(ahead_s)
            return len(self.due) == 2

        def refresh(self):
            self.refreshed += 1

    d = Due()
    ctl, _ = _round(tmp_path, d)  # not due: nothing behind the round
    assert d.refreshed == 0
    ctl.round()
    ctl.wait_reasons()
    assert d.refreshed == 1 and d.due == [2 * ctl.cfg.controller.interval_s] * 2


def test_queue_keeps_the_admin_comments_it_wrote_and_reads_json_when_stale(monkeypatch):
    s = TextSlurm()
    s.json_jobs = [_json_job(1)]
    s.rows = [{"JobID": "1"}]
    s.queue()
    s.set_admin_comment([1], "rlsched:managed gpus=4 | rlsched: waiting for placement, position 1 of 1")
    (j,) = s.queue()
    assert s.ran[-1] == "text" and j.admin_comment.endswith("position 1 of 1") and j.managed
    s.full_read_s = 0.0
    s.queue()
    assert s.ran[-1] == "json"


def test_queue_gives_the_same_job_for_an_unchanged_row_and_a_new_one_for_any_change():
    s = TextSlurm()
    s.json_jobs = [_json_job(1), _json_job(2)]
    s.rows = [{"JobID": "1"}, {"JobID": "2"}]
    s.queue()
    a1, b1 = s.queue()
    a2, b2 = s.queue()
    assert s.ran == ["json", "text", "text"] and a2 is a1 and b2 is b1
    # a changed row, and a job whose admin comment the adapter wrote, read anew; the other stays
    s.rows[0].update({"State": "RUNNING", "NodeList": "node3", "StartTime": "2026-11-26T20:23:41"})
    s.set_admin_comment([2], "rlsched:managed gpus=4 | rlsched: placed")
    a3, b3 = s.queue()
    assert a3 is not a1 and a3.running and a3.nodes == ["node3"]
    assert a3.start_time == time.mktime((2026, 11, 26, 20, 23, 41, 0, 0, -1))
    assert b3 is not b1 and b3.admin_comment.endswith("rlsched: placed") and b3.state == "PENDING"
    a4, b4 = s.queue()
    assert a4 is a3 and b4 is b3
    # a row with a wrong field count, whatever the job's last row was: the listing is not what was asked
    # for, so this read and every later one are squeue --json
    run = s.run
    s.run = lambda args, stdin=None: run(args, stdin) if "--json" in args else run(args, stdin).replace("JobHeldUser", "JobHeldUser" + args[5].split(":")[2].split(",")[0], 1)  # type: ignore[method-assign]
    del s.ran[:]
    assert [j.job_id for j in s.queue()] == [1, 2] and [j.job_id for j in s.queue()] == [1, 2]
    assert s.ran == ["text", "json", "json"]


def test_job_reads_a_known_job_alone_as_its_text_row_and_any_other_from_json():
    """SlurmCLI.job(): a job of the last JSON read comes from its own text row (the requeue wait polls it
    each 0.2 s; a whole-queue JSON read per poll costs 0.3-1.1 s at 1,000 jobs); an unknown job, or a row
    the text cannot describe, from squeue --json."""
    s = TextSlurm()
    s.json_jobs = [_json_job(1), _json_job(2, job_state="RUNNING", nodes="node1", priority=4294901757)]
    s.rows = [{"JobID": "1"}, {"JobID": "2", "State": "RUNNING", "PriorityLong": "4294901757", "NodeList": "node1",
                                "Reason": "None"}]
    s.queue()
    # job 2 requeued: held at once, still completing on node1
    s.rows[1].update({"State": "COMPLETING", "PriorityLong": "0"})
    del s.ran[:]
    j = s.job(2)
    assert s.ran == ["text"] and (j.job_id, j.state, j.priority) == (2, "COMPLETING", 0) and j.requeued_completing
    s.rows[1].update({"State": "PENDING", "NodeList": "", "Reason": "JobHeldUser"})
    j = s.job(2)
    assert s.ran == ["text", "text"] and j.pending and j.held and not j.requeued_completing
    # a job the last JSON read did not have: JSON (None: Slurm does not know it either)
    assert s.job(3) is None and s.ran == ["text", "text", "json"]


def test_text_times_are_local_epoch_seconds():
    from controller.slurm import _text_time

    for t in ("2026-11-26T20:23:41", "2027-01-01T00:00:00", "2026-07-31T23:59:59"):
        assert _text_time(t) == time.mktime(time.strptime(t, "%Y-%m-%dT%H:%M:%S"))
    for t in ("N/A", "Unknown", "None", "2026-13-45T99:99:99", "2026-11-26T20:23:41Z"):
        assert _text_time(t) is None


def test_text_rows_with_a_wrong_field_count_are_an_error():
    with pytest.raises(ValueError, match="fields"):
        parse_squeue_text("1SxPENDINGEy\n", "Sx", "Ey")
    with pytest.raises(ValueError, match="complete row"):
        parse_squeue_text("1Sx2", "Sx", "Ey")
    assert parse_squeue_text("", "Sx", "Ey") == []


def test_reason_updates_run_side_by_side_and_report_each_failure():
    s = TextSlurm()
    s.json_jobs = [_json_job(1), _json_job(2), _json_job(3)]
    s.rows = [{"JobID": "1"}, {"JobID": "2"}, {"JobID": "3"}]
    s.queue()
    run = s.run

    def refusing(args, stdin=None):
        if args[0] == "scontrol" and "JobId=2" in args:
            raise SlurmError(list(args), "exit status 1: Invalid job id specified")
        return run(args, stdin)

    s.run = refusing  # type: ignore[method-assign]
    groups = [(f"rlsched:managed gpus=4 | rlsched: waiting for placement, position {i} of 3", [i]) for i in (1, 2, 3)]
    out = s.set_admin_comments(groups)
    assert out[0] is None and isinstance(out[1], SlurmError) and out[2] is None
    got = {j.job_id: j.admin_comment for j in s.queue()}
    assert got[1].endswith("position 1 of 3") and got[2] == "rlsched:managed gpus=4" and got[3].endswith("3 of 3")


# --------------------------------------------------------------------------- the node read
#: ``sinfo -h -N -a -O NodeList:|,PartitionName:|,StateComplete:|,Gres:|,GresUsed:|,CPUs:|,Memory:#`` on this
#: machine's slurmctld 22.05.8 (local-cluster.sh, node2 drained, a job of 2 GPUs on node4), and the JSON
#: sinfo --json gave at the same time for those nodes; node7 (two partitions, typed GRES, not responding,
#: no memory configured) is made up in both forms
SINFO_TEXT = ("node1|gpu|idle|gpu:8|gpu:0|32|64000#\nnode2|gpu|idle+drain|gpu:8|gpu:0|32|64000#\n"
              "node4|gpu|mixed|gpu:8|gpu:2|32|64000#\nnode7|gpu|mixed+drain+not_responding|gpu:v100:4(S:0-1)|"
              "gpu:v100:1(IDX:0)|16|1#\nnode7|other|mixed+drain+not_responding|gpu:v100:4(S:0-1)|gpu:v100:1(IDX:0)|16|1#\n")
SINFO_JSON = {"nodes": [
    {"name": "node1", "state": "idle", "state_flags": [], "gres": "gpu:8", "gres_used": "gpu:0", "partitions": ["gpu"],
     "cpus": 32, "real_memory": 64000},
    {"name": "node2", "state": "idle", "state_flags": ["DRAIN"], "gres": "gpu:8", "gres_used": "gpu:0",
     "partitions": ["gpu"], "cpus": 32, "real_memory": 64000},
    {"name": "node4", "state": "mixed", "state_flags": [], "gres": "gpu:8", "gres_used": "gpu:2", "partitions": ["gpu"],
     "cpus": 32, "real_memory": 64000},
    {"name": "node7", "state": "mixed", "state_flags": ["DRAIN", "NOT_RESPONDING"], "gres": "gpu:v100:4(S:0-1)",
     "gres_used": "gpu:v100:1(IDX:0)", "partitions": ["gpu", "other"], "cpus": 16, "real_memory": 1}]}


def test_sinfo_text_gives_the_nodes_sinfo_json_gives():
    text = parse_sinfo_text(SINFO_TEXT.replace("|", "Sx").replace("#", "Ey"), "Sx", "Ey")
    assert text == parse_sinfo_json(json.dumps(SINFO_JSON))
    n7 = text[-1]
    assert (n7.partitions, n7.gpu_type, n7.gpus, n7.gpus_used, n7.mem_gb) == (("gpu", "other"), "v100", 4, 1, None)
    assert not text[1].usable and not n7.usable and text[0].usable
    with pytest.raises(ValueError, match="fields"):
        parse_sinfo_text("node1SxgpuEy\n", "Sx", "Ey")
    with pytest.raises(ValueError, match="complete row"):
        parse_sinfo_text('{"nodes": []}', "Sx", "Ey")


def test_nodes_read_sinfo_text_and_json_where_the_text_is_not_what_was_asked():
    class Answers(SlurmCLI):
        def __init__(self, text_ok: bool) -> None:
            super().__init__()
            self.text_ok, self.ran = text_ok, []

        def run(self, args, stdin=None):
            self.ran.append(args[1])
            if args[1] == "--json":
                return json.dumps(SINFO_JSON)
            assert args[:5] == ["sinfo", "-h", "-N", "-a", "-O"], args
            fmt = args[5].split(",")
            sep, end = fmt[0].split(":", 1)[1], fmt[-1].split(":", 1)[1]
            return SINFO_TEXT.replace("|", sep).replace("#", end) if self.text_ok else json.dumps(SINFO_JSON)

    ok, wrapped = Answers(True), Answers(False)
    want = parse_sinfo_json(json.dumps(SINFO_JSON))
    assert ok.nodes() == want and ok.nodes() == want and ok.ran == ["-h", "-h"]
    assert wrapped.nodes() == want and wrapped.nodes() == want and wrapped.ran == ["-h", "--json", "--json"]


# --------------------------------------------------------------------------- pin and release in one RPC (libslurm)
class OneRpcSlurm(BatchSlurm):
    """BatchSlurm with ``pin_release_many`` as SlurmCLI has it with libslurm: each pin and its release in one
    call. ``refuse``: job ids Slurm refuses (left held); ``unsure``: job ids whose call gets no answer (applied
    all the same)."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.refuse: set[int] = set()
        self.unsure: set[int] = set()

    def pin_release_many(self, pins):
        if not pins:
            return []
        ids = [int(p[0]) for p in pins]
        self.batches.append(("pin_release_many", ids))
        recorded = json.loads(self.journal.read_text())["released"]
        assert all(str(j) in recorded for j in ids), "released before the journal recorded it"
        out = []
        for job_id, nodes, gpus, per_node, _style, delay_s in pins:
            if job_id in self.refuse:
                out.append(SlurmError(["slurm_update_job"], "Invalid node name specified"))
                continue
            j = self.job_list[job_id]
            assert gpus == j.gpus and j.priority == 0, "released twice"
            j.required_nodes, j.num_nodes, self.per_node[job_id] = list(nodes), len(nodes), per_node
            self.delays[job_id] = delay_s
            j.priority, j.reason = 1000, "None"
            out.append(SlurmError(["slurm_update_job"], "Socket timed out", timed_out=True)
                       if job_id in self.unsure else None)
        return out


def test_with_libslurm_each_placement_is_one_call_after_one_journal_write(tmp_path):
    s = OneRpcSlurm()
    ids = [s.submit(g, comment="rlsched:model=GNN") for g in (4, 4, 8)]
    ctl, rep = _round(tmp_path, s)
    assert sorted(j for j, _ in rep.placed) == ids
    assert s.batches == [("pin_release_many", ids)]  # no scontrol pins, no scontrol release
    assert all(str(j) in ctl.journal["released"] for j in ids) and not any(s.job_list[j].held for j in ids)


def test_with_libslurm_a_refused_placement_stays_held_and_an_unanswered_one_keeps_its_gpus(tmp_path):
    s = OneRpcSlurm()
    a, b, c = (s.submit(g, comment="rlsched:model=GNN") for g in (8, 8, 8))
    s.refuse, s.unsure = {a}, {b}
    ctl, rep = _round(tmp_path, s)
    assert [j for j, _ in rep.placed] == [c]
    assert s.job_list[a].held and str(a) not in ctl.journal["released"]
    assert str(b) in ctl.journal["released"]  # may have been released: its entry reserves its GPUs
    assert ctl.metrics.value("rlsched_slurm_errors_total") == 2


# --------------------------------------------------------------------------- splits Slurm applies exactly
class FillSlurm(OneRpcSlurm):
    """Slurm 22.05's cons_tres split (controller.slurm.cons_tres_split) for TresPerJob placements."""

    fills_splits = True

    def schedule(self, now: float = 2000.0) -> None:
        from controller.slurm import cons_tres_split

        names = [n.name for n in self.node_list]
        for j in sorted(self.job_list.values(), key=lambda x: x.job_id):
            if j.state != "PENDING" or j.priority == 0 or not j.required_nodes:
                continue
            free = [n.gpus - n.gpus_used for n in self.node_list]
            got = cons_tres_split([names.index(x) for x in j.required_nodes], j.gpus, free, self.per_node.get(j.job_id))
            if got is None:
                continue
            split = {names[k]: g for k, g in got.items()}
            for n in self.node_list:
                n.gpus_used += split.get(n.name, 0)
            j.state, j.nodes, j.gpus_per_node, j.start_time = "RUNNING", list(split), split, now


def _fill_ctl(tmp_path, *gpus):
    """A controller over FillSlurm whose policy is built (one empty round), and held jobs of ``gpus``."""
    s = FillSlurm()
    ctl = _ctl(tmp_path, s, policy="fifo")
    s.journal = ctl.journal.path
    ctl.round()
    return s, ctl, [s.submit(g, comment="rlsched:model=GNN") for g in gpus]


def test_an_uneven_split_is_sent_as_the_split_slurm_gives_and_starts_exactly(tmp_path):
    from policies.cluster import Placement
    from policies.state import Decision

    s, ctl, (a, b) = _fill_ctl(tmp_path, 9, 8)
    ctl.policy.schedule = lambda state: Decision(place=[(str(a), Placement.of({0: 1, 1: 8})),
                                                        (str(b), Placement.of({2: 4, 3: 4}))])
    rep = ctl.round()
    plans = dict(rep.placed)
    assert plans[a] == {"node1": 8, "node2": 1}  # same nodes and total, Slurm's split
    assert plans[b] == {"node3": 4, "node4": 4}  # balanced: as planned
    assert ctl.metrics.value("rlsched_decisions_total", action="split_set") == 1
    s.schedule()
    assert {j: s.job_list[j].gpus_per_node for j in (a, b)} == plans
    ctl.round()
    assert ctl.metrics.value("rlsched_placement_mismatch_total") == 0


def test_a_split_that_depends_on_which_job_starts_or_ends_first_waits_a_round(tmp_path):
    from policies.cluster import Placement
    from policies.state import Decision

    s, ctl, (a, b) = _fill_ctl(tmp_path, 10, 6)
    # a: 2 GPUs of node1 and all of node2; b: the other 6 of node1. Were a to start first, Slurm would give
    # it 8 GPUs of node1 (one per node, then node order), and b could not start.
    decision = Decision(place=[(str(a), Placement.of({0: 2, 1: 8})), (str(b), Placement.of({0: 6}))])
    ctl.policy.schedule = lambda state: decision
    rep = ctl.round()
    assert [j for j, _ in rep.placed] == [b] and s.job_list[a].held
    assert ctl.metrics.value("rlsched_decisions_total", action="split_deferred") == 1
    s.schedule()  # b starts: were it to end before a starts, Slurm would give a 8 GPUs of node1
    decision = Decision(place=[(str(a), Placement.of({0: 2, 1: 8}))])
    rep = ctl.round()
    assert rep.placed == [] and s.job_list[a].held
    assert ctl.metrics.value("rlsched_decisions_total", action="split_deferred") == 2
    s.finish(b)  # nothing beside a on its nodes: its split is Slurm's whatever starts or ends
    rep = ctl.round()
    assert dict(rep.placed) == {a: {"node1": 8, "node2": 2}}
    assert ctl.metrics.value("rlsched_decisions_total", action="split_set") == 1
    s.schedule()
    assert s.job_list[a].gpus_per_node == {"node1": 8, "node2": 2}
