"""`fa4-aot list`, `verify`, `gc`, `misses`, `migrate`: looking after the local store."""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from ..domain.verdicts import by_device
from ..store import Entry, Store, kernels, maintenance
from ..store.maintenance import VerifyReport
from ..trust import standing
from .common import check_sku, emit, existing, json_option, pass_store, plural
from .progress import Progress, quiet_option


@click.command(name="list")
@click.option("--sku", help="Only this SKU (an unknown name is an error, with a suggestion).")
@click.option("--variant", help="Only kernels built for this [[variants]] entry.")
@click.option("--family", help="Only this FA4 kernel family (a substring, e.g. Forward or Sm90).")
@click.option("--summary", is_flag=True, help="One line per SKU: kernels, bytes, variants, toolchain.")
@json_option("Print one JSON document with every entry (with --summary: the per-SKU rows).")
@pass_store
def list_(store: Store, sku: str | None, variant: str | None, family: str | None, summary: bool,
          as_json: bool) -> None:
    """List the kernels in the store, then a per-SKU count. A kernel is one compiled object: base-key signposts
    (Entry.is_signpost) are not counted, and bytes are every object the kernels need, each once (libraries and
    the CuTe runtime library included). The `verdict` column is the kernel's certification (`fa4-aot certify`):
    pass, the worst failing status (wrong:dq, crash, hang, refused) with +N other device classes, or - when
    unchecked; --json gives every device class's verdict."""
    everything = kernels(existing(store).entries())
    if sku is not None and sku not in {e.sku for e in everything}:
        check_sku(sku, {e.sku for e in everything})
    entries = [e for e in everything if (sku is None or e.sku == sku) and (variant is None or e.variant == variant)
               and (family is None or family in e.family)]
    verdicts = standing.Verdicts(store)
    per_sku = _per_sku(store, entries, verdicts)
    if summary:
        emit(as_json, per_sku, "\n".join(_summary_lines(per_sku)))
        return
    rows = [f"{'kernel':<16}  {'sku':<10} {'family':<26} {'bytes':>11}  {'verdict':<10} call"] if entries else []
    rows += [f"{e.kernel_key[:16]}  {e.sku:<10} {e.family:<26} {e.size:>9} B  "
             f"{standing.brief(verdicts.of(e.kernel_key)):<10} {e.call}" for e in entries]
    rows += _summary_lines(per_sku) if len(per_sku) > 1 else []
    rows.append(f"{len(entries)} kernel(s), {store.bytes_of(entries)} bytes")
    emit(as_json, [_listed(e, verdicts) for e in entries], "\n".join(rows))


def _listed(entry: Entry, verdicts: standing.Verdicts) -> dict[str, Any]:
    """An entry as `list --json` gives it: its fields, its certification and each device class's verdict."""
    found = by_device(verdicts.of(entry.kernel_key))
    return {**asdict(entry), "certification": standing.standing(list(found.values())),
            "verdicts": {device: v.to_dict() for device, v in sorted(found.items())}}


