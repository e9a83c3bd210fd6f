"""Lean-runtime recipe files of a SKU: publish one (validated JSON, size-capped, newest wins), list them, read one.

A recipe file holds every recorded region of one call signature on one SKU (fa4_aot.store.recipes); its key is
sha256 of the signature and the SKU's target facts, which the server recomputes from the file's regions before
it keeps the file, so a file cannot be published under another signature's or SKU's key.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request, Response, status
from starlette.concurrency import run_in_threadpool

from fa4_aot.domain import recipe_file
from fa4_aot.store import recipes as recipe_store

from .. import crud, models, schemas
from ..crud import recipes as crud_recipes
from ..crud import tokens as crud_tokens
from ..deps import PublisherDep, SessionDep, StoreDep, check_facts_allowed, check_sku_allowed, require_read
from ..errors import InvalidBody, NotFound, TooLarge
from ..openapi import PUBLISH, READ
from ..schemas import HEX64, SKU_NAME, RecipeOut, Recipes
from . import READ_ERRORS, errors

router = APIRouter(prefix="/v1/skus/{sku}/recipes", tags=["recipes"])
SkuPath = Annotated[str, Path(pattern=SKU_NAME, max_length=64, description="SKU name, e.g. h200")]
KeyPath = Annotated[str, Path(pattern=HEX64, min_length=64, max_length=64, description="recipe key")]
# a compact file (domain/recipe_file.py, what builds write) or the JSON file of a build before it
_JSON = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
         "application/json": {"schema": {"type": "object"}}}


@router.get("", response_model=Recipes, responses=errors(*READ_ERRORS, 404), openapi_extra=READ,
            dependencies=[Depends(require_read)])
def list_recipes(sku: SkuPath, session: SessionDep) -> Recipes:
    """Every recipe file held for SKUs with this SKU's target facts: key, sha256 of the bytes, size."""
    target = crud_recipes.target_of(session, sku=sku, read=True)
    return Recipes(recipes=crud_recipes.list_recipes(session, target=target))


@router.get("/{key}", response_class=Response, responses={200: {"content": _JSON}, **errors(*READ_ERRORS, 404)},
            openapi_extra=READ, dependencies=[Depends(require_read)])
def get_recipe(sku: SkuPath, key: KeyPath, session: SessionDep, store: StoreDep) -> Response:
    """The recipe file's bytes, with ETag "<sha256 of the bytes>" (clients check it against signed manifests):
    application/octet-stream for a compact file, application/json for a JSON file of an earlier build."""
    row = crud_recipes.get_recipe(session, key=key, target=crud_recipes.target_of(session, sku=sku, read=True))
    data = store.recipes(key) if row is not None else None
    if data is None:
        raise NotFound(f"no recipe file {key} for SKU {sku}; GET /v1/skus/{sku}/recipes lists them, and "
                       f"`fa4-aot push --sku {sku}` from the build store publishes them")
    etag = f'"{hashlib.sha256(data).hexdigest()}"'
    media = "application/octet-stream" if recipe_file.is_compact(data) else "application/json"
    return Response(data, media_type=media, headers={"ETag": etag, "Cache-Control": "no-cache"})


@router.put("/{key}", response_model=RecipeOut, status_code=status.HTTP_201_CREATED,
            responses={200: {"model": RecipeOut, "description": "Already held with these bytes"},
                       **errors(400, 401, 403, 409, 413, 422)},
            openapi_extra={**PUBLISH, "requestBody": {"required": True, "content": _JSON}})
async def put_recipe(sku: SkuPath, key: KeyPath, request: Request, response: Response, session: SessionDep,
                     store: StoreDep, token: PublisherDep) -> RecipeOut:
    """Publish recipe file `key` of `sku`: 201 when new or replacing other bytes (newest wins), 200 when held
    as is. 422 unless the body is a recipe file whose regions' signatures hash, with the SKU's facts, to `key`;
    413 past fa4_aot.store.recipes.MAX_BYTES; 409 for a SKU without published kernels; 403 for a token limited
    to SKUs that do not include every SKU with this SKU's facts (they share recipe keys)."""
    check_sku_allowed(token, sku)
    data = await request.body()
    if len(data) > recipe_store.MAX_BYTES:
        raise TooLarge(f"recipe file of {len(data)} bytes exceeds {recipe_store.MAX_BYTES} bytes")
    return await run_in_threadpool(_publish, sku, key, data, session, store, response, token)


def _publish(sku: str, key: str, data: bytes, session: SessionDep, store: StoreDep, response: Response,
             token: models.Token) -> RecipeOut:
    target = crud_recipes.target_of(session, sku=sku)
    check_facts_allowed(session, token, schemas.SkuFacts.model_validate(crud.get_sku(session, name=sku)))
    actor = crud_tokens.token_label(token)
    try:
        recipe_store.check_file(data, key, json.loads(target))
    except ValueError as e:
        raise InvalidBody(f"{e}; publish the recipes/ file `fa4-aot build` wrote, unchanged") from None
    digest = hashlib.sha256(data).hexdigest()
    with store.lock(key):  # the file first, the row last: a row names bytes the store holds
        if store.recipes(key) != data:
            store.put_recipes(key, data)
        created = crud_recipes.record_recipe(session, key=key, target=target, digest=digest, size=len(data),
                                             actor=actor)
    response.status_code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
    return RecipeOut(key=key, digest=digest, size=len(data))
