"""Build jobs in the database, keyword-only like crud.py (writes commit themselves; reads never raise for a
missing row). A reported miss becomes at most one job per (SKU, key), however many clients report it; the queue
is bounded per requester and in all; a builder claims the oldest queued job, or one whose lease ran out (its
builder died), and renews the lease while it works. Each write that checks and changes the queue holds the
table's write lock (db.lock_table), so concurrent reports and claims cannot pass a check together."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session

from fa4_aot.spec.kernel_keys import dumps as canonical_json

from . import db, models, schemas
from .build_schemas import BuildOut, BuildResult
from .errors import Conflict, NotFound

ACTIVE = ("queued", "running")
MAX_ATTEMPTS = 3  # claims of one job: past them its builders kept dying on it
FINAL = ("done", "failed", "rejected")


def now() -> datetime:
    return datetime.now(UTC)


def enqueue(session: Session, *, miss: schemas.MissIn, requester: str, max_total: int,
            max_per_requester: int) -> tuple[models.BuildJob | None, str]:
    """(the job that builds `miss`, ''), counting one more report of it when it exists in any state (a rejected
    or failed job is answered with its reason, never run again); else a new queued job. (None, why) when the
    queue is full, for this requester or in all: the miss itself is recorded by the caller either way."""
    db.lock_table(session, models.BuildJob)
    job = find(session, sku=miss.sku, kernel_key=miss.kernel_key)
    if job is not None:
        job.reports += 1
        session.commit()
        return job, ""
    why = _full(session, requester, max_total, max_per_requester)
    if why:
        session.rollback()
        return None, why
    job = models.BuildJob(sku=miss.sku, kernel_key=miss.kernel_key, family=miss.family,
                          compile_key=canonical_json(miss.compile_key), status="queued", requester=requester,
                          call=None if miss.call is None else canonical_json(miss.call.model_dump()),
                          args=None if miss.args is None else canonical_json(miss.args),
                          reports=1, attempts=0, builder="", detail="", compile_seconds=0.0, built=0, created=now())
    session.add(job)
    session.commit()
    return job, ""


def _full(session: Session, requester: str, max_total: int, max_per_requester: int) -> str:
    active = models.BuildJob.status.in_(ACTIVE)
    mine = session.scalar(select(func.count()).select_from(models.BuildJob)
                          .where(active, models.BuildJob.requester == requester)) or 0
    if mine >= max_per_requester:
        return (f"{requester} already has {mine} build jobs queued or running (the most one token may have, "
                "FA4_AOT_BUILD_QUEUE_PER_TOKEN); the miss is recorded: report it again once they finish")
    total = session.scalar(select(func.count()).select_from(models.BuildJob).where(active)) or 0
    if total >= max_total:
        return (f"the build queue is full ({total} jobs queued or running, FA4_AOT_BUILD_QUEUE_MAX); the miss is "
                "recorded: report it again later, or start more builders (`fa4-aot builder`)")
    return ""


def forget(session: Session, *, kernel_key: str) -> int:
    """Delete the finished jobs of `kernel_key` (with its miss: an admin's retry of a failed build); returns how
    many. Queued and running jobs stay."""
    jobs = session.scalars(select(models.BuildJob).where(models.BuildJob.kernel_key == kernel_key,
                                                         models.BuildJob.status.in_(FINAL))).all()
    for job in jobs:
        session.delete(job)
    session.commit()
    return len(jobs)


def find(session: Session, *, sku: str, kernel_key: str) -> models.BuildJob | None:
    return session.scalar(select(models.BuildJob).where(models.BuildJob.sku == sku,
                                                        models.BuildJob.kernel_key == kernel_key))


def get(session: Session, *, job_id: int) -> models.BuildJob:
    """The job `job_id`; NotFound when there is none."""
    job = session.get(models.BuildJob, job_id)
    if job is None:
        raise NotFound(f"no build job {job_id}; GET /v1/builds lists them")
    return job


def claim(session: Session, *, builder: str, lease_seconds: float) -> models.BuildJob | None:
    """The oldest queued job, or the oldest running one whose lease ran out, now running for `builder` until
    its lease ends; None when there is none. A job whose builders died MAX_ATTEMPTS times (a call that kills its
    compiler, say) fails instead of being claimed again."""
    db.lock_table(session, models.BuildJob)
    t = now()
    while True:
        job = session.scalar(
            select(models.BuildJob)
            .where(or_(models.BuildJob.status == "queued",
                       and_(models.BuildJob.status == "running", models.BuildJob.lease_until < t)))
            .order_by(models.BuildJob.id).limit(1))
        if job is None or job.attempts < MAX_ATTEMPTS:
            break
        job.status, job.finished, job.lease_until = "failed", t, None
        job.detail = (f"its builders stopped answering {job.attempts} times while building it (killed, or out of "
                      "memory?); see their logs. DELETE /v1/misses/<key> forgets it: the next report queues it again")
    if job is None:
        session.commit()
        return None
    job.status, job.builder, job.attempts = "running", builder, job.attempts + 1
    job.lease_until, job.started = t + timedelta(seconds=lease_seconds), job.started or t
    session.commit()
    return job


def renew(session: Session, *, job_id: int, builder: str, lease_seconds: float) -> models.BuildJob:
    """Extend `builder`'s lease of running job `job_id`. Conflict when the job is no longer its own (its lease
    ran out and another builder claimed it, or it finished): the builder must drop it."""
    db.lock_table(session, models.BuildJob)
    job = _held(get(session, job_id=job_id), builder)
    job.lease_until = now() + timedelta(seconds=lease_seconds)
    session.commit()
    return job


def finish(session: Session, *, job_id: int, builder: str, result: BuildResult) -> models.BuildJob:
    """Record the end of `builder`'s job `job_id`: done, failed or rejected with its detail and costs."""
    db.lock_table(session, models.BuildJob)
    job = _held(get(session, job_id=job_id), builder)
    job.status, job.detail, job.finished, job.lease_until = result.status, result.detail, now(), None
    job.compile_seconds, job.built = result.compile_seconds, result.built
    session.commit()
    return job


