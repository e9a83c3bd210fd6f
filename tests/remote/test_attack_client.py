"""Issue 9 (security round 2), the client's side: a hostile or broken server, and trust settings that must not
fail open. Servers here are real TCP listeners scripted byte by byte (raw_server.py), or a real uvicorn."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import socket
from pathlib import Path

import httpx
import pytest

from fa4_aot.client import Installation
from fa4_aot.domain.skus import Sku
from fa4_aot.errors import IntegrityError, TrustError
from fa4_aot.remote import push_pull
from fa4_aot.remote.http import Remote
from fa4_aot.store import Entry, Store
from fa4_aot.trust import signing, signing_keys
from fa4_aot.trust.policy import Trust
from tests.helpers.raw_server import RawServer, reply
from tests.helpers.servers import Server, kernel_doc, prepare_database

H200 = Sku("h200", "sm_90a", 132, 62914560, 13)


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FA4_AOT_TRUSTED_KEYS", "FA4_AOT_INSECURE", "FA4_AOT_REVOKED", "FA4_AOT_SHARED_CACHE",
                 "FA4_AOT_FETCH_DEADLINE"):
        monkeypatch.delenv(name, raising=False)


def entry_for(data: bytes, **overrides: object) -> Entry:
    doc = kernel_doc(data, **overrides)
    return Entry(**{**doc, "created": "2026-01-01T00:00:00Z"})


def kernel_route(entry: Entry, objects: dict[str, bytes], server: RawServer, flood: int = 0):  # type: ignore[no-untyped-def]
    """A handler serving `entry` at /v1/kernels/<key>, and its object (followed by `flood` extra bytes)."""

    def handle(path: str, conn: socket.socket) -> None:
        if path == f"/v1/kernels/{entry.kernel_key}":
            server.send(conn, reply(200, json.dumps(entry.__dict__).encode()))
        elif path.startswith("/v1/objects/") and path.removeprefix("/v1/objects/") in objects:
            data = objects[path.removeprefix("/v1/objects/")]
            server.send(conn, reply(200, data, "application/octet-stream", length=len(data) + flood))
            block = b"\0" * (1 << 20)
            for _ in range(flood // len(block)):
                server.send(conn, block)
        else:
            server.send(conn, reply(404, b'{"detail": "no"}'))

    return handle


@pytest.mark.bad_input("server answers")
def test_d6_download_stops_at_expected_size(tmp_path: Path) -> None:
    data = os.urandom(67_288)
    entry = entry_for(data)
    flood = 64 << 20
    holder: list[RawServer] = []
    server = RawServer(lambda path, conn: kernel_route(entry, {entry.object_digest: data}, holder[0],
                                                       flood=flood)(path, conn))
    holder.append(server)
    store = Store(tmp_path / "cache")
    with server, pytest.raises(IntegrityError, match="more than the expected 67288 bytes"):
        Remote(server.url, retries=0).fetch_object(entry.object_digest, store, entry.size)
    assert not store.has_object(entry.object_digest) and not list((tmp_path / "cache").rglob("*.tmp"))
    assert server.sent < flood  # the client hung up long before the flood was through


@pytest.mark.bad_input("trust settings")
@pytest.mark.parametrize("content", ["", "\n\n", "# keys go here\n", "  ;  "])
def test_d7_trusted_keys_that_yield_no_key_are_an_error(tmp_path: Path, content: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    keys_file = tmp_path / "trusted.pub"
    keys_file.write_text(content)
    with pytest.raises(TrustError, match="holds no key"):
        signing_keys.trusted_keys(str(keys_file))
    if content and not content.strip():  # blanks given inline
        with pytest.raises(TrustError, match="holds no key"):
            signing_keys.trusted_keys(content)
    monkeypatch.setenv("FA4_AOT_TRUSTED_KEYS", str(keys_file))
    with pytest.raises(TrustError):
        Trust.from_env(H200, Store(tmp_path / "cache"), None)
    with pytest.raises(TrustError, match="cannot read"):
        signing_keys.trusted_keys(str(tmp_path / "missing.pub"))


@pytest.mark.bad_input("manifests")
def test_d8_newest_manifest_of_a_key_decides(tmp_path: Path) -> None:
    private, public = signing_keys.generate(tmp_path / "keys", "build")
    key = signing_keys.load_private(private)
    store = Store(tmp_path / "cache")
    old_data, new_data = os.urandom(100), os.urandom(100)
    old_entry = entry_for(old_data)
    new_entry = Entry(**{**old_entry.__dict__, "object_digest": hashlib.sha256(new_data).hexdigest()})

    def manifest(digest: str, created: dt.datetime) -> dict[str, object]:
        stamp = created.strftime("%Y-%m-%dT%H:%M:%SZ")
        return signing.sign({"sku": {"name": "h200", **H200.target_facts()}, "kernels": {old_entry.kernel_key: digest},
                             "toolchain": [], "created": stamp, "expires": "2099-01-01T00:00:00Z"}, key)

    base = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    old = manifest(old_entry.object_digest, base)
    for minutes in range(1, 10_000):  # a newer manifest whose id sorts first: local manifests load in id order
        new = manifest(new_entry.object_digest, base + dt.timedelta(minutes=minutes))
        if signing.manifest_id(new) < signing.manifest_id(old):
            break
    for envelope in (old, new):
        signing.save(store, envelope)
    trust = Trust(H200, store, None, {public.key_id: public})
    trust.check(new_entry)
    with pytest.raises(TrustError, match="is listed with object"):
        trust.check(old_entry)


@pytest.mark.bad_input("server answers")
def test_d11_broken_answers_fail_cleanly(tmp_path: Path) -> None:
    html = b"<html><body>Sign in to the proxy</body></html>"
    holder: list[RawServer] = []
    server = RawServer(lambda path, conn: holder[0].send(conn, reply(200, html, "text/html")))
    holder.append(server)
    _, public = signing_keys.generate(tmp_path / "keys", "build")
    store = Store(tmp_path / "cache")
    store.put_manifest("h200", "a" * 64, b"{not json")
    local = Entry(**{**entry_for(b"local").__dict__, "object_digest": store.put_object(b"local")})
    store.put_entry(local)
    with server:
        trust = Trust(H200, store, Remote(server.url, retries=0), {public.key_id: public})
        with pytest.raises(TrustError, match="is not listed"):
            trust.check(local)  # refused as unlisted, not crashed by a JSONDecodeError
        assert any("not JSON" in why for why in trust.rejected), trust.rejected
    data = os.urandom(2000)
    bad = entry_for(data)
    holder.clear()
    corrupt = RawServer(lambda path, conn: kernel_route(bad, {bad.object_digest: os.urandom(2000)}, holder[0])(
        path, conn))
    holder.append(corrupt)
    with corrupt:
        insecure = Trust(H200, store, None, {}, insecure=True)
        inst = Installation(sku=H200, store=store, mode="strict", trace=[], trust=insecure, tools={},
                            remote=Remote(corrupt.url, retries=0))
        assert inst.fetch(bad.kernel_key) is False  # IntegrityError inside: never raised
    assert "hashing to" in inst.remote_error and not store.has_object(bad.object_digest)


@pytest.mark.bad_input("trust settings")
def test_d16_pull_obeys_trust(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db_url = f"sqlite:///{tmp_path / 'fa4-aot.db'}"
    server = Server(cache_dir=tmp_path / "served", db_url=db_url, log=tmp_path / "server.log",
                    tokens=prepare_database(db_url)).start()
    try:
        with httpx.Client(base_url=server.url, timeout=30,
                          headers={"Authorization": f"Bearer {server.tokens['publish']}"}) as c:
            for _ in range(3):
                data = os.urandom(300)
                doc = kernel_doc(data)
                assert c.put(f"/v1/objects/{doc['object_digest']}", content=data).status_code == 201
                assert c.post("/v1/kernels", json=doc).status_code == 201
        _, unrelated = signing_keys.generate(tmp_path / "keys", "unrelated")
        monkeypatch.setenv("FA4_AOT_TRUSTED_KEYS", unrelated.line())
        store = Store(tmp_path / "mirror")
        result = push_pull.pull(store, Remote(server.url), "h200")
        assert (result.kernels, result.fetched) == (3, 0) and len(result.failures) == 3
        assert all("is not listed" in f for f in result.failures) and list(store.entries()) == []
        monkeypatch.delenv("FA4_AOT_TRUSTED_KEYS")
        with pytest.raises(TrustError, match="pull refused"):
            push_pull.pull(store, Remote(server.url), "h200")
        monkeypatch.setenv("FA4_AOT_INSECURE", "1")
        assert push_pull.pull(store, Remote(server.url), "h200").fetched == 3
    finally:
        server.kill()
