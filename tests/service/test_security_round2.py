"""Issue 9 (security round 2), the service's side: each defect an outside attack found on `fa4-aot serve` has a
case named after it, against a real uvicorn over SQLite and PostgreSQL."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import threading
from pathlib import Path

import httpx
import pytest

from fa4_aot.store import Store
from service import db
from service.crud import tokens as crud_tokens
from service.limits import JSON_BODY_LIMIT, MANIFEST_BODY_LIMIT
from tests.helpers.servers import Launch, Server, kernel_doc, raw_request, row_counts

B200 = {"sku": "b200", "arch": "sm_100a", "sm_count": 148, "l2_bytes": 132120576, "cuda_major": 13}


def _token(server: Server, name: str, scope: str = "publish", skus: list[str] | None = None) -> str:
    with db.session_for(server.db_url) as session:
        return crud_tokens.create_token(session, name=name, scope=scope, skus=skus)


def _publish(c: httpx.Client, data: bytes, **overrides: object) -> dict[str, object]:
    doc = kernel_doc(data, **overrides)
    assert c.put(f"/v1/objects/{doc['object_digest']}", content=data).status_code in (200, 201)
    r = c.post("/v1/kernels", json=doc)
    assert r.status_code == 201, r.text
    return doc


def _nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.bad_input("HTTP")
def test_d1_sku_token_cannot_take_over_other_sku_kernel(server: Server) -> None:
    with server.client("publish") as c:
        victim = _publish(c, os.urandom(500), sku="d1-h200")
    b200_only = _token(server, "d1-b200-only", skus=["d1-b200", "d1-twin"])
    evil = os.urandom(500)
    digest = hashlib.sha256(evil).hexdigest()
    relabelled = {**victim, **B200, "sku": "d1-b200", "object_digest": digest, "size": len(evil)}
    twin = {**victim, "sku": "d1-twin", "object_digest": digest, "size": len(evil)}  # same facts, other name
    same_bytes = {**victim, "sku": "d1-twin"}
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {b200_only}"}, timeout=30) as c:
        assert c.put(f"/v1/objects/{digest}", content=evil).status_code == 201
        before = row_counts(server.db_url)
        answers = [c.post("/v1/kernels", json=doc) for doc in (relabelled, twin, same_bytes)]
    # the twins share d1-h200's facts, so its keys: refused before any key is looked at (issue 18, D20)
    assert [r.status_code for r in answers] == [422, 403, 403], [r.text for r in answers]
    assert "hash to" in answers[0].json()["detail"][0]["msg"] and "same facts" in answers[1].json()["detail"]
    assert row_counts(server.db_url)["kernels"] == before["kernels"]
    with server.client() as c:
        held = c.get(f"/v1/kernels/{victim['kernel_key']}").json()
        listed = c.get("/v1/skus/d1-h200/manifest").json()["kernels"]
    assert (held["sku"], held["object_digest"]) == ("d1-h200", victim["object_digest"])
    assert [k["kernel_key"] for k in listed] == [victim["kernel_key"]]
    entry = Store(server.cache_dir).get_entry(str(victim["kernel_key"]))
    assert entry is not None and entry.object_digest == victim["object_digest"]


@pytest.mark.bad_input("HTTP")
def test_d3_bad_miss_reports_cannot_break_the_miss_list(server: Server) -> None:
    with server.client("publish") as c:
        _publish(c, os.urandom(100), sku="d3")
    key = hashlib.sha256(b"d3-real").hexdigest()
    call = {"layout": "dense", "pass_": "fwd", "dtype": "bf16", "head_dim": 128, "head_dim_v": 128, "mask": "causal",
            "window": [-1, -1], "softcap": 0.0, "sink": False, "num_splits": 1, "batch": 2, "seqlen_q": 512,
            "seqlen_k": 512, "heads_q": 16, "heads_kv": 16, "page_size": 0}
    real = {"kernel_key": key, "sku": "d3", "family": "fwd", "compile_key": ["fwd", 128], "call": call}
    with server.client() as c:
        assert c.post("/v1/misses", json=real).status_code == 202
        deep = c.post("/v1/misses", json={**real, "kernel_key": "d" * 64, "compile_key": _nested(260)})
        extra = c.post("/v1/misses", json={**real, "call": {**call, "evil": 1}})
        record = {"format": 1, "entry": "FlashAttnFunc", "forward": {"causal": True}, "backward": None}
        bad_args = [c.post("/v1/misses", json={**real, "kernel_key": "e" * 64, "args": bad}) for bad in (
            {**record, "entry": "builtins.eval"}, {**record, "forward": {"q": {"tensor": "object"}}},
            {**record, "forward": {"q": [[[1]]]}}, {**record, "forward": {f"a{i}": i for i in range(65)}},
            {**record, "forward": {"v": {"same_as": "q"}}}, "not an object")]
        listed = c.get("/v1/misses")
    assert (deep.status_code, extra.status_code, listed.status_code) == (422, 422, 200), (deep.text, extra.text)
    assert [r.status_code for r in bad_args] == [422] * 6, [r.text for r in bad_args]
    mine = [m for m in listed.json() if m["kernel_key"] == key]
    assert len(mine) == 1 and mine[0]["call"] == {**call, "window": [-1, -1]} and mine[0]["count"] == 1
    with server.client("read") as c:
        assert c.delete(f"/v1/misses/{key}").status_code == 403
    with server.client("admin") as c:
        assert c.delete(f"/v1/misses/{key}").status_code == 204
        assert all(m["kernel_key"] != key for m in c.get("/v1/misses").json())


@pytest.mark.bad_input("HTTP")
def test_d4_miss_reports_are_bounded(server: Server) -> None:
    with server.client("publish") as c:
        _publish(c, os.urandom(100), sku="d4")
    doc = {"kernel_key": "4" * 64, "sku": "d4", "family": "fwd", "compile_key": ["x" * 200_000]}
    with server.client() as c:
        before = row_counts(server.db_url)
        big = c.post("/v1/misses", json=doc)
        unknown = c.post("/v1/misses", json={**doc, "sku": "d4-nowhere", "compile_key": [1]})
        huge_key = c.post("/v1/misses", json={**doc, "compile_key": ["x" * 40_000]})
        after = row_counts(server.db_url)
        for n in range(3):
            assert c.post("/v1/misses", json={**doc, "kernel_key": f"{n}" * 64, "compile_key": [n]}).status_code == 202
        page = c.get("/v1/misses", params={"limit": 2})
        rest = c.get("/v1/misses", params={"limit": 2, "offset": 2})
        too_many = c.get("/v1/misses", params={"limit": 100_000})
    assert (big.status_code, unknown.status_code, huge_key.status_code) == (413, 404, 422)
    assert after["misses"] == before["misses"]
    assert len(page.json()) == 2 and len(rest.json()) >= 1 and too_many.status_code == 400
    assert not {m["kernel_key"] for m in page.json()} & {m["kernel_key"] for m in rest.json()}


@pytest.mark.bad_input("HTTP")
def test_d9_publish_writes_store_before_row(launch: Launch) -> None:
    old = os.umask(0o002)  # (a) a server started under umask 002
    try:
        server = launch()
    finally:
        os.umask(old)
    with server.client("publish") as c:
        good = _publish(c, os.urandom(300), sku="d9")
        gone_data = os.urandom(300)
        gone = kernel_doc(gone_data, sku="d9")
        assert c.put(f"/v1/objects/{gone['object_digest']}", content=gone_data).status_code == 201
        Store(server.cache_dir).remove_object(str(gone["object_digest"]))  # (b) a gc on the server's store
        deep_data = os.urandom(300)
        deep = kernel_doc(deep_data, sku="d9", compile_key=_nested(300))  # (c)
        c.put(f"/v1/objects/{deep['object_digest']}", content=deep_data)
        before = row_counts(server.db_url)
        answers = [c.post("/v1/kernels", json=doc) for doc in (gone, deep)]
        listed = [k["kernel_key"] for k in c.get("/v1/skus/d9/manifest").json()["kernels"]]
    assert [r.status_code for r in answers] == [409, 422], [r.text for r in answers]
    assert "upload it again" in answers[0].json()["detail"]
    assert row_counts(server.db_url) == before and listed == [good["kernel_key"]]
    store = Store(server.cache_dir)
    assert store.get_entry(str(good["kernel_key"])) is not None
    assert store.get_entry(str(gone["kernel_key"])) is None and store.get_entry(str(deep["kernel_key"])) is None


@pytest.mark.bad_input("HTTP")
def test_d10_concurrent_publishes_of_one_key_agree(launch: Launch) -> None:
    server = launch()
    objects = [os.urandom(200) for _ in range(12)]
    with server.client("publish") as c:
        for data in objects:
            assert c.put(f"/v1/objects/{hashlib.sha256(data).hexdigest()}", content=data).status_code == 201
    for trial in range(6):
        pair = objects[2 * trial: 2 * trial + 2]
        base = kernel_doc(pair[0], sku="d10", compile_key=["d10", trial])
        docs = [{**base, "object_digest": hashlib.sha256(d).hexdigest()} for d in pair]
        codes: list[int] = []
        barrier = threading.Barrier(2)

        def post(doc: dict[str, object], codes: list[int] = codes, barrier: threading.Barrier = barrier) -> None:
            with server.client("publish") as c:
                barrier.wait()
                codes.append(c.post("/v1/kernels", json=doc).status_code)

        threads = [threading.Thread(target=post, args=(doc,)) for doc in docs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(codes) == [201, 409], codes
        with server.client() as c:
            served = c.get(f"/v1/kernels/{base['kernel_key']}").json()["object_digest"]
        entry = Store(server.cache_dir).get_entry(str(base["kernel_key"]))
        assert entry is not None and entry.object_digest == served
    server.kill()
    server.start()  # the startup import agrees with what was served
    with server.client() as c:
        for trial in range(6):
            key = kernel_doc(objects[2 * trial], sku="d10", compile_key=["d10", trial])["kernel_key"]
            entry = Store(server.cache_dir).get_entry(str(key))
            assert entry is not None and c.get(f"/v1/kernels/{key}").json()["object_digest"] == entry.object_digest


@pytest.mark.bad_input("store")
def test_d12_planted_links_folders_and_modes_are_refused(launch: Launch) -> None:
    server = launch()
    with server.client("publish") as c:
        doc = _publish(c, os.urandom(300), sku="d12")
    root = server.cache_dir
    secret = root.parent / "secret"
    secret.write_bytes(b"not a kernel")
    link_digest, dir_digest = "5" * 64, "6" * 64
    (root / "objects" / "55").mkdir(mode=0o700)
    (root / "objects" / "55" / link_digest[2:]).symlink_to(secret)
    (root / "objects" / "66").mkdir(mode=0o700)
    (root / "objects" / "66" / dir_digest[2:]).mkdir()
    with server.client() as c:
        link = [c.get(f"/v1/objects/{link_digest}"), c.head(f"/v1/objects/{link_digest}")]
        folder = [c.get(f"/v1/objects/{dir_digest}"), c.head(f"/v1/objects/{dir_digest}")]
    assert all(r.status_code == 400 for r in link + folder), [r.status_code for r in link + folder]
    assert b"not a kernel" not in link[0].content
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (root / "objects", root / "index")}
    obj = Store(root).object_path(str(doc["object_digest"]))
    assert modes == {"objects": 0o700, "index": 0o700} and stat.S_IMODE(obj.stat().st_mode) == 0o600
    if server.db_url.startswith("sqlite:///"):
        assert stat.S_IMODE(Path(server.db_url.removeprefix("sqlite:///")).stat().st_mode) == 0o600
    fanout = Store(root).entry_path(str(doc["kernel_key"])).parent
    fanout.chmod(0o777)  # another user could now swap the entry in it
    with server.client() as c:
        refused = c.get(f"/v1/kernels/{doc['kernel_key']}")
    with pytest.raises(Exception, match="can be changed by users"):
        Store(root).get_entry(str(doc["kernel_key"]))
    assert refused.status_code == 404  # kernel reads go through the store, which refuses the entry (issue 18, D29)
    (root / "manifests").mkdir(exist_ok=True)
    elsewhere = root.parent / "elsewhere"
    elsewhere.mkdir()
    (root / "manifests" / "d12").symlink_to(elsewhere)
    with pytest.raises(Exception, match="symlink"):
        Store(root).put_manifest("d12", "7" * 64, b"{}")
    assert list(elsewhere.iterdir()) == []
    linked = root.parent / "linked-store"
    linked.mkdir(mode=0o700)
    (linked / "manifests").symlink_to(elsewhere)  # the whole manifests/ folder a link
    for touch in (lambda: Store(linked).manifests("d12"), lambda: Store(linked).put_manifest("d12", "7" * 64, b"{}")):
        with pytest.raises(Exception, match="refusing symlink"):
            touch()
    assert list(elsewhere.iterdir()) == []


@pytest.mark.bad_input("HTTP")
def test_d13_deep_or_chunked_oversized_json_is_refused_cleanly(server: Server) -> None:
    with server.client("publish") as c:
        _publish(c, os.urandom(100), sku="d13")
    deep = ('{"format": "fa4-aot-manifest/1", "manifest": ' + "[" * 995 + "1" + "]" * 995 + "}").encode()
    before = row_counts(server.db_url)
    status, payload = raw_request(server, "PUT", "/v1/skus/d13/manifests", body=deep,
                                  headers={"Authorization": f"Bearer {server.tokens['publish']}",
                                           "Content-Type": "application/json"})
    assert status in (400, 422) and json.loads(payload)["detail"], (status, payload)

    def chunks(limit: int) -> object:  # 100 KiB chunks, one more than fit under `limit`
        for _ in range(limit // (100 << 10) + 1):
            yield b" " * (100 << 10)

    with server.client("publish") as c:
        chunked = c.post("/v1/kernels", content=chunks(JSON_BODY_LIMIT), headers={"Content-Type": "application/json"})
        chunked_manifest = c.put("/v1/skus/d13/manifests", content=chunks(MANIFEST_BODY_LIMIT),
                                 headers={"Content-Type": "application/json"})
    assert (chunked.status_code, chunked_manifest.status_code) == (413, 413)
    assert row_counts(server.db_url) == before


@pytest.mark.bad_input("HTTP")
def test_d14_manifest_flood_is_bounded(server: Server, tmp_path: Path) -> None:
    from fa4_aot.trust import signing, signing_keys

    with server.client("publish") as c:
        doc = _publish(c, os.urandom(100), sku="d14")
    facts = {k: doc[k] for k in ("arch", "sm_count", "l2_bytes", "cuda_major", "host")}
    key = signing_keys.load_private(signing_keys.generate(tmp_path, "flood")[0])

    def envelope(kernels: dict[str, object], n: int, **extra: object) -> dict[str, object]:
        manifest = {"sku": {"name": "d14", **facts}, "kernels": kernels, "toolchain": {},
                    "expires": "2099-01-01T00:00:00Z", "created": f"2026-01-01T00:{n // 60:02d}:{n % 60:02d}Z", **extra}
        return signing.sign(manifest, key)

    listed = {doc["kernel_key"]: doc["object_digest"]}
    with server.client("publish") as c:
        empty = c.put("/v1/skus/d14/manifests", json=envelope({}, 0))
        padded = c.put("/v1/skus/d14/manifests", json=envelope(listed, 1, padding="x" * 500_000))
        stored = [c.put("/v1/skus/d14/manifests", json=envelope(listed, n)).status_code for n in range(2, 22)]
        other_keys = [signing_keys.load_private(signing_keys.generate(tmp_path, f"k{n}")[0]) for n in range(9)]
        by_key = [c.put("/v1/skus/d14/manifests", json=signing.sign(
            envelope(listed, 30 + n)["manifest"], k)).status_code  # type: ignore[arg-type]
            for n, k in enumerate(other_keys)]
        served = c.get("/v1/skus/d14/manifests").json()["manifests"]
    with server.client("admin") as c:
        by_admin = c.put("/v1/skus/d14/manifests", json=signing.sign(envelope(listed, 50)["manifest"],
                                                                      other_keys[-1]))  # type: ignore[arg-type]
    assert (empty.status_code, padded.status_code) == (422, 422), (empty.text, padded.text)
    assert set(stored) == {201} and by_key == [201] * 7 + [429, 429] and by_admin.status_code == 201
    assert len(served) == 4 + 7  # the newest 4 of the flooding key, one of each other key
