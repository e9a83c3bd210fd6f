"""Which kernels a call needs, and compiling chosen ones: both run the call through FA4's dispatch on fake
tensors, with recording or compiling caches swapped in (caches.py). A call is a Call (its summary, run through
dispatch.py) or an ExactCall (a client's record of the very arguments, replayed by exact_replay.py).

Both run in the current process's FA4 configuration: a build worker's target SKU (target.configure), or the
local GPU. Both raise whatever FA4 raises for a call it does not support.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..domain.calls import Call
from ..domain.exact import ExactCall
from . import caches, dispatch, exact_replay


def plan(call: Call | ExactCall) -> dict[tuple[str, str], Any]:
    """{(family, canonical compile key JSON): compile key} of every kernel FA4 selects for `call`."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    seen: dict[tuple[str, str], Any] = {}
    with FakeTensorMode(), caches.swapped(lambda family, _old: caches.Recorder(family, seen)):
        _run(call)
    return seen


def compile_call(call: Call | ExactCall, wanted: set[tuple[str, str]],
                 done: Callable[[str, Any, Any, float], None]) -> None:
    """Run `call`, letting FA4 compile only the (family, canonical key JSON) pairs in `wanted`; each compiled
    kernel goes to done(family, compile_key, fn, seconds) as soon as FA4 stores it."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(), caches.swapped(lambda family, _old: caches.Compiler(family, wanted, done)):
        _run(call)


def _run(call: Call | ExactCall) -> None:
    if isinstance(call, ExactCall):
        exact_replay.replay(call.to_dict())
    else:
        dispatch.run(call)
