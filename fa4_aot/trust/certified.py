"""Which kernels may be launched on this device: the certification gate both runtimes ask before a first launch.

A kernel is refused (KernelRefused, naming the symptom and its source) when
- the known-bad registry (domain/known_bad.py: the project's file plus what the store's certification measured for
  the SKU) names it for the call's signature, or
- its verdict for this device class (domain/verdicts.py) is not `pass`, or
- the policy is `require` and it has no verdict for this device class.

A measured finding may hold at some sizes only (domain/scopes.py): its known-bad entry, and the failed verdicts of
the kernels it blamed, then refuse a call only inside that scope, judged per call: the lean runtime when it binds
a call's sizes, FA4 over install() before each forward and backward (fa4/tracking's per-call check). Under a trust
policy a failed verdict that a signed manifest lists is refused whole: the store's scopes are not signed.

The policy is FA4_AOT_CERTIFIED, read when a runtime starts: `known-bad` (the default: refuse registry matches and
failed verdicts, allow unchecked kernels), `require` (also refuse unchecked ones) or `off`. Under a trust policy
(FA4_AOT_TRUSTED_KEYS) only verdicts that valid signed manifests list count; otherwise the store's verdict files
do. Decisions are kept per kernel and signature, so a kernel costs one look-up per process, not one per call.
"""

from __future__ import annotations

import json
import operator
import os
from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import Any

from ..domain import kernel_keys, known_bad, scopes
from ..domain.calls import Call
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
    return measured_for(store, sku)[0]


def measured_for(store: Store, sku: str) -> tuple[known_bad.Registry, scopes.Scopes]:
    """(registry_for's registry, the scopes of the entries `store` measured for `sku`); StoreError as there."""
    registry = known_bad.load()
    found = _measured(store, sku, lambda doc, where: (known_bad.parse(doc, where),
                                                      scopes.Scopes.from_document(doc, where)))
    if found is None:
        return registry, scopes.NONE
    measured, scoped = found
    return registry.plus(list(measured.entries)), scoped


def repros_for(store: Store, sku: str) -> dict[str, str]:
    """{measured entry id: its one-file repro} that `store`'s certification wrote for `sku`; StoreError as
    registry_for's."""
    return _measured(store, sku, known_bad.repros) or {}


def _measured(store: Store, sku: str, read: Callable[[Any, str], Any]) -> Any:
    """read(the document of the entries `store` measured for `sku`, where it is), or None when there is none;
    StoreError, naming the fix, when it is malformed."""
    data = store.known_bad(sku)
    if data is None:
        return None
    where = f"{store.root}/known-bad/{sku}.json"
    try:
        return read(json.loads(data), where)
    except (ValueError, RecursionError, ConfigError) as e:
        raise StoreError(f"the known-bad entries measured for {sku} in {store.root} are malformed ({e}); run "
                         f"`fa4-aot certify --sku {sku}` again to rewrite them") from None


_SIGNATURE = operator.attrgetter(*(f.name for f in fields(Signature)))  # a Call's or a Signature's signature fields


def _signature_key(x: Call | Signature) -> tuple[Any, ...]:
    """The signature of a call as a plain tuple: what check_call looks up before every call, without building a
    Signature (a dataclass with a __post_init__: 4 us a call on the CPU host, against 1 for this)."""
    key: tuple[Any, ...] = _SIGNATURE(x)
    return key


