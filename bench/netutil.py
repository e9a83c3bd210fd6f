"""Starting servers for benches on loopback: a free port, and waiting until a server answers (bench/on_demand.py,
cluster_start.py, serve_load.py, attack.py). Import it as `bench.netutil` with the repository root on sys.path."""

from __future__ import annotations

import socket
import subprocess
import time
from typing import Any

import httpx


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now (the OS's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_up(url: str, proc: subprocess.Popen[Any] | None = None, timeout: float = 120.0) -> None:
    """Return once GET `url` answers without a 5xx (fa4-aot's /healthz answers 503 until its database does; nginx
    has no health route, so any page of it will do). SystemExit naming `url` when `proc` (the server, if given)
    exits first, or after `timeout` seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"{url}: its server exited ({proc.returncode}) before it answered: {_stderr(proc)}")
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"{url} did not come up in {timeout:g} s")


def _stderr(proc: subprocess.Popen[Any]) -> str:
    """What `proc` wrote to its stderr when that is a pipe ("" otherwise)."""
    if proc.stderr is None:
        return ""
    err = proc.stderr.read()
    return err.decode(errors="replace") if isinstance(err, bytes) else str(err)
