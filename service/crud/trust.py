"""Signed manifests and revocations in the database, keyword-only like crud.py (whose conventions hold: writes
commit themselves and are audited; reads never raise for a missing row).

The service holds no trust: it checks that an envelope is well formed (fa4_aot.trust.signing.check_shape) and agrees
with what the service serves (SKU facts, kernel keys and object digests), never its signature; clients verify
signatures against their own trusted keys and the revocations published here.
"""

from __future__ import annotations

import base64
import binascii
import json
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from fa4_aot.domain.kernel_keys import dumps as canonical_json
from fa4_aot.errors import StoreError, TrustError
from fa4_aot.trust import signing, signing_keys

from .. import models, schemas
from ..crud import record_audit, retrying
from ..errors import Conflict, InvalidBody, TooLarge, TooMany
from ..models import utcnow

_IN_CHUNK = 500  # kernel keys per IN (...) query: far below SQLite's and PostgreSQL's parameter limits
ENVELOPE_FIELDS = frozenset({"format", "manifest", "key_id", "public_key", "signature"})
MANIFEST_FIELDS = frozenset({"sku", "kernels", "toolchain", "created", "expires", "libraries", "recipes", "verdicts"})
PER_KEY = 4  # signings kept per (SKU, signing key), all parts of each (manifest_parts.py): a newer makes the oldest go
KEYS_PER_SKU = 8  # distinct signing keys a publish token may store manifests of, per SKU (admins: any)
# What a SKU's manifests may add up to: clients read GET /v1/skus/{sku}/manifests whole and refuse an answer over
# 64 MiB (fa4_aot/remote/transport.py MAX_JSON), so one SKU's manifests must never outgrow that, whoever uploads.
SKU_BYTES = 40 << 20
MANIFESTS_PER_SKU = 64  # and so many envelopes, each verified by every client at its start
TOOLCHAIN_CHARS = 4096


# -- signed manifests -----------------------------------------------------------------------------
def store_manifest(session: Session, *, sku: str, envelope: Any, actor: str, admin: bool = False
                   ) -> tuple[schemas.ManifestStored, bool]:
    """Store a signed manifest of `sku` and commit; returns what is stored and whether it is new (only a new
    one is audited). Raises InvalidBody (422) for a malformed envelope (fields beyond the format's, no kernel
    listed, an oversized toolchain) or one for another SKU, Conflict (409) for an unknown SKU, other SKU facts,
    a kernel the service lacks or holds with another object digest, or an envelope with this manifest id but
    another signature; TooMany (429) when a non-admin brings a ninth signing key to the SKU; TooLarge (413) when
    the SKU's manifests would add up past SKU_BYTES though each key kept only its newest. Only the newest PER_KEY
    signings of a SKU and key are kept (a signing's parts share its `created`): storing one more drops the oldest,
    and older signings of any key go, oldest first, while the SKU's add up past SKU_BYTES or MANIFESTS_PER_SKU
    (audited)."""
    manifest = _checked_shape(envelope, sku)
    manifest_id = signing.manifest_id(envelope)
    text = canonical_json(envelope)

    def work() -> tuple[schemas.ManifestStored, bool]:
        held = session.get(models.SignedManifest, manifest_id)
        if held is not None:
            if held.envelope != text:
                raise Conflict(f"manifest {manifest_id} is already stored with a signature by key {held.key_id}; "
                               "sign a new manifest (`fa4-aot sign`) to publish another signature")
            return _stored(envelope, manifest_id), False
        _check_facts(session, sku, manifest["sku"])
        _check_kernels(session, manifest["kernels"], manifest.get("libraries") or {})
        _check_room(session, sku, envelope["key_id"], admin)
        session.add(models.SignedManifest(manifest_id=manifest_id, sku=sku, key_id=envelope["key_id"],
                                          created=manifest["created"], expires=manifest["expires"], envelope=text,
                                          uploaded_at=utcnow()))
        record_audit(session, actor=actor, action="manifest.store", target=manifest_id,
                     detail={"sku": sku, "key_id": envelope["key_id"], "kernels": len(manifest["kernels"])})
        session.flush()
        _prune(session, sku, envelope["key_id"], actor)
        _fit(session, sku, actor)
        return _stored(envelope, manifest_id), True

    return retrying(session, work)


def _check_room(session: Session, sku: str, key_id: str, admin: bool) -> None:
    held = set(session.scalars(select(models.SignedManifest.key_id).where(models.SignedManifest.sku == sku)).all())
    if key_id not in held and len(held) >= KEYS_PER_SKU and not admin:
        raise TooMany(f"SKU {sku!r} already has manifests by {len(held)} signing keys; a manifest by a new key "
                      f"({key_id}) needs an admin token, or revoke a key (`fa4-aot revoke --key-id`) first")


