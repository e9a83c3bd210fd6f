"""What a build adds for the lean runtime: a linked library per kernel and recipe regions covering every size of
each planned signature.

Worker side (in worker.py's processes, through the FA4 seam): `shared_libs` links an exported object
(fa4.link) and stores it with, once, the CuTe runtime it needs (`runtime_needs`), into the store, or into
`Held` in a worker without one (Ray's: the library travels back with its kernel); `explore` records a signature's
regions (fa4.record_recipe) until they cover its whole size space (recipe_space), `record_recipe` the region of one
call unless one already covers it; `relink` adds libraries to entries built before linking.
`record_work` explores the signatures of a planning worker's work items (a training one's forward without LSE
too). Parent side: `unlinked` lists the entries to relink, `save` merges the recorded regions into the store.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import fa4
from ..domain import kernel_keys, probes, recipe_space
from ..domain.calls import Call
from ..domain.exact import ExactCall
from ..domain.recipe_format import HEADS, PAGE_SIZE, SIZE_NAMES, bound_sizes, call_sizes, sizes_of_call
from ..domain.region import Region
from ..domain.signature import Signature
from ..domain.skus import Sku
from ..errors import DiskFull
from ..store import Store, recipes


class Held:
    """Where a worker without a store (a Ray worker) keeps the objects it links, until they travel."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def put_object(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        self.data[digest] = data
        return digest


@dataclass
class Worker:
    """A build worker's lean state for one SKU and store, kept for the process (worker.py's `_lean_state`)."""

    sku: Sku
    store: Store | None  # None in a Ray worker: regions are recorded without a store's, objects are Held
    objects: Store | Held  # where linked libraries and the runtime libraries go
    tools: dict[str, str]  # this process's toolchain: regions of others in the store are not counted
    regions: dict[str, list[Region]] = field(default_factory=dict)  # per recipe key: known (stored or recorded)
    runtime_digests: dict[str, str] | None = None  # SONAME -> digest of the runtime libraries, once put


def runtime_needs(worker: Worker) -> dict[str, str]:
    """{SONAME: digest} of the runtime libraries a linked kernel needs, for the SKU's host architecture, each
    put once into worker.objects ("" for libtvm_ffi.so, which comes from the apache-tvm-ffi wheel, a base
    dependency of fa4-aot)."""
    if worker.runtime_digests is None:
        worker.runtime_digests = {
            name: "" if path is None else worker.objects.put_object(path.read_bytes())
            for name, path in fa4.runtime_libraries(worker.sku.host_target).items()}
    return dict(worker.runtime_digests)


def shared_libs(worker: Worker, data: bytes) -> dict[str, Any]:
    """Entry.shared_libs for one exported object: {host arch: {digest, size, needs}}, linked for the SKU's host
    target (whatever the build host's own architecture)."""
    host = worker.sku.host_target
    lib = fa4.link(data, host)
    needs = runtime_needs(worker)
    return {host.arch: {"digest": worker.objects.put_object(lib), "size": len(lib), "needs": needs}}


def record_recipe(worker: Worker, call: Call, recorded: dict[str, list[Region]]) -> None:
    """Record the recipe region of `call` into `recorded` unless one recorded here or in the store covers it (the
    file is by GQA ratio: a region recorded for other head counts of the ratio may cover it)."""
    if call.layout not in SIZE_NAMES:
        return
    sig = Signature.of(call)
    known = _known(worker, recipes.recipe_key(sig, worker.sku))
    sizes = call_sizes(call)
    if recipes.find(known, sizes) is None:
        _record(worker, sig, sizes, recorded)


@dataclass(frozen=True)
class Explored:
    """What exploring one signature's size space did: regions recorded, points judged, FA4's refusals (one each
    for a region of sizes FA4 refuses alike: fa4/record.py's Refused carries its guards)."""

    recorded: int
    points: int
    refused: tuple[str, ...]


