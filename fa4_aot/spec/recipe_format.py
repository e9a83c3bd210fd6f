"""What a recipe region may hold: the one definition the client (store.recipes.load, before a region is used) and
the server (store.recipes.check_file, at upload) both apply. Pure; no torch.

A recipe file comes from a build host or a server and is replayed by every lean process, so it is data, never
code (issue 18, D26): a torch op only from runtime.replay.ATEN_OPS (what FA4's host path issues), a dtype or torch name
only from runtime.replay's DTYPES / TORCH_NAMES, size expressions checked by symexpr.check (known ops, bounded
integers and exponents, bounded nesting), every slot and kernel index within the region, every count bounded.
Anything else is refused with ValueError naming where it is.
"""

from __future__ import annotations

import math
import re
from typing import Any

from ..runtime.replay import ATEN_OPS, DTYPES, FORMATS, SIZE_NAMES, TORCH_NAMES, size_names
from . import symexpr

REQUIRED = frozenset({"format", "signature", "guards", "inputs", "tensors", "meta", "fwd", "bwd", "outputs",
                      "kernels", "softmax_scale"})
OPTIONAL = frozenset({"recorded_at", "toolchain"})  # written by the recorder, read by builds only
INPUTS = frozenset({"q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "seqused_k", "page_table", "learnable_sink",
                    "dout"})
OUTPUTS = frozenset({"out", "lse", "dq", "dk", "dv", "dsink"})
KWARGS = frozenset({"dtype", "device", "pin_memory", "layout", "memory_format", "non_blocking"})
# Far above what FA4 records (at most 50 tensors, 53 steps, 22 guards and 10 kernels a region in the survey above)
MAX_TENSORS, MAX_STEPS, MAX_GUARDS, MAX_KERNELS, MAX_OUTS, MAX_NESTING = 1024, 4096, 4096, 256, 8, 8
_HEX64 = re.compile(r"[0-9a-f]{64}")


def check_regions(regions: Any) -> None:
    """ValueError unless `regions` is a list of regions each of which check_region admits."""
    if not isinstance(regions, list):
        raise ValueError("recipe regions are not a list")
    for i, region in enumerate(regions):
        try:
            check_region(region)
        except ValueError as e:
            raise ValueError(f"region {i}: {e}") from None


def check_region(region: Any) -> None:
    """ValueError unless `region` is a recipe region of a format in runtime.replay.FORMATS holding only what FA4's host
    path does (its size expressions over runtime.replay.size_names of its layout and format)."""
    if not isinstance(region, dict):
        raise ValueError("not an object")
    missing, extra = sorted(REQUIRED - set(region)), sorted(set(region) - REQUIRED - OPTIONAL)
    if missing:
        raise ValueError(f"fields missing: {', '.join(missing)}")
    if extra:
        raise ValueError(f"unknown fields: {', '.join(str(e)[:40] for e in extra[:5])}")
    if region["format"] not in FORMATS or isinstance(region["format"], bool):
        raise ValueError(f"format {str(region['format'])[:20]} (this fa4-aot reads formats "
                         f"{', '.join(map(str, FORMATS))})")
    layout = region["signature"].get("layout") if isinstance(region["signature"], dict) else None
    if layout not in SIZE_NAMES:
        raise ValueError(f"signature of layout {str(layout)[:40]!r} (recipes exist for {', '.join(SIZE_NAMES)})")
    values = _Values(frozenset(size_names(layout, region["format"])), _count(region["tensors"], MAX_TENSORS, "tensors"),
                     len(_list(region["kernels"], MAX_KERNELS, "kernels")))
    for guard in _list(region["guards"], MAX_GUARDS, "guards"):
        symexpr.check(guard, values.names)
    if len(_list(region["meta"], MAX_TENSORS, "meta")) != values.tensors:
        raise ValueError(f"meta describes {len(region['meta'])} tensors, not {values.tensors}")
    for meta in region["meta"]:
        values.meta(meta)
    for where, known in (("inputs", INPUTS), ("outputs", OUTPUTS)):
        _slots_by_name(region[where], known, values, where)
    for kernel in region["kernels"]:
        _kernel(kernel)
    for step in _list(region["fwd"], MAX_STEPS, "fwd") + _list(region["bwd"], MAX_STEPS, "bwd"):
        values.step(step)
    _number(region["softmax_scale"], "softmax_scale")
    _flat(region.get("recorded_at", {}), int, "recorded_at")
    _flat(region.get("toolchain", {}), str, "toolchain")


