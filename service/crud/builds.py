"""Build jobs in the database, keyword-only like crud.py (writes commit themselves; reads never raise for a
missing row). A reported miss becomes at most one job per (SKU, key), however many clients report it; the queue
is bounded per requester and in all; a builder claims a queued job of the SKUs it builds (and its token may
publish), a token's before anonymous ones and round robin across reporters (build_order.py), or one whose lease
ran out (its builder died), and renews the lease while it works. Only the claiming token with the claim id its
claim was answered with renews or finishes a job (lease_queue.py, the certify queue's too); a failure
is transient and queued again with a backoff, FA4's refusal (rejected) is final. Each write that checks and
changes the queue holds the table's write lock (db.lock_table), so concurrent reports and claims cannot pass a
check together."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

from sqlalchemy import Select, and_, func, or_, select
from sqlalchemy.orm import Session

from fa4_aot.domain.kernel_keys import dumps as canonical_json
from fa4_aot.domain.misses import LEAN_FAMILY, Miss

from .. import build_order, crud, db, models
from ..schemas.builds import BuildOut, BuildResult
from . import lease_queue
from . import recipes as crud_recipes

ACTIVE = ("queued", "running")
MAX_ATTEMPTS = 3  # claims of one job: past them its builders kept dying on it, or kept failing
FINAL = ("done", "failed", "rejected")
RETRY_BASE, RETRY_MAX = 30.0, 900.0  # seconds a failed job waits before its next claim: doubling, capped
QUEUE = lease_queue.Queue(models.BuildJob, noun="build job", runner="builder", listing="/v1/builds",
                          claims="/v1/build-claims", statuses=ACTIVE + FINAL)
now = lease_queue.now


def enqueue(session: Session, *, miss: Miss, requester: str, max_total: int,
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
                          call=None if miss.call is None else canonical_json(miss.call),
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


def find(session: Session, *, sku: str, kernel_key: str) -> models.BuildJob | None:
    return session.scalar(select(models.BuildJob).where(models.BuildJob.sku == sku,
                                                        models.BuildJob.kernel_key == kernel_key))


def get(session: Session, *, job_id: int) -> models.BuildJob:
    """The job `job_id`; NotFound when there is none."""
    return lease_queue.get(session, QUEUE, job_id=job_id)


def claim(session: Session, *, builder: str, token_id: int, skus: list[str] | None,
          lease_seconds: float) -> tuple[models.BuildJob | None, str]:
    """(the next claimable job of `skus` (any SKU when None) in build_order.fair()'s order: queued and past its
    retry's backoff, or running with a lapsed lease; now running for `builder` under a new claim until its lease
    ends, and the claim id that alone renews and finishes it); (None, '') when none. A job whose builders died
    MAX_ATTEMPTS times (a call that kills its compiler, say) fails instead of being claimed again."""
    db.lock_table(session, models.BuildJob)
    t = now()
    while True:
        job = session.scalar(_claimable(skus, t).order_by(*build_order.fair()).limit(1))
        if job is None or job.attempts < MAX_ATTEMPTS:
            break
        _end(job, "failed", f"its builders stopped answering {job.attempts} times while building it (killed, or out "
                            "of memory?); see their logs. DELETE /v1/misses/<key> forgets it: the next report queues "
                            "it again", t)
    if job is None:
        session.commit()
        return None, ""
    claim_id = lease_queue.take(QUEUE, job, runner=builder, token_id=token_id, lease_seconds=lease_seconds, t=t)
    job.not_before = None
    session.commit()
    return job, claim_id


def _claimable(skus: list[str] | None, t: datetime) -> Select[models.BuildJob]:
    waited = or_(models.BuildJob.not_before.is_(None), models.BuildJob.not_before <= t)
    query = select(models.BuildJob).where(or_(and_(models.BuildJob.status == "queued", waited),
                                              lease_queue.lapsed(QUEUE, t)))
    return query if skus is None else query.where(models.BuildJob.sku.in_(skus))


def held(session: Session, *, job_id: int, token_id: int, claim_id: str) -> models.BuildJob:
    """Job `job_id` if it is running under this token's claim `claim_id` (lease_queue.held: 403 or 409 if not)."""
    return lease_queue.held(session, QUEUE, job_id=job_id, token_id=token_id, claim_id=claim_id)


