"""Database operations, keyword-only. They raise service.errors (mapped to HTTP statuses) and commit their own
writes; reads never raise for a missing row (they return None or an empty list)."""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from fa4_aot.store import Entry

from . import models, schemas
from .errors import Conflict, InvalidInput, TokenNotFound
from .models import utcnow

T = TypeVar("T")
SCOPES = ("read", "publish", "admin")
TOKEN_PREFIX = "fa4_"


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def retrying(session: Session, work: Callable[[], T], attempts: int = 3) -> T:
    """Run check-then-insert `work` and commit; a concurrent insert of the same key (IntegrityError) makes it
    roll back and re-check, so racing writers of identical content both succeed."""
    for attempt in range(attempts):
        try:
            result = work()
            session.commit()
            return result
        except IntegrityError:
            session.rollback()
            if attempt == attempts - 1:
                raise
        except BaseException:
            session.rollback()
            raise
    raise AssertionError("unreachable")


# -- tokens ---------------------------------------------------------------------------------------
def hash_token(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode()).hexdigest()


def create_token(session: Session, *, name: str, scope: str) -> str:
    """Create a token and return its plaintext, which is shown only here: the database keeps its sha256.

    `scope` is read (GET/HEAD, misses), publish (also PUT objects, POST kernels) or admin (everything);
    `name` is a label (may be empty, at most 128 characters) that revoke_token selects by. Raises InvalidInput.
    """
    if scope not in SCOPES:
        raise InvalidInput(f"invalid token scope {scope!r}: expected one of {', '.join(SCOPES)}")
    if len(name) > 128:
        raise InvalidInput(f"invalid token name {name[:20]!r}...: expected at most 128 characters")
    plaintext = TOKEN_PREFIX + secrets.token_urlsafe(32)
    session.add(models.Token(name=name, token_hash=hash_token(plaintext), scope=scope, created=utcnow()))
    session.commit()
    return plaintext


def revoke_token(session: Session, *, name: str) -> int:
    """Revoke every active token called `name`; returns how many. Raises TokenNotFound if none is active."""
    tokens = session.scalars(select(models.Token).where(models.Token.name == name, ~models.Token.revoked)).all()
    if not tokens:
        raise TokenNotFound(f"no active token named {name!r}; list tokens with `fa4-aot token list`")
    for token in tokens:
        token.revoked = True
    session.commit()
    return len(tokens)


def find_token(session: Session, *, plaintext: str) -> models.Token | None:
    """The token whose sha256 matches `plaintext` (revoked or not), or None."""
    return session.scalar(select(models.Token).where(models.Token.token_hash == hash_token(plaintext)))


# -- objects --------------------------------------------------------------------------------------
def get_object(session: Session, *, digest: str) -> models.Object | None:
    return session.get(models.Object, digest)


def record_object(session: Session, *, digest: str, size: int) -> bool:
    """Record a verified object (its bytes must already be in the store). Returns True if the row is new."""

    def work() -> bool:
        row = session.get(models.Object, digest)
        if row is not None:
            row.size = size
            return False
        session.add(models.Object(digest=digest, size=size, created=utcnow()))
        session.flush()
        return True

    return retrying(session, work)


# -- SKUs and kernels -----------------------------------------------------------------------------
def list_skus(session: Session) -> list[schemas.SkuSummary]:
    count = func.count(models.Kernel.kernel_key)
    rows = session.execute(
        select(models.Sku, count).outerjoin(models.Kernel, models.Kernel.sku == models.Sku.name)
        .group_by(models.Sku.name).order_by(models.Sku.name)
    ).all()
    return [schemas.SkuSummary(**schemas.SkuFacts.model_validate(sku).model_dump(), kernels=n) for sku, n in rows]


def get_sku(session: Session, *, name: str) -> models.Sku | None:
    return session.get(models.Sku, name)


def manifest(session: Session, *, sku: models.Sku) -> schemas.Manifest:
    rows = session.execute(
        select(models.Kernel.kernel_key, models.Kernel.object_digest, models.Object.size, models.Kernel.family)
        .join(models.Object, models.Object.digest == models.Kernel.object_digest)
        .where(models.Kernel.sku == sku.name).order_by(models.Kernel.kernel_key)
    ).all()
    kernels = [schemas.ManifestKernel(kernel_key=k, object_digest=d, size=s, family=f) for k, d, s, f in rows]
    return schemas.Manifest(sku=schemas.SkuFacts.model_validate(sku), kernels=kernels)


def get_kernel(session: Session, *, kernel_key: str) -> schemas.KernelOut | None:
    """The kernel's metadata with its SKU's facts and object size (all Entry fields), or None."""
    row = session.execute(
        select(models.Kernel, models.Sku, models.Object.size)
        .join(models.Sku, models.Sku.name == models.Kernel.sku)
        .join(models.Object, models.Object.digest == models.Kernel.object_digest)
        .where(models.Kernel.kernel_key == kernel_key)
    ).first()
    if row is None:
        return None
    kernel, sku, size = row
    return schemas.KernelOut(
        kernel_key=kernel.kernel_key, object_digest=kernel.object_digest, size=size, family=kernel.family,
        compile_key=json.loads(kernel.compile_key), sku=sku.name, arch=sku.arch, sm_count=sku.sm_count,
        l2_bytes=sku.l2_bytes, cuda_major=sku.cuda_major, toolchain=json.loads(kernel.toolchain),
        variant=kernel.variant, call=kernel.call, compile_seconds=kernel.compile_seconds,
        hardware_queries=json.loads(kernel.hardware_queries), created=kernel.created,
    )


