"""Launch recipes: FA4's per-call host work, recorded by the planner (fa4/record.py), replayed without FA4.

A recipe region (domain/region.py's Region) holds, for one signature and one region of sizes, the guards under which
FA4 makes exactly its choices, its input and output slots, and forward and backward steps: torch ops (Op) and
kernel launches (Launch) whose arguments are recorded JSON with {"t": slot}, {"e": size expression},
{"dtype": name}, {"device": true}, {"in": "softmax_scale"} leaves. `bind()` evaluates every size once per concrete
sizes; `Bound.run` then only allocates and launches, as FA4 would.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..domain import symexpr
from ..domain.recipe_format import ATEN_OPS, DTYPES, TORCH_NAMES
from ..domain.region import Launch, Op, Region, Step
from .heap import young_only


@dataclass
class Bound:
    """A recipe at concrete sizes: step closures that read and write a slot list."""

    fwd: list[Callable[[list[Any]], None]]
    bwd: list[Callable[[list[Any]], None]]  # empty until backward() binds them when bind() deferred them
    region: Region
    saved: list[int]  # forward slots the backward reads (what autograd saves)
    expected: dict[str, tuple[tuple[int, ...], Any]]  # input name -> (shape, torch dtype) FA4 expects at these sizes
    out: int  # the slot of the attention output
    lse: int | None  # the slot of the log-sum-exp (None: FA4 makes none)
    # fwd for inputs none of which requires grad: FA4's detach steps alias their tensor (a detached tensor differs
    # from its input in requires_grad alone, so the kernels receive the same storage, shape, strides and flags)
    plain: list[Callable[[list[Any]], None]] = field(default_factory=list)
    late: Callable[[], list[Callable[[list[Any]], None]]] | None = None  # binds bwd (bind's `backward`), until done

    @property
    def trains(self) -> bool:
        """Whether a call makes an autograd node: the region records backward steps (bound yet or not)."""
        return bool(self.region.bwd)

    def backward(self) -> list[Callable[[list[Any]], None]]:
        """The backward's steps; when bind() deferred them, bound at the first call, which loads the kernels only
        the backward launches: what that raises (KernelMissing, KernelRefused, a library refused) it raises here,
        at the first backward, and again at the next one until binding succeeds."""
        late = self.late
        if late is not None:
            with young_only():  # the backward kernels' loads and bind: no full collection inside (heap.py)
                self.bwd = late()
            self.late = None
        return self.bwd

    def forward(self, tensors: Mapping[str, Any]) -> tuple[Any, Any]:
        """(out, lse) of a forward-only call (no backward steps: nothing for autograd to record) on named inputs,
        with no autograd node: the lean runtime's per-call host path for inference and decode."""
        region = self.region
        slots: list[Any] = [None] * region.tensors
        inputs, grad = region.inputs, False
        for name, t in tensors.items():
            slots[inputs[name]] = t
            grad = grad or t.requires_grad
        for step in self.fwd if grad or not self.plain else self.plain:
            step(slots)
        lse = self.lse
        return slots[self.out], None if lse is None else slots[lse]

    def check(self, tensors: Mapping[str, Any]) -> None:
        """Raise ValueError unless every input has the shape and dtype FA4 asserts, on a CUDA device."""
        expected = self.expected
        for name, t in tensors.items():  # one pass when all is well (each call); the messages below otherwise
            shape, dtype = expected[name]
            if t.shape != shape or t.dtype != dtype or not t.is_cuda:
                break
        else:
            return
        for name, t in tensors.items():
            shape, dtype = self.expected[name]
            if t.shape != shape or t.dtype != dtype:
                raise ValueError(f"{name}: got {tuple(t.shape)} {t.dtype}, expected {shape} {dtype} for these sizes "
                                 "(as FA4 asserts)")
        for name, t in tensors.items():
            if not t.is_cuda:
                raise ValueError(f"{name} is on {t.device}: the kernels need every input on a CUDA device")

    def run(self, steps: list[Callable[[list[Any]], None]], slots: list[Any]) -> None:
        for step in steps:
            step(slots)


