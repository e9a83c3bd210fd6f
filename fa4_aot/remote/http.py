"""The client of an fa4-aot server (Remote): fetch kernels into the local store, publish local kernels to it.
Configuration is read at call time: FA4_AOT_SERVER, FA4_AOT_TOKEN, FA4_AOT_OFFLINE.

Remote stands on the typed calls (endpoints.py), which stand on the transport (transport.py: deadlines, retries
with backoff, the server treated as down). This module moves objects: a download streams into a temp file beside
its target, hashed while it streams, and is renamed only when the digest and size match; a per-object file lock
plus a re-check after taking it make the ranks of one node download each object once. A bundle (bundle.py)
brings many kernels in one request."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from typing import Any

from .. import config
from ..errors import StoreError
from ..store import Entry, Store
from .bundle import BundleReader, unbundle, with_libraries
from .endpoints import Endpoints
from .transport import remaining


def server_from_env() -> Remote | None:
    """The configured server, or None when FA4_AOT_SERVER is unset or FA4_AOT_OFFLINE=1."""
    url = config.server_url()
    return Remote(url, token=os.environ.get("FA4_AOT_TOKEN")) if url else None


class Remote(Endpoints):
    """One server, for one process start (see Transport for its deadlines, retries and `advice`): its typed
    calls (Endpoints) and the transfers of objects."""

    # -- downloads ----------------------------------------------------------------------------
    def fetch_object(self, digest: str, store: Store, size: int | None = None) -> bool:
        """Make `store` hold object `digest`, downloading it unless present. Returns True if it downloaded.
        Concurrent callers on one store download once: the second finds the object after the lock. Waiting
        for the lock and downloading share the deadline; a download that misses it marks the server down."""
        if store.object_state(digest, size) == "ok":
            return False
        self._check_up()
        began, end = time.monotonic(), self._end()
        with store.lock(digest, timeout=max(0.0, remaining(end))):
            if store.object_state(digest, size) == "ok":
                return False
            self._check_up()
            return self._with_retries(f"download of {digest}", began, end,
                                      functools.partial(self._download, digest, store, size))

    def _download(self, digest: str, store: Store, size: int | None, end: float) -> bool:
        with self._streamed("GET", f"/v1/objects/{digest}", end) as body:
            store.put_stream(digest, body, size=size, source=f"{self.url}/v1/objects/{digest}")
        return True

    def fetch_kernel(self, kernel_key: str, store: Store, accept: Callable[[Entry], None] | None = None,
                     arches: Callable[[Entry], list[str]] | None = None) -> Entry | None:
        """Fetch kernel `kernel_key` (object, then index entry) into `store`; None if the server lacks it.
        `accept(entry)` runs before a byte of the object is downloaded and refuses it by raising. `arches(entry)`
        names the host arches whose linked libraries (with their runtime libraries) come too; the stored entry
        names only those (default: none), so it never names an object the store lacks. An object that a gc
        removed between the download and the entry is fetched once more."""
        entry = self.kernel(kernel_key)
        if entry is None:
            return None
        if accept is not None:
            accept(entry)
        entry = with_libraries(entry, arches(entry) if arches is not None else [])
        for attempt in range(2):
            self.fetch_object(entry.object_digest, store, entry.size)
            for arch in entry.shared_libs:
                for digest, size in entry.lib_digests(arch).items():
                    self.fetch_object(digest, store, size)
            try:
                store.put_entry(entry)
                return entry
            except StoreError:
                if attempt == 1 or store.has_object(entry.object_digest):
                    raise
        raise AssertionError("unreachable")

    def fetch_bundle(self, kernel_keys: list[str], store: Store, accept: Callable[[Entry], None] | None = None,
                     host_arch: str | None = None) -> tuple[list[Entry], dict[str, str]]:
        """Fetch many kernels in one request (POST /v1/bundles): every object is hashed while it streams and
        stored only if it matches (IntegrityError otherwise), then its entries. `accept(entry)` refuses a kernel
        by raising an Fa4AotError before its object is stored (its bytes are read past). Returns (entries
        stored, {kernel key: why not} for those the server lacks or `accept` refused); raises RemoteError when
        the server has no bundle route (older servers: fetch_kernel per key). Shares the fetch deadline as
        fetch_object does: a bundle that misses it marks the server down. With `host_arch` (the lean runtime),
        each entry's library for that arch and the runtime libraries it needs come along."""
        self._check_up()
        began, end = time.monotonic(), self._end()
        body: dict[str, Any] = {"kernel_keys": kernel_keys, **({"host_arch": host_arch} if host_arch else {})}

        def attempt(end: float) -> tuple[list[Entry], dict[str, str]]:
            with self._streamed("POST", "/v1/bundles", end, json=body) as chunks:
                return unbundle(BundleReader(chunks), store, accept, self.url, set(kernel_keys), host_arch)

        return self._with_retries(f"bundle of {len(kernel_keys)} kernels", began, end, attempt)

    # -- uploads ------------------------------------------------------------------------------
    def push_entry(self, entry: Entry, read: Callable[[str], bytes]) -> dict[str, int]:
        """Publish one kernel: upload its linked libraries (with the runtime libraries they need), then its object,
        each unless the server has it (HEAD first), then the entry that makes it visible; `read(digest)` gives an
        object's bytes (Store.read_object, or bytes a worker holds). Returns {digest: bytes} of what was
        uploaded. The server re-hashes every upload (422 on a mismatch)."""
        sent: dict[str, int] = {}
        for digest in [d for arch in sorted(entry.shared_libs) for d in entry.lib_digests(arch)] + [
                entry.object_digest]:
            size = self.put_object(digest, functools.partial(read, digest))
            if size is not None:
                sent[digest] = size
        self._request("POST", "/v1/kernels", ok=(200, 201), json=entry.published())
        return sent

    def put_object(self, digest: str, data: Callable[[], bytes]) -> int | None:
        """Upload object `digest` (bytes from `data()`) unless the server has it; the bytes uploaded, or None
        when the server had it."""
        if self.has_object(digest):
            return None
        content = data()
        self._request("PUT", f"/v1/objects/{digest}", ok=(200, 201), content=content,
                      headers={"Content-Type": "application/octet-stream"})
        return len(content)
