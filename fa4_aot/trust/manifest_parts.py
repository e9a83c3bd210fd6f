"""A SKU's manifest cut into parts that each fit what a server takes (MAX_ENVELOPE, the server's
service.limits.MANIFEST_BODY_LIMIT).

Verdicts grow with device classes (each class certified adds one listing per kernel), so one manifest of a SKU
certified on many classes outgrows the cap. Every part lists the same kernels, libraries and recipes and the
verdicts of some device classes, so any part alone admits the kernels and the parts together list every verdict.
Clients take each kernel's verdict for their device class from the newest valid manifest that lists one
(trust/policy.py listed_verdicts), and parts never list one class twice. Pure: no keys, no I/O.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import TrustError

MAX_ENVELOPE = 8 << 20  # bytes of a signed manifest a server takes (service.limits.MANIFEST_BODY_LIMIT)
ENVELOPE_ROOM = 4096  # what the envelope adds to its manifest: format, key id, public key, signature, spacing


def size(manifest: dict[str, Any]) -> int:
    """About the bytes of `manifest`'s envelope as a client sends it (never less)."""
    return len(json.dumps(manifest)) + ENVELOPE_ROOM


def parts(manifest: dict[str, Any], limit: int = MAX_ENVELOPE) -> list[dict[str, Any]]:
    """`manifest` alone when its envelope fits `limit`, else parts that do, each listing every kernel and the
    verdicts of a run of device classes (in id order). TrustError naming the fix when the kernels alone, or one
    device class's verdicts with them, do not fit."""
    if size(manifest) <= limit:
        return [manifest]
    by_class = _by_class(manifest.get("verdicts") or {})
    if size(_part(manifest, by_class, [])) > limit:
        raise TrustError(_too_big(manifest, limit, "", size(_part(manifest, by_class, []))))
    found: list[dict[str, Any]] = []
    classes: list[str] = []
    for device in sorted(by_class):
        if classes and size(_part(manifest, by_class, classes + [device])) > limit:
            found.append(_part(manifest, by_class, classes))
            classes = []
        classes.append(device)
        if size(_part(manifest, by_class, classes)) > limit:
            raise TrustError(_too_big(manifest, limit, device, size(_part(manifest, by_class, classes))))
    return found + [_part(manifest, by_class, classes)]


def _by_class(verdicts: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """{device class: {kernel key: listing}} of a manifest's {kernel key: {device class: listing}}."""
    found: dict[str, dict[str, Any]] = {}
    for kernel_key, per_device in verdicts.items():
        for device, listing in per_device.items():
            found.setdefault(device, {})[kernel_key] = listing
    return found


def _part(manifest: dict[str, Any], by_class: dict[str, dict[str, Any]], classes: list[str]) -> dict[str, Any]:
    verdicts: dict[str, dict[str, Any]] = {}
    for device in classes:
        for kernel_key, listing in by_class[device].items():
            verdicts.setdefault(kernel_key, {})[device] = listing
    return {**manifest, "verdicts": dict(sorted(verdicts.items()))}


def _too_big(manifest: dict[str, Any], limit: int, device: str, bytes_: int) -> str:
    what = f"with the verdicts of device class {device} alone" if device else "without any verdict"
    return (f"the manifest of SKU {manifest['sku']['name']} cannot be cut to fit the {limit >> 20} MiB a server "
            f"takes: its {len(manifest['kernels'])} kernels {what} are {bytes_ >> 10} KiB; sign a store that "
            "holds fewer of this SKU's kernels (a smaller variant matrix)")
