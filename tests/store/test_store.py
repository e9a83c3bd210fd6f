"""The content-addressed store on a real filesystem: round trips, integrity, id validation, gc, atomic writes,
SIGKILLed writers and cross-process locks. The hardening cases (ownership, modes, symlinks, quarantine) are
in tests/store/test_cache_hardening.py."""

from __future__ import annotations

import errno
import hashlib
import os
import pickle
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fa4_aot.errors import DiskFull, IntegrityError, StoreError
from fa4_aot.store import Entry, Miss, Store, maintenance, sha256_file
from fa4_aot.store import objects as store_objects
from fa4_aot.store.atomic import atomic_write
from fa4_aot.store.locking import FileLock
from tests.conftest import proven

ROOT = Path(__file__).resolve().parents[2]
CHILD_ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def make_entry(store: Store, data: bytes, sku: str = "h200", tag: str = "") -> Entry:
    """An entry for an object holding `data` (stored), filed under the key its fields hash to; its compile key
    names the bytes and `tag`, so distinct bytes or tags make distinct kernels."""
    digest = store.put_object(data)
    return proven(Entry(
        kernel_key="", object_digest=digest, size=len(data), family="FlashAttentionForwardSm90",
        compile_key=["fwd", 128, True, {"float": "0x1.0p-3"}, hashlib.sha256(data).hexdigest(), tag], sku=sku,
        arch="sm_90a", sm_count=132, l2_bytes=62914560, cuda_major=13, toolchain={"flash-attn-4": "4.0.0b36"},
        variant="train", call="fwd dense bf16 d=128 causal b=1 sq=512 sk=512 h=16/16", compile_seconds=1.25,
        hardware_queries=[["sm_count", 132]],
    ))


