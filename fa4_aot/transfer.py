"""Moving kernels between a local store and a server: push, pull, and rebuilding what clients missed."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any

from . import signing
from .build import Report, build_calls
from .calls import Call
from .errors import DiskFull, Fa4AotError
from .remote import Remote
from .store import Store
from .variants import Matrix

Progress = Callable[[int, int, str], None]


@dataclass
class Transfer:
    kernels: int = 0  # kernels considered
    objects_sent: int = 0  # push: objects uploaded (the rest the server already had)
    fetched: int = 0  # pull: kernels downloaded (the rest were already local)
    manifests: int = 0  # signed manifests pushed or pulled
    stale_manifests: list[str] = field(default_factory=list)  # push: skipped, they list kernels since rebuilt
    bytes: int = 0
    failures: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def push(store: Store, remote: Remote, sku: str | None = None, jobs: int = 8, progress: Progress | None = None,
         ) -> Transfer:
    """Publish every local kernel (of `sku`) to `remote`, uploading only objects it lacks. Never raises for
    one kernel: failures are listed in the result."""
    entries = list(store.entries(sku))
    result = Transfer(kernels=len(entries))

    def one(entry: Any) -> tuple[Any, bool]:
        return entry, remote.push_entry(entry, store)

    def count(r: Transfer, out: tuple[Any, bool]) -> None:
        entry, uploaded = out
        if uploaded:
            r.objects_sent += 1
            r.bytes += entry.size

    _run(entries, one, jobs, result, progress, count)
    if not result.failures:  # manifests name kernels, so they go after every kernel is on the server
        _push_manifests(store, remote, entries, result)
    return result


def _push_manifests(store: Store, remote: Remote, entries: list[Any], result: Transfer) -> None:
    """Upload the store's signed manifests of the pushed SKUs. A manifest that lists a kernel the store no
    longer holds with that digest (a rebuild since signing) is stale: it is skipped and reported."""
    held = {e.kernel_key: e.object_digest for e in entries}
    for name in sorted({e.sku for e in entries}):
        for envelope in signing.local(store, name):
            kernels = envelope["manifest"]["kernels"]
            if any(held.get(k) != d for k, d in kernels.items()):
                result.stale_manifests.append(signing.manifest_id(envelope))
                continue
            try:
                remote.push_manifest(name, envelope)
                result.manifests += 1
            except Fa4AotError as e:
                result.failures.append(f"manifest {signing.manifest_id(envelope)}: {e}")


def pull(store: Store, remote: Remote, sku: str, jobs: int = 8, progress: Progress | None = None) -> Transfer:
    """Mirror every kernel the server holds for `sku` into `store` (an air-gapped copy), verified."""
    wanted = [k for k in remote.manifest(sku)["kernels"] if not store.has_entry(k["kernel_key"])]
    result = Transfer(kernels=len(wanted))

    def one(k: dict[str, Any]) -> dict[str, Any]:
        if remote.fetch_kernel(k["kernel_key"], store) is None:
            raise RuntimeError(f"{remote.url} listed kernel {k['kernel_key']} but no longer has it")
        return k

    def count(r: Transfer, k: dict[str, Any]) -> None:
        r.fetched += 1
        r.bytes += k["size"]

    _run(wanted, one, jobs, result, progress, count)
    for envelope in remote.signed_manifests(sku):  # kept unverified here: clients verify before loading
        signing.save(store, envelope)
        result.manifests += 1
    return result


def rebuild_misses(matrix: Matrix, store: Store, remote: Remote, jobs: int = 1,
                   progress: Callable[..., None] | None = None) -> list[Report]:
    """Build the calls clients reported missing (misses that carry a call), per SKU, and push the results."""
    by_sku: dict[str, list[tuple[str, Call]]] = {}
    for miss in remote.misses():
        if miss.get("call") and miss.get("sku") in matrix.skus:
            call = Call.from_dict(miss["call"])
            by_sku.setdefault(miss["sku"], []).append(("from-misses", call))
    reports = []
    for name, work in sorted(by_sku.items()):
        report = build_calls(matrix.sku(name), store, list(dict.fromkeys(work)), jobs=jobs, progress=progress)
        push(store, remote, name)
        reports.append(report)
    return reports


def _run(items: list[Any], fn: Callable[[Any], Any], jobs: int, result: Transfer, progress: Progress | None,
         count: Callable[[Transfer, Any], None]) -> None:
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        futures = {pool.submit(fn, item): item for item in items}
        for done, future in enumerate(as_completed(futures), 1):
            try:
                count(result, future.result())
                status = "ok"
            except DiskFull:  # every other kernel would fail the same way: stop with one error
                for other in futures:
                    other.cancel()
                raise
            except Exception as e:  # one kernel's failure must not stop the others
                status = f"FAILED {type(e).__name__}: {e}"
                result.failures.append(status)
            if progress:
                progress(done, len(items), status)
