"""SQLAlchemy 2 ORM models: metadata and digests only; object bytes live in the store on disk.

JSON-valued columns (compile_key, toolchain, hardware_queries, token SKU lists, signed envelopes, audit details)
hold canonical JSON text, so the same schema works on SQLite and PostgreSQL and values round-trip exactly.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


def utcnow() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


class UtcDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC datetime on every backend (SQLite drops the zone; this puts it back)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: pass a timezone-aware UTC datetime")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    pass


class Object(Base):
    """A stored object: the row exists only once its bytes are complete and verified on disk."""

    __tablename__ = "objects"

    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    created: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)


class Sku(Base):
    """A GPU SKU's target facts; a kernel's facts must agree with its SKU row."""

    __tablename__ = "skus"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    arch: Mapped[str] = mapped_column(String(32))
    sm_count: Mapped[int] = mapped_column(Integer)
    l2_bytes: Mapped[int] = mapped_column(BigInteger)
    cuda_major: Mapped[int] = mapped_column(Integer)
    # the host target (fa4_aot/domain/hosts.py) of its kernels' host code; "" for SKUs published before host targets
    host: Mapped[str] = mapped_column(String(32), default="", server_default="")


class Kernel(Base):
    """One index entry of the store: which object holds the kernel for `kernel_key`, and how it was made."""

    __tablename__ = "kernels"

    kernel_key: Mapped[str] = mapped_column(String(64), primary_key=True)
    object_digest: Mapped[str] = mapped_column(ForeignKey("objects.digest"), index=True)
    sku: Mapped[str] = mapped_column(ForeignKey("skus.name"), index=True)
    family: Mapped[str] = mapped_column(String(128))
    compile_key: Mapped[str] = mapped_column(Text)
    toolchain: Mapped[str] = mapped_column(Text)
    variant: Mapped[str] = mapped_column(Text)
    call: Mapped[str] = mapped_column(Text)
    compile_seconds: Mapped[float] = mapped_column(Float)
    hardware_queries: Mapped[str] = mapped_column(Text)
    # JSON {host arch: {digest, size, needs}} of the lean runtime's linked libraries; NULL for none (older rows)
    shared_libs: Mapped[str | None] = mapped_column(Text, nullable=True)
    # The entry's own timestamp, verbatim (e.g. 2025-01-31T12:00:00Z), so entries round-trip exactly.
    created: Mapped[str] = mapped_column(String(40))


class Recipe(Base):
    """A lean-runtime recipe file (fa4_aot.store.recipes): bytes in the store's recipes/, named by recipe key.
    Its key hashes the regions' signature with the target facts it was published under (`target`, canonical
    JSON of the SKU's facts): SKUs with equal facts share it. Newest wins: a publish replaces the file."""

    __tablename__ = "recipes"

    recipe_key: Mapped[str] = mapped_column(String(64), primary_key=True)
    target: Mapped[str] = mapped_column(String(255), index=True)
    digest: Mapped[str] = mapped_column(String(64))
    size: Mapped[int] = mapped_column(BigInteger)
    updated: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)


class Token(Base):
    """An API token. Only the sha256 of the plaintext is stored."""

    __tablename__ = "tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(128))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    scope: Mapped[str] = mapped_column(String(16))
    created: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    revoked: Mapped[bool] = mapped_column(Boolean, default=False)
    # JSON list of the SKU names a publish token may publish to; NULL means every SKU.
    skus: Mapped[str | None] = mapped_column(Text, nullable=True)


class Miss(Base):
    """A kernel that clients needed and the store lacked, with how often it was reported."""

    __tablename__ = "misses"

    kernel_key: Mapped[str] = mapped_column(String(64), primary_key=True)
    sku: Mapped[str] = mapped_column(String(64), index=True)
    family: Mapped[str] = mapped_column(String(128))
    compile_key: Mapped[str] = mapped_column(Text)
    # JSON of the call that needed the kernel (fa4_aot.domain.calls), when the client could describe it: what
    # `fa4-aot build --from-misses` plans from. The latest described call wins.
    call: Mapped[str | None] = mapped_column(Text, nullable=True)
    # canonical JSON of the exact FA4 arguments of that call (fa4_aot.domain.exact), which `build --from-misses`
    # replays; NULL for older clients. The first record wins, like `call`.
    args: Mapped[str | None] = mapped_column(Text, nullable=True)
    count: Mapped[int] = mapped_column(Integer, default=1)
    first_seen: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    last_seen: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)


