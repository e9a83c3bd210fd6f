"""The HTTP side of the client: talk to an fa4-aot server (service/), fetch kernels into the local store,
publish local kernels to it.

Reads are retried with exponential backoff on timeouts, connection errors and 5xx. A download streams
into a temp file beside its target, hashed while it streams, and is renamed only when the digest and size
match; a per-object file lock plus a re-check after taking it make the ranks of one node download each
object once. Configuration is read at call time: FA4_AOT_SERVER, FA4_AOT_TOKEN, FA4_AOT_OFFLINE.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from typing import Any

import httpx

from . import config
from .errors import Fa4AotError, RemoteError
from .store import Entry, Store, check_hex

RETRIES = 4
TIMEOUT = httpx.Timeout(30.0, connect=5.0)
MISS_REPORT_TIMEOUT = 2.0  # seconds: the most a miss report may cost, and it runs off the caller's thread


def server_from_env() -> Remote | None:
    """The configured server, or None when FA4_AOT_SERVER is unset or FA4_AOT_OFFLINE=1."""
    url = config.server_url()
    return Remote(url, token=os.environ.get("FA4_AOT_TOKEN")) if url else None


class Remote:
    def __init__(self, url: str, token: str | None = None, retries: int = RETRIES) -> None:
        self.url = url.rstrip("/")
        self.retries = retries
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.Client(base_url=self.url, headers=headers, timeout=TIMEOUT)

    def close(self) -> None:
        self._client.close()

    # -- transport ----------------------------------------------------------------------------
    def _request(self, method: str, path: str, ok: tuple[int, ...] = (200,), **kwargs: Any) -> httpx.Response:
        """One request with retries on transient failures; raises RemoteError for anything not in `ok`."""
        for attempt in range(self.retries + 1):
            try:
                response = self._client.request(method, path, **kwargs)
            except (httpx.TimeoutException, httpx.TransportError) as e:
                if attempt == self.retries:
                    raise RemoteError(f"cannot reach {self.url} ({type(e).__name__}: {e}); check FA4_AOT_SERVER "
                                      "or set FA4_AOT_OFFLINE=1 to use the local store only") from e
            else:
                if response.status_code < 500 or attempt == self.retries:
                    return _check(response, ok, self.url)
            time.sleep(min(8.0, 0.2 * 2**attempt) * (0.5 + random.random()))
        raise AssertionError("unreachable")

    # -- reads --------------------------------------------------------------------------------
    def skus(self) -> list[dict[str, Any]]:
        return self._request("GET", "/v1/skus").json()

    def manifest(self, sku: str) -> dict[str, Any]:
        return self._request("GET", f"/v1/skus/{sku}/manifest").json()

    def kernel_keys(self, sku: str) -> set[str]:
        """Every kernel key the server holds for `sku` (none when it does not know the SKU yet)."""
        response = self._request("GET", f"/v1/skus/{sku}/manifest", ok=(200, 404))
        return set() if response.status_code == 404 else {k["kernel_key"] for k in response.json()["kernels"]}

    def kernel(self, kernel_key: str) -> Entry | None:
        """The server's entry for `kernel_key`, or None when it has none."""
        response = self._request("GET", f"/v1/kernels/{check_hex(kernel_key, 'kernel key')}", ok=(200, 404))
        if response.status_code == 404:
            return None
        return Entry(**{k: v for k, v in response.json().items() if k in Entry.__dataclass_fields__})

    def has_object(self, digest: str) -> bool:
        return self._request("HEAD", f"/v1/objects/{check_hex(digest)}", ok=(200, 404)).status_code == 200

    def misses(self) -> list[dict[str, Any]]:
        return self._request("GET", "/v1/misses").json()

    def signed_manifests(self, sku: str) -> list[dict[str, Any]]:
        """The signed manifest envelopes the server holds for `sku` (unverified: see trust.py)."""
        response = self._request("GET", f"/v1/skus/{sku}/manifests", ok=(200, 404))
        return [] if response.status_code == 404 else response.json()["manifests"]

    def revocations(self) -> Any:
        from .signing import Revocations

        doc = self._request("GET", "/v1/revocations").json()
        return Revocations(set(doc["keys"]), set(doc["manifests"]))

    def push_manifest(self, sku: str, envelope: dict[str, Any]) -> None:
        self._request("PUT", f"/v1/skus/{sku}/manifests", ok=(200, 201), json=envelope)

    def revoke(self, kind: str, ident: str, reason: str) -> None:
        self._request("POST", "/v1/revocations", ok=(200, 201), json={"kind": kind, "id": ident, "reason": reason})

    def fetch_object(self, digest: str, store: Store, size: int | None = None) -> bool:
        """Make `store` hold object `digest`, downloading it unless present. Returns True if it downloaded.
        Concurrent callers on one store download once: the second finds the object after the lock."""
        if store.object_state(digest, size) == "ok":
            return False
        with store.lock(digest):
            if store.object_state(digest, size) == "ok":
                return False
            for attempt in range(self.retries + 1):
                try:
                    with self._client.stream("GET", f"/v1/objects/{digest}") as response:
                        _check(response, (200,), self.url)
                        store.put_stream(digest, response.iter_bytes(1 << 20), size=size,
                                         source=f"{self.url}/v1/objects/{digest}")
                    return True
                except (httpx.TimeoutException, httpx.TransportError) as e:
                    if attempt == self.retries:
                        raise RemoteError(f"download of {digest} from {self.url} failed: {e}") from e
                    time.sleep(min(8.0, 0.2 * 2**attempt))
        raise AssertionError("unreachable")

    def fetch_kernel(self, kernel_key: str, store: Store,
                     accept: Callable[[Entry], None] | None = None) -> Entry | None:
        """Fetch kernel `kernel_key` (object, then index entry) into `store`; None if the server lacks it.
        `accept(entry)` runs before a byte of the object is downloaded and refuses it by raising."""
        entry = self.kernel(kernel_key)
        if entry is None:
            return None
        if accept is not None:
            accept(entry)
        self.fetch_object(entry.object_digest, store, entry.size)
        store.put_entry(entry)
        return entry

    def fetch_bundle(self, kernel_keys: list[str], store: Store,
                     accept: Callable[[Entry], None] | None = None) -> tuple[list[Entry], dict[str, str]]:
        """Fetch many kernels in one request (POST /v1/bundles): every object is hashed while it streams and
        stored only if it matches (IntegrityError otherwise), then its entries. `accept(entry)` refuses a kernel
        by raising an Fa4AotError before its object is stored (its bytes are read past). Returns (entries
        stored, {kernel key: why not} for those the server lacks or `accept` refused); raises RemoteError when
        the server has no bundle route (older servers: fetch_kernel per key)."""
        for attempt in range(self.retries + 1):
            try:
                with self._client.stream("POST", "/v1/bundles", json={"kernel_keys": kernel_keys}) as response:
                    _check(response, (200,), self.url)
                    return _unbundle(BundleReader(response.iter_bytes(1 << 20)), store, accept, self.url)
            except (httpx.TimeoutException, httpx.TransportError) as e:
                if attempt == self.retries:
                    raise RemoteError(f"bundle of {len(kernel_keys)} kernels from {self.url} failed: {e}") from e
                time.sleep(min(8.0, 0.2 * 2**attempt))
        raise AssertionError("unreachable")

    # -- writes -------------------------------------------------------------------------------
    def push_entry(self, entry: Entry, store: Store) -> bool:
        """Publish one local kernel: upload its object unless the server has it (HEAD first), then its entry.
        Returns True if the object was uploaded."""
        return self.publish(entry, lambda: store.read_object(entry.object_digest))

    def publish(self, entry: Entry, data: Callable[[], bytes]) -> bool:
        """Upload the object `data()` returns unless the server has it (HEAD first), then the entry that makes it
        visible. Returns True if the object was uploaded. The server re-hashes the upload (422 on a mismatch)."""
        uploaded = False
        if not self.has_object(entry.object_digest):
            self._request("PUT", f"/v1/objects/{entry.object_digest}", ok=(200, 201), content=data(),
                          headers={"Content-Type": "application/octet-stream"})
            uploaded = True
        self._request("POST", "/v1/kernels", ok=(200, 201), json=asdict(entry))
        return uploaded

    def report_miss(self, doc: dict[str, Any]) -> None:
        """Tell the server about a kernel this client lacked. Best effort: runs on a daemon thread, gives up
        after MISS_REPORT_TIMEOUT seconds, and never raises."""

        def send() -> None:
            try:
                httpx.post(f"{self.url}/v1/misses", json=doc, headers=self._client.headers,
                           timeout=MISS_REPORT_TIMEOUT)
            except httpx.HTTPError:
                pass

        threading.Thread(target=send, name="fa4-aot-miss-report", daemon=True).start()


