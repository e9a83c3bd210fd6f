"""Committing a built kernel to a store: check, compile unlocked, lock, re-check, commit (no lock held while compiling).

A compile takes seconds to minutes; the kernel's lock is taken only around the commit, never around the
compile, so a slow compile blocks no other builder of the same store. Two builders may then compile the same
kernel at once: the first to commit stores it, the other finds it under the lock and discards its bytes (as
FlashInfer's JIT does). Objects are content-addressed and written by atomic rename, so the only thing the lock
orders is the entry: one writer per key, objects first, entries last.

Both kinds of builder commit here: local workers (executors.py) as each kernel compiles, and the orchestrator
(orchestrator.py) for the bytes Ray workers send back, with the libraries they linked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Literal

from ..domain import kernel_keys
from ..domain.skus import Sku
from ..store import Entry, Store

Committed = Literal["built", "present", "corrupt"]  # stored now; another builder stored it first; bytes refused


def stored_key(store: Store, base_key: str, sku: Sku) -> str | None:
    """The key under which `store` holds the kernel with base key `base_key` for `sku`, or None: the base key
    when its kernel consumed no constant, else the variant for the SKU's constant values if it is stored."""
    entry = store.get_entry(base_key)
    if entry is None:
        return None
    key = kernel_keys.device_key(base_key, entry, sku.constants())
    return key if key == base_key or store.has_entry(key) else None


def commit_kernel(store: Store, entries: Sequence[Entry], data: bytes,
                  libraries: Mapping[str, bytes] | None = None) -> Committed:
    """Store one built kernel (`entries`: its full key's first, then the base key's signpost if any; `data`: its
    object; `libraries`: {digest: bytes} its worker linked and holds, none when they are in the store already)
    under its base key's lock, unless the store has it already: then the bytes are discarded ("present"). The
    lock is held only for this re-check and the writes. "corrupt" (nothing stored, no entry) when bytes do not
    hash to the digest that names them. An entry names only the libraries the store then holds with every
    runtime library they need: the others are linked again on this host afterwards (lean.unlinked)."""
    with store.lock(entries[-1].kernel_key):
        if store.has_entry(entries[0].kernel_key):
            _put_signposts(store, entries)  # a store written before put_built's order may lack one
            return "present"
        for digest, lib in (libraries or {}).items():
            if store.put_object(lib) != digest:
                return "corrupt"
        held = [_with_held_libraries(store, e) for e in entries]
        return "built" if put_built(store, held, data) else "corrupt"


def commit(store: Store, entries: Sequence[Entry], data: bytes,
           libraries: Mapping[str, bytes] | None = None) -> bool:
    """commit_kernel(), True unless the bytes were refused (the kernel is in the store afterwards)."""
    return commit_kernel(store, entries, data, libraries) != "corrupt"


def _with_held_libraries(store: Store, entry: Entry) -> Entry:
    held = {arch: lib for arch, lib in entry.shared_libs.items()
            if all(store.has_object(d) for d in entry.lib_digests(arch))}
    return entry if held == entry.shared_libs else dataclasses.replace(entry, shared_libs=held)


def put_built(store: Store, entries: Sequence[Entry], data: bytes) -> bool:
    """Store one built kernel, its caller holding the base key's lock: its object first, then the base key's
    signpost if the store has none (one already there stays), then the full key's entry (`entries[0]`) last: the
    full entry is the commit, so a build stopped in between leaves a kernel that is not built, never one its
    base key cannot find (CI, 2026-12-03: Ctrl-C between the two entries, in that order, left the kernel
    stored, uncounted and unreachable by its base key for good, as the next build found it "present").
    Returns False (and stores no entry) when the bytes do not hash to the entries' digest."""
    full = entries[0]
    if store.put_object(data) != full.object_digest:
        return False
    _put_signposts(store, entries)
    store.put_entry(full)
    return True


def _put_signposts(store: Store, entries: Sequence[Entry]) -> None:
    """The signposts among `entries` (all but the first) that the store lacks."""
    for entry in entries[1:]:
        if not store.has_entry(entry.kernel_key):
            store.put_entry(entry)
