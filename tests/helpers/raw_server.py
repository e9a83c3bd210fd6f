"""A hostile HTTP server for client tests: a real TCP listener on 127.0.0.1 whose answers a test scripts byte by
byte (slow drips, floods, hangs, HTML pages), which no well-behaved server framework would send."""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Callable
from types import TracebackType

Handler = Callable[[str, socket.socket], None]  # (request path, connection)


class RawServer:
    """Accepts connections in a thread; `handler(path, conn)` answers each request. Counts connections and
    the bytes handlers report sending (`sent`)."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        self.sent = 0
        self.stop = threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> RawServer:
        thread = threading.Thread(target=self._accept, daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop.set()
        self.listener.close()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    head += chunk
                path = head.split(b" ", 2)[1].decode()
                _read_body(conn, head)
                self.handler(path, conn)
            except OSError:  # the client went away: what hostile servers see all the time
                return

    def send(self, conn: socket.socket, data: bytes) -> None:
        conn.sendall(data)
        self.sent += len(data)


def _read_body(conn: socket.socket, head: bytes) -> None:
    """Read a request's body (Content-Length bytes) before answering: closing a socket with unread bytes makes
    the kernel reset the connection, and the client may then lose the answer (a POST's JSON body, e.g.)."""
    headers, _, body = head.partition(b"\r\n\r\n")
    found = re.search(rb"(?im)^content-length:\s*(\d+)", headers)
    left = (int(found.group(1)) if found else 0) - len(body)
    while left > 0:
        chunk = conn.recv(min(left, 65536))
        if not chunk:
            return
        left -= len(chunk)


def reply(status: int, body: bytes, content_type: str = "application/json", length: int | None = None) -> bytes:
    """Headers and body of a one-shot HTTP/1.1 response (Content-Length `length`, default the body's)."""
    size = len(body) if length is None else length
    return (f"HTTP/1.1 {status} X\r\nContent-Type: {content_type}\r\nContent-Length: {size}\r\n"
            "Connection: close\r\n\r\n").encode() + body
