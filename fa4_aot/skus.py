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
CUDA_MAJORS = (12, 13)


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
    """The `[skus.NAME]` tables of a variants file. Raises ConfigError naming file, line and field.

    `cuda_major = [13, 12]` makes one table several SKUs: the first CUDA major keeps NAME, each further one is
    NAME-cu<major> (h200 and h200-cu12), since FA4 and the CuTe compiler differ per CUDA major."""
    skus: dict[str, Sku] = {}
    for name, table in src.data.get("skus", {}).items():
        majors = _check_table(src, name, table)
        for i, major in enumerate(majors):
            full = name if i == 0 else f"{name}-cu{major}"
            if full in skus or (i and full in src.data.get("skus", {})):
                raise src.fail(f"[skus.{name}]", "cuda_major", f"SKU {full!r} is defined twice")
            skus[full] = Sku(name=full, arch=table["arch"], sm_count=table["sm_count"], l2_bytes=table["l2_bytes"],
                             cuda_major=major, description=table.get("description", ""))
    return skus


def _check_table(src: TomlSource, name: str, table: dict[str, Any]) -> list[int]:
    """Validate one [skus.NAME] table; return its CUDA majors, first one first."""
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
        if key != "cuda_major" and (not isinstance(table[key], typ) or isinstance(table[key], bool)):
            raise src.fail(header, key, f"expected {typ.__name__}, got {table[key]!r}")
    if not _ARCH.fullmatch(table["arch"]):
        raise src.fail(header, "arch", f"{table['arch']!r} is not an arch target like 'sm_90a' or 'sm_100a'")
    if table["arch"] not in ARCHS:
        raise src.fail(header, "arch", f"{table['arch']!r}: FA4 targets {', '.join(ARCHS)}")
    for key in ("sm_count", "l2_bytes"):
        if table[key] <= 0:
            raise src.fail(header, key, "must be positive")
    majors = table["cuda_major"] if isinstance(table["cuda_major"], list) else [table["cuda_major"]]
    if any(not isinstance(m, int) or isinstance(m, bool) for m in majors):
        raise src.fail(header, "cuda_major", f"expected int or a list of ints, got {table['cuda_major']!r}")
    if not majors or any(m not in CUDA_MAJORS for m in majors) or len(set(majors)) < len(majors):
        raise src.fail(header, "cuda_major", f"got {table['cuda_major']!r}; allowed values: 12, 13, or a list of "
                       "them such as [13, 12] (the first keeps the name, the others are NAME-cu12...)")
    return majors


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
        _raise_cuda_mismatch(skus, device)
        raise UnknownSku(
            f"no SKU matches this device ({device.name}: sm_{device.capability[0]}{device.capability[1]}, "
            f"{device.sm_count} SMs, L2 {device.l2_bytes // MIB} MiB, CUDA {device.cuda_major}); "
            f"known: {', '.join(sorted(skus))}. Add a [skus.NAME] table to variants.toml with these figures "
            "and run `fa4-aot build --sku NAME`, or set FA4_AOT_SKU to use one anyway"
        )
    names = ", ".join(s.name for s in matches)
    raise UnknownSku(f"several SKUs match this device ({names}); give their figures apart or set FA4_AOT_SKU")


def _raise_cuda_mismatch(skus: dict[str, Sku], device: DeviceInfo) -> None:
    """Raise UnknownSku naming the SKUs that match this device in everything but the CUDA major of torch."""
    near = [s for s in skus.values() if _mismatch(s, device).startswith("CUDA ")]
    if not near:
        return
    names = ", ".join(f"{s.name} (CUDA {s.cuda_major})" for s in near)
    base = near[0].name.removesuffix(f"-cu{near[0].cuda_major}")
    raise UnknownSku(
        f"this device ({device.name}) matches {names}, but this torch is built for CUDA {device.cuda_major} "
        f"(torch.version.cuda) and kernels are built per CUDA major; add {device.cuda_major} to cuda_major of "
        f"[skus.{base}] in variants.toml and run `fa4-aot build --sku {base}-cu{device.cuda_major}`, or install "
        f"a torch built for CUDA {near[0].cuda_major}"
    )


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
