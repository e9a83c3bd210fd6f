"""Catalog gap analysis: which models produce a kernel class no other catalog model produces.

FA4 keys a kernel on the GQA ratio (query heads per KV head on one rank), not on the head counts, and on whether a
window is set, not on its length (flash_attn/cute/interface.py's compile key: nheads_per_kv, window_size_left is
not None, ...). So a model's signature at a TP degree is a *class*: the Signature with heads replaced by the
ratio and the window by the local flag. A model fills a gap when one of its classes (at TP 1, 2, 4, 8 for train,
prefill and decode, as the default variants.toml builds the catalog) is produced by no model of the base.

    python bench/catalog_gaps.py                       # each catalog model against all the others
    python bench/catalog_gaps.py --base BASE.toml      # each model of the catalog not in BASE, against BASE
    python bench/catalog_gaps.py --ratios 64,128       # (head dim, ratio) pairs of a causal sweep no model has
    python bench/catalog_gaps.py --sweep-variants F    # write that sweep (ratios 1-16, d64 and d128) as a
                                                       # variants file, for `fa4-aot build --variants F --dry-run`

Pure (no FA4): classes are a proxy for kernels; `fa4-aot build --sku h200 --dry-run --json` gives the kernels.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fa4_aot.domain.signature import Signature  # noqa: E402
from fa4_aot.matrix import models  # noqa: E402

TPS = (1, 2, 4, 8)
Class = tuple[object, ...]


def kernel_class(sig: Signature) -> Class:
    """What of a signature FA4's compile key sees: heads as their ratio, a window as the local flag."""
    return (sig.layout, sig.pass_, sig.dtype, sig.head_dim, sig.head_dim_v, sig.mask, sig.softcap, sig.sink,
            sig.num_splits, sig.page_size, sig.heads_q // sig.heads_kv)


def classes(model: models.Model, tps: Iterable[int] = TPS) -> dict[Class, int]:
    """{class: the lowest TP degree producing it} of one model."""
    out: dict[Class, int] = {}
    for tp in tps:
        for sig in models.signatures(model, tp):
            out.setdefault(kernel_class(sig), tp)
    return out


def gaps(model: models.Model, others: Iterable[models.Model]) -> dict[Class, int]:
    """Classes of `model` that none of `others` produces."""
    seen: set[Class] = set()
    for other in others:
        seen |= set(classes(other))
    return {c: tp for c, tp in classes(model).items() if c not in seen}


def summary(found: dict[Class, int]) -> str:
    """'d128 fp16 causal gqa 1 (tp 1), ...': the distinct (dims, dtype, mask, softcap, sink, ratio) of the gaps."""
    short = {}
    for (_, _, dtype, d, dv, mask, softcap, sink, _, _, ratio), tp in found.items():
        dims = f"d{d}" if d == dv else f"d{d}/{dv}"
        extra = (f" softcap {softcap:g}" if softcap else "") + (" sink" if sink else "")
        key = f"{dims} {dtype} {mask}{extra} gqa {ratio}"
        short[key] = min(tp, short.get(key, tp))
    return ", ".join(f"{k} (tp {tp})" for k, tp in sorted(short.items()))


def sweep(dims: list[int], ratios: list[int], base: Iterable[models.Model]) -> list[str]:
    """Which (head dim, ratio) of a causal bf16 sweep no base model produces."""
    seen = {(c[3], c[5], c[2], c[6], c[7], c[10]) for m in base for c in classes(m)}
    return [f"d{d} gqa {r}" for d in dims for r in ratios if (d, "causal", "bf16", 0.0, False, r) not in seen]


def sweep_variants(dims: list[int], ratios: list[int], matrix: Path) -> str:
    """A variants file (the SKUs of `matrix`, then shape-complete causal bf16 variants per ratio) holding the forms a
    catalog decoder runs: train and prefill (dense and varlen; fwd, fwd_lse, bwd), decode (seqused and paged with
    pages of 128 and 16, and dense non-causal for one query token)."""
    text = matrix.read_text()
    out = [text[text.index("# --- SKUs"):text.index("# --- Shape grids")]]
    forms = [("train-prefill", 0, '["fwd", "fwd_lse", "bwd"]', '["dense", "varlen"]', "causal"),
             ("decode", 0, '["fwd"]', '["seqused", "paged"]', "causal"),
             ("decode-page16", 16, '["fwd"]', '["paged"]', "causal"),
             ("decode-full", 0, '["fwd"]', '["dense"]', "full")]
    for r in ratios:
        for name, page, passes, layouts, mask in forms:
            out.append(f'[[variants]]\nname = "gqa{r}-{name}"\nheads = [{8 * r}]\n'
                       + (f"page_size = {page}\n" if page else "")
                       + f'passes = {passes}\nlayouts = {layouts}\nhead_dims = {dims}\nmasks = ["{mask}"]\n'
                       f"gqa = [{r}]\n")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--catalog", type=Path, default=models.CATALOG)
    parser.add_argument("--base", type=Path, help="judge only the models not in this catalog, against it")
    parser.add_argument("--ratios", help="head dims of a causal bf16 GQA sweep (ratios 1..16) to report gaps of")
    parser.add_argument("--sweep-variants", type=Path, help="write the d64/d128 ratio 1..16 sweep variants here")
    args = parser.parse_args()
    if args.sweep_variants:
        matrix = Path(__file__).resolve().parents[1] / "variants.toml"
        args.sweep_variants.write_text(sweep_variants([64, 128], list(range(1, 17)), matrix))
        return
    catalog = models.catalog(args.catalog)
    base = models.catalog(args.base) if args.base else None
    for name, model in catalog.items():
        if base is not None and name in base:
            continue
        others = base.values() if base is not None else [m for n, m in catalog.items() if n != name]
        found = gaps(model, others)
        print(f"{name:24} {'GAP ' + summary(found) if found else 'covered'}")
    if args.ratios:
        dims = [int(d) for d in args.ratios.split(",")]
        print("sweep gaps:", ", ".join(sweep(dims, list(range(1, 17)), catalog.values())) or "none")


if __name__ == "__main__":
    main()
