"""What the lean runtime adds to a build, on the build host: recording a recipe region (FA4 on fake tensors with
symbolic sizes) and linking an exported kernel object with gcc, per item; and what a lean store carries.

    FA4_AOT_CACHE=<a built store> python bench/lean_build_cost.py OUT.json
"""

from __future__ import annotations

import json
import statistics
import sys
import time
import warnings
from pathlib import Path


def main() -> None:
    warnings.filterwarnings("ignore")
    from fa4_aot import config, fa4
    from fa4_aot.domain import hosts
    from fa4_aot.domain.signature import Signature
    from fa4_aot.matrix import variants
    from fa4_aot.store import Store

    sku = variants.load(config.default_variants_file()).skus["h200"]
    fa4.configure(sku)
    store = Store(config.default_cache_dir())
    base = {"layout": "dense", "pass_": "bwd", "dtype": "bf16", "head_dim": 128, "head_dim_v": 128, "mask": "causal",
            "window": [0, 0], "softcap": 0.0, "sink": False, "num_splits": 1, "heads_q": 32, "heads_kv": 8}
    cases = {"dense bwd causal GQA": (base, {"batch": 2, "seqlen_q": 4096, "seqlen_k": 4096}),
             "dense fwd causal GQA": ({**base, "pass_": "fwd"}, {"batch": 2, "seqlen_q": 4096, "seqlen_k": 4096}),
             "varlen bwd causal GQA": ({**base, "layout": "varlen"}, {"batch": 8, "total_q": 30000, "total_k": 30000,
                                                                      "max_seqlen_q": 4096, "max_seqlen_k": 4096})}
    fa4.record_recipe(Signature.from_dict(base), cases["dense bwd causal GQA"][1], sku)  # warm-up: FA4 imports
    record = {}
    for name, (sig, sizes) in cases.items():
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            region = fa4.record_recipe(Signature.from_dict(sig), sizes, sku)
            times.append(time.perf_counter() - t0)
        record[name] = {"seconds": round(statistics.median(times), 3), "steps": len(region.fwd) + len(region.bwd),
                        "kernels": len(region.kernels), "guards": len(region.guards),
                        "json_bytes": len(json.dumps(region.to_json()))}
    link, sizes_out = [], []
    for entry in list(store.entries())[:10]:
        data = store.read_object(entry.object_digest)
        t0 = time.perf_counter()
        lib = fa4.link(data, hosts.get(entry.host or hosts.DEFAULT))
        link.append(time.perf_counter() - t0)
        sizes_out.append((len(data), len(lib)))
    runtime = {k: p for k, p in fa4.runtime_libraries(hosts.get(hosts.DEFAULT)).items() if p is not None}
    doc = {"date": time.strftime("%Y-%m-%d"), "record_region": record,
           "link_seconds_median": round(statistics.median(link), 3) if link else None,
           "object_and_library_bytes": sizes_out,
           "runtime_library_bytes": {name: Path(p).stat().st_size for name, p in runtime.items()}}
    Path(sys.argv[1]).write_text(json.dumps(doc, indent=1))
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
