"""A recipe region as typed values: what fa4/record.py records, a recipe file holds (store/recipes.py) and the lean
runtime replays (runtime/replay.py). Pure; no torch.

A region is FA4's per-call host work for one signature over one region of sizes: `guards` (symexpr conditions on
the sizes under which FA4 makes exactly these choices), `inputs` and `outputs` (names to tensor slots), `meta`
(each slot's shape, stride and dtype as FA4 makes it), forward and backward `Step`s, and the `kernels` the steps
launch, in first-launch order. A step is an `Op` (a torch op FA4 issues: an allocation, a fill, a view) or a
`Launch` of one of the kernels. Arguments stay in their recorded form, a JSON tree whose tagged leaves are
{"t": slot}, {"e": size expression}, {"f": float}, {"in": "softmax_scale"}, {"dtype": name}, {"torch": name},
{"device": true} and {"kw": {name: argument}}; runtime/replay.py turns them into values once per sizes.

`Region.parse` admits only what domain/recipe_format.py's check admits (a file is data from another host, never
code; `lazy_regions` admits a file's guards at once and each region's rest at its first use) and `Region.to_json`
writes back exactly the document it was parsed from, so recipe files, and the keys naming them, are the same
whichever side wrote them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from . import symexpr
from .recipe_file import Packed
from .recipe_format import Admitted, check_guards, check_region

Arg = Any  # a recorded argument: None, a bool, an int, a list of arguments, or one tagged object (see above)


class KernelUse(NamedTuple):
    """A kernel a region launches: FA4's compile-cache family, its compile key (canonical JSON) and kernel key."""

    family: str
    compile_key: Any
    kernel_key: str


class TensorMeta(NamedTuple):
    """A tensor slot as FA4 makes it: shape and stride (arguments: sizes may be expressions) and dtype name."""

    shape: list[Arg]
    stride: list[Arg]
    dtype: str


@dataclass(frozen=True)
class Op:
    """A torch op FA4's host path issues (an aten overload in recipe_format.ATEN_OPS); its results go to the
    slots `out` (None: a result nothing reads), unpacked when the op returns a tuple."""

    op: str
    args: list[Arg]
    kwargs: dict[str, Arg]  # keyword arguments by name
    out: list[int | None]
    returns_tuple: bool


@dataclass(frozen=True)
class Launch:
    """A call of kernel number `kernel` (an index into Region.kernels) with FA4's arguments."""

    kernel: int
    args: list[Arg]


Step = Op | Launch


@dataclass(frozen=True)
class Region:
    """One recorded region (see the module docstring). Build one with `parse`; `to_json` is its file form."""

    format: int
    signature: dict[str, Any]  # as Signature.to_dict writes it
    guards: list[Any]
    inputs: dict[str, int]
    tensors: int
    meta: tuple[TensorMeta, ...]
    fwd: tuple[Step, ...]
    bwd: tuple[Step, ...]
    outputs: dict[str, int | None]
    kernels: tuple[KernelUse, ...]
    softmax_scale: float
    recorded_at: dict[str, int] | None = None  # the sizes it was recorded at (None: the file does not say)
    toolchain: dict[str, str] | None = None  # what recorded it (a build replaces other toolchains' regions)

    @classmethod
    def parse(cls, doc: Any, shared: _Shared | None = None) -> Region:
        """The region a recipe document holds; ValueError naming what recipe_format refuses in it. `shared` (one
        per document: parse_regions) checks and builds each step, meta and kernel object the document's regions
        share once (a compact file's regions share every repeated one: domain/recipe_file.py)."""
        shared = shared if shared is not None else _Shared()
        check_region(doc, shared.checked)
        values = shared.values
        return cls(
            format=doc["format"], signature=doc["signature"], guards=doc["guards"], inputs=doc["inputs"],
            tensors=doc["tensors"], meta=values(_meta, doc["meta"]),
            fwd=values(_step, doc["fwd"]), bwd=values(_step, doc["bwd"]),
            outputs=doc["outputs"], kernels=values(_kernel, doc["kernels"]),
            softmax_scale=doc["softmax_scale"], recorded_at=doc.get("recorded_at"),
            toolchain=doc.get("toolchain"))

    def to_json(self) -> dict[str, Any]:
        """The recipe document: Region.parse(r.to_json()) == r, and a parsed document comes back as it was."""
        doc = {
            "format": self.format, "signature": self.signature, "guards": self.guards, "inputs": self.inputs,
            "tensors": self.tensors, "meta": [[m.shape, m.stride, {"dtype": m.dtype}] for m in self.meta],
            "fwd": [_step_json(s) for s in self.fwd], "bwd": [_step_json(s) for s in self.bwd],
            "outputs": self.outputs, "kernels": [k._asdict() for k in self.kernels],
            "softmax_scale": self.softmax_scale,
        }
        doc.update({name: value for name, value in (("recorded_at", self.recorded_at),
                                                    ("toolchain", self.toolchain)) if value is not None})
        return doc

    def holds(self, sizes: Mapping[str, int]) -> bool:
        """Whether FA4 makes this region's choices at `sizes` (every guard holds)."""
        return symexpr.holds(self.guards, sizes)

    def forward_part(self) -> Region:
        """A training region as the forward-only region it contains: its forward steps, inputs and outputs (out,
        lse); what the backward reads or makes is left out. Only for calls whose forward FA4 runs exactly as
        training's (store.recipes.sources says which)."""
        return dataclasses.replace(self, bwd=(), inputs={n: s for n, s in self.inputs.items() if n != "dout"},
                                   outputs={"out": self.outputs["out"], "lse": self.outputs["lse"]})

    def launched(self, steps: tuple[Step, ...]) -> list[int]:
        """The indices into `kernels` of those `steps` (self.fwd, self.bwd) launch, each once, in launch order: a
        pass's kernels, which the lean runtime loads at that pass's first call (runtime/runner.py)."""
        return list(dict.fromkeys(s.kernel for s in steps if isinstance(s, Launch)))

    def saved_slots(self) -> list[int]:
        """The forward's slots that the backward's steps read: inputs, out, lse and whatever else FA4 kept (what
        autograd saves between the passes)."""
        if not self.bwd:
            return []
        made = {s for step in self.bwd if isinstance(step, Op) for s in step.out if s is not None}
        made.add(self.inputs["dout"])
        read = _slots_in([[step.args, step.kwargs] if isinstance(step, Op) else step.args for step in self.bwd])
        return sorted(read - made)


