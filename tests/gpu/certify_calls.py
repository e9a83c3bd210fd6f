"""Calls of tests/data/certify_variants.toml's signatures through one runtime, in a fresh process: what
tests/gpu/test_h200_certify.py runs to see which kernels each runtime refuses and which it serves.

    python -m tests.gpu.certify_calls fa4|lean     (FA4_AOT_CACHE: the store)

prints one JSON document: {case: "ok" | "refused: <message>" | "error: <message>"}. The cases run in an order
that puts a call after each refusal, so a refusal that let a kernel run (and poison the CUDA context) shows.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch

CASES = ("train-d64", "train-d72", "decode-paged-d160", "decode-paged-d128", "train-d80", "train-det-d64",
         "train-d104", "decode-paged-d128-again")


def call(fn: dict[str, Any], case: str) -> None:
    g = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape: int, grad: bool = False) -> Any:
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(grad)

    if case.startswith("train"):
        d = int(case.rsplit("-d", 1)[1])
        q, k, v = (randn(2, 512, 4, d, grad=True) for _ in range(3))
        out, _lse = fn["dense"](q, k, v, causal=True, deterministic="det" in case)
        out.backward(torch.randn_like(out))
    else:
        d = 160 if "d160" in case else 128
        pages, page = 64, 16
        q = randn(8, 1, 32, d)
        k, v = randn(512, page, 8, d), randn(512, page, 8, d)
        table = torch.randperm(512, device="cuda", generator=g)[:8 * pages].view(8, pages).to(torch.int32)
        used = torch.randint(1, pages * page + 1, (8,), device="cuda", generator=g, dtype=torch.int32)
        fn["varlen"](q, k, v, page_table=table, seqused_k=used, causal=True)
    torch.cuda.synchronize()


def functions(runtime: str) -> dict[str, Any]:
    if runtime == "fa4":
        import fa4_aot

        fa4_aot.install("strict")
        from flash_attn.cute import flash_attn_func, flash_attn_varlen_func
    else:
        from fa4_aot import flash_attn_func, flash_attn_varlen_func
    return {"dense": flash_attn_func, "varlen": flash_attn_varlen_func}


def main() -> None:
    from fa4_aot.errors import KernelRefused

    fn = functions(sys.argv[1])
    found = {}
    for case in CASES:
        try:
            call(fn, case.removesuffix("-again"))
            found[case] = "ok"
        except KernelRefused as e:
            found[case] = f"refused: {e}"
        except Exception as e:  # what the test reports: a kernel that ran and failed, a missing kernel
            found[case] = f"error: {type(e).__name__}: {e}"[:600]
    print(json.dumps(found))


if __name__ == "__main__":
    main()
