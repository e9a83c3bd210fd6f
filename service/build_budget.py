"""The compile budget of anonymous reports: reads may be open, and a miss report decides what a
builder compiles, so reports without a token may queue at most FA4_AOT_ANONYMOUS_BUILDS_PER_HOUR new build jobs
per SKU in any hour (the queue caps bound jobs in flight, not compiles over time). Past it a new anonymous miss
is recorded but answered 429 with Retry-After: when the oldest job of the hour leaves the window. A report of a
miss that already has a job is answered with it, never counted; a token's reports are not counted."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from . import db, models
from .build_order import ANONYMOUS
from .errors import TooMany

WINDOW = timedelta(hours=1)


def check(session: Session, *, sku: str, kernel_key: str, per_hour: int) -> None:
    """Pass when an anonymous report of (`sku`, `kernel_key`) may queue its job; else TooMany (429) with
    Retry-After. Takes the build queue's table lock, so the caller's enqueue in the same transaction cannot be
    passed by a concurrent report's."""
    db.lock_table(session, models.BuildJob)
    job = models.BuildJob
    if session.scalar(select(job.id).where(job.sku == sku, job.kernel_key == kernel_key)) is not None:
        return
    now = datetime.now(UTC)
    created = session.scalars(select(job.created).where(job.sku == sku, job.requester.startswith(ANONYMOUS),
                                                        job.created > now - WINDOW)
                              .order_by(job.created).limit(per_hour)).all()
    if len(created) < per_hour:
        return
    wait = max(1, math.ceil((created[0] + WINDOW - now).total_seconds()))
    raise TooMany(f"reports without a token already queued {len(created)} new build jobs for SKU {sku!r} in the "
                  f"last hour (FA4_AOT_ANONYMOUS_BUILDS_PER_HOUR); the miss is recorded: retry in {wait} s, or "
                  "report with a read token (FA4_AOT_TOKEN)", headers={"Retry-After": str(wait)})