def explore(worker: Worker, sig: Signature, recorded: dict[str, list[Region]],
            first: Sequence[dict[str, int]] = ()) -> Explored:
    """Record regions of `sig` until they cover its whole size space (recipe_space.space): points are drawn in
    rounds of ROUND; at each point no region covers, FA4 is recorded there (a region holding exactly where FA4
    makes the same choices); the first round is the space's corners (recipe_space.corners); exploring ends after
    CLEAN_ROUNDS rounds in a row in which every point was covered, each twice as large as the one before (20,000
    to 160,000 points: 300,000 covered points in a row).
    `first`: sizes to record at before drawing (a call's own). Regions already in the store (or recorded for
    other head counts of the GQA ratio) count, so a rebuild records only what is missing."""
    if sig.layout not in SIZE_NAMES:
        return Explored(0, 0, ())
    sku = worker.sku
    known = _known(worker, recipes.recipe_key(sig, sku))
    sp = recipe_space.space(sig, sku)
    rng = np.random.default_rng(int(hashlib.sha256(kernel_keys.dumps(sig.to_dict()).encode()).hexdigest()[:15], 16))
    before, judged, clean = len(known), 0, 0
    refused: dict[str, list[Any]] = {}  # FA4's refusal -> the guards under which it refuses (not stored)
    seeds = [{**bound_sizes(sig), **p} for p in first]
    corners: dict[str, Any] | None = recipe_space.corners(sp)
    while clean < CLEAN_ROUNDS:
        count = ROUND << clean  # a round after a clean one is twice as large
        points = _with_seeds(_one_token_pages(recipe_space.pinned(corners or recipe_space.draw(
            sp, rng, count, {n: _hints(known) for n in sp.names}), sig)), seeds)
        seeds, corners, judged = [], None, judged + len(points[HEADS])
        judge = recipe_space.Judge(points)  # the regions share most guards: each distinct one is evaluated once
        open_ = ~judge.any_covers([*(r.guards for r in known), *refused.values()])
        clean = clean + 1 if not open_.any() else 0
        while open_.any():
            at = recipe_space.point(points, int(np.argmax(open_)))
            open_[int(np.argmax(open_))] = False
            try:
                guards = _record(worker, sig, at, recorded).guards
            except Exception as e:  # FA4 refuses these sizes: so does FA4 at run time; go on with the others
                guards = getattr(e, "guards", None) or [_only(at)]
                refused[f"{at}: {str(e).splitlines()[0][:200] if str(e) else type(e).__name__}"] = guards
                if len(refused) >= MAX_REFUSED:
                    return Explored(len(known) - before, judged, tuple(refused))
            open_ &= ~judge.covered(guards)
    return Explored(len(known) - before, judged, tuple(refused))


def _one_token_pages(points: dict[str, Any]) -> dict[str, Any]:
    """Every other point of a paged signature at page size 1: torch's contiguity check of the pool (FA4's
    maybe_contiguous) guards `page_size == 1` (a dimension of size 1 may have any stride), so a region recorded at
    another page size never holds there; exploring both serves every page size. FA4 launches the
    signature's kernels there unless its page size is FA4's tile (paged_kv_tma: 128 on sm_90 at head dim 72):
    page size 1 then takes the non-TMA kernel, which a build for that page size does not compile (the region names
    it; both runtimes raise KernelMissing there, and certification leaves it out). Other points as they are."""
    if PAGE_SIZE in points:
        points[PAGE_SIZE] = np.where(np.arange(len(points[PAGE_SIZE])) % 2 == 1, 1, points[PAGE_SIZE])
    return points


def _only(at: dict[str, int]) -> list[Any]:
    """Guards holding at `at` alone."""
    return [["eq", ["sym", name], value] for name, value in at.items()]


ROUND = 20_000  # points drawn in a round of exploring after one that found an uncovered point
CLEAN_ROUNDS = 4  # rounds in a row with every point covered before a signature's space counts as covered
MAX_REFUSED = 64  # refusals (each a region FA4 refuses, or a point) before exploring a signature stops


def _with_seeds(points: dict[str, Any], seeds: list[dict[str, int]]) -> dict[str, Any]:
    if not seeds:
        return points
    return {n: np.concatenate([np.array([s[n] for s in seeds], dtype=np.int64), v]) for n, v in points.items()}


def _hints(regions: list[Region]) -> set[int]:
    return recipe_space.constants(g for r in regions for g in r.guards)


