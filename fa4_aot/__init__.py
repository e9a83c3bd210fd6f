"""fa4-aot: FlashAttention-4 kernels compiled ahead of time per GPU SKU, loaded with zero JIT compiles.

    import fa4_aot
    out, lse = fa4_aot.flash_attn_func(q, k, v, causal=True)   # lean: torch + tvm_ffi only, no FA4 import
    attn = fa4_aot.load(q.shape, causal=True)          # lean, one signature's kernels loaded up front
    out, lse = attn(q, k, v)
    fa4_aot.install()                                  # or: FA4 itself reads the store (any FA4 feature)
    fa4_aot.prefetch("llama-3.1-8b", tp=[1, 2])        # a model's kernels from FA4_AOT_SERVER, before the first call

`import fa4_aot` imports neither torch nor FA4; install() imports FA4, the lean entry points never do. The entry
points are attributes loaded on first use (PEP 562), and type checkers and IDEs see their real signatures through
the TYPE_CHECKING imports below (as huggingface_hub's __init__ does).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .errors import (
    BuildError,
    ConfigError,
    Fa4AotError,
    IntegrityError,
    KernelMissing,
    KernelRefused,
    StoreError,
    UnknownSku,
    Unsupported,
)

if TYPE_CHECKING:  # what the lazy attributes below are, for type checkers and IDEs
    from .client.installation import install
    from .client.prefetch import prefetch
    from .runtime.api import flash_attn_func, flash_attn_varlen_func, load

__version__ = "0.1.0"
__all__ = ["install", "load", "flash_attn_func", "flash_attn_varlen_func", "prefetch",
           "Fa4AotError", "ConfigError", "UnknownSku", "KernelMissing", "IntegrityError",
           "StoreError", "BuildError", "KernelRefused", "Unsupported"]

# entry point -> the module that defines it, imported on first use (the lean runtime's needs torch)
_LAZY = {
    "install": "fa4_aot.client.installation",
    "prefetch": "fa4_aot.client.prefetch",
    "load": "fa4_aot.runtime.api",
    "flash_attn_func": "fa4_aot.runtime.api",
    "flash_attn_varlen_func": "fa4_aot.runtime.api",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fa4_aot' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups are plain module attributes
    return value


def __dir__() -> list[str]:
    """The public face (__all__) and the module's dunders: not the names its own code imports (Any, importlib)."""
    return sorted({*__all__, *(n for n in globals() if n.startswith("__") and n.endswith("__"))} - {"__getattr__"})
