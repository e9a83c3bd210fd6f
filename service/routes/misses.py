"""Misses: kernels that clients needed and the service lacked, counted so the matrix can grow to cover them."""

from __future__ import annotations

import functools
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request, Response, status
from fastapi.responses import JSONResponse

from .. import build_budget, build_order
from ..crud import builds as crud_builds
from ..crud import misses as crud_misses
from ..crud import tokens as crud_tokens
from ..deps import AdminDep, CredentialsDep, SessionDep, require_read
from ..openapi import ADMIN, READ
from ..schemas import HEX64, MissIn, MissOut
from ..schemas.builds import MissAnswer
from . import errors

router = APIRouter(prefix="/v1/misses", tags=["misses"])
KeyPath = Annotated[str, Path(pattern=HEX64, min_length=64, max_length=64, description="64 lowercase hex")]


@router.post("", status_code=status.HTTP_202_ACCEPTED, response_model=MissAnswer,
             responses={202: {"description": "Recorded; the build job that builds it, or why none was queued"},
                        **errors(400, 401, 403, 404, 413, 429)},  # 422: FastAPI's own list (schemas.MissIn)
             dependencies=[Depends(require_read)], openapi_extra=READ)
def report_miss(report: MissIn, request: Request, session: SessionDep, credentials: CredentialsDep) -> Response:
    """Record that a client needed `kernel_key` and lacked it (count += 1), and answer with the build job that
    builds it (one per SKU and key, however many clients report it; a builder, `fa4-aot builder`, runs it), or
    why none was queued (the queue is bounded per token, FA4_AOT_BUILD_QUEUE_PER_TOKEN, and in all,
    FA4_AOT_BUILD_QUEUE_MAX). Open to readers; at most 64 KiB, only for SKUs the service holds (404 otherwise),
    at most 10,000 distinct misses a SKU (429). A call outside FA4's own ranges, or a lean miss whose key is not
    its call's, is refused (422). Without a valid token, one client address may add at most
    FA4_AOT_ANONYMOUS_MISSES_PER_MINUTE new misses a minute (429), so an anonymous flood cannot fill a SKU's
    misses, and all such reports together may queue at most FA4_AOT_ANONYMOUS_BUILDS_PER_HOUR new build jobs per
    SKU an hour (429 with Retry-After; the miss is recorded); builders take a token's jobs before anonymous ones
    (service/build_order.py). Reports of known misses are always counted."""
    miss = report.to_miss()
    token = crud_tokens.find_token(session, plaintext=credentials.credentials) if credentials else None
    anonymous = token is None or token.revoked
    client = request.client.host if request.client else ""
    may_add = functools.partial(request.app.state.miss_rate.allow, client) if anonymous else None
    crud_misses.record_miss(session, miss=miss, may_add=may_add)
    settings = request.app.state.settings
    if anonymous:
        build_budget.check(session, sku=miss.sku, kernel_key=miss.kernel_key,
                           per_hour=settings.anonymous_builds_per_hour)
    requester = build_order.requester_of(None if anonymous or token is None else token.name, client)
    job, why = crud_builds.enqueue(session, miss=miss, requester=requester,
                                   max_total=settings.build_queue_max,
                                   max_per_requester=settings.build_queue_per_token)
    answer = MissAnswer(build=None if job is None else crud_builds.out(job), detail=why)
    return JSONResponse(answer.model_dump(mode="json"), status_code=status.HTTP_202_ACCEPTED)


@router.get("", response_model=list[MissOut], responses=errors(400, 401, 403),
            dependencies=[Depends(require_read)], openapi_extra=READ)
def list_misses(session: SessionDep, offset: Annotated[int, Query(ge=0, lt=1 << 31)] = 0,
                limit: Annotated[int, Query(ge=1, le=1000)] = 1000) -> list[MissOut]:
    """Recorded misses, most reported first, a page at a time: `limit` (at most 1000) from `offset`."""
    return crud_misses.list_misses(session, offset=offset, limit=limit)


@router.delete("/{kernel_key}", status_code=status.HTTP_204_NO_CONTENT, response_class=Response,
               responses=errors(400, 401, 403, 404, 409), openapi_extra=ADMIN)
def delete_miss(kernel_key: KeyPath, session: SessionDep, token: AdminDep) -> Response:
    """Forget one miss (admin token): a bogus report, or one built since; and its build jobs that no builder holds
    (queued ones are cancelled, ended ones removed), so that the next report of it queues a new one (a retry of a
    failed build). 409 names the builder when only a running job of it is left (DELETE again once it ends); 404
    when nothing of it is left."""
    crud_misses.delete_miss(session, kernel_key=kernel_key, actor=crud_tokens.token_label(token))
    return Response(status_code=status.HTTP_204_NO_CONTENT)
