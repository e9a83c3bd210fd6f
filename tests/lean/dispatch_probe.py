"""Run in a fresh process configured for one SKU: compare the lean runtime's recorded decision with FA4's own.

argv: SKU, JSON list of signatures, number of random sizes per signature, seed. Prints one JSON report.
For each random sizes point: the region whose guards hold (recorded from that point when none does yet) is
evaluated at the point and must equal, step for step, what FA4 does when run at exactly that point (every
allocation with its shape and dtype, every zero fill, every kernel with its compile key and argument list).
"""

from __future__ import annotations

import json
import random
import sys
import warnings


def main() -> None:
    warnings.filterwarnings("ignore")
    from fa4_aot import config, fa4, variants

    sku = variants.load(config.default_variants_file()).skus[sys.argv[1]]
    fa4.configure(sku)
    from fa4_aot import kernel_keys, recipe, recipe_store
    from fa4_aot.signature import Signature

    sigs = [Signature.from_dict(d) for d in json.loads(sys.argv[2])]
    count, rng = int(sys.argv[3]), random.Random(int(sys.argv[4]))
    report = {"compared": 0, "recorded": 0, "mismatches": [], "regions": {}}
    for sig in sigs:
        regions: list = []
        for _ in range(count):
            sizes = _random_sizes(sig.layout, rng)
            region = recipe_store.find(regions, sizes)
            if region is None:
                region = fa4.record_recipe(sig, sizes, sku)
                regions.append(region)
                report["recorded"] += 1
                assert recipe_store.find(regions, sizes) is region, "a region must hold where it was recorded"
            concrete = fa4.record_recipe(sig, sizes, sku, symbolic=False)
            mine = {part: recipe.concretize(region[part], sizes) for part in ("fwd", "bwd", "outputs", "inputs")}
            theirs = {part: concrete[part] for part in ("fwd", "bwd", "outputs", "inputs")}
            same = kernel_keys.dumps(mine) == kernel_keys.dumps(theirs) and \
                [k["kernel_key"] for k in region["kernels"]] == [k["kernel_key"] for k in concrete["kernels"]]
            report["compared"] += 1
            if not same:
                report["mismatches"].append({"signature": sig.to_dict(), "sizes": sizes})
        report["regions"][str(sig)] = len(regions)
    print(json.dumps(report))


def _random_sizes(layout: str, rng: random.Random) -> dict[str, int]:
    batch = rng.choice([1, 2, 3, rng.randint(1, 600)])
    sq = rng.choice([1, 2, rng.randint(1, 300), rng.randint(1, 20000)])
    sk = rng.choice([sq, rng.randint(1, 300), rng.randint(1, 40000)])
    if layout == "dense":
        return {"batch": batch, "seqlen_q": sq, "seqlen_k": sk}
    return {"batch": batch, "total_q": rng.randint(batch, batch * sq) if sq > 1 else batch,
            "total_k": rng.randint(batch, batch * sk) if sk > 1 else batch, "max_seqlen_q": sq, "max_seqlen_k": sk}


if __name__ == "__main__":
    main()
