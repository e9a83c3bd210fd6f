"""Kernel objects: exporting a compiled kernel to object-file bytes, and loading one back into this process,
both under the symbol name FA4's own persistent cache uses (flash_attn/cute/cache_utils.JITPersistentCache).

The host code is generated for a declared host target (fa4_aot/domain/hosts.py), never for the build machine: CuTe's
TVM-FFI export (`export_to_c`) gives LLVM no target, so LLVM takes the build CPU's own (AVX-512 on an AVX-512
build host; x86-64 for a Grace SKU), and refuses CuTe's `--host-target` option. So `export` does what that
method does (the same export module and renaming), then emits the object through CuTe's PIC object writer,
which takes an LLVM triple and CPU: the same key gives the same bytes on every build CPU, for x86-64 or AArch64.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from ..domain.hosts import HostTarget

EXPORT_FUNCTION = "func"  # the symbol name FA4's own persistent cache uses; loaders look it up
OPT_LEVEL = 3  # what CuTe's own export_to_c optimises host code at


def export(fn: Any, host: HostTarget) -> bytes:
    """The object-file bytes of compiled kernel `fn`, host code for `host`. Raises RuntimeError when the
    object writer fails or writes nothing."""
    from cutlass._mlir._mlir_libs._cutlass_ir import _mlirExecutionEngine
    from cutlass.cutlass_dsl.tvm_ffi_provider import get_export_module, rename_tvm_ffi_function

    entry = f"__tvm_ffi_{EXPORT_FUNCTION}"
    module = get_export_module(fn.ir_module, f"__cute_internal_{EXPORT_FUNCTION}",
                               preserve_symbols={f"__tvm_ffi_{fn.function_name}"})
    rename_tvm_ffi_function(module, fn.function_name, EXPORT_FUNCTION)
    with tempfile.TemporaryDirectory(prefix="fa4-aot-export-") as tmp:
        path = Path(tmp) / "kernel.o"
        _mlirExecutionEngine.dump_object_file_pic(module, str(path), entry, opt_level=OPT_LEVEL,
                                                  host_triple=host.triple, host_cpu=host.cpu, host_features="")
        data = path.read_bytes()
    if not data:
        raise RuntimeError("CuTe's object writer wrote an empty object file")
    return data


def load_object(path: Path) -> Any:
    """Load an exported kernel object as FA4's own persistent cache does; the result is what FA4 calls."""
    import cutlass.cute as cute

    module = cute.runtime.load_module(str(path), enable_tvm_ffi=True)
    return getattr(module, EXPORT_FUNCTION)
