"""Objects: immutable bytes named by their sha256 under objects/ab/<62 hex>, written once (a put of bytes
already held is a no-op), re-hashed on every read, and received by streaming with the hash checked before the
rename (ObjectUpload)."""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from ..errors import IntegrityError, StoreError
from .atomic import AtomicFile
from .beneath import lstat_beneath
from .fs_errors import refuse_symlink
from .hashing import hash_stream
from .root import Root, check_hex


class Objects(Root):
    """The Store's objects (see the module)."""

    def object_path(self, digest: str) -> Path:
        check_hex(digest)
        return self.root / "objects" / digest[:2] / digest[2:]

    def put_object(self, data: bytes) -> str:
        """Store `data` under its sha256 and return the digest. Idempotent: a valid copy is kept."""
        digest = hashlib.sha256(data).hexdigest()
        if self.object_state(digest, len(data)) != "ok":
            self._write(self.object_path(digest), data)
        return digest

    def put_stream(self, digest: str, chunks: Iterable[bytes], *, size: int | None = None, source: str) -> None:
        """Store bytes arriving in chunks (a download) under `digest`, checking sha256 and size while they
        stream and before the rename: on a mismatch nothing is stored and IntegrityError names `source`. With
        `size`, the download stops as soon as it would pass that many bytes (a server cannot fill the disk)."""
        with self.receive(digest, source=source) as upload:
            for chunk in chunks:
                if size is not None and upload.size + len(chunk) > size:
                    raise IntegrityError(
                        f"{source} sent more than the expected {size} bytes of object {digest}; stopped there and "
                        "stored nothing (a wrong server, or something on the path, is sending other bytes)",
                        expected=digest, actual="(longer than expected)", source=source)
                upload.write(chunk)
            upload.commit(size)

    def receive(self, digest: str, *, source: str) -> ObjectUpload:
        """A streamed put for callers that produce the bytes themselves (the service's async upload):
        `with store.receive(d, source=...) as up: up.write(chunk)...; up.commit(size)`. The bytes go to a temp
        file (atomic.AtomicFile: store modes, no link followed) while being counted and hashed; commit() renames
        it into place only if they hash to `digest` (and are `size` bytes), else raises IntegrityError; leaving
        the block without a commit stores nothing."""
        path = self.object_path(digest)
        self.ready(create=True)
        self._is_file(path)  # a symlink there is refused, not silently replaced
        return ObjectUpload(AtomicFile(path, root=self.root, mode=self.file_mode, dir_mode=self.dir_mode),
                            digest, source)

    def open_object(self, digest: str) -> IO[bytes]:
        """The object's file open for reading (to serve it), bytes not re-hashed, no link followed:
        FileNotFoundError when absent, StoreError for a symlink or a non-regular file."""
        return self._open(self.object_path(digest))

    def object_size(self, digest: str) -> int | None:
        """Size of the object's file, None when absent; StoreError for a symlink or a non-regular file."""
        path = self.object_path(digest)
        st = lstat_beneath(self.root, path.relative_to(self.root).parts) if self.ready() else None
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise refuse_symlink(path) if stat.S_ISLNK(st.st_mode) else StoreError(
                f"{path} is not a regular file; move it out of the store (`fa4-aot verify` quarantines it)")
        return None if st is None else st.st_size

    def has_object(self, digest: str) -> bool:
        """Whether the object's file exists (not whether its bytes are right); StoreError for a symlink."""
        return self._is_file(self.object_path(digest))

    def verified_object_path(self, digest: str) -> Path:
        """Path of the object after re-hashing it; raises IntegrityError if its bytes do not match, StoreError
        if it is missing or is (or sits below) a symlink.

        The bytes are hashed through an fd opened with O_NOFOLLOW, and the path is then checked to still name
        that same, unchanged file (device, inode, size, mtime), so the path held the verified bytes when this
        returned. What remains is the window between this return and the caller opening the path: only a
        process that can write the store could swap the file in it, and check_root keeps that to the owner.
        """
        path = self.object_path(digest)
        with self._open_object(digest) as f:
            before = _identity(os.fstat(f.fileno()))
            actual = hash_stream(f).hexdigest()
            during = _identity(os.fstat(f.fileno()))
        self._check_digest(path, digest, actual)
        after = lstat_beneath(self.root, path.relative_to(self.root).parts)
        if during != before or after is None or _identity(after) != before:
            raise StoreError(f"object {path} changed while it was being verified; retry, and run `fa4-aot verify` "
                             "if it persists (something else is writing the store)")
        return path

    def verified_file(self, digest: str) -> IO[bytes]:
        """The object open for reading (at offset 0) after its bytes, read through this very descriptor, hashed
        to `digest`: what is later read or mapped through it (e.g. /proc/self/fd/N) is what was verified."""
        f = self._open_object(digest)
        try:
            actual = hash_stream(f).hexdigest()
            self._check_digest(self.object_path(digest), digest, actual)
            f.seek(0)
        except BaseException:
            f.close()
            raise
        return f

    def read_object(self, digest: str) -> bytes:
        """The object's bytes, hashed as they are read from one O_NOFOLLOW fd (the bytes returned are the
        bytes verified); errors as verified_object_path."""
        chunks: list[bytes] = []
        with self._open_object(digest) as f:
            actual = hash_stream(f, chunks).hexdigest()
        self._check_digest(self.object_path(digest), digest, actual)
        return b"".join(chunks)

    def _open_object(self, digest: str) -> IO[bytes]:
        path = self.object_path(digest)
        try:
            return self._open(path)
        except FileNotFoundError:
            raise StoreError(f"object {digest} is missing from {self.root}; run `fa4-aot verify` and rebuild") from None

    @staticmethod
    def _check_digest(path: Path, digest: str, actual: str) -> None:
        if actual != digest:
            raise IntegrityError(
                f"object {path} is corrupt: expected sha256 {digest}, got {actual}; "
                "run `fa4-aot verify` (it quarantines the object) and rebuild or pull the kernel",
                expected=digest, actual=actual, source=str(path),
            )

    def object_state(self, digest: str, size: int | None = None) -> str:
        """"ok", "missing" or "corrupt" (wrong bytes, or not `size` bytes); StoreError for a symlink."""
        for attempt in range(2):
            try:
                with self._open_object(digest) as f:
                    if size is not None and os.fstat(f.fileno()).st_size != size:
                        return "corrupt"
                    return "ok" if hash_stream(f).hexdigest() == digest else "corrupt"
            except StoreError:
                if not self._is_file(self.object_path(digest)):
                    return "missing"
                if attempt:  # there, and still not to be opened: a link or another non-regular file
                    raise
                # else it appeared between the open and the look (another writer's rename): look again
        raise AssertionError("unreachable")



class ObjectUpload:
    """A streamed put in progress (Store.receive): write() chunks, then commit(size) to verify and rename."""

    def __init__(self, file: AtomicFile, digest: str, source: str) -> None:
        self._file, self.digest, self.source = file, digest, source
        self._hash, self.size = hashlib.sha256(), 0

    def __enter__(self) -> ObjectUpload:
        self._file.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._file.__exit__(*exc)

    def write(self, chunk: bytes) -> None:
        self._hash.update(chunk)
        self.size += len(chunk)
        self._file.write(chunk)

    def commit(self, size: int | None = None) -> None:
        """Rename the bytes into place if they hash to the digest (and are `size` bytes); IntegrityError
        naming the source otherwise, and nothing is stored."""
        actual = self._hash.hexdigest()
        if actual != self.digest or (size is not None and self.size != size):
            raise IntegrityError(
                f"{self.source} sent {self.size} bytes hashing to {actual}, expected "
                f"{size if size is not None else '?'} bytes hashing to {self.digest}; nothing was stored (retry, "
                "and `fa4-aot verify` the source if it persists)",
                expected=self.digest, actual=actual, source=self.source,
            )
        self._file.commit()


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns

