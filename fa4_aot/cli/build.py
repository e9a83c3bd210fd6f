"""`fa4-aot skus` and `fa4-aot build`: what can be built, and building it (no GPU needed)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..store import Store
from .common import emit, json_option, load_matrix, pass_store, variants_option

if TYPE_CHECKING:
    from .. import build as build_mod
    from ..variants import Matrix


@click.command()
@variants_option("Variants file holding the SKU table (default: variants.toml).")
@json_option()
def skus(variants_file: Path | None, as_json: bool) -> None:
    """List the GPU SKUs: arch target, SM count, L2 size, CUDA major."""
    matrix = load_matrix(variants_file)
    rows = [f"{'sku':<14}{'arch':<9}{'SMs':>5}{'L2 MiB':>9}{'CUDA':>6}  description"]
    rows += [f"{s.name:<14}{s.arch:<9}{s.sm_count:>5}{s.l2_bytes / 2**20:>9.1f}{s.cuda_major:>6}  {s.description}"
             for s in matrix.skus.values()]
    doc = [{**s.target_facts(), "name": s.name, "description": s.description} for s in matrix.skus.values()]
    emit(as_json, doc, "\n".join(rows))


@click.command()
@click.option("--sku", help="Target SKU from `fa4-aot skus`, e.g. h200 or b200 (required unless --from-misses).")
@variants_option()
@click.option("--only", multiple=True, metavar="NAME", help="Build only these [[variants]] entries (repeatable).")
@click.option("--jobs", "-j", default=1, show_default=True, type=click.IntRange(1, 256),
              help="Compiler processes; each needs about 1.5 GB of memory.")
@click.option("--dry-run", is_flag=True, help="Plan only: count the kernels and show the calls FA4 rejects.")
@click.option("--from-misses", is_flag=True, help="Build the calls clients reported missing to --server, then push.")
@click.option("--server", envvar="FA4_AOT_SERVER", help="Server for --from-misses ($FA4_AOT_SERVER).")
@click.option("--token", envvar="FA4_AOT_TOKEN", help="Publish token for --from-misses ($FA4_AOT_TOKEN).")
@json_option("Print one JSON document: counts, kernel keys, failures.")
@pass_store
def build(store: Store, sku: str | None, variants_file: Path | None, only: tuple[str, ...], jobs: int,
          dry_run: bool, from_misses: bool, server: str | None, token: str | None, as_json: bool) -> None:
    """Cross-compile FA4 kernels for one SKU into the store (no GPU needed).

    Every [[variants]] entry is crossed with its shape grid and run through FA4's own dispatch on fake
    tensors; each distinct kernel is compiled once. Kernels already in the store are not rebuilt.
    Exits 1 if any call or kernel failed; the rest are still built.
    """
    from .. import build as build_mod

    matrix = load_matrix(variants_file)
    if from_misses:
        _build_misses(store, matrix, server, token, jobs, as_json)
        return
    if not sku:
        raise click.UsageError("--sku is required (or --from-misses with --server)")
    target = matrix.sku(sku)
    chosen = matrix.select(list(only))
    if not as_json:
        click.echo(f"building {sku} ({target.arch}, {target.sm_count} SMs) into {store.root} with {jobs} job(s)",
                   err=True)
    report = build_mod.build(matrix, target, store, chosen, jobs=jobs, progress=_progress(as_json), dry_run=dry_run)
    summary = (f"{sku}: {report.calls} calls, {len(report.results)} kernels: {report.count('built')} built, "
               f"{report.count('present')} already present, "
               + (f"{report.count('planned')} to build, " if dry_run else "")
               + f"{report.failed} failed ({report.seconds:.0f}s); {report.recipes} lean recipe region(s) recorded")
    lines = [f"FAILED {r.variant}: {r.call}: {r.error}" for r in report.call_failures]
    lines += [f"LEAN RUNTIME: {message}" for message in report.lean_failures]
    emit(as_json, report.to_dict(), "\n".join([*lines, summary]))
    if report.failed:
        sys.exit(1)


def _progress(as_json: bool) -> Callable[[int, int, build_mod.Result], None]:
    """One line per kernel on stderr (none with --json)."""

    def progress(done: int, total: int, result: build_mod.Result) -> None:
        if as_json:
            return
        mark = {"built": "ok", "present": "--", "failed": "FAIL"}[result.status]
        line = f"[{done}/{total}] {mark} {result.family} {result.seconds:.1f}s  {result.call}"
        click.echo(line + (f"\n    {result.error}" if result.error else ""), err=True)

    return progress


def _build_misses(store: Store, matrix: Matrix, server: str | None, token: str | None, jobs: int,
                  as_json: bool) -> None:
    from ..remote import Remote
    from ..transfer import rebuild_misses

    if not server:
        raise click.UsageError("--from-misses needs --server (or FA4_AOT_SERVER)")
    reports = rebuild_misses(matrix, store, Remote(server, token=token), jobs=jobs)
    docs = [r.to_dict() for r in reports]
    lines = [f"{d['sku']}: {d['calls']} missed call(s), {d['built']} built, {d['present']} present, "
             f"{d['failed']} failed; pushed to {server}" for d in docs] or [f"{server} reports no buildable misses"]
    emit(as_json, docs, "\n".join(lines))
    if any(d["failed"] for d in docs):
        sys.exit(1)
