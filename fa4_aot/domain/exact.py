"""The exact arguments of one FlashAttention-4 call, as bounded JSON: what a client's miss carries so that `fa4-aot
build --from-misses` replays that very call and compiles exactly the kernels it asked for.

A Call (calls.py) summarises a call in a few numbers (batch, max lengths, a layout), and FA4 chooses kernels from
more than that: the total of packed varlen tokens against batch x max length, max_seqlen_k against the page table,
strides and pointer alignment, which of the optional tensors are given. A record keeps what FA4's host code reads:
which entry ran (FlashAttnFunc or FlashAttnVarlenFunc; with `backward` when the kernel was missed in its backward),
every tensor argument as shape, stride, dtype, whether it requires grad and its storage offset modulo 256 bytes (the
pointer alignment FA4 checks), a tensor passed twice as the same object, and every other argument verbatim (JSON
lists for tuples). Integer metadata (cu_seqlens, seqused, page_table) is kept as its shape: FA4's host code never
reads its values (they stay on the device, and planning on fake tensors could not see them either).

    {"format": 1, "entry": "FlashAttnVarlenFunc",
     "forward": {"q": {"tensor": "bfloat16", "shape": [1300, 12, 128], "stride": [1536, 128, 1], "offset": 0,
                       "grad": true}, "k": ..., "v": {"same_as": "k"}, "causal": true, "max_seqlen_q": 1000},
     "backward": {"dout": {"tensor": ...}, "dlse": null}}

Pure: checking records (the client, the build and the service share `check`). Describing real tensors and replaying
a record on fake ones is the FA4 seam's (fa4_aot/fa4/exact_replay.py).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from .calls import Call

FORMAT = 1
ENTRIES = ("FlashAttnFunc", "FlashAttnVarlenFunc")
DTYPES = ("bfloat16", "float16", "float32", "float8_e4m3fn", "float8_e5m2", "int32", "int64")
BACKWARD_ARGS = ("dout", "dlse")
MAX_CHARS = 16 << 10  # as compact JSON; a real record is under 2 KiB
MAX_ARGS = 64
MAX_DIMS = 8
MAX_EXTENT = 1 << 48  # elements a tensor's storage spans (fake tensors allocate nothing, but torch counts in int64)
MAX_TEXT = 256
ALIGN_BYTES = 256  # offsets are kept modulo this: FA4 checks 4 to 32-byte alignment of pointers
_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,63}$")


def check(doc: Any) -> dict[str, Any]:
    """`doc` if it is a well-formed record, else ValueError saying which part is wrong."""
    if not isinstance(doc, dict) or set(doc) != {"format", "entry", "forward", "backward"}:
        raise ValueError("a call record is an object with exactly format, entry, forward and backward")
    if doc["format"] != FORMAT:
        raise ValueError(f"call record format {doc['format']!r} is not {FORMAT}; this fa4-aot reads format {FORMAT}")
    if doc["entry"] not in ENTRIES:
        raise ValueError(f"call record entry must be one of {', '.join(ENTRIES)}")
    _arguments(doc["forward"], "forward")
    if doc["backward"] is not None:
        if not isinstance(doc["backward"], dict) or set(doc["backward"]) != set(BACKWARD_ARGS):
            raise ValueError("a call record's backward is null or an object with exactly dout and dlse")
        _arguments(doc["backward"], "backward")
    if len(json.dumps(doc, separators=(",", ":"))) > MAX_CHARS:
        raise ValueError(f"call record longer than {MAX_CHARS} characters as JSON")
    return doc


def _arguments(args: Any, where: str) -> None:
    if not isinstance(args, dict) or len(args) > MAX_ARGS:
        raise ValueError(f"a call record's {where} is an object of at most {MAX_ARGS} arguments")
    tensors = tuple(n for n, v in args.items() if isinstance(v, dict) and "tensor" in v)
    for name, value in args.items():
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"a call record's {where} has an invalid argument name {str(name)[:80]!r}")
        _value(value, f"{where}.{name}", tensors, depth=0)


def _value(value: Any, where: str, tensors: tuple[str, ...], depth: int) -> None:
    if value is None or isinstance(value, bool | int):
        return
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"{where}: a call record holds finite numbers only")
        return
    if isinstance(value, str):
        if len(value) > MAX_TEXT:
            raise ValueError(f"{where}: text longer than {MAX_TEXT} characters")
        return
    if isinstance(value, list):
        if depth >= 2 or len(value) > MAX_ARGS:
            raise ValueError(f"{where}: lists nest at most 2 deep and hold at most {MAX_ARGS} items")
        for i, item in enumerate(value):
            _value(item, f"{where}[{i}]", (), depth + 1)
        return
    if isinstance(value, dict) and set(value) == {"same_as"}:
        if value["same_as"] not in tensors:
            raise ValueError(f"{where}: same_as must name another argument of the same call given as a tensor")
        return
    if isinstance(value, dict) and "tensor" in value:
        _tensor(value, where)
        return
    raise ValueError(f"{where}: expected null, a boolean, a number, text, a list, a tensor or same_as")


def _tensor(spec: dict[str, Any], where: str) -> None:
    if set(spec) != {"tensor", "shape", "stride", "offset", "grad"} or spec["tensor"] not in DTYPES:
        raise ValueError(f"{where}: a tensor is {{tensor: dtype ({', '.join(DTYPES)}), shape, stride, offset, grad}}")
    shape, stride, offset = spec["shape"], spec["stride"], spec["offset"]
    if not (_ints(shape, 0, 1 << 31) and _ints(stride, 0, MAX_EXTENT) and len(shape) == len(stride) <= MAX_DIMS):
        raise ValueError(f"{where}: shape and stride are lists of at most {MAX_DIMS} non-negative integers, "
                         "of equal length")
    if not _ints([offset], 0, ALIGN_BYTES) or not isinstance(spec["grad"], bool):
        raise ValueError(f"{where}: offset is an integer in [0, {ALIGN_BYTES}) and grad a boolean")
    if offset + sum((n - 1) * s for n, s in zip(shape, stride, strict=True) if n) >= MAX_EXTENT:
        raise ValueError(f"{where}: the tensor spans more than {MAX_EXTENT} elements")


def _ints(values: Any, low: int, high: int) -> bool:
    return isinstance(values, list) and all(
        isinstance(v, int) and not isinstance(v, bool) and low <= v < high for v in values)


@dataclass(frozen=True)
class ExactCall:
    """A checked record (canonical JSON, so equal records dedupe) and the Call the client summarised it as, if
    any (for descriptions and the lean runtime's recipes)."""

    record: str
    call: Call | None = None

    @classmethod
    def from_dict(cls, doc: Any, call: Call | None = None) -> ExactCall:
        """Raises ValueError as check() does."""
        return cls(json.dumps(check(doc), sort_keys=True, separators=(",", ":")), call)

    def to_dict(self) -> dict[str, Any]:
        return dict(json.loads(self.record))

    @property
    def training(self) -> bool:
        return self.to_dict()["backward"] is not None

    def describe(self) -> str:
        doc = self.to_dict()
        shapes = [f"{n}={'x'.join(map(str, v['shape']))}" for n in ("q", "k", "v")
                  if isinstance(v := doc["forward"].get(n), dict) and "shape" in v]
        what = self.call.describe() if self.call else " ".join([doc["entry"], *shapes])
        return f"{what} [exact{' fwd+bwd' if doc['backward'] is not None else ''}]"
