"""`fa4-aot build`: plan every call of the selected variants for one SKU, then compile what the store lacks.

Work happens in spawned worker processes configured for the target SKU (fa4.configure); this
process never imports FA4, so one process can build several SKUs in turn. Each kernel is compiled
by exactly one worker (the first call that needs it), exported (fa4.export), and stored object
first, index entry last. Failures are reported per call and per kernel while the rest goes on.
FA4 is reached only through the seam, fa4_aot.fa4.
"""

from __future__ import annotations

import multiprocessing
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from . import fa4, kernel_keys
from .calls import Call
from .errors import DiskFull
from .signature import Signature
from .skus import Sku
from .store import Entry, Store
from .variants import Matrix, ModelVariant, Variant


@dataclass
class Result:
    status: str  # "built", "present" or "failed"
    family: str
    kernel_key: str
    variant: str
    call: str
    seconds: float = 0.0
    size: int = 0
    error: str = ""


@dataclass
class Report:
    sku: str
    calls: int = 0
    # FA4's dispatch read this SM count while planning (FLASH_ATTENTION_NUM_SMS): the kernels chosen for a call
    # (split-KV, persistent, 2-CTA) are those of this SKU's dispatch, whoever else shares them
    dispatch_sm_count: int = 0
    results: list[Result] = field(default_factory=list)
    call_failures: list[Result] = field(default_factory=list)  # calls FA4 rejected while planning
    seconds: float = 0.0
    to_build: int = 0  # kernels the store lacked after planning
    finished: int = 0  # of those, how many workers finished (built, failed, or found present under the lock)
    interrupted: bool = False  # Ctrl-C (SIGINT) stopped the build: the kernels in flight were dropped

    @property
    def not_built(self) -> int:
        return self.to_build - self.finished
    by_variant: dict[str, set[str]] = field(default_factory=dict)  # label -> every kernel key it needs

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.results)

    @property
    def failed(self) -> int:
        return self.count("failed") + len(self.call_failures)

    def to_dict(self) -> dict[str, Any]:
        return {
            "sku": self.sku, "dispatch": {"sku": self.sku, "sm_count": self.dispatch_sm_count},
            "calls": self.calls, "kernels": len(self.results), "built": self.count("built"),
            "present": self.count("present"), "planned": self.count("planned"), "failed": self.failed,
            "seconds": round(self.seconds, 2), "interrupted": self.interrupted, "not_built": self.not_built,
            "kernel_keys": sorted(r.kernel_key for r in self.results if r.status != "failed"),
            "variants": {name: len(keys) for name, keys in sorted(self.by_variant.items())},
            "failures": [asdict(r) for r in self.call_failures + [r for r in self.results if r.status == "failed"]],
        }


@dataclass(frozen=True)
class Planned:
    family: str
    ident: str  # canonical compile-key JSON
    kernel_key: str  # the base key (no constants): the compile decides what it consumes
    work_index: int  # the first work item that needs it
    call: Call  # a concrete call of that item that makes FA4 choose it


Work = list[tuple[str, Call | Signature]]  # (label, a concrete call or a shape-complete signature)


def stored_key(store: Store, base_key: str, sku: Sku) -> str | None:
    """The key under which `store` holds the kernel with base key `base_key` for `sku`, or None: the base key
    when its kernel consumed no constant, else the variant for the SKU's constant values if it is stored."""
    entry = store.get_entry(base_key)
    if entry is None or not entry.hardware_queries:
        return None if entry is None else base_key
    full = kernel_keys.variant_key(entry, sku.constants())
    return full if store.has_entry(full) else None


def build(
    matrix: Matrix,
    sku: Sku,
    store: Store,
    variants: list[Variant | ModelVariant] | None = None,
    jobs: int = 1,
    progress: Callable[[int, int, Result], None] | None = None,
    dry_run: bool = False,
) -> Report:
    """Build every kernel of `variants` (default: all) for `sku` into `store`. Never raises for a kernel
    that fails to compile: it is in the report, which the caller turns into an exit status. With
    `dry_run`, plan only: kernels the store lacks are reported as "planned"."""
    return build_calls(sku, store, work_of(matrix, sku, variants), jobs=jobs, progress=progress, dry_run=dry_run)


def work_of(matrix: Matrix, sku: Sku, variants: list[Variant | ModelVariant] | None = None) -> Work:
    """The work items of `variants` (default: all) that apply to `sku`: a shape-complete variant gives its
    signatures, a grid variant its calls."""
    chosen = [v for v in (variants or list(matrix.variants)) if v.applies_to(sku)]
    work: Work = []
    for v in chosen:
        items: list[Call | Signature] = [*v.signatures()] if isinstance(v, ModelVariant) or v.complete else [
            *v.calls(matrix.shapes[v.shapes])]
        work += [(v.name, item) for item in items]
    return work


