"""Exact call records (fa4_aot/domain/exact.py) on the FA4 side: describing the arguments FA4's autograd functions were
given, and replaying a record through the same function on fake tensors so that FA4's own dispatch asks for
exactly the kernels the recorded call asked for (kernels.py plans or compiles them).
"""

from __future__ import annotations

from typing import Any

from ..domain.exact import ALIGN_BYTES, DTYPES, FORMAT, check

_SKIP = ("ctx",)


class Undescribable(Exception):
    """An argument a record cannot hold (a callable such as score_mod, an object FA4 defines)."""


def describe(entry: str, arguments: dict[str, Any]) -> dict[str, Any] | None:
    """The record of a forward call of `entry` with bound `arguments`, or None when an argument cannot be
    recorded or the record would be over its size limit. Never raises."""
    try:
        forward: dict[str, Any] = {}
        for name, value in arguments.items():
            if name not in _SKIP:
                forward[name] = _value(value, forward, arguments)
        return check({"format": FORMAT, "entry": entry, "forward": forward, "backward": None})
    except Exception:  # Undescribable, over the limits, or a tensor without strides: describing never breaks a call
        return None


def with_backward(forward: dict[str, Any] | None, dout: Any, dlse: Any) -> dict[str, Any] | None:
    """The record of `forward`'s backward with gradients `dout`, `dlse` (each a tensor or None), or None."""
    if forward is None:
        return None
    try:
        return check({**forward, "backward": {"dout": _value(dout, {}, {}), "dlse": _value(dlse, {}, {})}})
    except Exception:  # as in describe()
        return None


def _value(value: Any, done: dict[str, Any], arguments: dict[str, Any]) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        same = next((n for n in done if arguments.get(n) is value), None)
        return {"same_as": same} if same else tensor_spec(value)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, tuple | list) and type(value) in (tuple, list):  # not a NamedTuple FA4 defines
        return [_value(v, {}, {}) for v in value]
    raise Undescribable(type(value).__name__)


def tensor_spec(t: Any) -> dict[str, Any]:
    dtype = str(t.dtype).removeprefix("torch.")
    if dtype not in DTYPES:
        raise Undescribable(dtype)
    # FA4 checks pointer alignment (data_ptr, or storage_offset on fake tensors); allocations are 256-aligned
    offset = t.storage_offset() % max(1, ALIGN_BYTES // t.element_size())
    return {"tensor": dtype, "shape": list(t.shape), "stride": list(t.stride()), "offset": offset,
            "grad": bool(t.requires_grad)}


def replay(doc: dict[str, Any]) -> None:
    """Run recorded call `doc` through its FA4 entry on 'cuda' tensors, forward and, when recorded, backward, as
    autograd would. Callers wrap it in FakeTensorMode with planning or compiling caches (kernels.py). Raises
    ValueError for a record check() refuses, and whatever FA4 raises for a call it rejects."""
    import torch
    from flash_attn.cute import interface

    from .dispatch import _Ctx

    check(doc)
    fn = getattr(interface, doc["entry"])
    forward = doc["forward"]
    kwargs = {name: _build(value, torch) for name, value in forward.items() if not _alias(value)}
    kwargs.update({name: kwargs[value["same_as"]] for name, value in forward.items() if _alias(value)})
    ctx = _Ctx()
    with torch.no_grad():
        out, lse = fn.forward(ctx, **kwargs)
        if doc["backward"] is not None:
            fn.backward(ctx, _build(doc["backward"]["dout"], torch), _build(doc["backward"]["dlse"], torch))
    del out, lse


def _alias(value: Any) -> bool:
    return isinstance(value, dict) and "same_as" in value


def _build(value: Any, torch: Any) -> Any:
    if isinstance(value, list):
        return tuple(_build(v, torch) for v in value)
    if not isinstance(value, dict):
        return value
    dtype = getattr(torch, value["tensor"])
    shape, stride, offset = value["shape"], value["stride"], value["offset"]
    span = offset + 1 + sum((n - 1) * s for n, s in zip(shape, stride, strict=True)) if all(shape) else offset
    t = torch.empty(span, dtype=dtype, device="cuda").as_strided(shape, stride, offset)
    # as_strided then detach: a leaf with that layout (a fake CUDA view cannot be made to require grad otherwise)
    return t.detach().requires_grad_(True) if value["grad"] else t