def _known(worker: Worker, key: str) -> list[Region]:
    """The regions under `key` recorded in this worker or in the store with this toolchain (kept per worker)."""
    known = worker.regions
    if key not in known:
        store = worker.store
        stored = recipes.load(store, key) if store is not None else []  # Ray workers have no store
        known[key] = [r for r in stored if r.toolchain == worker.tools]
    return known[key]


def _record(worker: Worker, sig: Signature, sizes: dict[str, int],
            recorded: dict[str, list[Region]]) -> Region:
    key = recipes.recipe_key(sig, worker.sku)
    region = fa4.record_recipe(sig, sizes, worker.sku)  # parsed: what clients would refuse fails here
    if not region.holds({**bound_sizes(sig), **sizes}):
        raise ValueError(f"the region recorded at {sizes} does not hold there (a recorder fault)")
    _known(worker, key).append(region)
    recorded.setdefault(key, []).append(region)
    return region


def record_work(worker: Worker, work: list[tuple[str, Call | Signature]], kernels: list[tuple[Any, ...]],
                failures: list[tuple[int, str]], one_line: Any) -> tuple[dict[str, list[Region]], list[str]]:
    """(regions recorded, errors) for the work items FA4 accepted (not in `failures`): each item's signature
    explored over its whole size space (`explore`; a Call's own sizes first), and for a training signature its
    forward without LSE too (the kernels complete.py plans for it), so a forward-only call is served wherever
    training is. `kernels` (worker.plan_calls's) is not read: where regions are recorded no longer depends on
    the calls the planner chose."""
    rejected = {i for i, _error in failures}
    recorded: dict[str, list[Region]] = {}
    errors: list[str] = []
    done: set[Signature] = set()
    for i, (_label, item) in enumerate(work):
        if i in rejected:
            continue
        sig = Signature.of(item) if isinstance(item, Call) else item
        first = [sizes_of_call(item.layout, item.batch, item.seqlen_q, item.seqlen_k, item.page_size)] \
            if isinstance(item, Call) else []
        for each in explored(sig):
            if each in done:
                continue
            done.add(each)
            try:
                found = explore(worker, each, recorded, first if each == sig else [])
            except Exception as e:  # the call still builds for install(); the lean runtime will say it lacks a recipe
                errors.append(f"recipes of {each.call(1, 1, 1).describe()}: {one_line(e)}")
                continue
            if found.refused:
                errors.append(f"recipes of {each.call(1, 1, 1).describe()}: FA4 refuses {len(found.refused)} "
                              f"point(s) of its size space, e.g. {found.refused[0]}")
    return recorded, errors


def explored(sig: Signature) -> list[Signature]:
    """The signatures `record_work` explores for a work item of signature `sig`: its own and, for a training
    one, its forward without LSE."""
    return [sig, *probes.forward_of(sig)]


def recipe_keys(item: Call | ExactCall | Signature, sku: Sku) -> list[str]:
    """The recipe files exploring `item` records into (an ExactCall stands as its Call, as worker.py's
    _for_recipes passes it; one without a Call records nothing): planning groups items by them (plan_tasks)."""
    stand_in = item.call if isinstance(item, ExactCall) else item
    if stand_in is None:
        return []
    sig = Signature.of(stand_in) if isinstance(stand_in, Call) else stand_in
    return [recipes.recipe_key(s, sku) for s in explored(sig) if s.layout in SIZE_NAMES]


def relink(worker: Worker, keys: list[str], one_line: Any) -> list[str]:
    """Add this host's library to entries that lack it (built before linking, or whose library or runtime
    bytes went missing: `unlinked`): no recompiling. Returns errors."""
    store = worker.store
    if store is None:
        raise ValueError("relinking needs a worker with a store")
    worker.runtime_digests = None  # put the runtime libraries into the store again: one may be gone
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
            keys += [base, kernel_keys.device_key(base, entry, sku.constants())]  # one key where it consumed none
    entries = [store.get_entry(kk) for kk in dict.fromkeys(keys)]
    return [e.kernel_key for e in entries if e is not None and not store.has_library(e, sku.host_target.arch)]


def save(store: Store, recorded: dict[str, list[Region]]) -> int:
    """Merge recorded regions into the store's recipe files; the number of regions recorded."""
    for key, regions in recorded.items():
        recipes.merge(store, key, regions)
    return sum(len(r) for r in recorded.values())
