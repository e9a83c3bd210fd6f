"""The OpenAPI document and what is derived from it: reads marked open when no read token is required,
and 405 responses whose Allow header lists every documented method of the path."""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

SCOPE_KEY = "x-fa4-aot-scope"
READ: dict[str, Any] = {SCOPE_KEY: "read"}  # openapi_extra of routes behind deps.require_read
PUBLISH: dict[str, Any] = {SCOPE_KEY: "publish"}  # openapi_extra of routes behind deps.require_publish
ADMIN: dict[str, Any] = {SCOPE_KEY: "admin"}  # openapi_extra of routes behind deps.require_admin


def builder(app: FastAPI) -> Callable[[], dict[str, Any]]:
    """app.openapi replacement: FastAPI's document, with the bearer token optional (`security: [{}, ...]`)
    on read operations when the app's settings let anyone read."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        schema = build()
        if not app.state.settings.require_read_token:
            for path_item in schema.get("paths", {}).values():
                for operation in path_item.values():
                    if operation.get(SCOPE_KEY) == "read":
                        operation["security"] = [{}, *[s for s in operation.get("security", []) if s]]
        return schema

    return openapi


@lru_cache(maxsize=256)
def _template_regex(template: str) -> re.Pattern[str]:
    return re.compile(re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template)))


async def method_not_allowed(request: Request, _exc: Exception) -> Response:
    """405 naming every method the path supports (Starlette's Allow names only the first matching route's)."""
    paths = request.app.openapi().get("paths", {})
    allowed = sorted({method.upper() for template, item in paths.items()
                      if _template_regex(template).fullmatch(request.scope["path"]) for method in item})
    return JSONResponse({"detail": f"{request.method} is not allowed here; use {', '.join(allowed)}"},
                        status_code=405, headers={"Allow": ", ".join(allowed)})
