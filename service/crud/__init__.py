"""Database operations, keyword-only. They raise service.errors (mapped to HTTP statuses) and commit their own
writes; reads never raise for a missing row (they return None or an empty list)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from fa4_aot.domain.kernel_keys import dumps as canonical_json
from fa4_aot.store import Entry

from .. import models, schemas
from ..errors import Conflict
from ..models import utcnow

T = TypeVar("T")


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


# -- audit ----------------------------------------------------------------------------------------
def record_audit(session: Session, *, actor: str, action: str, target: str, detail: dict[str, Any]) -> None:
    """Add an audit entry to the session's transaction; it commits (or rolls back) with the write it records."""
    session.add(models.AuditEntry(at=utcnow(), actor=actor, action=action, target=target,
                                  detail=canonical_json(detail)))


def list_audit(session: Session, *, after_id: int = 0, limit: int = 100) -> list[schemas.AuditEntry]:
    """Entries with id > after_id, oldest first, at most `limit`."""
    rows = session.scalars(select(models.AuditEntry).where(models.AuditEntry.id > after_id)
                           .order_by(models.AuditEntry.id).limit(limit)).all()
    return [schemas.AuditEntry(id=r.id, at=r.at, actor=r.actor, action=r.action, target=r.target,
                               detail=json.loads(r.detail)) for r in rows]


# -- objects --------------------------------------------------------------------------------------
def get_object(session: Session, *, digest: str) -> models.Object | None:
    return session.get(models.Object, digest)


def record_object(session: Session, *, digest: str, size: int, actor: str) -> bool:
    """Record a verified object (its bytes must already be in the store). Returns True if the row is new;
    only a new row is audited (as `actor`)."""

    def work() -> bool:
        row = session.get(models.Object, digest)
        if row is not None:
            row.size = size
            return False
        session.add(models.Object(digest=digest, size=size, created=utcnow()))
        record_audit(session, actor=actor, action="object.create", target=digest, detail={"size": size})
        session.flush()
        return True

    return retrying(session, work)


# -- SKUs and kernels -----------------------------------------------------------------------------
def list_skus(session: Session) -> list[schemas.SkuSummary]:
    # kernels as every command counts them (fa4_aot.store.kernels: entries that are not signposts). A kernel that
    # consumed SKU constants has two rows, its full key and its base key's signpost, equal in every column but the
    # key; two kernels may share an object but not their compile key, toolchain and object all at once
    kernel = models.Kernel
    count = func.count(func.distinct(kernel.object_digest + " " + kernel.compile_key + " " + kernel.toolchain))
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
    found = get_kernels(session, kernel_keys=[kernel_key])
    return found[0] if found else None


def get_kernels(session: Session, *, kernel_keys: list[str]) -> list[schemas.KernelOut]:
    """get_kernel() for many keys in one query, in the order of `kernel_keys`; keys it lacks are left out."""
    rows = session.execute(
        select(models.Kernel, models.Sku, models.Object.size)
        .join(models.Sku, models.Sku.name == models.Kernel.sku)
        .join(models.Object, models.Object.digest == models.Kernel.object_digest)
        .where(models.Kernel.kernel_key.in_(set(kernel_keys)))
    ).all()
    by_key = {kernel.kernel_key: _kernel_out(kernel, sku, size) for kernel, sku, size in rows}
    return [by_key[k] for k in dict.fromkeys(kernel_keys) if k in by_key]


