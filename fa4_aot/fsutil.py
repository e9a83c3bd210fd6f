"""The one way fa4-aot writes files (atomic_write) and the one way it serialises work (FileLock)."""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
import time
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

from .errors import StoreError

TMP_SUFFIX = ".tmp"


def atomic_write(path: Path, data: bytes | Iterable[bytes]) -> None:
    """Write `data` to `path` so that readers see either the old file or the whole new one.

    A unique temp file beside the target (same filesystem), fsync, os.replace, fsync of the folder;
    the temp file is removed in `finally`, so a failed write leaves nothing behind. A process killed
    mid-write leaves only a `.*.tmp` file, which no reader ever opens and `fa4-aot gc` removes.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}{TMP_SUFFIX}"
    chunks = [data] if isinstance(data, bytes | bytearray | memoryview) else data
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as e:  # some filesystems refuse fsync on a folder; the rename already happened
        if e.errno not in (errno.EINVAL, errno.EBADF):
            raise
    finally:
        os.close(fd)


class FileLock:
    """An exclusive advisory lock on `path` (fcntl.flock), for avoiding duplicate work across processes.

    Correctness never depends on it (writes are atomic renames); it only keeps two processes from doing
    the same compile or download at once. Waits up to `timeout` seconds, then raises StoreError naming
    the lock file, which can be removed safely if no fa4-aot process is running.
    """

    def __init__(self, path: Path, timeout: float = 600.0) -> None:
        self.path = path
        self.timeout = timeout
        self._fd: int | None = None

    def __enter__(self) -> FileLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
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
