"""A kernel's certification standing, as `fa4-aot list`, `coverage` and `doctor` show it.

    certified  every device class that checked it passed it
    failed     some device class's newest verdict is not pass (the runtimes refuse it on that class)
    unchecked  no verdict

The standing and its short form are pure functions of a kernel's verdicts (domain/verdicts.py); `Verdicts` reads a
store's verdict files, each once, and opens none for a kernel that has no file.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ..domain.verdicts import STATUSES, Verdict, by_device, severity
from ..store import Entry, Store

STANDINGS = ("certified", "failed", "unchecked")


def standing(verdicts: list[Verdict]) -> str:
    """certified, failed or unchecked (see the module), from the newest verdict of each device class."""
    newest = by_device(verdicts)
    if not newest:
        return "unchecked"
    return "certified" if all(v.passed for v in newest.values()) else "failed"


def brief(verdicts: list[Verdict]) -> str:
    """A column's worth: '-' (unchecked), 'pass' ('pass x2': two device classes), else the worst verdict's
    status ('wrong:dq' names the tensor) and '+N' for the other device classes."""
    newest = list(by_device(verdicts).values())
    if not newest:
        return "-"
    worst = max(newest, key=lambda v: severity(v.status))
    text = f"{worst.status}:{worst.tensor}" if worst.status == "wrong" and worst.tensor else worst.status
    if worst.passed:
        return text if len(newest) == 1 else f"{text} x{len(newest)}"
    return text if len(newest) == 1 else f"{text}+{len(newest) - 1}"


def counts(standings: Iterable[str]) -> dict[str, int]:
    """{standing: how many}, every standing present (0 when none)."""
    found = dict.fromkeys(STANDINGS, 0)
    for s in standings:
        found[s] += 1
    return found


def by_status(verdicts: Iterable[Verdict]) -> dict[str, int]:
    """{status: how many} of `verdicts`, in the order of domain.verdicts.STATUSES, statuses seen only."""
    found = {s: 0 for s in STATUSES}
    for v in verdicts:
        found[v.status] += 1
    return {s: n for s, n in found.items() if n}


class Verdicts:
    """The verdicts a store keeps, read once per kernel key; a kernel without a verdict file is not opened."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._keys: set[str] | None = None
        self._read: dict[str, list[Verdict]] = {}

    def of(self, kernel_key: str) -> list[Verdict]:
        """Every verdict of `kernel_key` (one per device class); [] when none. StoreError for a malformed file."""
        if self._keys is None:
            self._keys = set(self.store.verdict_keys())
        if kernel_key not in self._keys:
            return []
        if kernel_key not in self._read:
            self._read[kernel_key] = self.store.verdicts(kernel_key)
        return self._read[kernel_key]

    def standing(self, kernel_key: str) -> str:
        return standing(self.of(kernel_key))


@dataclass
class SkuStanding:
    """The certification of one SKU's kernels in a store (what `fa4-aot doctor` reports)."""

    kernels: int = 0
    statuses: dict[str, int] = field(default_factory=dict)  # the newest verdict per kernel and device class
    unchecked: int = 0  # kernels without a verdict
    failed: list[tuple[Entry, Verdict]] = field(default_factory=list)  # each failing kernel's worst verdict


def of_sku(store: Store, sku: str) -> SkuStanding:
    """The certification of the kernels `store` holds for `sku` (signposts are not kernels)."""
    verdicts = Verdicts(store)
    found = SkuStanding()
    newest: list[Verdict] = []
    for entry in store.entries():
        if entry.sku != sku or entry.is_signpost:
            continue
        mine = list(by_device(verdicts.of(entry.kernel_key)).values())
        found.kernels += 1
        found.unchecked += not mine
        newest += mine
        failing = [v for v in mine if not v.passed]
        if failing:
            found.failed.append((entry, max(failing, key=lambda v: severity(v.status))))
    found.statuses = by_status(newest)
    return found
