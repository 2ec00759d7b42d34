"""Per-uid limits on the agent's Slurm lookups (a user naming many unknown job ids must not starve the agent).

Every report naming a job the agent has not cached runs ``squeue`` (up to 10 s) in one of the agent's
gRPC worker threads. Tests: a fake lookup blocking on an Event shows a uid over its in-flight limit is
refused at once while other uids and cached jobs still get through; a token bucket bounds the rate;
"Slurm does not know this job" is cached per uid; over gRPC the refusal is RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_helpers import NODE, ClientFor, uid_agent

from nodeagent.auth import SharedKeyAuthenticator
from nodeagent.client import AgentError
from nodeagent.server import NodeAgentServer
from nodeagent.slurmjob import LookupLimited, SlurmJobInfo, SlurmJobs, SlurmUnavailable
from proto import rlsched_agent_pb2 as pb

REPO = Path(__file__).resolve().parents[1]
WAIT_S = 10.0  # upper bound on waits for threads that are already running: never reached when all is well


class _Clock:
    """Frozen clock (seconds) the test moves by hand: TTLs and token refills without sleeping."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class BlockingSlurm:
    """A lookup: job id -> owner uid; ids in ``blocking`` wait for ``release`` (a slow squeue). Records calls."""

    def __init__(self, jobs: dict[str, int] | None = None, blocking: set[str] | None = None) -> None:
        self.jobs = dict(jobs or {})
        self.blocking = set(blocking or ())
        self.release = threading.Event()
        self.calls: list[str] = []
        self.down = False
        self._lock = threading.Lock()
        self._entered = threading.Condition(self._lock)
        self.in_lookup = 0

    def __call__(self, sid: str) -> SlurmJobInfo | None:
        with self._lock:
            self.calls.append(sid)
            self.in_lookup += 1
            self._entered.notify_all()
        try:
            if sid in self.blocking:
                assert self.release.wait(WAIT_S), "test never released the blocked lookup"
            if self.down:
                raise SlurmUnavailable("Unable to contact slurm controller")
            uid = self.jobs.get(sid)
            return None if uid is None else SlurmJobInfo(job_id=sid, uid=uid, state="RUNNING")
        finally:
            with self._lock:
                self.in_lookup -= 1

    def wait_in_lookup(self, n: int) -> None:
        """Until ``n`` lookups are running (blocked) at once."""
        with self._lock:
            assert self._entered.wait_for(lambda: self.in_lookup >= n, WAIT_S), f"{n} lookups never started"


def _in_thread(fn: object, *args: object) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def go() -> None:
        try:
            out["value"] = fn(*args)  # type: ignore[operator]
        except BaseException as exc:  # noqa: BLE001 -- handed to the test
            out["error"] = exc

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t, out


# ------------------------------------------------------------------ SlurmJobs


def test_uid_over_its_in_flight_limit_is_refused_at_once_others_and_cached_jobs_are_not() -> None:
    slurm = BlockingSlurm({"101": 1000, "102": 1000, "103": 1000, "201": 1000, "301": 2000},
                          blocking={"101", "102"})
    jobs = SlurmJobs(slurm, clock=_Clock(), max_lookups_per_uid=2)
    assert jobs.job("201", uid=1000).uid == 1000  # cached from now on
    threads = [_in_thread(lambda sid: jobs.job(sid, uid=1000), sid) for sid in ("101", "102")]
    try:
        slurm.wait_in_lookup(2)  # uid 1000 has two squeues hanging
        with pytest.raises(LookupLimited, match=r"uid 1000 already has 2 Slurm job lookups in flight .*limit 2 "
                                                r"per uid") as e:
            jobs.job("103", uid=1000)
        assert e.value.uid == 1000 and "103" not in slurm.calls, "refused without asking Slurm"
        with pytest.raises(LookupLimited):
            jobs.job("101", fresh=True, uid=1000)  # fresh means asking Slurm: limited too
        assert jobs.job("201", uid=1000).uid == 1000, "a cached job is never limited"
        assert jobs.job("301", uid=2000).uid == 2000, "another uid still gets through"
        assert jobs.job("103").uid == 1000, "no uid (privileged caller, the agent itself): not limited"
    finally:
        slurm.release.set()
        for t, _ in threads:
            t.join(WAIT_S)
    assert [out["value"].job_id for _, out in threads] == ["101", "102"]
    assert jobs.job("104", uid=1000) is None, "slots are given back when the lookups end"
    assert "104" in slurm.calls


