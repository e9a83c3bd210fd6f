"""sympy expressions (torch's symbolic sizes and guards) written as symexpr JSON. Build side only."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_RELATIONS = {"Equality": "eq", "Unequality": "ne", "StrictLessThan": "lt", "LessThan": "le",
              "StrictGreaterThan": "gt", "GreaterThan": "ge"}
_VARIADIC = {"Add": "add", "Mul": "mul", "Max": "max", "Min": "min", "And": "and", "Or": "or"}
_BINARY = {"FloorDiv": "floordiv", "PythonMod": "mod", "Mod": "mod", "Pow": "pow"}


def encode(expr: Any, names: Mapping[Any, str]) -> Any:
    """symexpr JSON for a sympy expression whose free symbols are keys of `names` (symbol -> size name).
    Raises TypeError for a construct symexpr cannot express, so that nothing is recorded approximately."""
    import sympy

    if expr is sympy.true or expr is True:
        return True
    if expr is sympy.false or expr is False:
        return False
    if isinstance(expr, sympy.Integer):
        return int(expr)
    if isinstance(expr, sympy.Rational):
        return ["frac", int(expr.p), int(expr.q)]
    if isinstance(expr, sympy.Symbol):
        if expr not in names:
            raise TypeError(f"symbol {expr} is not one of the call's sizes {sorted(names.values())}")
        return ["sym", names[expr]]
    kind = type(expr).__name__
    args = [encode(a, names) for a in expr.args]
    if kind in _RELATIONS:
        return [_RELATIONS[kind], *args]
    if kind in _VARIADIC:
        return [_VARIADIC[kind], *args]
    if kind in _BINARY and len(args) == 2:
        return [_BINARY[kind], *args]
    if kind == "Not":
        return ["not", *args]
    if kind == "CeilToInt" or kind == "FloorToInt" or kind == "TruncToInt":
        raise TypeError(f"cannot record {kind}({expr.args[0]}): FA4 rounded a float derived from a size")
    raise TypeError(f"cannot record sympy {kind} {expr}")
