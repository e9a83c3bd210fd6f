"""`fa4-aot build --family tirx`: the TIRx FA4 kernels of the variants file's [[tirx]] entries, per SKU, into the
store (fa4_aot/tirx/producer.py); exits 1 when any failed."""

from __future__ import annotations

import sys
from typing import Any

import click

from ..domain.skus import Sku
from ..matrix.variants import Matrix
from ..store import Store
from ..tirx import entries, producer
from .common import emit


def refuse_options(**given: object) -> None:
    """UsageError naming the FA4-only options given with --family tirx (they would be ignored otherwise)."""
    used = [f"--{name.replace('_', '-')}" for name, value in given.items() if value]
    if used:
        raise click.UsageError(f"--family tirx builds the variants file's [[tirx]] entries here, one compile at a "
                               f"time; {', '.join(used)} belong to FA4's builds: leave them out (list TIRx problems "
                               "in a [[tirx]] entry instead of --model/--calls)")


def build_tirx(store: Store, matrix: Matrix, targets: list[Sku], only: list[str], as_json: bool,
               quiet: bool) -> None:
    chosen = entries.select(entries.load(matrix.path), only, matrix.path)
    if not chosen:
        raise click.UsageError(f"{matrix.path} has no [[tirx]] entries to build (see docs/tirx.md)")
    say = None if (quiet or as_json) else (lambda line: click.echo(line, err=True))
    for entry in chosen:
        for why in entry.skipped:
            click.echo(f"{entry.name}: skipped {why}", err=True)
    work = [(p, e.name) for e in chosen for p in e.problems]
    reports = [producer.build(store, sku, work, progress=say) for sku in targets]
    docs: list[dict[str, Any]] = [{"sku": r.sku, "built": len(r.built), "present": len(r.present), "failed": r.failed,
             "kernel_keys": r.built + r.present} for r in reports]
    lines = [f"{d['sku']}: {d['built']} TIRx kernel(s) built, {d['present']} present, {len(d['failed'])} failed"
             for d in docs] + [f"FAILED {f['problem']}: {f['error']}" for d in docs for f in d["failed"]]
    emit(as_json, docs[0] if len(docs) == 1 else docs, "\n".join(lines))
    if any(d["failed"] for d in docs):
        sys.exit(1)
