"""Run in a fresh process configured for one SKU: for each call, the kernel launches of the lean runtime's
flash_attn_func and of FA4's own flash_attn_func, on the same fake CUDA tensors with the same arguments.

argv: SKU, JSON list of calls {"q": shape, "k": shape, "causal", "window_size", "return_lse"}. Prints a JSON list,
per call: {"lean": launches, "fa4": launches}, a launch being [kernel key, arguments] with every tensor as
[shape, stride, dtype]. The lean side runs its real entry point (signature, recipe lookup, bind, replay) over a
store holding the region a build records for the signature it asks for, with every kernel a stub that notes its
arguments; FA4's side runs under compile caches whose every kernel notes its arguments. Inference calls only:
autograd on fake CUDA tensors needs a CUDA device (it aborts the process without one).
"""

from __future__ import annotations

import json
import sys
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SCALE = 0.1  # given to both sides: the default scale is not what this probe compares


def main(compare: Any = None) -> None:
    """`python PROBE SKU CALLS_JSON`: configure FA4 for SKU, compare each call (`compare(call, sku, root)`, this
    module's _compare by default) in a store of its own, print the results as one JSON list."""
    warnings.filterwarnings("ignore")
    from fa4_aot import config, fa4
    from fa4_aot.matrix import variants

    sku = variants.load(config.default_variants_file()).skus[sys.argv[1]]
    fa4.configure(sku)
    compare = compare or _compare
    with tempfile.TemporaryDirectory() as tmp:
        found = [compare(call, sku, Path(tmp) / str(i)) for i, call in enumerate(json.loads(sys.argv[2]))]
    print(json.dumps(found))


def _compare(call: dict[str, Any], sku: Any, root: Path) -> dict[str, Any]:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    import fa4_aot

    lean_launches: list[Any] = []
    fa4_launches: list[Any] = []
    kwargs = {"softmax_scale": SCALE, "causal": call["causal"], "window_size": tuple(call["window_size"]),
              "return_lse": call["return_lse"]}
    with FakeTensorMode(), torch.no_grad():
        q, k, v = (torch.empty(*shape, dtype=torch.bfloat16, device="cuda") for shape in (call["q"], call["k"],
                                                                                           call["k"]))
        with _lean_runtime(sku, root, call, lean_launches):
            fa4_aot.flash_attn_func(q, k, v, **kwargs)
        with _fa4_launching(sku, fa4_launches):
            from flash_attn.cute import interface

            interface.flash_attn_func(q, k, v, **kwargs)
    return {"lean": lean_launches, "fa4": fa4_launches}


class _Stubs:
    """runtime.libraries.Libraries for the probe: every kernel a function that notes its key and arguments."""

    def __init__(self, launches: list[Any]) -> None:
        self.launches = launches

    def prefetch(self, keys: list[str]) -> None:
        pass

    def function(self, kernel_key: str, family: str = "", sig: Any = None) -> Any:
        return lambda *args: self.launches.append([kernel_key, _plain(args)])

    def functions(self, kernels: list[tuple[str, str]], sig: Any = None, sizes: Any = None) -> list[Any]:
        return [self.function(key, family, sig) for key, family in kernels]


@contextmanager
def _lean_runtime(sku: Any, root: Path, call: dict[str, Any], launches: list[Any]) -> Iterator[None]:
    """The lean runtime (runner.runtime) over a store that holds, for any signature asked for, the region a build
    records at this call's sizes; kernels are _Stubs."""
    from fa4_aot import fa4
    from fa4_aot.domain import recipe_format
    from fa4_aot.runtime import runner
    from fa4_aot.store import Store, recipes

    sizes = recipe_format.sizes_of_call("dense", call["q"][0], call["q"][1], call["k"][1])

    class Recording(runner.Runtime):
        def attention(self, sig: Any) -> Any:
            region = fa4.record_recipe(sig, sizes, sku)
            recipes.merge(self.store, recipes.recipe_key(sig, sku), [region])
            return super().attention(sig)

    with installed(Recording(Store(root), sku), launches):
        yield


@contextmanager
def installed(rt: Any, launches: list[Any]) -> Iterator[None]:
    """`rt` as the process's lean runtime (runtime.runner.runtime) while the block runs, its kernels _Stubs noting into
    `launches`."""
    from fa4_aot.runtime import api, runner

    rt.libraries = _Stubs(launches)
    before = runner.runtime
    runner.runtime = lambda cache_dir=None: rt
    api._cache.clear()  # its Attention objects belong to another call's runtime
    try:
        yield
    finally:
        runner.runtime = before


@contextmanager
def _fa4_launching(sku: Any, launches: list[Any]) -> Iterator[None]:
    """FA4 launching its kernels on fake tensors, each kernel noting its key and arguments."""
    from flash_attn.cute import interface

    from fa4_aot.domain.kernel_keys import kernel_key
    from fa4_aot.fa4 import caches
    from fa4_aot.fa4.symbolic import launching
    from fa4_aot.fa4.versions import toolchain

    class Noting(caches.Recorder):
        def __getitem__(self, key: Any) -> Any:
            return lambda *args: launches.append([kernel_key(self.family, key, sku, toolchain()), _plain(args)])

    with launching(interface), caches.swapped(lambda family, _old: Noting(family, {})):
        yield


def _plain(x: Any) -> Any:
    """JSON of a kernel argument: a tensor as [shape, stride, dtype], a sequence as a list, others by repr
    where JSON has no form (dtypes, devices)."""
    import torch

    if isinstance(x, torch.Tensor):
        return [list(x.shape), list(x.stride()), str(x.dtype)]
    if isinstance(x, tuple | list):
        return [_plain(y) for y in x]
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    return x if x is None or isinstance(x, bool | int | float | str) else repr(x)


if __name__ == "__main__":
    main()
