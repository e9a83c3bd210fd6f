"""recipe_space.covered (each guard evaluated only where the ones before it hold) and recipe_space.Judge (each
distinct guard and operation evaluated once per draw) answer what evaluating every guard at every point answers."""

from __future__ import annotations

import numpy as np
import pytest

from fa4_aot.domain import recipe_space, symexpr
from tests.domain.test_recipe_space import GUARDS, SIG, SKU


def _everywhere(guards: list, points: dict) -> np.ndarray:
    """The reference: every guard at every point, in symexpr (a division by zero: the region does not hold)."""
    count = len(next(iter(points.values())))
    found = np.zeros(count, dtype=bool)
    for i in range(count):
        try:
            found[i] = symexpr.holds(guards, recipe_space.point(points, i))
        except ValueError:
            found[i] = False
    return found


def _guard_lists(seed: int, count: int) -> list[list]:
    rng = np.random.default_rng(seed)
    b = ["sym", "batch"]
    drawn = [[GUARDS[i] for i in rng.choice(len(GUARDS), size=rng.integers(1, 6), replace=False)]
             for _ in range(count)]
    # floats, a list no point passes after its first guard, and no guard at all (holds everywhere)
    return [*drawn, [["eq", ["pow", b, 2], ["mul", b, b]], ["gt", ["frac", 1, 2], 0]], [["eq", b, 0], GUARDS[0]], []]


@pytest.mark.parametrize("parts_bytes", [recipe_space.PARTS_BYTES, 0, 20_000])  # all, none, some remembered
def test_judge_and_covered_answer_what_every_guard_everywhere_answers(parts_bytes: int,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recipe_space, "PARTS_BYTES", parts_bytes)
    points = recipe_space.draw(recipe_space.space(SIG, SKU), np.random.default_rng(7), 1500, {"batch": [3]})
    lists = _guard_lists(8, 25)
    judge = recipe_space.Judge(points)  # one judge for every list: what it remembers from one serves the next
    union = np.zeros(1500, dtype=bool)
    for guards in lists:
        expected = _everywhere(guards, points)
        assert (recipe_space.covered(guards, points) == expected).all(), guards
        assert (judge.covered(guards) == expected).all(), guards
        union |= expected
    assert (recipe_space.Judge(points).any_covers(lists) == union).all()
    assert sum(0 < _everywhere(g, points).sum() < 1500 for g in lists) > 10  # lists that tell points apart


def test_judge_results_are_fresh_arrays() -> None:
    """A caller may clear bits of what covered returned (compile.lean's open points): the judge's memory stays."""
    points = recipe_space.draw(recipe_space.space(SIG, SKU), np.random.default_rng(9), 500)
    judge = recipe_space.Judge(points)
    first = judge.covered([GUARDS[0]])
    first[:] = False
    assert (judge.covered([GUARDS[0]]) == _everywhere([GUARDS[0]], points)).all()