def test_all_uids_together_are_capped_so_workers_stay_free_for_the_controller() -> None:
    """Per-uid limits alone would let 8 users hold all 16 workers: lookups for unprivileged callers are
    also capped in all (``max_lookups_total``); privileged callers (no uid) are not."""
    slurm = BlockingSlurm({"101": 1000, "102": 1001, "103": 1002, "104": 1003}, blocking={"101", "102", "103"})
    jobs = SlurmJobs(slurm, clock=_Clock(), max_lookups_total=3)
    threads = [_in_thread(lambda sid, u: jobs.job(sid, uid=u), sid, u)
               for sid, u in (("101", 1000), ("102", 1001), ("103", 1002))]
    try:
        slurm.wait_in_lookup(3)
        with pytest.raises(LookupLimited, match=r"3 Slurm job lookups for unprivileged callers .*limit 3 in all"):
            jobs.job("104", uid=1003)
        assert "104" not in slurm.calls
        assert jobs.job("104").uid == 1003, "no uid (privileged): not limited"
    finally:
        slurm.release.set()
        for t, _ in threads:
            t.join(WAIT_S)
    assert jobs.job("105", uid=1003) is None, "slots are given back"


def test_failing_lookups_give_their_slot_back() -> None:
    slurm = BlockingSlurm({"101": 1000})
    jobs = SlurmJobs(slurm, clock=_Clock(), max_lookups_per_uid=1, failure_ttl_s=0.0)
    slurm.down = True
    for sid in ("1", "2", "3"):
        with pytest.raises(SlurmUnavailable):
            jobs.job(sid, uid=1000)
    slurm.down = False
    assert jobs.job("101", uid=1000).uid == 1000


def test_token_bucket_bounds_the_rate_of_lookups_per_uid() -> None:
    slurm = BlockingSlurm({"7": 1000})
    clock = _Clock()
    jobs = SlurmJobs(slurm, clock=clock, lookup_burst=3, lookup_rate_per_s=0.5)
    assert jobs.job("7", uid=1000).uid == 1000
    assert jobs.job("8", uid=1000) is None and jobs.job("9", uid=1000) is None  # burst of 3 used
    with pytest.raises(LookupLimited, match=r"uid 1000 asked Slurm about too many jobs .*limit 3 at once, then "
                                            r"0\.5 per second per uid.*next lookup in 2\.0s"):
        jobs.job("10", uid=1000)
    assert slurm.calls == ["7", "8", "9"]
    assert jobs.job("7", uid=1000).uid == 1000 and jobs.job("8", uid=1000) is None, "cached: not limited"
    assert jobs.job("10", uid=2000) is None, "another uid has its own bucket"
    assert jobs.job("11") is None, "no uid: not limited"
    clock.t += 1.0  # half a token
    with pytest.raises(LookupLimited, match=r"next lookup in 1\.0s"):
        jobs.job("10", uid=1000)
    clock.t += 1.0  # one token
    assert jobs.job("10", uid=1000) is None, "the refused lookup was not cached: it is made now"
    with pytest.raises(LookupLimited):
        jobs.job("12", uid=1000)
    assert slurm.calls == ["7", "8", "9", "10", "11", "10"]


