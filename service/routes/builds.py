"""Build jobs: what clients missed, built once by a builder (`fa4-aot builder`, fa4_aot/compile/builder.py) and
published as `push` does. Reads are open as other reads; claiming (POST /v1/build-claims: a claim is its own
resource, so no path of a job's can be read as it), renewing and finishing need a publish token allowed the job's
SKU, and renewing and finishing also the very token and claim id that claimed the job."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Path, Query, Request, Response, status
from fastapi.exceptions import RequestValidationError

from ..crud import builds as crud_builds
from ..crud import tokens as crud_tokens
from ..deps import PublisherDep, SessionDep, check_sku_allowed, require_read
from ..models import Token
from ..openapi import PUBLISH, READ
from ..schemas.builds import BuildOut, BuildResult, ClaimIn, LeaseIn
from . import errors

router = APIRouter(tags=["builds"])
JobPath = Annotated[int, Path(ge=1, lt=1 << 31, description="A job id (GET /v1/builds)")]
Status = Literal["queued", "running", "done", "failed", "rejected"]


@router.get("/v1/builds", response_model=list[BuildOut], responses=errors(400, 401, 403),
            dependencies=[Depends(require_read)], openapi_extra=READ)
def list_builds(session: SessionDep, status: Status | None = None,
                offset: Annotated[int, Query(ge=0, lt=1 << 31)] = 0,
                limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> list[BuildOut]:
    """Build jobs, newest first, of one `status` when given, `limit` (at most 1000) from `offset`."""
    return [crud_builds.out(j) for j in crud_builds.list_jobs(session, status=status, offset=offset, limit=limit)]


@router.get("/v1/builds/{job_id}", response_model=BuildOut, responses=errors(400, 401, 403, 404),
            dependencies=[Depends(require_read)], openapi_extra=READ)
def get_build(job_id: JobPath, session: SessionDep) -> BuildOut:
    """One job: clients waiting for a build (FA4_AOT_BUILD_WAIT) poll this until it is done, failed or rejected."""
    return crud_builds.out(crud_builds.get(session, job_id=job_id))


@router.post("/v1/build-claims", response_model=BuildOut, responses={204: {"description": "No job to run"},
                                                           **errors(400, 401, 403)},
             openapi_extra=PUBLISH)
def claim_build(claim: ClaimIn, session: SessionDep, token: PublisherDep) -> BuildOut | Response:
    """Take the oldest queued job of one of `skus` (the SKUs the builder's variants file holds; every SKU the token
    may publish when absent), or one whose builder's lease ran out, for `builder`, leased for `lease_seconds` (10 to
    600): renew it (POST /v1/builds/{id}/lease, with the answer's `claim`) before then, or another builder takes it
    over. Only jobs of SKUs the token may publish are claimed; 403 when it may publish none of `skus`."""
    job, claim_id = crud_builds.claim(session, builder=claim.builder, token_id=token.id,
                                      skus=_claimable_skus(token, claim.skus), lease_seconds=claim.lease_seconds)
    return Response(status_code=status.HTTP_204_NO_CONTENT) if job is None else crud_builds.out(
        job, task=True, claim_id=claim_id)


def _claimable_skus(token: Token, skus: list[str] | None) -> list[str] | None:
    """The SKUs a claim may take jobs of: those asked for that the token may publish (None: no limit)."""
    allowed = crud_tokens.token_skus(token)
    if allowed is None or skus is None:
        return skus if allowed is None else allowed
    both = [s for s in skus if s in allowed]
    if not both:
        check_sku_allowed(token, skus[0])  # 403 naming the token's SKUs and how to get a token for this one
    return both


@router.post("/v1/builds/{job_id}/lease", response_model=BuildOut, responses=errors(400, 401, 403, 404, 409),
             openapi_extra=PUBLISH)
def renew_build(job_id: JobPath, lease: LeaseIn, session: SessionDep, token: PublisherDep) -> BuildOut:
    """Extend the claim's lease; 403 for another token than the claiming one, 409 when the claim is no longer the
    job's (its lease ran out and another builder took it, or it ended): the builder must drop the job."""
    check_sku_allowed(token, crud_builds.get(session, job_id=job_id).sku)
    job = crud_builds.renew(session, job_id=job_id, token_id=token.id, claim_id=lease.claim,
                            lease_seconds=lease.lease_seconds)
    return crud_builds.out(job, claim_id=lease.claim)


@router.post("/v1/builds/{job_id}/finish", response_model=BuildOut, responses=errors(400, 401, 403, 404, 409),
             openapi_extra=PUBLISH)  # 422: FastAPI's own list
def finish_build(job_id: JobPath, result: BuildResult, request: Request, session: SessionDep,
                 token: PublisherDep) -> BuildOut:
    """End the claim's job: done (its kernel, or for a lean call its SKU's recipe file, is published: 422 when
    not), failed (a transient failure: queued again after a backoff until its attempts are spent), or rejected
    (FA4 refused the call; `detail` is FA4's reason, which every later report of the miss is answered with).
    403/409 as for the lease."""
    check_sku_allowed(token, crud_builds.get(session, job_id=job_id).sku)
    job = crud_builds.held(session, job_id=job_id, token_id=token.id, claim_id=result.claim)
    missing = crud_builds.published(session, job) if result.status == "done" else ""
    if missing:  # shaped like FastAPI's own 422s, as the schema documents them
        raise RequestValidationError([{"type": "value_error", "loc": ("body", "status"), "msg": missing,
                                       "input": result.status}])
    job = crud_builds.finish(session, job_id=job_id, token_id=token.id, result=result)
    request.app.state.metrics.observe_build(job)
    return crud_builds.out(job)
