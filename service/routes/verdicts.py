"""Certification verdicts: certifiers publish what `fa4-aot certify` measured of kernels the service
holds, readers list them. A published verdict is also written into the service's store (Store.put_verdicts), so
`fa4-aot sign` over that store lists it in the SKU's signed manifest, which is what trusted clients believe."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Depends, Query, Response, status

from .. import crud
from ..crud import tokens as crud_tokens
from ..crud import verdicts as crud_verdicts
from ..deps import PublisherDep, SessionDep, StoreDep, check_facts_allowed, check_sku_allowed, require_read
from ..errors import Conflict
from ..openapi import PUBLISH, READ
from ..schemas import HEX64, SKU_NAME, SkuFacts
from ..schemas.verdicts import DEVICE, MAX_PER_REQUEST, Status, VerdictIn, VerdictOut, VerdictsStored
from . import READ_ERRORS, errors

router = APIRouter(prefix="/v1/verdicts", tags=["verdicts"])
Verdicts = Annotated[list[VerdictIn], Body(min_length=1, max_length=MAX_PER_REQUEST)]


@router.post("", response_model=VerdictsStored, status_code=status.HTTP_201_CREATED,
             responses={200: {"model": VerdictsStored, "description": "Nothing stored: each verdict, or a newer one "
                                                                      "of its kernel and device class, was held"},
                        **errors(400, 401, 403, 409, 413)},
             openapi_extra=PUBLISH)
def publish_verdicts(verdicts: Verdicts, session: SessionDep, store: StoreDep, response: Response,
                     token: PublisherDep) -> VerdictsStored:
    """Store verdicts (Verdict.to_dict() documents, at most 1000 and 1 MiB a request) of kernels the service
    holds: 201 when any was stored, 200 when none was new. Per kernel and device class the newest measurement
    wins (its `when`, or when later the time the server received it), so an older verdict is kept out, not
    refused. The token must be allowed every SKU the verdicts' kernels were published under and every SKU sharing
    their facts (403 otherwise), as certify claims are; 409 when a kernel is not held here (push it first); 422
    for a malformed verdict or an impossible `when` (not a date, before 2020, ahead of the server's clock by more
    than 5 minutes). Nothing is stored unless all are accepted."""
    skus = crud_verdicts.kernel_skus(session, kernel_keys=[v.kernel_key for v in verdicts])
    missing = sorted({v.kernel_key for v in verdicts} - set(skus))
    if missing:
        raise Conflict(f"{len(missing)} verdict(s) name kernels this service does not hold (e.g. {missing[0]}); "
                       "publish those kernels first (`fa4-aot push` sends kernels before their verdicts), then the "
                       "verdicts again")
    for sku in sorted(set(skus.values())):  # SKUs sharing facts share kernel keys: a verdict of one is of all
        check_sku_allowed(token, sku)
        check_facts_allowed(session, token, SkuFacts.model_validate(crud.get_sku(session, name=sku)))
    stored = crud_verdicts.publish(session, verdicts=[v.verdict() for v in verdicts], skus=skus,
                                   actor=crud_tokens.token_label(token), write=store.put_verdicts)
    response.status_code = status.HTTP_201_CREATED if stored else status.HTTP_200_OK
    return VerdictsStored(stored=stored, kept=len(verdicts) - stored)


@router.get("", response_model=list[VerdictOut], responses=errors(*READ_ERRORS),
            dependencies=[Depends(require_read)], openapi_extra=READ)
def list_verdicts(session: SessionDep,
                  sku: Annotated[str | None, Query(pattern=SKU_NAME, max_length=64)] = None,
                  kernel_key: Annotated[str | None, Query(pattern=HEX64)] = None,
                  device: Annotated[str | None, Query(pattern=DEVICE, max_length=160)] = None,
                  status: Status | None = None,
                  offset: Annotated[int, Query(ge=0, lt=1 << 31)] = 0,
                  limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> list[VerdictOut]:
    """Verdicts in (kernel key, device class) order, those of kernels of one `sku`, one `kernel_key`, one `device`
    class or one `status` when given, `limit` (at most 1000) from `offset`."""
    rows = crud_verdicts.list_verdicts(session, sku=sku, kernel_key=kernel_key, device=device, status=status,
                                       offset=offset, limit=limit)
    return [crud_verdicts.out(row) for row in rows]
