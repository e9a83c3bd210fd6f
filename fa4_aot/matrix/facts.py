"""A model's attention facts (`Model`) and their validation (`make`): the one value the catalog (models.py) and
Hugging Face configs (hfconfig.py) both produce. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

KINDS = ("decoder", "encoder")
LAYERS = ("global", "local", "mixed")


@dataclass(frozen=True)
class Model:
    name: str
    source: str
    kind: str  # decoder | encoder
    heads: int
    kv_heads: int
    head_dim: int
    head_dim_v: int
    dtype: str = "bf16"
    window: int = 0  # sliding window in tokens, 0 = none
    layers: str = "global"  # global | local | mixed
    pattern: str = ""
    softcap: float = 0.0
    sink: bool = False

    def masks(self) -> list[tuple[str, tuple[int, int]]]:
        """(mask, window) of each kind of attention layer this model has."""
        if self.kind == "encoder":
            return [("full", (0, 0))]
        out = [("causal", (0, 0))] if self.layers in ("global", "mixed") else []
        if self.layers in ("local", "mixed"):
            out.append(("local", (self.window - 1, 0)))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "source": self.source, "kind": self.kind, "heads": self.heads,
                "kv_heads": self.kv_heads, "head_dim": self.head_dim, "head_dim_v": self.head_dim_v,
                "dtype": self.dtype, "window": self.window, "layers": self.layers, "pattern": self.pattern,
                "softcap": self.softcap, "sink": self.sink}



def make(**facts: Any) -> Model:
    """A validated Model. Raises ValueError saying which fact is wrong."""
    m = Model(**facts)
    checks = [
        (m.kind in KINDS, f"kind {m.kind!r}: allowed {', '.join(KINDS)}"),
        (m.layers in LAYERS, f"layers {m.layers!r}: allowed {', '.join(LAYERS)}"),
        (m.dtype in ("bf16", "fp16"), f"dtype {m.dtype!r}: allowed bf16, fp16"),
        (m.heads > 0 and m.kv_heads > 0 and m.heads % m.kv_heads == 0,
         f"heads {m.heads} / kv_heads {m.kv_heads}: query heads must be a positive multiple of KV heads"),
        (all(d > 0 and d % 8 == 0 for d in (m.head_dim, m.head_dim_v)),
         f"head dims {m.head_dim}/{m.head_dim_v}: positive multiples of 8"),
        (m.layers == "global" or m.window > 0, f"layers {m.layers!r} needs a sliding window > 0"),
        (m.softcap >= 0, f"softcap {m.softcap}: must be >= 0"),
    ]
    for ok, why in checks:
        if not ok:
            raise ValueError(f"invalid model {m.name!r}: {why}")
    return m