def _prune(session: Session, sku: str, key_id: str, actor: str) -> None:
    """Keep the manifests of the key's newest PER_KEY signings (the parts of one share its `created`)."""
    rows = session.scalars(select(models.SignedManifest).where(models.SignedManifest.sku == sku,
                                                               models.SignedManifest.key_id == key_id)).all()
    kept = sorted({_parse_time(r.created) for r in rows}, reverse=True)[:PER_KEY]
    for row in rows:
        if _parse_time(row.created) not in kept:
            _drop(session, row.manifest_id, actor, {"sku": sku, "key_id": key_id, "created": row.created})
    session.flush()


def _fit(session: Session, sku: str, actor: str) -> None:
    """Drop manifests of `sku` that a newer signing by their key supersedes, oldest first, while the SKU's add up
    past SKU_BYTES or MANIFESTS_PER_SKU; TooLarge (rolled back by the caller) when the newest of each key alone
    do."""
    size = func.length(models.SignedManifest.envelope).label("size")  # canonical JSON is ASCII: characters are bytes
    rows = session.execute(select(models.SignedManifest.manifest_id, models.SignedManifest.key_id,
                                  models.SignedManifest.created, models.SignedManifest.uploaded_at, size)
                           .where(models.SignedManifest.sku == sku)).all()
    rows = sorted(rows, key=lambda r: (_parse_time(r.created), r.uploaded_at, r.manifest_id))  # oldest first
    total, count, newest = sum(r.size for r in rows), len(rows), {r.key_id: r.created for r in rows}
    for row in rows:
        if total <= SKU_BYTES and count <= MANIFESTS_PER_SKU:
            break
        if row.created != newest[row.key_id]:
            _drop(session, row.manifest_id, actor, {"sku": sku, "key_id": row.key_id, "created": row.created})
            total, count = total - row.size, count - 1
    if total > SKU_BYTES or count > MANIFESTS_PER_SKU:
        raise TooLarge(f"SKU {sku!r}'s signed manifests would be {count} adding up to {total >> 20} MiB, over the "
                       f"{MANIFESTS_PER_SKU} and {SKU_BYTES >> 20} MiB a SKU keeps (clients read them whole), though "
                       f"each of its {len(newest)} signing keys keeps only its newest signing: revoke a key whose "
                       "manifests are no longer wanted (`fa4-aot revoke --key-id`), or sign with a key that already "
                       "signs this SKU")
    session.flush()


def _drop(session: Session, manifest_id: str, actor: str, detail: dict[str, Any]) -> None:
    session.delete(session.get(models.SignedManifest, manifest_id))
    record_audit(session, actor=actor, action="manifest.prune", target=manifest_id, detail=detail)


def list_manifests(session: Session, *, sku: str) -> bytes:
    """The JSON document {"manifests": [...]} of every stored envelope of `sku` (none for an unknown SKU), newest
    `created` first, then newest upload: joined from the canonical texts stored, never parsed again, so a fetch
    costs about the bytes it sends (at most SKU_BYTES)."""
    rows = session.execute(select(models.SignedManifest.envelope, models.SignedManifest.created,
                                  models.SignedManifest.uploaded_at, models.SignedManifest.manifest_id)
                           .where(models.SignedManifest.sku == sku)).all()
    rows = sorted(rows, key=lambda r: (_parse_time(r.created), r.uploaded_at, r.manifest_id), reverse=True)
    return b'{"manifests":[' + b",".join(r.envelope.encode() for r in rows) + b"]}"


