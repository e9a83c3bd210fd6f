"""A concrete FlashAttention-4 call (shapes and flags) as a pure value.

`Call` is what a variant expands to, what a client reports when a kernel is missing and what
`fa4-aot build --from-misses` rebuilds. Every producer goes through `Call.from_dict`, which checks
each field, and the flag derivations (`pass_of`, `mask_of`, `dtype_name`) exist once, here. Running a
Call through FA4 is fa4_aot.fa4's business; nothing here imports torch or FA4.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

DTYPES = ("bf16", "fp16")
LAYOUTS = ("dense", "varlen", "seqused", "paged")
PASSES = ("fwd", "fwd_lse", "bwd", "bwd_det")
MASKS = ("full", "causal", "local")
_DTYPE_NAMES = {"torch.bfloat16": "bf16", "torch.float16": "fp16"}
_CHOICES = {"layout": LAYOUTS, "pass_": PASSES, "dtype": DTYPES, "mask": MASKS}


def pass_of(*, training: bool, deterministic: bool, return_lse: bool) -> str:
    """The pass a call runs: training calls run a backward (deterministic or not), inference calls a forward."""
    if training:
        return "bwd_det" if deterministic else "bwd"
    return "fwd_lse" if return_lse else "fwd"


def mask_of(*, causal: bool, local: bool) -> str:
    return "causal" if causal else "local" if local else "full"


def dtype_name(dtype: Any) -> str | None:
    """'bf16' or 'fp16' for a torch dtype (matched by name, so torch is not imported), else None."""
    return _DTYPE_NAMES.get(str(dtype))


@dataclass(frozen=True)
class Call:
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
    batch: int
    seqlen_q: int
    seqlen_k: int
    heads_q: int
    heads_kv: int
    page_size: int = 0

    @property
    def training(self) -> bool:
        return self.pass_ in ("bwd", "bwd_det")

    def flags(self) -> dict[str, Any]:
        """The keyword flags FA4's interface takes for this call (tensors and per-batch arguments aside)."""
        return {
            "causal": self.mask == "causal",
            "window_size": tuple(self.window) if self.mask == "local" else (None, None),
            "softcap": self.softcap,
            "num_splits": self.num_splits,
            "deterministic": self.pass_ == "bwd_det",
            "return_lse": self.pass_ == "fwd_lse",
        }

    def describe(self) -> str:
        extras = [f"window={list(self.window)}" if self.mask == "local" else ""]
        extras += [f"softcap={self.softcap}" if self.softcap else "", "sink" if self.sink else ""]
        extras += [f"num_splits={self.num_splits}" if self.num_splits != 1 else ""]
        extras += [f"page_size={self.page_size}" if self.layout == "paged" else ""]
        dims = f"{self.head_dim}" if self.head_dim == self.head_dim_v else f"{self.head_dim}x{self.head_dim_v}"
        return " ".join(
            [f"{self.pass_} {self.layout} {self.dtype} d={dims} {self.mask}",
             f"b={self.batch} sq={self.seqlen_q} sk={self.seqlen_k} h={self.heads_q}/{self.heads_kv}"]
            + [e for e in extras if e]
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Call:
        """Inverse of to_dict (a JSON list window is accepted). Raises ValueError naming a missing, unknown or
        invalid field."""
        names = [f.name for f in fields(cls)]
        missing = [n for n in names if n not in data and n != "page_size"]
        unknown = sorted(set(data) - set(names))
        if missing or unknown:
            raise ValueError(f"invalid call {data!r}: missing {missing or 'nothing'}, unknown {unknown or 'nothing'}")
        for name, choices in _CHOICES.items():
            if data[name] not in choices:
                raise ValueError(f"invalid call {data!r}: {name} must be one of {', '.join(choices)}")
        window = data["window"]
        if not isinstance(window, tuple | list) or len(window) != 2:
            raise ValueError(f"invalid call {data!r}: window must be two integers")
        return cls(**{**data, "window": (int(window[0]), int(window[1]))})
