"""The variants file's [[tirx]] entries: which TIRx FA4 problems `fa4-aot build --family tirx` builds.

A TIRx kernel is traced for static sizes, so an entry lists them: explicit problems (Problem's string form), or
catalog models (the training shapes: each model's heads at each TP degree, crossed with batches, sequence lengths
and masks). The kernel is fp16 with head dim 128: a model of another head dim is skipped with the reason.

    [[tirx]]
    name = "tirx-llama-train"
    models = ["llama-3.1-8b"]      # or problems = ["b1-q4096-k4096-h32-kv8-d128-causal"]
    tp = [1, 8]
    batch = [1]
    seqlens = [4096]               # seqlen_q = seqlen_kv, as training runs
    causal = [true]
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..domain.tomlsrc import TomlSource
from ..errors import ConfigError
from ..matrix import models
from .problem import Problem

FIELDS = ("name", "problems", "models", "tp", "batch", "seqlens", "causal", "description")


@dataclass(frozen=True)
class TirxEntry:
    name: str
    problems: tuple[Problem, ...]
    skipped: tuple[str, ...] = ()  # model shapes the kernel cannot take, with why


def load(path: Path) -> list[TirxEntry]:
    """Every [[tirx]] entry of the variants file `path`. Raises ConfigError naming file, line and field."""
    src = TomlSource(path)
    return [_entry(src, i, t) for i, t in enumerate(src.data.get("tirx", []))]


def select(entries: list[TirxEntry], names: list[str], path: Path) -> list[TirxEntry]:
    if not names:
        return entries
    missing = [n for n in names if n not in {e.name for e in entries}]
    if missing:
        raise ConfigError(f"unknown [[tirx]] entr(ies) {', '.join(missing)} in {path}; known: "
                          f"{', '.join(e.name for e in entries) or 'none'}")
    return [e for e in entries if e.name in names]


def _entry(src: TomlSource, i: int, t: dict[str, Any]) -> TirxEntry:
    for key in t:
        if key not in FIELDS:
            raise src.fail("[[tirx]]", key, f"unknown field; allowed: {', '.join(FIELDS)}", index=i)
    if "name" not in t or ("problems" in t) == ("models" in t):
        raise src.fail("[[tirx]]", None, "needs a name and exactly one of problems and models", index=i)
    try:
        if "problems" in t:
            return TirxEntry(t["name"], tuple(Problem.parse(p) for p in t["problems"]))
        return _from_models(t)
    except (ValueError, TypeError, KeyError) as e:
        raise src.fail("[[tirx]]", None, str(e), index=i) from e


def _from_models(t: dict[str, Any]) -> TirxEntry:
    found: dict[Problem, None] = {}
    skipped = []
    for name in t["models"]:
        model = models.resolve(name)
        for tp in t.get("tp", [1]):
            heads = models.shard(model.heads, model.kv_heads, tp)
            if isinstance(heads, str) or model.head_dim != 128 or model.head_dim_v != 128:
                skipped.append(f"{name} tp{tp}: " + (heads if isinstance(heads, str) else
                                                    f"head dim {model.head_dim}/{model.head_dim_v}, not 128"))
                continue
            for b in t.get("batch", [1]):
                for s in t["seqlens"]:
                    for causal in t.get("causal", [True]):
                        found[Problem(b, s, s, heads[0], heads[1], 128, causal)] = None
    return TirxEntry(t["name"], tuple(found), tuple(skipped))
