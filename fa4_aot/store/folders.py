"""Folders of a store and of fa4-aot's own files: made with exactly the mode asked for (make_dirs), and trusted
only when no one but this user (or root) can change them (check_folder)."""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

from ..errors import StoreError
from .fs_errors import DISK_FULL, disk_full

FILE_MODE = 0o600  # owner-only: nobody else can swap the bytes a client loads
DIR_MODE = 0o700


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
            if e.errno in DISK_FULL:
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
