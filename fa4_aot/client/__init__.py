"""The client's public entry points: `install()` makes FA4's compile caches read kernels from the store for
the detected SKU (installation.py); `load()` plans a call signature, loads every kernel it needs and returns
an AttentionFn (attention.py). Importing this module imports no FA4: the seam (fa4_aot.fa4) loads it when
install() or load() runs.
"""

from __future__ import annotations

from .attention import FETCH_THREADS, AttentionFn, load
from .installation import MODES, Installation, Stats, install, installed

__all__ = ["install", "installed", "load", "Installation", "Stats", "AttentionFn", "MODES", "FETCH_THREADS"]
