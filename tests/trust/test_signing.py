"""Signed manifests and the client's trust policy, as tables: every way a manifest or kernel is refused."""

from __future__ import annotations

import copy
import datetime as dt
import warnings
from pathlib import Path
from typing import Any

import pytest

from fa4_aot.domain.skus import Sku
from fa4_aot.errors import TrustError
from fa4_aot.store import Entry, Store
from fa4_aot.trust import policy as trust
from fa4_aot.trust import signing, signing_keys
from fa4_aot.trust.signing import Revocations
from tests.conftest import proven

SKU = Sku(name="h200", arch="sm_90a", sm_count=132, l2_bytes=62914560, cuda_major=13)
NOW = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)


def _entry(store: Store, data: bytes, sku: Sku = SKU) -> Entry:
    digest = store.put_object(data)
    import hashlib

    entry = Entry(kernel_key="", object_digest=digest, size=len(data),
                  family="_flash_attn_fwd", compile_key=[hashlib.sha256(data).hexdigest()],
                  sku=sku.name, arch=sku.arch, sm_count=sku.sm_count,
                  l2_bytes=sku.l2_bytes, cuda_major=sku.cuda_major, toolchain={"flash-attn-4": "x"}, variant="v",
                  call="c", compile_seconds=0.0, host=sku.host)
    entry = proven(entry)
    store.put_entry(entry)
    return entry


@pytest.fixture
def setup(tmp_path: Path) -> dict[str, Any]:
    store = Store(tmp_path / "store")
    entries = [_entry(store, b"kernel-%d" % i) for i in range(3)]
    private, public = signing_keys.generate(tmp_path / "keys", "ci")
    key = signing_keys.load_private(private)
    envelope = signing.sign(signing.manifest_of(store, SKU, now=NOW), key, "ci")
    return {"store": store, "entries": entries, "public": public, "key": key, "envelope": envelope,
            "trusted": {public.key_id: public}, "tmp": tmp_path}


def test_a_signed_manifest_verifies_and_lists_every_kernel(setup: dict) -> None:
    manifest = signing.verify(setup["envelope"], setup["trusted"], SKU, Revocations(), now=NOW)
    assert manifest["kernels"] == {e.kernel_key: e.object_digest for e in setup["entries"]}
    assert manifest["sku"] == {"name": "h200", **SKU.target_facts()}


def _tamper_kernel(env: dict) -> None:
    first = next(iter(env["manifest"]["kernels"]))
    env["manifest"]["kernels"][first] = "0" * 64


def _other_key(env: dict) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    other = signing.sign(env["manifest"], Ed25519PrivateKey.generate())
    env.update(key_id=other["key_id"], public_key=other["public_key"], signature=other["signature"])


REFUSALS = [
    ("tampered-kernel-digest", _tamper_kernel, {}, NOW, "bad signature"),
    ("tampered-expiry", lambda e: e["manifest"].update(expires="2099-01-01T00:00:00Z"), {}, NOW, "bad signature"),
    ("signature-garbage", lambda e: e.update(signature="AAAA"), {}, NOW, "bad signature"),
    ("untrusted-key", _other_key, {}, NOW, "not in FA4_AOT_TRUSTED_KEYS"),
    ("public-key-swapped", lambda e: e.update(public_key="A" * 43 + "="), {}, NOW, "not in FA4_AOT_TRUSTED_KEYS"),
    ("expired", lambda e: None, {}, NOW + dt.timedelta(days=400), "expired"),
    ("revoked-key", lambda e: None, {"key": True}, NOW, "revoked key"),
    ("revoked-manifest", lambda e: None, {"manifest": True}, NOW, "is revoked"),
    ("wrong-format", lambda e: e.update(format="other/1"), {}, NOW, "not a signed manifest"),
    ("no-kernels", lambda e: e["manifest"].pop("kernels"), {}, NOW, "no 'kernels' map"),
    ("bad-kernel-key", lambda e: e["manifest"]["kernels"].update({"../x": "0" * 64}), {}, NOW, "invalid kernel key"),
    ("bad-time", lambda e: e["manifest"].update(created="yesterday"), {}, NOW, "not a UTC time"),
    ("missing-signature", lambda e: e.pop("signature"), {}, NOW, "lacks the string field 'signature'"),
]


