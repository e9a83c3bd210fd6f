"""Issue 18, D23 and D28: the lean runtime's library objects on a real store (tests/data/store_h200_xeon, five h200
kernels with their linked libraries, plus CuTe's runtime library from this environment's wheel).

D23: `verify` checks every object an entry refers to (its kernel, its linked libraries and the runtime libraries
they need), drops a broken library from its entries so that `fa4-aot build` links it again and a lean client
fetches it again; a bundle that left library bytes out is fetched again. D28: a lean process leaves no folder in
the temp directory.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from fa4_aot.domain.skus import Sku
from fa4_aot.errors import KernelMissing
from fa4_aot.remote.http import Remote
from fa4_aot.runtime.fetch import Fetcher
from fa4_aot.runtime.libraries import Libraries
from fa4_aot.store import Entry, Store, maintenance
from fa4_aot.trust.policy import Trust
from tests.conftest import ROOT, TINY_VARIANTS, run_cli
from tests.helpers.raw_server import RawServer, reply

RUNTIME = "libcute_dsl_runtime.so"
H200 = Sku("h200", "sm_90a", 132, 62914560, 13, host="x86-64-v3")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny h200 matrix built here once, with this toolchain's keys (a build finds only its own toolchain's
    kernels, so a store committed by an earlier toolchain would not be the one it relinks)."""
    root = tmp_path_factory.mktemp("library-faults") / "cache"
    _build(Store(root))
    return root


@pytest.fixture
def store(built: Path, tmp_path: Path) -> Store:
    """A copy of the built store, whole: every entry's library and the runtime library they need."""
    root = tmp_path / "cache"
    shutil.copytree(built, root, symlinks=True)
    s = Store(root)
    assert maintenance.verify(s).ok and _missing(s) == []
    return s


def _missing(store: Store) -> list[tuple[str, str]]:
    """(kernel key, digest) of every object an entry names that the store does not hold."""
    return [(e.kernel_key, d) for e in store.entries() for d in sorted(e.digests()) if not store.has_object(d)]


def _flip(store: Store, digest: str) -> None:
    path = store.object_path(digest)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.chmod(0o600)
    path.write_bytes(bytes(data))


def _build(store: Store) -> dict:
    done = run_cli("build", "--sku", "h200", "--variants", str(TINY_VARIANTS), "--json", cache=store.root)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_d23_verify_checks_library_objects(store: Store) -> None:
    """A corrupt library was quarantined while its entries still named it: a second verify passed, build did not
    relink, and every lean load failed with a StoreError. Now verify drops the library from its entries, the next
    build links it again (the same bytes: linking is hermetic) and the kernel loads."""
    victim = next(iter(store.entries()))
    library = victim.shared_libs["x86_64"]["digest"]
    _flip(store, library)
    report = maintenance.verify(store, quarantine=True)
    assert [e.kernel_key for e in store.entries() if library in e.digests()] == [], \
        "an entry still names the quarantined library"
    assert not report.ok and [e for e, _a in report.bad_objects] == [library]
    assert (victim.kernel_key, "x86_64") in {(k, a) for k, a, _why in report.broken_libraries}
    again = maintenance.verify(store)
    assert again.ok and _missing(store) == []
    with pytest.raises(KernelMissing, match="fa4-aot build --sku h200"):
        Libraries(store, "h200").function(victim.kernel_key, victim.family)
    assert _build(store)["lean_failures"] == []
    assert store.get_entry(victim.kernel_key).shared_libs["x86_64"]["digest"] == library
    assert maintenance.verify(store).ok and _missing(store) == []


def test_d23_verify_reports_a_missing_runtime_library_and_build_restores_it(store: Store) -> None:
    """Deleting the 43 MB CuTe runtime library passed verify, and build never put it back."""
    runtime = next(iter(store.entries())).shared_libs["x86_64"]["needs"][RUNTIME]
    store.remove_object(runtime)
    report = maintenance.verify(store)
    assert not report.ok
    assert {k for k, _arch, _why in report.broken_libraries} == {e.kernel_key for e in store.entries()}
    assert all(runtime in why and "missing" in why for _k, _a, why in report.broken_libraries)
    assert _build(store)["lean_failures"] == []
    assert store.object_state(runtime) == "ok" and maintenance.verify(store).ok


def _bundle(entries: list[Entry], objects: dict[str, bytes]) -> bytes:
    head = {"entries": [e.published() for e in entries], "missing": [],
            "objects": [[d, len(data)] for d, data in objects.items()]}
    return json.dumps(head).encode() + b"\n" + b"".join(objects.values())