def _kernel_out(kernel: models.Kernel, sku: models.Sku, size: int) -> schemas.KernelOut:
    return schemas.KernelOut(
        kernel_key=kernel.kernel_key, object_digest=kernel.object_digest, size=size, family=kernel.family,
        compile_key=json.loads(kernel.compile_key), sku=sku.name, arch=sku.arch, sm_count=sku.sm_count,
        l2_bytes=sku.l2_bytes, cuda_major=sku.cuda_major, host=sku.host, toolchain=json.loads(kernel.toolchain),
        variant=kernel.variant, call=kernel.call, compile_seconds=kernel.compile_seconds,
        hardware_queries=json.loads(kernel.hardware_queries), shared_libs=json.loads(kernel.shared_libs or "{}"),
        created=kernel.created,
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


def skus_with_facts(session: Session, *, facts: schemas.SkuFacts) -> list[str]:
    """Names of the SKU rows with these facts (whatever facts.name is): they share kernel and recipe keys."""
    return list(session.scalars(select(models.Sku.name).where(
        models.Sku.arch == facts.arch, models.Sku.sm_count == facts.sm_count, models.Sku.l2_bytes == facts.l2_bytes,
        models.Sku.cuda_major == facts.cuda_major, models.Sku.host == facts.host).order_by(models.Sku.name)))


def sku_facts(kernel: schemas.KernelIn) -> schemas.SkuFacts:
    return schemas.SkuFacts(name=kernel.sku, arch=kernel.arch, sm_count=kernel.sm_count, l2_bytes=kernel.l2_bytes,
                            cuda_major=kernel.cuda_major, host=kernel.host)


def _facts_text(facts: schemas.SkuFacts) -> str:
    return (f"arch={facts.arch} sm_count={facts.sm_count} l2_bytes={facts.l2_bytes} cuda_major={facts.cuda_major} "
            f"host={facts.host or '(none)'}")


def publish_kernel(session: Session, *, kernel: schemas.KernelIn, actor: str,
                   write: Callable[[Entry, bool], None]) -> tuple[Entry, bool]:
    """Create the kernel row (and its SKU row) in one transaction: `write(entry, is_new)` runs after the rows
    are flushed and before the commit (the store's index entry goes there), so a failed write rolls the rows
    back. Returns the entry and whether the row is new. A kernel key is immutable once published: the same
    key with the same object and SKU is an idempotent re-publish (the row is kept as it is), anything else a
    Conflict. Also Conflict if the object is absent, its size differs, or SKU facts clash."""
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
        _check_libraries(session, kernel)
        row = session.get(models.Kernel, kernel.kernel_key)
        if row is not None:
            _check_same_kernel(row, kernel)
            added = _add_libraries(row, kernel)
            if added:
                record_audit(session, actor=actor, action="kernel.libraries", target=kernel.kernel_key,
                             detail={"added": added})
                session.flush()
            held = get_kernel(session, kernel_key=kernel.kernel_key)
            entry = _entry(kernel, row.created) if held is None else Entry(**held.model_dump())
            write(entry, bool(added))
            return entry, False
        row = models.Kernel(kernel_key=kernel.kernel_key, created=created)
        session.add(row)
        fill_kernel(row, kernel)
        record_audit(session, actor=actor, action="kernel.create", target=kernel.kernel_key,
                     detail={"sku": kernel.sku, "object_digest": kernel.object_digest})
        session.flush()
        entry = _entry(kernel, created)
        write(entry, True)
        return entry, True

    return retrying(session, work)


def _check_same_kernel(row: models.Kernel, kernel: schemas.KernelIn) -> None:
    if row.object_digest != kernel.object_digest or row.sku != kernel.sku:
        raise Conflict(
            f"kernel {kernel.kernel_key} is already published with object {row.object_digest} for SKU "
            f"{row.sku!r}; a kernel key is immutable once published, so this entry (object "
            f"{kernel.object_digest}, SKU {kernel.sku!r}) is refused: rebuild with the published toolchain, or "
            "check the build host for a non-deterministic export")


def _check_libraries(session: Session, kernel: schemas.KernelIn) -> None:
    """Conflict unless every library the entry names, and every runtime library they need, is a stored object
    (a library also with the entry's size): uploaded first, as the kernel's own object is."""
    for arch, lib in sorted(kernel.shared_libs.items()):
        wanted = {lib.digest: lib.size, **{d: None for d in lib.needs.values() if d}}
        for digest, size in wanted.items():
            obj = session.get(models.Object, digest)
            if obj is None or (size is not None and obj.size != size):
                raise Conflict(f"the {arch} library of kernel {kernel.kernel_key} names object {digest}, which is "
                               f"not stored{'' if obj is None else f' with {size} bytes'}; upload it first with "
                               f"PUT /v1/objects/{digest} (`fa4-aot push` does), then publish the kernel again")


def _add_libraries(row: models.Kernel, kernel: schemas.KernelIn) -> list[str]:
    """Add the entry's libraries for host arches the row lacks; returns those arches. Conflict when the entry
    names another library for an arch the row has: a published library is immutable, like the object."""
    held = json.loads(row.shared_libs or "{}")
    for arch, lib in kernel.shared_libs.items():
        if arch in held and held[arch] != lib.model_dump():
            raise Conflict(
                f"kernel {kernel.kernel_key} is already published with {arch} library {held[arch]['digest']} "
                f"(needs {canonical_json(held[arch]['needs'])}); a published library is immutable, so this one "
                f"({lib.digest}) is refused: relink with the published toolchain, or publish under a new build")
    added = sorted(set(kernel.shared_libs) - set(held))
    if added:
        row.shared_libs = canonical_json({**held, **{a: kernel.shared_libs[a].model_dump() for a in added}})
    return added


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
    row.shared_libs = canonical_json({a: lib.model_dump() for a, lib in kernel.shared_libs.items()})


def _entry(kernel: schemas.KernelIn, created: str) -> Entry:
    return Entry(**{**kernel.model_dump(), "created": created})


def counts(session: Session) -> dict[str, int]:
    """Row counts for the metrics gauges (not the audit log, which only grows and would make scrapes slow)."""
    tables = (("objects", models.Object), ("kernels", models.Kernel), ("misses", models.Miss),
              ("signed_manifests", models.SignedManifest), ("revocations", models.Revocation))
    return {name: session.scalar(select(func.count()).select_from(model)) or 0 for name, model in tables}
