"""The content-addressed kernel store: immutable objects named by sha256, an index entry per kernel key.

Layout under the root (cache/README.md shows it with an example):
    objects/ab/<62 hex>    exported kernel objects, named by the sha256 of their bytes, written once
    index/ab/<64 hex>.json one entry per kernel key: object digest plus readable metadata
    misses/<64 hex>.json   kernels a client needed and lacked (fallback mode), for `fa4-aot misses`
    manifests/<sku>/<64 hex>.json  signed manifests (trust/signing.py), named by manifest id
    locks/                 advisory locks that keep two processes from doing the same work
    quarantine/<time>/     what `fa4-aot verify` moved out of the way (same relative paths), for a person to inspect

Objects are written before their index entry, so an entry that exists is complete; every read
re-hashes the object. All writes go through fsutil.AtomicFile (temp file beside the target, then rename).
Store is the only code that builds paths under the root: the service (uploads, serving, startup import),
signing (manifests) and maintenance (verify, gc, quarantine) all go through its methods.

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
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from ..errors import IntegrityError, StoreError
from ..spec import kernel_keys
from .fsutil import (
    DIR_MODE,
    FILE_MODE,
    TMP_SUFFIX,
    AtomicFile,
    FileLock,
    atomic_write,
    check_folder,
    hash_stream,
    lstat_beneath,
    make_dirs,
    move_beneath,
    open_beneath,
    open_dir_beneath,
    refuse_symlink,
    shown,
)
from .fsutil import sha256_file as sha256_file  # re-exported: callers hash object files by path

HEX64 = re.compile(r"[0-9a-f]{64}")
_FANOUT = re.compile(r"[0-9a-f]{2}")
_SKU_NAME = re.compile(r"[a-z0-9-]+")
QUARANTINE = "quarantine"
_CHUNK = 1 << 20
_FOLDERS = ("objects", "index", "misses", "locks", "manifests", "recipes")
SHARED_DIR_MODE, SHARED_FILE_MODE = 0o2770, 0o640


def check_hex(value: str, what: str = "digest") -> str:
    """Return `value` if it is 64 lowercase hex digits; raise StoreError otherwise (before any path is built)."""
    if not isinstance(value, str) or not HEX64.fullmatch(value):
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
    # The host target (spec/hosts.py) its host code and libraries were generated for; part of the key. "" in entries
    # built before host targets existed: for the build machine's CPU, whatever it was.
    host: str = ""
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, indent=1)

    def published(self) -> dict[str, Any]:
        """The entry as the service knows it (POST /v1/kernels): every field, `shared_libs` included; the
        server keeps a library per host arch immutable once published, as it keeps the object."""
        return asdict(self)

    def lib_digests(self, arch: str) -> dict[str, int | None]:
        """{digest: size or None} of the library linked for host `arch` and the runtime libraries it needs
        ({} when the entry has none for `arch`)."""
        lib = self.shared_libs.get(arch)
        if not lib:
            return {}
        return {lib["digest"]: lib["size"], **{d: None for d in lib.get("needs", {}).values() if d}}

    @property
    def is_signpost(self) -> bool:
        """Whether this is the base-key signpost of a kernel that consumed SKU constants: it points at the same
        object as the kernel's own entry (filed under its full key) and tells a client which constants to look
        up. THE definition of a kernel everywhere (build, list, doctor, push, pull, the server): an entry that is
        not a signpost."""
        try:
            base, full = kernel_keys.entry_keys(self)
        except ValueError:
            return False
        return self.kernel_key == base != full

    def footprint(self, sizes: Mapping[str, int]) -> dict[str, int]:
        """{digest: bytes} of everything this entry needs on disk (object, linked libraries, their runtime
        libraries), sizes from `sizes` where the entry does not record them. THE definition of a kernel's
        bytes: summed over a set of entries, each digest counts once (a runtime library is shared)."""
        found = {self.object_digest: self.size}
        for lib in self.shared_libs.values():
            found[lib["digest"]] = lib["size"]
            found.update({d: sizes.get(d, 0) for d in lib.get("needs", {}).values() if d})
        return found

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
    args: dict[str, Any] | None = None  # its exact FA4 arguments (spec/exact.py): what `build --from-misses` replays
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
        file (fsutil.AtomicFile: store modes, no link followed) while being counted and hashed; commit() renames
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

    def change_marks(self) -> tuple[tuple[str, int], ...]:
        """(folder, mtime_ns) of index/, recipes/, manifests/ and their direct subfolders, links not followed:
        every write into the store is an atomic rename into one of them, which changes that folder's time, so
        two equal results mean nothing was added, replaced or removed in between (a server polls this)."""
        found = []
        for top in ("index", "recipes", "manifests"):
            try:
                found.append((top, os.lstat(self.root / top).st_mtime_ns))
                with os.scandir(self.root / top) as it:
                    found += [(f"{top}/{e.name}", e.stat(follow_symlinks=False).st_mtime_ns)
                              for e in it if e.is_dir(follow_symlinks=False)]
            except FileNotFoundError:
                continue
        return tuple(sorted(found))

    def bytes_of(self, entries: Iterable[Entry]) -> int:
        """THE bytes of a set of kernels: every object they need (kernel, linked libraries, runtime libraries),
        each counted once, as the store holds it (absent objects count 0)."""
        return sum(self.object_size(d) or 0 for d in {d for e in entries for d in e.digests()})

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

    # -- index ---------------------------------------------------------------------------------
    def put_entry(self, entry: Entry) -> None:
        """Publish an entry. Its object must already be stored: the entry is the commit marker. The check and
        the write happen under the object's lock, which gc takes before removing an object, so an entry never
        names an object that gc removed meanwhile (StoreError then: fetch or build the object again)."""
        path = self.entry_path(entry.kernel_key)
        if not self.has_object(entry.object_digest):  # refused before anything is created
            raise StoreError(f"refusing index entry {entry.kernel_key}: object {entry.object_digest} not stored")
        with self.lock(entry.object_digest):
            if not self.has_object(entry.object_digest):
                raise StoreError(f"refusing index entry {entry.kernel_key}: object {entry.object_digest} not stored")
            self._write(path, entry.to_json().encode())

    def get_entry(self, kernel_key: str) -> Entry | None:
        """The entry for `kernel_key`, or None when the store has none. Never raises for a missing entry;
        StoreError for an unreadable one, one that does not prove its key (kernel_keys.key_problem), or a symlink."""
        path = self.entry_path(kernel_key)
        try:
            with self._open(path) as f:
                entry = _parse_entry(path, f.read())
        except FileNotFoundError:
            return None
        problem = kernel_keys.key_problem(entry, kernel_key)
        if problem:
            raise StoreError(f"index entry {path} cannot be used: {problem}; run `fa4-aot verify --quarantine` "
                             "(it moves the entry aside) and rebuild or pull the kernel")
        return entry

    def remove_entry(self, kernel_key: str) -> None:
        """Unlink the index entry of `kernel_key` (no link followed); nothing when it is already gone. The
        entry goes first, its object after (gc or prune): a reader never sees an entry without its object."""
        self._unlink(self.entry_path(kernel_key).relative_to(self.root).parts)

    def has_entry(self, kernel_key: str) -> bool:
        return self._is_file(self.entry_path(kernel_key))

    def entries(self, sku: str | None = None, *, skipped: list[str] | None = None) -> Iterator[Entry]:
        """Every entry (of `sku`), in key order. Temp files and names that are not `<key>.json` are passed
        over. An unreadable entry or a symlink raises StoreError, or with `skipped` is left out and named
        there (one line each, saying why), so one bad file cannot stop a caller that serves the rest."""
        for found in self.scan("index"):
            try:
                if found.kind == "symlink":
                    raise refuse_symlink(self.root / found.where)
                entry = self.get_entry(found.name) if found.kind == "file" else None
            except StoreError as e:
                if skipped is None:
                    raise
                skipped.append(f"{shown(self.root / found.where)}: {e}")
                continue
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
            if HEX64.fullmatch(name.removesuffix(".json")) and name.endswith(".json"):
                with self._open(folder / name) as f:
                    found.append(Miss(**json.loads(f.read())))
        return found

    # -- lean-runtime recipes (recipes.py owns their content) ---------------------------------
    def put_recipes(self, key: str, data: bytes) -> None:
        """Replace recipes/<ab>/<key>.json (a signature's recorded regions on one SKU) atomically."""
        self._write(self._recipes_path(key), data)

    def recipes(self, key: str) -> bytes | None:
        """The bytes of recipes/<ab>/<key>.json, or None when there is none; StoreError for a symlink."""
        try:
            with self._open(self._recipes_path(key)) as f:
                return f.read()
        except FileNotFoundError:
            return None

    def _recipes_path(self, key: str) -> Path:
        check_hex(key, "recipe key")
        return self.root / "recipes" / key[:2] / f"{key}.json"

    # -- signed manifests (trust/signing.py owns their content) -----------------------------------------
    def put_manifest(self, sku: str, manifest_id: str, data: bytes) -> Path:
        """Keep a signed manifest's bytes as manifests/<sku>/<manifest id>.json; idempotent (same bytes kept)."""
        path = self.root / "manifests" / _check_sku(sku) / f"{check_hex(manifest_id, 'manifest id')}.json"
        try:
            with self._open(path) as f:
                if f.read() == data:
                    return path
        except FileNotFoundError:
            pass
        self._write(path, data)
        return path

    def manifests(self, sku: str) -> list[bytes]:
        """The bytes of every manifest kept for `sku`, in name order; symlinks and other names are passed over."""
        parts = ("manifests", _check_sku(sku))
        if not self.ready() or lstat_beneath(self.root, parts) is None:
            return []
        found = []
        for name in sorted(_listdir_beneath(self.root, parts)):
            if name.endswith(".json") and HEX64.fullmatch(name.removesuffix(".json")):
                try:
                    with self._open(self.root.joinpath(*parts, name)) as f:
                        found.append(f.read())
                except StoreError:  # a symlink or a folder: never followed, not a manifest
                    continue
        return found

    # -- layout for maintenance.py (verify, gc, quarantine) ----------------------------------------
    def scan(self, folder: str) -> Iterator[Found]:
        """Everything in the fan-out folders of "objects", "index" or "recipes", in name order, following no
        link (see Found). Writers' temp files are passed over. Nothing when the store or the folder does not exist."""
        if folder not in ("objects", "index", "recipes"):
            raise ValueError(f"scan() takes 'objects', 'index' or 'recipes', not {folder!r}")
        st = lstat_beneath(self.root, (folder,)) if self.ready() else None
        if st is not None and stat.S_ISDIR(st.st_mode):  # check_root refused a symlink there already
            yield from _scan_fanout(self.root, folder, "" if folder == "objects" else ".json")

    def hash_object(self, digest: str) -> tuple[str, int] | None:
        """(sha256, size) of the bytes stored as `digest`, whatever they are; None when the file is gone."""
        try:
            with self._open(self.object_path(digest)) as f:
                return hash_stream(f).hexdigest(), os.fstat(f.fileno()).st_size
        except FileNotFoundError:
            return None

    def object_mtime(self, digest: str) -> float | None:
        path = self.object_path(digest)
        st = lstat_beneath(self.root, path.relative_to(self.root).parts) if self.ready() else None
        return None if st is None else st.st_mtime

    def remove_object(self, digest: str) -> None:
        """Unlink the object's file (no link followed); nothing when it is already gone."""
        self._unlink(self.object_path(digest).relative_to(self.root).parts)

    def quarantine(self, found: Iterable[Found]) -> tuple[str, dict[str, str]]:
        """Move each scanned item (a symlink as the link itself) to quarantine/<time>/<same relative path>.
        Returns the new folder and {path under the root: where it went}; items gone meanwhile are passed over."""
        stamp = self._new_quarantine_dir()
        moved = {}
        for item in found:
            parts = Path(item.where).parts
            try:
                move_beneath(self.root, parts, (QUARANTINE, stamp, *parts), dir_mode=self.dir_mode)
            except FileNotFoundError:  # gone meanwhile (another verify, a gc): nothing left to move
                continue
            moved[shown(item.where)] = shown(self.root / QUARANTINE / stamp / item.where)
        return str(self.root / QUARANTINE / stamp), moved

    def temp_files(self) -> Iterator[tuple[str, int | None, float]]:
        """(path under the root, writer pid, last modified) of every writer's temp file outside quarantine/,
        following no link."""
        if not self.ready():
            return
        for folder, dirs, files in os.walk(self.root):  # os.walk never descends into symlinked folders
            if Path(folder) == self.root:
                dirs[:] = [d for d in dirs if d != QUARANTINE]
            for name in files:
                if name.startswith(".") and name.endswith(TMP_SUFFIX):
                    where = Path(folder, name).relative_to(self.root)
                    st = lstat_beneath(self.root, where.parts)
                    if st is not None:
                        yield str(where), _pid_of(name), st.st_mtime

    def remove_temp_file(self, where: str) -> None:
        """Unlink a temp file that temp_files() named (refuses any other name)."""
        parts = Path(where).parts
        if not parts or not (parts[-1].startswith(".") and parts[-1].endswith(TMP_SUFFIX)) or ".." in parts:
            raise StoreError(f"{where!r} is not a writer's temp file under {self.root}")
        self._unlink(parts)

    def _unlink(self, parts: tuple[str, ...]) -> None:
        try:
            folder = open_dir_beneath(self.root, parts[:-1])
        except FileNotFoundError:
            return
        try:
            os.unlink(parts[-1], dir_fd=folder)
        except FileNotFoundError:
            pass
        finally:
            os.close(folder)

    def _new_quarantine_dir(self) -> str:
        base = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        folder = open_dir_beneath(self.root, (QUARANTINE,), create_mode=self.dir_mode)
        try:
            for n in range(1000):
                stamp = base if n == 0 else f"{base}-{n}"
                try:
                    os.mkdir(stamp, self.dir_mode, dir_fd=folder)
                    return stamp
                except FileExistsError:
                    continue
        finally:
            os.close(folder)
        raise StoreError(f"could not create a fresh folder under {self.root / QUARANTINE}; clear it out")


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


@dataclass(frozen=True)
class Found:
    """One thing Store.scan met: kind "file" (name: its digest or kernel key), "symlink" (never followed) or
    "unexpected" (a name no reader opens, e.g. not hex or not a regular file); `where` is its path under the
    root. Names that are not UTF-8 come through (surrogate-escaped) as "unexpected"."""

    kind: str
    name: str
    where: str


def _scan_fanout(root: Path, folder: str, suffix: str) -> Iterator[Found]:
    for top in sorted(os.scandir(root / folder), key=lambda e: e.name):
        where = f"{folder}/{top.name}"
        if top.is_symlink():
            yield Found("symlink", top.name, where)
        elif not top.is_dir(follow_symlinks=False) or not _FANOUT.fullmatch(top.name):
            yield Found("unexpected", top.name, where)
        else:
            for item in sorted(os.scandir(top.path), key=lambda e: e.name):
                if item.name.startswith(".") and item.name.endswith(TMP_SUFFIX):
                    continue
                name = item.name.removesuffix(suffix) if suffix else top.name + item.name
                yield Found(_kind(item, name, top.name, suffix), name, f"{where}/{item.name}")


def _kind(item: os.DirEntry[str], name: str, fanout: str, suffix: str) -> str:
    if item.is_symlink():
        return "symlink"
    good = item.name.endswith(suffix) and HEX64.fullmatch(name) and name.startswith(fanout)
    return "file" if good and item.is_file(follow_symlinks=False) else "unexpected"


def _listdir_beneath(root: Path, parts: tuple[str, ...]) -> list[str]:
    fd = open_dir_beneath(root, parts)
    try:
        return os.listdir(fd)
    finally:
        os.close(fd)


def _check_sku(name: str) -> str:
    if not isinstance(name, str) or not _SKU_NAME.fullmatch(name):
        raise StoreError(f"invalid SKU name {name!r}: expected lowercase letters, digits and '-'")
    return name


def _pid_of(name: str) -> int | None:
    parts = name.split(".")  # .<name>.<pid>.<rand>.tmp
    try:
        return int(parts[-3])
    except (IndexError, ValueError):
        return None


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _parse_entry(path: Path, data: bytes) -> Entry:
    """Parse one index file's bytes; StoreError if they are not an entry."""
    try:
        return Entry.from_json(data.decode())
    except (ValueError, TypeError) as e:
        raise StoreError(f"unreadable index entry {shown(path)}: {e}; run `fa4-aot verify` (it quarantines the "
                         "entry) and rebuild") from e
