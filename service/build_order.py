"""The order in which builders claim queued build jobs: a token's jobs before anonymous ones (a
report without a token, requester "address:<ip>"), and round robin across reporters within each, so that twenty
anonymous misses, or one token's hundred, do not put another token's job at the back of one FIFO queue. A
reporter's turn is the last time one of its jobs was claimed: never claimed first, then the longest waiting; the
oldest job of the reporter whose turn it is goes first. Expressed as ORDER BY clauses, so the claim stays one
query under the queue's table lock (crud_builds.claim)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import case, func, select
from sqlalchemy.orm import aliased

from . import models

ANONYMOUS = "address:"  # the requester of a report without a valid token: "address:<client address>"


def requester_of(token_name: str | None, client: str) -> str:
    """Who asked for a job: the token's name, or the client's address without a valid token."""
    return token_name if token_name is not None else f"{ANONYMOUS}{client}"


def fair() -> tuple[Any, ...]:
    """ORDER BY clauses over models.BuildJob: tokens before anonymous reporters, then the reporter whose last
    claimed job started longest ago (never: first), then the oldest job."""
    job, other = models.BuildJob, aliased(models.BuildJob)
    anonymous = case((job.requester.startswith(ANONYMOUS), 1), else_=0)
    last_turn = (select(func.max(other.started)).where(other.requester == job.requester)
                 .correlate(job).scalar_subquery())
    return anonymous, last_turn.asc().nulls_first(), job.id
