"""What recipe format 3 (issue 29: no recipe key finer than FA4's compile key) costs and saves a build, on the CPU.

For a paged decode signature (bf16, head dim 128, 56/8 heads, causal) at page sizes 16 and 128, and a windowed
training signature (48/4 heads, window (4095, 0)): compile.lean.explore's regions and seconds, into one format-3 file
per signature family, side by side with exploring without the page-size-1 points (what a format-3 build would
record if torch's contiguity guard did not split page size 1 off); then how many recipe files the signatures of a
model family at page sizes 1, 16, 64, 128 and windows 1023, 2047, 4095 need under format 2 (one per page size and
window) and format 3 (one).

    PYTHONPATH=. .venv/bin/python bench/lean_keys.py
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
import warnings
from pathlib import Path


def main() -> None:
    warnings.filterwarnings("ignore")
    from fa4_aot import config, fa4
    from fa4_aot.compile import lean
    from fa4_aot.fa4.versions import toolchain
    from fa4_aot.matrix import variants
    from fa4_aot.runtime.call_args import signature
    from fa4_aot.store import Store, recipes

    sku = variants.load(config.default_variants_file()).skus["h200"]
    fa4.configure(sku)
    paged = signature("paged", "torch.bfloat16", 56, 128, 8, 128, causal=True, page_size=16)
    local = signature("dense", "torch.bfloat16", 48, 128, 4, 128, window_size=(4095, 0), training=True)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for label, skip_one in (("format 3", False), ("format 3 without page size 1", True)):
        before = lean._one_token_pages
        if skip_one:
            lean._one_token_pages = lambda points: points
        try:
            for sigs in ([paged, dataclasses.replace(paged, page_size=128)], [local]):
                with tempfile.TemporaryDirectory() as tmp:
                    store = Store(Path(tmp))
                    worker = lean.Worker(sku, store, store, toolchain())
                    started, recorded = time.monotonic(), {}
                    for sig in sigs:
                        lean.explore(worker, sig, recorded)
                    regions = sum(len(r) for r in recorded.values())
                    print(f"{label:30s} {sigs[0].layout:6s} {len(sigs)} signature(s): {regions} regions in "
                          f"{len(recorded)} file(s), {time.monotonic() - started:.1f} s")
        finally:
            lean._one_token_pages = before
    family = [dataclasses.replace(paged, page_size=p) for p in (1, 16, 64, 128)] + \
        [dataclasses.replace(local, window=(w, 0)) for w in (1023, 2047, 4095)]
    for fmt in (2, 3):
        print(f"recipe files for 4 page sizes + 3 windows, format {fmt}: "
              f"{len({recipes.recipe_key(s, sku, fmt) for s in family})}")


if __name__ == "__main__":
    main()
