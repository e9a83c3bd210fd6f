"""/docs from the package: Swagger UI's assets come from the swagger-ui-bundle wheel (Apache-2.0), served
under /docs/assets, so the page works on an air-gapped cluster (FastAPI's default loads them from a CDN)."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

ASSETS = "/docs/assets"


def mount(app: FastAPI) -> None:
    """Serve /docs with local assets, and redirect / to it. The app must be created with docs_url=None."""
    from swagger_ui_bundle import swagger_ui_path

    app.mount(ASSETS, StaticFiles(directory=swagger_ui_path), name="swagger-ui")

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:  # a browser pointed at the server lands on its API's page
        return RedirectResponse("/docs")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url=app.openapi_url or "/openapi.json", title=f"{app.title} - docs",
                                   swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{ASSETS}/swagger-ui.css",
                                   swagger_favicon_url=f"{ASSETS}/favicon-32x32.png")
