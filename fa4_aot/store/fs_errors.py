"""How the store's file primitives fail: the errors they raise when a disk fills up or a link stands where a
store file should be, and how a path is shown in any message (never a crash on undecodable bytes)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from ..errors import DiskFull, StoreError

DISK_FULL = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT}  # the errnos that mean "no room": each becomes DiskFull


def shown(path: Path | str) -> str:
    """A path for messages: undecodable bytes in file names shown as \\x.. escapes, never a crash."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def disk_full(path: Path, e: OSError) -> DiskFull:
    return DiskFull(f"no space left writing {path} ({os.strerror(e.errno or 0)}); nothing partial was kept: "
                    "free space there, or point FA4_AOT_CACHE (--cache-dir) at a larger disk, and run it again")


def refuse_symlink(path: Path) -> StoreError:
    return StoreError(f"refusing symlink {path}: fa4-aot never follows links inside a store, since one could "
                      "point a client at foreign bytes; remove it (`fa4-aot verify` quarantines it) and rebuild "
                      "or pull what it stood for")
