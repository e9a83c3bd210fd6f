"""The lean runtime's share of push and pull: recipe files of a SKU, and the linked libraries of its kernels.

Libraries travel with their kernels (Remote.push_entry uploads them, Remote.fetch_kernel downloads those of
the host arches asked for); recipe files travel here, after the kernels, since the server files a recipe under
a SKU whose kernels it holds. A pulled recipe is kept only if its sha256 is what the server listed and the
client's trust policy accepts it (with trusted keys: what a valid signed manifest lists).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from ..domain.skus import Sku
from ..errors import Fa4AotError, IntegrityError, RemoteError
from ..store import Entry, Store
from ..store import recipes as recipe_store
from ..trust.policy import Trust
from .http import Remote


def sku_of_entries(name: str, entries: list[Entry]) -> Sku | None:
    """The SKU `name` as its kernels describe it (its target facts), or None when none of them is of it."""
    for e in entries:
        if e.sku == name:
            return Sku(name, e.arch, e.sm_count, e.l2_bytes, e.cuda_major, host=e.host)
    return None


def push_all_recipes(store: Store, remote: Remote, entries: list[Entry], failures: list[str]) -> int:
    """push_recipes for every SKU of the pushed `entries`."""
    skus = [sku_of_entries(name, entries) for name in sorted({e.sku for e in entries})]
    return sum(push_recipes(store, remote, sku, failures) for sku in skus if sku is not None)


def push_recipes(store: Store, remote: Remote, sku: Sku, failures: list[str]) -> int:
    """Publish every recipe file `store` holds for `sku`'s facts that the server lacks with these bytes; returns
    how many were sent. One file's failure is listed in `failures`, never raised."""
    held = remote.recipes(sku.name)
    sent = 0
    for key, data in recipe_store.keys_for(store, sku.target_facts()):
        if held.get(key) == hashlib.sha256(data).hexdigest():
            continue
        try:
            remote.push_recipe(sku.name, key, data)
            sent += 1
        except Fa4AotError as e:
            failures.append(f"recipe {key}: {e}")
    return sent


def pull_recipes(store: Store, remote: Remote, sku: str, trust: Trust, failures: list[str]) -> int:
    """Fetch every recipe file the server lists for `sku` that `store` lacks with the listed bytes; returns how
    many were stored. A file whose bytes differ from the listing, or that the trust policy refuses, is a failure."""
    stored = 0
    for key, digest in sorted(remote.recipes(sku).items()):
        local = store.recipes(key)
        if local is not None and hashlib.sha256(local).hexdigest() == digest:
            continue
        try:
            if fetch_recipe(store, remote, sku, key, trust, digest):
                stored += 1
        except Fa4AotError as e:
            failures.append(f"recipe {key}: {e}")
    return stored


def fetch_recipe(store: Store, remote: Remote, sku: str, key: str, trust: Trust, digest: str | None = None) -> bool:
    """Download recipe file `key` of `sku` into `store`: False when the server has none; raises Fa4AotError
    (TrustError, RemoteError) when its bytes are not the listed `digest`, not a recipe file of that key, or
    refused by `trust`; nothing is stored then."""
    data = remote.recipe(sku, key)
    if data is None:
        return False
    actual, source = hashlib.sha256(data).hexdigest(), f"{remote.url}/v1/skus/{sku}/recipes/{key}"
    if digest is not None and actual != digest:
        raise IntegrityError(f"{source} was listed with sha256 {digest} but sent bytes hashing to {actual}; nothing "
                             "was stored (retry; a server or proxy is sending other bytes)",
                             expected=digest, actual=actual, source=source)
    trust.check_recipe(key, data)
    try:
        recipe_store.check_file(data, key, trust.sku.target_facts())
    except ValueError as e:
        raise RemoteError(f"{source} is not a recipe file of {sku} ({e}); nothing was stored: republish it with "
                          f"`fa4-aot push --sku {sku}` from the build store") from None
    store.put_recipes(key, data)
    return True


def trusted_arches(trust: Trust, failures: list[str] | None = None) -> Callable[[Entry], list[str]]:
    """Remote.fetch_kernel's `arches`: every host arch whose library the trust policy accepts (a refused one is
    named in `failures`, and its kernel is still fetched for install())."""
    def arches(entry: Entry) -> list[str]:
        kept = []
        for arch in sorted(entry.shared_libs):
            try:
                trust.check_library(entry, arch)
                kept.append(arch)
            except Fa4AotError as e:
                if failures is not None:
                    failures.append(f"library of {entry.kernel_key[:16]}… for {arch} not fetched: {e}")
        return kept

    return arches


def lean_stale(store: Store, manifest: dict[str, Any], entries: list[Entry]) -> bool:
    """Whether a signed manifest lists libraries or recipe files other than `store` now holds (relinked or
    re-recorded since signing): pushing it would make clients refuse what the server serves."""
    from ..trust.signing import library_listing

    by_key = {e.kernel_key: e for e in entries}
    for key, per_arch in (manifest.get("libraries") or {}).items():
        entry = by_key.get(key)
        if entry is None or any(library_listing(entry.shared_libs[a]) != v if a in entry.shared_libs else True
                                for a, v in per_arch.items()):
            return True
    for key, digest in (manifest.get("recipes") or {}).items():
        data = store.recipes(key)
        if data is None or hashlib.sha256(data).hexdigest() != digest:
            return True
    return False
