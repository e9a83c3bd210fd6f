"""What a user sees for one training call over a certified store, through both runtimes: served, or the refusal's
message (which names FA4's bug and the command that prints its one-file repro).

    FA4_AOT_CACHE=STORE python bench/refusal_probe.py HEADS HEAD_DIM SEQLEN [--causal]

Runs the call (bf16, batch 2, HEADS query and KV heads) forward and backward through fa4_aot.flash_attn_func (the
lean runtime), then through FA4's own flash_attn_func over fa4_aot.install(). Prints one JSON line per runtime.
"""

from __future__ import annotations

import json
import sys


def attempt(name: str, fn, q, k, v, causal: bool) -> None:  # type: ignore[no-untyped-def]
    from fa4_aot.errors import KernelRefused

    try:
        result = fn(q, k, v, causal=causal)
        out = result[0] if isinstance(result, tuple) else result
        out.float().sum().backward()
        print(json.dumps({"runtime": name, "served": True}), flush=True)
    except KernelRefused as e:
        print(json.dumps({"runtime": name, "served": False, "refused": str(e)}), flush=True)


def main() -> None:
    import torch

    import fa4_aot

    heads, dim, seqlen = (int(x) for x in sys.argv[1:4])
    causal = "--causal" in sys.argv

    def tensors():  # type: ignore[no-untyped-def]
        return [torch.randn(2, seqlen, heads, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                for _ in range(3)]

    attempt("lean", fa4_aot.flash_attn_func, *tensors(), causal)
    fa4_aot.install()
    from flash_attn.cute import flash_attn_func

    attempt("fa4 over install()", flash_attn_func, *tensors(), causal)


if __name__ == "__main__":
    main()
