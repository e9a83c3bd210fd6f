"""Certification verdicts over HTTP (issue 27), against a real uvicorn on SQLite and on PostgreSQL: publishing needs
a token of the kernel's SKU; the newest measurement wins; reads filter and page; malformed bodies are 422 and store
nothing; the metrics count them by status; the server writes them into its store (so `sign` there lists them) and
imports the verdict files written into its store directly."""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from typing import Any

import httpx
import pytest

from fa4_aot.domain.skus import Sku
from fa4_aot.domain.verdicts import Verdict
from fa4_aot.store import Store
from fa4_aot.trust import signing, signing_keys
from fa4_aot.trust.signing import Revocations
from service import db
from service.crud import tokens as crud_tokens
from tests.helpers.servers import H200, Launch, Server, kernel_doc, row_counts

B200 = {"sku": "b200", "arch": "sm_100a", "sm_count": 148, "l2_bytes": 132120576, "cuda_major": 13,
        "host": "x86-64-v3"}
H200_SKU = Sku(H200["sku"], H200["arch"], H200["sm_count"], H200["l2_bytes"], H200["cuda_major"], host=H200["host"])
DEV = "nvidia-h200.132sm.driver-13.0.cuda-13.0"
OTHER = "nvidia-h200.132sm.driver-12.8.cuda-12.8"


def held_kernel(server: Server, facts: dict[str, Any] = H200) -> str:
    """Publish a kernel of fresh random bytes (SKU `facts`); returns its key."""
    data = os.urandom(64)
    doc = kernel_doc(data, **facts)
    with server.client("admin") as c:
        assert c.put(f"/v1/objects/{doc['object_digest']}", content=data).status_code in (200, 201)
        assert c.post("/v1/kernels", json=doc).status_code == 201
    return str(doc["kernel_key"])


def verdict(key: str, status: str = "pass", device: str = DEV, **fields: Any) -> dict[str, Any]:
    if status == "wrong":
        fields = {"tensor": "dq", "error": 1.3, "bound": 0.02, **fields}
    doc = {"checks": 4, "calls": ["bwd dense bf16 d=72"], "toolchain": "4.0.0b36/4.8.1",
           "when": "2026-12-03T10:00:00Z", **fields}
    return Verdict(kernel_key=key, device=device, status=status, **doc).to_dict()


def token(server: Server, name: str, skus: list[str]) -> str:
    with db.session_for(server.db_url) as session:
        return crud_tokens.create_token(session, name=name, scope="publish", skus=skus)


def listed(server: Server, **query: Any) -> list[dict[str, Any]]:
    answer = httpx.get(f"{server.url}/v1/verdicts", params=query)
    assert answer.status_code == 200, answer.text
    return answer.json()  # type: ignore[no-any-return]


