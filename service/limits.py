"""A cap on JSON request bodies. Object uploads (PUT /v1/objects/...) stream to disk under their own limit
(Settings.max_body_bytes, enforced in transfer.receive_object); everything else is small JSON that the
framework reads into memory (signed manifests included), so an open route such as POST /v1/misses must not
accept megabytes."""

from __future__ import annotations

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import TooLarge

JSON_BODY_LIMIT = 1 << 20
OBJECTS_PREFIX = "/v1/objects/"


class JsonBodyLimit:
    """Pure ASGI middleware: 413 for a declared Content-Length over `limit` on any request but an object
    upload; a chunked body that grows past it fails while being read, before the handler sees it."""

    def __init__(self, app: ASGIApp, limit: int = JSON_BODY_LIMIT) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (scope["method"] == "PUT" and scope["path"].startswith(OBJECTS_PREFIX)):
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.limit:
            response = JSONResponse({"detail": self._message()}, status_code=413)
            await response(scope, receive, send)
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.limit:
                raise TooLarge(self._message())
            return message

        await self.app(scope, limited, send)

    def _message(self) -> str:
        return (f"request body over {self.limit} bytes; JSON bodies are index entries, signed manifests and miss "
                "reports, which are far smaller: upload object bytes with PUT /v1/objects/<digest>")
