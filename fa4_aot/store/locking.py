"""The one way fa4-aot serialises work across processes (FileLock): an advisory lock that keeps two processes
from doing the same compile or download at once, never what keeps the store correct (renames do that)."""

from __future__ import annotations

import errno
import fcntl
import os
import time
from pathlib import Path
from types import TracebackType

from ..errors import StoreError
from .beneath import NOFOLLOW, open_at, open_dir_beneath
from .folders import DIR_MODE, FILE_MODE, make_dirs
from .fs_errors import DISK_FULL, disk_full, refuse_symlink


class FileLock:
    """An exclusive advisory lock on `path` (fcntl.flock), for avoiding duplicate work across processes.

    Correctness never depends on it (writes are atomic renames); it only keeps two processes from doing
    the same compile or download at once. Waits up to `timeout` seconds, then raises StoreError naming
    the lock file, which can be removed safely if no fa4-aot process is running. With `root`, no link
    below it is followed (as in atomic_write).
    """

    def __init__(self, path: Path, timeout: float = 600.0, *, root: Path | None = None, mode: int = FILE_MODE,
                 dir_mode: int = DIR_MODE) -> None:
        self.path = path
        self.timeout = timeout
        self.root = root
        self.mode = mode
        self.dir_mode = dir_mode
        self._fd: int | None = None

    def _open(self) -> int:
        try:
            if self.root is None:
                make_dirs(self.path.parent, self.dir_mode)
                return os.open(self.path, os.O_RDWR | os.O_CREAT | NOFOLLOW, self.mode)
            parts = self.path.relative_to(self.root).parts
            folder = open_dir_beneath(self.root, parts[:-1], create_mode=self.dir_mode)
            try:
                return open_at(folder, parts[-1], os.O_RDWR | os.O_CREAT | NOFOLLOW, self.mode, self.path)
            finally:
                os.close(folder)
        except OSError as e:
            if e.errno in DISK_FULL:
                raise disk_full(self.path, e) from e
            if e.errno == errno.ELOOP:
                raise refuse_symlink(self.path) from None
            raise

    def __enter__(self) -> FileLock:
        fd = self._open()
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise StoreError(
                        f"timed out after {self.timeout:g}s waiting for lock {self.path}; "
                        "another fa4-aot process holds it (if none is running, delete the file)"
                    ) from None
                time.sleep(0.05)
        self._fd = fd
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
