"""Run in a fresh process configured for one SKU: for each call, the kernel launches of the lean runtime's
flash_attn_func over a store holding only a region recorded for ANOTHER call, and of FA4's own flash_attn_func,
on the same fake CUDA tensors with the same arguments (issue 17, parity).

argv: SKU, JSON list of calls {"q": shape, "k": shape, "kwargs": {...}, "requires_grad": bool, "record": {"heads":
[hq, hkv], "pass_": pass}}. The store holds the region a build records for the call's signature with the record's
head counts and pass (e.g. the same GQA ratio at other head counts, or the training pass of a forward-only call),
at the call's lengths; nothing else. Inputs flagged requires_grad run under torch.no_grad() (a forward-only call;
autograd on fake CUDA tensors needs a CUDA device). Prints a JSON list, per call: {"lean": launches, or the
KernelMissing message as {"miss": text}, "fa4": launches}; a launch is [kernel key, arguments] as window_probe
writes them.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import window_probe  # noqa: E402
from window_probe import SCALE, _fa4_launching  # noqa: E402


def main() -> None:
    window_probe.main(_compare)


def _compare(call: dict[str, Any], sku: Any, root: Path) -> dict[str, Any]:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    import fa4_aot
    from fa4_aot.errors import KernelMissing

    lean_launches: list[Any] = []
    fa4_launches: list[Any] = []
    kwargs = {"softmax_scale": SCALE, **call.get("kwargs", {})}
    if "window_size" in kwargs:
        kwargs["window_size"] = tuple(kwargs["window_size"])
    with FakeTensorMode(), torch.no_grad():
        q, k, v = (torch.empty(*shape, dtype=torch.bfloat16, device="cuda").requires_grad_(call.get("requires_grad",
                                                                                                   False))
                   for shape in (call["q"], call["k"], call["k"]))
        lean: Any = lean_launches
        with _lean_runtime(sku, root, call, lean_launches):
            try:
                fa4_aot.flash_attn_func(q, k, v, **kwargs)
            except KernelMissing as e:
                lean = {"miss": str(e)[:300]}
        with _fa4_launching(sku, fa4_launches):
            from flash_attn.cute import interface

            interface.flash_attn_func(q, k, v, **kwargs)
    return {"lean": lean, "fa4": fa4_launches}


@contextmanager
def _lean_runtime(sku: Any, root: Path, call: dict[str, Any], launches: list[Any]) -> Iterator[None]:
    """The lean runtime over a store that holds, for any signature asked for, only the region a build records for
    that signature with the call's `record` head counts and pass, at the call's lengths; kernels are _Stubs."""
    from fa4_aot import fa4
    from fa4_aot.domain import recipe_format
    from fa4_aot.runtime import runner as lean
    from fa4_aot.store import Store, recipes

    sizes = recipe_format.sizes_of_call("dense", call["q"][0], call["q"][1], call["k"][1])
    hq, hkv = call["record"].get("heads", (call["q"][2], call["k"][2]))

    class Recording(lean.Runtime):
        def attention(self, sig: Any) -> Any:
            recorded = dataclasses.replace(sig, heads_q=hq, heads_kv=hkv, pass_=call["record"].get("pass_", sig.pass_))
            region = fa4.record_recipe(recorded, {**sizes, "heads_kv": hkv}, sku)  # a size since issue 17
            recipes.merge(self.store, recipes.recipe_key(recorded, sku), [region])
            return super().attention(sig)

    with window_probe.installed(Recording(Store(root), sku), launches):
        yield


if __name__ == "__main__":
    main()
