"""Run in a fresh process configured for one SKU: compare the lean runtime's recorded decision with FA4's own.

argv: SKU, JSON list of signatures, number of random sizes per signature, seed. Prints one JSON report
(compared sizes, regions recorded, sizes whose region splits KV and combines, sizes FA4 rejects where no region
holds either, mismatches).
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
    from fa4_aot import config, fa4
    from fa4_aot.domain import recipe_format
    from fa4_aot.matrix import variants

    sku = variants.load(config.default_variants_file()).skus[sys.argv[1]]
    fa4.configure(sku)
    from fa4_aot.domain.signature import Signature

    sigs = [Signature.from_dict(d) for d in json.loads(sys.argv[2])]
    count, rng = int(sys.argv[3]), random.Random(int(sys.argv[4]))
    report = {"compared": 0, "recorded": 0, "split": 0, "refused": 0, "mismatches": [], "regions": {}}
    for sig in sigs:
        regions: list = []
        for _ in range(count):
            sizes = {**_random_sizes(sig.layout, rng, sig.page_size), **recipe_format.bound_sizes(sig),
                     recipe_format.HEADS: _random_heads(sig, rng)}  # page size and window: the call's (format 3)
            report["compared"] += 1
            verdict = _compare(fa4, sig, sizes, sku, regions, rng, report)
            if verdict:
                report["mismatches"].append({"signature": sig.to_dict(), "sizes": sizes, "why": verdict})
        report["regions"][str(sig)] = len(regions)
    print(json.dumps(report))


def _compare(fa4, sig, sizes: dict[str, int], sku, regions: list, rng: random.Random, report: dict) -> str:
    """'' when the lean runtime does what FA4 does at `sizes` (recording a region there if none holds), else why
    not. Where FA4 raises (a call it rejects), no region may hold: the lean runtime must refuse too."""
    from fa4_aot.domain import kernel_keys
    from fa4_aot.runtime import replay
    from fa4_aot.store import recipes

    region = recipes.find(regions, sizes)
    if region is None:
        try:
            region = fa4.record_recipe(sig, sizes, sku)
        except Exception as e:  # FA4 rejects these sizes: so must FA4 at exactly these sizes, and no region holds
            try:
                fa4.record_recipe(sig, sizes, sku, symbolic=False, defaults=_defaults(sig, sizes, rng))
            except type(e):
                report["refused"] += 1
                return ""
            return f"recording failed ({e!r}) where FA4 runs"
        regions.append(region)
        report["recorded"] += 1
        assert recipes.find(regions, sizes) is region, "a region must hold where it was recorded"
    try:
        concrete = fa4.record_recipe(sig, sizes, sku, symbolic=False, defaults=_defaults(sig, sizes, rng))
    except Exception as e:
        return f"a region holds where FA4 raises {e!r}"
    ours, fa4s = region.to_json(), concrete.to_json()  # steps as recorded: arguments with size expressions
    mine = {part: replay.concretize(ours[part], sizes) for part in ("fwd", "bwd", "outputs", "inputs")}
    theirs = {part: fa4s[part] for part in ("fwd", "bwd", "outputs", "inputs")}
    report["split"] += any(k.family == "_flash_attn_fwd_combine" for k in region.kernels)
    if kernel_keys.dumps(mine) != kernel_keys.dumps(theirs):
        return "steps differ"
    if [k.kernel_key for k in region.kernels] != [k.kernel_key for k in concrete.kernels]:
        return "kernels differ"
    return ""


def _random_sizes(layout: str, rng: random.Random, page_size: int = 0) -> dict[str, int]:
    batch = rng.choice([1, 2, 3, rng.randint(1, 600)])
    sq = rng.choice([1, 2, rng.randint(1, 300), rng.randint(1, 20000)])
    sk = rng.choice([sq, rng.randint(1, 300), rng.randint(1, 40000)])
    if layout == "dense":
        return {"batch": batch, "seqlen_q": sq, "seqlen_k": sk}
    if layout == "varlen":
        return {"batch": batch, "total_q": rng.randint(batch, batch * sq) if sq > 1 else batch,
                "total_k": rng.randint(batch, batch * sk) if sk > 1 else batch, "max_seqlen_q": sq,
                "max_seqlen_k": sk}
    if layout == "paged":  # decode: mostly a few query tokens; the pool is shared, of any size
        sq = rng.choice([1, 1, rng.randint(1, 8), sq])
        pages = max(1, sk // page_size) if rng.random() < 0.8 else rng.randint(1, 64)
        pool = rng.choice([batch * pages, rng.randint(1, 4 * batch * pages)])
        return {"batch": batch, "seqlen_q": sq, "num_pages": pool, "pages_per_seq": pages,
                "max_seqlen_q": sq, "max_seqlen_k": _max_length(pages * page_size, rng)}
    return {"batch": batch, "seqlen_q": sq, "seqlen_k": sk, "max_seqlen_q": sq,
            "max_seqlen_k": _max_length(sk, rng)}


def _random_heads(sig, rng: random.Random) -> int:
    """A KV head count at the signature's GQA ratio: mostly the signature's own, else any (issue 17: one recipe
    file serves every head count of a ratio, so a region recorded at one must equal FA4 at another)."""
    return sig.heads_kv if rng.random() < 0.75 else rng.choice([1, 2, 2 * sig.heads_kv, rng.randint(1, 64)])


def _max_length(default: int, rng: random.Random) -> int:
    """FA4's default max_seqlen_k (what it assumes when none is given) or a caller's smaller bound."""
    return default if rng.random() < 0.6 else rng.randint(1, default)


def _defaults(sig, sizes: dict[str, int], rng: random.Random) -> tuple[str, ...]:
    """The max lengths FA4 is left to default in the concrete run: where the sizes hold FA4's default, mostly
    (the lean runtime fills in FA4's default for a None, so both must choose alike)."""
    if sig.layout not in ("seqused", "paged"):
        return ()
    default_k = sizes["pages_per_seq"] * sig.page_size if sig.layout == "paged" else sizes["seqlen_k"]
    found = ("max_seqlen_q",) if rng.random() < 0.8 else ()
    return found + (("max_seqlen_k",) if sizes["max_seqlen_k"] == default_k and rng.random() < 0.8 else ())


if __name__ == "__main__":
    main()
