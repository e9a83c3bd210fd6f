"""Moving object bytes: verified streaming uploads into the store, and conditional/range reads out of it."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from typing import IO

import anyio

from fa4_aot.errors import IntegrityError
from fa4_aot.store import Store

from .errors import DigestMismatch, RangeNotSatisfiable, TooLarge

_CHUNK = 1 << 20
_RANGE = re.compile(r"\s*(\d{0,19})\s*-\s*(\d{0,19})\s*")


async def receive_object(store: Store, digest: str, chunks: AsyncIterator[bytes], *, limit: int) -> int:
    """Stream `chunks` into the store as object `digest` (Store.receive) and return its size.

    The store writes them to a temp file while they are counted and hashed, and renames it into place only
    when they hash to `digest` (so a reader sees the whole object or none). Raises TooLarge past `limit` bytes
    and DigestMismatch for other bytes; a rejected or interrupted upload leaves nothing (a killed server leaves
    a `.tmp` that startup removes).
    """
    with store.receive(digest, source="upload") as upload:
        async for chunk in chunks:
            if upload.size + len(chunk) > limit:
                raise TooLarge(f"upload exceeds the server's limit of {limit} bytes; raise "
                               "FA4_AOT_MAX_BODY_BYTES on the server to accept larger objects")
            upload.write(chunk)
        try:
            await anyio.to_thread.run_sync(upload.commit)
        except IntegrityError as e:
            raise DigestMismatch(f"uploaded {upload.size} bytes hash to sha256 {e.actual}, not {digest}; nothing "
                                 "was stored: PUT each object under the sha256 of its exact bytes") from None
    return upload.size


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """The inclusive byte range (first, last) that a `Range` header asks of a `size`-byte object.

    Returns None to serve the whole object: no header, another unit, several ranges, or a malformed
    spec (RFC 9110 lets a server ignore those). Raises RangeNotSatisfiable when no byte is in range.
    """
    if not header or not header.startswith("bytes=") or "," in header:
        return None
    match = _RANGE.fullmatch(header[len("bytes="):])
    if match is None or match.group(1) == match.group(2) == "":
        return None
    first, last = match.group(1), match.group(2)
    if first == "":  # suffix: the last n bytes
        n = int(last)
        if n == 0 or size == 0:
            raise _unsatisfiable(size)
        return max(0, size - n), size - 1
    start, end = int(first), int(last) if last else None
    if end is not None and end < start:
        return None
    if start >= size:
        raise _unsatisfiable(size)
    return start, size - 1 if end is None else min(end, size - 1)


def _unsatisfiable(size: int) -> RangeNotSatisfiable:
    return RangeNotSatisfiable(f"range not satisfiable: the object has {size} bytes; ask for bytes=0-{size - 1}",
                               headers={"Content-Range": f"bytes */{size}"})


def etag_matches(header: str | None, etag: str) -> bool:
    """Whether an If-None-Match header matches `etag` (weak comparison, as RFC 9110 asks for If-None-Match)."""
    if not header:
        return False
    if header.strip() == "*":
        return True
    return any(tag.strip().removeprefix("W/") == etag for tag in header.split(","))


def read_chunks(f: IO[bytes], first: int, last: int) -> Iterator[bytes]:
    """Bytes first..last (inclusive) of the open file `f`, in chunks; closes `f` when done or abandoned."""
    try:
        f.seek(first)
        left = last - first + 1
        while left > 0:
            chunk = f.read(min(_CHUNK, left))
            if not chunk:
                raise OSError(f"object file {f.name} shrank while being served; run `fa4-aot verify`")
            left -= len(chunk)
            yield chunk
    finally:
        f.close()
