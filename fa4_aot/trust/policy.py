"""The client's trust policy: may this process load a kernel, and may it take kernels from the server?

With trusted keys (FA4_AOT_TRUSTED_KEYS), every kernel, local or remote, must be listed with its object
digest by a valid manifest signed by one of them (signing.verify); manifests come from the local store
and the server, revocations from FA4_AOT_REVOKED (a file) and the server. Without trusted keys the local
store is trusted (a build host's or an operator's own cache) and remote kernels are refused, unless
FA4_AOT_INSECURE=1 accepts them unverified (with a warning once per process). Digests are re-checked by
the store on every load either way.

The lean runtime loads linked libraries and recipe files, not kernel objects: with trusted keys, a library
(and each runtime library it needs) must be listed for its kernel and host arch, and a recipe file's sha256
for its key, by valid manifests (check_library, check_recipe); the newest manifest that lists a kernel or
recipe decides, as for objects. Manifests signed before the lean runtime list neither: the lean runtime then
refuses with a message to re-sign.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from ..domain.skus import Sku
from ..errors import Fa4AotError, TrustError
from ..store import Entry, Store
from . import signing, signing_keys
from .signing import Revocations

_warned = False


def revoked_in(path: str | None) -> Revocations:
    """The revocations listed in file `path` (FA4_AOT_REVOKED); none when unset. A file that is named but cannot
    be read is a TrustError: it must not mean that nothing is revoked."""
    if not path:
        return Revocations()
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise TrustError(f"cannot read FA4_AOT_REVOKED={path} ({getattr(e, 'strerror', None) or e}): point it at "
                         "a file of `key <key_id>` and `manifest <id>` lines, or unset it") from None
    return Revocations.parse(text)


class Trust:
    def __init__(self, sku: Sku, store: Store, remote: Any, trusted: dict[str, signing_keys.PublicKey],
                 insecure: bool = False, revoked: Revocations | None = None) -> None:
        self.sku, self.store, self.remote = sku, store, remote
        self.trusted, self.insecure = trusted, insecure
        self.revoked = revoked or Revocations()
        self._allowed: dict[str, str] | None = None
        self._valid: list[dict[str, Any]] = []
        self._listings: dict[str, dict[str, Any]] = {}
        self.rejected: list[str] = []  # why manifests were not accepted, for error messages

    @classmethod
    def from_env(cls, sku: Sku, store: Store, remote: Any) -> Trust:
        """Read FA4_AOT_TRUSTED_KEYS, FA4_AOT_INSECURE and FA4_AOT_REVOKED now (config at call time)."""
        return cls(sku, store, remote, signing_keys.trusted_keys(os.environ.get("FA4_AOT_TRUSTED_KEYS")),
                   insecure=os.environ.get("FA4_AOT_INSECURE") == "1",
                   revoked=revoked_in(os.environ.get("FA4_AOT_REVOKED")))

    @property
    def enforced(self) -> bool:
        return bool(self.trusted)

    def allowed(self) -> dict[str, str]:
        """kernel key -> object digest over every valid manifest (computed once; server manifests that verify
        are kept in the local store so that a later offline process trusts the same kernels)."""
        if self._allowed is None:
            envelopes = [(e, False) for e in signing.local(self.store, self.sku.name, self.rejected)]
            revoked = self.revoked
            if self.remote is not None:
                try:
                    revoked = revoked.merge(self.remote.revocations())
                    envelopes += [(e, True) for e in self.remote.signed_manifests(self.sku.name)]
                except Fa4AotError as e:  # a server that is down must not stop local kernels from loading
                    self.rejected.append(f"server manifests and revocations unavailable: {e}")
            valid = []
            for envelope, remote in envelopes:
                try:
                    manifest = signing.verify(envelope, self.trusted, self.sku, revoked)
                except TrustError as e:
                    self.rejected.append(str(e))
                    continue
                valid.append(manifest)
                if remote:
                    signing.save(self.store, envelope)
            self._valid = valid
            self._allowed = newest_listing(valid)
        return self._allowed

    def check_library(self, entry: Entry, arch: str) -> None:
        """Raise TrustError unless the library of `entry` for host `arch`, with the runtime libraries it needs,
        is what valid manifests list for it (always passes when no keys are trusted)."""
        if not self.enforced:
            return
        self.check(entry)
        have = signing.library_listing(entry.shared_libs[arch])
        listed = self._lean("libraries").get(entry.kernel_key, {}).get(arch)
        if listed != have:
            what = "is not listed" if listed is None else f"is listed as {listed}, not {have}"
            self._refuse_lean(f"the {arch} library of kernel {entry.kernel_key} ({entry.family}) {what}", "libraries")

    def check_recipe(self, key: str, data: bytes) -> None:
        """Raise TrustError unless valid manifests list recipe file `key` with the sha256 of `data` (always
        passes when no keys are trusted)."""
        if not self.enforced:
            return
        import hashlib

        digest, listed = hashlib.sha256(data).hexdigest(), self._lean("recipes").get(key)
        if listed != digest:
            what = "is not listed" if listed is None else f"is listed with sha256 {listed}, not {digest}"
            self._refuse_lean(f"recipe file {key} {what}", "recipes")

    def listed_verdicts(self) -> dict[str, Any]:
        """{kernel key: {device class id: verdict listing}} over valid manifests (signing.verdict_listing): the
        verdicts a client under this policy believes. The newest manifest that lists a kernel's verdict for a
        device class decides that one: a manifest listing the kernel for other device classes only leaves it
        standing (a failure holds until a verdict of its own device class replaces it)."""
        if "verdicts" not in self._listings:
            self.allowed()
            found: dict[str, dict[str, Any]] = {}
            for manifest in sorted(self._valid, key=lambda m: str(m["created"])):
                for kernel_key, per_device in (manifest.get("verdicts") or {}).items():
                    found.setdefault(kernel_key, {}).update(per_device)
            self._listings["verdicts"] = found
        return self._listings["verdicts"]

    def _lean(self, field: str) -> dict[str, Any]:
        """{kernel key or recipe key: listing} over valid manifests, the newest that lists a key deciding
        (computed once per field, as allowed() is)."""
        if field not in self._listings:
            self.allowed()
            found: dict[str, Any] = {}
            for manifest in sorted(self._valid, key=lambda m: str(m["created"])):
                found.update(manifest.get(field) or {})
            self._listings[field] = found
        return self._listings[field]

    def _refuse_lean(self, what: str, field: str) -> None:
        if self._valid and not any(field in m for m in self._valid):
            why = (f"the valid manifests of {self.sku.name} were signed before the lean runtime and list no "
                   f"{field}; re-sign with `fa4-aot sign --sku {self.sku.name}` (on the build store) and push it")
        else:
            why = "; ".join(self.rejected[:3]) or f"no valid signed manifest of {self.sku.name} lists it"
        raise TrustError(f"{what} by any valid manifest signed by a key in FA4_AOT_TRUSTED_KEYS ({why}); sign "
                         f"the build with `fa4-aot sign --sku {self.sku.name}` and push it")

    def check(self, entry: Entry) -> None:
        """Raise TrustError unless `entry` may be loaded (always passes when no keys are trusted)."""
        if not self.enforced:
            return
        listed = self.allowed().get(entry.kernel_key)
        if listed == entry.object_digest:
            return
        why = "; ".join(self.rejected[:3]) or "no signed manifest for this SKU was found locally or on the server"
        what = "is not listed" if listed is None else f"is listed with object {listed}, not {entry.object_digest}"
        raise TrustError(
            f"kernel {entry.kernel_key} ({entry.family}, SKU {self.sku.name}) {what} by any valid manifest signed "
            f"by a key in FA4_AOT_TRUSTED_KEYS ({why}); sign the build with `fa4-aot sign --sku {self.sku.name}` "
            "and push it"
        )

    def refuse_remote(self) -> str:
        """Why remote kernels may not be used ('' when they may)."""
        global _warned
        if self.enforced:
            return ""
        if not self.insecure:
            return ("remote kernels are refused without trusted keys: set FA4_AOT_TRUSTED_KEYS to the build's "
                    "public key (`fa4-aot keys generate`, `fa4-aot sign`), or FA4_AOT_INSECURE=1 to accept them "
                    "unverified")
        if not _warned:
            warnings.warn("FA4_AOT_INSECURE=1: loading kernels from the server without signature checks",
                          stacklevel=3)
            _warned = True
        return ""


def newest_listing(manifests: list[dict[str, Any]]) -> dict[str, str]:
    """kernel key -> object digest over valid manifests, where the newest manifest (by `created`, which
    signing.check_shape made a UTC timestamp) that lists a key decides its digest, whatever order they came in."""
    allowed: dict[str, str] = {}
    for manifest in sorted(manifests, key=lambda m: str(m["created"])):
        allowed.update(manifest["kernels"])
    return allowed