class Gate:
    """The decisions of one process for one store, SKU and device (see the module)."""

    def __init__(self, store: Store, sku: str, device: DeviceClass | None, trust: Trust | None = None,
                 policy: str | None = None, registry: known_bad.Registry | None = None) -> None:
        self.store, self.sku, self.device, self.trust = store, sku, device, trust
        self.policy = policy or policy_from_env()
        self.registry, self.scopes = (registry, scopes.NONE) if registry is not None or self.policy == "off" \
            else measured_for(store, sku)
        self._decided: dict[tuple[str, Signature | None], tuple[KernelRefused | None, scopes.Scope | None]] = {}
        self._scoped: dict[tuple[tuple[Any, ...], str], list[tuple[scopes.Scope, KernelRefused]]] = {}

    def admit(self, kernel_key: str, sig: Signature | None, entry_of: Callable[[str], Entry | None],
              sizes: Mapping[str, int | None] | None = None) -> None:
        """Raise KernelRefused unless the kernel `kernel_key` (its entry from `entry_of`, asked only once) may run
        for a call of `sig` (None: unknown, the registry's signature predicates then cannot match) at `sizes`
        (scopes.AXES; None: unknown, so inside any scope). Nothing when the policy is off or the entry is missing
        (the runtime's KernelMissing says that)."""
        ident = (kernel_key, sig)
        if ident not in self._decided:
            entry = entry_of(kernel_key) if self.policy != "off" else None
            if entry is None and self.policy != "off":
                return  # not decided: asked again once the kernel is there (fetched, built)
            decided = self._decided[ident] = self.decide(entry, sig) if entry is not None else (None, None)
            refused, scope = decided
            if refused is not None and scope is not None and sig is not None and entry is not None:
                self._scoped.setdefault((_signature_key(sig), known_bad.part_of(entry.family)), []).append(
                    (scope, refused))
        refused, scope = self._decided[ident]
        if refused is not None and (scope is None or sizes is None or scope.holds(sizes)):
            raise refused.with_traceback(None)  # a kept error: no traceback growing with each call

    def check_call(self, call: Call, part: str) -> None:
        """Raise KernelRefused when a call of `part` (fwd, bwd) lies in the scope of a finding against a kernel
        of its signature that an earlier call loaded (admit decided it): FA4 over install() loads a kernel once
        and then launches it at every size, so scoped refusals are judged here, before each call. Costs one
        test of an empty dict while nothing scoped is refused."""
        if not self._scoped:
            return
        for scope, refused in self._scoped.get((_signature_key(call), part), ()):
            if scope.holds(scopes.of_call(call)):
                raise refused.with_traceback(None)  # a kept error: no traceback growing with each call

    def refusal(self, entry: Entry, sig: Signature | None) -> KernelRefused | None:
        """Why `entry` must not run for `sig` at some size (the error to raise), or None when it may at every
        size (always, policy off)."""
        return self.decide(entry, sig)[0]

    def decide(self, entry: Entry, sig: Signature | None) -> tuple[KernelRefused | None, scopes.Scope | None]:
        """(why `entry` must not run for `sig`, the sizes where: None for all of them), (None, None) when it may
        run. Any unscoped match refuses at every size; scoped ones refuse in the union of their scopes."""
        if self.policy == "off":
            return None, None
        bad = [b for b in (self.registry.entries if self.registry is not None else ())
               if b.holds(sig.to_dict() if sig is not None else {}, arch=entry.arch, versions=entry.toolchain,
                          part=known_bad.part_of(entry.family), sku=self.sku, kernel_key=entry.kernel_key)]
        what = f"kernel {entry.kernel_key[:16]}… ({entry.family}) of SKU {self.sku}" + (f" for {sig}" if sig else "")
        if bad:
            found = [self.scopes.entries.get(b.id) for b in bad]
            scope = None if None in found else scopes.Scope(tuple(x for s in found if s for x in s.bounds))
            where = f" at {scope.describe()}" if scope is not None else ""
            return KernelRefused(f"{what} is refused{where}: {bad[0].describe()}{self._repro(bad)}. Use another head "
                                 f"dim or layout, or a FA4 release that fixes it; {ENV}=off runs it anyway",
                                 kernel_key=entry.kernel_key, reason=bad[0].id), scope
        if self.device is None:
            return None, None
        verdict = self.verdict(kernel_keys.build_key(entry))
        if verdict is not None and not verdict.passed:
            scoped = None if self.trust is not None and self.trust.enforced else \
                self.scopes.of_kernel(kernel_keys.build_key(entry))
            where = f" at {scoped[1].describe()}" if scoped is not None else ""
            return KernelRefused(f"{what} failed certification on {self.device}{where}: {verdict.describe()} "
                                 f"(source: fa4-aot certify, {verdict.when}; {self._origin()}). {ENV}=off runs it "
                                 "anyway", kernel_key=entry.kernel_key, reason=verdict.status), \
                scoped[1] if scoped is not None else None
        if verdict is None and self.policy == "require":
            return KernelRefused(f"{what} has no certification for {self.device} and {ENV}=require: run `fa4-aot "
                                 f"certify --sku {self.sku} --keys {entry.kernel_key}` on such a GPU (and sign and "
                                 "push), or use the default policy known-bad", kernel_key=entry.kernel_key,
                                 reason="unchecked"), None
        return None, None

    def _repro(self, bad: list[known_bad.Bad]) -> str:
        """Where to get the one-file repro of the first of `bad` that the store's certification wrote one for
        (read when a refusal is made, not per call); "" when none has one."""
        try:
            written = repros_for(self.store, self.sku)
        except StoreError:
            return ""  # measured_for already refused a malformed file at start; a rewrite since is not ours to judge
        ident = next((b.id for b in bad if b.id in written), None)
        return f" (a one-file repro for FA4: `fa4-aot known-bad --sku {self.sku} --repro {ident}`)" if ident else ""

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