def test_unknown_jobs_are_cached_per_uid() -> None:
    slurm = BlockingSlurm()
    clock = _Clock()
    jobs = SlurmJobs(slurm, clock=clock, missing_ttl_s=10.0)
    assert jobs.job("999", uid=1000) is None
    assert jobs.job("999", uid=1000) is None and slurm.calls == ["999"], "asked once"
    # per uid: user 1000 naming job 999 before it is submitted cannot make it look absent to its owner
    slurm.jobs["999"] = 2000
    assert jobs.job("999", uid=2000).uid == 2000 and slurm.calls == ["999", "999"]
    slurm.jobs["998"] = 1000
    assert jobs.job("998", uid=1000).uid == 1000
    del slurm.jobs["998"]  # positive answers stay cached for cache_ttl_s, for everyone
    assert jobs.job("998", uid=2000).uid == 1000
    assert jobs.job("997", uid=1000) is None
    assert jobs.job("997", fresh=True, uid=1000) is None and slurm.calls.count("997") == 2, "fresh: asked again"
    clock.t += 10.5
    assert jobs.job("997", uid=1000) is None and slurm.calls.count("997") == 3, "after missing_ttl_s: asked again"
    off = SlurmJobs(slurm, clock=clock, missing_ttl_s=0.0)
    off.job("996", uid=1000)
    off.job("996", uid=1000)
    assert slurm.calls.count("996") == 2, "missing_ttl_s=0: not cached"


@pytest.mark.parametrize("kw", [dict(max_lookups_per_uid=0), dict(lookup_rate_per_s=0.0),
                                dict(lookup_rate_per_s=float("nan")), dict(lookup_burst=0),
                                dict(missing_ttl_s=-1.0), dict(missing_ttl_s=float("inf"))])
def test_bad_limits_are_refused(kw: dict) -> None:
    with pytest.raises(ValueError, match=next(iter(kw))):
        SlurmJobs(BlockingSlurm(), **kw)


# --------------------------------------------------------------- over gRPC


def _report(key: str, sid: str) -> pb.ProgressReport:
    # pid 0: no process to check, only the Slurm job's owner
    return pb.ProgressReport(job_key=key, slurm_job_id=sid, step=1, total_steps=10, samples=8, elapsed_s=1.0,
                             checkpoint_step=-1, comm_fraction=-1.0, world_size=1, pid=0)


@pytest.fixture
def limited(tmp_path: Path) -> Iterator[tuple[NodeAgentServer, BlockingSlurm, ClientFor]]:
    """An agent allowing one lookup in flight per uid, with a blocking fake slurmctld; yields (srv, slurm, client)."""
    key = SharedKeyAuthenticator.generate(tmp_path / "agent.key")
    slurm = BlockingSlurm({"101": 1000, "102": 1000, "201": 2000}, blocking={"101"})
    with uid_agent(tmp_path, key, SlurmJobs(slurm, require_cgroup=False, max_lookups_per_uid=1),
                   client_timeout=WAIT_S, client_node=NODE, max_workers=4) as (srv, client):
        try:
            yield srv, slurm, client
        finally:
            slurm.release.set()  # before the clients close and the server stops


def test_flooding_reports_get_resource_exhausted_while_others_report(limited: tuple) -> None:
    srv, slurm, client = limited
    c1000 = client(1000)
    c1000.report_progress(_report("cached", "102"))  # job 102 verified and cached
    t, out = _in_thread(c1000.report_progress, _report("slow", "101"))  # squeue for 101 hangs
    slurm.wait_in_lookup(1)
    with pytest.raises(AgentError) as e:
        c1000.report_progress(_report("flood-1", "5001"))
    assert e.value.code == "RESOURCE_EXHAUSTED", e.value
    assert "cannot verify slurm job 5001 now: uid 1000 already has 1 Slurm job lookups in flight" in e.value.details
    assert "limit 1 per uid" in e.value.details and "retry later" in e.value.details
    assert "5001" not in slurm.calls
    assert c1000.report_progress(_report("cached", "102"))["accepted"], "a verified job keeps reporting"
    assert client(2000).report_progress(_report("other", "201"))["accepted"], "another user is not starved"
    assert client(0).report_progress(_report("root-job", "9"))["accepted"], "privileged: Slurm is not asked"
    slurm.release.set()
    t.join(WAIT_S)
    assert out.get("value", {}).get("accepted"), out
    assert set(srv.tracker.jobs) == {"cached", "slow", "other", "root-job"}