def ensure_sku(session: Session, *, facts: schemas.SkuFacts) -> models.Sku:
    """The SKU row called facts.name, created if absent. Raises Conflict if it exists with other facts."""
    row = session.get(models.Sku, facts.name)
    if row is None:
        row = models.Sku(**facts.model_dump())
        session.add(row)
        session.flush()
        return row
    held = schemas.SkuFacts.model_validate(row)
    if held != facts:
        raise Conflict(
            f"SKU {facts.name!r} is registered with {_facts_text(held)} but this kernel says {_facts_text(facts)}; "
            "fix the SKU in variants.toml and rebuild, or publish under a new SKU name"
        )
    return row


def sku_facts(kernel: schemas.KernelIn) -> schemas.SkuFacts:
    return schemas.SkuFacts(name=kernel.sku, arch=kernel.arch, sm_count=kernel.sm_count, l2_bytes=kernel.l2_bytes,
                            cuda_major=kernel.cuda_major)


def _facts_text(facts: schemas.SkuFacts) -> str:
    return f"arch={facts.arch} sm_count={facts.sm_count} l2_bytes={facts.l2_bytes} cuda_major={facts.cuda_major}"


def publish_kernel(session: Session, *, kernel: schemas.KernelIn) -> tuple[Entry, bool]:
    """Create or update the kernel row (and its SKU row) and commit. Returns the store entry to write and
    whether the row is new. Raises Conflict if the object is absent, its size differs, or SKU facts clash."""
    created = kernel.created or utcnow().strftime("%Y-%m-%dT%H:%M:%SZ")

    def work() -> tuple[Entry, bool]:
        obj = session.get(models.Object, kernel.object_digest)
        if obj is None:
            raise Conflict(f"object {kernel.object_digest} is not stored; upload it first with "
                           f"PUT /v1/objects/{kernel.object_digest}, then publish the kernel again")
        if obj.size != kernel.size:
            raise Conflict(f"kernel says size {kernel.size} but object {kernel.object_digest} has {obj.size} "
                           "bytes; publish the entry that belongs to this object")
        ensure_sku(session, facts=sku_facts(kernel))
        row = session.get(models.Kernel, kernel.kernel_key)
        is_new = row is None
        if row is None:
            row = models.Kernel(kernel_key=kernel.kernel_key, created=created)
            session.add(row)
        fill_kernel(row, kernel)
        session.flush()
        return _entry(kernel, row.created), is_new

    return retrying(session, work)


def fill_kernel(row: models.Kernel, kernel: schemas.KernelIn) -> None:
    row.object_digest = kernel.object_digest
    row.sku = kernel.sku
    row.family = kernel.family
    row.compile_key = canonical_json(kernel.compile_key)
    row.toolchain = canonical_json(kernel.toolchain)
    row.variant = kernel.variant
    row.call = kernel.call
    row.compile_seconds = kernel.compile_seconds
    row.hardware_queries = canonical_json(kernel.hardware_queries)


def _entry(kernel: schemas.KernelIn, created: str) -> Entry:
    return Entry(**{**kernel.model_dump(), "created": created})


# -- misses ---------------------------------------------------------------------------------------
def record_miss(session: Session, *, miss: schemas.MissIn) -> None:
    """Insert the miss or count one more report of it, atomically (INSERT ... ON CONFLICT DO UPDATE)."""
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    now = utcnow()
    stmt = dialect.insert(models.Miss).values(
        kernel_key=miss.kernel_key, sku=miss.sku, family=miss.family,
        compile_key=canonical_json(miss.compile_key), count=1, first_seen=now, last_seen=now,
        call=None if miss.call is None else canonical_json(miss.call),
    )
    stmt = stmt.on_conflict_do_update(
        index_elements=[models.Miss.kernel_key],
        set_={"count": models.Miss.count + 1, "last_seen": stmt.excluded.last_seen,
              "call": func.coalesce(stmt.excluded.call, models.Miss.call)},
    )
    session.execute(stmt)
    session.commit()


def list_misses(session: Session) -> list[schemas.MissOut]:
    rows = session.scalars(select(models.Miss).order_by(models.Miss.count.desc(), models.Miss.kernel_key)).all()
    return [schemas.MissOut(kernel_key=m.kernel_key, sku=m.sku, family=m.family,
                            compile_key=json.loads(m.compile_key), count=m.count,
                            call=None if m.call is None else json.loads(m.call),
                            first_seen=m.first_seen, last_seen=m.last_seen) for m in rows]


def counts(session: Session) -> dict[str, int]:
    """Row counts for the metrics gauges."""
    return {name: session.scalar(select(func.count()).select_from(model)) or 0
            for name, model in (("objects", models.Object), ("kernels", models.Kernel), ("misses", models.Miss))}