def _per_sku(store: Store, entries: list[Entry], verdicts: standing.Verdicts) -> list[dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for e in entries:
        row = rows.setdefault(e.sku, {"sku": e.sku, "kernels": [], "variants": set(), "toolchains": set()})
        row["kernels"].append(e)
        row["variants"].add(e.variant)
        row["toolchains"].add(e.toolchain.get("flash-attn-4", "?"))
    return [{**r, "kernels": len(r["kernels"]), "bytes": store.bytes_of(r["kernels"]),
             "variants": sorted(r["variants"]), "toolchains": sorted(r["toolchains"]),
             "certification": standing.counts(verdicts.standing(e.kernel_key) for e in r["kernels"])}
            for _, r in sorted(rows.items())]


def _summary_lines(per_sku: list[dict[str, Any]]) -> list[str]:
    return [f"{r['sku']:<14} {r['kernels']:>5} kernel(s) {r['bytes'] / 2**20:>9.1f} MiB  "
            f"{len(r['variants'])} variant(s)  flash-attn-4 {', '.join(r['toolchains'])}  "
            + ", ".join(f"{n} {name}" for name, n in r["certification"].items()) for r in per_sku] \
        or ["no kernels"]


@click.command()
@click.option("--quarantine/--no-quarantine", default=True, show_default=True,
              help="Move every bad object, bad or dangling entry and symlink to <cache>/quarantine/<time>/ so no "
                   "load sees it, and drop broken linked libraries from their entries (--no-quarantine: only "
                   "report).")
@json_option("Print the report as JSON on stdout; one JSON line per object on stderr.")
@quiet_option
@pass_store
def verify(store: Store, quarantine: bool, as_json: bool, quiet: bool) -> None:
    """Re-hash every object and check every index entry and the objects it names (kernel, linked libraries,
    runtime libraries); quarantine what fails. Exits 1 on any problem."""
    with Progress("verify", quiet=quiet, as_json=as_json) as bar:
        def step(done: int, total: int, status: str) -> None:
            if bar.mode != "lines" or status != "ok" or done == total or done % 100 == 0:
                bar.update(done, total, status)

        report = maintenance.verify(existing(store), quarantine=quarantine, progress=step)
    held = len(kernels(store.entries()))  # after any quarantine: the kernels a reader finds now
    doc = {"objects": report.objects_checked, "entries": report.entries_checked, "kernels": held, "ok": report.ok,
           "bad_objects": [{"expected": e, "actual": a} for e, a in report.bad_objects],
           "dangling_entries": report.dangling_entries,
           "bad_entries": [{"path": p, "reason": r} for p, r in report.bad_entries],
           "symlinks": report.symlinks, "unexpected": report.unexpected,
           "broken_libraries": [{"kernel_key": k, "arch": a, "reason": r} for k, a, r in report.broken_libraries],
           "unlinked": report.unlinked,
           "quarantined": [{"path": p, "to": to} for p, to in report.quarantined.items()],
           "quarantine_dir": report.quarantine_dir}
    emit(as_json, doc, "\n".join(_verify_lines(store, report, held)))
    if not report.ok:
        sys.exit(1)


def _verify_lines(store: Store, report: VerifyReport, held: int) -> list[str]:
    """What verify found, then the summary: kernels (the unit of every command), index entries (signposts
    included) and objects checked."""
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
    lines += [f"BROKEN {arch} library of {k}: {why}" + (
        " -> dropped from the entry (`fa4-aot build` links it again)" if f"{k} {arch}" in report.unlinked else "")
        for k, arch, why in report.broken_libraries]
    problems = len(lines)
    lines += [f"UNEXPECTED {p}: not a store name; no reader opens it (ignored)" for p in report.unexpected]
    entries = plural(report.entries_checked, "index entry", "index entries")
    lines.append(f"{plural(held, 'kernel')} ({entries}, signposts included; {plural(report.objects_checked, 'object')})"
                 f" checked: {_verdict(report, problems)}")
    return lines


def _verdict(report: VerifyReport, problems: int) -> str:
    if report.ok:
        return "ok"
    if report.quarantine_dir or report.unlinked:
        moved = f", moved to {report.quarantine_dir}" if report.quarantine_dir else ""
        broken = plural(len(report.unlinked), "broken library", "broken libraries")
        dropped = f", {broken} dropped from their entries" if report.unlinked else ""
        return f"{problems} problem(s){moved}{dropped}; rebuild (`fa4-aot build`) or pull what they held"
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
    report = maintenance.gc(existing(store), dry_run=dry_run, min_age=min_age)
    verb = "would remove" if dry_run else "removed"
    doc = {"dry_run": dry_run, "objects": report.removed_objects, "temp_files": report.removed_temp_files,
           "bytes": report.bytes_freed}
    emit(as_json, doc, f"{verb} {len(report.removed_objects)} object(s) ({report.bytes_freed} bytes) "
                       f"and {report.removed_temp_files} temp file(s)")


@click.command()
@json_option()
@pass_store
def misses(store: Store, as_json: bool) -> None:
    """What clients of this store missed: kernels FA4 compiled itself in fallback mode, and calls the lean runtime
    had no recipe region for (family "recipe"); `fa4-aot build --from-misses` builds them."""
    found = existing(store).misses()
    rows = [f"{m.when}  {m.sku:<10} {m.family:<26} {m.kernel_key[:16]}" for m in found]
    rows.append(plural(len(found), "miss", "misses"))
    emit(as_json, [m.to_dict() for m in found], "\n".join(rows))


@click.command()
@click.option("--sku", help="Drop this SKU's kernels.")
@click.option("--toolchain", metavar="old|VERSION",
              help="'old': drop kernels built by any toolchain but the installed one; VERSION: those built with "
                   "this flash-attn-4 version.")
@click.option("--older-than", metavar="AGE", help="Drop kernels built more than AGE ago (30d, 12h, 2w).")
@click.option("--max-size", metavar="SIZE", help="Then drop the oldest kernels until the rest fit in SIZE (20G, 500M).")
@click.option("--dry-run", is_flag=True, help="Only say what would be removed.")
@json_option()
@pass_store
def prune(store: Store, sku: str | None, toolchain: str | None, older_than: str | None, max_size: str | None,
          dry_run: bool, as_json: bool) -> None:
    """Remove kernels by SKU, toolchain, age or a size budget (filters combine), then their unreferenced
    objects. Each entry goes before its object, so a reader never meets a half-removed kernel."""
    from ..store import prune as mod

    rules = mod.Rules(
        sku=sku, older_than=mod.parse_age(older_than) if older_than else None,
        max_size=mod.parse_size(max_size) if max_size else None,
        toolchain=_installed_toolchain() if toolchain == "old" else None,
        flash_attn=toolchain if toolchain not in (None, "old") else None)
    if sku is not None:  # a typo must not prune nothing and exit 0
        check_sku(sku, {e.sku for e in existing(store).entries()})
    report = mod.prune(existing(store), rules, dry_run=dry_run)
    verb = "would remove" if dry_run else "removed"
    doc = {"dry_run": dry_run, "entries": report.entries, "objects": report.objects, "bytes": report.bytes_freed,
           "kept": report.kept, "removed": report.removed}
    emit(as_json, doc, f"{verb} {report.removed} kernel(s) and {len(report.objects)} object(s) "
                       f"({report.bytes_freed} bytes); {report.kept} kernel(s) kept")


def _installed_toolchain() -> dict[str, str]:
    from ..fa4 import toolchain

    return toolchain()


@click.command()
@click.option("--dry-run", is_flag=True, help="Only count what would be re-filed.")
@json_option()
@pass_store
def migrate(store: Store, dry_run: bool, as_json: bool) -> None:
    """Re-file kernels built before per-SKU constants were keyed by need under today's keys, and
    recipe regions keyed by page size and window (format 2) under today's recipe keys.

    Objects are kept; old signed manifests list the old keys, so sign each SKU again afterwards. Kernels built by
    another toolchain (other FA4, CuTe or fa4-aot patch source) cannot be re-filed: it says to rebuild them."""
    from .. import config
    from ..domain import sku_table
    from ..store.migrate import migrate as run
    from ..store.migrate import migrate_recipes, rebuild_advice

    result = run(store, dry_run=dry_run, tools=_installed_toolchain())
    regions = migrate_recipes(store, sku_table.table(config.default_variants_file()).values(), dry_run=dry_run)
    verb = "would re-file" if dry_run else "re-filed"
    lines = [f"{result.entries} entries: {verb} {result.migrated}, {result.current} already current",
             f"recipe regions of format 2: {verb} {regions} under today's recipe keys"]
    lines += [f"UNRECOGNISED {k}: its key matches neither the old nor today's formula (left alone; "
              "`fa4-aot verify` checks it)" for k in result.unrecognised]
    lines += [f"re-sign: fa4-aot sign --sku {name} --key KEYFILE" for name in result.skus if not dry_run]
    lines += rebuild_advice(result.other_toolchain, result.drift)
    emit(as_json, {**result.to_dict(), "recipe_regions": regions}, "\n".join(lines))
