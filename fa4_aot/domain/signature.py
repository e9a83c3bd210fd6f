"""An attention signature: everything about a call except batch size and sequence lengths.

A model layer has one signature per pass (heads, head dims, mask, softcap, sink, layout, dtype); the batch and
sequence lengths vary from call to call. Coverage is judged per signature: a build covers a signature when it
holds every kernel FA4's dispatch can choose for it at any batch and sequence lengths.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from .calls import Call

_SHAPE_FIELDS = ("batch", "seqlen_q", "seqlen_k")


@dataclass(frozen=True)
class Signature:
    layout: str
    pass_: str
    dtype: str
    head_dim: int
    head_dim_v: int
    mask: str
    window: tuple[int, int]
    softcap: float
    sink: bool
    num_splits: int
    heads_q: int
    heads_kv: int
    page_size: int = 0

    def __post_init__(self) -> None:
        # FA4 reads a window only for mask "local": a causal or full signature with a leftover window (a variants
        # entry's default) is the same signature, so it must compare and hash equal.
        if self.mask != "local" and tuple(self.window) != (0, 0):
            object.__setattr__(self, "window", (0, 0))

    def call(self, batch: int, seqlen_q: int, seqlen_k: int) -> Call:
        """The concrete Call of this signature at these shapes. Fields are read, not asdict()-copied: planning a
        signature makes hundreds of its calls, and asdict's deep copy was 3% of planning."""
        return Call(**{f.name: getattr(self, f.name) for f in fields(self)}, batch=batch, seqlen_q=seqlen_q,
                    seqlen_k=seqlen_k)

    @classmethod
    def of(cls, call: Call) -> Signature:
        """The signature of a concrete Call (its shapes dropped)."""
        data = {f.name: getattr(call, f.name) for f in fields(cls)}
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        """{field: value}, as asdict() gives it (the window a tuple), without its deep copy: every field is an
        immutable value, and the lean runtime computes a new signature's recipe keys from this on its first call."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Signature:
        """Inverse of to_dict; shape fields, if present, are ignored. Raises ValueError naming a missing field."""
        names = [f.name for f in fields(cls)]
        missing = [n for n in names if n not in data and n != "page_size"]
        if missing:
            raise ValueError(f"invalid signature {data!r}: missing {', '.join(missing)}")
        values = {n: data[n] for n in names if n in data}
        values["window"] = tuple(values["window"])
        return cls(**values)
