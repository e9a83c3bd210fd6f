"""fa4-aot: FlashAttention-4 kernels compiled ahead of time per GPU SKU, loaded with zero JIT compiles.

    import fa4_aot
    fa4_aot.install()                                  # every FA4 call in this process reads the store
    attn = fa4_aot.load(q.shape, causal=True)          # or: load one signature's kernels up front
    out = attn(q, k, v)

The client imports FA4 only when install()/load() run, so `import fa4_aot` stays cheap.
"""

from __future__ import annotations

from typing import Any

from .errors import BuildError, ConfigError, Fa4AotError, IntegrityError, KernelMissing, StoreError, UnknownSku

__version__ = "0.1.0"
__all__ = ["install", "load", "Fa4AotError", "ConfigError", "UnknownSku", "KernelMissing", "IntegrityError",
           "StoreError", "BuildError"]


def install(mode: str = "strict", **kwargs: Any) -> Any:
    """See fa4_aot.client.install."""
    from .client import install as _install

    return _install(mode, **kwargs)


def load(*args: Any, **kwargs: Any) -> Any:
    """See fa4_aot.client.load."""
    from .client import load as _load

    return _load(*args, **kwargs)
