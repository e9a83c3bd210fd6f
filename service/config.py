"""The service's one configuration object, read from FA4_AOT_* environment variables at construction time."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from fa4_aot.config import default_cache_dir


class Settings(BaseSettings):
    """Service settings. Every field can be set as FA4_AOT_<FIELD> (e.g. FA4_AOT_DB_URL) or passed directly.

    `db_url` defaults to a SQLite file inside the store, so `fa4-aot build && fa4-aot serve` needs nothing
    else; for a shared deployment use `postgresql+psycopg://user@host:port/dbname`.
    """

    model_config = SettingsConfigDict(env_prefix="FA4_AOT_", extra="ignore")

    cache_dir: Path = Field(default_factory=default_cache_dir, description="The kernel store that holds the bytes.")
    db_url: str | None = Field(default=None, description="SQLAlchemy URL; default sqlite:///<cache_dir>/fa4-aot.db.")
    require_read_token: bool = Field(default=False, description="Reads under /v1 need a read/publish/admin token.")
    max_body_bytes: int = Field(default=512 * 2**20, gt=0, description="Largest accepted object upload, in bytes.")
    bundle_bytes_in_flight: int = Field(default=1 << 30, gt=0, description="Bundle bytes being sent at once, per "
                                        "worker process; past it POST /v1/bundles answers 503 with Retry-After.")
    bundle_send_stall: float = Field(default=30.0, gt=0, description="Seconds a bundle answer waits for its client "
                                     "to take the next piece; then it is cut off and its bytes leave "
                                     "FA4_AOT_BUNDLE_BYTES_IN_FLIGHT (a reader that stops reading holds none).")
    anonymous_misses_per_minute: int = Field(default=120, gt=0, description="New misses one client address may "
                                             "report a minute without a token (per worker process); then 429.")
    anonymous_builds_per_hour: int = Field(default=60, gt=0, description="New build jobs that reports without a "
                                           "token may queue per SKU in an hour, all addresses together; past it a "
                                           "new anonymous miss is recorded but answered 429 with Retry-After.")
    build_queue_max: int = Field(default=1024, gt=0, description="Build jobs queued or running at once, all "
                                 "clients together; a miss past it is recorded but not queued (its answer says so).")
    build_queue_per_token: int = Field(default=64, gt=0, description="Build jobs one token (or one address, "
                                       "without a token) may have queued or running at once.")
    db_busy_timeout: float = Field(default=30.0, gt=0, le=3600, description="Seconds a SQLite write waits for "
                                   "another writer's lock; past it the request answers 503 with Retry-After.")
    wheels_dir: Path | None = Field(default=None, description="Folder of wheels served as a PEP 503 simple index "
                                    "at /simple/ (`pip install --index-url http://SERVER/simple fa4-aot`); "
                                    "default: wheels/ in the store, when it exists.")
    host: str = "127.0.0.1"
    port: int = Field(default=8700, ge=0, le=65535)
    workers: int = Field(default=1, ge=1, le=64, description="uvicorn worker processes.")
    keep_alive: int = Field(default=75, gt=0, le=3600, description="Seconds an idle client connection is kept "
                              "open (nginx's default; uvicorn's own 5 s closes a busy cluster's connections between "
                              "requests, and each new one costs an accept and a handshake more).")
    backlog: int = Field(default=4096, ge=64, le=65535, description="Connections waiting to be accepted (the "
                         "kernel caps it at net.core.somaxconn): a cluster's nodes connect at once.")
    access_log: bool = Field(default=False, description="Log a line per request (uvicorn's access log): about 75 us "
                             "of a worker's CPU each, a fifth of a plain object GET's; /metrics counts requests.")
    store_poll: float = Field(default=10.0, ge=0, description="Seconds between checks for changes of the store "
                              "(a build, `sign`, a pull into it), which are then imported; 0: only at start.")
    prepare_on_start: bool = Field(default=True, description="Migrate and import the store when the app starts; "
                                                             "serve() does it once before starting several workers.")

    @model_validator(mode="after")
    def _default_db_url(self) -> Settings:
        if self.db_url is None:
            self.db_url = f"sqlite:///{self.cache_dir / 'fa4-aot.db'}"
        return self

    @property
    def wheels_folder(self) -> Path:
        """`wheels_dir`, else wheels/ inside the store (served only once it exists)."""
        return self.wheels_dir or self.cache_dir / "wheels"

    @property
    def database_url(self) -> str:
        """`db_url` with its default applied (never None after validation)."""
        assert self.db_url is not None
        return self.db_url
