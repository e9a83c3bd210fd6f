"""What `fa4-aot build` shows: the line that says what it builds where, progress while it plans and compiles (a
bar step, a line or a JSON event per item: progress.py), and at the end per SKU one JSON document and the text lines
(failures, the dry run's table and estimate, the summary)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .common import plural
from .progress import Progress

if TYPE_CHECKING:
    from ..compile import orchestrator as build_mod
    from ..domain.skus import Sku
    from ..store import Store


def banner(targets: list[Sku], into: str | Path, executor: str, ray_address: str | None, jobs: int,
           dry_run: bool = False) -> str:
    """The first line on stderr: the SKUs, where the kernels go (the store or the --push server), and on what; a
    dry run says it plans only, and against which store."""
    where = f"Ray ({ray_address or 'local'})" if executor == "ray" else plural(jobs, "job")
    skus = ", ".join(f"{t.name} ({t.arch}, {t.sm_count} SMs)" for t in targets)
    if dry_run:
        return f"planning {skus} against {into} on {where} (dry run: nothing is built or written)"
    return f"building {skus} into {into} on {where}"


def planning_progress(bar: Progress) -> Callable[[int, int], None]:
    """Planning's progress, shown as compiling's is: work items (calls or signatures) planned so far. The
    display closes when planning ends, before compiling's begins."""

    def planned(done: int, total: int) -> None:
        bar.update(done, total, "ok", f"planned {done} of {total} calls and signatures")
        if done == total:
            bar.close()

    return planned


def kernel_progress(bar: Progress) -> Callable[[int, int, build_mod.Result], None]:
    """Each finished kernel: a bar step, a line, or a JSON event (see progress.py)."""

    def progress(done: int, total: int, result: build_mod.Result) -> None:
        mark = {"built": "ok", "present": "--", "failed": "FAIL"}[result.status]
        line = f"{mark} {result.family} {result.seconds:.1f} CPU-s  {result.call}" + \
            (f"\n    {result.error}" if result.error else "")
        bar.update(done, total, result.status, line, kernel_key=result.kernel_key, family=result.family,
                   seconds=round(result.seconds, 3), call=result.call, error=result.error, sku=result.sku)

    return progress


def documents(reports: list[build_mod.Report], store: Store, targets: list[Sku], jobs: int,
              dry_run: bool) -> tuple[list[dict[str, Any]], list[str]]:
    """Each SKU's JSON document, in order, and the text lines of them all."""
    docs, lines = [], []
    for report in reports:
        doc, more = _report_doc(report, store, targets, jobs, dry_run)
        docs.append(doc)
        lines += more
    return docs, lines


def _report_doc(report: build_mod.Report, store: Store, targets: list[Sku], jobs: int,
                dry_run: bool) -> tuple[dict[str, Any], list[str]]:
    """One SKU's JSON document and text lines: failures, the dry run's table and estimate, the summary."""
    lines = [f"FAILED {r.variant}: {r.call}: {r.error}" for r in report.call_failures]
    lines += [f"REFUSED {r.variant}: {r.call}: {r.error}" for r in report.refused]
    lines += [f"LEAN RUNTIME: {message}" for message in report.lean_failures]
    doc = report.to_dict()
    if dry_run:
        target = next(t for t in targets if t.name == report.sku)
        extra, doc["estimate"] = _dry_run_lines(report, store, target, jobs)
        lines += extra
    lines.append(f"{report.sku}: {plural(report.calls, 'signature or call', 'signatures or calls')}, "
                 f"{plural(len(report.results), 'kernel')}: "
                 f"{report.count('built')} built, {report.count('present')} already present, "
                 + (f"{report.count('planned')} to build, " if dry_run else "")
                 + f"{report.failed} failed"
                 + (f", {len(report.refused)} call(s) refused as known bad" if report.refused else "")
                 + f" ({report.seconds:.0f}s); planned with {report.sku}'s dispatch "
                 f"({report.dispatch_sm_count} SMs)"
                 + ("" if dry_run else f"; {report.recipes} lean recipe region(s) recorded"))
    if report.interrupted and dry_run:
        lines[-1] = (f"INTERRUPTED {lines[-1]}; the plan above is partial (the work items planned before the "
                     "stop): run the same command again for the whole plan")
    elif report.interrupted:
        lines[-1] = (f"INTERRUPTED {lines[-1]}; {report.not_built} not built (the kernels in flight were dropped, "
                     "no partial entry is left): run the same command again to build the rest")
    return doc, lines


def _dry_run_lines(report: build_mod.Report, store: Store, target: Sku,
                   jobs: int) -> tuple[list[str], dict[str, Any]]:
    """Kernels per variant (all it needs, and those the store lacks) and the estimated build time."""
    from ..compile.estimate import estimate

    stored = {r.kernel_key for r in report.results if r.status == "present"}
    lines = [f"{'variant':<28}{'kernels':>8}{'to build':>10}"]
    for name, needed in sorted(report.by_variant.items()):
        lines.append(f"{name:<28}{len(needed):>8}{len(needed - stored):>10}")
    # planned results exist once planning finished; a stopped plan counts what its table lists
    lacking = set().union(*report.by_variant.values()) - stored if report.by_variant else set()
    guess = estimate(max(report.count("planned"), len(lacking)), store, target, jobs)
    lines.append(f"estimated build time: {guess.seconds / 60:.1f} min for {plural(guess.kernels, 'kernel')} at "
                 f"{guess.seconds_per_kernel:.1f} s each over {jobs} job(s) ({guess.source})")
    return lines, guess.to_dict()
