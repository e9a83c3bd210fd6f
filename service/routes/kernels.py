"""Kernel metadata: read one entry, publish one (object first, then this)."""

from __future__ import annotations

import dataclasses
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Response, status
from fastapi.exceptions import RequestValidationError
from sqlalchemy.orm import Session

from fa4_aot.domain import kernel_keys
from fa4_aot.errors import StoreError
from fa4_aot.store import Entry, Store

from .. import crud
from ..crud import certify as crud_certify
from ..crud import tokens as crud_tokens
from ..deps import PublisherDep, SessionDep, StoreDep, check_facts_allowed, check_sku_allowed, require_read
from ..errors import Conflict, NotFound
from ..openapi import PUBLISH, READ
from ..schemas import HEX64, KernelIn, KernelOut
from ..sync import with_held_libraries
from . import READ_ERRORS, errors

router = APIRouter(prefix="/v1/kernels", tags=["kernels"])
KeyPath = Annotated[str, Path(pattern=HEX64, min_length=64, max_length=64, description="64 lowercase hex")]


@router.get("/{kernel_key}", response_model=KernelOut, responses=errors(*READ_ERRORS, 404),
            dependencies=[Depends(require_read)], openapi_extra=READ)
async def get_kernel(kernel_key: KeyPath, store: StoreDep) -> KernelOut:
    """The kernel's index entry: every field of fa4_aot.store.Entry, naming only libraries the server holds.

    Read from the store's index file, not the database, as objects and bundles are: a publish writes the entry
    only once its object is complete, so a cluster fetching kernel by kernel holds no database connection and no
    thread per request. An entry whose object file is gone or of another size, or that cannot be
    used (unreadable, not proving its key), is not served."""
    return served_kernel(store, kernel_key)


def served_kernel(store: Store, kernel_key: str) -> KernelOut:
    """get_kernel's answer (service/fast_reads.py answers plain GETs with it too); NotFound when not served."""
    try:
        entry = store.get_entry(kernel_key)
        served = entry is not None and store.object_size(entry.object_digest) == entry.size
    except StoreError as e:
        raise NotFound(f"the server's index entry for kernel {kernel_key} cannot be used ({e})") from None
    if entry is None or not served:
        raise NotFound(f"no kernel {kernel_key}; GET /v1/skus/<sku>/manifest lists the kernels of a SKU")
    return KernelOut(**with_held_libraries(store, entry).published())


@router.post(
    "",
    response_model=KernelOut,
    status_code=status.HTTP_201_CREATED,
    responses={200: {"model": KernelOut, "description": "Already published with this object"},
               **errors(400, 401, 403, 409, 413)},
    openapi_extra=PUBLISH,
)
def publish_kernel(kernel: KernelIn, session: SessionDep, store: StoreDep, response: Response,
                   token: PublisherDep) -> KernelOut:
    """Publish an index entry whose object was uploaded before: 201 when new, 200 when it existed with the
    same object. The server recomputes the kernel key from the entry's fields (422 when it differs), writes
    the store's index entry first and commits the row last, in one transaction under the key's lock, so a
    failed write leaves no row. `shared_libs` is not part of the key: a library per host arch may be added
    later, never replaced. Each published kernel (re-publishes too) has a certify job, queued once
    (GET /v1/certify-jobs). 409 when the key is published with another object, SKU or library for an arch
    (immutable), the object or a library object is missing or its size differs, or the SKU's facts clash;
    403 when the token is limited to other SKUs, or a SKU outside its list has these facts (shared keys)."""
    check_sku_allowed(token, kernel.sku)
    check_facts_allowed(session, token, crud.sku_facts(kernel))
    if not kernel_keys.has_valid_key(kernel):
        try:
            recomputed = " or ".join(kernel_keys.entry_keys(kernel))
        except ValueError as e:
            recomputed = f"nothing ({e})"  # a validation error of the field, shaped like FastAPI's own 422s
        raise RequestValidationError([{
            "type": "value_error", "loc": ("body", "kernel_key"), "input": kernel.kernel_key,
            "msg": f"kernel_key {kernel.kernel_key} is not the key of this entry's fields (they hash to "
                   f"{recomputed}); publish the entry `fa4-aot build` wrote, unchanged"}])
    for digest in {kernel.object_digest, *(d for lib in kernel.shared_libs.values()
                                          for d in (lib.digest, *lib.needs.values()) if d)}:
        _adopt_unrecorded_object(session, store, digest, actor=crud_tokens.token_label(token))

    def write(entry: Entry, is_new: bool) -> None:
        if store.object_size(entry.object_digest) != entry.size:
            raise Conflict(f"object {entry.object_digest} is recorded but its file is missing from the server's "
                           f"store (or not {entry.size} bytes); upload it again with "
                           f"PUT /v1/objects/{entry.object_digest}, then publish the kernel again")
        if is_new or not store.has_entry(entry.kernel_key):
            store.put_entry(_keep_local_libraries(store, entry))

    with store.lock(kernel.kernel_key):
        entry, is_new = crud.publish_kernel(session, kernel=kernel, actor=crud_tokens.token_label(token), write=write)
    if not entry.is_signpost:  # a kernel's certification (routes/certify.py); a signpost names another key's kernel
        crud_certify.enqueue(session, kernel_key=entry.kernel_key, sku=entry.sku, family=entry.family)
    response.status_code = status.HTTP_201_CREATED if is_new else status.HTTP_200_OK
    return KernelOut(**entry.published())


def _adopt_unrecorded_object(session: Session, store: Store, digest: str, *, actor: str) -> None:
    """Record an object file that has no row, after re-hashing it. A server killed between renaming a verified
    upload into place and committing its row leaves such a file; object reads (HEAD included) go to the file,
    so publishers take the object as uploaded and never send it again. A corrupt file is left to the 409."""
    if crud.get_object(session, digest=digest) is not None or not store.has_object(digest):
        return
    hashed = store.hash_object(digest)
    if hashed is None or hashed[0] != digest:
        return
    size = hashed[1]
    crud.record_object(session, digest=digest, size=size, actor=actor)


def _keep_local_libraries(store: Store, entry: Entry) -> Entry:
    """A store the server shares with a build host keeps the lean libraries that host linked for this object
    (for host arches the published entry does not name: the published ones are what the database holds)."""
    existing = store.get_entry(entry.kernel_key)
    if existing is not None and existing.object_digest == entry.object_digest and existing.shared_libs:
        return dataclasses.replace(entry, shared_libs={**existing.shared_libs, **entry.shared_libs})
    return entry