def _held(job: models.BuildJob, builder: str) -> models.BuildJob:
    if job.status != "running" or job.builder != builder:
        session_state = f"{job.status}, builder {job.builder or 'none'}"
        raise Conflict(f"build job {job.id} is not running for builder {builder!r} ({session_state}): its lease "
                       "ran out and another builder took it, or it finished; drop it and claim another")
    return job


def list_jobs(session: Session, *, status: str | None = None, offset: int = 0,
              limit: int = 100) -> list[models.BuildJob]:
    """Jobs newest first (by id), of one status when given, `limit` from `offset`."""
    query = select(models.BuildJob).order_by(models.BuildJob.id.desc()).offset(offset).limit(limit)
    if status is not None:
        query = query.where(models.BuildJob.status == status)
    return list(session.scalars(query).all())


def depth(session: Session) -> dict[str, int]:
    """Jobs by status, every status named (0 when none)."""
    rows = session.execute(select(models.BuildJob.status, func.count()).group_by(models.BuildJob.status)).all()
    found = {status: int(n) for status, n in rows}
    return {status: found.get(status, 0) for status in ACTIVE + FINAL}


def out(job: models.BuildJob, *, task: bool = False) -> BuildOut:
    """The job as the API shows it; with `task`, also what a builder needs to run it (compile key, args)."""
    doc = BuildOut(
        id=job.id, sku=job.sku, kernel_key=job.kernel_key, family=job.family, status=job.status,  # type: ignore[arg-type]
        reports=job.reports, attempts=job.attempts, builder=job.builder, created=job.created, started=job.started,
        finished=job.finished, lease_until=job.lease_until, detail=job.detail,
        compile_seconds=job.compile_seconds, built=job.built, call=_loaded(job.call))
    if task:
        doc.compile_key, doc.args = json.loads(job.compile_key), _loaded(job.args)
    return doc


def _loaded(text: str | None) -> dict | None:  # type: ignore[type-arg]
    return None if text is None else json.loads(text)
