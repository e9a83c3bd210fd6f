"""Service fixtures: every test talks HTTP to a real uvicorn process, over SQLite and over a real PostgreSQL
that the fixture starts itself (its tests skip, with the reason, only when no PostgreSQL can start).
A plugin (tests/conftest.py's pytest_plugins): tests in every folder use them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.helpers.servers import Launch, Postgres, Server, prepare_database


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    try:
        cluster = Postgres()
        cluster.start()
    except (FileNotFoundError, RuntimeError, KeyError) as e:
        pytest.skip(f"PostgreSQL could not start, so its service tests are skipped: {e}")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def new_db_url(request: pytest.FixtureRequest) -> Callable[[Path], str]:
    """Makes an empty database of this module's backend; SQLite files go into the given folder."""
    if request.param == "postgresql":
        cluster: Postgres = request.getfixturevalue("postgres")
        return lambda _folder: cluster.new_database()
    return lambda folder: f"sqlite:///{folder / 'fa4-aot.db'}"


def _launcher(tmp_root: Path, new_db_url: Callable[[Path], str]) -> tuple[Launch, list[Server]]:
    servers: list[Server] = []

    def launch(cache_dir: Path | None = None, start: bool = True, **env: str) -> Server:
        """A server on a fresh (or the given) store and a fresh database with tokens for every scope."""
        folder = tmp_root / f"server{len(servers)}"
        folder.mkdir()
        cache = cache_dir or folder / "cache"
        db_url = new_db_url(folder)
        server = Server(cache_dir=cache, db_url=db_url, log=folder / "server.log",
                        env={f"FA4_AOT_{k.upper()}": v for k, v in env.items()}, tokens=prepare_database(db_url))
        servers.append(server)
        return server.start() if start else server

    return launch, servers


@pytest.fixture
def launch(tmp_path: Path, new_db_url: Callable[[Path], str]) -> Iterator[Launch]:
    """Start servers for one test; all are killed when it ends."""
    start, servers = _launcher(tmp_path, new_db_url)
    yield start
    for server in servers:
        server.kill()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, new_db_url: Callable[[Path], str]) -> Iterator[Server]:
    """One server shared by a module's tests (per backend); tests use distinct random bytes and keys."""
    start, servers = _launcher(tmp_path_factory.mktemp("shared"), new_db_url)
    yield start()
    for each in servers:
        each.kill()
