"""Keeping a store healthy: `verify` (re-hash, check entries, quarantine what fails) and `gc` (unreferenced
objects, dead writers' temp files). Built on the Store API (scan, hash_object, quarantine, temp_files): this
module decides what is wrong and what goes; store.py owns every path and follows no link below the root."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from .errors import StoreError
from .fsutil import shown
from .store import Found, Store


@dataclass
class VerifyReport:
    objects_checked: int = 0
    entries_checked: int = 0
    bad_objects: list[tuple[str, str]] = field(default_factory=list)  # (expected, actual)
    dangling_entries: list[str] = field(default_factory=list)  # kernel keys whose object is absent
    bad_entries: list[tuple[str, str]] = field(default_factory=list)  # (path under the root, why)
    symlinks: list[str] = field(default_factory=list)  # paths under the root; never followed
    unexpected: list[str] = field(default_factory=list)  # names no reader opens: ignored, not a problem
    quarantined: dict[str, str] = field(default_factory=dict)  # path under the root -> where it went
    quarantine_dir: str | None = None

    @property
    def ok(self) -> bool:
        return not (self.bad_objects or self.dangling_entries or self.bad_entries or self.symlinks)


@dataclass
class GcReport:
    removed_objects: list[str] = field(default_factory=list)
    removed_temp_files: int = 0
    bytes_freed: int = 0


def verify(store: Store, quarantine: bool = False) -> VerifyReport:
    """Re-hash every object and check every index entry (readable, names its own key, object present with its
    size and digest). Symlinks are reported, never followed. With `quarantine`, every bad object, bad or
    dangling entry and symlink is moved to quarantine/<time>/ (entries first), so no load sees it. Entries
    whose object was not seen in the object pass (a build running meanwhile) are checked against the object
    directly, so a concurrent build's fresh entry is never taken for dangling."""
    report, doomed = VerifyReport(), list[Found]()
    good = _verify_objects(store, report, doomed)
    doomed[:0] = _verify_entries(store, report, good)
    if quarantine and doomed:
        report.quarantine_dir, report.quarantined = store.quarantine(doomed)
    return report


def _verify_objects(store: Store, report: VerifyReport, doomed: list[Found]) -> dict[str, int]:
    """Hash every object; returns {digest: size} of the good ones and appends the bad ones to `doomed`."""
    good = {}
    for found in store.scan("objects"):
        if found.kind == "unexpected":
            report.unexpected.append(shown(found.where))
            continue
        if found.kind == "symlink":
            report.symlinks.append(shown(found.where))
        else:
            hashed = store.hash_object(found.name)
            if hashed is None:  # removed since the scan (a gc): nothing to check
                continue
            report.objects_checked += 1
            actual, size = hashed
            if actual == found.name:
                good[found.name] = size
                continue
            report.bad_objects.append((found.name, actual))
        doomed.append(found)
    return good


def _verify_entries(store: Store, report: VerifyReport, good: dict[str, int]) -> list[Found]:
    doomed = []
    for found in store.scan("index"):
        if found.kind == "unexpected":
            report.unexpected.append(shown(found.where))
            continue
        if found.kind == "symlink":
            report.symlinks.append(shown(found.where))
            doomed.append(found)
            continue
        report.entries_checked += 1
        problem = _entry_problem(store, found.name, good)
        if problem == "dangling":
            report.dangling_entries.append(found.name)
        elif problem:
            report.bad_entries.append((shown(found.where), problem))
        if problem:
            doomed.append(found)
    return doomed


def _entry_problem(store: Store, kernel_key: str, good: dict[str, int]) -> str | None:
    """None for a sound entry, "dangling" when its object is absent, else why it cannot be served."""
    try:
        entry = store.get_entry(kernel_key)
        if entry is None:  # removed since the scan
            return None
        digest, size = entry.object_digest, entry.size
        state = ("ok" if good[digest] == size else "corrupt") if digest in good else store.object_state(digest, size)
    except StoreError as e:
        return str(e)
    if state == "missing":
        return "dangling"
    if state == "corrupt":
        return f"its object {digest} is corrupt or not {size} bytes"
    return None


def gc(store: Store, dry_run: bool = False, min_age: float = 0.0) -> GcReport:
    """Remove objects that no entry references and are older than `min_age` seconds, and temp files left by
    writers that are no longer running. A builder writes an object before its entry, so a gc concurrent with
    builds needs a min_age longer than one compile (the CLI defaults to an hour). Entries are read only when
    some object is old enough to go, so temp files are cleared even when an entry is unreadable (which stops
    object removal with StoreError). Leaves quarantine/ alone."""
    report = GcReport()
    cutoff, live = time.time() - min_age, None
    for found in store.scan("objects"):
        mtime = store.object_mtime(found.name) if found.kind == "file" else None
        if mtime is None or mtime > cutoff:
            continue
        live = {e.object_digest for e in store.entries()} if live is None else live
        if found.name not in live:
            report.removed_objects.append(found.name)
            report.bytes_freed += store.object_size(found.name) or 0
            if not dry_run:
                store.remove_object(found.name)
    for where, pid in store.temp_files():
        if not _alive(pid):
            report.removed_temp_files += 1
            if not dry_run:
                store.remove_temp_file(where)
    return report


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
