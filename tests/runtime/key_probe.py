"""Run in a fresh process configured for one SKU: calls that differ from a build's signatures only in values FA4
passes to its kernels at run time (page size, window sizes), through the lean runtime over that build and through
FA4 over the same build (fa4_aot.install(): FA4 serves a call when every kernel it launches is built).

argv: SKU, seed, JSON {"built": [classes], "calls": [[class, count], ...]} in tests/runtime/test_lean_differential.py's
class form. The store gets, once, the regions a build records for each built class's signature (at its first KV
head count; compile.lean.explore, as differential_probe does); no call builds anything more. Each call of a called
class (random sizes, differential_probe._random_call) gets a verdict per side: "served" (with its launches),
"missing" (the lean runtime's KernelMissing; FA4 launching a kernel the build lacks) or "rejected" (FA4 raises).
Prints one JSON report: per call, the verdicts and what differs ('' when both sides agree and launch alike).
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
import traceback
import warnings
from pathlib import Path
from typing import Any

from tests.runtime.differential_probe import _difference, _launches, _random_call, _Recording
from tests.runtime.window_probe import installed


def main() -> None:
    warnings.filterwarnings("ignore")
    from fa4_aot import config, fa4
    from fa4_aot.matrix import variants
    from fa4_aot.runtime import runner
    from fa4_aot.store import Store

    sku = variants.load(config.default_variants_file()).skus[sys.argv[1]]
    fa4.configure(sku)
    seed, work = int(sys.argv[2]), json.loads(sys.argv[3])
    with tempfile.TemporaryDirectory() as tmp:
        rt = runner.Runtime(Store(Path(tmp)), sku)
        recording = _Recording(rt, sku)
        built = _build(recording, work["built"])
        with installed(rt, []):
            report = [_verdicts(recording, built, _random_call(cls, rng))
                      for i, (cls, count) in enumerate(work["calls"])
                      for rng in [random.Random(f"{seed}:{i}")] for _ in range(count)]
    print(json.dumps(report))


def signature_of(cls: dict[str, Any], heads_kv: int) -> Any:
    """The Signature a class's calls have at `heads_kv` KV heads (its window as the class spells it)."""
    from fa4_aot.runtime.call_args import signature

    window = tuple(cls["window"]) if cls["mask"] == "local" else (None, None)
    return signature(cls["layout"], {"bf16": "torch.bfloat16", "fp16": "torch.float16"}[cls["dtype"]],
                     cls["ratio"] * heads_kv, cls["head_dim"], heads_kv, cls["head_dim_v"],
                     causal=cls["mask"] == "causal", window_size=window, softcap=cls["softcap"], sink=cls["sink"],
                     num_splits=cls["num_splits"], training=cls["pass_"] in ("bwd", "bwd_det"),
                     deterministic=cls["pass_"] == "bwd_det", return_lse=cls["pass_"] == "fwd_lse",
                     page_size=cls["page_size"])


def _build(recording: _Recording, classes: list[dict[str, Any]]) -> set[str]:
    """Build every class's signature into the store; the kernel keys the build holds."""
    from fa4_aot.store import recipes

    keys: set[str] = set()
    for cls in classes:
        sig = signature_of(cls, cls["kv_heads"][0])
        recording.build(sig)
        for source in recipes.sources(sig, recording.sku):
            for region in recipes.load(recording.rt.store, source.key):
                keys |= {k.kernel_key for k in region.kernels}
    return keys


def _verdicts(recording: _Recording, built: set[str], call: dict[str, Any]) -> dict[str, Any]:
    from fa4_aot.errors import KernelMissing

    try:
        (lean, _l), (fa4, _f) = _launches(recording, call, "lean"), _launches(recording, call, "fa4")
    except Exception as e:
        return {"call": call, "lean": "error", "fa4": "error", "why": f"probe error {e!r}: {traceback.format_exc()}"}
    fa4_verdict = "rejected" if isinstance(fa4, Exception) else \
        "served" if {k for k, _a in fa4["launches"]} <= built else "missing"
    lean_verdict = "missing" if isinstance(lean, KernelMissing) else \
        "rejected" if isinstance(lean, Exception) else "served"
    why = ""
    identity = _identity(recording, call)
    if lean_verdict != fa4_verdict:
        why = f"lean {lean_verdict} ({str(lean)[:300] if isinstance(lean, Exception) else ''}) where FA4 over " \
              f"install() is {fa4_verdict} ({str(fa4)[:200] if isinstance(fa4, Exception) else ''})"
    elif lean_verdict == "served":
        why = _difference(lean, fa4)
    return {"call": call, "lean": lean_verdict, "fa4": fa4_verdict, "why": why, **identity,
            "kernels": None if isinstance(fa4, Exception) else [k for k, _a in fa4["launches"]]}


def _identity(recording: _Recording, call: dict[str, Any]) -> dict[str, Any]:
    """What the lean runtime tells the call apart by: {"file": its recipe key, "region": the guards of the region
    holding at its sizes (None when none does)}."""
    from fa4_aot.domain import kernel_keys
    from fa4_aot.runtime import call_args
    from fa4_aot.store import recipes

    shapes, kw = call["shapes"], call["kwargs"]
    q, k, v = shapes["q"], shapes["k"], shapes["v"]
    sig = call_args.signature(
        "paged" if "page_table" in call["ints"] else "seqused" if "seqused_k" in call["ints"] else
        "varlen" if "cu_seqlens_q" in call["ints"] else "dense",
        {"bf16": "torch.bfloat16", "fp16": "torch.float16"}[call["dtype"]], q[-2], q[-1], k[-2], v[-1],
        causal=kw["causal"], window_size=tuple(kw["window_size"]), softcap=kw["softcap"],
        sink="learnable_sink" in shapes, num_splits=kw["num_splits"], training=call["train"],
        deterministic=kw["deterministic"], return_lse=kw["return_lse"] or call["no_grad"],
        page_size=k[1] if "page_table" in call["ints"] else 0)
    attn = recording.rt.attention(sig)
    region = recipes.find(list(attn.regions), attn.sizes(call["sizes"]))
    return {"file": attn.key, "region": None if region is None else kernel_keys.dumps(region.guards)}


if __name__ == "__main__":
    main()
