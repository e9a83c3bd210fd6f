"""Errors the service maps to HTTP statuses: each carries its status code and a message that says the fix."""

from __future__ import annotations

from fa4_aot.errors import Fa4AotError


class ServiceError(Fa4AotError):
    """Root of the service's request errors; `status_code` and `headers` become the HTTP response."""

    status_code = 400

    def __init__(self, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.headers = headers or {}


class NotFound(ServiceError, LookupError):
    status_code = 404


class Forbidden(ServiceError):
    """The request's token may not do this (e.g. finish a job another token claimed)."""

    status_code = 403


class Conflict(ServiceError):
    """The request contradicts what the service holds (missing object, different SKU facts)."""

    status_code = 409


class TooLarge(ServiceError):
    status_code = 413


class TooMany(ServiceError):
    """A bounded collection (misses of a SKU, manifests of a signing key) is full."""

    status_code = 429


class RangeNotSatisfiable(ServiceError):
    status_code = 416


class DigestMismatch(ServiceError):
    """Uploaded bytes do not hash to the digest they were sent under; nothing was stored."""

    status_code = 422


class InvalidBody(ServiceError):
    """A well-formed request whose body fails the service's checks (e.g. not a signed manifest)."""

    status_code = 422


class InvalidInput(Fa4AotError, ValueError):
    """An argument of a library call (not an HTTP request) is malformed; the message names the allowed values."""


class TokenNotFound(Fa4AotError, LookupError):
    """No active token has the given name (raised by crud_tokens.revoke_token and crud_tokens.rotate_token)."""


class Busy(ServiceError):
    """The server already sends as much as it allows at once; the client retries after Retry-After."""

    status_code = 503
