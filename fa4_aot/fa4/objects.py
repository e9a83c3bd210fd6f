"""Kernel objects: exporting a compiled kernel to object-file bytes, and loading one back into this process,
both under the symbol name FA4's own persistent cache uses (flash_attn/cute/cache_utils.JITPersistentCache)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

EXPORT_FUNCTION = "func"  # the symbol name FA4's own persistent cache uses; loaders look it up


def export(fn: Any) -> bytes:
    """The object-file bytes of compiled kernel `fn`. Raises RuntimeError when export writes nothing."""
    with tempfile.TemporaryDirectory(prefix="fa4-aot-export-") as tmp:
        path = Path(tmp) / "kernel.o"
        fn.export_to_c(object_file_path=str(path), function_name=EXPORT_FUNCTION)
        data = path.read_bytes()
    if not data:
        raise RuntimeError("export_to_c wrote an empty object file")
    return data


def load_object(path: Path) -> Any:
    """Load an exported kernel object as FA4's own persistent cache does; the result is what FA4 calls."""
    import cutlass.cute as cute

    module = cute.runtime.load_module(str(path), enable_tvm_ffi=True)
    return getattr(module, EXPORT_FUNCTION)
