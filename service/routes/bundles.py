"""Bundles: many kernels, entries and object bytes, in one response, so that a node coming up makes one
request for a model's kernels instead of two per kernel (a cluster start at scale).

Body: one line of JSON, `{"entries": [Entry...], "missing": [kernel keys], "objects": [[digest, size]...]}`,
then the bytes of each listed object, back to back, in that order (an object several entries share is sent
once). With `host_arch` (a lean-runtime client), each entry's library for that arch and the runtime libraries
it needs come along. Clients hash each object while it streams and store nothing that does not match (remote.http).

Like object reads, a bundle is read from the store's files, not the database: an index entry exists only once
its object is complete and its database row committed (publish writes the entry last), so a cluster coming up
holds no database connection and no thread per request. The body streams from the files a chunk at a time, and
each worker sends at most FA4_AOT_BUNDLE_BYTES_IN_FLIGHT bundle bytes at once (503 past it), so clients that do
not read their answers cannot fill the server's memory. Nor can they hold that budget against
everyone else: one address holds at most an eighth of it beyond its first answer, and an answer
whose client takes nothing for FA4_AOT_BUNDLE_SEND_STALL seconds is cut off, its bytes given back.
Kernel-sized files come from the page cache faster than a hop to the threadpool would cost, so the route reads
them in the event loop (as GET /v1/objects does).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from fa4_aot.errors import StoreError
from fa4_aot.store import Entry, Store

from ..deps import StoreDep, require_read
from ..errors import Busy, TooLarge
from ..limits import Budget
from ..openapi import READ
from ..schemas import BundleIn
from . import READ_ERRORS, errors

router = APIRouter(prefix="/v1/bundles", tags=["kernels"])
MEDIA_TYPE = "application/x-fa4-aot-bundle"
MAX_BYTES = 256 << 20  # one response: a model's kernels are a few MB
CHUNK = 1 << 20
log = logging.getLogger("service")


@router.post("", response_class=Response, dependencies=[Depends(require_read)], openapi_extra=READ,
             responses={200: {"description": "A JSON line, then the objects' bytes",
                              "content": {MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}}},
                        **errors(*READ_ERRORS, 413, 503)})  # 422: FastAPI's own body-validation list
async def post_bundle(body: BundleIn, request: Request, store: StoreDep) -> Response:
    """The index entries of the kernels the server holds, the keys it lacks, and their objects' bytes, streamed
    from the store's files. 503 with Retry-After while the worker already sends its limit of bundle bytes
    (FA4_AOT_BUNDLE_BYTES_IN_FLIGHT)."""
    entries, sizes = _plan(store, list(dict.fromkeys(body.kernel_keys)), body.host_arch)
    found = {e.kernel_key for e in entries}
    head = {"entries": [asdict(e) for e in entries], "objects": [[d, n] for d, n in sizes.items()],
            "missing": [k for k in dict.fromkeys(body.kernel_keys) if k not in found]}
    line = (json.dumps(head, separators=(",", ":")) + "\n").encode()
    total = len(line) + sum(sizes.values())
    budget, client = request.app.state.bundle_budget, request.client.host if request.client else ""
    if not budget.take(total, client):
        raise Busy(_busy(budget, total, client), headers={"Retry-After": "1"})
    return _Released(_stream(store, line, sizes), lambda: budget.give(total, client),
                     request.app.state.settings.bundle_send_stall, media_type=MEDIA_TYPE,
                     headers={"Cache-Control": "no-store", "Content-Length": str(total)})


def _busy(budget: Budget, total: int, client: str) -> str:
    if budget.refusal(total, client) == "share":
        return (f"{budget.held.get(client, 0) >> 20} MiB of bundles are in flight to this address ({client}), its "
                f"share of what this worker sends at once (1/{budget.SHARES} of FA4_AOT_BUNDLE_BYTES_IN_FLIGHT): "
                "read the answers already asked for, then retry after the Retry-After seconds")
    return (f"{budget.used >> 20} MiB of bundles are in flight on this worker, the most it sends at once "
            "(FA4_AOT_BUNDLE_BYTES_IN_FLIGHT); retry after the Retry-After seconds")


class _Released(StreamingResponse):
    """A StreamingResponse that calls `release()` once it ends, sent, failed or cut off by the client, and cuts
    the client off when it takes no piece for `stall` seconds (FA4_AOT_BUNDLE_SEND_STALL): a reader that stops
    reading holds its bytes of the budget that long at most."""

    def __init__(self, content: AsyncIterator[bytes], release: Callable[[], None], stall: float,
                 **kwargs: object) -> None:
        super().__init__(content, **kwargs)  # type: ignore[arg-type]
        self.release = release
        self.stall = stall

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def bounded(message: Message) -> None:
            await asyncio.wait_for(send(message), self.stall)

        try:
            await super().__call__(scope, receive, bounded)
        except TimeoutError:  # the response is left incomplete: the server closes the connection
            log.info("bundle answer cut off: %s took nothing for %g s", scope.get("client"), self.stall)
        finally:
            self.release()


def _plan(store: Store, keys: list[str], host_arch: str | None) -> tuple[list[Entry], dict[str, int]]:
    """The entries the store holds with the sizes of their objects (each object once), and with `host_arch`
    the libraries linked for it and their runtime libraries. A kernel one of whose object files is gone
    (quarantined since) or has another size than its entry says, or whose entry cannot be used, is left out, and
    so reported missing."""
    entries: list[Entry] = []
    sizes: dict[str, int] = {}
    for key in keys:
        try:
            entry = store.get_entry(key)
        except StoreError:  # unreadable or not proving its key: never served
            continue
        if entry is None:
            continue
        wanted = {entry.object_digest: entry.size, **(entry.lib_digests(host_arch) if host_arch else {})}
        held = {d: store.object_size(d) for d in wanted}
        if any(n is None or wanted[d] not in (None, n) for d, n in held.items()):
            continue
        sizes.update(held)  # type: ignore[arg-type]
        if sum(sizes.values()) > MAX_BYTES:
            raise TooLarge(f"the bundle would exceed {MAX_BYTES >> 20} MiB; ask for fewer kernels at once")
        entries.append(entry)
    return entries, sizes


async def _stream(store: Store, line: bytes, sizes: dict[str, int]) -> AsyncIterator[bytes]:
    """The JSON line, then each object's bytes, `CHUNK` at a time: a reader that stops reading holds one chunk
    here, not the bundle. An object file removed or changed since `_plan` ends the body early (the client's
    hash or length check refuses it, and it retries)."""
    yield line
    for digest, size in sizes.items():
        with store.open_object(digest) as f:
            left = size
            while left:
                chunk = f.read(min(CHUNK, left))
                if not chunk:
                    raise OSError(f"object {digest} shrank while a bundle was sent")
                left -= len(chunk)
                yield chunk
