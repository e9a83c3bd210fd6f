"""Trust on the server: signed manifests checked against what the service serves (never their signatures),
revocations, tokens limited to SKUs, token rotation, and the audit log. A rejected request writes no row
and no audit entry; every accepted write is audited with the acting token's name."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from fa4_aot.domain.skus import Sku
from fa4_aot.trust import signing, signing_keys
from service import db
from service.crud import tokens as crud_tokens
from service.errors import InvalidInput, TokenNotFound
from service.limits import MANIFEST_BODY_LIMIT
from tests.helpers.servers import H200, Launch, Server, kernel_doc, row_counts, store_files

FACTS: dict[str, Any] = {k: v for k, v in H200.items() if k != "sku"}


def _publish(c: httpx.Client, sku: str, n: int = 2) -> dict[str, str]:
    """Upload n random objects and publish a kernel of `sku` for each; returns {kernel_key: object_digest}."""
    kernels = {}
    for _ in range(n):
        data = os.urandom(200)
        doc = kernel_doc(data, sku=sku)
        assert c.put(f"/v1/objects/{doc['object_digest']}", content=data).status_code == 201
        assert c.post("/v1/kernels", json=doc).status_code == 201
        kernels[doc["kernel_key"]] = doc["object_digest"]
    return kernels


def _envelope(key_path: Path, sku: str, kernels: dict[str, str], created: str = "2026-01-01T00:00:00Z",
              **sku_overrides: Any) -> dict[str, Any]:
    manifest = {"sku": {"name": sku, **FACTS, **sku_overrides}, "kernels": kernels,
                "toolchain": [{"flash-attn-4": "4.0.0b36"}], "created": created, "expires": "2099-01-01T00:00:00Z"}
    return signing.sign(manifest, signing_keys.load_private(key_path))


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("keys")
    return signing_keys.generate(folder, "one")[0], signing_keys.generate(folder, "two")[0]


def _token(server: Server, name: str, scope: str = "publish", skus: list[str] | None = None) -> str:
    with db.session_for(server.db_url) as session:
        return crud_tokens.create_token(session, name=name, scope=scope, skus=skus)


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_put_then_get_manifests_newest_first(server: Server, keys: tuple[Path, Path]) -> None:
    with server.client("publish") as c:
        kernels = _publish(c, "trust-put")
        old, new = (_envelope(keys[0], "trust-put", kernels, created=t)
                    for t in ("2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z"))
        first, again = (c.put("/v1/skus/trust-put/manifests", json=old) for _ in range(2))
        assert c.put("/v1/skus/trust-put/manifests", json=new).status_code == 201
        listed = c.get("/v1/skus/trust-put/manifests")
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json() == again.json() == {
        "manifest_id": signing.manifest_id(old), "sku": "trust-put", "key_id": old["key_id"], "kernels": 2,
        "created": "2026-01-01T00:00:00Z", "expires": "2099-01-01T00:00:00Z"}
    assert listed.status_code == 200 and listed.json() == {"manifests": [new, old]}
    # What the server hands out verifies on a client that trusts the key.
    trusted = {k.key_id: k for k in [signing_keys.parse_public(keys[0].with_suffix(".pub").read_text())]}
    sku = Sku(name="trust-put", **FACTS)
    for envelope in listed.json()["manifests"]:
        assert signing.verify(envelope, trusted, sku, signing.Revocations())["kernels"] == kernels


def test_get_manifests_of_unknown_or_unsigned_sku(server: Server) -> None:
    with server.client("publish") as c:
        _publish(c, "trust-unsigned", n=1)
        assert c.get("/v1/skus/trust-unsigned/manifests").json() == {"manifests": []}
        missing = c.get("/v1/skus/trust-nowhere/manifests")
    assert missing.status_code == 404 and "GET /v1/skus" in missing.json()["detail"]


def test_rejected_manifests_write_nothing(server: Server, keys: tuple[Path, Path]) -> None:
    with server.client("publish") as c:
        kernels = _publish(c, "trust-bad")
        assert c.put("/v1/skus/trust-bad/manifests", json=_envelope(keys[0], "trust-bad", kernels)).status_code == 201
    good = _envelope(keys[0], "trust-bad", kernels, created="2026-03-01T00:00:00Z")
    first_key = sorted(kernels)[0]
    other_digest, unknown_key = hashlib.sha256(b"other").hexdigest(), hashlib.sha256(b"unknown").hexdigest()
    cases: list[tuple[str, Any, int, str]] = [
        ("trust-bad", {**good, "format": "fa4-aot-manifest/0"}, 422, "not a signed manifest"),
        ("trust-bad", b"{not json", 422, "not JSON"),
        ("trust-bad", [good], 422, "not a signed manifest"),
        ("trust-bad", {k: v for k, v in good.items() if k != "signature"}, 422, "'signature'"),
        ("trust-bad", {**good, "manifest": {**good["manifest"], "kernels": {"zz": other_digest}}}, 422, "'zz'"),
        ("trust-bad", {**good, "manifest": {**good["manifest"], "created": "yesterday"}}, 422, "'created'"),
        ("trust-bad", {**good, "key_id": "0" * 16}, 422, "key_id"),
        ("trust-other", good, 422, "/v1/skus/trust-bad/manifests"),
        ("trust-bad", _envelope(keys[0], "trust-bad", {**kernels, unknown_key: other_digest}), 409, unknown_key),
        ("trust-bad", _envelope(keys[0], "trust-bad", {**kernels, first_key: other_digest}), 409, other_digest),
        ("trust-nosku", _envelope(keys[0], "trust-nosku", kernels), 409, "unknown SKU 'trust-nosku'"),
        ("trust-bad", _envelope(keys[0], "trust-bad", kernels, sm_count=144), 409, '"sm_count":144'),
        # Same manifest (same id), signed by another key: storing it would silently drop that signature.
        ("trust-bad", _envelope(keys[1], "trust-bad", kernels), 409, "already stored with a signature"),
        ("trust-bad", {**good, "padding": "x" * (1 << 20)}, 422, "unexpected fields padding"),
        ("trust-bad", {**good, "padding": "x" * MANIFEST_BODY_LIMIT}, 413, f"over {MANIFEST_BODY_LIMIT} bytes"),
    ]
    before, before_files = row_counts(server.db_url), store_files(server.cache_dir)
    with server.client("publish") as c:
        for sku, body, status, fragment in cases:
            sent = {"content": body} if isinstance(body, bytes) else {"json": body}
            r = c.put(f"/v1/skus/{sku}/manifests", **sent)
            assert (r.status_code, fragment in r.json()["detail"]) == (status, True), (sku, r.text[:300])
        assert len(c.get("/v1/skus/trust-bad/manifests").json()["manifests"]) == 1
    with server.client("read") as c:
        assert c.put("/v1/skus/trust-bad/manifests", json=good).status_code == 403
    with server.client() as c:
        assert c.put("/v1/skus/trust-bad/manifests", json=good).status_code == 401
    assert row_counts(server.db_url) == before and store_files(server.cache_dir) == before_files


def test_sku_limited_token(server: Server, keys: tuple[Path, Path]) -> None:
    limited = _token(server, "ci-limited", skus=["trust-mine", "trust-also"])
    with server.client("publish") as c:
        theirs = _publish(c, "trust-theirs", n=1)
    data = os.urandom(300)
    # facts of its own: SKUs with equal facts share keys, which a limited token may write only for all of them
    mine, foreign = kernel_doc(data, sku="trust-mine", sm_count=131), kernel_doc(data, key="e" * 64, sku="trust-theirs")
    with httpx.Client(base_url=server.url, headers=_bearer(limited), timeout=30) as c:
        assert c.put(f"/v1/objects/{mine['object_digest']}", content=data).status_code == 201  # objects: any SKU
        assert c.post("/v1/kernels", json=mine).status_code == 201
        own = c.put("/v1/skus/trust-mine/manifests",
                    json=_envelope(keys[0], "trust-mine", {mine["kernel_key"]: mine["object_digest"]}, sm_count=131))
        before = row_counts(server.db_url)
        refused = [c.post("/v1/kernels", json=foreign),
                   c.put("/v1/skus/trust-theirs/manifests", json=_envelope(keys[0], "trust-theirs", theirs))]
    assert own.status_code == 201
    for r in refused:
        detail = r.json()["detail"]
        assert r.status_code == 403 and all(s in detail for s in ("'ci-limited'", "'trust-theirs'",
                                                                    "trust-also, trust-mine")), detail
    assert row_counts(server.db_url) == before


@pytest.mark.parametrize(("scope", "skus", "fragment"), [
    ("read", ["h200"], "needs scope publish"),
    ("admin", ["h200"], "needs scope publish"),
    ("publish", [], "empty SKU list"),
    ("publish", ["../etc"], "invalid SKU name '../etc'"),
    ("publish", ["H200"], "invalid SKU name 'H200'"),
])
def test_create_token_validates_sku_lists(server: Server, scope: str, skus: list[str], fragment: str) -> None:
    before = row_counts(server.db_url)
    with db.session_for(server.db_url) as session, pytest.raises(InvalidInput, match=fragment):
        crud_tokens.create_token(session, name=f"bad-{scope}", scope=scope, skus=skus)
    assert row_counts(server.db_url) == before


def test_active_token_names_are_unique(server: Server) -> None:
    _token(server, "unique-name")
    with db.session_for(server.db_url) as session:
        with pytest.raises(InvalidInput, match="token rotate --name unique-name"):
            crud_tokens.create_token(session, name="unique-name", scope="read")
        crud_tokens.revoke_token(session, name="unique-name")
        assert crud_tokens.create_token(session, name="unique-name", scope="read")  # free again once revoked
        first = crud_tokens.create_token(session, name="", scope="read")
        assert first != crud_tokens.create_token(session, name="", scope="read")
        with pytest.raises(InvalidInput, match="active tokens are named ''"):
            crud_tokens.rotate_token(session, name="")  # several unnamed tokens: rotating one is ambiguous
        with pytest.raises(TokenNotFound, match="no active token named 'nobody'"):
            crud_tokens.rotate_token(session, name="nobody")


def test_rotate_token(launch: Launch) -> None:
    server = launch()
    old = _token(server, "rotating", skus=["trust-rot"])
    with db.session_for(server.db_url) as session:
        new = crud_tokens.rotate_token(session, name="rotating")
    data = os.urandom(100)
    doc = kernel_doc(data, sku="trust-rot")
    with httpx.Client(base_url=server.url, timeout=30) as c:
        put = f"/v1/objects/{doc['object_digest']}"
        assert c.put(put, content=data, headers=_bearer(old)).status_code == 403
        assert c.put(put, content=data, headers=_bearer(new)).status_code == 201
        assert c.post("/v1/kernels", json=doc, headers=_bearer(new)).status_code == 201
        other = c.post("/v1/kernels", json={**doc, "sku": "trust-else"}, headers=_bearer(new))
        assert other.status_code == 403 and "trust-rot" in other.json()["detail"]  # same SKU list
        entries = c.get("/v1/audit", headers=_bearer(server.tokens["admin"])).json()["entries"]
    tokens = [(e["actor"], e["action"], e["target"], e["detail"].get("skus"))
              for e in entries if e["action"].startswith("token.")]
    assert tokens[-2:] == [("cli", "token.create", "rotating", ["trust-rot"]),
                           ("cli", "token.rotate", "rotating", ["trust-rot"])]
    writes = [(e["actor"], e["action"], e["target"]) for e in entries if not e["action"].startswith("token.")]
    assert writes == [("rotating", "object.create", doc["object_digest"]),
                      ("rotating", "kernel.create", doc["kernel_key"])]


def test_revocations(launch: Launch) -> None:
    server = launch()
    key_id, manifest_id = "0123456789abcdef", hashlib.sha256(b"manifest").hexdigest()
    with server.client("admin") as c:
        key = c.post("/v1/revocations", json={"kind": "key", "id": key_id, "reason": "laptop stolen"})
        again = c.post("/v1/revocations", json={"kind": "key", "id": key_id, "reason": "another reason"})
        manifest = c.post("/v1/revocations", json={"kind": "manifest", "id": manifest_id})
    assert (key.status_code, again.status_code, manifest.status_code) == (201, 200, 201)
    assert key.json() == again.json() and key.json()["reason"] == "laptop stolen"
    before = row_counts(server.db_url)
    bad = [{"kind": "key", "id": manifest_id}, {"kind": "manifest", "id": key_id}, {"kind": "key", "id": "0123"},
           {"kind": "key", "id": key_id.upper()}, {"kind": "token", "id": key_id}, {"kind": "key"},
           {"kind": "key", "id": "f" * 16, "reason": "x" * 501}, {"kind": "key", "id": "f" * 16, "extra": 1},
           {"kind": "key", "id": "../../etc/passwd"}, {"kind": "key", "id": "f" * 16, "reason": "nul\u0000"}]
    with server.client("admin") as c:
        for body in bad:
            assert c.post("/v1/revocations", json=body).status_code == 422, body
    for scope in ("read", "publish", "revoked", None):
        with server.client(scope) as c:
            assert c.post("/v1/revocations", json={"kind": "key", "id": "f" * 16}).status_code == (
                401 if scope is None else 403)
    assert row_counts(server.db_url) == before
    with server.client() as c:  # reads are open by default, so any client can fetch the list
        listed = c.get("/v1/revocations").json()
    assert (listed["keys"], listed["manifests"]) == ([key_id], [manifest_id])
    assert [(e["kind"], e["id"], e["reason"]) for e in listed["entries"]] == [
        ("key", key_id, "laptop stolen"), ("manifest", manifest_id, "")]
    assert signing.Revocations(set(listed["keys"]), set(listed["manifests"])).keys == {key_id}


def test_audit_log_records_successful_writes_only(launch: Launch, keys: tuple[Path, Path]) -> None:
    server = launch()
    unnamed = _token(server, "")
    data = os.urandom(150)
    doc = kernel_doc(data, sku="trust-audit")
    envelope = _envelope(keys[0], "trust-audit", {doc["kernel_key"]: doc["object_digest"]})
    with server.client("publish") as c:
        for _ in range(2):
            c.put(f"/v1/objects/{doc['object_digest']}", content=data)
            c.post("/v1/kernels", json=doc)  # the second, identical one changes nothing
            c.put("/v1/skus/trust-audit/manifests", json=envelope)
        assert c.post("/v1/kernels", json={**doc, "size": 1}).status_code == 409  # rejected: not audited
    with httpx.Client(base_url=server.url, headers=_bearer(unnamed), timeout=30) as c:
        assert c.post("/v1/kernels", json={**doc, "variant": "rebuilt"}).status_code == 200  # immutable: kept
    with server.client("admin") as c:
        c.post("/v1/revocations", json={"kind": "manifest", "id": signing.manifest_id(envelope)})
        log = c.get("/v1/audit", params={"limit": 1000}).json()["entries"]
        page = c.get("/v1/audit", params={"after_id": log[1]["id"], "limit": 2}).json()["entries"]
        assert [c.get("/v1/audit", params=q).status_code for q in (
            {"limit": 0}, {"limit": 1001}, {"after_id": -1}, {"limit": "x"})] == [400] * 4
    unnamed_id = next(e["detail"]["token_id"] for e in log if e["action"] == "token.create" and e["target"][0] == "#")
    assert [(e["actor"], e["action"], e["target"]) for e in log] == [
        *[("cli", "token.create", f"test-{s}") for s in ("read", "publish", "admin", "revoked")],
        ("cli", "token.revoke", "test-revoked"),
        ("cli", "token.create", f"#{unnamed_id}"),
        ("test-publish", "object.create", doc["object_digest"]),
        ("test-publish", "kernel.create", doc["kernel_key"]),
        ("test-publish", "manifest.store", signing.manifest_id(envelope)),
        ("test-admin", "revocation.add", f"manifest:{signing.manifest_id(envelope)}"),
    ]
    assert [e["id"] for e in log] == sorted(e["id"] for e in log) and page == log[2:4]
    assert log[8]["detail"] == {"sku": "trust-audit", "key_id": envelope["key_id"], "kernels": 1}
    for scope in ("read", "publish", None):
        with server.client(scope) as c:
            assert c.get("/v1/audit").status_code == (401 if scope is None else 403)
