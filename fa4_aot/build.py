"""`fa4-aot build`: plan every call of the selected variants for each SKU, then compile what the store lacks.

Work runs in an executor's worker processes configured for the target SKU (executors.py: a local process pool,
or Ray in farm.py); this process never imports FA4, so one process can build several SKUs in turn. Each kernel
is one compile task, attributed to the first call that needs it, exported (fa4.export, in the worker), and stored
object first, index entry last. Failures are reported per call and per kernel while the rest goes on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from .calls import Call
from .executors import CompileTask, Executor, LocalExecutor, Outcome
from .skus import Sku
from .store import Store
from .variants import Matrix, Variant

Progress = Callable[[int, int, "Result"], None]


@dataclass
class Result:
    status: str  # "built", "present", "planned" or "failed"
    family: str
    kernel_key: str
    variant: str
    call: str
    seconds: float = 0.0
    size: int = 0
    error: str = ""
    sku: str = ""


@dataclass
class Report:
    sku: str
    calls: int = 0
    results: list[Result] = field(default_factory=list)
    call_failures: list[Result] = field(default_factory=list)  # calls FA4 rejected while planning
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
            "seconds": round(self.seconds, 2),
            "kernel_keys": sorted(r.kernel_key for r in self.results if r.status != "failed"),
            "failures": [asdict(r) for r in self.call_failures + [r for r in self.results if r.status == "failed"]],
        }


@dataclass(frozen=True)
class Planned:
    family: str
    ident: str  # canonical compile-key JSON
    kernel_key: str
    call_index: int


def build(matrix: Matrix, sku: Sku, store: Store, variants: list[Variant] | None = None, jobs: int = 1,
          progress: Progress | None = None, dry_run: bool = False, executor: Executor | None = None) -> Report:
    """Build every kernel of `variants` (default: all) for `sku` into `store`. Never raises for a kernel
    that fails to compile: it is in the report, which the caller turns into an exit status. With
    `dry_run`, plan only: kernels the store lacks are reported as "planned"."""
    return build_calls(sku, store, matrix_work(matrix, sku, variants), jobs=jobs, progress=progress,
                       dry_run=dry_run, executor=executor)


def matrix_work(matrix: Matrix, sku: Sku, variants: list[Variant] | None = None) -> list[tuple[str, Call]]:
    """(variant name, call) of every call of `variants` (default: all) that applies to `sku`."""
    chosen = [v for v in (variants or list(matrix.variants)) if v.applies_to(sku)]
    return [(v.name, c) for v in chosen for c in v.calls(matrix.shapes[v.shapes])]


def build_calls(sku: Sku, store: Store, work: list[tuple[str, Call]], jobs: int = 1,
                progress: Progress | None = None, dry_run: bool = False, executor: Executor | None = None,
                present: Callable[[str], bool] | None = None) -> Report:
    """Build the kernels of explicit (label, call) pairs, e.g. the calls clients reported missing.
    `present(kernel_key)` says what needs no build (default: the store has its entry)."""
    started = time.perf_counter()
    report = Report(sku=sku.name, calls=len(work))
    with _executor(executor, jobs) as ex:
        planned = _plan(ex, sku, store, work, report)
        todo = _triage(planned, work, present or store.has_entry, report, dry_run)
        _compile(ex, sku, store, todo, report, progress)
    report.seconds = time.perf_counter() - started
    return report


@contextmanager
def _executor(given: Executor | None, jobs: int) -> Iterator[Executor]:
    """`given` (its owner closes it), or a local pool of `jobs` closed at the end."""
    if given is not None:
        yield given
        return
    local = LocalExecutor(jobs)
    try:
        yield local
    finally:
        local.close()


def _plan(ex: Executor, sku: Sku, store: Store, work: list[tuple[str, Call]], report: Report) -> list[Planned]:
    """Every distinct kernel of `work`, each attributed to the first call that needs it."""
    n = max(1, min(ex.plan_chunks(len(work)), len(work)))
    offsets = [list(range(i, len(work), n)) for i in range(n)]
    planned: dict[str, Planned] = {}
    for c, (kernels, failures) in ex.plan(sku, store, [[work[i] for i in chunk] for chunk in offsets]):
        for family, ident, kernel_key, local in kernels:
            index = offsets[c][local]
            if kernel_key not in planned or index < planned[kernel_key].call_index:
                planned[kernel_key] = Planned(family, ident, kernel_key, index)
        for local, error in failures:
            name, call = work[offsets[c][local]]
            report.call_failures.append(Result("failed", "", "", name, call.describe(), error=error, sku=sku.name))
    report.call_failures.sort(key=lambda r: (r.variant, r.call))
    return sorted(planned.values(), key=lambda p: p.kernel_key)


def _triage(planned: list[Planned], work: list[tuple[str, Call]], present: Callable[[str], bool], report: Report,
            dry_run: bool) -> list[tuple[Planned, CompileTask]]:
    """Record kernels already built (or, in a dry run, all of them); one compile task for each of the rest."""
    todo = []
    for p in planned:
        name, call = work[p.call_index]
        there = present(p.kernel_key)
        if there or dry_run:
            report.results.append(Result("present" if there else "planned", p.family, p.kernel_key, name,
                                         call.describe(), sku=report.sku))
        else:
            todo.append((p, CompileTask(name, call, ((p.family, p.ident, p.kernel_key),))))
    return todo


def _compile(ex: Executor, sku: Sku, store: Store, todo: list[tuple[Planned, CompileTask]], report: Report,
             progress: Progress | None) -> None:
    tasks = [t for _p, t in todo]
    done = 0
    for i, outcomes in ex.compile(sku, store, tasks):
        for outcome in outcomes:
            result = _result(store, tasks[i], outcome, sku)
            report.results.append(result)
            done += 1
            if progress:
                progress(done, len(tasks), result)


def _result(store: Store, task: CompileTask, outcome: Outcome, sku: Sku) -> Result:
    """The outcome as a report line; bytes that came back are committed here, object first, entry last."""
    if outcome.data is not None and outcome.entry is not None and not commit(store, outcome.entry, outcome.data):
        outcome.status, outcome.error = "failed", "the bytes that came back do not hash to the worker's digest"
    return Result(outcome.status, outcome.family, outcome.kernel_key, task.variant, task.call.describe(),
                  seconds=outcome.seconds, size=outcome.size, error=outcome.error, sku=sku.name)


def commit(store: Store, entry: Any, data: bytes) -> bool:
    """Store one kernel that a remote worker built: its object first, then the entry that makes it visible.
    Returns False (and stores no entry) when the bytes do not hash to the entry's digest."""
    with store.lock(entry.kernel_key):
        if store.has_entry(entry.kernel_key):
            return True
        if store.put_object(data) != entry.object_digest:
            return False
        store.put_entry(entry)
        return True
