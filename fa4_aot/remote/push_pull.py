"""Moving kernels between a local store and a server: push and pull, with their recipe files, certification verdicts
and signed manifests (rebuilding what clients missed is the build's: compile/rebuild.py)."""

from __future__ import annotations

from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any

from ..domain.skus import Sku
from ..domain.verdicts import Verdict, by_device, utc_now
from ..errors import DiskFull, Fa4AotError, RemoteAuthError, RemoteError, TrustError, Unreachable
from ..store import Store
from ..trust import signing
from ..trust.policy import Trust
from . import lean_files
from .http import Remote

# (kernels done, kernels in all, the item's status, bytes moved so far): a kernel, not its signpost, is one item
Progress = Callable[[int, int, str, int], None]


@dataclass
class Transfer:
    kernels: int = 0  # kernels considered
    objects_sent: int = 0  # push: objects uploaded (the rest the server already had)
    fetched: int = 0  # pull: kernels downloaded (the rest were already local)
    manifests: int = 0  # signed manifests pushed or pulled
    recipes: int = 0  # lean-runtime recipe files pushed or pulled (lean_files.py)
    verdicts: int = 0  # push: certification verdicts sent; pull: verdicts kept (newer than the store held)
    lean_refused: list[str] = field(default_factory=list)  # pull: libraries the trust policy refused
    stale_manifests: list[str] = field(default_factory=list)  # push: skipped, they list kernels since rebuilt
    bytes: int = 0
    failures: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def push(store: Store, remote: Remote, sku: str | None = None, jobs: int = 8, progress: Progress | None = None,
         keys: Collection[str] | None = None) -> Transfer:
    """Publish every local kernel (of `sku`; only those held under `keys` when given, as a builder publishes a
    job's kernels) to `remote`, uploading only objects it lacks. Never raises for one kernel: failures are
    listed in the result."""
    entries = [e for e in store.entries(sku) if keys is None or e.kernel_key in keys]
    result = Transfer(kernels=sum(not e.is_signpost for e in entries))  # a kernel, not its signpost too
    sent: set[str] = set()

    def one(entry: Any) -> dict[str, int]:
        return remote.push_entry(entry, store.read_object)

    def count(r: Transfer, uploaded: dict[str, int]) -> None:  # every object uploaded, libraries too, once
        for digest, size in uploaded.items():
            if digest not in sent:
                sent.add(digest)
                r.objects_sent += 1
                r.bytes += size

    _run(entries, one, jobs, result, progress, count, weight=lambda e: int(not e.is_signpost))
    if not result.failures:  # recipes are filed under a SKU the server knows, so they go after the kernels
        result.recipes = lean_files.push_all_recipes(store, remote, entries, result.failures)
    if not result.failures:  # manifests name kernels, so they go after every kernel is on the server
        _push_manifests(store, remote, entries, result)
    if not result.failures:  # verdicts name kernels too; last, so a server that predates them takes the rest
        _push_verdicts(store, remote, entries, result)
    return result


def _push_verdicts(store: Store, remote: Remote, entries: list[Any], result: Transfer) -> None:
    """Publish the store's verdicts of the pushed kernels: one request per batch (Endpoints.push_verdicts)."""
    keys = sorted({e.kernel_key for e in entries} & set(store.verdict_keys()))
    try:
        verdicts = [v for key in keys for v in store.verdicts(key)]
        if verdicts:
            remote.push_verdicts(verdicts)
        result.verdicts = len(verdicts)
    except Fa4AotError as e:
        result.failures.append(f"verdicts: {e}")


def _push_manifests(store: Store, remote: Remote, entries: list[Any], result: Transfer) -> None:
    """Upload the store's signed manifests of the pushed SKUs. A manifest that lists a kernel the store no
    longer holds with that digest (a rebuild since signing) is stale: it is skipped and reported."""
    held = {e.kernel_key: e.object_digest for e in entries}
    for name in sorted({e.sku for e in entries}):
        for envelope in signing.local(store, name):
            kernels = envelope["manifest"]["kernels"]
            if any(held.get(k) != d for k, d in kernels.items()) or \
                    lean_files.lean_stale(store, envelope["manifest"], entries):
                result.stale_manifests.append(signing.manifest_id(envelope))
                continue
            try:
                remote.push_manifest(name, envelope)
                result.manifests += 1
            except Fa4AotError as e:
                result.failures.append(f"manifest {signing.manifest_id(envelope)}: {e}")