def flip_one_byte(path: Path, at: int = 0) -> None:
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def files_under(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


def test_object_round_trip_and_idempotence(tmp_path: Path) -> None:
    store = Store(tmp_path)
    with pytest.raises(StoreError, match="missing"):
        store.verified_object_path("0" * 64)
    data = os.urandom(3 << 20)
    digest = store.put_object(data)
    assert digest == hashlib.sha256(data).hexdigest()
    path = store.object_path(digest)
    assert path == tmp_path / "objects" / digest[:2] / digest[2:]
    assert store.read_object(digest) == data and store.verified_object_path(digest) == path
    mtime = path.stat().st_mtime_ns
    assert store.put_object(data) == digest
    assert path.stat().st_mtime_ns == mtime  # a valid copy is kept, not rewritten
    assert files_under(tmp_path) == [path]


def test_flipped_byte_raises_integrity_error_and_verify_reports_it(tmp_path: Path) -> None:
    store = Store(tmp_path)
    good, bad = store.put_object(b"good kernel"), store.put_object(b"x" * 4096)
    flip_one_byte(store.object_path(bad), at=2048)
    with pytest.raises(IntegrityError) as e:
        store.verified_object_path(bad)
    actual = sha256_file(store.object_path(bad))
    assert (e.value.expected, e.value.actual, e.value.source) == (bad, actual, str(store.object_path(bad)))
    assert bad in str(e.value) and actual in str(e.value) and "fa4-aot verify" in str(e.value)
    with pytest.raises(IntegrityError):
        store.read_object(bad)
    report = maintenance.verify(store)
    assert (report.ok, report.objects_checked, report.bad_objects) == (False, 2, [(bad, actual)])
    assert store.read_object(good) == b"good kernel"
    # Putting the same bytes again repairs the object.
    store.put_object(b"x" * 4096)
    assert maintenance.verify(store).ok


def test_entry_round_trip(tmp_path: Path) -> None:
    store = Store(tmp_path)
    entry = make_entry(store, b"kernel bytes")
    assert store.get_entry(entry.kernel_key) is None and not store.has_entry(entry.kernel_key)
    store.put_entry(entry)
    assert store.get_entry(entry.kernel_key) == entry
    assert store.has_entry(entry.kernel_key)
    assert store.entry_path(entry.kernel_key) == tmp_path / "index" / entry.kernel_key[:2] / f"{entry.kernel_key}.json"


def test_entry_is_a_commit_marker(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    entry = make_entry(Store(tmp_path / "elsewhere"), b"kernel bytes")
    with pytest.raises(StoreError, match=f"refusing index entry {entry.kernel_key}.*not stored"):
        store.put_entry(entry)
    assert not (tmp_path / "store").exists()
    # An object that vanishes after its entry was published is reported as a dangling entry.
    store.put_object(b"kernel bytes")
    store.put_entry(entry)
    store.object_path(entry.object_digest).unlink()
    report = maintenance.verify(store)
    assert (report.ok, report.entries_checked, report.dangling_entries) == (False, 1, [entry.kernel_key])


BAD_IDS = ["../../etc/passwd", "A" * 64, "a" * 63, "a" * 65, "g" * 64, "a" * 64 + "\n", "", "/" + "a" * 63,
           "../" + "a" * 61, "ab/" + "c" * 61, 64]
ID_USES = ["object_path", "entry_path", "get_entry", "has_entry", "has_object", "verified_object_path", "lock",
           "record_miss"]


@pytest.mark.parametrize("use", ID_USES)
@pytest.mark.parametrize("bad", BAD_IDS, ids=repr)
def test_malformed_ids_never_become_paths(tmp_path: Path, bad: object, use: str) -> None:
    store = Store(tmp_path / "store")
    arg = Miss(kernel_key=bad, family="f", compile_key=[], sku="h200") if use == "record_miss" else bad
    with pytest.raises(StoreError, match="expected 64 lowercase hex digits"):
        getattr(store, use)(arg)
    assert not (tmp_path / "store").exists()


def test_entries_filter_by_sku(tmp_path: Path) -> None:
    store = Store(tmp_path)
    assert list(store.entries()) == []
    made = [make_entry(store, f"kernel {i}".encode(), sku=sku) for i, sku in enumerate(["h200", "b200", "h200"])]
    for e in made:
        store.put_entry(e)
    assert sorted(e.kernel_key for e in store.entries()) == sorted(e.kernel_key for e in made)
    assert {e.kernel_key for e in store.entries(sku="h200")} == {made[0].kernel_key, made[2].kernel_key}
    assert [e.kernel_key for e in store.entries(sku="b200")] == [made[1].kernel_key]
    assert list(store.entries(sku="gb200")) == []


def test_corrupt_index_entry_is_a_store_error(tmp_path: Path) -> None:
    store = Store(tmp_path)
    entry = make_entry(store, b"kernel bytes")
    store.put_entry(entry)
    store.entry_path(entry.kernel_key).write_text('{"kernel_key": ')
    with pytest.raises(StoreError, match="unreadable index entry .*fa4-aot verify"):
        list(store.entries())
    with pytest.raises(StoreError, match="unreadable index entry"):
        store.get_entry(entry.kernel_key)
    report = maintenance.verify(store)
    assert not report.ok and [p for p, _ in report.bad_entries] == [
        f"index/{entry.kernel_key[:2]}/{entry.kernel_key}.json"]


def test_entry_filed_under_another_key_is_refused(tmp_path: Path) -> None:
    store = Store(tmp_path)
    entry = make_entry(store, b"kernel bytes")
    store.put_entry(entry)
    other = "f" * 64
    atomic_write(store.entry_path(other), store.entry_path(entry.kernel_key).read_bytes())
    with pytest.raises(StoreError, match=f"it is the entry of kernel {entry.kernel_key}, not of {other}"):
        store.get_entry(other)
    (bad,) = maintenance.verify(store).bad_entries
    assert bad[0] == f"index/ff/{other}.json" and "it is the entry of kernel" in bad[1]


def test_verify_flags_an_entry_whose_object_is_corrupt_or_the_wrong_size(tmp_path: Path) -> None:
    store = Store(tmp_path)
    entry = make_entry(store, b"kernel bytes")
    store.put_entry(entry)
    wrong_size = make_entry(store, b"other kernel")
    store.put_entry(Entry(**{**wrong_size.__dict__, "size": 3}))
    flip_one_byte(store.object_path(entry.object_digest))
    report = maintenance.verify(store)
    assert [k for k, _ in report.bad_objects] == [entry.object_digest]
    assert {p.split("/")[-1]: why for p, why in report.bad_entries} == {
        f"{entry.kernel_key}.json": f"its object {entry.object_digest} is corrupt or not 12 bytes",
        f"{wrong_size.kernel_key}.json": f"its object {wrong_size.object_digest} is corrupt or not 3 bytes"}


def test_misses_round_trip(tmp_path: Path) -> None:
    store = Store(tmp_path)
    assert store.misses() == []
    a = Miss(kernel_key="a" * 64, family="FlashAttentionForwardSm90", compile_key=["fwd", 1], sku="h200")
    b = Miss(kernel_key="b" * 64, family="FlashAttentionBackwardSm90", compile_key=[None], sku="b200", when="x")
    for m in (b, a, a):
        store.record_miss(m)
    assert store.misses() == [a, b]


def test_gc_removes_unreferenced_objects_and_dead_writers_temp_files(tmp_path: Path) -> None:
    store = Store(tmp_path)
    kept = make_entry(store, b"referenced")
    store.put_entry(kept)
    orphan = store.put_object(b"orphan!")
    folder = store.object_path(orphan).parent
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_tmp = folder / f".{orphan[2:]}.{int(dead.stdout)}.0badc0de.tmp"
    live_tmp = folder / f".{orphan[2:]}.{os.getpid()}.12345678.tmp"
    for tmp in (dead_tmp, live_tmp):
        tmp.write_bytes(b"partial")
    before = files_under(tmp_path)

    report = maintenance.gc(store, dry_run=True)
    assert (report.removed_objects, report.removed_temp_files, report.bytes_freed) == ([orphan], 1, 7)
    assert files_under(tmp_path) == before

    report = maintenance.gc(store)
    assert (report.removed_objects, report.removed_temp_files, report.bytes_freed) == ([orphan], 1, 7)
    assert not store.has_object(orphan) and not dead_tmp.exists()
    assert live_tmp.exists() and store.read_object(kept.object_digest) == b"referenced"
    assert maintenance.verify(store).ok
    assert maintenance.gc(store).removed_objects == []


def test_gc_clears_temp_files_even_with_an_unreadable_entry(tmp_path: Path) -> None:
    """The server's startup cleanup (gc with an infinite min_age) must not need a readable index."""
    store = Store(tmp_path)
    entry = make_entry(store, b"kernel bytes")
    store.put_entry(entry)
    store.entry_path(entry.kernel_key).write_text("{not json")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    tmp = store.object_path(entry.object_digest).parent / f".x.{int(dead.stdout)}.00000000.tmp"
    tmp.write_bytes(b"partial")
    assert maintenance.gc(store, min_age=float("inf")).removed_temp_files == 1 and not tmp.exists()
    with pytest.raises(StoreError, match="unreadable index entry"):  # objects are never removed blind
        maintenance.gc(store, min_age=0)
    assert store.has_object(entry.object_digest)


def test_read_object_returns_the_bytes_it_hashed(tmp_path: Path) -> None:
    store = Store(tmp_path)
    digest = store.put_object(b"kernel bytes")
    assert store.read_object(digest) == b"kernel bytes"
    flip_one_byte(store.object_path(digest))
    with pytest.raises(IntegrityError, match="fa4-aot verify"):
        store.read_object(digest)


def test_verified_object_path_refuses_a_file_swapped_while_hashing(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store(tmp_path)
    digest = store.put_object(b"kernel bytes")
    path = store.object_path(digest)
    real = store_objects.hash_stream

    def hash_then_swap(f: object, keep: object = None) -> object:
        h = real(f, keep)  # type: ignore[arg-type]
        atomic_write(path, b"other bytes!")  # another writer renames a file over the one just hashed
        return h

    monkeypatch.setattr(store_objects, "hash_stream", hash_then_swap)
    with pytest.raises(StoreError, match=f"object {path} changed while it was being verified"):
        store.verified_object_path(digest)


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EFBIG, errno.EDQUOT], ids=errno.errorcode.get)
def test_a_full_disk_is_one_clean_error_and_leaves_nothing(tmp_path: Path, code: int) -> None:
    def chunks() -> object:
        yield b"half"
        raise OSError(code, os.strerror(code))

    target = tmp_path / "objects" / "ab" / "file"
    with pytest.raises(DiskFull) as info:
        atomic_write(target, chunks())  # type: ignore[arg-type]
    message = str(info.value)
    assert f"no space left writing {target}" in message and "FA4_AOT_CACHE" in message and "\n" not in message
    assert isinstance(info.value, StoreError) and files_under(tmp_path) == []
    again = pickle.loads(pickle.dumps(info.value))  # crosses from build workers to the CLI intact
    assert type(again) is DiskFull and str(again) == message


def test_sha256_file_refuses_a_symlink(tmp_path: Path) -> None:
    (tmp_path / "real").write_bytes(b"x")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert sha256_file(tmp_path / "real") == hashlib.sha256(b"x").hexdigest()
    with pytest.raises(StoreError, match=f"refusing symlink {tmp_path / 'link'}"):
        sha256_file(tmp_path / "link")


def _chunks_then_boom() -> object:
    yield b"new "
    yield b"half"
    raise RuntimeError("boom")


@pytest.mark.parametrize(
    ("data", "expected"),
    [(b"bytes", b"bytes"), (bytearray(b"ba"), b"ba"), (memoryview(b"mv"), b"mv"), ([b"a", b"b"], b"ab"),
     ((c for c in (b"g", b"en")), b"gen"), (b"", b"")],
    ids=["bytes", "bytearray", "memoryview", "list", "generator", "empty"],
)
def test_atomic_write_forms(tmp_path: Path, data: object, expected: bytes) -> None:
    target = tmp_path / "deep" / "er" / "file"
    atomic_write(target, data)  # type: ignore[arg-type]
    assert target.read_bytes() == expected
    assert files_under(tmp_path) == [target]


def test_atomic_write_failure_keeps_old_content_and_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "file"
    atomic_write(target, b"old content")
    with pytest.raises(RuntimeError, match="boom"):
        atomic_write(target, _chunks_then_boom())  # type: ignore[arg-type]
    assert target.read_bytes() == b"old content"
    assert files_under(tmp_path) == [target]


WRITER = """
import os, sys, pathlib, fa4_aot.store
store = fa4_aot.store.Store(pathlib.Path(sys.argv[1]))
print("ready", flush=True)
while True:
    store.put_object(os.urandom(1 << 20))
"""
STALLED_WRITER = """
import sys, time, pathlib
from fa4_aot.store.atomic import atomic_write
def chunks():
    yield b"x" * 65536
    print("mid-write", flush=True)
    time.sleep(60)
atomic_write(pathlib.Path(sys.argv[1]) / "objects" / "ab" / ("cd" * 31), chunks())
"""


def _kill_after(script: str, root: Path, ready: bytes, delay: float) -> None:
    child = subprocess.Popen([sys.executable, "-c", script, str(root)], stdout=subprocess.PIPE, env=CHILD_ENV)
    try:
        assert child.stdout is not None and child.stdout.readline() == ready
        time.sleep(delay)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert child.returncode == -signal.SIGKILL


def test_sigkilled_writers_leave_only_temp_files_and_whole_objects(tmp_path: Path) -> None:
    store = Store(tmp_path)
    rng = random.Random()
    for _ in range(5):
        _kill_after(WRITER, tmp_path, b"ready\n", rng.uniform(0.0, 0.3))
    _kill_after(STALLED_WRITER, tmp_path, b"mid-write\n", 0.0)  # certainly killed inside atomic_write

    files = files_under(tmp_path / "objects")
    temps = [p for p in files if p.name.startswith(".")]
    assert temps and all(p.name.endswith(".tmp") for p in temps)
    for p in files:
        if p not in temps:
            assert len(p.parent.name + p.name) == 64 and sha256_file(p) == p.parent.name + p.name, p
    assert maintenance.verify(store).ok

    kept = make_entry(store, b"referenced")
    store.put_entry(kept)
    report = maintenance.gc(store)
    assert report.removed_temp_files == len(temps)
    assert files_under(tmp_path / "objects") == [store.object_path(kept.object_digest)]
    assert maintenance.verify(store).ok


LOCKER = """
import sys, pathlib, fa4_aot.store.locking as f, fa4_aot.errors as e
try:
    with f.FileLock(pathlib.Path(sys.argv[1]), timeout=float(sys.argv[2])):
        print("acquired")
except e.StoreError as err:
    print("StoreError:", err)
"""


def _try_lock(path: Path, timeout: float) -> str:
    out = subprocess.run([sys.executable, "-c", LOCKER, str(path), str(timeout)], capture_output=True, text=True,
                         env=CHILD_ENV, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_file_lock_excludes_other_processes_and_times_out_naming_the_lock(tmp_path: Path) -> None:
    store = Store(tmp_path)
    with store.lock("e" * 64, timeout=1) as held:
        assert isinstance(held, FileLock)
        started = time.monotonic()
        message = _try_lock(held.path, 0.3)
        assert time.monotonic() - started >= 0.3
        assert message.startswith("StoreError: timed out") and str(tmp_path / "locks" / ("e" * 64)) in message
    assert _try_lock(held.path, 0.3) == "acquired"
