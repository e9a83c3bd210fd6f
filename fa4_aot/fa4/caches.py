"""Adapters that stand in for FA4's `<function>.compile_cache` objects.

FA4 looks kernels up as `key in fn.compile_cache`, `fn.compile_cache[key]` and, after compiling,
`fn.compile_cache[key] = compiled` (flash_attn/cute/cache_utils.py). Swapping those objects is the
whole integration: planning records keys, building compiles only the keys assigned to it, and the
client serves keys from the store. The family of a kernel is the FA4 function's name.
This module imports FA4 at import: the seam (fa4_aot/fa4/__init__.py) imports it only when it is used.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from flash_attn.cute.cache_utils import JITCache

from ..domain.kernel_keys import canonical, dumps
from .object_files import load_object

_MODULES = ("flash_attn.cute.interface", "flash_attn.cute.compute_block_sparsity")


def _noop(*args: Any, **kwargs: Any) -> None:
    """What a planning or building run 'launches': FA4 launches nothing under FakeTensorMode anyway."""


def fa4_functions() -> dict[str, Any]:
    """Every FA4 function that owns a compile cache, by family name."""
    import importlib

    found = {}
    for module_name in _MODULES:
        module = importlib.import_module(module_name)
        for name, fn in vars(module).items():
            if isinstance(getattr(fn, "compile_cache", None), JITCache):
                found[name] = fn
    return found


@contextmanager
def swapped(factory: Callable[[str, JITCache], JITCache]) -> Iterator[None]:
    """Replace every FA4 compile cache with factory(family, original) for the duration of the block."""
    functions = fa4_functions()
    originals = {name: fn.compile_cache for name, fn in functions.items()}
    try:
        for name, fn in functions.items():
            fn.compile_cache = factory(name, originals[name])
        yield
    finally:
        for name, fn in functions.items():
            fn.compile_cache = originals[name]


def install(factory: Callable[[str, JITCache], JITCache]) -> None:
    """Replace FA4's compile caches for the rest of the process (the client's install())."""
    for name, fn in fa4_functions().items():
        fn.compile_cache = factory(name, fn.compile_cache)


def lookup(family: str, key: Any) -> bool:
    """Ask the compile cache FA4 holds for `family` about `key`, as FA4 does before compiling."""
    return key in fa4_functions()[family].compile_cache


class KernelSource(Protocol):
    """What a StoreCache asks (fa4_aot.client.installation.Installation is one; tests use fakes)."""

    def object_for(self, family: str, key: Any) -> Path | None:
        """The verified object file of this kernel, or None when FA4 should compile it (may raise instead)."""

    def loaded(self, family: str, key: Any) -> None:
        """A kernel was loaded from its object."""

    def compiled(self, family: str, key: Any) -> None:
        """FA4 compiled a kernel itself and stored it here."""


class StoreCache(JITCache):
    """FA4 compile cache backed by a KernelSource: a key FA4 asks for is loaded from the object it names."""

    def __init__(self, family: str, source: KernelSource) -> None:
        super().__init__()
        self.family = family
        self.source = source

    def __contains__(self, key: Any) -> bool:
        if key in self.cache:
            return True
        path = self.source.object_for(self.family, key)
        if path is None:
            return False
        self.cache[key] = load_object(path)
        self.source.loaded(self.family, key)
        return True

    def __setitem__(self, key: Any, fn: Any) -> None:
        self.cache[key] = fn
        self.source.compiled(self.family, key)


class Recorder(JITCache):
    """Says every key is present and records it: a run under it lists the kernels a call needs."""

    def __init__(self, family: str, seen: dict[tuple[str, str], Any]) -> None:
        super().__init__()
        self.family = family
        self.seen = seen

    def __contains__(self, key: Any) -> bool:
        self.seen.setdefault((self.family, dumps(canonical(key))), key)
        return True

    def __getitem__(self, key: Any) -> Callable[..., None]:
        return _noop


class Compiler(JITCache):
    """Lets FA4 compile only the keys in `wanted` and hands each result to `done(family, key, fn, seconds)`:
    the CPU seconds the compile took in this process, which, unlike wall time, do not grow with the load of the
    build host (entries record them as compile_seconds; compile/estimate.py predicts builds from them)."""

    def __init__(self, family: str, wanted: set[tuple[str, str]], done: Callable[..., None]) -> None:
        super().__init__()
        self.family = family
        self.wanted = wanted
        self.done = done
        self._started: float | None = None

    def __contains__(self, key: Any) -> bool:
        ident = (self.family, dumps(canonical(key)))
        if ident in self.wanted and key not in self.cache:
            self._started = time.process_time()
            return False
        return True

    def __getitem__(self, key: Any) -> Any:
        return self.cache.get(key, _noop)

    def __setitem__(self, key: Any, fn: Any) -> None:
        seconds = time.process_time() - (self._started or time.process_time())
        self.cache[key] = fn
        self.done(self.family, key, fn, seconds)
