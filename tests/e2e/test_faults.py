"""Faults (issue: Trust, item 6): processes SIGKILLed at random points, and disks that fill up, never leave a
partial or unverified kernel where a reader can see it, and the same command run again completes.

Cases: a builder killed 3 times (killpg: the CLI and its compiler workers), a pusher and a puller killed 5 times
each against a real server on SQLite, the server killed 5 times during uploads, and a build and a pull into a
full disk (a size-limited tmpfs, and RLIMIT_FSIZE where it can stand in). Kill points come from a seeded random
source: the run prints the seed, and FA4_AOT_FAULT_SEED=<seed> replays it (tests/helpers/fault_suites.py).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from fa4_aot.domain import kernel_keys
from fa4_aot.store import Entry, Store, maintenance
from tests.conftest import ROOT, TINY_VARIANTS, proven, run_cli
from tests.helpers.servers import Server, prepare_database

pytestmark = pytest.mark.slow

BUILD = ["build", "--sku", "h200", "--variants", str(TINY_VARIANTS), "--only", "det-bwd"]
BUILDER_RUNS, PUSHER_RUNS, PULLER_RUNS, SERVER_RUNS = 3, 5, 5, 5
DISK_FULL = [("build", "tmpfs"), ("pull", "tmpfs"), ("build", "rlimit"), ("pull", "rlimit")]
FREE_BYTES = 48 << 10  # room for the smallest det-bwd kernel (28 KiB) but not for all four (220 KiB)
BIG_OBJECT = 16 << 20  # uploads that last long enough for a server kill to land inside one
RLIMIT_BUILD = ("RLIMIT_FSIZE caps every file the build writes, including the compiler's own export files "
                "outside the store, so it cannot stand for a full store disk; only the tmpfs case models that")


@pytest.fixture(autouse=True)
def _unsigned(monkeypatch: pytest.MonkeyPatch) -> None:
    """The builds here are unsigned: pulls take them only with FA4_AOT_INSECURE=1 (the client's policy)."""
    monkeypatch.setenv("FA4_AOT_INSECURE", "1")
    monkeypatch.delenv("FA4_AOT_TRUSTED_KEYS", raising=False)


# -- processes --------------------------------------------------------------------------------------------
def start(args: list[str], cache: Path, log: Path | None = None) -> subprocess.Popen[bytes]:
    """`fa4-aot --cache-dir CACHE ARGS` in its own process group (the build's workers are its children);
    stderr goes to `log` when given."""
    cmd = [sys.executable, "-m", "fa4_aot", "--cache-dir", str(cache), *args]
    if log is None:
        return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
    with open(log, "wb") as err:
        return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # it had finished
        pass
    proc.wait(timeout=30)


def wait_until(ready: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"gave up after {timeout}s"
        time.sleep(0.005)


def objects_in(root: Path) -> int:
    """Complete objects under root/objects (temp files not counted)."""
    folder = root / "objects"
    if not folder.is_dir():
        return 0
    return sum(1 for fan in os.scandir(folder) for f in os.scandir(fan.path) if not f.name.startswith("."))


def temp_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob(".*.tmp")) if root.exists() else []


def kill_when(proc: subprocess.Popen[bytes], root: Path, rng: random.Random, objects: int, max_delay: float = 0.1,
              kill: Callable[[], None] | None = None) -> str:
    """Kill `proc` (by default SIGKILL to its process group) once `root` holds a random number (0..objects) of
    objects, plus a random delay of up to `max_delay` seconds; returns where the kill landed, for the log."""
    wanted, delay = rng.randint(0, objects), rng.uniform(0.0, max_delay)
    try:
        wait_until(lambda: objects_in(root) >= wanted or proc.poll() is not None, 240)
        time.sleep(delay)
    finally:
        (kill or (lambda: kill_group(proc)))()
    return f"killed after {wanted} object(s) + {delay * 1000:.0f} ms (exit {proc.returncode})"


# -- what must hold after every fault ---------------------------------------------------------------------
def assert_sound(root: Path) -> None:
    """verify() (no quarantine) finds nothing partial or unverified, and what readers list holds no temp file:
    entries() yields exactly the `<key>.json` files and verify hashed exactly the non-temp object files. A
    server may still finish a request meanwhile, so the store may grow between the listings, never shrink."""
    store = Store(root)
    named_before, objects_before = _index_names(root), objects_in(root)
    report = maintenance.verify(store)
    assert report.ok and report.unexpected == [], report
    keys = {e.kernel_key for e in store.entries()}
    for key in keys:
        assert store.read_object(store.get_entry(key).object_digest)  # type: ignore[union-attr]
    assert named_before <= keys <= _index_names(root)
    assert objects_before <= report.objects_checked <= objects_in(root)
    assert all(p.name.startswith(".") and p.name.endswith(".tmp") for p in temp_files(root))


def _index_names(root: Path) -> set[str]:
    return {p.name.removesuffix(".json") for p in root.glob("index/??/*.json")}  # glob skips dot files


def manifest_keys(server: Server) -> set[str]:
    doc = httpx.get(f"{server.url}/v1/skus/h200/manifest", timeout=10).json()
    return {k["kernel_key"] for k in doc["kernels"]}


def push(server: Server, cache: Path) -> None:
    result = run_cli("push", "--server", server.url, "--token", server.tokens["publish"], cache=cache, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


# -- fixtures ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store holding the tiny det-bwd set for h200 (four real kernels, 28-77 KiB each)."""
    store = tmp_path_factory.mktemp("built") / "store"
    result = run_cli(*BUILD, cache=store, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    return store


@pytest.fixture(scope="module")
def uploads(built: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`built` plus two kernels with 16 MiB objects, so that uploads last long enough to be killed inside."""
    root = tmp_path_factory.mktemp("uploads") / "store"
    shutil.copytree(built, root, ignore=shutil.ignore_patterns("locks"))
    store = Store(root)
    template = next(store.entries())
    for i in range(2):
        data = random.Random(i).randbytes(BIG_OBJECT)
        big = Entry(**{**template.__dict__, "compile_key": [*template.compile_key, "big", i],
                       "object_digest": store.put_object(data), "size": len(data)})
        store.put_entry(Entry(**{**big.__dict__, "kernel_key": kernel_keys.entry_key(big)}))  # as the server checks
    return root


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[], Server]]:
    """Starts servers on fresh stores and SQLite databases; all are killed at the end of the module."""
    made: list[Server] = []

    def new() -> Server:
        folder = tmp_path_factory.mktemp("server")
        db_url = f"sqlite:///{folder / 'fa4-aot.db'}"
        server = Server(cache_dir=folder / "cache", db_url=db_url, log=folder / "server.log",
                        tokens=prepare_database(db_url))
        made.append(server)
        return server.start()

    yield new
    for server in made:
        server.kill()


@pytest.fixture(scope="module")
def served(built: Path, servers: Callable[[], Server]) -> Server:
    """A server that holds `built`."""
    server = servers()
    push(server, built)
    return server


# -- kills ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("run", range(BUILDER_RUNS))
def test_builder_killed_at_a_random_point(tmp_path: Path, fault_rng: random.Random, run: int) -> None:
    store = tmp_path / "store"
    proc = start(BUILD, store)
    # up to 2 s past the last object seen: inside FA4's import and planning, or inside the next compile
    print(f"builder run {run}:", kill_when(proc, store, fault_rng, objects=3, max_delay=2.0))
    assert_sound(store)
    result = run_cli(*BUILD, "--json", cache=store, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    doc = json.loads(result.stdout)
    assert doc["failed"] == 0 and doc["built"] + doc["present"] == doc["kernels"] == 4
    assert_sound(store)


@pytest.mark.parametrize("run", range(PUSHER_RUNS))
def test_pusher_killed_at_a_random_point(built: Path, servers: Callable[[], Server], fault_rng: random.Random,
                                         run: int) -> None:
    server = servers()
    proc = start(["push", "--server", server.url, "--token", server.tokens["publish"]], built)
    print(f"pusher run {run}:", kill_when(proc, server.cache_dir, fault_rng, objects=3))
    assert_sound(built)
    assert_sound(server.cache_dir)
    push(server, built)
    assert manifest_keys(server) == {e.kernel_key for e in Store(built).entries()}
    assert_sound(server.cache_dir)


@pytest.mark.parametrize("run", range(PULLER_RUNS))
def test_puller_killed_at_a_random_point(tmp_path: Path, served: Server, built: Path, fault_rng: random.Random,
                                         run: int) -> None:
    local = tmp_path / "local"
    proc = start(["pull", "--server", served.url, "--sku", "h200"], local)
    print(f"puller run {run}:", kill_when(proc, local, fault_rng, objects=3))
    assert_sound(local)
    result = run_cli("pull", "--server", served.url, "--sku", "h200", cache=local, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert {e.kernel_key for e in Store(local).entries()} == {e.kernel_key for e in Store(built).entries()}
    assert_sound(local)


@pytest.mark.parametrize("run", range(SERVER_RUNS))
def test_server_killed_during_uploads(tmp_path: Path, uploads: Path, servers: Callable[[], Server],
                                      fault_rng: random.Random, run: int) -> None:
    server = servers()
    log = tmp_path / "push.log"
    pusher = start(["push", "--server", server.url, "--token", server.tokens["publish"], "-j", "2"], uploads, log)
    assert server.proc is not None
    proc = server.proc
    if fault_rng.random() < 0.5:  # the moment a temp file shows, an upload is under way
        wait_until(lambda: bool(temp_files(server.cache_dir)) or pusher.poll() is not None, 60)
        mid = bool(temp_files(server.cache_dir))
        server.kill()
        where = "killed mid-upload" if mid else "the push ended before any upload was seen; killed after it"
    else:
        where = kill_when(proc, server.cache_dir, fault_rng, objects=5, kill=server.kill)
    print(f"server run {run}: {where}")
    assert_sound(server.cache_dir)
    pusher.wait(timeout=120)
    assert "Traceback" not in log.read_text()
    server.start()  # same store and database: startup clears dead uploads' temp files
    assert temp_files(server.cache_dir) == []
    push(server, uploads)
    assert manifest_keys(server) == {e.kernel_key for e in Store(uploads).entries()}
    assert_sound(server.cache_dir)


# -- full disks -------------------------------------------------------------------------------------------
def _mount_small_tmpfs(folder: Path) -> None:
    """Mount a 2 MiB tmpfs on `folder` and fill it to FREE_BYTES; pytest.skip with the exact reason if no
    mount is possible."""
    folder.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", str(folder)], check=True,
                       capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"cannot mount a size-limited tmpfs: {getattr(e, 'stderr', '') or e}".strip())
    with open(folder / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError as e:
            assert e.errno == errno.ENOSPC
        size = f.tell()
    os.truncate(folder / "filler", max(0, size - FREE_BYTES))


def _limit_file_size() -> None:
    """In the child: writes past FREE_BYTES in any one file fail with EFBIG (instead of SIGXFSZ killing it)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (FREE_BYTES, FREE_BYTES))


@pytest.fixture
def full_disk(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Path, Callable[[], None] | None]]:
    """(store root, preexec_fn for the command) on a nearly full disk, by the case's method."""
    method = request.node.callspec.params["method"]
    if method == "rlimit":
        yield tmp_path / "store", _limit_file_size
        return
    disk = tmp_path / "disk"
    _mount_small_tmpfs(disk)
    try:
        yield disk / "store", None
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False, capture_output=True, timeout=30)


@pytest.mark.parametrize(("command", "method"), DISK_FULL, ids=[f"{c}-{m}" for c, m in DISK_FULL])
def test_disk_full_is_one_clean_error_and_leaves_nothing_partial(
        command: str, method: str, request: pytest.FixtureRequest, served: Server) -> None:
    if (command, method) == ("build", "rlimit"):
        pytest.skip(RLIMIT_BUILD)
    root, preexec = request.getfixturevalue("full_disk")
    args = BUILD if command == "build" else ["pull", "--server", served.url, "--sku", "h200"]
    result = subprocess.run([sys.executable, "-m", "fa4_aot", "--cache-dir", str(root), *args], cwd=ROOT,
                            capture_output=True, text=True, timeout=600, preexec_fn=preexec)
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error")]
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert len(errors) == 1 and errors[0].startswith(f"Error: no space left writing {root}/"), result.stderr[-3000:]
    assert "FA4_AOT_CACHE" in errors[0]
    assert_sound(root)
    assert temp_files(root) == []  # the writer was not killed: it removed its own temp files


# -- issue 9 (security round 2): races and stalls ----------------------------------------------------------
def _orphan(store: Store, data: bytes, age: float = 7200.0) -> str:
    digest = store.put_object(data)
    old = time.time() - age
    os.utime(store.object_path(digest), (old, old))
    return digest


def test_d2_gc_never_deletes_an_object_a_writer_reuses(tmp_path: Path) -> None:
    """A writer that finds an old orphan object present writes only the entry; gc, whose live set was read
    before that entry existed, must not delete the object under it."""
    import threading

    store = Store(tmp_path / "cache")
    data = os.urandom(1000)
    digest = _orphan(store, data)
    entry = proven(Entry(kernel_key="", object_digest=digest, size=len(data), family="f",
                         compile_key=["d2"], sku="h200", arch="sm_90a", sm_count=132, l2_bytes=62914560,
                         cuda_major=13, toolchain={}, variant="v", call="c", compile_seconds=0.0))
    reports: list[maintenance.GcReport] = []
    with store.lock(digest):  # the writer holds the object's lock while it checks the object and writes
        gc = threading.Thread(target=lambda: reports.append(maintenance.gc(store, min_age=3600)))
        gc.start()
        gc.join(timeout=1.0)  # gc has read its live set by now (and, unfixed, deleted the object)
        assert store.object_state(digest, len(data)) == "ok", "gc deleted an object a writer holds"
        from fa4_aot.store.atomic import atomic_write  # the entry, written as Store.put_entry does inside its hold

        atomic_write(store.entry_path(entry.kernel_key), entry.to_json().encode(), root=store.root)
    gc.join(timeout=60)
    assert reports and reports[0].removed_objects == []
    assert store.read_object(digest) == data and store.get_entry(entry.kernel_key) == entry
    other = _orphan(store, os.urandom(500))
    assert maintenance.gc(store, min_age=3600).removed_objects == [other]


def _drip(body: bytes, every: float):  # type: ignore[no-untyped-def]
    from tests.helpers.raw_server import reply

    def handle(server, path: str, conn) -> None:  # type: ignore[no-untyped-def]
        server.send(conn, reply(200, b"", "application/octet-stream", length=len(body)))
        for i in range(len(body)):
            if server.stop.wait(every):
                return
            server.send(conn, body[i:i + 1])

    return handle


def test_d5_slow_or_hung_server_has_a_deadline_and_is_then_down(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A server dripping one byte at a time, or one that accepts and never answers: every fetch has a total
    deadline, and after DOWN_AFTER requests in a row failed so the server is treated as down (no more
    connections) for this process. One failure is not enough (issue 28: under a cluster's load one slow answer
    marked a live server down for the whole node)."""
    from fa4_aot.errors import RemoteError
    from fa4_aot.remote.http import Remote
    from fa4_aot.remote.transport import DOWN_AFTER
    from tests.helpers.raw_server import RawServer

    monkeypatch.setenv("FA4_AOT_FETCH_DEADLINE", "2")
    body = os.urandom(40)
    digest = hashlib.sha256(body).hexdigest()
    holder: list[RawServer] = []
    dripping = RawServer(lambda path, conn: _drip(body, 0.25)(holder[0], path, conn))
    holder.append(dripping)
    store = Store(tmp_path / "cache")
    with dripping:  # 40 bytes at 4 a second: 10 s, far past the 2 s deadline
        remote = Remote(dripping.url)
        with pytest.raises(RemoteError, match="deadline"):
            remote.fetch_object(digest, store, len(body))
        for _ in range(DOWN_AFTER - 1):
            with pytest.raises(RemoteError, match="deadline"):
                remote.kernel("a" * 64)
        with pytest.raises(RemoteError, match="treated as down"):
            remote.kernel("a" * 64)
        assert dripping.connections == DOWN_AFTER
    assert not store.has_object(digest) and not list(store.root.rglob("*.tmp"))
    hung = RawServer(lambda path, conn: hung.stop.wait(60))
    with hung:
        remote = Remote(hung.url)
        for _ in range(DOWN_AFTER):
            with pytest.raises(RemoteError, match="cannot reach"):
                remote.kernel("b" * 64)
        tried = hung.connections
        with pytest.raises(RemoteError, match="treated as down"):
            remote.fetch_object(digest, store, len(body))
        assert hung.connections == tried  # retries stop at the deadline; nothing after the server is down


DRIPPED = {  # every kind of request, each answered by a server dripping one byte every 0.25 s
    "json": lambda remote, store: remote.kernel("a" * 64),
    "object": lambda remote, store: remote.fetch_object("b" * 64, store),
    "bundle": lambda remote, store: remote.fetch_bundle(["c" * 64], store),
    "recipe": lambda remote, store: remote.recipe("h200", "d" * 64),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("ask", DRIPPED.values(), ids=DRIPPED.keys())
def test_d19_deadline_holds_while_a_body_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 ask: Callable[..., object]) -> None:
    """Each byte comes well within the read timeout, so only the whole-request deadline can end the request:
    it must, about when it passes (before: the body was read to its end, 200 bytes in 50 s)."""
    from fa4_aot.errors import RemoteError
    from fa4_aot.remote.http import Remote
    from tests.helpers.raw_server import RawServer

    monkeypatch.setenv("FA4_AOT_FETCH_DEADLINE", "2")
    holder: list[RawServer] = []
    dripping = RawServer(lambda path, conn: _drip(b"[" + b" " * 198 + b"]", 0.25)(holder[0], path, conn))
    holder.append(dripping)
    with dripping:
        start = time.monotonic()
        with pytest.raises(RemoteError, match="deadline"):
            ask(Remote(dripping.url), Store(tmp_path / "cache"))
        assert time.monotonic() - start < 4.5


def test_d15_temp_files_of_a_reused_pid_are_cleaned(tmp_path: Path) -> None:
    """In a container the server is PID 1 after every restart: a temp file named after a pid that is running
    but whose process started after the file last changed is a killed writer's, and goes."""
    store = Store(tmp_path / "cache")
    store.put_object(b"x")
    folder = store.object_path("a" * 64).parent
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    writer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # holds the reused pid
    try:
        leftover = folder / f".{'a' * 62}.{writer.pid}.0123abcd.tmp"
        live = folder / f".{'b' * 62}.{writer.pid}.4567cdef.tmp"
        for path in (leftover, live):
            path.write_bytes(b"partial")
        before = time.time() - 60
        os.utime(leftover, (before, before))  # last written before that process started: a dead writer's
        removed = maintenance.gc(store, min_age=float("inf")).removed_temp_files
        assert (removed, leftover.exists(), live.exists()) == (1, False, True)
        ancient = time.time() - 2 * 86400
        os.utime(live, (ancient, ancient))  # untouched for days by a pid that still runs: stuck, goes too
        assert maintenance.gc(store, min_age=float("inf")).removed_temp_files == 1 and not live.exists()
    finally:
        writer.kill()
        writer.wait()
