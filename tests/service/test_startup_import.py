"""Startup import: what `fa4-aot build` wrote into the store is served without any upload; entries that
cannot be served (object missing, unreadable, SKU facts that clash with the database) are skipped, and the
rest still load."""

from __future__ import annotations

import os
from pathlib import Path

from fa4_aot.store import Entry, Store
from fa4_aot.store.atomic import atomic_write
from tests.helpers.servers import Launch, kernel_doc


def _write_store(cache: Path) -> tuple[list[Entry], list[str]]:
    """Three good h200 entries plus two bad ones; returns (good entries, bad kernel keys)."""
    store = Store(cache)
    good, bad = [], []
    for _ in range(3):
        data = os.urandom(500)
        store.put_object(data)
        entry = Entry(**kernel_doc(data, created="2025-02-01T00:00:00Z"))
        store.put_entry(entry)
        good.append(entry)
    gone = os.urandom(10)
    store.put_object(gone)
    store.put_entry(Entry(**kernel_doc(gone)))
    store.object_path(kernel_doc(gone)["object_digest"]).unlink()
    corrupt = "f" * 64
    atomic_write(store.entry_path(corrupt), b"{not json")
    bad += [kernel_doc(gone)["kernel_key"], corrupt]
    return good, bad


def _add_clashing_entry(cache: Path) -> str:
    """An h200 entry whose SM count differs from the h200 row already in the database."""
    clash = os.urandom(10)
    Store(cache).put_object(clash)
    Store(cache).put_entry(Entry(**kernel_doc(clash, sm_count=999)))
    return str(kernel_doc(clash)["kernel_key"])


def test_build_then_serve(launch: Launch, tmp_path: Path) -> None:
    cache = tmp_path / "built"
    good, bad = _write_store(cache)
    server = launch(cache_dir=cache)
    with server.client() as c:
        manifest = c.get("/v1/skus/h200/manifest")
        keys = [k["kernel_key"] for k in manifest.json()["kernels"]]
        assert keys == sorted(e.kernel_key for e in good)
        for entry in good:
            assert c.get(f"/v1/kernels/{entry.kernel_key}").json() == entry.published()
            assert c.get(f"/v1/objects/{entry.object_digest}").content == Store(cache).read_object(
                entry.object_digest)
        for key in bad:
            assert c.get(f"/v1/kernels/{key}").status_code == 404
    server.kill()
    clash = _add_clashing_entry(cache)
    server.start()  # a second import adds nothing: the new entry's SKU facts clash with the h200 row
    with server.client() as c:  # (its entry is still read from the store, as bundles always read entries)
        assert c.get("/v1/skus/h200/manifest").headers["etag"] == manifest.headers["etag"]
        assert clash not in [k["kernel_key"] for k in c.get("/v1/skus/h200/manifest").json()["kernels"]]
