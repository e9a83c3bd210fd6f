"""A bundle body (POST /v1/bundles, service/routes/bundles.py) read into a store: one JSON line (the entries, the
keys the server lacks, the objects that follow with their sizes), then each object's exact bytes. Every object is
hashed while it streams and stored only if it matches; an entry is stored last, and only for a key that was asked,
that its fields prove, and that the caller's trust policy accepts."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

from ..domain import kernel_keys
from ..errors import Fa4AotError, RemoteError
from ..store import Entry, Store
from .answers import bundle_head


def with_libraries(entry: Entry, arches: list[str]) -> Entry:
    """`entry` naming only its libraries for `arches` (what a client downloads with it)."""
    return dataclasses.replace(entry, shared_libs={a: lib for a, lib in entry.shared_libs.items() if a in arches})


class BundleReader:
    """Reads a bundle body: its first line, then exact byte counts, from a stream of chunks."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buffer = b""

    def line(self, limit: int = 64 << 20) -> bytes:
        while b"\n" not in self._buffer:
            if len(self._buffer) > limit:
                raise RemoteError(f"bundle header longer than {limit} bytes")
            self._buffer += self._next()
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def take(self, size: int) -> Iterator[bytes]:
        """The next `size` bytes, in chunks; raises RemoteError if the body ends first."""
        while size:
            if not self._buffer:
                self._buffer = self._next()
            chunk, self._buffer = self._buffer[:size], self._buffer[size:]
            size -= len(chunk)
            yield chunk

    def _next(self) -> bytes:
        for chunk in self._chunks:
            if chunk:
                return chunk
        raise RemoteError("bundle body ended early")


def unbundle(reader: BundleReader, store: Store, accept: Callable[[Entry], None] | None,
             url: str, asked: set[str], host_arch: str | None = None) -> tuple[list[Entry], dict[str, str]]:
    """Store what the bundle `reader` holds: (entries stored, {kernel key: why not} for those the server lacks,
    sent unasked, sent with fields that do not prove their key, or that `accept` refused by raising)."""
    entries, missing, objects = bundle_head(reader.line(), f"{url}/v1/bundles")
    skipped = {k: f"{url} has no kernel {k}" for k in missing if k in asked}
    for entry in entries:  # a server answers for the keys asked, never plants others, and each entry proves its key
        if entry.kernel_key not in asked:
            skipped[entry.kernel_key] = f"{url} sent kernel {entry.kernel_key}, which was not asked for"
        elif problem := kernel_keys.key_problem(entry, entry.kernel_key):
            skipped[entry.kernel_key] = f"{url} sent an entry for {entry.kernel_key} that cannot be used: {problem}"
    for entry in entries:
        try:
            if accept is not None:
                accept(entry)
        except Fa4AotError as e:  # refused by the trust policy: its object is read past, never stored
            skipped[entry.kernel_key] = str(e)
    stored = [with_libraries(e, [host_arch] if host_arch else []) for e in entries if e.kernel_key not in skipped]
    wanted = {e.object_digest for e in stored} | {d for e in stored for d in e.lib_digests(host_arch or "")}
    for digest, size in objects:
        chunks = reader.take(size)
        if digest not in wanted or store.object_state(digest, size) == "ok":
            for _ in chunks:
                pass
            continue
        with store.lock(digest):
            store.put_stream(digest, chunks, size=size, source=f"{url}/v1/bundles")
    kept = []
    for entry in stored:  # an entry names only objects the store now holds (the server may have left one out)
        lacking = [d for d in {entry.object_digest, *entry.lib_digests(host_arch or "")} if not store.has_object(d)]
        if lacking:
            skipped[entry.kernel_key] = (f"{url}/v1/bundles sent kernel {entry.kernel_key} without the bytes of "
                                         f"{', '.join(sorted(lacking))}; it was not stored (fetch it again)")
            continue
        store.put_entry(entry)
        kept.append(entry)
    return kept, skipped
