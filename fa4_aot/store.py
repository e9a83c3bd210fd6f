"""The content-addressed kernel store: immutable objects named by sha256, an index entry per kernel key.

Layout under the root (cache/README.md shows it with an example):
    objects/ab/<62 hex>    exported kernel objects, named by the sha256 of their bytes, written once
    index/ab/<64 hex>.json one entry per kernel key: object digest plus readable metadata
    misses/<64 hex>.json   kernels a client needed and lacked (fallback mode), for `fa4-aot misses`
    locks/                 advisory locks that keep two processes from doing the same work

Objects are written before their index entry, so an entry that exists is complete; every read
re-hashes the object. All writes go through fsutil.atomic_write.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .errors import IntegrityError, StoreError
from .fsutil import TMP_SUFFIX, FileLock, atomic_write

_HEX64 = re.compile(r"[0-9a-f]{64}")
_CHUNK = 1 << 20


def check_hex(value: str, what: str = "digest") -> str:
    """Return `value` if it is 64 lowercase hex digits; raise StoreError otherwise (before any path is built)."""
    if not isinstance(value, str) or not _HEX64.fullmatch(value):
        raise StoreError(f"invalid {what} {value!r}: expected 64 lowercase hex digits")
    return value


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class Entry:
    """One index entry: which object holds the kernel for `kernel_key`, and how it was made."""

    kernel_key: str
    object_digest: str
    size: int
    family: str
    compile_key: Any
    sku: str
    arch: str
    sm_count: int
    l2_bytes: int
    cuda_major: int
    toolchain: dict[str, str]
    variant: str
    call: str
    compile_seconds: float
    # What the compile asked the stand-in HardwareInfo (target.py), e.g. [["sm_count", 148]]: proof that
    # persistent schedulers baked the SKU's figures, not the build host's.
    hardware_queries: list[Any] = field(default_factory=list)
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, indent=1)

    @classmethod
    def from_json(cls, text: str) -> Entry:
        return cls(**json.loads(text))


@dataclass(frozen=True)
class Miss:
    """A kernel a client needed in fallback mode and compiled itself."""

    kernel_key: str
    family: str
    compile_key: Any
    sku: str
    call: dict[str, Any] | None = None  # the Call that needed it, when the client could tell (calls.capture)
    when: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))


@dataclass
class VerifyReport:
    objects_checked: int = 0
    entries_checked: int = 0
    bad_objects: list[tuple[str, str]] = field(default_factory=list)  # (expected, actual)
    dangling_entries: list[str] = field(default_factory=list)  # kernel keys whose object is absent

    @property
    def ok(self) -> bool:
        return not self.bad_objects and not self.dangling_entries


@dataclass
class GcReport:
    removed_objects: list[str] = field(default_factory=list)
    removed_temp_files: int = 0
    bytes_freed: int = 0


class Store:
    """A kernel store rooted at a folder. Cheap to construct; creates folders on first write."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    # -- paths (every id is validated before a path is built) --------------------------------------
    def object_path(self, digest: str) -> Path:
        check_hex(digest)
        return self.root / "objects" / digest[:2] / digest[2:]

    def entry_path(self, kernel_key: str) -> Path:
        check_hex(kernel_key, "kernel key")
        return self.root / "index" / kernel_key[:2] / f"{kernel_key}.json"

    def lock(self, name: str, timeout: float = 600.0) -> FileLock:
        check_hex(name, "lock name")
        return FileLock(self.root / "locks" / name, timeout=timeout)

    # -- objects -------------------------------------------------------------------------------
    def put_object(self, data: bytes) -> str:
        """Store `data` under its sha256 and return the digest. Idempotent: a valid copy is kept."""
        digest = hashlib.sha256(data).hexdigest()
        path = self.object_path(digest)
        if not (path.is_file() and path.stat().st_size == len(data) and sha256_file(path) == digest):
            atomic_write(path, data)
        return digest

    def put_stream(self, digest: str, chunks: Iterable[bytes], *, size: int | None = None, source: str) -> None:
        """Store bytes arriving in chunks (a download) under `digest`, checking sha256 and size while they
        stream and before the rename: on a mismatch nothing is stored and IntegrityError names `source`."""
        atomic_write(self.object_path(digest), _verifying(chunks, digest, size, source))

    def has_object(self, digest: str) -> bool:
        return self.object_path(digest).is_file()

    def verified_object_path(self, digest: str) -> Path:
        """Path of the object after re-hashing it; raises IntegrityError if its bytes do not match."""
        path = self.object_path(digest)
        if not path.is_file():
            raise StoreError(f"object {digest} is missing from {self.root}; run `fa4-aot verify` and rebuild")
        actual = sha256_file(path)
        if actual != digest:
            raise IntegrityError(
                f"object {path} is corrupt: expected sha256 {digest}, got {actual}; "
                "run `fa4-aot verify` and rebuild the kernel",
                expected=digest,
                actual=actual,
                source=str(path),
            )
        return path

    def read_object(self, digest: str) -> bytes:
        return self.verified_object_path(digest).read_bytes()

    # -- index ---------------------------------------------------------------------------------
    def put_entry(self, entry: Entry) -> None:
        """Publish an entry. Its object must already be stored: the entry is the commit marker."""
        if not self.has_object(entry.object_digest):
            raise StoreError(f"refusing index entry {entry.kernel_key}: object {entry.object_digest} not stored")
        atomic_write(self.entry_path(entry.kernel_key), entry.to_json().encode())

    def get_entry(self, kernel_key: str) -> Entry | None:
        """The entry for `kernel_key`, or None when the store has none. Never raises for a missing entry."""
        try:
            return _read_entry(self.entry_path(kernel_key))
        except FileNotFoundError:
            return None

    def has_entry(self, kernel_key: str) -> bool:
        return self.entry_path(kernel_key).is_file()

    def entries(self, sku: str | None = None) -> Iterator[Entry]:
        index = self.root / "index"
        if not index.is_dir():
            return
        for path in sorted(index.glob("??/*.json")):
            entry = _read_entry(path)
            if sku is None or entry.sku == sku:
                yield entry

    # -- misses --------------------------------------------------------------------------------
    def record_miss(self, miss: Miss) -> None:
        path = self.root / "misses" / f"{check_hex(miss.kernel_key, 'kernel key')}.json"
        atomic_write(path, json.dumps(asdict(miss), sort_keys=True, indent=1).encode())

    def misses(self) -> list[Miss]:
        folder = self.root / "misses"
        if not folder.is_dir():
            return []
        return [Miss(**json.loads(p.read_text())) for p in sorted(folder.glob("*.json"))]

    # -- maintenance ---------------------------------------------------------------------------
    def _object_files(self) -> Iterator[tuple[str, Path]]:
        objects = self.root / "objects"
        if objects.is_dir():
            for path in sorted(objects.glob("??/*")):
                if not path.name.endswith(TMP_SUFFIX):
                    yield path.parent.name + path.name, path

    def verify(self) -> VerifyReport:
        """Re-hash every object and check that every entry's object exists."""
        report = VerifyReport()
        for name, path in self._object_files():
            report.objects_checked += 1
            actual = sha256_file(path)
            if actual != name:
                report.bad_objects.append((name, actual))
        for entry in self.entries():
            report.entries_checked += 1
            if not self.has_object(entry.object_digest):
                report.dangling_entries.append(entry.kernel_key)
        return report

    def gc(self, dry_run: bool = False, min_age: float = 0.0) -> GcReport:
        """Remove objects that no entry references and are older than `min_age` seconds, and temp files
        left by writers that are no longer running. A builder writes an object before its entry, so a
        gc concurrent with builds needs a min_age longer than one compile (the CLI defaults to an hour)."""
        report = GcReport()
        live = {e.object_digest for e in self.entries()}
        cutoff = time.time() - min_age
        for name, path in self._object_files():
            if name not in live and path.stat().st_mtime <= cutoff:
                report.removed_objects.append(name)
                report.bytes_freed += path.stat().st_size
                if not dry_run:
                    path.unlink()
        for tmp in self.root.glob(f"**/.*{TMP_SUFFIX}"):
            if not _alive(_pid_of(tmp)):
                report.removed_temp_files += 1
                if not dry_run:
                    tmp.unlink(missing_ok=True)
        return report


def _verifying(chunks: Iterable[bytes], digest: str, size: int | None, source: str) -> Iterator[bytes]:
    h, got = hashlib.sha256(), 0
    for chunk in chunks:
        h.update(chunk)
        got += len(chunk)
        yield chunk
    actual = h.hexdigest()
    if actual != digest or (size is not None and got != size):
        raise IntegrityError(
            f"{source} sent {got} bytes hashing to {actual}, expected {size if size is not None else '?'} bytes "
            f"hashing to {digest}; nothing was stored (retry, and `fa4-aot verify` the source if it persists)",
            expected=digest, actual=actual, source=source,
        )


def _read_entry(path: Path) -> Entry:
    """Parse one index file; raises FileNotFoundError if absent, StoreError if unreadable."""
    text = path.read_text()
    try:
        return Entry.from_json(text)
    except (ValueError, TypeError) as e:
        raise StoreError(f"unreadable index entry {path}: {e}; delete it and rebuild") from e


def _pid_of(tmp: Path) -> int | None:
    parts = tmp.name.split(".")  # .<name>.<pid>.<rand>.tmp
    try:
        return int(parts[-3])
    except (IndexError, ValueError):
        return None


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
