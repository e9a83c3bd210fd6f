"""Issue 28 (security round 4), the client's side of the transport: every request ends by its overall deadline
however slowly a server drips its status line or headers (D33); a strict miss's wait ends by its own deadline and
treats malformed answers as the server's failure (D34); `pull --model` refuses bad names and bounded-reads configs
(D43); and the round-3 leftovers (a bundle that lacks a library's bytes, an endless miss list). Servers are real
TCP listeners scripted byte by byte (raw_server.py); timings are only "returned within a generous bound vs hung"."""

from __future__ import annotations

import json
import socket
import threading
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fa4_aot.domain.misses import Miss
from fa4_aot.errors import Fa4AotError, RemoteError, Unreachable
from fa4_aot.remote import wait as build_wait
from fa4_aot.remote.http import Remote
from fa4_aot.store import Store
from tests.helpers.raw_server import RawServer, reply

pytestmark = pytest.mark.bad_input("server answers")
BOUND = 30.0  # seconds: "it returned" rather than "it hung", for deadlines of 2-3 s
DIGEST = "ab" * 32


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FA4_AOT_TRUSTED_KEYS", "FA4_AOT_REVOKED", "FA4_AOT_SHARED_CACHE", "FA4_AOT_SERVER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FA4_AOT_INSECURE", "1")


def finished(call: Callable[[], Any], bound: float = BOUND) -> tuple[bool, Any]:
    """Run `call` in a thread: (whether it returned or raised within `bound` seconds, its result or exception)."""
    out: list[Any] = [None]

    def run() -> None:
        try:
            out[0] = call()
        except BaseException as e:  # noqa: BLE001 - the test inspects what it raised
            out[0] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(bound)
    return not thread.is_alive(), out[0]


def dripping(prefix: bytes) -> RawServer:
    """A server that sends `prefix`, then one more byte of it every 0.3 s for as long as the client listens."""
    def answer(server: RawServer, conn: socket.socket) -> None:
        server.send(conn, prefix)
        while not server.stop.is_set():
            server.send(conn, b"a")
            time.sleep(0.3)

    holder: list[RawServer] = []
    server = RawServer(lambda path, conn: answer(holder[0], conn))
    holder.append(server)
    return server


CALLS: dict[str, Callable[[Remote, Store], Any]] = {
    "skus": lambda r, s: r.skus(),
    "object": lambda r, s: r.fetch_object(DIGEST, s),
    "bundle": lambda r, s: r.fetch_bundle(["cd" * 32], s),
    "recipe": lambda r, s: r.recipe("h200", "ef" * 32),
    "claim": lambda r, s: r.claim_build("b1", 60.0),
    "build": lambda r, s: r.build(1),
}


@pytest.mark.parametrize("prefix", [b"HTTP/1.1 2", b"HTTP/1.1 200 OK\r\nX-Drip: "], ids=["status", "headers"])
@pytest.mark.parametrize("call", sorted(CALLS))
def test_d33_a_dripping_status_line_or_header_ends_by_the_deadline(tmp_path: Path, call: str, prefix: bytes) -> None:
    """Before: httpx's read timeout bounds one recv, each drip restarted it, and the call hung for hours with
    FA4_AOT_FETCH_DEADLINE=2. Now the whole request, status line and headers included, ends by the deadline."""
    with dripping(prefix) as server:
        remote = Remote(server.url, deadline=2.0)
        done, result = finished(lambda: CALLS[call](remote, Store(tmp_path / "store")))
    assert done, f"{call} still hung {BOUND} s into a 2 s deadline"
    assert isinstance(result, Unreachable), result
    assert "FA4_AOT_FETCH_DEADLINE" in str(result), result


MISS = Miss(kernel_key="ab" * 32, family="f", compile_key=None, sku="h200", call={})
JOB = '"sku": "h200", "kernel_key": "' + "ab" * 32 + '", "family": "f"'  # the fields every build job names


def test_d34_build_wait_ends_by_its_own_deadline_against_a_slow_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: each request of the wait got the whole fetch deadline (60 s here): FA4_AOT_BUILD_WAIT=3 took a
    minute. Now each gets at most what is left of the wait's 3 s; the wait says why it did not help."""
    with dripping(b"HTTP/1.1 200 OK\r\nX-Drip: ") as server:
        remote = Remote(server.url, deadline=60.0)
        done, result = finished(lambda: build_wait.wait(remote, MISS, 3.0), bound=20.0)
    assert done, "wait() outlived FA4_AOT_BUILD_WAIT=3 by more than 17 s"
    job, why = result
    assert job is None and "refused the miss report" in why


