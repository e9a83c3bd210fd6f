"""The tracer of FA4's host path (fa4/record.py uses it): every tensor FA4 makes gets a slot, every argument is
encoded as recipe data (domain/region.py's argument form: {"t": slot}, {"e": size expression}, ...), every torch op
FA4 issues becomes an Op step (a dispatch mode) and every compiled-kernel call a Launch step (a compile-cache
recorder), and the ShapeEnv's guards on the symbolic sizes are read back as symexpr conditions.
"""

from __future__ import annotations

from typing import Any

from ..domain.kernel_keys import canonical, dumps
from ..domain.recipe_format import HEADS
from . import caches, sympy_json


class Session:
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


def concrete(x: Any) -> Any:
    """A compile key with every symbolic value decided (bool()/int() guard the choice in the ShapeEnv)."""
    import torch

    if isinstance(x, torch.SymBool):
        return bool(x)
    if isinstance(x, torch.SymInt):
        return int(x)
    if isinstance(x, torch.SymFloat):
        return float(x)
    if isinstance(x, tuple) and not hasattr(x, "_fields"):
        return tuple(concrete(y) for y in x)
    if isinstance(x, list):
        return [concrete(y) for y in x]
    return x


class LaunchRecorder(caches.Recorder):
    """Compile cache whose every kernel 'launch' appends a step with the symbolic argument list."""

    def __init__(self, family: str, session: Session, seen: dict[tuple[str, str], Any]) -> None:
        super().__init__(family, seen)
        self.session = session

    def __contains__(self, key: Any) -> bool:
        return super().__contains__(concrete(key))

    def __getitem__(self, key: Any) -> Any:
        s, family, key = self.session, self.family, concrete(key)

        def launch(*args: Any) -> None:
            ident = (family, dumps(canonical(key)))
            if ident not in [(f, dumps(canonical(k))) for f, k in s.kernels]:
                s.kernels.append((family, key))
            number = [(f, dumps(canonical(k))) for f, k in s.kernels].index(ident)
            s.steps.append({"launch": number, "args": s.encode(list(args))})

        return launch


def tracer(session: Session) -> Any:
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
