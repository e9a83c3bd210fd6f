"""Misses: kernels that clients needed and the service lacked, counted so the matrix can grow to cover them."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Response, status

from .. import crud
from ..deps import SessionDep, require_read
from ..openapi import READ
from ..schemas import MissIn, MissOut
from . import errors

router = APIRouter(prefix="/v1/misses", tags=["misses"], dependencies=[Depends(require_read)])


@router.post("", status_code=status.HTTP_202_ACCEPTED, response_class=Response,
             responses={202: {"description": "Recorded"}, **errors(400, 401, 403, 413)}, openapi_extra=READ)
def report_miss(miss: MissIn, session: SessionDep) -> Response:
    """Record that a client needed `kernel_key` and lacked it (count += 1). Open to readers."""
    crud.record_miss(session, miss=miss)
    return Response(status_code=status.HTTP_202_ACCEPTED)


@router.get("", response_model=list[MissOut], responses=errors(401, 403), openapi_extra=READ)
def list_misses(session: SessionDep) -> list[MissOut]:
    """Every recorded miss, most reported first."""
    return crud.list_misses(session)
