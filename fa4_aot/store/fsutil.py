"""The one way fa4-aot writes files (atomic_write), the one way it opens files inside a store without following
links (open_beneath), and the one way it serialises work (FileLock)."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import pwd
import secrets
import stat
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import IO

from ..errors import DiskFull, StoreError

TMP_SUFFIX = ".tmp"
FILE_MODE = 0o600  # owner-only: nobody else can swap the bytes a client loads
DIR_MODE = 0o700
_DISK_FULL = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT}
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    """sha256 of the file at `path`; refuses (StoreError) to follow a symlink there."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise refuse_symlink(path) from None
        raise
    with os.fdopen(fd, "rb") as f:
        return hash_stream(f).hexdigest()


def hash_stream(f: IO[bytes], keep: list[bytes] | None = None) -> hashlib._Hash:
    """The sha256 object of everything left in `f`; appends the chunks to `keep` when given."""
    h = hashlib.sha256()
    while chunk := f.read(_CHUNK):
        h.update(chunk)
        if keep is not None:
            keep.append(chunk)
    return h


def shown(path: Path | str) -> str:
    """A path for messages: undecodable bytes in file names shown as \\x.. escapes, never a crash."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def disk_full(path: Path, e: OSError) -> DiskFull:
    return DiskFull(f"no space left writing {path} ({os.strerror(e.errno or 0)}); nothing partial was kept: "
                    "free space there, or point FA4_AOT_CACHE (--cache-dir) at a larger disk, and run it again")


def make_dirs(folder: Path, mode: int = DIR_MODE) -> None:
    """Create `folder` and any missing parents, each new one with exactly `mode` (umask does not widen or
    narrow it); existing folders are left as they are. DiskFull when there is no room for a folder."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        if folder.parent == folder:
            break
        folder = folder.parent
    for new in reversed(missing):
        try:
            os.mkdir(new, mode)
        except FileExistsError:
            continue
        except OSError as e:
            if e.errno in _DISK_FULL:
                raise disk_full(new, e) from e
            raise
        os.chmod(new, mode)


def check_folder(path: Path, st: os.stat_result, *, shared: bool) -> None:
    """Raise StoreError unless folder `path` (its stat `st`) can only be changed by this user (or root): owned
    by the effective uid or root, and writable by neither group nor others. With `shared` (a node-shared cache
    owned by a service account), any owner and group write are allowed; world write never is."""
    me, mode = os.geteuid(), stat.S_IMODE(st.st_mode)
    elsewhere = "or point FA4_AOT_CACHE (--cache-dir) at a folder of your own"
    if not stat.S_ISDIR(st.st_mode):
        raise StoreError(f"store folder {path} is not a folder; move it away, {elsewhere}")
    if st.st_uid not in (me, 0) and not shared:
        raise StoreError(
            f"store folder {path} is owned by uid {st.st_uid}{_user(st.st_uid)}, not by you (uid {me}{_user(me)}): "
            f"its owner could swap the kernels this process loads; fix: `chown -R {me} {path}`, {elsewhere}, or "
            "set FA4_AOT_SHARED_CACHE=1 if it is a node-shared cache run by a service account")
    if mode & stat.S_IWOTH or (mode & stat.S_IWGRP and not shared):
        who = "everyone" if mode & stat.S_IWOTH else f"group {st.st_gid}"
        shared_fix = "" if mode & stat.S_IWOTH else ", or set FA4_AOT_SHARED_CACHE=1 for a node-shared cache"
        raise StoreError(f"store folder {path} has mode {mode:04o}, writable by {who}: they could swap the kernels "
                         f"this process loads; fix: `chmod go-w {path}`, {elsewhere}{shared_fix}")


def _user(uid: int) -> str:
    try:
        return f" ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return ""


