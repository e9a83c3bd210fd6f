"""Misses and the build jobs that answer them: the one shape a miss has from the client that lacked a kernel to the
builder that makes it.

A `Miss` is what a client reports: the store keeps it as misses/<key>.json, POST /v1/misses carries it, the server
keeps it as a row and in a build job. A `BuildJob` is the server's job for one (SKU, missed key), as GET
/v1/builds/<id> and POST /v1/build-claims answer it; `job.miss` is what its builder builds. Each is parsed once
from its JSON document (`from_dict`: ValueError naming the field and what it must be) and written back with the
same field names (`to_dict`), so older clients and servers read what newer ones write, and the reverse.

A miss's key is its `kernel_key`: a kernel miss names its kernel's key (kernel_keys.kernel_key); a lean miss
(family LEAN_FAMILY) names a call, not a kernel, and is keyed by `lean_key`, which the server recomputes from the
call it carries. Pure: no I/O, no clock but `when`'s default."""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .calls import Call
from .kernel_keys import dumps

LEAN_FAMILY = "recipe"  # the family of a lean call's miss: it names a call, not a kernel
STATUSES = ("queued", "running", "done", "failed", "rejected")
FINAL = ("done", "failed", "rejected")
TIMES = ("created", "started", "finished", "lease_until", "not_before")  # a build job's, ISO 8601 strings
_HEX64 = re.compile(r"[0-9a-f]{64}")


def lean_key(call: dict[str, Any], sku: str) -> str:
    """The miss key of a lean call (Call.to_dict()) on a SKU: sha256 of their canonical JSON. The lean runtime
    reports its misses under it, and the service refuses a report whose key is not its call's, so both use this."""
    return hashlib.sha256(dumps({"lean_call": call, "sku": sku}).encode()).hexdigest()


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass(frozen=True)
class Miss:
    """A kernel (or, family LEAN_FAMILY, a lean call) a client needed and lacked."""

    kernel_key: str
    family: str
    compile_key: Any
    sku: str
    call: dict[str, Any] | None = None  # the Call that needed it, when the client could tell (calls.capture)
    args: dict[str, Any] | None = None  # its exact FA4 arguments (domain/exact.py): what `build --from-misses` replays
    when: str = field(default_factory=_now)  # when the client missed it (UTC); "" when the document had none

    @classmethod
    def lean(cls, call: Call, sku: str) -> Miss:
        """The miss of a lean call on `sku`: keyed by lean_key, its compile key and call both the call."""
        doc = call.to_dict()
        return cls(kernel_key=lean_key(doc, sku), family=LEAN_FAMILY, compile_key=doc, sku=sku, call=call.to_dict())

    @property
    def is_lean(self) -> bool:
        return self.family == LEAN_FAMILY

    def parsed_call(self) -> Call | None:
        """Its Call, or None when it carries none or one this fa4-aot cannot read (a server holds other clients')."""
        if not self.call:
            return None
        try:
            return Call.from_dict(self.call)
        except (TypeError, KeyError, ValueError):
            return None

    def to_dict(self) -> dict[str, Any]:
        """The JSON document (the field names every version reads); from_dict's inverse."""
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: Any) -> Miss:
        """The miss in a JSON document (a store's misses/ file, a report, an item of GET /v1/misses, whose other
        fields such as `count` are dropped). ValueError naming the field when one is missing or of another type."""
        what = "miss"  # the name errors give it
        _check_object(doc, what)
        return cls(kernel_key=_key(doc, what), family=_text(doc, "family", what),
                   compile_key=_field(doc, "compile_key", what), sku=_text(doc, "sku", what),
                   call=_object(doc, "call", what), args=_object(doc, "args", what),
                   when=_text(doc, "when", what, default="", empty=True))


