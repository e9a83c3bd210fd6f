"""The content-addressed kernel store: immutable objects named by sha256, an index entry per kernel key.

Layout under the root (cache/README.md shows it with an example):
    objects/ab/<62 hex>    exported kernel objects, named by the sha256 of their bytes, written once
    index/ab/<64 hex>.json one entry per kernel key: object digest plus readable metadata
    misses/<64 hex>.json   kernels a client needed and lacked (fallback mode), for `fa4-aot misses`
    manifests/<sku>/<64 hex>.json  signed manifests (trust/signing.py), named by manifest id
    verdicts/ab/<64 hex>.json  certification verdicts of a kernel, one per device class (domain/verdicts.py)
    known-bad/<sku>.json   the known-bad entries certification measured for a SKU (domain/known_bad.py)
    locks/                 advisory locks that keep two processes from doing the same work
    quarantine/<time>/     what `fa4-aot verify` moved out of the way (same relative paths), for a person to inspect

Parts (one module each, one face: Store):
    root.py     the layout, the folder trust check, the primitives every part uses below the root
    objects.py  objects: put (bytes or a verified stream), read verified, state
    index.py    index entries (Entry): the commit marker of a kernel
    side.py     misses, recipe files, signed manifests, change marks
    upkeep.py   what verify, gc and prune ask: scans, hashes, removal, quarantine, temp files
The file primitives they build on: atomic.py (atomic_write, AtomicFile), beneath.py (opens below the root that
follow no link), locking.py (FileLock), folders.py (exact modes, the folder trust check), hashing.py, fs_errors.py.

Objects are written before their index entry, so an entry that exists is complete; every read
re-hashes the object. All writes go through atomic.AtomicFile (temp file beside the target, then rename).
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

from ..domain.misses import Miss  # re-exported: the side data's misses are domain/misses.py's values
from .hashing import sha256_file as sha256_file  # re-exported: callers hash object files by path
from .index import Entry, Index, kernels
from .objects import Objects, ObjectUpload
from .root import HEX64, QUARANTINE, Found, check_hex
from .side import SideData
from .upkeep import Upkeep

__all__ = ["Store", "Entry", "Miss", "Found", "ObjectUpload", "check_hex", "sha256_file", "HEX64", "QUARANTINE",
           "Objects", "Index", "SideData", "Upkeep", "kernels"]


class Store(Index, SideData, Upkeep):
    """A kernel store rooted at a folder. Cheap to construct; checks the root (check_root) on first use and
creates folders, owner-only, on first write. `shared=None` reads FA4_AOT_SHARED_CACHE (see the module)."""