def parse_regions(regions: Any) -> list[Region]:
    """The regions of a recipe file's "regions" list; ValueError naming the first one recipe_format refuses."""
    if not isinstance(regions, list):
        raise ValueError("recipe regions are not a list")
    found, shared = [], _Shared()
    for i, region in enumerate(regions):
        try:
            found.append(Region.parse(region, shared))
        except ValueError as e:
            raise ValueError(f"region {i}: {e}") from None
    return found


def lazy_regions(regions: Any) -> list[LazyRegion]:
    """The regions of a recipe file's "regions" list (region documents, or a compact file's regions as
    recipe_file.read leaves them packed), each checked by recipe_format as far as its guards (check_guards: they
    may be evaluated) and the rest, unpacked then, at its first `LazyRegion.region()`. ValueError, as
    parse_regions raises it, when a region's guards are refused (so is the whole file: no guard can be trusted to
    tell its regions apart). The regions share one parse (_Shared): a value checked for one is not checked again."""
    if not isinstance(regions, list):
        raise ValueError("recipe regions are not a list")
    packed = [r if isinstance(r, Packed) else Packed(r) for r in regions]
    found, shared = [], _Shared()
    for i, region in enumerate(packed):
        try:
            check_guards(region.head, shared.checked)
        except ValueError:
            # parse_regions's error: the first region refused, checked in its order
            parse_regions([r.document() for r in packed[:i + 1]])
            raise  # not reached: check_region refuses what check_guards refuses
        found.append(LazyRegion(region, shared, i))
    return found


class LazyRegion:
    """A region of a recipe document whose guards recipe_format admitted (lazy_regions); `region()` unpacks and
    checks the rest and builds the Region once, at its first use."""

    __slots__ = ("guards", "_packed", "_shared", "_index", "_region")

    def __init__(self, packed: Packed, shared: _Shared, index: int) -> None:
        self.guards: list[Any] = packed.head["guards"]
        self._packed, self._shared, self._index = packed, shared, index
        self._region: Region | None = None

    def region(self) -> Region:
        """The Region (the same object every time); each time it is asked for, recipe_file.Unreadable as
        recipe_file.decode names a field whose index is outside its table, or ValueError naming the region and
        what recipe_format refuses in it, as parse_regions names it."""
        found = self._region
        if found is None:
            doc = self._packed.document()
            try:
                found = Region.parse(doc, self._shared)
            except ValueError as e:
                raise ValueError(f"region {self._index}: {e}") from None
            self._region = found
        return found


class _Shared:
    """What parsing one document's regions shares: the objects recipe_format admitted (check_region's memo) and
    the typed value built from each document object, both by the object's id, each holding its object (an id of a
    freed object is the next one's: a compact file's region is unpacked when first selected, after other regions
    were checked)."""

    def __init__(self) -> None:
        self.checked: dict[frozenset[str], Admitted] = {}
        self.built: dict[int, tuple[Any, Any]] = {}  # id -> (the document object, held: its id is no other's; value)

    def value(self, build: Any, doc: Any) -> Any:
        found = self.built.get(id(doc))
        if found is None or found[0] is not doc:
            found = self.built[id(doc)] = (doc, build(doc))
        return found[1]

    def values(self, build: Any, docs: list[Any]) -> tuple[Any, ...]:
        """The typed values of a list of documents (one tuple per list object: regions share lists too)."""
        found = self.built.get(id(docs))
        if found is None or found[0] is not docs:
            found = self.built[id(docs)] = (docs, tuple(self.value(build, d) for d in docs))
        return found[1]


def _meta(doc: list[Any]) -> TensorMeta:
    return TensorMeta(doc[0], doc[1], doc[2]["dtype"])


def _kernel(doc: Mapping[str, Any]) -> KernelUse:
    return KernelUse(**doc)


def _slots_in(args: Arg) -> set[int]:
    """The tensor slots an argument tree names ({"t": slot} leaves); a walk with a stack, not a set per node."""
    found: set[int] = set()
    stack = [args]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            if len(x) == 1 and "t" in x:
                found.add(x["t"])
            else:
                stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
    return found


def _step(doc: Mapping[str, Any]) -> Step:
    if "launch" in doc:
        return Launch(doc["launch"], doc["args"])
    return Op(doc["op"], doc["args"], doc["kwargs"]["kw"], doc["out"], doc["tuple"])


def _step_json(step: Step) -> dict[str, Any]:
    if isinstance(step, Launch):
        return {"launch": step.kernel, "args": step.args}
    return {"op": step.op, "args": step.args, "kwargs": {"kw": step.kwargs}, "out": step.out,
            "tuple": step.returns_tuple}
