"""Certification verdicts in signed manifests (issue 27): `sign` lists them, the signature covers them, malformed
ones are refused, and under trusted keys the gate believes signed verdicts only."""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import hashlib
from pathlib import Path
from typing import Any

import pytest

from fa4_aot.domain import known_bad
from fa4_aot.domain.skus import Sku
from fa4_aot.domain.verdicts import DeviceClass, Verdict
from fa4_aot.errors import KernelRefused, TrustError
from fa4_aot.store import Entry, Store
from fa4_aot.trust import signing, signing_keys
from fa4_aot.trust.certified import Gate
from fa4_aot.trust.policy import Trust
from fa4_aot.trust.signing import Revocations
from tests.conftest import proven

SKU = Sku(name="h200", arch="sm_90a", sm_count=132, l2_bytes=62914560, cuda_major=13)
NOW = dt.datetime(2026, 12, 3, 12, 0, tzinfo=dt.UTC)
H200 = "nvidia-h200.132sm.driver-13.0.cuda-13.0"
OTHER = "nvidia-h200.132sm.driver-12.8.cuda-12.8"


def _entry(store: Store, data: bytes) -> Entry:
    entry = Entry(kernel_key="", object_digest=store.put_object(data), size=len(data), family="_flash_attn_fwd",
                  compile_key=[hashlib.sha256(data).hexdigest()], sku=SKU.name, arch=SKU.arch,
                  sm_count=SKU.sm_count, l2_bytes=SKU.l2_bytes, cuda_major=SKU.cuda_major,
                  toolchain={"flash-attn-4": "x"}, variant="v", call="c", compile_seconds=0.0, host=SKU.host)
    entry = proven(entry)
    store.put_entry(entry)
    return entry


def verdict(entry: Entry, status: str = "pass", device: str = H200, **fields: Any) -> Verdict:
    if status == "wrong":
        fields = {"tensor": "dq", "error": 1.3, "bound": 0.02, "detail": "hd 72", **fields}
    fields = {"checks": 3, "calls": ["bwd dense bf16 d=72"], "toolchain": "4.0.0b36/4.8.1",
              "when": "2026-12-03T10:00:00Z", **fields}
    return Verdict(kernel_key=entry.kernel_key, device=device, status=status, **fields)


@pytest.fixture
def setup(tmp_path: Path) -> dict[str, Any]:
    store = Store(tmp_path / "store")
    entries = [_entry(store, b"kernel-%d" % i) for i in range(3)]
    private, public = signing_keys.generate(tmp_path / "keys", "ci")
    return {"store": store, "entries": entries, "key": signing_keys.load_private(private),
            "trusted": {public.key_id: public}}


def signed(setup: dict[str, Any], change: Any = None) -> dict[str, Any]:
    """A valid envelope of the store's manifest, `change(manifest)` applied before signing."""
    manifest = signing.manifest_of(setup["store"], SKU, now=NOW)
    if change is not None:
        change(manifest)
    return signing.sign(manifest, setup["key"], "ci")


def test_sign_lists_each_kernels_verdicts_by_device_class(setup: dict[str, Any]) -> None:
    store, (a, b, _c) = setup["store"], setup["entries"]
    store.put_verdicts([verdict(a), verdict(a, "wrong", OTHER), verdict(b, "crash", detail="illegal address")])
    store.put_verdicts([verdict(b, "pass", when="2026-12-03T11:00:00Z")])  # re-certified: the newer one stands
    manifest = signing.verify(signed(setup), setup["trusted"], SKU, Revocations(), now=NOW)
    assert set(manifest["verdicts"]) == {a.kernel_key, b.kernel_key}  # c was never certified: not listed
    assert set(manifest["verdicts"][a.kernel_key]) == {H200, OTHER}
    assert manifest["verdicts"][b.kernel_key][H200]["status"] == "pass"
    for key, per_device in manifest["verdicts"].items():
        for device, listing in per_device.items():
            assert "kernel_key" not in listing and "device" not in listing
            assert signing.verdict_of(key, device, listing) in store.verdicts(key)


def test_a_store_without_verdicts_lists_none_and_older_manifests_stay_valid(setup: dict[str, Any]) -> None:
    assert signed(setup)["manifest"]["verdicts"] == {}
    setup["store"].put_verdicts([verdict(setup["entries"][0])])
    older = signed(setup, lambda m: m.pop("verdicts"))  # signed before certification existed
    assert "verdicts" not in signing.verify(older, setup["trusted"], SKU, Revocations(), now=NOW)
    trust = Trust(SKU, setup["store"], None, setup["trusted"])
    signing.save(setup["store"], older)
    assert trust.allowed() and trust.listed_verdicts() == {}


def _flip_status(m: dict[str, Any]) -> None:
    listing = next(iter(next(iter(m["verdicts"].values())).values()))
    listing.update(status="pass", tensor="", error=None, bound=None)


def _add_device(m: dict[str, Any]) -> None:
    listing = next(iter(next(iter(m["verdicts"].values())).values()))
    next(iter(m["verdicts"].values()))[OTHER] = {**listing, "status": "pass"}


FORGERIES = {"wrong-made-pass": _flip_status, "device-added": _add_device,
             "verdicts-dropped": lambda m: m.pop("verdicts"),
             "when-moved": lambda m: next(iter(next(iter(m["verdicts"].values())).values())).update(
                 when="2027-01-01T00:00:00Z")}


