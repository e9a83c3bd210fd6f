"""The claim that holds a running job of a server's queue (build jobs, certify jobs), whatever the job: a claim
answers with a claim id that only its hash is kept of, and only the claiming token with that id renews or finishes
the job. A runner that lost its lease, or another token that knows the runner's name (GET lists
it), holds nothing. The job rows share the columns `id`, `status`, `token_id` and `claim_hash`."""

from __future__ import annotations

import hashlib
import secrets
from typing import Annotated, Any

from pydantic import Field

from .errors import Conflict, Forbidden

ClaimId = Annotated[str, Field(min_length=16, max_length=128, pattern=r"^[A-Za-z0-9_-]+$",
                               description="The claim id the claim was answered with")]


def new() -> tuple[str, str]:
    """(a fresh claim id for the claimer's answer, its hash for the job's row)."""
    claim_id = secrets.token_urlsafe(24)
    return claim_id, digest(claim_id)


def digest(claim_id: str) -> str:
    return hashlib.sha256(claim_id.encode()).hexdigest()


def check_held(job: Any, *, what: str, runner: str, token_id: int, claim_id: str, claims: str) -> None:
    """Pass when `job` is running under this token's claim `claim_id`. Forbidden (403) when another token claimed
    it; Conflict (409) when the claim is not the job's current one or the job is not running. `what` names the
    job ("build job 7"), `runner` its current runner, `claims` where to claim another (POST /v1/build-claims)."""
    if job.token_id is not None and job.token_id != token_id:
        raise Forbidden(f"{what} was claimed with another token; only the token that claimed it (with its claim id) "
                        f"may renew or finish it: claim a job of your own (POST {claims})")
    if job.status != "running" or not job.claim_hash or not secrets.compare_digest(job.claim_hash, digest(claim_id)):
        raise Conflict(f"{what} is not running under this claim ({job.status}, {runner or 'no runner'}): its lease "
                       "ran out and another claim took it, or it ended; drop it and claim another")
