"""Issue 17's sliding-window case on a GPU: relative error of the lean runtime and of FA4 over install() against
an fp32 reference, same store, same tensors (causal=True with a window shorter than the sequence).

    python bench/lean_window_error.py OUT.json     (FA4_AOT_CACHE holds bench/lean_window_calls.jsonl's build)
"""

from __future__ import annotations

import json
import sys


def reference(q, k, v, window: int):
    """fp32 attention with FA4's local mask: key j is visible to query i when i - window <= j <= i."""
    import torch

    b, s, h, d = q.shape
    rep = h // k.shape[2]
    qf, kf, vf = (t.float().transpose(1, 2) for t in (q, k.repeat_interleave(rep, 2), v.repeat_interleave(rep, 2)))
    scores = qf @ kf.transpose(-1, -2) / d**0.5
    i = torch.arange(s, device=q.device)
    visible = (i[None, :] <= i[:, None]) & (i[None, :] >= i[:, None] - window)
    return (scores.masked_fill(~visible, float("-inf")).softmax(-1) @ vf).transpose(1, 2)


def main() -> None:
    import torch

    import fa4_aot

    results = {}
    for s, hq, hkv, window in [(8192, 48, 4, 4095), (6000, 48, 4, 1023), (8192, 24, 2, 4095), (4096, 48, 4, 4095)]:
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(1, s, h, 128, device="cuda", dtype=torch.bfloat16, generator=g)
                   for h in (hq, hkv, hkv))
        ref = reference(q, k, v, window)
        lean, _ = fa4_aot.flash_attn_func(q, k, v, causal=True, window_size=(window, 0))
        fa4_aot.install("strict")
        from flash_attn.cute import flash_attn_func

        fa4, _ = flash_attn_func(q, k, v, causal=True, window_size=(window, 0))
        err = {name: ((out.float() - ref).norm() / ref.norm()).item() for name, out in (("lean", lean), ("fa4", fa4))}
        results[f"s={s} h={hq}/{hkv} window=({window}, 0)"] = {**err, "lean_equals_fa4": torch.equal(lean, fa4)}
        print(results)
    with open(sys.argv[1], "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
