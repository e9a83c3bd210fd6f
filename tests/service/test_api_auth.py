"""Bearer tokens: 401 without one, 403 for unknown, revoked or too weak ones, per scope; reads open by
default and closed with FA4_AOT_REQUIRE_READ_TOKEN."""

from __future__ import annotations

import hashlib
import os
from typing import Any

import httpx
import pytest

from tests.helpers.servers import Launch, Server, kernel_doc, row_counts


def _writes(data: bytes) -> list[tuple[str, str, dict[str, Any]]]:
    digest = hashlib.sha256(data).hexdigest()
    return [("PUT", f"/v1/objects/{digest}", {"content": data}),
            ("POST", "/v1/kernels", {"json": kernel_doc(data)})]


def _send(server: Server, token: str | None, method: str, path: str, kwargs: dict[str, Any]) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(base_url=server.url, timeout=30) as c:
        return c.request(method, path, headers=headers, **kwargs)


def test_publish_needs_token(server: Server) -> None:
    data = os.urandom(32)
    before = row_counts(server.db_url)
    for method, path, kwargs in _writes(data):
        missing = _send(server, None, method, path, kwargs)
        assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
        assert "fa4-aot token create" in missing.json()["detail"]
        for token in (server.tokens["read"], server.tokens["revoked"], "fa4_not-a-real-token"):
            assert _send(server, token, method, path, kwargs).status_code == 403
    assert row_counts(server.db_url) == before


@pytest.mark.parametrize("scope", ["publish", "admin"])
def test_publish_scopes_accepted(server: Server, scope: str) -> None:
    data = os.urandom(32)
    codes = [_send(server, server.tokens[scope], m, p, kw).status_code for m, p, kw in _writes(data)]
    assert codes == [201, 201]


def test_read_scope_message_names_needed_scope(server: Server) -> None:
    r = _send(server, server.tokens["read"], *_writes(b"x")[0])
    assert "'read'" in r.json()["detail"] and "publish" in r.json()["detail"]


def test_reads_open_by_default(server: Server) -> None:
    for path in ("/v1/skus", "/v1/misses"):
        assert _send(server, None, "GET", path, {}).status_code == 200


def test_require_read_token(launch: Launch) -> None:
    server = launch(require_read_token="true")
    data = os.urandom(64)
    doc = kernel_doc(data)
    for method, path, kwargs in _writes(data):
        assert _send(server, server.tokens["publish"], method, path, kwargs).status_code == 201
    miss = {"kernel_key": "d" * 64, "sku": "h200", "family": "f", "compile_key": [1]}
    reads = [("GET", "/v1/skus", {}), ("GET", "/v1/skus/h200/manifest", {}),
             ("GET", f"/v1/kernels/{doc['kernel_key']}", {}), ("GET", f"/v1/objects/{doc['object_digest']}", {}),
             ("HEAD", f"/v1/objects/{doc['object_digest']}", {}), ("GET", "/v1/misses", {}),
             ("POST", "/v1/misses", {"json": miss}), ("GET", "/metrics", {})]
    for method, path, kwargs in reads:
        missing = _send(server, None, method, path, kwargs)
        assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer", path
        for bad in (server.tokens["revoked"], "fa4_nope"):
            assert _send(server, bad, method, path, kwargs).status_code == 403, path
        for scope in ("read", "publish", "admin"):
            assert _send(server, server.tokens[scope], method, path, kwargs).status_code in (200, 202), path
    for open_path in ("/healthz",):  # /metrics counts what readers fetch: a read (issue 18)
        assert _send(server, None, "GET", open_path, {}).status_code == 200
