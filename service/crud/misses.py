"""Misses in the database, keyword-only like crud.py (whose conventions hold: writes commit themselves; reads
never raise for a missing row). Reports come from unauthenticated clients when reads are open, so every one is
bounded: its fields (schemas.MissIn), the distinct keys of a SKU, and a page of the list."""

from __future__ import annotations

import json
from collections.abc import Callable

from sqlalchemy import func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from fa4_aot.domain.kernel_keys import dumps as canonical_json
from fa4_aot.domain.misses import Miss

from .. import db, models, schemas
from ..crud import record_audit
from ..errors import Conflict, NotFound, TooMany
from ..models import utcnow

MAX_MISSES_PER_SKU = 10_000  # distinct kernel keys; a real matrix gap is a few hundred


def record_miss(session: Session, *, miss: Miss, may_add: Callable[[], bool] | None = None) -> None:
    """Insert the miss or count one more report of it, atomically (INSERT ... ON CONFLICT DO UPDATE). A
    report never replaces a call or exact record (`args`) already recorded. Raises NotFound for a SKU the service
    does not hold and TooMany when the SKU already has MAX_MISSES_PER_SKU distinct misses (a known key is still
    counted) or when `may_add()` (an anonymous client's rate) refuses a new key. The check and the insert hold
    the misses table's write lock, so concurrent reports cannot pass the cap together."""
    if session.get(models.Sku, miss.sku) is None:
        raise NotFound(f"unknown SKU {miss.sku!r}: misses are recorded only for SKUs this service holds "
                       "(GET /v1/skus lists them)")
    db.lock_table(session, models.Miss)
    known = session.get(models.Miss, miss.kernel_key) is not None
    if not known and may_add is not None and not may_add():
        raise TooMany("too many new misses reported from this address without a token; send a read token "
                      "(FA4_AOT_TOKEN) or retry later", headers={"Retry-After": "60"})
    held = session.scalar(select(func.count()).select_from(models.Miss).where(models.Miss.sku == miss.sku)) or 0
    if not known and held >= MAX_MISSES_PER_SKU:
        raise TooMany(f"SKU {miss.sku!r} already has {held} distinct misses recorded; an admin clears built ones "
                      "with DELETE /v1/misses/<kernel_key>")
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    now = utcnow()
    stmt = dialect.insert(models.Miss).values(
        kernel_key=miss.kernel_key, sku=miss.sku, family=miss.family,
        compile_key=canonical_json(miss.compile_key), count=1, first_seen=now, last_seen=now,
        call=None if miss.call is None else canonical_json(miss.call),
        args=None if miss.args is None else canonical_json(miss.args),
    )
    stmt = stmt.on_conflict_do_update(
        index_elements=[models.Miss.kernel_key],
        set_={"count": models.Miss.count + 1, "last_seen": stmt.excluded.last_seen,
              "call": func.coalesce(models.Miss.call, stmt.excluded.call),
              "args": func.coalesce(models.Miss.args, stmt.excluded.args)},
    )
    session.execute(stmt)
    session.commit()


def list_misses(session: Session, *, offset: int = 0, limit: int = 1000) -> list[schemas.MissOut]:
    """Misses most reported first (then by key), `limit` of them from `offset`. A stored row that no longer
    validates (recorded before the checks) is passed over, never a 500."""
    query = (select(models.Miss).order_by(models.Miss.count.desc(), models.Miss.kernel_key)
             .offset(offset).limit(limit))
    found = []
    for m in session.scalars(query).all():
        try:
            found.append(schemas.MissOut(kernel_key=m.kernel_key, sku=m.sku, family=m.family,
                                         compile_key=json.loads(m.compile_key), count=m.count,
                                         call=None if m.call is None else json.loads(m.call),
                                         args=None if m.args is None else json.loads(m.args),
                                         first_seen=m.first_seen, last_seen=m.last_seen))
        except (ValueError, RecursionError):
            continue
    return found


def delete_miss(session: Session, *, kernel_key: str, actor: str) -> None:
    """Forget a miss (built since, or bogus) and every build job of it that no builder holds: queued ones are
    cancelled, ended ones (done, failed, rejected) removed, so the next report queues a new job
    (a queued job used to outlive its miss, fail, and answer every later report with its failure). Audited.
    Raises Conflict, naming the builder, when only a running job is left (DELETE again once it ends), and
    NotFound when nothing of the key is left."""
    db.lock_table(session, models.BuildJob)
    row = session.get(models.Miss, kernel_key)
    jobs = session.scalars(select(models.BuildJob).where(models.BuildJob.kernel_key == kernel_key)).all()
    running = [job for job in jobs if job.status == "running"]
    removed = [job for job in jobs if job.status != "running"]
    if row is None and not removed:
        session.rollback()
        if running:
            job = running[0]
            raise Conflict(f"kernel {kernel_key} has no miss left, but build job {job.id} of it is running on "
                           f"builder {job.builder!r}; DELETE again once it ends (GET /v1/builds/{job.id})")
        raise NotFound(f"nothing is recorded for kernel {kernel_key}: no miss and no build job; GET /v1/misses "
                       "lists the misses")
    for job in removed:
        session.delete(job)
    if row is not None:
        session.delete(row)
    record_audit(session, actor=actor, action="miss.delete", target=kernel_key,
                 detail={"sku": row.sku if row is not None else removed[0].sku,
                         "jobs": {str(job.id): job.status for job in removed}, "running": [job.id for job in running]})
    session.commit()
