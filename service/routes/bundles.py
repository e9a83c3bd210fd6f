"""Bundles: many kernels, entries and object bytes, in one response, so that a node coming up makes one
request for a model's kernels instead of two per kernel (issue 11: a cluster start at scale).

Body: one line of JSON, `{"entries": [Entry...], "missing": [kernel keys], "objects": [[digest, size]...]}`,
then the bytes of each listed object, back to back, in that order (an object several entries share is sent
once). With `host_arch` (a lean-runtime client), each entry's library for that arch and the runtime libraries
it needs come along. Clients hash each object while it streams and store nothing that does not match (fa4_aot.remote).

Like object reads, a bundle is read from the store's files, not the database: an index entry exists only once
its object is complete and its database row committed (publish writes the entry last), so a cluster coming up
holds no database connection and no thread per request. Kernel-sized files come from the page cache faster than
a hop to the threadpool would cost, so the route reads them in the event loop (as GET /v1/objects does).
"""

from __future__ import annotations

import json
from dataclasses import asdict

from fastapi import APIRouter, Depends, Response

from fa4_aot.store import Entry, Store

from ..deps import StoreDep, require_read
from ..errors import TooLarge
from ..openapi import READ
from ..schemas import BundleIn
from . import READ_ERRORS, errors

router = APIRouter(prefix="/v1/bundles", tags=["kernels"])
MEDIA_TYPE = "application/x-fa4-aot-bundle"
MAX_BYTES = 256 << 20  # one response is held in memory: a model's kernels are a few MB


@router.post("", response_class=Response, dependencies=[Depends(require_read)], openapi_extra=READ,
             responses={200: {"description": "A JSON line, then the objects' bytes",
                              "content": {MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}}},
                        **errors(*READ_ERRORS, 413)})  # 422: FastAPI's own body-validation list
async def post_bundle(body: BundleIn, store: StoreDep) -> Response:
    """The index entries of the kernels the server holds, the keys it lacks, and their objects' bytes."""
    entries, blobs = _read(store, list(dict.fromkeys(body.kernel_keys)), body.host_arch)
    found = {e.kernel_key for e in entries}
    head = {"entries": [asdict(e) for e in entries], "objects": [[d, len(b)] for d, b in blobs.items()],
            "missing": [k for k in dict.fromkeys(body.kernel_keys) if k not in found]}
    line = (json.dumps(head, separators=(",", ":")) + "\n").encode()
    return Response(b"".join([line, *blobs.values()]), media_type=MEDIA_TYPE, headers={"Cache-Control": "no-store"})


def _read(store: Store, keys: list[str], host_arch: str | None) -> tuple[list[Entry], dict[str, bytes]]:
    """The entries the store holds with their objects' bytes (each object once), and with `host_arch` the
    libraries linked for it and their runtime libraries. A kernel one of whose object files is gone
    (quarantined since) is left out, and so reported missing."""
    entries, blobs = [], {}
    for key in keys:
        entry = store.get_entry(key)
        if entry is None:
            continue
        wanted = [entry.object_digest, *(entry.lib_digests(host_arch) if host_arch else {})]
        try:
            for digest in wanted:
                if digest not in blobs:
                    with store.open_object(digest) as f:
                        blobs[digest] = f.read()
        except FileNotFoundError:
            continue
        if sum(map(len, blobs.values())) > MAX_BYTES:
            raise TooLarge(f"the bundle would exceed {MAX_BYTES >> 20} MiB; ask for fewer kernels at once")
        entries.append(entry)
    return entries, blobs