def build_calls(
    sku: Sku,
    store: Store,
    work: Work,
    jobs: int = 1,
    progress: Callable[[int, int, Result], None] | None = None,
    dry_run: bool = False,
) -> Report:
    """Build the kernels of explicit (label, Call or Signature) pairs: a Call's kernels at its shapes, a
    Signature's at every shape (complete.py), e.g. model signatures or the calls clients reported missing.

    Ctrl-C (KeyboardInterrupt) stops it within seconds: queued kernels are cancelled, workers are told to
    stop and the kernels they were compiling are dropped (entries are written last, so none is partial);
    the report comes back with `interrupted` set and `not_built` counting what was left."""
    started = time.perf_counter()
    report = Report(sku=sku.name, calls=len(work), dispatch_sm_count=sku.sm_count)
    jobs = max(1, jobs)
    context = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(jobs, mp_context=context, initializer=_init_worker, initargs=(sku, str(store.root)))
    todo: dict[Call, list[Planned]] = {}
    try:
        planned = _plan(pool, work, jobs, report)
        todo = _triage(planned, work, store, sku, report, dry_run)
        _compile(pool, todo, work, report, progress)
    except KeyboardInterrupt:
        report.interrupted = True
    finally:
        _shutdown(pool, stop=report.interrupted)
    if report.interrupted:
        _count_stored(todo, work, store, report)
    report.seconds = time.perf_counter() - started
    return report


def _count_stored(todo: dict[Call, list[Planned]], work: Work, store: Store, report: Report) -> None:
    """After an interrupt: a worker stores each kernel as it finishes but reports a call's kernels together, so
    the store, not the reports, says which kernels of the unfinished calls were built."""
    reported = {r.kernel_key for r in report.results}
    for call, kernels in todo.items():
        name = work[kernels[0].work_index][0]
        for p in kernels:
            if p.kernel_key not in reported and store.has_entry(p.kernel_key):
                report.results.append(Result("built", p.family, p.kernel_key, name, call.describe()))
                report.finished += 1