@pytest.mark.bad_input("manifests")
@pytest.mark.parametrize("name,mutate,revoke,now,message", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_manifest_refusals(setup: dict, name: str, mutate: Any, revoke: dict, now: dt.datetime,
                           message: str) -> None:
    envelope = copy.deepcopy(setup["envelope"])
    mutate(envelope)
    revoked = Revocations(keys={envelope["key_id"]} if revoke.get("key") else set(),
                          manifests={signing.manifest_id(envelope)} if revoke.get("manifest") else set())
    with pytest.raises(TrustError, match=message):
        signing.verify(envelope, setup["trusted"], SKU, revoked, now=now)


@pytest.mark.bad_input("manifests")
def test_manifest_for_another_sku_is_refused(setup: dict) -> None:
    other = Sku(name="h100-sxm", arch="sm_90a", sm_count=132, l2_bytes=52428800, cuda_major=13)
    with pytest.raises(TrustError, match="not h100-sxm"):
        signing.verify(setup["envelope"], setup["trusted"], other, Revocations(), now=NOW)


@pytest.mark.parametrize("spec_kind", ["inline", "semicolons", "file"])
def test_trusted_keys_from_env_forms(setup: dict, spec_kind: str) -> None:
    line = setup["public"].line()
    spec = {"inline": line, "semicolons": f"{line};{line}", "file": None}[spec_kind]
    if spec is None:
        path = setup["tmp"] / "trusted.pub"
        path.write_text(f"# our build host\n{line}\n")
        spec = str(path)
    assert set(signing_keys.trusted_keys(spec)) == {setup["public"].key_id}


@pytest.mark.bad_input("manifests")
@pytest.mark.parametrize("line", ["ssh-ed25519 AAAA", "fa4-aot-ed25519 not-base64!", "fa4-aot-ed25519 AAAA"])
def test_bad_public_key_lines(line: str) -> None:
    with pytest.raises(TrustError, match="invalid public key"):
        signing_keys.parse_public(line)


@pytest.mark.parametrize("text,ok", [("key abc\nmanifest def # why\n\n", True), ("kee abc", False),
                                     ("manifest", False)])
def test_revocation_file(text: str, ok: bool) -> None:
    if ok:
        assert Revocations.parse(text) == Revocations({"abc"}, {"def"})
    else:
        with pytest.raises(TrustError, match="revocation line 1"):
            Revocations.parse(text)


def test_generate_refuses_to_overwrite_and_keeps_the_key_private(setup: dict) -> None:
    assert (setup["tmp"] / "keys" / "ci.key").stat().st_mode & 0o777 == 0o600
    with pytest.raises(TrustError, match="exists"):
        signing_keys.generate(setup["tmp"] / "keys", "ci")


def test_trust_policy_checks_local_entries_against_saved_manifests(setup: dict) -> None:
    store, entries = setup["store"], setup["entries"]
    policy = trust.Trust(SKU, store, None, setup["trusted"])
    with pytest.raises(TrustError, match="is not listed"):  # nothing signed is saved yet
        policy.check(entries[0])
    signing.save(store, setup["envelope"])
    policy = trust.Trust(SKU, store, None, setup["trusted"])
    for entry in entries:
        policy.check(entry)
    swapped = Entry(**{**entries[0].__dict__, "object_digest": entries[1].object_digest})
    with pytest.raises(TrustError, match=f"is listed with object {entries[0].object_digest}"):
        policy.check(swapped)
    revoked = trust.Trust(SKU, store, None, setup["trusted"], revoked=Revocations(keys={setup["public"].key_id}))
    with pytest.raises(TrustError, match="revoked key"):
        revoked.check(entries[0])


def test_without_keys_local_is_trusted_and_remote_refused_unless_insecure(setup: dict,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    policy = trust.Trust(SKU, setup["store"], None, {})
    policy.check(setup["entries"][0])
    assert "FA4_AOT_TRUSTED_KEYS" in policy.refuse_remote() and "FA4_AOT_INSECURE=1" in policy.refuse_remote()
    monkeypatch.setattr(trust, "_warned", False)
    insecure = trust.Trust(SKU, setup["store"], None, {}, insecure=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert insecure.refuse_remote() == "" and insecure.refuse_remote() == ""
    assert len([w for w in caught if "FA4_AOT_INSECURE" in str(w.message)]) == 1  # once per process


def test_from_env_reads_keys_insecure_and_revocations(setup: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    revoked = setup["tmp"] / "revoked"
    revoked.write_text(f"key {setup['public'].key_id}\n")
    monkeypatch.setenv("FA4_AOT_TRUSTED_KEYS", setup["public"].line())
    monkeypatch.setenv("FA4_AOT_REVOKED", str(revoked))
    policy = trust.Trust.from_env(SKU, setup["store"], None)
    assert policy.enforced and policy.revoked.keys == {setup["public"].key_id}
