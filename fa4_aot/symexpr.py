"""Integer expressions over a call's sizes, as JSON, and their evaluation (pure; no sympy, no torch).

The planner records FA4's per-call host arithmetic symbolically (fa4/record.py): a buffer shape such as
`batch * heads * ((seqlen_q + 127) // 128 * 128)` or a branch FA4 took (`4 * seqlen_q > 128`) becomes a
nested list: ["add", a, b], ["floordiv", a, b], ["gt", a, b], ["sym", "seqlen_q"], or a plain int/bool.
`evaluate` computes one for concrete sizes; the lean runtime never re-derives FA4's arithmetic itself.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from fractions import Fraction
from functools import reduce
from typing import Any


def _floordiv(a: Any, b: Any) -> Any:
    return a // b


def _mod(a: Any, b: Any) -> Any:
    return a % b


def _all(*xs: Any) -> bool:
    return all(xs)


def _any(*xs: Any) -> bool:
    return any(xs)


_VARIADIC: dict[str, Callable[..., Any]] = {
    "add": lambda *xs: reduce(operator.add, xs),
    "mul": lambda *xs: reduce(operator.mul, xs),
    "max": max,
    "min": min,
    "and": _all,
    "or": _any,
}
_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "floordiv": _floordiv, "mod": _mod, "pow": operator.pow, "eq": operator.eq, "ne": operator.ne,
    "lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge,
}
OPS = frozenset(_VARIADIC) | frozenset(_BINARY) | {"not", "sym", "frac"}


def evaluate(expr: Any, sizes: Mapping[str, int]) -> Any:
    """The value of `expr` for `sizes`. Raises KeyError for an unknown size, ValueError for an unknown op."""
    if isinstance(expr, bool | int):
        return expr
    op = expr[0]
    if op == "sym":
        return sizes[expr[1]]
    if op == "frac":
        return Fraction(expr[1], expr[2])
    args = [evaluate(a, sizes) for a in expr[1:]]
    if op in _VARIADIC:
        value = _VARIADIC[op](*args)
    elif op in _BINARY:
        value = _BINARY[op](*args)
    elif op == "not":
        value = not args[0]
    else:
        raise ValueError(f"unknown expression op {op!r} in a recorded recipe; rebuild it with this fa4-aot")
    if isinstance(value, Fraction) and value.denominator == 1:
        return int(value)
    return value


def holds(guards: list[Any], sizes: Mapping[str, int]) -> bool:
    """Whether every guard is true for `sizes`."""
    return all(bool(evaluate(g, sizes)) for g in guards)


def symbols(expr: Any) -> set[str]:
    """The size names `expr` reads."""
    if isinstance(expr, bool | int):
        return set()
    if expr[0] == "sym":
        return {expr[1]}
    if expr[0] == "frac":
        return set()
    return set().union(*(symbols(a) for a in expr[1:]))
