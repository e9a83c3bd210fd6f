"""Signed SKU manifests: which kernel keys map to which object digests, signed with Ed25519.

A client that trusts some public keys (FA4_AOT_TRUSTED_KEYS) loads a kernel only if a valid manifest signed
by one of them lists its key with that object digest. Valid: known key, good signature, the SKU asked for,
not expired, neither its key nor the manifest revoked. Envelopes are JSON:

    {"format": "fa4-aot-manifest/1", "manifest": {...}, "key_id": "...", "public_key": "<b64>", "signature": "<b64>"}

where the signature covers the canonical JSON of "manifest" (sort_keys, compact separators) and the
manifest holds {"sku": {...facts}, "kernels": {kernel_key: object_digest}, "toolchain", "created", "expires"}
and, for the lean runtime, "libraries": {kernel_key: {host arch: {"digest": library object, "needs": {SONAME:
runtime library object or ""}}}} and "recipes": {recipe key: sha256 of the recipe file's bytes}. Manifests
signed before the lean runtime lack the last two: they still serve install(), and the lean runtime refuses
under them (re-sign). "verdicts": {kernel_key: {device class id: listing}} lists what certification measured
of listed kernels (domain/verdicts.py; a listing is a Verdict's fields without kernel_key and device): under a
trust policy these are the only verdicts a client believes (trust/certified.py). Manifests signed before
certification lack it and stay valid: their kernels are unchecked.
A manifest's id is the sha256 of its canonical JSON; revocations name key ids or manifest ids. The keys
themselves (generating, loading, key ids, FA4_AOT_TRUSTED_KEYS) are signing_keys.py's.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..domain.kernel_keys import dumps, serves
from ..domain.skus import Sku
from ..domain.verdicts import Verdict, by_device
from ..errors import StoreError, TrustError
from ..store import Store, check_hex
from .signing_keys import PublicKey, public_of

if TYPE_CHECKING:  # cryptography is imported where keys are used: importing it costs a client's cold start
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

FORMAT = "fa4-aot-manifest/1"
_UTC_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")


def manifest_of(store: Store, sku: Sku, expires_days: float = 365.0, now: dt.datetime | None = None
                ) -> dict[str, Any]:
    """The unsigned manifest of every kernel `store` holds for `sku`. Raises TrustError if it holds none."""
    # every kernel a client of this SKU may load, whichever SKU's build compiled it (kernels are shared)
    entries = [e for e in store.entries() if serves(e, sku)]
    if not entries:
        raise TrustError(f"{store.root} holds no kernels for {sku.name}; run `fa4-aot build --sku {sku.name}` first")
    now = now or dt.datetime.now(dt.UTC)
    toolchains = sorted({dumps(e.toolchain) for e in entries})
    from ..store import recipes

    return {
        "sku": {"name": sku.name, **sku.target_facts()},
        "kernels": {e.kernel_key: e.object_digest for e in sorted(entries, key=lambda e: e.kernel_key)},
        "libraries": {e.kernel_key: {arch: library_listing(lib) for arch, lib in sorted(e.shared_libs.items())}
                      for e in sorted(entries, key=lambda e: e.kernel_key) if e.shared_libs},
        "recipes": {key: hashlib.sha256(data).hexdigest()
                    for key, data in sorted(recipes.keys_for(store, sku.target_facts()))},
        "verdicts": verdicts_of(store, sorted(e.kernel_key for e in entries)),
        "toolchain": [json.loads(t) for t in toolchains],
        "created": _iso(now),
        "expires": _iso(now + dt.timedelta(days=expires_days)),
    }


def library_listing(lib: dict[str, Any]) -> dict[str, Any]:
    """What a manifest lists of one linked library (an Entry.shared_libs value): its digest and its needs."""
    return {"digest": lib["digest"], "needs": dict(sorted(lib.get("needs", {}).items()))}


def verdicts_of(store: Store, kernel_keys: list[str]) -> dict[str, dict[str, Any]]:
    """{kernel key: {device class id: listing}} of the kernels among `kernel_keys` that have verdicts in `store`
    (the newest per device class). StoreError for a malformed verdict file: it names the fix."""
    held = set(store.verdict_keys())
    return {key: {device: verdict_listing(v) for device, v in sorted(by_device(store.verdicts(key)).items())}
            for key in kernel_keys if key in held}


_UNSAID: dict[str, Any] = {"detail": "", "tensor": "", "error": None, "bound": None, "calls": []}  # Verdict's defaults


def verdict_listing(v: Verdict) -> dict[str, Any]:
    """What a manifest lists of one verdict: its fields without kernel_key and device (the keys it is filed under)
    and without those at Verdict's defaults (a pass lists status, checks, calls, toolchain and when): a manifest
    lists every certified kernel of a SKU, thousands, under the server's cap (service.limits.MANIFEST_BODY_LIMIT)."""
    return {name: value for name, value in v.to_dict().items()
            if name not in ("kernel_key", "device") and not (name in _UNSAID and value == _UNSAID[name])}


