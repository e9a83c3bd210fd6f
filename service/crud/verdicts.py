"""Certification verdicts in the database, keyword-only like crud.py (writes commit themselves and are audited;
reads never raise for a missing row).

A kernel has one verdict per device class: the newest measurement replaces an older one. A verdict's `when` is
its publisher's word, so the server orders by its own clock: a verdict counts as measured at its `when` or at the
time the server received it, whichever is earlier, so that a date ahead of the clock cannot outrank verdicts the
server receives later. Every publish holds the verdicts table's write lock from its first read to its commit and
writes the store's verdict files (Store.put_verdicts, what `sign` lists) under it: concurrent publishes are
serialized, none is lost, and the files hold what the database holds. Verdicts name kernels the service holds: a
row's SKU is its kernel's."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from fa4_aot.domain.kernel_keys import dumps as canonical_json
from fa4_aot.domain.verdicts import STATUSES, Verdict, check_when, utc_now
from fa4_aot.errors import StoreError
from fa4_aot.store import Store

from .. import db, models
from ..crud import record_audit, retrying
from ..models import utcnow
from ..schemas.verdicts import VerdictOut

_IN_CHUNK = 500  # keys per IN (...) query: far below SQLite's and PostgreSQL's parameter limits
Write = Callable[[list[Verdict]], None]


def kernel_skus(session: Session, *, kernel_keys: Iterable[str]) -> dict[str, str]:
    """{kernel key: its SKU} of those of `kernel_keys` the service holds (the others are left out)."""
    keys, found = sorted(set(kernel_keys)), {}
    for i in range(0, len(keys), _IN_CHUNK):
        rows = session.execute(select(models.Kernel.kernel_key, models.Kernel.sku)
                               .where(models.Kernel.kernel_key.in_(keys[i:i + _IN_CHUNK]))).all()
        found.update({key: sku for key, sku in rows})
    return found


def publish(session: Session, *, verdicts: list[Verdict], skus: dict[str, str], actor: str,
            write: Write | None = None) -> int:
    """Record `verdicts` (of kernels whose SKUs `skus` holds) and commit; returns how many were stored: new, or
    newer than the verdict held for their kernel and device class (the others are kept out, not an error).
    `write(stored)` runs under the table's write lock before the commit (the store's verdict files go there), so
    a failed write stores nothing and files are written in the order the database commits. One audit entry per
    call that stores any, as `actor`."""

    def work() -> int:
        db.lock_table(session, models.Verdict)
        stored = _upsert(session, verdicts, skus, actor, utc_now())
        if stored:
            record_audit(session, actor=actor, action="verdicts.store",
                         target=",".join(sorted({skus[v.kernel_key] for v in stored}))[:255],
                         detail={"stored": len(stored), "kernels": len({v.kernel_key for v in stored})})
            session.flush()
            if write is not None:
                write(stored)
        return len(stored)

    return retrying(session, work)


def measured(when: str, received: str) -> str:
    """When a verdict counts as measured: its `when`, but never later than the server received it."""
    return min(when, received)


def _upsert(session: Session, verdicts: list[Verdict], skus: dict[str, str], actor: str,
            now: str) -> list[Verdict]:
    """Add or replace the rows of `verdicts` that are new or newer (flushed, not committed); returns those."""
    newest: dict[tuple[str, str], Verdict] = {}
    for v in verdicts:  # within one call too, the newest of a kernel and device class wins, a later one a tie
        prior = newest.get((v.kernel_key, v.device))
        if prior is None or measured(v.when, now) >= measured(prior.when, now):
            newest[(v.kernel_key, v.device)] = v
    held = _held(session, {key for key, _ in newest})
    stored = []
    for ident, v in sorted(newest.items()):
        row = held.get(ident)
        if row is not None and (measured(v.when, now) < _rank(row) or verdict_of(row) == v):
            continue
        if row is None:
            row = models.Verdict(kernel_key=v.kernel_key, device=v.device)
            session.add(row)
        _fill(row, v, skus[v.kernel_key], actor)
        stored.append(v)
    session.flush()
    return stored


def _rank(row: models.Verdict) -> str:
    return measured(row.measured, utc_now(row.recorded.timestamp()))


def _held(session: Session, kernel_keys: set[str]) -> dict[tuple[str, str], models.Verdict]:
    keys, found = sorted(kernel_keys), {}
    for i in range(0, len(keys), _IN_CHUNK):
        rows = session.scalars(select(models.Verdict).where(models.Verdict.kernel_key.in_(keys[i:i + _IN_CHUNK])))
        found.update({(row.kernel_key, row.device): row for row in rows})
    return found


def _fill(row: models.Verdict, v: Verdict, sku: str, actor: str) -> None:
    row.sku, row.status, row.detail, row.tensor = sku, v.status, v.detail, v.tensor
    row.error, row.bound, row.checks, row.calls = v.error, v.bound, v.checks, canonical_json(v.calls)
    row.toolchain, row.measured, row.publisher, row.recorded = v.toolchain, v.when, actor, utcnow()


def verdict_of(row: models.Verdict) -> Verdict:
    return Verdict(kernel_key=row.kernel_key, device=row.device, status=row.status, detail=row.detail,
                   tensor=row.tensor, error=row.error, bound=row.bound, checks=row.checks, calls=json.loads(row.calls),
                   toolchain=row.toolchain, when=row.measured)


def import_store(session: Session, store: Store, skipped: list[str]) -> int:
    """Record the verdicts `store`'s files hold (`fa4-aot certify` writes them there) of kernels the database
    holds, and commit; returns how many were stored. A malformed file, or one of a kernel the database lacks, is
    named in `skipped` and left out: one bad file cannot keep the rest out."""
    try:
        keys = store.verdict_keys()
    except StoreError as e:  # the store itself is unusable: nothing to import from it
        skipped.append(str(e))
        return 0
    skus, found = kernel_skus(session, kernel_keys=keys), []
    for key in keys:
        if key not in skus:
            skipped.append(f"verdicts of kernel {key}: the database holds no such kernel (build or push it)")
            continue
        try:
            found += _possible(store.verdicts(key), skipped)
        except StoreError as e:
            skipped.append(str(e))
    return publish(session, verdicts=found, skus=skus, actor="import") if found else 0


def _possible(verdicts: list[Verdict], skipped: list[str]) -> list[Verdict]:
    """Those of `verdicts` whose `when` can be a measurement's time; the others are named in `skipped`."""
    found = []
    for v in verdicts:
        try:
            check_when(v.when)
            found.append(v)
        except ValueError as e:
            skipped.append(f"verdict of kernel {v.kernel_key} on {v.device}: {e}")
    return found


def list_verdicts(session: Session, *, sku: str | None = None, kernel_key: str | None = None,
                  device: str | None = None, status: str | None = None, offset: int = 0,
                  limit: int = 100) -> list[models.Verdict]:
    """Verdicts in (kernel key, device class) order, those matching every filter given, `limit` from `offset`."""
    query = select(models.Verdict).order_by(models.Verdict.kernel_key, models.Verdict.device)
    for column, value in ((models.Verdict.sku, sku), (models.Verdict.kernel_key, kernel_key),
                          (models.Verdict.device, device), (models.Verdict.status, status)):
        if value is not None:
            query = query.where(column == value)
    return list(session.scalars(query.offset(offset).limit(limit)).all())


def by_status(session: Session) -> dict[str, int]:
    """Verdicts by status, every status named (0 when none)."""
    rows = session.execute(select(models.Verdict.status, func.count()).group_by(models.Verdict.status)).all()
    found = {status: int(n) for status, n in rows}
    return {status: found.get(status, 0) for status in STATUSES}


def out(row: models.Verdict) -> VerdictOut:
    return VerdictOut(**verdict_of(row).to_dict(), sku=row.sku, publisher=row.publisher, recorded=row.recorded)