def answers(miss_answer: bytes, build_answer: bytes = b"") -> RawServer:
    """A server answering POST /v1/misses with `miss_answer` and GET /v1/builds/... with `build_answer`."""
    holder: list[RawServer] = []

    def answer(path: str, conn: socket.socket) -> None:
        holder[0].send(conn, reply(200, build_answer if path.startswith("/v1/builds") else miss_answer))

    server = RawServer(answer)
    holder.append(server)
    return server


@pytest.mark.parametrize("job_id", ['"abc"', "NaN", "Infinity", "null", "[1]", "true", "-Infinity", "1e400"])
def test_d34_a_malformed_job_id_is_the_servers_failure_not_a_raise(job_id: str) -> None:
    """Before: int(job["id"]) raised ValueError, OverflowError or TypeError out of wait(), which is documented
    never to raise for the server. Now the wait returns why: the answer is not a build job (its id)."""
    body = f'{{"build": {{"id": {job_id}, "status": "queued", {JOB}}}}}'.encode()
    with answers(body) as server:
        done, result = finished(lambda: build_wait.wait(Remote(server.url, deadline=5.0), MISS, 2.0))
    assert done and not isinstance(result, BaseException), result
    _job, why = result
    assert "not a build job" in why and "id" in why


@pytest.mark.parametrize("answer", [b'{"id": "abc", "status": "queued"}', b"[1]", b'{"id": 7, "status": [1]}'])
def test_d34_a_malformed_build_answer_while_polling_is_the_servers_failure(answer: bytes) -> None:
    """A job queued well, then polled into an answer that is not a build job: the wait says so, never raises."""
    with answers(f'{{"build": {{"id": 7, "status": "queued", {JOB}}}}}'.encode(), answer) as server:
        done, result = finished(lambda: build_wait.wait(Remote(server.url, deadline=5.0), MISS, 2.0))
    assert done and not isinstance(result, BaseException), result
    assert result[1], "a malformed job was taken for a wait that helped"


def test_d34_a_wait_that_runs_out_does_not_mark_the_server_down() -> None:
    """The wait's own deadline cutting a request short is the caller's limit, not the server's failure: the same
    Remote still serves the fetch that follows."""
    with dripping(b"HTTP/1.1 200 OK\r\nX-Drip: ") as server:
        remote = Remote(server.url, deadline=60.0)
        done, _result = finished(lambda: build_wait.wait(remote, MISS, 1.0), bound=20.0)
    assert done and not remote.down, remote.down


def test_round3_a_bundle_that_lacks_a_librarys_bytes_stores_no_entry_naming_it(tmp_path: Path) -> None:
    """Before: the entry was stored with host_arch's library named, though no byte of that library came: the store
    held an entry naming an object it lacked. Now that kernel is reported skipped and no entry is stored."""
    from tests.remote.test_attack_client import entry_for

    store = Store(tmp_path / "store")
    data = b"cubin bytes"
    entry = entry_for(data)
    lib = "12" * 32
    doc = {**entry.published(), "shared_libs": {"x86_64": {"digest": lib, "size": 10}}}
    head = {"entries": [doc], "missing": [], "objects": [[entry.object_digest, len(data)]]}
    body = json.dumps(head).encode() + b"\n" + data
    with RawServer(lambda path, conn: conn.sendall(reply(200, body))) as server:
        remote = Remote(server.url, deadline=5.0)
        try:
            stored, skipped = remote.fetch_bundle([entry.kernel_key], store, host_arch="x86_64")
        except Fa4AotError as e:
            stored, skipped = [], {entry.kernel_key: str(e)}
    held = store.get_entry(entry.kernel_key)
    assert held is None or all(store.has_object(d) for d in held.lib_digests("x86_64")), held
    assert not stored and entry.kernel_key in skipped, (stored, skipped)


def test_round3_an_endless_miss_list_stops_far_below_the_old_cap() -> None:
    """Before: the pages were capped at 256 MiB of JSON in all, which a client parsed into about 810 MB before
    it stopped. Now it stops at MAX_MISSES (far lower) and each page is read with what is left of that bound."""
    page = json.dumps([{"sku": "h200", "kernel_key": "a" * 64, "family": "f", "compile_key": "x" * (16 << 10)}] * 1000)
    with RawServer(lambda path, conn: conn.sendall(reply(200, page.encode()))) as server:
        tracemalloc.start()
        try:
            with pytest.raises(RemoteError, match="MiB of misses"):
                Remote(server.url, deadline=60.0).misses()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peak < 160 << 20, f"the client held {peak >> 20} MiB reading a hostile miss list"


