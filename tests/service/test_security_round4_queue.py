"""Issue 28, security round 4: the build queue's ownership and robustness (D30, D35, D41, D42), over SQLite and
PostgreSQL with a real uvicorn. Builders are played through the HTTP API, except in D42, where the real builder
loop (fa4_aot/compile/builder.py) meets a server that answers its claims with malformed documents. Time passing (a
lease running out, a retry's backoff) is played by moving the job's deadlines back in the real database."""

from __future__ import annotations

import itertools
import logging
import socket
import sqlite3
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import update

from fa4_aot.compile.builder import Builder
from fa4_aot.compile.executors import LocalExecutor
from fa4_aot.domain.misses import Miss
from fa4_aot.matrix.variants import load
from fa4_aot.remote.http import Remote
from fa4_aot.store import Store
from service import db, models
from tests.conftest import TINY_VARIANTS
from tests.helpers.builders import hold_sku, tiny
from tests.helpers.certifiers import as_token, token
from tests.helpers.raw_server import RawServer
from tests.helpers.servers import Server

Launch = Any


def miss(batch: int) -> dict[str, Any]:
    return Miss.lean(tiny(batch=batch), "h200").to_dict()


def claim(c: httpx.Client, builder: str = "b", lease: float = 60.0, **extra: Any) -> httpx.Response:
    return c.post("/v1/build-claims", json={"builder": builder, "lease_seconds": lease, **extra})


def finish(c: httpx.Client, job: dict[str, Any], claim_id: str | None, status: str = "done",
           builder: str = "b", **extra: Any) -> httpx.Response:
    body = {"builder": builder, "status": status, "detail": "", "compile_seconds": 1.0, "built": 1, **extra}
    if claim_id is not None:
        body["claim"] = claim_id
    return c.post(f"/v1/builds/{job['id']}/finish", json=body)


def renew(c: httpx.Client, job: dict[str, Any], claim_id: str, builder: str = "b") -> httpx.Response:
    return c.post(f"/v1/builds/{job['id']}/lease", json={"builder": builder, "claim": claim_id, "lease_seconds": 60})


def queued(server: Server, batch: int) -> dict[str, Any]:
    with server.client("publish") as c:
        answer = c.post("/v1/misses", json=miss(batch))
    assert answer.status_code in (200, 202), answer.text
    return dict(answer.json()["build"])


def job_of(server: Server, job_id: int) -> dict[str, Any]:
    with server.client() as c:
        return dict(c.get(f"/v1/builds/{job_id}").json())


def lapse(server: Server, job_id: int, **deadlines: datetime) -> None:
    """Move job `job_id`'s lease an hour into the past (and the other `deadlines` given): its builder is gone."""
    past = datetime.now(UTC) - timedelta(hours=1)
    with db.session_for(server.db_url) as session:
        session.execute(update(models.BuildJob).where(models.BuildJob.id == job_id)
                        .values(lease_until=past, **deadlines))
        session.commit()


def rewind(server: Server, job_id: int) -> None:
    """Job `job_id`'s lease and its retry's backoff end an hour ago: time passed."""
    lapse(server, job_id, not_before=datetime.now(UTC) - timedelta(hours=1))


