"""POST /v1/bundles over HTTP, and the client side that unpacks it (Remote.fetch_bundle): a node's kernels in one
response, hashed while they stream; unknown keys reported, refused kernels never stored, bad bodies refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fa4_aot.errors import Fa4AotError
from fa4_aot.remote.http import Remote
from fa4_aot.store import Entry, Store
from fa4_aot.store.maintenance import verify
from tests.helpers.servers import Server, kernel_doc


def publish(server: Server, data: bytes) -> dict:
    with server.client("publish") as c:
        doc = kernel_doc(data)
        assert c.put(f"/v1/objects/{doc['object_digest']}", content=data).status_code in (200, 201)
        assert c.post("/v1/kernels", json=doc).status_code in (200, 201)
    return doc


def test_bundle_brings_every_kernel_and_names_the_missing(server: Server, tmp_path: Path) -> None:
    blobs = [os.urandom(n) for n in (1, 70_000, 3 << 20)]  # the last spans several stream chunks
    docs = [publish(server, b) for b in blobs]
    unknown = "f" * 64
    store = Store(tmp_path / "node")
    remote = Remote(server.url)
    stored, skipped = remote.fetch_bundle([d["kernel_key"] for d in docs] + [unknown], store)
    assert [e.kernel_key for e in stored] == [d["kernel_key"] for d in docs]
    assert list(skipped) == [unknown]
    for doc, blob in zip(docs, blobs, strict=True):
        assert store.read_object(doc["object_digest"]) == blob
        assert store.get_entry(doc["kernel_key"]) is not None
    assert verify(store).ok
    again, _ = remote.fetch_bundle([docs[0]["kernel_key"]], store)  # already here: read past, nothing rewritten
    assert [e.kernel_key for e in again] == [docs[0]["kernel_key"]]


def test_refused_kernel_is_never_stored_and_the_rest_are(server: Server, tmp_path: Path) -> None:
    good, bad = publish(server, os.urandom(500)), publish(server, os.urandom(600))

    def accept(entry: Entry) -> None:
        if entry.kernel_key == bad["kernel_key"]:
            raise Fa4AotError("not in a trusted manifest")

    store = Store(tmp_path / "node")
    stored, skipped = Remote(server.url).fetch_bundle([good["kernel_key"], bad["kernel_key"]], store, accept)
    assert [e.kernel_key for e in stored] == [good["kernel_key"]]
    assert skipped == {bad["kernel_key"]: "not in a trusted manifest"}
    assert not store.has_entry(bad["kernel_key"]) and not store.has_object(bad["object_digest"])


@pytest.mark.bad_input("bundles")
@pytest.mark.parametrize("body", [{"kernel_keys": []}, {"kernel_keys": ["../../etc/passwd"]},
                                  {"kernel_keys": ["a" * 64] * 4097}, {"keys": ["a" * 64]}],
                         ids=["empty", "traversal", "too-many", "unknown-field"])
def test_bad_bundle_requests_are_refused(server: Server, body: dict) -> None:
    with server.client() as c:
        r = c.post("/v1/bundles", json=body)
    assert r.status_code in (400, 422) and "detail" in r.json()
