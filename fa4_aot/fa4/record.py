"""Record FA4's launch recipe for one signature: what FA4's Python does per call, as data.

FA4's FlashAttnFunc / FlashAttnVarlenFunc forward (and backward, for training) run on fake tensors whose
batch and sequence lengths are torch symbols (a ShapeEnv). Every torch op FA4 issues (allocations, zero
fills, views) is traced by a dispatch mode, and every compiled-kernel call it makes is captured by the
compile-cache recorder with its full argument list; sizes in both stay symbolic. The KV head count is a size
too (the query heads are the signature's GQA ratio times it), so every branch FA4 takes on a size or a head
count (tile choice, q_stage, pack_gqa, 2-CTA, split heuristics, the compile key itself) becomes a ShapeEnv
guard: the recipe holds exactly where those guards hold, so replaying it (fa4_aot/runtime/replay.py) is FA4's own
decision.

Run only in a process configured for the target SKU (target.configure), as the build workers are.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..spec.kernel_keys import canonical, dumps, kernel_key
from ..spec.recipe_format import HEADS, RECIPE_FORMAT, SIZE_NAMES, size_names
from ..spec.signature import Signature
from ..spec.skus import Sku
from . import caches, sympy_json
from .dispatch import _Ctx
from .versions import toolchain


class _Session:
    """The tensors seen so far (by identity), the size symbols, and the kernels launched."""

    def __init__(self, env: Any, scale: float, symbolic: bool = True) -> None:
        self.env = env
        self.symbolic = symbolic
        self.scale = scale
        self.names: dict[Any, str] = {}
        self.index: dict[int, int] = {}
        self.keep: list[Any] = []  # keeps every traced tensor alive, so ids are never reused
        self.meta: list[Any] = []  # per slot: [shape, stride, dtype] as FA4 made it
        self.kernels: list[tuple[str, Any]] = []
        self.steps: list[dict[str, Any]] = []

    def size(self, name: str, hint: int) -> Any:
        """A symbolic size (sizes 0 and 1 too: the ShapeEnv does not specialise them), or the literal."""
        if not self.symbolic:
            return hint
        from torch._dynamo.source import ConstantSource

        sym = self.env.create_symbol(hint, ConstantSource(name))
        self.names[sym] = name
        return self.env.create_symintnode(sym, hint=hint)

    def ref(self, t: Any, new: bool = False) -> int:
        if new or id(t) not in self.index:
            if not new:
                raise RuntimeError(f"FA4 used a tensor the recorder did not see created: {tuple(t.shape)}")
            self.index[id(t)] = len(self.keep)
            self.keep.append(t)
            self.meta.append([self.encode(list(t.shape)), self.encode(list(t.stride())), self.encode(t.dtype)])
        return self.index[id(t)]

    def encode(self, x: Any) -> Any:
        import torch

        if isinstance(x, torch.Tensor):
            return {"t": self.ref(x)}
        if isinstance(x, torch.SymInt):
            return {"e": sympy_json.encode(x.node.expr, self.names)}
        if isinstance(x, torch.SymBool | torch.SymFloat):
            raise TypeError(f"FA4 passed a symbolic {type(x).__name__} ({x}) on; cannot record it")
        if isinstance(x, float):
            return {"in": "softmax_scale"} if x is self.scale else {"f": x}
        if x is None or isinstance(x, bool | int | str):
            return x
        if isinstance(x, torch.dtype):
            return {"dtype": str(x).removeprefix("torch.")}
        if isinstance(x, torch.device):
            return {"device": True}
        if isinstance(x, torch.memory_format | torch.layout):
            return {"torch": str(x).removeprefix("torch.")}
        if isinstance(x, tuple | list):
            return [self.encode(y) for y in x]
        if isinstance(x, dict):
            return {"kw": {k: self.encode(v) for k, v in x.items()}}
        raise TypeError(f"cannot record argument {x!r} of type {type(x).__name__}")

    def guards(self) -> list[Any]:
        found = [sympy_json.encode(g.expr, self.names) for g in self.env.guards]
        for sym, expr in self.env.replacements.items():
            if sym in self.names:
                found.append(["eq", ["sym", self.names[sym]], sympy_json.encode(expr, self.names)])
        for sym, name in self.names.items():  # what the ShapeEnv assumed without a guard (sizes are >= 0)
            low = self.env.var_to_range[sym].lower
            found.append(["ge", ["sym", name], int(low)])
        if HEADS in self.names.values():  # FA4 refuses a call without heads (it divides by their count)
            found.append(["ge", ["sym", HEADS], 1])
        unique: dict[str, Any] = {dumps(g): g for g in found if g is not True}
        return list(unique.values())


def _concrete(x: Any) -> Any:
    """A compile key with every symbolic value decided (bool()/int() guard the choice in the ShapeEnv)."""
    import torch

    if isinstance(x, torch.SymBool):
        return bool(x)
    if isinstance(x, torch.SymInt):
        return int(x)
    if isinstance(x, torch.SymFloat):
        return float(x)
    if isinstance(x, tuple) and not hasattr(x, "_fields"):
        return tuple(_concrete(y) for y in x)
    if isinstance(x, list):
        return [_concrete(y) for y in x]
    return x


class _LaunchRecorder(caches.Recorder):
    """Compile cache whose every kernel 'launch' appends a step with the symbolic argument list."""

    def __init__(self, family: str, session: _Session, seen: dict[tuple[str, str], Any]) -> None:
        super().__init__(family, seen)
        self.session = session

    def __contains__(self, key: Any) -> bool:
        return super().__contains__(_concrete(key))

    def __getitem__(self, key: Any) -> Any:
        s, family, key = self.session, self.family, _concrete(key)

        def launch(*args: Any) -> None:
            ident = (family, dumps(canonical(key)))
            if ident not in [(f, dumps(canonical(k))) for f, k in s.kernels]:
                s.kernels.append((family, key))
            number = [(f, dumps(canonical(k))) for f, k in s.kernels].index(ident)
            s.steps.append({"launch": number, "args": s.encode(list(args))})

        return launch


def _tracer(session: _Session) -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode

    class Tracer(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            import torch

            kwargs = kwargs or {}
            step = {"op": str(func), "args": session.encode(list(args)), "kwargs": session.encode(kwargs)}
            out = func(*args, **kwargs)
            outs = out if isinstance(out, tuple | list) else (out,)
            if any(isinstance(o, torch.Tensor) for o in outs):
                step["out"] = [session.ref(o, new=True) if isinstance(o, torch.Tensor) else None for o in outs]
                step["tuple"] = isinstance(out, tuple | list)
                session.steps.append(step)
            return out

    return Tracer()


class _Log2:
    """math.log2 of a symbolic count whose only use is math.ceil (FA4's combine kernel: log_max_splits =
    max(ceil(log2(num_splits)), 4)): the ceiling guards 2^(L-1) < n <= 2^L, a range, where float(n) would pin n
    to its value (a region per split count instead of one per power of two)."""

    def __init__(self, n: Any) -> None:
        self.n = n

    def __ceil__(self) -> int:
        hint = int(self.n.node.hint)
        low = max(hint - 1, 0).bit_length()  # ceil(log2(hint)) for hint >= 1
        if not (bool(self.n <= 2**low) and (low == 0 or bool(self.n > 2 ** (low - 1)))):
            raise RuntimeError(f"ceil(log2({self.n})) is not {low} at its own hint")
        return low

    def __float__(self) -> float:
        return math.log2(int(self.n))


class _Math:
    """The math module with log2 of a SymInt as _Log2 (for FA4's interface module while recording)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(math, name)

    @staticmethod
    def log2(x: Any) -> Any:
        import torch

        return _Log2(x) if isinstance(x, torch.SymInt) else math.log2(x)


@contextmanager
def _launching(interface: Any) -> Iterator[None]:
    """Let FA4 reach its kernel calls on fake tensors, and let cute.ceil_div and math.log2 take symbolic sizes."""
    import torch

    cute = interface.cute
    fake, ceil_div, module = interface.is_fake_mode, cute.ceil_div, interface.math

    def sym_ceil_div(a: Any, b: Any) -> Any:
        if isinstance(a, torch.SymInt) or isinstance(b, torch.SymInt):
            return (a + b - 1) // b
        return ceil_div(a, b)

    interface.is_fake_mode, cute.ceil_div, interface.math = (lambda: False), sym_ceil_div, _Math()
    try:
        yield
    finally:
        interface.is_fake_mode, cute.ceil_div, interface.math = fake, ceil_div, module


def record(sig: Signature, sizes: dict[str, int], sku: Sku, symbolic: bool = True,
           defaults: tuple[str, ...] = ()) -> dict[str, Any]:
    """The recipe of `sig` for the region of sizes containing `sizes` (names: recipe_format.size_names(layout); the KV
    head count defaults to the signature's, the query heads are always the signature's GQA ratio times it).
    With symbolic=False, FA4 runs at exactly `sizes`: what it does there, for comparing with a replay; the
    size arguments named in `defaults` (max_seqlen_q/k of seqused and paged calls) are then left to FA4.
    Raises Refused where FA4 refuses the call, with the guards under which it does."""
    import torch
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    if sig.layout not in SIZE_NAMES:
        raise ValueError(f"layout {sig.layout!r} has no lean recipe (known: {', '.join(SIZE_NAMES)})")
    sizes = {HEADS: sig.heads_kv, **sizes}
    session = _Session(ShapeEnv(duck_shape=False, specialize_zero_one=False), 1.0 / math.sqrt(sig.head_dim), symbolic)
    try:
        inputs, fwd, bwd, outputs = _trace(sig, sizes, session, defaults)
    except Exception as e:
        raise Refused(e, _guards_or_none(session)) from e
    return {
        "format": RECIPE_FORMAT, "signature": sig.to_dict(), "guards": session.guards(),
        "inputs": {name: session.ref(t) for name, t in inputs.items() if isinstance(t, torch.Tensor)},
        "tensors": len(session.keep), "meta": session.meta, "fwd": fwd, "bwd": bwd, "outputs": outputs,
        "softmax_scale": session.scale,
        "kernels": [{"family": f, "compile_key": canonical(k), "kernel_key": kernel_key(f, k, sku, toolchain())}
                    for f, k in session.kernels],
        "recorded_at": dict(sizes), "toolchain": toolchain(),
    }


class Refused(Exception):
    """FA4 refused a call (an assertion, a layout limit) while recording: `guards` (None if they could not be
    read) are the ShapeEnv's guards up to the refusal, where FA4 takes the same path to the same refusal."""

    def __init__(self, error: Exception, guards: list[Any] | None) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.guards = guards


def _guards_or_none(session: _Session) -> list[Any] | None:
    try:
        return session.guards()
    except Exception:  # a guard the encoder cannot write: the refusal holds only where it was met
        return None


def _trace(sig: Signature, sizes: dict[str, int], session: _Session, defaults: tuple[str, ...]
           ) -> tuple[dict[str, Any], list[Any], list[Any], dict[str, Any]]:
    """FA4's forward (and backward) of `sig` at symbolic `sizes` under the tracer: (inputs, fwd steps, bwd steps,
    outputs by name)."""
    import torch
    from flash_attn.cute import interface
    from torch._subclasses.fake_tensor import FakeTensorMode

    seen: dict[tuple[str, str], Any] = {}
    with FakeTensorMode(shape_env=session.env), _launching(interface), \
            caches.swapped(lambda family, _old: _LaunchRecorder(family, session, seen)):
        dims = {name: session.size(name, sizes[name]) for name in size_names(sig.layout)}
        inputs, fn, kwargs = _inputs(sig, dims, session, torch, defaults)
        ctx = _Ctx()
        with torch.no_grad():
            with _tracer(session):
                out, lse = fn.forward(ctx, inputs["q"], inputs["k"], inputs["v"], **kwargs)
            fwd, session.steps = session.steps, []
            outputs = {"out": session.ref(out), "lse": None if lse is None else session.ref(lse)}
            bwd: list[Any] = []
            if sig.pass_ in ("bwd", "bwd_det"):
                dout = torch.empty_like(out)
                inputs["dout"] = dout
                session.ref(dout, new=True)
                with _tracer(session):
                    grads = fn.backward(ctx, dout, None)
                bwd = session.steps
                for name, g in zip(("dq", "dk", "dv"), grads[:3], strict=True):
                    outputs[name] = session.ref(g)
                if sig.sink:
                    outputs["dsink"] = session.ref(grads[_grad_index(fn, "learnable_sink")])
    return inputs, fwd, bwd, outputs


def _grad_index(fn: Any, name: str) -> int:
    """Where backward() returns the gradient of forward's argument `name` (its position after ctx)."""
    import inspect

    return list(inspect.signature(fn.forward).parameters).index(name) - 1


def _inputs(sig: Signature, dims: dict[str, Any], session: _Session, torch: Any,
            defaults: tuple[str, ...] = ()) -> tuple[dict[str, Any], Any, Any]:
    """FA4's arguments for `sig` at `dims`; the names in `defaults` (max_seqlen_q/k) are passed as None."""
    from flash_attn.cute.interface import FlashAttnFunc, FlashAttnVarlenFunc

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[sig.dtype]
    grad = sig.pass_ in ("bwd", "bwd_det")

    def tensor(*shape: Any, dt: Any = dtype) -> Any:
        t = torch.empty(*shape, dtype=dt, device="cuda")
        t = t.requires_grad_(grad) if dt is dtype else t
        session.ref(t, new=True)
        return t

    if sig.heads_kv <= 0 or sig.heads_q % sig.heads_kv:
        raise ValueError(f"{sig}: FA4 needs the query heads to be a multiple of the KV heads")
    hkv, d, dv = dims[HEADS], sig.head_dim, sig.head_dim_v
    hq = sig.heads_q // sig.heads_kv * hkv
    kwargs: dict[str, Any] = {
        "softmax_scale": session.scale, "causal": sig.mask == "causal",
        "window_size": tuple(sig.window) if sig.mask == "local" else (None, None), "softcap": sig.softcap,
        "num_splits": sig.num_splits, "deterministic": sig.pass_ == "bwd_det", "return_lse": sig.pass_ == "fwd_lse",
    }
    inputs: dict[str, Any] = {}
    b = dims["batch"]
    if sig.layout == "varlen":
        inputs.update(q=tensor(dims["total_q"], hq, d), k=tensor(dims["total_k"], hkv, d),
                      v=tensor(dims["total_k"], hkv, dv), cu_seqlens_q=tensor(b + 1, dt=torch.int32),
                      cu_seqlens_k=tensor(b + 1, dt=torch.int32))
    elif sig.layout == "paged":
        pool = (dims["num_pages"], sig.page_size, hkv)
        inputs.update(q=tensor(b, dims["seqlen_q"], hq, d), k=tensor(*pool, d), v=tensor(*pool, dv),
                      page_table=tensor(b, dims["pages_per_seq"], dt=torch.int32), seqused_k=tensor(b, dt=torch.int32))
    else:  # dense, seqused
        sq, sk = dims["seqlen_q"], dims["seqlen_k"]
        inputs.update(q=tensor(b, sq, hq, d), k=tensor(b, sk, hkv, d), v=tensor(b, sk, hkv, dv))
        if sig.layout == "seqused":
            inputs["seqused_k"] = tensor(b, dt=torch.int32)
    kwargs.update({name: t for name, t in inputs.items() if name not in ("q", "k", "v")})
    kwargs.update({name: dims[name] for name in ("max_seqlen_q", "max_seqlen_k") if name in dims})
    for name in defaults:  # FA4 without these arguments: the same choices as with their default values
        kwargs[name] = None
    fn = FlashAttnFunc if sig.layout == "dense" else FlashAttnVarlenFunc
    if sig.sink:
        kwargs["learnable_sink"] = inputs["learnable_sink"] = tensor(hq)
    return inputs, fn, kwargs
