"""The CUDA driver API through ctypes, for the TIRx launcher: cuTensorMapEncodeTiled, cuModuleLoadData,
cuModuleGetFunction, cuFuncSetAttribute, cuLaunchKernel. No TVM, no CUDA toolkit: libcuda.so.1 of the driver.

`encode_arguments()` is the pure part (the C arrays one encode call passes), so it is tested on a CPU host; the
rest runs where libcuda is, in the current CUDA context (torch's, once torch has touched the device).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

from ..errors import Fa4AotError
from .tensor_maps import Launch, TensorMapSpec

CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
TENSOR_MAP_BYTES = 128  # sizeof(CUtensorMap): 16 x uint64, 64-byte aligned


class CudaError(Fa4AotError, RuntimeError):
    """A CUDA driver call failed; the message names the call and the driver's error code."""


class TensorMap(ctypes.Structure):
    _align_ = 64  # honoured by Python >= 3.13; the buffer below is aligned by hand for older ones
    _fields_ = [("opaque", ctypes.c_uint64 * 16)]


def encode_arguments(spec: TensorMapSpec, address: int) -> tuple[Any, ...]:
    """cuTensorMapEncodeTiled's arguments after the output pointer, as ctypes values."""
    rank = spec.rank
    return (ctypes.c_int(spec.data_type), ctypes.c_uint32(rank), ctypes.c_void_p(address),
            (ctypes.c_uint64 * rank)(*spec.dims), (ctypes.c_uint64 * (rank - 1))(*spec.strides),
            (ctypes.c_uint32 * rank)(*spec.box), (ctypes.c_uint32 * rank)(*spec.element_strides),
            ctypes.c_int(spec.interleave), ctypes.c_int(spec.swizzle), ctypes.c_int(spec.l2_promotion),
            ctypes.c_int(spec.oob_fill))


class Driver:
    def __init__(self) -> None:
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise CudaError(f"the CUDA driver (libcuda.so.1) cannot be loaded: {e}; TIRx kernels run on GPU hosts "
                            "with an NVIDIA driver") from e

    def check(self, call: str, *args: Any) -> None:
        code = getattr(self.lib, call)(*args)
        if code != 0:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(code, ctypes.byref(name))
            raise CudaError(f"{call} failed: {name.value.decode() if name.value else code}")

    def encode(self, spec: TensorMapSpec, address: int) -> ctypes.Array[ctypes.c_char]:
        """A 64-byte-aligned CUtensorMap for `spec` over global `address` (the buffer keeps it alive)."""
        buf = ctypes.create_string_buffer(TENSOR_MAP_BYTES + 64)
        aligned = (ctypes.addressof(buf) + 63) & ~63
        self.check("cuTensorMapEncodeTiled", ctypes.c_void_p(aligned), *encode_arguments(spec, address))
        buf._fa4_aot_map = aligned  # type: ignore[attr-defined]
        return buf

    def function(self, cubin: bytes, name: str, shared_bytes: int) -> ctypes.c_void_p:
        module, func = ctypes.c_void_p(), ctypes.c_void_p()
        self.check("cuModuleLoadData", ctypes.byref(module), ctypes.c_char_p(cubin))
        self.check("cuModuleGetFunction", ctypes.byref(func), module, name.encode())
        self.check("cuFuncSetAttribute", func, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                   ctypes.c_int(shared_bytes))
        return func

    def launch(self, func: ctypes.c_void_p, launch: Launch, addresses: Sequence[int], stream: int) -> None:
        """Launch with each map of `launch` over the address of its tensor (addresses in launch.maps' order)."""
        maps = [self.encode(spec, address) for spec, address in zip(launch.maps, addresses, strict=True)]
        params = (ctypes.c_void_p * len(maps))(*[m._fa4_aot_map for m in maps])  # type: ignore[attr-defined]
        self.check("cuLaunchKernel", func, *(ctypes.c_uint(v) for v in (*launch.grid, *launch.block)),
                   ctypes.c_uint(launch.shared_bytes), ctypes.c_void_p(stream), params, None)