# -- D43: pull --model ----------------------------------------------------------------------------------------
def _pull(tmp_path: Path, server: RawServer, *args: str) -> Any:
    from click.testing import CliRunner

    from fa4_aot.cli import main

    return CliRunner().invoke(main, ["--cache-dir", str(tmp_path / "node"), "pull", "--server", server.url,
                                     "--sku", "h200", *args])


def _skus_server() -> RawServer:
    """A server holding SKU h200 with no kernel (a mirror of it fetches nothing and exits 0)."""
    def answer(path: str, conn: socket.socket) -> None:
        if path.startswith("/v1/skus/h200/manifest"):
            conn.sendall(reply(200, json.dumps({"sku": "h200", "kernels": []}).encode()))
        else:
            conn.sendall(reply(200, json.dumps([{"sku": "h200", "name": "h200"}]).encode()))

    return RawServer(answer)


@pytest.mark.parametrize("name", ["", "   ", "a" * 300, "x\0y"], ids=["empty", "blank", "long", "nul"])
def test_d43_pull_refuses_a_bad_model_name(tmp_path: Path, name: str) -> None:
    """Before: --model '' mirrored the whole SKU and exited 0; a name over 255 bytes ended in a traceback
    (ENAMETOOLONG from a filesystem check). Now each is a one-line error naming the fix, exit 1, nothing pulled."""
    with _skus_server() as server:
        result = _pull(tmp_path, server, "--model", name)
    assert result.exit_code == 1, (result.exit_code, result.output, result.exception)
    assert "model" in result.output and "Traceback" not in result.output, result.output
    assert "fa4-aot models" in result.output, result.output


def _config(tmp_path: Path, text: str) -> Path:
    folder = tmp_path / "m"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(text)
    return folder / "config.json"


@pytest.mark.parametrize("text", [
    "[" * 100_000 + "]" * 100_000,
    '{"num_attention_heads": 32, "hidden_size": 4096, "attn_logit_softcapping": Infinity}',
    '{"num_attention_heads": 32, "hidden_size": 4096, "attn_logit_softcapping": 1e400}',
    '{"num_attention_heads": NaN, "hidden_size": 4096}',
    '{"num_attention_heads": 32, "hidden_size": 4096, "x": ' + "[" * 5000 + "]" * 5000 + "}",
], ids=["deep", "infinity", "overflow", "nan", "deep-field"])
def test_d43_a_hostile_config_is_a_clear_error(tmp_path: Path, text: str) -> None:
    """Before: a deep config raised RecursionError, an Infinity softcap a traceback further on. Now ConfigError
    names the file and what is wrong."""
    from fa4_aot.errors import ConfigError
    from fa4_aot.matrix import models

    path = _config(tmp_path, text)
    with pytest.raises(ConfigError, match="config"):
        models.resolve(str(path))


def test_d43_a_config_that_never_ends_is_read_with_a_bound(tmp_path: Path) -> None:
    """Before: a config.json that is /dev/zero was read without end. Now at most MAX_CONFIG bytes are read."""
    from fa4_aot.errors import ConfigError
    from fa4_aot.matrix import models

    folder = tmp_path / "z"
    folder.mkdir()
    (folder / "config.json").symlink_to("/dev/zero")
    done, result = finished(lambda: models.resolve(str(folder)))
    assert done, "reading /dev/zero as config.json did not end"
    assert isinstance(result, ConfigError) and "config" in str(result), result


def test_d33_a_miss_report_to_a_dripping_server_ends_by_its_timeout() -> None:
    """Before: the best-effort miss report (httpx.post with a 2 s timeout per read) stayed on its thread as long as
    the server dripped headers. Now the report, too, ends by MISS_REPORT_TIMEOUT in all."""
    with dripping(b"HTTP/1.1 200 OK\r\nX-Drip: ") as server:
        before = set(threading.enumerate())
        Remote(server.url, deadline=60.0).report_miss(MISS)
        reports = [t for t in set(threading.enumerate()) - before if t.name == "fa4-aot-miss-report"]
        assert reports, "no miss report thread started"
        reports[0].join(BOUND)
        assert not reports[0].is_alive(), f"the miss report still ran {BOUND} s into its 2 s timeout"
