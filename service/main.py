"""The FastAPI application: `create_app(settings)` wires everything; `serve(settings)` runs it under uvicorn.

On startup the database is migrated to the newest schema, dead uploads' temp files are removed and the
on-disk store is imported, so `fa4-aot build --sku h200 && fa4-aot serve` serves the local build; what is
written into the store later (a build, `sign`) is imported when the store changes (watch.py, `store_poll`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import uvicorn
from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sqlalchemy.exc import SQLAlchemyError
from starlette.concurrency import run_in_threadpool

from fa4_aot.errors import StoreError
from fa4_aot.store import Store

from . import db, db_faults, docs, openapi, sync, watch
from .config import Settings
from .errors import ServiceError
from .fast_reads import FastReads
from .head import HeadAsGet
from .headers import HeadLimit, uvicorn_options
from .limits import Budget, ClientRate, JsonBodyLimit
from .metrics import Metrics, MetricsMiddleware
from .routes import (
    audit,
    builds,
    bundles,
    certify,
    health,
    kernels,
    manifests,
    metrics,
    misses,
    objects,
    recipes,
    revocations,
    simple,
    skus,
    token,
    verdicts,
)

log = logging.getLogger("service")
# The event loop `serve` runs: asyncio's, not uvloop (uvicorn's pick where it is installed). libuv accepts one
# connection per loop iteration (since 1.45), and a busy worker's iteration serves every ready connection: at 256
# connections on 2 cores about 100 ms, so new connections waited seconds to be accepted (serve_load's p99 of 1 s).
# asyncio's loop accepts every waiting connection at once, at the same throughput here.
LOOP = "asyncio"


def create_app(settings: Settings | None = None) -> FastAPI:
    """A new app for `settings` (default: Settings() from FA4_AOT_* variables). Connects to nothing until
    it starts; each app has its own engine, store handle and metrics registry."""
    settings = settings or Settings()
    app = FastAPI(title="fa4-aot artifact service", version="1", lifespan=_lifespan, docs_url=None,
                  description="FlashAttention-4 kernels compiled ahead of time, per GPU SKU.")
    app.state.settings = settings
    app.state.store = Store(settings.cache_dir)
    app.state.engine = db.make_engine(settings.database_url, busy_timeout=settings.db_busy_timeout)
    app.state.sessions = db.session_factory(app.state.engine)
    app.state.metrics = Metrics()
    app.state.bundle_budget = Budget(settings.bundle_bytes_in_flight)
    app.state.metrics.bundle_bytes.set_function(lambda: app.state.bundle_budget.used)  # read at each scrape
    app.state.miss_rate = ClientRate(settings.anonymous_misses_per_minute)
    app.add_middleware(JsonBodyLimit)
    app.add_middleware(HeadAsGet)
    app.add_middleware(FastReads, store=app.state.store, settings=settings)  # a cluster's reads (fast_reads.py)
    app.add_middleware(HeadLimit)  # 431 for an oversized head under any HTTP implementation (headers.py)
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)  # outermost: counts the 413s too
    app.add_exception_handler(ServiceError, _service_error)
    app.add_exception_handler(StoreError, _store_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(SQLAlchemyError, db_faults.answer)
    app.add_exception_handler(405, openapi.method_not_allowed)
    for module in (health, metrics, skus, manifests, recipes, kernels, bundles, objects, misses, builds, certify,
                   revocations, audit, token, verdicts, simple):
        app.include_router(module.router)
    docs.mount(app)
    app.openapi = openapi.builder(app)  # type: ignore[method-assign]
    return app


def app_from_env() -> FastAPI:
    """Factory for `uvicorn --factory service.main:app_from_env`: settings from FA4_AOT_* variables."""
    return create_app(Settings())


def serve(settings: Settings) -> None:
    """Run the service until interrupted (blocks), on settings.host:settings.port, request heads capped whatever
    HTTP implementation is installed (headers.uvicorn_options), on asyncio's event loop (LOOP), idle connections
    kept settings.keep_alive seconds, settings.backlog connections waiting to be accepted, a line per request only
    with settings.access_log. With several workers the database is migrated and the store imported once here, then
    each worker builds its app from FA4_AOT_* variables (uvicorn starts workers as fresh processes)."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(name)s: %(message)s")
    if settings.workers == 1:
        uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level="info",
                    loop=LOOP, timeout_keep_alive=settings.keep_alive, backlog=settings.backlog,
                    access_log=settings.access_log, **uvicorn_options())
        return
    prepare(settings)
    os.environ.update({f"FA4_AOT_{name.upper()}": str(value) for name, value in settings.model_dump().items()
                       if value is not None and name not in ("host", "port", "workers")})
    os.environ["FA4_AOT_PREPARE_ON_START"] = "false"
    uvicorn.run("service.main:app_from_env", factory=True, host=settings.host, port=settings.port,
                workers=settings.workers, log_level="info", loop=LOOP, timeout_keep_alive=settings.keep_alive,
                backlog=settings.backlog, access_log=settings.access_log, **uvicorn_options())


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings = app.state.settings
    if settings.prepare_on_start:
        await run_in_threadpool(prepare, settings)
    follower = None
    if settings.store_poll > 0:  # serve what the store holds, also what is written into it later
        follower = asyncio.create_task(watch.follow(Store(settings.cache_dir), settings.database_url,
                                                    settings.store_poll))
    try:
        yield
    finally:
        if follower is not None:
            follower.cancel()
        app.state.engine.dispose()


