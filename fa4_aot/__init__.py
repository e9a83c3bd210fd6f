"""fa4-aot: FlashAttention-4 kernels compiled ahead of time per GPU SKU, loaded with zero JIT compiles.

    import fa4_aot
    out, lse = fa4_aot.flash_attn_func(q, k, v, causal=True)   # lean: torch + tvm_ffi only, no FA4 import
    attn = fa4_aot.load(q.shape, causal=True)          # lean, one signature's kernels loaded up front
    out, lse = attn(q, k, v)
    fa4_aot.install()                                  # or: FA4 itself reads the store (any FA4 feature)
    fa4_aot.prefetch("llama-3.1-8b", tp=[1, 2])        # a model's kernels from FA4_AOT_SERVER, before the first call

`import fa4_aot` imports neither torch nor FA4; install() imports FA4, the lean entry points never do.
"""

from __future__ import annotations

from typing import Any

from .errors import BuildError, ConfigError, Fa4AotError, IntegrityError, KernelMissing, StoreError, UnknownSku

__version__ = "0.1.0"
__all__ = ["install", "load", "flash_attn_func", "flash_attn_varlen_func", "prefetch",
           "Fa4AotError", "ConfigError", "UnknownSku", "KernelMissing", "IntegrityError",
           "StoreError", "BuildError"]


def install(mode: str = "strict", **kwargs: Any) -> Any:
    """See fa4_aot.client.install."""
    from .client import install as _install

    return _install(mode, **kwargs)


def load(*args: Any, **kwargs: Any) -> Any:
    """See fa4_aot.runtime.api.load (lean runtime). fa4_aot.client.load does the same through FA4 itself."""
    from .runtime.api import load as _load

    return _load(*args, **kwargs)


def __getattr__(name: str) -> Any:
    """flash_attn_func and flash_attn_varlen_func: fa4_aot.runtime.api's own functions (lean runtime), imported on
    first use; no wrapper runs per call (a wrapper cost about 1 us of a decode step's host time)."""
    if name in ("flash_attn_func", "flash_attn_varlen_func"):
        from .runtime import api

        found = globals()[name] = getattr(api, name)
        return found
    raise AttributeError(f"module 'fa4_aot' has no attribute {name!r}")


def prefetch(*args: Any, **kwargs: Any) -> Any:
    """See fa4_aot.client.prefetch.prefetch: fetch one model's kernel set from a server, so a node starts warm."""
    from .client.prefetch import prefetch as _fn

    return _fn(*args, **kwargs)
