"""What a server's answers must look like before the client uses them: pure checks that turn a decoded JSON
document into the values http.py works with, or a RemoteError that names the server and what was wrong.

A proxy's login page, a document of another version or a hostile server must end in that one error, never in a
KeyError, TypeError or a size that spins a reader forever."""

from __future__ import annotations

import json
import re
from typing import Any, cast

from ..domain.misses import BuildJob, Miss
from ..domain.verdicts import Verdict
from ..errors import RemoteError, StoreError
from ..store import Entry, check_hex
from ..trust import signing

AGAIN = "is it an fa4-aot server of this version (not a proxy's page)?"
MALFORMED = (KeyError, TypeError, ValueError, AttributeError, StoreError)  # what a document of another shape raises
# The deepest nesting a client parses: an fa4-aot answer nests about 10 deep (a manifest envelope's verdict calls),
# and every later walk of a document (checks, error messages, json.dumps) stays far below the interpreter's
# recursion limit within it.
MAX_DEPTH = 64
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')  # a JSON string, unrolled
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def parsed(data: bytes, source: str) -> Any:
    """The JSON document of `data`, a server's answer that `source` names (method and URL): the one parse of every
    answer a client reads. RemoteError naming `source` when it is not JSON or nests deeper than MAX_DEPTH, never a
    RecursionError (an answer 200,000 deep killed a certifier and a builder) nor a decode error."""
    if _too_deep(data):
        raise RemoteError(f"{source} answered JSON nested deeper than {MAX_DEPTH} levels, which no answer of an "
                          f"fa4-aot server does; nothing of it was used: {AGAIN}")
    try:
        return json.loads(data)
    except RecursionError:  # json's own limit (a deep stack lowers it), for text _too_deep could not pair up
        raise RemoteError(f"{source} answered JSON nested too deep to read; nothing of it was used: {AGAIN}") \
            from None
    except ValueError as e:
        raise RemoteError(f"{source} answered something that is not JSON ({str(e)[:80]}): {AGAIN}") from None


def _too_deep(data: bytes) -> bool:
    """Whether the brackets of `data` outside its strings nest deeper than MAX_DEPTH: innermost pairs removed a level
    at a time, at C speed. The strings are removed (a regular expression over the whole answer) only when the
    brackets with them do not empty within the bound: a string may hold brackets."""
    if _peeled(data.translate(None, _NOT_BRACKETS)):
        return False
    return not _peeled(_STRING.sub(b"", data).translate(None, _NOT_BRACKETS), unbalanced=True)


def _peeled(brackets: bytes, unbalanced: bool = False) -> bool:
    """True when `brackets` empty within MAX_DEPTH passes removing innermost pairs (a pass may take two levels
    where "[]" and "{}" alternate: the bound lies between MAX_DEPTH and twice as many levels); `unbalanced`: what
    to say of brackets that stop pairing up (not JSON, which json.loads then says)."""
    for _level in range(MAX_DEPTH):
        if not brackets:
            return True
        inner = brackets.replace(b"[]", b"").replace(b"{}", b"")
        if inner == brackets:
            return unbalanced
        brackets = inner
    return not brackets


def byte_count(value: Any, what: str) -> int:
    """`value` if it is a size in bytes: an int of at least 0 (not a bool); ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} {value!r} is not a size in bytes")
    return value


def entry_of(doc: Any, source: str) -> Entry:
    """The kernel entry in `doc` (fields the client does not know are dropped); RemoteError naming `source` when
    a field it uses is missing or of another type: digests must be hex, sizes counts of bytes."""
    try:
        entry = Entry(**{k: v for k, v in _of(doc, dict).items() if k in Entry.__dataclass_fields__})
        check_hex(entry.kernel_key, "kernel key")
        check_hex(entry.object_digest)
        byte_count(entry.size, "size")
        for arch in _of(entry.shared_libs, dict):
            for digest, size in entry.lib_digests(arch).items():
                check_hex(digest, f"{arch} library digest")
                if size is not None:
                    byte_count(size, f"{arch} library size")
    except MALFORMED as e:
        raise RemoteError(f"{source} sent something that is not a kernel entry ({e}); {AGAIN}") from None
    return entry


def listing_of(doc: Any, source: str) -> dict[str, Any]:
    """A SKU's kernel listing (GET /v1/skus/<sku>/manifest): `kernels` items with a hex kernel key and a size."""
    try:
        for item in _of(_of(doc, dict)["kernels"], list):
            check_hex(_of(item, dict)["kernel_key"], "kernel key")
            byte_count(item["size"], "size")
    except MALFORMED as e:
        raise RemoteError(f"{source} is not a kernel listing ({type(e).__name__}: {e}); {AGAIN}") from None
    return cast("dict[str, Any]", doc)  # checked above to be a dict


