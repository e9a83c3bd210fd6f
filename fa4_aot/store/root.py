"""The store's root: its layout, the trust check of its folders, and the only ways to write, open, look at, list
and unlink below it, every one level by level with no link followed (beneath.py). The other parts of the Store
(objects.py, index.py, side.py, upkeep.py) build on these and never touch the file system otherwise."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from ..errors import StoreError
from .atomic import TMP_SUFFIX, atomic_write
from .beneath import lstat_beneath, open_beneath, open_dir_beneath
from .folders import DIR_MODE, FILE_MODE, check_folder, make_dirs
from .fs_errors import refuse_symlink
from .locking import FileLock

HEX64 = re.compile(r"[0-9a-f]{64}")
_FANOUT = re.compile(r"[0-9a-f]{2}")
_SKU_NAME = re.compile(r"[a-z0-9-]+")
QUARANTINE = "quarantine"
_FOLDERS = ("objects", "index", "misses", "locks", "manifests", "recipes", "verdicts", "known-bad")
SHARED_DIR_MODE, SHARED_FILE_MODE = 0o2770, 0o640


def holds_store(folder: Path) -> bool:
    """Whether `folder` may be a store: it exists and holds one of the store's own folders, the server's
    database, or nothing but a README (an empty folder, the checkout's cache/ before its first build). A folder of
    other things (a mistyped --cache-dir such as docs/) is no store. Reads only the folder's names."""
    try:
        names = set(os.listdir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return False
    return bool(names & {*_FOLDERS, QUARANTINE, "fa4-aot.db"}) or names <= {"README.md"}


def check_hex(value: str, what: str = "digest") -> str:
    """Return `value` if it is 64 lowercase hex digits; raise StoreError otherwise (before any path is built)."""
    if not isinstance(value, str) or not HEX64.fullmatch(value):
        raise StoreError(f"invalid {what} {value!r}: expected 64 lowercase hex digits")
    return value


def _check_sku(name: str) -> str:
    if not isinstance(name, str) or not _SKU_NAME.fullmatch(name):
        raise StoreError(f"invalid SKU name {name!r}: expected lowercase letters, digits and '-'")
    return name


@dataclass(frozen=True)
class Found:
    """One thing a Store scan (scan_objects, scan_index, scan_recipes) met: kind "file" (name: its digest or kernel
    key), "symlink" (never followed) or "unexpected" (a name no reader opens, e.g. not hex or not a regular file);
    `where` is its path under the root. Names that are not UTF-8 come through (surrogate-escaped) as "unexpected"."""

    kind: str
    name: str
    where: str


class Root:
    """A store root (see the package): where it is, its modes, and the checked primitives below it."""

    def __init__(self, root: Path, *, shared: bool | None = None) -> None:
        self.root = Path(root).resolve()  # a symlinked root is fine: resolved once, nothing below it is
        self.shared = os.environ.get("FA4_AOT_SHARED_CACHE") == "1" if shared is None else shared
        self.dir_mode, self.file_mode = (SHARED_DIR_MODE, SHARED_FILE_MODE) if self.shared else (DIR_MODE, FILE_MODE)
        self._checked = False

    def check_root(self) -> None:
        """Raise StoreError (naming the folder, its owner or mode, and the chmod/chown or FA4_AOT_CACHE fix)
        unless the root and objects/, index/, misses/, locks/ are folders only this user can change (see the
        module). Runs once per instance; a root that does not exist yet passes and is checked when it does."""
        if self._checked:
            return
        try:
            check_folder(self.root, os.stat(self.root), shared=self.shared)
        except FileNotFoundError:
            return
        for name in _FOLDERS:
            try:
                st = os.lstat(self.root / name)
            except FileNotFoundError:
                continue
            if stat.S_ISLNK(st.st_mode):
                raise refuse_symlink(self.root / name)
            check_folder(self.root / name, st, shared=self.shared)
        self._checked = True

    def ready(self, *, create: bool = False) -> bool:
        """Whether the root exists (with `create`, made owner-only first), after check_root passed."""
        if create and not self.root.exists():
            make_dirs(self.root, self.dir_mode)
        self.check_root()
        return self._checked

    def lock(self, name: str, timeout: float = 600.0) -> FileLock:
        path = self.root / "locks" / check_hex(name, "lock name")
        self.ready(create=True)
        return FileLock(path, timeout=timeout, root=self.root, mode=self.file_mode, dir_mode=self.dir_mode)

    def _write(self, path: Path, data: bytes | Iterable[bytes]) -> None:
        self.ready(create=True)
        self._is_file(path)  # a symlink there is refused, not silently replaced: someone put it there
        atomic_write(path, data, root=self.root, mode=self.file_mode, dir_mode=self.dir_mode)

    def _open(self, path: Path) -> IO[bytes]:
        """`path` (below the root) open for reading, no link followed; FileNotFoundError when absent."""
        if not self.ready():
            raise FileNotFoundError(path)
        return os.fdopen(open_beneath(self.root, path.relative_to(self.root).parts), "rb")

    def _is_file(self, path: Path) -> bool:
        st = lstat_beneath(self.root, path.relative_to(self.root).parts) if self.ready() else None
        if st is not None and stat.S_ISLNK(st.st_mode):
            raise refuse_symlink(path)
        return st is not None and stat.S_ISREG(st.st_mode)

    def _unlink(self, parts: tuple[str, ...]) -> None:
        try:
            folder = open_dir_beneath(self.root, parts[:-1])
        except FileNotFoundError:
            return
        try:
            os.unlink(parts[-1], dir_fd=folder)
        except FileNotFoundError:
            pass
        finally:
            os.close(folder)

    def _scan(self, folder: str) -> Iterator[Found]:
        """Everything in the fan-out folder `folder` ("objects", "index" or "recipes"), in name order, following no
        link (see Found). Writers' temp files are passed over. Nothing when the store or the folder does not exist."""
        st = lstat_beneath(self.root, (folder,)) if self.ready() else None
        if st is not None and stat.S_ISDIR(st.st_mode):  # check_root refused a symlink there already
            yield from _scan_fanout(self.root, folder, "" if folder == "objects" else ".json")


def _scan_fanout(root: Path, folder: str, suffix: str) -> Iterator[Found]:
    for top in sorted(os.scandir(root / folder), key=lambda e: e.name):
        where = f"{folder}/{top.name}"
        if top.is_symlink():
            yield Found("symlink", top.name, where)
        elif not top.is_dir(follow_symlinks=False) or not _FANOUT.fullmatch(top.name):
            yield Found("unexpected", top.name, where)
        else:
            for item in sorted(os.scandir(top.path), key=lambda e: e.name):
                if item.name.startswith(".") and item.name.endswith(TMP_SUFFIX):
                    continue
                name = item.name.removesuffix(suffix) if suffix else top.name + item.name
                yield Found(_kind(item, name, top.name, suffix), name, f"{where}/{item.name}")


def _kind(item: os.DirEntry[str], name: str, fanout: str, suffix: str) -> str:
    if item.is_symlink():
        return "symlink"
    good = item.name.endswith(suffix) and HEX64.fullmatch(name) and name.startswith(fanout)
    return "file" if good and item.is_file(follow_symlinks=False) else "unexpected"


def _listdir_beneath(root: Path, parts: tuple[str, ...]) -> list[str]:
    fd = open_dir_beneath(root, parts)
    try:
        return os.listdir(fd)
    finally:
        os.close(fd)

