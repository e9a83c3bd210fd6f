"""Signed SKU manifests: publishers upload envelopes signed with their keys; clients verify them with theirs."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request, Response, status
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from .. import crud
from ..crud import tokens as crud_tokens
from ..crud import trust as crud_trust
from ..deps import PublisherDep, SessionDep, check_sku_allowed, require_read
from ..errors import InvalidBody, NotFound, ServiceError
from ..openapi import PUBLISH, READ
from ..schemas import SKU_NAME, ErrorBody, ManifestStored, SignedManifests, check_depth
from . import READ_ERRORS, errors

router = APIRouter(prefix="/v1/skus", tags=["manifests"])
SkuPath = Annotated[str, Path(pattern=SKU_NAME, max_length=64, description="SKU name, e.g. h200")]
_INVALID = {"model": ErrorBody, "description": "Not a well-formed signed manifest of this SKU (body not JSON, "
                                               "wrong format, missing field, malformed id or time, other SKU)"}
_ENVELOPE_BODY = {"required": True, "content": {"application/json": {
    "schema": {"$ref": "#/components/schemas/Envelope"}}}}


@router.get("/{sku}/manifests", response_model=SignedManifests, responses=errors(*READ_ERRORS, 404),
            dependencies=[Depends(require_read)], openapi_extra=READ)
def list_manifests(sku: SkuPath, session: SessionDep) -> Response:
    """Every signed manifest stored for the SKU, newest first, as uploaded (at most 40 MiB together: older
    manifests of a key make room for newer ones). The service does not verify signatures, expiry or revocations:
    clients do (GET /v1/revocations lists what is revoked)."""
    if crud.get_sku(session, name=sku) is None:
        raise NotFound(f"unknown SKU {sku!r}: GET /v1/skus lists the SKUs this service holds")
    return Response(crud_trust.list_manifests(session, sku=sku), media_type="application/json")


@router.put(
    "/{sku}/manifests",
    response_model=ManifestStored,
    status_code=status.HTTP_201_CREATED,
    responses={200: {"model": ManifestStored, "description": "Already stored"},
               **errors(400, 401, 403, 409, 413, 429), 422: _INVALID},  # 413: also when the SKU's would outgrow 40 MiB
    openapi_extra={**PUBLISH, "requestBody": _ENVELOPE_BODY},
)
async def put_manifest(sku: SkuPath, request: Request, response: Response, session: SessionDep,
                       token: PublisherDep) -> ManifestStored:
    """Store a signed manifest (fa4_aot.trust.signing envelope, at most limits.MANIFEST_BODY_LIMIT: 8 MiB) of the
    SKU: 201 when new, 200 when this envelope is already stored. 422 when malformed or for another SKU; 409 when
    the SKU is unknown or its facts differ, when a listed kernel is not served with exactly the listed object
    digest, or when the manifest is stored with another signature; 403 when the token is limited to other SKUs.
    The signature is not checked here (the service holds no trust)."""
    check_sku_allowed(token, sku)
    envelope = _json(await _body(request))
    stored, created = await run_in_threadpool(crud_trust.store_manifest, session, sku=sku, envelope=envelope,
                                              actor=crud_tokens.token_label(token), admin=token.scope == "admin")
    response.status_code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
    return stored


async def _body(request: Request) -> bytes:
    try:
        return await request.body()  # limits.JsonBodyLimit caps it (MANIFEST_BODY_LIMIT)
    except ClientDisconnect:
        raise ServiceError("client disconnected before the whole body arrived; nothing was stored") from None


def _json(body: bytes) -> Any:
    """The parsed body; InvalidBody when it is not JSON or nests deeper than any envelope (which is 4 deep)."""
    try:
        return check_depth(json.loads(body))
    except RecursionError:
        raise InvalidBody("the body nests too deep to be a signed manifest; send the envelope that `fa4-aot "
                          "sign` wrote") from None
    except ValueError as e:  # UnicodeDecodeError is a ValueError too
        raise InvalidBody(f"the body is not JSON ({e}); send the envelope that `fa4-aot sign` wrote") from None