def _checked_shape(envelope: Any, sku: str) -> dict[str, Any]:
    """The manifest of a well-formed envelope for `sku`; InvalidBody naming the first problem otherwise."""
    try:
        manifest = signing.check_shape(envelope)
    except (TrustError, StoreError) as e:  # check_shape raises StoreError for a malformed hex id
        raise InvalidBody(str(e)) from None
    extra = sorted((set(envelope) - ENVELOPE_FIELDS) | (set(manifest) - MANIFEST_FIELDS))
    if extra:
        raise InvalidBody(f"unexpected fields {', '.join(map(str, extra))[:200]} in the signed manifest; send "
                          "the envelope that `fa4-aot sign` wrote, unchanged")
    if not manifest["kernels"]:
        raise InvalidBody("the manifest lists no kernel; sign a store that holds this SKU's kernels")
    if len(canonical_json(manifest.get("toolchain"))) > TOOLCHAIN_CHARS:
        raise InvalidBody(f"the manifest's toolchain is over {TOOLCHAIN_CHARS} characters; a real one names a few "
                          "package versions")
    if manifest["sku"]["name"] != sku:
        raise InvalidBody(f"the manifest is for SKU {manifest['sku']['name']!r}, not {sku!r}: "
                          f"PUT it to /v1/skus/{manifest['sku']['name']}/manifests")
    try:
        raw = base64.b64decode(envelope["public_key"], validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != 32 or envelope["key_id"] != signing_keys.key_id_of(raw):
        raise InvalidBody(f"key_id {envelope['key_id'][:40]!r} does not name public_key: a key id is the first 16 "
                          "hex digits of the sha256 of the 32-byte Ed25519 public key; sign with `fa4-aot sign`")
    return manifest


def _check_facts(session: Session, sku: str, facts: Any) -> None:
    row = session.get(models.Sku, sku)
    if row is None:
        raise Conflict(f"unknown SKU {sku!r}: publish its kernels first (`fa4-aot push --sku {sku}`), then its "
                       "manifest")
    held = schemas.SkuFacts.model_validate(row).model_dump()
    if facts != held:
        raise Conflict(f"the manifest gives SKU {sku!r} the facts {canonical_json(facts)[:300]} but the service "
                       f"holds {canonical_json(held)}; sign a manifest of the kernels built for this SKU")


def _check_kernels(session: Session, kernels: dict[str, str], libraries: dict[str, Any]) -> None:
    """Conflict naming the first kernel (by key) that the service lacks or holds with another object digest or
    other libraries than the manifest lists."""
    keys = sorted(kernels)
    held: dict[str, str] = {}
    libs: dict[str, Any] = {}
    for i in range(0, len(keys), _IN_CHUNK):
        query = select(models.Kernel.kernel_key, models.Kernel.object_digest, models.Kernel.shared_libs).where(
            models.Kernel.kernel_key.in_(keys[i:i + _IN_CHUNK]))
        for k, d, shared in session.execute(query).all():
            held[k], libs[k] = d, json.loads(shared or "{}")
    for key, listed in sorted(libraries.items()):
        served = {arch: signing.library_listing(lib) for arch, lib in libs.get(key, {}).items()}
        if key not in kernels or not isinstance(listed, dict) or any(served.get(a) != v for a, v in listed.items()):
            raise Conflict(f"the manifest lists libraries {canonical_json(listed)[:300]} for kernel {key}, but this "
                           f"service serves {canonical_json(served)[:300]}: push the kernels with their libraries "
                           "first (`fa4-aot push`), then sign and push the manifest")
    for key in keys:
        if key not in held:
            raise Conflict(f"the manifest lists kernel {key}, which this service does not hold: push the kernels "
                           "first (`fa4-aot push`), then the manifest")
        if held[key] != kernels[key]:
            raise Conflict(f"the manifest lists kernel {key} with object {kernels[key]}, but this service serves "
                           f"object {held[key]} for it: sign a manifest of the kernels as published")


def _stored(envelope: dict[str, Any], manifest_id: str) -> schemas.ManifestStored:
    manifest = envelope["manifest"]
    return schemas.ManifestStored(manifest_id=manifest_id, sku=manifest["sku"]["name"], key_id=envelope["key_id"],
                                  kernels=len(manifest["kernels"]), created=manifest["created"],
                                  expires=manifest["expires"])


def _parse_time(value: str) -> datetime:
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ")  # stored values passed signing.check_shape


# -- revocations ----------------------------------------------------------------------------------
def add_revocation(session: Session, *, revocation: schemas.RevocationIn, actor: str
                   ) -> tuple[schemas.RevocationOut, bool]:
    """Record a revocation and commit; returns the stored entry and whether it is new. Revoking something
    already revoked keeps the first entry (and its reason) and audits nothing."""

    def work() -> tuple[schemas.RevocationOut, bool]:
        held = session.scalar(select(models.Revocation).where(models.Revocation.kind == revocation.kind,
                                                              models.Revocation.ident == revocation.id))
        if held is not None:
            return _revocation_out(held), False
        row = models.Revocation(kind=revocation.kind, ident=revocation.id, reason=revocation.reason,
                                created=utcnow())
        session.add(row)
        record_audit(session, actor=actor, action="revocation.add", target=f"{revocation.kind}:{revocation.id}",
                     detail={"kind": revocation.kind, "id": revocation.id, "reason": revocation.reason})
        session.flush()
        return _revocation_out(row), True

    return retrying(session, work)


def list_revocations(session: Session) -> schemas.Revocations:
    rows = session.scalars(select(models.Revocation).order_by(models.Revocation.id)).all()
    return schemas.Revocations(keys=sorted(r.ident for r in rows if r.kind == "key"),
                               manifests=sorted(r.ident for r in rows if r.kind == "manifest"),
                               entries=[_revocation_out(r) for r in rows])


def _revocation_out(row: models.Revocation) -> schemas.RevocationOut:
    return schemas.RevocationOut.model_validate({"kind": row.kind, "id": row.ident, "reason": row.reason,
                                                 "created": row.created})
