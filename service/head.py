"""HEAD on every GET route: FastAPI routes answer only the methods they declare, so `HEAD /v1/skus` was 405.
A HEAD that no route takes but a GET route does is run as that GET, with the body dropped (headers, status
and Content-Length kept, as RFC 9110 asks). Routes that declare HEAD themselves (objects) are left alone."""

from __future__ import annotations

from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class HeadAsGet:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD" or not self._only_get(scope):
            await self.app(scope, receive, send)
            return

        async def send_headers_only(message: Message) -> None:
            if message["type"] == "http.response.body":
                if not message.get("more_body"):
                    await send({"type": "http.response.body", "body": b""})
                return
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, send_headers_only)

    def _only_get(self, scope: Scope) -> bool:
        routes = scope["app"].router.routes if "app" in scope else []
        head = [r.matches(scope)[0] for r in routes]
        if Match.FULL in head:
            return False
        as_get = {**scope, "method": "GET"}
        return any(r.matches(as_get)[0] is Match.FULL for r in routes)