def renew(session: Session, *, job_id: int, token_id: int, claim_id: str, lease_seconds: float) -> models.BuildJob:
    """Extend the lease of the job held under `claim_id` (see held()): the builder must drop it on 403/409."""
    return lease_queue.renew(session, QUEUE, job_id=job_id, token_id=token_id, claim_id=claim_id,
                             lease_seconds=lease_seconds)


def finish(session: Session, *, job_id: int, token_id: int, result: BuildResult) -> models.BuildJob:
    """Record how the claim's job ended: done or rejected (final), or failed, a transient failure (a full disk, a
    server away while publishing): queued again after retry_delay() while attempts remain, else failed for good.
    The caller checks that a done job's result is published (published())."""
    db.lock_table(session, models.BuildJob)
    job = held(session, job_id=job_id, token_id=token_id, claim_id=result.claim)
    t = now()
    job.compile_seconds, job.built = result.compile_seconds, result.built
    if result.status != "failed":
        _end(job, result.status, result.detail, t)
    elif job.attempts >= MAX_ATTEMPTS:
        _end(job, "failed", f"its builders failed {job.attempts} times; the last, {job.builder}, said: "
                            f"{result.detail}. DELETE /v1/misses/<key> forgets it: the next report queues it again", t)
    else:
        delay = retry_delay(job.attempts)
        lease_queue.requeue(job, f"attempt {job.attempts} by {job.builder} failed: {result.detail}; queued again, "
                                 f"claimable after {int(delay.total_seconds())} s")
        job.not_before = t + delay
    session.commit()
    return job


def retry_delay(attempts: int) -> timedelta:
    """Pure: how long a job that failed `attempts` times waits before its next claim (doubling from RETRY_BASE)."""
    return timedelta(seconds=min(RETRY_BASE * 2 ** max(attempts - 1, 0), RETRY_MAX))


def published(session: Session, job: models.BuildJob) -> str:
    """'' when what `job` asked for is served: its kernel's row (a kernel miss), or a recipe file of its SKU's
    target (a lean call's miss, family "recipe"); else why it is not, and what a builder must do first."""
    if job.family == LEAN_FAMILY:  # a lean call's miss: its build publishes recipe files
        target = crud_recipes.target_of(session, sku=job.sku)
        if session.scalar(select(models.Recipe.recipe_key).where(models.Recipe.target == target).limit(1)):
            return ""
        return (f"build job {job.id} is done only once the recipe file of SKU {job.sku} is published: push its "
                "kernels and recipes (as `fa4-aot push` does) before finishing, or finish with status failed")
    if crud.get_kernel(session, kernel_key=job.kernel_key) is not None:
        return ""
    return (f"build job {job.id} is done only once kernel {job.kernel_key} is published: push it (as `fa4-aot "
            "push` does) before finishing, or finish with status failed")


def _end(job: models.BuildJob, status: str, detail: str, t: datetime) -> None:
    lease_queue.end(job, status, detail, t)
    job.not_before = None


def list_jobs(session: Session, *, status: str | None = None, offset: int = 0,
              limit: int = 100) -> list[models.BuildJob]:
    """Jobs newest first (by id), of one status when given, `limit` from `offset`."""
    return lease_queue.list_jobs(session, QUEUE, offset=offset, limit=limit, status=status)


def depth(session: Session) -> dict[str, int]:
    """Jobs by status, every status named (0 when none)."""
    return lease_queue.depth(session, QUEUE)


def out(job: models.BuildJob, *, task: bool = False, claim_id: str | None = None) -> BuildOut:
    """The job as the API shows it; with `task`, also what a builder needs to run it (compile key, args);
    `claim_id` only in the answers to its claimer."""
    doc = BuildOut(
        id=job.id, sku=job.sku, kernel_key=job.kernel_key, family=job.family, status=job.status,  # type: ignore[arg-type]
        reports=job.reports, attempts=job.attempts, builder=job.builder, created=job.created, started=job.started,
        finished=job.finished, lease_until=job.lease_until, detail=job.detail,
        compile_seconds=job.compile_seconds, built=job.built, call=_loaded(job.call), claim=claim_id,
        not_before=job.not_before)
    if task:
        doc.compile_key, doc.args = json.loads(job.compile_key), _loaded(job.args)
    return doc


def _loaded(text: str | None) -> dict | None:  # type: ignore[type-arg]
    return None if text is None else json.loads(text)
