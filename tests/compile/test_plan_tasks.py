"""plan_tasks: how planning's items are cut into tasks (issue 29, part 3)."""

from __future__ import annotations

import pytest

from fa4_aot.compile import plan_tasks


@pytest.mark.parametrize(("items", "tasks", "expected"), [
    ([0, 1, 2, 3, 4], 2, [[0, 2, 4], [1, 3]]),
    ([0, 1], 5, [[0], [1]]),
    ([7], 0, [[7]]),
])
def test_strided(items: list[int], tasks: int, expected: list[list[int]]) -> None:
    assert plan_tasks.strided(items, tasks) == expected


@pytest.mark.parametrize(("keys", "expected"), [
    # items sharing a key, directly or through another item, are one task; the largest first
    ({0: ["a"], 1: ["b"], 2: ["a"], 3: ["b", "c"], 4: ["c"], 5: ["d"]}, [[1, 3, 4], [0, 2], [5]]),
    # a training item's two keys (its own, its forward's) join the forward's other items
    ({0: ["bwd", "fwd"], 1: ["fwd"], 2: ["other"]}, [[0, 1], [2]]),
    # an item without keys (an exact call without a Call) is a task of its own
    ({0: [], 1: [], 2: ["a"]}, [[0], [1], [2]]),
])
def test_by_shared_keys(keys: dict[int, list[str]], expected: list[list[int]]) -> None:
    assert plan_tasks.by_shared_keys(list(keys), keys.__getitem__) == expected
