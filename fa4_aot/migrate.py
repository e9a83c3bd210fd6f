"""`fa4-aot migrate`: re-file index entries written before issue 13 under today's kernel keys.

Until issue 13 a kernel key hashed all four SKU figures (arch, SM count, L2, CUDA major), so every SKU had its
own copy of kernels that read none of them. Today's key (kernel_keys.key_of) holds the arch, the CUDA major and
only the constants the compile consumed, which every entry records in `hardware_queries`: an old entry holds
everything needed to compute its new keys, and its object is unchanged. Migration writes the entry under its
new full key (and, for a kernel that consumed constants, its base key), then removes the old entry; objects
are shared, so nothing is copied. Old signed manifests list old keys: re-sign (`fa4-aot sign`) afterwards.
Idempotent: entries already under today's keys are left alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from .kernel_keys import entry_keys, legacy_key
from .store import Entry, Store


@dataclass
class Migration:
    entries: int = 0  # index entries seen
    current: int = 0  # already under today's keys
    migrated: int = 0  # old entries re-filed
    skus: list[str] = field(default_factory=list)  # SKUs whose manifests must be signed again
    unrecognised: list[str] = field(default_factory=list)  # keys matching neither formula: left as they are

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def migrate(store: Store, dry_run: bool = False) -> Migration:
    """Re-file every old entry of `store` under today's keys (see the module). Never raises for one entry whose
    key matches neither formula: it is named in the result and left alone."""
    result = Migration()
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


def _refile(store: Store, entry: Entry, base: str, full: str) -> None:
    """New entries first, old one last: a crash in between leaves the kernel findable under both."""
    if not store.has_entry(full):
        store.put_entry(replace(entry, kernel_key=full))
    if base != full and not store.has_entry(base):
        store.put_entry(replace(entry, kernel_key=base))
    store.remove_entry(entry.kernel_key)