def bind(region: Region, sizes: Mapping[str, int], functions: list[Any], device: Any, softmax_scale: float,
         backward: Callable[[], list[Any]] | None = None) -> Bound:
    """Closures for `region`'s steps at `sizes`; `functions[i]` runs kernel i of region.kernels. With `backward`
    (a function giving such a list for the kernels the backward launches), `functions` need hold only those the
    forward launches (None for the others) and the backward's steps are bound at the first Bound.backward(),
    with backward()'s functions: a pass's kernels are loaded when it first runs."""
    value = _Values(sizes, device, softmax_scale)

    def compile_step(step: Step, functions: list[Any] = functions) -> Callable[[list[Any]], None]:
        args = value(step.args)
        if isinstance(step, Launch):
            return _launch(functions[step.kernel], args)
        return _op(_aten(step.op), args, value({"kw": step.kwargs}), step.out, step.returns_tuple)

    def late() -> list[Callable[[list[Any]], None]]:
        assert backward is not None
        loaded = backward()
        return [compile_step(s, loaded) for s in region.bwd]

    expected = {}
    for name, slot in region.inputs.items():
        meta = region.meta[slot]
        expected[name] = (tuple(value(meta.shape)), value({"dtype": meta.dtype}))
    fwd = [compile_step(s) for s in region.fwd]
    plain = [step if (detach := _detach_of(s)) is None else _alias(*detach)
             for s, step in zip(region.fwd, fwd, strict=True)]
    out = region.outputs["out"]
    if out is None:
        raise ValueError("the region names no output slot; rebuild it with this fa4-aot")
    if backward is not None and region.bwd:
        return Bound(fwd, [], region, region.saved_slots(), expected, out, region.outputs["lse"], plain, late)
    return Bound(fwd, [compile_step(s) for s in region.bwd], region, region.saved_slots(), expected, out,
                 region.outputs["lse"], plain)


class _Values:
    """Recorded arguments as values at concrete sizes, on a device, with a softmax scale; {"t": slot} leaves are
    left as they are (resolved per call: _resolver)."""

    def __init__(self, sizes: Mapping[str, int], device: Any, softmax_scale: float) -> None:
        self.sizes, self.device, self.softmax_scale = sizes, device, softmax_scale

    def __call__(self, x: Any) -> Any:
        import torch

        if isinstance(x, list):
            return [self(y) for y in x]
        if not isinstance(x, dict):
            return x
        if "e" in x:
            return symexpr.evaluate(x["e"], self.sizes)
        if "f" in x:
            return x["f"]
        if "in" in x:
            return self.softmax_scale
        if "dtype" in x:
            return getattr(torch, _allowed(x["dtype"], DTYPES, "dtype"))
        if "torch" in x:
            return getattr(torch, _allowed(x["torch"], TORCH_NAMES, "torch name"))
        if "device" in x:
            return self.device
        if "kw" in x:
            return {k: self(v) for k, v in x["kw"].items()}
        return x  # {"t": slot}: resolved per call


def _allowed(name: Any, allowed: frozenset[str], what: str) -> str:
    if not isinstance(name, str) or name not in allowed:
        raise ValueError(f"recipe names {what} {str(name)[:80]!r}, which recipes may not use; rebuild it with "
                         "this fa4-aot")
    return name


def _aten(name: str) -> Any:
    import torch

    namespace, op, overload = _allowed(name, ATEN_OPS, "op").split(".")
    if name in _PUBLIC:  # the same aten op through torch's parsed binding: no boxing of arguments (about 2 us less)
        return getattr(torch, _PUBLIC[name])
    found = getattr(getattr(getattr(torch.ops, namespace), op), overload)
    return getattr(found, "_op", found)  # the dispatcher's callable itself: OpOverload.__call__ only forwards to it


