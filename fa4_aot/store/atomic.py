"""The one way fa4-aot writes a file (atomic_write, AtomicFile): a temp file beside the target, then a rename,
so a reader sees the old file or the whole new one and a failed write leaves nothing behind."""

from __future__ import annotations

import errno
import os
import secrets
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import IO

from .beneath import NOFOLLOW, open_dir_beneath
from .folders import DIR_MODE, FILE_MODE, make_dirs
from .fs_errors import DISK_FULL, disk_full

TMP_SUFFIX = ".tmp"


def atomic_write(path: Path, data: bytes | Iterable[bytes], *, root: Path | None = None, mode: int = FILE_MODE,
                 dir_mode: int = DIR_MODE) -> None:
    """Write `data` to `path` so that readers see either the old file or the whole new one (see AtomicFile,
    which this is the one-call form of). Running out of space raises DiskFull."""
    chunks = [data] if isinstance(data, bytes | bytearray | memoryview) else data
    with AtomicFile(path, root=root, mode=mode, dir_mode=dir_mode) as f, f.disk_full():
        for chunk in chunks:
            f.write(chunk)
        f.commit()


class AtomicFile:
    """The one way fa4-aot writes a file: `with AtomicFile(path) as f: f.write(...); f.commit()`.

    A unique temp file beside the target (`.<name>.<pid>.<rand>.tmp`, same filesystem, O_EXCL|O_NOFOLLOW),
    fsync, os.replace, fsync of the folder on commit(); leaving the block without commit() (an exception, a
    rejected upload) removes the temp file, so a failed write leaves nothing behind. A process killed mid-write
    leaves only a `.*.tmp` file, which no reader ever opens and `fa4-aot gc` removes. The file gets exactly
    `mode`; missing folders get `dir_mode`. With `root` (a store root above `path`), no link below it is
    followed, and a symlinked folder raises StoreError. Running out of space raises DiskFull.
    """

    def __init__(self, path: Path, *, root: Path | None = None, mode: int = FILE_MODE, dir_mode: int = DIR_MODE
                 ) -> None:
        self.path, self.root, self.mode, self.dir_mode = path, root, mode, dir_mode
        self.tmp = f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}{TMP_SUFFIX}"
        self._folder: int | None = None
        self._file: IO[bytes] | None = None

    def __enter__(self) -> AtomicFile:
        with self.disk_full():
            if self.root is None:
                make_dirs(self.path.parent, self.dir_mode)
                self._folder = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            else:
                parts = self.path.parent.relative_to(self.root).parts
                self._folder = open_dir_beneath(self.root, parts, create_mode=self.dir_mode)
            try:
                fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, self.mode,
                             dir_fd=self._folder)
                os.fchmod(fd, self.mode)  # exactly `mode`, whatever the umask
            except BaseException:
                os.close(self._folder)
                raise
            self._file = os.fdopen(fd, "wb")
        return self

    def write(self, chunk: bytes | bytearray | memoryview) -> None:
        assert self._file is not None, "AtomicFile.write outside its with block"
        with self.disk_full():
            self._file.write(chunk)

    def commit(self) -> None:
        """Make the written bytes the file at `path` (fsync, rename, fsync of the folder)."""
        assert self._file is not None and self._folder is not None, "AtomicFile.commit outside its with block"
        with self.disk_full():
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            os.replace(self.tmp, self.path.name, src_dir_fd=self._folder, dst_dir_fd=self._folder)
            _fsync_dir(self._folder)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        assert self._file is not None and self._folder is not None
        try:
            with self.disk_full():
                self._file.close()  # after a failure, flushing what is buffered can itself run out of space
        finally:
            try:
                os.unlink(self.tmp, dir_fd=self._folder)  # gone after commit(); left by a failed write
            except FileNotFoundError:
                pass
            os.close(self._folder)

    @contextmanager
    def disk_full(self) -> Iterator[None]:
        """Turn ENOSPC, EFBIG or EDQUOT raised inside it (by a write, or by the bytes' source) into DiskFull."""
        try:
            yield
        except OSError as e:
            if e.errno in DISK_FULL:
                raise disk_full(self.path, e) from e
            raise


def _fsync_dir(folder: int) -> None:
    try:
        os.fsync(folder)
    except OSError as e:  # some filesystems refuse fsync on a folder; the rename already happened
        if e.errno not in (errno.EINVAL, errno.EBADF):
            raise
