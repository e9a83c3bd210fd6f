"""Liveness and database reachability."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from ..deps import SessionDep
from ..schemas import Health

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, responses={503: {"model": Health, "description": "Database down"}})
def healthz(session: SessionDep) -> Health | JSONResponse:
    """200 {"status": "ok", "db": "ok"} when the database answers; 503 naming the database error otherwise."""
    try:
        session.execute(text("SELECT 1"))
    except SQLAlchemyError as e:
        return JSONResponse({"status": "error", "db": type(e).__name__}, status_code=503)
    return Health(status="ok", db="ok")
