"""Security round 5, signed manifests over SQLite and PostgreSQL with a real uvicorn: one SKU publish token must not
be able to flood a SKU's manifests past what clients read (fa4_aot/remote/transport.py MAX_JSON), which would
starve every trusted client of the SKU; the honest signer's manifest stays listed and readable."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from fa4_aot.remote.http import Remote
from fa4_aot.remote.transport import MAX_JSON
from fa4_aot.trust import signing, signing_keys
from service.crud.trust import SKU_BYTES
from service.limits import MANIFEST_BODY_LIMIT
from tests.helpers.servers import H200, Server, kernel_doc

FACTS: dict[str, Any] = {k: v for k, v in H200.items() if k != "sku"}


def _junk_recipes(n_bytes: int) -> dict[str, str]:
    """A manifest's `recipes` map of about `n_bytes`: well formed, so the server has no reason to refuse it."""
    return {hashlib.sha256(b"k%d" % i).hexdigest(): hashlib.sha256(b"v%d" % i).hexdigest()
            for i in range(n_bytes // 134)}


def _signed(key_path: Path, sku: str, kernels: dict[str, str], created: str, **more: Any) -> bytes:
    manifest = {"sku": {"name": sku, **FACTS}, "kernels": kernels, "toolchain": [{"flash-attn-4": "4.0.0b36"}],
                "created": created, "expires": "2099-01-01T00:00:00Z", **more}
    return json.dumps(signing.sign(manifest, signing_keys.load_private(key_path))).encode()


@pytest.mark.bad_input("manifest floods")
def test_a_sku_publish_token_cannot_flood_manifests_past_what_clients_read(server: Server, tmp_path: Path) -> None:
    sku = "r5-flood"
    data = os.urandom(200)
    doc = kernel_doc(data, sku=sku)
    with server.client("publish") as c:
        assert c.put(f"/v1/objects/{doc['object_digest']}", content=data).status_code == 201
        assert c.post("/v1/kernels", json=doc).status_code == 201
    kernels = {doc["kernel_key"]: doc["object_digest"]}
    honest_key = signing_keys.generate(tmp_path / "keys", "honest")[0]
    honest = _signed(honest_key, sku, kernels, "2026-12-01T00:00:00Z")
    junk = _junk_recipes(MANIFEST_BODY_LIMIT - (256 << 10))
    headers = {"Content-Type": "application/json"}
    answers = []
    with server.client("publish") as c:
        assert c.put(f"/v1/skus/{sku}/manifests", content=honest, headers=headers).status_code == 201
        for k in range(3):  # three keys of the flooding token, four manifests each (PER_KEY)
            key = signing_keys.generate(tmp_path / "keys", f"flood{k}")[0]
            for m in range(4):
                body = _signed(key, sku, kernels, f"2026-12-0{m + 2}T0{k}:00:00Z", recipes=junk)
                assert len(body) <= MANIFEST_BODY_LIMIT
                answers.append(c.put(f"/v1/skus/{sku}/manifests", content=body, headers=headers))
        listing = c.get(f"/v1/skus/{sku}/manifests")
    assert {a.status_code for a in answers} <= {201, 413}, [a.text[:200] for a in answers]
    assert all("signing key" in a.json()["detail"] for a in answers if a.status_code == 413)
    assert len(listing.content) <= SKU_BYTES < MAX_JSON
    envelopes = Remote(server.url).signed_manifests(sku)  # what a trusted client reads: whole, not refused
    assert json.loads(honest) in envelopes


def test_every_part_of_a_signing_is_kept_and_older_signings_make_room(server: Server, tmp_path: Path) -> None:
    sku = "r5-parts"
    data = os.urandom(200)
    doc = kernel_doc(data, sku=sku)
    with server.client("publish") as c:
        assert c.put(f"/v1/objects/{doc['object_digest']}", content=data).status_code == 201
        assert c.post("/v1/kernels", json=doc).status_code == 201
    kernels, key = {doc["kernel_key"]: doc["object_digest"]}, signing_keys.generate(tmp_path / "keys", "ci")[0]
    headers = {"Content-Type": "application/json"}

    def signing_of(created: str, n: int) -> list[bytes]:  # `fa4-aot sign` parts: one `created`, other contents
        return [_signed(key, sku, kernels, created, recipes=_junk_recipes(134 * (i + 1))) for i in range(n)]

    with server.client("publish") as c:
        for day in range(1, 6):  # PER_KEY signings and one more: the oldest signing goes, all its parts
            for body in signing_of(f"2026-12-0{day}T00:00:00Z", 6):
                assert c.put(f"/v1/skus/{sku}/manifests", content=body, headers=headers).status_code == 201
        listed = c.get(f"/v1/skus/{sku}/manifests").json()["manifests"]
    assert sorted({e["manifest"]["created"][:10] for e in listed}) == [f"2026-12-0{d}" for d in range(2, 6)]
    assert len(listed) == 4 * 6
