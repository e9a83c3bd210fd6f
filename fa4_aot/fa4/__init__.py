"""The FA4 seam: the only package in fa4_aot that imports flash_attn, cutlass or quack.

Everything else in fa4_aot talks to FlashAttention-4 and the CuTe DSL through the functions below, so an
FA4 bump reads this package only, and the rest can be unit-tested with a fake of it. Importing this
package imports no FA4: each function loads its module on first use. (Module names differ from function
names on purpose: importing a submodule sets the package attribute of the same name.)

Target (build workers, before FA4 is imported):
    configure(sku)                 point FA4 and CuTe at a SKU in a process with no GPU (target.py)
    hardware_calls()               what compiles asked the stand-in HardwareInfo, and its answers
    toolchain()                    versions + CUDA flavour that kernel keys name (versions.py)
Kernels of a Call or an ExactCall, on fake tensors (kernels.py, through dispatch.py or exact_replay.py, and caches.py):
    plan(call)                     {(family, canonical key JSON): compile key} FA4 selects for a call
    plan_signature(sig, sku)       {(family, key JSON): (compile key, a Call)} at every shape (complete.py)
    plan_each(calls)               plan() of many calls in one fake mode (None for a call FA4 rejects)
    compile_call(call, wanted, done)  compile only `wanted`, handing each kernel to done(...)
Objects (object_files.py):
    export(fn, host) -> bytes      a compiled kernel as object-file bytes, host code for a host target
    load_object(path)              an exported object loaded back, callable as FA4 calls kernels
Serving from the store (caches.py, tracking.py, dispatch.py):
    install_store_caches(source)   every FA4 compile cache asks `source` (a caches.KernelSource) from now on
    store_cache(family, source)    one such cache (for tests)
    lookup(family, key)            ask FA4's installed cache of `family` for `key` (loads it, or misses)
    capture()                      make FA4's autograd functions say which Call runs (current())
    current()                      the Call FA4 runs on this thread, or None (imports no FA4)
    current_record()               the exact record (fa4_aot/domain/exact.py) of that call, or None
    running(call)                  a block in which current() is `call` (imports no FA4)
    attend(call, q, k, v, **kw)    flash_attn_func / flash_attn_varlen_func with the call's flags
Lean runtime, at build time (record.py, linking.py):
    record_recipe(sig, sizes, sku) the launch recipe of a signature for the region of sizes holding `sizes`
                                   (symbolic=False: FA4 at exactly `sizes`, `defaults` left to FA4)
    link(object_bytes, host)       an exported object linked, for a host target, into a library that loads
                                   with tvm_ffi alone
    runtime_libraries(host)        {SONAME: path or None} of the runtime libraries such a library needs
    warm_linker(host)              zig's caches filled for `host` (a build's first link), errors left to link
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..domain.calls import Call
    from ..domain.exact import ExactCall
    from ..domain.hosts import HostTarget
    from ..domain.region import Region
    from ..domain.signature import Signature
    from ..domain.skus import Sku
    from .caches import KernelSource

__all__ = ["configure", "hardware_calls", "toolchain", "plan", "plan_signature", "plan_each", "compile_call",
           "export", "load_object", "install_store_caches", "store_cache", "lookup", "capture", "current",
           "current_record", "running",
           "attend", "record_recipe", "link", "runtime_libraries", "warm_linker"]


def configure(sku: Sku) -> None:
    from . import target

    target.configure(sku)


def hardware_calls() -> list[tuple[str, Any]]:
    from . import consumed

    return consumed.hardware_calls()


def toolchain() -> dict[str, str]:
    from . import versions

    return versions.toolchain()


def plan(call: Call | ExactCall) -> dict[tuple[str, str], Any]:
    from . import kernels

    return kernels.plan(call)


def plan_signature(sig: Signature, sku: Sku) -> dict[tuple[str, str], tuple[Any, Call]]:
    from . import complete

    return complete.kernels_for_signature(sig, sku)


def plan_each(calls: list[Call]) -> list[dict[tuple[str, str], Any] | None]:
    from . import complete

    return complete.kernels_for_each(calls)


def compile_call(call: Call | ExactCall, wanted: set[tuple[str, str]],
                 done: Callable[[str, Any, Any, float], None]) -> None:
    from . import kernels

    kernels.compile_call(call, wanted, done)


def export(fn: Any, host: HostTarget) -> bytes:
    from . import object_files

    return object_files.export(fn, host)


def load_object(path: Path) -> Any:
    from . import object_files

    return object_files.load_object(path)


def install_store_caches(source: KernelSource) -> None:
    from . import caches

    caches.install(lambda family, _old: caches.StoreCache(family, source))


def store_cache(family: str, source: KernelSource) -> Any:
    from . import caches

    return caches.StoreCache(family, source)


def lookup(family: str, key: Any) -> bool:
    from . import caches

    return caches.lookup(family, key)


def capture() -> None:
    from . import tracking

    tracking.capture()


def check_calls(check: Callable[[Call, str], None] | None) -> None:
    from . import tracking

    tracking.check_calls(check)


def current() -> Call | None:
    from . import tracking

    return tracking.current()


def current_record() -> dict[str, Any] | None:
    from . import tracking

    return tracking.current_record()


def running(call: Call | None) -> AbstractContextManager[None]:
    from . import tracking

    return tracking.running(call)


def attend(call: Call, q: Any, k: Any, v: Any, **kwargs: Any) -> Any:
    from . import dispatch

    return dispatch.attend(call, q, k, v, **kwargs)




def record_recipe(sig: Signature, sizes: dict[str, int], sku: Sku, symbolic: bool = True,
                  defaults: tuple[str, ...] = ()) -> Region:
    from . import record

    return record.record(sig, sizes, sku, symbolic, defaults)


def link(object_bytes: bytes, host: HostTarget) -> bytes:
    from . import linking

    return linking.link(object_bytes, host)


def warm_linker(host: HostTarget) -> None:
    from . import linking

    linking.warm(host)


def runtime_libraries(host: HostTarget) -> dict[str, Path | None]:
    from . import linking

    return linking.runtime_libraries(host)
