"""sha256 of a store file or of a stream, read in chunks: what every check of an object's bytes computes."""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path
from typing import IO

from .beneath import NOFOLLOW
from .fs_errors import refuse_symlink

_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    """sha256 of the file at `path`; refuses (StoreError) to follow a symlink there."""
    try:
        fd = os.open(path, os.O_RDONLY | NOFOLLOW | os.O_NONBLOCK)
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
