"""Certify jobs in the database, keyword-only like crud.py (writes commit themselves; reads never raise for a
missing row). A published kernel becomes one queued job (however often it is published), and one more per other
device class whose certifier finds no queued job while the kernel lacks a verdict for its class (a verdict holds
for one device class: a GPU under another driver or CUDA must be certified too); a certifier claims the
oldest job of its SKU with a lease, renews it while it works and finishes it with its verdicts. Only the claiming
token with the claim id its claim was answered with may renew or finish a job (a token of another
SKU, or the same certifier name, must not). A job whose certifiers keep dying on it ends failed after MAX_ATTEMPTS
claims, with a `crash` verdict for their device class: the kernel may be what kills them."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from sqlalchemy import exists, or_, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, aliased

from fa4_aot.domain.kernel_keys import dumps as canonical_json
from fa4_aot.domain.verdicts import Verdict, worst

from .. import db, models
from ..errors import InvalidBody
from ..schemas.certify import CertifyJobOut, CertifyResult
from . import lease_queue

ACTIVE = ("queued", "running")
FINAL = ("done", "failed")
MAX_ATTEMPTS = 3  # claims of one job that may end without a result
QUEUE = lease_queue.Queue(models.CertifyJob, noun="certify job", runner="certifier", listing="/v1/certify-jobs",
                          claims="/v1/certify-claims", statuses=ACTIVE + FINAL)
now = lease_queue.now


def enqueue(session: Session, *, kernel_key: str, sku: str, family: str) -> None:
    """Queue the certification of a published kernel, unless it has a job in any state (idempotent: INSERT ...
    ON CONFLICT DO NOTHING, so racing publishers of one kernel make one job)."""
    enqueue_many(session, [(kernel_key, sku, family)])


def enqueue_many(session: Session, kernels: list[tuple[str, str, str]]) -> None:
    """enqueue for each (kernel key, SKU, family) of `kernels`, a few statements for thousands (a store the
    server imports at startup), one commit."""
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    t = now()
    for start in range(0, len(kernels), _ROWS_PER_INSERT):
        rows = [dict(kernel_key=key, wanted="", sku=sku, family=family, status="queued", attempts=0, lapses=0,
                     certifier="", device="", claim_hash="", created=t, detail="", verdict="", verdicts="[]",
                     seconds=0.0)
                for key, sku, family in kernels[start:start + _ROWS_PER_INSERT]]
        stmt = dialect.insert(models.CertifyJob).values(rows)
        session.execute(stmt.on_conflict_do_nothing(index_elements=[models.CertifyJob.kernel_key,
                                                                    models.CertifyJob.wanted]))
    session.commit()


_ROWS_PER_INSERT = 500  # 16 columns a row: under SQLite's 32,766 bound parameters a statement


def get(session: Session, *, job_id: int) -> models.CertifyJob:
    """The job `job_id`; NotFound when there is none."""
    return lease_queue.get(session, QUEUE, job_id=job_id)


def expire(session: Session, *, sku: str) -> list[Verdict]:
    """End the jobs of `sku` whose certifiers died MAX_ATTEMPTS times (the last lease ran out): failed, with a
    `crash` verdict for the last certifier's device class. Returns those verdicts, for the caller to keep."""
    db.lock_table(session, models.CertifyJob)
    t = now()
    dead = session.scalars(select(models.CertifyJob).where(
        models.CertifyJob.sku == sku, lease_queue.lapsed(QUEUE, t), models.CertifyJob.attempts >= MAX_ATTEMPTS)).all()
    found = []
    for job in dead:
        job.lapses += 1
        why = (f"its certifiers stopped answering {job.attempts} times while certifying it (the last: "
               f"{job.certifier} on {job.device}): the kernel may kill the process that runs it")
        verdict = Verdict(job.kernel_key, job.device, "crash", detail=why)
        _end(job, "failed", f"{why}; recorded as verdict crash. See the certifiers' logs", [verdict], t)
        found.append(verdict)
    session.commit()
    return found


def claim(session: Session, *, sku: str, certifier: str, device: str, token_id: int,
          lease_seconds: float) -> tuple[models.CertifyJob | None, str]:
    """(the oldest queued job of `sku` for any device class or `device`'s, or running one whose lease ran out, else
    a new job for a kernel of `sku` that lacks a verdict for `device`, now running for `certifier` on `device`
    until its lease ends, and the claim id that alone renews and finishes it); (None, '') when none."""
    db.lock_table(session, models.CertifyJob)
    t = now()
    job = session.scalar(
        select(models.CertifyJob)
        .where(models.CertifyJob.sku == sku, models.CertifyJob.attempts < MAX_ATTEMPTS,
               models.CertifyJob.wanted.in_(("", device)),
               or_(models.CertifyJob.status == "queued", lease_queue.lapsed(QUEUE, t)))
        .order_by(models.CertifyJob.id).limit(1)) or _for_device(session, sku=sku, device=device, t=t)
    if job is None:
        session.commit()
        return None, ""
    job.lapses += int(job.status == "running")  # taken over: its certifier's lease ran out
    claim_id = lease_queue.take(QUEUE, job, runner=certifier, token_id=token_id, lease_seconds=lease_seconds, t=t)
    job.device = device
    session.commit()
    return job, claim_id