def verdict_of(kernel_key: str, device: str, listing: Any) -> Verdict:
    """The Verdict a listing of kernel `kernel_key` on `device` stands for (inverse of verdict_listing, as
    certified.Gate rebuilds it); ValueError naming what is malformed, types included (the value is from another
    host: a count must be a count, a time a UTC time)."""
    if not isinstance(listing, dict):
        raise ValueError(f"expected an object, got {json.dumps(listing)[:80]}")
    verdict = Verdict.from_dict({**listing, "kernel_key": kernel_key, "device": device})
    if isinstance(verdict.checks, bool) or not isinstance(verdict.checks, int) or verdict.checks < 0:
        raise ValueError(f"invalid verdict checks {verdict.checks!r}: expected a count")
    if not isinstance(verdict.toolchain, str) or not isinstance(verdict.when, str) or \
            not _UTC_TIME.fullmatch(verdict.when):
        raise ValueError(f"invalid verdict toolchain or time ({str(verdict.toolchain)[:40]!r}, "
                         f"{str(verdict.when)[:40]!r}): expected a string and a UTC time like 2026-11-30T12:00:00Z")
    if any(isinstance(getattr(verdict, n), bool) for n in ("error", "bound")):
        raise ValueError("invalid verdict error or bound: expected a number, not true or false")
    return verdict


def sign(manifest: dict[str, Any], key: Ed25519PrivateKey, name: str = "") -> dict[str, Any]:
    public = public_of(key, name)
    return {
        "format": FORMAT, "manifest": manifest, "key_id": public.key_id,
        "public_key": base64.b64encode(public.raw).decode(),
        "signature": base64.b64encode(key.sign(dumps(manifest).encode())).decode(),
    }


def manifest_id(envelope: dict[str, Any]) -> str:
    return hashlib.sha256(dumps(envelope.get("manifest")).encode()).hexdigest()


def check_shape(envelope: Any) -> dict[str, Any]:
    """Structural checks only (no trust): what the server does before storing an envelope. Returns the manifest."""
    if not isinstance(envelope, dict) or envelope.get("format") != FORMAT:
        raise TrustError(f"not a signed manifest: expected an object with format {FORMAT!r}")
    manifest = envelope.get("manifest")
    for name in ("key_id", "public_key", "signature"):
        if not isinstance(envelope.get(name), str):
            raise TrustError(f"signed manifest lacks the string field {name!r}")
    if not isinstance(manifest, dict) or not isinstance(manifest.get("kernels"), dict):
        raise TrustError("signed manifest has no 'kernels' map")
    if not isinstance(manifest.get("sku"), dict) or not isinstance(manifest["sku"].get("name"), str):
        raise TrustError("signed manifest has no sku name")
    for name in ("libraries", "recipes", "verdicts"):
        if name in manifest and not isinstance(manifest[name], dict):
            raise TrustError(f"signed manifest's {name!r} is not a map")
    try:
        for kernel_key, digest in manifest["kernels"].items():
            check_hex(kernel_key, "kernel key")
            check_hex(digest)
        for digest in (manifest.get("recipes") or {}).values():
            check_hex(digest, "recipe digest")
        _check_libraries(manifest.get("libraries") or {}, manifest["kernels"])
    except StoreError as e:
        raise TrustError(f"signed manifest lists {e}") from e
    _check_verdicts(manifest.get("verdicts") or {}, manifest["kernels"])
    for name in ("created", "expires"):
        _parse_time(manifest.get(name), name)
    return manifest


def _check_libraries(libraries: dict[str, Any], kernels: dict[str, Any]) -> None:
    """StoreError (a malformed id) or TrustError unless `libraries` maps listed kernels to {arch: listing}."""
    for kernel_key, per_arch in libraries.items():
        if kernel_key not in kernels or not isinstance(per_arch, dict):
            raise TrustError(f"signed manifest lists libraries of kernel {str(kernel_key)[:64]!r}, which it does "
                             "not list as a kernel")
        for lib in per_arch.values():
            if not isinstance(lib, dict) or not isinstance(lib.get("needs"), dict):
                raise TrustError(f"signed manifest lists a malformed library of kernel {kernel_key}")
            check_hex(str(lib.get("digest")), "library digest")
            for digest in lib["needs"].values():
                if digest:
                    check_hex(digest, "runtime library digest")


