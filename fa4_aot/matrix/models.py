"""Models: the attention facts of a model (catalog entry or Hugging Face config.json) and the signatures they need.

A model's attention layers differ only in their mask (global causal, sliding window, or full for encoders);
the rest (heads, head dims, dtype, softcap, sinks) is per model. `signatures()` turns those facts into the
attention `Signature`s one tensor-parallel rank runs for a workload:

- train:   dense forward+backward (pass `bwd`) and packed varlen forward+backward;
- prefill: forward with and without LSE, dense and varlen (encoders: forward, dense and varlen);
- decode:  contiguous KV cache through flash_attn_func (dense, seqlen_q = 1: causal, and full as HF `generate`
           passes for one query token), a KV cache with per-sequence lengths (seqused), and paged KV caches of
           PAGE_SIZES. Encoders do not decode.

Tensor parallelism splits heads as vLLM does: each rank runs heads/tp query heads; KV heads are split when
tp <= kv_heads and replicated (one per rank) when tp > kv_heads. A degree vLLM refuses (tp not dividing the query
heads, or neither of tp and kv_heads dividing the other) yields no signatures; `shard()` says why.

Pure: no FA4, no torch. The catalog is fa4_aot/matrix/models.toml.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from ..domain.signature import Signature
from ..domain.tomlsrc import TomlSource
from ..errors import ConfigError
from . import hfconfig
from .facts import KINDS, LAYERS, Model, make

__all__ = ["CATALOG", "WORKLOADS", "KINDS", "LAYERS", "PAGE_SIZES", "Model", "make", "shard", "signatures",
           "catalog", "resolve"]

CATALOG = Path(__file__).resolve().parent / "models.toml"
WORKLOADS = ("train", "prefill", "decode")
PAGE_SIZES = (16, 64, 128)  # vLLM's default block size, a common mid size, and FA4's TMA page size (= tile_n)
FIELDS: dict[str, Any] = {
    "source": str, "kind": str, "heads": int, "kv_heads": int, "head_dim": (int, list), "dtype": str, "window": int,
    "layers": str, "pattern": str, "softcap": (int, float), "sink": bool,
}


def shard(heads: int, kv_heads: int, tp: int) -> tuple[int, int] | str:
    """(query heads, KV heads) of one rank at tensor-parallel degree `tp`, or why vLLM refuses that degree."""
    if tp < 1 or heads % tp:
        return f"tp {tp} does not divide {heads} query heads"
    if tp <= kv_heads:
        if kv_heads % tp:
            return f"tp {tp} does not divide {kv_heads} KV heads"
        return heads // tp, kv_heads // tp
    if tp % kv_heads:
        return f"{kv_heads} KV heads cannot be replicated evenly over tp {tp}"
    return heads // tp, 1  # each rank holds one replicated KV head


def signatures(model: Model, tp: int, workloads: tuple[str, ...] | list[str] = WORKLOADS) -> list[Signature]:
    """The distinct signatures one rank of `model` at degree `tp` runs for `workloads` (order kept).
    [] when `tp` is a degree vLLM refuses for this model (see shard())."""
    bad = [w for w in workloads if w not in WORKLOADS]
    if bad:
        raise ConfigError(f"unknown workload(s) {', '.join(bad)}; allowed: {', '.join(WORKLOADS)}")
    heads = shard(model.heads, model.kv_heads, tp)
    if isinstance(heads, str):
        return []
    out: dict[Signature, None] = {}
    for mask, window in model.masks():
        for w in workloads:
            for layout, pass_, m, page in _forms(model, w, mask):
                out[Signature(
                    layout=layout, pass_=pass_, dtype=model.dtype, head_dim=model.head_dim,
                    head_dim_v=model.head_dim_v, mask=m, window=window if m == "local" else (0, 0),
                    softcap=model.softcap, sink=model.sink, num_splits=1, heads_q=heads[0], heads_kv=heads[1],
                    page_size=page,
                )] = None
    return list(out)


def _forms(model: Model, workload: str, mask: str) -> list[tuple[str, str, str, int]]:
    """(layout, pass, mask, page_size) of the calls a workload makes on layers of this mask."""
    if workload == "train":
        return [("dense", "bwd", mask, 0), ("varlen", "bwd", mask, 0)]
    if workload == "prefill":
        passes = ("fwd",) if model.kind == "encoder" else ("fwd", "fwd_lse")
        return [(layout, p, mask, 0) for layout in ("dense", "varlen") for p in passes]
    if model.kind == "encoder":
        return []
    forms = [("dense", "fwd", mask, 0), ("seqused", "fwd", mask, 0)]
    if mask == "causal":
        forms.append(("dense", "fwd", "full", 0))  # one query token: HF passes causal=False
    return forms + [("paged", "fwd", mask, p) for p in PAGE_SIZES]


# -- the catalog ----------------------------------------------------------------------------------------------
def catalog(path: Path | None = None) -> dict[str, Model]:
    """Every model of the catalog by name. Raises ConfigError naming file, line and field."""
    src = TomlSource(path or CATALOG)
    return {name: _parse(src, name, table) for name, table in src.data.get("models", {}).items()}


def _parse(src: TomlSource, name: str, t: dict[str, Any]) -> Model:
    header = f'[models."{name}"]' if "." in name else f"[models.{name}]"
    for key, value in t.items():
        if key not in FIELDS:
            raise src.fail(header, key, f"unknown field; allowed: {', '.join(FIELDS)}")
        if not isinstance(value, FIELDS[key]) or (isinstance(value, bool) and FIELDS[key] is int):
            raise src.fail(header, key, f"bad value {value!r}")
    for key in ("source", "kind", "heads", "kv_heads", "head_dim"):
        if key not in t:
            raise src.fail(header, None, f"missing field {key!r}")
    dims = t["head_dim"] if isinstance(t["head_dim"], list) else [t["head_dim"], t["head_dim"]]
    try:
        return make(name=name, source=t["source"], kind=t["kind"], heads=t["heads"], kv_heads=t["kv_heads"],
                    head_dim=dims[0], head_dim_v=dims[-1], dtype=t.get("dtype", "bf16"), window=t.get("window", 0),
                    layers=t.get("layers", "global"), pattern=t.get("pattern", ""),
                    softcap=float(t.get("softcap", 0.0)), sink=t.get("sink", False))
    except ValueError as e:
        raise src.fail(header, None, str(e)) from e




def _check_name(name: str, path: Path | None) -> None:
    """ConfigError unless `name` can be a catalog name or a path: not blank, no NUL, each part at most 255 bytes
    and all of it at most 4096 (what a filesystem takes), so that an empty --model never means "no model"."""
    parts = name.replace("\\", "/").split("/")
    why = ("it is empty" if not name.strip() else "it holds a NUL character" if "\0" in name else
           "it is longer than 4096 bytes" if len(name.encode(errors="replace")) > 4096 else
           "a part of it is longer than 255 bytes" if any(len(p.encode(errors="replace")) > 255 for p in parts) else "")
    if why:
        raise ConfigError(f"invalid model name {name[:80]!r}{'...' if len(name) > 80 else ''}: {why}; give a name "
                          f"of {path or CATALOG} (`fa4-aot models` lists them) or the path of a config.json")


def resolve(name_or_config: str, path: Path | None = None) -> Model:
    """A catalog model by name, or the model a Hugging Face config.json describes (a path to the file, or to a
    folder holding it). Raises ConfigError naming the catalog and the command that lists it, also for a name that
    cannot be one (empty, a NUL, a part over 255 bytes) before any file is looked for."""
    _check_name(name_or_config, path)
    given = Path(name_or_config).expanduser()
    try:
        if given.is_dir():
            given = given / "config.json"
        is_config = given.suffix == ".json" or given.is_file()
    except OSError as e:
        raise ConfigError(f"cannot look for model config {name_or_config!r}: {e.strerror}; give a catalog name "
                          "(`fa4-aot models`) or the path of a config.json") from None
    if is_config:
        return hfconfig.load(given)
    known = catalog(path)
    if name_or_config in known:
        return known[name_or_config]
    low = name_or_config.lower()
    near = ([n for n in known if low in n] or difflib.get_close_matches(low, list(known), n=3, cutoff=0.6))
    hint = f"did you mean {' or '.join(map(repr, near[:3]))}? " if near else ""
    raise ConfigError(f"unknown model {name_or_config!r}: not in {path or CATALOG} and not a config.json file; "
                      f"{hint}`fa4-aot models` lists the {len(known)} models of the catalog")
