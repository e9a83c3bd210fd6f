"""The worker side of a build: runs in a process configured for one SKU (fa4.configure), never in the driver.

Both executors (executors.py: a local process pool; farm.py: Ray) run these functions. `plan_calls` lists the
kernels of some work items (calls, or signatures planned at every shape); `compile_kernels` compiles the wanted
kernels of one call and hands each one, as its index entries (full key first, then the base key's signpost when
the kernel consumed SKU constants) plus its object bytes, to a sink: the local pool's sink commits to the shared
store (commit.py: the kernel's lock is taken after the compile, only to re-check and commit), Ray's returns the
bytes to the driver or publishes them to a server. Given the store,
planning also records the lean runtime's recipe regions; compiling links each kernel's library (lean.py)
into the store, or, in a worker without one (Ray's), holds it until it travels with the kernel (`lean_objects`).
FA4 is reached only through the seam, fa4_aot.fa4.
"""

from __future__ import annotations

import hashlib
import os
import traceback
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

from .. import fa4
from ..domain import kernel_keys, known_bad
from ..domain.calls import Call
from ..domain.exact import ExactCall
from ..domain.region import Region
from ..domain.signature import Signature
from ..domain.skus import Sku
from ..errors import DiskFull
from ..store import Entry, Store
from . import lean, refusals


class Wanted(NamedTuple):
    """A kernel a compile task is to build."""

    family: str
    ident: str  # canonical compile-key JSON
    kernel_key: str  # its base key: the compile decides which SKU constants it consumes


class Kernel(NamedTuple):
    """A kernel some work item needs, as planning found it."""

    family: str
    ident: str  # canonical compile-key JSON
    kernel_key: str  # its base key
    work_index: int  # the work item (in the list planned) that needs it
    call: Call | ExactCall  # a concrete call of that item that makes FA4 choose it

    def wanted(self) -> Wanted:
        return Wanted(self.family, self.ident, self.kernel_key)


class Rejected(NamedTuple):
    """A work item FA4 rejected while planning, or that the known-bad registry refused (refusals.py)."""

    work_index: int
    error: str
    known_bad: str = ""  # the id of the registry entry that refused it; "" when FA4 rejected it


class PlanOut(NamedTuple):
    """What planning a list of work items found."""

    kernels: list[Kernel]
    rejected: list[Rejected]
    regions: dict[str, list[Region]]  # recorded recipe regions {recipe key: regions}; {} unless asked
    lean_failures: list[str]  # recipes the lean runtime will lack, and why


Sink = Callable[[list[Entry], bytes], None]

_configured: list[Sku] = []
_lean: list[lean.Worker] = []  # lean's per-process state for the last SKU and store (_lean_state)


def configure(sku: Sku) -> None:
    """Point this process at `sku` once, before FA4 is imported. Raises BuildError if it already serves another."""
    if _configured:
        if _configured[0] != sku:
            from ..errors import BuildError

            raise BuildError(f"worker {os.getpid()} is configured for {_configured[0].name}, not {sku.name}")
        return
    import warnings

    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # before torch loads: silences FakeTensor data_ptr notices
    warnings.filterwarnings("ignore")  # CuTe's per-argument notices and torch's FakeTensor data_ptr notice
    fa4.configure(sku)
    _configured.append(sku)


