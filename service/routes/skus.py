"""SKUs and their manifests: what a client of one SKU may fetch."""

from __future__ import annotations

import hashlib
import json
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Path, Response

from .. import crud
from ..deps import SessionDep, require_read
from ..errors import NotFound
from ..openapi import READ
from ..schemas import SKU_NAME, Manifest, SkuSummary
from ..transfer import etag_matches
from . import READ_ERRORS, errors

router = APIRouter(prefix="/v1/skus", tags=["skus"], dependencies=[Depends(require_read)])
SkuPath = Annotated[str, Path(pattern=SKU_NAME, max_length=64, description="SKU name, e.g. h200")]


@router.get("", response_model=list[SkuSummary], responses=errors(*READ_ERRORS), openapi_extra=READ)
def list_skus(session: SessionDep) -> list[SkuSummary]:
    """Every SKU the service holds kernels for, with its target facts and kernel count."""
    return crud.list_skus(session)


@router.get(
    "/{sku}/manifest",
    response_model=Manifest,
    responses={**errors(*READ_ERRORS, 404), 304: {"description": "Not modified (If-None-Match matched)"}},
    openapi_extra=READ,
)
def get_manifest(
    sku: SkuPath, session: SessionDep, if_none_match: Annotated[str | None, Header()] = None
) -> Response:
    """The SKU's facts and kernels sorted by key, as canonical JSON with a strong ETag (sha256 of the body);
    a matching If-None-Match gets 304."""
    row = crud.get_sku(session, name=sku)
    if row is None:
        raise NotFound(f"unknown SKU {sku!r}: GET /v1/skus lists the SKUs this service holds; build its kernels "
                       f"with `fa4-aot build --sku {sku}` and publish them (PUT /v1/objects, POST /v1/kernels)")
    body = json.dumps(crud.manifest(session, sku=row).model_dump(mode="json"), sort_keys=True,
                      separators=(",", ":")).encode()
    headers = {"ETag": f'"{hashlib.sha256(body).hexdigest()}"', "Cache-Control": "no-cache"}
    if etag_matches(if_none_match, headers["ETag"]):
        return Response(status_code=304, headers=headers)
    return Response(body, media_type="application/json", headers=headers)
