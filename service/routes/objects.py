"""Objects: immutable bytes named by their sha256. Reads are cacheable forever; uploads are verified.

A plain GET or HEAD of an object (no Range, no condition, reads open) is answered before FastAPI's routing by
service/fast_reads.py, with the same status and headers as get_object, which answers every other read.
"""

from __future__ import annotations

import os
from typing import IO, Annotated, Any

from fastapi import APIRouter, Depends, Header, Path, Request, Response, status
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from fa4_aot.store import Store

from .. import crud
from ..crud import tokens as crud_tokens
from ..deps import PublisherDep, SessionDep, SettingsDep, StoreDep, require_read
from ..errors import NotFound, ServiceError, TooLarge
from ..openapi import PUBLISH, READ
from ..schemas import HEX64, ObjectOut
from ..transfer import etag_matches, parse_range, read_chunks, receive_object
from . import READ_ERRORS, errors

router = APIRouter(prefix="/v1/objects", tags=["objects"])
DigestPath = Annotated[str, Path(pattern=HEX64, min_length=64, max_length=64, description="sha256 of the bytes")]
IMMUTABLE = "public, max-age=31536000, immutable"
INLINE_BYTES = 2 << 20  # objects up to this size are answered from one read; larger ones stream
_BINARY = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
_READ_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "The object's bytes", "content": _BINARY},
    206: {"description": "One byte range of the object", "content": _BINARY},
    304: {"description": "Not modified (If-None-Match matched)"},
    **errors(*READ_ERRORS, 404, 416),
}


@router.head("/{digest}", response_class=Response, responses=_READ_RESPONSES, operation_id="head_object",
             dependencies=[Depends(require_read)], openapi_extra=READ)
@router.get("/{digest}", response_class=Response, responses=_READ_RESPONSES, operation_id="get_object",
            dependencies=[Depends(require_read)], openapi_extra=READ)
async def get_object(
    digest: DigestPath, request: Request, store: StoreDep,
    range_: Annotated[str | None, Header(alias="range")] = None,
    if_none_match: Annotated[str | None, Header()] = None,
    if_range: Annotated[str | None, Header()] = None,
) -> Response:
    """The object's bytes with a strong ETag `"<digest>"`, cacheable forever. If-None-Match -> 304; one
    byte range (bytes=a-b, a-, -n) -> 206 with Content-Range, unsatisfiable -> 416; HEAD sends headers only.

    Reads go to the store's file, not the database: an object file exists only once its bytes are complete
    and verified (uploads are hashed before their rename), so the hot path needs no database round trip."""
    etag = f'"{digest}"'
    headers = {"ETag": etag, "Cache-Control": IMMUTABLE, "Accept-Ranges": "bytes"}
    f = _open(store, digest)
    streamed = False
    try:
        size = os.fstat(f.fileno()).st_size  # the open file's: one open, and no size of another file
        if etag_matches(if_none_match, etag):
            return Response(status_code=304, headers=headers)
        wanted = parse_range(range_ if if_range in (None, etag) else None, size) if size else None
        first, last = wanted or (0, size - 1)
        headers["Content-Length"] = str(last - first + 1)
        if wanted:
            headers["Content-Range"] = f"bytes {first}-{last}/{size}"
        code = status.HTTP_206_PARTIAL_CONTENT if wanted else status.HTTP_200_OK
        if request.method == "HEAD" or size == 0:
            return Response(status_code=code, headers=headers, media_type="application/octet-stream")
        if last - first + 1 <= INLINE_BYTES:  # a page-cache read of a kernel-sized object: no threadpool hop
            f.seek(first)
            return Response(f.read(last - first + 1), status_code=code, headers=headers,
                            media_type="application/octet-stream")
        streamed = True  # read_chunks closes it
        return StreamingResponse(read_chunks(f, first, last), status_code=code, headers=headers,
                                 media_type="application/octet-stream")
    finally:
        if not streamed:
            f.close()


def _open(store: Store, digest: str) -> IO[bytes]:
    """The object's file, open for reading with no link followed (Store.open_object; its size is the open
    file's, so a file replaced between a size check and the open cannot be served short); NotFound when
    absent."""
    try:
        return store.open_object(digest)
    except FileNotFoundError:
        raise NotFound(f"no object {digest}; upload it with PUT /v1/objects/{digest}") from None


@router.put(
    "/{digest}",
    response_model=ObjectOut,
    status_code=status.HTTP_201_CREATED,
    responses={200: {"model": ObjectOut, "description": "Already stored"}, **errors(400, 401, 403, 413, 422)},
    openapi_extra={**PUBLISH, "requestBody": {"required": True, "content": _BINARY}},
)
async def put_object(
    digest: DigestPath, request: Request, response: Response, session: SessionDep, store: StoreDep,
    settings: SettingsDep, token: PublisherDep,
) -> ObjectOut:
    """Upload the raw bytes of object `digest`. The server hashes what it receives and stores nothing unless
    it matches (422); 413 past FA4_AOT_MAX_BODY_BYTES; 201 when new, 200 when it already existed. Any publish
    token may upload, including one limited to some SKUs: an object is unusable until a kernel names it."""
    actor = crud_tokens.token_label(token)
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > settings.max_body_bytes:
        raise TooLarge(f"Content-Length {declared} exceeds the server's limit of {settings.max_body_bytes} bytes; "
                       "raise FA4_AOT_MAX_BODY_BYTES on the server to accept larger objects")
    try:
        size = await receive_object(store, digest, request.stream(), limit=settings.max_body_bytes)
    except ClientDisconnect:
        raise ServiceError("client disconnected before the whole body arrived; nothing was stored") from None
    created = await run_in_threadpool(crud.record_object, session, digest=digest, size=size, actor=actor)
    response.status_code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
    return ObjectOut(digest=digest, size=size)