class SignedManifest(Base):
    """A signed SKU manifest envelope (fa4_aot.trust.signing), stored verbatim as canonical JSON. The service checks
    its shape and that it matches what the service holds; clients verify the signature."""

    __tablename__ = "signed_manifests"

    manifest_id: Mapped[str] = mapped_column(String(64), primary_key=True)  # sha256 of the manifest's canonical JSON
    sku: Mapped[str] = mapped_column(ForeignKey("skus.name"), index=True)
    key_id: Mapped[str] = mapped_column(String(64))
    # The manifest's own timestamps, verbatim (e.g. 2026-11-30T12:00:00Z).
    created: Mapped[str] = mapped_column(String(40))
    expires: Mapped[str] = mapped_column(String(40))
    envelope: Mapped[str] = mapped_column(Text)
    uploaded_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)


class Revocation(Base):
    """A revoked signing key (16 hex key id) or manifest (64 hex manifest id); clients refuse what it names."""

    __tablename__ = "revocations"
    __table_args__ = (UniqueConstraint("kind", "ident", name="uq_revocations_kind_ident"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(16))  # "key" or "manifest"
    ident: Mapped[str] = mapped_column(String(64))
    reason: Mapped[str] = mapped_column(Text)
    created: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)


class AuditEntry(Base):
    """One successful write: who (a token's name, or "cli" for token administration), what, on which target."""

    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    actor: Mapped[str] = mapped_column(String(128))
    action: Mapped[str] = mapped_column(String(32))
    target: Mapped[str] = mapped_column(String(255))
    detail: Mapped[str] = mapped_column(Text)


class BuildJob(Base):
    """A build the service asks for (fa4_aot/compile/builder.py runs it): one per (SKU, missed key), so that any number
    of clients missing one kernel, or one lean region, cause one compile. `kernel_key` is the miss's key: a
    kernel's, or for a lean miss the key of its call (fa4_aot/domain/misses.py). A builder claims a job with a lease
    it renews while it works; a job whose lease ran out (its builder died) is claimed again."""

    __tablename__ = "build_jobs"
    # ids are never reused (SQLite: AUTOINCREMENT), so a client following job N never follows another job
    __table_args__ = (UniqueConstraint("sku", "kernel_key", name="uq_build_jobs_sku_key"),
                      {"sqlite_autoincrement": True})

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    sku: Mapped[str] = mapped_column(String(64))
    kernel_key: Mapped[str] = mapped_column(String(64))
    family: Mapped[str] = mapped_column(String(128))
    compile_key: Mapped[str] = mapped_column(Text)
    call: Mapped[str | None] = mapped_column(Text, nullable=True)  # canonical JSON, as Miss.call
    args: Mapped[str | None] = mapped_column(Text, nullable=True)  # canonical JSON, as Miss.args
    # queued -> running -> done | failed | rejected (FA4 refused the call: answered with its reason, not retried)
    status: Mapped[str] = mapped_column(String(16), index=True)
    requester: Mapped[str] = mapped_column(String(160), index=True)  # token name, or "address:<ip>" without one
    reports: Mapped[int] = mapped_column(Integer, default=1)  # miss reports that asked for it
    attempts: Mapped[int] = mapped_column(Integer, default=0)  # claims (a claim after a builder died: > 1)
    builder: Mapped[str] = mapped_column(String(128), default="")
    lease_until: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)
    created: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    started: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)
    finished: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)
    detail: Mapped[str] = mapped_column(Text, default="")  # why it failed or was rejected; what it published
    compile_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    built: Mapped[int] = mapped_column(Integer, default=0)  # kernels compiled for it
    # the running job's claim (service/job_claims.py): only this token, with the claim id whose hash this is
    token_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    claim_hash: Mapped[str] = mapped_column(String(64), default="", server_default="")
    not_before: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)  # a retry's backoff ends


