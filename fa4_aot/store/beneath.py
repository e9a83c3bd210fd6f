"""Opening below a store root without following links: every level below the root is opened with O_NOFOLLOW
from the fd of the level above, so no link below the root is followed and nothing can swap a level between a
check and an open. Each folder on the way must be no easier to change than the root itself."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Sequence
from pathlib import Path

from ..errors import StoreError
from .folders import DIR_MODE, FILE_MODE
from .fs_errors import refuse_symlink

NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


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
            level = _Level(root, parts, i + 1)
            created = False
            if create_mode is not None:
                try:
                    os.mkdir(part, create_mode, dir_fd=fd)
                    created = True
                except FileExistsError:
                    pass
            child = open_at(fd, part, os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW, 0, level)
            os.close(fd)
            fd = child
            if created:
                os.fchmod(fd, create_mode)  # type: ignore[arg-type]  # exactly the mode, whatever the umask
            _check_level(level, os.fstat(fd), top)
    except BaseException:
        os.close(fd)
        raise
    return fd


class _Level:
    """The path of `root/parts[:depth]`, made only when a message names it: a store's every read walks its levels,
    and building each level's Path beforehand was half of a walk's time (pathlib's joinpath, twice a level)."""

    __slots__ = ("root", "parts", "depth")

    def __init__(self, root: Path, parts: Sequence[str], depth: int) -> None:
        self.root, self.parts, self.depth = root, parts, depth

    def __call__(self) -> Path:
        return self.root.joinpath(*self.parts[: self.depth])


def _check_level(level: Callable[[], Path], st: os.stat_result, top: os.stat_result) -> None:
    """A folder below a store root may be changed by no one the root itself does not let change it: owned by
    the root's owner (or root), never world-writable, group-writable only where the root is (a shared cache).
    Otherwise another user could redirect what the store reads through it (e.g. an index fan-out folder).
    `level()` names the folder in the message."""
    mode, top_mode = stat.S_IMODE(st.st_mode), stat.S_IMODE(top.st_mode)
    foreign = st.st_uid not in (top.st_uid, 0)
    loose = mode & stat.S_IWOTH or (mode & stat.S_IWGRP and not (top_mode & stat.S_IWGRP and st.st_gid == top.st_gid))
    if foreign or loose:
        path = level()
        raise StoreError(f"store folder {path} (owner uid {st.st_uid}, mode {mode:04o}) can be changed by users "
                         f"the store root (owner uid {top.st_uid}, mode {top_mode:04o}) does not trust, who could "
                         f"redirect what is read through it; fix: `chown {top.st_uid} {path} && chmod go-w {path}`, "
                         "or run `fa4-aot verify` and rebuild what it held")


def open_beneath(root: Path, parts: Sequence[str], flags: int = os.O_RDONLY, mode: int = FILE_MODE) -> int:
    """An fd for the file `root/parts...` opened with `flags`, following no link below `root` (the file
    included). Raises FileNotFoundError when absent, StoreError for a symlink or a non-regular file."""
    folder = open_dir_beneath(root, parts[:-1])
    try:
        fd = open_at(folder, parts[-1], flags | NOFOLLOW | os.O_NONBLOCK, mode, _Level(root, parts, len(parts)))
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


def open_at(folder: int, name: str, flags: int, mode: int, path: Path | Callable[[], Path]) -> int:
    """os.open of `name` in the folder fd `folder`, `path` (or what it returns, made only for a message) naming it
    in messages. Where O_NOFOLLOW or O_DIRECTORY in `flags` refuses what is there, StoreError says why: a symlink,
    or not a folder."""
    try:
        return os.open(name, flags, mode, dir_fd=folder)
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        path = path if isinstance(path, Path) else path()
        if stat.S_ISLNK(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode):
            raise refuse_symlink(path) from None
        raise StoreError(f"{path} is not a folder; move it out of the store (`fa4-aot verify` "
                         "quarantines it)") from None
