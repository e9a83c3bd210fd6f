"""A client that requires certification waits for it (remote/wait.py `certified`, issue 27 point 5), against a real
server (SQLite and PostgreSQL): a job that passes on the client's device class within the deadline gives '' and its
verdict in the client's store (what the runtimes' certification gate reads); a failed verdict, a verdict of another
device class, a job still queued at the deadline and a server answering garbage each give a reason that names it,
never an exception."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from fa4_aot.remote import wait
from fa4_aot.remote.http import Remote
from fa4_aot.store import Store
from tests.helpers.certifiers import DEVICE, OTHER_DEVICE, claim, finish, publish, verdict
from tests.helpers.raw_server import RawServer, reply
from tests.helpers.servers import Server


def certify_later(server: Server, sku: str, key: str, after: float, **fields: Any) -> threading.Thread:
    """A certifier played through the HTTP API: `after` seconds from now it claims the job of `sku` and finishes
    it with a verdict (`fields`: status, device, tensor...)."""
    def run() -> None:
        time.sleep(after)
        with server.client("publish") as c:
            job = claim(c, sku, device=fields.get("device", DEVICE)).json()
            assert finish(c, job, job["claim"], verdicts=[verdict(key, **fields)]).status_code == 200

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def waited(server: Server, store: Path, key: str, seconds: float) -> str:
    remote = Remote(server.url)
    try:
        return wait.certified(remote, Store(store), [key], DEVICE, time.monotonic() + seconds)
    finally:
        remote.close()


def test_a_pass_on_this_device_is_waited_for_and_kept(server: Server, tmp_path: Path) -> None:
    with server.client("publish") as c:
        key = publish(c, "cw-pass")["kernel_key"]
    certify_later(server, "cw-pass", key, after=1.0)
    assert waited(server, tmp_path, key, 30) == ""
    assert [(v.device, v.status) for v in Store(tmp_path).verdicts(key)] == [(DEVICE, "pass")]
    assert waited(server, tmp_path, key, 0) == ""  # kept: no question to the server


def test_a_failed_verdict_is_named(server: Server, tmp_path: Path) -> None:
    with server.client("publish") as c:
        key = publish(c, "cw-wrong")["kernel_key"]
    certify_later(server, "cw-wrong", key, after=0.5, status="wrong", tensor="dq", error=1.3, bound=0.02).join()
    problem = waited(server, tmp_path, key, 10)
    assert f"kernel {key[:16]}… failed certification on {DEVICE}: wrong: dq off by 1.3" in problem
    assert [v.status for v in Store(tmp_path).verdicts(key)] == ["wrong"]  # the gate refuses it from now on


def test_a_verdict_of_another_device_class_does_not_certify_this_one(server: Server, tmp_path: Path) -> None:
    with server.client("publish") as c:
        key = publish(c, "cw-other")["kernel_key"]
    certify_later(server, "cw-other", key, after=0.0, device=OTHER_DEVICE).join()
    problem = waited(server, tmp_path, key, 10)
    assert f"has no certification for this device class ({DEVICE}; it has verdicts for {OTHER_DEVICE})" in problem
    assert "fa4-aot certifier" in problem and not Store(tmp_path).verdicts(key)


def test_a_job_still_queued_at_the_deadline_is_named(server: Server, tmp_path: Path) -> None:
    with server.client("publish") as c:
        key = publish(c, "cw-queued")["kernel_key"]
    started = time.monotonic()
    problem = waited(server, tmp_path, key, 1.5)
    assert time.monotonic() - started < 10
    assert "still queued when FA4_AOT_BUILD_WAIT ran out" in problem and "fa4-aot certifier" in problem


def test_garbage_from_the_server_is_a_reason_not_an_exception(tmp_path: Path) -> None:
    def handler(path: str, conn: Any) -> None:
        body = b'[{"id": "abc", "status": "done"}]' if path.startswith("/v1/certify-jobs") else b"{}"
        conn.sendall(reply(200, body))

    with RawServer(handler) as hostile:
        remote = Remote(hostile.url)
        problem = wait.certified(remote, Store(tmp_path), ["ab" * 32], DEVICE, time.monotonic() + 5)
        remote.close()
    assert "could not be followed" in problem and "not a certify job" in problem