def _shutdown(pool: ProcessPoolExecutor, stop: bool, grace: float = 5.0) -> None:
    """Close the pool; with `stop`, cancel what is queued and end the workers: SIGTERM first (a worker exits
    through its finally blocks, removing its temp files and releasing its locks), SIGKILL after `grace`."""
    if not stop:
        pool.shutdown()
        return
    workers = list(getattr(pool, "_processes", {}).values())  # the stdlib keeps no public handle on them
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in workers:
        proc.terminate()
    deadline = time.monotonic() + grace
    for proc in workers:
        proc.join(max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join()


def _plan(pool: ProcessPoolExecutor, work: Work, jobs: int, report: Report) -> list[Planned]:
    """Every distinct kernel of `work`, each attributed to the first work item that needs it."""
    offsets = [list(range(i, len(work), jobs)) for i in range(jobs)]
    futures = [pool.submit(_plan_task, [work[i] for i in chunk]) for chunk in offsets]
    planned: dict[str, Planned] = {}
    for chunk, future in zip(offsets, futures, strict=True):
        kernels, failures = future.result()
        for family, ident, kernel_key, local, call in kernels:
            index = chunk[local]
            report.by_variant.setdefault(work[index][0], set()).add(kernel_key)
            if kernel_key not in planned or index < planned[kernel_key].work_index:
                planned[kernel_key] = Planned(family, ident, kernel_key, index, call)
        for local, error in failures:
            name, item = work[chunk[local]]
            report.call_failures.append(Result("failed", "", "", name, _describe(item), error=error))
    return sorted(planned.values(), key=lambda p: p.kernel_key)


def _describe(item: Call | Signature) -> str:
    if isinstance(item, Call):
        return item.describe()
    return item.call(0, 0, 0).describe().replace(" b=0 sq=0 sk=0", " all shapes")


def _triage(planned: list[Planned], work: Work, store: Store, sku: Sku, report: Report,
            dry_run: bool) -> dict[Call, list[Planned]]:
    """Record kernels already stored (or, in a dry run, all of them); group the rest by the call that builds them."""
    todo: dict[Call, list[Planned]] = {}
    for p in planned:
        name = work[p.work_index][0]
        held = stored_key(store, p.kernel_key, sku)
        if held or dry_run:
            report.results.append(Result("present" if held else "planned", p.family, held or p.kernel_key,
                                         name, p.call.describe()))
        else:
            todo.setdefault(p.call, []).append(p)
    return todo


def _compile(pool: ProcessPoolExecutor, todo: dict[Call, list[Planned]], work: Work,
             report: Report, progress: Callable[[int, int, Result], None] | None) -> None:
    total, done = sum(len(v) for v in todo.values()), 0
    report.to_build = total
    futures = [pool.submit(_compile_task, work[ps[0].work_index][0], call,
                           [(p.family, p.ident, p.kernel_key) for p in ps])
               for call, ps in todo.items()]
    for future in as_completed(futures):
        try:
            results = future.result()
        except DiskFull:
            for other in futures:
                other.cancel()
            raise
        for result in results:
            report.results.append(result)
            done += 1
            report.finished = done
            if progress:
                progress(done, total, result)


# -- worker side: everything below runs in spawned processes configured for one SKU ----------------
_worker: dict[str, Any] = {}


def _init_worker(sku: Sku, store_root: str) -> None:
    import os
    import signal
    import sys
    import warnings

    # Ctrl-C reaches the whole process group: the parent decides (see _shutdown), workers do not die mid-write.
    # Its SIGTERM then unwinds the worker through its finally blocks (temp files removed, locks released).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # before torch loads: silences FakeTensor data_ptr notices
    warnings.filterwarnings("ignore")  # CuTe's per-argument notices and torch's FakeTensor data_ptr notice
    fa4.configure(sku)
    _worker.update(sku=sku, store=Store(Path(store_root)), tools=fa4.toolchain())


def _plan_task(work: Work) -> tuple[list[tuple[str, str, str, int, Call]], list[tuple[int, str]]]:
    sku: Sku = _worker["sku"]
    kernels, failures = [], []
    for i, (_name, item) in enumerate(work):
        try:
            if isinstance(item, Call):
                found = {ident: (key, item) for ident, key in fa4.plan(item).items()}
            else:
                found = fa4.plan_signature(item, sku)
        except Exception as e:  # FA4 rejects the call for this SKU: report it, go on
            failures.append((i, _one_line(e)))
            continue
        for (family, ident), (key, call) in found.items():
            kernels.append((family, ident, kernel_keys.kernel_key(family, key, sku, _worker["tools"]), i, call))
    return kernels, failures


def _compile_task(variant: str, call: Call, wanted: list[tuple[str, str, str]]) -> list[Result]:
    store: Store = _worker["store"]
    sku: Sku = _worker["sku"]
    by_ident = {(f, ident): kk for f, ident, kk in wanted}
    results: dict[str, Result] = {}
    # kernels compile one after another, so the HardwareInfo queries since the last one belong to this one
    asked = [len(fa4.hardware_calls())]

    def done(family: str, key: Any, fn: Any, seconds: float) -> None:
        base = by_ident[(family, kernel_keys.dumps(kernel_keys.canonical(key)))]
        queries = fa4.hardware_calls()[asked[0]:]
        asked[0] += len(queries)
        data = fa4.export(fn)
        entry = Entry(
            kernel_key=base, object_digest=store.put_object(data), size=len(data), family=family,
            compile_key=kernel_keys.canonical(key), sku=sku.name, arch=sku.arch, sm_count=sku.sm_count,
            l2_bytes=sku.l2_bytes, cuda_major=sku.cuda_major, toolchain=_worker["tools"], variant=variant,
            call=call.describe(), compile_seconds=round(seconds, 3), hardware_queries=[list(q) for q in queries])
        full = kernel_keys.entry_keys(entry)[1]
        store.put_entry(replace(entry, kernel_key=full))
        if full != base and not store.has_entry(base):  # the signpost: which constants this kernel consumed
            store.put_entry(entry)
        results[base] = Result("built", family, full, variant, call.describe(), seconds=seconds, size=len(data))

    with ExitStack() as stack:
        for kk in sorted(by_ident.values()):
            stack.enter_context(store.lock(kk))
        # Re-check under the locks: another builder on this cache may have finished meanwhile.
        held = {ident: stored_key(store, kk, sku) for ident, kk in by_ident.items()}
        pending = {ident for ident, key in held.items() if key is None}
        for ident, kk in by_ident.items():
            if ident not in pending:
                results[kk] = Result("present", ident[0], held[ident] or kk, variant, call.describe())
        try:
            if pending:
                fa4.compile_call(call, pending, done)
            error = "FA4 did not ask for this kernel when the call was re-run"
        except DiskFull:  # not this kernel's fault: every later write fails too, so the build stops
            raise
        except Exception as e:
            error = _one_line(e)
    for (family, _ident), kk in by_ident.items():
        results.setdefault(kk, Result("failed", family, kk, variant, call.describe(), error=error))
    return list(results.values())


def _one_line(e: BaseException) -> str:
    where = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
    at = f" (at {Path(where.filename).name}:{where.lineno})" if where else ""
    text = " ".join(str(e).split())[:300] or "no message"
    return f"{type(e).__name__}: {text}{at}"
