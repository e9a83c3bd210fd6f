"""Which signed verdicts a trusted client believes when several valid manifests list a kernel (Trust.listed_verdicts):
per device class, the newest manifest that lists a verdict for that class decides; a newer manifest that lists the
kernel for other device classes only leaves an older failure standing."""

from __future__ import annotations

import datetime as dt
from typing import Any

from fa4_aot.errors import KernelRefused
from fa4_aot.trust import signing
from fa4_aot.trust.policy import Trust
from tests.trust.test_verdict_signing import H200, NOW, OTHER, SKU, gate, setup, verdict

__all__ = ["setup"]  # the fixture, used by name


def _signed_at(setup: dict[str, Any], created: dt.datetime, verdicts: dict[str, Any] | None = None) -> None:
    """Keep in the store a manifest of its kernels created at `created`, listing `verdicts` when given (else the
    store's own)."""
    manifest = signing.manifest_of(setup["store"], SKU, now=created)
    if verdicts is not None:
        manifest["verdicts"] = verdicts
    signing.save(setup["store"], signing.sign(manifest, setup["key"], "ci"))


def test_a_newer_manifest_listing_other_device_classes_keeps_an_older_failure(setup: dict[str, Any]) -> None:
    store, (a, _b, _c) = setup["store"], setup["entries"]
    store.put_verdicts([verdict(a, "wrong")])
    _signed_at(setup, NOW)
    other_pass = signing.verdict_listing(verdict(a, "pass", OTHER))
    _signed_at(setup, NOW + dt.timedelta(hours=1), {a.kernel_key: {OTHER: other_pass}})
    listed = Trust(SKU, store, None, setup["trusted"]).listed_verdicts()[a.kernel_key]
    assert listed[H200]["status"] == "wrong" and listed[OTHER]["status"] == "pass"
    refused = gate(setup, "known-bad").refusal(a, None)
    assert isinstance(refused, KernelRefused) and refused.reason == "wrong"
    assert gate(setup, "known-bad", device=OTHER).refusal(a, None) is None


def test_a_newer_verdict_of_the_same_device_class_replaces_a_failure(setup: dict[str, Any]) -> None:
    store, (a, _b, _c) = setup["store"], setup["entries"]
    store.put_verdicts([verdict(a, "wrong")])
    _signed_at(setup, NOW)
    recertified = signing.verdict_listing(verdict(a, "pass", when="2026-12-03T11:00:00Z"))
    _signed_at(setup, NOW + dt.timedelta(hours=1), {a.kernel_key: {H200: recertified}})
    assert gate(setup, "require").refusal(a, None) is None