def _check_verdicts(verdicts: dict[str, Any], kernels: dict[str, Any]) -> None:
    """TrustError unless `verdicts` maps listed kernels to {device class id: a listing that is a valid Verdict}."""
    for kernel_key, per_device in verdicts.items():
        if kernel_key not in kernels or not isinstance(per_device, dict):
            raise TrustError(f"signed manifest lists verdicts of kernel {str(kernel_key)[:64]!r}, which it does not "
                             "list as a kernel")
        for device, listing in per_device.items():
            try:
                verdict_of(kernel_key, device, listing)
            except (ValueError, TypeError) as e:
                raise TrustError(f"signed manifest lists a malformed verdict of kernel {kernel_key} on "
                                 f"{str(device)[:80]!r} ({str(e)[:200]}); sign again with `fa4-aot sign`") from None


@dataclass
class Revocations:
    keys: set[str] = field(default_factory=set)
    manifests: set[str] = field(default_factory=set)

    @classmethod
    def parse(cls, text: str) -> Revocations:
        """Lines `key <key_id>` or `manifest <manifest_id>`; '#' comments and blank lines skipped."""
        out = cls()
        for n, line in enumerate(text.splitlines(), 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            kind, _, ident = line.partition(" ")
            if kind not in ("key", "manifest") or not ident.strip():
                raise TrustError(f"revocation line {n} {line!r}: expected 'key <key_id>' or 'manifest <id>'")
            (out.keys if kind == "key" else out.manifests).add(ident.strip())
        return out

    def merge(self, other: Revocations) -> Revocations:
        return Revocations(self.keys | other.keys, self.manifests | other.manifests)


def verify(envelope: Any, trusted: dict[str, PublicKey], sku: Sku, revoked: Revocations,
           now: dt.datetime | None = None) -> dict[str, Any]:
    """The manifest of `envelope` if it is valid for `sku` under `trusted` and `revoked`; TrustError otherwise."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    manifest = check_shape(envelope)
    key = trusted.get(envelope["key_id"])
    if key is None or base64.b64encode(key.raw).decode() != envelope["public_key"]:
        raise TrustError(f"manifest signed by key {envelope['key_id']}, which is not in FA4_AOT_TRUSTED_KEYS")
    if key.key_id in revoked.keys:
        raise TrustError(f"manifest signed by revoked key {key.key_id}")
    if manifest_id(envelope) in revoked.manifests:
        raise TrustError(f"manifest {manifest_id(envelope)} is revoked")
    try:
        Ed25519PublicKey.from_public_bytes(key.raw).verify(base64.b64decode(envelope["signature"]),
                                                           dumps(manifest).encode())
    except (InvalidSignature, ValueError) as e:
        raise TrustError(f"bad signature on manifest {manifest_id(envelope)} (key {key.key_id})") from e
    if manifest["sku"] != {"name": sku.name, **sku.target_facts()}:
        raise TrustError(f"manifest {manifest_id(envelope)} is for {manifest['sku']}, not {sku.name}")
    if _parse_time(manifest["expires"], "expires") <= (now or dt.datetime.now(dt.UTC)):
        raise TrustError(f"manifest {manifest_id(envelope)} expired at {manifest['expires']}; sign a new one")
    return manifest


def save(store: Store, envelope: dict[str, Any]) -> Path:
    """Keep an envelope in the store (Store.put_manifest: manifests/<sku>/<manifest id>.json); idempotent."""
    manifest = check_shape(envelope)
    data = json.dumps(envelope, sort_keys=True, indent=1).encode()
    return store.put_manifest(_sku_folder(manifest["sku"]["name"]), manifest_id(envelope), data)


def local(store: Store, sku_name: str, rejected: list[str] | None = None) -> list[dict[str, Any]]:
    """The envelopes the store keeps for `sku_name` (unverified: see verify). A file that is not JSON is
    passed over, and named in `rejected` when given."""
    found = []
    for data in store.manifests(_sku_folder(sku_name)):
        try:
            found.append(json.loads(data))
        except (ValueError, RecursionError) as e:
            if rejected is not None:
                rejected.append(f"a manifest of {sku_name} in {store.root} is not JSON ({str(e)[:80]}); "
                                "`fa4-aot pull` or `fa4-aot sign` writes it again")
    return found


def _sku_folder(name: str) -> str:
    if not name or not all(c.isalnum() or c == "-" for c in name) or name != name.lower():
        raise TrustError(f"invalid SKU name {name!r} in manifest")
    return name


def _iso(t: dt.datetime) -> str:
    return t.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(value: Any, name: str) -> dt.datetime:
    # A regex and fromisoformat rather than strptime, whose first use imports and compiles _strptime: this
    # runs on a client's first kernel load.
    if not isinstance(value, str) or not _UTC_TIME.fullmatch(value):
        raise TrustError(f"manifest field {name!r} is {value!r}, not a UTC time like 2026-11-30T12:00:00Z")
    try:
        return dt.datetime.fromisoformat(value)
    except ValueError as e:
        raise TrustError(f"manifest field {name!r} is {value!r}, not a valid time") from e
