"""Verdicts travel with kernels (issue 27): `push` publishes the verdicts of the kernels it pushes and `pull` keeps
those of the kernels it pulls, one request per batch, against a real server on SQLite and PostgreSQL; a hostile
server's malformed verdict listing ends in a RemoteError, never another exception (raw_server.py)."""

from __future__ import annotations

import json
import os
import re
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest

from fa4_aot.domain.verdicts import Verdict
from fa4_aot.errors import RemoteError
from fa4_aot.remote import endpoints
from fa4_aot.remote.http import Remote
from fa4_aot.remote.push_pull import pull, push
from fa4_aot.store import Entry, Store
from fa4_aot.trust.policy import Trust
from tests.helpers.raw_server import RawServer, reply
from tests.helpers.servers import H200, Launch, Server, kernel_doc
from tests.remote.test_attack_client import H200 as H200_SKU

DEV = "nvidia-h200.132sm.driver-13.0.cuda-13.0"
OTHER = "nvidia-h200.132sm.driver-12.8.cuda-12.8"


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FA4_AOT_TRUSTED_KEYS", "FA4_AOT_REVOKED", "FA4_AOT_SERVER", "FA4_AOT_INSECURE"):
        monkeypatch.delenv(name, raising=False)


def built(root: Path, n: int) -> tuple[Store, list[Entry]]:
    """A store of `n` kernels of random bytes, as a build host would hold them."""
    store, entries = Store(root), []
    for _ in range(n):
        data = os.urandom(64)
        entry = Entry(**{**kernel_doc(data, **H200), "created": "2026-12-03T00:00:00Z"})
        store.put_object(data)
        store.put_entry(entry)
        entries.append(entry)
    return store, entries


def verdict(entry: Entry, status: str = "pass", device: str = DEV, when: str = "2026-12-03T10:00:00Z") -> Verdict:
    extra: dict[str, Any] = {"tensor": "dq", "error": 1.3, "bound": 0.02} if status == "wrong" else {}
    return Verdict(kernel_key=entry.kernel_key, device=device, status=status, checks=2, calls=["fwd"],
                   toolchain="4.0.0b36/4.8.1", when=when, **extra)


def requests(server: Server, method: str) -> float:
    pattern = rf'fa4_aot_http_requests_total\{{method="{method}",route="/v1/verdicts",status="\d+"\}} ([\d.e+]+)'
    return sum(float(m) for m in re.findall(pattern, httpx.get(f"{server.url}/metrics").text))


@pytest.mark.filterwarnings("ignore:FA4_AOT_INSECURE=1")
def test_push_then_pull_carries_verdicts(launch: Launch, tmp_path: Path) -> None:
    server = launch()
    local, (a, b, c) = built(tmp_path / "build", 3)
    local.put_verdicts([verdict(a), verdict(a, "wrong", OTHER), verdict(b, "crash")])
    sent = push(local, Remote(server.url, server.tokens["publish"]), "h200")
    assert sent.failures == [] and sent.verdicts == 3 and requests(server, "POST") == 1
    rows = httpx.get(f"{server.url}/v1/verdicts", params={"sku": "h200"}).json()
    assert {(r["kernel_key"], r["device"], r["status"]) for r in rows} == {
        (a.kernel_key, DEV, "pass"), (a.kernel_key, OTHER, "wrong"), (b.kernel_key, DEV, "crash")}

    mirror, remote, reads = Store(tmp_path / "mirror"), Remote(server.url), requests(server, "GET")
    got = pull(mirror, remote, "h200", trust=Trust(H200_SKU, mirror, remote, {}, insecure=True))
    assert got.failures == [] and got.fetched == 3 and got.verdicts == 3 and requests(server, "GET") == reads + 1
    for entry in (a, b, c):
        assert sorted(mirror.verdicts(entry.kernel_key), key=lambda v: v.device) == \
            sorted(local.verdicts(entry.kernel_key), key=lambda v: v.device)
    again = pull(mirror, remote, "h200", trust=Trust(H200_SKU, mirror, remote, {}, insecure=True))
    assert again.verdicts == 0  # nothing newer than the mirror holds: no file rewritten

    local.put_verdicts([verdict(b, "pass", when="2026-12-04T10:00:00Z")])  # re-certified on the build host
    assert push(local, Remote(server.url, server.tokens["publish"]), "h200").verdicts == 3
    got = pull(mirror, remote, "h200", trust=Trust(H200_SKU, mirror, remote, {}, insecure=True))
    assert got.verdicts == 1 and [v.status for v in mirror.verdicts(b.kernel_key)] == ["pass"]


