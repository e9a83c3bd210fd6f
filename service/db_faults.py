"""What a request answers when its database fails under it, rather than a bare 500: a SQLite lock
held past the busy timeout, a full disk or a lost connection is 503 with Retry-After (nothing was written: the
request's session rolls back when it closes, so the caller retries it as it was); text the database cannot store
(NUL on PostgreSQL) is 422 naming it. Anything else is a server fault: logged, 500."""

from __future__ import annotations

import logging

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from sqlalchemy.exc import DataError, DBAPIError, OperationalError

log = logging.getLogger("service.db_faults")
RETRY_AFTER = "5"  # seconds: a lock is usually released, or space freed, within a few
_TRANSIENT = ("locked", "busy", "disk", "space", "full", "connection", "timeout", "could not extend")


def classify(exc: Exception) -> tuple[int, str]:
    """Pure: (status, message) for a database error; 500 when it is none that a caller can fix or wait out."""
    text = str(getattr(exc, "orig", None) or exc).splitlines()[0][:300]
    if isinstance(exc, DataError) or "NUL" in text or "0x00" in text:
        return 422, (f"the database refused a value of this request ({text}): text must be valid UTF-8 without NUL "
                     "characters; send it without them")
    if isinstance(exc, OperationalError) or (isinstance(exc, DBAPIError) and exc.connection_invalidated) or any(
            word in text.lower() for word in _TRANSIENT):
        return 503, (f"the server's database is busy or out of space ({text}); nothing was changed: retry after "
                     f"{RETRY_AFTER} s (an operator: check the database's disk and long-running writers)")
    return 500, "internal error of the server's database; see the server's log"


async def answer(_request: Request, exc: Exception) -> Response:
    status, message = classify(exc)
    if status < 500:
        log.warning("database error (answered %d): %s", status, exc)
    else:
        log.error("database error", exc_info=exc)
    headers = {"Retry-After": RETRY_AFTER} if status == 503 else None
    return JSONResponse({"detail": message}, status_code=status, headers=headers)
