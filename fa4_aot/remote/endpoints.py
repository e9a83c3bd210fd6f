"""The server's routes as typed calls: one request each (transport.py: deadline, retries, the server treated as
down), its JSON answer checked for shape (answers.py) before a field of it is used. Moving objects (downloads
verified while they stream, bundles, uploads) is http.py's."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx

from ..domain import kernel_keys
from ..domain.misses import BuildJob, Miss
from ..domain.verdicts import Verdict
from ..errors import RemoteAuthError, RemoteError, StoreError
from ..store import Entry, check_hex
from ..store.recipes import MAX_BYTES as MAX_RECIPE
from . import deadline
from .answers import build_job_of, entry_of, listing_of, miss_of, verdict_of
from .certify_jobs import CertifyJob, job_of, jobs_of
from .transport import AnswerTooLarge, Transport, decoded, detail, shaped

MISS_REPORT_TIMEOUT = 2.0  # seconds: the most a miss report may cost, and it runs off the caller's thread
# Answers larger than transport.MAX_JSON: the revocation list (about 50,000 ids; trusted clients read it at every
# start), and every page of the miss list together (the server keeps at most 10,000 misses a SKU). Recipe files:
# MAX_RECIPE, the most the server accepts.
MAX_REVOCATIONS = 4 << 20
MAX_MISSES = 32 << 20  # JSON bytes of every page together; held parsed, a few times that (256 MiB: 810 MB held)
MAX_VERDICTS = 256 << 20  # every page of a verdict listing together (a verdict is under 2 KiB: 100,000s of them)
# A verdict publish: at most the server's 1000 verdicts a request, and about half its 1 MiB cap on a JSON body
VERDICT_BATCH, VERDICT_BATCH_BYTES = 1000, 512 << 10


class Endpoints(Transport):
    """The typed calls of one server (see Transport for deadlines and retries)."""

    # -- reads --------------------------------------------------------------------------------
    def whoami(self) -> dict[str, Any] | None:
        """What the server says this client's token is ({name, scope, skus}); None when the server predates
        GET /v1/token. Raises RemoteAuthError for a missing, unknown or revoked token."""
        response = self._request("GET", "/v1/token", ok=(200, 404))
        return None if response.status_code == 404 else shaped(decoded(response, self.url), dict, self.url)

    def skus(self) -> list[dict[str, Any]]:
        return shaped(self._json("GET", "/v1/skus"), list, self.url)

    def manifest(self, sku: str) -> dict[str, Any]:
        """The server's listing of `sku`: its facts and `kernels`, each with its kernel key and size."""
        return listing_of(self._json("GET", f"/v1/skus/{sku}/manifest"), f"{self.url}/v1/skus/{sku}/manifest")

    def kernel_keys(self, sku: str) -> set[str]:
        """Every kernel key the server holds for `sku` (none when it does not know the SKU yet)."""
        response = self._request("GET", f"/v1/skus/{sku}/manifest", ok=(200, 404))
        if response.status_code == 404:
            return set()
        listing = listing_of(decoded(response, self.url), f"{self.url}/v1/skus/{sku}/manifest")
        return {k["kernel_key"] for k in listing["kernels"]}

    def kernel(self, kernel_key: str) -> Entry | None:
        """The server's entry for `kernel_key`, or None when it has none."""
        path = f"/v1/kernels/{check_hex(kernel_key, 'kernel key')}"
        response = self._request("GET", path, ok=(200, 404))
        if response.status_code == 404:
            return None
        entry = entry_of(decoded(response, self.url), f"{self.url}{path}")
        problem = kernel_keys.key_problem(entry, kernel_key)
        if problem:  # no field of it is used: it would name what this process loads
            raise RemoteError(f"{self.url}{path} answered an entry that cannot be used: {problem}")
        return entry

    def has_object(self, digest: str) -> bool:
        return self._request("HEAD", f"/v1/objects/{check_hex(digest)}", ok=(200, 404)).status_code == 200

    def misses(self, page: int = 1000) -> list[Miss]:
        """Every miss the server recorded, read a page at a time, at most MAX_MISSES bytes in all; RemoteError
        for more (a server whose pages never end) or for an item that is not a miss."""
        found: list[Miss] = []
        read = 0
        while True:
            try:  # a page is read with what is left of the bound, never a whole MAX_JSON more
                response = self._request("GET", f"/v1/misses?offset={len(found)}&limit={page}",
                                         cap=MAX_MISSES - read)
            except AnswerTooLarge:
                read = MAX_MISSES + 1
            else:
                read += len(response.content)
            if read > MAX_MISSES:
                raise RemoteError(f"{self.url}/v1/misses sent more than {MAX_MISSES >> 20} MiB of misses and its "
                                  f"pages still come full ({len(found)} misses so far): is it an fa4-aot server? "
                                  "An admin can delete stale misses (DELETE /v1/misses/<key>)")
            batch = shaped(decoded(response, self.url), list, self.url)
            found += [miss_of(item, f"{self.url}/v1/misses") for item in batch]
            if len(batch) < page:
                return found

    def signed_manifests(self, sku: str) -> list[dict[str, Any]]:
        """The signed manifest envelopes the server holds for `sku` (unverified: see trust/policy.py)."""
        response = self._request("GET", f"/v1/skus/{sku}/manifests", ok=(200, 404))
        if response.status_code == 404:
            return []
        doc = decoded(response, self.url)
        return shaped(doc.get("manifests") if isinstance(doc, dict) else None, list, self.url)

    def revocations(self) -> Any:
        from ..trust.signing import Revocations

        doc = shaped(self._json("GET", "/v1/revocations", cap=MAX_REVOCATIONS), dict, self.url)
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

    # -- writes -------------------------------------------------------------------------------
    def push_manifest(self, sku: str, envelope: dict[str, Any]) -> None:
        self._request("PUT", f"/v1/skus/{sku}/manifests", ok=(200, 201), json=envelope)

    def revoke(self, kind: str, ident: str, reason: str) -> None:
        self._request("POST", "/v1/revocations", ok=(200, 201), json={"kind": kind, "id": ident, "reason": reason})

    def report_miss(self, miss: Miss) -> None:
        """Tell the server about `miss`, a kernel (or lean call) this client lacked. Best effort: runs on a daemon
        thread, gives up after MISS_REPORT_TIMEOUT seconds in all (however slowly the server drips its answer), and
        never raises."""

        if self.down:
            return

        doc = miss.to_dict()

        def send() -> None:
            end = time.monotonic() + MISS_REPORT_TIMEOUT
            try:
                with httpx.Client(headers=self._client.headers, timeout=MISS_REPORT_TIMEOUT,
                                  transport=deadline.transport()) as client, deadline.until(end):
                    client.post(f"{self.url}/v1/misses", json=doc)
            except httpx.HTTPError:
                pass

        threading.Thread(target=send, name="fa4-aot-miss-report", daemon=True).start()

    # -- lean-runtime recipe files --------------------------------------------------------------
    def recipes(self, sku: str) -> dict[str, str]:
        """{recipe key: sha256 of the file} the server holds for `sku` (none for a SKU it does not know)."""
        response = self._request("GET", f"/v1/skus/{sku}/recipes", ok=(200, 404, 409))
        if response.status_code != 200:
            return {}
        doc = shaped(decoded(response, self.url), dict, self.url)
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

    # -- certification verdicts (service/routes/verdicts.py) ---------------------------------------------
    def verdicts(self, sku: str | None = None, kernel_key: str | None = None, device: str | None = None,
                 status: str | None = None, page: int = 1000) -> list[Verdict]:
        """Every verdict the server holds (of one SKU's kernels, one kernel, device class or status when given),
        read a page at a time, at most MAX_VERDICTS bytes in all; [] from a server that predates verdicts (404).
        RemoteError for an item that is not a valid verdict, or for pages that never end."""
        given = (("sku", sku), ("kernel_key", kernel_key), ("device", device), ("status", status))
        filters: dict[str, Any] = {name: value for name, value in given if value is not None}
        found: list[Verdict] = []
        read = 0
        while True:
            response = self._request("GET", "/v1/verdicts", ok=(200, 404),
                                     params={**filters, "offset": len(found), "limit": page})
            if response.status_code == 404:
                return found
            read += len(response.content)
            if read > MAX_VERDICTS:
                raise RemoteError(f"{self.url}/v1/verdicts sent more than {MAX_VERDICTS >> 20} MiB of verdicts and "
                                  f"its pages still come full ({len(found)} so far): is it an fa4-aot server?")
            batch = shaped(decoded(response, self.url), list, self.url)
            found += [verdict_of(item, f"{self.url}/v1/verdicts") for item in batch]
            if len(batch) < page:
                return found

    def push_verdicts(self, verdicts: list[Verdict]) -> int:
        """Publish `verdicts` (of kernels the server holds), one request per batch (VERDICT_BATCH verdicts, about
        VERDICT_BATCH_BYTES); returns how many it stored (the others it held already, or newer ones). RemoteError
        when it refuses them: a kernel it lacks (409), a token of another SKU (RemoteAuthError)."""
        stored = 0
        for batch in _batches([v.to_dict() for v in verdicts]):
            response = self._request("POST", "/v1/verdicts", ok=(200, 201, 404), json=batch)
            if response.status_code == 404:
                raise RemoteError(f"{self.url} predates certification verdicts (POST /v1/verdicts is 404): upgrade "
                                  "its fa4-aot and push again to publish them")
            answer = shaped(decoded(response, self.url), dict, self.url)
            count = answer.get("stored")
            if isinstance(count, bool) or not isinstance(count, int):
                raise RemoteError(f"{self.url}/v1/verdicts answered {json.dumps(answer)[:120]}, not a count of "
                                  "verdicts stored: is it an fa4-aot server of this version?")
            stored += count
        return stored

    # -- on-demand builds (service/routes/builds.py; fa4_aot/compile/builder.py runs them, wait.py waits) -----
    def request_build(self, miss: Miss) -> tuple[BuildJob | None, str]:
        """Report `miss` and wait for the answer: (the job that builds it, '') or (None, why none was queued).
        RemoteError for a refused report (unknown SKU, oversized call) or an answer that is not one."""
        source = f"{self.url}/v1/misses"
        answer = shaped(decoded(self._request("POST", "/v1/misses", ok=(200, 202), json=miss.to_dict()), self.url),
                        dict, self.url)
        job, why = answer.get("build"), answer.get("detail")
        return (None if job is None else build_job_of(job, source)), why if isinstance(why, str) else ""

    def build(self, job_id: int) -> BuildJob:
        """Build job `job_id` (GET /v1/builds/{id})."""
        return build_job_of(self._json("GET", f"/v1/builds/{int(job_id)}"), f"{self.url}/v1/builds/{int(job_id)}")

    def builds(self, status: str | None = None, limit: int = 100) -> list[BuildJob]:
        """Build jobs newest first (of one status when given)."""
        query = f"?limit={int(limit)}" + (f"&status={status}" if status else "")
        found = shaped(self._json("GET", f"/v1/builds{query}"), list, self.url)
        return [build_job_of(job, f"{self.url}/v1/builds") for job in found]

    def claim_build(self, builder: str, lease: float, skus: list[str] | None = None) -> BuildJob | None:
        """The next job of one of `skus` (those the builder can build) for `builder`, leased for `lease` seconds
        (its `claim` renews and finishes it), or None when none waits. Publish token allowed the job's SKU.
        RemoteError for an answer that is not a claimed build job (answers.build_job_of)."""
        body: dict[str, Any] = {"builder": builder, "lease_seconds": lease, **({"skus": skus} if skus else {})}
        response = self._request("POST", "/v1/build-claims", ok=(200, 204), json=body)
        if response.status_code == 204:
            return None
        return build_job_of(decoded(response, self.url), f"{self.url}/v1/build-claims", claimed=True)

    def renew_build(self, job: BuildJob, builder: str, lease: float) -> bool:
        """Extend the lease of claimed `job`; False when its claim is no longer the job's (409)."""
        body = {"builder": builder, "claim": job.claim, "lease_seconds": lease}
        return self._request("POST", f"/v1/builds/{job.id}/lease", ok=(200, 409), json=body).status_code == 200

    def finish_build(self, job: BuildJob, result: dict[str, Any]) -> tuple[int, str]:
        """Send how claimed `job` ended (`result`: builder, status, detail, compile_seconds, built): (200, '') when
        recorded, (409, why) when its claim is no longer the job's, (422, why) when the server refuses the result
        (done with nothing of it published: send it as failed). RemoteError when the server cannot take it."""
        response = self._request("POST", f"/v1/builds/{job.id}/finish", ok=(200, 409, 422),
                                 json={**result, "claim": job.claim})
        return response.status_code, "" if response.status_code == 200 else detail(response)

    # -- on-demand certification (service/routes/certify.py; certify/certifier.py runs jobs, wait.py waits) -----
    def claim_certify(self, certifier: str, sku: str, device: str, lease: float) -> CertifyJob | None:
        """The next certify job of `sku` for `certifier` on device class `device`, leased for `lease` seconds (its
        `claim` renews and finishes it), or None when none waits. Publish token allowed the SKU."""
        body = {"certifier": certifier, "sku": sku, "device": device, "lease_seconds": lease}
        response = self._request("POST", "/v1/certify-claims", ok=(200, 204), json=body)
        if response.status_code == 204:
            return None
        return job_of(decoded(response, self.url), f"{self.url}/v1/certify-claims")

    def renew_certify(self, job: CertifyJob, certifier: str, lease: float) -> bool:
        """Extend the lease of claimed `job`; False when its claim is no longer the job's (409)."""
        body = {"certifier": certifier, "claim": job.claim, "lease_seconds": lease}
        return self._request("POST", f"/v1/certify-jobs/{job.id}/lease", ok=(200, 409), json=body).status_code == 200

    def finish_certify(self, job: CertifyJob, result: dict[str, Any]) -> bool:
        """Record how claimed `job` ended (`result`: certifier, status, verdicts, detail, seconds); False when its
        claim is no longer the job's (409). RemoteError when the server refuses the result (422: names why)."""
        response = self._request("POST", f"/v1/certify-jobs/{job.id}/finish", ok=(200, 409),
                                 json={**result, "claim": job.claim})
        return response.status_code == 200

    def certify_job(self, job_id: int) -> CertifyJob:
        """Certify job `job_id` (GET /v1/certify-jobs/{id})."""
        path = f"/v1/certify-jobs/{int(job_id)}"
        return job_of(self._json("GET", path), f"{self.url}{path}")

    def certify_jobs(self, status: str | None = None, sku: str | None = None, kernel_key: str | None = None,
                     limit: int = 100) -> list[CertifyJob]:
        """Certify jobs newest first, of one status, SKU or kernel when given."""
        given = (("status", status), ("sku", sku), ("kernel_key", kernel_key))
        params: dict[str, Any] = {"limit": int(limit), **{name: v for name, v in given if v is not None}}
        answer = decoded(self._request("GET", "/v1/certify-jobs", params=params), self.url)
        return jobs_of(answer, f"{self.url}/v1/certify-jobs")


def _batches(docs: list[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    """`docs` in order, cut into publishes of at most VERDICT_BATCH documents and about VERDICT_BATCH_BYTES of JSON."""
    batch: list[dict[str, Any]] = []
    size = 0
    for doc in docs:
        length = len(json.dumps(doc))
        if batch and (len(batch) == VERDICT_BATCH or size + length > VERDICT_BATCH_BYTES):
            yield batch
            batch, size = [], 0
        batch.append(doc)
        size += length
    if batch:
        yield batch
