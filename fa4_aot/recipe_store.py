"""Recipes in the store: recipes/<ab>/<recipe key>.json holds every recorded region of one signature on one SKU.

The recipe key is sha256 of the signature and the SKU's target facts; it needs no compiler to compute, so a lean
GPU host finds its recipes without cutlass. Each region names the toolchain it was recorded with; a build with
another toolchain replaces the regions of the old one (its kernel keys differ anyway).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from . import kernel_keys, symexpr
from .errors import StoreError
from .signature import Signature
from .skus import Sku
from .store import Store


def recipe_key(sig: Signature, sku: Sku) -> str:
    doc = {"signature": sig.to_dict(), "target": sku.target_facts()}
    return hashlib.sha256(kernel_keys.dumps(doc).encode()).hexdigest()


def load(store: Store, key: str) -> list[dict[str, Any]]:
    """The recorded regions under `key` ([] when none)."""
    data = store.recipes(key)
    if data is None:
        return []
    try:
        doc = json.loads(data)
    except ValueError as e:
        raise StoreError(f"unreadable recipe file {key} in {store.root}: {e}; rerun `fa4-aot build` (it rewrites "
                         "the file)") from e
    if doc.get("key") != key:
        raise StoreError(f"recipe file {key} in {store.root} holds key {doc.get('key')!r}; rerun `fa4-aot build`")
    return list(doc["regions"])


def merge(store: Store, key: str, regions: list[dict[str, Any]]) -> int:
    """Add `regions` under `key` (under the key's lock), dropping regions of other toolchains and duplicates.
    Returns how many regions the file holds now."""
    if not regions:
        return len(load(store, key))
    with store.lock(key):
        tools = regions[-1]["toolchain"]
        try:
            kept = [r for r in load(store, key) if r.get("toolchain") == tools]
        except StoreError:  # an unreadable file is replaced by what this build recorded
            kept = []
        seen = {kernel_keys.dumps(r["guards"]) for r in kept}
        for region in regions:
            if region["toolchain"] == tools and kernel_keys.dumps(region["guards"]) not in seen:
                kept.append(region)
                seen.add(kernel_keys.dumps(region["guards"]))
        store.put_recipes(key, json.dumps({"key": key, "regions": kept}, sort_keys=True).encode())
    return len(kept)


def find(regions: list[dict[str, Any]], sizes: dict[str, int]) -> dict[str, Any] | None:
    """The region whose guards hold at `sizes`, or None. Regions never overlap (FA4 made different choices)."""
    for region in regions:
        if symexpr.holds(region["guards"], sizes):
            return region
    return None