def test_d30_build_jobs_are_claimed_renewed_and_finished_only_by_their_skus_token_and_claim(launch: Launch) -> None:
    server = launch()
    hold_sku(server)
    b200, h200 = token(server, "d30-b200", ["b200"]), token(server, "d30-h200", ["h200"])
    job = queued(server, 30001)
    with as_token(server, b200) as c:  # a token limited to b200 claims no h200 job
        assert claim(c, "thief").status_code == 204
        assert claim(c, "thief", skus=["h200"]).status_code == 403
    with as_token(server, h200) as c:
        for lease in (1.0, 0.0, 3601.0, 86400.0):  # a tiny lease burns attempts; a huge one holds the job
            refused = claim(c, "holder", lease=lease)
            assert refused.status_code == 422 and "10" in refused.text and "600" in refused.text, refused.text
        answer = claim(c, "holder")
        assert answer.status_code == 200, answer.text
        held, claim_id = answer.json(), answer.json()["claim"]
        assert held["id"] == job["id"] and held["status"] == "running" and claim_id
    assert job_of(server, job["id"])["claim"] is None  # readers never see the claim id
    with server.client("publish") as c:  # another token, with the builder name GET /v1/builds shows
        assert finish(c, held, claim_id, "rejected", "holder", detail="owned").status_code == 403
        assert finish(c, held, None, "rejected", "holder", detail="owned").status_code == 422
        assert renew(c, held, claim_id, "holder").status_code == 403
    with as_token(server, h200) as c:  # the claiming token without its claim: a lapsed builder of that name
        assert finish(c, held, None, "rejected", "holder").status_code == 422
        assert finish(c, held, "x" * 32, "rejected", "holder").status_code == 409
        assert renew(c, held, "x" * 32, "holder").status_code == 409
        nothing = finish(c, held, claim_id, "done", "holder")  # nothing of it was published
        assert nothing.status_code == 422 and "publish" in nothing.text, nothing.text
        assert renew(c, held, claim_id, "holder").status_code == 200
    after = job_of(server, job["id"])
    assert after["status"] == "running" and after["detail"] == ""
    with server.client("publish") as c:  # reports are not told another token's text
        assert "owned" not in c.post("/v1/misses", json=miss(30001)).text
    with as_token(server, h200) as c:
        ended = finish(c, held, claim_id, "rejected", "holder", detail="FA4: head_dim 64 unsupported")
        assert ended.status_code == 200 and ended.json()["status"] == "rejected", ended.text
        assert finish(c, held, claim_id, "rejected", "holder").status_code == 409  # it ended


def test_d30_a_lapsed_builder_sharing_a_name_cannot_override_the_holder(launch: Launch) -> None:
    server = launch()
    hold_sku(server)
    job = queued(server, 30002)
    with server.client("publish") as c:
        first = claim(c, "same").json()
        lapse(server, job["id"])  # the first builder's lease ran out
        heir = claim(c, "same").json()
        assert heir["id"] == job["id"] and heir["attempts"] == 2 and heir["claim"] != first["claim"]
        assert finish(c, first, first["claim"], "failed", "same", detail="late").status_code == 409
        assert renew(c, first, first["claim"], "same").status_code == 409
        assert renew(c, heir, heir["claim"], "same").status_code == 200
    assert job_of(server, job["id"])["status"] == "running"


def test_d35_transient_failures_are_retried_with_backoff_and_builders_claim_only_their_skus(launch: Launch) -> None:
    server = launch()
    hold_sku(server)
    job = queued(server, 35001)
    with server.client("publish") as c:
        assert claim(c, "elsewhere", skus=["b200"]).status_code == 204  # its variants lack h200
        for attempt in (1, 2):
            held = claim(c, "b", skus=["b200", "h200"]).json()
            assert (held["id"], held["attempts"]) == (job["id"], attempt)
            retried = finish(c, held, held["claim"], "failed", detail="No space left on device").json()
            assert retried["status"] == "queued" and "No space left on device" in retried["detail"], retried
            assert retried["lease_until"] is None
            assert claim(c, "b").status_code == 204  # backing off
            rewind(server, job["id"])
        last = claim(c, "b").json()
        ended = finish(c, last, last["claim"], "failed", detail="disk full again").json()
        assert ended["status"] == "failed" and ended["attempts"] == 3 and "disk full again" in ended["detail"]
        rewind(server, job["id"])
        assert claim(c, "b").status_code == 204  # failed for good: its attempts are spent


def test_d41_nul_in_a_detail_is_a_422_and_the_job_stays_finishable(launch: Launch) -> None:
    server = launch()
    hold_sku(server)
    job = queued(server, 41001)
    with server.client("publish") as c:
        held = claim(c).json()
        bad = finish(c, held, held.get("claim"), "rejected", detail="FA4 said \x00 nothing")
        assert bad.status_code == 422 and "NUL" in bad.text, bad.text
        assert job_of(server, job["id"])["status"] == "running"
        good = finish(c, held, held.get("claim"), "rejected", detail="FA4 said nothing")
        assert good.status_code == 200 and good.json()["status"] == "rejected", good.text


