"""What a recipe region may hold: the one definition domain/region.py's Region.parse applies, so the client
(store.recipes.load_lazy: a region's guards when its file is read, the rest before the region is first used) and
the server (store.recipes.check_file, at upload: all of every region) both do. Pure; no torch.

A recipe file comes from a build host or a server and is replayed by every lean process, so it is data, never
code: a torch op only from ATEN_OPS (what FA4's host path issues), a dtype or torch name only from
DTYPES / TORCH_NAMES, size expressions checked by symexpr.check (known ops, bounded
integers and exponents, bounded nesting), every slot and kernel index within the region, every count bounded.
Anything else is refused with ValueError naming where it is.
"""

from __future__ import annotations

import functools
import math
import re
from typing import Any

from . import symexpr
from .calls import Call

RECIPE_FORMAT = 3
# Format 1 (the first builds) held head counts as constants and its file's key named them. Format 2 holds
# the KV head count as a size (HEADS; the query heads are the signature's GQA ratio times it), so FA4's choices
# on head counts are guards like those on lengths, and its file's key names the GQA ratio only
# (store.recipes.recipe_key). Format 3 holds the other values FA4 passes to its kernels at run time
# as sizes too: a paged call's page size (PAGE_SIZE) and a local window's sides (WINDOW); FA4's compile key names
# neither (only `page_table is not None`, `window_size_left is not None`, ... and what its host code derives from
# them, e.g. `paged_kv_tma = page_size == tile_n`, which become guards), so its file's key names neither. The
# lean runtime reads all three.
FORMATS = (1, 2, 3)
HEADS = "heads_kv"
PAGE_SIZE = "page_size"
WINDOW = ("window_left", "window_right")
# What FA4's host path issues between its kernel launches, as the recorder's dispatch mode sees it
# (a recipe file is data, never a way to reach any other torch op). The first five are every op in about 5,000
# regions recorded on the h200 and the b200 (dense, varlen, seqused, paged; every pass, mask, sink, split and
# head dim); the last five are FA4's forward on empty inputs (`out.zero_()`, `lse.fill_(-inf)`,
# `lse.copy_(learnable_sink[:, None])`). recipe_format.check_region refuses a file naming any other.
ATEN_OPS = frozenset({
    "aten.empty.memory_format", "aten.empty_like.default", "aten.zeros.default", "aten.detach.default",
    "aten.transpose.int",
    "aten.zero_.default", "aten.fill_.Scalar", "aten.copy_.default", "aten.slice.Tensor", "aten.unsqueeze.default",
})
DTYPES = frozenset({"bfloat16", "float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"})
TORCH_NAMES = frozenset({"contiguous_format", "preserve_format", "strided"})  # memory formats and layouts
SIZE_NAMES = {
    "dense": ("batch", "seqlen_q", "seqlen_k"),
    "varlen": ("batch", "total_q", "total_k", "max_seqlen_q", "max_seqlen_k"),
    # q, k, v as dense plus seqused_k; max_seqlen_q/k as FA4 takes them (None means seqlen_q / seqlen_k)
    "seqused": ("batch", "seqlen_q", "seqlen_k", "max_seqlen_q", "max_seqlen_k"),
    # dense q, k and v as (num_pages, page_size, heads, dim) pools, page_table (batch, pages_per_seq), seqused_k;
    # the page size is a size of format 3 (PAGE_SIZE); max_seqlen_k None means pages_per_seq * page_size
    "paged": ("batch", "seqlen_q", "num_pages", "pages_per_seq", "max_seqlen_q", "max_seqlen_k"),
}


def size_names(layout: str, fmt: int = RECIPE_FORMAT) -> tuple[str, ...]:
    """The sizes a region of `layout` recorded in format `fmt` is a function of (KeyError for a layout without
    recipes)."""
    bound = (((PAGE_SIZE,) if layout == "paged" else ()) + WINDOW) if fmt >= 3 else ()
    return SIZE_NAMES[layout] + ((HEADS,) if fmt >= 2 else ()) + bound


def bound_sizes(sig: Any) -> dict[str, int]:
    """The sizes of a format-3 region that a call's signature (or Call) fixes: its KV head count, a paged call's
    page size and a local window's sides. A call passes them with its lengths; the recorder records them as
    symbols, so a region holds at every value where FA4 makes the same choices."""
    found = {HEADS: sig.heads_kv}
    if sig.layout == "paged":
        found[PAGE_SIZE] = sig.page_size
    if sig.mask == "local":
        found.update(zip(WINDOW, map(int, sig.window), strict=True))
    return found


