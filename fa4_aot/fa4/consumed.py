"""The SKU constants compiles in this process consumed: every answer the target's stand-ins give FA4 and CuTe
(target.py's HardwareInfo, l2.py's budgets) goes through `consume()`, which records it; a build files each
kernel under the constants its compile read (hardware_queries in its index entry). FA4-free."""

from __future__ import annotations

from typing import Any

from ..domain.skus import Sku

_calls: list[tuple[str, Any]] = []


def hardware_calls() -> list[tuple[str, Any]]:
    """What compiles in this process asked the stand-in HardwareInfo, and what it answered."""
    return list(_calls)


def consume(name: str, sku: Sku) -> int:
    """The value of SKU constant `name` (skus.Constants, the derivation clients use too), recorded as consumed
    by the compile in progress."""
    value = sku.constants().value(name)
    _calls.append((name, value))
    return value