class _Values:
    """Checks the arguments of one region: its size names, its tensor count, its kernel count."""

    def __init__(self, names: frozenset[str], tensors: int, kernels: int) -> None:
        self.names, self.tensors, self.kernels = names, tensors, kernels

    def slot(self, x: Any) -> None:
        if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < self.tensors:
            raise ValueError(f"tensor slot {str(x)[:20]} is not one of the region's {self.tensors}")

    def meta(self, meta: Any) -> None:
        if not isinstance(meta, list) or len(meta) != 3 or not all(isinstance(m, list) for m in meta[:2]):
            raise ValueError("a tensor's meta is not [shape, stride, dtype]")
        self.value(meta[:2])
        if not (isinstance(meta[2], dict) and set(meta[2]) == {"dtype"}):
            raise ValueError("a tensor's meta has no dtype")
        self.value(meta[2])

    def step(self, step: Any) -> None:
        if isinstance(step, dict) and set(step) == {"launch", "args"}:
            if isinstance(step["launch"], bool) or not isinstance(step["launch"], int) \
                    or not 0 <= step["launch"] < self.kernels:
                raise ValueError(f"launch of kernel {str(step['launch'])[:20]}, not one of the region's "
                                 f"{self.kernels}")
        elif isinstance(step, dict) and set(step) == {"op", "args", "kwargs", "out", "tuple"}:
            if not isinstance(step["op"], str) or step["op"] not in ATEN_OPS:
                raise ValueError(f"op {str(step['op'])[:80]!r} is not one FA4's host path uses "
                                 f"({', '.join(sorted(ATEN_OPS))})")
            if not (isinstance(step["kwargs"], dict) and set(step["kwargs"]) == {"kw"}):
                raise ValueError(f"{step['op']}: kwargs are not {{'kw': {{...}}}}")
            self.value(step["kwargs"])
            for slot in _list(step["out"], MAX_OUTS, "out") or [0]:
                if slot is not None:
                    self.slot(slot)
            if not isinstance(step["tuple"], bool):
                raise ValueError(f"{step['op']}: tuple is not true or false")
        else:
            raise ValueError(f"a step is neither an op nor a launch: {sorted(step) if isinstance(step, dict) else ''}")
        self.value(_list(step["args"], MAX_STEPS, "args"))

    def value(self, x: Any, depth: int = 0) -> None:
        """An argument as recorded: None, a bool, a bounded int, a list of them, or one tagged object."""
        if x is None or isinstance(x, bool):
            return
        if isinstance(x, int):
            symexpr.check(x, self.names)
            return
        if depth >= MAX_NESTING:
            raise ValueError(f"arguments nested deeper than {MAX_NESTING}")
        if isinstance(x, list):
            for y in x:
                self.value(y, depth + 1)
            return
        if not isinstance(x, dict) or len(x) != 1:
            raise ValueError(f"argument {str(x)[:80]} is not one a recipe may hold")
        ((tag, v),) = x.items()
        self._tagged(tag, v, depth)

    def _tagged(self, tag: str, v: Any, depth: int) -> None:
        if tag == "t":
            self.slot(v)
        elif tag == "e":
            symexpr.check(v, self.names)
        elif tag == "f":
            _number(v, "a float argument")
        elif tag == "kw" and isinstance(v, dict) and set(v) <= KWARGS:
            for y in v.values():
                self.value(y, depth + 1)
        elif not ({"in": v == "softmax_scale", "device": v is True,
                   "dtype": isinstance(v, str) and v in DTYPES,
                   "torch": isinstance(v, str) and v in TORCH_NAMES}.get(tag, False)):
            raise ValueError(f"argument {{{tag[:40]!r}: {str(v)[:80]}}} is not one a recipe may hold")


def _count(x: Any, most: int, what: str) -> int:
    if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x <= most:
        raise ValueError(f"{what} is not a count of at most {most}")
    return x


def _list(x: Any, most: int, what: str) -> list[Any]:
    if not isinstance(x, list) or len(x) > most:
        raise ValueError(f"{what} is not a list of at most {most}")
    return x


def _number(x: Any, what: str) -> None:
    if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x):
        raise ValueError(f"{what} is not a finite number")


def _flat(x: Any, kind: type, what: str) -> None:
    if not isinstance(x, dict) or not all(isinstance(k, str) and isinstance(v, kind) and not isinstance(v, bool)
                                          for k, v in x.items()):
        raise ValueError(f"{what} is not an object of {kind.__name__}s")


def _slots_by_name(x: Any, known: frozenset[str], values: _Values, what: str) -> None:
    if not isinstance(x, dict) or not set(x) <= known:
        raise ValueError(f"{what} names other than {', '.join(sorted(known))}")
    for slot in x.values():
        if slot is not None or what == "inputs":
            values.slot(slot)


def _kernel(kernel: Any) -> None:
    if not (isinstance(kernel, dict) and set(kernel) == {"family", "compile_key", "kernel_key"}
            and isinstance(kernel["family"], str) and isinstance(kernel["kernel_key"], str)
            and _HEX64.fullmatch(kernel["kernel_key"])):
        raise ValueError("a kernel is not {family, compile_key, kernel_key}")