def sizes_of_call(layout: str, batch: int, seqlen_q: int, seqlen_k: int, page_size: int = 0) -> dict[str, int]:
    """The recipe sizes of a Call (varlen: every sequence at the max length, as the planner's calls are;
    paged: a pool of exactly the pages the batch needs, as the planner's calls have)."""
    if layout == "dense":
        return {"batch": batch, "seqlen_q": seqlen_q, "seqlen_k": seqlen_k}
    if layout == "seqused":
        return {"batch": batch, "seqlen_q": seqlen_q, "seqlen_k": seqlen_k, "max_seqlen_q": seqlen_q,
                "max_seqlen_k": seqlen_k}
    if layout == "paged":
        if page_size <= 0:
            raise ValueError("a paged call needs its page_size")
        pages = -(-seqlen_k // page_size)
        return {"batch": batch, "seqlen_q": seqlen_q, "num_pages": batch * pages, "pages_per_seq": pages,
                "max_seqlen_q": seqlen_q, "max_seqlen_k": pages * page_size}
    return {"batch": batch, "total_q": batch * seqlen_q, "total_k": batch * seqlen_k,
            "max_seqlen_q": seqlen_q, "max_seqlen_k": seqlen_k}


def call_sizes(call: Call) -> dict[str, int]:
    """The sizes of `call` that a region's guards read: sizes_of_call's with those its signature fixes
    (bound_sizes)."""
    return {**sizes_of_call(call.layout, call.batch, call.seqlen_q, call.seqlen_k, call.page_size),
            **bound_sizes(call)}


REQUIRED = frozenset({"format", "signature", "guards", "inputs", "tensors", "meta", "fwd", "bwd", "outputs",
                      "kernels", "softmax_scale"})
OPTIONAL = frozenset({"recorded_at", "toolchain"})  # written by the recorder, read by builds only
_FIELDS = REQUIRED | OPTIONAL
INPUTS = frozenset({"q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "seqused_k", "page_table", "learnable_sink",
                    "dout"})
OUTPUTS = frozenset({"out", "lse", "dq", "dk", "dv", "dsink"})
KWARGS = frozenset({"dtype", "device", "pin_memory", "layout", "memory_format", "non_blocking"})
# Far above what FA4 records (at most 50 tensors, 53 steps, 22 guards and 10 kernels a region in the survey above)
MAX_TENSORS, MAX_STEPS, MAX_GUARDS, MAX_KERNELS, MAX_OUTS, MAX_NESTING = 1024, 4096, 4096, 256, 8, 8
_HEX64 = re.compile(r"[0-9a-f]{64}")
_LAUNCH, _OP = frozenset({"launch", "args"}), frozenset({"op", "args", "kwargs", "out", "tuple"})  # a step's fields


# check_region's memo: id -> (the object, held so that its id is no other's; the highest tensor slot and kernel
# index it names)
Admitted = dict[int, tuple[Any, int, int]]


def check_region(region: Any, memo: dict[frozenset[str], Admitted] | None = None) -> None:
    """ValueError unless `region` is a recipe region of a format in FORMATS holding only what FA4's host
    path does (its size expressions over size_names of its layout and format). `memo` (one per document, kept only
    while the document lives) holds, per size names, the guard, meta, kernel and step objects (and lists of them)
    already admitted, by id, with the highest tensor slot and kernel index each names; those are only compared
    with the region's counts. A compact file's regions share each distinct value and list (domain/recipe_file.py),
    so a file costs a check per distinct one, not per region."""
    layout, values = _header(region)
    tensors = _count(region["tensors"], MAX_TENSORS, "tensors")
    kernels = len(_list(region["kernels"], MAX_KERNELS, "kernels"))
    seen = (memo if memo is not None else {}).setdefault(values.names, {})
    _admit(seen, values, lambda g: symexpr.check(g, values.names), _list(region["guards"], MAX_GUARDS, "guards"))
    if len(_list(region["meta"], MAX_TENSORS, "meta")) != tensors:
        raise ValueError(f"meta describes {len(region['meta'])} tensors, not {tensors}")
    named = [_admit(seen, values, values.meta, region["meta"]), _admit(seen, values, _kernel, region["kernels"]),
             _admit(seen, values, values.step, _list(region["fwd"], MAX_STEPS, "fwd")),
             _admit(seen, values, values.step, _list(region["bwd"], MAX_STEPS, "bwd"))]
    values.top_slot = values.top_kernel = -1
    for where, known in (("inputs", INPUTS), ("outputs", OUTPUTS)):
        _slots_by_name(region[where], known, values, where)
    named.append((values.top_slot, values.top_kernel))
    _within(max(n[0] for n in named), tensors, max(n[1] for n in named), kernels)
    _runnable(region, layout)
    _number(region["softmax_scale"], "softmax_scale")
    _flat(region.get("recorded_at", {}), int, "recorded_at")
    _admit(seen, values, lambda t: _flat(t, str, "toolchain"), [region.get("toolchain", {})])  # shared in a file


def check_guards(region: Any, memo: dict[frozenset[str], Admitted] | None = None) -> None:
    """ValueError unless `region`'s guards may be evaluated: its fields, format and layout as check_region admits
    them and every guard a size expression symexpr.check admits over its size names (bounded literals, operand
    counts and nesting). A part of check_region (which `memo` spares the guards' check again): what the
    lean runtime checks of every region of a file at first read, before any guard selects one; the rest is checked
    when a call first selects the region (store.recipes.load_lazy). A region it refuses, check_region refuses."""
    _layout, values = _header(region)
    seen = (memo if memo is not None else {}).setdefault(values.names, {})
    _admit(seen, values, lambda g: symexpr.check(g, values.names), _list(region["guards"], MAX_GUARDS, "guards"))


def _header(region: Any) -> tuple[str, _Values]:
    """(layout, its size names' checker) of a region whose fields, format and layout are admitted; ValueError
    otherwise."""
    if not isinstance(region, dict):
        raise ValueError("not an object")
    fields = region.keys()
    if not (fields >= REQUIRED and fields <= _FIELDS):  # the set comparisons alone when all is well (each region)
        missing, extra = sorted(REQUIRED - set(region)), sorted(set(region) - _FIELDS)
        if missing:
            raise ValueError(f"fields missing: {', '.join(missing)}")
        raise ValueError(f"unknown fields: {', '.join(str(e)[:40] for e in extra[:5])}")
    fmt, signature = region["format"], region["signature"]
    if fmt not in FORMATS or isinstance(fmt, bool):
        raise ValueError(f"format {str(fmt)[:20]} (this fa4-aot reads formats {', '.join(map(str, FORMATS))})")
    layout = signature.get("layout") if isinstance(signature, dict) else None
    if layout not in SIZE_NAMES:
        raise ValueError(f"signature of layout {str(layout)[:40]!r} (recipes exist for {', '.join(SIZE_NAMES)})")
    return layout, _Values(_names(layout, fmt))


@functools.cache
def _names(layout: str, fmt: int) -> frozenset[str]:
    """size_names as one frozenset per layout and format (its hash is computed once: check_region's memo key)."""
    return frozenset(size_names(layout, fmt))


def _admit(seen: Admitted, values: _Values, check: Any, xs: list[Any]) -> tuple[int, int]:
    """(highest tensor slot, highest kernel index) the objects of `xs` name (-1: none), each checked by `check`
    unless `seen` holds it already; the list itself is remembered too. `seen` holds each object it names, so that
    no id in it is ever another object's: a list made for one call and freed (CPython gives its memory to the next
    list made, such as a region a compact file unpacks later) admitted that later list unchecked."""
    found = seen.get(id(xs))
    if found is None or found[0] is not xs:
        top_slot = top_kernel = -1
        for x in xs:
            named = seen.get(id(x))
            if named is None or named[0] is not x:
                values.top_slot = values.top_kernel = -1
                check(x)
                named = seen[id(x)] = (x, values.top_slot, values.top_kernel)
            if named[1] > top_slot:  # comparisons, not max(): this loop runs for every guard of every region
                top_slot = named[1]
            if named[2] > top_kernel:
                top_kernel = named[2]
        found = seen[id(xs)] = (xs, top_slot, top_kernel)
    return found[1], found[2]


def _within(top_slot: int, tensors: int, top_kernel: int, kernels: int) -> None:
    if top_slot >= tensors:
        raise ValueError(f"tensor slot {top_slot} is not one of the region's {tensors}")
    if top_kernel >= kernels:
        raise ValueError(f"launch of kernel {top_kernel}, not one of the region's {kernels}")


class _Values:
    """Checks arguments over size names `names`, noting the highest tensor slot and kernel index they name (a
    region's counts bound those: check_region)."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names
        self.top_slot = self.top_kernel = -1

    def slot(self, x: Any) -> None:
        if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < MAX_TENSORS:
            raise ValueError(f"tensor slot {str(x)[:20]} is not one of a region's at most {MAX_TENSORS}")
        self.top_slot = max(self.top_slot, x)

    def meta(self, meta: Any) -> None:
        if not isinstance(meta, list) or len(meta) != 3 or not all(isinstance(m, list) for m in meta[:2]):
            raise ValueError("a tensor's meta is not [shape, stride, dtype]")
        self.value(meta[:2])
        if not (isinstance(meta[2], dict) and set(meta[2]) == {"dtype"}):
            raise ValueError("a tensor's meta has no dtype")
        self.value(meta[2])

    def step(self, step: Any) -> None:
        if isinstance(step, dict) and step.keys() == _LAUNCH:
            if isinstance(step["launch"], bool) or not isinstance(step["launch"], int) \
                    or not 0 <= step["launch"] < MAX_KERNELS:
                raise ValueError(f"launch of kernel {str(step['launch'])[:20]}, not one of a region's at most "
                                 f"{MAX_KERNELS}")
            self.top_kernel = max(self.top_kernel, step["launch"])
        elif isinstance(step, dict) and step.keys() == _OP:
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
        kind = type(x)  # the kinds a recipe's arguments are made of first, by exact type (each argument of a region)
        if kind is int and -symexpr.MAX_MAGNITUDE <= x <= symexpr.MAX_MAGNITUDE:  # what symexpr.check admits
            return
        if depth < MAX_NESTING:
            if kind is list:
                for y in x:
                    self.value(y, depth + 1)
                return
            if kind is dict and len(x) == 1:
                ((tag, v),) = x.items()
                if tag == "t" and type(v) is int and 0 <= v < MAX_TENSORS:  # what slot() admits
                    if v > self.top_slot:
                        self.top_slot = v
                    return
                self._tagged(tag, v, depth)
                return
        self._value(x, depth)

    def _value(self, x: Any, depth: int) -> None:
        """value() of what its exact types above did not take (each refusal raised here)."""
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
        elif not (tag == "dtype" and isinstance(v, str) and v in DTYPES
                  or tag == "torch" and isinstance(v, str) and v in TORCH_NAMES
                  or tag == "in" and v == "softmax_scale" or tag == "device" and v is True):
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


# The tensors the lean runtime hands a region of each layout by name (runtime/call_args.py), besides q, k, v
LAYOUT_INPUTS = {"dense": (), "varlen": ("cu_seqlens_q", "cu_seqlens_k"), "seqused": ("seqused_k",),
                 "paged": ("seqused_k", "page_table")}
GRADS = ("dq", "dk", "dv")  # what the backward returns for q, k, v (and dsink for a learnable sink)


def _runnable(region: dict[str, Any], layout: str) -> None:
    """ValueError unless replay.bind and the runtime's forward and backward find every slot they read by name
    (a region without `out` or `lse`, or a backward without `dout` or dq, passed the format and
    ended in a KeyError inside the runtime)."""
    inputs, outputs = region["inputs"], region["outputs"]
    sink = isinstance(region["signature"], dict) and region["signature"].get("sink") is True
    for name in ("q", "k", "v", *LAYOUT_INPUTS[layout], *(("learnable_sink",) if sink else ())):
        if name not in inputs:
            raise ValueError(f"inputs name no {name!r}, which the runtime passes a {layout} region"
                             f"{' of a sink signature' if name == 'learnable_sink' else ''}")
    if outputs.get("out") is None:
        raise ValueError("outputs name no 'out' slot, the attention output every call returns")
    if "lse" not in outputs:
        raise ValueError("outputs name no 'lse' (null when FA4 makes none)")
    if not region["bwd"]:
        return
    if "dout" not in inputs:
        raise ValueError("backward steps but no 'dout' input for them to read")
    for name in GRADS + (("dsink",) if "learnable_sink" in inputs else ()):
        if outputs.get(name) is None:
            raise ValueError(f"backward steps but no {name!r} output for the gradient they return")


def _kernel(kernel: Any) -> None:
    if not (isinstance(kernel, dict) and set(kernel) == {"family", "compile_key", "kernel_key"}
            and isinstance(kernel["family"], str) and isinstance(kernel["kernel_key"], str)
            and _HEX64.fullmatch(kernel["kernel_key"])):
        raise ValueError("a kernel is not {family, compile_key, kernel_key}")
