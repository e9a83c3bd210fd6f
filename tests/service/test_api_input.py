"""Malformed ids and path traversal on every route that takes one: 400 or 404 with a JSON `detail` line,
never a byte written or a row added. Targets are sent raw, so `..` and %2F reach the server unnormalised."""

from __future__ import annotations

import json

import pytest

from tests.helpers.servers import Server, raw_request, row_counts, store_files

BAD_HEX = [
    "abc", "A" * 64, "g" * 64, "a" * 63, "a" * 65, "..", "%2e%2e", "..%2F..%2Fetc%2Fpasswd", "../../etc/passwd",
    "aa%2F" + "a" * 62, "a" * 32 + "%00" + "a" * 31, "%20" + "a" * 64, "a" * 64 + "%0A", "a" * 64 + ".json",
]
BAD_SKU = ["H200", "-h200", "h200_x", "a" * 65, "..", "%2e%2e", "..%2F..%2Fetc", "../../etc", "h200%00", "h%20200", ""]


def _routes(server: Server) -> list[tuple[str, str, str | None]]:
    """(method, path template with {id}, token scope)"""
    return [("GET", "/v1/objects/{id}", None), ("HEAD", "/v1/objects/{id}", None),
            ("PUT", "/v1/objects/{id}", "publish"), ("GET", "/v1/kernels/{id}", None)]


def _check(server: Server, method: str, target: str, scope: str | None, body: bytes = b"") -> None:
    headers = {"Authorization": f"Bearer {server.tokens[scope]}"} if scope else {}
    status, payload = raw_request(server, method, target, body=body, headers=headers)
    assert status in (400, 404), (method, target, status, payload)
    if method != "HEAD":
        detail = json.loads(payload)["detail"]
        assert isinstance(detail, str) and detail, (target, payload)


@pytest.mark.bad_input("HTTP")
@pytest.mark.parametrize("bad", BAD_HEX)
def test_malformed_digests_and_keys(server: Server, bad: str) -> None:
    before_files, before_rows = store_files(server.cache_dir), row_counts(server.db_url)
    for method, template, scope in _routes(server):
        _check(server, method, template.format(id=bad), scope, body=b"payload" if method == "PUT" else b"")
    assert store_files(server.cache_dir) == before_files
    assert row_counts(server.db_url) == before_rows


@pytest.mark.bad_input("HTTP")
@pytest.mark.parametrize("bad", BAD_SKU)
def test_malformed_sku_names(server: Server, bad: str) -> None:
    before = row_counts(server.db_url)
    _check(server, "GET", f"/v1/skus/{bad}/manifest", None)
    assert row_counts(server.db_url) == before


def test_error_bodies_say_how_to_fix(server: Server) -> None:
    with server.client() as c:
        digest = c.get("/v1/objects/xyz").json()["detail"]
        sku = c.get("/v1/skus/H200/manifest").json()["detail"]
        unknown = c.get("/v1/skus/no-such-sku/manifest")
        missing = c.get(f"/v1/kernels/{'e' * 64}")
    assert "64 lowercase hex" in digest and "[a-z0-9][a-z0-9-]*" in sku
    assert unknown.status_code == 404 and "fa4-aot build --sku no-such-sku" in unknown.json()["detail"]
    assert missing.status_code == 404 and "manifest" in missing.json()["detail"]
