"""`fa4-aot prune`: drop kernels by SKU, toolchain, age or a size budget. `select()` is pure (table-tested);
`prune()` removes through the Store API, each entry before its object, and an object only when no kept
entry still names it."""

from __future__ import annotations

import calendar
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..errors import Fa4AotError
from . import Entry, Store

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_AGES = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


@dataclass(frozen=True)
class Rules:
    sku: str | None = None
    toolchain: dict[str, str] | None = None  # drop entries built with any other toolchain
    flash_attn: str | None = None  # drop entries built with this flash-attn-4 version
    older_than: float | None = None  # seconds
    max_size: int | None = None  # bytes kept at most, newest first

    def any(self) -> bool:
        return any(v is not None for v in (self.sku, self.toolchain, self.flash_attn, self.older_than, self.max_size))


@dataclass
class PruneReport:
    entries: list[str] = field(default_factory=list)  # index entries removed (kernels and their signposts)
    objects: list[str] = field(default_factory=list)  # object digests removed (kernels, libraries, runtimes)
    bytes_freed: int = 0
    kept: int = 0  # kernels kept (Entry.is_signpost: a signpost is not a kernel)
    removed: int = 0  # kernels removed


def parse_size(text: str) -> int:
    """'500M', '10G', '1024' -> bytes (binary units). Raises Fa4AotError with the accepted forms."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)i?[bB]?\s*", text)
    if not m:
        raise Fa4AotError(f"invalid size {text!r}: expected a number with an optional K, M, G or T, e.g. 20G")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def parse_age(text: str) -> float:
    """'30d', '12h', '90m', '45s', '2w' -> seconds. Raises Fa4AotError with the accepted forms."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text)
    if not m:
        raise Fa4AotError(f"invalid age {text!r}: expected a number and a unit s, m, h, d or w, e.g. 30d")
    return float(m.group(1)) * _AGES[m.group(2)]


def _created(entry: Entry) -> float:
    try:
        return float(calendar.timegm(time.strptime(entry.created, "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return 0.0  # an entry without a readable date counts as oldest


def select(entries: list[Entry], rules: Rules, now: float, sizes: Mapping[str, int] | None = None) -> list[Entry]:
    """The entries `rules` drop: those matching every given filter (sku, toolchain, age), then the oldest
    of the rest until what is kept fits max_size, counting every object a kept entry needs once (its object,
    linked libraries and their runtime libraries, sizes from `sizes` where the entry does not record them):
    a kernel and its base-key signpost share one object, and all libraries share the CuTe runtime."""
    def matches(e: Entry) -> bool:
        return ((rules.sku is None or e.sku == rules.sku)
                # --toolchain old judges FA4's kernels; another family's (TIRx) names no flash-attn-4
                and (rules.toolchain is None or (e.toolchain != rules.toolchain and "flash-attn-4" in e.toolchain))
                and (rules.flash_attn is None or e.toolchain.get("flash-attn-4") == rules.flash_attn)
                and (rules.older_than is None or now - _created(e) > rules.older_than))

    filtered = rules.sku is not None or rules.toolchain is not None or rules.flash_attn is not None \
        or rules.older_than is not None
    dropped = [e for e in entries if matches(e)] if filtered else []
    if rules.max_size is not None:
        gone = {e.kernel_key for e in dropped}
        kept = sorted((e for e in entries if e.kernel_key not in gone), key=_created, reverse=True)
        held: dict[str, int] = {}
        for e in kept:
            held.update(e.footprint(sizes or {}))
            if sum(held.values()) > rules.max_size:
                dropped.append(e)
    return dropped


def prune(store: Store, rules: Rules, dry_run: bool = False, now: float | None = None) -> PruneReport:
    """Remove the entries `rules` select, then the objects no remaining entry names."""
    if not rules.any():
        raise Fa4AotError("prune needs at least one of --sku, --toolchain, --older-than, --max-size")
    entries = list(store.entries())
    sizes = {d: store.object_size(d) or 0 for e in entries for d in e.digests()}
    doomed = select(entries, rules, time.time() if now is None else now, sizes)
    gone = {e.kernel_key for e in doomed}
    live = {d for e in entries if e.kernel_key not in gone for d in e.digests()}
    report = PruneReport(entries=sorted(gone), kept=sum(not e.is_signpost for e in entries if e.kernel_key not in gone),
                         removed=sum(not e.is_signpost for e in doomed))
    for e in doomed:
        if not dry_run:
            store.remove_entry(e.kernel_key)
    for digest in sorted({d for e in doomed for d in e.digests()} - live):
        report.objects.append(digest)
        report.bytes_freed += store.object_size(digest) or 0
        if not dry_run:
            store.remove_object(digest)
    return report
