"""The content-addressed kernel store: immutable objects named by sha256, an index entry per kernel key.

Layout under the root (cache/README.md shows it with an example):
    objects/ab/<62 hex>    exported kernel objects, named by the sha256 of their bytes, written once
    index/ab/<64 hex>.json one entry per kernel key: object digest plus readable metadata
    misses/<64 hex>.json   kernels a client needed and lacked (fallback mode), for `fa4-aot misses`
    locks/                 advisory locks that keep two processes from doing the same work
    quarantine/<time>/     what `fa4-aot verify` moved out of the way (same relative paths), for a person to inspect

Objects are written before their index entry, so an entry that exists is complete; every read
re-hashes the object. All writes go through fsutil.atomic_write.

Trust: a client runs the bytes it loads, so whoever can write the store can run code in every client. The
store is therefore created owner-only (folders 0700, files 0600), and on first use each Store instance checks
(check_root) that the root and its top folders belong to this user (or root) and are writable by neither group
nor others. FA4_AOT_SHARED_CACHE=1 is the escape hatch for a node-shared cache owned by a service account:
any owner and a group-writable root are accepted (never a world-writable one), and new folders get 2770 and
files 0640 so the group can read and add to it. No link below the root is ever followed (every open goes
level by level with O_NOFOLLOW); the root itself may be a symlink, resolved once at construction.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from . import maintenance
from .errors import IntegrityError, StoreError
from .fsutil import (
    DIR_MODE,
    FILE_MODE,
    FileLock,
    atomic_write,
    check_folder,
    hash_stream,
    lstat_beneath,
    make_dirs,
    open_beneath,
    refuse_symlink,
    shown,
)
from .fsutil import sha256_file as sha256_file  # re-exported: callers hash object files by path
from .maintenance import GcReport, VerifyReport, scan_fanout

_HEX64 = re.compile(r"[0-9a-f]{64}")
_CHUNK = 1 << 20
_FOLDERS = ("objects", "index", "misses", "locks", "recipes")
SHARED_DIR_MODE, SHARED_FILE_MODE = 0o2770, 0o640


def check_hex(value: str, what: str = "digest") -> str:
    """Return `value` if it is 64 lowercase hex digits; raise StoreError otherwise (before any path is built)."""
    if not isinstance(value, str) or not _HEX64.fullmatch(value):
        raise StoreError(f"invalid {what} {value!r}: expected 64 lowercase hex digits")
    return value


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
    # The kernel linked for the lean runtime, per host architecture (link.py): {"x86_64": {"digest", "size",
    # "needs": {SONAME: object digest, or "" for a library the client finds itself}}}. Absent in older entries.
    shared_libs: dict[str, Any] = field(default_factory=dict)
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, indent=1)

    def digests(self) -> set[str]:
        """Every object this entry refers to: the exported object, its linked libraries and their runtimes."""
        found = {self.object_digest}
        for lib in self.shared_libs.values():
            found.add(lib["digest"])
            found.update(d for d in lib.get("needs", {}).values() if d)
        return found

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


class Store:
    """A kernel store rooted at a folder. Cheap to construct; checks the root (check_root) on first use and
    creates folders, owner-only, on first write. `shared=None` reads FA4_AOT_SHARED_CACHE (see the module)."""

    def __init__(self, root: Path, *, shared: bool | None = None) -> None:
        self.root = Path(root).resolve()  # a symlinked root is fine: resolved once, nothing below it is
        self.shared = os.environ.get("FA4_AOT_SHARED_CACHE") == "1" if shared is None else shared
        self.dir_mode, self.file_mode = (SHARED_DIR_MODE, SHARED_FILE_MODE) if self.shared else (DIR_MODE, FILE_MODE)
        self._checked = False

    # -- trust ---------------------------------------------------------------------------------
    def check_root(self) -> None:
        """Raise StoreError (naming the folder, its owner or mode, and the chmod/chown or FA4_AOT_CACHE fix)
        unless the root and objects/, index/, misses/, locks/ are folders only this user can change (see the
        module). Runs once per instance; a root that does not exist yet passes and is checked when it does."""
        if self._checked:
            return
        try:
            check_folder(self.root, os.stat(self.root), shared=self.shared)
        except FileNotFoundError:
            return
        for name in _FOLDERS:
            try:
                st = os.lstat(self.root / name)
            except FileNotFoundError:
                continue
            if stat.S_ISLNK(st.st_mode):
                raise refuse_symlink(self.root / name)
            check_folder(self.root / name, st, shared=self.shared)
        self._checked = True

    def ready(self, *, create: bool = False) -> bool:
        """Whether the root exists (with `create`, made owner-only first), after check_root passed."""
        if create and not self.root.exists():
            make_dirs(self.root, self.dir_mode)
        self.check_root()
        return self._checked

    def _write(self, path: Path, data: bytes | Iterable[bytes]) -> None:
        self.ready(create=True)
        self._is_file(path)  # a symlink there is refused, not silently replaced: someone put it there
        atomic_write(path, data, root=self.root, mode=self.file_mode, dir_mode=self.dir_mode)

    def _open(self, path: Path) -> IO[bytes]:
        """`path` (below the root) open for reading, no link followed; FileNotFoundError when absent."""
        if not self.ready():
            raise FileNotFoundError(path)
        return os.fdopen(open_beneath(self.root, path.relative_to(self.root).parts), "rb")

    def _is_file(self, path: Path) -> bool:
        st = lstat_beneath(self.root, path.relative_to(self.root).parts) if self.ready() else None
        if st is not None and stat.S_ISLNK(st.st_mode):
            raise refuse_symlink(path)
        return st is not None and stat.S_ISREG(st.st_mode)

    # -- paths (every id is validated before a path is built) --------------------------------------
    def object_path(self, digest: str) -> Path:
        check_hex(digest)
        return self.root / "objects" / digest[:2] / digest[2:]

    def entry_path(self, kernel_key: str) -> Path:
        check_hex(kernel_key, "kernel key")
        return self.root / "index" / kernel_key[:2] / f"{kernel_key}.json"

    def lock(self, name: str, timeout: float = 600.0) -> FileLock:
        path = self.root / "locks" / check_hex(name, "lock name")
        self.ready(create=True)
        return FileLock(path, timeout=timeout, root=self.root, mode=self.file_mode, dir_mode=self.dir_mode)

    # -- objects -------------------------------------------------------------------------------
    def put_object(self, data: bytes) -> str:
        """Store `data` under its sha256 and return the digest. Idempotent: a valid copy is kept."""
        digest = hashlib.sha256(data).hexdigest()
        if self.object_state(digest, len(data)) != "ok":
            self._write(self.object_path(digest), data)
        return digest

    def put_stream(self, digest: str, chunks: Iterable[bytes], *, size: int | None = None, source: str) -> None:
        """Store bytes arriving in chunks (a download) under `digest`, checking sha256 and size while they
        stream and before the rename: on a mismatch nothing is stored and IntegrityError names `source`."""
        self._write(self.object_path(digest), _verifying(chunks, digest, size, source))

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
        try:
            with self._open_object(digest) as f:
                if size is not None and os.fstat(f.fileno()).st_size != size:
                    return "corrupt"
                return "ok" if hash_stream(f).hexdigest() == digest else "corrupt"
        except StoreError:
            if self._is_file(self.object_path(digest)):
                raise
            return "missing"

    # -- index ---------------------------------------------------------------------------------
    def put_entry(self, entry: Entry) -> None:
        """Publish an entry. Its object must already be stored: the entry is the commit marker."""
        path = self.entry_path(entry.kernel_key)
        if not self.has_object(entry.object_digest):
            raise StoreError(f"refusing index entry {entry.kernel_key}: object {entry.object_digest} not stored")
        self._write(path, entry.to_json().encode())

    def get_entry(self, kernel_key: str) -> Entry | None:
        """The entry for `kernel_key`, or None when the store has none. Never raises for a missing entry;
        StoreError for an unreadable one, one that names another key, or a symlink."""
        path = self.entry_path(kernel_key)
        try:
            with self._open(path) as f:
                entry = _parse_entry(path, f.read())
        except FileNotFoundError:
            return None
        if entry.kernel_key != kernel_key:
            raise StoreError(f"index entry {path} holds kernel {entry.kernel_key!r}; run `fa4-aot verify` "
                             "(it quarantines the entry) and rebuild")
        return entry

    def has_entry(self, kernel_key: str) -> bool:
        return self._is_file(self.entry_path(kernel_key))

    def entries(self, sku: str | None = None) -> Iterator[Entry]:
        """Every entry (of `sku`), in key order. Temp files and names that are not `<key>.json` are skipped;
        StoreError for an unreadable entry or a symlink."""
        if not self.ready():
            return
        for kind, path, name in scan_fanout(self.root / "index", ".json"):
            if kind == "symlink":
                raise refuse_symlink(path)
            entry = self.get_entry(name) if kind == "file" else None
            if entry is not None and (sku is None or entry.sku == sku):
                yield entry

    # -- misses --------------------------------------------------------------------------------
    def record_miss(self, miss: Miss) -> None:
        path = self.root / "misses" / f"{check_hex(miss.kernel_key, 'kernel key')}.json"
        self._write(path, json.dumps(asdict(miss), sort_keys=True, indent=1).encode())

    def misses(self) -> list[Miss]:
        folder = self.root / "misses"
        if not self.ready() or lstat_beneath(self.root, ("misses",)) is None:
            return []
        found = []
        for name in sorted(os.listdir(folder)):
            if _HEX64.fullmatch(name.removesuffix(".json")) and name.endswith(".json"):
                with self._open(folder / name) as f:
                    found.append(Miss(**json.loads(f.read())))
        return found

    # -- maintenance ---------------------------------------------------------------------------
    def verify(self, quarantine: bool = False) -> VerifyReport:
        """Re-hash every object and check every index entry (readable, names its own key, object present with
        its size and digest). Symlinks are reported, never followed. With `quarantine`, every bad object, bad
        or dangling entry and symlink is moved to quarantine/<time>/ (entries first), so no load sees it."""
        return maintenance.verify(self, quarantine)

    def gc(self, dry_run: bool = False, min_age: float = 0.0) -> GcReport:
        """Remove objects that no entry references and are older than `min_age` seconds, and temp files
        left by writers that are no longer running. A builder writes an object before its entry, so a
        gc concurrent with builds needs a min_age longer than one compile (the CLI defaults to an hour).
        Entries are read only when some object is old enough to go, so temp files are cleared even when an
        entry is unreadable (which stops object removal with StoreError). Leaves quarantine/ alone."""
        return maintenance.gc(self, dry_run, min_age)


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


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


def _parse_entry(path: Path, data: bytes) -> Entry:
    """Parse one index file's bytes; StoreError if they are not an entry."""
    try:
        return Entry.from_json(data.decode())
    except (ValueError, TypeError) as e:
        raise StoreError(f"unreadable index entry {shown(path)}: {e}; run `fa4-aot verify` (it quarantines the "
                         "entry) and rebuild") from e
