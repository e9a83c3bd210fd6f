"""FA4's interface module patched, while recording, to run its host path on symbolic sizes: its kernel calls are
reached on fake tensors, and cute.ceil_div and math.log2 take torch SymInts (so a choice FA4 makes on a size is a
ShapeEnv guard, not a value pinned at its hint).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class Log2:
    """math.log2 of a symbolic count whose only use is math.ceil (FA4's combine kernel: log_max_splits =
    max(ceil(log2(num_splits)), 4)): the ceiling guards 2^(L-1) < n <= 2^L, a range, where float(n) would pin n
    to its value (a region per split count instead of one per power of two)."""

    def __init__(self, n: Any) -> None:
        self.n = n

    def __ceil__(self) -> int:
        hint = int(self.n.node.hint)
        low = max(hint - 1, 0).bit_length()  # ceil(log2(hint)) for hint >= 1
        if not (bool(self.n <= 2**low) and (low == 0 or bool(self.n > 2 ** (low - 1)))):
            raise RuntimeError(f"ceil(log2({self.n})) is not {low} at its own hint")
        return low

    def __float__(self) -> float:
        return math.log2(int(self.n))


class SymMath:
    """The math module with log2 of a SymInt as Log2 (for FA4's interface module while recording)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(math, name)

    @staticmethod
    def log2(x: Any) -> Any:
        import torch

        return Log2(x) if isinstance(x, torch.SymInt) else math.log2(x)


@contextmanager
def launching(interface: Any) -> Iterator[None]:
    """Let FA4 reach its kernel calls on fake tensors, and let cute.ceil_div and math.log2 take symbolic sizes."""
    import torch

    cute = interface.cute
    fake, ceil_div, module = interface.is_fake_mode, cute.ceil_div, interface.math

    def sym_ceil_div(a: Any, b: Any) -> Any:
        if isinstance(a, torch.SymInt) or isinstance(b, torch.SymInt):
            return (a + b - 1) // b
        return ceil_div(a, b)

    interface.is_fake_mode, cute.ceil_div, interface.math = (lambda: False), sym_ceil_div, SymMath()
    try:
        yield
    finally:
        interface.is_fake_mode, cute.ceil_div, interface.math = fake, ceil_div, module
