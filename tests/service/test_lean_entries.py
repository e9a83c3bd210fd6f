"""Regression (found while adding the lean runtime): entries that carry `shared_libs` (lean libraries linked by
the build) must still publish to the server, import into it at startup and come back from it, without the
server naming libraries it does not hold. A store the server shares with the build host keeps its libraries."""

from __future__ import annotations

import os
from pathlib import Path

from service_helpers import Launch, kernel_doc

from fa4_aot.remote import Remote
from fa4_aot.store import Entry, Store


def _entry_with_libraries(store: Store) -> Entry:
    data, lib = os.urandom(2000), os.urandom(1000)
    digest, lib_digest = store.put_object(data), store.put_object(lib)
    doc = {k: v for k, v in kernel_doc(data).items() if k in Entry.__dataclass_fields__}
    libs = {"x86_64": {"digest": lib_digest, "size": len(lib), "needs": {"libtvm_ffi.so": ""}}}
    entry = Entry(**{**doc, "object_digest": digest}, shared_libs=libs)
    store.put_entry(entry)
    return entry


def test_entry_with_lean_libraries_pushes_and_pulls_without_them(launch: Launch, tmp_path: Path) -> None:
    local = Store(tmp_path / "build")
    entry = _entry_with_libraries(local)
    server = launch()
    Remote(server.url, token=server.tokens["publish"]).push_entry(entry, local)
    with server.client("read") as c:
        got = c.get(f"/v1/kernels/{entry.kernel_key}")
    assert got.status_code == 200, got.text
    assert "shared_libs" not in got.json() and got.json()["object_digest"] == entry.object_digest
    pulled = Store(tmp_path / "gpu")
    Remote(server.url).fetch_kernel(entry.kernel_key, pulled)
    assert pulled.get_entry(entry.kernel_key).shared_libs == {}


def test_server_on_a_build_store_imports_and_keeps_its_libraries(launch: Launch, tmp_path: Path) -> None:
    shared = Store(tmp_path / "cache")
    entry = _entry_with_libraries(shared)
    server = launch(cache_dir=tmp_path / "cache")
    with server.client("read") as c:
        assert c.get(f"/v1/kernels/{entry.kernel_key}").status_code == 200  # imported at startup
    Remote(server.url, token=server.tokens["publish"]).push_entry(entry, shared)
    assert Store(tmp_path / "cache").get_entry(entry.kernel_key).shared_libs == entry.shared_libs
