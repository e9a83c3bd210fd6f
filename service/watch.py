"""The server follows its store: kernels, recipe files, signed manifests and verdicts written into the store after
`fa4-aot serve` started (a build, `sign`, a pull, `certify`) are served without a restart or a push to itself.

Every `store_poll` seconds each worker compares the store's change marks (Store.change_marks: the modification
times of index/, recipes/, manifests/, verdicts/ and their subfolders) with the last ones seen; on a change it
imports the store again (sync.import_store: idempotent upserts), under a store lock so that the workers of one
server import one at a time.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging

from starlette.concurrency import run_in_threadpool

from fa4_aot.errors import Fa4AotError
from fa4_aot.store import Store

from . import db, sync

log = logging.getLogger("fa4_aot.service")
IMPORT_LOCK = hashlib.sha256(b"fa4-aot serve: store import").hexdigest()


def reimport(store: Store, database_url: str) -> sync.ImportReport:
    """Import the store into the database once more (one worker at a time)."""
    with store.lock(IMPORT_LOCK, timeout=300), db.session_for(database_url) as session:
        return sync.import_store(session, store)


async def follow(store: Store, database_url: str, every: float) -> None:
    """Re-import the store whenever its fingerprint changes, checking every `every` seconds, until cancelled.
    A failed import is logged once per change and tried again at the next one."""
    seen = await run_in_threadpool(store.change_marks)
    while True:
        await asyncio.sleep(every)
        now = await run_in_threadpool(store.change_marks)
        if now == seen:
            continue
        seen = now
        try:
            report = await run_in_threadpool(reimport, store, database_url)
        except (Fa4AotError, OSError) as e:
            log.warning("store %s changed, but importing it failed: %s", store.root, e)
            continue
        log.info("store %s changed: %d kernels, %d recipe files, %d manifests, %d verdicts imported; %d skipped",
                 store.root, report.kernels, report.recipes, report.manifests, report.verdicts, len(report.skipped))
