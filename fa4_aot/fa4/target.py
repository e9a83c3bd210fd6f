"""Make FA4 compile for a target SKU in a process that may have no GPU at all.

Everything FA4 and the CuTe DSL read from a GPU while choosing or compiling kernels is answered from
the SKU here, never from the build host:
- FLASH_ATTENTION_ARCH (kernel path), CUTE_DSL_ARCH (compile target), FLASH_ATTENTION_NUM_SMS (heuristics);
- cutlass.utils.HardwareInfo, which persistent tile schedulers call at compile time for the SM count they
  bake into the grid, and for max active clusters;
- torch.cuda.current_device(), which torch's __dlpack__ calls for the deterministic backward's tensors;
- flash_attn.cute.utils._fa_disable_2cta_cuda12, which FA4 computes from torch.version.cuda at import;
- FA4's hard-coded L2 budgets (l2.py), which become the SKU constants l2_budget / prepare_l2_budget.
`configure()` must run in a fresh process before flash_attn is imported: FA4 caches the arch.
"""

from __future__ import annotations

import os
from typing import Any

from ..domain.skus import Sku
from ..errors import BuildError
from . import l2
from .consumed import consume
from .versions import cutlass_cuda_flavor


def make_hardware_info(sku: Sku) -> type:
    class SkuHardwareInfo:
        """cutlass.utils.HardwareInfo answering for `sku` instead of the local device."""

        def __init__(self, device_id: int = 0) -> None:
            self.device_id = device_id

        def get_device_multiprocessor_count(self) -> int:
            return consume("sm_count", sku)

        def get_max_active_clusters(self, cluster_size: int, stream: Any = None) -> int:
            # One CTA per SM at maximum shared memory, as FA4's kernels run. Clusters of 1 and 2 fill every
            # SM pair; larger ones are limited by the GPC layout (measured on the H200: 4 -> 30, not 33),
            # which the SKU table does not hold, so refuse rather than guess.
            if cluster_size > 2:
                raise BuildError(f"max active clusters of size {cluster_size} on {sku.name} is not known; "
                                 "only cluster sizes 1 and 2 can be derived from the SM count")
            return consume(f"max_active_clusters({cluster_size})", sku)

        def get_l2_cache_size_in_bytes(self) -> int:
            return consume("l2_bytes", sku)

    SkuHardwareInfo.__name__ = f"SkuHardwareInfo[{sku.name}]"
    return SkuHardwareInfo


def configure(sku: Sku) -> None:
    """Point FA4 and CuTe at `sku` in this process. Raises BuildError if the compiler's CUDA flavour differs."""
    os.environ["FLASH_ATTENTION_ARCH"] = sku.fa4_arch
    os.environ["CUTE_DSL_ARCH"] = sku.arch
    os.environ["FLASH_ATTENTION_NUM_SMS"] = str(sku.sm_count)

    import cutlass.utils
    import cutlass.utils.hardware_info
    import torch

    flavor = cutlass_cuda_flavor()
    if flavor != f"cu{sku.cuda_major}":
        raise BuildError(
            f"SKU {sku.name} targets CUDA {sku.cuda_major} but the CuTe compiler loaded its {flavor} flavour; "
            f"build it in an environment with nvidia-cutlass-dsl-libs-cu{sku.cuda_major} as the newest flavour"
        )
    hardware_info = make_hardware_info(sku)
    # deliberate monkeypatch of CuTe's class: FA4 calls it while compiling and we answer for the target SKU
    cutlass.utils.HardwareInfo = hardware_info  # type: ignore[misc,assignment]
    cutlass.utils.hardware_info.HardwareInfo = hardware_info  # type: ignore[misc,assignment]
    if not torch.cuda.is_available():
        torch.cuda.current_device = lambda: 0  # fake tensors live on cuda:0

    import flash_attn.cute.cute_dsl_utils as cute_dsl_utils
    import flash_attn.cute.tile_scheduler as tile_scheduler
    import flash_attn.cute.utils as fa_utils

    tile_scheduler.HardwareInfo = hardware_info
    l2.patch(sku)  # FA4's L2 budgets become consumed constants (off: FA4's own figures)
    cute_dsl_utils.get_max_active_clusters.cache_clear()
    fa_utils._fa_disable_2cta_cuda12 = sku.cuda_major == 12
    arch = __import__("flash_attn.cute.interface", fromlist=["_get_device_arch"])._get_device_arch()
    if arch != int(sku.fa4_arch.removeprefix("sm_")):
        raise BuildError(f"FA4 was imported before configure() and kept arch {arch}; configure in a fresh process")
