"""The index: one entry per kernel key (index/ab/<64 hex>.json), the object digest it names plus how the kernel
was made. An entry is the commit marker: it is written only after its object, under the object's lock."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..domain import kernel_keys
from ..errors import StoreError
from .fs_errors import refuse_symlink, shown
from .objects import Objects
from .root import check_hex


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
    # The host target (domain/hosts.py) its host code and libraries were generated for; part of the key. "" in entries
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


def kernels(entries: Iterable[Entry]) -> list[Entry]:
    """THE kernels among index entries, for every count a command reports: the entries that are not signposts
    (Entry.is_signpost). A kernel that consumed SKU constants has two index entries (its full key and its base
    key's signpost) and is one kernel; two kernels may share one object, so objects are counted apart."""
    return [e for e in entries if not e.is_signpost]


class Index(Objects):
    """The Store's index (see the module); entries name objects, so the index stands on the objects."""

    def entry_path(self, kernel_key: str) -> Path:
        check_hex(kernel_key, "kernel key")
        return self.root / "index" / kernel_key[:2] / f"{kernel_key}.json"

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
        for found in self._scan("index"):
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

    def bytes_of(self, entries: Iterable[Entry]) -> int:
        """THE bytes of a set of kernels: every object they need (kernel, linked libraries, runtime libraries),
        each counted once, as the store holds it (absent objects count 0)."""
        return sum(self.object_size(d) or 0 for d in {d for e in entries for d in e.digests()})

    def has_library(self, entry: Entry, arch: str) -> bool:
        """Whether `entry` names a library for host `arch` and this store holds it and every runtime library it
        needs (an entry can name bytes that verify quarantined, a bundle left out, or someone deleted)."""
        return arch in entry.shared_libs and all(self.has_object(d) for d in entry.lib_digests(arch))


def _parse_entry(path: Path, data: bytes) -> Entry:
    """Parse one index file's bytes; StoreError if they are not an entry."""
    try:
        return Entry.from_json(data.decode())
    except (ValueError, TypeError) as e:
        raise StoreError(f"unreadable index entry {shown(path)}: {e}; run `fa4-aot verify` (it quarantines the "
                         "entry) and rebuild") from e