def _check(response: httpx.Response, ok: tuple[int, ...], url: str) -> httpx.Response:
    if response.status_code in ok:
        return response
    if response.status_code == 401:
        raise RemoteError(f"{url} wants a token: set FA4_AOT_TOKEN (create one with `fa4-aot token create`)")
    if response.status_code == 403:
        raise RemoteError(f"{url} refused the token for {response.request.method} {response.request.url.path}: "
                          "it is revoked or lacks the scope (publishing needs --scope publish)")
    response.read()
    detail = response.text[:300]
    raise RemoteError(f"{response.request.method} {response.request.url} -> {response.status_code}: {detail}")


class BundleReader:
    """Reads a bundle body: its first line, then exact byte counts, from a stream of chunks."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buffer = b""

    def line(self, limit: int = 64 << 20) -> bytes:
        while b"\n" not in self._buffer:
            if len(self._buffer) > limit:
                raise RemoteError(f"bundle header longer than {limit} bytes")
            self._buffer += self._next()
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def take(self, size: int) -> Iterator[bytes]:
        """The next `size` bytes, in chunks; raises RemoteError if the body ends first."""
        while size:
            if not self._buffer:
                self._buffer = self._next()
            chunk, self._buffer = self._buffer[:size], self._buffer[size:]
            size -= len(chunk)
            yield chunk

    def _next(self) -> bytes:
        for chunk in self._chunks:
            if chunk:
                return chunk
        raise RemoteError("bundle body ended early")


def _unbundle(reader: BundleReader, store: Store, accept: Callable[[Entry], None] | None,
              url: str) -> tuple[list[Entry], dict[str, str]]:
    head = json.loads(reader.line())
    entries = [Entry(**{k: v for k, v in e.items() if k in Entry.__dataclass_fields__}) for e in head["entries"]]
    skipped = {k: f"{url} has no kernel {k}" for k in head["missing"]}
    for entry in entries:
        try:
            if accept is not None:
                accept(entry)
        except Fa4AotError as e:  # refused by the trust policy: its object is read past, never stored
            skipped[entry.kernel_key] = str(e)
    stored = [e for e in entries if e.kernel_key not in skipped]
    wanted = {e.object_digest for e in stored}
    for digest, size in head["objects"]:
        chunks = reader.take(int(size))
        if digest not in wanted or store.object_state(check_hex(digest), size) == "ok":
            for _ in chunks:
                pass
            continue
        with store.lock(digest):
            store.put_stream(digest, chunks, size=size, source=f"{url}/v1/bundles")
    for entry in stored:
        store.put_entry(entry)
    return stored, skipped
