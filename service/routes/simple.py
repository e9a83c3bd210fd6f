"""A PEP 503 simple index of the wheels in one folder (Settings.wheels_dir), so that a GPU host inside a cluster
with no internet installs the client from the server it pulls kernels from:

    pip install --index-url http://SERVER:8700/simple fa4-aot

GET /simple/ lists the projects, GET /simple/<project>/ links each of its files with a #sha256= fragment (pip
checks it), GET /simple/<project>/<file> sends the file. The folder holds whatever wheels the operator put there:
this checkout's (`pip wheel --no-deps . -w DIR`) and, for hosts with no other index, its dependencies
(`pip download -d DIR 'fa4-aot[runtime]'`). Reads are open, as pip sends no bearer token."""

from __future__ import annotations

import hashlib
import html
import re
from pathlib import Path

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse

router = APIRouter(prefix="/simple", tags=["simple index"], include_in_schema=False)

SUFFIXES = (".whl", ".tar.gz", ".zip")
_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")


def normalize(name: str) -> str:
    """PEP 503's normalized project name: runs of -, _ and . become one -, lowercased."""
    return re.sub(r"[-_.]+", "-", name).lower()


def project_of(filename: str) -> str:
    """The normalized project a distribution file belongs to: a wheel's name is its first -separated part, an
    sdist's everything before its last (the version)."""
    stem = next(filename[: -len(s)] for s in SUFFIXES if filename.endswith(s))
    return normalize(stem.split("-")[0] if filename.endswith(".whl") else stem.rsplit("-", 1)[0])


def files(folder: Path | None) -> dict[str, list[Path]]:
    """Normalized project -> its distribution files in `folder`, sorted; empty when there is no folder. Names that
    could not be a distribution's (a path separator, a leading dot) are never listed, so never served."""
    found: dict[str, list[Path]] = {}
    if folder is None or not folder.is_dir():
        return found
    for path in sorted(folder.iterdir()):
        if path.is_file() and not path.is_symlink() and _FILE.fullmatch(path.name) and path.name.endswith(SUFFIXES):
            found.setdefault(project_of(path.name), []).append(path)
    return found


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _page(title: str, links: list[tuple[str, str]]) -> HTMLResponse:
    body = "\n".join(f'<a href="{html.escape(href)}">{html.escape(text)}</a><br/>' for href, text in links)
    return HTMLResponse(f"<!DOCTYPE html>\n<html><head><meta name=\"pypi:repository-version\" content=\"1.0\">"
                        f"<title>{html.escape(title)}</title></head><body>\n{body}\n</body></html>\n")


def _folder(request: Request) -> Path:
    folder: Path = request.app.state.settings.wheels_folder
    return folder


@router.get("/")
def index(request: Request) -> HTMLResponse:
    """Every project with a file in the wheels folder (an empty page when there is none)."""
    return _page("Simple index", [(f"{name}/", name) for name in files(_folder(request))])


@router.get("/{project}/")
def project(request: Request, project: str) -> HTMLResponse:
    """The files of `project`, each linked with its sha256; 404 for a project the folder has no file of."""
    held = files(_folder(request)).get(normalize(project))
    if not held:
        raise HTTPException(404, f"no distribution of {project!r} here: put its wheel in the server's wheels folder "
                                 "(`fa4-aot serve --wheels DIR`)")
    return _page(f"Links for {normalize(project)}", [(f"{p.name}#sha256={_sha256(p)}", p.name) for p in held])


@router.get("/{project}/{filename}")
def download(request: Request, project: str, filename: str) -> FileResponse:
    """The bytes of one file listed on `project`'s page; 404 for any other name."""
    held = {p.name: p for p in files(_folder(request)).get(normalize(project), [])}
    if filename not in held:
        raise HTTPException(404, f"no file {filename!r} of {project!r} here")
    return FileResponse(held[filename], media_type="application/octet-stream")
