"""Request heads (request line and headers) capped at HEAD_LIMIT bytes, whatever HTTP implementation uvicorn runs.

uvicorn[standard] brings httptools, which has no cap of its own: it buffers a header whole before uvicorn sees it,
so one 64 MiB header was answered 200 and four 96 MiB headers took the server from 89 to 564 MiB. h11 has a cap
(h11_max_incomplete_event_size) that uvicorn leaves at h11's default unless told. So:
- `fa4-aot serve` (main.serve) runs `CappedHttpTools` where httptools is installed, else h11 with the cap
  (`uvicorn_options`): the bytes of a head are counted as they arrive and a head past the cap is answered 431 and
  the connection closed before more of it is read;
- `HeadLimit`, an ASGI middleware, answers 431 for a head past the cap under any implementation, e.g. a plain
  `uvicorn --factory service.main:app_from_env` (which must be given `--http service.headers:CappedHttpTools` to
  bound memory too: the middleware sees a head only once it is whole)."""

from __future__ import annotations

import importlib.util
from typing import Any

from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

HEAD_LIMIT = 64 << 10  # bytes: a bearer token and the usual headers are well under 4 KiB
TOO_LARGE = (f"request line and headers over {HEAD_LIMIT >> 10} KiB, the most this server reads; send a shorter "
             "URL and fewer or shorter headers")


def uvicorn_options() -> dict[str, Any]:
    """uvicorn.run's options that cap request heads: CappedHttpTools where httptools is installed, else h11 with
    its own cap. A dotted name, so that worker processes load it too."""
    http = "service.headers:CappedHttpTools" if importlib.util.find_spec("httptools") else "h11"
    return {"http": http, "h11_max_incomplete_event_size": HEAD_LIMIT}


def head_size(scope: Scope) -> int:
    """About the bytes of the request line and headers of `scope` as they came (name: value CRLF each)."""
    line = len(scope.get("raw_path") or scope["path"].encode()) + len(scope.get("query_string", b"")) + 16
    return line + sum(len(name) + len(value) + 4 for name, value in scope["headers"])


class HeadLimit:
    """Pure ASGI middleware: 431 for a request whose head passes HEAD_LIMIT bytes."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and head_size(scope) > HEAD_LIMIT:
            await PlainTextResponse(TOO_LARGE, status_code=431, headers={"Connection": "close"})(scope, receive, send)
            return
        await self.app(scope, receive, send)


if importlib.util.find_spec("httptools"):
    from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

    class CappedHttpTools(HttpToolsProtocol):
        """uvicorn's httptools protocol counting the bytes of each request's head as they arrive (httptools would
        buffer any number): past HEAD_LIMIT it answers 431 and closes the connection, reading no more."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._head = 0  # bytes received since the current request began, while its head is incomplete
            self._in_head = True

        def data_received(self, data: bytes) -> None:
            """Feed `data`, then refuse if the head is still incomplete past the cap: httptools holds at most the
            cap and one read (a chunk that ends the head and starts a body counts only as far as the head)."""
            if self._in_head:
                self._head += len(data)
            super().data_received(data)
            if self._in_head and self._head > HEAD_LIMIT and not self.transport.is_closing():
                self._refuse()

        def on_headers_complete(self) -> None:
            self._in_head = False
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._in_head, self._head = True, 0  # the next request on this connection starts its head

        def _refuse(self) -> None:
            body = TOO_LARGE.encode()
            self.logger.warning("request head over %d bytes from %s: answered 431", HEAD_LIMIT, self.client)
            self.transport.write(STATUS_LINE[431] + b"content-type: text/plain; charset=utf-8\r\ncontent-length: "
                                 + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)
            self.transport.close()
