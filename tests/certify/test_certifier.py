"""The certifier loop (fa4_aot/certify/certifier.py) on CPU against a real server (SQLite and PostgreSQL): it claims a
job of its SKU, fetches the kernel, runs the certification (here one that needs no GPU: the GPU run is the
runner's, tested on the H200) and finishes the job with the verdicts; stopped mid-job it gives the job back at once;
a server that answers garbage is logged and claimed from again, never a crash (issue 28, D42, for certifiers)."""

from __future__ import annotations

import functools
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from fa4_aot.certify.certifier import Certifier
from fa4_aot.domain.skus import Sku
from fa4_aot.domain.verdicts import DeviceClass, Verdict
from fa4_aot.remote.http import Remote
from fa4_aot.store import Store
from tests.helpers.certifiers import DEVICE, facts, publish
from tests.helpers.raw_server import RawServer, reply
from tests.helpers.servers import Server


def sku_of(name: str) -> Sku:
    f = facts(name)
    return Sku(name, f["arch"], f["sm_count"], f["l2_bytes"], f["cuda_major"], host=f["host"])


class Passing:
    """A certification that passes every key it is given, once the kernels are in the store."""

    def ready(self, store: Store, sku: Sku, keys: list[str]) -> str:
        return "" if all(store.has_entry(k) for k in keys) else "not fetched"

    def __call__(self, store: Store, sku: Sku, keys: list[str]) -> list[Verdict]:
        return [Verdict(k, DEVICE, "pass", checks=3) for k in keys]


class Interrupted(Passing):
    def __call__(self, store: Store, sku: Sku, keys: list[str]) -> list[Verdict]:
        raise KeyboardInterrupt  # what SIGTERM becomes in the certifier's main thread (cli/stopping.py)


def certifier(url: str, token: str, store: Path, sku: str, certification: Any) -> Certifier:
    return Certifier(functools.partial(Remote, url, token=token), Store(store), sku_of(sku),
                     DeviceClass.parse(DEVICE), "cpu-test", lease=30, poll=0.1, certification=certification, settle=5)


@pytest.fixture(autouse=True)
def _insecure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FA4_AOT_TRUSTED_KEYS", raising=False)
    monkeypatch.setenv("FA4_AOT_INSECURE", "1")  # the test's kernels are unsigned


def test_a_job_is_claimed_fetched_certified_and_finished(server: Server, tmp_path: Path) -> None:
    with server.client("publish") as c:
        key = publish(c, "cc-pass")["kernel_key"]
    worker = certifier(server.url, server.tokens["publish"], tmp_path, "cc-pass", Passing())
    assert worker.run_one() and Store(tmp_path).has_entry(key)
    assert not worker.run_one()  # nothing else queued for its SKU
    with server.client() as c:
        job = c.get("/v1/certify-jobs", params={"kernel_key": key}).json()[0]
    assert (job["status"], job["verdict"], job["certifier"], job["device"]) == ("done", "pass", "cpu-test", DEVICE)


def test_a_stopped_certifier_gives_its_job_back(server: Server, tmp_path: Path) -> None:
    with server.client("publish") as c:
        key = publish(c, "cc-stop")["kernel_key"]
    worker = certifier(server.url, server.tokens["publish"], tmp_path, "cc-stop", Interrupted())
    with pytest.raises(KeyboardInterrupt):
        worker.run_one()
    with server.client() as c:
        job = c.get("/v1/certify-jobs", params={"kernel_key": key}).json()[0]
    assert (job["status"], job["attempts"]) == ("queued", 0) and "stopped" in job["detail"]


def test_garbage_answers_do_not_kill_the_certifier(tmp_path: Path) -> None:
    answers = [b'{"id": "abc", "sku": "h200"}', b"[1]", b"<html>proxy</html>", b'{"id": 1}']

    def handler(path: str, conn: Any) -> None:
        conn.sendall(reply(200, answers[min(hostile.connections, len(answers)) - 1]))

    with RawServer(handler) as hostile:
        worker = certifier(hostile.url, "t", tmp_path, "cc-garbage", Passing())
        stop = threading.Event()
        thread = threading.Thread(target=worker.run, args=(stop,), daemon=True)
        thread.start()
        deadline = time.monotonic() + 20
        while hostile.connections < len(answers) + 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.set()
        thread.join(10)
    assert not thread.is_alive() and hostile.connections > len(answers) and worker.done == 0
