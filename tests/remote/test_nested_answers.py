"""A server's answer nested far deeper than any fa4-aot document (200,000 levels, or just past the bound) is the
server's failure at every client parse: one RemoteError naming the request, never a RecursionError that kills a
certifier or a builder or escapes a strict client's wait (remote/answers.py `parsed`). Servers are real TCP
listeners scripted byte by byte (raw_server.py)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fa4_aot.domain.misses import Miss
from fa4_aot.errors import RemoteError
from fa4_aot.remote import answers
from fa4_aot.remote import wait as build_wait
from fa4_aot.remote.http import Remote
from fa4_aot.store import Store
from fa4_aot.trust.policy import Trust
from tests.helpers.raw_server import RawServer, reply

pytestmark = pytest.mark.bad_input("server answers")
KEY = "ab" * 32
DEVICE = "nvidia-h200.132sm.driver-13.0.cuda-13.0"
MISS = Miss(kernel_key=KEY, family="f", compile_key=None, sku="h200", call={})
DEEP = b"[" * 200_000 + b"]" * 200_000
DEEP_OBJECT = b'{"a":' * 200_000 + b"1" + b"}" * 200_000
# past the bound (MAX_DEPTH passes, at most 128 levels), well within what json itself parses
JUST_PAST = b'{"manifests": ' + b"[" * 200 + b"]" * 200 + b"}"


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FA4_AOT_TRUSTED_KEYS", "FA4_AOT_REVOKED", "FA4_AOT_SHARED_CACHE", "FA4_AOT_SERVER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FA4_AOT_INSECURE", "1")
    monkeypatch.setenv("FA4_AOT_FETCH_DEADLINE", "10")


def answering(body: bytes, status: int = 200) -> RawServer:
    holder: list[RawServer] = []

    def answer(path: str, conn: socket.socket) -> None:
        holder[0].send(conn, reply(status, body))

    server = RawServer(answer)
    holder.append(server)
    return server


CALLS: dict[str, Callable[[Remote, Path], Any]] = {
    "skus": lambda r, _p: r.skus(),
    "kernel listing": lambda r, _p: r.manifest("h200"),
    "kernel keys": lambda r, _p: r.kernel_keys("h200"),
    "kernel entry": lambda r, _p: r.kernel(KEY),
    "miss list": lambda r, _p: r.misses(),
    "signed manifests": lambda r, _p: r.signed_manifests("h200"),
    "revocations": lambda r, _p: r.revocations(),
    "verdicts": lambda r, _p: r.verdicts(sku="h200"),
    "recipe listing": lambda r, _p: r.recipes("h200"),
    "token": lambda r, _p: r.whoami(),
    "miss report": lambda r, _p: r.request_build(MISS),
    "build job": lambda r, _p: r.build(1),
    "build jobs": lambda r, _p: r.builds(),
    "build claim": lambda r, _p: r.claim_build("builder", 60.0, ["h200"]),
    "certify claim": lambda r, _p: r.claim_certify("certifier", "h200", DEVICE, 60.0),
    "certify job": lambda r, _p: r.certify_job(1),
    "certify jobs": lambda r, _p: r.certify_jobs(kernel_key=KEY),
    "bundle head": lambda r, p: r.fetch_bundle([KEY], Store(p)),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("body", [DEEP, DEEP_OBJECT, JUST_PAST], ids=["deep-list", "deep-object", "just-past"])
@pytest.mark.parametrize("call", CALLS.values(), ids=CALLS.keys())
def test_a_deeply_nested_answer_is_a_remote_error_at_every_parse(tmp_path: Path, call: Callable[..., Any],
                                                                 body: bytes) -> None:
    with answering(body + (b"\n" if call is CALLS["bundle head"] else b"")) as server:
        remote = Remote(server.url, retries=0)
        with pytest.raises(RemoteError, match="nested"):
            call(remote, tmp_path)
        remote.close()


@pytest.mark.timeout(60)
def test_a_deeply_nested_error_answer_still_names_its_status(tmp_path: Path) -> None:
    with answering(DEEP, status=400) as server:
        remote = Remote(server.url, retries=0)
        with pytest.raises(RemoteError, match="-> 400"):
            remote.skus()
        remote.close()


@pytest.mark.timeout(60)
def test_a_strict_clients_wait_says_why_for_a_deeply_nested_answer() -> None:
    with answering(DEEP) as server:
        job, why = build_wait.wait(Remote(server.url, retries=0), MISS, 5.0)
    assert job is None and "refused the miss report" in why and "nested" in why


@pytest.mark.timeout(60)
def test_a_trusted_clients_start_survives_deeply_nested_manifests(tmp_path: Path) -> None:
    from fa4_aot.domain.skus import Sku

    sku = Sku("h200", "sm_90a", 132, 62914560, 13)
    with answering(DEEP) as server:
        trust = Trust(sku, Store(tmp_path), Remote(server.url, retries=0), {})
        assert trust.allowed() == {}
    assert any("nested" in why for why in trust.rejected), trust.rejected


def test_answers_of_ordinary_depth_parse() -> None:
    doc = b'{"manifests": [{"manifest": {"verdicts": {"k": {"d": {"calls": ["x"]}}}}}], "s": "[[[[[[[["}'
    assert answers.parsed(doc, "test")["s"] == "[[[[[[[["
    nested_in_a_string = b'["' + b"[" * 10_000 + b'"]'
    assert answers.parsed(nested_in_a_string, "test") == ["[" * 10_000]
    with pytest.raises(RemoteError, match="not JSON"):
        answers.parsed(b"<html>", "test")


@pytest.mark.timeout(60)
def test_a_certifier_survives_deeply_nested_claim_answers(tmp_path: Path) -> None:
    from tests.certify.test_certifier import Passing, certifier

    with answering(DEEP) as hostile:
        worker = certifier(hostile.url, "t", tmp_path, "cc-nested", Passing())
        worker.max_backoff = 0.2
        stop = threading.Event()
        thread = threading.Thread(target=worker.run, args=(stop,), daemon=True)
        thread.start()
        deadline = time.monotonic() + 20
        while hostile.connections < 3 and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        alive = thread.is_alive()
        stop.set()
        thread.join(10)
    assert alive and hostile.connections >= 3 and worker.done == 0, "the certifier died on a nested claim answer"
