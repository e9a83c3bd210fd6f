"""`fa4-aot list`, `verify`, `gc`, `misses`, `migrate`: looking after the local store."""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path

import click

from .. import maintenance
from ..maintenance import VerifyReport
from ..store import Store
from .common import emit, json_option, pass_store


@click.command(name="list")
@click.option("--sku", help="Only this SKU.")
@json_option("Print one JSON document with every entry.")
@pass_store
def list_(store: Store, sku: str | None, as_json: bool) -> None:
    """List the kernels in the store."""
    entries = list(store.entries(sku))
    rows = [f"{e.kernel_key[:16]}  {e.sku:<10} {e.family:<26} {e.size:>9} B  {e.call}" for e in entries]
    rows.append(f"{len(entries)} kernel(s), {sum(e.size for e in entries)} bytes")
    emit(as_json, [asdict(e) for e in entries], "\n".join(rows))


@click.command()
@click.option("--quarantine/--no-quarantine", default=True, show_default=True,
              help="Move every bad object, bad or dangling entry and symlink to <cache>/quarantine/<time>/ so no "
                   "load sees it (--no-quarantine: only report).")
@json_option()
@pass_store
def verify(store: Store, quarantine: bool, as_json: bool) -> None:
    """Re-hash every object and check every index entry; quarantine what fails. Exits 1 on any problem."""
    report = maintenance.verify(store, quarantine=quarantine)
    doc = {"objects": report.objects_checked, "entries": report.entries_checked, "ok": report.ok,
           "bad_objects": [{"expected": e, "actual": a} for e, a in report.bad_objects],
           "dangling_entries": report.dangling_entries,
           "bad_entries": [{"path": p, "reason": r} for p, r in report.bad_entries],
           "symlinks": report.symlinks, "unexpected": report.unexpected,
           "quarantined": [{"path": p, "to": to} for p, to in report.quarantined.items()],
           "quarantine_dir": report.quarantine_dir}
    emit(as_json, doc, "\n".join(_verify_lines(store, report)))
    if not report.ok:
        sys.exit(1)


def _verify_lines(store: Store, report: VerifyReport) -> list[str]:
    def rel(path: Path) -> str:
        return str(path.relative_to(store.root))

    def went(path: str) -> str:
        return f" -> quarantined to {report.quarantined[path]}" if path in report.quarantined else ""

    lines = [f"CORRUPT object {exp}: bytes hash to {act}{went(rel(store.object_path(exp)))}"
             for exp, act in report.bad_objects]
    lines += [f"DANGLING entry {k}: its object is missing{went(rel(store.entry_path(k)))}"
              for k in report.dangling_entries]
    lines += [f"BAD entry {p}: {why}{went(p)}" for p, why in report.bad_entries]
    lines += [f"SYMLINK {p}: refused, never followed{went(p)}" for p in report.symlinks]
    problems = len(lines)
    lines += [f"UNEXPECTED {p}: not a store name; no reader opens it (ignored)" for p in report.unexpected]
    lines.append(f"{report.objects_checked} objects, {report.entries_checked} entries checked: "
                 f"{_verdict(report, problems)}")
    return lines


def _verdict(report: VerifyReport, problems: int) -> str:
    if report.ok:
        return "ok"
    if report.quarantine_dir:
        return (f"{problems} problem(s), moved to {report.quarantine_dir}; rebuild (`fa4-aot build`) or pull "
                "what they held")
    return f"{problems} problem(s); `fa4-aot verify` quarantines them, then rebuild with `fa4-aot build`"


@click.command()
@click.option("--dry-run", is_flag=True, help="Only say what would be removed.")
@click.option("--min-age", default=3600.0, show_default=True, type=click.FloatRange(0),
              help="Keep unreferenced objects younger than this many seconds: a running build writes each "
                   "object just before its index entry.")
@json_option()
@pass_store
def gc(store: Store, dry_run: bool, min_age: float, as_json: bool) -> None:
    """Remove objects no index entry references, and temp files of dead writers (quarantine/ is left alone)."""
    report = maintenance.gc(store, dry_run=dry_run, min_age=min_age)
    verb = "would remove" if dry_run else "removed"
    doc = {"dry_run": dry_run, "objects": report.removed_objects, "temp_files": report.removed_temp_files,
           "bytes": report.bytes_freed}
    emit(as_json, doc, f"{verb} {len(report.removed_objects)} object(s) ({report.bytes_freed} bytes) "
                       f"and {report.removed_temp_files} temp file(s)")


@click.command()
@json_option()
@pass_store
def misses(store: Store, as_json: bool) -> None:
    """Kernels that clients in fallback mode needed and compiled themselves: add them to variants.toml."""
    found = store.misses()
    rows = [f"{m.when}  {m.sku:<10} {m.family:<26} {m.kernel_key[:16]}" for m in found]
    rows.append(f"{len(found)} miss(es)")
    emit(as_json, [asdict(m) for m in found], "\n".join(rows))


@click.command()
@click.option("--dry-run", is_flag=True, help="Only count what would be re-filed.")
@json_option()
@pass_store
def migrate(store: Store, dry_run: bool, as_json: bool) -> None:
    """Re-file kernels built before per-SKU constants were keyed by need (issue 13) under today's keys.

    Objects are kept; old signed manifests list the old keys, so sign each SKU again afterwards."""
    from ..migrate import migrate as run

    result = run(store, dry_run=dry_run)
    verb = "would re-file" if dry_run else "re-filed"
    lines = [f"{result.entries} entries: {verb} {result.migrated}, {result.current} already current"]
    lines += [f"UNRECOGNISED {k}: its key matches neither the old nor today's formula (left alone; "
              "`fa4-aot verify` checks it)" for k in result.unrecognised]
    lines += [f"re-sign: fa4-aot sign --sku {name} --key KEYFILE" for name in result.skus if not dry_run]
    emit(as_json, result.to_dict(), "\n".join(lines))
