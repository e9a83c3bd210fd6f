"""commit.commit_kernel (compile.commit): how a built kernel enters a store: a kernel built by a remote (Ray) worker
with the library the worker linked for the lean runtime, objects first and entries last, never naming bytes the
store lacks; and, as builders compile with no lock held, a second builder's copy of a kernel the store already
holds is discarded under the lock (issue 20, point 6)."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pytest

from fa4_aot.compile import orchestrator
from fa4_aot.compile.commit import commit_kernel, stored_key
from fa4_aot.domain import kernel_keys
from fa4_aot.store import Entry, Store
from fa4_aot.store.maintenance import verify
from tests.store.test_store import make_entry
from tests.store.test_store_compat import H200

OBJECT, LIBRARY, RUNTIME = b"exported kernel object", b"linked kernel library", b"CuTe runtime library"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _built_remotely(tmp_path: Path, key: str) -> Entry:
    """An entry as a Ray worker returns it: its library for x86_64 needs the runtime library."""
    entry = make_entry(Store(tmp_path / "worker"), OBJECT, tag=key)
    needs = {"libcute_dsl_runtime.so": _sha(RUNTIME), "libtvm_ffi.so": ""}
    return dataclasses.replace(entry, shared_libs={"x86_64": {"digest": _sha(LIBRARY), "size": len(LIBRARY),
                                                               "needs": needs}})


def test_a_returned_library_is_named_once_the_runtime_it_needs_is_stored(tmp_path: Path) -> None:
    store = Store(tmp_path / "driver")
    first = _built_remotely(tmp_path, "a" * 64)
    assert orchestrator.commit(store, [first], OBJECT, {_sha(LIBRARY): LIBRARY})
    assert store.has_object(_sha(LIBRARY))
    assert store.get_entry(first.kernel_key).shared_libs == {}  # runtime absent: relinked on this host later
    store.put_object(RUNTIME)
    second = _built_remotely(tmp_path, "b" * 64)
    assert orchestrator.commit(store, [second], OBJECT, {_sha(LIBRARY): LIBRARY})
    assert store.get_entry(second.kernel_key).shared_libs == second.shared_libs
    assert verify(store).ok


def test_returned_library_bytes_that_do_not_hash_to_their_digest_store_no_entry(tmp_path: Path) -> None:
    store = Store(tmp_path / "driver")
    store.put_object(RUNTIME)
    entry = _built_remotely(tmp_path, "c" * 64)
    assert not orchestrator.commit(store, [entry], OBJECT, {_sha(LIBRARY): b"something else"})
    assert store.get_entry(entry.kernel_key) is None


def test_the_builder_that_commits_second_discards_its_bytes(tmp_path: Path) -> None:
    """Two builders compiled the same kernel unlocked; the loser's entries and bytes (here: other bytes, as a
    nondeterministic compile would give) never reach the store, and the winner's stay."""
    store = Store(tmp_path / "store")
    winner = _built_remotely(tmp_path, "d" * 64)
    store.put_object(RUNTIME)
    assert commit_kernel(store, [winner], OBJECT, {_sha(LIBRARY): LIBRARY}) == "built"
    loser = dataclasses.replace(winner, object_digest=_sha(b"other bytes"), size=len(b"other bytes"))
    assert commit_kernel(store, [loser], b"other bytes", {_sha(b"other lib"): b"other lib"}) == "present"
    assert store.get_entry(winner.kernel_key) == winner
    assert not store.has_object(_sha(b"other bytes")) and not store.has_object(_sha(b"other lib"))
    assert verify(store).ok


def test_bytes_that_do_not_hash_to_the_entrys_digest_are_refused(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    entry = _built_remotely(tmp_path, "e" * 64)
    assert commit_kernel(store, [entry], b"not the object", {}) == "corrupt"
    assert store.get_entry(entry.kernel_key) is None



def _signposted(tmp_path: Path) -> tuple[Store, list[Entry]]:
    """A store, and a kernel that consumed the SM count: its full key's entry, then its base key's signpost."""
    store = Store(tmp_path / "store")
    full = make_entry(store, OBJECT, tag="signposted")
    base, _ = kernel_keys.entry_keys(full)
    return store, [full, dataclasses.replace(full, kernel_key=base)]


def test_ci_2026_12_03_ctrl_c_between_a_kernels_entries_leaves_it_unbuilt_not_unreachable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CI (test_ctrl_c_stops_a_build...): Ctrl-C landed after the full key's entry and before the base key's
    signpost. The build counted the kernel as not built (stored_key finds kernels through the signpost) while
    the store held it, and every later build found it "present" and never wrote the signpost. Now the full
    entry is the commit: stopped anywhere, the store holds the kernel with its signpost, or not at all."""
    store, entries = _signposted(tmp_path)
    real, writes = store.put_entry, []

    def interrupted_second_write(entry: Entry) -> None:
        if writes:
            raise KeyboardInterrupt
        writes.append(entry.kernel_key)
        real(entry)

    monkeypatch.setattr(store, "put_entry", interrupted_second_write)
    with pytest.raises(KeyboardInterrupt):
        commit_kernel(store, entries, OBJECT)
    monkeypatch.undo()
    base, full = entries[1].kernel_key, entries[0].kernel_key
    assert store.has_entry(full) == (stored_key(store, base, H200) is not None) == False  # noqa: E712
    assert commit_kernel(store, entries, OBJECT) == "built"
    assert stored_key(store, base, H200) == full and verify(store).ok


def test_a_kernel_stored_without_its_signpost_gets_it_when_built_again(tmp_path: Path) -> None:
    """A store written in the old order and stopped between the entries holds the full entry alone: the next
    commit of that kernel finds it present and writes the missing signpost, so its base key finds it again."""
    store, entries = _signposted(tmp_path)
    store.put_entry(entries[0])
    assert stored_key(store, entries[1].kernel_key, H200) is None
    assert commit_kernel(store, entries, OBJECT) == "present"
    assert stored_key(store, entries[1].kernel_key, H200) == entries[0].kernel_key
