"""Integer expressions over a call's sizes, as JSON, and their evaluation (pure; no sympy, no torch).

The planner records FA4's per-call host arithmetic symbolically (fa4/record.py): a buffer shape such as
`batch * heads * ((seqlen_q + 127) // 128 * 128)` or a branch FA4 took (`4 * seqlen_q > 128`) becomes a
nested list: ["add", a, b], ["floordiv", a, b], ["gt", a, b], ["sym", "seqlen_q"], or a plain int/bool.
`evaluate` computes one for concrete sizes; the lean runtime never re-derives FA4's arithmetic itself.

Recipe files come from a server, so arithmetic is bounded: `check` admits only the ops below
with their arities, literals within MAX_MAGNITUDE, a pow exponent that is a literal of at most MAX_EXPONENT,
nesting within MAX_DEPTH and at most MAX_OPERANDS operands in all (a product of 60,000 copies of
2**62 passed every other bound and took 20 s a lookup through store/recipes.py's compiled guards); `evaluate`
(and `bounded`, which those compiled guards apply) refuses (ValueError) any intermediate value past MAX_MAGNITUDE,
so no expression can make a client compute for long or fill its memory (FA4's sizes stay far below 2**62).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from fractions import Fraction
from functools import reduce
from typing import Any

MAX_MAGNITUDE = 1 << 62  # any literal or intermediate value; FA4's sizes and shapes stay far below it
MAX_EXPONENT = 64  # |exponent| of "pow", a literal
MAX_DEPTH = 64  # nesting of one expression
MAX_OPERANDS = 1024  # operands of one expression, at every level together; FA4's have at most a few dozen


def _floordiv(a: Any, b: Any) -> Any:
    if b == 0:
        raise ValueError("division by zero in a recipe's size expression")
    return a // b


def _mod(a: Any, b: Any) -> Any:
    if b == 0:
        raise ValueError("modulo by zero in a recipe's size expression")
    return a % b


def _pow(a: Any, b: Any) -> Any:
    if isinstance(b, bool) or not isinstance(b, int) or abs(b) > MAX_EXPONENT:
        raise ValueError(f"exponent {b!r} in a recipe's size expression: an integer of at most {MAX_EXPONENT}")
    if a != 0 and abs(a) != 1 and abs(b) * max(abs(Fraction(a)).numerator.bit_length(),
                                               abs(Fraction(a)).denominator.bit_length()) > 63:
        raise ValueError(f"{a}**{b} in a recipe's size expression is past {MAX_MAGNITUDE}")
    return Fraction(a) ** b if b < 0 else a ** b


def bounded(value: Any) -> Any:
    """`value`, unless it is a number past MAX_MAGNITUDE (then ValueError): the bound on every intermediate value,
    for evaluate and for any other evaluator of checked expressions (store/recipes.py's compiled guards)."""
    if isinstance(value, Fraction):
        if abs(value.numerator) > MAX_MAGNITUDE or value.denominator > MAX_MAGNITUDE:
            raise ValueError(f"a recipe's size expression reached {value}, past {MAX_MAGNITUDE}")
    elif isinstance(value, int) and abs(value) > MAX_MAGNITUDE:
        raise ValueError(f"a recipe's size expression reached {value}, past {MAX_MAGNITUDE}")
    return value


def _reduce(op: Callable[[Any, Any], Any]) -> Callable[..., Any]:
    """A variadic op applied pairwise, each partial result bounded."""
    return lambda *xs: reduce(lambda a, b: bounded(op(a, b)), xs)


def _all(*xs: Any) -> bool:
    return all(xs)


def _any(*xs: Any) -> bool:
    return any(xs)


_VARIADIC: dict[str, Callable[..., Any]] = {
    "add": _reduce(operator.add),
    "mul": _reduce(operator.mul),
    "max": max,
    "min": min,
    "and": _all,
    "or": _any,
}
_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "floordiv": _floordiv, "mod": _mod, "pow": _pow, "eq": operator.eq, "ne": operator.ne,
    "lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge,
}
OPS = frozenset(_VARIADIC) | frozenset(_BINARY) | {"not", "sym", "frac"}


def evaluate(expr: Any, sizes: Mapping[str, int]) -> Any:
    """The value of `expr` for `sizes`. Raises KeyError for an unknown size, ValueError for an unknown op or a
    value past MAX_MAGNITUDE (expressions from a recipe file were first passed through `check`)."""
    if isinstance(expr, bool | int):
        return bounded(expr)
    op = expr[0]
    if op == "sym":
        return bounded(sizes[expr[1]])
    if op == "frac":
        if expr[2] == 0:
            raise ValueError("a recipe's size expression holds a fraction over zero")
        return bounded(Fraction(expr[1], expr[2]))
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
        return bounded(int(value))
    return bounded(value)


_ARITY = {"sym": 1, "frac": 2, "not": 1, **{op: 2 for op in _BINARY}}


def check(expr: Any, names: frozenset[str] | set[str], depth: int = 0) -> None:
    """ValueError unless `expr` is an expression `evaluate` may run: known ops with their arities, sizes from
    `names`, int/bool literals within MAX_MAGNITUDE, a literal pow exponent within MAX_EXPONENT, nesting within
    MAX_DEPTH, at most MAX_OPERANDS operands in all."""
    operands = _check(expr, names, depth)
    if operands > MAX_OPERANDS:
        raise ValueError(f"expression of {operands} operands is past {MAX_OPERANDS} operands")


def _check(expr: Any, names: frozenset[str] | set[str], depth: int) -> int:
    """check's walk; returns how many operands `expr` holds at every level (a literal or size counts one)."""
    if type(expr) is int and -MAX_MAGNITUDE <= expr <= MAX_MAGNITUDE:  # the common literal first, by exact type
        return 1
    if isinstance(expr, bool):
        return 1
    if isinstance(expr, int):
        if abs(expr) > MAX_MAGNITUDE:
            raise ValueError(f"literal {expr} is past {MAX_MAGNITUDE}")
        return 1
    if depth >= MAX_DEPTH:
        raise ValueError(f"expression nested deeper than {MAX_DEPTH}")
    if not isinstance(expr, list) or not expr or not isinstance(expr[0], str) or expr[0] not in OPS:
        raise ValueError(f"{str(expr)[:80]} is not a size expression (ops: {', '.join(sorted(OPS))})")
    op, args = expr[0], expr[1:]
    if len(args) != _ARITY.get(op, len(args)) or not args:
        raise ValueError(f"{op!r} takes {_ARITY.get(op, 'one or more')} operand(s), not {len(args)}")
    if len(args) > MAX_OPERANDS:  # before walking them: a wide expression is refused without reading it all
        raise ValueError(f"{op!r} of {len(args)} operands is past {MAX_OPERANDS} operands")
    if op == "sym":
        if args[0] not in names:
            raise ValueError(f"size {str(args[0])[:40]!r} is not one of {sorted(names)}")
        return 1
    if op == "frac" or op == "pow":
        literal = args if op == "frac" else args[1:]
        if not all(isinstance(a, int) and not isinstance(a, bool) for a in literal):
            raise ValueError(f"{op!r} needs integer literal {'operands' if op == 'frac' else 'exponent'}")
        if op == "pow" and abs(args[1]) > MAX_EXPONENT:
            raise ValueError(f"exponent {args[1]} is past {MAX_EXPONENT}")
    operands = 0
    for a in args:
        operands += _check(a, names, depth + 1)
        if operands > MAX_OPERANDS:
            raise ValueError(f"expression of more than {MAX_OPERANDS} operands is past {MAX_OPERANDS} operands")
    return operands


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
