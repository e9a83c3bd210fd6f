"""Store import: make the database serve what the on-disk store holds (kernels, recipe files, signed manifests,
certification verdicts), at startup and whenever the store changes (watch.py)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from fa4_aot.domain import kernel_keys
from fa4_aot.errors import StoreError
from fa4_aot.store import Entry, Store, maintenance
from fa4_aot.store import recipes as recipe_store
from fa4_aot.trust import signing

from . import crud, models, schemas
from .crud import certify as crud_certify
from .crud import recipes as crud_recipes
from .crud import trust as crud_trust
from .crud import verdicts as crud_verdicts
from .errors import Conflict, ServiceError

log = logging.getLogger(__name__)


@dataclass
class ImportReport:
    kernels: int = 0  # kernels imported: index entries but signposts (Entry.is_signpost), the unit of every command
    entries: int = 0  # index entries imported, signposts included
    objects: int = 0
    recipes: int = 0
    manifests: int = 0
    verdicts: int = 0
    skipped: list[str] = field(default_factory=list)  # one line per entry left out, saying why


def import_store(session: Session, store: Store) -> ImportReport:
    """Upsert every index entry of `store` (objects, SKUs, kernels), then its recipe files, signed manifests and
    verdicts (crud_verdicts.import_store: of kernels the database holds), into the database and commit.

    An object row is added only when its file exists with the entry's size. Entries that cannot be served
    (unreadable, missing object, SKU facts that clash with the database) are skipped and named in the
    report; this never raises for one bad entry, so one corrupt file cannot keep the service down.
    """
    report = ImportReport()
    served = []
    for entry in _entries(store, report):
        try:
            _import_entry(session, store, entry, report)
            served.append(entry)
        except (Conflict, ValueError) as e:
            report.skipped.append(f"{entry.kernel_key}: {e}")
    session.commit()
    _import_recipes(session, store, report)
    _import_manifests(session, store, report)
    report.verdicts = crud_verdicts.import_store(session, store, report.skipped)
    _queue_certification(session, served)
    return report


def _queue_certification(session: Session, entries: list[Entry]) -> None:
    """Queue the certification (crud_certify) of the served kernels no device class has a verdict of: kernels a
    build wrote into the store before `serve` are certified as those builders publish are (signposts excepted:
    they name another key's kernel). A kernel with a job in any state keeps it."""
    certified = set(session.scalars(select(models.Verdict.kernel_key).distinct()).all())
    crud_certify.enqueue_many(session, [(e.kernel_key, e.sku, e.family) for e in entries
                                        if not e.is_signpost and e.kernel_key not in certified])


def _import_manifests(session: Session, store: Store, report: ImportReport) -> None:
    """Record the signed manifests the store keeps (`fa4-aot sign` writes them there) for every SKU the database
    holds, with the checks an upload passes (crud_trust.store_manifest): after `sign`, clients with trusted keys
    get them from this server without a push to itself. One that fails a check is skipped and named."""
    for sku in session.scalars(select(models.Sku.name)).all():
        for envelope in signing.local(store, sku, report.skipped):
            try:
                _stored, new = crud_trust.store_manifest(session, sku=sku, envelope=envelope, actor="import",
                                                         admin=True)
            except ServiceError as e:
                report.skipped.append(f"manifest of {sku} in {store.root}: {e}")
                continue
            report.manifests += int(new)


def _import_recipes(session: Session, store: Store, report: ImportReport) -> None:
    """Record every recipe file of the store that is valid for a SKU the database holds (its regions hash, with
    the SKU's facts, to its key: the check an upload passes), so a build's recipes are served as its kernels
    are. The file's bytes are what the server sends, so a row that names other bytes is brought up to date."""
    targets = {crud_recipes.target_of(session, sku=row.name) for row in session.scalars(select(models.Sku))}
    for target in sorted(targets):
        for key, data in recipe_store.keys_for(store, json.loads(target)):
            if crud_recipes.record_recipe(session, key=key, target=target, digest=hashlib.sha256(data).hexdigest(),
                                          size=len(data), actor="import"):
                report.recipes += 1


def _entries(store: Store, report: ImportReport) -> list[Entry]:
    try:
        return list(store.entries(skipped=report.skipped))
    except StoreError as e:  # the store itself is unusable (e.g. a foreign owner): serve nothing from it
        report.skipped.append(str(e))
        return []


def _import_entry(session: Session, store: Store, entry: Entry, report: ImportReport) -> None:
    """Raises Conflict (SKU facts) or ValueError (entry fails validation, object missing or short) before
    adding anything to the session, so a skipped entry leaves no partial rows."""
    kernel = schemas.KernelIn.model_validate(with_held_libraries(store, entry).published())
    if not kernel_keys.has_valid_key(entry):
        raise ValueError("its fields do not hash to its kernel key; run `fa4-aot verify` and rebuild")
    try:
        size = store.object_size(entry.object_digest)
    except StoreError as e:
        raise ValueError(str(e)) from e
    if size != entry.size:
        raise ValueError(f"object {entry.object_digest} is missing or not {entry.size} bytes; run `fa4-aot verify`")
    crud.ensure_sku(session, facts=crud.sku_facts(kernel))
    for digest, obj_size in {entry.object_digest: entry.size, **_library_objects(store, kernel)}.items():
        if session.get(models.Object, digest) is None:
            session.add(models.Object(digest=digest, size=obj_size, created=models.utcnow()))
            report.objects += 1
    row = session.get(models.Kernel, entry.kernel_key)
    if row is not None:
        if row.object_digest != entry.object_digest or row.sku != entry.sku:
            raise ValueError(f"the database publishes it with object {row.object_digest} (SKU {row.sku}), the "
                             "store's entry differs; kernel keys are immutable, so the database's is served")
        _count(report, entry)
        return
    row = models.Kernel(kernel_key=entry.kernel_key)
    session.add(row)
    crud.fill_kernel(row, kernel)
    row.created = entry.created
    crud.record_audit(session, actor="import", action="kernel.import", target=entry.kernel_key,
                      detail={"sku": entry.sku, "object_digest": entry.object_digest})
    session.flush()
    _count(report, entry)


def _count(report: ImportReport, entry: Entry) -> None:
    report.entries += 1
    report.kernels += not entry.is_signpost


def with_held_libraries(store: Store, entry: Entry) -> Entry:
    """The entry with only the host arches whose library and runtime libraries are all in the store with their
    sizes: a server never names a library it cannot send."""
    def held(arch: str) -> bool:
        return all(store.object_size(d) is not None and (size is None or store.object_size(d) == size)
                   for d, size in entry.lib_digests(arch).items())

    return dataclasses.replace(entry, shared_libs={a: lib for a, lib in entry.shared_libs.items() if held(a)})


def _library_objects(store: Store, kernel: schemas.KernelIn) -> dict[str, int]:
    return {d: store.object_size(d) or 0 for lib in kernel.shared_libs.values()
            for d in (lib.digest, *lib.needs.values()) if d}


def remove_dead_temp_files(store: Store) -> int:
    """Remove temp files that killed writers (e.g. an interrupted upload) left in the store. Removes no object:
    gc with an infinite min_age keeps every object and clears only dead writers' `.tmp` files."""
    try:
        return maintenance.gc(store, min_age=math.inf).removed_temp_files
    except StoreError as e:
        log.warning("could not clean temp files in %s: %s", store.root, e)
        return 0