def test_push_cuts_many_verdicts_into_few_requests(launch: Launch, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    server = launch()
    local, entries = built(tmp_path / "build", 5)
    local.put_verdicts([verdict(e, device=f"gpu-{i}.132sm.driver-13.0.cuda-13.0") for e in entries
                        for i in range(5)])
    monkeypatch.setattr(endpoints, "VERDICT_BATCH", 10)
    sent = push(local, Remote(server.url, server.tokens["publish"]), "h200")
    assert sent.failures == [] and sent.verdicts == 25 and requests(server, "POST") == 3
    assert len(httpx.get(f"{server.url}/v1/verdicts", params={"limit": 1000}).json()) == 25


def test_pushing_verdicts_with_a_read_token_is_a_named_failure(launch: Launch, tmp_path: Path) -> None:
    server = launch()
    local, (a,) = built(tmp_path / "build", 1)
    push(local, Remote(server.url, server.tokens["publish"]), "h200")
    refused = endpoints.Endpoints(server.url, server.tokens["read"], retries=0)
    with pytest.raises(RemoteError, match="needs a publish token"):
        refused.push_verdicts([verdict(a)])


def _item(**changes: Any) -> dict[str, Any]:
    doc = {**verdict(built_entry()).to_dict(), "sku": "h200", "publisher": "x", "recorded": "2026-12-03T10:00:00Z"}
    return {**doc, **changes}


def built_entry() -> Entry:
    return Entry(**{**kernel_doc(b"payload", **H200), "created": "2026-12-03T00:00:00Z"})


HOSTILE = {
    "not-a-list": b'{"verdicts": []}',
    "item-not-an-object": b"[7]",
    "no-kernel-key": json.dumps([{k: v for k, v in _item().items() if k != "kernel_key"}]).encode(),
    "kernel-key-a-path": json.dumps([_item(kernel_key="../../etc/passwd")]).encode(),
    "device-malformed": json.dumps([_item(device="../x")]).encode(),
    "status-unknown": json.dumps([_item(status="certified")]).encode(),
    "checks-a-string": json.dumps([_item(checks="many")]).encode(),
    "error-a-list": json.dumps([_item(error=[1])]).encode(),
    "when-not-a-time": json.dumps([_item(when={"day": 1})]).encode(),
    "calls-not-strings": json.dumps([_item(calls=[None])]).encode(),
    "detail-huge": json.dumps([_item(detail="x" * 10_000)]).encode(),
    "html": b"<html>sign in</html>",
}


@pytest.mark.bad_input("server answers")
@pytest.mark.parametrize("body", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_hostile_verdict_listing_is_a_remote_error(body: bytes) -> None:
    def answer(path: str, conn: socket.socket) -> None:
        server.send(conn, reply(200, body))

    server = RawServer(answer)
    with server:
        with pytest.raises(RemoteError, match=server.url):
            Remote(server.url, retries=0).verdicts(sku="h200")


@pytest.mark.bad_input("server answers")
@pytest.mark.parametrize("answer", [b"[]", b'{"stored": "all"}', b'{"stored": true}', b"<html></html>"])
def test_a_hostile_publish_answer_is_a_remote_error(answer: bytes) -> None:
    def handle(path: str, conn: socket.socket) -> None:
        server.send(conn, reply(201, answer))

    server = RawServer(handle)
    with server:
        with pytest.raises(RemoteError, match=server.url):
            Remote(server.url, "t", retries=0).push_verdicts([verdict(built_entry())])


def test_a_server_that_predates_verdicts_is_named(tmp_path: Path) -> None:
    def handle(path: str, conn: socket.socket) -> None:
        server.send(conn, reply(404, b'{"detail": "Not Found"}'))

    server = RawServer(handle)
    with server:
        remote = Remote(server.url, "t", retries=0)
        assert remote.verdicts(sku="h200") == []  # nothing to pull from it
        with pytest.raises(RemoteError, match="predates certification verdicts"):
            remote.push_verdicts([verdict(built_entry())])
