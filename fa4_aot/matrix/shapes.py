"""Shape grids (`[shapes.NAME]` of a variants file): the batch, sequence lengths and head counts a variant
with `shapes = "NAME"` is restricted to, each point becoming one call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..domain.tomlsrc import TomlSource
from .fields import int_list

SHAPE_FIELDS = ("batch", "seqlen_q", "seqlen_k", "heads", "page_size")


@dataclass(frozen=True)
class Shapes:
    name: str
    batch: tuple[int, ...]
    seqlen_q: tuple[int, ...]
    seqlen_k: tuple[int, ...]  # empty: seqlen_k = seqlen_q
    heads: tuple[int, ...]
    page_size: int

    def points(self) -> list[tuple[int, int, int, int]]:
        """(batch, seqlen_q, seqlen_k, heads) of the grid; seqlen_k < seqlen_q is skipped (not a real call)."""
        pairs = [(q, q) for q in self.seqlen_q] if not self.seqlen_k else [
            (q, k) for q in self.seqlen_q for k in self.seqlen_k if k >= q
        ]
        return [(b, q, k, h) for b in self.batch for q, k in pairs for h in self.heads]


def parse_shapes(src: TomlSource, name: str, table: dict[str, Any]) -> Shapes:
    """The `[shapes.NAME]` table; raises ConfigError naming file, line and field."""
    header = f"[shapes.{name}]"
    for key in table:
        if key not in SHAPE_FIELDS:
            raise src.fail(header, key, f"unknown field; allowed: {', '.join(SHAPE_FIELDS)}")
    for key in ("batch", "seqlen_q", "heads"):
        if key not in table:
            raise src.fail(header, None, f"missing field {key!r}")
    page_size = table.get("page_size", 128)
    if not isinstance(page_size, int) or page_size <= 0:
        raise src.fail(header, "page_size", f"expected a positive integer, got {page_size!r}")
    return Shapes(
        name=name,
        batch=int_list(src, header, "batch", table["batch"]),
        seqlen_q=int_list(src, header, "seqlen_q", table["seqlen_q"]),
        seqlen_k=int_list(src, header, "seqlen_k", table["seqlen_k"]) if "seqlen_k" in table else (),
        heads=int_list(src, header, "heads", table["heads"]),
        page_size=page_size,
    )