def test_d23_bundle_without_library_bytes_is_fetched_later(store: Store, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A server's bundle named a kernel's library but left its bytes out: the entry was stored naming bytes the
    store lacks and never fetched again (every load: StoreError). The lean client now asks again."""
    monkeypatch.setenv("FA4_AOT_INSECURE", "1")
    monkeypatch.delenv("FA4_AOT_TRUSTED_KEYS", raising=False)
    entry = next(e for e in store.entries() if not e.hardware_queries)
    everything = {d: store.read_object(d) for d in sorted(entry.digests())}
    bundles = []

    def handle(path: str, conn: socket.socket) -> None:
        if path != "/v1/bundles":
            server.send(conn, reply(404, b'{"detail": "no"}'))
            return
        bundles.append(path)  # the first answer leaves the libraries out, later ones carry them
        sent = everything if len(bundles) > 1 else {entry.object_digest: everything[entry.object_digest]}
        server.send(conn, reply(200, _bundle([entry], sent), "application/octet-stream"))

    gpu = Store(tmp_path / "gpu")
    with RawServer(handle) as server:
        remote = Remote(server.url)
        trust = Trust(H200, gpu, remote, {}, insecure=True)
        libraries = Libraries(gpu, "h200", None, trust, Fetcher(remote, trust, gpu))
        function = libraries.function(entry.kernel_key, entry.family)
    assert type(function).__name__ == "Function" and len(bundles) >= 2  # a retry under load may add one
    assert _missing(gpu) == []


PROBE = r"""
import sys
from pathlib import Path
from fa4_aot.runtime.libraries import Libraries
from fa4_aot.store import Store
store = Store(Path(sys.argv[1]))
libraries = Libraries(store, "h200")
print([type(libraries.function(e.kernel_key, e.family)).__name__ for e in store.entries()])
"""


def test_d28_lean_process_leaves_no_temp_folder(store: Store, tmp_path: Path) -> None:
    """Every lean process left an empty fa4-aot-lean-* folder in the temp directory (Libraries were never
    closed): a real process loads every kernel of the store, exits, and the temp directory is as it was."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    done = subprocess.run([sys.executable, "-c", PROBE, str(store.root)], capture_output=True, text=True, cwd=ROOT,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(temp),
                                            "FA4_AOT_LINK_DIR": str(temp)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Function" in done.stdout and len(list(store.entries())) >= 5
    assert sorted(p.name for p in temp.iterdir()) == []


def test_a_batchs_link_folder_is_removed_empty_or_not(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """D28: a batch's link folder goes when the batch ends (one rmdir when its links are gone, as after every load;
    the whole tree when one is left, e.g. by a load that failed between making and removing its link)."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("FA4_AOT_LINK_DIR", str(temp))
    libraries = Libraries(Store(tmp_path / "cache"), "h200")
    with libraries._batch():
        assert libraries._links is not None and libraries._links.parent == temp
    with libraries._batch():
        assert libraries._links is not None
        (libraries._links / "left.so").symlink_to("/proc/self/fd/0")
    assert list(temp.iterdir()) == [] and libraries._links is None


def test_link_folders_go_in_memory_where_the_host_has_a_memory_filesystem(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """config.link_dir: $FA4_AOT_LINK_DIR, else $XDG_RUNTIME_DIR, else a memory filesystem (/dev/shm), else the
    temp directory; a candidate this process cannot write is passed over. A batch's folder is made there."""
    import tempfile

    from fa4_aot import config

    runtime, shm, temp = (tmp_path / name for name in ("run-user", "shm", "tmp"))
    for folder in (runtime, shm, temp):
        folder.mkdir()
    monkeypatch.delenv("FA4_AOT_LINK_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    monkeypatch.setattr(config, "MEMORY_FOLDERS", (str(tmp_path / "absent"), str(shm)))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert config.link_dir() == str(runtime)
    runtime.chmod(0o500)  # not writable: passed over (root may write anyway, so only where the check bites)
    if not os.access(runtime, os.W_OK):
        assert config.link_dir() == str(shm)
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert config.link_dir() == str(shm)
    libraries = Libraries(Store(tmp_path / "cache"), "h200")
    with libraries._batch():
        assert libraries._links is not None and libraries._links.parent == shm
    assert list(shm.iterdir()) == []
    monkeypatch.setattr(config, "MEMORY_FOLDERS", ())
    assert config.link_dir() == str(temp)
    monkeypatch.setenv("FA4_AOT_LINK_DIR", str(tmp_path))
    assert config.link_dir() == str(tmp_path)


def test_a_link_folder_goes_only_where_no_other_user_can_replace_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """config.safe_parent: a folder others may write is used only with the sticky bit (as /tmp), since another user
    could otherwise rename this process's private folder and put one of their own, with their links, in its place.
    A $FA4_AOT_LINK_DIR that fails the test, or is no folder, is a ConfigError naming the fix at the first load; a
    default candidate that fails it is passed over. A folder that cannot be made there (a full /dev/shm) falls back
    to the temp directory."""
    import stat
    import tempfile

    from fa4_aot import config
    from fa4_aot.errors import ConfigError

    open_, sticky, temp = (tmp_path / name for name in ("open", "sticky", "tmp"))
    for folder in (open_, sticky, temp):
        folder.mkdir()
    open_.chmod(0o777)
    sticky.chmod(0o777 | stat.S_ISVTX)
    assert not config.safe_parent(str(open_)) and config.safe_parent(str(sticky))
    assert not config.safe_parent(str(tmp_path / "absent"))
    for bad in (open_, tmp_path / "absent"):
        monkeypatch.setenv("FA4_AOT_LINK_DIR", str(bad))
        with pytest.raises(ValueError, match="FA4_AOT_LINK_DIR"):
            config.link_dir()
        with pytest.raises(ConfigError, match="FA4_AOT_LINK_DIR"), Libraries(Store(tmp_path / "c"), "h200")._batch():
            pass
    monkeypatch.delenv("FA4_AOT_LINK_DIR")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(open_))
    monkeypatch.setattr(config, "MEMORY_FOLDERS", (str(sticky),))
    assert config.link_dir() == str(sticky)

    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    real = tempfile.mkdtemp

    def full(*args: object, **kwargs: object) -> str:
        if kwargs.get("dir") == str(sticky):
            raise OSError(28, "No space left on device")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(tempfile, "mkdtemp", full)
    libraries = Libraries(Store(tmp_path / "cache"), "h200")
    with libraries._batch():
        assert libraries._links is not None and libraries._links.parent == temp
    assert list(temp.iterdir()) == []
