"""Manifests scale with device classes: `fa4-aot sign` over the default h200 build certified on many device classes
writes manifests that each fit the server's cap on manifest bodies (one envelope of them all would not), each
lists every kernel, and together they list every verdict once; a kernel set too large even without verdicts is
refused with the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from fa4_aot.cli import main
from fa4_aot.domain.verdicts import Verdict
from fa4_aot.errors import TrustError
from fa4_aot.trust import manifest_parts, signing, signing_keys
from service.limits import MANIFEST_BODY_LIMIT
from tests.trust.test_manifest_size import DEFAULT_BUILD, SKU, _default_size_store

CLASSES = [f"nvidia-h200.132sm.driver-13.{d}.cuda-13.0" for d in range(1, 16)]  # and test_manifest_size's DEVICE


def test_many_device_classes_do_not_push_a_signed_manifest_past_the_servers_cap(tmp_path: Path) -> None:
    store = _default_size_store(tmp_path / "store")
    keys = [e.kernel_key for e in store.entries()]
    store.put_verdicts([Verdict(kernel_key=k, device=d, status="pass", checks=4,
                                calls=["fwd dense bf16 b=2 h=32/8 d=128 s=4096/4096 causal"],
                                toolchain="4.0.0b36/4.8.1", when="2026-12-03T10:00:00Z")
                        for k in keys for d in CLASSES])
    private, public = signing_keys.generate(tmp_path / "keys", "ci")
    signed = CliRunner().invoke(main, ["--cache-dir", str(store.root), "sign", "--sku", "h200", "--key",
                                       str(private), "--json"])
    assert signed.exit_code == 0, signed.output
    envelopes = signing.local(store, "h200")
    assert all(len(json.dumps(e).encode()) <= MANIFEST_BODY_LIMIT for e in envelopes)  # what the server takes
    assert len(envelopes) == len(json.loads(signed.output)["manifest_ids"]) > 1
    listed: dict[str, dict[str, object]] = {}
    for envelope in envelopes:
        manifest = signing.verify(envelope, {public.key_id: public}, SKU, signing.Revocations())
        assert len(manifest["kernels"]) == DEFAULT_BUILD
        for key, per_device in manifest["verdicts"].items():
            assert not set(per_device) & set(listed.get(key, {}))  # no class listed twice
            listed.setdefault(key, {}).update(per_device)
    assert len(listed) == DEFAULT_BUILD and all(len(v) == len(CLASSES) + 1 for v in listed.values())


def test_a_manifest_too_large_without_verdicts_is_refused_with_the_fix() -> None:
    assert manifest_parts.MAX_ENVELOPE == MANIFEST_BODY_LIMIT
    manifest = {"sku": {"name": "h200"}, "kernels": {f"{i:064x}": "0" * 64 for i in range(2000)}, "verdicts": {}}
    with pytest.raises(TrustError, match="fewer of this SKU's kernels"):
        manifest_parts.parts(manifest, limit=64 << 10)
