"""A claimed build job as the builder sees it (service/routes/builds.py, POST /v1/build-claims): checked before any
field of it is used, as certify_jobs.py checks certify jobs. A proxy's page, a server of another version or a
hostile one gives one RemoteError naming the server, never a KeyError or ValueError that would kill the builder
(issue 28, D42): its loop logs it, backs off and claims again."""

from __future__ import annotations

from typing import Any

from ..errors import RemoteError
from ..store import check_hex
from .answers import AGAIN, MALFORMED

TASK = ("id", "sku", "kernel_key", "family", "attempts", "claim", "compile_key")  # what a builder reads of a claim


def claimed_of(doc: Any, source: str) -> dict[str, Any]:
    """The claim answer `doc` (a build job with what its builder needs: compile key, call, args and `claim`), as
    the dict the builder runs; RemoteError naming `source` and the field when it is malformed."""
    try:
        if not isinstance(doc, dict):
            raise TypeError(f"expected a JSON object, got {str(doc)[:80]}")
        for name in TASK:  # the first field that is wrong is named
            _check(name, doc[name])
        for name in ("call", "args"):
            if doc.get(name) is not None and not isinstance(doc[name], dict):
                raise TypeError(f"{name} {str(doc[name])[:40]!r} is not a JSON object")
    except (*MALFORMED, RecursionError) as e:
        raise RemoteError(f"{source} answered a claim with something that is not a build job ({type(e).__name__}: "
                          f"{str(e)[:200]}); {AGAIN}") from None
    return doc


def _check(name: str, value: Any) -> None:
    if name in ("id", "attempts"):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 31:
            raise ValueError(f"{name} {str(value)[:40]!r} is not a job id or count")
    elif name == "kernel_key":
        check_hex(value, "kernel key")
    elif name != "compile_key" and (not isinstance(value, str) or not value):
        raise TypeError(f"{name} {str(value)[:40]!r} is not a non-empty string")
