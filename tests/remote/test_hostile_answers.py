"""Issue 18 (security round 3), the client's side: answers a broken or hostile server sends with a 200 (bundles
with impossible sizes, floods, HTML pages, documents missing fields) end in one clean RemoteError that names the
server and what was wrong, never a hang, a raw decode or key error, or gigabytes held in memory; plus the cheap
client fixes of "Also seen". Servers are real TCP listeners scripted byte by byte (raw_server.py)."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from fa4_aot.client.installation import Installation
from fa4_aot.errors import RemoteError, TrustError
from fa4_aot.remote.http import Remote
from fa4_aot.runtime.fetch import Fetcher
from fa4_aot.store import Store
from fa4_aot.trust.policy import Trust
from tests.conftest import ROOT
from tests.helpers.raw_server import RawServer, reply
from tests.remote.test_attack_client import H200, entry_for

pytestmark = pytest.mark.bad_input("server answers")
MIB = 1 << 20
MAX_REVOCATIONS, MAX_MISSES = 4 * MIB, 32 * MIB  # remote/endpoints.py's caps, as the error messages name them


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FA4_AOT_TRUSTED_KEYS", "FA4_AOT_REVOKED", "FA4_AOT_SHARED_CACHE", "FA4_AOT_SERVER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FA4_AOT_INSECURE", "1")  # the bytes, not the trust policy, are under test here
    monkeypatch.setenv("FA4_AOT_FETCH_DEADLINE", "10")


def serving(answer: Callable[[RawServer, str, socket.socket], None]) -> RawServer:
    """A RawServer whose handler is `answer(server, path, conn)`."""
    holder: list[RawServer] = []
    server = RawServer(lambda path, conn: answer(holder[0], path, conn))
    holder.append(server)
    return server


def answering(body: bytes, content_type: str = "application/json") -> RawServer:
    """A server that answers every request 200 with `body`."""
    return serving(lambda server, path, conn: server.send(conn, reply(200, body, content_type)))


def streaming(piece: bytes, total: int, start: bytes = b"", end: bytes = b"") -> Callable[..., None]:
    """An answer of `start`, then `piece` repeated to about `total` bytes, then `end`, sent as it is made (the
    server never holds it): the client must hang up long before a flood is through."""
    def answer(server: RawServer, path: str, conn: socket.socket) -> None:
        count = max(0, total - len(start) - len(end)) // len(piece)
        server.send(conn, reply(200, b"", length=len(start) + count * len(piece) + len(end)) + start)
        block = piece * max(1, (1 << 20) // len(piece))
        for _ in range(count // (len(block) // len(piece))):
            server.send(conn, block)
        server.send(conn, piece * (count % (len(block) // len(piece))) + end)

    return answer


def bundle(head: dict[str, object], data: bytes = b"") -> bytes:
    return json.dumps(head).encode() + b"\n" + data


# -- D18 ------------------------------------------------------------------------------------------------------
@pytest.mark.timeout(30)
@pytest.mark.parametrize("size", [-1, -(1 << 40), 1.5, "40", None, True])
def test_d18_negative_bundle_size_is_a_clean_error_not_a_hang(tmp_path: Path, size: object) -> None:
    data = os.urandom(40)
    entry = entry_for(data)
    unwanted = "e" * 64  # read past, never stored: where a negative size used to spin forever
    head = {"entries": [entry.__dict__], "missing": [], "objects": [[unwanted, size], [entry.object_digest, 40]]}
    store = Store(tmp_path / "cache")
    with answering(bundle(head, data), "application/octet-stream") as server:
        with pytest.raises(RemoteError, match=f"{server.url}.*size"):
            Remote(server.url, retries=0).fetch_bundle([entry.kernel_key], store)
    assert not store.has_object(entry.object_digest) and not store.has_entry(entry.kernel_key)


# -- D22 ------------------------------------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_d22_revocation_list_is_capped(tmp_path: Path) -> None:
    flood = 64 << 20
    answer = streaming(b'"0123456789abcdef",', flood, start=b'{"manifests": [], "keys": [', end=b'"0"]}')
    with serving(answer) as server:
        with pytest.raises(RemoteError, match=f"{server.url}/v1/revocations .*more than {MAX_REVOCATIONS >> 20} MiB"):
            Remote(server.url, retries=0).revocations()
    assert server.sent < flood // 2  # the client hung up soon after the cap


@pytest.mark.timeout(60)
def test_d22_recipe_answer_is_capped(tmp_path: Path) -> None:
    flood = 64 << 20
    with serving(streaming(b" ", flood, start=b"{", end=b"}")) as server:
        with pytest.raises(RemoteError, match="more than 8 MiB"):
            Remote(server.url, retries=0).recipe("h200", "a" * 64)
    assert server.sent < flood // 2


@pytest.mark.timeout(120)
def test_d22_miss_pages_that_never_end_are_capped() -> None:
    """A server that answers every page full: the client stops at MAX_MISSES bytes in all. (Before the cap it
    paged forever; this server gives up after twice the cap so that a failing run ends.)"""
    page = json.dumps([{"sku": "h200", "kernel_key": "a" * 64, "family": "f", "compile_key": "x" * (16 << 10)}] * 1000)

    def answer(server: RawServer, path: str, conn: socket.socket) -> None:
        body = page.encode() if server.sent < 2 * MAX_MISSES else b"[]"
        server.send(conn, reply(200, body))

    with serving(answer) as server:
        with pytest.raises(RemoteError, match=f"more than {MAX_MISSES >> 20} MiB of misses"):
            Remote(server.url, retries=0).misses()
        assert server.sent < MAX_MISSES + 2 * len(page)


# -- D24 ------------------------------------------------------------------------------------------------------
HTML = b"<html>\n<body>Sign in to the proxy</body>\n</html>\n"


@pytest.mark.filterwarnings("ignore:FA4_AOT_INSECURE=1")
def test_d24_html_page_is_a_clean_error_for_the_lean_fetcher_and_fetch_many(tmp_path: Path) -> None:
    entry = entry_for(os.urandom(40))
    store = Store(tmp_path / "cache")
    insecure = Trust(H200, store, None, {}, insecure=True)
    with answering(HTML, "text/html") as server:
        fetcher = Fetcher(Remote(server.url, retries=0), insecure, store)
        assert fetcher.kernels([entry.kernel_key]) == 0
        assert server.url in fetcher.error and "not JSON" in fetcher.error, fetcher.error
    with answering(HTML, "text/html") as server:
        inst = Installation(sku=H200, store=store, mode="strict", trace=[], trust=insecure, tools={},
                            remote=Remote(server.url, retries=0))
        assert inst.fetch_many([entry.kernel_key]) == 0
        assert server.url in inst.remote_error and "not JSON" in inst.remote_error, inst.remote_error


def _entry_doc(**changes: object) -> dict[str, object]:
    doc = dict(entry_for(b"payload").__dict__)
    for field, value in changes.items():
        if value is KeyError:
            del doc[field]
        else:
            doc[field] = value
    return doc


BAD_HEADS = {
    "not-an-object": [1, 2],
    "no-objects": {"entries": [], "missing": []},
    "entry-not-an-object": {"entries": ["kernel"], "missing": [], "objects": []},
    "entry-missing-a-field": {"entries": [_entry_doc(object_digest=KeyError)], "missing": [], "objects": []},
    "entry-size-not-an-integer": {"entries": [_entry_doc(size="big")], "missing": [], "objects": []},
    "object-not-a-pair": {"entries": [], "missing": [], "objects": [{"digest": "a" * 64}]},
}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("head", BAD_HEADS.values(), ids=BAD_HEADS.keys())
def test_d24_malformed_bundle_head_is_a_clean_error(tmp_path: Path, head: object) -> None:
    store = Store(tmp_path / "cache")
    with answering(json.dumps(head).encode() + b"\n", "application/octet-stream") as server:
        with pytest.raises(RemoteError, match=f"{server.url}/v1/bundles"):
            Remote(server.url, retries=0).fetch_bundle([entry_for(b"payload").kernel_key], store)
    assert list(store.entries()) == []


BAD_ENTRIES = {
    "size-not-an-integer": _entry_doc(size="big"),
    "size-negative": _entry_doc(size=-3),
    "digest-missing": _entry_doc(object_digest=KeyError),
    "digest-not-hex": _entry_doc(object_digest="../../etc/passwd"),
    "libraries-not-objects": _entry_doc(shared_libs={"x86_64": "lib.so"}),
}


@pytest.mark.parametrize("doc", BAD_ENTRIES.values(), ids=BAD_ENTRIES.keys())
def test_d24_malformed_kernel_entry_is_a_clean_error(tmp_path: Path, doc: dict[str, object]) -> None:
    store = Store(tmp_path / "cache")
    with answering(json.dumps(doc).encode()) as server:
        with pytest.raises(RemoteError, match=f"{server.url}/v1/kernels/{doc['kernel_key']}.*not a kernel entry"):
            Remote(server.url, retries=0).fetch_kernel(str(doc["kernel_key"]), store, arches=lambda e: ["x86_64"])
    assert list(store.entries()) == []


BAD_LISTINGS = {"html": HTML, "kernels-missing": b"{}", "kernels-not-a-list": b'{"kernels": "all"}',
                "item-without-key": b'{"kernels": [{"size": 3}]}', "item-not-an-object": b'{"kernels": [7]}'}


@pytest.mark.parametrize("body", BAD_LISTINGS.values(), ids=BAD_LISTINGS.keys())
def test_d24_malformed_kernel_listing_is_a_clean_error(body: bytes) -> None:
    """What `build --push` asks the server (Remote.kernel_keys), and what `pull` mirrors (Remote.manifest)."""
    with answering(body) as server:
        for ask in (Remote.kernel_keys, Remote.manifest):
            with pytest.raises(RemoteError, match=server.url):
                ask(Remote(server.url, retries=0), "h200")


@pytest.mark.parametrize("items", [[1, "x", None], [{"sku": "h200"}]], ids=["not-objects", "fields-missing"])
def test_d24_malformed_miss_list_is_a_clean_error_for_build_from_misses(tmp_path: Path, items: list[object]) -> None:
    with answering(json.dumps(items).encode()) as server:
        env = {**os.environ, "FA4_AOT_CACHE": str(tmp_path / "cache")}
        out = subprocess.run([sys.executable, "-m", "fa4_aot", "build", "--from-misses", "--server", server.url],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert f"{server.url}/v1/misses" in out.stderr and "not a miss" in out.stderr, out.stderr[-2000:]


# -- Also seen ------------------------------------------------------------------------------------------------
def test_fetch_kernel_refuses_an_entry_for_a_key_it_did_not_ask_for(tmp_path: Path) -> None:
    asked, planted = entry_for(os.urandom(40)), entry_for(data := os.urandom(40))

    def answer(server: RawServer, path: str, conn: socket.socket) -> None:
        if path.startswith("/v1/kernels/"):
            server.send(conn, reply(200, json.dumps(planted.__dict__).encode()))
        else:
            server.send(conn, reply(200, data, "application/octet-stream"))

    store = Store(tmp_path / "cache")
    with serving(answer) as server:
        with pytest.raises(RemoteError, match=planted.kernel_key):
            Remote(server.url, retries=0).fetch_kernel(asked.kernel_key, store)
    assert list(store.entries()) == []


def test_missing_revocation_file_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "revoked.txt"
    monkeypatch.setenv("FA4_AOT_REVOKED", str(missing))
    with pytest.raises(TrustError, match=f"cannot read FA4_AOT_REVOKED={missing}.*unset it"):
        Trust.from_env(H200, Store(tmp_path / "cache"), None)


def test_keys_generate_makes_its_folder_owner_only_under_umask_000(tmp_path: Path) -> None:
    folder = tmp_path / "keys" / "build"
    script = f"import os, sys; os.umask(0); sys.argv = ['fa4-aot', 'keys', 'generate', '--out', {str(folder)!r}]; " \
             "from fa4_aot.cli import main; main()"
    subprocess.run([sys.executable, "-c", script], cwd=ROOT, check=True, capture_output=True, timeout=120)
    for made in (folder, folder.parent):
        assert stat.S_IMODE(made.stat().st_mode) == 0o700, oct(made.stat().st_mode)