def prepare(settings: Settings) -> None:
    """Migrate the database, clear dead uploads' temp files and import the on-disk store."""
    db.migrate(settings.database_url)
    store = Store(settings.cache_dir)
    removed = sync.remove_dead_temp_files(store)
    with db.session_for(settings.database_url) as session:
        report = sync.import_store(session, store)
    log.info("store %s: imported %d kernels (%d index entries, signposts included; %d new objects), %d recipe files "
             "and %d signed manifests, removed %d stale temp files", store.root, report.kernels, report.entries,
             report.objects, report.recipes, report.manifests, removed)
    # tokens are checked against this database: `fa4-aot token create` must be given the same --cache-dir or --db
    log.info("tokens and metadata: %s", _shown_url(settings.database_url))
    for line in report.skipped:
        log.warning("skipped store entry %s", line)


def _shown_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


async def _service_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ServiceError)
    return JSONResponse({"detail": str(exc)}, status_code=exc.status_code, headers=exc.headers)


async def _store_error(_request: Request, exc: Exception) -> Response:
    return JSONResponse({"detail": str(exc)}, status_code=400)


async def _validation_error(request: Request, exc: Exception) -> Response:
    """Malformed path parameters and headers are 400 with one line; body errors keep FastAPI's 422 list."""
    assert isinstance(exc, RequestValidationError)
    errs = exc.errors()
    if errs and all(e["loc"][0] in ("path", "header", "query") for e in errs):
        name = str(errs[0]["loc"][-1])
        expected = _EXPECTED.get(name, errs[0]["msg"])
        return JSONResponse({"detail": f"invalid {name} {errs[0].get('input')!r}: {expected}"}, status_code=400)
    # FastAPI's own handler echoes the input with ensure_ascii=False, which cannot encode a lone surrogate.
    body = json.dumps({"detail": jsonable_encoder(errs)}, ensure_ascii=True)
    return Response(body, status_code=422, media_type="application/json")


_EXPECTED = {
    "digest": "expected the object's sha256 as 64 lowercase hex digits",
    "kernel_key": "expected 64 lowercase hex digits (see `fa4-aot list`)",
    "sku": "expected a SKU name matching [a-z0-9][a-z0-9-]*, at most 64 characters (see GET /v1/skus)",
}
