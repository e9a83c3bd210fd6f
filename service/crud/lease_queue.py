"""The lease queue both job tables are (build jobs, certify jobs), keyword-only like crud.py: a runner claims a job
with a lease and a claim id (job_claims.py), renews the lease while it works, and ends the job or queues it again;
a job whose lease ran out may be claimed by another runner. `Queue` names one table and how it speaks of its jobs;
each function here takes one. Which job is claimed next, what a result holds and when a failure is final differ
between the queues and stay in builds.py and certify.py, which call these. renew() commits, as crud's writes do;
take(), requeue() and end() only change a row, for a caller that commits holding the table's write lock
(db.lock_table) from its check to the change."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, TypeVar

from sqlalchemy import ColumnElement, and_, func, select
from sqlalchemy.orm import Session

from .. import db, job_claims
from ..errors import NotFound

J = TypeVar("J")  # a job row: models.BuildJob, models.CertifyJob


@dataclass(frozen=True)
class Queue(Generic[J]):
    """One job table: its model (columns id, status, token_id, claim_hash, attempts, lease_until, started,
    finished, detail and the runner's name), what a job is called ("build job"), the column naming its runner
    ("builder"), where jobs are listed and claimed, and every status, active ones first (depth())."""

    model: type[J]
    noun: str
    runner: str
    listing: str
    claims: str
    statuses: tuple[str, ...]

    @property
    def table(self) -> Any:
        """The model, for its columns in queries: both models have the columns named above, which no type states."""
        return self.model


def now() -> datetime:
    return datetime.now(UTC)


def get(session: Session, queue: Queue[J], *, job_id: int) -> J:
    """The job `job_id`; NotFound when there is none."""
    job = session.get(queue.model, job_id)
    if job is None:
        raise NotFound(f"no {queue.noun} {job_id}; GET {queue.listing} lists them")
    return job


def held(session: Session, queue: Queue[J], *, job_id: int, token_id: int, claim_id: str) -> J:
    """Job `job_id` if it is running under this token's claim `claim_id`: Forbidden (403) when another token
    claimed it, Conflict (409) when the claim is not the job's current one (a lapsed runner's, even of the same
    name) or the job is not running."""
    job = get(session, queue, job_id=job_id)
    row: Any = job  # the columns of either model
    runner = f"{queue.runner} {getattr(row, queue.runner) or 'none'}"
    job_claims.check_held(row, what=f"{queue.noun} {row.id}", runner=runner, token_id=token_id, claim_id=claim_id,
                          claims=queue.claims)
    return job


def renew(session: Session, queue: Queue[J], *, job_id: int, token_id: int, claim_id: str,
          lease_seconds: float) -> J:
    """Extend the lease of the job held under `claim_id` (see held()) and commit: the runner must drop the job on
    403/409."""
    db.lock_table(session, queue.model)
    job = held(session, queue, job_id=job_id, token_id=token_id, claim_id=claim_id)
    row: Any = job
    row.lease_until = now() + timedelta(seconds=lease_seconds)
    session.commit()
    return job


def lapsed(queue: Queue[Any], t: datetime) -> ColumnElement[bool]:
    """Running jobs whose lease ran out by `t`: their runner died or lost touch."""
    return and_(queue.table.status == "running", queue.table.lease_until < t)


def take(queue: Queue[Any], job: Any, *, runner: str, token_id: int, lease_seconds: float, t: datetime) -> str:
    """Make `job` running for `runner` under a new claim of `token_id` until its lease ends, counting the attempt;
    the claim id, which alone renews and finishes it (only its hash is kept)."""
    claim_id, job.claim_hash = job_claims.new()
    job.status, job.token_id, job.attempts = "running", token_id, job.attempts + 1
    setattr(job, queue.runner, runner)
    job.lease_until, job.started = t + timedelta(seconds=lease_seconds), job.started or t
    return claim_id


def requeue(job: Any, detail: str) -> None:
    """Queue `job` again, held by no lease, claim or token."""
    job.status, job.detail, job.lease_until, job.claim_hash, job.token_id = "queued", detail, None, "", None


def end(job: Any, status: str, detail: str, t: datetime) -> None:
    """End `job` with final `status` at `t`: no lease or claim holds it any more."""
    job.status, job.detail, job.finished, job.lease_until, job.claim_hash = status, detail, t, None, ""


def list_jobs(session: Session, queue: Queue[J], *, offset: int = 0, limit: int = 100,
              **equal: str | None) -> list[J]:
    """Jobs newest first (by id), `limit` from `offset`, of the given value of each column of `equal` that is
    not None (status="queued", sku=...)."""
    query = select(queue.model).order_by(queue.table.id.desc()).offset(offset).limit(limit)
    for column, value in equal.items():
        if value is not None:
            query = query.where(getattr(queue.table, column) == value)
    return list(session.scalars(query).all())


def depth(session: Session, queue: Queue[Any]) -> dict[str, int]:
    """Jobs by status, every status named (0 when none)."""
    rows = session.execute(select(queue.table.status, func.count()).group_by(queue.table.status)).all()
    found = {status: int(n) for status, n in rows}
    return {status: found.get(status, 0) for status in queue.statuses}
