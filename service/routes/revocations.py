"""Revocations: signing keys and manifests that clients must no longer trust. Admins add; anyone may read."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Response, status

from ..crud import tokens as crud_tokens
from ..crud import trust as crud_trust
from ..deps import AdminDep, SessionDep, require_read
from ..openapi import ADMIN, READ
from ..schemas import RevocationIn, RevocationOut, Revocations
from . import READ_ERRORS, errors

router = APIRouter(prefix="/v1/revocations", tags=["revocations"])


@router.post("", response_model=RevocationOut, status_code=status.HTTP_201_CREATED,
             responses={200: {"model": RevocationOut, "description": "Already revoked (the first entry is kept)"},
                        **errors(400, 401, 403, 413)},
             openapi_extra=ADMIN)
def add_revocation(revocation: RevocationIn, session: SessionDep, response: Response,
                   token: AdminDep) -> RevocationOut:
    """Revoke a signing key (`{"kind": "key", "id": <16 hex>}`) or one manifest (`{"kind": "manifest",
    "id": <64 hex>}`), with an optional reason of at most 500 characters: 201 when new, 200 when it was
    already revoked. Clients refuse what is revoked from their next start. Needs an admin token."""
    out, created = crud_trust.add_revocation(session, revocation=revocation, actor=crud_tokens.token_label(token))
    response.status_code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
    return out


@router.get("", response_model=Revocations, responses=errors(*READ_ERRORS),
            dependencies=[Depends(require_read)], openapi_extra=READ)
def list_revocations(session: SessionDep) -> Revocations:
    """Revoked key ids and manifest ids (sorted), and every entry with its reason, oldest first."""
    return crud_trust.list_revocations(session)
