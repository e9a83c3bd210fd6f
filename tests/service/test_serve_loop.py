"""Issue 28, serve_load's 256-connection tail: the event loop `fa4-aot serve` runs accepts every connection waiting
to be accepted at once. Under uvloop (uvicorn's pick where it is installed) libuv accepts one connection per loop
iteration, and a busy worker's iteration serves every ready connection, so 256 new connections waited seconds in
the listen queue (bench/RESULTS.md, session 15). Counted in loop iterations, not seconds."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from service import main
from service.config import Settings

WAITING = 64  # connections in the listen queue before the loop runs
ITERATIONS = 8  # loop iterations they may take: asyncio needs 3 (accept, the transport's task, connection_made)


def _serve_options(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, workers: int) -> dict[str, Any]:
    """The keywords service.main.serve passes to uvicorn.run (which is not run)."""
    seen: dict[str, Any] = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: seen.update(kwargs))
    monkeypatch.setattr(os, "environ", dict(os.environ))  # serve() hands workers their settings through it
    main.serve(Settings(cache_dir=tmp_path / "cache", workers=workers, store_poll=0))
    return seen


def _accepted(loop_factory: Callable[[], asyncio.AbstractEventLoop]) -> int:
    """How many of WAITING connections a server on a loop from `loop_factory` accepts in ITERATIONS iterations."""
    loop, made = loop_factory(), list[asyncio.BaseTransport]()
    try:
        server = loop.run_until_complete(loop.create_server(lambda: _Count(made), "127.0.0.1", 0, backlog=256))
        port = server.sockets[0].getsockname()[1]
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(WAITING)]  # the kernel completes them
        ticks = iter(range(ITERATIONS))

        def tick() -> None:  # one call a loop iteration, until it stops the loop
            if next(ticks, None) is None:
                loop.stop()
            else:
                loop.call_soon(tick)

        loop.call_soon(tick)
        loop.run_forever()
        for c in clients:
            c.close()
        server.close()
        loop.run_until_complete(server.wait_closed())
    finally:
        loop.close()
    return len(made)


class _Count(asyncio.Protocol):
    def __init__(self, made: list[asyncio.BaseTransport]) -> None:
        self.made = made

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.made.append(transport)
        transport.close()


@pytest.mark.parametrize("workers", [1, 2])
def test_serve_accepts_every_waiting_connection_at_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                        workers: int) -> None:
    """Before: uvicorn's default loop (uvloop) accepted about one of 64 waiting connections per iteration. Now all 64
    within a few iterations, with one worker or several."""
    options = _serve_options(monkeypatch, tmp_path, workers)
    factory = uvicorn.Config(app=main.app_from_env, loop=options.get("loop", "auto")).get_loop_factory()
    assert factory is not None
    assert _accepted(factory) == WAITING