def post(server: Server, body: Any, bearer: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {bearer or server.tokens['publish']}"}
    return httpx.post(f"{server.url}/v1/verdicts", json=body, headers=headers)


def test_publishing_needs_a_token_of_the_kernels_sku(server: Server) -> None:
    h200, b200 = held_kernel(server), held_kernel(server, B200)
    mine, theirs = token(server, "certifier-h200", ["h200"]), token(server, "certifier-b200", ["b200"])
    body = [verdict(h200)]
    assert httpx.post(f"{server.url}/v1/verdicts", json=body).status_code == 401
    with server.client("read") as c:
        assert c.post("/v1/verdicts", json=body).status_code == 403
    refused = post(server, body, theirs)
    assert refused.status_code == 403 and "may publish only SKUs b200" in refused.json()["detail"]
    assert post(server, [verdict(h200), verdict(b200)], mine).status_code == 403  # all or nothing
    assert listed(server, kernel_key=h200) == [] and Store(server.cache_dir).verdicts(h200) == []
    first, again = post(server, body, mine), post(server, body, mine)
    assert (first.status_code, first.json()) == (201, {"stored": 1, "kept": 0})
    assert (again.status_code, again.json()) == (200, {"stored": 0, "kept": 1})
    assert Store(server.cache_dir).verdicts(h200) == [Verdict.from_dict(body[0])]
    [row] = listed(server, kernel_key=h200)
    assert row["sku"] == "h200" and row["publisher"] == "certifier-h200" and row["status"] == "pass"
    assert {k: row[k] for k in body[0]} == body[0]
    assert post(server, [verdict(b200, "crash", detail="illegal address")], theirs).status_code == 201


def test_the_newest_measurement_wins(server: Server) -> None:
    key = held_kernel(server)
    assert post(server, [verdict(key, when="2026-12-03T10:00:00Z")]).status_code == 201
    older = post(server, [verdict(key, "wrong", when="2026-12-01T10:00:00Z")])
    assert (older.status_code, older.json()) == (200, {"stored": 0, "kept": 1})
    assert [r["status"] for r in listed(server, kernel_key=key)] == ["pass"]
    newer = [verdict(key, "hang", when="2026-12-04T10:00:00Z"), verdict(key, "wrong", when="2026-12-05T10:00:00Z")]
    assert post(server, newer).json() == {"stored": 1, "kept": 1}  # within one request too, the newest
    [row] = listed(server, kernel_key=key)
    assert (row["status"], row["when"]) == ("wrong", "2026-12-05T10:00:00Z")
    assert [v.status for v in Store(server.cache_dir).verdicts(key)] == ["wrong"]


def test_a_verdict_of_a_kernel_the_server_lacks_is_409(server: Server) -> None:
    held, unknown = held_kernel(server), hashlib.sha256(os.urandom(8)).hexdigest()
    before = row_counts(server.db_url)
    answer = post(server, [verdict(held), verdict(unknown)])
    assert answer.status_code == 409
    assert unknown in answer.json()["detail"] and "publish those kernels first" in answer.json()["detail"]
    assert row_counts(server.db_url) == before and listed(server, kernel_key=held) == []


def test_reads_filter_and_page(server: Server) -> None:
    key, b200 = held_kernel(server), held_kernel(server, B200)
    devices = [DEV, OTHER, "nvidia-h200.132sm.driver-13.1.cuda-13.0"]
    post(server, [verdict(key, s, d) for s, d in zip(["pass", "wrong", "crash"], devices, strict=True)])
    post(server, [verdict(b200, "hang", "nvidia-b200.148sm.driver-13.0.cuda-13.0")])
    mine = listed(server, kernel_key=key)
    assert [r["device"] for r in mine] == sorted(devices)
    assert listed(server, kernel_key=key, limit=2) + listed(server, kernel_key=key, offset=2) == mine
    assert [r["device"] for r in listed(server, kernel_key=key, status="wrong")] == [OTHER]
    assert {r["kernel_key"] for r in listed(server, device=OTHER, limit=1000)} >= {key}
    assert all(r["sku"] == "h200" for r in listed(server, sku="h200", limit=1000))
    assert [r["kernel_key"] for r in listed(server, sku="b200", status="hang", limit=1000)].count(b200) == 1
    assert key not in {r["kernel_key"] for r in listed(server, sku="b200", limit=1000)}
    for bad in ({"status": "fine"}, {"kernel_key": "xyz"}, {"device": "h200"}, {"sku": "H200"}, {"limit": 0}):
        assert httpx.get(f"{server.url}/v1/verdicts", params=bad).status_code == 400, bad


def _key() -> str:
    return "a" * 64  # never held: a body that validation refuses never reaches the kernel check


BAD_BODIES = {
    "empty-list": [],
    "not-a-list": {"verdicts": []},
    "unknown-status": [{**verdict(_key()), "status": "fine"}],
    "bad-device": [{**verdict(_key()), "device": "h200"}],
    "bad-kernel-key": [{**verdict(_key()), "kernel_key": "../etc"}],
    "unknown-field": [{**verdict(_key()), "trusted": True}],
    "unknown-tensor": [{**verdict(_key()), "tensor": "q"}],
    "checks-a-string": [{**verdict(_key()), "checks": "4"}],
    "checks-negative": [{**verdict(_key()), "checks": -1}],
    "error-a-string": [{**verdict(_key()), "error": "big"}],
    "detail-too-long": [{**verdict(_key()), "detail": "x" * 2001}],
    "too-many-calls": [{**verdict(_key()), "calls": ["c"] * 101}],
    "when-not-a-time": [{**verdict(_key()), "when": "yesterday"}],
    "when-missing": [{k: v for k, v in verdict(_key()).items() if k != "when"}],
    "nul-in-detail": [{**verdict(_key()), "detail": "a\x00b"}],
    "too-many": [verdict(_key())] * 1001,
}


@pytest.mark.bad_input("verdict bodies")
@pytest.mark.parametrize("body", BAD_BODIES.values(), ids=BAD_BODIES.keys())
def test_malformed_verdicts_are_422_and_store_nothing(server: Server, body: Any) -> None:
    before = row_counts(server.db_url)
    answer = post(server, body)
    assert answer.status_code == 422, answer.text
    assert row_counts(server.db_url) == before


@pytest.mark.bad_input("verdict bodies")
def test_a_nan_error_and_an_oversized_body_are_refused(server: Server) -> None:
    key = held_kernel(server)
    nan = json.dumps([verdict(key, "wrong")]).replace("1.3", "NaN").encode()
    headers = {"Authorization": f"Bearer {server.tokens['publish']}", "Content-Type": "application/json"}
    assert httpx.post(f"{server.url}/v1/verdicts", content=nan, headers=headers).status_code == 422
    huge = json.dumps([verdict(key, detail="x" * 2000, device=f"gpu-{i}.132sm.driver-13.0.cuda-13.0")
                       for i in range(600)]).encode()
    assert len(huge) > 1 << 20
    assert httpx.post(f"{server.url}/v1/verdicts", content=huge, headers=headers).status_code == 413
    assert listed(server, kernel_key=key) == []


def gauge(server: Server, status: str) -> float:
    found = re.search(rf'^fa4_aot_verdicts\{{status="{status}"\}} ([\d.e+]+)$', httpx.get(f"{server.url}/metrics").text,
                      re.M)
    assert found, f"no fa4_aot_verdicts gauge for {status}"
    return float(found[1])


def test_metrics_count_verdicts_by_status(server: Server) -> None:
    before = {s: gauge(server, s) for s in ("pass", "wrong", "crash", "hang", "refused")}
    keys = [held_kernel(server) for _ in range(3)]
    post(server, [verdict(keys[0]), verdict(keys[1]), verdict(keys[2], "refused", detail="sm90-bwd-dq-hd72-80")])
    after = {s: gauge(server, s) for s in before}
    assert {s: after[s] - before[s] for s in before} == {"pass": 2, "wrong": 0, "crash": 0, "hang": 0, "refused": 1}


def test_sign_on_the_server_store_lists_published_verdicts(server: Server, tmp_path: Any) -> None:
    key = held_kernel(server)
    post(server, [verdict(key, "wrong"), verdict(key, device=OTHER)])
    private, public = signing_keys.generate(tmp_path / "keys", "server")
    envelope = signing.sign(signing.manifest_of(Store(server.cache_dir), H200_SKU), signing_keys.load_private(private))
    manifest = signing.verify(envelope, {public.key_id: public}, H200_SKU, Revocations())
    assert {d: v["status"] for d, v in manifest["verdicts"][key].items()} == {DEV: "wrong", OTHER: "pass"}
    with server.client("publish") as c:  # the server takes a manifest that lists verdicts
        assert c.put("/v1/skus/h200/manifests", json=envelope).status_code == 201
        assert envelope in c.get("/v1/skus/h200/manifests").json()["manifests"]


def wait_for(check: Any, what: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_verdict_files_written_into_the_store_are_imported(launch: Launch) -> None:
    server = launch(store_poll="0.2")
    key, store = held_kernel(server), Store(server.cache_dir)
    store.put_verdicts([Verdict.from_dict(verdict(key, "crash", detail="cudaErrorIllegalAddress"))])
    [row] = wait_for(lambda: listed(server, kernel_key=key), "the store follower to import the verdict")
    assert (row["status"], row["publisher"]) == ("crash", "import")
    server.kill()  # written while the server is down: imported at its start
    store.put_verdicts([Verdict.from_dict(verdict(key, "pass", OTHER))])
    store.put_verdicts([Verdict.from_dict(verdict("b" * 64))])  # a kernel the database lacks: left out
    server.start()
    assert [r["device"] for r in listed(server, kernel_key=key)] == sorted([DEV, OTHER])
    assert listed(server, kernel_key="b" * 64) == [] and gauge(server, "crash") == 1
