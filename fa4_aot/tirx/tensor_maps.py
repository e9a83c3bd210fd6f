"""The host side of a TIRx FA4 launch, pure: the TMA tensor maps' fields and the launch's grid, block and shared
memory, in the order the cubin declares its parameters.

The fields are tirx-kernels' `build_tensor_maps` (ported/flashattention/flash_attention4.py) for the sm_100a
schedule (one CTA per MMA, no 2-CTA clusters): fp16, 128-byte swizzle, 128-byte L2 promotion, no interleave, no
out-of-bounds fill; strides in bytes, innermost dimension first. q, k, v and o are (batch, seqlen, heads, 128)
contiguous fp16 tensors. cuda_driver.py encodes them with cuTensorMapEncodeTiled; tests compare them with the
upstream function's own arguments.
"""

from __future__ import annotations

from dataclasses import dataclass

from .kernel_file import KernelFile
from .problem import BLK_M, BLK_N, F16_BYTES, Problem

CU_TENSOR_MAP_DATA_TYPE_FLOAT16 = 6
CU_TENSOR_MAP_INTERLEAVE_NONE = 0
CU_TENSOR_MAP_SWIZZLE_128B = 3
CU_TENSOR_MAP_L2_PROMOTION_L2_128B = 2
CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0
_TENSORS = {"Q_tensor_map": "q", "Q_tensor_map_1": "q", "K_tensor_map": "k", "K_tensor_map_1": "k",
            "V_tensor_map": "v", "V_tensor_map_1": "v", "O_tensor_map": "o"}


@dataclass(frozen=True)
class TensorMapSpec:
    """One cuTensorMapEncodeTiled call but for the global address: which tensor, and every other argument."""

    tensor: str  # q, k, v or o
    dims: tuple[int, ...]
    strides: tuple[int, ...]  # bytes, dims[1:]
    box: tuple[int, ...]
    element_strides: tuple[int, ...]
    data_type: int = CU_TENSOR_MAP_DATA_TYPE_FLOAT16
    interleave: int = CU_TENSOR_MAP_INTERLEAVE_NONE
    swizzle: int = CU_TENSOR_MAP_SWIZZLE_128B
    l2_promotion: int = CU_TENSOR_MAP_L2_PROMOTION_L2_128B
    oob_fill: int = CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE

    @property
    def rank(self) -> int:
        return len(self.dims)


@dataclass(frozen=True)
class Launch:
    function: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int
    cluster: tuple[int, int, int]
    maps: tuple[TensorMapSpec, ...]  # in the cubin's parameter order


def _spec(tensor: str, dims: tuple[int, ...], strides: tuple[int, ...], box: tuple[int, ...]) -> TensorMapSpec:
    return TensorMapSpec(tensor, dims, strides, box, (1,) * len(dims))


def tensor_map(problem: Problem, tensor: str) -> TensorMapSpec:
    """The map of `tensor` (q, k, v, o) for `problem` (build_tensor_maps' q_map, k_map, v_map, o_map)."""
    p, half = problem, problem.head_dim // 2
    if tensor in ("k", "v"):
        return _spec(tensor, (half, p.seqlen_kv, p.batch * p.heads_kv * 2),
                     (p.heads_kv * p.head_dim * F16_BYTES, p.head_dim), (half, BLK_N, 2))
    rows = BLK_M // p.gqa
    if p.gqa == 1:
        return _spec(tensor, (half, p.seqlen_q, p.batch * p.heads_q * 2),
                     (p.heads_q * p.head_dim * F16_BYTES, p.head_dim), (half, rows, 2))
    return _spec(tensor, (half, p.heads_q, p.seqlen_q, p.batch * 2),
                 (p.head_dim * F16_BYTES, p.heads_q * p.head_dim * F16_BYTES, p.head_dim), (half, p.gqa, rows, 2))


def launch(kernel: KernelFile, problem: Problem) -> Launch:
    """Everything a launch of `kernel` for `problem` passes, but the tensors' addresses and the stream. ValueError
    for a kernel file whose parameters are not the seven tensor maps, or that needs a cluster launch."""
    unknown = [p for p in kernel.params if p not in _TENSORS]
    if unknown or len(kernel.params) != len(_TENSORS):
        raise ValueError(f"kernel {kernel.function} takes {list(kernel.params)}, not the TIRx FA4 tensor maps "
                         f"{sorted(_TENSORS)}; rebuild it with this fa4-aot (`fa4-aot build --family tirx`)")
    if kernel.cluster != (1, 1, 1):
        raise ValueError(f"kernel {kernel.function} needs clusters {kernel.cluster}: the sm_100a TIRx kernel "
                         "runs without; this launcher does not do cluster launches")
    maps = tuple(tensor_map(problem, _TENSORS[p]) for p in kernel.params)
    return Launch(kernel.function, kernel.grid, kernel.block, kernel.shared_bytes, kernel.cluster, maps)