class Verdict(Base):
    """What certification (`fa4-aot certify`) measured of one kernel on one device class (fa4_aot/domain/verdicts.py):
    one row per (kernel, device class), the newest measurement (by `measured`) replacing an older one. The store's
    verdicts/ file holds the same; `sku` is the kernel row's SKU, copied for filtering."""

    __tablename__ = "verdicts"
    __table_args__ = (UniqueConstraint("kernel_key", "device", name="uq_verdicts_kernel_device"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    kernel_key: Mapped[str] = mapped_column(ForeignKey("kernels.kernel_key"))
    device: Mapped[str] = mapped_column(String(160))  # a DeviceClass id
    sku: Mapped[str] = mapped_column(String(64), index=True)
    status: Mapped[str] = mapped_column(String(16), index=True)  # pass, wrong, crash, hang or refused
    detail: Mapped[str] = mapped_column(Text)
    tensor: Mapped[str] = mapped_column(String(16))
    error: Mapped[float | None] = mapped_column(Float, nullable=True)
    bound: Mapped[float | None] = mapped_column(Float, nullable=True)
    checks: Mapped[int] = mapped_column(Integer)
    calls: Mapped[str] = mapped_column(Text)  # canonical JSON list of Call.describe() strings
    toolchain: Mapped[str] = mapped_column(String(256))
    measured: Mapped[str] = mapped_column(String(40))  # the verdict's own `when`, verbatim (2026-12-03T03:04:11Z)
    publisher: Mapped[str] = mapped_column(String(128))  # the publishing token's name, or "import" (the store)
    recorded: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)


class CertifyJob(Base):
    """A certification the service asks for (fa4_aot/certify/certifier.py runs it on a GPU of the SKU): one per
    published kernel key (signposts excepted: they name another key's kernel), queued when the kernel is published,
    and one more per other device class whose certifier asks for work after that job ran elsewhere.
    A certifier claims a job of its SKU with a lease it renews while it works; only the claiming token, with the
    claim id its claim was answered with, may renew or finish it. A job whose lease ran out (its certifier died,
    perhaps killed by the kernel) is claimed again, at most MAX_ATTEMPTS times (service/crud/certify.py)."""

    __tablename__ = "certify_jobs"
    # ids are never reused (SQLite: AUTOINCREMENT), so a client following job N never follows another job
    __table_args__ = (UniqueConstraint("kernel_key", "wanted", name="uq_certify_jobs_key_wanted"),
                      {"sqlite_autoincrement": True})

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    kernel_key: Mapped[str] = mapped_column(String(64))
    # '' for the job queued when the kernel was published (any certifier of the SKU takes it); else the device class
    # of a certifier that asked after that job had run on another class: one job per kernel and device class
    wanted: Mapped[str] = mapped_column(String(160), default="")
    sku: Mapped[str] = mapped_column(String(64), index=True)  # the kernel row's SKU: certifiers of it claim the job
    family: Mapped[str] = mapped_column(String(128))
    status: Mapped[str] = mapped_column(String(16), index=True)  # queued -> running -> done | failed
    attempts: Mapped[int] = mapped_column(Integer, default=0)  # claims that counted (a released claim does not)
    lapses: Mapped[int] = mapped_column(Integer, default=0)  # claims whose lease ran out: their certifier died
    certifier: Mapped[str] = mapped_column(String(128), default="")  # the latest claimer's name
    device: Mapped[str] = mapped_column(String(160), default="")  # its GPU's device class (domain/verdicts.py)
    token_id: Mapped[int | None] = mapped_column(Integer, nullable=True)  # the claiming token (tokens.id)
    claim_hash: Mapped[str] = mapped_column(String(64), default="")  # sha256 of the claim id; '' when unclaimed
    lease_until: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)
    created: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    started: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)
    finished: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)
    detail: Mapped[str] = mapped_column(Text, default="")  # why it failed or was queued again; what it found
    verdict: Mapped[str] = mapped_column(String(16), default="")  # the worst verdict status it ended with
    verdicts: Mapped[str] = mapped_column(Text, default="[]")  # canonical JSON of the verdicts it recorded
    seconds: Mapped[float] = mapped_column(Float, default=0.0)  # the certifier's seconds on it (the last attempt)
