"""A server SIGKILLed in the middle of an upload leaves no object row, no object file and no kernel row;
after a restart on the same store and database the temp file is gone and a re-push succeeds. One killed
after the rename but before the commit leaves a file without a row, which publishing the kernel adopts."""

from __future__ import annotations

import hashlib
import os
import socket
import time

from fa4_aot.store import Store
from tests.helpers.servers import Launch, Server, kernel_doc, row_counts


def _start_upload(server: Server, digest: str, data: bytes, sent: int) -> socket.socket:
    """Open a PUT that declares all of `data` but sends only its first `sent` bytes."""
    s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    head = (f"PUT /v1/objects/{digest} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(data)}\r\n"
            f"Authorization: Bearer {server.tokens['publish']}\r\nContent-Type: application/octet-stream\r\n\r\n")
    s.sendall(head.encode() + data[:sent])
    return s


def _wait_for_temp(folder: os.PathLike[str], sent: int, timeout: float = 10.0) -> None:
    """Wait until the server has written the sent bytes into its temp file, so the kill lands mid-write."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        temps = list(os.scandir(folder)) if os.path.isdir(folder) else []
        if any(t.name.endswith(".tmp") and t.stat().st_size >= sent for t in temps):
            return
        time.sleep(0.02)
    raise AssertionError(f"the server wrote no {sent}-byte temp file in {folder} within {timeout}s")


def test_sigkill_mid_upload(launch: Launch) -> None:
    server: Server = launch()
    data = os.urandom(8 * 2**20)
    digest = hashlib.sha256(data).hexdigest()
    store = Store(server.cache_dir)
    folder = store.object_path(digest).parent
    sock = _start_upload(server, digest, data, sent=2**20)
    try:
        _wait_for_temp(folder, 2**20)
        server.kill()
    finally:
        sock.close()

    assert not store.has_object(digest)
    assert [p.name for p in folder.iterdir()] and all(p.name.endswith(".tmp") for p in folder.iterdir())
    server.start()  # same store, same database
    assert list(folder.iterdir()) == [], "startup should remove the dead upload's temp file"
    assert row_counts(server.db_url)["objects"] == 0 and row_counts(server.db_url)["kernels"] == 0
    doc = kernel_doc(data)
    with server.client("publish") as c:
        assert c.get(f"/v1/objects/{digest}").status_code == 404
        assert c.post("/v1/kernels", json=doc).status_code == 409
        assert c.get(f"/v1/kernels/{doc['kernel_key']}").status_code == 404
        assert c.put(f"/v1/objects/{digest}", content=data).status_code == 201
        assert c.post("/v1/kernels", json=doc).status_code == 201
        assert c.get(f"/v1/objects/{digest}").content == data
    assert store.read_object(digest) == data and store.get_entry(doc["kernel_key"]) is not None


def test_object_file_without_row_is_adopted_by_its_kernel(launch: Launch) -> None:
    """The file is in place (so HEAD says 200 and a pusher skips the upload) but its row never committed."""
    server: Server = launch()
    data, corrupt = os.urandom(4096), os.urandom(4096)
    doc, bad = kernel_doc(data), kernel_doc(corrupt)
    store = Store(server.cache_dir)
    store.put_object(data)
    store.object_path(bad["object_digest"]).parent.mkdir(parents=True, exist_ok=True)
    store.object_path(bad["object_digest"]).write_bytes(corrupt[::-1])  # a file whose bytes do not match its name
    with server.client("publish") as c:
        assert c.head(f"/v1/objects/{doc['object_digest']}").status_code == 200
        assert row_counts(server.db_url)["objects"] == 0
        assert c.post("/v1/kernels", json=bad).status_code == 409
        assert c.post("/v1/kernels", json=doc).status_code == 201
    with server.client("admin") as c:
        log = c.get("/v1/audit").json()["entries"]
    assert [(e["actor"], e["action"], e["target"]) for e in log[-2:]] == [
        ("test-publish", "object.create", doc["object_digest"]), ("test-publish", "kernel.create", doc["kernel_key"])]
    assert row_counts(server.db_url)["objects"] == 1 and store.get_entry(doc["kernel_key"]) is not None
