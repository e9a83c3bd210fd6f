"""Issue 28 (security round 4), the server's limits on the transport: request heads are capped whatever HTTP
implementation uvicorn runs (D40, with httptools installed), and unread bundle answers cannot hold the bundle
budget against every other client (D39). Real uvicorn processes, real sockets."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fa4_aot.remote.http import Remote
from fa4_aot.store import Store
from service.headers import HEAD_LIMIT
from tests.helpers.servers import (
    ROOT,
    Launch,
    bundle_bytes_in_flight,
    free_port,
    publish_random_kernels,
    unabsorbed_object_size,
    unread_bundle,
    wait_for_bundle_bytes,
)

MIB = 1 << 20


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) << 10
    raise AssertionError("no VmRSS")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """`fa4-aot serve` (service.main.serve, the way operators run it) on a fresh store: (port, process)."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FA4_AOT_STORE_POLL": "0"}
    with open(tmp_path / "serve.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "fa4_aot", "serve", "--port", str(port), "--cache-dir",
                                 str(tmp_path / "cache")], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        end = time.monotonic() + 60
        while time.monotonic() < end:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        else:
            raise AssertionError(f"serve did not come up: {(tmp_path / 'serve.log').read_text()[-2000:]}")
        yield port, proc
    finally:
        proc.terminate()
        proc.wait(30)


def _send_head(port: int, header_bytes: int, out: list[tuple[int, bytes]]) -> None:
    """Send a GET with one header of `header_bytes` bytes; append (bytes of it sent, what came back)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    sent, piece = 0, b"a" * MIB
    try:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ")
        while sent < header_bytes:
            s.sendall(piece)
            sent += len(piece)
        s.sendall(b"\r\n\r\n")
    except OSError:  # the server closed: it stopped reading the head
        pass
    try:
        answer = s.recv(4096)
    except OSError:
        answer = b""
    s.close()
    out.append((sent, answer))


def test_d40_serve_caps_request_heads_with_httptools_installed(served: tuple[int, subprocess.Popen[bytes]]) -> None:
    """Before: under httptools a 2 MiB and a 64 MiB header were answered 200 and four 96 MiB headers took the
    server from 89 to 564 MiB. Now a head past HEAD_LIMIT is refused (431) before the rest of it is read."""
    assert importlib.util.find_spec("httptools"), "uvicorn[standard] brings httptools: the case under test"
    port, proc = served
    small: list[tuple[int, bytes]] = []
    _send_head(port, 2 * MIB, small)
    assert not small[0][1].startswith(b"HTTP/1.1 200"), small[0][1][:100]
    before = _rss(proc.pid)
    results: list[tuple[int, bytes]] = []
    hogs = [threading.Thread(target=_send_head, args=(port, 96 * MIB, results)) for _ in range(4)]
    for hog in hogs:
        hog.start()
    peak = before
    while any(h.is_alive() for h in hogs):
        peak = max(peak, _rss(proc.pid))
        time.sleep(0.05)
    assert all(not answer.startswith(b"HTTP/1.1 200") for _, answer in results), [a[:40] for _, a in results]
    assert peak - before < 64 * MIB, f"four 96 MiB headers grew the server by {(peak - before) >> 20} MiB"
    assert httpx.get(f"http://127.0.0.1:{port}/healthz", headers={"X-Fine": "a" * 1000}).status_code == 200


def test_d40_a_head_past_the_cap_is_431_under_any_implementation(launch: Launch) -> None:
    """A plain `uvicorn --factory service.main:app_from_env` (uvicorn's own choice of implementation): the app
    itself answers 431 for a head past the cap, never 200."""
    server = launch()
    with httpx.Client(base_url=server.url, timeout=30) as c:
        refused = c.get("/healthz", headers={"X-Big": "a" * (HEAD_LIMIT + 1)})
        fine = c.get("/healthz", headers={"X-Fine": "a" * 1000})
    assert refused.status_code == 431 and "headers" in refused.text, refused.status_code
    assert fine.status_code == 200


# -- D39 ------------------------------------------------------------------------------------------------------


def test_d39_unread_bundles_of_one_address_do_not_hold_the_budget_against_others(launch: Launch) -> None:
    """Before: 26 unread anonymous bundle requests held the whole budget and every other client got 503. Now one
    address holds at most its share of it (after its first bundle), so another address is served."""
    size = unabsorbed_object_size()  # 2 MiB where the send buffer takes at most 4 MiB
    server = launch(bundle_bytes_in_flight=str(32 * size))
    keys = publish_random_kernels(server, "d39", 2, size)  # 26 bundles of 2 objects pass the budget of 16 bundles
    hogs = [unread_bundle(server, keys) for _ in range(26)]
    try:
        wait_for_bundle_bytes(server, 2 * size)  # the first is admitted; the address's share refuses the rest
        other = httpx.Client(base_url=server.url, timeout=30,
                             transport=httpx.HTTPTransport(local_address="127.0.0.2"))
        with other:
            answer = other.post("/v1/bundles", json={"kernel_keys": keys})
        with server.client() as same:
            refused = same.post("/v1/bundles", json={"kernel_keys": keys})
    finally:
        for s in hogs:
            s.close()
    assert answer.status_code == 200 and len(answer.content) > 2 * size, answer.status_code
    assert refused.status_code == 503 and "address" in refused.json()["detail"], refused.status_code


def test_d39_a_stalled_bundle_reader_gives_its_budget_back(launch: Launch, tmp_path: Path) -> None:
    """A reader that takes nothing for FA4_AOT_BUNDLE_SEND_STALL seconds is cut off and its bytes leave the budget:
    readers behind many addresses hold the budget for that long at most."""
    size = unabsorbed_object_size()
    server = launch(bundle_bytes_in_flight=str(3 * size), bundle_send_stall="2")
    keys = publish_random_kernels(server, "d39", 2, size)
    hog = unread_bundle(server, keys)
    try:
        wait_for_bundle_bytes(server, 2 * size)
        with server.client() as c:
            assert c.post("/v1/bundles", json={"kernel_keys": keys}).status_code == 503  # the hog holds 2 of 3 sizes
        time.sleep(5)  # past the stall: the hog was cut off
        assert bundle_bytes_in_flight(server) == 0  # and its bytes left the budget (GET /metrics says so)
        stored, skipped = Remote(server.url, retries=0).fetch_bundle(keys, Store(tmp_path / "node"))
    finally:
        hog.close()
    assert len(stored) == 2 and not skipped
