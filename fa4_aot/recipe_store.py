"""Recipes in the store: recipes/<ab>/<recipe key>.json holds every recorded region of one signature on one SKU.

The recipe key is sha256 of the signature and the SKU's target facts; it needs no compiler to compute, so a lean
GPU host finds its recipes without cutlass. Each region names the toolchain it was recorded with; a build with
another toolchain replaces the regions of the old one (its kernel keys differ anyway).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from . import keys, symexpr
from .errors import StoreError
from .signature import Signature
from .skus import Sku
from .store import Store, check_hex


def recipe_key(sig: Signature, sku: Sku) -> str:
    doc = {"signature": sig.to_dict(), "target": sku.target_facts()}
    return hashlib.sha256(keys.dumps(doc).encode()).hexdigest()


def _path(store: Store, key: str) -> Any:
    check_hex(key, "recipe key")
    return store.root / "recipes" / key[:2] / f"{key}.json"


def load(store: Store, key: str) -> list[dict[str, Any]]:
    """The recorded regions under `key` ([] when none)."""
    path = _path(store, key)
    try:
        with store._open(path) as f:
            doc = json.loads(f.read())
    except FileNotFoundError:
        return []
    except ValueError as e:
        raise StoreError(f"unreadable recipe file {path}: {e}; delete it and rerun `fa4-aot build`") from e
    if doc.get("key") != key:
        raise StoreError(f"recipe file {path} holds key {doc.get('key')!r}; delete it and rerun `fa4-aot build`")
    return list(doc["regions"])


def merge(store: Store, key: str, regions: list[dict[str, Any]]) -> int:
    """Add `regions` under `key` (under the key's lock), dropping regions of other toolchains and duplicates.
    Returns how many regions the file holds now."""
    if not regions:
        return len(load(store, key))
    with store.lock(key):
        tools = regions[-1]["toolchain"]
        kept = [r for r in load(store, key) if r.get("toolchain") == tools]
        seen = {keys.dumps(r["guards"]) for r in kept}
        for region in regions:
            if region["toolchain"] == tools and keys.dumps(region["guards"]) not in seen:
                kept.append(region)
                seen.add(keys.dumps(region["guards"]))
        store._write(_path(store, key), json.dumps({"key": key, "regions": kept}, sort_keys=True).encode())
    return len(kept)


def find(regions: list[dict[str, Any]], sizes: dict[str, int]) -> dict[str, Any] | None:
    """The region whose guards hold at `sizes`, or None. Regions never overlap (FA4 made different choices)."""
    for region in regions:
        if symexpr.holds(region["guards"], sizes):
            return region
    return None
