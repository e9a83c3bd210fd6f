"""HTTP routes, one module per resource. `errors(...)` documents error responses in the OpenAPI schema."""

from __future__ import annotations

from typing import Any

from ..schemas import ErrorBody

_DESCRIPTIONS = {
    400: "Malformed id, header or body encoding (digests and keys: 64 lowercase hex; SKU names: [a-z0-9][a-z0-9-]*)",
    401: "Missing bearer token",
    403: "Unknown, revoked or insufficient token (or one limited to other SKUs)",
    404: "Not found",
    409: "Conflicts with what the service holds",
    413: "Body larger than the server's limit (objects: FA4_AOT_MAX_BODY_BYTES; JSON: 1 MiB)",
    416: "Range not satisfiable",
    422: "Body does not match its digest, or fails validation",
    429: "A bounded collection is full (misses of a SKU, manifests of a SKU), or too many anonymous miss reports",
    503: "Busy: the worker sends its limit of bundle bytes at once; retry after Retry-After seconds",
}


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` entries for these error statuses, all with the `{"detail": "..."}` body."""
    return {code: {"model": ErrorBody, "description": _DESCRIPTIONS[code]} for code in codes}


READ_ERRORS = (400, 401, 403)