def pull(store: Store, remote: Remote, sku: str, jobs: int = 8, progress: Progress | None = None,
         trust: Trust | None = None) -> Transfer:
    """Mirror every kernel the server holds for `sku` into `store` (an air-gapped copy), verified, under the
    client's trust policy (`trust`, default Trust.from_env): with trusted keys only kernels a valid signed
    manifest lists with their digest (the others are failures), without them only with FA4_AOT_INSECURE=1
    (TrustError otherwise)."""
    listing = remote.manifest(sku)
    trust = trust or Trust.from_env(_sku_of(listing, sku, remote.url), store, remote)
    refusal = trust.refuse_remote()
    if refusal:
        raise TrustError(f"pull refused: {refusal}")
    wanted = [k for k in listing.get("kernels", []) if not store.has_entry(k["kernel_key"])]
    # a kernel is one object: a kernel that consumed SKU constants is listed under its full key and its base
    # key's signpost, both naming that object (Entry.is_signpost), so kernels and bytes count objects once
    result = Transfer(kernels=len({k["object_digest"] for k in wanted}))
    fetched: set[str] = set()

    def one(k: dict[str, Any]) -> dict[str, Any]:
        if remote.fetch_kernel(k["kernel_key"], store, accept=trust.check,
                               arches=lean_files.trusted_arches(trust, result.lean_refused)) is None:
            raise RuntimeError(f"{remote.url} listed kernel {k['kernel_key']} but no longer has it")
        return k

    def count(r: Transfer, k: dict[str, Any]) -> None:
        if k["object_digest"] not in fetched:
            fetched.add(k["object_digest"])
            r.fetched += 1
            r.bytes += k["size"]

    first: dict[str, str] = {}  # object digest -> the listed key counted as its kernel (its signpost: not)
    for k in wanted:
        first.setdefault(k["object_digest"], k["kernel_key"])
    _run(wanted, one, jobs, result, progress, count,
         weight=lambda k: int(first[k["object_digest"]] == k["kernel_key"]))
    result.recipes = lean_files.pull_recipes(store, remote, sku, trust, result.failures)
    result.verdicts = pull_verdicts(store, remote, sku, {k["kernel_key"] for k in listing["kernels"]},
                                     result.failures)
    for envelope in remote.signed_manifests(sku):  # kept unverified here: clients verify before loading
        signing.save(store, envelope)
        result.manifests += 1
    return result


def pull_verdicts(store: Store, remote: Remote, sku: str, listed: set[str], failures: list[str]) -> int:
    """Keep the server's verdicts of `sku`'s kernels (those in `listed` that the store now holds), read in one
    request per page; only those newer than the store's are written. Returns how many. Under a trust policy
    clients believe signed verdicts only (trust/certified.py), so these serve the store's own users. `pull --sku`
    and `pull --model` (client/prefetch.py) both keep them."""
    try:
        got = [v for v in remote.verdicts(sku=sku) if v.kernel_key in listed and store.has_entry(v.kernel_key)]
        fresh = newer_than_held(store, got)
        if fresh:
            store.put_verdicts(fresh)
        return len(fresh)
    except Fa4AotError as e:
        failures.append(f"verdicts: {e}")
        return 0


def newer_than_held(store: Store, verdicts: list[Verdict]) -> list[Verdict]:
    """Those of `verdicts` that would change what the store holds: of a device class it has no verdict for, or
    newer than (at the same time: other than) the one it has. A held verdict dated ahead of this host's clock
    counts as measured now: its `when` is its publisher's word and must not outrank later measurements."""
    held = {key: by_device(store.verdicts(key)) for key in {v.kernel_key for v in verdicts}}
    fresh, now = [], utc_now()
    for v in verdicts:
        mine = held[v.kernel_key].get(v.device)
        if mine is None or (v.when >= min(mine.when, now) and v != mine):
            fresh.append(v)
    return fresh


def _sku_of(listing: dict[str, Any], name: str, url: str) -> Sku:
    """The SKU a server's manifest describes (its facts are what signed manifests must match)."""
    facts: Any = listing.get("sku")
    try:
        return Sku(name, facts["arch"], int(facts["sm_count"]), int(facts["l2_bytes"]), int(facts["cuda_major"]),
                   host=str(facts.get("host", "")))
    except (TypeError, KeyError, ValueError):
        raise RemoteError(f"{url} describes SKU {name} without its facts; is it an fa4-aot server?") from None


def _run(items: list[Any], fn: Callable[[Any], Any], jobs: int, result: Transfer, progress: Progress | None,
         count: Callable[[Transfer, Any], None], weight: Callable[[Any], int]) -> None:
    """`fn` over `items` on `jobs` threads, each result counted into `result`; `progress` hears of each item that
    is a kernel (`weight` 1; a signpost is 0: its kernel is counted) and of every failure."""
    total, done = sum(map(weight, items)), 0
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        futures = {pool.submit(fn, item): item for item in items}
        for future in as_completed(futures):
            done += weight(futures[future])
            try:
                count(result, future.result())
                status = "ok"
            except (DiskFull, RemoteAuthError, Unreachable):  # every other kernel would fail the same way:
                # stop at once with one error
                for other in futures:
                    other.cancel()
                raise
            except Exception as e:  # one kernel's failure must not stop the others
                status = f"FAILED {type(e).__name__}: {e}"
                result.failures.append(status)
            if progress and (weight(futures[future]) or status != "ok"):
                progress(done, total, status, result.bytes)
