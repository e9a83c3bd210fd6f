"""The HTTP side of the client: talk to an fa4-aot server (service/), fetch kernels into the local store,
publish local kernels to it.

Reads are retried with exponential backoff on timeouts, connection errors and 5xx (a busy server's 503 until
the deadline, waiting at least its Retry-After). A download streams
into a temp file beside its target, hashed while it streams, and is renamed only when the digest and size
match; a per-object file lock plus a re-check after taking it make the ranks of one node download each
object once. Configuration is read at call time: FA4_AOT_SERVER, FA4_AOT_TOKEN, FA4_AOT_OFFLINE.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import os
import random
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import httpx

from .. import config
from ..errors import Fa4AotError, RemoteAuthError, RemoteError, StoreError, Unreachable
from ..spec import kernel_keys
from ..store import Entry, Store, check_hex
from ..store.recipes import MAX_BYTES as MAX_RECIPE
from .answers import bundle_head, entry_of, listing_of, miss_of

_T = TypeVar("_T")
RETRIES = 4
TIMEOUT = httpx.Timeout(30.0, connect=5.0)
MIN_ATTEMPT = 0.1  # seconds: with less left before the deadline, another attempt is not started
MISS_REPORT_TIMEOUT = 2.0  # seconds: the most a miss report may cost, and it runs off the caller's thread
# The most a client reads of an answer that is not an object (objects stop at their listed size): a JSON answer
# (a SKU's manifest lists every kernel, a miss page 1,000 call records), the revocation list (about 50,000 ids;
# trusted clients read it at every start), and every page of the miss list together (the server keeps at most
# 10,000 misses a SKU). Recipe files: MAX_RECIPE, the most the server accepts.
MAX_JSON = 64 << 20
MAX_REVOCATIONS = 4 << 20
MAX_MISSES = 256 << 20


def server_from_env() -> Remote | None:
    """The configured server, or None when FA4_AOT_SERVER is unset or FA4_AOT_OFFLINE=1."""
    url = config.server_url()
    return Remote(url, token=os.environ.get("FA4_AOT_TOKEN")) if url else None


ENV_ADVICE = "check FA4_AOT_SERVER or set FA4_AOT_OFFLINE=1 to use the local store only"


class Remote:
    """One server, for one process start: every request and download has a total deadline (retries included,
    FA4_AOT_FETCH_DEADLINE, read at call time unless `deadline` is given), and after one fails for want of
    the server (unreachable, too slow, 5xx) the server is treated as down: later calls fail at once.
    `advice` ends a "cannot reach" message: the default names the environment variables a client reads; a
    command given --server passes its own (the variables did not choose the server)."""

    def __init__(self, url: str, token: str | None = None, retries: int = RETRIES,
                 deadline: float | None = None, advice: str = ENV_ADVICE) -> None:
        if not re.match(r"https?://[^/\s]", url):
            raise RemoteError(f"server URL {url!r} needs a scheme and a host, e.g. http://{url.split('://')[-1]}")
        self.url = url.rstrip("/")
        self.retries = retries
        self.deadline = deadline
        self.advice = advice
        self.down = ""  # why the server was given up on, once it was
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.Client(base_url=self.url, headers=headers, timeout=TIMEOUT)

    def close(self) -> None:
        self._client.close()

    # -- transport ----------------------------------------------------------------------------
    def _end(self) -> float:
        return time.monotonic() + (self.deadline if self.deadline is not None else config.fetch_deadline())

    def _check_up(self) -> None:
        if self.down:
            raise Unreachable(f"{self.url} is treated as down for the rest of this process ({self.down}); "
                              f"restart once it answers; {self.advice}")

    def _give_up(self, why: str, cause: BaseException | None = None) -> Unreachable:
        self.down = why
        error = Unreachable(f"{why}; raise FA4_AOT_FETCH_DEADLINE for a slow link; {self.advice}")
        error.__cause__ = cause
        return error

    def _request(self, method: str, path: str, ok: tuple[int, ...] = (200,), cap: int = MAX_JSON,
                 **kwargs: Any) -> httpx.Response:
        """One request with retries on transient failures, within the deadline, its body read whole (_read: at
        most `cap` bytes); raises RemoteError for anything not in `ok`, and marks the server down when it cannot
        be reached in time or keeps failing."""
        self._check_up()
        end = self._end()
        for attempt in itertools.count():
            response = None
            try:
                with self._client.stream(method, path, timeout=_timeout(end), **kwargs) as response:
                    self._read(response, end, cap)
            except (httpx.TimeoutException, httpx.TransportError) as e:
                if _last(attempt, self.retries, end):
                    raise self._give_up(f"cannot reach {self.url} ({type(e).__name__}: {e})", e) from e
            else:
                if response.status_code < 500:
                    return _check(response, ok, self.url)
                if _last(attempt, self.retries, end, response):
                    self.down = f"{method} {path} -> {response.status_code}"
                    return _check(response, ok, self.url)
            _backoff(attempt, end, response)
        raise AssertionError("unreachable")

    def _json(self, method: str, path: str, ok: tuple[int, ...] = (200,), cap: int = MAX_JSON) -> Any:
        """The JSON body of a request; RemoteError (never a decode error) when the answer is not JSON, e.g. a
        proxy's or a wrong URL's HTML page."""
        return _decoded(self._request(method, path, ok=ok, cap=cap), self.url)

    def _body(self, response: httpx.Response, end: float, cap: int | None) -> Iterator[bytes]:
        """The body of `response` piece by piece as it arrives: RemoteError once it passes `cap` bytes (None: no
        cap, for objects, which stop at their listed size as they are stored), and the server is given up on
        once the deadline `end` passes, however slowly it drips. A wait for the next piece is bounded by the read
        timeout, itself no longer than what was left of the deadline when the request began."""
        what, got = f"{response.request.method} {response.request.url}", 0
        for piece in response.iter_bytes():
            got += len(piece)
            if cap is not None and got > cap:
                raise RemoteError(f"{what} answered more than {cap >> 20} MiB, the most a client reads of it; "
                                  f"nothing of it was used: is {self.url} an fa4-aot server (or a proxy in front)?")
            if _remaining(end) <= 0:
                raise self._give_up(f"{what} ran past its deadline ({got} bytes read)")
            yield piece

    def _read(self, response: httpx.Response, end: float, cap: int = MAX_JSON) -> httpx.Response:
        """`response` with its body read through _body, where httpx's own read() has no cap and no deadline."""
        response._content = b"".join(self._body(response, end, cap))  # what read() sets: .content, .json() work
        return response

    def _read_error(self, response: httpx.Response, end: float) -> None:
        """Read a streamed answer that is not a 200 here, capped and within the deadline `end`, so that its error
        can name the server's reason (httpx's read() would take any size at any pace)."""
        if response.status_code != 200:
            self._read(response, end)

    # -- reads --------------------------------------------------------------------------------
    def whoami(self) -> dict[str, Any] | None:
        """What the server says this client's token is ({name, scope, skus}); None when the server predates
        GET /v1/token. Raises RemoteAuthError for a missing, unknown or revoked token."""
        response = self._request("GET", "/v1/token", ok=(200, 404))
        return None if response.status_code == 404 else _shaped(_decoded(response, self.url), dict, self.url)

    def skus(self) -> list[dict[str, Any]]:
        return _shaped(self._json("GET", "/v1/skus"), list, self.url)

    def manifest(self, sku: str) -> dict[str, Any]:
        """The server's listing of `sku`: its facts and `kernels`, each with its kernel key and size."""
        return listing_of(self._json("GET", f"/v1/skus/{sku}/manifest"), f"{self.url}/v1/skus/{sku}/manifest")

    def kernel_keys(self, sku: str) -> set[str]:
        """Every kernel key the server holds for `sku` (none when it does not know the SKU yet)."""
        response = self._request("GET", f"/v1/skus/{sku}/manifest", ok=(200, 404))
        if response.status_code == 404:
            return set()
        listing = listing_of(_decoded(response, self.url), f"{self.url}/v1/skus/{sku}/manifest")
        return {k["kernel_key"] for k in listing["kernels"]}

    def kernel(self, kernel_key: str) -> Entry | None:
        """The server's entry for `kernel_key`, or None when it has none."""
        path = f"/v1/kernels/{check_hex(kernel_key, 'kernel key')}"
        response = self._request("GET", path, ok=(200, 404))
        if response.status_code == 404:
            return None
        entry = entry_of(_decoded(response, self.url), f"{self.url}{path}")
        problem = kernel_keys.key_problem(entry, kernel_key)
        if problem:  # no field of it is used: it would name what this process loads
            raise RemoteError(f"{self.url}{path} answered an entry that cannot be used: {problem}")
        return entry

    def has_object(self, digest: str) -> bool:
        return self._request("HEAD", f"/v1/objects/{check_hex(digest)}", ok=(200, 404)).status_code == 200

    def misses(self, page: int = 1000) -> list[dict[str, Any]]:
        """Every miss the server recorded, read a page at a time, at most MAX_MISSES bytes in all; RemoteError
        for more (a server whose pages never end) or for an item that is not a miss."""
        found: list[dict[str, Any]] = []
        read = 0
        while True:
            response = self._request("GET", f"/v1/misses?offset={len(found)}&limit={page}")
            read += len(response.content)
            if read > MAX_MISSES:
                raise RemoteError(f"{self.url}/v1/misses sent more than {MAX_MISSES >> 20} MiB of misses and its "
                                  f"pages still come full ({len(found)} misses so far): is it an fa4-aot server? "
                                  "An admin can delete stale misses (DELETE /v1/misses/<key>)")
            batch = _shaped(_decoded(response, self.url), list, self.url)
            found += [miss_of(item, f"{self.url}/v1/misses") for item in batch]
            if len(batch) < page:
                return found

    def signed_manifests(self, sku: str) -> list[dict[str, Any]]:
        """The signed manifest envelopes the server holds for `sku` (unverified: see trust/policy.py)."""
        response = self._request("GET", f"/v1/skus/{sku}/manifests", ok=(200, 404))
        if response.status_code == 404:
            return []
        doc = _decoded(response, self.url)
        return _shaped(doc.get("manifests") if isinstance(doc, dict) else None, list, self.url)

    def revocations(self) -> Any:
        from ..trust.signing import Revocations

        doc = _shaped(self._json("GET", "/v1/revocations", cap=MAX_REVOCATIONS), dict, self.url)
        try:
            return Revocations(set(doc["keys"]), set(doc["manifests"]))
        except (KeyError, TypeError):
            raise RemoteError(f"{self.url}/v1/revocations is not a revocation list") from None

    def token_scope(self) -> str:
        """The token's scope as the server sees it: "admin", "publish", "read", "none" (no token sent) or
        "refused: <server's reason>". Asks GET /v1/audit?limit=1 (admin only): a 403 names the token's scope."""
        try:
            self._request("GET", "/v1/audit", params={"limit": 1})
            return "admin"
        except RemoteAuthError as e:
            if "(401:" in str(e):
                return "none"
            found = re.search(r"has scope '(\w+)'", str(e))
            return found.group(1) if found else f"refused: {str(e).split('(403: ', 1)[-1].split(')')[0]}"

    def push_manifest(self, sku: str, envelope: dict[str, Any]) -> None:
        self._request("PUT", f"/v1/skus/{sku}/manifests", ok=(200, 201), json=envelope)

    def revoke(self, kind: str, ident: str, reason: str) -> None:
        self._request("POST", "/v1/revocations", ok=(200, 201), json={"kind": kind, "id": ident, "reason": reason})

    def fetch_object(self, digest: str, store: Store, size: int | None = None) -> bool:
        """Make `store` hold object `digest`, downloading it unless present. Returns True if it downloaded.
        Concurrent callers on one store download once: the second finds the object after the lock. Waiting
        for the lock and downloading share the deadline; a download that misses it marks the server down."""
        if store.object_state(digest, size) == "ok":
            return False
        self._check_up()
        end = self._end()
        with store.lock(digest, timeout=max(0.0, _remaining(end))):
            if store.object_state(digest, size) == "ok":
                return False
            self._check_up()
            for attempt in itertools.count():
                try:
                    self._download(digest, store, size, end)
                    return True
                except (httpx.TimeoutException, httpx.TransportError, _ServerError) as e:
                    answer = e.response if isinstance(e, _ServerError) else None
                    if _last(attempt, self.retries, end, answer):
                        raise self._give_up(f"download of {digest} from {self.url} failed: {e}", e) from e
                _backoff(attempt, end, answer)
        raise AssertionError("unreachable")

    def _download(self, digest: str, store: Store, size: int | None, end: float) -> None:
        with self._client.stream("GET", f"/v1/objects/{digest}", timeout=_timeout(end)) as response:
            self._read_error(response, end)
            _server_error(response)
            _check(response, (200,), self.url)
            store.put_stream(digest, self._body(response, end, None), size=size,
                             source=f"{self.url}/v1/objects/{digest}")

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
        end = self._end()
        what = f"bundle of {len(kernel_keys)} kernels"
        body: dict[str, Any] = {"kernel_keys": kernel_keys, **({"host_arch": host_arch} if host_arch else {})}
        for attempt in itertools.count():
            try:
                with self._client.stream("POST", "/v1/bundles", json=body,
                                         timeout=_timeout(end)) as response:
                    self._read_error(response, end)
                    _server_error(response)
                    _check(response, (200,), self.url)
                    chunks = self._body(response, end, None)
                    return _unbundle(BundleReader(chunks), store, accept, self.url, set(kernel_keys), host_arch)
            except (httpx.TimeoutException, httpx.TransportError, _ServerError) as e:
                answer = e.response if isinstance(e, _ServerError) else None
                if _last(attempt, self.retries, end, answer):
                    raise self._give_up(f"{what} from {self.url} failed: {e}", e) from e
            _backoff(attempt, end, answer)
        raise AssertionError("unreachable")

    # -- writes -------------------------------------------------------------------------------
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

    # -- lean-runtime recipe files --------------------------------------------------------------
    def recipes(self, sku: str) -> dict[str, str]:
        """{recipe key: sha256 of the file} the server holds for `sku` (none for a SKU it does not know)."""
        response = self._request("GET", f"/v1/skus/{sku}/recipes", ok=(200, 404, 409))
        if response.status_code != 200:
            return {}
        doc = _shaped(_decoded(response, self.url), dict, self.url)
        try:
            return {check_hex(r["key"], "recipe key"): check_hex(r["digest"]) for r in doc["recipes"]}
        except (KeyError, TypeError, StoreError):
            raise RemoteError(f"{self.url}/v1/skus/{sku}/recipes is not a recipe listing") from None

    def recipe(self, sku: str, key: str) -> bytes | None:
        """The bytes of recipe file `key` of `sku`, or None when the server has none (unverified: the caller
        checks them against a listing or a signed manifest)."""
        path = f"/v1/skus/{sku}/recipes/{check_hex(key, 'recipe key')}"
        response = self._request("GET", path, ok=(200, 404, 409), cap=MAX_RECIPE)
        return response.content if response.status_code == 200 else None

    def push_recipe(self, sku: str, key: str, data: bytes) -> None:
        self._request("PUT", f"/v1/skus/{sku}/recipes/{check_hex(key, 'recipe key')}", ok=(200, 201),
                      content=data, headers={"Content-Type": "application/json"})

    def report_miss(self, doc: dict[str, Any]) -> None:
        """Tell the server about a kernel this client lacked. Best effort: runs on a daemon thread, gives up
        after MISS_REPORT_TIMEOUT seconds, and never raises."""

        if self.down:
            return

        def send() -> None:
            try:
                httpx.post(f"{self.url}/v1/misses", json=doc, headers=self._client.headers,
                           timeout=MISS_REPORT_TIMEOUT)
            except httpx.HTTPError:
                pass

        threading.Thread(target=send, name="fa4-aot-miss-report", daemon=True).start()


    # -- on-demand builds (service/routes/builds.py; fa4_aot/build/builder.py runs them, wait.py waits) -----
    def request_build(self, doc: dict[str, Any]) -> dict[str, Any]:
        """Report miss `doc` (a Miss document) and wait for the answer: {"build": the job that builds it, or
        None, "detail": why none was queued}. RemoteError for a refused report (unknown SKU, oversized call)."""
        answer = _decoded(self._request("POST", "/v1/misses", ok=(200, 202), json=doc), self.url)
        return _shaped(answer, dict, self.url)

    def build(self, job_id: int) -> dict[str, Any]:
        """Build job `job_id` (GET /v1/builds/{id})."""
        return _shaped(self._json("GET", f"/v1/builds/{int(job_id)}"), dict, self.url)

    def builds(self, status: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """Build jobs newest first (of one status when given)."""
        query = f"?limit={int(limit)}" + (f"&status={status}" if status else "")
        return _shaped(self._json("GET", f"/v1/builds{query}"), list, self.url)

    def claim_build(self, builder: str, lease: float) -> dict[str, Any] | None:
        """The next job for `builder` (leased for `lease` seconds), or None when none waits. Publish token."""
        response = self._request("POST", "/v1/build-claims", ok=(200, 204),
                                 json={"builder": builder, "lease_seconds": lease})
        return None if response.status_code == 204 else _shaped(_decoded(response, self.url), dict, self.url)

    def renew_build(self, job_id: int, builder: str, lease: float) -> bool:
        """Extend `builder`'s lease of job `job_id`; False when the job is no longer its own (409)."""
        response = self._request("POST", f"/v1/builds/{int(job_id)}/lease", ok=(200, 409),
                                 json={"builder": builder, "lease_seconds": lease})
        return response.status_code == 200

    def finish_build(self, job_id: int, result: dict[str, Any]) -> None:
        """Record how `result["builder"]`'s job ended (status, detail, compile_seconds, built)."""
        self._request("POST", f"/v1/builds/{int(job_id)}/finish", json=result)


def with_libraries(entry: Entry, arches: list[str]) -> Entry:
    """`entry` naming only its libraries for `arches` (what a client downloads with it)."""
    return dataclasses.replace(entry, shared_libs={a: lib for a, lib in entry.shared_libs.items() if a in arches})


def needed_scope(method: str, path: str) -> str:
    """The token scope the service wants for a request (service/deps.py): admin for revocations and the
    audit log, publish for other writes, read otherwise."""
    if path.startswith("/v1/audit") or (method == "POST" and path.startswith("/v1/revocations")):
        return "admin"
    return "read" if method in ("GET", "HEAD") else "publish"


def _detail(response: httpx.Response) -> str:
    """The server's own reason (its JSON `detail`), else the start of the body."""
    response.read()
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    return str(detail) if detail else response.text[:300]


def _remaining(end: float) -> float:
    return end - time.monotonic()


def _timeout(end: float) -> httpx.Timeout:
    """Per-request timeouts that cannot outlast the deadline `end`."""
    left = max(0.01, _remaining(end))
    return httpx.Timeout(min(TIMEOUT.read or 30.0, left), connect=min(TIMEOUT.connect or 5.0, left))


class _ServerError(Exception):
    """A 5xx answer to a streamed request: retried as a connection error is."""

    def __init__(self, response: httpx.Response) -> None:
        super().__init__(f"{response.status_code}: {_detail(response)}")
        self.response = response


def _server_error(response: httpx.Response) -> None:
    if response.status_code >= 500:
        raise _ServerError(response)


def _last(attempt: int, retries: int, end: float, answer: httpx.Response | None = None) -> bool:
    """Whether failed attempt `attempt` is the last: too little time is left, or the retries are used up. A busy
    server's 503 uses none: a cluster coming up backs off and finishes within the deadline rather than fail."""
    busy = answer is not None and answer.status_code == 503
    return _remaining(end) < MIN_ATTEMPT or (attempt >= retries and not busy)


def _backoff(attempt: int, end: float, answer: httpx.Response | None = None) -> None:
    """Sleep before retry `attempt` + 1 (exponential, jittered; at least the answer's Retry-After seconds, at
    most 8 s), never past the deadline `end`."""
    wait = min(8.0, 0.2 * 2 ** min(attempt, 6)) * (0.5 + random.random())
    after = answer.headers.get("retry-after", "") if answer is not None else ""
    if after.isdigit():
        wait = max(wait, min(8.0, float(after)))
    time.sleep(max(0.0, min(wait, _remaining(end))))


def _decoded(response: httpx.Response, url: str) -> Any:
    try:
        return response.json()
    except ValueError:
        raise RemoteError(f"{response.request.method} {response.request.url} answered {response.status_code} "
                          f"with {response.headers.get('content-type', 'no content type')}, not JSON: is {url} an "
                          "fa4-aot server (`fa4-aot serve`)?") from None


def _shaped(doc: Any, kind: type[_T], url: str) -> _T:
    if not isinstance(doc, kind):
        raise RemoteError(f"{url} answered with JSON of an unexpected shape ({type(doc).__name__}, expected "
                          f"{kind.__name__}): is it an fa4-aot server of this version?")
    return doc


def _check(response: httpx.Response, ok: tuple[int, ...], url: str) -> httpx.Response:
    if response.status_code in ok:
        return response
    method, path = response.request.method, response.request.url.path
    if response.status_code in (401, 403):
        scope = needed_scope(method, path)
        fix = ("pass --token or set FA4_AOT_TOKEN" if response.status_code == 401 else "use another token") + \
            (f"; make one with `fa4-aot token create --scope {scope}` where the server's database is (the same "
             "--cache-dir or --db as `fa4-aot serve`)")
        raise RemoteAuthError(f"{url} refused {method} {path} ({response.status_code}: {_detail(response)}); "
                              f"this needs a {scope} token: {fix}")
    raise RemoteError(f"{method} {response.request.url} -> {response.status_code}: {_detail(response)}")


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
              url: str, asked: set[str], host_arch: str | None = None) -> tuple[list[Entry], dict[str, str]]:
    entries, missing, objects = bundle_head(reader.line(), f"{url}/v1/bundles")
    skipped = {k: f"{url} has no kernel {k}" for k in missing if k in asked}
    for entry in entries:  # a server answers for the keys asked, never plants others, and each entry proves its key
        if entry.kernel_key not in asked:
            skipped[entry.kernel_key] = f"{url} sent kernel {entry.kernel_key}, which was not asked for"
        elif problem := kernel_keys.key_problem(entry, entry.kernel_key):
            skipped[entry.kernel_key] = f"{url} sent an entry for {entry.kernel_key} that cannot be used: {problem}"
    for entry in entries:
        try:
            if accept is not None:
                accept(entry)
        except Fa4AotError as e:  # refused by the trust policy: its object is read past, never stored
            skipped[entry.kernel_key] = str(e)
    stored = [with_libraries(e, [host_arch] if host_arch else []) for e in entries if e.kernel_key not in skipped]
    wanted = {e.object_digest for e in stored} | {d for e in stored for d in e.lib_digests(host_arch or "")}
    for digest, size in objects:
        chunks = reader.take(size)
        if digest not in wanted or store.object_state(digest, size) == "ok":
            for _ in chunks:
                pass
            continue
        with store.lock(digest):
            store.put_stream(digest, chunks, size=size, source=f"{url}/v1/bundles")
    for entry in stored:
        store.put_entry(entry)
    return stored, skipped
