"""One certification check through the store's kernels and through FA4's own JIT, side by side: is a finding
FA4's or fa4-aot's? The same worker processes `fa4-aot certify` uses (certify/pool.py, checker.py), the same
inputs and reference, the same marginal rule; only the kernels differ (the store's under install(), or the JIT's).

    python bench/store_vs_jit.py STORE SKU CHECK_JSON [--seeds N]

CHECK_JSON: {"sig": {...Signature...}, "point": {...sizes...}} (a certify finding's check, less its kernels).
Prints one JSON line per seed and runtime: status, failures (with their ratios over the repeats), marginal misses.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fa4_aot.certify.plan import Check
from fa4_aot.certify.pool import Pool
from fa4_aot.domain.signature import Signature


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store", type=Path)
    parser.add_argument("sku")
    parser.add_argument("check")
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    doc = json.loads(args.check)
    checks = [(f"seed{s}", Check(Signature.from_dict(doc["sig"]), {k: int(v) for k, v in doc["point"].items()},
                                 (), "small", 27 + s, "store_vs_jit")) for s in range(args.seeds)]
    for oracle in (False, True):
        pool = Pool(args.store, args.sku, [0], 1, 600.0, lean=True, oracle=oracle)
        for o in pool.run(checks):
            print(json.dumps({"runtime": "FA4 JIT" if oracle else "store (install, lean)", "check": o.ident,
                              "status": o.status, "part": o.part, "detail": o.detail[:300],
                              "failures": o.failures, "marginal": o.marginal}), flush=True)


if __name__ == "__main__":
    main()
