"""The lean runtime's libraries and recipe files on a real server (SQLite and PostgreSQL): `fa4-aot push`
publishes each entry's linked libraries (and the runtime libraries they need) and the SKU's recipe files, `pull`
brings them back byte for byte; a published library is immutable (shared_libs is not part of the kernel key);
recipe files are validated JSON, size-capped, filed under keys the server recomputes, newest wins."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from fa4_aot.domain import kernel_keys
from fa4_aot.domain.skus import Sku
from fa4_aot.remote import push_pull
from fa4_aot.remote.http import Remote
from fa4_aot.store import Entry, Store
from fa4_aot.store import recipes as recipe_store
from fa4_aot.trust.policy import Trust
from tests.helpers.servers import H200, Launch, Server, kernel_doc

SKU = Sku("h200", H200["arch"], H200["sm_count"], H200["l2_bytes"], H200["cuda_major"])


def lean_store(root: Path, kernels: int = 2) -> tuple[Store, list[Entry], dict[str, bytes]]:
    """A build store with `kernels` entries, each with an x86_64 library needing one shared runtime library,
    and two recipe files of SKU: (store, entries, {recipe key: bytes})."""
    store = Store(root)
    runtime = store.put_object(os.urandom(3000))
    entries = []
    for _ in range(kernels):
        data, lib = os.urandom(2000), os.urandom(1000)
        digest, lib_digest = store.put_object(data), store.put_object(lib)
        doc = {k: v for k, v in kernel_doc(data).items() if k in Entry.__dataclass_fields__}
        libs = {"x86_64": {"digest": lib_digest, "size": len(lib),
                           "needs": {"libtvm_ffi.so": "", "libcute_dsl_runtime.so": runtime}}}
        entry = Entry(**{**doc, "object_digest": digest}, shared_libs=libs)
        store.put_entry(entry)
        entries.append(entry)
    return store, entries, {key: data for key, data in (recipe_file(store, n) for n in range(2))}


def region(signature: dict[str, Any], note: str = "") -> dict[str, Any]:
    """The smallest region recipe_format admits: no steps, the slots the runtime reads (q, k, v in, out and
    lse out), `note` in its toolchain (so files differ)."""
    return {"format": 1, "signature": signature, "guards": [], "inputs": {"q": 0, "k": 1, "v": 2}, "tensors": 4,
            "meta": [[[1], [1], {"dtype": "bfloat16"}]] * 4, "fwd": [], "bwd": [], "outputs": {"out": 3, "lse": None},
            "kernels": [], "softmax_scale": 0.125, "toolchain": {"note": note}}


def recipe_file(store: Store, n: int, extra: str = "") -> tuple[str, bytes]:
    signature: dict[str, Any] = {"layout": "dense", "head_dim": 64 * (n + 1), "causal": True}
    key = recipe_store.file_key(signature, SKU.target_facts())
    data = json.dumps({"key": key, "regions": [region(signature, extra)]}).encode()
    store.put_recipes(key, data)
    return key, data


def insecure(store: Store, remote: Remote) -> Trust:
    return Trust(SKU, store, remote, {}, insecure=True)


def test_push_sends_libraries_and_recipes_and_pull_restores_them_digest_for_digest(
        launch: Launch, tmp_path: Path) -> None:
    build, entries, recipes = lean_store(tmp_path / "build")
    server = launch()
    pushed = push_pull.push(build, Remote(server.url, token=server.tokens["publish"]), "h200")
    assert pushed.failures == [] and pushed.recipes == 2
    with server.client("read") as c:
        assert c.get(f"/v1/kernels/{entries[0].kernel_key}").json()["shared_libs"] == entries[0].shared_libs
    gpu = Store(tmp_path / "gpu")
    remote = Remote(server.url)
    pulled = push_pull.pull(gpu, remote, "h200", trust=insecure(gpu, remote))
    assert pulled.failures == [] and pulled.fetched == 2 and pulled.recipes == 2
    for entry in entries:
        assert gpu.get_entry(entry.kernel_key) == entry
        for digest in entry.lib_digests("x86_64"):
            assert gpu.read_object(digest) == build.read_object(digest)
    assert {k: gpu.recipes(k) for k in recipes} == recipes
    again = push_pull.push(build, Remote(server.url, token=server.tokens["publish"]), "h200")
    assert again.recipes == 0 and again.objects_sent == 0  # nothing new: the server holds these bytes


def _publish(c: Any, store: Store, entry: Entry) -> Any:
    for digest in {entry.object_digest, *(d for a in entry.shared_libs for d in entry.lib_digests(a))}:
        assert c.put(f"/v1/objects/{digest}", content=store.read_object(digest)).status_code in (200, 201)
    return c.post("/v1/kernels", json=entry.published())


def test_d15_a_published_library_cannot_be_swapped_but_another_arch_can_be_added(server: Server,
                                                                                  tmp_path: Path) -> None:
    store, [entry], _ = lean_store(tmp_path, kernels=1)
    other = store.put_object(os.urandom(1000))
    swapped = Entry(**{**entry.__dict__, "shared_libs": {"x86_64": {**entry.shared_libs["x86_64"], "digest": other}}})
    assert kernel_keys.has_valid_key(swapped) and kernel_keys.entry_keys(swapped) == kernel_keys.entry_keys(entry)
    with server.client("publish") as c:
        assert _publish(c, store, entry).status_code == 201
        refused = _publish(c, store, swapped)
        assert refused.status_code == 409 and "immutable" in refused.json()["detail"], refused.text
        grace = {**entry.shared_libs, "aarch64": {**entry.shared_libs["x86_64"], "digest": other}}
        added = _publish(c, store, Entry(**{**entry.__dict__, "shared_libs": grace}))
        assert added.status_code == 200 and added.json()["shared_libs"] == grace
        assert c.get(f"/v1/kernels/{entry.kernel_key}").json()["shared_libs"] == grace


def test_an_entry_naming_a_library_the_server_lacks_is_refused(server: Server, tmp_path: Path) -> None:
    store, [entry], _ = lean_store(tmp_path, kernels=1)
    with server.client("publish") as c:
        assert c.put(f"/v1/objects/{entry.object_digest}",
                     content=store.read_object(entry.object_digest)).status_code == 201
        refused = c.post("/v1/kernels", json=entry.published())
        assert refused.status_code == 409 and "upload it first" in refused.json()["detail"]
        assert c.get(f"/v1/kernels/{entry.kernel_key}").status_code == 404


def test_recipe_files_are_validated_capped_and_the_newest_wins(server: Server, tmp_path: Path) -> None:
    store, [entry], recipes = lean_store(tmp_path, kernels=1)
    key, data = next(iter(recipes.items()))
    url = f"/v1/skus/h200/recipes/{key}"
    with server.client("publish") as c:
        assert c.put("/v1/skus/nosuch/recipes/" + key, content=data).status_code == 409
        assert _publish(c, store, entry).status_code in (200, 201)
        assert c.put(url, content=b"not json").status_code == 422
        other_key = recipe_file(store, 1)[0]
        assert c.put(f"/v1/skus/h200/recipes/{other_key}", content=data).status_code == 422  # key of another sig
        assert c.put(url, content=b" " * (recipe_store.MAX_BYTES + 1)).status_code == 413
        assert c.put(url, content=data).status_code == 201
        assert c.put(url, content=data).status_code == 200
        newer = recipe_file(store, 0, extra="more regions")[1]
        assert c.put(url, content=newer).status_code == 201
        listed = c.get("/v1/skus/h200/recipes").json()["recipes"]
        assert {r["key"]: r["digest"] for r in listed}[key] == hashlib.sha256(newer).hexdigest()
        assert c.get(url).content == newer


@pytest.mark.bad_input("HTTP")
def test_d26_server_refuses_recipe_with_foreign_op_or_unbounded_power(server: Server, tmp_path: Path) -> None:
    """Issue 18, D26: the server accepted a recipe whose step reached torch.ops.load_library (a dlopen of any
    path on every client that ran it) and a guard ["pow", 10, 10**9]; it now applies the client's recipe format
    (fa4_aot.domain.recipe_format, through store.recipes.check_file) at upload."""
    store, [entry], _ = lean_store(tmp_path, kernels=1)
    signature: dict[str, Any] = {"layout": "dense", "head_dim": 80, "causal": True}
    key = recipe_store.file_key(signature, SKU.target_facts())
    url = f"/v1/skus/h200/recipes/{key}"
    step = {"op": "load_library.__call__.__call__", "args": [str(tmp_path / "evil.so")], "kwargs": {"kw": {}},
            "out": [0], "tuple": False}
    foreign = {**region(signature), "fwd": [step]}
    power = {**region(signature), "guards": [["gt", ["pow", 10, 10**9], 1]]}
    with server.client("publish") as c:
        assert _publish(c, store, entry).status_code in (200, 201)
        for bad, named in ((foreign, "load_library"), (power, "exponent")):
            refused = c.put(url, content=json.dumps({"key": key, "regions": [bad]}).encode())
            assert refused.status_code == 422 and named in refused.json()["detail"], refused.text
        assert c.get(url).status_code == 404
        assert c.put(url, content=json.dumps({"key": key, "regions": [region(signature)]}).encode()).status_code == 201
