"""What a build adds for the lean runtime: a linked library per kernel and a recipe region per planned call.

Worker side (in worker.py's processes, through the FA4 seam): `shared_libs` links an exported object
(fa4.link) and stores it with, once, the CuTe runtime it needs (`runtime_needs`), into the store, or into
`Held` in a worker without one (Ray's: the library travels back with its kernel); `record_recipe` records the
region of a call (fa4.record_recipe) unless one already covers it; `relink` adds libraries to entries built
before linking.
`record_work` records the regions of a planning worker's work items. Parent side: `unlinked` lists the entries
to relink, `save` merges the recorded regions into the store.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

from . import fa4, kernel_keys, recipe, recipe_format, recipe_store
from .calls import Call
from .errors import DiskFull
from .lean_libs import has_library
from .signature import Signature
from .skus import Sku
from .store import Store


class Held:
    """Where a worker without a store (a Ray worker) keeps the objects it links, until they travel."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def put_object(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        self.data[digest] = data
        return digest


def runtime_needs(worker: dict[str, Any]) -> dict[str, str]:
    """{SONAME: digest} of the runtime libraries a linked kernel needs, for the SKU's host architecture, each
    put once into worker["objects"] ("" for libtvm_ffi.so, which comes from the apache-tvm-ffi wheel, a base
    dependency of fa4-aot)."""
    if "runtime_digests" not in worker:
        worker["runtime_digests"] = {
            name: "" if path is None else worker["objects"].put_object(path.read_bytes())
            for name, path in fa4.runtime_libraries(worker["sku"].host_target).items()}
    return dict(worker["runtime_digests"])


def shared_libs(worker: dict[str, Any], data: bytes) -> dict[str, Any]:
    """Entry.shared_libs for one exported object: {host arch: {digest, size, needs}}, linked for the SKU's host
    target (whatever the build host's own architecture)."""
    host = worker["sku"].host_target
    lib = fa4.link(data, host)
    needs = runtime_needs(worker)
    return {host.arch: {"digest": worker["objects"].put_object(lib), "size": len(lib), "needs": needs}}


def record_recipe(worker: dict[str, Any], call: Call, recorded: dict[str, list[dict[str, Any]]]) -> None:
    """Record the recipe region of `call` into `recorded` unless one recorded here or in the store covers it (the
    file is by GQA ratio: a region recorded for other head counts of the ratio may cover it)."""
    if call.layout not in recipe.SIZE_NAMES:
        return
    sig, sku, store = Signature.of(call), worker["sku"], worker["store"]
    key = recipe_store.recipe_key(sig, sku)
    known = worker.setdefault("regions", {})
    if key not in known:
        stored = recipe_store.load(store, key) if store is not None else []  # Ray workers have no store
        known[key] = [r for r in stored if r.get("toolchain") == worker["tools"]]
    sizes = {**recipe.sizes_of_call(call.layout, call.batch, call.seqlen_q, call.seqlen_k, call.page_size),
             recipe.HEADS: call.heads_kv}
    if recipe_store.find(known[key], sizes) is None:
        region = fa4.record_recipe(sig, sizes, sku)
        recipe_format.check_region(region)  # what clients would refuse is a failure here, never a stored file
        known[key].append(region)
        recorded.setdefault(key, []).append(region)


def record_work(worker: dict[str, Any], work: list[tuple[str, Call | Signature]], kernels: list[tuple[Any, ...]],
                failures: list[tuple[int, str]], one_line: Any) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    """(regions recorded, errors) for the work items FA4 accepted (worker.plan_calls's `kernels`, `failures`): a
    Call's region at its own sizes; a Signature's at the calls its shape-complete plan chose (one per kernel),
    not at every shape, so sizes between them may fall outside every region (KernelMissing names them)."""
    rejected = {i for i, _error in failures}
    recorded: dict[str, list[dict[str, Any]]] = {}
    errors: list[str] = []
    for i, (_label, item) in enumerate(work):
        if i in rejected:
            continue
        for call in [item] if isinstance(item, Call) else dict.fromkeys(k[4] for k in kernels if k[3] == i):
            try:
                record_recipe(worker, call, recorded)
            except Exception as e:  # the call still builds for install(); the lean runtime will say it lacks a recipe
                errors.append(f"recipe of {call.describe()}: {one_line(e)}")
    return recorded, errors


def relink(worker: dict[str, Any], keys: list[str], one_line: Any) -> list[str]:
    """Add this host's library to entries that lack it (built before linking, or whose library or runtime
    bytes went missing: `unlinked`): no recompiling. Returns errors."""
    store: Store = worker["store"]
    worker.pop("runtime_digests", None)  # put the runtime libraries into the store again: one may be gone
    errors = []
    for kk in keys:
        try:
            with store.lock(kk):
                entry = store.get_entry(kk)
                if entry is not None:
                    libs = {**entry.shared_libs, **shared_libs(worker, store.read_object(entry.object_digest))}
                    store.put_entry(dataclasses.replace(entry, shared_libs=libs))
        except DiskFull:
            raise
        except Exception as e:
            errors.append(f"relinking {kk[:16]}…: {one_line(e)}")
    return errors


def unlinked(store: Store, base_keys: list[str], sku: Sku) -> list[str]:
    """Stored entries of the kernels with `base_keys` without a library for `sku`'s host architecture, or whose
    library or a runtime library it needs is not in the store (deleted, quarantined, or never received): each
    base entry and, for a kernel that consumed SKU constants, its full entry for `sku`'s values (both entries
    point at one object, so both carry its libraries)."""
    keys = []
    for base in base_keys:
        entry = store.get_entry(base)
        if entry is not None:
            keys += [base] + ([kernel_keys.variant_key(entry, sku.constants())] if entry.hardware_queries else [])
    entries = [store.get_entry(kk) for kk in dict.fromkeys(keys)]
    return [e.kernel_key for e in entries if e is not None and not has_library(store, e, sku.host_target.arch)]


def save(store: Store, recorded: dict[str, list[dict[str, Any]]]) -> int:
    """Merge recorded regions into the store's recipe files; the number of regions recorded."""
    for key, regions in recorded.items():
        recipe_store.merge(store, key, regions)
    return sum(len(r) for r in recorded.values())