@pytest.mark.bad_input("manifests")
@pytest.mark.parametrize("forge", FORGERIES.values(), ids=FORGERIES.keys())
def test_an_altered_verdict_breaks_the_signature(setup: dict[str, Any], forge: Any) -> None:
    setup["store"].put_verdicts([verdict(setup["entries"][0], "wrong")])
    envelope = signed(setup)
    signing.verify(envelope, setup["trusted"], SKU, Revocations(), now=NOW)
    forged = copy.deepcopy(envelope)
    forge(forged["manifest"])
    with pytest.raises(TrustError, match="bad signature"):
        signing.verify(forged, setup["trusted"], SKU, Revocations(), now=NOW)


def _listing(m: dict[str, Any]) -> dict[str, Any]:
    return next(iter(next(iter(m["verdicts"].values())).values()))  # type: ignore[no-any-return]


MALFORMED = {
    "not-a-map": (lambda m: m.update(verdicts=[]), "'verdicts' is not a map"),
    "kernel-not-listed": (lambda m: m["verdicts"].update({"f" * 64: {}}), "does not list as a kernel"),
    "devices-not-a-map": (lambda m: m["verdicts"].update({k: "pass" for k in m["verdicts"]}),
                          "does not list as a kernel"),
    "bad-device-id": (lambda m: m["verdicts"].update({k: {"h200": _listing(m)} for k in m["verdicts"]}),
                      "invalid device class"),
    "listing-not-an-object": (lambda m: m["verdicts"].update({k: {H200: "pass"} for k in m["verdicts"]}),
                              "expected an object"),
    "unknown-status": (lambda m: _listing(m).update(status="fine"), "invalid verdict status"),
    "unknown-tensor": (lambda m: _listing(m).update(tensor="q"), "invalid verdict tensor"),
    "error-not-a-number": (lambda m: _listing(m).update(error="big"), "invalid verdict error"),
    "error-a-bool": (lambda m: _listing(m).update(error=True), "not true or false"),
    "checks-a-string": (lambda m: _listing(m).update(checks="3"), "invalid verdict checks"),
    "checks-negative": (lambda m: _listing(m).update(checks=-1), "invalid verdict checks"),
    "when-not-a-time": (lambda m: _listing(m).update(when="yesterday"), "UTC time"),
    "unknown-field": (lambda m: _listing(m).update(trusted=True), "unknown \\['trusted'\\]"),
    "detail-too-long": (lambda m: _listing(m).update(detail="x" * 5000), "invalid verdict detail"),
    "calls-not-strings": (lambda m: _listing(m).update(calls=[1]), "invalid verdict calls"),
}


@pytest.mark.bad_input("manifests")
@pytest.mark.parametrize("change,message", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_verdict_is_refused_even_when_signed(setup: dict[str, Any], change: Any, message: str) -> None:
    setup["store"].put_verdicts([verdict(setup["entries"][0], "wrong")])
    envelope = signed(setup, change)
    for check in (signing.check_shape, lambda e: signing.verify(e, setup["trusted"], SKU, Revocations(), now=NOW)):
        with pytest.raises(TrustError, match=message):
            check(envelope)


def gate(setup: dict[str, Any], policy: str, trusted: bool = True, device: str = H200) -> Gate:
    trust = Trust(SKU, setup["store"], None, setup["trusted"]) if trusted else None
    return Gate(setup["store"], SKU.name, DeviceClass.parse(device), trust, policy=policy,
                registry=known_bad.Registry(1))  # no registry entry: verdicts alone decide here


def test_under_trusted_keys_a_signed_wrong_verdict_refuses_the_kernel(setup: dict[str, Any]) -> None:
    store, (a, b, _c) = setup["store"], setup["entries"]
    store.put_verdicts([verdict(a, "wrong"), verdict(b)])
    signing.save(store, signed(setup))
    refused = gate(setup, "known-bad").refusal(a, None)
    assert isinstance(refused, KernelRefused) and refused.reason == "wrong"
    assert "dq off by 1.3" in str(refused) and "listed by a signed manifest" in str(refused)
    assert gate(setup, "known-bad").refusal(b, None) is None
    assert gate(setup, "known-bad", device=OTHER).refusal(a, None) is None  # certified on another device class


def test_under_trusted_keys_require_admits_signed_passes_only(setup: dict[str, Any]) -> None:
    store, (a, b, c) = setup["store"], setup["entries"]
    store.put_verdicts([verdict(a)])
    signing.save(store, signed(setup))
    store.put_verdicts([verdict(b), verdict(c, "wrong")])  # kept after signing: no signature covers them
    require = gate(setup, "require")
    assert require.refusal(a, None) is None
    unsigned = require.refusal(b, None)
    assert isinstance(unsigned, KernelRefused) and unsigned.reason == "unchecked"
    assert gate(setup, "known-bad").refusal(c, None) is None  # an unsigned failure does not count either ...
    local = gate(setup, "known-bad", trusted=False).refusal(c, None)  # ... but without trusted keys the store does
    assert isinstance(local, KernelRefused) and local.reason == "wrong"
    assert gate(setup, "require", trusted=False).refusal(b, None) is None


def test_verdict_listing_round_trips(setup: dict[str, Any]) -> None:
    v = verdict(setup["entries"][0], "wrong")
    listing = signing.verdict_listing(v)
    assert signing.verdict_of(v.kernel_key, v.device, listing) == v
    assert signing.verdict_of(v.kernel_key, v.device, {**listing, "checks": 0}) == dataclasses.replace(v, checks=0)
