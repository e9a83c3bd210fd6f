"""Bundles: many kernels, entries and object bytes, in one response, so that a node coming up makes one
request for a model's kernels instead of two per kernel (issue 11: a cluster start at scale).

Body: one line of JSON, `{"entries": [KernelOut...], "missing": [kernel keys], "objects": [[digest, size]...]}`,
then the bytes of each listed object, back to back, in that order (an object several entries share is sent
once). Clients hash each object while it streams and store nothing that does not match (fa4_aot.remote).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import StreamingResponse

from fa4_aot.store import Store

from .. import crud
from ..deps import SessionDep, StoreDep, require_read
from ..openapi import READ
from ..schemas import BundleIn, KernelOut
from . import READ_ERRORS, errors

router = APIRouter(prefix="/v1/bundles", tags=["kernels"])
MEDIA_TYPE = "application/x-fa4-aot-bundle"
CHUNK = 1 << 20


@router.post("", response_class=StreamingResponse, dependencies=[Depends(require_read)], openapi_extra=READ,
             responses={200: {"description": "A JSON line, then the objects' bytes",
                              "content": {MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}}},
                        **errors(*READ_ERRORS, 413, 422)})
def post_bundle(body: BundleIn, session: SessionDep, store: StoreDep) -> StreamingResponse:
    """The index entries of the kernels the server holds, the keys it lacks, and their objects' bytes."""
    entries, objects = _present(store, crud.get_kernels(session, kernel_keys=body.kernel_keys))
    found = {e.kernel_key for e in entries}
    head = {"entries": [e.model_dump() for e in entries], "objects": objects,
            "missing": [k for k in dict.fromkeys(body.kernel_keys) if k not in found]}
    line = (json.dumps(head, separators=(",", ":")) + "\n").encode()
    length = len(line) + sum(size for _digest, size in objects)
    return StreamingResponse(_stream(store, line, objects), media_type=MEDIA_TYPE,
                             headers={"Content-Length": str(length), "Cache-Control": "no-store"})


def _present(store: Store, kernels: list[KernelOut]) -> tuple[list[KernelOut], list[tuple[str, int]]]:
    """The kernels whose object file is in the store, and each distinct object once with its size on disk."""
    entries, objects = [], dict[str, int]()
    for kernel in kernels:
        size = store.object_size(kernel.object_digest)
        if size is None:
            continue  # listed in the database but not (yet) on disk: reported missing
        entries.append(kernel)
        objects.setdefault(kernel.object_digest, size)
    return entries, list(objects.items())


def _stream(store: Store, line: bytes, objects: list[tuple[str, int]]) -> Iterator[bytes]:
    """The JSON line, then each object. Objects are immutable once named, so their sizes cannot change."""
    yield line
    for digest, size in objects:
        with store.open_object(digest) as f:
            left = size
            while left:
                chunk: Any = f.read(min(CHUNK, left))
                if not chunk:
                    raise RuntimeError(f"object {digest} shrank while it was sent")
                left -= len(chunk)
                yield chunk