def test_agent_cli_has_the_lookup_limits() -> None:
    from nodeagent.cli import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    base = ["agent", "--node", "n", "--store", "/tmp/x"]
    a = parser.parse_args(base)
    assert (a.lookups_in_flight_per_uid, a.lookup_rate_per_uid, a.lookup_burst_per_uid, a.unknown_job_ttl_s) \
        == (4, 2.0, 20, 10.0)
    d = SlurmJobs()
    assert (d.max_lookups_per_uid, d.lookup_rate_per_s, d.lookup_burst, d.missing_ttl_s) == (4, 2.0, 20, 10.0), \
        "the CLI's defaults are the library's"
    assert a.lookups_in_flight is None and d.max_lookups_total == 16 // 2, "default: half of --max-workers (16)"
    a = parser.parse_args(base + ["--lookups-in-flight-per-uid", "4", "--lookup-rate-per-uid", "0.5",
                                  "--lookup-burst-per-uid", "7", "--unknown-job-ttl-s", "0"])
    assert (a.lookups_in_flight_per_uid, a.lookup_rate_per_uid, a.lookup_burst_per_uid, a.unknown_job_ttl_s) \
        == (4, 0.5, 7, 0.0)


@pytest.mark.parametrize("extra,needle", [
    (["--lookups-in-flight-per-uid", "0"], "--lookups-in-flight-per-uid: must be an integer >= 1, got '0'"),
    (["--lookup-rate-per-uid", "inf"], "--lookup-rate-per-uid: must be a positive number, got 'inf'"),
    (["--lookup-burst-per-uid", "x"], "--lookup-burst-per-uid: expected an integer, got 'x'"),
    (["--unknown-job-ttl-s", "-1"], "--unknown-job-ttl-s: must be a number >= 0, got '-1'"),
])
def test_agent_cli_bad_lookup_limits_are_one_line_errors(tmp_path: Path, extra: list[str], needle: str) -> None:
    import subprocess

    r = subprocess.run([sys.executable, "-m", "rlsched.cli", "agent", "--node", "n", "--store", str(tmp_path),
                        *extra], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert needle in r.stderr.strip().splitlines()[-1], r.stderr


def test_agent_help_shows_its_examples_as_written(capsys) -> None:
    """`rlsched agent --help` shows the module docstring's examples line by line: no backslash-newline joins
    two of them with a run of spaces ("…/rlsched                   --auth")."""
    import re

    from rlsched.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["agent", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert not re.search(r"\S {3,}--auth", out), out
    assert re.search(r"--store hdfs://nn:9870/rlsched \\\n +--auth sharedkey:/etc/rlsched/agent.key\n", out), out


@pytest.mark.parametrize("where,why", [
    ("afile/k", "{tmp}/afile is not a directory"),
    ("afile/a/b/k", "{tmp}/afile is not a directory"),
    ("missing/k", "its folder {tmp}/missing does not exist"),
])
def test_agent_keygen_names_the_path_it_cannot_create(tmp_path: Path, capsys, where: str, why: str) -> None:
    """`agent-keygen /etc/hostname/k` names the path and why, not a raw "[Errno 20] Not a directory"."""
    from rlsched.cli import main

    (tmp_path / "afile").write_text("")
    path = tmp_path / where
    assert main(["agent-keygen", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == f"rlsched agent-keygen: error: {path}: cannot create the key file: {why.format(tmp=tmp_path)}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_agent_keygen_leaves_no_half_written_key(tmp_path: Path, capsys, monkeypatch) -> None:
    """A key file made but not written (a full disk) is removed: none rather than an empty key."""
    import errno

    from nodeagent import auth
    from rlsched.cli import main

    def full(_n: int) -> str:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(auth.secrets, "token_hex", full)
    key = tmp_path / "agent.key"
    assert main(["agent-keygen", str(key)]) == 2
    assert capsys.readouterr().err == (f"rlsched agent-keygen: error: {key}: cannot create the key file: "
                                       "No space left on device\n")
    assert not key.exists()
    monkeypatch.undo()
    assert main(["agent-keygen", str(key)]) == 0 and len(key.read_text().strip()) == 64
    assert main(["agent-keygen", str(key)]) == 2  # never overwritten, never removed
    assert "already exists" in capsys.readouterr().err and len(key.read_text().strip()) == 64