@dataclass(frozen=True)
class BuildJob:
    """A build job of the server (service/routes/builds.py): one per SKU and missed key. `compile_key` and `args`
    are only in a claim's answer, `claim` only in the answers to the builder that claimed it; the times are the
    server's ISO 8601 strings, None until they happen."""

    id: int
    sku: str
    kernel_key: str
    family: str
    status: str
    reports: int = 0
    attempts: int = 0
    builder: str = ""
    detail: str = ""
    compile_seconds: float = 0.0
    built: int = 0
    call: dict[str, Any] | None = None
    compile_key: Any = None
    args: dict[str, Any] | None = None
    claim: str | None = None
    created: str | None = None
    started: str | None = None
    finished: str | None = None
    lease_until: str | None = None
    not_before: str | None = None

    @property
    def ended(self) -> bool:
        return self.status in FINAL

    @property
    def miss(self) -> Miss:
        """The miss this job builds (what `build --from-misses` reads)."""
        return Miss(kernel_key=self.kernel_key, family=self.family, compile_key=self.compile_key, sku=self.sku,
                    call=self.call, args=self.args, when=self.created or "")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: Any, claimed: bool = False) -> BuildJob:
        """The job in a JSON document (fields this version does not know are dropped). With `claimed`, the answer
        to a claim: it must also hold `claim` and `compile_key`, what its builder renews, finishes and builds.
        ValueError naming the field when one is missing or of another type."""
        what = "claimed build job" if claimed else "build job"
        _check_object(doc, what)
        job = cls(id=_count(doc, "id", what), sku=_text(doc, "sku", what), kernel_key=_key(doc, what),
                  family=_text(doc, "family", what), status=_text(doc, "status", what),
                  reports=_count(doc, "reports", what, 0), attempts=_count(doc, "attempts", what, 0),
                  builder=_text(doc, "builder", what, default="", empty=True),
                  detail=_text(doc, "detail", what, default="", empty=True),
                  compile_seconds=_seconds(doc, what), built=_count(doc, "built", what, 0),
                  call=_object(doc, "call", what), compile_key=doc.get("compile_key"),
                  args=_object(doc, "args", what), claim=_text(doc, "claim", what, default=None),
                  **{name: _text(doc, name, what, default=None) for name in TIMES})
        if claimed:  # checked after the fields every job has, so that a wrong id is named before a missing claim
            _text(doc, "claim", what)
            _field(doc, "compile_key", what)
        return job


BUILD_JOB_FIELDS = tuple(f.name for f in fields(BuildJob))
MISS_FIELDS = tuple(f.name for f in fields(Miss))


def _short(value: Any) -> str:
    try:
        return json.dumps(value)[:80]
    except (TypeError, ValueError, RecursionError):
        return repr(value)[:80]


def _check_object(doc: Any, what: str) -> None:
    if not isinstance(doc, dict):
        raise ValueError(f"invalid {what} {_short(doc)}: expected a JSON object with the fields of "
                         "fa4_aot.domain.misses")


def _field(doc: dict[str, Any], name: str, what: str) -> Any:
    if name not in doc:
        raise ValueError(f"invalid {what}: field {name!r} is missing (a document of another fa4-aot version? "
                         f"it has {', '.join(sorted(map(str, doc)))[:200] or 'no fields'})")
    return doc[name]


_MISSING = object()


def _text(doc: dict[str, Any], name: str, what: str, default: Any = _MISSING, empty: bool = False) -> Any:
    """doc[name] when it is a string (non-empty unless `empty`); `default` when absent or null, if one is given."""
    value = doc.get(name)
    if value is None and default is not _MISSING:
        return default
    value = _field(doc, name, what)
    if not isinstance(value, str) or not (value or empty):
        raise ValueError(f"invalid {what}: {name} {_short(value)} is not a non-empty string")
    return value


def _key(doc: dict[str, Any], what: str) -> str:
    value = _field(doc, "kernel_key", what)
    if not isinstance(value, str) or not _HEX64.fullmatch(value):
        raise ValueError(f"invalid {what}: kernel_key {_short(value)} is not 64 lowercase hex digits")
    return value


def _object(doc: dict[str, Any], name: str, what: str) -> dict[str, Any] | None:
    value = doc.get(name)
    if value is not None and not isinstance(value, dict):
        raise ValueError(f"invalid {what}: {name} {_short(value)} is not a JSON object or null")
    return value


def _count(doc: dict[str, Any], name: str, what: str, default: int | None = None) -> int:
    value = doc.get(name, default) if default is not None else _field(doc, name, what)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 31:
        raise ValueError(f"invalid {what}: {name} {_short(value)} is not a whole number from 0 to 2**31")
    return value


def _seconds(doc: dict[str, Any], what: str) -> float:
    value = doc.get("compile_seconds", 0.0)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < float("inf"):
        raise ValueError(f"invalid {what}: compile_seconds {_short(value)} is not a number of seconds")
    return float(value)
