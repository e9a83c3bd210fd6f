"""The database layer on both backends: migrations match the models and run both ways, tokens are stored
hashed and revocable, and racing publishers of the same content all succeed."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import select

from fa4_aot.errors import DatabaseError
from service import db, models
from service.config import Settings
from service.crud import tokens as crud_tokens
from service.errors import InvalidInput, TokenNotFound
from tests.helpers.servers import Server, kernel_doc


def test_migrations_match_models_and_downgrade(new_db_url: Callable[[Path], str], tmp_path: Path) -> None:
    url = new_db_url(tmp_path)
    db.migrate(url)
    db.migrate(url)  # idempotent
    engine = db.make_engine(url)
    try:
        with engine.connect() as conn:
            assert compare_metadata(MigrationContext.configure(conn), models.Base.metadata) == []
        with engine.begin() as conn:
            cfg = db.alembic_config(url)
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "base")
    finally:
        engine.dispose()
    db.migrate(url)


def test_tokens_are_hashed_and_revocable(new_db_url: Callable[[Path], str], tmp_path: Path) -> None:
    url = new_db_url(tmp_path)
    db.migrate(url)
    with db.session_for(url) as session:
        plaintext = crud_tokens.create_token(session, name="ci", scope="publish")
        stored = session.scalars(select(models.Token)).one()
        assert plaintext.startswith("fa4_") and len(plaintext) > 40
        assert stored.token_hash == hashlib.sha256(plaintext.encode()).hexdigest()
        assert plaintext not in (stored.token_hash, stored.name)
        assert crud_tokens.revoke_token(session, name="ci") == 1
        assert crud_tokens.find_token(session, plaintext=plaintext).revoked  # type: ignore[union-attr]
        with pytest.raises(TokenNotFound, match="fa4-aot token"):
            crud_tokens.revoke_token(session, name="ci")
        with pytest.raises(InvalidInput, match="read, publish, admin"):
            crud_tokens.create_token(session, name="x", scope="root")
        assert crud_tokens.create_token(session, name="", scope="read").startswith("fa4_")  # the CLI's default name


def test_settings_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FA4_AOT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("FA4_AOT_REQUIRE_READ_TOKEN", "1")
    monkeypatch.delenv("FA4_AOT_DB_URL", raising=False)
    settings = Settings()
    assert settings.db_url == f"sqlite:///{tmp_path / 'fa4-aot.db'}" and settings.require_read_token
    assert (settings.host, settings.port, settings.max_body_bytes) == ("127.0.0.1", 8700, 512 * 2**20)
    assert Settings(db_url="postgresql+psycopg://u@h:1/d").db_url == "postgresql+psycopg://u@h:1/d"


def test_unsupported_url_names_the_fix() -> None:
    with pytest.raises(DatabaseError, match="postgresql\\+psycopg://"):
        db.make_engine("mysql://localhost/fa4")


def test_racing_publishers_all_succeed(server: Server) -> None:
    data = os.urandom(4096)
    digest = hashlib.sha256(data).hexdigest()
    doc = kernel_doc(data, sku="h200-race")

    def publish(_: int) -> tuple[int, int]:
        with server.client("publish") as c:
            return c.put(f"/v1/objects/{digest}", content=data).status_code, c.post("/v1/kernels", json=doc).status_code

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(publish, range(8)))
    assert all(put in (200, 201) and post in (200, 201) for put, post in results), results
    assert [put for put, _ in results].count(201) == 1 and [post for _, post in results].count(201) == 1
    with server.client() as c:
        assert c.get(f"/v1/objects/{digest}").content == data
        assert c.get(f"/v1/kernels/{doc['kernel_key']}").json()["sku"] == "h200-race"
