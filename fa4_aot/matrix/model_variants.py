"""A [[variants]] entry naming catalog models, TP degrees and workloads (models.py): the ModelVariant value,
which expands into every signature those models run, and its parsing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..domain.signature import Signature
from ..domain.skus import ARCHS, Sku
from ..domain.tomlsrc import TomlSource
from . import models
from .fields import choices, entry_fail, int_list

MODEL_VARIANT_FIELDS = ("name", "models", "tp", "workloads", "archs", "description")


@dataclass(frozen=True)
class ModelVariant:
    """Every signature the named catalog models (["*"]: the whole catalog) run at these TP degrees and workloads."""

    name: str
    models: tuple[str, ...]
    tp: tuple[int, ...]
    workloads: tuple[str, ...]
    archs: tuple[str, ...] = ()
    description: str = ""

    def applies_to(self, sku: Sku) -> bool:
        return not self.archs or sku.arch in self.archs

    @property
    def complete(self) -> bool:
        return True  # model signatures are always built for every batch and sequence length

    def model_list(self) -> list[Any]:
        catalog = models.catalog()
        return list(catalog.values()) if self.models == ("*",) else [catalog[n] for n in self.models]

    def signatures(self) -> list[Signature]:
        """Every distinct signature of the models at the TP degrees and workloads (degrees vLLM refuses skipped)."""
        out: dict[Signature, None] = {}
        for model in self.model_list():
            for tp in self.tp:
                out.update(dict.fromkeys(models.signatures(model, tp, self.workloads)))
        return list(out)


def parse_model_variant(src: TomlSource, i: int, table: dict[str, Any]) -> ModelVariant:
    """A model entry; raises ConfigError naming file, line, field and the allowed values."""
    fail = entry_fail(src, i)
    for key in table:
        if key not in MODEL_VARIANT_FIELDS:
            raise fail(key, f"unknown field in a model entry; allowed: {', '.join(MODEL_VARIANT_FIELDS)}")
    if not isinstance(table.get("name"), str) or not table["name"]:
        raise fail("name", "expected a non-empty string")
    known = models.catalog()
    names = table["models"]
    if not isinstance(names, list) or not names or any(n not in known and n != "*" for n in names):
        raise fail("models", f"got {names!r}; allowed: [\"*\"] (the whole catalog) or names from `fa4-aot models`")
    tp = int_list(src, "[[variants]]", "tp", table.get("tp", [1]), i)
    workloads = choices(src, i, "workloads", table.get("workloads", list(models.WORKLOADS)), models.WORKLOADS)
    archs = table.get("archs", [])
    return ModelVariant(
        name=table["name"], models=("*",) if "*" in names else tuple(names), tp=tp, workloads=workloads,
        archs=choices(src, i, "archs", archs, ARCHS) if archs else (),
        description=str(table.get("description", "")),
    )
