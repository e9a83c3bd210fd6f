"""Publishing over HTTP: verified object uploads, kernel entries written to the database and the store,
conflicts, idempotency, and body limits. A rejected request writes no byte and no row."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator

from fa4_aot.store import Entry, Store
from tests.helpers.servers import Launch, Server, kernel_doc, row_counts, store_files


def test_put_object_created_then_existing(server: Server) -> None:
    data = os.urandom(3000)
    digest = hashlib.sha256(data).hexdigest()
    with server.client("publish") as c:
        first = c.put(f"/v1/objects/{digest}", content=data)
        again = c.put(f"/v1/objects/{digest}", content=data)
        assert c.get(f"/v1/objects/{digest}").content == data
    assert (first.status_code, first.json()) == (201, {"digest": digest, "size": 3000})
    assert (again.status_code, again.json()) == (200, {"digest": digest, "size": 3000})
    assert Store(server.cache_dir).read_object(digest) == data


def test_put_streamed_without_content_length(server: Server) -> None:
    data = os.urandom(3 * 2**20)
    digest = hashlib.sha256(data).hexdigest()

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(data), 65536):
            yield data[i:i + 65536]

    with server.client("admin") as c:
        assert c.put(f"/v1/objects/{digest}", content=chunks()).status_code == 201
    assert Store(server.cache_dir).read_object(digest) == data


def test_put_wrong_digest_stores_nothing(server: Server) -> None:
    data, claimed = os.urandom(5000), hashlib.sha256(b"something else").hexdigest()
    before_files, before_rows = store_files(server.cache_dir), row_counts(server.db_url)
    with server.client("publish") as c:
        r = c.put(f"/v1/objects/{claimed}", content=data)
        assert c.get(f"/v1/objects/{claimed}").status_code == 404
    assert r.status_code == 422
    assert claimed in r.json()["detail"] and hashlib.sha256(data).hexdigest() in r.json()["detail"]
    assert store_files(server.cache_dir) == before_files
    assert row_counts(server.db_url) == before_rows


def test_kernel_without_object_is_409(server: Server) -> None:
    doc = kernel_doc(os.urandom(50))
    before_files, before_rows = store_files(server.cache_dir), row_counts(server.db_url)
    with server.client("publish") as c:
        r = c.post("/v1/kernels", json=doc)
        assert c.get(f"/v1/kernels/{doc['kernel_key']}").status_code == 404
    assert r.status_code == 409
    assert doc["object_digest"] in r.json()["detail"] and "PUT /v1/objects/" in r.json()["detail"]
    assert store_files(server.cache_dir) == before_files and row_counts(server.db_url) == before_rows


def test_publish_kernel_writes_row_and_store_entry(server: Server) -> None:
    data = os.urandom(700)
    doc = kernel_doc(data)
    with server.client("publish") as c:
        c.put(f"/v1/objects/{doc['object_digest']}", content=data)
        created = c.post("/v1/kernels", json=doc)
        again = c.post("/v1/kernels", json=doc)
        changed = c.post("/v1/kernels", json={**doc, "compile_seconds": 9.0, "variant": "rebuilt"})
        got = c.get(f"/v1/kernels/{doc['kernel_key']}").json()
    assert (created.status_code, again.status_code, changed.status_code) == (201, 200, 200)
    assert created.json()["created"] == again.json()["created"] == got["created"]
    assert got == {**doc, "shared_libs": {}, "created": got["created"]}  # immutable: the first entry stays
    entry = Store(server.cache_dir).get_entry(doc["kernel_key"])
    assert entry == Entry(**got)


def test_sku_facts_conflict_is_409(server: Server) -> None:
    data_a, data_b = os.urandom(40), os.urandom(40)
    with server.client("publish") as c:
        for data in (data_a, data_b):
            c.put(f"/v1/objects/{hashlib.sha256(data).hexdigest()}", content=data)
        assert c.post("/v1/kernels", json=kernel_doc(data_a, sku="h200-facts")).status_code == 201
        clash = kernel_doc(data_b, sku="h200-facts", sm_count=144)
        r = c.post("/v1/kernels", json=clash)
        assert c.get(f"/v1/kernels/{clash['kernel_key']}").status_code == 404
    assert r.status_code == 409 and "sm_count=132" in r.json()["detail"] and "sm_count=144" in r.json()["detail"]
    assert Store(server.cache_dir).get_entry(clash["kernel_key"]) is None


def test_kernel_size_must_match_object(server: Server) -> None:
    data = os.urandom(80)
    doc = kernel_doc(data, size=81)
    with server.client("publish") as c:
        c.put(f"/v1/objects/{doc['object_digest']}", content=data)
        r = c.post("/v1/kernels", json=doc)
    assert r.status_code == 409 and "80" in r.json()["detail"]


def test_kernel_body_validation_is_422(server: Server) -> None:
    before = row_counts(server.db_url)
    with server.client("publish") as c:
        for bad in ({"kernel_key": "zz"}, {"sku": "../etc"}, {"arch": "x86"}, {"unexpected": 1}):
            assert c.post("/v1/kernels", json=kernel_doc(b"v", **bad)).status_code == 422, bad
        assert c.post("/v1/kernels", content=b"{not json", headers={"content-type": "application/json"}
                      ).status_code == 422
    assert row_counts(server.db_url) == before


def test_body_over_limit_is_413(launch: Launch) -> None:
    server = launch(max_body_bytes="1024")
    small, big = os.urandom(1024), os.urandom(4096)
    with server.client("publish") as c:
        declared = c.put(f"/v1/objects/{hashlib.sha256(big).hexdigest()}", content=big)
        streamed = c.put(f"/v1/objects/{hashlib.sha256(big).hexdigest()}", content=iter([big[:1000], big[1000:]]))
        assert store_files(server.cache_dir) == [] and row_counts(server.db_url)["objects"] == 0
        ok = c.put(f"/v1/objects/{hashlib.sha256(small).hexdigest()}", content=small)
    assert (declared.status_code, streamed.status_code, ok.status_code) == (413, 413, 201)
    assert "FA4_AOT_MAX_BODY_BYTES" in declared.json()["detail"]
    assert "FA4_AOT_MAX_BODY_BYTES" in streamed.json()["detail"]


def test_json_bodies_are_capped(server: Server) -> None:
    """Open routes must not buffer megabytes: JSON over 1 MiB is refused, declared or chunked."""
    huge = {"kernel_key": "a" * 64, "sku": "h200", "family": "f", "compile_key": ["x" * (2 << 20)]}
    before = row_counts(server.db_url)
    with server.client("publish") as c:
        declared = c.post("/v1/misses", json=huge)
        chunked = c.post("/v1/misses", content=iter([b'{"kernel_key": "', b"a" * (2 << 20)]),
                         headers={"content-type": "application/json"})
        kernel = c.post("/v1/kernels", json={**kernel_doc(b"k"), "call": "x" * (2 << 20)})
    assert (declared.status_code, kernel.status_code) == (413, 413)
    assert "PUT /v1/objects" in declared.json()["detail"]
    assert chunked.status_code in (400, 413)
    assert row_counts(server.db_url) == before


def test_text_that_postgresql_cannot_store_is_422(server: Server) -> None:
    """Found by the fuzzer: NUL or an unpaired surrogate in a text field used to be a 500 on PostgreSQL."""
    miss = {"kernel_key": "b" * 64, "sku": "h200", "compile_key": [1]}
    with server.client("publish") as c:
        for family in ("fwd\u0000", "\ud800"):
            body = json.dumps({**miss, "family": family}).encode()
            assert c.post("/v1/misses", content=body, headers={"content-type": "application/json"}
                          ).status_code == 422
            assert c.post("/v1/kernels", content=json.dumps(kernel_doc(b"t", family=family)).encode(),
                          headers={"content-type": "application/json"}).status_code == 422