def plan_calls(sku: Sku, work: list[tuple[str, Call | ExactCall | Signature]], store: Store | None = None,
               record: bool = True, registry: known_bad.Registry | None = None) -> PlanOut:
    """Every kernel the work items need (a Call: at its shapes; an ExactCall: for its recorded arguments; a
    Signature: at every shape), the items FA4 rejects or the known-bad `registry` refuses (default: the one in
    force for `store` and `sku`, refusals.in_force), and (with `record`) the recipe regions of the calls
    planned, skipping those `store` already has."""
    configure(sku)  # first: planning imports FA4, which must see the SKU's arch
    tools = fa4.toolchain()
    registry = registry if registry is not None else refusals.in_force(store, sku)
    kernels: list[Kernel] = []
    rejected: list[Rejected] = []
    for i, (_name, item) in enumerate(work):
        found = _plan_item(sku, tools, registry, store, item)
        if isinstance(found, Rejected):
            rejected.append(found._replace(work_index=i))
        else:
            kernels += [k._replace(work_index=i) for k in found]
    if not record:
        return PlanOut(kernels, rejected, {}, [])
    regions, errors = lean.record_work(_lean_state(sku, store), *_for_recipes(work, kernels, rejected),
                                             one_line)
    return PlanOut(kernels, rejected, regions, errors)


def _plan_item(sku: Sku, tools: dict[str, str], registry: known_bad.Registry, store: Store | None,
               item: Call | ExactCall | Signature) -> list[Kernel] | Rejected:
    """One work item's kernels (work_index left to the caller), or why it is not planned: the registry refuses
    its signature (before FA4 is asked) or one of its kernels (after), or FA4 rejects it."""
    sig = refusals.signature_of(item)
    bad = refusals.refusal(registry, sku, tools, sig)
    if bad is not None:
        return Rejected(-1, bad.describe(), bad.id)
    found: Mapping[tuple[str, str], tuple[Any, Call | ExactCall]]
    try:
        found = {ident: (key, item) for ident, key in fa4.plan(item).items()} \
            if isinstance(item, Call | ExactCall) else fa4.plan_signature(item, sku)
    except Exception as e:  # FA4 rejects the item for this SKU: report it, go on
        return Rejected(-1, one_line(e))
    kernels = [Kernel(family, ident, kernel_keys.kernel_key(family, key, sku, tools), -1, call)
               for (family, ident), (key, call) in found.items()]
    names = refusals.kernel_names(registry, store, sku, [k.kernel_key for k in kernels])
    bad = refusals.refusal(registry, sku, tools, sig, names)
    return Rejected(-1, bad.describe(), bad.id) if bad is not None else kernels


def _for_recipes(work: list[tuple[str, Call | ExactCall | Signature]], kernels: list[Kernel], rejected: list[Rejected]
                 ) -> tuple[list[tuple[str, Call | Signature]], list[tuple[Any, ...]], list[tuple[int, str]]]:
    """(work, kernels, rejected) as lean.record_work takes them (Kernel and Rejected tuples): recipes are
    recorded at a Call's sizes, so an ExactCall stands as the Call its client summarised it as, and one without a
    Call is left out."""
    kept: list[tuple[str, Call | Signature]] = []
    index: dict[int, int] = {}
    for i, (name, item) in enumerate(work):
        stand_in = item.call if isinstance(item, ExactCall) else item
        if stand_in is not None:
            index[i] = len(kept)
            kept.append((name, stand_in))
    moved: list[tuple[Any, ...]] = [k._replace(work_index=index[k.work_index]) for k in kernels
                                    if k.work_index in index]
    refused: list[tuple[int, str]] = [(index[r.work_index], r.error) for r in rejected if r.work_index in index]
    return kept, moved, refused


def relink(sku: Sku, store: Store, keys: list[str]) -> list[str]:
    """Add this host's library to the entries `keys` that lack it; no recompiling. Returns errors."""
    configure(sku)
    return lean.relink(_lean_state(sku, store), keys, one_line)


def _lean_state(sku: Sku, store: Store | None) -> lean.Worker:
    """lean's state for `sku` and `store`, kept while they stay this process's; store None (Ray workers):
    recipes are recorded without checking a store and linked libraries are held in memory (lean.Held) until
    `lean_objects` hands them over."""
    def root(s: Store | None) -> Path | None:
        return s.root if s is not None else None

    if not _lean or _lean[0].sku != sku or root(_lean[0].store) != root(store):
        _lean[:] = [lean.Worker(sku, store, store if store is not None else lean.Held(), fa4.toolchain())]
    return _lean[0]


