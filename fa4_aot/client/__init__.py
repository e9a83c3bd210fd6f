"""The client's public entry points: `install()` makes FA4's compile caches read kernels from the store for
the detected SKU (installation.py); `prepare()` plans a call signature, loads every kernel it needs and returns
an AttentionFn (attention.py). Importing this module imports no FA4: the seam (fa4_aot.fa4) loads it when
install() or prepare() runs.
"""

from __future__ import annotations

from .attention import FETCH_THREADS, AttentionFn, prepare
from .installation import MODES, Installation, Stats, install, installed

__all__ = ["install", "installed", "prepare", "Installation", "Stats", "AttentionFn", "MODES", "FETCH_THREADS"]
