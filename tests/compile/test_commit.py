"""commit.commit_kernel (compile.commit): how a built kernel enters a store: a kernel built by a remote (Ray) worker
with the library the worker linked for the lean runtime, objects first and entries last, never naming bytes the
store lacks; and, as builders compile with no lock held, a second builder's copy of a kernel the store already
holds is discarded under the lock (issue 20, point 6)."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

from fa4_aot.compile import orchestrator
from fa4_aot.compile.commit import commit_kernel
from fa4_aot.store import Entry, Store
from fa4_aot.store.maintenance import verify
from tests.store.test_store import make_entry

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
