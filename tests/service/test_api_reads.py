"""Happy paths of every read route over HTTP: SKUs, manifests with ETags, kernel metadata, objects with
conditional and range requests, misses, health and metrics."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import pytest

from tests.helpers.servers import H200, Server, kernel_doc


def publish(server: Server, data: bytes, **overrides: Any) -> dict[str, Any]:
    with server.client("publish") as c:
        doc = kernel_doc(data, **overrides)
        assert c.put(f"/v1/objects/{doc['object_digest']}", content=data).status_code in (200, 201)
        assert c.post("/v1/kernels", json=doc).status_code in (200, 201)
    return doc


def test_healthz(server: Server) -> None:
    with server.client() as c:
        assert c.get("/healthz").json() == {"status": "ok", "db": "ok"}


def test_skus_and_manifest(server: Server) -> None:
    docs = [publish(server, os.urandom(100), sku="h200-manifest") for _ in range(3)]
    with server.client() as c:
        skus = {s["name"]: s for s in c.get("/v1/skus").json()}
        assert skus["h200-manifest"] == {**{k: v for k, v in H200.items() if k != "sku"},
                                         "name": "h200-manifest", "kernels": 3}
        r = c.get("/v1/skus/h200-manifest/manifest")
    assert r.status_code == 200
    assert r.headers["etag"] == f'"{hashlib.sha256(r.content).hexdigest()}"'
    body = r.json()
    assert body["sku"]["name"] == "h200-manifest" and body["sku"]["sm_count"] == 132
    expected = sorted(({"kernel_key": d["kernel_key"], "object_digest": d["object_digest"], "size": 100,
                        "family": d["family"]} for d in docs), key=lambda k: k["kernel_key"])
    assert body["kernels"] == expected


def test_manifest_etag_304_and_change(server: Server) -> None:
    publish(server, os.urandom(10), sku="h200-etag")
    with server.client() as c:
        first = c.get("/v1/skus/h200-etag/manifest")
        etag = first.headers["etag"]
        for header in (etag, f"W/{etag}", f'"other", {etag}', "*"):
            r = c.get("/v1/skus/h200-etag/manifest", headers={"If-None-Match": header})
            assert (r.status_code, r.content, r.headers["etag"]) == (304, b"", etag)
        assert c.get("/v1/skus/h200-etag/manifest", headers={"If-None-Match": '"other"'}).status_code == 200
        publish(server, os.urandom(10), sku="h200-etag")
        r = c.get("/v1/skus/h200-etag/manifest", headers={"If-None-Match": etag})
    assert r.status_code == 200 and r.headers["etag"] != etag and len(r.json()["kernels"]) == 2


def test_kernel_metadata_round_trip(server: Server) -> None:
    doc = publish(server, os.urandom(64), created="2025-01-31T12:00:00Z")
    with server.client() as c:
        got = c.get(f"/v1/kernels/{doc['kernel_key']}").json()
    assert got == {**doc, "shared_libs": {}}  # a kernel published without libraries reads back with none


@pytest.fixture(scope="module")
def blob(server: Server) -> tuple[str, bytes]:
    data = os.urandom(1000)
    return publish(server, data)["object_digest"], data


def test_object_get_and_head(server: Server, blob: tuple[str, bytes]) -> None:
    digest, data = blob
    with server.client() as c:
        r = c.get(f"/v1/objects/{digest}")
        head = c.head(f"/v1/objects/{digest}")
    assert r.status_code == 200 and r.content == data
    for resp in (r, head):
        assert resp.headers["etag"] == f'"{digest}"'
        assert resp.headers["cache-control"] == "public, max-age=31536000, immutable"
        assert resp.headers["content-length"] == "1000"
    assert head.status_code == 200 and head.content == b""


def test_object_if_none_match(server: Server, blob: tuple[str, bytes]) -> None:
    digest, _ = blob
    with server.client() as c:
        r = c.get(f"/v1/objects/{digest}", headers={"If-None-Match": f'"{digest}"'})
        other = c.get(f"/v1/objects/{digest}", headers={"If-None-Match": '"0000"'})
    assert (r.status_code, r.content, r.headers["etag"]) == (304, b"", f'"{digest}"')
    assert other.status_code == 200


@pytest.mark.parametrize("header, first, last", [
    ("bytes=0-99", 0, 99),
    ("bytes=10-10", 10, 10),
    ("bytes=900-", 900, 999),
    ("bytes=-100", 900, 999),
    ("bytes=-5000", 0, 999),
    ("bytes=990-5000", 990, 999),
])
def test_object_range(server: Server, blob: tuple[str, bytes], header: str, first: int, last: int) -> None:
    digest, data = blob
    for method in ("GET", "HEAD"):
        with server.client() as c:
            r = c.request(method, f"/v1/objects/{digest}", headers={"Range": header})
        assert r.status_code == 206
        assert r.headers["content-range"] == f"bytes {first}-{last}/1000"
        assert r.headers["content-length"] == str(last - first + 1)
        assert r.content == (data[first:last + 1] if method == "GET" else b"")


@pytest.mark.parametrize("header", ["bytes=1000-", "bytes=5000-6000", "bytes=-0"])
def test_object_range_unsatisfiable(server: Server, blob: tuple[str, bytes], header: str) -> None:
    with server.client() as c:
        r = c.get(f"/v1/objects/{blob[0]}", headers={"Range": header})
    assert r.status_code == 416
    assert r.headers["content-range"] == "bytes */1000"
    assert "detail" in r.json()


@pytest.mark.parametrize("headers", [
    {"Range": "bytes=0-1,5-6"}, {"Range": "bytes=9-3"}, {"Range": "items=0-1"}, {"Range": "bytes=abc"},
    {"Range": "bytes=0-9", "If-Range": '"stale"'},
])
def test_object_range_ignored(server: Server, blob: tuple[str, bytes], headers: dict[str, str]) -> None:
    with server.client() as c:
        r = c.get(f"/v1/objects/{blob[0]}", headers=headers)
    assert (r.status_code, r.content, r.headers["content-length"]) == (200, blob[1], "1000")


def test_misses_round_trip(server: Server) -> None:
    """What fa4_aot's client sends (asdict of store.Miss: with `call`, `args` and its own `when`) is accepted for a
    SKU the server holds; the first described call and exact record are kept (a later report cannot replace
    them), and a report without them does not erase them."""
    publish(server, os.urandom(100))  # the SKU must be known to the server
    miss = {"kernel_key": "c" * 64, "sku": "h200", "family": "FlashAttentionForwardSm90",
            "compile_key": ["fwd", 64, {"float": "0x1.0p-3"}], "call": None, "when": "2025-01-01T00:00:00Z"}
    call = {"layout": "dense", "pass_": "fwd", "dtype": "bf16", "head_dim": 128, "head_dim_v": 128, "mask": "causal",
            "window": [-1, -1], "softcap": 0.0, "sink": False, "num_splits": 1, "batch": 2, "seqlen_q": 4096,
            "seqlen_k": 4096, "heads_q": 32, "heads_kv": 32, "page_size": 0}
    q = {"tensor": "bfloat16", "shape": [2, 4096, 32, 128], "stride": [4194304, 4096, 128, 1], "offset": 0,
         "grad": False}
    args = {"format": 1, "entry": "FlashAttnFunc", "forward": {"q": q, "k": q, "v": {"same_as": "k"}, "causal": True},
            "backward": None}
    with server.client() as c:
        for report in (miss, {**miss, "call": call, "args": args}, {**miss, "call": {**call, "batch": 9},
                       "args": {**args, "forward": {**args["forward"], "causal": False}}}, miss):
            assert c.post("/v1/misses", json=report).status_code == 202
        found = [m for m in c.get("/v1/misses").json() if m["kernel_key"] == miss["kernel_key"]]
    assert len(found) == 1
    assert {k: found[0][k] for k in ("kernel_key", "sku", "family", "compile_key")} == {
        k: miss[k] for k in ("kernel_key", "sku", "family", "compile_key")}
    assert found[0]["call"] == call and found[0]["args"] == args and "when" not in found[0]
    assert found[0]["count"] == 4 and found[0]["first_seen"] <= found[0]["last_seen"]


def test_metrics(server: Server, blob: tuple[str, bytes]) -> None:
    with server.client() as c:
        c.get(f"/v1/objects/{blob[0]}")
        c.get("/no/such/route")
        text = c.get("/metrics").text
    assert 'fa4_aot_http_requests_total{method="GET",route="/v1/objects/{digest}",status="200"}' in text
    assert 'route="<unmatched>",status="404"' in text
    assert 'fa4_aot_http_response_bytes_total{route="/v1/objects/{digest}"}' in text
    assert "fa4_aot_http_request_duration_seconds_bucket" in text
    gauges = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
              if line.startswith(("fa4_aot_objects ", "fa4_aot_kernels ", "fa4_aot_misses "))}
    assert gauges["fa4_aot_objects"] >= 1 and gauges["fa4_aot_kernels"] >= 1 and set(gauges) == {
        "fa4_aot_objects", "fa4_aot_kernels", "fa4_aot_misses"}
    assert json.loads(json.dumps(gauges))  # plain numbers
