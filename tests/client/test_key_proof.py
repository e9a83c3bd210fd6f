"""Issue 18, D17: an entry must prove its key before any field of it is used. A forged entry for kernel A keeps
A's key and object digest but carries B's compile key and constants; a client that read the forged fields would
derive B's key and run B where it asked for A. Each way such an entry can arrive is refused: a local index edit
(a group writer of a shared cache), GET /v1/kernels/<key> and POST /v1/bundles, from scripted hostile servers."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from fa4_aot.client import Installation
from fa4_aot.domain import kernel_keys
from fa4_aot.domain.skus import Sku
from fa4_aot.errors import RemoteError, StoreError
from fa4_aot.remote.http import Remote
from fa4_aot.store import Entry, Store
from fa4_aot.trust.policy import Trust
from tests.helpers.raw_server import RawServer, reply
from tests.helpers.servers import kernel_doc

H200 = Sku("h200", "sm_90a", 132, 62914560, 13)


def _kernel(data: bytes, sm_count: int = 132) -> Entry:
    """A kernel that consumed the SM count, filed under its full key (kernel_doc hashes the fields)."""
    doc = kernel_doc(data, hardware_queries=[["sm_count", sm_count]])
    return Entry(**{**doc, "created": "2026-01-01T00:00:00Z"})


def _forged() -> tuple[Entry, Entry, bytes, bytes]:
    """(kernel B, A's base entry forged to carry B's compile key and another SM count, A's bytes, B's bytes)."""
    a_data, b_data = os.urandom(4096), os.urandom(4096)
    a, b = _kernel(a_data), _kernel(b_data)
    a_base = kernel_keys.entry_keys(a)[0]
    forged = dataclasses.replace(a, kernel_key=a_base, compile_key=b.compile_key, hardware_queries=[["sm_count", 7]])
    # what the attack needs: from the forged fields, the device's SM count leads to kernel B
    assert kernel_keys.variant_key(forged, H200.constants()) == b.kernel_key
    return b, forged, a_data, b_data


@pytest.mark.bad_input("cache contents")
def test_d17_a_forged_local_entry_cannot_make_the_client_run_another_kernel(tmp_path: Path) -> None:
    b, forged, a_data, b_data = _forged()
    store = Store(tmp_path / "cache")
    store.put_object(a_data)
    store.put_object(b_data)
    store.put_entry(b)
    store.put_entry(forged)  # a group writer of a shared cache edits A's index entry
    inst = Installation(sku=H200, store=store, mode="strict", trace=[], trust=Trust(H200, store, None, {}),
                        tools=b.toolchain)
    with pytest.raises(StoreError, match="cannot be used: its fields hash to .*it was altered"):
        inst.find(forged.kernel_key)
    assert store.get_entry(b.kernel_key) == b  # B itself is sound and still served under its own key


def _route(entries: dict[str, Entry], objects: dict[str, bytes]):  # type: ignore[no-untyped-def]
    """A hostile server: each entry at /v1/kernels/<key>, objects by digest, and bundles of all the entries."""
    def handle(path: str, conn: socket.socket) -> None:
        if path.removeprefix("/v1/kernels/") in entries:
            conn.sendall(reply(200, json.dumps(entries[path.removeprefix("/v1/kernels/")].__dict__).encode()))
        elif path.removeprefix("/v1/objects/") in objects:
            conn.sendall(reply(200, objects[path.removeprefix("/v1/objects/")], "application/octet-stream"))
        elif path == "/v1/bundles":
            head = {"entries": [e.__dict__ for e in entries.values()], "missing": [],
                    "objects": [[d, len(data)] for d, data in objects.items()]}
            body = json.dumps(head).encode() + b"\n" + b"".join(objects.values())
            conn.sendall(reply(200, body, "application/octet-stream"))
        else:
            conn.sendall(reply(404, b'{"detail": "no"}'))
    return handle


@contextmanager
def _serving_forged() -> Iterator[tuple[Entry, Entry, Remote]]:
    """(kernel B, A's forged base entry, a Remote of a hostile server serving both with their objects)."""
    b, forged, a_data, b_data = _forged()
    objects = {forged.object_digest: a_data, b.object_digest: b_data}
    with RawServer(_route({forged.kernel_key: forged, b.kernel_key: b}, objects)) as server:
        yield b, forged, Remote(server.url, retries=0)


@pytest.mark.bad_input("server answers")
def test_d17_a_forged_entry_from_the_kernels_route_is_refused(tmp_path: Path) -> None:
    store = Store(tmp_path / "cache")
    with _serving_forged() as (b, forged, remote):
        with pytest.raises(RemoteError, match="cannot be used: its fields hash to"):
            remote.fetch_kernel(forged.kernel_key, store)
        assert remote.fetch_kernel(b.kernel_key, store) == b
    assert store.get_entry(forged.kernel_key) is None and not store.has_object(forged.object_digest)


@pytest.mark.bad_input("server answers")
def test_d17_a_forged_entry_in_a_bundle_is_skipped_and_never_stored(tmp_path: Path) -> None:
    store = Store(tmp_path / "cache")
    with _serving_forged() as (b, forged, remote):
        stored, skipped = remote.fetch_bundle([forged.kernel_key, b.kernel_key], store)
    assert [e.kernel_key for e in stored] == [b.kernel_key]
    assert "cannot be used: its fields hash to" in skipped[forged.kernel_key]
    assert store.get_entry(forged.kernel_key) is None and not store.has_object(forged.object_digest)
