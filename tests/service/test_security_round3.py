"""Issue 18 (reliability and security, round 3), the service's side: each server defect has a case named after
it, against a real uvicorn over SQLite and PostgreSQL."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select, text

from fa4_aot.remote.http import Remote
from fa4_aot.store import Entry, Store, recipes
from service import db, models
from service.crud import tokens as crud_tokens
from tests.helpers.servers import (
    H200,
    Launch,
    Server,
    kernel_doc,
    publish_random_kernels,
    unread_bundle,
    wait_for_bundle_bytes,
)
from tests.remote.test_lean_entries import region


def _token(server: Server, name: str, scope: str = "publish", skus: list[str] | None = None) -> str:
    with db.session_for(server.db_url) as session:
        return crud_tokens.create_token(session, name=name, scope=scope, skus=skus)


def _as(server: Server, token: str) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def _publish(c: httpx.Client, data: bytes, **overrides: object) -> httpx.Response:
    doc = kernel_doc(data, **overrides)
    assert c.put(f"/v1/objects/{doc['object_digest']}", content=data).status_code in (200, 201)
    return c.post("/v1/kernels", json=doc)


def _recipe(note: str, facts: dict[str, Any]) -> tuple[str, bytes]:
    """A recipe file valid for a SKU with `facts` (the server's target: the facts without the name)."""
    signature = {"layout": "dense", "head_dim": 128, "causal": True}
    target = {k: facts[k] for k in ("arch", "sm_count", "l2_bytes", "cuda_major", "host")}
    key = recipes.file_key(signature, target)
    return key, json.dumps({"key": key, "regions": [region(signature, note)]}).encode()


# -- D20 ------------------------------------------------------------------------------------------------------
@pytest.mark.bad_input("HTTP")
def test_d20_sku_token_cannot_replace_another_skus_recipe(launch: Launch) -> None:
    server = launch()
    key, good = _recipe("h200's own", H200)
    _, evil = _recipe("planted", H200)
    with server.client("publish") as c:
        assert _publish(c, os.urandom(300), sku="d20-h200").status_code == 201
        assert c.put(f"/v1/skus/d20-h200/recipes/{key}", content=good).status_code == 201
        assert _publish(c, os.urandom(300), sku="d20-twin").status_code == 201  # an admin's twin: same facts
    with _as(server, _token(server, "d20-evil", skus=["d20-evil"])) as c:
        registered = _publish(c, os.urandom(300), sku="d20-evil")  # a new name with h200's facts
        via_new = c.put(f"/v1/skus/d20-evil/recipes/{key}", content=evil)
        other_facts = _publish(c, os.urandom(300), sku="d20-evil", sm_count=7)  # facts no SKU holds: fine
    with _as(server, _token(server, "d20-twin-only", skus=["d20-twin"])) as c:
        via_twin = c.put(f"/v1/skus/d20-twin/recipes/{key}", content=evil)
    assert (registered.status_code, via_new.status_code, via_twin.status_code) == (403, 409, 403), \
        (registered.text, via_new.text, via_twin.text)
    assert "d20-h200" in via_twin.json()["detail"] and other_facts.status_code == 201, other_facts.text
    with server.client() as c:
        assert c.get(f"/v1/skus/d20-h200/recipes/{key}").content == good
        assert c.get("/v1/skus/d20-evil/manifest").json()["sku"]["sm_count"] == 7


# -- D21 ------------------------------------------------------------------------------------------------------
def _rss(server: Server) -> int:
    assert server.proc is not None
    for line in Path(f"/proc/{server.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) << 10
    raise AssertionError("no VmRSS")


def test_d21_unread_bundles_hold_no_server_memory(launch: Launch) -> None:
    server = launch()
    keys = publish_random_kernels(server, "d21", 3, 8 << 20)  # a 24 MiB bundle
    before = _rss(server)
    hogs = [unread_bundle(server, keys) for _ in range(12)]
    try:
        time.sleep(3)
        grown = _rss(server) - before
    finally:
        for s in hogs:
            s.close()
    assert grown < 64 << 20, f"12 unread 24 MiB bundles grew the server by {grown >> 20} MiB"


def test_d21_bundle_bytes_in_flight_are_capped(launch: Launch, tmp_path: Path) -> None:
    server = launch(bundle_bytes_in_flight=str(40 << 20))
    keys = publish_random_kernels(server, "d21", 3, 8 << 20)
    hog = unread_bundle(server, keys)
    wait_for_bundle_bytes(server, 24 << 20)
    with server.client() as c:
        refused = c.post("/v1/bundles", json={"kernel_keys": keys})
    assert refused.status_code == 503 and refused.headers["retry-after"], refused.status_code
    assert "in flight" in refused.json()["detail"]
    threading.Timer(1.0, hog.close).start()  # the client backs off and finishes once the hog is gone
    stored, skipped = Remote(server.url).fetch_bundle(keys, Store(tmp_path / "node"))
    assert len(stored) == 3 and not skipped


# -- D25 ------------------------------------------------------------------------------------------------------
def test_d25_serve_after_build_serves_recipes(launch: Launch, tmp_path: Path) -> None:
    cache = tmp_path / "built"
    store = Store(cache)
    data = os.urandom(500)
    store.put_object(data)
    store.put_entry(Entry(**kernel_doc(data)))
    key, recipe = _recipe("built here", H200)
    store.put_recipes(key, recipe)
    other_key, other = _recipe("another SKU's", {**H200, "sm_count": 7})
    store.put_recipes(other_key, other)
    server = launch(cache_dir=cache)
    with server.client() as c:
        listed = c.get("/v1/skus/h200/recipes").json()["recipes"]
        served = c.get(f"/v1/skus/h200/recipes/{key}")
    assert listed == [{"key": key, "digest": hashlib.sha256(recipe).hexdigest(), "size": len(recipe)}]
    assert served.status_code == 200 and served.content == recipe


# -- D27 ------------------------------------------------------------------------------------------------------
def _race(n: int, work: Any) -> list[Any]:
    barrier = threading.Barrier(n)

    def one(i: int) -> Any:
        barrier.wait()
        try:
            return work(i)
        except Exception as e:  # the loser's refusal is the result
            return e

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


def test_d27_concurrent_token_create_makes_one_token_of_a_name(launch: Launch) -> None:
    server = launch(start=False)
    for trial in range(3):
        name = f"d27-{trial}"

        def create(_i: int, name: str = name) -> str:
            with db.session_for(server.db_url) as session:
                return crud_tokens.create_token(session, name=name, scope="read")

        results = _race(6, create)
        made = [r for r in results if isinstance(r, str)]
        assert len(made) == 1 and all("already named" in str(r) for r in results if not isinstance(r, str)), results
        with db.session_for(server.db_url) as session:
            assert crud_tokens.rotate_token(session, name=name)  # one active token: not ambiguous


def test_d27_miss_cap_holds_under_concurrency(launch: Launch) -> None:
    from service.crud.misses import MAX_MISSES_PER_SKU

    server = launch()
    with server.client("publish") as c:
        assert _publish(c, os.urandom(100), sku="d27").status_code == 201
    with db.session_for(server.db_url) as session:
        now = models.utcnow()
        session.execute(models.Miss.__table__.insert(), [
            {"kernel_key": f"{n:064x}", "sku": "d27", "family": "fwd", "compile_key": "[]", "count": 1,
             "first_seen": now, "last_seen": now} for n in range(MAX_MISSES_PER_SKU - 5)])
        session.commit()

    clients = [server.client("read") for _ in range(40)]
    for c in clients:  # connected before the race starts: the reports then arrive together
        assert c.get("/healthz").status_code == 200

    def report(i: int) -> int:
        doc = {"kernel_key": hashlib.sha256(f"d27-{i}".encode()).hexdigest(), "sku": "d27", "family": "fwd",
               "compile_key": [i]}
        return clients[i].post("/v1/misses", json=doc).status_code

    codes = _race(40, report)
    for c in clients:
        c.close()
    with db.session_for(server.db_url) as session:
        held = session.scalar(select(func.count()).select_from(models.Miss).where(models.Miss.sku == "d27"))
    assert held == MAX_MISSES_PER_SKU and sorted(codes) == [202] * 5 + [429] * 35, (held, codes)


# -- D29 ------------------------------------------------------------------------------------------------------
def test_d29_per_kernel_fetches_need_no_database_session(launch: Launch, tmp_path: Path) -> None:
    server = launch()
    keys = []
    with server.client("publish") as c:
        for n in range(16):
            data = os.urandom(2000 + n)
            assert _publish(c, data, sku="d29").status_code == 201
            keys.append(str(kernel_doc(data, sku="d29")["kernel_key"]))
    with db.session_for(server.db_url) as session:  # every read that still opened a session now fails
        for table in ("kernels", "objects", "skus"):
            session.execute(text(f"ALTER TABLE {table} RENAME TO gone_{table}"))
        session.commit()

    def node(i: int) -> int:
        store, remote = Store(tmp_path / f"node{i}"), Remote(server.url)
        try:
            return sum(remote.fetch_kernel(k, store) is not None for k in keys)
        finally:
            remote.close()

    with ThreadPoolExecutor(16) as pool:
        fetched = list(pool.map(node, range(16)))
    with server.client() as c:
        assert c.get(f"/v1/kernels/{'0' * 64}").status_code == 404
    assert fetched == [16] * 16


def test_d29_client_backs_off_on_busy_answers_and_finishes(launch: Launch, tmp_path: Path) -> None:
    server = launch(bundle_bytes_in_flight=str(30 << 20))
    keys = publish_random_kernels(server, "d21", 1, 20 << 20)
    hog = unread_bundle(server, keys)
    wait_for_bundle_bytes(server, 20 << 20)
    threading.Timer(1.5, hog.close).start()
    stored, _ = Remote(server.url).fetch_bundle(keys, Store(tmp_path / "node"))
    with server.client() as c:
        busy = [line for line in c.get("/metrics").text.splitlines()
                if line.startswith("fa4_aot_http_requests_total") and '"/v1/bundles"' in line and '"503"' in line]
    assert [e.kernel_key for e in stored] == keys and busy and float(busy[0].split()[-1]) >= 1, busy


# -- also seen ------------------------------------------------------------------------------------------------
def test_metrics_needs_a_token_when_reads_do(launch: Launch) -> None:
    server = launch(require_read_token="true")
    with server.client() as c:
        anonymous = c.get("/metrics")
    with server.client("read") as c:
        read = c.get("/metrics")
    assert (anonymous.status_code, read.status_code) == (401, 200)
    assert "fa4_aot_kernels" in read.text


def test_anonymous_miss_reports_are_rate_limited(launch: Launch) -> None:
    server = launch(anonymous_misses_per_minute="20")
    with server.client("publish") as c:
        assert _publish(c, os.urandom(100), sku="flood").status_code == 201

    def doc(n: int) -> dict[str, Any]:
        return {"kernel_key": hashlib.sha256(f"flood-{n}".encode()).hexdigest(), "sku": "flood", "family": "fwd",
                "compile_key": [n]}

    with server.client() as c:
        codes = [c.post("/v1/misses", json=doc(n)).status_code for n in range(60)]
        again = c.post("/v1/misses", json=doc(0))  # a known key is still counted
        last = c.post("/v1/misses", json=doc(59))
    with server.client("read") as c:
        with_token = [c.post("/v1/misses", json=doc(100 + n)).status_code for n in range(30)]
    assert codes.count(202) <= 21 and codes.count(429) >= 39, codes
    assert again.status_code == 202 and last.status_code == 429 and last.headers["retry-after"]
    assert with_token == [202] * 30
