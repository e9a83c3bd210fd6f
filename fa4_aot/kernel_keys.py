"""Kernel keys: sha256 over canonical JSON of everything that changes a compiled binary.

FA4's compile keys are tuples of bools, ints, floats, strings, None, CuTe dtype classes and enums.
`canonical()` turns one into plain JSON values, injectively; anything else raises, because a value
we cannot write down exactly must not be cached. The Python version is deliberately absent: an
object exported under 3.11 loads under 3.12. Pure: the toolchain versions come in as an argument
(fa4_aot.fa4.toolchain() reads them), so nothing here imports FA4 or CuTe.
"""

from __future__ import annotations

import enum
import hashlib
import json
from typing import Any

from .skus import Sku


def canonical(value: Any) -> Any:
    """A JSON-ready, type-tagged image of an FA4 compile-key value. Raises TypeError for what it cannot encode."""
    if isinstance(value, enum.Enum):  # before int/str: IntEnum and StrEnum members must stay distinguishable
        return {"enum": f"{type(value).__module__}.{type(value).__qualname__}.{value.name}"}
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return {"float": value.hex()}
    if isinstance(value, tuple | list):
        return [canonical(v) for v in value]
    if isinstance(value, type):
        return {"type": f"{value.__module__}.{value.__qualname__}"}
    raise TypeError(f"cannot canonicalise compile-key value {value!r} of type {type(value).__name__}")


def dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def kernel_key(family: str, compile_key: Any, sku: Sku, tools: dict[str, str]) -> str:
    """sha256 hex of the canonical description of one kernel binary for one SKU, built by `tools`
    (the toolchain versions, `fa4_aot.fa4.toolchain()` on a host with FA4)."""
    doc = {
        "family": family,
        "compile_key": canonical(compile_key),
        "target": sku.target_facts(),
        "toolchain": tools,
    }
    return hashlib.sha256(dumps(doc).encode()).hexdigest()
