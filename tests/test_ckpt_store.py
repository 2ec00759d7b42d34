"""Contract + crash-safety tests for nodeagent.store.

The contract tests run against every backend: LocalFSStore always, WebHDFSStore
only when RLSCHED_TEST_WEBHDFS_URL (e.g. hdfs://namenode:9870/tmp/rlsched-test)
points at a real WebHDFS endpoint; otherwise those cases are reported as skipped.
"""

from __future__ import annotations

import errno
import hashlib
import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.parse
import uuid
from pathlib import Path
from typing import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodeagent.store import (
    CheckpointCorrupt,
    CheckpointNotFound,
    CheckpointStore,
    LocalFSStore,
    StoreError,
    StoreNotOwner,
    StoreUnavailable,
    WebHDFSStore,
    open_store,
    validate_job_key,
)

WEBHDFS_URL = os.environ.get("RLSCHED_TEST_WEBHDFS_URL")


class _FakeWebHDFS(http.server.BaseHTTPRequestHandler):
    """Minimal WebHDFS REST endpoint over a local directory.

    A MOCK of a NameNode+DataNode, used only because a real HDFS cannot run in
    this test environment; it lets the WebHDFSStore code path (hdfs package,
    HTTP, 307 redirects, JSON errors) run end to end. Real-HDFS coverage comes
    from RLSCHED_TEST_WEBHDFS_URL.
    """

    root: Path
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, *a: object) -> None:  # quiet
        pass

    def _path(self) -> tuple[Path, dict[str, str], str]:
        u = urllib.parse.urlparse(self.path)
        q = dict(urllib.parse.parse_qsl(u.query))
        assert u.path.startswith("/webhdfs/v1")
        rel = urllib.parse.unquote(u.path[len("/webhdfs/v1"):]).lstrip("/")
        return self.root / rel, q, q.get("op", "").upper()

    def _json(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _notfound(self, p: Path) -> None:
        self._json(404, {"RemoteException": {"exception": "FileNotFoundException",
                                             "javaClassName": "java.io.FileNotFoundException",
                                             "message": f"File does not exist: {p}"}})

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                n = int(self.rfile.readline().strip(), 16)
                if n == 0:
                    self.rfile.readline()
                    return out
                out += self.rfile.read(n)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length", 0)))

    def _redirect(self) -> None:
        self.send_response(307)
        self.send_header("Location", f"http://127.0.0.1:{self.server.server_port}{self.path}&datanode=true")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_PUT(self) -> None:
        p, q, op = self._path()
        if op == "CREATE":
            if "datanode" not in q:
                self._body()
                if p.exists() and q.get("overwrite", "false") != "true":
                    return self._json(403, {"RemoteException": {"exception": "FileAlreadyExistsException",
                                                                "javaClassName": "x", "message": str(p)}})
                return self._redirect()
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(self._body())
            self.send_response(201)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif op == "MKDIRS":
            p.mkdir(parents=True, exist_ok=True)
            self._json(200, {"boolean": True})
        elif op == "RENAME":
            dst = self.root / q["destination"].lstrip("/")
            if not p.exists() or dst.exists() or not dst.parent.is_dir():
                return self._json(200, {"boolean": False})
            os.rename(p, dst)
            self._json(200, {"boolean": True})
        else:
            self._json(400, {"RemoteException": {"exception": "IllegalArgumentException", "javaClassName": "x",
                                                 "message": f"bad op {op}"}})

    def do_GET(self) -> None:
        p, q, op = self._path()
        if op == "OPEN":
            if not p.is_file():
                return self._notfound(p)
            if "datanode" not in q:
                return self._redirect()
            data = p.read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        elif op in ("LISTSTATUS", "GETFILESTATUS"):
            if not p.exists():
                return self._notfound(p)

            def st(x: Path, suffix: str) -> dict:
                return {"pathSuffix": suffix, "type": "DIRECTORY" if x.is_dir() else "FILE",
                        "length": 0 if x.is_dir() else x.stat().st_size,
                        "modificationTime": int(x.stat().st_mtime * 1000)}

            if op == "GETFILESTATUS":
                return self._json(200, {"FileStatus": st(p, "")})
            items = [st(c, c.name) for c in sorted(p.iterdir())] if p.is_dir() else [st(p, "")]
            self._json(200, {"FileStatuses": {"FileStatus": items}})
        else:
            self._json(400, {"RemoteException": {"exception": "IllegalArgumentException", "javaClassName": "x",
                                                 "message": f"bad op {op}"}})

    def do_DELETE(self) -> None:
        p, _q, _op = self._path()
        if not p.exists():
            return self._json(200, {"boolean": False})
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink()
        self._json(200, {"boolean": True})


@pytest.fixture(scope="module")
def fake_webhdfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("fake-hdfs")
    handler = type("H", (_FakeWebHDFS,), {"root": root})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"hdfs://127.0.0.1:{srv.server_port}/rlsched"
    srv.shutdown()
    srv.server_close()


@pytest.fixture(params=["local", "webhdfs-mock", "webhdfs"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> CheckpointStore:
    if request.param == "local":
        return LocalFSStore(tmp_path / "store")
    if request.param == "webhdfs-mock":
        pytest.importorskip("hdfs", reason="pip install 'rlsched[hdfs]' for the WebHDFS backend")
        return WebHDFSStore(request.getfixturevalue("fake_webhdfs") + "/" + uuid.uuid4().hex)
    if not WEBHDFS_URL:
        pytest.skip("set RLSCHED_TEST_WEBHDFS_URL=hdfs://namenode:port/path to run WebHDFS contract tests")
    pytest.importorskip("hdfs", reason="pip install 'rlsched[hdfs]' for the WebHDFS backend")
    return WebHDFSStore(WEBHDFS_URL.rstrip("/") + "/" + uuid.uuid4().hex)


# ------------------------------------------------------------------ contract


def test_empty_store_has_nothing(store: CheckpointStore) -> None:
    assert store.latest("job-a") is None
    assert store.list("job-a") == []
    with pytest.raises(CheckpointNotFound):
        store.load("job-a")


def test_save_load_roundtrip_and_latest(store: CheckpointStore) -> None:
    a = store.save("job-a", 10, b"ten")
    store.save("job-a", 30, b"thirty")
    store.save("job-a", 20, bytearray(b"twenty"))
    store.save("job-b", 99, b"other job")
    assert a.step == 10 and a.size == 3 and a.sha256 == hashlib.sha256(b"ten").hexdigest()
    assert [i.step for i in store.list("job-a")] == [10, 20, 30]
    latest = store.latest("job-a")
    assert latest is not None and latest.step == 30
    info, blob = store.load("job-a")
    assert (info.step, blob) == (30, b"thirty")
    assert store.load("job-a", 20)[1] == b"twenty"
    assert store.load("job-b")[1] == b"other job"
    with pytest.raises(CheckpointNotFound, match="step 15"):
        store.load("job-a", 15)
    assert {"job-a", "job-b"} <= set(store.jobs())


def test_save_accepts_file_objects_and_paths(store: CheckpointStore, tmp_path: Path) -> None:
    p = tmp_path / "blob.bin"
    p.write_bytes(b"from a path")
    store.save("job-f", 1, p)
    with open(p, "rb") as f:
        store.save("job-f", 2, f)
    assert store.load("job-f", 1)[1] == b"from a path"
    assert store.load("job-f", 2)[1] == b"from a path"


def test_overwrite_same_step(store: CheckpointStore) -> None:
    store.save("job-o", 5, b"first")
    store.save("job-o", 5, b"second")
    assert [i.step for i in store.list("job-o")] == [5]
    assert store.load("job-o")[1] == b"second"


@pytest.mark.parametrize("bad", ["", ".hidden", "../escape", "a/b", "x" * 129, "sp ace", "-dash", "abc\n", "a\nb"])
def test_invalid_job_keys_rejected(store: CheckpointStore, bad: str) -> None:
    with pytest.raises(ValueError, match="invalid job key"):
        store.save(bad, 1, b"x")
    with pytest.raises(ValueError):
        validate_job_key(bad)


@pytest.mark.parametrize("bad", [-1, 10**12, 1.5, True])
def test_invalid_steps_rejected(store: CheckpointStore, bad: object) -> None:
    with pytest.raises(ValueError, match="invalid checkpoint step"):
        store.save("job-s", bad, b"x")  # type: ignore[arg-type]


def test_corrupted_checkpoint_detected_and_skipped(store: CheckpointStore) -> None:
    store.save("job-c", 1, b"good old checkpoint")
    store.save("job-c", 2, b"newest checkpoint")
    # corrupt step 2's data behind the store's back (same length, one byte flipped)
    store._write_atomic("job-c/ckpt-000000000002.bin", b"newest checkpoinT")
    with pytest.raises(CheckpointCorrupt, match="checksum"):
        store.load("job-c", 2)
    latest = store.latest("job-c")
    assert latest is not None and latest.step == 1, "latest() must skip the corrupt checkpoint"
    assert store.load("job-c") == (latest, b"good old checkpoint")
    assert store.latest("job-c", verify=False).step == 2  # type: ignore[union-attr]
    # truncated data is caught too
    store._write_atomic("job-c/ckpt-000000000001.bin", b"good")
    assert store.latest("job-c") is None
    with pytest.raises(CheckpointNotFound):
        store.load("job-c")


def test_garbage_manifest_and_orphans_ignored(store: CheckpointStore) -> None:
    store.save("job-g", 3, b"valid")
    store._write_atomic("job-g/ckpt-000000000007.json", b"{not json")
    store._write_atomic("job-g/ckpt-000000000008.bin", b"data without manifest")
    store._write_atomic("job-g/.ckpt-000000000009.bin.tmp-deadbeef", b"half-written")
    store._write_atomic("job-g/notes.txt", b"unrelated")
    assert [i.step for i in store.list("job-g")] == [3]
    assert store.load("job-g")[1] == b"valid"


@pytest.mark.parametrize("meta", [
    {"size": float("inf")}, {"size": 1e999}, {"size": 1.5}, {"size": -1}, {"size": True}, {"size": 1 << 60},
    {"size": "5"}, {"created": float("nan")}, {"created": "yesterday"}, {"sha256": "0"}, {"sha256": 5},
])
def test_malformed_manifest_numbers_are_unparseable(store: CheckpointStore, meta: dict) -> None:
    """Non-finite, huge, fractional or mistyped fields make a manifest unreadable (skipped), never an
    exception other than the store's own out of list()/latest() (size 1e999 raised OverflowError)."""
    store.save("job-n", 1, b"valid")
    good = json.loads(store._read("job-n/ckpt-000000000001.json"))
    bad = {**good, "step": 2, **meta}
    raw = json.dumps(bad).replace("Infinity", "1e999") if meta == {"size": 1e999} else json.dumps(bad)
    store._write_atomic("job-n/ckpt-000000000002.json", raw.encode())
    store._write_atomic("job-n/ckpt-000000000002.bin", b"valid")
    assert [i.step for i in store.list("job-n")] == [1]
    assert store.latest("job-n").step == 1  # type: ignore[union-attr]


def test_manifest_for_other_step_rejected(store: CheckpointStore) -> None:
    store.save("job-m", 4, b"four")
    manifest = store._read("job-m/ckpt-000000000004.json")
    store._write_atomic("job-m/ckpt-000000000006.json", manifest)  # claims step 4
    store._write_atomic("job-m/ckpt-000000000006.bin", b"four")
    assert [i.step for i in store.list("job-m")] == [4]


def test_prune_keeps_newest_valid(store: CheckpointStore) -> None:
    for s in (1, 2, 3, 4):
        store.save("job-p", s, f"step{s}".encode())
    store._write_atomic("job-p/ckpt-000000000004.bin", b"corrupt")
    deleted = store.prune("job-p", keep=2)
    assert sorted(deleted) == [1, 4]
    assert [i.step for i in store.list("job-p")] == [2, 3]
    with pytest.raises(ValueError):
        store.prune("job-p", keep=0)


def test_orphan_data_without_manifest_is_pruned_once_old(store: CheckpointStore) -> None:
    """A writer killed between the data rename and the manifest leaves an orphan: never a checkpoint, and
    removed by prune() once older than its age limit (a younger one may be a save in progress)."""
    for s in (1, 2):
        store.save("job-o", s, f"step{s}".encode())
    store._write_atomic("job-o/ckpt-000000000005.bin", b"data of a writer killed before its manifest")
    assert store.prune("job-o", keep=2) == [], "a fresh orphan may be a save in progress"
    assert store.orphans("job-o") == [5] and store.orphans("job-o", older_than_s=3600) == []
    assert store.prune("job-o", keep=2, orphan_age_s=-1.0) == [5]
    assert store.orphans("job-o") == [] and "ckpt-000000000005.bin" not in store._listdir("job-o")
    assert [i.step for i in store.list("job-o")] == [1, 2] and store.load("job-o")[1] == b"step2"


# ------------------------------------------------- a store out of reach is not an empty store


def _all_files(root: Path) -> dict[str, bytes]:
    return {str(f.relative_to(root)): f.read_bytes() for f in sorted(root.rglob("*")) if f.is_file()}


def _assert_reads_refuse(store: CheckpointStore, job: str) -> None:
    """Every read of ``job`` raises StoreUnavailable: none answers "nothing there" or "corrupt"."""
    for call in (lambda: store.list(job), lambda: store.latest(job), lambda: store.load(job),
                 lambda: store.load(job, 2), lambda: store.prune(job, keep=1)):
        with pytest.raises(StoreUnavailable):
            call()


def test_unreachable_webhdfs_raises_instead_of_looking_empty(tmp_path: Path) -> None:
    """NameNode gone: listing, loading and pruning fail loudly. Before, the listing answered [] and a job
    resumed from step 0; nothing on the server is deleted."""
    pytest.importorskip("hdfs", reason="pip install 'rlsched[hdfs]' for the WebHDFS backend")
    root = tmp_path / "hdfs"
    root.mkdir()
    # HTTP/1.0: no kept-alive connection outlives the server's shutdown
    handler = type("H", (_FakeWebHDFS,), {"root": root, "protocol_version": "HTTP/1.0"})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        store = WebHDFSStore(f"hdfs://127.0.0.1:{srv.server_port}/ckpt", timeout_s=2.0)
        for step in (1, 2, 3):
            store.save("job-u", step, f"step {step}".encode())
        assert store.latest("job-u").step == 3  # type: ignore[union-attr]
    finally:
        srv.shutdown()
        srv.server_close()
    before = _all_files(root)
    _assert_reads_refuse(store, "job-u")
    with pytest.raises(StoreUnavailable):
        store.jobs()
    assert _all_files(root) == before


def test_local_io_errors_raise_instead_of_looking_empty_or_corrupt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An I/O error (EIO, a stale NFS handle) while listing or reading is not "no checkpoint" or
    "corrupt": reads raise StoreUnavailable and prune deletes nothing."""
    store = LocalFSStore(tmp_path / "store")
    for step in (1, 2, 3):
        store.save("job-e", step, f"step {step}".encode())
    before = _all_files(tmp_path / "store")
    real_listdir, real_read = os.listdir, os.read

    def eio(*_a: object) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "listdir", eio)
    _assert_reads_refuse(store, "job-e")
    monkeypatch.setattr(os, "listdir", real_listdir)
    # the newest checkpoint's data cannot be read for a moment: not corrupt, so not pruned, not skipped
    def read(fd: int, n: int) -> bytes:
        if os.readlink(f"/proc/self/fd/{fd}").endswith("ckpt-000000000003.bin"):
            eio()
        return real_read(fd, n)

    monkeypatch.setattr(os, "read", read)
    for call in (lambda: store.latest("job-e"), lambda: store.load("job-e"), lambda: store.prune("job-e", keep=1)):
        with pytest.raises(StoreUnavailable, match="Input/output error"):
            call()
    assert [i.step for i in store.list("job-e")] == [1, 2, 3]  # manifests still read
    monkeypatch.setattr(os, "read", real_read)
    assert _all_files(tmp_path / "store") == before
    assert store.load("job-e")[1] == b"step 3"
    assert store.prune("job-e", keep=1) == [1, 2]


def test_missing_data_behind_a_manifest_is_corrupt(store: CheckpointStore) -> None:
    store.save("job-d", 1, b"one")
    store.save("job-d", 2, b"two")
    store._delete("job-d/ckpt-000000000002.bin")
    with pytest.raises(CheckpointCorrupt, match="missing"):
        store.load("job-d", 2)
    assert store.load("job-d") == (store.latest("job-d"), b"one")
    assert store.prune("job-d", keep=1) == [2]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(saves=st.lists(st.tuples(st.integers(0, 50), st.binary(max_size=64)), min_size=1, max_size=8))
def test_latest_is_highest_step_with_last_written_bytes(tmp_path: Path, saves: list[tuple[int, bytes]]) -> None:
    s = LocalFSStore(tmp_path / uuid.uuid4().hex)
    expect: dict[int, bytes] = {}
    for step, blob in saves:
        s.save("prop", step, blob)
        expect[step] = blob
    top = max(expect)
    assert s.load("prop") == (s.latest("prop"), expect[top])
    assert [i.step for i in s.list("prop")] == sorted(expect)


# ------------------------------------------------------------- crash safety

_CRASHER = textwrap.dedent(
    """
    import os, sys, time
    from nodeagent.store import LocalFSStore
    root, step, nth = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    real_fsync, calls = os.fsync, [0]
    def slow_fsync(fd):
        calls[0] += 1
        if calls[0] == nth:                      # hang at the nth fsync of save()
            open(os.path.join(root, "HANGING"), "w").close()
            time.sleep(60)
        real_fsync(fd)
    os.fsync = slow_fsync
    LocalFSStore(root).save("crash", step, b"N" * 4_000_000)
    """
)


def _crash_save(root: Path, step: int, nth_fsync: int) -> None:
    """Run store.save in a subprocess and SIGKILL it while it hangs at its nth fsync."""
    p = subprocess.Popen([sys.executable, "-c", _CRASHER, str(root), str(step), str(nth_fsync)])
    try:
        deadline = time.monotonic() + 60
        while not (root / "HANGING").exists():
            assert p.poll() is None, "writer exited before reaching the crash point"
            assert time.monotonic() < deadline, "writer never reached the crash point"
            time.sleep(0.02)
        p.send_signal(signal.SIGKILL)
        assert p.wait(timeout=30) == -signal.SIGKILL
    finally:
        if p.poll() is None:
            p.kill()
        (root / "HANGING").unlink(missing_ok=True)


# fsync order inside save(): 1 data temp file, 2 directory (data renamed), 3 manifest temp file, 4 directory
@pytest.mark.parametrize("nth_fsync,what", [(1, "data temp written, not renamed"),
                                            (3, "data renamed, manifest not committed")])
def test_kill_mid_write_never_yields_a_valid_new_checkpoint(tmp_path: Path, nth_fsync: int, what: str) -> None:
    root = tmp_path / "store"
    s = LocalFSStore(root)
    s.save("crash", 1, b"previous good")
    _crash_save(root, 2, nth_fsync)
    assert [i.step for i in s.list("crash")] == [1], what
    assert s.load("crash")[1] == b"previous good"
    leftovers = list((root / "crash").glob(".ckpt-*.tmp-*"))
    if nth_fsync == 1:
        assert leftovers, "the killed writer should have left its temp file behind"
        assert s.clean_temp("crash", older_than_s=0) == len(leftovers)
        assert not list((root / "crash").glob(".ckpt-*.tmp-*"))


def test_kill_while_overwriting_same_step_is_detected(tmp_path: Path) -> None:
    """New data renamed over step 2, old manifest still there: the checksum catches it."""
    root = tmp_path / "store"
    s = LocalFSStore(root)
    s.save("crash", 1, b"one")
    s.save("crash", 2, b"two")
    _crash_save(root, 2, 3)
    with pytest.raises(CheckpointCorrupt):
        s.load("crash", 2)
    assert s.load("crash") == (s.latest("crash"), b"one")


# ------------------------------------------- what a job puts in its store directory (read by root)


def _in_thread(fn: object, timeout: float = 10.0) -> object:
    """fn() in a thread; fails the test if it does not return in ``timeout`` s (a blocking read)."""
    out: dict = {}

    def run() -> None:
        try:
            out["v"] = fn()  # type: ignore[operator]
        except BaseException as exc:  # noqa: BLE001
            out["e"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), "the store blocked"
    if "e" in out:
        raise out["e"]
    return out["v"]


def _forge(store: LocalFSStore, key: str, step: int, size: int = 1) -> Path:
    """A manifest for ``step`` (data left to the caller); returns the data path."""
    d = store.root / key
    d.mkdir(parents=True, exist_ok=True)
    (d / f"ckpt-{step:012d}.json").write_text(json.dumps(
        {"job_key": key, "step": step, "sha256": "0" * 64, "size": size, "created": 1.0}))
    return d / f"ckpt-{step:012d}.bin"


def test_fifo_or_device_named_like_a_checkpoint_is_corrupt_not_read(tmp_path: Path) -> None:
    store = LocalFSStore(tmp_path / "store")
    store.save("evil", 1, b"valid")
    os.mkfifo(_forge(store, "evil", 2))  # opening it for reading would block forever
    _forge(store, "evil", 3).symlink_to("/dev/zero")  # reading it would never end
    big = _forge(store, "evil", 4, size=3)
    big.write_bytes(b"x" * (8 << 20))  # bigger than its manifest says: not read at all
    assert _in_thread(lambda: store.latest("evil")).step == 1  # type: ignore[attr-defined]
    for step in (2, 3, 4):
        info = next(i for i in store.list("evil") if i.step == step)
        assert _in_thread(lambda: store.verify(info)) is False
        with pytest.raises(CheckpointCorrupt):
            _in_thread(lambda: store.load("evil", step))
    assert _in_thread(lambda: store.load("evil"))[1] == b"valid"  # type: ignore[index]


def test_fifo_symlinked_or_huge_manifest_is_skipped(tmp_path: Path) -> None:
    store = LocalFSStore(tmp_path / "store")
    store.save("evil", 1, b"valid")
    d = store.root / "evil"
    os.mkfifo(d / "ckpt-000000000002.json")
    (d / "ckpt-000000000003.json").symlink_to("/dev/zero")
    (d / "ckpt-000000000004.json").write_bytes(b" " * (1 << 20))
    assert [i.step for i in _in_thread(lambda: store.list("evil"))] == [1]  # type: ignore[attr-defined]


def test_symlinks_below_the_store_root_are_not_followed(tmp_path: Path) -> None:
    """The agent (root) reads job-controlled paths: a symlinked job directory or data file is not followed."""
    store = LocalFSStore(tmp_path / "store")
    store.save("victim", 1, b"someone else's")
    (store.root / "evil").symlink_to(store.root / "victim")
    assert store.list("evil") == [] and store.latest("evil") is None
    store.save("evil2", 1, b"mine")
    data = store.root / "evil2" / "ckpt-000000000001.bin"
    target = tmp_path / "elsewhere.bin"
    target.write_bytes(b"mine")
    data.unlink()
    data.symlink_to(target)
    assert store.latest("evil2") is None
    with pytest.raises(CheckpointCorrupt, match="symlink"):
        store.load("evil2", 1)


# --------------------------------------------------------------- open_store


def test_open_store_urls(tmp_path: Path) -> None:
    assert isinstance(open_store(str(tmp_path / "a")), LocalFSStore)
    assert isinstance(open_store((tmp_path / "b").as_uri()), LocalFSStore)
    with pytest.raises(StoreError, match="unsupported"):
        open_store("s3://bucket/x")
    with pytest.raises(StoreError, match="empty"):
        open_store("")


def test_webhdfs_without_package_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "hdfs", None)  # simulate the package not being installed
    with pytest.raises(StoreError, match=r"pip install 'rlsched\[hdfs\]'"):
        open_store("hdfs://namenode:9870/ckpt")


def test_local_store_unusable_dir(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(StoreError, match="cannot create"):
        LocalFSStore(f / "sub")


# ------------------------------------------------------- who owns a job's directory (a shared 1777 store)
def _chown_tree(path: Path, uid: int) -> None:
    os.chown(path, uid, uid)
    for p in path.iterdir():
        os.chown(p, uid, uid)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give files to another uid")
def test_a_job_directory_planted_by_another_user_is_neither_read_nor_written(tmp_path: Path) -> None:
    """Anyone may create ``<root>/<key>/`` in a shared store before the job runs: the job (and the agent acting
    for it) must not resume from, verify or write into a directory or file of another uid."""
    LocalFSStore(tmp_path).save("slurm-601", 999_999, b"planted")
    _chown_tree(tmp_path / "slurm-601", 65534)  # created by uid 65534, job 601 is uid 33's
    victim = LocalFSStore(tmp_path, owner_uid=33)
    for call in (lambda: victim.load("slurm-601"), lambda: victim.list("slurm-601"),
                 lambda: victim.latest("slurm-601"), lambda: victim.save("slurm-601", 1, b"mine")):
        with pytest.raises(StoreNotOwner, match=r"slurm-601 belongs to uid 65534, not to uid 33"):
            call()
    assert not any(p.name.startswith("ckpt-000000000001") for p in (tmp_path / "slurm-601").iterdir())
    # the directory's owner (and root's store, which checks no owner) read it; for_owner() is a view
    assert LocalFSStore(tmp_path, owner_uid=65534).load("slurm-601")[1] == b"planted"
    assert victim.for_owner(65534).latest("slurm-601").step == 999_999 and victim.owner_uid == 33
    assert LocalFSStore(tmp_path, owner_uid=None).load("slurm-601")[1] == b"planted"
    # a file of another uid inside the owner's own directory is refused too
    own = LocalFSStore(tmp_path, owner_uid=33)
    os.mkdir(tmp_path / "k2")
    os.chown(tmp_path / "k2", 33, 33)
    LocalFSStore(tmp_path, owner_uid=None).save("k2", 5, b"x")  # written by root
    os.chown(tmp_path / "k2", 33, 33)
    with pytest.raises(StoreNotOwner, match=r"k2/ckpt-000000000005.json belongs to uid 0"):
        own.list("k2")


def test_store_owner_defaults_to_the_caller_except_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1234)
    assert LocalFSStore(tmp_path).owner_uid == 1234 and open_store(str(tmp_path)).owner_uid == 1234
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert LocalFSStore(tmp_path).owner_uid is None  # root (the agent) checks per job, with for_owner()


# ------------------------------------------------------- write failures and what crashed writers leave


def _age(path: Path, seconds: float) -> None:
    t = time.time() - seconds
    os.utime(path, (t, t))


def test_prune_and_clean_temp_remove_old_orphans(tmp_path: Path) -> None:
    """Data files without a manifest, older than the limits, are removed by prune() (default 10 min) and by
    clean_temp() (its ``older_than_s``); a young one (a save in progress) and real checkpoints stay."""
    st = LocalFSStore(tmp_path / "store")
    for s in (1, 2, 3):
        st.save("job-c", s, f"step{s}".encode())
    d = tmp_path / "store" / "job-c"
    for step in (7, 8, 9):
        (d / f"ckpt-{step:012d}.bin").write_bytes(b"crashed writer")
    _age(d / "ckpt-000000000007.bin", 2 * 3600)
    assert st.prune("job-c", keep=3) == [7]
    _age(d / "ckpt-000000000008.bin", 2 * 3600)
    (d / ".ckpt-000000000010.bin.tmp-0123456789abcdef0123456789abcdef").write_bytes(b"half")
    _age(d / ".ckpt-000000000010.bin.tmp-0123456789abcdef0123456789abcdef", 2 * 3600)
    assert st.clean_temp("job-c") == 2  # orphan 8 and the temp file
    assert sorted(p.name for p in d.iterdir()) == sorted(
        [f"ckpt-{s:012d}.{x}" for s in (1, 2, 3) for x in ("bin", "json")] + ["ckpt-000000000009.bin"])
    assert [i.step for i in st.list("job-c")] == [1, 2, 3]


def test_disk_full_names_the_store_the_job_and_the_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    st = LocalFSStore(tmp_path / "store")
    st.save("job-f", 1, b"fits")

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)  # where a full disk (or NFS quota) surfaces
    with pytest.raises(OSError) as e:
        st.save("job-f", 2, b"x" * 4096)
    monkeypatch.undo()
    msg = str(e.value)
    want = (f"checkpoint store {st.url}: job job-f: cannot write checkpoint step 2 to "
            f"{tmp_path / 'store' / 'job-f' / 'ckpt-000000000002.bin'}: No space left on device (ENOSPC)")
    assert msg == want, msg
    from nodeagent.store import StoreWriteError

    assert isinstance(e.value, StoreWriteError) and isinstance(e.value, StoreError)
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(tmp_path / "store/job-f/ckpt-000000000002.bin")
    assert sorted(p.name for p in (tmp_path / "store" / "job-f").iterdir()) == [
        "ckpt-000000000001.bin", "ckpt-000000000001.json"], "no temp file or orphan left"
    assert st.latest("job-f").step == 1  # type: ignore[union-attr]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the writer as another uid (nobody)")
def test_permission_denied_names_the_store_the_job_and_the_path() -> None:
    """A job whose user cannot write the store (a root-owned 0755 directory, not 1777) gets one line naming
    the store, the job and the path, from a real EACCES."""
    python = next((x for x in (sys.executable, "/usr/bin/python3")  # nobody cannot reach a python below /root
                   if os.access(x, os.X_OK) and all(os.stat(d).st_mode & 0o001 for d in Path(x).parents)), None)
    if python is None:
        pytest.skip("no python interpreter that user nobody can run")
    root = Path(tempfile.mkdtemp(prefix="rlsched-store-"))
    try:
        root.chmod(0o755)
        (root / "store").mkdir(mode=0o755)
        code = "from nodeagent.store import LocalFSStore; LocalFSStore(%r).save('job-p', 3, b'x')" % str(root / "store")
        r = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60, user=65534,
                           group=65534, extra_groups=[], env={"PYTHONPATH": str(Path(__file__).resolve().parents[1]),
                                                              "PATH": "/usr/bin:/bin"})
        assert r.returncode == 1
        last = r.stderr.strip().splitlines()[-1]
        assert last == (f"nodeagent.store.StoreWriteError: checkpoint store {root / 'store'}: job job-p: cannot write "
                        f"checkpoint step 3 to {root / 'store' / 'job-p' / 'ckpt-000000000003.bin'}: Permission "
                        "denied (EACCES)"), r.stderr[-2000:]
    finally:
        shutil.rmtree(root, ignore_errors=True)
