"""Issue 22, point 2: the server serves what its store holds, also what is written into it after `fa4-aot serve`
started: kernels of a later build, and the signed manifest `fa4-aot sign` keeps there (before, neither appeared
until a restart, and trusted clients failed until the store was pushed to its own server)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from fa4_aot.domain.skus import Sku
from fa4_aot.store import Entry, Store
from fa4_aot.trust import signing, signing_keys
from tests.helpers.servers import H200, Launch, kernel_doc

SKU = Sku("h200", H200["arch"], H200["sm_count"], H200["l2_bytes"], H200["cuda_major"], host=H200["host"])


def _add_kernel(store: Store) -> Entry:
    data = os.urandom(500)
    store.put_object(data)
    entry = Entry(**kernel_doc(data, created="2026-01-01T00:00:00Z"))
    store.put_entry(entry)
    return entry


def _eventually(check: object, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return True
        time.sleep(0.2)
    return False


def test_kernels_and_manifests_written_after_start_are_served(launch: Launch, tmp_path: Path) -> None:
    cache = tmp_path / "store"
    store = Store(cache)
    first = _add_kernel(store)
    server = launch(cache_dir=cache, store_poll="0.3")
    later = _add_kernel(store)  # a build into the served store
    key_path, public = signing_keys.generate(tmp_path / "keys", "build")
    envelope = signing.sign(signing.manifest_of(store, SKU), signing_keys.load_private(key_path))
    signing.save(store, envelope)  # what `fa4-aot sign` does

    with server.client() as c:
        def served() -> bool:
            keys = {k["kernel_key"] for k in c.get("/v1/skus/h200/manifest").json()["kernels"]}
            return keys == {first.kernel_key, later.kernel_key}

        def signed() -> bool:
            return [signing.manifest_id(m) for m in c.get("/v1/skus/h200/manifests").json()["manifests"]] == [
                signing.manifest_id(envelope)]

        assert _eventually(served), "a kernel built into the store after start was never served"
        assert c.get(f"/v1/kernels/{later.kernel_key}").json() == later.published()
        assert _eventually(signed), "the manifest `sign` kept in the store was never served"
        verified = signing.verify(c.get("/v1/skus/h200/manifests").json()["manifests"][0],
                                  {public.key_id: public}, SKU, signing.Revocations())
        assert set(verified["kernels"]) == {first.kernel_key, later.kernel_key}
