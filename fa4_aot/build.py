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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import build_lean, fa4, kernel_keys
from .calls import Call
from .errors import DiskFull
from .skus import Sku
from .store import Entry, Store
from .variants import Matrix, Variant


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
    results: list[Result] = field(default_factory=list)
    call_failures: list[Result] = field(default_factory=list)  # calls FA4 rejected while planning
    recipes: int = 0  # lean-runtime recipe regions recorded (build_lean.py)
    lean_failures: list[str] = field(default_factory=list)  # recipes or libraries the lean runtime will lack
    seconds: float = 0.0

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.results)

    @property
    def failed(self) -> int:
        return self.count("failed") + len(self.call_failures)

    def to_dict(self) -> dict[str, Any]:
        return {
            "sku": self.sku, "calls": self.calls, "kernels": len(self.results), "built": self.count("built"),
            "present": self.count("present"), "planned": self.count("planned"), "failed": self.failed,
            "seconds": round(self.seconds, 2), "recipes": self.recipes, "lean_failures": self.lean_failures,
            "kernel_keys": sorted(r.kernel_key for r in self.results if r.status != "failed"),
            "failures": [asdict(r) for r in self.call_failures + [r for r in self.results if r.status == "failed"]],
        }


@dataclass(frozen=True)
class Planned:
    family: str
    ident: str  # canonical compile-key JSON
    kernel_key: str
    call_index: int


def build(
    matrix: Matrix,
    sku: Sku,
    store: Store,
    variants: list[Variant] | None = None,
    jobs: int = 1,
    progress: Callable[[int, int, Result], None] | None = None,
    dry_run: bool = False,
) -> Report:
    """Build every kernel of `variants` (default: all) for `sku` into `store`. Never raises for a kernel
    that fails to compile: it is in the report, which the caller turns into an exit status. With
    `dry_run`, plan only: kernels the store lacks are reported as "planned"."""
    chosen = [v for v in (variants or list(matrix.variants)) if v.applies_to(sku)]
    work = [(v.name, c) for v in chosen for c in v.calls(matrix.shapes[v.shapes])]
    return build_calls(sku, store, work, jobs=jobs, progress=progress, dry_run=dry_run)


def build_calls(
    sku: Sku,
    store: Store,
    work: list[tuple[str, Call]],
    jobs: int = 1,
    progress: Callable[[int, int, Result], None] | None = None,
    dry_run: bool = False,
) -> Report:
    """Build the kernels of explicit (label, call) pairs, e.g. the calls clients reported missing."""
    started = time.perf_counter()
    report = Report(sku=sku.name, calls=len(work))
    jobs = max(1, jobs)
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(jobs, mp_context=context, initializer=_init_worker,
                             initargs=(sku, str(store.root))) as pool:
        planned = _plan(pool, work, jobs, report, store, dry_run)
        todo = _triage(planned, work, store, report, dry_run)
        if not dry_run:
            unlinked = build_lean.unlinked(store, [p.kernel_key for p in planned])
            report.lean_failures += pool.submit(_relink_task, unlinked).result() if unlinked else []
        _compile(pool, todo, work, report, progress)
    report.seconds = time.perf_counter() - started
    return report


def _plan(pool: ProcessPoolExecutor, work: list[tuple[str, Call]], jobs: int, report: Report, store: Store,
          dry_run: bool) -> list[Planned]:
    """Every distinct kernel of `work`, each attributed to the first call that needs it."""
    offsets = [list(range(i, len(work), jobs)) for i in range(jobs)]
    futures = [pool.submit(_plan_task, [work[i] for i in chunk]) for chunk in offsets]
    planned: dict[str, Planned] = {}
    recorded: dict[str, list[dict[str, Any]]] = {}
    for chunk, future in zip(offsets, futures, strict=True):
        kernels, failures, regions, lean_failures = future.result()
        for key, found in regions.items():
            recorded.setdefault(key, []).extend(found)
        report.lean_failures += lean_failures
        for family, ident, kernel_key, local in kernels:
            index = chunk[local]
            if kernel_key not in planned or index < planned[kernel_key].call_index:
                planned[kernel_key] = Planned(family, ident, kernel_key, index)
        for local, error in failures:
            name, call = work[chunk[local]]
            report.call_failures.append(Result("failed", "", "", name, call.describe(), error=error))
    report.recipes = sum(len(r) for r in recorded.values()) if dry_run else build_lean.save(store, recorded)
    return sorted(planned.values(), key=lambda p: p.kernel_key)