# ops whose torch function takes the overload's arguments as recorded (positional, then keyword) and runs it
_PUBLIC = {"aten.empty.memory_format": "empty", "aten.empty_like.default": "empty_like", "aten.zeros.default": "zeros",
           "aten.detach.default": "detach", "aten.transpose.int": "transpose", "aten.unsqueeze.default": "unsqueeze"}


def _detach_of(step: Step) -> tuple[int, int] | None:
    """(input slot, output slot) when `step` is FA4's detach of one tensor slot into another, else None."""
    if not (isinstance(step, Op) and step.op == "aten.detach.default" and len(step.args) == 1
            and isinstance(step.args[0], dict) and set(step.args[0]) == {"t"} and len(step.out) == 1):
        return None
    out = step.out[0]
    return None if out is None else (int(step.args[0]["t"]), out)


def _alias(slot: int, out: int) -> Callable[[list[Any]], None]:
    """A detach step, for inputs that require no grad: its output slot is its input's tensor."""

    def alias(slots: list[Any]) -> None:
        slots[out] = slots[slot]

    return alias


def _resolver(args: Any) -> Callable[[list[Any]], Any]:
    """A function of the slots that rebuilds `args` with {"t": slot} replaced by the slot's tensor. Constant parts
    are built once; per call only the tensor positions are filled in (this is the whole per-call host work)."""
    if isinstance(args, dict) and set(args) == {"t"}:
        slot = args["t"]

        def ref(slots: list[Any]) -> Any:
            return slots[slot]

        ref.slot = slot  # type: ignore[attr-defined]
        return ref
    if isinstance(args, list | dict):
        keys = list(args) if isinstance(args, dict) else list(range(len(args)))
        parts = {k: _resolver(args[k]) for k in keys}
        fixed = {k: p([]) for k, p in parts.items() if getattr(p, "constant", False)}
        if len(fixed) == len(parts):
            return _constant(tuple(fixed[k] for k in keys) if isinstance(args, list) else fixed)
        refs = [(k, p.slot) for k, p in parts.items() if hasattr(p, "slot")]
        nested = [(k, p) for k, p in parts.items() if k not in fixed and not hasattr(p, "slot")]
        if isinstance(args, dict):
            def fill_dict(slots: list[Any]) -> Any:
                out = dict(fixed)
                for k, slot in refs:
                    out[k] = slots[slot]
                for k, p in nested:
                    out[k] = p(slots)
                return out

            return fill_dict
        template = [fixed.get(k) for k in keys]

        def fill(slots: list[Any]) -> Any:
            out = template.copy()
            for i, slot in refs:
                out[i] = slots[slot]
            for i, p in nested:
                out[i] = p(slots)
            return tuple(out)

        return fill
    return _constant(args)


def _constant(value: Any) -> Callable[[list[Any]], Any]:
    def get(slots: list[Any]) -> Any:
        return value

    get.constant = True  # type: ignore[attr-defined]
    return get


def _launch(fn: Any, args: list[Any]) -> Callable[[list[Any]], None]:
    get = _resolver(args)

    def launch(slots: list[Any]) -> None:
        fn(*get(slots))

    return launch


def _op(fn: Any, args: list[Any], kwargs: dict[str, Any], outs: list[int | None], is_tuple: bool
        ) -> Callable[[list[Any]], None]:
    get_args, get_kwargs = _resolver(args), _resolver(kwargs)

    def op(slots: list[Any]) -> None:
        result = fn(*get_args(slots), **get_kwargs(slots))
        for slot, r in zip(outs, result if is_tuple else (result,), strict=True):
            if slot is not None:
                slots[slot] = r

    return op


def concretize(value: Any, sizes: Mapping[str, int]) -> Any:
    """`value` (steps, arguments) with every size expression evaluated: what FA4 does at exactly `sizes`."""
    if isinstance(value, list):
        return [concretize(v, sizes) for v in value]
    if isinstance(value, dict):
        if set(value) == {"e"}:
            return symexpr.evaluate(value["e"], sizes)
        return {k: concretize(v, sizes) for k, v in value.items()}
    return value
