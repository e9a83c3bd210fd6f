"""Prefetch by model: fetch exactly one model's kernel set for a SKU from a server, so that a
node starts warm. `fa4-aot pull --model NAME --tp 1,2,4,8` and `fa4_aot.prefetch(model=..., tp=...)` run it.

Where the kernel set comes from, with no FA4 on the host: the recipe files. A model's signatures per TP degree
(models.signatures: pure arithmetic on the model's facts) are what `fa4-aot build --model` plans, shape-complete,
and the build records each signature's recipe file on the SKU, whose regions name every kernel the signature
launches at any size. A file's key is computed from the signature and the SKU's facts alone (store.recipes), so
this module: lists the server's recipe files of the SKU (one request) and fetches the model's files the store
lacks, reads the kernel keys their regions name, and fetches the kernels the store lacks in one bundle, with this
host's lean libraries and the runtime libraries they need (the server's SKU listing names the kernel a signpost
stands for, so both come in that bundle; a kernel built only for other SKU constants takes a second). Everything
passes the client's trust policy (trust/policy.py), as the lean runtime's fetches do (runtime.fetch.Fetcher).

What the server lacks becomes misses, reported through POST /v1/misses, which the on-demand builder turns into
build jobs: a signature with no recipe file on the server, or whose regions name kernels
the server lacks, is reported as ONE lean-runtime miss of a call of it (domain/misses.py: Miss.lean), and the
builder builds that call's whole signature (compile/rebuild.py: every region, kernel and library), so one round
of misses completes the set. Kernel misses, one per lacking kernel with a call at
MISS_SEQLEN, did not: the builder re-plans a kernel miss's call, and at that size FA4 selects none of the kernels
of other regions.

What the server HAS but the trust policy refuses (FA4_AOT_TRUSTED_KEYS, and a recipe file or kernel no valid
signed manifest lists: an unsigned builder's) is no miss: a build would make the same unsigned files again. Such
recipe files are named apart (`unsigned`, `refusal`: the fix is to sign on the server's side), such kernels among
the failures, with the fetcher's words.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import host_arch
from ..domain import kernel_keys
from ..domain.misses import Miss
from ..domain.region import Region
from ..domain.signature import Signature
from ..domain.skus import Constants, Sku
from ..errors import Fa4AotError, TrustError
from ..matrix import models, modelwork
from ..remote import lean_files, push_pull
from ..runtime import on_miss
from ..runtime.fetch import Fetcher
from ..store import Store
from ..store import recipes as recipe_store
from ..trust.policy import Trust

if TYPE_CHECKING:
    from ..remote.http import Remote

# The sizes of the call reported for a signature the server has no recipe file of: a 4096-token sequence (decode
# layouts: one new token over 4096 cached ones). The build of that call records the regions FA4 chooses there.
MISS_SEQLEN = 4096


@dataclass
class Prefetched:
    sku: str
    model: str
    tps: tuple[int, ...]
    signatures: int = 0  # distinct signatures of the model at those TP degrees
    recipes: int = 0  # recipe files fetched (the rest were held with the server's bytes)
    kernels: int = 0  # kernels the model's recipe regions name
    fetched: int = 0  # kernels fetched (the rest were held, with this host's library)
    bundles: int = 0  # bundle requests made
    bytes: int = 0
    unbuilt: list[str] = field(default_factory=list)  # signatures the server has no recipe file of
    missing: list[str] = field(default_factory=list)  # kernel keys a region names that the server lacks
    # recipe files the server has that the trust policy refused (no valid signed manifest lists them)
    unsigned: list[str] = field(default_factory=list)
    refusal: str = ""  # why, and how to fix it (the first refusal's words), when `unsigned` is not empty
    reported: int = 0  # misses reported to the server (build jobs, where a builder runs)
    verdicts: int = 0  # certification verdicts of the model's kernels kept (newer than the store held)
    failures: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not (self.unbuilt or self.missing or self.unsigned or self.failures)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "tps": list(self.tps), "complete": self.complete}


def prefetch(model: str, tp: int | Sequence[int] = modelwork.DEFAULT_TPS, workloads: Sequence[str] = models.WORKLOADS,
             *, sku: str | None = None, server: str | None = None, token: str | None = None,
             cache_dir: Path | None = None) -> Prefetched:
    """Fetch the kernel set of `model` (a catalog name or a Hugging Face config.json) at TP degrees `tp` into the
    store (`cache_dir`, default FA4_AOT_CACHE's) from `server` (default FA4_AOT_SERVER, token FA4_AOT_TOKEN),
    for SKU `sku` (default: FA4_AOT_SKU, else this GPU's, as the runtimes select it). Call it before the first
    attention call (e.g. at a node's start); what the server lacks is reported to it as misses (see the module).
    Returns what was fetched; `complete` says whether the store now holds the whole set."""
    import os

    from .. import config
    from ..domain import devices
    from ..matrix import variants
    from ..remote.http import Remote, server_from_env

    matrix = variants.load(config.default_variants_file())
    if sku is not None:
        target = matrix.sku(sku)
        constants = target.constants()
    else:  # as the runtimes choose it
        here = devices.this_device(matrix.skus)
        target, constants = here.sku, here.constants
    remote = Remote(server, token=token or os.environ.get("FA4_AOT_TOKEN")) if server else server_from_env()
    if remote is None:
        raise Fa4AotError("prefetch needs a server: pass server=URL or set FA4_AOT_SERVER (FA4_AOT_OFFLINE=1 "
                          "forbids the network)")
    tps = (tp,) if isinstance(tp, int) else tuple(tp)
    store = Store(cache_dir or config.default_cache_dir())
    return run(store, remote, target, models.resolve(model), tps, tuple(workloads), constants)


def run(store: Store, remote: Remote, sku: Sku, model: models.Model, tps: tuple[int, ...],
        workloads: tuple[str, ...] = models.WORKLOADS, constants: Constants | None = None,
        trust: Trust | None = None) -> Prefetched:
    """Fetch `model`'s kernel set on `sku` (its recipe files, kernels and this host's libraries) from `remote` into
    `store`, and report what the server lacks as misses. `constants` (default: the SKU table's) pick the build of
    a kernel that consumed SKU constants. Raises TrustError when the trust policy refuses remote kernels."""
    trust = trust or Trust.from_env(sku, store, remote)
    refusal = trust.refuse_remote()
    if refusal:
        raise Fa4AotError(f"prefetch refused: {refusal}")
    result = Prefetched(sku.name, model.name, tps)
    labels: dict[Signature, str] = {}
    for item in modelwork.items(model, tps, workloads):
        labels.setdefault(item.signature, item.label)
    result.signatures = len(labels)
    listed = remote.recipes(sku.name)
    wanted: dict[str, tuple[Signature, Region]] = {}  # base key -> (a signature and region that launch it)
    for sig, label in labels.items():
        regions = _regions(store, remote, sku, sig, listed, trust, result)
        if regions is None and not any(s.key in result.unsigned for s in recipe_store.sources(sig, sku)):
            result.unbuilt.append(label)
            _report(remote, Miss.lean(_call(sig), sku.name), result)
        for region in regions or []:
            for k in region.kernels:
                wanted.setdefault(k.kernel_key, (sig, region))
    result.kernels = len(wanted)
    fetcher = Fetcher(remote, trust, store)
    constants = constants or sku.constants()
    on_server = _fetch(store, remote, fetcher, sku, list(wanted), constants, result)
    held = set(wanted) | {full for full in (_full_key(store, b, constants) for b in wanted) if full}
    result.verdicts = push_pull.pull_verdicts(store, remote, sku.name, held, result.failures)
    lacking: dict[Signature, Region] = {}  # per signature, the first region naming a kernel the server lacks
    for key, (sig, region) in wanted.items():
        if store.get_entry(key) is not None:
            continue
        if key in on_server:  # held there, not fetched: refused (trust) or failed, both in `failures`
            continue
        result.missing.append(key)
        lacking.setdefault(sig, region)
    for sig, region in lacking.items():  # one miss a signature: its build makes every kernel of it (see module)
        _report(remote, Miss.lean(_call(sig, region), sku.name), result)
    return result


def _regions(store: Store, remote: Remote, sku: Sku, sig: Signature, listed: dict[str, str], trust: Trust,
             result: Prefetched) -> list[Region] | None:
    """The regions of the first file that serves `sig` (its own, else a training file's forward part), fetched
    when the server lists other bytes than the store holds; None when neither holds one."""
    for source in recipe_store.sources(sig, sku):
        key = source.key
        local = store.recipes(key)
        if key in listed and (local is None or hashlib.sha256(local).hexdigest() != listed[key]):
            try:
                if lean_files.fetch_recipe(store, remote, sku.name, key, trust, listed[key]):
                    result.recipes += 1
            except TrustError as e:  # the server has it, unsigned for this policy: no miss (see the module)
                result.unsigned.append(key)
                result.refusal = result.refusal or unsigned_fix(sku.name, e)
                continue
            except Fa4AotError as e:
                result.failures.append(f"recipe {key}: {e}")
                continue
        regions = recipe_store.load(store, key, trust.check_recipe)
        if regions:
            return source.serve(regions)
    return None


def unsigned_fix(sku: str, e: TrustError) -> str:
    """What a refused recipe file or kernel of the server means, and the fix on the server's side."""
    return (f"the server has files of {sku} that no manifest signed by a key in FA4_AOT_TRUSTED_KEYS lists (its "
            f"builder or build did not sign them): run its `fa4-aot builder` with --signing-key, or run `fa4-aot "
            f"sign --sku {sku}` on the server's store (and push it), then pull again. The first refusal: {e}")


def _fetch(store: Store, remote: Remote, fetcher: Fetcher, sku: Sku, base_keys: list[str], constants: Constants,
           result: Prefetched) -> set[str]:
    """Fetch the kernels of `base_keys` the store cannot load on this host: with each signpost, the kernel the
    server's SKU listing files under its object (one bundle); then any build for `constants` still lacking.
    Returns the keys the server's SKU listing holds (empty when nothing was lacking: it is not asked)."""
    arch = host_arch()

    def lacking(key: str) -> bool:
        entry = store.get_entry(key)
        return entry is None or not store.has_library(entry, arch)

    first = [k for k in base_keys if lacking(k)]
    digest: dict[str, str] = {}  # kernel key -> object digest, as the server's SKU listing files it
    if first:
        by_object: dict[str, list[str]] = {}
        for k in remote.manifest(sku.name).get("kernels", []):
            by_object.setdefault(k["object_digest"], []).append(k["kernel_key"])
        digest = {k: d for d, keys in by_object.items() for k in keys}
        first = list(dict.fromkeys(k for b in first for k in [b, *by_object.get(digest.get(b, ""), [])]
                                   if lacking(k)))
    for keys in (first, None):
        if keys is None:  # the builds with these constants, where the listing's were for others
            keys = [full for full in map(lambda b: _full_key(store, b, constants), base_keys) if full and lacking(full)]
        if not keys:
            continue
        before = _held_bytes(store, keys)
        result.bundles += 1
        fetcher.kernels(keys)
        got = [e for e in map(store.get_entry, keys) if e is not None and not lacking(e.kernel_key)]
        result.fetched += sum(not e.is_signpost for e in got)  # a kernel, not its signpost too
        result.bytes += _held_bytes(store, keys) - before
        if fetcher.error:
            result.failures.append(fetcher.error)
    return set(digest)


def _full_key(store: Store, base_key: str, constants: Constants) -> str:
    """The key of the build of `base_key`'s kernel for `constants` ('' when its kernel consumed none, or its base
    entry is not held)."""
    try:
        full = kernel_keys.device_key(base_key, store.get_entry(base_key), constants)
    except ValueError:  # a constant this version cannot compute: no build serves this host
        return ""
    return "" if full == base_key else full


def _held_bytes(store: Store, keys: list[str]) -> int:
    entries = [e for e in map(store.get_entry, keys) if e is not None]
    return store.bytes_of(entries) if entries else 0


def _call(sig: Signature, region: Region | None = None) -> Any:
    """The call reported for `sig`: one at the sizes `region` was recorded at (a region whose kernels the server
    lacks: a call the first round's miss, at MISS_SEQLEN, did not make), else one sequence of MISS_SEQLEN tokens
    (the decode layouts, a KV cache read through seqused_k or a page table: one token over that many)."""
    if region is not None and region.recorded_at:
        return on_miss.call_of(sig, region.recorded_at)
    decode = sig.layout in ("paged", "seqused")
    return sig.call(1, 1 if decode else MISS_SEQLEN, MISS_SEQLEN)


def _report(remote: Remote, miss: Miss, result: Prefetched) -> None:
    """Report `miss` and wait for the server's answer (a CLI exits right after; Remote.report_miss's thread would
    die with it). A refused report is a failure; prefetch goes on."""
    try:
        remote.request_build(miss)
        result.reported += 1
    except Fa4AotError as e:
        result.failures.append(f"miss {miss.kernel_key[:16]} not reported: {e}")
