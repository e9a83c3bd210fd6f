"""This host's CUDA device and the SKU row that serves it, one answer for every runtime, command and certifier.

`probe()` is the only code of domain/ that touches CUDA: the device (None without one), the CUDA driver's and
runtime's versions and the CPU. `resolve()` and `resolve_certifying()` are pure: from a Probe and the SKU table,
the row (matching.select picks it), the constants, the device's certification class and why. `this_device()` and
`certifying()` join the two. `row_for()` is the [skus.NAME] row `fa4-aot skus --detect` prints.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from ..errors import UnknownSku
from . import hosts
from .matching import DeviceInfo, check_host, not_of, select
from .sku_table import unknown
from .skus import Constants, Sku
from .verdicts import DeviceClass


@dataclass(frozen=True)
class Probe:
    """What probe() read: the CUDA device (None on a host without one), cuDriverGetVersion's integer (13000 for
    13.0), torch.version.cuda ('13.0') and the CPU (read only beside a device: a host without one loads nothing)."""

    device: DeviceInfo | None
    driver: int = 0
    runtime: str = ""
    cpu: hosts.HostCpu | None = None

    @property
    def device_class(self) -> DeviceClass | None:
        """The certification class of the device (domain/verdicts.py); None without a device."""
        if self.device is None:
            return None
        return DeviceClass.of(self.device.name, self.device.sm_count, self.driver, self.runtime)


@dataclass(frozen=True)
class ThisDevice:
    """The row that serves this host, the constants a kernel must have consumed to load here, the device's
    certification class (None without a CUDA device, where FA4_AOT_SKU named the row) and matching's trace."""

    sku: Sku
    constants: Constants
    device_class: DeviceClass | None
    trace: tuple[str, ...]


def resolve(skus: dict[str, Sku], probe: Probe, forced: str | None = None) -> ThisDevice:
    """The row serving `probe`'s device (matching.select), or the `forced` row (FA4_AOT_SKU) with its own figures.
    The CPU must run the row's host code only where there is a device: a host without one checks a store and
    loads no kernel. Raises UnknownSku (HostMismatch for the CPU) with the fix."""
    sku, constants, trace = select(skus, probe.device, forced or None, probe.cpu if probe.device else None)
    return ThisDevice(sku, constants, probe.device_class, tuple(trace))


def resolve_certifying(skus: dict[str, Sku], probe: Probe, sku: str | None = None) -> tuple[Sku, DeviceClass]:
    """(the row, the device class) for certification, which runs kernels and keeps verdicts per device class: the
    device's own row (FA4_AOT_SKU is not asked), or `sku` when named; either way the device must be a GPU of that
    row (matching.not_of: arch, CUDA major, SM count) on a CPU that runs its host code. Raises UnknownSku saying
    why not."""
    if probe.device is None or probe.device_class is None:
        raise UnknownSku("no CUDA device is visible here, and certification runs kernels: run it on a GPU host of "
                         "the SKU (`fa4-aot skus --detect` there names its SKU)")
    if sku is not None and sku not in skus:
        raise unknown(sku, skus)
    row = skus[sku] if sku is not None else resolve(skus, probe).sku
    if probe.cpu is not None:
        check_host(row, probe.cpu)
    why = not_of(row, probe.device)
    if why:
        raise UnknownSku(f"this GPU ({probe.device.name}) is not of SKU {row.name} ({why}): a verdict holds only for "
                         f"the GPU that measured it; certify {row.name} on one of its GPUs, or add this GPU's row "
                         "(`fa4-aot skus --detect` prints it)")
    return row, probe.device_class


def this_device(skus: dict[str, Sku]) -> ThisDevice:
    """resolve() for this host, with FA4_AOT_SKU read now: what the runtimes, prefetch and doctor load for."""
    return resolve(skus, probe(), os.environ.get("FA4_AOT_SKU"))


def certifying(skus: dict[str, Sku], sku: str | None = None) -> tuple[Sku, DeviceClass]:
    """resolve_certifying() for this host: what `fa4-aot certify` and `fa4-aot certifier` measure on."""
    return resolve_certifying(skus, probe(), sku)


def probe(index: int | None = None) -> Probe:
    """Read the current (or given) CUDA device through torch, its driver and this CPU; Probe(None) without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return Probe(None)
    props = torch.cuda.get_device_properties(torch.cuda.current_device() if index is None else index)
    runtime = torch.version.cuda or "0"
    device = DeviceInfo(props.name, (props.major, props.minor), props.multi_processor_count, props.L2_cache_size,
                        int(runtime.split(".")[0]))
    return Probe(device, _driver_version(), runtime, hosts.detect())


def detect_device(index: int | None = None) -> DeviceInfo:
    """probe()'s device; UnknownSku when there is none (`fa4-aot skus --detect`)."""
    found = probe(index).device
    if found is None:
        raise UnknownSku("no CUDA device is visible to torch: fa4_aot loads kernels on a GPU host; to plan and "
                         "check the store for a SKU here, set FA4_AOT_SKU=NAME (`fa4-aot skus`)")
    return found


def row_for(device: DeviceInfo, name: str = "") -> dict[str, Any]:
    """The [skus.NAME] table row for `device`, as `fa4-aot skus --detect` prints it, with where each figure
    came from."""
    arch = f"sm_{device.capability[0]}{device.capability[1]}a"
    return {
        "name": name or re.sub(r"[^a-z0-9]+", "-", device.name.lower().removeprefix("nvidia ")).strip("-"),
        "arch": arch, "sm_count": device.sm_count, "l2_bytes": device.l2_bytes, "cuda_major": device.cuda_major,
        "description": device.name,
        "sources": {
            "arch": "torch.cuda.get_device_properties().major/minor (compute capability), 'a' target",
            "sm_count": "torch.cuda.get_device_properties().multi_processor_count (cudaDevAttrMultiProcessorCount)",
            "l2_bytes": "torch.cuda.get_device_properties().L2_cache_size (cudaDevAttrL2CacheSize)",
            "cuda_major": "torch.version.cuda (the CUDA runtime FA4 runs with)",
        },
    }


def _driver_version() -> int:
    """cuDriverGetVersion of the CUDA driver the process runs on (13000 for 13.0): torch has no public call."""
    import ctypes

    version = ctypes.c_int(0)
    if ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version)) != 0:
        raise UnknownSku("cuDriverGetVersion failed: the CUDA driver cannot be asked its version")
    return version.value
