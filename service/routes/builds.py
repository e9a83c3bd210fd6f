"""Build jobs: what clients missed, built once by a builder (`fa4-aot builder`, fa4_aot/build/builder.py) and
published as `push` does. Reads are open as other reads; claiming (POST /v1/build-claims: a claim is its own
resource, so no path of a job's can be read as it), renewing and finishing need a publish token."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Path, Query, Request, Response, status

from .. import crud_builds
from ..build_schemas import BuildOut, BuildResult, ClaimIn
from ..deps import PublisherDep, SessionDep, require_read
from ..openapi import PUBLISH, READ
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
def claim_build(claim: ClaimIn, session: SessionDep, _token: PublisherDep) -> BuildOut | Response:
    """Take the oldest queued job (or one whose builder's lease ran out) for `builder`, leased for
    `lease_seconds`: renew it (POST /v1/builds/{id}/lease) before then, or another builder takes it over."""
    job = crud_builds.claim(session, builder=claim.builder, lease_seconds=claim.lease_seconds)
    return Response(status_code=status.HTTP_204_NO_CONTENT) if job is None else crud_builds.out(job, task=True)


@router.post("/v1/builds/{job_id}/lease", response_model=BuildOut, responses=errors(400, 401, 403, 404, 409),
             openapi_extra=PUBLISH)
def renew_build(job_id: JobPath, claim: ClaimIn, session: SessionDep, _token: PublisherDep) -> BuildOut:
    """Extend the builder's lease of its running job; 409 when the job is no longer its own."""
    return crud_builds.out(crud_builds.renew(session, job_id=job_id, builder=claim.builder,
                                             lease_seconds=claim.lease_seconds))


@router.post("/v1/builds/{job_id}/finish", response_model=BuildOut, responses=errors(400, 401, 403, 404, 409),
             openapi_extra=PUBLISH)
def finish_build(job_id: JobPath, result: BuildResult, request: Request, session: SessionDep,
                 _token: PublisherDep) -> BuildOut:
    """End the builder's job: done (its kernels, libraries and recipes are published), failed, or rejected
    (FA4 refused the call; `detail` is FA4's reason, which every later report of the miss is answered with)."""
    job = crud_builds.finish(session, job_id=job_id, builder=result.builder, result=result)
    request.app.state.metrics.observe_build(job)
    return crud_builds.out(job)
