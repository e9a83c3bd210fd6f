"""The local store as an attack surface (issue: Trust, item 3): a store that another user could write is refused,
no link inside a store is ever followed, new files are owner-only, and `verify` quarantines what fails.

These run as root on the CI machines, so "another user" is made with os.chown to nobody."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from fa4_aot.cli import main
from fa4_aot.errors import IntegrityError, StoreError
from fa4_aot.store import Entry, Miss, Store, maintenance
from tests.conftest import proven

pytestmark = pytest.mark.bad_input("cache contents")
NOBODY = 65534


@pytest.fixture(autouse=True)
def _private(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FA4_AOT_SHARED_CACHE", raising=False)
    monkeypatch.delenv("FA4_AOT_CACHE", raising=False)


def publish(store: Store, data: bytes, key: str | None = None) -> Entry:
    entry = Entry(
        kernel_key="", object_digest=store.put_object(data),
        size=len(data), family="_flash_attn_fwd", compile_key=["fwd", 128, hashlib.sha256(data).hexdigest()],
        sku="h200", arch="sm_90a", sm_count=132, l2_bytes=62914560, cuda_major=13,
        toolchain={"flash-attn-4": "4.0.0b36"}, variant="t", call="c", compile_seconds=0.1)
    entry = dataclasses.replace(entry, kernel_key=key) if key else proven(entry)
    store.put_entry(entry)
    return entry


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def every_read(store: Store, entry: Entry) -> list[Callable[[], object]]:
    """Each reader, as a thunk, for pytest.raises loops."""
    return [lambda: store.read_object(entry.object_digest), lambda: store.verified_object_path(entry.object_digest),
            lambda: store.has_object(entry.object_digest), lambda: store.get_entry(entry.kernel_key),
            lambda: store.has_entry(entry.kernel_key), lambda: list(store.entries())]


def cli(root: Path, *args: str) -> Result:
    return CliRunner().invoke(main, ["--cache-dir", str(root), *args])


# -- who may write the root --------------------------------------------------------------------------------
def test_foreign_owned_root_is_refused_with_the_fix(tmp_path: Path) -> None:
    root = tmp_path / "store"
    entry = publish(Store(root), b"kernel")
    os.chown(root, NOBODY, NOBODY)
    store = Store(root)
    for read in every_read(store, entry):
        with pytest.raises(StoreError) as info:
            read()
        message = str(info.value)
        assert f"store folder {root} is owned by uid {NOBODY}" in message and "not by you (uid 0" in message
        assert f"chown -R 0 {root}" in message and "FA4_AOT_CACHE" in message and "FA4_AOT_SHARED_CACHE=1" in message
    before = sorted(root.rglob("*"))
    with pytest.raises(StoreError, match="is owned by uid"):
        store.put_object(b"new kernel")
    assert sorted(root.rglob("*")) == before
    result = cli(root, "list")
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.count("\n") == 1 and result.output.startswith("Error: store folder")


def test_foreign_owned_objects_folder_is_refused(tmp_path: Path) -> None:
    entry = publish(Store(tmp_path), b"kernel")
    os.chown(tmp_path / "objects", NOBODY, NOBODY)
    with pytest.raises(StoreError, match=f"store folder {tmp_path / 'objects'} is owned by uid {NOBODY}"):
        Store(tmp_path).read_object(entry.object_digest)


def test_foreign_owned_root_is_allowed_as_a_shared_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entry = publish(Store(tmp_path), b"kernel")
    os.chown(tmp_path, NOBODY, NOBODY)
    monkeypatch.setenv("FA4_AOT_SHARED_CACHE", "1")
    assert Store(tmp_path).read_object(entry.object_digest) == b"kernel"


def test_world_writable_root_is_refused_even_when_shared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entry = publish(Store(tmp_path), b"kernel")
    tmp_path.chmod(0o777)
    for shared in ("0", "1"):
        monkeypatch.setenv("FA4_AOT_SHARED_CACHE", shared)
        with pytest.raises(StoreError) as info:
            Store(tmp_path).get_entry(entry.kernel_key)
        message = str(info.value)
        assert f"store folder {tmp_path} has mode 0777, writable by everyone" in message
        assert f"chmod go-w {tmp_path}" in message and "FA4_AOT_CACHE" in message
        assert "FA4_AOT_SHARED_CACHE" not in message  # the escape hatch does not cover this


def test_world_writable_index_folder_is_refused(tmp_path: Path) -> None:
    entry = publish(Store(tmp_path), b"kernel")
    (tmp_path / "index").chmod(0o757)
    with pytest.raises(StoreError, match=f"store folder {tmp_path / 'index'} has mode 0757"):
        Store(tmp_path).get_entry(entry.kernel_key)


def test_group_writable_root_is_refused_without_shared_cache(tmp_path: Path) -> None:
    entry = publish(Store(tmp_path), b"kernel")
    tmp_path.chmod(0o770)
    with pytest.raises(StoreError) as info:
        Store(tmp_path).read_object(entry.object_digest)
    message = str(info.value)
    assert f"has mode 0770, writable by group {tmp_path.stat().st_gid}" in message
    assert "chmod go-w" in message and "FA4_AOT_SHARED_CACHE=1 for a node-shared cache" in message


def test_group_writable_root_is_allowed_with_shared_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entry = publish(Store(tmp_path), b"kernel")
    tmp_path.chmod(0o2770)
    (tmp_path / "objects").chmod(0o2770)
    monkeypatch.setenv("FA4_AOT_SHARED_CACHE", "1")
    store = Store(tmp_path)
    assert store.read_object(entry.object_digest) == b"kernel"
    other = publish(store, b"another kernel")
    # the group can read what one member adds, and add to it
    assert mode(store.object_path(other.object_digest)) == 0o640
    assert mode(store.entry_path(other.kernel_key)) == 0o640
    assert mode(store.object_path(other.object_digest).parent) == 0o2770


def test_check_root_runs_once_per_store(tmp_path: Path) -> None:
    store = Store(tmp_path)
    entry = publish(store, b"kernel")
    tmp_path.chmod(0o777)  # after the first use: this instance has checked already, a new one checks again
    assert store.read_object(entry.object_digest) == b"kernel"
    with pytest.raises(StoreError, match="writable by everyone"):
        Store(tmp_path).check_root()


# -- links ------------------------------------------------------------------------------------------------
def test_symlinked_object_file_is_refused_and_quarantined(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    entry = publish(store, b"kernel")
    path = store.object_path(entry.object_digest)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(b"kernel")  # even the right bytes: whoever owns the target can change them later
    path.unlink()
    path.symlink_to(elsewhere)
    for read in every_read(store, entry)[:3]:  # the object's readers; the entry itself is fine
        with pytest.raises(StoreError, match=f"refusing symlink {path}"):
            read()
    with pytest.raises(StoreError, match="refusing symlink"):
        store.put_object(b"kernel")
    report = maintenance.verify(store, quarantine=True)
    rel = str(path.relative_to(store.root))
    assert report.symlinks == [rel] and not report.ok and rel in report.quarantined
    assert Path(report.quarantined[rel]).is_symlink() and elsewhere.read_bytes() == b"kernel"
    assert maintenance.verify(store).ok and store.get_entry(entry.kernel_key) is None  # its entry went too (dangling)
    publish(store, b"kernel")  # a rebuild writes a real file
    assert not path.is_symlink() and store.read_object(entry.object_digest) == b"kernel"


def test_symlinked_index_entry_is_refused_and_quarantined(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    entry = publish(store, b"kernel")
    path = store.entry_path(entry.kernel_key)
    elsewhere = tmp_path / "entry.json"
    elsewhere.write_bytes(path.read_bytes())
    path.unlink()
    path.symlink_to(elsewhere)
    for read in (lambda: store.get_entry(entry.kernel_key), lambda: store.has_entry(entry.kernel_key),
                 lambda: list(store.entries())):
        with pytest.raises(StoreError, match=f"refusing symlink {path}"):
            read()
    report = maintenance.verify(store, quarantine=True)
    assert report.symlinks == [str(path.relative_to(store.root))] and not path.is_symlink()
    assert maintenance.verify(store).ok and list(store.entries()) == []


@pytest.mark.parametrize("folder", ["objects", "index"])
def test_symlinked_fanout_folder_is_refused_and_quarantined(tmp_path: Path, folder: str) -> None:
    store = Store(tmp_path / "store")
    entry = publish(store, b"kernel")
    inside = store.object_path(entry.object_digest) if folder == "objects" else store.entry_path(entry.kernel_key)
    fanout = inside.parent
    moved = tmp_path / "moved"
    fanout.rename(moved)
    fanout.symlink_to(moved)
    reads = every_read(store, entry)[:3] if folder == "objects" else every_read(store, entry)[3:]
    for read in reads:
        with pytest.raises(StoreError, match=f"refusing symlink {fanout}"):
            read()
    if folder == "objects":
        with pytest.raises(StoreError, match="refusing symlink"):  # a write never lands in the link's target
            store.put_object(b"kernel")
        assert sorted(p.name for p in moved.iterdir()) == [entry.object_digest[2:]]
    report = maintenance.verify(store, quarantine=True)
    assert str(fanout.relative_to(store.root)) in report.symlinks and not fanout.exists()
    assert maintenance.verify(store).ok and list(store.entries()) == []


def test_symlinked_top_folder_is_refused(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    entry = publish(store, b"kernel")
    (tmp_path / "store" / "index").rename(tmp_path / "index")
    (tmp_path / "store" / "index").symlink_to(tmp_path / "index")
    with pytest.raises(StoreError, match=f"refusing symlink {tmp_path / 'store' / 'index'}"):
        Store(tmp_path / "store").get_entry(entry.kernel_key)


def test_symlinked_lock_and_miss_are_refused(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    publish(store, b"kernel")
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    (store.root / "locks").mkdir(mode=0o700, exist_ok=True)  # publish made it: put_entry locks the object
    (store.root / "locks" / ("a" * 64)).symlink_to(victim)
    with pytest.raises(StoreError, match="refusing symlink"):
        with store.lock("a" * 64):
            pass
    (store.root / "misses").mkdir(mode=0o700)
    (store.root / "misses" / f"{'b' * 64}.json").symlink_to(victim)
    with pytest.raises(StoreError, match="refusing symlink"):
        store.record_miss(Miss(kernel_key="b" * 64, family="f", compile_key=[], sku="h200"))
    with pytest.raises(StoreError, match="refusing symlink"):
        store.misses()
    assert victim.read_bytes() == b"keep me"


def test_symlinked_root_is_allowed(tmp_path: Path) -> None:
    real = tmp_path / "real"
    entry = publish(Store(real), b"kernel")
    (tmp_path / "link").symlink_to(real)
    store = Store(tmp_path / "link")
    assert store.root == real  # resolved once, at construction
    assert store.read_object(entry.object_digest) == b"kernel" and maintenance.verify(store).ok
    assert store.verified_object_path(entry.object_digest) == real / "objects" / entry.object_digest[:2] / \
        entry.object_digest[2:]


def test_special_file_at_an_object_path_is_refused_without_blocking(tmp_path: Path) -> None:
    store = Store(tmp_path)
    entry = publish(store, b"kernel")
    path = store.object_path(entry.object_digest)
    path.unlink()
    os.mkfifo(path)
    started = time.monotonic()
    with pytest.raises(StoreError, match=f"{path} is not a regular file"):
        store.read_object(entry.object_digest)
    assert time.monotonic() - started < 5


# -- permissions of what the store creates ------------------------------------------------------------------
@pytest.mark.parametrize("umask", [0o022, 0o000, 0o077])
def test_new_files_and_folders_are_owner_only(tmp_path: Path, umask: int) -> None:
    old = os.umask(umask)
    try:
        store = Store(tmp_path / "a" / "store")
        entry = publish(store, b"kernel")
        store.record_miss(Miss(kernel_key="c" * 64, family="f", compile_key=[], sku="h200"))
        with store.lock("d" * 64):
            pass
    finally:
        os.umask(old)
    root = tmp_path / "a" / "store"
    folders = [root, *(p for p in root.rglob("*") if p.is_dir())]
    files = [p for p in root.rglob("*") if p.is_file()]
    assert {f.name for f in folders} >= {"store", "objects", "index", "misses", "locks", entry.object_digest[:2]}
    assert len(files) == 5 and {mode(f) for f in files} == {0o600}  # object, entry, miss, and two locks
    assert {mode(f) for f in folders} == {0o700}
    assert all(f.stat().st_uid == os.geteuid() for f in folders + files)


# -- integrity and quarantine -------------------------------------------------------------------------------
def test_truncated_object_is_detected_and_quarantined(tmp_path: Path) -> None:
    store = Store(tmp_path)
    entry, kept = publish(store, b"kernel bytes " * 100), publish(store, b"other kernel")
    path = store.object_path(entry.object_digest)
    os.truncate(path, 100)
    with pytest.raises(IntegrityError):
        store.verified_object_path(entry.object_digest)
    report = maintenance.verify(store, quarantine=True)
    obj, idx = (str(p.relative_to(tmp_path)) for p in (path, store.entry_path(entry.kernel_key)))
    assert [d for d, _ in report.bad_objects] == [entry.object_digest] and set(report.quarantined) == {obj, idx}
    assert list(report.quarantined) == [idx, obj]  # the entry first: a reader sees no entry, never a bad object
    quarantined = Path(report.quarantined[obj])
    assert report.quarantine_dir and quarantined == Path(report.quarantine_dir) / obj
    assert quarantined.stat().st_size == 100 and Path(report.quarantine_dir).parent == tmp_path / "quarantine"
    assert store.get_entry(entry.kernel_key) is None and not store.has_object(entry.object_digest)
    assert store.read_object(kept.object_digest) == b"other kernel"
    again = maintenance.verify(store)
    assert again.ok and again.objects_checked == 1 and again.entries_checked == 1


def test_corrupt_index_entry_is_quarantined(tmp_path: Path) -> None:
    store = Store(tmp_path)
    entry, kept = publish(store, b"kernel"), publish(store, b"other kernel")
    path = store.entry_path(entry.kernel_key)
    path.write_bytes(b'{"kernel_key": "' + entry.kernel_key.encode() + b'", \xff')
    with pytest.raises(StoreError, match="unreadable index entry"):
        list(store.entries())
    result = cli(tmp_path, "verify")
    assert result.exit_code == 1
    rel = str(path.relative_to(tmp_path))
    assert f"BAD entry {rel}: unreadable index entry" in result.output
    assert " -> quarantined to " in result.output and "1 problem(s), moved to" in result.output
    assert [e.kernel_key for e in store.entries()] == [kept.kernel_key]
    assert store.has_object(entry.object_digest)  # the object was fine: only the entry went
    assert cli(tmp_path, "verify").exit_code == 0


def test_non_utf8_name_inside_objects_is_reported_cleanly(tmp_path: Path) -> None:
    store = Store(tmp_path)
    entry = publish(store, b"kernel")
    fanout = os.fsencode(store.object_path(entry.object_digest).parent)
    for name in (fanout + b"/\xff\xfename", os.fsencode(tmp_path / "objects") + b"/\xc3("):
        fd = os.open(name, os.O_WRONLY | os.O_CREAT, 0o600)
        os.close(fd)
    report = maintenance.verify(store, quarantine=True)
    assert report.ok and report.objects_checked == 1 and report.quarantined == {}
    assert sorted(report.unexpected) == [f"objects/{entry.object_digest[:2]}/\\xff\\xfename", "objects/\\xc3("]
    for args in (["verify"], ["verify", "--json"], ["gc", "--min-age", "0"], ["list"]):
        result = cli(tmp_path, *args)
        assert result.exit_code == 0 and result.exception is None, result.output
    doc = json.loads(cli(tmp_path, "verify", "--json").stdout)
    assert doc["ok"] is True and len(doc["unexpected"]) == 2
    assert "UNEXPECTED objects/\\xc3(: not a store name" in cli(tmp_path, "verify").output
    assert store.read_object(entry.object_digest) == b"kernel" and [e.kernel_key for e in store.entries()] == [
        entry.kernel_key]


def test_temp_files_are_invisible_to_readers(tmp_path: Path) -> None:
    store = Store(tmp_path)
    entry = publish(store, b"kernel")
    for folder in (store.object_path(entry.object_digest).parent, store.entry_path(entry.kernel_key).parent):
        (folder / f".{'e' * 62}.json.{os.getpid()}.0badc0de.tmp").write_bytes(b"{partial")
    assert [e.kernel_key for e in store.entries()] == [entry.kernel_key]
    report = maintenance.verify(store, quarantine=True)
    assert report.ok and report.unexpected == [] and report.quarantined == {} and report.objects_checked == 1
