"""Keeping a store healthy: `verify` (re-hash, check entries, quarantine what fails) and `gc` (unreferenced
objects, dead writers' temp files). Built on the Store's maintenance-facing part (store/upkeep.py: scans, hashes,
quarantine, temp files): this module decides what is wrong and what goes; the Store owns every path and follows
no link below the root."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field

from ..errors import StoreError
from . import Entry, Found, Store
from .fs_errors import shown


@dataclass
class VerifyReport:
    objects_checked: int = 0
    entries_checked: int = 0
    bad_objects: list[tuple[str, str]] = field(default_factory=list)  # (expected, actual)
    dangling_entries: list[str] = field(default_factory=list)  # kernel keys whose object is absent
    bad_entries: list[tuple[str, str]] = field(default_factory=list)  # (path under the root, why)
    symlinks: list[str] = field(default_factory=list)  # paths under the root; never followed
    # (kernel key, host arch, why): a linked library, or a runtime library it needs, is absent or corrupt
    broken_libraries: list[tuple[str, str, str]] = field(default_factory=list)
    unlinked: list[str] = field(default_factory=list)  # "key arch": libraries dropped from entries (repaired)
    unexpected: list[str] = field(default_factory=list)  # names no reader opens: ignored, not a problem
    quarantined: dict[str, str] = field(default_factory=dict)  # path under the root -> where it went
    quarantine_dir: str | None = None

    @property
    def ok(self) -> bool:
        return not (self.bad_objects or self.dangling_entries or self.bad_entries or self.symlinks
                    or self.broken_libraries)


@dataclass
class GcReport:
    removed_objects: list[str] = field(default_factory=list)
    removed_temp_files: int = 0
    bytes_freed: int = 0


def verify(store: Store, quarantine: bool = False,
           progress: Callable[[int, int, str], None] | None = None) -> VerifyReport:
    """Re-hash every object and check every index entry (readable, names its own key, and every object it
    refers to, Entry.digests(), present with its size and digest: the kernel's object, its linked libraries
    and the runtime libraries they need). Symlinks are reported, never followed. With `quarantine`, every bad
    object, bad or dangling entry and symlink is moved to quarantine/<time>/ (entries first), so no load sees
    it, and an entry whose library for a host arch is broken first loses that arch's library
    (`shared_libs`), so that the next `fa4-aot build` links it again and a lean client fetches it again.
    Entries whose object was not seen in the object pass (a build running meanwhile) are checked against the
    object directly, so a concurrent build's fresh entry is never taken for dangling. `progress(done, total,
    status)` is called after each object is hashed ("ok" or "corrupt <digest>")."""
    report, doomed = VerifyReport(), list[Found]()
    good = _verify_objects(store, report, doomed, progress)
    doomed[:0] = _verify_entries(store, report, _States(store, good), repair=quarantine)
    if quarantine and doomed:
        report.quarantine_dir, report.quarantined = store.quarantine(doomed)
    return report


def _verify_objects(store: Store, report: VerifyReport, doomed: list[Found],
                    progress: Callable[[int, int, str], None] | None) -> dict[str, int]:
    """Hash every object; returns {digest: size} of the good ones and appends the bad ones to `doomed`."""
    good: dict[str, int] = {}
    items = list(store.scan_objects())
    for done, found in enumerate(items, 1):
        status = _verify_object(store, report, doomed, good, found)
        if progress is not None:
            progress(done, len(items), status)
    return good


def _verify_object(store: Store, report: VerifyReport, doomed: list[Found], good: dict[str, int],
                   found: Found) -> str:
    """Check one scanned object; returns "ok", or what is wrong with it."""
    if found.kind == "unexpected":
        report.unexpected.append(shown(found.where))
        return "ok"
    if found.kind == "symlink":
        report.symlinks.append(shown(found.where))
        doomed.append(found)
        return f"symlink {shown(found.where)}"
    hashed = store.hash_object(found.name)
    if hashed is None:  # removed since the scan (a gc): nothing to check
        return "ok"
    report.objects_checked += 1
    actual, size = hashed
    if actual == found.name:
        good[found.name] = size
        return "ok"
    report.bad_objects.append((found.name, actual))
    doomed.append(found)
    return f"corrupt {found.name}"


class _States:
    """"ok", "missing" or "corrupt" per (digest, size), from the object pass where it saw the object, else by
    hashing it once (an object many entries need, such as the 43 MB CuTe runtime, is hashed once)."""

    def __init__(self, store: Store, good: dict[str, int]) -> None:
        self.store, self.good = store, good
        self._seen: dict[tuple[str, int | None], str] = {}

    def __call__(self, digest: str, size: int | None = None) -> str:
        if digest in self.good:
            return "ok" if size is None or self.good[digest] == size else "corrupt"
        if (digest, size) not in self._seen:
            self._seen[digest, size] = self.store.object_state(digest, size)  # StoreError for a symlink
        return self._seen[digest, size]


def _verify_entries(store: Store, report: VerifyReport, states: _States, repair: bool) -> list[Found]:
    doomed = []
    for found in store.scan_index():
        if found.kind == "unexpected":
            report.unexpected.append(shown(found.where))
            continue
        if found.kind == "symlink":
            report.symlinks.append(shown(found.where))
            doomed.append(found)
            continue
        report.entries_checked += 1
        entry, problem = _entry_problem(store, found.name, states)
        if problem == "dangling":
            report.dangling_entries.append(found.name)
        elif problem:
            report.bad_entries.append((shown(found.where), problem))
        if problem:
            doomed.append(found)
        elif entry is not None:
            _check_libraries(store, entry, states, report, repair)
    return doomed


def _entry_problem(store: Store, kernel_key: str, states: _States) -> tuple[Entry | None, str | None]:
    """(the entry, None) for an entry whose object is sound, (entry, "dangling") when its object is absent,
    else (entry or None, why it cannot be served)."""
    try:
        entry = store.get_entry(kernel_key)
        if entry is None:  # removed since the scan
            return None, None
        state = states(entry.object_digest, entry.size)
    except StoreError as e:
        return None, str(e)
    if state == "missing":
        return entry, "dangling"
    if state == "corrupt":
        return entry, f"its object {entry.object_digest} is corrupt or not {entry.size} bytes"
    return entry, None


def _check_libraries(store: Store, entry: Entry, states: _States, report: VerifyReport, repair: bool) -> None:
    """Report each host arch whose linked library or a runtime library it needs is absent or corrupt; with
    `repair`, drop those arches from the entry (under the key's lock, as compile.lean.relink writes it)."""
    broken = {}
    for arch in sorted(entry.shared_libs):
        try:
            bad = [f"{d} {s}" for d, size in entry.lib_digests(arch).items() if (s := states(d, size)) != "ok"]
        except StoreError as e:  # a symlink in an object's place (reported by the object pass)
            bad = [str(e)]
        except (KeyError, TypeError, AttributeError):
            bad = ["malformed shared_libs"]
        if bad:
            broken[arch] = entry.shared_libs[arch]
            report.broken_libraries.append((entry.kernel_key, arch, "; ".join(bad)))
    if repair and broken:
        with store.lock(entry.kernel_key):
            now = store.get_entry(entry.kernel_key)
            if now is None:
                return
            keep = {a: lib for a, lib in now.shared_libs.items() if broken.get(a) != lib}
            if keep != now.shared_libs:
                store.put_entry(dataclasses.replace(now, shared_libs=keep))
                report.unlinked += [f"{entry.kernel_key} {a}" for a in sorted(set(now.shared_libs) - set(keep))]


TEMP_MAX_AGE = 6 * 3600.0  # seconds a temp file may go unwritten before gc takes its writer for stuck
GC_LOCK_WAIT = 5.0  # seconds gc waits for an object's lock; an object in use that long is left for next time
_GC_BATCH = 128  # objects locked at once


def gc(store: Store, dry_run: bool = False, min_age: float = 0.0) -> GcReport:
    """Remove objects that no entry references and are older than `min_age` seconds, and temp files left by
    writers that are gone (see stale_temp_file). A builder writes an object before its entry, so a gc
    concurrent with builds needs a min_age longer than one compile (the CLI defaults to an hour). An object
    goes only under its lock, after the entries are read again (Store.put_entry writes under the same lock),
    so a writer that re-uses an old object cannot be left with an entry naming nothing. Entries are read only
    when some object is old enough to go, so temp files are cleared even when an entry is unreadable (which
    stops object removal with StoreError). Leaves quarantine/ alone."""
    report = GcReport()
    cutoff = time.time() - min_age
    old = [f.name for f in store.scan_objects() if f.kind == "file" and (store.object_mtime(f.name) or cutoff + 1)
           <= cutoff]
    if old:
        live = {d for e in store.entries() for d in e.digests()}
        doomed = [d for d in old if d not in live]
        if dry_run:  # nothing is removed, so nothing is locked (or created)
            report.removed_objects = doomed
            report.bytes_freed = sum(store.object_size(d) or 0 for d in doomed)
            doomed = []
        for i in range(0, len(doomed), _GC_BATCH):
            _remove_unreferenced(store, doomed[i:i + _GC_BATCH], cutoff, report)
    now = time.time()
    for where, pid, mtime in store.temp_files():
        if stale_temp_file(pid, mtime, now):
            report.removed_temp_files += 1
            if not dry_run:
                store.remove_temp_file(where)
    return report


def _remove_unreferenced(store: Store, digests: list[str], cutoff: float, report: GcReport) -> None:
    with ExitStack() as locks:
        held = []
        for digest in digests:
            try:
                locks.enter_context(store.lock(digest, timeout=GC_LOCK_WAIT))
                held.append(digest)
            except StoreError:  # a writer holds it: the object is in use, leave it
                continue
        live = {d for e in store.entries() for d in e.digests()}  # again, now that no writer can add one for these
        for digest in held:
            mtime = store.object_mtime(digest)
            if digest in live or mtime is None or mtime > cutoff:
                continue
            report.removed_objects.append(digest)
            report.bytes_freed += store.object_size(digest) or 0
            store.remove_object(digest)


def stale_temp_file(pid: int | None, mtime: float, now: float) -> bool:
    """Whether a writer's temp file (its writer's pid from its name, its last change) is left over: no pid,
    the pid is not running, the process holding that pid started after the file last changed (the pid was
    reused: e.g. a server that is PID 1 in its container, restarted), or nothing wrote it for TEMP_MAX_AGE."""
    if pid is None or now - mtime > TEMP_MAX_AGE:
        return True
    started = _process_start(pid)
    return started is None or started > mtime + 1.0  # /proc's boot time has whole seconds


def _process_start(pid: int) -> float | None:
    """When process `pid` started (epoch seconds), from /proc; None when it is not running. Where /proc cannot
    tell (another OS), a live pid counts as started long ago."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        with open("/proc/stat", "rb") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith(b"btime "))
    except (OSError, StopIteration, IndexError, ValueError):
        return 0.0
    return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