def open_dir_beneath(root: Path, parts: Sequence[str], *, create_mode: int | None = None) -> int:
    """An fd for the folder `root/parts...`, opening every level below `root` with O_NOFOLLOW, so no link
    below the root is followed and nothing can swap a level between the check and the open.

    Missing levels raise FileNotFoundError, or are created with `create_mode` when given. A level that is a
    symlink or not a folder raises StoreError naming it. The caller closes the fd.
    """
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    top = os.fstat(fd)
    try:
        for i, part in enumerate(parts):
            created = False
            if create_mode is not None:
                try:
                    os.mkdir(part, create_mode, dir_fd=fd)
                    created = True
                except FileExistsError:
                    pass
            child = _open_at(fd, part, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW, 0, root.joinpath(*parts[: i + 1]))
            os.close(fd)
            fd = child
            if created:
                os.fchmod(fd, create_mode)  # type: ignore[arg-type]  # exactly the mode, whatever the umask
            _check_level(root.joinpath(*parts[: i + 1]), os.fstat(fd), top)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_level(path: Path, st: os.stat_result, top: os.stat_result) -> None:
    """A folder below a store root may be changed by no one the root itself does not let change it: owned by
    the root's owner (or root), never world-writable, group-writable only where the root is (a shared cache).
    Otherwise another user could redirect what the store reads through it (e.g. an index fan-out folder)."""
    mode, top_mode = stat.S_IMODE(st.st_mode), stat.S_IMODE(top.st_mode)
    foreign = st.st_uid not in (top.st_uid, 0)
    loose = mode & stat.S_IWOTH or (mode & stat.S_IWGRP and not (top_mode & stat.S_IWGRP and st.st_gid == top.st_gid))
    if foreign or loose:
        raise StoreError(f"store folder {path} (owner uid {st.st_uid}, mode {mode:04o}) can be changed by users "
                         f"the store root (owner uid {top.st_uid}, mode {top_mode:04o}) does not trust, who could "
                         f"redirect what is read through it; fix: `chown {top.st_uid} {path} && chmod go-w {path}`, "
                         "or run `fa4-aot verify` and rebuild what it held")


def open_beneath(root: Path, parts: Sequence[str], flags: int = os.O_RDONLY, mode: int = FILE_MODE) -> int:
    """An fd for the file `root/parts...` opened with `flags`, following no link below `root` (the file
    included). Raises FileNotFoundError when absent, StoreError for a symlink or a non-regular file."""
    folder = open_dir_beneath(root, parts[:-1])
    try:
        fd = _open_at(folder, parts[-1], flags | _NOFOLLOW | os.O_NONBLOCK, mode, root.joinpath(*parts))
    finally:
        os.close(folder)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise StoreError(f"{root.joinpath(*parts)} is not a regular file; move it out of the store "
                         "(`fa4-aot verify` quarantines it)")
    return fd


def lstat_beneath(root: Path, parts: Sequence[str]) -> os.stat_result | None:
    """lstat of `root/parts...` through O_NOFOLLOW folders; None when it (or a folder above it) is absent."""
    try:
        folder = open_dir_beneath(root, parts[:-1])
    except FileNotFoundError:
        return None
    try:
        return os.stat(parts[-1], dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return None
    finally:
        os.close(folder)


def move_beneath(root: Path, src: Sequence[str], dst: Sequence[str], *, dir_mode: int = DIR_MODE) -> None:
    """Rename `root/src...` to `root/dst...` (missing folders of dst made with `dir_mode`), following no link
    below `root`: a symlink at `src` is moved as the link itself. FileNotFoundError when `src` is absent."""
    src_dir = open_dir_beneath(root, src[:-1])
    try:
        dst_dir = open_dir_beneath(root, dst[:-1], create_mode=dir_mode)
        try:
            os.rename(src[-1], dst[-1], src_dir_fd=src_dir, dst_dir_fd=dst_dir)
        finally:
            os.close(dst_dir)
    finally:
        os.close(src_dir)


def refuse_symlink(path: Path) -> StoreError:
    return StoreError(f"refusing symlink {path}: fa4-aot never follows links inside a store, since one could "
                      "point a client at foreign bytes; remove it (`fa4-aot verify` quarantines it) and rebuild "
                      "or pull what it stood for")


def _open_at(folder: int, name: str, flags: int, mode: int, path: Path) -> int:
    try:
        return os.open(name, flags, mode, dir_fd=folder)
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        if stat.S_ISLNK(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode):
            raise refuse_symlink(path) from None
        raise StoreError(f"{path} is not a folder; move it out of the store (`fa4-aot verify` "
                         "quarantines it)") from None


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
                fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, self.mode,
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
            if e.errno in _DISK_FULL:
                raise disk_full(self.path, e) from e
            raise


def _fsync_dir(folder: int) -> None:
    try:
        os.fsync(folder)
    except OSError as e:  # some filesystems refuse fsync on a folder; the rename already happened
        if e.errno not in (errno.EINVAL, errno.EBADF):
            raise


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
                return os.open(self.path, os.O_RDWR | os.O_CREAT | _NOFOLLOW, self.mode)
            parts = self.path.relative_to(self.root).parts
            folder = open_dir_beneath(self.root, parts[:-1], create_mode=self.dir_mode)
            try:
                return _open_at(folder, parts[-1], os.O_RDWR | os.O_CREAT | _NOFOLLOW, self.mode, self.path)
            finally:
                os.close(folder)
        except OSError as e:
            if e.errno in _DISK_FULL:
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
