"""`fa4-aot migrate`: re-file index entries written before SKU constants were keyed by need under
today's kernel keys.

Before that a kernel key hashed all four SKU figures (arch, SM count, L2, CUDA major), so every SKU had its
own copy of kernels that read none of them. Today's key (kernel_keys.key_of) holds the arch, the CUDA major and
only the constants the compile consumed, which every entry records in `hardware_queries`: an old entry holds
everything needed to compute its new keys, and its object is unchanged. Migration writes the entry under its
new full key (and, for a kernel that consumed constants, its base key), then removes the old entry; objects
are shared, so nothing is copied. Old signed manifests list old keys: re-sign (`fa4-aot sign`) afterwards.
Idempotent: entries already under today's keys are left alone.

What no migration can do is change an entry's toolchain: since keys name the source of FA4,
CuTe and fa4-aot's patches (fa4/versions.py), an entry built before, or by other code, names a toolchain whose
keys this installation never computes. Nothing records which code made its bytes, so re-filing it under
today's toolchain would be the lie the source digests exist to prevent. Such entries stay valid and loadable
(their keys still prove their fields; verify, sign, push and serve take them), but no lookup of this
installation finds them: `foreign()` counts them per SKU, and `rebuild_advice()` is what list, doctor and
migrate say: build the SKU again, then drop them with `fa4-aot prune --toolchain old`.

Recipe files: a format-2 file is keyed by its signature's page size and window, which its regions hold
as constants; a format-3 file is keyed without them and its regions hold them as sizes. `migrate_recipes` copies
each format-2 region into its signature's format-3 file, pinned to its own page size and window (guards
`page_size == P`, `window_left == L`, ...): it serves exactly the calls it served before, found under today's key
next to the regions new builds record. The old files stay (the runtime reads them after the new ones).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from ..domain.kernel_keys import entry_keys, legacy_key, toolchain_drift
from ..domain.recipe_format import HEADS, RECIPE_FORMAT, bound_sizes
from ..domain.region import Region
from ..domain.signature import Signature
from ..domain.skus import Sku
from . import Entry, Store, recipes

ABSENT = "absent"  # what fa4.toolchain() says for a package that is not installed


@dataclass
class Migration:
    entries: int = 0  # index entries seen
    current: int = 0  # already under today's keys
    migrated: int = 0  # old entries re-filed
    skus: list[str] = field(default_factory=list)  # SKUs whose manifests must be signed again
    unrecognised: list[str] = field(default_factory=list)  # keys matching neither formula: left as they are
    # kernels per SKU built by another toolchain than the one given (none given: not counted); no migration
    # makes them findable, a build does (rebuild_advice)
    other_toolchain: dict[str, int] = field(default_factory=dict)
    drift: list[str] = field(default_factory=list)  # the toolchain names that differ, over all those kernels

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def migrate(store: Store, dry_run: bool = False, tools: dict[str, str] | None = None) -> Migration:
    """Re-file every old entry of `store` under today's keys (see the module). Never raises for one entry whose
    key matches neither formula: it is named in the result and left alone. With `tools` (fa4.toolchain()), the
    result also counts the kernels built by another toolchain, which stay as they are."""
    result = Migration()
    if tools is not None:
        result.other_toolchain, result.drift = foreign(store.entries(), tools)
    skus = set()
    for entry in list(store.entries()):
        result.entries += 1
        base, full = entry_keys(entry)
        if entry.kernel_key in (base, full):
            result.current += 1
            continue
        if entry.kernel_key != legacy_key(entry):
            result.unrecognised.append(entry.kernel_key)
            continue
        result.migrated += 1
        skus.add(entry.sku)
        if not dry_run:
            _refile(store, entry, base, full)
    result.skus = sorted(skus)
    return result


def migrate_recipes(store: Store, skus: Iterable[Sku], dry_run: bool = False) -> int:
    """Copy every format-2 region of `store` (a file whose key is its signature's on one of `skus`) into its
    signature's format-3 file, pinned to its page size and window (see the module); the regions copied (with
    `dry_run`, that would be). Idempotent (merge drops a region whose guards the file holds already); a format-3
    file holding another toolchain's regions is left as it is (a merge would drop the other's). Raises StoreError
    for a recipe file that does not read, naming it and the fix."""
    targets = [(sku, sku.target_facts()) for sku in skus]
    moved: dict[str, list[Region]] = {}
    for found in store.scan_recipes():
        if found.kind != "file":
            continue
        for region in recipes.load(store, found.name):
            sku = next((s for s, t in targets if region.format == 2
                        and recipes.region_key(region.to_json(), t) == found.name), None)
            if sku is not None:
                sig = Signature.from_dict(region.signature)
                moved.setdefault(recipes.recipe_key(sig, sku), []).append(_pinned(region, sig))
    count = 0
    for key, regions in moved.items():
        held = recipes.load(store, key)
        if any(r.toolchain != regions[-1].toolchain for r in [*held, *regions]):
            continue
        count += len(regions)
        if not dry_run:
            recipes.merge(store, key, regions)
    return count


def _pinned(region: Region, sig: Signature) -> Region:
    """A format-2 `region` of `sig` as a format-3 region holding at its own page size and window only."""
    pins = [["eq", ["sym", name], value] for name, value in bound_sizes(sig).items() if name != HEADS]
    return Region.parse({**region.to_json(), "format": RECIPE_FORMAT, "guards": [*region.guards, *pins]})


def _refile(store: Store, entry: Entry, base: str, full: str) -> None:
    """New entries first, old one last: a crash in between leaves the kernel findable under both."""
    if not store.has_entry(full):
        store.put_entry(replace(entry, kernel_key=full))
    if base != full and not store.has_entry(base):
        store.put_entry(replace(entry, kernel_key=base))
    store.remove_entry(entry.kernel_key)


def foreign(entries: Iterable[Entry], tools: dict[str, str]) -> tuple[dict[str, int], list[str]]:
    """({sku: kernels}, the toolchain names that differ) of the `entries` built by a toolchain other than
    `tools`: kernels no key of this installation finds (see the module). Signposts are not counted. Nothing on a
    host without FA4 (`tools` names it absent): it computes no keys (the lean runtime finds kernels by recipe)."""
    if tools.get("flash-attn-4", ABSENT) == ABSENT:
        return {}, []
    counts: dict[str, int] = {}
    names: set[str] = set()
    for entry in entries:
        if "flash-attn-4" not in entry.toolchain:  # another family's toolchain (TIRx: fa4_aot/tirx/toolenv.py)
            continue
        drift = toolchain_drift(entry.toolchain, tools)
        if drift and not entry.is_signpost:
            counts[entry.sku] = counts.get(entry.sku, 0) + 1
            names.update(drift)
    return dict(sorted(counts.items())), sorted(names)


def rebuild_advice(counts: dict[str, int], drift: list[str]) -> list[str]:
    """What to say about kernels built by another toolchain (foreign()): one line per SKU, the fix in it."""
    differ = ", ".join(drift[:6]) + (f" and {len(drift) - 6} more" if len(drift) > 6 else "")
    return [f"{n} {sku} kernel(s) built by another toolchain ({differ} differ{'s' if len(drift) == 1 else ''}): "
            f"no key of this installation finds them; rebuild with `fa4-aot build --sku {sku}`, then remove "
            "them with `fa4-aot prune --toolchain old`" for sku, n in counts.items()]
