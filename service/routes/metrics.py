"""Prometheus scrape endpoint."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .. import crud
from ..crud import builds as crud_builds
from ..crud import certify as crud_certify
from ..crud import verdicts as crud_verdicts
from ..deps import SessionDep, require_read
from ..openapi import READ

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response,
            responses={200: {"description": "Prometheus text format", "content": {"text/plain": {}}}},
            dependencies=[Depends(require_read)], openapi_extra=READ)
def metrics(request: Request, session: SessionDep) -> Response:
    """Request counters, bytes sent, latency histogram, and gauges of objects, kernels, misses, signed
    manifests, revocations, build jobs and certify jobs by status and certification verdicts by status;
    histograms of build jobs' compile seconds and seconds from miss to publish, and of certify jobs' seconds.
    Needs a read token when reads do (FA4_AOT_REQUIRE_READ_TOKEN)."""
    collected = request.app.state.metrics
    collected.set_counts(crud.counts(session))
    collected.set_builds(crud_builds.depth(session))
    collected.set_certify(crud_certify.depth(session))
    collected.set_verdicts(crud_verdicts.by_status(session))
    return Response(generate_latest(collected.registry), media_type=CONTENT_TYPE_LATEST)
