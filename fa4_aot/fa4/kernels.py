"""Which kernels a call needs, and compiling chosen ones: both run the call through FA4's dispatch on fake
tensors, with recording or compiling caches swapped in (caches.py). A call is a Call (its summary, run through
dispatch.py) or an ExactCall (a client's record of the very arguments, replayed by exact_replay.py).

Both run in the current process's FA4 configuration: a build worker's target SKU (target.configure), or the
local GPU. Both raise whatever FA4 raises for a call it does not support.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
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

    with FakeTensorMode(), caches.swapped(lambda family, _old: caches.Compiler(family, wanted, done)), \
            _without_jit_engine():
        _run(call)


@contextmanager
def _without_jit_engine() -> Iterator[None]:
    """cute.compile without CuTe's host JIT engine for the block: a build exports each kernel (object_files.export
    reads the compiled module, not the engine) and never runs it on fake tensors, yet CuTe built an engine per
    kernel: host code generated twice more (the MCJIT engine, then an object for the TVM-FFI JITLink engine that
    replaces it) and its entry symbol looked up: 13-21% of a compile task's CPU on the CPU host; the
    exported objects are byte for byte the same (bench/RESULTS.md, session 15)."""
    from cutlass.base_dsl.compiler import CompileCallable

    compile_ = CompileCallable._compile

    def without_engine(self: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        return compile_(self, func, *args, **{**kwargs, "no_jit_engine": True})

    CompileCallable._compile = without_engine  # type: ignore[method-assign]
    try:
        yield
    finally:
        CompileCallable._compile = compile_  # type: ignore[method-assign]


def _run(call: Call | ExactCall) -> None:
    if isinstance(call, ExactCall):
        exact_replay.replay(call.to_dict())
    else:
        dispatch.run(call)
