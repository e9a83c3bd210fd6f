"""Real servers and databases for the service tests: a uvicorn subprocess per server, and a throwaway
PostgreSQL cluster started from the system's initdb/pg_ctl. Nothing here is mocked."""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
from sqlalchemy import func, select

from fa4_aot.domain import kernel_keys
from service import crud, db, models
from service.crud import tokens as crud_tokens

ROOT = Path(__file__).resolve().parents[2]
H200 = {"sku": "h200", "arch": "sm_90a", "sm_count": 132, "l2_bytes": 62914560, "cuda_major": 13, "host": "x86-64-v3"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kernel_doc(data: bytes, *, key: str | None = None, **overrides: Any) -> dict[str, Any]:
    """A POST /v1/kernels body for an object holding `data`. Its compile key names the bytes, so distinct bytes
    make distinct kernels; the kernel key is what the fields hash to (fa4_aot.domain.kernel_keys.entry_key, as the
    server recomputes it) unless `key` is given."""
    doc = {
        "object_digest": hashlib.sha256(data).hexdigest(), "size": len(data),
        "family": "FlashAttentionForwardSm90",
        "compile_key": ["fwd", 128, True, {"float": "0x1.0p-3"}, None, hashlib.sha256(data).hexdigest()[:16]],
        **H200, "toolchain": {"flash-attn-4": "4.0.0b36"}, "variant": "train", "call": "fwd dense bf16 d=128",
        "compile_seconds": 1.5, "hardware_queries": [["sm_count", 132]],
    }
    doc = {**doc, **overrides}
    return {"kernel_key": key or kernel_keys.entry_key(SimpleNamespace(**doc)), **doc}


@dataclass
class Server:
    """A uvicorn process serving service.main:app_from_env with FA4_AOT_* settings from `env`."""

    cache_dir: Path
    db_url: str
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    tokens: dict[str, str] = field(default_factory=dict)
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> Server:
        """Start (or restart) the process on a fresh port and wait until /healthz answers 200."""
        self.port = free_port()
        env = {**os.environ, "PYTHONPATH": str(ROOT), "FA4_AOT_CACHE_DIR": str(self.cache_dir),
               "FA4_AOT_DB_URL": self.db_url, **self.env}
        cmd = [sys.executable, "-m", "uvicorn", "--factory", "service.main:app_from_env", "--host", "127.0.0.1",
               "--port", str(self.port), "--log-level", "warning"]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"server did not answer /healthz in {timeout}s:\n{self.log.read_text()[-3000:]}")

    def kill(self) -> None:
        """SIGKILL the process (no graceful shutdown) and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.proc = None

    def client(self, scope: str | None = None, **kwargs: Any) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.tokens[scope]}"} if scope else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30, **kwargs)


def prepare_database(db_url: str) -> dict[str, str]:
    """Migrate the database and create one token per scope, plus a revoked one; returns their plaintexts."""
    db.migrate(db_url)
    with db.session_for(db_url) as session:
        tokens = {scope: crud_tokens.create_token(session, name=f"test-{scope}", scope=scope)
                  for scope in ("read", "publish", "admin")}
        tokens["revoked"] = crud_tokens.create_token(session, name="test-revoked", scope="admin")
        crud_tokens.revoke_token(session, name="test-revoked")
    return tokens


class Postgres:
    """A private PostgreSQL cluster in a temp folder, on a free port, trusting local connections."""

    def __init__(self) -> None:
        self.bin = _postgres_bin()
        self.root = Path(tempfile.mkdtemp(prefix="fa4-aot-pg-"))  # under /tmp: the postgres user can reach it
        self.port = free_port()
        self.databases = 0
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_user:
            shutil.chown(self.root, "postgres", "postgres")

    def _run(self, tool: str, *args: str) -> None:
        subprocess.run([*self.as_user, str(self.bin / tool), *args], check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        """Raises RuntimeError with the server log when the cluster cannot start."""
        data, log = self.root / "data", self.root / "log"
        try:
            self._run("initdb", "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
            opts = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -F"
            self._run("pg_ctl", "-D", str(data), "-w", "-t", "60", "-l", str(log), "-o", opts, "start")
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as e:
            detail = getattr(e, "stderr", b"") or b""
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(f"{e}: {detail.decode(errors='replace')} {tail}") from e

    def new_database(self) -> str:
        """A fresh, empty database; returns its SQLAlchemy URL."""
        import psycopg

        self.databases += 1
        name = f"fa4_{self.databases}"
        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres",
                             autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.root / "data"), "-m", "immediate", "stop")
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
            pass
        shutil.rmtree(self.root, ignore_errors=True)


def _postgres_bin() -> Path:
    """The newest /usr/lib/postgresql/*/bin holding initdb, else the folder of `initdb` on PATH."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: [int(x) for x in Path(p).parts[-3].split(".") if x.isdigit()])
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).parent
    raise FileNotFoundError("no initdb under /usr/lib/postgresql/*/bin or on PATH (apt-get install postgresql)")


