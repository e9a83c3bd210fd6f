"""A cap on JSON request bodies. Object uploads (PUT /v1/objects/...) stream to disk under their own limit
(Settings.max_body_bytes, enforced in transfer.receive_object); everything else is small JSON that the
framework reads into memory (signed manifests included), so an open route such as POST /v1/misses must not
accept megabytes: its bodies are capped lower still (MISS_BODY_LIMIT). Recipe files (PUT
/v1/skus/<sku>/recipes/<key>) are publish-only JSON with their own, larger cap (recipe_store.MAX_BYTES)."""

from __future__ import annotations

import re

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

JSON_BODY_LIMIT = 1 << 20
MISS_BODY_LIMIT = 64 << 10
OBJECTS_PREFIX = "/v1/objects/"
RECIPE_PUT = re.compile(r"/v1/skus/[^/]+/recipes/[^/]+")
RECIPE_BODY_LIMIT = 8 << 20  # fa4_aot.recipe_store.MAX_BYTES (not imported: this module stays framework-only)


class JsonBodyLimit:
    """Pure ASGI middleware: 413 for a JSON body over its limit, declared (Content-Length) or chunked. The
    body is read here, up to the limit, before the handler sees any of it, then replayed to the app."""

    def __init__(self, app: ASGIApp, limit: int = JSON_BODY_LIMIT) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (scope["method"] == "PUT" and scope["path"].startswith(OBJECTS_PREFIX)):
            await self.app(scope, receive, send)
            return
        limit = MISS_BODY_LIMIT if scope["path"].rstrip("/") == "/v1/misses" else self.limit
        if scope["method"] == "PUT" and RECIPE_PUT.fullmatch(scope["path"]):
            limit = RECIPE_BODY_LIMIT
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:
            await self._too_large(limit)(scope, receive, send)
            return
        messages, received = [], 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            received += len(message.get("body", b""))
            if received > limit:
                await self._too_large(limit)(scope, receive, send)
                return
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

    @staticmethod
    def _too_large(limit: int) -> JSONResponse:
        return JSONResponse({"detail": (
            f"request body over {limit} bytes; JSON bodies are index entries, signed manifests and miss "
            "reports, which are far smaller: upload object bytes with PUT /v1/objects/<digest>")}, status_code=413)