def test_d41_a_locked_sqlite_database_is_a_503_with_retry_after(launch: Launch) -> None:
    server = launch(start=False, db_busy_timeout="1")
    if not server.db_url.startswith("sqlite"):
        pytest.skip("SQLite's write lock; PostgreSQL's locks wait (lock_timeout) rather than fail")
    server.start()
    hold_sku(server)
    job = queued(server, 41002)
    with server.client("publish") as c:
        held = claim(c).json()
        locker = sqlite3.connect(server.db_url.removeprefix("sqlite:///"), timeout=1)
        try:
            locker.execute("BEGIN EXCLUSIVE")  # another writer holds the database past the busy timeout
            busy = finish(c, held, held.get("claim"), "rejected", detail="FA4 said no")
        finally:
            locker.rollback()
            locker.close()
        assert busy.status_code == 503 and busy.headers.get("Retry-After"), (busy.status_code, busy.text)
        assert "retry" in busy.text.lower()
        assert job_of(server, job["id"])["status"] == "running"  # rolled back; the builder retries
        done = finish(c, held, held.get("claim"), "rejected", detail="FA4 said no")
        assert done.status_code == 200, done.text


MALFORMED = [b'{"id": "abc", "sku": "h200"}', b'{"sku": "h200"}', b'[1, 2]', b'{"id": 7}']
ANSWERS = itertools.count()


def _malformed(path: str, conn: socket.socket) -> None:
    """Answers every claim with one of the MALFORMED documents in turn (200, JSON)."""
    body = MALFORMED[next(ANSWERS) % len(MALFORMED)] if path.startswith("/v1/build-claims") else b"{}"
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                 + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)


def test_d42_a_malformed_claim_answer_is_logged_and_the_builder_keeps_going(tmp_path: Path,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    matrix = load(TINY_VARIANTS)
    with RawServer(_malformed) as raw:
        builder = Builder(lambda: Remote(raw.url, token="t"), matrix, Store(tmp_path / "store"), LocalExecutor(),
                          name="b", poll=0.01)
        builder.max_backoff = 0.05
        stop = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            try:
                builder.run(stop)
            except BaseException as e:  # noqa: BLE001 - what killed the builder is the finding
                errors.append(e)

        with caplog.at_level(logging.WARNING, logger="fa4_aot"):
            thread = threading.Thread(target=run, daemon=True)
            thread.start()
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and raw.connections < 8 and thread.is_alive():
                time.sleep(0.05)
            alive = thread.is_alive()
            stop.set()
            thread.join(10)
    assert not errors and alive, errors
    assert raw.connections >= 8 and builder.done == 0
    assert any("claim" in r.getMessage() and "abc" in r.getMessage() for r in caplog.records), caplog.text


def test_writes_of_a_sqlite_server_stay_visible_after_another_process_closes_its_connection(launch: Launch) -> None:
    """Found while writing these tests: each store import (watch.py) made an engine, whose _private_file opened and
    closed the database file in the server's process, which drops every POSIX lock the process holds on it,
    SQLite's included. The next process to close its last connection (here: the test's, as `fa4-aot token create`
    on the server's host) then took itself for the last one, checkpointed and deleted the WAL that the server
    kept writing into: every later write of the server was invisible to any other process, and lost."""
    server = launch(start=False, store_poll="0.2")
    if not server.db_url.startswith("sqlite"):
        pytest.skip("SQLite's WAL files")
    server.start()
    hold_sku(server)  # a kernel written into the store: the server imports it (watch.py) with a new engine
    time.sleep(1.5)
    first = queued(server, 43001)
    with db.session_for(server.db_url) as session:  # another process opens and closes the database
        assert session.get(models.BuildJob, first["id"]) is not None
    second = queued(server, 43002)  # written after that process closed it
    with db.session_for(server.db_url) as session:
        assert session.get(models.BuildJob, second["id"]) is not None, "the server's write went to a deleted WAL"