def lean_objects(sku: Sku, digests: list[str]) -> dict[str, bytes]:
    """In a worker without a store: {digest: bytes} of the held objects among `digests` (linked libraries and
    the runtime libraries they need). Libraries then leave this worker's memory; the runtime libraries stay, as
    every later library needs them too."""
    state = _lean_state(sku, None)
    held = state.objects
    if not isinstance(held, lean.Held):
        raise TypeError("lean_objects is for workers without a store")
    runtime = set(lean.runtime_needs(state).values())
    found = {d: held.data[d] for d in digests if d in held.data}
    for d in found:
        if d not in runtime:
            del held.data[d]
    return found


def runtime_objects(sku: Sku) -> dict[str, bytes]:
    """In a worker without a store: {digest: bytes} of the runtime libraries its linked libraries need (those the
    driver's store must hold too)."""
    configure(sku)
    return lean_objects(sku, [d for d in lean.runtime_needs(_lean_state(sku, None)).values() if d])


def compile_kernels(sku: Sku, variant: str, call: Call | ExactCall, wanted: list[Wanted], sink: Sink,
                    store: Store | None = None,
                    handling: Callable[[], AbstractContextManager[object]] = nullcontext) -> dict[str, str]:
    """Compile the `wanted` kernels of `call` and give each to `sink` (entries, object bytes). Each entry names
    its linked library, stored in `store` or, without one, held for `lean_objects` (lean.shared_libs).
    `handling()` encloses each compiled kernel's export and sink (temp files, the store's lock), the rest is
    FA4 compiling: a pool worker stops differently in each (executors._compile_task).
    Returns {kernel key: error} for the wanted kernels that did not reach the sink; raises DiskFull only."""
    configure(sku)  # first: FA4 must see the SKU's arch when it is imported
    by_ident = {(w.family, w.ident): w.kernel_key for w in wanted}
    sunk: set[str] = set()
    asked = [len(fa4.hardware_calls())]  # kernels compile one after another: later queries are the next one's

    def done(family: str, key: Any, fn: Any, seconds: float) -> None:
        with handling():
            _hand_over(family, key, fn, seconds)

    def _hand_over(family: str, key: Any, fn: Any, seconds: float) -> None:
        kk = by_ident[(family, kernel_keys.dumps(kernel_keys.canonical(key)))]
        queries = fa4.hardware_calls()[asked[0]:]
        asked[0] += len(queries)
        data = fa4.export(fn, sku.host_target)
        base = Entry(
            kernel_key=kk, object_digest=hashlib.sha256(data).hexdigest(), size=len(data), family=family,
            compile_key=kernel_keys.canonical(key),
            sku=sku.name, arch=sku.arch, sm_count=sku.sm_count, l2_bytes=sku.l2_bytes, cuda_major=sku.cuda_major,
            toolchain=fa4.toolchain(), variant=variant, call=call.describe(), compile_seconds=round(seconds, 3),
            hardware_queries=[list(q) for q in queries], host=sku.host,
            shared_libs=lean.shared_libs(_lean_state(sku, store), data),
        )
        full = kernel_keys.entry_keys(base)[1]
        # stored under the full key (the constants it consumed); the base entry is the signpost saying which
        sink([replace(base, kernel_key=full), base] if full != kk else [base], data)
        sunk.add(kk)

    try:
        fa4.compile_call(call, set(by_ident), done)
        error = "FA4 did not ask for this kernel when the call was re-run"
    except DiskFull:  # not this kernel's fault: every later write fails too, so the build stops
        raise
    except Exception as e:
        error = one_line(e)
    return {kk: error for kk in by_ident.values() if kk not in sunk}


def one_line(e: BaseException) -> str:
    where = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
    at = f" (at {Path(where.filename).name}:{where.lineno})" if where else ""
    text = " ".join(str(e).split())[:300] or "no message"
    return f"{type(e).__name__}: {text}{at}"
