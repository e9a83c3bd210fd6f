"""The audit log: every successful write, who made it and on what. Admins only."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from .. import crud
from ..deps import AdminDep, SessionDep
from ..openapi import ADMIN
from ..schemas import AuditLog
from . import errors

router = APIRouter(prefix="/v1/audit", tags=["audit"])


@router.get("", response_model=AuditLog, responses=errors(400, 401, 403), openapi_extra=ADMIN)
def list_audit(
    session: SessionDep, _token: AdminDep,
    limit: Annotated[int, Query(ge=1, le=1000, description="At most this many entries")] = 100,
    after_id: Annotated[int, Query(ge=0, lt=2**63, description="Only entries with a larger id")] = 0,
) -> AuditLog:
    """Audit entries with id > after_id, oldest first, at most `limit`: objects created, kernels created or
    changed, manifests stored, revocations added (actor: the token's name, #<id> when unnamed) and tokens
    created, rotated or revoked (actor "cli"). Page on with the last entry's id as after_id."""
    return AuditLog(entries=crud.list_audit(session, after_id=after_id, limit=limit))
