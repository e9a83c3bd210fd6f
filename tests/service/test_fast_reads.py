"""service/fast_reads.py answers a cluster's plain reads before FastAPI's routing (issue 28): its answers must be
the routes' own. A query string sends the same request through the route (the routes take no query), so each
fast answer is compared with the route's answer to the same read."""

from __future__ import annotations

import os

from tests.helpers.servers import Server
from tests.service.test_api_reads import publish

SAME = ("etag", "cache-control", "accept-ranges", "content-length", "content-type")


def test_plain_object_read_is_the_routes_answer(server: Server) -> None:
    data = os.urandom(70_000)  # kernel-sized: one read
    digest = publish(server, data)["object_digest"]
    with server.client() as c:
        for method in ("GET", "HEAD"):
            fast = c.request(method, f"/v1/objects/{digest}")
            routed = c.request(method, f"/v1/objects/{digest}?via=route")
            assert (fast.status_code, fast.content) == (routed.status_code, routed.content)
            assert {h: fast.headers.get(h) for h in SAME} == {h: routed.headers.get(h) for h in SAME}
        assert c.get(f"/v1/objects/{digest}").content == data


def test_plain_kernel_read_is_the_routes_answer(server: Server) -> None:
    doc = publish(server, os.urandom(300))
    with server.client() as c:
        fast = c.get(f"/v1/kernels/{doc['kernel_key']}")
        routed = c.get(f"/v1/kernels/{doc['kernel_key']}?via=route")
        head = c.head(f"/v1/kernels/{doc['kernel_key']}")
    assert fast.status_code == routed.status_code == head.status_code == 200
    assert fast.json() == routed.json() == {**doc, "shared_libs": {}, "created": fast.json()["created"]}
    assert fast.headers["content-type"] == routed.headers["content-type"] == "application/json"


def test_missing_and_refused_reads_get_the_routes_errors(server: Server) -> None:
    """What the store cannot serve goes on to the route: its 404 names the fix, a link in place of an object
    file is refused as the route refuses it."""
    digest = "ab" * 32
    with server.client() as c:
        missing = c.get(f"/v1/objects/{digest}")
        no_kernel = c.get(f"/v1/kernels/{'cd' * 32}")
    assert missing.status_code == 404 and "PUT /v1/objects" in missing.json()["detail"]
    assert no_kernel.status_code == 404 and "manifest" in no_kernel.json()["detail"]
    victim = server.cache_dir / "outside"
    victim.write_bytes(b"secret")
    link = server.cache_dir / "objects" / "ef" / ("ef" * 31)
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(victim)
    with server.client() as c:
        refused = c.get(f"/v1/objects/{'ef' * 32}")
    assert refused.status_code != 200 and b"secret" not in refused.content
