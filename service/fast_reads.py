"""The reads a cluster makes from every node at once, answered before FastAPI's routing and dependency solving.

A cluster coming up fetches every kernel of a model from every node: GET /v1/kernels/<key>, then GET
/v1/objects/<digest>, per kernel (what install() does). Through FastAPI each cost about 2 ms of CPU in process
(dependency solving, route matching, response validation) and object GETs ran at 0.05x nginx's rate on the same
files. `FastReads`, a pure ASGI layer, answers the plain ones itself, with the routes' own status,
headers and body: an object from the store's file (one open beneath the root, no link followed, no database;
kernel-sized objects in one read, larger ones streamed), a kernel from the route's own function
(routes/kernels.served_kernel). Anything else goes on to the app unchanged: Range and conditional reads, HEAD of
a kernel, reads that need a token (FA4_AOT_REQUIRE_READ_TOKEN), and what is missing or refused (the routes' 404
and errors that name the fix). uvicorn has no sendfile (no ASGI zero-copy extension), so bytes are read here."""

from __future__ import annotations

import os
import re

from starlette.types import ASGIApp, Receive, Scope, Send

from fa4_aot.errors import StoreError
from fa4_aot.store import Store

from .config import Settings
from .errors import ServiceError
from .routes.kernels import served_kernel
from .routes.objects import IMMUTABLE, INLINE_BYTES
from .transfer import read_chunks

_OBJECT = re.compile(r"/v1/objects/([0-9a-f]{64})")
_KERNEL = re.compile(r"/v1/kernels/([0-9a-f]{64})")
_CONDITIONAL = frozenset({b"range", b"if-none-match", b"if-range"})  # the routes answer these


class _Route:
    """What MetricsMiddleware reads of scope["route"], so that fast answers count under their route's path."""

    def __init__(self, path: str) -> None:
        self.path = path


_OBJECT_ROUTE, _KERNEL_ROUTE = _Route("/v1/objects/{digest}"), _Route("/v1/kernels/{kernel_key}")


class FastReads:
    """Pure ASGI middleware: plain GET/HEAD of an object and plain GET of a kernel, as described above."""

    def __init__(self, app: ASGIApp, store: Store, settings: Settings) -> None:
        self.app, self.store, self.settings = app, store, settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._plain(scope):
            path = scope["path"]
            found = _OBJECT.fullmatch(path)
            if found and await self._object(found.group(1), scope, send):
                return
            found = _KERNEL.fullmatch(path) if scope["method"] == "GET" else None
            if found and await self._kernel(found.group(1), scope, send):
                return
        await self.app(scope, receive, send)

    def _plain(self, scope: Scope) -> bool:
        return (scope["type"] == "http" and scope["method"] in ("GET", "HEAD") and not scope.get("query_string")
                and not self.settings.require_read_token
                and not any(name in _CONDITIONAL for name, _ in scope["headers"]))

    async def _object(self, digest: str, scope: Scope, send: Send) -> bool:
        """Send object `digest` as get_object does; False (nothing sent) when the store cannot serve it."""
        try:
            f = self.store.open_object(digest)
        except (FileNotFoundError, StoreError):
            return False
        with f:
            size = os.fstat(f.fileno()).st_size
            scope["route"] = _OBJECT_ROUTE
            await send({"type": "http.response.start", "status": 200, "headers": [
                (b"etag", f'"{digest}"'.encode()), (b"cache-control", IMMUTABLE.encode()),
                (b"accept-ranges", b"bytes"), (b"content-length", str(size).encode()),
                (b"content-type", b"application/octet-stream")]})
            if scope["method"] == "HEAD" or size == 0:
                await send({"type": "http.response.body", "body": b""})
            elif size <= INLINE_BYTES:  # a page-cache read of a kernel-sized object: no threadpool hop
                data = f.read(size)
                if len(data) != size:
                    raise OSError(f"object file {f.name} shrank while being served; run `fa4-aot verify`")
                await send({"type": "http.response.body", "body": data})
            else:
                for chunk in read_chunks(f, 0, size - 1):
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b""})
        return True

    async def _kernel(self, kernel_key: str, scope: Scope, send: Send) -> bool:
        """Send kernel `kernel_key`'s entry as get_kernel does; False (nothing sent) when it is not served."""
        try:
            body = served_kernel(self.store, kernel_key).model_dump_json().encode()
        except (ServiceError, StoreError):
            return False
        scope["route"] = _KERNEL_ROUTE
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-length", str(len(body)).encode()), (b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})
        return True
