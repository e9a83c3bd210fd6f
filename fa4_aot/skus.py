"""GPU SKUs: the target facts a build bakes in, and the pure matching of a detected device to one of them.

A SKU is what changes a kernel binary or FA4's choice of kernel: the arch target, the SM count (FA4
sizes persistent grids and split-KV from it), the L2 size, and the CUDA major version (FA4 disables
2-CTA kernels on CUDA 12). `select()` is pure and table-tested; `detect_device()` is the only code here
that touches CUDA.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .errors import UnknownSku
from .tomlsrc import TomlSource

_ARCH = re.compile(r"sm_(\d+)(\d)a")
ARCHS = ("sm_90a", "sm_100a", "sm_103a", "sm_110a", "sm_120a")  # the arch targets FA4 has kernels for
MIB = 1 << 20
SKU_FIELDS = {"arch": str, "sm_count": int, "l2_bytes": int, "cuda_major": int, "description": str}


@dataclass(frozen=True)
class Sku:
    name: str
    arch: str  # CuTe DSL target, e.g. "sm_90a"
    sm_count: int  # multiProcessorCount: FA4's max CTAs for persistent kernels
    l2_bytes: int
    cuda_major: int
    description: str = ""

    @property
    def capability(self) -> tuple[int, int]:
        major, minor = _ARCH.fullmatch(self.arch).groups()  # type: ignore[union-attr]
        return int(major), int(minor)

    @property
    def fa4_arch(self) -> str:
        """FLASH_ATTENTION_ARCH: the kernel path FA4 takes (sm_90, sm_100, sm_103, sm_120)."""
        return self.arch.removesuffix("a")

    def target_facts(self) -> dict[str, Any]:
        """What goes into every kernel key: the facts, not the name (two names with equal facts share kernels)."""
        return {"arch": self.arch, "sm_count": self.sm_count, "l2_bytes": self.l2_bytes, "cuda_major": self.cuda_major}


@dataclass(frozen=True)
class DeviceInfo:
    """What a CUDA device reports about itself, plus the CUDA major of the runtime (torch.version.cuda)."""

    name: str
    capability: tuple[int, int]
    sm_count: int
    l2_bytes: int
    cuda_major: int


def parse_skus(src: TomlSource) -> dict[str, Sku]:
    """The `[skus.NAME]` tables of a variants file. Raises ConfigError naming file, line and field."""
    tables = src.data.get("skus", {})
    skus = {}
    for name, table in tables.items():
        header = f"[skus.{name}]"
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", name):
            raise src.fail(header, None, "SKU names are lowercase letters, digits and '-'")
        for key in table:
            if key not in SKU_FIELDS:
                raise src.fail(header, key, f"unknown field; allowed: {', '.join(SKU_FIELDS)}")
        for key, typ in SKU_FIELDS.items():
            if key not in table:
                if key == "description":
                    continue
                raise src.fail(header, None, f"missing field {key!r}")
            if not isinstance(table[key], typ) or isinstance(table[key], bool):
                raise src.fail(header, key, f"expected {typ.__name__}, got {table[key]!r}")
        if not _ARCH.fullmatch(table["arch"]):
            raise src.fail(header, "arch", f"{table['arch']!r} is not an arch target like 'sm_90a' or 'sm_100a'")
        if table["arch"] not in ARCHS:
            raise src.fail(header, "arch", f"{table['arch']!r}: FA4 targets {', '.join(ARCHS)}")
        for key in ("sm_count", "l2_bytes"):
            if table[key] <= 0:
                raise src.fail(header, key, "must be positive")
        if table["cuda_major"] not in (12, 13):
            raise src.fail(header, "cuda_major", "allowed values: 12, 13")
        skus[name] = Sku(
            name=name,
            arch=table["arch"],
            sm_count=table["sm_count"],
            l2_bytes=table["l2_bytes"],
            cuda_major=table["cuda_major"],
            description=table.get("description", ""),
        )
    return skus


def select(skus: dict[str, Sku], device: DeviceInfo, forced: str | None = None) -> tuple[Sku, list[str]]:
    """The SKU that matches `device` exactly (arch, SM count, L2, CUDA major), with a trace of why each
    other one did not. `forced` (FA4_AOT_SKU) picks by name instead. Raises UnknownSku with the fix."""
    if forced:
        if forced not in skus:
            raise UnknownSku(f"FA4_AOT_SKU={forced!r} is not a known SKU; known: {', '.join(sorted(skus))}")
        return skus[forced], [f"{forced}: forced by FA4_AOT_SKU"]
    trace, matches = [], []
    for sku in skus.values():
        why = _mismatch(sku, device)
        trace.append(f"{sku.name}: {why or 'match'}")
        if not why:
            matches.append(sku)
    if len(matches) == 1:
        return matches[0], trace
    if not matches:
        raise UnknownSku(
            f"no SKU matches this device ({device.name}: sm_{device.capability[0]}{device.capability[1]}, "
            f"{device.sm_count} SMs, L2 {device.l2_bytes // MIB} MiB, CUDA {device.cuda_major}); "
            f"known: {', '.join(sorted(skus))}. Add a [skus.NAME] table to variants.toml with these figures "
            "and run `fa4-aot build --sku NAME`, or set FA4_AOT_SKU to use one anyway"
        )
    names = ", ".join(s.name for s in matches)
    raise UnknownSku(f"several SKUs match this device ({names}); give their figures apart or set FA4_AOT_SKU")


def _mismatch(sku: Sku, device: DeviceInfo) -> str:
    if sku.capability != device.capability:
        return f"arch {sku.arch} != sm_{device.capability[0]}{device.capability[1]}"
    if sku.sm_count != device.sm_count:
        return f"{sku.sm_count} SMs != {device.sm_count}"
    if sku.l2_bytes != device.l2_bytes:
        return f"L2 {sku.l2_bytes} B != {device.l2_bytes} B"
    if sku.cuda_major != device.cuda_major:
        return f"CUDA {sku.cuda_major} != {device.cuda_major}"
    return ""


def detect_device(index: int | None = None) -> DeviceInfo:
    """Probe the current (or given) CUDA device through torch. Raises UnknownSku when there is none."""
    import torch

    if not torch.cuda.is_available():
        raise UnknownSku("no CUDA device is visible to torch; fa4_aot.install()/load() run on a GPU host")
    index = torch.cuda.current_device() if index is None else index
    props = torch.cuda.get_device_properties(index)
    cuda = torch.version.cuda or "0"
    return DeviceInfo(
        name=props.name,
        capability=(props.major, props.minor),
        sm_count=props.multi_processor_count,
        l2_bytes=props.L2_cache_size,
        cuda_major=int(cuda.split(".")[0]),
    )
