"""What maintenance (store/maintenance.py: verify, gc; store/prune.py) asks of the store: every file it holds as
Found items, an object's actual hash and age, removing objects and writers' dead temp files, and moving what is
wrong to quarantine/<time>/. Maintenance decides what is wrong; this part only looks and moves, no link followed."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from ..errors import StoreError
from .atomic import TMP_SUFFIX
from .beneath import lstat_beneath, move_beneath, open_dir_beneath
from .fs_errors import shown
from .hashing import hash_stream
from .objects import Objects
from .root import QUARANTINE, Found


class Upkeep(Objects):
    """The Store's maintenance-facing part (see the module)."""

    def scan_objects(self) -> Iterator[Found]:
        """Everything under objects/ (see Found), in name order, no link followed; temp files passed over."""
        return self._scan("objects")

    def scan_index(self) -> Iterator[Found]:
        """Everything under index/ (see Found), in name order, no link followed; temp files passed over."""
        return self._scan("index")

    def scan_recipes(self) -> Iterator[Found]:
        """Everything under recipes/ (see Found), in name order, no link followed; temp files passed over."""
        return self._scan("recipes")

    def hash_object(self, digest: str) -> tuple[str, int] | None:
        """(sha256, size) of the bytes stored as `digest`, whatever they are; None when the file is gone."""
        try:
            with self._open(self.object_path(digest)) as f:
                return hash_stream(f).hexdigest(), os.fstat(f.fileno()).st_size
        except FileNotFoundError:
            return None

    def object_mtime(self, digest: str) -> float | None:
        path = self.object_path(digest)
        st = lstat_beneath(self.root, path.relative_to(self.root).parts) if self.ready() else None
        return None if st is None else st.st_mtime

    def remove_object(self, digest: str) -> None:
        """Unlink the object's file (no link followed); nothing when it is already gone."""
        self._unlink(self.object_path(digest).relative_to(self.root).parts)

    def quarantine(self, found: Iterable[Found]) -> tuple[str, dict[str, str]]:
        """Move each scanned item (a symlink as the link itself) to quarantine/<time>/<same relative path>.
        Returns the new folder and {path under the root: where it went}; items gone meanwhile are passed over."""
        stamp = self._new_quarantine_dir()
        moved = {}
        for item in found:
            parts = Path(item.where).parts
            try:
                move_beneath(self.root, parts, (QUARANTINE, stamp, *parts), dir_mode=self.dir_mode)
            except FileNotFoundError:  # gone meanwhile (another verify, a gc): nothing left to move
                continue
            moved[shown(item.where)] = shown(self.root / QUARANTINE / stamp / item.where)
        return str(self.root / QUARANTINE / stamp), moved

    def temp_files(self) -> Iterator[tuple[str, int | None, float]]:
        """(path under the root, writer pid, last modified) of every writer's temp file outside quarantine/,
        following no link."""
        if not self.ready():
            return
        for folder, dirs, files in os.walk(self.root):  # os.walk never descends into symlinked folders
            if Path(folder) == self.root:
                dirs[:] = [d for d in dirs if d != QUARANTINE]
            for name in files:
                if name.startswith(".") and name.endswith(TMP_SUFFIX):
                    where = Path(folder, name).relative_to(self.root)
                    st = lstat_beneath(self.root, where.parts)
                    if st is not None:
                        yield str(where), _pid_of(name), st.st_mtime

    def remove_temp_file(self, where: str) -> None:
        """Unlink a temp file that temp_files() named (refuses any other name)."""
        parts = Path(where).parts
        if not parts or not (parts[-1].startswith(".") and parts[-1].endswith(TMP_SUFFIX)) or ".." in parts:
            raise StoreError(f"{where!r} is not a writer's temp file under {self.root}")
        self._unlink(parts)

    def _new_quarantine_dir(self) -> str:
        base = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        folder = open_dir_beneath(self.root, (QUARANTINE,), create_mode=self.dir_mode)
        try:
            for n in range(1000):
                stamp = base if n == 0 else f"{base}-{n}"
                try:
                    os.mkdir(stamp, self.dir_mode, dir_fd=folder)
                    return stamp
                except FileExistsError:
                    continue
        finally:
            os.close(folder)
        raise StoreError(f"could not create a fresh folder under {self.root / QUARANTINE}; clear it out")


def _pid_of(name: str) -> int | None:
    parts = name.split(".")  # .<name>.<pid>.<rand>.tmp
    try:
        return int(parts[-3])
    except (IndexError, ValueError):
        return None

