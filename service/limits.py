"""Caps: on JSON request bodies, on bundle bytes in flight (Budget) and on anonymous miss reports (ClientRate).

JSON request bodies: object uploads (PUT /v1/objects/...) stream to disk under their own limit
(Settings.max_body_bytes, enforced in transfer.receive_object); everything else is small JSON that the
framework reads into memory (signed manifests included), so an open route such as POST /v1/misses must not
accept megabytes: its bodies are capped lower still (MISS_BODY_LIMIT). Recipe files (PUT
/v1/skus/<sku>/recipes/<key>) are publish-only JSON with their own, larger cap (store.recipes.MAX_BYTES), and so are
signed manifests (PUT /v1/skus/<sku>/manifests): a manifest lists every kernel of a SKU with its libraries and
certification verdicts, about 700 bytes a kernel, so the default h200 build's (2,485 kernels) is about 2 MB."""

from __future__ import annotations

import re
import threading
import time

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

JSON_BODY_LIMIT = 1 << 20
MISS_BODY_LIMIT = 64 << 10
OBJECTS_PREFIX = "/v1/objects/"
RECIPE_PUT = re.compile(r"/v1/skus/[^/]+/recipes/[^/]+")
RECIPE_BODY_LIMIT = 8 << 20  # fa4_aot.store.recipes.MAX_BYTES (not imported: this module stays framework-only)
MANIFEST_PUT = re.compile(r"/v1/skus/[^/]+/manifests/?")
MANIFEST_BODY_LIMIT = 8 << 20  # about 12,000 kernels' listings: four times the default h200 build


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
        if scope["method"] == "PUT" and MANIFEST_PUT.fullmatch(scope["path"]):
            limit = MANIFEST_BODY_LIMIT
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


class Budget:
    """A count of bytes in flight in one process (bundles being sent), per client address too: `take(n, client)`
    reserves n bytes unless that would pass `limit`, or `client` already holds bytes and would pass its share
    (limit // SHARES: its first answer may be as large as the limit); `give(n, client)` returns them. One
    address's unread answers cannot hold the whole budget against every other client. The event
    loop is the only caller, so no lock is needed; only addresses holding bytes are tracked."""

    SHARES = 8

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.held: dict[str, int] = {}

    def refusal(self, n: int, client: str = "") -> str:
        """Why `take(n, client)` would fail: "" when it would not, else "budget" or "share"."""
        mine = self.held.get(client, 0)
        if self.used + n > self.limit:
            return "budget"
        return "share" if mine and mine + n > self.limit // self.SHARES else ""

    def take(self, n: int, client: str = "") -> bool:
        if self.refusal(n, client):
            return False
        self.used += n
        self.held[client] = self.held.get(client, 0) + n
        return True

    def give(self, n: int, client: str = "") -> None:
        self.used -= n
        left = self.held.pop(client, 0) - n
        if left > 0:
            self.held[client] = left


class ClientRate:
    """Token buckets per client address: `per_minute` at once, refilled at `per_minute` a minute. At most
    `clients` addresses are tracked (the longest idle are forgotten), so spoofed ranges cannot grow memory."""

    def __init__(self, per_minute: int, clients: int = 10_000) -> None:
        self.per_minute = per_minute
        self.clients = clients
        self.buckets: dict[str, tuple[float, float]] = {}  # address -> (tokens, when), least recently used first
        self.lock = threading.Lock()  # sync routes call it from the threadpool

    def allow(self, client: str) -> bool:
        """Take one token of `client`'s bucket; False when it is empty."""
        with self.lock:
            now = time.monotonic()
            tokens, when = self.buckets.pop(client, (float(self.per_minute), now))
            tokens = min(float(self.per_minute), tokens + (now - when) * self.per_minute / 60)
            allowed = tokens >= 1
            self.buckets[client] = (tokens - allowed, now)
            if len(self.buckets) > self.clients:
                del self.buckets[next(iter(self.buckets))]
            return allowed
