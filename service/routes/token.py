"""Who am I: what the request's bearer token is (`fa4-aot login` checks a token with it before storing it)."""

from __future__ import annotations

import json

from fastapi import APIRouter

from ..deps import READ_SCOPES, CredentialsDep, SessionDep, check_token
from ..schemas import TokenSelf
from . import errors

router = APIRouter(prefix="/v1/token", tags=["tokens"])


@router.get("", response_model=TokenSelf, responses=errors(401, 403))
def whoami(session: SessionDep, credentials: CredentialsDep) -> TokenSelf:
    """The name, scope and SKU limit of the bearer token; 401 without one, 403 for an unknown or revoked one.
    Never reveals anything about other tokens."""
    token = check_token(session, credentials, READ_SCOPES)
    return TokenSelf(name=token.name, scope=token.scope, skus=json.loads(token.skus) if token.skus else None)
