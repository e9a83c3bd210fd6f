"""Engines, sessions and migrations for a database URL (SQLite or PostgreSQL).

Supported URLs: `sqlite:///<path>` and `postgresql+psycopg://user[:password]@host:port/dbname`.
The schema is owned by Alembic (service/migrations); `migrate(url)` brings any database to head.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event, false, text, update
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from fa4_aot.errors import DatabaseError

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"


def make_engine(url: str, busy_timeout: float = 30.0) -> Engine:
    """An engine for `url`. SQLite gets a busy timeout (`busy_timeout` seconds), WAL and enforced foreign keys,
    and its folder is created.

    Raises DatabaseError for a URL that is neither SQLite nor PostgreSQL.
    """
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            _private_file(Path(parsed.database))
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": busy_timeout})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    if parsed.get_backend_name() == "postgresql":
        return create_engine(url, pool_pre_ping=True)
    raise DatabaseError(
        f"unsupported database URL {parsed.render_as_string(hide_password=True)!r}: "
        "use sqlite:///<path> or postgresql+psycopg://user@host:port/dbname"
    )


def _private_file(path: Path) -> None:
    """Create the SQLite file (and a missing folder) owner-only before SQLite does under the umask: it holds
    token hashes and the audit log. SQLite gives its -wal and -shm files the main file's mode. An existing file is
    never opened here: closing any descriptor of it drops every POSIX lock this process holds on it, SQLite's
    included, and another process closing its last connection would then delete the WAL still written into."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
    except FileExistsError:
        pass


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cursor = dbapi_conn.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA journal_mode=WAL")  # readers do not block the writer
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def lock_table(session: Session, model: Any) -> None:
    """Make this session's transaction the only writer of `model`'s table until it ends, so that a check and the
    write it guards cannot interleave with another writer's (a name still free, a cap not yet reached). PostgreSQL:
    a table lock that readers do not wait for; SQLite: the database's one write lock, taken by a write that
    changes nothing (the driver begins the transaction before it, so later reads see every earlier commit)."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text(f"LOCK TABLE {model.__tablename__} IN SHARE ROW EXCLUSIVE MODE"))
    else:
        first = next(iter(model.__table__.primary_key.columns))
        session.execute(update(model).where(false()).values({first.name: first}))


def session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(bind=engine, expire_on_commit=False)


@contextmanager
def session_for(url: str) -> Iterator[Session]:
    """A session on a fresh engine for `url`, closed (and the engine disposed) on exit. Commits are explicit."""
    engine = make_engine(url)
    try:
        with session_factory(engine)() as session:
            yield session
    finally:
        engine.dispose()


def alembic_config(url: str) -> Config:
    """An Alembic config for `url` without an alembic.ini: the migrations ship inside the package."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["url"] = url  # env.py reads it here, so passwords never go through ini interpolation
    return cfg


def migrate(url: str) -> None:
    """Upgrade the database at `url` to the newest schema (idempotent). Creates a SQLite file's folder."""
    engine = make_engine(url)
    try:
        with engine.begin() as connection:
            cfg = alembic_config(url)
            cfg.attributes["connection"] = connection
            command.upgrade(cfg, "head")
    finally:
        engine.dispose()
