"""Keeping a store healthy: `verify` (re-hash, check entries, quarantine what fails) and `gc` (unreferenced
objects, dead writers' temp files). Store.verify and Store.gc are the entry points; nothing here follows a link
below the store root."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import StoreError
from .fsutil import TMP_SUFFIX, move_beneath, open_dir_beneath, sha256_file, shown

if TYPE_CHECKING:
    from .store import Store

_HEX64 = re.compile(r"[0-9a-f]{64}")
_FANOUT = re.compile(r"[0-9a-f]{2}")
QUARANTINE = "quarantine"


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


def scan_fanout(folder: Path, suffix: str) -> Iterator[tuple[str, Path, str]]:
    """(kind, path, name) for everything in the fan-out folders of objects/ (suffix "") or index/ (".json"), in
    order, following no link: kind "file" with its store name (digest or kernel key), "symlink", or
    "unexpected" (a name no reader opens, e.g. not hex or not a regular file). Writers' temp files are skipped.
    Names that are not UTF-8 come through (surrogate-escaped) as "unexpected"."""
    if folder.is_symlink() or not folder.is_dir():
        return
    for top in sorted(os.scandir(folder), key=lambda e: e.name):
        if top.is_symlink():
            yield "symlink", Path(top.path), top.name
        elif not top.is_dir(follow_symlinks=False) or not _FANOUT.fullmatch(top.name):
            yield "unexpected", Path(top.path), top.name
        else:
            for item in sorted(os.scandir(top.path), key=lambda e: e.name):
                if item.name.startswith(".") and item.name.endswith(TMP_SUFFIX):
                    continue
                yield _kind(item, top.name, suffix), Path(item.path), _name(item.name, top.name, suffix)


def _name(file_name: str, fanout: str, suffix: str) -> str:
    return file_name.removesuffix(suffix) if suffix else fanout + file_name


def _kind(item: os.DirEntry[str], fanout: str, suffix: str) -> str:
    if item.is_symlink():
        return "symlink"
    name = _name(item.name, fanout, suffix)
    good = item.name.endswith(suffix) and _HEX64.fullmatch(name) and name.startswith(fanout)
    return "file" if good and item.is_file(follow_symlinks=False) else "unexpected"


def verify(store: Store, quarantine: bool = False) -> VerifyReport:
    """See Store.verify. Entries whose object was not seen in the object pass (a build running meanwhile) are
    checked against the object directly, so a concurrent build's fresh entry is never taken for dangling."""
    report, doomed = VerifyReport(), list[Path]()
    if not store.ready():
        return report
    good = _verify_objects(store, report, doomed)
    doomed[:0] = _verify_entries(store, report, good)
    if quarantine and doomed:
        _quarantine(store, doomed, report)
    return report


def _rel(store: Store, path: Path) -> str:
    return shown(path.relative_to(store.root))


def _verify_objects(store: Store, report: VerifyReport, doomed: list[Path]) -> dict[str, int]:
    """Hash every object; returns {digest: size} of the good ones and appends the bad ones to `doomed`."""
    good = {}
    for kind, path, name in scan_fanout(store.root / "objects", ""):
        if kind == "unexpected":
            report.unexpected.append(_rel(store, path))
            continue
        if kind == "symlink":
            report.symlinks.append(_rel(store, path))
        else:
            try:
                actual = sha256_file(path)
            except FileNotFoundError:  # removed since the scan (a gc): nothing to check
                continue
            report.objects_checked += 1
            if actual == name:
                good[name] = path.lstat().st_size
                continue
            report.bad_objects.append((name, actual))
        doomed.append(path)
    return good


def _verify_entries(store: Store, report: VerifyReport, good: dict[str, int]) -> list[Path]:
    doomed = []
    for kind, path, name in scan_fanout(store.root / "index", ".json"):
        if kind == "unexpected":
            report.unexpected.append(_rel(store, path))
            continue
        if kind == "symlink":
            report.symlinks.append(_rel(store, path))
            doomed.append(path)
            continue
        report.entries_checked += 1
        problem = _entry_problem(store, name, good)
        if problem == "dangling":
            report.dangling_entries.append(name)
        elif problem:
            report.bad_entries.append((_rel(store, path), problem))
        if problem:
            doomed.append(path)
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


def _quarantine(store: Store, doomed: list[Path], report: VerifyReport) -> None:
    """Move `doomed` (entries first) to quarantine/<time>/<same relative path>, recording where each went."""
    stamp = _new_quarantine_dir(store)
    report.quarantine_dir = str(store.root / QUARANTINE / stamp)
    for path in dict.fromkeys(doomed):
        parts = path.relative_to(store.root).parts
        try:
            move_beneath(store.root, parts, (QUARANTINE, stamp, *parts), dir_mode=store.dir_mode)
        except FileNotFoundError:  # gone meanwhile (another verify, a gc): nothing left to move
            continue
        report.quarantined[_rel(store, path)] = shown(store.root / QUARANTINE / stamp / Path(*parts))


def _new_quarantine_dir(store: Store) -> str:
    base = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    folder = open_dir_beneath(store.root, (QUARANTINE,), create_mode=store.dir_mode)
    try:
        for n in range(1000):
            stamp = base if n == 0 else f"{base}-{n}"
            try:
                os.mkdir(stamp, store.dir_mode, dir_fd=folder)
                return stamp
            except FileExistsError:
                continue
    finally:
        os.close(folder)
    raise StoreError(f"could not create a fresh folder under {store.root / QUARANTINE}; clear it out")


def gc(store: Store, dry_run: bool = False, min_age: float = 0.0) -> GcReport:
    """See Store.gc."""
    report = GcReport()
    if not store.ready():
        return report
    cutoff, live = time.time() - min_age, None
    for kind, path, name in scan_fanout(store.root / "objects", ""):
        if kind != "file" or path.lstat().st_mtime > cutoff:
            continue
        live = {d for e in store.entries() for d in e.digests()} if live is None else live
        if name not in live:
            report.removed_objects.append(name)
            report.bytes_freed += path.lstat().st_size
            if not dry_run:
                path.unlink()
    for tmp in _temp_files(store.root):
        if not _alive(_pid_of(tmp)):
            report.removed_temp_files += 1
            if not dry_run:
                tmp.unlink(missing_ok=True)
    return report


def _temp_files(root: Path) -> Iterator[Path]:
    for folder, dirs, files in os.walk(root):  # os.walk never descends into symlinked folders
        if Path(folder) == root:
            dirs[:] = [d for d in dirs if d != QUARANTINE]
        for name in files:
            if name.startswith(".") and name.endswith(TMP_SUFFIX):
                yield Path(folder) / name


def _pid_of(tmp: Path) -> int | None:
    parts = tmp.name.split(".")  # .<name>.<pid>.<rand>.tmp
    try:
        return int(parts[-3])
    except (IndexError, ValueError):
        return None


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
