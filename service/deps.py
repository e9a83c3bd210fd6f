"""FastAPI dependencies: settings, store, a database session per request, and bearer-token checks."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from fa4_aot.store import Store

from . import crud, models, schemas
from .config import Settings
from .crud import tokens as crud_tokens

bearer = HTTPBearer(auto_error=False, description="A token from `fa4-aot token create --scope read|publish|admin`.")
READ_SCOPES = frozenset({"read", "publish", "admin"})
PUBLISH_SCOPES = frozenset({"publish", "admin"})
ADMIN_SCOPES = frozenset({"admin"})


# Plain lookups are `async def` so that FastAPI does not hop to its threadpool for them (it runs sync
# dependencies there): object reads, the hot path, then touch no thread and no database.
async def get_settings(request: Request) -> Settings:
    return request.app.state.settings  # type: ignore[no-any-return]


async def get_store(request: Request) -> Store:
    return request.app.state.store  # type: ignore[no-any-return]


def get_db(request: Request) -> Iterator[Session]:
    """One session per request, closed (rolling back anything uncommitted) when the request ends."""
    with request.app.state.sessions() as session:
        yield session


SettingsDep = Annotated[Settings, Depends(get_settings)]
StoreDep = Annotated[Store, Depends(get_store)]
SessionDep = Annotated[Session, Depends(get_db)]
CredentialsDep = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


def check_token(session: Session, credentials: HTTPAuthorizationCredentials | None,
                allowed: frozenset[str]) -> models.Token:
    """The request's token. Raises 401 (with WWW-Authenticate) without a bearer token, 403 for an unknown,
    revoked or too weak one."""
    if credentials is None:
        raise HTTPException(401, "missing bearer token: send `Authorization: Bearer <token>` with a token from "
                                 "`fa4-aot token create`", headers={"WWW-Authenticate": "Bearer"})
    token = crud_tokens.find_token(session, plaintext=credentials.credentials)
    if token is None or token.revoked:
        raise HTTPException(403, "unknown or revoked token; create a new one with `fa4-aot token create`")
    if token.scope not in allowed:
        raise HTTPException(403, f"token {token.name!r} has scope {token.scope!r}; this request needs one of "
                                 f"{', '.join(sorted(allowed))}: create one with `fa4-aot token create --scope`")
    return token


async def require_read(request: Request, settings: SettingsDep, credentials: CredentialsDep) -> None:
    """Reads are open unless FA4_AOT_REQUIRE_READ_TOKEN is on; then any read, publish or admin token.
    Open reads open no database session."""
    if settings.require_read_token:
        await run_in_threadpool(_check_in_session, request, credentials, READ_SCOPES)


def _check_in_session(request: Request, credentials: HTTPAuthorizationCredentials | None,
                      allowed: frozenset[str]) -> None:
    with request.app.state.sessions() as session:
        check_token(session, credentials, allowed)


def require_publish(session: SessionDep, credentials: CredentialsDep) -> models.Token:
    """Writes need a publish or admin token, always. Returns it (its name goes into the audit log)."""
    return check_token(session, credentials, PUBLISH_SCOPES)


def require_admin(session: SessionDep, credentials: CredentialsDep) -> models.Token:
    """Revocations and the audit log need an admin token, always."""
    return check_token(session, credentials, ADMIN_SCOPES)


PublisherDep = Annotated[models.Token, Depends(require_publish)]
AdminDep = Annotated[models.Token, Depends(require_admin)]


def check_sku_allowed(token: models.Token, sku: str) -> None:
    """403 when `token` is limited to a set of SKUs that does not hold `sku` (objects are not limited: they
    are content-addressed, and no client fetches one that no kernel row names)."""
    allowed = crud_tokens.token_skus(token)
    if allowed is not None and sku not in allowed:
        label = crud_tokens.token_label(token)
        raise HTTPException(403, f"token {label!r} may publish only SKUs {', '.join(allowed)}, "
                                 f"not {sku!r}: use a token for {sku} (`fa4-aot token create --scope publish "
                                 f"--sku {sku}`)")


def check_facts_allowed(session: Session, token: models.Token, facts: schemas.SkuFacts) -> None:
    """403 when `token` is limited to a set of SKUs and a SKU outside it has these facts: SKUs with equal facts
    share kernel and recipe keys, so a write under one is a write under all (a recipe file is replaced, not
    refused). This also keeps a limited token from registering its SKU name with another SKU's facts."""
    allowed = crud_tokens.token_skus(token)
    others = [] if allowed is None else [n for n in crud.skus_with_facts(session, facts=facts) if n not in allowed]
    if others:
        label = crud_tokens.token_label(token)
        raise HTTPException(403, f"token {label!r} may publish only SKUs {', '.join(allowed or [])}, "
                                 f"but SKUs {', '.join(others)} have the same facts as {facts.name!r} and share its "
                                 "kernel and recipe keys: publish with a token for all of them, or register "
                                 f"{facts.name!r} with its own facts")
