"""Certify jobs: published kernels checked on a GPU of their SKU by a certifier (`fa4-aot certifier`,
fa4_aot/certify/certifier.py) before clients that require certification run them. Reads are open as other reads;
claiming (POST /v1/certify-claims: a claim is its own resource), renewing and finishing need a publish token
allowed the job's SKU, and renewing and finishing also the very token and claim id that claimed the job."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Path, Query, Request, Response, status
from fastapi.exceptions import RequestValidationError
from sqlalchemy.orm import Session

from fa4_aot.domain.verdicts import Verdict
from fa4_aot.store import Store

from .. import crud
from ..crud import certify as crud_certify
from ..crud import tokens as crud_tokens
from ..crud import verdicts as crud_verdicts
from ..deps import PublisherDep, SessionDep, StoreDep, check_facts_allowed, check_sku_allowed, require_read
from ..errors import InvalidBody, NotFound
from ..models import Token
from ..openapi import PUBLISH, READ
from ..schemas import HEX64, SKU_NAME, SkuFacts
from ..schemas.certify import CertifyClaimIn, CertifyJobOut, CertifyLeaseIn, CertifyResult
from . import errors

router = APIRouter(tags=["certify"])
JobPath = Annotated[int, Path(ge=1, lt=1 << 31, description="A certify job id (GET /v1/certify-jobs)")]
Status = Literal["queued", "running", "done", "failed"]


@router.get("/v1/certify-jobs", response_model=list[CertifyJobOut], responses=errors(400, 401, 403),
            dependencies=[Depends(require_read)], openapi_extra=READ)
def list_certify_jobs(session: SessionDep, status: Status | None = None,
                      sku: Annotated[str | None, Query(pattern=SKU_NAME, max_length=64)] = None,
                      kernel_key: Annotated[str | None, Query(pattern=HEX64, min_length=64, max_length=64)] = None,
                      offset: Annotated[int, Query(ge=0, lt=1 << 31)] = 0,
                      limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> list[CertifyJobOut]:
    """Certify jobs, newest first, of one `status`, `sku` or `kernel_key` when given, `limit` (at most 1000) from
    `offset`: state, attempts, lease, certifier and device, verdict."""
    jobs = crud_certify.list_jobs(session, status=status, sku=sku, kernel_key=kernel_key, offset=offset, limit=limit)
    return [crud_certify.out(j) for j in jobs]


@router.get("/v1/certify-jobs/{job_id}", response_model=CertifyJobOut, responses=errors(400, 401, 403, 404),
            dependencies=[Depends(require_read)], openapi_extra=READ)
def get_certify_job(job_id: JobPath, session: SessionDep) -> CertifyJobOut:
    """One job: clients that require certification and wait (FA4_AOT_BUILD_WAIT) poll this until it ends."""
    return crud_certify.out(crud_certify.get(session, job_id=job_id))


@router.post("/v1/certify-claims", response_model=CertifyJobOut,
             responses={204: {"description": "No job of this SKU to run"}, **errors(400, 401, 403, 404)},
             openapi_extra=PUBLISH)
def claim_certify_job(claim: CertifyClaimIn, request: Request, session: SessionDep, store: StoreDep,
                      token: PublisherDep) -> CertifyJobOut | Response:
    """Take the oldest queued job of `sku` (or one whose certifier's lease ran out) for `certifier` on device
    class `device`, leased for `lease_seconds` (10 to 3600): renew it (POST /v1/certify-jobs/{id}/lease, with the
    answer's `claim`) before then, or another certifier takes it over. The token must be allowed `sku` and every
    SKU sharing its facts (and so its kernels). A job whose certifiers died 3 times ends failed, verdict crash."""
    _check_allowed(session, token, claim.sku)
    _keep(session, store, claim.sku, crud_certify.expire(session, sku=claim.sku), actor="certify-queue")
    job, claim_id = crud_certify.claim(session, sku=claim.sku, certifier=claim.certifier, device=claim.device,
                                       token_id=token.id, lease_seconds=claim.lease_seconds)
    request.app.state.metrics.set_certify(crud_certify.depth(session))
    return Response(status_code=status.HTTP_204_NO_CONTENT) if job is None else crud_certify.out(job, claim_id=claim_id)


@router.post("/v1/certify-jobs/{job_id}/lease", response_model=CertifyJobOut,
             responses=errors(400, 401, 403, 404, 409), openapi_extra=PUBLISH)
def renew_certify_job(job_id: JobPath, lease: CertifyLeaseIn, session: SessionDep,
                      token: PublisherDep) -> CertifyJobOut:
    """Extend the claim's lease; 403 for another token than the claiming one, 409 when the claim is no longer
    the job's (its lease ran out and another certifier took it, or it ended)."""
    check_sku_allowed(token, crud_certify.get(session, job_id=job_id).sku)
    job = crud_certify.renew(session, job_id=job_id, token_id=token.id, claim_id=lease.claim,
                             lease_seconds=lease.lease_seconds)
    return crud_certify.out(job, claim_id=lease.claim)


@router.post("/v1/certify-jobs/{job_id}/finish", response_model=CertifyJobOut,
             responses=errors(400, 401, 403, 404, 409), openapi_extra=PUBLISH)  # 422: FastAPI's own list
def finish_certify_job(job_id: JobPath, result: CertifyResult, request: Request, session: SessionDep,
                       store: StoreDep, token: PublisherDep) -> CertifyJobOut:
    """End the claim's job: done with its verdicts (one for the job's kernel on the claim's device class; kept as
    verdicts are kept, readable at GET /v1/certify-jobs/{id}), failed (queued again until its attempts are spent)
    or released (the certifier stops: queued again). 403/409 as for the lease; 422 for verdicts of another kernel
    or device class."""
    check_sku_allowed(token, crud_certify.get(session, job_id=job_id).sku)
    job = crud_certify.held(session, job_id=job_id, token_id=token.id, claim_id=result.claim)
    try:
        verdicts = crud_certify.verdicts_of(job, result)
    except InvalidBody as e:  # shaped like FastAPI's own 422s, as the schema documents them
        raise RequestValidationError([{"type": "value_error", "loc": ("body", "verdicts"), "msg": str(e),
                                       "input": None}]) from None
    _keep(session, store, job.sku, verdicts, actor=crud_tokens.token_label(token))
    job = crud_certify.finish(session, job_id=job_id, token_id=token.id, result=result, verdicts=verdicts)
    request.app.state.metrics.observe_certify(job)
    return crud_certify.out(job)


def _check_allowed(session: Session, token: Token, sku: str) -> None:
    """403 unless the token may publish `sku` and every SKU with its facts; 404 for a SKU the server lacks."""
    check_sku_allowed(token, sku)
    row = crud.get_sku(session, name=sku)
    if row is None:
        raise NotFound(f"unknown SKU {sku!r}: certify jobs exist only for SKUs this service holds (GET /v1/skus)")
    check_facts_allowed(session, token, SkuFacts.model_validate(row))


def _keep(session: Session, store: Store, sku: str, verdicts: list[Verdict], actor: str) -> None:
    """Keep verdicts as POST /v1/verdicts does: the verdicts table and the store's verdicts/ files (what `sign`
    over the store lists in the SKU's manifest). Every certify job's kernel is held, under `sku`."""
    if verdicts:
        crud_verdicts.publish(session, verdicts=verdicts, skus={v.kernel_key: sku for v in verdicts}, actor=actor,
                              write=store.put_verdicts)