def _for_device(session: Session, *, sku: str, device: str, t: datetime) -> models.CertifyJob | None:
    """A new queued job (flushed) for the oldest kernel of `sku` whose publish-time job ran on another device
    class and which has neither a verdict nor a job for `device`; None when every kernel has. The caller holds
    the table's lock, so two certifiers of one class never make two jobs."""
    jobs, other, verdicts = models.CertifyJob, aliased(models.CertifyJob), models.Verdict
    first = session.scalar(
        select(jobs).where(jobs.sku == sku, jobs.wanted == "", jobs.status.in_(FINAL), jobs.device != device,
                           ~exists().where(other.kernel_key == jobs.kernel_key, other.wanted == device),
                           ~exists().where(verdicts.kernel_key == jobs.kernel_key, verdicts.device == device))
        .order_by(jobs.id).limit(1))
    if first is None:
        return None
    job = models.CertifyJob(kernel_key=first.kernel_key, wanted=device, sku=sku, family=first.family,
                            status="queued", attempts=0, lapses=0, certifier="", device="", claim_hash="", created=t,
                            detail="", verdict="", verdicts="[]", seconds=0.0)
    session.add(job)
    session.flush()
    return job


def held(session: Session, *, job_id: int, token_id: int, claim_id: str) -> models.CertifyJob:
    """Job `job_id` if it is running under this token's claim `claim_id` (lease_queue.held: 403 or 409 if not)."""
    return lease_queue.held(session, QUEUE, job_id=job_id, token_id=token_id, claim_id=claim_id)


def renew(session: Session, *, job_id: int, token_id: int, claim_id: str, lease_seconds: float) -> models.CertifyJob:
    """Extend the lease of the job held under `claim_id` (see held())."""
    return lease_queue.renew(session, QUEUE, job_id=job_id, token_id=token_id, claim_id=claim_id,
                             lease_seconds=lease_seconds)


def verdicts_of(job: models.CertifyJob, result: CertifyResult) -> list[Verdict]:
    """The result's verdicts, checked: each of the job's kernel and its claim's device class, and for `done` at
    least one. InvalidBody (422) naming what is wrong."""
    found = [v.verdict() for v in result.verdicts]
    wrong = [v for v in found if v.kernel_key != job.kernel_key or v.device != job.device]
    if wrong:
        raise InvalidBody(f"certify job {job.id} certifies kernel {job.kernel_key} on {job.device} (its claim's "
                          f"device class); a verdict for {wrong[0].kernel_key} on {wrong[0].device} is not its "
                          "result: send the job's own verdicts")
    if result.status == "done" and not found:
        raise InvalidBody(f"certify job {job.id} is done only with a verdict for kernel {job.kernel_key} on "
                          f"{job.device}; send status failed (with why) when the certifier could not run it")
    return found


def finish(session: Session, *, job_id: int, token_id: int, result: CertifyResult,
           verdicts: list[Verdict]) -> models.CertifyJob:
    """Record how the claim's job ended (see CertifyResult): done with `verdicts` (already kept by the caller),
    failed (queued again while attempts remain, else failed for good) or released (queued again, uncounted)."""
    db.lock_table(session, models.CertifyJob)
    job = held(session, job_id=job_id, token_id=token_id, claim_id=result.claim)
    t = now()
    job.seconds = result.seconds
    if result.status == "done":
        top = worst(verdicts)
        _end(job, "done", result.detail or top.describe(), verdicts, t)
    elif result.status == "released":
        lease_queue.requeue(job, f"released by {job.certifier} (it stopped); queued again")
        job.attempts -= 1
    elif job.attempts >= MAX_ATTEMPTS:
        _end(job, "failed", f"its certifiers could not certify it {job.attempts} times; the last, {job.certifier}, "
                            f"said: {result.detail}", [], t)
    else:
        lease_queue.requeue(job, f"attempt {job.attempts} by {job.certifier} failed: {result.detail}; queued again")
    session.commit()
    return job


def _end(job: models.CertifyJob, status: str, detail: str, verdicts: list[Verdict], t: datetime) -> None:
    lease_queue.end(job, status, detail, t)
    job.verdicts = canonical_json([v.to_dict() for v in verdicts])
    job.verdict = worst(verdicts).status if verdicts else ""


def list_jobs(session: Session, *, status: str | None = None, sku: str | None = None, kernel_key: str | None = None,
              offset: int = 0, limit: int = 100) -> list[models.CertifyJob]:
    """Jobs newest first (by id), filtered by what is given, `limit` from `offset`."""
    return lease_queue.list_jobs(session, QUEUE, offset=offset, limit=limit, status=status, sku=sku,
                                 kernel_key=kernel_key)


def depth(session: Session) -> dict[str, int]:
    """Jobs by status, every status named (0 when none)."""
    return lease_queue.depth(session, QUEUE)


def out(job: models.CertifyJob, *, claim_id: str | None = None) -> CertifyJobOut:
    """The job as the API shows it; `claim_id` only in the answers to its claimer."""
    verdicts: Any = json.loads(job.verdicts or "[]")
    return CertifyJobOut(
        id=job.id, sku=job.sku, kernel_key=job.kernel_key, keys=[job.kernel_key], family=job.family,
        status=job.status, attempts=job.attempts, lapses=job.lapses, certifier=job.certifier,  # type: ignore[arg-type]
        device=job.device, created=job.created, started=job.started, finished=job.finished,
        lease_until=job.lease_until, detail=job.detail, verdict=job.verdict, verdicts=verdicts, seconds=job.seconds,
        claim=claim_id)
