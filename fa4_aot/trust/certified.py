"""Which kernels may be launched on this device: the certification gate both runtimes ask before a first launch.

A kernel is refused (KernelRefused, naming the symptom and its source) when
- the known-bad registry (domain/known_bad.py: the project's file plus what the store's certification measured for
  the SKU) names it for the call's signature, or
- its verdict for this device class (domain/verdicts.py) is not `pass`, or
- the policy is `require` and it has no verdict for this device class.

The policy is FA4_AOT_CERTIFIED, read when a runtime starts: `known-bad` (the default: refuse registry matches and
failed verdicts, allow unchecked kernels), `require` (also refuse unchecked ones) or `off`. Under a trust policy
(FA4_AOT_TRUSTED_KEYS) only verdicts that valid signed manifests list count; otherwise the store's verdict files
do. Decisions are kept per kernel and signature, so a kernel costs one look-up per process, not one per call.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from ..domain import kernel_keys, known_bad
from ..domain.signature import Signature
from ..domain.verdicts import DeviceClass, Verdict
from ..errors import ConfigError, KernelRefused, StoreError
from ..store import Entry, Store
from .policy import Trust

POLICIES = ("known-bad", "require", "off")
ENV = "FA4_AOT_CERTIFIED"


def policy_from_env() -> str:
    """FA4_AOT_CERTIFIED (default `known-bad`); ConfigError for any other value."""
    value = os.environ.get(ENV, "known-bad").strip() or "known-bad"
    if value not in POLICIES:
        raise ConfigError(f"{ENV}={value!r} is not a policy: use require (only kernels certified on this GPU), "
                          "known-bad (the default: refuse known-bad and failed kernels) or off")
    return value


def registry_for(store: Store, sku: str) -> known_bad.Registry:
    """The project's registry plus the entries `store`'s certification measured for `sku`. A malformed measured
    file is a StoreError: it must not mean that nothing is known bad."""
    registry = known_bad.load()
    data = store.known_bad(sku)
    if data is None:
        return registry
    try:
        measured = known_bad.parse(json.loads(data), f"{store.root}/known-bad/{sku}.json")
    except (ValueError, RecursionError, ConfigError) as e:
        raise StoreError(f"the known-bad entries measured for {sku} in {store.root} are malformed ({e}); run "
                         f"`fa4-aot certify --sku {sku}` again to rewrite them") from None
    return registry.plus(list(measured.entries))


class Gate:
    """The decisions of one process for one store, SKU and device (see the module)."""

    def __init__(self, store: Store, sku: str, device: DeviceClass | None, trust: Trust | None = None,
                 policy: str | None = None, registry: known_bad.Registry | None = None) -> None:
        self.store, self.sku, self.device, self.trust = store, sku, device, trust
        self.policy = policy or policy_from_env()
        self.registry = registry if registry is not None or self.policy == "off" else registry_for(store, sku)
        self._decided: dict[tuple[str, Signature | None], KernelRefused | None] = {}

    def admit(self, kernel_key: str, sig: Signature | None, entry_of: Callable[[str], Entry | None]) -> None:
        """Raise KernelRefused unless the kernel `kernel_key` (its entry from `entry_of`, asked only once) may run
        for a call of `sig` (None: unknown, the registry's signature predicates then cannot match). Nothing when
        the policy is off or the entry is missing (the runtime's KernelMissing says that)."""
        ident = (kernel_key, sig)
        if ident not in self._decided:
            entry = entry_of(kernel_key) if self.policy != "off" else None
            if entry is None and self.policy != "off":
                return  # not decided: asked again once the kernel is there (fetched, built)
            self._decided[ident] = self.refusal(entry, sig) if entry is not None else None
        refused = self._decided[ident]
        if refused is not None:
            raise refused

    def refusal(self, entry: Entry, sig: Signature | None) -> KernelRefused | None:
        """Why `entry` must not run for `sig` (the error to raise), or None when it may (always, policy off)."""
        if self.policy == "off":
            return None
        bad = self.registry.find(sig.to_dict() if sig is not None else {}, arch=entry.arch,
                                 versions=entry.toolchain, part=known_bad.part_of(entry.family), sku=self.sku,
                                 kernel_key=entry.kernel_key) if self.registry is not None else None
        what = f"kernel {entry.kernel_key[:16]}… ({entry.family}) of SKU {self.sku}" + (f" for {sig}" if sig else "")
        if bad is not None:
            return KernelRefused(f"{what} is refused: {bad.describe()}. Use another head dim or layout, or a FA4 "
                                 f"release that fixes it; {ENV}=off runs it anyway", kernel_key=entry.kernel_key,
                                 reason=bad.id)
        if self.device is None:
            return None
        verdict = self.verdict(_full_key(entry))
        if verdict is not None and not verdict.passed:
            return KernelRefused(f"{what} failed certification on {self.device}: {verdict.describe()} (source: "
                                 f"fa4-aot certify, {verdict.when}; {self._origin()}). {ENV}=off runs it anyway",
                                 kernel_key=entry.kernel_key, reason=verdict.status)
        if verdict is None and self.policy == "require":
            return KernelRefused(f"{what} has no certification for {self.device} and {ENV}=require: run `fa4-aot "
                                 f"certify --sku {self.sku} --keys {entry.kernel_key}` on such a GPU (and sign and "
                                 "push), or use the default policy known-bad", kernel_key=entry.kernel_key,
                                 reason="unchecked")
        return None

    def verdict(self, kernel_key: str) -> Verdict | None:
        """This device class's verdict of `kernel_key`: from valid signed manifests under a trust policy, else
        from the store. None when it was never certified here."""
        assert self.device is not None
        if self.trust is not None and self.trust.enforced:
            listed: Any = self.trust.listed_verdicts().get(kernel_key, {}).get(self.device.id)
            return Verdict.from_dict({**listed, "kernel_key": kernel_key, "device": self.device.id}) \
                if isinstance(listed, dict) else None
        mine = [v for v in self.store.verdicts(kernel_key) if v.device == self.device.id]
        return mine[-1] if mine else None

    def _origin(self) -> str:
        signed = self.trust is not None and self.trust.enforced
        return "listed by a signed manifest" if signed else f"verdict kept in {self.store.root}"


def _full_key(entry: Entry) -> str:
    """The key a kernel's verdicts are kept under: its full key (certification resolves every kernel to the
    entry of the device's constants), also when `entry` is the base-key signpost that install() loads where the
    device's constants equal the build's."""
    try:
        return kernel_keys.entry_keys(entry)[1]
    except ValueError:  # an entry whose constants this version cannot compute: its own key
        return entry.kernel_key