Launch = Callable[..., "Server"]  # the `launch` fixture: launch(cache_dir=None, start=True, **settings)


def raw_request(server: Server, method: str, target: str, body: bytes = b"",
                headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """Send `target` byte for byte (no client-side normalisation of `..` or %2F) and return (status, body)."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: 127.0.0.1:{server.port}", "Connection: close",
             f"Content-Length: {len(body)}", *(f"{k}: {v}" for k, v in (headers or {}).items())]
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    head, _, payload = reply.partition(b"\r\n\r\n")
    return int(head.split()[1]), payload


def store_files(cache_dir: Path) -> list[str]:
    """Every file under the store's objects/ and index/ folders, temp files included."""
    return sorted(str(p.relative_to(cache_dir)) for folder in ("objects", "index")
                  for p in (cache_dir / folder).rglob("*") if p.is_file())


def row_counts(db_url: str) -> dict[str, int]:
    """Rows of every table a request can write (the audit log and tokens included)."""
    with db.session_for(db_url) as session:
        extra = {name: session.scalar(select(func.count()).select_from(model)) or 0
                 for name, model in (("audit", models.AuditEntry), ("tokens", models.Token))}
        return {**crud.counts(session), **extra, "skus": len(crud.list_skus(session))}


def publish_random_kernels(server: Server, sku: str, n: int, size: int) -> list[str]:
    """Publish `n` kernels of `sku` over objects of `size` random bytes (publish token); their kernel keys."""
    keys = []
    with server.client("publish") as c:
        for _ in range(n):
            data = os.urandom(size)
            doc = kernel_doc(data, sku=sku)
            assert c.put(f"/v1/objects/{doc['object_digest']}", content=data).status_code == 201
            assert c.post("/v1/kernels", json=doc).status_code == 201
            keys.append(str(doc["kernel_key"]))
    return keys


def unabsorbed_object_size() -> int:
    """An object size such that a bundle of two such objects is more than this host's TCP send buffer can take
    in (net.ipv4.tcp_wmem: a server's send buffer starts at its default and grows up to its maximum): an
    answer that is never read then stays in flight in the server, whatever the host's network settings (CI,
    2026-12-03: 4 MiB bundles went wholly into a larger send buffer, so unread answers held no budget)."""
    try:
        most = max(int(n) for n in Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split())
    except (OSError, ValueError):
        most = 4 << 20
    return max(2 << 20, most)


def bundle_bytes_in_flight(server: Server) -> float:
    """The server's fa4_aot_bundle_bytes_in_flight gauge (its one worker's)."""
    with server.client("read") as c:
        text = c.get("/metrics").text
    return float(next(line.split()[-1] for line in text.splitlines()
                      if line.startswith("fa4_aot_bundle_bytes_in_flight ")))


def wait_for_bundle_bytes(server: Server, at_least: int, timeout: float = 60.0) -> float:
    """Wait until the server sends at least `at_least` bundle bytes at once (unread answers it admitted), rather
    than for a time that a loaded host may overrun; the gauge's value. AssertionError past `timeout`."""
    deadline = time.monotonic() + timeout
    while (found := bundle_bytes_in_flight(server)) < at_least:
        assert time.monotonic() < deadline, f"the server holds {found:.0f} bundle bytes in flight, not {at_least}"
        time.sleep(0.05)
    return found


def unread_bundle(server: Server, keys: list[str]) -> socket.socket:
    """A POST /v1/bundles of `keys` from 127.0.0.1 whose answer is never read (a small receive buffer, so the
    server's send fills it at once); the caller closes the socket."""
    body = json.dumps({"kernel_keys": keys}).encode()
    s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.sendall(f"POST /v1/bundles HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return s
