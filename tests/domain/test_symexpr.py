"""symexpr: the JSON size expressions recipes carry, evaluated without sympy."""

from __future__ import annotations

import pytest

from fa4_aot.domain import symexpr

SIZES = {"batch": 3, "seqlen_q": 1000, "seqlen_k": 129}


@pytest.mark.parametrize("expr,value", [
    (7, 7), (True, True), (["sym", "batch"], 3),
    (["mul", 8192, ["floordiv", ["add", 63, ["sym", "seqlen_q"]], 64]], 8192 * 16),
    (["mod", ["sym", "seqlen_k"], 128], 1), (["max", ["sym", "batch"], 4, 2], 4), (["min", 5, ["sym", "batch"]], 3),
    (["gt", ["mul", 4, ["sym", "seqlen_q"]], 128], True), (["ne", ["floordiv", ["add", 127, ["sym", "seqlen_k"]],
                                                                 128], 1], True),
    (["and", ["ge", ["sym", "batch"], 0], ["le", ["sym", "batch"], 256]], True), (["not", ["eq", 1, 1]], False),
    (["mul", ["frac", 1, 2], ["sym", "seqlen_q"]], 500), (["pow", 2, 10], 1024), (["or", False, ["lt", 1, 2]], True),
])
def test_evaluate(expr: object, value: object) -> None:
    assert symexpr.evaluate(expr, SIZES) == value


def test_holds_needs_every_guard() -> None:
    guards = [["le", ["sym", "batch"], 256], ["gt", ["sym", "seqlen_q"], 128]]
    assert symexpr.holds(guards, SIZES)
    assert not symexpr.holds(guards, {**SIZES, "batch": 257})
    assert symexpr.holds([], SIZES)


def test_unknown_op_and_unknown_size_are_errors() -> None:
    with pytest.raises(ValueError, match="rebuild"):
        symexpr.evaluate(["ceiling", 1], SIZES)
    with pytest.raises(KeyError):
        symexpr.evaluate(["sym", "total_q"], SIZES)


def test_symbols() -> None:
    assert symexpr.symbols(["add", ["sym", "batch"], ["mul", 2, ["sym", "seqlen_k"]]]) == {"batch", "seqlen_k"}
