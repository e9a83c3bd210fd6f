"""Planning: which kernels a call needs, found by running FA4's dispatch on fake tensors with recording caches."""

from __future__ import annotations

from typing import Any

from . import caches, calls


def kernels_for(call: calls.Call) -> dict[tuple[str, str], Any]:
    """{(family, canonical compile key JSON): compile key} of every kernel FA4 selects for `call`.

    Runs in the current process's FA4 configuration: a build worker's target SKU, or the local GPU.
    Raises whatever FA4 raises for a call it does not support.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    seen: dict[tuple[str, str], Any] = {}
    with FakeTensorMode(), caches.swapped(lambda family, _old: caches.Recorder(family, seen)):
        calls.run(call)
    return seen
