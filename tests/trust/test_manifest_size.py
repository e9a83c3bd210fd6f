"""A SKU's signed manifest at the size of a real build (issue 27): the default h200 build holds 2,485 kernels, each
listed with its object digest, its linked library and, once certified, its verdict. Such a manifest must fit the
server's cap on manifest bodies with room to spare, or certified stores could never be published."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from pathlib import Path

from fa4_aot.domain.skus import Sku
from fa4_aot.domain.verdicts import Verdict
from fa4_aot.store import Entry, Store
from fa4_aot.trust import signing, signing_keys
from service.limits import MANIFEST_BODY_LIMIT
from tests.conftest import proven
from tests.helpers.servers import H200, Server, kernel_doc

SKU = Sku(**{**{k: v for k, v in H200.items() if k != "sku"}, "name": "h200"})
DEFAULT_BUILD = 2485
DEVICE = "nvidia-h200.132sm.driver-13.0.cuda-13.0"


def _default_size_store(root: Path) -> Store:
    """A store holding DEFAULT_BUILD kernels of the h200 shaped like a real build's index entries (a linked x86_64
    library needing the CuTe runtime, as `fa4-aot build` writes), each certified with a pass on one device class."""
    store = Store(root)
    runtime = hashlib.sha256(b"libcute_dsl_runtime.so").hexdigest()
    verdicts = []
    for i in range(DEFAULT_BUILD):
        digest = store.put_object(b"kernel-%d" % i)
        library = hashlib.sha256(b"library-%d" % i).hexdigest()
        entry = proven(Entry(
            kernel_key="", object_digest=digest, size=len(b"kernel-%d" % i), family="FlashAttentionForwardSm90",
            compile_key=["fwd", 128, True, digest[:16]], sku=SKU.name, arch=SKU.arch, sm_count=SKU.sm_count,
            l2_bytes=SKU.l2_bytes, cuda_major=SKU.cuda_major, toolchain={"flash-attn-4": "4.0.0b36"}, variant="train",
            call="fwd dense bf16 d=128", compile_seconds=1.0, host=SKU.host,
            shared_libs={"x86_64": {"digest": library, "size": 77848,
                                    "needs": {"libcute_dsl_runtime.so": runtime, "libtvm_ffi.so": ""}}}))
        store.put_entry(entry)
        verdicts.append(Verdict(kernel_key=entry.kernel_key, device=DEVICE, status="pass", checks=4,
                                calls=["fwd dense bf16 b=2 h=32/8 d=128 s=4096/4096 causal"],
                                toolchain="4.0.0b36/4.8.1", when="2026-12-03T10:00:00Z"))
    store.put_verdicts(verdicts)
    return store


def test_a_default_size_certified_manifest_is_taken_by_the_server_not_refused_for_its_size(
        tmp_path: Path, server: Server) -> None:
    store = _default_size_store(tmp_path / "store")
    key = signing_keys.load_private(signing_keys.generate(tmp_path / "keys", "ci")[0])
    manifest = signing.manifest_of(store, SKU, now=dt.datetime(2026, 12, 3, tzinfo=dt.UTC))
    assert len(manifest["kernels"]) == len(manifest["verdicts"]) == DEFAULT_BUILD
    body = json.dumps(signing.sign(manifest, key, "ci")).encode()
    assert len(body) * 3 < MANIFEST_BODY_LIMIT  # room for a SKU three times the default build
    with server.client("publish") as c:
        doc = kernel_doc(b"a kernel the server holds", sku=SKU.name)  # makes the SKU known to the server
        assert c.put(f"/v1/objects/{doc['object_digest']}", content=b"a kernel the server holds").status_code == 201
        assert c.post("/v1/kernels", json=doc).status_code == 201
        answer = c.put(f"/v1/skus/{SKU.name}/manifests", content=body, headers={"Content-Type": "application/json"})
    # Read in full and checked: refused for listing kernels this server was never sent, not for its size (413).
    assert answer.status_code == 409, answer.text
    assert "kernel" in answer.json()["detail"]
