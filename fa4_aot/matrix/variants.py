"""variants.toml, the variants file: its SKU table, shape grids and [[variants]] entries, read into one Matrix.

A [[variants]] entry names what a model runs: either call features (head dims, dtypes, masks, GQA ratios,
layouts, passes, head counts...; call_variants.py), optionally restricted to a shape grid (shapes.py), or
catalog models at TP degrees and workloads (model_variants.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..domain.sku_table import parse_skus, unknown
from ..domain.skus import Sku
from ..domain.tomlsrc import TomlSource
from ..errors import ConfigError
from .call_variants import Variant, parse_variant
from .model_variants import ModelVariant, parse_model_variant
from .shapes import Shapes, parse_shapes


@dataclass(frozen=True)
class Matrix:
    path: Path
    skus: dict[str, Sku]
    shapes: dict[str, Shapes]
    variants: tuple[Variant | ModelVariant, ...]

    def sku(self, name: str) -> Sku:
        if name not in self.skus:
            raise unknown(name, self.skus)
        return self.skus[name]

    def select(self, names: list[str] | None) -> list[Variant | ModelVariant]:
        if not names:
            return list(self.variants)
        by_name = {v.name: v for v in self.variants}
        missing = [n for n in names if n not in by_name]
        if missing:
            raise ConfigError(f"unknown variant(s) {', '.join(missing)} in {self.path}; known: {', '.join(by_name)}")
        return [by_name[n] for n in names]


def load(path: Path) -> Matrix:
    """Parse and validate a variants file. Raises ConfigError naming file, line, field and allowed values."""
    src = TomlSource(path)
    for key in src.data:
        if key not in ("skus", "shapes", "variants", "tirx"):  # [[tirx]]: the TIRx family's (fa4_aot/tirx/entries.py)
            raise ConfigError(f"{path}: unknown top-level key {key!r}; allowed: skus, shapes, variants, tirx")
    skus = parse_skus(src)
    shapes = {name: parse_shapes(src, name, table) for name, table in src.data.get("shapes", {}).items()}
    variants = [_entry(src, i, t, shapes) for i, t in enumerate(src.data.get("variants", []))]
    names = [v.name for v in variants]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise src.fail("[[variants]]", "name", f"duplicate variant name {name!r}", index=i)
    return Matrix(path=Path(path), skus=skus, shapes=shapes, variants=tuple(variants))


def _entry(src: TomlSource, i: int, table: dict[str, Any], shapes: dict[str, Shapes]) -> Variant | ModelVariant:
    """The `i`-th [[variants]] entry: a model entry when it names `models`, else one of call features."""
    if "models" in table:
        return parse_model_variant(src, i, table)
    return parse_variant(src, i, table, shapes)
