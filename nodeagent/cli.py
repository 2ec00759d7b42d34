r"""``rlsched agent``: run the node agent (gRPC) beside slurmd.

    rlsched agent --node node1 --listen 127.0.0.1:50051 --store /shared/ckpt --auth munge
    rlsched agent --node node1 --listen 127.0.0.1:50051 --store hdfs://nn:9870/rlsched \
                  --auth sharedkey:/etc/rlsched/agent.key
    rlsched agent-keygen /etc/rlsched/agent.key     # new 0600 shared key (the root key)
    rlsched agent-jobkey write --key /etc/rlsched/agent.key --dir /run/rlsched/jobkeys   # Slurm Prolog
    rlsched agent-jobkey remove --dir /run/rlsched/jobkeys                               # Slurm Epilog

Logs are JSON lines on stderr (one object per event).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import signal
import sys
import threading

from rlsched.argtypes import int_at_least, int_in_range, non_negative_float, positive_float

#: Largest uid: uid_t is 32 bits and (uid_t)-1 = 2**32 - 1 means "no uid" (setreuid, chown).
MAX_UID = 2**32 - 2


def _fail(cmd: str, msg: str) -> int:
    """One-line user error, exit status 2 (the rlsched CLI convention)."""
    print(f"rlsched {cmd}: error: {msg}", file=sys.stderr)
    return 2


def _listen(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not (port.isascii() and port.isdigit() and len(port) <= 5) or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"--listen must be HOST:PORT, got {value!r}")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("agent", help="run the rlsched node agent (gRPC, profiling, checkpoint preemption)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--node", required=True, help="Slurm node name this agent serves")
    p.add_argument("--listen", type=_listen, default="127.0.0.1:50051", help="HOST:PORT to serve gRPC on")
    p.add_argument("--store", required=True, help="checkpoint store: DIR, file:///DIR or hdfs://NAMENODE:PORT/PATH")
    p.add_argument("--auth", default="munge", help="munge | munge:SOCKET | sharedkey:/path/key (default munge)")
    p.add_argument("--allow-uid", type=int_in_range(0, MAX_UID), action="append", default=[],
                   help="extra UID allowed to call Preempt (root and SlurmUser always are)")
    p.add_argument("--slurm-conf", default="/etc/slurm/slurm.conf",
                   help="slurm.conf: SlurmUser (munge auth) and the cluster squeue asks (if the file exists)")
    p.add_argument("--squeue", default="squeue",
                   help="squeue binary used to check that a reporting user owns the Slurm job (default: from PATH)")
    p.add_argument("--job-cgroups", choices=("auto", "required", "ignore"), default="auto",
                   help="require reporting processes to be in their Slurm job's cgroup: auto = once job cgroups "
                        "are seen on this machine (default)")
    p.add_argument("--profile-steps", type=int_at_least(1), default=20,
                   help="steps in a job's isolated-throughput profiling window")
    p.add_argument("--profile-skip-steps", type=int_at_least(0), default=10,
                   help="steps of each run to skip (start-up, warm-up) before the profiling window")
    p.add_argument("--window-s", type=positive_float, default=30.0, help="seconds of reports for achieved throughput")
    p.add_argument("--max-workers", type=int_at_least(1), default=16, help="gRPC worker threads")
    p.add_argument("--lookups-in-flight-per-uid", type=int_at_least(1), default=4,
                   help="squeue lookups (of jobs not cached) one unprivileged uid may have running at once; "
                        "more are refused at once with RESOURCE_EXHAUSTED (default 4)")
    p.add_argument("--lookups-in-flight", type=int_at_least(1), default=None,
                   help="such lookups of all unprivileged uids together (default: half of --max-workers, so "
                        "the controller's calls always find a free worker)")
    p.add_argument("--lookup-rate-per-uid", type=positive_float, default=2.0,
                   help="squeue lookups per second one unprivileged uid may cause, after its burst (default 2)")
    p.add_argument("--lookup-burst-per-uid", type=int_at_least(1), default=20,
                   help="squeue lookups one unprivileged uid may cause at once before its rate applies (default 20)")
    p.add_argument("--unknown-job-ttl-s", type=non_negative_float, default=10.0,
                   help="seconds a uid's lookup of a job Slurm does not know is remembered (0: not; default 10)")
    p.add_argument("--caller-rate", type=positive_float, default=100.0,
                   help="authenticated calls per second one caller (uid, or job with a per-job key) may make after "
                        "its burst; more are refused with RESOURCE_EXHAUSTED (default 100)")
    p.add_argument("--caller-burst", type=int_at_least(1), default=500,
                   help="authenticated calls one caller may make at once before its rate applies (default 500)")
    p.add_argument("--preempts-per-caller", type=int_at_least(1), default=16,
                   help="preemptions one caller may have running at once (default 16)")
    p.set_defaults(func=run_agent)

    k = sub.add_parser("agent-keygen", help="create a shared key file (mode 0600) for --auth sharedkey:PATH")
    k.add_argument("path")
    k.set_defaults(func=run_keygen)

    j = sub.add_parser("agent-jobkey", help="write or remove a job's per-job key (Slurm Prolog / Epilog, as root)",
                       description="Per-job keys for hosts without MUNGE (docs/AGENT.md, Authentication): the "
                                   "Prolog writes DIR/<job id>.key, mode 0400, owned by the job's user, derived "
                                   "from the root key; jobs use RLSCHED_AUTH=jobkey:DIR; the Epilog removes it. "
                                   "Job id, uid and gid default to Slurm's SLURM_JOB_ID, SLURM_JOB_UID and "
                                   "SLURM_JOB_GID.")
    j.add_argument("action", choices=("write", "remove"))
    j.add_argument("--dir", required=True, help="directory of per-job keys (root's, not group/other-writable)")
    j.add_argument("--key", help="the root key file (write only; the agents' and controller's sharedkey:PATH)")
    j.add_argument("--job", default=os.environ.get("SLURM_JOB_ID"), help="Slurm job id (default $SLURM_JOB_ID)")
    j.add_argument("--uid", type=int_in_range(0, MAX_UID), default=None,
                   help="the job's user id (default $SLURM_JOB_UID)")
    j.add_argument("--gid", type=int_in_range(0, MAX_UID), default=None,
                   help="the job's group id (default $SLURM_JOB_GID)")
    j.set_defaults(func=run_jobkey)


def _json_logging() -> None:
    root = logging.getLogger("nodeagent")
    if not any(getattr(h, "_rlsched_json", False) for h in root.handlers):
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(logging.Formatter('{"ts":"%(asctime)s","level":"%(levelname)s","msg":%(message)s}'))
        h._rlsched_json = True  # type: ignore[attr-defined]
        root.addHandler(h)
        root.setLevel(logging.INFO)
        root.propagate = False


def run_agent(args: argparse.Namespace) -> int:
    from nodeagent.auth import AuthError, MungeAuthenticator, make_authenticator
    from nodeagent.server import JobTracker, NodeAgentServer, emit
    from nodeagent.slurmjob import SlurmJobs
    from nodeagent.store import StoreError, open_store

    _json_logging()
    try:
        kw: dict = {"allowed_uids": set(args.allow_uid), "caller_rate_per_s": args.caller_rate,
                    "caller_burst": args.caller_burst}
        if args.auth.startswith("munge"):
            kw["slurm_conf"] = args.slurm_conf
        auth = make_authenticator(args.auth, **kw)
        if isinstance(auth, MungeAuthenticator):
            auth.sign("/probe", b"")  # fail fast if munged is not reachable
        store = open_store(args.store)
        tracker = JobTracker(window_s=args.window_s, profile_steps=args.profile_steps,
                             profile_skip_steps=args.profile_skip_steps)
        slurm = SlurmJobs(squeue=args.squeue, slurm_conf=args.slurm_conf,
                          require_cgroup={"auto": None, "required": True, "ignore": False}[args.job_cgroups],
                          max_lookups_per_uid=args.lookups_in_flight_per_uid,
                          lookup_rate_per_s=args.lookup_rate_per_uid, lookup_burst=args.lookup_burst_per_uid,
                          missing_ttl_s=args.unknown_job_ttl_s,
                          max_lookups_total=args.lookups_in_flight or max(1, args.max_workers // 2))
        server = NodeAgentServer(args.node, args.listen, auth, store, tracker, max_workers=args.max_workers,
                                 slurm=slurm, max_preempts_per_caller=args.preempts_per_caller)
    except (AuthError, StoreError, OSError, RuntimeError, ValueError) as exc:  # ValueError: a bad --auth spec
        return _fail("agent", f"cannot start agent: {exc}")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server.start()
    if shutil.which(args.squeue) is None:  # only privileged callers' reports can be accepted then
        emit("slurm_lookup_unavailable", logging.WARNING, squeue=args.squeue,
             message="squeue not found: reports of unprivileged users will be refused")
    print(f"rlsched agent {args.node} listening on {server.address}", file=sys.stderr, flush=True)
    stop.wait()
    server.stop(grace=2.0)
    return 0


def run_keygen(args: argparse.Namespace) -> int:
    from nodeagent.auth import SharedKeyAuthenticator

    existed = os.path.lexists(args.path)
    try:
        path = SharedKeyAuthenticator.generate(args.path)
    except FileExistsError:
        return _fail("agent-keygen", f"{args.path} already exists; refusing to overwrite a key")
    except OSError as exc:  # a file on the way, a missing folder, no permission, a full disk
        if not existed and os.path.isfile(args.path):  # made, then writing the key failed: no half-written key
            with contextlib.suppress(OSError):
                os.unlink(args.path)
        return _fail("agent-keygen", f"{args.path}: cannot create the key file: {_why_not(args.path, exc)}")
    print(path)
    return 0


def run_jobkey(args: argparse.Namespace) -> int:
    from nodeagent.auth import AuthError, remove_job_key, write_job_key

    if not args.job:
        return _fail("agent-jobkey", "no job id: give --job or run it where SLURM_JOB_ID is set (Prolog/Epilog)")
    env_uid, env_gid = os.environ.get("SLURM_JOB_UID", ""), os.environ.get("SLURM_JOB_GID", "")
    uid = args.uid if args.uid is not None else int(env_uid) if env_uid.isdigit() else None
    gid = args.gid if args.gid is not None else int(env_gid) if env_gid.isdigit() else None
    try:
        if args.action == "remove":
            remove_job_key(args.dir, args.job)
            return 0
        if not args.key:
            return _fail("agent-jobkey", "write needs --key, the root key file")
        if uid is None:
            return _fail("agent-jobkey", "no job uid: give --uid or run it where SLURM_JOB_UID is set (Prolog)")
        print(write_job_key(args.key, args.dir, args.job, uid, gid))
    except AuthError as exc:
        return _fail("agent-jobkey", str(exc))
    return 0


def _why_not(path: str, exc: OSError) -> str:
    """``exc``'s reason, naming the folder on the way it is about when that one is missing or a file."""
    parent = os.path.dirname(os.path.abspath(path))
    if isinstance(exc, (NotADirectoryError, FileNotFoundError)):
        nearest = parent
        while not os.path.lexists(nearest):
            nearest = os.path.dirname(nearest)
        if not os.path.isdir(nearest):
            return f"{nearest} is not a directory"
        if nearest != parent:
            return f"its folder {parent} does not exist"
    return exc.strerror or str(exc)
