"""Kernel keys: sha256 over canonical JSON of everything that changes a compiled binary.

FA4's compile keys are tuples of bools, ints, floats, strings, None, CuTe dtype classes and enums.
`canonical()` turns one into plain JSON values, injectively; anything else raises, because a value
we cannot write down exactly must not be cached. The Python version is deliberately absent: an
object exported under 3.11 loads under 3.12.
"""

from __future__ import annotations

import enum
import hashlib
import json
from functools import lru_cache
from importlib import metadata
from typing import Any

from .skus import Sku

# The distributions whose code generates the kernels. Changing any of them changes the keys.
TOOLCHAIN_DISTRIBUTIONS = ("flash-attn-4", "nvidia-cutlass-dsl", "apache-tvm-ffi", "quack-kernels")


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


@lru_cache(maxsize=1)
def toolchain() -> dict[str, str]:
    """Installed versions of the kernel-generating packages, plus the CUDA flavour of the CuTe compiler."""
    versions = {}
    for dist in TOOLCHAIN_DISTRIBUTIONS:
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = "absent"
    versions["cutlass-dsl-cuda"] = cutlass_cuda_flavor()
    return versions


def cutlass_cuda_flavor() -> str:
    """'cu12' or 'cu13': the toolkit flavour the CuTe compiler loaded (it picks the newest one installed when
    no driver is present). Imports cutlass, so call it only where FA4 is about to be used anyway."""
    import sys

    import cutlass  # noqa: F401  (loads the flavoured _cutlass_ir module)

    module = sys.modules.get("cutlass._mlir._mlir_libs._cutlass_ir")
    name = getattr(module, "__file__", "") or ""
    for part in name.split("."):
        if part.startswith("cu") and part[2:].isdigit():
            return part
    return "unknown"


def kernel_key(family: str, compile_key: Any, sku: Sku, tools: dict[str, str] | None = None) -> str:
    """sha256 hex of the canonical description of one kernel binary for one SKU."""
    tools = tools if tools is not None else toolchain()
    return _key_of(family, canonical(compile_key), sku.target_facts(), tools)


def entry_key(entry: Any) -> str:
    """The kernel key that an index entry's own fields (family, canonical compile_key, SKU facts, toolchain)
    hash to: what a server recomputes before it accepts an entry, so no entry can claim another's key."""
    sku = Sku(entry.sku, entry.arch, entry.sm_count, entry.l2_bytes, entry.cuda_major)
    return _key_of(entry.family, entry.compile_key, sku.target_facts(), dict(entry.toolchain))


def _key_of(family: str, canonical_compile_key: Any, target: dict[str, Any], tools: dict[str, str]) -> str:
    doc = {"family": family, "compile_key": canonical_compile_key, "target": target, "toolchain": tools}
    return hashlib.sha256(dumps(doc).encode()).hexdigest()
