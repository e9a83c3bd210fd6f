"""Adapters that stand in for FA4's `<function>.compile_cache` objects.

FA4 looks kernels up as `key in fn.compile_cache`, `fn.compile_cache[key]` and, after compiling,
`fn.compile_cache[key] = compiled` (flash_attn/cute/cache_utils.py). Swapping those objects is the
whole integration: planning records keys, building compiles only the keys assigned to it, and the
client serves keys from the store. The family of a kernel is the FA4 function's name.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from flash_attn.cute.cache_utils import JITCache

from . import keys

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


class Recorder(JITCache):
    """Says every key is present and records it: a run under it lists the kernels a call needs."""

    def __init__(self, family: str, seen: dict[tuple[str, str], Any]) -> None:
        super().__init__()
        self.family = family
        self.seen = seen

    def __contains__(self, key: Any) -> bool:
        self.seen.setdefault((self.family, keys.dumps(keys.canonical(key))), key)
        return True

    def __getitem__(self, key: Any) -> Callable[..., None]:
        return _noop


class Compiler(JITCache):
    """Lets FA4 compile only the keys in `wanted` and hands each result to `done(family, key, fn, seconds)`."""

    def __init__(self, family: str, wanted: set[tuple[str, str]], done: Callable[..., None]) -> None:
        super().__init__()
        self.family = family
        self.wanted = wanted
        self.done = done
        self._started: float | None = None

    def __contains__(self, key: Any) -> bool:
        ident = (self.family, keys.dumps(keys.canonical(key)))
        if ident in self.wanted and key not in self.cache:
            self._started = time.perf_counter()
            return False
        return True

    def __getitem__(self, key: Any) -> Any:
        return self.cache.get(key, _noop)

    def __setitem__(self, key: Any, fn: Any) -> None:
        seconds = time.perf_counter() - (self._started or time.perf_counter())
        self.cache[key] = fn
        self.done(self.family, key, fn, seconds)
