"""`fa4-aot build`: plan every work item (call or signature) of the selected variants for each SKU, then compile
what the store lacks.

Work runs in an executor's worker processes configured for the target SKU (executors.py: a local process pool,
or Ray in farm.py); this process never imports FA4, so one process can build several SKUs in turn. Each kernel
is one compile task, attributed to the first work item that needs it, exported (fa4.export, in the worker), and
stored object first, index entry last, under its full key (the SKU constants it consumed), with its base key as
the signpost. Failures are reported per call and per kernel while the rest goes on.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from .. import fa4
from ..domain.calls import Call
from ..domain.exact import ExactCall
from ..domain.region import Region
from ..domain.signature import Signature
from ..domain.skus import Sku
from ..matrix.call_variants import Variant
from ..matrix.model_variants import ModelVariant
from ..matrix.variants import Matrix
from ..store import Store
from . import lean, plan_tasks
from .commit import commit, commit_kernel, put_built, stored_key
from .executors import CompileTask, Executor, LocalExecutor, Outcome, Work
from .worker import Kernel

__all__ = ["Report", "Result", "Work", "build", "build_calls", "work_of", "describe",
           "commit", "put_built", "stored_key"]  # the last three live in commit.py; kept here for callers

Progress = Callable[[int, int, "Result"], None]


@dataclass
class Result:
    status: str  # "built", "present", "planned", "failed", or "refused" (a call the known-bad registry names)
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
    misses: int = 0  # the reported misses a --from-misses build was asked to close (each may add several calls)
    # FA4's dispatch read this SM count while planning (FLASH_ATTENTION_NUM_SMS): the kernels chosen for a call
    # (split-KV, persistent, 2-CTA) are those of this SKU's dispatch, whoever else shares them
    dispatch_sm_count: int = 0
    results: list[Result] = field(default_factory=list)
    call_failures: list[Result] = field(default_factory=list)  # calls FA4 rejected while planning
    # calls the known-bad registry refused (refusals.py): never built, and no failure of the build
    refused: list[Result] = field(default_factory=list)
    recipes: int = 0  # lean-runtime recipe regions recorded (lean.py)
    lean_failures: list[str] = field(default_factory=list)  # recipes or libraries the lean runtime will lack
    seconds: float = 0.0
    to_build: int = 0  # kernels the store lacked after planning
    finished: int = 0  # of those, how many workers finished (built, failed, or found present under the lock)
    interrupted: bool = False  # Ctrl-C (SIGINT) stopped the build: the kernels in flight were dropped
    by_variant: dict[str, set[str]] = field(default_factory=dict)  # label -> every kernel key it needs

    @property
    def not_built(self) -> int:
        return self.to_build - self.finished

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.results)

    @property
    def failed(self) -> int:
        return self.count("failed") + len(self.call_failures)

    def to_dict(self) -> dict[str, Any]:
        return {
            "sku": self.sku, "dispatch": {"sku": self.sku, "sm_count": self.dispatch_sm_count},
            "calls": self.calls, "misses": self.misses, "kernels": len(self.results), "built": self.count("built"),
            "present": self.count("present"), "planned": self.count("planned"), "failed": self.failed,
            "seconds": round(self.seconds, 2), "interrupted": self.interrupted, "not_built": self.not_built,
            "recipes": self.recipes, "lean_failures": self.lean_failures,
            "kernel_keys": sorted(r.kernel_key for r in self.results if r.status != "failed"),
            "variants": {name: len(keys) for name, keys in sorted(self.by_variant.items())},
            "failures": [asdict(r) for r in self.call_failures + [r for r in self.results if r.status == "failed"]],
            "refused": len(self.refused), "refusals": [asdict(r) for r in self.refused],
        }


Present = Callable[[str], str | None]  # base key -> the key it is held under, or None


def build(matrix: Matrix, sku: Sku, store: Store, variants: list[Variant | ModelVariant] | None = None,
          jobs: int = 1, progress: Progress | None = None, dry_run: bool = False,
          executor: Executor | None = None) -> Report:
    """Build every kernel of `variants` (default: all) for `sku` into `store`. Never raises for a kernel
    that fails to compile: it is in the report, which the caller turns into an exit status. With
    `dry_run`, plan only: kernels the store lacks are reported as "planned"."""
    return build_calls(sku, store, work_of(matrix, sku, variants), jobs=jobs, progress=progress,
                       dry_run=dry_run, executor=executor)


def work_of(matrix: Matrix, sku: Sku, variants: Sequence[Variant | ModelVariant] | None = None) -> Work:
    """The work items of `variants` (default: all) that apply to `sku`: a shape-complete variant gives its
    signatures, a grid variant its calls."""
    chosen = [v for v in (variants or list(matrix.variants)) if v.applies_to(sku)]
    work: Work = []
    for v in chosen:
        items: list[Call | Signature] = [*v.signatures()] if isinstance(v, ModelVariant) or v.complete else [
            *v.calls(matrix.shapes[v.shapes])]
        work += [(v.name, item) for item in items]
    return work


def build_calls(sku: Sku, store: Store, work: Work, jobs: int = 1, progress: Progress | None = None,
                dry_run: bool = False, executor: Executor | None = None, present: Present | None = None,
                planning: Callable[[int, int], None] | None = None) -> Report:
    """Build the kernels of explicit (label, Call, ExactCall or Signature) pairs: a Call's kernels at its shapes,
    an ExactCall's for its recorded arguments, a Signature's at every shape (complete.py), e.g. model signatures
    or the calls clients reported missing.
    `present(base key)` says under which key a kernel is already held (default: stored_key in `store`).
    `planning(done, total)` is told the work items planned so far, after each planning task.

    Ctrl-C (KeyboardInterrupt) stops it within seconds: queued kernels are cancelled, workers are told to
    stop and the kernels they were compiling are dropped (entries are written last, so none is partial);
    the report comes back with `interrupted` set and `not_built` counting what was left."""
    started = time.perf_counter()
    report = Report(sku=sku.name, calls=len(work), dispatch_sm_count=sku.sm_count)
    ex = executor or LocalExecutor(jobs)
    tasks: list[CompileTask] = []
    warming = None
    if not dry_run and isinstance(ex, LocalExecutor):  # this host's workers link: zig's first link, while they plan
        warming = threading.Thread(target=fa4.warm_linker, args=(sku.host_target,), name="fa4-aot-warm-linker",
                                   daemon=True)
        warming.start()
    try:
        planned = _plan(ex, sku, store, work, report, dry_run, planning)
        tasks = _triage(planned, work, present or (lambda kk: stored_key(store, kk, sku)), report, dry_run)
        _compile(ex, sku, store, tasks, report, progress)
        if not dry_run and present is None:  # libraries for kernels built here, by Ray, or before linking existed
            unlinked = lean.unlinked(store, [p.kernel_key for p in planned], sku)
            report.lean_failures += ex.relink(sku, store, unlinked) if unlinked else []
    except KeyboardInterrupt:
        report.interrupted = True
    finally:
        if executor is None or report.interrupted:  # a given executor is closed by its owner, unless stopping
            ex.close(stop=report.interrupted)
        if warming is not None:  # no zig left running after the build (it is done by now unless nothing linked)
            warming.join()
    if report.interrupted:
        _count_stored(tasks, store, report, sku)
    report.seconds = time.perf_counter() - started
    return report


def _count_stored(tasks: list[CompileTask], store: Store, report: Report, sku: Sku) -> None:
    """After an interrupt: a local worker stores each kernel as it finishes, before its outcome comes back, so
    the store, not the outcomes, says which kernels of the unfinished tasks were built. A kernel is looked up as
    the build looks it up (stored_key: under its full key for this SKU's constants): an outcome reports that key,
    and a signpost alone (the kernel of another SKU's constants) is not this SKU's kernel. Comparing base keys
    with the reported full keys counted every reported kernel with a signpost twice."""
    reported = {r.kernel_key for r in report.results}
    for task in tasks:
        for family, _ident, kk in task.wanted:
            held = stored_key(store, kk, sku)
            if held is not None and held not in reported:
                report.results.append(Result("built", family, held, task.variant, task.call.describe(),
                                             sku=report.sku))
                reported.add(held)
                report.finished += 1


def _plan(ex: Executor, sku: Sku, store: Store, work: Work, report: Report, dry_run: bool,
          planning: Callable[[int, int], None] | None = None) -> list[Kernel]:
    """Every distinct kernel of `work`, each attributed to the first work item that needs it (its work_index
    an index into `work`); the recipe regions the workers recorded are saved to the store (none are recorded
    in a dry run). An item several variants share is planned once (7% of the whole matrix's items)."""
    same = _same_items(work)
    distinct = list(same)
    offsets = plan_tasks.strided(distinct, ex.plan_chunks(len(distinct))) if dry_run else \
        plan_tasks.by_shared_keys(distinct, lambda i: lean.recipe_keys(work[i][1], sku))
    planned: dict[str, Kernel] = {}
    recorded: dict[str, list[Region]] = {}
    chunks = [[work[i] for i in chunk] for chunk in offsets]
    # a dry run plans only: recording the lean runtime's recipes replays FA4 per planned call, which costs more
    done = 0
    if planning:  # the total at once: the executor's start and the first task may take minutes
        planning(0, len(work))
    for c, out in ex.plan(sku, store, chunks, record=not dry_run):
        done += sum(len(same[i]) for i in offsets[c])
        if planning:
            planning(done, len(work))
        for key, found in out.regions.items():
            recorded.setdefault(key, []).extend(found)
        report.lean_failures += out.lean_failures
        for kernel in out.kernels:
            index = offsets[c][kernel.work_index]
            for each in same[index]:
                report.by_variant.setdefault(work[each][0], set()).add(kernel.kernel_key)
            if kernel.kernel_key not in planned or index < planned[kernel.kernel_key].work_index:
                planned[kernel.kernel_key] = kernel._replace(work_index=index)
        for rejected in out.rejected:
            for each in same[offsets[c][rejected.work_index]]:
                name, item = work[each]
                where = report.refused if rejected.known_bad else report.call_failures
                where.append(Result("refused" if rejected.known_bad else "failed", "", "", name, describe(item),
                                    error=rejected.error, sku=sku.name))
    report.call_failures.sort(key=lambda r: (r.variant, r.call))
    report.refused.sort(key=lambda r: (r.variant, r.call))
    report.recipes = lean.save(store, recorded)
    return sorted(planned.values(), key=lambda p: p.kernel_key)


def _same_items(work: Work) -> dict[int, list[int]]:
    """{index of an item's first occurrence in `work`: every index of that item}, in order of first occurrence:
    the whole matrix names one signature under several variants (models that share attention shapes)."""
    first: dict[Any, int] = {}
    same: dict[int, list[int]] = {}
    for i, (_label, item) in enumerate(work):
        same.setdefault(first.setdefault(item, i), []).append(i)
    return same


def describe(item: Call | ExactCall | Signature) -> str:
    if isinstance(item, Call | ExactCall):
        return item.describe()
    return item.call(0, 0, 0).describe().replace(" b=0 sq=0 sk=0", " all shapes")


def _triage(planned: list[Kernel], work: Work, present: Present, report: Report,
            dry_run: bool) -> list[CompileTask]:
    """Record kernels already held (or, in a dry run, all of them); one compile task for each of the rest."""
    todo = []
    for p in planned:
        name = work[p.work_index][0]
        held = present(p.kernel_key)
        if held or dry_run:
            report.results.append(Result("present" if held else "planned", p.family, held or p.kernel_key, name,
                                         p.call.describe(), sku=report.sku))
        else:
            todo.append(CompileTask(name, p.call, (p.wanted(),)))
    return todo


def _compile(ex: Executor, sku: Sku, store: Store, tasks: list[CompileTask], report: Report,
             progress: Progress | None) -> None:
    done = 0
    report.to_build = sum(len(t.wanted) for t in tasks)
    for i, outcomes in ex.compile(sku, store, tasks):
        for outcome in outcomes:
            result = _result(store, tasks[i], outcome, sku)
            report.results.append(result)
            done += 1
            report.finished = done
            if progress:
                progress(done, report.to_build, result)


def _result(store: Store, task: CompileTask, outcome: Outcome, sku: Sku) -> Result:
    """The outcome as a report line; bytes that came back are committed here (commit.commit_kernel: objects
    first, entries last, under the kernel's lock), or discarded when another builder stored the kernel first."""
    if outcome.data is not None and outcome.entries:
        status = commit_kernel(store, outcome.entries, outcome.data, outcome.objects)
        if status == "corrupt":
            outcome = replace(outcome, status="failed",
                              error="the bytes that came back do not hash to the worker's digest")
        elif status == "present":
            outcome = replace(outcome, status="present")
    return Result(outcome.status, outcome.family, outcome.kernel_key, task.variant, task.call.describe(),
                  seconds=outcome.seconds, size=outcome.size, error=outcome.error, sku=sku.name)
