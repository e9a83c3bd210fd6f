"""One overall deadline per request, over every socket operation: connect, TLS, sending the request, the status
line, the headers and the body.

httpx's timeouts bound each socket operation alone, so a server that drips one header byte every 0.5 s never
trips a 30 s read timeout and holds a request for hours. Here the network backend under httpx shortens each
operation's timeout to what is left of the deadline of the request in progress (`until(end)`, a context
variable: httpx's sync client reads and writes in the caller's thread) and fails it once nothing is left.

A caller with a deadline of its own (a strict miss waiting for its build, wait.py) caps every request made
inside `capped(end)`: each gets at most what is left of it, never the whole fetch deadline again."""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Iterable, Iterator
from typing import Any

import httpcore
import httpx

_REQUEST_END: contextvars.ContextVar[float | None] = contextvars.ContextVar("fa4_aot_request_end", default=None)
_CALLER_END: contextvars.ContextVar[float | None] = contextvars.ContextVar("fa4_aot_caller_end", default=None)
WRITE_PIECE = 64 << 10  # bytes per bounded send: one write call of a large upload is many sends


@contextlib.contextmanager
def until(end: float) -> Iterator[None]:
    """Socket operations in this block end by time.monotonic() == `end` (the request's deadline)."""
    token = _REQUEST_END.set(end)
    try:
        yield
    finally:
        _REQUEST_END.reset(token)


@contextlib.contextmanager
def capped(end: float) -> Iterator[None]:
    """Requests made in this block end by time.monotonic() == `end`, however long the fetch deadline is."""
    outer = _CALLER_END.get()
    token = _CALLER_END.set(end if outer is None else min(outer, end))
    try:
        yield
    finally:
        _CALLER_END.reset(token)


def caller_end() -> float | None:
    """The deadline of the `capped` block in progress, or None outside one."""
    return _CALLER_END.get()


def bounded(timeout: float | None, error: type[Exception]) -> float | None:
    """`timeout` shortened to what is left of the request's deadline; `error` once nothing is left."""
    end = _REQUEST_END.get()
    if end is None:
        return timeout
    left = end - time.monotonic()
    if left <= 0:
        raise error("the request ran past its overall deadline (FA4_AOT_FETCH_DEADLINE)")
    return left if timeout is None else min(timeout, left)


class _Stream(httpcore.NetworkStream):
    """A socket whose every read and write is bounded by the deadline of the request in progress."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, bounded(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        for start in range(0, len(buffer), WRITE_PIECE):  # a reader that drains slowly meets the deadline too
            self._inner.write(buffer[start:start + WRITE_PIECE], bounded(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, bounded(timeout, httpcore.ConnectTimeout)))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    """httpcore's own sync backend, its connections and streams bounded by the request's deadline."""

    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        return _Stream(self._inner.connect_tcp(host, port, bounded(timeout, httpcore.ConnectTimeout), local_address,
                                               socket_options))

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        return _Stream(self._inner.connect_unix_socket(path, bounded(timeout, httpcore.ConnectTimeout),
                                                       socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def transport() -> httpx.HTTPTransport:
    """An httpx transport whose requests keep their overall deadline (`until`). httpx offers no way to pass a
    network backend, so its connection pool's is replaced; the deadline tests fail if a new httpx moves it."""
    made = httpx.HTTPTransport()
    pool = made._pool
    if not hasattr(pool, "_network_backend"):
        raise RuntimeError(f"httpx {httpx.__version__} keeps no _network_backend: fa4_aot/remote/deadline.py needs "
                           "updating for it (or install the httpx of pyproject.toml)")
    pool._network_backend = _Backend()
    return made