def _triage(planned: list[Planned], work: list[tuple[str, Call]], store: Store, report: Report,
            dry_run: bool) -> dict[int, list[Planned]]:
    """Record kernels already stored (or, in a dry run, all of them); group the rest by the call that builds them."""
    todo: dict[int, list[Planned]] = {}
    for p in planned:
        name, call = work[p.call_index]
        if store.has_entry(p.kernel_key) or dry_run:
            status = "present" if store.has_entry(p.kernel_key) else "planned"
            report.results.append(Result(status, p.family, p.kernel_key, name, call.describe()))
        else:
            todo.setdefault(p.call_index, []).append(p)
    return todo


def _compile(pool: ProcessPoolExecutor, todo: dict[int, list[Planned]], work: list[tuple[str, Call]],
             report: Report, progress: Callable[[int, int, Result], None] | None) -> None:
    total, done = sum(len(v) for v in todo.values()), 0
    futures = [pool.submit(_compile_task, *work[i], [(p.family, p.ident, p.kernel_key) for p in ps])
               for i, ps in todo.items()]
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
            if progress:
                progress(done, total, result)


# -- worker side: everything below runs in spawned processes configured for one SKU ----------------
_worker: dict[str, Any] = {}


def _init_worker(sku: Sku, store_root: str) -> None:
    import os
    import warnings

    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # before torch loads: silences FakeTensor data_ptr notices
    warnings.filterwarnings("ignore")  # CuTe's per-argument notices and torch's FakeTensor data_ptr notice
    fa4.configure(sku)
    _worker.update(sku=sku, store=Store(Path(store_root)), tools=fa4.toolchain())


def _plan_task(work: list[tuple[str, Call]]) -> tuple[list[tuple[str, str, str, int]], list[tuple[int, str]],
                                                    dict[str, list[dict[str, Any]]], list[str]]:
    kernels, failures = [], []
    recorded: dict[str, list[dict[str, Any]]] = {}
    lean_failures: list[str] = []
    for i, (_name, call) in enumerate(work):
        try:
            seen = fa4.plan(call)
        except Exception as e:  # FA4 rejects the call for this SKU: report it, go on
            failures.append((i, _one_line(e)))
            continue
        for (family, ident), key in seen.items():
            kernels.append((family, ident, kernel_keys.kernel_key(family, key, _worker["sku"], _worker["tools"]), i))
        try:
            build_lean.record_recipe(_worker, call, recorded)
        except Exception as e:  # the call still builds for install(); the lean runtime will say it lacks a recipe
            lean_failures.append(f"recipe of {call.describe()}: {_one_line(e)}")
    return kernels, failures, recorded, lean_failures


def _relink_task(kernel_keys: list[str]) -> list[str]:
    return build_lean.relink(_worker, kernel_keys, _one_line)


def _compile_task(variant: str, call: Call, wanted: list[tuple[str, str, str]]) -> list[Result]:
    store: Store = _worker["store"]
    sku: Sku = _worker["sku"]
    by_ident = {(f, ident): kk for f, ident, kk in wanted}
    results: dict[str, Result] = {}
    # kernels compile one after another, so the HardwareInfo queries since the last one belong to this one
    asked = [len(fa4.hardware_calls())]

    def done(family: str, key: Any, fn: Any, seconds: float) -> None:
        kk = by_ident[(family, kernel_keys.dumps(kernel_keys.canonical(key)))]
        queries = fa4.hardware_calls()[asked[0]:]
        asked[0] += len(queries)
        data = fa4.export(fn)
        digest = store.put_object(data)
        store.put_entry(Entry(
            kernel_key=kk, object_digest=digest, size=len(data), family=family, compile_key=kernel_keys.canonical(key),
            sku=sku.name, arch=sku.arch, sm_count=sku.sm_count, l2_bytes=sku.l2_bytes, cuda_major=sku.cuda_major,
            toolchain=_worker["tools"], variant=variant, call=call.describe(), compile_seconds=round(seconds, 3),
            hardware_queries=[list(q) for q in queries], shared_libs=build_lean.shared_libs(_worker, data),
        ))
        results[kk] = Result("built", family, kk, variant, call.describe(), seconds=seconds, size=len(data))

    with ExitStack() as stack:
        for kk in sorted(by_ident.values()):
            stack.enter_context(store.lock(kk))
        # Re-check under the locks: another builder on this cache may have finished meanwhile.
        pending = {ident for ident, kk in by_ident.items() if not store.has_entry(kk)}
        for ident, kk in by_ident.items():
            if ident not in pending:
                results[kk] = Result("present", ident[0], kk, variant, call.describe())
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
