"""A CUDA device as it reports itself: `detect_device()` (the only code of domain/ that touches CUDA) and the
`[skus.NAME]` row it would have (`fa4-aot skus --detect`). Which row of the table serves it is matching.py's."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..errors import UnknownSku
from .verdicts import DeviceClass


@dataclass(frozen=True)
class DeviceInfo:
    """What a CUDA device reports about itself, plus the CUDA major of the runtime (torch.version.cuda)."""

    name: str
    capability: tuple[int, int]
    sm_count: int
    l2_bytes: int
    cuda_major: int


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


def detect_device(index: int | None = None) -> DeviceInfo:
    """Probe the current (or given) CUDA device through torch. Raises UnknownSku when there is none."""
    import torch

    if not torch.cuda.is_available():
        raise UnknownSku("no CUDA device is visible to torch: fa4_aot loads kernels on a GPU host; to plan and "
                         "check the store for a SKU here, set FA4_AOT_SKU=NAME (`fa4-aot skus`)")
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


def device_class(index: int | None = None) -> DeviceClass | None:
    """The certification class of the current (or given) CUDA device: its name and SM count, the CUDA driver's
    version and the runtime's (domain/verdicts.py). None when no CUDA device is visible."""
    import torch

    if not torch.cuda.is_available():
        return None
    index = torch.cuda.current_device() if index is None else index
    props = torch.cuda.get_device_properties(index)
    return DeviceClass.of(props.name, props.multi_processor_count, _driver_version(), torch.version.cuda or "0")


def _driver_version() -> int:
    """cuDriverGetVersion of the CUDA driver the process runs on (13000 for 13.0): torch has no public call."""
    import ctypes

    version = ctypes.c_int(0)
    if ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version)) != 0:
        raise UnknownSku("cuDriverGetVersion failed: the CUDA driver cannot be asked its version")
    return version.value