def miss_of(item: Any, source: str) -> Miss:
    """One item of the miss list (GET /v1/misses): a Miss (domain/misses.py; its count and times are dropped)."""
    try:
        return Miss.from_dict(item)
    except (ValueError, RecursionError) as e:
        raise RemoteError(f"{source} listed {_short(item)}, not a miss ({str(e)[:200]}); {AGAIN}") from None


def build_job_of(doc: Any, source: str, claimed: bool = False) -> BuildJob:
    """A build job (GET /v1/builds/<id>, the answer to a miss report); with `claimed`, the answer to a claim, which
    must hold what its builder renews, finishes and builds (BuildJob.from_dict). RemoteError naming `source` and
    the field when it is malformed: never a KeyError or ValueError that would kill a builder or a
    waiting client."""
    try:
        return BuildJob.from_dict(doc, claimed=claimed)
    except (ValueError, RecursionError) as e:
        what = "a claim with something that is not a build job" if claimed else f"{_short(doc)}, not a build job"
        raise RemoteError(f"{source} answered {what} ({str(e)[:200]}); {AGAIN}") from None


def verdict_of(item: Any, source: str) -> Verdict:
    """One item of a verdict listing (GET /v1/verdicts): checked_verdict's verdict, or RemoteError naming `source`."""
    try:
        return checked_verdict(item)
    except MALFORMED as e:
        raise RemoteError(f"{source} listed {_short(item)}, not a verdict ({str(e)[:200]}); {AGAIN}") from None


def checked_verdict(item: Any) -> Verdict:
    """The verdict document `item` from a server (a verdict listing's item, a certify job's verdict) as a Verdict
    whose every field holds: signing.verdict_of, the check a signed listing passes (types included: a count is a
    count, `when` a UTC time). Fields the client does not use (sku, recorded...) are dropped. One of MALFORMED
    otherwise: every place that reads a server's verdict checks it here, then names itself in the error."""
    doc = _of(item, dict)
    listing = {k: v for k, v in doc.items() if k in Verdict.__dataclass_fields__}
    return signing.verdict_of(doc["kernel_key"], doc["device"], listing)


def bundle_head(line: bytes, source: str) -> tuple[list[Entry], list[str], list[tuple[str, int]]]:
    """The first line of a bundle: (entries, keys the server lacks, (digest, size) of each object that follows,
    in order). A size that is not a count of bytes would make the reader read past nothing, forever."""
    try:
        head = _of(parsed(line, source), dict)
        missing = [k for k in _of(head["missing"], list) if isinstance(k, str)]
        objects = [(check_hex(digest), byte_count(size, f"size of object {digest}"))
                   for digest, size in _of(head["objects"], list)]
        entries = _of(head["entries"], list)
    except MALFORMED as e:
        raise RemoteError(f"{source} sent a bundle whose first line is not a bundle head ({type(e).__name__}: "
                          f"{e}); {AGAIN}") from None
    return [entry_of(e, source) for e in entries], missing, objects


def _of(value: Any, kind: type) -> Any:
    if not isinstance(value, kind):
        raise TypeError(f"expected a JSON {'object' if kind is dict else 'list'}, got {json.dumps(value)[:80]}")
    return value


def _short(value: Any) -> str:
    try:
        return json.dumps(value)[:120]
    except (TypeError, ValueError, RecursionError):
        return repr(value)[:120]
